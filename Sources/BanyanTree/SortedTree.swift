/// A persistent ordered map with order statistics (a weight-balanced binary tree, Adams' scheme
/// with delta 3 and ratio 2).
///
/// - Structural sharing: copies share nodes; a write copies only the nodes on the path it touches.
/// - When a value is replaced under an existing key and the path is not shared, the replacement
///   happens in place with no allocation (the common case for sets into an existing tree).
/// - `rank`, `element(at:)` and positional iteration are O(log n), which gives O(log n + k) windows.
///
/// Invariant (checked by `checkInvariants` in tests): for every node,
/// `size == size(left) + size(right) + 1`, keys strictly increase in order, and each side weighs at
/// most `delta` times the other (for subtrees of more than one element).
/// A key with a three-way comparison (one comparison per tree level instead of two).
public protocol SortKey: Comparable {
    /// Negative, zero or positive as `a` sorts before, equal to or after `b`.
    static func compare(_ a: Self, _ b: Self) -> Int
}

extension Int: SortKey {
    @inline(__always)
    public static func compare(_ a: Int, _ b: Int) -> Int { a < b ? -1 : (a == b ? 0 : 1) }
}

public struct SortedTree<Key: SortKey, Value> {
    @usableFromInline
    final class TreeNode {
        let key: Key
        var value: Value
        var size: Int
        var left: TreeNode?
        var right: TreeNode?

        init(key: Key, value: Value, left: TreeNode?, right: TreeNode?) {
            self.key = key
            self.value = value
            self.left = left
            self.right = right
            self.size = (left?.size ?? 0) + (right?.size ?? 0) + 1
        }

        func copy() -> TreeNode {
            TreeNode(key: key, value: value, left: left, right: right)
        }
    }

    @usableFromInline var root: TreeNode?

    public init() { root = nil }

    /// Builds a perfectly balanced tree from elements already sorted by key with no duplicates.
    public init(sortedUniqueElements elements: some Collection<(Key, Value)>) {
        let array = Array(elements)
        root = SortedTree.build(array, 0, array.count)
    }

    private static func build(_ a: [(Key, Value)], _ lo: Int, _ hi: Int) -> TreeNode? {
        guard lo < hi else { return nil }
        let mid = (lo + hi) / 2
        return TreeNode(key: a[mid].0, value: a[mid].1, left: build(a, lo, mid), right: build(a, mid + 1, hi))
    }

    public var count: Int { root?.size ?? 0 }
    public var isEmpty: Bool { root == nil }

    /// True when both trees share the same root storage (a cheap sufficient test for equality).
    public func isIdentical(to other: SortedTree) -> Bool { root === other.root }

    // MARK: Lookup

    public subscript(key: Key) -> Value? {
        var node = root
        while let n = node {
            let c = Key.compare(key, n.key)
            if c < 0 {
                node = n.left
            } else if c > 0 {
                node = n.right
            } else {
                return n.value
            }
        }
        return nil
    }

    public func contains(_ key: Key) -> Bool { self[key] != nil }

    /// The number of keys strictly less than `key`.
    public func rank(of key: Key) -> Int {
        var node = root
        var count = 0
        while let n = node {
            let c = Key.compare(key, n.key)
            if c < 0 {
                node = n.left
            } else if c > 0 {
                count += (n.left?.size ?? 0) + 1
                node = n.right
            } else {
                return count + (n.left?.size ?? 0)
            }
        }
        return count
    }

    /// The position of `key`, or `nil` when absent.
    public func index(of key: Key) -> Int? {
        var node = root
        var count = 0
        while let n = node {
            let c = Key.compare(key, n.key)
            if c < 0 {
                node = n.left
            } else if c > 0 {
                count += (n.left?.size ?? 0) + 1
                node = n.right
            } else {
                return count + (n.left?.size ?? 0)
            }
        }
        return nil
    }

    /// The number of leading keys for which `isBelow` holds. `isBelow` must be monotone: true for
    /// a prefix of the keys in order and false after it.
    public func count(while isBelow: (Key) -> Bool) -> Int {
        var node = root
        var count = 0
        while let n = node {
            if isBelow(n.key) {
                count += (n.left?.size ?? 0) + 1
                node = n.right
            } else {
                node = n.left
            }
        }
        return count
    }

