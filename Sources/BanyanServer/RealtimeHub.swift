import BanyanListen
import BanyanNode
import BanyanQuery
import BanyanReplica
import BanyanSession
import BanyanStateMachine
import BanyanTree
import Logging
import NIOCore

/// The listens of the realtime connections on one event loop (docs/realtime.md, "ListenCore",
/// "Where it runs"): one `ListenCore`, fed by one live view per namespace that any of them
/// listens to. The replica thread only hands each applied command over (trees are persistent, so
/// a version is a pointer); matching, window updates and rendering run here, on the loop.
/// Confined to `loop`: every method is called there.
final class RealtimeHub: @unchecked Sendable {
    let loop: any EventLoop
    private let runtime: NodeRuntime
    private var core = ListenCore()

    /// One namespace's live view on this loop. `tree` is the version `core` has processed: a
    /// listen starts from exactly it (never newer or older), so overlapping listens of one client
    /// never see its cache move backwards.
    private struct Feed {
        var generation: UInt64
        var watch: UInt64?
        var tree: Tree?
        /// Listens waiting for the view's first tree.
        var waiting: [UInt64] = []
        /// Listens of the namespace, started or not: the view closes when none is left.
        var listens = 0
    }
    private var feeds: [String: Feed] = [:]
    private var nextGeneration: UInt64 = 1

    /// A listen not yet started: it waits for its namespace's view or for a ReadIndex round.
    private struct Pending {
        var listen: Listen
        /// Starts from the loop's current tree without a ReadIndex round (`consistency=stale`).
        var stale: Bool
        var done: (Result<ListenEvent, ListenStartError>) -> Void
    }
    private var pending: [UInt64: Pending] = [:]
    private var namespaceOf: [UInt64: String] = [:]
    /// Listens that hold a window (their updates are never shared with other listens').
    private var windowed = Set<UInt64>()
    private var nextListen: UInt64 = 1
    /// Where each owner's updates go: a connection's handler, or an event stream.
    private var outlets: [UInt64: Outlet] = [:]
    /// Outlets written to since the last flush: flushed once, after every delivery queued on the
    /// loop before the flush (so a connection behind on several writes gets one system call).
    private var unflushed: [Outlet] = []
    private var flushScheduled = false
    private let allocator = ByteBufferAllocator()
    /// Owners to tell when the security rules change (they judge their listens again).
    private var rulesWatchers: [UInt64: () -> Void] = [:]
    /// The loop's zlib streams (permessage-deflate), shared by its connections.
    let deflate = DeflateCodec()

    enum ListenStartError: Error, CustomStringConvertible {
        case unavailable(ReplicaError)
        case refused(ListenError)
        var description: String {
            switch self {
            case .unavailable(let e): return e.description
            case .refused(let e): return e.description
            }
        }
    }

    /// One owner's destination for updates.
    private final class Outlet {
        enum Target {
            /// A v5 connection: frames encoded once per push and shared.
            case frames(any RealtimePushTarget)
            /// An event stream: each update with the namespace's tree after the write.
            case stream((ListenEvent, Tree) -> Void)
        }
        let target: Target
        let encoding: OutboundEncoding
        let flush: () -> Void
        /// In `unflushed`.
        var pending = false

        init(target: Target, encoding: OutboundEncoding, flush: @escaping () -> Void) {
            self.target = target
            self.encoding = encoding
            self.flush = flush
        }
    }

    init(loop: any EventLoop, runtime: NodeRuntime) {
        self.loop = loop
        self.runtime = runtime
    }

    var listenCount: Int { core.count }

    /// Registers where `owner`'s updates go: `target` gets each update's frames, encoded once
    /// and shared by every connection that receives them in the same `encoding`, then
    /// `flushPushes` once after the deliveries queued on the loop. The hub holds `target` until
    /// `detach`.
    func attach(owner: UInt64, encoding: OutboundEncoding = .plain, target: any RealtimePushTarget) {
        outlets[owner] = Outlet(target: .frames(target), encoding: encoding, flush: { [weak target] in target?.flushPushes() })
    }

    /// Registers an owner that renders its own updates (an event stream): `deliver` gets each
    /// update and the namespace's tree after the write; `flush` once after the deliveries queued
    /// on the loop.
    func attachStream(owner: UInt64, deliver: @escaping (ListenEvent, Tree) -> Void, flush: @escaping () -> Void) {
        outlets[owner] = Outlet(target: .stream(deliver), encoding: .plain, flush: flush)
    }

    /// The namespace's tree as this loop's listens last saw it (nil: no view of it yet).
    func tree(_ ns: String) -> Tree? { feeds[ns]?.tree }

    /// `changed` runs (on this loop) whenever the rules in force change, until `detach`.
    func watchRules(owner: UInt64, _ changed: @escaping () -> Void) { rulesWatchers[owner] = changed }

