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
