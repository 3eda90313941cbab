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
        // A version-2 image: no sessions, so the only differences are the magic and the queue
        // count, lease count and expired-holder count at the end.
        let plain = StateMachine(namespaces: ["ns": log.machine.tree("ns")], appliedIndex: 4).image()
        let version2 = Array("BNYSM002".utf8) + plain[8..<(plain.count - 24)]
        let old = try StateMachine(image: Array(version2))
        #expect(old.tree("ns") == log.machine.tree("ns") && old.disconnects.isEmpty && old.appliedIndex == 4)
        // A version-2 image with a session: no ended byte after it.
        func le(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: v >> UInt64(8 * $0)) } }
        let withSession = Array("BNYSM002".utf8) + le(9) + le(5) + le(1) + le(77) + le(3) + le(1) + le(5) + le(0)
        let loaded = try StateMachine(image: withSession)
        #expect(loaded.sessions[77] == SessionRecord(contiguous: 3, above: [5]) && loaded.appliedIndex == 9)
    }

    @Test("node leases: a renewal records the holder; an expiry naming its latest renewal fires the holder's queues in that namespace and ends their connections; nothing applies under the holder afterwards")
    func leases() throws {
        var log = Log()
        let holder: UInt64 = 0xAB
        #expect(log.apply(.renewLease(holder: holder, node: 2), session: 900, namespace: "$leases")?.outcome == .ok)
        #expect(log.machine.leases[holder] == StateMachine.Lease(node: 2, renewedIndex: 1))
        #expect(log.apply(.onDisconnectSet(path: "/p/a", json: Self.bytes("\"off\""), secret: 1, holder: holder), session: 11)?.outcome == .ok)
        #expect(log.apply(.onDisconnectSet(path: "/p/b", json: Self.bytes("\"off\""), secret: 2, holder: holder), session: 12)?.outcome == .ok)
        #expect(log.apply(.onDisconnectSet(path: "/p/c", json: Self.bytes("\"off\""), secret: 3, holder: 0xCD), session: 13)?.outcome == .ok)
        #expect(log.apply(.onDisconnectSet(path: "/q", json: Self.bytes("1"), secret: 4, holder: holder), session: 14, namespace: "other")?.outcome == .ok)
        #expect(log.machine.queuedHolders[holder] == ["ns": 2, "other": 1] && log.machine.queuedHolders[0xCD] == ["ns": 1])
        // A connection keeps the holder it registered under.
        guard case .refused? = log.apply(.onDisconnectSet(path: "/p/a2", json: Self.bytes("1"), secret: 1, holder: 0xEE), session: 11)?.outcome else {
            Issue.record("a connection's queue changed holder")
            return
        }
        // The holder renewed again (index 7): an expiry counted from the first renewal is refused.
        #expect(log.apply(.renewLease(holder: holder, node: 2), session: 900, namespace: "$leases")?.outcome == .ok)
        guard case .refused? = log.apply(.expireHolder(holder: holder, lastRenewal: 1), session: 901)?.outcome else {
            Issue.record("an expiry applied although the holder renewed since")
            return
        }
        #expect(log.json("/p") == "null")
        // Counted from the latest renewal: both queues of the holder in "ns" fire, the other
        // holder's stays, the other namespace waits for its own expiry.
        let expiry = log.apply(.expireHolder(holder: holder, lastRenewal: 7), session: 901)
        let expired = try #require(expiry)
        #expect(expired.outcome == .ok && expired.written.map(\.description) == ["/p/a", "/p/b"])
        #expect(log.json("/p") == #"{"a":"off","b":"off"}"#)
        #expect(log.machine.sessions[11]?.ended == true && log.machine.sessions[12]?.ended == true)
        #expect(log.machine.expiredHolders == [holder] && log.machine.leases[holder] == nil)
        #expect(log.machine.queuedHolders[holder] == ["other": 1] && log.machine.disconnects[13] != nil)
        // The same holder in the other namespace: no renewal check any more.
        #expect(log.apply(.expireHolder(holder: holder, lastRenewal: 0), session: 901, namespace: "other")?.written.map(\.description) == ["/q"])
        #expect(log.machine.queuedHolders[holder] == nil)
        // Nothing applies under the expired holder again: a renewal, a registration.
        guard case .refused? = log.apply(.renewLease(holder: holder, node: 2), session: 900, namespace: "$leases")?.outcome,
            case .refused? = log.apply(.onDisconnectSet(path: "/p/z", json: Self.bytes("1"), secret: 5, holder: holder), session: 15)?.outcome
        else {
            Issue.record("a command applied under an expired holder")
            return
        }
        // Writes of an expired connection are refused (it ended), as after connectionEnded.
        guard case .refused? = log.apply(.set(path: "/p/a", json: Self.bytes("\"on\"")), session: 11)?.outcome else {
            Issue.record("a write of an expired connection applied")
            return
        }
        // Leases, expired holders and queue holders survive the image; the derived counts are rebuilt.
        let restored = try StateMachine(image: log.machine.image())
        #expect(restored.leases == log.machine.leases && restored.expiredHolders == log.machine.expiredHolders)
        #expect(restored.disconnects == log.machine.disconnects && restored.queuedHolders == log.machine.queuedHolders)
        #expect(restored.disconnects[13]?.holder == 0xCD)
        // A version-3 image with a queue (written before holders and leases): made from a
        // version-4 one by taking out the queue's holder and the two counts at the end.
        var v3log = Log()
        let secret: UInt64 = 0xDEAD_BEEF_CAFE_F00D
        _ = v3log.apply(.onDisconnectSet(path: "/x/y", json: Self.bytes(#"{"a":1}"#), secret: secret), session: 21)
        let v4 = v3log.machine.image()
        let secretBytes = (0..<8).map { UInt8(truncatingIfNeeded: secret >> UInt64(8 * $0)) }
        let at = try #require((0...(v4.count - 8)).first { Array(v4[$0..<($0 + 8)]) == secretBytes })
        var v3image = Array("BNYSM003".utf8) + v4[8..<(at + 8)] + v4[(at + 16)...]
        v3image.removeLast(16)
        let old = try StateMachine(image: v3image)
        #expect(old.disconnects[21] == DisconnectQueue(namespace: "ns", secret: secret, holder: 0, tree: v3log.machine.disconnects[21]?.tree ?? OnDisconnectTree()))
        #expect(old.queuedHolders == [0: ["ns": 1]] && old.leases.isEmpty && old.expiredHolders.isEmpty)
        // A version-3 payload (before holders) still decodes, with holder 0.
        var v3 = CommandEnvelope(namespace: "ns", session: 1, seq: 1, timestamp: 0, command: .onDisconnectSet(path: "/a", json: Self.bytes("1"), secret: 9)).encoded()
        v3[0] = 3
        v3.removeLast(8)
        #expect(CommandEnvelope(decoding: v3)?.command == .onDisconnectSet(path: "/a", json: Self.bytes("1"), secret: 9, holder: 0))
        for command in [Command.renewLease(holder: 5, node: 6), .expireHolder(holder: 5, lastRenewal: 77)] {
            let e = CommandEnvelope(namespace: "$leases", session: 1, seq: 2, timestamp: 3, command: command)
            #expect(CommandEnvelope(decoding: e.encoded()) == e && e.encoded().count == e.byteCount)
        }
    }
}
