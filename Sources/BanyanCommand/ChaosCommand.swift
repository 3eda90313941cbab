import ArgumentParser
import BanyanOps
import BanyanServer
import Dispatch
import Foundation
import NIOCore

/// `banyan chaos …`: failover testing against a `banyan cluster local` (docs/chaos.md).
struct Chaos: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Failover testing: kill, pause, partition and slow the nodes of a local cluster; a fault-injecting proxy; a checked run.",
        discussion: """
            Run `banyan cluster local --dir D` in one shell, then `banyan chaos … --dir D` in another: the \
            cluster publishes its nodes' pids and restart arguments in D/cluster-state.json. Network and disk \
            faults go through each node's fault switch (/.banyan/faults), which only nodes started with \
            --allow-fault-injection (as cluster local starts them) accept. See docs/chaos.md.
            """,
        subcommands: [
            ChaosStatus.self, ChaosKill.self, ChaosPause.self, ChaosResume.self, ChaosRestart.self, ChaosPartition.self, ChaosHeal.self, ChaosSlow.self,
            ChaosRun.self, ChaosCheckCommand.self, ChaosProxyCommand.self,
        ])
}

struct ClusterDirectory: ParsableArguments {
    @Option(name: .long, help: "The directory of the `banyan cluster local` to act on.")
    var dir: String = "./banyan-local"

    var absolute: String { URL(fileURLWithPath: dir).standardizedFileURL.path }
}

struct NodeChoice: ParsableArguments {
    @Option(name: .long, help: "The node id.")
    var node: UInt64
}

/// Runs `body` with a controller of the cluster in `--dir`, waiting for it on this thread.
func withController(_ directory: ClusterDirectory, _ body: @escaping @Sendable (ChaosController) async throws -> Void) throws {
    let controller = ChaosController(directory: directory.absolute) { line in say(line) }
    defer { controller.shutdown() }
    _ = try controller.state()
    try runBlocking { try await body(controller) }
}

/// Writes a line to standard output at once (unbuffered: long runs are watched through `tee`).
func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }

/// Calls `handler` on SIGINT or SIGTERM instead of ending the process (so that a run heals the
/// cluster before it stops); cancel the returned sources to restore nothing but stop listening.
func onInterrupt(_ handler: @escaping @Sendable () -> Void) -> InterruptWatch {
    var sources: [any DispatchSourceSignal] = []
    for sig in [SIGINT, SIGTERM] {
        signal(sig, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
        source.setEventHandler(handler: handler)
        source.resume()
        sources.append(source)
    }
    return InterruptWatch(sources: sources)
}

/// The check's runner, once it exists (for Ctrl-C).
final class RunnerBox: @unchecked Sendable {
    private let lock = NSLock()
    private var value: ChaosRunner?
    var runner: ChaosRunner? {
        get { lock.withLock { value } }
        set { lock.withLock { value = newValue } }
    }
}

struct InterruptWatch: @unchecked Sendable {
    let sources: [any DispatchSourceSignal]
    func cancel() { for s in sources { s.cancel() } }
}

/// Waits on this thread for an async body (the commands here are synchronous, like the rest).
func runBlocking(_ body: @escaping @Sendable () async throws -> Void) throws {
    let done = DispatchSemaphore(value: 0)
    let outcome = OutcomeBox()
    Task {
        do {
            try await body()
        } catch let exit as ExitCode {
            outcome.set("exit \(exit.rawValue)")
        } catch {
            outcome.set("\(error)")
        }
        done.signal()
    }
    done.wait()
    if let failure = outcome.get() {
        if failure.hasPrefix("exit "), let code = Int32(failure.dropFirst(5)) { throw ExitCode(code) }
        throw CommandError(failure)
    }
}

struct ChaosStatus: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "status", abstract: "Each node's process, role and faults.")
    @OptionGroup var directory: ClusterDirectory

    func run() throws {
        try withController(directory) { controller in
            let state = try controller.state()
            say("cluster \(state.clusterID) (supervisor pid \(state.supervisorPID), \(ProcessProbe.state(state.supervisorPID).rawValue))")
            for node in state.nodes {
                let process = ProcessProbe.state(of: node)
                var role = "-"
                if process == .running, let s = await controller.status(node.id, timeout: 2) {
                    role = "\(s["role"] ?? "?"), term \(s["term"] ?? "?"), leader \(s["leader"] ?? "?")"
                }
                say(
                    "node \(node.id): pid \(node.pid) \(process.rawValue), http://\(node.clientAddress), starts \(node.starts), \(role); faults: \(node.faults.summary)"
                )
            }
        }
    }
}

