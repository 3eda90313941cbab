import BanyanNode
import BanyanOpLog
import BanyanOpLogFiles
import BanyanRaft
import BanyanStateMachine
import Logging
import Testing

/// What a node's storage holds, read back from its file system (or, for `TestCluster.replace`,
/// a hand-built state to write there): the saved hard state, the newest snapshot and its file,
/// and the log after it.
struct StoredState: Sendable, Equatable {
    /// A blank disk: the node may not vote until it is added as a learner (R22).
    var hardState = PersistedState.blank.hardState
    var snapshot: SnapshotMeta = .none
    /// The snapshot's file as a follower receives it (empty without a snapshot).
    var snapshotBytes: [UInt8] = []
    /// Entries after `snapshot.index`, contiguous.
    var entries: [LogEntry] = []

    init() {}

    var lastIndex: UInt64 { snapshot.index + UInt64(entries.count) }
}

/// The Raft unit tests' driver for one node: it runs the core's `Ready` loop in the documented
/// order (persist, then send, then apply) with the node's own storage (`NodeStorage` over a
/// `SimulatedFileSystem`: the segmented log, the hard-state file and the snapshot store), applies
/// committed entries to the node's own `StateMachine`, takes snapshots with `SnapshotWriter`,
/// and checks that nothing is sent before the state it depends on is durable on that disk.
struct SimNode {
    let id: NodeID
    private(set) var raft: RaftNode
    private(set) var machine: StateMachine
    private(set) var incarnation: Int = 0
    var configuration: RaftConfiguration
    /// Take a snapshot and compact once this many entries were applied since the last one
    /// (0: never).
    var snapshotEvery: UInt64
    /// Record the state machine's digest after applying every index divisible by this (0: never).
    var digestEvery: UInt64 = 0

    /// The node's disk (shared by copies of this value: a copy is not a snapshot of the disk;
    /// read `disk` for one).
    private(set) var fileSystem: SimulatedFileSystem
    private var storage: NodeStorage
    private var pendingReads: [ReadState] = []
    /// The incoming snapshot the core's chunks have built so far (to check their order).
    private var incomingMeta: SnapshotMeta?
    private var incomingNext: UInt64 = 0
    static let directory = "/data"

    /// Everything one `process` call produced.
    struct Output {
        var messages: [Message] = []
        /// Entries applied to the state machine (commands, no-ops and configurations).
        var applied: [LogEntry] = []
        /// Commands applied with their outcome (`.duplicate` for a retried copy).
        var outcomes: [(envelope: CommandEnvelope, outcome: StateMachine.Applied?, index: UInt64)] = []
        /// ReadIndex reads whose index the state machine has reached: serve them now.
        var readsReady: [ReadState] = []
        /// State-machine digests at indexes divisible by `digestEvery`.
        var digests: [(index: UInt64, digest: [UInt8])] = []
        /// Snapshots this node installed from its leader.
        var installedSnapshots = 0
        /// Breaches of the persist-before-send rule or of the core's invariants.
        var violations: [String] = []
        var roleChanged: Bool = false
        /// The node crashed part-way through persisting (see `process(persistBudget:)`).
        var crashed = false
    }

    enum SetupError: Error { case snapshotNotSupported }

    /// A node over `fileSystem` as it is (blank, or holding a node's data): its storage
    /// recovers and loads what is there, as `banyan serve` does at start.
    init(configuration: RaftConfiguration, fileSystem: SimulatedFileSystem, snapshotEvery: UInt64 = 0) throws {
        id = configuration.id
        self.configuration = configuration
        self.snapshotEvery = snapshotEvery
        self.fileSystem = fileSystem
        storage = try Self.openStorage(fileSystem)
        let loaded = try storage.load { _ in }
        raft = try RaftNode(configuration: configuration, restoring: loaded.persisted)
        machine = loaded.machine
    }

