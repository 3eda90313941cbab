import BanyanBasics
import BanyanSession
import BanyanTree
import Testing

/// Reading client messages of the protocol v5 (reference §1.4, §2.1–§2.10) and rendering the
/// server's.
@Suite struct MessageReaderTests {
    static func read(_ text: String) throws(MessageError) -> ClientMessage { try MessageReader.read(Array(text.utf8)) }

    static func action(_ text: String) throws -> Action {
        guard case .request(let request) = try read(text) else {
            Issue.record("not a request: \(text)")
            return .unauth
        }
        return request.action
    }

    static func path(_ text: String) throws -> Path { try Path(parsing: text) }

    @Test("client write numbers (bn, ba) on p and m: read together; missing one, zero, negative, fractional, not a number, or ba above bn is an error naming the request")
    func clientWriteNumbers() throws {
        guard case .request(let r) = try Self.read(#"{"t":"d","d":{"r":4,"a":"p","b":{"p":"/x","d":1,"bn":7,"ba":3}}}"#) else {
            Issue.record("not a request")
            return
        }
        #expect(r.clientWrite == ClientWriteNumber(number: 7, acknowledgedBelow: 3))
        for bad in [#""bn":7"#, #""ba":3"#, #""bn":0,"ba":0"#, #""bn":-1,"ba":1"#, #""bn":2.5,"ba":1"#, #""bn":"7","ba":1"#, #""bn":3,"ba":4"#] {
            for action in ["p", "m"] {
                let data = action == "p" ? "1" : #"{"a":1}"#
                do {
                    _ = try Self.read(#"{"t":"d","d":{"r":9,"a":"\#(action)","b":{"p":"/x","d":\#(data),\#(bad)}}}"#)
                    Issue.record("accepted \(action) with \(bad)")
                } catch {
                    #expect(error.request == 9 && error.message.contains("bn"), "\(bad): \(error.message)")
                }
            }
        }
    }

    @Test("control messages: ping, the upgrade codes and unknown codes")
    func control() throws {
        #expect(try Self.read(#"{"t":"c","d":{"t":"p","d":{}}}"#) == .ping)
        #expect(try Self.read(#"{"t":"c","d":{"t":"n","d":{}}}"#) == .control("n"))
        #expect(try Self.read(#" {"d":{"d":{},"t":"a"},"t":"c"} "#) == .control("a"))
    }

    @Test("listens and unlistens as each SDK sends them: default, tagged with a query, legacy codes, a double tag")
    func listens() throws {
        #expect(try Self.action(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/","h":""}}}"#) == .listen(ListenSpec(path: .root, hash: "")))
        let query: JSONValue = .object([("i", .string("score")), ("l", .int(3)), ("vf", .string("r"))])
        #expect(
            try Self.action(#"{"t":"d","d":{"r":2,"a":"q","b":{"p":"/scores/all","q":{"i":"score","l":3,"vf":"r"},"t":1,"h":"abc="}}}"#)
                == .listen(ListenSpec(path: try Self.path("scores/all"), query: query, tag: 1, hash: "abc=")))
        // Android: no leading slash, the tag as a double, the legacy code.
        #expect(
            try Self.action(#"{"t":"d","d":{"r":0,"a":"l","b":{"p":"scores//all/","q":{"i":"score","l":3,"vf":"r"},"t":1.0}}}"#)
                == .listen(ListenSpec(path: try Self.path("scores/all"), query: query, tag: 1)))
        // An empty query object is a default listen.
        #expect(try Self.action(#"{"t":"d","d":{"r":3,"a":"n","b":{"p":"/a","q":{}}}}"#) == .unlisten(ListenSpec(path: try Self.path("a"))))
        #expect(try Self.action(#"{"t":"d","d":{"r":4,"a":"u","b":{"p":"/a","q":{"l":1,"vf":"l"},"t":7}}}"#)
            == .unlisten(ListenSpec(path: try Self.path("a"), query: .object([("l", .int(1)), ("vf", .string("l"))]), tag: 7)))
    }

