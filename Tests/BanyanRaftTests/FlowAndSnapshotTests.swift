import BanyanRaft
import BanyanStateMachine
import Testing

/// Flow control (R25), after etcd's raft_flow_control_test.go and TestUncommittedEntryLimit.
@Suite struct FlowControlTests {
    static func appendsTo3(_ messages: [Message]) -> [[UInt64]] {
        messages.filter { $0.to == 3 && $0.isAppend && !$0.appendEntries.isEmpty }.map { $0.appendEntries.map(\.index) }
    }

    @Test("with two appends in flight a slow follower gets no more until it acknowledges; acks and heartbeat replies slide the window")
    func inflightWindow() throws {
        var c = try TestCluster(voters: 3) {
            $0.maxInflightMessages = 2
            $0.maxMessageBytes = 1  // one entry per append
        }
        c.campaign(1)
        c.hold { $0.from == 1 && $0.to == 3 && $0.isAppend }
        for i in 0..<5 { try c.put(1, key: i, value: Int64(i), seq: UInt32(i + 1)) }  // indexes 3…7
        #expect(c.raft(1)?.commitIndex == 7)  // node 2 keeps up
        #expect(Self.appendsTo3(c.held) == [[3], [4]])
        // Deliver the two: each acknowledgement frees one slot and the next entry goes out.
        c.release()
        #expect(Self.appendsTo3(c.held) == [[5], [6]])
        #expect(c.raft(3)?.lastIndex == 4)
        // A stale acknowledgement does not free a slot.
        c.inject(Message(from: 3, to: 1, term: 2, body: .appendAccepted(index: 4)))
        #expect(Self.appendsTo3(c.held) == [[5], [6]])
        // A heartbeat reply from a follower whose window is full frees one slot.
        c.tick(1)
        #expect(Self.appendsTo3(c.held) == [[5], [6], [7]])
        c.hold(where: nil)
        c.release()
        c.tick(1)
        #expect(c.logTerms(3) == c.logTerms(1))
        #expect(Scenario.values(c, 3, keys: 5) == [0, 1, 2, 3, 4])
        #expect(c.violations.isEmpty)
    }

    @Test("past maxUncommittedBytes the leader refuses proposals with uncommittedLimit instead of growing its log")
    func uncommittedLimit() throws {
        let put = Register.put(key: 0, value: 1, seq: 1).encoded().count  // every put below has this size
        var c = try TestCluster(voters: 3) { $0.maxUncommittedBytes = 2 * put + put / 2 }
        c.campaign(1)
        c.cutLinks = [.init(from: 1, to: 2), .init(from: 1, to: 3)]
        try c.put(1, key: 0, value: 1, seq: 1)
        try c.put(1, key: 1, value: 2, seq: 2)
        #expect(throws: RaftError.uncommittedLimit(bytes: 2 * put)) { try c.put(1, key: 2, value: 3, seq: 3) }
        #expect(c.raft(1)?.lastIndex == 4)
        #expect(c.raft(1)?.commitIndex == 2)
        // Once the entries commit the budget is free again.
        c.heal()
        c.tick(1)
        #expect(c.raft(1)?.commitIndex == 4)
        try c.put(1, key: 2, value: 3, seq: 3)
        #expect(Scenario.values(c, 2, keys: 3) == [1, 2, 3])
        #expect(c.violations.isEmpty)
    }
}

/// Snapshots and compaction (R14), after etcd's raft_snap_test.go,
/// slow_follower_after_compaction.txt and TestRestoreIgnoreSnapshot.
@Suite struct SnapshotTests {
    static func compactingCluster() throws -> TestCluster {
        var c = try TestCluster(voters: 3) { $0.snapshotChunkBytes = 16 }
        for id: NodeID in 1...3 { try c.withNode(id) { (n: inout SimNode) throws(RaftError) in n.snapshotEvery = 5 } }
        c.campaign(1)
        c.crash(3)
        for i in 0..<20 { try c.put(1, key: i % 7, value: Int64(100 + i), seq: UInt32(i + 1)) }
        #expect(try #require(c.raft(1)?.firstIndex) > 3)  // the leader compacted past node 3's log
        #expect(c.raft(3)?.lastIndex == 2)
        return c
    }

