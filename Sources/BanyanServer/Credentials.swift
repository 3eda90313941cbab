import BanyanAuth
import BanyanREST
import BanyanStateMachine
import BanyanTree
import Foundation
import Synchronization

/// How this node turns the credentials a client presents into who it is (docs/security.md):
/// the development credentials as `development` allows, and signed tokens through `verifier`
/// when the `auth:` section configures one. One place for REST, event streams and realtime
/// sessions.
struct Credentials: Sendable {
    let development: NodeConfig.DevelopmentSettings
    let verifier: TokenVerifier?
    /// Administrator credentials shaped like service-account keys (`auth.service_accounts_file`).
    var serviceAccounts: ServiceAccounts?
    /// The account service's signing key with a `kid`, if accepted at a time (milliseconds):
    /// the replicated keys of the served projects (docs/accounts.md).
    var accountKey: @Sendable (String, Int64) -> AccountTokens.Key? = { _, _ in nil }
    /// The projects whose account-service ID tokens are honoured (`accounts.project_id`,
    /// `accounts.projects`): a token's `aud` and `iss` must name one of them.
    var accountProjects: Set<String> = []
    /// The clock skew allowed on the account service's tokens (`auth.clock_skew_seconds`).
    var skew: Int64 = 5 * 60 * 1000

    /// Tokens verified before, shared by every copy of these credentials (`CredentialCache`).
    var cache = CredentialCache()

    /// Verifies an account-service ID token (a `kid` of the cluster's).
    func verifyAccountToken(_ token: String, now: Int64) -> Result<VerifiedToken, TokenError> {
        verifyAccountToken(token, now: now, hit: cache.lookup(token, now: now))
    }

    /// The same, served from `hit` while the key it was verified with is still accepted as
    /// it was; a new verification that succeeds is recorded with that key.
    private func verifyAccountToken(_ token: String, now: Int64, hit: CredentialCache.Entry?) -> Result<VerifiedToken, TokenError> {
        if case .account(let verified, let key)? = hit, accountKey(key.id, now) == key { return .success(verified) }
        var used: AccountTokens.Key?
        let result = AccountTokens.verifyIDToken(
            token, key: { kid in
                let key = accountKey(kid, now)
                used = key
                return key
            }, projects: accountProjects, skew: skew, now: now)
        if case .success(let verified) = result, let used { cache.insert(token, .account(verified, key: used), now: now) }
        return result
    }

    /// A signed token's verification: the account service's tokens with the cluster's keys, others
    /// with `verifier` (nil when there is none). Served from `hit` when it holds one.
    private func verifySigned(_ token: String, now: Int64, hit: CredentialCache.Entry?) -> Result<VerifiedToken, TokenError>? {
        switch hit {
        case .verified(let verified)?: return .success(verified)
        case .account?: return verifyAccountToken(token, now: now, hit: hit)
        case .unsigned?, nil: break
        }
        if AccountTokens.isAccountToken(token) { return verifyAccountToken(token, now: now, hit: nil) }
        if let serviceAccounts, let result = serviceAccounts.verifyIfOwned(token, now: now) {
            if case .success(let verified) = result { cache.insert(token, .verified(verified), now: now) }
            return result
        }
        // With service accounts but no other verifier, any other token is refused with what
        // their check says (an unknown key, not a JWT), except on a development node, where
        // unverifiable tokens count as signed out, as without any verifier.
        guard let verifier else { return development.allowUnauthenticated ? nil : serviceAccounts?.verify(token, now: now) }
        let result = verifier.verify(token, now: now)
        if case .success(let verified) = result { cache.insert(token, .verified(verified), now: now) }
        return result
    }

    /// Whether `token` is a service account's, verified at `now` (the credential the rules
    /// endpoint accepts beside the operator token).
    func isServiceAccount(_ token: String, now: Int64) -> Bool {
        guard let serviceAccounts else { return false }
        if case .verified(let verified)? = cache.lookup(token, now: now), case .serviceAccount = verified.kind { return true }
        guard case .success(let verified)? = serviceAccounts.verifyIfOwned(token, now: now) else { return false }
        cache.insert(token, .verified(verified), now: now)
        return true
    }

    /// The identity of a REST request or event stream at `now` (milliseconds since the epoch).
    func identity(_ authorization: RESTRequest.Authorization, override: String?, now: Int64) -> ClientIdentity {
        identityAndExpiry(authorization, override: override, now: now).identity
    }

