public import Foundation
#if canImport(FoundationNetworking)
public import FoundationNetworking
#endif

/// An error of the account service (docs/accounts.md), as its endpoints report it: `code` is the
/// Identity Toolkit's code (`EMAIL_EXISTS`, `INVALID_PASSWORD`, `WEAK_PASSWORD`,
/// `USER_NOT_FOUND`, `INVALID_REFRESH_TOKEN`, …, the part before `" : "`), `message` the whole
/// text, `status` the HTTP status. Errors found on this side use codes of the same style:
/// `NETWORK_REQUEST_FAILED` (no node answered), `INVALID_RESPONSE` (an answer that could not be
/// read), `NO_CURRENT_USER` (the call needs a signed-in user), `INVALID_URL`.
public struct AuthError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    public let code: String
    public let message: String
    public let status: Int?

    public init(code: String, message: String = "", status: Int? = nil) {
        self.code = code
        self.message = message.isEmpty ? code : message
        self.status = status
    }

    public var description: String { message == code ? code : "\(code): \(message)" }
    public var errorDescription: String? { description }

    static let noUser = AuthError(code: "NO_CURRENT_USER", message: "NO_CURRENT_USER : no user is signed in")

    /// Codes after which a refresh token can never work again: the session is over.
    var endsSession: Bool {
        ["INVALID_REFRESH_TOKEN", "USER_NOT_FOUND", "USER_DISABLED", "TOKEN_EXPIRED", "INVALID_ID_TOKEN", "MISSING_REFRESH_TOKEN"].contains(code)
    }
}

/// A signed-in user (Firebase's `User`), as of its latest ID token. Its calls act through the
/// `Auth` it came from; a user the `Auth` no longer holds fails them with `NO_CURRENT_USER`.
public final class User: Sendable, CustomStringConvertible {
    public let uid: String
    public let email: String?
    /// How the user signed in: `password`, `anonymous` or `custom`.
    public let providerID: String
    public var isAnonymous: Bool { providerID == "anonymous" }
    weak let auth: Auth?

    init(uid: String, email: String?, providerID: String, auth: Auth) {
        self.uid = uid
        self.email = email
        self.providerID = providerID
        self.auth = auth
    }

    public var description: String { "User(\(uid), \(email ?? "no email"), \(providerID))" }

    private static func noAuth(_ completion: (@Sendable (AuthError?) -> Void)?) {
        guard let completion else { return }
        DispatchQueue.global().async { completion(.noUser) }
    }

    /// The current ID token (refreshed first when it is about to expire, or when `forcingRefresh`).
    public func getIDTokenForcingRefresh(_ forcingRefresh: Bool, completion: @escaping @Sendable (String?, AuthError?) -> Void) {
        guard let auth else { return DispatchQueue.global().async { completion(nil, .noUser) } }
        auth.idToken(of: uid, forcingRefresh: forcingRefresh, completion: completion)
    }

    public func getIDToken(completion: @escaping @Sendable (String?, AuthError?) -> Void) { getIDTokenForcingRefresh(false, completion: completion) }

    public func getIDToken(forcingRefresh: Bool = false) async throws(AuthError) -> String {
        try await Auth.awaiting { done in getIDTokenForcingRefresh(forcingRefresh) { t, e in done(t.map { .success($0) } ?? .failure(e ?? .noUser)) } }
    }

    /// Sets a new password (the account's other sessions end: their refresh tokens stop working).
    public func updatePassword(to password: String, completion: (@Sendable (AuthError?) -> Void)? = nil) {
        guard let auth else { return Self.noAuth(completion) }
        auth.updateAccount(of: uid, ["password": password], completion: completion)
    }

    public func updatePassword(to password: String) async throws(AuthError) {
        try await Auth.awaiting { done in updatePassword(to: password) { e in done(e.map { .failure($0) } ?? .success(())) } }
    }

    /// Changes the account's email (the new one is unverified).
    public func updateEmail(to email: String, completion: (@Sendable (AuthError?) -> Void)? = nil) {
        guard let auth else { return Self.noAuth(completion) }
        auth.updateAccount(of: uid, ["email": email], completion: completion)
    }

    public func updateEmail(to email: String) async throws(AuthError) {
        try await Auth.awaiting { done in updateEmail(to: email) { e in done(e.map { .failure($0) } ?? .success(())) } }
    }

    /// Deletes the account and signs it out.
    public func delete(completion: (@Sendable (AuthError?) -> Void)? = nil) {
        guard let auth else { return Self.noAuth(completion) }
        auth.deleteAccount(of: uid, completion: completion)
    }

