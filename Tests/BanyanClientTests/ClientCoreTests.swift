import BanyanClientCore
import BanyanTree
import Testing

/// The SDK's core against scripted server messages: latency compensation, reconciliation,
/// rollback on refusal, resending after a reconnect, and reading the protocol.
@Suite struct ClientCoreTests {
    static func hello() -> [UInt8] { Array(#"{"t":"c","d":{"t":"h","d":{"ts":1000,"v":"5","h":"n1","s":"S1"}}}"#.utf8) }
    static func ok(_ n: Int64) -> [UInt8] { Array(#"{"t":"d","d":{"r":\#(n),"b":{"s":"ok","d":""}}}"#.utf8) }
    static func data(_ path: String, _ json: String) -> [UInt8] { Array(#"{"t":"d","d":{"a":"d","b":{"p":"\#(path)","d":\#(json)}}}"#.utf8) }

    /// A core connected to node 0.
    static func online() -> ClientCore {
        var core = ClientCore(nodeCount: 1, seed: 1)
        core.tick(now: 0)
        #expect(core.takeActions() == [.connect(node: 0)])
        core.opened()
        core.received(hello())
        #expect(core.takeActions() == [.connected(true)])
        return core
    }

    static func sent(_ actions: [ClientCore.Action]) -> [String] {
        actions.compactMap { if case .send(let b) = $0 { return String(decoding: b, as: UTF8.self) } else { return nil } }
    }

    @Test func localWriteRaisesAtOnceAndServerAnswerReconciles() throws {
        var core = Self.online()
        core.observe(1, path: try Path(parsing: "/a"))
        #expect(Self.sent(core.takeActions()) == [#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/a","h":""}}}"#])
        core.received(Self.data("/a", #"{"x":1}"#))
        core.received(Self.ok(1))
        #expect(core.takeActions() == [.value(1, try Tree(json: #"{"x":1}"#))])
        // A local write: the event comes before any answer.
        try core.set(7, path: try Path(parsing: "/a/y"), json: Array("2".utf8))
        let actions = core.takeActions()
        #expect(Self.sent(actions) == [#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/a/y","d":2}}}"#])
        #expect(actions.contains(.value(1, try Tree(json: #"{"x":1,"y":2}"#))))
        // The echo, then the ok: no second event (nothing changed), one completion.
        core.received(Self.data("/a/y", "2"))
        core.received(Self.ok(2))
        #expect(core.takeActions() == [.completed(7, nil)])
    }

    @Test func refusedWriteRollsBack() throws {
        var core = Self.online()
        core.observe(1, path: try Path(parsing: "/a"))
        core.received(Self.data("/a", "5"))
        core.received(Self.ok(1))
        _ = core.takeActions()
        try core.set(9, path: try Path(parsing: "/a"), json: Array("6".utf8))
        #expect(core.takeActions().contains(.value(1, Tree(.int(6)))))
        core.received(Array(#"{"t":"d","d":{"r":2,"b":{"s":"permission_denied","d":"Permission denied"}}}"#.utf8))
        #expect(core.takeActions() == [.value(1, Tree(.int(5))), .completed(9, .init(code: "permission_denied", message: "Permission denied"))])
    }

    @Test func unansweredWritesAndListensAreSentAgainInOrderAfterAReconnect() throws {
        var core = Self.online()
        core.observe(1, path: try Path(parsing: "/l"))
        try core.set(1, path: try Path(parsing: "/w/1"), json: Array("1".utf8))
        try core.set(2, path: try Path(parsing: "/w/2"), json: Array("2".utf8))
        _ = core.takeActions()
        core.closed()
        #expect(core.takeActions() == [.connected(false)])
        // Offline: a third write waits.
        try core.set(3, path: try Path(parsing: "/w/3"), json: Array("3".utf8))
        #expect(Self.sent(core.takeActions()).isEmpty)
        // The back-off ends; a new connection; everything goes again, listens first, writes in order.
        core.tick(now: 60_000)
        #expect(core.takeActions() == [.connect(node: 0)])
        core.received(Self.hello())
        let again = Self.sent(core.takeActions())
        #expect(again.count == 4)
        #expect(again[0].contains(#""a":"q""#))
        #expect(again[1].contains(#""p":"/w/1""#) && again[2].contains(#""p":"/w/2""#) && again[3].contains(#""p":"/w/3""#))
    }

    @Test func readsServerMessagesAndSplitsLargeOnes() throws {
        #expect(try ServerMessageReader.read(Self.hello()) == .hello(timestamp: 1000, session: "S1"))
        #expect(try ServerMessageReader.read(Array(#"{"t":"c","d":{"t":"r","d":"n2:9000"}}"#.utf8)) == .reset(host: "n2:9000"))
        let merge = try ServerMessageReader.read(Array(#"{"t":"d","d":{"a":"m","b":{"p":"/a","d":{"b/c":1,"d":null}}}}"#.utf8))
        guard case .merge(let p, let children) = merge else {
            Issue.record("not a merge: \(merge)")
            return
        }
        #expect(p == (try Path(parsing: "/a")) && children.count == 2)
        #expect(throws: WireError.self) { _ = try ServerMessageReader.read(Array("nonsense".utf8)) }
        let big = Array(("{\"t\":\"d\",\"d\":{\"a\":\"d\",\"b\":{\"p\":\"/x\",\"d\":\"" + String(repeating: "é", count: 20_000) + "\"}}}").utf8)
        let frames = ClientFrameJoiner.frames(big)
        #expect(frames.count > 2 && frames[0] == Array(String(frames.count - 1).utf8))
        var joiner = ClientFrameJoiner()
        var whole: [UInt8]?
        for f in frames { whole = try joiner.add(f) ?? whole }
        #expect(whole == big)
        for f in frames.dropFirst() { #expect(String(validating: f, as: UTF8.self) != nil) }
    }
}
