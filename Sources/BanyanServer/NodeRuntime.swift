import BanyanOpLogFiles
import BanyanNode
public import BanyanRaft
public import BanyanReplica
public import BanyanStateMachine
public import BanyanTree
import Foundation
import Logging
import Metrics
public import NIOCore
import NIOPosix
import Synchronization

/// What a write request ends with.
public typealias WriteResult = Result<StateMachine.Applied, ReplicaError>

/// A live view of one namespace, fed on the replica thread (keep handlers cheap: format, then
/// hand bytes to a channel).
public enum WatchEvent: Sendable {
    /// The tree when the watch started (after a ReadIndex round, so it includes every write
    /// acknowledged before the watch was opened).
    case start(Node)
    case applied(StateMachine.Applied, tree: Node)
    /// The state was replaced by a snapshot from the leader.
    case restored(Node)
}

/// An operator's view of the node (`banyan status`, `GET /.banyan/status`).
public struct NodeStatus: Sendable, Codable {
    public var nodeID: UInt64
    public var clusterID: String
    public var role: String
    public var term: UInt64
    public var leader: UInt64
    public var commitIndex: UInt64
    public var appliedIndex: UInt64
    public var lastIndex: UInt64
    public var snapshotIndex: UInt64
    public var logFirstIndex: UInt64
    public var voters: [UInt64]
    public var learners: [UInt64]
    public var peers: [String: String]
    public var replication: [Progress]
    public var pendingWrites: Int
    public var pendingReads: Int
    public var watchers: Int
    public var namespaces: Int
    public var mayVote: Bool

    public struct Progress: Sendable, Codable {
        public var node: UInt64
        public var match: UInt64
        public var next: UInt64
        public var state: String
        public var recentlyActive: Bool
    }
}

/// The node's replica loop: one thread owns the `Replica` and the storage, runs the Ready
/// contract (persist, send, apply), ticks, and answers the client requests handed to it
/// (docs/server.md). Every mutable field below is touched only on `loop`.
public final class NodeRuntime: @unchecked Sendable {
    public let config: NodeConfig
    public let loop: any EventLoop
    /// The replica thread's own group, unless the node shares its network loop (`threads: 1`).
    private let group: MultiThreadedEventLoopGroup?
    private let storage: NodeStorage
    private var replica: Replica
    private let logger: Logger
    private var transport: (any PeerSender)?
    private var tickTask: RepeatedTask?
    private var processScheduled = false
    /// Spaces the leader's replication rounds under load (`raft.round_interval_us`).
    private var pacer: RoundPacer
    private var pacerWake: Scheduled<Void>?
    private var stopped = false

    private var nextRequest: RequestID = 1
    private var writeWaiters: [RequestID: Completion<WriteResult>] = [:]
    private var readWaiters: [RequestID: (namespace: String, promise: Completion<Result<Node, ReplicaError>>)] = [:]
    /// Requests handed in by network threads, run on `loop` in arrival order: one wake-up of the
    /// replica thread covers everything queued before it runs (`submit`).
    private let inbox = Mutex<[@Sendable () -> Void]>([])
    /// Answers for callers on other event loops, gathered during one pass of the replica loop
    /// and handed to each loop as one task (`flushReplies`): one wake-up per loop per pass
    /// instead of one per request.
    /// One box per event loop, kept across passes (a box is a class so appending to its work
    /// needs no dictionary `_modify`, whose coroutine frame would be allocated on every call).
    private var outbox: [ObjectIdentifier: ReplyBox] = [:]
    private var repliesWaiting = false
    private var watchStarts: [RequestID: UInt64] = [:]
    private var memberWaiters: [RequestID: EventLoopPromise<Result<Membership, ReplicaError>>] = [:]
    private var nextWatch: UInt64 = 1
    private var watchers: [UInt64: (namespace: String, handler: @Sendable (WatchEvent) -> Void)] = [:]
    /// Peer addresses: from the configuration, from the replicated `$cluster` namespace, and
    /// from peers' hellos.
    public private(set) var peerAddresses: [UInt64: HostPort] = [:]

    static let clusterNamespace = "$cluster"

