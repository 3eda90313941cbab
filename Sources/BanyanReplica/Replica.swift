public import BanyanBasics
public import BanyanRaft
public import BanyanStateMachine
public import BanyanTree

/// Identifies one client request inside a node (the driver's choice; never crosses the wire).
public typealias RequestID = UInt64

/// Why a client request failed, with what the client needs to act.
public enum ReplicaError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Too many requests are waiting; retry later (HTTP 503).
    case overloaded(String)
    /// The request did not finish in time. For a write the outcome is unknown: it may still
    /// apply (it keeps its identity, so it applies at most once).
    case timedOut(write: Bool)
    /// Only the leader accepts this (membership changes, transfers); `leader` is 0 when unknown.
    case notLeader(leader: NodeID)
    /// The consensus core refused the operation.
    case refused(RaftError)
    /// A write named a client session this replica has not opened (or has closed).
    case unknownSession(UInt64)

    public var description: String {
        switch self {
        case .overloaded(let why): return "overloaded: \(why)"
        case .timedOut(let write):
            return write
                ? "the write did not commit in time; it may still be applied" : "the read could not be confirmed in time"
        case .notLeader(let leader): return leader == 0 ? "no leader is known" : "not the leader (leader is node \(leader))"
        case .refused(let e): return e.description
        case .unknownSession(let s): return "session \(String(s, radix: 16)) is not open on this node"
        }
    }
}

/// Tunables of the replica loop (ticks are the Raft core's ticks).
public struct ReplicaConfiguration: Sendable {
    public var raft: RaftConfiguration
    /// Take a snapshot once this many entries were applied since the last one.
    public var snapshotEntries: UInt64 = 100_000
    /// ...or once the entries applied since the last one carry this many payload bytes, or as
    /// many as the last snapshot image if that is larger (a snapshot then costs at most about
    /// what the log it replaces cost to write, and the log held in memory stays near the
    /// larger of the two: docs/replica.md, "Snapshots by bytes"). 0: by entries only.
    public var snapshotLogBytes: UInt64 = 1 << 30
    /// While the leader streams its snapshot to a live follower, a new snapshot waits (it would
    /// restart the stream from the first byte, and a follower whose transfer takes longer than
    /// `snapshotEntries` writes would never catch up), until this many times `snapshotEntries`
    /// were applied since the last one. (A snapshot taken mid-stream then compacts only to the
    /// streamed one: `compactionWaitsForStreams`; the log kept is bounded by
    /// `streamHoldLimitBytes`.)
    public var snapshotDeferral: UInt64 = 4
    /// A snapshot written while the leader streams an older one to a live follower compacts the
    /// log only through the streamed one, so the stream finishes and the follower catches up
    /// from the log after it (`compactionPoint(for:)`). False only to show the stall it
    /// prevents (tests).
    public var compactionWaitsForStreams = true
    /// The hold ends, and the next snapshot compacts as usual (restarting the stream), once the
    /// log kept since the compaction point carries `snapshotDeferral` times the larger of this
    /// and the snapshot byte bound: the log in memory stays bounded whatever the stream does.
    public var streamHoldMinimumBytes: UInt64 = 64 << 20
    /// Re-propose a write, or re-ask for a read index, not finished after this many ticks.
    public var retryTicks: Int = 30
    /// Fail a request not finished after this many ticks.
    public var requestTimeoutTicks: Int = 300
    /// Requests waiting at once (writes and reads each); beyond it new ones are refused.
    public var maxPendingRequests: Int = 200_000
    /// Payload bytes per proposal (a forwarded proposal is one peer frame, at most 64 MiB; a
    /// single larger write is proposed alone).
    public var maxProposalBytes: Int = 8 << 20
    /// Payload bytes a leader proposes per `Ready` (at least one write): the rest waits for the
    /// next one, so one round never carries many large writes (docs/server.md, "Large writes").
    public var maxReadyBytes: Int = 8 << 20
    /// Command entries of at least this many bytes are read ahead (`ReplicaEvent.prepare`) before
    /// they apply, by the driver, off the thread that ticks Raft (docs/replica.md, "Prepared
    /// entries"). `Int.max`: never.
    public var prepareThreshold: Int = 128 << 10
    /// Entries being read ahead at once (beyond the one next to apply, which is always asked for).
    public var maxPreparing: Int = 4
    /// Command payloads of at least this many bytes are large for admission (below).
    public var largeEntryBytes: Int = 1 << 20
    /// A leader keeps at most this many large entries appended and not yet applied: a later
    /// large write waits for room while small ones go ahead of it, so a small write waits for
    /// at most this many large ones (docs/replica.md, "Large writes wait their turn"). 0: no
    /// limit.
    public var maxLargeInFlight: Int = 1
    /// Bytes of forwarded commands a leader holds while they wait for room (large ones, and
    /// those of an ordered session behind one); further ones are dropped, and their follower
    /// proposes them again after `retryTicks`.
    public var maxHeldForwardedBytes: Int = 128 << 20
    /// Commands of at least this many bytes are staged instead of proposed (docs/staged-payloads.md):
    /// the leader stores the payload on a quorum first, then proposes a small reference entry
    /// in its place, so entries behind it never wait for the payload. A staged command counts
    /// as large for admission. `Int.max`: never.
    public var stagingThreshold: Int = .max

    public init(raft: RaftConfiguration) {
        self.raft = raft
    }
}

/// What the replica tells its driver, in order.
public enum ReplicaEvent: Sendable {
    /// A command applied (on every node, whoever issued it). `request` is set when this node's
    /// client issued it. `tree` is the namespace's tree right after this command, for live views:
    /// set only for namespaces in `Replica.treesFor` (else `.empty`), because a kept version
    /// makes the next write copy its path instead of changing the tree in place.
    case applied(StateMachine.Applied, tree: Tree, request: RequestID?)
    /// These reads may now be served from `Replica.machine` (linearizable at this moment).
    case readsReady([RequestID])
    case failed(RequestID, ReplicaError)
    /// A membership change this node's operator asked for committed and applied.
    case membershipChanged(RequestID, Membership)
    /// The state machine was replaced by a snapshot from the leader (live views must resend).
    case restoredFromSnapshot(SnapshotMeta)
    /// Time for a snapshot of `Replica.machine` as it is now, at `meta.index`. The driver writes
    /// it (in the background; the machine is a value) and then calls `snapshotWritten(_:)`.
    case snapshotDue(SnapshotMeta)
    case roleChanged(role: RaftRole, leader: NodeID, term: UInt64)
    /// Read this entry ahead (`PreparedCommand(payload:)`, on any thread) and hand the result to
    /// `prepared(index:term:_:)`: once committed, entries from it on wait to apply until then.
    /// Asked for when the entry is written to this node's log (or, past `maxPreparing`, when it
    /// is next to apply).
    case prepare(index: UInt64, term: UInt64, payload: [UInt8])
    /// Store this payload in the staged store as `id`, durably, off this thread; then call
    /// `stagedStored(_:checksum:)`, or `stagedStoreFailed(_:)` (docs/staged-payloads.md).
    case storeStaged(StageID, [UInt8])
    /// Read staged payload `id` ahead (`PreparedCommand(payload:)`) from these bytes, or, when
    /// nil, from the staged store; then call `preparedStaged(_:_:)`.
    case prepareStaged(StageID, [UInt8]?)
    /// A peer asked for staged payload `id`: read it from the staged store and call
    /// `stagedRead(_:_:for:)`.
    case serveStaged(StageID, to: NodeID)
    /// Remove these staged files: no entry in this node's log above its compaction point names
    /// them, and none is being staged or read.
    case removeStaged([StageID])
}

/// What the driver found when it read a staged payload ahead (`ReplicaEvent.prepareStaged`).
public enum StagedPreparation: Sendable {
    /// Read (nil: the payload is no command envelope, and applies as malformed); `checksum` is
    /// the CRC32C of the bytes read.
    case prepared(PreparedCommand?, checksum: UInt32)
    /// The staged store does not hold it (absent, or damaged).
    case missing
}

/// Counts of the staging protocol (docs/staged-payloads.md), for tests, metrics and the simulator.
public struct StagingCounts: Sendable, Equatable {
    /// Leader: stagings started, references proposed, stagings dropped (deadline or step-down).
    public var started = 0
    public var referenced = 0
    public var abandoned = 0
    /// Appends dropped because they named a payload this node did not hold yet.
    public var appendsHeld = 0
    /// Payloads received in answer to `fetchStaged`, and staged files removed.
    public var fetched = 0
    public var removed = 0
    /// References applied.
    public var applied = 0

    public init() {}
}

/// The replica loop's pure core: the Raft node, the state machine it feeds, and the client
/// requests waiting on both (docs/replica.md).
///
/// The driver delivers ticks (with the wall clock, for server timestamps), peer messages and
/// client requests; then runs `ready()`: persist, send, and hand the result back to
/// `advance(_:installed:)`, which applies committed entries. Everything it must tell clients
/// comes out of `takeEvents()`.
public struct Replica: Sendable {
    public let configuration: ReplicaConfiguration
    public private(set) var raft: RaftNode
    public private(set) var machine: StateMachine
    /// This incarnation's client session (random per start, so sequence numbers never repeat).
    public let session: UInt64
    /// The next sequence number of this incarnation's own session.
    public var nextSeq: UInt64 { counters[session]?.next ?? 1 }
    /// The wall clock (ms since the epoch) as of the last tick.
    public private(set) var wallClock: Int64
    /// The largest timestamp this node stamped as leader (never goes backwards).
    private var lastStamp: Int64 = 0
    private var ticks = 0

