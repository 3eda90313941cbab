import BanyanBasics
import BanyanAuth
import BanyanOpLogFiles
public import BanyanNode
public import BanyanOpLogFiles
public import BanyanRaft
public import BanyanReplica
public import BanyanRules
public import BanyanStateMachine
public import BanyanTree
import Foundation
import Logging
import Metrics
public import NIOCore
import NIOPosix
import Synchronization

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
    /// This data directory's incarnation, hexadecimal ("0": a directory from before incarnations).
    public var incarnation: String = "0"
    /// The node's process id (for operators and failure tests).
    public var pid: Int32? = nil
    /// Open realtime (WebSocket) connections, and whether the node drains (filled in by the
    /// server).
    public var realtimeConnections: Int? = nil
    public var draining: Bool? = nil
    /// Nodes whose free-space alarm is raised (writes that add data are refused meanwhile).
    public var spaceAlarms: [UInt64] = []
    /// Writes this node refused without proposing them while an alarm was raised, since start.
    public var writesRefusedForSpace: UInt64? = nil
    /// The size of this node's ballast file (0: none; docs/operations.md, "Disk space").
    public var ballastBytes: UInt64? = nil
    /// When this process started (Unix milliseconds): a restart changes it even where the
    /// process id does not (a container's pid 1). `banyan cluster roll` waits for it to change.
    public var startedAtMs: Int64? = nil
    /// The certificates in force, their expiry and reloads (filled in by the server).
    public var tls: TLSStatus? = nil

    public struct Progress: Sendable, Codable {
        public var node: UInt64
        public var match: UInt64
        public var next: UInt64
        public var state: String
        public var recentlyActive: Bool
    }
}

/// The node's replica loop: the driver of `NodeCore` (docs/node-core.md). One event loop owns the
/// core (and through it the `Replica` and the storage), runs its passes, ticks it, carries out
/// the actions it returns, and answers the client requests handed to it (docs/server.md). Every
/// mutable field below is touched only on `loop`.
public final class NodeRuntime: @unchecked Sendable {
    public let config: NodeConfig
    public let loop: any EventLoop
    /// This data directory's identity (docs/raft.md, R22): peers learn it from the hello.
    public let incarnation: UInt64
    /// The fault switch (`--allow-fault-injection` only; docs/chaos.md), nil otherwise.
    public let faults: FaultSwitch?
    /// The replica thread's own group, unless the node shares its network loop (`threads: 1`).
    private let group: MultiThreadedEventLoopGroup?
    private let core: NodeCore
    private let logger: Logger
    private var transport: (any PeerSender)?
    private var tickTask: RepeatedTask?
    private var processScheduled = false
    private var pacerWake: Scheduled<Void>?

    /// Completions by request id (the ids this driver hands the core).
    private var nextRequest: RequestID = 1
    private var writeCompletions: [RequestID: Completion<WriteResult>] = [:]
    private var readCompletions: [RequestID: Completion<Result<Tree, ReplicaError>>] = [:]
    private var memberCompletions: [RequestID: EventLoopPromise<Result<Membership, ReplicaError>>] = [:]
    private var nextWatch: UInt64 = 1
    private var watchHandlers: [UInt64: @Sendable (WatchEvent) -> Void] = [:]
    /// Requests handed in by network threads, run on `loop` in arrival order: one wake-up of the
    /// replica thread covers everything queued before it runs (`submit`).
    private let inbox = Mutex<[@Sendable () -> Void]>([])
    /// Called on the replica thread with realtime connections that ended in the log (the
    /// server closes those it still serves; it must only hand the work to their loops).
    let connectionsEnded = Mutex<(@Sendable ([UInt64]) -> Void)?>(nil)
    /// Called on the replica thread after a snapshot replaced the state: whether a connection
    /// has ended in it (the server closes its open ones that did).
    /// The security rules in force, by namespace, as of the last applied entry: what the
    /// network threads judge reads and listens by (writes are judged in the state machine, at
    /// their position in the log).
    let rulesInForce = Mutex<[String: Rules]>([:])
    /// Every project's signing keys as of the last applied entry: what the network threads
    /// verify the account service's tokens with (docs/accounts.md).
    let signingKeysInForce = Mutex<[String: SigningKeys]>([:])
    /// The same keys by `kid`, with when each stops being accepted (nil: while current):
    /// rebuilt only when the keys change, so checking a token is one dictionary look-up.
    let accountKeysByID = Mutex<[String: (key: AccountTokens.Key, until: Int64?)]>([:])
    /// Puts `keys` (the served projects') in force.
    func installSigningKeys(_ keys: [String: SigningKeys]) {
        var byID: [String: (key: AccountTokens.Key, until: Int64?)] = [:]
        for (project, k) in keys {
            if let current = k.current, let secret = Base64.decode(current.secret.utf8) {
                byID[current.id] = (AccountTokens.Key(id: current.id, secret: secret, project: project), nil)
            }
            if let previous = k.previous, let secret = Base64.decode(previous.secret.utf8) {
                byID[previous.id] = (AccountTokens.Key(id: previous.id, secret: secret, project: project), previous.time)
            }
        }
        signingKeysInForce.withLock { $0 = keys }
        accountKeysByID.withLock { $0 = byID }
    }

    /// The served project's key `kid`, if it is accepted at `now`.
    func accountKey(_ kid: String, now: Int64) -> AccountTokens.Key? {
        guard let entry = accountKeysByID.withLock({ $0[kid] }) else { return nil }
        if let until = entry.until, until <= now { return nil }
        return entry.key
    }

    /// Called (on the replica loop) after the rules in force changed.
    let rulesChanged = Mutex<(@Sendable () -> Void)?>(nil)
    let connectionsRestored = Mutex<(@Sendable (_ ended: (UInt64) -> Bool) -> Void)?>(nil)
    /// Answers for callers on other event loops, gathered during one pass of the replica loop
    /// and handed to each loop as one task (`flushReplies`): one wake-up per loop per pass
    /// instead of one per request.
    /// One box per event loop, kept across passes (a box is a class so appending to its work
    /// needs no dictionary `_modify`, whose coroutine frame would be allocated on every call).
    private var outbox: [ObjectIdentifier: ReplyBox] = [:]
    private var repliesWaiting = false
    /// Peer addresses: from the configuration, from the replicated `$cluster` namespace, and
    /// from peers' hellos.
    public private(set) var peerAddresses: [UInt64: HostPort] = [:]

    static let clusterNamespace = NodeCore.clusterNamespace

