import BanyanBasics

/// The peer wire format of Raft messages, the connection hello and stream framing (docs/raft.md,
/// "Wire format"), written and read with the shared byte codec (`ByteWriter`, `ByteReader`;
/// docs/internals/byte-codec.md). Little-endian throughout; every count and length is checked
/// against the bytes that remain before anything is allocated, so hostile or damaged input is a
/// typed error: the codec's `ByteCodecError`s arrive as the matching cases here.
public enum WireError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The input ended inside `field`.
    case truncated(field: String)
    /// The message's version byte is not `MessageCodec.version`.
    case unknownVersion(UInt8)
    /// The message's kind byte names no `Message.Body` case.
    case unknownKind(UInt8)
    /// A count or length larger than the bytes that remain could hold (or, for `"frame"`, than
    /// `Framing.maxFrameBytes`).
    case tooLarge(field: String, count: UInt64)
    /// The input holds this many bytes after a complete value.
    case trailingBytes(Int)
    /// A boolean other than 0 or 1, an unknown entry kind, or a string that is not UTF-8.
    case badValue(field: String)
    /// A hello or hello reply without its magic bytes.
    case badMagic

    public var description: String {
        switch self {
        case .truncated(let f): return "truncated at \(f)"
        case .unknownVersion(let v): return "unknown wire version \(v)"
        case .unknownKind(let k): return "unknown message kind \(k)"
        case let .tooLarge(f, n): return f == "frame" ? "frame length \(n) exceeds the limit" : "\(f) count \(n) exceeds the bytes that remain"
        case .trailingBytes(let n): return "\(n) trailing bytes"
        case .badValue(let f): return "bad value in \(f)"
        case .badMagic: return "not a Banyan peer hello or hello reply"
        }
    }
}

extension WireError {
    /// The peer format's error for a failure of the shared byte codec: the same field names,
    /// the same cases.
    init(_ error: ByteCodecError) {
        switch error {
        case .truncated(let field): self = .truncated(field: field)
        case let .tooLarge(field, count): self = .tooLarge(field: field, count: count)
        case .trailingBytes(let n): self = .trailingBytes(n)
        case .badValue(let field): self = .badValue(field: field)
        case .badMagic: self = .badMagic
        }
    }
}

extension ByteReader {
    /// Runs `read` over exactly `raw` (the whole input must be consumed), with the peer
    /// format's errors.
    static func readWire<T>(_ raw: UnsafeRawBufferPointer, _ read: (inout ByteReader) throws(WireError) -> T) throws(WireError) -> T {
        var r = ByteReader(raw)
        let value = try read(&r)
        guard r.atEnd else { throw .trailingBytes(r.remaining) }
        return value
    }

    /// `readWire` over an array slice's storage, without copying it.
    static func readWire<T>(_ bytes: ArraySlice<UInt8>, _ read: (inout ByteReader) throws(WireError) -> T) throws(WireError) -> T {
        // `withUnsafeBytes` only rethrows untyped errors; carry the typed one out in a Result.
        let result = bytes.withUnsafeBytes { raw in Result { () throws(WireError) in try readWire(raw, read) } }
        return try result.get()
    }
}

