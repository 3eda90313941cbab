import Foundation
import Logging
import NIOCore
import NIOPosix
import Testing

@testable import BanyanServer

/// `ReadyProbe`: a drain sends clients only to nodes that answer `/.banyan/ready` with 200.
@Suite struct ReadyProbeTests {
    @Test("a ready node is ready; a closed port and a listener that never answers are not")
    func probe() async throws {
        let dir = try temporaryDirectory("ready-probe")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var c = NodeConfig()
        c.dataDirectory = dir + "/data"
        c.clientAddress = HostPort(host: "127.0.0.1", port: 0)
        c.peerAddress = HostPort(host: "127.0.0.1", port: 0)
        let n = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { n.shutdown() }
        let port = try clientPort(n)
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        var ready = false
        for _ in 0..<100 where !ready {
            ready = try await ReadyProbe.probe(HostPort(host: "127.0.0.1", port: port), on: loop).get()
            if !ready { try await Task.sleep(nanoseconds: 50_000_000) }
        }
        #expect(ready)
        #expect(try await ReadyProbe.probe(HostPort(host: "127.0.0.1", port: 1), on: loop).get() == false)
        // A listener that accepts and never answers: not ready within the deadline.
        let silent = try await ServerBootstrap(group: loop).bind(host: "127.0.0.1", port: 0).get()
        defer { silent.close(promise: nil) }
        let silentPort = try #require(silent.localAddress?.port)
        #expect(try await ReadyProbe.probe(HostPort(host: "127.0.0.1", port: silentPort), on: loop, timeout: .milliseconds(300)).get() == false)
    }
}