    @Test("writes keep their data raw, wherever the members stand; a put may end in .priority and carry a hash")
    func writes() throws {
        let message = #"{"t":"d","d":{"b":{"d":{"x":"}]\"{","y":[1,{"z":null}]},"h":"H/x=","p":"/a/b"},"a":"p","r":12}}"#
        guard case .request(let request) = try Self.read(message), case .put(let path, let data, let hash) = request.action else {
            Issue.record("not a put")
            return
        }
        let ab = try Self.path("a/b")
        #expect(request.number == 12 && path == WritePath(path: ab) && hash == "H/x=")
        #expect(data.text == #"{"x":"}]\"{","y":[1,{"z":null}]}"#)
        // The raw bytes are what the tree reader takes.
        let tree = try TreeReader.read(Array(data.bytes))
        #expect(JSONWriter.string(tree) == #"{"x":"}]\"{","y":[1]}"#)
        // Data is only delimited here, but its brackets must match; the rest (keys, values)
        // is the tree reader's to check where the write is validated.
        #expect(throws: MessageError(request: 41, "Invalid message: Unexpected ']', expecting a JSON value")) {
            try Self.read(#"{"t":"d","d":{"r":41,"a":"p","b":{"p":"/a","d":{"x":1]}}}"#)
        }
        guard case .put(_, let broken, nil) = try Self.action(#"{"t":"d","d":{"r":42,"a":"p","b":{"p":"/a","d":{"x.y":1}}}}"#) else {
            Issue.record("not a put")
            return
        }
        #expect(throws: TreeError.self) { try TreeReader.read(Array(broken.bytes)) }

        guard case .put(let priority, let value, nil) = try Self.action(#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/a/.priority","d":5}}}"#) else {
            Issue.record("not a put")
            return
        }
        let a = try Self.path("a")
        #expect(priority.isPriority && priority.path == a && value.text == "5")
        guard case .merge(let mergePath, let merge) = try Self.action(#"{"t":"d","d":{"r":2,"a":"m","b":{"p":"/","d":{"a/b":1,"c":"x"}}}}"#) else {
            Issue.record("not a merge")
            return
        }
        #expect(mergePath == .root && merge.text == #"{"a/b":1,"c":"x"}"#)
        guard case .onDisconnectPut(let oPath, let o) = try Self.action(#"{"t":"d","d":{"r":3,"a":"o","b":{"p":"/presence/me","d":null}}}"#),
            case .onDisconnectMerge(_, let om) = try Self.action(#"{"t":"d","d":{"r":4,"a":"om","b":{"p":"/u","d":{"last":{".sv":"timestamp"}}}}}"#)
        else {
            Issue.record("not onDisconnect operations")
            return
        }
        let me = try Self.path("presence/me")
        #expect(oPath.path == me && o.text == "null" && om.text == #"{"last":{".sv":"timestamp"}}"#)
        #expect(try Self.action(#"{"t":"d","d":{"r":5,"a":"oc","b":{"p":"/u","d":null}}}"#) == .onDisconnectCancel(path: try Self.path("u")))
    }

    @Test("stats, gets, credentials and App Check")
    func others() throws {
        #expect(try Self.action(#"{"t":"d","d":{"r":1,"a":"s","b":{"c":{"sdk.js.11-0-0":1,"framework.x":"y"}}}}"#) == .stats([("sdk.js.11-0-0", 1)]))
        #expect(try Self.action(#"{"t":"d","d":{"r":2,"a":"g","b":{"p":"/a","q":{}}}}"#) == .get(path: try Self.path("a"), query: nil))
        #expect(try Self.action(#"{"t":"d","d":{"r":3,"a":"g","b":{"p":"/a","q":{"i":".key","sp":"m"}}}}"#)
            == .get(path: try Self.path("a"), query: .object([("i", .string(".key")), ("sp", .string("m"))])))
        #expect(try Self.action(#"{"t":"d","d":{"r":4,"a":"auth","b":{"cred":"eyJ.x.y"}}}"#) == .auth(Credential(token: "eyJ.x.y")))
        #expect(try Self.action(#"{"t":"d","d":{"r":5,"a":"gauth","b":{"cred":"owner","authvar":{"uid":"u1"}}}}"#)
            == .googleAuth(Credential(token: "owner", authVariable: .object([("uid", .string("u1"))]))))
        #expect(try Self.action(#"{"t":"d","d":{"r":6,"a":"gauth","b":{"cred":"owner","noauth":true}}}"#) == .googleAuth(Credential(token: "owner", noAuth: true)))
        #expect(try Self.action(#"{"t":"d","d":{"r":7,"a":"unauth","b":{}}}"#) == .unauth)
        #expect(try Self.action(#"{"t":"d","d":{"r":8,"a":"appcheck","b":{"token":"t"}}}"#) == .appCheck(token: "t"))
        #expect(try Self.action(#"{"t":"d","d":{"r":9,"a":"unappeck","b":{}}}"#) == .dropAppCheck)
    }

