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

/// The updates one applied command owes, each distinct update held once: every default listen
/// at one location gets the same update, so a thousand listeners of a path share one value (and
/// a renderer can turn it into bytes once). `deliveries` come in the order `ListenCore`
/// promises for its events.
public struct ListenFanOut: Sendable {
    /// One listen's update: `updates[update]`, addressed to the listen's owner (tagged when the
    /// listen is).
    public struct Delivery: Sendable, Equatable {
        public var listen: UInt64
        public var owner: UInt64
        public var tag: UInt64?
        public var update: Int
    }

    /// The distinct updates. Two deliveries with the same index and the same tag carry equal
    /// messages; a window's update is never shared with another listen's.
    public var updates: [ListenUpdate] = []
    public var deliveries: [Delivery] = []

    public init() {}

    /// Events already made one per listen (a snapshot's resend), each its own update.
    public init(events: [ListenEvent]) {
        updates = events.map(\.update)
        deliveries = events.enumerated().map { Delivery(listen: $1.listen, owner: $1.owner, tag: $1.tag, update: $0) }
    }

    public var isEmpty: Bool { deliveries.isEmpty }

    /// One event per delivery (the update copied into each).
    public var events: [ListenEvent] {
        deliveries.map { ListenEvent(listen: $0.listen, owner: $0.owner, tag: $0.tag, update: updates[$0.update]) }
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

    /// An owner and one of a fan-out's updates (an owner is sent each update once).
    struct Sent: Hashable {
        var owner: UInt64
        var update: Int
    }

    /// A default listen's update, within one write, is determined by its kind and path.
    struct UpdateKey: Hashable {
        var merge: Bool
        var path: Path
    }

    private var entries: [UInt64: Entry] = [:]
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
        let member = ListenTrie.Member(sequence: nextSequence, id: listen.id, owner: listen.owner, tag: listen.tag, windowed: view != nil)
        nextSequence += 1
        tries[listen.namespace, default: ListenTrie()].insert(member, at: listen.path.segments[...])
        byOwner[listen.owner, default: []].insert(listen.id)
        return ListenEvent(
            listen: listen.id, owner: listen.owner, tag: listen.tag, update: .put(path: listen.path, tree: view?.viewTree ?? location))
    }

    /// Forgets a listen (unknown ids are ignored: an unlisten may cross the listen's cancellation).
    public mutating func unlisten(_ id: UInt64) {
        guard let entry = entries.removeValue(forKey: id) else { return }
        tries[entry.listen.namespace]?.remove(sequence: entry.sequence, at: entry.listen.path.segments[...])
        if tries[entry.listen.namespace]?.isEmpty == true { tries[entry.listen.namespace] = nil }
        byOwner[entry.listen.owner]?.remove(id)
        if byOwner[entry.listen.owner]?.isEmpty == true { byOwner[entry.listen.owner] = nil }
    }

    /// Forgets every listen of a connection that ended: O(its listens × depth).
    public mutating func removeOwner(_ owner: UInt64) {
        for id in (byOwner[owner] ?? []).sorted() { unlisten(id) }
    }

    /// The updates one applied command owes, one event per listen: `written` are the paths it
    /// wrote (a set: one; a multi-path update: each of its paths), `tree` the namespace's root
    /// after it. `fanOut` gives the same updates without copying them per listen.
    public mutating func applied(namespace: String, written: [Path], tree: Tree) -> [ListenEvent] {
        fanOut(namespace: namespace, written: written, tree: tree).events
    }

