/// A key with a three-way comparison and a 64-bit summary of its place in the order.
public protocol SortKey: Comparable {
    /// Negative, zero or positive as `a` sorts before, equal to or after `b`.
    static func compare(_ a: Self, _ b: Self) -> Int
    /// A summary consistent with the order: `a.sortWord < b.sortWord` implies `a < b`. Equal
    /// words decide nothing (the full comparison breaks the tie), so any monotone summary works,
    /// even a constant; the more keys it separates, the fewer full comparisons a search makes.
    var sortWord: UInt64 { get }
    /// Deinitialises `count` keys at `keys`. A page's deinit runs unspecialised, so it calls this
    /// through the conformance: a key type that implements it gets a loop compiled for its own
    /// layout instead of the runtime's generic destroy (see `ChildKey`).
    static func destroy(_ keys: UnsafeMutablePointer<Self>, count: Int)
}

extension SortKey {
    public static func destroy(_ keys: UnsafeMutablePointer<Self>, count: Int) {
        keys.deinitialize(count: count)
    }
}

extension Int: SortKey {
    @inline(__always)
    public static func compare(_ a: Int, _ b: Int) -> Int { a < b ? -1 : (a == b ? 0 : 1) }

    /// The value with its sign bit flipped: unsigned order equals signed order.
    @inline(__always)
    public var sortWord: UInt64 { UInt64(bitPattern: Int64(self)) ^ (1 << 63) }
}

/// The fixed part of a `SortedTree` page.
@usableFromInline
struct SortedTreePageHeader {
    /// Entries (leaf page) or children (inner page).
    var count: Int32
    /// Slots allocated.
    var room: Int32
    /// 0 for a leaf; an inner page's children have height one less.
    var height: Int32
    /// Elements in the page's subtree.
    var total: Int
}

/// A persistent ordered map with order statistics: a B+tree of pages with packed search words.
///
/// - Pages: a leaf holds up to `maxLeaf` entries, an inner page up to `maxInner` children with
///   each child's element count and a separator key. Every page keeps its keys' `sortWord`s in one
///   contiguous run ahead of the keys, so a search step scans a few cache lines of words and
///   reads one key only when words tie. A map of at most `maxLeaf` elements is a single leaf:
///   one allocation, sized to its contents.
/// - Structural sharing: copies share pages; a write copies only the pages on the path it touches
///   (whole pages, so a persistent write copies up to `maxLeaf` entries per level) and mutates in
///   place when nothing else references them.
/// - `rank`, `element(at:)` and positional iteration are O(log n) from the per-child counts, which
///   gives O(log n + k) windows.
///
/// Invariants (checked by `checkInvariants` in tests): all leaves are at the same depth; keys
/// strictly increase across the leaves in order; an inner page's separator `i` (for `i ≥ 1`) is
/// above every key of child `i - 1` and at or below every key of child `i`; every stored word is
/// its key's `sortWord`; counts and totals add up; pages other than the root hold at least
/// `minFill` entries or children, an inner root at least two, and the root is never an empty leaf.
public struct SortedTree<Key: SortKey, Value> {
    @usableFromInline
    final class Page: ManagedBuffer<SortedTreePageHeader, UInt64> {
        /// A page with `room` slots and nothing in them.
        static func make(height: Int, room: Int) -> Page {
            precondition(
                MemoryLayout<Key>.alignment <= 8 && MemoryLayout<Value>.alignment <= 8,
                "SortedTree: keys and values must need at most 8-byte alignment")
            let keyWords = wordCount(room * MemoryLayout<Key>.stride)
            let tail = height == 0
                ? room + keyWords + wordCount(room * MemoryLayout<Value>.stride)
                : room + keyWords + 2 * room
            let page = unsafeDowncast(
                Page.create(minimumCapacity: tail) { _ in
                    SortedTreePageHeader(count: 0, room: Int32(room), height: Int32(height), total: 0)
                }, to: Page.self)
            // The tail is laid out as: words, keys, then values (leaf) or counts and children.
            // Keys and values live apart (not as tuples) so that the page's deinit, which runs
            // unspecialised, needs no tuple type metadata.
            let keys = UnsafeMutableRawPointer(page.words + room)
            keys.bindMemory(to: Key.self, capacity: room)
            let after = keys + 8 * keyWords
            if height == 0 {
                after.bindMemory(to: Value.self, capacity: room)
            } else {
                after.bindMemory(to: Int.self, capacity: room)
                (after + 8 * room).bindMemory(to: Page.self, capacity: room)
            }
            return page
        }

