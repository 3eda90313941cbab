/// A min-heap of events keyed by (time, sequence): ties break by insertion order, so a run is a
/// pure function of its seed.
struct EventQueue<Event> {
    // A binary heap ordered by (time, seq). The keys live apart from the events, so comparisons
    // read two integers without copying (and retaining) an event.
    private var keys: [(time: Int, seq: Int)] = []
    private var events: [Event] = []
    private var nextSeq = 0

    var isEmpty: Bool { keys.isEmpty }
    var count: Int { keys.count }

    mutating func push(_ time: Int, _ event: Event) {
        keys.append((time, nextSeq))
        events.append(event)
        nextSeq += 1
        var i = keys.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            if less(i, parent) {
                swap(i, parent)
                i = parent
            } else {
                break
            }
        }
    }

    mutating func pop() -> (time: Int, event: Event)? {
        guard let top = keys.first else { return nil }
        let lastKey = keys.removeLast()
        let lastEvent = events.removeLast()
        let event: Event
        if keys.isEmpty {
            event = lastEvent
        } else {
            event = events[0]
            keys[0] = lastKey
            events[0] = lastEvent
            var i = 0
            while true {
                let l = 2 * i + 1
                let r = l + 1
                var m = i
                if l < keys.count && less(l, m) { m = l }
                if r < keys.count && less(r, m) { m = r }
                if m == i { break }
                swap(i, m)
                i = m
            }
        }
        return (top.time, event)
    }

    @inline(__always) private mutating func swap(_ a: Int, _ b: Int) {
        keys.swapAt(a, b)
        events.swapAt(a, b)
    }

    @inline(__always) private func less(_ a: Int, _ b: Int) -> Bool {
        keys[a].time < keys[b].time || (keys[a].time == keys[b].time && keys[a].seq < keys[b].seq)
    }
}
