import BanyanBasics

/// The Raft consensus core: a pure, single-threaded state machine (docs/raft.md).
///
/// Drive it with `tick()`, `step(_:)`, `propose(_:)`, `readIndex(context:)` and the membership and
/// transfer calls; then take `ready()`, do what it says in the documented order, and `advance(_:)`.
/// It never reads a clock, touches a file or a socket, or uses global randomness: the election
/// timeout comes from a `SeededRandom` seeded by the configuration.
public struct RaftNode: Sendable {
    public let configuration: RaftConfiguration
    public var id: NodeID { configuration.id }

    public private(set) var role: RaftRole = .follower
    public private(set) var term: UInt64 = 0
    public private(set) var vote: NodeID = 0
    /// See `HardState.mayVote` (R22).
    public private(set) var mayVote: Bool = true
    public private(set) var leader: NodeID = 0
    /// The configuration in force: the latest committed configuration entry (etcd's rule: a
    /// configuration takes effect when it commits; see docs/raft.md).
    public private(set) var membership: Membership

    var log: RaftLog
    private var random: SeededRandom
    private var electionElapsed = 0
    private var heartbeatElapsed = 0
    private var randomizedElectionTimeout = 0

    // Candidate state.
    private var votesGranted: Set<NodeID> = []
    private var votesRejected: Set<NodeID> = []

    // Leader state.
    private var progress: [NodeID: Progress] = [:]
    /// Index of the latest configuration entry in the log (committed or not).
    private var pendingConfigIndex: UInt64 = 0
    /// Index of this leader's no-op; reads and membership changes wait until it commits.
    private var termStartIndex: UInt64 = 0
    private var uncommittedBytes = 0
    private var transferTarget: NodeID = 0
    private var transferElapsed = 0
    private var readSeq: UInt64 = 0
    private var pendingReads: [PendingRead] = []
    private var readsBeforeCommit: [(context: UInt64, from: NodeID)] = []
    private var heartbeatForReads = false
    // Lease reads (ReadMode.leaseBased): the leader's own tick count, when each heartbeat
    // sequence number went out, the tick until which the lease holds, and the first sequence
    // number that may extend it (heartbeats sent before a transfer began may not).
    private var leaderTicks = 0
    private var heartbeatSentAt: [(seq: UInt64, tick: Int)] = []
    private var leaseUntil = 0
    private var leaseFloorSeq: UInt64 = 0
    /// Lease mode: ticks since this node last heard from a leader (append, heartbeat or snapshot
    /// chunk). Not reset by term changes, so nothing but time ends the follower's side of a lease:
    /// while it is below `electionTicks` the node grants no vote or pre-vote (except for a leader
    /// transfer) and does not campaign. Zero after a restart: the node may have acknowledged a
    /// heartbeat just before crashing. (A review found the term-based check insufficient: a
    /// delayed pre-vote rejection moved a lease-holding follower to a new term with no leader.)
    private var ticksSinceLeaderContact = 0

    /// Incarnations of peers as their drivers reported them (`noteIncarnation`): what a leader
    /// records when it adds or promotes that node (R22). Kept on every role, so a new leader knows
    /// what its peers told it while it followed.
    private var knownIncarnations: [NodeID: UInt64] = [:]

    /// Committed configuration entries after the snapshot, to know the membership at any index.
    private var configHistory: [(index: UInt64, membership: Membership)] = []
    /// Configuration entries are applied through this index.
    private var configScannedThrough: UInt64 = 0

    /// Invariant breaches the core detected and refused to act on (for example a leader asking
    /// to truncate a committed entry). Always empty unless Raft's guarantees were broken; the
    /// simulator asserts it.
    public private(set) var invariantViolations: [String] = []
    /// Malformed peer messages dropped (for metrics; a correct peer never sends one).
    public private(set) var invalidMessages = 0

    // Follower snapshot reception.
    private var incomingSnapshot: (meta: SnapshotMeta, nextOffset: UInt64)?

    // Output accumulated until `ready()`.
    private var messages: [Message] = []
    private var readStates: [ReadState] = []
    private var snapshotReads: [SnapshotChunkRequest] = []
    private var snapshotChunks: [IncomingSnapshotChunk] = []
    private var installedSnapshot: SnapshotMeta?
    /// What was durable when a received snapshot replaced the log in memory, until the driver
    /// has persisted that snapshot (`durableHardState` reports it meanwhile).
    private var durableBeforeInstall: (commit: UInt64, mayVote: Bool)?
    private var lastReportedHardState: HardState
    private var lastReportedRole: RaftRole = .follower
    private var lastReportedLeader: NodeID = 0
    private var readyOutstanding: (entriesThrough: UInt64, entriesTerm: UInt64, appliedThrough: UInt64, snapshot: UInt64?)?

    private struct PendingRead: Sendable {
        var seq: UInt64
        var context: UInt64
        var index: UInt64
        var from: NodeID
    }

    // MARK: - Creating

    /// Restores a node from what it persisted (or `.blank` for a node that has never been in a
    /// cluster: it waits to be added and never campaigns or votes until it has a membership).
    public init(configuration: RaftConfiguration, restoring persisted: PersistedState) throws(RaftError) {
        try configuration.validate()
        if configuration.sabotage != .uncheckedLogShape { try Self.validate(persisted) }
        self.configuration = configuration
        random = SeededRandom(seed: configuration.seed)
        log = RaftLog(persisted)
        term = persisted.hardState.term
        vote = persisted.hardState.vote
        mayVote = persisted.hardState.mayVote
        // Only a node that may have acknowledged some leader (term past the bootstrap term).
        // A node that never left the bootstrap term cannot have acknowledged any leader.
        ticksSinceLeaderContact = persisted.hardState.term > 1 ? 0 : configuration.electionTicks
        lastReportedHardState = HardState(term: term, vote: vote, commit: log.committed, mayVote: mayVote)
        membership = persisted.snapshot.membership
        configHistory = [(persisted.snapshot.index, persisted.snapshot.membership)]
        configScannedThrough = persisted.snapshot.index
        pendingConfigIndex = lastConfigIndex()
        applyCommittedConfigurations()
        // A restart must not forget an admission the node had before it (whole-node seed 317):
        // the hard state that recorded `mayVote` is saved after the entries that gave it, so a
        // crash between the two leaves the entry on disk and the vote off. Held entries (and an
        // installed snapshot's membership) naming this incarnation give the vote back, as when
        // they were received.
        if !mayVote, configuration.incarnation != 0, persisted.snapshot.membership.contains(id),
            persisted.snapshot.membership.incarnation(of: id) == configuration.incarnation
        {
            mayVote = true
        }
        admitIfNamedWithThisIncarnation(persisted.entries)
        resetRandomizedElectionTimeout()
    }

    /// Checks the shape of a restored state (item 6 of issue 14): the entries continue the
    /// snapshot (a log without a snapshot starts at index 1), are consecutive, their terms never go
    /// down and never precede the snapshot's, and the commit index lies inside the log. (The saved
    /// term may be older than the last entry's: entries are made durable before the hard state.) A driver
    /// that loaded anything else has damage to report, not a state to run.
    static func validate(_ persisted: PersistedState) throws(RaftError) {
        let snapshot = persisted.snapshot
        var expected = snapshot.index &+ 1
        var lastTerm = snapshot.term
        for e in persisted.entries {
            guard e.index == expected else {
                throw .invalidPersistedState(
                    e.index == persisted.entries.first?.index
                        ? "the log starts at \(e.index) but the snapshot ends at \(snapshot.index)"
                        : "entry \(e.index) follows entry \(expected &- 1)")
            }
            guard e.term >= lastTerm else { throw .invalidPersistedState("entry \(e.index) has term \(e.term), below \(lastTerm) before it") }
            lastTerm = e.term
            expected &+= 1
        }
        let last = snapshot.index + UInt64(persisted.entries.count)
        guard persisted.hardState.commit <= last else {
            throw .invalidPersistedState("the commit index \(persisted.hardState.commit) is beyond the last entry \(last)")
        }
    }

