import BanyanOps
import Foundation
import Glibc
import NIOHTTP1

/// The `disk-full` scenario (issue 18; docs/operations.md, "Disk space"). Each node's data
/// directory is a tmpfs of its own (`diskBytes`), `storage.min_free_bytes` is `minFree`, and the
/// register workload runs throughout beside an `OutcomeWriter`, which writes keys of its own in
/// the `diskfull` namespace and keeps what each write was told.
///
/// 1. Low on space: a follower's disk is filled until less than the minimum is free. Writes
///    through every node are then refused with 507 NOSPACE, reads through every node (the low
///    one too) show every write acknowledged before they began, deletes are accepted, and every
///    node's status lists the alarm. The filler is removed: writes are accepted again by
///    themselves.
/// 2. Full: the leader's disk is filled to the last page while writes of 64 KiB go on, so its
///    log write fails and it stops with exit status 75. The other two elect a leader and keep
///    answering: reads, and writes either accepted or refused with NOSPACE (whether the alarm
///    committed before the node stopped). Restarted while its disk is still full, the node must
///    stay up, waiting and logging that its disk is full; once the filler is removed it starts,
///    catches up, clears its alarm, and writes are accepted through every node.
/// 3. Every node holds every acknowledged write of the writer, none of its refused ones, and
///    none of the keys deleted during the alarm (each node read from its own state); the usual
///    convergence and linearizability checks follow in `runScenario`.
extension ClusterTest {
    static let diskFullNamespace = "diskfull"

    func diskFull(_ cluster: LocalCluster, live: LiveSet, workload: RegisterWorkload, disks: NodeDisks) async throws {
        let writer = OutcomeWriter(cluster: cluster, live: live, namespace: Self.diskFullNamespace)
        // Both run until stopped below; the bound only ends them should that never happen.
        let bound = seconds * 3 + 120
        let load = Task { await workload.run(clients: clients, seconds: bound, nodes: { live.nodes }) }
        let writing = Task { await writer.run(seconds: bound) }
        defer {
            workload.stop()
            writer.stop()
        }
        // Keys deleted while the alarm is raised.
        let doomed = (1...6).map { "/doomed/d\($0).json?ns=\(Self.diskFullNamespace)" }
        for uri in doomed {
            let r = try await cluster.request(1, .PUT, uri, body: "true")
            guard r.status == 200 else { throw Failure("PUT \(uri): \(r.status) \(r.text)") }
        }
        try await Task.sleep(nanoseconds: UInt64(seconds / 2 * 1e9))
        try await lowOnSpace(cluster, disks: disks, writer: writer, doomed: doomed)
        try await Task.sleep(nanoseconds: UInt64(seconds / 2 * 1e9))
        try await fullDisk(cluster, live: live, disks: disks, writer: writer)
        try await Task.sleep(nanoseconds: UInt64(seconds / 2 * 1e9))
        workload.stop()
        writer.stop()
        await load.value
        await writing.value
        try await checkOutcomes(cluster, writer: writer, doomed: doomed)
    }

