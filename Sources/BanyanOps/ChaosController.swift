import Foundation
import Glibc
public import NIOHTTP1
import NIOCore
public import NIOPosix

/// The faults of `banyan chaos` against a cluster started by `banyan cluster local` (docs/chaos.md):
/// process faults by signal (kill -9, SIGSTOP, SIGCONT, a restart with the recorded arguments)
/// and network and disk faults through each node's fault switch (`/.banyan/faults`). Every
/// change is written to the cluster's state file first or right after, so a command run from
/// another shell, or the supervisor's Ctrl-C, sees the cluster as it is.
public final class ChaosController: NodeRequester, @unchecked Sendable {
    public let directory: String
    public let group: MultiThreadedEventLoopGroup
    /// Where progress lines go (stdout for the commands).
    public let log: @Sendable (String) -> Void

    public init(directory: String, log: @escaping @Sendable (String) -> Void) {
        self.directory = directory
        self.log = log
        group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    }

    public func shutdown() { try? group.syncShutdownGracefully() }

    public func state() throws(ChaosError) -> ClusterStateFile { try ClusterStateFile.read(directory: directory) }

    // MARK: - Requests

    public func perform(
        _ id: UInt64, _ method: HTTPMethod, _ uri: String, headers: [(String, String)], body: String?, timeout: Int64
    ) async throws -> HTTPResult {
        let node = try state().node(id)
        let address = try Self.hostPort(node.clientAddress)
        let c = try await HTTPConnection.connect(host: address.host, port: address.port, group: group, timeout: .milliseconds(min(2_000, timeout * 1_000)))
        defer { c.close() }
        var all = headers
        if let token = ProcessInfo.processInfo.environment["BANYAN_ADMIN_TOKEN"], !token.isEmpty, uri.hasPrefix("/.banyan/") {
            all.append(("Authorization", "Bearer \(token)"))
        }
        if body != nil, uri.hasPrefix("/.banyan/") { all.append(("Content-Type", "application/json")) }
        return try await c.send(method, uri, headers: all, body: body.map { Array($0.utf8) }, timeout: .seconds(timeout))
    }