        @inline(__always)
        static func wordCount(_ bytes: Int) -> Int { (bytes + 7) >> 3 }

        deinit {
            let n = count
            Key.destroy(keys, count: n)
            if height == 0 {
                values.deinitialize(count: n)
            } else {
                children.deinitialize(count: n)
            }
        }

        @inline(__always) var count: Int { Int(header.count) }
        @inline(__always) var room: Int { Int(header.room) }
        @inline(__always) var height: Int { Int(header.height) }
        @inline(__always) var total: Int { header.total }

        // Pointers into the page; valid while the page is alive.
        @inline(__always) var words: UnsafeMutablePointer<UInt64> { withUnsafeMutablePointerToElements { $0 } }
        @inline(__always) var keys: UnsafeMutablePointer<Key> {
            UnsafeMutableRawPointer(words + room).assumingMemoryBound(to: Key.self)
        }
        /// Where a leaf's values or an inner page's counts start.
        @inline(__always) private var afterKeys: UnsafeMutableRawPointer {
            let r = room
            return UnsafeMutableRawPointer(words + r + Page.wordCount(r * MemoryLayout<Key>.stride))
        }
        @inline(__always) var values: UnsafeMutablePointer<Value> { afterKeys.assumingMemoryBound(to: Value.self) }
        @inline(__always) var sizes: UnsafeMutablePointer<Int> { afterKeys.assumingMemoryBound(to: Int.self) }
        @inline(__always) var children: UnsafeMutablePointer<Page> {
            UnsafeMutableRawPointer(sizes + room).assumingMemoryBound(to: Page.self)
        }

        /// The element at `i` of a leaf.
        @inline(__always)
        func element(_ i: Int) -> (key: Key, value: Value) { (keys[i], values[i]) }

        /// A copy sharing the elements (each retained once more).
        func copy() -> Page {
            let n = count
            let page = Page.make(height: height, room: room)
            page.words.initialize(from: words, count: n)
            // Element by element, which specialises (the bulk `initialize(from:count:)` goes
            // through the runtime's generic array routine).
            let fromKeys = keys
            let toKeys = page.keys
            for i in 0..<n { (toKeys + i).initialize(to: fromKeys[i]) }
            if height == 0 {
                let from = values
                let to = page.values
                for i in 0..<n { (to + i).initialize(to: from[i]) }
            } else {
                page.sizes.initialize(from: sizes, count: n)
                let from = children
                let to = page.children
                for i in 0..<n { (to + i).initialize(to: from[i]) }
            }
            page.header.count = header.count
            page.header.total = header.total
            return page
        }

        /// A leaf with more room holding this leaf's entries, moved (this page is left empty).
        func grown(to newRoom: Int) -> Page {
            let n = count
            let page = Page.make(height: 0, room: newRoom)
            page.words.initialize(from: words, count: n)
            page.keys.moveInitialize(from: keys, count: n)
            page.values.moveInitialize(from: values, count: n)
            page.header.count = header.count
            page.header.total = header.total
            header.count = 0
            header.total = 0
            return page
        }

        /// Moves the elements of one region from slot `i` on up by one, leaving slot `i` free.
        @inline(__always)
        private func openGap<T>(_ region: UnsafeMutablePointer<T>, at i: Int) {
            (region + i + 1).moveInitialize(from: region + i, count: count - i)
        }

        /// Moves the elements of one region after slot `i` down by one (slot `i` must be free).
        @inline(__always)
        private func closeGap<T>(_ region: UnsafeMutablePointer<T>, at i: Int) {
            (region + i).moveInitialize(from: region + i + 1, count: count - i - 1)
        }

        /// Leaf: inserts an entry at `i` (there must be room).
        @inline(__always)
        func insertEntry(at i: Int, _ key: Key, _ word: UInt64, _ value: Value) {
            openGap(words, at: i)
            openGap(keys, at: i)
            openGap(values, at: i)
            words[i] = word
            (keys + i).initialize(to: key)
            (values + i).initialize(to: value)
            header.count += 1
            header.total += 1
        }