    private struct PendingWrite: Sendable {
        var request: RequestID
        var payload: [UInt8]
        var lastProposedTick: Int
        var deadline: Int
        /// Proposed at least once: a copy may be in some log, so a later refusal must not be
        /// reported as a failure (the write can still apply; only its deadline ends the wait).
        var proposed = false
        /// A copy applied as `outOfOrder` (an ordered session's predecessor was missing): it is
        /// proposed again as soon as nothing of its session before it waits here.
        var parked = false
        /// When this large write began to wait for room (admission: its place in `waitOrder`), if
        /// it waits.
        var heldSince: UInt64?
        /// Times proposed again by the retry timer (a large write's retries back off).
        var retries = 0
        /// Staged by this node as leader (docs/staged-payloads.md): until its reference is
        /// proposed (`proposed`), it is in no log.
        var staged = false
    }
    /// A write's identity in the log: its session and sequence number.
    struct WriteKey: Hashable, Comparable, Sendable {
        var session: UInt64
        var seq: UInt64
        static func < (a: WriteKey, b: WriteKey) -> Bool { (a.session, a.seq) < (b.session, b.seq) }
    }
    /// Per open session: the next sequence number, and no sequence number below `lowestPending`
    /// is still waiting (see `CommandEnvelope.settledBelow`; advanced lazily, so finding it
    /// costs O(1) amortised).
    private struct SessionCounter: Sendable {
        var next: UInt64 = 1
        var lowestPending: UInt64 = 1
        /// Its commands apply strictly in sequence order (`CommandEnvelope.ordered`).
        var ordered = false
    }
    /// This incarnation's own session and the client sessions opened with `openSession` (a
    /// realtime connection's writes and onDisconnect commands are its own session's, so the
    /// state machine can tell them apart: docs/realtime.md).
    private var counters: [UInt64: SessionCounter] = [:]
    private var writes: [WriteKey: PendingWrite] = [:]
    /// Writes to propose at the next `ready()` (batched into one proposal).
    private var toPropose: [WriteKey] = []
    /// The same keys as `toPropose`, for O(1) membership in the retry scan.
    private var queued: Set<WriteKey> = []
    /// Writes parked after an `outOfOrder` copy applied (see `PendingWrite.parked`).
    private var parkedCount = 0
    /// As leader: the commands this leader appended in its term and has not applied yet, by
    /// identity, with the index of the last copy. A copy proposed again (a follower's retry, or
    /// this node's) while one waits in this leader's log is dropped: a leader never loses its own
    /// term's entries, so the waiting copy commits, or the leadership ends and this is cleared.
    private var appendedInTerm: [WriteKey: UInt64] = [:]
    private var appendedTerm: UInt64 = 0
    /// `appendedInTerm`'s size past which applied entries are swept (amortised O(1) per entry).
    private var appendedSweepAt = 4_096
    /// Copies dropped that way (tests and metrics).
    public private(set) var droppedRetries = 0

    /// A read and its own deadline (reads batched into one round keep their own deadlines).
    private struct WaitingRead: Sendable {
        var request: RequestID
        var deadline: Int
    }
    private struct PendingRead: Sendable {
        var requests: [WaitingRead]
        var askedTick: Int
        var index: UInt64?
    }
    /// ReadIndex contexts: unique per incarnation (they start at the random `session`), so an
    /// answer meant for an earlier incarnation, or for a retried round, matches no waiting read.
    private var nextReadContext: UInt64
    private var reads: [UInt64: PendingRead] = [:]
    /// Reads to start at the next `ready()` (one ReadIndex round for all of them).
    private var newReads: [WaitingRead] = []

    private var membershipRequests: [(request: RequestID, index: UInt64, deadline: Int)] = []
    private var snapshotInProgress: UInt64?
    /// Payload bytes of the entries applied since the newest snapshot, the part of them a
    /// snapshot being written covers, and the newest snapshot image's size (the driver tells).
    public private(set) var logBytesSinceSnapshot: UInt64 = 0
    /// Payload bytes applied since the compaction point: what the log in memory holds (more than
    /// `logBytesSinceSnapshot` while a stream holds compaction back).
    public private(set) var logBytesKept: UInt64 = 0
    private var logBytesCoveredByDue: UInt64 = 0
    /// The newest snapshot written here (the log may be compacted only to an older one, held
    /// for a stream: `compactionPoint(for:)`); the next snapshot counts from it.
    private var newestSnapshotIndex: UInt64 = 0
    public private(set) var snapshotImageBytes: UInt64 = 0
    /// Committed entries Raft handed over that have not applied yet (from `applyHead` on): they
    /// wait while the next one is a large command being read ahead.
    private var applyQueue: [LogEntry] = []
    private var applyHead = 0
    /// Large entries read ahead (`ReplicaEvent.prepare`), by index, with the term of the entry
    /// read (an entry not yet committed may be replaced by another at its index): asked for at a
    /// tick, or done (nil: the payload is not a command envelope, and applies as it is).
    private enum ReadAhead {
        case asked(term: UInt64, tick: Int)
        case done(term: UInt64, PreparedCommand?)
        var term: UInt64 {
            switch self {
            case .asked(let term, _), .done(let term, _): term
            }
        }
    }
    private var readAhead: [UInt64: ReadAhead] = [:]
    /// Read-aheads asked for and not done.
    private var asking = 0
    private var events: [ReplicaEvent] = []
    private var lastRole: RaftRole = .follower
    private var lastLeader: NodeID = 0

    /// Which namespaces' `.applied` events carry the tree after the command (the driver sets
    /// the namespaces it has live views of). Nil: every namespace.
    public var treesFor: Set<String>? = nil
    /// Set by the driver while it paces the leader's rounds (`RoundPacer`): `ready()` then
    /// proposes nothing new. This node's queued writes wait, and on the leader so do proposals
    /// forwarded by followers; commits, applies, answers, reads and heartbeats go on as usual.
    public var holdProposals = false
    /// Proposals forwarded by followers that arrived while `holdProposals` was set (leader only;
    /// proposed, restamped, by the next `ready()` that does not hold).
    private var heldForwarded: [[[UInt8]]] = []
    /// As leader: the indexes of the large entries (`largeEntryBytes`) appended in `largeTerm`
    /// and not applied yet, at most `maxLargeInFlight` (admission, "Large writes wait their turn").
    private var largeInFlight: [UInt64] = []
    private var largeTerm: UInt64 = 0
    /// As leader: forwarded commands waiting for room, in arrival order (unstamped), with their
    /// identities and bytes (a follower's retry of one held is dropped).
    private struct Held {
        var key: WriteKey
        var payload: [UInt8]
        var ordered: Bool
        var large: Bool
        /// The tick it was first held (it is dropped at the request timeout).
        var since: Int
        /// Its place among the large writes waiting for room (`waitOrder`).
        var order: UInt64
    }
    private var heldForRoom: [Held] = []
    private var heldForRoomKeys: Set<WriteKey> = []
    public private(set) var heldForRoomBytes = 0
    /// Numbers the large writes, own and forwarded, in the order they begin to wait for room:
    /// room goes to the lowest (first come, first served; ticks would tie).
    private var waitOrder: UInt64 = 0
    /// Large writes that began to wait for room (tests and metrics; one that waits again, a
    /// retry of a write proposed before, counts again).
    public private(set) var largeWritesHeld = 0

    // MARK: Staged payloads (docs/staged-payloads.md)

    /// What this node knows of a staged payload.
    private struct StagedPayload {
        /// The file is durable in this node's staged store.
        var durable = false
        /// A store was asked for and has not answered.
        var storing = false
        /// Peers that sent it by `stage` and wait for this node's acknowledgement (sent once the
        /// file is durable), and those to tell again once its read-ahead is done.
        var ackTo: Set<NodeID> = []
        var readyTo: Set<NodeID> = []
        var read: StagedRead = .none
        /// The tick it was first seen (unnamed files are removed once old enough).
        var firstSeen: Int
    }
    private enum StagedRead {
        case none
        case asked(tick: Int)
        case done(PreparedCommand?, checksum: UInt32)
        var isAsked: Bool {
            if case .asked = self { return true }
            return false
        }
        var isHeld: Bool {
            if case .none = self { return false }
            return true
        }
    }
    private var stagedPayloads: [StageID: StagedPayload] = [:]
    /// Payloads an applying reference needs and this node does not hold: asked of every other
    /// member each `retryTicks` (the tick of the last ask).
    private var fetching: [StageID: Int] = [:]
    /// When `fetchStaged` was last sent for an id because an append named it (per id, at most
    /// once per `retryTicks`).
    private var fetchAskedForAppend: [StageID: Int] = [:]
    /// As leader: a staging in progress.
    private struct Staging {
        var key: WriteKey
        var payload: [UInt8]
        var ordered: Bool
        /// Other members that acknowledged it durable (with the checksum this node stored), and
        /// those that have read it ahead too.
        var acks: Set<NodeID> = []
        var ready: Set<NodeID> = []
        /// This node's own copy is durable, with this checksum.
        var ownChecksum: UInt32?
        var lastSent: Int
        var sends = 1
        var started: Int
        var deadline: Int
    }
    private var stagings: [StageID: Staging] = [:]
    private var stagingKeys: [WriteKey: StageID] = [:]
    /// Stagings that reached their quorum, proposed (in order) by the next `ready()`.
    private var referencesDue: [StageID] = []
    /// The term the stagings belong to, and the last counter of this leader in it.
    private var stagingTerm: UInt64 = 0
    private var lastStageN: UInt64 = 0
    private var lastStagedSweep = 0
    /// The checksum of each staged file this node stored (or read back).
    private var stagedChecksums: [StageID: UInt32] = [:]
    /// The references compaction dropped from the log, by index, kept while the driver still
    /// serves those entries (`stagedRetentionFloor`).
    private var compactedReferences: [(index: UInt64, id: StageID)] = []
    /// The driver serves compacted entries from this index on (the server's archive and reads of
    /// the past: docs/backup.md), so the staged files their references name stay too; nil: it
    /// serves none.
    public var stagedRetentionFloor: UInt64? {
        didSet {
            guard let floor = stagedRetentionFloor else { return compactedReferences = [] }
            if let first = compactedReferences.first, first.index < floor { compactedReferences.removeAll { $0.index < floor } }
        }
    }
    public private(set) var stagingCounts = StagingCounts()