    /// A node whose disk holds `stored` (written through its storage first; a blank
    /// `StoredState` gives a blank disk).
    init(configuration: RaftConfiguration, stored: StoredState, snapshotEvery: UInt64 = 0) throws {
        // Hand-built states are logs (`Scenario.disk`); a snapshot would need its image.
        guard stored.snapshot.index == 0, stored.snapshotBytes.isEmpty else { throw SetupError.snapshotNotSupported }
        let fileSystem = SimulatedFileSystem()
        if stored != StoredState() {
            let storage = try Self.openStorage(fileSystem)
            var rd = Ready()
            rd.entries = stored.entries
            rd.hardState = stored.hardState
            _ = try storage.persist(rd)
        }
        try self.init(configuration: configuration, fileSystem: fileSystem, snapshotEvery: snapshotEvery)
    }

    private static func openStorage(_ fileSystem: SimulatedFileSystem) throws -> NodeStorage {
        var logger = Logger(label: "banyan.raft-tests")
        logger.logLevel = .critical
        return try NodeStorage(directory: directory, fileSystem: fileSystem, logger: logger) { _ in }
    }

    /// A founding member of a new cluster (the bootstrap state is written to disk first).
    static func founding(configuration: RaftConfiguration, members: [NodeID], snapshotEvery: UInt64 = 0) throws -> SimNode {
        let fileSystem = SimulatedFileSystem()
        try openStorage(fileSystem).bootstrap(members: members)
        return try SimNode(configuration: configuration, fileSystem: fileSystem, snapshotEvery: snapshotEvery)
    }

    /// What the disk holds now, read back as a restart after a power loss now would find it:
    /// a copy of the file system loses what is not durable, then a storage of its own reads the
    /// hard-state file (also through a `HardStateStore`), the newest snapshot (and its file) and
    /// the log after it. The node's own storage and file system are not touched, so reading
    /// never changes what the test goes on to run. A read that fails fails the running test.
    var disk: StoredState {
        var d = StoredState()
        let image = fileSystem.copy()
        image.reboot()
        do {
            let record = try HardStateStore(directory: Self.directory + "/raft", fileSystem: image).load()
            d.hardState = HardState(term: record.term, vote: record.vote, commit: record.commit, mayVote: record.mayVote)
        } catch {
            Issue.record("node \(id): the hard-state file does not read back: \(error)")
        }
        let reader: NodeStorage
        let loaded: NodeStorage.Loaded
        do {
            reader = try Self.openStorage(image)
            loaded = try reader.load(progress: { _ in })
        } catch {
            Issue.record("node \(id): the storage does not load: \(error)")
            return d
        }
        d.snapshot = loaded.persisted.snapshot
        d.entries = loaded.persisted.entries
        if d.snapshot.index > 0, let size = try? reader.snapshots.fileSize(lastIndex: d.snapshot.index),
            let bytes = try? reader.snapshots.rawChunk(lastIndex: d.snapshot.index, offset: 0, maxBytes: size)
        {
            d.snapshotBytes = bytes
        }
        return d
    }

    /// The last index durable on this node's disk (log or snapshot).
    private var durableLastIndex: UInt64 {
        max(storage.logLastIndex, ((try? storage.snapshots.latest()) ?? nil)?.lastIndex ?? 0)
    }

    /// Restarts after a power loss: what was not synced is gone, and memory, the incoming
    /// snapshot and pending reads with it. `seed` re-seeds the election timer.
    mutating func restart(seed: UInt64) throws {
        incarnation += 1
        configuration.seed = seed
        fileSystem.reboot()
        storage = try Self.openStorage(fileSystem)
        let loaded = try storage.load { _ in }
        raft = try RaftNode(configuration: configuration, restoring: loaded.persisted)
        machine = loaded.machine
        pendingReads = []
        incomingMeta = nil
        incomingNext = 0
    }

    // MARK: - Inputs

    mutating func tick() {
        raft.tick()
    }
    mutating func step(_ m: Message) { raft.step(m) }
    mutating func campaign() { raft.campaign() }
    /// A peer's hello told this node's driver the peer's incarnation.
    mutating func noteIncarnation(of peer: NodeID, _ incarnation: UInt64) { raft.noteIncarnation(of: peer, incarnation) }