    public func delete() async throws(AuthError) {
        try await Auth.awaiting { done in delete { e in done(e.map { .failure($0) } ?? .success(())) } }
    }
}

/// A handle that removes an auth-state or ID-token listener.
public typealias AuthStateDidChangeListenerHandle = UInt

/// The client of a Banyan node's account service (docs/accounts.md; Firebase's `Auth`): sign-up
/// and sign-in with email and password, anonymously or with a custom token, password and email
/// changes, password reset, deletion, sign-out, auth-state listeners, and ID tokens refreshed
/// through the secure-token endpoint `tokenRefreshMargin` before they expire.
///
/// Databases attached to it (`attach(_:)`, or `Auth.auth(database:)`) follow it: each sign-in,
/// refresh and sign-out sets the database's credential (`setAuthToken`), and when a database's
/// server refuses or revokes the credential, the `Auth` refreshes the token and gives it again
/// (at most three times in a row before a new sign-in or a scheduled refresh). Attaching takes
/// the database's `onAuthRevoked` block.
///
/// Requests go over HTTP(S) with `URLSession` to the nodes' client ports, trying the next node
/// when one cannot be reached. `https` uses the session's trust (the system's roots unless a
/// `URLSession` with a delegate of the app's is given). Completion blocks and listeners run on
/// `callbackQueue`, after the attached databases have been given the new credential.
public final class Auth: @unchecked Sendable {
    /// The nodes' client addresses (`scheme://host:port`), in the order requests try them.
    public let endpoints: [String]
    /// The project of the endpoints (`projects/<id>/accounts:…`); nil: the node's own
    /// (`accounts.project_id`).
    public let projectID: String?
    /// Sent as `key=` (the service ignores it; Firebase's SDKs send their API key).
    public let apiKey: String
    public let callbackQueue: DispatchQueue

    private let session: URLSession
    private let timers = DispatchQueue(label: "banyan.auth.timers")
    private let lock = NSLock()
    // Guarded by `lock`:
    private var state: SignedIn?
    private var sessionNumber: UInt64 = 0
    private var refreshing: [UInt64: [@Sendable (Result<String, AuthError>) -> Void]] = [:]
    private var timerGeneration: UInt64 = 0
    private var revokeRefreshes = 0
    private var margin: TimeInterval
    private var preferredNode = 0
    private var databases: [WeakDatabase] = []
    private var stateListeners: [UInt: @Sendable (Auth, User?) -> Void] = [:]
    private var tokenListeners: [UInt: @Sendable (Auth, User?) -> Void] = [:]
    private var nextHandle: UInt = 1

    struct SignedIn {
        var user: User
        var idToken: String
        var refreshToken: String
        var expiresAt: Date
        let number: UInt64
    }

    final class WeakDatabase {
        weak var database: Database?
        init(_ database: Database) { self.database = database }
    }

    /// `url`: a node's address (`http://host:port`, as the database's URL; a path or query is
    /// ignored); `nodes`: further nodes (`host:port`) to try. `tokenRefreshMargin`: how long
    /// before an ID token expires it is refreshed (Firebase: 5 minutes).
    public convenience init(
        url: String, nodes: [String] = [], projectID: String? = nil, apiKey: String = "banyan", callbackQueue: DispatchQueue? = nil,
        session: URLSession? = nil, tokenRefreshMargin: TimeInterval = 300
    ) throws(AuthError) {
        guard let c = URLComponents(string: url), let scheme = c.scheme?.lowercased(), scheme == "http" || scheme == "https", let host = c.host, !host.isEmpty else {
            throw AuthError(code: "INVALID_URL", message: "INVALID_URL : expected http(s)://host:port, got \(url)")
        }
        let port = c.port ?? (scheme == "https" ? 443 : 80)
        var list = ["\(scheme)://\(Self.bracketed(host)):\(port)"]
        for n in nodes {
            guard let colon = n.lastIndex(of: ":"), colon > n.startIndex, let p = Int(n[n.index(after: colon)...]), p > 0, p < 65536 else {
                throw AuthError(code: "INVALID_URL", message: "INVALID_URL : a node is host:port, got \(n)")
            }
            let entry = "\(scheme)://\(Self.bracketed(String(n[..<colon]))):\(p)"
            if !list.contains(entry) { list.append(entry) }
        }
        self.init(
            endpoints: list, projectID: projectID, apiKey: apiKey, callbackQueue: callbackQueue ?? DispatchQueue(label: "banyan.auth.callbacks"),
            session: session, tokenRefreshMargin: tokenRefreshMargin)
    }

