/// The result of checking one segment's bytes (pure: the caller reads the file).
public struct SegmentScan: Sendable, Equatable {
    public enum Outcome: Sendable, Equatable {
        /// Every byte belongs to a valid record.
        case clean
        /// The data ends inside a record (or a last record fails its checksum and ends exactly at
        /// the end): a write interrupted by a crash. `offset` is where valid data ends.
        case tornTail(offset: Int)
        /// Invalid data before the end: never repaired by guessing.
        case corrupt(offset: Int, reason: String)
    }

    /// Valid entries in order (payloads included only when requested).
    public var entries: [LogEntry]
    /// Byte offset of each entry's frame, parallel to `entries`.
    public var offsets: [Int]
    public var outcome: Outcome
    /// True when the file does not even hold a complete header.
    public var headerMissing: Bool

    /// Checks a segment. `expectedFirstIndex`, when given, is the index the first record must
    /// carry (the segment's name); records must then be consecutive. With `isLast` false, any
    /// incomplete data is corruption (earlier segments were synced before the next was created).
    public static func scan(_ bytes: [UInt8], expectedFirstIndex: UInt64?, isLast: Bool, keepPayloads: Bool = true) -> SegmentScan {
        bytes.withUnsafeBufferPointer { scan($0, expectedFirstIndex: expectedFirstIndex, isLast: isLast, keepPayloads: keepPayloads) }
    }

    public static func scan(_ bytes: UnsafeBufferPointer<UInt8>, expectedFirstIndex: UInt64?, isLast: Bool, keepPayloads: Bool) -> SegmentScan {
        var result = SegmentScan(entries: [], offsets: [], outcome: .clean, headerMissing: false)
        let header = LogFormat.segmentHeader
        if bytes.count < header.count {
            // A crash right after creating the file: only legal at the end of the log.
            let prefixMatches = zip(bytes, header).allSatisfy { $0 == $1 }
            result.headerMissing = true
            result.outcome = isLast && prefixMatches ? .tornTail(offset: 0) : .corrupt(offset: 0, reason: "incomplete segment header")
            return result
        }
        for i in 0..<header.count where bytes[i] != header[i] {
            result.outcome = .corrupt(offset: i, reason: "bad segment header (not a Banyan log segment, or an unknown version)")
            return result
        }
        var offset = header.count
        var expected = expectedFirstIndex
        while offset < bytes.count {
            func problem(_ reason: String, endsAt end: Int?) -> Outcome {
                // Torn only when this is the last segment, nothing follows the bad record, and
                // no valid later record exists (a damaged length field can make a record in the
                // middle look as if it ran to the end; the records after it prove otherwise).
                if isLast, end.map({ $0 >= bytes.count }) ?? true,
                    !SegmentScan.validRecordExists(in: bytes, after: offset, atLeast: expected ?? 0)
                {
                    return .tornTail(offset: offset)
                }
                return .corrupt(offset: offset, reason: reason)
            }
            if bytes.count - offset < LogFormat.frameBytes {
                result.outcome = problem("incomplete record frame", endsAt: nil)
                return result
            }
            let length = Int(LogFormat.readLE(bytes, offset, as: UInt32.self))
            let stored = LogFormat.readLE(bytes, offset + 4, as: UInt32.self)
            guard length >= LogFormat.bodyFixedBytes, length <= LogFormat.maxRecordBytes else {
                // A torn write keeps a prefix of what was written, so a complete length field is
                // genuine: an impossible one is corruption, except an all-zero tail (space the
                // file system extended but never filled).
                let zeroTail = isLast && bytes[offset...].allSatisfy { $0 == 0 }
                result.outcome = zeroTail ? .tornTail(offset: offset) : .corrupt(offset: offset, reason: "record length \(length) out of range")
                return result
            }
            let bodyStart = offset + LogFormat.frameBytes
            let end = bodyStart + length
            if end > bytes.count {
                result.outcome = problem("record runs past the end of the segment", endsAt: nil)
                return result
            }
            let crc = CRC32C.checksum(UnsafeBufferPointer(rebasing: bytes[bodyStart..<end]))
            guard crc == stored else {
                result.outcome = problem("checksum mismatch", endsAt: end)
                return result
            }
            let index = LogFormat.readLE(bytes, bodyStart, as: UInt64.self)
            let term = LogFormat.readLE(bytes, bodyStart + 8, as: UInt64.self)
            let kind = bytes[bodyStart + 16]
            if let e = expected, index != e {
                result.outcome = .corrupt(offset: offset, reason: "index \(index) where \(e) was expected")
                return result
            }
            expected = index &+ 1
            let payload = keepPayloads ? Array(bytes[(bodyStart + LogFormat.bodyFixedBytes)..<end]) : []
            result.entries.append(LogEntry(index: index, term: term, kind: kind, payload: payload))
            result.offsets.append(offset)
            offset = end
        }
        return result
    }
}