    // Metrics (swift-metrics; exported by the server's Prometheus registry).
    private let appliedCounter = Counter(label: "banyan_applied_commands_total")
    private let persistTimer = Timer(label: "banyan_persist_seconds")
    private let termGauge = Gauge(label: "banyan_raft_term")
    private let commitGauge = Gauge(label: "banyan_raft_commit_index")
    private let appliedGauge = Gauge(label: "banyan_raft_applied_index")
    /// Payload bytes applied since the newest snapshot (held in memory; docs/replica.md).
    private let logBytesGauge = Gauge(label: "banyan_raft_log_bytes_since_snapshot")
    private let logKeptGauge = Gauge(label: "banyan_raft_log_bytes_kept")
    /// Admission of large writes (docs/replica.md, "Large writes wait their turn"): large writes
    /// that began to wait for room, and forwarded ones the leader holds meanwhile.
    private let largeHeldCounter = Counter(label: "banyan_raft_large_writes_held_total")
    private let heldForwardGauge = Gauge(label: "banyan_raft_held_forward_bytes")
    /// The replica's `largeWritesHeld` when last counted (a reloaded replica starts from 0).
    private var largeHeldSeen = 0
    private let leaderGauge = Gauge(label: "banyan_raft_is_leader")
    private let leaderChanges = Counter(label: "banyan_raft_leader_changes_total")
    /// Time between Raft ticks (due every `raft.tick_ms`): how long the replica loop was busy
    /// or not scheduled. A gap near the election timeout on a leader costs an election.
    private let tickGaps = Timer(label: "banyan_raft_tick_gap_seconds")
    /// The longest tick gap since the node started, in milliseconds.
    private let tickGapMax = Gauge(label: "banyan_raft_tick_gap_max_ms")
    private var lastTick: UInt64 = 0
    /// Free bytes on the data directory's file system (nil: unknown). Replaceable at any time
    /// (`setFreeSpaceProbe`: tests stand in a full disk).
    private let freeSpace = Mutex<@Sendable (String) -> UInt64?>(NodeRuntime.statvfsFreeBytes)
    private let diskFree = Gauge(label: "banyan_disk_free_bytes")
    /// The ballast file (docs/operations.md, "Disk space") and its size on disk (nil: none),
    /// known on `loop`; made on the freeing thread (`ballastBusy` meanwhile), and after a failure
    /// tried again only after `ballastRetryChecks` more space checks.
    private let ballast: Ballast
    private var ballastSize: UInt64?
    private var ballastBusy = false
    private var ballastRetryChecks = 0
    private let ballastGauge = Gauge(label: "banyan_disk_ballast_bytes")
    private let spaceAlarmGauge = Gauge(label: "banyan_space_alarm")
    private var ticksToSpaceCheck = 0
    /// A raise or clear of this node's alarm is on its way through the log.
    private var spaceAlarmProposed = false
    private var longestTickGap: UInt64 = 0
    private let snapshotCounter = Counter(label: "banyan_snapshots_written_total")
    private let snapshotInstalls = Counter(label: "banyan_snapshots_installed_total")
    private let leaseExpiries = Counter(label: "banyan_realtime_lease_expiries_total")
    /// The staged store, for the staging thread (set once in `init`).
    private let stagedStore: StagedStoreHandle

    /// Writes the founding configuration into a blank data directory and returns (`banyan
    /// bootstrap`). Refuses a directory that already holds state.
    static func bootstrapDataDirectory(config: NodeConfig, logger: Logger) throws {
        let storage = try NodeStorage(
            directory: config.dataDirectory, logger: logger, newIncarnation: UInt64.random(in: 1...UInt64.max), progress: { _ in })
        guard storage.isBlank else {
            throw ConfigError("\(config.dataDirectory) already holds state; bootstrap is only for a blank data directory")
        }
        try storage.bootstrap(members: config.foundingMembers)
        logger.notice("bootstrapped a new cluster", metadata: ["members": "\(config.foundingMembers)", "cluster": "\(config.clusterID)"])
    }

    /// Opens the data directory (recovering the log and loading the newest snapshot), and
    /// bootstraps a new cluster when the directory is blank and the configuration founds one.
    /// `sharedLoop`: run the replica loop on this (network) event loop instead of a thread of its
    /// own. One thread then does everything: no cross-thread hops, but an fsync pauses network I/O.
    init(config: NodeConfig, logger: Logger, sharedLoop: (any EventLoop)? = nil, progress: @escaping (String) -> Void) throws {
        self.config = config
        self.logger = logger
        let faults = config.allowFaultInjection ? FaultSwitch() : nil
        self.faults = faults
        let storage = try NodeStorage(
            directory: config.dataDirectory, fileSystem: faults.map { FaultInjectingFileSystem(base: PosixFileSystem(), faults: $0) } ?? PosixFileSystem(),
            // Its own instance: the staged store is used on the staging thread.
            stagedFileSystem: faults.map { FaultInjectingFileSystem(base: PosixFileSystem(), faults: $0) } ?? PosixFileSystem(),
            logger: logger, newIncarnation: UInt64.random(in: 1...UInt64.max),
            salvageDamagedLog: config.salvageDamagedLog, progress: progress)
        // Before the node takes part: a full disk fails here (`.noSpace`, waited out by
        // `BanyanNode.startWhenSpace`) rather than at the node's first write (exit 75).
        try storage.requireRoom()
        ballast = Ballast(dataDirectory: config.dataDirectory, bytes: config.effectiveBallastBytes)
        // A half-made ballast (a crash while making it) holds space for nothing.
        ballast.removeLeftover()
        if config.effectiveBallastBytes == 0, let had = ballast.size() {
            do {
                try ballast.release()
                logger.notice("removed the ballast file (no ballast configured: storage.ballast_bytes or min_free_bytes is 0)", metadata: ["released_bytes": "\(had)", "path": "\(ballast.path)"])
            } catch {
                logger.warning("cannot remove the ballast file (no ballast configured); remove it by hand", metadata: ["error": "\(error)"])
            }
        }
        ballastSize = ballast.size()
        incarnation = storage.incarnation
        if storage.isBlank && !config.foundsClusterWhenBlank && !config.join {
            logger.warning(
                "blank data directory and no --new-cluster: this node will not vote or campaign until an existing member adds it (banyan cluster remove, then add; see docs/runbook.md). After a lost disk that is the safe state. For a brand-new cluster, start each founder once with --new-cluster (or run banyan bootstrap) instead.",
                metadata: ["members": "\(config.foundingMembers)"])
        } else if !storage.isBlank && config.newCluster {
            logger.notice("--new-cluster ignored: the data directory already holds state")
        }
        var raft = RaftConfiguration(id: config.nodeID, seed: UInt64.random(in: 1...UInt64.max))
        raft.incarnation = storage.incarnation
        raft.electionTicks = config.raft.electionTicks
        raft.heartbeatTicks = config.raft.heartbeatTicks
        var rc = ReplicaConfiguration(raft: raft)
        rc.snapshotEntries = config.raft.snapshotEntries
        rc.snapshotLogBytes = config.raft.snapshotLogBytes
        let tickMs = max(1, config.raft.tickMilliseconds)
        rc.requestTimeoutTicks = max(10, config.raft.requestTimeoutMilliseconds / tickMs)
        rc.retryTicks = max(config.raft.electionTicks * 2, 5)
        rc.stagingThreshold = config.raft.stagingThresholdBytes > 0 ? config.raft.stagingThresholdBytes : .max
        var settings = NodeCore.Settings(replica: rc)
        settings.roundIntervalNanoseconds = UInt64(min(max(0, config.raft.roundIntervalMicroseconds), 10_000_000)) * 1_000
        core = try NodeCore(
            settings: settings, storage: storage, foundingMembers: config.foundsClusterWhenBlank ? config.foundingMembers : nil,
            logger: logger, now: Self.wallClock(), monotonicNanoseconds: { DispatchTime.now().uptimeNanoseconds },
            newSession: { UInt64.random(in: 1...UInt64.max) }, progress: progress)
        stagedStore = StagedStoreHandle(storage.staged)
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
        mergePeers(core.peerAddresses)
        core.output = { [unowned self] action in self.perform(action) }
        historyBases = config.history.bases > 0 ? [core.replica.machine] : []
        let loadedRules = core.replica.machine.rules
        rulesInForce.withLock { $0 = loadedRules }
        installSigningKeys(core.replica.machine.signingKeys(projects: config.accounts.servedProjects))
        let raftState = core.replica.raft
        logger.info(
            "state loaded",
            metadata: [
                "snapshot_index": "\(raftState.snapshotMeta.index)", "log_entries": "\(raftState.lastIndex - raftState.snapshotMeta.index)",
                "term": "\(raftState.term)", "members": "\(raftState.membership)",
            ])
    }

