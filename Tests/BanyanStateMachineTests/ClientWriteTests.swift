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
