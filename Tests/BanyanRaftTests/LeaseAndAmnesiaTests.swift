import BanyanRaft
import BanyanStateMachine
import Testing

/// Regressions from the review of issue 4: lease reads that outlived the lease, and a wiped
/// voter that kept its id.
@Suite struct LeaseAndAmnesiaTests {
    /// Lease reads with identical tick rates on every node: the old leader keeps its lease for up
    /// to two election timeouts after losing contact, while the others elect a new leader after
    /// one timeout (plus randomisation).
    @Test("a cut-off leader stops serving lease reads before the others can elect a new leader (R18)")
    func leaseReadStale() throws {
        var c = try TestCluster(voters: 3) { $0.readMode = .leaseBased }
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)
        c.tickAll()  // one heartbeat round: 2 and 3 are recently active
        c.isolate(1)
        var rounds = 0
        while !(c.raft(2)?.role == .leader || c.raft(3)?.role == .leader) && rounds < 40 {
            c.tickAll()
            rounds += 1
        }
        let newLeader: NodeID = c.raft(2)?.role == .leader ? 2 : 3
        try c.put(newLeader, key: 0, value: 2, seq: 2)
        #expect(c.node(newLeader)?.machine.value(0) == 2)  // write completed
        // The read starts after the write completed.
        c.readIndex(1, context: 42)
        let r = c.reads[1, default: []].first { $0.context == 42 }
        #expect(r == nil, "old leader served lease read at index \(r?.index ?? 0), value \(String(describing: c.node(1)?.machine.value(0))) after 2 was committed")
        #expect(c.violations.isEmpty)
    }

    /// R22: a wiped voter that keeps its id regains a vote as soon as it has learned the
    /// configuration, and can then help elect a leader that lacks a committed entry.
    @Test("a wiped voter that comes back under its old id never votes, so a committed entry cannot be lost through it (R22)")
    func wipedVoterLosesCommittedEntry() throws {
        var c = try TestCluster(voters: 3) { $0.maxMessageBytes = 1 }
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)  // index 3 on all
        // Entry X (index 4) commits on {1, 3}; 2 never gets it.
        c.drop { $0.from == 1 && $0.to == 2 && $0.isAppend && !$0.appendEntries.isEmpty }
        try c.put(1, key: 0, value: 2, seq: 2)
        #expect(c.raft(1)?.commitIndex == 4)
        #expect(c.raft(2)?.lastIndex == 3)
        // 3's disk is wiped; it comes back blank with the same id.
        try c.wipe(3)
        // 1 crashes, restarts, and is re-elected in a new term (progress reset) with 2's vote;
        // it gets only the founding configuration entry (index 1) to 3 before dying again.
        c.crash(1)
        try c.restart(1)
        c.drop { m in m.from == 1 && m.isAppend && (m.to == 2 ? !m.appendEntries.isEmpty : { if case .append(let p, _, let e, _) = m.body { p >= 1 && p <= 3 && !e.isEmpty } else { false } }()) }
        Scenario.tickUntil(&c, limit: 200) { $0.raft(1)?.role == .leader }
        #expect(c.raft(3)?.isVoterWithAmnesia == true)
        c.crash(1)
        c.drop(where: nil)
        Scenario.tickUntil(&c, limit: 200) { $0.leader != nil }
        let l = c.leader
        #expect(l == nil, "node \(String(describing: l)) won an election with the wiped node's vote")
        // Only the node holding the committed entry can lead again; then nothing is lost.
        try c.restart(1)
        #expect(Scenario.tickUntil(&c, limit: 300) { $0.leader != nil } != nil)
        #expect(c.leader == 1)
        c.tickAll(times: 5)
        #expect(c.node(2)?.machine.value(0) == 2, "committed write value 2 lost")
        #expect(c.raft(3)?.isVoterWithAmnesia == true)
        #expect(c.violations.isEmpty)
    }

    @Test("a leader that starts a transfer stops serving lease reads for the rest of its term (R18, R24)")
    func leaseReadDuringTransfer() throws {
        var c = try TestCluster(voters: 3) { $0.readMode = .leaseBased }
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)
        // The new leader's vote request to 1 is delayed.
        c.hold { $0.to == 1 && $0.from == 2 }
        try c.transfer(1, to: 2)
        #expect(c.raft(2)?.role == .leader)
        try c.put(2, key: 0, value: 2, seq: 2)
        #expect(c.raft(1)?.role == .leader)
        c.readIndex(1, context: 9)
        let r = c.reads[1, default: []].first { $0.context == 9 }
        #expect(r == nil, "old leader served lease read at \(r?.index ?? 0): value \(String(describing: c.node(1)?.machine.value(0))) after 2 committed by node 2")
        #expect(c.violations.isEmpty)
    }
}

extension LeaseAndAmnesiaTests {
    @Test("with a lease, a read is answered without a round trip; without one (just elected) it takes a heartbeat round")
    func leaseAfterHeartbeatRound() throws {
        var c = try TestCluster(voters: 3) { $0.readMode = .leaseBased }
        c.campaign(1)
        try c.put(1, key: 0, value: 3, seq: 1)
        var mark = c.delivered.count
        c.readIndex(1, context: 4)
        #expect(c.reads[1]?.map { [$0.context, $0.index] } == [[4, 3]])
        #expect(c.delivered.count > mark)  // no lease yet: a heartbeat round confirmed it
        c.tick(1)  // a heartbeat round, acknowledged: the lease holds for the next ticks
        mark = c.delivered.count
        c.readIndex(1, context: 5)
        #expect(c.reads[1]?.map { [$0.context, $0.index] } == [[4, 3], [5, 3]])
        #expect(c.delivered.count == mark)
        #expect(c.violations.isEmpty)
    }
}
