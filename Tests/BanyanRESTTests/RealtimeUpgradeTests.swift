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

    @Test("the client id (bc, exactly-once writes): 16 hex digits, not all zero; anything else is 400 naming the parameter")
    func clientID() throws {
        #expect(try upgrade("/.ws?v=5&ns=a&bc=00000000000000ff").get().clientID == 0xff)
        #expect(try upgrade("/.ws?v=5&ns=a").get().clientID == nil)
        for bad in ["0000000000000000", "ff", "00000000000000ff0", "zzzzzzzzzzzzzzzz", "", "%00%00"] {
            guard case .failure(let e) = upgrade("/.ws?v=5&ns=a&bc=\(bad)") else {
                Issue.record("bc=\(bad) accepted")
                continue
            }
            #expect(e.status == 400 && e.message.contains("bc"), "bc=\(bad): \(e.message)")
        }
    }

    // MARK: - permessage-deflate (RFC 7692)

    func negotiated(_ values: String...) -> PerMessageDeflate? { PerMessageDeflate.negotiate(values) }

    @Test("permessage-deflate: an offer is accepted with both no-context-takeover parameters always in the answer; window bounds are kept")
    func deflateAccepted() throws {
        let plain = try #require(negotiated("permessage-deflate"))
        #expect(plain == PerMessageDeflate() && plain.compressionWindowBits == 15)
        #expect(plain.responseHeader == "permessage-deflate; server_no_context_takeover; client_no_context_takeover")
        // What browsers send: client_max_window_bits without a value (left out of the answer).
        let browser = try #require(negotiated("permessage-deflate; client_max_window_bits"))
        #expect(browser == PerMessageDeflate() && browser.responseHeader == plain.responseHeader)
        // Every parameter, in any case, spaces and quotes allowed.
        let full = try #require(
            negotiated(#"PerMessage-Deflate ; Server_No_Context_Takeover; client_no_context_takeover ; server_max_window_bits=10; client_max_window_bits="12""#))
        #expect(full == PerMessageDeflate(serverMaxWindowBits: 10, clientMaxWindowBits: 12) && full.compressionWindowBits == 10)
        #expect(
            full.responseHeader
                == "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10; client_max_window_bits=12")
        #expect(negotiated("permessage-deflate; server_max_window_bits=8")?.serverMaxWindowBits == 8)
        #expect(negotiated("permessage-deflate; client_max_window_bits=15")?.clientMaxWindowBits == 15)
    }

    @Test("permessage-deflate: malformed offers, unknown or duplicate parameters and bad values are declined, never an error")
    func deflateDeclined() {
        let declined = [
            "permessage-deflate; server_max_window_bits",  // needs a value
            "permessage-deflate; server_max_window_bits=7", "permessage-deflate; server_max_window_bits=16",
            "permessage-deflate; client_max_window_bits=08",  // no leading zeros
            "permessage-deflate; client_max_window_bits=x", "permessage-deflate; client_max_window_bits=",
            "permessage-deflate; server_no_context_takeover=1", "permessage-deflate; client_no_context_takeover=true",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",  // duplicate
            "permessage-deflate; client_max_window_bits; client_max_window_bits=10",  // duplicate, one with a value
            "permessage-deflate; mux", "permessage-deflate; x-webkit=1",  // unknown
            "permessage-deflate;", "permessage-deflate;; client_max_window_bits",  // empty parameter
            #"permessage-deflate; client_max_window_bits="1"0"#,  // a quote in the middle
            #"permessage-deflate; client_max_window_bits="10"#,  // unterminated quoted string
            "permessage-deflate; server max_window_bits=10",  // not a token
            "x-webkit-deflate-frame", "deflate-frame", "permessage-deflater", "",
        ]
        for value in declined { #expect(negotiated(value) == nil, "\(value)") }
        #expect(negotiated() == nil)
    }

    @Test("permessage-deflate: several offers (one header or several) are tried in order; the first acceptable one wins")
    func deflateSeveralOffers() throws {
        let first = try #require(negotiated("permessage-deflate; server_max_window_bits=10, permessage-deflate"))
        #expect(first.serverMaxWindowBits == 10)
        // A bad first offer is skipped; other extensions are ignored.
        let second = try #require(negotiated("x-webkit-deflate-frame, permessage-deflate; mux, , permessage-deflate; client_max_window_bits=9"))
        #expect(second == PerMessageDeflate(clientMaxWindowBits: 9))
        // A comma inside a quoted value does not split offers.
        #expect(negotiated(#"foo; bar="a, permessage-deflate", baz"#) == nil)
        #expect(negotiated(#"foo; bar="a,b", permessage-deflate"#) == PerMessageDeflate())
        // Several header lines count in order; an unreadable one (open quote) is skipped whole.
        #expect(negotiated(#"foo; bar="open, permessage-deflate"#, "permessage-deflate; server_max_window_bits=12")?.serverMaxWindowBits == 12)
        #expect(negotiated("foo", "permessage-deflate; server_max_window_bits=11", "permessage-deflate")?.serverMaxWindowBits == 11)
    }

    @Test("the upgrade carries the negotiation; a declined or absent offer leaves it nil and the upgrade still succeeds")
    func upgradeWithDeflate() throws {
        #expect(try upgrade("/.ws?v=5&ns=a").get().deflate == nil)
        let offered = try upgrade("/.ws?v=5&ns=a", Self.upgradeHeaders + [("sec-websocket-extensions", "permessage-deflate; client_max_window_bits")])
            .get()
        #expect(offered.deflate == PerMessageDeflate())
        let split = try upgrade(
            "/.ws?v=5&ns=a",
            Self.upgradeHeaders + [
                ("Sec-WebSocket-Extensions", "permessage-deflate; bogus"), ("Sec-WebSocket-Extensions", "permessage-deflate; server_max_window_bits=9"),
            ]
        ).get()
        #expect(split.deflate == PerMessageDeflate(serverMaxWindowBits: 9))
        let bad = try upgrade("/.ws?v=5&ns=a", Self.upgradeHeaders + [("Sec-WebSocket-Extensions", "permessage-deflate; server_max_window_bits=")]).get()
        #expect(bad.deflate == nil && bad.namespace == "a")
    }
}

