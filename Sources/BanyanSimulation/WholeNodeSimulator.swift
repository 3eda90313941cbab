public import BanyanBasics
public import BanyanCheckers
public import BanyanNode
import BanyanOpLogFiles
import struct BanyanOpLog.SnapshotMetaRecord
import BanyanRaft
public import BanyanReplica
import BanyanSession
import BanyanStateMachine
import BanyanTree
import Logging

/// Options of one whole-node run (docs/simulator.md, "Whole-node simulation").
public struct WholeNodeOptions: Sendable {
    public var seed: UInt64
    /// Founding voters (nil: the swarm picks 3 or 5).
    public var nodes: Int?
    /// Client operations in the run.
    public var operations = 300
    public var clients = 4
    /// Integer registers `k0…` written by sets, updates and compare-and-sets.
    public var keys = 3
    public var faults = true
    public var trace = false
    /// A fix of issue 14 undone in the real code (checker self-tests only).
    public var sabotage: Sabotage = .none
    /// Realtime connections with onDisconnect writes, node leases and their fencing (issue 15):
    /// a presence workload beside the clients (off by default, so other seeds keep their runs).
    public var sessions = false
    /// Security rules in the log (issue 16): client 0 sets one rules document at its first
    /// operation and another halfway; every client write names its client (uid `c<client>`), so
    /// writes are judged at their position (some are denied) and every node must decide alike.
    public var rules = false
    /// Account sign-ups in the log (issue 16, docs/accounts.md): about a tenth of the operations
    /// sign up one of `keys` emails, so concurrent sign-ups race for them; at most one per email
    /// may succeed, and every node must hold the same accounts.
    public var accounts = false
    /// Client writes (issue 17, command version 9): every data write names its client and
    /// number, as the Swift SDK's do; a client whose write failed or timed out sends the same
    /// write again through another node (up to four times), and every node must decide each
    /// (client, number) once, answering later copies with the first one's outcome.
    public var clientWrites = false
    /// Namespace quotas (issue 18, docs/operations.md "Namespace quotas"): the last client sets
    /// a quota of `quotaBytes.0` data bytes on the registers' namespace at its first operation and
    /// `quotaBytes.1` halfway; writes that would take the namespace over it are refused where they
    /// apply (every node alike, which the convergence check compares) and never show in the
    /// history.
    public var quota = false
    public static let quotaBytes = (25, 1_000)
    /// Overrides the seed's draw of `WholeNodeSwarm.snapshotLogBytes` (nil: the draw).
    public var snapshotLogBytes: UInt64?
    public var livenessBudgetMillis = 30_000
    public var maxSimulatedMillis = 600_000
    public var maxEvents = 3_000_000

    public init(seed: UInt64) { self.seed = seed }
}

/// The fault profile of a whole-node run, drawn from its seed.
public struct WholeNodeSwarm: Sendable, CustomStringConvertible {
    public var nodes: Int
    public var lossPercent: Int
    public var duplicatePercent: Int
    public var maxDelayMillis: Int
    /// Some messages are held up to 500 ms (reordered, delivered stale).
    public var longDelays: Bool
    /// In-flight append window of each leader's progress (1–64 messages).
    public var inflightWindow: Int
    public var crashes: Bool
    /// Crashes at a file-system operation (a power loss then: unsynced bytes partly lost).
    public var diskCrashes: Bool
    public var powerLoss: Bool
    public var partitions: Bool
    /// Some partitions cut traffic one way only.
    public var oneWayPartitions: Bool
    /// A node's process is stopped (SIGSTOP) and resumed later, its inbound traffic queued.
    public var pauses: Bool
    /// Lease-based linearizable reads (only in runs without pauses: a paused leader breaks the
    /// lease's clock assumption by design, `ReadMode.leaseBased`).
    public var leaseReads: Bool
    /// An operator replaces a node's data (a lost disk): it restarts blank under its id.
    public var dataLoss: Bool
    /// A synced sector of a stopped node's log reads back as zeros (a media error).
    public var badSectors: Bool
    public var membershipChanges: Bool
    public var transfers: Bool
    /// Take a snapshot every this many applied entries (0: never).
    public var snapshotEntries: UInt64
    /// ...and every this many payload bytes applied (0: by entries only); drawn last, so the
    /// other draws of a seed are those of the versions before it.
    public var snapshotLogBytes: UInt64 = 0
    public var snapshotChunkBytes: Int
    /// Round pacing interval in ms (0: none).
    public var pacingMillis: Int
    public var nemesisMeanMillis: Int

    static func draw(_ r: inout SeededRandom, nodes: Int?, faults: Bool) -> WholeNodeSwarm {
        let n = nodes ?? (r.chance(1, in: 2) ? 3 : 5)
        let snapshot: [UInt64] = [0, 16, 40, 120]
        let chunk = [64, 512, 4096, 65_536]
        func logBytes() -> UInt64 { r.chance(1, in: 3) ? [512, 2_048, 8_192][r.below(3)] : 0 }
        guard faults else {
            var quiet = WholeNodeSwarm(
                nodes: n, lossPercent: 0, duplicatePercent: 0, maxDelayMillis: 3, longDelays: false, inflightWindow: 64, crashes: false, diskCrashes: false, powerLoss: false,
                partitions: false, oneWayPartitions: false, pauses: false, leaseReads: false, dataLoss: false, badSectors: false,
                membershipChanges: false, transfers: false, snapshotEntries: snapshot[r.below(4)],
                snapshotChunkBytes: chunk[r.below(4)], pacingMillis: r.below(3), nemesisMeanMillis: 400)
            quiet.snapshotLogBytes = logBytes()
            return quiet
        }
        var swarm = WholeNodeSwarm(
            nodes: n, lossPercent: r.below(3) == 0 ? 0 : r.below(12), duplicatePercent: r.below(3) == 0 ? 0 : r.below(15),
            maxDelayMillis: 2 + r.below(40), longDelays: false, inflightWindow: 64, crashes: r.chance(3, in: 4), diskCrashes: r.chance(2, in: 3), powerLoss: r.chance(1, in: 3),
            partitions: r.chance(1, in: 2), oneWayPartitions: false, pauses: false, leaseReads: false, dataLoss: false, badSectors: false,
            membershipChanges: r.chance(1, in: 2), transfers: r.chance(1, in: 3),
            snapshotEntries: snapshot[r.below(4)], snapshotChunkBytes: chunk[r.below(4)], pacingMillis: r.below(3),
            nemesisMeanMillis: 150 + r.below(500))
        swarm.oneWayPartitions = swarm.partitions && r.chance(1, in: 2)
        swarm.pauses = r.chance(1, in: 3)
        swarm.leaseReads = !swarm.pauses && r.chance(1, in: 3)
        swarm.dataLoss = r.chance(1, in: 4)
        swarm.longDelays = r.chance(1, in: 4)
        swarm.inflightWindow = [1, 4, 64][r.below(3)]
        swarm.badSectors = r.chance(1, in: 4)
        swarm.snapshotLogBytes = logBytes()
        return swarm
    }

    public var description: String {
        var faults: [String] = []
        if crashes { faults.append("crash") }
        if diskCrashes { faults.append("disk-crash") }
        if powerLoss { faults.append("power-loss") }
        if partitions { faults.append(oneWayPartitions ? "partition(+one-way)" : "partition") }
        if pauses { faults.append("pause") }
        if dataLoss { faults.append("data-loss") }
        if badSectors { faults.append("bad-sector") }
        if leaseReads { faults.append("lease-reads") }
        if membershipChanges { faults.append("membership") }
        if transfers { faults.append("transfer") }
        return "nodes=\(nodes) loss=\(lossPercent)% dup=\(duplicatePercent)% delay≤\(maxDelayMillis)ms\(longDelays ? "(+500ms)" : "") inflight=\(inflightWindow) snapshotEvery=\(snapshotEntries)\(snapshotLogBytes > 0 ? "/\(snapshotLogBytes)B" : "")"
            + " chunk=\(snapshotChunkBytes) pacing=\(pacingMillis)ms nemesis~\(nemesisMeanMillis)ms faults=[\(faults.joined(separator: ","))]"
    }
}

/// The result of one whole-node run.
public struct WholeNodeReport: Sendable {
    public var seed: UInt64
    public var swarm: WholeNodeSwarm
    public var violations: [String] = []
    public var livenessFailure: String?
    /// Set with a liveness failure when, as the run gives up, more voters have lost their data
    /// than a quorum can spare (a lost disk or bad sector, then a log that refused to open after
    /// a power loss on another voter before the first was re-added): no quorum system can
    /// promise progress then, so the failure is reported but not counted as one. Safety and
    /// linearizability are still required; never set under a sabotage.
    public var beyondFaultBudget: String?
    public var linearizability: LinearizabilityVerdict = .linearizable
    public var nonLinearizableKeys: [Int] = []
    public var stats = Stats()
    public var trace: [String] = []
    public var traceHash: UInt64 = 0

    public struct Stats: Sendable, Equatable {
        public var simulatedMillis = 0
        public var events = 0
        public var messagesSent = 0
        public var messagesDropped = 0
        public var leaderChanges = 0
        public var maxTerm: UInt64 = 0
        public var writesOK = 0
        public var writesUnknown = 0
        public var writesRefused = 0
        /// Writes the security rules denied (`--rules`), counted among `writesOK` (answered).
        public var writesDenied = 0
        /// Writes refused over the namespace's quota (`--quota`), counted among `writesOK`.
        public var writesOverQuota = 0
        public var readsOK = 0
        public var readsFailed = 0
        /// Faults the nemesis drew (crashes, disk crashes, power losses, partitions, membership
        /// changes, transfers).
        public var faults = 0
        public var crashes = 0
        public var diskCrashes = 0
        public var powerLosses = 0
        public var restarts = 0
        public var snapshotsWritten = 0
        public var snapshotsInstalled = 0
        /// Large entries read ahead on a node's worker (docs/replica.md, "Prepared entries").
        public var readAheads = 0
        /// Large writes a leader held back for room (docs/replica.md, "Large writes wait their turn").
        public var largeWritesHeld = 0
        /// Staged payloads (docs/staged-payloads.md), summed over nodes and lives.
        public var staging = StagingCounts()
        public var membershipChanges = 0
        public var fileOperations = 0
        public var writesPatched = 0
        /// Nodes whose log refused to open after a power loss, replaced by a blank disk (the
        /// runbook's procedure).
        public var replacements = 0
        /// Repairs whose member came back with a stale incarnation after the operator had asked
        /// to add the node again (its removal lost in a leader change): removed again.
        public var staleRemovals = 0
        public var retired = 0
        public var gracefulRestarts = 0
        /// Failed fsyncs injected (the node exits and restarts without a power loss).
        public var syncFailures = 0
        public var pauses = 0
        /// Disks an operator replaced after losing them (the data-loss fault).
        public var disksLost = 0
        public var badSectors = 0
        /// Idle records expired (client write records and ended connections' sessions).
        public var expired = 0
        /// Client writes sent again after a failure or timeout (options.clientWrites), and those
        /// answered from an earlier copy's outcome.
        public var clientResends = 0
        public var clientAlreadyApplied = 0
        /// Realtime connections opened (options.sessions), queues fired, lease fences.
        public var presences = 0
        public var presencesFired = 0
        public var leaseFences = 0

        public init() {}
    }

    public var passed: Bool {
        violations.isEmpty && (livenessFailure == nil || beyondFaultBudget != nil) && linearizability == .linearizable
    }
    /// Passed, with a liveness failure that the fault budget excuses (`beyondFaultBudget`).
    public var livenessNotRequired: Bool { passed && livenessFailure != nil }

    public var summary: String {
        var s = "seed \(seed): \(passed ? "ok" : "FAILED") — whole-node \(swarm)\n"
        s += "  \(stats.simulatedMillis) ms simulated, \(stats.events) events, \(stats.messagesSent) messages (\(stats.messagesDropped) dropped),"
        s += " \(stats.leaderChanges) leader changes, max term \(stats.maxTerm), \(stats.fileOperations) file operations\n"
        s += "  writes ok \(stats.writesOK) (denied by rules \(stats.writesDenied), over the quota \(stats.writesOverQuota)) unknown \(stats.writesUnknown) refused \(stats.writesRefused); reads ok \(stats.readsOK)"
        s += " failed \(stats.readsFailed); faults \(stats.faults): crashes \(stats.crashes), disk crashes \(stats.diskCrashes),"
        s += " power losses \(stats.powerLosses), pauses \(stats.pauses), lost disks \(stats.disksLost), bad sectors \(stats.badSectors), restarts \(stats.restarts) (graceful \(stats.gracefulRestarts), after a failed fsync \(stats.syncFailures)), replaced disks \(stats.replacements) (removed again \(stats.staleRemovals)), membership \(stats.membershipChanges), retired \(stats.retired);"
        s += " snapshots written \(stats.snapshotsWritten) installed \(stats.snapshotsInstalled), read-aheads \(stats.readAheads), large writes held \(stats.largeWritesHeld)"
        s += "\n"
        let g = stats.staging
        if g.started > 0 || g.applied > 0 {
            s += "  staged: \(g.started) started, \(g.referenced) referenced, \(g.abandoned) abandoned, \(g.applied) applied; appends held \(g.appendsHeld), fetched \(g.fetched), files removed \(g.removed)\n"
        }
        if stats.clientResends > 0 || stats.clientAlreadyApplied > 0 || stats.expired > 0 {
            s += "  client writes sent again \(stats.clientResends), answered from an earlier copy \(stats.clientAlreadyApplied); idle records expired \(stats.expired)\n"
        }
        if stats.presences > 0 {
            s += "  realtime connections \(stats.presences), onDisconnect queues fired \(stats.presencesFired), lease fences \(stats.leaseFences)\n"
        }
        s += "  linearizability: \(linearizability) (\(stats.writesPatched) unknown writes resolved)"
        if !nonLinearizableKeys.isEmpty { s += " (keys \(nonLinearizableKeys))" }
        if let l = livenessFailure { s += "\n  liveness\(beyondFaultBudget == nil ? "" : " (not required)"): \(l)" }
        if let b = beyondFaultBudget { s += "\n  beyond the fault budget: \(b)" }
        for v in violations.prefix(10) { s += "\n  violation: \(v)" }
        if violations.count > 10 { s += "\n  … \(violations.count - 10) more violations" }
        return s
    }
}

/// Collects a core's actions as it emits them (the core calls its `output` synchronously).
private final class ActionBox {
    var actions: [NodeAction] = []
}

/// The simulated time, shared with the cores' injected monotonic clocks.
private final class SimulatedClock {
    var millis = 0
}

