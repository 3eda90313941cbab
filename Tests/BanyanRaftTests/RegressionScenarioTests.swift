import BanyanRaft
import BanyanStateMachine
import Testing

/// Bugs the retired Raft-core simulator found in `RaftNode`, kept as deterministic scenarios on
/// `TestCluster` (its seeds went with it: docs/simulator.md at commit 32dc826, "Failure handling and triage").
/// Each scenario sets up the situation the seed produced and checks the behaviour of the fix in
/// `RaftNode.handleSnapshotChunk`.
@Suite struct RegressionScenarioTests {
    static func isFinalChunk(_ m: Message) -> Bool {
        if case .snapshotChunk(_, _, _, true) = m.body { true } else { false }
    }

    /// Terms of `id`'s log at `indexes` (nil where it holds no entry).
    static func terms(_ c: TestCluster, _ id: NodeID, _ indexes: ClosedRange<UInt64>) -> [UInt64?] {
        indexes.map { c.raft(id)?.term(at: $0) }
    }

    /// Seed 761. The follower already holds the snapshot's last entry, but not the entries after
    /// it: those are uncommitted leftovers of an older term that the leader does not have. It must
    /// acknowledge the commit index (the snapshot's index), never its last index: the leader takes
    /// the answer as a match point. With the last index (4, past the leader's own log) the leader
    /// believed the follower held entries it does not and never repaired them (the simulator saw it
    /// probe the same index forever; here the follower even commits its stale entries).
    /// (SnapshotTests' "a snapshot older than the follower's commit index is ignored" does not cover
    /// this: there the snapshot is at or below the commit index, another branch.)
    @Test("761: a follower holding a snapshot's last entry acknowledges its commit index, not its last index, and converges")
    func snapshotAlreadyHeldAcknowledgesCommitIndex() throws {
        var c = try TestCluster(voters: 3)
        // Node 1 takes a snapshot as soon as it has applied index 2 (then no more).
        try c.withNode(1) { (n: inout SimNode) throws(RaftError) in n.snapshotEvery = 2 }
        // Term 2 committed index 2 (nodes 1 and 2 know it; node 3 only knows 1). Node 3 then led
        // term 3 alone and wrote 3 and 4, which reached nobody.
        try c.replace(1, disk: Scenario.disk(terms: [1, 2], term: 3, commit: 2))
        try c.replace(2, disk: Scenario.disk(terms: [1, 2], term: 3, vote: 3, commit: 2))
        try c.replace(3, disk: Scenario.disk(terms: [1, 2, 3, 3], term: 3, vote: 3, commit: 1))
        c.stabilize()
        #expect(c.raft(1)?.snapshotMeta.index == 2)
        try c.withNode(1) { (n: inout SimNode) throws(RaftError) in n.snapshotEvery = 0 }
        // Node 1 wins term 4 with node 2's vote while node 3 is cut off; its no-op (3) commits.
        c.isolate(3)
        c.campaign(1)
        #expect(c.leader == 1)
        #expect(c.raft(1)?.term == 4)
        #expect(c.raft(1)?.commitIndex == 3)
        let snapshot = try #require(c.raft(1)?.snapshotMeta)
        let bytes = try #require(c.node(1)?.disk.snapshotBytes)
        #expect(snapshot.index == 2 && snapshot.term == 2)
        // The network heals, and the leader's snapshot at 2 reaches node 3 (as the simulator
        // delivered it): node 3 holds entry 2 of term 2, with commit 1 and last index 4.
        c.heal()
        c.hold { $0.from == 3 && $0.to == 1 }
        c.inject(Message(from: 1, to: 3, term: 4, body: .snapshotChunk(meta: snapshot, offset: 0, data: bytes, last: true)))
        #expect(c.held.map(\.body) == [.appendAccepted(index: 2)])
        #expect(c.raft(3)?.commitIndex == 2)
        #expect(c.raft(3)?.snapshotMeta.index == 0)  // nothing restored
        #expect(c.raft(3)?.lastIndex == 4)
        c.hold(where: nil)
        c.release()
        // The leader matches node 3 at 2 and replaces its stale entries 3 and 4.
        #expect(Self.terms(c, 3, 1...4) == [1, 2, 4, nil])
        try c.put(1, key: 0, value: 7, seq: 1)
        c.tickAll(times: 3)
        let last = try #require(c.raft(1)?.lastIndex)
        #expect(last == 4)
        #expect(Self.terms(c, 3, 3...last) == Self.terms(c, 1, 3...last))
        #expect(c.raft(3)?.commitIndex == last)
        #expect(c.raft(1)?.replicationStatus.first { $0.node == 3 }?.match == last)
        #expect(c.node(3)?.machine.value(0) == 7)
        #expect(c.violations.isEmpty)
    }

