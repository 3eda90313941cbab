public import BanyanBasics
/// Value types shared by the Raft core, its drivers and the simulator. See docs/raft.md.

/// A node's identity in the cluster. `0` means "nobody" (no vote, no known leader).
public typealias NodeID = UInt64

/// The configuration of the cluster: who votes and who only receives the log.
///
/// Configuration entries carry the whole resulting membership, so a node that joins late, or
/// restores a snapshot, learns the configuration from one value and never has to replay history.
///
/// `incarnations` records, for members whose incarnation the leader knew when it proposed the
/// configuration, which incarnation of that node (one blank data directory's random identity,
/// `RaftConfiguration.incarnation`) the configuration admitted. A node that came back blank under
/// an old id has a new incarnation, so replaying the entries that admitted the old one does not
/// give it a vote (R22). Incarnations take part in `==` and hashing: two configurations that
/// admit different incarnations of a node are different configurations (a snapshot or a chunk
/// stream carrying one must never be mistaken for the other).
public struct Membership: Sendable, Hashable, CustomStringConvertible {
    /// Voting members, sorted.
    public private(set) var voters: [NodeID]
    /// Non-voting members (catching up, or read replicas), sorted.
    public private(set) var learners: [NodeID]
    /// The incarnation admitted for each member whose incarnation was known; members only, never
    /// 0 (0 means unknown and is not stored).
    public private(set) var incarnations: [NodeID: UInt64]

    public init(voters: [NodeID], learners: [NodeID] = [], incarnations: [NodeID: UInt64] = [:]) {
        self.voters = Array(Set(voters)).sorted()
        let voterSet = Set(voters)
        self.learners = Array(Set(learners).subtracting(voterSet)).sorted()
        let members = voterSet.union(learners)
        self.incarnations = incarnations.filter { members.contains($0.key) && $0.value != 0 }
    }

    public static let empty = Membership(voters: [])

    public var isEmpty: Bool { voters.isEmpty && learners.isEmpty }
    public func isVoter(_ id: NodeID) -> Bool { voters.contains(id) }
    public func isLearner(_ id: NodeID) -> Bool { learners.contains(id) }
    public func contains(_ id: NodeID) -> Bool { isVoter(id) || isLearner(id) }
    /// Every member, voters first.
    public var all: [NodeID] { voters + learners }
    /// Votes or acknowledgements needed for a decision.
    public var quorum: Int { voters.count / 2 + 1 }
    /// The incarnation this configuration admitted for `id`, or 0 when it records none.
    public func incarnation(of id: NodeID) -> UInt64 { incarnations[id] ?? 0 }

    /// The same membership recording `incarnation` for member `id` (0 erases it; a non-member is
    /// ignored).
    public func recording(incarnation: UInt64, for id: NodeID) -> Membership {
        var list = incarnations
        list[id] = incarnation
        return Membership(voters: voters, learners: learners, incarnations: list)
    }

    /// The membership after one change, or the reason the change is not allowed. Recorded
    /// incarnations of the other members are kept; a removed member's is dropped.
    public func applying(_ change: MembershipChange) -> Result<Membership, RaftError> {
        switch change {
        case .addLearner(let id):
            guard id != 0 else { return .failure(.invalidMembershipChange("node id 0 is reserved")) }
            guard !contains(id) else {
                return .failure(.invalidMembershipChange("node \(id) is already a member"))
            }
            return .success(Membership(voters: voters, learners: learners + [id], incarnations: incarnations))
        case .promote(let id):
            guard isLearner(id) else {
                return .failure(.invalidMembershipChange("node \(id) is not a learner, so it cannot be promoted"))
            }
            return .success(Membership(voters: voters + [id], learners: learners.filter { $0 != id }, incarnations: incarnations))
        case .remove(let id):
            guard contains(id) else { return .failure(.invalidMembershipChange("node \(id) is not a member")) }
            let remaining = Membership(
                voters: voters.filter { $0 != id }, learners: learners.filter { $0 != id }, incarnations: incarnations)
            guard !remaining.voters.isEmpty else {
                return .failure(.invalidMembershipChange("removing node \(id) would leave no voters"))
            }
            return .success(remaining)
        }
    }

    public var description: String {
        guard !incarnations.isEmpty else { return "voters \(voters) learners \(learners)" }
        let list = incarnations.keys.sorted().map { "\($0): \(String(incarnations[$0] ?? 0, radix: 16))" }.joined(separator: ", ")
        return "voters \(voters) learners \(learners) incarnations [\(list)]"
    }
}

