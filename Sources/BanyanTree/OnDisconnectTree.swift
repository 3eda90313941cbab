/// The writes a connection queued to run when it ends (`o`, `om`, `oc` of the protocol v5), as
/// the SDKs model them locally (reference §2.9; docs/realtime.md, "onDisconnect"): a sparse tree
/// of values, at most one on any path from the root, so the entries never overlap and fire
/// together as one multi-path update.
///
/// Values are client JSON (`JSONValue`), kept unresolved: server values (`{".sv": …}`) resolve
/// when the writes fire, not when they were queued. Pure and deterministic; entries list in path
/// order (keys compared by their UTF-8 bytes).
public struct OnDisconnectTree: Sendable, Equatable {
    private struct Branch: Sendable {
        var value: JSONValue?
        /// Keyed by the keys' bytes (never by canonical equivalence: "é" and "e\u{301}" differ).
        var children: [ChildKeyBytes: Branch] = [:]
    }

    private var root = Branch()

    public init() {}

    public static func == (a: OnDisconnectTree, b: OnDisconnectTree) -> Bool {
        a.entries.count == b.entries.count && zip(a.entries, b.entries).allSatisfy { $0.path == $1.path && $0.value == $1.value }
    }

    public var isEmpty: Bool { root.value == nil && root.children.isEmpty }

    /// `o path value`: the value is written at `path` when the connection ends. An entry at an
    /// ancestor takes it into its value (as a child update); otherwise it replaces every entry at
    /// or below `path`. Recursion is as deep as `path` (client paths have at most 32 keys).
    public mutating func set(_ path: [String], _ value: JSONValue) {
        Self.set(&root, path[...], value)
    }

    private static func set(_ branch: inout Branch, _ path: ArraySlice<String>, _ value: JSONValue) {
        if let existing = branch.value {
            branch.value = existing.updatingChild(Array(path), with: value)
            return
        }
        guard let first = path.first else {
            branch.value = value
            branch.children = [:]
            return
        }
        var child = branch.children.removeValue(forKey: ChildKeyBytes(first)) ?? Branch()
        set(&child, path.dropFirst(), value)
        branch.children[ChildKeyBytes(first)] = child
    }

    /// `om path {k: v}`: `set(path + k, v)` for each member, in order.
    public mutating func update(_ path: [String], _ children: [([String], JSONValue)]) {
        for (relative, value) in children { set(path + relative, value) }
    }

    /// `oc path`: forgets what is queued at or below `path`. An entry at an ancestor whose value
    /// has children is first split into one entry per child (its priority is dropped, as the
    /// SDKs do), and the split is followed down; an ancestor whose value is a leaf keeps it.
    public mutating func cancel(_ path: [String]) {
        _ = Self.forget(&root, path[...])
    }

    /// Returns whether `branch` holds nothing any more (its parent may drop it).
    private static func forget(_ branch: inout Branch, _ path: ArraySlice<String>) -> Bool {
        guard let first = path.first else {
            branch.value = nil
            branch.children = [:]
            return true
        }
        if let value = branch.value {
            guard let members = value.childMembers else { return false }  // a leaf: nothing under it to forget
            branch.value = nil
            for (key, child) in members { branch.children[ChildKeyBytes(key)] = Branch(value: child) }
            return forget(&branch, path)
        }
        if var child = branch.children.removeValue(forKey: ChildKeyBytes(first)) {
            if !forget(&child, path.dropFirst()) { branch.children[ChildKeyBytes(first)] = child }
        }
        return branch.children.isEmpty
    }

    /// Every queued write, in path order: what fires, as one multi-path update.
    public var entries: [(path: [String], value: JSONValue)] {
        var out: [(path: [String], value: JSONValue)] = []
        var path: [String] = []
        Self.collect(root, &path, &out)
        return out
    }

    private static func collect(_ branch: Branch, _ path: inout [String], _ out: inout [(path: [String], value: JSONValue)]) {
        if let value = branch.value {
            out.append((path, value))
            return
        }
        for key in branch.children.keys.sorted(by: { $0.string.utf8.lexicographicallyPrecedes($1.string.utf8) }) {
            guard let child = branch.children[key] else { continue }
            path.append(key.string)
            collect(child, &path, &out)
            path.removeLast()
        }
    }
}

extension JSONValue {
    /// Whether this JSON stands for no data (null, or an object or array with nothing in it).
    public var isEmptyData: Bool {
        switch self {
        case .null: return true
        case .object(let members):
            if let inner = members.first(where: { $0.0 == ".value" })?.1 { return inner.isEmptyData }
            return members.allSatisfy { $0.0 == ".priority" || $0.1.isEmptyData }
        case .array(let items): return items.allSatisfy(\.isEmptyData)
        default: return false
        }
    }

    /// The `.priority` member of an object, if any.
    var priorityMember: JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.0 == ".priority" }?.1
    }

    /// The children of this value as data, or nil for a leaf: an object's members other than
    /// `.priority` (the content of `.value` when that is an object or array), an array's items
    /// keyed by index, children without data left out. A server value (`.sv`) is a leaf.
    var childMembers: [(String, JSONValue)]? {
        switch self {
        case .object(let members):
            if members.contains(where: { $0.0 == ".sv" }) { return nil }
            if let inner = members.first(where: { $0.0 == ".value" })?.1 {
                switch inner {
                case .object, .array: return inner.childMembers
                default: return nil
                }
            }
            return members.filter { $0.0 != ".priority" && !$0.1.isEmptyData }
        case .array(let items):
            return items.enumerated().compactMap { $0.element.isEmptyData ? nil : (String($0.offset), $0.element) }
        default:
            return nil
        }
    }

    /// The value with `path` (relative, non-empty) set to `value`, as Firebase updates one
    /// child of a branch: a leaf becomes an object holding the child (keeping its priority) unless
    /// the child is empty (then the leaf stays), a child without data is removed, an object left
    /// with no data is null, and `.priority` as the last key sets or removes the priority.
    func updatingChild(_ path: [String], with value: JSONValue) -> JSONValue {
        guard let key = path.first else { return value }
        if key == ".priority" {
            return path.count == 1 ? settingPriority(value) : self
        }
        let priority = priorityMember
        var members: [(String, JSONValue)]
        if let children = childMembers {
            members = children
        } else {
            // A leaf (or nothing): an empty child changes nothing.
            if value.isEmptyData { return self }
            members = []
        }
        let index = members.firstIndex { $0.0.utf8.elementsEqual(key.utf8) }
        let current = index.map { members[$0].1 } ?? .null
        let updated = current.updatingChild(Array(path.dropFirst()), with: value)
        if let index { members.remove(at: index) }
        if !updated.isEmptyData { members.append((key, updated)) }
        if members.isEmpty { return .null }
        if let priority { members.append((".priority", priority)) }
        return .object(members)
    }

    /// The same data with `priority` (null removes it). Nothing has no priority.
    func settingPriority(_ priority: JSONValue) -> JSONValue {
        if isEmptyData { return .null }
        let clear = priority.isEmptyData
        if let children = childMembers {
            return .object(clear ? children : children + [(".priority", priority)])
        }
        // A leaf: its bare value, wrapped with `.value` when it carries a priority.
        var leaf = self
        if case .object(let members) = self, let inner = members.first(where: { $0.0 == ".value" })?.1 { leaf = inner }
        return clear ? leaf : .object([(".value", leaf), (".priority", priority)])
    }
}
