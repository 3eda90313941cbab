public import BanyanCheckers
import Foundation
import NIOCore
import NIOHTTP1
import Synchronization

/// A client workload over the REST API for the multi-process tests: concurrent clients read,
/// write and compare-and-set (GET with an ETag, then a conditional PUT) integer registers
/// through random nodes, and every operation is recorded for the linearizability checker.
public final class RegisterWorkload: @unchecked Sendable {
    public typealias Op = HistoryOperation<RegisterModel.Input, RegisterModel.Output>

    public struct Counts: Sendable, CustomStringConvertible {
        public var ok = 0
        public var failed = 0
        public var unknown = 0
        public var description: String { "\(ok) acknowledged, \(failed) failed cleanly, \(unknown) with unknown outcome" }
    }

    let cluster: any NodeRequester
    /// The registers the clients use.
    public let keys: [String]
    let namespace: String
    /// When the workload was created (`DispatchTime` uptime nanoseconds): operation times count from here.
    public let start = DispatchTime.now().uptimeNanoseconds
    private let state = Mutex<(ops: [(key: String, op: Op)], nextValue: Int, counts: Counts, started: Int)>(([], 1, Counts(), 0))
    /// Operations `run` starts at most: the history is held whole for the checker, so a long
    /// run (`chaos check --seconds 86400`) stops its register clients at this many, instead of
    /// growing for the whole run. Each started operation is recorded (a write that applied but
    /// went unrecorded would make later reads unexplainable): the history holds at most twice
    /// as many (a compare-and-set records its read too), plus the final reads.
    public let maxOperations: Int

    private let stopped = Atomic<Bool>(false)

    /// Every request the clients made (a read, a write, each half of a compare-and-set),
    /// answered or not: when it began and how long it took, in nanoseconds since `start`.
    private let requestTimes = Mutex<[(began: Int, took: Int)]>([])

    /// The latency of the requests that began in a window of time.
    public struct Latencies: Sendable, CustomStringConvertible {
        /// Requests counted.
        public var count: Int
        /// Seconds.
        public var p50: Double
        public var p99: Double
        public var max: Double
        public var description: String {
            String(format: "%d requests, p50 %.1f ms, p99 %.1f ms, max %.1f ms", count, p50 * 1000, p99 * 1000, max * 1000)
        }
    }

    /// Ends `run` early (its clients finish the operation they are in).
    public func stop() { stopped.store(true, ordering: .relaxed) }

    /// Sabotage for the checker's self-test: reads skip ReadIndex (`consistency=stale`).
    public var staleReads = false

    public init(cluster: any NodeRequester, keys: Int = 4, namespace: String = "jepsen", maxOperations: Int = 200_000) {
        self.cluster = cluster
        self.maxOperations = maxOperations
        self.keys = (0..<keys).map { "k\($0)" }
        self.namespace = namespace
    }

    private func now() -> Int { Int(DispatchTime.now().uptimeNanoseconds - start) }

    private func record(_ key: String, _ op: Op) {
        state.withLock { $0.ops.append((key, op)) }
    }

    private func count(_ kind: WritableKeyPath<Counts, Int>) {
        state.withLock { $0.counts[keyPath: kind] += 1 }
    }

    private func nextValue() -> Int {
        state.withLock { s in
            defer { s.nextValue += 1 }
            return s.nextValue
        }
    }

    public var counts: Counts { state.withLock { $0.counts } }

    /// Nanoseconds since `start`: the clock of the history and of `latencies(beganIn:)`.
    public func elapsed() -> Int { now() }

    private func timed(_ began: Int) {
        let took = now() - began
        requestTimes.withLock { $0.append((began, took)) }
    }

    /// The latency of the requests (reads, writes, each half of a compare-and-set, failed ones
    /// too, at the time they took to fail) that began in `window` (nanoseconds since `start`).
    public func latencies(beganIn window: Range<Int> = 0..<Int.max) -> Latencies {
        let seconds = requestTimes.withLock { times in times.filter { window.contains($0.began) }.map { Double($0.took) / 1e9 } }.sorted()
        return Latencies(
            count: seconds.count, p50: ClusterBench.percentile(seconds, 0.5), p99: ClusterBench.percentile(seconds, 0.99), max: seconds.last ?? 0)
    }
    /// `run` stopped at `maxOperations`.
    public var reachedCap: Bool { state.withLock { $0.started >= maxOperations } }

    /// Reserves one operation of `maxOperations`; false once they are used up.
    private func reserve() -> Bool {
        state.withLock { s in
            guard s.started < maxOperations else { return false }
            s.started += 1
            return true
        }
    }
    public var history: [(key: String, op: Op)] { state.withLock { $0.ops } }

    func uri(_ key: String) -> String { "/registers/\(key).json?ns=\(namespace)" }
    func readURI(_ key: String) -> String { uri(key) + (staleReads ? "&consistency=stale" : "") }

    /// Runs `clients` concurrent clients until `seconds` pass; `nodes()` gives the nodes to use.
    public func run(clients: Int, seconds: Double, nodes: @escaping @Sendable () -> [UInt64]) async {
        let deadline = Date().addingTimeInterval(seconds)
        await withTaskGroup(of: Void.self) { group in
            for c in 0..<clients {
                group.addTask {
                    var rng = SystemRandomNumberGenerator()
                    while Date() < deadline && !self.stopped.load(ordering: .relaxed) {
                        let targets = nodes()
                        guard let node = targets.randomElement(using: &rng), let key = self.keys.randomElement(using: &rng) else {
                            try? await Task.sleep(nanoseconds: 20_000_000)
                            continue
                        }
                        guard self.reserve() else { return }
                        switch Int.random(in: 0..<10, using: &rng) {
                        case 0..<4: await self.read(client: c, node: node, key: key)
                        case 4..<8: await self.write(client: c, node: node, key: key)
                        default: await self.compareAndSet(client: c, node: node, key: key)
                        }
                    }
                }
            }
        }
    }

