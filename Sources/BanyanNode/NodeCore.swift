public import BanyanBasics
public import BanyanRaft
public import BanyanReplica
public import BanyanStateMachine
public import BanyanTree
public import Logging
public import BanyanOpLogFiles

/// What a write request ends with.
public typealias WriteResult = Result<StateMachine.Applied, ReplicaError>

/// A live view of one namespace.
public enum WatchEvent: Sendable {
    /// The tree when the watch started (after a ReadIndex round, so it includes every write
    /// acknowledged before the watch was opened).
    case start(Tree)
    case applied(StateMachine.Applied, tree: Tree)
    /// The state was replaced (a snapshot from the leader, or a reload from disk).
    case restored(Tree)
}

/// Something worth a log line or a metric (the core itself logs nothing that decides anything).
public enum NodeNote: Sendable {
    case roleChanged(role: RaftRole, leader: NodeID, term: UInt64)
    case membershipChanged(Membership)
    case snapshotInstalled(SnapshotMeta)
    case restoredFromSnapshot(SnapshotMeta)
    case snapshotWritten(SnapshotMeta)
    case appliedCommands(Int)
    /// Persisting one round took this long (the injected monotonic clock).
    case persisted(nanoseconds: UInt64)
    /// A snapshot from the leader failed verification; the core reloaded its state from disk.
    case reloadedAfterDamagedSnapshot(String)
    case snapshotChunkUnavailable(follower: NodeID, index: UInt64, error: String)
    /// This leader proposed the expiry of a node lease holder (its connections' onDisconnect
    /// writes fire when it applies).
    case leaseExpiryProposed(holder: UInt64, namespace: String)
    /// These realtime connections ended in the log (through any node): one still served here
    /// must close (docs/realtime.md, "Ends through another node").
    case connectionsEnded([UInt64])
    /// The security rules of some namespace changed (a `setRules` applied, or a snapshot was
    /// restored): `replica.machine.rules` holds the rules now in force.
    case rulesChanged
    /// A project's signing keys changed (an `installKey` applied, or a snapshot was restored):
    /// `replica.machine.signingKeys` holds the keys now in force (docs/accounts.md).
    case signingKeysChanged
}

/// What the driver must do, in the order given (docs/node-core.md).
public enum NodeAction: Sendable {
    /// Peer messages. A round's early sends (a leader's appends, a follower's forwarded
    /// proposals and read requests) come before its persist; the rest after it.
    case send([Message])
    case wrote(RequestID, WriteResult)
    case read(RequestID, Result<Tree, ReplicaError>)
    case membership(RequestID, Result<Membership, ReplicaError>)
    case watch(UInt64, WatchEvent)
    /// Peer addresses from the replicated `$cluster/peers` tree (id → "host:port" as stored).
    case peerAddresses([NodeID: String])
    /// Write a snapshot of `machine` at `meta` (in the background; the machine is a value), then
    /// call `snapshotWritten(_:)` or `snapshotFailed(_:)`.
    case writeSnapshot(StateMachine, SnapshotMeta)
    case note(NodeNote)
    /// Round pacing holds new proposals: call `process()` again after this many nanoseconds.
    case wake(afterNanoseconds: UInt64)
    /// The pass stopped at its round limit with work left: call `process()` again soon.
    case processAgain
    /// Read this entry ahead, off this thread (`PreparedCommand(payload:)`), then
    /// call `prepared(index:term:_:)` on it (docs/replica.md, "Prepared entries").
    case prepare(index: UInt64, term: UInt64, payload: [UInt8])
    /// Large subtrees that applied writes replaced or deleted (`StateMachine.Applied.released`):
    /// free them off this thread (or drop them; the core holds no other reference).
    case release([Tree])
    /// Staged payloads (docs/staged-payloads.md). Store `bytes` as `id` in `storage.staged`,
    /// durably, off this thread; then call `stagedStored(_:checksum:)` (or `stagedStoreFailed`).
    case storeStaged(StageID, [UInt8])
    /// Read staged payload `id` ahead, from these bytes or (nil) from `storage.staged`, off this
    /// thread (`NodeCore.prepareStaged`); then call `preparedStaged(_:_:)`.
    case prepareStaged(StageID, [UInt8]?)
    /// Read staged payload `id` from `storage.staged` for peer `to`; then call
    /// `stagedRead(_:_:for:)` (nil when it is not there).
    case serveStaged(StageID, to: NodeID)
    /// Remove these staged files from `storage.staged`.
    case removeStaged([StageID])
    /// Storage failed: memory may no longer match the disk. Stop the process; a restart recovers
    /// from what the disk holds. Nothing acknowledged is lost (acknowledgements follow persistence).
    case fatal(String)
}

