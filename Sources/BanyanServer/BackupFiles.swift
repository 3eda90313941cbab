public import BanyanNode
public import BanyanOpLogFiles
public import BanyanStateMachine
import BanyanTree
import Foundation
import Logging

/// Backup files and log archives on disk, for `banyan backup`, `banyan backup verify` and
/// `banyan restore` (docs/backup.md).
public enum BackupFiles {
    public struct Loaded {
        public var header: BackupHeader
        public var machine: StateMachine
        public var fileBytes: UInt64
        public var imageBytes: UInt64
        public var namespaceCount: Int { machine.namespaces.count }
    }

    /// Reads a backup file, checking every frame, the whole image's checksum, and that the image
    /// decodes into a state (every tree validated as a snapshot is). A damaged file is a
    /// `BackupError` naming the file and the offset of the damaged part.
    /// `progress(bytesRead, fileBytes)` is called every `reportEvery` seconds while it reads, and
    /// once at the end if it was called before (a small file reads silently).
    public static func load(_ path: String, reportEvery: Double = 2, progress: (UInt64, UInt64) -> Void = { _, _ in }) throws -> Loaded {
        do {
            return try loadFile(path, reportEvery: reportEvery, progress: progress)
        } catch let e as BackupError {
            throw e.inFile(path)
        }
    }

    /// A file that cannot be opened is not a damaged one: the error says why (no such file, no
    /// permission) and names no offset.
    public struct UnreadableFile: Error, Sendable, CustomStringConvertible {
        public var path: String
        public var reason: String
        public var description: String { "cannot open \(path): \(reason)" }
    }