    /// A linearizable read; recorded only when it succeeds (a failed read changes nothing).
    @discardableResult
    public func read(client: Int, node: UInt64, key: String, timeout: Int64 = 5) async -> (value: Int?, etag: String?)? {
        let call = now()
        let answer = try? await cluster.request(node, .GET, readURI(key), headers: [("X-Firebase-ETag", "true")], timeout: timeout)
        timed(call)
        guard let r = answer, r.status == 200 else {
            count(\.failed)
            return nil
        }
        let text = r.text.trimmingCharacters(in: .whitespacesAndNewlines)
        let value: Int? = text == "null" ? nil : Int(text)
        guard text == "null" || value != nil else {
            count(\.failed)
            return nil
        }
        record(key, Op(client: client, input: .read, output: .value(value), callTime: call, returnTime: now()))
        count(\.ok)
        return (value, r.header("ETag"))
    }

    /// A write; true when it was acknowledged.
    @discardableResult
    public func write(client: Int, node: UInt64, key: String) async -> Bool {
        let v = nextValue()
        let call = now()
        let r = try? await cluster.request(node, .PUT, uri(key), body: "\(v)", timeout: 5)
        timed(call)
        if let r, r.status == 200 {
            record(key, Op(client: client, input: .write(v), output: .written, callTime: call, returnTime: now()))
            count(\.ok)
            return true
        } else if let r, Self.refused(r.status) {
            count(\.failed)
        } else {
            // Timed out, connection lost, or 503: it may still apply (at most once).
            record(key, Op(client: client, input: .write(v), output: .unknown, callTime: call, returnTime: nil))
            count(\.unknown)
        }
        return false
    }

    /// A write answered with `status` certainly did not apply: a 4xx, or 507 (NOSPACE: the state
    /// machine refused it where it would have applied it, on every node alike). Any other
    /// failure (a timeout, a lost connection, 503) may still apply, at most once.
    static func refused(_ status: Int) -> Bool { (400..<500).contains(status) || status == 507 }

    public func compareAndSet(client: Int, node: UInt64, key: String) async {
        guard let (expected, etag) = await read(client: client, node: node, key: key), let etag, let expected else { return }
        let v = nextValue()
        let call = now()
        let r = try? await cluster.request(node, .PUT, uri(key), headers: [("if-match", etag)], body: "\(v)", timeout: 5)
        timed(call)
        if let r, r.status == 200 {
            record(key, Op(client: client, input: .cas(expected: expected, new: v), output: .swapped(true), callTime: call, returnTime: now()))
            count(\.ok)
        } else if let r, r.status == 412 {
            record(key, Op(client: client, input: .cas(expected: expected, new: v), output: .swapped(false), callTime: call, returnTime: now()))
            count(\.ok)
        } else if let r, Self.refused(r.status) {
            count(\.failed)
        } else {
            record(key, Op(client: client, input: .cas(expected: expected, new: v), output: .unknown, callTime: call, returnTime: nil))
            count(\.unknown)
        }
    }

    /// Final reads of every key through every node (after the load stopped): acknowledged writes
    /// must be visible, which the checker verifies with the rest of the history.
    public func finalReads(nodes: [UInt64]) async -> Bool {
        var all = true
        for node in nodes {
            for key in keys where await read(client: 10_000 + Int(node), node: node, key: key) == nil { all = false }
        }
        return all
    }

    /// Checks the recorded history, key by key.
    public func check() -> LinearizabilityVerdict { perKey(history) }

    /// For a history that is not linearizable: the first key whose history is not, and the
    /// shortest prefix of it (operations called before some time; those still running then count
    /// as unfinished) that is already not linearizable, found by bisection. Returns the key, the
    /// operations of that prefix, and the call time (ns since `start`) that ends it.
    public func earliestViolation() -> (key: String, operations: [Op], cut: Int)? {
        var byKey: [String: [Op]] = [:]
        for (k, op) in history { byKey[k, default: []].append(op) }
        for key in byKey.keys.sorted() {
            let ops = (byKey[key] ?? []).sorted { $0.callTime < $1.callTime }
            guard LinearizabilityChecker.checkRegister(ops) == .notLinearizable else { continue }
            func prefix(_ count: Int) -> [Op] {
                let cut = ops[count - 1].callTime
                return ops.prefix(count).compactMap { op in
                    guard let ret = op.returnTime, ret > cut else { return op }
                    if case .read = op.input { return nil }  // an unfinished read constrains nothing
                    return Op(client: op.client, input: op.input, output: .unknown, callTime: op.callTime, returnTime: nil)
                }
            }
            var low = 1
            var high = ops.count
            while low < high {
                let mid = (low + high) / 2
                if LinearizabilityChecker.checkRegister(prefix(mid)) == .notLinearizable { high = mid } else { low = mid + 1 }
            }
            return (key, prefix(low), ops[low - 1].callTime)
        }
        return nil
    }

    private func perKey(_ ops: [(key: String, op: Op)]) -> LinearizabilityVerdict {
        var byKey: [String: [Op]] = [:]
        for (k, op) in ops { byKey[k, default: []].append(op) }
        var sawUnknown = false
        for k in byKey.keys.sorted() {
            switch LinearizabilityChecker.checkRegister(byKey[k] ?? []) {
            case .notLinearizable: return .notLinearizable
            case .unknown: sawUnknown = true
            case .linearizable: break
            }
        }
        return sawUnknown ? .unknown : .linearizable
    }
}

