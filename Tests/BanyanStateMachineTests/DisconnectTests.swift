import BanyanBasics
@testable import BanyanStateMachine
import BanyanTree
import Testing

/// onDisconnect in the replicated state machine (docs/realtime.md, "onDisconnect"): queued per
/// connection, fired once through the log as one update, refused afterwards.
@Suite struct DisconnectTests {
    static let secret: UInt64 = 0x5EC2_E7

    struct Log {
        var machine = StateMachine()
        var index: UInt64 = 0
        var seqs: [UInt64: UInt64] = [:]

        mutating func apply(_ command: Command, session: UInt64, namespace: String = "ns", at time: Int64 = 1_000) -> StateMachine.Applied? {
            index += 1
            seqs[session, default: 0] += 1
            let payload = CommandEnvelope(namespace: namespace, session: session, seq: seqs[session] ?? 1, timestamp: time, command: command).encoded()
            return machine.apply(payload, index: index)
        }

        func json(_ path: String) -> String {
            do { return JSONWriter.string(machine.tree("ns").child(at: try Path(parsing: path))) } catch { return "bad path" }
        }
    }

    static func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

    @Test("queued writes fire once, as one update with server values resolved when the connection ends; the connection's later commands are refused")
    func firesOnce() throws {
        var log = Log()
        #expect(log.apply(.set(path: "/users/u1", json: Self.bytes(#"{"online":true}"#)), session: 7)?.outcome == .ok)
        #expect(log.apply(.onDisconnectSet(path: "/users/u1/online", json: Self.bytes("false"), secret: Self.secret), session: 7)?.outcome == .ok)
        let om = Command.onDisconnectUpdate(
            path: "/users/u1", entries: [.init(path: "seen", json: Self.bytes(#"{".sv":"timestamp"}"#)), .init(path: "n", json: Self.bytes("1"))],
            secret: Self.secret)
        #expect(log.apply(om, session: 7)?.outcome == .ok)
        #expect(log.json("/users/u1") == #"{"online":true}"#, "nothing runs before the connection ends")
        #expect(log.machine.disconnects[7]?.tree.entries.count == 3)
        // Another node ends the connection (its own session, 99), at a later time.
        let endedApplied = log.apply(.connectionEnded(connection: 7, secret: Self.secret), session: 99, namespace: "", at: 5_000)
        let ended = try #require(endedApplied)
        #expect(ended.outcome == .ok && ended.namespace == "ns")
        #expect(ended.written.map(\.description).sorted() == ["/users/u1/n", "/users/u1/online", "/users/u1/seen"])
        #expect(log.json("/users/u1") == #"{"n":1,"online":false,"seen":5000}"#)
        #expect(log.machine.disconnects[7] == nil)
        // Never twice: a second end (a retry of the holder, or an `ls` from a reconnect) does nothing.
        _ = log.apply(.set(path: "/users/u1/online", json: Self.bytes("true")), session: 8)
        let again = log.apply(.connectionEnded(connection: 7, secret: Self.secret), session: 100, namespace: "")
        #expect(again?.outcome == .ok && again?.written == [])
        #expect(log.json("/users/u1/online") == "true")
        // Anything the ended connection still sends is refused, never applied.
        guard case .refused? = log.apply(.set(path: "/users/u1/online", json: Self.bytes("false")), session: 7)?.outcome else {
            Issue.record("a write of an ended connection applied")
            return
        }
        guard case .refused? = log.apply(.onDisconnectSet(path: "/x", json: Self.bytes("1"), secret: Self.secret), session: 7)?.outcome else {
            Issue.record("an ended connection queued a write")
            return
        }
        #expect(log.json("/users/u1/online") == "true" && log.machine.disconnects.isEmpty)
    }

    @Test("cancel forgets what is queued at or below a path; a wrong secret or a second namespace is refused; a connection without a queue just ends")
    func cancelAndRefusals() throws {
        var log = Log()
        _ = log.apply(.onDisconnectSet(path: "/a", json: Self.bytes(#"{"x":1,"y":2}"#), secret: Self.secret), session: 3)
        #expect(log.apply(.onDisconnectCancel(path: "/a/x", secret: Self.secret), session: 3)?.outcome == .ok)
        #expect(log.machine.disconnects[3]?.tree.entries.map { $0.path } == [["a", "y"]])
        guard case .refused? = log.apply(.onDisconnectSet(path: "/b", json: Self.bytes("1"), secret: 1), session: 3)?.outcome else {
            Issue.record("a second secret was accepted")
            return
        }
        guard case .refused? = log.apply(.onDisconnectSet(path: "/b", json: Self.bytes("1"), secret: Self.secret), session: 3, namespace: "other")?.outcome else {
            Issue.record("a second namespace was accepted")
            return
        }
        guard case .refused? = log.apply(.connectionEnded(connection: 3, secret: 1), session: 50)?.outcome else {
            Issue.record("a connection ended with the wrong secret")
            return
        }
        #expect(log.machine.sessions[3]?.ended != true && log.machine.disconnects[3] != nil)
        #expect(log.apply(.onDisconnectCancel(path: "/", secret: Self.secret), session: 3)?.outcome == .ok)
        #expect(log.machine.disconnects[3] == nil, "an empty queue is dropped")
        #expect(log.apply(.connectionEnded(connection: 3, secret: 77), session: 50)?.outcome == .ok)
        #expect(log.machine.sessions[3]?.ended == true)
        // Invalid paths and values are refused at registration, not when they would fire.
        var fresh = Log()
        guard case .rejected? = fresh.apply(.onDisconnectSet(path: "/a/$b", json: Self.bytes("1"), secret: 1), session: 4)?.outcome,
            case .rejected? = fresh.apply(.onDisconnectSet(path: "/a", json: Self.bytes(#"{"x":}"#), secret: 1), session: 4)?.outcome,
            case .rejected? = fresh.apply(.onDisconnectSet(path: "/a", json: Self.bytes(#"{".sv":"nope"}"#), secret: 1), session: 4)?.outcome
        else {
            Issue.record("an invalid registration was accepted")
            return
        }
        #expect(fresh.machine.disconnects.isEmpty)
    }

    @Test("a connection may queue at most maxQueuedEntries writes and maxQueuedBytes; setting one path again and again stays within them")
    func limits() throws {
        var log = Log()
        for i in 0..<StateMachine.maxQueuedEntries {
            #expect(log.apply(.onDisconnectSet(path: "/k/\(i)", json: Self.bytes("1"), secret: 1), session: 5)?.outcome == .ok)
        }
        guard case .rejected(let error)? = log.apply(.onDisconnectSet(path: "/k/x", json: Self.bytes("1"), secret: 1), session: 5)?.outcome else {
            Issue.record("the entry limit was not enforced")
            return
        }
        #expect(error.code == .inputTooLarge)
        // Replacing an existing entry does not grow the queue.
        #expect(log.apply(.onDisconnectSet(path: "/k/3", json: Self.bytes("2"), secret: 1), session: 5)?.outcome == .ok)
        var big = Log()
        let chunk = "\"" + String(repeating: "x", count: 100_000) + "\""
        for _ in 0..<50 {
            #expect(big.apply(.onDisconnectSet(path: "/same", json: Self.bytes(chunk), secret: 1), session: 6)?.outcome == .ok)
        }
        var filled = 0
        while big.apply(.onDisconnectSet(path: "/n\(filled)", json: Self.bytes(chunk), secret: 1), session: 6)?.outcome == .ok { filled += 1 }
        #expect(filled >= 8 && filled <= 10, "\(filled) more 100 kB values fit in 1 MiB")
    }

    @Test("an update's entries count with their whole paths; a cancel that splits a queued value is counted exactly again")
    func accounting() throws {
        var log = Log()
        // 1,000 values of 402 bytes under a 700-byte base: 400 kB of values, but each entry is
        // stored with its whole path, 1.1 MB in all.
        let base = "/" + String(repeating: "p", count: 700)
        let value = Self.bytes("\"" + String(repeating: "v", count: 400) + "\"")
        let items = (0..<1_000).map { Command.UpdateItem(path: "k\($0)", json: value) }
        guard case .rejected(let e)? = log.apply(.onDisconnectUpdate(path: base, entries: items, secret: 1), session: 3)?.outcome else {
            Issue.record("700 kB of paths were not counted")
            return
        }
        #expect(e.code == .inputTooLarge)
        // One queued object of 500 members, then a cancel below it: 499 entries, counted.
        let members = (0..<500).map { "\"m\($0)\":\($0)" }.joined(separator: ",")
        #expect(log.apply(.onDisconnectSet(path: "/o", json: Self.bytes("{" + members + "}"), secret: 1), session: 4)?.outcome == .ok)
        #expect(log.apply(.onDisconnectCancel(path: "/o/m0", secret: 1), session: 4)?.outcome == .ok)
        #expect(log.machine.disconnects[4]?.tree.entries.count == 499)
        #expect(log.machine.disconnects[4]?.entryBound == 499)
        // 501 more would pass 1,000 entries.
        let more = (0..<502).map { Command.UpdateItem(path: "n\($0)", json: Self.bytes("1")) }
        guard case .rejected? = log.apply(.onDisconnectUpdate(path: "/q", entries: more, secret: 1), session: 4)?.outcome else {
            Issue.record("the split entries were not counted")
            return
        }
    }

    @Test("queues and ended flags survive the snapshot image; a version-2 image (before queues) still loads")
    func image() throws {
        var log = Log()
        _ = log.apply(.onDisconnectSet(path: "/a/b", json: Self.bytes(#"{"v":{".sv":"timestamp"},"é":[1,2]}"#), secret: 9), session: 1)
        _ = log.apply(.onDisconnectSet(path: "/c", json: Self.bytes("null"), secret: 8), session: 2)
        _ = log.apply(.set(path: "/z", json: Self.bytes("1")), session: 3)
        _ = log.apply(.connectionEnded(connection: 2, secret: 8), session: 3)
        let bytes = log.machine.image()
        let restored = try StateMachine(image: bytes)
        #expect(restored.disconnects == log.machine.disconnects)
        #expect(restored.sessions == log.machine.sessions && restored.sessions[2]?.ended == true)
        #expect(restored.tree("ns") == log.machine.tree("ns"))
        #expect(restored.image() == bytes)
        for cut in stride(from: 0, to: bytes.count, by: 5) {
            #expect(throws: StateMachine.ImageError.self) { try StateMachine(image: Array(bytes[0..<cut])) }
        }
        // A version-2 image: no sessions, so the only differences are the magic and the queue count.
        let plain = StateMachine(namespaces: ["ns": log.machine.tree("ns")], appliedIndex: 4).image()
        let version2 = Array("BNYSM002".utf8) + plain[8..<(plain.count - 8)]
        let old = try StateMachine(image: Array(version2))
        #expect(old.tree("ns") == log.machine.tree("ns") && old.disconnects.isEmpty && old.appliedIndex == 4)
        // A version-2 image with a session: no ended byte after it.
        func le(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: v >> UInt64(8 * $0)) } }
        let withSession = Array("BNYSM002".utf8) + le(9) + le(5) + le(1) + le(77) + le(3) + le(1) + le(5) + le(0)
        let loaded = try StateMachine(image: withSession)
        #expect(loaded.sessions[77] == SessionRecord(contiguous: 3, above: [5]) && loaded.appliedIndex == 9)
    }
}
