import ArgumentParser
import BanyanNode
import BanyanOpLogFiles
import BanyanServer
import Foundation
import NIOCore
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `banyan backup`, `banyan backup verify`, `banyan restore` (docs/backup.md).
struct BackupCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup",
        abstract: "Take an online, consistent backup of a cluster, archive its log continuously, or verify a backup.",
        subcommands: [BackupTake.self, BackupVerify.self, BackupLog.self],
        defaultSubcommand: BackupTake.self)
}

struct BackupTake: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "take",
        abstract: "Back up every namespace at one committed index (the default subcommand: `banyan backup --endpoint … --out FILE`).",
        discussion: """
            The node answers after a ReadIndex round, so the backup holds every write acknowledged \
            before it started; writes go on meanwhile. It is taken from the first given endpoint that \
            is a follower (else the first that answers). With --follow, --out is a directory: a base \
            backup is taken there if none is, then committed log entries are archived as they commit \
            (resuming after the last archived one), for point-in-time restores.
            """)

    @Option(name: .long, help: "A node's client address, host:port (repeat: a follower among them is preferred).")
    var endpoint: [String] = ["127.0.0.1:9000"]
    @Option(name: .long, help: "The backup file to write (a directory with --follow).")
    var out: String
    @Flag(name: .long, help: "Archive the committed log continuously into the --out directory.")
    var follow = false
    @Option(name: .long, help: "With --follow: stop after this many seconds (default: run until interrupted).")
    var seconds: Double?
    @Option(name: .long, help: "With --follow: how often to ask for new entries, in milliseconds.")
    var intervalMs: Int = 500
    @Flag(name: .long, help: "Take the backup from the first answering endpoint, even the leader.")
    var anyNode = false
    @Flag(
        name: .long,
        help: "With --follow: when no endpoint holds the entries after the archive's end any more (compacted), stop instead of taking a new base backup and going on.")
    var noNewBase = false

    func validate() throws {
        guard !endpoint.isEmpty else { throw ValidationError("give at least one --endpoint") }
        guard (10...60_000).contains(intervalMs) else { throw ValidationError("--interval-ms must be between 10 and 60000") }
        if seconds != nil && !follow { throw ValidationError("--seconds goes with --follow") }
        if noNewBase && !follow { throw ValidationError("--no-new-base goes with --follow") }
        if let seconds, !(seconds > 0 && seconds <= 366 * 86_400) { throw ValidationError("--seconds must be more than 0 and at most a year") }
    }

    func run() throws {
        if follow { return try followLog() }
        let source = try chooseSource()
        let summary = try download(from: source, to: out)
        print(summary)
    }

    /// The endpoint to back up from: the first follower, else the first that answers.
    private func chooseSource() throws -> String {
        var firstAnswering: String?
        for e in endpoint {
            guard let (status, body) = try? AdminClient(endpoint: e).call("GET", "/.banyan/status"), status == 200 else { continue }
            if firstAnswering == nil { firstAnswering = e }
            if anyNode { return e }
            let role = (try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])?["role"] as? String
            if role == "follower" { return e }
        }
        guard let firstAnswering else { throw CommandError("no endpoint answered: \(endpoint.joined(separator: ", "))") }
        FileHandle.standardError.write(Data("note: no follower among the endpoints; backing up from \(firstAnswering)\n".utf8))
        return firstAnswering
    }

    /// Streams a backup into `path` (through `path.partial`, fsynced and renamed at the end),
    /// then reads it back to verify it.
    private func download(from source: String, to path: String) throws -> String {
        let partial = path + ".partial"
        FileManager.default.createFile(atPath: partial, contents: nil, attributes: [.posixPermissions: 0o600])
        guard let handle = FileHandle(forWritingAtPath: partial) else { throw CommandError("cannot create \(partial)") }
        let started = Date()
        let receiving = ProgressMeter()
        let received = try StreamingDownload.run(endpoint: source, path: "/.banyan/backup", into: handle) { bytes in
            FileHandle.standardError.write(Data("received \(receiving.describe(bytes))\n".utf8))
        }
        try handle.synchronize()
        try handle.close()
        let seconds = Date().timeIntervalSince(started)
        let verifyStarted = Date()
        let verifying = ProgressMeter()
        let loaded: BackupFiles.Loaded
        do {
            loaded = try BackupFiles.load(partial) { read, total in
                FileHandle.standardError.write(Data("verifying: read \(verifying.describe(read, of: total))\n".utf8))
            }
        } catch {
            throw CommandError("the backup from \(source) is incomplete or damaged (\(error)); kept as \(partial)")
        }
        if FileManager.default.fileExists(atPath: path) { try FileManager.default.removeItem(atPath: path) }
        try FileManager.default.moveItem(atPath: partial, toPath: path)
        ArchiveDirectory.syncDirectory((path as NSString).deletingLastPathComponent.isEmpty ? "." : (path as NSString).deletingLastPathComponent)
        return String(
            format: "backup %@: index %llu (term %llu) from node %llu of cluster %@, %d namespaces; image %.1f MiB, file %.1f MiB; received in %.2f s (%.1f MB/s of image), verified in %.2f s",
            path, loaded.header.index, loaded.header.term, loaded.header.sourceNode, loaded.header.clusterID, loaded.namespaceCount,
            Double(loaded.imageBytes) / 1_048_576, Double(received) / 1_048_576, seconds, Double(loaded.imageBytes) / 1e6 / max(seconds, 1e-6),
            Date().timeIntervalSince(verifyStarted))
    }

    /// `--follow`: a base backup if the directory has none, then the committed log as it grows.
    ///
    /// The archive stays one cluster's: the directory records the cluster id of its first base
    /// backup (`cluster-id`), every endpoint must report that id before it is used and every
    /// new base backup must carry it; and on resuming, the node's copy of the last archived
    /// entry must equal the archive's (Raft's log matching, plus the command's bytes, which
    /// carry a random session id) before anything is appended after it. Two clusters that share
    /// a cluster id are told apart only by that entry.
    ///
    /// A node that compacted that entry into its snapshot answers 410 with the first index it
    /// still serves and the term of the entry before it: when that entry is the archive's last
    /// and its term is the archive's, the node's history continues the archive (Raft's log
    /// matching; a restored cluster's terms start far above its source's, so it never matches)
    /// and archiving goes on from the next index. When the node's log starts further on, the
    /// entries in between are gone from it: the other endpoints are tried, and when none has
    /// them a new base backup (checked by cluster id) covers the gap and archiving continues
    /// after it, saying which points in time the archive can no longer restore; with
    /// `--no-new-base` the command stops instead.
    private func followLog() throws {
        try FileManager.default.createDirectory(atPath: out, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let archive = ArchiveDirectory(out)
        // `archived`: the last entry in the archive's files; `last`: where archiving continues
        // (a base backup newer than the files moves it on, and the next entries start a new file).
        let recovered = try archive.recoverLast()
        if let end = try archive.recordedEnd(), end > recovered.index {
            throw CommandError(
                "the archive in \(out) records its last entry as index \(end) (its \(ArchiveDirectory.endFile) file), but its log files end at index \(recovered.index): "
                    + "files were deleted, moved or cut short. Put them back, or archive into a new directory")
        }
        var archived = recovered.index
        var last = archived
        let bases = try archive.baseBackups()
        var cluster = try archive.recordedCluster()
        if cluster == nil, let newest = bases.last {
            // An archive from before the cluster was recorded: its newest base names it.
            let id = try BackupFiles.readHeader(out + "/" + newest.name).clusterID
            try archive.recordCluster(id)
            cluster = id
        }
        /// A base backup into the directory, refused (and removed) when it is of another cluster.
        func takeBase(from source: String) throws -> BackupHeader {
            let temporary = out + "/base-new.bkp"
            say(try download(from: source, to: temporary))
            let header = try BackupFiles.readHeader(temporary)
            if let cluster, header.clusterID != cluster {
                try? FileManager.default.removeItem(atPath: temporary)
                throw CommandError(Self.otherCluster(out: out, recorded: cluster, endpoint: source, reported: header.clusterID))
            }
            if cluster == nil {
                try archive.recordCluster(header.clusterID)
                cluster = header.clusterID
            }
            try FileManager.default.moveItem(atPath: temporary, toPath: out + "/" + ArchiveDirectory.baseName(index: header.index))
            return header
        }
        // The base backup `last` continues from when it is newer than the files.
        var newestBase: BackupHeader?
        if bases.isEmpty {
            let header = try takeBase(from: try chooseSource())
            if header.index >= last { newestBase = header }
            last = max(last, header.index)
        } else if let newest = bases.last {
            let header = try BackupFiles.readHeader(out + "/" + newest.name)
            if header.index > last || recovered.entry == nil { newestBase = header }
            last = max(last, newest.index)
        }
        // The entry a node must hold unchanged before anything is appended after it (none when
        // a base backup newer than the files moved `last` on: its header was checked instead).
        var overlap: ArchivedEntry? = last == archived ? recovered.entry : nil
        /// Where a node's history must match the archive's before entries after it are taken:
        /// the archive's last entry, or the base backup `last` is at (its index and the term of
        /// its entry, Raft's log matching). Nil only after a base from before backups recorded
        /// that term (format 1), whose cluster id alone is checked.
        var anchor: (index: UInt64, term: UInt64)? = overlap.map { ($0.index, $0.term) }
        /// The base backup's record of its entry's content, checked with the anchor when known.
        var baseChecksum: UInt32?
        /// The anchor is a base backup's and no node has shown it holds that entry yet: entries
        /// are asked from the base's index, so the first one answered is checked against it.
        var baseUnchecked = false
        func anchorAtBase(_ header: BackupHeader) {
            guard header.index == last, overlap == nil else { return }
            if header.indexTerm > 0 {
                anchor = (header.index, header.indexTerm)
                baseChecksum = header.indexEntryChecksum
                baseUnchecked = true
            } else {
                anchor = nil
                baseUnchecked = false
                if header.index > 0 {
                    say("the base backup at index \(header.index) does not record its entry's term (an older format): only the cluster id is checked before archiving after it")
                }
            }
        }
        if let newestBase { anchorAtBase(newestBase) }
        // Endpoints tried since one answered that the entries after the archive's end are
        // gone from its log (nil: none did since the archive last grew).
        var gapSince: Int?
        say("archiving committed entries from index \(last &+ 1) into \(out) (cluster \(cluster ?? "?"))")
        let stop = StopFlag()
        stop.installSignalHandlers()
        let deadline = seconds.map { Date().addingTimeInterval($0) }
        var current = 0
        var archivedSinceReport = 0
        var lastReport = Date()
        var checked: Set<String> = []
        var behindNoted: Set<String> = []
        func next() {
            current += 1
            Thread.sleep(forTimeInterval: Double(intervalMs) / 1000)
        }
        while !stop.isSet, deadline.map({ Date() < $0 }) ?? true {
            let e = endpoint[current % endpoint.count]
            guard last < UInt64.max else { throw CommandError("the archive reached the largest log index (\(last)): nothing can follow it") }
            // The endpoint's cluster, once per endpoint, before anything is taken from it.
            if !checked.contains(e) {
                guard let (code, text) = try? AdminClient(endpoint: e).call("GET", "/.banyan/status"), code == 200,
                    let status = (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any]
                else {
                    FileHandle.standardError.write(Data("\(e): no status; trying the next endpoint\n".utf8))
                    next()
                    continue
                }
                let reported = status["cluster_id"] as? String ?? "?"
                if let cluster, reported != cluster {
                    throw CommandError(Self.otherCluster(out: out, recorded: cluster, endpoint: e, reported: reported))
                }
                checked.insert(e)
            }
            let from = overlap != nil ? archived : baseUnchecked ? last : last + 1
            let answer: (status: Int, body: Data, headers: [String: String])
            do {
                answer = try AdminClient(endpoint: e).fetch("GET", "/.banyan/log?from=\(from)&max_bytes=\(4 << 20)")
            } catch {
                FileHandle.standardError.write(Data("\(e): \(error); trying the next endpoint\n".utf8))
                next()
                continue
            }
            switch answer.status {
            case 200:
                let parsed: (entries: [ArchivedEntry], validEnd: Int, complete: Bool)
                do {
                    parsed = try ArchivedEntry.parse([UInt8](answer.body))
                } catch let damage as BackupError {
                    throw CommandError("\(e) sent a damaged log answer: \(damage.reason) at byte offset \(damage.offset) of its answer")
                }
                guard parsed.complete else { throw CommandError("\(e) sent a cut-short log answer") }
                var entries = parsed.entries
                gapSince = nil
                let commit = UInt64(answer.headers["x-banyan-commit-index"] ?? "") ?? last
                if overlap != nil || baseUnchecked {
                    let what = overlap != nil ? "the archive's last entry \(archived)" : "the base backup's index \(last)"
                    guard let first = entries.first else {
                        // This node has not committed that entry (yet): a lagging follower, or a
                        // cluster whose log is shorter than the archive.
                        if behindNoted.insert(e).inserted {
                            FileHandle.standardError.write(
                                Data("\(e): has committed up to \(commit), not yet \(what); checking continuity on another endpoint or later\n".utf8))
                        }
                        next()
                        continue
                    }
                    if let difference = Self.discontinuity(first, overlap: overlap, base: anchor, baseChecksum: baseChecksum) {
                        throw CommandError(
                            "\(e)'s log entry \(difference): \(e) is not the cluster the archive in \(out) follows, or that cluster's log was replaced (a restore, say). Archive it into a new directory.")
                    }
                    entries.removeFirst()
                    say(overlap != nil ? "\(e) holds the archive's last entry \(archived) unchanged: continuing" : "\(e) holds the base backup's entry \(first.index) of term \(first.term): continuing")
                    overlap = nil
                    baseUnchecked = false
                    baseChecksum = nil
                }
                if let first = entries.first, first.index != last + 1 {
                    throw CommandError("\(e) answered from index \(first.index), not \(last + 1)")
                }
                try archive.append(entries, continuing: archived)
                if let newLast = entries.last {
                    last = newLast.index
                    archived = newLast.index
                    anchor = (newLast.index, newLast.term)
                    gapSince = nil
                }
                archivedSinceReport += entries.count
                if Date().timeIntervalSince(lastReport) >= 5 || (archivedSinceReport > 0 && commit <= last && Date().timeIntervalSince(lastReport) >= 1) {
                    say("archived \(archivedSinceReport) entries; at index \(last), the node's commit index is \(commit)")
                    archivedSinceReport = 0
                    lastReport = Date()
                }
                if entries.isEmpty || commit <= last { Thread.sleep(forTimeInterval: Double(intervalMs) / 1000) }
            case 410:
                // The node compacted past `from`. If its log starts right after the archive's
                // last entry, that entry's term says whether it continues the archive.
                let gone = Self.compactedAnswer(answer.body)
                if let gone, let anchor, last == anchor.index, gone.previousIndex == anchor.index {
                    guard gone.previousTerm == anchor.term else {
                        throw CommandError(
                            "\(e)'s log starts after entry \(anchor.index) of term \(gone.previousTerm), but the archive's entry \(anchor.index) is of term \(anchor.term): "
                                + "\(e) is not the cluster the archive in \(out) follows, or that cluster's log was replaced (a restore, say). Archive it into a new directory.")
                    }
                    gapSince = nil
                    guard overlap != nil || baseUnchecked else {
                        // Asked from the next index already: nothing to do but ask again later.
                        next()
                        continue
                    }
                    say("\(e)'s log starts after entry \(anchor.index), of term \(anchor.term) as in the archive: continuing")
                    overlap = nil
                    baseUnchecked = false
                    continue
                }
                // The entries after the archive's end are gone from this node; another
                // endpoint may still hold them.
                let first = gone.map { "\($0.firstIndex)" } ?? "an index it does not name"
                if gapSince == nil { gapSince = current }
                FileHandle.standardError.write(Data("\(e): its log starts at \(first), after the archive's end \(last): entries \(last + 1)… are gone from it\n".utf8))
                guard let since = gapSince, current - since + 1 >= endpoint.count else {
                    next()
                    continue
                }
                guard !noNewBase else {
                    throw CommandError(
                        "no endpoint holds the entries after the archive's end \(last) any more (\(e)'s log starts at \(first)): they were compacted while the archiver was away. "
                            + "Stopping (--no-new-base): run again without it to take a new base backup and go on, or archive into a new directory.")
                }
                say(
                    "gap: no endpoint holds the entries after the archive's end \(last) any more (\(e)'s log starts at \(first); they were compacted while the archiver was away): "
                        + "taking a new base backup to continue")
                let gapStart = last + 1
                let header = try takeBase(from: (try? chooseSource()) ?? e)
                let base = header.index
                if base >= gapStart {
                    say(
                        "new base backup at index \(base) (\(ArchiveDirectory.baseName(index: base))): the archive holds no entries \(gapStart)…\(base), so no point in time from \(gapStart) to \(base - 1) can be restored from it; "
                            + "a restore to index \(base) or later starts from this base. Archiving continues from index \(base + 1)")
                }
                last = max(last, base)
                overlap = nil
                anchor = nil
                baseUnchecked = false
                baseChecksum = nil
                anchorAtBase(header)
                gapSince = nil
            case 409, 503:
                next()
            default:
                throw CommandError("\(e): \(answer.status) \(String(decoding: answer.body, as: UTF8.self))")
            }
        }
        say("stopped; the archive ends at index \(last)")
    }

    /// How a node's entry differs from what the archive holds where it continues (nil: the same):
    /// the archive's last entry (`overlap`, compared whole), else the base backup's entry
    /// (`base`: index and term, and the content checksum when the base recorded it).
    static func discontinuity(_ first: ArchivedEntry, overlap: ArchivedEntry?, base: (index: UInt64, term: UInt64)?, baseChecksum: UInt32?) -> String? {
        if let expected = overlap {
            guard first != expected else { return nil }
            return "\(first.index) (term \(first.term)) is not the archive's (term \(expected.term)\(first.term == expected.term ? ", other content" : ""))"
        }
        guard let base else { return nil }
        guard first.index != base.index || first.term != base.term || baseChecksum.map({ $0 != first.contentChecksum }) == true else { return nil }
        return "\(first.index) is of term \(first.term)\(first.term == base.term ? " with other content" : ""), but the archive's base backup records its entry \(base.index) as of term \(base.term)"
    }

    /// The first index a node still serves and the entry before it, from its 410 answer to
    /// `GET /.banyan/log`; nil when the answer does not name them (a node from before they were).
    static func compactedAnswer(_ body: Data) -> (firstIndex: UInt64, previousIndex: UInt64, previousTerm: UInt64)? {
        guard let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any],
            let first = (object["first_index"] as? NSNumber)?.uint64Value, first > 0,
            let term = (object["previous_term"] as? NSNumber)?.uint64Value
        else { return nil }
        return (first, first - 1, term)
    }

    static func otherCluster(out: String, recorded: String, endpoint: String, reported: String) -> String {
        "the archive in \(out) follows cluster '\(recorded)' (its \(ArchiveDirectory.clusterFile) file), but \(endpoint) is of cluster '\(reported)': "
            + "archive that cluster into a new directory (or give this cluster's endpoints)"
    }
}

