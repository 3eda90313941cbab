import BanyanRaft
import BanyanStateMachine
import Testing

@Suite struct SmokeTests {
    @Test("three nodes elect a leader, replicate and apply a put everywhere")
    func basicReplication() throws {
        var c = try TestCluster(voters: 3)
        c.campaign(1)
        #expect(c.leader == 1)
        try c.put(1, key: 0, value: 42, seq: 1)
        for id: NodeID in 1...3 {
            #expect(c.node(id)?.machine.value(0) == 42)
            #expect(c.raft(id)?.commitIndex == 3)
        }
        #expect(c.violations.isEmpty)
    }

    @Test("a single node commits only after persisting")
    func singleNode() throws {
        var c = try TestCluster(voters: 1)
        c.campaign(1)
        #expect(c.leader == 1)
        try c.put(1, key: 1, value: 7, seq: 1)
        #expect(c.node(1)?.machine.value(1) == 7)
        #expect(c.violations.isEmpty)
    }

    @Test("elections happen by ticking")
    func electionByTicks() throws {
        var c = try TestCluster(voters: 5)
        c.tickAll(times: 30)
        let leaders = c.nodes.values.filter { $0.raft.role == .leader }
        #expect(leaders.count == 1)
        #expect(c.violations.isEmpty)
    }
}
