import BanyanQuery
import BanyanTree
public import Foundation

// The Wilddog Sync iOS API (`WDGSync`, `WDGSyncReference`, `WDGSyncQuery`, `WDGDataEventType`, …)
// as thin aliases over the current SDK, with Wilddog's documented behaviour differences behind
// `WDGOptions.compatibility = .wilddog` (docs/swift-sdk.md, "The Firebase 2.x and Wilddog
// names"). The Swift names are those of Wilddog's iOS reference (`observe(_:with:)`,
// `queryOrdered(byChild:)`, `removeValue(completionBlock:)`).

public typealias WDGSyncHandle = UInt
public typealias WDGDataEventType = DataEventType
public typealias WDGDataSnapshot = DataSnapshot
public typealias WDGMutableData = MutableData
public typealias WDGTransactionResult = TransactionResult

/// Which behaviour a `WDGSync` has where Wilddog's documentation differs from Firebase's.
public enum WDGCompatibility: Sendable, Hashable {
    /// Banyan's (Firebase's) behaviour under the Wilddog names; errors are `DatabaseError`.
    case firebase
    /// Wilddog's documented behaviour: errors are `WDGSyncError` with Wilddog's numeric codes;
    /// `setPriority` on a location without data fails with 26301 (Banyan refuses it anyway, as
    /// `failure`); a write is at most 2 MiB of
    /// JSON (26104) and a string at most 1 MiB (26105); a query returns at most 500 children
    /// (larger limits are lowered to 500, and a range query without a limit gets
    /// `queryLimited(toFirst: 500)`).
    case wilddog
}

/// Wilddog's `WDGOptions`: the Sync URL (`https://<appid>.wilddogio.com`, or a Banyan node's
/// `http://host:port?ns=name`) and the behaviour.
public struct WDGOptions: Sendable, Hashable {
    public var syncURL: String
    public var compatibility: WDGCompatibility

    public init(syncURL: String, compatibility: WDGCompatibility = .firebase) {
        self.syncURL = syncURL
        self.compatibility = compatibility
    }
}

/// Wilddog's `WDGApp`: named configurations (`configure(with:)` makes the default one).
public final class WDGApp: Sendable {
    public let name: String
    public let options: WDGOptions
    public static let defaultName = "__WDGAPP_DEFAULT"

    init(name: String, options: WDGOptions) {
        self.name = name
        self.options = options
    }

    /// Configures the default app. Throws `invalid_url` for an unusable URL and `app_exists`
    /// when the name is configured already (Wilddog raised an exception).
    public static func configure(with options: WDGOptions) throws { try configure(withName: defaultName, options: options) }

    public static func configure(withName name: String, options: WDGOptions) throws { try WDGRegistry.shared.configure(name, options) }

    public static func defaultApp() -> WDGApp? { WDGRegistry.shared.app(defaultName) }
    public static func app(named name: String) -> WDGApp? { WDGRegistry.shared.app(name) }
    public static func allApps() -> [String: WDGApp] { WDGRegistry.shared.allApps() }
}

/// Wilddog's `WDGServerValue` (timestamps only, as Wilddog documents).
public enum WDGServerValue {
    public static func timestamp() -> [String: Any] { ServerValue.timestamp() }
}

/// An error as a `.wilddog` `WDGSync` reports it: Wilddog's code (26101 permission denied,
/// 26104 request too large, 26105 leaf too large, 26201 transaction hash mismatch, 26203 too
/// many retries, 26204 overridden by a set, 26301 priority on a location without data, 26801
/// token expired, 26802 token invalid, 26003 server unavailable, 29999 anything else) and the
/// `DatabaseError` underneath.
public struct WDGSyncError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    public let code: Int
    public let message: String
    public let underlying: DatabaseError

    public init(code: Int, message: String, underlying: DatabaseError) {
        self.code = code
        self.message = message
        self.underlying = underlying
    }

    public init(_ error: DatabaseError) {
        let (code, message): (Int, String) =
            switch error.code {
            case "permission_denied": (26101, "This client does not have permission to perform this operation")
            case "datastale": (26201, "Transaction hash does not match")
            case "maxretries": (26203, "The transaction had too many retries")
            case "overriddenBySet": (26204, "The transaction was overridden by a subsequent set")
            case "expired_token": (26801, "The supplied auth token has expired")
            case "invalid_token": (26802, "The supplied auth token was invalid")
            case "unavailable": (26003, "Server unavailable")
            case "too_big": (26104, "Data requested exceeds the maximum size that can be accessed with a single request")
            default: (29999, "Unknown error")
            }
        self.init(code: code, message: message, underlying: error)
    }

    public var description: String { "\(code): \(message) (\(underlying))" }
    public var errorDescription: String? { description }
}