struct ChaosKill: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "kill", abstract: "kill -9 a node (bring it back with `chaos restart`).")
    @OptionGroup var directory: ClusterDirectory
    @OptionGroup var choice: NodeChoice
    func run() throws { try withController(directory) { try $0.kill(choice.node) } }
}

struct ChaosPause: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "pause", abstract: "SIGSTOP a node (a frozen process: sockets open, nothing answered).")
    @OptionGroup var directory: ClusterDirectory
    @OptionGroup var choice: NodeChoice
    func run() throws { try withController(directory) { try $0.pause(choice.node) } }
}

struct ChaosResume: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "resume", abstract: "SIGCONT a paused node.")
    @OptionGroup var directory: ClusterDirectory
    @OptionGroup var choice: NodeChoice
    func run() throws { try withController(directory) { try $0.resume(choice.node) } }
}

struct ChaosRestart: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "restart",
        abstract: "Start a node again with its recorded arguments (a running one is stopped with SIGTERM first); its faults are set again.")
    @OptionGroup var directory: ClusterDirectory
    @OptionGroup var choice: NodeChoice
    func run() throws { try withController(directory) { try await $0.restart(choice.node) } }
}

struct ChaosPartition: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "partition",
        abstract: "Drop peer traffic between groups of nodes (--groups 1,2/3), or on single links (--cut 1-3).",
        discussion: "Each node drops Raft messages to and from the nodes outside its group, both ways. Client traffic is not affected. `chaos heal` ends it.")
    @OptionGroup var directory: ClusterDirectory
    @Option(name: .long, help: "Groups of node ids split by '/', e.g. 1,2/3 (a node in no group is alone).")
    var groups: String?
    @Option(name: .long, help: "A link to cut, a-b (repeat); other links stay.")
    var cut: [String] = []

    func validate() throws {
        guard (groups == nil) != cut.isEmpty else { throw ValidationError("give --groups or --cut") }
        if let groups { _ = try ChaosController.parseGroups(groups) }
        for link in cut { _ = try ChaosController.parseLink(link) }
    }

    func run() throws {
        let groups = try self.groups.map { try ChaosController.parseGroups($0) }
        let links = try cut.map { try ChaosController.parseLink($0) }
        let pairs = links.map { [$0.0, $0.1] }
        try withController(directory) { controller in
            if let groups { try await controller.partition(groups) } else { try await controller.cut(pairs.map { ($0[0], $0[1]) }) }
        }
    }
}

struct ChaosHeal: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "heal", abstract: "End partitions; with --all, also clear slowness, resume paused nodes and restart stopped ones.")
    @OptionGroup var directory: ClusterDirectory
    @Flag(name: .long, help: "Everything back to normal, not only the partitions.")
    var all = false

    func run() throws {
        let all = self.all
        try withController(directory) { controller in
            if all {
                let done = try await controller.healAll()
                say(done.isEmpty ? "nothing to heal" : done.joined(separator: "; "))
            } else {
                try await controller.heal()
            }
        }
    }
}

struct ChaosSlow: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "slow", abstract: "Delay a node's outbound peer messages and/or its fsyncs (--delay-ms 0 clears).")
    @OptionGroup var directory: ClusterDirectory
    @OptionGroup var choice: NodeChoice
    @Option(name: .long, help: "Milliseconds added (0 to 10000; 0 clears).")
    var delayMs: Int
    @Option(name: .long, help: "What to slow: peer, disk or both.")
    var what: String = "both"

    func validate() throws {
        guard (0...10_000).contains(delayMs) else { throw ValidationError("--delay-ms must be from 0 to 10000") }
        guard ["peer", "disk", "both"].contains(what) else { throw ValidationError("--what must be peer, disk or both") }
    }

    func run() throws {
        let (node, delay, what) = (choice.node, delayMs, self.what)
        try withController(directory) { try await $0.slow(node, milliseconds: delay, peer: what != "disk", disk: what != "peer") }
    }
}

