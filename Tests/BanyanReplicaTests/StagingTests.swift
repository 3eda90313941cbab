import BanyanBasics
import BanyanNode
import BanyanOpLogFiles
import BanyanRaft
import BanyanReplica
import BanyanStateMachine
import BanyanTree
import Testing

/// Staged payloads (docs/staged-payloads.md): commands at or over the threshold are stored on a
/// quorum first, and the log carries a small reference in their place.
@Suite struct StagingTests {
    static func cluster(nodes: Int = 3, snapshotEntries: UInt64 = 0) throws -> (ReplicaCluster, NodeID) {
        var c = try ReplicaCluster(nodes: nodes, snapshotEntries: snapshotEntries) { configuration in
            configuration.stagingThreshold = 300
            configuration.largeEntryBytes = 300
        }
        let elected = c.electLeader()
        let leader = try #require(elected)
        c.tick(3)
        return (c, leader)
    }

    /// A JSON string of about `length` bytes (over the threshold).
    static func big(_ seed: Int, _ length: Int = 600) -> String { ReplicaCluster.noise(seed, length: length) }

    static func references(_ c: ReplicaCluster, _ id: NodeID) -> [StagedReference] {
        guard let r = c.replicas[id] else { return [] }
        return (r.raft.firstIndex...max(r.raft.firstIndex, r.raft.lastIndex)).compactMap { index in
            r.raft.entry(at: index).flatMap { $0.kind == .command ? StagedReference(decoding: $0.data) : nil }
        }
    }

    static func ok(_ c: ReplicaCluster, _ q: RequestID, on id: NodeID) -> Bool {
        if case .success(let applied)? = c.writeOutcome(q, on: id) { return applied.outcome == .ok }
        return false
    }

    @Test("a large write is staged on every node and its log entry is a reference; a small one is proposed as before")
    func stagedAndReferenced() throws {
        var (c, leader) = try Self.cluster()
        let value = Self.big(1)
        let large = c.write(via: leader, "/big", value)
        let small = c.write(via: leader, "/small", "1")
        c.tick(2)
        #expect(Self.ok(c, large, on: leader) && Self.ok(c, small, on: leader))
        for id in c.replicas.keys.sorted() {
            #expect(c.value(id, "/big") == value, "node \(id)")
            #expect(c.value(id, "/small") == "1", "node \(id)")
            let references = Self.references(c, id)
            #expect(references.count == 1, "node \(id)")
            // The log holds no entry as large as the payload.
            let entries = c.storedEntries(id)
            #expect(entries.allSatisfy { $0.data.count < 300 }, "node \(id)")
            if let reference = references.first {
                #expect(c.storages[id]?.staged.load(reference.id) != .missing, "node \(id)")
                #expect(reference.length > 600)
            }
        }
        let counts = try #require(c.replicas[leader]?.stagingCounts)
        #expect(counts.started == 1 && counts.referenced == 1 && counts.abandoned == 0)
    }

    @Test("a follower that missed the staging drops the append naming it, fetches the payload from the leader, then accepts")
    func followerFetches() throws {
        var (c, leader) = try Self.cluster()
        let follower = try #require(c.replicas.keys.sorted().first { $0 != leader })
        c.filter = { m in
            if case .stage = m.body, m.to == follower { return false }
            return true
        }
        let value = Self.big(2)
        let q = c.write(via: leader, "/big", value)
        // The leader waits `retryTicks` for the member that never answers, then references it;
        // the follower waits half an interval for a `stage` in flight before it fetches.
        c.tick(15)
        #expect(Self.ok(c, q, on: leader))
        let counts = try #require(c.replicas[follower]?.stagingCounts)
        #expect(counts.appendsHeld >= 1, "the append naming the payload was held")
        #expect(counts.fetched == 1)
        #expect(c.value(follower, "/big") == value)
        let reference = try #require(Self.references(c, follower).first)
        #expect(c.replicas[follower]?.holdsStaged(reference.id) == true)
    }

    @Test("the reference waits for a quorum of holders: with no follower storing it, the log takes nothing until one does")
    func waitsForQuorum() throws {
        var (c, leader) = try Self.cluster()
        let followers = c.replicas.keys.sorted().filter { $0 != leader }
        c.holdStoresOn = Set(followers)
        let lastBefore = try #require(c.replicas[leader]?.raft.lastIndex)
        let q = c.write(via: leader, "/big", Self.big(3))
        c.tick(2)
        #expect(c.replicas[leader]?.raft.lastIndex == lastBefore, "no reference before a quorum holds the payload")
        #expect(c.writeOutcome(q, on: leader) == nil)
        c.answerStores(followers[0])
        // A quorum holds it now; the other member is waited for until `retryTicks` (5) since
        // the staging began.
        c.tick(6)
        #expect(Self.ok(c, q, on: leader))
        #expect(c.replicas[leader]?.raft.lastIndex == lastBefore + 1)
    }