// MARK: - WDGSync

/// Wilddog's `WDGSync`: one database (shared by every `WDGSync` of its URL) with the
/// behaviour its options ask for.
public final class WDGSync: @unchecked Sendable {
    public let database: Database
    public let options: WDGOptions
    public let app: WDGApp?

    init(database: Database, options: WDGOptions, app: WDGApp?) {
        self.database = database
        self.options = options
        self.app = app
    }

    var wilddog: Bool { options.compatibility == .wilddog }

    /// The default app's `WDGSync` (`WDGApp.configure(with:)` first; else `no_app`).
    public static func sync() throws -> WDGSync {
        guard let app = WDGApp.defaultApp() else {
            throw DatabaseError(code: "no_app", message: "configure the default app first (WDGApp.configure(with:))")
        }
        return try sync(app: app)
    }

    public static func sync(app: WDGApp) throws -> WDGSync { try WDGRegistry.shared.sync(app.options, app: app) }

    /// The `WDGSync` of a URL, with Firebase's behaviour.
    public static func sync(url: String) throws -> WDGSync { try sync(options: WDGOptions(syncURL: url)) }

    public static func sync(options: WDGOptions) throws -> WDGSync { try WDGRegistry.shared.sync(options, app: nil) }

    public func reference() -> WDGSyncReference { WDGSyncReference(database.reference(), sync: self) }
    public func reference(withPath path: String) -> WDGSyncReference { WDGSyncReference(database.reference(withPath: path), sync: self) }
    public func reference(fromURL url: String) -> WDGSyncReference { WDGSyncReference(database.reference(fromURL: url), sync: self) }

    public func goOffline() { database.goOffline() }
    public func goOnline() { database.goOnline() }

    /// Where callbacks run (set it before the first reference, as Wilddog asks).
    public var callbackQueue: DispatchQueue {
        get { database.callbackQueue }
        set { database.callbackQueue = newValue }
    }

    // MARK: Wilddog's behaviour

    static let maxWriteBytes = 2 * 1024 * 1024
    static let maxLeafBytes = 1024 * 1024
    static let maxQueryChildren: UInt = 500

    /// The error as this sync reports it.
    func reported(_ error: (any Error)?) -> (any Error)? {
        guard wilddog, let e = error as? DatabaseError else { return error }
        return WDGSyncError(e)
    }

    /// Wilddog's write bounds (nil when the values fit or the behaviour is Firebase's).
    func refusal(_ values: [Any?]) -> WDGSyncError? {
        guard wilddog else { return nil }
        var total = 0
        for value in values {
            if Self.longestString(value) > Self.maxLeafBytes {
                return WDGSyncError(
                    code: 26105, message: "Size of the leaf node exceeds the limitation (1M bytes)",
                    underlying: DatabaseError(code: "too_big", message: "a string is longer than \(Self.maxLeafBytes) bytes"))
            }
            total += ((try? ValueCoding.json(value)) ?? []).count
        }
        guard total > Self.maxWriteBytes else { return nil }
        return WDGSyncError(
            code: 26104, message: "Data requested exceeds the maximum size that can be accessed with a single request",
            underlying: DatabaseError(code: "too_big", message: "the write is \(total) bytes of JSON; the limit is \(Self.maxWriteBytes)"))
    }