    static func openForReading(_ path: String) throws -> FileHandle {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw UnreadableFile(path: path, reason: String(cString: strerror(errno))) }
        return FileHandle(fileDescriptor: fd, closeOnDealloc: true)
    }

    /// The header alone (the cluster, index and term a backup stands for), checked.
    public static func readHeader(_ path: String) throws -> BackupHeader {
        let handle = try openForReading(path)
        defer { try? handle.close() }
        let fd = handle.fileDescriptor
        let decoder = BackupDecoder { buffer in
            let n = Glibc.read(fd, buffer.baseAddress, buffer.count)
            guard n >= 0 else { throw BackupError(offset: 0, "cannot read: \(String(cString: strerror(errno)))", file: path) }
            return n
        }
        do {
            return try decoder.readHeader()
        } catch let e as BackupError {
            throw e.inFile(path)
        }
    }

    private static func loadFile(_ path: String, reportEvery: Double, progress: (UInt64, UInt64) -> Void) throws -> Loaded {
        let handle = try openForReading(path)
        defer { try? handle.close() }
        let fd = handle.fileDescriptor
        var info = stat()
        let size = fstat(fd, &info) == 0 ? UInt64(max(0, info.st_size)) : 0
        var clock = ProgressClock(every: reportEvery)
        var reported = false
        let decoder = BackupDecoder { buffer in
            let n = Glibc.read(fd, buffer.baseAddress, buffer.count)
            guard n >= 0 else { throw BackupError(offset: 0, "cannot read: \(String(cString: strerror(errno)))") }
            return n
        }
        let header = try decoder.readHeader()
        let machine: StateMachine
        do {
            machine = try StateMachine(limits: .snapshot, maxLength: Int(clamping: max(size, 1) &* 4096)) { buffer in
                let n = try decoder.read(into: buffer)
                if clock.due() {
                    reported = true
                    progress(decoder.offset, size)
                }
                return n
            }
        } catch let error as BackupError {
            throw error
        } catch {
            throw BackupError(offset: decoder.offset, "the image does not decode: \(error)")
        }
        guard machine.appliedIndex == header.index else {
            throw BackupError(offset: 0, "the image is at index \(machine.appliedIndex) but the header says \(header.index)")
        }
        if reported { progress(decoder.offset, size) }
        return Loaded(header: header, machine: machine, fileBytes: decoder.offset, imageBytes: decoder.imageLength)
    }

    /// `path` as an absolute path without a trailing slash (`d/` names the directory `d`, whose
    /// staging sibling must be `d.restoring-…`, not a directory inside it).
    static func standardizedDirectory(_ path: String) throws(RestoreError) -> String {
        guard !path.isEmpty else { throw RestoreError("the data directory is empty") }
        var p = URL(fileURLWithPath: path).standardizedFileURL.path
        while p.count > 1 && p.hasSuffix("/") { p.removeLast() }
        guard p != "/" && !p.isEmpty else { throw RestoreError("'\(path)' is the root directory: restore seeds a directory of its own") }
        return p
    }

    public struct RestoreSummary: Sendable {
        public var backupIndex: UInt64
        public var restoredIndex: UInt64
        /// The restored node's term: the source's last plus `RestoreReplay.restoredTermOffset`.
        public var restoredTerm: UInt64
        public var replayed: Int
        public var lastTimestamp: Int64
        public var namespaces: Int
    }

    /// Seeds `dataDirectory` (absent or empty) for node `nodeID` of a new cluster from a backup,
    /// replaying `archive` up to `target`. The directory is written beside it and renamed into
    /// place at the end, so it never holds a partial state.
    public static func restore(
        backup path: String, archive: String?, target: RestoreTarget, dataDirectory given: String, nodeID: UInt64, reportEvery: Double = 2,
        progress: @escaping (String) -> Void
    ) throws -> RestoreSummary {
        let fm = FileManager.default
        let dataDirectory = try standardizedDirectory(given)
        var isDirectory: ObjCBool = false
        if fm.fileExists(atPath: dataDirectory, isDirectory: &isDirectory) {
            guard isDirectory.boolValue, (try fm.contentsOfDirectory(atPath: dataDirectory)).isEmpty else {
                throw RestoreError("\(dataDirectory) already holds state (or is not a directory): restore seeds a new, empty data directory only")
            }
        }
        guard nodeID > 0 else { throw RestoreError("the node id must be 1 or more") }
        if let archive {
            var isArchive: ObjCBool = false
            guard fm.fileExists(atPath: archive, isDirectory: &isArchive), isArchive.boolValue else {
                throw RestoreError("no archive directory at \(archive) (give the --out directory of banyan backup --follow)")
            }
        }
        let reading = ProgressMeter()
        let loaded = try load(path, reportEvery: reportEvery) { read, total in progress("backup: read \(reading.describe(read, of: total))") }
        progress("backup: index \(loaded.header.index), \(loaded.machine.namespaces.count) namespaces, verified")
        var replay = try RestoreReplay(machine: loaded.machine, term: max(1, loaded.header.term), target: target)
        if archive == nil, case .index(let i) = target, i > loaded.header.index {
            throw RestoreError("the backup is at index \(loaded.header.index), before the target index \(i), and no --archive was given to replay from it to there")
        }
        // Where the archiver recorded the archive's end (nil: an archive from before it did).
        let recordedEnd = try archive.flatMap { try ArchiveDirectory($0).recordedEnd() }
        if let archive {
            var clock = ProgressClock(every: reportEvery)
            let start = replay.machine.appliedIndex
            let goal: UInt64?
            switch target {
            case .index(let i): goal = i
            case .latest: goal = recordedEnd
            case .time: goal = nil
            }
            let replaying = ProgressMeter(unit: .entries)
            try ArchiveDirectory(archive).forEach(from: replay.nextIndex) { entry in
                let more = try replay.apply(entry)
                if clock.due() {
                    let done = replay.machine.appliedIndex - start
                    let total = goal.map { $0 > start ? $0 - start : 0 }
                    progress("archive: replayed to index \(replay.machine.appliedIndex): \(replaying.describe(done, of: total))")
                }
                return more
            }
        }
        if let archive, let end = recordedEnd, !replay.reachedTarget, replay.machine.appliedIndex < end {
            // The files end before the archiver's record of what it archived: a file was deleted
            // or moved, or cut short at a record boundary (which its records alone cannot show).
            throw RestoreError(
                "the archive in \(archive) records its last entry as index \(end) (its \(ArchiveDirectory.endFile) file), but its files end at index \(replay.machine.appliedIndex): "
                    + "entries \(replay.machine.appliedIndex + 1)…\(end) are missing (a log file deleted, moved or cut short). Restore those files, or restore with --to-index \(replay.machine.appliedIndex) to accept that point"
            )
        }
        try replay.checkEnded()
        let restoredTerm = try replay.restoredTerm()
        if case .time(let t) = target, !replay.reachedTarget {
            // Nothing says what happened between the last archived write and the target time:
            // refuse rather than restore an earlier point silently (as PostgreSQL does when
            // recovery ends before its target).
            throw RestoreError(
                "the \(archive == nil ? "backup" : "archive") ends at index \(replay.machine.appliedIndex) (last write stamped \(replay.machine.lastTimestamp) ms), before the target time \(t) ms: restore with --to-index \(replay.machine.appliedIndex), or without a target, to accept that point"
            )
        }
        // What the archive replayed is filtered as a backup is: free-space alarms raised and
        // node addresses published after the base backup describe the source cluster's nodes
        // (an alarm of a node id the new cluster may not even have would refuse every write).
        let restored = BackupImage.forBackup(replay.machine)
        let staging = dataDirectory + ".restoring-\(getpid())"
        try? fm.removeItem(atPath: staging)
        let storage = try NodeStorage(
            directory: staging, logger: Logger(label: "banyan.restore"), newIncarnation: UInt64.random(in: 1...UInt64.max), progress: { _ in })
        var clock = ProgressClock(every: reportEvery)
        let writing = ProgressMeter()
        do {
            try storage.seed(restored: restored, term: restoredTerm, members: [nodeID]) { bytes in
                if clock.due() { progress("data directory: wrote \(writing.describe(bytes)) of snapshot image") }
            }
        } catch {
            try? fm.removeItem(atPath: staging)
            throw error
        }
        // rename(2) replaces an empty directory and refuses one that is not: a directory that
        // gained files while the restore ran (a node started on it meanwhile) is left as it is.
        guard rename(staging, dataDirectory) == 0 else {
            let reason = String(cString: strerror(errno))
            throw RestoreError(
                "cannot move the restored state into \(dataDirectory) (\(reason)): it was checked empty when the restore began; if something wrote to it since, it is left untouched. The restored state is in \(staging)")
        }
        let parent = (dataDirectory as NSString).deletingLastPathComponent
        let dirFD = open(parent.isEmpty ? "." : parent, O_RDONLY)
        if dirFD >= 0 {
            _ = fsync(dirFD)
            close(dirFD)
        }
        return RestoreSummary(
            backupIndex: loaded.header.index, restoredIndex: replay.machine.appliedIndex, restoredTerm: restoredTerm, replayed: replay.applied,
            lastTimestamp: restored.lastTimestamp, namespaces: restored.namespaces.count)
    }
}

