public import BanyanTree

extension QueryParams {
    /// The positions of `index` the query selects: the range, then the anchored limit.
    /// O(log n) with the index's order statistics.
    public func window(in index: TreeIndex) -> Range<Int> {
        var lo = 0
        var hi = index.count
        if let start {
            lo = index.count(before: start.post, inclusive: !start.inclusive)
        }
        if let end {
            hi = index.count(before: end.post, inclusive: end.inclusive)
        }
        if hi < lo { hi = lo }
        if let limit {
            switch anchor {
            // Written so that a huge limit cannot overflow.
            case .first: hi = limit >= hi - lo ? hi : lo + limit
            case .last: lo = limit >= hi - lo ? lo : hi - limit
            }
        }
        return lo..<hi
    }

    /// True when the query's filtering applies to a non-leaf only (ranges and limits turn a leaf
    /// location into null, as Firebase's ranged and limited filters do).
    func filteredLeaf(_ subtree: Tree) -> Tree {
        loadsAllData ? (isDefault ? subtree : subtree.withPriority(.none)) : .empty
    }

    /// The children the query selects, in index order. O(log n + k) given an index over `subtree`;
    /// when `index` is nil one is built (O(n log n)).
    public func orderedChildren(of subtree: Tree, index: TreeIndex? = nil) -> [(key: ChildKey, tree: Tree)] {
        guard subtree.hasChildren else { return [] }
        let idx = index ?? TreeIndex(kind: self.index, tree: subtree)
        precondition(idx.kind == self.index, "QueryParams.orderedChildren: the index must match the query's ordering")
        let range = window(in: idx)
        var result: [(key: ChildKey, tree: Tree)] = []
        result.reserveCapacity(range.count)
        for (entry, _) in idx.entries.elements(from: range.lowerBound).prefix(range.count) {
            result.append((entry.key, subtree.child(entry.key)))
        }
        return result
    }

    /// The tree the query yields: the selected children (without the location's priority, since
    /// queries carry none), or the location itself for the default query.
    public func evaluate(_ subtree: Tree, index: TreeIndex? = nil) -> Tree {
        if !subtree.hasChildren { return filteredLeaf(subtree) }
        if isDefault { return subtree }
        if loadsAllData { return subtree.withPriority(.none) }
        var children = orderedChildren(of: subtree, index: index).map { ($0.key, $0.tree) }
        if self.index != .key {
            children.sort { $0.0 < $1.0 }
        }
        return Tree(sortedChildren: children)
    }
}
