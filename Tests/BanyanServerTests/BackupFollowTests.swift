import BanyanOpLogFiles
@testable import BanyanServer
import Foundation
import Logging
import Testing

/// `banyan backup --follow` keeps an archive one cluster's, and `banyan backup log` lists what it
/// holds (docs/backup.md): the real command against in-process nodes.
@Suite(.serialized) struct BackupFollowTests {
    /// Runs `banyan args…` off the test's thread pool: exit status and output.
    static func banyan(_ args: [String], seconds: Double = 60) async throws -> (status: Int32, output: String) {
        try await Task.detached { try RotationAndRollTests.run(args, seconds: seconds) }.value
    }

    /// A single node of cluster `cluster` with `writes` writes to /v (and its data directory).
    static func node(_ name: String, cluster: String, writes: Int, configure: (inout NodeConfig) -> Void = { _ in }) async throws -> (BanyanNode, Int, String) {
        let dir = try temporaryDirectory("follow-\(name)")
        var c = singleNodeConfig(dir)
        c.clusterID = cluster
        configure(&c)
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        let port = clientPort(node)
        let ready = await eventually({ ((try? httpExchange(port: port, "PUT", "/v.json?auth=owner", body: "0"))?.status ?? 0) == 200 }, seconds: 30)
        #expect(ready)
        try write(port, writes, from: 1)
        return (node, port, dir)
    }

    static func write(_ port: Int, _ count: Int, from first: Int) throws {
        for k in first..<(first + count) {
            #expect(try httpExchange(port: port, "PUT", "/v.json?auth=owner", body: "\(k)").status == 200)
        }
    }

    static func follow(_ archive: String, port: Int, _ extra: [String] = []) async throws -> (status: Int32, output: String) {
        try await banyan(["backup", "--follow", "--out", archive, "--seconds", "2", "--interval-ms", "100", "--endpoint", "127.0.0.1:\(port)"] + extra)
    }

