import BanyanTree
import BanyanQuery
public import Foundation

/// An error as Firebase reports it to completion and cancel blocks: its code
/// (`permission_denied`, `disconnected`, `datastale`, `maxretries`, `overriddenBySet`,
/// `invalid_path`, `invalid_data`, …) and message.
public struct DatabaseError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    public let code: String
    public let message: String
    public init(code: String, message: String) {
        self.code = code
        self.message = message
    }
    public var description: String { message.isEmpty ? code : "\(code): \(message)" }
    public var errorDescription: String? { description }
}

/// The kinds of events an observer asks for (Firebase's `DataEventType`).
public enum DataEventType: Int, Sendable, Hashable, CaseIterable {
    case childAdded, childRemoved, childChanged, childMoved, value
}

/// A handle that removes an observer (`removeObserver(withHandle:)`).
public typealias DatabaseHandle = UInt

/// The value at a location at one moment (Firebase's `DataSnapshot`). Children iterate in the
/// order of the query it came from (priority order for a plain location).
public struct DataSnapshot: Sendable, CustomStringConvertible {
    public let ref: DatabaseReference
    let tree: Tree
    let index: IndexKind

    init(reference: DatabaseReference, tree: Tree, index: IndexKind = .priority) {
        ref = reference
        self.tree = tree
        self.index = index
    }

    public var key: String? { ref.key }
    /// The value as Foundation-style types: `[String: Any]`, `[Any]` (for Firebase's array-like
    /// objects), `String`, `Bool`, `Int`, `Double`, or nil when nothing is here.
    public var value: Any? { ValueCoding.value(tree) }
    /// The priority: a `Double`, a `String`, or nil.
    public var priority: Any? { ValueCoding.priority(tree.priority) }
    public func exists() -> Bool { !tree.isEmpty }
    public var childrenCount: UInt { UInt(tree.childCount) }
    public func hasChildren() -> Bool { tree.hasChildren }
    public func hasChild(_ path: String) -> Bool { (try? Path(parsing: path)).map { !tree.child(at: $0).isEmpty } ?? false }

    public func childSnapshot(forPath path: String) -> DataSnapshot {
        guard let p = try? Path(parsing: path) else { return DataSnapshot(reference: ref.child(path), tree: .empty) }
        return DataSnapshot(reference: ref.child(path), tree: tree.child(at: p))
    }

    /// The children in the snapshot's order.
    public var children: [DataSnapshot] {
        var params = QueryParams()
        params.index = index
        return params.orderedChildren(of: tree).map { DataSnapshot(reference: ref.child($0.key.string), tree: $0.tree) }
    }

    /// The value with priorities, as Firebase's export format (`.value` / `.priority`).
    public func valueInExportFormat() -> Any? {
        guard !tree.isEmpty else { return nil }
        return try? JSONSerialization.jsonObject(with: Data(JSONWriter.bytes(tree, format: .export)), options: [.fragmentsAllowed])
    }

    /// The value decoded as `T` (through its JSON form).
    public func data<T: Decodable>(as type: T.Type, decoder: JSONDecoder = JSONDecoder()) throws -> T {
        try decoder.decode(T.self, from: Data(JSONWriter.bytes(tree, format: .plain)))
    }

    public var description: String { "Snap (\(key ?? "")) \(JSONWriter.string(tree, format: .export))" }
}

/// The data a transaction's block sees and changes (Firebase's `MutableData`). Children made
/// with `childData(byAppendingPath:)` write through to the transaction's data.
public final class MutableData: @unchecked Sendable, CustomStringConvertible {
    final class Box: @unchecked Sendable {
        var tree: Tree
        var error: DatabaseError?
        init(_ tree: Tree) { self.tree = tree }
    }
    let box: Box
    let path: Path

    init(tree: Tree) {
        box = Box(tree)
        path = .root
    }

    private init(box: Box, path: Path) {
        self.box = box
        self.path = path
    }

    /// The key of this data's location (nil at the transaction's own location).
    public var key: String? { path.last?.string }

    /// The value, as `DataSnapshot.value` gives it; setting it replaces the data here (nil
    /// removes it). A value that cannot be stored makes the transaction fail with `invalid_data`.
    public var value: Any? {
        get { ValueCoding.value(box.tree.child(at: path)) }
        set {
            do {
                let json = try ValueCoding.json(newValue)
                let subtree = try TreeReader.read(json, at: path)
                let priority = box.tree.child(at: path).priority
                box.tree.set(subtree.isEmpty || subtree.priority != .none ? subtree : subtree.withPriority(priority), at: path)
            } catch {
                box.error = DatabaseError(code: "invalid_data", message: "\(error)")
            }
        }
    }

