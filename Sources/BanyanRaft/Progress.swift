/// The leader's view of one follower's log (etcd's progress tracker, simplified).
struct Progress: Sendable {
    enum State: Sendable, Equatable {
        /// One append at a time until the follower's match point is found.
        case probe
        /// Appends stream optimistically, bounded by the in-flight window.
        case replicate
        /// The follower is behind the leader's compacted prefix and receives the snapshot at
        /// `index`; appends pause until it acknowledges.
        case snapshot(index: UInt64)
    }

    var match: UInt64 = 0
    var next: UInt64
    var state: State = .probe
    /// In probe state: an append was sent and no answer has come yet.
    var probeSent = false
    var inflights: Inflights
    /// Heard from since the last check-quorum round.
    var recentActive = false
    /// Highest ReadIndex sequence this follower confirmed.
    var readAck: UInt64 = 0
    /// The follower's last answer said it may vote (`appendAccepted`, `heartbeatResponse`): false
    /// for a voter that came back blank, whose acknowledgements then count in no quorum; false
    /// too from a new incarnation's hello until its first answer.
    var mayVote = true
    /// Snapshot streaming: the next byte offset the follower wants, and ticks since progress.
    var snapshotOffset: UInt64 = 0
    var snapshotIdleTicks = 0
    var snapshotRequestOutstanding = false
    /// Ticks since the follower last answered a snapshot chunk (or since the transfer began).
    var snapshotSilentTicks = 0

    init(next: UInt64, maxInflightMessages: Int, maxInflightBytes: Int) {
        self.next = next
        self.inflights = Inflights(capacity: maxInflightMessages, maxBytes: maxInflightBytes)
    }

    var isPaused: Bool {
        switch state {
        case .probe: return probeSent
        case .replicate: return inflights.isFull
        case .snapshot: return true
        }
    }

    mutating func becomeProbe() {
        if case .snapshot(let index) = state {
            next = max(match + 1, index + 1)
        } else {
            next = match + 1
        }
        state = .probe
        probeSent = false
        inflights.reset()
    }

    mutating func becomeReplicate() {
        state = .replicate
        next = match + 1
        probeSent = false
        inflights.reset()
    }

    mutating func becomeSnapshot(index: UInt64) {
        state = .snapshot(index: index)
        probeSent = false
        inflights.reset()
        snapshotOffset = 0
        snapshotIdleTicks = 0
        snapshotRequestOutstanding = false
        snapshotSilentTicks = 0
    }

    /// An acceptance up to `index`. Returns false for a stale acknowledgement.
    mutating func maybeUpdate(_ index: UInt64) -> Bool {
        var updated = false
        if index > match {
            match = index
            updated = true
            probeSent = false
        }
        next = max(next, index + 1)
        return updated
    }

    /// A rejection of the append at `rejected`; `hint` is where to probe next. Returns false
    /// when the rejection is stale (R11, R12).
    mutating func maybeDecrease(rejected: UInt64, hint: UInt64) -> Bool {
        if state == .replicate {
            if rejected <= match { return false }
            next = match + 1
            return true
        }
        // At or below the match point a rejection is stale (a durable follower never loses
        // what it acknowledged); acting on it would resend the same append forever.
        if rejected <= match || next == 0 || next - 1 != rejected { return false }
        next = max(min(rejected, hint + 1), match + 1)
        probeSent = false
        return true
    }
}

/// A bounded window of in-flight appends, by count and bytes (R25).
struct Inflights: Sendable {
    private var lastIndexes: [UInt64] = []
    private var sizes: [Int] = []
    private var head = 0
    private(set) var bytes = 0
    let capacity: Int
    let maxBytes: Int

    init(capacity: Int, maxBytes: Int) {
        self.capacity = capacity
        self.maxBytes = maxBytes
    }

    var count: Int { lastIndexes.count - head }
    var isFull: Bool { count >= capacity || bytes >= maxBytes }

    mutating func add(lastIndex: UInt64, bytes size: Int) {
        lastIndexes.append(lastIndex)
        sizes.append(size)
        bytes += size
    }

    /// Frees every message whose last index is ≤ `index`.
    mutating func free(through index: UInt64) {
        while head < lastIndexes.count && lastIndexes[head] <= index {
            bytes -= sizes[head]
            head += 1
        }
        compactIfNeeded()
    }

    mutating func freeFirst() {
        guard head < lastIndexes.count else { return }
        bytes -= sizes[head]
        head += 1
        compactIfNeeded()
    }

    mutating func reset() {
        lastIndexes.removeAll(keepingCapacity: true)
        sizes.removeAll(keepingCapacity: true)
        head = 0
        bytes = 0
    }

    private mutating func compactIfNeeded() {
        if head == lastIndexes.count {
            reset()
        } else if head > 64 && head * 2 > lastIndexes.count {
            lastIndexes.removeFirst(head)
            sizes.removeFirst(head)
            head = 0
        }
    }
}