    @discardableResult
    mutating func propose(_ commands: [[UInt8]]) throws(RaftError) -> RaftNode.ProposalOutcome {
        try raft.propose(commands)
    }

    @discardableResult
    mutating func proposeMembershipChange(_ change: MembershipChange) throws(RaftError) -> RaftNode.ProposalOutcome {
        try raft.proposeMembershipChange(change)
    }

    mutating func transferLeadership(to target: NodeID) throws(RaftError) {
        try raft.transferLeadership(to: target)
    }

    @discardableResult
    mutating func readIndex(context: UInt64) -> Bool { raft.readIndex(context: context) }

    // MARK: - The Ready loop

    /// Runs ready/advance until the core is quiet. With `persistBudget`, the node's disk fails
    /// (a crash) at that many file-system operations into a batch's persist: nothing of that
    /// batch is sent or applied, and the caller must `restart` it.
    mutating func process(persistBudget: Int? = nil) -> Output {
        var out = Output()
        var rounds = 0
        while raft.hasReady && rounds < 10_000 {
            rounds += 1
            let rd = raft.ready()
            if rd.role != nil { out.roleChanged = true }
            if rd.isEmpty {
                out.violations.append(
                    "node \(id): the core reported work but its Ready is empty (applied \(raft.appliedIndex) commit \(raft.commitIndex) last \(raft.lastIndex) snapshot \(raft.snapshotMeta.index))"
                )
                raft.advance(rd)
                break
            }
            // 0. What may go out while this batch is persisted (a leader's appends, §10.2.1; a
            // follower's forwarding):
            // sent first, so a crash part-way through persisting has already let them out.
            for m in rd.messages.prefix(rd.sendBeforePersist) {
                if let problem = earlySendProblem(m) { out.violations.append(problem) }
                out.messages.append(m)
            }
            // The core hands chunks over in order, each continuing the snapshot it started.
            for chunk in rd.snapshotChunks {
                if chunk.offset == 0 {
                    incomingMeta = chunk.meta
                    incomingNext = 0
                }
                if chunk.offset != incomingNext || chunk.meta != incomingMeta {
                    out.violations.append("node \(id): snapshot chunk at \(chunk.offset) does not continue the incoming snapshot (next \(incomingNext))")
                }
                incomingNext = chunk.offset + UInt64(chunk.data.count)
            }
            if let meta = rd.snapshot, meta != incomingMeta {
                out.violations.append("node \(id): asked to install snapshot \(meta.index) but the chunks received are for another one")
            }
            // 1 and 2. Snapshot chunks and install, entries, hard state: the node's storage.
            if let budget = persistBudget { fileSystem.crashAtOperation = fileSystem.operations + 1 + budget }
            let installed: StateMachine?
            do {
                installed = try storage.persist(rd)
            } catch {
                if fileSystem.isCrashed {
                    out.crashed = true
                } else {
                    out.violations.append("node \(id): persisting failed: \(error)")
                }
                return out
            }
            fileSystem.crashAtOperation = nil
            if rd.snapshot != nil {
                out.installedSnapshots += 1
                if let installed { machine = installed }
            }
            // 3. Send, checking that every message is backed by durable state (R3, R26).
            for m in rd.messages.dropFirst(rd.sendBeforePersist) {
                if let problem = persistenceProblem(m) { out.violations.append(problem) }
                out.messages.append(m)
            }
            // 4. Apply.
            for e in rd.committedEntries {
                out.applied.append(e)
                if e.kind == .command, let env = CommandEnvelope(decoding: e.data) {
                    out.outcomes.append((env, machine.apply(e.data, index: e.index), e.index))
                } else {
                    machine.skip(index: e.index)
                }
                if digestEvery > 0 && e.index % digestEvery == 0 { out.digests.append((e.index, machine.digest)) }
            }
            pendingReads.append(contentsOf: rd.readStates)
            for request in rd.snapshotReads { serveSnapshotChunk(request, &out) }
            raft.advance(rd)
            maybeSnapshot(&out)
        }
        if !pendingReads.isEmpty {
            var kept: [ReadState] = []
            for r in pendingReads {
                if machine.appliedIndex >= r.index { out.readsReady.append(r) } else { kept.append(r) }
            }
            pendingReads = kept
        }
        for v in raft.invariantViolations { out.violations.append(v) }
        return out
    }

