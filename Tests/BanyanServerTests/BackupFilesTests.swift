import BanyanAuth
import BanyanBasics
import BanyanNode
import BanyanOpLogFiles
import BanyanOps
import BanyanRaft
@testable import BanyanServer
import BanyanStateMachine
import BanyanTree
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import Testing

/// Backup files, log archives and restores (docs/backup.md), against the state machine every
/// replica runs: a restore to an index or a time yields exactly the state a replica had there.
@Suite struct BackupFilesTests {
    /// Command `i` sets /items/k<i % 7> and /last, stamped at 1000 + 10 i ms; every 9th entry is a
    /// no-op (as a new leader's).
    static func entry(_ i: UInt64) -> ArchivedEntry {
        if i % 9 == 0 { return ArchivedEntry(index: i, term: 2, kind: .noop, payload: []) }
        let json = Array(#"{"n":\#(i),"s":"v\#(i)"}"#.utf8)
        let path = i % 2 == 0 ? "/items/k\(i % 7)" : "/last"
        let payload = CommandEnvelope(namespace: i % 3 == 0 ? "other" : "", session: 1, seq: i, timestamp: 1000 + 10 * Int64(i), command: .set(path: path, json: json))
            .encoded()
        return ArchivedEntry(index: i, term: 2, kind: .command, payload: payload)
    }

    static func machine(through index: UInt64) -> StateMachine {
        var m = StateMachine()
        for i in 1...index {
            let e = entry(i)
            if e.kind == .command { _ = m.apply(e.payload, index: i) } else { m.skip(index: i) }
        }
        return m
    }

    static func writeBackup(_ m: StateMachine, to path: String) throws {
        let encoder = BackupEncoder()
        var out = encoder.header(BackupHeader(clusterID: "t", sourceNode: 1, index: m.appliedIndex, term: 2, lastTimestamp: m.lastTimestamp, createdAt: 0))
        try m.writeImage { chunk in try encoder.add(chunk) { out += $0 } }
        out += try encoder.finish()
        try Data(out).write(to: URL(fileURLWithPath: path))
    }

    /// The state the restored directory starts with, as a node loads it.
    static func loadRestored(_ dir: String) throws -> (StateMachine, UInt64) {
        let storage = try NodeStorage(directory: dir, logger: Logger(label: "test"), progress: { _ in })
        let loaded = try storage.load(progress: { _ in })
        return (loaded.machine, loaded.persisted.hardState.commit)
    }

    func setUp(_ name: String) throws -> (dir: String, backup: String, archive: String) {
        let dir = try temporaryDirectory("backup-\(name)")
        let backup = dir + "/b.bkp"
        try Self.writeBackup(Self.machine(through: 20), to: backup)
        let archive = dir + "/arch"
        try FileManager.default.createDirectory(atPath: archive, withIntermediateDirectories: true)
        let a = ArchiveDirectory(archive)
        // Two appends, as the archiver makes them; entries before the backup are skipped.
        try a.append((5...30).map(Self.entry), continuing: 4)
        try a.append((31...50).map(Self.entry), continuing: 30)
        return (dir, backup, archive)
    }

    static let targets: [RestoreTarget] = [.index(20), .index(21), .index(36), .index(50), .latest, .time(1405), .time(1270)]

    @Test(arguments: targets)
    func restoreEqualsTheReplicaAtTheTarget(target: RestoreTarget) throws {
        let (dir, backup, archive) = try setUp("target")
        let data = dir + "/data"
        let summary = try BackupFiles.restore(backup: backup, archive: archive, target: target, dataDirectory: data, nodeID: 3) { _ in }
        var expected: UInt64 = 50
        switch target {
        case .index(let i): expected = i
        case .latest: break
        case .time(let t):
            // Up to the first command stamped after the time (no-ops go with what precedes them).
            expected = ((21...50).first { i in Self.entry(i).kind == .command && 1000 + 10 * Int64(i) > t } ?? 51) - 1
        }
        #expect(summary.restoredIndex == expected)
        let (m, commit) = try Self.loadRestored(data)
        #expect(commit == expected)
        #expect(m.image() == Self.machine(through: expected).image())
    }

    @Test func refusals() throws {
        let (dir, backup, archive) = try setUp("refusals")
        // A directory with state.
        let full = dir + "/full"
        try FileManager.default.createDirectory(atPath: full, withIntermediateDirectories: true)
        try Data("x".utf8).write(to: URL(fileURLWithPath: full + "/file"))
        #expect(throws: RestoreError.self) {
            _ = try BackupFiles.restore(backup: backup, archive: archive, target: .latest, dataDirectory: full, nodeID: 1) { _ in }
        }
        // A target before the backup, or beyond the archive.
        #expect(throws: RestoreError.self) {
            _ = try BackupFiles.restore(backup: backup, archive: archive, target: .index(10), dataDirectory: dir + "/a", nodeID: 1) { _ in }
        }
        #expect(throws: RestoreError.self) {
            _ = try BackupFiles.restore(backup: backup, archive: archive, target: .index(51), dataDirectory: dir + "/b", nodeID: 1) { _ in }
        }
        #expect(!FileManager.default.fileExists(atPath: dir + "/b"))
        // A time after the archive's last write: nothing says what came between.
        #expect(throws: RestoreError.self) {
            _ = try BackupFiles.restore(backup: backup, archive: archive, target: .time(1000 + 10 * 60), dataDirectory: dir + "/t", nodeID: 1) { _ in }
        }
        #expect(!FileManager.default.fileExists(atPath: dir + "/t"))
        // A gap the replay needs.
        let gapped = dir + "/gapped"
        try FileManager.default.createDirectory(atPath: gapped, withIntermediateDirectories: true)
        try ArchiveDirectory(gapped).append((21...30).map(Self.entry), continuing: 20)
        try ArchiveDirectory(gapped).append((33...40).map(Self.entry), continuing: 30)
        #expect(throws: RestoreError.self) {
            _ = try BackupFiles.restore(backup: backup, archive: gapped, target: .latest, dataDirectory: dir + "/c", nodeID: 1) { _ in }
        }
        // A target past the backup with no archive to reach it: said as such.
        do {
            _ = try BackupFiles.restore(backup: backup, archive: nil, target: .index(25), dataDirectory: dir + "/n", nodeID: 1) { _ in }
            Issue.record("restored to an index the backup does not reach")
        } catch let e as RestoreError {
            #expect(e.description.contains("no --archive was given"), "\(e)")
        }
        // A file that cannot be opened is not called damaged.
        do {
            _ = try BackupFiles.restore(backup: dir + "/absent.bkp", archive: nil, target: .latest, dataDirectory: dir + "/m", nodeID: 1) { _ in }
            Issue.record("restored from a file that does not exist")
        } catch let e as BackupFiles.UnreadableFile {
            #expect(e.description == "cannot open \(dir)/absent.bkp: No such file or directory", "\(e)")
        }
        // A damaged backup: the offset of the damaged frame.
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: backup)))
        bytes[bytes.count / 2] ^= 0xFF
        try Data(bytes).write(to: URL(fileURLWithPath: dir + "/damaged.bkp"))
        do {
            _ = try BackupFiles.restore(backup: dir + "/damaged.bkp", archive: nil, target: .latest, dataDirectory: dir + "/d", nodeID: 1) { _ in }
            Issue.record("a damaged backup was restored")
        } catch let e as BackupError {
            #expect(e.offset > 0 && Int(e.offset) <= bytes.count / 2)
        }
        #expect(!FileManager.default.fileExists(atPath: dir + "/d"))
    }

    /// Archives hold what the log held (password hashes, refresh and signing keys) unencrypted:
    /// their files are the owner's alone whatever the umask (022 here, which left them 0644).
    @Test func archiveFilesArePrivate() throws {
        let (dir, _, archive) = try setUp("modes")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try ArchiveDirectory(archive).recordEnd(50)
        try ArchiveDirectory(archive).recordCluster("c1")
        try ArchiveDirectory(archive).append((51...52).map(Self.entry), continuing: 50)
        let names = try FileManager.default.contentsOfDirectory(atPath: archive)
        #expect(names.count >= 3)
        for name in names {
            let mode = try #require(try FileManager.default.attributesOfItem(atPath: archive + "/" + name)[.posixPermissions] as? Int)
            #expect(mode & 0o077 == 0, "\(name) has mode \(String(mode, radix: 8))")
        }
    }

    @Test func anInterruptedAppendIsCutOnResume() throws {
        let (_, _, archive) = try setUp("resume")
        let a = ArchiveDirectory(archive)
        guard let last = try a.files().last else {
            Issue.record("no archive file")
            return
        }
        let path = archive + "/" + last.name
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        try handle.seekToEnd()
        var partial: [UInt8] = []
        Self.entry(51).append(to: &partial)
        try handle.write(contentsOf: Data(partial.prefix(partial.count - 3)))
        try handle.close()
        #expect(try a.recoverLastIndex() == 50)
        try a.append([Self.entry(51)], continuing: 50)
        var seen: [UInt64] = []
        try a.forEach(from: 45) { e in
            seen.append(e.index)
            return true
        }
        #expect(seen == Array(45...51))
    }

    /// After a gap (a new base backup), entries go to a new file, never appended to the old one
    /// (which would hide the gap inside a file and make it unreadable); a record cut short
    /// inside a file that is not the last is damage, not a torn tail.
    @Test func gapsStartNewFilesAndInnerCutsAreDamage() throws {
        let dir = try temporaryDirectory("backup-gap")
        let a = ArchiveDirectory(dir)
        try a.append((1...10).map(Self.entry), continuing: 0)
        // A base backup at 20 covers 11...20: the archiver continues at 21.
        try a.append((21...25).map(Self.entry), continuing: 10)
        #expect(try a.files().map(\.first) == [1, 21])
        #expect(try a.recoverLastIndex() == 25)
        var seen: [UInt64] = []
        try a.forEach(from: 21) { e in
            seen.append(e.index)
            return true
        }
        #expect(seen == Array(21...25))
        // Cut the first file's last record: reading through it is an error with an offset.
        let first = dir + "/" + ArchivedEntry.fileName(firstIndex: 1)
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: first)))
        try Data(bytes.dropLast(3)).write(to: URL(fileURLWithPath: first))
        #expect(throws: BackupError.self) { try a.forEach(from: 1) { _ in true } }
        // A file left half-created under its temporary name is ignored and removed.
        FileManager.default.createFile(atPath: dir + "/" + ArchivedEntry.fileName(firstIndex: 26) + ".tmp", contents: Data([1, 2]))
        #expect(try a.recoverLastIndex() == 25)
        #expect(!FileManager.default.fileExists(atPath: dir + "/" + ArchivedEntry.fileName(firstIndex: 26) + ".tmp"))
    }

    /// What a backup leaves out: the node-specific namespaces.
    @Test func backupImageLeavesOutNodeState() {
        var m = Self.machine(through: 12)
        let cluster = CommandEnvelope(namespace: "$cluster", session: 9, seq: 1, timestamp: 5000, command: .set(path: "/peers/1", json: Array(#""h:1""#.utf8)))
        _ = m.apply(cluster.encoded(), index: 13)
        #expect(m.namespaces["$cluster"] != nil)
        let b = BackupImage.forBackup(m)
        #expect(b.namespaces["$cluster"] == nil)
        #expect(b.appliedIndex == 13 && b.namespaces[""] == m.namespaces[""] && b.namespaces["other"] == m.namespaces["other"])
    }

    /// A restore from base + archive filters what it replayed as a backup does: a free-space
    /// alarm raised and a node address published inside the archive describe the source's
    /// nodes. Left in, the alarm of a node the new cluster does not have refused every write.
    @Test func restoreLeavesOutAlarmsAndClusterStateReplayedFromTheArchive() throws {
        let dir = try temporaryDirectory("backup-alarm")
        let backup = dir + "/b.bkp"
        try Self.writeBackup(Self.machine(through: 20), to: backup)
        let archive = dir + "/arch"
        try FileManager.default.createDirectory(atPath: archive, withIntermediateDirectories: true)
        let address = CommandEnvelope(namespace: "$cluster", session: 78, seq: 1, timestamp: 1215, command: .set(path: "/clients/7", json: Array(#""h7:9000""#.utf8)))
        let alarm = CommandEnvelope(namespace: StateMachine.alarmsNamespace, session: 77, seq: 1, timestamp: 1225, command: .spaceAlarm(node: 7, raised: true))
        var entries = (21...22).map(Self.entry)
        entries.append(ArchivedEntry(index: 23, term: 2, kind: .command, payload: address.encoded()))
        entries.append(ArchivedEntry(index: 24, term: 2, kind: .command, payload: alarm.encoded()))
        entries += (25...30).map(Self.entry)
        try ArchiveDirectory(archive).append(entries, continuing: 20)

        // What the source's replicas had at 30: the alarm raised, the address published, and
        // the writes after the alarm refused.
        var source = Self.machine(through: 20)
        for e in entries {
            if e.kind == .command { _ = source.apply(e.payload, index: e.index) } else { source.skip(index: e.index) }
        }
        #expect(source.spaceAlarms == [7] && source.namespaces["$cluster"] != nil)

        for target in [RestoreTarget.latest, .index(23), .index(24)] {
            let data = dir + "/data-\(target)".replacingOccurrences(of: " ", with: "-")
            _ = try BackupFiles.restore(backup: backup, archive: archive, target: target, dataDirectory: data, nodeID: 1) { _ in }
            var (m, _) = try Self.loadRestored(data)
            #expect(m.namespaces[StateMachine.alarmsNamespace] == nil, "\(target)")
            #expect(m.namespaces["$cluster"] == nil, "\(target)")
            #expect(m.spaceAlarms.isEmpty, "\(target)")
            // The restored node takes writes.
            let write = CommandEnvelope(namespace: "", session: 99, seq: 1, timestamp: 5000, command: .set(path: "/after", json: Array("1".utf8)))
            let applied = m.apply(write.encoded(), index: m.appliedIndex + 1)
            #expect(applied?.outcome == .ok, "\(target): \(String(describing: applied?.outcome))")
        }
        // Everything else is the source's state at the target.
        let (latest, _) = try Self.loadRestored(dir + "/data-the-end-of-the-archive")
        #expect(latest.image() == BackupImage.forBackup(source).image())
    }

    /// What docs/backup.md promises survives a restore, on a real node started on the restored
    /// directory: an account and its project's signing key (`$accounts`) sign the user in with
    /// the source's key, and the pending onDisconnect write of a connection the source served
    /// fires once the restored node's leader expires that connection's lease (20 s after it
    /// leads: the lease cannot be shortened by configuration).
    @Test(.timeLimit(.minutes(1)))
    func restoredNodeSignsInAndFiresPendingDisconnects() async throws {
        let dir = try temporaryDirectory("backup-live")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // The source's state, built with the commands its nodes apply: an account made by the
        // account service (password hashed as it hashes), the key it installed for the
        // project, a node's lease renewal, and a connection's presence with its onDisconnect.
        let project = NodeConfig().accounts.projectID
        let hash = try PasswordHasher(logN: 10, blockSize: 8, parallelism: 1).hash("correct horse", salt: Array(repeating: 7, count: PasswordHasher.saltBytes))
        let key = SigningKey(id: AccountService.newKeyID(), secret: Base64.encodeURL(Array(repeating: 9, count: 32)), time: 1000)
        let holder: UInt64 = 0xB0C4
        let commands: [(String, UInt64, Command)] = [
            (project, 50, .account(.create(AccountRecord(uid: "ada", email: "ada@banyan.test", passwordHash: hash, provider: "password", refreshKey: "r")))),
            (project, 51, .account(.installKey(key, rotate: false, retainMilliseconds: 0))),
            ("$leases", 900, .renewLease(holder: holder, node: 2)),
            ("presence", 11, .set(path: "/ada", json: Array(#""online""#.utf8))),
            ("presence", 11, .onDisconnectSet(path: "/ada", json: Array(#""offline""#.utf8), secret: 5, holder: holder)),
        ]
        var source = StateMachine()
        for (i, (namespace, session, command)) in commands.enumerated() {
            let envelope = CommandEnvelope(namespace: namespace, session: session, seq: UInt64(i + 1), timestamp: 1000 + Int64(i), command: command)
            let applied = source.apply(envelope.encoded(), index: UInt64(i + 1))
            #expect(applied?.outcome == .ok, "\(command): \(String(describing: applied?.outcome))")
        }
        #expect(source.queuedHolders[holder] == ["presence": 1])
        try Self.writeBackup(source, to: dir + "/b.bkp")
        _ = try BackupFiles.restore(backup: dir + "/b.bkp", archive: nil, target: .latest, dataDirectory: dir + "/data", nodeID: 1) { _ in }

        let node = try BanyanNode.start(config: ChaosTests.loopbackConfig(dir + "/data"), logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        func send(_ method: HTTPMethod, _ uri: String, _ body: String? = nil) async throws -> HTTPResult {
            let c = try await HTTPConnection.connect(host: "127.0.0.1", port: port, group: MultiThreadedEventLoopGroup.singleton)
            defer { c.close() }
            let headers = body == nil ? [] : [("Content-Type", "application/json")]
            return try await c.send(method, uri, headers: headers, body: body.map { Array($0.utf8) }, timeout: .seconds(5))
        }
        let started = Date()
        // Signing in checks the restored hash and signs with the restored key (its `kid`).
        var signIn: HTTPResult?
        while Date().timeIntervalSince(started) < 15 {
            signIn = try? await send(.POST, "/identitytoolkit.googleapis.com/v1/accounts:signInWithPassword", #"{"email":"ada@banyan.test","password":"correct horse"}"#)
            if signIn?.status == 200 { break }
            try await Task.sleep(nanoseconds: 100_000_000)
        }
        let answer = try #require(signIn)
        #expect(answer.status == 200, "\(answer.text)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(answer.body)) as? [String: Any])
        #expect(object["localId"] as? String == "ada")
        let token = try #require(object["idToken"] as? String)
        let kid = try JWT.decode(token).keyID
        #expect(kid == key.id, "the token was signed with \(kid ?? "no key"), not the restored \(key.id)")
        let wrong = try await send(.POST, "/identitytoolkit.googleapis.com/v1/accounts:signInWithPassword", #"{"email":"ada@banyan.test","password":"wrong"}"#)
        #expect(wrong.status == 400 && wrong.text.contains("INVALID_PASSWORD"), "\(wrong.text)")

        // The presence is still "online" (the write has not fired at the restore), then turns
        // "offline" when the lease of the source's node expires.
        let before = try await send(.GET, "/ada.json?ns=presence")
        #expect(before.text == #""online""#)
        var value = before.text
        while Date().timeIntervalSince(started) < 45 && value != #""offline""# {
            try await Task.sleep(nanoseconds: 250_000_000)
            value = (try? await send(.GET, "/ada.json?ns=presence"))?.text ?? value
        }
        #expect(value == #""offline""#, "the pending onDisconnect write never fired: \(value)")
        print(String(format: "restored node: the pending onDisconnect write fired %.1f s after the node started", Date().timeIntervalSince(started)))
    }

    /// `--data-dir d/` names the directory d: its staging directory is d's sibling, not a
    /// directory inside d that the final rename deleted.
    @Test func aTrailingSlashNamesTheSameDirectory() throws {
        let (dir, backup, archive) = try setUp("slash")
        let absent = dir + "/absent/"
        _ = try BackupFiles.restore(backup: backup, archive: archive, target: .latest, dataDirectory: absent, nodeID: 1) { _ in }
        #expect(try Self.loadRestored(dir + "/absent").0.appliedIndex == 50)
        let empty = dir + "/empty"
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: true)
        _ = try BackupFiles.restore(backup: backup, archive: archive, target: .index(30), dataDirectory: empty + "//", nodeID: 1) { _ in }
        #expect(try Self.loadRestored(empty).0.appliedIndex == 30)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir).allSatisfy { !$0.contains(".restoring-") })
        #expect(throws: RestoreError.self) {
            _ = try BackupFiles.restore(backup: backup, archive: archive, target: .latest, dataDirectory: "/", nodeID: 1) { _ in }
        }
    }

    /// Progress goes by time, not by bytes: with a zero interval every step reports, small
    /// files included (they once reported only past 64 MiB of backup or 256 MiB of image).
    @Test func progressIsReportedByTime() throws {
        let (dir, backup, archive) = try setUp("progress")
        var reads: [UInt64] = []
        _ = try BackupFiles.load(backup, reportEvery: 0) { read, _ in reads.append(read) }
        #expect(reads.count >= 2 && reads == reads.sorted())
        var silent = 0
        _ = try BackupFiles.load(backup) { _, _ in silent += 1 }
        #expect(silent == 0, "a small file read within the interval reports nothing")
        var lines: [String] = []
        _ = try BackupFiles.restore(backup: backup, archive: archive, target: .latest, dataDirectory: dir + "/data", nodeID: 1, reportEvery: 0) {
            lines.append($0)
        }
        #expect(lines.contains { $0.hasPrefix("backup: read") }, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("archive: replayed to index") }, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("data directory: wrote") }, "\(lines)")
        // Formatted (ProgressMeter): the backup's size of its total, and the replay's entries of
        // the 30 between the backup (20) and the archive's recorded end (50).
        #expect(lines.contains { $0.hasPrefix("backup: read ") && $0.contains(" of ") && $0.contains("%)") }, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("archive: replayed to index ") && $0.contains(" of 30 entries (") }, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("archive: replayed to index 50: 30 entries of 30 entries (100%)") }, "\(lines)")
    }

    /// Damage inside the archive names the archive's file and the offset in it, not the backup.
    @Test func archiveDamageNamesTheArchiveFile() throws {
        let (dir, backup, archive) = try setUp("archive-damage")
        let name = ArchivedEntry.fileName(firstIndex: 5)
        let path = archive + "/" + name
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        bytes[ArchivedEntry.fileMagic.count + 30] ^= 0x55
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        do {
            _ = try BackupFiles.restore(backup: backup, archive: archive, target: .latest, dataDirectory: dir + "/data", nodeID: 1) { _ in }
            Issue.record("a damaged archive was replayed")
        } catch let e as BackupError {
            #expect(e.file == path, "\(e)")
            #expect(e.offset == UInt64(ArchivedEntry.fileMagic.count), "\(e)")
            #expect(e.description.hasPrefix(path + ": "), "\(e)")
        }
        // A damaged backup names the backup.
        var damaged = [UInt8](try Data(contentsOf: URL(fileURLWithPath: backup)))
        damaged[damaged.count / 2] ^= 0xFF
        try Data(damaged).write(to: URL(fileURLWithPath: dir + "/damaged.bkp"))
        do {
            _ = try BackupFiles.load(dir + "/damaged.bkp")
            Issue.record("a damaged backup loaded")
        } catch let e as BackupError {
            #expect(e.file == dir + "/damaged.bkp")
        }
    }

    /// Input that once trapped on arithmetic: an archive file named for index 0 (`first - 1`),
    /// a record at the largest index followed by another (`index + 1`, reachable from a node's
    /// `/.banyan/log` answer), a backup claiming the largest index (`appliedIndex + 1`).
    @Test func extremeIndexesAreTypedErrors() throws {
        let dir = try temporaryDirectory("backup-extremes")
        let zero = dir + "/zero"
        try FileManager.default.createDirectory(atPath: zero, withIntermediateDirectories: true)
        try Data(ArchivedEntry.fileMagic).write(to: URL(fileURLWithPath: zero + "/" + ArchivedEntry.fileName(firstIndex: 0)))
        #expect(throws: BackupError.self) { _ = try ArchiveDirectory(zero).recoverLastIndex() }
        #expect(throws: BackupError.self) { try ArchiveDirectory(zero).forEach(from: 1) { _ in true } }

        var answer: [UInt8] = []
        ArchivedEntry(index: UInt64.max, term: 1, kind: .noop, payload: []).append(to: &answer)
        ArchivedEntry(index: 0, term: 1, kind: .noop, payload: []).append(to: &answer)
        #expect(throws: BackupError.self) { _ = try ArchivedEntry.parse(answer) }
        var single: [UInt8] = []
        ArchivedEntry(index: UInt64.max, term: 1, kind: .noop, payload: []).append(to: &single)
        #expect(try ArchivedEntry.parse(single).entries.map(\.index) == [UInt64.max])
        // Appending after the largest index starts a new file instead of adding one to it.
        let top = dir + "/top"
        try FileManager.default.createDirectory(atPath: top, withIntermediateDirectories: true)
        try ArchiveDirectory(top).append([ArchivedEntry(index: UInt64.max, term: 1, kind: .noop, payload: [])], continuing: UInt64.max - 1)
        try ArchiveDirectory(top).append([ArchivedEntry(index: 5, term: 1, kind: .noop, payload: [])], continuing: UInt64.max)

        #expect(throws: RestoreError.self) { _ = try RestoreReplay(machine: StateMachine(appliedIndex: UInt64.max), term: 1, target: .latest) }
    }

    /// Each append records the archive's last index (`archive-end`); a restore whose replay
    /// ends before it (a log file deleted, or cut at a record boundary, which the records alone
    /// cannot show) is refused, naming the missing entries, and writes nothing.
    @Test func replayMustReachTheRecordedEnd() throws {
        let (dir, backup, archive) = try setUp("recorded-end")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let a = ArchiveDirectory(archive)
        #expect(try a.recordedEnd() == 50)
        // 51… in a file of its own (appended as after a gap), then that file is lost.
        try a.append((51...60).map(Self.entry), continuing: 49)
        #expect(try a.recordedEnd() == 60)
        let whole = try BackupFiles.restore(backup: backup, archive: archive, target: .latest, dataDirectory: dir + "/whole", nodeID: 1) { _ in }
        #expect(whole.restoredIndex == 60)
        try FileManager.default.removeItem(atPath: archive + "/" + ArchivedEntry.fileName(firstIndex: 51))
        for target in [RestoreTarget.latest, .index(55), .time(1_000_000)] {
            do {
                _ = try BackupFiles.restore(backup: backup, archive: archive, target: target, dataDirectory: dir + "/data", nodeID: 1) { _ in }
                Issue.record("\(target): restored without entries 51…60")
            } catch let e as RestoreError {
                #expect(e.description.contains("records its last entry as index 60") && e.description.contains("entries 51…60 are missing"), "\(target): \(e)")
            }
            #expect(!FileManager.default.fileExists(atPath: dir + "/data"), "nothing was written")
        }
        // A target the remaining files reach is restored.
        #expect(try BackupFiles.restore(backup: backup, archive: archive, target: .index(45), dataDirectory: dir + "/early", nodeID: 1) { _ in }.restoredIndex == 45)
        // Cut at a record boundary: every record left is whole, the end record says more.
        var kept = ArchivedEntry.fileMagic
        for e in (5...40).map(Self.entry) { e.append(to: &kept) }
        let file = archive + "/" + ArchivedEntry.fileName(firstIndex: 5)
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: file))
        try handle.truncate(atOffset: UInt64(kept.count))
        try handle.close()
        #expect(throws: RestoreError("the archive in \(archive) records its last entry as index 60 (its archive-end file), but its files end at index 40: entries 41…60 are missing (a log file deleted, moved or cut short). Restore those files, or restore with --to-index 40 to accept that point")) {
            _ = try BackupFiles.restore(backup: backup, archive: archive, target: .latest, dataDirectory: dir + "/data", nodeID: 1) { _ in }
        }
        // An end record that is not an index is damage, named as such.
        try Data("sixty\n".utf8).write(to: URL(fileURLWithPath: archive + "/" + ArchiveDirectory.endFile))
        #expect(throws: BackupError.self) { _ = try a.recordedEnd() }
        // An archive from before the record (none): the files alone decide, as before.
        try FileManager.default.removeItem(atPath: archive + "/" + ArchiveDirectory.endFile)
        #expect(try BackupFiles.restore(backup: backup, archive: archive, target: .latest, dataDirectory: dir + "/unrecorded", nodeID: 1) { _ in }.restoredIndex == 40)
    }

    /// Progress lines: sizes in binary units, entries grouped, the share, rate and time left
    /// (the clock injected, so the figures are exact).
    @Test func progressLines() {
        let second: UInt64 = 1_000_000_000
        let bytes = ProgressMeter(started: 10 * second)
        #expect(bytes.describe(0, now: 10 * second) == "0 B")
        #expect(bytes.describe(512, now: 10 * second) == "512 B")
        #expect(bytes.describe(3 << 20, of: 12 << 20, now: 12 * second) == "3.0 MiB of 12.0 MiB (25%), 1.5 MiB/s, about 6.0 s left")
        #expect(bytes.describe(5 << 30, now: 20 * second) == "5.0 GiB, 512.0 MiB/s")
        #expect(bytes.describe(12 << 20, of: 12 << 20, now: 14 * second) == "12.0 MiB of 12.0 MiB (100%), 3.0 MiB/s")
        #expect(bytes.describe(14 << 20, of: 12 << 20, now: 14 * second) == "14.0 MiB of 12.0 MiB (100%), 3.5 MiB/s")
        #expect(bytes.describe(10, of: 0, now: 11 * second) == "10 B, 10 B/s", "a zero total is no total")
        let entries = ProgressMeter(unit: .entries, started: 0)
        #expect(entries.describe(1, now: 0) == "1 entry")
        #expect(entries.describe(12_345, of: 1_234_567, now: 5 * second) == "12,345 entries of 1,234,567 entries (0%), 2,469 entries/s, about 8 min 15 s left")
        #expect(ProgressMeter.bytes(1023) == "1023 B" && ProgressMeter.bytes(1024) == "1.0 KiB" && ProgressMeter.bytes(3 * 1_099_511_627_776) == "3.0 TiB")
        #expect(ProgressMeter.bytes(-1) == "0 B" && ProgressMeter.bytes(.infinity) == "0 B")
        #expect(ProgressMeter.grouped(0) == "0" && ProgressMeter.grouped(999) == "999" && ProgressMeter.grouped(1000) == "1,000" && ProgressMeter.grouped(UInt64.max) == "18,446,744,073,709,551,615")
        #expect(ProgressMeter.duration(0.4) == "0.4 s" && ProgressMeter.duration(42) == "42 s" && ProgressMeter.duration(185) == "3 min 05 s" && ProgressMeter.duration(7620) == "2 h 07 min")
        #expect(ProgressMeter.duration(.nan) == "?" && ProgressMeter.duration(1e12) == "a very long time")
    }

    /// A backup just below the largest index is a state a replay may start from, but an archive
    /// whose replay ends at the largest index would seed a node that cannot append its first
    /// entry: the end of the replay is checked too, and nothing is written.
    @Test func replayEndingAtTheLargestIndexIsRefused() throws {
        var replay = try RestoreReplay(machine: StateMachine(appliedIndex: UInt64.max - 1), term: 1, target: .latest)
        #expect(try replay.apply(ArchivedEntry(index: UInt64.max, term: 1, kind: .noop, payload: [])))
        #expect(replay.machine.appliedIndex == UInt64.max)
        #expect(throws: RestoreError.self) { try replay.checkEnded() }
        var indexed = try RestoreReplay(machine: StateMachine(appliedIndex: UInt64.max - 1), term: 1, target: .index(UInt64.max))
        _ = try indexed.apply(ArchivedEntry(index: UInt64.max, term: 1, kind: .noop, payload: []))
        #expect(throws: RestoreError.self) { try indexed.checkEnded() }

        // The same through `banyan restore`'s path: a forged backup and archive.
        let dir = try temporaryDirectory("backup-forged-end")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try Self.writeBackup(StateMachine(appliedIndex: UInt64.max - 1), to: dir + "/b.bkp")
        let archive = dir + "/arch"
        try FileManager.default.createDirectory(atPath: archive, withIntermediateDirectories: true)
        try ArchiveDirectory(archive).append([ArchivedEntry(index: UInt64.max, term: 2, kind: .noop, payload: [])], continuing: UInt64.max - 1)
        do {
            _ = try BackupFiles.restore(backup: dir + "/b.bkp", archive: archive, target: .latest, dataDirectory: dir + "/data", nodeID: 1) { _ in }
            Issue.record("a replay ending at the largest index was restored")
        } catch let e as RestoreError {
            #expect(e.description.contains("largest possible"), "\(e)")
        }
        #expect(!FileManager.default.fileExists(atPath: dir + "/data"), "nothing was written")
        // One below it is a state like any other.
        let fine = try RestoreReplay(machine: StateMachine(appliedIndex: UInt64.max - 1), term: 1, target: .latest)
        try fine.checkEnded()
    }

    /// A restored cluster starts its terms 2^32 above the source's: its (index, term) pairs
    /// never equal the source's, which is what `backup --follow` checks a 410 against.
    @Test func restoredTermStartsANewHistory() throws {
        let (dir, backup, archive) = try setUp("restored-term")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let summary = try BackupFiles.restore(backup: backup, archive: archive, target: .latest, dataDirectory: dir + "/data", nodeID: 1) { _ in }
        #expect(summary.restoredTerm == 2 + (1 << 32))
        let storage = try NodeStorage(directory: dir + "/data", logger: Logger(label: "test"), progress: { _ in })
        let loaded = try storage.load(progress: { _ in })
        #expect(loaded.persisted.hardState.term == 2 + (1 << 32) && loaded.persisted.snapshot.term == 2 + (1 << 32))
        let huge = try RestoreReplay(machine: StateMachine(appliedIndex: 5), term: UInt64.max - 7, target: .latest)
        #expect(throws: RestoreError.self) { _ = try huge.restoredTerm() }
    }

    /// `backup log`'s times: milliseconds exact (from the integer), before 1970 too, and any
    /// stamp a forged entry may carry formats without trapping.
    @Test func listedTimesAreExact() {
        #expect(ArchivedWrite.iso8601(0) == "1970-01-01T00:00:00.000Z")
        #expect(ArchivedWrite.iso8601(1_795_000_000_123) == "2026-11-18T11:06:40.123Z")
        #expect(ArchivedWrite.iso8601(1_795_000_000_999) == "2026-11-18T11:06:40.999Z")
        #expect(ArchivedWrite.iso8601(1_795_000_000_001) == "2026-11-18T11:06:40.001Z")
        #expect(ArchivedWrite.iso8601(-1) == "1969-12-31T23:59:59.999Z")
        for extreme in [Int64.max, Int64.min, Int64.max / 1000, Int64.min / 1000] {
            #expect(ArchivedWrite.iso8601(extreme).hasSuffix("Z"))
        }
    }

    /// `banyan backup log`: each archived entry's index, time, namespace, kind and locations,
    /// and which entries write at, inside or above a location.
    @Test func archivedWritesDescribeEntries() throws {
        let (_, _, archive) = try setUp("listing")
        var rows: [ArchivedWrite] = []
        try ArchiveDirectory(archive).forEach(from: 0) { e in
            rows.append(ArchivedWrite(e))
            return true
        }
        #expect(rows.map(\.index) == Array(5...50))
        let ten = try #require(rows.first { $0.index == 10 })
        #expect(ten.kind == "set" && ten.paths == ["/items/k3"] && ten.timestamp == 1100 && ten.namespace == "" && ten.bytes > 0)
        #expect(ten.line.hasPrefix("10\t2\t1970-01-01T00:00:01.100Z\t(default)\tset\t/items/k3\t"), "\(ten.line)")
        let nine = try #require(rows.first { $0.index == 9 })
        #expect(nine.kind == "no-op" && nine.timestamp == nil && nine.paths.isEmpty && !nine.touches("/"))
        #expect(rows.filter { $0.touches("/items") }.allSatisfy { $0.index % 2 == 0 })
        #expect(rows.filter { $0.touches("/items/k3/deeper") }.map(\.index) == rows.filter { $0.paths == ["/items/k3"] }.map(\.index))
        #expect(rows.filter { $0.touches("/last") }.allSatisfy { $0.index % 2 == 1 })

        let update = CommandEnvelope(
            namespace: "app", session: 1, seq: 1, timestamp: 7, command: .update(path: "/a/", entries: [.init(path: "b/c", json: Array("1".utf8)), .init(path: "d", json: Array("22".utf8))]))
        let u = ArchivedWrite(ArchivedEntry(index: 3, term: 1, kind: .command, payload: update.encoded()))
        #expect(u.kind == "update" && u.paths == ["/a/b/c", "/a/d"] && u.bytes == 3 && u.namespace == "app")
        #expect(u.touches("/a/b") && u.touches("/a/b/c/e") && u.touches("/") && u.touches("a/d/") && !u.touches("/a/e") && !u.touches("/b"))
        let alarm = CommandEnvelope(namespace: StateMachine.alarmsNamespace, session: 1, seq: 2, timestamp: 8, command: .spaceAlarm(node: 4, raised: true))
        #expect(ArchivedWrite(ArchivedEntry(index: 4, term: 1, kind: .command, payload: alarm.encoded())).kind == "space-alarm-raised-node-4")
        #expect(ArchivedWrite(ArchivedEntry(index: 5, term: 1, kind: .command, payload: [99, 1, 2])).kind == "undecodable")
    }
}
