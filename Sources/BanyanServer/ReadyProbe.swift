import NIOCore
import NIOPosix

/// Asks another node's client API whether it is ready (`GET /.banyan/ready` answers 200), with a
/// deadline: a drain sends clients only to nodes that would serve them (docs/realtime.md,
/// "Draining a node"). Reads at most the status line; any failure counts as not ready.
enum ReadyProbe {
    static func probe(_ target: HostPort, on loop: any EventLoop, timeout: TimeAmount = .seconds(1)) -> EventLoopFuture<Bool> {
        let promise = loop.makePromise(of: Bool.self)
        let deadline = loop.scheduleTask(in: timeout) { promise.succeed(false) }
        promise.futureResult.whenComplete { _ in deadline.cancel() }
        ClientBootstrap(group: loop)
            .connectTimeout(timeout)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(StatusLineReader(promise: promise)) }
            }
            .connect(host: target.host, port: target.port)
            .whenComplete { result in
                switch result {
                case .success(let channel):
                    var request = channel.allocator.buffer(capacity: 96)
                    request.writeString("GET /.banyan/ready HTTP/1.1\r\nHost: \(target.host)\r\nConnection: close\r\n\r\n")
                    channel.writeAndFlush(request, promise: nil)
                    promise.futureResult.whenComplete { _ in channel.close(promise: nil) }
                case .failure:
                    promise.succeed(false)
                }
            }
        return promise.futureResult
    }

    /// Succeeds the promise with whether the answer's status line says 200 (at most 64 bytes
    /// looked at).
    private final class StatusLineReader: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        private let promise: EventLoopPromise<Bool>
        private var head: [UInt8] = []

        init(promise: EventLoopPromise<Bool>) { self.promise = promise }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let buffer = unwrapInboundIn(data)
            head += buffer.readableBytesView.prefix(64 - head.count)
            if head.count >= 12 || head.contains(10) {
                let line = String(decoding: head, as: UTF8.self)
                promise.succeed(line.hasPrefix("HTTP/1.1 200") || line.hasPrefix("HTTP/1.0 200"))
            }
        }

        func channelInactive(context: ChannelHandlerContext) {
            promise.succeed(false)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            promise.succeed(false)
            context.close(promise: nil)
        }
    }
}
