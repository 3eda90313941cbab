import ArgumentParser
import BanyanCheckers
import BanyanOps
import Foundation
import Glibc
import NIOHTTP1

/// `banyan-cluster-test`: multi-process tests with real `banyan serve` processes on loopback
/// (docs/testing.md). Each scenario runs a register workload through random nodes while it
/// injects its fault, then checks that the nodes converge to the same tree and that the recorded
/// history (final reads through every node included) is linearizable, so no acknowledged write
/// was lost. Exit status 1 on any failure.
@main
struct ClusterTest: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "banyan-cluster-test",
        abstract: "Multi-process cluster tests: failover, freezes, restarts and membership changes under load.")

    @Option(name: .long, help: "The banyan binary to run.")
    var banyan: String = ".build/debug/banyan"

    @Option(name: .long, help: "Working directory (wiped first).")
    var dir: String = "/tmp/banyan-cluster-test"

    @Option(name: .long, help: "Scenarios to run (comma-separated): \(Scenario.allCases.map(\.rawValue).joined(separator: ",")); all but hostile when not given.")
    var scenarios: String = Scenario.allCases.filter { $0 != .hostile }.map(\.rawValue).joined(separator: ",")

    @Option(name: .long, help: "Seconds of load per phase.")
    var seconds: Double = 4

    @Option(name: .long, help: "Concurrent clients.")
    var clients: Int = 6

    @Option(name: .long, help: "First port; clients use base+id, peers base+100+id.")
    var portBase: Int = 19300

    @Option(name: .long, help: "Attacks the hostile scenario leaves out (comma-separated): \(HostileAttack.allCases.map(\.rawValue).joined(separator: ",")).")
    var hostileSkip: String = ""
    @Option(name: .long, help: "Configuration YAML appended to every node's file, for experiments (e.g. $'raft:\\n  snapshot_log_bytes: 0'); a section the scenario sets too must not be repeated.")
    var extraConfig: String = ""

    @Flag(name: .long, help: "Checker self-test: the workload's reads skip ReadIndex (consistency=stale); the run must then fail.")
    var sabotageStaleReads = false

    enum Scenario: String, CaseIterable {
        case anyNode = "any-node"
        case killLeader = "kill-leader"
        case freezeLeader = "freeze-leader"
        case laggingFollower = "lagging-follower"
        case restartAll = "restart-all"
        case membership
        case wipedMember = "wiped-member"
        case limits
        case backup
        case diskFull = "disk-full"
        /// Issue 18's proof (HostileScenario.swift): measured on a release build, so not run by
        /// default.
        case hostile
    }

    func run() async throws {
        raiseOpenFileLimit()
        var failures: [String] = []
        for name in scenarios.split(separator: ",") {
            guard let scenario = Scenario(rawValue: String(name)) else { throw ValidationError("unknown scenario \(name)") }
            let started = Date()
            print("== \(scenario.rawValue)")
            do {
                try await runScenario(scenario)
                print("== \(scenario.rawValue): passed in \(String(format: "%.1f", Date().timeIntervalSince(started))) s")
            } catch {
                print("== \(scenario.rawValue): FAILED: \(error)")
                failures.append("\(scenario.rawValue): \(error)")
            }
        }
        if !failures.isEmpty {
            print("failed scenarios:\n" + failures.joined(separator: "\n"))
            throw ExitCode(1)
        }
        print("all cluster scenarios passed")
    }

    struct Failure: Error, CustomStringConvertible, Sendable {
        let description: String
        init(_ d: String) { description = d }
    }

    func runScenario(_ scenario: Scenario) async throws {
        let base = "\(dir)/\(scenario.rawValue)"
        try? FileManager.default.removeItem(atPath: base)
        let cluster = LocalCluster(
            executable: banyan, directory: base, nodes: 3, clientPortBase: portBase, peerPortBase: portBase + 100, logLevel: "notice")
        defer { cluster.shutdown() }
        // Small snapshots, so that the membership scenario's new node is sent one over the peer
        // transport; a short read timeout for the limits scenario, whose thousands of idle
        // connections all come from 127.0.0.1 (so the per-client cap is raised with the total).
        let config = base + ".yaml"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        // The backup scenario reads the source at its backup's index (`?at=`), which reaches back
        // a snapshot interval or two: longer intervals there, so the seconds between the backup
        // and that read cannot leave its window.
        let snapshotEntries = scenario == .backup ? 5_000 : 300
        // The disk-full scenario's nodes each get a small disk of their own, and a minimum free
        // space to match.
        let disks = scenario == .diskFull ? try NodeDisks(cluster: cluster, ids: [1, 2, 3], bytes: 96 << 20, minFree: 16 << 20, ballast: 8 << 20) : nil
        defer { disks?.unmount(stopping: cluster) }
        let storage = disks.map { "storage:\n  min_free_bytes: \($0.minFree)\n  ballast_bytes: \($0.ballast)\n" } ?? ""
        let settings =
            scenario == .hostile
            ? Self.hostileSettings
            : "raft:\n  snapshot_entries: \(snapshotEntries)\nhttp:\n  request_read_timeout_s: 2\n  max_connections: 3000\n  max_connections_per_client: 3000\n  max_body_bytes: 1048576\n\(storage)"
        try (settings + (extraConfig.isEmpty ? "" : "\n" + extraConfig + "\n")).write(toFile: config, atomically: true, encoding: .utf8)
        cluster.extraArguments = ["--config", config]
        for id: UInt64 in [1, 2, 3] { try cluster.start(id) }
        let first = try await cluster.waitForLeader(timeout: 30)
        print("leader: node \(first)")
        let workload = RegisterWorkload(cluster: cluster)
        workload.staleReads = sabotageStaleReads
        let live = LiveSet([1, 2, 3])
        // A failed check of the hostile scenario, reported after the history's checks below.
        var failedChecks: Failure?

        switch scenario {
        case .anyNode:
            // Write through any node, read through any other.
            for w: UInt64 in [1, 2, 3] {
                let r = w % 3 + 1
                let put = try await cluster.request(w, .PUT, "/greetings/from\(w).json?ns=jepsen", body: #""hello from \#(w)""#)
                guard put.status == 200 else { throw Failure("PUT via node \(w): \(put.status) \(put.text)") }
                let get = try await cluster.request(r, .GET, "/greetings/from\(w).json?ns=jepsen")
                guard get.text == #""hello from \#(w)""# else { throw Failure("GET via node \(r) after PUT via \(w): \(get.status) \(get.text)") }
            }
            try await streamOpenedDuringWrites(cluster)
            await workload.run(clients: clients, seconds: seconds, nodes: { live.nodes })
        case .killLeader:
            async let load: Void = workload.run(clients: clients, seconds: seconds * 3, nodes: { live.nodes })
            try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
            let leader = try await cluster.waitForLeader()
            print("kill -9 leader node \(leader)")
            live.remove(leader)
            cluster.kill9(leader)
            let next = try await cluster.waitForLeader(among: live.nodes)
            print("new leader: node \(next)")
            try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
            print("restart node \(leader)")
            try cluster.start(leader)
            live.add(leader)
            await load
        case .freezeLeader:
            async let load: Void = workload.run(clients: clients, seconds: seconds * 3, nodes: { live.nodes })
            try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
            let leader = try await cluster.waitForLeader()
            print("SIGSTOP leader node \(leader)")
            cluster.signal(leader, SIGSTOP)
            live.remove(leader)
            let next = try await cluster.waitForLeader(among: live.nodes)
            print("new leader: node \(next)")
            try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
            print("SIGCONT node \(leader)")
            cluster.signal(leader, SIGCONT)
            live.add(leader)
            await load
        case .laggingFollower:
            try await laggingFollower(cluster, live: live, workload: workload)
        case .restartAll:
            await workload.run(clients: clients, seconds: seconds, nodes: { live.nodes })
            print("stop every node (SIGTERM), then start them again")
            cluster.stopAll()
            for id: UInt64 in [1, 2, 3] { try cluster.start(id) }
            _ = try await cluster.waitForLeader(timeout: 30)
            await workload.run(clients: clients, seconds: seconds, nodes: { live.nodes })
            print("kill -9 every node, then start them again")
            for id: UInt64 in [1, 2, 3] { cluster.kill9(id) }
            for id: UInt64 in [1, 2, 3] { try cluster.start(id) }
            _ = try await cluster.waitForLeader(timeout: 30)
            await workload.run(clients: clients, seconds: seconds, nodes: { live.nodes })
        case .membership:
            async let load: Void = workload.run(clients: clients, seconds: seconds * 4, nodes: { live.nodes })
            try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
            print("start node 4 blank (--join) and add it as a learner")
            try cluster.start(4, join: true)
            try await leaderCall(cluster, live.nodes, .POST, "/.banyan/members", body: #"{"id":4,"peer_address":"127.0.0.1:\#(cluster.peerPort(4))"}"#)
            try await waitUntil("node 4 is promoted to voter", timeout: 30) {
                guard let leader = try? await cluster.waitForLeader(among: live.nodes, timeout: 5), let s = await cluster.status(leader) else { return false }
                return (s["voters"] as? [NSNumber])?.map(\.uint64Value).contains(4) == true
            }
            live.add(4)
            // The log was compacted long before node 4 arrived: it must have installed a snapshot.
            if let s = await cluster.status(4), let snap = (s["snapshot_index"] as? NSNumber)?.intValue {
                print("node 4 snapshot index \(snap)")
                guard snap > 0 else { throw Failure("node 4 caught up without a snapshot; the test meant to stream one") }
            }
            try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
            let leader = try await cluster.waitForLeader(among: live.nodes)
            print("remove the leader, node \(leader)")
            try await leaderCall(cluster, live.nodes, .DELETE, "/.banyan/members/\(leader)")
            live.remove(leader)
            try await waitUntil("a new leader without node \(leader)", timeout: 30) {
                guard let l = try? await cluster.waitForLeader(among: live.nodes, timeout: 5), l != leader else { return false }
                guard let s = await cluster.status(l) else { return false }
                return (s["voters"] as? [NSNumber])?.map(\.uint64Value).contains(leader) == false
            }
            await load
            cluster.kill9(leader)
        case .wipedMember:
            try await wipedMember(cluster, live: live, workload: workload)
        case .limits:
            try await limits(cluster, live: live, workload: workload)
        case .backup:
            try await backupScenario(cluster, live: live, workload: workload)
        case .diskFull:
            guard let disks else { throw Failure("the disk-full scenario has no disks") }
            try await diskFull(cluster, live: live, workload: workload, disks: disks)
        case .hostile:
            failedChecks = try await hostile(cluster, live: live, workload: workload)
        }
        print("load: \(workload.counts)")
        try await converge(cluster, nodes: live.nodes)
        guard await workload.finalReads(nodes: live.nodes) else { throw Failure("final reads failed on some node") }
        let verdict = workload.check()
        print("history: \(workload.history.count) operations; linearizability: \(verdict)")
        guard verdict == .linearizable else { throw Failure("history is \(verdict)") }
        guard workload.counts.ok > 20 else { throw Failure("too few operations succeeded (\(workload.counts))") }
        if let failedChecks { throw failedChecks }
    }

    /// An event stream opened on one node while writes go through another: its first event is a
    /// `put` of the whole value, the values it shows never go backwards, and it ends with the
    /// last acknowledged write.
    func streamOpenedDuringWrites(_ cluster: LocalCluster) async throws {
        let writes = 60
        let writer = Task { () -> Int in
            var acknowledged = 0
            for i in 1...writes {
                let r = try await cluster.request(1, .PUT, "/counter.json?ns=sse", body: "\(i)")
                guard r.status == 200 else { throw Failure("PUT \(i) via node 1: \(r.status) \(r.text)") }
                acknowledged = i
            }
            return acknowledged
        }
        try await Task.sleep(nanoseconds: 100_000_000)  // the stream opens part-way through
        let stream = try await RawConnection.open(port: cluster.clientPort(2))
        defer { stream.close() }
        stream.send("GET /counter.json?ns=sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
        let last = try await writer.value
        var text = ""
        let deadline = Date().addingTimeInterval(10)
        var values: [Int] = []
        var events: [String] = []
        while Date() < deadline {
            text += stream.receive(timeoutSeconds: 1)
            let lines = text.split(whereSeparator: \.isNewline).map(String.init)
            events = lines.filter { $0.hasPrefix("event: ") }.map { String($0.dropFirst(7)) }
            values = lines.filter { $0.hasPrefix("data: {") }.compactMap { line -> Int? in
                guard let data = line.dropFirst(6).data(using: .utf8),
                    let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
                else { return nil }
                return (object["data"] as? NSNumber)?.intValue
            }
            if values.last == last { break }
        }
        guard events.first == "put" else { throw Failure("the stream began with \(events.first ?? "nothing"), not put: \(text.prefix(300))") }
        guard values.last == last else { throw Failure("the stream ended at \(values.last.map(String.init) ?? "nothing"), not \(last)") }
        guard zip(values, values.dropFirst()).allSatisfy({ $0 <= $1 }) else { throw Failure("the stream went backwards: \(values)") }
        print("event stream opened during \(writes) writes: \(values.count) events from \(values.first ?? 0) to \(last), in order")
    }

    /// A follower that missed writes answers reads only once it has caught up: reads that began
    /// while it was frozen (answered after SIGCONT) must show every write acknowledged before
    /// they began; restarted after kill -9 while the other two nodes are frozen, it cannot answer
    /// a linearizable read at all. A node that answers from its own state (the self-test's
    /// `consistency=stale`) is caught there by construction: every key was written, with an
    /// acknowledgement, while it was away, and nothing can reach it before the reads.
    func laggingFollower(_ cluster: LocalCluster, live: LiveSet, workload: RegisterWorkload) async throws {
        async let load: Void = workload.run(clients: clients, seconds: seconds * 5, nodes: { live.nodes })
        try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
        let leader = try await cluster.waitForLeader()
        guard let follower = live.nodes.first(where: { $0 != leader }) else { throw Failure("no follower to freeze") }
        let probe = 20_000  // client ids of the probes, apart from the workload's
        print("SIGSTOP follower node \(follower); every key is written through node \(leader), then read through node \(follower)")
        cluster.signal(follower, SIGSTOP)
        // Each probe write must be acknowledged: one with an unknown outcome could be ordered
        // after the reads below and excuse a stale answer.
        func writeEveryKey(through node: UInt64) async throws {
            for key in workload.keys where await !workload.write(client: probe, node: node, key: key) {
                throw Failure("probe write of \(key) through node \(node) was not acknowledged")
            }
        }
        try await writeEveryKey(through: leader)
        let frozenReads = Task {
            await withTaskGroup(of: Bool.self) { group in
                for (i, key) in workload.keys.enumerated() {
                    group.addTask { await workload.read(client: probe + 1 + i, node: follower, key: key) != nil }
                }
                return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
        }
        try await Task.sleep(nanoseconds: UInt64(min(seconds, 4) * 1e9 / 2))
        print("SIGCONT node \(follower)")
        cluster.signal(follower, SIGCONT)
        let answered = await frozenReads.value
        print("reads queued at the frozen follower: \(answered) of \(workload.keys.count) answered")
        guard answered > 0 else { throw Failure("no read queued at the frozen follower was answered") }

        try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
        let others = live.nodes.filter { $0 != follower }
        let current = try await cluster.waitForLeader(among: others)
        print("kill -9 follower node \(follower); every key is written through node \(current); SIGSTOP nodes \(others), restart node \(follower) alone and read through it")
        live.remove(follower)
        cluster.kill9(follower)
        try await writeEveryKey(through: current)
        for id in others { cluster.signal(id, SIGSTOP) }
        var resumed = false
        defer { if !resumed { for id in others { cluster.signal(id, SIGCONT) } } }
        try cluster.start(follower)
        try await waitUntil("node \(follower) answers status", timeout: 20) { await cluster.status(follower) != nil }
        // No leader can be reached: a linearizable read cannot be answered (not recorded), while
        // one answered from the node's own state misses every write above.
        var isolated = 0
        for (i, key) in workload.keys.enumerated() where await workload.read(client: probe + 1 + i, node: follower, key: key, timeout: 1) != nil {
            isolated += 1
        }
        print("reads answered by the isolated follower: \(isolated) of \(workload.keys.count)")
        if !workload.staleReads && isolated > 0 {
            throw Failure("node \(follower) answered \(isolated) linearizable reads while no quorum could be reached")
        }
        for id in others { cluster.signal(id, SIGCONT) }
        resumed = true
        let deadline = Date().addingTimeInterval(20)
        for (i, key) in workload.keys.enumerated() {
            var answered = false
            while !answered && Date() < deadline {
                answered = await workload.read(client: probe + 1 + i, node: follower, key: key, timeout: 2) != nil
                if !answered { try await Task.sleep(nanoseconds: 20_000_000) }
            }
            guard answered else { throw Failure("the restarted follower did not answer a read of \(key) within 20 s of rejoining") }
        }
        live.add(follower)
        print("the rejoined follower answered reads of every key")
        await load
    }

    /// A founder loses its disk and is restarted with its usual arguments (as systemd would, with
    /// `initial_members` still configured but no `--new-cluster`). It must come back voteless: with
    /// the leader then killed, the one intact voter and the amnesiac cannot elect anyone (an
    /// election there could lose acknowledged writes). The operator's procedure (remove the id, add
    /// it back) then makes it a voter again, and no acknowledged write is lost. Then issue 14 item
    /// 3 as reported: the node, now joined by an add, is wiped again and started with `--join`,
    /// and must stay voteless through two leadership transfers (leaders replay its old add and
    /// promotion to it) until it is removed and added back once more.
    func wipedMember(_ cluster: LocalCluster, live: LiveSet, workload: RegisterWorkload) async throws {
        async let load: Void = workload.run(clients: clients, seconds: seconds * 5, nodes: { live.nodes })
        try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
        let leader = try await cluster.waitForLeader()
        guard let wiped = [UInt64(1), 2, 3].first(where: { $0 != leader }) else { throw Failure("no follower") }
        let intact = [UInt64(1), 2, 3].first { $0 != leader && $0 != wiped } ?? 0
        print("kill -9 follower node \(wiped), delete its data directory, start it with the same arguments")
        live.remove(wiped)
        cluster.kill9(wiped)
        try FileManager.default.removeItem(atPath: cluster.dataDirectory(wiped))
        try cluster.start(wiped)
        try await waitUntil("node \(wiped) answers status", timeout: 20) { await cluster.status(wiped) != nil }
        guard let s = await cluster.status(wiped), (s["may_vote"] as? Bool) == false else {
            throw Failure("the wiped node may vote: \(String(describing: await cluster.status(wiped)))")
        }
        print("node \(wiped) is back, voteless")
        live.add(wiped)
        try await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
        print("kill -9 leader node \(leader): nodes \(intact) and \(wiped) must not elect a leader")
        live.remove(leader)
        cluster.kill9(leader)
        if let unexpected = try? await cluster.waitForLeader(among: [intact, wiped], timeout: 4) {
            throw Failure("node \(unexpected) became leader with the amnesiac's vote")
        }
        print("no leader without node \(leader), as required; restart it")
        try cluster.start(leader)
        live.add(leader)
        _ = try await cluster.waitForLeader(timeout: 30)
        print("remove node \(wiped) and add it back as a learner")
        try await removeAndAddBack(cluster, wiped, through: [leader, intact])
        // Issue 14 item 3 as reported: the node now joined by an add (its learner and promote
        // entries are in the log). Wiped again and started with --join under the same id, it must
        // stay voteless while leaders replay that history to it, until it is removed and added
        // back under its new incarnation.
        print("kill -9 node \(wiped) again, delete its data directory, start it with --join")
        live.remove(wiped)
        cluster.kill9(wiped)
        try FileManager.default.removeItem(atPath: cluster.dataDirectory(wiped))
        try cluster.start(wiped, join: true)
        try await waitUntil("node \(wiped) answers status", timeout: 20) { await cluster.status(wiped) != nil }
        live.add(wiped)
        for round in 1...2 {
            let current = try await cluster.waitForLeader(among: [leader, intact], timeout: 20)
            let target = current == leader ? intact : leader
            print("transfer leadership \(current) -> \(target) (round \(round)); node \(wiped) must stay voteless")
            // Asked again while waiting: a target that lags is refused until it catches up.
            try await waitUntil("node \(target) leads", timeout: 20) {
                if let now = try? await cluster.waitForLeader(among: [leader, intact], timeout: 2), now != target {
                    _ = try? await cluster.request(now, .POST, "/.banyan/transfer?to=\(target)")
                }
                return (try? await cluster.waitForLeader(among: [leader, intact], timeout: 2)) == target
            }
            try await Task.sleep(nanoseconds: 1_500_000_000)
            guard let s = await cluster.status(wiped), (s["may_vote"] as? Bool) == false else {
                throw Failure("the re-wiped node regained its vote by replaying its history: \(String(describing: await cluster.status(wiped)))")
            }
        }
        print("node \(wiped) stayed voteless through two leader changes; remove it and add it back")
        try await removeAndAddBack(cluster, wiped, through: [leader, intact])
        await load
        print("restart every node (SIGTERM) after these membership changes")
        cluster.stopAll()
        for id: UInt64 in [1, 2, 3] { try cluster.start(id) }
        let after = try await cluster.waitForLeader(timeout: 30)
        guard let s = await cluster.status(after), Set((s["voters"] as? [NSNumber])?.map(\.uint64Value) ?? []) == [1, 2, 3],
            (await cluster.status(wiped)?["may_vote"] as? Bool) == true
        else { throw Failure("after a restart the membership is \(String(describing: await cluster.status(after)?["voters"]))") }
        print("after the restart: leader \(after), voters 1, 2, 3")
        await workload.run(clients: clients, seconds: seconds, nodes: { live.nodes })
    }

    /// The runbook's procedure for a member that lost its data: remove the id through the
    /// leader, add it back (a learner, promoted once caught up), and wait until it is a voter
    /// that may vote.
    func removeAndAddBack(_ cluster: LocalCluster, _ id: UInt64, through nodes: [UInt64]) async throws {
        try await leaderCall(cluster, nodes, .DELETE, "/.banyan/members/\(id)")
        try await leaderCall(
            cluster, nodes, .POST, "/.banyan/members", body: #"{"id":\#(id),"peer_address":"127.0.0.1:\#(cluster.peerPort(id))"}"#)
        try await waitUntil("node \(id) is a voter again and may vote", timeout: 30) {
            guard let l = try? await cluster.waitForLeader(among: nodes, timeout: 5), let s = await cluster.status(l),
                (s["voters"] as? [NSNumber])?.map(\.uint64Value).contains(id) == true
            else { return false }
            return (await cluster.status(id)?["may_vote"] as? Bool) == true
        }
        print("node \(id) is a voter again")
    }

    /// Bad input and abusive clients under load: oversize bodies, invalid JSON and paths,
    /// excessive depth, a request that never finishes, and thousands of idle connections. The
    /// node answers each with a clear error, keeps serving, and its memory stays bounded.
    func limits(_ cluster: LocalCluster, live: LiveSet, workload: RegisterWorkload) async throws {
        async let load: Void = workload.run(clients: clients, seconds: seconds * 2, nodes: { live.nodes })
        let node: UInt64 = 1
        func expect(_ method: HTTPMethod, _ uri: String, _ body: String?, status: Int, contains: String) async throws {
            let r = try await cluster.request(node, method, uri, body: body, timeout: 10)
            guard r.status == status, r.text.contains(contains) else {
                throw Failure("\(method) \(uri): expected \(status) containing '\(contains)', got \(r.status) \(r.text)")
            }
        }
        try await expect(.PUT, "/x.json?ns=limits", String(repeating: "a", count: 2 << 20), status: 413, contains: "Payload too large")
        try await expect(.PUT, "/x.json?ns=limits", "{\"a\":", status: 400, contains: "couldn't parse JSON")
        try await expect(.PUT, "/a.b/c.json?ns=limits", "1", status: 400, contains: "Invalid path")
        try await expect(.GET, "/x?ns=limits", nil, status: 404, contains: ".json")
        let deep = String(repeating: "{\"a\":", count: 40) + "1" + String(repeating: "}", count: 40)
        try await expect(.PUT, "/x.json?ns=limits", deep, status: 400, contains: "nested too deeply")
        try await expect(.GET, "/x.json?ns=limits&limitToFirst=1", nil, status: 400, contains: "orderBy must be defined")
        // Operator endpoints refuse bad input the same way.
        try await expect(.POST, "/.banyan/members", "{\"id\":\"x\"}", status: 400, contains: "peer_address")
        try await expect(.POST, "/.banyan/members", "not json", status: 400, contains: "peer_address")
        try await expect(.DELETE, "/.banyan/members/abc", nil, status: 400, contains: "bad node id")
        try await expect(.POST, "/.banyan/transfer?to=x", nil, status: 400, contains: "to=")
        try await expect(.GET, "/.banyan/nothing", nil, status: 404, contains: "no such operator endpoint")
        print("bad requests: clear errors")
        guard let pid = cluster.pid(node) else { throw Failure("node 1 is not running") }
        let rssBefore = ClusterBench.residentMiB(pid)
        // A request whose body never arrives gets 408 after the read timeout (2 s here).
        let stalled = try await RawConnection.open(port: cluster.clientPort(node))
        stalled.send("PUT /slow.json?ns=limits HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\"")
        let answer = stalled.receive(timeoutSeconds: 6)
        guard answer.contains("408") else { throw Failure("a stalled request got '\(answer.prefix(80))' instead of 408") }
        stalled.close()
        print("stalled request: 408")
        // A request dripped a byte at a time (each byte resets an idle timer) still gets 408
        // once the whole request has taken longer than the read timeout.
        let drip = try await RawConnection.open(port: cluster.clientPort(node))
        let dripStarted = Date()
        drip.send("PUT /drip.json?ns=limits HTTP/1.1\r\nHost: x\r\nContent-Length: 400\r\n\r\n")
        var dripAnswer = ""
        for byte in String(repeating: "1", count: 400) {
            drip.send(String(byte))
            dripAnswer += drip.receiveAvailable()
            if !dripAnswer.isEmpty || Date().timeIntervalSince(dripStarted) > 8 { break }
            try await Task.sleep(nanoseconds: 300_000_000)
        }
        dripAnswer += drip.receive(timeoutSeconds: 1)
        drip.close()
        let dripSeconds = Date().timeIntervalSince(dripStarted)
        guard dripAnswer.contains("408"), dripSeconds < 5 else {
            throw Failure("a dripped request got '\(dripAnswer.prefix(80))' after \(String(format: "%.1f", dripSeconds)) s instead of 408 within the read timeout")
        }
        print(String(format: "dripped body: 408 after %.1f s", dripSeconds))
        // A head dripped a byte at a time never completes: the node closes the connection.
        let dripHead = try await RawConnection.open(port: cluster.clientPort(node))
        let headStarted = Date()
        var headClosed = false
        for byte in "GET /x.json?ns=limits HTTP/1.1\r\nHost: x\r\nX-Slow: " + String(repeating: "y", count: 100) {
            dripHead.send(String(byte))
            if dripHead.isClosedByPeer() || Date().timeIntervalSince(headStarted) > 8 {
                headClosed = dripHead.isClosedByPeer()
                break
            }
            try await Task.sleep(nanoseconds: 300_000_000)
        }
        dripHead.close()
        let headSeconds = Date().timeIntervalSince(headStarted)
        guard headClosed, headSeconds < 5 else { throw Failure("a dripped request head was still open after \(String(format: "%.1f", headSeconds)) s") }
        print(String(format: "dripped head: closed after %.1f s", headSeconds))
        // Two thousand idle connections: the node keeps serving; they are closed after the read timeout.
        var idle: [RawConnection] = []
        for _ in 0..<2000 { if let c = try? await RawConnection.open(port: cluster.clientPort(node)) { idle.append(c) } }
        let r = try await cluster.request(node, .GET, "/.banyan/status", timeout: 10)
        guard r.status == 200 else { throw Failure("node stopped answering with \(idle.count) idle connections open") }
        let rssIdle = ClusterBench.residentMiB(pid)
        try await Task.sleep(nanoseconds: 4_000_000_000)
        let closed = idle.filter { $0.isClosedByPeer() }.count
        for c in idle { c.close() }
        print(String(format: "idle connections: %d opened, node answered, %d closed by the node after the timeout; RSS %.0f → %.0f MiB", idle.count, closed, rssBefore, rssIdle))
        guard closed > idle.count * 9 / 10 else { throw Failure("only \(closed) of \(idle.count) idle connections were closed") }
        guard rssIdle - rssBefore < 200 else { throw Failure("memory grew by \(rssIdle - rssBefore) MiB with idle connections") }
        await load
    }

    /// Every live node ends with the same tree (read locally, without ReadIndex).
    func converge(_ cluster: LocalCluster, nodes: [UInt64]) async throws {
        var last: [UInt64: String] = [:]
        try await waitUntil("nodes \(nodes) converge to one tree", timeout: 30) {
            last = [:]
            for id in nodes {
                guard let r = try? await cluster.request(id, .GET, "/.json?ns=jepsen&consistency=stale"), r.status == 200 else { return false }
                last[id] = r.text
            }
            return Set(last.values).count == 1
        }
        print("converged: \(nodes.count) nodes, \(last.values.first?.utf8.count ?? 0) bytes of JSON each")
    }

    func leaderCall(_ cluster: LocalCluster, _ nodes: [UInt64], _ method: HTTPMethod, _ uri: String, body: String? = nil) async throws {
        let deadline = Date().addingTimeInterval(30)
        var last = ""
        while Date() < deadline {
            for id in nodes {
                guard let r = try? await cluster.request(id, method, uri, body: body, timeout: 15) else { continue }
                if r.status == 200 { return }
                last = "node \(id): \(r.status) \(r.text)"
            }
            try await Task.sleep(nanoseconds: 200_000_000)
        }
        throw Failure("\(method) \(uri) failed: \(last)")
    }

    func waitUntil(_ what: String, timeout: Double, _ condition: () async -> Bool) async throws {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if await condition() { return }
            try await Task.sleep(nanoseconds: 100_000_000)
        }
        throw Failure("timed out waiting until \(what)")
    }
}

/// The nodes clients may use right now.
final class LiveSet: @unchecked Sendable {
    private let lock = NSLock()
    private var set: Set<UInt64>
    init(_ nodes: [UInt64]) { set = Set(nodes) }
    var nodes: [UInt64] { lock.withLock { set.sorted() } }
    func add(_ id: UInt64) { lock.withLock { _ = set.insert(id) } }
    func remove(_ id: UInt64) { lock.withLock { _ = set.remove(id) } }
}

/// A plain TCP connection for abusive-client checks (blocking, with timeouts).
final class RawConnection: @unchecked Sendable {
    let fd: Int32

    private init(fd: Int32) { self.fd = fd }

    static func open(port: Int) async throws -> RawConnection { try connect(port: port) }

    /// Connects to 127.0.0.1:`port`, blocking; from loopback address `source` when given
    /// (another 127.x.y.z address is another client IP to the node's per-client caps).
    static func connect(port: Int, from source: String? = nil) throws -> RawConnection {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw ClusterTest.Failure("socket() failed") }
        if let source {
            // IP_BIND_ADDRESS_NO_PORT (24, Linux): the port is chosen at connect, per
            // destination, so thousands of bound sockets do not use up the ephemeral range.
            var one: Int32 = 1
            _ = setsockopt(fd, Int32(IPPROTO_IP), 24, &one, socklen_t(MemoryLayout<Int32>.size))
            var local = sockaddr_in()
            local.sin_family = sa_family_t(AF_INET)
            local.sin_addr.s_addr = inet_addr(source)
            let bound = withUnsafePointer(to: &local) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard bound == 0 else {
                Glibc.close(fd)
                throw ClusterTest.Failure("bind to \(source) failed")
            }
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let ok = withUnsafePointer(to: &address) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard ok == 0 else {
            Glibc.close(fd)
            throw ClusterTest.Failure("connect failed")
        }
        return RawConnection(fd: fd)
    }

    func send(_ text: String) { send(bytes: Array(text.utf8)) }

    func send(bytes: [UInt8]) {
        _ = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    /// Reads what arrives within the timeout (until the peer closes or the time is up).
    func receive(timeoutSeconds: Int) -> String {
        var out: [UInt8] = []
        let deadline = Date().addingTimeInterval(Double(timeoutSeconds))
        var buffer = [UInt8](repeating: 0, count: 4096)
        while Date() < deadline {
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, 100) > 0 else { continue }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            out += buffer[0..<n]
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// What has arrived already, without waiting.
    func receiveAvailable() -> String {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        return n > 0 ? String(decoding: buffer[0..<n], as: UTF8.self) : ""
    }

    /// True when the peer has closed the connection (readable with zero bytes, or reset).
    func isClosedByPeer() -> Bool {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, 0) > 0 else { return false }
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) <= 0
    }

    func close() { Glibc.close(fd) }
}
