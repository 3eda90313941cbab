import BanyanBasics
public import BanyanCheckers
import BanyanRaft

/// Options of one simulated run. Everything else is drawn from the seed (the "swarm").
public struct SimulationOptions: Sendable {
    public var seed: UInt64
    /// Founding voters (nil: the swarm picks 3 or 5).
    public var nodes: Int?
    /// Client operations in the run (puts, compare-and-sets, reads).
    public var operations = 1000
    public var clients = 5
    public var keys = 4
    /// False: a healthy network and no nemesis (for benchmarks and liveness baselines).
    public var faults = true
    /// Keep a line per event (for replay and triage; slower).
    public var trace = false
    /// A deliberate driver bug (checker self-tests only).
    public var sabotage: Sabotage = .none
    /// After faults heal, the cluster must elect a leader, finish every operation and converge
    /// within this many simulated milliseconds (the liveness bound).
    public var livenessBudgetMillis = 30_000
    /// Hard stop for the whole run.
    public var maxSimulatedMillis = 900_000
    /// Event budget: exceeding it means a message storm or a livelock (reported as a failure).
    public var maxEvents = 5_000_000

    public init(seed: UInt64) { self.seed = seed }
}

/// The fault profile of a run, drawn from its seed (swarm testing: each seed enables a different
/// subset of faults at different rates).
public struct Swarm: Sendable, CustomStringConvertible {
    public var nodes: Int
    public var lossPercent: Int
    public var duplicatePercent: Int
    public var minDelayMillis: Int
    public var maxDelayMillis: Int
    /// Chance that a message is delayed far longer than usual (reordering, stale deliveries).
    public var longDelayPercent: Int
    public var crashes: Bool
    public var crashDuringPersist: Bool
    public var pauses: Bool
    public var partitions: Bool
    public var oneWayPartitions: Bool
    public var membershipChanges: Bool
    public var leaderTransfers: Bool
    public var snapshotEvery: UInt64
    public var snapshotChunkBytes: Int
    public var maxInflightMessages: Int
    public var nemesisMeanMillis: Int
    /// Lease-based reads (only in seeds without pauses: a paused leader breaks the lease's clock
    /// assumption by design, see `ReadMode.leaseBased`).
    public var leaseReads: Bool

    static func draw(_ r: inout SeededRandom, nodes: Int?, faults: Bool) -> Swarm {
        let n = nodes ?? (r.chance(1, in: 2) ? 3 : 5)
        guard faults else {
            return Swarm(
                nodes: n, lossPercent: 0, duplicatePercent: 0, minDelayMillis: 1, maxDelayMillis: 3, longDelayPercent: 0,
                crashes: false, crashDuringPersist: false, pauses: false, partitions: false, oneWayPartitions: false,
                membershipChanges: false, leaderTransfers: false, snapshotEvery: 0, snapshotChunkBytes: 4096,
                maxInflightMessages: 64, nemesisMeanMillis: 1000, leaseReads: false
            )
        }
        let minDelay = r.below(3)
        var swarm = Swarm(
            nodes: n,
            lossPercent: r.chance(1, in: 3) ? 0 : r.below(16),
            duplicatePercent: r.chance(1, in: 3) ? 0 : r.below(21),
            minDelayMillis: minDelay,
            maxDelayMillis: minDelay + 1 + r.below(20),
            longDelayPercent: r.chance(1, in: 2) ? 0 : 1 + r.below(5),
            crashes: r.chance(2, in: 3),
            crashDuringPersist: r.chance(1, in: 2),
            pauses: r.chance(1, in: 2),
            partitions: r.chance(2, in: 3),
            oneWayPartitions: r.chance(1, in: 2),
            membershipChanges: r.chance(1, in: 2),
            leaderTransfers: r.chance(1, in: 3),
            snapshotEvery: r.chance(1, in: 3) ? 0 : UInt64(10 + r.below(150)),
            snapshotChunkBytes: [16, 64, 256, 4096][r.below(4)],
            maxInflightMessages: [1, 2, 8, 64][r.below(4)],
            nemesisMeanMillis: 100 + r.below(400),
            leaseReads: false
        )
        swarm.leaseReads = !swarm.pauses && r.chance(1, in: 2)
        return swarm
    }

    public var description: String {
        var faults: [String] = []
        if crashes { faults.append("crash") }
        if crashDuringPersist { faults.append("crash-mid-persist") }
        if pauses { faults.append("pause") }
        if partitions { faults.append(oneWayPartitions ? "partition(+one-way)" : "partition") }
        if membershipChanges { faults.append("membership") }
        if leaderTransfers { faults.append("transfer") }
        if leaseReads { faults.append("lease-reads") }
        return "nodes=\(nodes) loss=\(lossPercent)% dup=\(duplicatePercent)% delay=\(minDelayMillis)-\(maxDelayMillis)ms"
            + " long=\(longDelayPercent)% snapshotEvery=\(snapshotEvery) chunk=\(snapshotChunkBytes)"
            + " inflight=\(maxInflightMessages) nemesis~\(nemesisMeanMillis)ms faults=[\(faults.joined(separator: ","))]"
    }
}

/// The result of one run.
public struct SimulationReport: Sendable {
    public var seed: UInt64
    public var swarm: Swarm
    /// Safety breaches: election safety, log matching, leader completeness, state-machine safety,
    /// persist-before-send, definite failures that were applied, core invariants.
    public var violations: [String] = []
    /// Set when the cluster did not recover within the liveness budget after faults healed.
    public var livenessFailure: String?
    public var linearizability: LinearizabilityVerdict = .linearizable
    public var nonLinearizableKeys: [Int] = []
    public var stats = Stats()
    public var trace: [String] = []
    /// A hash of every event, to prove a replay is identical.
    public var traceHash: UInt64 = 0