/// Encodes and decodes `Message`s: version (4), kind, from, to, term, then the body's fields.
///
/// | kind | body |
/// | --- | --- |
/// | 1 preVote, 3 vote | lastIndex, lastTerm (vote: + leaderTransfer bool), then (version 3) voterIncarnation |
/// | 2 preVoteResponse, 4 voteResponse | granted bool |
/// | 5 append | prevIndex, prevTerm, commit, entry count, entries |
/// | 6 appendAccepted | index, then (version 4) mayVote bool |
/// | 7 appendRejected | rejectedIndex, hintIndex, hintTerm |
/// | 8 heartbeat | commit, readSeq, then (version 4) commitTerm |
/// | 9 heartbeatResponse | readSeq, then (version 4) mayVote bool |
/// | 10 snapshotChunk | meta, offset, data, last |
/// | 11 snapshotResponse | snapshotIndex, nextOffset |
/// | 12 proposal | count, byte strings |
/// | 13 readIndex | context |
/// | 14 readIndexResponse | context, index |
/// | 15 timeoutNow | — |
/// | 16 stage, 19 stagedPayload | id (term, n), payload bytes |
/// | 17 stageAck | id (term, n), checksum u32, prepared bool |
/// | 18 fetchStaged | id (term, n) |
///
/// Kinds 16–19 (staged payloads, docs/staged-payloads.md) came without a message version change
/// (the layout of every other kind is unchanged); the peer protocol version (10) marks them, so a
/// node only ever talks to peers that know them.
/// An entry is index, term, kind (1 command, 2 noop, 3 config + membership), data bytes. A
/// membership is the voter ids then the learner ids, each a count and u64s, then (version 2) the
/// recorded incarnations: a count, then (id, incarnation) u64 pairs in id order, each id a member
/// and each incarnation nonzero. A snapshot meta is index, term, membership.
///
/// Version 1 (before incarnations, R22) is the same without the incarnation list; it still
/// decodes, as memberships that record no incarnation. Version 2 is version 3 without the vote
/// requests' `voterIncarnation`; it still decodes, as 0. Version 3 is version 4 without the
/// acknowledgements' `mayVote` and the heartbeat's `commitTerm`; it still decodes, as `true`
/// and 0 (a heartbeat that commits nothing). Senders always write `version`.
public enum MessageCodec {
    public static let version: UInt8 = 4
    /// The oldest version `decode` accepts.
    public static let oldestVersion: UInt8 = 1

    /// One message's bytes.
    public static func encode(_ m: Message) -> [UInt8] {
        var w = ByteWriter(capacity: m.size + 16)
        encode(m, into: &w)
        return w.out
    }

    /// Appends one message's bytes to `out` (for batching several frames into one write).
    public static func encode(_ m: Message, into out: inout [UInt8]) {
        var w = ByteWriter(continuing: &out)
        w.out.reserveCapacity(w.out.count + m.size + 16)
        encode(m, into: &w)
        out = w.out
    }

    static func encode(_ m: Message, into w: inout ByteWriter) {
        w.u8(version)
        w.u8(kind(of: m.body))
        w.u64(m.from)
        w.u64(m.to)
        w.u64(m.term)
        switch m.body {
        case let .preVote(lastIndex, lastTerm, voterIncarnation):
            w.u64(lastIndex)
            w.u64(lastTerm)
            w.u64(voterIncarnation)
        case .preVoteResponse(let granted), .voteResponse(let granted):
            w.bool(granted)
        case let .vote(lastIndex, lastTerm, transfer, voterIncarnation):
            w.u64(lastIndex)
            w.u64(lastTerm)
            w.bool(transfer)
            w.u64(voterIncarnation)
        case let .append(prevIndex, prevTerm, entries, commit):
            w.u64(prevIndex)
            w.u64(prevTerm)
            w.u64(commit)
            w.u64(UInt64(entries.count))
            for e in entries { encode(e, into: &w) }
        case let .appendAccepted(index, mayVote):
            w.u64(index)
            w.bool(mayVote)
        case let .appendRejected(rejectedIndex, hintIndex, hintTerm):
            w.u64(rejectedIndex)
            w.u64(hintIndex)
            w.u64(hintTerm)
        case let .heartbeat(commit, readSeq, commitTerm):
            w.u64(commit)
            w.u64(readSeq)
            w.u64(commitTerm)
        case let .heartbeatResponse(readSeq, mayVote):
            w.u64(readSeq)
            w.bool(mayVote)
        case let .snapshotChunk(meta, offset, data, last):
            encode(meta, into: &w)
            w.u64(offset)
            w.bytes(data)
            w.bool(last)
        case let .snapshotResponse(snapshotIndex, nextOffset):
            w.u64(snapshotIndex)
            w.u64(nextOffset)
        case .proposal(let commands):
            w.u64(UInt64(commands.count))
            for c in commands { w.bytes(c) }
        case .readIndex(let context):
            w.u64(context)
        case let .readIndexResponse(context, index):
            w.u64(context)
            w.u64(index)
        case .timeoutNow:
            break
        case let .stage(id, payload), let .stagedPayload(id, payload):
            w.u64(id.term)
            w.u64(id.n)
            w.bytes(payload)
        case let .stageAck(id, checksum, prepared):
            w.u64(id.term)
            w.u64(id.n)
            w.u32(checksum)
            w.bool(prepared)
        case .fetchStaged(let id):
            w.u64(id.term)
            w.u64(id.n)
        }
    }

