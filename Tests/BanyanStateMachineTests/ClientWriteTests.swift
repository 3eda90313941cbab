import BanyanStateMachine
import BanyanTree
import Testing

/// Client writes (command version 9): a write an SDK names with its client id and write number
/// is decided at most once whatever session carries it, a later copy is answered with the first
/// copy's outcome, and the record survives snapshots and stays bounded.
@Suite struct ClientWriteTests {
    struct Log {
        var machine = StateMachine()
        var index: UInt64 = 0
        var seqs: [UInt64: UInt64] = [:]

        mutating func apply(
            _ command: Command, session: UInt64, key: ClientWriteKey?, timestamp: Int64 = 1_000, ordered: Bool = false
        ) -> StateMachine.Outcome? {
            let seq = (seqs[session] ?? 0) + 1
            seqs[session] = seq
            index += 1
            let envelope = CommandEnvelope(
                namespace: "app", session: session, seq: seq, timestamp: timestamp, ordered: ordered, command: command, clientWrite: key)
            return machine.apply(envelope.encoded(), index: index)?.outcome
        }

        func value(_ path: String) -> Tree { machine.tree("app").child(at: (try? Path(parsing: path)) ?? .root) }
    }

    static let increment = Command.set(path: "/n", json: Array(#"{".sv":{"increment":1}}"#.utf8))

    @Test("version 9 round-trips; only data writes may carry a key; a zero client or number is damage")
    func encoding() throws {
        let key = ClientWriteKey(client: 0xABCD, number: 7, acknowledgedBelow: 5)
        let envelope = CommandEnvelope(namespace: "app", session: 3, seq: 1, timestamp: 9, ordered: true, command: Self.increment, clientWrite: key)
        let bytes = envelope.encoded()
        #expect(bytes[0] == 9)
        #expect(CommandEnvelope(decoding: bytes) == envelope)
        // Without a key the same command is written as before (version 3).
        var plain = envelope
        plain.clientWrite = nil
        plain.ordered = false
        #expect(plain.encoded()[0] == 3)
        // A key on a command that cannot take one is not written (version as before) ...
        var cancel = envelope
        cancel.command = .onDisconnectCancel(path: "/x", secret: 1)
        #expect(cancel.encoded()[0] != 9)
        // ... and a version-9 payload of such a kind, or with client 0, does not decode.
        var forged = bytes
        forged[1] = (forged[1] & 0x80) | 6
        #expect(CommandEnvelope(decoding: forged) == nil)
        var zero = envelope
        zero.clientWrite = ClientWriteKey(client: 0, number: 1, acknowledgedBelow: 1)
        #expect(CommandEnvelope(decoding: zero.encoded()) == nil)
    }

    @Test("the same client write through two sessions applies once; the second copy is answered ok without applying")
    func appliedOnce() {
        var log = Log()
        let key = ClientWriteKey(client: 42, number: 1, acknowledgedBelow: 1)
        #expect(log.apply(Self.increment, session: 100, key: key) == .ok)
        #expect(log.apply(Self.increment, session: 200, key: key) == .alreadyApplied(.ok))
        #expect(log.value("/n") == Tree(.int(1)))
        // Another client's write with the same number is its own.
        #expect(log.apply(Self.increment, session: 200, key: ClientWriteKey(client: 43, number: 1, acknowledgedBelow: 1)) == .ok)
        #expect(log.value("/n") == Tree(.int(2)))
    }

    @Test("a failure is remembered: a resent compare-and-set that was stale is stale again, without being decided against newer data")
    func failureRemembered() {
        var log = Log()
        #expect(log.apply(.set(path: "/v", json: Array("1".utf8)), session: 1, key: nil) == .ok)
        let cas = Command.compareAndSet(path: "/v", expectedHash: Tree(.int(5)).hashString, json: Array("6".utf8))
        let key = ClientWriteKey(client: 9, number: 1, acknowledgedBelow: 1)
        guard case .datastale = log.apply(cas, session: 10, key: key) else {
            Issue.record("expected datastale")
            return
        }
        // The data now matches the hash; the resend must still not apply (its first copy was
        // decided).
        #expect(log.apply(.set(path: "/v", json: Array("5".utf8)), session: 1, key: nil) == .ok)
        let again = log.apply(cas, session: 11, key: key)
        #expect(again == .alreadyApplied(ClientWriteOutcome(status: "datastale", message: "The transaction's hash does not match the current data.")))
        #expect(log.value("/v") == Tree(.int(5)))
        // Once the client acknowledges it, the failure is forgotten (and the number stays decided).
        #expect(log.apply(.set(path: "/w", json: Array("1".utf8)), session: 11, key: ClientWriteKey(client: 9, number: 2, acknowledgedBelow: 2)) == .ok)
        #expect(log.machine.tree(StateMachine.clientsNamespace).child(at: (try? Path(parsing: "/0000000000000009/f")) ?? .root).isEmpty)
        #expect(log.apply(cas, session: 12, key: key) == .alreadyApplied(.ok))
    }

    @Test("numbers decided out of order are absorbed; numbers below the acknowledgement count as decided; the window bounds what is remembered")
    func orderAndWindow() {
        var log = Log()
        for n: UInt64 in [3, 4, 1] {
            #expect(log.apply(.set(path: "/k\(n)", json: Array("\(n)".utf8)), session: 5, key: ClientWriteKey(client: 7, number: n, acknowledgedBelow: 1)) == .ok)
        }
        let record = log.machine.tree(StateMachine.clientsNamespace).child(at: (try? Path(parsing: "/0000000000000007")) ?? .root)
        #expect(record.child(at: (try? Path(parsing: "c")) ?? .root) == Tree(.int(1)))
        #expect(record.child(at: (try? Path(parsing: "a")) ?? .root).childCount == 2)
        #expect(log.apply(.set(path: "/k2", json: Array("2".utf8)), session: 5, key: ClientWriteKey(client: 7, number: 2, acknowledgedBelow: 1)) == .ok)
        let after = log.machine.tree(StateMachine.clientsNamespace).child(at: (try? Path(parsing: "/0000000000000007")) ?? .root)
        #expect(after.child(at: (try? Path(parsing: "c")) ?? .root) == Tree(.int(4)))
        #expect(after.child(at: (try? Path(parsing: "a")) ?? .root).isEmpty)
        // Beyond the window: refused, not remembered.
        let far = ClientWriteKey(client: 7, number: 4 + ClientWriteKey.window + 1, acknowledgedBelow: 5)
        guard case .rejected = log.apply(.set(path: "/far", json: Array("1".utf8)), session: 5, key: far) else {
            Issue.record("expected a refusal beyond the window")
            return
        }
        #expect(log.value("/far").isEmpty)
        #expect(log.apply(.set(path: "/edge", json: Array("1".utf8)), session: 5, key: ClientWriteKey(client: 7, number: 4 + ClientWriteKey.window, acknowledgedBelow: 5)) == .ok)
        // A number the client says it acknowledged is not decided again.
        #expect(log.apply(.set(path: "/old", json: Array("1".utf8)), session: 6, key: ClientWriteKey(client: 8, number: 3, acknowledgedBelow: 10)) == .alreadyApplied(.ok))
        #expect(log.value("/old").isEmpty)
    }

    @Test("a refused or ended connection's copy is not recorded, so the client's resend on its next connection applies")
    func refusedCopyDoesNotCount() {
        var log = Log()
        let key = ClientWriteKey(client: 77, number: 1, acknowledgedBelow: 1)
        // Connection 300 ends (its own end in its own session).
        #expect(log.apply(.connectionEnded(connection: 300, secret: 0), session: 300, key: nil) != nil)
        guard case .refused = log.apply(Self.increment, session: 300, key: key) else {
            Issue.record("an ended connection's write must be refused")
            return
        }
        #expect(log.apply(Self.increment, session: 301, key: key) == .ok)
        #expect(log.value("/n") == Tree(.int(1)))
    }

    @Test("client write records survive a snapshot image")
    func survivesImage() throws {
        var log = Log()
        let key = ClientWriteKey(client: 5, number: 1, acknowledgedBelow: 1)
        #expect(log.apply(Self.increment, session: 1, key: key) == .ok)
        var restored = Log()
        restored.machine = try StateMachine(image: log.machine.image())
        restored.index = log.index
        #expect(restored.apply(Self.increment, session: 2, key: key) == .alreadyApplied(.ok))
        #expect(restored.value("/n") == Tree(.int(1)))
    }
}

/// Expiry of idle records: client write records after their client's idle retention, ended
/// connections' session records after theirs; oldest first, in bounded batches; due only when
/// the oldest entry is past its retention.
@Suite struct ExpiryTests {
    typealias Log = ClientWriteTests.Log

    @Test("idle client records and ended sessions expire after their retentions, oldest first; live ones stay")
    func expires() {
        var log = Log()
        let increment = ClientWriteTests.increment
        // Client 1 writes at t=1,000; client 2 at t=50,000; connection 300 ends at t=60,000.
        #expect(log.apply(increment, session: 1, key: ClientWriteKey(client: 1, number: 1, acknowledgedBelow: 1), timestamp: 1_000) == .ok)
        #expect(log.apply(increment, session: 2, key: ClientWriteKey(client: 2, number: 1, acknowledgedBelow: 1), timestamp: 50_000) == .ok)
        #expect(log.apply(.connectionEnded(connection: 300, secret: 0), session: 300, key: nil, timestamp: 60_000) != nil)
        #expect(log.machine.sessions[300]?.ended == true)
        // At t=60,000 with a 30 s client retention: client 1 is due, client 2 and the end not.
        #expect(log.machine.idleToExpire(clientsIdleMillis: 30_000, endedMillis: 30_000))
        #expect(!log.machine.idleToExpire(clientsIdleMillis: 70_000, endedMillis: 30_000))
        #expect(log.apply(.expireIdle(clientsIdleMillis: 30_000, endedMillis: 30_000), session: 9, key: nil, timestamp: 60_000) == .ok)
        // Client 1's number 1 is forgotten: a copy now applies again (what the retention trades).
        #expect(log.apply(increment, session: 3, key: ClientWriteKey(client: 1, number: 1, acknowledgedBelow: 1), timestamp: 60_001) == .ok)
        #expect(log.apply(increment, session: 3, key: ClientWriteKey(client: 2, number: 1, acknowledgedBelow: 1), timestamp: 60_002) == .alreadyApplied(.ok))
        #expect(log.machine.sessions[300]?.ended == true)
        // Later, the end expires too.
        #expect(log.apply(.expireIdle(clientsIdleMillis: 1_000_000, endedMillis: 30_000), session: 9, key: nil, timestamp: 95_000) == .ok)
        #expect(log.machine.sessions[300] == nil)
        #expect(!log.machine.idleToExpire(clientsIdleMillis: 1_000_000, endedMillis: 30_000))
        // The command round-trips (version 9, kind 13).
        let envelope = CommandEnvelope(session: 9, seq: 1, timestamp: 5, command: .expireIdle(clientsIdleMillis: 7, endedMillis: 8))
        #expect(envelope.encoded()[0] == 9 && CommandEnvelope(decoding: envelope.encoded()) == envelope)
    }

    @Test("one expiry removes at most a batch of each kind; the rest is due at once")
    func batches() {
        var log = Log()
        for c in UInt64(1)...UInt64(StateMachine.expiryBatch + 5) {
            _ = log.apply(.set(path: "/x", json: Array("1".utf8)), session: 1, key: ClientWriteKey(client: c, number: 1, acknowledgedBelow: 1), timestamp: 1_000)
        }
        #expect(log.apply(.expireIdle(clientsIdleMillis: 10, endedMillis: 10), session: 9, key: nil, timestamp: 100_000) == .ok)
        #expect(log.machine.tree(StateMachine.clientsNamespace).childCount == 5)
        #expect(log.machine.idleToExpire(clientsIdleMillis: 10, endedMillis: 10))
        #expect(log.apply(.expireIdle(clientsIdleMillis: 10, endedMillis: 10), session: 9, key: nil, timestamp: 100_000) == .ok)
        #expect(log.machine.tree(StateMachine.clientsNamespace).isEmpty && log.machine.idleIndexCounts.clients == 0)
    }
}

extension ExpiryTests {
    @Test("the indexes are rebuilt from an image: a machine loaded mid-run expires exactly what the live one does; a version-4 image's ended sessions count as ended at its last timestamp")
    func rebuiltFromImage() throws {
        var log = Log()
        for c in UInt64(1)...UInt64(30) {
            _ = log.apply(.set(path: "/c\(c)", json: Array("1".utf8)), session: 1, key: ClientWriteKey(client: c, number: 1, acknowledgedBelow: 1), timestamp: Int64(c) * 1_000)
        }
        for s in UInt64(100)...UInt64(120) {
            _ = log.apply(.connectionEnded(connection: s, secret: 0), session: s, key: nil, timestamp: Int64(s) * 500)
        }
        var reloaded = Log()
        reloaded.machine = try StateMachine(image: log.machine.image())
        reloaded.index = log.index
        reloaded.seqs = log.seqs
        #expect(reloaded.machine.idleIndexCounts == log.machine.idleIndexCounts && log.machine.idleIndexCounts == (30, 21))
        let expire = Command.expireIdle(clientsIdleMillis: 45_500, endedMillis: 5_750)
        #expect(log.apply(expire, session: 9, key: nil, timestamp: 61_000) == .ok)
        #expect(reloaded.apply(expire, session: 9, key: nil, timestamp: 61_000) == .ok)
        #expect(log.machine.image() == reloaded.machine.image())
        #expect(log.machine.idleIndexCounts == (15, 10))
        // A version-4 image (no end times): its ended sessions end at the image's time.
        let v5 = log.machine.image()
        let ended = try #require(log.machine.sessions[118])
        #expect(ended.ended && ended.endedAt == 59_000)
        var v4 = Array("BNYSM004".utf8) + v5[8...]
        // Take out every end time: after each session's ended byte 1 come 8 bytes of time.
        var out = Array(v4[0..<32])
        var at = 32
        let count = Int(log.machine.sessions.count)
        for _ in 0..<count {
            out += v4[at..<(at + 24)]
            let n = Int(v4[at + 16]) | Int(v4[at + 17]) << 8
            at += 24
            out += v4[at..<(at + 8 * n)]
            at += 8 * n
            let flag = v4[at]
            out.append(flag)
            at += 1
            if flag == 1 { at += 8 }
        }
        out += v4[at...]
        v4 = out
        let old = try StateMachine(image: v4)
        #expect(old.sessions[118]?.endedAt == old.lastTimestamp && old.idleIndexCounts.ended == 10)
    }
}
