/// When the leader's driver may start its next replication round (docs/server.md, "Round
/// pacing"). A round is one `Ready` carrying new entries: one append per follower, one log write
/// and one fsync on every node. Under load, rounds started back to back each carry few writes, and
/// every round costs the same fsyncs and wake-ups whatever it carries; so while writes keep
/// coming, the leader starts a round at most once per `interval`, and the writes that arrive in
/// between go out together in the next one (the driver holds only new proposals meanwhile:
/// `Replica.holdProposals`). Pacing applies only after a round of more than one entry, so at low
/// load, when each round carries a single write, a write starts its round at once; a write that
/// arrives just after a larger round may wait up to `interval`.
///
/// Pure: the driver passes its monotonic clock (nanoseconds) in and schedules the wake-up.
public struct RoundPacer: Sendable, Equatable {
    /// Shortest time between the starts of two rounds under load (nanoseconds; 0 = no pacing).
    public let interval: UInt64
    private var lastStart: UInt64?
    private var lastEntries = 0

    public init(interval: UInt64) { self.interval = interval }

    /// How long new proposals must wait before the next round may start, or nil to propose
    /// them now. Only a leader paces (a follower's rounds follow the leader's appends).
    public func wait(now: UInt64, isLeader: Bool) -> UInt64? {
        guard interval > 0, isLeader, lastEntries > 1, let start = lastStart else { return nil }
        let elapsed = now &- start
        // A clock that went backwards (it is monotonic, but be safe) holds nothing.
        guard now >= start, elapsed < interval else { return nil }
        return interval - elapsed
    }

    /// The leader started a round carrying `entries` new entries at `now`.
    public mutating func roundStarted(now: UInt64, entries: Int) {
        lastStart = now
        lastEntries = entries
    }

    /// Leadership lost or gained: the next round is not held.
    public mutating func reset() {
        lastStart = nil
        lastEntries = 0
    }
}