    public struct Stats: Sendable, Equatable {
        public var simulatedMillis = 0
        public var events = 0
        public var messagesSent = 0
        public var messagesDropped = 0
        public var leaderChanges = 0
        public var maxTerm: UInt64 = 0
        public var committedEntries = 0
        public var writesOK = 0
        public var writesUnknown = 0
        public var writesRefused = 0
        public var readsOK = 0
        public var readsFailed = 0
        public var crashes = 0
        public var pauses = 0
        public var partitions = 0
        public var membershipChanges = 0
        public var snapshotsInstalled = 0
        public var transfers = 0
        /// Unknown writes resolved from what the replicas applied (or dropped as never applied).
        public var writesPatched = 0

        public init() {}
    }

    public var passed: Bool { violations.isEmpty && livenessFailure == nil && linearizability == .linearizable }

    public var summary: String {
        let verdict = passed ? "ok" : "FAILED"
        var s = "seed \(seed): \(verdict) — \(swarm)\n"
        s += "  \(stats.simulatedMillis) ms simulated, \(stats.events) events, \(stats.messagesSent) messages"
        s += " (\(stats.messagesDropped) dropped), \(stats.leaderChanges) leader changes, max term \(stats.maxTerm),"
        s += " \(stats.committedEntries) committed\n"
        s += "  writes ok \(stats.writesOK) unknown \(stats.writesUnknown) refused \(stats.writesRefused);"
        s += " reads ok \(stats.readsOK) failed \(stats.readsFailed); crashes \(stats.crashes), pauses \(stats.pauses),"
        s += " partitions \(stats.partitions), membership \(stats.membershipChanges), snapshots \(stats.snapshotsInstalled),"
        s += " transfers \(stats.transfers)\n"
        s += "  linearizability: \(linearizability) (\(stats.writesPatched) unknown writes resolved from the replicas)"
        if !nonLinearizableKeys.isEmpty { s += " (keys \(nonLinearizableKeys))" }
        if let l = livenessFailure { s += "\n  liveness: \(l)" }
        for v in violations.prefix(10) { s += "\n  violation: \(v)" }
        if violations.count > 10 { s += "\n  … \(violations.count - 10) more violations" }
        return s
    }
}

/// The deterministic cluster simulator (docs/simulator.md): N nodes of the real Raft core and
/// driver on a simulated network and disk, a client workload, a nemesis, and checkers, all under
/// one seeded scheduler. `run(_:)` is a pure function of its options.
public struct Simulator {
    public static func run(_ options: SimulationOptions) -> SimulationReport {
        var sim = Simulator(options)
        sim.execute()
        return sim.report
    }

    // MARK: - State

    private enum Event {
        case tick(NodeID, incarnation: Int)
        case deliver(Message)
        case clientNext(Int)
        case clientTimeout(Int, seq: UInt32)
        case nemesis
        case heal
        case restart(NodeID)
        case resume(NodeID)
        case check
    }

    /// A node's place in the simulation. A class, so that stepping a node mutates its core in
    /// place (a struct copied out of the dictionary would copy the whole log on every write).
    private final class Slot {
        var node: SimNode
        var up = true
        var paused = false
        var inbox: [Message] = []
        /// Client requests that reached the node while it was paused (client index, sequence).
        var clientQueue: [(client: Int, seq: UInt32)] = []
        var crashBudget: Int?
        /// Shut down for good after being removed from the cluster.
        var retired = false
        var incarnation = 0

        init(node: SimNode) { self.node = node }
    }

    private struct Client {
        var id: UInt32
        var seq: UInt32 = 0
        var issued = 0
        var quota: Int
        var pending: Pending?
        var known: [Int: Int64] = [:]
        var counter: Int64 = 0
    }

    private struct Pending {
        var seq: UInt32
        var node: NodeID
        var record: Int?
        var key: Int
        var isRead: Bool
        var command: KVMachine.Command?
    }

    private struct Record {
        var key: Int
        var seq: UInt32
        var op: HistoryOperation<RegisterModel.Input, RegisterModel.Output>
    }

    private let options: SimulationOptions
    private var report: SimulationReport
    private var swarm: Swarm
    private var queue = EventQueue<Event>()
    private var tracer: TraceRecorder
    private var now = 0
    private var slots: [NodeID: Slot] = [:]
    private var ids: [NodeID] = []
    private var nextNodeID: NodeID
    private var removalRequested: Set<NodeID> = []
    private var cut: Set<UInt64> = []
    private var clients: [Client] = []
    private var history: [Record] = []
    private var networkRandom: SeededRandom
    private var nemesisRandom: SeededRandom
    private var clientRandom: SeededRandom
    private var seedRandom: SeededRandom
    // Checkers' ledgers.
    private var leaders: [UInt64: NodeID] = [:]
    private var ledger: [LogEntry] = []
    /// The term in which each index was first committed (by the leader of that term).
    private var commitTerms: [UInt64] = []
    /// First application of each command anywhere: when, and with what outcome (ground truth
    /// for "patching" writes whose client never heard back, as etcd's robustness tests do).
    private var firstApplied: [UInt64: (time: Int, outcome: KVMachine.Outcome)] = [:]
    private var digests: [UInt64: String] = [:]
    private var refused: Set<UInt64> = []
    private var applied: Set<UInt64> = []
    // Phases.
    private var faultsActive: Bool
    private var healedAt: Int?
    private var finalWriteDone = false
    private var finalWriteEntry: (node: NodeID, index: UInt64, term: UInt64)?
    private var finalWriteSeq: UInt32 = 0
    private var finished = false
    private var lastLeader: NodeID = 0
    private let tickMillis = 10
    private let requestTimeoutMillis = 2_000

