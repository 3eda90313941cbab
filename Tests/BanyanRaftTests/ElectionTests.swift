import BanyanRaft
import Testing

/// Raft paper §5.1 (terms) and §5.2 (leader election), after etcd's raft_paper_test.go.
@Suite struct TermTests {
    @Test("a follower adopts a higher term from any message (R1)")
    func followerAdoptsHigherTerm() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        #expect(c.raft(2)?.term == 2)
        // A heartbeat response (a message no follower expects) from node 3 in term 5.
        c.inject(Message(from: 3, to: 2, term: 5, body: .heartbeatResponse(readSeq: 0)))
        #expect(c.raft(2)?.term == 5)
        #expect(c.raft(2)?.role == .follower)
        #expect(c.node(2)?.disk.hardState.term == 5)
        #expect(c.violations.isEmpty)
    }

    @Test("a candidate adopts a higher term from any message and steps down (R1)")
    func candidateStepsDown() throws {
        var c = try TestCluster(voters: 3) { $0.preVote = false }
        c.isolate(1)
        c.campaign(1)
        #expect(c.raft(1)?.role == .candidate)
        #expect(c.raft(1)?.term == 2)
        c.inject(Message(from: 2, to: 1, term: 5, body: .appendAccepted(index: 0)))
        #expect(c.raft(1)?.role == .follower)
        #expect(c.raft(1)?.term == 5)
        #expect(c.node(1)?.disk.hardState.term == 5)
        #expect(c.violations.isEmpty)
    }

    @Test("a leader in term 2 that receives an append reply of term 5 becomes a follower in term 5 (R1)")
    func leaderStepsDown() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        #expect(c.raft(1)?.role == .leader)
        #expect(c.raft(1)?.term == 2)
        c.inject(Message(from: 2, to: 1, term: 5, body: .appendAccepted(index: 2)))
        #expect(c.raft(1)?.role == .follower)
        #expect(c.raft(1)?.term == 5)
        #expect(c.raft(1)?.leader == 0)
        #expect(c.node(1)?.disk.hardState.term == 5)
        #expect(throws: RaftError.noLeader) { try c.put(1, key: 0, value: 1, seq: 1) }
        #expect(c.violations.isEmpty)
    }

    @Test("appends from a deposed leader's older term are ignored and all logs end identical (R2)")
    func oldMessagesIgnored() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 10, seq: 1)  // index 3, term 2, committed
        // Node 1 is cut off; it still appends a proposal of term 2 that never commits.
        c.isolate(1)
        try c.put(1, key: 0, value: 666, client: 9, seq: 1)  // index 4, term 2, uncommitted
        #expect(c.raft(1)?.lastIndex == 4)
        // Nodes 2 and 3 elect a leader of term 3 and commit.
        #expect(Scenario.tickUntil(&c) { $0.leader == 2 || $0.leader == 3 } != nil)
        let newLeader = try #require(c.leader)
        #expect(c.raft(newLeader)?.term == 3)
        try c.put(newLeader, key: 1, value: 20, seq: 2)
        let before = (c.logTerms(2), c.logTerms(3))
        // The deposed leader's stale term-2 appends, delivered late to both.
        let garbage = LogEntry(index: 4, term: 2, data: [0xEE, 4, 2])
        for to: NodeID in [2, 3] {
            c.inject(Message(from: 1, to: to, term: 2, body: .append(prevIndex: 3, prevTerm: 2, entries: [garbage], commit: 4)))
            c.inject(Message(from: 1, to: to, term: 2, body: .heartbeat(commit: 4, readSeq: 0, commitTerm: 2)))
        }
        #expect(c.logTerms(2) == before.0)
        #expect(c.logTerms(3) == before.1)
        #expect(c.raft(newLeader)?.role == .leader)
        #expect(c.raft(newLeader)?.term == 3)
        // Once healed, node 1 drops its uncommitted term-2 entry and every log is the same.
        c.heal()
        c.tickAll(times: 3)
        try c.put(newLeader, key: 2, value: 30, seq: 3)
        #expect(c.logTerms(1) == c.logTerms(2))
        #expect(c.logTerms(2) == c.logTerms(3))
        #expect(c.logTerms(1) == [1, 2, 2, 3, 3, 3])
        for id: NodeID in 1...3 {
            #expect(Scenario.values(c, id, keys: 3) == [10, 20, 30])
        }
        #expect(c.violations.isEmpty)
    }
}

@Suite struct ElectionTests {
    @Test("nodes start as followers with no leader")
    func startAsFollowers() throws {
        let c = try TestCluster(voters: 3)
        for id: NodeID in 1...3 {
            #expect(c.raft(id)?.role == .follower)
            #expect(c.raft(id)?.leader == 0)
            #expect(c.raft(id)?.term == 1)
        }
        #expect(c.leader == nil)
        #expect(c.violations.isEmpty)
    }