    // Metrics (swift-metrics; exported by the server's Prometheus registry).
    private let appliedCounter = Counter(label: "banyan_applied_commands_total")
    private let persistTimer = Timer(label: "banyan_persist_seconds")
    private let termGauge = Gauge(label: "banyan_raft_term")
    private let commitGauge = Gauge(label: "banyan_raft_commit_index")
    private let appliedGauge = Gauge(label: "banyan_raft_applied_index")
    private let leaderGauge = Gauge(label: "banyan_raft_is_leader")
    private let leaderChanges = Counter(label: "banyan_raft_leader_changes_total")
    private let snapshotCounter = Counter(label: "banyan_snapshots_written_total")
    private let snapshotInstalls = Counter(label: "banyan_snapshots_installed_total")

    /// Opens the data directory (recovering the log and loading the newest snapshot), and
    /// bootstraps a new cluster when the directory is blank and `initialMembers` is set.
    /// `sharedLoop`: run the replica loop on this (network) event loop instead of a thread of its
    /// own. One thread then does everything: no cross-thread hops, but an fsync pauses network I/O.
    /// Writes the founding configuration into a blank data directory and returns (`banyan
    /// bootstrap`). Refuses a directory that already holds state.
    static func bootstrapDataDirectory(config: NodeConfig, logger: Logger) throws {
        let storage = try NodeStorage(directory: config.dataDirectory, logger: logger, progress: { _ in })
        guard storage.isBlank else {
            throw ConfigError("\(config.dataDirectory) already holds state; bootstrap is only for a blank data directory")
        }
        try storage.bootstrap(members: config.foundingMembers)
        logger.notice("bootstrapped a new cluster", metadata: ["members": "\(config.foundingMembers)", "cluster": "\(config.clusterID)"])
    }

    init(config: NodeConfig, logger: Logger, sharedLoop: (any EventLoop)? = nil, progress: @escaping (String) -> Void) throws {
        self.config = config
        self.logger = logger
        let storage = try NodeStorage(directory: config.dataDirectory, logger: logger, progress: progress)
        if storage.isBlank && config.foundsClusterWhenBlank {
            let members = config.foundingMembers
            try storage.bootstrap(members: members)
            logger.notice("bootstrapped a new cluster", metadata: ["members": "\(members)", "cluster": "\(config.clusterID)"])
        } else if storage.isBlank && !config.join {
            logger.warning(
                "blank data directory and no --new-cluster: this node will not vote or campaign until an existing member adds it (banyan cluster remove, then add; see docs/runbook.md). After a lost disk that is the safe state. For a brand-new cluster, start each founder once with --new-cluster (or run banyan bootstrap) instead.",
                metadata: ["members": "\(config.foundingMembers)"])
        } else if !storage.isBlank && config.newCluster {
            logger.notice("--new-cluster ignored: the data directory already holds state")
        }
        let loaded = try storage.load(progress: progress)
        self.storage = storage
        pacer = RoundPacer(interval: UInt64(min(max(0, config.raft.roundIntervalMicroseconds), 10_000_000)) * 1_000)
        var raft = RaftConfiguration(id: config.nodeID, seed: UInt64.random(in: 1...UInt64.max))
        raft.electionTicks = config.raft.electionTicks
        raft.heartbeatTicks = config.raft.heartbeatTicks
        var rc = ReplicaConfiguration(raft: raft)
        rc.snapshotEntries = config.raft.snapshotEntries
        let tickMs = max(1, config.raft.tickMilliseconds)
        rc.requestTimeoutTicks = max(10, config.raft.requestTimeoutMilliseconds / tickMs)
        rc.retryTicks = max(config.raft.electionTicks * 2, 5)
        replica = try Replica(
            configuration: rc, persisted: loaded.persisted, machine: loaded.machine, session: UInt64.random(in: 1...UInt64.max),
            now: Self.wallClock())
        replica.treesFor = [Self.clusterNamespace]
        if let sharedLoop {
            group = nil
            loop = sharedLoop
        } else {
            let own = MultiThreadedEventLoopGroup(numberOfThreads: 1)
            group = own
            loop = own.next()
        }
        for (id, address) in config.initialMembers { peerAddresses[id] = address }
        peerAddresses[config.nodeID] = config.advertised
        learnPeers(from: loaded.machine.tree(Self.clusterNamespace))
        logger.info(
            "state loaded",
            metadata: [
                "snapshot_index": "\(loaded.persisted.snapshot.index)", "log_entries": "\(loaded.persisted.entries.count)",
                "term": "\(loaded.persisted.hardState.term)", "members": "\(replica.raft.membership)",
            ])
    }

