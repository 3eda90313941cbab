import BanyanBasics
import BanyanRaft
import Testing

@Suite struct MessageCodecTests {
    static let membership = Membership(voters: [1, 2, UInt64.max], learners: [7])
    static let learnersOnly = Membership(voters: [], learners: [0, 9])
    static let withIncarnations = Membership(voters: [1, 4], learners: [9], incarnations: [4: UInt64.max, 9: 1, 1: 0xABCD])

    static func samples() -> [Message] {
        let entries = [
            LogEntry(index: 1, term: 1, kind: .config(membership)), LogEntry(index: 2, term: 2, kind: .noop),
            LogEntry(index: 3, term: 2, kind: .command, data: [0, 255, 7]), LogEntry(index: UInt64.max, term: 9, kind: .command),
            LogEntry(index: 0, term: UInt64.max, kind: .config(.empty), data: [1]), LogEntry(index: 5, term: 5, kind: .config(learnersOnly)),
            LogEntry(index: 6, term: 5, kind: .config(withIncarnations), data: [3]),
        ]
        let meta = SnapshotMeta(index: 40, term: 3, membership: membership)
        let bodies: [Message.Body] = [
            .preVote(lastIndex: 5, lastTerm: 2), .preVote(lastIndex: UInt64.max, lastTerm: UInt64.max), .preVoteResponse(granted: true),
            .preVoteResponse(granted: false), .vote(lastIndex: 0, lastTerm: 0, leaderTransfer: true),
            .vote(lastIndex: 3, lastTerm: 1, leaderTransfer: false), .voteResponse(granted: false), .voteResponse(granted: true),
            .append(prevIndex: 4, prevTerm: 2, entries: entries, commit: 3), .append(prevIndex: 0, prevTerm: 0, entries: [], commit: 0),
            .append(prevIndex: UInt64.max, prevTerm: UInt64.max, entries: [LogEntry(index: 1, term: 1)], commit: UInt64.max),
            .appendAccepted(index: UInt64.max), .appendAccepted(index: 0, mayVote: false), .appendRejected(rejectedIndex: 9, hintIndex: 4, hintTerm: 1),
            .heartbeat(commit: 8, readSeq: 12, commitTerm: 3), .heartbeat(commit: 0, readSeq: UInt64.max), .heartbeatResponse(readSeq: 12), .heartbeatResponse(readSeq: 3, mayVote: false),
            .snapshotChunk(meta: meta, offset: 1 << 20, data: [1, 2, 3], last: true),
            .snapshotChunk(meta: SnapshotMeta(index: 1, term: 1, membership: .empty), offset: 0, data: [], last: false),
            .snapshotChunk(meta: SnapshotMeta(index: UInt64.max, term: 0, membership: learnersOnly), offset: UInt64.max, data: [0], last: true),
            .snapshotChunk(meta: SnapshotMeta(index: 7, term: 2, membership: withIncarnations), offset: 0, data: [5], last: false),
            .snapshotResponse(snapshotIndex: 40, nextOffset: 3), .proposal(commands: [[], [1], [2, 3]]), .proposal(commands: []),
            .readIndex(context: 77), .readIndexResponse(context: 77, index: 40), .readIndexResponse(context: UInt64.max, index: 0), .timeoutNow,
            .stage(id: StageID(term: 3, n: 1), payload: [9, 8, 7]), .stage(id: StageID(term: UInt64.max, n: UInt64.max), payload: []),
            .stageAck(id: StageID(term: 3, n: 1), checksum: 0xDEAD_BEEF, prepared: false),
            .stageAck(id: StageID(term: 3, n: 2), checksum: 0, prepared: true), .fetchStaged(id: StageID(term: 0, n: 0)),
            .stagedPayload(id: StageID(term: 7, n: 2), payload: [1]),
        ]
        return bodies.enumerated().map { i, body in Message(from: UInt64(i + 1), to: UInt64.max - UInt64(i), term: UInt64(i) * 1000, body: body) }
    }

