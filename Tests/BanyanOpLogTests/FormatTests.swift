import BanyanOpLog
import Testing

private func entries(_ range: ClosedRange<UInt64>, term: UInt64 = 1, tag: String = "v1") -> [LogEntry] {
    range.map { LogEntry(index: $0, term: term, kind: 1, payload: Array("\(tag)-entry-\($0)".utf8)) }
}

/// A segment holding `list`, and each record's offset.
private func segment(_ list: [LogEntry]) -> (bytes: [UInt8], offsets: [Int]) {
    var bytes = LogFormat.segmentHeader
    var offsets: [Int] = []
    for entry in list {
        offsets.append(bytes.count)
        LogFormat.encode(entry, into: &bytes)
    }
    return (bytes, offsets)
}

@Suite struct FormatTests {
    @Test("CRC32C matches the RFC 3720 test vectors, in one shot and incrementally")
    func crc() {
        #expect(CRC32C.checksum(Array("123456789".utf8)) == 0xE306_9283)
        #expect(CRC32C.checksum([UInt8](repeating: 0, count: 32)) == 0x8A91_36AA)
        #expect(CRC32C.checksum([UInt8](repeating: 0xFF, count: 32)) == 0x62A8_AB43)
        #expect(CRC32C.checksum(Array(0...31)) == 0x46DD_794E)
        let data = (0..<1000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        #expect(CRC32C.checksum(Array(data[500...]), continuing: CRC32C.checksum(Array(data[..<500]))) == CRC32C.checksum(data))
    }

    @Test("records round-trip through a segment")
    func roundTrip() {
        let list = entries(1...50)
        let bytes = LogFormat.segmentHeader + LogFormat.encode(list)
        let scan = SegmentScan.scan(bytes, expectedFirstIndex: 1, isLast: true)
        #expect(scan.outcome == .clean)
        #expect(scan.entries == list)
    }

    @Test("a last record cut at any byte is a torn tail at its start; the others survive")
    func tornAtEveryByte() {
        let list = entries(1...5)
        let head = LogFormat.segmentHeader + LogFormat.encode(Array(list.prefix(4)))
        let full = head + LogFormat.encode([list[4]])
        for cut in head.count..<full.count {
            let scan = SegmentScan.scan(Array(full.prefix(cut)), expectedFirstIndex: 1, isLast: true)
            if cut == head.count {
                #expect(scan.outcome == .clean)
            } else {
                #expect(scan.outcome == .tornTail(offset: head.count), "cut at \(cut)")
            }
            #expect(scan.entries == Array(list.prefix(4)))
            // The same bytes in a segment that is not the last are corruption.
            if cut > head.count {
                let strict = SegmentScan.scan(Array(full.prefix(cut)), expectedFirstIndex: 1, isLast: false)
                if case .corrupt = strict.outcome {} else { Issue.record("cut at \(cut) not corrupt in a non-last segment") }
            }
        }
        // A header sector that never reached the disk (zeros) while later ones did: the whole
        // segment is an unsynced tail in the last segment, corruption in any other.
        let headless = [UInt8](repeating: 0, count: LogFormat.segmentHeader.count) + full.dropFirst(LogFormat.segmentHeader.count)
        let lost = SegmentScan.scan(headless, expectedFirstIndex: 1, isLast: true)
        #expect(lost.headerMissing && lost.outcome == .tornTail(offset: 0))
        if case .corrupt = SegmentScan.scan(headless, expectedFirstIndex: 1, isLast: false).outcome {} else { Issue.record("zero header in an earlier segment") }
        for cut in 0..<LogFormat.segmentHeader.count {
            let scan = SegmentScan.scan(Array(full.prefix(cut)), expectedFirstIndex: 1, isLast: true)
            #expect(scan.headerMissing && scan.outcome == .tornTail(offset: 0))
        }
    }

    @Test("a flipped byte before the tail is corruption naming the record's offset")
    func corruption() {
        let (bytes, offsets) = segment(entries(1...10))
        for victim in 0..<9 {
            var damaged = bytes
            damaged[offsets[victim] + 12] ^= 0x40
            let scan = SegmentScan.scan(damaged, expectedFirstIndex: 1, isLast: true)
            #expect(scan.outcome == .corrupt(offset: offsets[victim], reason: "checksum mismatch"), "victim \(victim)")
            #expect(scan.entries.count == victim)
        }
        // The last record complete but damaged, ending at the end of the file: treated as torn.
        var lastDamaged = bytes
        lastDamaged[offsets[9] + 20] ^= 1
        #expect(SegmentScan.scan(lastDamaged, expectedFirstIndex: 1, isLast: true).outcome == .tornTail(offset: offsets[9]))
        // A damaged length field in the middle is corruption too.
        var badLength = bytes
        badLength[offsets[3] + 3] = 0x7F
        if case .corrupt(let offset, _) = SegmentScan.scan(badLength, expectedFirstIndex: 1, isLast: true).outcome {
            #expect(offset == offsets[3])
        } else {
            Issue.record("bad length not detected")
        }
    }

    @Test("index gaps, wrong first indexes and foreign headers are corruption")
    func continuity() {
        // An all-zero tail (preallocated, not written yet) ends the records; nothing to repair.
        let zeroTail = LogFormat.segmentHeader + LogFormat.encode(entries(1...2)) + [UInt8](repeating: 0, count: 64)
        let scanned = SegmentScan.scan(zeroTail, expectedFirstIndex: 1, isLast: true)
        #expect(scanned.outcome == .zeroTail(offset: zeroTail.count - 64) && scanned.entries == entries(1...2))
        // Not in a segment other than the last (those are cut to their records at the roll).
        if case .corrupt = SegmentScan.scan(zeroTail, expectedFirstIndex: 1, isLast: false).outcome {} else { Issue.record("zero tail in a non-last segment") }
        let gap = LogFormat.segmentHeader + LogFormat.encode(entries(1...3) + entries(5...6))
        if case .corrupt(_, let reason) = SegmentScan.scan(gap, expectedFirstIndex: 1, isLast: true).outcome {
            #expect(reason.contains("index 5"))
        } else {
            Issue.record("gap not detected")
        }
        let wrongStart = LogFormat.segmentHeader + LogFormat.encode(entries(2...3))
        if case .corrupt = SegmentScan.scan(wrongStart, expectedFirstIndex: 1, isLast: true).outcome {} else { Issue.record("wrong start") }
        let foreign = Array("NOTALOG!".utf8) + LogFormat.encode(entries(1...2))
        if case .corrupt = SegmentScan.scan(foreign, expectedFirstIndex: 1, isLast: true).outcome {} else { Issue.record("foreign header") }
    }

    @Test("in the last segment, a bad record over a never-written sector is a torn write even with valid records after it; damage without one is not")
    func unwrittenSectors() {
        let sector = 16
        let list = entries(1...12)
        var (bytes, offsets) = segment(list)
        bytes += [UInt8](repeating: 0, count: 200)  // preallocated
        for victim in 3..<11 {
            // Write-back reached every sector but one inside record `victim` (still zeros).
            let zeroed = (offsets[victim] / sector + 1) * sector
            var torn = bytes
            for i in zeroed..<(zeroed + sector) { torn[i] = 0 }
            let scan = SegmentScan.scan(torn, expectedFirstIndex: 1, isLast: true, sectorBytes: sector)
            #expect(scan.outcome == .tornTail(offset: offsets[victim]), "victim \(victim)")
            #expect(scan.entries == Array(list.prefix(victim)))
            // The sector holding the record's start never written (a zero length field).
            var headless = bytes
            for i in offsets[victim]..<((offsets[victim] / sector + 1) * sector) { headless[i] = 0 }
            #expect(SegmentScan.scan(headless, expectedFirstIndex: 1, isLast: true, sectorBytes: sector).outcome == .tornTail(offset: offsets[victim]))
            // The same bytes in an earlier segment are corruption.
            if case .corrupt = SegmentScan.scan(torn, expectedFirstIndex: 1, isLast: false, sectorBytes: sector).outcome {} else {
                Issue.record("victim \(victim): not corrupt in a non-last segment")
            }
            // A flipped byte (no zero sector) with valid records after it stays corruption.
            var flipped = bytes
            flipped[offsets[victim] + 20] ^= 0x10
            #expect(SegmentScan.scan(flipped, expectedFirstIndex: 1, isLast: true, sectorBytes: sector).outcome
                == .corrupt(offset: offsets[victim], reason: "checksum mismatch"))
            // A damaged, non-zero length field too.
            var badLength = bytes
            badLength[offsets[victim] + 3] = 0x7F
            if case .corrupt(let offset, _) = SegmentScan.scan(badLength, expectedFirstIndex: 1, isLast: true, sectorBytes: sector).outcome {
                #expect(offset == offsets[victim])
            } else {
                Issue.record("victim \(victim): bad length not detected")
            }
        }
    }

