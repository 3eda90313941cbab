import BanyanBasics
import Testing

@testable import BanyanSimulation

@Suite struct EventQueueTests {
    /// A run is a pure function of its seed only if events come out in (time, insertion) order,
    /// whatever the interleaving of pushes and pops and however slots are reused.
    @Test("events pop in time order, ties in insertion order, through interleaved pushes and pops", arguments: [1, 2, 3] as [UInt64])
    func order(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        var queue = EventQueue<[Int]>()
        var reference: [(time: Int, seq: Int)] = []
        var seq = 0
        var now = 0
        for _ in 0..<5_000 {
            if random.below(3) > 0 || reference.isEmpty {
                let time = now + random.below(20)
                // The event carries its own key (an array: a payload with storage to move).
                queue.push(time, [time, seq])
                reference.append((time, seq))
                seq += 1
            } else {
                reference.sort { $0.time < $1.time || ($0.time == $1.time && $0.seq < $1.seq) }
                let expected = reference.removeFirst()
                guard let (time, event) = queue.pop() else {
                    Issue.record("empty queue, expected \(expected)")
                    return
                }
                #expect(time == expected.time && event == [expected.time, expected.seq])
                now = time
            }
            #expect(queue.count == reference.count)
        }
        reference.sort { $0.time < $1.time || ($0.time == $1.time && $0.seq < $1.seq) }
        for expected in reference {
            #expect(queue.pop().map { [$0.event[0], $0.event[1]] } == [expected.time, expected.seq])
        }
        #expect(queue.isEmpty && queue.pop() == nil)
    }
}
