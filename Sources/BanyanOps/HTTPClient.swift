public import NIOCore
public import NIOHTTP1
public import NIOPosix
public import NIOSSL

/// A response as the operator tools, the benchmark and the cluster tests see it.
public struct HTTPResult: Sendable {
    public var status: Int
    public var headers: [(String, String)]
    public var body: [UInt8]

    public init(status: Int, headers: [(String, String)], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    public var text: String { String(decoding: body, as: UTF8.self) }
    public func header(_ name: String) -> String? {
        headers.first { $0.0.lowercased() == name.lowercased() }?.1
    }
}

public struct HTTPClientError: Error, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// One keep-alive HTTP/1.1 connection that sends requests one at a time (a benchmark or test
/// client is one of these), in plain text or, given a client TLS context, over HTTPS. Not for
/// concurrent use: wait for each response before the next.
public final class HTTPConnection: @unchecked Sendable {
    public let host: String
    public let port: Int
    private let channel: any Channel
    private let handler: ResponseCollector

    private init(host: String, port: Int, channel: any Channel, handler: ResponseCollector) {
        self.host = host
        self.port = port
        self.channel = channel
        self.handler = handler
    }

    /// Connects to `host:port`; with `tls`, the connection speaks HTTPS and checks the server's
    /// certificate against the context's trust roots (and `serverHostname`, when given, for SNI
    /// and the name check; an address is checked through the certificate's IP names). A failed
    /// handshake fails the first request.
    public static func connect(
        host: String, port: Int, group: any EventLoopGroup, timeout: TimeAmount = .seconds(2), tls: NIOSSLContext? = nil, serverHostname: String? = nil
    ) async throws -> HTTPConnection {
        let collector = ResponseCollector()
        let channel = try await ClientBootstrap(group: group)
            .connectTimeout(timeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls { try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: tls, serverHostname: serverHostname)) }
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(collector)
                }
            }
            .connect(host: host, port: port).get()
        return HTTPConnection(host: host, port: port, channel: channel, handler: collector)
    }

    public var isOpen: Bool { channel.isActive }

    /// The certificate the server presented (nil: plain HTTP, or no handshake completed yet;
    /// after a request has been answered over HTTPS, the handshake is done).
    public func peerCertificate() async throws -> NIOSSLCertificate? {
        let channel = self.channel
        return try await channel.eventLoop.submit {
            try? channel.pipeline.syncOperations.handler(type: NIOSSLClientHandler.self).peerCertificate
        }.get()
    }

    /// Sends a request and waits for the whole response (at most `timeout`).
    public func send(
        _ method: HTTPMethod, _ uri: String, headers: [(String, String)] = [], body: [UInt8]? = nil, timeout: TimeAmount = .seconds(10)
    ) async throws -> HTTPResult {
        let promise = channel.eventLoop.makePromise(of: HTTPResult.self)
        let channel = self.channel
        let handler = self.handler
        channel.eventLoop.execute {
            guard channel.isActive else {
                promise.fail(HTTPClientError("connection to \(self.host):\(self.port) is closed"))
                return
            }
            handler.expect(promise)
            var h = HTTPHeaders(headers)
            h.replaceOrAdd(name: "Host", value: "\(self.host):\(self.port)")
            // Operator requests that change state must say they are JSON (no cross-site simple
            // requests; docs/security.md).
            if method == .POST, uri.hasPrefix("/.banyan/"), !h.contains(name: "Content-Type") { h.add(name: "Content-Type", value: "application/json") }
            h.replaceOrAdd(name: "Content-Length", value: String(body?.count ?? 0))
            let head = HTTPRequestHead(version: .http1_1, method: method, uri: uri, headers: h)
            channel.write(HTTPClientRequestPart.head(head), promise: nil)
            if let body, !body.isEmpty {
                var buffer = channel.allocator.buffer(capacity: body.count)
                buffer.writeBytes(body)
                channel.write(HTTPClientRequestPart.body(.byteBuffer(buffer)), promise: nil)
            }
            channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
            // The timer belongs to this request only: it is cancelled when the request ends, so
            // it can never fail a later request on the same connection.
            let timer = channel.eventLoop.scheduleTask(in: timeout) {
                if handler.fail(HTTPClientError("no response from \(self.host):\(self.port) within \(timeout)")) { channel.close(promise: nil) }
            }
            promise.futureResult.whenComplete { _ in timer.cancel() }
        }
        return try await promise.futureResult.get()
    }

    public func close() {
        channel.close(promise: nil)
    }
}

/// Collects one response at a time; confined to the channel's event loop.
final class ResponseCollector: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = HTTPClientResponsePart
    private var promise: EventLoopPromise<HTTPResult>?
    private var result = HTTPResult(status: 0, headers: [], body: [])

    func expect(_ p: EventLoopPromise<HTTPResult>) {
        promise = p
        result = HTTPResult(status: 0, headers: [], body: [])
    }

    /// Fails the waiting request; false when none was waiting.
    func fail(_ error: any Error) -> Bool {
        guard let p = promise else { return false }
        promise = nil
        p.fail(error)
        return true
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            result.status = Int(head.status.code)
            result.headers = head.headers.map { ($0.name, $0.value) }
        case .body(var buffer):
            result.body.append(contentsOf: buffer.readBytes(length: buffer.readableBytes) ?? [])
        case .end:
            let p = promise
            promise = nil
            p?.succeed(result)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        _ = fail(HTTPClientError("connection closed"))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        _ = fail(error)
        context.close(promise: nil)
    }
}