/// A node's decisions between its clients, its replica and its storage, as a state machine that
/// returns actions (docs/node-core.md). The server's `NodeRuntime` and the whole-node simulator
/// drive this same code. Single-threaded: every call comes from the driver's one thread.
public final class NodeCore {
    public struct Settings: Sendable {
        public var replica: ReplicaConfiguration
        /// Round pacing interval (`raft.round_interval_us`), nanoseconds; 0 = none.
        public var roundIntervalNanoseconds: UInt64 = 0
        /// Replication rounds per `process()` pass before it yields (`processAgain`).
        public var roundsPerPass = 64
        /// A pass also yields once its rounds persisted this many bytes of entries, so ticks and
        /// peer messages are handled between large rounds (docs/server.md, "Large writes").
        public var bytesPerPass = 8 << 20
        /// Simulator self-tests only (`Sabotage`).
        public var sabotage: Sabotage = .none
        /// Node leases of realtime connections (docs/realtime.md, "Node leases"): the leader
        /// expires a holder silent this long. The same on every node.
        public var leaseNanoseconds: UInt64 = Self.defaultLeaseNanoseconds
        public static let defaultLeaseNanoseconds: UInt64 = 20_000_000_000
        /// Expiry of idle records (docs/internals/state-machine.md, "Expiry"): a client's write
        /// records after it wrote nothing for this long (7 days: an SDK offline longer than that,
        /// whose answers were lost, may see those writes applied again), an ended connection's
        /// session record after this long (1 hour: nothing of it travels that long), and how
        /// often (ticks) the leader checks whether something is due.
        public var clientsIdleMillis: UInt64 = 7 * 24 * 3_600_000
        public var endedMillis: UInt64 = 3_600_000
        public var expiryCheckTicks = 3_000

        public init(replica: ReplicaConfiguration) { self.replica = replica }
    }

    /// The namespace that holds cluster metadata (peer addresses).
    public static let clusterNamespace = "$cluster"

    public let settings: Settings
    public let storage: NodeStorage
    public private(set) var replica: Replica
    /// Where actions go, in order (set by the driver before the first input).
    public var output: (NodeAction) -> Void = { _ in }
    public private(set) var stopped = false
    /// Writes answered without a proposal (`StateMachine.refusedBeforeProposal`: the free-space
    /// alarm is raised), since start.
    public private(set) var refusedBeforeProposal: UInt64 = 0
    /// Peer addresses learned from `$cluster/peers`.
    public private(set) var peerAddresses: [NodeID: String] = [:]
    /// Ticks since the last expiry check, and the expiry this node proposed that has not applied
    /// or failed yet.
    private var expiryTicks = 0
    private var expiryRequest: RequestID?

    private let logger: Logger
    private let monotonicNanoseconds: () -> UInt64
    private let newSession: () -> UInt64
    private var pacer: RoundPacer
    private var wakePending = false
    private var leaseKeeper: LeaseKeeper
    /// Ids of the core's own proposals (lease expiries): a range no driver reaches, so their
    /// outcomes, which no waiter claims, are dropped.
    private var nextInternalRequest: RequestID = 1 << 63

    private enum Waiter {
        case write
        /// A linearizable read of `namespace`; `watch` is set when it starts a live view.
        case read(namespace: String, watch: UInt64?)
        case membership
        /// Adding a member: its address is being written to `$cluster/peers` first.
        case addMember(NodeID, address: String)
    }
    private var waiters: [RequestID: Waiter] = [:]
    /// Live views: watch id → namespace, and by namespace the ids in ascending order (the order
    /// their events go out in, whatever order the driver picked the ids in).
    private var watches: [UInt64: String] = [:]
    private var watchesByNamespace: [String: [UInt64]] = [:]
    /// Peers' incarnations from their hellos (kept across reloads: open connections send none).
    private var peerIncarnations: [NodeID: UInt64] = [:]

