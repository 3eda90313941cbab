@testable import BanyanServer
import Foundation
import Logging
import Testing

/// `BanyanNode.stop(grace:)`, what `banyan serve` does on SIGTERM (docs/server.md, "Stopping"):
/// the client port stops accepting, and a request already being read is still answered.
@Suite struct GracefulStopTests {
    /// Written by the stopping thread before it signals, read after the wait.
    final class Outcome: @unchecked Sendable { var cut: Int? }

    /// Polls `condition` every 20 ms on this thread, then once more at the end.
    static func waitUntil(seconds: Double, _ condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if condition() { return true }
            usleep(20_000)
        }
        return condition()
    }

    // Synchronous on purpose, the stop on a thread of its own: in the full suite the simulator's
    // tests hold the concurrency pool for minutes, and an async test resumed after the node's read
    // deadline had dropped the half-sent request (failed once in CI). The read timeout is long
    // for the same reason.
    @Test("a stopping node refuses new connections at once, answers the request it was reading (closing its connection), then stops; nothing is left in flight")
    func requestsInFlightAreAnswered() throws {
        let dir = try temporaryDirectory("graceful-stop")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var config = singleNodeConfig(dir)
        config.http.requestReadTimeoutSeconds = 600
        let node = try BanyanNode.start(config: config, logger: Logger(label: "test"))
        let outcome = Outcome()
        let done = DispatchSemaphore(value: 0)
        var stopping = false
        defer { if !stopping { node.shutdown() } }
        let port = clientPort(node)
        #expect(Self.waitUntil(seconds: 60) { ((try? httpExchange(port: port, "PUT", "/g.json", body: "0"))?.status ?? 0) == 200 })

        // A write whose body is half sent when the stop begins.
        let writer = try RequestDeadlineTests.Raw(port: port)
        writer.send("PUT /g.json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 7\r\n\r\n\"ab")
        #expect(Self.waitUntil(seconds: 30) { node.requestsInFlight == 1 }, "the request is in flight")
        stopping = true
        Thread.detachNewThread {
            outcome.cut = node.stop(grace: .seconds(20))
            done.signal()
        }
        // New clients are refused at once (they go to another node), while the write waits.
        #expect(Self.waitUntil(seconds: 30) { (try? loopbackSocket(port: port, receiveTimeoutMicroseconds: 1000)).map { close($0) } == nil })
        writer.send("cde\"")
        let (answer, closed) = writer.receive(until: "", seconds: 15)
        #expect(answer.hasPrefix("HTTP/1.1 200") && answer.contains("Connection: close") && answer.hasSuffix("\"abcde\""), "\(answer)")
        #expect(closed)
        #expect(done.wait(timeout: .now() + 60) == .success, "the stop ended")
        #expect(outcome.cut == 0)
        #expect(node.requestsInFlight == 0)
    }
}