    /// The persisted state of the first members of a new cluster: one committed configuration
    /// entry at index 1, term 1. Every founding member starts from the same value.
    public static func bootstrapState(members: [NodeID]) -> PersistedState {
        let config = LogEntry(index: 1, term: 1, kind: .config(Membership(voters: members)))
        return PersistedState(hardState: HardState(term: 1, vote: 0, commit: 1, mayVote: true), snapshot: .none, entries: [config])
    }

    // MARK: - Observing (drivers, simulator checkers)

    public var commitIndex: UInt64 { log.committed }
    public var appliedIndex: UInt64 { log.applied }
    public var lastIndex: UInt64 { log.lastIndex }
    public var lastTerm: UInt64 { log.lastTerm }
    public var snapshotMeta: SnapshotMeta { log.snapshot }
    public var firstIndex: UInt64 { log.firstIndex }
    public func entry(at index: UInt64) -> LogEntry? { log.entry(at: index) }
    public func term(at index: UInt64) -> UInt64? { log.term(at: index) }
    public var hardState: HardState { HardState(term: term, vote: vote, commit: log.committed, mayVote: mayVote) }
    /// The highest index the driver made durable that is still part of this log (an entry
    /// replaced in memory by a leader's conflicting suffix lowers it until the new one is durable),
    /// or the index of a received snapshot restored in memory (see `durableIndex`).
    public var stableIndex: UInt64 { log.stable }
    /// A lower bound of the last index the disk holds: `stableIndex`, except while a received
    /// snapshot is installed in memory but not yet persisted (then `log.stable` already names the
    /// snapshot's index), when it is the durable commit from before the install.
    public var durableIndex: UInt64 { durableBeforeInstall?.commit ?? log.stable }
    /// The hard state to save outside the Ready contract (at shutdown, after a snapshot): its
    /// commit never covers an entry that is not durable in this log (item 2 of issue 14), so a
    /// restart never applies an entry the disk holds only in an older, divergent version.
    /// A received snapshot counts only once the driver has persisted it (until then `log.stable`
    /// already names its index, and `mayVote` may come from its membership).
    public var durableHardState: HardState {
        if let before = durableBeforeInstall {
            return HardState(term: term, vote: vote, commit: before.commit, mayVote: before.mayVote)
        }
        return HardState(term: term, vote: vote, commit: min(log.committed, log.stable), mayVote: mayVote)
    }
    /// This node started from a blank disk but its id is a voter: it will not vote or campaign
    /// (R22). The operator must remove the id and add the node back as a learner.
    public var isVoterWithAmnesia: Bool { !mayVote && membership.isVoter(id) }
    public var leadershipTransferTarget: NodeID { transferTarget }
    /// This node's incarnation (`RaftConfiguration.incarnation`; 0: legacy, see there).
    public var incarnation: UInt64 { configuration.incarnation }
    /// The incarnation of `node` this node would record in a configuration it proposes: what its
    /// driver last reported, else what the configuration in force records, else 0 (unknown).
    public func knownIncarnation(of node: NodeID) -> UInt64 {
        knownIncarnations[node] ?? membership.incarnation(of: node)
    }
    /// Whether the leader has committed an entry of its own term (reads and changes wait for it).
    public var hasCommittedInTerm: Bool { role == .leader && log.committed >= termStartIndex }
    /// A leader streams its snapshot to a follower that answered within the last two election
    /// timeouts. A new snapshot would restart that stream from its first byte (the chunks name
    /// the snapshot they belong to), so the replica postpones compaction while this holds, up
    /// to a bound (`ReplicaConfiguration.snapshotDeferral`).
    public var isStreamingSnapshot: Bool { streamedSnapshotIndex != nil }

    /// The snapshot this leader streams to a follower that answered a chunk within the last two
    /// election timeouts, or whose stream began within them (the lowest, should there be
    /// several): compacting past it would
    /// restart that stream from its first byte with the newer snapshot, and a stream slower
    /// than the snapshots would never finish. The replica compacts no further while it holds
    /// (`Replica.compactionPoint(for:)`). Nil: no such stream, or not the leader.
    public var streamedSnapshotIndex: UInt64? {
        guard role == .leader else { return nil }
        var lowest: UInt64?
        for pr in progress.values {
            guard case .snapshot(let index) = pr.state, pr.snapshotSilentTicks < 2 * configuration.electionTicks else { continue }
            lowest = min(lowest ?? index, index)
        }
        return lowest
    }

    /// The leader's view of a member's replication, for status pages.
    public struct ReplicationStatus: Sendable, Equatable {
        public var node: NodeID
        public var match: UInt64
        public var next: UInt64
        public var state: String
        public var recentlyActive: Bool
    }

    public var replicationStatus: [ReplicationStatus] {
        guard role == .leader else { return [] }
        return progress.keys.sorted().compactMap { id in
            guard let pr = progress[id] else { return nil }
            let state: String
            switch pr.state {
            case .probe: state = "probe"
            case .replicate: state = "replicate"
            case .snapshot(let index): state = "snapshot(\(index))"
            }
            return ReplicationStatus(node: id, match: pr.match, next: pr.next, state: state, recentlyActive: pr.recentActive)
        }
    }

    // MARK: - Ready / advance

    public var hasReady: Bool {
        guard readyOutstanding == nil else { return false }
        return !messages.isEmpty || !readStates.isEmpty || !snapshotReads.isEmpty || !snapshotChunks.isEmpty
            || installedSnapshot != nil || log.stable < log.lastIndex || log.applied < log.committed
            || hardState != lastReportedHardState || role != lastReportedRole || leader != lastReportedLeader
            || heartbeatForReads
    }

    /// Collects what the driver must persist, send and apply. Call `advance(_:)` afterwards.
    public mutating func ready() -> Ready {
        if heartbeatForReads {
            heartbeatForReads = false
            broadcastHeartbeat()
        }
        var rd = Ready()
        let hs = hardState
        let durable = lastReportedHardState
        if hs != lastReportedHardState {
            rd.hardState = hs
            lastReportedHardState = hs
        }
        if role != lastReportedRole || leader != lastReportedLeader {
            rd.role = role
            rd.leader = leader
            lastReportedRole = role
            lastReportedLeader = leader
        }
        rd.snapshot = installedSnapshot
        installedSnapshot = nil
        rd.snapshotChunks = snapshotChunks
        snapshotChunks = []
        if log.stable < log.lastIndex {
            rd.entries = log.slice(from: log.stable + 1, through: log.lastIndex, maxBytes: Int.max) ?? []
        }
        // Committed entries the driver will have durable once it persists this batch.
        if log.applied < log.committed, log.applied >= log.snapshot.index {
            rd.committedEntries = log.slice(from: log.applied + 1, through: log.committed, maxBytes: Int.max) ?? []
        }
        // Responses built under an older term are dropped: a node that moved to a newer term may
        // have overwritten the entries such a response acknowledges (the ABA race, R13).
        rd.messages = messages.filter { $0.term >= term || isTermless($0) }
        messages = []
        if hs.term == durable.term && hs.vote == durable.vote {
            // What depends only on the durable term goes first, so the driver can send it while
            // it persists (a stable partition: order per peer is kept among these and among the
            // rest): a leader's replication, which needs only its in-memory log, and a
            // follower's forwarded proposals and read-index requests, which acknowledge nothing.
            var early: [Message] = []
            var late: [Message] = []
            for m in rd.messages {
                switch m.body {
                case .append, .heartbeat, .snapshotChunk: if role == .leader { early.append(m) } else { late.append(m) }
                case .proposal, .readIndex: early.append(m)
                default: late.append(m)
                }
            }
            if !early.isEmpty {
                rd.sendBeforePersist = early.count
                rd.messages = early + late
            }
        }
        rd.readStates = readStates
        readStates = []
        rd.snapshotReads = snapshotReads
        snapshotReads = []
        readyOutstanding = (
            rd.entries.last?.index ?? log.stable, rd.entries.last?.term ?? 0,
            rd.committedEntries.last?.index ?? max(log.applied, rd.snapshot?.index ?? 0), rd.snapshot?.index
        )
        return rd
    }

