@testable import BanyanServer
import Glibc
import Logging
import NIOCore
import NIOEmbedded
import Testing

/// Issue 18: the accept loop backs off on EMFILE instead of failing.
@Suite struct AcceptBackoffTests {
    /// Counts the reads that reach the head of the pipeline (a listening socket accepts on read).
    final class ReadCounter: ChannelOutboundHandler, @unchecked Sendable {
        typealias OutboundIn = Never
        var reads = 0
        func read(context: ChannelHandlerContext) {
            reads += 1
            context.read()
        }
    }

    @Test("after EMFILE the listener stops accepting for a second, logs and counts the error, then accepts again")
    func backsOff() throws {
        let channel = EmbeddedChannel()
        let counter = ReadCounter()
        try channel.pipeline.syncOperations.addHandler(counter)
        try AcceptErrorReporter.install(on: channel, listener: "test", logger: Logger(label: "test")).wait()
        channel.read()
        #expect(counter.reads == 1)
        channel.pipeline.fireErrorCaught(IOError(errnoCode: EMFILE, reason: "accept"))
        channel.read()
        #expect(counter.reads == 1, "accepting went on right after EMFILE")
        // The back-off's deadline is on the real clock.
        channel.embeddedEventLoop.advanceTime(to: .now() + .milliseconds(1_100))
        #expect(counter.reads == 2, "accepting did not resume after the back-off")
        // Other errors do not stop the listener.
        channel.pipeline.fireErrorCaught(IOError(errnoCode: ECONNABORTED, reason: "accept"))
        channel.read()
        #expect(counter.reads == 3)
        _ = try? channel.finish()
    }
}
