public import BanyanOpLog
public import Logging

/// A typed error from the log, naming the file and offset where it applies.
public struct OpLogError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Code: Sendable, Equatable {
        /// Invalid data before the end of the log: the node must not start (repair from peers).
        case corrupt
        /// The disk is full; nothing was reported durable that is not.
        case noSpace
        /// Another storage failure (fatal to the node's participation).
        case io
        /// A caller broke the log's contract (non-consecutive indexes, truncating past the end).
        case invalidArgument
    }

    public let code: Code
    public let message: String
    public let file: String?
    public let offset: Int?

    public init(_ code: Code, _ message: String, file: String? = nil, offset: Int? = nil) {
        self.code = code
        self.message = message
        self.file = file
        self.offset = offset
    }

    init(_ error: FileSystemError) {
        self.init(error.code == .noSpace ? .noSpace : .io, error.message, file: error.path)
    }

    public var description: String {
        var text = message
        if let file { text += " in \(file)" }
        if let offset { text += " at byte \(offset)" }
        return text
    }
}

/// The append-only, segmented operation log on disk (format and rules:
/// docs/internals/oplog-format.md). Single owner, not thread-safe.
///
/// Appends are buffered in the file until `sync`, which makes all of them durable with one
/// `fdatasync` (group commit) and reports the durable index.
public final class SegmentedLog {
    public struct Options: Sendable {
        /// A new segment starts once the active one holds at least this many bytes.
        public var segmentBytes = 64 * 1024 * 1024
        /// Comparison mode: write and fdatasync every record on its own inside `append` (the
        /// baseline group commit is measured against). Off by default.
        public var syncEveryRecord = false
        /// The active segment is kept written with zeros at least this far ahead of its last
        /// record (grown a step of this size at a time), so that records overwrite allocated
        /// blocks and most `fdatasync` calls change no file size and allocate nothing. 0: plain
        /// appends.
        public var preallocationBytes = 1 << 20
        /// The unit a disk writes whole, for telling an unwritten sector (a torn write) from
        /// damage during recovery.
        public var sectorBytes = 512
        /// What recovery does with damage in the last segment that valid records follow (a
        /// sector the disk hands back as zeros or garbage in the middle of synced records). Off
        /// (the default): refuse to open with `OpLogError(.corrupt, …)`, because the records
        /// after the damage may have been acknowledged. On (an operator's explicit choice, see
        /// docs/runbook.md): cut the segment at the damage (the cut bytes are saved beside it
        /// first) and report it in `salvaged`, so that the node can stay out of votes until it
        /// has fetched those records again from its peers.
        public var salvageDamagedTail = false
        /// Simulator self-tests only: recovery reads through the page cache (item 7 of issue 14
        /// undone). The server never sets it.
        public var sabotageReadThroughCache = false
        /// Simulator self-tests only: damage in the last segment is cut in place whatever
        /// follows it, as before item 4 of issue 14 was fixed. The server never sets it.
        public var sabotageCutAnyDamage = false
        /// Simulator self-tests only: recovery syncs what it recovered without recording the sync
        /// on disk (soak seed 1002241 undone). The server never sets it.
        public var sabotageUnrecordedRecoverySync = false
        /// Simulator self-tests only: recovery ignores the record of the last sync that only the
        /// page cache shows (soak seed 1126036 undone). The server never sets it.
        public var sabotageIgnoreCachedSyncRecord = false
        public init() {}
    }

    /// A damaged last segment that recovery cut at the damage because
    /// `Options.salvageDamagedTail` was set.
    public struct SalvagedTail: Sendable, Equatable {
        /// The segment that was cut (or removed, when the damage was in its header).
        public var file: String
        /// The byte offset of the damage: the segment now ends there.
        public var offset: Int
        /// The first index no longer in the log (the record the damage hit).
        public var cutAt: UInt64
        /// The last index kept (`cutAt - 1`).
        public var lastIndexBeforeCut: UInt64
        /// The highest index of a valid record seen after the damage, when one was: the log held
        /// at least this far, and this node may have acknowledged it. Refetch at least this far
        /// before voting.
        public var highestIndexAfterDamage: UInt64?
        /// Where the cut bytes were saved (nil when they were all zeros).
        public var savedTo: String?
    }

    /// What recovery found and did.
    public struct RecoveryReport: Sendable, Equatable {
        public var segments = 0
        public var records = 0
        /// A torn tail that was cut off: the file, the offset where valid data ended, and how
        /// many bytes were dropped.
        public var truncatedTail: (file: String, offset: Int, droppedBytes: Int)?
        /// A last segment without a complete header, removed.
        public var removedEmptySegment: String?
        /// The file the bytes of a cut tail (or removed segment) were saved to before the cut;
        /// nil when nothing was cut or the cut bytes were all zeros.
        public var savedCutBytes: String?
        /// How recovery recorded on disk the sync it made of the last segment's records (nil:
        /// the segment already ended in an empty batch recording a sync of all of them, or held
        /// no records).
        public var recordedSync: RecordedSync?