    private init(_ options: SimulationOptions) {
        self.options = options
        var root = SeededRandom(seed: options.seed)
        // Independent streams, so that enabling one fault does not reshuffle the others.
        var swarmRandom = SeededRandom(seed: root.next())
        networkRandom = SeededRandom(seed: root.next())
        nemesisRandom = SeededRandom(seed: root.next())
        clientRandom = SeededRandom(seed: root.next())
        seedRandom = SeededRandom(seed: root.next())
        // Out-of-range sizes are clamped (banyan-sim validates its flags; this keeps the library total).
        swarm = Swarm.draw(&swarmRandom, nodes: options.nodes.map { min(max($0, 1), 9) }, faults: options.faults)
        if options.sabotage == .leaseWithPauses {
            swarm.leaseReads = true
            swarm.pauses = true
        }
        report = SimulationReport(seed: options.seed, swarm: swarm)
        tracer = TraceRecorder(keepLines: options.trace)
        faultsActive = options.faults
        nextNodeID = NodeID(swarm.nodes + 1)
        let founders = (1...NodeID(swarm.nodes)).map { $0 }
        for id in founders {
            let config = configuration(for: id)
            do {
                var node = try SimNode.founding(configuration: config, members: founders, snapshotEvery: swarm.snapshotEvery)
                node.digestEvery = 8
                node.sabotage = options.sabotage
                slots[id] = Slot(node: node)
                ids.append(id)
            } catch {
                report.violations.append("could not create node \(id): \(error)")
            }
        }
        for c in 0..<options.clients {
            let quota = options.operations / options.clients + (c < options.operations % options.clients ? 1 : 0)
            clients.append(Client(id: UInt32(c + 1), quota: quota))
        }
    }

    private mutating func configuration(for id: NodeID) -> RaftConfiguration {
        var config = RaftConfiguration(id: id, seed: seedRandom.next())
        config.electionTicks = 10
        config.heartbeatTicks = 1
        config.snapshotChunkBytes = swarm.snapshotChunkBytes
        config.maxInflightMessages = swarm.maxInflightMessages
        config.promotionLag = 16
        if swarm.leaseReads { config.readMode = .leaseBased }
        return config
    }

    // MARK: - Main loop