    private func isTermless(_ m: Message) -> Bool {
        // Pre-vote responses granting a future term carry that term; everything else is
        // stamped with the sender's term at creation.
        if case .preVoteResponse = m.body { return true }
        return false
    }

    /// Tells the core the driver finished the `Ready` returned by the last `ready()`.
    public mutating func advance(_ rd: Ready) {
        guard let outstanding = readyOutstanding else { return }
        readyOutstanding = nil
        if let snap = outstanding.snapshot {
            log.stable = max(log.stable, min(snap, log.lastIndex))
            // That snapshot is durable now. (Should another have completed in memory since, it
            // is not: only the first one's index counts as durable until it is persisted too.)
            durableBeforeInstall = installedSnapshot == nil ? nil : (snap, durableBeforeInstall?.mayVote ?? mayVote)
        }
        if let last = rd.entries.last, log.term(at: last.index) == last.term {
            log.stable = max(log.stable, last.index)
        }
        log.applied = max(log.applied, outstanding.appliedThrough)
        if role == .leader {
            // The leader's own acknowledgement counts only entries it has made durable (R26).
            if var own = progress[id], log.stable > own.match {
                own.match = log.stable
                own.next = max(own.next, log.stable + 1)
                progress[id] = own
                if maybeCommit() { broadcastAppend() }
            }
        }
    }

    // MARK: - Ticks

    public mutating func tick() {
        if ticksSinceLeaderContact < Int.max { ticksSinceLeaderContact += 1 }
        if role == .leader {
            tickLeader()
        } else {
            electionElapsed += 1
            if canCampaign && electionElapsed >= randomizedElectionTimeout {
                electionElapsed = 0
                campaign(transfer: false)
            }
        }
    }

    private mutating func tickLeader() {
        leaderTicks += 1
        heartbeatElapsed += 1
        electionElapsed += 1
        if transferTarget != 0 {
            transferElapsed += 1
            if transferElapsed >= configuration.electionTicks { transferTarget = 0 }
        }
        if electionElapsed >= configuration.electionTicks {
            electionElapsed = 0
            if configuration.checkQuorum {
                if !quorumActive() {
                    becomeFollower(term: term, leader: 0)
                    return
                }
                for key in progress.keys where key != id { progress[key]?.recentActive = false }
            }
        }
        // Snapshot transfers that stalled (lost chunk or answer) restart from the last offset.
        // Sorted: the requests this emits must come out in the same order in every process
        // (Swift seeds Dictionary order per process; found by review, seeds 208, 846, 976, 1420).
        for key in progress.keys.sorted() {
            guard var pr = progress[key], case .snapshot = pr.state else { continue }
            pr.snapshotIdleTicks += 1
            pr.snapshotSilentTicks += 1
            if pr.snapshotIdleTicks >= configuration.electionTicks {
                pr.snapshotIdleTicks = 0
                pr.snapshotRequestOutstanding = false
                progress[key] = pr
                requestSnapshotChunk(to: key)
            } else {
                progress[key] = pr
            }
        }
        if heartbeatElapsed >= configuration.heartbeatTicks {
            heartbeatElapsed = 0
            broadcastHeartbeat()
        }
    }

    /// Starts an election now (as if the election timeout fired), with pre-vote if configured.
    /// Ignored on a leader and on a node that is not a voter.
    public mutating func campaign() {
        // In lease mode a node that heard from a leader within the election timeout may be part
        // of that leader's lease, so it does not campaign (transfers use timeout-now instead).
        if inFollowerLease { return }
        electionElapsed = 0
        campaign(transfer: false)
    }

    private var canCampaign: Bool { mayVote && membership.isVoter(id) && role != .leader }

    /// Lease mode: this node may be counted in a leader's lease, so it must not help elect anyone.
    private var inFollowerLease: Bool {
        configuration.readMode == .leaseBased && ticksSinceLeaderContact < configuration.electionTicks
    }

    // MARK: - Incarnations

    /// The driver learnt `node`'s incarnation (the hello of a connection it accepted from that
    /// node names it). A later report replaces an earlier one: the node came back blank. 0, this
    /// node's own id and id 0 are ignored. A leader promotes a caught-up learner that was waiting
    /// only for this.
    public mutating func noteIncarnation(of node: NodeID, _ incarnation: UInt64) {
        guard node != 0, node != id, incarnation != 0 else { return }
        let previous = knownIncarnations[node]
        knownIncarnations[node] = incarnation
        if let previous, previous != incarnation, role == .leader, progress[node] != nil {
            // Another data directory behind the id (a wiped or replaced node): what the leader
            // holds of its progress came from acknowledgements of the old one, which are gone.
            // Kept, the stale match would count towards commits and send the new directory a
            // commit index covering entries it never received from this leader (whole-node soak
            // seed 506651: it committed a stale entry a parked message had given it). Its peer
            // hello comes before any message of its new life, so from here its progress is
            // rebuilt from its own answers.
            var pr = Progress(
                next: log.lastIndex + 1, maxInflightMessages: configuration.maxInflightMessages,
                maxInflightBytes: configuration.maxInflightBytes)
            pr.recentActive = progress[node]?.recentActive ?? false
            // A new directory is blank until its own answers say otherwise: it counts in no
            // quorum, check-quorum included, before then.
            pr.mayVote = false
            progress[node] = pr
            if transferTarget == node { transferTarget = 0 }
            sendAppend(to: node, sendIfEmpty: true)
        }
        if role == .leader { maybePromoteLearner(node) }
    }

    // MARK: - Proposals

    public enum ProposalOutcome: Sendable, Equatable {
        /// Appended to the leader's log at these indexes (all in `term`).
        case appended(firstIndex: UInt64, lastIndex: UInt64, term: UInt64)
        /// Forwarded to the leader; the driver learns the outcome when the command applies.
        case forwarded(to: NodeID)
    }

    /// Proposes commands. On the leader they are appended; on a follower that knows the leader
    /// they are forwarded (and may be lost, which the caller sees as a timeout).
    @discardableResult
    public mutating func propose(_ commands: [[UInt8]]) throws(RaftError) -> ProposalOutcome {
        if role != .leader {
            guard leader != 0 else { throw .noLeader }
            send(to: leader, .proposal(commands: commands))
            return .forwarded(to: leader)
        }
        return try appendProposals(commands)
    }

    @discardableResult
    public mutating func propose(_ command: [UInt8]) throws(RaftError) -> ProposalOutcome {
        try propose([command])
    }

