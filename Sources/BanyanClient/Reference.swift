import BanyanClientCore
import BanyanQuery
import BanyanTree
public import Foundation

/// A location in the database (Firebase's `DatabaseReference`): read it as a query, write it,
/// run transactions and register onDisconnect writes there. An invalid path does not raise an
/// exception as in Firebase: the reference carries the error (`queryError`, `invalid_path`) and
/// every operation on it fails with it.
public final class DatabaseReference: DatabaseQuery, CustomStringConvertible, @unchecked Sendable {
    init(database: Database, path: Path, error: DatabaseError? = nil) {
        super.init(database: database, path: path, error: error)
    }

    /// The reference itself (a reference is its own location's plain query).
    public override var ref: DatabaseReference { self }

    /// The last key of the path (nil at the root).
    public var key: String? { path.last?.string }
    public var parent: DatabaseReference? { path.parent.map { DatabaseReference(database: database, path: $0, error: queryError) } }
    public var root: DatabaseReference { DatabaseReference(database: database, path: .root, error: queryError) }

    /// The location's URL (of the first node, in the Firebase emulator's form).
    public var url: String {
        let (host, port) = database.nodes[0]
        let p = path.isRoot ? "" : path.segments.map { $0.string.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? $0.string }.joined(separator: "/")
        return "\(database.scheme)://\(host):\(port)/\(p)?ns=\(database.namespace)"
    }

    public var description: String { url }

    /// A location below this one (`"a/b"` walks several levels). `.info/connected` and
    /// `.info/serverTimeOffset` are the client's own state.
    public func child(_ pathString: String) -> DatabaseReference {
        if path.isRoot, let info = Self.infoPath(pathString) { return DatabaseReference(database: database, path: info, error: queryError) }
        do {
            let relative = try Path(parsing: pathString)
            let full = path.appending(relative)
            try full.checkLimits()
            return DatabaseReference(database: database, path: full, error: queryError)
        } catch {
            return DatabaseReference(database: database, path: path, error: queryError ?? DatabaseError(code: "invalid_path", message: "invalid path '\(pathString)': \(error)"))
        }
    }

    static func infoPath(_ text: String) -> Path? {
        let parts = text.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
        guard parts.first == ".info", parts.count <= 2 else { return nil }
        return Path(segments: parts.map { ChildKey(unchecked: $0) })
    }

    /// A child with a new push id (chronological, unique).
    public func childByAutoId() -> DatabaseReference { child(database.nextPushID()) }

    // MARK: - Writing

    public typealias Completion = @Sendable ((any Error)?, DatabaseReference) -> Void

    /// Sets the value here (`nil` or `NSNull` removes it). The block runs once the server
    /// committed the write (or refused it).
    public func setValue(_ value: Any?, withCompletionBlock block: Completion? = nil) {
        write(block) { try ValueCoding.json(value) } perform: { db, json, done in db.set(self.path, json: json, completion: done) }
    }

    /// Sets the value and its priority.
    public func setValue(_ value: Any?, andPriority priority: Any?, withCompletionBlock block: Completion? = nil) {
        write(block) { try ValueCoding.json(value, priority: priority) } perform: { db, json, done in db.set(self.path, json: json, completion: done) }
    }

    /// Sets the value from an `Encodable` (through its JSON form).
    public func setValue<T: Encodable>(from value: T, encoder: JSONEncoder = JSONEncoder(), completion block: Completion? = nil) throws {
        let json: [UInt8]
        do {
            json = Array(try encoder.encode(value))
        } catch {
            throw DatabaseError(code: "invalid_data", message: "\(error)")
        }
        write(block) { json } perform: { db, json, done in db.set(self.path, json: json, completion: done) }
    }

    /// The async form: returns once the server committed the write.
    @discardableResult
    public func setValue<T: Encodable>(from value: T, encoder: JSONEncoder = JSONEncoder()) async throws -> DatabaseReference {
        let json: [UInt8]
        do {
            json = Array(try encoder.encode(value))
        } catch {
            throw DatabaseError(code: "invalid_data", message: "\(error)")
        }
        return try await awaiting { done in write(done) { json } perform: { db, json, d in db.set(self.path, json: json, completion: d) } }
    }

    public func removeValue(completionBlock block: Completion? = nil) { setValue(nil, withCompletionBlock: block) }

