public import BanyanTree
import BanyanBasics
import Crypto
public import _CryptoExtras

/// Administrator credentials in the shape of Google service-account keys (docs/security.md,
/// "Service accounts"): each account holds RSA key pairs; the nodes hold only the public halves
/// (`auth.service_accounts_file`), and a client proves it is the account by signing a short
/// JWT with the private half. Such a token is the administrator: it bypasses rules.
///
/// A token is accepted when: `alg` is RS256 (the algorithm is never taken from the token); its
/// `kid` names a key of the file; `iss` is the account that key belongs to, and `sub`, when
/// present, is too; `aud` is (or, as an array, holds) one of the configured audiences; `iat`
/// and `exp` are present, at most `maxLifetime` apart, `exp` not past and `iat` (and `nbf`)
/// not future, allowing the clock skew. That is what Google's libraries send to a token
/// endpoint as a JWT-bearer assertion (RFC 7523) and what they send as a self-signed JWT, so
/// the same token serves both (`ServiceAccountTokenEndpoint`). Pure: `now` is an input.
public struct ServiceAccounts: Sendable {
    public struct Settings: Sendable, Equatable {
        /// The `aud` values accepted: the token endpoint's URL as the key files name it
        /// (`token_uri`), and any other audience the operator names.
        public var audiences: [String]
        /// Milliseconds by which `exp` may be past and `iat`/`nbf` in the future.
        public var clockSkew: Int64 = 5 * 60 * 1000
        /// The longest `exp - iat` accepted, in milliseconds: one hour, as Google's.
        public var maxLifetime: Int64 = 3600 * 1000
        public var limits = TokenLimits()

        public init(audiences: [String]) { self.audiences = audiences }
    }

    public let settings: Settings
    /// Every account's keys, by `kid`.
    private let keys: RSAKeySet
    /// The account each `kid` belongs to.
    private let owners: [String: String]

    /// The accounts, sorted.
    public var accountNames: [String] { Set(owners.values).sorted() }
    /// The key ids, sorted.
    public var keyIDs: [String] { owners.keys.sorted() }

    /// The accounts of a service-accounts file: a JSON object from each account's name (the
    /// `client_email` of its key files, 1 to 256 bytes) to its public keys as a JWKS
    /// (`{"keys": […]}`, what `banyan service-account create` writes). A `kid` may belong to one
    /// account only, and may not start with the account service's prefix (`banyan-`: such
    /// tokens are the account service's). Refused without an audience, or when no account holds
    /// a usable RSA key.
    ///
    /// Google's own service-account keys are not accepted, in any format: an assertion made for
    /// Banyan with one of them would also be a credential at Google's token endpoint (whose
    /// audience the node trusts for google-auth's sake), and the reverse (docs/security.md,
    /// "Service accounts"). Google publishes them as `{kid: PEM}` and as JWKS; both are refused,
    /// the first by its shape, the second by its key ids (40 hex digits, Google's
    /// `private_key_id`), which Banyan's never are (`ServiceAccountKey.keyIDPrefix`).
    public init(settings: Settings, file: [UInt8]) throws(KeyFileError) {
        guard !settings.audiences.isEmpty, settings.audiences.allSatisfy({ !$0.isEmpty }) else {
            throw KeyFileError("service accounts need at least one audience (the token endpoint's URL), none empty")
        }
        guard case .object(let accounts)? = try? JSONValue(parsing: file, maxDepth: 8) else {
            throw KeyFileError("expected a JSON object from each service account's name to its keys (a JWKS)")
        }
        var jwks: [KeyFiles.RSAComponents] = []
        var owners: [String: String] = [:]
        for (name, value) in accounts {
            guard (1...256).contains(name.utf8.count) else { throw KeyFileError("a service account's name must be 1 to 256 bytes") }
            guard case .object = value, value["keys"] != nil else { throw KeyFileError("\(name): expected a JWKS ({\"keys\": [...]})") }
            let found: [KeyFiles.RSAComponents]
            do throws(KeyFileError) {
                found = try KeyFiles.jwks(Array(value.jsonString.utf8))
            } catch {
                throw KeyFileError("\(name): \(error.message)")
            }
            for kid in found.map(\.keyID) {
                if let other = owners[kid] { throw KeyFileError("kid \(kid) belongs to both \(other) and \(name)") }
                if kid.hasPrefix(AccountTokens.keyIDPrefix) {
                    throw KeyFileError("\(name): kid \(kid) starts with \(AccountTokens.keyIDPrefix), which names the account service's keys")
                }
                if Self.isGoogleKeyID(kid) {
                    throw KeyFileError("\(name): kid \(kid) is a Google service-account key's (40 hex digits); trust only keys made by banyan service-account create")
                }
                owners[kid] = name
            }
            jwks += found
        }
        guard !owners.isEmpty else { throw KeyFileError("the file names no service account") }
        self.settings = settings
        self.keys = try RSAKeySet(jwks: jwks)
        self.owners = owners
    }

