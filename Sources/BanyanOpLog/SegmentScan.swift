import BanyanBasics

/// The result of checking one segment's bytes (pure: the caller reads the file).
public struct SegmentScan: Sendable, Equatable {
    public enum Outcome: Sendable, Equatable {
        /// Every byte belongs to a valid record (or marker).
        case clean
        /// Valid records end at `offset` and every byte after it is zero: space the log
        /// preallocated and has not written yet (last segment only). Nothing to repair.
        case zeroTail(offset: Int)
        /// The data ends inside a record, a last record fails its checksum and ends exactly at the
        /// end, or (last segment only) a bad record shows a sector that was never written and no
        /// valid record follows it, or the synced-through markers prove that everything from the
        /// damage on was written after the segment's last sync (`syncEvidence ==
        /// .neverSynced`): a write interrupted by a power loss. `offset` is where valid data ends.
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

    /// What the synced-through markers say about damage in the last segment (format version 2).
    public enum SyncEvidence: Sendable, Equatable {
        /// No marker after the damage says the segment was synced beyond it (the largest says
        /// `syncedThrough`), and a valid marker follows every valid record after the damage (or
        /// the last one lies inside the batch of the marker before it): the damage lies in bytes
        /// written after the segment's last sync.
        case neverSynced(syncedThrough: Int)
        /// A marker after the damage says the segment was synced through `syncedThrough`, beyond
        /// the damage: synced bytes were damaged.
        case syncedBeyondDamage(syncedThrough: Int, markerOffset: Int)
        /// The valid record at `firstOffset` after the damage (and any after it) has no valid marker
        /// after it and lies outside the batch of the marker before it (a version-1 segment, or
        /// the markers of its batch were damaged too): nothing proves it was written before a
        /// sync covered the damage.
        case recordsWithoutMarkers(firstOffset: Int)
    }

    /// Valid entries in order (payloads included only when requested).
    public var entries: [LogRecord]
    /// Byte offset of each entry's frame, parallel to `entries`.
    public var offsets: [Int]
    public var outcome: Outcome
    /// True when the file does not even hold a complete header.
    public var headerMissing: Bool
    /// Set in the last segment when valid records exist after the damage that ended the scan:
    /// with a `corrupt` outcome they are why it is refused; with a `tornTail` outcome the markers
    /// proved them unsynced and the cut drops them (nil: none were found; not searched in other
    /// segments).
    public var recordsAfterDamage: RecordsAfterDamage?
    /// Set in the last segment when the damage search found markers or valid records after the
    /// damage: what the markers say (see `SyncEvidence`).
    public var syncEvidence: SyncEvidence?
    /// The segment's format version (1 or 2; 0 when its header is missing or unreadable).
    public var version: UInt16 = 0
    /// The valid data (up to the outcome's offset) ends inside the span of a write batch whose
    /// trailing marker is not part of it (a batch cut by a crash, a recovery cut, or
    /// `truncate`): the writer must not add batches to this segment, or a stale span could
    /// later vouch for bytes it never covered. It starts a new segment instead.
    public var endsInsideBatch = false
    /// The last valid synced-through marker before the end of the valid data (nil: none, or a
    /// version-1 segment). Recovery reads it to tell whether the disk already records a sync
    /// covering every record (an empty batch ending the data).
    public var lastMarker: SyncMarker?

    /// The largest offset any valid marker of the segment says it was synced through: the last
    /// marker before the end of the valid data, or one the search after damage found (0: none).
    /// Markers are written only after the sync they report, so the claim is true wherever the
    /// marker is read from, the page cache included.
    public var highestSyncClaim: Int {
        var claim = lastMarker?.syncedThrough ?? 0
        switch syncEvidence {
        case .syncedBeyondDamage(let through, _)?, .neverSynced(let through)?: claim = Swift.max(claim, through)
        default: break
        }
        return claim
    }