    static func wallClock() -> Int64 { Int64((Date().timeIntervalSince1970 * 1000).rounded()) }

    /// Starts ticking and sending. `transport` delivers messages to peers.
    public func start(transport: any PeerSender) {
        loop.execute {
            self.transport = transport
            transport.updateAddresses(self.peerAddresses)
            let interval = TimeAmount.milliseconds(Int64(max(1, self.config.raft.tickMilliseconds)))
            self.tickTask = self.loop.scheduleRepeatedTask(initialDelay: interval, delay: interval) { _ in self.tick() }
            self.scheduleProcess()
        }
    }

    public func shutdown() {
        let done: EventLoopFuture<Void> = loop.submit {
            self.stopped = true
            self.tickTask?.cancel()
            self.pacerWake?.cancel()
            try? self.storage.saveCommit(self.replica.raft.durableHardState)
            for (_, p) in self.writeWaiters { self.complete(p, .failure(.timedOut(write: true))) }
            for (_, w) in self.readWaiters { self.complete(w.promise, .failure(.timedOut(write: false))) }
            for (_, p) in self.memberWaiters { p.succeed(.failure(.timedOut(write: true))) }
            self.writeWaiters = [:]
            self.readWaiters = [:]
            self.memberWaiters = [:]
            self.flushReplies()
        }
        _ = try? done.wait()
        try? group?.syncShutdownGracefully()
    }

    // MARK: - Inputs (any thread)

    /// Peer messages, delivered in order as they arrived on one connection.
    public func receive(_ messages: [Message]) {
        let body: @Sendable () -> Void = {
            guard !self.stopped else { return }
            for m in messages { self.replica.receive(m) }
            self.scheduleProcess()
        }
        // Peer connections normally live on this loop (no hand-off needed).
        if loop.inEventLoop { body() } else { loop.execute(body) }
    }

    /// A peer told us where it listens (its hello).
    public func learnPeerAddress(_ id: UInt64, _ address: HostPort) {
        loop.execute {
            guard self.peerAddresses[id] != address else { return }
            self.peerAddresses[id] = address
            self.transport?.updateAddresses(self.peerAddresses)
        }
    }

    public func write(namespace: String, command: Command) -> EventLoopFuture<WriteResult> {
        let promise = loop.makePromise(of: WriteResult.self)
        write(namespace: namespace, command: command, on: loop) { promise.succeed($0) }
        return promise.futureResult
    }

    /// As `write(namespace:command:)`, for a caller on event loop `on`: `done` runs there. Requests
    /// and answers are batched across threads (one wake-up covers many), which is what the
    /// per-request HTTP path wants.
    public func write(namespace: String, command: Command, on caller: any EventLoop, _ done: @escaping @Sendable (WriteResult) -> Void) {
        submit { self.startWrite(namespace: namespace, command: command, Completion(loop: caller, done: done)) }
    }

    private func startWrite(namespace: String, command: Command, _ completion: Completion<WriteResult>) {
        guard !stopped else { return complete(completion, .failure(.overloaded("the node is shutting down"))) }
        let id = nextRequest
        nextRequest += 1
        writeWaiters[id] = completion
        replica.write(id, namespace: namespace, command: command)
        handle(replica.takeEvents())
        scheduleProcess()
    }

    /// The namespace's tree: after a ReadIndex round (linearizable), or at once from this
    /// node's state (`stale`: possibly behind the leader). `done` runs on the caller's event
    /// loop `on` (requests and answers batched like `write`'s).
    public func read(
        namespace: String, stale: Bool, on caller: any EventLoop, _ done: @escaping @Sendable (Result<Node, ReplicaError>) -> Void
    ) {
        submit { self.startRead(namespace: namespace, stale: stale, Completion(loop: caller, done: done)) }
    }

    private func startRead(namespace: String, stale: Bool, _ completion: Completion<Result<Node, ReplicaError>>) {
        if stale { return complete(completion, .success(replica.machine.tree(namespace))) }
        let id = nextRequest
        nextRequest += 1
        readWaiters[id] = (namespace, completion)
        replica.read(id)
        handle(replica.takeEvents())
        scheduleProcess()
    }

