import BanyanBasics
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
    /// A transaction's compare-and-set: applies `json` only if the current value hashes to
    /// `expectedHash` (Firebase's hash; the empty string for no data).
    case compareAndSet(path: String, expectedHash: String, json: [UInt8])
    /// The issuing connection (the envelope's session) queues a set to run when it ends (v5 `o`).
    /// `secret` is the connection's: the first registration records it, and only a
    /// `connectionEnded` naming it fires the queue.
    /// `holder` is the lease under which the connection's node holds it (docs/realtime.md,
    /// "Node leases"): when the lease expires, the queue fires. 0: no lease (never expires).
    case onDisconnectSet(path: String, json: [UInt8], secret: UInt64, holder: UInt64 = 0)
    /// Queues a multi-path update (v5 `om`): relative paths and their JSON values.
    case onDisconnectUpdate(path: String, entries: [UpdateItem], secret: UInt64, holder: UInt64 = 0)
    /// Forgets what the connection queued at or below the path (v5 `oc`).
    case onDisconnectCancel(path: String, secret: UInt64)
    /// Connection `connection` is over (a clean close, a lost socket, a keep-alive timeout, a
    /// reconnect naming it, or its node's lease ran out): its queue fires as one atomic update,
    /// once, and nothing it sends afterwards applies. Proposed by any session; `secret` must be
    /// the one its queue recorded.
    case connectionEnded(connection: UInt64, secret: UInt64)
    /// Node `node` still holds its realtime connections under lease `holder` (a random id per
    /// node process and fencing epoch), proposed every few seconds by that node.
    case renewLease(holder: UInt64, node: UInt64)
    /// The leader saw no renewal of `holder` for a whole lease since the one applied at
    /// `lastRenewal` (0: none seen): the connections queued under it in this namespace end (their
    /// queues fire) and the holder is over for good. Applies only if `lastRenewal` is still the
    /// holder's latest renewal, or the holder already expired.
    case expireHolder(holder: UInt64, lastRenewal: UInt64)
    /// Replaces the namespace's security rules with `text` (a rules document, parsed by
    /// `BanyanRules`); an empty text removes them. Administrators only: a command that carries a
    /// client's `auth` is refused. Version 6 (docs/rules.md, "Rules in the log").
    case setRules(text: [UInt8])
    /// An operation of the built-in account service on the accounts of the project the
    /// envelope's namespace names (docs/accounts.md). Administrators only (the node's own
    /// account service proposes it). Version 7.
    case account(AccountOp)
    /// A node's free-space alarm raised or cleared (docs/operations.md, "Disk space"): while any
    /// node's alarm is raised, writes that add data are refused (`noSpace`) on every node at the
    /// same log position; deletes go on. The node's own command (never a client's). Version 8.
    case spaceAlarm(node: UInt64, raised: Bool)
    /// Forgets what idles past its retention (the leader's own command, docs/internals/
    /// state-machine.md, "Expiry"): client write records whose client last wrote more than
    /// `clientsIdleMillis` before this entry, and the session records of connections that ended
    /// more than `endedMillis` before it. At most `StateMachine.expiryBatch` of each per entry.
    /// Version 9.
    case expireIdle(clientsIdleMillis: UInt64, endedMillis: UInt64)

    public struct UpdateItem: Sendable, Equatable {
        public var path: String
        public var json: [UInt8]
        public init(path: String, json: [UInt8]) {
            self.path = path
            self.json = json
        }
    }
}

/// Who issued a client write, as the security rules see it (`auth`). A command without one
/// (administrators, the node's own commands, and every command written before version 6) is
/// not subject to rules.
public enum ClientAuth: Sendable, Equatable {
    /// A client that is not signed in (`auth == null`).
    case signedOut
    /// A signed-in client: the `auth` object as JSON (`uid`, `provider`, `token` claims).
    case user(json: [UInt8])
}