/// The whole-node simulator: N real nodes (`NodeCore` with its `Replica`, `StateMachine` and
/// `NodeStorage` over `SegmentedLog` and `SnapshotStore`) on `SimulatedFileSystem`s, a seeded
/// network, crashes at file-system operations and power losses, client sessions on every node,
/// and the checkers (docs/simulator.md). `run(_:)` is a pure function of its options.
public struct WholeNodeSimulator {
    public static func run(_ options: WholeNodeOptions) -> WholeNodeReport {
        var sim = WholeNodeSimulator(options)
        sim.execute()
        return sim.report
    }

    static let namespace = "sim"
    /// The project account sign-ups name (`--accounts`).
    static let accountsProject = "sim-accounts"
    static let counterKey = "n"
    static let logger = Logger(label: "banyan-sim") { _ in SwiftLogNoOpLogHandler() }

    // MARK: - State

    private enum Event {
        case tick(NodeID, life: Int)
        case process(NodeID, life: Int)
        /// A message and its sender's incarnation (as the connection's hello named it).
        case deliver(Message, UInt64)
        case snapshot(NodeID, life: Int, StateMachine, SnapshotMeta)
        case clientNext(Int)
        case clientTimeout(Int, op: Int)
        case nemesis
        case heal
        case restart(NodeID)
        case resume(NodeID, life: Int)
        /// A sender's transport reconnected a link: what it kept goes out first, in order.
        case reopen(from: NodeID, to: NodeID)
        case check
        case presenceNext
        case presenceEnd(Int)
        case presenceRetryEnd(Int, NodeID, life: Int)
        /// A read-ahead (`NodeAction.prepare`) done on the node's worker thread.
        case prepared(NodeID, life: Int, index: UInt64, term: UInt64, PreparedCommand?)
        /// Staged payloads (docs/staged-payloads.md): the node's staging thread stores one, reads
        /// one ahead, or reads one for a peer.
        case storeStaged(NodeID, life: Int, StageID, [UInt8])
        case prepareStaged(NodeID, life: Int, StageID, [UInt8]?)
        case serveStaged(NodeID, life: Int, StageID, to: NodeID)
    }

    private final class SimulatedNode {
        let id: NodeID
        /// The node's disk (replaced only when an operator replaces a node's data).
        var fs = SimulatedFileSystem(durableDirectories: ["/"])
        var core: NodeCore?
        let box = ActionBox()
        /// Bumped at every start, so events of an earlier life are ignored.
        var life = 0
        var retired = false
        /// The core's `largeWritesHeld` when last counted (a new core starts again from 0).
        var largeWritesHeldSeen = 0
        /// The core's staging counts when last counted (likewise).
        var stagingSeen = StagingCounts()
        /// Log indexes whose staged references were checked against the disk (I1), this life.
        var stagedCheckedThrough: UInt64 = 0
        var nextRequest: RequestID = 1
        /// Client operations waiting on this node: request id → client index.
        var requests: [RequestID: Int] = [:]
        /// Raft log indexes checked against the ledger.
        var checkedThrough: UInt64 = 0
        var processScheduled = false
        var skew: Int64
        /// The data directory's identity (a new one when the disk is replaced).
        var incarnation: UInt64 = 0
        /// The incarnation this life of the node last learned for each peer (from its "hello").
        var heard: [NodeID: UInt64] = [:]
        /// The nemesis armed a failing fsync on this node's disk.
        var syncFailureArmed = false
        /// A graceful restart waits for the node's next delivery (see the nemesis).
        var stopRequested = false
        /// The process is stopped (SIGSTOP): no ticks, no passes; messages wait in `backlog`.
        var paused = false
        var backlog: [(Message, UInt64)] = []
        /// Client requests that reached the stopped process (request id, operation).
        var waitingRequests: [(RequestID, Int)] = []
        var processWanted = false
        /// The last index this life of the node held durably (`durableIndex`) before it went
        /// down: whatever it restarts from its disk must reach it.
        var durableBeforeDown: UInt64?
        /// When the node last went down (peers' redial back-off grows with the outage).
        var downSince = 0
        /// The session workload's own requests waiting on this node.
        var sessionRequests: [RequestID: SessionRequest] = [:]
        /// This life's lease on its realtime connections, and when its timer last ran.
        var lease: LeaseHolder?
        var leaseTickAt = 0

        init(id: NodeID, skew: Int64) {
            self.id = id
            self.skew = skew
        }
    }

    private enum OpKind {
        /// An administrator's `setRules` (with `--rules`): the document of that number.
        case setRules(Int)
        /// An administrator's quota (with `--quota`), in data bytes.
        case setQuota(Int)
        case read(key: Int)
        case set(key: Int, value: Int)
        case cas(key: Int, expected: Int?, new: Int)
        case update(keys: [Int], values: [Int])
        case increment
        /// An account sign-up (with `--accounts`) for email number `email`.
        case signUp(email: Int)
    }

    private struct Client {
        var issued = 0
        var quota: Int
        var current: Int?
        var known: [Int: Int] = [:]
        /// Its client id and next write number (options.clientWrites).
        var id: UInt64 = 0
        var nextNumber: UInt64 = 1
    }

    private struct Operation {
        var client: Int
        var node: NodeID
        var kind: OpKind
        var call: Int
        var returned: Int?
        /// For reads: the value; for writes: nil.
        var readValue: Int??
        var outcome: StateMachine.Outcome?
        var unknown = false
        /// Its client write key (options.clientWrites) and how many times it was sent.
        var key: ClientWriteKey?
        var attempts = 1
    }

    private let options: WholeNodeOptions
    private var report: WholeNodeReport
    private var swarm: WholeNodeSwarm
    private var queue = EventQueue<Event>()
    private var tracer: TraceRecorder
    private let clock = SimulatedClock()
    private var now = 0 {
        didSet { clock.millis = now }
    }
    private var nodes: [NodeID: SimulatedNode] = [:]
    /// Node ids in creation order (dictionary order never decides anything).
    private var ids: [NodeID] = []
    private var nextNodeID: NodeID
    private var cut: Set<UInt64> = []
    /// Messages to a peer that is down, kept by the sender's transport until it reconnects
    /// (`PeerTransport`'s bounded backlog), by link; the sender's incarnation with each.
    private var parked: [UInt64: [(Message, UInt64)]] = [:]
    /// Links whose transport is still redialling a restarted peer: messages keep queueing
    /// behind the parked ones until the reconnection (one TCP stream: first in, first out).
    private var reconnecting: Set<UInt64> = []
    private let parkedLimit = 1_024
    private var clients: [Client] = []
    private var operations: [Operation] = []
    private var networkRandom: SeededRandom
    private var nemesisRandom: SeededRandom
    /// How long each read-ahead takes on its worker thread (its own stream: other draws stay put).
    private var prepareRandom: SeededRandom
    private var clientRandom: SeededRandom
    private var seedRandom: SeededRandom
    private var presenceRandom: SeededRandom
    private var nextValue = 1
    // Checkers' ledgers.
    private var leaders: [UInt64: NodeID] = [:]
    private var lastLeader: NodeID = 0
    /// Committed entries by index, as first seen committed on any node (index 1 at position 0).
    private var ledger: [BanyanRaft.LogEntry] = []
    /// Values written by each applied command, first application time (ground truth).
    private var firstWritten: [Int: Int] = [:]
    /// Increments applied by each node since its state last started from a snapshot (a start, a
    /// restart, an installed snapshot): each (session, seq) at most once.
    private var incrementsApplied: [NodeID: Set<UInt64>] = [:]
    /// Every session write decided in each node's current state lineage (exactly once).
    private var writesDecided: [NodeID: Set<SessionWrite>] = [:]
    /// Idle records each node expired (the report shows the most any node did).
    private var expiredByNode: [NodeID: Int] = [:]
    private struct SessionWrite: Hashable {
        var session: UInt64
        var seq: UInt64
    }
    /// Blank nodes started for an add that has not yet shown up in the leader's membership, with
    /// when the add was asked for.
    private var pendingAdds: [NodeID: Int] = [:]
    /// Nodes whose data was replaced: the operator removes each and adds it back (R22).
    private var pendingRepair: [NodeID] = []
    /// Nodes whose data was replaced and that the operator has not yet added back: they must not
    /// vote (R22, item 3 of issue 14).
    private var awaitingReadd: Set<NodeID> = []
    /// Replaced nodes the operator has asked to add back (`repairReplacedNodes`). Until a
    /// configuration names the node's new incarnation as a voter, it still counts as a voter
    /// without its data in `beyondFaultBudgetNow` (an add that never completed, because the
    /// cluster lost its quorum first, does not give the old configurations their voter back).
    private var readdAsked: Set<NodeID> = []
    /// Operators are not instant: the blank node runs under its old id for a while (the leader
    /// may replay the whole log to it) before the repair starts.
    private var repairNotBefore = 0
    private var lastRepairAttempt = -1_000
    private var faultsActive: Bool
    private var healedAt: Int?
    /// When log matching was last checked (`checkLogMatching`, every 500 simulated ms).
    private var logMatchingCheckedAt = 0
    private var logMatchingReported: Set<[NodeID]> = []
    private var finished = false
    private var finalWrite: (node: NodeID, request: RequestID, done: Bool)?
    private let tickMillis = 10
    private let requestTimeoutMillis = 3_000

    private init(_ options: WholeNodeOptions) {
        self.options = options
        var root = SeededRandom(seed: options.seed)
        var swarmRandom = SeededRandom(seed: root.next())
        networkRandom = SeededRandom(seed: root.next())
        nemesisRandom = SeededRandom(seed: root.next())
        clientRandom = SeededRandom(seed: root.next())
        seedRandom = SeededRandom(seed: root.next())
        presenceRandom = SeededRandom(seed: root.next())
        prepareRandom = SeededRandom(seed: root.next())
        swarm = WholeNodeSwarm.draw(&swarmRandom, nodes: options.nodes.map { min(max($0, 1), 9) }, faults: options.faults)
        if let bytes = options.snapshotLogBytes { swarm.snapshotLogBytes = bytes }
        if options.sabotage == .leaseWithPauses {
            // Lease reads where the lease's clock assumption cannot hold (R18).
            swarm.pauses = true
            swarm.leaseReads = true
        }
        report = WholeNodeReport(seed: options.seed, swarm: swarm)
        tracer = TraceRecorder(keepLines: options.trace)
        faultsActive = options.faults
        nextNodeID = NodeID(swarm.nodes + 1)
        for c in 0..<options.clients {
            let quota = options.operations / options.clients + (c < options.operations % options.clients ? 1 : 0)
            var client = Client(quota: quota)
            client.id = ((options.seed &+ 1) &* 0x9E37_79B9_7F4A_7C15) ^ (UInt64(c + 1) &* 0xBF58_476D_1CE4_E5B9) | 1
            clients.append(client)
        }
        let founders = (1...NodeID(swarm.nodes)).map { $0 }
        for id in founders {
            let node = SimulatedNode(id: id, skew: Int64(networkRandom.below(40)))
            nodes[id] = node
            ids.append(id)
            start(node, founders: founders)
        }
    }

    // MARK: - Main loop

    private mutating func execute() {
        for id in ids { schedule(after: 1 + networkRandom.below(tickMillis), .tick(id, life: nodes[id]?.life ?? 0)) }
        for c in clients.indices { schedule(after: 30 + clientRandom.below(50), .clientNext(c)) }
        if options.sessions { schedule(after: 100, .presenceNext) }
        if faultsActive { schedule(after: swarm.nemesisMeanMillis, .nemesis) } else { healedAt = 0 }
        schedule(after: 100, .check)
        while !finished, let (time, event) = queue.pop() {
            now = time
            report.stats.events += 1
            if now > options.maxSimulatedMillis {
                report.livenessFailure = "run exceeded \(options.maxSimulatedMillis) simulated ms"
                break
            }
            handle(event)
            if report.stats.events > options.maxEvents || queue.count > 100_000 {
                report.violations.append("t=\(now) resource bound: \(report.stats.events) events, \(queue.count) pending")
                break
            }
        }
        report.stats.simulatedMillis = now
        report.traceHash = tracer.hash
        report.trace = tracer.lines
        for id in ids {
            guard let node = nodes[id] else { continue }
            report.stats.fileOperations += node.fs.operations
            if let core = node.core { report.stats.maxTerm = max(report.stats.maxTerm, core.replica.raft.term) }
        }
        if finished { checkConvergedState() }
        checkLinearizability()
    }

    private mutating func schedule(after delay: Int, _ event: Event) {
        queue.push(now + max(0, delay), event)
    }

    private mutating func traceLine(_ text: @autoclosure () -> String, _ a: UInt64, _ b: UInt64) {
        tracer.record(now: now, text(), a, b)
    }

    private mutating func handle(_ event: Event) {
        switch event {
        case let .tick(id, life):
            guard let node = nodes[id], let core = node.core, node.life == life else { return }
            schedule(after: tickMillis, .tick(id, life: life))
            // A stopped process misses its timers (they do not pile up: one tick on resume).
            guard !node.paused else { return }
            core.tick(now: wallClock(node))
            traceLine("tick \(id)", 1, id)
            if options.sessions { leaseTick(node) }
            // As the server's driver does: the pass runs as a separate task after the tick.
            perform(takeActions(node), on: node)
            scheduleProcess(node, after: networkRandom.below(2))
        case let .process(id, life):
            guard let node = nodes[id], node.core != nil, node.life == life else { return }
            node.processScheduled = false
            if node.paused {
                node.processWanted = true
                return
            }
            node.core?.woke()
            run(node)
        case let .deliver(m, incarnation):
            deliver(m, from: incarnation)
        case let .snapshot(id, life, machine, meta):
            if let node = nodes[id], node.paused, node.life == life {
                schedule(after: 50, .snapshot(id, life: life, machine, meta))
                return
            }
            writeSnapshot(id, life: life, machine, meta)
        case .clientNext(let c):
            issue(c)
        case let .clientTimeout(c, op):
            timeout(c, op: op)
        case .nemesis:
            guard faultsActive else { return }
            nemesis()
            if issuedFraction() >= 0.8 || now > 120_000 {
                schedule(after: 0, .heal)
            } else {
                schedule(after: swarm.nemesisMeanMillis / 2 + nemesisRandom.below(swarm.nemesisMeanMillis), .nemesis)
            }
        case .heal:
            healAll()
        case .restart(let id):
            if let node = nodes[id], node.core == nil, !node.retired { restart(node) }
        case let .resume(id, life):
            if let node = nodes[id], node.life == life { resume(node) }
        case let .reopen(from, to):
            reopen(from, to)
        case .check:
            periodicCheck()
            if !finished { schedule(after: 100, .check) }
        case .presenceNext:
            openPresence()
        case .presenceEnd(let p):
            endPresence(p)
        case let .presenceRetryEnd(p, id, life):
            if let node = nodes[id], node.life == life, node.core != nil, !node.paused { proposeEnd(p, via: node) }
        case let .prepared(id, life, index, term, command):
            guard let node = nodes[id], let core = node.core, node.life == life else { return }
            if node.paused {
                schedule(after: 50, .prepared(id, life: life, index: index, term: term, command))
                return
            }
            core.prepared(index: index, term: term, command)
            perform(takeActions(node), on: node)
            scheduleProcess(node, after: 0)
        case let .storeStaged(id, life, stageID, bytes):
            storeStaged(id, life: life, stageID, bytes)
        case let .prepareStaged(id, life, stageID, bytes):
            guard let node = nodes[id], let core = node.core, node.life == life else { return }
            if node.paused {
                schedule(after: 50, .prepareStaged(id, life: life, stageID, bytes))
                return
            }
            let (result, _) = NodeCore.prepareStaged(stageID, bytes, store: core.storage.staged)
            core.preparedStaged(stageID, result)
            perform(takeActions(node), on: node)
            scheduleProcess(node, after: 0)
        case let .serveStaged(id, life, stageID, peer):
            guard let node = nodes[id], let core = node.core, node.life == life, !node.paused else { return }
            var payload: [UInt8]?
            if case .payload(let bytes, _) = core.storage.staged.load(stageID) { payload = bytes }
            core.stagedRead(stageID, payload, for: peer)
            perform(takeActions(node), on: node)
            scheduleProcess(node, after: 0)
        }
    }