    /// An `Auth` for the nodes of `database`, attached to it, with its callback queue.
    public convenience init(
        database: Database, projectID: String? = nil, apiKey: String = "banyan", session: URLSession? = nil, tokenRefreshMargin: TimeInterval = 300
    ) {
        self.init(
            endpoints: database.nodes.map { "\(database.scheme)://\(Self.bracketed($0.host)):\($0.port)" }, projectID: projectID, apiKey: apiKey,
            callbackQueue: database.callbackQueue, session: session, tokenRefreshMargin: tokenRefreshMargin)
        attach(database)
    }

    private init(endpoints: [String], projectID: String?, apiKey: String, callbackQueue: DispatchQueue, session: URLSession?, tokenRefreshMargin: TimeInterval) {
        self.endpoints = endpoints
        self.projectID = projectID
        self.apiKey = apiKey
        self.callbackQueue = callbackQueue
        self.session = session ?? URLSession(configuration: .ephemeral)
        margin = max(0, tokenRefreshMargin)
    }

    private static func bracketed(_ host: String) -> String { host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host }

    private static let shared = SharedAuths()

    /// The `Auth` of `database` (one per database, attached to it), as `Auth.auth(app:)` is one
    /// per app.
    public static func auth(database: Database) -> Auth { shared.auth(database) }

    /// How long before an ID token expires it is refreshed; setting it reschedules the refresh.
    public var tokenRefreshMargin: TimeInterval {
        get { lock.withLock { margin } }
        set {
            let s: SignedIn? = lock.withLock {
                margin = max(0, newValue)
                return state
            }
            if let s { schedule(s) }
        }
    }

    /// The signed-in user, or nil.
    public var currentUser: User? { lock.withLock { state?.user } }

    // MARK: - Databases

    /// Makes `database` follow this `Auth`: it gets the current ID token now (when a user is
    /// signed in) and each new one, loses it on sign-out, and has it refreshed when its server
    /// refuses it.
    public func attach(_ database: Database) {
        let token: String? = lock.withLock {
            databases.removeAll { $0.database == nil || $0.database === database }
            databases.append(WeakDatabase(database))
            return state?.idToken
        }
        database.onAuthRevoked { [weak self, weak database] _ in
            guard let self, let database else { return }
            self.revoked(database)
        }
        if let token { database.setAuthToken(token) }
    }

    private var attached: [Database] { databases.compactMap(\.database) }

    private func revoked(_ database: Database) {
        let go: Bool = lock.withLock {
            guard state != nil, revokeRefreshes < 3 else { return false }
            revokeRefreshes += 1
            return true
        }
        guard go else { return }
        refresh { result in
            if case .success(let token) = result { database.setAuthToken(token) }
        }
    }

    // MARK: - Listeners

    /// Calls `listener` now with the current user and whenever a user signs in or out.
    @discardableResult
    public func addStateDidChangeListener(_ listener: @escaping @Sendable (Auth, User?) -> Void) -> AuthStateDidChangeListenerHandle {
        let (handle, user): (UInt, User?) = lock.withLock {
            let h = nextHandle
            nextHandle += 1
            stateListeners[h] = listener
            return (h, state?.user)
        }
        callbackQueue.async { listener(self, user) }
        return handle
    }

    public func removeStateDidChangeListener(_ handle: AuthStateDidChangeListenerHandle) { lock.withLock { stateListeners[handle] = nil } }

    /// Calls `listener` now and whenever the ID token changes (sign-in, refresh, sign-out).
    @discardableResult
    public func addIDTokenDidChangeListener(_ listener: @escaping @Sendable (Auth, User?) -> Void) -> AuthStateDidChangeListenerHandle {
        let (handle, user): (UInt, User?) = lock.withLock {
            let h = nextHandle
            nextHandle += 1
            tokenListeners[h] = listener
            return (h, state?.user)
        }
        callbackQueue.async { listener(self, user) }
        return handle
    }

    public func removeIDTokenDidChangeListener(_ handle: AuthStateDidChangeListenerHandle) { lock.withLock { tokenListeners[handle] = nil } }

    // MARK: - Signing in and out

    /// Creates an account with an email and password and signs it in (`accounts:signUp`).
    public func createUser(withEmail email: String, password: String, completion: (@Sendable (User?, AuthError?) -> Void)? = nil) {
        signingIn(completion) { done in self.call("signUp", ["email": email, "password": password, "returnSecureToken": true], TokenAnswer.self, done) }
    }