    // MARK: - Batching across threads

    /// Queues work for the replica loop; only the first of a batch wakes it.
    private func submit(_ work: @escaping @Sendable () -> Void) {
        let first = inbox.withLock { queue in
            queue.append(work)
            return queue.count == 1
        }
        if first { loop.execute { self.drainInbox() } }
    }

    private func drainInbox() {
        let work = inbox.withLock { queue in
            let taken = queue
            queue.removeAll(keepingCapacity: true)
            return taken
        }
        for w in work { w() }
        flushReplies()
    }

    /// Queues an answer for its caller's loop (sent by `flushReplies`).
    private func complete<T>(_ completion: Completion<T>, _ value: T) {
        let key = ObjectIdentifier(completion.loop)
        let box: ReplyBox
        if let existing = outbox[key] {
            box = existing
        } else {
            box = ReplyBox(loop: completion.loop)
            outbox[key] = box
        }
        box.work.append { completion.done(value) }
        repliesWaiting = true
    }

    /// Hands each event loop its gathered answers as one task.
    private func flushReplies() {
        guard repliesWaiting else { return }
        repliesWaiting = false
        for box in outbox.values where !box.work.isEmpty {
            let batch = AnswerBatch(work: box.work)
            box.work = []
            box.loop.execute { for answer in batch.work { answer() } }
        }
    }

    /// Opens a live view: `handler` gets `.start` with the tree at a linearizable point (or
    /// this node's current tree when `stale`), then every applied write of the namespace.
    /// Returns the watch id for `unwatch`, or the error that prevented the start.
    public func watch(namespace: String, stale: Bool, handler: @escaping @Sendable (WatchEvent) -> Void) -> EventLoopFuture<Result<UInt64, ReplicaError>> {
        let promise = loop.makePromise(of: Result<UInt64, ReplicaError>.self)
        loop.execute {
            let watchID = self.nextWatch
            self.nextWatch += 1
            if stale {
                self.watchers[watchID] = (namespace, handler)
                self.watchersChanged()
                handler(.start(self.replica.machine.tree(namespace)))
                return promise.succeed(.success(watchID))
            }
            let id = self.nextRequest
            self.nextRequest += 1
            self.readWaiters[id] = (
                namespace,
                Completion(loop: self.loop) { result in
                    switch result {
                    case .success: promise.succeed(.success(watchID))
                    case .failure(let e):
                        self.watchers[watchID] = nil
                        self.watchersChanged()
                        promise.succeed(.failure(e))
                    }
                }
            )
            self.watchStarts[id] = watchID
            self.watchers[watchID] = (namespace, handler)
            self.watchersChanged()
            self.replica.read(id)
            self.handle(self.replica.takeEvents())
            self.scheduleProcess()
        }
        return promise.futureResult
    }

    public func unwatch(_ id: UInt64) {
        loop.execute {
            self.watchers[id] = nil
            self.watchersChanged()
        }
    }

    /// Only namespaces with live views get a tree with each applied event: for the others the
    /// tree is changed in place, without copying the written path (on the replica thread).
    private func watchersChanged() {
        var watched = Set(watchers.values.map(\.namespace))
        // Peer addresses are learnt from the cluster namespace's tree.
        watched.insert(Self.clusterNamespace)
        if replica.treesFor != watched { replica.treesFor = watched }
    }

    /// Adds a node as a learner (it is promoted automatically once it has caught up): first
    /// its peer address is replicated, then the membership change is proposed. Leader only.
    public func addMember(id: UInt64, peerAddress: HostPort) -> EventLoopFuture<Result<Membership, ReplicaError>> {
        let recorded = write(
            namespace: Self.clusterNamespace, command: .set(path: "/peers/\(id)", json: Array("\"\(peerAddress)\"".utf8)))
        return recorded.flatMap { result in
            if case .failure(let e) = result { return self.loop.makeSucceededFuture(.failure(e)) }
            self.learnPeerAddress(id, peerAddress)
            return self.changeMembership(.addLearner(id))
        }
    }