    /// Opens the node's state: bootstraps a blank directory when `foundingMembers` is set, then
    /// loads the newest snapshot and the log after it. `newSession` gives a fresh random client
    /// session per incarnation of the replica (start and every reload); the monotonic clock
    /// drives pacing and persist timing.
    public init(
        settings: Settings, storage: NodeStorage, foundingMembers: [NodeID]?, logger: Logger, now: Int64,
        monotonicNanoseconds: @escaping () -> UInt64, newSession: @escaping () -> UInt64, progress: @escaping (String) -> Void
    ) throws {
        self.settings = settings
        self.storage = storage
        self.logger = logger
        self.monotonicNanoseconds = monotonicNanoseconds
        self.newSession = newSession
        storage.sabotage = settings.sabotage
        if storage.isBlank, let members = foundingMembers {
            try storage.bootstrap(members: members)
            logger.notice("bootstrapped a new cluster", metadata: ["members": "\(members)"])
        }
        var loaded = try storage.load(progress: progress)
        if settings.sabotage == .forgetVote { loaded.persisted.hardState.vote = 0 }
        if settings.sabotage == .forgetRulesOnLoad { loaded.machine.forgetRules() }
        if settings.sabotage == .forgetClientWritesOnLoad { loaded.machine.forgetClientWrites() }
        if settings.sabotage == .ignoreClientWrites { loaded.machine.ignoresClientWrites = true }
        pacer = RoundPacer(interval: settings.roundIntervalNanoseconds)
        leaseKeeper = LeaseKeeper(leaseNanoseconds: settings.leaseNanoseconds, ignoreRenewals: settings.sabotage == .leaseIgnoresRenewals)
        replica = try Replica(
            configuration: settings.replica, persisted: loaded.persisted, machine: loaded.machine, session: newSession(), now: now)
        replica.treesFor = [Self.clusterNamespace]
        replica.noteStagedFiles(try storage.staged.list())
        noteSnapshotImage(at: loaded.persisted.snapshot.index)
        learnPeers(from: loaded.machine.tree(Self.clusterNamespace), announce: false)
    }

    /// Tells the replica the size of the snapshot image at `index` (its bound on the log held
    /// between snapshots grows with it; none at index 0).
    private func noteSnapshotImage(at index: UInt64) {
        guard index > 0, let size = try? storage.snapshots.fileSize(lastIndex: index) else { return }
        replica.noteSnapshotImage(bytes: UInt64(size))
    }

    public var watchCount: Int { watches.count }

    // MARK: - Client inputs (the driver picks request ids, unique among those waiting)

    public func write(
        _ id: RequestID, namespace: String, command: Command, session: UInt64? = nil, auth: ClientAuth? = nil, clientWrite: ClientWriteKey? = nil
    ) {
        guard !stopped else { return output(.wrote(id, .failure(.overloaded("the node is shutting down")))) }
        if let refused = replica.machine.refusedBeforeProposal(namespace: namespace, command: command) {
            refusedBeforeProposal &+= 1
            return output(.wrote(id, .success(refused)))
        }
        start(id, .write) { $0.write(id, namespace: namespace, command: command, session: session, auth: auth, clientWrite: clientWrite) }
    }

    /// Opens a realtime connection's own client session (`Replica.openSession`): false when the
    /// id is taken. Its writes then name it in `write(_:namespace:command:session:)`.
    public func openSession(_ session: UInt64) -> Bool {
        guard !stopped else { return false }
        return replica.openSession(session)
    }

    /// Closes a connection's session (after proposing its `connectionEnded`).
    public func closeSession(_ session: UInt64) {
        replica.closeSession(session)
    }

    /// A read of `namespace`: after a ReadIndex round (linearizable), or at once from this node's
    /// state (`stale`: possibly behind the leader).
    public func read(_ id: RequestID, namespace: String, stale: Bool) {
        guard !stopped else { return output(.read(id, .failure(.timedOut(write: false)))) }
        if stale || settings.sabotage == .localReads { return output(.read(id, .success(replica.machine.tree(namespace)))) }
        start(id, .read(namespace: namespace, watch: nil)) { $0.read(id) }
    }