    private mutating func appendProposals(_ commands: [[UInt8]]) throws(RaftError) -> ProposalOutcome {
        if transferTarget != 0 { throw .transferInProgress(to: transferTarget) }
        let bytes = commands.reduce(0) { $0 + $1.count }
        if uncommittedBytes > 0 && uncommittedBytes + bytes > configuration.maxUncommittedBytes {
            throw .uncommittedLimit(bytes: uncommittedBytes)
        }
        let first = log.lastIndex + 1
        var index = first
        var entries: [LogEntry] = []
        entries.reserveCapacity(commands.count)
        for c in commands {
            entries.append(LogEntry(index: index, term: term, kind: .command, data: c))
            index += 1
        }
        uncommittedBytes += bytes
        appendAsLeader(entries)
        return .appended(firstIndex: first, lastIndex: log.lastIndex, term: term)
    }

    private mutating func appendAsLeader(_ entries: [LogEntry]) {
        guard !entries.isEmpty else { return }
        log.append(entries)
        broadcastAppend()
    }

    /// Whether `proposeMembershipChange(change)` would be accepted now, and the configuration it
    /// would lead to (before incarnations are recorded); nothing changes. For a driver that must
    /// validate a change before it stores anything for it (issue 18: an add naming an existing
    /// voter must not redirect that voter's traffic).
    public func checkMembershipChange(_ change: MembershipChange) throws(RaftError) -> Membership {
        guard role == .leader else { throw .notLeader(leader: leader) }
        if transferTarget != 0 { throw .transferInProgress(to: transferTarget) }
        guard log.committed >= termStartIndex, pendingConfigIndex <= log.committed else {
            throw .membershipChangePending
        }
        if case .promote(let node) = change, let pr = progress[node], pr.match < pendingConfigIndex {
            // The learner must hold the configuration that made it a learner, or it would become
            // a voter that has never seen itself added and may not vote (R22).
            throw .invalidMembershipChange("learner \(node) has not caught up yet (match \(pr.match), needs \(pendingConfigIndex))")
        }
        switch membership.applying(change) {
        case .success(let m): return m
        case .failure(let e): throw e
        }
    }

    /// Proposes one membership change (leader only; R20).
    @discardableResult
    public mutating func proposeMembershipChange(_ change: MembershipChange) throws(RaftError) -> ProposalOutcome {
        var next = try checkMembershipChange(change)
        switch change {
        case .addLearner(let node), .promote(let node):
            // Record which incarnation of the node this configuration admits (R22). A voter
            // must be admitted by incarnation, or a blank node reusing the id could take its
            // vote; only a legacy leader (incarnation 0) promotes without one.
            let known = knownIncarnation(of: node)
            if case .promote = change, known == 0, configuration.incarnation != 0 { throw .incarnationUnknown(node) }
            next = next.recording(incarnation: known, for: node)
        case .remove:
            break
        }
        let index = log.lastIndex + 1
        pendingConfigIndex = index
        appendAsLeader([LogEntry(index: index, term: term, kind: .config(next))])
        return .appended(firstIndex: index, lastIndex: index, term: term)
    }

    /// Asks `target` to take over leadership (R24). Proposals are refused until it completes or
    /// times out after an election timeout.
    public mutating func transferLeadership(to target: NodeID) throws(RaftError) {
        guard role == .leader else { throw .notLeader(leader: leader) }
        if target == id { transferTarget = 0; return }
        guard membership.isVoter(target), progress[target] != nil else {
            throw .invalidMembershipChange("node \(target) is not a voter")
        }
        // A voter that came back blank cannot campaign: the transfer would only stall proposals.
        guard countsInQuorum(target) else {
            throw .invalidMembershipChange("node \(target) has no vote (its data was replaced; remove it and add it back)")
        }
        if transferTarget == target { return }
        transferTarget = target
        transferElapsed = 0
        // The target will be elected without waiting for anyone's lease, possibly late (a delayed
        // timeout-now): no lease reads for the rest of this term.
        leaseUntil = 0
        leaseFloorSeq = UInt64.max
        if progress[target]?.match == log.lastIndex {
            send(to: target, .timeoutNow)
        } else {
            sendAppend(to: target, sendIfEmpty: true)
        }
    }

    // MARK: - Reads

    /// Starts a ReadIndex read (R17). The answer arrives as a `ReadState` with this context.
    /// Returns false when no leader is known (the read cannot start; retry later).
    @discardableResult
    public mutating func readIndex(context: UInt64) -> Bool {
        if role == .leader {
            handleReadRequest(context: context, from: id)
            return true
        }
        guard leader != 0 else { return false }
        send(to: leader, .readIndex(context: context))
        return true
    }

    private mutating func handleReadRequest(context: UInt64, from: NodeID) {
        guard log.committed >= termStartIndex else {
            // A new leader does not know the commit index until its no-op commits.
            readsBeforeCommit.append((context, from))
            return
        }
        if membership.voters == [id] || (configuration.readMode == .leaseBased && transferTarget == 0 && leaderTicks < leaseUntil) {
            answerRead(context: context, index: log.committed, to: from)
            return
        }
        readSeq += 1
        pendingReads.append(PendingRead(seq: readSeq, context: context, index: log.committed, from: from))
        heartbeatForReads = true
    }

    private mutating func answerRead(context: UInt64, index: UInt64, to: NodeID) {
        if to == id {
            readStates.append(ReadState(context: context, index: index))
        } else {
            send(to: to, .readIndexResponse(context: context, index: index))
        }
    }

    /// The highest heartbeat sequence number a quorum (this leader included) acknowledged.
    private func quorumAckedSeq() -> UInt64 {
        var acks: [UInt64] = []
        for v in membership.voters {
            acks.append(v == id ? UInt64.max : countsInQuorum(v) ? progress[v]?.readAck ?? 0 : 0)
        }
        acks.sort(by: >)
        guard acks.count >= membership.quorum, membership.quorum > 0 else { return 0 }
        return acks[membership.quorum - 1]
    }

    /// Lease mode: a quorum acknowledged heartbeats up to `quorumAckedSeq()`; the lease holds until
    /// the tick that heartbeat was sent plus the election timeout minus the margin.
    private mutating func extendLease() {
        guard configuration.readMode == .leaseBased, transferTarget == 0 else { return }
        let acked = quorumAckedSeq()
        guard acked > leaseFloorSeq else { return }
        var sentTick: Int?
        var drop = 0
        for (i, h) in heartbeatSentAt.enumerated() where h.seq <= acked {
            sentTick = h.tick
            drop = i + 1
        }
        if drop > 0 { heartbeatSentAt.removeFirst(drop) }
        if let t = sentTick {
            leaseUntil = max(leaseUntil, t + configuration.electionTicks - configuration.leaseMarginTicks)
        }
    }

    private mutating func confirmReads() {
        guard !pendingReads.isEmpty else { return }
        let confirmed = quorumAckedSeq()
        var done = 0
        for read in pendingReads {
            guard read.seq <= confirmed else { break }
            answerRead(context: read.context, index: read.index, to: read.from)
            done += 1
        }
        if done > 0 { pendingReads.removeFirst(done) }
    }

    // MARK: - Snapshots and compaction

    /// The metadata for a state-machine snapshot taken at `index` (≤ applied).
    public func snapshotMeta(at index: UInt64) throws(RaftError) -> SnapshotMeta {
        guard index <= log.applied, let t = log.term(at: index) else {
            throw .compactionOutOfRange(index: index, applied: log.applied, snapshot: log.snapshot.index)
        }
        return SnapshotMeta(index: index, term: t, membership: membership(at: index))
    }

