import BanyanQuery
import BanyanTree
public import Foundation

// The Firebase 2.x iOS API (2015-2016: `Firebase(url:)`, `FQuery`, `FEventType`, `FDataSnapshot`,
// the auth methods on the reference) as thin aliases over the current SDK: every call goes to a
// `DatabaseReference` or `DatabaseQuery` of a `Database`, and the auth methods to that database's
// `Auth` (docs/swift-sdk.md, "The Firebase 2.x and Wilddog names"). The names follow the 2.x
// Objective-C headers as Swift 2 imported them (`observeEventType(_:withBlock:)`,
// `FEventType.Value`).

public typealias FirebaseHandle = UInt
public typealias FDataSnapshot = DataSnapshot
public typealias FMutableData = MutableData
public typealias FTransactionResult = TransactionResult

/// The 2.x event types, spelled as Swift 2 imported them (`.Value`, `.ChildAdded`), with the
/// Swift-style lowercase names as aliases. Raw values are those of `DataEventType`.
public enum FEventType: Int, Sendable, Hashable, CaseIterable {
    case ChildAdded = 0
    case ChildRemoved = 1
    case ChildChanged = 2
    case ChildMoved = 3
    case Value = 4

    public static let childAdded = FEventType.ChildAdded
    public static let childRemoved = FEventType.ChildRemoved
    public static let childChanged = FEventType.ChildChanged
    public static let childMoved = FEventType.ChildMoved
    public static let value = FEventType.Value

    /// The same event type in the current API.
    public var dataEventType: DataEventType {
        switch self {
        case .ChildAdded: .childAdded
        case .ChildRemoved: .childRemoved
        case .ChildChanged: .childChanged
        case .ChildMoved: .childMoved
        case .Value: .value
        }
    }
}

/// The 2.x `FirebaseServerValue`.
public enum FirebaseServerValue {
    public static func timestamp() -> [String: Any] { ServerValue.timestamp() }
}

/// The 2.x authentication error codes (`FAuthenticationError`, as the 2.x headers numbered
/// them); `AuthError.firebase2xCode` maps the account service's codes onto them.
public enum FAuthenticationError: Int, Sendable, Hashable {
    case ProviderDisabled = -1
    case InvalidConfiguration = -2
    case InvalidOrigin = -3
    case InvalidProvider = -4
    case InvalidEmail = -5
    case InvalidPassword = -6
    case InvalidToken = -7
    case UserDoesNotExist = -8
    case EmailTaken = -9
    case DeniedByUser = -10
    case InvalidCredentials = -11
    case InvalidArguments = -12
    case ProviderError = -13
    case LimitsExceeded = -14
    case NetworkError = -15
    case Preempted = -16
    case Unknown = -9999
}

extension AuthError {
    /// The 2.x code for this error (what 2.x apps compared `error.code` with).
    public var firebase2xCode: FAuthenticationError {
        switch code {
        case "EMAIL_EXISTS": .EmailTaken
        case "INVALID_EMAIL", "MISSING_EMAIL": .InvalidEmail
        case "INVALID_PASSWORD", "MISSING_PASSWORD", "WEAK_PASSWORD": .InvalidPassword
        case "EMAIL_NOT_FOUND", "USER_NOT_FOUND": .UserDoesNotExist
        case "INVALID_CUSTOM_TOKEN", "INVALID_ID_TOKEN", "TOKEN_EXPIRED", "INVALID_REFRESH_TOKEN", "INVALID_OOB_CODE", "EXPIRED_OOB_CODE": .InvalidToken
        case "USER_DISABLED", "INSUFFICIENT_PERMISSION": .InvalidCredentials
        case "OPERATION_NOT_ALLOWED": .ProviderDisabled
        case "INVALID_ARGUMENT", "INVALID_CLAIMS", "CLAIMS_TOO_LARGE", "FORBIDDEN_CLAIM": .InvalidArguments
        case "INVALID_PROJECT_ID", "INVALID_URL": .InvalidConfiguration
        case "TOO_MANY_ATTEMPTS_TRY_LATER": .LimitsExceeded
        case "NETWORK_REQUEST_FAILED", "UNAVAILABLE": .NetworkError
        default: .Unknown
        }
    }
}