    private func issuedFraction() -> Double {
        Double(clients.reduce(0) { $0 + $1.issued }) / Double(max(1, options.operations))
    }

    private func wallClock(_ node: SimulatedNode) -> Int64 { 1_700_000_000_000 + Int64(now) + node.skew }

    // MARK: - Nodes

    private mutating func settings() -> NodeCore.Settings {
        var raft = RaftConfiguration(id: 0, seed: 0)
        raft.electionTicks = 10
        raft.heartbeatTicks = 1
        raft.snapshotChunkBytes = swarm.snapshotChunkBytes
        raft.promotionLag = 16
        var replica = ReplicaConfiguration(raft: raft)
        replica.snapshotEntries = swarm.snapshotEntries
        replica.snapshotLogBytes = swarm.snapshotLogBytes
        replica.retryTicks = 20
        replica.requestTimeoutTicks = 250
        var s = NodeCore.Settings(replica: replica)
        s.sabotage = options.sabotage
        s.leaseNanoseconds = UInt64(Self.leaseMillis) * 1_000_000
        s.roundIntervalNanoseconds = UInt64(swarm.pacingMillis) * 1_000_000
        // Read-ahead of large entries (docs/replica.md, "Prepared entries"): off in a third of
        // the seeds, for every command in a third, for the larger ones in the rest. Chosen by
        // the seed's remainder so that no other draw moves.
        switch options.seed % 3 {
        case 0: s.replica.prepareThreshold = Int.max
        case 1: s.replica.prepareThreshold = 1
        default: s.replica.prepareThreshold = 90
        }
        s.replica.maxPreparing = 1 + Int(options.seed / 3 % 4)
        // Admission of large writes (docs/replica.md, "Large writes wait their turn"): in two
        // thirds of the seeds, commands of 90 bytes or more are large, one or two in flight.
        switch options.seed / 12 % 3 {
        case 0: s.replica.maxLargeInFlight = 0
        case 1: s.replica.largeEntryBytes = 90
        default:
            s.replica.largeEntryBytes = 90
            s.replica.maxLargeInFlight = 2
        }
        // Staged payloads (docs/staged-payloads.md): off in a third of the seeds; in the others,
        // commands of 100 bytes or more are staged (every command where admission is off, in
        // half of those).
        switch options.seed / 36 % 3 {
        case 0: s.replica.stagingThreshold = .max
        case 1: s.replica.stagingThreshold = 100
        default: s.replica.stagingThreshold = s.replica.maxLargeInFlight == 0 ? 1 : 100
        }
        if options.sabotage == .acceptUnheldPayloads || options.sabotage == .removeNamedPayloads { s.replica.stagingThreshold = 1 }
        if options.sabotage == .restartSnapshotStreams {
            // Compaction that ignores live streams altogether: no hold and no deferral.
            s.replica.compactionWaitsForStreams = false
            s.replica.snapshotDeferral = 1
        }
        if options.sessions || options.clientWrites {
            // Expiry of idle records within a run's minutes: client write records after 40 s
            // without a write (a client's resends end within 15 s of its first copy), ended
            // connections' session records after 60 s (longer than a node keeps retrying a
            // connection's writes and end); checked every 5 s (checked every second, the extra
            // entries kept a slow cluster, seed 133 of --sessions, from settling within the
            // liveness budget).
            s.clientsIdleMillis = 40_000
            s.endedMillis = 60_000
            s.expiryCheckTicks = 500
        }
        return s
    }

    /// Starts (or restarts) a node from its disk. A refused start is a recovery failure.
    private mutating func start(_ node: SimulatedNode, founders: [NodeID]?) {
        var settings = settings()
        settings.replica.raft = RaftConfiguration(id: node.id, seed: seedRandom.next())
        settings.replica.raft.electionTicks = 10
        settings.replica.raft.heartbeatTicks = 1
        settings.replica.raft.snapshotChunkBytes = swarm.snapshotChunkBytes
        settings.replica.raft.promotionLag = 16
        settings.replica.raft.sabotage = options.sabotage
        settings.replica.raft.maxInflightMessages = swarm.inflightWindow
        if swarm.leaseReads { settings.replica.raft.readMode = .leaseBased }
        node.life += 1
        node.box.actions = []
        node.stagedCheckedThrough = 0
        node.stagingSeen = StagingCounts()
        node.requests = [:]
        node.processScheduled = false
        node.heard = [:]
        node.stopRequested = false
        var sessions = SeededRandom(seed: seedRandom.next())
        do {
            let storage = try NodeStorage(
                directory: "/data", fileSystem: node.fs, logger: Self.logger, newIncarnation: seedRandom.next() | 1, sabotage: options.sabotage
            ) { _ in }
            node.incarnation = storage.incarnation
            settings.replica.raft.incarnation = storage.incarnation
            let core = try NodeCore(
                settings: settings, storage: storage, foundingMembers: founders, logger: Self.logger, now: wallClock(node),
                monotonicNanoseconds: { [clock] in UInt64(clock.millis) * 1_000_000 }, newSession: { sessions.next() | 1 }, progress: { _ in })
            let box = node.box
            core.output = { box.actions.append($0) }
            node.core = core
            let restored = core.replica.raft
            traceLine(
                "opened \(node.id): snapshot \(restored.snapshotMeta.index), last \(restored.lastIndex), commit \(restored.commitIndex)"
                    + "\(restored.mayVote ? "" : ", no vote"), incarnation \(String(storage.incarnation, radix: 16))", 28, restored.lastIndex)
            node.checkedThrough = core.replica.raft.snapshotMeta.index
            checkRestoredConfiguration(node.id, core.replica.raft)
            if let durable = node.durableBeforeDown, core.replica.raft.lastIndex < durable {
                report.violations.append(
                    "t=\(now) durability: node \(node.id) restarted with its log ending at \(core.replica.raft.lastIndex), below index \(durable) that it held durably before it went down")
            }
            node.durableBeforeDown = nil
            core.watch(0, watch: 1, namespace: Self.namespace, stale: true)
            // The node's own commands (expiry of idle records) name no namespace.
            if options.sessions || options.clientWrites { core.watch(0, watch: 3, namespace: "", stale: true) }
            if options.sessions {
                core.watch(0, watch: 2, namespace: Self.presenceNamespace, stale: true)
                node.lease = LeaseHolder(
                    holder: presenceRandom.next() | 1, now: Int64(now), leaseMillis: Self.leaseMillis, renewMillis: Self.leaseMillis / 6,
                    marginMillis: Self.leaseMillis / 3)
                node.leaseTickAt = now
                node.sessionRequests = [:]
                presenceLost(on: node)
            }
            _ = takeActions(node)
            incrementsApplied[node.id] = []
            writesDecided[node.id] = []
            presenceFired[node.id] = []
            presenceApplied[node.id] = [:]
            flushParked(to: node)
        } catch {
            if node.fs.isCrashed {
                // The machine crashed while the node opened its disk (an injected crash point):
                // a power loss there, then another start.
                powerCycle(node)
                schedule(after: 50, .restart(node.id))
                return
            }
            if node.syncFailureArmed && !node.fs.failNextSync {
                // An injected fsync failure while opening: the process exits and starts again.
                node.syncFailureArmed = false
                node.fs.restartProcess()
                schedule(after: 50, .restart(node.id))
                return
            }
            node.core = nil
            if case let error as OpLogError = error, error.code == .corrupt, error.message.contains("not a torn tail") {
                // A power loss wrote a later sector and lost an earlier one: the log refuses to
                // open rather than guess (docs/runbook.md). The operator's procedure: replace the
                // node's data; it comes back blank and may not vote (R22) until re-added.
                report.stats.replacements += 1
                traceLine("replace-data \(node.id): \(error.message)", 15, node.id)
                node.fs = SimulatedFileSystem(durableDirectories: ["/"])
                node.durableBeforeDown = nil
                if !pendingRepair.contains(node.id) { pendingRepair.append(node.id) }
                awaitingReadd.insert(node.id)
                readdAsked.remove(node.id)
                schedule(after: 100, .restart(node.id))
                return
            }
            report.violations.append("t=\(now) node \(node.id) refused to restart from its disk: \(error)")
            return
        }
        schedule(after: 1 + networkRandom.below(tickMillis), .tick(node.id, life: node.life))
    }

    private mutating func restart(_ node: SimulatedNode) {
        report.stats.restarts += 1
        traceLine("restart \(node.id)", 2, node.id)
        start(node, founders: nil)
    }

    /// Runs the core's pass and carries out what it asked for.
    private mutating func run(_ node: SimulatedNode) {
        guard let core = node.core else { return }
        core.process()
        perform(takeActions(node), on: node)
        checkNode(node)
    }

    private func takeActions(_ node: SimulatedNode) -> [NodeAction] {
        defer { node.box.actions = [] }
        return node.box.actions
    }

    private mutating func perform(_ actions: [NodeAction], on node: SimulatedNode) {
        if let held = node.core?.replica.largeWritesHeld, held != node.largeWritesHeldSeen {
            report.stats.largeWritesHeld += held > node.largeWritesHeldSeen ? held - node.largeWritesHeldSeen : held
            node.largeWritesHeldSeen = held
        }
        if let counts = node.core?.replica.stagingCounts, counts != node.stagingSeen {
            func grown(_ now: Int, _ seen: Int) -> Int { now >= seen ? now - seen : now }
            let seen = node.stagingSeen
            report.stats.staging.started += grown(counts.started, seen.started)
            report.stats.staging.referenced += grown(counts.referenced, seen.referenced)
            report.stats.staging.abandoned += grown(counts.abandoned, seen.abandoned)
            report.stats.staging.appendsHeld += grown(counts.appendsHeld, seen.appendsHeld)
            report.stats.staging.fetched += grown(counts.fetched, seen.fetched)
            report.stats.staging.removed += grown(counts.removed, seen.removed)
            report.stats.staging.applied += grown(counts.applied, seen.applied)
            node.stagingSeen = counts
        }
        for action in actions {
            switch action {
            case .send(let messages):
                for m in messages { send(m) }
            case let .wrote(id, result):
                if let request = node.sessionRequests.removeValue(forKey: id) {
                    sessionWrote(request, result, on: node)
                    continue
                }
                guard let c = node.requests.removeValue(forKey: id) else {
                    if let fw = finalWrite, fw.node == node.id, fw.request == id, case .success = result { finalWrite?.done = true }
                    continue
                }
                completeWrite(c, result)
            case let .read(id, result):
                guard let c = node.requests.removeValue(forKey: id) else { continue }
                completeRead(c, result)
            case let .membership(_, result):
                if case .failure(let error) = result { traceLine("membership-failed \(node.id): \(error)", 23, node.id) }
            case let .watch(_, event):
                switch event {
                case let .applied(applied, tree):
                    if applied.namespace == Self.presenceNamespace { observePresence(applied, tree: tree, on: node) } else { observeApplied(applied, tree: tree, on: node) }
                // A new lineage of applications: replayed over a snapshot from here on.
                case .restored, .start:
                    incrementsApplied[node.id] = []
                    writesDecided[node.id] = []
                    presenceFired[node.id] = []
                    presenceApplied[node.id] = [:]
                }
            case .peerAddresses:
                break
            case let .writeSnapshot(machine, meta):
                schedule(after: 5 + networkRandom.below(40), .snapshot(node.id, life: node.life, machine, meta))
            case .note(let note):
                switch note {
                case .snapshotInstalled: report.stats.snapshotsInstalled += 1
                case .snapshotWritten: report.stats.snapshotsWritten += 1
                case let .leaseExpiryProposed(holder, namespace):
                    traceLine("lease-expiry \(node.id): holder \(String(holder, radix: 16)) in '\(namespace)'", 44, holder)
                default: break
                }
            case .wake(let nanoseconds):
                scheduleProcess(node, after: Int((nanoseconds + 999_999) / 1_000_000))
            case .processAgain:
                scheduleProcess(node, after: 0)
            case .release:
                break
            case let .storeStaged(stageID, bytes):
                // The staging thread: a write and two fsyncs, 1-6 ms.
                schedule(after: 1 + prepareRandom.below(6), .storeStaged(node.id, life: node.life, stageID, bytes))
            case let .prepareStaged(stageID, bytes):
                report.stats.readAheads += 1
                let answerMillis = prepareRandom.below(10) == 0 ? 1 + prepareRandom.below(25) : 1 + prepareRandom.below(3)
                schedule(after: answerMillis, .prepareStaged(node.id, life: node.life, stageID, bytes))
            case let .serveStaged(stageID, peer):
                schedule(after: 1 + prepareRandom.below(3), .serveStaged(node.id, life: node.life, stageID, to: peer))
            case .removeStaged(let ids):
                removeStaged(ids, on: node)
                if node.core == nil { return }
            case let .prepare(index, term, payload):
                // The server reads ahead on a worker thread: the answer comes back later, and
                // answers to several entries in any order. Mostly within 1-3 ms (a hop to the
                // worker and back, and the parse); one in ten waits 1-25 ms (a busy worker, a
                // descheduled thread). With every answer that slow, seeds reading every entry
                // ahead one at a time applied about 80 entries a second: a leader replaying its
                // log after a restart answered no write for 20 s (seed 169 with sessions and
                // client writes), which no server does.
                report.stats.readAheads += 1
                let answerMillis = prepareRandom.below(10) == 0 ? 1 + prepareRandom.below(25) : 1 + prepareRandom.below(3)
                schedule(after: answerMillis, .prepared(node.id, life: node.life, index: index, term: term, PreparedCommand(payload: payload)))
            case .fatal(let reason):
                if node.fs.isCrashed {
                    diskCrashed(node)
                } else if node.syncFailureArmed {
                    // An fsync failed: the node stops (the server exits with status 75) and its
                    // service manager starts it again; the machine keeps running, so the page
                    // cache still shows the bytes whose write failed (item 7 of issue 14).
                    node.syncFailureArmed = false
                    report.stats.syncFailures += 1
                    traceLine("fsync-failed \(node.id)", 20, node.id)
                    down(node)
                    node.fs.restartProcess()
                    schedule(after: 50 + nemesisRandom.below(200), .restart(node.id))
                } else {
                    report.violations.append("t=\(now) node \(node.id) stopped on a storage error without an injected fault: \(reason)")
                    node.core = nil
                }
                return
            }
        }
    }