    /// Starts from what the driver loaded: Raft's persisted state and the state machine restored
    /// from the newest snapshot (its `appliedIndex` is the snapshot's index).
    public init(
        configuration: ReplicaConfiguration, persisted: PersistedState, machine: StateMachine, session: UInt64, now: Int64
    ) throws(RaftError) {
        self.configuration = configuration
        self.raft = try RaftNode(configuration: configuration.raft, restoring: persisted)
        self.machine = machine
        self.session = session
        self.counters = [session: SessionCounter()]
        self.nextReadContext = configuration.raft.sabotage == .reusedReadContexts ? 1 : session
        self.wallClock = now
    }

    public var pendingWrites: Int { writes.count }
    public var pendingReads: Int { reads.values.reduce(newReads.count) { $0 + $1.requests.count } }

    // MARK: - Inputs

    /// One Raft tick; `now` is the wall clock. Retries and timeouts run here.
    public mutating func tick(now: Int64) {
        self.wallClock = now
        ticks += 1
        raft.tick()
        // Sorted, so each session's lowest waiting number comes first: every number below it
        // is applied or given up, which a retry's watermark may now say.
        var session: UInt64?
        var lowest: UInt64 = 0
        for (key, w) in writes.sorted(by: { $0.key < $1.key }) {
            if ticks >= w.deadline {
                writes[key] = nil
                if w.parked { parkedCount -= 1 }
                // A staging of it still in progress ends with it: its reference is not proposed
                // (the write would apply after being reported as refused: simulator seeds 267
                // and 589 found it).
                if let id = stagingKeys.removeValue(forKey: key) {
                    stagings[id] = nil
                    referencesDue.removeAll { $0 == id }
                    stagingCounts.abandoned += 1
                }
                if w.heldSince != nil || w.staged, !w.proposed {
                    // Never handed to Raft: certainly in no log.
                    events.append(
                        .failed(
                            w.request,
                            .overloaded(
                                w.staged
                                    ? "it was staged but not stored on a quorum before its deadline"
                                    : "it waited for room behind large writes until its deadline")))
                } else {
                    events.append(.failed(w.request, .timedOut(write: true)))
                }
                continue
            }
            if key.session != session {
                session = key.session
                lowest = key.seq
            }
            // A parked write waits for its predecessor (`proposeUnparked`): proposed now, it would
            // only be out of order again.
            // A large write's retries back off (twice the interval each time, up to eight
            // times): a leader may hold it for room, and each copy resends the whole body.
            let interval = isLarge(w.payload.count) ? configuration.retryTicks << min(w.retries, 3) : configuration.retryTicks
            if ticks - w.lastProposedTick >= interval, !queued.contains(key), !w.parked {
                // Lost with a leader change, or never forwarded: propose again under the same
                // identity (the state machine applies it at most once).
                var retry = w
                retry.retries += 1
                retry.payload = CommandEnvelope.resettled(w.payload, settledBelow: lowest)
                writes[key] = retry
                toPropose.append(key)
                queued.insert(key)
            }
        }
        for (context, r) in reads.sorted(by: { $0.key < $1.key }) {
            let live = expireReads(r.requests)
            if live.isEmpty {
                reads[context] = nil
            } else if r.index == nil, ticks - r.askedTick >= configuration.retryTicks {
                reads[context] = nil
                newReads.append(contentsOf: live)
            } else if live.count != r.requests.count {
                reads[context]?.requests = live
            }
        }
        // A predecessor that timed out above unblocks the parked writes behind it.
        if parkedCount > 0 { proposeUnparked() }
        // Forwarded commands held past a request's timeout: their followers gave up on them.
        if let first = heldForRoom.first, ticks - first.since >= configuration.requestTimeoutTicks {
            heldForRoom.removeAll { ticks - $0.since >= configuration.requestTimeoutTicks }
            heldForRoomKeys = Set(heldForRoom.map(\.key))
            heldForRoomBytes = heldForRoom.reduce(0) { $0 + $1.payload.count }
        }
        // A read-ahead whose answer never came (a driver that lost it) is asked for again.
        for (index, state) in readAhead {
            if case .asked(_, let tick) = state, ticks - tick >= 10 * configuration.retryTicks { forgetReadAhead(index) }
        }
        askForPreparation()
        tickStaging()
        newReads = expireReads(newReads)
        membershipRequests.removeAll { m in
            guard ticks >= m.deadline else { return false }
            events.append(.failed(m.request, .timedOut(write: true)))
            return true
        }
    }

    public mutating func receive(_ m: Message) {
        switch m.body {
        case .stage, .stageAck, .fetchStaged, .stagedPayload:
            // The replica's own protocol (docs/staged-payloads.md); Raft never sees it.
            return receiveStaging(m)
        case .append(_, _, let entries, _) where m.term >= raft.term:
            // I1: a follower accepts an append only if it holds every payload it names.
            if !holdsPayloads(named: entries, sender: m.from) {
                stagingCounts.appendsHeld += 1
                return
            }
        default:
            break
        }
        // The leader stamps forwarded proposals with its own clock (docs/replica.md); a message
        // from a higher term goes to the core first (it steps down and drops or forwards it).
        if case .proposal(let commands) = m.body, raft.role == .leader, m.term <= raft.term {
            if holdProposals { heldForwarded.append(commands) } else { proposeForwarded([commands]) }
            return
        }
        raft.step(m)
    }

    /// Proposes batches forwarded by followers, each stamped with the leader's clock (a batch
    /// refused by flow control is dropped: its follower proposes it again after `retryTicks`).
    private mutating func proposeForwarded(_ batches: [[[UInt8]]]) {
        for commands in batches { admitForwarded(commands.map { ($0, nil) }) }
    }

    /// Stamps and proposes forwarded commands, in order, in proposals of at most
    /// `maxProposalBytes` (a larger one alone), holding those without room (admission): a large
    /// one while `maxLargeInFlight` large entries are unapplied or an older large one is held,
    /// and what follows a held one in its ordered session. `since`: when a command released from
    /// `heldForRoom` was first held (nil for one just forwarded).
    private mutating func admitForwarded(_ items: [(command: [UInt8], since: (tick: Int, order: UInt64)?)]) {
        let stamp = nextStamp()
        var room = largeRoom()
        // What follows a held command, or one being staged, in its ordered session waits too.
        var heldOrdered = Set(heldForRoom.lazy.filter(\.ordered).map(\.key.session)).union(stagings.values.lazy.filter(\.ordered).map(\.key.session))
        var heldLarge = heldForRoom.contains { $0.large }
        // Whether one of this leader's own large writes waits for room (asked once, if needed).
        var ownLargeWaits: Bool?
        var keys: [WriteKey] = []
        var stamped: [[UInt8]] = []
        var bytes = 0
        for (command, since) in items {
            var key = WriteKey(session: 0, seq: 0)
            if let header = CommandEnvelope.header(of: command) {
                key = WriteKey(session: header.session, seq: header.seq)
                if waitsOrApplied(key) || heldForRoomKeys.contains(key) {
                    droppedRetries += 1
                    continue
                }
                let large = isLarge(command.count)
                // First come, first served: a new large command queues behind held ones and
                // behind this leader's own large writes that wait.
                if large, since == nil, room > 0, !heldLarge, ownLargeWaits == nil { ownLargeWaits = oldestOwnLargeWaiting() != nil }
                if (large && (room == 0 || (since == nil && (heldLarge || ownLargeWaits == true)))) || heldOrdered.contains(key.session) {
                    if since == nil { waitOrder += 1 }
                    let held = Held(key: key, payload: command, ordered: header.ordered, large: large, since: since?.tick ?? ticks, order: since?.order ?? waitOrder)
                    if holdForRoom(held), large {
                        heldLarge = true
                        if since == nil { largeWritesHeld += 1 }
                    }
                    if header.ordered { heldOrdered.insert(key.session) }
                    continue
                }
                if large { room -= 1 }
                if command.count >= configuration.stagingThreshold, let restamped = CommandEnvelope.restamped(command, timestamp: stamp) {
                    startStaging(key, restamped, ordered: header.ordered)
                    if header.ordered { heldOrdered.insert(key.session) }
                    continue
                }
            }
            guard let restamped = CommandEnvelope.restamped(command, timestamp: stamp) else { continue }
            if !stamped.isEmpty, bytes + restamped.count > configuration.maxProposalBytes {
                if let outcome = try? raft.propose(stamped) { noteAppended(keys, outcome, stamped) }
                keys = []
                stamped = []
                bytes = 0
            }
            keys.append(key)
            stamped.append(restamped)
            bytes += restamped.count
        }
        if !stamped.isEmpty, let outcome = try? raft.propose(stamped) { noteAppended(keys, outcome, stamped) }
    }

