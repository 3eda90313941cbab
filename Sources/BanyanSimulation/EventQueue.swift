/// A min-heap of events keyed by (time, sequence): ties break by insertion order, so a run is a
/// pure function of its seed.
struct EventQueue<Event> {
    // A binary heap of keys, each naming the slot that holds its event. Events never move while
    // queued: the heap's swaps move three integers, not an event (an event is a large enum whose
    // copy retains every payload; swapping events in the heap was a quarter of the simulator's
    // time). A popped event is moved out of its slot, and the slot is reused.
    private var heap: [(time: Int, seq: Int, slot: Int)] = []
    private var slots: [Event?] = []
    private var freeSlots: [Int] = []
    private var nextSeq = 0

    var isEmpty: Bool { heap.isEmpty }
    var count: Int { heap.count }

    mutating func push(_ time: Int, _ event: Event) {
        let slot: Int
        if let free = freeSlots.popLast() {
            slot = free
            slots[slot] = event
        } else {
            slot = slots.count
            slots.append(event)
        }
        heap.append((time, nextSeq, slot))
        nextSeq += 1
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            guard less(i, parent) else { break }
            heap.swapAt(i, parent)
            i = parent
        }
    }

    mutating func pop() -> (time: Int, event: Event)? {
        // Every key's slot holds its event: the loop only skips a slot found empty, which
        // cannot happen (push fills the slot before its key enters the heap).
        while let top = heap.first {
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
            freeSlots.append(top.slot)
            if let event = slots[top.slot].take() { return (top.time, event) }
        }
        return nil
    }

    @inline(__always) private func less(_ a: Int, _ b: Int) -> Bool {
        heap[a].time < heap[b].time || (heap[a].time == heap[b].time && heap[a].seq < heap[b].seq)
    }
}