    private mutating func scheduleProcess(_ node: SimulatedNode, after delay: Int) {
        guard !node.processScheduled else { return }
        node.processScheduled = true
        schedule(after: delay, .process(node.id, life: node.life))
    }

    /// The staging thread stores a payload on the node's disk, then tells the core.
    private mutating func storeStaged(_ id: NodeID, life: Int, _ stageID: StageID, _ bytes: [UInt8]) {
        guard let node = nodes[id], let core = node.core, node.life == life else { return }
        if node.paused {
            schedule(after: 50, .storeStaged(id, life: life, stageID, bytes))
            return
        }
        do {
            let checksum = try core.storage.staged.store(stageID, bytes)
            core.stagedStored(stageID, checksum: checksum)
        } catch {
            if node.fs.isCrashed { return diskCrashed(node) }
            // A failed fsync (injected) or a full disk: nothing is acknowledged.
            if node.syncFailureArmed && !node.fs.failNextSync { node.syncFailureArmed = false }
            core.stagedStoreFailed(stageID)
        }
        perform(takeActions(node), on: node)
        if node.fs.isCrashed, node.core != nil { return diskCrashed(node) }
        scheduleProcess(node, after: 0)
    }

    /// Removes staged files, checking I3 first: no entry in the node's log above its
    /// compaction point names one of them.
    private mutating func removeStaged(_ ids: [StageID], on node: SimulatedNode) {
        guard let core = node.core else { return }
        let raft = core.replica.raft
        let removing = Set(ids)
        var index = raft.firstIndex
        while index <= raft.lastIndex {
            if let entry = raft.entry(at: index), entry.kind == .command, let reference = StagedReference(decoding: entry.data), removing.contains(reference.id) {
                report.violations.append("t=\(now) node \(node.id) removed staged payload \(reference.id), which its log names at index \(index) (I3)")
            }
            index += 1
        }
        do {
            try core.storage.staged.remove(ids)
        } catch {
            if node.fs.isCrashed { return diskCrashed(node) }
            // A removal that failed leaves a file: harmless.
        }
    }

    /// I1 (docs/staged-payloads.md): every staged reference this node persisted in its log has
    /// its payload in the node's staged store, whole, with the checksum the reference names.
    private mutating func checkStagedHeld(_ node: SimulatedNode) {
        guard let core = node.core, options.sabotage != .removeNamedPayloads else { return }
        let raft = core.replica.raft
        let through = raft.stableIndex
        // Entries above the commit index may be replaced (a follower's log after a leader
        // change): they are checked again at every pass.
        var index = max(min(node.stagedCheckedThrough, raft.commitIndex) + 1, raft.firstIndex)
        while index <= through {
            if let entry = raft.entry(at: index), entry.kind == .command, let reference = StagedReference(decoding: entry.data) {
                switch core.storage.staged.load(reference.id) {
                case .payload(_, let checksum) where checksum == reference.checksum:
                    break
                case let other:
                    report.violations.append(
                        "t=\(now) node \(node.id) holds index \(index), a reference to staged payload \(reference.id), without the payload (\(other == .missing ? "missing" : "wrong or damaged")) (I1)")
                }
            }
            index += 1
        }
        node.stagedCheckedThrough = max(node.stagedCheckedThrough, through)
    }

    /// The snapshot thread: writes the machine to the node's disk, then tells the core.
    private mutating func writeSnapshot(_ id: NodeID, life: Int, _ machine: StateMachine, _ meta: SnapshotMeta) {
        guard let node = nodes[id], let core = node.core, node.life == life else { return }
        do {
            // The server's snapshot thread, on the node's simulated disk.
            try SnapshotWriter(directory: "/data", fileSystem: node.fs).write(machine, meta: meta) { _ in }
            core.snapshotWritten(meta)
        } catch {
            if node.fs.isCrashed { return diskCrashed(node) }
            // The snapshot thread reports a failed write (an injected fsync failure included)
            // and a later snapshot is tried.
            if node.syncFailureArmed && !node.fs.failNextSync { node.syncFailureArmed = false }
            core.snapshotFailed(meta)
        }
        perform(takeActions(node), on: node)
        if node.fs.isCrashed, node.core != nil { diskCrashed(node) }
    }

    /// A file-system operation hit the injected crash point: the machine lost power there.
    private mutating func diskCrashed(_ node: SimulatedNode) {
        report.stats.diskCrashes += 1
        traceLine("disk-crash \(node.id)", 3, node.id)
        down(node)
        powerCycle(node)
        schedule(after: 100 + nemesisRandom.below(600), .restart(node.id))
    }

    /// A reboot: each file keeps a random share of its unsynced bytes, sectors reach the disk in
    /// no particular order.
    private mutating func powerCycle(_ node: SimulatedNode) {
        let policy = nemesisRandom.below(3)
        var sectors = SeededRandom(seed: nemesisRandom.next())
        node.fs.reboot(
            keepUnsynced: { _, n in policy == 0 ? 0 : policy == 1 ? n : n / 2 },
            keepSector: { _, _ in sectors.chance(1, in: 2) })
    }

    /// The node stops: its memory is gone, its waiting clients learn nothing (unknown outcomes).
    private mutating func down(_ node: SimulatedNode) {
        if let raft = node.core?.replica.raft { node.durableBeforeDown = raft.durableIndex }
        node.paused = false
        node.backlog = []
        node.waitingRequests = []
        node.processWanted = false
        for id in ids {
            parked[link(node.id, id)] = nil
            reconnecting.remove(link(node.id, id))
        }
        if node.core != nil { node.downSince = now }
        node.core = nil
        if options.sessions { presenceLost(on: node) }
        node.lease = nil
        node.sessionRequests = [:]
        node.life += 1
        for (_, c) in node.requests.sorted(by: { $0.key < $1.key }) { abandon(c) }
        node.requests = [:]
    }

    // MARK: - Network

    private func link(_ from: NodeID, _ to: NodeID) -> UInt64 { from << 32 | to }

    private mutating func send(_ m: Message) {
        report.stats.messagesSent += 1
        if cut.contains(link(m.from, m.to)) || networkRandom.below(100) < swarm.lossPercent {
            report.stats.messagesDropped += 1
            return
        }
        let incarnation = nodes[m.from]?.incarnation ?? 0
        if let target = nodes[m.to], (target.core == nil && !target.retired) || reconnecting.contains(link(m.from, m.to)) {
            // The peer is down: the transport keeps the message for the next connection, and
            // delivers it to whatever process answers there (a restarted node's new life).
            if parked[link(m.from, m.to), default: []].count < parkedLimit { parked[link(m.from, m.to), default: []].append((m, incarnation)) }
            return
        }
        // Peer links are TLS streams: a long delay holds one message (a retransmission, a
        // reconnect) and lets later ones pass, as reconnections after a stall do.
        let delay = swarm.longDelays && networkRandom.below(100) < 2 ? 50 + networkRandom.below(450) : 1 + networkRandom.below(swarm.maxDelayMillis)
        schedule(after: delay, .deliver(m, incarnation))
        if networkRandom.below(100) < swarm.duplicatePercent {
            schedule(after: 1 + networkRandom.below(swarm.maxDelayMillis * 2), .deliver(m, incarnation))
        }
    }

    /// A message body for `--trace` lines: entries and snapshot data summarised, not printed.
    private static func traceDescription(_ body: Message.Body) -> String {
        switch body {
        case let .append(prevIndex, prevTerm, entries, commit):
            let last = entries.last.map { "\($0.index)/\($0.term)" } ?? "-"
            return "append(prev: \(prevIndex)/\(prevTerm), entries: \(entries.count), last: \(last), commit: \(commit))"
        case let .snapshotChunk(meta, offset, data, last):
            return "snapshotChunk(\(meta.index)/\(meta.term), offset: \(offset), bytes: \(data.count), last: \(last))"
        case .proposal(let commands):
            return "proposal(commands: \(commands.count))"
        default:
            return "\(body)"
        }
    }

    private mutating func deliver(_ m: Message, from incarnation: UInt64) {
        guard let node = nodes[m.to], let core = node.core, !cut.contains(link(m.from, m.to)) else { return }
        if node.paused {
            // The kernel keeps accepting bytes for a stopped process (up to its buffers).
            if node.backlog.count < 4_096 { node.backlog.append((m, incarnation)) }
            return
        }
        traceLine("deliver \(m.from)->\(m.to) term \(m.term) \(Self.traceDescription(m.body))", 4, m.from << 32 | m.to)
        // The first message of a connection comes after its hello, which names the sender's
        // incarnation (a message from an earlier incarnation still names that one).
        if node.heard[m.from] != incarnation {
            node.heard[m.from] = incarnation
            core.noteIncarnation(of: m.from, incarnation)
        }
        core.receive([m])
        if node.stopRequested {
            // Aimed at replication that changes the log (appends and snapshot chunks), where
            // the in-memory log runs ahead of the disk until the pass persists it.
            switch m.body {
            case .append, .snapshotChunk: return gracefulRestart(node)
            default: break
            }
        }
        scheduleProcess(node, after: networkRandom.below(2))
    }

    // MARK: - Nemesis

    private var liveIDs: [NodeID] { ids.filter { nodes[$0]?.core != nil } }

    /// The leader the operator (and the nemesis) would act through: the running node that leads
    /// the highest term. A stopped process may still believe it leads an older term (soak seed
    /// 111100: the simulator retired members a paused leader did not know about yet).
    private var currentLeader: NodeID? {
        var best: (NodeID, UInt64)?
        for id in liveIDs where nodes[id]?.paused == false {
            guard let raft = nodes[id]?.core?.replica.raft, raft.role == .leader else { continue }
            if best == nil || raft.term > best?.1 ?? 0 { best = (id, raft.term) }
        }
        return best?.0
    }

