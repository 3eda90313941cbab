import BanyanBasics
public import BanyanTree
import Crypto

/// An OpenID Connect provider the operator configured (`auth.oidc_providers`, docs/accounts.md,
/// "Sign-in with an identity provider"): the ID tokens it issues to the operator's apps, which a
/// client already holds and hands to `accounts:signInWithIdp`. Only what the token itself says
/// is trusted: RS256 signatures under the configured keys, the configured issuer and one of the
/// configured audiences (client ids), the time window. The server makes no outbound call
/// (no discovery, no key fetch, no code exchange). Pure: `now` is an input.
public struct OIDCProvider: Sendable {
    public struct Settings: Sendable, Equatable {
        /// The provider's name in uids (`<id>:<sub>`) and `providerId` (`google.com`).
        public var id: String
        /// The `iss` its tokens carry, exactly.
        public var issuer: String
        /// The client ids its tokens may be issued to (`aud`).
        public var audiences: [String]
        /// What its users' uids start with (`<prefix>:<sub>`): by default the id up to its first
        /// `.` (`google` for `google.com`, as Firebase 2.x named its users), so that a uid is a
        /// valid database key.
        public var uidPrefix: String
        /// Milliseconds by which `exp` may be past and `iat`/`nbf` in the future.
        public var clockSkew: Int64 = 5 * 60 * 1000
        public var limits = TokenLimits()

        public init(id: String, issuer: String, audiences: [String], uidPrefix: String? = nil) {
            self.id = id
            self.issuer = issuer
            self.audiences = audiences
            self.uidPrefix = uidPrefix ?? Self.defaultUIDPrefix(id)
        }

        /// `id` up to its first `.`.
        public static func defaultUIDPrefix(_ id: String) -> String { String(id.prefix { $0 != "." }) }
    }

    public let settings: Settings
    private let keys: RSAKeySet

    /// The configured key ids, sorted (`*`: a bare PEM key, used whatever `kid` a token names).
    public var keyIDs: [String] { keys.keyIDs }

    /// A provider whose keys are the file `keys` (a JWKS, Google's certificates format, or one
    /// PEM public key or certificate); refused when it holds no usable RSA key or the settings
    /// lack an issuer or audience.
    public init(settings: Settings, keys file: [UInt8]) throws(KeyFileError) {
        guard !settings.issuer.isEmpty else { throw KeyFileError("the provider needs an issuer") }
        guard !settings.audiences.isEmpty, settings.audiences.allSatisfy({ !$0.isEmpty }) else {
            throw KeyFileError("the provider needs at least one audience (client id), none empty")
        }
        self.settings = settings
        switch try KeyFiles.providerKeys(file) {
        case .jwks(let jwks): keys = try RSAKeySet(jwks: jwks)
        case .x509(let publicKeys): keys = try RSAKeySet(publicKeys: publicKeys)
        case .pem(let der): keys = try RSAKeySet(anyKid: der)
        }
    }

    /// Verifies `token` at `now` (milliseconds since the epoch): RS256 only (`none`, HS256 and
    /// every other `alg` are refused, whatever the token says), a configured key, the
    /// signature, then the claims (`Claims.checkOpenIDClaims`).
    public func verify(_ token: String, now: Int64) -> Result<OIDCIdentity, TokenError> {
        do throws(TokenError) {
            let jwt = try JWT.decode(token, limits: settings.limits)
            guard jwt.algorithm == "RS256" else { throw .algorithmNotAllowed(jwt.algorithm) }
            try keys.checkSignature(jwt)
            let (sub, exp) = try Claims.checkOpenIDClaims(
                jwt.claims, issuer: settings.issuer, audiences: settings.audiences, skew: settings.clockSkew, now: now)
            return .success(OIDCIdentity(provider: settings.id, subject: sub, claims: jwt.claims, expires: exp))
        } catch {
            return .failure(error)
        }
    }
}

/// Who a provider's verified ID token says the user is: its `sub` and the standard profile
/// claims (OpenID Connect Core 1.0, section 5.1), each taken only when it has its type.
public struct OIDCIdentity: Sendable, Equatable {
    /// The configured provider's id.
    public var provider: String
    /// `sub`: the user's id at the provider (1 to 128 bytes).
    public var subject: String
    /// All the token's claims.
    public var claims: JSONValue
    /// `exp`, in milliseconds since the epoch.
    public var expires: Int64

    public init(provider: String, subject: String, claims: JSONValue, expires: Int64) {
        self.provider = provider
        self.subject = subject
        self.claims = claims
        self.expires = expires
    }

    private func string(_ name: String) -> String? {
        if case .string(let s)? = claims[name], !s.isEmpty { return s }
        return nil
    }

    public var email: String? { string("email") }
    /// `email_verified`: a boolean, or the strings `"true"` / `"false"` some providers send.
    public var emailVerified: Bool {
        switch claims["email_verified"] {
        case .bool(let b)?: return b
        case .string(let s)?: return s == "true"
        default: return false
        }
    }
    public var name: String? { string("name") }
    public var givenName: String? { string("given_name") }
    public var familyName: String? { string("family_name") }
    public var picture: String? { string("picture") }

    /// Whether the token answers the request's `nonce` (nil: the request named none, so nothing
    /// is required): its `nonce` claim is the nonce itself, or the hex SHA-256 of it (what Apple
    /// and Firebase's hashed-nonce flow put in the token).
    public func answers(nonce: String?) -> Bool {
        guard let nonce else { return true }
        guard let claimed = string("nonce") else { return false }
        if claimed.utf8.elementsEqual(nonce.utf8) { return true }
        let digest = SHA256.hash(data: Array(nonce.utf8)).map { byte in
            let hex = Array("0123456789abcdef".utf8)
            return String(decoding: [hex[Int(byte >> 4)], hex[Int(byte & 0xF)]], as: UTF8.self)
        }.joined()
        return claimed.utf8.elementsEqual(digest.utf8)
    }
}
