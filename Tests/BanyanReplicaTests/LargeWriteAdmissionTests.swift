import BanyanRaft
import BanyanReplica
import BanyanStateMachine
import BanyanTree
import Testing

/// A leader keeps at most `maxLargeInFlight` large entries appended and not applied; later
/// large writes wait for room while small ones go ahead (docs/replica.md, "Large writes wait
/// their turn").
@Suite struct LargeWriteAdmissionTests {
    static func big(_ tag: String) -> String { ReadAheadTests.big(tag) }

    /// Three replicas; entries of 256 bytes or more are large and read ahead (answers held).
    static func cluster(maxLargeInFlight: Int = 1) throws -> (ReplicaCluster, NodeID) {
        var c = try ReplicaCluster(nodes: 3) {
            $0.prepareThreshold = 256
            $0.largeEntryBytes = 256
            $0.maxLargeInFlight = maxLargeInFlight
        }
        let leader = try elect(&c)
        c.holdReadAheads = true
        return (c, leader)
    }

    /// The tags of the command entries in `id`'s log, in log order ("s…" for small ones).
    static func logTags(_ c: ReplicaCluster, _ id: NodeID) -> [String] {
        c.storedEntries(id).compactMap { entry -> String? in
            guard case .command = entry.kind else { return nil }
            let text = String(decoding: entry.data, as: UTF8.self)
            for tag in ["A", "B", "C"] where text.contains("\"tag\":\"\(tag)\"") { return tag }
            return text.contains("/s") ? "s" : "?"
        }
    }

    static func ok(_ c: ReplicaCluster, _ q: RequestID, on id: NodeID) -> Bool {
        (try? c.writeOutcome(q, on: id)?.get())?.outcome == .ok
    }

