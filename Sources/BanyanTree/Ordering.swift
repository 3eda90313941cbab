/// Firebase's orderings: tree (value) comparison, the four indexes, and index entries.

extension Tree {
    /// Type rank for value ordering: null < booleans < numbers < strings < children trees.
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

    /// Compares two trees as index values (orderByValue / orderByChild / priority):
    /// null < false < true < numbers (numerically) < strings (UTF-16 order) < children trees (all
    /// equal). Returns negative, zero or positive. Ties are broken by key elsewhere.
    public static func compareValues(_ a: Tree, _ b: Tree) -> Int {
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
    /// segment means the priority of that tree.
    case child(Path, priorityLeaf: Bool = false)

    /// The value a child is ordered by under this index.
    @inline(__always)
    public func indexValue(of child: Tree) -> Tree {
        switch self {
        case .key: return .empty
        case .priority: return child.priority.tree
        case .value: return child
        case .child(let path, let priorityLeaf):
            let target = child.child(at: path)
            return priorityLeaf ? target.priority.tree : target
        }
    }

    /// True when changing `old` to `new` moves the child under this index (Firebase's
    /// `indexedValueChanged`).
    public func indexedValueChanged(_ old: Tree, _ new: Tree) -> Bool {
        switch self {
        case .key: return false
        default: return Tree.compareValues(indexValue(of: old), indexValue(of: new)) != 0
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

/// An index value reduced to what ordering reads: the type, and the number or the string. All
/// children trees sort equal, so their contents are not kept. Indexes store these rather than
/// whole trees, which keeps an entry at 56 bytes instead of 88.
public enum IndexValue: Sendable, CustomStringConvertible {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case children

    /// The compact form of `subtree` as an index value.
    @inline(__always)
    public init(_ subtree: Tree) {
        switch subtree.storage {
        case .empty: self = .null
        case .leaf(.bool(let b), _): self = .bool(b)
        // Numbers compare as IEEE doubles, as in `Tree.compareValues`.
        case .leaf(.int(let i), _): self = .number(Double(i))
        case .leaf(.double(let d), _): self = .number(d)
        case .leaf(.string(let s), _): self = .string(s)
        case .children: self = .children
        }
    }

    @inline(__always)
    var rank: Int {
        switch self {
        case .null: return 0
        case .bool: return 1
        case .number: return 2
        case .string: return 3
        case .children: return 4
        }
    }

    /// The same order as `Tree.compareValues` on the trees these came from.
    @inline(__always)
    public static func compare(_ a: IndexValue, _ b: IndexValue) -> Int {
        switch (a, b) {
        case let (.number(x), .number(y)): return x == y ? 0 : (x < y ? -1 : 1)
        case let (.bool(x), .bool(y)): return x == y ? 0 : (x ? 1 : -1)
        case let (.string(x), .string(y)): return compareUTF16(x, y)
        default:
            let ra = a.rank
            let rb = b.rank
            return ra == rb ? 0 : (ra < rb ? -1 : 1)
        }
    }

    /// Search summary (see `SortKey.sortWord`): the type rank in the top three bits, then a
    /// number's order-preserving bits or a string's first bytes.
    @inline(__always)
    var word: UInt64 {
        switch self {
        case .null: return 0
        case .bool(let b): return 1 << 61 | (b ? 1 : 0)
        case .number(let d):
            let bits = (d == 0 ? 0 : d).bitPattern  // -0 sorts as 0
            return 2 << 61 | (bits >> 63 == 0 ? bits | 1 << 63 : ~bits) >> 3
        case .string(let s): return 3 << 61 | utf16OrderedBytes(packedUTF8Prefix(s)) >> 3
        case .children: return 4 << 61
        }
    }

    public var description: String {
        switch self {
        case .null: return "null"
        case .bool(let b): return String(b)
        case .number(let d): return Tree(.double(d)).description
        case .string(let s): return Tree(.string(s)).description
        case .children: return "{...}"
        }
    }
}

/// One child as an index sees it: its index value and its key. Ordered by value, then key.
public struct IndexEntry: SortKey, Sendable, CustomStringConvertible {
    public let key: ChildKey
    public let value: IndexValue

    public init(value: Tree, key: ChildKey) {
        self.key = key
        self.value = IndexValue(value)
    }

    public static func == (a: IndexEntry, b: IndexEntry) -> Bool {
        a.key == b.key && IndexValue.compare(a.value, b.value) == 0
    }

    public static func < (a: IndexEntry, b: IndexEntry) -> Bool {
        compare(a, b) < 0
    }

    @inline(__always)
    public static func compare(_ a: IndexEntry, _ b: IndexEntry) -> Int {
        let c = IndexValue.compare(a.value, b.value)
        if c != 0 { return c }
        return ChildKey.compare(a.key, b.key)
    }

    /// The value's summary only: entries with equal words are told apart by `compare`.
    @inline(__always)
    public var sortWord: UInt64 { value.word }

    /// Element by element, compiled for this type (see `SortKey.destroy`).
    public static func destroy(_ keys: UnsafeMutablePointer<IndexEntry>, count: Int) {
        for i in 0..<count { (keys + i).deinitialize(count: 1) }
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
    public let value: Tree
    public let name: KeyBound
    /// `value` in the form index entries hold.
    private let compact: IndexValue

    public init(value: Tree, name: KeyBound) {
        self.value = value
        self.name = name
        self.compact = IndexValue(value)
    }

    public static func == (a: IndexPost, b: IndexPost) -> Bool {
        a.value == b.value && a.name == b.name
    }

    /// Compares an entry with this post: negative when the entry sorts before it.
    @inline(__always)
    public func compare(_ entry: IndexEntry) -> Int {
        let c = IndexValue.compare(entry.value, compact)
        if c != 0 { return c }
        switch name {
        case .min: return 1
        case .max: return -1
        case .key(let k): return ChildKey.compare(entry.key, k)
        }
    }
}

/// All children of one tree ordered by an index: the secondary index a query window reads.
///
/// For `.key` the children map itself is the index; for the other kinds this holds one entry per
/// child. Maintained incrementally by views (`update(key:old:new:)`), O(log n) per change.
public struct TreeIndex: Sendable {
    public let kind: IndexKind
    public private(set) var entries: SortedTree<IndexEntry, Void>

    /// Builds the index over `tree`'s children: O(n log n).
    public init(kind: IndexKind, tree subtree: Tree) {
        self.kind = kind
        var list: [(IndexEntry, Void)] = []
        list.reserveCapacity(subtree.childCount)
        for (key, child) in subtree.children.elements() {
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
    public mutating func update(key: ChildKey, old: Tree, new: Tree) -> (old: Int?, new: Int?) {
        var oldPosition: Int?
        var newPosition: Int?
        if !old.isEmpty { oldPosition = entries.removeReturningPosition(forKey: IndexEntry(value: kind.indexValue(of: old), key: key)) }
        if !new.isEmpty { newPosition = entries.insertNew((), forKey: IndexEntry(value: kind.indexValue(of: new), key: key)) }
        return (oldPosition, newPosition)
    }

    /// The entry for a child currently stored as `child` under `key`.
    public func entry(key: ChildKey, child: Tree) -> IndexEntry {
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
