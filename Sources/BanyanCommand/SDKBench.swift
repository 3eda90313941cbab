import BanyanClient
import BanyanOps
import Dispatch
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// `banyan bench --sdk`: the Swift SDK (`BanyanClient`) against local clusters of this binary
/// (docs/benchmarks.md, "Swift SDK"):
///
/// - writes per second through one connection: `setValue` calls made back to back, each with a
///   completion block (the SDK pipelines them, at most 1,000 unanswered), timed from the first
///   call to the last completion, against a 1-node and a 3-node cluster;
/// - local event latency: from a `setValue` call to the value observer's callback on the same
///   database (latency compensation: no server round trip), one write at a time; and, for
///   comparison, to another client's callback through the cluster;
/// - memory per 10,000 cached children: a fresh database observes a list of that many children
///   (chat-message-sized); the process's heap in use (glibc `malloc_info`, every arena) and
///   resident size are read before and after, with freed memory trimmed first; the disk cache's
///   file size for the same list with persistence on.
struct SDKBench: Sendable {
    var executable: String
    var directory: String
    var writes = 20_000
    var rounds = 3
    var samples = 1_000
    var children = 10_000
    var portBase = 19_700

    struct Failure: Error, CustomStringConvertible { var description: String }

    func run(log: @escaping @Sendable (String) -> Void) async throws {
        try? FileManager.default.removeItem(atPath: directory)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        log("\(ProcessInfo.processInfo.activeProcessorCount) cores; load average before: \(Self.loadAverage())")
        for nodes in [1, 3] {
            let offset = nodes == 1 ? 0 : 10
            let cluster = LocalCluster(
                executable: executable, directory: "\(directory)/cluster\(nodes)", nodes: nodes, clientPortBase: portBase + offset,
                peerPortBase: portBase + 100 + offset, logLevel: "warning")
            defer { cluster.shutdown() }
            for id in 1...UInt64(nodes) { try cluster.start(id) }
            let leader = try await cluster.waitForLeader(timeout: 30)
            for id in cluster.ids where !cluster.isRunning(id) {
                throw Failure(description: "node \(id) exited right after starting (ports in use?); see \(directory)/cluster\(nodes)/node\(id).log")
            }
            let others = cluster.ids.dropFirst().map { "127.0.0.1:\(cluster.clientPort($0))" }
            log("== \(nodes)-node cluster (leader: node \(leader)); the SDK's connection is to node 1 ==")
            let db = try Database(
                url: "http://127.0.0.1:\(cluster.clientPort(1))?ns=sdkbench", nodes: others, authToken: "owner",
                callbackQueue: DispatchQueue(label: "bench.callbacks"))
            defer { db.shutdown() }
            try Self.waitConnected(db)
            _ = try Self.pipelined(db, count: 1_000, path: "warm")

            var rates: [Double] = []
            for round in 1...rounds {
                let (seconds, errors) = try Self.pipelined(db, count: writes, path: "round\(round)")
                rates.append(Double(writes) / seconds)
                log(String(format: "round %d: %d setValue calls, each with a completion, in %.2f s: %.0f writes/s (%d errors)", round, writes, seconds, Double(writes) / seconds, errors))
            }
            log(String(format: "SDK writes per second through one connection, %d-node cluster: median %.0f (of %d rounds)", nodes, rates.sorted()[rates.count / 2], rounds))
            try observedRounds(db, log: log)

            let local = try Self.latencies(writer: db, reader: db, path: "latency/local", samples: samples)
            log(String(format: "local event latency (setValue call → value callback, same database), %d writes one at a time: p50 %.1f µs, p99 %.1f µs, max %.1f µs", samples, local.p50 * 1e6, local.p99 * 1e6, local.max * 1e6))
            let far = cluster.ids.last ?? 1
            let reader = try Database(
                url: "http://127.0.0.1:\(cluster.clientPort(far))?ns=sdkbench", authToken: "owner", callbackQueue: DispatchQueue(label: "bench.reader"))
            defer { reader.shutdown() }
            try Self.waitConnected(reader)
            let remote = try Self.latencies(writer: db, reader: reader, path: "latency/remote", samples: min(samples, 500))
            log(String(format: "another client's event (setValue on node 1 → value callback of a database on node %d): p50 %.2f ms, p99 %.2f ms", far, remote.p50 * 1e3, remote.p99 * 1e3))

            if nodes == 1 { try memory(cluster: cluster, writer: db, log: log) }
        }
        log("load average after: \(Self.loadAverage())")
    }

