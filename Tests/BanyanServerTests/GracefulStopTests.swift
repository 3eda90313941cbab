@testable import BanyanServer
import Foundation
import Logging
import Testing

/// `BanyanNode.stop(grace:)`, what `banyan serve` does on SIGTERM (docs/server.md, "Stopping"):
/// the client port stops accepting, and a request already being read is still answered.
@Suite struct GracefulStopTests {
    @Test("a stopping node refuses new connections at once, answers the request it was reading (closing its connection), then stops; nothing is left in flight")
    func requestsInFlightAreAnswered() async throws {
        let dir = try temporaryDirectory("graceful-stop")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let node = try BanyanNode.start(config: singleNodeConfig(dir), logger: Logger(label: "test"))
        var stopped = false
        defer { if !stopped { node.shutdown() } }
        let port = clientPort(node)
        #expect(await eventually({ ((try? httpExchange(port: port, "PUT", "/g.json", body: "0"))?.status ?? 0) == 200 }, seconds: 30))

        // A write whose body is half sent when the stop begins.
        let writer = try RequestDeadlineTests.Raw(port: port)
        writer.send("PUT /g.json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 7\r\n\r\n\"ab")
        #expect(await eventually({ node.requestsInFlight == 1 }, seconds: 10), "the request is in flight")
        let stopping = Task.detached { node.stop(grace: .seconds(20)) }
        // New clients are refused at once (they go to another node), while the write waits.
        #expect(await eventually({ (try? loopbackSocket(port: port, receiveTimeoutMicroseconds: 1000)).map { close($0) } == nil }, seconds: 10))
        writer.send("cde\"")
        let (answer, closed) = writer.receive(until: "", seconds: 15)
        #expect(answer.hasPrefix("HTTP/1.1 200") && answer.contains("Connection: close") && answer.hasSuffix("\"abcde\""), "\(answer)")
        #expect(closed)
        let cut = await stopping.value
        stopped = true
        #expect(cut == 0)
        #expect(node.requestsInFlight == 0)
    }
}