    static func kind(of body: Message.Body) -> UInt8 {
        switch body {
        case .preVote: return 1
        case .preVoteResponse: return 2
        case .vote: return 3
        case .voteResponse: return 4
        case .append: return 5
        case .appendAccepted: return 6
        case .appendRejected: return 7
        case .heartbeat: return 8
        case .heartbeatResponse: return 9
        case .snapshotChunk: return 10
        case .snapshotResponse: return 11
        case .proposal: return 12
        case .readIndex: return 13
        case .readIndexResponse: return 14
        case .timeoutNow: return 15
        case .stage: return 16
        case .stageAck: return 17
        case .fetchStaged: return 18
        case .stagedPayload: return 19
        }
    }

    static func encode(_ e: LogEntry, into w: inout ByteWriter) {
        w.u64(e.index)
        w.u64(e.term)
        switch e.kind {
        case .command: w.u8(1)
        case .noop: w.u8(2)
        case .config(let m):
            w.u8(3)
            encode(m, into: &w)
        }
        w.bytes(e.data)
    }

    static func encode(_ m: Membership, into w: inout ByteWriter) {
        w.u64s(m.voters)
        w.u64s(m.learners)
        let recorded = m.incarnations.keys.sorted()
        w.u64(UInt64(recorded.count))
        for id in recorded {
            w.u64(id)
            w.u64(m.incarnation(of: id))
        }
    }

    static func encode(_ meta: SnapshotMeta, into w: inout ByteWriter) {
        w.u64(meta.index)
        w.u64(meta.term)
        encode(meta.membership, into: &w)
    }

    /// Decodes one message; the bytes must hold exactly one.
    public static func decode(_ bytes: [UInt8]) throws(WireError) -> Message {
        try ByteReader.readWire(bytes[...], decodeMessage)
    }

    /// Decodes one message from part of a buffer (a frame's payload), without copying it.
    public static func decode(_ bytes: ArraySlice<UInt8>) throws(WireError) -> Message {
        try ByteReader.readWire(bytes, decodeMessage)
    }

    /// Decodes one message from borrowed bytes (such as a network buffer's readable bytes),
    /// without copying them; the message owns copies of its byte fields.
    public static func decode(_ bytes: UnsafeRawBufferPointer) throws(WireError) -> Message {
        try ByteReader.readWire(bytes, decodeMessage)
    }

    static func decodeMessage(_ r: inout ByteReader) throws(WireError) -> Message {
        // Three steps, so that an unknown version or kind is reported as such (the peer
        // format's own errors) and every codec failure as the matching `WireError`.
        let v: UInt8
        do throws(ByteCodecError) { v = try r.u8("version") } catch { throw WireError(error) }
        guard v >= oldestVersion && v <= version else { throw .unknownVersion(v) }
        let kind: UInt8, from: NodeID, to: NodeID, term: UInt64
        do throws(ByteCodecError) {
            kind = try r.u8("kind")
            from = try r.u64("from")
            to = try r.u64("to")
            term = try r.u64("term")
        } catch {
            throw WireError(error)
        }
        guard kind >= 1 && kind <= 19 else { throw .unknownKind(kind) }
        do throws(ByteCodecError) {
            return Message(from: from, to: to, term: term, body: try decodeBody(&r, kind: kind, version: v))
        } catch {
            throw WireError(error)
        }
    }

