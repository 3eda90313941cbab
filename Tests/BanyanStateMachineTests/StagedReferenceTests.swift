import BanyanBasics
import BanyanStateMachine
import Testing

/// The reference entry that stands for a staged payload (docs/staged-payloads.md).
@Suite struct StagedReferenceTests {
    @Test("a reference round-trips, carries its payload's header and timestamp, and no command reads as one")
    func roundTrip() throws {
        let envelope = CommandEnvelope(
            namespace: "app", session: 0xABCD, seq: 42, timestamp: 1_700_000_000_123, settledBelow: 40, ordered: true,
            command: .set(path: "/a", json: Array("{\"x\":1}".utf8)))
        let payload = envelope.encoded()
        let reference = try #require(StagedReference(id: StageID(term: 4, n: 9), payload: payload, checksum: 0x1234_5678))
        #expect(reference.session == 0xABCD && reference.seq == 42 && reference.ordered && reference.timestamp == 1_700_000_000_123)
        #expect(reference.length == UInt64(payload.count))
        let bytes = reference.encoded()
        #expect(bytes.count == StagedReference.encodedSize)
        #expect(StagedReference(decoding: bytes) == reference)
        #expect(StagedReference.isReference(bytes) && !StagedReference.isReference(payload))
        #expect(CommandEnvelope.timestamp(of: bytes) == 1_700_000_000_123)
        #expect(StagedReference(decoding: payload) == nil)
        // Wrong sizes and flags are refused.
        #expect(StagedReference(decoding: Array(bytes.dropLast())) == nil)
        #expect(StagedReference(decoding: bytes + [0]) == nil)
        var flags = bytes
        flags[45] = 2
        #expect(StagedReference(decoding: flags) == nil)
        // The state machine never applies a reference as a command.
        #expect(CommandEnvelope(decoding: bytes) == nil)
        var machine = StateMachine()
        #expect(machine.apply(bytes, index: 1)?.outcome == .malformed)
        // Only commands are staged.
        #expect(StagedReference(id: StageID(term: 1, n: 1), payload: [1, 2, 3], checksum: 0) == nil)
    }
}
