public import BanyanBasics
public import BanyanOpLog
public import BanyanOpLogFiles
public import BanyanRaft
public import BanyanStateMachine
import BanyanTree
public import Logging

/// A node's durable state on disk (docs/server.md, "Storage"): the Raft log (segmented, CRC32C
/// framed), the hard state file, and the state-machine snapshots. Used by the replica loop
/// thread only, except `SnapshotWriter`, which has its own file-system instance.
///
///     <data>/raft/log/*.seg        the log after the newest snapshot
///     <data>/raft/hardstate        term, vote, commit, mayVote (replaced atomically)
///     <data>/raft/incarnation      this data directory's random identity (R22; written when blank)
///     <data>/raft/pristine         present only while the directory has stored nothing else
///     <data>/snapshots/*.snap      the newest snapshot (raw bytes are what peers transfer)
public final class NodeStorage {
    public let directory: String
    private let fileSystem: any FileSystem
    private let log: SegmentedLog
    private let hardStates: HardStateStore
    public let snapshots: SnapshotStore
    /// Staged payloads (`DATA/staged/`, docs/staged-payloads.md). It has a file system instance
    /// of its own when the driver uses it from another thread (the server's staging thread).
    public let staged: StagedStore
    private let logger: Logger
    /// The last hard state written (term, vote and mayVote are written at once; a commit-only
    /// change is written lazily, see `persist`).
    public private(set) var savedHardState: BanyanRaft.HardState
    /// Simulator self-tests only (`Sabotage`); the server never sets it.
    public var sabotage: Sabotage = .none
    /// The core's latest hard state, as its last `Ready` that carried one reported it.
    private var latestHardState: BanyanRaft.HardState
    /// This data directory's incarnation (`RaftConfiguration.incarnation`; 0: legacy, a
    /// directory written before incarnations existed). See `init`.
    public let incarnation: UInt64
    /// The directory has stored nothing since its incarnation was written (the `raft/pristine`
    /// marker exists). Cleared, durably, before the first log record, hard state or snapshot.
    private var pristine = false

    public struct Loaded {
        public var persisted: PersistedState
        public var machine: StateMachine
    }

