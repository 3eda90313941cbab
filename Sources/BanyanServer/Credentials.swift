import BanyanAuth
import BanyanREST
import BanyanStateMachine
import BanyanTree
import Foundation

/// How this node turns the credentials a client presents into who it is (docs/security.md):
/// the development credentials as `development` allows, and signed tokens through `verifier`
/// when the `auth:` section configures one. One place for REST, event streams and realtime
/// sessions.
struct Credentials: Sendable {
    let development: NodeConfig.DevelopmentSettings
    let verifier: TokenVerifier?
    /// The account service's signing key with a `kid`, if accepted at a time (milliseconds):
    /// the replicated keys of the served projects (docs/accounts.md).
    var accountKey: @Sendable (String, Int64) -> AccountTokens.Key? = { _, _ in nil }
    /// The projects whose account-service ID tokens are honoured (`accounts.project_id`,
    /// `accounts.projects`): a token's `aud` and `iss` must name one of them.
    var accountProjects: Set<String> = []
    /// The clock skew allowed on the account service's tokens (`auth.clock_skew_seconds`).
    var skew: Int64 = 5 * 60 * 1000

    /// Verifies an account-service ID token (a `kid` of the cluster's).
    func verifyAccountToken(_ token: String, now: Int64) -> Result<VerifiedToken, TokenError> {
        AccountTokens.verifyIDToken(token, key: { accountKey($0, now) }, projects: accountProjects, skew: skew, now: now)
    }

    /// The identity of a REST request or event stream at `now` (milliseconds since the epoch).
    func identity(_ authorization: RESTRequest.Authorization, override: String?, now: Int64) -> ClientIdentity {
        identityAndExpiry(authorization, override: override, now: now).identity
    }

    /// The same, and when a verified token stops being honoured (an event stream ends then).
    func identityAndExpiry(_ authorization: RESTRequest.Authorization, override: String?, now: Int64) -> (identity: ClientIdentity, validUntil: Int64?) {
        var validUntil: Int64?
        let development = development
        let verify = { (token: String) -> ClientIdentity in
            let result: Result<VerifiedToken, TokenError>
            if AccountTokens.isAccountToken(token) {
                result = self.verifyAccountToken(token, now: now)
            } else if let verifier = self.verifier {
                result = verifier.verify(token, now: now)
            } else {
                // No verifier: what `Access.identity` does without one.
                return development.allowUnauthenticated ? .client(.signedOut) : .refused("Unauthorized request.")
            }
            switch result {
            case .success(let verified):
                validUntil = verified.validUntil
                return Self.identity(verified)
            case .failure(let error): return .refused(error.reason)
            }
        }
        let identity = Access.identity(
            authorization, override: override, acceptOwnerToken: development.acceptOwnerToken, developmentTokens: development.allowUnauthenticated,
            verify: verify)
        return (identity, validUntil)
    }

    static func identity(_ verified: VerifiedToken) -> ClientIdentity {
        if verified.administrator { return .administrator(override: nil) }
        return .client(verified.auth.map { .user(json: $0) } ?? .signedOut)
    }

    /// What a realtime connection's `auth` / `gauth` credential makes it.
    enum Session: Equatable {
        /// Signed in: the administrator or a user, the answer's `d`, and when the connection
        /// must be signed out again (`ac`), if ever.
        case signedIn(ClientIdentity, answer: JSONValue, validUntil: Int64?)
        /// Refused: the status (`invalid_token`, `expired_token`) and the reason.
        case refused(status: String, reason: String)
    }

    /// The outcome of `auth` / `gauth` with `token` at `now`: the emulator's `owner` (when
    /// accepted), an unsigned emulator token (while unauthenticated access is allowed), or a
    /// verified token. The answer is Firebase's: `{"auth": <auth or null>, "expires": <exp in
    /// seconds or null>}`.
    func session(_ token: String, now: Int64) -> Session {
        if token == "owner" {
            guard development.acceptOwnerToken else { return .refused(status: "invalid_token", reason: "The owner token is not accepted by this server.") }
            return .signedIn(.administrator(override: nil), answer: Self.answer(auth: nil, expires: .null), validUntil: nil)
        }
        if development.allowUnauthenticated, let claims = Access.unsignedClaims(token) {
            // The emulator ignores the expiry of its unsigned tokens (mockUserToken's is long past);
            // one that names no user signs in as signed out.
            let client = Access.unsignedTokenAuth(token).map { ClientAuth.user(json: $0) } ?? .signedOut
            return .signedIn(.client(client), answer: Self.answer(auth: claims, expires: claims["exp"] ?? .null), validUntil: nil)
        }
        if AccountTokens.isAccountToken(token) {
            return signedIn(verifyAccountToken(token, now: now))
        }
        guard let verifier else {
            let accepted = development.allowUnauthenticated ? "the emulator's owner and unsigned tokens" : "the emulator's owner token"
            return .refused(status: "invalid_token", reason: "This server verifies no signed tokens (no auth configuration); it accepts only \(accepted).")
        }
        return signedIn(verifier.verify(token, now: now))
    }

