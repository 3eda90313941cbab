@testable import BanyanServer
import Foundation
import Logging
import NIOCore
import Testing

/// Reads of the past, `GET /path.json?at=<index>` (docs/backup.md): answered from the node's
/// history bases and retained entries, exactly as the location was once that index applied;
/// refused outside the retained window, for non-administrators, and with other methods.
@Suite struct HistoryReadTests {
    @Test("at=<index> shows each write's value at its index across several snapshots; older indexes and non-administrators are refused")
    func readsOfThePast() async throws {
        let dir = try temporaryDirectory("history")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var c = singleNodeConfig(dir)
        c.raft.snapshotEntries = 8  // several snapshots, so the bases move
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        let ready = await eventually({ ((try? httpExchange(port: port, "PUT", "/v.json?auth=owner", body: "0"))?.status ?? 0) == 200 }, seconds: 30)
        #expect(ready)
        // The index each write applied at: the applied index right after its answer (one writer,
        // and nothing else writes /v).
        var indexOf: [Int: UInt64] = [:]
        for k in 1...40 {
            #expect(try httpExchange(port: port, "PUT", "/v.json?auth=owner", body: "\(k)").status == 200)
            indexOf[k] = try node.runtime.status().wait().appliedIndex
        }
        var answered = 0
        var refused = 0
        for k in 1...40 {
            guard let index = indexOf[k] else { continue }
            let r = try httpExchange(port: port, "GET", "/v.json?auth=owner&at=\(index)")
            if r.status == 200 {
                #expect(r.body == "\(k)", "at=\(index) (write \(k)) read \(r.body)")
                answered += 1
            } else {
                #expect(r.status == 400 && r.body.contains("older than this node's retained history"), "\(r.status) \(r.body)")
                // Refusals come only for the oldest writes: never after an answered one.
                #expect(answered == 0, "write \(k) refused after newer ones were answered")
                refused += 1
            }
        }
        // With a snapshot every 8 entries the window holds at least the last 8 writes, and not
        // the first ones.
        #expect(answered >= 8 && refused >= 1, "answered \(answered), refused \(refused)")
        let last = try #require(indexOf[40])
        #expect(try httpExchange(port: port, "GET", "/v.json?auth=owner&at=\(last + 1000)").status == 400)
        #expect(try httpExchange(port: port, "GET", "/v.json?at=\(last)&auth=someone").status == 401)
        #expect(try httpExchange(port: port, "PUT", "/v.json?auth=owner&at=\(last)", body: "1").status == 400)
        #expect(try httpExchange(port: port, "GET", "/v.json?auth=owner&at=zero").status == 400)
    }

    @Test("after a restart from a snapshot, a log read below the log answers 410 (it once trapped on an empty retention buffer)")
    func logReadAfterRestart() async throws {
        let dir = try temporaryDirectory("history-restart")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var c = singleNodeConfig(dir)
        c.raft.snapshotEntries = 8
        var node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        var port = clientPort(node)
        let ready = await eventually({ ((try? httpExchange(port: port, "PUT", "/v.json?auth=owner", body: "0"))?.status ?? 0) == 200 }, seconds: 30)
        #expect(ready)
        for k in 1...30 { #expect(try httpExchange(port: port, "PUT", "/v.json?auth=owner", body: "\(k)").status == 200) }
        let snapshotted = await eventually({ ((try? node.runtime.status().wait().snapshotIndex) ?? 0) > 8 }, seconds: 30)
        #expect(snapshotted)
        node.shutdown()
        c.clientAddress = HostPort(host: "127.0.0.1", port: 0)
        node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { node.shutdown() }
        port = clientPort(node)
        let back = await eventually({ (try? httpExchange(port: port, "GET", "/v.json?auth=owner"))?.body == "30" }, seconds: 30)
        #expect(back)
        let r = try httpExchange(port: port, "GET", "/.banyan/log?from=1&auth=owner")
        #expect(r.status == 410 && r.body.contains("first_index"), "\(r.status) \(r.body)")
        // The node is still there.
        #expect(try httpExchange(port: port, "GET", "/v.json?auth=owner").status == 200)
    }

    @Test("history.bases and history.retained_bytes bound what a node keeps: with one base only the newest snapshot on answers, with none only the present; without retention the log's start is history's")
    func retentionIsConfigurable() async throws {
        #expect(try NodeConfig.parse(yaml: "history:\n  bases: 1\n  retained_bytes: 0\n").history == {
            var h = NodeConfig.HistorySettings()
            h.bases = 1
            h.retainedBytes = 0
            return h
        }())
        #expect(NodeConfig().history.bases == 2 && NodeConfig().history.retainedBytes == 64 << 20, "the defaults stay")
        #expect(throws: ConfigError.self) { try NodeConfig.parse(yaml: "history:\n  bases: 3\n") }
        #expect(throws: ConfigError.self) { try NodeConfig.parse(yaml: "history:\n  retained_bytes: -1\n") }
        #expect(throws: ConfigError.self) { try NodeConfig.parse(yaml: "history:\n  window: 5\n") }

