import BanyanNode
import BanyanStateMachine
import BanyanTree
import Testing

/// The leader's side of node leases (docs/realtime.md, "Node leases").
@Suite struct LeaseKeeperTests {
    static let second: UInt64 = 1_000_000_000

    func machine(queued: [(connection: UInt64, holder: UInt64, namespace: String)], leases: [UInt64: StateMachine.Lease] = [:], expired: Set<UInt64> = [])
        -> StateMachine
    {
        var queues: [UInt64: DisconnectQueue] = [:]
        for q in queued {
            var tree = OnDisconnectTree()
            tree.set(["presence"], .string("offline"))
            queues[q.connection] = DisconnectQueue(namespace: q.namespace, secret: 1, holder: q.holder, tree: tree)
        }
        return StateMachine(disconnects: queues, leases: leases, expiredHolders: expired)
    }

    @Test("a holder silent for a whole lease is expired once per namespace, counted from the leader's election or its latest renewal; retried; never by a follower")
    func expiry() {
        var keeper = LeaseKeeper(leaseNanoseconds: 20 * Self.second, retryNanoseconds: 2 * Self.second)
        var m = machine(queued: [(1, 7, "a"), (2, 7, "b"), (3, 0, "a")], leases: [7: .init(node: 2, renewedIndex: 5)])
        #expect(keeper.check(now: 0, isLeader: false, machine: m).isEmpty)
        #expect(keeper.check(now: 100 * Self.second, isLeader: true, machine: m).isEmpty, "the count starts at the election")
        #expect(keeper.check(now: 119 * Self.second, isLeader: true, machine: m).isEmpty)
        // A renewal applied at 110 s restarts the count.
        m = machine(queued: [(1, 7, "a"), (2, 7, "b"), (3, 0, "a")], leases: [7: .init(node: 2, renewedIndex: 9)])
        #expect(keeper.check(now: 110 * Self.second, isLeader: true, machine: m).isEmpty)
        #expect(keeper.check(now: 129 * Self.second, isLeader: true, machine: m).isEmpty)
        let due = keeper.check(now: 130 * Self.second, isLeader: true, machine: m)
        #expect(due == [.init(holder: 7, namespace: "a", lastRenewal: 9), .init(holder: 7, namespace: "b", lastRenewal: 9)], "holder 0 never expires")
        #expect(keeper.check(now: 131 * Self.second, isLeader: true, machine: m).isEmpty, "not again before the retry interval")
        #expect(keeper.check(now: 132 * Self.second, isLeader: true, machine: m).count == 2, "retried")
        // Expired in one namespace: the rest go without waiting for a lease, every retry interval
        // (the last proposal for this holder was at 132 s).
        m = machine(queued: [(2, 7, "b")], expired: [7])
        #expect(keeper.check(now: 133 * Self.second, isLeader: true, machine: m).isEmpty)
        #expect(keeper.check(now: 134 * Self.second, isLeader: true, machine: m) == [.init(holder: 7, namespace: "b", lastRenewal: 0)])
        #expect(keeper.check(now: 135 * Self.second, isLeader: true, machine: m).isEmpty)
        // Leadership lost and regained: every count restarts.
        m = machine(queued: [(1, 8, "a")])
        #expect(keeper.check(now: 140 * Self.second, isLeader: false, machine: m).isEmpty)
        #expect(keeper.check(now: 141 * Self.second, isLeader: true, machine: m).isEmpty)
        #expect(keeper.check(now: 160 * Self.second, isLeader: true, machine: m).isEmpty)
        #expect(keeper.check(now: 161 * Self.second, isLeader: true, machine: m) == [.init(holder: 8, namespace: "a", lastRenewal: 0)])
        // A lapsed lease with no queues is expired too (namespace ""), so the table forgets it.
        m = machine(queued: [], leases: [9: .init(node: 3, renewedIndex: 4)])
        _ = keeper.check(now: 170 * Self.second, isLeader: true, machine: m)
        #expect(keeper.check(now: 190 * Self.second, isLeader: true, machine: m) == [.init(holder: 9, namespace: "", lastRenewal: 4)])
    }
}
