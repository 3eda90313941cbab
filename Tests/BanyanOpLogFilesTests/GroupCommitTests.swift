import BanyanOpLog
import BanyanOpLogFiles
import Foundation
import Testing

@Suite struct GroupCommitTests {
    @Test("concurrent proposers get distinct consecutive durable indexes, in batches")
    func concurrent() async throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("banyan-gc-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        let fs = PosixFileSystem()
        try fs.makeDirectory(root)
        let group = GroupCommitLog(log: try SegmentedLog(directory: root + "/log", fileSystem: fs))
        let indexes = try await withThrowingTaskGroup(of: UInt64.self) { tasks in
            for i in 0..<400 {
                tasks.addTask { try await group.append(term: 1, kind: 0, payload: Array("p\(i)".utf8)) }
            }
            var all: [UInt64] = []
            for try await index in tasks { all.append(index) }
            return all
        }
        #expect(indexes.sorted() == Array(1...400))
        let stats = group.batches
        #expect(stats.records == 400)
        #expect(stats.batches < 400, "no batching happened")
        let reopened = try SegmentedLog(directory: root + "/log", fileSystem: PosixFileSystem())
        #expect(reopened.lastIndex == 400)
        let payloads = Set(try reopened.entries(from: 1, through: 400).map { String(decoding: $0.payload, as: UTF8.self) })
        #expect(payloads == Set((0..<400).map { "p\($0)" }))
    }

    @Test("a storage failure fails the batch and every later proposal")
    func failure() async throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        // Room for the segment header, one small record in its batch (26 + 64 bytes) and the empty
        // batch recording its sync (64), and for another small batch, not for a 125-byte record.
        fs.capacity = 260
        var plain = SegmentedLog.Options()
        plain.preallocationBytes = 0
        let group = GroupCommitLog(log: try SegmentedLog(directory: "/data/log", fileSystem: fs, options: plain))
        #expect(try await group.append(term: 1, kind: 0, payload: [1]) == 1)
        await #expect(throws: OpLogError.self) { try await group.append(term: 1, kind: 0, payload: [UInt8](repeating: 2, count: 100)) }
        // A small record would fit, but the log has stopped.
        do {
            _ = try await group.append(term: 1, kind: 0, payload: [3])
            Issue.record("accepted after a storage failure")
        } catch {
            #expect(error.code == .noSpace)
        }
    }
}

@Suite struct GroupCommitEdgeTests {
    @Test("an oversize proposal fails alone; a completion may submit again")
    func edges() async throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let group = GroupCommitLog(log: try SegmentedLog(directory: "/data/log", fileSystem: fs))
        await #expect(throws: OpLogError.self) {
            try await group.append(term: 1, kind: 0, payload: [UInt8](repeating: 0, count: LogFormat.maxRecordBytes))
        }
        #expect(try await group.append(term: 1, kind: 0, payload: [1]) == 1)
        let second: UInt64 = try await withCheckedThrowingContinuation { continuation in
            group.submit(term: 1, kind: 0, payload: [2]) { first in
                // Re-entrant submit from inside a completion.
                group.submit(term: 1, kind: 0, payload: [3]) { nested in
                    continuation.resume(with: nested.flatMap { n in first.map { _ in n } })
                }
            }
        }
        #expect(second == 3)
    }
}

@Suite struct SyncModeTests {
    @Test("syncEveryRecord makes each record durable inside append", arguments: [0, 64])
    func everyRecord(preallocate: Int) throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        var options = SegmentedLog.Options()
        options.syncEveryRecord = true
        options.segmentBytes = 120
        options.preallocationBytes = preallocate
        let log = try SegmentedLog(directory: "/data/log", fileSystem: fs, options: options)
        let before = fs.operations
        fs.crashAtOperation = before + 9
        try? log.append((1...10).map { LogRecord(index: $0, term: 1, kind: 0, payload: [UInt8($0)]) })
        let reported = log.durableIndex
        #expect(reported >= 1)
        fs.reboot()
        let reopened = try SegmentedLog(directory: "/data/log", fileSystem: fs, options: options)
        #expect(reopened.lastIndex >= reported)
    }
}