    /// The element at position `index` (0-based, `0..<count`).
    public func element(at index: Int) -> (key: Key, value: Value) {
        precondition(index >= 0 && index < count, "SortedTree.element(at:): index \(index) out of 0..<\(count)")
        var node = root
        var i = index
        while let n = node {
            let leftSize = n.left?.size ?? 0
            if i < leftSize {
                node = n.left
            } else if i == leftSize {
                return (n.key, n.value)
            } else {
                i -= leftSize + 1
                node = n.right
            }
        }
        preconditionFailure("SortedTree.element(at:): sizes are inconsistent")
    }

    public var first: (key: Key, value: Value)? {
        var node = root
        while let n = node {
            guard let l = n.left else { return (n.key, n.value) }
            node = l
        }
        return nil
    }

    public var last: (key: Key, value: Value)? {
        var node = root
        while let n = node {
            guard let r = n.right else { return (n.key, n.value) }
            node = r
        }
        return nil
    }

    // MARK: Updates

    /// Inserts or replaces; returns true when the key was new.
    @discardableResult
    public mutating func updateValue(_ value: Value, forKey key: Key) -> Bool {
        if modifyValue(forKey: key, { $0 = value }) != nil {
            // Replaced in place (or along a copied path); the shape is unchanged.
            return false
        }
        root = SortedTree.insert(root, key, value)
        return true
    }

    /// Runs `body` on the value stored under `key`, in place when the path is not shared and along a
    /// freshly copied path otherwise. Returns `nil` (without calling `body`) when `key` is absent.
    @discardableResult
    public mutating func modifyValue<R>(forKey key: Key, _ body: (inout Value) -> R) -> R? {
        // One descent; along a shared path nodes are copied on the way down (if the key turns out
        // to be absent, the copies are harmless: equal content, this tree's own).
        if !isKnownUniquelyReferenced(&root) { root = root?.copy() }
        guard var node = root else { return nil }
        while true {
            let c = Key.compare(key, node.key)
            if c < 0 {
                if !isKnownUniquelyReferenced(&node.left) { node.left = node.left?.copy() }
                guard let next = node.left else { return nil }
                node = next
            } else if c > 0 {
                if !isKnownUniquelyReferenced(&node.right) { node.right = node.right?.copy() }
                guard let next = node.right else { return nil }
                node = next
            } else {
                return body(&node.value)
            }
        }
    }

    /// Removes `key`; returns the removed value.
    @discardableResult
    public mutating func removeValue(forKey key: Key) -> Value? {
        var removed: Value?
        let newRoot = SortedTree.remove(root, key, &removed)
        if removed != nil { root = newRoot }
        return removed
    }

    /// Inserts a key known to be absent (one descent; no replacement attempt first).
    public mutating func insertNew(_ value: Value, forKey key: Key) {
        root = SortedTree.insert(root, key, value)
    }

    // MARK: Iteration

    /// Iterates in key order starting at position `start`.
    public func elements(from start: Int = 0) -> Iterator {
        Iterator(root: root, start: start)
    }

    /// Iterates in key order starting at the first key not below `key`.
    public func elements(fromKey key: Key) -> Iterator {
        Iterator(root: root, start: rank(of: key))
    }

    public struct Iterator: IteratorProtocol, Sequence {
        private var stack: [TreeNode] = []

        init(root: TreeNode?, start: Int) {
            var node = root
            var i = Swift.max(0, start)
            while let n = node {
                let leftSize = n.left?.size ?? 0
                if i < leftSize {
                    stack.append(n)
                    node = n.left
                } else if i == leftSize {
                    stack.append(n)
                    node = nil
                } else {
                    i -= leftSize + 1
                    node = n.right
                }
            }
        }

        public mutating func next() -> (key: Key, value: Value)? {
            guard let n = stack.popLast() else { return nil }
            var node = n.right
            while let m = node {
                stack.append(m)
                node = m.left
            }
            return (n.key, n.value)
        }
    }

    /// Keys in order.
    public var keys: [Key] { elements().map(\.key) }

    // MARK: Balancing (persistent: never mutates an existing node)

    private static var delta: Int { 3 }
    private static var ratio: Int { 2 }

    @inline(__always)
    private static func size(_ n: TreeNode?) -> Int { n?.size ?? 0 }

    private static func insert(_ node: TreeNode?, _ key: Key, _ value: Value) -> TreeNode {
        guard let n = node else { return TreeNode(key: key, value: value, left: nil, right: nil) }
        let c = Key.compare(key, n.key)
        if c < 0 {
            return balance(n.key, n.value, insert(n.left, key, value), n.right)
        } else if c > 0 {
            return balance(n.key, n.value, n.left, insert(n.right, key, value))
        } else {
            return TreeNode(key: key, value: value, left: n.left, right: n.right)
        }
    }