    public func createUser(withEmail email: String, password: String) async throws(AuthError) -> User {
        try await Self.awaiting { done in createUser(withEmail: email, password: password) { u, e in done(u.map { .success($0) } ?? .failure(e ?? .noUser)) } }
    }

    /// Signs in with an email and password (`accounts:signInWithPassword`).
    public func signIn(withEmail email: String, password: String, completion: (@Sendable (User?, AuthError?) -> Void)? = nil) {
        signingIn(completion) { done in
            self.call("signInWithPassword", ["email": email, "password": password, "returnSecureToken": true], TokenAnswer.self, done)
        }
    }

    public func signIn(withEmail email: String, password: String) async throws(AuthError) -> User {
        try await Self.awaiting { done in signIn(withEmail: email, password: password) { u, e in done(u.map { .success($0) } ?? .failure(e ?? .noUser)) } }
    }

    /// Signs in as a new anonymous account (`accounts:signUp` without an email).
    public func signInAnonymously(completion: (@Sendable (User?, AuthError?) -> Void)? = nil) {
        signingIn(completion) { done in self.call("signUp", ["returnSecureToken": true], TokenAnswer.self, done) }
    }

    public func signInAnonymously() async throws(AuthError) -> User {
        try await Self.awaiting { done in signInAnonymously { u, e in done(u.map { .success($0) } ?? .failure(e ?? .noUser)) } }
    }

    /// Signs in with a custom token (`accounts:signInWithCustomToken`: a Firebase 2.x token
    /// signed with a database secret; the account is made on first use).
    public func signIn(withCustomToken token: String, completion: (@Sendable (User?, AuthError?) -> Void)? = nil) {
        signingIn(completion) { done in self.call("signInWithCustomToken", ["token": token, "returnSecureToken": true], TokenAnswer.self, done) }
    }

    public func signIn(withCustomToken token: String) async throws(AuthError) -> User {
        try await Self.awaiting { done in signIn(withCustomToken: token) { u, e in done(u.map { .success($0) } ?? .failure(e ?? .noUser)) } }
    }

    /// Signs in with an identity provider's credential (`accounts:signInWithIdp`): an OpenID
    /// Connect ID token the app got from the provider's own sign-in (for Google, Google Sign-In's
    /// `idToken`), checked by the node against the provider's keys (`auth.oidc_providers`). The
    /// account (uid `<prefix>:<the provider's user id>`) is made on first sign-in.
    public func signIn(with credential: AuthCredential, completion: (@Sendable (User?, AuthError?) -> Void)? = nil) {
        signingIn(completion) { done in
            var form = "id_token=" + Self.formEncoded(credential.idToken) + "&providerId=" + Self.formEncoded(credential.provider)
            if let nonce = credential.rawNonce { form += "&nonce=" + Self.formEncoded(nonce) }
            // `requestUri` is required by the toolkit's API; with an ID token it names nothing.
            self.call("signInWithIdp", ["postBody": form, "requestUri": "http://localhost", "returnSecureToken": true], TokenAnswer.self, done)
        }
    }

    public func signIn(with credential: AuthCredential) async throws(AuthError) -> User {
        try await Self.awaiting { done in signIn(with: credential) { u, e in done(u.map { .success($0) } ?? .failure(e ?? .noUser)) } }
    }

    static func formEncoded(_ text: String) -> String { text.addingPercentEncoding(withAllowedCharacters: formValue) ?? "" }

    /// Signs the user out: the attached databases drop the credential (`unauth`), listeners are
    /// told. Nothing is sent to the account service (its tokens end on their own).
    public func signOut() {
        let (had, dbs): (Bool, [Database]) = lock.withLock {
            let had = state != nil
            state = nil
            sessionNumber += 1
            timerGeneration += 1
            revokeRefreshes = 0
            return (had, attached)
        }
        guard had else { return }
        for db in dbs { db.setAuthToken(nil) }
        notify(user: nil, userChanged: true)
    }

    // MARK: - Password reset

    /// Sends a password-reset code for `email` (to the node's reset-code hook: docs/accounts.md).
    public func sendPasswordReset(withEmail email: String, completion: (@Sendable (AuthError?) -> Void)? = nil) {
        call("sendOobCode", ["requestType": "PASSWORD_RESET", "email": email], EmailAnswer.self) { result in
            self.finish(completion, result.map { _ in () })
        }
    }

