import BanyanBasics
public import BanyanTree
import Crypto

/// The tokens the built-in account service issues and checks (docs/accounts.md, "Tokens"):
/// ID tokens (HS256 JWTs in the Firebase ID token's shape, signed with the project's cluster
/// key and named by its `kid`), refresh tokens (signed with the account's own refresh key, so
/// a password change or revocation ends them), and password-reset codes (signed with the
/// cluster key, naming the password they may replace). Pure: `now` is an input.
public enum AccountTokens {
    /// A signing key as the verifier needs it.
    public struct Key: Sendable, Equatable {
        public var id: String
        public var secret: [UInt8]
        /// The project whose tokens it signs (their `aud`, and the issuer's suffix).
        public var project: String
        public init(id: String, secret: [UInt8], project: String) {
            self.id = id
            self.secret = secret
            self.project = project
        }
    }

    /// Key ids the account service mints start with this, so a token naming one is checked
    /// against the cluster's keys only (and gets `unknownKey` once its key is gone).
    public static let keyIDPrefix = "banyan-"
    /// ID tokens live an hour, as Firebase's do.
    public static let idTokenLifetimeSeconds: Int64 = 3600
    /// Reset codes live an hour.
    public static let resetCodeLifetime: Int64 = 3600 * 1000

    public static func issuer(_ project: String) -> String { "https://securetoken.google.com/" + project }

    /// What an ID token says about its user.
    public struct Subject: Sendable, Equatable {
        public var uid: String
        public var email: String?
        public var emailVerified: Bool
        public var displayName: String?
        /// `password`, `anonymous` or `custom`.
        public var provider: String
        /// The developer claims (a JSON object), merged at the top level as Firebase does;
        /// reserved claim names are skipped.
        public var claims: JSONValue?
        /// Seconds since the epoch of the sign-in the token descends from.
        public var authTime: Int64
        /// The account's photo (`picture`).
        public var photoURL: String?
        /// The identity provider the account belongs to (`firebase.identities`): its id and the
        /// user's id there.
        public var federated: FederatedID?
        public init(
            uid: String, email: String?, emailVerified: Bool, displayName: String?, provider: String, claims: JSONValue?, authTime: Int64,
            photoURL: String? = nil, federated: FederatedID? = nil
        ) {
            self.uid = uid
            self.email = email
            self.emailVerified = emailVerified
            self.displayName = displayName
            self.provider = provider
            self.claims = claims
            self.authTime = authTime
            self.photoURL = photoURL
            self.federated = federated
        }
    }

    /// A user's identity at an identity provider: the provider's id (`google.com`) and the
    /// user's id there (`sub`).
    public struct FederatedID: Sendable, Equatable {
        public var provider: String
        public var id: String
        public init(provider: String, id: String) {
            self.provider = provider
            self.id = id
        }
    }

    /// Claim names a developer claim may not replace (Firebase's reserved list).
    static let reserved: Set<String> = [
        "acr", "amr", "at_hash", "aud", "auth_time", "azp", "cnf", "c_hash", "exp", "firebase", "iat", "iss", "jti", "nbf", "nonce", "sub",
        "user_id", "email", "email_verified", "name", "picture",
    ]

    /// Whether a developer claim may not use `name` (Firebase's reserved claims).
    public static func isReservedClaim(_ name: String) -> Bool { reserved.contains(name) }

    /// A signed ID token for `subject`, issued at `now` (seconds).
    public static func idToken(_ subject: Subject, key: Key, now: Int64) -> String {
        var claims: [(String, JSONValue)] = [
            ("iss", .string(issuer(key.project))), ("aud", .string(key.project)), ("auth_time", .int(subject.authTime)),
            ("user_id", .string(subject.uid)), ("sub", .string(subject.uid)), ("iat", .int(now)), ("exp", .int(now + idTokenLifetimeSeconds)),
        ]
        if let email = subject.email {
            claims.append(("email", .string(email)))
            claims.append(("email_verified", .bool(subject.emailVerified)))
        }
        if let name = subject.displayName { claims.append(("name", .string(name))) }
        if let photo = subject.photoURL { claims.append(("picture", .string(photo))) }
        var identities: [(String, JSONValue)] = []
        if let federated = subject.federated { identities.append((federated.provider, .array([.string(federated.id)]))) }
        if let email = subject.email, subject.provider == "password" || subject.federated != nil {
            identities.append(("email", .array([.string(email)])))
        }
        claims.append(("firebase", .object([("identities", .object(identities)), ("sign_in_provider", .string(subject.provider))])))
        if case .object(let extra)? = subject.claims {
            for (name, value) in extra where !reserved.contains(name) { claims.append((name, value)) }
        }
        let header = JSONValue.object([("alg", .string("HS256")), ("kid", .string(key.id)), ("typ", .string("JWT"))])
        let input = Base64.encodeURL(Array(header.jsonString.utf8)) + "." + Base64.encodeURL(Array(JSONValue.object(claims).jsonString.utf8))
        return input + "." + Base64.encodeURL(mac(Array(input.utf8), key.secret))
    }

