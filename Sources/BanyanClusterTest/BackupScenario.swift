import BanyanOps
import Foundation
import Glibc
import NIOHTTP1

/// The `backup` scenario (docs/backup.md): `banyan backup`, `backup --follow`, `backup verify`
/// and `restore` run as an operator runs them, against the cluster under load.
///
/// - A full backup taken mid-load holds a consistent prefix of a sequential writer's writes,
///   including every write acknowledged before the backup started, and restores to exactly
///   what the source cluster held at the backup's index (its `GET /.json?at=<index>`, every
///   data namespace), security rules included.
/// - base backup + archive replayed `--to-index` the full backup's index equals the full
///   backup, namespace by namespace (two independent paths to one state).
/// - `--to-time` a moment between two acknowledged writes holds exactly the writes before it.
/// - base backup + the whole archive equals the source cluster once writes stop.
/// - A damaged backup is refused by `verify` and `restore`, with the offset.
extension ClusterTest {
    func backupScenario(_ cluster: LocalCluster, live: LiveSet, workload: RegisterWorkload) async throws {
        let files = "\(dir)/backup-files"
        try? FileManager.default.removeItem(atPath: files)
        try FileManager.default.createDirectory(atPath: files, withIntermediateDirectories: true)
        let endpoints = [UInt64(1), 2, 3].flatMap { ["--endpoint", "127.0.0.1:\(cluster.clientPort($0))"] }
        // Rules on the default namespace (open, with a validation), set before the backup: the
        // backup must carry them.
        let rulesPut = try await cluster.request(1, .PUT, "/.settings/rules.json?auth=owner", body: Self.rules, timeout: 15)
        guard rulesPut.status == 200 else { throw Failure("setting the rules: \(rulesPut.status) \(rulesPut.text)") }
        let sourceRules = try await cluster.request(1, .GET, "/.settings/rules.json?auth=owner", timeout: 15)
        guard sourceRules.status == 200, sourceRules.text.contains("newData.isNumber()") else {
            throw Failure("reading the rules back: \(sourceRules.status) \(sourceRules.text)")
        }
        let archiver = try spawnBanyan(
            ["backup", "--follow", "--out", files + "/arch", "--interval-ms", "100", "--seconds", "\(Int(seconds * 6 + 60))"] + endpoints,
            log: files + "/follow.log")
        defer { if archiver.isRunning { archiver.terminate() } }

        let writer = SequentialWriter(cluster: cluster, live: live, markAt: 25)
        let writing = Task { await writer.run(seconds: seconds * 3) }
        async let load: Void = workload.run(clients: clients, seconds: seconds * 3, nodes: { live.nodes })
        try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
        let ackedBefore = writer.lastAcked
        let full = files + "/full.bkp"
        let took = try await runBanyan(["backup", "--out", full] + endpoints)
        print(took.output.trimmingCharacters(in: .whitespacesAndNewlines))
        guard took.status == 0, let tookIndex = Self.number(after: ": index ", in: took.output) else { throw Failure("banyan backup failed: \(took.output)") }
        // The source at the backup's index, read at once (reads of the past reach back a
        // snapshot interval or two, and writes go on).
        let atIndex = try await readAt(cluster, index: tookIndex, among: live.nodes)
        await load
        await writing.value
        guard let mark = writer.mark else { throw Failure("the sequential writer never reached write 25 (\(writer.lastAcked) acknowledged)") }
        print("sequential writes: \(writer.lastAcked) acknowledged; \(ackedBefore) before the backup started")

        // Wait until the archive holds everything committed, then stop the archiver.
        let leader = try await cluster.waitForLeader(among: live.nodes)
        guard let commit = (await cluster.status(leader))?["commit_index"] as? NSNumber else { throw Failure("no status from the leader") }
        try await waitUntil("the archive reaches index \(commit)", timeout: 30) {
            archivedIndex(log: files + "/follow.log") >= commit.uint64Value
        }
        archiver.terminate()
        archiver.waitUntilExit()

        let verified = try await runBanyan(["backup", "verify", full])
        guard verified.status == 0, let index = Self.number(after: "index ", in: verified.output) else {
            throw Failure("backup verify failed: \(verified.output)")
        }
        print(verified.output.trimmingCharacters(in: .whitespacesAndNewlines))

        // 1. The full backup: a consistent prefix holding every write acknowledged before it.
        guard index == tookIndex else { throw Failure("backup verify says index \(index), the backup said \(tookIndex)") }
        let fromFull = try await restoreAndRead(cluster, files: files, name: "full", arguments: [full], rules: sourceRules.text, grow: true)
        let seq = try Self.sequence(fromFull.defaultNamespace)
        guard seq >= ackedBefore else { throw Failure("the backup holds writes 1…\(seq) but \(ackedBefore) were acknowledged before it started") }
        print("full backup at index \(index): writes 1…\(seq) (≥ \(ackedBefore) acknowledged before it)")
        guard fromFull == atIndex else {
            throw Failure(
                "the restored backup differs from the source at index \(index): default namespace \(fromFull.defaultNamespace.utf8.count) vs \(atIndex.defaultNamespace.utf8.count) bytes, jepsen \(fromFull.jepsen) vs \(atIndex.jepsen)")
        }
        print("full backup: equal to the source's GET /.json?at=\(index) in every data namespace, and its rules")

        // 2. base + archive to the same index: the same state.
        let archive = files + "/arch"
        let bases = try FileManager.default.contentsOfDirectory(atPath: archive).filter { $0.hasPrefix("base-") }.sorted()
        guard let base = bases.last(where: { (UInt64($0.dropFirst(5).dropLast(4)) ?? .max) <= index }) else {
            throw Failure("no base backup at or before index \(index) in \(bases)")
        }
        let toIndex = try await restoreAndRead(
            cluster, files: files, name: "to-index", arguments: [archive + "/" + base, "--archive", archive, "--to-index", "\(index)"])
        guard toIndex == fromFull else { throw Failure("base + archive to index \(index) differs from the backup taken at \(index)") }
        print("base \(base) + archive to index \(index): equal to the full backup")

        // 3. To a time between write 25 and write 26.
        let stamp = Int64((mark.timeIntervalSince1970 * 1000).rounded(.down))
        let newest = bases.last ?? base
        let toTime = try await restoreAndRead(
            cluster, files: files, name: "to-time", arguments: [archive + "/" + (bases.first ?? newest), "--archive", archive, "--to-time", "\(stamp)"])
        let atTime = try Self.sequence(toTime.defaultNamespace)
        guard atTime == 25 else { throw Failure("restored to the time after write 25, the data holds writes 1…\(atTime)") }
        print("to time \(stamp) ms (between writes 25 and 26): writes 1…25")

        // 4. Everything archived: the source's data.
        let latest = try await restoreAndRead(cluster, files: files, name: "latest", arguments: [archive + "/" + newest, "--archive", archive])
        let source = try await read(cluster, node: leader)
        guard latest == source else { throw Failure("base + the whole archive differs from the source cluster") }
        print("base + whole archive: equal to the source cluster (\(source.defaultNamespace.utf8.count + source.jepsen.utf8.count) bytes of JSON)")

        // 5. Damage.
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: full)))
        let at = bytes.count / 2
        bytes[at] ^= 0x40
        try Data(bytes).write(to: URL(fileURLWithPath: files + "/damaged.bkp"))
        let refused = try await runBanyan(["backup", "verify", files + "/damaged.bkp"])
        guard refused.status != 0, let offset = Self.number(after: "byte offset ", in: refused.output), offset <= UInt64(at) else {
            throw Failure("a backup damaged at byte \(at) was not refused with its offset: \(refused.output)")
        }
        let notRestored = try await runBanyan(["restore", files + "/damaged.bkp", "--data-dir", files + "/damaged-data"])
        guard notRestored.status != 0, !FileManager.default.fileExists(atPath: files + "/damaged-data") else {
            throw Failure("a damaged backup was restored: \(notRestored.output)")
        }
        print("damaged at byte \(at): refused at offset \(offset)")
    }

    struct Snapshot: Equatable {
        var defaultNamespace: String
        var jepsen: String
    }

    /// The default namespace's rules in the scenario: open, with a validation on /seq.
    static let rules = #"{"rules": {".read": true, ".write": true, "seq": {"$w": {".validate": "newData.isNumber()"}}}}"#

    /// The data namespaces as the source held them once `index` applied (reads of the past, as
    /// an administrator), from the first live node that answers both.
    func readAt(_ cluster: LocalCluster, index: UInt64, among nodes: [UInt64]) async throws -> Snapshot {
        var refusals: [String] = []
        for _ in 0..<20 {
            for node in nodes {
                let a = try? await cluster.request(node, .GET, "/.json?at=\(index)&auth=owner", timeout: 15)
                let b = try? await cluster.request(node, .GET, "/.json?ns=jepsen&at=\(index)&auth=owner", timeout: 15)
                if let a, let b, a.status == 200, b.status == 200 { return Snapshot(defaultNamespace: a.text, jepsen: b.text) }
                refusals.append("node \(node): \(a.map { "\($0.status) \($0.text.prefix(160))" } ?? "no answer"), \(b.map { "\($0.status)" } ?? "no answer")")
            }
            // 429: another read of the past runs on that node; 503 while it catches up.
            try await Task.sleep(nanoseconds: 200_000_000)
        }
        throw Failure("no node answered a read of the past at index \(index): \(refusals.suffix(3))")
    }

    /// The data namespaces of a node, read from its own state.
    func read(_ cluster: LocalCluster, node: UInt64) async throws -> Snapshot {
        let a = try await cluster.request(node, .GET, "/.json?consistency=stale", timeout: 15)
        let b = try await cluster.request(node, .GET, "/.json?ns=jepsen&consistency=stale", timeout: 15)
        guard a.status == 200, b.status == 200 else { throw Failure("reading node \(node): \(a.status) \(b.status)") }
        return Snapshot(defaultNamespace: a.text, jepsen: b.text)
    }

    /// `banyan restore ARGUMENTS --data-dir …`, then the restored node served alone (as id 40,
    /// on its own ports) and read. With `grow`, the restored cluster then grows as the runbook
    /// says: a blank node started with `--join` (ports of id 41) is added, must become a voter,
    /// and a linearizable read through it must equal the restored node's state.
    func restoreAndRead(_ cluster: LocalCluster, files: String, name: String, arguments: [String], rules: String? = nil, grow: Bool = false) async throws -> Snapshot {
        let data = "\(files)/restored-\(name)"
        let restored = try await runBanyan(["restore"] + arguments + ["--data-dir", data, "--node-id", "1"])
        guard restored.status == 0 else { throw Failure("restore \(name) failed: \(restored.output)") }
        let node = try spawnBanyan(
            [
                "serve", "--data-dir", data, "--node-id", "1", "--cluster-id", "restored-\(name)", "--listen", "127.0.0.1:\(cluster.clientPort(40))",
                "--peer-listen", "127.0.0.1:\(cluster.peerPort(40))", "--tls-dir", files + "/certs", "--log-level", "notice",
            ], log: "\(files)/restored-\(name).log")
        defer {
            node.terminate()
            node.waitUntilExit()
        }
        try await waitUntil("the restored node \(name) serves", timeout: 30) {
            guard let r = try? await cluster.request(40, .GET, "/.banyan/ready", timeout: 2) else { return false }
            return r.status == 200
        }
        if let rules {
            let restored = try await cluster.request(40, .GET, "/.settings/rules.json?auth=owner", timeout: 15)
            guard restored.status == 200, restored.text == rules else {
                throw Failure("the restored node \(name) has the rules \(restored.status) \(restored.text), the source \(rules)")
            }
        }
        let own = try await read(cluster, node: 40)
        if grow { try await growRestored(cluster, files: files, name: name, expecting: own) }
        return own
    }

    /// Adds a blank `--join` node (node 2, on the ports of id 41) to the restored cluster served
    /// as id 40, waits until it votes and answers ready, and compares a linearizable read of both
    /// namespaces through it with the restored node's own state.
    func growRestored(_ cluster: LocalCluster, files: String, name: String, expecting own: Snapshot) async throws {
        let started = Date()
        let joiner = try spawnBanyan(
            [
                "serve", "--data-dir", "\(files)/joined-\(name)", "--node-id", "2", "--cluster-id", "restored-\(name)", "--listen",
                "127.0.0.1:\(cluster.clientPort(41))", "--peer-listen", "127.0.0.1:\(cluster.peerPort(41))", "--tls-dir", files + "/certs",
                "--log-level", "notice", "--join",
            ], log: "\(files)/joined-\(name).log")
        defer {
            joiner.terminate()
            joiner.waitUntilExit()
        }
        try await leaderCall(cluster, [40], .POST, "/.banyan/members", body: #"{"id":2,"peer_address":"127.0.0.1:\#(cluster.peerPort(41))"}"#)
        try await waitUntil("node 2 of the restored cluster \(name) votes and answers ready", timeout: 60) {
            guard let s = await cluster.status(40), (s["voters"] as? [NSNumber])?.map(\.uint64Value).contains(2) == true else { return false }
            guard let r = try? await cluster.request(41, .GET, "/.banyan/ready", timeout: 2) else { return false }
            return r.status == 200
        }
        let a = try await cluster.request(41, .GET, "/.json", timeout: 15)
        let b = try await cluster.request(41, .GET, "/.json?ns=jepsen", timeout: 15)
        guard a.status == 200, b.status == 200 else { throw Failure("reading through the joined node of \(name): \(a.status) \(b.status)") }
        guard a.text == own.defaultNamespace, b.text == own.jepsen else {
            throw Failure("the joined node of the restored cluster \(name) reads other data than the restored node")
        }
        print("restored cluster \(name) grown: node 2 joined, votes, and reads the restored data (linearizable) after \(String(format: "%.1f", Date().timeIntervalSince(started))) s")
    }

    /// The highest n such that /seq holds exactly w1…wn.
    static func sequence(_ json: String) throws -> Int {
        guard let object = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any] else { return 0 }
        let seq = object["seq"] as? [String: Any] ?? [:]
        let numbers = seq.keys.compactMap { Int($0.dropFirst()) }.sorted()
        guard numbers == (0..<numbers.count).map({ $0 + 1 }) else {
            throw Failure("/seq is not a prefix of the writes: \(numbers.prefix(10))…\(numbers.suffix(5))")
        }
        return numbers.count
    }

    static func number(after marker: String, in text: String) -> UInt64? {
        guard let range = text.range(of: marker) else { return nil }
        return UInt64(text[range.upperBound...].prefix { $0.isNumber })
    }

    /// The last index the archiver reported as archived.
    func archivedIndex(log: String) -> UInt64 {
        guard let text = try? String(contentsOfFile: log, encoding: .utf8) else { return 0 }
        var last: UInt64 = 0
        for line in text.split(separator: "\n") where line.hasPrefix("archived ") {
            if let n = Self.number(after: "at index ", in: String(line)) { last = max(last, n) }
        }
        return last
    }

    func spawnBanyan(_ arguments: [String], log: String) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: banyan)
        p.arguments = arguments
        FileManager.default.createFile(atPath: log, contents: nil)
        let handle = FileHandle(forWritingAtPath: log)
        p.standardOutput = handle
        p.standardError = handle
        try p.run()
        return p
    }

    /// Runs `banyan ARGUMENTS` to completion (off the cooperative pool); its output and status.
    func runBanyan(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        let executable = banyan
        return try await withCheckedThrowingContinuation { continuation in
            Thread.detachNewThread {
                do {
                    continuation.resume(returning: try runProcess(executable, arguments))
                } catch {
                    continuation.resume(throwing: error)
                }
            }
        }
    }
}

