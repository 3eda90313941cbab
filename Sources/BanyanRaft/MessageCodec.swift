/// The peer wire format of Raft messages and of the connection hello (docs/raft.md, "Wire
/// format"). Little-endian throughout; every count and length is checked against the bytes
/// that remain before anything is allocated, so hostile or damaged input is a typed error.
public enum WireError: Error, Sendable, Equatable, CustomStringConvertible {
    case truncated(field: String)
    case unknownVersion(UInt8)
    case unknownKind(UInt8)
    case tooLarge(field: String, count: UInt64)
    case trailingBytes(Int)
    case badValue(field: String)
    case badMagic

    public var description: String {
        switch self {
        case .truncated(let f): return "truncated at \(f)"
        case .unknownVersion(let v): return "unknown wire version \(v)"
        case .unknownKind(let k): return "unknown message kind \(k)"
        case let .tooLarge(f, n): return "\(f) count \(n) exceeds the bytes that remain"
        case .trailingBytes(let n): return "\(n) trailing bytes"
        case .badValue(let f): return "bad value in \(f)"
        case .badMagic: return "not a Banyan peer hello"
        }
    }
}

struct WireWriter {
    var out: [UInt8]
    init(capacity: Int = 64) {
        out = []
        out.reserveCapacity(capacity)
    }
    mutating func u8(_ v: UInt8) { out.append(v) }
    mutating func bool(_ v: Bool) { out.append(v ? 1 : 0) }
    mutating func u16(_ v: UInt16) {
        out.append(UInt8(truncatingIfNeeded: v))
        out.append(UInt8(truncatingIfNeeded: v >> 8))
    }
    mutating func u64(_ v: UInt64) {
        for s in stride(from: 0, to: 64, by: 8) { out.append(UInt8(truncatingIfNeeded: v >> UInt64(s))) }
    }
    mutating func bytes(_ b: [UInt8]) {
        u64(UInt64(b.count))
        out.append(contentsOf: b)
    }
    mutating func string(_ s: String) { bytes(Array(s.utf8)) }
    mutating func ids(_ list: [UInt64]) {
        u64(UInt64(list.count))
        for id in list { u64(id) }
    }
}

struct WireReader {
    let b: [UInt8]
    var at: Int
    init(_ b: [UInt8], at: Int = 0) {
        self.b = b
        self.at = at
    }
    var remaining: Int { b.count - at }
    mutating func u8(_ f: String) throws(WireError) -> UInt8 {
        guard at < b.count else { throw .truncated(field: f) }
        defer { at += 1 }
        return b[at]
    }
    mutating func bool(_ f: String) throws(WireError) -> Bool {
        switch try u8(f) {
        case 0: return false
        case 1: return true
        default: throw .badValue(field: f)
        }
    }
    mutating func u16(_ f: String) throws(WireError) -> UInt16 {
        guard remaining >= 2 else { throw .truncated(field: f) }
        defer { at += 2 }
        return UInt16(b[at]) | UInt16(b[at + 1]) << 8
    }
    mutating func u64(_ f: String) throws(WireError) -> UInt64 {
        guard remaining >= 8 else { throw .truncated(field: f) }
        var v: UInt64 = 0
        for i in 0..<8 { v |= UInt64(b[at + i]) << UInt64(8 * i) }
        at += 8
        return v
    }
    /// A count of items of at least `itemBytes` each, checked against what remains.
    mutating func count(_ f: String, itemBytes: Int) throws(WireError) -> Int {
        let n = try u64(f)
        guard n <= UInt64(remaining / max(1, itemBytes)) else { throw .tooLarge(field: f, count: n) }
        return Int(n)
    }
    mutating func bytes(_ f: String) throws(WireError) -> [UInt8] {
        let n = try count(f, itemBytes: 1)
        defer { at += n }
        return Array(b[at..<at + n])
    }
    mutating func string(_ f: String) throws(WireError) -> String {
        guard let s = String(validating: try bytes(f), as: UTF8.self) else { throw .badValue(field: f) }
        return s
    }
    mutating func ids(_ f: String) throws(WireError) -> [UInt64] {
        let n = try count(f, itemBytes: 8)
        var out: [UInt64] = []
        out.reserveCapacity(n)
        for _ in 0..<n { out.append(try u64(f)) }
        return out
    }
}