        public enum RecordedSync: Sendable, Equatable {
            /// An empty batch appended and synced: its markers say the records before it are durable.
            case emptyBatch
            /// The last segment was sealed (it takes no more batches): a new segment was started
            /// after it, so it is no longer the last and damage in it is refused.
            case newSegment
        }

        public static func == (a: RecoveryReport, b: RecoveryReport) -> Bool {
            a.segments == b.segments && a.records == b.records && a.removedEmptySegment == b.removedEmptySegment
                && a.truncatedTail?.file == b.truncatedTail?.file && a.truncatedTail?.offset == b.truncatedTail?.offset
        }
    }

    private struct Segment {
        let name: String
        let firstIndex: UInt64
        var offsets: [Int] = []
        var terms: [UInt64] = []
        var size: Int
        /// No more write batches may go into this segment (a version-1 segment, or one whose
        /// data ends inside a batch: see `SegmentScan.endsInsideBatch`); the next append starts a
        /// new segment.
        var sealed = false
        var lastIndex: UInt64 { firstIndex + UInt64(offsets.count) - 1 }
    }

    private let fileSystem: any FileSystem
    public let directory: String
    private let options: Options
    private let logger: Logger
    private var segments: [Segment] = []
    private var active: FileID?
    /// The active segment's file size: its records, then preallocated zeros.
    private var activeAllocated = 0
    /// How far the active segment is known durable: its size at its last successful sync (0 for
    /// a new segment). Every write batch's synced-through markers carry it.
    private var activeSynced = 0
    /// Records were written to the active segment since its last sync: the next `sync` records
    /// its reach in an empty batch after them.
    private var recordsSinceSync = false
    /// Zeros for preallocation (one buffer of at most 64 KiB, reused: a step is several writes).
    private lazy var zeros = [UInt8](repeating: 0, count: Swift.min(options.preallocationBytes, 64 << 10))
    private var directoryDirty = false

    /// Set by the first storage error in append, sync or truncate: from then on every write
    /// fails with it. Memory may no longer match the disk (and after a failed fsync the kernel may
    /// have dropped the dirty pages), so the only safe continuation is a restart, which recovers
    /// from what is really on disk (etcd's storage contract).
    public private(set) var failure: OpLogError?

    /// Index of the last record (0 when the log is empty).
    public private(set) var lastIndex: UInt64 = 0
    /// Index of the last record known to be durable.
    public private(set) var durableIndex: UInt64 = 0
    public private(set) var recovery = RecoveryReport()
    /// Set when recovery cut a damaged last segment under `Options.salvageDamagedTail`: the
    /// caller must keep the node from voting until it has fetched the cut records again (at
    /// least through `highestIndexAfterDamage`, or through its commit index).
    public private(set) var salvaged: SalvagedTail?

    /// Index of the first record present (lastIndex + 1 when empty).
    public var firstIndex: UInt64 { segments.first?.firstIndex ?? lastIndex + 1 }

    /// Opens (creating if needed) the log in `directory`, recovering it. `progress` is called with
    /// (segments scanned, segments total) as recovery proceeds. Recovery findings (torn tails,
    /// removed segments, corruption) and storage errors are logged to `logger` (silent unless the
    /// node passes its own).
    public init(
        directory: String, fileSystem: any FileSystem, options: Options = Options(),
        logger: Logger = Logger(label: "banyan.oplog", factory: { _ in SwiftLogNoOpLogHandler() }),
        progress: ((Int, Int) -> Void)? = nil
    ) throws(OpLogError) {
        self.directory = directory
        self.fileSystem = fileSystem
        self.options = options
        var logger = logger
        logger[metadataKey: "log.directory"] = "\(directory)"
        self.logger = logger
        do {
            try makeDurableDirectory(directory, fileSystem)
            try recover(progress: progress)
        } catch let error as FileSystemError {
            throw OpLogError(error)
        } catch let error as OpLogError {
            throw error
        } catch {
            throw OpLogError(.io, "\(error)")
        }
    }

    private func path(_ name: String) -> String { directory + "/" + name }

