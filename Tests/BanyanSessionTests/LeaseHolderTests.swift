import BanyanSession
import Testing

/// A node's side of its lease (docs/realtime.md, "Node leases"): renewals while it has
/// connections, safe until a lease minus the margin after the proposal of the newest applied
/// renewal, then a fence and a new holder.
@Suite struct LeaseHolderTests {
    final class Ids {
        var next: UInt64 = 100
        func fresh() -> UInt64 {
            next += 1
            return next
        }
    }

    @Test("renews every renewMillis while there are connections; each applied renewal moves the fence to its proposal + lease - margin")
    func renewals() {
        let ids = Ids()
        var h = LeaseHolder(holder: 1, now: 0, leaseMillis: 20_000, renewMillis: 3_000, marginMillis: 8_000)
        #expect(h.safeUntil == 12_000)
        #expect(h.tick(now: 1_000, connections: 0, fresh: ids.fresh).isEmpty, "no connections, nothing to renew")
        #expect(h.tick(now: 2_000, connections: 3, fresh: ids.fresh) == [.renew(holder: 1, number: 1)])
        #expect(h.tick(now: 3_000, connections: 3, fresh: ids.fresh).isEmpty)
        #expect(h.tick(now: 5_000, connections: 3, fresh: ids.fresh) == [.renew(holder: 1, number: 2)])
        h.renewed(holder: 1, number: 2)
        #expect(h.safeUntil == 17_000)
        // An older renewal applying late never moves the fence back; an unknown one is ignored.
        h.renewed(holder: 1, number: 1)
        #expect(h.safeUntil == 17_000)
        h.renewed(holder: 9, number: 2)
        #expect(h.safeUntil == 17_000)
    }

    @Test("no renewal applied in time: with connections, a fence and a new holder; without, a new holder silently")
    func fences() {
        let ids = Ids()
        var h = LeaseHolder(holder: 1, now: 0, leaseMillis: 20_000, renewMillis: 3_000, marginMillis: 8_000)
        _ = h.tick(now: 0, connections: 1, fresh: ids.fresh)
        // Renewals proposed but never applied (a partition): at 12 s the connections must go.
        for t in stride(from: 3_000, to: 12_000, by: 3_000) { _ = h.tick(now: Int64(t), connections: 1, fresh: ids.fresh) }
        let fenced = h.tick(now: 12_000, connections: 1, fresh: ids.fresh)
        #expect(fenced.first == .fence(reason: "this node's lease on its realtime connections may have lapsed", holder: 101))
        #expect(h.holder == 101 && h.safeUntil == 24_000)
        // A renewal of the old holder applying now changes nothing.
        h.renewed(holder: 1, number: 4)
        #expect(h.safeUntil == 24_000)
        // Idle after renewing: the holder is replaced without a fence; idle and never renewed:
        // kept, and safe a lease from now (a connection opening next is not fenced at once).
        #expect(h.tick(now: 13_000, connections: 1, fresh: ids.fresh) == [.renew(holder: 101, number: 5)])
        let idle = h.tick(now: 30_000, connections: 0, fresh: ids.fresh)
        #expect(idle.isEmpty && h.holder == 102 && h.safeUntil == 42_000)
        #expect(h.tick(now: 50_000, connections: 0, fresh: ids.fresh).isEmpty && h.holder == 102 && h.safeUntil == 62_000)
        // A refused renewal (the leader expired the holder): a fence at once.
        #expect(h.refused(holder: 102, now: 31_000, fresh: ids.fresh) == .fence(reason: "the leader expired this node's lease on its realtime connections", holder: 103))
        #expect(h.refused(holder: 102, now: 31_000, fresh: ids.fresh) == nil, "already replaced")
    }

    @Test("release: the node lets its holder go at once (a connection's end never committed)")
    func release() {
        let ids = Ids()
        var h = LeaseHolder(holder: 1, now: 0)
        #expect(h.release(reason: "stuck", now: 5_000, fresh: ids.fresh) == .fence(reason: "stuck", holder: 101))
        #expect(h.holder == 101 && h.safeUntil == 17_000)
    }
}