    /// The body of a message of `kind` (one of 1...19).
    @inline(__always)
    static func decodeBody(_ r: inout ByteReader, kind: UInt8, version v: UInt8) throws(ByteCodecError) -> Message.Body {
        let body: Message.Body
        switch kind {
        case 1:
            body = .preVote(
                lastIndex: try r.u64("lastIndex"), lastTerm: try r.u64("lastTerm"), voterIncarnation: v >= 3 ? try r.u64("voterIncarnation") : 0)
        case 2: body = .preVoteResponse(granted: try r.bool("granted"))
        case 3:
            body = .vote(
                lastIndex: try r.u64("lastIndex"), lastTerm: try r.u64("lastTerm"), leaderTransfer: try r.bool("leaderTransfer"),
                voterIncarnation: v >= 3 ? try r.u64("voterIncarnation") : 0)
        case 4: body = .voteResponse(granted: try r.bool("granted"))
        case 5:
        let prevIndex = try r.u64("prevIndex")
            let prevTerm = try r.u64("prevTerm")
            let commit = try r.u64("commit")
            // An entry takes at least 25 bytes (index, term, kind, data length).
            let n = try r.count("entries", itemBytes: 25)
            var entries: [LogEntry] = []
            entries.reserveCapacity(n)
            for _ in 0..<n { entries.append(try decodeEntry(&r, version: v)) }
            body = .append(prevIndex: prevIndex, prevTerm: prevTerm, entries: entries, commit: commit)
        case 6: body = .appendAccepted(index: try r.u64("index"), mayVote: v >= 4 ? try r.bool("mayVote") : true)
        case 7: body = .appendRejected(rejectedIndex: try r.u64("rejectedIndex"), hintIndex: try r.u64("hintIndex"), hintTerm: try r.u64("hintTerm"))
        case 8: body = .heartbeat(commit: try r.u64("commit"), readSeq: try r.u64("readSeq"), commitTerm: v >= 4 ? try r.u64("commitTerm") : 0)
        case 9: body = .heartbeatResponse(readSeq: try r.u64("readSeq"), mayVote: v >= 4 ? try r.bool("mayVote") : true)
        case 10:
            let meta = try decodeMeta(&r, version: v)
            body = .snapshotChunk(meta: meta, offset: try r.u64("offset"), data: try r.bytes("data"), last: try r.bool("last"))
        case 11: body = .snapshotResponse(snapshotIndex: try r.u64("snapshotIndex"), nextOffset: try r.u64("nextOffset"))
        case 12:
            let n = try r.count("proposals", itemBytes: 8)
            var commands: [[UInt8]] = []
            commands.reserveCapacity(n)
            for _ in 0..<n { commands.append(try r.bytes("proposal")) }
            body = .proposal(commands: commands)
        case 13: body = .readIndex(context: try r.u64("context"))
        case 14: body = .readIndexResponse(context: try r.u64("context"), index: try r.u64("index"))
        case 15: body = .timeoutNow
        case 16: body = .stage(id: StageID(term: try r.u64("stageTerm"), n: try r.u64("stageN")), payload: try r.bytes("payload"))
        case 17:
            body = .stageAck(
                id: StageID(term: try r.u64("stageTerm"), n: try r.u64("stageN")), checksum: try r.u32("checksum"), prepared: try r.bool("prepared"))
        case 18: body = .fetchStaged(id: StageID(term: try r.u64("stageTerm"), n: try r.u64("stageN")))
        case 19: body = .stagedPayload(id: StageID(term: try r.u64("stageTerm"), n: try r.u64("stageN")), payload: try r.bytes("payload"))
        // `decodeMessage` checked the kind first.
        default: throw .badValue(field: "kind")
        }
        return body
    }

    // Inlined into the append loop, as the hand-written reader's was: a call per entry made
    // appends decode measurably slower (banyan-bench codec).
    @inline(__always)
    static func decodeEntry(_ r: inout ByteReader, version: UInt8 = MessageCodec.version) throws(ByteCodecError) -> LogEntry {
        let index = try r.u64("entry index")
        let term = try r.u64("entry term")
        let kind: LogEntry.Kind
        switch try r.u8("entry kind") {
        case 1: kind = .command
        case 2: kind = .noop
        case 3: kind = .config(try decodeMembership(&r, version: version))
        default: throw .badValue(field: "entry kind")
        }
        return LogEntry(index: index, term: term, kind: kind, data: try r.bytes("entry data"))
    }