    /// Whether `token` names a key of the account service (its header's `kid`), without
    /// checking anything else.
    public static func isAccountToken(_ token: String) -> Bool {
        guard token.utf8.count <= TokenLimits().maxTokenBytes, let dot = token.utf8.firstIndex(of: UInt8(ascii: ".")),
            let header = Base64.decode(token.utf8[..<dot]), header.count <= 1024,
            case .string(let kid)? = (try? JSONValue(parsing: header, maxDepth: 4))?["kid"]
        else { return false }
        return kid.hasPrefix(keyIDPrefix)
    }

    /// Verifies an account-service ID token against `keys` (those accepted now) at `now`
    /// (milliseconds): HS256 only, a known `kid`, the MAC, then the ID token's claim checks with
    /// the key's project as issuer and audience.
    ///
    /// `projects` are the projects whose tokens are honoured (the node's configuration): a
    /// key of any other project is not trusted, and the token's `aud` and `iss` must name the
    /// key's project, one of them.
    public static func verifyIDToken(
        _ token: String, key lookup: (String) -> Key?, projects: Set<String>, skew: Int64, now: Int64
    ) -> Result<VerifiedToken, TokenError> {
        do throws(TokenError) {
            let jwt = try JWT.decode(token)
            guard jwt.algorithm == "HS256" else { throw .algorithmNotAllowed(jwt.algorithm) }
            guard let kid = jwt.keyID, let key = lookup(kid), projects.contains(key.project) else { throw .unknownKey(jwt.keyID) }
            guard jwt.signature.count == SHA256.byteCount,
                HMAC<SHA256>.isValidAuthenticationCode(jwt.signature, authenticating: jwt.signingInput, using: SymmetricKey(data: key.secret))
            else { throw .badSignature }
            return .success(try Claims.checkIDToken(jwt.claims, issuer: issuer(key.project), audience: key.project, skew: skew, now: now))
        } catch {
            return .failure(error)
        }
    }

    // MARK: - Sealed tokens (refresh tokens, reset codes)

    /// `payload` as `<base64url JSON>.<base64url HMAC-SHA256>` under `secret`.
    public static func seal(_ payload: JSONValue, secret: [UInt8]) -> String {
        let body = Base64.encodeURL(Array(payload.jsonString.utf8))
        return body + "." + Base64.encodeURL(mac(Array(body.utf8), secret))
    }

    /// The longest sealed token accepted.
    public static let maxSealedBytes = 4096

    /// The payload of a sealed token, unchecked (to find which secret checks it); nil when it
    /// is not one (at most `maxSealedBytes`).
    public static func unsealedPayload(_ token: String) -> JSONValue? {
        let parts = token.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard token.utf8.count <= maxSealedBytes, parts.count == 2, let body = Base64.decode(parts[0]),
            let value = try? JSONValue(parsing: body, maxDepth: 20), case .object = value
        else { return nil }
        return value
    }

    /// Whether `token` is sealed with `secret`.
    public static func isSealed(_ token: String, with secret: [UInt8]) -> Bool {
        let parts = token.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard token.utf8.count <= maxSealedBytes, parts.count == 2, let tag = Base64.decode(parts[1]), tag.count == SHA256.byteCount else { return false }
        return HMAC<SHA256>.isValidAuthenticationCode(tag, authenticating: Array(parts[0]), using: SymmetricKey(data: secret))
    }

    /// A refresh token for `uid` of `project`, under the account's refresh key: it also
    /// carries how the session signed in and the claims its custom token added, so refreshed ID
    /// tokens say what the first one said.
    public static func refreshToken(
        project: String, uid: String, refreshKey: [UInt8], now: Int64, signInProvider: String, claims: JSONValue? = nil
    ) -> String {
        var payload: [(String, JSONValue)] = [("p", .string(project)), ("u", .string(uid)), ("t", .int(now)), ("s", .string(signInProvider))]
        if let claims { payload.append(("c", claims)) }
        return seal(.object(payload), secret: refreshKey)
    }

    /// A reset code for the account `uid` of `project` whose password is now `passwordHash`
    /// (nil: none), valid until `now` + an hour (milliseconds), under signing key `key`.
    public static func resetCode(project: String, uid: String, passwordHash: String?, key: Key, now: Int64) -> String {
        let payload = JSONValue.object([
            ("p", .string(project)), ("u", .string(uid)), ("h", .string(passwordDigest(passwordHash))), ("x", .int(now + resetCodeLifetime)),
            ("k", .string(key.id)),
        ])
        return seal(payload, secret: key.secret)
    }

    /// A short digest of a password hash (a reset code names the password it may replace
    /// without carrying its hash).
    public static func passwordDigest(_ hash: String?) -> String {
        Base64.encodeURL(SHA256.hash(data: Array((hash ?? "").utf8)).prefix(16))
    }

    static func mac(_ input: [UInt8], _ secret: [UInt8]) -> [UInt8] {
        Array(HMAC<SHA256>.authenticationCode(for: input, using: SymmetricKey(data: secret)))
    }
}