    @Test("a staging no member acknowledges ends at its deadline: the write fails and no log holds it")
    func deadline() throws {
        var (c, leader) = try Self.cluster()
        c.filter = { m in
            if case .stage = m.body { return false }
            return true
        }
        let lastBefore = try #require(c.replicas[leader]?.raft.lastIndex)
        let q = c.write(via: leader, "/big", Self.big(4))
        c.tick(70)
        guard case .failure? = c.writeOutcome(q, on: leader) else {
            Issue.record("the write did not fail: \(String(describing: c.writeOutcome(q, on: leader)))")
            return
        }
        #expect(c.replicas[leader]?.raft.lastIndex == lastBefore)
        #expect((c.replicas[leader]?.stagingCounts.abandoned ?? 0) >= 1)
        #expect(c.value(leader, "/big") == "null")
    }

    @Test("a follower restarted after a power loss replays the reference from its staged store")
    func replayAfterRestart() throws {
        var (c, leader) = try Self.cluster()
        let follower = try #require(c.replicas.keys.sorted().first { $0 != leader })
        let value = Self.big(5)
        let q = c.write(via: leader, "/big", value)
        c.tick(3)
        #expect(Self.ok(c, q, on: leader))
        try c.restart(follower, session: 77)
        c.tick(5)
        #expect(c.value(follower, "/big") == value)
        #expect(c.replicas[follower]?.stagingCounts.fetched == 0, "read from its own store")
    }

    @Test("a staged file is kept while the log names it and removed once a snapshot covers its reference")
    func removal() throws {
        var (c, leader) = try Self.cluster(snapshotEntries: 5)
        let q = c.write(via: leader, "/big", Self.big(6))
        c.tick(3)
        #expect(Self.ok(c, q, on: leader))
        let id = try #require(Self.references(c, leader).first?.id)
        // Long past the age at which unnamed files go, the named one stays.
        c.tick(150)
        for node in c.replicas.keys.sorted() {
            #expect(c.storages[node]?.staged.load(id) != .missing, "node \(node) kept the named file")
        }
        // Small writes until a snapshot covers the reference and compacts it away.
        for i in 0..<12 {
            _ = c.write(via: leader, "/n\(i)", "\(i)")
            c.tick()
        }
        c.tick(130)
        for node in c.replicas.keys.sorted() {
            #expect(Self.references(c, node).isEmpty, "node \(node): compacted")
            #expect(c.storages[node]?.staged.load(id) == .missing, "node \(node) removed the file")
        }
        #expect(c.value(leader, "/big") == Self.big(6))
    }

    @Test("a payload lost from a follower's disk is fetched from the other members before its reference applies")
    func lostFileFetched() throws {
        var (c, leader) = try Self.cluster()
        let follower = try #require(c.replicas.keys.sorted().first { $0 != leader })
        // The follower accepts the append but applies nothing yet: its read-ahead is held.
        c.holdReadAheads = true
        let value = Self.big(7)
        let q = c.write(via: leader, "/big", value)
        c.tick(2)
        #expect(Self.ok(c, q, on: leader) || c.writeOutcome(q, on: leader) == nil)
        let id = try #require(Self.references(c, follower).first?.id)
        // Damage: the file goes, and the follower restarts (its read-ahead is lost with it).
        try c.storages[follower]?.staged.remove([id])
        try c.restart(follower, session: 78)
        c.holdReadAheads = false
        c.tick(10)
        #expect(c.value(follower, "/big") == value)
        #expect((c.replicas[follower]?.stagingCounts.fetched ?? 0) >= 1)
    }

    @Test("archives carry payloads inline: a log replayed from its archived entries holds the staged write; a payload gone is named")
    func inlineForArchives() throws {
        var (c, leader) = try Self.cluster()
        let value = Self.big(8)
        let q = c.write(via: leader, "/big", value)
        c.tick(3)
        #expect(Self.ok(c, q, on: leader))
        let r = try #require(c.replicas[leader])
        let store = try #require(c.storages[leader]?.staged)
        let entries = (r.raft.firstIndex...r.raft.lastIndex).compactMap { r.raft.entry(at: $0) }.map { e in
            ArchivedEntry(index: e.index, term: e.term, kind: e.kind == .command ? .command : .noop, payload: e.data)
        }
        #expect(entries.contains { StagedReference.isReference($0.payload) })
        guard case .success(let inlined) = NodeCore.inlineStaged(entries, store: store) else {
            Issue.record("the payload was not found")
            return
        }
        #expect(!inlined.contains { StagedReference.isReference($0.payload) })
        var machine = StateMachine()
        machine.skip(index: r.raft.firstIndex - 1)
        for e in inlined {
            if e.kind == .command { _ = machine.apply(e.payload, index: e.index) } else { machine.skip(index: e.index) }
        }
        #expect(JSONWriter.string(machine.tree("app").child(at: try Path(parsing: "/big"))) == value)
        let reference = try #require(Self.references(c, leader).first)
        try store.remove([reference.id])
        guard case .failure(let missing) = NodeCore.inlineStaged(entries, store: store) else {
            Issue.record("a removed payload was inlined")
            return
        }
        #expect(missing.id == reference.id)
    }
}