    /// Checks a segment. `expectedFirstIndex`, when given, is the index the first record must
    /// carry (the segment's name); records must then be consecutive. With `isLast` false, any
    /// incomplete data is corruption (earlier segments were synced and cut to their records before
    /// the next was created). `sectorBytes` is the unit a disk writes whole: in the last segment,
    /// a bad record overlapping an all-zero sector (or running into the end of the data) is a torn
    /// write when no valid record follows it, or when the synced-through markers prove that every
    /// valid record after it was written after the segment's last sync (docs/internals/oplog-format.md).
    /// Otherwise a valid record after the damage may have been synced and acknowledged: such
    /// damage is `corrupt`, with `recordsAfterDamage` and `syncEvidence` set.
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
            let prefixMatches = zip(bytes, LogFormat.headerMagic).allSatisfy { $0 == $1 } || bytes.allSatisfy { $0 == 0 }
            result.headerMissing = true
            result.outcome = isLast && prefixMatches ? .tornTail(offset: 0) : .corrupt(offset: 0, reason: "incomplete segment header")
            return result
        }
        if isLast, UnsafeBufferPointer(rebasing: bytes[0..<header.count]).allSatisfy({ $0 == 0 }) {
            // A new segment whose header sector never reached the disk (later ones may have): it
            // was never synced, so nothing in it was acknowledged, unless valid records follow
            // that the markers do not prove unsynced (a synced segment whose first sector the
            // disk now returns as zeros). The version is unknown: markers are looked for.
            result.headerMissing = true
            let search = damageSearch(bytes, damageAt: 0, minimumIndex: expectedFirstIndex, minimumTerm: 0, markers: true, preceding: nil)
            result.recordsAfterDamage = search.records
            result.syncEvidence = search.evidence(damageAt: 0)
            if search.allowsCut(bytes, damageAt: 0, unwritten: true, sectorBytes: sectorBytes) {
                result.outcome = .tornTail(offset: 0)
            } else {
                result.outcome = .corrupt(offset: 0, reason: "the segment header is zeros but valid records follow it")
            }
            return result
        }
        guard let version = LogFormat.headerVersion(UnsafeBufferPointer(rebasing: bytes[0..<header.count])) else {
            let bad = (0..<header.count).first { i in i >= 6 || bytes[i] != header[i] } ?? 0
            result.outcome = .corrupt(offset: bad, reason: "bad segment header (not a Banyan log segment, or an unknown version)")
            return result
        }
        result.version = version
        let markersAllowed = version >= 2
        var offset = header.count
        var expected = expectedFirstIndex
        var lastTerm: UInt64 = 0
        var lastMarker: SyncMarker?
        /// Records where the outcome puts the end of the valid data.
        func finish(_ outcome: Outcome, end: Int) {
            result.outcome = outcome
            result.endsInsideBatch = lastMarker.map { end < $0.spanEnd } ?? false
            result.lastMarker = lastMarker
        }
        while offset < bytes.count {
            if isLast, bytes[offset] == 0, SegmentScan.allZero(UnsafeBufferPointer(rebasing: bytes[offset...])) {
                finish(.zeroTail(offset: offset), end: offset)
                return result
            }
            /// Decides what a bad frame at `offset` is. `unwritten`: it shows a sector that never
            /// reached the disk (still preallocated zeros), or nothing follows it.
            func problem(_ reason: String, unwritten: Bool) -> Outcome {
                guard isLast else { return .corrupt(offset: offset, reason: reason) }
                // Write-back of an unsynced tail need not go in order, so a valid record after
                // the damage does not prove the damage was synced; but it may have been, and
                // cutting there could drop acknowledged records. Cut only when nothing valid
                // follows, or when the markers prove that nothing from the damage on was synced.
                let search = SegmentScan.damageSearch(
                    bytes, damageAt: offset, minimumIndex: expected, minimumTerm: lastTerm, markers: markersAllowed, preceding: lastMarker)
                result.recordsAfterDamage = search.records
                result.syncEvidence = search.evidence(damageAt: offset)
                if search.allowsCut(bytes, damageAt: offset, unwritten: unwritten, sectorBytes: sectorBytes) { return .tornTail(offset: offset) }
                if case .syncedBeyondDamage(let through, let at)? = result.syncEvidence {
                    return .corrupt(offset: offset, reason: "\(reason); a synced-through marker at byte \(at) says the segment was synced through byte \(through)")
                }
                return .corrupt(offset: offset, reason: reason)
            }
            guard let (lengthField, stored) = LogFormat.frameHeader(bytes, at: offset) else {
                finish(problem("incomplete record frame", unwritten: true), end: offset)
                return result
            }
            if markersAllowed, lengthField == LogFormat.markerLengthField {
                if bytes.count - offset < LogFormat.markerBytes {
                    finish(problem("incomplete synced-through marker", unwritten: true), end: offset)
                    return result
                }
                guard let marker = LogFormat.marker(bytes, at: offset) else {
                    let unwritten = offset + LogFormat.markerBytes >= bytes.count
                        || SegmentScan.firstZeroSector(bytes, from: offset, to: offset + LogFormat.markerBytes, sectorBytes: sectorBytes) != nil
                    finish(problem("bad synced-through marker", unwritten: unwritten), end: offset)
                    return result
                }
                lastMarker = marker
                offset += LogFormat.markerBytes
                continue
            }
            let length = Int(lengthField)
            guard length >= LogFormat.bodyFixedBytes, length <= LogFormat.maxRecordBytes else {
                // We never write a length out of range, so one that is there is corruption, except
                // in the last segment when the field touches a sector that never reached the disk
                // (still preallocated zeros; the all-zero tail was handled above).
                let unwritten = SegmentScan.firstZeroSector(bytes, from: offset, to: offset + 4, sectorBytes: sectorBytes) != nil
                finish(problem("record length \(length) out of range", unwritten: unwritten), end: offset)
                return result
            }
            let bodyStart = offset + LogFormat.frameBytes
            let end = bodyStart + length
            if end > bytes.count {
                finish(problem("record runs past the end of the segment", unwritten: true), end: offset)
                return result
            }
            let crc = CRC32C.checksum(UnsafeBufferPointer(rebasing: bytes[bodyStart..<end]))
            guard crc == stored, let (index, term) = LogFormat.indexAndTerm(bytes, body: bodyStart) else {
                let unwritten = end >= bytes.count
                    || SegmentScan.firstZeroSector(bytes, from: offset, to: end, sectorBytes: sectorBytes) != nil
                finish(problem("checksum mismatch", unwritten: unwritten), end: offset)
                return result
            }
            let kind = bytes[bodyStart + 16]
            if let e = expected, index != e {
                finish(.corrupt(offset: offset, reason: "index \(index) where \(e) was expected"), end: offset)
                if isLast {
                    let search = damageSearch(bytes, damageAt: offset, minimumIndex: e, minimumTerm: lastTerm, markers: markersAllowed, preceding: lastMarker)
                    result.recordsAfterDamage = search.records
                    result.syncEvidence = search.evidence(damageAt: offset)
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
        finish(.clean, end: bytes.count)
        return result
    }
}

extension SegmentScan {
    /// Whether every byte is zero, eight at a time (a segment's preallocated tail is up to
    /// `preallocationBytes` of zeros, checked at every recovery).
    static func allZero(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let raw = UnsafeRawBufferPointer(bytes)
        var i = 0
        while i + 8 <= raw.count {
            if raw.loadUnaligned(fromByteOffset: i, as: UInt64.self) != 0 { return false }
            i += 8
        }
        while i < raw.count {
            if raw[i] != 0 { return false }
            i += 1
        }
        return true
    }

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
            if allZero(UnsafeBufferPointer(rebasing: bytes[low..<high])) { return low }
            low = high
        }
        return nil
    }