    public func changeMembership(_ change: MembershipChange) -> EventLoopFuture<Result<Membership, ReplicaError>> {
        let promise = loop.makePromise(of: Result<Membership, ReplicaError>.self)
        loop.execute {
            let id = self.nextRequest
            self.nextRequest += 1
            self.memberWaiters[id] = promise
            self.replica.changeMembership(id, change)
            self.handle(self.replica.takeEvents())
            self.scheduleProcess()
        }
        return promise.futureResult
    }

    public func transferLeadership(to target: UInt64) -> EventLoopFuture<Result<Void, ReplicaError>> {
        loop.submit {
            do throws(ReplicaError) {
                try self.replica.transferLeadership(to: target)
                self.scheduleProcess()
                return .success(())
            } catch {
                return .failure(error)
            }
        }
    }

    public func status() -> EventLoopFuture<NodeStatus> {
        loop.submit { self.currentStatus() }
    }

    /// The current leader and its client address, if known (for redirecting operators).
    public func leader() -> EventLoopFuture<UInt64> {
        loop.submit { self.replica.raft.leader }
    }

    private func currentStatus() -> NodeStatus {
        let raft = replica.raft
        return NodeStatus(
            nodeID: config.nodeID, clusterID: config.clusterID, role: raft.role.description, term: raft.term, leader: raft.leader,
            commitIndex: raft.commitIndex, appliedIndex: replica.machine.appliedIndex, lastIndex: raft.lastIndex,
            snapshotIndex: raft.snapshotMeta.index, logFirstIndex: storage.logFirstIndex, voters: raft.membership.voters,
            learners: raft.membership.learners,
            peers: Dictionary(uniqueKeysWithValues: peerAddresses.map { (String($0.key), $0.value.description) }),
            replication: raft.role == .leader
                ? raft.replicationStatus.map {
                    NodeStatus.Progress(node: $0.node, match: $0.match, next: $0.next, state: $0.state, recentlyActive: $0.recentlyActive)
                } : [],
            pendingWrites: replica.pendingWrites, pendingReads: replica.pendingReads, watchers: watchers.count,
            namespaces: replica.machine.namespaces.count, mayVote: raft.mayVote)
    }

    // MARK: - The loop

    private func tick() {
        guard !stopped else { return }
        replica.tick(now: Self.wallClock())
        handle(replica.takeEvents())
        flushReplies()
        scheduleProcess()
    }

    private func scheduleProcess() {
        guard !processScheduled, !stopped else { return }
        processScheduled = true
        loop.execute { self.process() }
    }

    /// The Ready contract: persist (fsync), send, apply, answer; repeated until quiet.
    private func process() {
        processScheduled = false
        guard !stopped else { return }
        if replica.raft.role != .leader { pacer.reset() }
        var rounds = 0
        while rounds < 64 {
            // Decided afresh before every `ready()`: an fsync longer than the interval ends the
            // hold within this pass.
            holdProposalsIfPaced()
            guard let rd = replica.ready() else { break }
            rounds += 1
            if !rd.entries.isEmpty, replica.raft.role == .leader {
                pacer.roundStarted(now: DispatchTime.now().uptimeNanoseconds, entries: rd.entries.count)
            }
            let installed: StateMachine?
            // A leader's appends go out while it writes the same entries (Raft §10.2.1), and a
            // follower's forwarded proposals and read-index requests while it persists.
            if rd.sendBeforePersist > 0 { transport?.send(Array(rd.messages.prefix(rd.sendBeforePersist))) }
            let started = DispatchTime.now().uptimeNanoseconds
            do {
                installed = try storage.persist(rd)
            } catch let damaged as DamagedIncomingSnapshot {
                // Nothing of this Ready reached the disk or the network: reload as a restart
                // would, and let the leader send the snapshot again.
                logger.error("refused a damaged snapshot from the leader; reloading state from disk", metadata: ["error": "\(damaged)"])
                reloadFromDisk()
                return scheduleProcess()
            } catch {
                // A storage error (disk full, I/O error, a failed fsync) ends this process: memory
                // may no longer match the disk, and only a restart recovers from what is really
                // there. Nothing acknowledged is lost: acknowledgements follow persistence.
                logger.critical("storage error; stopping the node so it restarts and recovers", metadata: ["error": "\(error)"])
                stopped = true
                exit(75)
            }
            persistTimer.recordNanoseconds(Int64(DispatchTime.now().uptimeNanoseconds - started))
            if rd.messages.count > rd.sendBeforePersist { transport?.send(Array(rd.messages.dropFirst(rd.sendBeforePersist))) }
            for request in rd.snapshotReads { serveSnapshotChunk(request) }
            if installed != nil { snapshotInstalls.increment() }
            replica.advance(rd, installed: installed)
            handle(replica.takeEvents())
        }
        flushReplies()
        if rounds == 64 { scheduleProcess() }
        let raft = replica.raft
        commitGauge.record(Int64(raft.commitIndex))
        appliedGauge.record(Int64(replica.machine.appliedIndex))
    }

