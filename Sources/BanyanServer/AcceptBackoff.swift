import Glibc
import Logging
import Metrics
import NIOCore

/// The accept loop under file-descriptor or memory exhaustion (issue 18): NIO's
/// `AcceptBackoffHandler` stops accepting for a second after `EMFILE`, `ENFILE`, `ENOBUFS` or
/// `ENOMEM` instead of failing (or spinning on) the listening socket, and this handler, after it,
/// logs each such error once per back-off and counts it (`banyan_accept_errors_total`, by
/// listener). Installed on both listeners by `install(on:listener:logger:)`.
final class AcceptErrorReporter: ChannelInboundHandler, Sendable {
    typealias InboundIn = any Channel

    let listener: String
    let logger: Logger
    let errors: Counter

    init(listener: String, logger: Logger) {
        self.listener = listener
        self.logger = logger
        self.errors = Counter(label: "banyan_accept_errors_total", dimensions: [("listener", listener)])
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        errors.increment()
        logger.warning(
            "accepting connections failed; backing off before accepting again",
            metadata: ["listener": "\(listener)", "error": "\(error)"])
    }

    /// One second after running out of descriptors or memory; nothing for other accept errors (a
    /// client that gave up, `ECONNABORTED`, must not pause the listener).
    static func backoff(_ error: IOError) -> TimeAmount? {
        [EMFILE, ENFILE, ENOBUFS, ENOMEM].contains(error.errnoCode) ? .seconds(1) : nil
    }

    /// Adds the back-off and the reporter to a listening channel's pipeline.
    static func install(on channel: any Channel, listener: String, logger: Logger) -> EventLoopFuture<Void> {
        channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.addHandler(
                AcceptBackoffHandler(shouldForwardIOErrorCaught: true, backoffProvider: backoff), name: "AcceptBackoff")
            try channel.pipeline.syncOperations.addHandler(AcceptErrorReporter(listener: listener, logger: logger), name: "AcceptErrorReporter")
        }
    }
}