    private mutating func nemesis() {
        var actions: [Int] = []
        if swarm.crashes { actions += [0, 0] }
        if swarm.diskCrashes { actions += [1, 1] }
        if swarm.powerLoss { actions.append(2) }
        if swarm.partitions { actions += [3, 4, 12] }
        if swarm.membershipChanges { actions.append(5) }
        if swarm.transfers { actions.append(6) }
        if swarm.crashes { actions += [7, 9] }
        if swarm.diskCrashes { actions.append(8) }
        if swarm.pauses { actions += [10, 10] }
        if swarm.dataLoss { actions.append(11) }
        if swarm.badSectors { actions.append(13) }
        guard !actions.isEmpty else { return }
        report.stats.faults += 1
        let live = liveIDs
        switch actions[nemesisRandom.below(actions.count)] {
        case 0:
            // Kill a node (the leader half the time): the process dies, the machine does not, so
            // everything written survives (the page cache is the kernel's).
            guard let id = nemesisRandom.chance(1, in: 2) ? currentLeader ?? pick(live) : pick(live), let node = nodes[id] else { return }
            report.stats.crashes += 1
            traceLine("kill \(id)", 5, id)
            down(node)
            node.fs.restartProcess()
            schedule(after: 100 + nemesisRandom.below(900), .restart(id))
        case 1:
            // Crash a node's machine at one of its next file-system operations.
            guard let id = pick(live), let node = nodes[id] else { return }
            node.fs.crashAtOperation = node.fs.operations + 1 + nemesisRandom.below(30)
            traceLine("arm-disk-crash \(id)", 6, id)
        case 2:
            // Power loss of the whole cluster.
            report.stats.powerLosses += 1
            traceLine("power-loss", 7, 0)
            for id in live {
                guard let node = nodes[id] else { continue }
                down(node)
                powerCycle(node)
                schedule(after: 200 + nemesisRandom.below(800), .restart(id))
            }
        case 3:
            // Split the live nodes in two.
            let shuffled = shuffle(ids)
            let k = 1 + nemesisRandom.below(max(1, shuffled.count - 1))
            let a = Set(shuffled.prefix(k))
            // A one-way partition: traffic from the first group to the second is lost, the
            // other way flows (a half-broken link, a firewall rule on one side).
            let oneWay = swarm.oneWayPartitions && nemesisRandom.chance(1, in: 2)
            for x in ids {
                for y in ids where x != y && a.contains(x) && !a.contains(y) {
                    cut.insert(link(x, y))
                    if !oneWay { cut.insert(link(y, x)) }
                }
            }
            traceLine(oneWay ? "partition-one-way" : "partition", 8, UInt64(k))
            schedule(after: 300 + nemesisRandom.below(1_500), .heal)
        case 4:
            // Isolate the leader.
            guard let leader = currentLeader else { return }
            for y in ids where y != leader {
                cut.insert(link(leader, y))
                cut.insert(link(y, leader))
            }
            traceLine("isolate \(leader)", 9, leader)
            schedule(after: 300 + nemesisRandom.below(1_500), .heal)
        case 13:
            // A node stops and a synced sector in the middle of its last log segment reads back
            // as zeros: the log must refuse to open (valid synced records follow the damage),
            // and the runbook's replacement follows. Drawn under the same conditions as a lost
            // disk, which is what it becomes.
            guard pendingRepair.isEmpty, pendingAdds.isEmpty, let leader = currentLeader,
                let raft = nodes[leader]?.core?.replica.raft, raft.membership.voters.count >= 3,
                raft.membership.voters.allSatisfy(hasDurableVote),
                let id = pick(raft.membership.voters.filter { $0 != leader && live.contains($0) }), let node = nodes[id],
                let segment = (try? node.fs.list("/data/raft/log"))?.filter({ $0.hasSuffix(".seg") }).sorted().last
            else { return }
            let path = "/data/raft/log/" + segment
            // The records' end: segments are preallocated, so zeros follow the last record.
            let bytes = (try? node.fs.readAll(path)) ?? []
            let written = (bytes.lastIndex(where: { $0 != 0 }) ?? 0) + 1
            let durable = min(node.fs.durableSize(path), written)
            let sector = node.fs.sectorBytes
            // A whole sector, after the header's and before the last synced one.
            guard durable >= 4 * sector else { return }
            let at = (1 + nemesisRandom.below(durable / sector - 2)) * sector
            traceLine("bad-sector \(id) at \(at)", 29, id)
            report.stats.badSectors += 1
            down(node)
            node.fs.restartProcess()
            node.fs.zero(path, at: at, count: sector)
            schedule(after: 100 + nemesisRandom.below(400), .restart(id))
        case 12:
            if ids.count >= 5 && nemesisRandom.chance(1, in: 2) {
                // A ring of majorities (five nodes): each node reaches only its neighbour on
                // either side, so every node sees a majority and no two neighbourhoods agree.
                let ring = shuffle(ids)
                for (i, x) in ring.enumerated() {
                    for (j, y) in ring.enumerated() where x != y {
                        let d = abs(i - j)
                        if min(d, ring.count - d) > 1 { cut.insert(link(x, y)) }
                    }
                }
                traceLine("partition-ring", 26, 0)
            } else {
                // Cut a node's inbound links: it speaks and is not heard back.
                guard let id = pick(ids) else { return }
                for y in ids where y != id { cut.insert(link(y, id)) }
                traceLine("cut-inbound \(id)", 27, id)
            }
            schedule(after: 300 + nemesisRandom.below(1_500), .heal)
        case 5:
            changeMembership()
        case 8:
            // The next fsync on a node's disk fails (EIO).
            guard let id = pick(live), let node = nodes[id] else { return }
            node.fs.failNextSync = true
            node.syncFailureArmed = true
            traceLine("arm-fsync-failure \(id)", 21, id)
        case 7:
            // A graceful restart (SIGTERM, a rolling restart). Half the time it lands at once;
            // otherwise right after the node's next delivery and before the pass that would
            // persist it: the server's driver allows that order (the shutdown task can run between
            // a peer message's task and the pass it schedules), and it is where a saved commit can
            // run ahead of the disk.
            guard let id = pick(live), let node = nodes[id] else { return }
            if nemesisRandom.chance(1, in: 2) { gracefulRestart(node) } else { node.stopRequested = true }
        case 9:
            guard let id = pick(live), let node = nodes[id] else { return }
            node.stopRequested = true
        case 10:
            // Stop a process (SIGSTOP, a long GC pause, a frozen VM), the leader half the time.
            guard let id = nemesisRandom.chance(1, in: 2) ? currentLeader ?? pick(live) : pick(live), let node = nodes[id], !node.paused
            else { return }
            report.stats.pauses += 1
            node.paused = true
            traceLine("pause \(id)", 23, id)
            schedule(after: 100 + nemesisRandom.below(1_900), .resume(id, life: node.life))
        case 11:
            // A node's disk is lost: the operator gives it a blank one under the same id
            // (docs/runbook.md), then removes the id and adds it back through the leader.
            // Only while the cluster can afford it: no other repair or add in progress, at
            // least three voters, every one of them able to vote (losing two disks of three is
            // beyond any quorum system).
            guard pendingRepair.isEmpty, pendingAdds.isEmpty, let leader = currentLeader,
                let raft = nodes[leader]?.core?.replica.raft, raft.membership.voters.count >= 3,
                raft.membership.voters.allSatisfy(hasDurableVote),
                case let candidates = raft.membership.voters.filter({ $0 != leader && live.contains($0) }),
                // Half the time a voter that joined by an add, when there is one: its learner
                // entry is in the log, the history a wiped node must not replay into a vote.
                case let joined = candidates.filter({ $0 > NodeID(swarm.nodes) }),
                let id = !joined.isEmpty && nemesisRandom.chance(1, in: 2) ? pick(joined) : pick(candidates), let node = nodes[id]
            else { return }
            report.stats.disksLost += 1
            traceLine("lose-disk \(id)", 24, id)
            down(node)
            node.durableBeforeDown = nil
            node.fs = SimulatedFileSystem(durableDirectories: ["/"])
            if !pendingRepair.contains(id) { pendingRepair.append(id) }
            awaitingReadd.insert(id)
            readdAsked.remove(id)
            repairNotBefore = now + 500 + nemesisRandom.below(3_000)
            schedule(after: 100 + nemesisRandom.below(400), .restart(id))
        default:
            guard let leader = currentLeader, let core = nodes[leader]?.core else { return }
            let voters = core.replica.raft.membership.voters.filter { $0 != leader && nodes[$0]?.core != nil }
            guard let target = pick(voters) else { return }
            try? core.transferLeadership(to: target)
            traceLine("transfer \(leader)->\(target)", 10, target)
            if let node = nodes[leader] { run(node) }
        }
    }

    /// SIGTERM: the core saves its commit index and ends its waiters; the process starts again
    /// from its disk (the machine stays up: the page cache survives).
    private mutating func gracefulRestart(_ node: SimulatedNode) {
        guard let core = node.core else { return }
        report.stats.gracefulRestarts += 1
        traceLine("graceful-restart \(node.id)", 17, node.id)
        core.shutdown()
        perform(takeActions(node), on: node)
        down(node)
        node.fs.restartProcess()
        schedule(after: 20 + nemesisRandom.below(300), .restart(node.id))
    }

    /// The senders' transports reconnect to a restarted node and flush what they kept, in order.
    private mutating func flushParked(to node: SimulatedNode) {
        for from in ids {
            guard let queued = parked.removeValue(forKey: link(from, node.id)), !queued.isEmpty, !reconnecting.contains(link(from, node.id))
            else { continue }
            // Redials back off exponentially (to 2 s) while the peer is away, so the flush
            // comes anywhere up to about one outage (at most 2 s) after the restart.
            parked[link(from, node.id)] = queued
            reconnecting.insert(link(from, node.id))
            let delay = 10 + networkRandom.below(min(2_000, max(10, now - node.downSince)))
            schedule(after: delay, .reopen(from: from, to: node.id))
        }
    }

    private mutating func reopen(_ from: NodeID, _ to: NodeID) {
        guard reconnecting.remove(link(from, to)) != nil, let queued = parked.removeValue(forKey: link(from, to)) else { return }
        // Delivered in order at the next millisecond (later sends take at least that long).
        for (m, incarnation) in queued { schedule(after: 1, .deliver(m, incarnation)) }
    }

    /// SIGCONT: the process runs again; what reached its socket meanwhile is read in order.
    private mutating func resume(_ node: SimulatedNode) {
        guard node.paused, node.core != nil else { return }
        node.paused = false
        traceLine("resume \(node.id)", 25, node.id)
        let backlog = node.backlog
        let waiting = node.waitingRequests
        node.backlog = []
        node.waitingRequests = []
        // Which socket the resumed process reads first is up to the event loop: clients' or
        // peers' (a resumed leader may serve requests before it hears of a newer term).
        let clientsFirst = nemesisRandom.chance(1, in: 2)
        if clientsFirst {
            for (id, op) in waiting { submit(id, op, to: node) }
        }
        for (m, incarnation) in backlog {
            guard node.core != nil, !node.paused else { break }
            deliver(m, from: incarnation)
        }
        if !clientsFirst {
            for (id, op) in waiting { submit(id, op, to: node) }
        }
        if node.processWanted {
            node.processWanted = false
            scheduleProcess(node, after: 0)
        }
    }

    private mutating func pick(_ list: [NodeID]) -> NodeID? {
        list.isEmpty ? nil : list[nemesisRandom.below(list.count)]
    }

    private mutating func shuffle(_ a: [NodeID]) -> [NodeID] { nemesisRandom.shuffled(a) }

    /// Through the leader: add a blank node (the leader promotes it once caught up), or remove a
    /// voter (at least three stay).
    private mutating func changeMembership() {
        guard let leader = currentLeader, let node = nodes[leader], let core = node.core else { return }
        let membership = core.replica.raft.membership
        // Seven members at most: with seven, remove a voter, if more than three are left, or
        // nothing (seed 5028 once took the voters to one while its learners could not catch up).
        let full = membership.all.count >= 7
        if full && membership.voters.count <= 3 { return }
        report.stats.membershipChanges += 1
        if membership.voters.count > 3 && (nemesisRandom.chance(1, in: 2) || full) {
            // No operator removes a healthy voter while another one waits for its repair: that
            // spends the fault tolerance the repair is restoring (soak seed 1253064).
            guard pendingRepair.isEmpty, awaitingReadd.isEmpty else { return }
            guard let victim = pick(membership.voters.filter { $0 != leader }) else { return }
            traceLine("remove \(victim)", 11, victim)
            core.changeMembership(node.nextRequest, .remove(victim))
            node.nextRequest += 1
        } else {
            let id = nextNodeID
            nextNodeID += 1
            let fresh = SimulatedNode(id: id, skew: Int64(networkRandom.below(40)))
            nodes[id] = fresh
            ids.append(id)
            start(fresh, founders: nil)
            pendingAdds[id] = now
            traceLine("add \(id)", 12, id)
            core.addMember(node.nextRequest, node: id, address: "node\(id):7000")
            node.nextRequest += 1
        }
        run(node)
    }

    private mutating func healAll() {
        guard faultsActive || healedAt == nil else { return }
        if faultsActive && issuedFraction() < 0.8 && now <= 120_000 {
            // A partition's own end: only the links.
            cut = []
            return
        }
        faultsActive = false
        if healedAt == nil { healedAt = now }
        cut = []
        traceLine("heal", 13, 0)
        for id in ids {
            guard let node = nodes[id] else { continue }
            node.fs.crashAtOperation = nil
            node.fs.failNextSync = false
            node.syncFailureArmed = false
            if node.paused { resume(node) }
            if node.core == nil && !node.retired && !node.fs.isCrashed { schedule(after: 10, .restart(id)) }
        }
    }

    // MARK: - Clients

    private mutating func issue(_ c: Int) {
        guard clients[c].current == nil, clients[c].issued < clients[c].quota else { return }
        clients[c].issued += 1
        let live = liveIDs
        guard let target = live.isEmpty ? nil : live[clientRandom.below(live.count)], let node = nodes[target], node.core != nil else {
            // No node up: a definite failure; try again later.
            report.stats.writesRefused += 1
            schedule(after: 50, .clientNext(c))
            return
        }
        var kind: OpKind
        let roll = clientRandom.below(100)
        let key = clientRandom.below(options.keys)
        if options.rules && c == 0 && (clients[c].issued == 1 || clients[c].issued == clients[c].quota / 2 + 1) {
            kind = .setRules(clients[c].issued == 1 ? 0 : 1)
        } else if options.quota && c == clients.count - 1 && (clients[c].issued == 1 || clients[c].issued == clients[c].quota / 2 + 1) {
            kind = .setQuota(clients[c].issued == 1 ? WholeNodeOptions.quotaBytes.0 : WholeNodeOptions.quotaBytes.1)
        } else if options.accounts && roll < 10 {
            kind = .signUp(email: key)
        } else if roll < 30 {
            kind = .read(key: key)
        } else if roll < 55 {
            kind = .set(key: key, value: freshValue())
        } else if roll < 75 {
            kind = .cas(key: key, expected: clients[c].known[key], new: freshValue())
        } else if roll < 90 {
            let other = (key + 1 + clientRandom.below(max(1, options.keys - 1))) % options.keys
            let keys = other == key ? [key] : [key, other].sorted()
            kind = .update(keys: keys, values: keys.map { _ in freshValue() })
        } else {
            kind = .increment
        }
        let op = operations.count
        operations.append(Operation(client: c, node: target, kind: kind, call: now))
        if options.clientWrites {
            switch kind {
            case .set, .cas, .update, .increment:
                // One operation at a time per client: every earlier number was answered or
                // given up, so the acknowledgement reaches this one.
                let n = clients[c].nextNumber
                clients[c].nextNumber += 1
                operations[op].key = ClientWriteKey(client: clients[c].id, number: n, acknowledgedBelow: n)
            case .read, .setRules, .setQuota, .signUp:
                break
            }
        }
        clients[c].current = op
        let id = node.nextRequest
        node.nextRequest += 1
        node.requests[id] = c
        traceLine("client \(c) op \(op) at \(target)", 14, UInt64(op))
        schedule(after: requestTimeoutMillis, .clientTimeout(c, op: op))
        if node.paused {
            // The request waits in the stopped process's socket.
            node.waitingRequests.append((id, op))
            return
        }
        submit(id, op, to: node)
    }