    /// Sets the priority of the data here (a number, a string, or nil).
    public func setPriority(_ priority: Any?, withCompletionBlock block: Completion? = nil) {
        write(block) {
            guard ValueCoding.priorityValue(priority) != nil else { throw DatabaseError(code: "invalid_data", message: "a priority is a number, a string or nil") }
            return try ValueCoding.json(priority)
        } perform: { db, json, done in db.setPriority(self.path, json: json, completion: done) }
    }

    /// Writes several children at once, atomically; keys may be paths (`"a/b"`).
    public func updateChildValues(_ values: [AnyHashable: Any], withCompletionBlock block: Completion? = nil) {
        let children: [(Path, [UInt8])]
        do {
            children = try Self.children(values)
        } catch {
            return fail(block, error)
        }
        write(block) { [] } perform: { db, _, done in db.update(self.path, children: children, completion: done) }
    }

    static func children(_ values: [AnyHashable: Any]) throws -> [(Path, [UInt8])] {
        var children: [(Path, [UInt8])] = []
        for (key, value) in values {
            guard let name = key.base as? String else { throw DatabaseError(code: "invalid_data", message: "update keys must be strings, got \(key)") }
            do {
                children.append((try Path(parsing: name), try ValueCoding.json(value)))
            } catch let e as DatabaseError {
                throw e
            } catch {
                throw DatabaseError(code: "invalid_path", message: "invalid key '\(name)': \(error)")
            }
        }
        return children.sorted { $0.0 < $1.0 }
    }

    // The async forms throw the write's error and return the reference.
    @discardableResult
    public func setValue(_ value: Any?) async throws -> DatabaseReference { try await awaiting { setValue(value, withCompletionBlock: $0) } }
    @discardableResult
    public func setValue(_ value: Any?, andPriority priority: Any?) async throws -> DatabaseReference {
        try await awaiting { setValue(value, andPriority: priority, withCompletionBlock: $0) }
    }
    @discardableResult
    public func removeValue() async throws -> DatabaseReference { try await awaiting { removeValue(completionBlock: $0) } }
    @discardableResult
    public func setPriority(_ priority: Any?) async throws -> DatabaseReference { try await awaiting { setPriority(priority, withCompletionBlock: $0) } }
    @discardableResult
    public func updateChildValues(_ values: [AnyHashable: Any]) async throws -> DatabaseReference {
        try await awaiting { updateChildValues(values, withCompletionBlock: $0) }
    }