    /// The priority (a number, a string or nil).
    public var priority: Any? {
        get { ValueCoding.priority(box.tree.child(at: path).priority) }
        set {
            guard let priority = ValueCoding.priorityValue(newValue) else {
                box.error = DatabaseError(code: "invalid_data", message: "a priority is a number, a string or nil")
                return
            }
            _ = box.tree.setPriority(priority, at: path)
        }
    }

    public var childrenCount: UInt { UInt(box.tree.child(at: path).childCount) }
    public func hasChildren() -> Bool { box.tree.child(at: path).hasChildren }
    public func hasChild(atPath path: String) -> Bool { (try? Path(parsing: path)).map { !box.tree.child(at: self.path.appending($0)).isEmpty } ?? false }

    /// The data at a path below this one (writes go through to the transaction's data).
    public func childData(byAppendingPath path: String) -> MutableData {
        guard let p = try? Path(parsing: path) else {
            box.error = DatabaseError(code: "invalid_path", message: "invalid path '\(path)'")
            return MutableData(box: box, path: self.path)
        }
        return MutableData(box: box, path: self.path.appending(p))
    }

    /// The children, in priority order.
    public var children: [MutableData] {
        QueryParams().orderedChildren(of: box.tree.child(at: path)).map { MutableData(box: box, path: path.appending($0.key)) }
    }

    public var description: String { "MutableData (\(key ?? "")) \(JSONWriter.string(box.tree.child(at: path), format: .export))" }
}

/// What a transaction's block returns (Firebase's `TransactionResult`).
public struct TransactionResult: Sendable {
    let data: MutableData?
    /// Write the data the block set.
    public static func success(withValue data: MutableData) -> TransactionResult { TransactionResult(data: data) }
    /// Stop the transaction: nothing is written, and the completion reports `committed` false.
    public static func abort() -> TransactionResult { TransactionResult(data: nil) }
}

/// Server values (Firebase's `ServerValue`): placeholders the server fills in.
public enum ServerValue {
    public static func timestamp() -> [String: Any] { [".sv": "timestamp"] }
    public static func increment(_ delta: NSNumber) -> [String: Any] { [".sv": ["increment": delta]] }
    public static func increment(_ delta: Double) -> [String: Any] { [".sv": ["increment": delta]] }
    public static func increment(_ delta: Int) -> [String: Any] { [".sv": ["increment": delta]] }
}

/// Swift values to the wire's JSON, and trees back to Foundation-style values.
enum ValueCoding {
    static func json(_ value: Any?) throws -> [UInt8] {
        guard let value, !(value is NSNull) else { return Array("null".utf8) }
        if let tree = value as? Tree { return JSONWriter.bytes(tree, format: .export) }
        // JSONSerialization takes numbers, strings, booleans, arrays and dictionaries; a Bool
        // stays a Bool and an Int an integer.
        guard JSONSerialization.isValidJSONObject([value]) else {
            throw DatabaseError(
                code: "invalid_data", message: "cannot store a value of type \(type(of: value)) (use dictionaries, arrays, strings, numbers and booleans)")
        }
        do {
            return Array(try JSONSerialization.data(withJSONObject: value, options: [.fragmentsAllowed]))
        } catch {
            throw DatabaseError(code: "invalid_data", message: "cannot store a value of type \(type(of: value)): \(error)")
        }
    }

    /// A value with its priority, in the export format.
    static func json(_ value: Any?, priority: Any?) throws -> [UInt8] {
        let v = try json(value)
        guard let priority, !(priority is NSNull) else { return v }
        guard ValueCoding.priorityValue(priority) != nil else {
            throw DatabaseError(code: "invalid_data", message: "a priority is a number, a string or nil")
        }
        return Array(#"{".value":"#.utf8) + v + Array(#",".priority":"#.utf8) + (try json(priority)) + Array("}".utf8)
    }

    static func priority(_ priority: Priority) -> Any? {
        switch priority {
        case .none: nil
        case .number(let d): d
        case .string(let s): s
        }
    }

    static func priorityValue(_ value: Any?) -> Priority? {
        switch value {
        case nil, is NSNull: return Priority.none
        case let s as String: return .string(s)
        case let b as Bool: _ = b; return nil
        case let n as Int: return .number(Double(n))
        case let n as Double: return .number(n)
        case let n as NSNumber: return .number(n.doubleValue)
        default: return nil
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