    @Test("a follower that was down while the leader compacted receives the snapshot in several chunks and converges")
    func slowFollowerGetsSnapshot() throws {
        var c = try Self.compactingCluster()
        try c.restart(3)
        let mark = c.delivered.count
        c.tickAll(times: 3)
        let chunks = c.delivered(since: mark).filter { $0.to == 3 && $0.isSnapshotChunk }
        #expect(chunks.count >= 3)
        for m in chunks {
            guard case let .snapshotChunk(_, _, data, _) = m.body else { continue }
            #expect(data.count <= 16)
        }
        #expect(try #require(c.raft(3)?.snapshotMeta.index) > 2)
        #expect(c.node(3)?.disk.snapshot == c.raft(3)?.snapshotMeta)
        #expect(c.node(3)?.machine.digest == c.node(1)?.machine.digest)
        #expect(Scenario.values(c, 3, keys: 7) == Scenario.values(c, 1, keys: 7))
        try c.put(1, key: 0, value: 1, client: 2, seq: 1)
        #expect(c.node(3)?.machine.value(0) == 1)
        #expect(c.violations.isEmpty)
    }

    @Test("a follower that crashes part-way through a snapshot transfer restarts it and still converges")
    func crashMidSnapshot() throws {
        var c = try Self.compactingCluster()
        try c.restart(3)
        c.hold { m in
            if case let .snapshotChunk(_, offset, _, _) = m.body { return offset >= 48 }
            return false
        }
        c.tickAll()
        #expect(c.held.count == 1)
        #expect(c.raft(3)?.snapshotMeta.index == 0)  // three chunks in, nothing installed
        c.crash(3)
        c.hold(where: nil)
        c.release()  // lost: node 3 is down
        try c.restart(3)
        let mark = c.delivered.count
        c.tickAll(times: 25)  // the leader's stalled transfer restarts after an election timeout
        let restarts = c.delivered(since: mark).filter {
            if case let .snapshotChunk(_, offset, _, _) = $0.body { return $0.to == 3 && offset == 0 }
            return false
        }
        #expect(!restarts.isEmpty)
        #expect(c.node(3)?.machine.digest == c.node(1)?.machine.digest)
        #expect(c.logTerms(3).suffix(3) == c.logTerms(1).suffix(3))
        #expect(c.violations.isEmpty)
    }

    @Test("a snapshot older than the follower's commit index is ignored and acknowledged at the commit index")
    func staleSnapshotIgnored() throws {
        var c = try TestCluster(voters: 3)
        // Node 2 compacts its own log past index 4, so it cannot match the stale snapshot's entry.
        try c.withNode(2) { (n: inout SimNode) throws(RaftError) in n.snapshotEvery = 5 }
        c.campaign(1)
        for i in 0..<5 { try c.put(1, key: i, value: Int64(i), seq: UInt32(i + 1)) }
        #expect(c.raft(2)?.commitIndex == 7)
        #expect(try #require(c.raft(2)?.snapshotMeta.index) >= 5)
        let before = try #require(c.node(2))
        let beforeDisk = before.disk  // read now: copies of a node share its disk
        let terms = c.logTerms(2)
        let meta = SnapshotMeta(index: 4, term: 2, membership: Membership(voters: [1, 2, 3]))
        c.hold { $0.from == 2 }
        c.inject(Message(from: 1, to: 2, term: 2, body: .snapshotChunk(meta: meta, offset: 0, data: [1, 2, 3], last: true)))
        #expect(c.held.map(\.body) == [.appendAccepted(index: 7)])
        #expect(c.raft(2)?.snapshotMeta == before.raft.snapshotMeta)
        #expect(c.node(2)?.disk == beforeDisk)
        #expect(c.node(2)?.machine.digest == before.machine.digest)
        #expect(c.logTerms(2) == terms)
        #expect(c.raft(2)?.lastIndex == 7)
        c.hold(where: nil)
        c.release()
        #expect(c.violations.isEmpty)
    }
}