    // MARK: - Writes

    final class Countdown: @unchecked Sendable {
        private let lock = NSLock()
        private var left: Int
        private var failures = 0
        var errors: Int { lock.withLock { failures } }
        let done = DispatchSemaphore(value: 0)
        init(_ count: Int) { left = count }
        func hit(_ error: (any Error)?) {
            let finished = lock.withLock {
                if error != nil { failures += 1 }
                left -= 1
                return left == 0
            }
            if finished { done.signal() }
        }
    }

    /// `count` setValue calls back to back, each with a completion: seconds from the first call
    /// to the last completion, and how many completions carried an error.
    static func pipelined(_ db: Database, count: Int, path: String) throws -> (Double, Int) {
        let countdown = Countdown(count)
        let ref = db.reference(withPath: "bench").child(path)
        let start = DispatchTime.now().uptimeNanoseconds
        for i in 0..<count {
            ref.child("m\(i)").setValue(["name": "user\(i % 16)", "text": "message number \(i)", "n": i]) { error, _ in countdown.hit(error) }
        }
        guard countdown.done.wait(timeout: .now() + 600) == .success else { throw Failure(description: "\(count) writes did not complete within 600 s") }
        return (Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9, countdown.errors)
    }

    /// Writes under an observer of the list they go to: the same rounds, with a plain
    /// `childAdded` observer of the location, then with a limited window
    /// (`queryOrdered(byChild: "n").queryLimited(toLast: 100)`, which every write enters and
    /// one child leaves): what a backlog of writes costs the views above it.
    func observedRounds(_ db: Database, log: @escaping @Sendable (String) -> Void) throws {
        for (name, window) in [("a plain childAdded observer", false), ("a limited window (orderBy n, last 100)", true)] {
            var rates: [Double] = []
            for round in 1...rounds {
                let path = "\(window ? "window" : "plain")\(round)"
                let location = db.reference(withPath: "bench").child(path)
                let observed: DatabaseQuery = window ? location.queryOrdered(byChild: "n").queryLimited(toLast: 100) : location
                let events = Countdown(Int.max)
                let handle = observed.observe(.childAdded) { _ in events.hit(nil) }
                let (seconds, errors) = try Self.pipelined(db, count: writes, path: path)
                db.reference().removeObserver(withHandle: handle)
                rates.append(Double(writes) / seconds)
                log(String(format: "under %@, round %d: %d setValue calls in %.2f s: %.0f writes/s (%d errors)", name, round, writes, seconds, Double(writes) / seconds, errors))
            }
            log(String(format: "SDK writes per second under %@: median %.0f", name, rates.sorted()[rates.count / 2]))
        }
    }

    // MARK: - Latency

    /// Times one write at a time: armed with the value to wait for just before the call; the
    /// observer's callback reads the clock when it sees it.
    final class Probe: @unchecked Sendable {
        private let lock = NSLock()
        private var expected = -1
        private var started: UInt64 = 0
        private var elapsed: Double = 0
        let seen = DispatchSemaphore(value: 0)
        func arm(_ value: Int) {
            lock.withLock {
                expected = value
                started = DispatchTime.now().uptimeNanoseconds
            }
        }
        func observed(_ value: Int?) {
            let now = DispatchTime.now().uptimeNanoseconds
            let hit = lock.withLock {
                guard value == expected else { return false }
                expected = -1
                elapsed = Double(now - started) / 1e9
                return true
            }
            if hit { seen.signal() }
        }
        var last: Double { lock.withLock { elapsed } }
    }

