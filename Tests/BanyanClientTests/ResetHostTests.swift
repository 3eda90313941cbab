@testable import BanyanClient
import Testing

/// How the SDK reads the host a reset (`r`) names (docs/swift-sdk.md).
@Suite struct ResetHostTests {
    @Test("a reset's host is read as host:port, [v6]:port or a bare host or IPv6 address (the node's port); anything else is ignored")
    func resetHostParsing() {
        #expect(Database.hostAndPort("10.0.0.9:9002", defaultPort: 9000)! == ("10.0.0.9", 9002))
        #expect(Database.hostAndPort("node2.example.com", defaultPort: 443)! == ("node2.example.com", 443))
        #expect(Database.hostAndPort("[::1]:9001", defaultPort: 9000)! == ("::1", 9001))
        #expect(Database.hostAndPort("[::1]", defaultPort: 9000)! == ("::1", 9000))
        #expect(Database.hostAndPort("::1", defaultPort: 9000)! == ("::1", 9000), "a bare IPv6 address")
        for bad in ["", ":9000", "host:0", "host:99999", "host:x", "[::1"] {
            #expect(Database.hostAndPort(bad, defaultPort: 9000) == nil, "\(bad)")
        }
    }
}