    /// What the search after damage found: valid records, and what valid markers say.
    struct DamageSearch {
        var records: RecordsAfterDamage?
        /// The largest synced-through offset of a marker after the damage, and where that marker is.
        var mostSynced: (through: Int, at: Int)?
        /// The first of the valid records after the damage that no marker vouches for.
        var firstUncovered: Int?
        var markersFound = 0
        /// Where the first valid frame (record or marker) after the damage starts.
        var firstValid: Int?

        func evidence(damageAt start: Int) -> SyncEvidence? {
            if let m = mostSynced, m.through > start { return .syncedBeyondDamage(syncedThrough: m.through, markerOffset: m.at) }
            if let u = firstUncovered { return .recordsWithoutMarkers(firstOffset: u) }
            if case .unknown? = records { return nil }
            if records != nil || markersFound > 0 { return .neverSynced(syncedThrough: mostSynced?.through ?? 0) }
            return nil
        }

        /// Whether the damage at `start` may be cut as a torn tail. `unwritten`: the bad frame
        /// shows a never-written sector or runs into the end of the data (enough when nothing
        /// valid follows). With valid records after it, the damaged bytes themselves (up to the
        /// first valid frame) must hold an all-zero sector, as a sector write-back never reached
        /// does, and the markers must prove that nothing from the damage on was synced.
        func allowsCut(_ bytes: UnsafeBufferPointer<UInt8>, damageAt start: Int, unwritten: Bool, sectorBytes: Int) -> Bool {
            if let m = mostSynced, m.through > start { return false }
            switch records {
            case nil: return unwritten
            case .unknown?: return false
            case .found?:
                return firstUncovered == nil
                    && SegmentScan.firstZeroSector(bytes, from: start, to: firstValid ?? bytes.count, sectorBytes: sectorBytes) != nil
            }
        }
    }