    func awaiting(_ start: (@escaping Completion) -> Void) async throws -> DatabaseReference {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<DatabaseReference, any Error>) in
            start { error, ref in if let error { c.resume(throwing: error) } else { c.resume(returning: ref) } }
        }
    }

    private func write(
        _ block: Completion?, json: () throws -> [UInt8], perform: (Database, [UInt8], (@Sendable (DatabaseError?) -> Void)?) -> Void
    ) {
        if let queryError { return fail(block, queryError) }
        if path.first?.string == ".info" { return fail(block, DatabaseError(code: "invalid_path", message: "the .info locations are read-only")) }
        do {
            let bytes = try json()
            let ref = self
            perform(database, bytes, block.map { b in { @Sendable (e: DatabaseError?) in b(e, ref) } })
        } catch {
            fail(block, error)
        }
    }

    func fail(_ block: Completion?, _ error: any Error) {
        let ref = self
        if let block { database.callbackQueue.async { block(error, ref) } }
    }

    // MARK: - Transactions

    /// Runs `block` on the current data here and writes what it returns, atomically: if the data
    /// changed on the server meanwhile, the block runs again on the new data (at most 25 times).
    /// The block may run several times, on the database's own thread: keep it quick and free of
    /// side effects.
    public func runTransactionBlock(_ block: @escaping @Sendable (MutableData) -> TransactionResult) {
        runTransactionBlock(block, andCompletionBlock: nil, withLocalEvents: true)
    }

    public func runTransactionBlock(
        _ block: @escaping @Sendable (MutableData) -> TransactionResult, andCompletionBlock completion: (@Sendable ((any Error)?, Bool, DataSnapshot?) -> Void)?
    ) {
        runTransactionBlock(block, andCompletionBlock: completion, withLocalEvents: true)
    }

    /// `withLocalEvents`: whether the block's tentative results raise local events before the
    /// server commits them.
    public func runTransactionBlock(
        _ block: @escaping @Sendable (MutableData) -> TransactionResult, andCompletionBlock completion: (@Sendable ((any Error)?, Bool, DataSnapshot?) -> Void)?,
        withLocalEvents: Bool
    ) {
        if let queryError {
            if let completion { database.callbackQueue.async { completion(queryError, false, nil) } }
            return
        }
        let ref = self
        database.transaction(path, applyLocally: withLocalEvents, update: { tree in
            let data = MutableData(tree: tree)
            let result = block(data)
            if let error = data.box.error { return .invalid(error.message) }
            guard result.data != nil else { return .abort }
            return .commit(JSONWriter.bytes(data.box.tree, format: .export))
        }) { outcome in
            let error = outcome.error.map { DatabaseError(code: $0.code, message: $0.message) }
            completion?(error, outcome.committed, DataSnapshot(reference: ref, tree: outcome.snapshot))
        }
    }

    /// The transaction's outcome: whether it committed, and the data here then.
    public func runTransactionBlock(_ block: @escaping @Sendable (MutableData) -> TransactionResult) async throws -> (Bool, DataSnapshot) {
        try await withCheckedThrowingContinuation { c in
            runTransactionBlock(block, andCompletionBlock: { error, committed, snapshot in
                if let error { c.resume(throwing: error) } else if let snapshot { c.resume(returning: (committed, snapshot)) } else {
                    c.resume(throwing: DatabaseError(code: "unknown", message: "no snapshot"))
                }
            }, withLocalEvents: true)
        }
    }

    // MARK: - onDisconnect

    /// Sets the value here when this client's connection ends (the server does it, whatever the
    /// reason: a clean close, a lost network, a crash).
    public func onDisconnectSetValue(_ value: Any?, withCompletionBlock block: Completion? = nil) {
        write(block) { try ValueCoding.json(value) } perform: { db, json, done in db.onDisconnectSet(self.path, json: json, completion: done) }
    }

    public func onDisconnectSetValue(_ value: Any?, andPriority priority: Any?, withCompletionBlock block: Completion? = nil) {
        write(block) { try ValueCoding.json(value, priority: priority) } perform: { db, json, done in db.onDisconnectSet(self.path, json: json, completion: done) }
    }

    public func onDisconnectRemoveValue(withCompletionBlock block: Completion? = nil) { onDisconnectSetValue(nil, withCompletionBlock: block) }

    public func onDisconnectUpdateChildValues(_ values: [AnyHashable: Any], withCompletionBlock block: Completion? = nil) {
        let children: [(Path, [UInt8])]
        do {
            children = try Self.children(values)
        } catch {
            return fail(block, error)
        }
        write(block) { [] } perform: { db, _, done in db.onDisconnectUpdate(self.path, children: children, completion: done) }
    }

    /// Cancels the onDisconnect writes registered at and below this location.
    public func cancelDisconnectOperations(withCompletionBlock block: Completion? = nil) {
        write(block) { [] } perform: { db, _, done in db.onDisconnectCancel(self.path, completion: done) }
    }

    @discardableResult
    public func onDisconnectSetValue(_ value: Any?) async throws -> DatabaseReference { try await awaiting { onDisconnectSetValue(value, withCompletionBlock: $0) } }
    @discardableResult
    public func onDisconnectSetValue(_ value: Any?, andPriority priority: Any?) async throws -> DatabaseReference {
        try await awaiting { onDisconnectSetValue(value, andPriority: priority, withCompletionBlock: $0) }
    }
    @discardableResult
    public func onDisconnectRemoveValue() async throws -> DatabaseReference { try await awaiting { onDisconnectRemoveValue(withCompletionBlock: $0) } }
    @discardableResult
    public func onDisconnectUpdateChildValues(_ values: [AnyHashable: Any]) async throws -> DatabaseReference {
        try await awaiting { onDisconnectUpdateChildValues(values, withCompletionBlock: $0) }
    }
    @discardableResult
    public func cancelDisconnectOperations() async throws -> DatabaseReference { try await awaiting { cancelDisconnectOperations(withCompletionBlock: $0) } }
}
