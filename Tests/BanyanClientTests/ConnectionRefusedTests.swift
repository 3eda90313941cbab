import BanyanClient
import Foundation
import Testing

/// A node that cannot be reached: the database keeps trying (with back-off) and reports
/// `.info/connected` false, and nothing traps. Before the fix, a refused connection dropped the
/// WebSocket upgrade's promise unfulfilled, which NIO traps on in debug builds (the whole test
/// process died as soon as a client retried a node that was down).
@Suite struct ConnectionRefusedTests {
    @Test("connections refused by a node that is down are retried without a trap")
    func refusedConnectionsAreRetried() async throws {
        let db = try Database(url: "http://127.0.0.1:1?ns=nobody")
        defer { db.shutdown() }
        let seen = DatabaseTests.Recorder()
        db.reference(withPath: ".info/connected").observe(.value) { s in seen.add("\(s.value as? Bool ?? true)") }
        #expect(await seen.wait { $0 == "false" })
        // Several attempts (the first retries come within a second or two).
        try await Task.sleep(nanoseconds: 2_500_000_000)
        #expect(!seen.all.contains("true"))
        #expect(db.pendingWriteCount == 0)
    }
}