    /// The updates one applied command owes (as `applied`), each distinct update once: the
    /// default listens at one location share their update, computed once (not once per listen).
    public mutating func fanOut(namespace: String, written: [Path], tree: Tree) -> ListenFanOut {
        var out = ListenFanOut()
        guard !written.isEmpty, let trie = tries[namespace] else { return out }
        // One walk per written path, recording per location holding listens what the write did
        // there: whether a path at or above it was written, and which paths below it. O(Σ (depth
        // + locations touched)); the listens themselves are visited once, below.
        var touched: [ListenTrie.Touched] = []
        var slots: [Path: Int] = [:]
        for path in written { trie.collect(touching: path, from: 0, into: &touched, slots: &slots) }
        guard !touched.isEmpty else { return out }
        // Listens in the order they were made: each location keeps its own in that order, so
        // one location (the common case: many listeners of one path) needs no sort.
        var order: [(sequence: UInt64, location: Int, member: Int)] = []
        if touched.count > 1 {
            order.reserveCapacity(touched.reduce(0) { $0 + $1.members.count })
            for (l, location) in touched.enumerated() {
                for (m, member) in location.members.enumerated() { order.append((member.sequence, l, m)) }
            }
            order.sort { $0.sequence < $1.sequence }
        }
        // Each location's update for its default listens, made the first time one needs it, and
        // shared (by kind and path) with every other location's equal update.
        var shared: [Int?] = Array(repeating: nil, count: touched.count)
        var byKey: [UpdateKey: Int] = [:]
        // Default listens' updates already sent in this call, by owner: an owner listening at /a
        // and /a/b gets a write at /a/b/c once. (Within one write, a default listen's update is
        // determined by its kind and path. A window's is not: windowed listens, tagged or not,
        // are never merged with others.)
        var sentUntagged = Set<Sent>()
        out.deliveries.reserveCapacity(touched.count == 1 ? touched[0].members.count : order.count)
        func visit(_ l: Int, _ member: ListenTrie.Member) {
            if member.windowed {
                // Taken out and put back, so a window's view is uniquely held while it moves (a
                // copy left in the dictionary would make it copy its index on write).
                guard var entry = entries.removeValue(forKey: member.id) else { return }
                let updates = Self.updates(for: &entry, touch: touched[l].touch, tree: tree)
                entries[member.id] = entry
                for update in updates {
                    out.updates.append(update)
                    out.deliveries.append(.init(listen: member.id, owner: member.owner, tag: member.tag, update: out.updates.count - 1))
                }
                return
            }
            let index: Int
            if let made = shared[l] {
                index = made
            } else {
                guard let update = Self.defaultUpdate(at: touched[l].location, touch: touched[l].touch, tree: tree) else {
                    shared[l] = -1
                    return
                }
                let key = UpdateKey(merge: update.isMerge, path: update.path)
                if let known = byKey[key] {
                    index = known
                } else {
                    out.updates.append(update)
                    index = out.updates.count - 1
                    byKey[key] = index
                }
                shared[l] = index
            }
            guard index >= 0 else { return }
            if member.tag == nil, !sentUntagged.insert(Sent(owner: member.owner, update: index)).inserted { return }
            out.deliveries.append(.init(listen: member.id, owner: member.owner, tag: member.tag, update: index))
        }
        if touched.count == 1 {
            for member in touched[0].members { visit(0, member) }
        } else {
            for (_, l, m) in order { visit(l, touched[l].members[m]) }
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
        return defaultUpdate(at: location, touch: touch, tree: tree).map { [$0] } ?? []
    }

    /// What one write owes a default listen (the whole location) at `location`: the same for
    /// every default listen there.
    static func defaultUpdate(at location: Path, touch: Touch, tree: Tree) -> ListenUpdate? {
        // A write at or above the location replaces it.
        if touch.replaced {
            return .put(path: location, tree: tree.child(at: location))
        }
        let below = touch.below
        guard let first = below.first else { return nil }
        if below.count == 1 { return .put(path: first, tree: tree.child(at: first)) }
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
        return .merge(path: base, children: children)
    }
}

/// Listens by path: each node holds the listens at its location, in the order they were made.
struct ListenTrie: Sendable {
    /// What a fan-out needs of a listen without looking its entry up.
    struct Member: Sendable {
        var sequence: UInt64
        var id: UInt64
        var owner: UInt64
        var tag: UInt64?
        var windowed: Bool
    }

    /// A location with listens that one write touched, and what the write did there.
    struct Touched {
        var location: Path
        var members: [Member]
        var touch: ListenCore.Touch
    }

    /// Sorted by `sequence` (listens are made in increasing sequence, so inserting appends).
    private var here: [Member] = []
    private var children: [ChildKey: ListenTrie] = [:]

    var isEmpty: Bool { here.isEmpty && children.isEmpty }

    mutating func insert(_ member: Member, at path: ArraySlice<ChildKey>) {
        guard let key = path.first else {
            if let last = here.last, last.sequence > member.sequence {
                here.insert(member, at: position(of: member.sequence))
            } else {
                here.append(member)
            }
            return
        }
        children[key, default: ListenTrie()].insert(member, at: path.dropFirst())
    }

    mutating func remove(sequence: UInt64, at path: ArraySlice<ChildKey>) {
        guard let key = path.first else {
            let i = position(of: sequence)
            if i < here.count, here[i].sequence == sequence { here.remove(at: i) }
            return
        }
        children[key]?.remove(sequence: sequence, at: path.dropFirst())
        if children[key]?.isEmpty == true { children[key] = nil }
    }

    /// The first index of `here` whose sequence is not below `sequence`.
    private func position(of sequence: UInt64) -> Int {
        var low = 0
        var high = here.count
        while low < high {
            let mid = (low + high) / 2
            if here[mid].sequence < sequence { low = mid + 1 } else { high = mid }
        }
        return low
    }

    /// Records what a write at `path` does to the locations it touches: for those strictly
    /// above it, one more path below them; for those at it or below it, their location
    /// replaced. This node is at depth `depth` of `path`. `slots` finds a location already
    /// recorded (by an earlier path of the same write).
    func collect(touching path: Path, from depth: Int, into out: inout [Touched], slots: inout [Path: Int]) {
        guard depth < path.count else {
            collectReplaced(at: path, into: &out, slots: &slots)
            return
        }
        if !here.isEmpty {
            Self.record(Path(segments: Array(path.segments.prefix(depth))), here, into: &out, slots: &slots) { $0.below.append(path) }
        }
        children[path.segments[depth]]?.collect(touching: path, from: depth + 1, into: &out, slots: &slots)
    }

    private func collectReplaced(at location: Path, into out: inout [Touched], slots: inout [Path: Int]) {
        if !here.isEmpty { Self.record(location, here, into: &out, slots: &slots) { $0.replaced = true } }
        for (key, child) in children { child.collectReplaced(at: location.appending(key), into: &out, slots: &slots) }
    }

    private static func record(
        _ location: Path, _ members: [Member], into out: inout [Touched], slots: inout [Path: Int], _ change: (inout ListenCore.Touch) -> Void
    ) {
        if let slot = slots[location] {
            change(&out[slot].touch)
        } else {
            var touch = ListenCore.Touch()
            change(&touch)
            slots[location] = out.count
            out.append(Touched(location: location, members: members, touch: touch))
        }
    }
}
