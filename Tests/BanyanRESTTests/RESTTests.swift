import BanyanListen
import BanyanQuery
import BanyanREST
import BanyanStateMachine
import BanyanTree
import Testing

func head(_ method: String, _ uri: String, _ headers: [(String, String)] = []) -> HTTPHead {
    HTTPHead(method: method, uri: uri, headers: headers.map { (name: $0.0, value: $0.1) })
}

func parse(
    _ method: String, _ uri: String, body: String = "", headers: [(String, String)] = [], maxUpdatePaths: Int = WriteValidation.defaultMaxUpdatePaths
) -> Result<RESTRequest, RESTError> {
    RESTRequest.parse(head(method, uri, headers), body: Array(body.utf8), defaultNamespace: "default", maxUpdatePaths: maxUpdatePaths)
}

func request(
    _ method: String, _ uri: String, body: String = "", headers: [(String, String)] = [], maxUpdatePaths: Int = WriteValidation.defaultMaxUpdatePaths
) throws -> RESTRequest {
    try parse(method, uri, body: body, headers: headers, maxUpdatePaths: maxUpdatePaths).get()
}

func tree(_ json: String) throws -> Tree { try Tree(json: json) }

/// Applies a request's command to a state machine, as a node does.
func applyWrite(_ r: RESTRequest, to machine: inout StateMachine, pushID: String = "-PUSHID0000000000001", seq: UInt64 = 1) throws -> StateMachine.Applied {
    let command = try r.command(pushID: pushID).get()
    let payload = CommandEnvelope(namespace: r.namespace, session: 1, seq: seq, timestamp: 1_700_000_000_000, command: command).encoded()
    let applied = machine.apply(payload, index: machine.appliedIndex + 1)
    return try #require(applied)
}

@Suite struct RESTParsingTests {
    @Test("paths: .json suffix, percent-decoding, trailing slash, priority location, validation")
    func paths() throws {
        #expect(try request("GET", "/users/ada.json").path == Path(parsing: "/users/ada"))
        #expect(try request("GET", "/.json").path == .root)
        #expect(try request("GET", "/users/jack/name/.json").path == Path(parsing: "/users/jack/name"))
        #expect(try request("GET", "/a%20b/%E2%9C%93.json").path == Path(parsing: "/a b/✓"))
        let p = try request("PUT", "/a/.priority.json", body: "5")
        let a = try Path(parsing: "/a")
        #expect(p.isPriority && p.path == a)
        #expect(parse("GET", "/users").failureStatus == 404)
        #expect(parse("GET", "/a%ZZ.json").failureStatus == 400)
        #expect(parse("GET", "/a%24b.json").failureStatus == 400)  // '$' is not allowed in keys
        #expect(parse("GET", "/" + Array(repeating: "k", count: 33).joined(separator: "/") + ".json").failureStatus == 400)
        // '+' stays '+' in a path; escapes decode in query values; plain text passes unchanged.
        #expect(try request("GET", "/a+b.json?ns=my%2Ddb").path == Path(parsing: "/a+b"))
        #expect(try request("GET", "/a+b.json?ns=my%2Ddb").namespace == "my-db")
        #expect(parse("GET", "/x.json?ns=my+db").failureStatus == 400)  // '+' is a space in a query
        #expect(try request("GET", "/caf\u{E9}.json?ns=plain").path == Path(parsing: "/caf\u{E9}"))
    }

    @Test("header names match ignoring ASCII case only")
    func headerNames() {
        #expect(HTTPHead.isHeader("Content-Length", "content-length"))
        #expect(HTTPHead.isHeader("X-FIREBASE-ETAG", "x-firebase-etag"))
        #expect(HTTPHead.isHeader("", ""))
        #expect(!HTTPHead.isHeader("Content-Lengt", "content-length"))
        #expect(!HTTPHead.isHeader("Content-Lengthx", "content-length"))
        // Just outside A–Z: '@' (0x40) and '[' (0x5B) are not '`' and '{'.
        #expect(!HTTPHead.isHeader("@", "`") && !HTTPHead.isHeader("[", "{"))
        #expect(HTTPHead.isHeader("a-B_9", "A-b_9"))
        let head = HTTPHead(method: "GET", uri: "/", headers: [("ACCEPT", "text/event-stream"), ("host", "db.example")])
        #expect(head.header("Accept") == "text/event-stream" && head.header("HOST") == "db.example" && head.header("If-Match") == nil)
    }