    /// `fileSystem`: the real one, or a simulated one for crash tests.
    ///
    /// `newIncarnation`: a random nonzero value from the caller (the core draws no randomness,
    /// so simulations stay deterministic). When the directory is blank (no log, no hard state, no
    /// snapshot) it becomes this directory's incarnation: written to `raft/incarnation.tmp`,
    /// fsynced, renamed to `raft/incarnation`, and the directory fsynced, all before this
    /// returns and so before anything else is stored; then the `raft/pristine` marker is
    /// created. A blank directory that still has the marker beside a valid incarnation file
    /// stored nothing since that incarnation was written (the marker is removed, and the removal
    /// made durable, before the first record, hard state or snapshot is written): it never voted
    /// or acknowledged anything, so it keeps its incarnation, and a node re-added under it after
    /// a lost disk keeps its admission across restarts that come before its first write
    /// (otherwise every such restart would need another remove and add). A blank directory
    /// without the marker (a partial wipe, or a crash between the marker's removal and the first
    /// write) is given the new value: nothing it ever acknowledged can depend on the old one. A
    /// directory that holds state keeps the value in its file; without the file it is a legacy
    /// directory (incarnation 0, see `RaftConfiguration.incarnation`); a malformed file is
    /// `.corrupt`. With the default 0 nothing is written (legacy behaviour for callers that do not
    /// use incarnations).
    ///
    /// `salvageDamagedLog` (`banyan serve --salvage-log`, docs/runbook.md): when the last log
    /// segment is damaged before valid records (the log refuses to open otherwise), cut it at the
    /// damage, saving the cut bytes beside it; and accept a log that ends below the saved commit
    /// (which `load` refuses otherwise). The node may have acknowledged records it no longer
    /// holds, so it leaves its old identity: it takes `newIncarnation`, saves `mayVote == false`
    /// and a commit no higher than its log, and votes again only once an operator removes it and
    /// adds it back (it refetches what it lost from the leader meanwhile, without voting).
    public init(
        directory: String, fileSystem: any FileSystem = PosixFileSystem(), stagedFileSystem: (any FileSystem)? = nil, logger: Logger,
        newIncarnation: UInt64 = 0, salvageDamagedLog: Bool = false, sabotage: Sabotage = .none, progress: @escaping (String) -> Void
    ) throws(OpLogError) {
        self.directory = directory
        self.fileSystem = fileSystem
        self.logger = logger
        do {
            try Self.makeDurableDirectories(directory, ["raft", "snapshots"], fileSystem)
        } catch {
            throw OpLogError(.io, "cannot create the data directory \(directory): \(error)")
        }
        var logOptions = SegmentedLog.Options()
        logOptions.salvageDamagedTail = salvageDamagedLog
        logOptions.sabotageReadThroughCache = sabotage == .readThroughPageCache
        logOptions.sabotageCutAnyDamage = sabotage == .cutAnyDamage
        logOptions.sabotageUnrecordedRecoverySync = sabotage == .unrecordedRecoverySync
        logOptions.sabotageIgnoreCachedSyncRecord = sabotage == .ignoreCachedSyncRecord
        self.sabotage = sabotage
        log = try SegmentedLog(directory: directory + "/raft/log", fileSystem: fileSystem, options: logOptions, logger: logger) { done, total in
            progress("log recovery: \(done)/\(total) segments scanned")
        }
        hardStates = try HardStateStore(directory: directory + "/raft", fileSystem: fileSystem)
        snapshots = try SnapshotStore(directory: directory + "/snapshots", fileSystem: fileSystem)
        staged = try StagedStore(directory: directory + "/staged", fileSystem: stagedFileSystem ?? fileSystem)
        let hs = try hardStates.load()
        savedHardState = BanyanRaft.HardState(term: hs.term, vote: hs.vote, commit: hs.commit, mayVote: hs.mayVote)
        latestHardState = savedHardState
        let latestSnapshot = try snapshots.latest()
        let blank = savedHardState == BanyanRaft.HardState(mayVote: false) && log.lastIndex == 0 && latestSnapshot == nil
        let raftDirectory = directory + "/raft"
        if blank && newIncarnation != 0, fileSystem.exists(raftDirectory + "/" + Self.pristineMarker),
            let kept = try? Self.readIncarnation(directory: raftDirectory, fileSystem), kept != 0
        {
            incarnation = kept
            pristine = true
        } else if blank && newIncarnation != 0 {
            // The marker goes first: a crash between the two leaves no marker, so the next start
            // draws again (it never keeps a value it did not write as pristine).
            try Self.removePristineMarker(directory: raftDirectory, fileSystem)
            try Self.writeIncarnation(newIncarnation, directory: raftDirectory, fileSystem)
            try Self.createPristineMarker(directory: raftDirectory, fileSystem)
            incarnation = newIncarnation
            pristine = true
        } else if salvageDamagedLog,
            log.salvaged != nil || savedHardState.commit > max(log.lastIndex, latestSnapshot?.lastIndex ?? 0)
        {
            // A damaged tail was cut now, or an earlier cut left the log below the saved commit.
            let file = log.salvaged?.file ?? directory + "/raft/log"
            guard newIncarnation != 0 else {
                throw OpLogError(.invalidArgument, "salvaging a damaged log needs a new incarnation for the node", file: file)
            }
            // Leave the old identity before anything else: the new incarnation first (a crash
            // after it and before the hard state only makes the node stricter), then no vote.
            try Self.removePristineMarker(directory: raftDirectory, fileSystem)
            try Self.writeIncarnation(newIncarnation, directory: directory + "/raft", fileSystem)
            incarnation = newIncarnation
            var hs = savedHardState
            hs.mayVote = false
            hs.commit = min(hs.commit, max(log.lastIndex, latestSnapshot?.lastIndex ?? 0))
            try hardStates.save(HardStateRecord(term: hs.term, vote: hs.vote, commit: hs.commit, mayVote: hs.mayVote))
            savedHardState = hs
            latestHardState = hs
            logger.warning(
                "salvaged a damaged log: this node holds records up to \(log.lastIndex) and will not vote until an operator removes it and adds it back (banyan cluster remove, then add; docs/runbook.md)",
                metadata: [
                    "file": "\(file)", "cut_at_index": "\(log.salvaged.map { String($0.cutAt) } ?? "none")",
                    "highest_index_after_damage": "\(log.salvaged?.highestIndexAfterDamage.map { String($0) } ?? "none")",
                    "incarnation": "\(String(newIncarnation, radix: 16))",
                ])
        } else {
            incarnation = try Self.readIncarnation(directory: raftDirectory, fileSystem)
            // Whatever the caller passed, the marker must never stay beside stored state: a
            // blank directory keeps it until its first write; any other loses it now, durably.
            if fileSystem.exists(raftDirectory + "/" + Self.pristineMarker) {
                if blank && incarnation != 0 {
                    pristine = true
                } else {
                    try Self.removePristineMarker(directory: raftDirectory, fileSystem)
                }
            }
        }
    }

