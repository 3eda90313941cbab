import BanyanAuth
import BanyanBasics
import BanyanOpLog
import BanyanOpLogFiles
import BanyanQuery
import BanyanStateMachine
import BanyanTree
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// `swift run -c release banyan-bench [tree|window|json|oplog|snapshot|raft|sim|codec|password|tokens|rules|quota|all]`: prints the figures recorded in
/// docs/benchmarks.md. Deterministic inputs (seeded); wall-clock timing on one core.
@main
enum BanyanBench {
    static func main() {
        let args = CommandLine.arguments.dropFirst()
        if args.first == "snapshot-load-child" {
            // A fresh process that loads one snapshot once (see `coldLoads`).
            snapshotLoadChild(Array(args.dropFirst()))
            return
        }
        let which = Set(args.isEmpty ? ["all"] : Array(args))
        let all = which.contains("all")
        print("banyan-bench: \(machine())")
        if all || which.contains("tree") { treeSets() }
        if all || which.contains("window") { windows() }
        if all || which.contains("json") { json() }
        if all || which.contains("oplog") { oplog() }
        if all || which.contains("snapshot") { snapshot() }
        if all || which.contains("raft") { raft() }
        if all || which.contains("sim") { simulation() }
        if all || which.contains("codec") { codec() }
        if all || which.contains("password") { passwords() }
        if all || which.contains("tokens") { tokenBench() }
        if all || which.contains("rules") { rulesBench() }
        if all || which.contains("quota") { quotaBench() }
    }

    // MARK: Password hashing (the account service, docs/accounts.md)

    /// scrypt (r = 8, p = 1) at each cost the account service can be configured with: time per
    /// hash (median of `runs`), and the memory scrypt asks for (128 · r · N). A sign-in costs one
    /// hash, a sign-up or password change one more.
    static func passwords() {
        print("password hashing (scrypt, r=8, p=1, 16-byte salt, 32-byte hash; one thread):")
        let salt = [UInt8](repeating: 7, count: PasswordHasher.saltBytes)
        for logN in [10, 12, 14, 15, 16] {
            let hasher = PasswordHasher(logN: logN, blockSize: 8, parallelism: 1)
            let runs = logN >= 15 ? 5 : 9
            var times: [Double] = []
            var stored = ""
            for _ in 0..<runs { times.append(seconds { stored = (try? hasher.hash("correct horse battery staple", salt: salt)) ?? "" }) }
            times.sort()
            let verify = seconds { _ = PasswordHasher.verify("correct horse battery staple", against: stored) }
            let mib = 128 * 8 * (1 << logN) / (1 << 20)
            let marker = logN == PasswordHasher.standard.logN ? "  (the default)" : ""
            print(
                "  N=2^\(logN): \(format(times[runs / 2] * 1000)) ms per hash (min \(format(times[0] * 1000)), max \(format(times[runs - 1] * 1000))), "
                    + "verify \(format(verify * 1000)) ms, \(mib) MiB, \(format(1 / times[runs / 2])) hashes/s per thread\(marker)")
        }
    }

    static func machine() -> String {
        var info = utsname()
        uname(&info)
        let release = withUnsafeBytes(of: info.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        return "\(ProcessInfo.processInfo.activeProcessorCount) cores, Linux \(release)"
    }

    static func seconds(_ body: () -> Void) -> Double {
        let start = ContinuousClock.now
        body()
        let d = ContinuousClock.now - start
        return Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
    }

    static func rss() -> String {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return "?" }
        return status.split(separator: "\n").first { $0.hasPrefix("VmRSS") }.map { String($0.dropFirst(6)).trimmingCharacters(in: .whitespaces) } ?? "?"
    }

    static func format(_ x: Double) -> String { String(format: "%.2f", x) }

    // MARK: Sets at depth 4 on a 1M-leaf tree

    static let fanout = Int(ProcessInfo.processInfo.environment["BANYAN_BENCH_FANOUT"] ?? "32") ?? 32