    /// Keeps a forwarded command until there is room for it (`proposeHeldForRoom`); past
    /// `maxHeldForwardedBytes` it is dropped instead, and its follower proposes it again.
    private mutating func holdForRoom(_ held: Held) -> Bool {
        guard heldForRoomBytes + held.payload.count <= configuration.maxHeldForwardedBytes else { return false }
        heldForRoom.append(held)
        heldForRoomKeys.insert(held.key)
        heldForRoomBytes += held.payload.count
        return true
    }

    /// Proposes the forwarded commands held for room, in order, as far as there is room now,
    /// unless one of this leader's own large writes has waited longer (it goes first).
    private mutating func proposeHeldForRoom() {
        guard !heldForRoom.isEmpty else { return }
        if raft.role == .leader {
            // Without room nothing held can go: each is large, or behind a large one of its
            // ordered session.
            guard largeRoom() > 0 else { return }
            if let oldestHeld = heldForRoom.first(where: \.large)?.order, let oldestOwn = oldestOwnLargeWaiting(), oldestOwn < oldestHeld {
                return
            }
        }
        let held = heldForRoom
        heldForRoom = []
        heldForRoomKeys = []
        heldForRoomBytes = 0
        // Leadership lost meanwhile: the followers propose them again after `retryTicks`.
        guard raft.role == .leader else { return }
        admitForwarded(held.map { ($0.payload, ($0.since, $0.order)) })
    }

    /// The place in `waitOrder` of this node's oldest large write waiting for room.
    private func oldestOwnLargeWaiting() -> UInt64? {
        var oldest: UInt64?
        for key in toPropose {
            guard let since = writes[key]?.heldSince else { continue }
            oldest = min(oldest ?? since, since)
        }
        return oldest
    }

    /// Room for more large entries in this leader's log (`maxLargeInFlight`; `.max` without a
    /// limit). Entries applied, or of an earlier term or leadership, no longer count.
    private mutating func largeRoom() -> Int {
        guard configuration.maxLargeInFlight > 0 else { return .max }
        if raft.role != .leader || raft.term != largeTerm {
            largeInFlight = []
            largeTerm = raft.term
        }
        let applied = machine.appliedIndex
        if let first = largeInFlight.first, first <= applied { largeInFlight.removeAll { $0 <= applied } }
        dropStagingsIfNotLeading()
        return max(0, configuration.maxLargeInFlight - largeInFlight.count - stagings.count)
    }

    /// As leader: a copy of this command waits in this term's log, or the command applied.
    private func waitsOrApplied(_ key: WriteKey) -> Bool {
        guard raft.role == .leader else { return false }
        if appendedTerm == raft.term, appendedInTerm[key] != nil { return true }
        if stagingTerm == raft.term, stagingKeys[key] != nil { return true }
        return machine.sessions[key.session]?.contains(key.seq) == true
    }

    /// Records what this leader appended (keys in payload order; session 0 is no identity), and
    /// where its large entries went (admission).
    private mutating func noteAppended(_ keys: [WriteKey], _ outcome: RaftNode.ProposalOutcome, _ payloads: [[UInt8]]) {
        guard case .appended(let first, _, let term) = outcome else { return }
        if appendedTerm != term {
            appendedTerm = term
            appendedInTerm = [:]
        }
        for (i, key) in keys.enumerated() where key.session != 0 { appendedInTerm[key] = first + UInt64(i) }
        guard configuration.maxLargeInFlight > 0 else { return }
        if largeTerm != term {
            largeTerm = term
            largeInFlight = []
        }
        for (i, payload) in payloads.enumerated() where isLarge(payload.count) {
            largeInFlight.append(first + UInt64(i))
        }
    }

    private mutating func nextStamp() -> Int64 {
        lastStamp = max(lastStamp, wallClock, machine.lastTimestamp)
        return lastStamp
    }

    /// Opens a client session on this node (a realtime connection's own; `id` random, as the
    /// node's own session is). False when the id is in use, or names a session the state machine
    /// already knows (an id must never be reused: its sequence numbers would be duplicates).
    /// Its commands apply in the order written (`ordered`, as a realtime connection's must).
    public mutating func openSession(_ id: UInt64, ordered: Bool = true) -> Bool {
        guard counters[id] == nil, machine.sessions[id] == nil, !writes.keys.contains(where: { $0.session == id }) else { return false }
        counters[id] = SessionCounter(ordered: ordered)
        return true
    }

    /// Closes a session opened with `openSession`: no new write may name it; those waiting end
    /// as usual (applied, or timed out). The node's own session cannot be closed.
    public mutating func closeSession(_ id: UInt64) {
        guard id != session else { return }
        counters[id] = nil
    }

    /// Sessions open on this node, its own included.
    public var openSessionCount: Int { counters.count }

    /// Submits a client write, in the node's own session or in `session` (opened with
    /// `openSession`). The outcome arrives as `.applied` with this request id (or `.failed`).
    /// `auth` names the client the namespace's rules judge the write for (nil: not judged).
    /// `clientWrite`: the client's own name for the write (an SDK's client id and write number),
    /// which the state machine applies at most once whatever session carries it.
    public mutating func write(
        _ request: RequestID, namespace: String, command: Command, session chosen: UInt64? = nil, auth: ClientAuth? = nil,
        clientWrite: ClientWriteKey? = nil
    ) {
        guard writes.count < configuration.maxPendingRequests else {
            events.append(.failed(request, .overloaded("\(writes.count) writes are waiting")))
            return
        }
        let owner = chosen ?? session
        guard var counter = counters[owner] else {
            events.append(.failed(request, .unknownSession(owner)))
            return
        }
        let seq = counter.next
        counter.next += 1
        while counter.lowestPending < seq, writes[WriteKey(session: owner, seq: counter.lowestPending)] == nil { counter.lowestPending += 1 }
        counters[owner] = counter
        let payload = CommandEnvelope(
            namespace: namespace, session: owner, seq: seq, timestamp: 0, settledBelow: counter.lowestPending, ordered: counter.ordered,
            command: command, auth: auth, clientWrite: clientWrite
        ).encoded()
        let key = WriteKey(session: owner, seq: seq)
        writes[key] = PendingWrite(request: request, payload: payload, lastProposedTick: ticks, deadline: ticks + configuration.requestTimeoutTicks)
        toPropose.append(key)
        queued.insert(key)
    }

    /// Submits a linearizable read (ReadIndex). `.readsReady` says when to serve it.
    public mutating func read(_ request: RequestID) {
        guard pendingReads < configuration.maxPendingRequests else {
            events.append(.failed(request, .overloaded("\(pendingReads) reads are waiting")))
            return
        }
        newReads.append(WaitingRead(request: request, deadline: ticks + configuration.requestTimeoutTicks))
    }

    /// Asks for a membership change (leader only).
    public mutating func changeMembership(_ request: RequestID, _ change: MembershipChange) {
        do {
            let outcome = try raft.proposeMembershipChange(change)
            if case .appended(let first, _, _) = outcome {
                membershipRequests.append((request, first, ticks + configuration.requestTimeoutTicks))
            }
        } catch {
            if case .notLeader(let leader) = error {
                events.append(.failed(request, .notLeader(leader: leader)))
            } else {
                events.append(.failed(request, .refused(error)))
            }
        }
    }

    public mutating func transferLeadership(to target: NodeID) throws(ReplicaError) {
        do {
            try raft.transferLeadership(to: target)
        } catch {
            if case .notLeader(let leader) = error { throw .notLeader(leader: leader) }
            throw .refused(error)
        }
    }

    public mutating func campaign() { raft.campaign() }

    /// A peer's hello named its incarnation (the leader records it in membership changes).
    public mutating func noteIncarnation(of node: NodeID, _ incarnation: UInt64) {
        raft.noteIncarnation(of: node, incarnation)
    }

    /// The driver durably wrote the snapshot announced by `.snapshotDue`; the log before it may go.
    /// `imageBytes`: the snapshot file's size (0 when unknown).
    /// `compactedThrough`: where the driver compacted its files (`compactionPoint(for:)` when
    /// nil); the log in memory is compacted to the same point.
    public mutating func snapshotWritten(_ meta: SnapshotMeta, imageBytes: UInt64 = 0, compactedThrough: UInt64? = nil) {
        snapshotInProgress = nil
        logBytesSinceSnapshot -= min(logBytesCoveredByDue, logBytesSinceSnapshot)
        logBytesCoveredByDue = 0
        if imageBytes > 0 { snapshotImageBytes = imageBytes }
        newestSnapshotIndex = max(newestSnapshotIndex, meta.index)
        let through = min(meta.index, compactedThrough ?? compactionPoint(for: meta.index))
        if let floor = stagedRetentionFloor, !stagedPayloads.isEmpty {
            // The references this compaction drops, while the driver may still serve them.
            var index = max(raft.firstIndex, floor)
            while index <= through {
                if let entry = raft.entry(at: index), entry.kind == .command, let reference = StagedReference(decoding: entry.data) {
                    compactedReferences.append((index, reference.id))
                }
                index += 1
            }
        }
        _ = try? raft.compact(through: through)
        if through == meta.index { logBytesKept = logBytesSinceSnapshot }
        if !stagedPayloads.isEmpty { sweepStaged() }
    }

