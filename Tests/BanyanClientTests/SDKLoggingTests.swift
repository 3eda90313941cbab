@testable import BanyanClient
import Testing

/// `Database.sdkVersion()` and `Database.setLoggingEnabled(_:)` (docs/client-guide.md).
@Suite struct SDKLoggingTests {
    @Test("sdkVersion names a version of three numbers")
    func version() {
        let parts = Database.sdkVersion().split(separator: ".")
        #expect(parts.count == 3 && parts.allSatisfy { Int($0) != nil }, "\(Database.sdkVersion())")
    }

    @Test("setLoggingEnabled switches the debug lines on and off; a message sent is logged cut to 256 bytes, an auth request without its token")
    func logging() {
        Database.setLoggingEnabled(true)
        #expect(DatabaseLog.enabled.withLock { $0 })
        Database.setLoggingEnabled(false)
        #expect(!DatabaseLog.enabled.withLock { $0 })
        // Debug lines go out at `debug` under any handler (swift-log's default starts at `info`).
        #expect(DatabaseLog.debugLevelName == "debug")
        let put = Array(#"{"t":"d","d":{"r":3,"a":"p","b":{"p":"/a","d":1}}}"#.utf8)
        #expect(DatabaseLog.line(sent: put) == "sent " + String(decoding: put, as: UTF8.self))
        let token = String(repeating: "T", count: 500)
        let auth = Array(#"{"t":"d","d":{"r":1,"a":"auth","b":{"cred":"\#(token)"}}}"#.utf8)
        let line = DatabaseLog.line(sent: auth)
        #expect(!line.contains("TTTT") && line.contains("auth request"), "\(line)")
        let long = Array(#"{"t":"d","d":{"r":4,"a":"p","b":{"p":"/a","d":"\#(String(repeating: "x", count: 1_000))"}}}"#.utf8)
        let cut = DatabaseLog.line(sent: long)
        #expect(cut.hasSuffix("(\(long.count) bytes)") && cut.utf8.count < 320, "\(cut)")
    }
}
