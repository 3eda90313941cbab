import BanyanRaft
import Testing

/// Issue 14 item 3 (R22): a node that comes back blank under its old id must not regain its vote
/// by replaying the entries that admitted its earlier incarnation. `TestCluster` cannot tell a
/// node's driver about a peer's incarnation, so these scenarios drive `RaftNode`s directly: every
/// message is delivered at once and in order, nothing is persisted (no node here restarts from
/// its disk; a wiped node is a new `RaftNode` from `.blank`).
@Suite struct IncarnationTests {
    /// A synchronous network of cores.
    struct Net {
        var nodes: [NodeID: RaftNode] = [:]
        /// Nodes that neither tick nor send nor receive.
        var down: Set<NodeID> = []
        var delivered: [Message] = []

        static func configuration(_ id: NodeID, incarnation: UInt64) -> RaftConfiguration {
            var c = RaftConfiguration(id: id, seed: id &* 0x9E37_79B9 &+ incarnation)
            c.incarnation = incarnation
            return c
        }

        /// Founding voters 1…count; node i has incarnation `incarnation(i)` (0: legacy).
        init(voters count: Int, incarnation: (NodeID) -> UInt64) throws {
            let ids = (1...UInt64(count)).map { $0 }
            for id in ids {
                nodes[id] = try RaftNode(
                    configuration: Self.configuration(id, incarnation: incarnation(id)), restoring: RaftNode.bootstrapState(members: ids))
            }
        }

        /// A node starting from a blank disk (new, or wiped) with this incarnation.
        mutating func startBlank(_ id: NodeID, incarnation: UInt64) throws {
            nodes[id] = try RaftNode(configuration: Self.configuration(id, incarnation: incarnation), restoring: .blank)
            down.remove(id)
        }

        /// What a driver does when a connection from `node` says hello to everyone: every other
        /// core learns its incarnation.
        mutating func hello(from node: NodeID) {
            guard let incarnation = nodes[node]?.incarnation else { return }
            for id in nodes.keys where id != node { nodes[id]?.noteIncarnation(of: node, incarnation) }
        }

        func raft(_ id: NodeID) -> RaftNode? { nodes[id] }

        var leader: NodeID? {
            nodes.values.filter { $0.role == .leader && !down.contains($0.id) }.max { $0.term < $1.term }?.id
        }

        /// A live leader of the highest term any live node is in (not a stale one).
        var settledLeader: NodeID? {
            let live = nodes.values.filter { !down.contains($0.id) }
            let top = live.map(\.term).max() ?? 0
            return live.first { $0.role == .leader && $0.term == top }?.id
        }

