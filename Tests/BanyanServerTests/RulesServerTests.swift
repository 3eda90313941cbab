import BanyanRules
@testable import BanyanServer
import Foundation
import Logging
import Synchronization
import Testing

/// Security rules through a running node (docs/rules.md, "Enforcement"): set with
/// `PUT /.settings/rules.json`, in force for REST reads and writes, kept across a restart.
@Suite(.serialized) struct RulesServerTests {
    /// An emulator-style unsigned token (the SDKs' `mockUserToken`) for `uid`.
    static func mockToken(_ uid: String) -> String {
        func b64(_ s: String) -> String {
            Data(s.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                .replacingOccurrences(of: "=", with: "")
        }
        return b64(#"{"alg":"none","typ":"JWT"}"#) + "." + b64(#"{"sub":"\#(uid)","user_id":"\#(uid)","iat":1}"#) + "."
    }

    static let rules = """
        {
          "rules": {
            "public": { ".read": true },
            "users": {
              "$uid": {
                ".read": "auth != null && auth.uid == $uid",
                ".write": "auth != null && auth.uid == $uid",
                ".validate": "newData.hasChildren(['name'])"
              }
            }
          }
        }
        """

    @Test("rules set through /.settings/rules.json decide REST reads and writes, survive a restart; errors name line and column")
    func restEnforcement() async throws {
        let dir = try temporaryDirectory("rules-rest")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var node = try BanyanNode.start(config: singleNodeConfig(dir), logger: Logger(label: "test"))
        var port = clientPort(node)
        let ready = await eventually({ ((try? httpExchange(port: port, "PUT", "/public/a.json?auth=owner", body: "1"))?.status ?? 0) == 200 }, seconds: 30)
        #expect(ready)
        let alice = "auth=" + Self.mockToken("alice")
        let bob = "auth=" + Self.mockToken("bob")

        // Before rules, the development settings: open.
        #expect(try httpExchange(port: port, "PUT", "/users/bob.json", body: #"{"age":1}"#).status == 200)
        // Setting rules: administrators only; a syntax error names its place.
        #expect(try httpExchange(port: port, "PUT", "/.settings/rules.json", body: Self.rules).status == 401)
        let bad = try httpExchange(port: port, "PUT", "/.settings/rules.json?auth=owner", body: "{\n  \"rules\": {\n    \".read\": \"auth.uid ==\"\n  }\n}")
        #expect(bad.status == 400)
        #expect(bad.body.contains("3:"), "\(bad.body)")
        #expect(try httpExchange(port: port, "PUT", "/.settings/rules.json?auth=owner", body: Self.rules).status == 200)
        let shown = try httpExchange(port: port, "GET", "/.settings/rules.json?auth=owner")
        #expect(shown.status == 200 && shown.body == Self.rules)

        func check(_ port: Int) throws {
            #expect(try httpExchange(port: port, "PUT", "/users/alice.json", body: #"{"name":"A"}"#).status == 401)
            #expect(try httpExchange(port: port, "PUT", "/users/alice.json?\(bob)", body: #"{"name":"A"}"#).status == 401)
            #expect(try httpExchange(port: port, "PUT", "/users/alice.json?\(alice)", body: #"{"age":3}"#).status == 401)
            let denied = try httpExchange(port: port, "PUT", "/public/x.json", body: "1")
            #expect(denied.status == 401 && denied.body.contains("Permission denied"))
            #expect(try httpExchange(port: port, "PUT", "/users/alice.json?\(alice)", body: #"{"name":"A"}"#).status == 200)
            #expect(try httpExchange(port: port, "PATCH", "/users/alice.json?\(alice)", body: #"{"age":3}"#).status == 200)
            let mine = try httpExchange(port: port, "GET", "/users/alice.json?\(alice)")
            #expect(mine.status == 200 && mine.body == #"{"age":3,"name":"A"}"#)
            #expect(try httpExchange(port: port, "GET", "/users/alice.json").status == 401)
            #expect(try httpExchange(port: port, "GET", "/users/alice.json?\(bob)").status == 401)
            #expect(try httpExchange(port: port, "GET", "/users.json?\(alice)").status == 401)
            #expect(try httpExchange(port: port, "GET", "/public.json").status == 200)
            // The administrator is not judged; with auth_variable_override it is judged as that client.
            #expect(try httpExchange(port: port, "GET", "/users.json?auth=owner").status == 200)
            #expect(try httpExchange(port: port, "GET", "/users/bob.json?auth=owner&auth_variable_override=%7B%22uid%22%3A%22bob%22%7D").status == 200)
            #expect(try httpExchange(port: port, "GET", "/users/alice.json?auth=owner&auth_variable_override=%7B%22uid%22%3A%22bob%22%7D").status == 401)
        }
        try check(port)

        // The rules are state: a restarted node still enforces them.
        node.shutdown()
        node = try BanyanNode.start(config: singleNodeConfig(dir), logger: Logger(label: "test"))
        defer { node.shutdown() }
        port = clientPort(node)
        let back = await eventually({ ((try? httpExchange(port: port, "PUT", "/public/b.json?auth=owner", body: "2"))?.status ?? 0) == 200 }, seconds: 30)
        #expect(back)
        #expect(try httpExchange(port: port, "GET", "/.settings/rules.json?auth=owner").body == Self.rules)
        try check(port)
        // Removing them (an empty document) returns the namespace to the development settings.
        #expect(try httpExchange(port: port, "PUT", "/.settings/rules.json?auth=owner", body: "").status == 200)
        #expect(try httpExchange(port: port, "PUT", "/public/x.json", body: "1").status == 200)
    }
}

extension RealtimeServerTests {
    @Test("rules on WebSocket sessions: writes and listens are judged for the connection's credentials; a listen the rules or an unauth stop allowing is revoked with c")
    func rulesOnSessions() throws {
        try withNode("rt-rules") { port, _ in
            let ready = Date().addingTimeInterval(30)
            while Date() < ready, (try? http(port, "PUT", "/public/a.json?ns=rt&auth=owner", body: "1"))?.status != 200 { Thread.sleep(forTimeInterval: 0.1) }
            let (signedOut, _) = try open(port)
            // No rules yet: the development settings let anyone listen.
            signedOut.text(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/secure/alice","h":""}}}"#)
            #expect(signedOut.messages(until: #""r":1"#).last?.contains(#""s":"ok""#) == true)
            #expect(try http(port, "PUT", "/.settings/rules.json?ns=rt&auth=owner", body: RulesServerTests.rules.replacingOccurrences(of: "\"users\"", with: "\"secure\"")).status == 200)
            // The listen it no longer may read is revoked.
            #expect(signedOut.message() == #"{"t":"d","d":{"a":"c","b":{"p":"secure/alice"}}}"#)
            signedOut.text(#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/secure/alice","d":{"name":"M"}}}}"#)
            #expect(signedOut.message() == #"{"t":"d","d":{"r":2,"b":{"s":"permission_denied","d":"Permission denied"}}}"#)
            signedOut.text(#"{"t":"d","d":{"r":3,"a":"q","b":{"p":"/secure/alice","h":""}}}"#)
            #expect(signedOut.message()?.contains(#""r":3,"b":{"s":"permission_denied""#) == true)
            signedOut.text(#"{"t":"d","d":{"r":4,"a":"g","b":{"p":"/secure/alice","q":{}}}}"#)
            #expect(signedOut.message()?.contains(#""r":4,"b":{"s":"permission_denied""#) == true)

            let (alice, _) = try open(port)
            alice.text(#"{"t":"d","d":{"r":1,"a":"auth","b":{"cred":"\#(RulesServerTests.mockToken("alice"))"}}}"#)
            #expect(alice.message()?.contains(#""r":1,"b":{"s":"ok""#) == true)
            alice.text(#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/secure/alice","d":{"name":"A"}}}}"#)
            #expect(alice.message() == #"{"t":"d","d":{"r":2,"b":{"s":"ok","d":""}}}"#)
            alice.text(#"{"t":"d","d":{"r":3,"a":"p","b":{"p":"/secure/bob","d":{"name":"A"}}}}"#)
            #expect(alice.message() == #"{"t":"d","d":{"r":3,"b":{"s":"permission_denied","d":"Permission denied"}}}"#)
            alice.text(#"{"t":"d","d":{"r":4,"a":"q","b":{"p":"/secure/alice","h":""}}}"#)
            let started = alice.messages(until: #""r":4"#)
            #expect(started.first == #"{"t":"d","d":{"a":"d","b":{"p":"secure/alice","d":{"name":"A"}}}}"#, "\(started)")
            // Signing out revokes it.
            alice.text(#"{"t":"d","d":{"r":5,"a":"unauth","b":{}}}"#)
            let after = alice.messages(until: #""r":5"#)
            #expect(after.contains(#"{"t":"d","d":{"a":"c","b":{"p":"secure/alice"}}}"#), "\(after)")
        }
    }
}

extension RulesServerTests {
    @Test("an event stream the new rules no longer allow is cancelled; a refused compare-and-set is 401, not 412 with the data; a namespace without rules shows its development behaviour as rules")
    func streamsConditionalWritesAndDefaults() async throws {
        let dir = try temporaryDirectory("rules-streams")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let node = try BanyanNode.start(config: singleNodeConfig(dir), logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        let ready = await eventually({ ((try? httpExchange(port: port, "PUT", "/users/alice.json?auth=owner", body: #"{"name":"A"}"#))?.status ?? 0) == 200 }, seconds: 30)
        #expect(ready)
        // Without rules: the development behaviour, written as rules.
        let shown = try httpExchange(port: port, "GET", "/.settings/rules.json?auth=owner")
        #expect(shown.status == 200 && shown.body.contains(#"".read": true"#) && shown.body.contains(#"".write": true"#), "\(shown.body)")
        // A stream opened while anyone may read...
        let stream = try RequestDeadlineTests.Raw(port: port)
        stream.send("GET /users/alice.json HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
        #expect(stream.receive(until: "event: put", seconds: 10).text.contains("event: put"))
        // ...is cancelled when the rules stop allowing it.
        #expect(try httpExchange(port: port, "PUT", "/.settings/rules.json?auth=owner", body: Self.rules).status == 200)
        let after = stream.receive(until: "event: cancel", seconds: 10)
        #expect(after.text.contains("event: cancel"), "\(after.text)")
        // A conditional write by a client the rules refuse: 401, and the current value is not sent.
        let etag = try RequestDeadlineTests.Raw(port: port)
        etag.send("GET /users/alice.json?auth=owner HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Firebase-ETag: true\r\nConnection: close\r\n\r\n")
        let tagLine = etag.receive(until: "", seconds: 10).text.split(separator: "\r\n").first { $0.lowercased().hasPrefix("etag:") }
        let tag = try #require(tagLine.map { String($0.dropFirst(5)).trimmingCharacters(in: .whitespaces) })
        let conditional = try RequestDeadlineTests.Raw(port: port)
        let body = #"{"name":"M"}"#
        conditional.send("PUT /users/alice.json?auth=\(Self.mockToken("bob")) HTTP/1.1\r\nHost: 127.0.0.1\r\nif-match: \(tag)\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)")
        let answer = conditional.receive(until: "", seconds: 10).text
        #expect(answer.hasPrefix("HTTP/1.1 401") && !answer.contains(#""A""#), "\(answer)")
    }
}

/// Safe defaults (issue 16, docs/security.md): development conveniences stay on loopback, data
/// files are the node's alone, CORS is configured, operator POSTs must be JSON.
@Suite struct SafeDefaultsTests {
    @Test("a node off loopback refuses to start while a development setting would expose it, naming the setting")
    func developmentStaysOnLoopback() throws {
        #expect(HostPort(host: "127.0.0.1", port: 1).isLoopback && HostPort(host: "127.8.0.2", port: 1).isLoopback)
        #expect(HostPort(host: "localhost", port: 1).isLoopback && HostPort(host: "::1", port: 1).isLoopback)
        #expect(!HostPort(host: "0.0.0.0", port: 1).isLoopback && !HostPort(host: "10.0.0.1", port: 1).isLoopback)
        #expect(!HostPort(host: "::", port: 1).isLoopback && !HostPort(host: "127.0.0.1.example.com", port: 1).isLoopback)
        try NodeConfig().validate()  // the zero-setup node: loopback, development settings on
        func refusal(_ yaml: String) -> String {
            do {
                _ = try NodeConfig.parse(yaml: yaml)
                return "accepted"
            } catch {
                return "\(error)"
            }
        }
        #expect(refusal("client_address: 0.0.0.0:9000").contains("development.allow_unauthenticated"))
        #expect(refusal("client_address: 10.0.0.1:9000\ndevelopment: {allow_unauthenticated: false}").contains("development.accept_owner_token"))
        #expect(refusal("peer_address: 10.0.0.1:7000").contains("tls.generate_development_certificates"))
        #expect(refusal("http: {cors_origins: ['*']}\ndevelopment: {allow_unauthenticated: false}").contains("cors_origins"))
        #expect(refusal("http: {cors_origins: ['app.example.com']}").contains("is not an origin"))
        let production = """
            client_address: 0.0.0.0:9000
            peer_address: 10.0.0.1:7000
            tls: {ca: /x/ca.pem, cert: /x/n.pem, key: /x/n.key, generate_development_certificates: false}
            http: {cors_origins: ['https://app.example.com']}
            development: {allow_unauthenticated: false, accept_owner_token: false}
            """
        #expect(refusal(production) == "accepted")
        #expect(NodeConfig().effectiveCORSOrigins == ["*"])
        #expect(try NodeConfig.parse(yaml: production).effectiveCORSOrigins == ["https://app.example.com"])
    }

    @Test("the example deployment in deploy/ passes the safe-default checks, holds no private key, and its rules parse")
    func deployExample() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
        for i in 1...3 {
            let c = try NodeConfig.load(file: "\(root)/deploy/node\(i).yaml")
            #expect(!c.development.allowUnauthenticated && !c.development.acceptOwnerToken && !c.tls.generateDevelopmentCertificates)
            #expect(!c.effectiveCORSOrigins.contains("*") && c.adminTokenFile != nil)
            // HTTPS on the client port, operator reads closed, and verified credentials configured.
            #expect(c.http.tlsCertificate != nil && c.http.tlsPrivateKey != nil && !c.effectiveOpenOperatorReads)
            #expect(c.auth.isConfigured && c.auth.databaseSecretsFile != nil && c.auth.projectID != nil)
        }
        let files = (FileManager.default.enumerator(atPath: "\(root)/deploy")?.allObjects as? [String]) ?? []
        #expect(!files.isEmpty && !files.contains { $0.hasSuffix(".key") })
        let text = try String(contentsOfFile: "\(root)/deploy/rules.json", encoding: .utf8)
        _ = try Rules.parse(text)
    }

    @Test("data files and directories are created for the node's user alone; CORS answers only listed origins; operator POSTs must be JSON")
    func filesCORSAndOperatorPosts() async throws {
        let dir = try temporaryDirectory("safe-defaults")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var c = singleNodeConfig(dir)
        c.http.corsOrigins = ["https://app.example.com"]
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        let ready = await eventually({ ((try? httpExchange(port: port, "PUT", "/a.json?auth=owner", body: "1"))?.status ?? 0) == 200 }, seconds: 30)
        #expect(ready)
        // Every directory and file the node made in its data directory is 0700 / 0600, but the
        // development certificates, which are public (their keys are 0600, and the directory
        // holding them 0700).
        let data = c.dataDirectory
        var checked = 0
        if let walker = FileManager.default.enumerator(atPath: data) {
            for case let name as String in walker {
                let attributes = try FileManager.default.attributesOfItem(atPath: data + "/" + name)
                let mode = (attributes[.posixPermissions] as? NSNumber)?.intValue ?? -1
                let isDirectory = attributes[.type] as? FileAttributeType == .typeDirectory
                let publicCertificate = name.hasPrefix("certs/") && name.hasSuffix(".pem")
                #expect(mode == (isDirectory ? 0o700 : publicCertificate ? 0o644 : 0o600), "\(name): \(String(mode, radix: 8))")
                checked += 1
            }
        }
        #expect(checked > 0)
        func originHeader(_ origin: String) throws -> String? {
            let connection = try RequestDeadlineTests.Raw(port: port)
            connection.send("GET /a.json HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: \(origin)\r\nConnection: close\r\n\r\n")
            let text = connection.receive(until: "", seconds: 10).text
            // A listed origin is echoed, so caches must key on it.
            if text.lowercased().contains("access-control-allow-origin: \(origin)") { #expect(text.contains("Vary: Origin")) }
            return text.split(separator: "\r\n").first { $0.lowercased().hasPrefix("access-control-allow-origin:") }.map { String($0.dropFirst(29)).trimmingCharacters(in: .whitespaces) }
        }
        #expect(try originHeader("https://app.example.com") == "https://app.example.com")
        #expect(try originHeader("https://evil.example.com") == nil)
        // An operator POST without a JSON content type is refused before it does anything.
        let connection = try RequestDeadlineTests.Raw(port: port)
        connection.send("POST /.banyan/transfer?to=2 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        #expect(connection.receive(until: "", seconds: 10).text.hasPrefix("HTTP/1.1 415"))
    }
}

extension RealtimeServerTests {
    @Test(".indexOn: a query ordered by a child the rules do not index is served, with the no_index warning the SDKs log; REST queries are logged too")
    func indexWarnings() throws {
        try withNode("rt-index") { port, node in
            let ready = Date().addingTimeInterval(30)
            while Date() < ready, (try? http(port, "PUT", "/d/a.json?ns=rt&auth=owner", body: #"{"h":2}"#))?.status != 200 { Thread.sleep(forTimeInterval: 0.1) }
            let rules = #"{"rules": {".read": true, ".write": true, "d": {".indexOn": ["h"]}}}"#
            #expect(try http(port, "PUT", "/.settings/rules.json?ns=rt&auth=owner", body: rules).status == 200)
            let (c, _) = try open(port)
            c.text(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/d","q":{"i":"h"},"t":1,"h":""}}}"#)
            #expect(c.messages(until: #""r":1"#).last == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":{}}}}"#)
            c.text(#"{"t":"d","d":{"r":2,"a":"q","b":{"p":"/d","q":{"i":"w"},"t":2,"h":""}}}"#)
            let unindexed = c.messages(until: #""r":2"#)
            #expect(unindexed.last == #"{"t":"d","d":{"r":2,"b":{"s":"ok","d":{"w":["no_index"]}}}}"#, "\(unindexed)")
            #expect(unindexed.first?.contains(#""h":2"#) == true, "the data still comes: \(unindexed)")
            // REST: served, and logged once per location and child; an indexed child is not.
            let logged = { node.http.indexWarnings.withLock { $0 } }
            #expect(try http(port, "GET", "/d.json?ns=rt&orderBy=%22h%22&auth=owner").status == 200)
            #expect(!logged().contains { $0.hasPrefix("rt/d|") && $0.contains("h") && !$0.contains("w") })
            let before = logged().count
            #expect(try http(port, "GET", "/d.json?ns=rt&orderBy=%22v%22&auth=owner").status == 200)
            #expect(logged().count == before + 1, "\(logged())")
        }
    }
}
