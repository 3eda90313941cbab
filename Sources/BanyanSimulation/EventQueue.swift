/// A min-heap of events keyed by (time, sequence): ties break by insertion order, so a run is a
/// pure function of its seed.
struct EventQueue<Event> {
    private var heap: [(time: Int, seq: Int, event: Event)] = []
    private var nextSeq = 0

    var isEmpty: Bool { heap.isEmpty }
    var count: Int { heap.count }

    mutating func push(_ time: Int, _ event: Event) {
        heap.append((time, nextSeq, event))
        nextSeq += 1
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            if less(i, parent) {
                heap.swapAt(i, parent)
                i = parent
            } else {
                break
            }
        }
    }

    mutating func pop() -> (time: Int, event: Event)? {
        guard let top = heap.first else { return nil }
        let last = heap.removeLast()
        if !heap.isEmpty {
            heap[0] = last
            var i = 0
            while true {
                let l = 2 * i + 1
                let r = l + 1
                var m = i
                if l < heap.count && less(l, m) { m = l }
                if r < heap.count && less(r, m) { m = r }
                if m == i { break }
                heap.swapAt(i, m)
                i = m
            }
        }
        return (top.time, top.event)
    }

    @inline(__always) private func less(_ a: Int, _ b: Int) -> Bool {
        heap[a].time < heap[b].time || (heap[a].time == heap[b].time && heap[a].seq < heap[b].seq)
    }
}
