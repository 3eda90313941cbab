/// The size a namespace's quota counts (docs/operations.md, "Namespace quotas"): the bytes of its
/// data, without the JSON punctuation around them. Each key counts its UTF-8 length, each string
/// its UTF-8 length, each number 8 and each boolean 1; a priority counts as a value of its kind.
/// The measure is additive over the tree, so a write's effect on it is found from the paths the
/// write touched alone (`dataBytes(touching:)`), never by measuring the whole namespace again;
/// and every children value carries its own (`Tree.Storage.children`), so reading the measure of
/// any subtree, a whole namespace included, is O(1).
extension Tree {
    /// The data bytes of this tree: O(1) (a children value carries them, kept by every write).
    public var dataBytes: Int {
        switch storage {
        case .empty: return 0
        case .leaf(let leaf, let priority): return Self.bytes(of: leaf) + Self.bytes(of: priority)
        case .children(_, _, let bytes): return bytes
        }
    }

    /// The data bytes counted by walking the whole tree, O(size): what `dataBytes` must equal
    /// (tests check that every write keeps the two alike).
    public var walkedDataBytes: Int {
        switch storage {
        case .empty: return 0
        case .leaf(let leaf, let priority): return Self.bytes(of: leaf) + Self.bytes(of: priority)
        case .children(let map, let priority, _):
            var total = Self.bytes(of: priority)
            map.forEach { key, child in total += key.string.utf8.count + child.walkedDataBytes }
            return total
        }
    }

    /// Whether every children value in this tree carries the data bytes its contents have:
    /// O(size), for tests.
    public var dataBytesAreConsistent: Bool {
        guard case .children(let map, let priority, let bytes) = storage else { return true }
        var total = Self.bytes(of: priority)
        var consistent = true
        map.forEach { key, child in
            total += key.string.utf8.count + child.dataBytes
            if consistent && !child.dataBytesAreConsistent { consistent = false }
        }
        return consistent && total == bytes
    }

    /// The data bytes a write at `paths` (relative to this tree) can change: the whole subtree at
    /// each path, plus what lies on the way to it (each key on the way, and the leaf and priority
    /// of every tree passed, which a write may replace or prune). Siblings off the paths are
    /// never read, and a subtree's bytes are read where it stands (O(1)), so the cost is that of
    /// the paths.
    ///
    /// For a write that changed only what lies at `paths` (a set, a multi-path update, a
    /// transaction, a priority), `after.dataBytes(touching: p) - before.dataBytes(touching: p)`
    /// is `after.dataBytes - before.dataBytes`.
    ///
    /// - Parameter priorityOnly: for each path, whether the write there changes only the
    ///   priority of the tree at it (a `.priority` write): then that tree's own leaf and priority
    ///   count, not its children. Nil: none does.
    public func dataBytes(touching paths: [Path], priorityOnly: [Bool]? = nil) -> Int {
        let flags = priorityOnly.flatMap { $0.count == paths.count ? $0 : nil } ?? Array(repeating: false, count: paths.count)
        if paths.count == 1 { return dataBytes(along: paths[0].segments[...], priorityOnly: flags[0]) }
        return dataBytes(touching: paths.indices.map { (path: paths[$0].segments[...], priorityOnly: flags[$0]) })
    }

    /// One path (most writes): a plain descent, nothing allocated.
    private func dataBytes(along path: ArraySlice<ChildKey>, priorityOnly: Bool) -> Int {
        var subtree = self
        var total = 0
        var rest = path
        while let key = rest.first {
            switch subtree.storage {
            case .empty: return total
            case .leaf(let leaf, let priority): return total + Self.bytes(of: leaf) + Self.bytes(of: priority)
            case .children(let map, let priority, _):
                total += Self.bytes(of: priority)
                guard let child = map[key] else { return total }
                total += key.string.utf8.count
                subtree = child
                rest = rest.dropFirst()
            }
        }
        guard priorityOnly else { return total + subtree.dataBytes }
        switch subtree.storage {
        case .empty: return total
        case .leaf(let leaf, let priority): return total + Self.bytes(of: leaf) + Self.bytes(of: priority)
        case .children(_, let priority, _): return total + Self.bytes(of: priority)
        }
    }

    private func dataBytes(touching paths: [(path: ArraySlice<ChildKey>, priorityOnly: Bool)]) -> Int {
        if paths.isEmpty { return 0 }
        if paths.contains(where: { $0.path.isEmpty && !$0.priorityOnly }) {
            // A path ends here: this whole subtree counts.
            return dataBytes
        }
        switch storage {
        case .empty: return 0
        case .leaf(let leaf, let priority): return Self.bytes(of: leaf) + Self.bytes(of: priority)
        case .children(let map, let priority, _):
            var total = Self.bytes(of: priority)
            // Grouped by their first key, each child on the way counted once.
            // A priority-only path ending here needs nothing beyond this tree's own priority.
            var groups: [ChildKey: [(path: ArraySlice<ChildKey>, priorityOnly: Bool)]] = [:]
            var order: [ChildKey] = []
            for (path, priorityOnly) in paths {
                guard let first = path.first else { continue }
                if groups[first] == nil { order.append(first) }
                groups[first, default: []].append((path.dropFirst(), priorityOnly))
            }
            for key in order {
                guard let child = map[key], let rest = groups[key] else { continue }
                total += key.string.utf8.count + child.dataBytes(touching: rest)
            }
            return total
        }
    }

    static func bytes(of leaf: Leaf) -> Int {
        switch leaf {
        case .bool: return 1
        case .int, .double: return 8
        case .string(let s): return s.utf8.count
        }
    }

    static func bytes(of priority: Priority) -> Int {
        switch priority {
        case .none: return 0
        case .number: return 8
        case .string(let s): return s.utf8.count
        }
    }
}