    /// The bytes of log kept since the compaction point beyond which a stream no longer holds
    /// compaction back.
    public var streamHoldLimitBytes: UInt64 {
        let (limit, overflow) = max(snapshotByteBound, configuration.streamHoldMinimumBytes).multipliedReportingOverflow(by: max(1, configuration.snapshotDeferral))
        return overflow ? .max : limit
    }

    /// How far a snapshot written at `index` may compact the log (and the older snapshots):
    /// to `index`, or, while the leader streams an older snapshot to a live follower, only to
    /// that one, whose image must stay readable and after which the follower continues from the
    /// log. The hold ends when the stream does (installed, or the follower silent for two
    /// election timeouts); the next snapshot then compacts as usual.
    public func compactionPoint(for index: UInt64) -> UInt64 {
        guard configuration.compactionWaitsForStreams, let streamed = raft.streamedSnapshotIndex, streamed < index, logBytesKept < streamHoldLimitBytes
        else { return index }
        return streamed
    }

    /// The size of the newest snapshot image, when the driver learns it otherwise (loaded at
    /// start, or installed from the leader).
    public mutating func noteSnapshotImage(bytes: UInt64) { snapshotImageBytes = bytes }

    /// The driver could not write the snapshot (it logs why); a later one will be tried.
    public mutating func snapshotFailed() {
        snapshotInProgress = nil
        logBytesCoveredByDue = 0
    }

    /// The leader's driver answers a snapshot chunk request.
    public mutating func snapshotChunk(to target: NodeID, meta: SnapshotMeta, offset: UInt64, data: [UInt8], last: Bool) {
        raft.snapshotChunk(to: target, meta: meta, offset: offset, data: data, last: last)
    }

    // MARK: - Staged payloads (docs/staged-payloads.md)

    /// Large for admission: a large entry, or a command staged.
    private func isLarge(_ bytes: Int) -> Bool { bytes >= configuration.largeEntryBytes || bytes >= configuration.stagingThreshold }

    /// Stagings belong to one leadership: a leader that stepped down (or moved to a new term)
    /// drops them. Their writes are in no log; their issuers propose them again.
    private mutating func dropStagingsIfNotLeading() {
        guard !stagings.isEmpty || !referencesDue.isEmpty, raft.role != .leader || raft.term != stagingTerm else { return }
        stagingCounts.abandoned += stagings.count
        stagings = [:]
        stagingKeys = [:]
        referencesDue = []
    }

    /// Starts staging `payload` (stamped), the write `key`: stores it here, reads it ahead, and
    /// sends it to every other member.
    private mutating func startStaging(_ key: WriteKey, _ payload: [UInt8], ordered: Bool) {
        dropStagingsIfNotLeading()
        if stagingTerm != raft.term {
            stagingTerm = raft.term
            lastStageN = 0
        }
        lastStageN += 1
        let id = StageID(term: raft.term, n: lastStageN)
        stagings[id] = Staging(key: key, payload: payload, ordered: ordered, lastSent: ticks, started: ticks, deadline: ticks + configuration.requestTimeoutTicks)
        stagingKeys[key] = id
        stagingCounts.started += 1
        var info = stagedPayloads[id] ?? StagedPayload(firstSeen: ticks)
        info.storing = true
        info.read = .asked(tick: ticks)
        stagedPayloads[id] = info
        events.append(.storeStaged(id, payload))
        events.append(.prepareStaged(id, payload))
        for peer in raft.membership.all where peer != raft.id { raft.sendStaging(to: peer, .stage(id: id, payload: payload)) }
    }

    /// Queues the reference of staging `id` once its payload is durable and read ahead here
    /// (so nothing behind the reference waits for it on the leader), durable on enough voters
    /// to make a quorum, and either read ahead by every other member too or `retryTicks` after
    /// the staging began (a slow or absent member holds the write up no longer).
    private mutating func maybeReference(_ id: StageID) {
        guard raft.role == .leader, raft.term == id.term, let staging = stagings[id], staging.ownChecksum != nil else { return }
        if case .asked? = stagedPayloads[id]?.read { return }
        let voters = raft.membership.voters
        let holders = staging.acks.count { voters.contains($0) } + (voters.contains(raft.id) ? 1 : 0)
        guard holders >= raft.membership.quorum else { return }
        let everyone = raft.membership.all.allSatisfy { $0 == raft.id || staging.ready.contains($0) }
        guard everyone || ticks - staging.started >= configuration.retryTicks else { return }
        guard !referencesDue.contains(id) else { return }
        referencesDue.append(id)
    }

    /// Proposes the references whose stagings reached their quorum (from `ready()`).
    private mutating func proposeReferences() {
        dropStagingsIfNotLeading()
        guard !referencesDue.isEmpty else { return }
        let due = referencesDue
        referencesDue = []
        for id in due {
            guard let staging = stagings.removeValue(forKey: id), let checksum = staging.ownChecksum else { continue }
            stagingKeys[staging.key] = nil
            guard let reference = StagedReference(id: id, payload: staging.payload, checksum: checksum) else { continue }
            let bytes = reference.encoded()
            guard let outcome = try? raft.propose([bytes]) else {
                // Refused (flow control): the write is in no log; its issuer proposes it again.
                stagingCounts.abandoned += 1
                continue
            }
            stagingCounts.referenced += 1
            noteAppended([staging.key], outcome, [bytes])
            if case .appended(let first, _, let term) = outcome, configuration.maxLargeInFlight > 0 {
                if largeTerm != term {
                    largeTerm = term
                    largeInFlight = []
                }
                largeInFlight.append(first)
            }
            if var w = writes[staging.key] {
                w.proposed = true
                w.lastProposedTick = ticks
                writes[staging.key] = w
            }
        }
    }

    private mutating func receiveStaging(_ m: Message) {
        switch m.body {
        case let .stage(id, payload):
            // Stored from any member of a current or newer term: staging a payload changes
            // nothing until a reference names it, and unnamed files expire.
            guard m.term >= raft.term, raft.membership.contains(m.from) else { return }
            var info = stagedPayloads[id] ?? StagedPayload(firstSeen: ticks)
            if info.durable, let checksum = stagedChecksum(id) {
                let prepared = !info.read.isAsked
                raft.sendStaging(to: m.from, .stageAck(id: id, checksum: checksum, prepared: prepared))
                if !prepared {
                    info.readyTo.insert(m.from)
                    stagedPayloads[id] = info
                }
                return
            }
            info.ackTo.insert(m.from)
            // (Durable, from the listing at start, but of unknown checksum: storing again
            // finds the file whole and answers its checksum.)
            if !info.storing && (!info.durable || stagedChecksum(id) == nil) {
                info.storing = true
                events.append(.storeStaged(id, payload))
            }
            if !info.read.isHeld, stagedReadsHeld() < max(1, configuration.maxPreparing) {
                info.read = .asked(tick: ticks)
                events.append(.prepareStaged(id, payload))
            }
            stagedPayloads[id] = info
        case let .stageAck(id, checksum, prepared):
            guard m.term == raft.term, var staging = stagings[id] else { return }
            // An acknowledgement of other bytes (never expected: one id names one payload) counts for nothing.
            if let own = staging.ownChecksum, own != checksum { return }
            staging.acks.insert(m.from)
            if prepared { staging.ready.insert(m.from) }
            stagings[id] = staging
            maybeReference(id)
        case .fetchStaged(let id):
            guard raft.membership.contains(m.from) else { return }
            events.append(.serveStaged(id, to: m.from))
        case let .stagedPayload(id, payload):
            guard var info = stagedPayloads[id] ?? (fetching[id] != nil || fetchAskedForAppend[id] != nil ? StagedPayload(firstSeen: ticks) : nil),
                !info.durable, !info.storing
            else { return }
            stagingCounts.fetched += 1
            info.storing = true
            events.append(.storeStaged(id, payload))
            if fetching[id] != nil || (!info.read.isHeld && stagedReadsHeld() < max(1, configuration.maxPreparing)) {
                if !info.read.isAsked {
                    info.read = .asked(tick: ticks)
                    events.append(.prepareStaged(id, payload))
                }
            }
            stagedPayloads[id] = info
        default:
            break
        }
    }

    /// The checksum of staging `id` as this node stored it, when this node stages it.
    private func stagedChecksum(_ id: StageID) -> UInt32? {
        if let own = stagings[id]?.ownChecksum { return own }
        return stagedChecksums[id]
    }

    /// Staged reads held in memory (asked or done, not applied).
    private func stagedReadsHeld() -> Int { stagedPayloads.values.count { $0.read.isHeld } }