    /// The valid records and markers after damage at `damageAt` (a frame boundary where a record
    /// with index `minimumIndex` should have started; nil when no index is known yet, which lifts
    /// the index checks). `markers`: the segment may hold synced-through markers (version 2, or
    /// unknown). `preceding`: the last valid marker before the damage.
    ///
    /// A candidate frame may start at any byte (frames are not aligned), so every offset is
    /// tried, but only after cheap checks: for a record, the length is in range and fits, the
    /// index is at least `minimumIndex` and at most one more per 25 bytes (the smallest record)
    /// since the damage, and the term is at least `minimumTerm` (terms never decrease along the
    /// log); for a marker, the length field is the marker's and its span fits its position. Runs
    /// of zeros are skipped whole. A frame that passes its checksum is skipped whole too, so valid
    /// data costs one checksum per byte. Frames that pass the cheap checks but fail their checksum
    /// are charged against a budget of four times the segment (plus 1 MiB); past it the search
    /// stops and answers `unknown`, so the scan stays linear in the segment's size on any input.
    ///
    /// A valid marker vouches for every record before it: batches go into a segment in offset
    /// order (the writer never writes below a segment's end, and starts a new segment after any
    /// cut inside a batch), and the synced-through offset only grows, so a record's batch was
    /// synced through no more than any later marker says. The marker before a record vouches for
    /// it when its batch's span contains the record. Records after the last marker that its span
    /// does not contain are unvouched: the first of them is `firstUncovered`.
    static func damageSearch(
        _ bytes: UnsafeBufferPointer<UInt8>, damageAt start: Int, minimumIndex: UInt64?, minimumTerm: UInt64, markers: Bool,
        preceding: SyncMarker?
    ) -> DamageSearch {
        let smallestRecord = LogFormat.frameBytes + LogFormat.bodyFixedBytes
        var budget = 4 * bytes.count + (1 << 20)
        var found: (first: UInt64, last: UInt64, firstOffset: Int)?
        var search = DamageSearch()
        var span: Range<Int>? = preceding?.span
        // The first record since the last marker that the span before it did not contain.
        var pending: Int?
        func result(_ records: RecordsAfterDamage?) -> DamageSearch {
            search.firstUncovered = pending
            search.records = records
            return search
        }
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
            guard let (lengthField, stored) = LogFormat.frameHeader(bytes, at: offset) else { break }
            if markers, lengthField == LogFormat.markerLengthField, bytes.count - offset >= LogFormat.markerBytes {
                if let marker = LogFormat.marker(bytes, at: offset) {
                    search.firstValid = search.firstValid ?? offset
                    pending = nil
                    span = marker.span
                    search.markersFound += 1
                    if marker.syncedThrough > (search.mostSynced?.through ?? -1) { search.mostSynced = (marker.syncedThrough, offset) }
                    offset += LogFormat.markerBytes
                    continue
                }
                budget -= LogFormat.markerBytes
                if budget < 0 { return result(found.map { .found(first: $0.first, last: $0.last, firstOffset: $0.firstOffset) } ?? .unknown) }
                offset += 1
                continue
            }
            let length = Int(lengthField)
            let bodyStart = offset + LogFormat.frameBytes
            guard length >= LogFormat.bodyFixedBytes, length <= LogFormat.maxRecordBytes, bodyStart + length <= bytes.count,
                let (index, term) = LogFormat.indexAndTerm(bytes, body: bodyStart)
            else {
                offset += 1
                continue
            }
            let floor = found.map { $0.last &+ 1 } ?? minimumIndex ?? 0
            let ceiling = minimumIndex.map { $0 &+ UInt64((offset - start) / smallestRecord) } ?? UInt64.max
            guard index >= floor, index <= ceiling, term >= minimumTerm else {
                offset += 1
                continue
            }
            if CRC32C.checksum(UnsafeBufferPointer(rebasing: bytes[bodyStart..<(bodyStart + length)])) == stored {
                found = (found?.first ?? index, index, found?.firstOffset ?? offset)
                search.firstValid = search.firstValid ?? offset
                let end = bodyStart + length
                if pending == nil, !(span.map { $0.lowerBound <= offset && end <= $0.upperBound } ?? false) { pending = offset }
                offset = end
                continue
            }
            budget -= length
            if budget < 0 { return result(found.map { .found(first: $0.first, last: $0.last, firstOffset: $0.firstOffset) } ?? .unknown) }
            offset += 1
        }
        return result(found.map { .found(first: $0.first, last: $0.last, firstOffset: $0.firstOffset) })
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