struct BackupVerify: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify", abstract: "Check a backup offline: every frame's checksum, the whole image, and that it decodes.")
    @Argument(help: "The backup file.") var file: String

    func run() throws {
        let started = Date()
        let reading = ProgressMeter()
        do {
            let loaded = try BackupFiles.load(file) { read, total in
                FileHandle.standardError.write(Data("read \(reading.describe(read, of: total))\n".utf8))
            }
            let created = Date(timeIntervalSince1970: Double(loaded.header.createdAt) / 1000)
            print(
                "\(file): OK. index \(loaded.header.index)\(loaded.header.indexTerm > 0 ? " (an entry of term \(loaded.header.indexTerm))" : ""), term \(loaded.header.term), cluster \(loaded.header.clusterID), node \(loaded.header.sourceNode), taken \(ISO8601DateFormatter().string(from: created)), \(loaded.namespaceCount) namespaces, \(loaded.fileBytes) bytes, checked in \(String(format: "%.2f", Date().timeIntervalSince(started))) s"
            )
        } catch let e as BackupError {
            throw CommandError("\(e.file ?? file) is damaged: \(e.reason) at byte offset \(e.offset)")
        }
    }
}

struct BackupLog: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "log",
        abstract: "List the entries of a --follow archive: index, term, time, namespace, kind, locations written, bytes.",
        discussion: """
            For finding the index of a bad write: list the writes to a location around the time it \
            went wrong (--path, --namespace, --since, --until), then restore with --to-index the \
            entry before it, or read the location as it was with GET /path.json?at=<index>. Times are \
            the leader's stamps; no-ops and membership changes have none.
            """)
    @Argument(help: "The archive directory (banyan backup --follow --out DIR).") var directory: String
    @Option(name: .long, help: "Only entries writing this location, inside it or above it (e.g. /users/ada).") var path: String?
    @Option(name: .long, help: "Only entries of this namespace ('' for the unnamed one).") var namespace: String?
    @Option(name: .long, help: "From this index on.") var since: UInt64 = 0
    @Option(name: .long, help: "Up to and including this index.") var until: UInt64?
    @Option(name: .long, help: "Stop after this many lines.") var limit: Int?

    func validate() throws {
        if let limit, limit < 1 { throw ValidationError("--limit must be 1 or more") }
        if let until, until < since { throw ValidationError("--until is before --since") }
    }

    func run() throws {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw CommandError("no archive directory at \(directory) (banyan backup --follow --out DIR makes one)")
        }
        let archive = ArchiveDirectory(directory)
        var printed = 0
        var scanned = 0
        var clock = ProgressClock()
        writeLine(ArchivedWrite.header)
        do {
            try archive.forEach(from: since) { entry in
                if let until, entry.index > until { return false }
                scanned += 1
                if clock.due() { FileHandle.standardError.write(Data("scanned \(scanned) entries, at index \(entry.index)\n".utf8)) }
                let write = ArchivedWrite(entry)
                if let namespace, write.namespace != namespace { return true }
                if let path, !write.touches(path) { return true }
                writeLine(write.line)
                printed += 1
                return limit.map { printed < $0 } ?? true
            }
        } catch let e as BackupError {
            throw CommandError("\(e.file ?? directory) is damaged: \(e.reason) at byte offset \(e.offset)")
        }
        FileHandle.standardError.write(Data("\(printed) of \(scanned) entries listed\n".utf8))
    }
}

