import BanyanClientCore
public import BanyanQuery
public import BanyanTree
import Foundation

/// A location and a query over its children (Firebase's `DatabaseQuery`): observe it, read it
/// once, or narrow it further. A query built with invalid arguments does not raise an exception
/// as Firebase's does: it carries the error (`queryError`, with Firebase's message), and
/// observing or reading it calls the cancel or completion block with `invalid_query`.
public class DatabaseQuery: @unchecked Sendable {
    public let database: Database
    public let path: Path
    let query: Query
    /// Why this query (or its reference's path) is not valid, if it is not.
    public let queryError: DatabaseError?

    init(database: Database, path: Path, query: Query = Query(), error: DatabaseError? = nil) {
        self.database = database
        self.path = path
        self.query = query
        queryError = error
    }

    /// The query's parameters (ordering, range, limit).
    public var params: QueryParams { query.params }

    /// The reference to this query's location.
    public var ref: DatabaseReference { DatabaseReference(database: database, path: path, error: queryError) }

    // MARK: - Narrowing

    /// Firebase's iOS SDK checks each call's arguments and raises with its own message; this
    /// query keeps the message (`queryError`) instead. `check` gives the iOS SDK's message for
    /// what it checks before building; the builder's endpoint checks are worded as the iOS SDK
    /// words them (`IOSQueryMessages`), anything else as the builder does.
    private func narrowed(check: () -> String? = { nil }, _ build: (Query) throws(QueryError) -> Query) -> DatabaseQuery {
        guard queryError == nil else { return DatabaseQuery(database: database, path: path, query: query, error: queryError) }
        if let message = check() { return failed(message) }
        do {
            return DatabaseQuery(database: database, path: path, query: try build(query))
        } catch {
            return failed(IOSQueryMessages.endpoint(error.kind) ?? error.message)
        }
    }

    private func failed(_ message: String) -> DatabaseQuery {
        DatabaseQuery(database: database, path: path, query: query, error: DatabaseError(code: "invalid_query", message: message))
    }

    public func queryOrdered(byChild key: String) -> DatabaseQuery {
        narrowed(check: { IOSQueryMessages.orderByChild(key, alreadyOrdered: query.isOrdered) }) { q throws(QueryError) in try q.orderByChild(key) }
    }
    public func queryOrderedByKey() -> DatabaseQuery { ordered { q throws(QueryError) in try q.orderByKey() } }
    public func queryOrderedByValue() -> DatabaseQuery { ordered { q throws(QueryError) in try q.orderByValue() } }
    public func queryOrderedByPriority() -> DatabaseQuery { ordered { q throws(QueryError) in try q.orderByPriority() } }
    public func queryLimited(toFirst limit: UInt) -> DatabaseQuery {
        narrowed(check: { IOSQueryMessages.limit(limit, first: true, alreadySet: query.params.limit != nil) }) { q throws(QueryError) in
            try q.limitToFirst(Int(clamping: limit))
        }
    }
    public func queryLimited(toLast limit: UInt) -> DatabaseQuery {
        narrowed(check: { IOSQueryMessages.limit(limit, first: false, alreadySet: query.params.limit != nil) }) { q throws(QueryError) in
            try q.limitToLast(Int(clamping: limit))
        }
    }

    private func ordered(_ build: (Query) throws(QueryError) -> Query) -> DatabaseQuery {
        narrowed(check: { query.isOrdered ? IOSQueryMessages.multipleOrderings : nil }, build)
    }