/// What a 2.x auth call reports (`FAuthData`): the uid, the provider (`password`, `anonymous`,
/// `custom`), the ID token, its expiry (seconds since 1970) and its claims.
public struct FAuthData: Sendable, CustomStringConvertible {
    public let uid: String
    public let provider: String
    public let token: String
    public let expires: Int
    public let email: String?
    private let claims: Data

    init(_ s: Auth.SignedIn) {
        uid = s.user.uid
        provider = s.user.providerID
        token = s.idToken
        email = s.user.email
        let c = Auth.claims(of: s.idToken) ?? [:]
        expires = (c["exp"] as? Int) ?? Int(s.expiresAt.timeIntervalSince1970)
        claims = (try? JSONSerialization.data(withJSONObject: c)) ?? Data("{}".utf8)
    }

    /// The token's claims, with `uid` and `provider` (as the rules see `auth`).
    public var auth: [String: Any] {
        var c = ((try? JSONSerialization.jsonObject(with: claims)) as? [String: Any]) ?? [:]
        c["uid"] = uid
        c["provider"] = provider
        return c
    }

    /// The provider's data: the email for the `password` provider.
    public var providerData: [String: Any] { email.map { ["email": $0] } ?? [:] }

    public var description: String { "FAuthData(\(uid), \(provider))" }
}

extension DataSnapshot {
    /// 2.x: `childSnapshotForPath:`.
    public func childSnapshotForPath(_ path: String) -> DataSnapshot { childSnapshot(forPath: path) }
}

extension MutableData {
    /// 2.x: `childDataByAppendingPath:`.
    public func childDataByAppendingPath(_ path: String) -> MutableData { childData(byAppendingPath: path) }
    /// 2.x: `hasChildAtPath:`.
    public func hasChildAtPath(_ path: String) -> Bool { hasChild(atPath: path) }
}

extension TransactionResult {
    /// 2.x: `successWithValue:`.
    public static func successWithValue(_ data: MutableData) -> TransactionResult { success(withValue: data) }
}

// MARK: - FQuery

/// A 2.x query (`FQuery`): a `DatabaseQuery` under the 2.x names. A query of a `Firebase` whose
/// URL could not be used carries that error: observing it calls the cancel block with it.
public class FQuery: @unchecked Sendable {
    let target: Result<DatabaseQuery, DatabaseError>
    /// `queryLimitedToNumberOfChildren`: anchored at the start when the query has a start
    /// bound, else at the end (the 2.x-era rule), decided when the query is used.
    let legacyLimit: UInt?

    init(target: Result<DatabaseQuery, DatabaseError>, legacyLimit: UInt? = nil) {
        self.target = target
        self.legacyLimit = legacyLimit
    }

    /// The query in the current API (nil when the `Firebase` URL was not usable).
    public var databaseQuery: DatabaseQuery? { try? effective.get() }

    var effective: Result<DatabaseQuery, DatabaseError> {
        target.map { q in
            guard let n = legacyLimit else { return q }
            return q.params.start != nil ? q.queryLimited(toFirst: n) : q.queryLimited(toLast: n)
        }
    }

    /// The location of this query.
    public var ref: Firebase { Firebase(location: target.map { $0.ref }) }

    private func narrowed(_ build: (DatabaseQuery) -> DatabaseQuery) -> FQuery { FQuery(target: target.map(build), legacyLimit: legacyLimit) }

    static func refused(_ q: DatabaseQuery, _ message: String) -> DatabaseQuery {
        q.queryError != nil ? q : DatabaseQuery(database: q.database, path: q.path, query: q.query, error: DatabaseError(code: "invalid_query", message: message))
    }