    /// Opens live view `watch` of `namespace`: `.watch(watch, .start(tree))` at a linearizable
    /// point (or at once from this node's tree when `stale`), then every applied write of the
    /// namespace. Request `id` ends with `.read`: success once started, or the error that
    /// prevented the start (the watch is then closed).
    public func watch(_ id: RequestID, watch: UInt64, namespace: String, stale: Bool) {
        guard !stopped else { return output(.read(id, .failure(.timedOut(write: false)))) }
        openWatch(watch, namespace)
        if stale {
            let tree = replica.machine.tree(namespace)
            output(.watch(watch, .start(tree)))
            return output(.read(id, .success(tree)))
        }
        start(id, .read(namespace: namespace, watch: watch)) { $0.read(id) }
    }

    public func unwatch(_ watch: UInt64) { closeWatch(watch) }

    public func changeMembership(_ id: RequestID, _ change: MembershipChange) {
        guard !stopped else { return output(.membership(id, .failure(.timedOut(write: true)))) }
        start(id, .membership) { $0.changeMembership(id, change) }
    }

    /// Adds a node as a learner (promoted automatically once caught up): its peer address is
    /// replicated first, then the membership change is proposed. Leader only. Ends with
    /// `.membership`.
    public func addMember(_ id: RequestID, node: NodeID, address: String) {
        guard !stopped else { return output(.membership(id, .failure(.timedOut(write: true)))) }
        // Validated before the address is stored: an add naming an existing member (a voter's id,
        // say) would otherwise redirect that member's traffic to the new address, for good
        // (issue 18). The change itself is checked again when it is proposed.
        do throws(RaftError) {
            _ = try replica.raft.checkMembershipChange(.addLearner(node))
        } catch {
            if case .notLeader(let leader) = error { return output(.membership(id, .failure(.notLeader(leader: leader)))) }
            return output(.membership(id, .failure(.refused(error))))
        }
        let json = JSONWriter.bytes(Tree(.string(address)))
        start(id, .addMember(node, address: address)) {
            $0.write(id, namespace: Self.clusterNamespace, command: .set(path: "/peers/\(node)", json: json))
        }
    }

    public func transferLeadership(to target: NodeID) throws(ReplicaError) {
        try replica.transferLeadership(to: target)
    }

    /// The one way a request starts: register what it is, hand it to the replica, and pass on
    /// whatever the replica says at once (an immediate refusal).
    private func start(_ id: RequestID, _ waiter: Waiter, _ submit: (inout Replica) -> Void) {
        guard waiters[id] == nil else {
            // The driver reused an id still waiting: refuse the new request, keep the old one.
            return end(id, waiter, .overloaded("request id \(id) is already waiting"))
        }
        waiters[id] = waiter
        submit(&replica)
        handle(replica.takeEvents())
    }

    // MARK: - Peer and timer inputs

    /// A peer's hello named its incarnation (item 3 of issue 14: the leader records it in the
    /// membership change that admits the peer, so only that incarnation may vote).
    public func noteIncarnation(of peer: NodeID, _ incarnation: UInt64) {
        guard !stopped, incarnation != 0, peerIncarnations[peer] != incarnation else { return }
        peerIncarnations[peer] = incarnation
        replica.noteIncarnation(of: peer, incarnation)
    }

    public func receive(_ messages: [Message]) {
        guard !stopped else { return }
        for m in messages { replica.receive(m) }
    }

    /// One Raft tick; `now` is the wall clock (ms since the epoch), for server timestamps.
    public func tick(now: Int64) {
        guard !stopped else { return }
        replica.tick(now: now)
        expiryTicks += 1
        if expiryTicks >= settings.expiryCheckTicks {
            expiryTicks = 0
            // The leader proposes an expiry when the oldest idle record is due (one check of the
            // first entry of each time index; the entry removes a bounded batch).
            // One at a time: while an expiry waits to apply, the records it removes still look due.
            if replica.raft.role == .leader, expiryRequest == nil,
                replica.machine.idleToExpire(clientsIdleMillis: settings.clientsIdleMillis, endedMillis: settings.endedMillis)
            {
                nextInternalRequest += 1
                expiryRequest = nextInternalRequest
                replica.write(
                    nextInternalRequest, namespace: "", command: .expireIdle(clientsIdleMillis: settings.clientsIdleMillis, endedMillis: settings.endedMillis))
            }
        }
        let expiries = leaseKeeper.check(now: monotonicNanoseconds(), isLeader: replica.raft.role == .leader, machine: replica.machine)
        for e in expiries {
            nextInternalRequest += 1
            replica.write(nextInternalRequest, namespace: e.namespace, command: .expireHolder(holder: e.holder, lastRenewal: e.lastRenewal))
            output(.note(.leaseExpiryProposed(holder: e.holder, namespace: e.namespace)))
        }
        handle(replica.takeEvents())
    }

