import BanyanRaft
import BanyanStateMachine
import Testing

/// Raft paper §5.3 (log replication), after etcd's raft_paper_test.go and raft_test.go.
@Suite struct ReplicationTests {
    @Test("the leader appends a proposal to its own log and replicates it with the previous index and term")
    func replicatesWithPrev() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        let mark = c.delivered.count
        try c.put(1, key: 0, value: 5, seq: 1)
        #expect(c.raft(1)?.entry(at: 3)?.term == 2)
        #expect(c.raft(1)?.entry(at: 3)?.kind == .command)
        let carrying = c.delivered(since: mark).filter { $0.from == 1 && $0.appendEntries.contains { $0.index == 3 } }
        #expect(Set(carrying.map(\.to)) == [2, 3])
        for m in carrying {
            guard case let .append(prevIndex, prevTerm, entries, _) = m.body else { continue }
            #expect(prevIndex == 2)
            #expect(prevTerm == 2)
            #expect(entries.map(\.index) == [3])
        }
        #expect(c.violations.isEmpty)
    }

    @Test("an entry commits once a majority holds it, and not before")
    func commitOnMajority() throws {
        var c = try TestCluster(voters: 5)
        c.campaign(1)
        #expect(c.raft(1)?.commitIndex == 2)
        // Only node 2 reachable: 2 of 5 is not a majority.
        for id: NodeID in 3...5 { c.isolate(id) }
        try c.put(1, key: 0, value: 1, seq: 1)
        #expect(c.raft(1)?.lastIndex == 3)
        #expect(c.raft(2)?.lastIndex == 3)
        #expect(c.raft(1)?.commitIndex == 2)
        #expect(c.node(1)?.machine.value(0) == nil)
        // Node 3 comes back: 3 of 5 hold index 3.
        c.cutLinks = c.cutLinks.filter { $0.from != 3 && $0.to != 3 }
        c.tick(1)
        #expect(c.raft(1)?.commitIndex == 3)
        #expect(c.node(1)?.machine.value(0) == 1)
        #expect(c.raft(4)?.lastIndex == 2)
        #expect(c.violations.isEmpty)
    }

    @Test("committing the new leader's no-op commits every preceding entry, older terms included (R9)")
    func commitsPrecedingEntries() throws {
        var c = try Scenario.cluster(logs: [[1, 2, 2], [1], [1]], terms: [2, 2, 2])
        c.campaign(1)
        #expect(c.raft(1)?.role == .leader)
        #expect(c.raft(1)?.term == 3)
        for id: NodeID in 1...3 {
            #expect(c.raft(id)?.commitIndex == 4)
            #expect(c.applied[id]?.map(\.index) == [1, 2, 3, 4])
            #expect(c.applied[id]?.map(\.term) == [1, 2, 2, 3])
        }
        #expect(c.violations.isEmpty)
    }

    @Test("followers apply committed entries exactly once, in log order")
    func followersApplyInOrder() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        for i in 0..<5 { try c.put(1, key: i, value: Int64(100 + i), seq: UInt32(i + 1)) }
        c.tickAll(times: 2)
        for id: NodeID in 1...3 {
            #expect(c.applied[id]?.map(\.index) == Array(1...7))
            #expect(c.outcomes[id]?.map(\.index) == Array(3...7))
            #expect(Scenario.values(c, id, keys: 5) == [100, 101, 102, 103, 104])
        }
        #expect(c.violations.isEmpty)
    }

    @Test("a follower rejects an append whose previous index and term it does not hold, and accepts a matching one")
    func followerChecksPrev() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)  // logs: 1:t1 2:t2 3:t2, committed
        c.hold { $0.from == 2 && $0.to == 1 }
        c.inject(Message(from: 1, to: 2, term: 2, body: .append(prevIndex: 3, prevTerm: 3, entries: [], commit: 3)))
        c.inject(Message(from: 1, to: 2, term: 2, body: .append(prevIndex: 4, prevTerm: 2, entries: [], commit: 3)))
        c.inject(Message(from: 1, to: 2, term: 2, body: .append(prevIndex: 3, prevTerm: 2, entries: [], commit: 3)))
        let answers = c.held.map(\.body)
        #expect(answers.count == 3)
        if answers.count == 3 {
            guard case .appendRejected(let r0, _, _) = answers[0], case .appendRejected(let r1, _, _) = answers[1] else {
                Issue.record("expected two rejections, got \(answers)")
                return
            }
            #expect(r0 == 3)
            #expect(r1 == 4)
            #expect(answers[2] == .appendAccepted(index: 3))
        }
        #expect(c.logTerms(2) == [1, 2, 2])
        c.hold(where: nil)
        c.release()
        #expect(c.violations.isEmpty)
    }

    @Test("a follower truncates a conflicting uncommitted suffix and appends the leader's entries, never touching committed ones (R7)")
    func followerTruncatesConflicts() throws {
        // Node 1 holds uncommitted term-2 entries at 5…8; commit is 4 everywhere.
        var c = try Scenario.cluster(
            logs: [[1, 2, 2, 2, 2, 2, 2, 2], [1, 2, 2, 2], [1, 2, 2, 2]], terms: [2, 2, 2], commit: 4
        )
        c.isolate(1)  // only the injected messages reach it
        let new5 = LogEntry(index: 5, term: 3, data: [0xEE, 5, 3])
        let new6 = LogEntry(index: 6, term: 3, data: [0xEE, 6, 3])
        c.inject(Message(from: 2, to: 1, term: 3, body: .append(prevIndex: 4, prevTerm: 2, entries: [new5, new6], commit: 4)))
        #expect(c.logTerms(1) == [1, 2, 2, 2, 3, 3])
        #expect(c.node(1)?.disk.entries.map(\.term) == [1, 2, 2, 2, 3, 3])
        #expect(c.raft(1)?.term == 3)
        // A leader append that starts below the commit index and contradicts it changes nothing
        // there (committed entries are never truncated).
        let bad3 = LogEntry(index: 3, term: 3, data: [0xEE, 3, 3])
        let bad4 = LogEntry(index: 4, term: 3, data: [0xEE, 4, 3])
        c.inject(Message(from: 2, to: 1, term: 3, body: .append(prevIndex: 2, prevTerm: 2, entries: [bad3, bad4], commit: 4)))
        #expect(c.logTerms(1) == [1, 2, 2, 2, 3, 3])
        #expect(c.raft(1)?.commitIndex == 4)
        #expect(c.applied[1]?.map(\.term) == [1, 2, 2, 2])
        #expect(c.violations.isEmpty)
    }

    /// The follower logs (a)–(f) of the Raft paper's Figure 7, for a leader of term 8 whose log
    /// is `1 1 1 4 4 5 5 6 6 6`.
    static let figure7: [(name: String, log: [UInt64], term: UInt64)] = [
        ("a", [1, 1, 1, 4, 4, 5, 5, 6, 6], 6),
        ("b", [1, 1, 1, 4], 4),
        ("c", [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6], 6),
        ("d", [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7], 7),
        ("e", [1, 1, 1, 4, 4, 4, 4], 4),
        ("f", [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3], 3),
    ]

    @Test("a leader of term 8 repairs every follower log shape of Figure 7", arguments: figure7.map(\.name))
    func figure7Repair(shape: String) throws {
        let leaderLog: [UInt64] = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
        let f = try #require(Self.figure7.first { $0.name == shape })
        var c = try Scenario.cluster(logs: [leaderLog, f.log, leaderLog], terms: [7, f.term, 7])
        c.campaign(1)
        #expect(c.raft(1)?.role == .leader)
        #expect(c.raft(1)?.term == 8)
        try c.put(1, key: 0, value: 8, seq: 1)
        let expected = leaderLog + [8, 8]
        #expect(c.logTerms(1) == expected)
        #expect(c.logTerms(2) == expected, "shape \(shape)")
        #expect(c.node(2)?.disk.entries.map(\.term) == expected, "shape \(shape)")
        #expect(c.raft(2)?.commitIndex == 12)
        #expect(c.node(2)?.machine.value(0) == 8)
        #expect(c.violations.isEmpty)
    }

    @Test(
        "fast backtracking converges in one rejection without skipping a conflict (R12)",
        arguments: [
            // (leader log, follower log)
            ([1, 2, 2, 4, 4, 4, 4], [1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3]),
            ([1, 3, 3, 3, 5, 5, 5, 5, 5], [1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2]),
            ([1, 1, 1, 1, 4, 4, 4, 4], [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3]),
        ] as [([UInt64], [UInt64])]
    )
    func fastBacktracking(leaderLog: [UInt64], followerLog: [UInt64]) throws {
        let leaderTerm = try #require(leaderLog.last)
        var c = try Scenario.cluster(
            logs: [leaderLog, followerLog, leaderLog], terms: [leaderTerm, try #require(followerLog.last), leaderTerm]
        )
        let mark = c.delivered.count
        c.campaign(1)
        #expect(c.raft(1)?.term == leaderTerm + 1)
        let rejections = c.delivered(since: mark).filter { $0.from == 2 && $0.isAppendRejected }
        #expect(rejections.count == 1, "\(rejections)")
        #expect(c.logTerms(2) == leaderLog + [leaderTerm + 1])
        #expect(c.raft(2)?.commitIndex == UInt64(leaderLog.count + 1))
        #expect(c.violations.isEmpty)
    }

    @Test("appends delivered in reverse order, duplicated and long after the fact leave the follower equal to the leader (R11)")
    func reorderedAppends() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        c.hold { $0.from == 1 && $0.to == 2 && $0.isAppend }
        for i in 0..<3 { try c.put(1, key: i, value: Int64(i + 1), seq: UInt32(i + 1)) }
        let stale = c.held
        #expect(stale.filter { !$0.appendEntries.isEmpty }.count == 3)
        #expect(c.raft(1)?.commitIndex == 5)  // node 3 acknowledged
        #expect(c.raft(2)?.lastIndex == 2)
        c.hold(where: nil)
        c.release { $0.reversed() }
        #expect(c.logTerms(2) == c.logTerms(1))
        // Duplicates and old messages, delivered again after the follower caught up.
        for m in stale + stale.reversed() { c.inject(m) }
        c.tick(1)
        #expect(c.logTerms(2) == [1, 2, 2, 2, 2])
        #expect(c.raft(2)?.commitIndex == 5)
        #expect(Scenario.values(c, 2, keys: 3) == [1, 2, 3])
        #expect(c.applied[2]?.map(\.index) == [1, 2, 3, 4, 5])
        #expect(c.violations.isEmpty)
    }
}