struct Restore: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Seed the data directory of a new cluster's first node from a backup, optionally replayed to a point in time.",
        discussion: """
            Then start the node with `banyan serve --data-dir D --node-id N` (no --new-cluster): it \
            is a one-node cluster holding the restored data; add the other nodes with `banyan cluster \
            add`. The directory must be absent or empty.
            """)
    @Argument(help: "The backup file (a base backup from --follow, or one taken with `banyan backup`).") var file: String
    @Option(name: .long, help: "A --follow archive directory to replay after the backup.") var archive: String?
    @Option(name: .long, help: "Replay up to and including this log index.") var toIndex: UInt64?
    @Option(name: .long, help: "Replay the writes stamped at or before this time (ISO 8601, e.g. 2026-11-27T21:30:00Z, or ms since 1970).")
    var toTime: String?
    @Option(name: .long, help: "The data directory to seed.") var dataDir: String
    @Option(name: .long, help: "The restored node's id (its cluster's only member until others are added).") var nodeId: UInt64 = 1

    func validate() throws {
        if toIndex != nil && toTime != nil { throw ValidationError("--to-index and --to-time exclude each other") }
        // A target without --archive is allowed: the backup itself may be it (the restore checks).
        if let toTime, Self.parseTime(toTime) == nil {
            throw ValidationError("--to-time: expected ISO 8601 (2026-11-27T21:30:00Z) or ms since 1970")
        }
        guard nodeId > 0 else { throw ValidationError("--node-id must be 1 or more") }
    }

    static func parseTime(_ text: String) -> Int64? {
        if let ms = Int64(text) { return ms }
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let d = f.date(from: text) { return Int64((d.timeIntervalSince1970 * 1000).rounded()) }
        f.formatOptions = [.withInternetDateTime]
        return f.date(from: text).map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) }
    }

    func run() throws {
        var target = RestoreTarget.latest
        if let toIndex { target = .index(toIndex) }
        if let toTime {
            guard let ms = Self.parseTime(toTime) else { throw CommandError("--to-time: expected ISO 8601 (2026-11-27T21:30:00Z) or ms since 1970") }
            target = .time(ms)
        }
        let started = Date()
        do {
            let s = try BackupFiles.restore(backup: file, archive: archive, target: target, dataDirectory: dataDir, nodeID: nodeId) { line in
                FileHandle.standardError.write(Data((line + "\n").utf8))
            }
            let stamp = s.lastTimestamp > 0 ? ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: Double(s.lastTimestamp) / 1000)) : "none"
            print(
                "restored \(dataDir) for node \(nodeId): backup index \(s.backupIndex), \(s.replayed) archived entries replayed, at index \(s.restoredIndex) (last write stamped \(stamp)), term \(s.restoredTerm) (a new history: the source's terms + 2^32), \(s.namespaces) namespaces, in \(String(format: "%.2f", Date().timeIntervalSince(started))) s. Start it with: banyan serve --data-dir \(dataDir) --node-id \(nodeId)"
            )
        } catch let e as BackupError {
            // The damaged file: the backup, or one file of the archive.
            throw CommandError("\(e.file ?? file) is damaged: \(e.reason) at byte offset \(e.offset)")
        }
    }
}

