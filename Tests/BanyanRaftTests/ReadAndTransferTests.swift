import BanyanRaft
import BanyanStateMachine
import Testing

/// ReadIndex reads (R17, R18), after etcd's TestReadOnlyOptionSafe and TestReadOnlyForNewLeader.
@Suite struct ReadTests {
    @Test("a ReadIndex read on the leader is answered only after a quorum answered the heartbeat round, at the commit index")
    func leaderReadNeedsHeartbeatQuorum() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 3, seq: 1)
        c.hold { $0.to == 1 && { if case .heartbeatResponse = $0.body { true } else { false } }($0) }
        let started = c.readIndex(1, context: 7)
        #expect(started)
        #expect(c.reads[1, default: []].isEmpty)
        #expect(c.held.count == 2)
        // One of two acknowledgements makes a quorum with the leader itself.
        c.release { [$0[0]] }
        #expect(c.reads[1]?.map { [$0.context, $0.index] } == [[7, 3]])
        #expect(c.violations.isEmpty)
    }

    @Test("a new leader answers a read only after its no-op commits, at an index that includes it (R9, R17)")
    func newLeaderWaitsForNoop() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 3, seq: 1)
        c.hold { $0.from == 2 && $0.isAppend }
        try c.transfer(1, to: 2)
        #expect(c.raft(2)?.role == .leader)
        #expect(c.raft(2)?.term == 3)
        #expect(c.raft(2)?.lastIndex == 4)
        #expect(c.raft(2)?.hasCommittedInTerm == false)
        let started = c.readIndex(2, context: 11)
        #expect(started)
        c.tick(2, times: 3)  // heartbeat rounds alone do not answer it
        #expect(c.reads[2, default: []].isEmpty)
        c.hold(where: nil)
        c.release()
        #expect(c.raft(2)?.commitIndex == 4)
        #expect(c.reads[2]?.map { [$0.context, $0.index] } == [[11, 4]])
        #expect(c.violations.isEmpty)
    }

    @Test("a follower's read goes to the leader and is served once the follower applied the read index")
    func followerReadViaLeader() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 3, seq: 1)
        let mark = c.delivered.count
        let started = c.readIndex(2, context: 5)
        #expect(started)
        let traffic = c.delivered(since: mark)
        #expect(traffic.contains { $0.from == 2 && $0.to == 1 && $0.body == .readIndex(context: 5) })
        #expect(traffic.contains { $0.from == 1 && $0.to == 2 && $0.body == .readIndexResponse(context: 5, index: 3) })
        #expect(c.reads[2]?.map { [$0.context, $0.index] } == [[5, 3]])
        #expect(c.node(2)?.machine.appliedIndex ?? 0 >= 3)
        #expect(c.reads[1, default: []].isEmpty)
        #expect(c.violations.isEmpty)
    }

    @Test("an isolated old leader never answers a read, even after a new leader wrote and the network healed (R17)")
    func isolatedLeaderNeverAnswers() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)
        c.isolate(1)
        let started = c.readIndex(1, context: 99)
        #expect(started)  // accepted while it still believes it leads
        #expect(Scenario.tickUntil(&c) { $0.leader == 2 || $0.leader == 3 } != nil)
        let newLeader = try #require(c.leader)
        try c.put(newLeader, key: 0, value: 2, seq: 2)
        c.heal()
        c.tickAll(times: 30)
        #expect(c.node(1)?.machine.value(0) == 2)
        #expect(!c.reads.values.joined().contains { $0.context == 99 })
        #expect(c.violations.isEmpty)
    }

    @Test("lease-based reads are refused without check-quorum, and with it are answered without a heartbeat round (R18)")
    func leaseNeedsCheckQuorum() throws {
        var bad = RaftConfiguration(id: 1, seed: 1)
        bad.readMode = .leaseBased
        bad.checkQuorum = false
        #expect(throws: RaftError.invalidConfiguration("lease-based reads require checkQuorum")) { try bad.validate() }
        #expect(throws: RaftError.self) { try TestCluster(voters: 3) { $0.readMode = .leaseBased; $0.checkQuorum = false } }

        var c = try TestCluster(voters: 3) { $0.readMode = .leaseBased }
        c.campaign(1)
        try c.put(1, key: 0, value: 3, seq: 1)
        c.tick(1)  // an acknowledged heartbeat round gives the leader its lease
        let mark = c.delivered.count
        c.readIndex(1, context: 4)
        #expect(c.reads[1]?.map { [$0.context, $0.index] } == [[4, 3]])
        #expect(c.delivered.count == mark)
        #expect(c.violations.isEmpty)
    }
}