    /// Step 1: a follower low on space raises the alarm; removing the filler clears it.
    func lowOnSpace(_ cluster: LocalCluster, disks: NodeDisks, writer: OutcomeWriter, doomed: [String]) async throws {
        let leader = try await cluster.waitForLeader()
        let low = leader % 3 + 1
        let filled = try disks.fill(low, leaving: disks.minFree / 2)
        let filledAt = Date()
        print("node \(low) (a follower): filler of \(filled >> 20) MiB, \(disks.freeBytes(low) >> 20) MiB free (minimum \(disks.minFree >> 20) MiB)")
        try await waitUntil("writes through every node are refused with NOSPACE", timeout: 15) {
            await probeWrites(cluster, [1, 2, 3]).allSatisfy { Self.isNoSpace($0) }
        }
        print(String(format: "writes through nodes 1, 2, 3 refused with 507 NOSPACE %.1f s after the filler", Date().timeIntervalSince(filledAt)))
        for id: UInt64 in [1, 2, 3] {
            try await waitUntil("node \(id)'s status lists space_alarms [\(low)]", timeout: 5) {
                (await cluster.status(id)?["space_alarms"] as? [NSNumber])?.map(\.uint64Value) == [low]
            }
        }
        let shown = try await runBanyan(["status", "--endpoint", cluster.endpoint(low)])
        let shownAlarms = (try? JSONSerialization.jsonObject(with: Data(shown.output.utf8)) as? [String: Any])?["space_alarms"] as? [NSNumber]
        guard shown.status == 0, shownAlarms?.map(\.uint64Value) == [low] else {
            throw Failure("banyan status on node \(low) does not show its alarm: \(shown.output.prefix(300))")
        }
        print("status of every node (and banyan status on node \(low)): space_alarms [\(low)]")
        try await readAcknowledged(cluster, writer: writer, through: [1, 2, 3])
        for (i, uri) in doomed.enumerated() {
            let node = UInt64(i % 3 + 1)
            let r = try await cluster.request(node, .DELETE, uri)
            guard r.status == 200 else { throw Failure("DELETE \(uri) via node \(node) while the alarm is raised: \(r.status) \(r.text)") }
            let after = try await cluster.request(node, .GET, uri)
            guard after.status == 200, after.text == "null" else { throw Failure("GET \(uri) after its DELETE via node \(node): \(after.status) \(after.text)") }
        }
        print("deletes through every node accepted while the alarm is raised (\(doomed.count) keys)")
        // The writer and the workload keep going against the alarm for a moment. (At most one
        // acknowledgement more: the write in flight when the alarm was seen, had it committed
        // before the alarm.)
        let before = writer.counts
        try await Task.sleep(nanoseconds: 1_000_000_000)
        let during = writer.counts
        guard during.acknowledged <= before.acknowledged + 1, during.refused > before.refused else {
            throw Failure("while the alarm is raised the writer went from \(before) to \(during)")
        }
        print("writer while the alarm is raised: \(during.refused - before.refused) writes refused in 1 s")
        try disks.removeFiller(low)
        let freedAt = Date()
        try await waitUntil("writes through every node are accepted again", timeout: 15) {
            await probeWrites(cluster, [1, 2, 3]).allSatisfy { $0?.status == 200 }
        }
        print(String(format: "filler removed (%llu MiB free): writes through every node accepted again after %.1f s",
                     disks.freeBytes(low) >> 20, Date().timeIntervalSince(freedAt)))
    }

