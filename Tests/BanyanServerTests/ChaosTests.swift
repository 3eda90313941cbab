import BanyanBasics
import BanyanCheckers
import BanyanOps
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization
import Testing

@testable import BanyanServer

/// `banyan chaos` (docs/chaos.md): the fault switch, the schedule, the proxy, and real
/// `banyan cluster local` processes driven by the `banyan chaos` commands under load.
@Suite(.serialized) struct ChaosTests {
    // MARK: - Pure parts

    @Test("a schedule replays from its seed, and draws every kind and both roles")
    func scheduleReplays() {
        var a = ChaosSchedule(seed: 42)
        var b = ChaosSchedule(seed: 42)
        var c = ChaosSchedule(seed: 43)
        let first = (0..<40).map { _ in a.next() }
        #expect(first == (0..<40).map { _ in b.next() })
        #expect(first != (0..<40).map { _ in c.next() })
        #expect(Set(first.map(\.kind.rawValue)) == Set(ChaosSchedule.Kind.allCases.map(\.rawValue)))
        #expect(first.contains { $0.role == .leader } && first.contains { $0.role != .leader })
        #expect(first.allSatisfy { (2_000...5_000).contains($0.holdMilliseconds) && (1_000...3_000).contains($0.gapMilliseconds) })
        #expect(first.filter { $0.kind == .slow }.allSatisfy { $0.delayMilliseconds > 0 })
        var only = ChaosSchedule(seed: 7, kinds: [.pause])
        #expect((0..<10).allSatisfy { _ in only.next().kind == .pause })
        #expect(throws: ChaosError.self) { try ChaosSchedule.parseKinds("kill,nap") }
    }

