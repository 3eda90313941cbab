public import BanyanBasics
public import BanyanOpLog

/// The backup file and the log archive (docs/backup.md).
///
/// A backup is one state-machine image at one committed index, cut into frames that are each
/// compressed and checksummed on their own, so damage is found (and reported) at the frame it
/// hits, and a reader holds one frame at a time:
///
///     "BNYBAK01" | header length (u32) | header fields | CRC32C of the fields (u32)
///     frames: compressed length (u32, > 0) | image length (u32) | CRC32C of the image bytes (u32)
///             | CRC32C of the compressed bytes (u32) | compressed bytes (one zlib stream)
///     end:    0 (u32) | frame count (u64) | image length (u64) | CRC32C of the whole image (u32)
///             | CRC32C of these 20 bytes (u32) | "BNYBEND1"
///
/// Header fields: format version (u16, 2), cluster id (string), source node (u64), index (u64),
/// term (u64), the leader timestamp of the last applied command (i64, ms), the time the backup
/// was taken (i64, ms), and (version 2 only) the term of the entry at `index` (u64, 0: unknown)
/// and its content checksum (u8 1 then u32 `ArchivedEntry.contentChecksum`, or u8 0: unknown).
/// Integers little-endian; strings are a u64 length and UTF-8. Version 1 files still read (their
/// entry term is unknown).
public struct BackupHeader: Sendable, Equatable {
    public var clusterID: String
    public var sourceNode: UInt64
    /// The committed index the image stands for (every entry up to it applied).
    public var index: UInt64
    /// The source's term when the backup was taken (at least the term of `index`).
    public var term: UInt64
    /// The leader's timestamp of the last command applied (0: none).
    public var lastTimestamp: Int64
    public var createdAt: Int64
    /// The term of the log entry at `index` (0: unknown: a version 1 file, or index 0). With the
    /// index it names the source's history (Raft's log matching): `banyan backup --follow`
    /// checks that a node continues it before archiving entries after a base backup.
    public var indexTerm: UInt64
    /// `ArchivedEntry.contentChecksum` of the entry at `index` (nil: unknown, as when the source
    /// had compacted it into its snapshot). Two clusters that share an id and a term history are
    /// told apart by it: a command's bytes carry a random session id.
    public var indexEntryChecksum: UInt32?

    public init(
        clusterID: String, sourceNode: UInt64, index: UInt64, term: UInt64, lastTimestamp: Int64, createdAt: Int64, indexTerm: UInt64 = 0,
        indexEntryChecksum: UInt32? = nil
    ) {
        self.clusterID = clusterID
        self.sourceNode = sourceNode
        self.index = index
        self.term = term
        self.lastTimestamp = lastTimestamp
        self.createdAt = createdAt
        self.indexTerm = indexTerm
        self.indexEntryChecksum = indexEntryChecksum
    }
}

/// A damaged or unreadable backup or archive: what is wrong and the byte offset in the file
/// (or stream) where the damaged part starts.
public struct BackupError: Error, Sendable, Equatable, CustomStringConvertible {
    public var offset: UInt64
    public var reason: String
    /// The file the offset is in (a backup, or one file of a log archive), when known.
    public var file: String?
    public init(offset: UInt64, _ reason: String, file: String? = nil) {
        self.offset = offset
        self.reason = reason
        self.file = file
    }
    /// The same error, naming `file` unless it already names one.
    public func inFile(_ path: String) -> BackupError {
        var e = self
        if e.file == nil { e.file = path }
        return e
    }
    public var description: String { (file.map { "\($0): " } ?? "") + "\(reason) (at byte offset \(offset))" }
}

public enum BackupFormat {
    public static let magic: [UInt8] = Array("BNYBAK01".utf8)
    public static let endMagic: [UInt8] = Array("BNYBEND1".utf8)
    public static let version: UInt16 = 2
    /// The oldest format version this build still reads.
    public static let oldestVersion: UInt16 = 1
    /// Image bytes per frame: large enough to compress well, small enough to hold one at a time.
    public static let frameImageBytes = 4 << 20
    /// The largest frame a reader accepts (compressed or not): anything beyond is damage.
    public static let maxFrameBytes = 64 << 20
    /// Header fields beyond this are damage (a cluster id is short).
    static let maxHeaderBytes = 1 << 16