    /// Whether `kid` has the shape of a Google service-account key id: 40 lowercase hex digits.
    public static func isGoogleKeyID(_ kid: String) -> Bool {
        kid.utf8.count == 40 && kid.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// Whether `audience` may be trusted: anything but a plain-HTTP URL to a host other than
    /// loopback (assertions and tokens are administrator credentials, so they travel in clear
    /// only within the machine).
    public static func isSafeAudience(_ audience: String) -> Bool {
        let lower = audience.lowercased()
        guard lower.hasPrefix("http://") else { return true }
        var rest = lower.dropFirst("http://".count)
        if let slash = rest.firstIndex(of: "/") { rest = rest[..<slash] }
        if let at = rest.lastIndex(of: "@") { rest = rest[rest.index(after: at)...] }
        let host: Substring
        if rest.hasPrefix("[") {
            host = rest.dropFirst().prefix { $0 != "]" }
        } else {
            host = rest.prefix { $0 != ":" }
        }
        if host == "localhost" || host == "::1" { return true }
        // 127.0.0.0/8 as a dotted IPv4 literal, nothing after it.
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts[0] == "127" && parts.allSatisfy { p in !p.isEmpty && p.count <= 3 && p.allSatisfy(\.isASCII) && UInt8(p) != nil }
    }

    /// Whether `kid` names one of these keys.
    public func holds(keyID: String) -> Bool { owners[keyID] != nil }

    /// Verifies `token` at `now` (milliseconds) if it is a service account's: nil when it is not
    /// a JWT whose header names one of these keys (another verifier may know it).
    public func verifyIfOwned(_ token: String, now: Int64) -> Result<VerifiedToken, TokenError>? {
        guard let jwt = try? JWT.decode(token, limits: settings.limits), let kid = jwt.keyID, owners[kid] != nil else { return nil }
        return verify(jwt, now: now)
    }

    /// Verifies `token` at `now`, which must be a service account's.
    public func verify(_ token: String, now: Int64) -> Result<VerifiedToken, TokenError> {
        do throws(TokenError) {
            return verify(try JWT.decode(token, limits: settings.limits), now: now)
        } catch {
            return .failure(error)
        }
    }

    private func verify(_ jwt: JWT, now: Int64) -> Result<VerifiedToken, TokenError> {
        do throws(TokenError) {
            guard jwt.algorithm == "RS256" else { throw .algorithmNotAllowed(jwt.algorithm) }
            guard let kid = jwt.keyID, let account = owners[kid] else { throw .unknownKey(jwt.keyID) }
            try keys.checkSignature(jwt)
            let claims = jwt.claims
            guard case .string(let iss)? = claims["iss"], iss.utf8.elementsEqual(account.utf8) else { throw .wrongIssuer }
            switch claims["sub"] {
            case nil: break
            case .string(let sub)? where sub.utf8.elementsEqual(account.utf8): break
            default: throw .invalidSubject
            }
            switch claims["aud"] {
            case .string(let aud)? where Claims.names(aud, settings.audiences): break
            case .array(let auds)? where auds.contains(where: { if case .string(let a) = $0 { Claims.names(a, settings.audiences) } else { false } }): break
            default: throw .wrongAudience
            }
            guard let exp = try Claims.time(claims, "exp") else { throw .malformed("exp is missing") }
            guard let iat = try Claims.time(claims, "iat") else { throw .malformed("iat is missing") }
            guard exp > iat, exp - iat <= settings.maxLifetime else {
                throw .malformed("a service account's token lives at most \(settings.maxLifetime / 1000) seconds (exp - iat)")
            }
            try Claims.checkWindow(exp: exp, notBefore: [iat, try Claims.time(claims, "nbf")], skew: settings.clockSkew, now: now)
            // Honoured until `exp` plus the skew: at most `maxLifetime` after `iat`, which is at
            // most the skew ahead of this node's clock.
            return .success(
                VerifiedToken(kind: .serviceAccount(account), administrator: true, auth: nil, expires: exp, validUntil: exp &+ settings.clockSkew))
        } catch {
            return .failure(error)
        }
    }
}

/// A service account's private key file, in the shape Google issues (`"type":
/// "service_account"`, `client_email`, `private_key_id`, `private_key` as PEM, `token_uri`), so
/// that Google's libraries (oauth2client, google-auth) load it unchanged; and the tokens it signs.
public struct ServiceAccountKey: Sendable {
    /// The account's name (`client_email`): the tokens' `iss` and `sub`.
    public var account: String
    /// The key's id (`private_key_id`): the tokens' `kid`.
    public var keyID: String
    /// Where tokens are exchanged (`token_uri`): the default audience.
    public var tokenURI: String
    /// The project named in the file (`project_id`), if any.
    public var projectID: String?
    public let privateKey: _RSA.Signing.PrivateKey