    /// What recovery cut from a damaged log under `salvageDamagedLog` (nil otherwise).
    public var salvaged: SegmentedLog.SalvagedTail? { log.salvaged }

    // MARK: - Incarnation file

    static let incarnationMagic: [UInt8] = Array("BNYINCR1".utf8)

    /// `"BNYINCR1" | incarnation u64 | CRC32C of the 16 bytes before it, u32` (little-endian).
    /// Written and read with the shared byte codec (docs/internals/byte-codec.md).
    static func encodeIncarnation(_ incarnation: UInt64) -> [UInt8] {
        var w = ByteWriter(capacity: 20)
        w.raw(incarnationMagic)
        w.u64(incarnation)
        w.u32(CRC32C.checksum(w.out))
        return w.finish()
    }

    /// The incarnation in `bytes`, or nil when they are not a valid incarnation file (exactly 20
    /// bytes, the magic, a checksum that matches, a nonzero value).
    static func decodeIncarnation(_ bytes: [UInt8]) -> UInt64? {
        let fields = try? ByteReader.readAll(bytes) { (r) throws(ByteCodecError) in
            try r.magic(incarnationMagic, "incarnation magic")
            return (value: try r.u64("incarnation"), crc: try r.u32("incarnation checksum"))
        }
        guard let fields, CRC32C.checksum(Array(bytes[0..<16])) == fields.crc, fields.value != 0 else { return nil }
        return fields.value
    }

    private static func writeIncarnation(_ incarnation: UInt64, directory: String, _ fileSystem: any FileSystem) throws(OpLogError) {
        let path = directory + "/incarnation"
        let temporary = path + ".tmp"
        do {
            let file = try fileSystem.create(temporary)
            defer { fileSystem.close(file) }
            try fileSystem.append(file, encodeIncarnation(incarnation))
            try fileSystem.sync(file)
            try fileSystem.rename(temporary, to: path)
            try fileSystem.syncDirectory(directory)
        } catch {
            throw OpLogError(error.code == .noSpace ? .noSpace : .io, "cannot write the incarnation file: \(error.message)", file: path)
        }
    }

    static let pristineMarker = "pristine"

    /// An empty file whose presence says the directory stored nothing since its incarnation was
    /// written; created and its name made durable.
    private static func createPristineMarker(directory: String, _ fileSystem: any FileSystem) throws(OpLogError) {
        let path = directory + "/" + pristineMarker
        do {
            let file = try fileSystem.create(path)
            fileSystem.close(file)
            try fileSystem.syncDirectory(directory)
        } catch {
            throw OpLogError(error.code == .noSpace ? .noSpace : .io, "cannot write the pristine marker: \(error.message)", file: path)
        }
    }

