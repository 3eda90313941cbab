/// The result of checking one segment's bytes (pure: the caller reads the file).
public struct SegmentScan: Sendable, Equatable {
    public enum Outcome: Sendable, Equatable {
        /// Every byte belongs to a valid record.
        case clean
        /// Valid records end at `offset` and every byte after it is zero: space the log
        /// preallocated and has not written yet (last segment only). Nothing to repair.
        case zeroTail(offset: Int)
        /// The data ends inside a record, a last record fails its checksum and ends exactly at the
        /// end, or (last segment only) a bad record shows a sector that was never written, and
        /// no valid record follows anywhere after it: a write interrupted by a crash. `offset` is
        /// where valid data ends.
        case tornTail(offset: Int)
        /// Invalid data before the end: never repaired by guessing. In the last segment,
        /// `recordsAfterDamage` says whether valid records were found after it.
        case corrupt(offset: Int, reason: String)
    }

    /// Valid records found after the damage that ended the scan (last segment only).
    public enum RecordsAfterDamage: Sendable, Equatable {
        /// Valid records (checksum passes, index at or after the one the damaged record should
        /// have had) with indexes from `first` to `last` (not necessarily all of them between)
        /// start at `firstOffset` and later.
        case found(first: UInt64, last: UInt64, firstOffset: Int)
        /// The search gave up (too many plausible-looking frames failed their checksum): a
        /// valid record may follow, so the damage is not treated as a torn tail.
        case unknown
    }

    /// Valid entries in order (payloads included only when requested).
    public var entries: [LogRecord]
    /// Byte offset of each entry's frame, parallel to `entries`.
    public var offsets: [Int]
    public var outcome: Outcome
    /// True when the file does not even hold a complete header.
    public var headerMissing: Bool
    /// Set with a `corrupt` outcome in the last segment when valid records exist after the
    /// damage (nil: none were found; not searched in other segments).
    public var recordsAfterDamage: RecordsAfterDamage?

    /// Checks a segment. `expectedFirstIndex`, when given, is the index the first record must
    /// carry (the segment's name); records must then be consecutive. With `isLast` false, any
    /// incomplete data is corruption (earlier segments were synced and cut to their records before
    /// the next was created). `sectorBytes` is the unit a disk writes whole: in the last segment,
    /// a bad record overlapping an all-zero sector (or running into the end of the data) is a torn
    /// write only when no valid record follows it anywhere in the segment. A valid record after
    /// the damage proves the damage is not the end of what was written, and a sync may have
    /// covered it: such damage is `corrupt`, with `recordsAfterDamage` set.
    public static func scan(
        _ bytes: [UInt8], expectedFirstIndex: UInt64?, isLast: Bool, keepPayloads: Bool = true, sectorBytes: Int = 512
    ) -> SegmentScan {
        bytes.withUnsafeBufferPointer {
            scan($0, expectedFirstIndex: expectedFirstIndex, isLast: isLast, keepPayloads: keepPayloads, sectorBytes: sectorBytes)
        }
    }

