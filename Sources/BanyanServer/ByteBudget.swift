import Metrics
import NIOCore
import Synchronization

/// A node-wide budget of bytes that connections charge and release, over all connections:
/// - realtime messages being assembled (`http.max_assembling_bytes`; docs/realtime.md,
///   "Limits"): every connection charges the bytes it holds of messages not yet whole (WebSocket
///   fragments, protocol-level chunks) and releases them when the message is whole or dropped, or
///   the connection ends. A charge that would pass the limit is refused: the connection is closed
///   (1013), the others go on.
/// - answers queued for clients that do not read them (`http.max_queued_answer_bytes`;
///   `QueuedAnswers`): the bytes are already written when they are charged, so the charge is
///   never refused; a connection that holds some while the budget is spent is not served until
///   they drain.
final class ByteBudget: Sendable {
    let limit: Int
    private let held = Atomic<Int>(0)
    /// Records the bytes held after each change (nil: not exported).
    private let gauge: Gauge?

    init(limit: Int, gauge: Gauge? = nil) {
        self.limit = limit
        self.gauge = gauge
    }

    /// Bytes held now, over all connections.
    var bytes: Int { held.load(ordering: .relaxed) }

    /// The limit is reached: nothing more fits.
    var isSpent: Bool { bytes >= limit }

    /// Takes `bytes` from the budget; false (nothing taken) when they do not fit.
    func charge(_ bytes: Int) -> Bool {
        guard bytes > 0 else { return true }
        var current = held.load(ordering: .relaxed)
        while true {
            guard current + bytes <= limit else { return false }
            let (exchanged, original) = held.compareExchange(expected: current, desired: current + bytes, ordering: .relaxed)
            if exchanged {
                gauge?.record(current + bytes)
                return true
            }
            current = original
        }
    }

    /// Takes `bytes` whether or not they fit (bytes the node already holds, to be counted).
    func take(_ bytes: Int) {
        guard bytes > 0 else { return }
        let now = held.wrappingAdd(bytes, ordering: .relaxed).newValue
        gauge?.record(now)
    }

    func release(_ bytes: Int) {
        guard bytes > 0 else { return }
        let now = held.wrappingSubtract(bytes, ordering: .relaxed).newValue
        gauge?.record(now)
    }
}

/// One connection's account with the budget: what it holds now, moved to a new amount at once.
struct BudgetAccount {
    let budget: ByteBudget
    private(set) var held = 0

    init(budget: ByteBudget) {
        self.budget = budget
    }

    /// Sets the connection's holding to `bytes`; false when the increase does not fit (the
    /// holding is then unchanged).
    mutating func hold(_ bytes: Int) -> Bool {
        if bytes > held {
            guard budget.charge(bytes - held) else { return false }
        } else {
            budget.release(held - bytes)
        }
        held = bytes
        return true
    }

    /// Sets the connection's holding to `bytes`, whether or not the increase fits.
    mutating func force(_ bytes: Int) {
        if bytes > held { budget.take(bytes - held) } else { budget.release(held - bytes) }
        held = bytes
    }

    mutating func releaseAll() {
        budget.release(held)
        held = 0
    }
}

/// One client connection's answer bytes written but not yet taken by the socket (its channel's
/// outbound buffer), charged to the node's budget for them (`http.max_queued_answer_bytes`).
/// Measured after each flush; while some are held, a write of nothing with a promise marks where
/// they end, and its completion (all before it taken) measures again, so a charge never outlives
/// the bytes once the client reads. Confined to the channel's event loop.
final class QueuedAnswers {
    private var account: BudgetAccount
    private let channel: any Channel
    private var watching = false
    /// Called on the event loop when queued bytes drained and the connection need not wait any
    /// more (it holds none, or the budget has room again).
    var resumable: () -> Void = {}

    init(budget: ByteBudget, channel: any Channel) {
        self.account = BudgetAccount(budget: budget)
        self.channel = channel
    }

    /// Bytes this connection holds in the budget (as last measured).
    var held: Int { account.held }

    /// Measures after a flush (a few atomic loads; nothing more while nothing is queued) and
    /// answers whether the connection must wait: it holds queued bytes while the node's budget is
    /// spent. A connection holding nothing never waits.
    func mustWait() -> Bool {
        let queued = (try? channel.syncOptions?.getOption(.bufferedWritableBytes)) ?? 0
        account.force(queued)
        guard queued > 0 else { return false }
        watch()
        return account.budget.isSpent
    }

    private func watch() {
        guard !watching, channel.isActive else { return }
        watching = true
        let promise = channel.eventLoop.makePromise(of: Void.self)
        channel.writeAndFlush(channel.allocator.buffer(capacity: 0), promise: promise)
        let bound = NIOLoopBound(self, eventLoop: channel.eventLoop)
        promise.futureResult.whenComplete { result in
            let queued = bound.value
            queued.watching = false
            guard case .success = result, queued.channel.isActive else { return queued.release() }
            if !queued.mustWait() { queued.resumable() }
        }
    }

    /// The connection ended: it holds nothing.
    func release() {
        account.releaseAll()
    }
}