    /// Removes the marker, if there, and makes the removal durable.
    private static func removePristineMarker(directory: String, _ fileSystem: any FileSystem) throws(OpLogError) {
        let path = directory + "/" + pristineMarker
        guard fileSystem.exists(path) else { return }
        do {
            try fileSystem.remove(path)
            try fileSystem.syncDirectory(directory)
        } catch {
            throw OpLogError(.io, "cannot remove the pristine marker: \(error.message)", file: path)
        }
    }

    /// Before the first write of anything else: the directory stops being pristine, durably, so
    /// a later blank start can never keep an incarnation under which something was stored.
    private func leavePristine() throws(OpLogError) {
        guard pristine else { return }
        try Self.removePristineMarker(directory: directory + "/raft", fileSystem)
        pristine = false
    }

    private static func readIncarnation(directory: String, _ fileSystem: any FileSystem) throws(OpLogError) -> UInt64 {
        let path = directory + "/incarnation"
        guard fileSystem.exists(path) else { return 0 }
        let bytes: [UInt8]
        do {
            bytes = try fileSystem.readAll(path)
        } catch {
            throw OpLogError(.io, "cannot read the incarnation file: \(error.message)", file: path)
        }
        guard let value = decodeIncarnation(bytes) else {
            throw OpLogError(
                .corrupt, "the incarnation file is malformed (\(bytes.count) bytes); see docs/runbook.md, \"The incarnation file is malformed\"", file: path,
                offset: 0)
        }
        return value
    }

    /// Creates `directory` (and any missing parents) and its `subdirectories`. The parent of
    /// each directory it creates is fsynced; and at every start, whatever existed, the data
    /// directory's parent, the data directory and each subdirectory are fsynced too: a directory
    /// made by a process that crashed before syncing it exists in the page cache but may not
    /// survive a power loss. A few fsyncs at start-up.
    public static func makeDurableDirectories(_ directory: String, _ subdirectories: [String], _ fileSystem: any FileSystem) throws(FileSystemError) {
        try makeDurableDirectory(directory, fileSystem, creatingParents: true)
        try fileSystem.syncDirectory(parentDirectory(of: directory))
        for sub in subdirectories {
            try makeDurableDirectory(directory + "/" + sub, fileSystem)
            try fileSystem.syncDirectory(directory + "/" + sub)
        }
        try fileSystem.syncDirectory(directory)
    }

    /// Checks that the disk has room for this node's first writes, by writing `bytes` of zeros to
    /// `raft/space-check` and removing the file again; throws `.noSpace` when it does not.
    /// Recovery on a full disk may need to write nothing and succeed, and the node would then
    /// stop (exit 75) at its first write (its hard state at the first election, the log's next
    /// preallocation step): `banyan serve` calls this before the node takes part and waits out
    /// `.noSpace` (docs/operations.md, "Disk space"). The default is one preallocation step of
    /// the log plus 64 KiB for the hard state and markers (a block or a page each).
    public func requireRoom(bytes: Int = SegmentedLog.Options().preallocationBytes + (64 << 10)) throws(OpLogError) {
        let path = directory + "/raft/space-check"
        let chunk = [UInt8](repeating: 0, count: 64 << 10)
        do {
            let file = try fileSystem.create(path)
            defer { fileSystem.close(file) }
            var written = 0
            while written < bytes {
                let count = min(chunk.count, bytes - written)
                try fileSystem.append(file, count == chunk.count ? chunk : Array(chunk.prefix(count)))
                written += count
            }
        } catch {
            try? fileSystem.remove(path)
            throw OpLogError(
                error.code == .noSpace ? .noSpace : .io, "no room for the node's first \(bytes) bytes of writes: \(error.message)", file: path)
        }
        do {
            try fileSystem.remove(path)
        } catch {
            throw OpLogError(.io, "cannot remove the space check file: \(error.message)", file: path)
        }
    }