/// Whether a long operation's next progress line is due: every `every` seconds of monotonic
/// time (operators watch time, not bytes: a slow disk must not go silent for minutes).
public struct ProgressClock {
    public let every: Double
    private var last = DispatchTime.now().uptimeNanoseconds

    public init(every: Double = 2) { self.every = every }

    public mutating func due() -> Bool {
        let now = DispatchTime.now().uptimeNanoseconds
        guard Double(now &- last) / 1e9 >= every else { return false }
        last = now
        return true
    }
}

/// The text of a progress line (`banyan backup`, `backup verify`, `restore`): how much is done,
/// of how much when that is known (with the share), the rate since the start, and the time left
/// at that rate. Sizes in binary units with one decimal (`312.0 KiB`, `1.5 GiB`), entries with
/// thousands separated (`12,345 entries`), so a line reads the same at every scale.
public struct ProgressMeter: Sendable {
    public enum Unit: Sendable { case bytes, entries }
    public let unit: Unit
    /// When the operation started (monotonic nanoseconds).
    public let started: UInt64

    /// `started`: monotonic nanoseconds (nil: now).
    public init(unit: Unit = .bytes, started: UInt64? = nil) {
        self.unit = unit
        self.started = started ?? DispatchTime.now().uptimeNanoseconds
    }

