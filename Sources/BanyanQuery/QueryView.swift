public import BanyanTree

/// One event a view raises, in Firebase's vocabulary.
public struct ViewEvent: Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable, Equatable {
        case childRemoved = "child_removed"
        case childAdded = "child_added"
        case childMoved = "child_moved"
        case childChanged = "child_changed"
        case value
    }

    public let kind: Kind
    /// The child's key (nil for `value`).
    public let key: ChildKey?
    /// The child's tree (the old one for `child_removed`), or the view's tree for `value`.
    public let tree: Tree
    /// The key of the previous sibling in the view's order (added, moved, changed), or nil when
    /// the child is first.
    public let previousKey: ChildKey?

    public init(_ kind: Kind, key: ChildKey?, tree: Tree, previousKey: ChildKey? = nil) {
        self.kind = kind
        self.key = key
        self.tree = tree
        self.previousKey = previousKey
    }

    public var description: String {
        var text = kind.rawValue
        if let key { text += " \(key)" }
        text += " " + JSONWriter.string(tree, format: .export)
        if kind != .value && kind != .childRemoved { text += " prev=\(previousKey?.string ?? "nil")" }
        return text
    }
}

/// Which children of a location a write touched.
public enum ChildChanges: Sendable, Equatable {
    /// Nothing at or below the location changed.
    case none
    /// Only these children (or data below them) changed.
    case keys([ChildKey])
    /// The location itself was written; any child may have changed.
    case all

    /// What a set of written paths did to the children of `location`.
    public static func at(_ location: Path, written paths: [Path]) -> ChildChanges {
        var keys: [ChildKey] = []
        for path in paths {
            if path.contains(location) { return .all }
            if location.contains(path) { keys.append(path.segments[location.count]) }
        }
        return keys.isEmpty ? .none : .keys(keys)
    }
}

/// A live query over one location: holds the location's data, an index in the query's order and
/// the current window, and turns each change into Firebase's events.
///
/// Events come in Firebase's order: child_removed, child_added, child_moved, child_changed, then
/// value; within a kind, in the query's order. `previousKey` is the preceding child in the view.
/// Cost per change is O(m log n) for m changed children (independent of the window's and the
/// list's size), except when the whole location is replaced, which diffs all children.
///
/// Pure: no clock, no I/O; the caller passes each new tree at the location.
public struct QueryView: Sendable {
    public let params: QueryParams
    /// The location's complete data.
    public private(set) var locationTree: Tree
    /// The location's children in the query's order.
    public private(set) var index: TreeIndex
    /// What the view shows: the selected children (or the leaf), Firebase's "event cache".
    public private(set) var viewTree: Tree

    public init(params: QueryParams, tree: Tree) {
        self.params = params
        self.locationTree = tree
        self.index = TreeIndex(kind: params.index, tree: tree)
        self.viewTree = params.evaluate(tree, index: index)
    }

    /// The events a newly attached listener receives: child_added for each child in order, then
    /// value.
    public func initialEvents() -> [ViewEvent] {
        var events: [ViewEvent] = []
        var previous: ChildKey?
        if locationTree.hasChildren {
            let range = params.window(in: index)
            for (entry, _) in index.entries.elements(from: range.lowerBound).prefix(range.count) {
                events.append(ViewEvent(.childAdded, key: entry.key, tree: locationTree.child(entry.key), previousKey: previous))
                previous = entry.key
            }
        }
        events.append(ViewEvent(.value, key: nil, tree: viewTree))
        return events
    }

    /// The selected children in the query's order.
    public var orderedChildren: [(key: ChildKey, tree: Tree)] {
        params.orderedChildren(of: locationTree, index: index)
    }

