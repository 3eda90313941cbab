/// One record of the log on disk: a log entry's position, the Raft term that created it, a kind
/// tag and an opaque payload (the command, encoded by the state machine). `BanyanRaft.LogEntry` is
/// the same entry as the consensus core sees it; `NodeStorage` converts between the two.
public struct LogRecord: Sendable, Equatable {
    public var index: UInt64
    public var term: UInt64
    public var kind: UInt8
    public var payload: [UInt8]

    public init(index: UInt64, term: UInt64, kind: UInt8, payload: [UInt8]) {
        self.index = index
        self.term = term
        self.kind = kind
        self.payload = payload
    }
}

/// The on-disk framing of records and segments (see docs/internals/oplog-format.md).
public enum LogFormat {
    /// Segment header: "BNYLOG" then the format version (u16 LE).
    public static let segmentHeader: [UInt8] = Array("BNYLOG".utf8) + [1, 0]
    /// Bytes before a record's body: length (u32) and checksum (u32).
    public static let frameBytes = 8
    /// Fixed part of the body: index (u64), term (u64), kind (u8).
    public static let bodyFixedBytes = 17
    /// Largest body accepted; anything larger is a corrupt length.
    public static let maxRecordBytes = 64 * 1024 * 1024

    /// Appends the framed record for `entry` to `out`.
    public static func encode(_ entry: LogRecord, into out: inout [UInt8]) {
        let bodyLength = bodyFixedBytes + entry.payload.count
        let start = out.count
        appendLE(UInt32(bodyLength), &out)
        appendLE(UInt32(0), &out)  // checksum placeholder
        appendLE(entry.index, &out)
        appendLE(entry.term, &out)
        out.append(entry.kind)
        out.append(contentsOf: entry.payload)
        let crc = out.withUnsafeBufferPointer { buffer in
            CRC32C.checksum(UnsafeBufferPointer(rebasing: buffer[(start + frameBytes)...]))
        }
        for i in 0..<4 { out[start + 4 + i] = UInt8(truncatingIfNeeded: crc >> (8 * UInt32(i))) }
    }

    public static func encode(_ entries: [LogRecord]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(entries.reduce(0) { $0 + frameBytes + bodyFixedBytes + $1.payload.count })
        for entry in entries { encode(entry, into: &out) }
        return out
    }

    /// The file name of the segment whose first record has index `firstIndex`.
    public static func segmentName(firstIndex: UInt64) -> String {
        let digits = String(firstIndex)
        return String(repeating: "0", count: max(0, 20 - digits.count)) + digits + ".seg"
    }

    /// The first index encoded in a segment file name, or nil when `name` is not a segment.
    public static func firstIndex(ofSegment name: String) -> UInt64? {
        guard name.hasSuffix(".seg"), name.utf8.count == 24 else { return nil }
        return parseIndex(name.utf8.prefix(20))
    }

    /// Decimal digits only (no sign), in 1..<UInt64.max (so `index - 1` and `index + count`
    /// cannot overflow for any log that fits on a disk).
    static func parseIndex(_ digits: some Sequence<UInt8>) -> UInt64? {
        var value: UInt64 = 0
        for d in digits {
            guard d >= UInt8(ascii: "0"), d <= UInt8(ascii: "9") else { return nil }
            let (m, o1) = value.multipliedReportingOverflow(by: 10)
            let (s, o2) = m.addingReportingOverflow(UInt64(d - UInt8(ascii: "0")))
            guard !o1, !o2 else { return nil }
            value = s
        }
        guard value >= 1, value < UInt64.max / 2 else { return nil }
        return value
    }

    static func appendLE<T: FixedWidthInteger>(_ value: T, _ out: inout [UInt8]) {
        var v = value.littleEndian
        withUnsafeBytes(of: &v) { out.append(contentsOf: $0) }
    }

    static func readLE<T: FixedWidthInteger>(_ bytes: UnsafeBufferPointer<UInt8>, _ offset: Int, as: T.Type) -> T {
        var value: T = 0
        for i in 0..<MemoryLayout<T>.size { value |= T(bytes[offset + i]) << (8 * i) }
        return value
    }
}
