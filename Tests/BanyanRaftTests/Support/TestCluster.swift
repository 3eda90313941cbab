import BanyanRaft
import BanyanStateMachine

/// The Raft core's unit-test fixture (not a simulator: the one simulator is `WholeNodeSimulator`). A synchronous, step-by-step cluster for scenario tests (etcd's `network` harness, in Swift):
/// messages are delivered immediately and in order unless a test drops, holds or redirects them.
/// Nothing here is random except each node's seeded election timer.
struct TestCluster {
    private(set) var nodes: [NodeID: SimNode] = [:]
    /// Nodes that are down (crashed and not restarted).
    private(set) var down: Set<NodeID> = []
    /// Directed links that drop everything.
    var cutLinks: Set<Link> = []
    /// Messages held back by `hold` filters, in send order.
    private(set) var held: [Message] = []
    /// Every message delivered, in order (for assertions).
    private(set) var delivered: [Message] = []
    /// Everything applied per node, in order.
    private(set) var applied: [NodeID: [LogEntry]] = [:]
    private(set) var outcomes: [NodeID: [(envelope: CommandEnvelope, outcome: StateMachine.Applied?, index: UInt64)]] = [:]
    private(set) var reads: [NodeID: [ReadState]] = [:]
    /// Persist-before-send and core invariant breaches seen so far (tests assert it stays empty).
    private(set) var violations: [String] = []
    private var dropFilter: (@Sendable (Message) -> Bool)?
    private var holdFilter: (@Sendable (Message) -> Bool)?
    private var restarts: UInt64 = 0

    struct Link: Hashable, Sendable {
        var from: NodeID
        var to: NodeID
        init(from: NodeID, to: NodeID) {
            self.from = from
            self.to = to
        }
    }

    /// The election-timer seed node `id` starts with (before `configure`; `restart` re-seeds).
    static func seed(_ id: NodeID) -> UInt64 { id &* 0x9E37_79B9 }

    /// A cluster of `count` founding voters with ids 1…count.
    init(voters count: Int, configure: (inout RaftConfiguration) -> Void = { _ in }) throws {
        let ids = (1...UInt64(count)).map { $0 }
        for id in ids {
            var config = RaftConfiguration(id: id, seed: Self.seed(id))
            configure(&config)
            nodes[id] = try SimNode.founding(configuration: config, members: ids)
        }
    }

    /// Adds a blank node (it joins when the leader adds it as a learner).
    mutating func addBlankNode(_ id: NodeID, configure: (inout RaftConfiguration) -> Void = { _ in }) throws {
        var config = RaftConfiguration(id: id, seed: Self.seed(id))
        configure(&config)
        nodes[id] = try SimNode(configuration: config, stored: StoredState())
    }

    func node(_ id: NodeID) -> SimNode? { nodes[id] }
    func raft(_ id: NodeID) -> RaftNode? { nodes[id]?.raft }

    mutating func withNode<R>(_ id: NodeID, _ body: (inout SimNode) throws(RaftError) -> R) throws(RaftError) -> R? {
        guard var n = nodes[id] else { return nil }
        let r = try body(&n)
        nodes[id] = n
        return r
    }

    // MARK: - Faults

    mutating func isolate(_ id: NodeID) {
        for other in nodes.keys where other != id {
            cutLinks.insert(Link(from: id, to: other))
            cutLinks.insert(Link(from: other, to: id))
        }
    }

    /// Splits the cluster into groups that cannot talk to each other.
    mutating func partition(_ groups: [[NodeID]]) {
        for (i, a) in groups.enumerated() {
            for (j, b) in groups.enumerated() where i != j {
                for x in a { for y in b { cutLinks.insert(Link(from: x, to: y)) } }
            }
        }
    }

    mutating func heal() { cutLinks = [] }

    /// Drops every message for which `filter` is true (nil: drop nothing).
    mutating func drop(where filter: (@Sendable (Message) -> Bool)?) { dropFilter = filter }

    /// Holds back every message for which `filter` is true, to deliver later with `release`.
    mutating func hold(where filter: (@Sendable (Message) -> Bool)?) { holdFilter = filter }

    /// Delivers held messages (optionally a subset, in the given order) and stabilises. Held
    /// messages that are not chosen are discarded (lost). The chosen ones are not held again by
    /// an active `hold` filter, but what they cause is.
    mutating func release(_ select: (([Message]) -> [Message])? = nil) {
        let chosen = select?(held) ?? held
        held = []
        for m in chosen { deliver(m, holding: false) }
        stabilize()
    }

    mutating func crash(_ id: NodeID) { down.insert(id) }

    /// Restarts a node after a power loss (`SimNode.restart`).
    mutating func restart(_ id: NodeID) throws {
        restarts += 1
        down.remove(id)
        let seed = id &* 7919 &+ restarts
        guard var n = nodes[id] else { return }
        try n.restart(seed: seed)
        nodes[id] = n
    }

    /// Replaces a node's disk with a blank one and restarts it (a wiped disk, R22). `configure`
    /// changes the configuration it comes back with (a wiped node's new incarnation).
    mutating func wipe(_ id: NodeID, configure: (inout RaftConfiguration) -> Void = { _ in }) throws {
        guard let n = nodes[id] else { return }
        var config = n.configuration
        configure(&config)
        nodes[id] = try SimNode(configuration: config, stored: StoredState())
        down.remove(id)
    }

    /// Stops a node without losing its memory: it neither ticks nor sends nor receives until
    /// `resume` (a stalled process, not a crash).
    mutating func pause(_ id: NodeID) { down.insert(id) }

    /// Lets a paused node run again as it was.
    mutating func resume(_ id: NodeID) { down.remove(id) }