    @Test("a leader's heartbeat round carries no entries, one heartbeat per follower")
    func heartbeatsCarryNoEntries() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)
        let mark = c.delivered.count
        c.tick(1)
        let fromLeader = c.delivered(since: mark).filter { $0.from == 1 }
        #expect(fromLeader.count == 2)
        #expect(fromLeader.allSatisfy { $0.isHeartbeat })
        #expect(Set(fromLeader.map(\.to)) == [2, 3])
        #expect(c.violations.isEmpty)
    }

    @Test("a follower that hears nothing for an election timeout starts a new term and votes for itself")
    func followerCampaignsAfterTimeout() throws {
        var c = try TestCluster(voters: 3) { $0.preVote = false }
        c.isolate(2)
        c.tick(2, times: 9)
        #expect(c.raft(2)?.role == .follower)
        var ticks = 9
        while c.raft(2)?.role == .follower && ticks < 20 {  // the randomised timeout is below 2 × electionTicks
            c.tick(2)
            ticks += 1
        }
        #expect(c.raft(2)?.role == .candidate)
        #expect(c.raft(2)?.term == 2)
        #expect(c.raft(2)?.vote == 2)
        #expect(c.node(2)?.disk.hardState == HardState(term: 2, vote: 2, commit: 1, mayVote: true))
        #expect(c.violations.isEmpty)
    }

    @Test("one election round: a candidate wins with all votes, with a bare majority, and loses against up-to-date voters")
    func oneRoundOutcomes() throws {
        // Win with every vote.
        var all = try TestCluster(voters: 3) { $0.preVote = false }
        all.campaign(1)
        #expect(all.raft(1)?.role == .leader)
        #expect(all.raft(1)?.term == 2)
        // Win with 3 of 5.
        var majority = try TestCluster(voters: 5) { $0.preVote = false }
        majority.isolate(4)
        majority.isolate(5)
        majority.campaign(1)
        #expect(majority.raft(1)?.role == .leader)
        // No majority reachable: stays candidate.
        var pending = try TestCluster(voters: 5) { $0.preVote = false }
        pending.isolate(3)
        pending.isolate(4)
        pending.isolate(5)
        pending.campaign(1)
        #expect(pending.raft(1)?.role == .candidate)
        // Lose: both voters have a longer log and refuse; the candidate returns to follower.
        var lose = try Scenario.cluster(logs: [[1], [1, 1], [1, 1]], terms: [1, 1, 1]) { $0.preVote = false }
        lose.campaign(1)
        #expect(lose.raft(1)?.role == .follower)
        #expect(lose.raft(1)?.term == 2)
        #expect(lose.leader == nil)
        #expect(all.violations.isEmpty && majority.violations.isEmpty && pending.violations.isEmpty && lose.violations.isEmpty)
    }

    @Test("a split vote elects nobody and a later round resolves it")
    func splitVote() throws {
        var c = try TestCluster(voters: 4) { $0.preVote = false }
        c.partition([[1, 2], [3, 4]])
        c.campaign(1)
        c.campaign(3)
        #expect(c.raft(1)?.role == .candidate)
        #expect(c.raft(3)?.role == .candidate)
        #expect(c.raft(1)?.term == 2 && c.raft(3)?.term == 2)
        #expect(c.leader == nil)
        c.heal()
        #expect(Scenario.tickUntil(&c, limit: 200) { $0.leader != nil } != nil)
        let leader = try #require(c.leader)
        #expect(try #require(c.raft(leader)?.term) >= 3)
        #expect(c.nodes.values.filter { $0.raft.role == .leader }.count == 1)
        #expect(c.violations.isEmpty)
    }

    @Test("one vote per term, first come first served; a repeated request from the same candidate is granted again (R3)")
    func oneVotePerTerm() throws {
        var c = try TestCluster(voters: 3) { $0.preVote = false }
        let mark = c.delivered.count
        c.inject(Message(from: 2, to: 1, term: 2, body: .vote(lastIndex: 1, lastTerm: 1, leaderTransfer: false)))
        c.inject(Message(from: 3, to: 1, term: 2, body: .vote(lastIndex: 1, lastTerm: 1, leaderTransfer: false)))
        c.inject(Message(from: 2, to: 1, term: 2, body: .vote(lastIndex: 1, lastTerm: 1, leaderTransfer: false)))
        let answers = c.delivered(since: mark).filter { $0.from == 1 && $0.voteGranted != nil }
        #expect(answers.map(\.to) == [2, 3, 2])
        #expect(answers.map(\.voteGranted) == [true, false, true])
        #expect(c.raft(1)?.vote == 2)
        #expect(c.violations.isEmpty)
    }

    @Test("a granted vote is durable before the reply: after a crash and restart a second candidate of the same term is refused (R3)")
    func voteSurvivesRestart() throws {
        var c = try TestCluster(voters: 3) { $0.preVote = false }
        c.inject(Message(from: 2, to: 1, term: 2, body: .vote(lastIndex: 1, lastTerm: 1, leaderTransfer: false)))
        #expect(c.node(1)?.disk.hardState == HardState(term: 2, vote: 2, commit: 1, mayVote: true))
        c.crash(1)
        try c.restart(1)
        #expect(c.raft(1)?.vote == 2)
        let mark = c.delivered.count
        c.inject(Message(from: 3, to: 1, term: 2, body: .vote(lastIndex: 1, lastTerm: 1, leaderTransfer: false)))
        let answers = c.delivered(since: mark).filter { $0.from == 1 && $0.voteGranted != nil }
        #expect(answers.map(\.voteGranted) == [false])
        #expect(c.violations.isEmpty)
    }

    @Test("a node that crashes before its vote is durable sends no grant, so after restart it may still vote once in that term (R3)")
    func crashBeforeVoteIsDurable() throws {
        var c = try TestCluster(voters: 3) { $0.preVote = false }
        let out = try c.withNode(1) { (n: inout SimNode) throws(RaftError) -> SimNode.Output in
            n.step(Message(from: 2, to: 1, term: 2, body: .vote(lastIndex: 1, lastTerm: 1, leaderTransfer: false)))
            return n.process(persistBudget: 0)
        }
        #expect(out?.crashed == true)
        #expect(out?.messages.isEmpty == true)
        c.crash(1)
        try c.restart(1)
        // The vote never reached the disk (read back after the power loss: a crashed machine's
        // disk reads nothing).
        #expect(c.node(1)?.disk.hardState.vote == 0)
        let mark = c.delivered.count
        c.inject(Message(from: 3, to: 1, term: 2, body: .vote(lastIndex: 1, lastTerm: 1, leaderTransfer: false)))
        c.inject(Message(from: 2, to: 1, term: 2, body: .vote(lastIndex: 1, lastTerm: 1, leaderTransfer: false)))
        let answers = c.delivered(since: mark).filter { $0.from == 1 && $0.voteGranted != nil }
        #expect(answers.map(\.voteGranted) == [true, false])
        #expect(c.node(1)?.disk.hardState.vote == 3)
        #expect(c.violations.isEmpty)
    }

    @Test("a candidate that hears an append or heartbeat from a leader of its term steps down to follower")
    func candidateFallsBack() throws {
        for heartbeat in [false, true] {
            var c = try TestCluster(voters: 3) { $0.preVote = false }
            c.isolate(1)
            c.campaign(1)
            #expect(c.raft(1)?.role == .candidate)
            let body: Message.Body = heartbeat
                ? .heartbeat(commit: 1, readSeq: 0)
                : .append(prevIndex: 1, prevTerm: 1, entries: [], commit: 1)
            c.inject(Message(from: 2, to: 1, term: 2, body: body))
            #expect(c.raft(1)?.role == .follower)
            #expect(c.raft(1)?.term == 2)
            #expect(c.raft(1)?.leader == 2)
            #expect(c.violations.isEmpty)
        }
    }

    @Test("election timeouts are randomised in [electionTicks, 2 × electionTicks) and spread across seeds")
    func timeoutsRandomised() throws {
        var seen: Set<Int> = []
        for seed: UInt64 in 0..<60 {
            var c = try TestCluster(voters: 3) { $0.preVote = false; $0.seed = seed &* 7 &+ $0.id }
            c.isolate(1)
            var ticks = 0
            while c.raft(1)?.role == .follower && ticks < 100 {
                c.tick(1)
                ticks += 1
            }
            #expect((10..<20).contains(ticks), "seed \(seed): campaigned after \(ticks) ticks")
            seen.insert(ticks)
            #expect(c.violations.isEmpty)
        }
        #expect(seen.count >= 6)
    }

    @Test("five nodes started together converge on one leader for every seed, mostly in the first term (R5)")
    func electionsConverge() throws {
        var firstTerm = 0
        let seeds: Range<UInt64> = 0..<300
        for seed in seeds {
            var c = try TestCluster(voters: 5) { $0.seed = seed &* 1_000_003 &+ $0.id }
            let rounds = Scenario.tickUntil(&c, limit: 100) { $0.leader != nil }
            #expect(rounds != nil, "seed \(seed): no leader after 100 ticks")
            guard let leader = c.leader else { continue }
            #expect(c.nodes.values.filter { $0.raft.role == .leader }.count == 1)
            // Everyone follows the same leader after one more heartbeat.
            c.tickAll()
            for id: NodeID in 1...5 { #expect(c.raft(id)?.leader == leader, "seed \(seed)") }
            if c.raft(leader)?.term == 2 { firstTerm += 1 }
            #expect(c.violations.isEmpty)
        }
        #expect(firstTerm * 10 >= seeds.count * 9, "only \(firstTerm) of \(seeds.count) elections ended in the first term")
    }
}
