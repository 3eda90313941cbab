public import BanyanQuery
public import BanyanTree

/// One listen as its session registered it: who owns it, where it looks and how.
public struct Listen: Sendable, Equatable {
    /// The caller's identity for the listen, unique among the live ones.
    public var id: UInt64
    /// The connection (or event stream) that receives its updates.
    public var owner: UInt64
    public var namespace: String
    public var path: Path
    /// nil: the location's whole value (a default query).
    public var params: QueryParams?
    /// The v5 tag of a non-default query (nil for default queries and event streams).
    public var tag: UInt64?

    public init(id: UInt64, owner: UInt64, namespace: String, path: Path, params: QueryParams? = nil, tag: UInt64? = nil) {
        self.id = id
        self.owner = owner
        self.namespace = namespace
        self.path = path
        self.params = params.flatMap { $0.loadsAllData ? nil : $0 }
        self.tag = tag
    }

    /// Whether the listen holds a window (`QueryView`) rather than the whole location.
    public var isWindowed: Bool { params != nil }
}

/// What one listen's client must apply, in the protocol's own terms: v5 `d` (put) and `m`
/// (merge), or event-stream `put` and `patch` (paths relative to the stream).
public enum ListenUpdate: Sendable, Equatable {
    /// The value at `path` (absolute, in the listen's namespace) is now `tree`.
    case put(path: Path, tree: Tree)
    /// Below `path` (absolute), each relative path now holds its tree (`Tree.empty`: deleted).
    case merge(path: Path, children: [(path: Path, tree: Tree)])

    /// Where the update applies (absolute).
    public var path: Path {
        switch self {
        case .put(let path, _), .merge(let path, _): return path
        }
    }

    public var isMerge: Bool {
        if case .merge = self { return true }
        return false
    }

    public static func == (a: ListenUpdate, b: ListenUpdate) -> Bool {
        switch (a, b) {
        case let (.put(p, t), .put(q, u)): return p == q && t == u
        case let (.merge(p, xs), .merge(q, ys)):
            return p == q && xs.count == ys.count && zip(xs, ys).allSatisfy { $0.path == $1.path && $0.tree == $1.tree }
        default: return false
        }
    }
}

/// An update for one listen, addressed to its owner.
public struct ListenEvent: Sendable, Equatable {
    public var listen: UInt64
    public var owner: UInt64
    public var tag: UInt64?
    public var update: ListenUpdate

    public init(listen: UInt64, owner: UInt64, tag: UInt64?, update: ListenUpdate) {
        self.listen = listen
        self.owner = owner
        self.tag = tag
        self.update = update
    }
}

/// Refusals of `ListenCore.listen`.
public enum ListenError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The id is already in use.
    case duplicateID(UInt64)
    /// The core holds `ListenCore.maxListens` listens (a named limit).
    case tooManyListens(limit: Int)

    public var description: String {
        switch self {
        case .duplicateID(let id): return "listen \(id) already exists"
        case .tooManyListens(let limit): return "too many listens on this node's event loop (limit \(limit))"
        }
    }
}

/// The listens of one event loop's connections, and the updates each applied write owes them
/// (docs/realtime.md, "ListenCore"). Pure: the driver hands it the namespace's tree after each
/// applied command, in log order, and sends what it returns.
///
/// Listens are indexed by namespace, then in a trie of path segments, so a write at P visits the
/// trie along P (the listens at P and above it) and P's subtree (the listens below it): the cost
/// is O(depth of P + listens touched + trie nodes under P), never every listen of the namespace.
/// Windowed listens keep a `QueryView`, which moves in O(m log n) for m changed children.
///
/// Order: the events of one call come listen by listen in the order the listens were made, so a
/// connection sees its updates in log order and, within one write, in the order it listened.
public struct ListenCore: Sendable {
    /// Listens one core holds at most (each costs a trie path and, when windowed, an index of
    /// its location's children).
    public static let maxListens = 100_000

    struct Entry: Sendable {
        var listen: Listen
        var view: QueryView?
        /// The order the listen was made in (events of one write come in this order).
        var sequence: UInt64
    }

    struct SentKey: Hashable {
        var owner: UInt64
        var merge: Bool
        var path: Path

        init(owner: UInt64, update: ListenUpdate) {
            self.owner = owner
            merge = update.isMerge
            path = update.path
        }
    }

    private var entries: [UInt64: Entry] = [:]
    /// Each listen's `sequence`, apart, for sorting without copying entries.
    private var sequences: [UInt64: UInt64] = [:]
    private var tries: [String: ListenTrie] = [:]
    /// Listen ids by owner, so a connection's end costs its own listens only.
    private var byOwner: [UInt64: Set<UInt64>] = [:]
    private var nextSequence: UInt64 = 0

