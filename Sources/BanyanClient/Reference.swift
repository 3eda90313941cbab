public import BanyanTree
import Foundation

/// A location in the database (Firebase's `DatabaseReference`).
public struct DatabaseReference: Sendable, CustomStringConvertible {
    public let database: Database
    public let path: Path
    /// Set when the path given to `child(_:)` was not a valid Firebase path: every operation on
    /// this reference then fails with `invalid_path` (Firebase raises an exception instead).
    let pathError: String?

    init(database: Database, path: Path, pathError: String? = nil) {
        self.database = database
        self.path = path
        self.pathError = pathError
    }

    /// The last key of the path (nil at the root).
    public var key: String? { path.last?.string }
    public var parent: DatabaseReference? { path.parent.map { DatabaseReference(database: database, path: $0) } }
    public var root: DatabaseReference { DatabaseReference(database: database, path: .root) }

    public var url: String {
        let (host, port) = database.nodes[0]
        let p = path.isRoot ? "" : path.description.split(separator: "/").map { $0.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? String($0) }.joined(separator: "/")
        return "http://\(host):\(port)/\(p)?ns=\(database.namespace)"
    }

    public var description: String { url }

    /// A location below this one (`"a/b"` walks several levels).
    public func child(_ pathString: String) -> DatabaseReference {
        do {
            let relative = try Path(parsing: pathString)
            return DatabaseReference(database: database, path: path.appending(relative), pathError: pathError)
        } catch {
            return DatabaseReference(database: database, path: path, pathError: "invalid path '\(pathString)': \(error)")
        }
    }

    /// A child with a new push id (chronological, unique).
    public func childByAutoId() -> DatabaseReference { child(database.nextPushID()) }

    // MARK: - Writing

    /// Sets the value here (`nil` or `NSNull` removes it). The block runs once the server
    /// committed the write (or refused it).
    public func setValue(_ value: Any?, withCompletionBlock block: (@Sendable ((any Error)?, DatabaseReference) -> Void)? = nil) {
        let ref = self
        if let pathError { return fail(block, DatabaseError(code: "invalid_path", message: pathError)) }
        let json: [UInt8]
        do {
            json = try ValueCoding.json(value)
        } catch {
            return fail(block, error)
        }
        database.set(path, json: json, completion: Self.completion(block, ref))
    }