/// `Route`: one decision per request, every target routed (docs/server.md, "Routes").
@Suite struct RouteTests {
    @Test("metrics, the realtime transports, every operator endpoint by method, bad ids and unknown endpoints, data")
    func routes() {
        let cases: [(String, String, Route)] = [
            ("GET", "/metrics", .metrics),
            ("POST", "/metrics", .data),
            ("GET", "/.ws?v=5&ns=a", .realtime),
            ("GET", "/.lp?start=t", .realtime),
            ("GET", "/.wsx", .data),
            ("GET", "/.banyan/status", .admin(.status)),
            ("GET", "/.banyan/health", .admin(.health)),
            ("GET", "/.banyan/ready?x=1", .admin(.ready)),
            ("POST", "/.banyan/status", .admin(.unknown)),
            ("POST", "/.banyan/members", .admin(.addMember)),
            ("POST", "/.banyan/members/4/promote", .admin(.promote(4))),
            ("DELETE", "/.banyan/members/4", .admin(.removeMember(4))),
            ("POST", "/.banyan/members/4", .admin(.unknown)),
            ("DELETE", "/.banyan/members/x", .admin(.badNodeID("x"))),
            ("POST", "/.banyan/members/4/demote", .admin(.unknown)),
            ("POST", "/.banyan/transfer?to=2", .admin(.transfer(to: 2))),
            ("POST", "/.banyan/transfer?from=1&to=3", .admin(.transfer(to: 3))),
            ("POST", "/.banyan/transfer", .admin(.transfer(to: nil))),
            ("POST", "/.banyan/transfer?to=two", .admin(.transfer(to: nil))),
            ("POST", "/.banyan/drain", .admin(.startDrain)),
            ("DELETE", "/.banyan/drain", .admin(.stopDrain)),
            ("GET", "/.banyan/drain", .admin(.drainState)),
            ("GET", "/.banyan/", .admin(.unknown)),
            ("GET", "/.banyan/status/extra", .admin(.unknown)),
            ("GET", "/users/ada.json", .data),
            ("PUT", "/.json?ns=a", .data),
            ("GET", "/.banyan", .data),
            ("GET", "/.settings/rules.json", .rules),
            ("PUT", "/.settings/rules?auth=x", .rules),
            ("GET", "/.settings/rules.jsonx", .data),
            ("POST", "/identitytoolkit.googleapis.com/v1/accounts:signUp?key=k", .accounts),
            ("POST", "/securetoken.googleapis.com/v1/token", .accounts),
            ("POST", "/oauth2.googleapis.com/token", .accounts),
            ("POST", "/oauth2.json", .data),
            ("GET", "/o", .data),
            ("POST", "/identitytoolkit.googleapis.com", .data),
            ("GET", "/metricsx", .data),
            ("GET", "/s.json", .data),
            ("GET", "/m", .data),
            ("GET", "/", .data),
            ("GET", "", .data),
            ("GET", "?x=/.ws", .data),
        ]
        for (method, uri, route) in cases {
            #expect(Route.of(method: method, uri: uri) == route, "\(method) \(uri)")
        }
    }
}