    public static func encodeHeader(_ h: BackupHeader) -> [UInt8] {
        var fields = ByteWriter(capacity: 64)
        fields.u16(version)
        fields.string(h.clusterID)
        fields.u64(h.sourceNode)
        fields.u64(h.index)
        fields.u64(h.term)
        fields.i64(h.lastTimestamp)
        fields.i64(h.createdAt)
        fields.u64(h.indexTerm)
        if let c = h.indexEntryChecksum {
            fields.u8(1)
            fields.u32(c)
        } else {
            fields.u8(0)
        }
        var w = ByteWriter(capacity: fields.count + 16)
        w.raw(magic)
        w.u32(UInt32(fields.count))
        w.raw(fields.out)
        w.u32(CRC32C.checksum(fields.out))
        return w.finish()
    }

    static func decodeHeaderFields(_ fields: [UInt8]) throws(ByteCodecError) -> BackupHeader {
        try ByteReader.readAll(fields) { (r: inout ByteReader) throws(ByteCodecError) -> BackupHeader in
            let v = try r.u16("backup format version")
            guard v >= oldestVersion && v <= version else {
                throw ByteCodecError.badValue(field: "backup format version \(v) (this build reads \(oldestVersion) to \(version))")
            }
            var h = BackupHeader(
                clusterID: try r.string("cluster id"), sourceNode: try r.u64("source node"), index: try r.u64("index"),
                term: try r.u64("term"), lastTimestamp: try r.i64("last timestamp"), createdAt: try r.i64("created at"))
            if v >= 2 {
                h.indexTerm = try r.u64("term of the entry at the index")
                guard h.indexTerm <= h.term else {
                    throw ByteCodecError.badValue(field: "term of the entry at the index \(h.indexTerm), above the backup's term \(h.term)")
                }
                switch try r.u8("entry checksum presence") {
                case 0: break
                case 1: h.indexEntryChecksum = try r.u32("entry checksum")
                case let p: throw ByteCodecError.badValue(field: "entry checksum presence \(p) (0 or 1)")
                }
            }
            return h
        }
    }
}

/// Writes a backup as it is produced: `header`, then image bytes through `add` (frames come out
/// as they fill), then `finish` (the last frame and the end). Memory: one frame.
public final class BackupEncoder {
    private var pending: [UInt8] = []
    private var frames: UInt64 = 0
    private var imageLength: UInt64 = 0
    private var imageChecksum: UInt32 = 0
    private let level: Int32
    public private(set) var bytesOut: UInt64 = 0

    public init(level: Int32 = 1) {
        self.level = level
        pending.reserveCapacity(BackupFormat.frameImageBytes)
    }

    public func header(_ h: BackupHeader) -> [UInt8] {
        let bytes = BackupFormat.encodeHeader(h)
        bytesOut += UInt64(bytes.count)
        return bytes
    }

    /// Image bytes; `emit` receives each completed frame.
    public func add(_ chunk: [UInt8], emit: ([UInt8]) throws -> Void) throws {
        var start = 0
        while start < chunk.count {
            let room = BackupFormat.frameImageBytes - pending.count
            let end = min(chunk.count, start + room)
            pending.append(contentsOf: chunk[start..<end])
            start = end
            if pending.count == BackupFormat.frameImageBytes { try emit(try frame()) }
        }
    }

    /// The last frame (if any image bytes wait) followed by the end.
    public func finish() throws -> [UInt8] {
        let last = pending.isEmpty ? [] : try frame()
        var end = ByteWriter(capacity: 20)
        end.u64(frames)
        end.u64(imageLength)
        end.u32(imageChecksum)
        var w = ByteWriter(capacity: 36)
        w.u32(0)
        w.raw(end.out)
        w.u32(CRC32C.checksum(end.out))
        w.raw(BackupFormat.endMagic)
        bytesOut += UInt64(w.count)
        return last + w.finish()
    }

    private func frame() throws -> [UInt8] {
        let raw = pending
        pending.removeAll(keepingCapacity: true)
        let compressed = try Deflate.compress(raw, level: level)
        let rawChecksum = CRC32C.checksum(raw)
        imageChecksum = CRC32C.checksum(raw, continuing: imageChecksum)
        imageLength += UInt64(raw.count)
        frames += 1
        var w = ByteWriter(capacity: compressed.count + 16)
        w.u32(UInt32(compressed.count))
        w.u32(UInt32(raw.count))
        w.u32(rawChecksum)
        w.u32(CRC32C.checksum(compressed))
        w.raw(compressed)
        let bytes = w.finish()
        bytesOut += UInt64(bytes.count)
        return bytes
    }
}

