import BanyanRaft
import BanyanStateMachine
import Testing

/// Raft paper §5.4 (safety): the election restriction and the commit rule.
@Suite struct SafetyTests {
    @Test("vote and pre-vote requests carry the candidate's last log index and term")
    func voteRequestsCarryLastEntry() throws {
        for preVote in [false, true] {
            var c = try TestCluster(voters: 3) { $0.preVote = preVote }
            c.campaign(1)
            try c.put(1, key: 0, value: 1, seq: 1)
            try c.put(1, key: 1, value: 2, seq: 2)  // logs end at index 4, term 2
            c.isolate(1)
            let mark = c.delivered.count
            #expect(Scenario.tickUntil(&c) { $0.leader == 2 || $0.leader == 3 } != nil)
            let winner = try #require(c.leader)
            let requests = c.delivered(since: mark).filter { $0.from == winner && ($0.isVote || $0.isPreVote) }
            #expect(!requests.isEmpty)
            for m in requests {
                switch m.body {
                case let .vote(lastIndex, lastTerm, transfer, _):
                    #expect(lastIndex == 4 && lastTerm == 2 && !transfer)
                    #expect(m.term == 3)
                case let .preVote(lastIndex, lastTerm, _):
                    #expect(lastIndex == 4 && lastTerm == 2)
                    #expect(m.term == 3)
                default: break
                }
            }
            #expect(requests.contains { $0.isVote })
            #expect(requests.contains { $0.isPreVote } == preVote)
            #expect(c.violations.isEmpty)
        }
    }

    /// (voter log, candidate last index, candidate last term, granted)
    static let voterCases: [([UInt64], UInt64, UInt64, Bool)] = [
        ([1, 1], 2, 1, true),  // same term, same length
        ([1, 1], 3, 1, true),  // same term, longer
        ([1, 1], 1, 1, false),  // same term, shorter
        ([1, 1], 1, 2, true),  // higher last term wins though shorter
        ([1, 2], 5, 1, false),  // lower last term loses though longer (term first)
        ([1, 2], 2, 2, true),
        ([1, 2], 1, 2, false),
        ([1, 2, 2], 2, 3, true),
    ]

    @Test("a voter refuses a candidate whose log is less up to date, comparing last term before index (R6)", arguments: voterCases)
    func voterRestriction(voterLog: [UInt64], lastIndex: UInt64, lastTerm: UInt64, granted: Bool) throws {
        for preVote in [false, true] {
            var c = try Scenario.cluster(logs: [voterLog, [1], [1]], terms: [3, 3, 3])
            c.hold { $0.from == 1 }  // answers are recorded in `held`, not delivered
            let body: Message.Body = preVote
                ? .preVote(lastIndex: lastIndex, lastTerm: lastTerm)
                : .vote(lastIndex: lastIndex, lastTerm: lastTerm, leaderTransfer: false)
            c.inject(Message(from: 2, to: 1, term: 4, body: body))
            let answers = c.held.compactMap { preVote ? $0.preVoteGranted : $0.voteGranted }
            #expect(answers == [granted], "log \(voterLog) candidate (\(lastIndex), \(lastTerm)) preVote \(preVote)")
            #expect(c.raft(1)?.vote == (granted && !preVote ? 2 : 0))
            #expect(c.violations.isEmpty)
        }
    }

    @Test("with an entry committed on 3 of 5 and two of those down, a node missing it cannot win; every leader holds it (R6)")
    func onlyUpToDateNodesLead() throws {
        // Without check-quorum there is no lease: voters answer at once, so only the election
        // restriction keeps node 4 out.
        var c = try TestCluster(voters: 5) { $0.checkQuorum = false }
        c.campaign(1)
        c.cutLinks = [.init(from: 1, to: 4), .init(from: 1, to: 5)]
        try c.put(1, key: 0, value: 77, seq: 1)
        #expect(c.raft(1)?.commitIndex == 3)
        #expect(c.raft(4)?.lastIndex == 2 && c.raft(5)?.lastIndex == 2)
        c.crash(1)
        c.crash(2)
        c.heal()
        c.campaign(4)  // node 3 refuses, node 5 alone is no majority
        #expect(c.raft(4)?.role != .leader)
        #expect(c.raft(4)?.role != .candidate)  // the pre-vote already failed
        var leaders: [NodeID] = []
        var leadersLackingEntry: [NodeID] = []
        for _ in 0..<300 {
            c.tickAll()
            guard let l = c.leader else { continue }
            if leaders.last != l { leaders.append(l) }
            if c.raft(l)?.term(at: 3) != 2 { leadersLackingEntry.append(l) }
        }
        #expect(leaders.first == 3)
        #expect(leadersLackingEntry.isEmpty)
        for id: NodeID in 3...5 { #expect(c.node(id)?.machine.value(0) == 77) }
        #expect(c.violations.isEmpty)
    }

    @Test("a response built in an older term is not sent after the follower overwrote the entry it acknowledges (ABA race, R13)")
    func staleAckDropped() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        c.drop { $0.from == 1 && $0.isAppend }
        try c.put(1, key: 0, value: 1, seq: 1)  // index 3, term 2, only on node 1
        c.drop(where: nil)
        let old3 = try #require(c.raft(1)?.entry(at: 3))
        let new3 = LogEntry(index: 3, term: 3, data: [0xEE, 3, 3])
        // Node 2 accepts (3, term 2) and, before its driver runs, a term-3 leader overwrites it.
        _ = try c.withNode(2) { (n: inout SimNode) throws(RaftError) in
            n.step(Message(from: 1, to: 2, term: 2, body: .append(prevIndex: 2, prevTerm: 2, entries: [old3], commit: 2)))
            n.step(Message(from: 3, to: 2, term: 3, body: .append(prevIndex: 2, prevTerm: 2, entries: [new3], commit: 2)))
        }
        let mark = c.delivered.count
        c.stabilize()
        #expect(!c.delivered(since: mark).contains { $0.from == 2 && $0.to == 1 && $0.body == .appendAccepted(index: 3) })
        #expect(c.logTerms(2) == [1, 2, 3])
        #expect(c.raft(1)?.commitIndex == 2)  // the term-2 entry was never acknowledged by node 2
        #expect(c.node(1)?.machine.value(0) == nil)
        #expect(c.violations.isEmpty)
    }