    /// Decodes through every entry point; they must agree.
    static func decodeAll(_ bytes: [UInt8]) throws(WireError) -> Message {
        let m = try MessageCodec.decode(bytes)
        // A slice that does not start at index 0, as a frame inside a receive buffer does.
        let padded = [0xEE, 0xEE] + bytes + [0xEE]
        #expect(try MessageCodec.decode(padded[2..<2 + bytes.count]) == m)
        let raw = bytes.withUnsafeBytes { buffer in Result { () throws(WireError) in try MessageCodec.decode(buffer) } }
        #expect(raw == .success(m))
        return m
    }

    @Test("every message kind round-trips; every strict prefix and a trailing byte are refused")
    func roundTrip() throws {
        var kinds = Set<UInt8>()
        for m in Self.samples() {
            let bytes = MessageCodec.encode(m)
            kinds.insert(bytes[1])
            #expect(try Self.decodeAll(bytes) == m)
            var appended: [UInt8] = [9, 9]
            MessageCodec.encode(m, into: &appended)
            #expect(appended == [9, 9] + bytes)
            for cut in 0..<bytes.count {
                #expect(throws: WireError.self, "prefix \(cut) of \(m.body)") { try Self.decodeAll(Array(bytes[0..<cut])) }
            }
            #expect(throws: WireError.trailingBytes(1)) { try Self.decodeAll(bytes + [0]) }
        }
        #expect(kinds == Set(1...19))
    }

    @Test("the header is version, kind, then from, to and term little-endian")
    func headerLayout() {
        let bytes = MessageCodec.encode(Message(from: 0x0102, to: UInt64.max, term: 1 << 56, body: .timeoutNow))
        #expect(MessageCodec.version == 4)
        #expect(bytes == [4, 15, 2, 1, 0, 0, 0, 0, 0, 0] + [UInt8](repeating: 255, count: 8) + [0, 0, 0, 0, 0, 0, 0, 1])
    }

    /// Overwrites the u64 at `offset` (a count or length field) with `value`.
    static func patch(_ bytes: [UInt8], at offset: Int, _ value: UInt64) -> [UInt8] {
        var out = bytes
        for i in 0..<8 { out[offset + i] = UInt8(truncatingIfNeeded: value >> UInt64(8 * i)) }
        return out
    }