    /// Whether the last hard state written gives this node a vote: what a crash now would
    /// leave it (a restart also gives the vote back for an admission its durable log holds).
    public var savedMayVote: Bool { savedHardState.mayVote }

    /// True when nothing was ever stored here (a new node).
    public var isBlank: Bool {
        savedHardState == BanyanRaft.HardState(mayVote: false) && log.lastIndex == 0 && ((try? snapshots.latest()) ?? nil) == nil
    }

    /// Reads everything back: the newest snapshot into a state machine, the log after it.
    public func load(progress: @escaping (String) -> Void) throws -> Loaded {
        var machine = StateMachine()
        var meta = SnapshotMeta.none
        if let latest = try snapshots.latest() {
            // The image streams from the file through inflate into the tree readers; it is never
            // held whole, and its length and checksum are verified before this returns.
            machine = try snapshots.readImage(lastIndex: latest.lastIndex) { image in
                var read = 0
                return try StateMachine(limits: .snapshot, maxLength: Int(clamping: image.imageLength)) { buffer in
                    let got = try image.read(into: buffer)
                    if (read + got) >> 26 > read >> 26 { progress("snapshot load: \((read + got) >> 20) of \(image.imageLength >> 20) MiB") }
                    read += got
                    return got
                }
            }
            meta = SnapshotMeta(index: latest.lastIndex, term: latest.lastTerm, membership: try Self.decodeMembership(latest.membership))
        }
        // A log that does not continue the snapshot (a crash between installing a snapshot and
        // discarding the old log) is discarded; so is a log that is empty.
        if meta.index > 0 {
            if log.lastIndex < meta.index || log.term(at: meta.index).map({ $0 != meta.term }) == true {
                // The snapshot is ahead of the log, or the log diverged at its index.
                try log.reset(after: meta.index)
            } else if log.firstIndex > meta.index + 1 {
                // Records between the snapshot and the log are missing. Compaction never
                // removes records a durable snapshot does not cover, so this is damage: refuse
                // to start rather than serve a state with a hole in it.
                throw OpLogError(
                    .corrupt, "the log starts at \(log.firstIndex) but the newest snapshot ends at \(meta.index)",
                    file: directory + "/raft/log", offset: 0)
            } else {
                try log.compact(through: meta.index)
            }
        }
        var entries: [BanyanRaft.LogEntry] = []
        if log.lastIndex > meta.index {
            let stored = try log.entries(from: meta.index + 1, through: log.lastIndex)
            entries.reserveCapacity(stored.count)
            for e in stored { entries.append(try Self.raftEntry(e)) }
        }
        var hs = savedHardState
        hs.commit = max(hs.commit, meta.index)
        let last = meta.index + UInt64(entries.count)
        guard hs.commit <= last else {
            // The hard state is saved only after the entries it commits are durable, so a log
            // that ends below it lost committed records (damage, or a cut tail): never clamp and
            // serve less than was acknowledged (item 2 of issue 14; docs/runbook.md).
            throw OpLogError(
                .corrupt,
                "the saved commit index \(hs.commit) is beyond the log's last entry \(last): committed records are missing (see docs/runbook.md, \"the log ends below the commit index\")",
                file: directory + "/raft/hardstate", offset: 0)
        }
        return Loaded(persisted: PersistedState(hardState: hs, snapshot: meta, entries: entries), machine: machine)
    }