    /// Compaction hook: the driver durably saved a snapshot at `index`; entries through it are
    /// dropped from memory (the driver compacts its files the same way).
    @discardableResult
    public mutating func compact(through index: UInt64) throws(RaftError) -> SnapshotMeta {
        if index == log.snapshot.index { return log.snapshot }
        let meta = try snapshotMeta(at: index)
        log.compact(to: meta)
        configHistory.removeAll { $0.index < index }
        configHistory.insert((index, meta.membership), at: 0)
        return meta
    }

    /// The driver's answer to a `SnapshotChunkRequest`.
    public mutating func snapshotChunk(to target: NodeID, meta: SnapshotMeta, offset: UInt64, data: [UInt8], last: Bool) {
        guard role == .leader, var pr = progress[target], case .snapshot(let index) = pr.state else { return }
        pr.snapshotRequestOutstanding = false
        guard meta == log.snapshot, index == meta.index else {
            // The leader compacted again meanwhile: start over with the newest snapshot.
            progress[target] = pr
            sendSnapshot(to: target)
            return
        }
        progress[target] = pr
        guard offset == pr.snapshotOffset else { return }
        send(to: target, .snapshotChunk(meta: meta, offset: offset, data: data, last: last))
    }

    private func membership(at index: UInt64) -> Membership {
        var m = configHistory.first?.membership ?? .empty
        for (i, c) in configHistory where i <= index { m = c }
        return m
    }

    // MARK: - Stepping messages

    /// Handles one message from a peer.
    public mutating func step(_ m: Message) {
        guard m.to == id, m.from != id else { return }
        if m.term > term {
            switch m.body {
            case .preVote, .vote:
                var transfer = false
                if case .vote(_, _, let t, _) = m.body { transfer = t }
                // A follower that heard from a leader within the election timeout ignores
                // campaigns (check-quorum lease), unless the leader asked for the transfer.
                let inLease = configuration.checkQuorum && leader != 0 && electionElapsed < configuration.electionTicks
                if inLease && !transfer { return }
            default:
                break
            }
            switch m.body {
            case .preVote:
                break  // a pre-vote never changes our term
            case .preVoteResponse(let granted) where granted:
                break  // granted pre-votes carry the future term
            case .append, .heartbeat, .snapshotChunk:
                becomeFollower(term: m.term, leader: m.from)
            default:
                becomeFollower(term: m.term, leader: 0)
            }
        } else if m.term < term {
            switch m.body {
            case .append, .heartbeat:
                // Tell a stale leader about the newer term, so that it steps down (etcd #8243).
                if configuration.checkQuorum || configuration.preVote {
                    send(to: m.from, .appendAccepted(index: 0))
                }
            case .preVote:
                send(to: m.from, .preVoteResponse(granted: false))
            default:
                break
            }
            return
        }

        switch m.body {
        case .preVote(let lastIndex, let lastTerm, let voterIncarnation):
            handleVoteRequest(m, lastIndex: lastIndex, lastTerm: lastTerm, preVote: true, voterIncarnation: voterIncarnation)
            return
        case .vote(let lastIndex, let lastTerm, _, let voterIncarnation):
            handleVoteRequest(m, lastIndex: lastIndex, lastTerm: lastTerm, preVote: false, voterIncarnation: voterIncarnation)
            return
        default:
            break
        }

        switch role {
        case .leader: stepLeader(m)
        case .candidate, .preCandidate: stepCandidate(m)
        case .follower: stepFollower(m)
        }
    }

    private mutating func handleVoteRequest(_ m: Message, lastIndex: UInt64, lastTerm: UInt64, preVote: Bool, voterIncarnation: UInt64) {
        // A node that started blank (new, or wiped) has no vote until it was added as a
        // learner (R22). A candidate whose configuration names this node with this node's own
        // incarnation holds an entry that admits it (a promoted node that has not heard of its
        // promotion yet: the entry committed on others, and the leader that would send it is
        // gone). That entry exists only because a leader heard this incarnation's hello, after
        // any removal of an earlier voting incarnation of the id had committed (a learner's
        // incarnation may be replaced without one: a learner's acknowledgements and votes count
        // in no quorum), and this incarnation has forgotten nothing it acknowledged: the same admission `admitIfNamedWithThisIncarnation`
        // takes from an entry, without which such a node could refuse the very votes every new
        // leader needs (soak seed 108021). A wiped node's new incarnation never matches the one
        // its old entries record, so a replayed history still gives nothing (item 3 of issue 14).
        if !mayVote, configuration.incarnation != 0,
            voterIncarnation == configuration.incarnation || (configuration.sabotage == .anyVoterIncarnation && voterIncarnation != 0)
        {
            mayVote = true
        }
        let canVote =
            vote == m.from || (vote == 0 && leader == 0) || (preVote && m.term > term)
        var transfer = false
        if case .vote(_, _, let t, _) = m.body { transfer = t }
        if inFollowerLease && !transfer {
            if preVote {
                send(to: m.from, .preVoteResponse(granted: false))
            } else {
                send(to: m.from, .voteResponse(granted: false))
            }
            return
        }
        if mayVote && canVote && log.isUpToDate(lastIndex: lastIndex, lastTerm: lastTerm) {
            if preVote {
                send(to: m.from, term: m.term, .preVoteResponse(granted: true))
            } else {
                electionElapsed = 0
                vote = m.from
                send(to: m.from, .voteResponse(granted: true))
            }
        } else {
            if preVote {
                send(to: m.from, .preVoteResponse(granted: false))
            } else {
                send(to: m.from, .voteResponse(granted: false))
            }
        }
    }

    private mutating func stepFollower(_ m: Message) {
        switch m.body {
        case let .append(prevIndex, prevTerm, entries, commit):
            // A malformed append (entries not numbered prevIndex+1, prevIndex+2, …, or of a term
            // newer than the message's) is dropped: peer input must never crash the core.
            let malformed = entries.enumerated().contains { k, e in e.index != prevIndex &+ 1 &+ UInt64(k) || e.term > m.term }
            if malformed && configuration.sabotage != .uncheckedLogShape {
                invalidMessages += 1
                return
            }
            electionElapsed = 0
            ticksSinceLeaderContact = 0
            leader = m.from
            handleAppend(from: m.from, prevIndex: prevIndex, prevTerm: prevTerm, entries: entries, commit: commit)
        case let .heartbeat(commit, seq, commitTerm):
            electionElapsed = 0
            ticksSinceLeaderContact = 0
            leader = m.from
            if configuration.sabotage == .unverifiedHeartbeatCommit {
                log.commitTo(commit)
            } else if commit > log.committed, commitTerm != 0, log.term(at: commit) == commitTerm {
                // Our entry at `commit` is the leader's, so is everything before it (Log
                // Matching). Otherwise the heartbeat commits nothing: it may have been computed
                // for an earlier incarnation of this node (a wiped directory's progress) or
                // before our log diverged; appends bring what is missing.
                log.commitTo(commit)
            }
            applyCommittedConfigurations()
            send(to: m.from, .heartbeatResponse(readSeq: seq, mayVote: mayVote))
        case let .snapshotChunk(meta, offset, data, last):
            electionElapsed = 0
            ticksSinceLeaderContact = 0
            leader = m.from
            handleSnapshotChunk(from: m.from, meta: meta, offset: offset, data: data, last: last)
        case .proposal(let commands):
            // Only the leader appends; a follower passes it on once (no forwarding loops).
            _ = commands
        case let .readIndexResponse(context, index):
            // Only the leader of this term answers reads for this node (step dropped older
            // terms); a delayed answer from anyone else is no evidence about this term.
            guard m.from == leader || configuration.sabotage == .reusedReadContexts else { return }
            readStates.append(ReadState(context: context, index: index))
        case .timeoutNow:
            if canCampaign { campaign(transfer: true) }
        default:
            break
        }
    }