    // MARK: - The Ready contract

    /// Persist (fsync), send, apply, answer; repeated until quiet or `roundsPerPass` rounds.
    public func process() {
        guard !stopped else { return }
        if replica.raft.role != .leader { pacer.reset() }
        var rounds = 0
        var persistedBytes = 0
        while rounds < settings.roundsPerPass {
            // Decided afresh before every `ready()`: an fsync longer than the interval ends the
            // hold within this pass.
            holdProposalsIfPaced()
            guard let rd = replica.ready() else { return }
            rounds += 1
            if !rd.entries.isEmpty, replica.raft.role == .leader {
                pacer.roundStarted(now: monotonicNanoseconds(), entries: rd.entries.count)
            }
            // A leader's appends go out while it writes the same entries (Raft §10.2.1), and a
            // follower's forwarded proposals and read-index requests while it persists.
            let early = settings.sabotage == .sendBeforePersist ? rd.messages.count : rd.sendBeforePersist
            if early > 0 { output(.send(Array(rd.messages.prefix(early)))) }
            let started = monotonicNanoseconds()
            var installed: StateMachine?
            do {
                installed = try storage.persist(rd)
                if settings.sabotage == .forgetRulesOnLoad { installed?.forgetRules() }
                if settings.sabotage == .forgetClientWritesOnLoad { installed?.forgetClientWrites() }
                if settings.sabotage == .ignoreClientWrites { installed?.ignoresClientWrites = true }
            } catch let damaged as DamagedIncomingSnapshot {
                // Nothing of this Ready reached the disk or the network: reload as a restart
                // would, and let the leader send the snapshot again.
                output(.note(.reloadedAfterDamagedSnapshot("\(damaged)")))
                reloadFromDisk()
                return output(.processAgain)
            } catch {
                return fail("\(error)")
            }
            output(.note(.persisted(nanoseconds: monotonicNanoseconds() &- started)))
            for entry in rd.entries { persistedBytes += entry.data.count }
            if rd.messages.count > early { output(.send(Array(rd.messages.dropFirst(early)))) }
            for request in rd.snapshotReads { serveSnapshotChunk(request) }
            if let meta = rd.snapshot, installed != nil { output(.note(.snapshotInstalled(meta))) }
            replica.advance(rd, installed: installed)
            handle(replica.takeEvents())
            if persistedBytes >= settings.bytesPerPass { break }
        }
        output(.processAgain)
    }

    /// Round pacing (docs/server.md): while the pacer says wait, new proposals stay queued in
    /// the replica (everything else in a `Ready` goes on), and the driver is asked to call
    /// `process()` when the interval ends.
    private func holdProposalsIfPaced() {
        let wait = pacer.wait(now: monotonicNanoseconds(), isLeader: replica.raft.role == .leader)
        replica.holdProposals = wait != nil
        if let wait, !wakePending {
            wakePending = true
            output(.wake(afterNanoseconds: wait))
        }
    }

    /// The driver's wake-up for pacing fired (call `process()` next).
    public func woke() { wakePending = false }

    /// The read-ahead of entry `index` of `term` that `NodeAction.prepare` asked for: once it
    /// is committed, it and the entries waiting behind it apply. Call `process()` afterwards.
    public func prepared(index: UInt64, term: UInt64, _ command: PreparedCommand?) {
        guard !stopped else { return }
        replica.prepared(index: index, term: term, command)
        handle(replica.takeEvents())
    }

    // MARK: - Staged payloads (docs/staged-payloads.md)

    /// `NodeAction.storeStaged` is done: the payload is durable here. Call `process()` afterwards.
    public func stagedStored(_ id: StageID, checksum: UInt32) {
        guard !stopped else { return }
        replica.stagedStored(id, checksum: checksum)
        handle(replica.takeEvents())
    }

    /// `NodeAction.storeStaged` failed (the driver logs why); nothing is acknowledged.
    public func stagedStoreFailed(_ id: StageID) {
        guard !stopped else { return }
        replica.stagedStoreFailed(id)
        handle(replica.takeEvents())
    }