    static func keys(_ level: Int) -> [ChildKey] {
        (0..<fanout).map { ChildKey(unchecked: "l\(level)k\($0)") }
    }

    static func buildTree() -> Tree {
        let k = (0..<4).map(keys)
        var level3: [Tree] = []
        for i in 0..<fanout {
            _ = i
            level3.append(Tree(sortedChildren: k[3].sorted().enumerated().map { ($0.element, Tree(.int(Int64($0.offset)))) }))
        }
        func level(_ depth: Int, _ below: Tree) -> Tree {
            Tree(sortedChildren: k[depth].sorted().map { ($0, below) })
        }
        // Children share structure at first; the benchmark's writes make paths unique as they go.
        return level(0, level(1, level(2, level3[0])))
    }

    static func treeSets() {
        print("\n== sets at depth 4 on a tree of 1,048,576 leaves (32^4) ==")
        var tree = Tree.empty
        let k = (0..<4).map(keys)
        let build = seconds {
            // Build with real, unshared storage: one set per leaf.
            var t = Tree.empty
            for a in k[0] {
                for b in k[1] {
                    for c in k[2] {
                        for d in k[3] { t.set(Tree(.int(1)), at: Path(segments: [a, b, c, d])) }
                    }
                }
            }
            tree = t
        }
        print("build by 1,048,576 sets: \(format(build)) s (\(Int(1_048_576 / build)) sets/s), leaves \(tree.leafCount), RSS \(rss())")

        var rng = SeededRandom(seed: 1)
        let count = 2_000_000
        var paths: [Path] = []
        paths.reserveCapacity(count)
        for _ in 0..<count {
            paths.append(Path(segments: [k[0][rng.below(fanout)], k[1][rng.below(fanout)], k[2][rng.below(fanout)], k[3][rng.below(fanout)]]))
        }
        let values = (0..<1024).map { Tree(.int(Int64($0))) }

        let inPlace = seconds {
            for i in 0..<count { tree.set(values[i & 1023], at: paths[i]) }
        }
        print("sets, tree not shared (in place): \(Int(Double(count) / inPlace)) sets/s (\(format(inPlace * 1e9 / Double(count))) ns/set)")

        var versions: [Tree] = []
        versions.reserveCapacity(16)
        let persistentCount = 500_000
        let persistent = seconds {
            for i in 0..<persistentCount {
                // Keep the previous version alive, as a snapshot or an event cache would.
                if versions.count == 16 { versions.removeAll(keepingCapacity: true) }
                versions.append(tree)
                tree.set(values[i & 1023], at: paths[i])
            }
        }
        versions.removeAll()
        print("sets, previous version retained (path copy): \(Int(Double(persistentCount) / persistent)) sets/s (\(format(persistent * 1e9 / Double(persistentCount))) ns/set)")

        let reads = seconds {
            var sum = 0
            for i in 0..<count where tree.child(at: paths[i]).leaf != nil { sum += 1 }
            precondition(sum == count)
        }
        print("reads at depth 4: \(Int(Double(count) / reads)) reads/s")
    }

    // MARK: Limited window under random updates

    static func windows() {
        print("\n== limit-100 window (orderByChild score, limitToFirst 100) under random updates ==")
        for size in [10_000, 100_000, 1_000_000] {
            window(size: size, last: false)
        }
        window(size: 100_000, last: true)
    }

