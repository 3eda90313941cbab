import BanyanBasics

/// What a snapshot stands for, as its file stores it: the log prefix it replaces and the cluster
/// membership then (the on-disk form of `BanyanRaft.SnapshotMeta`, converted by `NodeStorage`).
public struct SnapshotMetaRecord: Sendable, Equatable {
    /// Index of the last log record the snapshot includes.
    public var lastIndex: UInt64
    /// Term of that record.
    public var lastTerm: UInt64
    /// Cluster membership at that point, encoded by the consensus layer.
    public var membership: [UInt8]

    public init(lastIndex: UInt64, lastTerm: UInt64, membership: [UInt8] = []) {
        self.lastIndex = lastIndex
        self.lastTerm = lastTerm
        self.membership = membership
    }
}

/// Snapshot file layout (docs/internals/oplog-format.md):
///
///     "BNYSNAP1" | zlib stream of the image | trailer fields | fields length (u32) | CRC32C of
///     the fields (u32) | "BNYSEND1"
///
/// Trailer fields: last index (u64), last term (u64), membership length (u32) and bytes,
/// uncompressed image length (u64), CRC32C of the uncompressed image (u32). All little-endian.
public enum SnapshotFormat {
    public static let header: [UInt8] = Array("BNYSNAP1".utf8)
    public static let footer: [UInt8] = Array("BNYSEND1".utf8)

    public struct Trailer: Sendable, Equatable {
        public var metadata: SnapshotMetaRecord
        public var imageLength: UInt64
        public var imageChecksum: UInt32

        public init(metadata: SnapshotMetaRecord, imageLength: UInt64, imageChecksum: UInt32) {
            self.metadata = metadata
            self.imageLength = imageLength
            self.imageChecksum = imageChecksum
        }
    }

    public static func encode(_ trailer: Trailer) -> [UInt8] {
        var fields = ByteWriter(capacity: 32 + trailer.metadata.membership.count)
        fields.u64(trailer.metadata.lastIndex)
        fields.u64(trailer.metadata.lastTerm)
        fields.u32(UInt32(trailer.metadata.membership.count))
        fields.raw(trailer.metadata.membership)
        fields.u64(trailer.imageLength)
        fields.u32(trailer.imageChecksum)
        let checksum = CRC32C.checksum(fields.out)
        let length = UInt32(fields.count)
        var w = ByteWriter(continuing: &fields.out)
        w.u32(length)
        w.u32(checksum)
        w.raw(footer)
        return w.finish()
    }

    /// Splits a snapshot file into its compressed body and trailer; nil when the file is not a
    /// complete snapshot (a crash while writing it, or damage).
    public static func parse(_ file: [UInt8]) -> (body: Range<Int>, trailer: Trailer)? {
        parse(head: Array(file.prefix(header.count)), tail: file, fileSize: file.count)
    }

    /// The last bytes of a file that hold the trailer (its fields, their length and checksum, the
    /// footer), from the file's last 16 bytes; nil when those are not a trailer's end. Lets a
    /// reader fetch the trailer without reading the body.
    public static func trailerBytes(last16: [UInt8]) -> Int? {
        guard last16.count == footer.count + 8, Array(last16[8...]) == footer else { return nil }
        let length: UInt32? = last16.withUnsafeBytes { raw in
            var r = ByteReader(raw)
            return try? r.u32("trailer length")
        }
        return length.map { Int($0) + 8 + footer.count }
    }

    /// As `parse`, from the file's first bytes (`head`, at least the header) and its last
    /// `tail.count` bytes (at least `trailerBytes`), for a file of `fileSize` bytes.
    public static func parse(head: [UInt8], tail: [UInt8], fileSize n: Int) -> (body: Range<Int>, trailer: Trailer)? {
        let t = tail.count
        guard n >= header.count + footer.count + 8, t <= n, t >= footer.count + 8, head.count >= header.count,
            Array(head[0..<header.count]) == header, Array(tail[(t - footer.count)...]) == footer
        else { return nil }
        // Offsets below are within `tail`; `skipped` converts them to file offsets.
        let skipped = n - t
        return tail.withUnsafeBufferPointer { b -> (Range<Int>, Trailer)? in
            let raw = UnsafeRawBufferPointer(b)
            let crcAt = t - footer.count - 4
            let lengthAt = crcAt - 4
            var frame = ByteReader(raw, at: lengthAt)
            guard let length32 = try? frame.u32("trailer length"), let stored = try? frame.u32("trailer checksum") else { return nil }
            let length = Int(length32)
            guard length >= 32, length <= lengthAt, length <= skipped + lengthAt - header.count else { return nil }
            let start = lengthAt - length
            guard CRC32C.checksum(UnsafeBufferPointer(rebasing: b[start..<lengthAt])) == stored else { return nil }
            let fields = UnsafeRawBufferPointer(rebasing: raw[start..<lengthAt])
            let trailer: Trailer? = try? ByteReader.readAll(fields) { (r: inout ByteReader) throws(ByteCodecError) -> Trailer in
                let lastIndex = try r.u64("snapshot last index")
                let lastTerm = try r.u64("snapshot last term")
                let membershipLength = Int(try r.u32("membership length"))
                let membership = Array(try r.raw("membership", count: membershipLength))
                let metadata = SnapshotMetaRecord(lastIndex: lastIndex, lastTerm: lastTerm, membership: membership)
                return Trailer(metadata: metadata, imageLength: try r.u64("image length"), imageChecksum: try r.u32("image checksum"))
            }
            guard let trailer else { return nil }
            return (header.count..<(skipped + start), trailer)
        }
    }

    /// File name of the snapshot whose last included index is `index`.
    public static func fileName(lastIndex: UInt64) -> String {
        let digits = String(lastIndex)
        return "snapshot-" + String(repeating: "0", count: max(0, 20 - digits.count)) + digits + ".snap"
    }

    public static func lastIndex(ofFile name: String) -> UInt64? {
        guard name.hasPrefix("snapshot-"), name.hasSuffix(".snap"), name.utf8.count == 34 else { return nil }
        return LogFormat.parseIndex(name.utf8.dropFirst(9).prefix(20))
    }
}
