public import BanyanTree

/// A time and an id, ordered by time then id: the key of the expiry indexes.
public struct TimeID: SortKey, Sendable, Hashable {
    public let time: Int64
    public let id: UInt64

    public init(time: Int64, id: UInt64) {
        self.time = time
        self.id = id
    }

    public static func compare(_ a: TimeID, _ b: TimeID) -> Int {
        if a.time != b.time { return a.time < b.time ? -1 : 1 }
        if a.id != b.id { return a.id < b.id ? -1 : 1 }
        return 0
    }
    public static func < (a: TimeID, b: TimeID) -> Bool { compare(a, b) < 0 }
    /// The time, shifted so that unsigned order is the times' order.
    public var sortWord: UInt64 { UInt64(bitPattern: time) &+ (1 << 63) }
    public static func destroy(_ keys: UnsafeMutablePointer<TimeID>, count: Int) { keys.deinitialize(count: count) }
}

/// Expiry of what idles (docs/internals/state-machine.md, "Expiry"): client write records of
/// clients that stopped writing, and the session records of connections that ended. Each kind
/// has an index by time (a client's last write; a connection's end), kept in memory beside the
/// records and rebuilt from them when an image loads (so not in the image): in (time, id) order,
/// the same on every replica whatever order the records arrived in. Finding the oldest is
/// O(log n); an `expireIdle` entry removes at most `expiryBatch` of each, oldest first, in
/// O(k log n). The leader proposes one when the oldest is past its retention (`idleToExpire`).
extension StateMachine {
    /// The most records one `expireIdle` entry removes of each kind (the leader proposes another
    /// while some are left).
    public static let expiryBatch = 10_000

    /// Both indexes from the records (at load).
    static func expiryIndexes(
        clients: Tree, sessions: [UInt64: SessionRecord]
    ) -> (clients: SortedTree<TimeID, Void>, ended: SortedTree<TimeID, Void>) {
        var clientIndex = SortedTree<TimeID, Void>()
        for (key, record) in clients.children.elements() {
            guard let client = UInt64(key.string, radix: 16), let t = ClientWriteRecord(tree: record).lastUsed else { continue }
            _ = clientIndex.updateValue((), forKey: TimeID(time: t, id: client))
        }
        var endedIndex = SortedTree<TimeID, Void>()
        for (session, record) in sessions where record.ended {
            _ = endedIndex.updateValue((), forKey: TimeID(time: record.endedAt ?? 0, id: session))
        }
        return (clientIndex, endedIndex)
    }

    /// Moves a client's entry in the idle index from `old` (its previous last write, if any) to
    /// `new`.
    mutating func indexClientUse(_ client: UInt64, old: Int64?, new: Int64) {
        guard old != new else { return }
        if let old { _ = clientIdleIndex.removeValue(forKey: TimeID(time: old, id: client)) }
        _ = clientIdleIndex.updateValue((), forKey: TimeID(time: new, id: client))
    }

    /// Marks connection `session` ended now (its record may go after the ended retention).
    mutating func markEnded(_ session: UInt64, _ record: inout SessionRecord) {
        guard !record.ended else { return }
        record.ended = true
        record.endedAt = lastTimestamp
        _ = endedIndex.updateValue((), forKey: TimeID(time: lastTimestamp, id: session))
    }

    /// Whether an `expireIdle` with these retentions would remove something now (the oldest
    /// entry of either index is past its retention, at the time of the last applied entry).
    public func idleToExpire(clientsIdleMillis: UInt64, endedMillis: UInt64) -> Bool {
        if let first = clientIdleIndex.first, first.key.time < cutoff(clientsIdleMillis) { return true }
        if let first = endedIndex.first, first.key.time < cutoff(endedMillis) { return true }
        return false
    }

    /// Idle client records and ended connections' session records (tests and metrics).
    public var idleIndexCounts: (clients: Int, ended: Int) { (clientIdleIndex.count, endedIndex.count) }

    private func cutoff(_ retention: UInt64) -> Int64 {
        lastTimestamp &- Int64(clamping: retention)
    }

    /// `expireIdle`: removes up to `expiryBatch` idle client records and ended sessions' records,
    /// oldest first.
    mutating func applyExpireIdle(_ envelope: CommandEnvelope, clientsIdleMillis: UInt64, endedMillis: UInt64) -> Applied {
        var applied = Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: .ok, written: [])
        // Idle clients: their write records go (a copy of one of their writes arriving after
        // this would apply again: the retention is far longer than any copy travels).
        var clients = namespaces.removeValue(forKey: Self.clientsNamespace) ?? .empty
        let clientCutoff = cutoff(clientsIdleMillis)
        var count = 0
        while count < Self.expiryBatch, let first = clientIdleIndex.first, first.key.time < clientCutoff {
            _ = clientIdleIndex.removeValue(forKey: first.key)
            clients.set(.empty, at: Path(segments: [Self.clientKey(first.key.id)]))
            count += 1
        }
        if !clients.isEmpty { namespaces[Self.clientsNamespace] = clients }
        applied.expired = count
        // Ended connections: their session records go (nothing they send after their end
        // applies; after the retention nothing of theirs is still travelling).
        let endedCutoff = cutoff(endedMillis)
        count = 0
        while count < Self.expiryBatch, let first = endedIndex.first, first.key.time < endedCutoff {
            _ = endedIndex.removeValue(forKey: first.key)
            if let record = sessions[first.key.id], record.ended, record.endedAt == first.key.time { sessions[first.key.id] = nil }
            count += 1
        }
        applied.expired += count
        return applied
    }
}