    /// Round pacing (docs/server.md): while the pacer says wait, new proposals stay queued in
    /// the replica (everything else in a `Ready` goes on), and a pass is scheduled for when the
    /// interval ends, which proposes everything that arrived meanwhile as one round.
    private func holdProposalsIfPaced() {
        let wait = pacer.wait(now: DispatchTime.now().uptimeNanoseconds, isLeader: replica.raft.role == .leader)
        replica.holdProposals = wait != nil
        if let wait, pacerWake == nil {
            pacerWake = loop.scheduleTask(in: .nanoseconds(Int64(clamping: wait))) {
                self.pacerWake = nil
                self.scheduleProcess()
            }
        }
    }

    private func serveSnapshotChunk(_ request: SnapshotChunkRequest) {
        do {
            let total = try storage.snapshots.fileSize(lastIndex: request.meta.index)
            // The offset comes from a peer: never trust it to fit.
            guard let offset = Int(exactly: request.offset), offset <= total else { return }
            let data = try storage.snapshots.rawChunk(lastIndex: request.meta.index, offset: offset, maxBytes: request.maxBytes)
            let last = offset + data.count >= total
            replica.snapshotChunk(to: request.to, meta: request.meta, offset: request.offset, data: data, last: last)
        } catch {
            logger.warning(
                "cannot read the snapshot a follower needs (a newer one may have replaced it)",
                metadata: ["follower": "\(request.to)", "index": "\(request.meta.index)", "error": "\(error)"])
        }
    }

    private func handle(_ events: [ReplicaEvent]) {
        for event in events {
            switch event {
            case let .applied(applied, tree, request):
                appliedCounter.increment()
                if let request, let waiter = writeWaiters.removeValue(forKey: request) { complete(waiter, .success(applied)) }
                if applied.namespace == Self.clusterNamespace, applied.outcome == .ok { learnPeers(from: tree) }
                for (_, w) in watchers where w.namespace == applied.namespace { w.handler(.applied(applied, tree: tree)) }
            case .readsReady(let ids):
                for id in ids {
                    guard let w = readWaiters.removeValue(forKey: id) else { continue }
                    let tree = replica.machine.tree(w.namespace)
                    if let watchID = watchStarts.removeValue(forKey: id), let watcher = watchers[watchID] {
                        watcher.handler(.start(tree))
                    }
                    complete(w.promise, .success(tree))
                }
            case let .failed(id, error):
                if let p = writeWaiters.removeValue(forKey: id) { complete(p, .failure(error)) }
                if let w = readWaiters.removeValue(forKey: id) {
                    watchStarts[id] = nil
                    complete(w.promise, .failure(error))
                }
                if let p = memberWaiters.removeValue(forKey: id) { p.succeed(.failure(error)) }
            case let .membershipChanged(id, membership):
                logger.notice("membership changed", metadata: ["members": "\(membership)"])
                memberWaiters.removeValue(forKey: id)?.succeed(.success(membership))
            case .restoredFromSnapshot(let meta):
                learnPeers(from: replica.machine.tree(Self.clusterNamespace))
                for (_, w) in watchers { w.handler(.restored(replica.machine.tree(w.namespace))) }
                logger.info("state machine restored from the leader's snapshot", metadata: ["index": "\(meta.index)"])
            case .snapshotDue(let meta):
                writeSnapshot(meta)
            case let .roleChanged(role, leader, term):
                termGauge.record(Int64(term))
                leaderGauge.record(role == .leader ? 1 : 0)
                leaderChanges.increment()
                logger.notice("raft role changed", metadata: ["role": "\(role)", "leader": "\(leader)", "term": "\(term)"])
            }
        }
    }