    static func window(size: Int, last: Bool) {
        var rng = SeededRandom(seed: UInt64(size))
        let scoreKey = ChildKey(unchecked: "score")
        let keys = (0..<size).map { ChildKey(unchecked: "item\($0)") }
        var children: [(ChildKey, Tree)] = keys.map { key in
            (key, Tree(sortedChildren: [(scoreKey, Tree(.int(Int64(rng.below(1_000_000)))))]))
        }
        children.sort { $0.0 < $1.0 }
        var node = Tree(sortedChildren: children)
        var query = Query()
        do {
            query = try query.orderByChild("score")
            query = try last ? query.limitToLast(100) : query.limitToFirst(100)
        } catch {
            print("query error: \(error)")
            return
        }
        var view = QueryView(params: query.params, tree: node)
        let changes = 200_000
        var total = Duration.zero
        var events = 0
        var worst = Duration.zero
        for _ in 0..<changes {
            let key = keys[rng.below(size)]
            // Half the updates land near the window's edge so that children enter and leave it.
            let score = rng.below(2) == 0 ? rng.below(1_000_000) : (last ? 1_000_000 - rng.below(2_000) : rng.below(2_000))
            node.set(Tree(.int(Int64(score))), at: Path(segments: [key, scoreKey]))
            let start = ContinuousClock.now
            let produced = view.apply(node, changes: .keys([key]))
            let d = ContinuousClock.now - start
            total += d
            if d > worst { worst = d }
            events += produced.count
        }
        let perChange = (Double(total.components.seconds) * 1e9 + Double(total.components.attoseconds) / 1e9) / Double(changes)
        print("\(size) children, \(last ? "limitToLast" : "limitToFirst"): \(format(perChange / 1000)) µs per change (\(events) events for \(changes) changes, worst \(worst))")
    }

    // MARK: JSON

    static func json() {
        print("\n== JSON encode/decode ==")
        let root = document()
        var bytes: [UInt8] = []
        var best = Double.infinity
        for _ in 0..<3 {
            bytes = []
            best = min(best, seconds { bytes = JSONWriter.bytes(root) })
        }
        let mb = Double(bytes.count) / 1_000_000
        print("document: \(format(mb)) MB, \(root.leafCount) leaves")
        print("encode: \(format(mb / best)) MB/s")
        var decoded = Tree.empty
        best = Double.infinity
        for _ in 0..<3 {
            decoded = .empty  // free the previous result outside the timed section
            best = min(best, seconds {
                do { decoded = try TreeReader.read(bytes) } catch { print("decode error: \(error)") }
            })
        }
        print("decode: \(format(mb / best)) MB/s (round trip equal: \(decoded == root))")
        var plain = Double.infinity
        for _ in 0..<3 {
            plain = min(plain, seconds { _ = try? JSONValue(parsing: bytes, maxDepth: 64) })
        }
        print("decode to JSONValue (no tree): \(format(mb / plain)) MB/s")
        let hashTime = seconds { _ = root.hashString }
        print("hash of the whole document: \(format(hashTime * 1000)) ms (\(format(mb / hashTime)) MB/s of JSON)")
    }

    /// The JSON benchmark's document: 200,000 users with 5 leaves each (1M leaves).
    static func document() -> Tree {
        var rng = SeededRandom(seed: 3)
        var root = Tree.empty
        let words = ["alpha", "beta", "gamma", "delta", "Ünïcödé", "line\nbreak", "quote\"d", "a longer string value used as a description field"]
        for i in 0..<200_000 {
            let id = ChildKey(unchecked: "user\(i)")
            var user = Tree.empty
            user.set(Tree(.string(words[rng.below(words.count)])), at: Path(segments: [ChildKey(unchecked: "name")]))
            user.set(Tree(.int(Int64(rng.below(100_000)))), at: Path(segments: [ChildKey(unchecked: "score")]))
            user.set(Tree(.double(Double(rng.below(100_000)) / 7)), at: Path(segments: [ChildKey(unchecked: "ratio")]))
            user.set(Tree(.bool(rng.below(2) == 0)), at: Path(segments: [ChildKey(unchecked: "active")]))
            user.set(Tree(.string("2026-11-\(10 + rng.below(20))T12:00:00Z")), at: Path(segments: [ChildKey(unchecked: "joined"), ChildKey(unchecked: "at")]))
            root.set(user, at: Path(segments: [ChildKey(unchecked: "users"), id]))
        }
        return root
    }

    // MARK: Operation log on this machine's disk