    public static func scan(
        _ bytes: UnsafeBufferPointer<UInt8>, expectedFirstIndex: UInt64?, isLast: Bool, keepPayloads: Bool, sectorBytes: Int = 512
    ) -> SegmentScan {
        var result = SegmentScan(entries: [], offsets: [], outcome: .clean, headerMissing: false)
        let header = LogFormat.segmentHeader
        if bytes.count < header.count {
            // A crash right after creating the file: only legal at the end of the log.
            // (A prefix of the header, or zeros: its sector never reached the disk.)
            let prefixMatches = zip(bytes, header).allSatisfy { $0 == $1 } || bytes.allSatisfy { $0 == 0 }
            result.headerMissing = true
            result.outcome = isLast && prefixMatches ? .tornTail(offset: 0) : .corrupt(offset: 0, reason: "incomplete segment header")
            return result
        }
        if isLast, UnsafeBufferPointer(rebasing: bytes[0..<header.count]).allSatisfy({ $0 == 0 }) {
            // A new segment whose header sector never reached the disk (later ones may have): it
            // was never synced, so nothing in it was acknowledged, unless valid records follow
            // (a synced segment whose first sector the disk now returns as zeros).
            result.headerMissing = true
            if let after = recordsAfter(bytes, damageAt: 0, minimumIndex: expectedFirstIndex, minimumTerm: 0) {
                result.recordsAfterDamage = after
                result.outcome = .corrupt(offset: 0, reason: "the segment header is zeros but valid records follow it")
            } else {
                result.outcome = .tornTail(offset: 0)
            }
            return result
        }
        for i in 0..<header.count where bytes[i] != header[i] {
            result.outcome = .corrupt(offset: i, reason: "bad segment header (not a Banyan log segment, or an unknown version)")
            return result
        }
        var offset = header.count
        var expected = expectedFirstIndex
        var lastTerm: UInt64 = 0
        while offset < bytes.count {
            if isLast, bytes[offset] == 0, UnsafeBufferPointer(rebasing: bytes[offset...]).allSatisfy({ $0 == 0 }) {
                result.outcome = .zeroTail(offset: offset)
                return result
            }
            /// Decides what a bad record at `offset` is. `unwritten`: it shows a sector that never
            /// reached the disk (still preallocated zeros), or nothing follows it.
            func problem(_ reason: String, unwritten: Bool) -> Outcome {
                guard isLast else { return .corrupt(offset: offset, reason: reason) }
                // A torn tail has no valid record after it: write-back of the unsynced tail need
                // not go in order, but a valid record after the damage may have been covered by
                // a sync, so cutting there could drop acknowledged records. Refuse instead.
                let after = SegmentScan.recordsAfter(bytes, damageAt: offset, minimumIndex: expected, minimumTerm: lastTerm)
                if after == nil, unwritten { return .tornTail(offset: offset) }
                result.recordsAfterDamage = after
                return .corrupt(offset: offset, reason: reason)
            }
            if bytes.count - offset < LogFormat.frameBytes {
                result.outcome = problem("incomplete record frame", unwritten: true)
                return result
            }
            let length = Int(LogFormat.readLE(bytes, offset, as: UInt32.self))
            let stored = LogFormat.readLE(bytes, offset + 4, as: UInt32.self)
            guard length >= LogFormat.bodyFixedBytes, length <= LogFormat.maxRecordBytes else {
                // We never write a length out of range, so one that is there is corruption, except
                // in the last segment when the field touches a sector that never reached the disk
                // (still preallocated zeros; the all-zero tail was handled above).
                let unwritten = SegmentScan.firstZeroSector(bytes, from: offset, to: offset + 4, sectorBytes: sectorBytes) != nil
                result.outcome = problem("record length \(length) out of range", unwritten: unwritten)
                return result
            }
            let bodyStart = offset + LogFormat.frameBytes
            let end = bodyStart + length
            if end > bytes.count {
                result.outcome = problem("record runs past the end of the segment", unwritten: true)
                return result
            }
            let crc = CRC32C.checksum(UnsafeBufferPointer(rebasing: bytes[bodyStart..<end]))
            guard crc == stored else {
                let unwritten = end >= bytes.count
                    || SegmentScan.firstZeroSector(bytes, from: offset, to: end, sectorBytes: sectorBytes) != nil
                result.outcome = problem("checksum mismatch", unwritten: unwritten)
                return result
            }
            let index = LogFormat.readLE(bytes, bodyStart, as: UInt64.self)
            let term = LogFormat.readLE(bytes, bodyStart + 8, as: UInt64.self)
            let kind = bytes[bodyStart + 16]
            if let e = expected, index != e {
                result.outcome = .corrupt(offset: offset, reason: "index \(index) where \(e) was expected")
                if isLast {
                    result.recordsAfterDamage = recordsAfter(bytes, damageAt: offset, minimumIndex: e, minimumTerm: lastTerm)
                }
                return result
            }
            expected = index &+ 1
            lastTerm = term
            let payload = keepPayloads ? Array(bytes[(bodyStart + LogFormat.bodyFixedBytes)..<end]) : []
            result.entries.append(LogRecord(index: index, term: term, kind: kind, payload: payload))
            result.offsets.append(offset)
            offset = end
        }
        return result
    }
}

extension SegmentScan {
    /// Where the first stretch of a sector the last write-back never reached starts, looking from
    /// `start` to `end`: `start` itself when the bytes from it to the end of its sector are all
    /// zero, else the first later sector beginning before `end` that is all zero (up to the end of
    /// the data). Nil when there is none.
    static func firstZeroSector(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int, to end: Int, sectorBytes: Int) -> Int? {
        let sector = Swift.max(1, sectorBytes)
        let stop = Swift.min(end, bytes.count)
        var low = start
        while low < stop {
            let high = Swift.min(bytes.count, (low / sector + 1) * sector)
            if UnsafeBufferPointer(rebasing: bytes[low..<high]).allSatisfy({ $0 == 0 }) { return low }
            low = high
        }
        return nil
    }

