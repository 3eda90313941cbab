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
    /// `BackupError` with the offset of the damaged part. `progress(bytesRead, fileBytes)`.
    public static func load(_ path: String, progress: (UInt64, UInt64) -> Void = { _, _ in }) throws -> Loaded {
        guard let handle = FileHandle(forReadingAtPath: path) else { throw BackupError(offset: 0, "cannot open \(path)") }
        defer { try? handle.close() }
        let fd = handle.fileDescriptor
        var info = stat()
        let size = fstat(fd, &info) == 0 ? UInt64(max(0, info.st_size)) : 0
        var lastReport: UInt64 = 0
        let decoder = BackupDecoder { buffer in
            let n = Glibc.read(fd, buffer.baseAddress, buffer.count)
            guard n >= 0 else { throw BackupError(offset: 0, "cannot read \(path): \(String(cString: strerror(errno)))") }
            return n
        }
        let header = try decoder.readHeader()
        let machine: StateMachine
        do {
            machine = try StateMachine(limits: .snapshot, maxLength: Int(clamping: max(size, 1) &* 4096)) { buffer in
                let n = try decoder.read(into: buffer)
                if decoder.offset - lastReport >= 64 << 20 {
                    lastReport = decoder.offset
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
        if size >= 64 << 20 { progress(decoder.offset, size) }
        return Loaded(header: header, machine: machine, fileBytes: decoder.offset, imageBytes: decoder.imageLength)
    }

    public struct RestoreSummary: Sendable {
        public var backupIndex: UInt64
        public var restoredIndex: UInt64
        public var replayed: Int
        public var lastTimestamp: Int64
        public var namespaces: Int
    }

    /// Seeds `dataDirectory` (absent or empty) for node `nodeID` of a new cluster from a backup,
    /// replaying `archive` up to `target`. The directory is written beside it and renamed into
    /// place at the end, so it never holds a partial state.
    public static func restore(
        backup path: String, archive: String?, target: RestoreTarget, dataDirectory: String, nodeID: UInt64,
        progress: @escaping (String) -> Void
    ) throws -> RestoreSummary {
        let fm = FileManager.default
        var isDirectory: ObjCBool = false
        if fm.fileExists(atPath: dataDirectory, isDirectory: &isDirectory) {
            guard isDirectory.boolValue, (try fm.contentsOfDirectory(atPath: dataDirectory)).isEmpty else {
                throw RestoreError("\(dataDirectory) already holds state (or is not a directory): restore seeds a new, empty data directory only")
            }
        }
        guard nodeID > 0 else { throw RestoreError("the node id must be 1 or more") }
        let loaded = try load(path) { read, total in progress("backup: read \(read >> 20) of \(total >> 20) MiB") }
        progress("backup: index \(loaded.header.index), \(loaded.machine.namespaces.count) namespaces, verified")
        var replay = try RestoreReplay(machine: loaded.machine, term: max(1, loaded.header.term), target: target)
        if let archive {
            var lastReport = Date()
            try ArchiveDirectory(archive).forEach(from: replay.nextIndex) { entry in
                let more = try replay.apply(entry)
                if Date().timeIntervalSince(lastReport) >= 2 {
                    lastReport = Date()
                    progress("archive: replayed to index \(replay.machine.appliedIndex)")
                }
                return more
            }
        }
        try replay.checkEnded()
        if case .time(let t) = target, !replay.reachedTarget {
            // Nothing says what happened between the last archived write and the target time:
            // refuse rather than restore an earlier point silently (as PostgreSQL does when
            // recovery ends before its target).
            throw RestoreError(
                "the \(archive == nil ? "backup" : "archive") ends at index \(replay.machine.appliedIndex) (last write stamped \(replay.machine.lastTimestamp) ms), before the target time \(t) ms: restore with --to-index \(replay.machine.appliedIndex), or without a target, to accept that point"
            )
        }
        let staging = dataDirectory + ".restoring-\(getpid())"
        try? fm.removeItem(atPath: staging)
        let storage = try NodeStorage(
            directory: staging, logger: Logger(label: "banyan.restore"), newIncarnation: UInt64.random(in: 1...UInt64.max), progress: { _ in })
        var reported: UInt64 = 0
        do {
            try storage.seed(restored: replay.machine, term: replay.term, members: [nodeID]) { bytes in
                if bytes >= reported + (256 << 20) {
                    reported = bytes
                    progress("data directory: wrote \(bytes >> 20) MiB of snapshot image")
                }
            }
        } catch {
            try? fm.removeItem(atPath: staging)
            throw error
        }
        if fm.fileExists(atPath: dataDirectory) { try fm.removeItem(atPath: dataDirectory) }
        try fm.moveItem(atPath: staging, toPath: dataDirectory)
        let parent = (dataDirectory as NSString).deletingLastPathComponent
        let dirFD = open(parent.isEmpty ? "." : parent, O_RDONLY)
        if dirFD >= 0 {
            _ = fsync(dirFD)
            close(dirFD)
        }
        return RestoreSummary(
            backupIndex: loaded.header.index, restoredIndex: replay.machine.appliedIndex, replayed: replay.applied,
            lastTimestamp: replay.machine.lastTimestamp, namespaces: replay.machine.namespaces.count)
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

    public init(_ directory: String) {
        self.directory = directory
    }

    /// Archive files by first index, ascending.
    public func files() throws -> [(name: String, first: UInt64)] {
        let names = try FileManager.default.contentsOfDirectory(atPath: directory)
        return names.compactMap { n in ArchivedEntry.firstIndex(ofFile: n).map { (n, $0) } }.sorted { $0.first < $1.first }
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
            throw BackupError(offset: 0, "\(path) is not a Banyan log archive (bad magic)")
        }
        do {
            return try ArchivedEntry.parse(bytes, from: ArchivedEntry.fileMagic.count)
        } catch let e as BackupError {
            throw BackupError(offset: e.offset, "\(path): \(e.reason)")
        }
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
                throw BackupError(offset: UInt64(parsed.validEnd), "\(directory)/\(file.name): a record is cut short before the end of the archive")
            }
            for entry in parsed.entries where entry.index >= index {
                if !(try body(entry)) { return }
            }
        }
    }

    /// The last archived index (0: none), after cutting a record left half-written by an
    /// interrupted archiver from the last file.
    public func recoverLastIndex() throws -> UInt64 {
        // A file being created when the archiver stopped never got its name.
        for name in try FileManager.default.contentsOfDirectory(atPath: directory) where name.hasSuffix(".arch.tmp") {
            try? FileManager.default.removeItem(atPath: directory + "/" + name)
        }
        guard let last = try files().last else { return 0 }
        let parsed = try read(last.name)
        if !parsed.complete {
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: directory + "/" + last.name))
            try handle.truncate(atOffset: UInt64(parsed.validEnd))
            try handle.synchronize()
            try handle.close()
        }
        return parsed.entries.last?.index ?? (last.first - 1)
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
            if first.index != last + 1 || size >= Self.maxFileBytes { target = nil }
        }
        let name = target?.name ?? ArchivedEntry.fileName(firstIndex: first.index)
        let path = directory + "/" + name
        var bytes: [UInt8] = target == nil ? ArchivedEntry.fileMagic : []
        for e in entries { e.append(to: &bytes) }
        let writing = target == nil ? path + ".tmp" : path
        if target == nil { fm.createFile(atPath: writing, contents: nil) }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: writing))
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(bytes))
        try handle.synchronize()
        if target == nil {
            try fm.moveItem(atPath: writing, toPath: path)
            Self.syncDirectory(directory)
        }
    }

    public static func syncDirectory(_ path: String) {
        let fd = open(path, O_RDONLY)
        if fd >= 0 {
            _ = fsync(fd)
            close(fd)
        }
    }
}