    /// Whether this node holds every payload `entries` name; for each it lacks, asks `sender`
    /// (at most once per `retryTicks` per payload).
    private mutating func holdsPayloads(named entries: [LogEntry], sender: NodeID) -> Bool {
        guard configuration.raft.sabotage != .acceptUnheldPayloads else { return true }
        var holds = true
        for entry in entries where entry.kind == .command && StagedReference.isReference(entry.data) {
            guard let reference = StagedReference(decoding: entry.data) else { continue }
            if stagedPayloads[reference.id]?.durable == true { continue }
            holds = false
            // Being stored (its `stage` arrived): wait for it.
            if stagedPayloads[reference.id]?.storing == true { continue }
            // The first time, give a `stage` in flight half a retry interval to arrive before
            // asking for the payload again; then ask at most once per interval.
            guard let seen = fetchAskedForAppend[reference.id] else {
                fetchAskedForAppend[reference.id] = ticks - configuration.retryTicks + configuration.retryTicks / 2
                continue
            }
            if ticks - seen < configuration.retryTicks { continue }
            fetchAskedForAppend[reference.id] = ticks
            raft.sendStaging(to: sender, .fetchStaged(id: reference.id))
        }
        return holds
    }

    /// The driver made staged payload `id` durable here (`ReplicaEvent.storeStaged`), with this
    /// CRC32C. Call `ready()` afterwards (acknowledgements and references go out from there).
    public mutating func stagedStored(_ id: StageID, checksum: UInt32) {
        var info = stagedPayloads[id] ?? StagedPayload(firstSeen: ticks)
        info.durable = true
        info.storing = false
        stagedChecksums[id] = checksum
        stagedPayloads[id] = info
        sendStagedAcks(id)
        fetching[id] = nil
        fetchAskedForAppend[id] = nil
        if var staging = stagings[id] {
            staging.ownChecksum = checksum
            stagings[id] = staging
            maybeReference(id)
        }
    }

    /// Acknowledges `id` to the peers waiting, once it is durable here (saying whether it is
    /// read ahead too); and again, once its read is done, to those told it was not.
    private mutating func sendStagedAcks(_ id: StageID) {
        guard var info = stagedPayloads[id], info.durable, let checksum = stagedChecksum(id) else { return }
        let prepared = !info.read.isAsked
        if !info.ackTo.isEmpty {
            for peer in info.ackTo.sorted() { raft.sendStaging(to: peer, .stageAck(id: id, checksum: checksum, prepared: prepared)) }
            if !prepared { info.readyTo.formUnion(info.ackTo) }
            info.ackTo = []
        } else if prepared, !info.readyTo.isEmpty {
            for peer in info.readyTo.sorted() { raft.sendStaging(to: peer, .stageAck(id: id, checksum: checksum, prepared: true)) }
            info.readyTo = []
        } else {
            return
        }
        stagedPayloads[id] = info
    }

    /// The driver could not store staged payload `id` (it logs why: a full disk, say). Nothing
    /// is acknowledged; a leader's staging of it ends at its deadline.
    public mutating func stagedStoreFailed(_ id: StageID) {
        guard var info = stagedPayloads[id] else { return }
        info.storing = false
        info.ackTo = []
        stagedPayloads[id] = info
        // The leader's own copy: the staging cannot reach its reference; it ends now, and its
        // room with it (its write is in no log; its issuer proposes it again).
        if let staging = stagings.removeValue(forKey: id) {
            stagingKeys[staging.key] = nil
            referencesDue.removeAll { $0 == id }
            stagingCounts.abandoned += 1
        }
    }

    /// The read-ahead of staged payload `id` (`ReplicaEvent.prepareStaged`) came back. Call
    /// `ready()` afterwards.
    public mutating func preparedStaged(_ id: StageID, _ result: StagedPreparation) {
        guard var info = stagedPayloads[id], info.read.isAsked else { return }
        switch result {
        case .prepared(let command, let checksum):
            info.read = .done(command, checksum: checksum)
            if info.durable, stagedChecksums[id] == nil { stagedChecksums[id] = checksum }
        case .missing:
            // Storage damage broke I1 here: fetch it from the other members.
            info.read = .none
            info.durable = false
            stagedChecksums[id] = nil
            if fetching[id] == nil { fetchFromMembers(id) }
        }
        stagedPayloads[id] = info
        sendStagedAcks(id)
        if stagings[id] != nil { maybeReference(id) }
        applyQueued()
        if parkedCount > 0 { proposeUnparked() }
        answerReads()
        considerSnapshot()
    }

    /// The driver read staged payload `id` for `peer` (`ReplicaEvent.serveStaged`); nil when
    /// this node does not hold it (the peer asks someone else, or again).
    public mutating func stagedRead(_ id: StageID, _ payload: [UInt8]?, for peer: NodeID) {
        guard let payload else { return }
        raft.sendStaging(to: peer, .stagedPayload(id: id, payload: payload))
    }

    /// The staged files found at start (the store's listing): durable here.
    public mutating func noteStagedFiles(_ ids: [StageID]) {
        for id in ids {
            var info = stagedPayloads[id] ?? StagedPayload(firstSeen: ticks)
            info.durable = true
            stagedPayloads[id] = info
        }
    }

    private mutating func fetchFromMembers(_ id: StageID) {
        fetching[id] = ticks
        for peer in raft.membership.all where peer != raft.id { raft.sendStaging(to: peer, .fetchStaged(id: id)) }
    }

    /// The read of the payload `reference` names, taken for applying it; nil while it is not
    /// ready (asked for here if need be: the entries behind wait).
    private mutating func takeStagedRead(_ reference: StagedReference) -> PreparedCommand?? {
        var info = stagedPayloads[reference.id] ?? StagedPayload(firstSeen: ticks)
        switch info.read {
        case .done(let command, let checksum) where checksum == reference.checksum:
            info.read = .none
            stagedPayloads[reference.id] = info
            return .some(command)
        case .done:
            // Not the bytes the reference names: the copy here is wrong; fetch the right one.
            info.read = .none
            info.durable = false
            stagedChecksums[reference.id] = nil
            stagedPayloads[reference.id] = info
            if fetching[reference.id] == nil { fetchFromMembers(reference.id) }
            return nil
        case .asked:
            return nil
        case .none:
            guard info.durable, !info.storing else {
                // Not here (or still being stored from a fetch): its store answers, then this asks again.
                if !info.storing, fetching[reference.id] == nil { fetchFromMembers(reference.id) }
                stagedPayloads[reference.id] = info
                return nil
            }
            info.read = .asked(tick: ticks)
            stagedPayloads[reference.id] = info
            events.append(.prepareStaged(reference.id, nil))
            return nil
        }
    }

    /// Staging upkeep at each tick: stagings past their deadline end, `stage` goes again to
    /// members that have not answered (backing off), fetches are asked again, reads whose answer
    /// never came are asked again, and unnamed files are swept now and then.
    private mutating func tickStaging() {
        dropStagingsIfNotLeading()
        for id in stagings.keys.sorted() {
            guard var staging = stagings[id] else { continue }
            if ticks >= staging.deadline {
                stagings[id] = nil
                stagingKeys[staging.key] = nil
                stagingCounts.abandoned += 1
                continue
            }
            if ticks - staging.started == configuration.retryTicks { maybeReference(id) }
            if ticks - staging.lastSent >= configuration.retryTicks << min(staging.sends - 1, 3) {
                staging.lastSent = ticks
                staging.sends += 1
                for peer in raft.membership.all where peer != raft.id && !staging.acks.contains(peer) {
                    raft.sendStaging(to: peer, .stage(id: id, payload: staging.payload))
                }
                stagings[id] = staging
            }
        }
        for (id, asked) in fetching.sorted(by: { $0.key < $1.key }) where ticks - asked >= configuration.retryTicks {
            fetchFromMembers(id)
        }
        for (id, info) in stagedPayloads {
            if case .asked(let tick) = info.read, ticks - tick >= 10 * configuration.retryTicks {
                var again = info
                again.read = .none
                stagedPayloads[id] = again
            }
        }
        if ticks - lastStagedSweep >= configuration.requestTimeoutTicks { sweepStaged() }
    }

    /// Removes staged files no entry of this node's log (above its compaction point) names,
    /// not being staged, stored, read or fetched, and first seen two request timeouts ago or
    /// more (I3: docs/staged-payloads.md). O(log) when something is old enough, at most once
    /// per request timeout and after each snapshot.
    private mutating func sweepStaged() {
        lastStagedSweep = ticks
        let age = 2 * configuration.requestTimeoutTicks
        var candidates = Set<StageID>()
        for (id, info) in stagedPayloads
        where ticks - info.firstSeen >= age && stagings[id] == nil && !info.storing && !info.read.isAsked && fetching[id] == nil {
            candidates.insert(id)
        }
        if !fetchAskedForAppend.isEmpty { fetchAskedForAppend = fetchAskedForAppend.filter { ticks - $0.value < age } }
        guard !candidates.isEmpty else { return }
        if configuration.raft.sabotage != .removeNamedPayloads {
            var index = raft.firstIndex
            while index <= raft.lastIndex, !candidates.isEmpty {
                if let entry = raft.entry(at: index), entry.kind == .command, StagedReference.isReference(entry.data),
                    let reference = StagedReference(decoding: entry.data)
                {
                    candidates.remove(reference.id)
                }
                index += 1
            }
            // Committed entries waiting to apply are in the log too; checked anyway.
            for entry in applyQueue[applyHead...] where StagedReference.isReference(entry.data) {
                if let reference = StagedReference(decoding: entry.data) { candidates.remove(reference.id) }
            }
            // Compacted entries the driver still serves.
            for kept in compactedReferences { candidates.remove(kept.id) }
        }
        guard !candidates.isEmpty else { return }
        let removed = candidates.sorted()
        for id in removed {
            stagedPayloads[id] = nil
            stagedChecksums[id] = nil
        }
        stagingCounts.removed += removed.count
        events.append(.removeStaged(removed))
    }