    static func decodeMembership(_ r: inout ByteReader, version: UInt8 = MessageCodec.version) throws(ByteCodecError) -> Membership {
        let voters = try r.u64s("voters")
        let learners = try r.u64s("learners")
        guard version >= 2 else { return Membership(voters: voters, learners: learners) }
        let n = try r.count("incarnations", itemBytes: 16)
        let members = Set(voters).union(learners)
        var incarnations: [NodeID: UInt64] = [:]
        var previous: NodeID?
        for _ in 0..<n {
            let id = try r.u64("incarnation id")
            let incarnation = try r.u64("incarnation")
            // In id order, each a member, never 0: anything else is not what a sender writes.
            guard members.contains(id), incarnation != 0, previous.map({ $0 < id }) ?? true else {
                throw .badValue(field: "incarnations")
            }
            previous = id
            incarnations[id] = incarnation
        }
        return Membership(voters: voters, learners: learners, incarnations: incarnations)
    }

    static func decodeMeta(_ r: inout ByteReader, version: UInt8 = MessageCodec.version) throws(ByteCodecError) -> SnapshotMeta {
        SnapshotMeta(
            index: try r.u64("snapshot index"), term: try r.u64("snapshot term"), membership: try decodeMembership(&r, version: version))
    }
}

/// The handshake that opens every peer connection (docs/raft.md, "Wire format").
///
/// The dialling peer's first frame is a `PeerHello`: magic "BNYPEER1", protocol version, cluster
/// id, the sender's and the intended receiver's node ids, and the address the sender listens on
/// (so the receiver can answer a node it has not heard of yet, such as a leader talking to a new
/// learner), and (protocol version 2 on) the sender's incarnation (`RaftConfiguration.incarnation`,
/// 0 if unknown), which the receiver hands to its Raft core (R22). The receiver's first frame is
/// the `PeerHelloReply`. The receiver refuses, and closes
/// the connection after the reply, when the cluster id or the protocol version differs from its
/// own, when the hello is meant for another node, or when the hello does not decode; the dialler
/// sends `Message` frames only once the reply accepts it.
public struct PeerHello: Sendable, Equatable {
    public static let magic: [UInt8] = Array("BNYPEER1".utf8)
    public var clusterID: String
    public var from: NodeID
    public var to: NodeID
    public var protocolVersion: UInt16
    public var address: String
    /// The sender's incarnation (0: unknown). Encoded only from protocol version 2 on.
    public var incarnation: UInt64

    public init(
        clusterID: String, from: NodeID, to: NodeID, protocolVersion: UInt16, address: String = "", incarnation: UInt64 = 0
    ) {
        self.clusterID = clusterID
        self.from = from
        self.to = to
        self.protocolVersion = protocolVersion
        self.address = address
        self.incarnation = protocolVersion >= 2 ? incarnation : 0
    }

    /// `magic | protocolVersion u16 | clusterID | from u64 | to u64 | address`, then
    /// `| incarnation u64` when the protocol version is 2 or more (strings as a u64 length and
    /// UTF-8). A version-1 hello still decodes (incarnation 0), so its receiver can refuse it
    /// with the version as the reason.
    public func encode() -> [UInt8] {
        var w = ByteWriter()
        w.raw(Self.magic)
        w.u16(protocolVersion)
        w.string(clusterID)
        w.u64(from)
        w.u64(to)
        w.string(address)
        if protocolVersion >= 2 { w.u64(incarnation) }
        return w.out
    }

    public static func decode(_ bytes: [UInt8]) throws(WireError) -> PeerHello {
        do throws(ByteCodecError) {
            return try ByteReader.readAll(bytes) { (r) throws(ByteCodecError) in
                try r.magic(magic, "peer hello")
                let version = try r.u16("protocol version")
                let cluster = try r.string("cluster id")
                let from = try r.u64("from")
                let to = try r.u64("to")
                let address = try r.string("address")
                let incarnation = version >= 2 ? try r.u64("incarnation") : 0
                return PeerHello(
                    clusterID: cluster, from: from, to: to, protocolVersion: version, address: address, incarnation: incarnation)
            }
        } catch {
            throw WireError(error)
        }
    }
}

/// The receiver's answer to a `PeerHello` (its first frame on the connection): accepted, or
/// refused with the reason, which both sides log. Magic "BNYPEERR".
public struct PeerHelloReply: Sendable, Equatable {
    public static let magic: [UInt8] = Array("BNYPEERR".utf8)
    public var accepted: Bool
    public var reason: String
    public var protocolVersion: UInt16