/// Options shared by `chaos run` and `chaos check`.
struct ScheduleOptions: ParsableArguments {
    @Option(name: .long, help: "How long to inject faults (the run then heals everything and stops).")
    var seconds: Double = 60
    @Option(name: .long, help: "The schedule's seed (the same seed gives the same faults, roles and durations).")
    var seed: UInt64 = 1
    @Option(name: .long, help: "Fault kinds to draw from: kill,pause,partition,slow.")
    var faults: String = "kill,pause,partition,slow"
    @Option(name: .long, help: "How long each fault lasts, in seconds (min-max).")
    var hold: String = "2-5"
    @Option(name: .long, help: "Seconds between a recovery and the next fault (min-max).")
    var gap: String = "1-3"
    @Option(name: .long, help: "Seconds to wait for a write to commit after a heal before the run counts it as not recovered.")
    var recoveryBound: Double = 30

    func validate() throws {
        guard seconds > 0, seconds <= 86_400 else { throw ValidationError("--seconds must be from 0 to 86400") }
        guard recoveryBound >= 1, recoveryBound <= 600 else { throw ValidationError("--recovery-bound must be from 1 to 600") }
        _ = try ChaosSchedule.parseKinds(faults)
        _ = try Self.range(hold, "--hold")
        _ = try Self.range(gap, "--gap")
    }

    static func range(_ text: String, _ name: String) throws -> ClosedRange<Int> {
        let parts = text.split(separator: "-").map { Double($0) }
        guard parts.count == 2, let low = parts[0], let high = parts[1], low >= 0, high >= low, high <= 3_600 else {
            throw ValidationError("\(name) must look like 2-5 (seconds, min-max), not '\(text)'")
        }
        return Int(low * 1000)...Int(high * 1000)
    }

    func schedule() throws -> ChaosSchedule {
        ChaosSchedule(
            seed: seed, kinds: try ChaosSchedule.parseKinds(faults), holdMilliseconds: try Self.range(hold, "--hold"),
            gapMilliseconds: try Self.range(gap, "--gap"))
    }
}

func printSummary(_ report: ChaosRunner.Report) {
    say(String(format: "faults applied: %d in %.0f s (seed %llu); probe writes acknowledged: %d", report.faults.count, report.seconds, report.seed, report.probeWrites))
    for row in report.byKind {
        let name = row.kind.rawValue.padding(toLength: 10, withPad: " ", startingAt: 0)
        say(String(format: "  %@ %2d applied, longest unavailability %.1f s", name, row.count, row.longest))
    }
    say(String(format: "longest unavailability over the run: %.1f s", report.longestUnavailability))
    if !report.unrecovered.isEmpty { say("NOT recovered after: " + report.unrecovered.joined(separator: "; ")) }
}

struct ChaosRun: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Apply a seeded schedule of faults for --seconds, printing each fault, its heal and the recovery; heals everything at the end.",
        discussion: "Exit status 1 if the cluster did not recover (no write committed within --recovery-bound) after some fault.")
    @OptionGroup var directory: ClusterDirectory
    @OptionGroup var options: ScheduleOptions

    func run() throws {
        let schedule = try options.schedule()
        let (seconds, bound) = (options.seconds, options.recoveryBound)
        try withController(directory) { controller in
            let runner = try ChaosRunner(controller: controller, schedule: schedule, seconds: seconds, recoveryBound: bound)
            let interrupt = onInterrupt { runner.interrupt() }
            defer { interrupt.cancel() }
            let report = try await runner.run()
            printSummary(report)
            if !report.unrecovered.isEmpty || !report.recoveredAtEnd { throw ExitCode(1) }
        }
    }
}