/// One single-server membership change (no joint consensus; see docs/raft.md).
public enum MembershipChange: Sendable, Hashable {
    /// A new node joins without a vote and receives the log.
    case addLearner(NodeID)
    /// A caught-up learner becomes a voter.
    case promote(NodeID)
    /// A voter or learner leaves (the leader included).
    case remove(NodeID)
}

/// One log entry. Index and term identify it; `kind` says how the core treats it.
public struct LogEntry: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// A state-machine command (opaque to Raft).
        case command
        /// The empty entry a new leader appends in its term (R9).
        case noop
        /// A configuration entry carrying the whole resulting membership.
        case config(Membership)
    }

    public var index: UInt64
    public var term: UInt64
    public var kind: Kind
    public var data: [UInt8]

    public init(index: UInt64, term: UInt64, kind: Kind = .command, data: [UInt8] = []) {
        self.index = index
        self.term = term
        self.kind = kind
        self.data = data
    }

    /// Bytes counted against message and flow-control limits.
    @inlinable public var size: Int { data.count + 24 }
}

/// What must be durable before any message that depends on it is sent (R3, R4, R26).
public struct HardState: Sendable, Equatable {
    public var term: UInt64
    public var vote: NodeID
    public var commit: UInt64
    /// False for a node that started from a blank disk until a configuration admits its
    /// incarnation (see `RaftConfiguration.incarnation`): a wiped node that comes back under an id
    /// that is still a voter must never vote or campaign with amnesia (R22). Operators remove that id and add the node back as a learner. Drivers
    /// must persist it with the term and vote (`HardStateRecord` version 2 stores it, and a
    /// missing hard-state file loads as `mayVote == false`).
    public var mayVote: Bool

    /// `mayVote` has no default (see `HardStateRecord`): every caller says whether the node may vote.
    public init(term: UInt64 = 0, vote: NodeID = 0, commit: UInt64 = 0, mayVote: Bool) {
        self.term = term
        self.vote = vote
        self.commit = commit
        self.mayVote = mayVote
    }
}

/// Describes a state-machine snapshot: the last log entry it includes and the membership then.
public struct SnapshotMeta: Sendable, Equatable {
    public var index: UInt64
    public var term: UInt64
    public var membership: Membership

    public init(index: UInt64, term: UInt64, membership: Membership) {
        self.index = index
        self.term = term
        self.membership = membership
    }

    public static let none = SnapshotMeta(index: 0, term: 0, membership: .empty)
}

/// Everything a node persisted, handed back to the core on restart.
public struct PersistedState: Sendable, Equatable {
    public var hardState: HardState
    public var snapshot: SnapshotMeta
    /// The entries after `snapshot.index`, contiguous.
    public var entries: [LogEntry]

    public init(hardState: HardState, snapshot: SnapshotMeta = .none, entries: [LogEntry] = []) {
        self.hardState = hardState
        self.snapshot = snapshot
        self.entries = entries
    }

    /// The state of a node that has never been part of a cluster (a joining learner, or a
    /// wiped disk): it may not vote until it sees itself added as a learner.
    public static let blank = PersistedState(hardState: HardState(mayVote: false))
}

/// The role a node plays in its current term.
public enum RaftRole: Sendable, Equatable, CustomStringConvertible {
    case follower
    case preCandidate
    case candidate
    case leader

    public var description: String {
        switch self {
        case .follower: "follower"
        case .preCandidate: "pre-candidate"
        case .candidate: "candidate"
        case .leader: "leader"
        }
    }
}

