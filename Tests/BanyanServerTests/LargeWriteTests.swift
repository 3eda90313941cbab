import BanyanServer
import Foundation
import Logging
import Testing

/// Large writes through a running node: read ahead when written on the read-ahead threads,
/// admitted one at a time (docs/replica.md, "Large writes wait their turn"), and the metrics
/// that show the admission.
@Suite struct LargeWriteTests {
    @Test("large writes one after another apply and read back; the admission metrics are exported")
    func largeWrites() async throws {
        let dir = try temporaryDirectory("large-writes")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let node = try BanyanNode.start(config: singleNodeConfig(dir), logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        // About 2 MiB each: over the 1 MiB at which a write is large, and the 128 KiB from which
        // an entry is read ahead.
        for round in 0..<3 {
            let members = (0..<20_000).map { "\"k\(100_000 + $0)\":{\"v\":\($0 + round),\"s\":\"\(String(repeating: "x", count: 80))\"}" }
            let body = "{" + members.joined(separator: ",") + "}"
            #expect(body.utf8.count > 1 << 21)
            let put = try httpExchange(port: port, "PUT", "/big.json?print=silent", body: body)
            #expect(put.status == 204, "round \(round): \(put.status) \(put.body.prefix(200))")
            let read = try httpExchange(port: port, "GET", "/big/k119999/v.json")
            #expect(read.status == 200 && read.body == "\(19_999 + round)", "round \(round): \(read.body.prefix(200))")
        }
        let metrics = try httpExchange(port: port, "GET", "/metrics").body
        #expect(metrics.contains("banyan_raft_large_writes_held_total"))
        #expect(metrics.contains("banyan_raft_held_forward_bytes"))
    }
}