    /// `NodeAction.prepareStaged` is done. Call `process()` afterwards.
    public func preparedStaged(_ id: StageID, _ result: StagedPreparation) {
        guard !stopped else { return }
        replica.preparedStaged(id, result)
        handle(replica.takeEvents())
    }

    /// `NodeAction.serveStaged` is done (nil: not held here). Call `process()` afterwards.
    public func stagedRead(_ id: StageID, _ payload: [UInt8]?, for peer: NodeID) {
        guard !stopped else { return }
        replica.stagedRead(id, payload, for: peer)
        handle(replica.takeEvents())
    }

    /// The driver serves compacted log entries from `index` on (nil: none): the staged files
    /// their references name are kept (`Replica.stagedRetentionFloor`).
    public func setStagedRetentionFloor(_ index: UInt64?) {
        replica.stagedRetentionFloor = index
    }

    /// Replaces each staged reference among `entries` with the payload it names, read from
    /// `store` and checked against the reference (archives and reads of the past carry whole
    /// entries: docs/staged-payloads.md, I4); the id of the first payload not there, if any.
    public static func inlineStaged(_ entries: [ArchivedEntry], store: StagedStore) -> Result<[ArchivedEntry], StagedPayloadUnavailable> {
        var out = entries
        for (i, e) in entries.enumerated() where e.kind == .command && StagedReference.isReference(e.payload) {
            guard let reference = StagedReference(decoding: e.payload) else { continue }
            guard case .payload(let payload, let checksum) = store.load(reference.id), checksum == reference.checksum,
                UInt64(payload.count) == reference.length
            else { return .failure(StagedPayloadUnavailable(id: reference.id, index: e.index)) }
            out[i] = ArchivedEntry(index: e.index, term: e.term, kind: .command, payload: payload)
        }
        return .success(out)
    }

    /// What a driver runs for `NodeAction.prepareStaged`, on any thread: reads `bytes` ahead, or
    /// the staged file (`missing` when it is absent or fails its checks; `damaged` says why).
    public static func prepareStaged(_ id: StageID, _ bytes: [UInt8]?, store: StagedStore) -> (StagedPreparation, damaged: String?) {
        if let bytes { return (.prepared(PreparedCommand(payload: bytes), checksum: StagedStore.checksum(bytes)), nil) }
        switch store.load(id) {
        case .payload(let payload, let checksum): return (.prepared(PreparedCommand(payload: payload), checksum: checksum), nil)
        case .missing: return (.missing, nil)
        case .damaged(let why): return (.missing, why)
        }
    }

    private func serveSnapshotChunk(_ request: SnapshotChunkRequest) {
        do {
            let chunk = try storage.snapshotChunk(request)
            replica.snapshotChunk(to: request.to, meta: request.meta, offset: request.offset, data: chunk.data, last: chunk.last)
        } catch {
            // A newer snapshot may have replaced it (the follower asks again), or the offset
            // was beyond the file.
            output(.note(.snapshotChunkUnavailable(follower: request.to, index: request.meta.index, error: "\(error)")))
        }
    }

    // MARK: - Snapshots written by the driver

    /// The snapshot announced by `.writeSnapshot` is durable: older snapshots and the log it
    /// covers go, and the commit index is saved (never beyond what is durable in the log).
    public func snapshotWritten(_ meta: SnapshotMeta) {
        guard !stopped else { return }
        // Not past a snapshot the leader streams to a live follower: its image stays readable and
        // the log after it stays, so the stream is not restarted (`Replica.compactionPoint`).
        let through = replica.compactionPoint(for: meta.index)
        do {
            // The held one stays readable; any written between it and this one is of no use.
            try storage.snapshots.removeSnapshots(olderThan: meta.index, keeping: through < meta.index ? through : nil)
            try storage.compact(through: through)
            try storage.saveCommit(hardStateToSave)
        } catch {
            // A storage error (a failed fsync, a removal or a save that did not happen): memory
            // may no longer match the disk, so the node stops and restarts from what the disk
            // holds, as after any other storage error (item 7 of issue 14).
            fail("storage error after writing the snapshot at \(meta.index): \(error)")
            return
        }
        let size = (try? storage.snapshots.fileSize(lastIndex: meta.index)).map { UInt64($0) } ?? 0
        replica.snapshotWritten(meta, imageBytes: size, compactedThrough: through)
        output(.note(.snapshotWritten(meta)))
    }

    public func snapshotFailed(_ meta: SnapshotMeta) {
        guard !stopped else { return }
        replica.snapshotFailed()
    }