    private func recover(progress: ((Int, Int) -> Void)?) throws {
        let names = try fileSystem.list(directory)
            .compactMap { name in LogFormat.firstIndex(ofSegment: name).map { (name, $0) } }
            .sorted { $0.1 < $1.1 }
        // After a failed fsync (the process stopped on it), Linux marks the pages whose write
        // failed clean: the page cache shows bytes the disk does not hold. Read the segments
        // that may hold unsynced writes from the disk itself. Earlier segments were synced at
        // their roll, before the next segment was created.
        //
        // Before that, what the cache shows of the last segment is read for its markers: the
        // empty batch recording the last sync is written after that sync and not synced itself,
        // so a failed write-back (or the failed fsync of `dropCache`) keeps it from the disk and
        // dropping the cache hides it. Its claim stays true (it was written after the sync it
        // reports), so damage the disk shows below it lies in synced bytes and is refused, never
        // cut as a torn write (simulator seed 1126036: a failed fsync at start lost the record, a
        // bad sector in the batch it vouched for then read as a torn write of that batch).
        var cachedSyncClaim = 0
        if !options.sabotageReadThroughCache {
            if let (name, first) = names.last, !options.sabotageIgnoreCachedSyncRecord {
                let cached = try fileSystem.readAll(path(name))
                cachedSyncClaim = SegmentScan.scan(
                    cached, expectedFirstIndex: first, isLast: true, keepPayloads: false, sectorBytes: options.sectorBytes
                ).highestSyncClaim
            }
            for (name, _) in names.suffix(2) { try fileSystem.dropCache(path(name)) }
        }
        var expected: UInt64?
        var zeroTail: (file: String, offset: Int, bytes: Int)?
        var lastScanMarker: SyncMarker?
        for (i, (name, first)) in names.enumerated() {
            let isLast = i == names.count - 1
            let bytes = try fileSystem.readAll(path(name))
            if let e = expected, first != e {
                throw OpLogError(.corrupt, "segment starts at index \(first) where \(e) was expected", file: path(name), offset: 0)
            }
            var scan = SegmentScan.scan(bytes, expectedFirstIndex: first, isLast: isLast, keepPayloads: false, sectorBytes: options.sectorBytes)
            if isLast {
                switch scan.outcome {
                case .tornTail(let offset) where offset < cachedSyncClaim, .zeroTail(let offset) where offset < cachedSyncClaim:
                    scan.outcome = .corrupt(
                        offset: offset,
                        reason: "the valid data ends at byte \(offset), but a synced-through marker the page cache showed (not on the disk) "
                            + "says the segment was synced through byte \(cachedSyncClaim): synced bytes were lost, so it is not a torn tail. "
                            + "See docs/runbook.md, \"The log refuses to open: damage before valid records\"")
                default:
                    break
                }
            }
            var size = bytes.count
            var cut: Int?
            switch scan.outcome {
            case .clean:
                break
            case .zeroTail(let offset):
                size = offset  // preallocated space, kept for the next records
                zeroTail = (path(name), offset, bytes.count - offset)
            case .corrupt(let offset, _) where isLast && options.sabotageCutAnyDamage && !options.salvageDamagedTail
                && offset >= LogFormat.segmentHeader.count:
                // The old recovery: the damage is taken for a torn tail and the file truncated.
                _ = try cutTail(name, bytes, at: offset, removingSegment: false)
                recovery.truncatedTail = (path(name), offset, bytes.count - offset)
                cut = offset
            case .corrupt(let offset, let reason):
                guard isLast, options.salvageDamagedTail else { throw refusal(name, scan, offset: offset, reason: reason) }
                let saved = try cutTail(name, bytes, at: offset, removingSegment: offset < LogFormat.segmentHeader.count)
                var found: UInt64?
                if case .found(_, let last, _) = scan.recordsAfterDamage { found = last }
                let cutAt = first + UInt64(scan.entries.count)
                salvaged = SalvagedTail(
                    file: path(name), offset: offset, cutAt: cutAt, lastIndexBeforeCut: cutAt - 1, highestIndexAfterDamage: found,
                    savedTo: saved)
                logger.warning(
                    "salvaged a damaged log: cut the last segment at the damage; the node must fetch the cut records from its peers before it votes",
                    metadata: [
                        "file": "\(path(name))", "offset": "\(offset)", "reason": "\(reason)", "cut_at_index": "\(cutAt)",
                        "highest_index_after_damage": "\(found.map { String($0) } ?? "none")", "saved_to": "\(saved ?? "nothing (zeros)")",
                    ])
                if offset < LogFormat.segmentHeader.count {
                    recovery.removedEmptySegment = name
                    progress?(i + 1, names.count)
                    continue
                }
                cut = offset
            case .tornTail(let offset):
                if scan.headerMissing {
                    let saved = try cutTail(name, bytes, at: 0, removingSegment: true)
                    recovery.removedEmptySegment = name
                    var metadata: Logger.Metadata = ["file": "\(path(name))"]
                    if let saved { metadata["saved_to"] = "\(saved)" }
                    if case .found(let a, let b, _)? = scan.recordsAfterDamage { metadata["unsynced_records_after_damage"] = "\(a)...\(b)" }
                    logger.notice("removed a segment without a complete header (crash right after creating it)", metadata: metadata)
                    progress?(i + 1, names.count)
                    continue
                }
                let saved = try cutTail(name, bytes, at: offset, removingSegment: false)
                recovery.truncatedTail = (path(name), offset, bytes.count - offset)
                var metadata: Logger.Metadata = [
                    "file": "\(path(name))", "offset": "\(offset)", "dropped_bytes": "\(bytes.count - offset)",
                    "saved_to": "\(saved ?? "nothing (zeros)")",
                ]
                if case .found(let a, let b, _)? = scan.recordsAfterDamage, case .neverSynced(let through)? = scan.syncEvidence {
                    // Write-back kept later sectors of the unsynced batch and lost an earlier one.
                    metadata["unsynced_records_after_damage"] = "\(a)...\(b)"
                    metadata["synced_through"] = "\(through)"
                }
                logger.warning("truncated a torn tail (a write interrupted by a crash)", metadata: metadata)
                cut = offset
            }
            if let cut { size = cut }
            var segment = Segment(name: name, firstIndex: first, size: size)
            segment.sealed = scan.version < LogFormat.version || scan.endsInsideBatch
            segment.offsets = scan.offsets
            segment.terms = scan.entries.map(\.term)
            lastScanMarker = cut == nil ? scan.lastMarker : nil
            segments.append(segment)
            recovery.segments += 1
            recovery.records += scan.entries.count
            expected = first + UInt64(scan.entries.count)
            progress?(i + 1, names.count)
        }
        // A segment emptied by a torn tail keeps its name (its first index) and stays active.
        if let last = segments.last {
            lastIndex = last.offsets.isEmpty ? last.firstIndex - 1 : last.lastIndex
            let file = try fileSystem.open(path(last.name))
            try fileSystem.sync(file)
            active = file
            activeAllocated = try fileSystem.size(file)
            activeSynced = last.size
            // The sync just made covers records that no marker on disk may say were synced (they
            // were written before it). Unrecorded, a sector going bad later in the last batch
            // would read as a torn write of an unsynced batch and be cut (the marker rule's limit;
            // simulator seed 1002241: recovery synced records, the node wrote nothing more, and
            // damage found at its next start cut 14 records it held durably). So the sync is
            // recorded durably before anything is reported durable: an empty batch, synced (one
            // more fdatasync per start), or, in a sealed segment that takes no more batches, a
            // new segment, after which damage in this one is refused like any synced segment's.
            if !last.offsets.isEmpty, !options.sabotageUnrecordedRecoverySync {
                if last.sealed {
                    try roll(firstIndex: lastIndex + 1)
                    recovery.recordedSync = .newSegment
                } else if !(lastScanMarker.map { m in
                    m.spanEnd == last.size && m.spanEnd - m.spanStart == 2 * LogFormat.markerBytes && m.syncedThrough == m.spanStart
                } ?? false) {
                    var empty = [UInt8](repeating: 0, count: LogFormat.markerBytes)
                    try flush(&empty)
                    recovery.recordedSync = .emptyBatch
                }
                if recovery.recordedSync != nil, let active {
                    try fileSystem.sync(active)
                    activeSynced = segments.last?.size ?? 0
                }
            }
        }
        // What we read may be only in the page cache (the process died, the machine did not):
        // the last segment was synced above, earlier ones at their roll; the directory entries
        // must be made durable too before anything is reported durable.
        try fileSystem.syncDirectory(directory)
        directoryDirty = false
        durableIndex = lastIndex
        var metadata: Logger.Metadata = ["segments": "\(recovery.segments)", "records": "\(recovery.records)", "last_index": "\(lastIndex)"]
        switch recovery.recordedSync {
        case .emptyBatch?: metadata["recorded_sync"] = "empty batch"
        case .newSegment?: metadata["recorded_sync"] = "new segment"
        case nil: break
        }
        if let zeroTail {
            // The preallocated zeros after the last record (normal; named so that a disk handing
            // back zeros where records were would leave a trace).
            metadata["zero_tail"] = "\(zeroTail.bytes) bytes at \(zeroTail.offset) of \(zeroTail.file)"
        }
        logger.info("log recovered", metadata: metadata)
    }