    public func queryOrderedByChild(_ key: String) -> FQuery { narrowed { $0.queryOrdered(byChild: key) } }
    public func queryOrderedByKey() -> FQuery { narrowed { $0.queryOrderedByKey() } }
    public func queryOrderedByValue() -> FQuery { narrowed { $0.queryOrderedByValue() } }
    public func queryOrderedByPriority() -> FQuery { narrowed { $0.queryOrderedByPriority() } }
    public func queryStartingAtValue(_ value: Any?) -> FQuery { narrowed { $0.queryStarting(atValue: value) } }
    public func queryStartingAtValue(_ value: Any?, childKey: String?) -> FQuery { narrowed { $0.queryStarting(atValue: value, childKey: childKey) } }
    public func queryEndingAtValue(_ value: Any?) -> FQuery { narrowed { $0.queryEnding(atValue: value) } }
    public func queryEndingAtValue(_ value: Any?, childKey: String?) -> FQuery { narrowed { $0.queryEnding(atValue: value, childKey: childKey) } }
    public func queryEqualToValue(_ value: Any?) -> FQuery { narrowed { $0.queryEqual(toValue: value) } }
    public func queryEqualToValue(_ value: Any?, childKey: String?) -> FQuery { narrowed { $0.queryEqual(toValue: value, childKey: childKey) } }

    public func queryLimitedToFirst(_ limit: UInt) -> FQuery {
        guard legacyLimit == nil else { return narrowed { Self.refused($0, "queryLimitedToFirst: Limit was already set (by queryLimitedToNumberOfChildren:)") } }
        return narrowed { $0.queryLimited(toFirst: limit) }
    }

    public func queryLimitedToLast(_ limit: UInt) -> FQuery {
        guard legacyLimit == nil else { return narrowed { Self.refused($0, "queryLimitedToLast: Limit was already set (by queryLimitedToNumberOfChildren:)") } }
        return narrowed { $0.queryLimited(toLast: limit) }
    }

    /// Deprecated in 2.x: a limit anchored at the start bound when there is one, else at the end.
    public func queryLimitedToNumberOfChildren(_ limit: UInt) -> FQuery {
        let set: Bool
        switch target {
        case .success(let q): set = legacyLimit != nil || q.params.limit != nil
        case .failure: set = false
        }
        guard !set else { return narrowed { Self.refused($0, "queryLimitedToNumberOfChildren: Limit was already set") } }
        guard limit > 0 else { return narrowed { Self.refused($0, "queryLimitedToNumberOfChildren: Limit must be a positive integer") } }
        return FQuery(target: target, legacyLimit: limit)
    }

    // The deprecated priority bounds: on the default (priority) ordering only.
    private func priorityBound(_ priority: Any?, _ function: String, _ build: @escaping (DatabaseQuery) -> DatabaseQuery) -> FQuery {
        narrowed { q in
            guard q.params.index == .priority else { return Self.refused(q, "\(function): priority bounds need a query ordered by priority") }
            guard ValueCoding.priorityValue(priority) != nil else { return Self.refused(q, "\(function): a priority is a number, a string or nil") }
            return build(q)
        }
    }

    public func queryStartingAtPriority(_ priority: Any?) -> FQuery {
        priorityBound(priority, "queryStartingAtPriority:") { $0.queryStarting(atValue: priority) }
    }
    public func queryStartingAtPriority(_ priority: Any?, andChildName childName: String?) -> FQuery {
        priorityBound(priority, "queryStartingAtPriority:andChildName:") { $0.queryStarting(atValue: priority, childKey: childName) }
    }
    public func queryEndingAtPriority(_ priority: Any?) -> FQuery {
        priorityBound(priority, "queryEndingAtPriority:") { $0.queryEnding(atValue: priority) }
    }
    public func queryEndingAtPriority(_ priority: Any?, andChildName childName: String?) -> FQuery {
        priorityBound(priority, "queryEndingAtPriority:andChildName:") { $0.queryEnding(atValue: priority, childKey: childName) }
    }
    public func queryEqualToPriority(_ priority: Any?) -> FQuery {
        priorityBound(priority, "queryEqualToPriority:") { $0.queryEqual(toValue: priority) }
    }
    public func queryEqualToPriority(_ priority: Any?, andChildName childName: String?) -> FQuery {
        priorityBound(priority, "queryEqualToPriority:andChildName:") { $0.queryEqual(toValue: priority, childKey: childName) }
    }

    // MARK: Observing

