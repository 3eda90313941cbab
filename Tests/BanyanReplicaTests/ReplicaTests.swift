import BanyanRaft
import BanyanReplica
import BanyanStateMachine
import BanyanTree
import Testing

func elect(_ c: inout ReplicaCluster) throws -> NodeID {
    let leader = c.electLeader()
    return try #require(leader)
}

@Suite struct ReplicaTests {
    @Test("a write through a follower reaches the leader, applies on every node, and its server timestamp is the leader's clock")
    func forwardedWriteUsesLeaderClock() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let follower = try #require([1, 2, 3].first { $0 != leader })
        let leaderClock = try #require(c.clocks[leader])
        let q = c.write(via: follower, "/t", #"{".sv":"timestamp"}"#)
        c.settle()
        let outcome = try #require(c.writeOutcome(q, on: follower))
        let applied = try outcome.get()
        #expect(applied.outcome == .ok)
        #expect(applied.namespace == "app")
        // Clocks are 1,000,000 ms apart per node id: the stamp is the leader's, not the follower's.
        #expect(applied.value.map { JSONWriter.string($0) } == "\(leaderClock)")
        for id: NodeID in [1, 2, 3] {
            #expect(c.value(id, "/t") == "\(leaderClock)")
        }
    }

    @Test("a forwarded proposal delivered twice, or retried after it was lost, applies exactly once")
    func exactlyOnceAcrossRetries() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let follower = try #require([1, 2, 3].first { $0 != leader })
        // Duplicate every forwarded proposal.
        var duplicated = 0
        let q1 = c.write(via: follower, "/n", #"{".sv":{"increment":1}}"#)
        c.process(follower)
        let proposals = c.network.filter { if case .proposal = $0.body { return true } else { return false } }
        #expect(proposals.count == 1)
        c.network.append(contentsOf: proposals)
        duplicated += proposals.count
        c.settle()
        #expect(try c.writeOutcome(q1, on: follower)?.get().outcome == .ok)
        for id: NodeID in [1, 2, 3] { #expect(c.value(id, "/n") == "1") }

        // Drop the next proposal on the way to the leader: the retry timer proposes it again.
        let drops = c.dropFirstProposal()
        let q2 = c.write(via: follower, "/n", #"{".sv":{"increment":1}}"#)
        c.settle()
        #expect(c.writeOutcome(q2, on: follower) == nil)
        c.tick(8)
        #expect(drops.count == 1)
        #expect(try c.writeOutcome(q2, on: follower)?.get().outcome == .ok)
        for id: NodeID in [1, 2, 3] { #expect(c.value(id, "/n") == "2") }
        #expect(duplicated == 1)
    }

    @Test("a session's writes apply once each even when a retry is ordered after a later write")
    func gapsInSessionSequences() throws {
        var m = StateMachine()
        func env(_ seq: UInt64) -> [UInt8] {
            CommandEnvelope(namespace: "a", session: 9, seq: seq, timestamp: 0, command: .set(path: "/k\(seq)", json: Array("\(seq)".utf8))).encoded()
        }
        #expect(m.apply(env(2), index: 1)?.outcome == .ok)
        #expect(m.apply(env(1), index: 2)?.outcome == .ok)  // the earlier write, retried, lands later
        #expect(m.apply(env(2), index: 3)?.outcome == .duplicate)
        #expect(m.apply(env(1), index: 4)?.outcome == .duplicate)
        #expect(m.apply(env(4), index: 5)?.outcome == .ok)
        #expect(m.sessions[9] == SessionRecord(contiguous: 2, above: [4]))
        #expect(m.apply(env(3), index: 6)?.outcome == .ok)
        #expect(m.sessions[9] == SessionRecord(contiguous: 4))
        let restored = try StateMachine(image: m.image())
        #expect(restored.sessions == m.sessions)
    }

    @Test("namespaces are independent trees; the image keeps them all")
    func namespaces() throws {
        var c = try ReplicaCluster(nodes: 1)
        _ = try elect(&c)
        _ = c.write(via: 1, "/x", "1", namespace: "alpha")
        _ = c.write(via: 1, "/x", "2", namespace: "beta")
        c.settle()
        #expect(c.value(1, "/x", namespace: "alpha") == "1")
        #expect(c.value(1, "/x", namespace: "beta") == "2")
        #expect(c.value(1, "/x", namespace: "gamma") == "null")
        let machine = try #require(c.replicas[1]?.machine)
        let restored = try StateMachine(image: machine.image())
        #expect(restored.namespaces == machine.namespaces)
        #expect(restored.lastTimestamp == machine.lastTimestamp)
    }

    @Test("a linearizable read through a follower sees a write acknowledged through another node")
    func readYourWritesAcrossNodes() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let others = [1, 2, 3].filter { $0 != leader }.map { NodeID($0) }
        // Hold back appends to the second follower so that its state machine lags.
        c.filter = { m in
            if m.to == others[1], case .append = m.body { return false }
            return true
        }
        let w = c.write(via: others[0], "/v", #""new""#)
        c.settle()
        #expect(try c.writeOutcome(w, on: others[0])?.get().outcome == .ok)
        #expect(c.value(others[1], "/v") == "null")
        // The read must not be served from the lagging state machine.
        let r = c.read(via: others[1])
        c.settle()
        #expect(!c.readReady(r, on: others[1]))
        c.filter = { _ in true }
        c.tick(3)
        #expect(c.readReady(r, on: others[1]))
        #expect(c.value(others[1], "/v") == #""new""#)
    }

    @Test("a node cut off from the cluster fails its writes and reads with a timeout, and the write stays at most once")
    func timeouts() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let follower = try #require([1, 2, 3].map { NodeID($0) }.first { $0 != leader })
        c.filter = { m in m.from != follower && m.to != follower }
        let w = c.write(via: follower, "/lost", "1")
        let r = c.read(via: follower)
        c.tick(70)
        #expect(c.writeOutcome(w, on: follower) == .failure(.timedOut(write: true)))
        #expect(c.readFailed(r, on: follower) == .timedOut(write: false))
        c.filter = { _ in true }
        c.tick(20)
        for id: NodeID in [1, 2, 3] { #expect(c.value(id, "/lost") == "null") }
    }

    @Test("server timestamps never go backwards in log order, even when the leader's clock does")
    func timestampsMonotonic() throws {
        var c = try ReplicaCluster(nodes: 1)
        _ = try elect(&c)
        _ = c.write(via: 1, "/a", #"{".sv":"timestamp"}"#)
        c.settle()
        c.clocks[1] = 5  // the clock jumps back
        c.tick()
        _ = c.write(via: 1, "/b", #"{".sv":"timestamp"}"#)
        c.settle()
        let a = try #require(Int64(c.value(1, "/a")))
        let b = try #require(Int64(c.value(1, "/b")))
        #expect(b >= a)
    }

    @Test("snapshots are scheduled as entries apply, the log is compacted, and a new learner catches up from a snapshot")
    func snapshotsAndCatchUp() throws {
        var c = try ReplicaCluster(nodes: 3, snapshotEntries: 10)
        let leader = try elect(&c)
        for i in 0..<45 {
            _ = c.write(via: NodeID(i % 3 + 1), "/items/k\(i)", "\(i)")
            c.settle()
        }
        for id: NodeID in [1, 2, 3] {
            #expect((c.snapshotsWritten[id] ?? 0) >= 3, "node \(id) wrote \(c.snapshotsWritten[id] ?? 0) snapshots")
            #expect((c.replicas[id]?.raft.snapshotMeta.index ?? 0) >= 30)
        }
        try c.addBlank(4)
        let q = c.request()
        c.replicas[leader]?.changeMembership(q, .addLearner(4))
        c.tick(30)
        #expect((c.events[leader] ?? []).contains { if case .membershipChanged(q, _) = $0 { return true } else { return false } })
        #expect((c.events[4] ?? []).contains { if case .restoredFromSnapshot = $0 { return true } else { return false } })
        let expected = c.value(leader, "/items")
        #expect(c.value(4, "/items") == expected)
        #expect(c.replicas[4]?.machine.tree("app") == c.replicas[leader]?.machine.tree("app"))
        // Auto-promotion made it a voter.
        #expect(c.replicas[leader]?.raft.membership.isVoter(4) == true)
    }

    @Test("snapshots are also taken by the bytes of log applied, or the last image's size if larger, so the log held stays bounded")
    func snapshotsByLogBytes() throws {
        // Values of 1,000 characters that do not compress much (to about 760 bytes each): the
        // image bound counts the snapshot file's bytes.
        func value(_ seed: Int) -> String { ReplicaCluster.noise(seed, length: 1_000) }
        // By entries never (0); by bytes every 4 KiB, or the last image's size if larger.
        var c = try ReplicaCluster(nodes: 3) { $0.snapshotLogBytes = 4_096 }
        let leader = try elect(&c)
        for i in 0..<40 {
            _ = c.write(via: leader, "/small/k\(i % 2)", value(i))
            c.settle()
        }
        for id: NodeID in [1, 2, 3] {
            let taken = c.snapshotsWritten[id] ?? 0
            // About 41 KB applied, images about 2 KB: a snapshot every 4 entries or so.
            #expect(taken >= 6 && taken <= 12, "node \(id) wrote \(taken) snapshots")
            let r = try #require(c.replicas[id])
            #expect(r.logBytesSinceSnapshot < r.snapshotByteBound + 1_100)
            #expect(r.machine.appliedIndex - r.raft.snapshotMeta.index <= 6)
        }
        // The state grows to 40 KB (a file of about 30 KB): the bound grows with the image, so rewriting it costs few
        // snapshots (by 4 KiB alone it would take about ten).
        for i in 0..<40 {
            _ = c.write(via: leader, "/large/k\(i)", value(100 + i))
            c.settle()
        }
        let before = c.snapshotsWritten
        for i in 0..<40 {
            _ = c.write(via: leader, "/large/k\(i)", value(200 + i))
            c.settle()
        }
        for id: NodeID in [1, 2, 3] {
            let r = try #require(c.replicas[id])
            #expect(r.snapshotImageBytes > 28_000)
            let taken = (c.snapshotsWritten[id] ?? 0) - (before[id] ?? 0)
            #expect(taken >= 1 && taken <= 2, "node \(id) wrote \(taken) snapshots while 41 KB were rewritten")
        }
        // Neither bound: no snapshot at all.
        var off = try ReplicaCluster(nodes: 3) { $0.snapshotLogBytes = 0 }
        let offLeader = try elect(&off)
        for i in 0..<20 {
            _ = off.write(via: offLeader, "/k\(i % 2)", ReplicaCluster.noise(i, length: 1_000))
            off.settle()
        }
        #expect(off.snapshotsWritten.values.reduce(0, +) == 0)
    }

    @Test("a restarted node recovers from its snapshot and log, and its new session's writes are not mistaken for old ones")
    func restart() throws {
        var c = try ReplicaCluster(nodes: 3, snapshotEntries: 5)
        let leader = try elect(&c)
        let follower = try #require([1, 2, 3].map { NodeID($0) }.first { $0 != leader })
        for i in 0..<12 {
            _ = c.write(via: follower, "/k\(i)", "\(i)")
            c.settle()
        }
        try c.restart(follower, session: 77)
        c.tick(5)
        let q = c.write(via: follower, "/after", "true")
        c.settle()
        #expect(try c.writeOutcome(q, on: follower)?.get().outcome == .ok)
        #expect(c.replicas[follower]?.machine.tree("app") == c.replicas[leader]?.machine.tree("app"))
        #expect(c.value(follower, "/k11") == "11")
    }

    @Test("membership changes through a follower are refused with the leader's id")
    func membershipOnFollower() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let follower = try #require([1, 2, 3].map { NodeID($0) }.first { $0 != leader })
        let q = c.request()
        c.replicas[follower]?.changeMembership(q, .addLearner(9))
        for e in c.replicas[follower]?.takeEvents() ?? [] { c.events[follower, default: []].append(e) }
        #expect(c.readFailed(q, on: follower) == .notLeader(leader: leader))
    }
}
