@testable import BanyanServer
import Foundation
import Glibc
import Logging
import NIOCore
import NIOPosix
import Synchronization
import Testing

/// Issue 18: anyone who reaches the peer port could open connections that never finish their
/// handshake. They are capped and timed out.
@Suite(.serialized) struct PeerHandshakeLimitTests {
    /// A plain TCP connection to `port` that sends nothing (no TLS: a handshake that never ends).
    static func connect(_ port: Int) -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var timeout = timeval(tv_sec: 15, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        return fd
    }

    /// Whether the server closed the connection (EOF) before the receive timeout.
    static func closedByServer(_ fd: Int32) -> Bool {
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, 0) == 0
    }

    @Test("connections past the cap of unauthenticated ones are closed at once; a silent one is closed after the handshake timeout")
    func capAndTimeout() throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let dir = try temporaryDirectory("ca-handshake")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let files = try DevCertificates.ensureDevelopmentCertificates(directory: dir, nodeName: "node1", hosts: ["localhost", "127.0.0.1"])
        let transport = try PeerTransport(
            nodeID: 1, clusterID: "test", advertised: HostPort(host: "127.0.0.1", port: 0), group: group,
            serverTLS: try PeerTLS.serverConfiguration(node: files.node, ca: files.ca),
            clientTLS: try PeerTLS.clientConfiguration(node: files.node, ca: files.ca), logger: Logger(label: "test"),
            maxUnauthenticated: 3, handshakeTimeout: .milliseconds(3_000)
        ) { _, _, _ in }
        let port = try #require(try transport.listen(on: HostPort(host: "127.0.0.1", port: 0))?.port)
        // (A synchronous test: the waits are measured here, not in a task a busy pool may delay.)
        let started = Date()
        let held = (0..<3).map { _ in Self.connect(port) }
        Thread.sleep(forTimeInterval: 0.2)
        // The fourth is over the cap: closed at once (well before the timeout).
        let extraAt = Date()
        let extra = Self.connect(port)
        #expect(Self.closedByServer(extra))
        // (The margins are wide: the whole suite runs in parallel on two cores.)
        #expect(Date().timeIntervalSince(extraAt) < 2.5, "the extra connection was not refused at once")
        // The three held ones hear nothing until the timeout closes them.
        for fd in held { #expect(Self.closedByServer(fd)) }
        let elapsed = Date().timeIntervalSince(started)
        #expect(elapsed >= 2.9 && elapsed < 20, "closed after \(elapsed) s")
        // Their slots are free again.
        Thread.sleep(forTimeInterval: 0.2)
        #expect(transport.unauthenticated.load(ordering: .relaxed) == 0)
        for fd in held + [extra] { close(fd) }
        transport.shutdown()
        try group.syncShutdownGracefully()
    }
}