/// Persist before send (R26), after etcd #14370 / #14394.
@Suite struct PersistenceTests {
    @Test("only a leader's replication and a follower's forwarding, in a durable term, may go out before a batch is persisted (§10.2.1); acknowledgements wait")
    func leaderSendsAppendsBeforePersisting() throws {
        let boot = RaftNode.bootstrapState(members: [1, 2, 3])
        var nodes: [NodeID: RaftNode] = [:]
        for id: NodeID in [1, 2, 3] { nodes[id] = try RaftNode(configuration: RaftConfiguration(id: id, seed: id), restoring: boot) }
        var earlySeen = 0
        /// Runs every node's Ready loop and delivers messages until quiet, checking each Ready.
        func settle() {
            for _ in 0..<100 {
                var network: [Message] = []
                for id: NodeID in [1, 2, 3] {
                    guard var n = nodes[id] else { continue }
                    while n.hasReady {
                        let rd = n.ready()
                        if rd.sendBeforePersist > 0 {
                            earlySeen += 1
                            #expect(rd.hardState.map { $0.term == n.term } ?? true)
                            for m in rd.messages.prefix(rd.sendBeforePersist) {
                                switch m.body {
                                case .append, .heartbeat, .snapshotChunk: #expect(n.role == .leader)
                                case .proposal, .readIndex: break
                                default: Issue.record("sent before persisting: \(m.body)")
                                }
                            }
                        }
                        if rd.hardState.map({ $0.vote != 0 && $0.term > 1 }) == true && n.role != .leader {
                            #expect(rd.sendBeforePersist == 0)
                        }
                        network.append(contentsOf: rd.messages)
                        n.advance(rd)
                    }
                    nodes[id] = n
                }
                if network.isEmpty { return }
                for m in network { nodes[m.to]?.step(m) }
            }
        }
        nodes[1]?.campaign()
        settle()
        #expect(nodes[1]?.role == .leader)
        guard var leader = nodes[1] else { return }
        let committed = leader.commitIndex
        _ = try leader.propose([7, 7])
        let rd = leader.ready()
        #expect(rd.entries.count == 1)
        #expect(rd.sendBeforePersist == 2)
        let early = Array(rd.messages.prefix(rd.sendBeforePersist))
        #expect(Set(early.map(\.to)) == [2, 3])
        for m in early {
            guard case .append(_, _, let entries, _) = m.body else {
                Issue.record("expected an append, got \(m.body)")
                continue
            }
            #expect(entries.map(\.index) == rd.entries.map(\.index))
        }
        // Both followers acknowledge before the leader's own write finishes: a quorum without the
        // leader commits the entry, which is safe because two of three have it durable.
        for m in early {
            guard var f = nodes[m.to] else { continue }
            f.step(m)
            let frd = f.ready()
            f.advance(frd)
            for reply in frd.messages where reply.to == 1 { leader.step(reply) }
            nodes[m.to] = f
        }
        #expect(leader.commitIndex == committed + 1)
        // The committed entry is handed to apply only in a later Ready, after this one is persisted.
        #expect(!rd.committedEntries.contains { $0.index == committed + 1 })
        leader.advance(rd)
        let next = leader.ready()
        #expect(next.committedEntries.map(\.index).contains(committed + 1))
        leader.advance(next)
        #expect(earlySeen > 0)

        // A follower forwards a client's proposal while it persists entries from the leader;
        // its acknowledgement of those entries still waits for the persist.
        guard var follower = nodes[2] else { return }
        _ = try leader.propose([8, 8])
        let lrd = leader.ready()
        guard let append = lrd.messages.first(where: { $0.to == 2 }) else {
            Issue.record("no append for node 2")
            return
        }
        follower.step(append)
        _ = try follower.propose([9, 9])
        let asked = follower.readIndex(context: 77)
        #expect(asked)
        let frd = follower.ready()
        #expect(!frd.entries.isEmpty)
        #expect(frd.sendBeforePersist == 2)
        let kinds = frd.messages.prefix(frd.sendBeforePersist).map { m -> String in
            switch m.body {
            case .proposal(let commands): return "proposal \(commands)"
            case .readIndex(let context): return "readIndex \(context)"
            default: return "\(m.body)"
            }
        }
        #expect(kinds == ["proposal [[9, 9]]", "readIndex 77"])
        #expect(frd.messages.prefix(frd.sendBeforePersist).allSatisfy { $0.to == 1 })
        let acks = frd.messages.dropFirst(frd.sendBeforePersist).filter { if case .appendAccepted = $0.body { true } else { false } }
        #expect(acks.count == 1)
        follower.advance(frd)
        leader.advance(lrd)
    }

