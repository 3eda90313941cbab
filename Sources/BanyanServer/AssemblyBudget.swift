import Synchronization

/// The node-wide budget for realtime messages being assembled (`http.max_assembling_bytes`;
/// docs/realtime.md, "Limits"): every connection charges the bytes it holds of messages not yet
/// whole (WebSocket fragments, protocol-level chunks) and releases them when the message is whole
/// or dropped, or the connection ends. A charge that would pass the limit is refused: the
/// connection is closed (1013), the others go on.
final class AssemblyBudget: Sendable {
    let limit: Int
    private let held = Atomic<Int>(0)

    init(limit: Int) {
        self.limit = limit
    }

    /// Bytes held now, over all connections.
    var bytes: Int { held.load(ordering: .relaxed) }

    /// Takes `bytes` from the budget; false (nothing taken) when they do not fit.
    func charge(_ bytes: Int) -> Bool {
        guard bytes > 0 else { return true }
        var current = held.load(ordering: .relaxed)
        while true {
            guard current + bytes <= limit else { return false }
            let (exchanged, original) = held.compareExchange(expected: current, desired: current + bytes, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
    }

    func release(_ bytes: Int) {
        guard bytes > 0 else { return }
        held.wrappingSubtract(bytes, ordering: .relaxed)
    }
}

/// One connection's account with the budget: what it holds now, moved to a new amount at once.
struct AssemblyAccount {
    let budget: AssemblyBudget
    private(set) var held = 0

    init(budget: AssemblyBudget) {
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

    mutating func releaseAll() {
        budget.release(held)
        held = 0
    }
}