    /// `mayVote` has no default, here or in `BanyanRaft.HardState` (they once had opposite ones):
    /// every caller says whether the node may vote. A blank node's is `mayVote: false`.
    public init(term: UInt64 = 0, vote: UInt64 = 0, commit: UInt64 = 0, mayVote: Bool) {
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
        var w = ByteWriter(capacity: 35)
        w.raw(HardStateRecord.magic)
        w.u64(term)
        w.u64(vote)
        w.u64(commit)
        w.bool(mayVote)
        w.u32(CRC32C.checksum(w.out))
        return w.finish()
    }

    /// Decodes, or nil when the bytes are not a complete, checksummed hard state.
    public init?(encoded bytes: [UInt8]) {
        let isV2 = bytes.count == 35 && bytes.starts(with: HardStateRecord.magic)
        let isV1 = bytes.count == 34 && bytes.starts(with: HardStateRecord.magicV1)
        guard isV1 || isV2 else { return nil }
        typealias Fields = (record: HardStateRecord, bodyEnd: Int, stored: UInt32)
        let fields: Fields? = try? ByteReader.readAll(bytes) { (r: inout ByteReader) throws(ByteCodecError) -> Fields in
            try r.magic(isV2 ? HardStateRecord.magic : HardStateRecord.magicV1, "hard state magic")
            let term = try r.u64("term")
            let vote = try r.u64("vote")
            let commit = try r.u64("commit")
            let mayVote = isV2 ? try r.bool("may vote") : true
            let bodyEnd = r.at
            let stored = try r.u32("hard state checksum")
            return (HardStateRecord(term: term, vote: vote, commit: commit, mayVote: mayVote), bodyEnd, stored)
        }
        guard let fields, CRC32C.checksum(Array(bytes[0..<fields.bodyEnd])) == fields.stored else { return nil }
        self = fields.record
    }
}
