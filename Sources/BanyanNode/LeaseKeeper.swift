public import BanyanStateMachine

/// The leader's side of node leases (docs/realtime.md, "Node leases"): for every lease holder
/// with onDisconnect queues (or a lease record), how long since the leader saw its latest renewal
/// applied, on the leader's own monotonic clock; a holder silent for a whole lease is expired, one
/// `expireHolder` per namespace it holds queues in. Counts restart whenever this node becomes
/// leader (it cannot know what its predecessor saw), so only clock rates matter, never clock
/// values. Pure: `NodeCore` calls `check` on every tick and proposes what it returns.
public struct LeaseKeeper: Sendable {
    /// The lease: a holder silent this long (nanoseconds) is expired.
    public let leaseNanoseconds: UInt64
    /// An expiry proposed but not yet applied is proposed again after this long.
    public let retryNanoseconds: UInt64

    private struct Count: Sendable {
        var renewedIndex: UInt64
        var since: UInt64
        var proposedAt: UInt64?
    }
    private var counts: [UInt64: Count] = [:]
    private var leading = false

    public struct Expiry: Sendable, Equatable {
        public var holder: UInt64
        public var namespace: String
        public var lastRenewal: UInt64

        public init(holder: UInt64, namespace: String, lastRenewal: UInt64) {
            self.holder = holder
            self.namespace = namespace
            self.lastRenewal = lastRenewal
        }
    }

    /// Simulator self-test only: renewals never restart a count (`Sabotage.leaseIgnoresRenewals`).
    private let ignoreRenewals: Bool

    public init(leaseNanoseconds: UInt64, retryNanoseconds: UInt64 = 2_000_000_000, ignoreRenewals: Bool = false) {
        self.leaseNanoseconds = leaseNanoseconds
        self.retryNanoseconds = retryNanoseconds
        self.ignoreRenewals = ignoreRenewals
    }

    /// The expiries to propose now. `now` is the monotonic clock (nanoseconds).
    /// O(holders), which is one per node process and fencing epoch with live queues.
    public mutating func check(now: UInt64, isLeader: Bool, machine: StateMachine) -> [Expiry] {
        guard isLeader else {
            counts = [:]
            leading = false
            return []
        }
        if !leading {
            leading = true
            counts = [:]
        }
        if machine.queuedHolders.isEmpty && machine.leases.isEmpty {
            counts = [:]
            return []
        }
        var out: [Expiry] = []
        var watched = Set<UInt64>()
        for holder in Set(machine.queuedHolders.keys).union(machine.leases.keys).sorted() where holder != 0 {
            watched.insert(holder)
            let namespaces = (machine.queuedHolders[holder] ?? [:]).keys.sorted()
            if machine.expiredHolders.contains(holder) {
                // Expired in another namespace already: the rest go at once (then every retry
                // interval until applied, like any expiry).
                var count = counts[holder] ?? Count(renewedIndex: 0, since: now)
                if let at = count.proposedAt, now &- at < retryNanoseconds { continue }
                count.proposedAt = now
                counts[holder] = count
                out += namespaces.map { Expiry(holder: holder, namespace: $0, lastRenewal: 0) }
                continue
            }
            let renewed = machine.leases[holder]?.renewedIndex ?? 0
            // (The self-test keeps counting from the first renewal it saw, and names the latest
            // one, so the state machine's own check lets the expiry through.)
            let counted = ignoreRenewals ? counts[holder]?.renewedIndex ?? renewed : renewed
            guard var count = counts[holder], count.renewedIndex == counted else {
                counts[holder] = Count(renewedIndex: renewed, since: now)
                continue
            }
            guard now &- count.since >= leaseNanoseconds else { continue }
            if let at = count.proposedAt, now &- at < retryNanoseconds { continue }
            count.proposedAt = now
            counts[holder] = count
            // A holder with a lease but no queues is expired too (in no namespace in
            // particular), so the lease table does not keep it.
            out += (namespaces.isEmpty ? [""] : namespaces).map { Expiry(holder: holder, namespace: $0, lastRenewal: renewed) }
        }
        for holder in counts.keys where !watched.contains(holder) { counts[holder] = nil }
        return out
    }
}
