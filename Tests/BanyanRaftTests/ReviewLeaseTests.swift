import BanyanRaft
import BanyanStateMachine
import Testing

/// Regression from the second review: a lease-holding follower moved to a newer term by a delayed
/// pre-vote rejection must still refuse to elect anyone inside the lease.
@Suite struct ReviewLeaseTests {
    static func isPreVote(_ m: Message) -> Bool { if case .preVote = m.body { return true } else { return false } }
    static func isVote(_ m: Message) -> Bool { if case .vote = m.body { return true } else { return false } }
    static func isPreVoteReject(_ m: Message) -> Bool {
        if case .preVoteResponse(false) = m.body { return true } else { return false }
    }

    /// A follower that acknowledged the leader's heartbeat (part of the lease quorum) is moved to
    /// a higher term with leader 0 by a late pre-vote rejection, then votes at once.
    @Test("a follower counted in a lease refuses votes for the whole lease even after a delayed pre-vote rejection moves it to a new term (R18)") func leaseFollowerResetByPreVoteRejection() throws {
        var c = try TestCluster(voters: 3) { $0.readMode = .leaseBased }
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)
        c.tickAll()
        // Leader 1's messages to 2 and 3 are lost; 2 <-> 3 traffic is held.
        c.cutLinks.insert(.init(from: 1, to: 2))
        c.cutLinks.insert(.init(from: 1, to: 3))
        c.hold { ($0.from == 2 && $0.to == 3) || ($0.from == 3 && $0.to == 2) }
        var n = 0
        while !(c.raft(2)?.role == .preCandidate && c.raft(3)?.role == .preCandidate) && n < 40 {
            c.tickAll()
            n += 1
        }
        print("REVIEW after \(n) ticks: roles \(String(describing: c.raft(1)?.role)) \(String(describing: c.raft(2)?.role)) \(String(describing: c.raft(3)?.role))")
        try #require(c.raft(1)?.role == .leader)
        try #require(c.raft(2)?.role == .preCandidate && c.raft(3)?.role == .preCandidate)
        let saved = c.held
        let xPre = try #require(saved.last { $0.from == 3 && $0.to == 2 && Self.isPreVote($0) })
        let fPre = try #require(saved.last { $0.from == 2 && $0.to == 3 && Self.isPreVote($0) })
        c.release { _ in [] }  // discard
        c.inject(xPre)  // 2 (not in any lease) grants 3's pre-vote
        c.release()  // 3 becomes candidate in term 3; its vote request to 2 is held
        #expect(c.raft(3)?.role == .candidate)
        c.inject(fPre)  // 2's late pre-vote reaches 3 (term 3): rejected with term 3, held
        let rejection = try #require(c.held.first { $0.from == 3 && $0.to == 2 && Self.isPreVoteReject($0) })
        let vote = try #require(c.held.first { $0.from == 3 && $0.to == 2 && Self.isVote($0) })
        c.release { _ in [] }
        // 1 reaches 2 again for one tick: 2 acknowledges a heartbeat, 1 holds a lease.
        c.cutLinks.remove(.init(from: 1, to: 2))
        c.tickAll()
        #expect(c.raft(1)?.role == .leader)
        #expect(c.raft(2)?.leader == 1)
        c.isolate(1)
        c.hold(where: nil)
        c.inject(rejection)  // 2 -> term 3, leader 0, inside 1's lease
        c.inject(vote)  // 2 votes for 3
        // 2 is inside 1's lease: it refuses, so 3 is not elected yet.
        #expect(c.raft(3)?.role != .leader)
        // Once the lease has run out a leader is elected among 2 and 3 and commits a write.
        #expect(Scenario.tickUntil(&c, limit: 200) { $0.raft(2)?.role == .leader || $0.raft(3)?.role == .leader } != nil)
        let newLeader: NodeID = c.raft(2)?.role == .leader ? 2 : 3
        try c.put(newLeader, key: 0, value: 2, client: 2, seq: 1)
        #expect(c.node(newLeader)?.machine.value(0) == 2)
        c.readIndex(1, context: 42)
        let r = c.reads[1, default: []].first { $0.context == 42 }
        #expect(r == nil, "old leader 1 served lease read at index \(r?.index ?? 0) (value \(String(describing: c.node(1)?.machine.value(0)))) after value 2 was committed")
        #expect(c.violations.isEmpty)
    }
}