        /// A node with snapshots every 8 entries after 30 writes: (status, its client port).
        func node(bases: Int, retainedBytes: Int, _ name: String) async throws -> (BanyanNode, Int, String) {
            let dir = try temporaryDirectory("history-\(name)")
            var c = singleNodeConfig(dir)
            c.raft.snapshotEntries = 8
            c.history.bases = bases
            c.history.retainedBytes = retainedBytes
            let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
            let port = clientPort(node)
            let ready = await eventually({ ((try? httpExchange(port: port, "PUT", "/v.json?auth=owner", body: "0"))?.status ?? 0) == 200 }, seconds: 30)
            #expect(ready)
            for k in 1...30 { #expect(try httpExchange(port: port, "PUT", "/v.json?auth=owner", body: "\(k)").status == 200) }
            #expect(await eventually({ ((try? node.runtime.status().wait().snapshotIndex) ?? 0) > 16 }, seconds: 30))
            // Settled, and the present past the last snapshot (so that it is history there).
            try await Task.sleep(nanoseconds: 500_000_000)
            if let s = try? node.runtime.status().wait(), s.appliedIndex == s.snapshotIndex {
                #expect(try httpExchange(port: port, "PUT", "/v.json?auth=owner", body: "31").status == 200)
            }
            return (node, port, dir)
        }

        let (two, twoPort, twoDir) = try await node(bases: 2, retainedBytes: 64 << 20, "two")
        let (one, onePort, oneDir) = try await node(bases: 1, retainedBytes: 64 << 20, "one")
        let (none, nonePort, noneDir) = try await node(bases: 0, retainedBytes: 0, "none")
        defer {
            for (n, d) in [(two, twoDir), (one, oneDir), (none, noneDir)] {
                n.shutdown()
                try? FileManager.default.removeItem(atPath: d)
            }
        }
        for (n, port, bases) in [(two, twoPort, 2), (one, onePort, 1), (none, nonePort, 0)] {
            let status = try n.runtime.status().wait()
            let snapshot = status.snapshotIndex
            let applied = status.appliedIndex
            let atSnapshot = try httpExchange(port: port, "GET", "/v.json?auth=owner&at=\(snapshot)").status
            let beforeSnapshot = try httpExchange(port: port, "GET", "/v.json?auth=owner&at=\(snapshot - 1)").status
            #expect(try httpExchange(port: port, "GET", "/v.json?auth=owner&at=\(applied)").status == 200, "bases \(bases): the present")
            switch bases {
            case 2: #expect(atSnapshot == 200 && beforeSnapshot == 200, "bases 2: back to the older base")
            case 1: #expect(atSnapshot == 200 && beforeSnapshot == 400, "bases 1: from the newest snapshot only")
            default: #expect(atSnapshot == 400 && beforeSnapshot == 400, "bases 0: nothing but the present")
            }
        }
        // Retention off: an archiver below the log's start gets 410 at once.
        let kept = try httpExchange(port: twoPort, "GET", "/.banyan/log?from=2&auth=owner")
        #expect(kept.status == 200, "\(kept.status) \(kept.body)")
        let dropped = try httpExchange(port: nonePort, "GET", "/.banyan/log?from=2&auth=owner")
        #expect(dropped.status == 410 && dropped.body.contains("first_index"), "\(dropped.status) \(dropped.body)")
    }
}