    static func oplog() {
        print("\n== operation log: 100-byte records on this disk ==")
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("banyan-bench-\(getpid())").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        let fs = PosixFileSystem()
        do {
            try fs.makeDirectory(root)
            // Raw fsync latency: 100 bytes then fdatasync, on a plain file.
            let raw = try fs.create(root + "/raw")
            var latencies: [Double] = []
            for _ in 0..<300 {
                let t = seconds {
                    try? fs.append(raw, [UInt8](repeating: 7, count: 100))
                    try? fs.sync(raw)
                }
                latencies.append(t * 1e6)
            }
            fs.close(raw)
            latencies.sort()
            print("raw write+fdatasync: p50 \(format(latencies[latencies.count / 2])) µs, p99 \(format(latencies[latencies.count * 99 / 100])) µs")

            func records(_ range: ClosedRange<UInt64>) -> [LogRecord] {
                range.map { LogRecord(index: $0, term: 1, kind: 1, payload: [UInt8](repeating: UInt8($0 & 0xFF), count: 100)) }
            }
            var everyRecord = SegmentedLog.Options()
            everyRecord.syncEveryRecord = true
            let single = try SegmentedLog(directory: root + "/single", fileSystem: fs, options: everyRecord)
            let n = 2_000
            let singleTime = try timed {
                try single.append(records(1...UInt64(n)))
            }
            print("fsync per record (syncEveryRecord mode, one append of \(n)): \(Int(Double(n) / singleTime)) records/s durable")

            let group = try SegmentedLog(directory: root + "/group", fileSystem: fs)
            let total: UInt64 = 1_000_000
            let batch: UInt64 = 1_000
            var next: UInt64 = 1
            let groupTime = try timed {
                while next <= total {
                    try group.append(records(next...(next + batch - 1)))
                    try group.sync()
                    next += batch
                }
            }
            print("synchronous batches (1,000 records per append + fdatasync, one caller; the upper bound for group commit): \(Int(Double(total) / groupTime)) records/s durable (\(total) records)")

            // Durable latency at fixed offered rates, through the group-commit writer (the real
            // concurrent path: GroupCommitLog with its own writer).
            for rate in [1_000, 10_000, 100_000] {
                let committer = GroupCommitLog(log: try SegmentedLog(directory: root + "/rate\(rate)", fileSystem: PosixFileSystem()))
                let count = Swift.min(rate * 2, 200_000)
                let latencies = LatencyRecorder(count: count)
                let payload = [UInt8](repeating: 9, count: 100)
                let start = ContinuousClock.now
                let perMillisecond = Swift.max(1, rate / 1_000)
                var sent = 0
                while sent < count {
                    // Pace: submit this millisecond's share, then wait for the next millisecond.
                    let due = start.advanced(by: .milliseconds(sent / perMillisecond))
                    while ContinuousClock.now < due {}
                    for _ in 0..<Swift.min(perMillisecond, count - sent) {
                        let slot = sent
                        // Latency counts from when the record was due, so a submitter falling
                        // behind shows up as latency instead of hiding it.
                        let submitted = due
                        committer.submit(term: 1, kind: 1, payload: payload) { _ in
                            latencies.record(slot, ContinuousClock.now - submitted)
                        }
                        sent += 1
                    }
                }
                let (p50, p99, done) = latencies.wait()
                let stats = committer.batches
                print("offered \(rate) appends/s: p50 \(format(p50)) µs, p99 \(format(p99)) µs durable (\(done) records, \(stats.batches) syncs, \(format(Double(stats.records) / Double(Swift.max(1, stats.batches)))) per sync)")
            }

            // Saturated: one producer submits as fast as it can; the writer batches what arrives.
            do {
                let committer = GroupCommitLog(log: try SegmentedLog(directory: root + "/saturated", fileSystem: PosixFileSystem()))
                let count = 500_000
                let latencies = LatencyRecorder(count: count)
                let payload = [UInt8](repeating: 5, count: 100)
                let start = ContinuousClock.now
                for slot in 0..<count {
                    committer.submit(term: 1, kind: 1, payload: payload) { _ in latencies.record(slot, ContinuousClock.now - start) }
                }
                _ = latencies.wait()
                let elapsed = ContinuousClock.now - start
                let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
                let stats = committer.batches
                print("group commit writer, saturated (GroupCommitLog, \(count) submissions): \(Int(Double(count) / seconds)) records/s durable, \(stats.batches) syncs (\(format(Double(stats.records) / Double(Swift.max(1, stats.batches)))) per sync)")
            }

            var report = ""
            let recoveryTime = try timed {
                let reopened = try SegmentedLog(directory: root + "/group", fileSystem: fs)
                report = "\(reopened.recovery.records) records in \(reopened.recovery.segments) segments"
            }
            print("recovery scan: \(Int(Double(total) / recoveryTime)) records/s (\(report), \(format(recoveryTime)) s)")
        } catch {
            print("oplog benchmark failed: \(error)")
        }
    }