/// Writes /seq/w1, /seq/w2, … one at a time through the live nodes (retrying a write only on a
/// definite refusal, so an unacknowledged write never reappears as a later one). After write
/// `markAt` is acknowledged it waits, notes the time, and waits again, so that time falls
/// strictly between that write's leader timestamp and the next one's.
final class SequentialWriter: @unchecked Sendable {
    private let cluster: LocalCluster
    private let live: LiveSet
    private let markAt: Int
    private let lock = NSLock()
    private var acked = 0
    private var marked: Date?

    init(cluster: LocalCluster, live: LiveSet, markAt: Int) {
        self.cluster = cluster
        self.live = live
        self.markAt = markAt
    }

    var lastAcked: Int { lock.withLock { acked } }
    var mark: Date? { lock.withLock { marked } }

    func run(seconds: Double) async {
        let deadline = Date().addingTimeInterval(seconds)
        var n = 1
        var turn = 0
        while Date() < deadline {
            let nodes = live.nodes
            guard !nodes.isEmpty else { return }
            turn += 1
            let node = nodes[turn % nodes.count]
            // The same value for the same key: a retry after an unknown outcome writes the same
            // thing, so the data stays a prefix whichever attempt applied.
            guard let r = try? await cluster.request(node, .PUT, "/seq/w\(n).json", body: "\(n)", timeout: 10), r.status == 200 else {
                try? await Task.sleep(nanoseconds: 50_000_000)
                continue
            }
            lock.withLock { acked = n }
            if n == markAt {
                try? await Task.sleep(nanoseconds: 40_000_000)
                let now = Date()
                lock.withLock { marked = now }
                try? await Task.sleep(nanoseconds: 40_000_000)
            }
            n += 1
        }
    }
}
