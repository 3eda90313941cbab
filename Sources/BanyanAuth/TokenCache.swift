/// Credentials already verified, by the exact text presented, so that a client sending the same
/// token with every request pays for its signature check (or its parse) once. Pure and
/// single-threaded: the server keeps one behind a lock; `now` is always an input.
///
/// An entry is served only while the verification it records would still succeed at `now`:
/// - `now` is before its `validUntil` (the token's `exp` plus the allowed skew; nil for
///   credentials that never expire), checked at every hit;
/// - `now` is not before the time it was verified at, so a clock stepped backwards cannot make a
///   token that was checked at a later time skip its `iat`/`nbf` check.
///
/// Anything else the verification depended on (the keys it was checked with) is the caller's to
/// compare at a hit, or to drop with `removeAll` when it changes. Only successful verifications
/// are inserted: a refused token is verified again every time.
///
/// Bounded by `maxEntries` and `maxBytes` (each entry's token and value sizes, plus a fixed
/// overhead); when either would be exceeded, the oldest entries are evicted first.
public struct TokenCache<Value> {
    public let maxEntries: Int
    public let maxBytes: Int
    /// What an entry is charged besides its token and value (the dictionary slot, the order slot).
    public static var entryOverhead: Int { 96 }

    struct Entry {
        var value: Value
        var verifiedAt: Int64
        var validUntil: Int64?
        var bytes: Int
        /// Its place in `order` (an evicted or replaced entry's stale order slot is skipped).
        var serial: UInt64
    }

    private var entries: [String: Entry] = [:]
    /// Insertion order, oldest first, from `head` on.
    private var order: [(token: String, serial: UInt64)] = []
    private var head = 0
    private var nextSerial: UInt64 = 0
    public private(set) var bytes = 0

    public var count: Int { entries.count }

    public init(maxEntries: Int = 4096, maxBytes: Int = 8 << 20) {
        self.maxEntries = max(0, maxEntries)
        self.maxBytes = max(0, maxBytes)
    }

    /// The value recorded for `token`, if it may still be served at `now`. An entry that may not
    /// (expired, or `now` before its verification) is removed.
    public mutating func lookup(_ token: String, now: Int64) -> Value? {
        guard let entry = entries[token] else { return nil }
        if now < entry.verifiedAt || entry.validUntil.map({ now >= $0 }) == true {
            remove(token)
            return nil
        }
        return entry.value
    }

    /// Records `value` for `token`, verified at `verifiedAt` and served until `validUntil`
    /// (exclusive; nil: no expiry). `valueBytes` is what the value holds beyond its fixed size.
    /// An entry too large for the cache on its own is not recorded.
    public mutating func insert(_ token: String, _ value: Value, valueBytes: Int, verifiedAt: Int64, validUntil: Int64?) {
        let size = token.utf8.count + max(0, valueBytes) + Self.entryOverhead
        guard maxEntries > 0, size <= maxBytes else { return }
        if let validUntil, validUntil <= verifiedAt { return }
        remove(token)
        while entries.count >= maxEntries || bytes + size > maxBytes, evictOldest() {}
        nextSerial &+= 1
        entries[token] = Entry(value: value, verifiedAt: verifiedAt, validUntil: validUntil, bytes: size, serial: nextSerial)
        order.append((token, nextSerial))
        bytes += size
    }

    /// Forgets `token`.
    public mutating func remove(_ token: String) {
        guard let entry = entries.removeValue(forKey: token) else { return }
        bytes -= entry.bytes
        // Its order slot goes stale; compact when most slots are.
        if order.count - head > 2 * entries.count + 64 { compact() }
    }

    /// Forgets everything (the keys the entries were verified with changed).
    public mutating func removeAll() {
        entries.removeAll()
        order.removeAll()
        head = 0
        bytes = 0
    }

    /// Evicts the oldest live entry; false when there is none.
    private mutating func evictOldest() -> Bool {
        while head < order.count {
            let (token, serial) = order[head]
            head += 1
            if let entry = entries[token], entry.serial == serial {
                entries[token] = nil
                bytes -= entry.bytes
                if head > 1024 && head * 2 > order.count { compact() }
                return true
            }
        }
        compact()
        return false
    }

    /// Drops consumed and stale order slots.
    private mutating func compact() {
        order = order[head...].filter { slot in entries[slot.token]?.serial == slot.serial }
        head = 0
    }
}

extension TokenCache: Sendable where Value: Sendable {}
extension TokenCache.Entry: Sendable where Value: Sendable {}