    public init(account: String, keyID: String, tokenURI: String, projectID: String?, privateKey: _RSA.Signing.PrivateKey) {
        self.account = account
        self.keyID = keyID
        self.tokenURI = tokenURI
        self.projectID = projectID
        self.privateKey = privateKey
    }

    /// What Banyan's key ids start with: never Google's shape (`ServiceAccounts.isGoogleKeyID`).
    public static let keyIDPrefix = "bsa-"

    /// A new 2048-bit key for `account`, its id `bsa-` and 32 random hex digits.
    public static func generate(account: String, tokenURI: String, projectID: String?) throws(KeyFileError) -> ServiceAccountKey {
        let key: _RSA.Signing.PrivateKey
        do {
            key = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        } catch {
            throw KeyFileError("cannot make an RSA key: \(error)")
        }
        var id = ""
        for byte in SymmetricKey(size: .init(bitCount: 128)).withUnsafeBytes({ Array($0) }) {
            id += String(byte >> 4, radix: 16) + String(byte & 0x0F, radix: 16)
        }
        return ServiceAccountKey(account: account, keyID: keyIDPrefix + id, tokenURI: tokenURI, projectID: projectID, privateKey: key)
    }

    /// Reads a key file (JSON): `client_email`, `private_key_id`, `private_key` (PEM, PKCS #8 or
    /// PKCS #1) and `token_uri` are required.
    public init(file: [UInt8]) throws(KeyFileError) {
        guard let root = try? JSONValue(parsing: file, maxDepth: 4), case .object = root else { throw KeyFileError("not a JSON object") }
        func field(_ name: String) throws(KeyFileError) -> String {
            guard case .string(let s)? = root[name], !s.isEmpty else { throw KeyFileError("\(name) is missing") }
            return s
        }
        if let type = root["type"], type != .string("service_account") { throw KeyFileError("type is not service_account") }
        let pem = try field("private_key")
        let key: _RSA.Signing.PrivateKey
        do {
            key = try _RSA.Signing.PrivateKey(pemRepresentation: pem)
        } catch {
            throw KeyFileError("private_key is not an RSA private key in PEM (\(error))")
        }
        guard key.keySizeInBits >= RSAKeySet.minimumKeyBits else { throw KeyFileError("private_key is shorter than \(RSAKeySet.minimumKeyBits) bits") }
        let projectID: String? = if case .string(let p)? = root["project_id"] { p } else { nil }
        self.init(account: try field("client_email"), keyID: try field("private_key_id"), tokenURI: try field("token_uri"), projectID: projectID, privateKey: key)
    }

    /// The key file's text (JSON, with the private key as PKCS #8 PEM).
    public var fileText: String {
        var members: [(String, JSONValue)] = [("type", .string("service_account"))]
        if let projectID { members.append(("project_id", .string(projectID))) }
        members += [
            ("private_key_id", .string(keyID)), ("private_key", .string(privateKey.pkcs8PEMRepresentation)),
            ("client_email", .string(account)), ("client_id", .string(account)), ("token_uri", .string(tokenURI)),
        ]
        return JSONValue.object(members).jsonString + "\n"
    }

