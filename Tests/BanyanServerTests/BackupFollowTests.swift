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

    /// Waits (at most 30 s) until the node's snapshot covers everything it committed: its log
    /// then starts right after its commit index. Returns that index.
    static func compactedThroughCommit(_ port: Int) async -> UInt64? {
        var at: UInt64?
        _ = await eventually(
            {
                let s = status(port)
                guard let commit = number(s, "commit_index"), number(s, "snapshot_index") == commit, commit > 0 else { return false }
                at = commit
                return true
            }, seconds: 30)
        return at
    }

    static func bases(_ archive: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: archive).filter { $0.hasPrefix("base-") }.sorted()
    }

    @Test("a 410 is checked against the archive's last entry: a node whose log starts right after it continues the archive with no new base backup; across a gap a new base backup is taken and archiving goes on, saying which points cannot be restored (--no-new-base stops instead); a restored cluster (its terms 2^32 above) is refused even where its log starts right after the archive's end")
    func compactedNodes() async throws {
        let scratch = try temporaryDirectory("follow-compacted")
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let archive = scratch + "/arch"
        // A snapshot after every entry, and no compacted entries kept: every poll behind the
        // log's start gets a 410.
        let compacting: (inout NodeConfig) -> Void = { c in
            c.raft.snapshotEntries = 1
            c.history.retainedBytes = 0
        }
        let (delta, port, deltaDir) = try await Self.node("delta", cluster: "delta", writes: 3, configure: compacting)
        defer {
            delta.shutdown()
            try? FileManager.default.removeItem(atPath: deltaDir)
        }
        let first = try await Self.follow(archive, port: port)
        #expect(first.status == 0, "\(first.output)")
        let end = try #require(await Self.compactedThroughCommit(port))
        let last = try ArchiveDirectory(archive).recoverLast()
        #expect(last.index == end, "the archive holds everything committed: \(first.output)")
        let basesBefore = try Self.bases(archive)
        #expect(basesBefore.count == 1)

        // The node's log starts at end + 1: its 410 names entry `end` and its term, which is the
        // archive's. Archiving continues with no new base backup.
        let resumed = try await Self.follow(archive, port: port)
        print("resumed on a node whose log starts after the archive's end: \(resumed.output)")
        #expect(resumed.status == 0, "\(resumed.output)")
        #expect(resumed.output.contains("log starts after entry \(end), of term \(last.entry?.term ?? 0) as in the archive: continuing"), "\(resumed.output)")
        #expect(try Self.bases(archive) == basesBefore, "no new base backup: \(resumed.output)")

        // A cluster restored from this archive, under the same cluster id: its log starts right
        // after the archive's last entry too, but its term there is not the archive's.
        let restoredData = scratch + "/restored"
        let restored = try await Self.banyan(["restore", archive + "/" + (basesBefore.first ?? ""), "--archive", archive, "--data-dir", restoredData])
        #expect(restored.status == 0 && restored.output.contains("at index \(end) "), "\(restored.output)")
        var r = singleNodeConfig(scratch)
        r.dataDirectory = restoredData
        r.clusterID = "delta"
        let phoenix = try BanyanNode.start(config: r, logger: Logger(label: "test"))
        defer { phoenix.shutdown() }
        let phoenixPort = clientPort(phoenix)
        #expect(await eventually({ ((try? httpExchange(port: phoenixPort, "PUT", "/p.json?auth=owner", body: "1"))?.status ?? 0) == 200 }, seconds: 30))
        let filesBefore = try FileManager.default.contentsOfDirectory(atPath: archive).sorted()
        let impostor = try await Self.follow(archive, port: phoenixPort)
        print("a restored cluster: \(impostor.output.split(separator: "\n").last ?? "")")
        #expect(impostor.status != 0 && impostor.output.contains("log starts after entry \(end) of term") && impostor.output.contains("is not the cluster the archive"), "\(impostor.output)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: archive).sorted() == filesBefore, "nothing was appended")
        #expect(try ArchiveDirectory(archive).recoverLastIndex() == end)
        phoenix.shutdown()

        // More writes, compacted while no archiver runs: entries end+1… are gone from the node.
        try Self.write(port, 3, from: 100)
        let later = try #require(await Self.compactedThroughCommit(port))
        #expect(later > end + 1)
        let files = try FileManager.default.contentsOfDirectory(atPath: archive).sorted()
        let stopped = try await Self.follow(archive, port: port, ["--no-new-base"])
        print("a gap with --no-new-base: \(stopped.output.split(separator: "\n").last ?? "")")
        #expect(stopped.status != 0 && stopped.output.contains("--no-new-base") && stopped.output.contains("after the archive's end \(end)"), "\(stopped.output)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: archive).sorted() == files, "nothing was written")
        let continued = try await Self.follow(archive, port: port)
        print("a gap: \(continued.output)")
        #expect(continued.status == 0, "\(continued.output)")
        #expect(continued.output.contains("gap: no endpoint holds the entries after the archive's end \(end)") && continued.output.contains("taking a new base backup to continue"), "\(continued.output)")
        #expect(
            continued.output.contains("new base backup at index \(later) (\(ArchiveDirectory.baseName(index: later))): the archive holds no entries \(end + 1)…\(later)")
                && continued.output.contains("Archiving continues from index \(later + 1)"), "\(continued.output)")
        let basesAfter = try Self.bases(archive)
        #expect(basesAfter.count == 2 && basesAfter.contains(ArchiveDirectory.baseName(index: later)), "\(basesAfter)")
        // It went on after the base (every later poll finds the node's log starting right
        // after it) until --seconds ended it.
        #expect(continued.output.contains("stopped; the archive ends at index "), "\(continued.output)")
        // A restore from the new base stands at its index.
        let fromNew = try await Self.banyan(["restore", archive + "/" + ArchiveDirectory.baseName(index: later), "--archive", archive, "--data-dir", scratch + "/from-new"])
        #expect(fromNew.status == 0 && fromNew.output.contains("at index \(later) "), "\(fromNew.output)")
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
}