    /// Moves the view to `newTree` and returns the events for the change.
    ///
    /// - Parameter changes: which children may differ from the current tree; `.all` diffs every
    ///   child (use it when the location itself was replaced).
    public mutating func apply(_ newTree: Tree, changes: ChildChanges = .all) -> [ViewEvent] {
        let oldTree = locationTree
        let oldViewTree = viewTree
        var changedKeys: [ChildKey]
        switch changes {
        case .none:
            return []
        case .keys(let keys):
            changedKeys = keys
        case .all:
            changedKeys = QueryView.diffKeys(oldTree, newTree)
        }
        if oldTree.isLeaf || newTree.isLeaf {
            // A leaf has no children; every child on either side changed.
            changedKeys = oldTree.children.keys + newTree.children.keys
        } else if let events = applySingleChange(newTree, changedKeys) {
            return events
        }

        // Pre-change membership of every child whose membership can change, recorded the first
        // time it is touched. Only changed children and the entries at the window's edges can
        // cross an edge, one step per changed child.
        var touched: [ChildKey: Touched] = [:]
        var order: [ChildKey] = []
        var seen = Set<ChildKey>()
        for key in changedKeys where seen.insert(key).inserted {
            let old = oldTree.child(key)
            let new = newTree.child(key)
            if old == new { continue }
            let range = params.window(in: index)
            let oldEntry = old.isEmpty ? nil : index.entry(key: key, child: old)
            let newEntry = new.isEmpty ? nil : index.entry(key: key, child: new)
            if touched[key] == nil {
                let wasIn = oldEntry.flatMap { index.position(of: $0) }.map { range.contains($0) } ?? false
                touched[key] = Touched(wasIn: wasIn, changed: true, old: old, new: new, entry: newEntry)
                order.append(key)
            } else {
                // Recorded as an edge earlier: keep its first membership, note the change.
                touched[key]?.changed = true
                touched[key]?.old = old
                touched[key]?.new = new
                touched[key]?.entry = newEntry
            }
            if params.limit != nil {
                // Only the entries just inside and just outside each edge can cross it.
                for edge in [range.lowerBound - 1, range.upperBound - 1] {
                    let first = Swift.max(edge, 0)
                    guard first < index.count else { continue }
                    var it = index.entries.elements(from: first)
                    for p in first...(edge + 1) {
                        guard let (entry, _) = it.next() else { break }
                        if touched[entry.key] == nil {
                            touched[entry.key] = Touched(wasIn: range.contains(p), changed: false, old: nil, new: nil, entry: entry)
                            order.append(entry.key)
                        }
                    }
                }
            }
            index.update(key: key, old: old, new: new)
        }
        locationTree = newTree
        guard !order.isEmpty || oldTree.isLeaf || newTree.isLeaf || oldTree.priority != newTree.priority else { return [] }

        // Final membership: an entry is in the window iff it lies between the window's first and
        // last entries (two descents instead of one position lookup per touched child).
        let range = params.window(in: index)
        let firstIn = range.isEmpty ? nil : index.element(at: range.lowerBound)
        let lastIn = range.isEmpty ? nil : index.element(at: range.upperBound - 1)
        func isIn(_ entry: IndexEntry?) -> Bool {
            guard let entry, let firstIn, let lastIn else { return false }
            return IndexEntry.compare(entry, firstIn) >= 0 && IndexEntry.compare(entry, lastIn) <= 0
        }
        func previous(_ entry: IndexEntry) -> ChildKey? {
            guard let firstIn, IndexEntry.compare(entry, firstIn) > 0 else { return nil }
            return index.entry(before: entry)?.key
        }
        var removed: [(IndexEntry, ViewEvent)] = []
        var added: [(IndexEntry, ViewEvent)] = []
        var moved: [(IndexEntry, ViewEvent)] = []
        var changed: [(IndexEntry, ViewEvent)] = []
        var viewChildren = ViewChildren(viewTree)
        let childrenView = locationTree.hasChildren
        for key in order {
            guard let t = touched[key] else { continue }
            let nowIn = childrenView && isIn(t.entry)
            switch (t.wasIn, nowIn) {
            case (true, false):
                let old = t.changed ? (t.old ?? .empty) : oldTree.child(key)
                removed.append((index.entry(key: key, child: old), ViewEvent(.childRemoved, key: key, tree: old)))
                viewChildren.removeValue(forKey: key)
            case (false, true):
                guard let entry = t.entry else { continue }
                let new = t.changed ? (t.new ?? .empty) : newTree.child(key)
                added.append((entry, ViewEvent(.childAdded, key: key, tree: new, previousKey: previous(entry))))
                viewChildren.updateValue(new, forKey: key)
            case (true, true):
                guard t.changed, let old = t.old, let new = t.new, let entry = t.entry, old != new else { continue }
                let prev = previous(entry)
                if params.index.indexedValueChanged(old, new) {
                    moved.append((entry, ViewEvent(.childMoved, key: key, tree: new, previousKey: prev)))
                }
                changed.append((entry, ViewEvent(.childChanged, key: key, tree: new, previousKey: prev)))
                viewChildren.updateValue(new, forKey: key)
            case (false, false):
                continue
            }
        }

        if !locationTree.hasChildren {
            viewTree = params.filteredLeaf(locationTree)
        } else if params.loadsAllData {
            viewTree = params.isDefault ? locationTree : locationTree.withPriority(.none)
        } else {
            viewTree = viewChildren.tree
        }

        var events: [ViewEvent] = []
        for group in [removed, added, moved, changed] {
            events.append(contentsOf: group.sorted { $0.0 < $1.0 }.map(\.1))
        }
        if !events.isEmpty || oldViewTree != viewTree {
            events.append(ViewEvent(.value, key: nil, tree: viewTree))
        }
        return events
    }