    struct Percentiles {
        var p50: Double
        var p99: Double
        var max: Double
    }

    static func latencies(writer: Database, reader: Database, path: String, samples: Int) throws -> Percentiles {
        let probe = Probe()
        let ready = DispatchSemaphore(value: 0)
        let target = reader.reference(withPath: "bench").child(path)
        let handle = target.observe(.value) { s in
            if s.value == nil { ready.signal() }
            probe.observed(s.value as? Int)
        }
        defer { target.removeObserver(withHandle: handle) }
        writer.reference(withPath: "bench").child(path).removeValue()
        guard ready.wait(timeout: .now() + 30) == .success else { throw Failure(description: "no first value event at \(path)") }
        let ref = writer.reference(withPath: "bench").child(path)
        var times: [Double] = []
        for i in 1...(samples + 50) {
            probe.arm(i)
            ref.setValue(i)
            guard probe.seen.wait(timeout: .now() + 30) == .success else { throw Failure(description: "write \(i) at \(path) raised no event within 30 s") }
            if i > 50 { times.append(probe.last) }  // the first 50 warm up
        }
        times.sort()
        return Percentiles(p50: times[times.count / 2], p99: times[min(times.count - 1, times.count * 99 / 100)], max: times.last ?? 0)
    }

    // MARK: - Memory

    func memory(cluster: LocalCluster, writer: Database, log: @escaping @Sendable (String) -> Void) throws {
        // The list: chat-message-sized children under push-id-like keys, written in batches.
        let list = writer.reference(withPath: "bench/list")
        var jsonBytes = 0
        var batchStart = 0
        while batchStart < children {
            let upper = min(children, batchStart + 1_000)
            var batch: [AnyHashable: Any] = [:]
            for i in batchStart..<upper {
                let child: [String: Any] = ["name": "user\(i % 16)", "text": "message number \(i) in the list", "at": 1_760_000_000_000 + i]
                let key = String(format: "m%08d", i)
                batch[key] = child
                jsonBytes += (try JSONSerialization.data(withJSONObject: child)).count + key.utf8.count + 4
            }
            let done = DispatchSemaphore(value: 0)
            let failed = Countdown(1)
            list.updateChildValues(batch) { error, _ in
                failed.hit(error)
                done.signal()
            }
            guard done.wait(timeout: .now() + 120) == .success, failed.errors == 0 else { throw Failure(description: "could not write the list") }
            batchStart = upper
        }

        // A fresh database, connected and idle, then observing the list.
        let url = "http://127.0.0.1:\(cluster.clientPort(1))?ns=sdkbench"
        let fresh = try Database(url: url, authToken: "owner", callbackQueue: DispatchQueue(label: "bench.memory"))
        defer { fresh.shutdown() }
        try Self.waitConnected(fresh)
        let before = Self.memoryNow()
        let synced = DispatchSemaphore(value: 0)
        let expected = UInt(children)
        fresh.reference(withPath: "bench/list").observe(.value) { s in
            if s.childrenCount == expected { synced.signal() }
        }
        guard synced.wait(timeout: .now() + 120) == .success else { throw Failure(description: "the list did not sync") }
        Thread.sleep(forTimeInterval: 0.5)
        let after = Self.memoryNow()
        let heap = (after.heap - before.heap) * 10_000 / Double(children)
        let rss = (after.rss - before.rss) * 10_000 / Double(children)
        log(
            String(
                format: "memory per 10,000 cached children (a database observing a list of %d, about %.0f bytes of JSON each): heap in use +%.2f MiB (%.0f bytes a child), resident +%.2f MiB",
                children, Double(jsonBytes) / Double(children), heap / 1_048_576, heap / 10_000, rss / 1_048_576))

        // The same list in the disk cache (persistence on; file size once synced).
        let cacheDirectory = URL(fileURLWithPath: directory).appendingPathComponent("client-cache")
        let cached = try Database(url: url, authToken: "owner", callbackQueue: DispatchQueue(label: "bench.cache"))
        cached.isPersistenceEnabled = true
        cached.persistenceDirectory = cacheDirectory
        cached.persistenceCacheSizeBytes = 100 << 20
        let cachedSync = DispatchSemaphore(value: 0)
        cached.reference(withPath: "bench/list").observe(.value) { s in
            if s.childrenCount == expected { cachedSync.signal() }
        }
        guard cachedSync.wait(timeout: .now() + 120) == .success else { throw Failure(description: "the list did not sync with persistence on") }
        Thread.sleep(forTimeInterval: 0.5)
        cached.shutdown()
        let files = (try? FileManager.default.contentsOfDirectory(atPath: cacheDirectory.path)) ?? []
        let size = files.reduce(0) { total, name in
            total + ((try? FileManager.default.attributesOfItem(atPath: cacheDirectory.appendingPathComponent(name).path)[.size] as? Int) ?? 0)
        }
        log(String(format: "disk cache for the same list (persistence on): %.2f MiB for %d children (%.0f bytes a child)", Double(size) / 1_048_576, children, Double(size) / Double(children)))
    }