/// SIGINT/SIGTERM set a flag a loop polls, or that `wait` blocks on. Install it once per
/// process: a second dispatch source for the same signal does not get it.
final class StopFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var set = false
    private let stopped = DispatchSemaphore(value: 0)
    private var sources: [any DispatchSourceSignal] = []
    var isSet: Bool { lock.withLock { set } }
    func installSignalHandlers() {
        for sig in [SIGINT, SIGTERM] {
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler { [weak self] in
                guard let self else { return }
                let first = self.lock.withLock { () -> Bool in
                    defer { self.set = true }
                    return !self.set
                }
                if first { self.stopped.signal() }
            }
            source.resume()
            sources.append(source)
        }
    }

    /// Blocks until SIGINT or SIGTERM arrived (at once if one already did).
    func wait() {
        stopped.wait()
        stopped.signal()
    }
}

/// A GET whose answer is written to a file as it arrives (URLSession's data delegate).
final class StreamingDownload: NSObject, URLSessionDataDelegate, @unchecked Sendable {
    private let handle: FileHandle
    private let report: (UInt64) -> Void
    private let done = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var status: Int?
    private var errorBody = Data()
    private var failure: (any Error)?
    private var writeError: (any Error)?
    private var bytes: UInt64 = 0
    private var lastReport = Date()