    /// Step 2: the leader's disk fills completely under writes; it stops; restarted on the full
    /// disk it waits; freed, it starts and catches up.
    func fullDisk(_ cluster: LocalCluster, live: LiveSet, disks: NodeDisks, writer: OutcomeWriter) async throws {
        let full = try await cluster.waitForLeader()
        writer.valueBytes = 64 << 10
        let filled = try disks.fill(full, leaving: 0)
        let filledAt = Date()
        print("node \(full) (the leader): filled to the last page (filler of \(filled >> 20) MiB, \(disks.freeBytes(full)) bytes free); writes of 64 KiB go on")
        try await waitUntil("node \(full) stops on its full disk", timeout: 30) { !cluster.isRunning(full) }
        live.remove(full)
        writer.valueBytes = 0
        guard let process = cluster.processes[full], process.terminationReason == .exit, process.terminationStatus == 75 else {
            throw Failure("node \(full) ended on its full disk with \(String(describing: cluster.processes[full]?.terminationReason)) \(cluster.processes[full]?.terminationStatus ?? -1), not exit status 75")
        }
        print(String(format: "node \(full) stopped with exit status 75 %.1f s after its disk filled", Date().timeIntervalSince(filledAt)))
        let others = live.nodes
        let next = try await cluster.waitForLeader(among: others, timeout: 20)
        // Writes through both are accepted (the node stopped before its alarm committed) or
        // refused with NOSPACE (it committed, and stands while the node is away), as the status
        // read after them says.
        var alarms: [UInt64]?
        try await waitUntil("nodes \(others) answer writes as their space_alarms say", timeout: 20) {
            let answers = await probeWrites(cluster, others)
            alarms = (await cluster.status(next)?["space_alarms"] as? [NSNumber])?.map(\.uint64Value)
            if alarms == [] { return answers.allSatisfy { $0?.status == 200 } }
            return alarms == [full] && answers.allSatisfy { Self.isNoSpace($0) }
        }
        let verdict = alarms == [] ? "accepted" : "refused with NOSPACE"
        print(String(format: "nodes \(others) (leader \(next)) answer %.1f s after the fill: writes \(verdict), space_alarms \(alarms ?? [])", Date().timeIntervalSince(filledAt)))
        try await readAcknowledged(cluster, writer: writer, through: others)

        // Restart on the still-full disk (topped up: whatever the stopped node left free). The
        // start releases the ballast, which gives the node room to start: it serves reads, raises
        // its alarm (it has less than the minimum free) and catches up.
        _ = try disks.fill(full, leaving: 0)
        let log = "\(cluster.directory)/node\(full).log"
        let released = "released the ballast file to start"
        let ballastPath = cluster.dataDirectory(full) + "/ballast"
        guard FileManager.default.fileExists(atPath: ballastPath) else { throw Failure("node \(full) had no ballast file before its disk filled") }
        let releasedBefore = Self.occurrences(of: released, inFile: log)
        try cluster.start(full)
        let restartedAt = Date()
        try await waitUntil("node \(full), restarted on its full disk, releases its ballast and serves", timeout: 30) {
            guard cluster.isRunning(full) else { return true }
            guard Self.occurrences(of: released, inFile: log) > releasedBefore else { return false }
            return await cluster.status(full) != nil
        }
        guard cluster.isRunning(full) else {
            throw Failure("node \(full), restarted on its full disk, exited with status \(cluster.processes[full]?.terminationStatus ?? -1) (see \(log))")
        }
        guard !FileManager.default.fileExists(atPath: ballastPath) else { throw Failure("node \(full) started on its full disk but its ballast is still there") }
        let startedIn = Date().timeIntervalSince(restartedAt)
        try await waitUntil("node \(full)'s alarm stands and writes through every node are refused with NOSPACE", timeout: 20) {
            let alarms = (await cluster.status(full)?["space_alarms"] as? [NSNumber])?.map(\.uint64Value)
            guard alarms == [full] else { return false }
            return await probeWrites(cluster, [1, 2, 3]).allSatisfy { Self.isNoSpace($0) }
        }
        try await readAcknowledged(cluster, writer: writer, through: [full])
        print(String(format: "node \(full) restarted on its full disk: released its ballast, served after %.1f s, alarm [\(full)], \(disks.freeBytes(full) >> 10) KiB free",
                     startedIn))

        // Stopped and started again on the full disk, now without a ballast: it waits, logging
        // that its disk is full, and starts by itself once space is freed.
        cluster.signal(full, SIGTERM)
        try await waitUntil("node \(full) stops on SIGTERM", timeout: 20) { !cluster.isRunning(full) }
        _ = try disks.fill(full, leaving: 0)
        let waiting = "the disk holding the data directory is full: free space there"
        let loggedBefore = Self.occurrences(of: waiting, inFile: log)
        try cluster.start(full)
        let waitingSince = Date()
        try await waitUntil("node \(full), restarted on its full disk without a ballast, logs twice that it waits", timeout: 20) {
            Self.occurrences(of: waiting, inFile: log) >= loggedBefore + 2 || !cluster.isRunning(full)
        }
        guard cluster.isRunning(full) else {
            throw Failure("node \(full), restarted on its full disk without a ballast, exited with status \(cluster.processes[full]?.terminationStatus ?? -1) (see \(log))")
        }
        print(String(format: "node \(full) restarted on its full disk without a ballast: still running after %.1f s, logging '\(waiting)'", Date().timeIntervalSince(waitingSince)))
        try disks.removeFiller(full)
        let freedAt = Date()
        try await waitUntil("node \(full) serves after its filler is removed", timeout: 20) { await cluster.status(full) != nil }
        let served = Date().timeIntervalSince(freedAt)
        live.add(full)
        try await waitUntil("the alarm clears and writes are accepted through every node", timeout: 30) {
            await probeWrites(cluster, [1, 2, 3]).allSatisfy { $0?.status == 200 }
        }
        let accepted = Date().timeIntervalSince(freedAt)
        try await waitUntil("node \(full) makes its ballast again", timeout: 20) {
            (await cluster.status(full)?["ballast_bytes"] as? NSNumber)?.uint64Value == disks.ballast
        }
        print(String(format: "filler removed: node \(full) serves after %.1f s; writes accepted through every node after %.1f s; ballast made again after %.1f s",
                     served, accepted, Date().timeIntervalSince(freedAt)))
        try await readAcknowledged(cluster, writer: writer, through: [full])
    }

