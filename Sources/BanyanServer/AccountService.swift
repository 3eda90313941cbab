import BanyanAuth
import BanyanBasics
import BanyanNode
import BanyanREST
import BanyanReplica
import BanyanStateMachine
import BanyanTree
import Foundation
import Logging
import Metrics
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// An answer in the Identity Toolkit's error shape: `{"error": {"code", "message", "errors"}}`.
/// `message` is the code, optionally followed by ` : ` and a detail (`WEAK_PASSWORD : …`).
struct AccountError: Error, Sendable {
    var status: HTTPResponseStatus
    var message: String

    init(_ message: String, _ status: HTTPResponseStatus = .badRequest) {
        self.status = status
        self.message = message
    }

    init(_ refusal: AccountRefusal) { self.init(refusal.rawValue, refusal == .notAdministrator ? .forbidden : .badRequest) }

    var reply: HTTPReply {
        let code = message.components(separatedBy: " : ").first ?? message
        let body = JSONValue.object([
            ("error", .object([
                ("code", .int(Int64(status.code))), ("message", .string(message)),
                ("errors", .array([.object([("message", .string(code)), ("domain", .string("global")), ("reason", .string("invalid"))])])),
            ]))
        ])
        return .json(status, body.jsonString)
    }

    static let invalidJSON = AccountError("INVALID_ARGUMENT : Invalid JSON payload received.")
    static let permission = AccountError("INSUFFICIENT_PERMISSION : this endpoint needs administrator credentials", .forbidden)
    static let invalidIDToken = AccountError("INVALID_ID_TOKEN")
}

/// The built-in account service (docs/accounts.md): the endpoints the Firebase Auth emulator
/// serves, over accounts kept in the replicated state. Every decision about the accounts
/// (uniqueness, existence, disabled users, key installation) is made by the state machine at the
/// command's position in the log; this type validates input, hashes passwords on its own
/// threads before proposing, and signs tokens.
final class AccountService: Sendable {
    let runtime: NodeRuntime
    let config: NodeConfig
    let credentials: Credentials
    let adminToken: String?
    let logger: Logger
    let hasher: PasswordHasher
    private let pool: NIOThreadPool
    private let pending = Atomic<Int>(0)
    private let resetFile = ResetFileLock()
    /// Reset codes sent per address (`accounts.reset_codes_per_minute`).
    let resetLimiter: RateLimiter
    /// Wrong passwords per account and per client address (`accounts.failed_sign_ins_per_*`).
    let failedSignIns: RateLimiter
    let failedSignInsByClient: RateLimiter
    /// The OpenID Connect providers `accounts:signInWithIdp` accepts, by id
    /// (`auth.oidc_providers`).
    let identityProviders: [String: OIDCProvider]

    /// Bounds on what a request may carry (docs/accounts.md, "Inputs").
    static let maxBodyBytes = 64 << 10
    static let maxEmailBytes = 254
    static let minPasswordCharacters = 6
    static let maxDisplayNameBytes = 256
    static let maxUIDBytes = 128
    static let maxClaimsBytes = 1000
    static let maxPageSize = 1000
    static let maxBatch = 1000
    static let maxLookup = 100
    /// A provider's photo URL longer than this is not recorded.
    static let maxPhotoURLBytes = 2048
    static let tooLarge = AccountError("INVALID_ARGUMENT : the request body exceeds \(maxBodyBytes) bytes", .payloadTooLarge)

    init(
        runtime: NodeRuntime, config: NodeConfig, credentials: Credentials, adminToken: String?, identityProviders: [String: OIDCProvider] = [:],
        logger: Logger
    ) {
        self.identityProviders = identityProviders
        self.runtime = runtime
        self.config = config
        self.credentials = credentials
        self.adminToken = adminToken
        self.logger = logger
        self.hasher = PasswordHasher(logN: config.accounts.scryptLogN, blockSize: 8, parallelism: 1)
        self.pool = NIOThreadPool(numberOfThreads: config.accounts.hashThreads)
        self.resetLimiter = RateLimiter(perMinute: config.accounts.resetCodesPerMinute)
        self.failedSignIns = RateLimiter(perMinute: config.accounts.failedSignInsPerAccount)
        self.failedSignInsByClient = RateLimiter(perMinute: config.accounts.failedSignInsPerClient)
    }

    func start() { pool.start() }
    func shutdown() { try? pool.syncShutdownGracefully() }

    // MARK: - Requests

    /// One request: `path` and `query` split from the target, the `Authorization` header.
    struct Call {
        var project: String
        var administrator: Bool
        var body: JSONValue
        var query: [(String, String)]
        var loop: any EventLoop
        var host: String
        /// The client's IP address (`HTTPServer.clientKey`).
        var client: String
    }

    func handle(
        method: HTTPMethod, uri: String, headers: HTTPHeaders, body: [UInt8], client: String = "?", on loop: any EventLoop
    ) -> EventLoopFuture<HTTPReply> {
        let reply: EventLoopFuture<HTTPReply>
        do throws(AccountError) {
            reply = try route(method: method, uri: uri, headers: headers, body: body, client: client, on: loop)
        } catch {
            return loop.makeSucceededFuture(error.reply)
        }
        return reply.flatMapErrorThrowing { error in
            if let e = error as? AccountError { return e.reply }
            if let e = error as? ReplicaError { return AccountError("UNAVAILABLE : \(e)", .serviceUnavailable).reply }
            return AccountError("INTERNAL_ERROR", .internalServerError).reply
        }
    }

    private func route(
        method: HTTPMethod, uri: String, headers: HTTPHeaders, body: [UInt8], client: String, on loop: any EventLoop
    ) throws(AccountError) -> EventLoopFuture<
        HTTPReply
    > {
        let question = uri.firstIndex(of: "?")
        let path = String(uri[..<(question ?? uri.endIndex)])
        if path == "/oauth2.googleapis.com/token" {
            // OAuth's endpoint answers in OAuth's shape, whatever is wrong (RFC 6749 section 5.2).
            guard method == .POST else {
                var reply = Self.oauthError("invalid_request", "the token endpoint takes POST")
                reply.status = .methodNotAllowed
                reply.headers.append(("Allow", "POST"))
                return loop.makeSucceededFuture(reply)
            }
            guard body.count <= Self.maxBodyBytes else {
                var reply = Self.oauthError("invalid_request", "the body is larger than \(Self.maxBodyBytes) bytes")
                reply.status = .payloadTooLarge
                return loop.makeSucceededFuture(reply)
            }
            return loop.makeSucceededFuture(serviceAccountToken(body: body, contentType: headers.first(name: "Content-Type")))
        }
        guard body.count <= Self.maxBodyBytes else { throw Self.tooLarge }
        let rawQuery = question.map { uri[uri.index(after: $0)...] } ?? ""
        guard let query = try? RESTRequest.parseQuery(rawQuery) else { throw AccountError("INVALID_ARGUMENT : the query string does not parse") }
        let host = headers.first(name: "Host") ?? "localhost"
        if path == "/securetoken.googleapis.com/v1/token" {
            guard method == .POST else { throw AccountError("METHOD_NOT_ALLOWED", .methodNotAllowed) }
            return refresh(body: body, contentType: headers.first(name: "Content-Type"), on: loop)
        }
        let prefix = "/identitytoolkit.googleapis.com/v1/"
        guard path.hasPrefix(prefix) else { throw AccountError("NOT_FOUND : no such endpoint", .notFound) }
        var rest = Substring(path.dropFirst(prefix.count))
        var project = config.accounts.projectID
        if rest.hasPrefix("projects/") {
            rest = rest.dropFirst("projects/".count)
            let end = rest.firstIndex { $0 == "/" || $0 == ":" } ?? rest.endIndex
            project = String(rest[..<end])
            rest = rest[end...]
            guard StateMachine.isValidProject(project) else { throw AccountError("INVALID_PROJECT_ID") }
            if rest.hasPrefix("/") { rest = rest.dropFirst() }
        }
        let operation: String
        if rest == "accounts" {
            operation = "create"
        } else if rest.hasPrefix("accounts:") {
            operation = String(rest.dropFirst("accounts:".count))
        } else if rest == ":rotateSigningKey" {
            operation = "rotateSigningKey"
        } else {
            throw AccountError("NOT_FOUND : no such endpoint", .notFound)
        }
        let parsed: JSONValue
        if body.allSatisfy({ $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 }) {
            parsed = .object([])
        } else {
            guard let value = try? JSONValue(parsing: body, maxDepth: 16), case .object = value else { throw AccountError.invalidJSON }
            parsed = value
        }
        let call = Call(project: project, administrator: isAdministrator(headers), body: parsed, query: query, loop: loop, host: host, client: client)
        // Only the projects this node is configured for, but for an administrator: anyone else
        // naming another project would make the node keep accounts and keys for it.
        guard call.administrator || config.accounts.servedProjects.contains(project) else {
            throw AccountError("INVALID_PROJECT_ID : this server does not serve project \(project)")
        }
        switch (method, operation) {
        case (.GET, "batchGet"): return try list(call)
        case (.POST, "create"): return try signUp(call, administrative: true)
        case (.POST, "signUp"): return try signUp(call, administrative: call.administrator && call.body["idToken"] == nil)
        case (.POST, "signInWithPassword"): return try signInWithPassword(call)
        case (.POST, "signInWithCustomToken"): return try signInWithCustomToken(call)
        case (.POST, "signInWithIdp"): return try signInWithIdp(call)
        case (.POST, "lookup"): return try lookup(call)
        case (.POST, "update"): return try update(call)
        case (.POST, "delete"): return try delete(call)
        case (.POST, "batchDelete"): return try batchDelete(call)
        case (.POST, "sendOobCode"): return try sendOobCode(call)
        case (.POST, "resetPassword"): return try resetPassword(call)
        case (.POST, "rotateSigningKey"): return try rotate(call)
        default: throw AccountError("NOT_FOUND : no such endpoint for \(method)", .notFound)
        }
    }