struct ChaosCheckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check",
        abstract: "Run a register and a set workload through a seeded fault schedule; check linearizability and that no acknowledged write was lost.",
        discussion: """
            Exit status 0: linearizable, no acknowledged write lost, every node answered its final reads, the cluster recovered \
            from every fault. 1: not linearizable, or an acknowledged write lost. 2: inconclusive (the checker's budget ran out, \
            a node did not answer its final reads, or the cluster did not recover).
            """)
    @OptionGroup var directory: ClusterDirectory
    @OptionGroup var options: ScheduleOptions
    @Option(name: .long, help: "Concurrent register clients.")
    var clients: Int = 4
    @Option(name: .long, help: "Write every register operation to this file, one JSON object a line (times in seconds on the run's clock).")
    var history: String?

    func validate() throws {
        guard (1...64).contains(clients) else { throw ValidationError("--clients must be from 1 to 64") }
    }

    func run() throws {
        let schedule = try options.schedule()
        let (seconds, bound, clients, history) = (options.seconds, options.recoveryBound, self.clients, self.history)
        try withController(directory) { controller in
            let current = RunnerBox()
            let interrupt = onInterrupt { current.runner?.interrupt() }
            defer { interrupt.cancel() }
            let outcome = try await ChaosCheck.run(
                controller: controller, schedule: schedule, seconds: seconds, clients: clients, recoveryBound: bound, started: { current.runner = $0 })
            printSummary(outcome.run)
            say("register operations: \(outcome.registerOperations) recorded (\(outcome.registerCounts))")
            say("linearizability: \(outcome.verdict)")
            if let violation = outcome.violation { say(violation) }
            if let history {
                try (outcome.historyLines.joined(separator: "\n") + "\n").write(toFile: history, atomically: true, encoding: .utf8)
                say("history: \(outcome.historyLines.count) operations in \(history)")
            }
            say("set: \(outcome.setAcknowledged) acknowledged adds, \(outcome.setUnknown) with unknown outcome")
            say("acknowledged writes lost: \(outcome.lostCount)" + (outcome.lost.isEmpty ? "" : " " + outcome.lost.sorted { $0.key < $1.key }.map { "node \($0.key) misses \($0.value.prefix(10))" }.joined(separator: "; ")))
            if !outcome.unread.isEmpty { say("nodes that did not answer their final reads: \(outcome.unread)") }
            say(outcome.passed ? "PASS" : "FAIL")
            if outcome.violated { throw ExitCode(1) }
            if !outcome.passed { throw ExitCode(2) }
        }
    }
}