    public func queryStarting(atValue value: Any?) -> DatabaseQuery {
        bound(value, nil, .startAt, "queryStartingAtValue:") { q, v, k throws(QueryError) in try q.startAt(v, key: k) }
    }
    public func queryStarting(atValue value: Any?, childKey: String?) -> DatabaseQuery {
        bound(value, childKey, .startAt, "queryStartingAtValue:childKey:") { q, v, k throws(QueryError) in try q.startAt(v, key: k) }
    }
    public func queryStarting(afterValue value: Any?) -> DatabaseQuery {
        bound(value, nil, .startAfter, "queryStartingAfterValue:childKey:") { q, v, k throws(QueryError) in try q.startAfter(v, key: k) }
    }
    public func queryStarting(afterValue value: Any?, childKey: String?) -> DatabaseQuery {
        bound(value, childKey, .startAfter, "queryStartingAfterValue:childKey:") { q, v, k throws(QueryError) in try q.startAfter(v, key: k) }
    }
    public func queryEnding(atValue value: Any?) -> DatabaseQuery {
        bound(value, nil, .endAt, "queryEndingAtValue:") { q, v, k throws(QueryError) in try q.endAt(v, key: k) }
    }
    public func queryEnding(atValue value: Any?, childKey: String?) -> DatabaseQuery {
        bound(value, childKey, .endAt, "queryEndingAtValue:childKey:") { q, v, k throws(QueryError) in try q.endAt(v, key: k) }
    }
    public func queryEnding(beforeValue value: Any?) -> DatabaseQuery {
        bound(value, nil, .endBefore, "queryEndingBeforeValue:childKey:") { q, v, k throws(QueryError) in try q.endBefore(v, key: k) }
    }
    public func queryEnding(beforeValue value: Any?, childKey: String?) -> DatabaseQuery {
        bound(value, childKey, .endBefore, "queryEndingBeforeValue:childKey:") { q, v, k throws(QueryError) in try q.endBefore(v, key: k) }
    }
    public func queryEqual(toValue value: Any?) -> DatabaseQuery {
        bound(value, nil, .equalTo, "queryEqualToValue:") { q, v, k throws(QueryError) in try q.equalTo(v, key: k) }
    }
    public func queryEqual(toValue value: Any?, childKey: String?) -> DatabaseQuery {
        bound(value, childKey, .equalTo, "queryEqualToValue:childKey:") { q, v, k throws(QueryError) in try q.equalTo(v, key: k) }
    }

    private func bound(
        _ value: Any?, _ key: String?, _ call: IOSQueryMessages.Bound, _ method: String, _ build: (Query, Tree, String?) throws(QueryError) -> Query
    ) -> DatabaseQuery {
        let leaf: Tree
        switch value {
        case nil, is NSNull: leaf = .empty
        case let b as Bool: leaf = Tree(.bool(b))
        case let s as String: leaf = Tree(.string(s))
        case let i as Int: leaf = Tree(.int(Int64(i)))
        case let d as Double: leaf = d.rounded() == d && abs(d) < 9.0e15 ? Tree(.int(Int64(d))) : Tree(.double(d))
        case let n as NSNumber: leaf = Tree(.double(n.doubleValue))
        default:
            return queryError.map { DatabaseQuery(database: database, path: path, query: query, error: $0) } ?? failed(IOSQueryMessages.valueType(method))
        }
        let state = IOSQueryMessages.State(keyOrdered: query.params.index == .key && query.isOrdered, hasStart: query.hasStart, hasEnd: query.hasEnd)
        return narrowed(check: { IOSQueryMessages.bound(call, method: method, childKey: key, state) }) { q throws(QueryError) in try build(q, leaf, key) }
    }

    // MARK: - Observing

    /// Calls `block` for each event of `eventType`, until the handle is removed.
    @discardableResult
    public func observe(_ eventType: DataEventType, with block: @escaping @Sendable (DataSnapshot) -> Void) -> DatabaseHandle {
        observe(eventType, with: block, withCancel: nil)
    }

    @discardableResult
    public func observe(
        _ eventType: DataEventType, with block: @escaping @Sendable (DataSnapshot) -> Void, withCancel cancel: (@Sendable (any Error) -> Void)?
    ) -> DatabaseHandle {
        register(eventType, once: false, block: { snapshot, _ in block(snapshot) }, cancel: cancel)
    }

    /// As `observe(_:with:)`, with the key of the previous sibling in the query's order.
    @discardableResult
    public func observe(_ eventType: DataEventType, andPreviousSiblingKeyWith block: @escaping @Sendable (DataSnapshot, String?) -> Void) -> DatabaseHandle {
        observe(eventType, andPreviousSiblingKeyWith: block, withCancel: nil)
    }

    @discardableResult
    public func observe(
        _ eventType: DataEventType, andPreviousSiblingKeyWith block: @escaping @Sendable (DataSnapshot, String?) -> Void,
        withCancel cancel: (@Sendable (any Error) -> Void)?
    ) -> DatabaseHandle {
        register(eventType, once: false, block: block, cancel: cancel)
    }

    /// Calls `block` once, for the first event of `eventType`.
    public func observeSingleEvent(of eventType: DataEventType, with block: @escaping @Sendable (DataSnapshot) -> Void) {
        observeSingleEvent(of: eventType, with: block, withCancel: nil)
    }