    /// `12.3 MiB of 40.0 MiB (30%), 4.1 MiB/s, about 7 s left`; without a total (or a zero
    /// one) `12.3 MiB, 4.1 MiB/s`; the rate is left out until time has passed.
    public func describe(_ done: UInt64, of total: UInt64? = nil, now given: UInt64? = nil) -> String {
        let now = given ?? DispatchTime.now().uptimeNanoseconds
        var text = amount(done)
        let total = total.flatMap { $0 > 0 ? $0 : nil }
        if let total {
            let share = Int(min(100, (Double(done) / Double(total) * 100).rounded(.down)))
            text += " of \(amount(total)) (\(share)%)"
        }
        let seconds = Double(now &- started) / 1e9
        guard now > started, seconds >= 0.001 else { return text }
        let rate = Double(done) / seconds
        text += ", " + (unit == .bytes ? Self.bytes(rate) + "/s" : Self.grouped(UInt64(min(rate.rounded(), 1e18))) + " entries/s")
        if let total, total > done, rate > 0 {
            text += ", about " + Self.duration(Double(total - done) / rate) + " left"
        }
        return text
    }

    private func amount(_ n: UInt64) -> String {
        unit == .bytes ? Self.bytes(Double(n)) : Self.grouped(n) + (n == 1 ? " entry" : " entries")
    }

    /// `17 B`, `312.0 KiB`, `12.3 MiB`, `1.5 GiB`, `2.0 TiB`.
    public static func bytes(_ n: Double) -> String {
        guard n.isFinite, n >= 1024 else { return "\(n.isFinite ? Int(max(0, n)) : 0) B" }
        var value = n / 1024
        for unit in ["KiB", "MiB", "GiB"] {
            if value < 1024 { return String(format: "%.1f", value) + " " + unit }
            value /= 1024
        }
        return String(format: "%.1f TiB", value)
    }

    /// `1,234,567`.
    public static func grouped(_ n: UInt64) -> String {
        let digits = Array(String(n))
        var out = ""
        for (i, d) in digits.enumerated() {
            if i > 0 && (digits.count - i) % 3 == 0 { out.append(",") }
            out.append(d)
        }
        return out
    }

    /// `0.4 s`, `42 s`, `3 min 05 s`, `2 h 07 min`.
    public static func duration(_ seconds: Double) -> String {
        guard seconds.isFinite, seconds >= 0 else { return "?" }
        if seconds < 10 { return String(format: "%.1f s", seconds) }
        guard seconds < 1e9 else { return "a very long time" }
        let s = Int(seconds.rounded())
        if s < 60 { return "\(s) s" }
        if s < 3600 { return String(format: "%d min %02d s", s / 60, s % 60) }
        return String(format: "%d h %02d min", s / 3600, (s % 3600) / 60)
    }
}

/// A directory of archived log files (`banyan backup --follow`): `log-<first index>.arch` files of
/// `ArchivedEntry` records, and the base backups `base-<index>.bkp`. A file's records follow one
/// another; a gap between files happens only where the archiver fell behind the node's log and
/// took a new base backup.
public struct ArchiveDirectory {
    public let directory: String
    /// A file is closed and the next one started past this size.
    public static let maxFileBytes = 64 << 20
    /// Archive files hold everything the log held (password hashes, refresh and signing keys
    /// included) and are not encrypted: readable by their owner only, whatever the umask.
    static var privateFile: [FileAttributeKey: Any] { [.posixPermissions: 0o600] }

    public init(_ directory: String) {
        self.directory = directory
    }

    /// Archive files by first index, ascending. A file named for index 0 is refused: log
    /// entries start at 1.
    public func files() throws -> [(name: String, first: UInt64)] {
        let names = try FileManager.default.contentsOfDirectory(atPath: directory)
        let files = names.compactMap { n in ArchivedEntry.firstIndex(ofFile: n).map { (name: n, first: $0) } }.sorted { $0.first < $1.first }
        if let zero = files.first, zero.first == 0 {
            throw BackupError(offset: 0, "an archive file is named for index 0, but log entries start at 1 (not written by banyan backup --follow)", file: directory + "/" + zero.name)
        }
        return files
    }

    /// Base backups by index, ascending.
    public func baseBackups() throws -> [(name: String, index: UInt64)] {
        let names = try FileManager.default.contentsOfDirectory(atPath: directory)
        return names.compactMap { n -> (String, UInt64)? in
            guard n.hasPrefix("base-"), n.hasSuffix(".bkp"), let i = UInt64(n.dropFirst(5).dropLast(4)) else { return nil }
            return (n, i)
        }.sorted { $0.1 < $1.1 }
    }

