/// A node's side of its lease on its realtime connections (docs/realtime.md, "Node leases").
///
/// The node holds its connections under a random holder id and renews the lease through the log
/// every `renewMillis` while it has connections. The leader expires a holder once it has seen no
/// renewal applied for `leaseMillis` on its own clock, counting from no earlier than the moment
/// the renewal was proposed here. So as long as a renewal proposed at `p` has applied, the leader
/// cannot expire the holder before `p + leaseMillis` (clock rates assumed equal within
/// `marginMillis` over a lease); the node fences itself at `p + leaseMillis - marginMillis`:
/// it closes every connection and takes a new holder id, so no connection outlives its lease.
/// A new holder counts from its creation (the leader cannot have seen a queue under it before).
/// Pure: the driver calls `tick` about once a second with its monotonic clock (milliseconds),
/// proposes the renewals it returns, and reports each applied one with `renewed`.
public struct LeaseHolder: Sendable {
    public let leaseMillis: Int64
    public let renewMillis: Int64
    public let marginMillis: Int64
    public private(set) var holder: UInt64
    /// Until when the connections under `holder` are safe to keep.
    public private(set) var safeUntil: Int64
    private var lastProposed: Int64?
    private var nextRenewal: UInt64 = 1
    /// Renewals proposed for the current holder and not yet applied: number → when proposed.
    private var proposed: [UInt64: Int64] = [:]

    public enum Action: Sendable, Equatable {
        /// Propose `renewLease(holder, node)`; report it with `renewed(number:)` once it applies.
        case renew(holder: UInt64, number: UInt64)
        /// Close every realtime connection: the lease may lapse. New connections use `holder`.
        case fence(reason: String, holder: UInt64)
    }

    public init(holder: UInt64, now: Int64, leaseMillis: Int64 = 20_000, renewMillis: Int64 = 3_000, marginMillis: Int64 = 8_000) {
        self.holder = holder
        self.leaseMillis = leaseMillis
        self.renewMillis = renewMillis
        self.marginMillis = marginMillis
        safeUntil = now + leaseMillis - marginMillis
    }

    /// The driver's timer. `connections`: realtime connections open now. `fresh` gives a new
    /// random holder id.
    public mutating func tick(now: Int64, connections: Int, fresh: () -> UInt64) -> [Action] {
        var out: [Action] = []
        if connections == 0 {
            // Idle: a holder that was renewed is let go (its record lapses at the leader); one
            // never used is unknown to the leader, which will count it only from a queue filed
            // after now, so it stays safe a whole lease from now. Either way a connection that
            // opens next is not fenced at once by an old deadline.
            if lastProposed != nil { rotate(now: now, to: fresh()) } else { safeUntil = max(safeUntil, now + leaseMillis - marginMillis) }
            return out
        }
        if now >= safeUntil {
            // No renewal applied in time (a partition, a leaderless cluster, a frozen process).
            rotate(now: now, to: fresh())
            out.append(.fence(reason: "this node's lease on its realtime connections may have lapsed", holder: holder))
            return out
        }
        if lastProposed.map({ now - $0 >= renewMillis }) ?? true {
            lastProposed = now
            let number = nextRenewal
            nextRenewal += 1
            proposed[number] = now
            // Renewals that never applied (lost with a leader) are forgotten after a lease.
            proposed = proposed.filter { now - $0.value < leaseMillis }
            out.append(.renew(holder: holder, number: number))
        }
        return out
    }

    /// Renewal `number` of `holder` applied.
    public mutating func renewed(holder renewedHolder: UInt64, number: UInt64) {
        guard renewedHolder == holder, let at = proposed.removeValue(forKey: number) else { return }
        safeUntil = max(safeUntil, at + leaseMillis - marginMillis)
    }

    /// The state machine refused a renewal of `holder`: the leader expired it. Returns the fence
    /// to carry out (nil when the holder was already replaced).
    public mutating func refused(holder refusedHolder: UInt64, now: Int64, fresh: () -> UInt64) -> Action? {
        guard refusedHolder == holder else { return nil }
        rotate(now: now, to: fresh())
        return .fence(reason: "the leader expired this node's lease on its realtime connections", holder: holder)
    }

    /// The driver could not record the end of a connection it closed (its `connectionEnded` did
    /// not commit after every retry): the queue would wait for this holder's lease, which the
    /// node's other connections keep renewing. So the node lets the holder go: it closes every
    /// connection and takes a new holder; the leader then expires the old one, which fires every
    /// queue under it (docs/realtime.md, "Node leases").
    public mutating func release(reason: String, now: Int64, fresh: () -> UInt64) -> Action {
        rotate(now: now, to: fresh())
        return .fence(reason: reason, holder: holder)
    }

    private mutating func rotate(now: Int64, to next: UInt64) {
        holder = next
        safeUntil = now + leaseMillis - marginMillis
        proposed = [:]
        lastProposed = nil
    }
}