    @Test("the leader's second large write waits for the first to apply; a small one written after it goes first")
    func smallGoesAhead() throws {
        var (c, leader) = try Self.cluster()
        let a = c.write(via: leader, "/a", Self.big("A"))
        let b = c.write(via: leader, "/b", Self.big("B"))
        let s = c.write(via: leader, "/s", "1")
        c.settle()
        #expect(Self.logTags(c, leader) == ["A", "s"])
        #expect(c.replicas[leader]?.largeWritesHeld == 1)
        // A waits for its read-ahead, and s behind it; B is not in any log yet.
        #expect(c.writeOutcome(s, on: leader) == nil)
        let askedA = try #require(c.heldReadAheads[leader]?.first)
        c.answerReadAhead(leader, index: askedA.index)
        c.settle()
        #expect(Self.ok(c, a, on: leader) && Self.ok(c, s, on: leader))
        #expect(Self.logTags(c, leader) == ["A", "s", "B"])
        let askedB = try #require(c.heldReadAheads[leader]?.first { $0.index > askedA.index })
        c.answerReadAhead(leader, index: askedB.index)
        c.settle()
        #expect(Self.ok(c, b, on: leader))
        #expect(c.value(leader, "/b/tag") == "\"B\"")
        // Every node holds the same log.
        for id: NodeID in [1, 2, 3] { #expect(Self.logTags(c, id) == ["A", "s", "B"]) }
    }

    @Test("without a limit the large writes go into the log in the order written")
    func noLimit() throws {
        var (c, leader) = try Self.cluster(maxLargeInFlight: 0)
        _ = c.write(via: leader, "/a", Self.big("A"))
        _ = c.write(via: leader, "/b", Self.big("B"))
        _ = c.write(via: leader, "/s", "1")
        c.settle()
        #expect(Self.logTags(c, leader) == ["A", "B", "s"])
        #expect(c.replicas[leader]?.largeWritesHeld == 0)
    }

    @Test("a follower's large write waits at the leader, its retries are dropped, and it applies once there is room")
    func forwardedWaits() throws {
        var (c, leader) = try Self.cluster()
        let followers = [NodeID(1), 2, 3].filter { $0 != leader }
        let a = c.write(via: leader, "/a", Self.big("A"))
        c.settle()
        let b = c.write(via: followers[0], "/b", Self.big("B"))
        let s = c.write(via: followers[1], "/s", "1")
        c.settle()
        #expect(Self.logTags(c, leader) == ["A", "s"])
        let held = try #require(c.replicas[leader]?.heldForRoomBytes)
        #expect(held > 256)
        // The follower proposes B again after `retryTicks` (5 here): the copy is dropped, not held twice.
        let dropped = c.replicas[leader]?.droppedRetries ?? 0
        c.tick(12)
        #expect(c.replicas[leader]?.heldForRoomBytes == held)
        #expect((c.replicas[leader]?.droppedRetries ?? 0) > dropped)
        #expect(Self.logTags(c, leader) == ["A", "s"])
        // Room once A applies on the leader: B goes in, and applies on its follower.
        let askedA = try #require(c.heldReadAheads[leader]?.first)
        c.answerReadAhead(leader, index: askedA.index)
        c.settle()
        #expect(Self.ok(c, a, on: leader))
        #expect(Self.logTags(c, leader) == ["A", "s", "B"])
        #expect(c.replicas[leader]?.heldForRoomBytes == 0)
        c.holdReadAheads = false
        c.answerAllReadAheads()
        c.settle()
        #expect(Self.ok(c, b, on: followers[0]) && Self.ok(c, s, on: followers[1]))
        for id: NodeID in [1, 2, 3] { #expect(c.value(id, "/b/tag") == "\"B\"") }
    }

    @Test("in an ordered session nothing overtakes a large write that waits")
    func orderedSessionKeepsItsOrder() throws {
        var (c, leader) = try Self.cluster()
        let session: UInt64 = 0xABCD
        #expect(c.replicas[leader]?.openSession(session, ordered: true) == true)
        let a = c.write(via: leader, "/a", Self.big("A"))
        let b = c.request()
        c.replicas[leader]?.write(b, namespace: "app", command: .set(path: "/b", json: Array(Self.big("B").utf8)), session: session)
        let s2 = c.request()
        c.replicas[leader]?.write(s2, namespace: "app", command: .set(path: "/s2", json: Array("2".utf8)), session: session)
        let s = c.write(via: leader, "/s", "1")
        c.settle()
        // The node's own (unordered) session goes ahead; the ordered one waits behind B.
        #expect(Self.logTags(c, leader) == ["A", "s"])
        c.holdReadAheads = false
        let askedA = try #require(c.heldReadAheads[leader]?.first)
        c.answerReadAhead(leader, index: askedA.index)
        c.settle()
        c.answerAllReadAheads()
        c.settle()
        #expect(Self.logTags(c, leader) == ["A", "s", "B", "s"])
        for q in [a, b, s2, s] { #expect(Self.ok(c, q, on: leader), "request \(q)") }
        #expect(c.value(leader, "/s2") == "2")
    }

    @Test("a leader that steps down drops what it held; the follower's retry reaches the next leader")
    func heldDroppedOnStepDown() throws {
        var (c, leader) = try Self.cluster()
        let followers = [NodeID(1), 2, 3].filter { $0 != leader }
        _ = c.write(via: leader, "/a", Self.big("A"))
        c.settle()
        let b = c.write(via: followers[0], "/b", Self.big("B"))
        c.settle()
        #expect((c.replicas[leader]?.heldForRoomBytes ?? 0) > 0)
        // Leadership moves to the other follower; the old leader's next ready drops what it held.
        try c.replicas[leader]?.transferLeadership(to: followers[1])
        c.holdReadAheads = false
        c.answerAllReadAheads()
        c.settle()
        c.tick(40)
        #expect(c.leader == followers[1])
        #expect(c.replicas[leader]?.heldForRoomBytes == 0)
        #expect(Self.ok(c, b, on: followers[0]))
        for id: NodeID in [1, 2, 3] { #expect(c.value(id, "/b/tag") == "\"B\"") }
    }

    @Test("large writes get room in the order they began to wait, the leader's own and forwarded ones alike")
    func firstComeFirstServed() throws {
        var (c, leader) = try Self.cluster()
        let followers = [NodeID(1), 2, 3].filter { $0 != leader }
        _ = c.write(via: leader, "/a", Self.big("A"))
        c.settle()
        // B (forwarded) waits first, then the leader's own C: B goes before C.
        let b = c.write(via: followers[0], "/b", Self.big("B"))
        c.settle()
        c.tick()
        let own = c.write(via: leader, "/c", Self.big("C"))
        c.settle()
        #expect(Self.logTags(c, leader) == ["A"])
        c.holdReadAheads = false
        for asked in c.heldReadAheads[leader] ?? [] { c.answerReadAhead(leader, index: asked.index) }
        c.settle()
        #expect(Self.logTags(c, leader).prefix(2) == ["A", "B"])
        c.tick(5)
        #expect(Self.logTags(c, leader) == ["A", "B", "C"])
        #expect(Self.ok(c, b, on: followers[0]) && Self.ok(c, own, on: leader))

        // The other way round: the leader's own E waits first, then a forwarded F.
        c.holdReadAheads = true
        _ = c.write(via: leader, "/d", Self.big("A"))
        c.settle()
        let e = c.write(via: leader, "/e", Self.big("B"))
        c.settle()
        c.tick()
        let f = c.write(via: followers[1], "/f", Self.big("C"))
        c.settle()
        c.holdReadAheads = false
        c.answerAllReadAheads()
        c.tick(10)
        #expect(Self.logTags(c, leader).suffix(3) == ["A", "B", "C"])
        #expect(Self.ok(c, e, on: leader) && Self.ok(c, f, on: followers[1]))
    }

    @Test("a write that waited for room until its deadline fails cleanly; a forwarded one held that long is dropped")
    func deadlines() throws {
        var (c, leader) = try Self.cluster()
        let followers = [NodeID(1), 2, 3].filter { $0 != leader }
        // A's read-ahead never comes back on the leader: nothing else large gets room.
        _ = c.write(via: leader, "/a", Self.big("A"))
        c.settle()
        let own = c.write(via: leader, "/b", Self.big("B"))
        let forwarded = c.write(via: followers[0], "/c", Self.big("C"))
        c.settle()
        #expect((c.replicas[leader]?.heldForRoomBytes ?? 0) > 0)
        // The harness's request timeout: 60 ticks.
        c.heldReadAheads = [:]
        c.tick(61)
        guard case .failure(.overloaded)? = c.writeOutcome(own, on: leader) else {
            Issue.record("the leader's own write: \(String(describing: c.writeOutcome(own, on: leader)))")
            return
        }
        guard case .failure(.timedOut)? = c.writeOutcome(forwarded, on: followers[0]) else {
            Issue.record("the follower's write: \(String(describing: c.writeOutcome(forwarded, on: followers[0])))")
            return
        }
        #expect(c.replicas[leader]?.heldForRoomBytes == 0)
        #expect(Self.logTags(c, leader) == ["A"])
    }

    @Test("a forwarded large write that arrives as room frees does not overtake the leader's own that waited")
    func forwardedDoesNotOvertakeOwn() throws {
        var (c, leader) = try Self.cluster()
        let follower = try #require([NodeID(1), 2, 3].first { $0 != leader })
        _ = c.write(via: leader, "/a", Self.big("A"))
        c.settle()
        let b = c.write(via: leader, "/b", Self.big("B"))
        c.settle()
        #expect(Self.logTags(c, leader) == ["A"])
        // A applies on the leader (room frees); before its next `ready()`, a follower's large
        // write arrives.
        let asked = try #require(c.heldReadAheads[leader]?.first)
        c.answerReadAhead(leader, index: asked.index)
        let payload = CommandEnvelope(
            namespace: "app", session: 4_242, seq: 1, timestamp: 0, command: .set(path: "/c", json: Array(Self.big("C").utf8))
        ).encoded()
        let term = try #require(c.replicas[leader]?.raft.term)
        c.replicas[leader]?.receive(Message(from: follower, to: leader, term: term, body: .proposal(commands: [payload])))
        c.settle()
        #expect(Self.logTags(c, leader) == ["A", "B"])
        c.holdReadAheads = false
        c.answerAllReadAheads()
        c.tick(5)
        #expect(Self.logTags(c, leader) == ["A", "B", "C"])
        #expect(Self.ok(c, b, on: leader))
        #expect(c.value(follower, "/c/tag") == "\"C\"")
    }
}
