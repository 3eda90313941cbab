/// The size a namespace's quota counts (docs/operations.md, "Namespace quotas"): the bytes of its
/// data, without the JSON punctuation around them. Each key counts its UTF-8 length, each string
/// its UTF-8 length, each number 8 and each boolean 1; a priority counts as a value of its kind.
/// The measure is additive over the tree, so a write's effect on it is found from the paths the
/// write touched alone (`dataBytes(touching:)`), never by measuring the whole namespace again.
extension Tree {
    /// The data bytes of this tree: O(size).
    public var dataBytes: Int {
        switch storage {
        case .empty: return 0
        case .leaf(let leaf, let priority): return Self.bytes(of: leaf) + Self.bytes(of: priority)
        case .children(let map, let priority):
            var total = Self.bytes(of: priority)
            map.forEach { key, child in total += key.string.utf8.count + child.dataBytes }
            return total
        }
    }

    /// The data bytes of this tree when fewer than `bound`, else nil: a walk that stops once the
    /// count reaches `bound`, so O(min(size, bound)) (every value below the root has a key of at
    /// least one byte).
    public func dataBytes(below bound: Int) -> Int? {
        var total = 0
        return adds(to: &total, below: bound) ? total : nil
    }

    private func adds(to total: inout Int, below bound: Int) -> Bool {
        switch storage {
        case .empty:
            return total < bound
        case .leaf(let leaf, let priority):
            total += Self.bytes(of: leaf) + Self.bytes(of: priority)
            return total < bound
        case .children(let map, let priority):
            total += Self.bytes(of: priority)
            if total >= bound { return false }
            for (key, child) in map.elements() {
                total += key.string.utf8.count
                if total >= bound || !child.adds(to: &total, below: bound) { return false }
            }
            return total < bound
        }
    }

    /// The data bytes a write at `paths` (relative to this tree) can change: the whole subtree at
    /// each path, plus what lies on the way to it (each key on the way, and the leaf and priority
    /// of every tree passed, which a write may replace or prune). Siblings off the paths are
    /// never read, so the cost is that of the paths and their subtrees.
    ///
    /// For a write that changed only what lies at `paths` (a set, a multi-path update, a
    /// transaction, a priority), `after.dataBytes(touching: p) - before.dataBytes(touching: p)`
    /// is `after.dataBytes - before.dataBytes`.
    ///
    /// - Parameter priorityOnly: for each path, whether the write there changes only the
    ///   priority of the tree at it (a `.priority` write): then that tree's own leaf and priority
    ///   count, not its children. Nil: none does.
    /// - Parameter known: for each path, the data bytes of the subtree at it when the caller
    ///   already knows them (a write's incoming value, measured ahead on another thread): that
    ///   subtree is then not walked. Nil entries (and priority-only paths) are measured.
    public func dataBytes(touching paths: [Path], priorityOnly: [Bool]? = nil, known: [Int?]? = nil) -> Int {
        let flags = priorityOnly.flatMap { $0.count == paths.count ? $0 : nil } ?? Array(repeating: false, count: paths.count)
        let ends = known.flatMap { $0.count == paths.count ? $0 : nil } ?? Array(repeating: nil, count: paths.count)
        if paths.count == 1 { return dataBytes(along: paths[0].segments[...], priorityOnly: flags[0], known: ends[0]) }
        return dataBytes(touching: paths.indices.map { (path: paths[$0].segments[...], priorityOnly: flags[$0], known: ends[$0]) })
    }

    /// One path (most writes): a plain descent, nothing allocated.
    private func dataBytes(along path: ArraySlice<ChildKey>, priorityOnly: Bool, known: Int? = nil) -> Int {
        var subtree = self
        var total = 0
        var rest = path
        while let key = rest.first {
            switch subtree.storage {
            case .empty: return total
            case .leaf(let leaf, let priority): return total + Self.bytes(of: leaf) + Self.bytes(of: priority)
            case .children(let map, let priority):
                total += Self.bytes(of: priority)
                guard let child = map[key] else { return total }
                total += key.string.utf8.count
                subtree = child
                rest = rest.dropFirst()
            }
        }
        guard priorityOnly else { return total + (known ?? subtree.dataBytes) }
        switch subtree.storage {
        case .empty: return total
        case .leaf(let leaf, let priority): return total + Self.bytes(of: leaf) + Self.bytes(of: priority)
        case .children(_, let priority): return total + Self.bytes(of: priority)
        }
    }

    private func dataBytes(touching paths: [(path: ArraySlice<ChildKey>, priorityOnly: Bool, known: Int?)]) -> Int {
        if paths.isEmpty { return 0 }
        if let end = paths.first(where: { $0.path.isEmpty && !$0.priorityOnly }) {
            // A path ends here: this whole subtree counts (known only when no other path meets it).
            return paths.count == 1 ? (end.known ?? dataBytes) : dataBytes
        }
        switch storage {
        case .empty: return 0
        case .leaf(let leaf, let priority): return Self.bytes(of: leaf) + Self.bytes(of: priority)
        case .children(let map, let priority):
            var total = Self.bytes(of: priority)
            // Grouped by their first key, each child on the way counted once.
            // A priority-only path ending here needs nothing beyond this tree's own priority.
            var groups: [ChildKey: [(path: ArraySlice<ChildKey>, priorityOnly: Bool, known: Int?)]] = [:]
            var order: [ChildKey] = []
            for (path, priorityOnly, known) in paths {
                guard let first = path.first else { continue }
                if groups[first] == nil { order.append(first) }
                groups[first, default: []].append((path.dropFirst(), priorityOnly, known))
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
