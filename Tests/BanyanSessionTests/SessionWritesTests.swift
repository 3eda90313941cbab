import BanyanSession
import BanyanStateMachine
import BanyanTree
import Testing

/// v5 writes to state-machine commands, checked as REST checks them (`WriteValidation`).
@Suite struct SessionWritesTests {
    static func raw(_ json: String) -> RawValue {
        let message = Array(("{\"d\":" + json + "}").utf8)
        return RawValue(message: message, range: 5..<(message.count - 1))
    }

    static func write(_ text: String) throws -> WritePath { try WritePath(parsing: text) }
    static func path(_ text: String) throws -> Path { try Path(parsing: text) }

    @Test("p, p with a hash, m, o, om and oc become their commands with the client's own bytes; onDisconnect ones carry the secret")
    func commands() throws {
        #expect(SessionWrites.command(for: .put(try Self.write("/a/b"), Self.raw(#"{"x": 1.50}"#), hash: nil), secret: 9) == .success(.set(path: "/a/b", json: Array(#"{"x": 1.50}"#.utf8))))
        #expect(SessionWrites.command(for: .put(try Self.write("/a/.priority"), Self.raw("3"), hash: nil), secret: 9) == .success(.set(path: "/a/.priority", json: Array("3".utf8))))
        #expect(SessionWrites.command(for: .put(try Self.write("/c"), Self.raw("true"), hash: "abc="), secret: 9) == .success(.compareAndSet(path: "/c", expectedHash: "abc=", json: Array("true".utf8))))
        #expect(SessionWrites.command(for: .merge(try Self.path("/m"), Self.raw(#"{"x/y":1,"z":null}"#)), secret: 9)
            == .success(.update(path: "/m", entries: [.init(path: "x/y", json: Array("1".utf8)), .init(path: "z", json: Array("null".utf8))])))
        #expect(SessionWrites.command(for: .onDisconnectPut(try Self.write("/p/online"), Self.raw("false")), secret: 9)
            == .success(.onDisconnectSet(path: "/p/online", json: Array("false".utf8), secret: 9)))
        #expect(SessionWrites.command(for: .onDisconnectMerge(try Self.path("/p"), Self.raw(#"{"seen":{".sv":"timestamp"}}"#)), secret: 9)
            == .success(.onDisconnectUpdate(path: "/p", entries: [.init(path: "seen", json: Array(#"{".sv":"timestamp"}"#.utf8))], secret: 9)))
        #expect(SessionWrites.command(for: .onDisconnectCancel(try Self.path("/p")), secret: 9) == .success(.onDisconnectCancel(path: "/p", secret: 9)))
    }

    @Test("invalid writes are refused before they are proposed, with a failure status and the reason")
    func refusals() throws {
        func refused(_ write: SessionCore.Write) -> String? {
            if case .failure(let r) = SessionWrites.command(for: write, secret: 1), r.status == "failure" { return r.message }
            return nil
        }
        #expect(refused(.merge(try Self.path("/m"), Self.raw(#"{"a":1,"a/b":2}"#)))?.contains("overlap") == true)
        #expect(refused(.merge(try Self.path("/m"), Self.raw("5")))?.contains("object") == true)
        #expect(refused(.merge(try Self.path("/m"), Self.raw(#"{"a$":1}"#)))?.contains("Invalid key") == true)
        #expect(refused(.put(try Self.write("/a"), Self.raw(#"{".sv":"nope"}"#), hash: nil)) != nil)
        let deep = String(repeating: #"{"k":"#, count: 40) + "1" + String(repeating: "}", count: 40)
        #expect(refused(.put(try Self.write("/a"), Self.raw(deep), hash: nil)) != nil)
        #expect(refused(.put(try Self.write("/a/.priority"), Self.raw("1"), hash: "h")) != nil)
        #expect(refused(.onDisconnectPut(try Self.write("/a/.priority"), Self.raw("1"))) != nil)
    }

    @Test("outcomes become answers: ok with an empty string, datastale, failures with the reason (a duplicate too: its outcome is not known)")
    func answers() {
        #expect(SessionWrites.answer(.ok).status == "ok" && SessionWrites.answer(.ok).data == .string(""))
        #expect(SessionWrites.answer(.duplicate).status == "failure")
        #expect(SessionWrites.answer(.datastale(current: .empty)).status == "datastale")
        #expect(SessionWrites.answer(.refused("connection 7 has ended")) == ("failure", .string("connection 7 has ended")))
        #expect(SessionWrites.answer(.malformed).status == "failure")
    }
}

/// Multi-path updates over the realtime protocol have the same path limit as REST's.
@Suite struct SessionUpdateLimitTests {
    @Test("m and om with more paths than the limit are refused before they are proposed; at the limit they pass")
    func updatePathLimit() throws {
        let location = try Path(parsing: "rooms/r1")
        let body = { (n: Int) in SessionWritesTests.raw("{" + (0..<n).map { "\"k\($0)\": \($0)" }.joined(separator: ",") + "}") }
        for write in [SessionCore.Write.merge(location, body(11)), .onDisconnectMerge(location, body(11))] {
            guard case .failure(let refusal) = SessionWrites.command(for: write, secret: 1, maxUpdatePaths: 10) else {
                Issue.record("\(write) was accepted")
                continue
            }
            #expect(refusal.status == "failure")
            #expect(refusal.message == "Invalid data; a multi-path update may change at most 10 paths, and this one has more. Split it into several updates.")
        }
        for write in [SessionCore.Write.merge(location, body(10)), .onDisconnectMerge(location, body(10))] {
            guard case .success = SessionWrites.command(for: write, secret: 1, maxUpdatePaths: 10) else {
                Issue.record("\(write) at the limit was refused")
                continue
            }
        }
        // The default is REST's.
        guard case .failure = SessionWrites.command(for: .merge(location, body(WriteValidation.defaultMaxUpdatePaths + 1)), secret: 1) else {
            Issue.record("an update past the default limit was accepted")
            return
        }
    }
}

/// Inputs the fuzz targets found (Fuzz/, docs/testing.md "Fuzzing"); each failed before its fix.
@Suite struct SessionFuzzFindingTests {
    /// Fuzz target `websocket` (and `rest`, through the same `WriteValidation`): a merge (`m`,
    /// `om`) whose location and key path together exceed 32 levels was validated, proposed, and
    /// then refused by the state machine; it is refused before it is proposed.
    @Test("websocket: a merge key deeper than the limit once joined to its location is refused before it is proposed")
    func mergeDepthJoinedToLocation() throws {
        let location = try Path(parsing: (1...30).map { "l\($0)" }.joined(separator: "/"))
        for write in [
            SessionCore.Write.merge(location, SessionWritesTests.raw(#"{"a/b/c":null}"#)),
            .onDisconnectMerge(location, SessionWritesTests.raw(#"{"a/b/c":1}"#)),
        ] {
            guard case .failure(let refusal) = SessionWrites.command(for: write, secret: 1) else {
                Issue.record("\(write) was accepted")
                continue
            }
            #expect(refusal.message.contains("32"))
        }
        guard case .success(let command) = SessionWrites.command(for: .merge(location, SessionWritesTests.raw(#"{"a/b":null}"#)), secret: 1) else {
            Issue.record("32 levels in all were refused")
            return
        }
        var machine = StateMachine()
        let envelope = CommandEnvelope(namespace: "n", session: 1, seq: 1, timestamp: 1, command: command)
        #expect(machine.apply(envelope.encoded(), index: 1)?.outcome == .ok)
    }

    /// Fuzz target `websocket`: a priority write (`p`, `o`) or a merge's `.priority` key whose
    /// value is no priority was proposed, and refused in the log (`invalid_priority`).
    @Test("websocket: a value that is no priority, written at .priority, is refused before it is proposed")
    func invalidPriorityValue() throws {
        let priority = try SessionWritesTests.write("/a/.priority")
        for body in [#"{"x":1}"#, "[1]", "false"] {
            let writes: [SessionCore.Write] = [
                .put(priority, SessionWritesTests.raw(body), hash: nil),
                .merge(try SessionWritesTests.path("/a"), SessionWritesTests.raw(#"{"b/.priority":"# + body + "}")),
                .onDisconnectMerge(try SessionWritesTests.path("/a"), SessionWritesTests.raw(#"{"b/.priority":"# + body + "}")),
            ]
            for write in writes {
                guard case .failure = SessionWrites.command(for: write, secret: 1) else {
                    Issue.record("\(write) was accepted")
                    continue
                }
            }
        }
        guard case .success = SessionWrites.command(for: .put(priority, SessionWritesTests.raw("5"), hash: nil), secret: 1) else {
            Issue.record("a numeric priority was refused")
            return
        }
    }
}