    /// Figure 8, state (c): S1 is leader of term 4 and has its term-2 entry (index 2) on S1, S3
    /// and S4 — a majority of five — but its own term-4 entry nowhere else yet.
    static func figure8() throws -> TestCluster {
        var c = try Scenario.cluster(
            logs: [[1, 2], [1, 2], [1], [1], [1, 3]], terms: [3, 2, 3, 3, 3], votes: [0, 0, 5, 5, 5]
        ) { $0.maxMessageBytes = 1 }  // one entry per append, as in the paper's figure
        c.hold { $0.from == 1 && $0.isAppend }
        c.campaign(1)
        #expect(c.raft(1)?.role == .leader)
        #expect(c.raft(1)?.term == 4)
        #expect(c.logTerms(1) == [1, 2, 4])
        // S3 and S4 reject the first probe, then accept index 2 alone.
        c.release { $0.filter { [3, 4].contains($0.to) } }
        #expect(c.held.count == 2)
        #expect(c.held.allSatisfy { $0.appendEntries.map(\.index) == [2] })
        c.release { $0.filter { [3, 4].contains($0.to) } }
        #expect(c.logTerms(3) == [1, 2])
        #expect(c.logTerms(4) == [1, 2])
        return c
    }

    @Test("a leader does not commit an older-term entry that a majority holds until an entry of its own term does (Figure 8, R8)")
    func figure8NoCommitByCounting() throws {
        var c = try Self.figure8()
        let replication = try #require(c.raft(1)?.replicationStatus)
        #expect(replication.filter { $0.match >= 2 }.map(\.node) == [1, 3, 4])
        #expect(c.raft(1)?.commitIndex == 1)
        for id: NodeID in 1...5 { #expect(c.raft(id)?.commitIndex == 1) }
        // The held term-4 no-op reaches S3 and S4: now index 3 and, with it, index 2 commit.
        c.hold(where: nil)
        c.release { $0.filter { [3, 4].contains($0.to) } }
        #expect(c.raft(1)?.commitIndex == 3)
        c.tickAll(times: 2)
        for id: NodeID in 1...5 {
            #expect(c.logTerms(id) == [1, 2, 4])
            #expect(c.applied[id]?.map(\.term) == [1, 2, 4])
        }
        #expect(c.violations.isEmpty)
    }

    @Test("the uncounted older-term entry may be overwritten by the next leader, which is why it must not commit (Figure 8 d)")
    func figure8Overwrite() throws {
        var c = try Self.figure8()
        c.hold(where: nil)
        c.crash(1)
        c.crash(2)
        // S5 (last term 3) is more up to date than S3 and S4 (last term 2), which cannot win
        // without S5's vote: S5 is elected and overwrites index 2 on them.
        #expect(Scenario.tickUntil(&c, limit: 300) { $0.leader != nil } != nil)
        #expect(c.leader == 5)
        for id: NodeID in 3...5 { #expect(c.logTerms(id) == [1, 3, 5]) }
        #expect(c.violations.isEmpty)
    }
}

/// Peer input the core must survive: malformed appends are dropped, never trusted.
@Suite struct MalformedMessageTests {
    @Test("appends with gaps in their indexes or entries newer than the message's term are dropped without changing the log")
    func malformedAppendsDropped() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)
        let before = c.logTerms(2)
        let term = try #require(c.raft(2)?.term)
        let last = try #require(c.raft(2)?.lastIndex)
        let gap = [LogEntry(index: last + 1, term: term), LogEntry(index: last + 5, term: term)]
        c.inject(Message(from: 1, to: 2, term: term, body: .append(prevIndex: last, prevTerm: term, entries: gap, commit: last)))
        let future = [LogEntry(index: last + 1, term: term + 7)]
        c.inject(Message(from: 1, to: 2, term: term, body: .append(prevIndex: last, prevTerm: term, entries: future, commit: last)))
        let wrongStart = [LogEntry(index: 1, term: term)]
        c.inject(Message(from: 1, to: 2, term: term, body: .append(prevIndex: last, prevTerm: term, entries: wrongStart, commit: last)))
        #expect(c.logTerms(2) == before)
        #expect(c.raft(2)?.invalidMessages == 3)
        try c.put(1, key: 0, value: 2, seq: 2)
        #expect(c.node(2)?.machine.value(0) == 2)
        #expect(c.violations.isEmpty)
    }
}
