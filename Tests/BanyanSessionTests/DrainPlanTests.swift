import BanyanSession
import Testing

/// `DrainPlan` (docs/realtime.md, "Draining a node"): targets in turn, each connection told once,
/// bounded batches, memory bounded by the connections open.
@Suite struct DrainPlanTests {
    @Test("connections are spread over the targets in turn, told once each, at most a batch at a time")
    func batches() throws {
        var plan = try #require(DrainPlan(targets: ["b:9001", "c:9002"], batch: 3))
        let open: [UInt64] = [50, 10, 40, 20, 30]
        let first = plan.nextBatch(open: open)
        #expect(first.map(\.connection) == [10, 20, 30])
        #expect(first.map(\.target) == ["b:9001", "c:9002", "b:9001"])
        #expect(plan.remaining(open: open) == 2)
        // Those told are still open (closing): not told again.
        let second = plan.nextBatch(open: open)
        #expect(second.map(\.connection) == [40, 50])
        #expect(second.map(\.target) == ["c:9002", "b:9001"])
        #expect(plan.nextBatch(open: open).isEmpty)
        // A connection arriving meanwhile is told on the next round; closed ones are forgotten.
        #expect(plan.nextBatch(open: [50, 60]).map(\.connection) == [60])
        #expect(plan.remaining(open: []) == 0)
        #expect(plan.target() == "b:9001")
    }

    @Test("no target, no plan; default targets are the other members' published addresses in node order")
    func targets() {
        #expect(DrainPlan(targets: []) == nil)
        #expect(DrainPlan(targets: ["a:1"], batch: 0) == nil)
        let published: [UInt64: String] = [3: "h3:9003", 1: "h1:9001", 2: "h2:9002", 9: "gone:9009", 4: ""]
        #expect(DrainPlan.targets(published: published, members: [1, 2, 3, 4], me: 2) == ["h1:9001", "h3:9003"])
        #expect(DrainPlan.targets(published: [1: "h1:9001"], members: [1], me: 1).isEmpty)
    }
}
