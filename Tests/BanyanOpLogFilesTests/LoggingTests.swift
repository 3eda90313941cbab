import BanyanOpLog
import BanyanOpLogFiles
import Logging
import Synchronization
import Testing

/// Collects log records (tests only; never bootstraps the global logging system).
final class CapturedLogs: Sendable {
    let records = Mutex<[(Logger.Level, String, Logger.Metadata)]>([])

    var logger: Logger {
        Logger(label: "test") { _ in Handler(sink: self) }
    }

    struct Handler: LogHandler {
        let sink: CapturedLogs
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(level: Logger.Level, message: Logger.Message, metadata extra: Logger.Metadata?, source: String, file: String, function: String, line: UInt) {
            let merged = metadata.merging(extra ?? [:]) { $1 }
            sink.records.withLock { $0.append((level, message.description, merged)) }
        }
    }
}

@Suite struct LoggingTests {
    @Test("recovery logs a truncated torn tail with the file and offset, and refuses corruption with an error log")
    func tornTailIsLogged() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let log = try SegmentedLog(directory: "/data/log", fileSystem: fs)
        try log.append((1...3).map { LogRecord(index: $0, term: 1, kind: 0, payload: [1, 2, 3]) })
        try log.sync()
        let segment = "/data/log/" + LogFormat.segmentName(firstIndex: 1)
        let file = try fs.open(segment)
        try fs.append(file, [5, 0, 0])
        try fs.sync(file)
        let logs = CapturedLogs()
        let reopened = try SegmentedLog(directory: "/data/log", fileSystem: fs, logger: logs.logger)
        #expect(reopened.lastIndex == 3)
        let warnings = logs.records.withLock { $0.filter { $0.0 == .warning } }
        #expect(warnings.count == 1)
        #expect(warnings.first?.1.contains("torn tail") == true)
        #expect(warnings.first?.2["file"] == .string(segment))
        #expect(logs.records.withLock { $0.contains { $0.0 == .info && $0.1 == "log recovered" } })

        fs.corrupt(segment, at: 12)
        let errors = CapturedLogs()
        #expect(throws: OpLogError.self) { try SegmentedLog(directory: "/data/log", fileSystem: fs, logger: errors.logger) }
        #expect(errors.records.withLock { $0.contains { $0.0 == .error && ($0.2["offset"] == .string("8")) } })
    }
}
