import BanyanRaft
import BanyanStateMachine
import Testing

/// Single-server membership changes (R20–R23), after etcd's TestNewLeaderPendingConfig,
/// confchange_v1_* and the single-server change bug.
@Suite struct MembershipTests {
    /// The memberships carried by configuration entries a node applied, in order.
    static func appliedConfigs(_ c: TestCluster, _ id: NodeID) -> [Membership] {
        (c.applied[id] ?? []).compactMap { if case .config(let m) = $0.kind { m } else { nil } }
    }

    @Test("a learner added to the cluster catches up, is promoted automatically and ends with the same state")
    func learnerCatchesUpAndIsPromoted() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        for i in 0..<5 { try c.put(1, key: i, value: Int64(i), seq: UInt32(i + 1)) }
        try c.addBlankNode(4)
        #expect(c.raft(4)?.membership.isEmpty == true)
        try c.changeMembership(1, .addLearner(4))
        c.tickAll(times: 3)
        #expect(c.raft(1)?.membership == Membership(voters: [1, 2, 3, 4]))
        #expect(
            Self.appliedConfigs(c, 1)
                == [Membership(voters: [1, 2, 3]), Membership(voters: [1, 2, 3], learners: [4]), Membership(voters: [1, 2, 3, 4])]
        )
        #expect(Self.appliedConfigs(c, 4) == Self.appliedConfigs(c, 1))
        #expect(c.raft(4)?.membership == Membership(voters: [1, 2, 3, 4]))
        #expect(c.node(4)?.machine.digest == c.node(1)?.machine.digest)
        #expect(c.logTerms(4) == c.logTerms(1))
        #expect(c.violations.isEmpty)
    }

    @Test("a second membership change is refused while the first is uncommitted")
    func oneChangeAtATime() throws {
        var c = try TestCluster(voters: 3) { $0.autoPromoteLearners = false }
        c.campaign(1)
        try c.addBlankNode(4)
        try c.addBlankNode(5)
        c.hold { $0.from == 1 && $0.isAppend }
        try c.changeMembership(1, .addLearner(4))
        #expect(throws: RaftError.membershipChangePending) { try c.changeMembership(1, .addLearner(5)) }
        #expect(throws: RaftError.membershipChangePending) { try c.changeMembership(1, .remove(3)) }
        c.hold(where: nil)
        c.release()
        #expect(c.raft(1)?.membership == Membership(voters: [1, 2, 3], learners: [4]))
        try c.changeMembership(1, .addLearner(5))
        #expect(c.raft(1)?.membership == Membership(voters: [1, 2, 3], learners: [4, 5]))
        #expect(c.violations.isEmpty)
    }

    @Test("a new leader holding an uncommitted configuration entry of an older term refuses a change until its no-op commits (R20)")
    func newLeaderPendingConfig() throws {
        var c = try TestCluster(voters: 3) { $0.autoPromoteLearners = false }
        c.campaign(1)
        try c.addBlankNode(4)
        // Node 2 receives the configuration entry; node 1 never hears that it did, node 3
        // never receives it.
        c.drop { ($0.from == 2 && $0.to == 1) || ($0.from == 1 && $0.to == 3) }
        try c.changeMembership(1, .addLearner(4))
        #expect(c.raft(2)?.lastIndex == 3)
        #expect(c.raft(1)?.commitIndex == 2)
        #expect(c.raft(2)?.membership == Membership(voters: [1, 2, 3]))
        // Node 1 dies; node 2 (whose log is longer) is elected, its appends held back.
        c.drop(where: nil)
        c.crash(1)
        c.hold { $0.from == 2 && $0.isAppend }
        var rounds = 0
        while c.leader != 2 && rounds < 300 {
            c.tickAll()
            rounds += 1
        }
        #expect(c.leader == 2)
        #expect(c.raft(2)?.term == 3)
        #expect(c.raft(2)?.hasCommittedInTerm == false)
        #expect(throws: RaftError.membershipChangePending) { try c.changeMembership(2, .remove(1)) }
        // Once the no-op commits, the old-term entry has committed with it and a change is allowed.
        c.hold(where: nil)
        c.release()
        #expect(c.raft(2)?.commitIndex == 4)
        #expect(c.raft(2)?.membership == Membership(voters: [1, 2, 3], learners: [4]))
        try c.changeMembership(2, .remove(4))
        #expect(c.raft(2)?.membership == Membership(voters: [1, 2, 3]))
        #expect(c.violations.isEmpty)
    }

    @Test("a new leader refuses a change until its no-op commits even with no configuration entry pending (single-server change bug, R20)")
    func newLeaderWaitsForNoopBeforeChange() throws {
        var c = try TestCluster(voters: 3) { $0.autoPromoteLearners = false }
        c.campaign(1)
        try c.addBlankNode(4)
        c.hold { $0.from == 2 && $0.isAppend }
        try c.transfer(1, to: 2)
        #expect(c.leader == 2)
        #expect(c.raft(2)?.hasCommittedInTerm == false)
        #expect(throws: RaftError.membershipChangePending) { try c.changeMembership(2, .addLearner(4)) }
        c.hold(where: nil)
        c.release()
        #expect(c.raft(2)?.hasCommittedInTerm == true)
        try c.changeMembership(2, .addLearner(4))
        #expect(c.raft(2)?.membership == Membership(voters: [1, 2, 3], learners: [4]))
        #expect(c.violations.isEmpty)
    }

    @Test("a partitioned follower is removed; the remaining two keep committing without it (R21)")
    func removeFollower() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        c.isolate(3)
        try c.changeMembership(1, .remove(3))
        #expect(c.raft(1)?.membership == Membership(voters: [1, 2]))
        #expect(c.raft(2)?.membership == Membership(voters: [1, 2]))
        try c.put(1, key: 0, value: 1, seq: 1)
        #expect(c.raft(1)?.commitIndex == 4)
        // The leader no longer sends to the removed node, even once it is reachable.
        c.heal()
        let mark = c.delivered.count
        c.tickAll(times: 40)
        #expect(!c.delivered(since: mark).contains { $0.from == 1 && $0.to == 3 && ($0.isAppend || $0.isHeartbeat) })
        #expect(c.leader == 1)
        #expect(c.raft(1)?.term == 2)
        #expect(c.raft(3)?.lastIndex == 2)
        #expect(c.violations.isEmpty)
    }

    @Test("a removed leader steps down when the removal commits, never campaigns, and the others elect a leader that commits without it (R21)")
    func removeLeader() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)
        try c.changeMembership(1, .remove(1))
        #expect(c.raft(1)?.role == .follower)
        #expect(c.raft(1)?.membership == Membership(voters: [2, 3]))
        for id: NodeID in 2...3 { #expect(c.raft(id)?.commitIndex == 4) }
        var leaders: Set<NodeID> = []
        for _ in 0..<100 {
            c.tickAll()
            if let l = c.leader { leaders.insert(l) }
        }
        #expect(!leaders.contains(1))
        let newLeader = try #require(c.leader)
        try c.put(newLeader, key: 0, value: 2, seq: 2)
        let other: NodeID = newLeader == 2 ? 3 : 2
        #expect(c.node(other)?.machine.value(0) == 2)
        // The removed node is not counted: with the other voter cut off, nothing commits.
        c.isolate(other)
        let commit = try #require(c.raft(newLeader)?.commitIndex)
        try c.put(newLeader, key: 0, value: 3, seq: 3)
        #expect(c.raft(newLeader)?.commitIndex == commit)
        #expect(c.violations.isEmpty)
    }

    @Test("a wiped node (blank disk, same id) grants no votes, so a candidate missing a committed entry cannot win (R22)")
    func wipedNodeCannotVote() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        c.cutLinks = [.init(from: 1, to: 3)]
        try c.put(1, key: 0, value: 5, seq: 1)  // committed on nodes 1 and 2 only
        #expect(c.raft(1)?.commitIndex == 3)
        #expect(c.raft(3)?.lastIndex == 2)
        c.heal()
        try c.wipe(2)
        c.crash(1)
        // Direct requests: refused, vote and pre-vote alike.
        let mark = c.delivered.count
        c.inject(Message(from: 3, to: 2, term: 9, body: .preVote(lastIndex: 2, lastTerm: 2)))
        c.inject(Message(from: 3, to: 2, term: 9, body: .vote(lastIndex: 2, lastTerm: 2, leaderTransfer: false)))
        let answers = c.delivered(since: mark).filter { $0.from == 2 }
        #expect(answers.compactMap(\.preVoteGranted) == [false])
        #expect(answers.compactMap(\.voteGranted) == [false])
        // Node 3 campaigns for a long time and never wins.
        var leaders: Set<NodeID> = []
        for _ in 0..<200 {
            c.tickAll()
            if let l = c.leader { leaders.insert(l) }
        }
        #expect(leaders.isEmpty)
        // The node holding the entry returns; it leads and the entry survives everywhere.
        try c.restart(1)
        #expect(Scenario.tickUntil(&c, limit: 300) { $0.leader != nil } != nil)
        #expect(c.leader == 1)
        c.tickAll(times: 3)
        for id: NodeID in 1...3 { #expect(c.node(id)?.machine.value(0) == 5) }
        #expect(c.violations.isEmpty)
    }
}