    /// The error for corruption recovery will not repair (logged at error level).
    private func refusal(_ name: String, _ scan: SegmentScan, offset: Int, reason: String) -> OpLogError {
        var message = "corrupt log: \(reason)"
        var metadata: Logger.Metadata = ["file": "\(path(name))", "offset": "\(offset)", "reason": "\(reason)"]
        switch scan.recordsAfterDamage {
        case .found(let first, let last, let at):
            metadata["records_after_damage"] = "\(first)...\(last)"
            message += "; valid records \(first) to \(last) follow the damage (from byte \(at)), so it is not a torn tail"
        case .unknown:
            message += "; valid records may follow the damage, so it is not a torn tail"
        case nil:
            break
        }
        switch scan.syncEvidence {
        case .syncedBeyondDamage(let through, let at)?:
            metadata["synced_through"] = "\(through)"
            message += "; a synced-through marker at byte \(at) says the segment was synced through byte \(through), beyond the damage"
        case .recordsWithoutMarkers(let at)?:
            message += "; no synced-through marker vouches for the record at byte \(at) (a segment written before format version 2, or its batch's markers are damaged too)"
        case .neverSynced?:
            message += "; the markers say nothing after it was synced, but the damaged bytes hold no all-zero sector (not a sector a power loss left unwritten)"
        case nil:
            break
        }
        if scan.recordsAfterDamage != nil {
            message += ". The log refuses to open rather than cut records that may have been acknowledged: see docs/runbook.md, "
                + "\"The log refuses to open: damage before valid records\" (replace the node's data from its peers, or "
                + "open with salvageDamagedTail to cut the segment at the damage, saving the cut bytes beside it)"
        }
        logger.error("refusing to start: corrupt log", metadata: metadata)
        return OpLogError(.corrupt, message, file: path(name), offset: offset)
    }

