import BanyanREST
import Testing

@Suite struct RealtimeUpgradeTests {
    static let upgradeHeaders = [
        ("Host", "db.example.com:9000"), ("Upgrade", "WebSocket"), ("Connection", "keep-alive, Upgrade"),
        ("Sec-WebSocket-Version", "13"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ]

    func upgrade(_ uri: String, _ headers: [(String, String)] = upgradeHeaders) -> Result<RealtimeUpgrade, RESTError> {
        Result { () throws(RESTError) in try RealtimeUpgrade.parse(head("GET", uri, headers), defaultNamespace: "default") }
    }

    @Test("the accept value is RFC 6455's; ns, then the Host's first label, then the default; ls is kept")
    func accepted() throws {
        #expect(RealtimeUpgrade.accept(forKey: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        let u = try upgrade("/.ws?v=5&ns=demo&ls=1-2-3&p=app").get()
        #expect(u.namespace == "demo" && u.lastSession == "1-2-3" && u.host == "db.example.com:9000")
        #expect(u.accept == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        #expect(try upgrade("/.ws?v=5").get().namespace == "db")
        var ipHost = Self.upgradeHeaders
        ipHost[0] = ("Host", "127.0.0.1:9000")
        #expect(try upgrade("/.ws?v=5&ls=", ipHost).get().namespace == "default")
        #expect(try upgrade("/.ws?v=5&ls=", ipHost).get().lastSession == nil)
        #expect(RealtimeUpgrade.isRealtimePath("/.ws?v=5") && RealtimeUpgrade.isRealtimePath("/.lp") && !RealtimeUpgrade.isRealtimePath("/.wsx"))
    }

    @Test("refusals: another version, long polling, no upgrade, a bad key, another method, a bad namespace")
    func refused() {
        func status(_ r: Result<RealtimeUpgrade, RESTError>) -> Int? {
            if case .failure(let e) = r { return e.status }
            return nil
        }
        #expect(status(upgrade("/.ws?v=4&ns=a")) == 400)
        #expect(status(upgrade("/.lp?v=5&ns=a")) == 404)
        #expect(status(upgrade("/.ws?v=5&ns=a", [("Host", "x")])) == 400)
        var badKey = Self.upgradeHeaders
        badKey[4] = ("Sec-WebSocket-Key", "short")
        #expect(status(upgrade("/.ws?v=5&ns=a", badKey)) == 400)
        var oldVersion = Self.upgradeHeaders
        oldVersion[3] = ("Sec-WebSocket-Version", "8")
        #expect(status(upgrade("/.ws?v=5&ns=a", oldVersion)) == 400)
        #expect(status(upgrade("/.ws?v=5&ns=a.b")) == 400)
        #expect(status(upgrade("/.ws?v=5&ns=%zz")) == 400)
        #expect(status(Result { () throws(RESTError) in try RealtimeUpgrade.parse(head("POST", "/.ws?v=5", Self.upgradeHeaders), defaultNamespace: "d") }) == 405)
    }
}
