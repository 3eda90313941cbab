public import BanyanBasics

/// A log entry that stands for a staged payload (docs/staged-payloads.md): the payload, a
/// command envelope stamped by the leader, is durable in every holder's staged store, and the
/// log carries only this. The replica applies the payload in its place; the state machine never
/// sees a reference (to it, the version byte is unknown: `malformed`).
///
/// Layout (54 bytes, little-endian): version `0xB5`, the id's term and counter, the payload's
/// length and CRC32C, then the payload's own header fields the replica and point-in-time
/// restore read from a command: session, sequence number, flags (bit 0: ordered) and the
/// leader's timestamp.
public struct StagedReference: Sendable, Equatable {
    public var id: StageID
    public var length: UInt64
    public var checksum: UInt32
    public var session: UInt64
    public var seq: UInt64
    public var ordered: Bool
    public var timestamp: Int64

    /// No command envelope starts with it (their versions are 2 to `CommandEnvelope.version`).
    public static let version: UInt8 = 0xB5
    public static let encodedSize = 54

    public init(id: StageID, length: UInt64, checksum: UInt32, session: UInt64, seq: UInt64, ordered: Bool, timestamp: Int64) {
        self.id = id
        self.length = length
        self.checksum = checksum
        self.session = session
        self.seq = seq
        self.ordered = ordered
        self.timestamp = timestamp
    }

    /// The reference to `payload` (a command envelope) staged as `id`; nil when `payload` is no
    /// command envelope (only commands are staged).
    public init?(id: StageID, payload: [UInt8], checksum: UInt32) {
        guard let header = CommandEnvelope.header(of: payload), let stamp = CommandEnvelope.timestamp(of: payload) else { return nil }
        self.init(
            id: id, length: UInt64(payload.count), checksum: checksum, session: header.session, seq: header.seq, ordered: header.ordered,
            timestamp: stamp)
    }

    public func encoded() -> [UInt8] {
        var w = ByteWriter(capacity: Self.encodedSize)
        w.u8(Self.version)
        w.u64(id.term)
        w.u64(id.n)
        w.u64(length)
        w.u32(checksum)
        w.u64(session)
        w.u64(seq)
        w.u8(ordered ? 1 : 0)
        w.i64(timestamp)
        return w.finish()
    }

    /// Whether a log payload is a reference (by its version byte; `init(decoding:)` checks the rest).
    public static func isReference(_ payload: [UInt8]) -> Bool { payload.first == version }

    /// Decodes a reference; nil for anything else, or a reference of the wrong size or with
    /// unknown flags.
    public init?(decoding payload: [UInt8]) {
        guard payload.count == Self.encodedSize, payload[0] == Self.version else { return nil }
        let decoded: StagedReference? = payload.withUnsafeBytes { raw in
            var r = ByteReader(raw, at: 1)
            do throws(ByteCodecError) {
                let term = try r.u64("term")
                let n = try r.u64("n")
                let length = try r.u64("length")
                let checksum = try r.u32("checksum")
                let session = try r.u64("session")
                let seq = try r.u64("seq")
                let flags = try r.u8("flags")
                let timestamp = try r.i64("timestamp")
                guard flags <= 1, r.atEnd else { return nil }
                return StagedReference(
                    id: StageID(term: term, n: n), length: length, checksum: checksum, session: session, seq: seq, ordered: flags == 1,
                    timestamp: timestamp)
            } catch {
                return nil
            }
        }
        guard let decoded else { return nil }
        self = decoded
    }
}
