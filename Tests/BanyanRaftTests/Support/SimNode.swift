import BanyanRaft
import BanyanStateMachine

/// What a simulated node has made durable: hard state, the installed snapshot and the log
/// after it. Everything else is lost when the node crashes.
struct SimDisk: Sendable, Equatable {
    /// A blank disk: the node may not vote until it is added as a learner (R22).
    var hardState = PersistedState.blank.hardState
    var snapshot: SnapshotMeta = .none
    var snapshotBytes: [UInt8] = []
    /// Entries after `snapshot.index`, contiguous.
    var entries: [LogEntry] = []

    init() {}

    var lastIndex: UInt64 { snapshot.index + UInt64(entries.count) }

    func term(at index: UInt64) -> UInt64? {
        if index == snapshot.index { return snapshot.term }
        guard index > snapshot.index, index <= lastIndex else { return nil }
        return entries[Int(index - snapshot.index - 1)].term
    }

    /// Writing an entry at index i replaces everything at i and after.
    mutating func write(_ entry: LogEntry) {
        guard entry.index > snapshot.index else { return }
        let position = Int(entry.index - snapshot.index - 1)
        if position < entries.count { entries.removeSubrange(position...) }
        if position == entries.count { entries.append(entry) }
    }

    mutating func install(_ meta: SnapshotMeta, bytes: [UInt8]) {
        if let t = term(at: meta.index), t == meta.term, meta.index <= lastIndex {
            entries.removeFirst(Int(meta.index - snapshot.index))
        } else {
            entries = []
        }
        snapshot = meta
        snapshotBytes = bytes
    }

    var persisted: PersistedState {
        PersistedState(hardState: hardState, snapshot: snapshot, entries: entries)
    }
}

/// The simulator's driver for one node: it runs the core's `Ready` loop in the documented order
/// (persist, then send, then apply), keeps the state machine, takes snapshots, and checks that
/// nothing is sent before the state it depends on is durable.
struct SimNode: Sendable {
    let id: NodeID
    private(set) var raft: RaftNode
    private(set) var disk: SimDisk
    private(set) var machine: StateMachine
    private(set) var incarnation: Int = 0
    var configuration: RaftConfiguration
    /// Take a snapshot and compact once this many entries were applied since the last one
    /// (0: never).
    var snapshotEvery: UInt64
    /// Record the state machine's digest after applying every index divisible by this (0: never).
    var digestEvery: UInt64 = 0

    private var incoming: [UInt8] = []
    private var incomingMeta: SnapshotMeta?
    private var pendingReads: [ReadState] = []

    /// Everything one `process` call produced.
    struct Output: Sendable {
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

    init(configuration: RaftConfiguration, disk: SimDisk, snapshotEvery: UInt64 = 0) throws(RaftError) {
        id = configuration.id
        self.configuration = configuration
        self.disk = disk
        self.snapshotEvery = snapshotEvery
        raft = try RaftNode(configuration: configuration, restoring: disk.persisted)
        machine = Self.machine(from: disk)
    }

    /// The state machine a disk's snapshot holds (an empty one without a snapshot). A snapshot
    /// that does not load gives an empty machine, which the tests' convergence checks catch.
    static func machine(from disk: SimDisk) -> StateMachine {
        disk.snapshotBytes.isEmpty ? StateMachine() : ((try? StateMachine(image: disk.snapshotBytes)) ?? StateMachine())
    }

    /// A founding member of a new cluster (the bootstrap state is written to disk first).
    static func founding(configuration: RaftConfiguration, members: [NodeID], snapshotEvery: UInt64 = 0) throws(RaftError) -> SimNode {
        var disk = SimDisk()
        let state = RaftNode.bootstrapState(members: members)
        disk.hardState = state.hardState
        disk.entries = state.entries
        return try SimNode(configuration: configuration, disk: disk, snapshotEvery: snapshotEvery)
    }