    static func longestString(_ value: Any?) -> Int {
        switch value {
        case let s as String: s.utf8.count
        case let d as [String: Any]: d.values.map { longestString($0) }.max() ?? 0
        case let d as [AnyHashable: Any]: d.values.map { longestString($0) }.max() ?? 0
        case let a as [Any]: a.map { longestString($0) }.max() ?? 0
        default: 0
        }
    }
}

// MARK: - WDGSyncQuery

/// Wilddog's `WDGSyncQuery`: a `DatabaseQuery` under Wilddog's names.
public class WDGSyncQuery: @unchecked Sendable {
    let base: DatabaseQuery
    public let sync: WDGSync

    init(_ base: DatabaseQuery, sync: WDGSync) {
        self.base = base
        self.sync = sync
    }

    /// The query in the current API (with Wilddog's bounds applied under `.wilddog`).
    public var databaseQuery: DatabaseQuery {
        guard sync.wilddog, base.queryError == nil, base.params.limit == nil, base.params.start != nil || base.params.end != nil else { return base }
        return base.queryLimited(toFirst: WDGSync.maxQueryChildren)
    }

    public var ref: WDGSyncReference { WDGSyncReference(base.ref, sync: sync) }

    private func narrowed(_ q: DatabaseQuery) -> WDGSyncQuery { WDGSyncQuery(q, sync: sync) }
    private func bounded(_ limit: UInt) -> UInt { sync.wilddog ? min(limit, WDGSync.maxQueryChildren) : limit }

    public func queryLimited(toFirst limit: UInt) -> WDGSyncQuery { narrowed(base.queryLimited(toFirst: bounded(limit))) }
    public func queryLimited(toLast limit: UInt) -> WDGSyncQuery { narrowed(base.queryLimited(toLast: bounded(limit))) }
    public func queryOrdered(byChild key: String) -> WDGSyncQuery { narrowed(base.queryOrdered(byChild: key)) }
    public func queryOrderedByKey() -> WDGSyncQuery { narrowed(base.queryOrderedByKey()) }
    public func queryOrderedByValue() -> WDGSyncQuery { narrowed(base.queryOrderedByValue()) }
    public func queryOrderedByPriority() -> WDGSyncQuery { narrowed(base.queryOrderedByPriority()) }
    public func queryStarting(atValue value: Any?) -> WDGSyncQuery { narrowed(base.queryStarting(atValue: value)) }
    public func queryStarting(atValue value: Any?, childKey: String?) -> WDGSyncQuery { narrowed(base.queryStarting(atValue: value, childKey: childKey)) }
    public func queryEnding(atValue value: Any?) -> WDGSyncQuery { narrowed(base.queryEnding(atValue: value)) }
    public func queryEnding(atValue value: Any?, childKey: String?) -> WDGSyncQuery { narrowed(base.queryEnding(atValue: value, childKey: childKey)) }
    public func queryEqual(toValue value: Any?) -> WDGSyncQuery { narrowed(base.queryEqual(toValue: value)) }
    public func queryEqual(toValue value: Any?, childKey: String?) -> WDGSyncQuery { narrowed(base.queryEqual(toValue: value, childKey: childKey)) }

    // MARK: Observing

    private func cancelling(_ cancel: (@Sendable (any Error) -> Void)?) -> (@Sendable (any Error) -> Void)? {
        guard let cancel else { return nil }
        let sync = self.sync
        return { e in cancel(sync.reported(e) ?? e) }
    }

    @discardableResult
    public func observe(_ eventType: WDGDataEventType, with block: @escaping @Sendable (WDGDataSnapshot) -> Void) -> WDGSyncHandle {
        databaseQuery.observe(eventType, with: block)
    }

    @discardableResult
    public func observe(_ eventType: WDGDataEventType, andPreviousSiblingKeyWith block: @escaping @Sendable (WDGDataSnapshot, String?) -> Void) -> WDGSyncHandle {
        databaseQuery.observe(eventType, andPreviousSiblingKeyWith: block)
    }