/// Leader transfer (R24), after etcd's TestLeaderTransfer*.
@Suite struct TransferTests {
    @Test("leadership moves to an up-to-date follower in the next term, and the new leader commits")
    func toUpToDateFollower() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)
        try c.transfer(1, to: 2)
        #expect(c.leader == 2)
        #expect(c.raft(2)?.term == 3)
        #expect(c.raft(1)?.role == .follower)
        #expect(c.raft(1)?.leader == 2)
        try c.put(2, key: 1, value: 2, seq: 2)
        for id: NodeID in 1...3 { #expect(Scenario.values(c, id, keys: 2) == [1, 2]) }
        #expect(c.violations.isEmpty)
    }

    @Test("leadership moves to a lagging follower only after it caught up")
    func toLaggingFollower() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        c.isolate(3)
        for i in 0..<4 { try c.put(1, key: i, value: Int64(i + 10), seq: UInt32(i + 1)) }
        #expect(c.raft(3)?.lastIndex == 2)
        c.heal()
        let mark = c.delivered.count
        try c.transfer(1, to: 3)
        #expect(c.leader == 3)
        let traffic = c.delivered(since: mark)
        let timeoutNow = try #require(traffic.firstIndex { $0.body == .timeoutNow })
        let caughtUp = try #require(traffic.firstIndex { $0.from == 3 && $0.body == .appendAccepted(index: 6) })
        #expect(caughtUp < timeoutNow)
        #expect(Scenario.values(c, 3, keys: 4) == [10, 11, 12, 13])
        #expect(c.violations.isEmpty)
    }

    @Test("proposals and membership changes are refused while a transfer is pending, which times out after an election timeout")
    func refusedDuringTransferThenTimesOut() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        c.isolate(3)
        try c.transfer(1, to: 3)
        #expect(c.raft(1)?.leadershipTransferTarget == 3)
        #expect(throws: RaftError.transferInProgress(to: 3)) { try c.put(1, key: 0, value: 1, seq: 1) }
        #expect(throws: RaftError.transferInProgress(to: 3)) { try c.changeMembership(1, .remove(3)) }
        // A proposal forwarded by a follower is dropped, not appended.
        try c.put(2, key: 0, value: 2, client: 2, seq: 1)
        #expect(c.raft(1)?.lastIndex == 2)
        c.tick(1, times: 9)
        #expect(c.raft(1)?.leadershipTransferTarget == 3)
        c.tick(1)
        #expect(c.raft(1)?.leadershipTransferTarget == 0)
        #expect(c.leader == 1)
        #expect(c.raft(1)?.term == 2)
        try c.put(1, key: 0, value: 3, seq: 3)
        #expect(c.node(2)?.machine.value(0) == 3)
        #expect(c.violations.isEmpty)
    }

    @Test("a transfer to the leader itself is a no-op; to a non-member or from a follower it is refused")
    func toSelfOrNonMember() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        let mark = c.delivered.count
        try c.transfer(1, to: 1)
        #expect(c.raft(1)?.leadershipTransferTarget == 0)
        #expect(!c.delivered(since: mark).contains { $0.body == .timeoutNow })
        #expect(throws: RaftError.invalidMembershipChange("node 9 is not a voter")) { try c.transfer(1, to: 9) }
        #expect(throws: RaftError.notLeader(leader: 1)) { try c.transfer(2, to: 3) }
        #expect(c.leader == 1)
        #expect(c.raft(1)?.term == 2)
        try c.put(1, key: 0, value: 1, seq: 1)
        #expect(c.node(3)?.machine.value(0) == 1)
        #expect(c.violations.isEmpty)
    }
}