    /// A realtime session's outcome for a verification's result.
    private func signedIn(_ result: Result<VerifiedToken, TokenError>) -> Session {
        switch result {
        case .success(let verified):
            let auth = verified.auth.flatMap { try? JSONValue(parsing: $0) }
            let expires: JSONValue = verified.expires.map { .int($0 / 1000) } ?? .null
            return .signedIn(Self.identity(verified), answer: Self.answer(auth: auth, expires: expires), validUntil: verified.validUntil)
        case .failure(let error):
            return .refused(status: error == .expired ? "expired_token" : "invalid_token", reason: error.reason)
        }
    }

    static func answer(auth: JSONValue?, expires: JSONValue) -> JSONValue {
        .object([("auth", auth ?? .null), ("expires", expires)])
    }
}

extension NodeConfig {
    /// The token verifier the `auth:` section describes, its files read now; nil when the
    /// section configures none. Any unreadable or unusable file is a `ConfigError` naming it.
    func loadTokenVerifier() throws(ConfigError) -> TokenVerifier? {
        guard auth.isConfigured else { return nil }
        let read = Self.readKeyFile
        func parse<T>(_ file: String?, _ key: String, _ parse: ([UInt8]) throws(KeyFileError) -> [T]) throws(ConfigError) -> [T] {
            guard let file else { return [] }
            let bytes = try read(file, key)
            do throws(KeyFileError) {
                return try parse(bytes)
            } catch {
                throw ConfigError("auth.\(key) \(file): \(error.message)")
            }
        }
        let jwks = try parse(auth.jwksFile, "jwks_file", KeyFiles.jwks)
        let publicKeys = try parse(auth.x509File, "x509_file", KeyFiles.x509)
        let secrets = try parse(auth.databaseSecretsFile, "database_secrets_file", KeyFiles.secrets)
        var settings = TokenVerifier.Settings(issuer: auth.effectiveIssuer, audience: auth.effectiveAudience)
        settings.clockSkew = Int64(auth.clockSkewSeconds) * 1000
        do throws(KeyFileError) {
            return try TokenVerifier(settings: settings, jwks: jwks, publicKeys: publicKeys, secrets: secrets)
        } catch {
            throw ConfigError("auth: \(error.message)")
        }
    }

    /// A key file of the `auth:` section (at most 4 MiB), or a `ConfigError` naming the setting
    /// and the file.
    static func readKeyFile(_ file: String, _ key: String) throws(ConfigError) -> [UInt8] {
        guard let data = FileManager.default.contents(atPath: file) else { throw ConfigError("auth.\(key) \(file): cannot read the file") }
        guard data.count <= 4 << 20 else { throw ConfigError("auth.\(key) \(file): larger than 4 MiB") }
        return Array(data)
    }

    /// The OpenID Connect providers of `auth.oidc_providers` by id, their key files read now.
    /// A file that cannot be read or holds no usable RSA key is a `ConfigError` naming the
    /// provider and the file.
    func loadOIDCProviders() throws(ConfigError) -> [String: OIDCProvider] {
        var out: [String: OIDCProvider] = [:]
        for (i, p) in auth.oidcProviders.enumerated() {
            let key = "oidc_providers[\(i)].keys_file"
            let bytes = try Self.readKeyFile(p.keysFile, key)
            var settings = OIDCProvider.Settings(id: p.id, issuer: p.issuer, audiences: p.audiences, uidPrefix: p.effectiveUIDPrefix)
            settings.clockSkew = Int64(p.clockSkewSeconds ?? auth.clockSkewSeconds) * 1000
            do throws(KeyFileError) {
                out[p.id] = try OIDCProvider(settings: settings, keys: bytes)
            } catch {
                throw ConfigError("auth.\(key) \(p.keysFile) (provider \(p.id)): \(error.message)")
            }
        }
        return out
    }
}