    /// Cuts segment `name` at `offset` (or removes it), after saving the bytes from `offset` on
    /// to `<segment>.cut-<offset>` beside it (fsynced with the directory), so that no cut
    /// destroys data. Trailing zeros (preallocated space) are not saved; when nothing else is
    /// left (or only a prefix of a segment header), nothing is saved. Returns the saved file.
    private func cutTail(_ name: String, _ bytes: [UInt8], at offset: Int, removingSegment: Bool) throws -> String? {
        var end = bytes.count
        while end > offset, bytes[end - 1] == 0 { end -= 1 }
        let kept = Array(bytes[Swift.min(offset, end)..<end])
        var saved: String?
        if !kept.isEmpty, !(offset == 0 && LogFormat.segmentHeader.starts(with: kept)) {
            // The scan on open ignores these files: a segment's name is 20 digits and ".seg".
            var target = path(name) + ".cut-\(offset)"
            var attempt = 1
            var identical = false
            while fileSystem.exists(target) {
                // Left by an earlier recovery that crashed before its cut: the same bytes again.
                if try fileSystem.readAll(target) == kept {
                    identical = true
                    break
                }
                attempt += 1
                target = path(name) + ".cut-\(offset)-\(attempt)"
            }
            let file = identical ? try fileSystem.open(target) : try fileSystem.create(target)
            defer { fileSystem.close(file) }
            if !identical { try fileSystem.append(file, kept) }
            try fileSystem.sync(file)
            try fileSystem.syncDirectory(directory)
            saved = target
        }
        recovery.savedCutBytes = saved
        if removingSegment {
            try fileSystem.remove(path(name))
            try fileSystem.syncDirectory(directory)
        } else {
            let file = try fileSystem.open(path(name))
            defer { fileSystem.close(file) }
            try fileSystem.truncate(file, to: offset)
            try fileSystem.sync(file)
        }
        return saved
    }

    // MARK: Writing

