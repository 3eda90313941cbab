import BanyanReplica
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