        /// Leaf: removes and returns the entry at `i`.
        @inline(__always)
        func removeEntry(at i: Int) -> Value {
            (keys + i).deinitialize(count: 1)
            let removed = (values + i).move()
            closeGap(words, at: i)
            closeGap(keys, at: i)
            closeGap(values, at: i)
            header.count -= 1
            header.total -= 1
            return removed
        }

        /// Inner page: inserts a child with its separator and element count at `i`.
        func insertChild(at i: Int, _ key: Key, _ word: UInt64, _ child: Page) {
            openGap(words, at: i)
            openGap(keys, at: i)
            openGap(sizes, at: i)
            openGap(children, at: i)
            words[i] = word
            (keys + i).initialize(to: key)
            sizes[i] = child.total
            (children + i).initialize(to: child)
            header.count += 1
            header.total += child.total
        }

        /// Inner page: removes the child at `i` with its separator.
        func removeChild(at i: Int) {
            header.total -= sizes[i]
            (keys + i).deinitialize(count: 1)
            (children + i).deinitialize(count: 1)
            closeGap(words, at: i)
            closeGap(keys, at: i)
            closeGap(sizes, at: i)
            closeGap(children, at: i)
            header.count -= 1
        }

        /// Moves `k` elements between neighbouring pages of one height: from the front of
        /// `right` to the end of `left` when `leftward`, else from the end of `left` to the front
        /// of `right` (the receiving page must have room).
        static func shift(_ left: Page, _ right: Page, _ k: Int, leftward: Bool) {
            let ln = left.count
            let rn = right.count
            @inline(__always)
            func move<T>(_ l: UnsafeMutablePointer<T>, _ r: UnsafeMutablePointer<T>) {
                if leftward {
                    (l + ln).moveInitialize(from: r, count: k)
                    r.moveInitialize(from: r + k, count: rn - k)
                } else {
                    (r + k).moveInitialize(from: r, count: rn)
                    r.moveInitialize(from: l + ln - k, count: k)
                }
            }
            move(left.words, right.words)
            move(left.keys, right.keys)
            var moved = k
            if left.height == 0 {
                move(left.values, right.values)
            } else {
                moved = leftward ? SortedTree.sum(right.sizes, k) : SortedTree.sum(left.sizes + ln - k, k)
                move(left.sizes, right.sizes)
                move(left.children, right.children)
            }
            let delta = leftward ? k : -k
            left.header.count += Int32(delta)
            right.header.count -= Int32(delta)
            left.header.total += leftward ? moved : -moved
            right.header.total -= leftward ? moved : -moved
        }
    }

    /// A page split off to the right during an insertion, with the separator that leads to it.
    private typealias Split = (key: Key, word: UInt64, page: Page)

    @usableFromInline var root: Page?

    /// Most entries in a leaf (a map up to this size is one leaf).
    public static var maxLeaf: Int { 32 }
    /// Most children of an inner page. Smaller than a leaf: a persistent write copies every
    /// page on its path and the old version's pages release all their children when they go,
    /// so narrow inner pages keep that cost down, while the levels they add sit near the root,
    /// in cache.
    static var maxInner: Int { 16 }
    /// Fewest entries or children in a page other than the root.
    static var minFill: Int { 8 }
    /// Fill of leaves and inner pages made by bulk building (room for a few inserts each).
    static func buildFill(height: Int) -> Int { height == 0 ? 28 : 15 }

    public init() {
        root = nil
    }

    /// Builds from elements already sorted by key with no duplicates.
    public init(sortedUniqueElements elements: [(Key, Value)]) {
        let n = elements.count
        guard n > 0 else {
            root = nil
            return
        }
        if n <= SortedTree.maxLeaf {
            let leaf = Page.make(height: 0, room: n)
            SortedTree.fill(leaf, elements, 0..<n)
            root = leaf
            return
        }
        var level: [Page] = []
        for range in SortedTree.chunks(n, height: 0) {
            let leaf = Page.make(height: 0, room: SortedTree.maxLeaf)
            SortedTree.fill(leaf, elements, range)
            level.append(leaf)
        }
        root = SortedTree.stack(level)
    }