    /// Appends entries, which must continue the log (`entries[0].index == lastIndex + 1`, then
    /// consecutive). Not durable until `sync`.
    public func append(_ entries: [LogRecord]) throws(OpLogError) {
        if let failure { throw failure }
        guard !entries.isEmpty else { return }
        for (i, entry) in entries.enumerated() {
            if entry.index != lastIndex + 1 + UInt64(i) {
                throw OpLogError(.invalidArgument, "append of index \(entry.index) where \(lastIndex + 1 + UInt64(i)) was expected")
            }
            if entry.payload.count > LogFormat.maxRecordBytes - LogFormat.bodyFixedBytes {
                throw OpLogError(.invalidArgument, "record \(entry.index) has a \(entry.payload.count)-byte payload; the limit is \(LogFormat.maxRecordBytes - LogFormat.bodyFixedBytes)")
            }
        }
        do {
            var buffer: [UInt8] = []
            // One allocation for the whole batch (markers and records), not a doubling series of
            // copies: a 15 MiB entry was copied three more times while the buffer grew.
            buffer.reserveCapacity(
                2 * LogFormat.markerBytes + entries.reduce(0) { $0 + LogFormat.frameBytes + LogFormat.bodyFixedBytes + $1.payload.count })
            for entry in entries {
                if active == nil || segments.last?.sealed != false || (segments.last?.size ?? 0) >= options.segmentBytes {
                    try flush(&buffer)
                    try roll(firstIndex: entry.index)
                }
                // A batch starts with its leading marker (filled in by `flush`).
                if buffer.isEmpty { buffer.append(contentsOf: repeatElement(0, count: LogFormat.markerBytes)) }
                guard var segment = segments.popLast() else { throw OpLogError(.io, "no active segment") }
                segment.offsets.append(segment.size + buffer.count)
                segment.terms.append(entry.term)
                LogFormat.encode(entry, into: &buffer)
                segments.append(segment)
                lastIndex = entry.index
                if options.syncEveryRecord, let file = active {
                    try flush(&buffer)
                    try fileSystem.sync(file)
                    activeSynced = segments.last?.size ?? 0
                    if directoryDirty {
                        try fileSystem.syncDirectory(directory)
                        directoryDirty = false
                    }
                    durableIndex = lastIndex
                } else if segment.size + buffer.count + LogFormat.markerBytes >= options.segmentBytes {
                    try flush(&buffer)
                }
            }
            try flush(&buffer)
            recordsSinceSync = !options.syncEveryRecord
        } catch let error as FileSystemError {
            throw stop(OpLogError(error))
        } catch let error as OpLogError {
            throw stop(error)
        } catch {
            throw stop(OpLogError(.io, "\(error)"))
        }
    }

    /// Records the first storage error and returns it (see `failure`).
    private func stop(_ error: OpLogError) -> OpLogError {
        if failure == nil {
            failure = error
            logger.error("storage error: the log stops taking writes until the node restarts", metadata: ["error": "\(error)"])
        }
        return error
    }

    /// Writes one batch: `buffer` holds a placeholder for the leading marker, then records; both
    /// markers say where the batch lies and how far the segment was synced before it.
    private func flush(_ buffer: inout [UInt8]) throws {
        guard !buffer.isEmpty, let file = active, var segment = segments.popLast() else { return }
        defer { segments.append(segment) }
        let marker = LogFormat.encode(
            SyncMarker(syncedThrough: activeSynced, spanStart: segment.size, spanEnd: segment.size + buffer.count + LogFormat.markerBytes))
        buffer.replaceSubrange(0..<LogFormat.markerBytes, with: marker)
        buffer.append(contentsOf: marker)
        // Positional even without preallocation: zeros left by a run with it may follow.
        let end = segment.size + buffer.count
        let pastTheZeros = end > activeAllocated
        try fileSystem.write(file, at: segment.size, buffer)
        activeAllocated = Swift.max(activeAllocated, end)
        let step = options.preallocationBytes
        if step > 0 && pastTheZeros {
            // Keep whole steps of zeros ahead of the records: one size change per step instead
            // of one per sync. Written after the batch, and only past it: a batch that reaches
            // beyond the zeros grows the file in this sync anyway, so a 15 MiB entry is not
            // written twice (once as zeros, once as itself).
            let target = (end / step + 1) * step
            while activeAllocated < target {
                let count = Swift.min(zeros.count, target - activeAllocated)
                try fileSystem.write(file, at: activeAllocated, count == zeros.count ? zeros : Array(zeros.prefix(count)))
                activeAllocated += count
            }
        }
        segment.size += buffer.count
        buffer.removeAll(keepingCapacity: true)
    }

    /// Starts a new segment: the previous one is cut to its records and synced first (recovery
    /// treats anything else in a non-last segment as corruption), the new one gets its header.
    private func roll(firstIndex: UInt64) throws {
        if let file = active {
            if let size = segments.last?.size, activeAllocated > size { try fileSystem.truncate(file, to: size) }
            try fileSystem.sync(file)
            fileSystem.close(file)
            active = nil
        }
        if let last = segments.last, last.offsets.isEmpty {
            // A sealed segment without records has the new one's name: it is started afresh.
            segments.removeLast()
        }
        let name = LogFormat.segmentName(firstIndex: firstIndex)
        let file = try fileSystem.create(path(name))
        try fileSystem.append(file, LogFormat.segmentHeader)
        active = file
        activeAllocated = LogFormat.segmentHeader.count
        activeSynced = 0
        directoryDirty = true
        segments.append(Segment(name: name, firstIndex: firstIndex, size: LogFormat.segmentHeader.count))
    }