    public static func baseName(index: UInt64) -> String {
        let digits = String(index)
        return "base-" + String(repeating: "0", count: max(0, 20 - digits.count)) + digits + ".bkp"
    }

    private func read(_ name: String) throws -> (entries: [ArchivedEntry], validEnd: Int, complete: Bool) {
        let path = directory + "/" + name
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        guard bytes.count >= ArchivedEntry.fileMagic.count, Array(bytes.prefix(ArchivedEntry.fileMagic.count)) == ArchivedEntry.fileMagic else {
            throw BackupError(offset: 0, "not a Banyan log archive (bad magic)", file: path)
        }
        let parsed: (entries: [ArchivedEntry], validEnd: Int, complete: Bool)
        do {
            parsed = try ArchivedEntry.parse(bytes, from: ArchivedEntry.fileMagic.count)
        } catch let e as BackupError {
            throw e.inFile(path)
        }
        if let named = ArchivedEntry.firstIndex(ofFile: name), let first = parsed.entries.first, first.index != named {
            throw BackupError(offset: UInt64(ArchivedEntry.fileMagic.count), "the file is named for index \(named) but its first record is entry \(first.index)", file: path)
        }
        return parsed
    }

    /// Calls `body` with every archived entry from `index` on, in order, until it returns false.
    /// A cut-short last record (an interrupted archiver) ends the archive; entries missing
    /// between files are reported by the caller (`RestoreReplay` refuses a gap it needs).
    public func forEach(from index: UInt64, _ body: (ArchivedEntry) throws -> Bool) throws {
        let all = try files()
        for (position, file) in all.enumerated() {
            // Skip files entirely before `index` (the next file starts at or below it).
            if position + 1 < all.count, all[position + 1].first <= index { continue }
            let parsed = try read(file.name)
            // Only the last file may end in a record cut short (an interrupted archiver);
            // anywhere else that is damage (a length field that reads too long, say).
            if !parsed.complete, position + 1 < all.count {
                throw BackupError(offset: UInt64(parsed.validEnd), "a record is cut short before the end of the archive", file: directory + "/" + file.name)
            }
            for entry in parsed.entries where entry.index >= index {
                if !(try body(entry)) { return }
            }
        }
    }

    /// The last archived index (0: none), after cutting a record left half-written by an
    /// interrupted archiver from the last file.
    public func recoverLastIndex() throws -> UInt64 {
        try recoverLast().index
    }