    /// Builds the inner levels over leaves in key order; returns the root.
    private static func stack(_ leaves: [Page]) -> Page? {
        var level = leaves
        var height = 1
        while level.count > 1 {
            var upper: [Page] = []
            for range in SortedTree.chunks(level.count, height: height) {
                let page = Page.make(height: height, room: SortedTree.maxInner)
                for i in range {
                    let child = level[i]
                    let key = child.keys[0]
                    page.insertChild(at: page.count, key, key.sortWord, child)
                }
                upper.append(page)
            }
            level = upper
            height += 1
        }
        return level.first
    }

    /// `n` items cut into consecutive runs of near-equal length for pages of `height`.
    private static func chunks(_ n: Int, height: Int) -> [Range<Int>] {
        let fill = buildFill(height: height)
        let pieces = (n + fill - 1) / fill
        return (0..<pieces).map { i in (i * n / pieces)..<((i + 1) * n / pieces) }
    }

    /// Builds a map from `count` elements that `next` hands out in strictly increasing key order
    /// (the caller checks the order), laid out in pages as `init(sortedUniqueElements:)` does but
    /// written straight into the leaves: no array of the elements is ever gathered. When `next`
    /// throws, the pages built so far are released whole.
    public init<E: Error>(sortedCount count: Int, next: () throws(E) -> (Key, Value)) throws(E) {
        guard count > 0 else {
            root = nil
            return
        }
        if count <= SortedTree.maxLeaf {
            let leaf = Page.make(height: 0, room: count)
            try SortedTree.fill(leaf, count: count, next)
            root = leaf
            return
        }
        // Leaves of near-equal fill, made as the elements arrive: a count larger than the input
        // behind `next` fails when `next` does, having allocated only for what it delivered.
        let pieces = count / SortedTree.buildFill(height: 0) + (count % SortedTree.buildFill(height: 0) == 0 ? 0 : 1)
        let base = count / pieces
        let extra = count % pieces
        var leaves: [Page] = []
        for i in 0..<pieces {
            let leaf = Page.make(height: 0, room: SortedTree.maxLeaf)
            leaves.append(leaf)
            try SortedTree.fill(leaf, count: base + (i < extra ? 1 : 0), next)
        }
        root = SortedTree.stack(leaves)
    }

    /// Fills an empty leaf with `count` elements from `next`; the leaf's count always covers
    /// exactly the elements initialised, also when `next` throws part-way.
    private static func fill<E: Error>(_ leaf: Page, count: Int, _ next: () throws(E) -> (Key, Value)) throws(E) {
        let w = leaf.words
        let k = leaf.keys
        let v = leaf.values
        var i = 0
        defer {
            leaf.header.count = Int32(i)
            leaf.header.total = i
        }
        while i < count {
            let (key, value) = try next()
            w[i] = key.sortWord
            (k + i).initialize(to: key)
            (v + i).initialize(to: value)
            i += 1
        }
    }

    private static func fill(_ leaf: Page, _ elements: [(Key, Value)], _ range: Range<Int>) {
        let w = leaf.words
        let k = leaf.keys
        let v = leaf.values
        var i = 0
        for j in range {
            let (key, value) = elements[j]
            w[i] = key.sortWord
            (k + i).initialize(to: key)
            (v + i).initialize(to: value)
            i += 1
        }
        leaf.header.count = Int32(i)
        leaf.header.total = i
    }

    public var count: Int { root?.total ?? 0 }
    public var isEmpty: Bool { root == nil }

    /// True when both maps share the same storage (a cheap sufficient test for equality).
    public func isIdentical(to other: SortedTree) -> Bool {
        root === other.root
    }

    // MARK: Searching one page

    /// Among `words[from..<n]`: where the words below `word` end and where those equal to it end.
    @inline(__always)
    private static func wordBounds(_ words: UnsafeMutablePointer<UInt64>, from: Int, to n: Int, _ word: UInt64) -> (Int, Int) {
        // Branch-free: every word is read (a few cache lines fetched in parallel) and the loop
        // never mispredicts; the words are sorted, so the counts are positions.
        var below = from
        var atOrBelow = from
        var i = from
        while i < n {
            let w = words[i]
            below &+= w < word ? 1 : 0
            atOrBelow &+= w <= word ? 1 : 0
            i &+= 1
        }
        return (below, atOrBelow)
    }