    private mutating func execute() {
        for id in ids {
            schedule(after: 1 + networkRandom.below(tickMillis), .tick(id, incarnation: 0))
        }
        for c in clients.indices { schedule(after: 20 + clientRandom.below(50), .clientNext(c)) }
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
            if report.stats.events > options.maxEvents {
                report.violations.append(
                    "t=\(now) resource bound: more than \(options.maxEvents) events (\(report.stats.messagesSent) messages, \(queue.count) pending); recent messages: \(recentKinds())"
                )
                break
            }
            if queue.count > 120_000 {
                // Resource bound: a message storm (some exchange amplifies itself).
                report.violations.append("t=\(now) resource bound: \(queue.count) pending events; recent messages: \(recentKinds())")
                break
            }
        }
        report.stats.simulatedMillis = now
        report.traceHash = tracer.hash
        report.trace = tracer.lines
        for slot in slots.values { report.stats.maxTerm = max(report.stats.maxTerm, slot.node.raft.term) }
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
        case let .tick(id, incarnation):
            guard let slot = slots[id], slot.up, slot.incarnation == incarnation else { return }
            schedule(after: tickMillis, .tick(id, incarnation: incarnation))
            guard !slot.paused else { return }
            slot.node.tick()
            slots[id] = slot
            traceLine("tick \(id)", 1, id)
            process(id)
        case .deliver(let m):
            deliver(m)
        case .clientNext(let c):
            issue(c)
        case let .clientTimeout(c, seq):
            timeout(c, seq: seq)
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
            restart(id)
        case .resume(let id):
            resume(id)
        case .check:
            periodicCheck()
            if !finished { schedule(after: 100, .check) }
        }
    }

    private func issuedFraction() -> Double {
        let issued = clients.reduce(0) { $0 + $1.issued }
        return Double(issued) / Double(max(1, options.operations))
    }

    // MARK: - Nodes

    private mutating func process(_ id: NodeID) {
        guard let slot = slots[id], slot.up, !slot.paused else { return }
        let budget = slot.crashBudget
        let out = slot.node.process(persistBudget: budget)
        slot.crashBudget = nil
        slots[id] = slot
        handleOutput(out, from: id)
        if out.crashed {
            traceLine("crash-mid-persist \(id)", 2, id)
            crash(id)
        }
    }

    private mutating func handleOutput(_ out: SimNode.Output, from id: NodeID) {
        for v in out.violations { report.violations.append("t=\(now) \(v)") }
        if let raft = slots[id]?.node.raft, raft.role == .leader, raft.commitIndex > UInt64(commitTerms.count) {
            let from = UInt64(commitTerms.count) + 1
            for _ in from...raft.commitIndex { commitTerms.append(raft.term) }
        }
        if out.roleChanged, let raft = slots[id]?.node.raft, raft.role == .leader {
            checkNewLeader(id, raft)
        }
        for e in out.applied { checkApplied(e, on: id) }
        for (index, digest) in out.digests {
            if let known = digests[index] {
                if known != digest {
                    report.violations.append("t=\(now) state-machine safety: node \(id) state at \(index) differs (\(digest) vs \(known))")
                }
            } else {
                digests[index] = digest
            }
        }
        report.stats.snapshotsInstalled += out.installedSnapshots
        for (envelope, outcome, _) in out.outcomes {
            let key = UInt64(envelope.client) << 32 | UInt64(envelope.seq)
            if let outcome {
                if firstApplied[key] == nil { firstApplied[key] = (now, outcome) }
                if refused.contains(key) {
                    report.violations.append("t=\(now) client \(envelope.client) op \(envelope.seq) was refused definitely but applied (R30)")
                }
                applied.insert(key)
            }
            completeWrite(envelope, outcome: outcome, at: id)
        }
        for r in out.readsReady { completeRead(context: r.context, at: id) }
        for m in out.messages { send(m) }
    }

    private mutating func checkNewLeader(_ id: NodeID, _ raft: RaftNode) {
        if let other = leaders[raft.term], other != id {
            report.violations.append("t=\(now) election safety: nodes \(other) and \(id) both lead term \(raft.term)")
        }
        leaders[raft.term] = id
        if id != lastLeader {
            report.stats.leaderChanges += 1
            lastLeader = id
        }
        traceLine("leader \(id) term \(raft.term)", 3, raft.term)
        // Leader completeness: every entry committed in an earlier term is in the new leader's
        // log. (A leader of an older term, elected late by delayed votes, may lack entries
        // committed in newer terms; that is allowed.)
        let start = raft.snapshotMeta.index + 1
        if commitTerms.count >= Int(start) {
            for i in start...UInt64(commitTerms.count) where commitTerms[Int(i) - 1] < raft.term {
                guard Int(i) <= ledger.count else { break }
                let expected = ledger[Int(i) - 1]
                if raft.term(at: i) != expected.term {
                    report.violations.append(
                        "t=\(now) leader completeness: leader \(id) of term \(raft.term) lacks entry \(i) (term \(expected.term)) committed in term \(commitTerms[Int(i) - 1])"
                    )
                    break
                }
            }
        }
    }

    private mutating func checkApplied(_ e: LogEntry, on id: NodeID) {
        let i = Int(e.index)
        if i <= ledger.count {
            if ledger[i - 1] != e {
                report.violations.append("t=\(now) log matching: node \(id) applied a different entry at \(e.index) (term \(e.term) vs \(ledger[i - 1].term))")
            }
        } else if i == ledger.count + 1 {
            ledger.append(e)
            report.stats.committedEntries = ledger.count
        }
    }

    private var recent: [String] = []

    private func recentKinds() -> String {
        var counts: [String: Int] = [:]
        for k in recent { counts[k, default: 0] += 1 }
        return counts.sorted { $0.value > $1.value }.prefix(8).map { "\($0.key)×\($0.value)" }.joined(separator: " ")
    }

    private mutating func send(_ m: Message) {
        report.stats.messagesSent += 1
        if queue.count > 100_000 || report.stats.events > options.maxEvents - 5_000 {
            let kind: String
            switch m.body {
            case .preVote: kind = "preVote"
            case .preVoteResponse: kind = "preVoteResp"
            case .vote: kind = "vote"
            case .voteResponse: kind = "voteResp"
            case .append(let p, _, let e, _): kind = "append(p\(p),n\(e.count))"
            case .appendAccepted(let i): kind = "accepted(\(i))"
            case .appendRejected(let r, let h, _): kind = "rejected(\(r),\(h))"
            case .heartbeat: kind = "heartbeat"
            case .heartbeatResponse: kind = "heartbeatResp"
            case .snapshotChunk(_, let o, _, _): kind = "chunk(\(o))"
            case .snapshotResponse(_, let o): kind = "snapResp(\(o))"
            case .proposal: kind = "proposal"
            case .readIndex: kind = "readIndex"
            case .readIndexResponse: kind = "readIndexResp"
            case .timeoutNow: kind = "timeoutNow"
            }
            recent.append("\(m.from)->\(m.to)@t\(m.term):\(kind)")
            if recent.count > 2000 { recent.removeFirst(1000) }
        }
        if cut.contains(link(m.from, m.to)) || (swarm.lossPercent > 0 && networkRandom.below(100) < swarm.lossPercent) {
            report.stats.messagesDropped += 1
            return
        }
        schedule(after: delay(), .deliver(m))
        if swarm.duplicatePercent > 0 && networkRandom.below(100) < swarm.duplicatePercent {
            schedule(after: delay(), .deliver(m))
        }
    }

    private mutating func delay() -> Int {
        if swarm.longDelayPercent > 0 && networkRandom.below(100) < swarm.longDelayPercent {
            return swarm.maxDelayMillis + networkRandom.below(500)
        }
        return swarm.minDelayMillis + networkRandom.below(swarm.maxDelayMillis - swarm.minDelayMillis + 1)
    }

    private func link(_ from: NodeID, _ to: NodeID) -> UInt64 { from << 32 | to }

    private mutating func deliver(_ m: Message) {
        guard let slot = slots[m.to], slot.up else { return }
        if cut.contains(link(m.from, m.to)) {
            report.stats.messagesDropped += 1
            return
        }
        if slot.paused {
            slot.inbox.append(m)
            slots[m.to] = slot
            return
        }
        slot.node.step(m)
        slots[m.to] = slot
        traceLine("deliver \(m.from)->\(m.to) t\(m.term)", m.from << 32 | m.to, m.term)
        process(m.to)
    }

    private mutating func crash(_ id: NodeID) {
        guard let slot = slots[id], slot.up else { return }
        slot.up = false
        slot.paused = false
        slot.inbox = []
        slot.clientQueue = []
        slot.crashBudget = nil
        slots[id] = slot
        report.stats.crashes += 1
        // The client connections to this node break: writes become unknown, reads fail.
        for c in clients.indices where clients[c].pending?.node == id {
            abandon(c, unknown: true)
        }
        if faultsActive {
            schedule(after: 200 + nemesisRandom.below(2_000), .restart(id))
        }
    }

    private mutating func restart(_ id: NodeID) {
        guard let slot = slots[id], !slot.up, !slot.retired else { return }
        do {
            try slot.node.restart(seed: seedRandom.next())
        } catch {
            report.violations.append("t=\(now) node \(id) failed to restart: \(error)")
            return
        }
        slot.up = true
        slot.incarnation += 1
        slots[id] = slot
        traceLine("restart \(id)", 4, id)
        schedule(after: 1 + networkRandom.below(tickMillis), .tick(id, incarnation: slot.incarnation))
        process(id)
    }

    private mutating func resume(_ id: NodeID) {
        guard let slot = slots[id], slot.up, slot.paused else { return }
        slot.paused = false
        let inbox = slot.inbox
        slot.inbox = []
        let queued = slot.clientQueue
        slot.clientQueue = []
        // A resumed process first serves the requests its clients sent meanwhile, before it reads
        // its peers' messages (the worst order for a leader that was deposed while frozen).
        for (c, seq) in queued where clients[c].pending?.seq == seq && clients[c].pending?.node == id {
            submit(c)
        }
        slots[id] = slot
        traceLine("resume \(id)", 5, id)
        for m in inbox {
            guard let s = slots[id], s.up, !s.paused else { break }
            s.node.step(m)
            slots[id] = s
        }
        process(id)
    }

    // MARK: - Nemesis

    private var currentLeader: NodeID? {
        var best: (NodeID, UInt64)?
        for id in ids {
            guard let slot = slots[id], slot.up, !slot.paused, slot.node.raft.role == .leader else { continue }
            if best == nil || slot.node.raft.term > (best?.1 ?? 0) { best = (id, slot.node.raft.term) }
        }
        return best?.0
    }

    private var liveIDs: [NodeID] { ids.filter { slots[$0]?.retired == false } }

    private mutating func nemesis() {
        var actions: [Int] = []
        if swarm.crashes { actions += [0, 0, 1, 9] }
        if swarm.crashDuringPersist { actions.append(2) }
        if swarm.pauses { actions.append(3) }
        if swarm.partitions { actions += [4, 4, 5, 6] }
        if swarm.membershipChanges { actions.append(7) }
        if swarm.leaderTransfers { actions.append(8) }
        retireRemovedNodes()
        guard !actions.isEmpty else { return }
        let live = liveIDs
        guard !live.isEmpty else { return }
        switch actions[nemesisRandom.below(actions.count)] {
        case 0:  // crash a node (the leader half the time)
            let target = nemesisRandom.chance(1, in: 2) ? (currentLeader ?? live[nemesisRandom.below(live.count)]) : live[nemesisRandom.below(live.count)]
            let upCount = live.filter { slots[$0]?.up == true }.count
            if upCount > 1 {
                traceLine("nemesis crash \(target)", 6, target)
                crash(target)
            }
        case 1:  // restart everything that is down
            for id in live where slots[id]?.up == false { restart(id) }
        case 2:  // crash part-way through the next persist
            let target = live[nemesisRandom.below(live.count)]
            slots[target]?.crashBudget = nemesisRandom.below(4)
        case 3:  // pause a node (the leader half the time) for a while
            let target = nemesisRandom.chance(1, in: 2) ? (currentLeader ?? live[nemesisRandom.below(live.count)]) : live[nemesisRandom.below(live.count)]
            if let slot = slots[target], slot.up, !slot.paused {
                slot.paused = true
                slots[target] = slot
                report.stats.pauses += 1
                traceLine("nemesis pause \(target)", 7, target)
                schedule(after: 100 + nemesisRandom.below(1_500), .resume(target))
            }
        case 4:  // partition: a random split, or the leader alone, or a majorities ring
            cut = []
            report.stats.partitions += 1
            let shuffled = shuffle(live)
            let kind = nemesisRandom.below(3)
            if kind == 0, let leader = currentLeader {
                isolate(leader, among: live, oneWay: swarm.oneWayPartitions && nemesisRandom.chance(1, in: 2))
            } else if kind == 1 && live.count >= 5 {
                // Majorities ring: each node sees only its two neighbours on each side.
                for (i, a) in shuffled.enumerated() {
                    for (j, b) in shuffled.enumerated() where i != j {
                        let d = min((i - j + shuffled.count) % shuffled.count, (j - i + shuffled.count) % shuffled.count)
                        if d > 1 { cut.insert(link(a, b)) }
                    }
                }
            } else {
                let size = 1 + nemesisRandom.below(max(1, shuffled.count - 1))
                let a = Array(shuffled.prefix(size))
                let b = Array(shuffled.dropFirst(size))
                let oneWay = swarm.oneWayPartitions && nemesisRandom.chance(1, in: 2)
                for x in a { for y in b { cut.insert(link(x, y)); if !oneWay { cut.insert(link(y, x)) } } }
            }
            let cutCount = cut.count
            traceLine("nemesis partition \(cutCount)", 8, UInt64(cutCount))
        case 5:  // heal the network
            cut = []
            traceLine("nemesis heal-network", 9, 0)
        case 6:  // swizzle: cut links one by one is approximated by cutting one node's inbound links
            let target = live[nemesisRandom.below(live.count)]
            for other in live where other != target { cut.insert(link(other, target)) }
            report.stats.partitions += 1
            traceLine("nemesis cut-inbound \(target)", 10, target)
        case 7:
            changeMembership()
        case 9:  // power loss of the whole cluster at once (everything not fsynced is gone)
            traceLine("nemesis power-loss", 16, 0)
            for id in live where slots[id]?.up == true { crash(id) }
        case 8:
            if let leader = currentLeader, let slot = slots[leader] {
                let voters = slot.node.raft.membership.voters.filter { $0 != leader }
                if !voters.isEmpty {
                    let target = voters[nemesisRandom.below(voters.count)]
                    if (try? slot.node.transferLeadership(to: target)) != nil {
                        report.stats.transfers += 1
                        traceLine("nemesis transfer \(leader)->\(target)", 11, target)
                    }
                    slots[leader] = slot
                    process(leader)
                }
            }
        default:
            break
        }
    }

    private mutating func isolate(_ id: NodeID, among live: [NodeID], oneWay: Bool) {
        for other in live where other != id {
            cut.insert(link(id, other))
            if !oneWay { cut.insert(link(other, id)) }
        }
    }

    private mutating func shuffle(_ a: [NodeID]) -> [NodeID] { nemesisRandom.shuffled(a) }

    private mutating func changeMembership() {
        guard let leader = currentLeader, let slot = slots[leader] else { return }
        let m = slot.node.raft.membership
        guard m.learners.isEmpty else { return }
        let add = m.voters.count <= 3 || (m.voters.count < swarm.nodes + 1 && nemesisRandom.chance(1, in: 2))
        if add {
            let newID = nextNodeID
            guard (try? slot.node.proposeMembershipChange(.addLearner(newID))) != nil else { return }
            nextNodeID += 1
            let config = configuration(for: newID)
            do {
                var node = try SimNode(configuration: config, disk: SimDisk(), snapshotEvery: swarm.snapshotEvery)
                node.digestEvery = 8
                node.sabotage = options.sabotage
                slots[newID] = Slot(node: node)
                ids.append(newID)
                schedule(after: 1 + networkRandom.below(tickMillis), .tick(newID, incarnation: 0))
            } catch {
                report.violations.append("could not create node \(newID): \(error)")
            }
            traceLine("nemesis add-learner \(newID)", 12, newID)
        } else {
            let target = m.voters[nemesisRandom.below(m.voters.count)]
            guard (try? slot.node.proposeMembershipChange(.remove(target))) != nil else { return }
            removalRequested.insert(target)
            traceLine("nemesis remove \(target)", 13, target)
        }
        report.stats.membershipChanges += 1
        slots[leader] = slot
        process(leader)
    }

    /// The newest committed membership: that of the live node with the highest commit index
    /// (a node's membership is its latest committed configuration).
    private var committedMembership: Membership? {
        var best: (UInt64, Membership)?
        for id in ids {
            guard let slot = slots[id], slot.up, !slot.retired else { continue }
            let r = slot.node.raft
            if best == nil || r.commitIndex > (best?.0 ?? 0) { best = (r.commitIndex, r.membership) }
        }
        return best?.1
    }

    /// Operators shut down nodes once their removal committed. (A blank node whose addition was
    /// lost just idles: nobody sends it anything.)
    private mutating func retireRemovedNodes() {
        guard let m = committedMembership, let leader = currentLeader,
            let raft = slots[leader]?.node.raft, raft.hasCommittedInTerm, raft.membership == m
        else { return }
        for id in ids where !m.contains(id) && removalRequested.contains(id) {
            guard let slot = slots[id], !slot.retired else { continue }
            slot.retired = true
            slot.up = false
            slots[id] = slot
            for c in clients.indices where clients[c].pending?.node == id { abandon(c, unknown: true) }
            traceLine("retire \(id)", 14, id)
        }
    }

    private mutating func healAll() {
        guard faultsActive else { return }
        faultsActive = false
        healedAt = now
        cut = []
        swarm.lossPercent = 0
        swarm.duplicatePercent = 0
        swarm.longDelayPercent = 0
        traceLine("heal", 15, 0)
        for id in ids {
            guard let slot = slots[id], !slot.retired else { continue }
            slot.crashBudget = nil
            slots[id] = slot
            if !slot.up { restart(id) } else if slot.paused { resume(id) }
        }
    }

    // MARK: - Clients

    private mutating func issue(_ c: Int) {
        guard clients[c].pending == nil else { return }
        if clients[c].issued >= clients[c].quota {
            return
        }
        clients[c].seq += 1
        let seq = clients[c].seq
        let live = liveIDs
        guard !live.isEmpty else { return }
        let target = live[clientRandom.below(live.count)]
        let key = clientRandom.below(options.keys)
        let roll = clientRandom.below(10)
        let isRead = roll < 3
        guard let slot = slots[target], slot.up else {
            // Connection refused: nothing was sent; try another node shortly (not counted).
            if isRead { report.stats.readsFailed += 1 } else { report.stats.writesRefused += 1 }
            schedule(after: 10 + clientRandom.below(40), .clientNext(c))
            return
        }
        clients[c].issued += 1
        clients[c].pending = Pending(seq: seq, node: target, record: nil, key: key, isRead: isRead)
        schedule(after: requestTimeoutMillis, .clientTimeout(c, seq: seq))
        if isRead {
            let record = history.count
            history.append(Record(key: key, seq: seq, op: HistoryOperation(client: c, input: .read, output: .unknown, callTime: now, returnTime: nil)))
            clients[c].pending?.record = record
            if slot.paused {
                // The request waits in the frozen process and is handled first when it resumes.
                slot.clientQueue.append((c, seq))
                return
            }
            submit(c)
            return
        }
        clients[c].counter += 1
        let value = Int64(clients[c].id) * 1_000_000 + clients[c].counter
        let command: KVMachine.Command
        let input: RegisterModel.Input
        if roll >= 7, let expected = clients[c].known[key] {
            command = .cas(key: key, expected: expected, new: value)
            input = .cas(expected: Int(expected), new: Int(value))
        } else {
            command = .put(key: key, value: value)
            input = .write(Int(value))
        }
        let record = history.count
        history.append(Record(key: key, seq: seq, op: HistoryOperation(client: c, input: input, output: .unknown, callTime: now, returnTime: nil)))
        clients[c].pending?.record = record
        clients[c].pending?.command = command
        if slot.paused {
            slot.clientQueue.append((c, seq))
            return
        }
        submit(c)
    }

    /// Hands client `c`'s pending request to its node.
    private mutating func submit(_ c: Int) {
        guard let p = clients[c].pending, let record = p.record, let s = slots[p.node], s.up, !s.paused else { return }
        let target = p.node
        let seq = p.seq
        if p.isRead {
            if options.sabotage == .localReads {
                finishRead(c, value: s.node.machine.value(p.key), failed: false)
                return
            }
            let context = UInt64(clients[c].id) << 32 | UInt64(seq)
            if s.node.readIndex(context: context) {
                process(target)
            } else {
                clients[c].issued -= 1  // no leader known: refused at once, retried, not counted
                finishRead(c, value: nil, failed: true)
            }
            return
        }
        guard let command = p.command else { return }
        let envelope = KVMachine.Envelope(client: clients[c].id, seq: seq, command: command)
        do {
            try s.node.propose([envelope.encoded()])
            process(target)
        } catch {
            // A definite refusal: the command was never appended, so it must never apply (R30).
            refused.insert(UInt64(clients[c].id) << 32 | UInt64(seq))
            if applied.contains(UInt64(clients[c].id) << 32 | UInt64(seq)) {
                report.violations.append("t=\(now) op \(seq) of client \(clients[c].id) refused after it applied")
            }
            history[record].op.returnTime = nil
            history[record].key = -1  // dropped from the history
            clients[c].pending = nil
            clients[c].issued -= 1  // refused before anything happened: retry, not counted
            report.stats.writesRefused += 1
            schedule(after: 10 + clientRandom.below(40), .clientNext(c))
        }
    }

    private mutating func completeWrite(_ envelope: KVMachine.Envelope, outcome: KVMachine.Outcome?, at node: NodeID) {
        guard let outcome, envelope.client >= 1, Int(envelope.client) <= clients.count else { return }
        let c = Int(envelope.client) - 1
        guard let p = clients[c].pending, p.seq == envelope.seq, p.node == node, !p.isRead, let record = p.record else { return }
        switch outcome {
        case .written:
            history[record].op.output = .written
            if case .put(let key, let v) = envelope.command { clients[c].known[key] = v }
        case .swapped(let ok):
            history[record].op.output = .swapped(ok)
            if ok, case .cas(let key, _, let v) = envelope.command { clients[c].known[key] = v }
            if !ok, case .cas(let key, _, _) = envelope.command { clients[c].known[key] = nil }
        }
        history[record].op.returnTime = now
        clients[c].pending = nil
        report.stats.writesOK += 1
        schedule(after: clientRandom.below(20), .clientNext(c))
    }

    private mutating func completeRead(context: UInt64, at node: NodeID) {
        let client = Int(context >> 32)
        let seq = UInt32(truncatingIfNeeded: context)
        guard client >= 1, client <= clients.count else { return }
        let c = client - 1
        guard let p = clients[c].pending, p.seq == seq, p.node == node, p.isRead else { return }
        let value = slots[node]?.node.machine.value(p.key)
        finishRead(c, value: value, failed: false)
    }

    private mutating func finishRead(_ c: Int, value: Int64?, failed: Bool) {
        guard let p = clients[c].pending, let record = p.record else { return }
        if failed {
            history[record].key = -1
            report.stats.readsFailed += 1
        } else {
            history[record].op.output = .value(value.map { Int($0) })
            history[record].op.returnTime = now
            if let v = value { clients[c].known[p.key] = v } else { clients[c].known[p.key] = nil }
            report.stats.readsOK += 1
        }
        clients[c].pending = nil
        schedule(after: clientRandom.below(20), .clientNext(c))
    }

    private mutating func timeout(_ c: Int, seq: UInt32) {
        guard let p = clients[c].pending, p.seq == seq else { return }
        abandon(c, unknown: true)
    }

    /// The client gives up on its pending operation: a write's outcome is unknown (it may still
    /// apply), a read simply failed.
    private mutating func abandon(_ c: Int, unknown: Bool) {
        guard let p = clients[c].pending else { return }
        if p.isRead {
            finishRead(c, value: nil, failed: true)
            return
        }
        // Unknown: stays in the history with no return (may take effect at any later point).
        clients[c].known[p.key] = nil
        clients[c].pending = nil
        report.stats.writesUnknown += 1
        schedule(after: 5 + clientRandom.below(20), .clientNext(c))
    }

    // MARK: - Liveness and convergence

    private mutating func periodicCheck() {
        retireRemovedNodes()
        guard let healed = healedAt else { return }
        let clientsDone = clients.allSatisfy { $0.pending == nil && $0.issued >= $0.quota }
        if !clientsDone {
            // Clients keep going; nudge any that stalled (defensive: every path reschedules).
            for c in clients.indices where clients[c].pending == nil && clients[c].issued < clients[c].quota {
                schedule(after: 1, .clientNext(c))
            }
        }
        if clientsDone && !finalWriteDone {
            finalWrite()
            if !finalWriteDone { return checkLivenessDeadline(healed) }
        }
        if clientsDone && finalWriteDone, converged() {
            finished = true
            return
        }
        checkLivenessDeadline(healed)
    }

    private mutating func checkLivenessDeadline(_ healed: Int) {
        if now - healed > options.livenessBudgetMillis {
            let leader = currentLeader.map { "leader \($0)" } ?? "no leader"
            let pendingOps = clients.filter { $0.pending != nil || $0.issued < $0.quota }.count
            report.livenessFailure =
                "no convergence \(options.livenessBudgetMillis) ms after healing (\(leader), \(pendingOps) clients unfinished, final write \(finalWriteDone ? "done" : "pending")); \(clusterState())"
            finished = true
        }
    }

    /// A final write through the leader must commit once faults heal (etcd's closing write). It
    /// goes to a key the clients never use, so the history stays clean.
    private mutating func finalWrite() {
        if let fw = finalWriteEntry, Int(fw.index) <= ledger.count {
            if ledger[Int(fw.index) - 1].term == fw.term { finalWriteDone = true; return }
        }
        if let fw = finalWriteEntry, let slot = slots[fw.node], slot.up, slot.node.raft.role == .leader,
            slot.node.raft.term == fw.term
        {
            return  // still in flight under the same leader
        }
        guard let leader = currentLeader, let slot = slots[leader] else { return }
        finalWriteSeq += 1
        let envelope = KVMachine.Envelope(client: 0, seq: finalWriteSeq, command: .put(key: options.keys, value: -1))
        if case .appended(let first, _, let term)? = try? slot.node.propose([envelope.encoded()]) {
            finalWriteEntry = (leader, first, term)
        }
        slots[leader] = slot
        process(leader)
    }

    /// One line per node, for triage of liveness failures.
    private func clusterState() -> String {
        var parts: [String] = []
        let progress = currentLeader.flatMap { slots[$0]?.node.raft.replicationStatus } ?? []
        for id in ids {
            guard let slot = slots[id] else { continue }
            let r = slot.node.raft
            var p = "n\(id)[\(slot.retired ? "retired" : slot.up ? (slot.paused ? "paused" : "up") : "down") \(r.role) t\(r.term)"
            p += " commit \(r.commitIndex) applied \(r.appliedIndex) last \(r.lastIndex) snap \(r.snapshotMeta.index) \(r.membership)"
            if let pr = progress.first(where: { $0.node == id }) { p += " match \(pr.match) next \(pr.next) \(pr.state)" }
            parts.append(p + "]")
        }
        return parts.joined(separator: " ")
    }

    private func converged() -> Bool {
        guard let leader = currentLeader, let lr = slots[leader]?.node.raft else { return false }
        guard lr.commitIndex == lr.lastIndex else { return false }
        var digest: String?
        for id in lr.membership.all {
            guard let slot = slots[id], slot.up, !slot.paused else { return false }
            guard slot.node.raft.appliedIndex == lr.commitIndex, slot.node.machine.appliedIndex == lr.commitIndex else { return false }
            let d = slot.node.machine.digest
            if let x = digest, x != d { return false }
            digest = d
        }
        return true
    }

    // MARK: - Linearizability

    private mutating func checkLinearizability() {
        var byKey: [Int: [HistoryOperation<RegisterModel.Input, RegisterModel.Output>]] = [:]
        let converged = finished && report.livenessFailure == nil
        for r in history where r.key >= 0 {
            var op = r.op
            if case .read = op.input {
                // Reads that never returned are dropped.
                if op.returnTime == nil { continue }
            } else if op.returnTime == nil {
                // A write whose client never heard back. If some replica applied it, its effect is
                // known (every replica computes the same outcome) and it took effect no later
                // than that first application. If none did and the cluster converged, it never
                // took effect. Otherwise it stays unknown: it may apply at any later time.
                let key = UInt64(clients[op.client].id) << 32 | UInt64(r.seq)
                if let first = firstApplied[key] {
                    switch first.outcome {
                    case .written: op.output = .written
                    case .swapped(let ok): op.output = .swapped(ok)
                    }
                    op.returnTime = max(first.time, op.callTime)
                    report.stats.writesPatched += 1
                } else if converged {
                    report.stats.writesPatched += 1
                    continue
                }
            }
            byKey[r.key, default: []].append(op)
        }
        (report.linearizability, report.nonLinearizableKeys) = registerVerdict(byKey)
    }
}