    /// A write through each node in turn (its answer, nil when none came).
    func probeWrites(_ cluster: LocalCluster, _ nodes: [UInt64]) async -> [HTTPResult?] {
        var answers: [HTTPResult?] = []
        for id in nodes {
            answers.append(try? await cluster.request(id, .PUT, "/probe/n\(id).json?ns=\(Self.diskFullNamespace)", body: "\(id)", timeout: 3))
        }
        return answers
    }

    static func isNoSpace(_ r: HTTPResult?) -> Bool { r?.status == 507 && r?.text.contains("NOSPACE") == true }

    /// A linearizable read of the writer's keys through each of `nodes`: it must hold every
    /// write acknowledged before it began.
    func readAcknowledged(_ cluster: LocalCluster, writer: OutcomeWriter, through nodes: [UInt64]) async throws {
        for id in nodes {
            let expected = writer.acknowledged
            let r = try await cluster.request(id, .GET, "/w.json?ns=\(Self.diskFullNamespace)", timeout: 10)
            guard r.status == 200 else { throw Failure("reading /w through node \(id): \(r.status) \(r.text.prefix(200))") }
            let held = try Self.writes(in: JSONSerialization.jsonObject(with: Data(r.text.utf8), options: .fragmentsAllowed))
            let missing = expected.filter { held[$0.key] != $0.value }.keys.sorted()
            guard missing.isEmpty else { throw Failure("a read through node \(id) lacks acknowledged writes \(missing.prefix(10))") }
        }
        print("reads of /w through nodes \(nodes): 200, every acknowledged write there")
    }

    /// Step 3: each node's own state holds exactly what the writer was told.
    func checkOutcomes(_ cluster: LocalCluster, writer: OutcomeWriter, doomed: [String]) async throws {
        var states: [UInt64: String] = [:]
        try await waitUntil("the \(Self.diskFullNamespace) namespace converges on every node", timeout: 30) {
            states = [:]
            for id: UInt64 in [1, 2, 3] {
                guard let r = try? await cluster.request(id, .GET, "/.json?ns=\(Self.diskFullNamespace)&consistency=stale", timeout: 10), r.status == 200 else {
                    return false
                }
                states[id] = r.text
            }
            return Set(states.values).count == 1
        }
        guard let text = states[1], let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
            throw Failure("the \(Self.diskFullNamespace) namespace is not an object: \(states[1]?.prefix(100) ?? "")")
        }
        guard object["doomed"] == nil else { throw Failure("keys deleted during the alarm are back: \(String(describing: object["doomed"]))") }
        let held = try Self.writes(in: object["w"] ?? NSNull())
        let outcomes = writer.outcomes
        let lost = outcomes.filter { $0.value.outcome == .acknowledged && held[$0.key] != $0.value.value }.keys.sorted()
        let ghosts = outcomes.filter { $0.value.outcome == .refused && held[$0.key] != nil }.keys.sorted()
        let strange = writer.unexpected
        print("writer: \(writer.counts); every node holds the same \(text.utf8.count) bytes of \(Self.diskFullNamespace)")
        guard lost.isEmpty else { throw Failure("acknowledged writes missing: \(lost.prefix(10))") }
        guard ghosts.isEmpty else { throw Failure("writes refused with NOSPACE were applied: \(ghosts.prefix(10))") }
        guard strange.isEmpty else { throw Failure("unexpected answers to the writer: \(strange.prefix(5))") }
        guard writer.counts.acknowledged > 20, writer.counts.refused > 0 else { throw Failure("the writer saw too little: \(writer.counts)") }
    }

    /// The writer's keys and values in `/w` as JSONSerialization read it (`NSNull`: none).
    static func writes(in value: Any) throws -> [String: String] {
        if value is NSNull { return [:] }
        guard let object = value as? [String: Any] else { throw Failure("/w is not an object: \(String(describing: value).prefix(100))") }
        return object.compactMapValues { $0 as? String }
    }

    static func occurrences(of text: String, inFile path: String) -> Int {
        guard let content = try? String(contentsOfFile: path, encoding: .utf8) else { return 0 }
        return content.components(separatedBy: text).count - 1
    }
}