    /// Restarts from the disk after a crash: memory, the incoming snapshot and pending reads are
    /// gone. `seed` re-seeds the election timer.
    mutating func restart(seed: UInt64) throws(RaftError) {
        incarnation += 1
        configuration.seed = seed
        raft = try RaftNode(configuration: configuration, restoring: disk.persisted)
        machine = Self.machine(from: disk)
        incoming = []
        incomingMeta = nil
        pendingReads = []
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

    /// Runs ready/advance until the core is quiet. With `persistBudget`, the node crashes after
    /// that many durable writes of a batch (a snapshot, an entry and the hard state each count):
    /// nothing of that batch is sent or applied, and the caller must `restart` it.
    mutating func process(persistBudget: Int? = nil) -> Output {
        var out = Output()
        var budget = persistBudget
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
            // 1. Incoming snapshot chunks, then install.
            for chunk in rd.snapshotChunks {
                if chunk.offset == 0 {
                    incoming = []
                    incomingMeta = chunk.meta
                }
                if UInt64(incoming.count) == chunk.offset && incomingMeta == chunk.meta {
                    incoming.append(contentsOf: chunk.data)
                } else {
                    out.violations.append("node \(id): snapshot chunk at \(chunk.offset) does not continue the incoming snapshot")
                }
            }
            if let meta = rd.snapshot {
                if incomingMeta != meta {
                    out.violations.append("node \(id): asked to install snapshot \(meta.index) but the chunks received are for another one")
                }
                if !spend(&budget) { out.crashed = true; return out }
                disk.install(meta, bytes: incoming)
                out.installedSnapshots += 1
            }
            // 2. Entries, then hard state.
            for e in rd.entries {
                if !spend(&budget) { out.crashed = true; return out }
                disk.write(e)
            }
            if let hs = rd.hardState {
                if !spend(&budget) { out.crashed = true; return out }
                disk.hardState = hs
            }
            // 3. Send, checking that every message is backed by durable state (R3, R26).
            for m in rd.messages.dropFirst(rd.sendBeforePersist) {
                if let problem = persistenceProblem(m) { out.violations.append(problem) }
                out.messages.append(m)
            }
            // 4. Apply.
            if let meta = rd.snapshot {
                do {
                    machine = try StateMachine(image: disk.snapshotBytes)
                } catch {
                    out.violations.append("node \(id): installed snapshot \(meta.index) does not load: \(error)")
                }
            }
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
            for request in rd.snapshotReads {
                let bytes = disk.snapshotBytes
                let start = Int(min(request.offset, UInt64(bytes.count)))
                let end = min(bytes.count, start + request.maxBytes)
                raft.snapshotChunk(
                    to: request.to, meta: disk.snapshot, offset: request.offset, data: Array(bytes[start..<end]),
                    last: end == bytes.count
                )
            }
            raft.advance(rd)
            maybeSnapshot()
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

    private func spend(_ budget: inout Int?) -> Bool {
        guard let b = budget else { return true }
        if b <= 0 { return false }
        budget = b - 1
        return true
    }

    private mutating func maybeSnapshot() {
        guard snapshotEvery > 0, raft.appliedIndex >= disk.snapshot.index + snapshotEvery,
            machine.appliedIndex == raft.appliedIndex
        else { return }
        guard let meta = try? raft.snapshotMeta(at: raft.appliedIndex) else { return }
        // Durable snapshot first, then drop the covered entries (R14).
        disk.install(meta, bytes: machine.image())
        _ = try? raft.compact(through: meta.index)
    }

    /// Why `m` must not be sent yet, if it depends on state that is not durable.
    /// A message sent before its batch is persisted must be a leader's replication, or a
    /// follower's forwarded proposal or read-index request, in a term that is already durable.
    private func earlySendProblem(_ m: Message) -> String? {
        switch m.body {
        case .append, .heartbeat, .snapshotChunk:
            if raft.role != .leader { return "node \(id), not the leader, sent \(m.body) before persisting its batch" }
            if disk.hardState.term != m.term {
                return "node \(id) sent a term-\(m.term) replication message before persisting, with term \(disk.hardState.term) durable"
            }
            return nil
        case .proposal, .readIndex:
            if disk.hardState.term != m.term {
                return "node \(id) sent a term-\(m.term) \(m.body) before persisting, with term \(disk.hardState.term) durable"
            }
            return nil
        default:
            return "node \(id) sent \(m.body) to \(m.to) before persisting its batch"
        }
    }

    private func persistenceProblem(_ m: Message) -> String? {
        switch m.body {
        case .voteResponse(granted: true):
            if disk.hardState.term != m.term || disk.hardState.vote != m.to {
                return "node \(id) granted a vote to \(m.to) in term \(m.term) before persisting it (disk: term \(disk.hardState.term) vote \(disk.hardState.vote))"
            }
        case .appendAccepted(let index, _) where index > 0:
            if disk.lastIndex < index || disk.hardState.term < m.term {
                return "node \(id) acknowledged index \(index) in term \(m.term) with only \(disk.lastIndex) durable (term \(disk.hardState.term))"
            }
        case .vote, .append, .heartbeat:
            if disk.hardState.term < m.term {
                return "node \(id) sent a term-\(m.term) message before persisting the term (disk: \(disk.hardState.term))"
            }
        default:
            break
        }
        return nil
    }
}