    /// Makes everything appended durable (one fdatasync, plus a directory fsync after a new
    /// segment) and returns the durable index.
    @discardableResult
    public func sync() throws(OpLogError) -> UInt64 {
        if let failure { throw failure }
        do {
            if let file = active {
                try fileSystem.sync(file)
                activeSynced = segments.last?.size ?? 0
            }
            if directoryDirty {
                try fileSystem.syncDirectory(directory)
                directoryDirty = false
            }
            if recordsSinceSync, segments.last?.sealed == false {
                // Record the sync itself: an empty batch whose markers say how far the segment
                // is now durable. It is not synced (no extra fdatasync): write-back or the next
                // sync persists it, and from then on damage inside the batch just synced is told
                // from a torn write (docs/internals/oplog-format.md, the marker rule).
                recordsSinceSync = false
                var empty = [UInt8](repeating: 0, count: LogFormat.markerBytes)
                try flush(&empty)
            }
        } catch let error as FileSystemError {
            throw stop(OpLogError(error))
        } catch let error as OpLogError {
            throw stop(error)
        } catch {
            throw stop(OpLogError(.io, "\(error)"))
        }
        durableIndex = lastIndex
        return durableIndex
    }

    /// Removes every record after `index` (Raft conflict resolution), durably: later segments
    /// are removed and the directory synced before the segment holding the cut is truncated, so
    /// no crash leaves a gap.
    public func truncate(after index: UInt64) throws(OpLogError) {
        if let failure { throw failure }
        guard index <= lastIndex else { throw OpLogError(.invalidArgument, "truncate after \(index) beyond the last index \(lastIndex)") }
        guard index + 1 >= firstIndex else { throw OpLogError(.invalidArgument, "truncate after \(index) before the first index \(firstIndex)") }
        guard index < lastIndex else { return }
        do {
            if let file = active {
                fileSystem.close(file)
                active = nil
            }
            // Whole segments past the cut (including one that would become empty), newest first,
            // each removal made durable before the next: file systems need not persist several
            // unsynced removals in order, and an older one surviving alone would leave a gap.
            while let last = segments.last, last.firstIndex > index {
                try fileSystem.remove(path(last.name))
                segments.removeLast()
                try fileSystem.syncDirectory(directory)
            }
            if var last = segments.last {
                let keep = Int(index - last.firstIndex + 1)
                if keep < last.offsets.count {
                    let cut = last.offsets[keep]
                    let file = try fileSystem.open(path(last.name))
                    try fileSystem.truncate(file, to: cut)
                    try fileSystem.sync(file)
                    last.offsets.removeLast(last.offsets.count - keep)
                    last.terms.removeLast(last.terms.count - keep)
                    last.size = cut
                    // The cut lies inside a write batch: later batches go to a new segment.
                    last.sealed = true
                    segments[segments.count - 1] = last
                    active = file
                    activeAllocated = cut
                    activeSynced = cut
                } else {
                    let file = try fileSystem.open(path(last.name))
                    active = file
                    activeAllocated = try fileSystem.size(file)
                    activeSynced = last.size
                }
            }
        } catch {
            throw stop(OpLogError(error))
        }
        lastIndex = index
        durableIndex = Swift.min(durableIndex, index)
        recordsSinceSync = false
    }

    /// Discards the whole log so that the next append starts at `index + 1` (a snapshot at
    /// `index` was installed that the log does not continue). Segments go newest first, each
    /// removal made durable, so a crash part-way leaves a contiguous prefix, which the snapshot
    /// covers.
    public func reset(after index: UInt64) throws(OpLogError) {
        if let failure { throw failure }
        do {
            if let file = active {
                fileSystem.close(file)
                active = nil
            }
            while let last = segments.last {
                try fileSystem.remove(path(last.name))
                try fileSystem.syncDirectory(directory)
                segments.removeLast()
            }
        } catch {
            throw stop(OpLogError(error))
        }
        lastIndex = index
        durableIndex = index
        recordsSinceSync = false
    }

    /// Removes leading segments (never the last) while `covered(segment's last index)` holds.
    func removeLeadingSegments(while covered: (UInt64) -> Bool) throws(OpLogError) {
        if let failure { throw failure }
        var removed = false
        do {
            while segments.count > 1, let first = segments.first, !first.offsets.isEmpty, covered(first.lastIndex) {
                try fileSystem.remove(path(first.name))
                // One directory fsync per removal: file systems need not persist several
                // unsynced removals in order, and a later one surviving alone would be a gap.
                try fileSystem.syncDirectory(directory)
                segments.removeFirst()
                removed = true
            }
            _ = removed
        } catch {
            throw stop(OpLogError(error))
        }
    }

    // MARK: Reading

    /// The term of the record at `index`, or nil when it is not in the log.
    public func term(at index: UInt64) -> UInt64? {
        guard let s = segment(holding: index) else { return nil }
        let position = Int(index - segments[s].firstIndex)
        return position < segments[s].terms.count ? segments[s].terms[position] : nil
    }