    /// Seed 34521. A node steps several messages before its driver runs (a paused node resuming
    /// with a full inbox): the final chunk of one snapshot, then the first chunk of the leader's
    /// newer snapshot. The core must accept no chunk while the completed install is pending, or
    /// `Ready.snapshotChunks` mixes the two snapshots and the driver installs the wrong bytes.
    @Test("34521: a newer snapshot's first chunk stepped in the same batch as a completed snapshot is refused until the install is handed over")
    func noChunkWhileInstallPending() throws {
        var c = try TestCluster(voters: 3) { $0.snapshotChunkBytes = 16 }
        for id: NodeID in 1...3 { try c.withNode(id) { (n: inout SimNode) throws(RaftError) in n.snapshotEvery = 5 } }
        c.campaign(1)
        c.crash(3)
        for i in 0..<20 { try c.put(1, key: i % 7, value: Int64(100 + i), seq: UInt32(i + 1)) }
        let first = try #require(c.raft(1)?.snapshotMeta)
        #expect(first.index > 2)
        try c.restart(3)
        // The leader streams its snapshot to node 3; the final chunk is delayed.
        c.hold { $0.to == 3 && Self.isFinalChunk($0) }
        #expect(Scenario.tickUntil(&c, limit: 30) { $0.held.count == 1 } != nil)
        #expect(c.raft(3)?.snapshotMeta.index == 0)
        // Meanwhile the leader compacts again; when the stalled transfer restarts it streams the
        // newer snapshot from offset 0. That chunk is delayed too.
        c.hold { $0.to == 3 && $0.isSnapshotChunk }
        for i in 20..<26 { try c.put(1, key: i % 7, value: Int64(100 + i), seq: UInt32(i + 1)) }
        let second = try #require(c.raft(1)?.snapshotMeta)
        #expect(second.index > first.index)
        #expect(Scenario.tickUntil(&c, limit: 50) { $0.held.count == 2 } != nil)
        let inbox = c.held.map(\.body)
        guard inbox.count == 2, case let .snapshotChunk(meta0, _, _, true) = inbox[0], case let .snapshotChunk(meta1, offset1, _, _) = inbox[1] else {
            Issue.record("expected the first snapshot's final chunk, then a chunk of the newer one: \(inbox)")
            return
        }
        #expect(meta0 == first)
        #expect(meta1 == second && offset1 == 0)
        // Node 3 steps both before its driver runs.
        c.hold(where: nil)
        c.release()
        #expect(c.violations.isEmpty)  // the driver installs the first snapshot with its own bytes
        #expect(c.raft(3)?.snapshotMeta.index ?? 0 >= first.index)
        #expect(c.node(3)?.disk.snapshot == c.raft(3)?.snapshotMeta)
        // The leader restarts the newer transfer after its idle timeout; node 3 converges.
        #expect(Scenario.tickUntil(&c, limit: 50) { $0.raft(3)?.snapshotMeta == second } != nil)
        try c.put(1, key: 0, value: 1, client: 2, seq: 1)
        #expect(c.node(3)?.machine.digest == c.node(1)?.machine.digest)
        #expect(Scenario.values(c, 3, keys: 7) == Scenario.values(c, 1, keys: 7))
        #expect(c.violations.isEmpty)
    }