    /// Hands a client's request to the node's core.
    private mutating func submit(_ id: RequestID, _ op: Int, to node: SimulatedNode) {
        guard let core = node.core, node.requests[id] != nil else { return }
        switch operations[op].kind {
        case .read:
            core.read(id, namespace: Self.namespace, stale: false)
        case .setRules(let n):
            core.write(id, namespace: Self.namespace, command: .setRules(text: Array(Self.rulesDocuments[n].utf8)))
        case .setQuota(let bytes):
            core.write(id, namespace: StateMachine.quotasNamespace, command: .set(path: "/" + Self.namespace, json: Array(String(bytes).utf8)))
        case .signUp(let email):
            let record = AccountRecord(uid: "op\(op)", email: "E\(email)@sim.test", provider: "password", refreshKey: "k\(op)")
            core.write(id, namespace: Self.accountsProject, command: .account(.create(record)))
        case let .set(key, value):
            core.write(
                id, namespace: Self.namespace, command: .set(path: "/k\(key)", json: Array("\(value)".utf8)), auth: auth(operations[op].client),
                clientWrite: operations[op].key)
        case let .cas(key, expected, new):
            let hash = expected.map { Tree(.int(Int64($0))).hashString } ?? ""
            core.write(
                id, namespace: Self.namespace, command: .compareAndSet(path: "/k\(key)", expectedHash: hash, json: Array("\(new)".utf8)),
                auth: auth(operations[op].client), clientWrite: operations[op].key)
        case let .update(keys, values):
            let items = zip(keys, values).map { Command.UpdateItem(path: "k\($0.0)", json: Array("\($0.1)".utf8)) }
            core.write(
                id, namespace: Self.namespace, command: .update(path: "/", entries: items), auth: auth(operations[op].client),
                clientWrite: operations[op].key)
        case .increment:
            core.write(
                id, namespace: Self.namespace,
                command: .set(path: "/\(Self.counterKey)", json: Array(#"{".sv":{"increment":1}}"#.utf8)), auth: auth(operations[op].client),
                clientWrite: operations[op].key)
        }
        perform(takeActions(node), on: node)
        scheduleProcess(node, after: 0)
    }

    /// The `auth` a client's writes carry with `--rules` (none otherwise: not judged).
    private func auth(_ client: Int) -> ClientAuth? {
        options.rules ? .user(json: Array(#"{"uid":"c\#(client)","provider":"custom","token":{}}"#.utf8)) : nil
    }

    /// The rules documents of `--rules`: the first lets `k0` only grow; the second also keeps
    /// client 0 from writing anything but the counter and `k1` to even values. Which writes they
    /// deny depends on the data at each write's position in the log.
    static let rulesDocuments = [
        #"{"rules": {".read": true, ".write": true, "k0": {".validate": "!data.exists() || newData.val() > data.val()"}}}"#,
        #"{"rules": {".read": true, ".write": "auth.uid != 'c0'", "n": {".write": true}, "k0": {".validate": "!data.exists() || newData.val() > data.val()"}, "k1": {".validate": "newData.val() % 2 == 0"}}}"#,
    ]

    private mutating func freshValue() -> Int {
        defer { nextValue += 1 }
        return nextValue
    }

    private mutating func completeWrite(_ c: Int, _ result: WriteResult) {
        guard let op = clients[c].current else { return }
        switch result {
        case .success(var applied):
            if case .alreadyApplied(let earlier) = applied.outcome {
                // An earlier copy of this client write was decided: its outcome is the answer.
                report.stats.clientAlreadyApplied += 1
                switch earlier.status {
                case "ok": applied.outcome = .ok
                case "datastale": applied.outcome = .datastale(current: .empty)
                case "permission_denied": applied.outcome = .permissionDenied(reason: earlier.message)
                case "failure" where earlier.message.hasPrefix("QUOTA:"): applied.outcome = .overQuota(namespace: Self.namespace, used: 0, wouldHold: 0, quota: 0)
                default: applied.outcome = .refused(earlier.message)
                }
            }
            operations[op].outcome = applied.outcome
            operations[op].returned = now
            report.stats.writesOK += 1
            switch applied.outcome {
            case .ok, .datastale: break
            case .permissionDenied where options.rules:
                // Definitely not applied (the history checks that its value never shows up).
                operations[op].outcome = nil
                report.stats.writesDenied += 1
            case .overQuota where options.quota:
                // Definitely not applied, as a denied write.
                operations[op].outcome = nil
                report.stats.writesOverQuota += 1
            case .refused where AccountRefusal(applied.outcome) == .emailExists:
                // A sign-up that lost its email's race (checked in `checkAccounts`).
                if case .signUp = operations[op].kind {} else { report.violations.append("t=\(now) client \(c) op \(op): unexpected outcome \(applied.outcome)") }
            default: report.violations.append("t=\(now) client \(c) op \(op): unexpected outcome \(applied.outcome)")
            }
            learn(c, op: op)
        case .failure(.overloaded) where operations[op].attempts > 1:
            // This copy was refused before it was proposed, but an earlier one may apply: the
            // write goes again, or its outcome stays unknown.
            if resend(c, op) { return }
            operations[op].unknown = true
            report.stats.writesUnknown += 1
        case .failure(.overloaded(let why)):
            // Refused before it was proposed: it must never apply (not in the history).
            traceLine("client \(c) op \(op) refused: \(why)", 14, UInt64(op))
            operations[op].returned = now
            operations[op].unknown = false
            operations[op].outcome = nil
            report.stats.writesRefused += 1
        case .failure:
            if resend(c, op) { return }
            operations[op].unknown = true
            report.stats.writesUnknown += 1
        }
        next(c)
    }

    /// A client write whose outcome is not known goes again, with the same key, through a live
    /// node (options.clientWrites): the state machine decides it at most once.
    private mutating func resend(_ c: Int, _ op: Int) -> Bool {
        guard operations[op].key != nil, operations[op].attempts < 5, !closingPresences else { return false }
        for node in nodes.values { node.requests = node.requests.filter { $0.value != c } }
        let live = liveIDs
        guard let target = live.isEmpty ? nil : live[clientRandom.below(live.count)], let node = nodes[target], node.core != nil else { return false }
        operations[op].attempts += 1
        operations[op].node = target
        report.stats.clientResends += 1
        let id = node.nextRequest
        node.nextRequest += 1
        node.requests[id] = c
        traceLine("client \(c) op \(op) again at \(target)", 14, UInt64(op))
        schedule(after: requestTimeoutMillis, .clientTimeout(c, op: op))
        if node.paused {
            node.waitingRequests.append((id, op))
        } else {
            submit(id, op, to: node)
        }
        return true
    }

    private mutating func completeRead(_ c: Int, _ result: Result<Tree, ReplicaError>) {
        guard let op = clients[c].current, case .read(let key) = operations[op].kind else { return }
        switch result {
        case .success(let tree):
            let value: Int?
            if case .int(let v)? = tree.child(at: Path(segments: [ChildKey(unchecked: "k\(key)")])).leaf { value = Int(v) } else { value = nil }
            operations[op].readValue = .some(value)
            operations[op].returned = now
            if let value { clients[c].known[key] = value } else { clients[c].known[key] = nil }
            report.stats.readsOK += 1
        case .failure:
            report.stats.readsFailed += 1
        }
        next(c)
    }

    /// After an acknowledged write the client knows the values it wrote (for its next cas).
    private mutating func learn(_ c: Int, op: Int) {
        switch operations[op].kind {
        case let .set(key, value): clients[c].known[key] = value
        case let .cas(key, _, new): if operations[op].outcome == .ok { clients[c].known[key] = new }
        case let .update(keys, values): for (k, v) in zip(keys, values) { clients[c].known[k] = v }
        default: break
        }
    }

    private mutating func next(_ c: Int) {
        clients[c].current = nil
        schedule(after: 5 + clientRandom.below(40), .clientNext(c))
    }

    private mutating func timeout(_ c: Int, op: Int) {
        guard clients[c].current == op else { return }
        if resend(c, op) { return }
        abandon(c)
    }

    /// The client gives up waiting: a write's outcome is unknown, a read is dropped.
    private mutating func abandon(_ c: Int) {
        guard let op = clients[c].current else { return }
        if case .read = operations[op].kind {
            report.stats.readsFailed += 1
        } else {
            operations[op].unknown = true
            report.stats.writesUnknown += 1
        }
        for node in nodes.values { node.requests = node.requests.filter { $0.value != c } }
        next(c)
    }

    // MARK: - Realtime connections (options.sessions)

    static let presenceNamespace = "presence"
    /// The node lease in the simulator (20 s in the server): renewals every sixth of it, the
    /// fence a third of it early.
    static let leaseMillis: Int64 = 3_000
    /// Tries of a connection's end before its node lets its lease holder go.
    static let endAttempts = 4

    enum SessionRequest {
        case register(Int)
        case renew(holder: UInt64, number: UInt64)
        case end(Int)
        case other
    }

    /// One realtime connection: it queues `off` at `/p/c<index>` and writes `on` there; it
    /// ends by a close on its node, an `ls` from another node, a fence, or its node's death.
    struct Presence {
        var id: UInt64
        var secret: UInt64
        var node: NodeID
        var life: Int
        var holder: UInt64
        /// Whether its onDisconnect registration applied (nil: unknown yet or never).
        var registered: Bool?
        /// Served by its node: not closed, the node's life not over.
        var open = true
        var endAcknowledged = false
        var endAttempts = 0
        /// The client session of the connection that reconnected naming this one (`ls`): its
        /// end was proposed there, first in that connection's ordered stream.
        var endSession: UInt64?
    }
    private var presences: [Presence] = []
    private var presenceByConnection: [UInt64: Int] = [:]
    /// Queues fired in each node's current lineage of applications (exactly once).
    private var presenceFired: [NodeID: Set<Int>] = [:]
    /// Queues whose firing some node has applied.
    private var presenceFiredAnywhere: Set<Int> = []
    /// Per node lineage, the last sequence number each connection had applied: a connection's
    /// commands apply in the order it sent them (ordered sessions).
    private var presenceApplied: [NodeID: [UInt64: UInt64]] = [:]
    /// Set once the run's clients close their connections for good.
    private var closingPresences = false

    private mutating func sessionRequest(_ node: SimulatedNode, _ request: SessionRequest) -> RequestID {
        let id = node.nextRequest
        node.nextRequest += 1
        node.sessionRequests[id] = request
        return id
    }

    private mutating func openPresence() {
        if issuedFraction() < 1 { schedule(after: 150 + presenceRandom.below(300), .presenceNext) }
        // Clients reach nodes a load balancer finds ready: running and caught up with the
        // leader (a node far behind could not serve their listens anyway).
        let commit = currentLeader.flatMap { nodes[$0]?.core?.replica.raft.commitIndex } ?? 0
        let live = ids.filter { id in
            guard let node = nodes[id], let core = node.core, !node.paused, node.lease != nil else { return false }
            return core.replica.machine.appliedIndex + 50 >= commit
        }
        guard !live.isEmpty, let node = nodes[live[presenceRandom.below(live.count)]] else { return }
        startPresence(on: node, replacing: nil)
    }

    /// Opens a connection on `node`. With `previous` it is that connection's client coming back
    /// here naming it (`ls`): as the server does, the new connection's first command, in its
    /// own ordered session, ends the previous one, before anything the new one writes.
    @discardableResult
    private mutating func startPresence(on node: SimulatedNode, replacing previous: Int?) -> Bool {
        guard let core = node.core, let lease = node.lease else { return false }
        let connection = presenceRandom.next() | 1
        guard core.openSession(connection) else { return false }
        let p = presences.count
        presences.append(Presence(id: connection, secret: presenceRandom.next(), node: node.id, life: node.life, holder: lease.holder))
        presenceByConnection[connection] = p
        traceLine("presence \(p) opens on \(node.id)" + (previous.map { ", naming \($0)" } ?? ""), 40, UInt64(p))
        if let previous {
            presences[previous].endSession = connection
            core.write(
                sessionRequest(node, .end(previous)), namespace: Self.presenceNamespace,
                command: .connectionEnded(connection: presences[previous].id, secret: presences[previous].secret), session: connection)
        }
        let path = "/p/c\(p)"
        core.write(
            sessionRequest(node, .register(p)), namespace: Self.presenceNamespace,
            command: .onDisconnectSet(path: path, json: Array("\"off\"".utf8), secret: presences[p].secret, holder: lease.holder), session: connection)
        core.write(sessionRequest(node, .other), namespace: Self.presenceNamespace, command: .set(path: path, json: Array("\"on\"".utf8)), session: connection)
        perform(takeActions(node), on: node)
        scheduleProcess(node, after: 0)
        schedule(after: 300 + presenceRandom.below(3_000), .presenceEnd(p))
        return true
    }

    /// The client closes (70%), or reconnects to another node naming the connection (`ls`).
    private mutating func endPresence(_ p: Int) {
        guard presences[p].open, let node = nodes[presences[p].node], node.life == presences[p].life, node.core != nil else { return }
        if node.paused {
            schedule(after: 200, .presenceEnd(p))
            return
        }
        let others = ids.filter { $0 != node.id && nodes[$0]?.core != nil && nodes[$0]?.paused == false }
        // At the end of the run clients close for good (a reconnect would open another).
        let via = !closingPresences && !others.isEmpty && presenceRandom.chance(3, in: 10) ? nodes[others[presenceRandom.below(others.count)]] ?? node : node
        presences[p].open = false
        traceLine("presence \(p) ends via \(via.id)", 41, UInt64(p))
        if via === node {
            // Its own end closes its session once it is settled (`sessionWrote`).
            proposeEnd(p, via: via)
        } else {
            // The client reconnects to `via` naming it; this node stops serving it.
            if !startPresence(on: via, replacing: p) { proposeEnd(p, via: via) }
            node.core?.closeSession(presences[p].id)
        }
    }

    /// A connection's own end goes in its own (ordered) session, after its writes, as the
    /// server proposes it; a retried end through another node (`ls`) in the session of the
    /// connection that named it while that one is open, else in that node's own session.
    private mutating func proposeEnd(_ p: Int, via node: SimulatedNode) {
        guard let core = node.core else { return }
        let own = node.id == presences[p].node && node.life == presences[p].life
        var session: UInt64? = own ? presences[p].id : nil
        if !own, let named = presences[p].endSession, let q = presenceByConnection[named], presences[q].open,
            presences[q].node == node.id, presences[q].life == node.life
        {
            session = named
        }
        core.write(
            sessionRequest(node, .end(p)), namespace: Self.presenceNamespace,
            command: .connectionEnded(connection: presences[p].id, secret: presences[p].secret), session: session)
        perform(takeActions(node), on: node)
        scheduleProcess(node, after: 0)
    }

    /// A node's life ended (or began again): its connections are gone, with no end proposed.
    private mutating func presenceLost(on node: SimulatedNode) {
        for p in presences.indices where presences[p].node == node.id && presences[p].open {
            presences[p].open = false
            traceLine("presence \(p) lost with \(node.id)", 42, UInt64(p))
        }
    }

    /// The node's lease timer (every 100 ms of its running time), as the server's driver runs it.
    private mutating func leaseTick(_ node: SimulatedNode) {
        guard var lease = node.lease, now - node.leaseTickAt >= 100, let core = node.core else { return }
        node.leaseTickAt = now
        let open = presences.indices.filter { presences[$0].node == node.id && presences[$0].open && presences[$0].life == node.life }
        let actions = lease.tick(now: Int64(now), connections: open.count) { presenceRandom.next() | 1 }
        node.lease = lease
        for action in actions {
            switch action {
            case let .renew(holder, number):
                core.write(
                    sessionRequest(node, .renew(holder: holder, number: number)), namespace: "$leases",
                    command: .renewLease(holder: holder, node: node.id))
            case .fence:
                fence(node, open)
            }
        }
        perform(takeActions(node), on: node)
        scheduleProcess(node, after: 0)
    }

    /// The node closes every connection (its lease may lapse), proposing their ends.
    private mutating func fence(_ node: SimulatedNode, _ open: [Int]) {
        report.stats.leaseFences += 1
        traceLine("fence \(node.id): \(open.count) connections", 43, node.id)
        for p in open {
            presences[p].open = false
            proposeEnd(p, via: node)
        }
    }

    private mutating func sessionWrote(_ request: SessionRequest, _ result: WriteResult, on node: SimulatedNode) {
        switch request {
        case .register(let p):
            if case .success(let applied) = result { presences[p].registered = applied.outcome == .ok }
        case let .renew(holder, number):
            guard case .success(let applied) = result, var lease = node.lease else { return }
            if applied.outcome == .ok {
                lease.renewed(holder: holder, number: number)
                node.lease = lease
            } else if case .refused = applied.outcome {
                let fenced = lease.refused(holder: holder, now: Int64(now)) { presenceRandom.next() | 1 }
                node.lease = lease
                if fenced != nil {
                    fence(node, presences.indices.filter { presences[$0].node == node.id && presences[$0].open && presences[$0].life == node.life })
                }
            }
        case .end(let p):
            // Retried until it commits, as the server does (the lease covers a node that dies).
            // With a growing back-off, as the server retries (a lagging node learns the outcome
            // only when it applies the entry; fixed retries would keep the log moving for ever).
            // After a few, the node lets its lease holder go (`LeaseHolder.release`): the leader's
            // expiry then fires the queue.
            let own = node.id == presences[p].node && node.life == presences[p].life
            if case .success = result {
                presences[p].endAcknowledged = true
                if own { node.core?.closeSession(presences[p].id) }
            } else if node.core != nil {
                presences[p].endAttempts += 1
                if own, presences[p].endAttempts >= Self.endAttempts { node.core?.closeSession(presences[p].id) }
                if presences[p].endAttempts < Self.endAttempts {
                    schedule(after: 200 << presences[p].endAttempts, .presenceRetryEnd(p, node.id, life: node.life))
                } else if var lease = node.lease {
                    _ = lease.release(reason: "a connection's end did not commit", now: Int64(now)) { presenceRandom.next() | 1 }
                    node.lease = lease
                    fence(node, presences.indices.filter { presences[$0].node == node.id && presences[$0].open && presences[$0].life == node.life })
                }
            }
        case .other:
            break
        }
    }

    /// Applied writes to `/p/c<i>`: a queue fires at most once per lineage, and never while its
    /// connection is served by a running node.
    private mutating func observePresence(_ applied: StateMachine.Applied, tree: Tree, on node: SimulatedNode) {
        switch applied.outcome {
        case .ok, .datastale, .rejected, .permissionDenied, .noSpace, .overQuota:
            if presenceByConnection[applied.session] != nil {
                let last = presenceApplied[node.id, default: [:]][applied.session] ?? 0
                if applied.seq <= last {
                    report.violations.append(
                        "t=\(now) node \(node.id) applied connection \(applied.session)'s command \(applied.seq) after its command \(last)")
                }
                presenceApplied[node.id, default: [:]][applied.session] = applied.seq
            }
        case .duplicate, .malformed, .refused, .outOfOrder, .alreadyApplied: break
        }
        guard applied.outcome == .ok else { return }
        for path in applied.written {
            guard path.segments.count == 2, path.segments[0].string == "p", path.segments[1].string.hasPrefix("c"),
                let p = Int(path.segments[1].string.dropFirst()), p < presences.count, tree.child(at: path).leaf == .string("off")
            else { continue }
            if presenceFired[node.id, default: []].insert(p).inserted == false {
                report.violations.append("t=\(now) node \(node.id) fired presence \(p)'s onDisconnect twice")
            }
            if presenceFiredAnywhere.insert(p).inserted {
                let open = presences[p].open
                traceLine("presence \(p) fired\(open ? " (connection open)" : "")", 45, UInt64(p))
                report.stats.presencesFired += 1
                let holder = nodes[presences[p].node]
                if presences[p].open, let holder, holder.core != nil, !holder.paused, holder.life == presences[p].life {
                    report.violations.append(
                        "t=\(now) presence \(p)'s onDisconnect fired while node \(presences[p].node) still served its connection")
                }
            }
        }
    }

    /// Every connection ended and every queue fired (the leader's state has none left).
    private func presenceSettled() -> Bool {
        guard presences.allSatisfy({ !$0.open }), let leader = currentLeader, let machine = nodes[leader]?.core?.replica.machine else { return false }
        return !machine.disconnects.values.contains { $0.namespace == Self.presenceNamespace }
    }

    /// At the end of a run the clients close their connections (the rest go by leases).
    private mutating func closeRemainingPresences() {
        closingPresences = true
        for p in presences.indices where presences[p].open { endPresence(p) }
    }

    /// Never lost: every registered queue fired; nothing is queued at the end.
    private mutating func checkPresences(_ machine: StateMachine) {
        guard options.sessions else { return }
        for (p, presence) in presences.enumerated() where presence.registered == true {
            let value = machine.tree(Self.presenceNamespace).child(at: Path(segments: [ChildKey(unchecked: "p"), ChildKey(unchecked: "c\(p)")]))
            if value.leaf != .string("off") {
                report.violations.append("t=\(now) presence \(p)'s onDisconnect never fired (value \(value))")
            }
        }
        if machine.disconnects.values.contains(where: { $0.namespace == Self.presenceNamespace }) {
            report.violations.append("t=\(now) onDisconnect queues left at the end of the run")
        }
        report.stats.presences = presences.count
    }

    // MARK: - Checkers

    private mutating func observeApplied(_ applied: StateMachine.Applied, tree: Tree, on node: SimulatedNode) {
        if applied.expired > 0 {
            expiredByNode[node.id, default: 0] += applied.expired
            report.stats.expired = max(report.stats.expired, expiredByNode[node.id] ?? 0)
        }
        guard applied.namespace == Self.namespace else { return }
        // Exactly once per session write, whatever the command: every decision (applied,
        // datastale, rejected) is taken once per state lineage; a retry must come back as
        // `.duplicate`, never be decided again.
        switch applied.outcome {
        case .duplicate, .malformed, .refused, .outOfOrder, .alreadyApplied: break
        case .ok, .datastale, .rejected, .permissionDenied, .noSpace, .overQuota:
            if applied.session != 0,
                writesDecided[node.id, default: []].insert(SessionWrite(session: applied.session, seq: applied.seq)).inserted == false
            {
                report.violations.append("t=\(now) node \(node.id) decided write (session \(applied.session), seq \(applied.seq)) twice")
            }
            // The same for a client write, whatever session carried each copy.
            if let key = applied.clientWrite,
                writesDecided[node.id, default: []].insert(SessionWrite(session: key.client, seq: key.number | 1 << 63)).inserted == false
            {
                report.violations.append("t=\(now) node \(node.id) decided client write (client \(key.client), number \(key.number)) twice")
            }
        }
        guard applied.outcome == .ok else { return }
        for path in applied.written {
            guard path.segments.count == 1 else { continue }
            let key = path.segments[0].string
            if key == Self.counterKey {
                let id = applied.session &* 0x9E37_79B9_7F4A_7C15 ^ applied.seq
                if incrementsApplied[node.id, default: []].insert(id).inserted == false {
                    report.violations.append("t=\(now) node \(node.id) applied increment (session \(applied.session), seq \(applied.seq)) twice")
                }
            } else if case .int(let v)? = tree.child(at: path).leaf, firstWritten[Int(v)] == nil {
                firstWritten[Int(v)] = now
            }
        }
    }

    /// Decided when a run fails to converge: whether, at that moment, the voters whose data is
    /// lost and not yet re-added leave fewer voters with their data than a quorum, in the last
    /// configuration the ledger shows committed and in every newer configuration a running node
    /// holds (so a newer, uncommitted one cannot excuse a failure the committed one would not,
    /// nor the reverse). Older ones are superseded: a removed node still running on the
    /// configuration that named it (soak seed 1253064) says nothing about the cluster. Never
    /// under a sabotage: the self-tests must see every failure.
    private func beyondFaultBudgetNow() -> String? {
        guard options.sabotage == .none, !(awaitingReadd.isEmpty && readdAsked.isEmpty) else { return nil }
        var configurations: [Membership] = []
        var committedAt: UInt64 = 0
        var committed: Membership?
        if let entry = ledger.last(where: { if case .config = $0.kind { return true } else { return false } }), case .config(let m) = entry.kind {
            configurations.append(m)
            committedAt = entry.index
            committed = m
        }
        // A blank node's empty configuration says nothing about the cluster, nor does a node the
        // committed configuration removed (it may keep the one that named it).
        for id in ids {
            guard let raft = nodes[id]?.core?.replica.raft, !raft.membership.voters.isEmpty, committed?.contains(id) != false,
                Self.configurationIndex(raft) >= committedAt
            else { continue }
            configurations.append(raft.membership)
        }
        guard !configurations.isEmpty else { return nil }
        var described: [String] = []
        // A node added back counts again once some configuration makes its new incarnation a
        // voter (whether or not it then takes its vote: failing to is a bug, not a lost disk).
        let notYetReadded = readdAsked.filter { id in !admitted(id, incarnation: nodes[id]?.incarnation ?? 0, asVoter: true) }
        for m in configurations {
            let lost = m.voters.filter { awaitingReadd.contains($0) || notYetReadded.contains($0) }
            guard m.voters.count - lost.count < m.quorum else { return nil }
            described.append("\(lost) of \(m.voters)")
        }
        return "t=\(now) voters whose data was lost and not yet re-added leave no quorum with data: \(Array(Set(described)).sorted().joined(separator: ", "))"
    }

    /// The index of the configuration in force on `raft`: its last configuration entry, or its
    /// snapshot's index when its log holds none.
    private static func configurationIndex(_ raft: RaftNode) -> UInt64 {
        var i = raft.lastIndex
        while i > raft.snapshotMeta.index {
            if let e = raft.entry(at: i), case .config = e.kind { return i }
            i -= 1
        }
        return raft.snapshotMeta.index
    }

    /// Whether any running node holds a configuration (in force, in its snapshot or in its log)
    /// that names `id` with `incarnation` (nonzero): only a leader that heard that incarnation's
    /// hello writes one, so it is a legitimate admission (R22). `asVoter`: as a voter.
    private func admitted(_ id: NodeID, incarnation: UInt64, asVoter: Bool = false) -> Bool {
        guard incarnation != 0 else { return false }
        let names = { (m: Membership) in (asVoter ? m.isVoter(id) : m.contains(id)) && m.incarnation(of: id) == incarnation }
        for other in ids {
            guard let raft = nodes[other]?.core?.replica.raft else { continue }
            if names(raft.membership) || names(raft.snapshotMeta.membership) { return true }
            var i = raft.snapshotMeta.index + 1
            while i <= raft.lastIndex {
                if let e = raft.entry(at: i), case .config(let m) = e.kind, names(m) { return true }
                i += 1
            }
        }
        return false
    }

    /// A voter that is running and would still have its vote after a crash now: its admission
    /// is in the hard state on disk, not only in memory. Data faults are drawn only while every
    /// voter has one; a voter whose vote is only in memory counts as failed already (a crash
    /// loses it, and a second lost disk would then leave no quorum, beyond what any quorum
    /// system survives).
    private func hasDurableVote(_ id: NodeID) -> Bool {
        guard let core = nodes[id]?.core else { return false }
        return core.replica.raft.mayVote && core.storage.savedMayVote
    }

    /// Log matching (Raft §5.3), across every pair of running nodes: where two logs hold an
    /// entry with the same index and term, they hold the same entries up to it. Scanning down
    /// from the top of their overlap, once the terms agree every entry below must be identical.
    /// Entries at or below both nodes' commits are held against the ledger by `checkNode`
    /// (commit permanence), so the scan stops there: what it adds is the uncommitted suffixes.
    private mutating func checkLogMatching() {
        let running = ids.compactMap { id in nodes[id]?.core.map { (id, $0.replica.raft) } }
        for (x, (a, ra)) in running.enumerated() {
            for (b, rb) in running[(x + 1)...] {
                let low = max(ra.snapshotMeta.index, rb.snapshotMeta.index, min(ra.commitIndex, rb.commitIndex)) + 1
                var i = min(ra.lastIndex, rb.lastIndex)
                while i >= low, ra.term(at: i) != rb.term(at: i) { i -= 1 }
                let top = i
                while i >= low {
                    if ra.entry(at: i) != rb.entry(at: i) {
                        // Reported once per pair: a divergence persists until one log is cut.
                        if logMatchingReported.insert([a, b]).inserted {
                            let ta = ra.term(at: i).map(String.init) ?? "none"
                            let tb = rb.term(at: i).map(String.init) ?? "none"
                            report.violations.append(
                                "t=\(now) log matching: nodes \(a) and \(b) hold index \(top) with the same term but differ at index \(i) (terms \(ta) and \(tb))")
                        }
                        break
                    }
                    i -= 1
                }
            }
        }
    }

    /// After every pass of a node: election safety, commit permanence of its committed prefix
    /// against the ledger, the vote of a replaced node, and the core's own invariant reports.
    /// (Log matching of uncommitted suffixes: `checkLogMatching`.)
    private mutating func checkNode(_ node: SimulatedNode) {
        guard let core = node.core else { return }
        checkStagedHeld(node)
        let raft = core.replica.raft
        if raft.role == .leader {
            if let other = leaders[raft.term], other != node.id {
                report.violations.append("t=\(now) election safety: nodes \(other) and \(node.id) both lead term \(raft.term)")
            }
            leaders[raft.term] = node.id
            if lastLeader != node.id {
                lastLeader = node.id
                report.stats.leaderChanges += 1
            }
        }
        for v in raft.invariantViolations { report.violations.append("t=\(now) node \(node.id): \(v)") }
        if awaitingReadd.contains(node.id) && raft.mayVote {
            if admitted(node.id, incarnation: raft.incarnation) {
                // A configuration names this incarnation: a leader heard it and admitted it (a
                // replaced learner, never counted in any quorum, may be promoted as its new
                // self without a removal). R22 holds; the operator's repair is moot.
                awaitingReadd.remove(node.id)
            } else {
                report.violations.append("t=\(now) node \(node.id), whose data was replaced, regained its vote before the operator added it back")
            }
        }
        let commit = raft.commitIndex
        guard commit > node.checkedThrough else { return }
        var i = max(node.checkedThrough + 1, raft.snapshotMeta.index + 1)
        while i <= commit {
            guard let e = raft.entry(at: i) else { break }
            let position = Int(i - 1)
            if position < ledger.count {
                let known = ledger[position]
                if known.term != e.term || known.kind != e.kind || known.data != e.data {
                    report.violations.append(
                        "t=\(now) commit permanence: node \(node.id) committed index \(i) term \(e.term), but term \(known.term) was committed there")
                }
            } else if position == ledger.count {
                ledger.append(e)
            } else {
                break
            }
            i += 1
        }
        node.checkedThrough = i - 1
    }

    /// Nodes that left the leader's configuration are shut down for good (as an operator does
    /// after a removal); a blank node whose add never took effect is retired after healing.
    private mutating func retireRemovedNodes() {
        guard let leader = currentLeader, let lr = nodes[leader]?.core?.replica.raft, lr.commitIndex >= lr.lastIndex else { return }
        let members = Set(lr.membership.all)
        for id in ids {
            guard let node = nodes[id], !node.retired else { continue }
            if members.contains(id) {
                pendingAdds[id] = nil
                continue
            }
            // An add still in flight may commit later: wait until well after healing.
            if pendingRepair.contains(id) { continue }
            if let asked = pendingAdds[id], healedAt == nil || now - asked < 3_000 { continue }
            pendingAdds[id] = nil
            node.retired = true
            report.stats.retired += 1
            traceLine("retire \(id)", 16, id)
            down(node)
        }
    }

    /// Item 1 of issue 14, checked at every start: a node never restarts holding a configuration
    /// entry while its saved commit is below the configuration entry before it (it would act on
    /// an older membership than the leader that sent the newer one).
    private mutating func checkRestoredConfiguration(_ id: NodeID, _ raft: RaftNode) {
        var configs: [UInt64] = []
        var i = raft.snapshotMeta.index + 1
        while i <= raft.lastIndex {
            if let e = raft.entry(at: i), case .config = e.kind { configs.append(i) }
            i += 1
        }
        guard configs.count >= 2, let last = configs.last else { return }
        let previous = configs[configs.count - 2]
        if raft.commitIndex < previous {
            report.violations.append(
                "t=\(now) node \(id) restarted holding configuration entry \(last) with its saved commit \(raft.commitIndex) below the configuration entry before it (\(previous))"
            )
        }
    }

    /// The runbook's procedure for a node whose data was replaced: through the leader, remove
    /// its id, then add it back (it returns as a learner with its new incarnation and is
    /// promoted once caught up), asking again until the leader's configuration shows each step.
    private mutating func repairReplacedNodes() {
        guard let id = pendingRepair.first, now - lastRepairAttempt >= 500, now >= repairNotBefore, let leader = currentLeader,
            let node = nodes[leader], let core = node.core
        else { return }
        lastRepairAttempt = now
        let membership = core.replica.raft.membership
        if readdAsked.contains(id) {
            // The add was asked for: the repair is done once the leader's configuration holds
            // the node again. Until then the operator asks again (the leader may have refused
            // it, lost it in a crash or stepped down): soak seed 1176258 ran for 34 s on two
            // voters after one lost add, until a crash of the other cost the quorum.
            // Its new incarnation, not the configuration of a leader elected before the removal.
            if membership.contains(id), membership.incarnation(of: id) == nodes[id]?.incarnation {
                pendingRepair.removeFirst()
                return
            }
            let named = membership.incarnation(of: id)
            if membership.isVoter(id), named != 0, id != leader {
                // A voter under an incarnation other than the node's own: the removal was lost
                // (a leader that never committed it stepped down) and the voter is the replaced
                // disk's. An add would be refused (already a member); as the runbook says,
                // remove it again, then add it back. (A learner may name a stale incarnation,
                // the one its leader last heard: it counts in no quorum, and its promotion
                // names the incarnation the leader knows by then.)
                report.stats.staleRemovals += 1
                readdAsked.remove(id)
                awaitingReadd.insert(id)
                pendingAdds[id] = nil
                traceLine("repair-remove \(id) (stale incarnation \(named))", 18, id)
                core.changeMembership(node.nextRequest, .remove(id))
                node.nextRequest += 1
                run(node)
                return
            }
            traceLine("repair-add \(id) (again)", 19, id)
            core.addMember(node.nextRequest, node: id, address: "node\(id):7000")
        } else if membership.contains(id) {
            // A replaced node may not vote, so it never campaigns and is never the leader.
            guard id != leader else { return }
            traceLine("repair-remove \(id)", 18, id)
            core.changeMembership(node.nextRequest, .remove(id))
        } else {
            awaitingReadd.remove(id)
            readdAsked.insert(id)
            pendingAdds[id] = now
            traceLine("repair-add \(id)", 19, id)
            core.addMember(node.nextRequest, node: id, address: "node\(id):7000")
        }
        node.nextRequest += 1
        run(node)
    }

    /// A member that was retired (an add that committed after the node was given up on) is
    /// removed through the leader, as an operator would.
    private mutating func removeRetiredMembers() {
        guard pendingRepair.isEmpty, now - lastRepairAttempt >= 500, let leader = currentLeader, let node = nodes[leader],
            let core = node.core,
            let id = core.replica.raft.membership.all.first(where: { nodes[$0]?.retired == true })
        else { return }
        lastRepairAttempt = now
        traceLine("remove-retired \(id)", 22, id)
        core.changeMembership(node.nextRequest, .remove(id))
        node.nextRequest += 1
        run(node)
    }

    private mutating func periodicCheck() {
        if now - logMatchingCheckedAt >= 500 {
            logMatchingCheckedAt = now
            checkLogMatching()
        }
        repairReplacedNodes()
        retireRemovedNodes()
        removeRetiredMembers()
        guard let healed = healedAt else { return }
        if finalWrite == nil, let leader = currentLeader, let node = nodes[leader], let core = node.core,
            clients.allSatisfy({ $0.current == nil && $0.issued >= $0.quota })
        {
            let id = node.nextRequest
            node.nextRequest += 1
            finalWrite = (leader, id, false)
            core.write(id, namespace: "$final", command: .set(path: "/done", json: Array("true".utf8)))
            perform(takeActions(node), on: node)
            scheduleProcess(node, after: 0)
        } else if let fw = finalWrite, !fw.done, nodes[fw.node]?.core == nil || nodes[fw.node]?.core?.replica.raft.role != .leader {
            finalWrite = nil
        }
        let settled = !options.sessions || presenceSettled()
        if !settled { closeRemainingPresences() }
        if settled && finalWrite?.done == true && converged() {
            finished = true
            return
        }
        if now - healed > options.livenessBudgetMillis {
            var waiting = ""
            if options.sessions {
                let queues = currentLeader.flatMap { nodes[$0]?.core?.replica.machine.disconnects.values.filter { $0.namespace == Self.presenceNamespace }.count } ?? -1
                waiting = " (presences open \(presences.filter(\.open).count), queues left \(queues))"
                if let machine = currentLeader.flatMap({ nodes[$0]?.core?.replica.machine }) {
                    for (connection, queue) in machine.disconnects.sorted(by: { $0.key < $1.key }) where queue.namespace == Self.presenceNamespace {
                        let p = presences.firstIndex { $0.id == connection }
                        waiting += " [queue of connection \(connection) (presence \(p.map(String.init) ?? "?")), holder \(queue.holder), session record \(machine.sessions[connection].map { "\($0)" } ?? "none")]"
                    }
                }
            }
            if finalWrite?.done != true { waiting += " (final write not done)" }
            report.livenessFailure = "t=\(now) not converged \(options.livenessBudgetMillis) ms after healing\(waiting): \(clusterState())"
            report.beyondFaultBudget = beyondFaultBudgetNow()
            finished = true
        }
    }

    private func clusterState() -> String {
        ids.map { id -> String in
            guard let node = nodes[id] else { return "" }
            guard let core = node.core else { return "[\(id) down\(node.retired ? " retired" : "")]" }
            let r = core.replica.raft
            return "[\(id) \(r.role)\(r.mayVote ? "" : " (no vote)") t\(r.term) commit \(r.commitIndex) applied \(core.replica.machine.appliedIndex) last \(r.lastIndex) voters \(r.membership.voters)]"
        }.joined(separator: " ")
    }

    private func converged() -> Bool {
        guard let leader = currentLeader, let lr = nodes[leader]?.core?.replica.raft, lr.commitIndex == lr.lastIndex else { return false }
        for id in lr.membership.all {
            guard let core = nodes[id]?.core, core.replica.machine.appliedIndex == lr.commitIndex else { return false }
        }
        return true
    }

    /// Every member's state is the same, byte for byte, and every increment applied exactly once.
    private mutating func checkConvergedState() {
        guard let leader = currentLeader, let lr = nodes[leader]?.core else { return }
        checkPresences(lr.replica.machine)
        let reference = lr.replica.machine.image()
        for id in lr.replica.raft.membership.all {
            guard let core = nodes[id]?.core else { continue }
            // The usage a quota is judged by equals a whole measure of the namespace, walked, on
            // every node (it is derived, not in the image); and every tree carries the measure
            // its contents have (kept by each write, read from images and snapshots).
            let m = core.replica.machine
            for (namespace, usage) in m.quotaUsage where usage != m.tree(namespace).walkedDataBytes {
                report.violations.append(
                    "t=\(now) quota: node \(id) counts \(usage) data bytes in '\(namespace)', which holds \(m.tree(namespace).walkedDataBytes)")
            }
            for (namespace, tree) in m.namespaces where !tree.dataBytesAreConsistent {
                report.violations.append("t=\(now) measure: node \(id)'s tree of '\(namespace)' carries data bytes its contents do not have")
            }
            if core.replica.machine.image() != reference {
                report.violations.append(
                    "t=\(now) convergence: node \(id)'s state differs from the leader's at index \(lr.replica.raft.commitIndex)"
                        + Self.stateDifference(core.replica.machine, lr.replica.machine))
            }
        }
        var counter = 0
        if case .int(let v)? = lr.replica.machine.tree(Self.namespace).child(at: Path(segments: [ChildKey(unchecked: Self.counterKey)])).leaf {
            counter = Int(v)
        }
        checkAccounts(lr.replica.machine)
        let acked = operations.filter { if case .increment = $0.kind { return $0.outcome == .ok } else { return false } }.count
        let maybe = operations.filter { if case .increment = $0.kind { return $0.unknown } else { return false } }.count
        if counter < acked || counter > acked + maybe {
            report.violations.append("exactly-once: the counter is \(counter) after \(acked) acknowledged and \(maybe) unknown increments")
        }
    }

    /// Where two states differ (for the convergence violation's message).
    static func stateDifference(_ a: StateMachine, _ b: StateMachine) -> String {
        var parts: [String] = []
        if a.appliedIndex != b.appliedIndex { parts.append("applied \(a.appliedIndex) vs \(b.appliedIndex)") }
        let names = Set(a.namespaces.keys).union(b.namespaces.keys).sorted()
        for n in names where a.tree(n) != b.tree(n) { parts.append("namespace \(n.isEmpty ? "(default)" : n)") }
        let sessions = Set(a.sessions.keys).union(b.sessions.keys).sorted()
        let differing = sessions.filter { a.sessions[$0] != b.sessions[$0] }
        if !differing.isEmpty { parts.append("\(differing.count) session records (first \(differing[0]): \(String(describing: a.sessions[differing[0]])) vs \(String(describing: b.sessions[differing[0]])))") }
        if a.disconnects.count != b.disconnects.count { parts.append("queues \(a.disconnects.count) vs \(b.disconnects.count)") }
        return parts.isEmpty ? "" : " (" + parts.joined(separator: "; ") + ")"
    }

    /// Account sign-ups (`--accounts`): at most one acknowledged per email, and it owns the email
    /// in the final state; a sign-up refused `EMAIL_EXISTS` saw an email someone owns.
    private mutating func checkAccounts(_ machine: StateMachine) {
        guard options.accounts else { return }
        let store = machine.accounts(Self.accountsProject)
        var winners: [Int: [Int]] = [:]
        for (index, op) in operations.enumerated() {
            guard case .signUp(let email) = op.kind, let outcome = op.outcome else { continue }
            let address = "e\(email)@SIM.test"
            if outcome == .ok { winners[email, default: []].append(index) }
            if AccountRefusal(outcome) == .emailExists, store.uid(forEmail: address) == nil {
                report.violations.append("accounts: op \(index) was refused EMAIL_EXISTS but nobody owns \(address)")
            }
        }
        for (email, ops) in winners.sorted(by: { $0.key < $1.key }) {
            if ops.count > 1 { report.violations.append("accounts: \(ops.count) sign-ups with email \(email) succeeded (ops \(ops))") }
            if let first = ops.first, store.uid(forEmail: "e\(email)@sim.test") != "op\(first)" {
                report.violations.append("accounts: op \(first) signed up email \(email) but the state says \(store.uid(forEmail: "e\(email)@sim.test") ?? "nobody") owns it")
            }
        }
    }

    /// Per key, the register histories (reads, sets, compare-and-sets, and each key of an update)
    /// with the WGL checker; writes whose client never heard back are resolved from what the
    /// replicas applied.
    private mutating func checkLinearizability() {
        var byKey: [Int: [HistoryOperation<RegisterModel.Input, RegisterModel.Output>]] = [:]
        let converged = finished && report.livenessFailure == nil
        for op in operations {
            var writes: [(Int, RegisterModel.Input, Int?)] = []
            switch op.kind {
            case .read(let key):
                guard let value = op.readValue, let returned = op.returned else { continue }
                byKey[key, default: []].append(
                    HistoryOperation(client: op.client, input: .read, output: .value(value), callTime: op.call, returnTime: returned))
                continue
            case let .set(key, value): writes = [(key, .write(value), value)]
            case let .cas(key, expected, new):
                // A cas against "absent" compares with the empty hash; the model's absent is 0.
                writes = [(key, .cas(expected: expected ?? 0, new: new), new)]
            case let .update(keys, values): writes = zip(keys, values).map { ($0.0, .write($0.1), $0.1) }
            case .increment, .setRules, .setQuota, .signUp: continue
            }
            for (key, input, value) in writes {
                var output: RegisterModel.Output
                var returned = op.returned
                if op.unknown || op.returned == nil {
                    if let v = value, let first = firstWritten[v] {
                        output = .unknown
                        if case .cas = input { output = .swapped(true) } else { output = .written }
                        returned = max(first, op.call)
                        report.stats.writesPatched += 1
                    } else if converged, case .write = input {
                        report.stats.writesPatched += 1
                        continue
                    } else {
                        output = .unknown
                        returned = nil
                    }
                } else if let outcome = op.outcome {
                    if case .cas = input { output = .swapped(outcome == .ok) } else { output = .written }
                } else {
                    // Refused definitely: check it never applied.
                    if let v = value, firstWritten[v] != nil {
                        report.violations.append("client \(op.client): a write refused definitely was applied (value \(v))")
                    }
                    continue
                }
                byKey[key, default: []].append(
                    HistoryOperation(client: op.client, input: input, output: output, callTime: op.call, returnTime: returned))
            }
        }
        (report.linearizability, report.nonLinearizableKeys) = registerVerdict(byKey.mapValues(Self.absentAsZero))
    }

    /// The register model starts absent (nil); a cas against absent uses 0 here, so reads of
    /// absent are 0 and the first state is 0 (values are from 1 up, so 0 is never written).
    private static func absentAsZero(_ ops: RegisterHistory) -> RegisterHistory {
        var out = [HistoryOperation(client: -1, input: RegisterModel.Input.write(0), output: RegisterModel.Output.written, callTime: -2, returnTime: -1)]
        for var op in ops {
            if case .value(nil) = op.output { op.output = .value(0) }
            out.append(op)
        }
        return out
    }
}