    /// Administrator credentials: the operator token when one is configured; otherwise what
    /// the data API takes as the administrator (the emulator's `owner` under
    /// `development.accept_owner_token`, a database secret).
    private func isAdministrator(_ headers: HTTPHeaders) -> Bool {
        guard let header = headers.first(name: "Authorization") else { return false }
        let token = header.hasPrefix("Bearer ") ? String(header.dropFirst(7)) : header
        if let adminToken, HTTPConnectionHandler.constantTimeEqual(token, adminToken) { return true }
        let identity = credentials.identity(token == "owner" ? .owner : .other(token), override: nil, now: NodeRuntime.wallClock())
        return identity == .administrator(override: nil)
    }

    // MARK: - Inputs

    private static func string(_ call: Call, _ name: String) throws(AccountError) -> String? {
        switch call.body[name] {
        case nil, .null?: return nil
        case .string(let s)?: return s
        default: throw AccountError("INVALID_ARGUMENT : \(name) must be a string")
        }
    }

    private static func bool(_ call: Call, _ name: String) throws(AccountError) -> Bool? {
        switch call.body[name] {
        case nil, .null?: return nil
        case .bool(let b)?: return b
        default: throw AccountError("INVALID_ARGUMENT : \(name) must be a boolean")
        }
    }

    private static func strings(_ call: Call, _ name: String, max: Int) throws(AccountError) -> [String] {
        switch call.body[name] {
        case nil, .null?: return []
        case .string(let s)?: return [s]
        case .array(let items)?:
            guard items.count <= max else { throw AccountError("INVALID_ARGUMENT : at most \(max) entries in \(name)") }
            var out: [String] = []
            for item in items {
                guard case .string(let s) = item else { throw AccountError("INVALID_ARGUMENT : \(name) must hold strings") }
                out.append(s)
            }
            return out
        default: throw AccountError("INVALID_ARGUMENT : \(name) must be a list of strings")
        }
    }

    /// An email as the service accepts it: at most 254 bytes, one `@` with text on both sides,
    /// no spaces or control characters.
    static func checkEmail(_ email: String) throws(AccountError) {
        let bytes = Array(email.utf8)
        let ats = bytes.indices.filter { bytes[$0] == UInt8(ascii: "@") }
        guard bytes.count <= maxEmailBytes, ats.count == 1, let at = ats.first, at > 0, at < bytes.count - 1,
            bytes.allSatisfy({ $0 > 0x20 && $0 != 0x7F })
        else { throw AccountError("INVALID_EMAIL") }
        // Escaping may triple a byte (`%` is `%25`): the index key must still fit in a path.
        guard AccountStore.emailKey(email).utf8.count <= AccountStore.maxKeyBytes else { throw AccountError("INVALID_EMAIL : too many escaped characters") }
    }

    static func checkPassword(_ password: String) throws(AccountError) {
        guard password.count >= minPasswordCharacters else { throw AccountError("WEAK_PASSWORD : Password should be at least 6 characters") }
        guard password.utf8.count <= PasswordHasher.maxPasswordBytes else {
            throw AccountError("INVALID_PASSWORD : Password must be at most \(PasswordHasher.maxPasswordBytes) bytes")
        }
    }

    static func checkUID(_ uid: String) throws(AccountError) {
        guard !uid.isEmpty, uid.utf8.count <= maxUIDBytes, uid.utf8.allSatisfy({ $0 >= 0x20 && $0 != 0x7F }) else {
            throw AccountError("INVALID_LOCAL_ID : a uid is 1 to 128 printable characters")
        }
    }

    static func checkDisplayName(_ name: String) throws(AccountError) {
        guard name.utf8.count <= maxDisplayNameBytes else { throw AccountError("INVALID_DISPLAY_NAME : at most \(maxDisplayNameBytes) bytes") }
    }

    /// Developer claims: a JSON object of at most 1000 bytes naming no reserved claim.
    static func checkClaims(_ text: String) throws(AccountError) {
        guard text.utf8.count <= maxClaimsBytes else { throw AccountError("CLAIMS_TOO_LARGE") }
        guard let value = try? JSONValue(parsing: text, maxDepth: 16), case .object(let members) = value else {
            throw AccountError("INVALID_CLAIMS")
        }
        for (name, _) in members where AccountTokens.isReservedClaim(name) { throw AccountError("FORBIDDEN_CLAIM : \(name)") }
    }

    // MARK: - Random values (the proposer's; the state machine never draws any)

    static func randomBytes(_ n: Int) -> [UInt8] {
        var g = SystemRandomNumberGenerator()
        return (0..<n).map { _ in UInt8.random(in: 0...255, using: &g) }
    }

