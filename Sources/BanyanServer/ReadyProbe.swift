import NIOCore
import NIOPosix

/// Asks another node's client API whether it is ready (`GET /.banyan/ready` answers 200), with a
/// deadline: a drain sends clients only to nodes that would serve them (docs/realtime.md,
/// "Draining a node"). Reads at most the status line; any failure counts as not ready.
enum ReadyProbe {
    static func probe(_ target: HostPort, on loop: any EventLoop, timeout: TimeAmount = .seconds(1)) -> EventLoopFuture<Bool> {
        check(target, on: loop, timeout: timeout).map { $0 == nil }
    }

    /// Nil when ready; otherwise why not (the status line, or the connection's failure).
    static func check(_ target: HostPort, on loop: any EventLoop, timeout: TimeAmount = .seconds(1)) -> EventLoopFuture<String?> {
        let promise = loop.makePromise(of: String?.self)
        let deadline = loop.scheduleTask(in: timeout) { promise.succeed("no answer within \(timeout.nanoseconds / 1_000_000) ms") }
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
                case .failure(let error):
                    promise.succeed("cannot connect: \(error)")
                }
            }
        return promise.futureResult
    }

    /// Succeeds the promise with nil when the answer's status line says 200, else with the line
    /// (at most 64 bytes looked at).
    private final class StatusLineReader: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        private let promise: EventLoopPromise<String?>
        private var head: [UInt8] = []

        init(promise: EventLoopPromise<String?>) { self.promise = promise }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let buffer = unwrapInboundIn(data)
            head += buffer.readableBytesView.prefix(64 - head.count)
            if head.count >= 12 || head.contains(10) {
                let line = String(decoding: head, as: UTF8.self)
                let ok = line.hasPrefix("HTTP/1.1 200") || line.hasPrefix("HTTP/1.0 200")
                promise.succeed(ok ? nil : String(line.split(whereSeparator: \.isNewline).first ?? ""))
            }
        }

        func channelInactive(context: ChannelHandlerContext) {
            promise.succeed("closed before answering")
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            promise.succeed("\(error)")
            context.close(promise: nil)
        }
    }
}