/// Writes /w/w1, /w/w2, … one at a time through the live nodes in turn, each key once, and keeps
/// what each write was told: acknowledged (200), refused (507 NOSPACE: the state machine decided
/// on every node not to apply it), or unknown (no answer, 503: it may still apply). Any other
/// answer is kept as unexpected.
final class OutcomeWriter: @unchecked Sendable {
    enum Outcome { case acknowledged, refused, unknown }

    struct Counts: CustomStringConvertible {
        var acknowledged = 0
        var refused = 0
        var unknown = 0
        var description: String { "\(acknowledged) acknowledged, \(refused) refused with NOSPACE, \(unknown) unknown" }
    }

    private let cluster: LocalCluster
    private let live: LiveSet
    private let namespace: String
    private let lock = NSLock()
    private var written: [String: (value: String, outcome: Outcome)] = [:]
    private var strange: [String] = []
    private var stopped = false
    private var size = 0

    init(cluster: LocalCluster, live: LiveSet, namespace: String) {
        self.cluster = cluster
        self.live = live
        self.namespace = namespace
    }

    /// Bytes of padding in each value from now on.
    var valueBytes: Int {
        get { lock.withLock { size } }
        set { lock.withLock { size = newValue } }
    }

    func stop() { lock.withLock { stopped = true } }

    var outcomes: [String: (value: String, outcome: Outcome)] { lock.withLock { written } }
    var unexpected: [String] { lock.withLock { strange } }
    var acknowledged: [String: String] { lock.withLock { written.filter { $0.value.outcome == .acknowledged }.mapValues(\.value) } }

    var counts: Counts {
        lock.withLock {
            var c = Counts()
            for (_, w) in written {
                switch w.outcome {
                case .acknowledged: c.acknowledged += 1
                case .refused: c.refused += 1
                case .unknown: c.unknown += 1
                }
            }
            return c
        }
    }

    func run(seconds: Double) async {
        let deadline = Date().addingTimeInterval(seconds)
        var n = 0
        while Date() < deadline, !lock.withLock({ stopped }) {
            let nodes = live.nodes
            guard !nodes.isEmpty else { return }
            n += 1
            let node = nodes[n % nodes.count]
            let key = "w\(n)"
            let value = "\(n)" + String(repeating: ".", count: valueBytes)
            let r = try? await cluster.request(node, .PUT, "/w/\(key).json?ns=\(namespace)", body: "\"\(value)\"", timeout: 5)
            let outcome: Outcome
            if r?.status == 200 {
                outcome = .acknowledged
            } else if ClusterTest.isNoSpace(r) {
                outcome = .refused
            } else if let r, r.status != 503 {
                lock.withLock { strange.append("\(key) via node \(node): \(r.status) \(r.text.prefix(160))") }
                outcome = .unknown
            } else {
                outcome = .unknown
            }
            lock.withLock { written[key] = (value, outcome) }
            if outcome != .acknowledged { try? await Task.sleep(nanoseconds: 20_000_000) }
        }
    }
}