    /// The same, and when a verified token stops being honoured (an event stream ends then).
    func identityAndExpiry(_ authorization: RESTRequest.Authorization, override: String?, now: Int64) -> (identity: ClientIdentity, validUntil: Int64?) {
        var validUntil: Int64?
        let development = development
        var hit: CredentialCache.Entry?
        if case .other(let token) = authorization { hit = cache.lookup(token, now: now) }
        // The closures are passed straight in (not stored first), so they do not escape: no
        // copy of these credentials and no boxes for the locals they touch, on every request.
        let identity = Access.identity(
            authorization, override: override, acceptOwnerToken: development.acceptOwnerToken, developmentTokens: development.allowUnauthenticated,
            unsignedAuth: { token in
                if case .unsigned(let auth)? = hit { return auth }
                guard let auth = Access.unsignedTokenAuth(token) else { return nil }
                cache.insert(token, .unsigned(auth), now: now)
                return auth
            },
            verify: { token in
                guard let result = verifySigned(token, now: now, hit: hit) else {
                    // No verifier: what `Access.identity` does without one.
                    return development.allowUnauthenticated ? .client(.signedOut) : .refused("Unauthorized request.")
                }
                switch result {
                case .success(let verified):
                    validUntil = verified.validUntil
                    return Self.identity(verified)
                case .failure(let error): return .refused(error.reason)
                }
            })
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
        guard let result = verifySigned(token, now: now, hit: cache.lookup(token, now: now)) else {
            let accepted = development.allowUnauthenticated ? "the emulator's owner and unsigned tokens" : "the emulator's owner token"
            if serviceAccounts != nil {
                return .refused(status: "invalid_token", reason: "This server verifies only its service accounts' tokens; it also accepts \(accepted).")
            }
            return .refused(status: "invalid_token", reason: "This server verifies no signed tokens (no auth configuration); it accepts only \(accepted).")
        }
        return signedIn(result)
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

/// The tokens a node has verified, by their exact text (`TokenCache`: at most 4,096 entries and
/// 8 MiB, oldest evicted first, never served past the token's expiry), behind a lock shared by
/// the network threads. Only successful verifications enter it. An account-service token's entry
/// is served only while the key it was verified with is still accepted, unchanged, so a rotation
/// or retirement of the key ends it; the configured verifier's keys and secrets do not change
/// while the node runs. No entry depends on the state of an account (verifying a token never
/// reads it).
final class CredentialCache: Sendable {
    enum Entry: Sendable {
        /// An unsigned emulator token's `auth` (development settings; it has no expiry).
        case unsigned([UInt8])
        /// A token the configured verifier accepted.
        case verified(VerifiedToken)
        /// An account-service ID token, and the key it was verified with.
        case account(VerifiedToken, key: AccountTokens.Key)
    }

    private let state: Mutex<TokenCache<Entry>>

    init(maxEntries: Int = 4096, maxBytes: Int = 8 << 20) {
        state = Mutex(TokenCache(maxEntries: maxEntries, maxBytes: maxBytes))
    }

    var count: Int { state.withLock { $0.count } }

    func lookup(_ token: String, now: Int64) -> Entry? { state.withLock { $0.lookup(token, now: now) } }

    /// Records a verification made at `now`.
    func insert(_ token: String, _ entry: Entry, now: Int64) {
        switch entry {
        case .unsigned(let auth):
            // Not timed: served whatever the clock says, as the token itself is.
            state.withLock { $0.insert(token, entry, valueBytes: auth.count, verifiedAt: .min, validUntil: nil) }
        case .verified(let verified), .account(let verified, _):
            let bytes = (verified.auth?.count ?? 0) + 64
            state.withLock { $0.insert(token, entry, valueBytes: bytes, verifiedAt: now, validUntil: verified.validUntil) }
        }
    }

    func removeAll() { state.withLock { $0.removeAll() } }
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

    /// The service accounts of `auth.service_accounts_file`, read now; nil when it is not set.
    /// An unreadable file, or one with no usable key, is a `ConfigError` naming it; so is a key
    /// id that the ID-token keys use too (a token must have one verifier).
    func loadServiceAccounts(besides verifier: TokenVerifier?) throws(ConfigError) -> ServiceAccounts? {
        guard let file = auth.serviceAccountsFile else { return nil }
        let bytes = try Self.readKeyFile(file, "service_accounts_file")
        var settings = ServiceAccounts.Settings(audiences: auth.serviceAccountAudiences)
        settings.clockSkew = Int64(auth.clockSkewSeconds) * 1000
        let accounts: ServiceAccounts
        do throws(KeyFileError) {
            accounts = try ServiceAccounts(settings: settings, file: bytes)
        } catch {
            throw ConfigError("auth.service_accounts_file \(file): \(error.message)")
        }
        if let shared = verifier?.keyIDs.first(where: { accounts.holds(keyID: $0) }) {
            throw ConfigError("auth.service_accounts_file \(file): kid \(shared) is an ID-token key too (jwks_file or x509_file); a key must be one or the other")
        }
        return accounts
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