    @Test("segment names sort by first index and parse back")
    func names() {
        #expect(LogFormat.segmentName(firstIndex: 1) == "00000000000000000001.seg")
        #expect(LogFormat.firstIndex(ofSegment: LogFormat.segmentName(firstIndex: 123_456)) == 123_456)
        #expect(LogFormat.firstIndex(ofSegment: "hardstate") == nil)
        #expect(LogFormat.segmentName(firstIndex: 9) < LogFormat.segmentName(firstIndex: 10))
    }

    @Test("hard state round-trips and any damaged byte is detected")
    func hardState() {
        let state = HardState(term: 7, vote: 3, commit: 12_345)
        let bytes = state.encoded
        #expect(HardState(encoded: bytes) == state)
        for i in bytes.indices {
            var damaged = bytes
            damaged[i] ^= 0x10
            #expect(HardState(encoded: damaged) == nil, "byte \(i)")
        }
        #expect(HardState(encoded: Array(bytes.prefix(20))) == nil)
    }

    @Test("hard state keeps whether the node may vote; version-1 files read as voters; a blank node may not vote")
    func hardStateMayVote() {
        for mayVote in [false, true] {
            let state = HardState(term: 2, vote: 1, commit: 9, mayVote: mayVote)
            #expect(state.encoded.count == 35)
            #expect(HardState(encoded: state.encoded) == state)
        }
        // A version-1 record (written before the flag existed): magic, three u64, CRC32C.
        var v1 = Array("BNYHS1".utf8)
        for v: UInt64 in [5, 3, 40] { for s in stride(from: 0, to: 64, by: 8) { v1.append(UInt8(truncatingIfNeeded: v >> UInt64(s))) } }
        let crc = CRC32C.checksum(v1)
        for s in stride(from: 0, to: 32, by: 8) { v1.append(UInt8(truncatingIfNeeded: crc >> UInt32(s))) }
        #expect(HardState(encoded: v1) == HardState(term: 5, vote: 3, commit: 40, mayVote: true))
        #expect(HardState().mayVote == false)
        // A flags byte other than 0 or 1 is damage even with a matching checksum.
        var odd = Array(HardState(term: 1, mayVote: true).encoded.prefix(31))
        odd[30] = 2
        let oddCRC = CRC32C.checksum(odd)
        for s in stride(from: 0, to: 32, by: 8) { odd.append(UInt8(truncatingIfNeeded: oddCRC >> UInt32(s))) }
        #expect(HardState(encoded: odd) == nil)
    }
}