/// A command with its identity (for exactly-once application, R29), its namespace and the
/// leader's timestamp.
extension Command {
    /// Whether applying it may add data: refused while a free-space alarm is raised. Deletes
    /// (every written value `null`), cancellations, ends of connections, leases, rules, the
    /// alarms themselves and account deletions and sign-ins go on.
    public var addsData: Bool {
        func isNull(_ json: [UInt8]) -> Bool {
            let trimmed = json.drop { $0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D }
            let end = trimmed.lastIndex { !($0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D) }
            guard let end else { return false }
            return trimmed[...end].elementsEqual("null".utf8)
        }
        switch self {
        case .set(_, let json), .compareAndSet(_, _, let json), .onDisconnectSet(_, let json, _, _):
            return !isNull(json)
        case .update(_, let entries), .onDisconnectUpdate(_, let entries, _, _):
            return entries.contains { !isNull($0.json) }
        case .account(let op):
            switch op {
            case .create, .update: return true
            case .signIn(_, _, let createIfAbsent): return createIfAbsent != nil
            case .delete, .installKey: return false
            }
        case .onDisconnectCancel, .connectionEnded, .renewLease, .expireHolder, .setRules, .spaceAlarm, .expireIdle:
            return false
        }
    }
}

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
    /// The session applies its commands strictly in sequence order (a realtime connection's:
    /// Firebase applies one connection's writes in the order they were sent). Such a command
    /// applies only once every lower number of its session is applied or settled; before that it
    /// is refused as `outOfOrder`, changes nothing but the settled watermark, and its issuer
    /// proposes it again (docs/internals/state-machine.md, "Ordered sessions").
    public var ordered: Bool
    public var command: Command
    /// The client the rules judge the command for; nil: not subject to rules.
    public var auth: ClientAuth?
    /// A client's own name for this write (an SDK's stable client id and its write number):
    /// applied at most once whatever connection, node or session carries it (version 9, sets,
    /// updates and compare-and-sets only; docs/internals/state-machine.md, "Client writes").
    public var clientWrite: ClientWriteKey?

    public init(
        namespace: String = "", session: UInt64, seq: UInt64, timestamp: Int64, settledBelow: UInt64 = 0, ordered: Bool = false, command: Command,
        auth: ClientAuth? = nil, clientWrite: ClientWriteKey? = nil
    ) {
        self.namespace = namespace
        self.session = session
        self.seq = seq
        self.timestamp = timestamp
        self.settledBelow = settledBelow
        self.ordered = ordered
        self.command = command
        self.auth = auth
        self.clientWrite = clientWrite
    }

    /// Version 3 adds `settledBelow`; version 4 the lease holder of `o`/`om` and the lease
    /// commands; version 5 the `ordered` flag (the kind byte's high bit), with version 4's
    /// layout. Version 2, 3 and 4 payloads (logs written before) still decode (holder 0,
    /// unordered). Commands that need nothing newer are still written as version 3 or 4, byte
    /// for byte as before. Version 6 (rules): version 4's layout with the ordered flag allowed
    /// (not required) in the kind byte, the `setRules` kind, and a trailer naming the client
    /// (`auth`: 0 none, 1 signed out, 2 a user and its JSON). Version 7 (accounts): version
    /// 6's layout and the `account` kind; only account commands are written as version 7.
    /// Version 8: version 6's layout and the `spaceAlarm` kind (the only kind written as 8).
    /// Version 9: version 6's layout with a trailer after `auth` naming the client's write
    /// (`clientWrite`: client, number, acknowledged-below; u64 each), for sets, updates and
    /// compare-and-sets; only commands that carry one are written as 9.
    static let version: UInt8 = 9
    /// The kind byte's flag for `ordered` (version 5).
    static let orderedFlag: UInt8 = 0x80
    /// Where `settledBelow` sits in a version 3+ payload (after version, kind, session, seq and
    /// timestamp).
    static let settledOffset = 26

    /// The version this command is written in.
    var writtenVersion: UInt8 {
        if clientWrite != nil, command.takesClientWrite { return 9 }
        if case .expireIdle = command { return 9 }
        if case .spaceAlarm = command { return 8 }
        if case .account = command { return 7 }
        if auth != nil { return 6 }
        if case .setRules = command { return 6 }
        if ordered { return 5 }
        switch command {
        case .setRules: return 6
        case .account: return 7
        case .spaceAlarm: return 8
        case .expireIdle: return 9
        case .onDisconnectSet, .onDisconnectUpdate, .renewLease, .expireHolder: return 4
        case .set, .update, .compareAndSet, .onDisconnectCancel, .connectionEnded: return 3
        }
    }

    /// The log entry payload: version, kind, session, seq, timestamp, settledBelow, namespace,
    /// then length-prefixed fields (the shared byte codec's conventions: little-endian, u64
    /// lengths; docs/internals/byte-codec.md).
    public func encoded() -> [UInt8] {
        var w = ByteWriter(capacity: byteCount)
        let version = writtenVersion
        w.u8(version)
        let flags = ordered ? Self.orderedFlag : 0
        switch command {
        case .set: w.u8(1 | flags)
        case .update: w.u8(2 | flags)
        case .compareAndSet: w.u8(3 | flags)
        case .onDisconnectSet: w.u8(4 | flags)
        case .onDisconnectUpdate: w.u8(5 | flags)
        case .onDisconnectCancel: w.u8(6 | flags)
        case .connectionEnded: w.u8(7 | flags)
        case .renewLease: w.u8(8 | flags)
        case .expireHolder: w.u8(9 | flags)
        case .setRules: w.u8(10 | flags)
        case .account: w.u8(11 | flags)
        case .spaceAlarm: w.u8(12 | flags)
        case .expireIdle: w.u8(13 | flags)
        }
        w.u64(session)
        w.u64(seq)
        w.i64(timestamp)
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
        case let .onDisconnectSet(path, json, secret, holder):
            w.string(path)
            w.bytes(json)
            w.u64(secret)
            w.u64(holder)
        case let .onDisconnectUpdate(path, entries, secret, holder):
            w.string(path)
            w.u64(UInt64(entries.count))
            for e in entries {
                w.string(e.path)
                w.bytes(e.json)
            }
            w.u64(secret)
            w.u64(holder)
        case let .onDisconnectCancel(path, secret):
            w.string(path)
            w.u64(secret)
        case let .connectionEnded(connection, secret):
            // The path field is empty: the connection names what it ends.
            w.string("")
            w.u64(connection)
            w.u64(secret)
        case let .renewLease(holder, node):
            w.string("")
            w.u64(holder)
            w.u64(node)
        case let .expireHolder(holder, lastRenewal):
            w.string("")
            w.u64(holder)
            w.u64(lastRenewal)
        case let .setRules(text):
            w.string("")
            w.bytes(text)
        case let .account(op):
            w.string("")
            w.bytes(op.encoded)
        case let .spaceAlarm(node, raised):
            w.string("")
            w.u64(node)
            w.u8(raised ? 1 : 0)
        case let .expireIdle(clients, ended):
            w.string("")
            w.u64(clients)
            w.u64(ended)
        }
        if version >= 6 {
            switch auth {
            case nil: w.u8(0)
            case .signedOut?: w.u8(1)
            case .user(let json)?:
                w.u8(2)
                w.bytes(json)
            }
        }
        if version == 9, let key = clientWrite {
            w.u64(key.client)
            w.u64(key.number)
            w.u64(key.acknowledgedBelow)
        }
        return w.finish()
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
        case let .onDisconnectSet(path, json, _, _): n += 32 + path.utf8.count + json.count
        case let .onDisconnectUpdate(path, entries, _, _):
            n += 32 + path.utf8.count
            for e in entries { n += 16 + e.path.utf8.count + e.json.count }
        case let .onDisconnectCancel(path, _): n += 16 + path.utf8.count
        case .connectionEnded, .renewLease, .expireHolder: n += 24
        case let .setRules(text): n += 16 + text.count
        case let .account(op): n += 16 + op.encoded.count
        case .spaceAlarm: n += 17
        case .expireIdle: n += 24
        }
        switch auth {
        case nil: n += writtenVersion >= 6 ? 1 : 0
        case .signedOut?: n += 1
        case .user(let json)?: n += 9 + json.count
        }
        if writtenVersion == 9 { n += 24 }
        return n
    }

    /// Decodes a payload; nil when it is not a well-formed command of a known version.
    public init?(decoding bytes: [UInt8]) {
        guard let envelope = try? Self.decode(bytes) else { return nil }
        self = envelope
    }

    /// Decodes a payload, or says which field is malformed: the whole payload must be one
    /// command of a known version (2 to 9).
    static func decode(_ bytes: [UInt8]) throws(ByteCodecError) -> CommandEnvelope {
        try ByteReader.readAll(bytes) { (r) throws(ByteCodecError) in
            var version = try r.u8("command version")
            guard (2...Self.version).contains(version) else { throw .badValue(field: "command version") }
            var kind = try r.u8("command kind")
            // Version 5 is version 4 with the ordered flag, which it must carry (an unordered
            // command is written as version 3 or 4).
            let written = version
            var ordered = version == 5
            if ordered {
                guard kind & Self.orderedFlag != 0 else { throw .badValue(field: "command kind") }
                kind &= ~Self.orderedFlag
                version = 4
            } else if version >= 6 {
                ordered = kind & Self.orderedFlag != 0
                kind &= ~Self.orderedFlag
                version = 4
            }
            let session = try r.u64("session")
            let seq = try r.u64("seq")
            let stamp = try r.i64("timestamp")
            let settled = version >= 3 ? try r.u64("settledBelow") : 0
            let namespace = try r.string("namespace")
            let path = try r.string("path")
            let command: Command
            switch kind {
            case 1:
                command = .set(path: path, json: try r.bytes("json"))
            case 2:
                command = .update(path: path, entries: try Self.updateItems(&r))
            case 3:
                let hash = try r.string("expected hash")
                command = .compareAndSet(path: path, expectedHash: hash, json: try r.bytes("json"))
            case 4 where version >= 3:
                let json = try r.bytes("json")
                let secret = try r.u64("secret")
                command = .onDisconnectSet(path: path, json: json, secret: secret, holder: version >= 4 ? try r.u64("holder") : 0)
            case 5 where version >= 3:
                let entries = try Self.updateItems(&r)
                let secret = try r.u64("secret")
                command = .onDisconnectUpdate(path: path, entries: entries, secret: secret, holder: version >= 4 ? try r.u64("holder") : 0)
            case 6 where version >= 3:
                command = .onDisconnectCancel(path: path, secret: try r.u64("secret"))
            case 7 where version >= 3:
                guard path.isEmpty else { throw .badValue(field: "path") }
                let connection = try r.u64("connection")
                command = .connectionEnded(connection: connection, secret: try r.u64("secret"))
            case 8 where version >= 4:
                guard path.isEmpty else { throw .badValue(field: "path") }
                let holder = try r.u64("holder")
                command = .renewLease(holder: holder, node: try r.u64("node"))
            case 9 where version >= 4:
                guard path.isEmpty else { throw .badValue(field: "path") }
                let holder = try r.u64("holder")
                command = .expireHolder(holder: holder, lastRenewal: try r.u64("lastRenewal"))
            case 10 where written == 6:
                guard path.isEmpty else { throw .badValue(field: "path") }
                command = .setRules(text: try r.bytes("rules"))
            case 11 where written == 7:
                guard path.isEmpty, let op = AccountOp(decoding: try r.bytes("account")) else { throw .badValue(field: "account") }
                command = .account(op)
            case 13 where written == 9:
                guard path.isEmpty else { throw .badValue(field: "path") }
                command = .expireIdle(clientsIdleMillis: try r.u64("clients idle"), endedMillis: try r.u64("ended"))
            case 12 where written == 8:
                guard path.isEmpty else { throw .badValue(field: "path") }
                let node = try r.u64("node")
                switch try r.u8("raised") {
                case 0: command = .spaceAlarm(node: node, raised: false)
                case 1: command = .spaceAlarm(node: node, raised: true)
                default: throw .badValue(field: "raised")
                }
            default:
                throw .badValue(field: "command kind")
            }
            var auth: ClientAuth?
            if written >= 6 {
                switch try r.u8("auth kind") {
                case 0: auth = nil
                case 1: auth = .signedOut
                case 2: auth = .user(json: try r.bytes("auth"))
                default: throw .badValue(field: "auth kind")
                }
            }
            var clientWrite: ClientWriteKey?
            if written == 9, case .expireIdle = command {
                // Version 9's own kind: no client write trailer.
            } else if written == 9 {
                guard command.takesClientWrite else { throw .badValue(field: "command kind") }
                let key = ClientWriteKey(client: try r.u64("client"), number: try r.u64("client write number"), acknowledgedBelow: try r.u64("acknowledged below"))
                guard key.client != 0, key.number != 0 else { throw .badValue(field: "client write") }
                clientWrite = key
            }
            return CommandEnvelope(
                namespace: namespace, session: session, seq: seq, timestamp: stamp, settledBelow: settled, ordered: ordered, command: command,
                auth: auth, clientWrite: clientWrite)
        }
    }

    /// A multi-path update's items: a count, then each relative path and its JSON.
    private static func updateItems(_ r: inout ByteReader) throws(ByteCodecError) -> [Command.UpdateItem] {
        // An item takes at least 16 bytes (its path's and its JSON's lengths).
        let count = try r.count("update items", itemBytes: 16)
        var entries: [Command.UpdateItem] = []
        entries.reserveCapacity(count)
        for _ in 0..<count {
            let p = try r.string("update path")
            entries.append(Command.UpdateItem(path: p, json: try r.bytes("update json")))
        }
        return entries
    }

    /// A connection's own `connectionEnded`, proposed in its own session.
    var endsItsOwnSession: Bool {
        if case .connectionEnded(let connection, _) = command { return connection == session }
        return false
    }

    /// The same payload with another timestamp (the leader stamps every proposal it appends);
    /// nil when `payload` is too short or of another version. The rest is not decoded here: a
    /// damaged payload still applies as `malformed`, identically on every replica.
    public static func restamped(_ payload: [UInt8], timestamp: Int64) -> [UInt8]? {
        // The timestamp sits at a fixed offset (version, kind, session, seq precede it).
        guard payload.count >= 26, (2...version).contains(payload[0]) else { return nil }
        var out = payload
        var w = ByteWriter(continuing: &out)
        w.patch(timestamp, at: 18)
        return w.finish()
    }

    /// A payload's identity and order, read from its fixed header (version, kind, session, seq):
    /// nil when it is too short or of another version. `ordered`: the kind byte's flag
    /// (version 5 on; earlier versions are unordered).
    public static func header(of payload: [UInt8]) -> (session: UInt64, seq: UInt64, ordered: Bool)? {
        guard payload.count >= 18, (2...version).contains(payload[0]) else { return nil }
        var session: UInt64 = 0
        var seq: UInt64 = 0
        for i in 0..<8 {
            session |= UInt64(payload[2 + i]) << (8 * UInt64(i))
            seq |= UInt64(payload[10 + i]) << (8 * UInt64(i))
        }
        return (session, seq, payload[0] >= 5 && payload[1] & orderedFlag != 0)
    }

    /// The leader's timestamp a payload carries (ms since the epoch); nil when `payload` is too
    /// short or of another version. Point-in-time restore stops at the first command stamped
    /// after its target time. A staged reference (docs/staged-payloads.md) carries its payload's timestamp.
    public static func timestamp(of payload: [UInt8]) -> Int64? {
        if StagedReference.isReference(payload) { return StagedReference(decoding: payload)?.timestamp }
        guard payload.count >= 26, (2...version).contains(payload[0]) else { return nil }
        var stamp: UInt64 = 0
        for i in 0..<8 { stamp |= UInt64(payload[18 + i]) << (8 * UInt64(i)) }
        return Int64(bitPattern: stamp)
    }

    /// The same payload with its settled watermark raised to `settledBelow` (a retry carries what
    /// its issuer has given up on since it was first encoded); the payload itself when it is of
    /// version 2 (no watermark), too short, or already carries as much.
    public static func resettled(_ payload: [UInt8], settledBelow: UInt64) -> [UInt8] {
        guard payload.count >= settledOffset + 8, (3...version).contains(payload[0]) else { return payload }
        var current: UInt64 = 0
        for i in 0..<8 { current |= UInt64(payload[settledOffset + i]) << (8 * UInt64(i)) }
        guard settledBelow > current else { return payload }
        var out = payload
        var w = ByteWriter(continuing: &out)
        w.patch(settledBelow, at: settledOffset)
        return w.finish()
    }
}