    /// Replaces a node with one restored from `disk` (a hand-built log for scenario tests); the
    /// node keeps its configuration and snapshot interval and is up afterwards.
    mutating func replace(_ id: NodeID, disk: StoredState) throws {
        guard let n = nodes[id] else { return }
        nodes[id] = try SimNode(configuration: n.configuration, stored: disk, snapshotEvery: n.snapshotEvery)
        down.remove(id)
    }

    // MARK: - Driving

    mutating func tick(_ id: NodeID, times: Int = 1) {
        for _ in 0..<times {
            guard !down.contains(id) else { return }
            nodes[id]?.tick()
            stabilize()
        }
    }

    mutating func tickAll(times: Int = 1) {
        for _ in 0..<times {
            for id in nodes.keys.sorted() where !down.contains(id) { nodes[id]?.tick() }
            stabilize()
        }
    }

    mutating func campaign(_ id: NodeID) {
        nodes[id]?.campaign()
        stabilize()
    }

    @discardableResult
    mutating func propose(_ id: NodeID, _ data: [UInt8]) throws(RaftError) -> RaftNode.ProposalOutcome? {
        let r = try withNode(id) { (n: inout SimNode) throws(RaftError) in try n.propose([data]) }
        stabilize()
        return r
    }

    /// Proposes a put through `id` (`Register.put`: client session 1 unless told).
    @discardableResult
    mutating func put(_ id: NodeID, key: Int, value: Int64, client: UInt32 = 1, seq: UInt32) throws(RaftError) -> RaftNode.ProposalOutcome? {
        try propose(id, Register.put(key: key, value: value, client: client, seq: seq).encoded())
    }

    @discardableResult
    mutating func changeMembership(_ id: NodeID, _ change: MembershipChange) throws(RaftError) -> RaftNode.ProposalOutcome? {
        let r = try withNode(id) { (n: inout SimNode) throws(RaftError) in try n.proposeMembershipChange(change) }
        stabilize()
        return r
    }

    mutating func transfer(_ id: NodeID, to target: NodeID) throws(RaftError) {
        _ = try withNode(id) { (n: inout SimNode) throws(RaftError) in try n.transferLeadership(to: target) }
        stabilize()
    }

    @discardableResult
    mutating func readIndex(_ id: NodeID, context: UInt64) -> Bool {
        let ok = nodes[id]?.readIndex(context: context) ?? false
        stabilize()
        return ok
    }

    /// Processes every node and delivers messages until nothing moves (bounded).
    mutating func stabilize(maxRounds: Int = 10_000) {
        var rounds = 0
        while rounds < maxRounds {
            rounds += 1
            var outgoing: [Message] = []
            for id in nodes.keys.sorted() where !down.contains(id) {
                guard var n = nodes[id] else { continue }
                let out = n.process()
                nodes[id] = n
                outgoing.append(contentsOf: out.messages)
                applied[id, default: []].append(contentsOf: out.applied)
                outcomes[id, default: []].append(contentsOf: out.outcomes)
                reads[id, default: []].append(contentsOf: out.readsReady)
                violations.append(contentsOf: out.violations)
            }
            if outgoing.isEmpty { return }
            for m in outgoing { deliver(m) }
        }
    }

    private mutating func deliver(_ m: Message, holding: Bool = true) {
        if down.contains(m.to) || down.contains(m.from) || cutLinks.contains(Link(from: m.from, to: m.to)) { return }
        if let f = dropFilter, f(m) { return }
        if holding, let h = holdFilter, h(m) {
            held.append(m)
            return
        }
        delivered.append(m)
        nodes[m.to]?.step(m)
    }

    /// What a driver does when `id` connects and says hello to every peer it can reach: each
    /// live peer's core learns `id`'s incarnation (`noteIncarnation`).
    mutating func hello(from id: NodeID) {
        guard let incarnation = nodes[id]?.raft.incarnation, !down.contains(id) else { return }
        for other in nodes.keys.sorted() where other != id && !down.contains(other) && !cutLinks.contains(Link(from: id, to: other)) {
            nodes[other]?.noteIncarnation(of: id, incarnation)
        }
        stabilize()
    }

    /// Steps a message directly (for hand-made, stale or duplicated messages).
    mutating func inject(_ m: Message) {
        nodes[m.to]?.step(m)
        stabilize()
    }

    // MARK: - Queries

    /// The leader with the highest term among live nodes, if any.
    var leader: NodeID? {
        nodes.values.filter { $0.raft.role == .leader && !down.contains($0.id) }.max { $0.raft.term < $1.raft.term }?.id
    }

    /// A live leader of the highest term any live node is in (not a stale one).
    var settledLeader: NodeID? {
        let live = nodes.values.filter { !down.contains($0.id) }
        let top = live.map(\.raft.term).max() ?? 0
        return live.first { $0.raft.role == .leader && $0.raft.term == top }?.id
    }

    /// Vote and pre-vote grants `from` sent that were delivered since position `mark` of
    /// `delivered`.
    func grants(from: NodeID, since mark: Int) -> [Message] {
        delivered[mark...].filter { m in
            guard m.from == from else { return false }
            switch m.body {
            case .voteResponse(let granted), .preVoteResponse(let granted): return granted
            default: return false
            }
        }
    }

    /// Entries of `id`'s log (after its snapshot) as (index, term) pairs.
    func logTerms(_ id: NodeID) -> [UInt64] {
        guard let r = nodes[id]?.raft else { return [] }
        guard r.lastIndex >= r.firstIndex else { return [] }
        return (r.firstIndex...r.lastIndex).compactMap { r.term(at: $0) }
    }
}