    /// The same, with the last archived entry itself (nil: no file holds an entry; `index`
    /// is then where the last file would have started, less one).
    public func recoverLast() throws -> (index: UInt64, entry: ArchivedEntry?) {
        // A file being created when the archiver stopped never got its name.
        for name in try FileManager.default.contentsOfDirectory(atPath: directory) where name.hasSuffix(".arch.tmp") {
            try? FileManager.default.removeItem(atPath: directory + "/" + name)
        }
        guard let last = try files().last else { return (0, nil) }
        let parsed = try read(last.name)
        if !parsed.complete {
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: directory + "/" + last.name))
            try handle.truncate(atOffset: UInt64(parsed.validEnd))
            try handle.synchronize()
            try handle.close()
        }
        // `files()` refuses a file named for index 0, so `first - 1` cannot wrap.
        if let entry = parsed.entries.last { return (entry.index, entry) }
        return (last.first - 1, nil)
    }

    /// Appends entries, fsynced before this returns: to the last file when they continue its
    /// last entry (`last`: the last archived index), else to a new file (after a gap, or past
    /// `maxFileBytes`), which is written under a temporary name, fsynced and renamed, so a file
    /// with an archive's name always starts with the magic.
    public func append(_ entries: [ArchivedEntry], continuing last: UInt64) throws {
        guard let first = entries.first else { return }
        let fm = FileManager.default
        var target = try files().last
        if let t = target {
            var info = stat()
            let size = stat(directory + "/" + t.name, &info) == 0 ? Int(info.st_size) : 0
            if last == UInt64.max || first.index != last + 1 || size >= Self.maxFileBytes { target = nil }
        }
        let name = target?.name ?? ArchivedEntry.fileName(firstIndex: first.index)
        let path = directory + "/" + name
        var bytes: [UInt8] = target == nil ? ArchivedEntry.fileMagic : []
        for e in entries { e.append(to: &bytes) }
        let writing = target == nil ? path + ".tmp" : path
        if target == nil { fm.createFile(atPath: writing, contents: nil, attributes: Self.privateFile) }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: writing))
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(bytes))
        try handle.synchronize()
        if target == nil {
            try fm.moveItem(atPath: writing, toPath: path)
            Self.syncDirectory(directory)
        }
        if let end = entries.last { try recordEnd(end.index) }
    }

    /// The file recording the index of the archive's last entry, rewritten after each append
    /// once the entries are on disk: `restore` checks that its replay reaches it, so a log file
    /// deleted or cut short at a record boundary (which the records alone cannot show) is
    /// refused, not restored to an earlier point silently.
    public static let endFile = "archive-end"

    /// The last archived index the archiver recorded (nil: none recorded, an archive from
    /// before the record); a file that does not hold one index is damage.
    public func recordedEnd() throws -> UInt64? {
        let path = directory + "/" + Self.endFile
        guard FileManager.default.fileExists(atPath: path) else { return nil }
        let text = try String(contentsOfFile: path, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        guard let index = UInt64(text) else {
            throw BackupError(offset: 0, "the archive's end record holds '\(text.prefix(40))', not an index", file: path)
        }
        return index
    }

    /// Records `index` as the archive's last entry (a temporary file, fsynced and renamed; the
    /// directory is synced too, so a crash leaves this record or the one before it, never one
    /// beyond the entries on disk).
    func recordEnd(_ index: UInt64) throws {
        let path = directory + "/" + Self.endFile
        let temporary = path + ".tmp"
        _ = FileManager.default.createFile(atPath: temporary, contents: nil, attributes: Self.privateFile)
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: temporary))
        try handle.write(contentsOf: Data("\(index)\n".utf8))
        try handle.synchronize()
        try handle.close()
        guard rename(temporary, path) == 0 else {
            throw BackupError(offset: 0, "cannot rename \(temporary): \(String(cString: strerror(errno)))", file: path)
        }
        Self.syncDirectory(directory)
    }

    /// The file naming the cluster an archive follows (its `cluster_id`), written with the
    /// first base backup: `banyan backup --follow` refuses endpoints of another cluster.
    public static let clusterFile = "cluster-id"

    /// The cluster this archive follows, if recorded.
    public func recordedCluster() throws -> String? {
        let path = directory + "/" + Self.clusterFile
        guard FileManager.default.fileExists(atPath: path) else { return nil }
        let text = try String(contentsOfFile: path, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        return text.isEmpty ? nil : text
    }

    /// Records the cluster this archive follows (written under a temporary name, fsynced, renamed).
    public func recordCluster(_ id: String) throws {
        let path = directory + "/" + Self.clusterFile
        let temporary = path + ".tmp"
        _ = FileManager.default.createFile(atPath: temporary, contents: nil, attributes: Self.privateFile)
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: temporary))
        try handle.write(contentsOf: Data((id + "\n").utf8))
        try handle.synchronize()
        try handle.close()
        if FileManager.default.fileExists(atPath: path) { try FileManager.default.removeItem(atPath: path) }
        try FileManager.default.moveItem(atPath: temporary, toPath: path)
        Self.syncDirectory(directory)
    }

    public static func syncDirectory(_ path: String) {
        let fd = open(path, O_RDONLY)
        if fd >= 0 {
            _ = fsync(fd)
            close(fd)
        }
    }
}

/// One archived entry as `banyan backup log` lists it: what an operator needs to find the
/// index of a bad write (its time, namespace, kind and the locations it writes).
public struct ArchivedWrite: Sendable, Equatable {
    public var index: UInt64
    public var term: UInt64
    /// The leader's timestamp (ms since 1970); nil for no-ops, configuration changes and
    /// payloads that do not decode.
    public var timestamp: Int64?
    public var namespace: String?
    /// `set`, `update`, `transaction`, `rules`, `no-op`, … (`undecodable` for a payload of a
    /// newer version).
    public var kind: String
    /// The absolute locations written (an update's each); empty for commands that write none.
    public var paths: [String]
    /// Bytes of JSON written.
    public var bytes: Int

