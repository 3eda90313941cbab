public import Foundation
import NIOCore
import NIOHTTP1

/// `banyan bench --backup 100000,1000000` (docs/benchmarks.md, "Backup and restore"): on a 3-node
/// cluster holding K keys, the time and rate of `banyan backup` alone, write throughput and p99
/// with and without backups running, and `banyan restore`'s rate.
public struct BackupBench: Sendable {
    public var executable: String
    public var directory: String
    public var keyCounts: [Int] = [100_000, 1_000_000]
    public var clients = 16
    public var seconds: Double = 10
    public var portBase = 19_700

    public init(executable: String, directory: String) {
        self.executable = executable
        self.directory = directory
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    public func run(log: @escaping @Sendable (String) -> Void) async throws {
        try? FileManager.default.removeItem(atPath: directory)
        let cluster = LocalCluster(
            executable: executable, directory: directory, nodes: 3, clientPortBase: portBase, peerPortBase: portBase + 100, logLevel: "warning")
        defer { cluster.shutdown() }
        for id: UInt64 in [1, 2, 3] { try cluster.start(id) }
        let leader = try await cluster.waitForLeader(timeout: 30)
        log("3-node cluster up (leader: node \(leader)); \(ProcessInfo.processInfo.activeProcessorCount) cores")
        var load = ClusterBench(executable: executable, directory: directory)
        load.seconds = seconds
        let endpoints = cluster.ids.flatMap { ["--endpoint", "127.0.0.1:\(cluster.clientPort($0))"] }
        var written = 0
        for keys in keyCounts {
            let started = Date()
            written = try await fill(cluster, leader: leader, from: written, to: keys)
            log("\(keys) keys loaded in \(String(format: "%.1f", Date().timeIntervalSince(started))) s")
            try await Task.sleep(nanoseconds: 2_000_000_000)

            // A backup with nothing else running.
            let file = "\(directory)/backup-\(keys).bkp"
            let summary = OutputBox()
            let alone = try await Self.timed { summary.set(try Self.runTool(executable, ["backup", "--out", file] + endpoints)) }
            let bytes = (try? FileManager.default.attributesOfItem(atPath: file)[.size] as? Int) ?? 0
            log("backup of \(keys) keys alone, \(String(format: "%.2f", alone)) s in all: \(summary.get().trimmingCharacters(in: .whitespacesAndNewlines))")

            // Writes without, then with one backup taken once the load runs (what a scheduled
            // backup costs), then with backups running back to back (the worst case).
            let base = try await load.writeLoad(cluster, clients: clients)
            let single = BackupLoop(executable: executable, arguments: ["backup", "--out", file + ".single"] + endpoints, once: true, after: seconds / 4)
            let singleTask = Task.detached { single.run() }
            let withOne = try await load.writeLoad(cluster, clients: clients)
            let singleTimes = await singleTask.value
            let backups = BackupLoop(executable: executable, arguments: ["backup", "--out", file + ".under-load"] + endpoints)
            let loop = Task.detached { backups.run() }
            let during = try await load.writeLoad(cluster, clients: clients)
            backups.stop()
            let times = await loop.value
            for (name, r) in [("without a backup", base), ("with one backup (\(String(format: "%.2f", singleTimes.first ?? 0)) s of the run)", withOne), ("with backups running", during)] {
                let sorted = r.latencies.sorted()
                log(
                    "  writes, \(clients) clients, \(name): \(Int(Double(r.writes) / r.seconds)) writes/s, p50 \(ClusterBench.ms(ClusterBench.percentile(sorted, 0.5))), "
                        + "p99 \(ClusterBench.ms(ClusterBench.percentile(sorted, 0.99))), errors \(r.errors)")
            }
            let mean = times.isEmpty ? 0 : times.reduce(0, +) / Double(times.count)
            log("  backups under load: \(times.count) taken back to back, \(String(format: "%.2f", mean)) s each (backup command included)")

            // Restore.
            let data = "\(directory)/restored-\(keys)"
            try? FileManager.default.removeItem(atPath: data)
            let restore = try await Self.timed { try Self.runTool(executable, ["restore", file, "--data-dir", data]) }
            let imageMiB = Self.imageMiB(summary.get())
            log(
                "restore of \(keys) keys: \(String(format: "%.2f", restore)) s (\(String(format: "%.1f", imageMiB * 1.048576 / restore)) MB/s of the \(String(format: "%.1f", imageMiB)) MiB image, "
                    + "\(String(format: "%.1f", Double(bytes) / 1e6 / restore)) MB/s of the \(String(format: "%.1f", Double(bytes) / 1_048_576)) MiB backup file, \(Int(Double(keys) / restore)) keys/s)")
            try? FileManager.default.removeItem(atPath: data)
        }
    }

    /// Writes keys `from..<to` under /data in the bench namespace, 10,000 per multi-path update.
    func fill(_ cluster: LocalCluster, leader: UInt64, from: Int, to: Int) async throws -> Int {
        let conn = try await HTTPConnection.connect(host: "127.0.0.1", port: cluster.clientPort(leader), group: cluster.group)
        defer { conn.close() }
        var at = from
        while at < to {
            var body = "{"
            for i in at..<min(to, at + 10_000) { body += (i > at ? "," : "") + "\"k\(i)\":{\"n\":\(i),\"s\":\"value-\(i)\"}" }
            body += "}"
            let r = try await conn.send(.PATCH, "/data.json?ns=bench&print=silent&auth=owner", body: Array(body.utf8), timeout: .seconds(60))
            guard r.status == 204 || r.status == 200 else { throw Failure(description: "loading keys: \(r.status) \(r.text)") }
            at = min(to, at + 10_000)
        }
        return at
    }

    /// The image size (MiB) in `banyan backup`'s summary line ("image 35.5 MiB"); 0 if absent.
    static func imageMiB(_ summary: String) -> Double {
        guard let at = summary.range(of: "image ") else { return 0 }
        return Double(summary[at.upperBound...].prefix { $0.isNumber || $0 == "." }) ?? 0
    }

    static func timed(_ body: @escaping @Sendable () throws -> Void) async throws -> Double {
        try await Task.detached {
            let start = Date()
            try body()
            return Date().timeIntervalSince(start)
        }.value
    }

    @discardableResult
    static func runTool(_ executable: String, _ arguments: [String]) throws -> String {
        let (status, output) = try runProcess(executable, arguments)
        guard status == 0 else { throw Failure(description: "banyan \(arguments.prefix(2).joined(separator: " ")) failed: \(output)") }
        return output
    }
}

/// Runs a program to completion: its exit status and its output (standard output and error).
public func runProcess(_ executable: String, _ arguments: [String]) throws -> (status: Int32, output: String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: executable)
    p.arguments = arguments
    let pipe = Pipe()
    p.standardOutput = pipe
    p.standardError = pipe
    try p.run()
    let output = pipe.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return (p.terminationStatus, String(decoding: output, as: UTF8.self))
}

final class OutputBox: @unchecked Sendable {
    private let lock = NSLock()
    private var text = ""
    func set(_ t: String) { lock.withLock { text = t } }
    func get() -> String { lock.withLock { text } }
}

/// Takes backups back to back until stopped; the seconds each took.
final class BackupLoop: @unchecked Sendable {
    private let executable: String
    private let arguments: [String]
    /// One backup only, started `after` seconds.
    private let once: Bool
    private let after: Double
    private let lock = NSLock()
    private var stopped = false

    init(executable: String, arguments: [String], once: Bool = false, after: Double = 0) {
        self.executable = executable
        self.arguments = arguments
        self.once = once
        self.after = after
    }

    func stop() { lock.withLock { stopped = true } }

    func run() -> [Double] {
        if after > 0 { Thread.sleep(forTimeInterval: after) }
        var times: [Double] = []
        while !lock.withLock({ stopped }) {
            let start = Date()
            guard (try? BackupBench.runTool(executable, arguments)) != nil else { break }
            if once || !lock.withLock({ stopped }) { times.append(Date().timeIntervalSince(start)) }
            if once { break }
        }
        return times
    }
}
