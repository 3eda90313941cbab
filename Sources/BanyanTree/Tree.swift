/// A leaf value: boolean, number or string.
///
/// Numbers keep the integer/double distinction of their JSON literal (an integral literal that fits
/// in Int64 is `.int`, anything else `.double`), but compare, hash and test equal by their value as
/// an IEEE double, as every Firebase SDK does (`5 == 5.0`).
public enum Leaf: Sendable, CustomStringConvertible {
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)

    /// The numeric value as a double, for numbers.
    public var doubleValue: Double? {
        switch self {
        case .int(let i): return Double(i)
        case .double(let d): return d
        case .bool, .string: return nil
        }
    }

    public var description: String {
        switch self {
        case .bool(let b): return String(b)
        case .int(let i): return String(i)
        case .double(let d): return String(d)
        case .string(let s): return "\"\(s)\""
        }
    }
}

extension Leaf: Equatable {
    public static func == (a: Leaf, b: Leaf) -> Bool {
        switch (a, b) {
        case let (.bool(x), .bool(y)): return x == y
        case let (.string(x), .string(y)): return x.utf8.elementsEqual(y.utf8)
        case (.int, .int), (.int, .double), (.double, .int), (.double, .double):
            // Numbers are equal when their doubles are (consistent with ordering and hashing).
            return a.doubleValue == b.doubleValue
        default: return false
        }
    }
}

/// A tree's priority: none, a finite number, or a string.
public enum Priority: Sendable, Equatable, CustomStringConvertible {
    case none
    case number(Double)
    case string(String)

    public static func == (a: Priority, b: Priority) -> Bool {
        switch (a, b) {
        case (.none, .none): return true
        case let (.number(x), .number(y)): return x == y
        case let (.string(x), .string(y)): return x.utf8.elementsEqual(y.utf8)
        default: return false
        }
    }

    /// The priority as a tree, for ordering (`.none` is the empty tree).
    public var tree: Tree {
        switch self {
        case .none: return .empty
        case .number(let d): return Tree(.double(d))
        case .string(let s): return Tree(.string(s))
        }
    }

    /// The priority a leaf denotes, when it is a valid priority (null, number or string).
    public init?(tree subtree: Tree) {
        if subtree.isEmpty {
            self = .none
            return
        }
        switch subtree.leaf {
        case .int(let i)?: self = .number(Double(i))
        case .double(let d)?: self = .number(d)
        case .string(let s)?: self = .string(s)
        case .bool?, nil: return nil
        }
    }

    public var description: String {
        switch self {
        case .none: return "none"
        case .number(let d): return String(d)
        case .string(let s): return "\"\(s)\""
        }
    }
}

/// The children of a tree: an ordered persistent map in Firebase key order.
public typealias ChildMap = SortedTree<ChildKey, Tree>

/// The value at one location of the JSON tree (Firebase's SDKs call it a "node"; Banyan keeps
/// that word for cluster members): empty (null), a leaf with a priority, or children with a priority.
///
/// Invariants: a children value has at least one child and no child is empty; an empty value has no
/// priority; a children value carries its data bytes (`dataBytes`), kept up to date by every
/// write from the entries it changed. Trees are immutable values with structural sharing: a write
/// copies only the path it touches (and mutates in place when nothing else shares that path).
public struct Tree: Sendable {
    @usableFromInline
    enum Storage: Sendable {
        case empty
        case leaf(Leaf, Priority)
        /// The children, the priority, and the tree's data bytes (`Tree.dataBytes`: its
        /// priority's, and each child's key and data bytes), so the quota's measure of any
        /// subtree is read, not walked. It does not grow the value: the leaf case is larger.
        case children(ChildMap, Priority, Int)
    }

    @usableFromInline var storage: Storage

    public static let empty = Tree(storage: .empty)

    @usableFromInline init(storage: Storage) { self.storage = storage }

    /// A leaf with an optional priority.
    public init(_ leaf: Leaf, priority: Priority = .none) {
        storage = .leaf(leaf, priority)
    }

    /// A tree from children already in key order with no duplicates; empty children are dropped.
    public init(sortedChildren: [(ChildKey, Tree)], priority: Priority = .none) {
        let kept = sortedChildren.contains { $0.1.isEmpty } ? sortedChildren.filter { !$0.1.isEmpty } : sortedChildren
        if kept.isEmpty {
            storage = .empty
        } else {
            var bytes = Self.bytes(of: priority)
            for (key, child) in kept { bytes += Self.entryBytes(key, child) }
            storage = .children(ChildMap(sortedUniqueElements: kept), priority, bytes)
        }
    }