    /// The rules changed: every watcher judges its listens again.
    func rulesChanged() {
        for owner in rulesWatchers.keys.sorted() { rulesWatchers[owner]?() }
    }

    func detach(owner: UInt64) {
        rulesWatchers[owner] = nil
        outlets[owner] = nil
    }

    /// An id for a listen (unique on this loop).
    func newListenID() -> UInt64 {
        defer { nextListen += 1 }
        return nextListen
    }

    /// Starts a listen: `done` (on the loop) gets its first update, computed from a tree at least
    /// as new as the leader's commit index when the listen was asked for (a ReadIndex round, or
    /// the start of the namespace's view), or why it could not start. Nothing is delivered for
    /// the listen before `done`.
    /// A `stale` listen starts from the loop's current tree at once (the view's start when it
    /// has none yet), without the ReadIndex round.
    func listen(_ listen: Listen, stale: Bool = false, done: @escaping (Result<ListenEvent, ListenStartError>) -> Void) {
        let id = listen.id
        let ns = listen.namespace
        pending[id] = Pending(listen: listen, stale: stale, done: done)
        namespaceOf[id] = ns
        if listen.isWindowed { windowed.insert(id) }
        var feed = feeds[ns] ?? openFeed(ns)
        feed.listens += 1
        if let tree = feed.tree {
            feeds[ns] = feed
            if stale { start(id, tree: tree) } else { barrier(id, ns, generation: feed.generation) }
        } else {
            feed.waiting.append(id)
            feeds[ns] = feed
        }
    }

    /// Stops a listen, started or not (an unknown id is ignored).
    func unlisten(_ id: UInt64) {
        guard namespaceOf[id] != nil else { return }
        if pending.removeValue(forKey: id) == nil { core.unlisten(id) }
        forget(id)
    }

    private func openFeed(_ ns: String) -> Feed {
        let generation = nextGeneration
        nextGeneration += 1
        let loop = self.loop
        // The view starts from this node's own state (no ReadIndex round: that would fail without
        // a leader, and stale listens need none); each listen that must be fresh has its own
        // barrier.
        runtime.watch(namespace: ns, stale: true) { event in
            // On the replica thread: hand the event over in order (one task per loop per event).
            loop.execute { self.feedEvent(ns, generation, event) }
        }
        .hop(to: loop)
        .whenSuccess { result in
            switch result {
            case .success(let watch):
                if var feed = self.feeds[ns], feed.generation == generation {
                    feed.watch = watch
                    self.feeds[ns] = feed
                } else {
                    self.runtime.unwatch(watch)
                }
            case .failure(let e):
                guard let feed = self.feeds[ns], feed.generation == generation else { return }
                // The view could not start (no leader within the request timeout): every listen
                // of the namespace that has not started fails; started ones cannot exist yet.
                self.feeds[ns] = nil
                for id in feed.waiting { self.fail(id, .unavailable(e)) }
            }
        }
        return Feed(generation: generation)
    }

    private func feedEvent(_ ns: String, _ generation: UInt64, _ event: WatchEvent) {
        guard var feed = feeds[ns], feed.generation == generation else { return }
        switch event {
        case .start(let tree):
            feed.tree = tree
            let waiting = feed.waiting
            feed.waiting = []
            feeds[ns] = feed
            // Stale listens start from it; the others after a ReadIndex round.
            for id in waiting {
                guard let p = pending[id] else { continue }
                if p.stale { start(id, tree: tree) } else { barrier(id, ns, generation: generation) }
            }
        case .applied(let applied, let tree):
            guard let previous = feed.tree else { return }
            feed.tree = tree
            feeds[ns] = feed
            deliver(core.fanOut(namespace: ns, written: applied.written, tree: tree), tree: tree)
            // The write replaced a large subtree, which the previous tree still holds: freed off
            // this loop (with one network thread it is the loop that ticks Raft).
            if applied.released.handedOff { BulkWorkers.free(consume previous) }
        case .restored(let tree):
            guard feed.tree != nil else { return }
            feed.tree = tree
            feeds[ns] = feed
            deliver(ListenFanOut(events: core.restored(namespace: ns, tree: tree)), tree: tree)
        }
    }

    /// A ReadIndex round: once it completes, every write acknowledged (to anyone) before the
    /// listen was asked for has been applied and handed to this loop before the answer (the
    /// replica thread hands events over as it applies and answers at the end of its pass), so
    /// the feed's tree then includes them.
    private func barrier(_ id: UInt64, _ ns: String, generation: UInt64) {
        runtime.read(namespace: ns, stale: false, on: loop) { result in
            switch result {
            case .success:
                guard self.pending[id] != nil else { return }
                // The view's start reaches the loop before any read answer asked after it.
                guard let feed = self.feeds[ns], feed.generation == generation, let tree = feed.tree else {
                    return self.fail(id, .unavailable(.timedOut(write: false)))
                }
                self.start(id, tree: tree)
            case .failure(let e):
                self.fail(id, .unavailable(e))
            }
        }
    }