    public func sendPasswordReset(withEmail email: String) async throws(AuthError) {
        try await Self.awaiting { done in sendPasswordReset(withEmail: email) { e in done(e.map { .failure($0) } ?? .success(())) } }
    }

    /// The email a reset code is for (the code stays usable).
    public func verifyPasswordResetCode(_ code: String, completion: @escaping @Sendable (String?, AuthError?) -> Void) {
        call("resetPassword", ["oobCode": code], EmailAnswer.self) { result in
            let r = result.flatMap { $0.email.map { .success($0) } ?? .failure(AuthError(code: "INVALID_RESPONSE", message: "INVALID_RESPONSE : no email")) }
            self.callbackQueue.async {
                switch r {
                case .success(let email): completion(email, nil)
                case .failure(let e): completion(nil, e)
                }
            }
        }
    }

    public func verifyPasswordResetCode(_ code: String) async throws(AuthError) -> String {
        try await Self.awaiting { done in verifyPasswordResetCode(code) { email, e in done(email.map { .success($0) } ?? .failure(e ?? .noUser)) } }
    }

    /// Sets a new password with a reset code (the code then stops working).
    public func confirmPasswordReset(withCode code: String, newPassword: String, completion: (@Sendable (AuthError?) -> Void)? = nil) {
        call("resetPassword", ["oobCode": code, "newPassword": newPassword], EmailAnswer.self) { result in
            self.finish(completion, result.map { _ in () })
        }
    }

    public func confirmPasswordReset(withCode code: String, newPassword: String) async throws(AuthError) {
        try await Self.awaiting { done in confirmPasswordReset(withCode: code, newPassword: newPassword) { e in done(e.map { .failure($0) } ?? .success(())) } }
    }

    // MARK: - The current user's account

    /// `accounts:update` with the user's ID token; the fresh tokens it answers are taken.
    func updateAccount(of uid: String, _ fields: [String: String], completion: (@Sendable (AuthError?) -> Void)?) {
        idToken(of: uid, forcingRefresh: false) { token, error in
            guard let token else { return self.finish(completion, .failure(error ?? .noUser)) }
            var body: [String: Any] = ["idToken": token, "returnSecureToken": true]
            for (k, v) in fields { body[k] = v }
            self.call("update", body, TokenAnswer.self) { result in
                switch result {
                case .failure(let e): self.finish(completion, .failure(e))
                case .success(let answer):
                    if answer.idToken != nil {
                        // The same session goes on with the new tokens (a password change ended
                        // the refresh token it had).
                        _ = self.adopt(answer, uid: uid)
                    }
                    self.finish(completion, .success(()))
                }
            }
        }
    }

    /// `accounts:delete` with the user's ID token, then signs out.
    func deleteAccount(of uid: String, completion: (@Sendable (AuthError?) -> Void)?) {
        idToken(of: uid, forcingRefresh: false) { token, error in
            guard let token else { return self.finish(completion, .failure(error ?? .noUser)) }
            self.call("delete", ["idToken": token], EmailAnswer.self) { result in
                if case .success = result, self.currentUser?.uid == uid { self.signOut() }
                self.finish(completion, result.map { _ in () })
            }
        }
    }

    /// The ID token of the signed-in user `uid` (refreshed when close to expiry or forced).
    /// `completion` runs on the callback queue.
    func idToken(of uid: String, forcingRefresh: Bool, completion: @escaping @Sendable (String?, AuthError?) -> Void) {
        let current: SignedIn? = lock.withLock { state }
        guard let current, current.user.uid == uid else { return callbackQueue.async { completion(nil, .noUser) } }
        let fresh = current.expiresAt.timeIntervalSinceNow > lock.withLock { margin }
        if fresh && !forcingRefresh { return callbackQueue.async { completion(current.idToken, nil) } }
        refresh { result in
            self.callbackQueue.async {
                switch result {
                case .success(let t): completion(t, nil)
                case .failure(let e): completion(nil, e)
                }
            }
        }
    }

    // MARK: - Sessions and refresh

    /// Runs a sign-in request and takes its tokens as a new session.
    private func signingIn(
        _ completion: (@Sendable (User?, AuthError?) -> Void)?, _ request: (@escaping @Sendable (Result<TokenAnswer, AuthError>) -> Void) -> Void
    ) {
        request { result in
            let r: Result<User, AuthError> = result.flatMap { self.adopt($0, uid: nil) }
            guard let completion else { return }
            self.callbackQueue.async {
                switch r {
                case .success(let u): completion(u, nil)
                case .failure(let e): completion(nil, e)
                }
            }
        }
    }