    /// The fast path for the common case: exactly one child really changed and the location's
    /// own priority did not. Returns nil (changing nothing) when the case does not apply.
    ///
    /// With one child `k` changing, no other child can cross a window edge unless `k` itself
    /// enters or leaves the window (the window is the first or last `limit` in-range children;
    /// if `k` is outside both before and after, or inside both times, the other members are the
    /// same). So the old and new positions of `k`, which the index reports while moving its entry,
    /// decide everything; the entries at the new window's edges are consulted only when `k`
    /// crossed. About four descents per change instead of about nine.
    private mutating func applySingleChange(_ newTree: Tree, _ changedKeys: [ChildKey]) -> [ViewEvent]? {
        let oldTree = locationTree
        guard oldTree.hasChildren, newTree.hasChildren, oldTree.priority == newTree.priority else { return nil }
        var single: (key: ChildKey, old: Tree, new: Tree)?
        var seen: Set<ChildKey> = []
        for key in changedKeys where changedKeys.count == 1 || seen.insert(key).inserted {
            let old = oldTree.child(key)
            let new = newTree.child(key)
            if old == new { continue }
            if single != nil { return nil }
            single = (key, old, new)
        }
        guard let (key, old, new) = single else {
            locationTree = newTree
            return []
        }

        let oldRange = params.window(in: index)
        let (oldPosition, newPosition) = index.update(key: key, old: old, new: new)
        locationTree = newTree
        let newRange = params.window(in: index)
        let wasIn = oldPosition.map { oldRange.contains($0) } ?? false
        let isIn = newPosition.map { newRange.contains($0) } ?? false
        func previous(_ position: Int) -> ChildKey? {
            position > newRange.lowerBound ? index.element(at: position - 1).key : nil
        }

        var removed: [(IndexEntry, ViewEvent)] = []
        var added: [(IndexEntry, ViewEvent)] = []
        var events: [ViewEvent] = []
        var viewChildren = ViewChildren(viewTree)
        switch (wasIn, isIn) {
        case (true, false):
            removed.append((index.entry(key: key, child: old), ViewEvent(.childRemoved, key: key, tree: old)))
            viewChildren.removeValue(forKey: key)
        case (false, true):
            if let p = newPosition {
                added.append((index.entry(key: key, child: new), ViewEvent(.childAdded, key: key, tree: new, previousKey: previous(p))))
            }
            viewChildren.updateValue(new, forKey: key)
        case (true, true):
            viewChildren.updateValue(new, forKey: key)
        case (false, false):
            break
        }
        if wasIn != isIn && params.limit != nil {
            // One other child may have crossed an edge of the window: it sits next to an edge now.
            var candidates = [newRange.lowerBound - 1, newRange.lowerBound, newRange.upperBound - 1, newRange.upperBound]
                .filter { $0 >= 0 && $0 < index.count && $0 != newPosition }
            candidates = Array(Set(candidates)).sorted()
            for p in candidates {
                let entry = index.element(at: p)
                // Its position before the change: drop k's new entry, then put k's old one back.
                var q = p
                if let n = newPosition, p > n { q -= 1 }
                if let o = oldPosition, q >= o { q += 1 }
                let was = oldRange.contains(q)
                let now = newRange.contains(p)
                if was && !now {
                    let child = newTree.child(entry.key)
                    removed.append((entry, ViewEvent(.childRemoved, key: entry.key, tree: child)))
                    viewChildren.removeValue(forKey: entry.key)
                } else if !was && now {
                    let child = newTree.child(entry.key)
                    added.append((entry, ViewEvent(.childAdded, key: entry.key, tree: child, previousKey: previous(p))))
                    viewChildren.updateValue(child, forKey: entry.key)
                }
            }
        }
        events.append(contentsOf: removed.sorted { $0.0 < $1.0 }.map(\.1))
        events.append(contentsOf: added.sorted { $0.0 < $1.0 }.map(\.1))
        if wasIn && isIn, let p = newPosition {
            let prev = previous(p)
            if params.index.indexedValueChanged(old, new) {
                events.append(ViewEvent(.childMoved, key: key, tree: new, previousKey: prev))
            }
            events.append(ViewEvent(.childChanged, key: key, tree: new, previousKey: prev))
        }

        let oldViewTree = viewTree
        if params.loadsAllData {
            viewTree = params.isDefault ? locationTree : locationTree.withPriority(.none)
        } else {
            viewTree = viewChildren.tree
        }
        if !events.isEmpty || oldViewTree != viewTree {
            events.append(ViewEvent(.value, key: nil, tree: viewTree))
        }
        return events
    }