    static func timed(_ body: () throws -> Void) throws -> Double {
        let start = ContinuousClock.now
        try body()
        let d = ContinuousClock.now - start
        return Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
    }

    // MARK: Snapshots of a 1M-leaf tree

    static func snapshot() {
        print("\n== snapshot of the 1M-leaf document (state machine image, zlib level 1) ==")
        let root = document()
        let json = Double(JSONWriter.bytes(root, format: .export).count) / 1_000_000
        // BANYAN_BENCH_SNAPSHOT_DIR keeps the snapshots for profiling the child on its own.
        let kept = ProcessInfo.processInfo.environment["BANYAN_BENCH_SNAPSHOT_DIR"]
        let dir = kept ?? FileManager.default.temporaryDirectory.appendingPathComponent("banyan-snap-\(getpid())").path
        defer { if kept == nil { try? FileManager.default.removeItem(atPath: dir) } }
        do {
            let fs = PosixFileSystem()
            let store = try SnapshotStore(directory: dir, fileSystem: fs)
            var imageBytes: UInt64 = 0
            // The node's snapshot: a state machine image whose default namespace holds the document.
            let machine = StateMachine(namespaces: ["": root], appliedIndex: 1)
            for run in 1...3 {
                let writeTime = try timed {
                    try store.write(SnapshotMetaRecord(lastIndex: UInt64(run), lastTerm: 1), progress: { imageBytes = $0 }) { emit in
                        try machine.writeImage(chunkBytes: 1 << 20, emit: emit)
                    }
                }
                let file = try fs.readAll(dir + "/" + SnapshotFormat.fileName(lastIndex: UInt64(run))).count
                var loaded = Tree.empty
                let loadTime = try timed { loaded = try load(store).tree }
                let mb = Double(imageBytes) / 1_000_000
                print("run \(run): image \(format(mb)) MB (JSON export \(format(json)) MB) -> file \(format(Double(file) / 1_000_000)) MB; write (stream + compress + fsync + install) \(format(mb / writeTime)) MB/s; load (read + inflate + verify + parse) \(format(mb / loadTime)) MB/s; in JSON-equivalent MB/s: write \(format(json / writeTime)), load \(format(json / loadTime)); equal: \(loaded == root)")
            }
            coldLoads(directory: dir, expectedHash: root.hashString)
        } catch {
            print("snapshot benchmark failed: \(error)")
        }
    }