    static func newUID() -> String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789".utf8)
        var g = SystemRandomNumberGenerator()
        return String(decoding: (0..<28).map { _ in alphabet[Int.random(in: 0..<alphabet.count, using: &g)] }, as: UTF8.self)
    }

    static func newRefreshKey() -> String { Base64.encodeURL(randomBytes(32)) }

    // MARK: - The log and the state

    /// Proposes `op` for `project`; fails with the refusal the state machine decided.
    func propose(_ op: AccountOp, project: String, on loop: any EventLoop) -> EventLoopFuture<StateMachine.Applied> {
        let promise = loop.makePromise(of: StateMachine.Applied.self)
        runtime.write(namespace: project, command: .account(op), on: loop) { result in
            switch result {
            case .success(let applied):
                if applied.outcome == .ok { return promise.succeed(applied) }
                if let refusal = AccountRefusal(applied.outcome) { return promise.fail(AccountError(refusal)) }
                promise.fail(AccountError("INTERNAL_ERROR : \(applied.outcome)", .internalServerError))
            case .failure(let e): promise.fail(e)
            }
        }
        return promise.futureResult
    }

    /// The record an applied account command left.
    static func record(_ applied: StateMachine.Applied) throws -> AccountRecord {
        guard case .string(let text)? = applied.value?.leaf, let v = try? JSONValue(parsing: text), let r = AccountRecord(json: v) else {
            throw AccountError("INTERNAL_ERROR", .internalServerError)
        }
        return r
    }

    /// The project's accounts after a linearizable read.
    func store(_ project: String, on loop: any EventLoop) -> EventLoopFuture<AccountStore> {
        let promise = loop.makePromise(of: AccountStore.self)
        runtime.read(namespace: StateMachine.accountsNamespace, stale: false, on: loop) { result in
            switch result {
            case .success(let tree): promise.succeed(AccountStore(tree: tree, project: project))
            case .failure(let e): promise.fail(e)
            }
        }
        return promise.futureResult
    }

    /// Runs `work` on a hashing thread (bounded: past `max_pending_hashes`, refused at once).
    private func onHashThread<T: Sendable>(_ loop: any EventLoop, _ work: @escaping @Sendable () throws -> T) -> EventLoopFuture<T> {
        let limit = config.accounts.maxPendingHashes
        guard pending.wrappingAdd(1, ordering: .relaxed).newValue <= limit else {
            pending.wrappingSubtract(1, ordering: .relaxed)
            return loop.makeFailedFuture(AccountError("TOO_MANY_ATTEMPTS_TRY_LATER", .tooManyRequests))
        }
        return pool.runIfActive(eventLoop: loop, work).always { _ in self.pending.wrappingSubtract(1, ordering: .relaxed) }
    }

    func hash(_ password: String, on loop: any EventLoop) -> EventLoopFuture<String> {
        let hasher = self.hasher
        return onHashThread(loop) { try hasher.hash(password, salt: Self.randomBytes(PasswordHasher.saltBytes)) }
    }

    func verify(_ password: String, against stored: String?, on loop: any EventLoop) -> EventLoopFuture<Bool> {
        guard let stored else { return loop.makeSucceededFuture(false) }
        return onHashThread(loop) { PasswordHasher.verify(password, against: stored) }
    }

    /// The key that signs `project`'s tokens now: the replicated one, or, when the project has
    /// none yet, one this node proposes (the first proposal in the log wins everywhere).
    func signingKey(_ project: String, on loop: any EventLoop) -> EventLoopFuture<AccountTokens.Key> {
        if let known = Self.currentKey(runtime.signingKeysInForce.withLock({ $0[project] }), project: project) { return loop.makeSucceededFuture(known) }
        let fresh = SigningKey(id: Self.newKeyID(), secret: Base64.encodeURL(Self.randomBytes(32)))
        return propose(.installKey(fresh, rotate: false, retainMilliseconds: 0), project: project, on: loop).flatMapThrowing { applied in
            guard case .string(let text)? = applied.value?.leaf, let v = try? JSONValue(parsing: text), let k = Self.currentKey(SigningKeys(json: v), project: project) else {
                throw AccountError("INTERNAL_ERROR : no signing key", .internalServerError)
            }
            return k
        }
    }

    static func currentKey(_ keys: SigningKeys?, project: String) -> AccountTokens.Key? {
        guard let current = keys?.current, let secret = Base64.decode(current.secret.utf8) else { return nil }
        return AccountTokens.Key(id: current.id, secret: secret, project: project)
    }

    static func newKeyID() -> String { AccountTokens.keyIDPrefix + randomBytes(8).map { String($0, radix: 16).leftPadded(2) }.joined() }

    /// How long a replaced key stays accepted: an ID token's lifetime and the clock skew.
    var retainReplacedKey: Int64 { AccountTokens.idTokenLifetimeSeconds * 1000 + Int64(config.auth.clockSkewSeconds) * 1000 }

    // MARK: - Tokens and answers

    struct Tokens {
        var idToken: String
        var refreshToken: String
    }

    /// An ID token and a refresh token for `record`. `signInProvider` is how this session
    /// signed in (the account's provider when nil); `extraClaims` are a custom token's claims.
    func tokens(
        for record: AccountRecord, project: String, signInProvider: String? = nil, extraClaims: JSONValue? = nil, on loop: any EventLoop
    ) -> EventLoopFuture<Tokens> {
        signingKey(project, on: loop).map { key in
            // Never before the account's `validSince`, which the leader stamped: a node whose
            // clock is behind would otherwise issue tokens the account already refuses.
            let now = max(NodeRuntime.wallClock() / 1000, record.validSince)
            var claims = record.claims.flatMap { try? JSONValue(parsing: $0) }
            if case .object(let extra)? = extraClaims {
                var merged: [(String, JSONValue)] = []
                if case .object(let stored)? = claims { merged = stored }
                for (name, value) in extra where !merged.contains(where: { $0.0 == name }) { merged.append((name, value)) }
                claims = .object(merged)
            }
            let provider = signInProvider ?? record.provider
            let subject = AccountTokens.Subject(
                uid: record.uid, email: record.profileEmail, emailVerified: record.profileEmailVerified, displayName: record.profileDisplayName,
                provider: provider, claims: claims, authTime: (record.lastSignInAt ?? record.createdAt) / 1000, photoURL: record.federated?.photoURL,
                federated: record.federated.map { AccountTokens.FederatedID(provider: $0.providerID, id: $0.rawID) })
            let refreshKey = Base64.decode(record.refreshKey.utf8) ?? []
            return Tokens(
                idToken: AccountTokens.idToken(subject, key: key, now: now),
                refreshToken: AccountTokens.refreshToken(
                    project: project, uid: record.uid, refreshKey: refreshKey, now: now, signInProvider: provider, claims: extraClaims))
        }
    }

    static func ok(_ members: [(String, JSONValue)]) -> HTTPReply { .json(.ok, JSONValue.object(members).jsonString) }

    /// The Identity Toolkit's user info for a record (what `accounts:lookup` and
    /// `accounts:batchGet` answer, and firebase-admin reads as a `UserRecord`).
    static func userInfo(_ r: AccountRecord) -> JSONValue {
        var m: [(String, JSONValue)] = [("localId", .string(r.uid))]
        if let email = r.profileEmail { m.append(("email", .string(email))) }
        m.append(("emailVerified", .bool(r.profileEmailVerified)))
        if let name = r.profileDisplayName { m.append(("displayName", .string(name))) }
        if let photo = r.federated?.photoURL { m.append(("photoUrl", .string(photo))) }
        var providers: [JSONValue] = []
        if let f = r.federated {
            var p: [(String, JSONValue)] = [("providerId", .string(f.providerID)), ("rawId", .string(f.rawID)), ("federatedId", .string(f.federatedID))]
            if let email = f.email { p.append(("email", .string(email))) }
            if let name = f.displayName { p.append(("displayName", .string(name))) }
            if let photo = f.photoURL { p.append(("photoUrl", .string(photo))) }
            providers.append(.object(p))
        }
        if let email = r.email, r.passwordHash != nil {
            var p: [(String, JSONValue)] = [("providerId", .string("password")), ("email", .string(email)), ("federatedId", .string(email)), ("rawId", .string(email))]
            if let name = r.displayName { p.append(("displayName", .string(name))) }
            providers.append(.object(p))
        }
        m.append(("providerUserInfo", .array(providers)))
        // Never the hash itself: the redacted marker the Identity Toolkit answers without the
        // permission to read hashes.
        if r.passwordHash != nil { m.append(("passwordHash", .string("UkVEQUNURUQ="))) }
        m.append(("validSince", .string(String(r.validSince))))
        m.append(("disabled", .bool(r.disabled)))
        m.append(("createdAt", .string(String(r.createdAt))))
        if let last = r.lastSignInAt { m.append(("lastLoginAt", .string(String(last)))) }
        if let claims = r.claims { m.append(("customAttributes", .string(claims))) }
        return .object(m)
    }

    static func tokenAnswer(_ kind: String, _ record: AccountRecord, _ tokens: Tokens, extra: [(String, JSONValue)] = []) -> HTTPReply {
        var m: [(String, JSONValue)] = [("kind", .string("identitytoolkit#\(kind)")), ("localId", .string(record.uid))]
        if let email = record.profileEmail { m.append(("email", .string(email))) }
        m.append(("displayName", .string(record.profileDisplayName ?? "")))
        m.append(("idToken", .string(tokens.idToken)))
        m.append(("refreshToken", .string(tokens.refreshToken)))
        m.append(("expiresIn", .string(String(AccountTokens.idTokenLifetimeSeconds))))
        return ok(m + extra)
    }

    /// The account an ID token in the body names, checked against the project's keys and the
    /// account's `validSince`.
    private func caller(_ call: Call) throws(AccountError) -> EventLoopFuture<AccountRecord> {
        guard let token = try Self.string(call, "idToken") else { throw AccountError("MISSING_ID_TOKEN") }
        let now = NodeRuntime.wallClock()
        guard case .success(let verified) = credentials.verifyAccountToken(token, now: now), let auth = verified.auth,
            let value = try? JSONValue(parsing: auth), case .string(let uid)? = value["uid"],
            case .string(let aud)? = value["token"]?["aud"], aud == call.project, case .int(let iat)? = value["token"]?["iat"]
        else { throw AccountError.invalidIDToken }
        return store(call.project, on: call.loop).flatMapThrowing { store in
            guard let record = store.user(uid) else { throw AccountError(.userNotFound) }
            guard iat >= record.validSince else { throw AccountError("TOKEN_EXPIRED") }
            if record.disabled { throw AccountError(.userDisabled) }
            return record
        }
    }

    // MARK: - Endpoints

    /// `accounts:signUp` (email and password, or anonymous) and the administrator's
    /// `projects/<p>/accounts` (any fields, no tokens).
    private func signUp(_ call: Call, administrative: Bool) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        if administrative && !call.administrator { throw AccountError.permission }
        if !call.administrator && !config.effectiveAllowSignUp {
            throw AccountError("OPERATION_NOT_ALLOWED : sign-up is disabled (accounts.allow_sign_up)")
        }
        let email = try Self.string(call, "email")
        let password = try Self.string(call, "password")
        let name = try Self.string(call, "displayName")
        if let email { try Self.checkEmail(email) }
        if let password { try Self.checkPassword(password) }
        if let name { try Self.checkDisplayName(name) }
        if try Self.string(call, "phoneNumber") != nil { throw AccountError("INVALID_PHONE_NUMBER : phone numbers are not supported") }
        var uid = Self.newUID()
        var record = AccountRecord(uid: uid, email: email, displayName: name, provider: "password", refreshKey: Self.newRefreshKey())
        if administrative {
            if let given = try Self.string(call, "localId") {
                try Self.checkUID(given)
                uid = given
                record.uid = given
            }
            record.disabled = try Self.bool(call, "disabled") ?? false
            record.emailVerified = try Self.bool(call, "emailVerified") ?? false
            if email == nil && password == nil { record.provider = "custom" }
        } else {
            if email != nil && password == nil { throw AccountError("MISSING_PASSWORD") }
            if email == nil && password != nil { throw AccountError("MISSING_EMAIL") }
            if email == nil { record.provider = "anonymous" }
        }
        let loop = call.loop
        let project = call.project
        let hashed: EventLoopFuture<String?> = password.map { hash($0, on: loop).map { Optional($0) } } ?? loop.makeSucceededFuture(nil)
        let proposed = record
        return hashed.flatMap { hash in
            var record = proposed
            record.passwordHash = hash
            return self.propose(.create(record), project: project, on: loop)
        }.flatMapThrowing { try Self.record($0) }.flatMap { created in
            if administrative {
                var m: [(String, JSONValue)] = [("kind", .string("identitytoolkit#SignupNewUserResponse")), ("localId", .string(created.uid))]
                if let email = created.email { m.append(("email", .string(email))) }
                return loop.makeSucceededFuture(Self.ok(m))
            }
            return self.tokens(for: created, project: project, on: loop).map { Self.tokenAnswer("SignupNewUserResponse", created, $0) }
        }
    }

    /// `accounts:signInWithPassword`: the password checked on a hashing thread, then a
    /// `signIn` command, refused in the log if the account was disabled or its password changed
    /// meanwhile.
    private func signInWithPassword(_ call: Call) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        guard let email = try Self.string(call, "email") else { throw AccountError("MISSING_EMAIL") }
        guard let password = try Self.string(call, "password") else { throw AccountError("MISSING_PASSWORD") }
        try Self.checkEmail(email)
        guard password.utf8.count <= PasswordHasher.maxPasswordBytes else { throw AccountError("INVALID_PASSWORD") }
        let loop = call.loop
        let project = call.project
        // Guessing is limited per account and per client address (on this node; docs/security.md):
        // past either limit a sign-in is refused before any hash is spent, the right password too.
        let accountKey = project + "/" + AccountStore.emailKey(email)
        let clientKey = call.client
        let now = NodeRuntime.wallClock()
        guard !failedSignIns.exhausted(accountKey, now: now), !failedSignInsByClient.exhausted(clientKey, now: now) else {
            throw Self.tooManyFailedSignIns
        }
        return store(project, on: loop).flatMapThrowing { store -> AccountRecord in
            guard let record = store.user(email: email) else { throw AccountError("EMAIL_NOT_FOUND") }
            return record
        }.flatMap { record in
            self.verify(password, against: record.passwordHash, on: loop).flatMapThrowing { ok -> AccountRecord in
                guard ok else {
                    let now = NodeRuntime.wallClock()
                    self.failedSignIns.note(accountKey, now: now)
                    self.failedSignInsByClient.note(clientKey, now: now)
                    throw AccountError("INVALID_PASSWORD")
                }
                return record
            }
        }.flatMap { record in
            self.propose(.signIn(uid: record.uid, passwordHash: record.passwordHash, createIfAbsent: nil), project: project, on: loop)
        }.flatMapThrowing { try Self.record($0) }.flatMap { record in
            self.tokens(for: record, project: project, signInProvider: "password", on: loop).map { Self.tokenAnswer("VerifyPasswordResponse", record, $0, extra: [("registered", .bool(true))]) }
        }
    }

    /// Firebase's answer to an account locked by failed sign-ins.
    static let tooManyFailedSignIns = AccountError(
        "TOO_MANY_ATTEMPTS_TRY_LATER : Access to this account has been temporarily disabled due to many failed login attempts. Try again later.",
        .tooManyRequests)

    /// `accounts:signInWithCustomToken`: a Firebase 2.x custom token signed with a database
    /// secret (`auth.database_secrets_file`), or, while `development.allow_unauthenticated` is
    /// on, the unsigned custom tokens firebase-admin makes for the emulator.
    private func signInWithCustomToken(_ call: Call) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        guard let token = try Self.string(call, "token") else { throw AccountError("MISSING_CUSTOM_TOKEN") }
        let (uid, claims) = try customTokenSubject(token)
        let fresh = AccountRecord(uid: uid, provider: "custom", refreshKey: Self.newRefreshKey())
        let loop = call.loop
        let project = call.project
        return propose(.signIn(uid: uid, passwordHash: nil, createIfAbsent: fresh), project: project, on: loop).flatMapThrowing { try Self.record($0) }
            .flatMap { record in
                self.tokens(for: record, project: project, signInProvider: "custom", extraClaims: claims, on: loop).map {
                    // Made by this command: it holds the fresh random refresh key proposed.
                    Self.tokenAnswer("VerifyCustomTokenResponse", record, $0, extra: [("isNewUser", .bool(record.refreshKey == fresh.refreshKey))])
                }
            }
    }

    /// `accounts:signInWithIdp` with an OpenID Connect ID token the client already holds
    /// (`postBody` `id_token=…&providerId=…`, as the SDKs send `signInWithCredential`): the token
    /// is verified against the configured provider, then the account `<uid prefix>:<sub>` is
    /// signed into, made on first sign-in, its provider profile replaced by the token's (through the log,
    /// so every node agrees). Nothing is proposed for a token that fails any check.
    private func signInWithIdp(_ call: Call) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        guard try Self.string(call, "requestUri") != nil else { throw AccountError("MISSING_REQUEST_URI") }
        guard let postBody = try Self.string(call, "postBody") else {
            let pending = try Self.string(call, "pendingToken")
            let session = try Self.string(call, "sessionId")
            if pending != nil || session != nil {
                throw AccountError("OPERATION_NOT_ALLOWED : only ID tokens the client holds are accepted (no pending token or session flows)")
            }
            throw AccountError("INVALID_IDP_RESPONSE : the request has no postBody")
        }
        if try Self.string(call, "idToken") != nil {
            throw AccountError("OPERATION_NOT_ALLOWED : linking a provider to an existing account is not supported; each provider identity is its own account")
        }
        let returnCredential = try Self.bool(call, "returnIdpCredential") ?? false
        let (provider, identity, token) = try idpIdentity(postBody: postBody)
        // `<prefix>:<sub>`, the sub escaped as account keys are, so the uid is a database key
        // (`users/$uid` rules) whatever characters the provider's ids use.
        let uid = provider.settings.uidPrefix + ":" + AccountStore.escape(identity.subject)
        do throws(AccountError) {
            try Self.checkUID(uid)
        } catch {
            throw AccountError("INVALID_IDP_RESPONSE : the provider's user id makes no valid uid (<prefix>:<sub> must be 1 to 128 printable bytes)")
        }
        let federated = Self.federatedIdentity(identity, federatedID: Self.federatedID(issuer: provider.settings.issuer, subject: identity.subject))
        // Its fresh random refresh key tells whether this sign-in made the account (`isNewUser`).
        let fresh = AccountRecord(uid: uid, provider: identity.provider, refreshKey: Self.newRefreshKey(), federated: federated)
        let loop = call.loop
        let project = call.project
        return propose(.signIn(uid: uid, passwordHash: nil, createIfAbsent: fresh), project: project, on: loop).flatMapThrowing { try Self.record($0) }
            .flatMap { record in
                self.tokens(for: record, project: project, signInProvider: identity.provider, on: loop).map { tokens in
                    var extra: [(String, JSONValue)] = [
                        ("providerId", .string(identity.provider)), ("federatedId", .string(federated.federatedID)),
                        ("rawUserInfo", .string(identity.claims.jsonString)), ("emailVerified", .bool(record.profileEmailVerified)),
                        ("isNewUser", .bool(record.refreshKey == fresh.refreshKey)), ("context", .string("")),
                    ]
                    if let photo = record.federated?.photoURL { extra.append(("photoUrl", .string(photo))) }
                    if let name = federated.displayName { extra.append(("fullName", .string(name))) }
                    if let first = identity.givenName { extra.append(("firstName", .string(first))) }
                    if let last = identity.familyName { extra.append(("lastName", .string(last))) }
                    if returnCredential { extra.append(("oauthIdToken", .string(token))) }
                    return Self.tokenAnswer("VerifyAssertionResponse", record, tokens, extra: extra)
                }
            }
    }

    /// The verified identity of a `signInWithIdp` `postBody`: its `providerId` must be a
    /// configured provider (else `OPERATION_NOT_ALLOWED`), its `id_token` verify against that
    /// provider and answer its `nonce`, if any (else `INVALID_IDP_RESPONSE`).
    func idpIdentity(postBody: String) throws(AccountError) -> (provider: OIDCProvider, identity: OIDCIdentity, token: String) {
        guard let fields = try? RESTRequest.parseQuery(Substring(postBody)) else { throw AccountError("INVALID_IDP_RESPONSE : the postBody does not parse") }
        func field(_ name: String) -> String? { fields.last { $0.0 == name }?.1 }
        guard let providerID = field("providerId") else { throw AccountError("INVALID_IDP_RESPONSE : the postBody names no providerId") }
        guard let provider = identityProviders[providerID] else {
            throw AccountError("OPERATION_NOT_ALLOWED : the identity provider \(providerID.prefix(64)) is not enabled (auth.oidc_providers)")
        }
        guard let token = field("id_token") else {
            throw AccountError(
                "INVALID_IDP_RESPONSE : only OpenID Connect ID tokens (id_token) are accepted; access tokens and authorization codes would need calls to the provider")
        }
        let identity: OIDCIdentity
        switch provider.verify(token, now: NodeRuntime.wallClock()) {
        case .success(let verified): identity = verified
        case .failure(let error): throw AccountError("INVALID_IDP_RESPONSE : \(error.reason)")
        }
        guard identity.answers(nonce: field("nonce")) else { throw AccountError("INVALID_IDP_RESPONSE : the ID token does not carry the request's nonce") }
        return (provider, identity, token)
    }

    /// The provider profile a sign-in records: fields the service could not store are left out
    /// (an email it would refuse, a name or photo URL beyond its bounds), never refused.
    static func federatedIdentity(_ i: OIDCIdentity, federatedID: String) -> FederatedIdentity {
        var email = i.email
        if let e = email, (try? checkEmail(e)) == nil { email = nil }
        let name = i.name.flatMap { $0.utf8.count <= maxDisplayNameBytes ? $0 : nil }
        let photo = i.picture.flatMap { $0.utf8.count <= maxPhotoURLBytes ? $0 : nil }
        return FederatedIdentity(
            providerID: i.provider, rawID: i.subject, federatedID: federatedID, email: email, emailVerified: email != nil && i.emailVerified, displayName: name,
            photoURL: photo)
    }

    /// The answer's `federatedId`: the issuer and the user's id there
    /// (`https://accounts.google.com/<sub>`, as Google's are).
    static func federatedID(issuer: String, subject: String) -> String {
        (issuer.hasSuffix("/") ? String(issuer.dropLast()) : issuer) + "/" + subject
    }

    /// The uid and developer claims of a custom token this node accepts.
    func customTokenSubject(_ token: String) throws(AccountError) -> (uid: String, claims: JSONValue?) {
        let invalid = AccountError("INVALID_CUSTOM_TOKEN")
        guard let jwt = try? JWT.decode(token) else { throw invalid }
        let now = NodeRuntime.wallClock()
        switch jwt.algorithm {
        case "none":
            // firebase-admin's emulator tokens: unsigned, so only a development node takes them.
            guard config.development.allowUnauthenticated, jwt.signature.isEmpty else {
                throw AccountError("INVALID_CUSTOM_TOKEN : unsigned custom tokens are accepted only under development.allow_unauthenticated")
            }
            guard case .string(let uid)? = jwt.claims["uid"] else { throw invalid }
            if case .int(let exp)? = jwt.claims["exp"], exp * 1000 < now - Int64(config.auth.clockSkewSeconds) * 1000 { throw AccountError("TOKEN_EXPIRED") }
            try Self.checkUID(uid)
            let claims = jwt.claims["claims"]
            if let claims, case .object = claims {} else if claims != nil { throw invalid }
            return (uid, claims)
        case "HS256":
            guard let verifier = credentials.verifier, verifier.acceptsSecrets else { throw invalid }
            guard case .success(let verified) = verifier.verify(token, now: now), verified.kind == .customToken,
                let auth = verified.auth.flatMap({ try? JSONValue(parsing: $0) }), case .string(let uid)? = auth["uid"]
            else { throw invalid }
            try Self.checkUID(uid)
            var claims: [(String, JSONValue)] = []
            if case .object(let d)? = jwt.claims["d"] {
                for (name, value) in d where name != "uid" && !AccountTokens.isReservedClaim(name) { claims.append((name, value)) }
            }
            return (uid, claims.isEmpty ? nil : .object(claims))
        default:
            throw invalid
        }
    }

    /// `oauth2.googleapis.com/token`: a service account's JWT-bearer assertion exchanged for an
    /// access token (`ServiceAccountTokenEndpoint`; form-encoded, as Google's libraries send it,
    /// or JSON). Nothing is written; the answer is OAuth's, not the Identity Toolkit's.
    private func serviceAccountToken(body: [UInt8], contentType: String?) -> HTTPReply {
        let fields: [(String, String)]
        switch Self.formFields(body: body, contentType: contentType) {
        case .success(let parsed): fields = parsed
        case .failure(.notAnObject): return Self.oauthError("invalid_request", "the body is not a JSON object")
        case .failure(.badForm): return Self.oauthError("invalid_request", "the form does not parse")
        }
        let answer = ServiceAccountTokenEndpoint.answer(fields: fields, accounts: credentials.serviceAccounts, now: NodeRuntime.wallClock())
        if answer.status != 200 {
            // Counted, and logged at debug only: anyone may ask, so refusals must not be a way
            // to flood the log.
            Self.tokenRefusals.increment()
            logger.debug("refused a service account's token request", metadata: ["reason": "\(answer.body["error_description"]?.jsonString ?? "")"])
        }
        return .json(HTTPResponseStatus(statusCode: answer.status), answer.body.jsonString, extra: [("Cache-Control", "no-store")])
    }

    /// Refused requests at the service accounts' token endpoint.
    static let tokenRefusals = Counter(label: "banyan_service_account_token_refusals_total")

    static func oauthError(_ code: String, _ description: String) -> HTTPReply {
        .json(.badRequest, JSONValue.object([("error", .string(code)), ("error_description", .string(description))]).jsonString)
    }

    /// Why a token endpoint's body gave no fields.
    enum FormProblem: Error {
        /// A JSON body that is not an object.
        case notAnObject
        /// A form-encoded body that does not parse.
        case badForm
    }

    /// The name/value pairs of a token endpoint's body, in order: a JSON object's string members
    /// (others are ignored) when the content type says JSON, else an
    /// `application/x-www-form-urlencoded` form (what Google's libraries send). Both token
    /// endpoints read their bodies this way.
    static func formFields(body: [UInt8], contentType: String?) -> Result<[(String, String)], FormProblem> {
        if contentType?.lowercased().hasPrefix("application/json") == true {
            guard let v = try? JSONValue(parsing: body, maxDepth: 4), case .object(let members) = v else { return .failure(.notAnObject) }
            var fields: [(String, String)] = []
            for case let (name, .string(value)) in members { fields.append((name, value)) }
            return .success(fields)
        }
        guard let parsed = try? RESTRequest.parseQuery(Substring(decoding: body, as: UTF8.self)) else { return .failure(.badForm) }
        return .success(parsed)
    }

    /// `securetoken.googleapis.com/v1/token`: a new ID token for a refresh token (form-encoded
    /// or JSON body). Refresh tokens are sealed with the account's own refresh key, so a
    /// password change or revocation (a new key) ends them; nothing is written.
    private func refresh(body: [UInt8], contentType: String?, on loop: any EventLoop) -> EventLoopFuture<HTTPReply> {
        let fields: [(String, String)]
        switch Self.formFields(body: body, contentType: contentType) {
        case .success(let parsed): fields = parsed
        case .failure(.notAnObject): return loop.makeSucceededFuture(AccountError.invalidJSON.reply)
        case .failure(.badForm): return loop.makeSucceededFuture(AccountError("INVALID_ARGUMENT : the form does not parse").reply)
        }
        func field(_ name: String) -> String? { fields.last { $0.0 == name }?.1 }
        guard field("grant_type") == "refresh_token" else { return loop.makeSucceededFuture(AccountError("INVALID_GRANT_TYPE").reply) }
        guard let token = field("refresh_token") else { return loop.makeSucceededFuture(AccountError("MISSING_REFRESH_TOKEN").reply) }
        let invalid = AccountError("INVALID_REFRESH_TOKEN")
        guard let payload = AccountTokens.unsealedPayload(token), case .string(let project)? = payload["p"], case .string(let uid)? = payload["u"],
            case .int(let issued)? = payload["t"], StateMachine.isValidProject(project)
        else { return loop.makeSucceededFuture(invalid.reply) }
        let provider: String? = if case .string(let p)? = payload["s"] { p } else { nil }
        let claims = payload["c"]
        return store(project, on: loop).flatMapThrowing { store -> AccountRecord in
            guard let record = store.user(uid), let key = Base64.decode(record.refreshKey.utf8), AccountTokens.isSealed(token, with: key) else {
                throw invalid
            }
            guard issued >= record.validSince else { throw AccountError("TOKEN_EXPIRED") }
            if record.disabled { throw AccountError(.userDisabled) }
            return record
        }.flatMap { record in
            self.tokens(for: record, project: project, signInProvider: provider, extraClaims: claims, on: loop).map { t in
                Self.ok([
                    ("access_token", .string(t.idToken)), ("expires_in", .string(String(AccountTokens.idTokenLifetimeSeconds))),
                    ("token_type", .string("Bearer")), ("refresh_token", .string(token)), ("id_token", .string(t.idToken)),
                    ("user_id", .string(record.uid)), ("project_id", .string(project)),
                ])
            }
        }.flatMapErrorThrowing { error in
            if let e = error as? AccountError { return e.reply }
            throw error
        }
    }

    /// `accounts:lookup`: the caller's own account (`idToken`), or, for an administrator, the
    /// accounts named by `localId` and `email` (at most 100 each).
    private func lookup(_ call: Call) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        if call.body["idToken"] != nil {
            return try caller(call).map { Self.ok([("kind", .string("identitytoolkit#GetAccountInfoResponse")), ("users", .array([Self.userInfo($0)]))]) }
        }
        guard call.administrator else { throw AccountError.permission }
        let uids = try Self.strings(call, "localId", max: Self.maxLookup)
        let emails = try Self.strings(call, "email", max: Self.maxLookup)
        if try !Self.strings(call, "phoneNumber", max: Self.maxLookup).isEmpty { throw AccountError("INVALID_PHONE_NUMBER : phone numbers are not supported") }
        return store(call.project, on: call.loop).map { store in
            var found: [AccountRecord] = []
            for uid in uids { if let r = store.user(uid), !found.contains(where: { $0.uid == r.uid }) { found.append(r) } }
            for email in emails { if let r = store.user(email: email), !found.contains(where: { $0.uid == r.uid }) { found.append(r) } }
            var m: [(String, JSONValue)] = [("kind", .string("identitytoolkit#GetAccountInfoResponse"))]
            if !found.isEmpty { m.append(("users", .array(found.map(Self.userInfo)))) }
            return Self.ok(m)
        }
    }

    /// `maxResults`: 20 when absent, else 1 to `maxPageSize`.
    static func pageSize(_ text: String?) throws(AccountError) -> Int {
        guard let text else { return 20 }
        guard let n = Int(text), (1...maxPageSize).contains(n) else { throw AccountError("INVALID_ARGUMENT : maxResults must be from 1 to \(maxPageSize)") }
        return n
    }

    /// `accounts:batchGet` (administrators): a page of accounts in uid order.
    private func list(_ call: Call) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        guard call.administrator else { throw AccountError.permission }
        let limit = try Self.pageSize(call.query.last(where: { $0.0 == "maxResults" })?.1)
        let after = call.query.last(where: { $0.0 == "nextPageToken" })?.1
        if let after { try Self.checkUID(after) }
        return store(call.project, on: call.loop).map { store in
            let page = store.list(after: after, limit: limit)
            var m: [(String, JSONValue)] = [("kind", .string("identitytoolkit#DownloadAccountResponse")), ("users", .array(page.users.map(Self.userInfo)))]
            if let next = page.next { m.append(("nextPageToken", .string(next))) }
            return Self.ok(m)
        }
    }

    /// `accounts:update`: by the account itself (`idToken`: email, password, display name), or
    /// by an administrator (`localId`: also disabled, emailVerified, customAttributes,
    /// validSince). A new password, or a `validSince` of the present, also replaces the refresh
    /// key (earlier refresh tokens end, forged ones too).
    private func update(_ call: Call) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        let byUser = call.body["idToken"] != nil
        if !byUser && !call.administrator { throw AccountError.permission }
        var changes = AccountChanges()
        changes.email = try Self.string(call, "email")
        if let email = changes.email { try Self.checkEmail(email) }
        let password = try Self.string(call, "password")
        if let password { try Self.checkPassword(password) }
        changes.displayName = try Self.string(call, "displayName")
        if let name = changes.displayName { try Self.checkDisplayName(name) }
        let deletions = try Self.strings(call, "deleteAttribute", max: 8)
        changes.removeDisplayName = deletions.contains("DISPLAY_NAME")
        if try Self.string(call, "phoneNumber") != nil { throw AccountError("INVALID_PHONE_NUMBER : phone numbers are not supported") }
        if !byUser {
            changes.disabled = try Self.bool(call, "disableUser")
            changes.emailVerified = try Self.bool(call, "emailVerified")
            if let claims = try Self.string(call, "customAttributes") {
                try Self.checkClaims(claims)
                changes.claims = claims
            }
            switch call.body["validSince"] {
            case nil: break
            case .int(let s)?: changes.validSince = s
            case .string(let s)?:
                guard let n = Int64(s) else { throw AccountError("INVALID_ARGUMENT : validSince") }
                changes.validSince = n
            default: throw AccountError("INVALID_ARGUMENT : validSince")
            }
        }
        let loop = call.loop
        let project = call.project
        let requested = changes
        let credentialsChanged = password != nil || changes.email != nil
        let target: EventLoopFuture<String>
        if byUser {
            target = try caller(call).map(\.uid)
        } else {
            guard let uid = try Self.string(call, "localId") else { throw AccountError("MISSING_LOCAL_ID") }
            try Self.checkUID(uid)
            target = loop.makeSucceededFuture(uid)
        }
        let hashed: EventLoopFuture<String?> = password.map { hash($0, on: loop).map { Optional($0) } } ?? loop.makeSucceededFuture(nil)
        return target.and(hashed).flatMap { uid, hash in
            var changes = requested
            if let hash {
                changes.passwordHash = hash
                changes.refreshKey = Self.newRefreshKey()
            }
            // A `validSince` of the present (within a minute of this node's clock), which is what
            // firebase-admin's `revokeRefreshTokens` sends, also replaces the refresh key: it then
            // ends refresh tokens forged with a leaked key too, whatever issue time they claim
            // (accounts without a password had no other way to a new key). A new key makes the
            // log stamp `validSince` with its own time, so a value further off is kept as given.
            if let since = changes.validSince, abs(since - NodeRuntime.wallClock() / 1000) <= 60 { changes.refreshKey = Self.newRefreshKey() }
            return self.propose(.update(uid: uid, changes), project: project, on: loop)
        }.flatMapThrowing { try Self.record($0) }.flatMap { record in
            var fields: [(String, JSONValue)] = [("kind", .string("identitytoolkit#SetAccountInfoResponse")), ("localId", .string(record.uid))]
            if let email = record.email { fields.append(("email", .string(email))) }
            if let name = record.displayName { fields.append(("displayName", .string(name))) }
            fields.append(("emailVerified", .bool(record.emailVerified)))
            let m = fields
            guard byUser, credentialsChanged else { return loop.makeSucceededFuture(Self.ok(m)) }
            // The account's own change of credentials: fresh tokens (the old refresh token may
            // have ended).
            return self.tokens(for: record, project: project, on: loop).map { t in
                Self.ok(m + [("idToken", .string(t.idToken)), ("refreshToken", .string(t.refreshToken)), ("expiresIn", .string("3600"))])
            }
        }
    }

    /// `accounts:delete`: the caller's own account (`idToken`) or, for an administrator, `localId`.
    private func delete(_ call: Call) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        let loop = call.loop
        let project = call.project
        let target: EventLoopFuture<String>
        if call.body["idToken"] != nil {
            target = try caller(call).map(\.uid)
        } else {
            guard call.administrator else { throw AccountError.permission }
            guard let uid = try Self.string(call, "localId") else { throw AccountError("MISSING_LOCAL_ID") }
            try Self.checkUID(uid)
            target = loop.makeSucceededFuture(uid)
        }
        return target.flatMap { uid in self.propose(.delete(uids: [uid]), project: project, on: loop) }.flatMapThrowing { applied in
            guard case .string(let text)? = applied.value?.leaf, text != "[]" else { throw AccountError(.userNotFound) }
            return Self.ok([("kind", .string("identitytoolkit#DeleteAccountResponse"))])
        }
    }

    /// `accounts:batchDelete` (administrators): up to 1000 uids; those that do not exist count
    /// as deleted, as in Firebase.
    private func batchDelete(_ call: Call) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        guard call.administrator else { throw AccountError.permission }
        let uids = try Self.strings(call, "localIds", max: Self.maxBatch)
        for uid in uids { try Self.checkUID(uid) }
        return propose(.delete(uids: uids), project: call.project, on: call.loop).map { _ in
            Self.ok([("kind", .string("identitytoolkit#BatchDeleteAccountsResponse"))])
        }
    }

    /// `accounts:sendOobCode` with `requestType: PASSWORD_RESET`: the code goes to the
    /// operator's hook (`accounts.reset_code_file`, else the log), since there is no mail. An
    /// administrator asking `returnOobLink` gets the link instead.
    private func sendOobCode(_ call: Call) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        guard try Self.string(call, "requestType") == "PASSWORD_RESET" else {
            throw AccountError("OPERATION_NOT_ALLOWED : only requestType PASSWORD_RESET is supported")
        }
        guard let email = try Self.string(call, "email") else { throw AccountError("MISSING_EMAIL") }
        try Self.checkEmail(email)
        let returnLink = try Self.bool(call, "returnOobLink") ?? false
        if returnLink && !call.administrator { throw AccountError.permission }
        if !returnLink {
            // The log is no place for a credential but on a development node.
            guard config.accounts.resetCodeFile != nil || config.development.allowUnauthenticated else {
                throw AccountError("OPERATION_NOT_ALLOWED : password reset needs accounts.reset_code_file")
            }
            guard resetLimiter.allow(call.project + "/" + AccountStore.emailKey(email), now: NodeRuntime.wallClock()) else {
                throw AccountError("TOO_MANY_ATTEMPTS_TRY_LATER", .tooManyRequests)
            }
        }
        let loop = call.loop
        let project = call.project
        return store(project, on: loop).and(signingKey(project, on: loop)).flatMapThrowing { store, key in
            guard let record = store.user(email: email) else { throw AccountError("EMAIL_NOT_FOUND") }
            let code = AccountTokens.resetCode(project: project, uid: record.uid, passwordHash: record.passwordHash, key: key, now: NodeRuntime.wallClock())
            var m: [(String, JSONValue)] = [("kind", .string("identitytoolkit#GetOobConfirmationCodeResponse")), ("email", .string(record.email ?? email))]
            if returnLink {
                let link = "http://\(call.host)/emulator/action?mode=resetPassword&lang=en&oobCode=\(code)&apiKey=fake-api-key"
                m += [("oobLink", .string(link)), ("oobCode", .string(code))]
                return loop.makeSucceededFuture(Self.ok(m))
            }
            return self.deliverResetCode(project: project, email: record.email ?? email, uid: record.uid, code: code, on: loop).map { Self.ok(m) }
        }.flatMap { $0 }
    }

    /// Hands a reset code to the operator's hook.
    /// Hands a reset code to the operator's hook: the file (appended on a hashing thread, never
    /// the event loop), or, on a development node without one, the log.
    private func deliverResetCode(project: String, email: String, uid: String, code: String, on loop: any EventLoop) -> EventLoopFuture<Void> {
        guard let file = config.accounts.resetCodeFile else {
            logger.notice("password reset code (no mail; set accounts.reset_code_file)", metadata: ["project": "\(project)", "email": "\(email)", "oob_code": "\(code)"])
            return loop.makeSucceededVoidFuture()
        }
        let line = JSONValue.object([
            ("time", .int(NodeRuntime.wallClock())), ("project", .string(project)), ("email", .string(email)), ("uid", .string(uid)),
            ("requestType", .string("PASSWORD_RESET")), ("oobCode", .string(code)),
        ]).jsonString + "\n"
        let logger = self.logger
        let resetFile = self.resetFile
        return pool.runIfActive(eventLoop: loop) {
          resetFile.withLock { _ in
            let fd = open(file, O_WRONLY | O_APPEND | O_CREAT, 0o600)
            guard fd >= 0 else {
                logger.error("cannot open accounts.reset_code_file; the reset code was not delivered", metadata: ["file": "\(file)", "errno": "\(errno)"])
                return
            }
            defer { close(fd) }
            let bytes = Array(line.utf8)
            let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if written != bytes.count { logger.error("short write to accounts.reset_code_file", metadata: ["file": "\(file)"]) }
          }
        }
    }

    /// `accounts:resetPassword`: checks a reset code (`oobCode` alone answers its email) and,
    /// with `newPassword`, sets it, only if the password is still the one the code was issued
    /// under (the state machine decides).
    private func resetPassword(_ call: Call) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        guard let code = try Self.string(call, "oobCode") else { throw AccountError("MISSING_OOB_CODE") }
        let password = try Self.string(call, "newPassword")
        if let password { try Self.checkPassword(password) }
        let invalid = AccountError("INVALID_OOB_CODE")
        let now = NodeRuntime.wallClock()
        guard let payload = AccountTokens.unsealedPayload(code), case .string(let project)? = payload["p"], case .string(let uid)? = payload["u"],
            case .string(let digest)? = payload["h"], case .int(let expiry)? = payload["x"], case .string(let kid)? = payload["k"],
            let key = runtime.signingKeysInForce.withLock({ $0[project] })?.accepted(now: now).first(where: { $0.id == kid }),
            let secret = Base64.decode(key.secret.utf8), AccountTokens.isSealed(code, with: secret)
        else { throw invalid }
        guard expiry > now else { throw AccountError("EXPIRED_OOB_CODE") }
        let loop = call.loop
        return store(project, on: loop).flatMapThrowing { store -> AccountRecord in
            guard let record = store.user(uid), AccountTokens.passwordDigest(record.passwordHash) == digest else { throw invalid }
            if record.disabled { throw AccountError(.userDisabled) }
            return record
        }.flatMap { record in
            let answer = Self.ok([
                ("kind", .string("identitytoolkit#ResetPasswordResponse")), ("email", .string(record.email ?? "")),
                ("requestType", .string("PASSWORD_RESET")),
            ])
            guard let password else { return loop.makeSucceededFuture(answer) }
            return self.hash(password, on: loop).flatMap { hash in
                var changes = AccountChanges()
                changes.passwordHash = hash
                changes.refreshKey = Self.newRefreshKey()
                changes.expectedPasswordHash = record.passwordHash ?? ""
                return self.propose(.update(uid: record.uid, changes), project: project, on: loop)
            }.map { _ in answer }
        }
    }

    /// Banyan's own `projects/<p>:rotateSigningKey` (administrators): a new signing key; the
    /// replaced one stays accepted for an ID token's lifetime and the clock skew, unless the body
    /// says `"retainReplaced": false` (an emergency: the replaced key leaked), which ends it at
    /// the rotation's position in the log, on every node: every ID token it signed is refused
    /// from then on and clients refresh (their refresh tokens do not depend on it).
    private func rotate(_ call: Call) throws(AccountError) -> EventLoopFuture<HTTPReply> {
        guard call.administrator else { throw AccountError.permission }
        let retain = try Self.bool(call, "retainReplaced") ?? true
        let retained = retain ? retainReplacedKey : 0
        let fresh = SigningKey(id: Self.newKeyID(), secret: Base64.encodeURL(Self.randomBytes(32)))
        let project = call.project
        return propose(.installKey(fresh, rotate: true, retainMilliseconds: retained), project: project, on: call.loop).map { _ in
            self.logger.notice(
                retain ? "account signing key rotated" : "account signing key rotated; the replaced key is no longer accepted",
                metadata: ["project": "\(project)", "kid": "\(fresh.id)"])
            return Self.ok([("kid", .string(fresh.id)), ("previousAcceptedForMs", .int(retained))])
        }
    }
}

