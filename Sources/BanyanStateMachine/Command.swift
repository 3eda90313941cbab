import BanyanTree

/// A client write as it travels through the replicated log (docs/internals/state-machine.md).
///
/// The data stays as the JSON the client sent: every replica parses it at apply time with the same
/// inputs (the bytes, the leader's timestamp, the tree the entry applies to), so server values
/// (`{".sv": "timestamp"}`, `{".sv": {"increment": n}}`) resolve identically everywhere.
public enum Command: Sendable, Equatable {
    /// Firebase `set` at a location (a path ending in `.priority` sets the priority).
    case set(path: String, json: [UInt8])
    /// Firebase `update` (multi-path): relative paths and their JSON values, applied atomically.
    case update(path: String, entries: [UpdateItem])
    /// A transaction's compare-and-set: applies `json` only if the current node hashes to
    /// `expectedHash` (Firebase's hash; the empty string for no data).
    case compareAndSet(path: String, expectedHash: String, json: [UInt8])

    public struct UpdateItem: Sendable, Equatable {
        public var path: String
        public var json: [UInt8]
        public init(path: String, json: [UInt8]) {
            self.path = path
            self.json = json
        }
    }
}

/// A command with its identity (for exactly-once application, R29), its namespace and the
/// leader's timestamp.
public struct CommandEnvelope: Sendable, Equatable {
    /// The namespace (an independent tree, like a database in a Firebase project).
    public var namespace: String
    /// The client session that issued the command.
    public var session: UInt64
    /// Increasing per session; a command at or below the session's last applied sequence number
    /// is a duplicate (a retry, or a forwarded proposal delivered twice) and is skipped.
    public var seq: UInt64
    /// Milliseconds since the epoch, stamped by the leader when it appends the entry.
    public var timestamp: Int64
    /// The session's watermark: every sequence number below it was applied or given up for good
    /// by the issuer (it will never propose it again). Applying the command settles them, so a
    /// write given up on leaves no permanent gap in the session record; a stale copy of one that
    /// commits later is a duplicate. 0 (and version-2 payloads) settle nothing.
    public var settledBelow: UInt64
    public var command: Command

    public init(namespace: String = "", session: UInt64, seq: UInt64, timestamp: Int64, settledBelow: UInt64 = 0, command: Command) {
        self.namespace = namespace
        self.session = session
        self.seq = seq
        self.timestamp = timestamp
        self.settledBelow = settledBelow
        self.command = command
    }

    /// Version 3 adds `settledBelow`; version 2 payloads (logs written before it) still decode.
    static let version: UInt8 = 3

    /// The log entry payload: version, kind, session, seq, timestamp, settledBelow, namespace,
    /// then length-prefixed fields.
    public func encoded() -> [UInt8] {
        var w = ByteWriter()
        w.out.reserveCapacity(byteCount)
        w.byte(Self.version)
        switch command {
        case .set: w.byte(1)
        case .update: w.byte(2)
        case .compareAndSet: w.byte(3)
        }
        w.u64(session)
        w.u64(seq)
        w.u64(UInt64(bitPattern: timestamp))
        w.u64(settledBelow)
        w.string(namespace)
        switch command {
        case let .set(path, json):
            w.string(path)
            w.bytes(json)
        case let .update(path, entries):
            w.string(path)
            w.u64(UInt64(entries.count))
            for e in entries {
                w.string(e.path)
                w.bytes(e.json)
            }
        case let .compareAndSet(path, expectedHash, json):
            w.string(path)
            w.string(expectedHash)
            w.bytes(json)
        }
        return w.out
    }

    /// The exact length of `encoded()`.
    var byteCount: Int {
        var n = 2 + 4 * 8 + 8 + namespace.utf8.count
        switch command {
        case let .set(path, json): n += 16 + path.utf8.count + json.count
        case let .update(path, entries):
            n += 16 + path.utf8.count
            for e in entries { n += 16 + e.path.utf8.count + e.json.count }
        case let .compareAndSet(path, expectedHash, json): n += 24 + path.utf8.count + expectedHash.utf8.count + json.count
        }
        return n
    }

