import BanyanBasics
import BanyanSession
import BanyanTree
import Testing

/// The v5 session rules (reference §2.1, §2.4, §2.6): one answer per request, in request order;
/// a listen's ok only after its data; bounds; bad input in the protocol's own shape.
@Suite struct SessionCoreTests {
    typealias Output = SessionCore.Output

    static func frame(_ text: String) -> [UInt8] { Array(text.utf8) }
    static func request(_ r: Int64, _ action: String, _ body: String) -> [UInt8] {
        frame(#"{"t":"d","d":{"r":\#(r),"a":"\#(action)","b":\#(body)}}"#)
    }
    static func sent(_ outputs: [Output]) -> [String] {
        outputs.compactMap { if case .send(let m) = $0 { return String(decoding: m, as: UTF8.self) } else { return nil } }
    }
    static func answered(_ outputs: [Output]) -> [Int64] {
        sent(outputs).compactMap { text in
            guard case .int(let r)? = (try? JSONValue(parsing: text))?["d"]?["r"] else { return nil }
            return r
        }
    }
    static func listenID(_ outputs: [Output]) -> SessionCore.ListenID? {
        for o in outputs { if case .listen(let id, _) = o { return id } }
        return nil
    }

    @Test("the hello; pings answered with pongs; keep-alives and upgrade codes ignored")
    func helloAndPing() {
        var s = SessionCore(timestamp: 1_764_200_000_000, host: "db:9000", sessionID: "abc")
        #expect(String(decoding: s.hello, as: UTF8.self) == #"{"t":"c","d":{"t":"h","d":{"ts":1764200000000,"v":"5","h":"db:9000","s":"abc","bw":1}}}"#)
        #expect(Self.sent(s.receive(frame: Self.frame(#"{"t":"c","d":{"t":"p","d":{}}}"#))) == [#"{"t":"c","d":{"t":"o","d":null}}"#])
        #expect(s.receive(frame: Self.frame("0")).isEmpty)
        #expect(s.receive(frame: Self.frame(#"{"t":"c","d":{"t":"n","d":{}}}"#)).isEmpty)
    }

    @Test("a transaction's listen, put and stats: the put's answer waits for the listen's ok, which waits for its data")
    func orderedAnswers() throws {
        var s = SessionCore(timestamp: 1, host: "h", sessionID: "s")
        let listen = s.receive(frame: Self.request(1, "q", #"{"p":"/counter","h":""}"#))
        let id = try #require(Self.listenID(listen))
        #expect(Self.sent(listen).isEmpty)
        let put = s.receive(frame: Self.request(2, "p", #"{"p":"/counter","d":5,"h":"abc"}"#))
        guard case .write(2, .put(let path, let data, hash: "abc"), nil)? = put.first else {
            Issue.record("\(put)")
            return
        }
        #expect(path.path == (try Path(parsing: "counter")) && data.text == "5" && Self.sent(put).isEmpty)
        let stats = s.receive(frame: Self.request(3, "s", #"{"c":{"sdk.js.11":1}}"#))
        #expect(stats.first == .stats([("sdk.js.11", 1)]) && Self.sent(stats).isEmpty)
        // The write is decided before the listen's data went out: still nothing.
        #expect(s.answer(request: 2, status: "datastale", data: Array(#""stale""#.utf8)).isEmpty)
        #expect(s.unansweredCount == 3)
        // The data is pushed (by the node), then the listen starts: all three answers, in order.
        let released = s.listenStarted(id)
        #expect(Self.answered(released) == [1, 2, 3])
        #expect(Self.sent(released) == [
            #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":{}}}}"#, #"{"t":"d","d":{"r":2,"b":{"s":"datastale","d":"stale"}}}"#,
            #"{"t":"d","d":{"r":3,"b":{"s":"ok","d":""}}}"#,
        ])
        #expect(s.unansweredCount == 0 && s.listenCount == 1)
        #expect(s.listenStarted(id).isEmpty && s.answer(request: 2, status: "ok", data: []).isEmpty, "answered once")
    }

    @Test("answers leave in request order whatever order the node decides them in (seeded interleavings)")
    func anyCompletionOrder() {
        var random = SeededRandom(seed: 77)
        for _ in 0..<200 {
            var s = SessionCore(timestamp: 1, host: "h", sessionID: "s")
            var open: [(Int64, SessionCore.ListenID?)] = []
            var answers: [Int64] = []
            let count = 1 + Int(random.next() % 40)
            for r in 1...Int64(count) {
                let out: [Output]
                switch random.next() % 3 {
                case 0: out = s.receive(frame: Self.request(r, "q", #"{"p":"/l\#(r)","h":""}"#))
                case 1: out = s.receive(frame: Self.request(r, "m", #"{"p":"/","d":{"a":\#(r)}}"#))
                default: out = s.receive(frame: Self.request(r, "g", #"{"p":"/x","q":{}}"#))
                }
                answers += Self.answered(out)
                open.append((r, Self.listenID(out)))
            }
            while !open.isEmpty {
                let (r, listen) = open.remove(at: Int(random.next() % UInt64(open.count)))
                if let listen { answers += Self.answered(s.listenStarted(listen)) } else { answers += Self.answered(s.answer(request: r, status: "ok", data: Array("null".utf8))) }
            }
            #expect(answers == Array(1...Int64(count)))
        }
    }

    @Test("listen bookkeeping: unlisten of an unknown query is ok; a repeated listen replaces the first; unlisten before the start fails the listen; a refused listen is gone")
    func listens() throws {
        var s = SessionCore(timestamp: 1, host: "h", sessionID: "s")
        #expect(Self.sent(s.receive(frame: Self.request(1, "n", #"{"p":"/nothing"}"#))) == [#"{"t":"d","d":{"r":1,"b":{"s":"ok","d":""}}}"#])
        let first = try #require(Self.listenID(s.receive(frame: Self.request(2, "q", #"{"p":"/a","q":{"l":1,"vf":"l"},"t":1,"h":""}"#))))
        let again = s.receive(frame: Self.request(3, "q", #"{"p":"/a","q":{"l":1,"vf":"l"},"t":1,"h":""}"#))
        let second = try #require(Self.listenID(again))
        #expect(again.contains(.unlisten(first)) && second != first && s.listenCount == 1)
        #expect(Self.sent(again).first?.contains(#""r":2,"b":{"s":"failure""#) == true)
        let stop = s.receive(frame: Self.request(4, "n", #"{"p":"/a","q":{"l":1,"vf":"l"},"t":1}"#))
        #expect(stop.contains(.unlisten(second)) && Self.answered(stop) == [3, 4] && s.listenCount == 0)
        let third = try #require(Self.listenID(s.receive(frame: Self.request(5, "q", #"{"p":"/b","h":""}"#))))
        let refused = s.listenFailed(third, status: "permission_denied", reason: "Permission denied")
        #expect(Self.sent(refused) == [#"{"t":"d","d":{"r":5,"b":{"s":"permission_denied","d":"Permission denied"}}}"#] && s.listenCount == 0)
    }

    @Test("writes, gets and credentials go to the node in arrival order; unauth and App Check are answered at once")
    func dispatch() {
        var s = SessionCore(timestamp: 1, host: "h", sessionID: "s")
        var actions: [Output] = []
        for (r, action, body) in [
            (1, "o", #"{"p":"/p","d":null}"#), (2, "om", #"{"p":"/p","d":{"x":1}}"#), (3, "oc", #"{"p":"/p","d":null}"#),
            (4, "gauth", #"{"cred":"owner"}"#), (5, "g", #"{"p":"/x","q":{}}"#), (6, "unauth", "{}"), (7, "appcheck", #"{"token":"t"}"#),
        ] as [(Int64, String, String)] {
            actions += s.receive(frame: Self.request(r, action, body))
        }
        let kinds = actions.map { o -> String in
            switch o {
            case .write(let r, .onDisconnectPut, _): return "o\(r)"
            case .write(let r, .onDisconnectMerge, _): return "om\(r)"
            case .write(let r, .onDisconnectCancel, _): return "oc\(r)"
            case .authenticate(let r, _, google: true): return "gauth\(r)"
            case .get(let r, _, _): return "g\(r)"
            case .unauthenticate: return "unauth"
            case .send: return "send"
            default: return "other"
            }
        }
        #expect(kinds == ["o1", "om2", "oc3", "gauth4", "g5", "unauth"], "answers wait behind the first five")
        var sent: [String] = []
        for r in 1...5 { sent += Self.sent(s.answer(request: Int64(r), status: "ok", data: Array(#""""#.utf8))) }
        #expect(sent.count == 7 && sent[5] == #"{"t":"d","d":{"r":6,"b":{"s":"ok","d":"unauthenticated"}}}"#)
    }

    @Test("bad input: answered under its request number when it has one; otherwise an error and a close; nothing after a close")
    func badInput() {
        var s = SessionCore(timestamp: 1, host: "h", sessionID: "s")
        #expect(Self.sent(s.receive(frame: Self.request(1, "zz", "{}"))) == [#"{"t":"d","d":{"r":1,"b":{"s":"failure","d":"Unknown action \"zz\""}}}"#])
        #expect(Self.sent(s.receive(frame: Self.frame(#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/a","d":1}}"#))).first?.hasPrefix(#"{"t":"d","d":{"r":2,"b":{"s":"failure""#) == true)
        let garbage = s.receive(frame: Self.frame("not json"))
        #expect(Self.sent(garbage).first?.hasPrefix(#"{"t":"c","d":{"t":"e","d":"#) == true)
        #expect(garbage.last.map { if case .close = $0 { return true } else { return false } } == true && s.isClosed)
        #expect(s.receive(frame: Self.request(3, "s", "{}")).isEmpty)
    }

    @Test("limits: listens per connection, unanswered requests, a request number reused while unanswered, a message over the size limit")
    func limits() throws {
        var s = SessionCore(timestamp: 1, host: "h", sessionID: "s", limits: SessionCore.Limits(maxListens: 2, maxPendingRequests: 4))
        _ = s.receive(frame: Self.request(1, "q", #"{"p":"/a","h":""}"#))
        _ = s.receive(frame: Self.request(2, "q", #"{"p":"/b","h":""}"#))
        let third = s.receive(frame: Self.request(3, "q", #"{"p":"/c","h":""}"#))
        #expect(Self.listenID(third) == nil && s.listenCount == 2)
        #expect(Self.sent(s.answer(request: 3, status: "ok", data: [])).isEmpty, "already answered (failure), held behind 1 and 2")
        _ = s.receive(frame: Self.request(4, "g", #"{"p":"/x"}"#))
        let flood = s.receive(frame: Self.request(5, "g", #"{"p":"/y"}"#))
        #expect(flood.contains(.close(reason: "more than 4 requests unanswered")) && s.isClosed)
        #expect(flood.filter { if case .unlisten = $0 { return true } else { return false } }.count == 2)

        var t = SessionCore(timestamp: 1, host: "h", sessionID: "s")
        _ = t.receive(frame: Self.request(7, "g", #"{"p":"/x"}"#))
        #expect(t.receive(frame: Self.request(7, "g", #"{"p":"/x"}"#)).contains(.close(reason: "request number 7 reused while unanswered")))

        let small = FrameAssembler.Limits(maxFrameBytes: 1 << 20, maxMessageBytes: 100, maxFramesPerMessage: 10)
        var u = SessionCore(timestamp: 1, host: "h", sessionID: "s", limits: SessionCore.Limits(frames: small))
        let big = Self.request(9, "p", #"{"p":"/a","d":""# + String(repeating: "x", count: 300) + #""}"#)
        var out: [Output] = []
        for frame in FrameSplitter.frames(big, chunkUnits: 64) { out += u.receive(frame: frame) }
        #expect(Self.sent(out).count == 1 && Self.sent(out).first?.hasPrefix(#"{"t":"d","d":{"r":9,"b":{"s":"too_big""#) == true && !u.isClosed)
    }

    @Test("the end of the connection stops every listen, once")
    func ending() throws {
        var s = SessionCore(timestamp: 1, host: "h", sessionID: "s")
        let a = try #require(Self.listenID(s.receive(frame: Self.request(1, "q", #"{"p":"/a","h":""}"#))))
        let b = try #require(Self.listenID(s.receive(frame: Self.request(2, "q", #"{"p":"/b","h":""}"#))))
        #expect(s.ended() == [.unlisten(a), .unlisten(b)])
        #expect(s.ended().isEmpty && s.listenStarted(a).isEmpty)
    }

    @Test("a client with too many requests unanswered is paused, not disconnected, and resumed when half are answered; bad messages count too")
    func backPressure() {
        var s = SessionCore(timestamp: 1, host: "h", sessionID: "s", limits: SessionCore.Limits(readPauseRequests: 4, maxPendingRequests: 6))
        var out: [Output] = []
        for r in 1...3 { out += s.receive(frame: Self.request(Int64(r), "p", #"{"p":"/a","d":\#(r)}"#)) }
        #expect(!out.contains(.pauseReading))
        #expect(s.receive(frame: Self.request(4, "p", #"{"p":"/a","d":4}"#)).contains(.pauseReading))
        #expect(!s.answer(request: 1, status: "ok", data: Array(#""""#.utf8)).contains(.resumeReading))
        let resumed = s.answer(request: 2, status: "ok", data: Array(#""""#.utf8))
        #expect(resumed.contains(.resumeReading) && Self.answered(resumed) == [2])
        // Requests that cannot be read still take a place in the queue, and the ceiling holds for them.
        var t = SessionCore(timestamp: 1, host: "h", sessionID: "s", limits: SessionCore.Limits(readPauseRequests: 100, maxPendingRequests: 3))
        _ = t.receive(frame: Self.request(1, "q", #"{"p":"/a","h":""}"#))
        _ = t.receive(frame: Self.frame(#"{"t":"d","d":{"r":2,"a":"#))
        _ = t.receive(frame: Self.frame(#"{"t":"d","d":{"r":3,"a":"#))
        #expect(t.receive(frame: Self.frame(#"{"t":"d","d":{"r":4,"a":"#)).contains(.close(reason: "more than 3 requests unanswered")))
    }

    @Test("each request is answered once: a second answer, or an answer to a listen's request, is ignored")
    func answeredOnce() throws {
        var s = SessionCore(timestamp: 1, host: "h", sessionID: "s")
        let id = try #require(Self.listenID(s.receive(frame: Self.request(1, "q", #"{"p":"/a","h":""}"#))))
        _ = s.receive(frame: Self.request(2, "p", #"{"p":"/a","d":1}"#))
        #expect(s.answer(request: 1, status: "ok", data: Array("null".utf8)).isEmpty)
        #expect(s.answer(request: 2, status: "ok", data: Array(#""""#.utf8)).isEmpty)
        #expect(s.answer(request: 2, status: "datastale", data: Array(#""x""#.utf8)).isEmpty)
        #expect(Self.sent(s.listenStarted(id)) == [#"{"t":"d","d":{"r":1,"b":{"s":"ok","d":{}}}}"#, #"{"t":"d","d":{"r":2,"b":{"s":"ok","d":""}}}"#])
    }

    @Test("queries match by content, not member order; a revoked listen is pushed as c and forgotten")
    func queryIdentityAndRevocation() throws {
        var s = SessionCore(timestamp: 1, host: "h", sessionID: "s")
        let id = try #require(Self.listenID(s.receive(frame: Self.request(1, "q", #"{"p":"/a","q":{"l":1,"vf":"l","i":"n"},"t":1,"h":""}"#))))
        let stop = s.receive(frame: Self.request(2, "n", #"{"p":"/a","q":{"i":"n","vf":"l","l":1},"t":1}"#))
        #expect(stop.contains(.unlisten(id)) && s.listenCount == 0)
        let other = try #require(Self.listenID(s.receive(frame: Self.request(3, "q", #"{"p":"/b","q":{"l":2,"vf":"r"},"t":2,"h":""}"#))))
        #expect(s.listenRevoked(other).isEmpty, "not started yet: listenFailed answers it")
        _ = s.listenStarted(other)
        let revoked = s.listenRevoked(other)
        #expect(revoked.first == .unlisten(other) && Self.sent(revoked) == [#"{"t":"d","d":{"a":"c","b":{"p":"b","q":[{"l":2,"vf":"r"}]}}}"#])
        #expect(s.listenCount == 0 && s.listenRevoked(other).isEmpty)
    }
}


/// Keep-alive: pings after 45 s of silence, the end only when even pongs stop for 60 s.
@Suite struct SessionKeepAliveTests {
    static func session() -> SessionCore { SessionCore(timestamp: 1_700_000_000_000, host: "h", sessionID: "1-2-3") }

    @Test("a silent client is pinged every 15 s from 45 s on; its pong resets the clock; without any answer the connection ends 60 s after the first ping")
    func keepAlive() {
        var s = Self.session()
        s.heard(at: 0)
        #expect(s.tick(now: 44_999).isEmpty)
        #expect(s.tick(now: 45_000) == [.ping])
        #expect(s.tick(now: 50_000).isEmpty)
        #expect(s.tick(now: 60_000) == [.ping])
        // A pong: silence starts again from here.
        s.heard(at: 61_000)
        #expect(s.tick(now: 100_000).isEmpty)
        #expect(s.tick(now: 106_000) == [.ping])
        #expect(s.tick(now: 121_000) == [.ping])
        #expect(s.tick(now: 136_000) == [.ping])
        #expect(s.tick(now: 151_000) == [.ping])
        let end = s.tick(now: 166_000)
        #expect(end.contains { if case .close(let reason) = $0 { reason.contains("keep-alive") } else { false } })
        #expect(s.isClosed && s.tick(now: 200_000).isEmpty)
    }

    @Test("while reading is paused (too many unanswered requests) silence proves nothing: no ping, no close")
    func pausedReading() {
        var s = SessionCore(timestamp: 0, host: "h", sessionID: "1-2-3", limits: SessionCore.Limits(readPauseRequests: 2))
        s.heard(at: 0)
        _ = s.receive(frame: Array(#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/a","d":1}}}"#.utf8))
        let paused = s.receive(frame: Array(#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/b","d":2}}}"#.utf8))
        #expect(paused.contains(.pauseReading))
        for t in stride(from: Int64(10_000), through: 300_000, by: 10_000) { #expect(s.tick(now: t).isEmpty) }
        #expect(!s.isClosed)
    }

    @Test("a client that keeps sending is never pinged; the clock starts at the first tick when nothing was heard yet")
    func busyClient() {
        var s = Self.session()
        #expect(s.tick(now: 1_000).isEmpty)
        #expect(s.tick(now: 45_999).isEmpty)
        #expect(s.tick(now: 46_000) == [.ping])
        var busy = Self.session()
        for t in stride(from: Int64(0), through: 600_000, by: 10_000) {
            busy.heard(at: t)
            #expect(busy.tick(now: t + 5_000).isEmpty)
        }
    }
}