/// Serializes appends to the reset-code file.
final class ResetFileLock: Sendable {
    private let mutex = Mutex<Void>(())
    func withLock<T>(_ body: (inout Void) -> T) -> T { mutex.withLock { body(&$0) } }
}

/// At most `perMinute` events per key in a minute, over at most `capacity` keys (bounded
/// memory: when full, expired windows are dropped, and if none has expired the event is
/// refused).
final class RateLimiter: Sendable {
    let perMinute: Int
    let capacity: Int
    private let windows = Mutex<[String: (start: Int64, count: Int)]>([:])

    init(perMinute: Int, capacity: Int = 10_000) {
        self.perMinute = perMinute
        self.capacity = capacity
    }

    /// Whether an event for `key` at `now` (milliseconds) is allowed (and counts it if so).
    func allow(_ key: String, now: Int64) -> Bool {
        windows.withLock { windows in Self.count(key, now: now, in: &windows, perMinute: perMinute, capacity: capacity) }
    }

    /// Whether `key` has had its `perMinute` events in the minute under way (nothing counted).
    func exhausted(_ key: String, now: Int64) -> Bool {
        windows.withLock { windows in
            guard let w = windows[key], now - w.start < 60_000 else { return false }
            return w.count >= perMinute
        }
    }

    /// Counts an event for `key` (one past the limit is not counted; when every one of the
    /// `capacity` keys is in a live window, a new key is not counted).
    func note(_ key: String, now: Int64) {
        windows.withLock { windows in _ = Self.count(key, now: now, in: &windows, perMinute: perMinute, capacity: capacity) }
    }

    private static func count(
        _ key: String, now: Int64, in windows: inout [String: (start: Int64, count: Int)], perMinute: Int, capacity: Int
    ) -> Bool {
        if var w = windows[key], now - w.start < 60_000 {
            guard w.count < perMinute else { return false }
            w.count += 1
            windows[key] = w
            return true
        }
        if windows[key] == nil && windows.count >= capacity {
            windows = windows.filter { now - $0.value.start < 60_000 }
            if windows.count >= capacity { return false }
        }
        windows[key] = (now, 1)
        return true
    }

    var count: Int { windows.withLock { $0.count } }
}

extension String {
    fileprivate func leftPadded(_ width: Int) -> String { count >= width ? self : String(repeating: "0", count: width - count) + self }
}
