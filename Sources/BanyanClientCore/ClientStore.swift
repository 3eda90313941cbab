public import BanyanBasics
public import BanyanTree

/// The SDK's disk cache, as records (docs/swift-sdk.md, "Offline and persistence"): the client's
/// identity and next write number, its unanswered writes, the server's data for locations it
/// synced completely, and the windows of filtered queries it synced. The driver appends records to one file per database and gives the records
/// back at the next start; the file is rewritten from `ClientCore.compactedRecords` when it grows
/// past the cache size. Pure: encoding, framing and replay only.
///
/// A file is `"BNYCLI01"` then frames: `length u32 | checksum u64 (FNV-1a of the body) | body`.
/// A frame cut short or with a wrong checksum ends the file there (an append torn by a crash:
/// every record before it stands).
public enum ClientStore {
    /// Format 3: format 2's records and writes made while signed in (record kind 7: a write
    /// record that also says so, `StoredWrite.signedIn`). Format 2 added filtered queries'
    /// windows (`query`) to format 1. Files of formats 1 and 2 are read too, and the driver
    /// turns one into format 3 before appending to it (`Restored.olderFormat`), so an older SDK
    /// never reads a record it does not know: it sees no cache and starts afresh, rather than
    /// cutting the file at the first unknown record and reusing write numbers the server has
    /// already answered.
    public static let magic: [UInt8] = Array("BNYCLI03".utf8)
    /// The magic of format 1 (no `query` records).
    public static let magicFormatOne: [UInt8] = Array("BNYCLI01".utf8)
    /// The magic of format 2 (no signed-in writes).
    public static let magicFormatTwo: [UInt8] = Array("BNYCLI02".utf8)
    /// The largest record accepted (a write or a cached location of up to 64 MiB).
    public static let maxRecordBytes = 64 << 20

    public enum WriteKind: UInt8, Sendable {
        case set = 1
        case merge = 2
        case priority = 3
        /// A transaction's compare-and-set: after a restart its function is gone, so if the data
        /// changed it fails rather than running again.
        case transaction = 4
    }

    /// A pending write as stored: enough to send it again and show it in local views.
    public struct StoredWrite: Sendable, Equatable {
        public var number: UInt64
        public var kind: WriteKind
        public var path: Path
        /// The JSON (set, priority, transaction) or the children (merge).
        public var json: [UInt8]
        public var children: [(Path, [UInt8])]
        public var hash: String
        public var visible: Bool
        /// Made while the connection had a credential: after a restart it is held until one is
        /// set again (`ClientCore.setAuthToken`), so rules that need the user still see one.
        public var signedIn: Bool

        public init(
            number: UInt64, kind: WriteKind, path: Path, json: [UInt8] = [], children: [(Path, [UInt8])] = [], hash: String = "", visible: Bool = true,
            signedIn: Bool = false
        ) {
            self.number = number
            self.kind = kind
            self.path = path
            self.json = json
            self.children = children
            self.hash = hash
            self.visible = visible
            self.signedIn = signedIn
        }

        public static func == (a: StoredWrite, b: StoredWrite) -> Bool {
            a.number == b.number && a.kind == b.kind && a.path == b.path && a.json == b.json && a.hash == b.hash && a.visible == b.visible
                && a.signedIn == b.signedIn
                && a.children.count == b.children.count && zip(a.children, b.children).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        }
    }

    public enum Record: Sendable, Equatable {
        /// The client id and the next write number never used.
        case identity(client: UInt64, nextNumber: UInt64)
        case write(StoredWrite)
        /// The write with this number was answered (or given up): not sent again.
        case writeDone(UInt64)
        /// The server's data at a path (export format JSON; `null` removes).
        case server(Path, [UInt8])
        /// The location's data is complete in the cache (or, false, no longer kept).
        case complete(Path, Bool)
        /// A filtered query's data (its window) as the server last sent it, complete: the query
        /// at `path` with `query` as its identifier (`QueryParams.identifier`); `at` is relative
        /// to `path` (empty: the whole window). No JSON at all (zero bytes) forgets the query.
        case query(path: Path, query: String, at: Path, json: [UInt8])
    }