    static func hostPort(_ text: String) throws(ChaosError) -> (host: String, port: Int) {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]) else {
            throw ChaosError("'\(text)' is not host:port")
        }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return (host, port)
    }

    /// The node's `/.banyan/status` JSON, or nil when it does not answer within `timeout` s.
    public func status(_ id: UInt64, timeout: Int64 = 2) async -> [String: Any]? {
        guard let r = try? await request(id, .GET, "/.banyan/status", timeout: timeout), r.status == 200 else { return nil }
        return (try? JSONSerialization.jsonObject(with: Data(r.body))) as? [String: Any]
    }

    /// The leader as some running node reports it (asking each in turn), or nil.
    public func leader(among ids: [UInt64]? = nil) async -> UInt64? {
        let state = try? self.state()
        for id in ids ?? state?.ids ?? [] {
            if let node = try? state?.node(id), ProcessProbe.state(of: node) != .running { continue }
            if let s = await status(id, timeout: 1), let l = (s["leader"] as? NSNumber)?.uint64Value, l != 0 { return l }
        }
        return nil
    }

    // MARK: - Process faults

    /// kill -9 of node `id`; waits until the process is gone.
    public func kill(_ id: UInt64) throws(ChaosError) {
        let node = try state().node(id)
        guard ProcessProbe.state(of: node) != .exited else { throw ChaosError("node \(id) is not running (pid \(node.pid) has exited)") }
        Glibc.kill(node.pid, SIGKILL)
        guard ProcessProbe.wait(for: node.pid, seconds: 10, until: { ProcessProbe.state(node.pid) == .exited }) else {
            throw ChaosError("node \(id) (pid \(node.pid)) still runs 10 s after SIGKILL")
        }
        log("kill -9 node \(id) (pid \(node.pid))")
    }

    /// SIGSTOP of node `id`: the process freezes (its sockets stay open, like a long GC pause).
    public func pause(_ id: UInt64) throws(ChaosError) {
        let node = try state().node(id)
        switch ProcessProbe.state(of: node) {
        case .exited: throw ChaosError("node \(id) is not running (pid \(node.pid) has exited)")
        case .paused: throw ChaosError("node \(id) (pid \(node.pid)) is already paused")
        case .running: break
        }
        Glibc.kill(node.pid, SIGSTOP)
        guard ProcessProbe.wait(for: node.pid, seconds: 5, until: { ProcessProbe.state(node.pid) == .paused }) else {
            throw ChaosError("node \(id) (pid \(node.pid)) did not stop within 5 s of SIGSTOP")
        }
        log("SIGSTOP node \(id) (pid \(node.pid))")
    }

    /// SIGCONT of node `id`.
    public func resume(_ id: UInt64) throws(ChaosError) {
        let node = try state().node(id)
        guard ProcessProbe.state(of: node) == .paused else {
            throw ChaosError("node \(id) (pid \(node.pid)) is not paused (\(ProcessProbe.state(of: node).rawValue))")
        }
        Glibc.kill(node.pid, SIGCONT)
        guard ProcessProbe.wait(for: node.pid, seconds: 5, until: { ProcessProbe.state(node.pid) != .paused }) else {
            throw ChaosError("node \(id) (pid \(node.pid)) is still stopped 5 s after SIGCONT")
        }
        log("SIGCONT node \(id) (pid \(node.pid))")
    }

    /// Starts node `id` again with its recorded arguments (a running node is first stopped with
    /// SIGTERM, killed after 15 s), waits until it answers, and sets its recorded faults again.
    /// Returns the new pid.
    @discardableResult
    public func restart(_ id: UInt64) async throws -> Int32 {
        let node = try state().node(id)
        switch ProcessProbe.state(of: node) {
        case .exited: break
        case .paused, .running:
            Glibc.kill(node.pid, SIGCONT)
            Glibc.kill(node.pid, SIGTERM)
            if !ProcessProbe.wait(for: node.pid, seconds: 15, until: { ProcessProbe.state(node.pid) == .exited }) {
                Glibc.kill(node.pid, SIGKILL)
                _ = ProcessProbe.wait(for: node.pid, seconds: 10, until: { ProcessProbe.state(node.pid) == .exited })
            }
            log("stopped node \(id) (pid \(node.pid)) with SIGTERM")
        }
        guard !node.arguments.contains("--new-cluster") else { throw ChaosError("node \(id)'s recorded arguments found a cluster; refusing to run them again") }
        let pid = try ClusterStateFile.update(directory: directory) { s in
            let pid = try ProcessProbe.spawnDetached(executable: s.executable, arguments: node.arguments, log: node.log)
            if let i = s.nodes.firstIndex(where: { $0.id == id }) {
                s.nodes[i].pid = pid
                s.nodes[i].starts += 1
            }
            return pid
        }
        log("started node \(id) again (pid \(pid), output in \(node.log))")
        try await waitUntilAnswering(id, seconds: 60)
        let faults = try self.state().node(id).faults
        if !faults.isEmpty {
            try await applyFaults(id, faults)
            log("node \(id): faults set again after the restart: \(faults.summary)")
        }
        return pid
    }

    /// Waits until node `id` answers `/.banyan/health`.
    public func waitUntilAnswering(_ id: UInt64, seconds: Double) async throws {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if let r = try? await request(id, .GET, "/.banyan/health", timeout: 1), r.status == 200 { return }
            if ProcessProbe.state(of: try state().node(id)) == .exited {
                throw ChaosError("node \(id) exited while starting (see \(try state().node(id).log))")
            }
            try await Task.sleep(nanoseconds: 100_000_000)
        }
        throw ChaosError("node \(id) does not answer on its client port \(seconds) s after its start")
    }

    // MARK: - Network and disk faults (the fault switch)

    /// Sends `faults` to node `id`'s switch (replacing what is there). A node whose fsyncs are
    /// delayed answers late (its loop waits on the disk), so each try waits 10 s and tries go on
    /// for 30 s; a refusal (4xx) ends them at once.
    public func applyFaults(_ id: UInt64, _ faults: NodeFaults) async throws {
        let deadline = Date().addingTimeInterval(30)
        while true {
            do {
                let r = try await request(id, .POST, "/.banyan/faults", body: faults.json, timeout: 10)
                guard r.status == 200 else { throw ChaosError("node \(id) refused the faults: \(r.status) \(r.text)") }
                return
            } catch let refused as ChaosError {
                throw refused
            } catch {
                guard Date() < deadline else { throw ChaosError("node \(id) did not take the faults within 30 s: \(error)") }
                try await Task.sleep(nanoseconds: 200_000_000)
            }
        }
    }

    /// Records the faults wanted on each node, then sets them on every node that is running.
    /// Nodes that are paused or down keep them in the state file (a restart applies them). A
    /// partition is written on both sides, so it holds while either side has it.
    public func setFaults(_ change: (UInt64, inout NodeFaults) -> Void) async throws {
        let state = try ClusterStateFile.update(directory: directory) { s in
            for i in s.nodes.indices { change(s.nodes[i].id, &s.nodes[i].faults) }
            return s
        }
        var failures: [String] = []
        for node in state.nodes {
            guard ProcessProbe.state(of: node) == .running else {
                log("node \(node.id) is not running: its faults (\(node.faults.summary)) apply when it restarts")
                continue
            }
            do {
                try await applyFaults(node.id, node.faults)
            } catch {
                failures.append("node \(node.id): \(error)")
            }
        }
        if !failures.isEmpty { throw ChaosError(failures.joined(separator: "; ")) }
    }

    /// A partition: traffic between nodes of different groups is dropped (a node in no group
    /// is alone). Replaces any earlier partition; slowness stays.
    public func partition(_ groups: [[UInt64]]) async throws {
        let ids = try state().ids
        for id in groups.joined() where !ids.contains(id) { throw ChaosError("no node \(id) in this cluster (nodes: \(ids))") }
        guard Set(groups.joined()).count == groups.joined().count else { throw ChaosError("a node may be in one group only") }
        func group(of id: UInt64) -> Set<UInt64> { Set(groups.first { $0.contains(id) } ?? [id]) }
        try await setFaults { id, faults in faults.dropPeers = ids.filter { !group(of: id).contains($0) }.sorted() }
        log("partition " + Self.describe(groups, all: ids))
    }

    /// Cuts single links (`a-b`: traffic between a and b dropped, both ways); others stay.
    public func cut(_ links: [(UInt64, UInt64)]) async throws {
        let ids = try state().ids
        for (a, b) in links where !ids.contains(a) || !ids.contains(b) || a == b { throw ChaosError("bad link \(a)-\(b) (nodes: \(ids))") }
        try await setFaults { id, faults in
            var drops = Set(faults.dropPeers)
            for (a, b) in links {
                if id == a { drops.insert(b) }
                if id == b { drops.insert(a) }
            }
            faults.dropPeers = drops.sorted()
        }
        log("cut " + links.map { "\($0.0)-\($0.1)" }.joined(separator: ", "))
    }

    /// Heals every partition (slowness stays).
    public func heal() async throws {
        try await setFaults { _, faults in faults.dropPeers = [] }
        log("healed: no peer traffic is dropped")
    }

    /// Delays node `id`'s outbound peer messages and/or fsyncs by `milliseconds` (0 clears).
    public func slow(_ id: UInt64, milliseconds: Int, peer: Bool, disk: Bool) async throws {
        _ = try state().node(id)
        try await setFaults { node, faults in
            guard node == id else { return }
            if peer { faults.peerDelayMs = milliseconds }
            if disk { faults.diskDelayMs = milliseconds }
        }
        let what = [peer ? "peer messages" : nil, disk ? "fsyncs" : nil].compactMap { $0 }.joined(separator: " and ")
        log(milliseconds == 0 ? "node \(id): \(what) at full speed again" : "node \(id): \(what) delayed by \(milliseconds) ms")
    }

    /// Everything back to normal: paused nodes resumed, faults cleared on every node, nodes that
    /// are down started again. Returns what it did.
    public func healAll() async throws -> [String] {
        var done: [String] = []
        for node in try state().nodes where ProcessProbe.state(of: node) == .paused {
            try resume(node.id)
            done.append("resumed node \(node.id)")
        }
        let hadFaults = try state().nodes.contains { !$0.faults.isEmpty }
        try await setFaults { _, faults in faults = NodeFaults() }
        if hadFaults { done.append("cleared the faults") }
        for node in try state().nodes where ProcessProbe.state(of: node) == .exited {
            try await restart(node.id)
            done.append("restarted node \(node.id)")
        }
        return done
    }

    static func describe(_ groups: [[UInt64]], all: [UInt64]) -> String {
        let listed = Set(groups.joined())
        let alone = all.filter { !listed.contains($0) }.map { [$0] }
        return (groups + alone).map { $0.map(String.init).joined(separator: ",") }.joined(separator: " / ")
    }

    // MARK: - Parsing

    /// `1,2/3` → [[1, 2], [3]].
    public static func parseGroups(_ text: String) throws(ChaosError) -> [[UInt64]] {
        var groups: [[UInt64]] = []
        for part in text.split(separator: "/", omittingEmptySubsequences: false) {
            var group: [UInt64] = []
            for item in part.split(separator: ",") {
                guard let id = UInt64(item.trimmingCharacters(in: .whitespaces)), id != 0 else {
                    throw ChaosError("--groups must look like 1,2/3 (node ids, groups split by /), not '\(text)'")
                }
                group.append(id)
            }
            guard !group.isEmpty else { throw ChaosError("--groups must look like 1,2/3: '\(text)' has an empty group") }
            groups.append(group)
        }
        guard groups.count >= 2 else { throw ChaosError("--groups needs at least two groups split by /, e.g. 1,2/3") }
        return groups
    }

    /// `1-3` → (1, 3).
    public static func parseLink(_ text: String) throws(ChaosError) -> (UInt64, UInt64) {
        let parts = text.split(separator: "-")
        guard parts.count == 2, let a = UInt64(parts[0]), let b = UInt64(parts[1]), a != 0, b != 0, a != b else {
            throw ChaosError("--cut must look like 1-3 (two different node ids), not '\(text)'")
        }
        return (a, b)
    }
}