    // MARK: - Stopping and reloading

    /// Saves the commit index (only as far as the log is durable) and ends every waiter.
    public func shutdown() {
        guard !stopped else { return }
        stopped = true
        try? storage.saveCommit(hardStateToSave)
        endAllWaiters()
    }

    /// The hard state saved outside the Ready contract: its commit covers only entries durable
    /// in the core's log (item 2 of issue 14).
    private var hardStateToSave: HardState {
        settings.sabotage == .inMemoryCommit ? replica.raft.hardState : replica.raft.durableHardState
    }

    private func fail(_ reason: String) {
        stopped = true
        output(.fatal(reason))
    }

    /// Rebuilds the replica from what is on disk, as a restart would (after a damaged incoming
    /// snapshot). Waiting writes end as unknown and reads as timed out; live views get `restored`.
    private func reloadFromDisk() {
        do {
            var loaded = try storage.load { _ in }
            if settings.sabotage == .forgetRulesOnLoad { loaded.machine.forgetRules() }
            if settings.sabotage == .forgetClientWritesOnLoad { loaded.machine.forgetClientWrites() }
            if settings.sabotage == .ignoreClientWrites { loaded.machine.ignoresClientWrites = true }
            let treesFor = replica.treesFor
            let retentionFloor = replica.stagedRetentionFloor
            replica = try Replica(
                configuration: replica.configuration, persisted: loaded.persisted, machine: loaded.machine, session: newSession(),
                now: replica.wallClock)
            replica.treesFor = treesFor
            replica.stagedRetentionFloor = retentionFloor
            replica.noteStagedFiles(try storage.staged.list())
            for (peer, incarnation) in peerIncarnations.sorted(by: { $0.key < $1.key }) { replica.noteIncarnation(of: peer, incarnation) }
            pacer.reset()
        } catch {
            return fail("reloading after a damaged snapshot: \(error)")
        }
        endAllWaiters()
        for (watch, namespace) in watches.sorted(by: { $0.key < $1.key }) {
            output(.watch(watch, .restored(replica.machine.tree(namespace))))
        }
    }

    private func endAllWaiters() {
        let ending = waiters.sorted(by: { $0.key < $1.key })
        waiters = [:]
        for (id, waiter) in ending {
            // A write (or membership change) may still apply: its outcome is unknown.
            if case .read = waiter { end(id, waiter, .timedOut(write: false)) } else { end(id, waiter, .timedOut(write: true)) }
        }
    }

    /// Only namespaces with live views (and `$cluster`, for peer addresses) get a tree with each
    /// applied event: for the others the tree is changed in place, without copying the written
    /// path. A namespace's first view adds it, its last removes it: O(views of the namespace).
    private func openWatch(_ watch: UInt64, _ namespace: String) {
        if watches[watch] != nil { closeWatch(watch) }
        watches[watch] = namespace
        var ids = watchesByNamespace[namespace] ?? []
        var at = ids.count
        while at > 0, ids[at - 1] > watch { at -= 1 }
        ids.insert(watch, at: at)
        watchesByNamespace[namespace] = ids
        if ids.count == 1 { replica.treesFor?.insert(namespace) }
    }

    private func closeWatch(_ watch: UInt64) {
        guard let namespace = watches.removeValue(forKey: watch), var ids = watchesByNamespace[namespace] else { return }
        ids.removeAll { $0 == watch }
        if ids.isEmpty {
            watchesByNamespace[namespace] = nil
            if namespace != Self.clusterNamespace { replica.treesFor?.remove(namespace) }
        } else {
            watchesByNamespace[namespace] = ids
        }
    }

    // MARK: - Replica events → actions