    /// Seeds this blank directory with a restored state (`banyan restore`, docs/backup.md): the
    /// machine as the newest snapshot at its applied index with `members` as the only members,
    /// then a hard state that commits it (the node may vote). The snapshot is durable before the
    /// hard state; `banyan restore` writes into a fresh directory and renames it into place only
    /// once this returned, so a crash never leaves a half-seeded data directory in use.
    public func seed(restored machine: StateMachine, term: UInt64, members: [NodeID], progress: @escaping (UInt64) -> Void) throws {
        guard isBlank else { throw OpLogError(.invalidArgument, "the data directory already holds state", file: directory) }
        let index = machine.appliedIndex
        guard index > 0, term > 0, !members.isEmpty else {
            throw OpLogError(.invalidArgument, "a restored state needs an index, a term and members (got \(index), \(term), \(members))")
        }
        try leavePristine()
        let record = SnapshotMetaRecord(lastIndex: index, lastTerm: term, membership: Self.encodeMembership(Membership(voters: members)))
        try snapshots.write(record, progress: progress, removeOlder: false) { emit in try machine.writeImage(emit: emit) }
        try saveHardState(BanyanRaft.HardState(term: term, vote: 0, commit: index, mayVote: true))
    }

    /// Writes the founding configuration of a new cluster (index 1, term 1).
    public func bootstrap(members: [NodeID]) throws {
        let state = RaftNode.bootstrapState(members: members)
        try persistEntries(state.entries)
        try saveHardState(state.hardState)
    }

    // MARK: - The Ready contract, step 1 and 2

    /// Snapshot chunks from the leader, then the snapshot install, then entries and hard state,
    /// fsynced. Returns the state machine loaded from an installed snapshot.
    public func persist(_ rd: Ready) throws -> StateMachine? {
        for chunk in rd.snapshotChunks {
            if !(try snapshots.writeIncoming(offset: chunk.offset, bytes: chunk.data)) {
                logger.debug("dropped an out-of-order snapshot chunk", metadata: ["offset": "\(chunk.offset)"])
            }
        }
        var installed: StateMachine?
        if let meta = rd.snapshot {
            // Verify and decode the received file before anything is replaced: a damaged transfer
            // must leave the disk exactly as it was (the caller then reloads from it).
            do {
                installed = try snapshots.readIncomingImage(lastIndex: meta.index) { image in
                    try StateMachine(limits: .snapshot, maxLength: Int(clamping: image.imageLength)) { try image.read(into: $0) }
                }
            } catch {
                snapshots.discardIncoming()
                throw DamagedIncomingSnapshot(index: meta.index, reason: "\(error)")
            }
            try leavePristine()
            _ = try snapshots.installIncoming(lastIndex: meta.index)
            if log.term(at: meta.index) == meta.term {
                try log.compact(through: meta.index)
            } else {
                try log.reset(after: meta.index)
            }
            logger.info("installed a snapshot from the leader", metadata: ["index": "\(meta.index)", "term": "\(meta.term)"])
        }
        if let hs = rd.hardState { latestHardState = hs }
        try persistEntries(rd.entries, hardState: latestHardState)
        if let hs = rd.hardState {
            // Term, vote and mayVote must be durable before any message that depends on them
            // (R3). The commit index need not be: a node restarting with an older commit learns
            // the rest from the leader, so commit-only changes are saved with the next other
            // change (saving them would cost three fsyncs per batch).
            // A committed configuration entry must survive a restart as committed: a node that
            // restarted with an older commit index would act on an older membership.
            let commitsConfig = rd.committedEntries.contains { if case .config = $0.kind { return true } else { return false } }
            if hs.term != savedHardState.term || hs.vote != savedHardState.vote || hs.mayVote != savedHardState.mayVote || commitsConfig {
                try saveHardState(hs)
            }
        }
        return installed
    }