    @discardableResult
    public func observe(
        _ eventType: WDGDataEventType, with block: @escaping @Sendable (WDGDataSnapshot) -> Void, withCancel cancelBlock: (@Sendable (any Error) -> Void)? = nil
    ) -> WDGSyncHandle {
        databaseQuery.observe(eventType, with: block, withCancel: cancelling(cancelBlock))
    }

    @discardableResult
    public func observe(
        _ eventType: WDGDataEventType, andPreviousSiblingKeyWith block: @escaping @Sendable (WDGDataSnapshot, String?) -> Void,
        withCancel cancelBlock: (@Sendable (any Error) -> Void)? = nil
    ) -> WDGSyncHandle {
        databaseQuery.observe(eventType, andPreviousSiblingKeyWith: block, withCancel: cancelling(cancelBlock))
    }

    public func observeSingleEvent(of eventType: WDGDataEventType, with block: @escaping @Sendable (WDGDataSnapshot) -> Void) {
        databaseQuery.observeSingleEvent(of: eventType, with: block)
    }

    public func observeSingleEvent(of eventType: WDGDataEventType, andPreviousSiblingKeyWith block: @escaping @Sendable (WDGDataSnapshot, String?) -> Void) {
        databaseQuery.observeSingleEvent(of: eventType, andPreviousSiblingKeyWith: block)
    }

    public func observeSingleEvent(
        of eventType: WDGDataEventType, with block: @escaping @Sendable (WDGDataSnapshot) -> Void, withCancel cancelBlock: (@Sendable (any Error) -> Void)? = nil
    ) {
        databaseQuery.observeSingleEvent(of: eventType, with: block, withCancel: cancelling(cancelBlock))
    }

    public func observeSingleEvent(
        of eventType: WDGDataEventType, andPreviousSiblingKeyWith block: @escaping @Sendable (WDGDataSnapshot, String?) -> Void,
        withCancel cancelBlock: (@Sendable (any Error) -> Void)? = nil
    ) {
        databaseQuery.observeSingleEvent(of: eventType, andPreviousSiblingKeyWith: block, withCancel: cancelling(cancelBlock))
    }

    public func removeObserver(withHandle handle: WDGSyncHandle) { base.removeObserver(withHandle: handle) }
    public func removeAllObservers() { databaseQuery.removeAllObservers() }
    public func keepSynced(_ keepSynced: Bool) { databaseQuery.keepSynced(keepSynced) }
}

// MARK: - WDGSyncReference

/// Wilddog's `WDGSyncReference`: a `DatabaseReference` under Wilddog's names.
public final class WDGSyncReference: WDGSyncQuery, CustomStringConvertible, @unchecked Sendable {
    /// The reference in the current API.
    public let reference: DatabaseReference

    init(_ reference: DatabaseReference, sync: WDGSync) {
        self.reference = reference
        super.init(reference, sync: sync)
    }

    public override var ref: WDGSyncReference { self }

    public var parent: WDGSyncReference? { reference.parent.map { WDGSyncReference($0, sync: sync) } }
    public var root: WDGSyncReference { WDGSyncReference(reference.root, sync: sync) }
    /// The last key of the path (nil at the root).
    public var key: String? { reference.key }
    public var url: String { reference.url }
    public var description: String { reference.url }

    public func child(_ pathString: String) -> WDGSyncReference { WDGSyncReference(reference.child(pathString), sync: sync) }
    /// Deprecated by Wilddog for `child(_:)`.
    public func child(byAppendingPath pathString: String) -> WDGSyncReference { child(pathString) }
    public func childByAutoId() -> WDGSyncReference { WDGSyncReference(reference.childByAutoId(), sync: sync) }

    // MARK: Class-level

    /// Closes the connection of every `WDGSync` until `goOnline()`.
    public static func goOffline() { WDGRegistry.shared.setOffline(true) }
    public static func goOnline() { WDGRegistry.shared.setOffline(false) }

    // MARK: Writing