    /// Heap bytes in use across every malloc arena, and resident bytes (after returning freed
    /// memory to the system).
    static func memoryNow() -> (heap: Double, rss: Double) {
        #if canImport(Glibc)
        if let trim = glibc("malloc_trim") { _ = unsafeBitCast(trim, to: (@convention(c) (Int) -> Int32).self)(0) }
        #endif
        let rss = ClusterBench.residentMiB(getpid()) * 1_048_576
        return (Double(heapInUse() ?? 0), rss)
    }

    /// glibc's `malloc_info` totals (every arena): the system bytes held minus the free ones
    /// (fast bins and the rest), plus the mmapped chunks.
    static func heapInUse() -> Int? {
        #if canImport(Glibc)
        var buffer: UnsafeMutablePointer<CChar>?
        var length = 0
        guard let info = glibc("malloc_info"), let stream = open_memstream(&buffer, &length) else { return nil }
        _ = unsafeBitCast(info, to: (@convention(c) (Int32, UnsafeMutablePointer<FILE>?) -> Int32).self)(0, stream)
        fclose(stream)
        guard let buffer else { return nil }
        defer { free(buffer) }
        let xml = String(cString: buffer)
        // The totals follow the last </heap>.
        guard let tail = xml.range(of: "</heap>", options: .backwards).map({ xml[$0.upperBound...] }) else { return nil }
        func size(_ marker: String) -> Int? {
            guard let r = tail.range(of: marker) else { return nil }
            let rest = tail[r.upperBound...]
            guard let open = rest.range(of: "size=\""), let close = rest[open.upperBound...].firstIndex(of: "\"") else { return nil }
            return Int(rest[open.upperBound..<close])
        }
        guard let system = size("<system type=\"current\""), let fast = size("<total type=\"fast\""), let freeBytes = size("<total type=\"rest\"") else { return nil }
        return system - fast - freeBytes + (size("<total type=\"mmap\"") ?? 0)
        #else
        return nil
        #endif
    }

    #if canImport(Glibc)
    /// A glibc function the Glibc module does not import (`malloc.h`), looked up by name.
    static func glibc(_ name: String) -> UnsafeMutableRawPointer? { dlsym(dlopen(nil, RTLD_NOW), name) }
    #endif

    // MARK: - Helpers

    static func waitConnected(_ db: Database) throws {
        let connected = DispatchSemaphore(value: 0)
        let ref = db.reference(withPath: ".info/connected")
        let handle = ref.observe(.value) { s in if s.value as? Bool == true { connected.signal() } }
        defer { ref.removeObserver(withHandle: handle) }
        guard connected.wait(timeout: .now() + 30) == .success else { throw Failure(description: "the SDK did not connect within 30 s") }
    }

    static func loadAverage() -> String {
        ((try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8)) ?? "?").split(separator: " ").prefix(3).joined(separator: " ")
    }
}