    public init() {}

    /// Live listens.
    public var count: Int { entries.count }

    public func listen(_ id: UInt64) -> Listen? { entries[id]?.listen }

    /// Registers a listen and returns its first update: the whole value at its location (for a
    /// window, the window), which the protocol sends before the listen's `ok`. `tree` is the
    /// namespace's root at the version the session may see.
    public mutating func listen(_ listen: Listen, tree: Tree) throws(ListenError) -> ListenEvent {
        guard entries[listen.id] == nil else { throw .duplicateID(listen.id) }
        guard entries.count < Self.maxListens else { throw .tooManyListens(limit: Self.maxListens) }
        let location = tree.child(at: listen.path)
        let view = listen.params.map { QueryView(params: $0, tree: location) }
        entries[listen.id] = Entry(listen: listen, view: view, sequence: nextSequence)
        sequences[listen.id] = nextSequence
        nextSequence += 1
        tries[listen.namespace, default: ListenTrie()].insert(listen.id, at: listen.path.segments[...])
        byOwner[listen.owner, default: []].insert(listen.id)
        return ListenEvent(
            listen: listen.id, owner: listen.owner, tag: listen.tag, update: .put(path: listen.path, tree: view?.viewTree ?? location))
    }

    /// Forgets a listen (unknown ids are ignored: an unlisten may cross the listen's cancellation).
    public mutating func unlisten(_ id: UInt64) {
        guard let entry = entries.removeValue(forKey: id) else { return }
        sequences[id] = nil
        tries[entry.listen.namespace]?.remove(id, at: entry.listen.path.segments[...])
        if tries[entry.listen.namespace]?.isEmpty == true { tries[entry.listen.namespace] = nil }
        byOwner[entry.listen.owner]?.remove(id)
        if byOwner[entry.listen.owner]?.isEmpty == true { byOwner[entry.listen.owner] = nil }
    }

    /// Forgets every listen of a connection that ended: O(its listens × depth).
    public mutating func removeOwner(_ owner: UInt64) {
        for id in (byOwner[owner] ?? []).sorted() { unlisten(id) }
    }

    /// The updates one applied command owes: `written` are the paths it wrote (a set: one; a
    /// multi-path update: each of its paths), `tree` the namespace's root after it.
    public mutating func applied(namespace: String, written: [Path], tree: Tree) -> [ListenEvent] {
        guard !written.isEmpty, let trie = tries[namespace] else { return [] }
        // One walk per written path, recording per listen what it must know: whether a path at
        // or above it was written, and which paths below it: O(Σ (depth + listens touched)).
        var touched: [UInt64: Touch] = [:]
        for path in written { trie.collect(touching: path, from: 0, into: &touched) }
        guard !touched.isEmpty else { return [] }
        var out: [ListenEvent] = []
        // Default listens' updates already queued in this call, by owner, kind and path: an owner
        // listening at /a and /a/b gets a write at /a/b/c once. (Within one write, a default
        // listen's update is determined by its kind and path, so the key is enough. A window's is
        // not: windowed listens, tagged or not, are never merged with others.)
        var sentUntagged = Set<SentKey>()
        // Sorted by the order the listens were made, on plain integers (a comparator that looked
        // each listen up would copy its entry twice per comparison: most of the cost of a write
        // with thousands of listeners, measured).
        var order: [(sequence: UInt64, id: UInt64)] = []
        order.reserveCapacity(touched.count)
        for id in touched.keys { if let sequence = sequences[id] { order.append((sequence, id)) } }
        order.sort { $0.sequence < $1.sequence }
        for (_, id) in order {
            // Taken out and put back, so a window's view is uniquely held while it moves (a copy
            // left in the dictionary would make it copy its index on write).
            guard let touch = touched[id], var entry = entries.removeValue(forKey: id) else { continue }
            let updates = Self.updates(for: &entry, touch: touch, tree: tree)
            entries[id] = entry
            for update in updates {
                if entry.listen.tag == nil, !entry.listen.isWindowed,
                    !sentUntagged.insert(SentKey(owner: entry.listen.owner, update: update)).inserted
                { continue }
                out.append(ListenEvent(listen: id, owner: entry.listen.owner, tag: entry.listen.tag, update: update))
            }
        }
        return out
    }