    @Test("namespace from ns, else the Host's first label, else the default; invalid names refused")
    func namespaces() throws {
        #expect(try request("GET", "/x.json?ns=shop").namespace == "shop")
        #expect(try request("GET", "/x.json", headers: [("Host", "chat-prod.firebaseio.com")]).namespace == "chat-prod")
        #expect(try request("GET", "/x.json", headers: [("Host", "127.0.0.1:9000")]).namespace == "default")
        #expect(try request("GET", "/x.json", headers: [("Host", "[::1]:9000")]).namespace == "default")
        #expect(try request("GET", "/x.json").namespace == "default")
        #expect(parse("GET", "/x.json?ns=a.b").failureStatus == 400)
        #expect(parse("GET", "/x.json?ns=").failureStatus == 400)
        // The system namespaces (accounts, the cluster's own records) cannot be named by clients.
        for system in ["$accounts", "%24accounts", "$cluster", "$clients"] {
            #expect(parse("GET", "/x.json?ns=\(system)").failureStatus == 400, "\(system)")
            #expect(parse("PUT", "/x.json?ns=\(system)", body: "1").failureStatus == 400, "\(system)")
        }
    }

    @Test("the exact requests firebase-admin (Python) sends parse as intended")
    func firebaseAdminRequests() throws {
        let set = try request("PUT", "/users/a.json?print=silent&ns=foo", body: #"{"x":1}"#, headers: [("Authorization", "Bearer owner")])
        #expect(set.operation == .put && set.print == .silent && set.namespace == "foo" && set.authorization == .owner)
        let q = try request("GET", "/x.json?endAt=10&limitToFirst=2&orderBy=%22c%22&startAt=1&ns=foo")
        var expected = Query()
        expected = try expected.orderByChild("c").startAt(Tree(.int(1))).endAt(Tree(.int(10))).limitToFirst(2)
        #expect(q.query == expected.params)
        let key = try request("GET", "/x.json?orderBy=%22%24key%22&limitToLast=3&ns=foo")
        #expect(key.query == (try Query().orderByKey().limitToLast(3)).params)
        let etag = try request("GET", "/x.json?ns=foo", headers: [("X-Firebase-ETag", "true")])
        #expect(etag.wantsETag)
        let cond = try request("PUT", "/x.json?ns=foo", body: "1", headers: [("if-match", "abc=")])
        #expect(cond.ifMatch == "abc=")
        let stream = try request("GET", "/x.json?ns=foo", headers: [("Accept", "text/event-stream"), ("Cache-Control", "no-cache")])
        #expect(stream.operation == .stream)
        let push = try request("POST", "/list.json?ns=foo", body: #""""#)
        #expect(push.operation == .post)
        let patch = try request("PATCH", "/u.json?print=silent&ns=foo", body: #"{"a/b":1,"c":null}"#)
        #expect(patch.operation == .patch)
    }

    @Test("query parameters: every ordering and bound, key tie-breakers, shallow paging, and their errors")
    func queries() throws {
        #expect(try request("GET", "/x.json?orderBy=%22%24value%22&equalTo=%22a%22").query == (try Query().orderByValue().equalTo(Tree(.string("a")))).params)
        #expect(try request("GET", "/x.json?orderBy=%22%24priority%22&startAt=5,%22k%22").query == (try Query().orderByPriority().startAt(Tree(.int(5)), key: "k")).params)
        #expect(try request("GET", "/x.json?orderBy=%22a/b%22&startAfter=1&endBefore=9").query == (try Query().orderByChild("a/b").startAfter(Tree(.int(1))).endBefore(Tree(.int(9)))).params)
        let shallowPage = try request("GET", "/x.json?shallow=true&limitToFirst=2&startAfter=%22b%22")
        #expect(shallowPage.query == (try Query().orderByKey().startAfter(Tree(.string("b"))).limitToFirst(2)).params)
        let bad: [String] = [
            "/x.json?limitToFirst=2",  // orderBy missing
            "/x.json?orderBy=%22a%22&limitToFirst=-1", "/x.json?orderBy=%22a%22&limitToFirst=x",
            "/x.json?orderBy=%22a%22&limitToFirst=99999999999999999999",
            "/x.json?orderBy=%22a%22&limitToFirst=1&limitToLast=1", "/x.json?orderBy=a", "/x.json?orderBy=%22%24key%22&startAt=5",
            "/x.json?orderBy=%22a%22&startAt=%7B%7D", "/x.json?orderBy=%22a%22&startAt=1&equalTo=2",
            "/x.json?shallow=maybe", "/x.json?print=loud", "/x.json?format=csv", "/x.json?timeout=16min", "/x.json?timeout=10",
            "/x.json?writeSizeLimit=huge", "/x.json?consistency=eventual", "/x.json?callback=alert(1)",
        ]
        for uri in bad { #expect(parse("GET", uri).failureStatus == 400, "\(uri)") }
        #expect(try request("GET", "/x.json?timeout=3s").timeoutMilliseconds == 3000)
        #expect(try request("GET", "/x.json?timeout=15min").timeoutMilliseconds == 900_000)
    }

    @Test("a multi-path update of 20,000 paths (allowed by the node's setting): the overlap of its first and last is found, and without it the command carries each value's own bytes")
    func manyPaths() throws {
        var keys = (0..<20_000).map { "\"k\($0)\": {\"v\" : \($0)}" }
        keys.append(#""k0/v": 1"#)
        #expect(
            parse("PATCH", "/x.json", body: "{" + keys.joined(separator: ",") + "}", maxUpdatePaths: 20_001).failure?.message
                == #"Invalid data; PATCH paths "/k0" and "/k0/v" overlap."#)
        keys.removeLast()
        let patch = try request("PATCH", "/x.json", body: "{" + keys.joined(separator: ",") + "}", maxUpdatePaths: 20_000)
        guard case .success(.update(let path, let entries)) = patch.command(pushID: "") else {
            Issue.record("not an update")
            return
        }
        #expect(path == "/x" && entries.count == 20_000)
        #expect(entries.last.map { $0.path == "k19999" && String(decoding: $0.json, as: UTF8.self) == #"{"v" : 19999}"# } == true)
    }

    @Test("a multi-path update with more paths than http.max_update_keys gets 400 before any path is checked; at the limit it passes")
    func updatePathLimit() throws {
        let body = { (n: Int) in "{" + (0..<n).map { "\"k\($0)\": \($0)" }.joined(separator: ",") + "}" }
        let over = parse("PATCH", "/x.json", body: body(WriteValidation.defaultMaxUpdatePaths + 1))
        #expect(over.failureStatus == 400)
        #expect(over.failure?.message == "Invalid data; a multi-path update may change at most 1000 paths, and this one has more. Split it into several updates.")
        #expect((try? request("PATCH", "/x.json", body: body(WriteValidation.defaultMaxUpdatePaths))) != nil)
        // The count is checked first: an invalid key past the limit is not what is reported, and
        // nothing after the first path too many is read (the rest here is not even JSON).
        #expect(parse("PATCH", "/x.json", body: #"{"a":1,"b":2,"c.d":3}"#, maxUpdatePaths: 2).failure?.message.contains("at most 2 paths") == true)
        #expect(parse("PATCH", "/x.json", body: #"{"a":1,"b":2,"c":!!! not json"#, maxUpdatePaths: 2).failure?.message.contains("at most 2 paths") == true)
        // Sets and pushes are not multi-path updates.
        #expect((try? request("PUT", "/x.json", body: body(5_000))) != nil)
    }

    @Test("bad writes get 400 with Firebase's messages and never reach the log")
    func badWrites() throws {
        #expect(parse("PUT", "/x.json", body: "").failure?.message == "Invalid data; couldn't parse JSON object, array, or value.")
        let bodies = ["{", "{\"a\":}", "NaN", "[1,", "{\"a\":1,\"a\":2}", "{\"a.b\":1}", "{\"$x\":1}", "\u{7F}", "1 2"]
        for b in bodies { #expect(parse("PUT", "/x.json", body: b).failureStatus == 400, "\(b)") }
        var deep = ""
        for _ in 0..<40 { deep += "{\"a\":" }
        deep += "1" + String(repeating: "}", count: 40)
        #expect(parse("PUT", "/x.json", body: deep).failureStatus == 400)
        #expect(parse("PATCH", "/x.json", body: "[1]").failureStatus == 400)
        #expect(parse("PATCH", "/x.json", body: #"{"a":1,"a/b":2}"#).failureStatus == 400)  // overlapping paths
        #expect(parse("PATCH", "/x.json", body: #"{"a/b/c":1,"x":2,"/a/b/":2}"#).failure?.message == #"Invalid data; PATCH paths "/a/b" and "/a/b/c" overlap."#)
        #expect(parse("PATCH", "/x.json", body: #"{"a":1,"b":{"c":]}}"#).failureStatus == 400)  // a value that is not JSON
        #expect(parse("PATCH", "/x.json", body: #"{"a":1} x"#).failureStatus == 400)
        #expect(parse("PATCH", "/x.json", body: #"{"a":1}"#, headers: [("if-match", "x")]).failureStatus == 400)
        #expect(parse("POST", "/x.json", body: "1", headers: [("if-match", "x")]).failureStatus == 400)
        #expect(parse("PUT", "/x.json?writeSizeLimit=tiny", body: "\"" + String(repeating: "a", count: 70_000) + "\"").failureStatus == 400)
        #expect(parse("TRACE", "/x.json").failureStatus == 405)
        #expect(parse("POST", "/x.json", body: "1", headers: [("X-HTTP-Method-Override", "GET")]).failureStatus == 400)
        #expect(try request("POST", "/x.json", body: "null", headers: [("X-HTTP-Method-Override", "DELETE")]).operation == .delete)
    }
}

@Suite struct RESTRenderingTests {
    let data = #"{"users":{"ada":{"name":"Ada","age":36},"bob":{"name":"Bob","age":20,".priority":1}},"n":{".value":5,".priority":"p"}}"#

    @Test("GET renders plain, pretty, export, shallow and query results")
    func reads() throws {
        let t = try tree(data)
        #expect(RESTRender.read(try request("GET", "/users/ada/name.json"), tree: t).text == #""Ada""#)
        #expect(RESTRender.read(try request("GET", "/nobody.json"), tree: t).text == "null")
        #expect(RESTRender.read(try request("GET", "/n.json?format=export"), tree: t).text == #"{".value":5,".priority":"p"}"#)
        #expect(RESTRender.read(try request("GET", "/users.json?shallow=true"), tree: t).text == #"{"ada":true,"bob":true}"#)
        #expect(RESTRender.read(try request("GET", "/users/ada/age.json?shallow=true"), tree: t).text == "36")
        #expect(RESTRender.read(try request("GET", "/users.json?orderBy=%22age%22&limitToFirst=1"), tree: t).text == #"{"bob":{"age":20,"name":"Bob"}}"#)
        let pretty = RESTRender.read(try request("GET", "/users/ada.json?print=pretty"), tree: t).text
        #expect(pretty.contains("\n") && pretty.contains("\"name\""))
        let jsonp = RESTRender.read(try request("GET", "/users/ada/age.json?callback=cb"), tree: t)
        #expect(jsonp.text == "cb(36);")
        #expect(jsonp.header("Content-Type")?.hasPrefix("application/javascript") == true)
        #expect(RESTRender.read(try request("GET", "/users.json?download=u.json"), tree: t).header("Content-Disposition") == "attachment; filename=\"u.json\"")
        #expect(RESTRender.read(try request("GET", "/n/.priority.json"), tree: t).text == #""p""#)
    }

    @Test("ETags: the node hash or null_etag; if-none-match gives 304 with no body")
    func etags() throws {
        let t = try tree(data)
        let ada = t.child(at: try Path(parsing: "/users/ada"))
        let r = RESTRender.read(try request("GET", "/users/ada.json", headers: [("X-Firebase-ETag", "true")]), tree: t)
        #expect(r.header("ETag") == ada.hashString)
        #expect(RESTRender.read(try request("GET", "/none.json", headers: [("X-Firebase-ETag", "true")]), tree: t).header("ETag") == "null_etag")
        let notModified = RESTRender.read(try request("GET", "/users/ada.json", headers: [("if-none-match", "\"\(ada.hashString)\"")]), tree: t)
        #expect(notModified.status == 304 && notModified.body.isEmpty)
        #expect(RESTRender.read(try request("GET", "/users/ada.json", headers: [("if-none-match", "other")]), tree: t).status == 200)
    }

    @Test("writes: PUT echoes the resolved value, POST names the push id, PATCH echoes, DELETE null, silent 204")
    func writes() throws {
        var m = StateMachine()
        let put = try request("PUT", "/a.json?ns=n", body: #"{"t":{".sv":"timestamp"},"x":1}"#)
        #expect(RESTRender.write(put, applied: try applyWrite(put, to: &m, seq: 1), pushID: nil).text == #"{"t":1700000000000,"x":1}"#)
        let post = try request("POST", "/list.json?ns=n", body: #""v""#)
        let posted = RESTRender.write(post, applied: try applyWrite(post, to: &m, pushID: "-Nabcdefghijklmnopqr", seq: 2), pushID: "-Nabcdefghijklmnopqr")
        #expect(posted.text == #"{"name":"-Nabcdefghijklmnopqr"}"#)
        #expect(JSONWriter.string(m.tree("n").child(at: try Path(parsing: "/list/-Nabcdefghijklmnopqr"))) == #""v""#)
        let patch = try request("PATCH", "/a.json?ns=n", body: #"{"x":2,"y/z":3}"#)
        #expect(RESTRender.write(patch, applied: try applyWrite(patch, to: &m, seq: 3), pushID: nil).text == #"{"x":2,"y/z":3}"#)
        #expect(JSONWriter.string(m.tree("n").child(at: try Path(parsing: "/a"))) == #"{"t":1700000000000,"x":2,"y":{"z":3}}"#)
        let silent = try request("PUT", "/b.json?ns=n&print=silent", body: "1")
        let s = RESTRender.write(silent, applied: try applyWrite(silent, to: &m, seq: 4), pushID: nil)
        #expect(s.status == 204 && s.body.isEmpty)
        let del = try request("DELETE", "/b.json?ns=n")
        #expect(RESTRender.write(del, applied: try applyWrite(del, to: &m, seq: 5), pushID: nil).text == "null")
        #expect(m.tree("n").child(at: try Path(parsing: "/b")).isEmpty)
    }

    @Test("conditional writes: if-match applies when the ETag matches, else 412 with the current value and ETag")
    func conditional() throws {
        var m = StateMachine()
        let first = try request("PUT", "/c.json?ns=n", body: "1", headers: [("if-match", "null_etag")])
        let ok = RESTRender.write(first, applied: try applyWrite(first, to: &m, seq: 1), pushID: nil)
        #expect(ok.status == 200 && ok.header("ETag") == Tree(.int(1)).hashString)
        let stale = try request("PUT", "/c.json?ns=n", body: "2", headers: [("if-match", "null_etag")])
        let refused = RESTRender.write(stale, applied: try applyWrite(stale, to: &m, seq: 2), pushID: nil)
        #expect(refused.status == 412 && refused.text == "1" && refused.header("ETag") == Tree(.int(1)).hashString)
        let good = try request("PUT", "/c.json?ns=n", body: "3", headers: [("if-match", Tree(.int(1)).hashString)])
        #expect(RESTRender.write(good, applied: try applyWrite(good, to: &m, seq: 3), pushID: nil).status == 200)
        let delete = try request("DELETE", "/c.json?ns=n", headers: [("if-match", Tree(.int(1)).hashString)])
        #expect(RESTRender.write(delete, applied: try applyWrite(delete, to: &m, seq: 4), pushID: nil).status == 412)
    }

    @Test("the ETag after a PATCH is the location's new value, after a POST the new child's, after a DELETE null_etag")
    func etagsAfterOtherWrites() throws {
        var m = StateMachine()
        let put = try request("PUT", "/u.json?ns=n", body: #"{"a":1,"b":2}"#)
        _ = try applyWrite(put, to: &m, seq: 1)
        let patch = try request("PATCH", "/u.json?ns=n", body: #"{"b":3,"c/d":4}"#, headers: [("X-Firebase-ETag", "true")])
        let patched = RESTRender.write(patch, applied: try applyWrite(patch, to: &m, seq: 2), pushID: nil)
        #expect(patched.status == 200)
        #expect(patched.header("ETag") == (try tree(#"{"a":1,"b":3,"c":{"d":4}}"#)).hashString)
        #expect(patched.header("ETag") == m.tree("n").child(at: try Path(parsing: "/u")).hashString)
        let post = try request("POST", "/list.json?ns=n", body: #"{"x":true}"#, headers: [("X-Firebase-ETag", "true")])
        let posted = RESTRender.write(post, applied: try applyWrite(post, to: &m, pushID: "-PUSHID0000000000009", seq: 3), pushID: "-PUSHID0000000000009")
        #expect(posted.header("ETag") == (try tree(#"{"x":true}"#)).hashString)
        let delete = try request("DELETE", "/u.json?ns=n", headers: [("X-Firebase-ETag", "true")])
        #expect(RESTRender.write(delete, applied: try applyWrite(delete, to: &m, seq: 4), pushID: nil).header("ETag") == "null_etag")
    }

    @Test("errors are Firebase-shaped JSON with a CORS header; OPTIONS answers the preflight")
    func errors() throws {
        let e = RESTRender.error(RESTError(400, "orderBy must be defined when other query parameters are defined"))
        #expect(e.text == "{\n  \"error\" : \"orderBy must be defined when other query parameters are defined\"\n}")
        #expect(e.header("Access-Control-Allow-Origin") == "*")
        let o = RESTRender.options(try request("OPTIONS", "/x.json"))
        #expect(o.status == 200 && o.header("Access-Control-Allow-Methods")?.contains("PATCH") == true)
    }
}

@Suite struct SSEStreamTests {
    func apply(_ m: inout StateMachine, _ seq: UInt64, _ command: Command, namespace: String = "n") throws -> StateMachine.Applied {
        let payload = CommandEnvelope(namespace: namespace, session: 1, seq: seq, timestamp: 5, command: command).encoded()
        let applied = m.apply(payload, index: seq)
        return try #require(applied)
    }

    /// A stream and its listen in a listen core, as a node's event loop holds them.
    struct Harness {
        var core = ListenCore()
        var stream: SSEStream

        mutating func start(_ tree: Tree) throws -> String {
            let listen = Listen(id: 1, owner: 7, namespace: stream.request.namespace, path: stream.request.path, params: stream.listenParams)
            let first = try core.listen(listen, tree: tree)
            return String(decoding: stream.start(first: first.update, tree: tree), as: UTF8.self)
        }

        mutating func applied(_ applied: StateMachine.Applied, _ tree: Tree) -> String {
            var out: [UInt8] = []
            for event in core.applied(namespace: applied.namespace, written: applied.written, tree: tree) {
                out += stream.update(event.update, tree: tree)
            }
            return String(decoding: out, as: UTF8.self)
        }
    }

    @Test("first event is a put of the whole value; sets below, above and elsewhere; updates become patches")
    func events() throws {
        var m = StateMachine()
        _ = try apply(&m, 1, .set(path: "/rooms", json: Array(#"{"r1":{"title":"Hi"}}"#.utf8)))
        var s = Harness(stream: SSEStream(request: try request("GET", "/rooms.json?ns=n", headers: [("Accept", "text/event-stream")])))
        #expect(try s.start(m.tree("n")) == "event: put\ndata: {\"path\":\"/\",\"data\":{\"r1\":{\"title\":\"Hi\"}}}\n\n")
        let below = try apply(&m, 2, .set(path: "/rooms/r1/title", json: Array(#""Hello""#.utf8)))
        #expect(s.applied(below, m.tree("n")) == "event: put\ndata: {\"path\":\"/r1/title\",\"data\":\"Hello\"}\n\n")
        let update = try apply(&m, 3, .update(path: "/rooms/r1", entries: [.init(path: "n", json: Array("4".utf8)), .init(path: "title", json: Array("null".utf8))]))
        #expect(s.applied(update, m.tree("n")) == "event: patch\ndata: {\"path\":\"/r1\",\"data\":{\"n\":4,\"title\":null}}\n\n")
        // Paths deeper than one level below their common location go as separate puts.
        let deep = try apply(&m, 4, .update(path: "/rooms", entries: [.init(path: "r1/n", json: Array("5".utf8)), .init(path: "r2/n", json: Array("6".utf8))]))
        #expect(s.applied(deep, m.tree("n")) == "event: put\ndata: {\"path\":\"/r1/n\",\"data\":5}\n\nevent: put\ndata: {\"path\":\"/r2/n\",\"data\":6}\n\n")
        let elsewhere = try apply(&m, 5, .set(path: "/other", json: Array("1".utf8)))
        #expect(s.applied(elsewhere, m.tree("n")).isEmpty)
        let above = try apply(&m, 6, .set(path: "/", json: Array(#"{"rooms":{"r2":1}}"#.utf8)))
        #expect(s.applied(above, m.tree("n")) == "event: put\ndata: {\"path\":\"/\",\"data\":{\"r2\":1}}\n\n")
        // Another namespace's writes are not this stream's.
        let foreign = try apply(&m, 7, .set(path: "/rooms/x", json: Array("1".utf8)), namespace: "other")
        #expect(s.applied(foreign, m.tree("other")).isEmpty)
        #expect(String(decoding: SSEStream.keepAlive(), as: UTF8.self) == "event: keep-alive\ndata: null\n\n")
    }

    @Test("a query stream sends the window, then a put per child that enters or leaves it (null), a patch when children in it change")
    func queryStream() throws {
        var m = StateMachine()
        _ = try apply(&m, 1, .set(path: "/s", json: Array(#"{"a":1,"b":2,"c":3}"#.utf8)))
        var s = Harness(stream: SSEStream(request: try request("GET", "/s.json?ns=n&orderBy=%22%24value%22&limitToLast=2", headers: [("Accept", "text/event-stream")])))
        #expect(try s.start(m.tree("n")) == "event: put\ndata: {\"path\":\"/\",\"data\":{\"b\":2,\"c\":3}}\n\n")
        let enter = try apply(&m, 2, .set(path: "/s/a", json: Array("9".utf8)))
        #expect(s.applied(enter, m.tree("n")) == "event: put\ndata: {\"path\":\"/a\",\"data\":9}\n\nevent: put\ndata: {\"path\":\"/b\",\"data\":null}\n\n")
        let change = try apply(&m, 3, .set(path: "/s/c", json: Array("4".utf8)))
        #expect(s.applied(change, m.tree("n")) == "event: patch\ndata: {\"path\":\"/\",\"data\":{\"c\":4}}\n\n")
        let outside = try apply(&m, 4, .set(path: "/s/b", json: Array("0".utf8)))
        #expect(s.applied(outside, m.tree("n")).isEmpty)
        // The window it keeps follows the patch: a child leaving after a patch is told right.
        let leave = try apply(&m, 5, .set(path: "/s/b", json: Array("10".utf8)))
        #expect(s.applied(leave, m.tree("n")) == "event: put\ndata: {\"path\":\"/b\",\"data\":10}\n\nevent: put\ndata: {\"path\":\"/c\",\"data\":null}\n\n")
    }

    @Test("a priority stream renders the location's priority itself: a put when it changes, nothing otherwise")
    func priorityStream() throws {
        var m = StateMachine()
        _ = try apply(&m, 1, .set(path: "/s", json: Array(#"{"a":1,".priority":"p"}"#.utf8)))
        var s = Harness(stream: SSEStream(request: try request("GET", "/s/.priority.json?ns=n", headers: [("Accept", "text/event-stream")])))
        #expect(s.stream.rendersItself && s.stream.listenParams == nil)
        #expect(try s.start(m.tree("n")) == "event: put\ndata: {\"path\":\"/\",\"data\":\"p\"}\n\n")
        let child = try apply(&m, 2, .set(path: "/s/a", json: Array("2".utf8)))
        #expect(s.applied(child, m.tree("n")).isEmpty, "a child's change keeps the priority")
        let priority = try apply(&m, 3, .set(path: "/s/.priority", json: Array(#""q""#.utf8)))
        #expect(s.applied(priority, m.tree("n")) == "event: put\ndata: {\"path\":\"/\",\"data\":\"q\"}\n\n")
    }
}

extension Result where Failure == RESTError {
    var failure: RESTError? {
        if case .failure(let e) = self { return e }
        return nil
    }
    var failureStatus: Int? { failure?.status }
}

/// The target is split over its bytes (issue 14's profile): the cases where a byte-level split
/// could differ from the `Character`-level one it replaced, and the split shared by the check at
/// the head and the full parse.
@Suite struct RESTTargetTests {
    @Test("query strings: order, repeats, empty pairs, plus and escapes, bad escapes refused")
    func query() throws {
        let params = try RESTRequest.parseQuery("a=1&&b=x+y%2Bz&a=2&=v&k=&flag&n=%E2%9C%93")
        #expect(params.map { [$0.0, $0.1] } == [["a", "1"], ["b", "x y+z"], ["a", "2"], ["", "v"], ["k", ""], ["flag", ""], ["n", "✓"]])
        #expect(try RESTRequest.parseQuery("").isEmpty)
        #expect(try RESTRequest.parseQuery("&&&").isEmpty)
        for bad in ["a=%", "a=%4", "a=%zz", "a=%FF", "%C3=1"] {
            #expect(throws: RESTError.self, "\(bad)") { try RESTRequest.parseQuery(Substring(bad)) }
        }
        // Non-ASCII text passes through whole; a pair is cut at ASCII '&' and '=' only.
        #expect(try RESTRequest.parseQuery("ключ=значение&é=ü").map { [$0.0, $0.1] } == [["ключ", "значение"], ["é", "ü"]])
        let target = try RESTRequest.target(of: "/x.json?a=1&a=2#frag=3")
        #expect(target.rawPath == "/x.json" && target.param("a") == "2" && target.param("frag") == nil)
    }

    @Test("paths: empty segments, escapes, .priority only last, non-ASCII, the .json suffix as bytes")
    func paths() throws {
        #expect(try request("GET", "//a///b/.json").path == Path(parsing: "/a/b"))
        #expect(try request("GET", "/.json").path == Path(parsing: "/"))
        #expect(parse("GET", "/a%2Fb.json").failureStatus == 400, "an escaped slash is a key with a slash")
        #expect(try request("GET", "/é/ü.json").path == Path(parsing: "/é/ü"))
        let priority = try request("PUT", "/a/.priority.json", body: "1")
        #expect(try priority.isPriority && priority.path == Path(parsing: "/a"))
        #expect(parse("GET", "/.priority/a.json").failureStatus == 400, ".priority is a location only at the end")
        #expect(parse("GET", "/a.jso").failureStatus == 404)
        #expect(parse("GET", "/a.json\u{301}").failureStatus == 404)
        #expect(parse("GET", ".json").failure == nil)
        #expect(parse("GET", "/a%zz.json").failureStatus == 400)
        #expect(parse("GET", "/a%FF.json").failureStatus == 400)
    }

    @Test("a target split once parses as the request does from its head")
    func sharedTarget() throws {
        for uri in ["/a/b.json?ns=x&print=silent&auth=owner", "/a.json?orderBy=%22%24key%22&limitToFirst=2", "/.json", "/a.json?print=loud"] {
            let head = HTTPHead(method: "GET", uri: uri, headers: [])
            let whole = RESTRequest.parse(head, body: [], defaultNamespace: "d")
            let split = RESTRequest.parse(head, target: try RESTRequest.target(of: uri), body: [], defaultNamespace: "d")
            switch (whole, split) {
            case let (.success(a), .success(b)):
                #expect(a.path == b.path && a.namespace == b.namespace && a.print == b.print && a.authorization == b.authorization && (a.query == nil) == (b.query == nil))
            case let (.failure(a), .failure(b)): #expect(a.status == b.status && a.message == b.message)
            default: Issue.record("\(uri): \(whole) against \(split)")
            }
        }
    }
}