/// A peer message. `term` is the sender's term, except for pre-votes, which carry the term the
/// sender would campaign in.
public struct Message: Sendable, Equatable {
    public enum Body: Sendable, Equatable {
        /// `voterIncarnation`: the incarnation the candidate's configuration records for the
        /// recipient (0: none recorded, or a version-2 peer). A recipient without its vote only for
        /// want of an admission (R22) takes it from a match with its own (`RaftNode`, "a promoted
        /// node that has not heard of its promotion"); for any other recipient it changes nothing.
        case preVote(lastIndex: UInt64, lastTerm: UInt64, voterIncarnation: UInt64 = 0)
        case preVoteResponse(granted: Bool)
        case vote(lastIndex: UInt64, lastTerm: UInt64, leaderTransfer: Bool, voterIncarnation: UInt64 = 0)
        case voteResponse(granted: Bool)
        /// Log replication with the consistency check on (prevIndex, prevTerm).
        case append(prevIndex: UInt64, prevTerm: UInt64, entries: [LogEntry], commit: UInt64)
        /// Accepted: the follower's log matches the leader's through `index`. `mayVote` is the
        /// follower's own: false for a node that came back blank and no configuration admitted
        /// under its new incarnation yet (R22, `RaftNode.isVoterWithAmnesia`). A leader counts no acknowledgement of a voter that
        /// may not vote towards any quorum (commit, read index, lease, check-quorum): it may have
        /// forgotten a newer term and the entries it acknowledged in it (whole-node soak seed
        /// 1116537). A version-3 peer decodes as `true`.
        case appendAccepted(index: UInt64, mayVote: Bool = true)
        /// Rejected: no entry (`rejectedIndex`, prevTerm); the hint is where to probe next.
        case appendRejected(rejectedIndex: UInt64, hintIndex: UInt64, hintTerm: UInt64)
        /// Leadership assertion; `commit` is capped at what the follower is known to have, and
        /// `commitTerm` is the term of the leader's entry there. A follower commits through
        /// `commit` only when its own entry at `commit` has that term (Log Matching: then its log
        /// equals the leader's through it): no append's consistency check covers a heartbeat, and
        /// one computed for an earlier incarnation of the follower, or queued while it was away,
        /// could otherwise commit entries the leader never sent it (whole-node soak seed 1116537).
        /// `readSeq` confirms ReadIndex requests queued up to that sequence number. A version-3
        /// peer's heartbeat decodes with `commitTerm` 0 and commits nothing.
        case heartbeat(commit: UInt64, readSeq: UInt64, commitTerm: UInt64 = 0)
        /// `mayVote`: as in `appendAccepted`.
        case heartbeatResponse(readSeq: UInt64, mayVote: Bool = true)
        /// One chunk of the leader's snapshot, streamed in order.
        case snapshotChunk(meta: SnapshotMeta, offset: UInt64, data: [UInt8], last: Bool)
        /// The follower holds the snapshot's first `nextOffset` bytes.
        case snapshotResponse(snapshotIndex: UInt64, nextOffset: UInt64)
        /// Commands forwarded by a follower to the leader.
        case proposal(commands: [[UInt8]])
        /// A follower asks the leader for a read index.
        case readIndex(context: UInt64)
        case readIndexResponse(context: UInt64, index: UInt64)
        /// Leader transfer: the target should campaign now.
        case timeoutNow
        /// Staged payloads (docs/staged-payloads.md), handled by the replica, not by Raft: the
        /// leader sends a large command to every member before anything names it in the log.
        case stage(id: StageID, payload: [UInt8])
        /// The member holds `id` durably; `checksum` is the CRC32C of what it stored. `prepared`:
        /// it has also read the payload ahead (a reference to it would apply there at once); a
        /// member sends a second acknowledgement with `prepared` when its read finishes later.
        case stageAck(id: StageID, checksum: UInt32, prepared: Bool)
        /// A node asks for a payload its log names (or is about to) and it does not hold.
        case fetchStaged(id: StageID)
        /// The answer to `fetchStaged`: the payload's bytes.
        case stagedPayload(id: StageID, payload: [UInt8])
    }

    public var from: NodeID
    public var to: NodeID
    public var term: UInt64
    public var body: Body

    public init(from: NodeID, to: NodeID, term: UInt64, body: Body) {
        self.from = from
        self.to = to
        self.term = term
        self.body = body
    }

    /// Approximate wire size, for flow control and the simulator's accounting.
    public var size: Int {
        switch body {
        case .append(_, _, let entries, _): return 40 + entries.reduce(0) { $0 + $1.size }
        case .snapshotChunk(_, _, let data, _): return 64 + data.count
        case .proposal(let commands): return 32 + commands.reduce(0) { $0 + $1.count + 8 }
        case .stage(_, let payload), .stagedPayload(_, let payload): return 56 + payload.count
        default: return 40
        }
    }
}

/// The answer to a ReadIndex request: once the state machine has applied `index`, a read that
/// started before the request returns a linearizable result.
public struct ReadState: Sendable, Equatable {
    public var context: UInt64
    public var index: UInt64
}

/// The leader asks its driver for a chunk of the current snapshot (the core holds no snapshot
/// bytes). The driver answers with `RaftNode.snapshotChunk(to:meta:offset:data:last:)`.
public struct SnapshotChunkRequest: Sendable, Equatable {
    public var to: NodeID
    public var meta: SnapshotMeta
    public var offset: UInt64
    public var maxBytes: Int
}