    @Test("partition groups and links parse, and bad ones are refused with the expected form")
    func parsing() throws {
        #expect(try ChaosController.parseGroups("1,2/3") == [[1, 2], [3]])
        #expect(try ChaosController.parseGroups("1/2/3") == [[1], [2], [3]])
        for bad in ["1,2", "1,2/", "a/2", "0/1", ""] {
            #expect(throws: ChaosError.self, "\(bad)") { try ChaosController.parseGroups(bad) }
        }
        #expect(try ChaosController.parseLink("1-3") == (1, 3))
        for bad in ["1-1", "1", "1-2-3", "x-2"] { #expect(throws: ChaosError.self, "\(bad)") { try ChaosController.parseLink(bad) } }
    }

    @Test("the fault switch: fields replace only what they name, bad requests are refused, and it is off until a fault is set")
    func switchRequests() throws {
        let faults = FaultSwitch()
        #expect(!faults.drops(2) && faults.peerDelayMilliseconds == 0)
        #expect(try faults.update(json: Array(#"{"drop_peers":[2,3]}"#.utf8)) == FaultSwitch.Faults(dropPeers: [2, 3]))
        #expect(faults.drops(2) && faults.drops(3) && !faults.drops(1))
        #expect(try faults.update(json: Array(#"{"peer_delay_ms":250}"#.utf8)) == FaultSwitch.Faults(dropPeers: [2, 3], peerDelayMilliseconds: 250))
        #expect(faults.current.json == #"{"drop_peers":[2,3],"peer_delay_ms":250,"disk_delay_ms":0}"#)
        for bad in [#"{"drop_peers":[0]}"#, #"{"drop_peers":"2"}"#, #"{"peer_delay_ms":-1}"#, #"{"disk_delay_ms":10001}"#, #"{"latency":5}"#, "[1]", "nope"] {
            #expect(throws: FaultSwitch.RequestError.self, "\(bad)") { try faults.update(json: Array(bad.utf8)) }
        }
        #expect(faults.current == FaultSwitch.Faults(dropPeers: [2, 3], peerDelayMilliseconds: 250), "a refused request changes nothing")
        faults.set(FaultSwitch.Faults())
        #expect(!faults.drops(2) && faults.peerDelayMilliseconds == 0)
    }

    @Test("--allow-fault-injection is refused unless the client and peer addresses are loopback")
    func configRefusesExposedSwitch() throws {
        var c = NodeConfig()
        c.allowFaultInjection = true
        try c.validate()
        c.peerAddress = HostPort(host: "0.0.0.0", port: 7000)
        c.tls.generateDevelopmentCertificates = false
        c.development.allowUnauthenticated = false
        c.development.acceptOwnerToken = false
        #expect(throws: ConfigError.self) { try c.validate() }
        c.allowFaultInjection = false
        try c.validate()
    }

    /// Registers in memory; node 2 answers reads with the first value ever written (stale).
    final class StaleReplica: NodeRequester {
        private let store = Mutex<[String: (first: String, last: String)]>([:])

        func perform(_ id: UInt64, _ method: HTTPMethod, _ uri: String, headers: [(String, String)], body: String?, timeout: Int64) async throws
            -> HTTPResult
        {
            let path = String(uri.prefix { $0 != "?" })
            if method == .PUT, let body {
                store.withLock { s in s[path] = (s[path]?.first ?? body, body) }
                return HTTPResult(status: 200, headers: [], body: Array(body.utf8))
            }
            let value = store.withLock { s in id == 2 ? s[path]?.first : s[path]?.last } ?? "null"
            return HTTPResult(status: 200, headers: [("ETag", "e-\(value)")], body: Array(value.utf8))
        }
    }

    @Test("a stale read makes the register history not linearizable, and the earliest failing prefix ends at that read")
    func violationIsLocated() async throws {
        let workload = RegisterWorkload(cluster: StaleReplica(), keys: 2, namespace: "t")
        #expect(await workload.write(client: 0, node: 1, key: "k1"))
        #expect(await workload.write(client: 0, node: 1, key: "k0"))
        _ = await workload.read(client: 1, node: 1, key: "k0")
        #expect(await workload.write(client: 0, node: 1, key: "k0"))
        #expect(workload.check() == .linearizable)
        let stale = await workload.read(client: 1, node: 2, key: "k0")
        #expect(stale?.value == 2, "the stale node answers the first value of k0")
        _ = await workload.read(client: 1, node: 1, key: "k0")
        #expect(workload.check() == .notLinearizable)
        let found = try #require(workload.earliestViolation())
        #expect(found.key == "k0")
        let last = try #require(found.operations.max { $0.callTime < $1.callTime })
        #expect(last.input == .read && last.output == .value(2), "the prefix ends at the stale read: \(last)")
        #expect(found.operations.count == 4)
    }

    // MARK: - A node's endpoint

    /// A single node on loopback, ports chosen by the system.
    static func loopbackConfig(_ dataDirectory: String) -> NodeConfig {
        var c = NodeConfig()
        c.dataDirectory = dataDirectory
        c.clientAddress = HostPort(host: "127.0.0.1", port: 0)
        c.peerAddress = HostPort(host: "127.0.0.1", port: 0)
        return c
    }

    @Test("a node started without the flag refuses /.banyan/faults with 403 and a typed error, and applies nothing")
    func refusedWithoutFlag() async throws {
        let dir = try temporaryDirectory("chaos-refused")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let c = Self.loopbackConfig(dir + "/data")
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { node.shutdown() }
        #expect(node.runtime.faults == nil)
        let port = clientPort(node)
        let group = MultiThreadedEventLoopGroup.singleton
        for (method, body) in [(HTTPMethod.POST, #"{"drop_peers":[2]}"#), (.GET, nil), (.DELETE, nil)] {
            let connection = try await HTTPConnection.connect(host: "127.0.0.1", port: port, group: group)
            defer { connection.close() }
            let r = try await connection.send(method, "/.banyan/faults", headers: [("Content-Type", "application/json")], body: body.map { Array($0.utf8) })
            #expect(r.status == 403, "\(method)")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(r.body)) as? [String: Any])
            #expect(object["code"] as? String == "fault_injection_disabled")
            #expect((object["error"] as? String)?.contains("--allow-fault-injection") == true)
        }
        // With the flag, the same node accepts faults, and a bad one gets 400 with its own code.
        var f = c
        f.dataDirectory = dir + "/flagged"
        f.allowFaultInjection = true
        let flagged = try BanyanNode.start(config: f, logger: Logger(label: "test"))
        defer { flagged.shutdown() }
        let flaggedPort = clientPort(flagged)
        let connection = try await HTTPConnection.connect(host: "127.0.0.1", port: flaggedPort, group: group)
        defer { connection.close() }
        let json = [("Content-Type", "application/json")]
        let set = try await connection.send(.POST, "/.banyan/faults", headers: json, body: Array(#"{"drop_peers":[2],"disk_delay_ms":5}"#.utf8))
        #expect(set.status == 200 && set.text == #"{"drop_peers":[2],"peer_delay_ms":0,"disk_delay_ms":5}"#)
        let bad = try await connection.send(.POST, "/.banyan/faults", headers: json, body: Array(#"{"drop_peers":[-1]}"#.utf8))
        #expect(bad.status == 400 && bad.text.contains("bad_fault_request"))
        let cleared = try await connection.send(.DELETE, "/.banyan/faults")
        #expect(cleared.status == 200 && cleared.text == #"{"drop_peers":[],"peer_delay_ms":0,"disk_delay_ms":0}"#)
        #expect(flagged.runtime.faults?.current == FaultSwitch.Faults())
    }

    // MARK: - The proxy

    @Test("the proxy passes requests (delayed when asked), resets open connections, and stalls them at a drop rate of 1")
    func proxy() async throws {
        let dir = try temporaryDirectory("chaos-proxy")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let c = Self.loopbackConfig(dir + "/data")
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { node.shutdown() }
        let group = MultiThreadedEventLoopGroup.singleton
        var settings = ChaosProxy.Settings()
        settings.delay = .milliseconds(150)
        let proxy = ChaosProxy(targetHost: "127.0.0.1", targetPort: clientPort(node), settings: settings) { _ in }
        defer { proxy.stop() }
        let port = try proxy.start(host: "127.0.0.1", port: 0)
        let connection = try await HTTPConnection.connect(host: "127.0.0.1", port: port, group: group)
        defer { connection.close() }
        var put = try await connection.send(.PUT, "/greeting.json?ns=proxy", body: Array(#""hello""#.utf8))
        for _ in 0..<50 where put.status == 503 {
            try await Task.sleep(nanoseconds: 100_000_000)  // the node elects itself first
            put = try await connection.send(.PUT, "/greeting.json?ns=proxy", body: Array(#""hello""#.utf8))
        }
        #expect(put.status == 200)
        let started = DispatchTime.now().uptimeNanoseconds
        let get = try await connection.send(.GET, "/greeting.json?ns=proxy")
        let elapsed = Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9
        #expect(get.status == 200 && get.text == #""hello""#)
        #expect(elapsed >= 0.3, "each way waits 150 ms: \(elapsed) s")
        #expect(proxy.stats.open == 1 && proxy.stats.bytesToClient > 0)
        proxy.resetAll()
        var closed = false
        for _ in 0..<50 where !closed {
            closed = !connection.isOpen
            if !closed { try await Task.sleep(nanoseconds: 20_000_000) }
        }
        #expect(closed, "the proxy reset the client's connection")
        #expect(proxy.stats.reset == 1)
        await #expect(throws: (any Error).self) { _ = try await connection.send(.GET, "/greeting.json?ns=proxy", timeout: .seconds(2)) }

        var dropping = ChaosProxy.Settings()
        dropping.dropRate = 1
        let stalling = ChaosProxy(targetHost: "127.0.0.1", targetPort: clientPort(node), settings: dropping) { _ in }
        defer { stalling.stop() }
        let stallingPort = try stalling.start(host: "127.0.0.1", port: 0)
        let stalled = try await HTTPConnection.connect(host: "127.0.0.1", port: stallingPort, group: group)
        defer { stalled.close() }
        await #expect(throws: (any Error).self) { _ = try await stalled.send(.GET, "/greeting.json?ns=proxy", timeout: .seconds(1)) }
        #expect(stalling.stats.stalled == 1 && stalling.stats.bytesToTarget == 0 && stalling.stats.bytesToClient == 0)
    }

    // MARK: - Real processes

    static func banyanBinary() throws -> String {
        let directory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
        // `swift test` runs the tests from the build directory, next to the `banyan` it built.
        for candidate in [directory.appendingPathComponent("banyan").path, directory.deletingLastPathComponent().appendingPathComponent("banyan").path] {
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        throw ChaosError("no banyan binary beside the test runner (\(directory.path)): run `swift build` first")
    }

    /// `banyan cluster local` on the given ports, its output in `dir/cluster.out`.
    static func startCluster(_ dir: String, clientPort: Int, peerPort: Int) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: try banyanBinary())
        p.arguments = ["cluster", "local", "--nodes", "3", "--dir", dir, "--client-port", "\(clientPort)", "--peer-port", "\(peerPort)"]
        FileManager.default.createFile(atPath: dir + "/cluster.out", contents: nil)
        let out = try FileHandle(forWritingTo: URL(fileURLWithPath: dir + "/cluster.out"))
        p.standardOutput = out
        p.standardError = out
        try p.run()
        return p
    }

    /// Runs `banyan chaos <args> --dir dir` and returns its exit status and output (polled, so
    /// no thread of the test's pool blocks on it; killed after `timeout` seconds).
    static func chaos(_ dir: String, _ args: [String], timeout: Double = 120) async throws -> (status: Int32, output: String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: try banyanBinary())
        p.arguments = ["chaos"] + args + ["--dir", dir]
        let path = dir + "/chaos-\(UInt64.random(in: 0...UInt64.max)).out"
        FileManager.default.createFile(atPath: path, contents: nil)
        let out = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        defer { try? out.close() }
        p.standardOutput = out
        p.standardError = out
        try p.run()
        let deadline = Date().addingTimeInterval(timeout)
        while p.isRunning && ProcessProbe.state(p.processIdentifier) != .exited {
            if Date() > deadline {
                p.terminate()
                throw ChaosError("banyan chaos \(args.joined(separator: " ")) still ran after \(timeout) s")
            }
            try await Task.sleep(nanoseconds: 50_000_000)
        }
        p.waitUntilExit()
        return (p.terminationStatus, (try? String(contentsOfFile: path, encoding: .utf8)) ?? "")
    }

    /// Stops the supervisor (SIGINT, as Ctrl-C) and, as a safety net, any node it left.
    static func stop(_ supervisor: Process, _ dir: String) {
        let nodes = (try? ClusterStateFile.read(directory: dir))?.nodes ?? []
        if supervisor.isRunning {
            kill(supervisor.processIdentifier, SIGINT)
            supervisor.waitUntilExit()
        }
        for node in nodes where ProcessProbe.state(of: node) != .exited {
            kill(node.pid, SIGCONT)
            kill(node.pid, SIGKILL)
        }
    }

    static func waitForLeader(_ controller: ChaosController, seconds: Double = 60) async throws -> UInt64 {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if (try? controller.state().nodes.count) == 3, let leader = await controller.leader() { return leader }
            try await Task.sleep(nanoseconds: 200_000_000)
        }
        throw ChaosError("no leader within \(seconds) s")
    }

    /// Seconds until a write through one of `nodes` is acknowledged (at most `bound`).
    static func writeCommits(_ controller: ChaosController, through nodes: [UInt64], bound: Double = 20) async throws -> Double {
        let started = Date()
        var n = 0
        while Date().timeIntervalSince(started) < bound {
            for node in nodes {
                n += 1
                if let r = try? await controller.request(node, .PUT, "/probe/w\(n).json?ns=chaostest-probe", body: "\(n)", timeout: 2), r.status == 200 {
                    return Date().timeIntervalSince(started)
                }
            }
            try await Task.sleep(nanoseconds: 50_000_000)
        }
        throw ChaosError("no write committed through nodes \(nodes) within \(bound) s")
    }

    @Test(
        "kill+restart, pause+resume, partition+heal and slow, each on the leader through the banyan chaos commands under a register and a set workload: linearizable, nothing lost; Ctrl-C of cluster local stops the restarted node too",
        .timeLimit(.minutes(3)))
    func faultsUnderLoad() async throws {
        let dir = try temporaryDirectory("chaos-faults")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let supervisor = try Self.startCluster(dir, clientPort: 30700, peerPort: 30710)
        defer { Self.stop(supervisor, dir) }
        let controller = ChaosController(directory: dir) { _ in }
        defer { controller.shutdown() }
        _ = try await Self.waitForLeader(controller)
        let workload = RegisterWorkload(cluster: controller, keys: 4, namespace: "chaostest")
        let set = SetWorkload(cluster: controller, namespace: "chaostest")
        let live = LiveNodes([1, 2, 3])
        let done = ManagedAtomicFlag()
        let load = Task {
            while !done.isSet { await workload.run(clients: 4, seconds: 1, nodes: { live.nodes }) }
        }
        let adds = Task {
            while !done.isSet { await set.run(seconds: 1, nodes: { live.nodes }) }
        }
        func run(_ args: String...) async throws {
            let (status, output) = try await Self.chaos(dir, args)
            #expect(status == 0, "banyan chaos \(args.joined(separator: " ")): \(output)")
        }
        try await Task.sleep(nanoseconds: 1_000_000_000)

        // kill -9 of the leader, then a restart with the recorded arguments.
        let killed = try await Self.waitForLeader(controller)
        let oldPID = try controller.state().node(killed).pid
        live.remove(killed)
        try await run("kill", "--node", "\(killed)")
        #expect(ProcessProbe.state(oldPID) == .exited)
        let others = [UInt64(1), 2, 3].filter { $0 != killed }
        let failover = try await Self.writeCommits(controller, through: others)
        try await Task.sleep(nanoseconds: 1_000_000_000)
        try await run("restart", "--node", "\(killed)")
        let restarted = try controller.state().node(killed)
        #expect(restarted.pid != oldPID && restarted.starts == 2 && ProcessProbe.state(of: restarted) == .running)
        #expect(!restarted.arguments.contains("--new-cluster"))
        live.add(killed)

        // SIGSTOP of the leader, then SIGCONT.
        let paused = try await Self.waitForLeader(controller)
        live.remove(paused)
        try await run("pause", "--node", "\(paused)")
        #expect(ProcessProbe.state(of: try controller.state().node(paused)) == .paused)
        let pauseFailover = try await Self.writeCommits(controller, through: [UInt64(1), 2, 3].filter { $0 != paused })
        try await Task.sleep(nanoseconds: 1_000_000_000)
        try await run("resume", "--node", "\(paused)")
        live.add(paused)

        // The leader isolated by a partition, then healed.
        let isolated = try await Self.waitForLeader(controller)
        let majority = [UInt64(1), 2, 3].filter { $0 != isolated }
        try await run("partition", "--groups", "\(isolated)/" + majority.map(String.init).joined(separator: ","))
        let switchState = try await controller.request(isolated, .GET, "/.banyan/faults")
        #expect(switchState.text.contains(#""drop_peers":[\#(majority[0]),\#(majority[1])]"#), "\(switchState.text)")
        let partitionFailover = try await Self.writeCommits(controller, through: majority)
        try await Task.sleep(nanoseconds: 1_500_000_000)
        try await run("heal")
        #expect(try controller.state().nodes.allSatisfy { $0.faults.dropPeers.isEmpty })

        // The leader's peer messages and fsyncs slowed, then back to full speed.
        let slowed = try await Self.waitForLeader(controller)
        try await run("slow", "--node", "\(slowed)", "--delay-ms", "300")
        #expect(try controller.state().node(slowed).faults == NodeFaults(peerDelayMs: 300, diskDelayMs: 300))
        let slowWrite = try await Self.writeCommits(controller, through: [1, 2, 3])
        try await Task.sleep(nanoseconds: 1_500_000_000)
        try await run("slow", "--node", "\(slowed)", "--delay-ms", "0")
        let afterAll = try await Self.writeCommits(controller, through: [1, 2, 3])
        print(
            String(
                format: "chaos test: a write committed %.1f s after kill -9, %.1f s after SIGSTOP, %.1f s after the partition, %.1f s under slowness, %.1f s after the heal",
                failover, pauseFailover, partitionFailover, slowWrite, afterAll))

        try await Task.sleep(nanoseconds: 1_000_000_000)
        done.set()
        await load.value
        await adds.value
        // Final reads through every node, then the checks.
        for id: UInt64 in [1, 2, 3] {
            var registers = false
            var members: Set<Int>?
            let deadline = Date().addingTimeInterval(30)
            while Date() < deadline && (!registers || members == nil) {
                if !registers { registers = await workload.finalReads(nodes: [id]) }
                if members == nil { members = await set.read(through: id) }
                if !registers || members == nil { try await Task.sleep(nanoseconds: 200_000_000) }
            }
            #expect(registers, "node \(id) answered final reads of every register")
            let read = try #require(members, "node \(id) answered a read of the set")
            #expect(set.acknowledged.subtracting(read).isEmpty, "acknowledged adds missing on node \(id): \(set.acknowledged.subtracting(read).sorted())")
        }
        #expect(workload.counts.ok > 100, "the workload ran: \(workload.counts)")
        #expect(set.acknowledged.count > 20, "the set workload ran: \(set.acknowledged.count) adds")
        #expect(workload.check() == .linearizable)

        let status = try await Self.chaos(dir, ["status"])
        #expect(status.status == 0 && status.output.components(separatedBy: " running,").count == 4, "\(status.output)")
        // Ctrl-C of the supervisor stops every node, the one chaos restarted (not its child) too.
        let pids = try controller.state().nodes.map(\.pid)
        kill(supervisor.processIdentifier, SIGINT)
        supervisor.waitUntilExit()
        #expect(pids.allSatisfy { ProcessProbe.state($0) == .exited }, "every node stopped: \(pids.map { ProcessProbe.state($0) })")
        #expect(!FileManager.default.fileExists(atPath: ClusterStateFile.path(in: dir)))
    }

    @Test("banyan chaos check: a short seeded run passes (linearizable, nothing lost) and reports its faults", .timeLimit(.minutes(3)))
    func checkCommand() async throws {
        let dir = try temporaryDirectory("chaos-check")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let supervisor = try Self.startCluster(dir, clientPort: 30720, peerPort: 30730)
        defer { Self.stop(supervisor, dir) }
        let controller = ChaosController(directory: dir) { _ in }
        defer { controller.shutdown() }
        _ = try await Self.waitForLeader(controller)
        let (status, output) = try await Self.chaos(dir, ["check", "--seconds", "14", "--seed", "5", "--hold", "1-2", "--gap", "0.5-1"])
        #expect(status == 0, "\(output)")
        #expect(output.contains("linearizability: linearizable"), "\(output)")
        #expect(output.contains("acknowledged writes lost: 0"), "\(output)")
        #expect(output.contains("fault 1: ") && output.contains("recovered: a write committed"), "\(output)")
        #expect(output.contains("PASS"), "\(output)")
        // Everything healed at the end: every node runs, no fault left.
        let state = try controller.state()
        #expect(state.nodes.allSatisfy { ProcessProbe.state(of: $0) == .running && $0.faults.isEmpty })
    }
}

/// A flag set once, read from any task.
final class ManagedAtomicFlag: Sendable {
    private let value = Mutex<Bool>(false)
    var isSet: Bool { value.withLock { $0 } }
    func set() { value.withLock { $0 = true } }
}