    /// Seed 31161. Appends the leader sent before it fell back to a snapshot overtake the stream:
    /// the follower receives, and acknowledges, the snapshot's last entry and entries after it
    /// before the snapshot's final chunk arrives. It must then drop the transfer and keep its log
    /// (the check runs at every chunk, not only the first): restoring would drop acknowledged
    /// entries, leaving the leader's match point ahead of the follower for good.
    @Test("31161: a follower that receives a snapshot's last entry by append during the transfer keeps its log at the final chunk")
    func appendsOvertakeSnapshotStream() throws {
        var c = try TestCluster(voters: 3) { $0.snapshotChunkBytes = 8 }
        try c.withNode(1) { (n: inout SimNode) throws(RaftError) in n.snapshotEvery = 5 }
        c.campaign(1)
        #expect(c.raft(3)?.commitIndex == 2)
        // Node 2's acknowledgements and everything for node 3 are delayed while 3…8 are proposed.
        c.hold { ($0.from == 2 && $0.to == 1) || ($0.from == 1 && $0.to == 3) }
        for i in 0..<6 { try c.put(1, key: i, value: Int64(10 + i), seq: UInt32(i + 1)) }
        let appends = c.held.filter { $0.to == 3 && !$0.appendEntries.isEmpty }
        #expect(appends.flatMap { $0.appendEntries.map(\.index) } == Array(3...8))
        #expect(appends.allSatisfy { if case let .append(_, _, _, commit) = $0.body { commit == 2 } else { false } })
        // Node 2's acknowledgements through 5 arrive (the rest are lost): 5 commits, and the
        // leader applies it and compacts there.
        c.release { $0.filter { if case .appendAccepted(let i, _) = $0.body { $0.from == 2 && i <= 5 } else { false } } }
        #expect(c.raft(1)?.commitIndex == 5)
        let snapshot = try #require(c.raft(1)?.snapshotMeta)
        #expect(snapshot.index == 5)
        // The last append reaches node 3 first: it refuses (it holds only 2), and the leader falls
        // back to node 3's match point (2), which it compacted: it streams its snapshot at 5.
        // Everything else for node 3 is delayed again, the stream's final chunk included.
        c.hold { $0.from == 1 && $0.to == 3 && !($0.isSnapshotChunk && !Self.isFinalChunk($0)) }
        let lastAppend = try #require(appends.last)
        c.inject(lastAppend)
        #expect(c.held.filter(Self.isFinalChunk).count == 1)
        #expect(c.delivered.contains { $0.to == 3 && $0.isSnapshotChunk && !Self.isFinalChunk($0) })  // the stream has begun
        #expect(c.raft(3)?.lastIndex == 2)
        #expect(c.raft(3)?.snapshotMeta.index == 0)
        // The delayed appends overtake the final chunk: node 3 holds and acknowledges 3…8, still
        // with commit 2, and the leader's match point for it becomes 8.
        for m in appends { c.inject(m) }
        #expect(c.raft(3)?.lastIndex == 8)
        #expect(c.raft(3)?.commitIndex == 2)
        #expect(c.raft(1)?.replicationStatus.first { $0.node == 3 }?.match == 8)
        // The final chunk arrives: node 3 already holds entry 5, so it keeps its log.
        c.release { $0.filter(Self.isFinalChunk) }
        #expect(c.raft(3)?.snapshotMeta.index == 0)
        #expect(c.raft(3)?.lastIndex == 8)
        #expect(c.raft(3)?.commitIndex ?? 0 >= 5)
        #expect(Self.terms(c, 3, 6...8) == Self.terms(c, 1, 6...8))
        // With the network healed, node 3 keeps up.
        c.hold(where: nil)
        try c.put(1, key: 6, value: 16, seq: 7)
        c.tickAll(times: 3)
        let last = try #require(c.raft(1)?.lastIndex)
        #expect(last == 9)
        #expect(c.raft(3)?.lastIndex == last)
        #expect(Self.terms(c, 3, 6...last) == Self.terms(c, 1, 6...last))
        #expect(c.raft(3)?.commitIndex == last)
        #expect(Scenario.values(c, 3, keys: 7) == Scenario.values(c, 1, keys: 7))
        #expect(c.node(3)?.machine.digest == c.node(1)?.machine.digest)
        #expect(c.violations.isEmpty)
    }
}