    private func segment(holding index: UInt64) -> Int? {
        guard index >= firstIndex, index <= lastIndex else { return nil }
        var lo = 0
        var hi = segments.count - 1
        while lo < hi {
            let mid = (lo + hi + 1) / 2
            if segments[mid].firstIndex <= index { lo = mid } else { hi = mid - 1 }
        }
        return segments[lo].offsets.isEmpty ? nil : lo
    }

    /// The records with indexes in `from...through` (clamped to the log).
    public func entries(from: UInt64, through: UInt64) throws(OpLogError) -> [LogRecord] {
        let lo = Swift.max(from, firstIndex)
        let hi = Swift.min(through, lastIndex)
        guard lo <= hi else { return [] }
        var result: [LogRecord] = []
        for segment in segments where segment.firstIndex <= hi && !segment.offsets.isEmpty && segment.lastIndex >= lo {
            let bytes: [UInt8]
            do {
                bytes = try fileSystem.readAll(path(segment.name))
            } catch {
                throw OpLogError(error)
            }
            let valid = Array(bytes.prefix(segment.size))
            let scan = SegmentScan.scan(valid, expectedFirstIndex: segment.firstIndex, isLast: false)
            if case .corrupt(let offset, let reason) = scan.outcome {
                throw OpLogError(.corrupt, "corrupt log on read: \(reason)", file: path(segment.name), offset: offset)
            }
            result.append(contentsOf: scan.entries.filter { $0.index >= lo && $0.index <= hi })
        }
        return result
    }
}

/// Creates `path` if missing and makes its entry durable (fsync of the parent directory).
/// `creatingParents`: create missing parents first, each made durable in its own parent the same
/// way (otherwise a missing parent is an error: the log and snapshot stores expect their parent).
public func makeDurableDirectory(_ path: String, _ fileSystem: any FileSystem, creatingParents: Bool = false) throws(FileSystemError) {
    guard path != "/", path != ".", !path.isEmpty, !fileSystem.exists(path) else { return }
    let parent = parentDirectory(of: path)
    if creatingParents { try makeDurableDirectory(parent, fileSystem, creatingParents: true) }
    try fileSystem.makeDirectory(path)
    try fileSystem.syncDirectory(parent)
}

/// The directory holding `path`: "/" for a top-level absolute path, "." for a bare relative name.
public func parentDirectory(of path: String) -> String {
    var trimmed = Substring(path)
    while trimmed.count > 1 && trimmed.hasSuffix("/") { trimmed = trimmed.dropLast() }
    let parent = trimmed.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
    if parent.isEmpty { return path.hasPrefix("/") ? "/" : "." }
    return parent
}

/// Raft's hard state in one small file, replaced atomically: written to a temporary file,
/// fsynced, renamed over the old one, and the directory fsynced. A crash leaves the old or the
/// new value, never a torn one.
public final class HardStateStore {
    private let fileSystem: any FileSystem
    public let directory: String

    public init(directory: String, fileSystem: any FileSystem) throws(OpLogError) {
        self.directory = directory
        self.fileSystem = fileSystem
        do {
            try makeDurableDirectory(directory, fileSystem)
        } catch {
            throw OpLogError(error)
        }
    }

    private var path: String { directory + "/hardstate" }
    private var temporary: String { directory + "/hardstate.tmp" }

    /// The stored hard state (zero when none was ever saved). The value is made durable before
    /// it is returned: after a process crash between the rename and the directory fsync, the
    /// new value is visible but not yet durable, and acting on it (a vote) would be unsafe.
    public func load() throws(OpLogError) -> HardStateRecord {
        guard fileSystem.exists(path) else { return HardStateRecord(mayVote: false) }
        let bytes: [UInt8]
        do {
            bytes = try fileSystem.readAll(path)
            let file = try fileSystem.open(path)
            defer { fileSystem.close(file) }
            try fileSystem.sync(file)
            try fileSystem.syncDirectory(directory)
        } catch {
            throw OpLogError(error)
        }
        guard let state = HardStateRecord(encoded: bytes) else {
            throw OpLogError(.corrupt, "hard state fails its checksum", file: path, offset: 0)
        }
        return state
    }

    public func save(_ state: HardStateRecord) throws(OpLogError) {
        do {
            let file = try fileSystem.create(temporary)
            defer { fileSystem.close(file) }
            try fileSystem.append(file, state.encoded)
            try fileSystem.sync(file)
            try fileSystem.rename(temporary, to: path)
            try fileSystem.syncDirectory(directory)
        } catch {
            throw OpLogError(error)
        }
    }
}