    /// A filtered query whose window the cache holds: its location and identifier.
    public struct QueryKey: Hashable, Sendable, Comparable {
        public var path: Path
        public var query: String
        public init(path: Path, query: String) {
            self.path = path
            self.query = query
        }
        public static func < (a: QueryKey, b: QueryKey) -> Bool { a.path != b.path ? a.path < b.path : a.query < b.query }
    }

    /// What a file held: the state the core starts from.
    public struct Restored: Sendable {
        public var client: UInt64 = 0
        public var nextNumber: UInt64 = 1
        public var writes: [StoredWrite] = []
        public var server: Tree = .empty
        public var complete: Set<Path> = []
        /// The windows of filtered queries (each complete as the server last sent it).
        public var queries: [QueryKey: Tree] = [:]
        /// The file is in format 1.
        public var formatOne = false
        /// The file is in format 1 or 2: its magic must become format 3's before anything is
        /// appended.
        public var olderFormat = false
        /// Bytes of valid records (a torn tail after them is ignored and overwritten).
        public var validBytes = 0
        public var records = 0
        public init() {}
    }

    // MARK: - Encoding

    /// The bytes `encode(record)` produces, counted without encoding it (compaction measures
    /// every record it keeps against its budget): a 12-byte frame (length, checksum), then the
    /// body, whose strings and byte runs carry an 8-byte length each.
    public static func encodedSize(_ record: Record) -> Int {
        func run(_ n: Int) -> Int { 8 + n }
        let body: Int
        switch record {
        case .identity:
            body = 1 + 8 + 8
        case .write(let write):
            body =
                1 + 8 + 1 + 1 + run(write.path.description.utf8.count) + run(write.hash.utf8.count) + run(write.json.count) + 8
                + write.children.reduce(0) { $0 + run($1.0.description.utf8.count) + run($1.1.count) }
        case .writeDone:
            body = 1 + 8
        case let .server(path, json):
            body = 1 + run(path.description.utf8.count) + run(json.count)
        case let .complete(path, _):
            body = 1 + run(path.description.utf8.count) + 1
        case let .query(path, query, at, json):
            body = 1 + run(path.description.utf8.count) + run(query.utf8.count) + run(at.description.utf8.count) + run(json.count)
        }
        return 12 + body
    }

    public static func encode(_ record: Record) -> [UInt8] {
        var w = ByteWriter(capacity: 64)
        switch record {
        case let .identity(client, next):
            w.u8(1)
            w.u64(client)
            w.u64(next)
        case .write(let write):
            w.u8(write.signedIn ? 7 : 2)
            w.u64(write.number)
            w.u8(write.kind.rawValue)
            w.u8(write.visible ? 1 : 0)
            w.string(write.path.description)
            w.string(write.hash)
            w.bytes(write.json)
            w.u64(UInt64(write.children.count))
            for (p, json) in write.children {
                w.string(p.description)
                w.bytes(json)
            }
        case .writeDone(let n):
            w.u8(3)
            w.u64(n)
        case let .server(path, json):
            w.u8(4)
            w.string(path.description)
            w.bytes(json)
        case let .complete(path, flag):
            w.u8(5)
            w.string(path.description)
            w.u8(flag ? 1 : 0)
        case let .query(path, query, at, json):
            w.u8(6)
            w.string(path.description)
            w.string(query)
            w.string(at.description)
            w.bytes(json)
        }
        let body = w.finish()
        var frame = ByteWriter(capacity: body.count + 12)
        frame.u32(UInt32(body.count))
        frame.u64(checksum(body))
        frame.raw(body)
        return frame.finish()
    }

