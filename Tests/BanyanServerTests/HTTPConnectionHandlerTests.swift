@testable import BanyanServer
import Foundation
import Logging
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

/// The connection handler driving `HTTPConnectionMachine` over an `EmbeddedChannel`: raw HTTP
/// bytes in, raw answers out, no socket. Only requests answered on the spot are used (an
/// embedded loop takes no work from the node's other threads).
@Suite struct HTTPConnectionHandlerTests {
    static let options = "OPTIONS /x.json HTTP/1.1\r\nHost: a\r\n\r\n"

    /// Runs `body` with the HTTP server of a node without a leader (it answers nothing
    /// asynchronously here), then stops the node.
    static func withServer(_ name: String, _ configure: (inout NodeConfig) -> Void = { _ in }, _ body: (HTTPServer) throws -> Void) throws {
        let dir = try temporaryDirectory(name)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var c = waitingNodeConfig(dir)
        configure(&c)
        let n = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { n.shutdown() }
        try body(n.http)
    }

    /// The server's pipeline for one connection, on an embedded channel, connected.
    static func connection(_ server: HTTPServer) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(
            ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .dropBytes)), name: HTTPConnectionHandler.decoderName)
        try channel.pipeline.syncOperations.addHandler(HTTPConnectionHandler(server: server), name: HTTPConnectionHandler.handlerName)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 9)).wait()
        return channel
    }

    /// Everything the handler wrote so far.
    static func written(_ channel: EmbeddedChannel) throws -> String {
        var text = ""
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { text += String(buffer: buffer) }
        return text
    }

    static func statuses(_ text: String) -> [String] {
        text.components(separatedBy: "HTTP/1.1 ").dropFirst().map { String($0.prefix(3)) }
    }

    @Test("pipelined requests in one read are answered in order; bad HTTP after them gets 400 and the close")
    func pipelinedThenBad() throws {
        try Self.withServer("embedded-pipe") { server in
            let channel = try Self.connection(server)
            try channel.writeInbound(ByteBuffer(string: String(repeating: Self.options, count: 3)))
            let text = try Self.written(channel)
            #expect(Self.statuses(text) == ["200", "200", "200"], "\(text)")
            #expect(channel.isActive)
            try channel.writeInbound(ByteBuffer(string: "HELLO THERE\r\n\r\n"))
            let bad = try Self.written(channel)
            #expect(bad.hasPrefix("HTTP/1.1 400 Bad Request\r\n") && bad.contains("Connection: close\r\n"), "\(bad)")
            #expect(!channel.isActive)
        }
    }

    @Test("while the client does not read, requests wait and reads are held; they are answered once it does; too far ahead closes")
    func unwritable() throws {
        try Self.withServer("embedded-unwritable") { server in
            let channel = try Self.connection(server)
            channel.isWritable = false
            channel.pipeline.fireChannelWritabilityChanged()
            try channel.writeInbound(ByteBuffer(string: String(repeating: Self.options, count: 3)))
            #expect(try Self.written(channel).isEmpty)
            channel.isWritable = true
            channel.pipeline.fireChannelWritabilityChanged()
            #expect(Self.statuses(try Self.written(channel)) == ["200", "200", "200"])

            // 2,100 requests (4,200 parts) while paused: past the hard cap of 4,096 parts.
            channel.isWritable = false
            channel.pipeline.fireChannelWritabilityChanged()
            try channel.writeInbound(ByteBuffer(string: String(repeating: Self.options, count: 2_100)))
            #expect(!channel.isActive, "a client 4,200 parts ahead is disconnected")
            #expect(try Self.written(channel).isEmpty)
        }
    }

    @Test("an upgrade answers 101 and nothing pipelined behind it is answered as HTTP")
    func upgradeWithPipelinedRequest() throws {
        try Self.withServer("embedded-upgrade") { server in
            let channel = try Self.connection(server)
            let upgrade =
                "GET /.ws?v=5&ns=demo HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
            try channel.writeInbound(ByteBuffer(string: upgrade + Self.options + Self.options))
            let text = try Self.written(channel)
            #expect(text.hasPrefix("HTTP/1.1 101 Switching Protocols\r\n"), "\(text.prefix(80))")
            #expect(!text.contains("HTTP/1.1 200"), "a request pipelined after the upgrade was answered: \(text)")
            #expect((try? channel.pipeline.syncOperations.handler(type: HTTPConnectionHandler.self)) == nil, "the HTTP handler is still there")
            _ = try? channel.finish()
        }
    }

    @Test("100-continue for a body that fits, 413 and the close for one that does not; a body never finished gets 408")
    func continueTooLargeAndDeadline() throws {
        try Self.withServer("embedded-continue", {
            $0.http.maxBodyBytes = 1_000
            $0.http.requestReadTimeoutSeconds = 1
        }) { server in
            let waiting = try Self.connection(server)
            try waiting.writeInbound(ByteBuffer(string: "PUT /x.json HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"))
            #expect(try Self.written(waiting) == "HTTP/1.1 100 Continue\r\n\r\n")
            try waiting.writeInbound(ByteBuffer(string: "1"))
            // The rest of the body never comes: 408 once the deadline passes, then the close.
            Thread.sleep(forTimeInterval: 1.1)
            waiting.embeddedEventLoop.advanceTime(by: .seconds(2))
            let late = try Self.written(waiting)
            #expect(late.hasPrefix("HTTP/1.1 408") && late.contains("Connection: close\r\n"), "\(late)")
            #expect(!waiting.isActive)

            let tooBig = try Self.connection(server)
            try tooBig.writeInbound(ByteBuffer(string: "PUT /x.json HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n" + Self.options))
            let refused = try Self.written(tooBig)
            #expect(refused.hasPrefix("HTTP/1.1 413 Payload Too Large\r\n") && Self.statuses(refused) == ["413"], "\(refused)")
            #expect(!tooBig.isActive)

            // An idle connection closes silently at the deadline.
            let idle = try Self.connection(server)
            Thread.sleep(forTimeInterval: 1.1)
            idle.embeddedEventLoop.advanceTime(by: .seconds(2))
            #expect(try Self.written(idle).isEmpty && !idle.isActive)
        }
    }
}