    private static func remove(_ node: TreeNode?, _ key: Key, _ removed: inout Value?) -> TreeNode? {
        guard let n = node else { return nil }
        let c = Key.compare(key, n.key)
        if c < 0 {
            let l = remove(n.left, key, &removed)
            return removed == nil ? n : balance(n.key, n.value, l, n.right)
        } else if c > 0 {
            let r = remove(n.right, key, &removed)
            return removed == nil ? n : balance(n.key, n.value, n.left, r)
        } else {
            removed = n.value
            return glue(n.left, n.right)
        }
    }

    private static func glue(_ l: TreeNode?, _ r: TreeNode?) -> TreeNode? {
        guard let l else { return r }
        guard let r else { return l }
        if l.size > r.size {
            let (k, v, rest) = removeMax(l)
            return balance(k, v, rest, r)
        } else {
            let (k, v, rest) = removeMin(r)
            return balance(k, v, l, rest)
        }
    }

    private static func removeMin(_ n: TreeNode) -> (Key, Value, TreeNode?) {
        guard let l = n.left else { return (n.key, n.value, n.right) }
        let (k, v, rest) = removeMin(l)
        return (k, v, balance(n.key, n.value, rest, n.right))
    }

    private static func removeMax(_ n: TreeNode) -> (Key, Value, TreeNode?) {
        guard let r = n.right else { return (n.key, n.value, n.left) }
        let (k, v, rest) = removeMax(r)
        return (k, v, balance(n.key, n.value, n.left, rest))
    }

    private static func balance(_ k: Key, _ v: Value, _ l: TreeNode?, _ r: TreeNode?) -> TreeNode {
        let sl = size(l)
        let sr = size(r)
        if sl + sr <= 1 { return TreeNode(key: k, value: v, left: l, right: r) }
        if let r, sr > delta * sl {
            // Right-heavy: single or double rotation to the left.
            if size(r.left) < ratio * size(r.right) {
                return TreeNode(key: r.key, value: r.value, left: TreeNode(key: k, value: v, left: l, right: r.left), right: r.right)
            }
            guard let rl = r.left else { preconditionFailure("SortedTree: double rotation without an inner child") }
            return TreeNode(
                key: rl.key, value: rl.value,
                left: TreeNode(key: k, value: v, left: l, right: rl.left),
                right: TreeNode(key: r.key, value: r.value, left: rl.right, right: r.right))
        }
        if let l, sl > delta * sr {
            if size(l.right) < ratio * size(l.left) {
                return TreeNode(key: l.key, value: l.value, left: l.left, right: TreeNode(key: k, value: v, left: l.right, right: r))
            }
            guard let lr = l.right else { preconditionFailure("SortedTree: double rotation without an inner child") }
            return TreeNode(
                key: lr.key, value: lr.value,
                left: TreeNode(key: l.key, value: l.value, left: l.left, right: lr.left),
                right: TreeNode(key: k, value: v, left: lr.right, right: r))
        }
        return TreeNode(key: k, value: v, left: l, right: r)
    }

    // MARK: Invariants (for tests)

    /// Returns a description of the first broken invariant, or `nil` when the tree is valid.
    public func checkInvariants() -> String? {
        func check(_ n: TreeNode?, lower: Key?, upper: Key?) -> String? {
            guard let n else { return nil }
            if let lower, !(lower < n.key) { return "keys out of order" }
            if let upper, !(n.key < upper) { return "keys out of order" }
            let sl = SortedTree.size(n.left)
            let sr = SortedTree.size(n.right)
            if n.size != sl + sr + 1 { return "size mismatch" }
            if sl + sr > 1 && (sl > SortedTree.delta * sr || sr > SortedTree.delta * sl) { return "unbalanced (\(sl) vs \(sr))" }
            return check(n.left, lower: lower, upper: n.key) ?? check(n.right, lower: n.key, upper: upper)
        }
        return check(root, lower: nil, upper: nil)
    }
}

// Sendable by copy-on-write, like the standard library's collections: a node is mutated in place
// only while `isKnownUniquelyReferenced` proves no other tree value can see it.
extension SortedTree: @unchecked Sendable where Key: Sendable, Value: Sendable {}