    private func observing(_ cancel: (@Sendable (any Error) -> Void)?, _ body: (DatabaseQuery) -> DatabaseHandle) -> FirebaseHandle {
        switch effective {
        case .success(let q): return body(q)
        case .failure(let e):
            if let cancel { FirebaseApps.shared.errorQueue.async { cancel(e) } }
            return 0
        }
    }

    @discardableResult
    public func observeEventType(_ eventType: FEventType, withBlock block: @escaping @Sendable (FDataSnapshot) -> Void) -> FirebaseHandle {
        observing(nil) { $0.observe(eventType.dataEventType, with: block) }
    }

    @discardableResult
    public func observeEventType(_ eventType: FEventType, andPreviousSiblingKeyWithBlock block: @escaping @Sendable (FDataSnapshot, String?) -> Void) -> FirebaseHandle {
        observing(nil) { $0.observe(eventType.dataEventType, andPreviousSiblingKeyWith: block) }
    }

    @discardableResult
    public func observeEventType(
        _ eventType: FEventType, withBlock block: @escaping @Sendable (FDataSnapshot) -> Void, withCancelBlock cancel: (@Sendable (any Error) -> Void)?
    ) -> FirebaseHandle {
        observing(cancel) { $0.observe(eventType.dataEventType, with: block, withCancel: cancel) }
    }

    @discardableResult
    public func observeEventType(
        _ eventType: FEventType, andPreviousSiblingKeyWithBlock block: @escaping @Sendable (FDataSnapshot, String?) -> Void,
        withCancelBlock cancel: (@Sendable (any Error) -> Void)?
    ) -> FirebaseHandle {
        observing(cancel) { $0.observe(eventType.dataEventType, andPreviousSiblingKeyWith: block, withCancel: cancel) }
    }

    public func observeSingleEventOfType(_ eventType: FEventType, withBlock block: @escaping @Sendable (FDataSnapshot) -> Void) {
        _ = observing(nil) { q in q.observeSingleEvent(of: eventType.dataEventType, with: block); return 0 }
    }

    public func observeSingleEventOfType(_ eventType: FEventType, andPreviousSiblingKeyWithBlock block: @escaping @Sendable (FDataSnapshot, String?) -> Void) {
        _ = observing(nil) { q in q.observeSingleEvent(of: eventType.dataEventType, andPreviousSiblingKeyWith: block); return 0 }
    }

    public func observeSingleEventOfType(
        _ eventType: FEventType, withBlock block: @escaping @Sendable (FDataSnapshot) -> Void, withCancelBlock cancel: (@Sendable (any Error) -> Void)?
    ) {
        _ = observing(cancel) { q in q.observeSingleEvent(of: eventType.dataEventType, with: block, withCancel: cancel); return 0 }
    }

    public func observeSingleEventOfType(
        _ eventType: FEventType, andPreviousSiblingKeyWithBlock block: @escaping @Sendable (FDataSnapshot, String?) -> Void,
        withCancelBlock cancel: (@Sendable (any Error) -> Void)?
    ) {
        _ = observing(cancel) { q in q.observeSingleEvent(of: eventType.dataEventType, andPreviousSiblingKeyWith: block, withCancel: cancel); return 0 }
    }

    public func removeObserverWithHandle(_ handle: FirebaseHandle) {
        if case .success(let q) = target { q.removeObserver(withHandle: handle) }
    }

    public func removeAllObservers() {
        if case .success(let q) = effective { q.removeAllObservers() }
    }

    public func keepSynced(_ keepSynced: Bool) {
        if case .success(let q) = effective { q.keepSynced(keepSynced) }
    }
}

// MARK: - Firebase

/// A 2.x reference (`Firebase`): a `DatabaseReference` under the 2.x names, made from a full
/// location URL. Every `Firebase` of one database URL (scheme, host, port and `ns`) shares one
/// `Database` and one `Auth`. A URL that cannot be used does not raise as 2.x did: the reference
/// carries the error (`invalid_url`) and every call on it fails with it.
public final class Firebase: FQuery, CustomStringConvertible, @unchecked Sendable {
    let location: Result<DatabaseReference, DatabaseError>