/// One tmpfs per node, mounted over its data directory before the node first starts, so that
/// filling one node's disk leaves the others alone. A filler file in the data directory takes
/// the space (`fill`) and gives it back (`removeFiller`).
final class NodeDisks: @unchecked Sendable {
    let bytes: UInt64
    let minFree: UInt64
    /// Each node's `storage.ballast_bytes`.
    let ballast: UInt64
    private let paths: [UInt64: String]

    /// Mounts a tmpfs of `bytes` over each of `ids`' data directories; unmounts what it mounted
    /// if one fails.
    init(cluster: LocalCluster, ids: [UInt64], bytes: UInt64, minFree: UInt64, ballast: UInt64) throws {
        self.bytes = bytes
        self.minFree = minFree
        self.ballast = ballast
        var mounted: [UInt64: String] = [:]
        for id in ids {
            let path = cluster.dataDirectory(id)
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            let result = "size=\(bytes),mode=0700".withCString { Glibc.mount("tmpfs", path, "tmpfs", 0, $0) }
            guard result == 0 else {
                let reason = String(cString: strerror(errno))
                for (_, done) in mounted { Self.unmount(done) }
                throw ClusterTest.Failure(
                    "the disk-full scenario mounts a tmpfs of \(bytes >> 20) MiB over each node's data directory, and mount(2) of \(path) failed: \(reason); run it as root (or with CAP_SYS_ADMIN)")
            }
            mounted[id] = path
        }
        paths = mounted
    }

    /// Stops every node (their files are on these disks), then unmounts each.
    func unmount(stopping cluster: LocalCluster) {
        cluster.stopAll()
        for (_, path) in paths { Self.unmount(path) }
    }

    private static func unmount(_ path: String) {
        guard umount(path) != 0 else { return }
        // Something still holds a file there: detach it now, freed when the last file closes.
        if umount2(path, Int32(MNT_DETACH)) != 0 {
            FileHandle.standardError.write(Data("cannot unmount \(path): \(String(cString: strerror(errno)))\n".utf8))
        }
    }

    func freeBytes(_ id: UInt64) -> UInt64 {
        var info = statvfs()
        guard let path = paths[id], statvfs(path, &info) == 0 else { return 0 }
        return UInt64(info.f_bavail) * UInt64(info.f_frsize)
    }

    private func fillerPath(_ id: UInt64) throws -> String {
        guard let path = paths[id] else { throw ClusterTest.Failure("node \(id) has no disk of its own") }
        return path + "/disk-full-filler"
    }

    /// Appends zeros to node `id`'s filler until at most `leaving` bytes are free, or with
    /// `leaving` 0 until the file system refuses a single page (ENOSPC). Returns the filler's size.
    @discardableResult
    func fill(_ id: UInt64, leaving: UInt64) throws -> UInt64 {
        let path = try fillerPath(id)
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0o600)
        guard fd >= 0 else { throw ClusterTest.Failure("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        let zeros = [UInt8](repeating: 0, count: 1 << 20)
        var chunk = zeros.count
        // Bounded: the disk is `bytes` long, and each round writes at least a page or ends.
        for _ in 0..<(Int(bytes >> 12) + 16) {
            if leaving > 0 {
                let free = freeBytes(id)
                guard free > leaving else { break }
                chunk = Int(min(UInt64(zeros.count), max(4096, free - leaving)))
            }
            let n = zeros.withUnsafeBytes { write(fd, $0.baseAddress, chunk) }
            if n > 0 { continue }
            guard n < 0, errno == ENOSPC else { throw ClusterTest.Failure("writing \(path): \(String(cString: strerror(errno)))") }
            guard chunk > 4096 else { break }
            chunk = 4096
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw ClusterTest.Failure("cannot stat \(path)") }
        return UInt64(info.st_size)
    }

    func removeFiller(_ id: UInt64) throws {
        let path = try fillerPath(id)
        guard unlink(path) == 0 else { throw ClusterTest.Failure("cannot remove \(path): \(String(cString: strerror(errno)))") }
    }
}