    private mutating func stepCandidate(_ m: Message) {
        switch m.body {
        case .append, .heartbeat, .snapshotChunk:
            // A leader of our term exists (§5.2): step down and handle it as a follower.
            becomeFollower(term: m.term, leader: m.from)
            stepFollower(m)
        case .preVoteResponse(let granted) where role == .preCandidate:
            countVote(from: m.from, granted: granted)
        case .voteResponse(let granted) where role == .candidate:
            countVote(from: m.from, granted: granted)
        default:
            break
        }
    }

    private mutating func countVote(from: NodeID, granted: Bool) {
        guard membership.isVoter(from) else { return }
        if granted {
            votesGranted.insert(from)
            votesRejected.remove(from)
        } else if !votesGranted.contains(from) {
            votesRejected.insert(from)
        }
        if votesGranted.count >= membership.quorum {
            if role == .preCandidate {
                becomeCandidate(transfer: false)
            } else {
                becomeLeader()
            }
        } else if votesRejected.count > membership.voters.count - membership.quorum {
            becomeFollower(term: term, leader: 0)
        }
    }

    private mutating func stepLeader(_ m: Message) {
        switch m.body {
        case .proposal(let commands):
            _ = try? appendProposals(commands)
            return
        case .readIndex(let context):
            handleReadRequest(context: context, from: m.from)
            return
        default:
            break
        }
        guard var pr = progress[m.from] else { return }
        pr.recentActive = true
        switch m.body {
        case let .appendAccepted(index, followerMayVote):
            let wasPaused = pr.isPaused
            let regainedVote = followerMayVote && !pr.mayVote
            pr.mayVote = followerMayVote
            if pr.maybeUpdate(index) {
                switch pr.state {
                case .probe: pr.becomeReplicate()
                case .snapshot(let pending) where pr.match >= pending: pr.becomeProbe()
                case .replicate: pr.inflights.free(through: index)
                default: break
                }
                progress[m.from] = pr
                if maybeCommit() {
                    broadcastAppend()
                } else if wasPaused {
                    // A paused follower was skipped by earlier commit broadcasts: send it an
                    // append (empty if nothing is new) so it learns the commit index now rather
                    // than at the next heartbeat (etcd's `oldPaused`; scenario "committing the
                    // new leader's no-op commits every preceding entry").
                    sendAppend(to: m.from, sendIfEmpty: true)
                }
                while sendAppend(to: m.from, sendIfEmpty: false) {}
                if m.from == transferTarget, progress[m.from]?.match == log.lastIndex {
                    send(to: m.from, .timeoutNow)
                }
                maybePromoteLearner(m.from)
            } else {
                progress[m.from] = pr
                // A voter readmitted under its new incarnation: what it holds counts from now.
                if regainedVote, maybeCommit() { broadcastAppend() }
            }
        case let .appendRejected(rejected, hintIndex, hintTerm):
            var next = hintIndex
            if hintTerm > 0 {
                next = log.findConflictByTerm(index: hintIndex, term: hintTerm).index
            }
            if pr.maybeDecrease(rejected: rejected, hint: next) {
                if pr.state == .replicate { pr.becomeProbe() }
                progress[m.from] = pr
                sendAppend(to: m.from, sendIfEmpty: true)
            } else {
                progress[m.from] = pr
            }
        case let .heartbeatResponse(seq, followerMayVote):
            let regainedVote = followerMayVote && !pr.mayVote
            pr.mayVote = followerMayVote
            pr.probeSent = false
            if pr.state == .replicate && pr.inflights.isFull { pr.inflights.freeFirst() }
            if seq > pr.readAck { pr.readAck = seq }
            progress[m.from] = pr
            if regainedVote, maybeCommit() { broadcastAppend() }
            if pr.match < log.lastIndex { sendAppend(to: m.from, sendIfEmpty: true) }
            extendLease()
            confirmReads()
        case let .snapshotResponse(snapshotIndex, nextOffset):
            guard case .snapshot(let pending) = pr.state, pending == snapshotIndex else {
                progress[m.from] = pr
                return
            }
            pr.snapshotIdleTicks = 0
            pr.snapshotSilentTicks = 0
            // Equal offsets are duplicates (the idle timer covers a lost chunk).
            if nextOffset != pr.snapshotOffset {
                pr.snapshotOffset = nextOffset
                progress[m.from] = pr
                requestSnapshotChunk(to: m.from)
            } else {
                progress[m.from] = pr
            }
        default:
            progress[m.from] = pr
        }
    }

    // MARK: - Follower handlers

    private mutating func handleAppend(from: NodeID, prevIndex: UInt64, prevTerm: UInt64, entries: [LogEntry], commit: UInt64) {
        if prevIndex < log.committed {
            send(to: from, .appendAccepted(index: log.committed, mayVote: mayVote))
            return
        }
        if let result = log.maybeAppend(
            prevIndex: prevIndex, prevTerm: prevTerm, commit: commit, entries: entries,
            checkPrevTerm: configuration.sabotage != .skipConsistencyCheck, checkNumbering: configuration.sabotage != .uncheckedLogShape)
        {
            // `truncatedCommitted` would mean a leader contradicts a committed entry: refuse the
            // append rather than lose committed data (it cannot happen if Raft's invariants hold).
            guard !result.truncatedCommitted else {
                invariantViolations.append(
                    "node \(id) term \(term): leader \(from) asked to overwrite a committed entry after \(prevIndex)"
                )
                return
            }
            if let c = lastConfigIndex(in: entries) { pendingConfigIndex = max(pendingConfigIndex, c) }
            admitIfNamedWithThisIncarnation(entries)
            applyCommittedConfigurations()
            send(to: from, .appendAccepted(index: result.lastNew, mayVote: mayVote))
        } else {
            let hint = log.findConflictByTerm(index: min(prevIndex, log.lastIndex), term: prevTerm)
            send(to: from, .appendRejected(rejectedIndex: prevIndex, hintIndex: hint.index, hintTerm: hint.term))
        }
    }

    private mutating func handleSnapshotChunk(from: NodeID, meta: SnapshotMeta, offset: UInt64, data: [UInt8], last: Bool) {
        // A snapshot completed in this batch has not been handed to the driver yet: accept no new
        // chunks until it has, so that `Ready.snapshotChunks` never mixes two snapshots around an
        // install (found by the simulator, seed 34521: a resumed node stepped its whole inbox).
        // The leader resends after its idle timeout.
        if installedSnapshot != nil { return }
        if meta.index <= log.committed {
            incomingSnapshot = nil
            send(to: from, .appendAccepted(index: log.committed, mayVote: mayVote))
            return
        }
        if log.matchTerm(meta.index, meta.term) {
            // Our log already holds the snapshot's last entry (perhaps only since the stream
            // started: appends can overtake it): just learn the commit, and never restore, which
            // would drop entries we acknowledged (simulator seed 31161). Answer
            // with the commit index, not the last index: entries after it may differ from the
            // leader's (found by the simulator, seed 761: a wrong match made the leader probe
            // forever).
            incomingSnapshot = nil
            log.commitTo(meta.index)
            applyCommittedConfigurations()
            send(to: from, .appendAccepted(index: log.committed, mayVote: mayVote))
            return
        }
        if incomingSnapshot?.meta != meta {
            guard offset == 0 else {
                send(to: from, .snapshotResponse(snapshotIndex: meta.index, nextOffset: 0))
                return
            }
            incomingSnapshot = (meta, 0)
        }
        guard let incoming = incomingSnapshot, offset == incoming.nextOffset else {
            send(to: from, .snapshotResponse(snapshotIndex: meta.index, nextOffset: incomingSnapshot?.nextOffset ?? 0))
            return
        }
        snapshotChunks.append(IncomingSnapshotChunk(meta: meta, offset: offset, data: data))
        let next = offset + UInt64(data.count)
        if last {
            incomingSnapshot = nil
            if durableBeforeInstall == nil { durableBeforeInstall = (min(log.committed, log.stable), mayVote) }
            log.restore(meta)
            membership = meta.membership
            if admitsThisIncarnation(meta.membership) { mayVote = true }
            configHistory = [(meta.index, meta.membership)]
            pendingConfigIndex = meta.index
            configScannedThrough = meta.index
            installedSnapshot = meta
            send(to: from, .appendAccepted(index: meta.index, mayVote: mayVote))
        } else {
            incomingSnapshot = (meta, next)
            send(to: from, .snapshotResponse(snapshotIndex: meta.index, nextOffset: next))
        }
    }