/// A received snapshot chunk the driver must write to its incoming snapshot before sending.
public struct IncomingSnapshotChunk: Sendable, Equatable {
    public var meta: SnapshotMeta
    public var offset: UInt64
    public var data: [UInt8]

    public init(meta: SnapshotMeta, offset: UInt64, data: [UInt8]) {
        self.meta = meta
        self.offset = offset
        self.data = data
    }
}

/// Everything the driver must do, in this order:
/// 1. write `snapshotChunks` to the incoming snapshot; if `snapshot` is set, install the incoming
///    snapshot durably (its metadata is `snapshot`) and discard log entries it covers;
/// 2. persist `entries` (an entry at index i replaces any persisted entries at i and after), then
///    `hardState` if set, and fsync;
/// 3. only then send `messages` (R26);
/// 4. load the installed snapshot into the state machine (if any), apply `committedEntries` in
///    order, answer `readStates` once applied, serve `snapshotReads`;
/// 5. call `advance(_:)` with this value before stepping the node again.
public struct Ready: Sendable {
    public var hardState: HardState?
    public var entries: [LogEntry] = []
    public var snapshot: SnapshotMeta?
    public var snapshotChunks: [IncomingSnapshotChunk] = []
    public var messages: [Message] = []
    /// The first `sendBeforePersist` of `messages` may be sent before this batch is persisted
    /// (and should be: the leader's appends then reach the followers while it writes the same
    /// entries to its own disk, Raft §10.2.1). They are a leader's appends, heartbeats and
    /// snapshot chunks, and a follower's forwarded proposals and read-index requests, in a batch
    /// that changes neither term nor vote; the leader's own acknowledgement still counts only
    /// once `advance` reports the entries durable. A driver may ignore this and send everything
    /// after persisting.
    public var sendBeforePersist: Int = 0
    public var committedEntries: [LogEntry] = []
    public var readStates: [ReadState] = []
    public var snapshotReads: [SnapshotChunkRequest] = []
    /// Set when role or known leader changed.
    public var role: RaftRole?
    public var leader: NodeID?

    /// An empty batch (drivers' tests build their own).
    public init() {}

    public var isEmpty: Bool {
        hardState == nil && entries.isEmpty && snapshot == nil && snapshotChunks.isEmpty && messages.isEmpty
            && committedEntries.isEmpty && readStates.isEmpty && snapshotReads.isEmpty && role == nil
    }
}

/// Typed errors of the core, each carrying what the caller needs to act.
public enum RaftError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Only the leader accepts this; `leader` is the known leader (0 if none).
    case notLeader(leader: NodeID)
    /// No leader is known, so a proposal cannot be forwarded.
    case noLeader
    /// A leadership transfer is in progress; retry once it completes or times out.
    case transferInProgress(to: NodeID)
    /// The leader holds too many uncommitted bytes; retry later (R25).
    case uncommittedLimit(bytes: Int)
    /// A membership change is still uncommitted, or the leader has not yet committed an entry of
    /// its term (R20).
    case membershipChangePending
    case invalidMembershipChange(String)
    /// Invalid configuration of the core.
    case invalidConfiguration(String)
    /// A learner cannot be promoted yet: this leader does not know which incarnation of it to
    /// admit (it has not connected since this leader started). Automatic promotion waits for it.
    case incarnationUnknown(NodeID)
    /// The requested compaction index is not in the applied log.
    case compactionOutOfRange(index: UInt64, applied: UInt64, snapshot: UInt64)
    /// The state handed to `RaftNode.init(configuration:restoring:)` breaks the log's shape: entries
    /// that do not start right after the snapshot or are not consecutive, terms that go down, or a
    /// commit index beyond the last entry. The driver must refuse to start rather than guess.
    case invalidPersistedState(String)

    public var description: String {
        switch self {
        case .notLeader(let leader): return leader == 0 ? "not the leader (no leader known)" : "not the leader (leader is node \(leader))"
        case .noLeader: return "no leader is known"
        case .transferInProgress(let to): return "leadership is being transferred to node \(to)"
        case .uncommittedLimit(let bytes): return "too many uncommitted bytes (\(bytes)); try again later"
        case .membershipChangePending: return "a membership change is pending, or the leader has not committed an entry of its term yet"
        case .invalidMembershipChange(let why): return "invalid membership change: \(why)"
        case .invalidConfiguration(let why): return "invalid Raft configuration: \(why)"
        case .incarnationUnknown(let id):
            return "the incarnation of learner \(id) is unknown to this leader (it has not connected to it yet); promotion waits until it has"
        case let .compactionOutOfRange(index, applied, snapshot):
            return "cannot compact through \(index): applied \(applied), snapshot \(snapshot)"
        case .invalidPersistedState(let why): return "the persisted Raft state is inconsistent: \(why)"
        }
    }
}