    private init(handle: FileHandle, report: @escaping (UInt64) -> Void) {
        self.handle = handle
        self.report = report
    }

    /// Returns the bytes written; throws on a transport error or a status other than 200.
    static func run(endpoint: String, path: String, into handle: FileHandle, report: @escaping (UInt64) -> Void) throws -> UInt64 {
        guard let url = URL(string: endpoint.hasPrefix("http") ? endpoint + path : "http://" + endpoint + path) else {
            throw CommandError("bad endpoint '\(endpoint)'")
        }
        var request = URLRequest(url: url, timeoutInterval: 120)
        if let token = try AdminClient.operatorToken() {
            AdminClient.warnIfTokenInClear(url)
            request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        }
        if url.scheme?.lowercased() == "https", let ca = TrustedCARequest.caFile {
            return try viaTrustedCA(url, ca: ca, endpoint: endpoint, request: request, into: handle, report: report)
        }
        let download = StreamingDownload(handle: handle, report: report)
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = 120
        configuration.timeoutIntervalForResource = 7 * 24 * 3600
        let session = URLSession(configuration: configuration, delegate: download, delegateQueue: nil)
        session.dataTask(with: request).resume()
        download.done.wait()
        session.finishTasksAndInvalidate()
        return try download.lock.withLock { () throws -> UInt64 in
            if let e = download.writeError { throw CommandError("cannot write the backup: \(e)") }
            if let e = download.failure { throw CommandError("\(endpoint): \(e.localizedDescription)") }
            guard let status = download.status else { throw CommandError("no answer from \(endpoint)") }
            guard status == 200 else { throw CommandError("\(endpoint): \(status) \(String(decoding: download.errorBody, as: UTF8.self))") }
            return download.bytes
        }
    }