    /// After the namespace's state was replaced wholesale (a snapshot installed from the leader):
    /// every listen of it gets its whole value again.
    public mutating func restored(namespace: String, tree: Tree) -> [ListenEvent] {
        var out: [ListenEvent] = []
        let ids = entries.values.filter { $0.listen.namespace == namespace }.sorted { $0.sequence < $1.sequence }.map(\.listen.id)
        for id in ids {
            guard var entry = entries[id] else { continue }
            let location = tree.child(at: entry.listen.path)
            var value = location
            if var view = entry.view {
                _ = view.apply(location, changes: .all)
                value = view.viewTree
                entry.view = view
                entries[id] = entry
            }
            out.append(ListenEvent(listen: id, owner: entry.listen.owner, tag: entry.listen.tag, update: .put(path: entry.listen.path, tree: value)))
        }
        return out
    }

    /// What one write did at a listen's location: a path at or above it was written (the
    /// location replaced), and the written paths below it, in the write's order.
    struct Touch {
        var replaced = false
        var below: [Path] = []
    }

    /// What one write owes one listen it touches.
    static func updates(for entry: inout Entry, touch: Touch, tree: Tree) -> [ListenUpdate] {
        let location = entry.listen.path
        if var view = entry.view {
            let changes: ChildChanges = touch.replaced ? .all : touch.below.isEmpty ? .none : .keys(touch.below.map { $0.segments[location.count] })
            let events = view.apply(tree.child(at: location), changes: changes)
            entry.view = view
            guard !events.isEmpty else { return [] }
            // A window that gains or loses children (or turns into or from a leaf) is sent whole,
            // as one update (what the SDKs expect of a tagged query); otherwise only the children
            // whose values changed.
            var changed: [(path: Path, tree: Tree)] = []
            for event in events {
                switch event.kind {
                case .childChanged:
                    if let key = event.key { changed.append((Path(segments: [key]), event.tree)) }
                case .childMoved, .value:
                    continue
                case .childAdded, .childRemoved:
                    return [.put(path: location, tree: view.viewTree)]
                }
            }
            // Only a value event: the location is or was a leaf.
            return changed.isEmpty ? [.put(path: location, tree: view.viewTree)] : [.merge(path: location, children: changed)]
        }
        // The whole location: a write at or above it replaces it.
        if touch.replaced {
            return [.put(path: location, tree: tree.child(at: location))]
        }
        let below = touch.below
        guard let first = below.first else { return [] }
        if below.count == 1 { return [.put(path: first, tree: tree.child(at: first))] }
        // Several paths below it (a multi-path update): one merge at their deepest common
        // ancestor, which lies at or below the location.
        var common = first.segments[...]
        for path in below.dropFirst() {
            let shared = zip(common, path.segments).prefix { $0 == $1 }.count
            common = common.prefix(shared)
        }
        let base = Path(segments: Array(common))
        var children: [(path: Path, tree: Tree)] = []
        for path in below {
            guard let relative = base.relative(path) else { continue }
            children.append((relative, tree.child(at: path)))
        }
        return [.merge(path: base, children: children)]
    }
}

/// Listen ids by path: each node holds the listens at its location.
struct ListenTrie: Sendable {
    private var here: Set<UInt64> = []
    private var children: [ChildKey: ListenTrie] = [:]

    var isEmpty: Bool { here.isEmpty && children.isEmpty }

    mutating func insert(_ id: UInt64, at path: ArraySlice<ChildKey>) {
        guard let key = path.first else {
            here.insert(id)
            return
        }
        children[key, default: ListenTrie()].insert(id, at: path.dropFirst())
    }

    mutating func remove(_ id: UInt64, at path: ArraySlice<ChildKey>) {
        guard let key = path.first else {
            here.remove(id)
            return
        }
        children[key]?.remove(id, at: path.dropFirst())
        if children[key]?.isEmpty == true { children[key] = nil }
    }

    /// Records what a write at `path` does to the listens it touches: for those strictly above
    /// it, one more path below them; for those at it or below it, their location replaced. This
    /// node is at depth `depth` of `path`.
    func collect(touching path: Path, from depth: Int, into out: inout [UInt64: ListenCore.Touch]) {
        guard depth < path.count else {
            collectReplaced(into: &out)
            return
        }
        for id in here { out[id, default: ListenCore.Touch()].below.append(path) }
        children[path.segments[depth]]?.collect(touching: path, from: depth + 1, into: &out)
    }

    private func collectReplaced(into out: inout [UInt64: ListenCore.Touch]) {
        for id in here { out[id, default: ListenCore.Touch()].replaced = true }
        for child in children.values { child.collectReplaced(into: &out) }
    }
}
