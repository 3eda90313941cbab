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
    static func node(_ name: String, cluster: String, writes: Int) async throws -> (BanyanNode, Int, String) {
        let dir = try temporaryDirectory("follow-\(name)")
        var c = singleNodeConfig(dir)
        c.clusterID = cluster
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

    static func follow(_ archive: String, port: Int) async throws -> (status: Int32, output: String) {
        try await banyan(["backup", "--follow", "--out", archive, "--seconds", "2", "--interval-ms", "100", "--endpoint", "127.0.0.1:\(port)"])
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