    /// Takes an answer's tokens: as a new session (`uid` nil), or as the next tokens of the
    /// session of `uid` (ignored when that user is no longer signed in).
    func adopt(_ answer: TokenAnswer, uid: String?) -> Result<User, AuthError> {
        guard let idToken = answer.idToken, let refreshToken = answer.refreshToken else {
            return .failure(AuthError(code: "INVALID_RESPONSE", message: "INVALID_RESPONSE : the answer has no tokens"))
        }
        let user: User
        switch self.user(fromIDToken: idToken) {
        case .success(let u): user = u
        case .failure(let e): return .failure(e)
        }
        let lifetime = answer.expiresIn.flatMap { TimeInterval($0) } ?? 3600
        let outcome: (SignedIn, Bool, [Database])? = lock.withLock {
            let changed: Bool
            let number: UInt64
            if let uid {
                guard let s = state, s.user.uid == uid else { return nil }
                number = s.number
                changed = false
            } else {
                changed = state?.user.uid != user.uid
                sessionNumber += 1
                number = sessionNumber
                revokeRefreshes = 0
            }
            let s = SignedIn(user: user, idToken: idToken, refreshToken: refreshToken, expiresAt: Date().addingTimeInterval(lifetime), number: number)
            state = s
            return (s, changed, attached)
        }
        guard let (s, changed, dbs) = outcome else { return .failure(.noUser) }
        for db in dbs { db.setAuthToken(idToken) }
        schedule(s)
        notify(user: user, userChanged: changed)
        return .success(user)
    }

    /// Refreshes the ID token through the secure-token endpoint (one request at a time per
    /// session); the new token goes to the attached databases. A refresh token that can never
    /// work again (the account was deleted or disabled, or its password changed) signs out.
    func refresh(_ completion: @escaping @Sendable (Result<String, AuthError>) -> Void) {
        enum Start { case noUser, joined, start(SignedIn) }
        let begin: Start = lock.withLock {
            guard let s = state else { return .noUser }
            if refreshing[s.number] != nil {
                refreshing[s.number]?.append(completion)
                return .joined
            }
            refreshing[s.number] = [completion]
            return .start(s)
        }
        let start: SignedIn
        switch begin {
        case .noUser: return completion(.failure(.noUser))
        case .joined: return
        case .start(let s): start = s
        }
        let form = "grant_type=refresh_token&refresh_token=" + (start.refreshToken.addingPercentEncoding(withAllowedCharacters: Self.formValue) ?? "")
        send(.secureToken, body: Data(form.utf8), form: true) { (result: Result<SecureTokenAnswer, AuthError>) in
            let waiters: [@Sendable (Result<String, AuthError>) -> Void] = self.lock.withLock { self.refreshing.removeValue(forKey: start.number) ?? [] }
            let outcome: Result<String, AuthError>
            switch result {
            case .success(let answer):
                let adopted = self.adopt(TokenAnswer(idToken: answer.idToken, refreshToken: answer.refreshToken, expiresIn: answer.expiresIn), uid: start.user.uid)
                outcome = adopted.map { _ in answer.idToken }
            case .failure(let e):
                if e.endsSession, self.lock.withLock({ self.state?.number == start.number }) { self.signOut() }
                outcome = .failure(e)
            }
            for w in waiters { w(outcome) }
        }
    }

    private static let formValue: CharacterSet = {
        var s = CharacterSet.alphanumerics
        s.insert(charactersIn: "-._~")
        return s
    }()

    /// Schedules the refresh of `s`'s token `tokenRefreshMargin` before it expires (at least a
    /// second from now); a later schedule replaces it.
    private func schedule(_ s: SignedIn, retryIn: TimeInterval? = nil) {
        let (generation, delay): (UInt64, TimeInterval) = lock.withLock {
            timerGeneration += 1
            return (timerGeneration, retryIn ?? max(1, s.expiresAt.timeIntervalSinceNow - margin))
        }
        timers.asyncAfter(deadline: .now() + delay) { [weak self] in self?.scheduledRefresh(generation, s.number) }
    }

    private func scheduledRefresh(_ generation: UInt64, _ number: UInt64) {
        let s: SignedIn? = lock.withLock {
            guard timerGeneration == generation, let s = state, s.number == number else { return nil }
            revokeRefreshes = 0
            return s
        }
        guard let s else { return }
        refresh { [weak self] result in
            // Unreachable nodes: try again in 30 s (the refresh that succeeds reschedules).
            if case .failure(let e) = result, !e.endsSession, let self, self.lock.withLock({ self.state?.number == s.number }) {
                self.schedule(s, retryIn: 30)
            }
        }
    }

