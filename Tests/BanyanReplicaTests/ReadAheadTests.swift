import BanyanRaft
import BanyanReplica
import BanyanStateMachine
import BanyanTree
import Testing

/// Large entries are read ahead off the replica thread before they apply (docs/replica.md,
/// "Prepared entries"): the apply order stays the log order whatever order the read-aheads
/// finish in, and reads wait for the entries before them.
@Suite struct ReadAheadTests {
    static func big(_ tag: String) -> String {
        "{\"tag\":\"\(tag)\",\"pad\":\"" + String(repeating: "x", count: 300) + "\",\"n\":{\".sv\":{\"increment\":2}}}"
    }

    /// Three replicas reading ahead entries of 256 bytes or more, answers held; and the leader.
    static func cluster() throws -> (ReplicaCluster, NodeID) {
        var c = try ReplicaCluster(nodes: 3) { $0.prepareThreshold = 256 }
        let leader = try elect(&c)
        c.holdReadAheads = true
        return (c, leader)
    }

    @Test("a large entry waits for its read-ahead and holds back what follows; answers in any order apply in log order")
    func logOrder() throws {
        var (c, leader) = try Self.cluster()
        let a = c.write(via: leader, "/a", Self.big("A"))
        c.settle()
        let s = c.write(via: leader, "/s", "1")
        c.settle()
        let b = c.write(via: leader, "/b", Self.big("B"))
        c.settle()
        let r = c.read(via: leader)
        c.settle()
        // Everything committed; nothing after the first large entry applied anywhere.
        for id: NodeID in [1, 2, 3] {
            #expect(c.value(id, "/a") == "null")
            #expect(c.value(id, "/s") == "null")
            #expect((c.heldReadAheads[id] ?? []).count == 2, "node \(id) asked for both large entries")
        }
        #expect(c.writeOutcome(a, on: leader) == nil && c.writeOutcome(s, on: leader) == nil)
        #expect(!c.readReady(r, on: leader))
        let indexes = (c.heldReadAheads[leader] ?? []).map(\.index).sorted()
        // The later one first: still nothing applies.
        c.answerReadAhead(leader, index: indexes[1])
        c.settle()
        #expect(c.value(leader, "/s") == "null")
        #expect(c.writeOutcome(b, on: leader) == nil)
        c.answerReadAhead(leader, index: indexes[0])
        c.settle()
        for q in [a, s, b] { #expect((try? c.writeOutcome(q, on: leader)?.get())?.outcome == .ok) }
        #expect(c.readReady(r, on: leader))
        #expect(c.value(leader, "/a/n") == "2" && c.value(leader, "/s") == "1" && c.value(leader, "/b/tag") == "\"B\"")
        // The followers, answered in log order, end with the same state.
        for id: NodeID in [1, 2, 3] where id != leader {
            for index in indexes { c.answerReadAhead(id, index: index) }
            #expect(c.replicas[id]?.machine.image() == c.replicas[leader]?.machine.image())
        }
    }

    @Test("an answer nobody asked for is dropped, and a lost one is asked for again")
    func lostAnswers() throws {
        var (c, leader) = try Self.cluster()
        let a = c.write(via: leader, "/a", Self.big("A"))
        c.settle()
        let asked = try #require(c.heldReadAheads[leader]?.first)
        // An unknown index changes nothing.
        c.replicas[leader]?.prepared(index: asked.index + 100, term: asked.term, PreparedCommand(payload: asked.payload))
        #expect(c.value(leader, "/a") == "null")
        // The answer is lost; after ten retry intervals the replica asks again.
        c.heldReadAheads[leader] = []
        c.tick(5 * 10 - 1)
        #expect((c.heldReadAheads[leader] ?? []).isEmpty)
        c.tick(2)
        let again = try #require(c.heldReadAheads[leader]?.first)
        #expect(again.index == asked.index)
        c.answerReadAhead(leader, index: again.index)
        c.settle()
        #expect((try? c.writeOutcome(a, on: leader)?.get())?.outcome == .ok)
        #expect(c.value(leader, "/a/tag") == "\"A\"")
    }

    @Test("a large entry is read ahead as soon as it is written to the log, before it commits")
    func askedAtAppend() throws {
        var (c, leader) = try Self.cluster()
        // Nothing reaches the followers: the entry cannot commit.
        c.filter = { $0.from != leader }
        let a = c.write(via: leader, "/a", Self.big("A"))
        c.settle()
        let asked = try #require(c.heldReadAheads[leader]?.first)
        let commit = try #require(c.replicas[leader]?.raft.commitIndex)
        #expect(asked.index > commit)
        c.answerReadAhead(leader, index: asked.index)
        #expect(c.writeOutcome(a, on: leader) == nil)
        // Once it commits it applies at once: the read-ahead came back already.
        c.filter = { _ in true }
        c.tick(3)
        #expect((try? c.writeOutcome(a, on: leader)?.get())?.outcome == .ok)
        #expect((c.heldReadAheads[leader] ?? []).isEmpty)
    }

    @Test("a read-ahead of an entry replaced before it committed is dropped, and the entry in its place applies")
    func replacedEntry() throws {
        var (c, old) = try Self.cluster()
        let others = [NodeID(1), 2, 3].filter { $0 != old }
        // The leader is cut off and writes a small entry and a large one nobody else gets; the
        // large one is read ahead.
        c.filter = { $0.from != old && $0.to != old }
        let s = c.write(via: old, "/s", "1")
        let a = c.write(via: old, "/a", Self.big("A"))
        c.settle()
        let stale = try #require(c.heldReadAheads[old]?.first)
        // The others elect a leader, which writes a large entry at that index (after its term's
        // empty entry, where the small one was).
        var next: NodeID?
        for _ in 0..<300 where next == nil {
            c.tick()
            next = others.first { c.replicas[$0]?.raft.role == .leader }
        }
        let leader = try #require(next)
        let b = c.write(via: leader, "/b", Self.big("B"))
        c.settle()
        let replacing = try #require(c.heldReadAheads[leader]?.first { $0.index == stale.index })
        #expect(replacing.term > stale.term)
        // The old leader rejoins: its entries are replaced. The answer for its own, late, is
        // dropped; the entry in its place waits for its own read-ahead.
        c.filter = { _ in true }
        c.tick(2)
        #expect(c.replicas[old]?.raft.term == replacing.term)
        c.answerReadAhead(old, index: stale.index)
        c.settle()
        #expect(c.value(old, "/b") == "null")
        #expect(c.heldReadAheads[old]?.contains { $0.index == stale.index && $0.term == replacing.term } == true)
        // Everything answered: all three writes apply once, the same everywhere.
        c.holdReadAheads = false
        c.answerAllReadAheads()
        c.tick(60)
        for q in [s, a] { #expect((try? c.writeOutcome(q, on: old)?.get())?.outcome == .ok) }
        #expect((try? c.writeOutcome(b, on: leader)?.get())?.outcome == .ok)
        for id: NodeID in [1, 2, 3] {
            #expect(c.value(id, "/a/tag") == "\"A\"" && c.value(id, "/b/tag") == "\"B\"" && c.value(id, "/s") == "1", "node \(id)")
            #expect(c.replicas[id]?.machine.image() == c.replicas[leader]?.machine.image())
        }
    }
}