    /// When the process started (the first use of this value, at node start), Unix milliseconds.
    static let processStart = wallClock()

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
            self.tickTask?.cancel()
            self.pacerWake?.cancel()
            self.core.shutdown()
            self.flushReplies()
        }
        _ = try? done.wait()
        try? group?.syncShutdownGracefully()
    }

    // MARK: - Inputs (any thread)

    /// Peer messages, delivered in order as they arrived on one connection.
    public func receive(_ messages: [Message]) {
        let body: @Sendable () -> Void = {
            guard !self.core.stopped else { return }
            self.core.receive(messages)
            self.scheduleProcess()
        }
        // Peer connections normally live on this loop (no hand-off needed).
        if loop.inEventLoop { body() } else { loop.execute(body) }
    }

    /// A peer's hello named its incarnation; ordered like `receive` (before that connection's
    /// messages).
    public func learnPeerIncarnation(_ id: UInt64, _ incarnation: UInt64) {
        let body: @Sendable () -> Void = {
            guard !self.core.stopped else { return }
            self.core.noteIncarnation(of: id, incarnation)
            self.scheduleProcess()
        }
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
    public func write(
        namespace: String, command: Command, session: UInt64? = nil, auth: ClientAuth? = nil, clientWrite: ClientWriteKey? = nil, on caller: any EventLoop,
        _ done: @escaping @Sendable (WriteResult) -> Void
    ) {
        submit {
            self.begin(\.writeCompletions, Completion(loop: caller, done: done)) { id in
                self.core.write(id, namespace: namespace, command: command, session: session, auth: auth, clientWrite: clientWrite)
            }
        }
    }

    /// Opens a realtime connection's own client session (its writes and onDisconnect commands
    /// name it: docs/realtime.md). Ordered with `write`: a write submitted after this names an
    /// open session. `done` (on the replica loop) gets false when the id was taken.
    public func openSession(_ session: UInt64, _ done: @escaping @Sendable (Bool) -> Void = { _ in }) {
        submit { done(self.core.openSession(session)) }
    }

    /// Closes a connection's session once nothing more will be written in it.
    public func closeSession(_ session: UInt64) {
        submit { self.core.closeSession(session) }
    }

    /// This node's id (for realtime session ids).
    public var nodeID: UInt64 { config.nodeID }

    /// The namespace's tree: after a ReadIndex round (linearizable), or at once from this
    /// node's state (`stale`: possibly behind the leader). `done` runs on the caller's event
    /// loop `on` (requests and answers batched like `write`'s).
    public func read(
        namespace: String, stale: Bool, on caller: any EventLoop, _ done: @escaping @Sendable (Result<Tree, ReplicaError>) -> Void
    ) {
        submit {
            self.begin(\.readCompletions, Completion(loop: caller, done: done)) { id in
                self.core.read(id, namespace: namespace, stale: stale)
            }
        }
    }

    /// A consistent copy of the state for a backup (docs/backup.md): taken after a ReadIndex
    /// round, so it holds every write acknowledged before the call, from this node's own state
    /// (a follower serves it; nothing pauses). The copy shares the trees: nothing is copied whole.
    /// `done` runs on `caller`.
    public func backupState(
        on caller: any EventLoop, _ done: @escaping @Sendable (Result<(StateMachine, BackupHeader), ReplicaError>) -> Void
    ) {
        submit {
            let completion = Completion<Result<Tree, ReplicaError>>(loop: self.loop) { result in
                switch result {
                case .failure(let e): caller.execute { done(.failure(e)) }
                case .success:
                    let machine = BackupImage.forBackup(self.core.replica.machine)
                    let raft = self.core.replica.raft
                    let applied = machine.appliedIndex
                    // The term of the entry at the image's index: in the log, or the snapshot's
                    // last entry (0 only for index 0, which has no entry).
                    let indexTerm = raft.term(at: applied) ?? (raft.snapshotMeta.index == applied ? raft.snapshotMeta.term : 0)
                    let header = BackupHeader(
                        clusterID: self.config.clusterID, sourceNode: self.config.nodeID, index: applied,
                        term: raft.term, lastTimestamp: machine.lastTimestamp, createdAt: Self.wallClock(), indexTerm: indexTerm,
                        // Unknown for a staged reference: the archive holds the payload it names.
                        indexEntryChecksum: raft.entry(at: applied).flatMap { StagedReference.isReference($0.data) ? nil : Self.archived($0).contentChecksum })
                    caller.execute { done(.success((machine, header))) }
                }
            }
            self.begin(\.readCompletions, completion) { id in self.core.read(id, namespace: Self.clusterNamespace, stale: false) }
        }
    }

    /// A namespace's quota and usage after a ReadIndex round (`GET /.settings/quota.json`,
    /// docs/operations.md, "Namespace quotas"): under a quota the state machine keeps the usage;
    /// without one, the namespace's tree carries its measure. O(1) either way. `done` runs on
    /// `caller`.
    public func quotaState(
        namespace: String, on caller: any EventLoop,
        _ done: @escaping @Sendable (Result<(quota: Int?, used: Int), ReplicaError>) -> Void
    ) {
        submit {
            let completion = Completion<Result<Tree, ReplicaError>>(loop: self.loop) { result in
                switch result {
                case .failure(let e): caller.execute { done(.failure(e)) }
                case .success(let tree):
                    let machine = self.core.replica.machine
                    let quota = machine.quotas[namespace]
                    let used = machine.quotaUsage[namespace] ?? tree.dataBytes
                    caller.execute { done(.success((quota, used))) }
                }
            }
            self.begin(\.readCompletions, completion) { id in self.core.read(id, namespace: namespace, stale: false) }
        }
    }

    /// Committed log entries for continuous archiving (`GET /.banyan/log`).
    public enum CommittedEntries: Sendable {
        /// Entries from the index asked for (possibly none yet), at most about `maxBytes` of
        /// them (always one when one is committed); `commit` is this node's commit index.
        case entries([ArchivedEntry], commit: UInt64)
        /// The index asked for is below this node's log (compacted into its snapshot):
        /// `firstIndex` is the first entry it still serves, `previousTerm` the term of the
        /// entry before it, so an archiver that holds that entry can check that this node's
        /// history continues its own (Raft's log matching) and go on from `firstIndex`.
        case compacted(firstIndex: UInt64, previousTerm: UInt64)
        /// A staged payload an entry names is no longer held here (compacted and not retained).
        case unavailable(StagedPayloadUnavailable)
    }

    /// Entries `from`… up to this node's commit index, from the entries retained after the last
    /// compactions and the in-memory log (bounded work: `maxBytes` of payload). Staged
    /// references are replaced by the payloads they name, read off this loop (I4,
    /// docs/staged-payloads.md), so an archive never depends on a staged store.
    public func committedEntries(from: UInt64, maxBytes: Int) -> EventLoopFuture<CommittedEntries> {
        let staged = stagedReader()
        return collectCommittedEntries(from: from, maxBytes: maxBytes).flatMap { answer in
            guard case .entries(let entries, let commit) = answer,
                entries.contains(where: { $0.kind == .command && StagedReference.isReference($0.payload) })
            else { return self.loop.makeSucceededFuture(answer) }
            return BulkWorkers.run(on: self.loop) { () -> CommittedEntries in
                switch NodeCore.inlineStaged(entries, store: staged.value) {
                case .success(let inlined): return .entries(inlined, commit: commit)
                case .failure(let missing): return .unavailable(missing)
                }
            }
        }
    }

    /// The bytes an entry's payload stands for when served: a staged reference counts as the
    /// payload it names (inlined when served), so a batch and the retained entries are bounded
    /// by what they really carry.
    static func servedBytes(_ payload: [UInt8]) -> Int {
        guard StagedReference.isReference(payload), let reference = StagedReference(decoding: payload) else { return payload.count }
        return Int(clamping: reference.length)
    }

    /// A read-only staged store, for any thread (its own file system instance).
    private func stagedReader() -> StagedStoreHandle {
        StagedStoreHandle(StagedStore(readingFrom: config.dataDirectory + "/staged", fileSystem: PosixFileSystem()))
    }

    private func collectCommittedEntries(from: UInt64, maxBytes: Int) -> EventLoopFuture<CommittedEntries> {
        loop.submit {
            let raft = self.core.replica.raft
            let first = raft.snapshotMeta.index + 1
            let commit = raft.commitIndex
            var out: [ArchivedEntry] = []
            var bytes = 0
            var index = from
            if from < first {
                // Served from the retained entries when they reach back to `from` and on to the log.
                // Nothing retained (a node that restarted, or installed the leader's snapshot):
                // the log's first index is where history starts here.
                let logStart = CommittedEntries.compacted(firstIndex: first, previousTerm: raft.snapshotMeta.term)
                guard self.retained.count > self.retainedHead else { return logStart }
                let retainedFirst = self.retainedFirst
                let retainedEnd = retainedFirst + UInt64(self.retained.count - self.retainedHead)
                guard retainedEnd >= first else { return logStart }
                guard retainedFirst <= from else { return .compacted(firstIndex: retainedFirst, previousTerm: self.retainedPreviousTerm) }
                while index < first, bytes < maxBytes {
                    let e = self.retained[self.retainedHead + Int(index - retainedFirst)]
                    out.append(e)
                    bytes += Self.servedBytes(e.payload) + 25
                    index += 1
                }
            }
            while index <= commit, bytes < maxBytes, let e = raft.entry(at: index) {
                out.append(Self.archived(e))
                bytes += Self.servedBytes(e.data) + 25
                index += 1
            }
            return .entries(out, commit: commit)
        }
    }

    /// Committed entries kept after the log was compacted past them, so that a log archiver
    /// (`banyan backup --follow`) polling behind the newest snapshot still finds them: at most
    /// `archiveRetainEntries` entries and `history.retained_bytes` of payload (docs/backup.md).
    private var retained: [ArchivedEntry] = []
    private var retainedHead = 0
    private var retainedFirst: UInt64 = 0
    /// The term of the entry before `retainedFirst` (what a 410 names beside it).
    private var retainedPreviousTerm: UInt64 = 0
    private var retainedBytes = 0
    /// At least 20,000, and as many as a snapshot interval, so reads of the past reach back to
    /// the older history base (below).
    var archiveRetainEntries: Int { max(20_000, Int(clamping: config.raft.snapshotEntries)) }
    var archiveRetainBytes: Int { config.history.retainedBytes }

    /// Copies the entries a compaction through `index` is about to drop (payloads are shared,
    /// not copied), then trims the oldest past the bounds.
    private func retainCompacted(through index: UInt64) {
        let raft = core.replica.raft
        let from = raft.snapshotMeta.index + 1
        guard index >= from else { return }
        guard archiveRetainBytes > 0 else {
            // Retention is off (`history.retained_bytes: 0`).
            retained.removeAll()
            (retainedHead, retainedBytes, retainedFirst, retainedPreviousTerm) = (0, 0, 0, 0)
            return
        }
        let retainedEnd = retainedFirst + UInt64(retained.count - retainedHead)
        if retained.count == retainedHead || retainedEnd != from {
            // A gap (a snapshot installed from the leader): start again from here.
            retained.removeAll()
            retainedHead = 0
            retainedBytes = 0
            retainedFirst = from
            retainedPreviousTerm = raft.snapshotMeta.term
        }
        // Only the newest entries can stay: skip what would be trimmed at once.
        let start = index - from + 1 > UInt64(archiveRetainEntries) ? index - UInt64(archiveRetainEntries) + 1 : from
        if start > from {
            retained.removeAll()
            retainedHead = 0
            retainedBytes = 0
            retainedFirst = start
            retainedPreviousTerm = raft.term(at: start - 1) ?? 0
        }
        for i in start...index {
            guard let e = raft.entry(at: i) else { break }
            retained.append(Self.archived(e))
            retainedBytes += Self.servedBytes(e.data)
        }
        // A staged reference counts as its payload: the file it names stays while it is retained.
        while retained.count - retainedHead > archiveRetainEntries || (retainedBytes > archiveRetainBytes && retained.count - retainedHead > 1) {
            retainedBytes -= Self.servedBytes(retained[retainedHead].payload)
            retainedPreviousTerm = retained[retainedHead].term
            retainedHead += 1
            retainedFirst += 1
        }
        if retainedHead > 4_096 && retainedHead * 2 > retained.count {
            retained.removeSubrange(..<retainedHead)
            retainedHead = 0
        }
    }

    /// States from which reads of the past replay (`readAt`): the machine at the last
    /// `history.bases` (at most two) snapshots this node took (or its state when it started),
    /// oldest first. Each shares its trees with the current state, so it costs only what
    /// changed since: at worst, when everything was rewritten, a whole state each.
    private var historyBases: [StateMachine] = []

    private func keepHistoryBase(_ machine: StateMachine) {
        let keep = min(2, max(0, config.history.bases))
        guard keep > 0 else { return }
        if let last = historyBases.last, last.appliedIndex >= machine.appliedIndex { return }
        historyBases.append(machine)
        if historyBases.count > keep {
            // What an old base holds alone (data replaced since) is freed off this loop.
            let dropped = Array(historyBases.prefix(historyBases.count - keep))
            historyBases.removeFirst(historyBases.count - keep)
            BulkWorkers.free(consume dropped)
        }
    }

    /// Why a read of the past has no answer.
    public enum HistoryError: Error, Sendable, CustomStringConvertible {
        case beyondApplied(index: UInt64, applied: UInt64)
        case beforeWindow(index: UInt64, oldest: UInt64)
        case busy
        /// A staged payload the replay needs is gone (docs/staged-payloads.md).
        case payloadUnavailable(StagedPayloadUnavailable)

        public var description: String {
            switch self {
            case let .beyondApplied(index, applied): "index \(index) is beyond what this node has applied (\(applied))"
            case let .beforeWindow(index, oldest):
                "index \(index) is older than this node's retained history, which starts at index \(oldest) (docs/backup.md, \"Reads of the past\")"
            case .busy: "another read of the past is running on this node; try again when it ends"
            case .payloadUnavailable(let missing): "\(missing): this index is outside the history this node can replay"
            }
        }
    }

    private let historyReadRunning = Atomic<Bool>(false)

    /// The tree of `namespace` as it was once entry `index` was applied: a history base at or
    /// before it, with the retained and logged entries up to `index` replayed on a bulk worker
    /// (one such read at a time per node). `done` runs on `caller`.
    public func readAt(
        index: UInt64, namespace: String, on caller: any EventLoop, _ done: @escaping @Sendable (Result<Tree, HistoryError>) -> Void
    ) {
        guard historyReadRunning.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else {
            return caller.execute { done(.failure(.busy)) }
        }
        let finish: @Sendable (Result<Tree, HistoryError>) -> Void = { result in
            self.historyReadRunning.store(false, ordering: .releasing)
            caller.execute { done(result) }
        }
        loop.execute {
            let machine = self.core.replica.machine
            guard index <= machine.appliedIndex else { return finish(.failure(.beyondApplied(index: index, applied: machine.appliedIndex))) }
            if index == machine.appliedIndex { return finish(.success(machine.tree(namespace))) }
            let raft = self.core.replica.raft
            let logFirst = raft.snapshotMeta.index + 1
            let retainedFirst = self.retained.count > self.retainedHead ? self.retainedFirst : logFirst
            // The newest base at or before `index` whose following entries are all still held.
            guard let base = self.historyBases.last(where: { $0.appliedIndex <= index && $0.appliedIndex + 1 >= min(retainedFirst, logFirst) }) else {
                let oldest = self.historyBases.map(\.appliedIndex).filter { $0 + 1 >= min(retainedFirst, logFirst) }.min() ?? machine.appliedIndex
                return finish(.failure(.beforeWindow(index: index, oldest: oldest)))
            }
            var entries: [ArchivedEntry] = []
            var i = base.appliedIndex + 1
            while i <= index {
                if i < logFirst {
                    let k = self.retainedHead + Int(i - self.retainedFirst)
                    guard i >= self.retainedFirst, k < self.retained.count else { break }
                    entries.append(self.retained[k])
                } else if let e = raft.entry(at: i) {
                    entries.append(Self.archived(e))
                } else {
                    break
                }
                i += 1
            }
            let staged = self.stagedReader()
            BulkWorkers.pool.submit { _ in
                BulkWorkers.lowerPriority()
                // Staged references replay as the payloads they name.
                let replayed: [ArchivedEntry]
                switch NodeCore.inlineStaged(entries, store: staged.value) {
                case .success(let inlined): replayed = inlined
                case .failure(let missing): return finish(.failure(.payloadUnavailable(missing)))
                }
                var state = base
                for e in replayed {
                    switch e.kind {
                    case .command: _ = state.apply(e.payload, index: e.index)
                    case .noop, .config: state.skip(index: e.index)
                    }
                }
                finish(state.appliedIndex == index ? .success(state.tree(namespace)) : .failure(.beforeWindow(index: index, oldest: base.appliedIndex)))
            }
        }
    }

    /// A log entry as the archive stores it (membership changes without their content: a
    /// restored cluster has its own members).
    static func archived(_ e: LogEntry) -> ArchivedEntry {
        switch e.kind {
        case .command: ArchivedEntry(index: e.index, term: e.term, kind: .command, payload: e.data)
        case .noop: ArchivedEntry(index: e.index, term: e.term, kind: .noop, payload: [])
        case .config: ArchivedEntry(index: e.index, term: e.term, kind: .config, payload: [])
        }
    }

    private func newRequest() -> RequestID {
        defer { nextRequest += 1 }
        return nextRequest
    }

    /// The one way a request enters the core (on the replica loop): a new id, its completion
    /// registered under it in `table` before the core can answer, the core called with the id,
    /// and a pass scheduled.
    private func begin<C>(_ table: ReferenceWritableKeyPath<NodeRuntime, [RequestID: C]>, _ completion: C, _ call: (RequestID) -> Void) {
        let id = newRequest()
        self[keyPath: table][id] = completion
        call(id)
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
            self.watchHandlers[watchID] = handler
            let started = Completion<Result<Tree, ReplicaError>>(loop: self.loop) { result in
                switch result {
                case .success: promise.succeed(.success(watchID))
                case .failure(let e):
                    self.watchHandlers[watchID] = nil
                    promise.succeed(.failure(e))
                }
            }
            self.begin(\.readCompletions, started) { id in self.core.watch(id, watch: watchID, namespace: namespace, stale: stale) }
            self.flushReplies()
        }
        return promise.futureResult
    }

    public func unwatch(_ id: UInt64) {
        loop.execute {
            self.watchHandlers[id] = nil
            self.core.unwatch(id)
        }
    }

    /// Adds a node as a learner (it is promoted automatically once it has caught up): first
    /// its peer address is replicated, then the membership change is proposed. Leader only.
    public func addMember(id: UInt64, peerAddress: HostPort) -> EventLoopFuture<Result<Membership, ReplicaError>> {
        let promise = loop.makePromise(of: Result<Membership, ReplicaError>.self)
        loop.execute {
            self.begin(\.memberCompletions, promise) { request in
                self.core.addMember(request, node: id, address: peerAddress.description)
            }
        }
        return promise.futureResult
    }

    public func changeMembership(_ change: MembershipChange) -> EventLoopFuture<Result<Membership, ReplicaError>> {
        let promise = loop.makePromise(of: Result<Membership, ReplicaError>.self)
        loop.execute {
            self.begin(\.memberCompletions, promise) { id in self.core.changeMembership(id, change) }
        }
        return promise.futureResult
    }

    public func transferLeadership(to target: UInt64) -> EventLoopFuture<Result<Void, ReplicaError>> {
        loop.submit {
            do throws(ReplicaError) {
                try self.core.transferLeadership(to: target)
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

    /// The client addresses the nodes published (`$cluster/clients/<id>`, as this node has
    /// applied them) and the current members (voters and learners).
    public func clientAddresses() -> EventLoopFuture<(published: [UInt64: String], members: Set<UInt64>)> {
        loop.submit {
            var published: [UInt64: String] = [:]
            if let path = try? Path(parsing: "/clients") {
                for (key, entry) in self.core.replica.machine.tree(Self.clusterNamespace).child(at: path).children.elements() {
                    guard let id = UInt64(key.string), case .string(let text)? = entry.leaf else { continue }
                    published[id] = text
                }
            }
            let membership = self.core.replica.raft.membership
            return (published, Set(membership.voters).union(membership.learners))
        }
    }

    /// Publishes this node's client address in `$cluster/clients/<id>` unless it is there
    /// already; `done` says whether it is there now.
    public func publishClientAddress(_ address: String, _ done: @escaping @Sendable (Bool) -> Void) {
        submit {
            let path = "/clients/\(self.config.nodeID)"
            if let location = try? Path(parsing: path),
                self.core.replica.machine.tree(Self.clusterNamespace).child(at: location).leaf == .string(address)
            {
                return done(true)
            }
            let json = JSONWriter.bytes(Tree(.string(address)))
            self.write(namespace: Self.clusterNamespace, command: .set(path: path, json: json), on: self.loop) { result in
                if case .success(let applied) = result, applied.outcome == .ok { done(true) } else { done(false) }
            }
        }
    }

    /// The current leader and its client address, if known (for redirecting operators).
    public func leader() -> EventLoopFuture<UInt64> {
        loop.submit { self.core.replica.raft.leader }
    }

    private func currentStatus() -> NodeStatus {
        let replica = core.replica
        let raft = replica.raft
        return NodeStatus(
            nodeID: config.nodeID, clusterID: config.clusterID, role: raft.role.description, term: raft.term, leader: raft.leader,
            commitIndex: raft.commitIndex, appliedIndex: replica.machine.appliedIndex, lastIndex: raft.lastIndex,
            snapshotIndex: raft.snapshotMeta.index, logFirstIndex: core.storage.logFirstIndex, voters: raft.membership.voters,
            learners: raft.membership.learners,
            peers: Dictionary(uniqueKeysWithValues: peerAddresses.map { (String($0.key), $0.value.description) }),
            replication: raft.role == .leader
                ? raft.replicationStatus.map {
                    NodeStatus.Progress(node: $0.node, match: $0.match, next: $0.next, state: $0.state, recentlyActive: $0.recentlyActive)
                } : [],
            pendingWrites: replica.pendingWrites, pendingReads: replica.pendingReads, watchers: core.watchCount,
            namespaces: replica.machine.namespaces.count, mayVote: raft.mayVote, incarnation: String(incarnation, radix: 16),
            pid: getpid(), spaceAlarms: replica.machine.spaceAlarms.sorted(), writesRefusedForSpace: core.refusedBeforeProposal,
            ballastBytes: ballastSize ?? 0, startedAtMs: Self.processStart)
    }

    // MARK: - The loop

    private func tick() {
        guard !core.stopped else { return }
        let now = DispatchTime.now().uptimeNanoseconds
        if lastTick > 0, now > lastTick {
            let gap = now - lastTick
            tickGaps.recordNanoseconds(Int64(clamping: gap))
            if gap > longestTickGap {
                longestTickGap = gap
                tickGapMax.record(Int64(gap / 1_000_000))
            }
        }
        lastTick = now
        checkSpace()
        core.tick(now: Self.wallClock())
        flushReplies()
        scheduleProcess()
    }

    /// About once a second: raises this node's free-space alarm through the log when the data
    /// directory's file system has less than `min_free_bytes` free, and clears it once there is
    /// twice that (docs/operations.md, "Disk space").
    private func checkSpace() {
        ticksToSpaceCheck -= 1
        guard ticksToSpaceCheck <= 0 else { return }
        ticksToSpaceCheck = max(1, 1_000 / max(1, config.raft.tickMilliseconds))
        let alarms = core.replica.machine.spaceAlarms
        spaceAlarmGauge.record(alarms.isEmpty ? 0 : 1)
        let probe = freeSpace.withLock { $0 }
        guard config.minFreeBytes > 0, let free = probe(config.dataDirectory) else { return }
        diskFree.record(Int64(clamping: free))
        considerBallast(free: free)
        let raised = alarms.contains(config.nodeID)
        let low = free < config.minFreeBytes
        let (twice, overflow) = config.minFreeBytes.multipliedReportingOverflow(by: 2)
        let recovered = !overflow && free >= twice
        guard !spaceAlarmProposed, low != raised, low || recovered else { return }
        spaceAlarmProposed = true
        if low {
            logger.error(
                "low on disk space: raising the free-space alarm (the cluster accepts only deletes until space is freed)",
                metadata: ["free_bytes": "\(free)", "min_free_bytes": "\(config.minFreeBytes)", "dir": "\(config.dataDirectory)"])
        } else {
            logger.notice("disk space recovered: clearing the free-space alarm", metadata: ["free_bytes": "\(free)"])
        }
        let alarm = Command.spaceAlarm(node: config.nodeID, raised: low)
        write(namespace: StateMachine.alarmsNamespace, command: alarm).whenComplete { _ in
            // Applied, refused or timed out: the next check looks again at what the log says.
            self.spaceAlarmProposed = false
        }
    }

    /// Makes the ballast, on the freeing thread, when it is missing (released at a start on a
    /// full disk, or never made) and the disk has its size free besides twice `min_free_bytes`
    /// (`Ballast.shouldCreate`).
    private func considerBallast(free: UInt64) {
        // Looked at each time (a stat): an operator may remove the file to win its space back.
        if !ballastBusy { ballastSize = ballast.size() }
        ballastGauge.record(Int64(clamping: ballastSize ?? 0))
        if ballastRetryChecks > 0 {
            ballastRetryChecks -= 1
            return
        }
        guard !ballastBusy, Ballast.shouldCreate(bytes: config.effectiveBallastBytes, present: ballastSize, free: free, minFree: config.minFreeBytes) else {
            return
        }
        ballastBusy = true
        let ballast = self.ballast
        BulkWorkers.freeing.runIfActive(eventLoop: loop) { () -> BallastError? in
            BulkWorkers.lowerPriority()
            do throws(BallastError) {
                try ballast.create()
                return nil
            } catch {
                return error
            }
        }.whenSuccess { error in
            self.ballastBusy = false
            if let error {
                self.ballastSize = ballast.size()
                self.ballastRetryChecks = 60
                self.logger.warning("cannot make the ballast file; trying again in a minute", metadata: ["error": "\(error)"])
            } else {
                self.ballastSize = ballast.bytes
                self.ballastGauge.record(Int64(clamping: ballast.bytes))
                self.logger.notice(
                    "made the ballast file: space held in reserve for a start on a full disk", metadata: ["bytes": "\(ballast.bytes)", "path": "\(ballast.path)"])
            }
        }
    }

    /// Replaces how free space is measured (tests).
    public func setFreeSpaceProbe(_ probe: @escaping @Sendable (String) -> UInt64?) {
        freeSpace.withLock { $0 = probe }
    }

    /// Free bytes for an unprivileged writer on the file system holding `path`.
    public static func statvfsFreeBytes(_ path: String) -> UInt64? {
        var info = statvfs()
        guard statvfs(path, &info) == 0 else { return nil }
        return UInt64(info.f_bavail) * UInt64(info.f_frsize)
    }

    private func scheduleProcess() {
        guard !processScheduled, !core.stopped else { return }
        processScheduled = true
        loop.execute { self.process() }
    }

    /// One pass of the core's Ready loop (persist, send, apply, answer), then the answers go out.
    private func process() {
        processScheduled = false
        guard !core.stopped else { return }
        let started = DispatchTime.now().uptimeNanoseconds
        passPersistNanoseconds = 0
        core.process()
        flushReplies()
        notePassLength(DispatchTime.now().uptimeNanoseconds &- started)
        let raft = core.replica.raft
        commitGauge.record(Int64(raft.commitIndex))
        appliedGauge.record(Int64(core.replica.machine.appliedIndex))
        logBytesGauge.record(Int64(clamping: core.replica.logBytesSinceSnapshot))
        logKeptGauge.record(Int64(clamping: core.replica.logBytesKept))
        let held = core.replica.largeWritesHeld
        if held != largeHeldSeen {
            largeHeldCounter.increment(by: Int64(held > largeHeldSeen ? held - largeHeldSeen : held))
            largeHeldSeen = held
        }
        heldForwardGauge.record(Int64(core.replica.heldForRoomBytes))
    }

    /// Time spent persisting in the current pass (from the core's `.persisted` notes).
    private var passPersistNanoseconds: UInt64 = 0
    /// Passes that held the replica loop for half the shortest election timeout or more.
    private let slowPasses = Counter(label: "banyan_raft_slow_passes_total")
    private var slowPassLogged: UInt64 = 0

    /// A pass long enough to delay heartbeats towards an election is counted, and logged at most
    /// every 10 s with how much of it was spent persisting (docs/server.md, "Large writes").
    private func notePassLength(_ nanoseconds: UInt64) {
        let threshold = UInt64(max(1, config.raft.tickMilliseconds) * max(2, config.raft.electionTicks)) * 500_000
        guard nanoseconds >= threshold else { return }
        slowPasses.increment()
        let now = DispatchTime.now().uptimeNanoseconds
        guard slowPassLogged == 0 || now &- slowPassLogged >= 10_000_000_000 else { return }
        slowPassLogged = now
        logger.warning(
            "a replica pass held the loop that ticks Raft for half an election timeout or more",
            metadata: ["took_ms": "\(nanoseconds / 1_000_000)", "persisting_ms": "\(passPersistNanoseconds / 1_000_000)"])
    }

    /// Replaced subtrees waiting to be freed on the freeing thread (`NodeAction.release`),
    /// handed over once the pass is over (the core's copies are gone by then).
    private var releasing: [Tree] = []

    private func freeReleased() {
        let trees = releasing
        releasing = []
        BulkWorkers.free(consume trees)
    }

    /// Carries out one of the core's actions (docs/node-core.md), in the order given.
    private func perform(_ action: NodeAction) {
        switch action {
        case .send(let messages):
            transport?.send(messages)
        case let .wrote(id, result):
            if let c = writeCompletions.removeValue(forKey: id) { complete(c, result) }
        case let .read(id, result):
            if let c = readCompletions.removeValue(forKey: id) { complete(c, result) }
        case let .membership(id, result):
            memberCompletions.removeValue(forKey: id)?.succeed(result)
        case let .watch(watch, event):
            watchHandlers[watch]?(event)
        case .peerAddresses(let addresses):
            mergePeers(addresses)
        case let .writeSnapshot(machine, meta):
            keepHistoryBase(machine)
            writeSnapshot(machine, meta)
        case .wake(let nanoseconds):
            pacerWake = loop.scheduleTask(in: .nanoseconds(Int64(clamping: nanoseconds))) {
                self.pacerWake = nil
                self.core.woke()
                self.scheduleProcess()
            }
        case .processAgain:
            scheduleProcess()
        case .release(let trees):
            // Handed to the freeing thread once this pass is over (the core's copies are gone by
            // then): freeing a replaced subtree of a million values takes about 150 ms.
            if releasing.isEmpty { loop.execute { self.freeReleased() } }
            releasing += trees
        case let .prepare(index, term, payload):
            // Reading a large write's data (JSON into a tree) is the costly part of applying it:
            // done here, the replica loop keeps ticking and answering peers meanwhile.
            BulkWorkers.runReadAhead(on: loop) { PreparedCommand(payload: payload) }.whenComplete { result in
                // A pool that is shutting down answers nothing: the replica asks again later.
                guard case .success(let command) = result else { return }
                self.core.prepared(index: index, term: term, command)
                self.flushReplies()
                self.scheduleProcess()
            }
        case let .storeStaged(id, bytes):
            let store = stagedStore
            BulkWorkers.runStaging(on: loop) { () -> Result<UInt32, OpLogError> in
                Result { () throws(OpLogError) in try store.value.store(id, bytes) }
            }.whenComplete { result in
                switch result {
                case .success(.success(let checksum)):
                    self.core.stagedStored(id, checksum: checksum)
                case .success(.failure(let error)):
                    self.logger.warning("cannot store a staged payload; not acknowledged", metadata: ["id": "\(id)", "error": "\(error)"])
                    self.core.stagedStoreFailed(id)
                case .failure:
                    // The pool is shutting down.
                    return
                }
                self.flushReplies()
                self.scheduleProcess()
            }
        case let .prepareStaged(id, bytes):
            // Loaded on the staging thread (the store's one user), read ahead on a read-ahead thread.
            let store = stagedStore
            let loaded: EventLoopFuture<[UInt8]?> =
                bytes != nil
                ? loop.makeSucceededFuture(bytes)
                : BulkWorkers.runStaging(on: loop) { () -> [UInt8]? in
                    if case .payload(let payload, _) = store.value.load(id) { return payload }
                    return nil
                }
            loaded.flatMap { payload -> EventLoopFuture<(StagedPreparation, String?)> in
                guard let payload else {
                    return BulkWorkers.runStaging(on: self.loop) { NodeCore.prepareStaged(id, nil, store: store.value) }
                }
                return BulkWorkers.runReadAhead(on: self.loop) { NodeCore.prepareStaged(id, payload, store: store.value) }
            }.whenComplete { result in
                guard case .success(let (preparation, damaged)) = result else { return }
                if let damaged { self.logger.error("a staged payload is damaged; fetching it from the other members", metadata: ["id": "\(id)", "why": "\(damaged)"]) }
                self.core.preparedStaged(id, preparation)
                self.flushReplies()
                self.scheduleProcess()
            }
        case let .serveStaged(id, peer):
            let store = stagedStore
            BulkWorkers.runStaging(on: loop) { () -> [UInt8]? in
                if case .payload(let payload, _) = store.value.load(id) { return payload }
                return nil
            }.whenComplete { result in
                guard case .success(let payload) = result else { return }
                self.core.stagedRead(id, payload, for: peer)
                self.scheduleProcess()
            }
        case .removeStaged(let ids):
            let store = stagedStore
            let logger = logger
            BulkWorkers.staging.submit { _ in
                do {
                    try store.value.remove(ids)
                } catch {
                    logger.warning("cannot remove staged payloads", metadata: ["error": "\(error)"])
                }
            }
        case .fatal(let reason):
            // A storage error (disk full, I/O error, a failed fsync) ends this process: memory
            // may no longer match the disk, and only a restart recovers from what is really
            // there. Nothing acknowledged is lost: acknowledgements follow persistence.
            logger.critical("storage error; stopping the node so it restarts and recovers", metadata: ["error": "\(reason)"])
            exit(75)
        case .note(let note):
            observe(note)
        }
    }

    private func observe(_ note: NodeNote) {
        switch note {
        case let .roleChanged(role, leader, term):
            termGauge.record(Int64(term))
            leaderGauge.record(role == .leader ? 1 : 0)
            leaderChanges.increment()
            logger.notice("raft role changed", metadata: ["role": "\(role)", "leader": "\(leader)", "term": "\(term)"])
        case .membershipChanged(let membership):
            logger.notice("membership changed", metadata: ["members": "\(membership)"])
        case .snapshotInstalled:
            // NodeStorage logs the install itself.
            snapshotInstalls.increment()
        case .restoredFromSnapshot(let meta):
            logger.info("state machine restored from the leader's snapshot", metadata: ["index": "\(meta.index)"])
            // Connections the snapshot ended (an `ls` elsewhere, a lease expiry) applied no
            // command here: the server checks its open ones against the restored state.
            let sessions = core.replica.machine.sessions
            connectionsRestored.withLock { $0 }?({ sessions[$0]?.ended == true })
        case .snapshotWritten(let meta):
            snapshotCounter.increment()
            logger.info("snapshot written, log compacted", metadata: ["index": "\(meta.index)", "compacted_through": "\(core.replica.raft.snapshotMeta.index)"])
        case .appliedCommands(let n):
            appliedCounter.increment(by: n)
        case .persisted(let nanoseconds):
            persistTimer.recordNanoseconds(Int64(clamping: nanoseconds))
            passPersistNanoseconds &+= nanoseconds
        case .reloadedAfterDamagedSnapshot(let why):
            logger.error("refused a damaged snapshot from the leader; reloading state from disk", metadata: ["error": "\(why)"])
        case let .snapshotChunkUnavailable(follower, index, error):
            logger.warning(
                "cannot read the snapshot a follower needs (a newer one may have replaced it)",
                metadata: ["follower": "\(follower)", "index": "\(index)", "error": "\(error)"])
        case .connectionsEnded(let connections):
            connectionsEnded.withLock { $0 }?(connections)
        case .rulesChanged:
            let rules = core.replica.machine.rules
            rulesInForce.withLock { $0 = rules }
            rulesChanged.withLock { $0 }?()
        case .signingKeysChanged:
            installSigningKeys(core.replica.machine.signingKeys(projects: config.accounts.servedProjects))
        case let .leaseExpiryProposed(holder, namespace):
            leaseExpiries.increment()
            logger.notice(
                "a node's lease on its realtime connections lapsed: ending them (their onDisconnect writes fire)",
                metadata: ["holder": "\(String(holder, radix: 16))", "namespace": "\(namespace)"])
        }
    }

    private func writeSnapshot(_ machine: StateMachine, _ meta: SnapshotMeta) {
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
                logger.debug("snapshot file durable", metadata: ["index": "\(meta.index)", "ms": "\(ms)"])
                self.loop.execute {
                    // Only what the compaction drops (a snapshot streamed to a follower holds it
                    // back: `Replica.compactionPoint`); both calls on this loop, so it cannot move.
                    self.retainCompacted(through: self.core.replica.compactionPoint(for: meta.index))
                    // The staged files of retained entries stay while they are served.
                    self.core.setStagedRetentionFloor(self.retained.count > self.retainedHead ? self.retainedFirst : nil)
                    self.core.snapshotWritten(meta)
                }
            } catch {
                logger.error("snapshot write failed; will retry later", metadata: ["index": "\(meta.index)", "error": "\(error)"])
                self.loop.execute { self.core.snapshotFailed(meta) }
            }
        }
    }

    /// Addresses from the replicated `$cluster/peers` tree.
    private func mergePeers(_ addresses: [NodeID: String]) {
        var changed = false
        for (id, text) in addresses {
            guard let address = try? HostPort(parsing: text), peerAddresses[id] != address else { continue }
            peerAddresses[id] = address
            changed = true
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
/// A node's staged store, handed to `BulkWorkers.staging`: only that one thread uses it, one
/// call at a time (docs/staged-payloads.md), with a file system instance of its own.
final class StagedStoreHandle: @unchecked Sendable {
    let value: StagedStore
    init(_ value: StagedStore) { self.value = value }
}

private struct AnswerBatch: @unchecked Sendable {
    let work: [() -> Void]
}