    /// A node's status fields, as numbers.
    static func status(_ port: Int) -> [String: Any] {
        guard let (code, body) = try? httpExchange(port: port, "GET", "/.banyan/status"), code == 200 else { return [:] }
        return (try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any]) ?? [:]
    }

    static func number(_ status: [String: Any], _ key: String) -> UInt64? { (status[key] as? NSNumber)?.uint64Value }

    static func bases(_ archive: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: archive).filter { $0.hasPrefix("base-") }.sorted()
    }

    @Test("a 410 is checked against the archive's last entry: a node whose log starts right after it continues the archive with no new base backup; across a gap a new base backup is taken and archiving goes on, saying which points cannot be restored (--no-new-base stops instead); a restored cluster (its terms 2^32 above) is refused even where its log starts right after the archive's end")
    func compactedNodes() async throws {
        let scratch = try temporaryDirectory("follow-compacted")
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let archive = scratch + "/arch"
        // A snapshot after every entry; compacted entries are kept for archivers until the node
        // restarts (a restarted node keeps none), so restarts decide where its log starts.
        let compacting: (inout NodeConfig) -> Void = { c in c.raft.snapshotEntries = 1 }
        var (delta, port, deltaDir) = try await Self.node("delta", cluster: "delta", writes: 3, configure: compacting)
        defer {
            delta.shutdown()
            try? FileManager.default.removeItem(atPath: deltaDir)
        }
        func restart(_ configure: (inout NodeConfig) -> Void) async throws {
            delta.shutdown()
            var c = singleNodeConfig(deltaDir)
            c.clusterID = "delta"
            configure(&c)
            delta = try BanyanNode.start(config: c, logger: Logger(label: "test"))
            port = clientPort(delta)
            let p = port
            #expect(await eventually({ ((try? httpExchange(port: p, "GET", "/.banyan/ready"))?.status ?? 0) == 200 }, seconds: 30))
        }
        let base = try await Self.follow(archive, port: port)
        #expect(base.status == 0, "\(base.output)")
        // Entries after the base, compacted at once and served from what the node keeps.
        let baseIndex = try #require(try Self.bases(archive).first.flatMap { UInt64($0.dropFirst(5).dropLast(4)) })
        try Self.write(port, 4, from: 10)
        let first = try await Self.follow(archive, port: port)
        #expect(first.status == 0, "\(first.output)")
        // The archive as an archiver that stopped at the node's snapshot index leaves it (the
        // node's lease renewals keep committing, so its snapshot may trail the archive's end by
        // an entry or two): cut after that entry, its end record with it.
        var snapshot: UInt64 = 0
        #expect(await eventually({ snapshot = Self.number(Self.status(port), "snapshot_index") ?? 0; return snapshot > baseIndex }, seconds: 30))
        let end = snapshot
        let archived = try ArchiveDirectory(archive).recoverLastIndex()
        #expect(archived >= end, "the archive holds the snapshot's entry: \(first.output)")
        let file = try #require(try ArchiveDirectory(archive).files().last { $0.first <= end })
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: archive + "/" + file.name)))
        var kept = ArchivedEntry.fileMagic
        for e in try ArchivedEntry.parse(bytes, from: ArchivedEntry.fileMagic.count).entries where e.index <= end { e.append(to: &kept) }
        for later in try ArchiveDirectory(archive).files() where later.first > end { try FileManager.default.removeItem(atPath: archive + "/" + later.name) }
        try Data(kept).write(to: URL(fileURLWithPath: archive + "/" + file.name))
        try Data("\(end)\n".utf8).write(to: URL(fileURLWithPath: archive + "/" + ArchiveDirectory.endFile))
        let last = try ArchiveDirectory(archive).recoverLast()
        #expect(last.index == end && last.entry != nil, "the archive ends at the node's snapshot")
        let basesBefore = try Self.bases(archive)
        #expect(basesBefore.count == 1)

        // Restarted (keeping nothing compacted, snapshots rare): its log starts at end + 1, and
        // its 410 names entry `end` and its term, which is the archive's. Archiving continues
        // with no new base backup.
        try await restart { c in c.history.retainedBytes = 0 }
        let resumed = try await Self.follow(archive, port: port)
        print("resumed on a node whose log starts after the archive's end: \(resumed.output)")
        #expect(resumed.status == 0, "\(resumed.output)")
        #expect(resumed.output.contains("log starts after entry \(end), of term \(last.entry?.term ?? 0) as in the archive: continuing"), "\(resumed.output)")
        #expect(try Self.bases(archive) == basesBefore, "no new base backup: \(resumed.output)")
        let end2 = try ArchiveDirectory(archive).recoverLastIndex()
        #expect(end2 > end, "the restarted node's entries were archived: \(resumed.output)")

        // A cluster restored from this archive, under the same cluster id: its log starts right
        // after the archive's last entry too, but its term there is not the archive's.
        let restoredData = scratch + "/restored"
        let restored = try await Self.banyan(["restore", archive + "/" + (basesBefore.first ?? ""), "--archive", archive, "--data-dir", restoredData])
        #expect(restored.status == 0 && restored.output.contains("at index \(end2) "), "\(restored.output)")
        var r = singleNodeConfig(scratch)
        r.dataDirectory = restoredData
        r.clusterID = "delta"
        r.history.retainedBytes = 0
        let phoenix = try BanyanNode.start(config: r, logger: Logger(label: "test"))
        defer { phoenix.shutdown() }
        let phoenixPort = clientPort(phoenix)
        #expect(await eventually({ ((try? httpExchange(port: phoenixPort, "PUT", "/p.json?auth=owner", body: "1"))?.status ?? 0) == 200 }, seconds: 30))
        let filesBefore = try FileManager.default.contentsOfDirectory(atPath: archive).sorted()
        let impostor = try await Self.follow(archive, port: phoenixPort)
        print("a restored cluster: \(impostor.output.split(separator: "\n").last ?? "")")
        #expect(impostor.status != 0 && impostor.output.contains("log starts after entry \(end2) of term") && impostor.output.contains("is not the cluster the archive"), "\(impostor.output)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: archive).sorted() == filesBefore, "nothing was appended")
        #expect(try ArchiveDirectory(archive).recoverLastIndex() == end2)

        // More writes while no archiver runs, then a restart that compacts them all and keeps
        // none: entries end2+1… are gone from the node.
        try Self.write(port, 3, from: 100)
        try await restart { c in
            compacting(&c)
            c.history.retainedBytes = 0
        }
        var later: UInt64 = 0
        #expect(await eventually({ later = Self.number(Self.status(port), "snapshot_index") ?? 0; return later > end2 + 1 }, seconds: 30))
        // The gap exists; snapshots rare again from here on, so the node does not compact past the
        // new base between the archiver taking it and asking for what follows it (with a snapshot
        // after every entry and nothing retained, lease renewals alone could: a third base, seen
        // once on a loaded machine).
        try await restart { c in c.history.retainedBytes = 0 }
        let files = try FileManager.default.contentsOfDirectory(atPath: archive).sorted()
        let stopped = try await Self.follow(archive, port: port, ["--no-new-base"])
        print("a gap with --no-new-base: \(stopped.output.split(separator: "\n").last ?? "")")
        #expect(stopped.status != 0 && stopped.output.contains("--no-new-base") && stopped.output.contains("after the archive's end \(end2)"), "\(stopped.output)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: archive).sorted() == files, "nothing was written")
        let continued = try await Self.follow(archive, port: port)
        print("a gap: \(continued.output)")
        #expect(continued.status == 0, "\(continued.output)")
        #expect(continued.output.contains("gap: no endpoint holds the entries after the archive's end \(end2)") && continued.output.contains("taking a new base backup to continue"), "\(continued.output)")
        // The new base is at the node's commit index when it was taken: `later` or past it
        // (the node's lease renewals commit entries of their own).
        let basesAfter = try Self.bases(archive)
        let newBase = try #require(basesAfter.last.flatMap { UInt64($0.dropFirst(5).dropLast(4)) })
        #expect(basesAfter.count == 2 && newBase >= later, "\(basesAfter)")
        #expect(
            continued.output.contains("new base backup at index \(newBase) (\(ArchiveDirectory.baseName(index: newBase))): the archive holds no entries \(end2 + 1)…\(newBase)")
                && continued.output.contains("Archiving continues from index \(newBase + 1)"), "\(continued.output)")
        // It went on after the base until --seconds ended it.
        #expect(continued.output.contains("stopped; the archive ends at index "), "\(continued.output)")
        // A restore from the new base (and what was archived after it) works.
        let fromNew = try await Self.banyan(["restore", archive + "/" + ArchiveDirectory.baseName(index: newBase), "--archive", archive, "--data-dir", scratch + "/from-new"])
        #expect(fromNew.status == 0 && fromNew.output.contains("backup index \(newBase),"), "\(fromNew.output)")
    }

    @Test("--follow records its cluster, resumes only where the node holds the archive's last entry unchanged, and refuses another cluster (by id, or by its log under the same id); backup log lists the writes")
    func followStaysOnOneCluster() async throws {
        let scratch = try temporaryDirectory("follow-archive")
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let archive = scratch + "/arch"
        let (alpha, alphaPort, alphaDir) = try await Self.node("alpha", cluster: "alpha", writes: 3)
        defer {
            alpha.shutdown()
            try? FileManager.default.removeItem(atPath: alphaDir)
        }
        // A base backup, then entries, then a resume that checks continuity.
        let first = try await Self.follow(archive, port: alphaPort)
        #expect(first.status == 0, "\(first.output)")
        #expect(try ArchiveDirectory(archive).recordedCluster() == "alpha")
        try Self.write(alphaPort, 5, from: 10)
        let second = try await Self.follow(archive, port: alphaPort)
        #expect(second.status == 0, "\(second.output)")
        let archived = try ArchiveDirectory(archive).recoverLastIndex()
        #expect(archived > 0, "\(second.output)")
        try Self.write(alphaPort, 3, from: 20)
        let third = try await Self.follow(archive, port: alphaPort)
        #expect(third.status == 0 && third.output.contains("holds the archive's last entry \(archived) unchanged"), "\(third.output)")

        // Another cluster id: refused before anything is taken from it.
        let (beta, betaPort, betaDir) = try await Self.node("beta", cluster: "beta", writes: 3)
        defer {
            beta.shutdown()
            try? FileManager.default.removeItem(atPath: betaDir)
        }
        let before = try FileManager.default.contentsOfDirectory(atPath: archive).sorted()
        let refused = try await Self.follow(archive, port: betaPort)
        print("another cluster id: \(refused.output.split(separator: "\n").last ?? "")")
        #expect(refused.status != 0 && refused.output.contains("follows cluster 'alpha'") && refused.output.contains("cluster 'beta'"), "\(refused.output)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: archive).sorted() == before, "nothing was written")

        // The same cluster id, but another cluster's log: its entry at the archive's last index differs.
        let lastNow = try ArchiveDirectory(archive).recoverLastIndex()
        let (impostor, impostorPort, impostorDir) = try await Self.node("impostor", cluster: "alpha", writes: Int(lastNow) + 5)
        defer {
            impostor.shutdown()
            try? FileManager.default.removeItem(atPath: impostorDir)
        }
        let diverged = try await Self.follow(archive, port: impostorPort)
        print("the same id, another log: \(diverged.output.split(separator: "\n").last ?? "")")
        #expect(diverged.status != 0 && diverged.output.contains("is not the archive's"), "\(diverged.output)")
        #expect(try ArchiveDirectory(archive).recoverLastIndex() == lastNow, "nothing was appended")

        // The listing: every write to /v, with its index and time; --path filters.
        let listed = try await Self.banyan(["backup", "log", archive, "--path", "/v"])
        print(listed.output)
        #expect(listed.status == 0, "\(listed.output)")
        let rows = listed.output.split(separator: "\n").filter { $0.contains("\tset\t/v\t") }
        #expect(rows.count == 8, "\(listed.output)")
        let none = try await Self.banyan(["backup", "log", archive, "--path", "/elsewhere"])
        #expect(none.status == 0 && !none.output.contains("\tset\t"), "\(none.output)")
    }

    @Test("an archive whose newest point is a base backup (no entries after it) resumes only on a node whose entry at the base's index has the term and content the base recorded: another cluster under the same id is refused, the source continues")
    func baseOnlyArchiveChecksTheBaseEntry() async throws {
        let scratch = try temporaryDirectory("follow-base-only")
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let archive = scratch + "/arch"
        let (gamma, gammaPort, gammaDir) = try await Self.node("gamma", cluster: "gamma", writes: 3)
        defer {
            gamma.shutdown()
            try? FileManager.default.removeItem(atPath: gammaDir)
        }
        // A base backup and nothing after it (no writes while it follows).
        let first = try await Self.follow(archive, port: gammaPort)
        #expect(first.status == 0, "\(first.output)")
        let bases = try Self.bases(archive)
        #expect(bases.count == 1, "\(bases)")
        let header = try BackupFiles.readHeader(archive + "/" + (bases.first ?? ""))
        #expect(header.indexTerm > 0 && header.indexEntryChecksum != nil, "the base records its entry: \(header)")
        #expect(try ArchiveDirectory(archive).recoverLastIndex() < header.index, "no entries after the base")

        // Another single-node cluster under the same id: the same terms, other commands.
        let (impostor, impostorPort, impostorDir) = try await Self.node("gamma-impostor", cluster: "gamma", writes: Int(header.index) + 5)
        defer {
            impostor.shutdown()
            try? FileManager.default.removeItem(atPath: impostorDir)
        }
        let refused = try await Self.follow(archive, port: impostorPort)
        print("a base-only archive on another log: \(refused.output.split(separator: "\n").last ?? "")")
        #expect(refused.status != 0 && refused.output.contains("base backup records its entry \(header.index)"), "\(refused.output)")
        #expect(try ArchiveDirectory(archive).recoverLastIndex() < header.index, "nothing was appended")

        // The source itself continues from the base.
        try Self.write(gammaPort, 4, from: 30)
        let resumed = try await Self.follow(archive, port: gammaPort)
        #expect(resumed.status == 0 && resumed.output.contains("holds the base backup's entry \(header.index) of term \(header.indexTerm): continuing"), "\(resumed.output)")
        #expect(try ArchiveDirectory(archive).recoverLastIndex() >= header.index + 4, "\(resumed.output)")
    }
}
