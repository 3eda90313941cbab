/// Firebase's orderings: node (value) comparison, the four indexes, and index entries.

extension Node {
    /// Type rank for value ordering: null < booleans < numbers < strings < children nodes.
    @inline(__always)
    var typeRank: Int {
        switch storage {
        case .empty: return 0
        case .leaf(.bool, _): return 1
        case .leaf(.int, _), .leaf(.double, _): return 2
        case .leaf(.string, _): return 3
        case .children: return 4
        }
    }

    /// Compares two nodes as index values (orderByValue / orderByChild / priority):
    /// null < false < true < numbers (numerically) < strings (UTF-16 order) < children nodes (all
    /// equal). Returns negative, zero or positive. Ties are broken by key elsewhere.
    public static func compareValues(_ a: Node, _ b: Node) -> Int {
        let ra = a.typeRank
        let rb = b.typeRank
        if ra != rb { return ra < rb ? -1 : 1 }
        switch (a.storage, b.storage) {
        case let (.leaf(.bool(x), _), .leaf(.bool(y), _)):
            return x == y ? 0 : (x ? 1 : -1)
        case let (.leaf(x, _), .leaf(y, _)) where ra == 2:
            // All numbers compare as IEEE doubles (as every Firebase SDK does), so integers
            // beyond 2^53 that round to the same double are equal: a consistent total order.
            let dx = x.doubleValue ?? 0
            let dy = y.doubleValue ?? 0
            return dx == dy ? 0 : (dx < dy ? -1 : 1)
        case let (.leaf(.string(x), _), .leaf(.string(y), _)):
            return compareUTF16(x, y)
        default:
            return 0
        }
    }
}

/// Which ordering a query uses.
public enum IndexKind: Hashable, Sendable, CustomStringConvertible {
    /// Default: by priority (none < numbers < strings), then key.
    case priority
    /// By key (`nameCompare`).
    case key
    /// By the child's own value.
    case value
    /// By the value at a (possibly nested) path below each child; `.priority` as the last
    /// segment means the priority of that node.
    case child(Path, priorityLeaf: Bool = false)

    /// The value a child is ordered by under this index.
    @inline(__always)
    public func indexValue(of child: Node) -> Node {
        switch self {
        case .key: return .empty
        case .priority: return child.priority.node
        case .value: return child
        case .child(let path, let priorityLeaf):
            let target = child.child(at: path)
            return priorityLeaf ? target.priority.node : target
        }
    }

    /// True when changing `old` to `new` moves the child under this index (Firebase's
    /// `indexedValueChanged`).
    public func indexedValueChanged(_ old: Node, _ new: Node) -> Bool {
        switch self {
        case .key: return false
        default: return Node.compareValues(indexValue(of: old), indexValue(of: new)) != 0
        }
    }

    public var description: String {
        switch self {
        case .priority: return ".priority"
        case .key: return ".key"
        case .value: return ".value"
        case .child(let path, let priorityLeaf):
            let text = path.segments.map(\.string).joined(separator: "/")
            return priorityLeaf ? (text.isEmpty ? ".priority" : text + "/.priority") : text
        }
    }
}

/// One child as an index sees it: its index value and its key. Ordered by value, then key.
public struct IndexEntry: SortKey, Sendable, CustomStringConvertible {
    public let value: Node
    public let key: ChildKey

    public init(value: Node, key: ChildKey) {
        self.value = value
        self.key = key
    }

    public static func == (a: IndexEntry, b: IndexEntry) -> Bool {
        a.key == b.key && Node.compareValues(a.value, b.value) == 0
    }

    public static func < (a: IndexEntry, b: IndexEntry) -> Bool {
        compare(a, b) < 0
    }

    @inline(__always)
    public static func compare(_ a: IndexEntry, _ b: IndexEntry) -> Int {
        let c = Node.compareValues(a.value, b.value)
        if c != 0 { return c }
        return ChildKey.compare(a.key, b.key)
    }

    public var description: String { "(\(value), \(key))" }
}

/// A key bound in a query post: before every key, a key, or after every key.
public enum KeyBound: Sendable, Equatable, CustomStringConvertible {
    case min
    case key(ChildKey)
    case max

    public var description: String {
        switch self {
        case .min: return "[MIN_NAME]"
        case .key(let k): return k.string
        case .max: return "[MAX_NAME]"
        }
    }
}

/// A position in index order: a value and a key bound (a query's start or end point).
public struct IndexPost: Sendable, Equatable {
    public let value: Node
    public let name: KeyBound

    public init(value: Node, name: KeyBound) {
        self.value = value
        self.name = name
    }

    /// Compares an entry with this post: negative when the entry sorts before it.
    @inline(__always)
    public func compare(_ entry: IndexEntry) -> Int {
        let c = Node.compareValues(entry.value, value)
        if c != 0 { return c }
        switch name {
        case .min: return 1
        case .max: return -1
        case .key(let k): return ChildKey.compare(entry.key, k)
        }
    }
}

/// All children of one node ordered by an index: the secondary index a query window reads.
///
/// For `.key` the children map itself is the index; for the other kinds this holds one entry per
/// child. Maintained incrementally by views (`update(key:old:new:)`), O(log n) per change.
public struct NodeIndex: Sendable {
    public let kind: IndexKind
    public private(set) var entries: SortedTree<IndexEntry, Void>

    /// Builds the index over `node`'s children: O(n log n).
    public init(kind: IndexKind, node: Node) {
        self.kind = kind
        var list: [(IndexEntry, Void)] = []
        list.reserveCapacity(node.childCount)
        for (key, child) in node.children.elements() {
            list.append((IndexEntry(value: kind.indexValue(of: child), key: key), ()))
        }
        if case .key = kind {
            entries = SortedTree(sortedUniqueElements: list)
        } else {
            list.sort { $0.0 < $1.0 }
            entries = SortedTree(sortedUniqueElements: list)
        }
    }

    public var count: Int { entries.count }

    /// Moves one child's entry after a change (`old` or `new` may be empty). Returns the old
    /// entry's position before the change and the new entry's position after it.
    @discardableResult
    public mutating func update(key: ChildKey, old: Node, new: Node) -> (old: Int?, new: Int?) {
        var oldPosition: Int?
        var newPosition: Int?
        if !old.isEmpty { oldPosition = entries.removeReturningPosition(forKey: IndexEntry(value: kind.indexValue(of: old), key: key)) }
        if !new.isEmpty { newPosition = entries.insertNew((), forKey: IndexEntry(value: kind.indexValue(of: new), key: key)) }
        return (oldPosition, newPosition)
    }

    /// The entry for a child currently stored as `child` under `key`.
    public func entry(key: ChildKey, child: Node) -> IndexEntry {
        IndexEntry(value: kind.indexValue(of: child), key: key)
    }

    /// Number of entries strictly before `post` (or at-or-before when `inclusive`).
    public func count(before post: IndexPost, inclusive: Bool) -> Int {
        entries.count { entry in
            let c = post.compare(entry)
            return inclusive ? c <= 0 : c < 0
        }
    }

    public func element(at position: Int) -> IndexEntry { entries.element(at: position).key }

    public func position(of entry: IndexEntry) -> Int? { entries.index(of: entry) }

    /// The entry just before `entry` in index order, if any.
    public func entry(before entry: IndexEntry) -> IndexEntry? { entries.key(before: entry) }
}