    private func handle(_ events: [ReplicaEvent]) {
        var applied = 0
        for event in events {
            switch event {
            case .applied(var result, let tree, let request):
                applied += 1
                if !result.released.trees.isEmpty {
                    // Freed by the driver, off this thread; nothing below keeps them.
                    output(.release(result.released.trees))
                    result.released = .init(handedOff: true)
                }
                if let request, request == expiryRequest { expiryRequest = nil }
                if let request, let waiter = waiters.removeValue(forKey: request) { finished(request, waiter, result) }
                if result.namespace == Self.clusterNamespace, result.outcome == .ok { learnPeers(from: tree, announce: true) }
                if !result.ended.isEmpty { output(.note(.connectionsEnded(result.ended))) }
                if result.rulesChanged { output(.note(.rulesChanged)) }
                if result.signingKeysChanged { output(.note(.signingKeysChanged)) }
                if let ids = watchesByNamespace[result.namespace] {
                    for watch in ids { output(.watch(watch, .applied(result, tree: tree))) }
                }
            case .readsReady(let ids):
                for id in ids {
                    guard case .read(let namespace, let watch)? = waiters[id] else { continue }
                    waiters[id] = nil
                    let tree = replica.machine.tree(namespace)
                    if let watch, watches[watch] != nil { output(.watch(watch, .start(tree))) }
                    output(.read(id, .success(tree)))
                }
            case let .failed(id, error):
                if id == expiryRequest { expiryRequest = nil }
                guard let waiter = waiters.removeValue(forKey: id) else { continue }
                end(id, waiter, error)
            case let .membershipChanged(id, membership):
                output(.note(.membershipChanged(membership)))
                if waiters.removeValue(forKey: id) != nil { output(.membership(id, .success(membership))) }
            case .restoredFromSnapshot(let meta):
                noteSnapshotImage(at: meta.index)
                learnPeers(from: replica.machine.tree(Self.clusterNamespace), announce: true)
                output(.note(.rulesChanged))
                output(.note(.signingKeysChanged))
                for (watch, namespace) in watches.sorted(by: { $0.key < $1.key }) {
                    output(.watch(watch, .restored(replica.machine.tree(namespace))))
                }
                output(.note(.restoredFromSnapshot(meta)))
            case .snapshotDue(let meta):
                output(.writeSnapshot(replica.machine, meta))
            case let .roleChanged(role, leader, term):
                output(.note(.roleChanged(role: role, leader: leader, term: term)))
            case let .prepare(index, term, payload):
                output(.prepare(index: index, term: term, payload: payload))
            case let .storeStaged(id, bytes):
                output(.storeStaged(id, bytes))
            case let .prepareStaged(id, bytes):
                output(.prepareStaged(id, bytes))
            case let .serveStaged(id, peer):
                output(.serveStaged(id, to: peer))
            case .removeStaged(let ids):
                output(.removeStaged(ids))
            }
        }
        if applied > 0 { output(.note(.appliedCommands(applied))) }
    }

    /// Ends a request with `error` in the shape its kind answers with.
    private func end(_ id: RequestID, _ waiter: Waiter, _ error: ReplicaError) {
        switch waiter {
        case .write: output(.wrote(id, .failure(error)))
        case .read(_, let watch):
            if let watch { closeWatch(watch) }
            output(.read(id, .failure(error)))
        case .membership, .addMember: output(.membership(id, .failure(error)))
        }
    }

    /// A request's own write applied.
    private func finished(_ id: RequestID, _ waiter: Waiter, _ result: StateMachine.Applied) {
        switch waiter {
        case .write: output(.wrote(id, .success(result)))
        case .addMember(let node, let address):
            guard result.outcome == .ok else {
                return output(
                    .membership(id, .failure(.refused(.invalidMembershipChange("the address \(address) could not be recorded: \(result.outcome)")))))
            }
            if peerAddresses[node] != address {
                peerAddresses[node] = address
                output(.peerAddresses(peerAddresses))
            }
            start(id, .membership) { $0.changeMembership(id, .addLearner(node)) }
        case .read, .membership:
            // Reads and membership changes do not apply commands; nothing else shares the id.
            break
        }
    }

    private func learnPeers(from tree: Tree, announce: Bool) {
        guard let peersPath = try? Path(parsing: "/peers") else { return }
        var changed = false
        for (key, entry) in tree.child(at: peersPath).children.elements() {
            guard let id = UInt64(key.string), case .string(let text)? = entry.leaf else { continue }
            if peerAddresses[id] != text {
                peerAddresses[id] = text
                changed = true
            }
        }
        if changed && announce { output(.peerAddresses(peerAddresses)) }
    }
}

/// A staged payload a log entry names is no longer held here (removed after its entry was
/// compacted and no longer retained).
public struct StagedPayloadUnavailable: Error, Sendable, CustomStringConvertible {
    public var id: StageID
    public var index: UInt64
    public var description: String { "the payload of entry \(index) (staged as \(id)) is no longer held on this node" }
}
