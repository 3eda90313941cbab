/// The one byte codec of every binary format Banyan writes: the peer wire format, commands, tree
/// images and snapshots, log records and the hard state (docs/internals/byte-codec.md).
///
/// Little-endian fixed-width integers, and length-prefixed byte runs and strings (a `UInt64`
/// length, then the bytes). The field primitives are `@inlinable @inline(__always)` (except
/// `ByteWriter.integer`, see there): the formats' hot paths (peer messages, commands) call them
/// once per field from other modules, where left to the optimiser the reads stayed calls and a
/// small message decoded about 40% slower. The reader checks what remains before every read, and
/// every count against what remains before anything is allocated, so no input can trap it or make
/// it allocate more than the input's size; each failure names the field it was reading.
public enum ByteCodecError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The input ended inside `field`.
    case truncated(field: String)
    /// A count or length larger than the bytes that remain could hold.
    case tooLarge(field: String, count: UInt64)
    /// The input holds this many bytes after a complete value.
    case trailingBytes(Int)
    /// A boolean other than 0 or 1, an unknown tag, or a string that is not UTF-8.
    case badValue(field: String)
    /// The input does not start with the expected magic bytes.
    case badMagic(field: String)

    public var description: String {
        switch self {
        case .truncated(let f): return "truncated at \(f)"
        case let .tooLarge(f, n): return "\(f) count \(n) exceeds the bytes that remain"
        case .trailingBytes(let n): return "\(n) trailing bytes"
        case .badValue(let f): return "bad value in \(f)"
        case .badMagic(let f): return "missing magic bytes of \(f)"
        }
    }
}

/// Appends little-endian fields to a byte array.
public struct ByteWriter: Sendable {
    public var out: [UInt8]

    @inlinable
    public init(capacity: Int = 64) {
        out = []
        out.reserveCapacity(capacity)
    }

    /// Continues `out` in place: the caller's buffer is moved in, not copied; take it back with
    /// `out = writer.out` (or `writer.finish()`).
    @inlinable
    public init(continuing out: inout [UInt8]) {
        self.out = out
        out = []
    }

    @inlinable public var count: Int { out.count }

    /// The bytes written, leaving the writer empty.
    @inlinable
    public mutating func finish() -> [UInt8] {
        defer { out = [] }
        return out
    }

    @inlinable @inline(__always) public mutating func u8(_ v: UInt8) { out.append(v) }
    @inlinable @inline(__always) public mutating func bool(_ v: Bool) { out.append(v ? 1 : 0) }

    /// Any fixed-width integer, little-endian, in its own width.
    ///
    /// One append per byte: for these widths that is faster than appending the value's bytes as a
    /// buffer (the generic sequence append). Specialised in the caller's module but kept out of
    /// line: inlined, the eight appends (each with its growth path) at every field of a format
    /// made its encoder several times larger, and no faster.
    @inlinable @inline(never)
    public mutating func integer<T: FixedWidthInteger>(_ v: T) {
        var v = v
        for _ in 0..<MemoryLayout<T>.size {
            out.append(UInt8(truncatingIfNeeded: v))
            v >>= 8
        }
    }

    @inlinable @inline(__always) public mutating func u16(_ v: UInt16) { integer(v) }
    @inlinable @inline(__always) public mutating func u32(_ v: UInt32) { integer(v) }
    @inlinable @inline(__always) public mutating func u64(_ v: UInt64) { integer(v) }
    @inlinable @inline(__always) public mutating func i64(_ v: Int64) { integer(v) }
    /// A double as its IEEE 754 bit pattern.
    @inlinable @inline(__always) public mutating func f64(_ v: Double) { integer(v.bitPattern) }

    /// Bytes without a length (a magic, or a run whose length is written elsewhere).
    @inlinable @inline(__always)
    public mutating func raw<S: Sequence>(_ bytes: S) where S.Element == UInt8 { out.append(contentsOf: bytes) }