    public typealias CompletionBlock = @Sendable ((any Error)?, WDGSyncReference) -> Void

    /// Runs `body` with a completion that reports as this sync does, or fails with Wilddog's
    /// bound when `values` exceed it.
    private func writing(_ values: [Any?], _ block: CompletionBlock?, _ body: (DatabaseReference.Completion?) -> Void) {
        let sync = self.sync
        if let refusal = sync.refusal(values) {
            if let block {
                let me = self
                sync.database.callbackQueue.async { block(refusal, me) }
            }
            return
        }
        body(block.map { b in { @Sendable e, r in b(sync.reported(e), WDGSyncReference(r, sync: sync)) } })
    }

    public func setValue(_ value: Any?) { setValue(value, withCompletionBlock: nil) }
    public func setValue(_ value: Any?, withCompletionBlock block: CompletionBlock?) {
        writing([value], block) { reference.setValue(value, withCompletionBlock: $0) }
    }
    public func setValue(_ value: Any?, andPriority priority: Any?) { setValue(value, andPriority: priority, withCompletionBlock: nil) }
    public func setValue(_ value: Any?, andPriority priority: Any?, withCompletionBlock block: CompletionBlock?) {
        writing([value], block) { reference.setValue(value, andPriority: priority, withCompletionBlock: $0) }
    }
    public func removeValue() { removeValue(completionBlock: nil) }
    public func removeValue(completionBlock block: CompletionBlock?) { writing([], block) { reference.removeValue(completionBlock: $0) } }

    public func setPriority(_ priority: Any?) { setPriority(priority, withCompletionBlock: nil) }

    /// Under `.wilddog`, a location without data takes no priority: the completion gets 26301
    /// (checked on the server's data: a transaction that sets the priority only where there is
    /// data). Under `.firebase` the node refuses it too, as `failure` (docs/data-model.md).
    public func setPriority(_ priority: Any?, withCompletionBlock block: CompletionBlock?) {
        guard sync.wilddog else { return writing([], block) { reference.setPriority(priority, withCompletionBlock: $0) } }
        let sync = self.sync
        let me = self
        guard let p = ValueCoding.priorityValue(priority) else {
            if let block {
                let e = DatabaseError(code: "invalid_data", message: "a priority is a number, a string or nil")
                sync.database.callbackQueue.async { block(sync.reported(e), me) }
            }
            return
        }
        reference.runTransactionBlock({ data in
            // No data: leave it so (null over null changes nothing) and report 26301 after.
            if data.value != nil { data.priority = ValueCoding.priority(p) }
            return .success(withValue: data)
        }, andCompletionBlock: { error, _, snapshot in
            guard let block else { return }
            if let error { return block(sync.reported(error), me) }
            if snapshot?.exists() ?? false { return block(nil, me) }
            block(
                WDGSyncError(
                    code: 26301, message: "Could not set priority on non-existent node",
                    underlying: DatabaseError(code: "invalid_priority", message: "there is no data at \(me.reference.path)")), me)
        }, withLocalEvents: true)
    }

    public func updateChildValues(_ values: [AnyHashable: Any]) { updateChildValues(values, withCompletionBlock: nil) }
    public func updateChildValues(_ values: [AnyHashable: Any], withCompletionBlock block: CompletionBlock?) {
        writing(Array(values.values), block) { reference.updateChildValues(values, withCompletionBlock: $0) }
    }

    // MARK: onDisconnect

