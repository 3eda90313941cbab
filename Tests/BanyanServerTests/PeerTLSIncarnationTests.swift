import BanyanRaft
@testable import BanyanServer
import Foundation
import Logging
import NIOCore
import NIOPosix
import Synchronization
import Testing

/// The peer hello carries the sender's incarnation (since protocol version 2, R22): the accepting side
/// hands it to its hook before any message of the connection is delivered.
@Suite(.serialized) struct PeerTLSIncarnationTests {
    @Test("an accepted hello's incarnation reaches the receiver's hook before the connection's first message")
    func helloIncarnationReachesHook() async throws {
        #expect(PeerTransport.protocolVersion == 10)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let dir = try temporaryDirectory("ca-incarnation")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let events = Mutex<[String]>([])
        func make(_ id: UInt64, incarnation: UInt64) throws -> (PeerTransport, Int) {
            let files = try DevCertificates.ensureDevelopmentCertificates(directory: dir, nodeName: "node\(id)", hosts: ["localhost", "127.0.0.1"])
            let t = try PeerTransport(
                nodeID: id, clusterID: "test", advertised: HostPort(host: "127.0.0.1", port: 0), group: group,
                serverTLS: try PeerTLS.serverConfiguration(node: files.node, ca: files.ca),
                clientTLS: try PeerTLS.clientConfiguration(node: files.node, ca: files.ca), logger: Logger(label: "test"),
                incarnation: incarnation, peerIncarnation: { peer, inc in events.withLock { $0.append("incarnation \(peer) \(inc)") } }
            ) { peer, _, messages in events.withLock { $0.append("messages \(peer) \(messages.count)") } }
            let bound = try t.listen(on: HostPort(host: "127.0.0.1", port: 0))
            return (t, bound?.port ?? 0)
        }
        let (n1, port1) = try make(1, incarnation: 0x1111)
        let (n4, _) = try make(4, incarnation: 0xB0B)
        n4.updateAddresses([1: HostPort(host: "127.0.0.1", port: port1)])
        n4.send([Message(from: 4, to: 1, term: 3, body: .heartbeatResponse(readSeq: 1))])
        #expect(await eventually({ events.withLock { $0.count } >= 2 }, seconds: 5))
        #expect(events.withLock { $0 } == ["incarnation 4 \(0xB0B)", "messages 4 1"])
        n1.shutdown()
        n4.shutdown()
        try await group.shutdownGracefully()
    }
}