    init(location: Result<DatabaseReference, DatabaseError>) {
        self.location = location
        super.init(target: location.map { $0 as DatabaseQuery })
    }

    /// 2.x `initWithUrl:`: the location at a full URL, such as
    /// `http://127.0.0.1:9000/users/ada?ns=app` (the namespace defaults to the host's first label).
    public convenience init(url: String) { self.init(location: FirebaseApps.shared.location(url)) }

    /// A `Firebase` over a reference of the current API.
    public convenience init(reference: DatabaseReference) { self.init(location: .success(reference)) }

    /// The reference in the current API (nil when the URL was not usable).
    public var reference: DatabaseReference? { try? location.get() }

    public override var ref: Firebase { self }

    public var key: String? { reference?.key }
    public var parent: Firebase? { reference?.parent.map { Firebase(reference: $0) } }
    public var root: Firebase { Firebase(location: location.map { $0.root }) }
    public var description: String {
        switch location {
        case .success(let r): r.url
        case .failure(let e): "invalid Firebase: \(e)"
        }
    }

    public func childByAppendingPath(_ pathString: String) -> Firebase { Firebase(location: location.map { $0.child(pathString) }) }
    public func childByAutoId() -> Firebase { Firebase(location: location.map { $0.childByAutoId() }) }

    // MARK: Class-level

    /// Closes every 2.x database's connection (and those made later) until `goOnline()`.
    public static func goOffline() { FirebaseApps.shared.setOffline(true) }
    public static func goOnline() { FirebaseApps.shared.setOffline(false) }

    /// The queue 2.x callbacks run on, for databases first used after this call (as in 2.x, call
    /// it before the first `Firebase(url:)`).
    public static func setDispatchQueue(_ queue: DispatchQueue) { FirebaseApps.shared.setQueue(queue) }

    // MARK: Writing

    public typealias CompletionBlock = @Sendable ((any Error)?, Firebase) -> Void

    private func writing(_ block: CompletionBlock?, _ body: (DatabaseReference, DatabaseReference.Completion?) -> Void) {
        switch location {
        case .success(let r): body(r, block.map { b in { @Sendable e, r in b(e, Firebase(reference: r)) } })
        case .failure(let e):
            guard let block else { return }
            let me = self
            FirebaseApps.shared.errorQueue.async { block(e, me) }
        }
    }

    public func setValue(_ value: Any?) { writing(nil) { r, _ in r.setValue(value, withCompletionBlock: nil) } }
    public func setValue(_ value: Any?, withCompletionBlock block: @escaping CompletionBlock) {
        writing(block) { r, done in r.setValue(value, withCompletionBlock: done) }
    }
    public func setValue(_ value: Any?, andPriority priority: Any?) { writing(nil) { r, _ in r.setValue(value, andPriority: priority, withCompletionBlock: nil) } }
    public func setValue(_ value: Any?, andPriority priority: Any?, withCompletionBlock block: @escaping CompletionBlock) {
        writing(block) { r, done in r.setValue(value, andPriority: priority, withCompletionBlock: done) }
    }
    public func removeValue() { writing(nil) { r, _ in r.removeValue(completionBlock: nil) } }
    public func removeValueWithCompletionBlock(_ block: @escaping CompletionBlock) { writing(block) { r, done in r.removeValue(completionBlock: done) } }
    public func setPriority(_ priority: Any?) { writing(nil) { r, _ in r.setPriority(priority, withCompletionBlock: nil) } }
    public func setPriority(_ priority: Any?, withCompletionBlock block: @escaping CompletionBlock) {
        writing(block) { r, done in r.setPriority(priority, withCompletionBlock: done) }
    }
    public func updateChildValues(_ values: [AnyHashable: Any]) { writing(nil) { r, _ in r.updateChildValues(values, withCompletionBlock: nil) } }
    public func updateChildValues(_ values: [AnyHashable: Any], withCompletionBlock block: @escaping CompletionBlock) {
        writing(block) { r, done in r.updateChildValues(values, withCompletionBlock: done) }
    }

    // MARK: onDisconnect