    public init(_ entry: ArchivedEntry) {
        index = entry.index
        term = entry.term
        timestamp = nil
        namespace = nil
        paths = []
        bytes = 0
        switch entry.kind {
        case .noop:
            kind = "no-op"
            return
        case .config:
            kind = "membership"
            return
        case .command: kind = "undecodable"
        }
        guard let envelope = CommandEnvelope(decoding: entry.payload) else { return }
        timestamp = envelope.timestamp
        namespace = envelope.namespace
        func joined(_ base: String, _ items: [Command.UpdateItem]) -> [String] {
            items.map { Self.normalized(base + "/" + $0.path) }
        }
        switch envelope.command {
        case let .set(path, json):
            (kind, paths, bytes) = ("set", [Self.normalized(path)], json.count)
        case let .update(path, entries):
            (kind, paths, bytes) = ("update", joined(path, entries), entries.reduce(0) { $0 + $1.json.count })
        case let .compareAndSet(path, _, json):
            (kind, paths, bytes) = ("transaction", [Self.normalized(path)], json.count)
        case let .onDisconnectSet(path, json, _, _):
            (kind, paths, bytes) = ("on-disconnect-set", [Self.normalized(path)], json.count)
        case let .onDisconnectUpdate(path, entries, _, _):
            (kind, paths, bytes) = ("on-disconnect-update", joined(path, entries), entries.reduce(0) { $0 + $1.json.count })
        case let .onDisconnectCancel(path, _):
            (kind, paths) = ("on-disconnect-cancel", [Self.normalized(path)])
        case .connectionEnded: kind = "connection-ended"
        case .renewLease: kind = "lease-renewal"
        case .expireHolder: kind = "lease-expiry"
        case let .setRules(text): (kind, bytes) = ("rules", text.count)
        case .account: kind = "account"
        case let .spaceAlarm(node, raised): kind = "space-alarm-\(raised ? "raised" : "cleared")-node-\(node)"
        case .expireIdle: kind = "expire-idle"
        }
    }

    /// "/a/b" for "a/b/", "//a//b" and the like; "/" for the root.
    static func normalized(_ path: String) -> String {
        "/" + path.split(separator: "/").joined(separator: "/")
    }

    /// Whether the entry writes `path`, a location inside it, or a location containing it.
    public func touches(_ path: String) -> Bool {
        let wanted = path.split(separator: "/")
        return paths.contains { written in
            let segments = written.split(separator: "/")
            return segments.starts(with: wanted) || wanted.starts(with: segments)
        }
    }

    /// One line: index, term, time, namespace, kind, locations, bytes (tab-separated).
    public var line: String {
        let time = timestamp.map { Self.iso8601($0) } ?? "-"
        let ns = namespace.map { $0.isEmpty ? "(default)" : $0 } ?? "-"
        let locations = paths.isEmpty ? "-" : paths.count <= 4 ? paths.joined(separator: ",") : paths.prefix(4).joined(separator: ",") + ",…(\(paths.count))"
        return "\(index)\t\(term)\t\(time)\t\(ns)\t\(kind)\t\(locations)\t\(bytes)"
    }

    public static let header = "index\tterm\ttime\tnamespace\tkind\tpaths\tbytes"

    /// One for every line (a formatter made per line once slowed the listing of a long archive).
    /// Whole seconds: the milliseconds are written from the integer, not from a `Double` that
    /// may fall just below them.
    private static let secondsFormat = Date.ISO8601FormatStyle()

    /// `2026-11-18T11:06:40.123Z` for 1795000000123.
    static func iso8601(_ ms: Int64) -> String {
        let remainder = ms % 1000
        let milliseconds = remainder < 0 ? remainder + 1000 : remainder
        let seconds = ms / 1000 - (remainder < 0 ? 1 : 0)
        var text = Date(timeIntervalSince1970: Double(seconds)).formatted(secondsFormat)
        if text.hasSuffix("Z") { text.removeLast() }
        let digits = String(milliseconds)
        return text + "." + String(repeating: "0", count: 3 - digits.count) + digits + "Z"
    }
}