    /// The valid records after damage at `damageAt` (a record boundary where a record with index
    /// `minimumIndex` should have started; nil when no index is known yet, which lifts the index
    /// checks), or nil when there are none.
    ///
    /// A candidate frame may start at any byte (records are not aligned), so every offset is
    /// tried, but only after cheap checks: the length is in range and fits, the index is at least
    /// `minimumIndex` and at most one more per 25 bytes (the smallest record) since the damage,
    /// and the term is at least `minimumTerm` (terms never decrease along the log). Runs of zeros
    /// are skipped whole. A frame that passes its checksum is skipped whole too, so valid data
    /// costs one checksum per byte. Frames that pass the cheap checks but fail their checksum
    /// are charged against a budget of four times the segment (plus 1 MiB); past it the search
    /// stops and answers `unknown`, so the scan stays linear in the segment's size on any input.
    static func recordsAfter(
        _ bytes: UnsafeBufferPointer<UInt8>, damageAt start: Int, minimumIndex: UInt64?, minimumTerm: UInt64
    ) -> RecordsAfterDamage? {
        let smallestRecord = LogFormat.frameBytes + LogFormat.bodyFixedBytes
        var budget = 4 * bytes.count + (1 << 20)
        var found: (first: UInt64, last: UInt64, firstOffset: Int)?
        var offset = start + 1
        while offset + smallestRecord <= bytes.count {
            if bytes[offset] == 0 {
                // A length field needs a non-zero byte among its four: inside a run of zeros, no
                // frame starts before the run's last three bytes.
                var runEnd = offset
                while runEnd < bytes.count, bytes[runEnd] == 0 { runEnd += 1 }
                if runEnd - offset > 3 {
                    offset = runEnd - 3
                    continue
                }
            }
            let length = Int(LogFormat.readLE(bytes, offset, as: UInt32.self))
            let bodyStart = offset + LogFormat.frameBytes
            guard length >= LogFormat.bodyFixedBytes, length <= LogFormat.maxRecordBytes, bodyStart + length <= bytes.count else {
                offset += 1
                continue
            }
            let index = LogFormat.readLE(bytes, bodyStart, as: UInt64.self)
            let floor = found.map { $0.last &+ 1 } ?? minimumIndex ?? 0
            let ceiling = minimumIndex.map { $0 &+ UInt64((offset - start) / smallestRecord) } ?? UInt64.max
            let term = LogFormat.readLE(bytes, bodyStart + 8, as: UInt64.self)
            guard index >= floor, index <= ceiling, term >= minimumTerm else {
                offset += 1
                continue
            }
            let stored = LogFormat.readLE(bytes, offset + 4, as: UInt32.self)
            if CRC32C.checksum(UnsafeBufferPointer(rebasing: bytes[bodyStart..<(bodyStart + length)])) == stored {
                found = (found?.first ?? index, index, found?.firstOffset ?? offset)
                offset = bodyStart + length
                continue
            }
            budget -= length
            if budget < 0 { return found.map { .found(first: $0.first, last: $0.last, firstOffset: $0.firstOffset) } ?? .unknown }
            offset += 1
        }
        return found.map { .found(first: $0.first, last: $0.last, firstOffset: $0.firstOffset) }
    }
}

/// The on-disk record of Raft's hard state (`BanyanRaft.HardState`, converted by `NodeStorage`):
/// current term, vote in that term (0 = none), commit index, and whether this node may vote
/// (false for a node that started from a blank disk until it was admitted; R22). The zero value
/// is a blank node's, which is what a missing file loads as.
public struct HardStateRecord: Sendable, Equatable {
    public var term: UInt64
    public var vote: UInt64
    public var commit: UInt64
    public var mayVote: Bool

    /// The zero value is a blank node's: no term, no vote, and no right to vote.
    public init(term: UInt64 = 0, vote: UInt64 = 0, commit: UInt64 = 0, mayVote: Bool = false) {
        self.term = term
        self.vote = vote
        self.commit = commit
        self.mayVote = mayVote
    }

    static let magicV1: [UInt8] = Array("BNYHS1".utf8)
    static let magic: [UInt8] = Array("BNYHS2".utf8)

    /// Version 2: 6-byte magic `BNYHS2`, three u64 LE (term, vote, commit), one flags byte (bit 0:
    /// may vote), CRC32C of the preceding bytes (u32 LE): 35 bytes. Version 1 (`BNYHS1`, 34 bytes,
    /// no flags) is still read, as a node that may vote (only founding members wrote it).
    public var encoded: [UInt8] {
        var out = HardStateRecord.magic
        LogFormat.appendLE(term, &out)
        LogFormat.appendLE(vote, &out)
        LogFormat.appendLE(commit, &out)
        out.append(mayVote ? 1 : 0)
        LogFormat.appendLE(CRC32C.checksum(out), &out)
        return out
    }

    /// Decodes, or nil when the bytes are not a complete, checksummed hard state.
    public init?(encoded bytes: [UInt8]) {
        let isV2 = bytes.count == 35 && Array(bytes[0..<6]) == HardStateRecord.magic
        let isV1 = bytes.count == 34 && Array(bytes[0..<6]) == HardStateRecord.magicV1
        guard isV1 || isV2 else { return nil }
        let body = isV2 ? 31 : 30
        let ok: HardStateRecord? = bytes.withUnsafeBufferPointer { b in
            let stored = LogFormat.readLE(b, body, as: UInt32.self)
            guard CRC32C.checksum(UnsafeBufferPointer(rebasing: b[0..<body])) == stored else { return nil }
            if isV2 && b[30] > 1 { return nil }
            return HardStateRecord(
                term: LogFormat.readLE(b, 6, as: UInt64.self), vote: LogFormat.readLE(b, 14, as: UInt64.self),
                commit: LogFormat.readLE(b, 22, as: UInt64.self), mayVote: isV2 ? b[30] == 1 : true)
        }
        guard let ok else { return nil }
        self = ok
    }
}