    public func setValue(_ value: Any?) async throws {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
            setValue(value) { error, _ in if let error { c.resume(throwing: error) } else { c.resume() } }
        }
    }

    public func removeValue(completionBlock block: (@Sendable ((any Error)?, DatabaseReference) -> Void)? = nil) { setValue(nil, withCompletionBlock: block) }

    public func removeValue() async throws { try await setValue(nil) }

    /// Writes several children at once, atomically; keys may be paths (`"a/b"`).
    public func updateChildValues(_ values: [String: Any], withCompletionBlock block: (@Sendable ((any Error)?, DatabaseReference) -> Void)? = nil) {
        let ref = self
        if let pathError { return fail(block, DatabaseError(code: "invalid_path", message: pathError)) }
        var children: [(Path, [UInt8])] = []
        do {
            for key in values.keys.sorted() {
                children.append((try Path(parsing: key), try ValueCoding.json(values[key] ?? nil)))
            }
        } catch {
            return fail(block, DatabaseError(code: "invalid_data", message: "\(error)"))
        }
        database.update(path, children: children, completion: Self.completion(block, ref))
    }

    public func updateChildValues(_ values: [String: Any]) async throws {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
            updateChildValues(values) { error, _ in if let error { c.resume(throwing: error) } else { c.resume() } }
        }
    }

    private static func completion(
        _ block: (@Sendable ((any Error)?, DatabaseReference) -> Void)?, _ ref: DatabaseReference
    ) -> (@Sendable (DatabaseError?) -> Void)? {
        guard let block else { return nil }
        return { @Sendable (e: DatabaseError?) in block(e, ref) }
    }

    private func fail(_ block: (@Sendable ((any Error)?, DatabaseReference) -> Void)?, _ error: any Error) {
        let ref = self
        if let block { database.callbackQueue.async { block(error, ref) } }
    }

    // MARK: - Reading

    /// Calls `block` with the value here now and after every change, until the handle is removed.
    @discardableResult
    public func observe(_ eventType: DataEventType, with block: @escaping @Sendable (DataSnapshot) -> Void) -> UInt {
        observe(eventType, with: block, withCancel: nil)
    }

    @discardableResult
    public func observe(
        _ eventType: DataEventType, with block: @escaping @Sendable (DataSnapshot) -> Void, withCancel cancel: (@Sendable (any Error) -> Void)?
    ) -> UInt {
        if let pathError {
            if let cancel { database.callbackQueue.async { cancel(DatabaseError(code: "invalid_path", message: pathError)) } }
            return 0
        }
        let relay: (@Sendable (DatabaseError) -> Void)? = cancel.map { c in { @Sendable (e: DatabaseError) in c(e) } }
        return database.observe(self, once: false, block: block, cancel: relay)
    }

    /// Calls `block` once, with the value here.
    public func observeSingleEvent(of eventType: DataEventType, with block: @escaping @Sendable (DataSnapshot) -> Void) {
        guard pathError == nil else { return }
        _ = database.observe(self, once: true, block: block, cancel: nil)
    }

    public func removeObserver(withHandle handle: UInt) { database.removeObserver(handle) }

    public func removeAllObservers() { database.removeAllObservers(at: path) }

    /// The server's value here now (from synced data when offline).
    public func getData(completion block: @escaping @Sendable ((any Error)?, DataSnapshot?) -> Void) {
        let ref = self
        if let pathError { return database.callbackQueue.async { block(DatabaseError(code: "invalid_path", message: pathError), nil) } }
        database.get(path) { result in
            switch result {
            case .success(let tree): block(nil, DataSnapshot(reference: ref, tree: tree))
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

/// The value at a location at one moment (Firebase's `DataSnapshot`).
public struct DataSnapshot: Sendable {
    public let ref: DatabaseReference
    let tree: Tree

    init(reference: DatabaseReference, tree: Tree) {
        ref = reference
        self.tree = tree
    }

    public var key: String? { ref.key }
    /// The value as Foundation-style types: `[String: Any]`, `[Any]` (for Firebase's array-like
    /// objects), `String`, `Bool`, `Int`, `Double`, or nil when nothing is here.
    public var value: Any? { ValueCoding.value(tree) }
    public var priority: Any? {
        switch tree.priority {
        case .none: nil
        case .number(let d): d
        case .string(let s): s
        }
    }
    public func exists() -> Bool { !tree.isEmpty }
    public var childrenCount: Int { tree.childCount }
    public func hasChildren() -> Bool { tree.hasChildren }
    public func hasChild(_ path: String) -> Bool { (try? Path(parsing: path)).map { !tree.child(at: $0).isEmpty } ?? false }

    public func childSnapshot(forPath path: String) -> DataSnapshot {
        guard let p = try? Path(parsing: path) else { return DataSnapshot(reference: ref.child(path), tree: .empty) }
        return DataSnapshot(reference: ref.child(path), tree: tree.child(at: p))
    }

    /// The children in key order.
    public var children: [DataSnapshot] {
        tree.children.elements().map { key, child in DataSnapshot(reference: ref.child(key.string), tree: child) }
    }

    /// The value with priorities, as Firebase's export format (`.value` / `.priority`).
    public func valueInExportFormat() -> Any? {
        try? JSONSerialization.jsonObject(with: Data(JSONWriter.bytes(tree, format: .export)), options: [.fragmentsAllowed])
    }
}

/// Swift values to the wire's JSON, and trees back to Foundation-style values.
enum ValueCoding {
    static func json(_ value: Any?) throws -> [UInt8] {
        guard let value, !(value is NSNull) else { return Array("null".utf8) }
        do {
            return Array(try JSONSerialization.data(withJSONObject: value, options: [.fragmentsAllowed]))
        } catch {
            throw DatabaseError(code: "invalid_data", message: "cannot store a value of type \(type(of: value)) (use dictionaries, arrays, strings, numbers and booleans)")
        }
    }

    static func value(_ tree: Tree) -> Any? {
        if let leaf = tree.leaf {
            switch leaf {
            case .bool(let b): return b
            case .int(let i): return Int(i)
            case .double(let d): return d
            case .string(let s): return s
            }
        }
        guard tree.hasChildren else { return nil }
        let elements = Array(tree.children.elements())
        // Firebase's arrays: every key a non-negative integer and more than half of 0...max present.
        var maxIndex = -1
        var allIndexes = true
        for (key, _) in elements {
            guard let i = key.intValue, i >= 0 else {
                allIndexes = false
                break
            }
            maxIndex = max(maxIndex, Int(i))
        }
        if allIndexes, maxIndex >= 0, elements.count * 2 > maxIndex + 1 {
            var array = [Any](repeating: NSNull(), count: maxIndex + 1)
            for (key, child) in elements { if let i = key.intValue { array[Int(i)] = value(child) ?? NSNull() } }
            return array
        }
        var dictionary: [String: Any] = [:]
        for (key, child) in elements { dictionary[key.string] = value(child) ?? NSNull() }
        return dictionary
    }
}

/// Server values (Firebase's `ServerValue`).
public enum ServerValue {
    public static func timestamp() -> [String: Any] { [".sv": "timestamp"] }
    public static func increment(_ delta: Double) -> [String: Any] { [".sv": ["increment": delta]] }
    public static func increment(_ delta: Int) -> [String: Any] { [".sv": ["increment": delta]] }
}