    /// Staged payloads known here, durable or not (tests and the simulator's checks).
    public var stagedIDs: [StageID] { stagedPayloads.keys.sorted() }

    /// Whether this node holds payload `id` durably, as far as the replica knows.
    public func holdsStaged(_ id: StageID) -> Bool { stagedPayloads[id]?.durable == true }

    // MARK: - Ready / advance

    /// Work for the driver, or nil when there is none. Batched writes are proposed and new reads
    /// started here, so one `Ready` carries everything that arrived since the last one.
    public mutating func ready() -> Ready? {
        flushProposals()
        startReads()
        guard raft.hasReady else { return nil }
        return raft.ready()
    }

    private mutating func flushProposals() {
        guard !holdProposals else { return }
        proposeReferences()
        // Held for room first: they came before anything forwarded since.
        proposeHeldForRoom()
        if !heldForwarded.isEmpty {
            let held = heldForwarded
            heldForwarded = []
            // Leadership lost meanwhile: the followers propose them again after `retryTicks`,
            // as after any forward lost in a leader change.
            if raft.role == .leader { proposeForwarded(held) }
        }
        guard !toPropose.isEmpty else { return }
        let seqs = toPropose
        toPropose = []
        queued = []
        let leader = raft.role == .leader
        let stamp = leader ? nextStamp() : 0
        // Admission (leader only): a large write waits while `maxLargeInFlight` large entries
        // are unapplied or a forwarded one held longer waits, and so does what follows it in an
        // ordered session; the rest goes ahead.
        var room = leader ? largeRoom() : .max
        let oldestHeld = leader ? heldForRoom.first(where: \.large)?.order : nil
        // An ordered session's writes wait behind one of theirs being staged.
        var waitingOrdered = leader ? Set(stagings.values.lazy.filter(\.ordered).map(\.key.session)) : []
        // One proposal per batch of at most `maxProposalBytes` (a single larger write goes
        // alone): a forwarded proposal is one peer frame, which must stay under its limit.
        var batch: [WriteKey] = []
        var payloads: [[UInt8]] = []
        var bytes = 0
        var readyBytes = 0
        for (position, seq) in seqs.enumerated() {
            guard let w = writes[seq] else { continue }
            if leader, w.proposed || stagingKeys[seq] != nil, waitsOrApplied(seq) {
                // This leader's log holds a copy already (or it applied): nothing to add.
                droppedRetries += 1
                var kept = w
                kept.lastProposedTick = ticks
                writes[seq] = kept
                continue
            }
            let large = isLarge(w.payload.count)
            // A forwarded one waits longer than this write (a write not yet waiting comes last).
            let heldLonger = oldestHeld.map { held in w.heldSince.map { held < $0 } ?? true } ?? false
            if leader, (large && (room == 0 || heldLonger)) || waitingOrdered.contains(seq.session) {
                if large, w.heldSince == nil {
                    largeWritesHeld += 1
                    var marked = w
                    waitOrder += 1
                    marked.heldSince = waitOrder
                    writes[seq] = marked
                }
                if counters[seq.session]?.ordered == true { waitingOrdered.insert(seq.session) }
                if queued.insert(seq).inserted { toPropose.append(seq) }
                continue
            }
            if readyBytes > 0, readyBytes + w.payload.count > configuration.maxReadyBytes {
                // The rest goes into the next `Ready`, in the same order.
                for later in seqs[position...] where writes[later] != nil && queued.insert(later).inserted { toPropose.append(later) }
                break
            }
            if !payloads.isEmpty, bytes + w.payload.count > configuration.maxProposalBytes {
                propose(batch, payloads)
                batch = []
                payloads = []
                bytes = 0
            }
            if leader, large { room -= 1 }
            if leader, w.payload.count >= configuration.stagingThreshold {
                // Staged, not proposed: in no log until its reference is (`maybeReference`).
                startStaging(seq, CommandEnvelope.restamped(w.payload, timestamp: stamp) ?? w.payload, ordered: counters[seq.session]?.ordered == true)
                var started = w
                started.lastProposedTick = ticks
                started.heldSince = nil
                started.staged = true
                writes[seq] = started
                if counters[seq.session]?.ordered == true { waitingOrdered.insert(seq.session) }
                continue
            }
            batch.append(seq)
            payloads.append(leader ? (CommandEnvelope.restamped(w.payload, timestamp: stamp) ?? w.payload) : w.payload)
            bytes += w.payload.count
            readyBytes += w.payload.count
        }
        if !payloads.isEmpty { propose(batch, payloads) }
    }

    private mutating func propose(_ seqs: [WriteKey], _ payloads: [[UInt8]]) {
        var proposed = false
        do {
            noteAppended(seqs, try raft.propose(payloads), payloads)
            proposed = true
        } catch {
            switch error {
            case .noLeader, .transferInProgress:
                // Wait for a leader: the retry timer proposes again.
                break
            default:
                // Refused outright (flow control): a write never proposed before is certainly not
                // in any log, so it fails now. A retry of one that was proposed keeps waiting:
                // its earlier copy may still commit.
                for seq in seqs where writes[seq]?.proposed == false {
                    if let w = writes.removeValue(forKey: seq) { events.append(.failed(w.request, .overloaded(error.description))) }
                }
            }
        }
        // Get and set, not `writes[seq]?.x = …`: a dictionary `_modify` allocates its coroutine
        // frame on every call.
        for seq in seqs {
            guard var w = writes[seq] else { continue }
            if proposed {
                w.proposed = true
                // No longer waiting for room (a retry that waits again counts again).
                w.heldSince = nil
            }
            w.lastProposedTick = ticks
            writes[seq] = w
        }
    }

    private mutating func startReads() {
        guard !newReads.isEmpty else { return }
        let context = nextReadContext
        if raft.readIndex(context: context) {
            nextReadContext &+= 1
            reads[context] = PendingRead(requests: newReads, askedTick: ticks, index: nil)
            newReads = []
        }
        // Otherwise no leader is known: the reads wait here until one is (or each reaches its
        // deadline in `tick`).
    }

    /// Fails the reads past their deadline; returns the others.
    private mutating func expireReads(_ waiting: [WaitingRead]) -> [WaitingRead] {
        var live: [WaitingRead] = []
        live.reserveCapacity(waiting.count)
        for w in waiting {
            if ticks >= w.deadline { events.append(.failed(w.request, .timedOut(write: false))) } else { live.append(w) }
        }
        return live
    }

    /// Finishes a `Ready` after the driver persisted and sent it: loads an installed snapshot
    /// (`installed`, the state machine the driver read from it), applies committed entries and
    /// answers reads. Then call `takeEvents()`.
    public mutating func advance(_ rd: Ready, installed: StateMachine?) {
        if let role = rd.role {
            let leader = rd.leader ?? raft.leader
            if role != lastRole || leader != lastLeader {
                lastRole = role
                lastLeader = leader
                events.append(.roleChanged(role: role, leader: leader, term: raft.term))
            }
        }
        if let meta = rd.snapshot, let installed, installed.appliedIndex >= machine.appliedIndex {
            machine = installed
            logBytesSinceSnapshot = 0
            logBytesKept = 0
            logBytesCoveredByDue = 0
            events.append(.restoredFromSnapshot(meta))
            settleWritesCoveredBySnapshot()
            // Entries the snapshot covers are not applied here any more.
            applyQueue.removeSubrange(applyHead...)
            applyHead = 0
            readAhead = [:]
            asking = 0
            // Payloads fetched for references the snapshot covers are needed no more.
            fetching = [:]
        }
        applyQueue.append(contentsOf: rd.committedEntries)
        applyQueued()
        readAheadAppended(rd.entries)
        for state in rd.readStates {
            reads[state.context]?.index = state.index
        }
        raft.advance(rd)
        if raft.role != .leader, !appendedInTerm.isEmpty { appendedInTerm = [:] }
        // Entries applied under another identity (a damaged payload applies as session 0) would
        // stay: past a bound, everything applied goes.
        if appendedInTerm.count > appendedSweepAt {
            let applied = machine.appliedIndex
            appendedInTerm = appendedInTerm.filter { $0.value > applied }
            appendedSweepAt = max(4_096, 2 * appendedInTerm.count)
        }
        if parkedCount > 0 { proposeUnparked() }
        answerReads()
        considerSnapshot()
    }

    /// The read-ahead of committed entry `index` (`ReplicaEvent.prepare`): entries waiting
    /// behind it apply now. An answer nobody waits for (the entry applied meanwhile from a
    /// snapshot, or it was asked for by an earlier life of this replica) is dropped.
    public mutating func prepared(index: UInt64, term: UInt64, _ command: PreparedCommand?) {
        guard case .asked(let asked, _)? = readAhead[index], asked == term else { return }
        readAhead[index] = .done(term: term, command)
        asking -= 1
        applyQueued()
        if parkedCount > 0 { proposeUnparked() }
        answerReads()
        considerSnapshot()
    }