    public init(accepted: Bool, reason: String, protocolVersion: UInt16) {
        self.accepted = accepted
        self.reason = reason
        self.protocolVersion = protocolVersion
    }

    /// `magic | protocolVersion u16 | accepted u8 | reason`.
    public func encode() -> [UInt8] {
        var w = ByteWriter()
        w.raw(Self.magic)
        w.u16(protocolVersion)
        w.bool(accepted)
        w.string(reason)
        return w.out
    }

    public static func decode(_ bytes: [UInt8]) throws(WireError) -> PeerHelloReply {
        do throws(ByteCodecError) {
            return try ByteReader.readAll(bytes) { (r) throws(ByteCodecError) in
                try r.magic(magic, "peer hello reply")
                let version = try r.u16("protocol version")
                let accepted = try r.bool("accepted")
                return PeerHelloReply(accepted: accepted, reason: try r.string("reason"), protocolVersion: version)
            }
        } catch {
            throw WireError(error)
        }
    }
}

/// Length-prefixed frames on a peer byte stream: a u32 little-endian payload length, then the
/// payload (a hello, a hello reply, or one encoded `Message`).
public enum Framing {
    /// The largest payload a receiver accepts; a longer length is a protocol error (the stream
    /// cannot be resynchronised, so the receiver closes the connection). Senders stay far below
    /// it: append messages hold at most `maxMessageBytes` of entries (plus one entry) and
    /// snapshot chunks `snapshotChunkBytes`.
    public static let maxFrameBytes = 64 << 20
    static let prefixBytes = 4

    /// The payload with its length prefix.
    public static func frame(_ payload: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(prefixBytes + payload.count)
        appendFrame(payload, to: &out)
        return out
    }

    /// Appends the payload with its length prefix to `out`.
    public static func appendFrame(_ payload: [UInt8], to out: inout [UInt8]) {
        appendLength(payload.count, to: &out)
        out.append(contentsOf: payload)
    }

    /// Appends one message as a frame to `out`, encoding it in place (no intermediate array).
    public static func appendFrame(_ m: Message, to out: inout [UInt8]) {
        var w = ByteWriter(continuing: &out)
        let start = w.count
        w.u32(0)
        w.out.reserveCapacity(w.count + m.size + 16)
        MessageCodec.encode(m, into: &w)
        // The length is known once the message is written (no message comes near 4 GiB: see
        // `maxFrameBytes`).
        w.patch(UInt32(truncatingIfNeeded: w.count - start - prefixBytes), at: start)
        out = w.out
    }

    private static func appendLength(_ count: Int, to out: inout [UInt8]) {
        // A payload the u32 prefix cannot describe would desynchronise the stream; no message
        // comes near it (see `maxFrameBytes`).
        precondition(count <= Int(UInt32.max), "Framing: a \(count)-byte payload does not fit a frame")
        var w = ByteWriter(continuing: &out)
        w.u32(UInt32(count))
        out = w.out
    }

    /// The next complete frame in `buffer` starting at `offset`: its payload's range and the
    /// offset after it. Nil while the frame is incomplete (read more and call again with the same
    /// offset); `.tooLarge(field: "frame", …)` when its length exceeds `maxFrameBytes`, which is
    /// known as soon as the 4 length bytes have arrived.
    public static func nextFrame(in buffer: [UInt8], from offset: Int) throws(WireError) -> (payload: Range<Int>, next: Int)? {
        precondition(offset >= 0 && offset <= buffer.count, "Framing.nextFrame: offset \(offset) outside the buffer")
        guard buffer.count - offset >= prefixBytes else { return nil }
        let prefix: Result<UInt32, ByteCodecError> = buffer.withUnsafeBytes { raw in
            var r = ByteReader(raw, at: offset)
            return Result { () throws(ByteCodecError) in try r.u32("frame length") }
        }
        let length: UInt64
        do throws(ByteCodecError) { length = UInt64(try prefix.get()) } catch { throw WireError(error) }
        guard length <= UInt64(maxFrameBytes) else { throw .tooLarge(field: "frame", count: length) }
        let start = offset + prefixBytes
        guard buffer.count - start >= Int(length) else { return nil }
        return (start..<start + Int(length), start + Int(length))
    }
}
