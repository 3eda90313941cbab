import BanyanBasics

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

/// A synced-through marker (segment format version 2): written by the log at both ends of every
/// write batch (one `pwrite` of records), it says which bytes the batch spans and how far its
/// segment was known durable (synced) when the batch was written. Recovery uses it to tell a
/// batch torn by a power loss (nothing in it was ever synced, so nothing was acknowledged) from
/// damage to synced records (docs/internals/oplog-format.md, "Synced-through markers").
public struct SyncMarker: Sendable, Equatable {
    /// Every byte of the segment before this offset was synced when the batch was written.
    public var syncedThrough: Int
    /// The batch's bytes: from its leading marker through its trailing marker.
    public var spanStart: Int
    public var spanEnd: Int

    public init(syncedThrough: Int, spanStart: Int, spanEnd: Int) {
        self.syncedThrough = syncedThrough
        self.spanStart = spanStart
        self.spanEnd = spanEnd
    }

    /// The span as a range of offsets.
    public var span: Range<Int> { spanStart..<Swift.max(spanStart, spanEnd) }

    /// Whether a marker found at `offset` is one the writer could have put there: at the start
    /// or the end of its own span, which lies after what was synced when it was written.
    /// Written without additions that could overflow: the offsets come from the file.
    public func fits(at offset: Int) -> Bool {
        syncedThrough >= 0 && syncedThrough <= spanStart && spanEnd >= spanStart
            && spanEnd - spanStart >= 2 * LogFormat.markerBytes
            && (offset == spanStart || offset == spanEnd - LogFormat.markerBytes)
    }
}

/// The on-disk framing of records and segments (see docs/internals/oplog-format.md).
public enum LogFormat {
    /// The segment format this code writes: 2 (records framed by synced-through markers).
    /// Version 1 (records only) is still read; it never holds markers.
    public static let version: UInt16 = 2
    /// "BNYLOG" then the format version (u16 LE).
    public static let headerMagic: [UInt8] = Array("BNYLOG".utf8)
    /// The header of a segment this code writes (version 2).
    public static let segmentHeader: [UInt8] = header(version: version)
    /// The header of a version-1 segment (written before synced-through markers existed).
    public static let segmentHeaderV1: [UInt8] = header(version: 1)
    /// Bytes before a record's body: length (u32) and checksum (u32).
    public static let frameBytes = 8
    /// Fixed part of the body: index (u64), term (u64), kind (u8).
    public static let bodyFixedBytes = 17
    /// Largest body accepted; anything larger is a corrupt length.
    public static let maxRecordBytes = 64 * 1024 * 1024
    /// A marker's length field: the top bit (no record length has it) and its 24-byte body.
    public static let markerLengthField: UInt32 = 0x8000_0000 | 24
    /// A marker's size on disk: length, checksum, synced-through, span start and end (u64 each).
    public static let markerBytes = 32

    /// The segment header for `version`.
    public static func header(version: UInt16) -> [UInt8] {
        var w = ByteWriter(capacity: 8)
        w.raw(headerMagic)
        w.u16(version)
        return w.finish()
    }

    /// The version a segment header names, or nil when `bytes` (at least 8) is not one this code
    /// reads (1 or 2).
    public static func headerVersion(_ bytes: UnsafeBufferPointer<UInt8>) -> UInt16? {
        var r = ByteReader(UnsafeRawBufferPointer(bytes))
        guard (try? r.magic(headerMagic, "segment header")) != nil, let v = try? r.u16("segment version"), v == 1 || v == 2 else { return nil }
        return v
    }

    /// Appends the framed record for `entry` to `out`.
    public static func encode(_ entry: LogRecord, into out: inout [UInt8]) {
        let start = out.count
        var w = ByteWriter(continuing: &out)
        w.u32(UInt32(bodyFixedBytes + entry.payload.count))
        w.u32(0)  // checksum placeholder
        w.u64(entry.index)
        w.u64(entry.term)
        w.u8(entry.kind)
        w.raw(entry.payload)
        let crc = w.out.withUnsafeBufferPointer { CRC32C.checksum(UnsafeBufferPointer(rebasing: $0[(start + frameBytes)...])) }
        w.patch(crc, at: start + 4)
        out = w.finish()
    }

    public static func encode(_ entries: [LogRecord]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(entries.reduce(0) { $0 + frameBytes + bodyFixedBytes + $1.payload.count })
        for entry in entries { encode(entry, into: &out) }
        return out
    }

    /// The 32 bytes of `marker`.
    public static func encode(_ marker: SyncMarker) -> [UInt8] {
        var body = ByteWriter(capacity: 24)
        body.u64(UInt64(marker.syncedThrough))
        body.u64(UInt64(marker.spanStart))
        body.u64(UInt64(marker.spanEnd))
        var w = ByteWriter(capacity: markerBytes)
        w.u32(markerLengthField)
        w.u32(CRC32C.checksum(body.out))
        w.raw(body.out)
        return w.finish()
    }

    /// The marker framed at `offset`, when a complete one with a matching checksum is there and
    /// fits its position (`SyncMarker.fits`); nil otherwise (the caller has seen the length field).
    static func marker(_ bytes: UnsafeBufferPointer<UInt8>, at offset: Int) -> SyncMarker? {
        guard offset >= 0, bytes.count - offset >= markerBytes else { return nil }
        var r = ByteReader(UnsafeRawBufferPointer(bytes), at: offset)
        guard let length = try? r.u32("marker length"), length == markerLengthField, let stored = try? r.u32("marker checksum"),
            let s = try? r.u64("synced through"), let a = try? r.u64("span start"), let b = try? r.u64("span end"),
            s < UInt64(Int.max), a < UInt64(Int.max), b < UInt64(Int.max)
        else { return nil }
        let marker = SyncMarker(syncedThrough: Int(s), spanStart: Int(a), spanEnd: Int(b))
        guard marker.fits(at: offset) else { return nil }
        guard CRC32C.checksum(UnsafeBufferPointer(rebasing: bytes[(offset + frameBytes)..<(offset + markerBytes)])) == stored else { return nil }
        return marker
    }

    /// A frame's length field and stored checksum at `offset`, nil when fewer than 8 bytes remain.
    static func frameHeader(_ bytes: UnsafeBufferPointer<UInt8>, at offset: Int) -> (length: UInt32, checksum: UInt32)? {
        var r = ByteReader(UnsafeRawBufferPointer(bytes), at: offset)
        guard let length = try? r.u32("record length"), let checksum = try? r.u32("record checksum") else { return nil }
        return (length, checksum)
    }

    /// A record body's index and term (the body must hold at least `bodyFixedBytes`).
    static func indexAndTerm(_ bytes: UnsafeBufferPointer<UInt8>, body: Int) -> (index: UInt64, term: UInt64)? {
        var r = ByteReader(UnsafeRawBufferPointer(bytes), at: body)
        guard let index = try? r.u64("record index"), let term = try? r.u64("record term") else { return nil }
        return (index, term)
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
}
