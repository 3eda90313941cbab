import BanyanRaft
import BanyanStateMachine
import Testing

/// Two operator stories from the issue: a node whose disk was wiped comes back, and a leader is
/// cut off from its followers while clients keep talking to it.
@Suite struct RejoinTests {
    @Test("a wiped node rejoins under a new identity: its old id is removed, the blank node joins as a learner, catches up by snapshot and is promoted (R22)")
    func wipedNodeRejoinsAsNewIdentity() throws {
        var c = try TestCluster(voters: 3) { $0.snapshotChunkBytes = 32 }
        for id: NodeID in 1...4 { _ = try c.withNode(id) { $0.snapshotEvery = 5 } }
        c.campaign(1)
        for seq: UInt32 in 1...12 { try c.put(1, key: Int(seq % 3), value: Int64(seq), seq: seq) }
        // Node 3's disk is wiped. It must not come back as node 3 with amnesia.
        c.crash(3)
        try c.changeMembership(1, .remove(3))
        #expect(c.raft(1)?.membership.voters == [1, 2])
        // The replacement starts blank under id 4 and is added as a learner.
        try c.addBlankNode(4) { $0.snapshotChunkBytes = 32 }
        _ = try c.withNode(4) { $0.snapshotEvery = 5 }
        #expect(c.raft(4)?.membership.isEmpty == true)
        try c.changeMembership(1, .addLearner(4))
        c.tickAll(times: 5)
        // It caught up from a snapshot (the leader compacted long ago) and was promoted.
        #expect(c.raft(4)?.snapshotMeta.index ?? 0 > 0)
        #expect(c.raft(1)?.membership.voters == [1, 2, 4])
        #expect(c.raft(4)?.membership.voters == [1, 2, 4])
        for key in 0..<3 { #expect(c.node(4)?.machine.value(key) == c.node(1)?.machine.value(key)) }
        // The new voter counts: with node 2 down, nodes 1 and 4 still commit.
        c.crash(2)
        try c.put(1, key: 0, value: 99, seq: 13)
        #expect(c.node(4)?.machine.value(0) == 99)
        #expect(c.violations.isEmpty)
    }

    @Test("a leader cut off while clients still write to it: nothing it accepts commits or applies; the majority elects a leader and its writes win")
    func cutOffLeaderWithClients() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        try c.put(1, key: 0, value: 1, seq: 1)
        c.isolate(1)
        // Clients keep writing through the old leader: it appends, but can never commit.
        for seq: UInt32 in 2...4 { try c.put(1, key: 0, value: Int64(100 + seq), seq: seq) }
        #expect(c.raft(1)?.lastIndex ?? 0 > c.raft(1)?.commitIndex ?? 0)
        #expect(c.node(1)?.machine.value(0) == 1)
        // A read through it is not answered.
        c.readIndex(1, context: 7)
        #expect(c.reads[1, default: []].isEmpty)
        // The others elect a leader and commit a different write.
        #expect(Scenario.tickUntil(&c, limit: 200) { c in c.leader.map { $0 != 1 } ?? false } != nil)
        let newLeader = try #require(c.leader)
        try c.put(newLeader, key: 0, value: 500, client: 2, seq: 1)
        // The old leader steps down by check-quorum within two election timeouts of the cut.
        #expect(Scenario.tickUntil(&c, limit: 20) { $0.raft(1)?.role != .leader } != nil)
        // After the partition heals the old leader's uncommitted entries are overwritten.
        c.heal()
        c.tickAll(times: 5)
        for id: NodeID in 1...3 {
            #expect(c.node(id)?.machine.value(0) == 500)
            let applied = c.applied[id, default: []].compactMap { CommandEnvelope(decoding: $0.data) }
            #expect(!applied.contains { $0.session == 1 && $0.seq >= 2 }, "node \(id) applied a write the cut-off leader accepted")
        }
        #expect(c.reads[1, default: []].isEmpty)
        #expect(c.violations.isEmpty)
    }
}
