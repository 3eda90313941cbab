import BanyanBasics
import BanyanOpLog
import BanyanOpLogFiles
import Testing

/// The backup file format (docs/backup.md): round trips, and every kind of damage refused with
/// the offset of the damaged part.
@Suite struct BackupFormatTests {
    static let header = BackupHeader(
        clusterID: "c1", sourceNode: 2, index: 99, term: 4, lastTimestamp: 1_700_000_000_000, createdAt: 1_700_000_000_500, indexTerm: 3,
        indexEntryChecksum: 0xDEAD_BEEF)

    /// A header as `fields` spell it (the version first), framed as a file's.
    static func headerFile(_ fields: (inout ByteWriter) -> Void) -> [UInt8] {
        var f = ByteWriter()
        fields(&f)
        var w = ByteWriter()
        w.raw(BackupFormat.magic)
        w.u32(UInt32(f.count))
        w.raw(f.out)
        w.u32(CRC32C.checksum(f.out))
        return w.finish()
    }

    /// A decoder reading `file` from memory.
    static func decoder(_ file: [UInt8]) -> BackupDecoder {
        var at = 0
        return BackupDecoder { dst in
            let n = min(dst.count, file.count - at)
            file.withUnsafeBufferPointer { src in _ = dst.initialize(from: UnsafeBufferPointer(rebasing: src[at..<(at + n)])) }
            at += n
            return n
        }
    }

    static func headerOf(_ file: [UInt8]) throws -> BackupHeader { try decoder(file).readHeader() }

