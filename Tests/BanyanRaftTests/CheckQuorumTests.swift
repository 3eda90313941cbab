import BanyanRaft
import BanyanStateMachine
import Testing

/// Pre-vote and check-quorum (R15, R16), after etcd's checkquorum.txt, prevote*.txt and
/// TestNodeWithSmallerTermCanCompleteElection.
@Suite struct CheckQuorumTests {
    @Test("an isolated leader steps down within two election timeouts, then refuses writes and reads (R15)")
    func isolatedLeaderStepsDown() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)
        c.isolate(1)
        var ticks = 0
        while c.raft(1)?.role == .leader && ticks < 100 {
            c.tick(1)
            ticks += 1
        }
        #expect(c.raft(1)?.role == .follower)
        #expect(ticks <= 20, "stepped down after \(ticks) ticks")
        #expect(ticks >= 10)
        #expect(c.raft(1)?.term == 2)  // stepping down does not bump the term
        #expect(throws: RaftError.noLeader) { try c.put(1, key: 0, value: 2, seq: 2) }
        let started = c.readIndex(1, context: 1)
        #expect(!started)
        // Still isolated and campaigning (pre-vote only): it keeps refusing.
        c.tick(1, times: 50)
        #expect(c.raft(1)?.role != .leader)
        #expect(c.raft(1)?.term == 2)
        #expect(throws: RaftError.noLeader) { try c.put(1, key: 0, value: 3, seq: 3) }
        #expect(c.raft(1)?.lastIndex == 3)
        #expect(c.reads[1, default: []].isEmpty)
        #expect(c.violations.isEmpty)
    }

    @Test("a follower partitioned for ten election timeouts rejoins without bumping anyone's term (R16 a)")
    func rejoiningFollowerDoesNotDisrupt() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 5, seq: 1)
        // Nothing is written meanwhile, so node 3's log stays as up to date as the others':
        // only pre-vote and the followers' lease keep it from winning on its return.
        c.isolate(3)
        c.tickAll(times: 100)
        #expect(c.raft(3)?.term == 2)
        #expect(c.raft(3)?.role == .preCandidate || c.raft(3)?.role == .follower)
        c.heal()
        c.campaign(3)  // its timer fires before the leader's next heartbeat reaches it
        #expect(c.raft(3)?.role == .preCandidate)
        c.tickAll(times: 30)
        #expect(c.leader == 1)
        try c.put(1, key: 1, value: 6, seq: 2)
        for id: NodeID in 1...3 {
            #expect(c.raft(id)?.term == 2)
            #expect(Scenario.values(c, id, keys: 2) == [5, 6])
        }
        #expect(c.violations.isEmpty)
    }

    @Test("without pre-vote the same rejoining follower does bump the term (the disruption pre-vote prevents)")
    func withoutPreVoteTheFollowerDisrupts() throws {
        var c = try TestCluster(voters: 3) { $0.preVote = false }
        c.campaign(1)
        c.isolate(3)
        c.tickAll(times: 100)
        #expect(try #require(c.raft(3)?.term) > 5)
        c.heal()
        c.tickAll(times: 30)
        #expect(try #require(c.raft(1)?.term) > 2)
        #expect(c.leader != nil)
        #expect(c.violations.isEmpty)
    }

    @Test("a node with a smaller term rejoining just as the leader dies does not block the election (R16 b, etcd #8243)")
    func smallerTermCanCompleteElection() throws {
        var c = try TestCluster(voters: 3)
        c.isolate(3)
        c.campaign(1)
        #expect(c.leader == 1)
        try c.transfer(1, to: 2)
        #expect(c.leader == 2)
        #expect(c.raft(1)?.term == 3 && c.raft(2)?.term == 3)
        #expect(c.raft(3)?.term == 1)
        // Network recovers, and at once the leader dies.
        c.heal()
        c.crash(2)
        #expect(Scenario.tickUntil(&c, limit: 200) { $0.leader != nil } != nil)
        #expect(c.leader == 1)  // node 3's log lacks the term-2 and term-3 entries
        #expect(try #require(c.raft(1)?.term) >= 4)
        #expect(c.raft(3)?.term == c.raft(1)?.term)
        try c.put(1, key: 0, value: 9, seq: 1)
        #expect(c.node(3)?.machine.value(0) == 9)
        #expect(c.violations.isEmpty)
    }

    @Test(
        "with links A–B and B–C up but A–C down the cluster keeps a leader that commits (R16 d)",
        arguments: [1, 2, 3] as [NodeID]
    )
    func partialPartition(initialLeader: NodeID) throws {
        var c = try TestCluster(voters: 3)
        c.campaign(initialLeader)
        c.cutLinks = [.init(from: 1, to: 3), .init(from: 3, to: 1)]
        var leaderless = 0
        var longestLeaderless = 0
        for _ in 0..<400 {
            c.tickAll()
            if c.leader == nil {
                leaderless += 1
                longestLeaderless = max(longestLeaderless, leaderless)
            } else {
                leaderless = 0
            }
        }
        #expect(longestLeaderless <= 60, "leaderless for \(longestLeaderless) ticks in a row")
        let leader = try #require(c.leader)
        try c.put(leader, key: 0, value: 42, seq: 1)
        #expect(c.raft(leader)?.commitIndex == c.raft(leader)?.lastIndex)
        #expect(c.node(2)?.machine.value(0) == 42)
        #expect(c.violations.isEmpty)
    }
}