    /// The public half as one JWK (`kty`, `alg`, `use`, `kid`, `n`, `e`).
    public func publicJWK() throws(KeyFileError) -> JSONValue {
        let numbers = try KeyFiles.rsaComponents(der: Array(privateKey.publicKey.derRepresentation))
        return .object([
            ("kty", .string("RSA")), ("alg", .string("RS256")), ("use", .string("sig")), ("kid", .string(keyID)),
            ("n", .string(Base64.encodeURL(numbers.modulus))), ("e", .string(Base64.encodeURL(numbers.exponent))),
        ])
    }

    /// A token for this account: `iss` and `sub` the account, `aud` the given audience (default
    /// `token_uri`), issued at `now` seconds and living `lifetime` seconds.
    public func token(now: Int64, audience: String? = nil, lifetime: Int64 = 3600, scope: String? = nil) throws(KeyFileError) -> String {
        let header = JSONValue.object([("alg", .string("RS256")), ("typ", .string("JWT")), ("kid", .string(keyID))])
        var claims: [(String, JSONValue)] = [
            ("iss", .string(account)), ("sub", .string(account)), ("aud", .string(audience ?? tokenURI)),
            ("iat", .int(now)), ("exp", .int(now + lifetime)),
        ]
        if let scope { claims.append(("scope", .string(scope))) }
        let input = Base64.encodeURL(Array(header.jsonString.utf8)) + "." + Base64.encodeURL(Array(JSONValue.object(claims).jsonString.utf8))
        do {
            let signature = try privateKey.signature(for: SHA256.hash(data: Array(input.utf8)), padding: .insecurePKCS1v1_5)
            return input + "." + Base64.encodeURL(Array(signature.rawRepresentation))
        } catch {
            throw KeyFileError("cannot sign: \(error)")
        }
    }
}

/// The token endpoint of service accounts (`POST /oauth2.googleapis.com/token`, docs/security.md):
/// the OAuth 2.0 JWT-bearer grant (RFC 7523) Google's libraries make with a key file's
/// `token_uri`. The assertion is verified as any service-account token is, and handed back as
/// the access token, valid until its own `exp`: every node verifies it with the same public
/// keys, so the endpoint keeps no state and a client may use the token on any node. Pure.
public enum ServiceAccountTokenEndpoint {
    /// RFC 7523's grant type.
    public static let grantType = "urn:ietf:params:oauth:grant-type:jwt-bearer"
    /// The audience google-auth (and so firebase-admin) names in its assertions whatever the key
    /// file's `token_uri` says: Google's token endpoint.
    public static let googleAudience = "https://oauth2.googleapis.com/token"

    /// An answer: the HTTP status and the JSON body (RFC 6749 section 5.1 or 5.2).
    public struct Answer: Sendable, Equatable {
        public var status: Int
        public var body: JSONValue
    }

    /// The answer to a request whose form fields are `fields` at `now` (milliseconds), with `accounts` the node's service accounts (nil: none configured).
    public static func answer(fields: [(String, String)], accounts: ServiceAccounts?, now: Int64) -> Answer {
        func field(_ name: String) -> String? { fields.last { $0.0 == name }?.1 }
        func error(_ code: String, _ description: String) -> Answer {
            Answer(status: 400, body: .object([("error", .string(code)), ("error_description", .string(description))]))
        }
        // RFC 6749 section 3.2: a parameter sent twice is an invalid request.
        for name in ["grant_type", "assertion"] where fields.count(where: { $0.0 == name }) > 1 {
            return error("invalid_request", "\(name) appears more than once")
        }
        guard let grant = field("grant_type") else { return error("invalid_request", "grant_type is missing") }
        guard grant == grantType else { return error("unsupported_grant_type", "only \(grantType) is supported") }
        guard let assertion = field("assertion") else { return error("invalid_request", "assertion is missing") }
        guard let accounts else { return error("invalid_grant", "this server has no service accounts (auth.service_accounts_file)") }
        switch accounts.verify(assertion, now: now) {
        case .success(let verified):
            let seconds = max(1, ((verified.expires ?? now) - now) / 1000)
            return Answer(
                status: 200,
                body: .object([("access_token", .string(assertion)), ("token_type", .string("Bearer")), ("expires_in", .int(seconds))]))
        case .failure(let refusal):
            return error("invalid_grant", refusal.reason)
        }
    }
}