/// Encodes and decodes `Message`s: version (1), kind, from, to, term, then the body's fields.
///
/// | kind | body |
/// | --- | --- |
/// | 1 preVote, 3 vote | lastIndex, lastTerm (vote: + leaderTransfer bool) |
/// | 2 preVoteResponse, 4 voteResponse | granted bool |
/// | 5 append | prevIndex, prevTerm, commit, entry count, entries |
/// | 6 appendAccepted | index |
/// | 7 appendRejected | rejectedIndex, hintIndex, hintTerm |
/// | 8 heartbeat | commit, readSeq |
/// | 9 heartbeatResponse | readSeq |
/// | 10 snapshotChunk | meta, offset, data, last |
/// | 11 snapshotResponse | snapshotIndex, nextOffset |
/// | 12 proposal | count, byte strings |
/// | 13 readIndex | context |
/// | 14 readIndexResponse | context, index |
/// | 15 timeoutNow | — |
///
/// An entry is index, term, kind (1 command, 2 noop, 3 config + membership), data bytes. A
/// membership is the voter ids then the learner ids, each a count and u64s. A snapshot meta is
/// index, term, membership.
public enum MessageCodec {
    public static let version: UInt8 = 1

    public static func encode(_ m: Message) -> [UInt8] {
        var w = WireWriter(capacity: m.size + 16)
        encode(m, into: &w)
        return w.out
    }

    static func encode(_ m: Message, into w: inout WireWriter) {
        w.u8(version)
        w.u8(kind(of: m.body))
        w.u64(m.from)
        w.u64(m.to)
        w.u64(m.term)
        switch m.body {
        case let .preVote(lastIndex, lastTerm):
            w.u64(lastIndex)
            w.u64(lastTerm)
        case .preVoteResponse(let granted), .voteResponse(let granted):
            w.bool(granted)
        case let .vote(lastIndex, lastTerm, transfer):
            w.u64(lastIndex)
            w.u64(lastTerm)
            w.bool(transfer)
        case let .append(prevIndex, prevTerm, entries, commit):
            w.u64(prevIndex)
            w.u64(prevTerm)
            w.u64(commit)
            w.u64(UInt64(entries.count))
            for e in entries { encode(e, into: &w) }
        case .appendAccepted(let index):
            w.u64(index)
        case let .appendRejected(rejectedIndex, hintIndex, hintTerm):
            w.u64(rejectedIndex)
            w.u64(hintIndex)
            w.u64(hintTerm)
        case let .heartbeat(commit, readSeq):
            w.u64(commit)
            w.u64(readSeq)
        case .heartbeatResponse(let readSeq):
            w.u64(readSeq)
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
        }
    }