    /// The first load in a fresh process, as a restarting node does it: this executable is run
    /// again as a child that opens the snapshot directory, loads the newest snapshot once (timed)
    /// and reports; nothing else runs in the child before the timed load.
    static func coldLoads(directory: String, expectedHash: String) {
        let runs = Int(ProcessInfo.processInfo.environment["BANYAN_BENCH_COLD_RUNS"] ?? "5") ?? 5
        var figures: [Double] = []
        for run in 1...runs {
            let child = Process()
            child.executableURL = URL(fileURLWithPath: CommandLine.arguments[0])
            child.arguments = ["snapshot-load-child", directory, "hash"]
            let pipe = Pipe()
            child.standardOutput = pipe
            do {
                try child.run()
            } catch {
                print("cold load: could not start the child: \(error)")
                return
            }
            let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            child.waitUntilExit()
            let fields = output.split(separator: " ")
            guard child.terminationStatus == 0, fields.count >= 2, let mbps = Double(fields[0]) else {
                print("cold load \(run): the child failed: \(output)")
                return
            }
            figures.append(mbps)
            let equal = fields[1].trimmingCharacters(in: .whitespacesAndNewlines) == expectedHash
            print("cold load \(run) (fresh process, first load): \(format(mbps)) MB/s \(fields.dropFirst(2).joined(separator: " ").trimmingCharacters(in: .whitespacesAndNewlines)); equal: \(equal)")
        }
        figures.sort()
        print("cold load: median \(format(figures[figures.count / 2])) MB/s, range \(format(figures[0]))–\(format(figures[figures.count - 1])) (\(runs) fresh processes)")
    }

    /// A snapshot load as a node does it (`NodeStorage.load`): the state machine image streams
    /// from the file through inflate into the state machine's and tree's readers (no copy of the
    /// whole image), checked against its length and checksum.
    static func load(_ store: SnapshotStore) throws -> (tree: Tree, imageBytes: UInt64) {
        try store.readImage { image in
            let machine = try StateMachine(limits: .snapshot, maxLength: Int(clamping: image.imageLength)) { try image.read(into: $0) }
            return (machine.tree(""), image.imageLength)
        }
    }

    /// The child side of `coldLoads`: prints "<MB/s> <hash of the loaded tree> <details>".
    static func snapshotLoadChild(_ args: [String]) {
        guard let directory = args.first else {
            print("usage: banyan-bench snapshot-load-child <snapshot directory>")
            exit(2)
        }
        do {
            var before = rusage()
            getrusage(Int32(RUSAGE_SELF.rawValue), &before)
            let store = try SnapshotStore(directory: directory, fileSystem: PosixFileSystem())
            var loaded = (tree: Tree.empty, imageBytes: UInt64(0))
            let loadTime = try timed { loaded = try load(store) }
            var after = rusage()
            getrusage(Int32(RUSAGE_SELF.rawValue), &after)
            let faults = after.ru_minflt - before.ru_minflt
            func ms(_ t: timeval) -> Double { Double(t.tv_sec) * 1000 + Double(t.tv_usec) / 1000 }
            let user = ms(after.ru_utime) - ms(before.ru_utime)
            let system = ms(after.ru_stime) - ms(before.ru_stime)
            let mbps = Double(loaded.imageBytes) / 1_000_000 / loadTime
            // The hash (to check the load against the original) is computed after the timed part.
            let hash = args.dropFirst().first == "hash" ? loaded.tree.hashString : "-"
            print("\(format(mbps)) \(hash) (\(format(loadTime * 1000)) ms: user \(format(user)), system \(format(system)); \(faults) page faults, RSS \(rss()))")
            // Exit with the tree still alive: freeing it is not part of a load.
            fflush(nil)
            exit(0)
        } catch {
            print("load failed: \(error)")
            exit(1)
        }
    }
}

/// Collects per-record latencies from the writer thread (benchmark only).
final class LatencyRecorder: @unchecked Sendable {
    // @unchecked Sendable: every field is guarded by `lock`.
    private let lock = NSCondition()
    private var values: [Double]
    private var done = 0

    init(count: Int) { values = [Double](repeating: 0, count: count) }

    func record(_ slot: Int, _ duration: Duration) {
        lock.lock()
        values[slot] = Double(duration.components.seconds) * 1e6 + Double(duration.components.attoseconds) / 1e12
        done += 1
        if done == values.count { lock.signal() }
        lock.unlock()
    }

    func wait() -> (Double, Double, Int) {
        lock.lock()
        while done < values.count { lock.wait() }
        let sorted = values.sorted()
        lock.unlock()
        return (sorted[sorted.count / 2], sorted[sorted.count * 99 / 100], sorted.count)
    }
}
