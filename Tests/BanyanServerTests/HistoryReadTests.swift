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
}
