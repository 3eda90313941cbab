import ArgumentParser
import BanyanBasics
import BanyanSimulation

/// `banyan-sim`: runs the deterministic cluster simulator over seeds (docs/simulator.md).
@main
struct BanyanSim: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "banyan-sim",
        abstract: "Run seeded simulations of a Banyan cluster (whole nodes over simulated disks and network) under faults and check safety, liveness and linearizability.",
        discussion: """
            Every run is a pure function of its seed: a failure prints its seed, and `--seed N` replays it
            exactly (add `--trace` for one line per event). Without `--seed`, runs `--count` seeds starting at
            `--first`, or keeps going until `--time-budget` seconds pass.
            """
    )

    @Option(help: "Replay exactly this seed.") var seed: UInt64?
    @Option(help: "First seed of a range.") var first: UInt64 = 1
    @Option(help: "Number of seeds to run (default 100; with --time-budget, no limit unless given).") var count: Int?
    @Option(help: "Keep running seeds from --first until this many seconds have passed (long-run mode); with --count, stop at whichever comes first.")
    var timeBudget: Double?
    @Option(help: "Client operations per run (default 300).") var operations: Int?
    @Option(help: "Founding voters (default: the seed picks 3 or 5).") var nodes: Int?
    @Flag(help: "Healthy network, no nemesis.") var noFaults = false
    @Flag(help: "Add realtime connections with onDisconnect writes, node leases and fencing (a presence workload).") var sessions = false
    @Flag(help: "Security rules in the log: two rules changes; every client write names its client and is judged at its position.") var rules = false
    @Flag(help: "Account sign-ups in the log: clients race to sign up a few emails; at most one per email may succeed.") var accounts = false
    @Flag(help: "Client writes: every data write names its client and number; a failed or timed-out write is sent again through another node and must be decided once.")
    var clientWrites = false
    @Flag(help: "Namespace quotas: a quota set at the start (25 data bytes) and raised halfway (1,000); writes over it are refused where they apply, alike on every node.")
    var quota = false
    @Option(help: "Take a snapshot every this many payload bytes applied (or the last image's size, if larger); 0: by entries only. Default: each seed draws it.")
    var snapshotLogBytes: UInt64?
    @Flag(help: "Print one line per event of a replayed seed.") var trace = false
    @Flag(help: "Print every run's summary, not only failures.") var verbose = false
    @Option(help: "A deliberate bug in the real code, to see the checkers catch it (docs/simulator.md, \"Self-tests\"): \(Sabotage.allCases.filter { $0 != .none }.map(\.rawValue).joined(separator: ", ")).")
    var sabotage: String?

    func validate() throws {
        if let nodes, !(1...9).contains(nodes) { throw ValidationError("--nodes must be between 1 and 9") }
        guard (operations ?? 0) >= 0 else { throw ValidationError("--operations must not be negative") }
        guard (count ?? 0) >= 0 else { throw ValidationError("--count must not be negative") }
        if let timeBudget, !(timeBudget > 0) { throw ValidationError("--time-budget must be a positive number of seconds") }
        if let sabotage {
            let known = Sabotage.allCases.filter { $0 != .none }.map(\.rawValue)
            guard known.contains(sabotage) else {
                throw ValidationError("unknown --sabotage \"\(sabotage)\" (\(known.joined(separator: ", ")))")
            }
        }
    }

    /// Every option that changes what a seed runs, as flags: a failing seed's replay line must
    /// give all of them, or it replays another run.
    var replayFlags: String {
        var flags = ""
        if let nodes { flags += " --nodes \(nodes)" }
        if let operations { flags += " --operations \(operations)" }
        if noFaults { flags += " --no-faults" }
        if sessions { flags += " --sessions" }
        if rules { flags += " --rules" }
        if accounts { flags += " --accounts" }
        if clientWrites { flags += " --client-writes" }
        if quota { flags += " --quota" }
        if let snapshotLogBytes { flags += " --snapshot-log-bytes \(snapshotLogBytes)" }
        if let sabotage { flags += " --sabotage \(sabotage)" }
        return flags
    }

    func wholeNodeOptions(_ s: UInt64) -> WholeNodeOptions {
        var o = WholeNodeOptions(seed: s)
        o.operations = operations ?? 300
        o.nodes = nodes
        o.faults = !noFaults
        o.sessions = sessions
        o.rules = rules
        o.accounts = accounts
        o.clientWrites = clientWrites
        o.quota = quota
        o.trace = trace
        o.snapshotLogBytes = snapshotLogBytes
        o.sabotage = sabotage.flatMap(Sabotage.init(rawValue:)) ?? .none
        return o
    }

    /// One seed: whether it passed, its summary, its event count, its trace and trace hash.
    func runSeed(_ s: UInt64) -> (passed: Bool, excused: Bool, summary: String, events: Int, trace: [String], hash: UInt64) {
        let r = WholeNodeSimulator.run(wholeNodeOptions(s))
        return (r.passed, r.livenessNotRequired, r.summary, r.stats.events, r.trace, r.traceHash)
    }

    func run() throws {
        if let seed {
            let report = runSeed(seed)
            if trace { for line in report.trace { print(line) } }
            print(report.summary)
            print("trace hash \(String(report.hash, radix: 16))")
            if !report.passed { throw ExitCode.failure }
            return
        }
        let clock = ContinuousClock()
        let start = clock.now
        var failures: [UInt64] = []
        var excused: [UInt64] = []
        var ran = 0
        var s = first
        var events = 0
        while true {
            if let budget = timeBudget, clock.now - start > .milliseconds(Int(budget * 1000)) { break }
            if let limit = count ?? (timeBudget == nil ? 100 : nil), ran >= limit { break }
            let report = runSeed(s)
            ran += 1
            events += report.events
            if !report.passed {
                failures.append(s)
                print(report.summary)
                print("replay: swift run -c release banyan-sim --seed \(s)\(replayFlags)")
            } else if report.excused {
                // Printed too: such seeds are counted apart, never silently.
                excused.append(s)
                print(report.summary)
            } else if verbose {
                print(report.summary)
            }
            if ran % 100 == 0 && !verbose {
                print("… \(ran) seeds, \(failures.count) failed")
            }
            s &+= 1
        }
        let elapsed = clock.now - start
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let rate = seconds > 0 ? Double(ran) / seconds : 0
        print("ran \(ran) seeds (\(first)…\(first &+ UInt64(max(ran, 1)) &- 1)) in \(String(format1(seconds))) s, \(String(format1(rate))) seeds/s, \(events) events; \(failures.count) failed\(failures.isEmpty ? "" : ": \(failures)"); \(excused.count) beyond the fault budget (liveness not required)\(excused.isEmpty ? "" : ": \(excused)")")
        if !failures.isEmpty { throw ExitCode.failure }
    }

    func format1(_ x: Double) -> String {
        let scaled = (x * 10).rounded() / 10
        return "\(scaled)"
    }
}
