import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// One HTTPS request to a node whose client-port certificate chains to a private CA
/// (`BANYAN_CA_FILE`, docs/operations.md "Operator commands over the network"). Foundation's
/// HTTPS on Linux trusts only the system's store and offers no per-request CA, so operator
/// commands go through NIO and NIOSSL when that variable is set. The answer's body is handed to
/// `sink` as it arrives (a backup is streamed to its file, never held whole).
enum TrustedCARequest {
    /// The CA file operator commands trust for `https://` endpoints, if set.
    static var caFile: String? {
        guard let path = ProcessInfo.processInfo.environment["BANYAN_CA_FILE"], !path.isEmpty else { return nil }
        return path
    }

    struct Answer {
        var status: Int
        var headers: [String: String]
    }

    /// Sends the request and waits for the whole answer (at most `timeout` without a byte
    /// arriving). Throws `CommandError` naming the endpoint on any failure.
    static func perform(
        _ url: URL, method: String, headers: [(String, String)], body: Data?, caFile: String, timeout: TimeAmount,
        sink: @escaping (_ status: Int, _ part: ByteBuffer) throws -> Void
    ) throws -> Answer {
        guard let host = url.host, !host.isEmpty else { throw CommandError("bad endpoint '\(url.absoluteString)'") }
        let port = url.port ?? 443
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = .tlsv12
        do {
            configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(caFile))
        } catch {
            throw CommandError("cannot read the CA certificates in BANYAN_CA_FILE (\(caFile)): \(error)")
        }
        let context: NIOSSLContext
        do {
            context = try NIOSSLContext(configuration: configuration)
        } catch {
            throw CommandError("cannot set up TLS with \(caFile): \(error)")
        }
        // An IP address is checked through the chain and the certificate's IP names; a DNS name
        // is also sent for SNI and checked against the certificate.
        let isAddress = host.contains(":") || host.split(separator: ".").allSatisfy { !$0.isEmpty && $0.allSatisfy(\.isNumber) }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        let loop = group.next()
        let done = loop.makePromise(of: Answer.self)
        let receiver = Receiver(done: done, sink: sink, idle: timeout)
        let channel: any Channel
        do {
            channel = try ClientBootstrap(group: group)
                .connectTimeout(.seconds(10))
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: isAddress ? nil : host))
                        try channel.pipeline.syncOperations.addHTTPClientHandlers()
                        try channel.pipeline.syncOperations.addHandler(receiver)
                    }
                }
                .connect(host: host, port: port).wait()
        } catch {
            throw CommandError("cannot reach \(url.scheme ?? "https")://\(host):\(port): \(error)")
        }
        defer { try? channel.close().wait() }
        var head = HTTPHeaders(headers)
        head.replaceOrAdd(name: "Host", value: url.port.map { "\(host):\($0)" } ?? host)
        head.replaceOrAdd(name: "Content-Length", value: String(body?.count ?? 0))
        head.replaceOrAdd(name: "Connection", value: "close")
        let path = url.path.isEmpty ? "/" : url.path
        let uri = url.query.map { "\(path)?\($0)" } ?? path
        channel.write(HTTPClientRequestPart.head(HTTPRequestHead(version: .http1_1, method: HTTPMethod(rawValue: method), uri: uri, headers: head)), promise: nil)
        if let body, !body.isEmpty {
            var buffer = channel.allocator.buffer(capacity: body.count)
            buffer.writeBytes(body)
            channel.write(HTTPClientRequestPart.body(.byteBuffer(buffer)), promise: nil)
        }
        channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        loop.execute { receiver.arm(on: loop) }
        do {
            return try done.futureResult.wait()
        } catch let e as CommandError {
            throw e
        } catch {
            throw CommandError("\(url.scheme ?? "https")://\(host):\(port): \(error)")
        }
    }

    /// Reads one response: its head, its body into the sink, its end; confined to the loop.
    private final class Receiver: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPClientResponsePart
        private let done: EventLoopPromise<Answer>
        private let sink: (Int, ByteBuffer) throws -> Void
        private let idle: TimeAmount
        private var answer = Answer(status: 0, headers: [:])
        private var finished = false
        private var timer: Scheduled<Void>?

        init(done: EventLoopPromise<Answer>, sink: @escaping (_ status: Int, _ part: ByteBuffer) throws -> Void, idle: TimeAmount) {
            self.done = done
            self.sink = sink
            self.idle = idle
        }

        /// (Re)starts the idle timer: no byte for `idle` fails the request.
        func arm(on loop: any EventLoop) {
            timer?.cancel()
            guard !finished else { return }
            timer = loop.scheduleTask(in: idle) { [self] in finish(.failure(CommandError("no answer within \(idle)"))) }
        }

        private func finish(_ result: Result<Answer, any Error>) {
            guard !finished else { return }
            finished = true
            timer?.cancel()
            done.completeWith(result)
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            arm(on: context.eventLoop)
            switch unwrapInboundIn(data) {
            case .head(let head):
                answer.status = Int(head.status.code)
                for (name, value) in head.headers { answer.headers[name.lowercased()] = value }
            case .body(let buffer):
                do {
                    try sink(answer.status, buffer)
                } catch {
                    finish(.failure(error))
                    context.close(promise: nil)
                }
            case .end:
                finish(.success(answer))
            }
        }

        func channelInactive(context: ChannelHandlerContext) {
            finish(.failure(CommandError("the connection closed before the answer ended")))
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            finish(.failure(error))
            context.close(promise: nil)
        }
    }
}
