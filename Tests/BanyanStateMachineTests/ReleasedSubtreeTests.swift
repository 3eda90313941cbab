import BanyanBasics
@testable import BanyanStateMachine
import BanyanTree
import Testing

/// A write that replaces or deletes a large subtree hands it back (`Applied.released`), so the
/// node frees it on a worker instead of on the thread that ticks Raft (docs/replica.md,
/// "Freeing replaced subtrees").
@Suite struct ReleasedSubtreeTests {
    struct Log {
        var machine = StateMachine()
        var index: UInt64 = 0

        mutating func apply(_ command: Command, session: UInt64 = 3) -> StateMachine.Applied? {
            index += 1
            let payload = CommandEnvelope(namespace: "app", session: session, seq: index, timestamp: 1_000, command: command).encoded()
            return machine.apply(payload, index: index)
        }

        mutating func set(_ path: String, _ json: String) -> StateMachine.Applied? { apply(.set(path: path, json: Array(json.utf8))) }
    }

    /// `{"k0": {"n": 0}, …}`: `count` children of one value each (2 × count + 1 values).
    static func object(_ count: Int) -> String {
        "{" + (0..<count).map { #""k\#($0)":{"n":\#($0)}"# }.joined(separator: ",") + "}"
    }

    @Test("a set or delete over 4,096 data bytes or more hands the old subtree back; the tree no longer holds it")
    func largeSubtreesAreHandedBack() throws {
        var log = Log()
        #expect(log.set("/big", Self.object(3_000))?.outcome == .ok)
        let old = log.machine.tree("app").child(at: try Path(parsing: "/big"))
        #expect(old.valueCount == 6_001)
        // Overwritten by a small value.
        let overwriteResult = log.set("/big", #"{"x":1}"#)
        let overwrite = try #require(overwriteResult)
        #expect(overwrite.outcome == .ok)
        #expect(overwrite.released.trees.count == 1)
        #expect(overwrite.released.trees.first?.valueCount == 6_001)
        #expect(JSONWriter.string(log.machine.tree("app").child(at: try Path(parsing: "/big"))) == #"{"x":1}"#)
        // Deleted, under its parent.
        #expect(log.set("/a/big", Self.object(3_000))?.outcome == .ok)
        let deleteResult = log.set("/a", "null")
        let delete = try #require(deleteResult)
        #expect(delete.outcome == .ok && delete.released.trees.count == 1)
        #expect(delete.released.trees.first?.valueCount == 6_002)
        #expect(log.machine.tree("app").child(at: try Path(parsing: "/a")).isEmpty)
    }

    @Test("small subtrees, leaves and priority writes keep nothing")
    func smallOnesAreFreedInPlace() throws {
        var log = Log()
        #expect(log.set("/small", Self.object(100))?.outcome == .ok)
        #expect(log.machine.tree("app").child(at: try Path(parsing: "/small")).dataBytes < StateMachine.releaseAfterBytes)
        #expect(log.set("/small", "1")?.released.trees.isEmpty == true)
        #expect(log.set("/leaf", #""text""#)?.released.trees.isEmpty == true)
        #expect(log.set("/big", Self.object(3_000))?.outcome == .ok)
        let priorityResult = log.set("/big/.priority", "5")
        let priority = try #require(priorityResult)
        #expect(priority.outcome == .ok && priority.released.trees.isEmpty)
        #expect(log.machine.tree("app").child(at: try Path(parsing: "/big")).valueCount == 6_001)
    }

    @Test("updates and compare-and-sets hand back what they replace; a refused write hands back nothing")
    func updatesTransactionsAndRefusals() throws {
        var log = Log()
        #expect(log.set("/p/one", Self.object(2_500))?.outcome == .ok)
        #expect(log.set("/p/two", Self.object(2_500))?.outcome == .ok)
        let updateResult = 
            log.apply(.update(path: "/p", entries: [.init(path: "one", json: Array("null".utf8)), .init(path: "two", json: Array("2".utf8))]))
        let update = try #require(updateResult)
        #expect(update.outcome == .ok && update.released.trees.count == 2)
        #expect(JSONWriter.string(log.machine.tree("app").child(at: try Path(parsing: "/p"))) == #"{"two":2}"#)

        #expect(log.set("/t", Self.object(2_500))?.outcome == .ok)
        let current = log.machine.tree("app").child(at: try Path(parsing: "/t"))
        let staleResult = log.apply(.compareAndSet(path: "/t", expectedHash: "wrong", json: Array("1".utf8)))
        let stale = try #require(staleResult)
        if case .datastale = stale.outcome {} else { Issue.record("expected datastale, got \(stale.outcome)") }
        #expect(stale.released.trees.isEmpty)
        #expect(log.machine.tree("app").child(at: try Path(parsing: "/t")).valueCount == current.valueCount)
        let swappedResult = log.apply(.compareAndSet(path: "/t", expectedHash: current.hashString, json: Array("1".utf8)))
        let swapped = try #require(swappedResult)
        #expect(swapped.outcome == .ok && swapped.released.trees.count == 1)

        // Refused: a value nested deeper than the limit (32 levels) changes nothing.
        #expect(log.set("/r", Self.object(2_500))?.outcome == .ok)
        let refusedResult = log.set("/r", "{\"a\":" + String(repeating: "{\"a\":", count: 40) + "1" + String(repeating: "}", count: 41))
        let refused = try #require(refusedResult)
        if case .ok = refused.outcome { Issue.record("a value 42 levels deep was accepted") }
        #expect(refused.released.trees.isEmpty)
        #expect(log.machine.tree("app").child(at: try Path(parsing: "/r")).valueCount == 5_001)
    }

    @Test("nested update items hand back what they replace, and so do updates of many items; a write over the quota hands back nothing; under a quota what a write replaces is handed back too, its measure read, not walked")
    func nestedLargeUpdatesAndQuota() throws {
        var log = Log()
        #expect(log.set("/n/a/b", Self.object(2_500))?.outcome == .ok)
        let nestedResult = log.apply(.update(path: "/n", entries: [.init(path: "a/b", json: Array("1".utf8)), .init(path: "c", json: Array("2".utf8))]))
        let nested = try #require(nestedResult)
        #expect(nested.outcome == .ok && nested.released.trees.count == 1)

        #expect(log.set("/m/big", Self.object(2_500))?.outcome == .ok)
        let many = [Command.UpdateItem(path: "big", json: Array("null".utf8))] + (0..<64).map { .init(path: "x\($0)", json: Array("1".utf8)) }
        let manyResult = log.apply(.update(path: "/m", entries: many))
        let large = try #require(manyResult)
        #expect(large.outcome == .ok && large.released.trees.count == 1)
        #expect(large.released.trees.first?.valueCount == 5_001)
        #expect(log.machine.tree("app").child(at: try Path(parsing: "/m/big")).isEmpty)

        // A quota of 200,000 data bytes: replacing a 5,001-value subtree with a larger one goes
        // over it and is refused, the subtree staying where it was.
        #expect(log.set("/q", Self.object(2_500))?.outcome == .ok)
        do {
            log.index += 1
            let payload = CommandEnvelope(
                namespace: StateMachine.quotasNamespace, session: 9, seq: 1, timestamp: 1_000, command: .set(path: "/app", json: Array("200000".utf8))
            ).encoded()
            _ = log.machine.apply(payload, index: log.index)
            #expect(log.machine.quotas["app"] == 200_000)
        }
        let overResult = log.set("/q", Self.object(40_000))
        let over = try #require(overResult)
        if case .overQuota = over.outcome {} else { Issue.record("expected overQuota, got \(over.outcome)") }
        #expect(over.released.trees.isEmpty)
        #expect(log.machine.tree("app").child(at: try Path(parsing: "/q")).valueCount == 5_001)
        // Within the quota: the old subtree is handed back to be freed, and the usage follows
        // from the measures the trees carry.
        let withinResult = log.set("/q", "1")
        let within = try #require(withinResult)
        #expect(within.outcome == .ok && within.released.trees.count == 1)
        #expect(within.released.trees.first?.valueCount == 5_001)
        #expect(log.machine.quotaUsage["app"] == log.machine.tree("app").walkedDataBytes)
    }

    @Test("what one write frees where it applies is bounded in total: an update of 2,000 items each deleting a small subtree hands them all back, one of 3 items frees them in place; a fired onDisconnect queue hands back what it replaces")
    func boundedPerWriteAndDisconnects() throws {
        var log = Log()
        // 2,000 subtrees of about 20 data bytes each: small one by one, 40 KB together.
        let many = "{" + (0..<2_000).map { #""s\#($0)":{"a":"0123456789"}"# }.joined(separator: ",") + "}"
        #expect(log.set("/m", many)?.outcome == .ok)
        let one = log.machine.tree("app").child(at: try Path(parsing: "/m/s0"))
        #expect(one.dataBytes < 40 && one.hasChildren)
        let deletes = (0..<2_000).map { Command.UpdateItem(path: "s\($0)", json: Array("null".utf8)) }
        let bulkResult = log.apply(.update(path: "/m", entries: deletes))
        let bulk = try #require(bulkResult)
        #expect(bulk.outcome == .ok && bulk.released.trees.count == 2_000)
        #expect(log.machine.tree("app").child(at: try Path(parsing: "/m")).isEmpty)
        // A few small ones together stay under the bound: freed where the write applies.
        #expect(log.set("/f", #"{"a":{"x":1},"b":{"y":2},"c":{"z":3}}"#)?.outcome == .ok)
        let fewResult = log.apply(.update(path: "/f", entries: ["a", "b", "c"].map { .init(path: $0, json: Array("null".utf8)) }))
        let few = try #require(fewResult)
        #expect(few.outcome == .ok && few.released.trees.isEmpty)

        // A connection queues the removal of a large subtree; its end fires the queue.
        #expect(log.set("/presence", Self.object(2_500))?.outcome == .ok)
        let connection: UInt64 = 700
        let queued = log.apply(.onDisconnectSet(path: "/presence", json: Array("null".utf8), secret: 5, holder: 0), session: connection)
        #expect(queued?.outcome == .ok)
        let endedResult = log.apply(.connectionEnded(connection: connection, secret: 5), session: 4)
        let ended = try #require(endedResult)
        #expect(ended.outcome == .ok && ended.written.count == 1)
        #expect(ended.released.trees.count == 1 && ended.released.trees.first?.valueCount == 5_001)
        #expect(log.machine.tree("app").child(at: try Path(parsing: "/presence")).isEmpty)
    }

    @Test("applied outcomes compare equal whatever they hand back")
    func releasedTreesDoNotChangeEquality() {
        var a = StateMachine.Applied(namespace: "n", session: 1, seq: 1, outcome: .ok, written: [])
        let b = a
        a.released = .init([Tree(.int(1))])
        #expect(a == b)
    }
}