    @Test("format 2 records the term and content checksum of the entry at the index (either may be unknown); format 1 files still read, with both unknown; a term above the backup's, a bad presence byte or a newer version are refused")
    func headerVersions() throws {
        func common(_ w: inout ByteWriter, version: UInt16) {
            w.u16(version)
            w.string("c1")
            w.u64(2)
            w.u64(99)
            w.u64(4)
            w.i64(1_700_000_000_000)
            w.i64(1_700_000_000_500)
        }
        // Round trips, with and without the checksum.
        #expect(try Self.headerOf(BackupFormat.encodeHeader(Self.header)) == Self.header)
        var unknown = Self.header
        unknown.indexEntryChecksum = nil
        unknown.indexTerm = 0
        #expect(try Self.headerOf(BackupFormat.encodeHeader(unknown)) == unknown)
        // Version 1: no entry fields.
        let v1 = try Self.headerOf(Self.headerFile { common(&$0, version: 1) })
        #expect(v1.index == 99 && v1.term == 4 && v1.indexTerm == 0 && v1.indexEntryChecksum == nil)
        // Version 1 with version 2's fields after it: trailing bytes.
        #expect(throws: (any Error).self) {
            try Self.headerOf(Self.headerFile { w in
                common(&w, version: 1)
                w.u64(3)
                w.u8(0)
            })
        }
        // Version 2 without them: cut short.
        #expect(throws: (any Error).self) { try Self.headerOf(Self.headerFile { common(&$0, version: 2) }) }
        // Refused: the entry's term above the backup's (5 > 4), a presence byte other than 0 or
        // 1, a version this build does not know.
        for (version, entryTerm, presence) in [(UInt16(2), UInt64(5), UInt8(0)), (2, 3, 2), (3, 3, 0)] {
            #expect(throws: (any Error).self, "version \(version), entry term \(entryTerm), presence \(presence)") {
                try Self.headerOf(Self.headerFile { w in
                    common(&w, version: version)
                    w.u64(entryTerm)
                    w.u8(presence)
                    if presence != 0 { w.u32(1) }
                })
            }
        }
    }

    @Test("an entry's content checksum covers its kind and payload, not its index or term")
    func contentChecksum() {
        let a = ArchivedEntry(index: 5, term: 2, kind: .command, payload: [1, 2, 3])
        #expect(ArchivedEntry(index: 6, term: 9, kind: .command, payload: [1, 2, 3]).contentChecksum == a.contentChecksum)
        #expect(ArchivedEntry(index: 5, term: 2, kind: .command, payload: [1, 2, 4]).contentChecksum != a.contentChecksum)
        #expect(ArchivedEntry(index: 5, term: 2, kind: .noop, payload: []).contentChecksum != ArchivedEntry(index: 5, term: 2, kind: .config, payload: []).contentChecksum)
    }

    /// Image bytes that compress somewhat (seeded, so runs are reproducible).
    static func image(_ count: Int, seed: UInt64 = 7) -> [UInt8] {
        var rng = SeededRandom(seed: seed)
        var out = [UInt8](repeating: 0, count: count)
        for i in 0..<count { out[i] = i % 3 == 0 ? UInt8(truncatingIfNeeded: rng.next()) : UInt8(i % 17) }
        return out
    }

    /// A backup of `image`, fed in uneven chunks; also returns where each frame starts.
    static func encode(_ image: [UInt8], chunk: Int = 300_001) throws -> (file: [UInt8], frameStarts: [Int]) {
        let encoder = BackupEncoder()
        var out = encoder.header(header)
        var starts: [Int] = []
        var at = 0
        while at < image.count {
            let end = min(image.count, at + chunk)
            try encoder.add(Array(image[at..<end])) { frame in
                starts.append(out.count)
                out += frame
            }
            at = end
        }
        let tail = try encoder.finish()
        // The last frame (if any) comes with the end record.
        if image.count % BackupFormat.frameImageBytes != 0 { starts.append(out.count) }
        out += tail
        #expect(encoder.bytesOut == UInt64(out.count))
        return (out, starts)
    }

    static func decode(_ file: [UInt8], buffer: Int = 1 << 20, keep: Bool = true) throws -> (BackupHeader, [UInt8]) {
        let decoder = Self.decoder(file)
        let h = try decoder.readHeader()
        var image: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: buffer)
        while true {
            let n = try chunk.withUnsafeMutableBufferPointer { try decoder.read(into: $0) }
            if n == 0 { break }
            if keep { image += chunk[0..<n] }
        }
        return (h, image)
    }

    @Test(arguments: [0, 1, 4 << 20, (4 << 20) + 1, 9_000_000])
    func roundTrip(size: Int) throws {
        let image = Self.image(size)
        let (file, starts) = try Self.encode(image)
        #expect(starts.count == (size + BackupFormat.frameImageBytes - 1) / BackupFormat.frameImageBytes)
        let (h, back) = try Self.decode(file)
        #expect(h == Self.header)
        #expect(back == image)
    }

    /// One flipped byte anywhere is refused, and the offset named is the start of the part that
    /// holds it (the header, the frame, or the end record).
    @Test func everyFlippedByteIsFoundAtItsPart() throws {
        let image = Self.image(9_000_000)
        let (file, starts) = try Self.encode(image)
        // The end: a zero length, 20 bytes of fields, their checksum, the end marker.
        let endAt = file.count - 36
        var rng = SeededRandom(seed: 42)
        var positions = [0, 9, 12, starts[0], starts[0] + 3, starts[0] + 17, starts[1] + 100, starts[2] + 5, endAt, endAt + 2, endAt + 30, file.count - 1]
        for _ in 0..<24 { positions.append(Int.random(in: 0..<file.count, using: &rng)) }
        for p in positions {
            var damaged = file
            damaged[p] ^= 0x5A
            do {
                _ = try Self.decode(damaged, keep: false)
                Issue.record("flipping byte \(p) went unnoticed")
            } catch let e as BackupError {
                let offset = Int(e.offset)
                if p < starts[0] {
                    #expect(offset <= p && offset <= 8, "byte \(p) in the header: reported \(e)")
                } else if p < endAt {
                    let frame = starts.filter { $0 <= p }.max() ?? 0
                    #expect(offset == frame, "byte \(p) in the frame at \(frame): reported \(e)")
                } else {
                    #expect(offset == endAt, "byte \(p) in the end record at \(endAt): reported \(e)")
                }
            }
        }
    }

    @Test func truncationAndTrailingBytesAreRefused() throws {
        let (file, starts) = try Self.encode(Self.image(5_000_000))
        for cut in [0, 5, 20, starts[0] + 10, starts[1], file.count - 9, file.count - 1] {
            #expect(throws: BackupError.self, "cut at \(cut)") { _ = try Self.decode(Array(file[0..<cut])) }
        }
        #expect(throws: BackupError.self) { _ = try Self.decode(file + [0]) }
        // A frame dropped whole: the end record's count and checksum no longer match.
        let withoutFirst = Array(file[0..<starts[0]]) + Array(file[starts[1]...])
        #expect(throws: BackupError.self) { _ = try Self.decode(withoutFirst) }
        #expect(throws: BackupError.self) { _ = try Self.decode(Array("NOTABACK".utf8) + Array(file[8...])) }
    }

    @Test func archivedEntriesRoundTripAndCutTail() throws {
        let entries = (1...50).map { i in
            ArchivedEntry(index: UInt64(100 + i), term: 3, kind: i % 10 == 0 ? .noop : .command, payload: i % 10 == 0 ? [] : Self.image(i * 37, seed: UInt64(i)))
        }
        var bytes: [UInt8] = []
        for e in entries { e.append(to: &bytes) }
        let all = try ArchivedEntry.parse(bytes)
        #expect(all.entries == entries && all.complete && all.validEnd == bytes.count)
        // A cut tail (an interrupted append) ends the valid prefix without an error.
        let cut = try ArchivedEntry.parse(Array(bytes[0..<(bytes.count - 5)]))
        #expect(cut.entries == Array(entries.dropLast()) && !cut.complete)
        // Damage inside a record is an error at the record's offset.
        var damaged = bytes
        damaged[40] ^= 1
        #expect(throws: BackupError.self) { _ = try ArchivedEntry.parse(damaged) }
        // A missing record is an error, not a silent gap.
        var gap: [UInt8] = []
        for e in entries where e.index != 120 { e.append(to: &gap) }
        #expect(throws: BackupError.self) { _ = try ArchivedEntry.parse(gap) }
        #expect(ArchivedEntry.firstIndex(ofFile: ArchivedEntry.fileName(firstIndex: 12345)) == 12345)
    }
}
