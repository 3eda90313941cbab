import ArgumentParser
import BanyanOps
import Dispatch
import Foundation

/// `banyan bench`: starts a 3-node cluster of this binary on loopback and measures it
/// (docs/benchmarks.md). Use a release build: `swift run -c release banyan bench`.
struct Bench: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Benchmark a 3-node cluster on loopback: throughput, latency, CPU per write, memory, failover.")

    @Option(name: .long, help: "Working directory for the nodes (wiped first).")
    var dir: String = "/tmp/banyan-bench"
    @Option(name: .long, help: "Client counts to measure, comma-separated.")
    var clients: String = "1,16,64"
    @Option(name: .long, help: "Seconds per throughput run.")
    var seconds: Double = 5
    @Option(name: .long, help: "Failover trials per fault (kill -9 and SIGSTOP).")
    var failoverTrials: Int = 10
    @Option(name: .long, help: "Keys written before measuring memory.")
    var keys: Int = 100_000
    @Option(name: .long, help: "First port (clients base+1..3, peers base+101..103).")
    var portBase: Int = 19_700
    @Option(name: .long, parsing: .unconditionalSingleValue, help: "An extra argument for every node's `banyan serve` (repeat), e.g. --serve-arg=--threads --serve-arg=1.")
    var serveArg: [String] = []
    @Option(name: .long, help: "A rules file for the bench namespace: each client then writes as uid c<client> (an emulator token), judged by the rules.")
    var rules: String?
    @Option(name: .long, help: "Measure backups and restores instead, at these key counts (comma-separated, e.g. 100000,1000000), with 16 writing clients for --seconds.")
    var backup: String?
    @Flag(name: .long, help: "Measure WebSocket (v5) sessions instead: memory per idle session, CPU per write with idle listens, fan-out latency, deliveries per second.")
    var realtime = false
    @Option(name: .long, help: "With --realtime: sessions to open (spread over the 3 nodes).")
    var sessions: Int = 10_000
    @Option(name: .long, help: "With --realtime: listeners on the fan-out path.")
    var fanOut: Int = 1_000
    @Option(name: .long, help: "With --realtime: idle event streams (REST SSE) for the CPU-per-write figure with streams (0: skip).")
    var streams: Int = 9_000
    @Option(name: .long, help: "With --realtime: write rates (writes a second) of the deliveries phase, comma-separated.")
    var deliveryRates: String = "10,20,40"
    @Option(name: .long, help: "With --realtime: connections writing together in the deliveries phase (each waits for its own answers).")
    var deliveryWriters: Int = 1
    @Flag(name: .long, help: "Measure the Swift SDK instead (1-node and 3-node clusters): writes per second through one connection, local event latency, memory per 10,000 cached children.")
    var sdk = false
    @Option(name: .long, help: "With --sdk: setValue calls per round (three rounds per cluster).")
    var sdkWrites: Int = 20_000
    @Option(name: .long, help: "With --sdk: writes timed one at a time for the latency percentiles.")
    var sdkSamples: Int = 1_000
    @Option(name: .long, help: "With --sdk: children of the list whose cached memory is measured.")
    var sdkChildren: Int = 10_000

    func run() throws {
        if realtime { return try runRealtime() }
        if sdk { return try runSDK() }
        if let backup {
            let counts = backup.split(separator: ",").compactMap { Int($0) }
            guard !counts.isEmpty, counts.allSatisfy({ (1...10_000_000).contains($0) }), counts == counts.sorted() else {
                throw ValidationError("--backup must list ascending key counts from 1 to 10000000")
            }
            var bench = BackupBench(executable: URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path, directory: dir)
            bench.keyCounts = counts
            bench.seconds = seconds
            bench.portBase = portBase
            let configured = bench
            return try runBenchmark { log in try await configured.run(log: log) }
        }
        let counts = clients.split(separator: ",").compactMap { Int($0) }
        guard !counts.isEmpty, counts.allSatisfy({ (1...1024).contains($0) }) else { throw ValidationError("--clients must list numbers from 1 to 1024") }
        guard seconds > 0 && seconds <= 600, (0...100).contains(failoverTrials), (0...10_000_000).contains(keys) else {
            throw ValidationError("--seconds 0-600, --failover-trials 0-100, --keys 0-10000000")
        }
        var bench = ClusterBench(executable: URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path, directory: dir)
        bench.clients = counts
        bench.seconds = seconds
        bench.failoverTrials = failoverTrials
        bench.keys = keys
        bench.portBase = portBase
        bench.serveArguments = serveArg
        if let rules {
            guard let text = try? String(contentsOfFile: rules, encoding: .utf8) else { throw ValidationError("cannot read --rules \(rules)") }
            bench.rulesText = text
        }
        let configured = bench
        try runBenchmark { log in try await configured.run(log: log) }
    }
}

extension Bench {
    func runRealtime() throws {
        guard (3...50_000).contains(sessions), (1...sessions).contains(fanOut), (0...50_000).contains(streams), seconds > 0 && seconds <= 600 else {
            throw ValidationError("--sessions 3-50000, --fan-out 1 to --sessions, --streams 0-50000, --seconds 0-600")
        }
        let rates = deliveryRates.split(separator: ",").compactMap { Int($0) }
        guard !rates.isEmpty, rates.allSatisfy({ (1...10_000).contains($0) }), (1...64).contains(deliveryWriters) else {
            throw ValidationError("--delivery-rates must list numbers from 1 to 10000; --delivery-writers 1-64")
        }
        var bench = RealtimeBench(executable: URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path, directory: dir)
        bench.sessions = sessions
        bench.fanOut = fanOut
        bench.idleStreams = streams
        bench.seconds = seconds
        bench.deliveryRates = rates
        bench.deliveryWriters = deliveryWriters
        bench.portBase = portBase
        let configured = bench
        try runBenchmark { log in try await configured.run(log: log) }
    }

    func runSDK() throws {
        guard (1_000...1_000_000).contains(sdkWrites), (100...100_000).contains(sdkSamples), (1_000...1_000_000).contains(sdkChildren) else {
            throw ValidationError("--sdk-writes 1000-1000000, --sdk-samples 100-100000, --sdk-children 1000-1000000")
        }
        // A directory of its own under --dir (it is emptied first).
        var bench = SDKBench(executable: URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path, directory: dir + "/sdk")
        bench.writes = sdkWrites
        bench.samples = sdkSamples
        bench.children = sdkChildren
        bench.portBase = portBase
        let configured = bench
        try runBenchmark { log in try await configured.run(log: log) }
    }

    /// Runs an async benchmark from this synchronous command, printing its lines unbuffered
    /// (progress shows as it happens even when piped to a file).
    func runBenchmark(_ body: @escaping @Sendable (@escaping @Sendable (String) -> Void) async throws -> Void) throws {
        let done = DispatchSemaphore(value: 0)
        let outcome = OutcomeBox()
        Task {
            do {
                try await body { line in FileHandle.standardOutput.write(Data((line + "\n").utf8)) }
            } catch {
                outcome.set("\(error)")
            }
            done.signal()
        }
        done.wait()
        if let failure = outcome.get() { throw CommandError("benchmark failed: \(failure)") }
    }
}

final class OutcomeBox: @unchecked Sendable {
    private let lock = NSLock()
    private var value: String?
    func set(_ v: String) { lock.withLock { value = v } }
    func get() -> String? { lock.withLock { value } }
}