    /// A leader's chunk of its snapshot file for a follower (as `NodeCore` serves it).
    private mutating func serveSnapshotChunk(_ request: SnapshotChunkRequest, _ out: inout Output) {
        do {
            let chunk = try storage.snapshotChunk(request)
            raft.snapshotChunk(to: request.to, meta: request.meta, offset: request.offset, data: chunk.data, last: chunk.last)
        } catch {
            out.violations.append("node \(id): cannot read its snapshot at \(request.meta.index) for node \(request.to): \(error)")
        }
    }

    /// Durable snapshot first, then drop the covered log and save the commit (R14), as the
    /// server's snapshot thread and `NodeCore.snapshotWritten` do.
    private mutating func maybeSnapshot(_ out: inout Output) {
        guard snapshotEvery > 0, raft.appliedIndex >= raft.snapshotMeta.index + snapshotEvery,
            machine.appliedIndex == raft.appliedIndex
        else { return }
        guard let meta = try? raft.snapshotMeta(at: raft.appliedIndex) else { return }
        do {
            try SnapshotWriter(directory: Self.directory, fileSystem: fileSystem).write(machine, meta: meta) { _ in }
            try storage.snapshots.removeSnapshots(olderThan: meta.index)
            try storage.compact(through: meta.index)
            try storage.saveCommit(raft.durableHardState)
        } catch {
            out.violations.append("node \(id): snapshot at \(meta.index) failed: \(error)")
            return
        }
        _ = try? raft.compact(through: meta.index)
    }

    /// Why `m` must not be sent yet, if it depends on state that is not durable.
    /// A message sent before its batch is persisted must be a leader's replication, or a
    /// follower's forwarded proposal or read-index request, in a term that is already durable.
    private func earlySendProblem(_ m: Message) -> String? {
        switch m.body {
        case .append, .heartbeat, .snapshotChunk:
            if raft.role != .leader { return "node \(id), not the leader, sent \(m.body) before persisting its batch" }
            if storage.savedHardState.term != m.term {
                return "node \(id) sent a term-\(m.term) replication message before persisting, with term \(storage.savedHardState.term) durable"
            }
            return nil
        case .proposal, .readIndex:
            if storage.savedHardState.term != m.term {
                return "node \(id) sent a term-\(m.term) \(m.body) before persisting, with term \(storage.savedHardState.term) durable"
            }
            return nil
        default:
            return "node \(id) sent \(m.body) to \(m.to) before persisting its batch"
        }
    }

    private func persistenceProblem(_ m: Message) -> String? {
        switch m.body {
        case .voteResponse(granted: true):
            if storage.savedHardState.term != m.term || storage.savedHardState.vote != m.to {
                return "node \(id) granted a vote to \(m.to) in term \(m.term) before persisting it (disk: term \(storage.savedHardState.term) vote \(storage.savedHardState.vote))"
            }
        case .appendAccepted(let index, _) where index > 0:
            if durableLastIndex < index || storage.savedHardState.term < m.term {
                return "node \(id) acknowledged index \(index) in term \(m.term) with only \(durableLastIndex) durable (term \(storage.savedHardState.term))"
            }
        case .vote, .append, .heartbeat:
            if storage.savedHardState.term < m.term {
                return "node \(id) sent a term-\(m.term) message before persisting the term (disk: \(storage.savedHardState.term))"
            }
        default:
            break
        }
        return nil
    }
}