    private func notify(user: User?, userChanged: Bool) {
        let (states, tokens): ([@Sendable (Auth, User?) -> Void], [@Sendable (Auth, User?) -> Void]) = lock.withLock {
            (userChanged ? stateListeners.sorted { $0.key < $1.key }.map(\.value) : [], tokenListeners.sorted { $0.key < $1.key }.map(\.value))
        }
        callbackQueue.async {
            for l in states { l(self, user) }
            for l in tokens { l(self, user) }
        }
    }

    /// The user an ID token names (its claims: `user_id`, `email`,
    /// `firebase.sign_in_provider`). The signature is the server's business: the client only
    /// reads it, as Firebase's SDKs do.
    func user(fromIDToken token: String) -> Result<User, AuthError> {
        guard let claims = Self.claims(of: token), let uid = (claims["user_id"] as? String) ?? (claims["sub"] as? String) else {
            return .failure(AuthError(code: "INVALID_RESPONSE", message: "INVALID_RESPONSE : the ID token could not be read"))
        }
        let provider = ((claims["firebase"] as? [String: Any])?["sign_in_provider"] as? String) ?? "custom"
        return .success(User(uid: uid, email: claims["email"] as? String, providerID: provider, auth: self))
    }

    /// The claims of a JWT (its payload, base64url JSON), or nil.
    static func claims(of token: String) -> [String: Any]? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        var text = parts[1].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while text.count % 4 != 0 { text += "=" }
        guard let data = Data(base64Encoded: text) else { return nil }
        return (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
    }

    /// The signed-in session's tokens (for the Firebase 2.x `authData`).
    var signedIn: SignedIn? { lock.withLock { state } }

    // MARK: - Requests

    enum Endpoint {
        case toolkit(String)
        case secureToken
    }

    struct TokenAnswer: Decodable, Sendable {
        var idToken: String?
        var refreshToken: String?
        var expiresIn: String?
        var localId: String?
    }

    struct SecureTokenAnswer: Decodable, Sendable {
        let idToken: String
        let refreshToken: String
        let expiresIn: String?
        enum CodingKeys: String, CodingKey {
            case idToken = "id_token", refreshToken = "refresh_token", expiresIn = "expires_in"
        }
    }

    struct EmailAnswer: Decodable, Sendable {
        let email: String?
    }

    struct LocalIDAnswer: Decodable, Sendable {
        let localId: String?
    }

    struct ErrorAnswer: Decodable {
        struct Body: Decodable {
            let code: Int?
            let message: String?
        }
        let error: Body?
    }

    /// `accounts:<operation>` with a JSON body; `completion` runs on any thread.
    func call<T: Decodable & Sendable>(_ operation: String, _ body: [String: Any], _ type: T.Type, _ completion: @escaping @Sendable (Result<T, AuthError>) -> Void) {
        let data: Data
        do {
            data = try JSONSerialization.data(withJSONObject: body)
        } catch {
            return completion(.failure(AuthError(code: "INVALID_ARGUMENT", message: "INVALID_ARGUMENT : \(error)")))
        }
        send(.toolkit(operation), body: data, form: false, completion)
    }

    private func url(_ endpoint: Endpoint, node: Int) -> URL? {
        let key = apiKey.addingPercentEncoding(withAllowedCharacters: Self.formValue) ?? ""
        let base = endpoints[node % endpoints.count]
        switch endpoint {
        case .toolkit(let op):
            let scope = projectID.map { "projects/\($0.addingPercentEncoding(withAllowedCharacters: Self.formValue) ?? "")/" } ?? ""
            return URL(string: "\(base)/identitytoolkit.googleapis.com/v1/\(scope)accounts:\(op)?key=\(key)")
        case .secureToken:
            return URL(string: "\(base)/securetoken.googleapis.com/v1/token?key=\(key)")
        }
    }

