/// Log segments as recovery reads them (`SegmentScan`), and the hard-state record.
///
/// Input: a selector byte, then the segment's bytes. Selector bits: 0 the last segment, 1 an
/// expected first index (1), 2 repair checksums first (so that mutations get past them: every
/// frame that fits gets the checksum of its body), 3 keep payloads, 4 a hard-state record
/// instead.
///
/// Invariants: the scan's records lie in order inside the file, each re-encodes to the bytes it
/// was read from, indexes follow on, scanning without payloads finds the same records, and the
/// outcome's offsets lie inside the file.
import BanyanOpLog
import FuzzSupport

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzLog(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzEntry(data, size) { selector, input in
        var segment = input
        if selector & 16 != 0 {
            guard let record = HardStateRecord(encoded: segment) else { return }
            require(HardStateRecord(encoded: record.encoded) == record, "hard state does not round-trip")
            return
        }
        if selector & 4 != 0 { repairChecksums(&segment) }
        let isLast = selector & 1 != 0
        let expected: UInt64? = selector & 2 != 0 ? 1 : nil
        let scan = SegmentScan.scan(segment, expectedFirstIndex: expected, isLast: isLast, keepPayloads: selector & 8 != 0)
        check(scan, segment, expected: expected, payloads: selector & 8 != 0)
        let other = SegmentScan.scan(segment, expectedFirstIndex: expected, isLast: isLast, keepPayloads: selector & 8 == 0)
        require(other.offsets == scan.offsets && other.outcome == scan.outcome, "keeping payloads changed the scan")
        require(zip(other.entries, scan.entries).allSatisfy { $0.index == $1.index && $0.term == $1.term && $0.kind == $1.kind }, "entries differ")
    }
}

func check(_ scan: SegmentScan, _ bytes: [UInt8], expected: UInt64?, payloads: Bool) {
    require(scan.entries.count == scan.offsets.count, "entries and offsets differ in number")
    var previousEnd = 0
    for (entry, offset) in zip(scan.entries, scan.offsets) {
        require(offset >= previousEnd, "records overlap or go backwards")
        if payloads {
            var encoded: [UInt8] = []
            LogFormat.encode(entry, into: &encoded)
            require(offset + encoded.count <= bytes.count && Array(bytes[offset..<offset + encoded.count]) == encoded, "record at \(offset) does not re-encode to its bytes")
            previousEnd = offset + encoded.count
        } else {
            previousEnd = offset + LogFormat.frameBytes + LogFormat.bodyFixedBytes
        }
    }
    for (a, b) in zip(scan.entries, scan.entries.dropFirst()) {
        require(b.index == a.index &+ 1, "indexes do not follow on: \(a.index), \(b.index)")
    }
    if let expected, let first = scan.entries.first { require(first.index == expected, "first index \(first.index), expected \(expected)") }
    switch scan.outcome {
    case .clean: break
    case .zeroTail(let offset), .tornTail(let offset), .corrupt(let offset, _):
        require(offset >= 0 && offset <= bytes.count, "outcome offset \(offset) outside the file")
        require(offset >= (scan.offsets.last ?? 0), "damage before the last valid record")
    }
}

/// Gives every frame that fits (records and markers) the checksum of its body.
func repairChecksums(_ bytes: inout [UInt8]) {
    var offset = LogFormat.segmentHeader.count
    func u32(_ at: Int) -> UInt32 { (0..<4).reduce(0) { $0 | UInt32(bytes[at + $1]) << (8 * UInt32($1)) } }
    while offset + LogFormat.frameBytes <= bytes.count {
        let length = u32(offset)
        let body = length == LogFormat.markerLengthField ? 24 : Int(length)
        guard length == LogFormat.markerLengthField || (body >= LogFormat.bodyFixedBytes && body <= LogFormat.maxRecordBytes),
            offset + LogFormat.frameBytes + body <= bytes.count
        else { return }
        let start = offset + LogFormat.frameBytes
        let crc = CRC32C.checksum(Array(bytes[start..<start + body]))
        for i in 0..<4 { bytes[offset + 4 + i] = UInt8(truncatingIfNeeded: crc >> (8 * UInt32(i))) }
        offset = start + body
    }
}