    // MARK: - Role changes

    private mutating func resetTerm(_ newTerm: UInt64) {
        if term != newTerm {
            term = newTerm
            vote = 0
        }
        leader = 0
        electionElapsed = 0
        heartbeatElapsed = 0
        resetRandomizedElectionTimeout()
        votesGranted = []
        votesRejected = []
        transferTarget = 0
        pendingReads = []
        readsBeforeCommit = []
        heartbeatForReads = false
        progress = [:]
        leaderTicks = 0
        heartbeatSentAt = []
        leaseUntil = 0
        leaseFloorSeq = readSeq
    }

    private mutating func becomeFollower(term newTerm: UInt64, leader newLeader: NodeID) {
        resetTerm(newTerm)
        role = .follower
        leader = newLeader
    }

    private mutating func becomePreCandidate() {
        // Pre-candidates keep their term and vote; they only ask whether they could win.
        role = .preCandidate
        leader = 0
        resetRandomizedElectionTimeout()
        votesGranted = [id]
        votesRejected = []
    }

    private mutating func becomeCandidate(transfer: Bool) {
        resetTerm(term + 1)
        role = .candidate
        vote = id
        votesGranted = [id]
        if votesGranted.count >= membership.quorum {
            becomeLeader()
            return
        }
        for peer in membership.voters where peer != id {
            send(to: peer, .vote(lastIndex: log.lastIndex, lastTerm: log.lastTerm, leaderTransfer: transfer, voterIncarnation: membership.incarnation(of: peer)))
        }
    }

    private mutating func campaign(transfer: Bool) {
        guard canCampaign else { return }
        if configuration.preVote && !transfer {
            becomePreCandidate()
            if votesGranted.count >= membership.quorum {
                becomeCandidate(transfer: false)
                return
            }
            for peer in membership.voters where peer != id {
                send(to: peer, term: term + 1, .preVote(lastIndex: log.lastIndex, lastTerm: log.lastTerm, voterIncarnation: membership.incarnation(of: peer)))
            }
        } else {
            becomeCandidate(transfer: transfer)
        }
    }

    private mutating func becomeLeader() {
        resetTerm(term)
        role = .leader
        leader = id
        for member in membership.all {
            var pr = Progress(
                next: log.lastIndex + 1, maxInflightMessages: configuration.maxInflightMessages,
                maxInflightBytes: configuration.maxInflightBytes
            )
            if member == id {
                pr.match = log.stable
                pr.state = .replicate
                pr.recentActive = true
            }
            progress[member] = pr
        }
        pendingConfigIndex = lastConfigIndex()
        uncommittedBytes = 0
        termStartIndex = log.lastIndex + 1
        appendAsLeader([LogEntry(index: termStartIndex, term: term, kind: .noop)])
    }

    private mutating func resetRandomizedElectionTimeout() {
        randomizedElectionTimeout = configuration.electionTicks + random.below(configuration.electionTicks)
    }

    // MARK: - Leader replication

    /// Whether voter `v`'s acknowledgements count towards a quorum (commit, read index, lease,
    /// check-quorum): the leader itself always; a follower unless its last answer said it may not
    /// vote. A voter without its vote came back blank (R22): it may have forgotten a newer term
    /// and the entries it acknowledged in it, so a stale leader could otherwise commit over them
    /// with its help (whole-node soak seed 1116537: a term-2 leader paused through term 3 came
    /// back and, with a wiped voter's acknowledgements, committed its own entries where term 3
    /// had committed others). It counts again once its vote comes back: a configuration naming
    /// its new incarnation reaches it, or a vote request names that incarnation.
    /// The leader also checks, without relying on the follower, that the incarnation it heard
    /// from `v` is the one the configuration admitted (when both are known): another one is a
    /// directory that may have forgotten what the admitted one acknowledged.
    private func countsInQuorum(_ v: NodeID) -> Bool {
        if v == id || configuration.sabotage == .amnesiacAcknowledgements { return true }
        guard progress[v]?.mayVote != false else { return false }
        let admitted = membership.incarnation(of: v)
        let heard = knownIncarnations[v] ?? 0
        return admitted == 0 || heard == 0 || admitted == heard
    }

    private func quorumActive() -> Bool {
        var active = 0
        for v in membership.voters where v == id || (progress[v]?.recentActive == true && countsInQuorum(v)) { active += 1 }
        return active >= membership.quorum
    }

    private mutating func broadcastAppend() {
        for peer in membership.all where peer != id {
            sendAppend(to: peer, sendIfEmpty: true)
        }
    }

    private mutating func broadcastHeartbeat() {
        if configuration.readMode == .leaseBased {
            // Every heartbeat round gets its own sequence number, so acknowledgements say which
            // round (and so which send tick) they confirm.
            readSeq += 1
            heartbeatSentAt.append((readSeq, leaderTicks))
            if heartbeatSentAt.count > 4 * configuration.electionTicks { heartbeatSentAt.removeFirst() }
        }
        for peer in membership.all where peer != id {
            let commit = min(progress[peer]?.match ?? 0, log.committed)
            // With the term of our entry there, so the follower can check it holds that entry
            // (0 when compacted away: the follower then learns the commit from appends).
            send(to: peer, .heartbeat(commit: commit, readSeq: readSeq, commitTerm: log.term(at: commit) ?? 0))
        }
    }

    /// Sends the next append (or starts a snapshot) to `to`. Returns whether a message went out.
    @discardableResult
    private mutating func sendAppend(to: NodeID, sendIfEmpty: Bool) -> Bool {
        guard var pr = progress[to], !pr.isPaused else { return false }
        let prevIndex = pr.next - 1
        guard let prevTerm = log.term(at: prevIndex),
            let entries = log.slice(from: pr.next, through: log.lastIndex, maxBytes: configuration.maxMessageBytes)
        else {
            sendSnapshot(to: to)
            return false
        }
        if entries.isEmpty && !sendIfEmpty { return false }
        switch pr.state {
        case .replicate:
            if let last = entries.last {
                pr.next = last.index + 1
                pr.inflights.add(lastIndex: last.index, bytes: entries.reduce(0) { $0 + $1.size })
            }
        case .probe:
            pr.probeSent = true
        case .snapshot:
            return false
        }
        progress[to] = pr
        send(to: to, .append(prevIndex: prevIndex, prevTerm: prevTerm, entries: entries, commit: log.committed))
        return true
    }