    /// Leaf: the first index whose key is not below `key`, and whether it equals `key`.
    @inline(__always)
    private static func find(_ leaf: Page, _ key: Key, _ word: UInt64) -> (index: Int, found: Bool) {
        var (lo, hi) = wordBounds(leaf.words, from: 0, to: leaf.count, word)
        // Only keys whose words tie with `key`'s need a full comparison.
        let k = leaf.keys
        while lo < hi {
            let mid = (lo + hi) >> 1
            let c = Key.compare(k[mid], key)
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

    /// Inner page: the child whose subtree holds `key`'s place (the last separator at or below it).
    @inline(__always)
    private static func route(_ page: Page, _ key: Key, _ word: UInt64) -> Int {
        var (lo, hi) = wordBounds(page.words, from: 1, to: page.count, word)
        let k = page.keys
        while lo < hi {
            let mid = (lo + hi) >> 1
            if Key.compare(k[mid], key) <= 0 { lo = mid + 1 } else { hi = mid }
        }
        return lo - 1
    }

    @inline(__always)
    private static func sum(_ sizes: UnsafeMutablePointer<Int>, _ n: Int) -> Int {
        var total = 0
        var i = 0
        while i < n {
            total &+= sizes[i]
            i &+= 1
        }
        return total
    }

    /// Inner page: the child holding position `index`, and the position within that child.
    @inline(__always)
    private static func childAt(_ page: Page, _ index: Int) -> (child: Int, rest: Int) {
        let s = page.sizes
        let n = page.count
        var i = index
        var c = 0
        while c < n - 1 && i >= s[c] {
            i -= s[c]
            c += 1
        }
        return (c, i)
    }

    // MARK: Lookup

    public subscript(key: Key) -> Value? {
        guard var page = root else { return nil }
        let word = key.sortWord
        while page.height != 0 { page = page.children[SortedTree.route(page, key, word)] }
        let (i, found) = SortedTree.find(page, key, word)
        return found ? page.values[i] : nil
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
        guard var page = root else { return (0, false) }
        let word = key.sortWord
        var position = 0
        while page.height != 0 {
            let c = SortedTree.route(page, key, word)
            position += SortedTree.sum(page.sizes, c)
            page = page.children[c]
        }
        let (i, found) = SortedTree.find(page, key, word)
        return (position + i, found)
    }

    /// The number of leading keys for which `isBelow` holds. `isBelow` must be monotone over all
    /// possible keys (true up to some point of the order and false after it), as a comparison
    /// with a fixed bound is: separators need not be keys still in the map.
    public func count(while isBelow: (Key) -> Bool) -> Int {
        guard var page = root else { return 0 }
        /// How many of the page's keys from `lo` on are below (binary search).
        func below(_ page: Page, from lo: Int) -> Int {
            var lo = lo
            var hi = page.count
            let k = page.keys
            while lo < hi {
                let mid = (lo + hi) >> 1
                if isBelow(k[mid]) { lo = mid + 1 } else { hi = mid }
            }
            return lo
        }
        var count = 0
        while page.height != 0 {
            // The last child whose separator is below: everything before it is below too.
            let c = below(page, from: 1) - 1
            count += SortedTree.sum(page.sizes, c)
            page = page.children[c]
        }
        return count + below(page, from: 0)
    }

    /// The element at position `index` (0-based, `0..<count`).
    public func element(at index: Int) -> (key: Key, value: Value) {
        precondition(index >= 0 && index < count, "SortedTree.element(at:): index \(index) out of 0..<\(count)")
        guard var page = root else { preconditionFailure("SortedTree.element(at:): empty map") }
        var i = index
        while page.height != 0 {
            let (c, rest) = SortedTree.childAt(page, i)
            i = rest
            page = page.children[c]
        }
        precondition(i < page.count, "SortedTree.element(at:): counts are inconsistent")
        return page.element(i)
    }

    /// The greatest key strictly less than `key`.
    public func key(before key: Key) -> Key? {
        let position = rank(of: key)
        return position > 0 ? element(at: position - 1).key : nil
    }

    public var first: (key: Key, value: Value)? {
        guard var page = root else { return nil }
        while page.height != 0 { page = page.children[0] }
        return page.element(0)
    }

    public var last: (key: Key, value: Value)? {
        guard var page = root else { return nil }
        while page.height != 0 { page = page.children[page.count - 1] }
        return page.element(page.count - 1)
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
        guard root != nil else { return nil }
        // One descent; along a shared path pages are copied on the way down (if the key turns out
        // to be absent, the copies are harmless: equal content, this tree's own).
        if !isKnownUniquelyReferenced(&root) { root = root?.copy() }
        guard var page = root else { return nil }
        let word = key.sortWord
        while page.height != 0 {
            let slot = page.children + SortedTree.route(page, key, word)
            if !isKnownUniquelyReferenced(&slot.pointee) { slot.pointee = slot.pointee.copy() }
            page = slot.pointee
        }
        let (i, found) = SortedTree.find(page, key, word)
        guard found else { return nil }
        return body(&page.values[i])
    }

    /// Removes `key`; returns the removed value.
    @discardableResult
    public mutating func removeValue(forKey key: Key) -> Value? {
        remove(key)?.value
    }

    /// Inserts a key known to be absent (one descent; no replacement attempt first). Returns the
    /// position it now occupies.
    @discardableResult
    public mutating func insertNew(_ value: Value, forKey key: Key) -> Int {
        let word = key.sortWord
        guard var page = root else {
            let leaf = Page.make(height: 0, room: 1)
            leaf.insertEntry(at: 0, key, word, value)
            root = leaf
            return 0
        }
        // Take the root out so that it is uniquely referenced when nothing else shares it.
        root = nil
        if !isKnownUniquelyReferenced(&page) { page = page.copy() }
        let (position, split) = SortedTree.insert(into: &page, key, word, value)
        if let split {
            let top = Page.make(height: page.height + 1, room: SortedTree.maxInner)
            let low = page.keys[0]
            top.insertChild(at: 0, low, low.sortWord, page)
            top.insertChild(at: 1, split.key, split.word, split.page)
            root = top
        } else {
            root = page
        }
        return position
    }

    /// Removes `key` and returns the position it occupied (one descent), or nil when absent.
    @discardableResult
    public mutating func removeReturningPosition(forKey key: Key) -> Int? {
        remove(key)?.position
    }

    private mutating func remove(_ key: Key) -> (value: Value, position: Int)? {
        guard var page = root else { return nil }
        root = nil
        if !isKnownUniquelyReferenced(&page) { page = page.copy() }
        let removed = SortedTree.remove(from: page, key, key.sortWord)
        // An inner root left with one child gives way to it; an empty leaf root to nothing.
        while page.height != 0 && page.count == 1 { page = page.children[0] }
        root = page.count == 0 ? nil : page
        return removed
    }

    /// Inserts into the uniquely referenced `page` (which may be replaced by a larger one).
    /// Returns the position within the page's subtree and, when the page split, its new right
    /// sibling with the separator leading to it.
    private static func insert(into page: inout Page, _ key: Key, _ word: UInt64, _ value: Value) -> (Int, Split?) {
        if page.height == 0 {
            let i = find(page, key, word).index
            let n = page.count
            if n < page.room {
                page.insertEntry(at: i, key, word, value)
                return (i, nil)
            }
            if n < maxLeaf {
                page = page.grown(to: Swift.min(maxLeaf, Swift.max(4, 2 * n)))
                page.insertEntry(at: i, key, word, value)
                return (i, nil)
            }
            let right = Page.make(height: 0, room: maxLeaf)
            let half = n / 2
            Page.shift(page, right, n - half, leftward: false)
            if i <= half {
                page.insertEntry(at: i, key, word, value)
            } else {
                right.insertEntry(at: i - half, key, word, value)
            }
            return (i, (right.keys[0], right.words[0], right))
        }

        let c = route(page, key, word)
        let slot = page.children + c
        if !isKnownUniquelyReferenced(&slot.pointee) { slot.pointee = slot.pointee.copy() }
        let (inner, childSplit) = insert(into: &slot.pointee, key, word, value)
        let s = page.sizes
        let position = sum(s, c) + inner
        page.header.total += 1
        guard let childSplit else {
            s[c] += 1
            return (position, nil)
        }
        s[c] = slot.pointee.total
        let n = page.count
        if n < maxInner {
            page.insertChild(at: c + 1, childSplit.key, childSplit.word, childSplit.page)
            // insertChild added the new child's elements to the total; they were already counted.
            page.header.total -= childSplit.page.total
            return (position, nil)
        }
        page.header.total -= childSplit.page.total
        let right = Page.make(height: page.height, room: maxInner)
        let half = n / 2
        Page.shift(page, right, n - half, leftward: false)
        if c + 1 <= half {
            page.insertChild(at: c + 1, childSplit.key, childSplit.word, childSplit.page)
        } else {
            right.insertChild(at: c + 1 - half, childSplit.key, childSplit.word, childSplit.page)
        }
        return (position, (right.keys[0], right.words[0], right))
    }

    /// Removes `key` from the subtree of the uniquely referenced `page`; returns its value and
    /// position within the subtree. Children left under-full are merged or refilled from a
    /// neighbour.
    private static func remove(from page: Page, _ key: Key, _ word: UInt64) -> (value: Value, position: Int)? {
        if page.height == 0 {
            let (i, found) = find(page, key, word)
            guard found else { return nil }
            return (page.removeEntry(at: i), i)
        }
        let c = route(page, key, word)
        let slot = page.children + c
        if !isKnownUniquelyReferenced(&slot.pointee) { slot.pointee = slot.pointee.copy() }
        guard let (value, inner) = remove(from: slot.pointee, key, word) else { return nil }
        let s = page.sizes
        let position = sum(s, c) + inner
        s[c] -= 1
        page.header.total -= 1
        if slot.pointee.count < minFill { rebalance(page, c) }
        return (value, position)
    }

    /// Restores the fill of child `c` of `parent` together with a neighbour: both are merged when
    /// they fit in one page, else their elements are shared out evenly.
    private static func rebalance(_ parent: Page, _ c: Int) {
        let l = c > 0 ? c - 1 : c
        let leftSlot = parent.children + l
        let rightSlot = parent.children + l + 1
        if !isKnownUniquelyReferenced(&leftSlot.pointee) { leftSlot.pointee = leftSlot.pointee.copy() }
        if !isKnownUniquelyReferenced(&rightSlot.pointee) { rightSlot.pointee = rightSlot.pointee.copy() }
        let isLeaf = leftSlot.pointee.height == 0
        let limit = isLeaf ? maxLeaf : maxInner
        let combined = leftSlot.pointee.count + rightSlot.pointee.count
        if isLeaf {
            // Leaves below an inner page have full room; copies keep their room. Be safe anyway.
            if leftSlot.pointee.room < limit { leftSlot.pointee = leftSlot.pointee.grown(to: limit) }
            if rightSlot.pointee.room < limit { rightSlot.pointee = rightSlot.pointee.grown(to: limit) }
        } else {
            // The right page's first separator becomes the one its parent holds for it, so the
            // pages' separators line up when they are joined.
            rightSlot.pointee.keys[0] = parent.keys[l + 1]
            rightSlot.pointee.words[0] = parent.words[l + 1]
        }
        let left = leftSlot.pointee
        let right = rightSlot.pointee
        if combined <= limit {
            Page.shift(left, right, right.count, leftward: true)
            parent.sizes[l] = left.total
            // Dropping the emptied right page takes its old count off the total; the elements
            // are still there, now in the left page.
            let moved = parent.sizes[l + 1]
            parent.removeChild(at: l + 1)
            parent.header.total += moved
            return
        }
        let target = combined / 2
        if left.count < target {
            Page.shift(left, right, target - left.count, leftward: true)
        } else {
            Page.shift(left, right, left.count - target, leftward: false)
        }
        parent.sizes[l] = left.total
        parent.sizes[l + 1] = right.total
        parent.keys[l + 1] = right.keys[0]
        parent.words[l + 1] = right.words[0]
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
        /// Inner pages above the current leaf, each with the child taken.
        private var path: [(page: Page, child: Int)] = []
        private var leaf: Page?
        private var index = 0

        init(tree: SortedTree, start: Int) {
            guard var page = tree.root else { return }
            var i = Swift.max(0, start)
            guard i < page.total else { return }
            while page.height != 0 {
                let (c, rest) = SortedTree.childAt(page, i)
                path.append((page, c))
                i = rest
                page = page.children[c]
            }
            leaf = page
            index = i
        }

        public mutating func next() -> (key: Key, value: Value)? {
            guard let current = leaf else { return nil }
            if index < current.count {
                defer { index += 1 }
                return current.element(index)
            }
            while let (page, c) = path.popLast() {
                guard c + 1 < page.count else { continue }
                path.append((page, c + 1))
                var below = page.children[c + 1]
                while below.height != 0 {
                    path.append((below, 0))
                    below = below.children[0]
                }
                leaf = below
                index = 1
                return below.element(0)
            }
            leaf = nil
            return nil
        }
    }

    /// Calls `body` for each element in key order (no iterator allocation).
    @inline(__always)
    public func forEach(_ body: (Key, Value) throws -> Void) rethrows {
        guard let root else { return }
        try SortedTree.visit(root, body)
    }

    private static func visit(_ page: Page, _ body: (Key, Value) throws -> Void) rethrows {
        let n = page.count
        if page.height == 0 {
            let k = page.keys
            let v = page.values
            for i in 0..<n { try body(k[i], v[i]) }
        } else {
            let c = page.children
            for i in 0..<n { try visit(c[i], body) }
        }
    }

    /// Keys in order.
    public var keys: [Key] {
        var result: [Key] = []
        result.reserveCapacity(count)
        forEach { key, _ in result.append(key) }
        return result
    }

    // MARK: Invariants (for tests)

    /// Returns a description of the first broken invariant, or `nil` when the tree is valid.
    public func checkInvariants() -> String? {
        guard let root else { return nil }
        if root.count == 0 { return "empty root page" }
        if root.height != 0 && root.count < 2 { return "inner root with one child" }
        func check(_ page: Page, lower: Key?, upper: Key?, isRoot: Bool) -> String? {
            let n = page.count
            if n > page.room { return "page over its room" }
            if n > (page.height == 0 ? SortedTree.maxLeaf : SortedTree.maxInner) { return "page over the limit" }
            if !isRoot && n < SortedTree.minFill { return "page under the minimum fill (\(n))" }
            for i in 0..<n where page.words[i] != page.keys[i].sortWord { return "stale search word" }
            // An inner page's first separator is never searched (it is not maintained when a new
            // smallest key arrives), so order is checked from the second one.
            let from = page.height == 0 ? 1 : 2
            for i in from..<Swift.max(n, from) where page.words[i - 1] > page.words[i] {
                return "search words out of order (sortWord disagrees with compare)"
            }
            if page.height == 0 {
                if page.total != n { return "leaf total mismatch" }
                for i in 0..<n {
                    let key = page.keys[i]
                    if i > 0 && !(page.keys[i - 1] < key) { return "keys out of order" }
                    if let lower, key < lower { return "key below its separator" }
                    if let upper, !(key < upper) { return "key at or above the next separator" }
                }
                return nil
            }
            var total = 0
            for i in 0..<n {
                let child = page.children[i]
                if child.height != page.height - 1 { return "leaves at different depths" }
                if page.sizes[i] != child.total { return "child count mismatch" }
                total += child.total
                if i > 1 && !(page.keys[i - 1] < page.keys[i]) { return "separators out of order" }
                let low = i == 0 ? lower : page.keys[i]
                let high = i == n - 1 ? upper : page.keys[i + 1]
                if let problem = check(child, lower: low, upper: high, isRoot: false) { return problem }
            }
            if total != page.total { return "inner total mismatch" }
            return nil
        }
        return check(root, lower: nil, upper: nil, isRoot: true)
    }

    /// Height of the page tree (0 for an empty map, 1 for a single leaf), for tests.
    public var depth: Int { root.map { $0.height + 1 } ?? 0 }
}

// Sendable by copy-on-write, like the standard library's collections: a page is mutated in place
// only while `isKnownUniquelyReferenced` proves no other tree value can see it.
extension SortedTree: @unchecked Sendable where Key: Sendable, Value: Sendable {}
