import BanyanTree
import Crypto

/// Verifies the credentials a client presents (docs/security.md, "Credentials"): RS256 ID tokens
/// against the configured public keys, Firebase 2.x custom tokens (HS256) against the database
/// secrets, and a database secret itself. `verify` reads no clock (`now` is an input); only the
/// signature checks call into swift-crypto, everything else is `JWT` and `Claims`.
///
/// Algorithms are tied to key kinds, never taken from the token: an RS256 token is checked only
/// with an RSA key named by its `kid`, an HS256 token only with the database secrets, and
/// `none` or any other `alg` is refused; so a token cannot choose how it is checked.
public struct TokenVerifier: Sendable {
    /// What ID tokens must say (`iss`, `aud`), and the clock skew allowed on every time claim.
    public struct Settings: Sendable, Equatable {
        public var issuer: String?
        public var audience: String?
        /// Milliseconds by which `exp` may be past and `iat`/`nbf` in the future.
        public var clockSkew: Int64 = 5 * 60 * 1000
        public var limits = TokenLimits()

        public init(issuer: String? = nil, audience: String? = nil) {
            self.issuer = issuer
            self.audience = audience
        }

        /// A Firebase project's values: issuer `https://securetoken.google.com/<project>`,
        /// audience `<project>`.
        public init(projectID: String) {
            self.init(issuer: "https://securetoken.google.com/" + projectID, audience: projectID)
        }
    }

    public let settings: Settings
    /// ID-token keys by `kid`.
    private let keys: RSAKeySet
    /// Database secrets: the first signs nothing special; all are accepted (rotation).
    private let secrets: [[UInt8]]

    /// Whether ID tokens can be verified (keys, issuer and audience are configured).
    public var acceptsIDTokens: Bool { !keys.isEmpty && settings.issuer != nil && settings.audience != nil }
    /// Whether custom tokens and database secrets can be verified.
    public var acceptsSecrets: Bool { !secrets.isEmpty }
    /// The configured key ids, sorted.
    public var keyIDs: [String] { keys.keyIDs }

    /// RSA keys shorter than this are refused when loading.
    public static let minimumKeyBits = RSAKeySet.minimumKeyBits

    public init(
        settings: Settings, jwks: [KeyFiles.RSAComponents] = [], publicKeys: [KeyFiles.PublicKeyDER] = [], secrets: [[UInt8]] = []
    ) throws(KeyFileError) {
        let keys = try RSAKeySet(jwks: jwks, publicKeys: publicKeys)
        if !keys.isEmpty, settings.issuer == nil || settings.audience == nil {
            throw KeyFileError("ID token keys need an issuer and an audience (or a project id)")
        }
        self.settings = settings
        self.keys = keys
        self.secrets = secrets
    }

    /// Verifies `token` at `now` (milliseconds since the epoch).
    public func verify(_ token: String, now: Int64) -> Result<VerifiedToken, TokenError> {
        do throws(TokenError) {
            return .success(try check(token, now: now))
        } catch {
            return .failure(error)
        }
    }

    private func check(_ token: String, now: Int64) throws(TokenError) -> VerifiedToken {
        let size = token.utf8.count
        guard size <= settings.limits.maxTokenBytes else { throw .tooLarge(size) }
        // A database secret itself (Firebase REST `auth=<secret>`): compared with every secret,
        // each in constant time. Secrets never contain '.', so no JWT can match one.
        if !secrets.isEmpty && !token.utf8.contains(UInt8(ascii: ".")) {
            let presented = Array(token.utf8)
            var matched = false
            for secret in secrets { matched = Self.constantTimeEqual(presented, secret) || matched }
            if matched { return VerifiedToken(kind: .databaseSecret, administrator: true, auth: nil, expires: nil, validUntil: nil) }
        }
        let jwt = try JWT.decode(token, limits: settings.limits)
        switch jwt.algorithm {
        case "RS256":
            guard acceptsIDTokens, let issuer = settings.issuer, let audience = settings.audience else { throw .algorithmNotAllowed(jwt.algorithm) }
            try keys.checkSignature(jwt)
            return try Claims.checkIDToken(jwt.claims, issuer: issuer, audience: audience, skew: settings.clockSkew, now: now)
        case "HS256":
            guard acceptsSecrets else { throw .algorithmNotAllowed(jwt.algorithm) }
            guard jwt.signature.count == SHA256.byteCount else { throw .badSignature }
            var valid = false
            for secret in secrets {
                let ok = HMAC<SHA256>.isValidAuthenticationCode(jwt.signature, authenticating: jwt.signingInput, using: SymmetricKey(data: secret))
                valid = ok || valid
            }
            guard valid else { throw .badSignature }
            return try Claims.checkCustomToken(jwt.claims, skew: settings.clockSkew, now: now)
        default:
            throw .algorithmNotAllowed(jwt.algorithm)
        }
    }

    /// Whether two byte strings are equal, in time that depends only on their lengths.
    static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        var diff = UInt8(truncatingIfNeeded: a.count ^ b.count)
        for i in 0..<max(a.count, b.count) { diff |= (i < a.count ? a[i] : 0) ^ (i < b.count ? b[i] : 0) }
        return diff == 0
    }
}