    private mutating func sendSnapshot(to: NodeID) {
        guard var pr = progress[to] else { return }
        pr.becomeSnapshot(index: log.snapshot.index)
        progress[to] = pr
        requestSnapshotChunk(to: to)
    }

    private mutating func requestSnapshotChunk(to: NodeID) {
        guard var pr = progress[to], case .snapshot(let index) = pr.state else { return }
        // The leader compacted since the stream began: its offset belongs to a snapshot that is
        // gone, so the stream starts over with the newest one (asking for the old offset of the
        // new snapshot stalled a transfer for good when the new image was shorter: simulator
        // seed 307 at 300 operations with sessions).
        if index != log.snapshot.index { pr.becomeSnapshot(index: log.snapshot.index) }
        pr.snapshotRequestOutstanding = true
        progress[to] = pr
        snapshotReads.append(
            SnapshotChunkRequest(to: to, meta: log.snapshot, offset: pr.snapshotOffset, maxBytes: configuration.snapshotChunkBytes)
        )
    }

    /// Advances the commit index to the highest index a quorum holds, if that entry is of the
    /// current term (§5.4.2, R8). Returns whether it moved.
    private mutating func maybeCommit() -> Bool {
        var matches: [UInt64] = []
        matches.reserveCapacity(membership.voters.count)
        for v in membership.voters { matches.append(countsInQuorum(v) ? progress[v]?.match ?? 0 : 0) }
        guard matches.count >= membership.quorum, !matches.isEmpty else { return false }
        matches.sort(by: >)
        let candidate = matches[membership.quorum - 1]
        guard candidate > log.committed, log.term(at: candidate) == term else { return false }
        let old = log.committed
        log.commitTo(candidate)
        releaseUncommitted(from: old + 1, through: log.committed)
        let wasVoter = membership.isVoter(id)
        applyCommittedConfigurations()
        if log.committed >= termStartIndex && !readsBeforeCommit.isEmpty {
            let waiting = readsBeforeCommit
            readsBeforeCommit = []
            for r in waiting { handleReadRequest(context: r.context, from: r.from) }
        }
        if role == .leader && wasVoter && !membership.isVoter(id) {
            // This leader was removed: tell everyone the commit, then step down (R21).
            broadcastAppend()
            becomeFollower(term: term, leader: 0)
            return false
        }
        return true
    }

    private mutating func releaseUncommitted(from: UInt64, through: UInt64) {
        guard uncommittedBytes > 0, from <= through else { return }
        var i = max(from, log.firstIndex)
        while i <= through, let e = log.entry(at: i) {
            if e.term == term { uncommittedBytes -= e.data.count }
            i += 1
        }
        if uncommittedBytes < 0 { uncommittedBytes = 0 }
    }

    private mutating func maybePromoteLearner(_ node: NodeID) {
        guard configuration.autoPromoteLearners, membership.isLearner(node), let pr = progress[node],
            pr.match + configuration.promotionLag >= log.lastIndex, pendingConfigIndex <= log.committed,
            log.committed >= termStartIndex,
            // The learner must hold the configuration that made it a learner (entry or snapshot),
            // so that it has seen itself as a learner and may vote once promoted (R22).
            pr.match >= pendingConfigIndex,
            // A leader with an incarnation admits only a known incarnation: wait for the
            // learner's hello (R22).
            configuration.incarnation == 0 || knownIncarnation(of: node) != 0
        else { return }
        _ = try? proposeMembershipChange(.promote(node))
    }

    // MARK: - Configuration bookkeeping

    private func lastConfigIndex() -> UInt64 {
        var i = log.lastIndex
        while i > log.snapshot.index {
            if let e = log.entry(at: i), case .config = e.kind { return i }
            i -= 1
        }
        return log.snapshot.index
    }

    /// Applies configuration entries that became committed since the last call, in order, and
    /// keeps leader progress in step with the membership. Cheap when none is pending.
    private mutating func applyCommittedConfigurations() {
        guard log.committed > configScannedThrough else { return }
        if pendingConfigIndex > configScannedThrough {
            var i = max(configScannedThrough + 1, log.firstIndex)
            while i <= log.committed, let e = log.entry(at: i) {
                if case .config(let m) = e.kind {
                    membership = m
                    configHistory.append((i, m))
                    if admitsThisIncarnation(m) { mayVote = true }
                    if role == .leader { syncProgressWithMembership() }
                }
                i += 1
            }
        }
        configScannedThrough = log.committed
    }

    /// Whether a committed configuration gives this node its vote back (R22). With an
    /// incarnation: only a configuration that names this id, as learner or voter, with this
    /// node's incarnation; the entries that admitted an earlier incarnation of the id (a wiped
    /// node replaying its own history) do nothing, and a voter whose recorded incarnation is
    /// another stays `isVoterWithAmnesia`. Legacy (incarnation 0): any configuration naming it
    /// as a learner, as before incarnations existed.
    private func admitsThisIncarnation(_ m: Membership) -> Bool {
        if configuration.incarnation == 0 || configuration.sabotage == .replayedAdmission { return m.isLearner(id) }
        return m.contains(id) && m.incarnation(of: id) == configuration.incarnation
    }

    /// A configuration entry that names this node's own incarnation gives it its vote as soon as
    /// the node holds it, committed or not (item 3 of issue 14). Such an entry exists only because
    /// a leader heard this incarnation's hello, after the configuration that removed any earlier
    /// incarnation of the id had committed (one change at a time); and a node with a fresh
    /// incarnation has forgotten nothing it acknowledged. Waiting for the commit could deadlock:
    /// a promoted node that missed the commit of its promotion would refuse the very votes a new
    /// leader needs. (Legacy nodes, incarnation 0, keep the committed-learner rule.)
    private mutating func admitIfNamedWithThisIncarnation(_ entries: [LogEntry]) {
        guard !mayVote, configuration.incarnation != 0 else { return }
        for e in entries {
            if case .config(let m) = e.kind, m.contains(id), m.incarnation(of: id) == configuration.incarnation {
                mayVote = true
                return
            }
        }
    }

    private func lastConfigIndex(in entries: [LogEntry]) -> UInt64? {
        for e in entries.reversed() {
            if case .config = e.kind { return e.index }
        }
        return nil
    }

    private mutating func syncProgressWithMembership() {
        for member in membership.all where progress[member] == nil {
            var pr = Progress(
                next: log.lastIndex + 1, maxInflightMessages: configuration.maxInflightMessages,
                maxInflightBytes: configuration.maxInflightBytes
            )
            pr.recentActive = true
            progress[member] = pr
            sendAppend(to: member, sendIfEmpty: true)
        }
        for key in Array(progress.keys) where !membership.contains(key) && key != id {
            progress[key] = nil
        }
        if transferTarget != 0 && !membership.isVoter(transferTarget) { transferTarget = 0 }
        confirmReads()
    }

    // MARK: - Sending

    /// Queues a staged-payload message (docs/staged-payloads.md; the replica decides them, Raft
    /// only carries them) from this node, in its term, for the next `Ready`. Other bodies are
    /// ignored: Raft's own messages come from Raft.
    public mutating func sendStaging(to: NodeID, _ body: Message.Body) {
        switch body {
        case .stage, .stageAck, .fetchStaged, .stagedPayload:
            guard to != id else { return }
            send(to: to, body)
        default:
            return
        }
    }

    private mutating func send(to: NodeID, _ body: Message.Body) {
        messages.append(Message(from: id, to: to, term: term, body: body))
    }

    private mutating func send(to: NodeID, term t: UInt64, _ body: Message.Body) {
        messages.append(Message(from: id, to: to, term: t, body: body))
    }
}