/// Reads a backup from a byte source, verifying every frame; damage is a `BackupError` with the
/// offset of the part that is damaged. `read` fills the buffer it is given and returns how many
/// bytes it wrote (0 at the end of the input).
public final class BackupDecoder {
    private let source: (UnsafeMutableBufferPointer<UInt8>) throws -> Int
    /// Bytes consumed from the source so far.
    public private(set) var offset: UInt64 = 0
    public private(set) var header: BackupHeader?
    private var frame: [UInt8] = []
    private var frameAt = 0
    private var ended = false
    private var frames: UInt64 = 0
    /// Image bytes read so far (the whole image's length once `read` returned 0).
    public private(set) var imageLength: UInt64 = 0
    private var imageChecksum: UInt32 = 0

    public init(read: @escaping (UnsafeMutableBufferPointer<UInt8>) throws -> Int) {
        source = read
    }

    /// Exactly `n` bytes, or a `BackupError` naming what was cut short, at the start of the part
    /// being read (`part`, default: where these bytes start).
    private func take(_ n: Int, _ what: String, part: UInt64? = nil) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: n)
        var got = 0
        while got < n {
            let k = try out.withUnsafeMutableBufferPointer { try source(UnsafeMutableBufferPointer(rebasing: $0[got...])) }
            guard k > 0 else { throw BackupError(offset: part ?? offset, "the backup ends inside \(what) (truncated)") }
            got += k
        }
        offset += UInt64(n)
        return out
    }

    /// The little-endian integers of a fixed-size part already read whole (`take`), through the
    /// shared codec: bounds-checked, so a caller's wrong offset reads 0 instead of trapping.
    private static func u32(_ b: [UInt8], _ at: Int) -> UInt32 {
        b.withUnsafeBytes { raw in
            var r = ByteReader(raw, at: at)
            return (try? r.u32("a backup field")) ?? 0
        }
    }

    private static func u64(_ b: [UInt8], _ at: Int) -> UInt64 {
        b.withUnsafeBytes { raw in
            var r = ByteReader(raw, at: at)
            return (try? r.u64("a backup field")) ?? 0
        }
    }

    /// Reads and checks the header.
    public func readHeader() throws -> BackupHeader {
        if let header { return header }
        let magic = try take(BackupFormat.magic.count, "the file header")
        guard magic == BackupFormat.magic else { throw BackupError(offset: 0, "not a Banyan backup (bad magic)") }
        let lengthAt = offset
        let length = Int(Self.u32(try take(4, "the header length"), 0))
        guard length <= BackupFormat.maxHeaderBytes else { throw BackupError(offset: lengthAt, "the header length \(length) is implausible") }
        let fields = try take(length, "the header", part: lengthAt)
        let stored = Self.u32(try take(4, "the header checksum", part: lengthAt), 0)
        guard CRC32C.checksum(fields) == stored else { throw BackupError(offset: lengthAt, "the header's checksum does not match") }
        do {
            let h = try BackupFormat.decodeHeaderFields(fields)
            header = h
            return h
        } catch {
            throw BackupError(offset: lengthAt + 4, "the header is malformed: \(error)")
        }
    }

    /// Fills `buffer` with the next image bytes; 0 once the image ended (after the end record
    /// and the whole image's checksum were verified).
    public func read(into buffer: UnsafeMutableBufferPointer<UInt8>) throws -> Int {
        if header == nil { _ = try readHeader() }
        while frameAt == frame.count {
            if ended { return 0 }
            try nextFrame()
        }
        let n = min(buffer.count, frame.count - frameAt)
        frame.withUnsafeBufferPointer { f in
            _ = buffer.initialize(from: UnsafeBufferPointer(rebasing: f[frameAt..<(frameAt + n)]))
        }
        frameAt += n
        return n
    }

    private func nextFrame() throws {
        let at = offset
        let head = try take(4, "a frame header")
        let compressedLength = Int(Self.u32(head, 0))
        if compressedLength == 0 {
            let end = try take(24, "the end record", part: at)
            let fields = Array(end[0..<20])
            guard CRC32C.checksum(fields) == Self.u32(end, 20) else { throw BackupError(offset: at, "the end record's checksum does not match") }
            let magic = try take(BackupFormat.endMagic.count, "the end marker", part: at)
            guard magic == BackupFormat.endMagic else { throw BackupError(offset: at, "the end marker is damaged") }
            guard Self.u64(fields, 0) == frames, Self.u64(fields, 8) == imageLength, Self.u32(fields, 16) == imageChecksum else {
                throw BackupError(
                    offset: at,
                    "the end record says \(Self.u64(fields, 0)) frames and \(Self.u64(fields, 8)) image bytes; the file holds \(frames) and \(imageLength) (frames are missing or repeated)"
                )
            }
            var probe = [UInt8](repeating: 0, count: 1)
            let extra = try probe.withUnsafeMutableBufferPointer { try source($0) }
            guard extra == 0 else { throw BackupError(offset: offset, "bytes follow the end of the backup") }
            ended = true
            frame = []
            frameAt = 0
            return
        }
        let rest = try take(12, "a frame header", part: at)
        let imageBytes = Int(Self.u32(rest, 0))
        let rawChecksum = Self.u32(rest, 4)
        let compressedChecksum = Self.u32(rest, 8)
        guard compressedLength <= BackupFormat.maxFrameBytes, imageBytes > 0, imageBytes <= BackupFormat.maxFrameBytes else {
            throw BackupError(offset: at, "frame \(frames + 1) has implausible lengths (\(compressedLength) compressed, \(imageBytes) image bytes)")
        }
        let compressed = try take(compressedLength, "frame \(frames + 1)", part: at)
        guard CRC32C.checksum(compressed) == compressedChecksum else {
            throw BackupError(offset: at, "frame \(frames + 1) is damaged (its checksum does not match)")
        }
        let raw: [UInt8]
        do {
            raw = try Deflate.decompress(compressed, length: imageBytes)
        } catch {
            throw BackupError(offset: at, "frame \(frames + 1) does not decompress: \(error)")
        }
        guard CRC32C.checksum(raw) == rawChecksum else { throw BackupError(offset: at, "frame \(frames + 1)'s image bytes do not match their checksum") }
        frames += 1
        imageLength += UInt64(raw.count)
        imageChecksum = CRC32C.checksum(raw, continuing: imageChecksum)
        frame = raw
        frameAt = 0
    }
}