    /// Decodes a payload; nil when it is not a well-formed command of a known version.
    public init?(decoding bytes: [UInt8]) {
        var r = ByteReader(bytes)
        guard let version = r.byte(), version == 2 || version == Self.version, let kind = r.byte(), let session = r.u64(),
            let seq = r.u64(), let stamp = r.u64()
        else { return nil }
        var settled: UInt64 = 0
        if version >= 3 {
            guard let s = r.u64() else { return nil }
            settled = s
        }
        guard let namespace = r.string(), let path = r.string() else { return nil }
        let command: Command
        switch kind {
        case 1:
            guard let json = r.bytes() else { return nil }
            command = .set(path: path, json: json)
        case 2:
            guard let count = r.u64(), count <= UInt64(bytes.count) else { return nil }
            var entries: [Command.UpdateItem] = []
            for _ in 0..<count {
                guard let p = r.string(), let json = r.bytes() else { return nil }
                entries.append(Command.UpdateItem(path: p, json: json))
            }
            command = .update(path: path, entries: entries)
        case 3:
            guard let hash = r.string(), let json = r.bytes() else { return nil }
            command = .compareAndSet(path: path, expectedHash: hash, json: json)
        default:
            return nil
        }
        guard r.atEnd else { return nil }
        self.init(
            namespace: namespace, session: session, seq: seq, timestamp: Int64(bitPattern: stamp), settledBelow: settled, command: command)
    }

    /// The same payload with another timestamp (the leader stamps every proposal it appends);
    /// nil when `payload` is too short or of another version. The rest is not decoded here: a
    /// damaged payload still applies as `malformed`, identically on every replica.
    public static func restamped(_ payload: [UInt8], timestamp: Int64) -> [UInt8]? {
        // The timestamp sits at a fixed offset (version, kind, session, seq precede it).
        guard payload.count >= 26, payload[0] == 2 || payload[0] == version else { return nil }
        var out = payload
        let v = UInt64(bitPattern: timestamp)
        for i in 0..<8 { out[18 + i] = UInt8(truncatingIfNeeded: v >> UInt64(8 * i)) }
        return out
    }
}

struct ByteWriter {
    var out: [UInt8] = []
    mutating func byte(_ b: UInt8) { out.append(b) }
    mutating func u64(_ v: UInt64) { withUnsafeBytes(of: v.littleEndian) { out.append(contentsOf: $0) } }
    mutating func bytes(_ b: [UInt8]) {
        u64(UInt64(b.count))
        out.append(contentsOf: b)
    }
    mutating func string(_ s: String) {
        u64(UInt64(s.utf8.count))
        out.append(contentsOf: s.utf8)
    }
}

struct ByteReader {
    let b: [UInt8]
    var at = 0
    init(_ b: [UInt8]) { self.b = b }
    var atEnd: Bool { at == b.count }
    mutating func byte() -> UInt8? {
        guard at < b.count else { return nil }
        defer { at += 1 }
        return b[at]
    }
    mutating func u64() -> UInt64? {
        guard at + 8 <= b.count else { return nil }
        var v: UInt64 = 0
        for i in 0..<8 { v |= UInt64(b[at + i]) << UInt64(8 * i) }
        at += 8
        return v
    }
    mutating func bytes() -> [UInt8]? {
        guard let n = u64(), n <= UInt64(b.count - at) else { return nil }
        defer { at += Int(n) }
        return Array(b[at..<at + Int(n)])
    }
    mutating func string() -> String? {
        guard let n = u64(), n <= UInt64(b.count - at) else { return nil }
        defer { at += Int(n) }
        return String(validating: b[at..<at + Int(n)], as: UTF8.self)
    }
}