    /// What the view remembers about a child touched by a change.
    private struct Touched {
        /// Membership in the window before the change.
        var wasIn: Bool
        /// True for children the change modified (false for window-edge entries).
        var changed: Bool
        var old: Tree?
        var new: Tree?
        /// The child's entry in the updated index (nil when it no longer exists).
        var entry: IndexEntry?
    }

    /// Keys whose children differ between two nodes, by a merge walk in key order (O(n + m)).
    public static func diffKeys(_ a: Tree, _ b: Tree) -> [ChildKey] {
        var keys: [ChildKey] = []
        var ia = a.children.elements()
        var ib = b.children.elements()
        var x = ia.next()
        var y = ib.next()
        while true {
            switch (x, y) {
            case (nil, nil):
                return keys
            case let (ea?, nil):
                keys.append(ea.key)
                x = ia.next()
            case let (nil, eb?):
                keys.append(eb.key)
                y = ib.next()
            case let (ea?, eb?):
                let c = ChildKey.compare(ea.key, eb.key)
                if c < 0 {
                    keys.append(ea.key)
                    x = ia.next()
                } else if c > 0 {
                    keys.append(eb.key)
                    y = ib.next()
                } else {
                    if ea.value != eb.value { keys.append(ea.key) }
                    x = ia.next()
                    y = ib.next()
                }
            }
        }
    }
}

/// A view's children changed one at a time, kept as a tree without a priority: each change is a
/// `Tree.set` of one child (O(log n), the tree's data bytes kept from the entry changed), never a
/// tree built again from the whole window. Setting the empty tree removes the child.
struct ViewChildren {
    private(set) var tree: Tree

    init(_ view: Tree) { tree = view.hasChildren ? view.withPriority(.none) : .empty }

    mutating func removeValue(forKey key: ChildKey) { tree.set(.empty, at: Path(segments: [key])) }

    mutating func updateValue(_ child: Tree, forKey key: ChildKey) { tree.set(child, at: Path(segments: [key])) }
}
