import BanyanOpLog
import BanyanOpLogFiles
import Foundation
import Testing

/// The same log on real files in a temporary directory: durability calls reach the kernel, and a
/// torn tail left by a partial write is cut off on reopen.
@Suite struct PosixTests {
    @Test("append, sync, reopen, torn tail and truncation on real files")
    func realFiles() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("banyan-oplog-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        let fs = PosixFileSystem()
        try fs.makeDirectory(root)
        var options = SegmentedLog.Options()
        options.segmentBytes = 4096
        let records = (1...500).map { LogEntry(index: UInt64($0), term: 1, kind: 0, payload: Array(repeating: UInt8($0 % 251), count: 40)) }
        do {
            let log = try SegmentedLog(directory: root + "/log", fileSystem: fs, options: options)
            try log.append(records)
            #expect(try log.sync() == 500)
        }
        let names = try fs.list(root + "/log")
        #expect(names.count > 3)
        // Simulate a torn write: half a record at the end of the last segment.
        let last = root + "/log/" + (names.last ?? "")
        let handle = try fs.open(last)
        var partial: [UInt8] = []
        LogFormat.encode(LogEntry(index: 501, term: 1, kind: 0, payload: [1, 2, 3]), into: &partial)
        try fs.append(handle, Array(partial.prefix(10)))
        try fs.sync(handle)
        fs.close(handle)

        let reopened = try SegmentedLog(directory: root + "/log", fileSystem: fs, options: options)
        #expect(reopened.lastIndex == 500)
        #expect(reopened.recovery.truncatedTail?.droppedBytes == 10)
        #expect(try reopened.entries(from: 1, through: 500) == records)
        try reopened.truncate(after: 123)
        try reopened.append([LogEntry(index: 124, term: 2, kind: 0, payload: [9])])
        try reopened.sync()
        let again = try SegmentedLog(directory: root + "/log", fileSystem: fs, options: options)
        #expect(again.lastIndex == 124 && again.term(at: 124) == 2 && again.term(at: 123) == 1)

        let store = try HardStateStore(directory: root, fileSystem: fs)
        try store.save(HardState(term: 9, vote: 2, commit: 124))
        #expect(try HardStateStore(directory: root, fileSystem: fs).load() == HardState(term: 9, vote: 2, commit: 124))
    }
}