    public func onDisconnectSetValue(_ value: Any?) { writing(nil) { r, _ in r.onDisconnectSetValue(value, withCompletionBlock: nil) } }
    public func onDisconnectSetValue(_ value: Any?, withCompletionBlock block: @escaping CompletionBlock) {
        writing(block) { r, done in r.onDisconnectSetValue(value, withCompletionBlock: done) }
    }
    public func onDisconnectSetValue(_ value: Any?, andPriority priority: Any?) {
        writing(nil) { r, _ in r.onDisconnectSetValue(value, andPriority: priority, withCompletionBlock: nil) }
    }
    public func onDisconnectSetValue(_ value: Any?, andPriority priority: Any?, withCompletionBlock block: @escaping CompletionBlock) {
        writing(block) { r, done in r.onDisconnectSetValue(value, andPriority: priority, withCompletionBlock: done) }
    }
    public func onDisconnectRemoveValue() { writing(nil) { r, _ in r.onDisconnectRemoveValue(withCompletionBlock: nil) } }
    public func onDisconnectRemoveValueWithCompletionBlock(_ block: @escaping CompletionBlock) {
        writing(block) { r, done in r.onDisconnectRemoveValue(withCompletionBlock: done) }
    }
    public func onDisconnectUpdateChildValues(_ values: [AnyHashable: Any]) {
        writing(nil) { r, _ in r.onDisconnectUpdateChildValues(values, withCompletionBlock: nil) }
    }
    public func onDisconnectUpdateChildValues(_ values: [AnyHashable: Any], withCompletionBlock block: @escaping CompletionBlock) {
        writing(block) { r, done in r.onDisconnectUpdateChildValues(values, withCompletionBlock: done) }
    }
    public func cancelDisconnectOperations() { writing(nil) { r, _ in r.cancelDisconnectOperations(withCompletionBlock: nil) } }
    public func cancelDisconnectOperationsWithCompletionBlock(_ block: @escaping CompletionBlock) {
        writing(block) { r, done in r.cancelDisconnectOperations(withCompletionBlock: done) }
    }

    // MARK: Transactions

    public func runTransactionBlock(_ block: @escaping @Sendable (FMutableData) -> FTransactionResult) {
        runTransactionBlock(block, andCompletionBlock: nil, withLocalEvents: true)
    }

    public func runTransactionBlock(
        _ block: @escaping @Sendable (FMutableData) -> FTransactionResult, andCompletionBlock completion: (@Sendable ((any Error)?, Bool, FDataSnapshot?) -> Void)?
    ) {
        runTransactionBlock(block, andCompletionBlock: completion, withLocalEvents: true)
    }

    public func runTransactionBlock(
        _ block: @escaping @Sendable (FMutableData) -> FTransactionResult, andCompletionBlock completion: (@Sendable ((any Error)?, Bool, FDataSnapshot?) -> Void)?,
        withLocalEvents localEvents: Bool
    ) {
        switch location {
        case .success(let r): r.runTransactionBlock(block, andCompletionBlock: completion, withLocalEvents: localEvents)
        case .failure(let e):
            guard let completion else { return }
            FirebaseApps.shared.errorQueue.async { completion(e, false, nil) }
        }
    }

    // MARK: Auth (the account service: docs/accounts.md)

    /// The `Auth` of this reference's database, or the URL's error.
    private func withAuth(_ fail: @escaping @Sendable (any Error) -> Void, _ body: (Auth) -> Void) {
        switch location {
        case .success(let r): body(Auth.auth(database: r.database))
        case .failure(let e): FirebaseApps.shared.errorQueue.async { fail(e) }
        }
    }

    private static func reporting(_ block: @escaping @Sendable ((any Error)?, FAuthData?) -> Void, _ auth: Auth) -> @Sendable (User?, AuthError?) -> Void {
        { _, error in
            if let error { return block(error, nil) }
            guard let s = auth.signedIn else { return block(AuthError.noUser, nil) }
            block(nil, FAuthData(s))
        }
    }

    /// The signed-in session, or nil.
    public var authData: FAuthData? {
        guard let r = reference else { return nil }
        return Auth.auth(database: r.database).signedIn.map(FAuthData.init)
    }

