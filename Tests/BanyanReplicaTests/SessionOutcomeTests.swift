import BanyanRaft
import BanyanReplica
import BanyanStateMachine
import BanyanTree
import Testing

/// Outcomes a client is told must match what happens to the write: a retried write refused by
/// flow control may still apply, a write given up on must not leave a permanent gap in its
/// session, and a write whose result arrived inside a leader's snapshot ends at once as unknown.
@Suite struct SessionOutcomeTests {
    @Test("a leader's retry refused by the uncommitted-bytes limit does not fail a write that later applies")
    func retryUnderUncommittedLimit() throws {
        var c = try ReplicaCluster(nodes: 3) { $0.raft.maxUncommittedBytes = 120 }
        let leader = try elect(&c)
        // Appends to followers are lost (heartbeats still flow, so the leader keeps its role):
        // the write stays uncommitted and the retry timer proposes it again, over the limit.
        c.filter = { m in
            if m.from == leader, case .append = m.body { return false }
            return true
        }
        let q = c.write(via: leader, "/v", #""first""#)
        c.settle()
        c.tick(12)  // two retry periods: each re-proposal is refused by the limit
        #expect(c.writeOutcome(q, on: leader) == nil, "the write was reported before its outcome was known")
        // A new write arriving now is refused outright: it was never in any log.
        let refused = c.write(via: leader, "/w", #""second""#)
        c.settle()
        if case .failure(.overloaded) = c.writeOutcome(refused, on: leader) {} else {
            Issue.record("a first proposal over the limit must fail as overloaded, got \(String(describing: c.writeOutcome(refused, on: leader)))")
        }
        c.filter = { _ in true }
        c.tick(10)
        #expect(try c.writeOutcome(q, on: leader)?.get().outcome == .ok)
        for id: NodeID in [1, 2, 3] {
            #expect(c.value(id, "/v") == #""first""#)
            #expect(c.value(id, "/w") == "null")
        }
    }

    @Test("a write given up on leaves no gap: later writes of the session settle it, and a stale copy is a duplicate")
    func givenUpWritesSettle() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let follower = try #require([1, 2, 3].map { NodeID($0) }.first { $0 != leader })
        c.filter = { m in m.from != follower && m.to != follower }
        let lost = c.write(via: follower, "/lost", "1")
        c.tick(70)
        #expect(c.writeOutcome(lost, on: follower) == .failure(.timedOut(write: true)))
        c.filter = { _ in true }
        c.tick(20)
        for i in 0..<5 {
            let q = c.write(via: follower, "/after\(i)", "\(i)")
            c.settle()
            #expect(try c.writeOutcome(q, on: follower)?.get().outcome == .ok)
        }
        let session: UInt64 = 1000 + follower
        for id: NodeID in [1, 2, 3] {
            let record = try #require(c.replicas[id]?.machine.sessions[session])
            #expect(record == SessionRecord(contiguous: 6), "node \(id): \(record)")
        }
    }

    @Test("the state machine settles numbers below a command's watermark and treats late copies as duplicates")
    func watermarkInStateMachine() throws {
        var m = StateMachine()
        func env(_ seq: UInt64, settled: UInt64) -> [UInt8] {
            CommandEnvelope(namespace: "a", session: 5, seq: seq, timestamp: 0, settledBelow: settled, command: .set(path: "/k\(seq)", json: Array("\(seq)".utf8)))
                .encoded()
        }
        #expect(m.apply(env(2, settled: 1), index: 1)?.outcome == .ok)  // 1 still in flight
        #expect(m.sessions[5] == SessionRecord(contiguous: 0, above: [2]))
        #expect(m.apply(env(4, settled: 1), index: 2)?.outcome == .ok)
        #expect(m.sessions[5] == SessionRecord(contiguous: 0, above: [2, 4]))
        #expect(m.apply(env(5, settled: 5), index: 3)?.outcome == .ok)  // 1 and 3 given up, 5 the lowest pending
        #expect(m.sessions[5] == SessionRecord(contiguous: 5))
        #expect(m.apply(env(1, settled: 1), index: 4)?.outcome == .duplicate)
        #expect(m.apply(env(3, settled: 1), index: 5)?.outcome == .duplicate)
        #expect(m.tree("a").child(at: try Path(parsing: "/k1")).isEmpty)
        #expect(m.apply(env(9, settled: 7), index: 6)?.outcome == .ok)
        #expect(m.sessions[5] == SessionRecord(contiguous: 6, above: [9]))
    }

    @Test("version-2 payloads (logs written before the watermark) still decode, settling nothing")
    func version2Payloads() throws {
        let e = CommandEnvelope(namespace: "ns", session: 3, seq: 8, timestamp: 42, settledBelow: 6, command: .set(path: "/x", json: Array("1".utf8)))
        let v3 = e.encoded()
        #expect(v3[0] == 3)
        #expect(CommandEnvelope(decoding: v3) == e)
        var v2 = Array(v3[0..<26]) + Array(v3[34...])
        v2[0] = 2
        var expected = e
        expected.settledBelow = 0
        #expect(CommandEnvelope(decoding: v2) == expected)
        let stamped = try #require(CommandEnvelope.restamped(v2, timestamp: 99))
        #expect(CommandEnvelope(decoding: stamped)?.timestamp == 99)
        #expect(CommandEnvelope(decoding: try #require(CommandEnvelope.restamped(v3, timestamp: 77)))?.settledBelow == 6)
    }

    @Test("a follower splits a large batch of writes into proposals of bounded size, and all apply once")
    func boundedProposals() throws {
        var c = try ReplicaCluster(nodes: 3) { $0.maxProposalBytes = 300 }
        let leader = try elect(&c)
        let follower = try #require([1, 2, 3].map { NodeID($0) }.first { $0 != leader })
        var proposals: [Int] = []
        c.filter = { m in
            if case .proposal(let commands) = m.body { proposals.append(commands.reduce(0) { $0 + $1.count }) }
            return true
        }
        let big = String(repeating: "x", count: 400)
        var qs = (0..<6).map { c.write(via: follower, "/k\($0)", "\"v\($0)\"") }
        qs.append(c.write(via: follower, "/big", "\"\(big)\""))  // larger than the limit: goes alone
        c.settle()
        #expect(proposals.count >= 3, "\(proposals)")
        #expect(proposals.filter { $0 > 300 }.count == 1, "\(proposals)")
        for q in qs { #expect(try c.writeOutcome(q, on: follower)?.get().outcome == .ok) }
        for id: NodeID in [1, 2, 3] { #expect(c.value(id, "/k5") == #""v5""#) }
    }

    @Test("reads batched into one ReadIndex round keep their own deadlines: a later read does not extend an earlier one")
    func readDeadlines() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let follower = try #require([1, 2, 3].map { NodeID($0) }.first { $0 != leader })
        c.filter = { m in m.from != follower && m.to != follower }
        let first = c.read(via: follower)
        c.tick(30)
        let second = c.read(via: follower)  // joins the first in the retried round
        c.tick(31)
        #expect(c.readFailed(first, on: follower) == .timedOut(write: false), "the first read outlived its deadline")
        #expect(c.readFailed(second, on: follower) == nil)
        c.tick(30)
        #expect(c.readFailed(second, on: follower) == .timedOut(write: false))
    }

    @Test("a pending write whose result arrives inside a leader's snapshot ends at once as unknown, not at its deadline")
    func writeCoveredBySnapshot() throws {
        var c = try ReplicaCluster(nodes: 3, snapshotEntries: 5)
        let leader = try elect(&c)
        let follower = try #require([1, 2, 3].map { NodeID($0) }.first { $0 != leader })
        // The follower's first proposal reaches the leader; nothing else reaches the follower's
        // log, and its retries are lost.
        var forwarded = 0
        c.filter = { m in
            if m.from == follower, case .proposal = m.body {
                forwarded += 1
                return forwarded == 1
            }
            if m.to == follower, case .append = m.body { return false }
            if m.to == follower, case .snapshotChunk = m.body { return false }
            return true
        }
        let q = c.write(via: follower, "/mine", "1")
        c.settle()
        let other = try #require([1, 2, 3].map { NodeID($0) }.first { $0 != leader && $0 != follower })
        for i in 0..<12 {
            _ = c.write(via: other, "/fill\(i)", "\(i)")
            c.settle()
        }
        #expect(c.value(leader, "/mine") == "1")
        #expect(c.writeOutcome(q, on: follower) == nil)
        c.filter = { m in !(m.from == follower && { if case .proposal = m.body { return true } else { return false } }()) }
        var waited = 0
        while c.writeOutcome(q, on: follower) == nil && waited < 50 {
            c.tick()
            waited += 1
        }
        #expect((c.events[follower] ?? []).contains { if case .restoredFromSnapshot = $0 { return true } else { return false } })
        #expect(c.writeOutcome(q, on: follower) == .failure(.timedOut(write: true)))
        #expect(waited < 50, "the write waited for its deadline")
        #expect(c.value(follower, "/mine") == "1")
    }
}