    private func start(_ id: UInt64, tree: Tree) {
        guard let p = pending.removeValue(forKey: id) else { return }
        do {
            let first = try core.listen(p.listen, tree: tree)
            p.done(.success(first))
        } catch {
            forget(id)
            p.done(.failure(.refused(error)))
        }
    }

    private func fail(_ id: UInt64, _ error: ListenStartError) {
        guard let p = pending.removeValue(forKey: id) else { return }
        forget(id)
        p.done(.failure(error))
    }

    /// Drops a listen from its namespace's count; the namespace's view closes with its last.
    private func forget(_ id: UInt64) {
        windowed.remove(id)
        guard let ns = namespaceOf.removeValue(forKey: id), var feed = feeds[ns] else { return }
        feed.listens -= 1
        feed.waiting.removeAll { $0 == id }
        if feed.listens <= 0 {
            feeds[ns] = nil
            if let watch = feed.watch { runtime.unwatch(watch) }
        } else {
            feeds[ns] = feed
        }
    }

    /// Hands each update to its owner, rendered once per distinct update and tag (a thousand
    /// default listens at one path get one rendering) and encoded once per outbound encoding
    /// (`SharedPush`); each owner written to is flushed once, after every delivery queued on the
    /// loop (`flushPending`).
    private func deliver(_ fanOut: ListenFanOut, tree: Tree) {
        guard !fanOut.isEmpty else { return }
        var pushes = FanOutPushes(fanOut)
        for delivery in fanOut.deliveries {
            guard let outlet = outlets[delivery.owner] else { continue }
            switch outlet.target {
            case .stream(let stream):
                stream(ListenEvent(listen: delivery.listen, owner: delivery.owner, tag: delivery.tag, update: fanOut.updates[delivery.update]), tree)
            case .frames(let target):
                let shared = pushes.push(for: delivery)
                target.push(shared.frames(outlet.encoding, codec: deflate, allocator: allocator))
            }
            if !outlet.pending {
                outlet.pending = true
                unflushed.append(outlet)
            }
        }
        guard !unflushed.isEmpty, !flushScheduled else { return }
        // Behind every event the replica thread has already handed this loop: they are
        // delivered first, so a connection they all reach is flushed once for all of them.
        flushScheduled = true
        loop.execute { self.flushPending() }
    }

    private func flushPending() {
        flushScheduled = false
        let outlets = unflushed
        unflushed = []
        for outlet in outlets {
            outlet.pending = false
            outlet.flush()
        }
    }

    /// The v5 push for an update: `d` (put) or `m` (merge), data in export format.
    static func render(_ event: ListenEvent) -> [UInt8] {
        render(event.update, tag: event.tag)
    }

    static func render(_ update: ListenUpdate, tag: UInt64?) -> [UInt8] {
        let tag = tag.map { Int64(truncatingIfNeeded: $0) }
        switch update {
        case let .put(path, tree):
            return ServerMessage.data(path: path, data: JSONWriter.bytes(tree, format: .export), tag: tag)
        case let .merge(path, children):
            return ServerMessage.merge(path: path, children: children.map { ($0.path, JSONWriter.bytes($0.tree, format: .export)) }, tag: tag)
        }
    }
}

/// The v5 pushes of one fan-out, each rendered the first time a delivery needs it: one per
/// distinct update for untagged listens (every default listen of a location shares it), one per
/// update and tag for tagged ones (the tag is part of the message).
struct FanOutPushes {
    private let fanOut: ListenFanOut
    private var untagged: [SharedPush?]
    private var tagged: [TaggedKey: SharedPush] = [:]
    /// Messages rendered so far.
    private(set) var renders = 0

    private struct TaggedKey: Hashable {
        var update: Int
        var tag: UInt64
    }

    init(_ fanOut: ListenFanOut) {
        self.fanOut = fanOut
        untagged = Array(repeating: nil, count: fanOut.updates.count)
    }

    mutating func push(for delivery: ListenFanOut.Delivery) -> SharedPush {
        if let tag = delivery.tag {
            let key = TaggedKey(update: delivery.update, tag: tag)
            if let made = tagged[key] { return made }
            let made = render(delivery.update, tag: tag)
            tagged[key] = made
            return made
        }
        if let made = untagged[delivery.update] { return made }
        let made = render(delivery.update, tag: nil)
        untagged[delivery.update] = made
        return made
    }

    private mutating func render(_ update: Int, tag: UInt64?) -> SharedPush {
        renders += 1
        return SharedPush(RealtimeHub.render(fanOut.updates[update], tag: tag))
    }
}

/// A connection that receives a hub's pushes (a v5 session's handler), on the hub's loop.
protocol RealtimePushTarget: AnyObject {
    /// Queues a push's frames (shared with other connections; not flushed).
    func push(_ frames: [ByteBuffer])
    /// Flushes what `push` queued.
    func flushPushes()
}