    /// Sends to the preferred node and, when a node cannot be reached, to the next ones (a
    /// request a node received is never sent again: it may have applied).
    private func send<T: Decodable & Sendable>(
        _ endpoint: Endpoint, body: Data, form: Bool, tried: Int = 0, _ completion: @escaping @Sendable (Result<T, AuthError>) -> Void
    ) {
        let node = lock.withLock { preferredNode } % endpoints.count
        guard let url = url(endpoint, node: node) else {
            return completion(.failure(AuthError(code: "INVALID_URL", message: "INVALID_URL : \(endpoints[node])")))
        }
        var request = URLRequest(url: url, cachePolicy: .reloadIgnoringLocalCacheData, timeoutInterval: 30)
        request.httpMethod = "POST"
        request.httpBody = body
        request.setValue(form ? "application/x-www-form-urlencoded" : "application/json", forHTTPHeaderField: "Content-Type")
        session.dataTask(with: request) { data, response, error in
            if let error {
                let unreachable: [URLError.Code] = [.cannotConnectToHost, .cannotFindHost, .dnsLookupFailed, .notConnectedToInternet]
                if let code = (error as? URLError)?.code, unreachable.contains(code), tried + 1 < self.endpoints.count {
                    self.lock.withLock { if self.preferredNode % self.endpoints.count == node { self.preferredNode = node + 1 } }
                    return self.send(endpoint, body: body, form: form, tried: tried + 1, completion)
                }
                return completion(.failure(AuthError(code: "NETWORK_REQUEST_FAILED", message: "NETWORK_REQUEST_FAILED : \(error.localizedDescription)")))
            }
            let status = (response as? HTTPURLResponse)?.statusCode ?? 0
            let bytes = data ?? Data()
            if status == 200 {
                do {
                    completion(.success(try JSONDecoder().decode(T.self, from: bytes)))
                } catch {
                    completion(.failure(AuthError(code: "INVALID_RESPONSE", message: "INVALID_RESPONSE : \(error)", status: status)))
                }
                return
            }
            let message = (try? JSONDecoder().decode(ErrorAnswer.self, from: bytes))?.error?.message ?? "HTTP \(status)"
            let code = message.components(separatedBy: " : ").first ?? message
            completion(.failure(AuthError(code: code, message: message, status: status)))
        }.resume()
    }

    private func finish(_ completion: (@Sendable (AuthError?) -> Void)?, _ result: Result<Void, AuthError>) {
        guard let completion else { return }
        callbackQueue.async {
            if case .failure(let e) = result { completion(e) } else { completion(nil) }
        }
    }

    /// Awaits a callback-style call, with its typed error.
    static func awaiting<T: Sendable>(_ start: (@escaping @Sendable (Result<T, AuthError>) -> Void) -> Void) async throws(AuthError) -> T {
        let result: Result<T, AuthError> = await withCheckedContinuation { c in start { c.resume(returning: $0) } }
        return try result.get()
    }
}

/// The `Auth` of each database (`Auth.auth(database:)`).
final class SharedAuths: @unchecked Sendable {
    private let lock = NSLock()
    private var entries: [(database: Auth.WeakDatabase, auth: Auth)] = []

    func auth(_ database: Database) -> Auth {
        lock.withLock {
            entries.removeAll { $0.database.database == nil }
            if let e = entries.first(where: { $0.database.database === database }) { return e.auth }
            let auth = Auth(database: database)
            entries.append((Auth.WeakDatabase(database), auth))
            return auth
        }
    }
}

/// A credential from an identity provider, for `Auth.signIn(with:)` (Firebase's
/// `AuthCredential`): the provider's OpenID Connect ID token, which the app obtained from the
/// provider's own sign-in flow. Banyan makes no calls to providers, so access tokens and
/// authorization codes alone cannot sign in.
public struct AuthCredential: Sendable, CustomStringConvertible {
    /// The provider's id, as in `auth.oidc_providers` (`google.com`, …).
    public let provider: String
    let idToken: String
    /// The nonce the app put in its request to the provider, if any: the ID token must carry it.
    let rawNonce: String?

    public var description: String { "AuthCredential(\(provider))" }
}

/// Credentials of any OpenID Connect provider the node is configured for (Firebase's
/// `OAuthProvider.credential(withProviderID:idToken:rawNonce:)`).
public enum OAuthProvider {
    public static func credential(withProviderID providerID: String, idToken: String, rawNonce: String? = nil) -> AuthCredential {
        AuthCredential(provider: providerID, idToken: idToken, rawNonce: rawNonce)
    }
}

/// Google's credentials (Firebase's `GoogleAuthProvider`): the ID token of Google Sign-In. The
/// access token is accepted for the familiar signature and not used (the node never calls Google).
public enum GoogleAuthProvider {
    public static let id = "google.com"

    public static func credential(withIDToken idToken: String, accessToken: String) -> AuthCredential {
        AuthCredential(provider: id, idToken: idToken, rawNonce: nil)
    }
}