    /// A length-prefixed run of bytes.
    @inlinable @inline(__always)
    public mutating func bytes<C: Collection>(_ b: C) where C.Element == UInt8 {
        u64(UInt64(b.count))
        out.append(contentsOf: b)
    }

    /// A length-prefixed UTF-8 string.
    @inlinable @inline(__always)
    public mutating func string(_ s: String) {
        var s = s
        s.withUTF8 { bytes($0) }
    }

    /// An unsigned LEB128 varint: seven bits a byte, low bits first, the high bit set on every
    /// byte but the last (1 to 10 bytes). Only the tree image uses it, for its lengths and counts;
    /// the other formats use fixed widths.
    @inlinable @inline(__always)
    public mutating func varint(_ v: UInt64) {
        var v = v
        while v >= 0x80 {
            out.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        out.append(UInt8(truncatingIfNeeded: v))
    }

    /// A count followed by that many `UInt64`s.
    @inlinable @inline(__always)
    public mutating func u64s(_ list: [UInt64]) {
        u64(UInt64(list.count))
        for v in list { u64(v) }
    }

    /// Overwrites a little-endian integer written earlier at `offset` (a length or checksum
    /// filled in once what follows it is known). `offset` must lie inside what was written.
    @inlinable
    public mutating func patch<T: FixedWidthInteger>(_ v: T, at offset: Int) {
        precondition(offset >= 0 && offset + MemoryLayout<T>.size <= out.count, "patch outside the bytes written")
        withUnsafeBytes(of: v.littleEndian) { src in
            for i in 0..<src.count { out[offset + i] = src[i] }
        }
    }
}

/// Reads little-endian fields from borrowed bytes; the buffer must outlive the reader.
public struct ByteReader {
    public let base: UnsafeRawBufferPointer
    /// The offset of the next read.
    public var at: Int

    @inlinable
    public init(_ base: UnsafeRawBufferPointer, at: Int = 0) {
        self.base = base
        self.at = min(max(0, at), base.count)
    }

    @inlinable public var remaining: Int { base.count - at }
    @inlinable public var atEnd: Bool { at == base.count }

    @inlinable @inline(__always)
    public mutating func u8(_ field: String) throws(ByteCodecError) -> UInt8 {
        guard remaining >= 1 else { throw .truncated(field: field) }
        defer { at += 1 }
        return base[at]
    }

    @inlinable @inline(__always)
    public mutating func bool(_ field: String) throws(ByteCodecError) -> Bool {
        switch try u8(field) {
        case 0: return false
        case 1: return true
        default: throw .badValue(field: field)
        }
    }

    @inlinable @inline(__always)
    public mutating func integer<T: FixedWidthInteger>(_ field: String, as: T.Type = T.self) throws(ByteCodecError) -> T {
        let size = MemoryLayout<T>.size
        guard remaining >= size else { throw .truncated(field: field) }
        defer { at += size }
        return T(littleEndian: base.loadUnaligned(fromByteOffset: at, as: T.self))
    }

    @inlinable @inline(__always) public mutating func u16(_ field: String) throws(ByteCodecError) -> UInt16 { try integer(field) }
    @inlinable @inline(__always) public mutating func u32(_ field: String) throws(ByteCodecError) -> UInt32 { try integer(field) }
    @inlinable @inline(__always) public mutating func u64(_ field: String) throws(ByteCodecError) -> UInt64 { try integer(field) }
    @inlinable @inline(__always) public mutating func i64(_ field: String) throws(ByteCodecError) -> Int64 { try integer(field) }
    @inlinable @inline(__always)
    public mutating func f64(_ field: String) throws(ByteCodecError) -> Double {
        Double(bitPattern: try integer(field, as: UInt64.self))
    }

    /// An unsigned LEB128 varint (see `ByteWriter.varint`). More than 10 bytes, or a value that
    /// does not fit 64 bits, is `.badValue`.
    @inlinable @inline(__always)
    public mutating func varint(_ field: String) throws(ByteCodecError) -> UInt64 {
        var v: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let b = try u8(field)
            // The tenth byte holds bit 63 only.
            guard shift < 63 || b <= 1 else { throw .badValue(field: field) }
            v |= UInt64(b & 0x7F) << shift
            if b < 0x80 { return v }
            shift += 7
        }
    }