/// One-shot zlib compression of a buffer, and decompression to a known length.
public enum Deflate {
    public static func compress(_ bytes: [UInt8], level: Int32 = 1) throws(OpLogError) -> [UInt8] {
        do {
            let z = try ZlibStream(.compress(level: level))
            var out: [UInt8] = []
            out.reserveCapacity(bytes.count / 2 + 64)
            _ = try bytes.withUnsafeBufferPointer { try z.process($0, finish: true) { out.append(contentsOf: $0) } }
            return out
        } catch {
            throw SnapshotStore.opLogError(error, otherwise: "zlib compression failed")
        }
    }

    /// Exactly `length` bytes from one complete zlib stream, or an error.
    public static func decompress(_ bytes: [UInt8], length: Int) throws(OpLogError) -> [UInt8] {
        do {
            let z = try ZlibStream(.decompress)
            var out: [UInt8] = []
            out.reserveCapacity(length)
            var overflow = false
            let ended = try bytes.withUnsafeBufferPointer { input in
                try z.process(input) { chunk in
                    if out.count + chunk.count > length { overflow = true } else { out.append(contentsOf: chunk) }
                }
            }
            guard ended, !overflow, out.count == length else {
                throw OpLogError(.corrupt, "the stream holds \(overflow ? "more" : "fewer") bytes than its header says")
            }
            return out
        } catch {
            throw SnapshotStore.opLogError(error, otherwise: "zlib decompression failed")
        }
    }
}