        mutating func stabilize() {
            for _ in 0..<10_000 {
                var out: [Message] = []
                for id in nodes.keys.sorted() where !down.contains(id) {
                    guard var n = nodes[id] else { continue }
                    while n.hasReady {
                        let rd = n.ready()
                        out.append(contentsOf: rd.messages)
                        n.advance(rd)
                    }
                    nodes[id] = n
                }
                if out.isEmpty { return }
                for m in out where !down.contains(m.to) && !down.contains(m.from) {
                    guard var n = nodes[m.to] else { continue }
                    delivered.append(m)
                    n.step(m)
                    nodes[m.to] = n
                }
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

        mutating func change(_ id: NodeID, _ change: MembershipChange) throws {
            guard var n = nodes[id] else { return }
            try n.proposeMembershipChange(change)
            nodes[id] = n
            stabilize()
        }

        mutating func transfer(_ id: NodeID, to target: NodeID) throws {
            guard var n = nodes[id] else { return }
            try n.transferLeadership(to: target)
            nodes[id] = n
            stabilize()
        }

        mutating func propose(_ id: NodeID, _ data: [UInt8]) throws {
            guard var n = nodes[id] else { return }
            try n.propose(data)
            nodes[id] = n
            stabilize()
        }

        mutating func inject(_ m: Message) {
            nodes[m.to]?.step(m)
            stabilize()
        }

        /// Ticks until `done` holds; the rounds taken, or nil after `limit`.
        @discardableResult
        mutating func tickUntil(limit: Int = 300, _ done: (Net) -> Bool) -> Int? {
            if done(self) { return 0 }
            for round in 1...limit {
                tickAll()
                if done(self) { return round }
            }
            return nil
        }

        /// Vote or pre-vote grants `from` sent since position `mark` of `delivered`.
        func grants(from: NodeID, since mark: Int) -> [Message] {
            delivered[mark...].filter { m in
                guard m.from == from else { return false }
                switch m.body {
                case .voteResponse(let granted), .preVoteResponse(let granted): return granted
                default: return false
                }
            }
        }
    }

    static let incarnationA: UInt64 = 0xA11C_E000_0000_000A
    static let incarnationB: UInt64 = 0xB0B0_0000_0000_000B

    @Test("a wiped node back under its old id with a new incarnation keeps mayVote false when a leader replays its old addLearner and promote from index 1, never grants a vote, and votes again only once removed and re-added (R22, issue 14 item 3)")
    func wipedNodeDoesNotRegainVoteByReplay() throws {
        var net = try Net(voters: 3) { 100 + $0 }
        net.campaign(1)
        #expect(net.leader == 1)
        // Node 4 (incarnation A) joins: its hello reaches the leader, which adds it as a learner
        // and promotes it once it has caught up.
        try net.startBlank(4, incarnation: Self.incarnationA)
        net.hello(from: 4)
        try net.change(1, .addLearner(4))
        net.tickAll(times: 3)
        #expect(net.raft(1)?.membership.voters == [1, 2, 3, 4])
        #expect(net.raft(1)?.membership.incarnation(of: 4) == Self.incarnationA)
        #expect(net.raft(4)?.mayVote == true)
        try net.propose(1, [1])
        // Node 4's data directory is deleted; it restarts blank under id 4 with incarnation B
        // (a fresh random identity), and its hello tells every peer so.
        try net.startBlank(4, incarnation: Self.incarnationB)
        net.hello(from: 4)
        #expect(net.raft(4)?.mayVote == false)
        // A leadership transfer: the new leader probes node 4 back to index 1 and replays the
        // whole log, including the entries that added and promoted incarnation A.
        try net.transfer(1, to: 2)
        #expect(net.leader == 2)
        net.tickAll(times: 5)
        let four = try #require(net.raft(4))
        #expect(four.lastIndex == net.raft(2)?.lastIndex)
        #expect(four.commitIndex == net.raft(2)?.commitIndex)
        #expect(four.membership.voters == [1, 2, 3, 4])
        #expect(four.mayVote == false, "the replayed entries of incarnation A gave incarnation B a vote")
        #expect(four.isVoterWithAmnesia)
        // It grants nothing: not a direct request…
        var mark = net.delivered.count
        net.inject(Message(from: 3, to: 4, term: 50, body: .preVote(lastIndex: 100, lastTerm: 50)))
        net.inject(Message(from: 3, to: 4, term: 50, body: .vote(lastIndex: 100, lastTerm: 50, leaderTransfer: true)))
        #expect(net.grants(from: 4, since: mark).isEmpty)
        // (Those requests moved terms on: the others elect a leader without node 4.)
        #expect(net.tickUntil { $0.settledLeader != nil } != nil)
        // …nor in an election that needs it: with the leader down, 3 of {1, 2, 3, 4} cannot be
        // found among the other three without node 4.
        let leader = try #require(net.settledLeader)
        mark = net.delivered.count
        net.down.insert(leader)
        #expect(net.tickUntil(limit: 200) { $0.settledLeader != nil } == nil)
        #expect(net.grants(from: 4, since: mark).isEmpty)
        #expect(net.raft(4)?.mayVote == false)
        net.down.remove(leader)
        #expect(net.tickUntil { $0.settledLeader != nil } != nil)
        // The operator's remedy (docs/runbook.md): remove id 4 and add it back. The leader knows
        // incarnation B, records it, and promotes node 4, which then votes again.
        let l = try #require(net.settledLeader)
        try net.change(l, .remove(4))
        #expect(net.raft(l)?.membership.contains(4) == false)
        #expect(net.raft(4)?.mayVote == false)
        net.tickAll(times: 2)
        try net.change(l, .addLearner(4))
        net.tickAll(times: 5)
        #expect(net.raft(l)?.membership.voters == [1, 2, 3, 4])
        #expect(net.raft(l)?.membership.incarnation(of: 4) == Self.incarnationB)
        #expect(net.raft(4)?.mayVote == true)
        #expect(net.raft(4)?.isVoterWithAmnesia == false)
        // Its vote now counts: with the leader down again, {others, 4} elect a leader.
        mark = net.delivered.count
        net.down.insert(l)
        #expect(net.tickUntil { $0.settledLeader != nil } != nil)
        #expect(!net.grants(from: 4, since: mark).isEmpty)
        for n in net.nodes.values { #expect(n.invariantViolations.isEmpty) }
    }

    @Test("a leader with an incarnation does not promote a learner whose incarnation it does not know: the manual promote is refused and automatic promotion waits for the hello (R22)")
    func promotionWaitsForIncarnation() throws {
        var net = try Net(voters: 3) { 100 + $0 }
        net.campaign(1)
        try net.startBlank(4, incarnation: Self.incarnationA)
        // No hello from node 4 yet: the entry adding it records no incarnation.
        try net.change(1, .addLearner(4))
        net.tickAll(times: 5)
        #expect(net.raft(4)?.lastIndex == net.raft(1)?.lastIndex)
        #expect(net.raft(1)?.membership == Membership(voters: [1, 2, 3], learners: [4]))
        #expect(net.raft(4)?.mayVote == false)
        #expect(throws: RaftError.incarnationUnknown(4)) { try net.change(1, .promote(4)) }
        // Its hello arrives: the next acknowledgement promotes it, recording incarnation A, and
        // node 4 takes its vote from that entry (it names 4 with its own incarnation).
        net.hello(from: 4)
        net.tickAll(times: 3)
        #expect(net.raft(1)?.membership == Membership(voters: [1, 2, 3, 4], incarnations: [4: Self.incarnationA]))
        #expect(net.raft(4)?.mayVote == true)
    }

    @Test("legacy nodes (incarnation 0) keep the old rules: a learner is promoted without a known incarnation and takes its vote from the entry that made it a learner")
    func legacyModeUnchanged() throws {
        var net = try Net(voters: 3) { _ in 0 }
        net.campaign(1)
        try net.startBlank(4, incarnation: 0)
        try net.change(1, .addLearner(4))
        net.tickAll(times: 3)
        #expect(net.raft(1)?.membership == Membership(voters: [1, 2, 3, 4]))
        #expect(net.raft(4)?.mayVote == true)
    }

    @Test("a node with an incarnation takes its vote from an installed snapshot only when the snapshot's membership names its incarnation")
    func snapshotRestoreNeedsIncarnation() throws {
        let meta = { (m: Membership) in SnapshotMeta(index: 10, term: 2, membership: m) }
        func install(_ m: Membership, into incarnation: UInt64) throws -> RaftNode {
            var config = RaftConfiguration(id: 4, seed: 1)
            config.incarnation = incarnation
            var node = try RaftNode(configuration: config, restoring: .blank)
            node.step(Message(from: 1, to: 4, term: 2, body: .snapshotChunk(meta: meta(m), offset: 0, data: [1], last: true)))
            return node
        }
        let old = Membership(voters: [1, 2, 3, 4], incarnations: [4: Self.incarnationA])
        #expect(try install(old, into: Self.incarnationB).mayVote == false)
        #expect(try install(old, into: Self.incarnationB).isVoterWithAmnesia)
        #expect(try install(Membership(voters: [1, 2, 3], learners: [4]), into: Self.incarnationB).mayVote == false)
        #expect(try install(old, into: Self.incarnationA).mayVote == true)
        let learner = Membership(voters: [1, 2, 3], learners: [4], incarnations: [4: Self.incarnationB])
        #expect(try install(learner, into: Self.incarnationB).mayVote == true)
        // Legacy: any membership naming it as a learner.
        #expect(try install(Membership(voters: [1, 2, 3], learners: [4]), into: 0).mayVote == true)
    }

    @Test("membership changes keep recorded incarnations of the other members and drop a removed member's")
    func membershipKeepsIncarnations() throws {
        let m = Membership(voters: [1, 2], learners: [3], incarnations: [1: 11, 3: 33, 9: 99, 2: 0])
        #expect(m.incarnations == [1: 11, 3: 33])
        #expect(try m.applying(.promote(3)).get() == Membership(voters: [1, 2, 3], incarnations: [1: 11, 3: 33]))
        #expect(try m.applying(.remove(3)).get().incarnations == [1: 11])
        #expect(try m.applying(.addLearner(4)).get().incarnations == [1: 11, 3: 33])
        #expect(m != Membership(voters: [1, 2], learners: [3]))
        #expect(m.description == "voters [1, 2] learners [3] incarnations [1: b, 3: 21]")
        #expect(Membership(voters: [1, 2]).description == "voters [1, 2] learners []")
    }
}