    /// Writes and fsyncs `entries`. `hardState` is the core's latest (its commit decides the
    /// configuration rule below; nil only while bootstrapping).
    ///
    /// The configuration rule (item 1 of issue 14): no configuration entry becomes durable while
    /// the durable commit index is below the configuration entry before it. A node restarts with
    /// the membership of the last committed configuration entry it holds; if it could restart
    /// holding configuration i but a saved commit below configuration j < i, it would act on the
    /// membership before j while the leader that sent i had moved past j, and two leaders
    /// could be elected in one term. So before each configuration entry in a batch, the entries
    /// ahead of it are made durable and the commit (at most the entry before it) is saved. The
    /// core's commit always covers j by then: a leader proposes a configuration only once the
    /// previous one committed, and the append that carries i carries that commit. Configuration
    /// entries are rare; the extra fsync is paid only for them.
    private func persistEntries(_ entries: [BanyanRaft.LogEntry], hardState: BanyanRaft.HardState? = nil) throws {
        guard let first = entries.first else { return }
        try leavePristine()
        if first.index <= log.lastIndex {
            try log.truncate(after: first.index - 1)
        } else if first.index > log.lastIndex + 1 {
            // Only after a snapshot the log does not reach (reset did that already otherwise).
            try log.reset(after: first.index - 1)
        }
        var start = 0
        if let hardState, sabotage != .configurationBeforeCommit {
            for k in entries.indices {
                guard case .config = entries[k].kind else { continue }
                let commit = min(hardState.commit, entries[k].index - 1)
                guard commit > savedHardState.commit else { continue }
                if k > start {
                    try log.append(entries[start..<k].map(Self.storedEntry))
                    try log.sync()
                    start = k
                }
                var durable = hardState
                durable.commit = commit
                try saveHardState(durable)
            }
        }
        try log.append(entries[start...].map(Self.storedEntry))
        try log.sync()
    }

    private func saveHardState(_ hs: BanyanRaft.HardState) throws {
        try leavePristine()
        try hardStates.save(HardStateRecord(term: hs.term, vote: hs.vote, commit: hs.commit, mayVote: hs.mayVote))
        savedHardState = hs
    }

    /// Saves the commit index too (at shutdown and after snapshots). Pass the core's
    /// `durableHardState`: its commit covers only entries durable in the core's log. The commit
    /// is also never saved beyond the log on disk, and never lowered.
    public func saveCommit(_ hs: BanyanRaft.HardState) throws {
        var hs = hs
        hs.commit = max(savedHardState.commit, min(hs.commit, log.lastIndex))
        if hs != savedHardState { try saveHardState(hs) }
    }

    /// A follower's chunk of the snapshot file at `request.meta.index`: at most
    /// `request.maxBytes` bytes from `request.offset`, and whether they end the file. The offset
    /// comes from a peer, so one beyond the file is an error, not a trap.
    public func snapshotChunk(_ request: SnapshotChunkRequest) throws(OpLogError) -> (data: [UInt8], last: Bool) {
        let total = try snapshots.fileSize(lastIndex: request.meta.index)
        guard let offset = Int(exactly: request.offset), offset <= total else {
            throw OpLogError(.invalidArgument, "offset \(request.offset) is beyond the snapshot's \(total) bytes")
        }
        let data = try snapshots.rawChunk(lastIndex: request.meta.index, offset: offset, maxBytes: request.maxBytes)
        return (data, offset + data.count >= total)
    }

    /// After a snapshot at `index` is durable: drop log segments it covers.
    public func compact(through index: UInt64) throws {
        try log.compact(through: index)
    }

    public var logFirstIndex: UInt64 { log.firstIndex }
    public var logLastIndex: UInt64 { log.lastIndex }

    // MARK: - Entry and membership encoding

    public static func storedEntry(_ e: BanyanRaft.LogEntry) -> LogRecord {
        switch e.kind {
        case .command: return LogRecord(index: e.index, term: e.term, kind: 1, payload: e.data)
        case .noop: return LogRecord(index: e.index, term: e.term, kind: 2, payload: [])
        case .config(let m): return LogRecord(index: e.index, term: e.term, kind: 3, payload: encodeMembership(m))
        }
    }

    public static func raftEntry(_ e: LogRecord) throws -> BanyanRaft.LogEntry {
        switch e.kind {
        case 1: return BanyanRaft.LogEntry(index: e.index, term: e.term, kind: .command, data: e.payload)
        case 2: return BanyanRaft.LogEntry(index: e.index, term: e.term, kind: .noop)
        case 3: return BanyanRaft.LogEntry(index: e.index, term: e.term, kind: .config(try decodeMembership(e.payload)))
        default: throw OpLogError(.corrupt, "log record \(e.index) has unknown kind \(e.kind)")
        }
    }