    static func decodeBody(_ body: [UInt8]) throws(ByteCodecError) -> Record {
        try ByteReader.readAll(body) { (r) throws(ByteCodecError) -> Record in
            func path(_ field: String) throws(ByteCodecError) -> Path {
                let text = try r.string(field)
                guard let p = try? Path(parsing: text) else { throw .badValue(field: field) }
                return p
            }
            switch try r.u8("record kind") {
            case 1:
                return .identity(client: try r.u64("client"), nextNumber: try r.u64("next number"))
            case let kind where kind == 2 || kind == 7:
                let number = try r.u64("number")
                guard let writeKind = WriteKind(rawValue: try r.u8("write kind")) else { throw .badValue(field: "write kind") }
                let visible = try r.bool("visible")
                let p = try path("path")
                let hash = try r.string("hash")
                let json = try r.bytes("json")
                let count = try r.count("children", itemBytes: 16)
                var children: [(Path, [UInt8])] = []
                for _ in 0..<count { children.append((try path("child path"), try r.bytes("child json"))) }
                return .write(StoredWrite(number: number, kind: writeKind, path: p, json: json, children: children, hash: hash, visible: visible, signedIn: kind == 7))
            case 3:
                return .writeDone(try r.u64("number"))
            case 4:
                return .server(try path("path"), try r.bytes("json"))
            case 5:
                return .complete(try path("path"), try r.bool("complete"))
            case 6:
                return .query(path: try path("path"), query: try r.string("query"), at: try path("query child"), json: try r.bytes("json"))
            default:
                throw .badValue(field: "record kind")
            }
        }
    }

    /// FNV-1a, 64 bits: enough to tell a torn or damaged frame.
    static func checksum(_ bytes: [UInt8]) -> UInt64 {
        var h: UInt64 = 0xCBF2_9CE4_8422_2325
        for b in bytes {
            h ^= UInt64(b)
            h = h &* 0x0000_0100_0000_01B3
        }
        return h
    }

    // MARK: - Reading a file

    /// Replays a file's bytes. A file that does not start with the magic is not a cache (nil:
    /// the caller starts afresh and overwrites it).
    public static func restore(_ bytes: [UInt8]) -> Restored? {
        guard bytes.count >= magic.count else { return nil }
        let head = Array(bytes.prefix(magic.count))
        guard head == magic || head == magicFormatTwo || head == magicFormatOne else { return nil }
        var state = Restored()
        state.formatOne = head == magicFormatOne
        state.olderFormat = head != magic
        var writes: [UInt64: StoredWrite] = [:]
        var order: [UInt64] = []
        var highest: UInt64 = 0
        var offset = magic.count
        state.validBytes = offset
        while bytes.count - offset >= 12 {
            func le(_ at: Int, _ n: Int) -> UInt64 { (0..<n).reduce(UInt64(0)) { $0 | UInt64(bytes[at + $1]) << (8 * UInt64($1)) } }
            let length = le(offset, 4)
            let stored = le(offset + 4, 8)
            guard length <= UInt64(maxRecordBytes), UInt64(bytes.count - offset - 12) >= length else { break }
            let body = Array(bytes[(offset + 12)..<(offset + 12 + Int(length))])
            guard checksum(body) == stored, let record = try? decodeBody(body) else { break }
            offset += 12 + Int(length)
            state.validBytes = offset
            state.records += 1
            switch record {
            case let .identity(client, next):
                state.client = client
                highest = max(highest, next &- 1)
            case .write(let w):
                if writes[w.number] == nil { order.append(w.number) }
                writes[w.number] = w
                highest = max(highest, w.number)
            case .writeDone(let n):
                writes[n] = nil
            case let .server(path, json):
                if let tree = try? TreeReader.read(json, at: path, limits: .snapshot) { state.server.set(tree, at: path) }
            case let .complete(path, flag):
                if flag { state.complete.insert(path) } else { state.complete.remove(path) }
            case let .query(path, query, at, json):
                let key = QueryKey(path: path, query: query)
                if json.isEmpty {
                    state.queries[key] = nil
                    break
                }
                guard let tree = try? TreeReader.read(json, at: path.appending(at), limits: .snapshot) else { break }
                if at.count == 0 {
                    state.queries[key] = tree
                } else if state.queries[key] != nil {
                    state.queries[key]?.set(tree, at: at)
                }
            }
        }
        state.writes = order.compactMap { writes[$0] }
        state.nextNumber = highest &+ 1
        return state
    }
}