/// How ReadIndex confirms leadership.
public enum ReadMode: Sendable, Equatable {
    /// A heartbeat round to a quorum confirms leadership for every read (linearizable, no clock
    /// assumption).
    case safe
    /// The leader answers without a round trip while it holds a lease: a quorum acknowledged a
    /// heartbeat it sent at tick t, and those followers refuse every vote for `electionTicks` of
    /// their own ticks after receiving it, so no other leader can exist before t +
    /// `electionTicks`. The leader uses the lease until t + `electionTicks` − `leaseMarginTicks`
    /// of its own ticks. Clock assumption: over an election timeout, no node's tick rate differs
    /// from the leader's by more than the margin, and the leader process is never paused for
    /// longer than the margin (a paused or slow-clocked leader would serve stale reads). Without
    /// a lease (just elected, transfer pending, lease expired) reads fall back to the safe round.
    /// Requires `checkQuorum` (R18).
    case leaseBased
}

/// Tunables of the core.
public struct RaftConfiguration: Sendable {
    public var id: NodeID
    /// Ticks without hearing from a leader before a follower campaigns (randomised in
    /// `[electionTicks, 2 * electionTicks)`).
    public var electionTicks: Int = 10
    public var heartbeatTicks: Int = 1
    public var preVote: Bool = true
    public var checkQuorum: Bool = true
    public var readMode: ReadMode = .safe
    /// Safety margin of lease reads, in ticks (see `ReadMode.leaseBased`).
    public var leaseMarginTicks: Int = 2
    /// Upper bound on entry bytes in one append message (at least one entry is always sent).
    public var maxMessageBytes: Int = 1 << 20
    /// Append messages in flight per follower in the replicate state.
    public var maxInflightMessages: Int = 256
    /// Entry bytes in flight per follower.
    public var maxInflightBytes: Int = 32 << 20
    /// Payload bytes the leader accepts beyond its commit index before refusing proposals.
    public var maxUncommittedBytes: Int = 64 << 20
    public var snapshotChunkBytes: Int = 1 << 20
    /// The leader promotes a learner once it is this close to the leader's last index.
    public var autoPromoteLearners: Bool = true
    public var promotionLag: UInt64 = 64
    /// Seed for the randomised election timeout.
    public var seed: UInt64
    /// This node's incarnation: a random nonzero identity its driver created when the data
    /// directory was blank (`NodeStorage.incarnation`), the same at every restart from that
    /// directory. A node whose `mayVote` is false regains its vote only from a configuration that
    /// names its id with this incarnation (R22): one it holds, committed or not, or the one a
    /// candidate's vote request reports (`Message.Body.vote`'s `voterIncarnation`). 0 means unknown (legacy):
    /// the node then regains its vote from any committed configuration naming it as a learner,
    /// as before incarnations existed, and as a leader it promotes learners whose incarnation it
    /// does not know.
    public var incarnation: UInt64 = 0
    /// Simulator self-tests only (`Sabotage`: the switches the Raft core reads, such as
    /// `.replayedAdmission` or `.amnesiacAcknowledgements`); the server never sets it.
    public var sabotage: Sabotage = .none

    public init(id: NodeID, seed: UInt64) {
        self.id = id
        self.seed = seed
    }

    public func validate() throws(RaftError) {
        guard id != 0 else { throw .invalidConfiguration("node id 0 is reserved") }
        guard heartbeatTicks >= 1 else { throw .invalidConfiguration("heartbeatTicks must be at least 1") }
        guard electionTicks > heartbeatTicks else {
            throw .invalidConfiguration("electionTicks must be greater than heartbeatTicks")
        }
        guard maxInflightMessages >= 1, maxInflightBytes >= 1, maxMessageBytes >= 1, snapshotChunkBytes >= 1 else {
            throw .invalidConfiguration("flow-control limits must be positive")
        }
        if readMode == .leaseBased && !checkQuorum {
            throw .invalidConfiguration("lease-based reads require checkQuorum")
        }
        if readMode == .leaseBased && (leaseMarginTicks < 1 || leaseMarginTicks >= electionTicks) {
            throw .invalidConfiguration("leaseMarginTicks must be at least 1 and below electionTicks")
        }
    }
}