    /// Applies queued committed entries in order, up to the first large command whose read-ahead
    /// has not come back, and asks for the read-ahead of the next large ones.
    private mutating func applyQueued() {
        while applyHead < applyQueue.count {
            let entry = applyQueue[applyHead]
            var prepared: PreparedCommand?
            if entry.kind == .command, StagedReference.isReference(entry.data), let reference = StagedReference(decoding: entry.data) {
                // Its payload's read, from the staged store (docs/staged-payloads.md).
                guard let read = takeStagedRead(reference) else { break }
                applyHead += 1
                stagingCounts.applied += 1
                // No bytes: a payload that is no command envelope (its read is nil) applies as
                // malformed, as its bytes would.
                apply(entry, prepared: read, payload: [])
                // The payload counts towards the next snapshot (which lets its file go), and
                // towards what a snapshot stream may hold back (its file stays meanwhile).
                logBytesSinceSnapshot &+= reference.length
                logBytesKept &+= reference.length
                continue
            }
            if needsPreparation(entry) {
                guard case .done(let term, let command)? = readAhead[entry.index], term == entry.term else { break }
                readAhead[entry.index] = nil
                prepared = command
            }
            applyHead += 1
            apply(entry, prepared: prepared)
            logBytesSinceSnapshot &+= UInt64(entry.data.count)
            logBytesKept &+= UInt64(entry.data.count)
        }
        if applyHead == applyQueue.count {
            applyQueue.removeAll(keepingCapacity: applyQueue.count < 1_024)
            applyHead = 0
        } else if applyHead >= 1_024 {
            applyQueue.removeSubrange(..<applyHead)
            applyHead = 0
        }
        // Read-aheads of entries that were replaced before they committed (another entry
        // applied at their index): nobody waits for them.
        if !readAhead.isEmpty {
            let applied = machine.appliedIndex
            for index in readAhead.keys where index <= applied { forgetReadAhead(index) }
        }
        askForPreparation()
    }

    private mutating func forgetReadAhead(_ index: UInt64) {
        guard let state = readAhead.removeValue(forKey: index) else { return }
        if case .asked = state { asking -= 1 }
    }

    private mutating func askReadAhead(_ entry: LogEntry) {
        if let state = readAhead[entry.index] {
            // Asked for this entry already, or for one it replaced (its answer is dropped).
            guard state.term != entry.term else { return }
            forgetReadAhead(entry.index)
        }
        readAhead[entry.index] = .asked(term: entry.term, tick: ticks)
        asking += 1
        events.append(.prepare(index: entry.index, term: entry.term, payload: entry.data))
    }

    /// Large entries just written to this node's log are read ahead before they commit, while
    /// the round that commits them goes on (at most `maxPreparing` kept ahead at once).
    private mutating func readAheadAppended(_ entries: [LogEntry]) {
        for entry in entries where needsPreparation(entry) && readAhead[entry.index]?.term != entry.term {
            guard readAhead.count < max(1, configuration.maxPreparing) else { return }
            askReadAhead(entry)
        }
    }

    /// Whether `entry` is a command large enough to be read ahead, and not applied yet.
    private func needsPreparation(_ entry: LogEntry) -> Bool {
        guard case .command = entry.kind, !StagedReference.isReference(entry.data) else { return false }
        return entry.data.count >= configuration.prepareThreshold && entry.index > machine.appliedIndex
    }

    /// Asks for the read-ahead of the next large queued entries: always the one next to apply,
    /// and up to `maxPreparing` in all.
    private mutating func askForPreparation() {
        var position = applyHead
        // Bounded scan: entries far behind are asked for once those before them applied.
        let end = min(applyQueue.count, applyHead + 4_096)
        while position < end, asking < max(1, configuration.maxPreparing) || position == applyHead {
            let entry = applyQueue[position]
            position += 1
            guard needsPreparation(entry), readAhead[entry.index]?.term != entry.term else { continue }
            askReadAhead(entry)
        }
    }

    private mutating func apply(_ entry: LogEntry, prepared: PreparedCommand?, payload: [UInt8]? = nil) {
        switch entry.kind {
        case .command:
            guard let applied = machine.apply(payload ?? entry.data, index: entry.index, prepared: prepared) else { return }
            let key = WriteKey(session: applied.session, seq: applied.seq)
            if let at = appendedInTerm[key], at <= entry.index { appendedInTerm[key] = nil }
            if applied.outcome == .outOfOrder {
                // Nothing changed; this node's own write waits for its predecessor.
                if var w = writes[key], !w.parked {
                    w.parked = true
                    writes[key] = w
                    parkedCount += 1
                }
                return
            }
            var request: RequestID?
            if let w = writes.removeValue(forKey: key) {
                if w.parked { parkedCount -= 1 }
                if applied.outcome == .duplicate {
                    // Applied earlier (its outcome arrived in a snapshot): the outcome is
                    // not known here, so it must not be reported as a success.
                    events.append(.failed(w.request, .timedOut(write: true)))
                    return
                }
                request = w.request
            }
            let tree = treesFor.map { $0.contains(applied.namespace) } ?? true ? machine.tree(applied.namespace) : .empty
            events.append(.applied(applied, tree: tree, request: request))
        case .noop:
            machine.skip(index: entry.index)
        case .config(let membership):
            machine.skip(index: entry.index)
            membershipRequests.removeAll { m in
                guard m.index == entry.index else { return false }
                events.append(.membershipChanged(m.request, membership))
                return true
            }
        }
    }

    /// Proposes again each parked write with nothing of its session waiting before it here
    /// (its predecessors applied or were given up: the watermark says so), and the parked
    /// writes right behind it, in order.
    private mutating func proposeUnparked() {
        var session: UInt64?
        var lowest: UInt64 = 0
        var releasing = false
        for key in writes.keys.sorted() {
            guard let w = writes[key] else { continue }
            if key.session != session {
                session = key.session
                lowest = key.seq
                releasing = w.parked
            }
            guard releasing, w.parked else {
                releasing = false
                continue
            }
            var retry = w
            retry.parked = false
            parkedCount -= 1
            retry.payload = CommandEnvelope.resettled(w.payload, settledBelow: lowest)
            writes[key] = retry
            if queued.insert(key).inserted { toPropose.append(key) }
        }
    }

    /// Writes of this node that the installed snapshot already contains: they applied (or were
    /// refused) inside the snapshot, whose outcome is not recorded, so they end now as unknown
    /// instead of waiting for their deadline.
    private mutating func settleWritesCoveredBySnapshot() {
        for key in writes.keys.sorted() where machine.sessions[key.session]?.contains(key.seq) == true {
            if let w = writes.removeValue(forKey: key) {
                if w.parked { parkedCount -= 1 }
                events.append(.failed(w.request, .timedOut(write: true)))
            }
        }
    }

    private mutating func answerReads() {
        var ready: [RequestID] = []
        for (context, r) in reads.sorted(by: { $0.key < $1.key }) {
            guard let index = r.index, index <= machine.appliedIndex else { continue }
            ready.append(contentsOf: r.requests.map(\.request))
            reads[context] = nil
        }
        if !ready.isEmpty { events.append(.readsReady(ready)) }
    }

    /// The bytes of applied log that call for a snapshot (0: none do).
    public var snapshotByteBound: UInt64 {
        configuration.snapshotLogBytes == 0 ? 0 : max(configuration.snapshotLogBytes, snapshotImageBytes)
    }

    private mutating func considerSnapshot() {
        guard snapshotInProgress == nil else { return }
        let applied = machine.appliedIndex
        let last = max(raft.snapshotMeta.index, newestSnapshotIndex)
        let since = applied >= last ? applied - last : 0
        guard since > 0, applied <= raft.appliedIndex else { return }
        // While the leader streams a snapshot, either bound is `snapshotDeferral` times larger.
        let streaming = raft.isStreamingSnapshot
        let times = streaming ? max(1, configuration.snapshotDeferral) : 1
        func reached(_ count: UInt64, _ bound: UInt64) -> Bool {
            guard bound > 0 else { return false }
            let (scaled, overflow) = bound.multipliedReportingOverflow(by: times)
            return !overflow && count >= scaled
        }
        guard reached(since, configuration.snapshotEntries) || reached(logBytesSinceSnapshot, snapshotByteBound) else { return }
        // A count of entries says nothing about how long the image takes to stream: with a
        // large image (or a slow link) and a steady stream of small writes, every stream was
        // restarted from byte 0 before it could finish, and a new or lagging member never caught
        // up (simulator seed 5028 with sessions and client writes: a 5.5 KB image in 64-byte
        // chunks, the stream replaced every 64 entries at 2.7–5.2 KB, for 30 s after healing).
        // So mid-stream the log also waits until it holds `snapshotDeferral` times the image's
        // bytes: a stream then finishes unless the writes outrun it several times over (in
        // bytes), and the log kept for it stays proportional to the state, as the byte bound
        // keeps it. (A deferral of 1 still means none.)
        if streaming, times > 1, snapshotImageBytes > 0, !reached(logBytesSinceSnapshot, snapshotImageBytes) { return }
        guard let meta = try? raft.snapshotMeta(at: applied) else { return }
        snapshotInProgress = applied
        logBytesCoveredByDue = logBytesSinceSnapshot
        events.append(.snapshotDue(meta))
    }

    /// Everything the replica has to tell the driver since the last call, in order.
    public mutating func takeEvents() -> [ReplicaEvent] {
        defer { events = [] }
        return events
    }
}