    /// A tree from a children map (empty map gives the empty tree). Measures the map's entries:
    /// O(children). A caller that changes a tree's children one at a time uses `set(_:at:)`,
    /// which keeps the measure from the entries it changes.
    public init(children: ChildMap, priority: Priority = .none) {
        if children.isEmpty {
            storage = .empty
        } else {
            var bytes = Self.bytes(of: priority)
            children.forEach { key, child in bytes += Self.entryBytes(key, child) }
            storage = .children(children, priority, bytes)
        }
    }

    /// A children value whose data bytes the caller counted (a reader that built `map` in one
    /// pass): `bytes` must be `dataBytes` of the result.
    @usableFromInline init(nonEmpty map: ChildMap, priority: Priority, dataBytes bytes: Int) {
        storage = .children(map, priority, bytes)
    }

    /// What one child adds to its parent's data bytes: its key and its own.
    @inline(__always)
    static func entryBytes(_ key: ChildKey, _ child: Tree) -> Int { key.string.utf8.count + child.dataBytes }

    // MARK: Inspection

    public var isEmpty: Bool {
        if case .empty = storage { return true }
        return false
    }

    public var isLeaf: Bool {
        if case .leaf = storage { return true }
        return false
    }

    public var hasChildren: Bool {
        if case .children = storage { return true }
        return false
    }

    public var leaf: Leaf? {
        if case .leaf(let l, _) = storage { return l }
        return nil
    }

    public var priority: Priority {
        switch storage {
        case .empty: return .none
        case .leaf(_, let p), .children(_, let p, _): return p
        }
    }

    /// The children map (empty for leaves and the empty tree).
    public var children: ChildMap {
        if case .children(let map, _, _) = storage { return map }
        return ChildMap()
    }

    public var childCount: Int {
        if case .children(let map, _, _) = storage { return map.count }
        return 0
    }

    /// The child under `key` (the empty tree when absent or when this is a leaf).
    public func child(_ key: ChildKey) -> Tree {
        if case .children(let map, _, _) = storage { return map[key] ?? .empty }
        return .empty
    }

    /// The tree at `path` below this one.
    public func child(at path: Path) -> Tree {
        var subtree = self
        for key in path.segments {
            guard case .children(let map, _, _) = subtree.storage, let next = map[key] else { return .empty }
            subtree = next
        }
        return subtree
    }

    /// The same tree with another priority (priorities on the empty tree are dropped).
    public func withPriority(_ priority: Priority) -> Tree {
        switch storage {
        case .empty: return self
        case .leaf(let l, _): return Tree(storage: .leaf(l, priority))
        case .children(let m, let old, let bytes):
            return Tree(storage: .children(m, priority, bytes - Self.bytes(of: old) + Self.bytes(of: priority)))
        }
    }

    /// The number of values in this tree (leaves and objects, itself included), for limits and
    /// statistics.
    public var valueCount: Int {
        switch storage {
        case .empty: return 0
        case .leaf: return 1
        case .children(let map, _, _):
            var total = 1
            map.forEach { _, child in total += child.valueCount }
            return total
        }
    }

    /// Whether this tree holds at least `bound` values (leaves and inner trees), found by a walk
    /// that stops there: O(min(bound, size)).
    public func valueCount(atLeast bound: Int) -> Bool {
        var budget = bound
        return exhausts(&budget)
    }

    private func exhausts(_ budget: inout Int) -> Bool {
        budget -= 1
        guard case .children(let map, _, _) = storage else { return budget <= 0 }
        // Each child is at least one value: counted at once, then only inner children descended.
        budget -= map.count
        if budget <= 0 { return true }
        for (_, child) in map.elements() where child.hasChildren {
            budget += 1
            if child.exhausts(&budget) { return true }
        }
        return false
    }

    /// Number of leaves.
    public var leafCount: Int {
        switch storage {
        case .empty: return 0
        case .leaf: return 1
        case .children(let map, _, _):
            var total = 0
            map.forEach { _, child in total += child.leafCount }
            return total
        }
    }

    // MARK: Writes

    /// Replaces the tree at `path` (the empty tree removes it). Parents that become empty vanish,
    /// with their priorities; a leaf on the way is replaced by a children tree keeping its priority.
    public mutating func set(_ subtree: Tree, at path: Path) {
        set(subtree, at: path.segments[...])
    }

    /// The tree with `subtree` at `path`.
    public func setting(_ subtree: Tree, at path: Path) -> Tree {
        var copy = self
        copy.set(subtree, at: path)
        return copy
    }