    private func writeSnapshot(_ meta: SnapshotMeta) {
        let machine = replica.machine
        let writer = SnapshotWriter(directory: config.dataDirectory)
        let logger = self.logger
        let started = DispatchTime.now().uptimeNanoseconds
        DispatchQueue.global(qos: .utility).async {
            do {
                var lastReport: UInt64 = 0
                try writer.write(machine, meta: meta) { bytes in
                    if bytes - lastReport >= 256 << 20 {
                        lastReport = bytes
                        logger.info("writing snapshot", metadata: ["index": "\(meta.index)", "bytes": "\(bytes)"])
                    }
                }
                let ms = (DispatchTime.now().uptimeNanoseconds - started) / 1_000_000
                self.loop.execute {
                    do {
                        try self.storage.snapshots.removeSnapshots(olderThan: meta.index)
                        try self.storage.compact(through: meta.index)
                        try self.storage.saveCommit(self.replica.raft.durableHardState)
                    } catch {
                        self.logger.error("log compaction after a snapshot failed", metadata: ["error": "\(error)"])
                    }
                    self.replica.snapshotWritten(meta)
                    self.snapshotCounter.increment()
                    logger.info("snapshot written, log compacted", metadata: ["index": "\(meta.index)", "ms": "\(ms)"])
                }
            } catch {
                logger.error("snapshot write failed; will retry later", metadata: ["index": "\(meta.index)", "error": "\(error)"])
                self.loop.execute { self.replica.snapshotFailed() }
            }
        }
    }

    /// Rebuilds the replica from what is on disk, as a restart would (after a damaged incoming
    /// snapshot). Waiting writes end as unknown and reads as timed out; live views resend.
    private func reloadFromDisk() {
        do {
            let loaded = try storage.load { _ in }
            replica = try Replica(
                configuration: replica.configuration, persisted: loaded.persisted, machine: loaded.machine,
                session: UInt64.random(in: 1...UInt64.max), now: Self.wallClock())
            pacer.reset()
            watchersChanged()
        } catch {
            logger.critical("storage error while reloading; stopping the node so it restarts and recovers", metadata: ["error": "\(error)"])
            stopped = true
            exit(75)
        }
        for (_, p) in writeWaiters { complete(p, .failure(.timedOut(write: true))) }
        for (id, w) in readWaiters {
            watchStarts[id] = nil
            complete(w.promise, .failure(.timedOut(write: false)))
        }
        for (_, p) in memberWaiters { p.succeed(.failure(.timedOut(write: true))) }
        writeWaiters = [:]
        readWaiters = [:]
        memberWaiters = [:]
        for (_, w) in watchers { w.handler(.restored(replica.machine.tree(w.namespace))) }
    }

    private func learnPeers(from tree: Node) {
        guard let peersPath = try? Path(parsing: "/peers") else { return }
        let peers = tree.child(at: peersPath)
        var changed = false
        for (key, node) in peers.children.elements() {
            guard let id = UInt64(key.string), case .string(let text)? = node.leaf, let address = try? HostPort(parsing: text) else { continue }
            if peerAddresses[id] != address {
                peerAddresses[id] = address
                changed = true
            }
        }
        if changed { transport?.updateAddresses(peerAddresses) }
    }
}

/// The outbound half of the peer transport, as the replica loop sees it.
public protocol PeerSender: Sendable {
    /// Sends messages (dropped when a peer is unreachable or too far behind; Raft retries).
    func send(_ messages: [Message])
    func updateAddresses(_ addresses: [UInt64: HostPort])
}

/// How a request's answer reaches its caller: a callback run on the caller's event loop,
/// batched with the other answers for that loop (`NodeRuntime.flushReplies`).
struct Completion<T> {
    let loop: any EventLoop
    let done: @Sendable (T) -> Void
}

/// The answers gathered for one event loop during a pass (replica thread only).
private final class ReplyBox {
    let loop: any EventLoop
    var work: [() -> Void] = []
    init(loop: any EventLoop) { self.loop = loop }
}

/// Answers gathered on the replica loop for one caller's event loop. They are handed over whole
/// and run only there (each answer hops to its caller's loop by construction), so the closures
/// need not be `Sendable` themselves.
private struct AnswerBatch: @unchecked Sendable {
    let work: [() -> Void]
}