    /// Signs in with a custom token (`accounts:signInWithCustomToken`); the connection then
    /// uses the ID token it gives.
    public func authWithCustomToken(_ token: String, withCompletionBlock block: @escaping @Sendable ((any Error)?, FAuthData?) -> Void) {
        withAuth({ block($0, nil) }) { auth in auth.signIn(withCustomToken: token, completion: Self.reporting(block, auth)) }
    }

    public func authUser(_ email: String, password: String, withCompletionBlock block: @escaping @Sendable ((any Error)?, FAuthData?) -> Void) {
        withAuth({ block($0, nil) }) { auth in auth.signIn(withEmail: email, password: password, completion: Self.reporting(block, auth)) }
    }

    public func authAnonymouslyWithCompletionBlock(_ block: @escaping @Sendable ((any Error)?, FAuthData?) -> Void) {
        withAuth({ block($0, nil) }) { auth in auth.signInAnonymously(completion: Self.reporting(block, auth)) }
    }

    /// Creates an account without signing it in (as 2.x did).
    public func createUser(_ email: String, password: String, withCompletionBlock block: @escaping @Sendable ((any Error)?) -> Void) {
        createUser(email, password: password) { error, _ in block(error) }
    }

    /// As `createUser(_:password:withCompletionBlock:)`, with `["uid": …]` of the new account.
    public func createUser(_ email: String, password: String, withValueCompletionBlock block: @escaping @Sendable ((any Error)?, [String: Any]?) -> Void) {
        withAuth({ block($0, nil) }) { auth in
            auth.call("signUp", ["email": email, "password": password], Auth.TokenAnswer.self) { result in
                auth.callbackQueue.async {
                    switch result {
                    case .success(let answer): block(nil, ["uid": answer.localId ?? ""])
                    case .failure(let e): block(e, nil)
                    }
                }
            }
        }
    }

    /// Signs in as `email` with `password`, runs `request` with its ID token; the current
    /// session takes the answer's tokens when it is that account's.
    private func asAccount(
        _ email: String, _ password: String, _ block: @escaping @Sendable ((any Error)?) -> Void,
        _ request: @escaping @Sendable (Auth, String, @escaping @Sendable (Result<Auth.TokenAnswer, AuthError>) -> Void) -> Void
    ) {
        withAuth(block) { auth in
            auth.call("signInWithPassword", ["email": email, "password": password, "returnSecureToken": true], Auth.TokenAnswer.self) { signedIn in
                let done: @Sendable (Result<Auth.TokenAnswer, AuthError>) -> Void = { result in
                    if case .success(let answer) = result, let uid = answer.localId ?? signedIn.value?.localId, auth.currentUser?.uid == uid {
                        if answer.idToken != nil { _ = auth.adopt(answer, uid: uid) } else { auth.signOut() }
                    }
                    auth.callbackQueue.async {
                        if case .failure(let e) = result { block(e) } else { block(nil) }
                    }
                }
                switch signedIn {
                case .failure(let e): done(.failure(e))
                case .success(let answer):
                    guard let idToken = answer.idToken else { return done(.failure(AuthError(code: "INVALID_RESPONSE", message: "INVALID_RESPONSE : no ID token"))) }
                    request(auth, idToken, done)
                }
            }
        }
    }

    public func changePasswordForUser(_ email: String, fromOld oldPassword: String, toNew newPassword: String, withCompletionBlock block: @escaping @Sendable ((any Error)?) -> Void) {
        asAccount(email, oldPassword, block) { auth, idToken, done in
            auth.call("update", ["idToken": idToken, "password": newPassword, "returnSecureToken": true], Auth.TokenAnswer.self, done)
        }
    }

    public func changeEmailForUser(_ email: String, password: String, toNewEmail newEmail: String, withCompletionBlock block: @escaping @Sendable ((any Error)?) -> Void) {
        asAccount(email, password, block) { auth, idToken, done in
            auth.call("update", ["idToken": idToken, "email": newEmail, "returnSecureToken": true], Auth.TokenAnswer.self, done)
        }
    }