    /// A count of items of at least `itemBytes` bytes each, checked against what remains.
    @inlinable @inline(__always)
    public mutating func count(_ field: String, itemBytes: Int) throws(ByteCodecError) -> Int {
        let n = try u64(field)
        guard n <= UInt64(remaining / max(1, itemBytes)) else { throw .tooLarge(field: field, count: n) }
        return Int(n)
    }

    /// The next `n` bytes, borrowed (no length prefix).
    @inlinable @inline(__always)
    public mutating func raw(_ field: String, count n: Int) throws(ByteCodecError) -> UnsafeRawBufferPointer {
        guard n >= 0, n <= remaining else { throw .truncated(field: field) }
        defer { at += n }
        return UnsafeRawBufferPointer(rebasing: base[at..<at + n])
    }

    /// A length-prefixed run of bytes, borrowed.
    @inlinable @inline(__always)
    public mutating func span(_ field: String) throws(ByteCodecError) -> UnsafeRawBufferPointer {
        let n = try count(field, itemBytes: 1)
        return try raw(field, count: n)
    }

    /// A length-prefixed run of bytes, copied.
    @inlinable @inline(__always)
    public mutating func bytes(_ field: String) throws(ByteCodecError) -> [UInt8] { Array(try span(field)) }

    /// A length-prefixed string, which must be valid UTF-8.
    @inlinable @inline(__always)
    public mutating func string(_ field: String) throws(ByteCodecError) -> String {
        let bytes = try span(field)
        // ASCII (nearly every key, path and name) is valid as it is: decoded without the generic
        // validation, which cost about 2,000 instructions per command decoded.
        if bytes.allSatisfy({ $0 < 0x80 }) { return String(decoding: bytes, as: UTF8.self) }
        guard let s = String(validating: bytes, as: UTF8.self) else { throw .badValue(field: field) }
        return s
    }

    /// A count followed by that many `UInt64`s.
    @inlinable @inline(__always)
    public mutating func u64s(_ field: String) throws(ByteCodecError) -> [UInt64] {
        let n = try count(field, itemBytes: 8)
        var out: [UInt64] = []
        out.reserveCapacity(n)
        for _ in 0..<n { out.append(try u64(field)) }
        return out
    }

    /// Skips `magic`, or throws `.badMagic`.
    @inlinable
    public mutating func magic(_ magic: [UInt8], _ field: String) throws(ByteCodecError) {
        guard remaining >= magic.count,
              UnsafeRawBufferPointer(rebasing: base[at..<at + magic.count]).elementsEqual(magic)
        else { throw .badMagic(field: field) }
        at += magic.count
    }

    /// Throws unless every byte was read.
    @inlinable
    public func expectEnd() throws(ByteCodecError) {
        guard remaining == 0 else { throw .trailingBytes(remaining) }
    }

    /// Runs `read` over exactly `raw`: the whole input must be consumed.
    @inlinable
    public static func readAll<T>(
        _ raw: UnsafeRawBufferPointer, _ read: (inout ByteReader) throws(ByteCodecError) -> T
    ) throws(ByteCodecError) -> T {
        var r = ByteReader(raw)
        let value = try read(&r)
        try r.expectEnd()
        return value
    }

    /// Runs `read` over exactly `bytes`.
    @inlinable
    public static func readAll<T>(
        _ bytes: [UInt8], _ read: (inout ByteReader) throws(ByteCodecError) -> T
    ) throws(ByteCodecError) -> T {
        // `withUnsafeBytes` rethrows untyped errors, so the outcome travels as a `Result`.
        let outcome: Result<T, ByteCodecError> = bytes.withUnsafeBytes { raw in
            Result { () throws(ByteCodecError) -> T in try readAll(raw, read) }
        }
        return try outcome.get()
    }
}
