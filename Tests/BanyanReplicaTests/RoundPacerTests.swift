import BanyanRaft
import BanyanReplica
import BanyanStateMachine
import Testing

@Suite struct RoundPacerTests {
    let ms: UInt64 = 1_000_000

    @Test("under load the leader starts a round at most once per interval, and waits only the rest of it")
    func pacesRoundsUnderLoad() {
        var p = RoundPacer(interval: 800_000)
        #expect(p.wait(now: 10 * ms, isLeader: true) == nil)  // nothing started yet
        p.roundStarted(now: 10 * ms, entries: 12)
        #expect(p.wait(now: 10 * ms, isLeader: true) == 800_000)
        #expect(p.wait(now: 10 * ms + 300_000, isLeader: true) == 500_000)
        #expect(p.wait(now: 10 * ms + 800_000, isLeader: true) == nil)
        #expect(p.wait(now: 11 * ms, isLeader: true) == nil)
        // A follower never paces (its rounds follow the leader's appends).
        #expect(p.wait(now: 10 * ms + 100_000, isLeader: false) == nil)
    }

    @Test("a lone write is never held: after a round of one entry the next starts at once")
    func loneWritesAreNotHeld() {
        var p = RoundPacer(interval: 800_000)
        p.roundStarted(now: 5 * ms, entries: 1)
        #expect(p.wait(now: 5 * ms + 10_000, isLeader: true) == nil)
        p.roundStarted(now: 6 * ms, entries: 2)
        #expect(p.wait(now: 6 * ms + 10_000, isLeader: true) == 790_000)
    }

    @Test("no pacing with interval 0, after a reset, or if the clock reads earlier than the last start")
    func offAndReset() {
        var off = RoundPacer(interval: 0)
        off.roundStarted(now: ms, entries: 50)
        #expect(off.wait(now: ms, isLeader: true) == nil)
        var p = RoundPacer(interval: 800_000)
        p.roundStarted(now: 2 * ms, entries: 50)
        #expect(p.wait(now: ms, isLeader: true) == nil)
        p.reset()
        #expect(p.wait(now: 2 * ms, isLeader: true) == nil)
    }
}

@Suite struct HeldProposalTests {
    @Test("while the leader holds proposals, its own and forwarded writes wait, a write already proposed still commits and is answered, and releasing proposes the held ones")
    func heldProposalsWaitOthersGoOn() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let follower = try #require([1, 2, 3].first { $0 != leader })
        // Proposed and sent before the hold starts: it must still commit and be answered.
        let early = c.write(via: leader, "/early", "1")
        c.process(leader)
        c.replicas[leader]?.holdProposals = true
        let own = c.write(via: leader, "/own", "2")
        let forwarded = c.write(via: follower, "/forwarded", "3")
        let read = c.read(via: leader)
        c.settle()
        // Reads go on while proposals are held.
        #expect(c.readReady(read, on: leader))
        #expect(try c.writeOutcome(early, on: leader)?.get().outcome == .ok)
        #expect(c.writeOutcome(own, on: leader) == nil)
        #expect(c.writeOutcome(forwarded, on: follower) == nil)
        for id: NodeID in [1, 2, 3] {
            #expect(c.value(id, "/early") == "1")
            #expect(c.value(id, "/own") == "null" && c.value(id, "/forwarded") == "null")
        }
        let lastBefore = try #require(c.replicas[leader]?.raft.lastIndex)
        c.replicas[leader]?.holdProposals = false
        c.settle()
        #expect(try c.writeOutcome(own, on: leader)?.get().outcome == .ok)
        #expect(try c.writeOutcome(forwarded, on: follower)?.get().outcome == .ok)
        for id: NodeID in [1, 2, 3] {
            #expect(c.value(id, "/own") == "2" && c.value(id, "/forwarded") == "3")
        }
        // Both went into the log once each (the forwarded one was not lost or proposed twice).
        #expect(c.replicas[leader]?.raft.lastIndex == lastBefore + 2)
    }

    @Test("proposals a leader held are dropped if it loses leadership meanwhile, and the follower's retry still applies its write once")
    func heldForwardedSurviveLeaderChange() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let follower = try #require([1, 2, 3].first { $0 != leader })
        c.replicas[leader]?.holdProposals = true
        let q = c.write(via: follower, "/n", #"{".sv":{"increment":1}}"#)
        c.settle()
        #expect(c.writeOutcome(q, on: follower) == nil)
        // Another node takes over; the old leader's held proposal is dropped on release.
        let other = try #require([1, 2, 3].first { $0 != leader && $0 != follower })
        try c.replicas[leader]?.transferLeadership(to: other)
        c.settle()
        c.tick(3)
        #expect(c.replicas[other]?.raft.role == .leader)
        c.replicas[leader]?.holdProposals = false
        for _ in 0..<40 {
            c.tick()
            if c.writeOutcome(q, on: follower) != nil { break }
        }
        #expect(try c.writeOutcome(q, on: follower)?.get().outcome == .ok)
        for id: NodeID in [1, 2, 3] { #expect(c.value(id, "/n") == "1") }
    }
}
