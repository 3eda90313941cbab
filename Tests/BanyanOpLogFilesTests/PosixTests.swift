import BanyanOpLog
import BanyanOpLogFiles
import Foundation
import Testing

/// The same log on real files in a temporary directory: durability calls reach the kernel, and a
/// torn tail left by a partial write is cut off on reopen.
@Suite struct PosixTests {
    @Test("append, sync, reopen, torn tail and truncation on real files; a log written with plain appends reopens with preallocation")
    func realFiles() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("banyan-oplog-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        let fs = PosixFileSystem()
        try fs.makeDirectory(root)
        var plain = SegmentedLog.Options()
        plain.segmentBytes = 4096
        plain.preallocationBytes = 0
        let records = (1...500).map { LogRecord(index: UInt64($0), term: 1, kind: 0, payload: Array(repeating: UInt8($0 % 251), count: 40)) }
        do {
            let log = try SegmentedLog(directory: root + "/log", fileSystem: fs, options: plain)
            try log.append(records)
            #expect(try log.sync() == 500)
        }
        let names = try fs.list(root + "/log")
        #expect(names.count > 3)
        // Simulate a torn write: half a record at the end of the last segment.
        let last = root + "/log/" + (names.last ?? "")
        let handle = try fs.open(last)
        var partial: [UInt8] = []
        LogFormat.encode(LogRecord(index: 501, term: 1, kind: 0, payload: [1, 2, 3]), into: &partial)
        try fs.append(handle, Array(partial.prefix(10)))
        try fs.sync(handle)
        fs.close(handle)

        var preallocated = plain
        preallocated.preallocationBytes = 8192
        let reopened = try SegmentedLog(directory: root + "/log", fileSystem: fs, options: preallocated)
        #expect(reopened.lastIndex == 500)
        #expect(reopened.recovery.truncatedTail?.droppedBytes == 10)
        // The cut bytes were moved aside first, next to the segment, and are no segment.
        let saved = try #require(reopened.recovery.savedCutBytes)
        #expect(saved.hasPrefix(last + ".cut-"))
        #expect(try fs.readAll(saved) == Array(partial.prefix(10)))
        #expect(try reopened.entries(from: 1, through: 500) == records)
        try reopened.truncate(after: 123)
        try reopened.append([LogRecord(index: 124, term: 2, kind: 0, payload: [9])] + (125...400).map { records[Int($0) - 1] })
        try reopened.sync()
        // The active segment is zeros after its records, up to a whole preallocation step; the
        // ones before it were cut to their records when the next began.
        let segments = try fs.list(root + "/log").filter { LogFormat.firstIndex(ofSegment: $0) != nil }
        #expect(try fs.fileSize(root + "/log/" + (segments.last ?? "")) % 8192 == 0)
        for name in segments.dropLast() {
            let bytes = try fs.readAll(root + "/log/" + name)
            #expect(SegmentScan.scan(bytes, expectedFirstIndex: LogFormat.firstIndex(ofSegment: name), isLast: false).outcome == .clean, "\(name)")
        }
        let again = try SegmentedLog(directory: root + "/log", fileSystem: fs, options: preallocated)
        #expect(again.lastIndex == 400 && again.term(at: 124) == 2 && again.term(at: 123) == 1)
        #expect(again.recovery.truncatedTail == nil)
        #expect(try again.entries(from: 125, through: 400) == Array(records[124..<400]))
        // And back to plain appends: they go after the records, not after the zeros.
        try again.append([LogRecord(index: 401, term: 2, kind: 0, payload: [7])])
        try again.sync()
        let third = try SegmentedLog(directory: root + "/log", fileSystem: fs, options: plain)
        #expect(third.lastIndex == 401 && third.term(at: 401) == 2)

        let store = try HardStateStore(directory: root, fileSystem: fs)
        try store.save(HardStateRecord(term: 9, vote: 2, commit: 124, mayVote: false))
        #expect(try HardStateStore(directory: root, fileSystem: fs).load() == HardStateRecord(term: 9, vote: 2, commit: 124, mayVote: false))
    }
}
