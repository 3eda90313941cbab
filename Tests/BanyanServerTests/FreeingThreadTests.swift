import Foundation
import Testing

@testable import BanyanServer

/// `BulkWorkers.free`: memory handed over with the caller's last reference is freed on the
/// freeing thread, never on the caller's (docs/replica.md, "Freeing replaced subtrees").
@Suite struct FreeingThreadTests {
    static func thread() -> String { "\(pthread_self())" }

    final class Tracked: @unchecked Sendable {
        let record: (String) -> Void
        init(record: @escaping (String) -> Void) { self.record = record }
        deinit { record(FreeingThreadTests.thread()) }
    }

    final class Log: @unchecked Sendable {
        let lock = NSLock()
        var threads: [String] = []
        func add(_ t: String) { lock.withLock { threads.append(t) } }
        var all: [String] { lock.withLock { threads } }
    }

    /// Hands 20 arrays of 3 tracked values over, synchronously; returns this thread's id.
    static func handOver(_ log: Log) -> String {
        for _ in 0..<20 {
            let values = (0..<3).map { _ in Tracked(record: { log.add($0) }) }
            BulkWorkers.free(consume values)
        }
        return thread()
    }

    @Test("values handed to free are dropped on another thread, each once")
    func freedElsewhere() async throws {
        let log = Log()
        let caller = Self.handOver(log)
        for _ in 0..<200 where log.all.count < 60 { try await Task.sleep(nanoseconds: 10_000_000) }
        #expect(log.all.count == 60)
        #expect(!log.all.contains(caller), "freed on the caller's thread: \(log.all.prefix(3))")
        #expect(Set(log.all).count == 1, "one freeing thread: \(Set(log.all))")
    }
}