struct ChaosProxyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "proxy",
        abstract: "A TCP proxy in front of a node's client port that delays, stalls or resets connections (REST, event streams, WebSockets).",
        discussion: """
            Point a Firebase SDK at --listen instead of the node. Every chunk waits --delay-ms in each direction; each chunk \
            stalls its connection with probability --drop-rate (nothing passes either way from then on, the socket stays open); \
            every --reset-every seconds every open connection is reset. Requests for the node's operator routes (/.banyan/…, \
            but health and ready) are refused with 403; so are requests carrying the emulator's owner token when --listen is \
            not loopback (unless --allow-owner-token), and such a proxy starts only in front of a node that refuses that \
            token (checked before listening: a realtime client's token travels where the proxy cannot read it). A TLS client (a node serving TLS on its client port) is refused at \
            once unless --tls-passthrough, which passes TLS connections unread: no request inside them is checked. Runs \
            until Ctrl-C or --seconds.
            """)
    @Option(name: .long, help: "Where the proxy listens, host:port (loopback unless --listen-anywhere).")
    var listen: String = "127.0.0.1:9100"
    @Option(name: .long, help: "The node's client address, host:port.")
    var to: String = "127.0.0.1:9000"
    @Option(name: .long, help: "Milliseconds each chunk waits, each way.")
    var delayMs: Int = 0
    @Option(name: .long, help: "Chance (0 to 1) that a chunk stalls its connection.")
    var dropRate: Double = 0
    @Option(name: .long, help: "Reset every open connection every this many seconds (0: never).")
    var resetEvery: Double = 0
    @Option(name: .long, help: "Seed of the stall decisions.")
    var seed: UInt64 = 1
    @Option(name: .long, help: "Stop after this many seconds (0: run until Ctrl-C).")
    var seconds: Double = 0
    @Flag(name: .long, help: "Allow a --listen address that is not loopback.")
    var listenAnywhere = false
    @Flag(name: .long, help: "Pass TLS connections through unread (for a node serving TLS): the proxy then checks no request inside them.")
    var tlsPassthrough = false
    @Flag(name: .long, help: "Pass requests carrying the emulator's owner token even when --listen is not loopback.")
    var allowOwnerToken = false

    func validate() throws {
        guard let listen = try? HostPort(parsing: listen), (try? HostPort(parsing: to)) != nil else {
            throw ValidationError("--listen and --to must be host:port")
        }
        guard listenAnywhere || listen.isLoopback else {
            throw ValidationError("--listen \(self.listen) is not a loopback address: the proxy is for local testing (add --listen-anywhere to mean it)")
        }
        if tlsPassthrough && !listen.isLoopback && !allowOwnerToken {
            throw ValidationError(
                "--tls-passthrough with --listen \(self.listen) (not loopback) would pass the emulator's owner token unseen inside TLS, to anyone who reaches the proxy: add --allow-owner-token to mean it, or listen on loopback"
            )
        }
        guard (0...60_000).contains(delayMs) else { throw ValidationError("--delay-ms must be from 0 to 60000") }
        guard (0...1).contains(dropRate) else { throw ValidationError("--drop-rate must be from 0 to 1") }
        do {
            _ = try ChaosProxy.Settings.resetInterval(seconds: resetEvery)
        } catch {
            throw ValidationError(error.description)
        }
        guard seconds.isFinite, seconds >= 0, seconds <= 366 * 86_400 else { throw ValidationError("--seconds must be from 0 (until Ctrl-C) to a year") }
    }

    func run() throws {
        let listen = try HostPort(parsing: self.listen)
        let target = try HostPort(parsing: to)
        var settings = ChaosProxy.Settings()
        settings.delay = .milliseconds(Int64(delayMs))
        settings.dropRate = dropRate
        settings.resetEvery = try ChaosProxy.Settings.resetInterval(seconds: resetEvery)
        settings.seed = seed
        settings.tlsPassthrough = tlsPassthrough
        settings.ownerToken = allowOwnerToken ? .pass : .refuseBeyondLoopback
        if !listen.isLoopback && !allowOwnerToken {
            // Before listening: nothing is exposed if the node takes the owner token.
            let answer = OutcomeBox()
            let (host, port) = (target.host, target.port)
            try runBlocking {
                if let status = await ChaosProxy.ownerTokenProbe(host: host, port: port) { answer.set("\(status)") }
            }
            if let refusal = ChaosProxy.exposureRefusal(listen: self.listen, listenIsLoopback: false, allowOwnerToken: false, to: to, probe: answer.get().flatMap { Int($0) }) {
                throw CommandError(refusal)
            }
        }
        let proxy = ChaosProxy(targetHost: target.host, targetPort: target.port, settings: settings) { line in say(line) }
        let port = try proxy.start(host: listen.host, port: listen.port)
        let gate = proxy.requestGateOptions
        say(
            "proxy: \(listen.host):\(port) -> \(to), delay \(delayMs) ms, drop rate \(dropRate), reset every \(resetEvery > 0 ? "\(resetEvery) s" : "never"), seed \(seed); "
                + "TLS \(gate.tlsPassthrough ? "passed through unread" : "refused"), owner token \(gate.refuseOwnerToken ? "refused" : "passed")"
        )
        if seconds > 0 {
            Thread.sleep(forTimeInterval: seconds)
        } else {
            waitForTerminationSignal()
        }
        say("proxy stopped: \(proxy.stats)")
        proxy.stop()
    }
}