    @Test("a single-node leader commits and applies a proposal only after the driver persisted it")
    func singleNodeCommitsAfterPersist() throws {
        var raft = try RaftNode(
            configuration: RaftConfiguration(id: 1, seed: 1), restoring: RaftNode.bootstrapState(members: [1])
        )
        raft.campaign()
        #expect(raft.role == .leader)
        var rd = raft.ready()
        raft.advance(rd)
        while raft.hasReady {
            rd = raft.ready()
            raft.advance(rd)
        }
        #expect(raft.commitIndex == 2)
        try raft.propose([9, 9, 9])
        #expect(raft.lastIndex == 3)
        #expect(raft.commitIndex == 2)  // not durable yet
        rd = raft.ready()
        #expect(rd.entries.map(\.index) == [3])
        #expect(!rd.committedEntries.contains { $0.index == 3 })
        #expect(raft.commitIndex == 2)
        raft.advance(rd)  // the driver reports the entry durable
        #expect(raft.commitIndex == 3)
        rd = raft.ready()
        #expect(rd.committedEntries.map(\.index) == [3])
        #expect(rd.hardState?.commit == 3)
        raft.advance(rd)
    }

    @Test("in a one-node cluster the put is on disk before it applies, and a crash before the write loses it unapplied (R26)")
    func singleNodeClusterPersistsFirst() throws {
        var c = try TestCluster(voters: 1)
        c.campaign(1)
        try c.put(1, key: 0, value: 7, seq: 1)
        #expect(c.node(1)?.machine.value(0) == 7)
        let disk = try #require(c.node(1)?.disk)
        #expect(disk.entries.map(\.index) == [1, 2, 3])
        #expect(disk.entries.last?.kind == .command)
        // The commit index is saved lazily (`NodeStorage.persist`): a restart learns it again.
        #expect(disk.hardState.commit == 1)
        // The next put's batch crashes before its entry reaches the disk: nothing applies.
        let envelope = Register.put(key: 0, value: 8, seq: 2)
        let out = try c.withNode(1) { (n: inout SimNode) throws(RaftError) -> SimNode.Output in
            try n.propose([envelope.encoded()])
            return n.process(persistBudget: 0)
        }
        #expect(out?.crashed == true)
        #expect(out?.applied.isEmpty == true)
        #expect(c.node(1)?.machine.value(0) == 7)
        c.crash(1)
        try c.restart(1)
        c.tickAll(times: 25)
        #expect(c.leader == 1)
        #expect(c.node(1)?.machine.value(0) == 7)
        #expect(c.node(1)?.disk.entries.contains { $0.data == envelope.encoded() } == false)
        #expect(c.violations.isEmpty)
    }
}