    /// The same download through `TrustedCARequest` (`BANYAN_CA_FILE`), through `received`.
    private static func viaTrustedCA(
        _ url: URL, ca: String, endpoint: String, request: URLRequest, into handle: FileHandle, report: @escaping (UInt64) -> Void
    ) throws -> UInt64 {
        let state = StreamingDownload(handle: handle, report: report)
        let headers = (request.allHTTPHeaderFields ?? [:]).map { ($0.key, $0.value) }
        let answer = try TrustedCARequest.perform(url, method: "GET", headers: headers, body: nil, caFile: ca, timeout: .seconds(120)) { status, buffer in
            try state.lock.withLock { try state.received(Data(buffer.readableBytesView), status: status) }
        }
        return try state.lock.withLock { () throws -> UInt64 in
            guard answer.status == 200 else { throw CommandError("\(endpoint): \(answer.status) \(String(decoding: state.errorBody, as: UTF8.self))") }
            return state.bytes
        }
    }

    func urlSession(
        _ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
        completionHandler: @escaping (URLSession.ResponseDisposition) -> Void
    ) {
        lock.withLock { status = (response as? HTTPURLResponse)?.statusCode }
        completionHandler(.allow)
    }

    /// A part of the answer (called under `lock`): a 200's body goes to the file, with a
    /// progress report every 2 s; another status keeps 64 KiB of its body for the error.
    private func received(_ data: Data, status: Int?) throws {
        guard status == 200 else {
            if errorBody.count < 1 << 16 { errorBody.append(data) }
            return
        }
        try handle.write(contentsOf: data)
        bytes += UInt64(data.count)
        if Date().timeIntervalSince(lastReport) >= 2 {
            lastReport = Date()
            report(bytes)
        }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        lock.lock()
        defer { lock.unlock() }
        guard writeError == nil else { return }
        do {
            try received(data, status: status)
        } catch {
            writeError = error
            dataTask.cancel()
        }
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        lock.withLock { failure = error }
        done.signal()
    }
}
