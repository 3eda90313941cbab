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
        // Links first: stored properties are laid out in declaration order, so a descent step
        // (reference count, links, then the key's leading bytes) mostly stays on one cache line.
        var left: TreeNode?
        var right: TreeNode?
        var size: Int
        let key: Key
        var value: Value

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

    /// Two representations behind one API:
    /// - small maps (at most `smallLimit` elements) are one sorted contiguous array: one
    ///   allocation for the whole map and cache-friendly binary search;
    /// - larger maps are the weight-balanced tree in `root`.
    /// Invariant: `root == nil` means array mode (`small` holds everything); otherwise `small` is
    /// empty and the tree holds more than `smallLimit / 2` elements (hysteresis: a tree shrinks
    /// back to an array at `smallLimit / 2`).
    @usableFromInline var root: TreeNode?
    @usableFromInline var small: [(Key, Value)]

    /// Largest array-mode map.
    public static var smallLimit: Int { 32 }

    public init() {
        root = nil
        small = []
    }

    /// Builds from elements already sorted by key with no duplicates.
    public init(sortedUniqueElements elements: [(Key, Value)]) {
        if elements.count <= SortedTree.smallLimit {
            root = nil
            small = elements
        } else {
            root = SortedTree.build(elements, 0, elements.count)
            small = []
        }
    }

    private static func build(_ a: [(Key, Value)], _ lo: Int, _ hi: Int) -> TreeNode? {
        guard lo < hi else { return nil }
        let mid = (lo + hi) / 2
        return TreeNode(key: a[mid].0, value: a[mid].1, left: build(a, lo, mid), right: build(a, mid + 1, hi))
    }

    /// Builds a map of more than `smallLimit` elements from `count` elements that `next` hands
    /// out in strictly increasing key order (the caller checks the order), straight into tree
    /// nodes: no intermediate array. The shape is the one `init(sortedUniqueElements:)` builds.
    init<E: Error>(sortedCount count: Int, next: () throws(E) -> (Key, Value)) throws(E) {
        precondition(count > SortedTree.smallLimit, "SortedTree(sortedCount:): \(count) elements belong in array mode")
        root = try SortedTree.build(count, next)
        small = []
    }

    private static func build<E: Error>(_ count: Int, _ next: () throws(E) -> (Key, Value)) throws(E) -> TreeNode? {
        guard count > 0 else { return nil }
        // In order: the left half, the middle element, the right half.
        let left = try build(count / 2, next)
        let (key, value) = try next()
        return TreeNode(key: key, value: value, left: left, right: try build(count - count / 2 - 1, next))
    }

    public var count: Int { root?.size ?? small.count }
    public var isEmpty: Bool { root == nil && small.isEmpty }

    /// True when both maps share the same storage (a cheap sufficient test for equality).
    public func isIdentical(to other: SortedTree) -> Bool {
        if let a = root, let b = other.root { return a === b }
        guard root == nil, other.root == nil else { return false }
        if small.isEmpty && other.small.isEmpty { return true }
        let a = small.withUnsafeBufferPointer { $0.baseAddress.map(UnsafeRawPointer.init) }
        let b = other.small.withUnsafeBufferPointer { $0.baseAddress.map(UnsafeRawPointer.init) }
        return a == b && small.count == other.small.count
    }

    /// Array mode: the first index whose key is not below `key`, and whether it equals `key`.
    @inline(__always)
    private func search(_ key: Key) -> (index: Int, found: Bool) {
        var lo = 0
        var hi = small.count
        while lo < hi {
            let mid = (lo + hi) >> 1
            let c = Key.compare(small[mid].0, key)
            if c < 0 {
                lo = mid + 1
            } else if c > 0 {
                hi = mid
            } else {
                return (mid, true)
            }
        }
        return (lo, false)
    }

    // MARK: Lookup

    public subscript(key: Key) -> Value? {
        guard root != nil else {
            let (i, found) = search(key)
            return found ? small[i].1 : nil
        }
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
    public func rank(of key: Key) -> Int { locate(key).position }

    /// The position of `key`, or `nil` when absent.
    public func index(of key: Key) -> Int? {
        let (position, found) = locate(key)
        return found ? position : nil
    }

    /// One descent: how many keys are below `key`, and whether `key` itself is present.
    private func locate(_ key: Key) -> (position: Int, found: Bool) {
        guard root != nil else {
            let (i, found) = search(key)
            return (i, found)
        }
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
                return (count + (n.left?.size ?? 0), true)
            }
        }
        return (count, false)
    }

    /// The number of leading keys for which `isBelow` holds. `isBelow` must be monotone: true for
    /// a prefix of the keys in order and false after it.
    public func count(while isBelow: (Key) -> Bool) -> Int {
        guard root != nil else {
            var lo = 0
            var hi = small.count
            while lo < hi {
                let mid = (lo + hi) >> 1
                if isBelow(small[mid].0) { lo = mid + 1 } else { hi = mid }
            }
            return lo
        }
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
        guard root != nil else { return (small[index].0, small[index].1) }
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

    /// The greatest key strictly less than `key` (one descent).
    public func key(before key: Key) -> Key? {
        guard root != nil else {
            let i = search(key).index
            return i > 0 ? small[i - 1].0 : nil
        }
        var node = root
        var best: Key?
        while let n = node {
            if Key.compare(n.key, key) < 0 {
                best = n.key
                node = n.right
            } else {
                node = n.left
            }
        }
        return best
    }

    public var first: (key: Key, value: Value)? {
        guard root != nil else { return small.first.map { ($0.0, $0.1) } }
        var node = root
        while let n = node {
            guard let l = n.left else { return (n.key, n.value) }
            node = l
        }
        return nil
    }

    public var last: (key: Key, value: Value)? {
        guard root != nil else { return small.last.map { ($0.0, $0.1) } }
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
        insertNew(value, forKey: key)
        return true
    }

    /// Runs `body` on the value stored under `key`, in place when the storage is not shared and
    /// on a fresh copy otherwise. Returns `nil` (without calling `body`) when `key` is absent.
    @discardableResult
    public mutating func modifyValue<R>(forKey key: Key, _ body: (inout Value) -> R) -> R? {
        guard root != nil else {
            let (i, found) = search(key)
            return found ? body(&small[i].1) : nil
        }
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
        guard root != nil else {
            let (i, found) = search(key)
            return found ? small.remove(at: i).1 : nil
        }
        // An absent key costs at most copies of a shared path; sizes change only on removal.
        var position = 0
        let removed = SortedTree.remove(&root, key, position: &position)
        shrinkIfSmall()
        return removed
    }

    /// Inserts a key known to be absent (one descent; no replacement attempt first). Returns the
    /// position it now occupies.
    @discardableResult
    public mutating func insertNew(_ value: Value, forKey key: Key) -> Int {
        guard root != nil else {
            if small.count < SortedTree.smallLimit {
                let index = search(key).index
                small.insert((key, value), at: index)
                return index
            }
            // Outgrew the array: switch to the tree.
            root = SortedTree.build(small, 0, small.count)
            small = []
            return SortedTree.insert(&root, key, value)
        }
        return SortedTree.insert(&root, key, value)
    }

    /// Removes `key` and returns the position it occupied (one descent), or nil when absent.
    @discardableResult
    public mutating func removeReturningPosition(forKey key: Key) -> Int? {
        guard root != nil else {
            let (i, found) = search(key)
            guard found else { return nil }
            small.remove(at: i)
            return i
        }
        var position = 0
        guard SortedTree.remove(&root, key, position: &position) != nil else { return nil }
        shrinkIfSmall()
        return position
    }

    private mutating func shrinkIfSmall() {
        if let r = root, r.size <= SortedTree.smallLimit / 2 {
            var elements: [(Key, Value)] = []
            elements.reserveCapacity(SortedTree.smallLimit)
            SortedTree.visit(r) { elements.append(($0, $1)) }
            small = elements
            root = nil
        }
    }

    // MARK: Iteration

    /// Iterates in key order starting at position `start`.
    public func elements(from start: Int = 0) -> Iterator {
        Iterator(tree: self, start: start)
    }

    /// Iterates in key order starting at the first key not below `key`.
    public func elements(fromKey key: Key) -> Iterator {
        Iterator(tree: self, start: rank(of: key))
    }

    public struct Iterator: IteratorProtocol, Sequence {
        private var stack: [TreeNode] = []
        private var array: [(Key, Value)] = []
        private var index = 0

        init(tree: SortedTree, start: Int) {
            guard let root = tree.root else {
                array = tree.small
                index = Swift.max(0, start)
                return
            }
            var node: TreeNode? = root
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
            if index < array.count {
                defer { index += 1 }
                return (array[index].0, array[index].1)
            }
            guard let n = stack.popLast() else { return nil }
            var node = n.right
            while let m = node {
                stack.append(m)
                node = m.left
            }
            return (n.key, n.value)
        }
    }

    /// Calls `body` for each element in key order (no iterator allocation).
    @inline(__always)
    public func forEach(_ body: (Key, Value) throws -> Void) rethrows {
        guard let root else {
            for (k, v) in small { try body(k, v) }
            return
        }
        try SortedTree.visit(root, body)
    }

    private static func visit(_ node: TreeNode?, _ body: (Key, Value) throws -> Void) rethrows {
        guard let n = node else { return }
        try visit(n.left, body)
        try body(n.key, n.value)
        try visit(n.right, body)
    }

    /// Keys in order.
    public var keys: [Key] {
        var result: [Key] = []
        result.reserveCapacity(count)
        forEach { key, _ in result.append(key) }
        return result
    }

    // MARK: Balancing (copy-on-write: a node is mutated only while uniquely referenced)

    private static var delta: Int { 3 }
    private static var ratio: Int { 2 }

    @inline(__always)
    private static func size(_ n: TreeNode?) -> Int { n?.size ?? 0 }

    /// Makes the node in `slot` safe to mutate (copying it when shared) and returns it.
    @inline(__always)
    private static func unique(_ slot: inout TreeNode?) -> TreeNode? {
        if !isKnownUniquelyReferenced(&slot) { slot = slot?.copy() }
        return slot
    }

    @inline(__always)
    private static func resize(_ n: TreeNode) {
        n.size = size(n.left) + size(n.right) + 1
    }

    /// Inserts a key that is not present; returns its position (rotations do not change ranks).
    private static func insert(_ slot: inout TreeNode?, _ key: Key, _ value: Value) -> Int {
        guard let n = unique(&slot) else {
            slot = TreeNode(key: key, value: value, left: nil, right: nil)
            return 0
        }
        let position: Int
        if Key.compare(key, n.key) < 0 {
            position = insert(&n.left, key, value)
        } else {
            position = size(n.left) + 1 + insert(&n.right, key, value)
        }
        n.size += 1
        slot = balance(n)
        return position
    }

    /// Removes `key` if present; returns its value and adds its position to `position`.
    private static func remove(_ slot: inout TreeNode?, _ key: Key, position: inout Int) -> Value? {
        guard let n = unique(&slot) else { return nil }
        let c = Key.compare(key, n.key)
        if c == 0 {
            position += size(n.left)
            slot = glue(n)
            return n.value
        }
        if c > 0 { position += size(n.left) + 1 }
        let removed = c < 0 ? remove(&n.left, key, position: &position) : remove(&n.right, key, position: &position)
        if removed != nil {
            n.size -= 1
            slot = balance(n)
        }
        return removed
    }

    /// The subtree that replaces `n` when `n` itself is removed.
    private static func glue(_ n: TreeNode) -> TreeNode? {
        guard n.left != nil else { return n.right }
        guard n.right != nil else { return n.left }
        let replacement: TreeNode
        if size(n.left) > size(n.right) {
            replacement = detachMax(&n.left)
        } else {
            replacement = detachMin(&n.right)
        }
        replacement.left = n.left
        replacement.right = n.right
        resize(replacement)
        return balance(replacement)
    }

    /// Unlinks the smallest node of the (non-empty) subtree in `slot` and returns it, uniquely owned.
    private static func detachMin(_ slot: inout TreeNode?) -> TreeNode {
        guard let n = unique(&slot) else { preconditionFailure("SortedTree.detachMin: empty subtree") }
        guard n.left != nil else {
            slot = n.right
            n.right = nil
            return n
        }
        let m = detachMin(&n.left)
        n.size -= 1
        slot = balance(n)
        return m
    }

    private static func detachMax(_ slot: inout TreeNode?) -> TreeNode {
        guard let n = unique(&slot) else { preconditionFailure("SortedTree.detachMax: empty subtree") }
        guard n.right != nil else {
            slot = n.left
            n.left = nil
            return n
        }
        let m = detachMax(&n.right)
        n.size -= 1
        slot = balance(n)
        return m
    }

    /// Restores the weight balance at `n` (whose children are balanced and whose size is
    /// current) after one insertion or removal below it; returns the subtree's new root.
    private static func balance(_ n: TreeNode) -> TreeNode {
        let sl = size(n.left)
        let sr = size(n.right)
        if sl + sr <= 1 { return n }
        if sr > delta * sl {
            guard let r = unique(&n.right) else { return n }
            if size(r.left) < ratio * size(r.right) {
                // Single rotation left.
                n.right = r.left
                resize(n)
                r.left = n
                resize(r)
                return r
            }
            guard let rl = unique(&r.left) else { preconditionFailure("SortedTree: double rotation without an inner child") }
            n.right = rl.left
            r.left = rl.right
            resize(n)
            resize(r)
            rl.left = n
            rl.right = r
            resize(rl)
            return rl
        }
        if sl > delta * sr {
            guard let l = unique(&n.left) else { return n }
            if size(l.right) < ratio * size(l.left) {
                n.left = l.right
                resize(n)
                l.right = n
                resize(l)
                return l
            }
            guard let lr = unique(&l.right) else { preconditionFailure("SortedTree: double rotation without an inner child") }
            n.left = lr.right
            l.right = lr.left
            resize(n)
            resize(l)
            lr.right = n
            lr.left = l
            resize(lr)
            return lr
        }
        return n
    }

    // MARK: Invariants (for tests)

    /// Returns a description of the first broken invariant, or `nil` when the tree is valid.
    public func checkInvariants() -> String? {
        guard let root else {
            if small.count > SortedTree.smallLimit { return "array mode over the limit" }
            for i in small.indices.dropFirst() where !(small[i - 1].0 < small[i].0) { return "keys out of order" }
            return nil
        }
        if !small.isEmpty { return "tree mode with array elements" }
        if root.size <= SortedTree.smallLimit / 2 { return "tree mode below the hysteresis bound" }
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