    /// Deletes the account (signed out here if it is the current one).
    public func removeUser(_ email: String, password: String, withCompletionBlock block: @escaping @Sendable ((any Error)?) -> Void) {
        asAccount(email, password, block) { auth, idToken, done in
            auth.call("delete", ["idToken": idToken], Auth.LocalIDAnswer.self) { result in
                // No tokens in the answer: the session of that account ends.
                done(result.map { _ in Auth.TokenAnswer(idToken: nil, refreshToken: nil, expiresIn: nil, localId: Auth.user(of: idToken)) })
            }
        }
    }

    /// Sends a password-reset code to the node's hook (2.x mailed a temporary password: the
    /// code is then used with `Auth.confirmPasswordReset`).
    public func resetPasswordForUser(_ email: String, withCompletionBlock block: @escaping @Sendable ((any Error)?) -> Void) {
        withAuth(block) { auth in auth.sendPasswordReset(withEmail: email) { e in block(e) } }
    }

    /// Signs out: the connection drops the credential.
    public func unauth() {
        guard let r = reference else { return }
        Auth.auth(database: r.database).signOut()
    }

    /// Calls `block` now and whenever a user signs in or out, with the session (or nil).
    @discardableResult
    public func observeAuthEventWithBlock(_ block: @escaping @Sendable (FAuthData?) -> Void) -> FirebaseHandle {
        guard let r = reference else {
            FirebaseApps.shared.errorQueue.async { block(nil) }
            return 0
        }
        return Auth.auth(database: r.database).addStateDidChangeListener { auth, _ in block(auth.signedIn.map(FAuthData.init)) }
    }

    public func removeAuthEventObserverWithHandle(_ handle: FirebaseHandle) {
        guard let r = reference else { return }
        Auth.auth(database: r.database).removeStateDidChangeListener(handle)
    }
}

extension Result {
    fileprivate var value: Success? { try? get() }
}

extension Auth {
    /// The uid an ID token names, or nil.
    static func user(of idToken: String) -> String? {
        guard let c = claims(of: idToken) else { return nil }
        return (c["user_id"] as? String) ?? (c["sub"] as? String)
    }
}

/// The databases behind `Firebase(url:)`: one per database URL, the class-level offline switch
/// and dispatch queue.
final class FirebaseApps: @unchecked Sendable {
    static let shared = FirebaseApps()
    private let lock = NSLock()
    private var databases: [String: Database] = [:]
    private var offline = false
    private var queue: DispatchQueue?
    private let fallback = DispatchQueue(label: "banyan.firebase2x.callbacks")

    /// Where errors of unusable URLs are reported.
    var errorQueue: DispatchQueue { lock.withLock { queue ?? fallback } }

    func location(_ url: String) -> Result<DatabaseReference, DatabaseError> {
        guard let c = URLComponents(string: url), let scheme = c.scheme?.lowercased(), let host = c.host, !host.isEmpty else {
            return .failure(DatabaseError(code: "invalid_url", message: "expected http(s)://host:port/path?ns=name, got \(url)"))
        }
        var base = URLComponents()
        base.scheme = scheme
        base.host = host
        base.port = c.port
        if let ns = c.queryItems?.first(where: { $0.name == "ns" }) { base.queryItems = [ns] }
        guard let key = base.string else { return .failure(DatabaseError(code: "invalid_url", message: "cannot use \(url)")) }
        let made: Result<(Database, Bool), DatabaseError> = lock.withLock {
            if let d = databases[key] { return .success((d, false)) }
            do {
                let d = try Database(url: key, callbackQueue: queue)
                databases[key] = d
                return .success((d, offline))
            } catch let e as DatabaseError {
                return .failure(e)
            } catch {
                return .failure(DatabaseError(code: "invalid_url", message: "\(error)"))
            }
        }
        return made.map { database, startOffline in
            if startOffline { database.goOffline() }
            return database.reference(fromURL: url)
        }
    }

    func setOffline(_ on: Bool) {
        let all: [Database] = lock.withLock {
            offline = on
            return Array(databases.values)
        }
        for d in all {
            if on { d.goOffline() } else { d.goOnline() }
        }
    }

    func setQueue(_ q: DispatchQueue) { lock.withLock { queue = q } }
}
