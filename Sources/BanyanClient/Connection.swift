import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket

/// TLS for `https` databases: the certificates to trust (a PEM bundle, or the system's roots).
struct ClientTLS: Sendable {
    let context: NIOSSLContext

    init(trustedCAFile: String?) throws {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = .tlsv12
        if let trustedCAFile {
            do {
                configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(trustedCAFile))
            } catch {
                throw DatabaseError(code: "invalid_tls", message: "cannot read the trusted certificates in \(trustedCAFile): \(error)")
            }
        }
        do {
            context = try NIOSSLContext(configuration: configuration)
        } catch {
            throw DatabaseError(code: "invalid_tls", message: "cannot set up TLS: \(error)")
        }
    }

    /// The handler for a connection to `host`: the name is checked against the certificate
    /// (an IP address is checked through the chain only: TLS names servers by DNS names).
    func handler(host: String) throws -> NIOSSLClientHandler {
        let isAddress = host.contains(":") || host.split(separator: ".").allSatisfy { !$0.isEmpty && $0.allSatisfy(\.isNumber) }
        return try NIOSSLClientHandler(context: context, serverHostname: isAddress ? nil : host)
    }
}

/// One WebSocket connection to a node's `/.ws?v=5` (the driver's transport): opens with the
/// HTTP upgrade, hands each whole text message to `received`, and reports the end once.
final class WebSocketLink: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    private let received: @Sendable ([UInt8]) -> Void
    private let heard: @Sendable () -> Void
    private let ended: @Sendable () -> Void
    private var message: [UInt8] = []
    private var inText = false
    private var done = false
    /// The most bytes one WebSocket message may reach before the connection is closed.
    static let maxMessageBytes = 64 << 20

    init(received: @escaping @Sendable ([UInt8]) -> Void, heard: @escaping @Sendable () -> Void, ended: @escaping @Sendable () -> Void) {
        self.received = received
        self.heard = heard
        self.ended = ended
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        switch frame.opcode {
        case .text:
            message = Array(frame.unmaskedData.readableBytesView)
            inText = true
        case .continuation where inText:
            message += frame.unmaskedData.readableBytesView
        case .ping:
            let pong = WebSocketFrame(fin: true, opcode: .pong, data: frame.unmaskedData)
            context.writeAndFlush(wrapOutboundOut(pong), promise: nil)
            // The node is alive (its keep-alive): the client's silence timer starts again.
            heard()
            return
        case .pong:
            heard()
            return
        case .connectionClose:
            context.close(promise: nil)
            return
        default:
            return
        }
        if message.count > Self.maxMessageBytes {
            context.close(promise: nil)
            return
        }
        if frame.fin && inText {
            inText = false
            let whole = message
            message = []
            received(whole)
        } else if inText {
            // Part of a message still arriving: the node is alive.
            heard()
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        finish()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    func finish() {
        guard !done else { return }
        done = true
        ended()
    }

    /// Opens a connection; `socketOpened` (the TCP connection is up, the upgrade starts: the
    /// channel to close if the attempt is abandoned), `received`, `heard` (a frame that is not a
    /// whole message: a ping, part of a message) and `ended` run on the channel's event loop.
    static func open(
        host: String, port: Int, namespace: String, parameters: [(String, String)] = [], tls: ClientTLS?, group: any EventLoopGroup,
        socketOpened: @escaping @Sendable (any Channel) -> Void = { _ in },
        received: @escaping @Sendable ([UInt8]) -> Void,
        heard: @escaping @Sendable () -> Void = {},
        ended: @escaping @Sendable () -> Void
    ) -> EventLoopFuture<any Channel> {
        let link = WebSocketLink(received: received, heard: heard, ended: ended)
        var uri = "/.ws?v=5&ns=" + (namespace.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? namespace)
        for (name, value) in parameters { uri += "&\(name)=\(value.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? value)" }
        let upgraded = group.next().makePromise(of: Void.self)
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(.seconds(5))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                let request = UpgradeRequest(host: "\(host):\(port)", uri: uri, failed: upgraded)
                let upgrader = NIOWebSocketClientUpgrader(maxFrameSize: 1 << 24, automaticErrorHandling: true) { channel, _ in
                    channel.pipeline.addHandler(link).map { upgraded.succeed(()) }
                }
                let config: NIOHTTPClientUpgradeSendableConfiguration = (
                    upgraders: [upgrader], completionHandler: { context in context.pipeline.removeHandler(request, promise: nil) }
                )
                // The server's hello may come in the same read as the 101: forward those bytes to
                // the WebSocket decoder rather than drop them.
                if let tls {
                    do {
                        try channel.pipeline.syncOperations.addHandler(try tls.handler(host: host))
                    } catch {
                        return channel.eventLoop.makeFailedFuture(error)
                    }
                }
                return channel.pipeline.addHTTPClientHandlers(leftOverBytesStrategy: .forwardBytes, withClientUpgrade: config).flatMap {
                    channel.pipeline.addHandler(request)
                }
            }
        let connected = bootstrap.connect(host: host, port: port)
        // A connection that never opens (refused, timed out) must still settle the upgrade's
        // promise: NIO traps on a promise dropped unfulfilled in debug builds.
        connected.whenFailure { upgraded.fail($0) }
        return connected.flatMap { channel in
            socketOpened(channel)
            channel.closeFuture.whenComplete { _ in
                upgraded.fail(ChannelError.ioOnClosedChannel)
                link.finish()
            }
            return upgraded.futureResult.map { channel }
        }
    }
}

/// Sends the upgrade request when the connection opens; an answer other than the upgrade (a
/// 4xx, say) ends up here and closes the connection.
private final class UpgradeRequest: ChannelInboundHandler, RemovableChannelHandler, @unchecked Sendable {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundOut = HTTPClientRequestPart
    let host: String
    let uri: String
    let failed: EventLoopPromise<Void>

    init(host: String, uri: String, failed: EventLoopPromise<Void>) {
        self.host = host
        self.uri = uri
        self.failed = failed
    }

    func channelActive(context: ChannelHandlerContext) {
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: host)
        headers.add(name: "Content-Length", value: "0")
        context.write(wrapOutboundOut(.head(HTTPRequestHead(version: .http1_1, method: .GET, uri: uri, headers: headers))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head(let head) = unwrapInboundIn(data) {
            failed.fail(ConnectionRefused(status: Int(head.status.code)))
            context.close(promise: nil)
        }
    }
}

struct ConnectionRefused: Error, CustomStringConvertible {
    var status: Int
    var description: String { "the node refused the WebSocket upgrade (HTTP \(status))" }
}
