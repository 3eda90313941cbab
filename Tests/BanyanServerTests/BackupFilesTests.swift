import BanyanNode
import BanyanOpLogFiles
import BanyanRaft
import BanyanServer
import BanyanStateMachine
import BanyanTree
import Foundation
import Logging
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
}