    public func observeSingleEvent(
        of eventType: DataEventType, with block: @escaping @Sendable (DataSnapshot) -> Void, withCancel cancel: (@Sendable (any Error) -> Void)?
    ) {
        register(eventType, once: true, block: { snapshot, _ in block(snapshot) }, cancel: cancel)
    }

    public func observeSingleEvent(of eventType: DataEventType, andPreviousSiblingKeyWith block: @escaping @Sendable (DataSnapshot, String?) -> Void) {
        observeSingleEvent(of: eventType, andPreviousSiblingKeyWith: block, withCancel: nil)
    }

    public func observeSingleEvent(
        of eventType: DataEventType, andPreviousSiblingKeyWith block: @escaping @Sendable (DataSnapshot, String?) -> Void,
        withCancel cancel: (@Sendable (any Error) -> Void)?
    ) {
        register(eventType, once: true, block: block, cancel: cancel)
    }

    /// The first event of `eventType`.
    public func observeSingleEvent(of eventType: DataEventType) async throws -> DataSnapshot {
        try await observeSingleEventAndPreviousSiblingKey(of: eventType).0
    }

    public func observeSingleEventAndPreviousSiblingKey(of eventType: DataEventType) async throws -> (DataSnapshot, String?) {
        try await withCheckedThrowingContinuation { c in
            register(eventType, once: true, block: { s, p in c.resume(returning: (s, p)) }, cancel: { e in c.resume(throwing: e) })
        }
    }

    /// The events of `eventType` as an asynchronous sequence of snapshots (with the previous
    /// sibling's key); ending the iteration removes the observer, and a cancelled listen ends it
    /// with the error.
    public func events(of eventType: DataEventType) -> AsyncThrowingStream<(snapshot: DataSnapshot, previousSiblingKey: String?), any Error> {
        AsyncThrowingStream { continuation in
            let handle = register(
                eventType, once: false, block: { s, p in continuation.yield((s, p)) }, cancel: { e in continuation.finish(throwing: e) })
            let database = self.database
            continuation.onTermination = { _ in database.removeObserver(handle) }
        }
    }

    /// The snapshots of `eventType` events as an asynchronous sequence.
    public func snapshots(of eventType: DataEventType = .value) -> AsyncThrowingStream<DataSnapshot, any Error> {
        AsyncThrowingStream { continuation in
            let handle = register(
                eventType, once: false, block: { s, _ in continuation.yield(s) }, cancel: { e in continuation.finish(throwing: e) })
            let database = self.database
            continuation.onTermination = { _ in database.removeObserver(handle) }
        }
    }

    @discardableResult
    func register(
        _ eventType: DataEventType, once: Bool, block: @escaping @Sendable (DataSnapshot, String?) -> Void, cancel: (@Sendable (any Error) -> Void)?
    ) -> DatabaseHandle {
        if let queryError {
            if let cancel { database.callbackQueue.async { cancel(queryError) } }
            return 0
        }
        return database.observe(self, type: eventType, once: once, block: block, cancel: cancel)
    }

    public func removeObserver(withHandle handle: DatabaseHandle) { database.removeObserver(handle) }

    /// Removes every observer of this query (observers of other queries and of locations below
    /// stay).
    public func removeAllObservers() { database.removeAllObservers(path: path, query: params.identifier) }

    /// Keeps this location's data synced (and in the disk cache) without an observer.
    public func keepSynced(_ keepSynced: Bool) {
        guard queryError == nil else { return }
        database.keepSynced(path, keepSynced)
    }

    // MARK: - Reading once

    /// The server's data for this query now (from synced data when offline).
    public func getData(completion block: @escaping @Sendable ((any Error)?, DataSnapshot?) -> Void) {
        if let queryError { return database.callbackQueue.async { block(queryError, nil) } }
        let ref = self.ref
        let index = params.index
        database.get(path, params: params) { result in
            switch result {
            case .success(let tree): block(nil, DataSnapshot(reference: ref, tree: tree, index: index))
            case .failure(let e): block(e, nil)
            }
        }
    }

    public func getData() async throws -> DataSnapshot {
        try await withCheckedThrowingContinuation { c in
            getData { error, snapshot in
                if let snapshot { c.resume(returning: snapshot) } else { c.resume(throwing: error ?? DatabaseError(code: "unknown", message: "")) }
            }
        }
    }
}