    @Test("hostile counts fail fast without allocating; bad booleans, kinds, versions and strings are refused")
    func hostile() throws {
        let header = 26
        let append = MessageCodec.encode(Message(from: 1, to: 2, term: 3, body: .append(prevIndex: 0, prevTerm: 0, entries: [], commit: 0)))
        // The entry count follows prevIndex, prevTerm and commit: claim 2^62 entries.
        #expect(throws: WireError.tooLarge(field: "entries", count: 1 << 62)) { try MessageCodec.decode(Self.patch(append, at: header + 24, 1 << 62)) }
        // A count the remaining bytes could hold as bytes but not as entries (25 bytes at least each).
        #expect(throws: WireError.tooLarge(field: "entries", count: 2)) {
            try MessageCodec.decode(Self.patch(append, at: header + 24, 2) + [UInt8](repeating: 0, count: 49))
        }
        // A count the bytes could hold, whose second entry is cut inside its data length: truncated.
        let first: [UInt8] = [UInt8](repeating: 0, count: 16) + [1] + [1, 0, 0, 0, 0, 0, 0, 0] + [42]
        let second: [UInt8] = [UInt8](repeating: 0, count: 16) + [1] + [0, 0, 0, 0, 0, 0, 0]
        #expect(throws: WireError.truncated(field: "entry data")) { try MessageCodec.decode(Self.patch(append, at: header + 24, 2) + first + second) }
        let proposal = MessageCodec.encode(Message(from: 1, to: 2, term: 3, body: .proposal(commands: [])))
        #expect(throws: WireError.tooLarge(field: "proposals", count: UInt64.max)) { try MessageCodec.decode(Self.patch(proposal, at: header, UInt64.max)) }
        let one = MessageCodec.encode(Message(from: 1, to: 2, term: 3, body: .proposal(commands: [[]])))
        #expect(throws: WireError.tooLarge(field: "proposal", count: 1 << 60)) { try MessageCodec.decode(Self.patch(one, at: header + 8, 1 << 60)) }
        let chunk = MessageCodec.encode(Message(from: 1, to: 2, term: 3, body: .snapshotChunk(meta: .none, offset: 0, data: [], last: false)))
        // Snapshot meta: index, term, voter count (at +16), learner count (at +24), incarnation
        // count (at +32); then offset, data length (at +48).
        #expect(throws: WireError.tooLarge(field: "voters", count: 1 << 60)) { try MessageCodec.decode(Self.patch(chunk, at: header + 16, 1 << 60)) }
        #expect(throws: WireError.tooLarge(field: "learners", count: 4)) { try MessageCodec.decode(Self.patch(chunk, at: header + 24, 4)) }
        #expect(throws: WireError.tooLarge(field: "incarnations", count: 2)) { try MessageCodec.decode(Self.patch(chunk, at: header + 32, 2)) }
        #expect(throws: WireError.tooLarge(field: "data", count: UInt64.max)) { try MessageCodec.decode(Self.patch(chunk, at: header + 48, UInt64.max)) }
        let withEntry = MessageCodec.encode(
            Message(from: 1, to: 2, term: 3, body: .append(prevIndex: 0, prevTerm: 0, entries: [LogEntry(index: 1, term: 1)], commit: 0)))
        #expect(throws: WireError.tooLarge(field: "entry data", count: 1 << 62)) {
            try MessageCodec.decode(Self.patch(withEntry, at: withEntry.count - 8, 1 << 62))
        }
        var badEntryKind = withEntry
        badEntryKind[badEntryKind.count - 9] = 4
        #expect(throws: WireError.badValue(field: "entry kind")) { try MessageCodec.decode(badEntryKind) }

        var vote = MessageCodec.encode(Message(from: 1, to: 2, term: 3, body: .voteResponse(granted: true)))
        vote[vote.count - 1] = 2
        #expect(throws: WireError.badValue(field: "granted")) { try MessageCodec.decode(vote) }
        var last = chunk
        last[last.count - 1] = 255
        #expect(throws: WireError.badValue(field: "last")) { try MessageCodec.decode(last) }
        var kind = vote
        kind[1] = 99
        #expect(throws: WireError.unknownKind(99)) { try MessageCodec.decode(kind) }
        kind[1] = 0
        #expect(throws: WireError.unknownKind(0)) { try MessageCodec.decode(kind) }
        var version = vote
        version[0] = MessageCodec.version + 1
        #expect(throws: WireError.unknownVersion(MessageCodec.version + 1)) { try MessageCodec.decode(version) }
        version[0] = 0
        #expect(throws: WireError.unknownVersion(0)) { try MessageCodec.decode(version) }
        #expect(throws: WireError.truncated(field: "version")) { try MessageCodec.decode([]) }
    }

    static func value(_ rng: inout SeededRandom) -> UInt64 {
        switch rng.below(4) {
        case 0: return 0
        case 1: return UInt64.max
        case 2: return UInt64(rng.below(100))
        default: return rng.next()
        }
    }

    static func bytes(_ rng: inout SeededRandom, max: Int = 20) -> [UInt8] {
        (0..<rng.below(max)).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
    }

    static func membership(_ rng: inout SeededRandom) -> Membership {
        Membership(voters: (0..<rng.below(4)).map { _ in value(&rng) }, learners: (0..<rng.below(3)).map { _ in value(&rng) })
    }

    static func entry(_ rng: inout SeededRandom) -> LogEntry {
        let kinds: [LogEntry.Kind] = [.command, .noop, .config(membership(&rng))]
        return LogEntry(index: value(&rng), term: value(&rng), kind: kinds[rng.below(3)], data: bytes(&rng))
    }

    /// A random message of any kind, with edge values mixed in.
    static func randomMessage(_ rng: inout SeededRandom) -> Message {
        let body: Message.Body
        switch rng.below(19) {
        case 0: body = .preVote(lastIndex: value(&rng), lastTerm: value(&rng), voterIncarnation: value(&rng))
        case 1: body = .preVoteResponse(granted: rng.chance(1, in: 2))
        case 2: body = .vote(lastIndex: value(&rng), lastTerm: value(&rng), leaderTransfer: rng.chance(1, in: 2), voterIncarnation: value(&rng))
        case 3: body = .voteResponse(granted: rng.chance(1, in: 2))
        case 4:
            let entries = (0..<rng.below(5)).map { _ in entry(&rng) }
            body = .append(prevIndex: value(&rng), prevTerm: value(&rng), entries: entries, commit: value(&rng))
        case 5: body = .appendAccepted(index: value(&rng), mayVote: rng.chance(1, in: 2))
        case 6: body = .appendRejected(rejectedIndex: value(&rng), hintIndex: value(&rng), hintTerm: value(&rng))
        case 7: body = .heartbeat(commit: value(&rng), readSeq: value(&rng), commitTerm: value(&rng))
        case 8: body = .heartbeatResponse(readSeq: value(&rng), mayVote: rng.chance(1, in: 2))
        case 9:
            let meta = SnapshotMeta(index: value(&rng), term: value(&rng), membership: membership(&rng))
            body = .snapshotChunk(meta: meta, offset: value(&rng), data: bytes(&rng, max: 64), last: rng.chance(1, in: 2))
        case 10: body = .snapshotResponse(snapshotIndex: value(&rng), nextOffset: value(&rng))
        case 11: body = .proposal(commands: (0..<rng.below(4)).map { _ in bytes(&rng) })
        case 12: body = .readIndex(context: value(&rng))
        case 13: body = .readIndexResponse(context: value(&rng), index: value(&rng))
        case 14: body = .stage(id: StageID(term: value(&rng), n: value(&rng)), payload: bytes(&rng, max: 64))
        case 15:
            body = .stageAck(id: StageID(term: value(&rng), n: value(&rng)), checksum: UInt32(truncatingIfNeeded: value(&rng)), prepared: rng.chance(1, in: 2))
        case 16: body = .fetchStaged(id: StageID(term: value(&rng), n: value(&rng)))
        case 17: body = .stagedPayload(id: StageID(term: value(&rng), n: value(&rng)), payload: bytes(&rng, max: 64))
        default: body = .timeoutNow
        }
        return Message(from: value(&rng), to: value(&rng), term: value(&rng), body: body)
    }

    @Test("random bytes never crash the decoder; random valid messages of every kind round-trip")
    func randomized() throws {
        var rng = SeededRandom(seed: 4242)
        let samples = Self.samples()
        var refused = 0
        for _ in 0..<2000 {
            var bytes = Self.bytes(&rng, max: 80)
            if rng.chance(1, in: 2) {
                // Mutate a valid message instead: flips and cuts reach deeper into the decoder.
                bytes = MessageCodec.encode(samples[rng.below(samples.count)])
                for _ in 0..<3 where !bytes.isEmpty { bytes[rng.below(bytes.count)] ^= UInt8(truncatingIfNeeded: rng.next() | 1) }
                if rng.chance(1, in: 4) { bytes.removeLast(rng.below(bytes.count + 1)) }
            }
            // Whatever happens, every entry point agrees (decodeAll checks) and nothing traps.
            if (try? Self.decodeAll(bytes)) == nil { refused += 1 }
        }
        #expect(refused > 1000)
        var kinds = Set<UInt8>()
        for _ in 0..<500 {
            let m = Self.randomMessage(&rng)
            let bytes = MessageCodec.encode(m)
            kinds.insert(bytes[1])
            #expect(try Self.decodeAll(bytes) == m)
        }
        #expect(kinds == Set(1...19))
    }

    @Test("the peer hello and its reply round-trip; wrong magic, bad values and truncations are refused")
    func hello() throws {
        let hellos = [
            PeerHello(clusterID: "prod", from: 2, to: 3, protocolVersion: 1, address: "10.0.0.2:7000"),
            PeerHello(clusterID: "", from: 0, to: UInt64.max, protocolVersion: UInt16.max),
            PeerHello(clusterID: "grüße-集群", from: UInt64.max, to: 0, protocolVersion: 0, address: "[::1]:7000"),
            PeerHello(clusterID: "prod", from: 4, to: 1, protocolVersion: 2, address: "10.0.0.4:7000", incarnation: 0xB0B0_0000_0000_000B),
            PeerHello(clusterID: "prod", from: 4, to: 1, protocolVersion: 2, address: "", incarnation: 0),
        ]
        for h in hellos {
            let bytes = h.encode()
            #expect(Array(bytes.prefix(8)) == Array("BNYPEER1".utf8))
            #expect(try PeerHello.decode(bytes) == h)
            for cut in 0..<bytes.count { #expect(throws: WireError.self) { try PeerHello.decode(Array(bytes[0..<cut])) } }
            #expect(throws: WireError.trailingBytes(1)) { try PeerHello.decode(bytes + [0]) }
        }
        let replies = [
            PeerHelloReply(accepted: false, reason: "cluster id 'x' is not 'prod'", protocolVersion: 1),
            PeerHelloReply(accepted: true, reason: "", protocolVersion: UInt16.max),
        ]
        for r in replies {
            let bytes = r.encode()
            #expect(try PeerHelloReply.decode(bytes) == r)
            for cut in 0..<bytes.count { #expect(throws: WireError.self) { try PeerHelloReply.decode(Array(bytes[0..<cut])) } }
            #expect(throws: WireError.trailingBytes(2)) { try PeerHelloReply.decode(bytes + [0, 0]) }
        }
        let hello = hellos[0].encode()
        let reply = replies[0].encode()
        // A hello is not a reply, a reply is not a hello, and a Raft message is neither.
        #expect(throws: WireError.badMagic) { try PeerHello.decode(reply) }
        #expect(throws: WireError.badMagic) { try PeerHelloReply.decode(hello) }
        #expect(throws: WireError.badMagic) { try PeerHello.decode(MessageCodec.encode(Message(from: 1, to: 2, term: 3, body: .timeoutNow))) }
        var magic = hello
        magic[7] = UInt8(ascii: "2")
        #expect(throws: WireError.badMagic) { try PeerHello.decode(magic) }
        #expect(throws: WireError.self) { try MessageCodec.decode(hello) }
        var accepted = reply
        accepted[10] = 2
        #expect(throws: WireError.badValue(field: "accepted")) { try PeerHelloReply.decode(accepted) }
        // The cluster id is not UTF-8 (its length prefix follows the magic and version).
        let notUTF8 = Array(hello[0..<10]) + [1, 0, 0, 0, 0, 0, 0, 0, 0xFF] + [UInt8](repeating: 0, count: 24)
        #expect(throws: WireError.badValue(field: "cluster id")) { try PeerHello.decode(notUTF8) }
        #expect(throws: WireError.tooLarge(field: "cluster id", count: 1 << 61)) { try PeerHello.decode(Self.patch(hello, at: 10, 1 << 61)) }
    }

    /// A receiver's stream buffer: bytes arrive in chunks, complete frames come out.
    struct Receiver {
        var buffer: [UInt8] = []
        var offset = 0
        var payloads: [[UInt8]] = []

        mutating func receive(_ chunk: ArraySlice<UInt8>) throws(WireError) {
            buffer += chunk
            while let frame = try Framing.nextFrame(in: buffer, from: offset) {
                payloads.append(Array(buffer[frame.payload]))
                offset = frame.next
            }
        }
    }

    @Test("a stream of frames split at every byte boundary reassembles; oversize lengths are refused")
    func framing() throws {
        let message = Message(from: 1, to: 2, term: 3, body: .append(prevIndex: 1, prevTerm: 1, entries: [LogEntry(index: 2, term: 3, data: [5])], commit: 1))
        let payloads = [PeerHello(clusterID: "c", from: 1, to: 2, protocolVersion: 1).encode(), [], MessageCodec.encode(message)]
        let stream = payloads.flatMap { Framing.frame($0) }
        #expect(Framing.frame([7, 8]) == [2, 0, 0, 0, 7, 8])
        var appended: [UInt8] = []
        for p in payloads.dropLast() { Framing.appendFrame(p, to: &appended) }
        Framing.appendFrame(message, to: &appended)
        #expect(appended == stream)

        for cut in 0...stream.count {
            var r = Receiver()
            try r.receive(stream[0..<cut])
            try r.receive(stream[cut...])
            #expect(r.payloads == payloads, "cut at \(cut)")
            #expect(r.offset == stream.count)
        }
        var ends: [Int] = []
        for p in payloads { ends.append((ends.last ?? 0) + 4 + p.count) }
        var byteByByte = Receiver()
        for i in stream.indices {
            try byteByByte.receive(stream[i...i])
            // A frame comes out exactly when its last byte has arrived.
            #expect(byteByByte.payloads.count == ends.filter { $0 <= i + 1 }.count)
        }
        #expect(byteByByte.payloads == payloads)
        #expect(try MessageCodec.decode(byteByByte.payloads[2][...]) == message)

        // The limit itself is allowed (and incomplete until it all arrives); one byte more is refused
        // as soon as the four length bytes are in, before any payload.
        let limit = UInt32(Framing.maxFrameBytes)
        let atLimit = (0..<4).map { UInt8(truncatingIfNeeded: limit >> UInt32(8 * $0)) }
        #expect(try Framing.nextFrame(in: atLimit + [1, 2, 3], from: 0) == nil)
        let over = (0..<4).map { UInt8(truncatingIfNeeded: (limit + 1) >> UInt32(8 * $0)) }
        #expect(throws: WireError.tooLarge(field: "frame", count: UInt64(limit) + 1)) { try Framing.nextFrame(in: over, from: 0) }
        #expect(throws: WireError.tooLarge(field: "frame", count: UInt64(UInt32.max))) { try Framing.nextFrame(in: [0, 255, 255, 255, 255], from: 1) }
        #expect(try Framing.nextFrame(in: [0, 0, 0], from: 0) == nil)
        #expect(try Framing.nextFrame(in: [], from: 0) == nil)
    }
}

/// Incarnations on the wire (R22, issue 14 item 3): memberships carry them from message version 2
/// and hello protocol version 2; the older layouts still decode, without them.
@Suite struct IncarnationCodecTests {
    static func u64(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: v >> UInt64(8 * $0)) } }
    static func ids(_ list: [UInt64]) -> [UInt8] { u64(UInt64(list.count)) + list.flatMap(u64) }

    @Test("a version-1 append with a configuration entry and a version-1 snapshot chunk (no incarnation lists) still decode")
    func versionOneDecodes() throws {
        // Version 1 layout, byte by byte: header, then prevIndex, prevTerm, commit, one entry.
        let header: [UInt8] = [1, 5] + Self.u64(1) + Self.u64(2) + Self.u64(3)
        let entry = Self.u64(7) + Self.u64(3) + [3] + Self.ids([1, 2, 4]) + Self.ids([5]) + Self.u64(0)
        let append = header + Self.u64(6) + Self.u64(2) + Self.u64(6) + Self.u64(1) + entry
        let m = try MessageCodec.decode(append)
        let config = LogEntry(index: 7, term: 3, kind: .config(Membership(voters: [1, 2, 4], learners: [5])))
        #expect(m == Message(from: 1, to: 2, term: 3, body: .append(prevIndex: 6, prevTerm: 2, entries: [config], commit: 6)))
        let chunkHeader: [UInt8] = [1, 10] + Self.u64(1) + Self.u64(2) + Self.u64(3)
        let chunk = chunkHeader + Self.u64(40) + Self.u64(3) + Self.ids([1, 2]) + Self.ids([]) + Self.u64(0) + Self.u64(2) + [9, 9] + [1]
        let meta = SnapshotMeta(index: 40, term: 3, membership: Membership(voters: [1, 2]))
        #expect(try MessageCodec.decode(chunk) == Message(from: 1, to: 2, term: 3, body: .snapshotChunk(meta: meta, offset: 0, data: [9, 9], last: true)))
        // The same bytes under version 2 lack the incarnation count: refused, not misread.
        var asTwo = chunk
        asTwo[0] = 2
        #expect(throws: WireError.self) { try MessageCodec.decode(asTwo) }
    }

    @Test("versions 2 and 3 write the incarnation list in id order after the learners")
    func versionTwoLayout() throws {
        let membership = Membership(voters: [1, 4], learners: [9], incarnations: [9: 99, 4: 44])
        let m = Message(from: 1, to: 2, term: 3, body: .snapshotChunk(meta: SnapshotMeta(index: 40, term: 3, membership: membership), offset: 0, data: [], last: true))
        let bytes = MessageCodec.encode(m)
        let expected: [UInt8] = [4, 10] + Self.u64(1) + Self.u64(2) + Self.u64(3) + Self.u64(40) + Self.u64(3) + Self.ids([1, 4]) + Self.ids([9])
            + Self.u64(2) + Self.u64(4) + Self.u64(44) + Self.u64(9) + Self.u64(99) + Self.u64(0) + Self.u64(0) + [1]
        #expect(bytes == expected)
        #expect(try MessageCodec.decode(bytes) == m)
    }

    @Test("version 3 vote requests end with the voter's incarnation; version-2 ones (without it) decode with 0, and a version-3 one without it is refused")
    func voteRequestIncarnation() throws {
        let vote = Message(from: 1, to: 4, term: 9, body: .vote(lastIndex: 7, lastTerm: 8, leaderTransfer: true, voterIncarnation: 0xF00D))
        let header: [UInt8] = Self.u64(1) + Self.u64(4) + Self.u64(9)
        #expect(MessageCodec.encode(vote) == [4, 3] + header + Self.u64(7) + Self.u64(8) + [1] + Self.u64(0xF00D))
        let preVote = Message(from: 1, to: 4, term: 9, body: .preVote(lastIndex: 7, lastTerm: 8, voterIncarnation: 5))
        #expect(MessageCodec.encode(preVote) == [4, 1] + header + Self.u64(7) + Self.u64(8) + Self.u64(5))
        let oldVote = [2, 3] + header + Self.u64(7) + Self.u64(8) + [1]
        #expect(try MessageCodec.decode(oldVote) == Message(from: 1, to: 4, term: 9, body: .vote(lastIndex: 7, lastTerm: 8, leaderTransfer: true)))
        let oldPreVote = [2, 1] + header + Self.u64(7) + Self.u64(8)
        #expect(try MessageCodec.decode(oldPreVote) == Message(from: 1, to: 4, term: 9, body: .preVote(lastIndex: 7, lastTerm: 8)))
        var truncated = oldVote
        truncated[0] = 3
        #expect(throws: WireError.self) { try MessageCodec.decode(truncated) }
    }

    @Test("version 4 acknowledgements end with the sender's mayVote and heartbeats with the commit's term; version-3 ones (without them) decode as true and 0, and a version-4 one without them is refused")
    func acknowledgementMayVote() throws {
        let header: [UInt8] = Self.u64(3) + Self.u64(1) + Self.u64(9)
        let accepted = Message(from: 3, to: 1, term: 9, body: .appendAccepted(index: 56, mayVote: false))
        #expect(MessageCodec.encode(accepted) == [4, 6] + header + Self.u64(56) + [0])
        let heartbeat = Message(from: 3, to: 1, term: 9, body: .heartbeatResponse(readSeq: 7, mayVote: true))
        #expect(MessageCodec.encode(heartbeat) == [4, 9] + header + Self.u64(7) + [1])
        let oldAccepted: [UInt8] = [3, 6] + header + Self.u64(56)
        #expect(try MessageCodec.decode(oldAccepted) == Message(from: 3, to: 1, term: 9, body: .appendAccepted(index: 56, mayVote: true)))
        let oldHeartbeat: [UInt8] = [3, 9] + header + Self.u64(7)
        #expect(try MessageCodec.decode(oldHeartbeat) == Message(from: 3, to: 1, term: 9, body: .heartbeatResponse(readSeq: 7, mayVote: true)))
        let beat = Message(from: 1, to: 3, term: 9, body: .heartbeat(commit: 68, readSeq: 2, commitTerm: 3))
        #expect(MessageCodec.encode(beat) == [4, 8] + Self.u64(1) + Self.u64(3) + Self.u64(9) + Self.u64(68) + Self.u64(2) + Self.u64(3))
        let oldBeat: [UInt8] = [3, 8] + Self.u64(1) + Self.u64(3) + Self.u64(9) + Self.u64(68) + Self.u64(2)
        #expect(try MessageCodec.decode(oldBeat) == Message(from: 1, to: 3, term: 9, body: .heartbeat(commit: 68, readSeq: 2, commitTerm: 0)))
        var truncated = oldAccepted
        truncated[0] = 4
        #expect(throws: WireError.self) { try MessageCodec.decode(truncated) }
    }

    @Test("an incarnation list naming a non-member, a zero incarnation, or ids out of order is refused")
    func badIncarnationLists() throws {
        func chunk(_ pairs: [(UInt64, UInt64)]) -> [UInt8] {
            [2, 10] + Self.u64(1) + Self.u64(2) + Self.u64(3) + Self.u64(40) + Self.u64(3) + Self.ids([1, 4]) + Self.ids([9])
                + Self.u64(UInt64(pairs.count)) + pairs.flatMap { Self.u64($0.0) + Self.u64($0.1) } + Self.u64(0) + Self.u64(0) + [1]
        }
        #expect(throws: Never.self) { try MessageCodec.decode(chunk([(1, 5), (9, 6)])) }
        #expect(throws: WireError.badValue(field: "incarnations")) { try MessageCodec.decode(chunk([(3, 5)])) }
        #expect(throws: WireError.badValue(field: "incarnations")) { try MessageCodec.decode(chunk([(4, 0)])) }
        #expect(throws: WireError.badValue(field: "incarnations")) { try MessageCodec.decode(chunk([(9, 5), (1, 6)])) }
        #expect(throws: WireError.badValue(field: "incarnations")) { try MessageCodec.decode(chunk([(4, 5), (4, 6)])) }
    }

    @Test("a version-2 hello carries the incarnation; a version-1 hello (without it) decodes with incarnation 0")
    func helloIncarnation() throws {
        let two = PeerHello(clusterID: "c", from: 4, to: 1, protocolVersion: 2, address: "a:1", incarnation: 77)
        let bytes = two.encode()
        #expect(Array(bytes.suffix(8)) == Self.u64(77))
        #expect(try PeerHello.decode(bytes).incarnation == 77)
        let one = Array("BNYPEER1".utf8) + [1, 0] + Self.u64(1) + Array("c".utf8) + Self.u64(4) + Self.u64(1) + Self.u64(3) + Array("a:1".utf8)
        let decoded = try PeerHello.decode(one)
        #expect(decoded == PeerHello(clusterID: "c", from: 4, to: 1, protocolVersion: 1, address: "a:1"))
        #expect(decoded.incarnation == 0)
        #expect(PeerHello(clusterID: "c", from: 4, to: 1, protocolVersion: 1, address: "a:1", incarnation: 77).encode() == one)
    }
}