    /// The voter ids, then the learner ids (each a u64 count and u64s), then, only when the
    /// membership records incarnations, a u64 count and (id, incarnation) u64 pairs in id order.
    /// A membership without incarnations has exactly the bytes it had before they existed, and
    /// older readers skip the pairs.
    public static func encodeMembership(_ m: Membership) -> [UInt8] {
        var w = ByteWriter(capacity: 16 + 8 * (m.voters.count + m.learners.count) + 8 + 16 * m.incarnations.count)
        w.u64s(m.voters)
        w.u64s(m.learners)
        if !m.incarnations.isEmpty {
            let ids = m.incarnations.keys.sorted()
            w.u64(UInt64(ids.count))
            for id in ids {
                w.u64(id)
                w.u64(m.incarnation(of: id))
            }
        }
        return w.finish()
    }

    /// Decodes `encodeMembership`'s bytes (empty bytes: the empty membership); anything else,
    /// including an incarnation for a non-member, a zero or repeated one, or trailing bytes, is
    /// `.corrupt`, naming the field.
    public static func decodeMembership(_ bytes: [UInt8]) throws -> Membership {
        if bytes.isEmpty { return .empty }
        do throws(ByteCodecError) {
            return try ByteReader.readAll(bytes) { (r) throws(ByteCodecError) in
                let voters = try r.u64s("voters")
                let learners = try r.u64s("learners")
                guard !r.atEnd else { return Membership(voters: voters, learners: learners) }
                let n = try r.count("incarnations", itemBytes: 16)
                let members = Set(voters).union(learners)
                var incarnations: [NodeID: UInt64] = [:]
                for _ in 0..<n {
                    let id = try r.u64("incarnation id")
                    let incarnation = try r.u64("incarnation")
                    guard members.contains(id), incarnation != 0, incarnations[id] == nil else {
                        throw .badValue(field: "incarnation of node \(id)")
                    }
                    incarnations[id] = incarnation
                }
                return Membership(voters: voters, learners: learners, incarnations: incarnations)
            }
        } catch {
            throw OpLogError(.corrupt, "membership record is malformed: \(error)")
        }
    }
}

/// A snapshot received from the leader failed verification (checksum, length, or its image does
/// not decode). Nothing was installed; the node reloads its state from disk and the leader sends
/// the snapshot again.
public struct DamagedIncomingSnapshot: Error, CustomStringConvertible {
    public let index: UInt64
    public let reason: String
    public var description: String { "the snapshot received for index \(index) is damaged: \(reason)" }
}

/// Writes a snapshot of a state machine copy off the replica thread, with its own file-system
/// instance (the files it touches are disjoint from the loop's until the atomic rename).
/// Not `Sendable` checked: the file system must be one the writing thread may use (the server
/// gives each writer a `PosixFileSystem` of its own; the simulator its node's simulated disk).
public struct SnapshotWriter: @unchecked Sendable {
    public let directory: String
    private let fileSystem: any FileSystem

    public init(directory: String, fileSystem: any FileSystem = PosixFileSystem()) {
        self.directory = directory
        self.fileSystem = fileSystem
    }

    public func write(_ machine: StateMachine, meta: SnapshotMeta, progress: @escaping (UInt64) -> Void) throws {
        let store = try SnapshotStore(directory: directory + "/snapshots", fileSystem: fileSystem, removeLeftovers: false)
        let metadata = SnapshotMetaRecord(lastIndex: meta.index, lastTerm: meta.term, membership: NodeStorage.encodeMembership(meta.membership))
        // Older snapshots are removed by the replica thread once this one is durable (see
        // `NodeRuntime.writeSnapshot`), never from here.
        try store.write(metadata, progress: progress, removeOlder: false) { emit in try machine.writeImage(emit: emit) }
    }
}
