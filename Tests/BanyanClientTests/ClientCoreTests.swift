import BanyanClientCore
import BanyanQuery
import BanyanTree
import Testing

/// The SDK's core against scripted server messages: latency compensation, reconciliation,
/// rollback on refusal, resending after a reconnect, child events and queries, transactions,
/// onDisconnect, `.info`, and reading the protocol.
@Suite struct ClientCoreTests {
    static func hello(_ session: String = "S1") -> [UInt8] { Array(#"{"t":"c","d":{"t":"h","d":{"ts":1000,"v":"5","h":"n1","s":"\#(session)"}}}"#.utf8) }
    static func ok(_ n: Int64, _ d: String = #""""#) -> [UInt8] { Array(#"{"t":"d","d":{"r":\#(n),"b":{"s":"ok","d":\#(d)}}}"#.utf8) }
    static func status(_ n: Int64, _ s: String, _ text: String = "") -> [UInt8] { Array(#"{"t":"d","d":{"r":\#(n),"b":{"s":"\#(s)","d":"\#(text)"}}}"#.utf8) }
    static func data(_ path: String, _ json: String, tag: Int? = nil) -> [UInt8] {
        Array(#"{"t":"d","d":{"a":"d","b":{"p":"\#(path)","d":\#(json)\#(tag.map { #","t":\#($0)"# } ?? "")}}}"#.utf8)
    }
    static func merge(_ path: String, _ json: String, tag: Int? = nil) -> [UInt8] {
        Array(#"{"t":"d","d":{"a":"m","b":{"p":"\#(path)","d":\#(json)\#(tag.map { #","t":\#($0)"# } ?? "")}}}"#.utf8)
    }
    static func path(_ s: String) -> Path {
        // `.info` is not a valid key: the client's own locations are built from raw segments.
        if s.hasPrefix("/.info") { return Path(segments: s.split(separator: "/").map { ChildKey(unchecked: String($0)) }) }
        return (try? Path(parsing: s)) ?? .root
    }
    static func tree(_ json: String) -> Tree { (try? Tree(json: json)) ?? .empty }
    static func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

    /// A core connected to node 0 (its stats request, number 1, is answered).
    static func online() -> ClientCore {
        var core = ClientCore(nodeCount: 1, seed: 1)
        core.tick(now: 0)
        #expect(core.takeActions() == [.connect(node: 0)])
        core.opened()
        core.received(hello())
        let first = core.takeActions()
        #expect(first.first == .connected(true))
        #expect(sent(first) == [#"{"t":"d","d":{"r":1,"a":"s","b":{"c":{"sdk.swift.banyan":1}}}}"#])
        core.received(ok(1))
        return core
    }

    static func sent(_ actions: [ClientCore.Action]) -> [String] {
        actions.compactMap { if case .send(let b) = $0 { return String(decoding: b, as: UTF8.self) } else { return nil } }
    }

    /// Events as short strings: "<observer> <kind> <key> <json> prev=<key>".
    static func events(_ actions: [ClientCore.Action]) -> [String] {
        actions.compactMap {
            guard case let .event(id, e) = $0 else { return nil }
            return "\(id) \(e)"
        }
    }

    @Test func localWriteRaisesAtOnceAndServerAnswerReconciles() {
        var core = Self.online()
        core.observe(1, path: Self.path("/a"), type: .value)
        #expect(Self.sent(core.takeActions()) == [#"{"t":"d","d":{"r":2,"a":"q","b":{"p":"/a","h":""}}}"#])
        // The location's whole data makes the view complete (its ok adds nothing).
        core.received(Self.data("/a", #"{"x":1}"#))
        #expect(core.takeActions() == [.event(1, ViewEvent(.value, key: nil, tree: Self.tree(#"{"x":1}"#)))])
        core.received(Self.ok(2, "{}"))
        #expect(core.takeActions().isEmpty)
        // A local write: the event comes before any answer.
        #expect(throws: Never.self) { try core.set(7, path: Self.path("/a/y"), json: Self.bytes("2")) }
        let actions = core.takeActions()
        #expect(Self.sent(actions) == [#"{"t":"d","d":{"r":3,"a":"p","b":{"p":"/a/y","d":2}}}"#])
        #expect(Self.events(actions) == [#"1 value {"x":1,"y":2}"#])
        // The echo, then the ok: no second event (nothing changed), one completion.
        core.received(Self.data("/a/y", "2"))
        core.received(Self.ok(3))
        #expect(core.takeActions() == [.completed(7, nil)])
    }

    @Test("purgeOutstandingWrites: a write sent and unanswered rolls back with its events, leaves the disk cache durably and completes once with write_canceled; its late answer is ignored; an onDisconnect call already sent waits for its answer; the next write settles the purged numbers")
    func purgeOutstandingWrites() {
        var core = ClientCore(nodeCount: 1, seed: 1, persistence: true)
        core.tick(now: 0)
        _ = core.takeActions()
        core.opened()
        // A server that takes the client's write numbers (exactly once).
        core.received(Array(#"{"t":"c","d":{"t":"h","d":{"ts":1000,"v":"5","h":"n1","s":"S1","bw":1}}}"#.utf8))
        _ = core.takeActions()
        core.received(Self.ok(1))
        core.observe(1, path: Self.path("/a"), type: .value)
        core.received(Self.data("/a", "5"))
        core.received(Self.ok(2, "{}"))
        _ = core.takeActions()
        #expect(throws: Never.self) { try core.set(9, path: Self.path("/a"), json: Self.bytes("6")) }
        // An onDisconnect call sent before the purge: the server registered it.
        #expect(throws: Never.self) { try core.onDisconnectSet(8, path: Self.path("/p"), json: Self.bytes(#""gone""#)) }
        let sentFirst = Self.sent(core.takeActions())
        #expect(sentFirst.count == 2 && sentFirst[0].contains(#""a":"p""#) && sentFirst[1].contains(#""a":"o""#), "\(sentFirst)")
        #expect(core.pendingWriteCount == 1)
        core.purgeOutstandingWrites()
        let purged = core.takeActions()
        #expect(Self.events(purged) == ["1 value 5"], "\(purged)")
        #expect(purged.contains(.completed(9, ClientCore.WriteError(code: "write_canceled", message: "The write was canceled by the user."))))
        #expect(!purged.contains { if case .completed(8, _) = $0 { true } else { false } }, "a sent onDisconnect call waits for its answer")
        // Removed from the disk cache durably (a purged write must not come back after a power loss).
        #expect(purged.contains { if case .persist(let records, true) = $0 { records.contains { if case .writeDone = $0 { true } else { false } } } else { false } }, "\(purged)")
        #expect(Self.sent(purged).isEmpty)
        #expect(core.pendingWriteCount == 0)
        // The late answer of the purged write changes nothing and completes nothing; the
        // onDisconnect call's answer completes it.
        core.received(Self.ok(3))
        core.received(Self.ok(4))
        #expect(core.takeActions() == [.completed(8, nil)])
        // The next write names the purged number as settled (acknowledged below its own).
        #expect(throws: Never.self) { try core.set(10, path: Self.path("/b"), json: Self.bytes("1")) }
        let next = Self.sent(core.takeActions())
        #expect(next.count == 1, "\(next)")
        // Write 1 went out acknowledging nothing below it; write 2 settles everything below 2.
        #expect(sentFirst.first?.contains(#""bn":1,"ba":1"#) == true, "\(sentFirst)")
        #expect(next.first?.contains(#""bn":2,"ba":2"#) == true, "\(next)")
    }

    @Test("after goOffline, while the connection closes, a write and an onDisconnect call are held, not sent; the next connection sends both")
    func nothingSentWhileClosingForOffline() throws {
        var core = Self.online()
        core.goOffline()
        #expect(core.takeActions().contains(.disconnect))
        try core.set(5, path: Self.path("/a"), json: Self.bytes("1"))
        try core.onDisconnectSet(6, path: Self.path("/p"), json: Self.bytes(#""gone""#))
        #expect(Self.sent(core.takeActions()).isEmpty)
        core.closed()
        _ = core.takeActions()
        core.goOnline()
        core.tick(now: 1)
        #expect(core.takeActions().contains(.connect(node: 0)))
        core.opened()
        core.received(Self.hello("S2"))
        let sent = Self.sent(core.takeActions())
        #expect(sent.contains { $0.contains(#""a":"p""#) && $0.contains(#""p":"/a""#) }, "\(sent)")
        #expect(sent.contains { $0.contains(#""a":"o""#) && $0.contains(#""p":"/p""#) }, "\(sent)")
    }

    @Test func refusedWriteRollsBack() {
        var core = Self.online()
        core.observe(1, path: Self.path("/a"), type: .value)
        core.received(Self.data("/a", "5"))
        core.received(Self.ok(2, "{}"))
        _ = core.takeActions()
        #expect(throws: Never.self) { try core.set(9, path: Self.path("/a"), json: Self.bytes("6")) }
        #expect(Self.events(core.takeActions()) == ["1 value 6"])
        core.received(Self.status(3, "permission_denied", "Permission denied"))
        let actions = core.takeActions()
        #expect(Self.events(actions) == ["1 value 5"])
        #expect(actions.last == .completed(9, .init(code: "permission_denied", message: "Permission denied")))
    }

    @Test func unansweredWritesAndListensAreSentAgainInOrderAfterAReconnect() {
        var core = Self.online()
        core.observe(1, path: Self.path("/l"), type: .value)
        #expect(throws: Never.self) {
            try core.set(1, path: Self.path("/w/1"), json: Self.bytes("1"))
            try core.set(2, path: Self.path("/w/2"), json: Self.bytes("2"))
        }
        _ = core.takeActions()
        core.closed()
        #expect(core.takeActions() == [.connected(false)])
        // Offline: a third write waits.
        #expect(throws: Never.self) { try core.set(3, path: Self.path("/w/3"), json: Self.bytes("3")) }
        #expect(Self.sent(core.takeActions()).isEmpty)
        // The back-off ends; a new connection; everything goes again: stats, listens, then the
        // writes in order.
        core.tick(now: 60_000)
        #expect(core.takeActions() == [.connect(node: 0)])
        core.received(Self.hello())
        let again = Self.sent(core.takeActions())
        #expect(again.count == 5)
        #expect(again[0].contains(#""a":"s""#) && again[1].contains(#""a":"q""#))
        #expect(again[2].contains(#""p":"/w/1""#) && again[3].contains(#""p":"/w/2""#) && again[4].contains(#""p":"/w/3""#))
    }

    @Test("the first connection goes to the first node (the URL's) whatever the seed; a failure moves to the next; goOffline while connecting drops the attempt, and goOnline resumes at that node")
    func nodeOrderAndOfflineDuringAnAttempt() throws {
        for seed: UInt64 in [1, 2, 3, 4, 5, 6, 7, 8] {
            var core = ClientCore(nodeCount: 3, seed: seed)
            core.tick(now: 0)
            #expect(core.takeActions() == [.connect(node: 0)], "seed \(seed)")
        }
        var core = ClientCore(nodeCount: 3, seed: 1)
        core.tick(now: 0)
        _ = core.takeActions()
        core.received(Self.hello())
        _ = core.takeActions()
        #expect(core.onlineNode == 0)
        // Node 0 dies: the next attempt goes to node 1 once the back-off ends.
        core.closed()
        _ = core.takeActions()
        #expect(core.onlineNode == nil)
        core.tick(now: 60_000)
        #expect(core.takeActions() == [.connect(node: 1)])
        // goOffline while that attempt is under way: it is dropped at once, and its hello, if it
        // still comes, does not bring the client online (a write made offline stays queued).
        core.goOffline()
        #expect(core.takeActions() == [.disconnect])
        try core.set(1, path: Self.path("/w"), json: Self.bytes("1"))
        core.received(Self.hello("late"))
        let late = core.takeActions()
        #expect(!late.contains(.connected(true)) && Self.sent(late).isEmpty, "\(late)")
        #expect(!core.isOnline && core.onlineNode == nil)
        core.closed()
        core.tick(now: 120_000)
        #expect(core.takeActions().isEmpty, "offline: no attempt")
        // goOnline: the next attempt goes to node 1 again, where the client was going.
        core.goOnline()
        core.tick(now: 120_050)
        #expect(core.takeActions() == [.connect(node: 1)])
        core.received(Self.hello("S2"))
        let online = core.takeActions()
        #expect(online.first == .connected(true) && Self.sent(online).contains { $0.contains(#""p":"/w""#) }, "\(online)")
        #expect(core.onlineNode == 1)
        // goOffline and goOnline before the connection has ended: no back-off, the same node.
        core.goOffline()
        core.goOnline()
        #expect(core.takeActions() == [.disconnect])
        core.closed()
        _ = core.takeActions()
        core.tick(now: 120_100)
        #expect(core.takeActions() == [.connect(node: 1)])
    }

    @Test("a reset (r) reconnects at once, to the host it names, once: a failure there goes back to the node list with the usual back-off")
    func resetNamesTheNextHost() {
        var core = ClientCore(nodeCount: 3, seed: 1)
        core.tick(now: 0)
        #expect(core.takeActions() == [.connect(node: 0)])
        core.received(Self.hello())
        _ = core.takeActions()
        core.received(Self.bytes(#"{"t":"c","d":{"t":"r","d":"10.0.0.9:9002"}}"#))
        #expect(core.takeActions() == [.disconnect])
        core.closed()
        _ = core.takeActions()
        // No back-off: the same tick reconnects, to the named host.
        core.tick(now: 1)
        #expect(core.takeActions() == [.redirect(host: "10.0.0.9:9002"), .connect(node: 0)])
        // That host does not answer: back to the list (the next node), after a back-off, with
        // no redirect.
        core.closed()
        _ = core.takeActions()
        core.tick(now: 2)
        #expect(core.takeActions().isEmpty, "a failed attempt backs off")
        core.tick(now: 60_000)
        #expect(core.takeActions() == [.connect(node: 1)])
        // A reset naming no host: at once, through the list.
        core.received(Self.hello("S2"))
        _ = core.takeActions()
        core.received(Self.bytes(#"{"t":"c","d":{"t":"r","d":""}}"#))
        core.closed()
        _ = core.takeActions()
        core.tick(now: 60_001)
        #expect(core.takeActions() == [.connect(node: 1)])
    }

    @Test("child events: added in order with the previous key, changed, moved under an ordering, removed; local writes first")
    func childEvents() throws {
        var core = Self.online()
        let params = try Query().orderByChild("n").params
        core.observe(1, path: Self.path("/l"), params: params, type: .childAdded)
        core.observe(2, path: Self.path("/l"), params: params, type: .childChanged)
        core.observe(3, path: Self.path("/l"), params: params, type: .childMoved)
        core.observe(4, path: Self.path("/l"), params: params, type: .childRemoved)
        core.observe(5, path: Self.path("/l"), params: params, type: .value)
        // An ordering alone loads all data: a plain listen (no tag), filtered here.
        #expect(Self.sent(core.takeActions()) == [#"{"t":"d","d":{"r":2,"a":"q","b":{"p":"/l","h":""}}}"#])
        core.received(Self.data("/l", #"{"a":{"n":3},"b":{"n":1},"c":{"n":2}}"#))
        core.received(Self.ok(2, "{}"))
        #expect(
            Self.events(core.takeActions()) == [
                #"1 child_added b {"n":1} prev=nil"#, #"1 child_added c {"n":2} prev=b"#, #"1 child_added a {"n":3} prev=c"#,
                #"5 value {"a":{"n":3},"b":{"n":1},"c":{"n":2}}"#,
            ])
        // b moves to the end: moved and changed, with its new previous sibling.
        core.received(Self.data("/l/b/n", "9"))
        #expect(
            Self.events(core.takeActions()) == [
                #"3 child_moved b {"n":9} prev=a"#, #"2 child_changed b {"n":9} prev=a"#, #"5 value {"a":{"n":3},"b":{"n":9},"c":{"n":2}}"#,
            ])
        // A local removal raises child_removed at once.
        try core.set(8, path: Self.path("/l/c"), json: Self.bytes("null"))
        #expect(Self.events(core.takeActions()) == [#"4 child_removed c {"n":2}"#, #"5 value {"a":{"n":3},"b":{"n":9}}"#])
        // A second observer on the same view gets the current children and value at once.
        core.observe(6, path: Self.path("/l"), params: params, type: .childAdded)
        #expect(Self.events(core.takeActions()) == [#"6 child_added a {"n":3} prev=nil"#, #"6 child_added b {"n":9} prev=a"#])
        #expect(Self.sent(core.takeActions()).isEmpty, "the view is shared: no second listen")
    }

    @Test("listens go again with the hash of the data held for them (a tagged one: of its window); an ok alone completes a view from that data with no event repeated; an ok alone for a new listen is an empty location")
    func listenHashes() throws {
        var core = Self.online()
        let params = try Query().orderByKey().limitToLast(2).params
        core.observe(1, path: Self.path("/a"), type: .value)
        core.observe(2, path: Self.path("/m"), params: params, type: .childAdded)
        core.observe(3, path: Self.path("/e"), type: .value)
        let first = Self.sent(core.takeActions())
        #expect(first.count == 3 && first.allSatisfy { $0.contains(#""h":"""#) }, "nothing held: empty hashes \(first)")
        core.received(Self.data("/a", #"{"x":1,"y":{".value":2,".priority":1}}"#))
        core.received(Self.ok(2, "{}"))
        core.received(Self.data("/m", #"{"b":2,"c":3}"#, tag: 1))
        core.received(Self.ok(3, "{}"))
        // Nothing at /e: the server sent the ok alone; the view is complete and null.
        core.received(Self.ok(4, "{}"))
        #expect(Self.events(core.takeActions()) == [#"1 value {"x":1,"y":{".value":2,".priority":1}}"#, "2 child_added b 2 prev=nil", "2 child_added c 3 prev=b", "3 value null"])

        core.closed()
        _ = core.takeActions()
        core.tick(now: 60_000)
        #expect(core.takeActions() == [.connect(node: 0)])
        core.received(Self.hello())
        let again = Self.sent(core.takeActions())
        let plainHash = Self.tree(#"{"x":1,"y":{".value":2,".priority":1}}"#).hashString
        let windowHash = Self.tree(#"{"b":2,"c":3}"#).hashString
        #expect(again.contains { $0.contains(#""p":"/a","h":"\#(plainHash)""#) }, "\(again)")
        #expect(again.contains { $0.contains(#""t":1,"h":"\#(windowHash)""#) }, "\(again)")
        #expect(again.contains { $0.contains(#""p":"/e","h":"""#) }, "\(again)")
        // The server holds the same: oks alone, and no event is raised again.
        let numbers = again.compactMap { text -> Int64? in
            guard text.contains(#""a":"q""#), let r = text.split(separator: #""r":"#).dropFirst().first else { return nil }
            return Int64(r.prefix { $0.isNumber })
        }
        #expect(numbers.count == 3, "\(again)")
        for n in numbers { core.received(Self.ok(n, "{}")) }
        #expect(Self.events(core.takeActions()).isEmpty)
        // The views go on with later changes.
        core.received(Self.merge("/m", #"{"d":4,"b":null}"#, tag: 1))
        core.received(Self.data("/a/x", "5"))
        #expect(Self.events(core.takeActions()) == ["2 child_added d 4 prev=c", #"1 value {"x":5,"y":{".value":2,".priority":1}}"#])
    }

    @Test("a limited query is a tagged listen: its own data, pushes by tag, the window kept on changes, unlisten with the query")
    func taggedQuery() throws {
        var core = Self.online()
        let params = try Query().orderByKey().limitToLast(2).params
        core.observe(1, path: Self.path("/m"), params: params, type: .childAdded)
        core.observe(2, path: Self.path("/m"), params: params, type: .childRemoved)
        core.observe(3, path: Self.path("/m"), params: params, type: .value)
        #expect(
            Self.sent(core.takeActions()) == [#"{"t":"d","d":{"r":2,"a":"q","b":{"p":"/m","q":{"i":".key","l":2,"vf":"r"},"t":1,"h":""}}}"#])
        // Untagged data for the location does not feed the tagged view (only plain listens).
        core.received(Self.data("/m", #"{"a":1,"b":2,"c":3}"#))
        #expect(Self.events(core.takeActions()).isEmpty)
        core.received(Self.data("/m", #"{"b":2,"c":3}"#, tag: 1))
        core.received(Self.ok(2, "{}"))
        #expect(Self.events(core.takeActions()) == ["1 child_added b 2 prev=nil", "1 child_added c 3 prev=b", #"3 value {"b":2,"c":3}"#])
        // A new last child: the server sends it and the child leaving the window, tagged.
        core.received(Self.merge("/m", #"{"d":4,"b":null}"#, tag: 1))
        #expect(Self.events(core.takeActions()) == ["2 child_removed b 2", "1 child_added d 4 prev=c", #"3 value {"c":3,"d":4}"#])
        // A local write past the window's end shows at once, pushing c out.
        try core.set(5, path: Self.path("/m/e"), json: Self.bytes("5"))
        #expect(Self.events(core.takeActions()) == ["2 child_removed c 3", "1 child_added e 5 prev=d", #"3 value {"d":4,"e":5}"#])
        core.removeObserver(1)
        core.removeObserver(2)
        #expect(Self.sent(core.takeActions()).isEmpty)
        core.removeObserver(3)
        #expect(Self.sent(core.takeActions()) == [#"{"t":"d","d":{"r":4,"a":"n","b":{"p":"/m","q":{"i":".key","l":2,"vf":"r"},"t":1}}}"#])
    }

    @Test("a query's window is filled from a complete plain listen above it without waiting for its own data")
    func queryUnderCompleteListen() throws {
        var core = Self.online()
        core.observe(1, path: Self.path("/"), type: .value)
        core.received(Self.data("/", #"{"s":{"x":{"v":1},"y":{"v":5},"z":{"v":3}}}"#))
        core.received(Self.ok(2, "{}"))
        _ = core.takeActions()
        let params = try Query().orderByChild("v").startAt(Tree(.int(2))).params
        core.observe(2, path: Self.path("/s"), params: params, type: .value)
        let actions = core.takeActions()
        #expect(Self.events(actions) == [#"2 value {"y":{"v":5},"z":{"v":3}}"#])
        #expect(Self.sent(actions) == [#"{"t":"d","d":{"r":3,"a":"q","b":{"p":"/s","q":{"i":"v","sp":2},"t":1,"h":""}}}"#])
    }

    @Test("a transaction runs on the current data, sends a compare-and-set with its hash, runs again on datastale with the data the server pushed, and completes once")
    func transactionRetriesOnStale() {
        var core = Self.online()
        let seen = Seen()
        core.transaction(
            11, path: Self.path("/counter"), applyLocally: true,
            update: { tree in
                seen.add(tree)
                let n = if case .int(let i)? = tree.leaf { i } else { Int64(0) }
                return .commit(Array(String(n + 1).utf8))
            })
        var sent = Self.sent(core.takeActions())
        // Its location is listened to first, then the put with the hash of the data it saw.
        #expect(sent == [#"{"t":"d","d":{"r":2,"a":"q","b":{"p":"/counter","h":""}}}"#, #"{"t":"d","d":{"r":3,"a":"p","b":{"p":"/counter","d":1,"h":""}}}"#])
        #expect(seen.all == [.empty])
        // The server has 41: its data comes, then datastale; the function runs again on 41.
        core.received(Self.data("/counter", "41"))
        core.received(Self.ok(2, "{}"))
        core.received(Self.status(3, "datastale", "stale"))
        sent = Self.sent(core.takeActions())
        #expect(seen.all == [.empty, Tree(.int(41))])
        #expect(sent == [#"{"t":"d","d":{"r":4,"a":"p","b":{"p":"/counter","d":42,"h":"\#(Tree(.int(41)).hashString)"}}}"#])
        core.received(Self.data("/counter", "42"))
        core.received(Self.ok(4))
        let actions = core.takeActions()
        #expect(actions.contains(.transactionCompleted(11, .init(error: nil, committed: true, snapshot: Tree(.int(42))))))
        // The transaction's listen is released.
        #expect(Self.sent(actions) == [#"{"t":"d","d":{"r":5,"a":"n","b":{"p":"/counter"}}}"#])
    }

    @Test("a transaction stops after 25 stale answers with maxretries; an abort completes uncommitted with the current data")
    func transactionMaxRetriesAndAbort() {
        var core = Self.online()
        core.transaction(1, path: Self.path("/t"), applyLocally: false, update: { _ in .commit(Array("7".utf8)) })
        _ = core.takeActions()
        var number: Int64 = 3
        var outcome: ClientCore.TransactionOutcome?
        for i in 0..<30 where outcome == nil {
            core.received(Self.data("/t", "\(100 + i)"))
            core.received(Self.status(number, "datastale"))
            number += 1
            for a in core.takeActions() {
                if case .transactionCompleted(1, let o) = a { outcome = o }
            }
        }
        #expect(outcome?.error?.code == "maxretries" && outcome?.committed == false)
        #expect(number == 3 + 25, "the function ran 25 times: the first run and 24 reruns")

        core.transaction(2, path: Self.path("/u"), applyLocally: true, update: { _ in .abort })
        let actions = core.takeActions()
        #expect(actions.contains(.transactionCompleted(2, .init(error: nil, committed: false, snapshot: .empty))))
        #expect(!Self.sent(actions).contains { $0.contains(#""a":"p""#) })
    }

    @Test("with local events a transaction's tentative value shows at once; without, observers see only the server's data")
    func transactionLocalEvents() {
        var core = Self.online()
        core.observe(1, path: Self.path("/v"), type: .value)
        core.received(Self.data("/v", "1"))
        core.received(Self.ok(2, "{}"))
        _ = core.takeActions()
        core.transaction(5, path: Self.path("/v"), applyLocally: false, update: { _ in .commit(Array("2".utf8)) })
        #expect(Self.events(core.takeActions()).isEmpty)
        core.transaction(6, path: Self.path("/v"), applyLocally: true, update: { _ in .commit(Array("3".utf8)) })
        #expect(Self.events(core.takeActions()) == ["1 value 3"])
    }

    @Test("a set over a transaction's location overrides it: a stale answer then ends it with overriddenBySet")
    func transactionOverriddenBySet() {
        var core = Self.online()
        core.transaction(1, path: Self.path("/p/q"), applyLocally: true, update: { _ in .commit(Array("1".utf8)) })
        _ = core.takeActions()
        #expect(throws: Never.self) { try core.set(2, path: Self.path("/p"), json: Self.bytes(#"{"q":5}"#)) }
        _ = core.takeActions()
        core.received(Self.status(3, "datastale"))
        let actions = core.takeActions()
        #expect(actions.contains { if case .transactionCompleted(1, let o) = $0 { o.error?.code == "overriddenBySet" } else { false } })
    }

    @Test("onDisconnect: the requests, their completions, and the local view when the connection ends; in flight when it ends: disconnected")
    func onDisconnect() throws {
        var core = Self.online()
        core.observe(1, path: Self.path("/presence"), type: .value)
        core.observe(2, path: Self.path("/.info/connected"), type: .value)
        var actions = core.takeActions()
        #expect(Self.events(actions) == ["2 value true"])
        core.received(Self.data("/presence", #"{"me":"online"}"#))
        core.received(Self.ok(2, "{}"))
        _ = core.takeActions()
        try core.onDisconnectSet(3, path: Self.path("/presence/me"), json: Self.bytes(#""offline""#))
        try core.onDisconnectUpdate(4, path: Self.path("/presence"), children: [(Self.path("last"), Self.bytes(#"{".sv":"timestamp"}"#))])
        core.onDisconnectCancel(5, path: Self.path("/elsewhere"))
        #expect(
            Self.sent(core.takeActions()) == [
                #"{"t":"d","d":{"r":3,"a":"o","b":{"p":"/presence/me","d":"offline"}}}"#,
                #"{"t":"d","d":{"r":4,"a":"om","b":{"p":"/presence","d":{"last":{".sv":"timestamp"}}}}}"#,
                #"{"t":"d","d":{"r":5,"a":"oc","b":{"p":"/elsewhere","d":null}}}"#,
            ])
        core.received(Self.ok(3))
        core.received(Self.ok(4))
        #expect(core.takeActions() == [.completed(3, nil), .completed(4, nil)])
        core.tick(now: 5_000)
        core.closed()
        actions = core.takeActions()
        #expect(actions.contains(.completed(5, .init(code: "disconnected", message: "The connection ended before the server answered"))))
        // The server time estimate: hello ts 1000 at local 0, now 5000 → 6000.
        #expect(Self.events(actions) == [#"1 value {"last":6000,"me":"offline"}"#, "2 value false"])
    }

    @Test("onDisconnect calls made offline are sent on the next connection")
    func onDisconnectQueuedOffline() throws {
        var core = ClientCore(nodeCount: 2, seed: 3)
        try core.onDisconnectSet(1, path: Self.path("/x"), json: Self.bytes("null"))
        #expect(Self.sent(core.takeActions()).isEmpty)
        core.tick(now: 0)
        core.received(Self.hello())
        #expect(Self.sent(core.takeActions()).last == #"{"t":"d","d":{"r":2,"a":"o","b":{"p":"/x","d":null}}}"#)
    }

    @Test("getData: online it asks the server with the query; offline it answers from a complete view, or waits for the connection")
    func getData() throws {
        var core = Self.online()
        let params = try Query().orderByKey().limitToFirst(1).params
        core.get(1, path: Self.path("/g"), params: params)
        #expect(Self.sent(core.takeActions()) == [#"{"t":"d","d":{"r":2,"a":"g","b":{"p":"/g","q":{"i":".key","l":1,"vf":"l"}}}}"#])
        core.received(Self.ok(2, #"{"a":1}"#))
        #expect(core.takeActions() == [.got(1, .success(Tree(sortedChildren: [(ChildKey(unchecked: "a"), Tree(.int(1)))])))])

        core.observe(9, path: Self.path("/h"), type: .value)
        core.received(Self.data("/h", #"{"k":"v"}"#))
        core.received(Self.ok(3, "{}"))
        _ = core.takeActions()
        core.goOffline()
        #expect(core.takeActions() == [.disconnect])
        core.closed()
        _ = core.takeActions()
        core.get(2, path: Self.path("/h/k"))
        #expect(core.takeActions() == [.got(2, .success(Tree(.string("v"))))])
        core.get(3, path: Self.path("/elsewhere"))
        #expect(core.takeActions().isEmpty, "unknown offline: asked once online")
        core.goOnline()
        core.tick(now: 1)
        core.received(Self.hello())
        #expect(Self.sent(core.takeActions()).last == #"{"t":"d","d":{"r":6,"a":"g","b":{"p":"/elsewhere","q":{}}}}"#)
    }

    @Test("a refused or revoked listen cancels its observers with permission_denied")
    func listenRefusedAndRevoked() throws {
        var core = Self.online()
        core.observe(1, path: Self.path("/secret"), type: .value)
        core.observe(2, path: Self.path("/open"), type: .childAdded)
        core.observe(3, path: Self.path("/open"), params: try Query().limitToFirst(1).params, type: .value)
        _ = core.takeActions()
        core.received(Self.status(2, "permission_denied", "Permission denied"))
        #expect(core.takeActions() == [.cancelled(1, .init(code: "permission_denied", message: "Permission denied"))])
        core.received(Self.ok(3, "{}"))
        core.received(Self.ok(4, "{}"))
        _ = core.takeActions()
        core.received(Array(#"{"t":"d","d":{"a":"c","b":{"p":"/open","q":[{"l":1,"vf":"l"}]}}}"#.utf8))
        #expect(core.takeActions() == [.cancelled(3, .init(code: "permission_denied", message: "Permission denied"))])
        core.received(Array(#"{"t":"d","d":{"a":"c","b":{"p":"/open"}}}"#.utf8))
        #expect(core.takeActions() == [.cancelled(2, .init(code: "permission_denied", message: "Permission denied"))])
    }

    @Test("priorities: setValue with a priority and setPriority reorder a priority-ordered view at once")
    func priorities() throws {
        var core = Self.online()
        core.observe(1, path: Self.path("/r"), type: .childMoved)
        core.observe(2, path: Self.path("/r"), type: .value)
        core.received(Self.data("/r", #"{"a":{".value":1,".priority":1},"b":{".value":2,".priority":2}}"#))
        core.received(Self.ok(2, "{}"))
        _ = core.takeActions()
        try core.setPriority(3, path: Self.path("/r/a"), json: Self.bytes("5"))
        var actions = core.takeActions()
        #expect(Self.sent(actions) == [#"{"t":"d","d":{"r":3,"a":"p","b":{"p":"/r/a/.priority","d":5}}}"#])
        #expect(Self.events(actions).first == "1 child_moved a {\".value\":1,\".priority\":5} prev=b")
        try core.set(4, path: Self.path("/r/c"), json: Self.bytes(#"{".value":"x",".priority":0}"#))
        actions = core.takeActions()
        #expect(Self.events(actions) == [#"2 value {"a":{".value":1,".priority":5},"b":{".value":2,".priority":2},"c":{".value":"x",".priority":0}}"#])
        #expect(throws: TreeError.self) { try core.setPriority(5, path: Self.path("/r/a"), json: Self.bytes("true")) }
    }

    @Test(".info/connected and .info/serverTimeOffset follow the connection, offline from the start")
    func info() {
        var core = ClientCore(nodeCount: 1, seed: 9)
        core.observe(1, path: Self.path("/.info/connected"), type: .value)
        core.observe(2, path: Self.path("/.info/serverTimeOffset"), type: .value)
        #expect(Self.events(core.takeActions()) == ["1 value false", "2 value 0"])
        core.tick(now: 400)
        core.received(Self.hello())
        #expect(Self.events(core.takeActions()) == ["1 value true", "2 value 600"])
        core.get(3, path: Self.path("/.info/connected"))
        #expect(core.takeActions() == [.got(3, .success(Tree(.bool(true))))])
    }

    @Test("an auth refusal or revocation drops the token; a revocation closes the connection so the next one can start with a fresh token")
    func authRevoked() {
        var core = ClientCore(nodeCount: 1, seed: 1, authToken: "tok")
        core.tick(now: 0)
        core.received(Self.hello())
        #expect(Self.sent(core.takeActions()).last == #"{"t":"d","d":{"r":2,"a":"auth","b":{"cred":"tok"}}}"#)
        core.received(Self.status(2, "invalid_token", "bad"))
        #expect(core.takeActions() == [.authRevoked(.init(code: "invalid_token", message: "bad"))])
        core.setAuthToken("tok2")
        #expect(Self.sent(core.takeActions()) == [#"{"t":"d","d":{"r":3,"a":"auth","b":{"cred":"tok2"}}}"#])
        core.received(Self.ok(3, #"{"auth":null}"#))
        core.received(Array(#"{"t":"d","d":{"a":"ac","b":{"s":"expired_token","d":"Auth token is expired."}}}"#.utf8))
        #expect(core.takeActions() == [.authRevoked(.init(code: "expired_token", message: "Auth token is expired.")), .disconnect])
        core.setAuthToken(nil)
        #expect(core.takeActions().isEmpty, "nothing to drop")
    }

    @Test("keepSynced listens with no observer; data then serves a new observer at once")
    func keepSynced() {
        var core = Self.online()
        core.keepSynced(Self.path("/k"), true)
        #expect(Self.sent(core.takeActions()) == [#"{"t":"d","d":{"r":2,"a":"q","b":{"p":"/k","h":""}}}"#])
        core.received(Self.data("/k", "1"))
        core.received(Self.ok(2, "{}"))
        core.observe(1, path: Self.path("/k"), type: .value)
        #expect(core.takeActions() == [.event(1, ViewEvent(.value, key: nil, tree: Tree(.int(1))))])
        core.removeObserver(1)
        #expect(core.takeActions().isEmpty, "still kept synced")
        core.keepSynced(Self.path("/k"), false)
        #expect(Self.sent(core.takeActions()) == [#"{"t":"d","d":{"r":3,"a":"n","b":{"p":"/k"}}}"#])
    }

    @Test("with a server that takes write numbers, writes carry bn/ba, keep their numbers when sent again, and wait beyond the window; bc and ls name the client and the last session")
    func writeNumbers() throws {
        var core = ClientCore(nodeCount: 1, seed: 4, clientID: 0xAB)
        #expect(core.connectionParameters.map { "\($0.0)=\($0.1)" } == ["bc=00000000000000ab"])
        core.tick(now: 0)
        core.received(Array(#"{"t":"c","d":{"t":"h","d":{"ts":1,"v":"5","h":"n","s":"1-2-3","bw":1}}}"#.utf8))
        _ = core.takeActions()
        try core.set(1, path: Self.path("/a"), json: Self.bytes("1"))
        try core.update(2, path: Self.path("/"), children: [(Self.path("b"), Self.bytes("2"))])
        #expect(
            Self.sent(core.takeActions()) == [
                #"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/a","d":1,"bn":1,"ba":1}}}"#, #"{"t":"d","d":{"r":3,"a":"m","b":{"p":"/","d":{"b":2},"bn":2,"ba":1}}}"#,
            ])
        core.received(Self.ok(2))
        // The connection dies before write 2's answer: the next one names the last session and
        // sends write 2 again under the same number, acknowledging 1.
        core.closed()
        #expect(core.connectionParameters.map { "\($0.0)=\($0.1)" } == ["bc=00000000000000ab", "ls=1-2-3"])
        core.tick(now: 60_000)
        core.received(Array(#"{"t":"c","d":{"t":"h","d":{"ts":1,"v":"5","h":"n","s":"1-2-4","bw":1}}}"#.utf8))
        #expect(Self.sent(core.takeActions()).last == #"{"t":"d","d":{"r":5,"a":"m","b":{"p":"/","d":{"b":2},"bn":2,"ba":2}}}"#)
        // A server without `bw` gets no numbers.
        var plain = Self.online()
        try plain.set(1, path: Self.path("/a"), json: Self.bytes("1"))
        #expect(Self.sent(plain.takeActions()) == [#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/a","d":1}}}"#])
        // Beyond the window (1,000 past the lowest unanswered number) writes wait, in order.
        var many = ClientCore(nodeCount: 1, seed: 5)
        many.tick(now: 0)
        many.received(Array(#"{"t":"c","d":{"t":"h","d":{"ts":1,"v":"5","h":"n","s":"s","bw":1}}}"#.utf8))
        _ = many.takeActions()
        for i in 1...1_001 { try many.set(UInt64(i), path: Self.path("/w/\(i)"), json: Self.bytes("\(i)")) }
        let first = Self.sent(many.takeActions())
        #expect(first.count == 1_000 && first.last?.contains(#""bn":1000,"ba":1"#) == true)
        many.received(Self.ok(2))
        #expect(Self.sent(many.takeActions()) == [#"{"t":"d","d":{"r":1002,"a":"p","b":{"p":"/w/1001","d":1001,"bn":1001,"ba":2}}}"#])
    }

    @Test func readsServerMessagesAndSplitsLargeOnes() throws {
        #expect(try ServerMessageReader.read(Self.hello()) == .hello(timestamp: 1000, session: "S1"))
        #expect(try ServerMessageReader.read(Array(#"{"t":"c","d":{"t":"r","d":"n2:9000"}}"#.utf8)) == .reset(host: "n2:9000"))
        let merge = try ServerMessageReader.read(Array(#"{"t":"d","d":{"a":"m","b":{"p":"/a","d":{"b/c":1,"d":null},"t":3}}}"#.utf8))
        guard case .merge(let p, let children, let tag) = merge else {
            Issue.record("not a merge: \(merge)")
            return
        }
        #expect(p == Self.path("/a") && children.count == 2 && tag == 3)
        #expect(throws: WireError.self) { _ = try ServerMessageReader.read(Array("nonsense".utf8)) }
        #expect(throws: WireError.self) { _ = try ServerMessageReader.read(Array(#"{"t":"d","d":{"a":"d","b":{"p":"/a","d":1,"t":"x"}}}"#.utf8)) }
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

/// What a transaction function was called with (its closure is @Sendable).
final class Seen: @unchecked Sendable {
    private var trees: [Tree] = []
    func add(_ t: Tree) { trees.append(t) }
    var all: [Tree] { trees }
}

/// The SDK's disk cache: records, replay, and a core restarted from them.
@Suite struct ClientStoreTests {
    static func path(_ s: String) -> Path { ClientCoreTests.path(s) }

    static func file(_ records: [ClientStore.Record]) -> [UInt8] {
        ClientStore.magic + records.flatMap { ClientStore.encode($0) }
    }

    @Test("records replay: writes without their done records stay, in order; server data and completeness; a torn or damaged tail is cut; other files are not caches")
    func replay() throws {
        let w1 = ClientStore.StoredWrite(number: 1, kind: .set, path: Self.path("/a"), json: Array("1".utf8))
        let w2 = ClientStore.StoredWrite(number: 2, kind: .merge, path: Self.path("/"), children: [(Self.path("b/c"), Array("2".utf8))])
        let w3 = ClientStore.StoredWrite(number: 3, kind: .transaction, path: Self.path("/t"), json: Array("5".utf8), hash: "h", visible: false)
        let records: [ClientStore.Record] = [
            .identity(client: 77, nextNumber: 1), .write(w1), .write(w2), .server(Self.path("/s"), Array(#"{"x":1}"#.utf8)), .complete(Self.path("/s"), true),
            .writeDone(1), .write(w3), .server(Self.path("/s/x"), Array("2".utf8)),
        ]
        let bytes = Self.file(records)
        let state = try #require(ClientStore.restore(bytes))
        #expect(state.client == 77 && state.nextNumber == 4 && state.records == records.count && state.validBytes == bytes.count)
        #expect(state.writes == [w2, w3])
        #expect(state.server.child(at: Self.path("/s")) == (try Tree(json: #"{"x":2}"#)))
        #expect(state.complete == [Self.path("/s")])
        // A tail cut anywhere inside the last record: everything before it stands.
        let lastStart = bytes.count - ClientStore.encode(records[records.count - 1]).count
        for cut in lastStart..<bytes.count {
            let torn = try #require(ClientStore.restore(Array(bytes.prefix(cut))))
            #expect(torn.records == records.count - 1 && torn.validBytes == lastStart)
        }
        var damaged = bytes
        damaged[lastStart + 14] ^= 0xFF
        #expect(ClientStore.restore(damaged)?.records == records.count - 1)
        #expect(ClientStore.restore(Array("not a cache".utf8)) == nil)
        // Numbers are never reused: every number written counts, answered or not.
        let done = try #require(ClientStore.restore(Self.file([.identity(client: 5, nextNumber: 1), .write(w1), .writeDone(1)])))
        #expect(done.writes.isEmpty && done.nextNumber == 2)
    }

    @Test("a core restarted from its cache: unanswered writes keep their client id and numbers, show at once, and go first on the next connection; cached complete data raises events offline")
    func restart() throws {
        var first = ClientCore(nodeCount: 1, seed: 1, persistence: true)
        var records: [ClientStore.Record] = []
        func collect(_ actions: [ClientCore.Action]) {
            for a in actions { if case .persist(let r, _) = a { records += r } }
        }
        collect(first.takeActions())
        first.tick(now: 0)
        first.received(Array(#"{"t":"c","d":{"t":"h","d":{"ts":1,"v":"5","h":"n","s":"s1","bw":1}}}"#.utf8))
        first.observe(1, path: Self.path("/feed"), type: .value)
        first.received(ClientCoreTests.data("/feed", #"{"m1":"hi"}"#))
        collect(first.takeActions())
        first.goOffline()
        first.closed()
        try first.set(10, path: Self.path("/feed/m2"), json: Array(#""offline""#.utf8))
        try first.update(11, path: Self.path("/n"), children: [(Self.path("count"), Array(#"{".sv":{"increment":1}}"#.utf8))])
        collect(first.takeActions())
        #expect(records.contains { if case .write(let w) = $0 { w.number == 1 } else { false } })

        // A new process reads the file back.
        let restored = try #require(ClientStore.restore(Self.file(records)))
        var second = ClientCore(nodeCount: 1, seed: 99, persistence: true, restored: restored)
        #expect(second.clientID == first.clientID && second.nextWriteNumber == 3)
        _ = second.takeActions()
        second.observe(5, path: Self.path("/feed"), type: .value)
        second.tick(now: 10)
        let shown = ClientCoreTests.events(second.takeActions())
        #expect(shown.last == #"5 value {"m1":"hi","m2":"offline"}"#, "\(shown)")
        second.received(Array(#"{"t":"c","d":{"t":"h","d":{"ts":1,"v":"5","h":"n","s":"s2","bw":1}}}"#.utf8))
        let sent = ClientCoreTests.sent(second.takeActions())
        #expect(sent.contains(#"{"t":"d","d":{"r":3,"a":"p","b":{"p":"/feed/m2","d":"offline","bn":1,"ba":1}}}"#), "\(sent)")
        #expect(sent.contains(#"{"t":"d","d":{"r":4,"a":"m","b":{"p":"/n","d":{"count":{".sv":{"increment":1}}},"bn":2,"ba":1}}}"#), "\(sent)")
        // Answered: done records; nothing left for a third start.
        second.received(ClientCoreTests.ok(3))
        second.received(ClientCoreTests.ok(4))
        var more: [ClientStore.Record] = []
        for a in second.takeActions() { if case .persist(let r, _) = a { more += r } }
        #expect(more.contains(.writeDone(1)) && more.contains(.writeDone(2)))
        let third = try #require(ClientStore.restore(Self.file(records + more)))
        #expect(third.writes.isEmpty && third.nextNumber == 3)
    }

    @Test("compaction keeps the writes and the locations in use, drops other cached data beyond the budget")
    func compaction() throws {
        var core = ClientCore(nodeCount: 1, seed: 2, persistence: true)
        core.tick(now: 0)
        core.received(ClientCoreTests.hello())
        for (i, name) in ["a", "b", "c"].enumerated() {
            core.observe(UInt64(i + 1), path: Self.path("/\(name)"), type: .value)
            core.received(ClientCoreTests.data("/\(name)", "\"" + String(repeating: name, count: 1_000) + "\""))
        }
        core.removeObserver(1)
        core.removeObserver(2)
        core.keepSynced(Self.path("/b"), true)
        try core.set(9, path: Self.path("/w"), json: Array("1".utf8))
        _ = core.takeActions()
        let records = core.compactedRecords(budget: 1_500)
        let kept = records.compactMap { if case .complete(let p, true) = $0 { p.description } else { nil } }
        #expect(kept.sorted() == ["/b", "/c"], "\(kept)")
        #expect(records.contains { if case .write(let w) = $0 { w.path == Self.path("/w") } else { false } })
        #expect(records.first == .identity(client: core.clientID, nextNumber: core.nextWriteNumber))
    }

    @Test("compaction keeps the listened and kept-synced locations inside a cached location that does not fit, in the file and in memory")
    func compactionNested() throws {
        var core = ClientCore(nodeCount: 1, seed: 3, persistence: true)
        core.tick(now: 0)
        core.received(ClientCoreTests.hello())
        let filler = String(repeating: "x", count: 3_000)
        core.observe(1, path: Self.path("/big"), type: .value)
        core.received(ClientCoreTests.data("/big", #"{"filler":"\#(filler)","live":{"a":1},"kept":{"b":2}}"#))
        core.observe(2, path: Self.path("/big/live"), type: .value)
        core.keepSynced(Self.path("/big/kept"), true)
        core.removeObserver(1)
        core.received(ClientCoreTests.data("/big/live", #"{"a":1}"#))
        core.received(ClientCoreTests.data("/big/kept", #"{"b":2}"#))
        _ = core.takeActions()
        let records = core.compactedRecords(budget: 1_000)
        let kept = records.compactMap { if case .complete(let p, true) = $0 { p.description } else { nil } }
        #expect(kept.sorted() == ["/big/kept", "/big/live"], "\(kept)")
        // In memory: the live view kept its data (a change from the server shows both fields).
        core.received(ClientCoreTests.merge("/big/live", #"{"c":3}"#))
        let shown = ClientCoreTests.events(core.takeActions())
        #expect(shown == [#"2 value {"a":1,"c":3}"#], "\(shown)")
        // From the file: a new core shows the kept-synced data offline.
        let restored = try #require(ClientStore.restore(Self.file(records)))
        var second = ClientCore(nodeCount: 1, seed: 4, persistence: true, restored: restored)
        _ = second.takeActions()
        second.observe(7, path: Self.path("/big/kept"), type: .value)
        second.tick(now: 10)
        let offline = ClientCoreTests.events(second.takeActions())
        #expect(offline.last == #"7 value {"b":2}"#, "\(offline)")
    }
}

extension ClientCoreTests {
    /// A filtered view reads the plain data while a complete plain listen covers its location,
    /// and its own window after: when the plain listen ends, the view is compared in full, so a
    /// child only the plain data held (outside the window) is not shown later as added back.
    @Test("a limited view under a plain listen that ends: later window pushes raise only the window's changes")
    func windowAfterPlainListenEnds() throws {
        var core = Self.online()
        let params = try Query().orderByKey().limitToLast(2).params
        core.observe(1, path: Self.path("/list"), type: .value)
        core.received(Self.data("/list", #"{"a":1,"b":2,"c":3}"#))
        core.received(Self.ok(2, "{}"))
        core.observe(2, path: Self.path("/list"), params: params, type: .childAdded)
        core.observe(3, path: Self.path("/list"), params: params, type: .childRemoved)
        core.observe(4, path: Self.path("/list"), params: params, type: .value)
        core.received(Self.data("/list", #"{"b":2,"c":3}"#, tag: 1))
        core.received(Self.ok(3, "{}"))
        _ = core.takeActions()
        // The plain listen ends; `a` (outside the window) is then deleted by another client, so
        // nothing is pushed for it; then `c` is deleted and the window pushed again.
        core.removeObserver(1)
        _ = core.takeActions()
        core.received(Self.data("/list", #"{"b":2}"#, tag: 1))
        let events = Self.events(core.takeActions())
        #expect(events == ["3 child_removed c 3", "4 value {\"b\":2}"], "\(events)")
    }
}

extension ClientStoreTests {
    /// A core with persistence, connected (its stats request answered).
    static func persistentOnline(seed: UInt64, restored: ClientStore.Restored? = nil) -> ClientCore {
        var core = ClientCore(nodeCount: 1, seed: seed, persistence: true, restored: restored)
        core.tick(now: 0)
        core.opened()
        core.received(ClientCoreTests.hello())
        core.received(ClientCoreTests.ok(1))
        return core
    }

    static func records(_ actions: [ClientCore.Action]) -> [ClientStore.Record] {
        actions.flatMap { action -> [ClientStore.Record] in
            if case .persist(let r, _) = action { return r }
            return []
        }
    }

    @Test("a filtered query's window is cached on disk: it follows the server's pushes, shows offline after a restart (value, child events, getData), and its hash makes an unchanged window cost an ok alone")
    func filteredQueryCached() throws {
        let params = try Query().orderByKey().limitToLast(2).params
        var first = Self.persistentOnline(seed: 1)
        first.observe(1, path: Self.path("/msgs"), params: params, type: .value)
        first.received(ClientCoreTests.data("/msgs", #"{"b":2,"c":3}"#, tag: 1))
        first.received(ClientCoreTests.ok(2, "{}"))
        // A new last message: the window is pushed again whole (b leaves, d arrives).
        first.received(ClientCoreTests.data("/msgs", #"{"c":3,"d":4}"#, tag: 1))
        // A change inside the window.
        first.received(ClientCoreTests.merge("/msgs", #"{"c":33}"#, tag: 1))
        var records = Self.records(first.takeActions())
        let queryRecords = records.filter { if case .query = $0 { true } else { false } }
        // Whole once when complete, then only what changed: b (removed), d (added), then c.
        #expect(queryRecords.count == 4, "\(queryRecords)")
        #expect(queryRecords.first == .query(path: Self.path("/msgs"), query: params.identifier, at: .root, json: Array(#"{"b":2,"c":3}"#.utf8)))
        first.removeObserver(1)
        records += Self.records(first.takeActions())

        // A new process, offline: the window shows at once, and getData answers from it.
        let restored = try #require(ClientStore.restore(Self.file(records)))
        #expect(restored.queries[.init(path: Self.path("/msgs"), query: params.identifier)] == ClientCoreTests.tree(#"{"c":33,"d":4}"#))
        var second = ClientCore(nodeCount: 1, seed: 2, persistence: true, restored: restored)
        second.goOffline()
        _ = second.takeActions()
        second.get(40, path: Self.path("/msgs"), params: params)
        #expect(second.takeActions() == [.got(40, .success(ClientCoreTests.tree(#"{"c":33,"d":4}"#)))])
        second.observe(5, path: Self.path("/msgs"), params: params, type: .childAdded)
        second.observe(6, path: Self.path("/msgs"), params: params, type: .value)
        #expect(
            ClientCoreTests.events(second.takeActions()) == ["5 child_added c 33 prev=nil", "5 child_added d 4 prev=c", #"6 value {"c":33,"d":4}"#])
        // Another query at the same place is not the cached one: nothing is known offline.
        let other = try Query().orderByKey().limitToLast(3).params
        second.observe(7, path: Self.path("/msgs"), params: other, type: .value)
        #expect(ClientCoreTests.events(second.takeActions()).isEmpty)
        // A local write shows over the cached window at once.
        try second.set(8, path: Self.path("/msgs/e"), json: ClientCoreTests.bytes("5"))
        #expect(
            ClientCoreTests.events(second.takeActions()).filter { $0.hasPrefix("6 ") } == [#"6 value {"d":4,"e":5}"#])

        // Online: the listen names the cached window's hash; the server holds the same, so it
        // answers the ok alone and no event is raised twice.
        var third = Self.persistentOnline(seed: 3, restored: restored)
        _ = third.takeActions()
        third.observe(9, path: Self.path("/msgs"), params: params, type: .value)
        let actions = third.takeActions()
        #expect(ClientCoreTests.events(actions) == [#"9 value {"c":33,"d":4}"#])
        let hash = ClientCoreTests.tree(#"{"c":33,"d":4}"#).hashString
        let listen = try #require(ClientCoreTests.sent(actions).first { $0.contains(#""a":"q""#) })
        #expect(listen.contains(#""h":"\#(hash)""#), "\(listen)")
        let number = try #require(Int64(listen.split(separator: #""r":"#)[1].prefix { $0.isNumber }))
        third.received(ClientCoreTests.ok(number, "{}"))
        #expect(ClientCoreTests.events(third.takeActions()).isEmpty)
        // The server's window differs: only the difference is raised, and the file follows.
        third.received(ClientCoreTests.data("/msgs", #"{"d":4,"f":6}"#, tag: 1))
        let later = third.takeActions()
        #expect(ClientCoreTests.events(later) == [#"9 value {"d":4,"f":6}"#])
        let fourth = try #require(ClientStore.restore(Self.file(records + Self.records(actions) + Self.records(later))))
        #expect(fourth.queries[.init(path: Self.path("/msgs"), query: params.identifier)] == ClientCoreTests.tree(#"{"d":4,"f":6}"#))
    }

    @Test("compaction keeps every live filtered query's window and the cached ones that fit; a refused query's window is forgotten")
    func filteredQueryCompactionAndRefusal() throws {
        let params = try Query().orderByKey().limitToLast(1).params
        var core = Self.persistentOnline(seed: 4)
        var records: [ClientStore.Record] = []
        for (i, name) in ["a", "b", "c"].enumerated() {
            core.observe(UInt64(i + 1), path: Self.path("/\(name)"), params: params, type: .value)
            core.received(ClientCoreTests.data("/\(name)", #"{"k":"\#(String(repeating: name, count: 1_000))"}"#, tag: i + 1))
            core.received(ClientCoreTests.ok(Int64(i + 2), "{}"))
        }
        core.removeObserver(1)
        core.removeObserver(2)
        records += Self.records(core.takeActions())
        // c is live (kept whatever its size); a fits the budget, b does not.
        let compacted = core.compactedRecords(budget: 2_400)
        let kept = compacted.compactMap { if case let .query(path, _, _, _) = $0 { path.description } else { nil } }
        #expect(kept == ["/c", "/a"], "\(kept)")
        // b is gone from memory too: offline, a new view of it knows nothing; a still shows.
        core.goOffline()
        _ = core.takeActions()
        core.observe(10, path: Self.path("/b"), params: params, type: .value)
        core.observe(11, path: Self.path("/a"), params: params, type: .value)
        #expect(ClientCoreTests.events(core.takeActions()) == [#"11 value {"k":"\#(String(repeating: "a", count: 1_000))"}"#])

        // Refused (rules changed): its window is forgotten, in the file too.
        var again = Self.persistentOnline(seed: 5, restored: try #require(ClientStore.restore(Self.file(compacted))))
        _ = again.takeActions()
        again.observe(20, path: Self.path("/c"), params: params, type: .value)
        let listen = try #require(ClientCoreTests.sent(again.takeActions()).first { $0.contains(#""a":"q""#) })
        let number = try #require(Int64(listen.split(separator: #""r":"#)[1].prefix { $0.isNumber }))
        again.received(ClientCoreTests.status(number, "permission_denied", "no"))
        let refused = again.takeActions()
        #expect(refused.contains { if case .cancelled(20, _) = $0 { true } else { false } })
        let after = try #require(ClientStore.restore(Self.file(compacted + Self.records(refused))))
        #expect(after.queries[.init(path: Self.path("/c"), query: params.identifier)] == nil)
        #expect(after.queries[.init(path: Self.path("/a"), query: params.identifier)] != nil)
    }
}

extension ClientStoreTests {
    @Test("format 1 cache files (before filtered queries' windows) still restore; a database opening one turns it into the current format in place, so an older SDK never meets a record it cannot read")
    func formatOneFiles() throws {
        let write = ClientStore.StoredWrite(number: 4, kind: .set, path: Self.path("/a"), json: Array("1".utf8))
        let records: [ClientStore.Record] = [.identity(client: 77, nextNumber: 5), .write(write), .server(Self.path("/b"), Array("2".utf8)), .complete(Self.path("/b"), true)]
        let old = ClientStore.magicFormatOne + records.flatMap { ClientStore.encode($0) }
        let restored = try #require(ClientStore.restore(old))
        #expect(restored.formatOne && restored.client == 77 && restored.writes == [write] && restored.complete == [Self.path("/b")])
        #expect(try #require(ClientStore.restore(Self.file(records))).formatOne == false)
        #expect(ClientStore.magic != ClientStore.magicFormatOne && ClientStore.magic.count == ClientStore.magicFormatOne.count)
        // Anything else is not a cache.
        #expect(ClientStore.restore(Array("BNYCLI04".utf8) + records.flatMap { ClientStore.encode($0) }) == nil)
    }
}

extension ClientStoreTests {
    @Test("a record's size is counted without encoding it, exactly: every kind, non-ASCII paths, updates with children")
    func encodedSizeIsExact() throws {
        let p = Self.path("/héllo/wörld")
        let update = ClientStore.StoredWrite(number: 3, kind: .merge, path: p, children: [(Self.path("a/ü"), Array("1".utf8)), (Self.path("b"), Array("{}".utf8))], visible: true)
        let records: [ClientStore.Record] = [
            .identity(client: 1, nextNumber: 2),
            .write(ClientStore.StoredWrite(number: 4, kind: .transaction, path: p, json: Array(#""x""#.utf8), hash: "abc=", visible: false)),
            .write(update),
            .writeDone(9),
            .server(p, Array(#"{"k":"ß"}"#.utf8)),
            .complete(p, true),
            .query(path: p, query: #"{"l":2,"vf":"r"}"#, at: Self.path("/ä"), json: Array("[1]".utf8)),
            .query(path: .root, query: "", at: .root, json: []),
        ]
        for r in records { #expect(ClientStore.encodedSize(r) == ClientStore.encode(r).count, "\(r)") }
    }

    @Test("compaction keeps what must stay first (listened locations and live query windows), then optional locations only while they fit, so a file fits its budget whenever dropping optional data makes it fit")
    func compactionKeepsLiveWindowsBeforeOptionalData() throws {
        let params = try Query().orderByKey().limitToLast(1).params
        var core = Self.persistentOnline(seed: 6)
        // An optional cached location (listened to, then released) sorted before the window.
        core.observe(1, path: Self.path("/a"), type: .value)
        core.received(ClientCoreTests.data("/a", "\"" + String(repeating: "a", count: 1_000) + "\""))
        core.removeObserver(1)
        // A live filtered query of about 1 KB.
        core.observe(2, path: Self.path("/z"), params: params, type: .value)
        core.received(ClientCoreTests.data("/z", #"{"k":"\#(String(repeating: "z", count: 1_000))"}"#, tag: 1))
        core.received(ClientCoreTests.ok(2, "{}"))
        _ = core.takeActions()
        let budget = 1_300
        let compacted = core.compactedRecords(budget: budget)
        let windows = compacted.compactMap { if case let .query(path, _, _, _) = $0 { path.description } else { nil } }
        let locations = compacted.compactMap { if case .complete(let p, true) = $0 { p.description } else { nil } }
        #expect(windows == ["/z"], "\(windows)")
        #expect(locations.isEmpty, "the optional location should have been dropped: \(locations)")
        let bytes = compacted.reduce(0) { $0 + ClientStore.encode($1).count }
        #expect(bytes <= budget, "\(bytes) bytes against a budget of \(budget)")
    }
}

extension ClientStoreTests {
    /// A transaction restored from the cache (its function is gone with the old process) is sent
    /// once as its last compare-and-set (docs/swift-sdk.md, "Offline and persistence").
    @Test("a restored transaction applies if the data is unchanged, and if it changed ends without rerunning: its value is rolled back and it is not sent again", arguments: [true, false])
    func restoredTransactionOutcome(unchanged: Bool) throws {
        let five = try Tree(json: "5")
        let write = ClientStore.StoredWrite(number: 1, kind: .transaction, path: Self.path("/t"), json: Array("6".utf8), hash: five.hashString, visible: true)
        let records: [ClientStore.Record] = [
            .identity(client: 7, nextNumber: 2), .server(Self.path("/t"), Array("5".utf8)), .complete(Self.path("/t"), true), .write(write),
        ]
        var core = ClientCore(nodeCount: 1, seed: 3, persistence: true, restored: try #require(ClientStore.restore(Self.file(records))))
        _ = core.takeActions()
        core.observe(1, path: Self.path("/t"), type: .value)
        core.tick(now: 10)
        #expect(ClientCoreTests.events(core.takeActions()).last == "1 value 6", "shown at once, as its last attempt")
        core.received(ClientCoreTests.hello())
        let sent = ClientCoreTests.sent(core.takeActions())
        let put = try #require(sent.first { $0.contains(#""a":"p""#) && $0.contains(#""p":"/t""#) }, "\(sent)")
        #expect(put.contains(#""h":"\#(five.hashString)""#) && put.contains(#""d":6"#), "\(put)")
        let number = try #require(Int64(put.split(separator: #""r":"#)[1].prefix { $0.isNumber }))
        if unchanged {
            core.received(ClientCoreTests.data("/t", "6"))
            core.received(ClientCoreTests.ok(number))
        } else {
            // Another client wrote 9 meanwhile: the server sends it, then refuses the swap.
            core.received(ClientCoreTests.data("/t", "9"))
            core.received(ClientCoreTests.status(number, "datastale"))
        }
        let after = core.takeActions()
        let shown = ClientCoreTests.events(after)
        // Unchanged: 6 was shown and stays (no event); changed: the server's 9 replaces it.
        #expect(unchanged ? shown.isEmpty : shown.last == "1 value 9", "\(shown)")
        #expect(Self.records(after).contains(.writeDone(1)), "answered: not restored again")
        #expect(ClientCoreTests.sent(after).isEmpty, "not sent again: \(ClientCoreTests.sent(after))")
        #expect(core.pendingWriteCount == 0)
    }
}

extension ClientStoreTests {
    @Test("format 2 files (before signed-in writes) still restore and are marked for the in-place upgrade; a write made signed in round-trips as one")
    func formatTwoFilesAndSignedInWrites() throws {
        let plain = ClientStore.StoredWrite(number: 1, kind: .set, path: Self.path("/a"), json: Array("1".utf8))
        let signed = ClientStore.StoredWrite(number: 2, kind: .merge, path: Self.path("/b"), children: [(Self.path("c"), Array("2".utf8))], signedIn: true)
        let records: [ClientStore.Record] = [.identity(client: 3, nextNumber: 1), .write(plain), .write(signed)]
        let now = try #require(ClientStore.restore(Self.file(records)))
        #expect(now.writes == [plain, signed] && !now.olderFormat)
        #expect(now.writes.map { $0.signedIn } == [false, true])
        let two = try #require(ClientStore.restore(ClientStore.magicFormatTwo + [ClientStore.Record.identity(client: 3, nextNumber: 1), .write(plain)].flatMap { ClientStore.encode($0) }))
        #expect(two.olderFormat && !two.formatOne && two.writes == [plain])
        #expect(ClientStore.encodedSize(.write(signed)) == ClientStore.encode(.write(signed)).count)
    }

    /// A write made while signed in, restored after a restart, must not reach the server before
    /// the app has a credential again: rules that need the user would refuse it, and the refusal
    /// would drop the user's offline write (its completion block died with the old process).
    @Test("a restored write made signed in waits for a credential, the writes after it wait behind it, and both go, in order, after the credential; a restored write made signed out goes at once")
    func restoredSignedInWritesWaitForACredential() throws {
        var first = ClientCore(nodeCount: 1, seed: 1, authToken: "token-1", persistence: true)
        first.tick(now: 0)
        try first.set(1, path: Self.path("/signed"), json: Array("1".utf8))
        first.setAuthToken(nil)
        try first.set(2, path: Self.path("/anonymous"), json: Array("2".utf8))
        let records = [ClientStore.Record.identity(client: first.clientID, nextNumber: first.nextWriteNumber)] + Self.records(first.takeActions())
        let restored = try #require(ClientStore.restore(Self.file(records)))
        #expect(restored.writes.map { $0.signedIn } == [true, false])

        var second = ClientCore(nodeCount: 1, seed: 2, persistence: true, restored: restored)
        second.tick(now: 10)
        _ = second.takeActions()
        second.received(ClientCoreTests.hello())
        #expect(ClientCoreTests.sent(second.takeActions()).filter { $0.contains(#""a":"p""#) }.isEmpty, "nothing is sent before a credential")
        // A new write, made signed out, waits behind them.
        try second.set(3, path: Self.path("/later"), json: Array("3".utf8))
        #expect(ClientCoreTests.sent(second.takeActions()).filter { $0.contains(#""a":"p""#) }.isEmpty, "a later write does not overtake them")
        second.setAuthToken("token-2")
        let sent = ClientCoreTests.sent(second.takeActions())
        let order = sent.compactMap { m -> String? in
            if m.contains(#""a":"auth""#) { return "auth" }
            for p in ["/signed", "/anonymous", "/later"] where m.contains(#""p":"\#(p)""#) { return p }
            return nil
        }
        #expect(order == ["auth", "/signed", "/anonymous", "/later"], "\(sent)")

        // Restored writes made signed out do not wait.
        let unsigned = ClientStore.StoredWrite(number: 1, kind: .set, path: Self.path("/x"), json: Array("1".utf8))
        let plainFile = Self.file([.identity(client: 5, nextNumber: 2), .write(unsigned)])
        var third = ClientCore(nodeCount: 1, seed: 3, persistence: true, restored: try #require(ClientStore.restore(plainFile)))
        third.tick(now: 10)
        _ = third.takeActions()
        third.received(ClientCoreTests.hello())
        #expect(ClientCoreTests.sent(third.takeActions()).contains { $0.contains(#""p":"/x""#) })
    }
}