/// A committed log entry as archived (`banyan backup --follow`) and as `GET /.banyan/log` sends
/// it: length (u32) | CRC32C of the body (u32) | body: index (u64), term (u64), kind (u8: 0 a
/// command, 1 a no-op, 2 a configuration change), payload (the command's bytes; empty otherwise).
/// Archive files are "BNYARC01" followed by records, named `log-<first index, 20 digits>.arch`.
public struct ArchivedEntry: Sendable, Equatable {
    public enum Kind: UInt8, Sendable { case command = 0, noop = 1, config = 2 }
    public var index: UInt64
    public var term: UInt64
    public var kind: Kind
    public var payload: [UInt8]

    public init(index: UInt64, term: UInt64, kind: Kind, payload: [UInt8]) {
        self.index = index
        self.term = term
        self.kind = kind
        self.payload = payload
    }

    public static let fileMagic: [UInt8] = Array("BNYARC01".utf8)

    /// CRC32C of the kind and payload (not the index or term): what a backup header records of
    /// the entry at its index.
    public var contentChecksum: UInt32 {
        var bytes = [kind.rawValue]
        bytes.append(contentsOf: payload)
        return CRC32C.checksum(bytes)
    }
    /// The largest record a reader accepts (a log entry is at most a request body, 16 MiB, plus framing).
    public static let maxRecordBytes = 64 << 20

    public func append(to out: inout [UInt8]) {
        var body = ByteWriter(capacity: payload.count + 17)
        body.u64(index)
        body.u64(term)
        body.u8(kind.rawValue)
        body.raw(payload)
        var w = ByteWriter(continuing: &out)
        w.u32(UInt32(body.count))
        w.u32(CRC32C.checksum(body.out))
        w.raw(body.out)
        out = w.finish()
    }

    public static func fileName(firstIndex: UInt64) -> String {
        let digits = String(firstIndex)
        return "log-" + String(repeating: "0", count: max(0, 20 - digits.count)) + digits + ".arch"
    }

    public static func firstIndex(ofFile name: String) -> UInt64? {
        guard name.hasPrefix("log-"), name.hasSuffix(".arch"), name.utf8.count == 29 else { return nil }
        return UInt64(String(name.dropFirst(4).prefix(20)))
    }

    /// The records in `bytes` from `start`. `complete`: the valid prefix ends where the records
    /// end (false: a record is cut short at `validEnd`, as an interrupted append leaves it).
    /// A record whose checksum does not match, or whose indexes do not follow one another, is
    /// a `BackupError` at its offset.
    public static func parse(_ bytes: [UInt8], from start: Int = 0, baseOffset: UInt64 = 0) throws -> (
        entries: [ArchivedEntry], validEnd: Int, complete: Bool
    ) {
        var entries: [ArchivedEntry] = []
        var at = start
        while at < bytes.count {
            // The record's length and checksum, through the shared codec.
            let head: (length: Int, stored: UInt32)? = bytes.withUnsafeBytes { raw in
                var r = ByteReader(raw, at: at)
                guard let length = try? r.u32("record length"), let stored = try? r.u32("record checksum") else { return nil }
                return (Int(length), stored)
            }
            guard let (length, stored) = head else { return (entries, at, false) }
            guard length >= 17, length <= maxRecordBytes else {
                throw BackupError(offset: baseOffset + UInt64(at), "an archived record has an implausible length \(length)")
            }
            guard bytes.count - at - 8 >= length else { return (entries, at, false) }
            let body = Array(bytes[(at + 8)..<(at + 8 + length)])
            guard CRC32C.checksum(body) == stored else {
                throw BackupError(offset: baseOffset + UInt64(at), "an archived record is damaged (its checksum does not match)")
            }
            let entry: ArchivedEntry? = body.withUnsafeBytes { raw in
                var r = ByteReader(raw)
                guard let index = try? r.u64("index"), let term = try? r.u64("term"), let k = try? r.u8("kind"), let kind = Kind(rawValue: k)
                else { return nil }
                return ArchivedEntry(index: index, term: term, kind: kind, payload: Array(raw[r.at...]))
            }
            guard let entry else { throw BackupError(offset: baseOffset + UInt64(at), "an archived record is malformed") }
            // Checked: a record at the largest index (a forged node answer) has no successor.
            if let last = entries.last, last.index == UInt64.max || entry.index != last.index + 1 {
                throw BackupError(offset: baseOffset + UInt64(at), "archived entry \(entry.index) follows entry \(last.index): entries are missing")
            }
            entries.append(entry)
            at += 8 + length
        }
        return (entries, at, true)
    }
}