    public func onDisconnectSetValue(_ value: Any?) { onDisconnectSetValue(value, withCompletionBlock: nil) }
    public func onDisconnectSetValue(_ value: Any?, withCompletionBlock block: CompletionBlock?) {
        writing([value], block) { reference.onDisconnectSetValue(value, withCompletionBlock: $0) }
    }
    public func onDisconnectSetValue(_ value: Any?, andPriority priority: Any?) { onDisconnectSetValue(value, andPriority: priority, withCompletionBlock: nil) }
    public func onDisconnectSetValue(_ value: Any?, andPriority priority: Any?, withCompletionBlock block: CompletionBlock?) {
        writing([value], block) { reference.onDisconnectSetValue(value, andPriority: priority, withCompletionBlock: $0) }
    }
    public func onDisconnectRemoveValue() { onDisconnectRemoveValue(completionBlock: nil) }
    public func onDisconnectRemoveValue(completionBlock block: CompletionBlock?) {
        writing([], block) { reference.onDisconnectRemoveValue(withCompletionBlock: $0) }
    }
    public func onDisconnectUpdateChildValues(_ values: [AnyHashable: Any]) { onDisconnectUpdateChildValues(values, withCompletionBlock: nil) }
    public func onDisconnectUpdateChildValues(_ values: [AnyHashable: Any], withCompletionBlock block: CompletionBlock?) {
        writing(Array(values.values), block) { reference.onDisconnectUpdateChildValues(values, withCompletionBlock: $0) }
    }
    public func cancelDisconnectOperations() { cancelDisconnectOperations(completionBlock: nil) }
    public func cancelDisconnectOperations(completionBlock block: CompletionBlock?) {
        writing([], block) { reference.cancelDisconnectOperations(withCompletionBlock: $0) }
    }

    // MARK: Transactions

    public func runTransactionBlock(_ block: @escaping @Sendable (WDGMutableData) -> WDGTransactionResult) {
        runTransactionBlock(block, andCompletionBlock: nil, withLocalEvents: true)
    }

    public func runTransactionBlock(
        _ block: @escaping @Sendable (WDGMutableData) -> WDGTransactionResult,
        andCompletionBlock completionBlock: @escaping @Sendable ((any Error)?, Bool, WDGDataSnapshot?) -> Void
    ) {
        runTransactionBlock(block, andCompletionBlock: completionBlock, withLocalEvents: true)
    }

    public func runTransactionBlock(
        _ block: @escaping @Sendable (WDGMutableData) -> WDGTransactionResult,
        andCompletionBlock completionBlock: (@Sendable ((any Error)?, Bool, WDGDataSnapshot?) -> Void)?, withLocalEvents localEvents: Bool
    ) {
        let sync = self.sync
        reference.runTransactionBlock(
            block, andCompletionBlock: completionBlock.map { c in { @Sendable e, committed, s in c(sync.reported(e), committed, s) } },
            withLocalEvents: localEvents)
    }
}

/// The Wilddog apps and the databases behind `WDGSync`: one database per URL.
final class WDGRegistry: @unchecked Sendable {
    static let shared = WDGRegistry()
    private let lock = NSLock()
    private var apps: [String: WDGApp] = [:]
    private var databases: [String: Database] = [:]
    private var syncs: [WDGOptions: WDGSync] = [:]
    private var offline = false

    func configure(_ name: String, _ options: WDGOptions) throws {
        guard URLComponents(string: options.syncURL)?.host != nil else {
            throw DatabaseError(code: "invalid_url", message: "expected http(s)://host[:port][?ns=name], got \(options.syncURL)")
        }
        try lock.withLock {
            guard apps[name] == nil else { throw DatabaseError(code: "app_exists", message: "an app named \(name) is configured already") }
            apps[name] = WDGApp(name: name, options: options)
        }
    }

    func app(_ name: String) -> WDGApp? { lock.withLock { apps[name] } }
    func allApps() -> [String: WDGApp] { lock.withLock { apps } }

    func sync(_ options: WDGOptions, app: WDGApp?) throws -> WDGSync {
        let (sync, startOffline): (WDGSync, Bool) = try lock.withLock {
            if let s = syncs[options] { return (s, false) }
            let database: Database
            let fresh: Bool
            if let d = databases[options.syncURL] {
                database = d
                fresh = false
            } else {
                database = try Database(url: options.syncURL)
                databases[options.syncURL] = database
                fresh = true
            }
            let s = WDGSync(database: database, options: options, app: app)
            syncs[options] = s
            return (s, fresh && offline)
        }
        if startOffline { sync.database.goOffline() }
        return sync
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
}