extension SegmentScan {
    /// True when some offset after `start` holds a complete record with a valid checksum and an
    /// index of at least `minimumIndex`. Cheap checks (length range, index) come before the
    /// checksum, so scanning garbage costs little.
    static func validRecordExists(in bytes: UnsafeBufferPointer<UInt8>, after start: Int, atLeast minimumIndex: UInt64) -> Bool {
        var offset = start + 1
        while offset + LogFormat.frameBytes + LogFormat.bodyFixedBytes <= bytes.count {
            defer { offset += 1 }
            let length = Int(LogFormat.readLE(bytes, offset, as: UInt32.self))
            guard length >= LogFormat.bodyFixedBytes, length <= LogFormat.maxRecordBytes else { continue }
            let bodyStart = offset + LogFormat.frameBytes
            guard bodyStart + length <= bytes.count else { continue }
            let index = LogFormat.readLE(bytes, bodyStart, as: UInt64.self)
            guard index >= minimumIndex, index - minimumIndex < UInt64(bytes.count) else { continue }
            let stored = LogFormat.readLE(bytes, offset + 4, as: UInt32.self)
            if CRC32C.checksum(UnsafeBufferPointer(rebasing: bytes[bodyStart..<(bodyStart + length)])) == stored { return true }
        }
        return false
    }
}

/// Raft's persistent state: current term, vote in that term (0 = none), commit index, and
/// whether this node may vote (false for a node that started from a blank disk until it was added
/// as a learner; see `BanyanRaft.HardState.mayVote`, R22).
public struct HardState: Sendable, Equatable {
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
        var out = HardState.magic
        LogFormat.appendLE(term, &out)
        LogFormat.appendLE(vote, &out)
        LogFormat.appendLE(commit, &out)
        out.append(mayVote ? 1 : 0)
        LogFormat.appendLE(CRC32C.checksum(out), &out)
        return out
    }

    /// Decodes, or nil when the bytes are not a complete, checksummed hard state.
    public init?(encoded bytes: [UInt8]) {
        let isV2 = bytes.count == 35 && Array(bytes[0..<6]) == HardState.magic
        let isV1 = bytes.count == 34 && Array(bytes[0..<6]) == HardState.magicV1
        guard isV1 || isV2 else { return nil }
        let body = isV2 ? 31 : 30
        let ok: HardState? = bytes.withUnsafeBufferPointer { b in
            let stored = LogFormat.readLE(b, body, as: UInt32.self)
            guard CRC32C.checksum(UnsafeBufferPointer(rebasing: b[0..<body])) == stored else { return nil }
            if isV2 && b[30] > 1 { return nil }
            return HardState(
                term: LogFormat.readLE(b, 6, as: UInt64.self), vote: LogFormat.readLE(b, 14, as: UInt64.self),
                commit: LogFormat.readLE(b, 22, as: UInt64.self), mayVote: isV2 ? b[30] == 1 : true)
        }
        guard let ok else { return nil }
        self = ok
    }
}
