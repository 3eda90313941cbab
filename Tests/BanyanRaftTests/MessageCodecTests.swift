import BanyanBasics
import BanyanRaft
import Testing

@Suite struct MessageCodecTests {
    static let membership = Membership(voters: [1, 2, UInt64.max], learners: [7])

    static func samples() -> [Message] {
        let entries = [
            LogEntry(index: 1, term: 1, kind: .config(membership)), LogEntry(index: 2, term: 2, kind: .noop),
            LogEntry(index: 3, term: 2, kind: .command, data: [0, 255, 7]), LogEntry(index: UInt64.max, term: 9, kind: .command),
        ]
        let meta = SnapshotMeta(index: 40, term: 3, membership: membership)
        let bodies: [Message.Body] = [
            .preVote(lastIndex: 5, lastTerm: 2), .preVoteResponse(granted: true), .vote(lastIndex: 0, lastTerm: 0, leaderTransfer: true),
            .voteResponse(granted: false), .append(prevIndex: 4, prevTerm: 2, entries: entries, commit: 3),
            .append(prevIndex: 0, prevTerm: 0, entries: [], commit: 0), .appendAccepted(index: UInt64.max),
            .appendRejected(rejectedIndex: 9, hintIndex: 4, hintTerm: 1), .heartbeat(commit: 8, readSeq: 12), .heartbeatResponse(readSeq: 12),
            .snapshotChunk(meta: meta, offset: 1 << 20, data: [1, 2, 3], last: true),
            .snapshotChunk(meta: SnapshotMeta(index: 1, term: 1, membership: .empty), offset: 0, data: [], last: false),
            .snapshotResponse(snapshotIndex: 40, nextOffset: 3), .proposal(commands: [[], [1], [2, 3]]), .readIndex(context: 77),
            .readIndexResponse(context: 77, index: 40), .timeoutNow,
        ]
        return bodies.enumerated().map { i, body in Message(from: UInt64(i + 1), to: UInt64.max - UInt64(i), term: UInt64(i) * 1000, body: body) }
    }

    @Test("every message kind round-trips; every strict prefix and a trailing byte are refused")
    func roundTrip() throws {
        for m in Self.samples() {
            let bytes = MessageCodec.encode(m)
            #expect(try MessageCodec.decode(bytes) == m)
            for cut in 0..<bytes.count {
                #expect(throws: WireError.self, "prefix \(cut) of \(m.body)") { try MessageCodec.decode(Array(bytes[0..<cut])) }
            }
            #expect(throws: WireError.self) { try MessageCodec.decode(bytes + [0]) }
        }
    }

    @Test("hostile counts fail fast without allocating; bad booleans, kinds and versions are refused")
    func hostile() throws {
        var append = MessageCodec.encode(Message(from: 1, to: 2, term: 3, body: .append(prevIndex: 0, prevTerm: 0, entries: [], commit: 0)))
        // The entry count is the last 8 bytes: claim 2^62 entries.
        for i in 0..<8 { append[append.count - 8 + i] = i == 7 ? 0x40 : 0 }
        #expect(throws: WireError.tooLarge(field: "entries", count: 1 << 62)) { try MessageCodec.decode(append) }
        var vote = MessageCodec.encode(Message(from: 1, to: 2, term: 3, body: .voteResponse(granted: true)))
        vote[vote.count - 1] = 2
        #expect(throws: WireError.badValue(field: "granted")) { try MessageCodec.decode(vote) }
        var kind = vote
        kind[1] = 99
        #expect(throws: WireError.unknownKind(99)) { try MessageCodec.decode(kind) }
        var version = vote
        version[0] = 2
        #expect(throws: WireError.unknownVersion(2)) { try MessageCodec.decode(version) }
    }

    @Test("random bytes never crash the decoder; random valid messages round-trip")
    func randomized() throws {
        var rng = SeededRandom(seed: 4242)
        let samples = Self.samples()
        for _ in 0..<2000 {
            var bytes = (0..<rng.below(80)).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
            if rng.chance(1, in: 2), let base = samples.randomElement(using: &rng) {
                // Mutate a valid message instead: flips and cuts reach deeper into the decoder.
                bytes = MessageCodec.encode(base)
                for _ in 0..<3 where !bytes.isEmpty { bytes[rng.below(bytes.count)] ^= UInt8(truncatingIfNeeded: rng.next() | 1) }
            }
            _ = try? MessageCodec.decode(bytes)
        }
        for _ in 0..<500 {
            let entries = (0..<rng.below(4)).map { i in
                LogEntry(index: rng.next(), term: rng.next(), kind: rng.chance(1, in: 3) ? .noop : .command, data: (0..<rng.below(20)).map { _ in UInt8(truncatingIfNeeded: rng.next()) })
            }
            let m = Message(from: rng.next(), to: rng.next(), term: rng.next(), body: .append(prevIndex: rng.next(), prevTerm: rng.next(), entries: entries, commit: rng.next()))
            #expect(try MessageCodec.decode(MessageCodec.encode(m)) == m)
        }
    }

    @Test("the peer hello and its reply round-trip; wrong magic and truncations are refused")
    func hello() throws {
        let h = PeerHello(clusterID: "prod", from: 2, to: 3, protocolVersion: 1, address: "10.0.0.2:7000")
        #expect(try PeerHello.decode(h.encode()) == h)
        let r = PeerHelloReply(accepted: false, reason: "cluster id 'x' is not 'prod'", protocolVersion: 1)
        #expect(try PeerHelloReply.decode(r.encode()) == r)
        #expect(throws: WireError.badMagic) { try PeerHello.decode(r.encode()) }
        let bytes = h.encode()
        for cut in 0..<bytes.count { #expect(throws: WireError.self) { try PeerHello.decode(Array(bytes[0..<cut])) } }
    }
}