    /// Each bad input, with whether its request number can still be answered.
    @Test("bad messages: a typed error that names the request when there is one", arguments: [
        // Not JSON, but the number is in the prefix: answered.
        (#"{"t":"d","d":{"r":41,"a":"p","b":{"p":"/a","d":1}}"#, Int64?(41)),
        (#"{"t":"d","d":{"r":42,"a":"p","b":{"p":"/a","d":"#, 42),
        // Nothing to answer.
        ("garbage", nil),
        (#"{"t":"x","d":{}}"#, nil),
        (#"{"t":"d","d":{"a":"p","b":{}}}"#, nil),
        (#"{"t":"d","d":[1]}"#, nil),
        (#"{"t":"c","d":{}}"#, nil),
        (#"[1,2]"#, nil),
        // Well-formed, but the request is wrong: answered with failure.
        (#"{"t":"d","d":{"r":43,"a":"zz","b":{}}}"#, 43),
        (#"{"t":"d","d":{"r":44,"a":"p","b":{"p":"/a.b","d":1}}}"#, 44),
        (#"{"t":"d","d":{"r":45,"a":"p","b":{"p":"/a"}}}"#, 45),
        (#"{"t":"d","d":{"r":46,"a":"q","b":{"h":""}}}"#, 46),
        (#"{"t":"d","d":{"r":47,"a":"q","b":{"p":"/a","q":[1]}}}"#, 47),
        (#"{"t":"d","d":{"r":48,"a":"q","b":{"p":"/a","t":"x"}}}"#, 48),
        (#"{"t":"d","d":{"r":49,"a":"auth","b":{}}}"#, 49),
        (#"{"t":"d","d":{"r":50,"a":"p","b":"x"}}"#, 50),
        (#"{"t":"d","d":{"r":51,"a":"m","b":{"p":"/a","d":{"x":1},"d":2}}}"#, 51),
        (#"{"t":"d","d":{"r":52,"a":"q","b":{"p":"/a","q":{"x":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}}}}"#, 52),
    ] as [(String, Int64?)])
    func badMessages(_ text: String, _ request: Int64?) {
        do {
            let message = try Self.read(text)
            Issue.record("read \(message)")
        } catch {
            #expect(error.request == request, "\(error)")
            #expect(error.status == "failure" && !error.message.isEmpty)
        }
    }

    @Test("the request number of a message known by its first bytes")
    func prefixNumbers() {
        #expect(MessageReader.requestNumber(inPrefix: Array(#"{"t":"d","d":{"r":17,"a":"p","b":{"p":"/big","d":"xxxx"#.utf8)) == 17)
        #expect(MessageReader.requestNumber(inPrefix: Array(#"{"t":"d","d":{"r" : 3,"a""#.utf8)) == 3)
        // Cut inside the number: it may be longer than what is seen.
        #expect(MessageReader.requestNumber(inPrefix: Array(#"{"t":"d","d":{"r":17"#.utf8)) == nil)
        // Only the member of the request object counts, not an "r" in the data or a string "r".
        #expect(MessageReader.requestNumber(inPrefix: Array(#"{"t":"d","d":{"b":{"r":5,"x":"\"r\":9"},"a":"r","r":6,"#.utf8)) == 6)
        #expect(MessageReader.requestNumber(inPrefix: Array(#"{"t":"d","d":{"b":{"d":{"r":5,"#.utf8)) == nil)
        #expect(MessageReader.requestNumber(inPrefix: Array(#"{"t":"d","d":{"a":"p""#.utf8)) == nil)
        #expect(MessageReader.requestNumber(inPrefix: Array(#"{"t":"d","d":{"r":"#.utf8)) == nil)
        #expect(MessageReader.requestNumber(inPrefix: []) == nil)
    }

    @Test("a large write split into frames by the client is reassembled and read, its data intact")
    func throughFrames() throws {
        var random = SeededRandom(seed: 15)
        var value = "{"
        for i in 0..<2_000 {
            if i > 0 { value += "," }
            value += "\"k\(i)\":\"" + String(repeating: "é\u{1F600}x", count: Int(random.next() % 8)) + "\""
        }
        value += "}"
        let message = Array(#"{"t":"d","d":{"r":9,"a":"p","b":{"p":"/big","d":"#.utf8) + Array(value.utf8) + Array("}}}".utf8)
        var assembler = FrameAssembler()
        var received: [UInt8]?
        for frame in FrameSplitter.frames(message) {
            if case .message(let m) = try assembler.receive(frame) { received = m }
        }
        let whole = try #require(received)
        guard case .request(let request) = try MessageReader.read(whole), case .put(_, let data, nil) = request.action else {
            Issue.record("not a put")
            return
        }
        #expect(request.number == 9 && data.text == value)
    }
}

@Suite struct ServerMessageTests {
    static func text(_ bytes: [UInt8]) -> String { String(decoding: bytes, as: UTF8.self) }

    @Test("control messages, with the inner d always present")
    func control() {
        #expect(Self.text(ServerMessage.hello(timestamp: 1_764_200_000_000, host: "db.example:9000", session: "s1"))
            == #"{"t":"c","d":{"t":"h","d":{"ts":1764200000000,"v":"5","h":"db.example:9000","s":"s1","bw":1}}}"#)
        #expect(Self.text(ServerMessage.pong()) == #"{"t":"c","d":{"t":"o","d":null}}"#)
        #expect(Self.text(ServerMessage.reset(host: "n2:9000")) == #"{"t":"c","d":{"t":"r","d":"n2:9000"}}"#)
        #expect(Self.text(ServerMessage.shutdown(reason: "bye")) == #"{"t":"c","d":{"t":"s","d":"bye"}}"#)
        #expect(Self.text(ServerMessage.error("bad \"x\"")) == #"{"t":"c","d":{"t":"e","d":"bad \"x\""}}"#)
    }

    @Test("answers: ok with the empty string or data, failures with a reason")
    func answers() {
        #expect(Self.text(ServerMessage.ok(3)) == #"{"t":"d","d":{"r":3,"b":{"s":"ok","d":""}}}"#)
        #expect(Self.text(ServerMessage.ok(4, data: .object([]))) == #"{"t":"d","d":{"r":4,"b":{"s":"ok","d":{}}}}"#)
        #expect(Self.text(ServerMessage.response(5, status: "ok", data: Array(#"{"a":1}"#.utf8))) == #"{"t":"d","d":{"r":5,"b":{"s":"ok","d":{"a":1}}}}"#)
        #expect(Self.text(ServerMessage.failure(6, status: "datastale", reason: "Transaction hash does not match"))
            == #"{"t":"d","d":{"r":6,"b":{"s":"datastale","d":"Transaction hash does not match"}}}"#)
    }

    @Test("pushes: paths without a leading slash, tags last, merges by relative path, revocations")
    func pushes() throws {
        let a = try Path(parsing: "users/ada")
        #expect(Self.text(ServerMessage.data(path: a, data: Array(#"{"n":1}"#.utf8))) == #"{"t":"d","d":{"a":"d","b":{"p":"users/ada","d":{"n":1}}}}"#)
        #expect(Self.text(ServerMessage.data(path: .root, data: Array("null".utf8), tag: 2)) == #"{"t":"d","d":{"a":"d","b":{"p":"","d":null,"t":2}}}"#)
        let merge = ServerMessage.merge(path: a, children: [(try Path(parsing: "x/y"), Array("1".utf8)), (try Path(parsing: "z"), Array("null".utf8))], tag: 3)
        #expect(Self.text(merge) == #"{"t":"d","d":{"a":"m","b":{"p":"users/ada","d":{"x/y":1,"z":null},"t":3}}}"#)
        #expect(Self.text(ServerMessage.listenRevoked(path: a, query: nil)) == #"{"t":"d","d":{"a":"c","b":{"p":"users/ada"}}}"#)
        #expect(Self.text(ServerMessage.listenRevoked(path: a, query: .object([("l", .int(1))]))) == #"{"t":"d","d":{"a":"c","b":{"p":"users/ada","q":[{"l":1}]}}}"#)
        #expect(Self.text(ServerMessage.authRevoked(status: "expired_token", reason: "Auth token is expired."))
            == #"{"t":"d","d":{"a":"ac","b":{"s":"expired_token","d":"Auth token is expired."}}}"#)
        // Every rendering is one JSON message a client can read back.
        for message in [merge, ServerMessage.hello(timestamp: 1, host: "h", session: "s")] {
            #expect(throws: Never.self) { try JSONValue(parsing: message) }
        }
    }
}