    static func encode(_ e: LogEntry, into w: inout WireWriter) {
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

    static func encode(_ m: Membership, into w: inout WireWriter) {
        w.ids(m.voters)
        w.ids(m.learners)
    }

    static func encode(_ meta: SnapshotMeta, into w: inout WireWriter) {
        w.u64(meta.index)
        w.u64(meta.term)
        encode(meta.membership, into: &w)
    }

    /// Decodes one message; the bytes must hold exactly one.
    public static func decode(_ bytes: [UInt8]) throws(WireError) -> Message {
        var r = WireReader(bytes)
        let v = try r.u8("version")
        guard v == version else { throw .unknownVersion(v) }
        let kind = try r.u8("kind")
        let from = try r.u64("from")
        let to = try r.u64("to")
        let term = try r.u64("term")
        let body: Message.Body
        switch kind {
        case 1: body = .preVote(lastIndex: try r.u64("lastIndex"), lastTerm: try r.u64("lastTerm"))
        case 2: body = .preVoteResponse(granted: try r.bool("granted"))
        case 3: body = .vote(lastIndex: try r.u64("lastIndex"), lastTerm: try r.u64("lastTerm"), leaderTransfer: try r.bool("leaderTransfer"))
        case 4: body = .voteResponse(granted: try r.bool("granted"))
        case 5:
            let prevIndex = try r.u64("prevIndex")
            let prevTerm = try r.u64("prevTerm")
            let commit = try r.u64("commit")
            // An entry takes at least 25 bytes (index, term, kind, data length).
            let n = try r.count("entries", itemBytes: 25)
            var entries: [LogEntry] = []
            entries.reserveCapacity(n)
            for _ in 0..<n { entries.append(try decodeEntry(&r)) }
            body = .append(prevIndex: prevIndex, prevTerm: prevTerm, entries: entries, commit: commit)
        case 6: body = .appendAccepted(index: try r.u64("index"))
        case 7: body = .appendRejected(rejectedIndex: try r.u64("rejectedIndex"), hintIndex: try r.u64("hintIndex"), hintTerm: try r.u64("hintTerm"))
        case 8: body = .heartbeat(commit: try r.u64("commit"), readSeq: try r.u64("readSeq"))
        case 9: body = .heartbeatResponse(readSeq: try r.u64("readSeq"))
        case 10:
            let meta = try decodeMeta(&r)
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
        default: throw .unknownKind(kind)
        }
        guard r.remaining == 0 else { throw .trailingBytes(r.remaining) }
        return Message(from: from, to: to, term: term, body: body)
    }

    static func decodeEntry(_ r: inout WireReader) throws(WireError) -> LogEntry {
        let index = try r.u64("entry index")
        let term = try r.u64("entry term")
        let kind: LogEntry.Kind
        switch try r.u8("entry kind") {
        case 1: kind = .command
        case 2: kind = .noop
        case 3: kind = .config(try decodeMembership(&r))
        default: throw .badValue(field: "entry kind")
        }
        return LogEntry(index: index, term: term, kind: kind, data: try r.bytes("entry data"))
    }

    static func decodeMembership(_ r: inout WireReader) throws(WireError) -> Membership {
        Membership(voters: try r.ids("voters"), learners: try r.ids("learners"))
    }

    static func decodeMeta(_ r: inout WireReader) throws(WireError) -> SnapshotMeta {
        SnapshotMeta(index: try r.u64("snapshot index"), term: try r.u64("snapshot term"), membership: try decodeMembership(&r))
    }
}

/// The first frame a dialling peer sends: magic "BNYPEER1", protocol version, cluster id, the
/// sender's and the intended receiver's node ids, and the address the sender listens on (so the
/// receiver can answer a node it has not heard of yet, such as a leader talking to a new
/// learner). The receiver answers with `PeerHelloReply` and closes the connection on refusal:
/// another cluster id, another protocol version, or a hello meant for another node.
public struct PeerHello: Sendable, Equatable {
    public static let magic: [UInt8] = Array("BNYPEER1".utf8)
    public var clusterID: String
    public var from: NodeID
    public var to: NodeID
    public var protocolVersion: UInt16
    public var address: String

    public init(clusterID: String, from: NodeID, to: NodeID, protocolVersion: UInt16, address: String) {
        self.clusterID = clusterID
        self.from = from
        self.to = to
        self.protocolVersion = protocolVersion
        self.address = address
    }

    public func encode() -> [UInt8] {
        var w = WireWriter()
        w.out.append(contentsOf: Self.magic)
        w.u16(protocolVersion)
        w.string(clusterID)
        w.u64(from)
        w.u64(to)
        w.string(address)
        return w.out
    }

    public static func decode(_ bytes: [UInt8]) throws(WireError) -> PeerHello {
        guard bytes.count >= magic.count, Array(bytes[0..<magic.count]) == magic else { throw .badMagic }
        var r = WireReader(bytes, at: magic.count)
        let version = try r.u16("protocol version")
        let cluster = try r.string("cluster id")
        let from = try r.u64("from")
        let to = try r.u64("to")
        let address = try r.string("address")
        guard r.remaining == 0 else { throw .trailingBytes(r.remaining) }
        return PeerHello(clusterID: cluster, from: from, to: to, protocolVersion: version, address: address)
    }
}

/// The answer to a hello: accepted, or refused with the reason (which both sides log).
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

    public func encode() -> [UInt8] {
        var w = WireWriter()
        w.out.append(contentsOf: Self.magic)
        w.u16(protocolVersion)
        w.bool(accepted)
        w.string(reason)
        return w.out
    }

    public static func decode(_ bytes: [UInt8]) throws(WireError) -> PeerHelloReply {
        guard bytes.count >= magic.count, Array(bytes[0..<magic.count]) == magic else { throw .badMagic }
        var r = WireReader(bytes, at: magic.count)
        let version = try r.u16("protocol version")
        let accepted = try r.bool("accepted")
        let reason = try r.string("reason")
        guard r.remaining == 0 else { throw .trailingBytes(r.remaining) }
        return PeerHelloReply(accepted: accepted, reason: reason, protocolVersion: version)
    }
}