    @usableFromInline
    mutating func set(_ subtree: Tree, at path: ArraySlice<ChildKey>) {
        guard let key = path.first else {
            self = subtree
            return
        }
        let rest = path.dropFirst()
        switch storage {
        case .empty:
            guard !subtree.isEmpty else { return }
            let child = Tree.empty.setting(subtree, at: rest)
            storage = .children(Tree.singleton(key, child), .none, Self.entryBytes(key, child))
        case .leaf(_, let priority):
            guard !subtree.isEmpty else { return }
            let child = Tree.empty.setting(subtree, at: rest)
            storage = .children(Tree.singleton(key, child), priority, Self.bytes(of: priority) + Self.entryBytes(key, child))
        case .children(var map, let priority, var bytes):
            // Drop this tree's reference first so `map` is uniquely referenced and can be
            // mutated in place.
            storage = .empty
            var becameEmpty = false
            let found: Void? = map.modifyValue(forKey: key) { child in
                bytes -= child.dataBytes
                child.set(subtree, at: rest)
                bytes += child.dataBytes
                becameEmpty = child.isEmpty
            }
            if found == nil {
                // Known absent: insert with one descent (`updateValue` would look again first).
                if !subtree.isEmpty {
                    let child = Tree.empty.setting(subtree, at: rest)
                    bytes += Self.entryBytes(key, child)
                    map.insertNew(child, forKey: key)
                }
            } else if becameEmpty {
                map.removeValue(forKey: key)
                bytes -= key.string.utf8.count
            }
            storage = map.isEmpty ? .empty : .children(map, priority, bytes)
        }
    }

    /// Puts the non-empty `subtree` at `path` in place and returns the entry it replaced (empty when
    /// there was none), when every tree above `path` exists and its parent has children, so the
    /// write changes only that entry (no parent is created, pruned or turned from a leaf into
    /// children): `set(old, at: path)` then restores the tree exactly. Otherwise (and for the
    /// root) changes nothing and returns nil. One descent, like `set`.
    public mutating func replaceEntry(_ subtree: Tree, at path: Path) -> Tree? {
        guard !subtree.isEmpty, !path.isRoot else { return nil }
        return replaceEntry(subtree, at: path.segments[...])
    }

    private mutating func replaceEntry(_ subtree: Tree, at path: ArraySlice<ChildKey>) -> Tree? {
        guard let key = path.first, case .children(var map, let priority, var bytes) = storage else { return nil }
        let rest = path.dropFirst()
        // Drop this tree's reference first so `map` is uniquely referenced and can be mutated in place.
        storage = .empty
        defer { storage = .children(map, priority, bytes) }
        if rest.isEmpty {
            var old = Tree.empty
            let found: Void? = map.modifyValue(forKey: key) { child in
                old = child
                child = subtree
            }
            if found == nil {
                map.insertNew(subtree, forKey: key)
                bytes += key.string.utf8.count
            }
            bytes += subtree.dataBytes - old.dataBytes
            return old
        }
        // The child never becomes empty: `subtree` is not.
        return map.modifyValue(forKey: key) { child in
            bytes -= child.dataBytes
            defer { bytes += child.dataBytes }
            return child.replaceEntry(subtree, at: rest)
        } ?? nil
    }

    private func setting(_ subtree: Tree, at path: ArraySlice<ChildKey>) -> Tree {
        var copy = self
        copy.set(subtree, at: path)
        return copy
    }

    private static func singleton(_ key: ChildKey, _ subtree: Tree) -> ChildMap {
        var map = ChildMap()
        map.updateValue(subtree, forKey: key)
        return map
    }

    /// Sets the priority of the tree at `path`; a no-op returning false when that tree is empty.
    @discardableResult
    public mutating func setPriority(_ priority: Priority, at path: Path) -> Bool {
        let target = child(at: path)
        guard !target.isEmpty else { return false }
        set(target.withPriority(priority), at: path)
        return true
    }
}

extension Tree: Equatable {
    /// Firebase equality: same shape, leaves equal by value (numbers as doubles), same priorities.
    public static func == (a: Tree, b: Tree) -> Bool {
        switch (a.storage, b.storage) {
        case (.empty, .empty):
            return true
        case let (.leaf(x, p), .leaf(y, q)):
            return x == y && p == q
        case let (.children(x, p, xb), .children(y, q, yb)):
            // Equal trees have equal data bytes (equal strings have equal UTF-8, numbers count 8
            // whatever their kind): a cheap first test.
            guard xb == yb, p == q, x.count == y.count else { return false }
            if x.isIdentical(to: y) { return true }
            var ix = x.elements()
            var iy = y.elements()
            while let ex = ix.next(), let ey = iy.next() {
                if ex.key != ey.key || ex.value != ey.value { return false }
            }
            return true
        default:
            return false
        }
    }
}

extension Tree: CustomStringConvertible {
    public var description: String { JSONWriter.string(self, format: .export) }
}
