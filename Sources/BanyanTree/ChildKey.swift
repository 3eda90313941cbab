/// One segment of a path: a child name, compared exactly as Firebase compares names.
///
/// Equality and hashing use the exact UTF-8 bytes (never Swift's canonical-equivalence `==`:
/// `"é"` and `"e\u{301}"` are different keys). Ordering is Firebase's `nameCompare`: keys that parse
/// as 32-bit signed integers first, numerically, shorter string first on ties; then all other keys
/// by UTF-16 code units.
public struct ChildKey: Hashable, SortKey, Sendable, CustomStringConvertible {
    /// The key text.
    public let string: String
    /// The key's value when it parses as a 32-bit integer (Android/iOS rule: at most 11
    /// characters, optional `-` then digits only, leading zeros allowed, in range), else `nil`.
    public var intValue: Int32? { isInt ? int : nil }
    /// The first 8 UTF-8 bytes, big-endian, zero-padded: decides most comparisons in one step.
    @usableFromInline let prefix: UInt64
    @usableFromInline let int: Int32
    @usableFromInline let isInt: Bool
    /// UTF-8 length, saturating at 65,535 (keys in a tree have at most `maxBytes`; longer
    /// unchecked keys still compare and hash correctly, by their bytes). Two bytes keep the whole
    /// key at 32, so pages hold two keys per cache line.
    @usableFromInline let length: UInt16

    /// Maximum UTF-8 length of one key.
    public static let maxBytes = 768

    /// Creates a key after checking it against Firebase's key rules (one scan of the bytes; the
    /// reason is worked out only for an invalid key).
    public init(validating string: String, path: @autoclosure () -> String = "/") throws(TreeError) {
        let scanned = ChildKey.scan(string)
        guard scanned.valid else {
            let problem = ChildKey.problem(with: string) ?? "keys must be 1 to \(ChildKey.maxBytes) bytes of UTF-8"
            throw TreeError(.invalidKey, path: path(), "Invalid key \"\(ChildKey.printable(string))\": \(problem)")
        }
        self.init(string, scanned)
    }

    /// Creates a key without validation (for query bounds and trusted internal use).
    public init(unchecked string: String) {
        self.init(string, ChildKey.scan(string))
    }

    /// A key if `string` is valid (one pass over the bytes), otherwise nil.
    public init?(validKey string: String) {
        let scanned = ChildKey.scan(string)
        guard scanned.valid else { return nil }
        self.init(string, scanned)
    }

    /// A key if `utf8` (the UTF-8 bytes of `string`) is a valid key, otherwise nil: one pass over
    /// bytes already at hand.
    init?(validUTF8 utf8: UnsafeBufferPointer<UInt8>, string: String) {
        let scanned = ChildKey.scan(utf8)
        guard scanned.valid else { return nil }
        self.init(string, scanned)
    }

    private init(_ string: String, _ scanned: Scan) {
        self.string = string
        self.prefix = scanned.prefix
        self.length = UInt16(clamping: scanned.length)
        self.isInt = scanned.isInt
        self.int = scanned.int
    }

    private struct Scan {
        var prefix: UInt64 = 0
        var length: UInt32 = 0
        var isInt = false
        var int: Int32 = 0
        var valid = false
    }

    /// One pass over the bytes: the packed prefix, the length, validity, and the Int32 parse
    /// (Android/iOS rule: at most 11 characters, optional leading '-', then digits, within Int32).
    @inline(__always)
    private static func scan(_ string: String) -> Scan { scan(string.utf8) }

    @inline(__always)
    private static func scan<Bytes: Sequence<UInt8>>(_ utf8: Bytes) -> Scan {
        var result = Scan()
        var value: Int64 = 0
        var digits = 0
        var negative = false
        var numeric = true
        var clean = true
        for byte in utf8 {
            if result.length < 8 { result.prefix |= UInt64(byte) << (56 - 8 * UInt64(result.length)) }
            switch byte {
            case UInt8(ascii: "."), UInt8(ascii: "$"), UInt8(ascii: "#"), UInt8(ascii: "["),
                UInt8(ascii: "]"), UInt8(ascii: "/"), 0x00...0x1F, 0x7F:
                clean = false
            default:
                break
            }
            if numeric {
                if result.length == 0 && byte == UInt8(ascii: "-") {
                    negative = true
                } else if byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") && result.length < 11 {
                    value = value * 10 + Int64(byte - UInt8(ascii: "0"))
                    digits += 1
                } else {
                    numeric = false
                }
            }
            result.length += 1
        }
        if negative { value = -value }
        result.isInt = numeric && digits >= 1 && value >= Int64(Int32.min) && value <= Int64(Int32.max)
        result.int = result.isInt ? Int32(value) : 0
        result.valid = clean && result.length >= 1 && result.length <= UInt32(maxBytes)
        return result
    }

    /// Why `string` is not a valid key, or `nil` when it is.
    public static func problem(with string: String) -> String? {
        var count = 0
        for byte in string.utf8 {
            count += 1
            switch byte {
            case UInt8(ascii: "."), UInt8(ascii: "$"), UInt8(ascii: "#"), UInt8(ascii: "["),
                UInt8(ascii: "]"), UInt8(ascii: "/"):
                return "keys can't contain \".\", \"#\", \"$\", \"/\", \"[\", or \"]\""
            case 0x00...0x1F, 0x7F:
                return "keys can't contain ASCII control characters"
            default:
                continue
            }
        }
        if count == 0 { return "keys must be non-empty" }
        if count > maxBytes { return "keys are limited to \(maxBytes) bytes of UTF-8 (this one has \(count))" }
        return nil
    }

    /// The key with control characters escaped, for error messages.
    public static func printable(_ string: String) -> String {
        var out = ""
        for scalar in string.unicodeScalars.prefix(100) {
            if scalar.value < 0x20 || scalar.value == 0x7F {
                out += "\\u{\(String(scalar.value, radix: 16))}"
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    public var description: String { string }

    @inline(__always)
    public static func == (a: ChildKey, b: ChildKey) -> Bool {
        a.prefix == b.prefix && a.length == b.length && (a.length <= 8 || a.string.utf8.elementsEqual(b.string.utf8))
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(prefix)
        hasher.combine(length)
        if length > 8 {
            var s = string
            s.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
        }
    }

    @inline(__always)
    public static func < (a: ChildKey, b: ChildKey) -> Bool {
        compare(a, b) < 0
    }

    /// Search summary (see `SortKey.sortWord`): integer keys below all others, by value then
    /// length; other keys by their first bytes in UTF-16 order (the last bit of the eighth byte is
    /// dropped to make room for the flag).
    @inline(__always)
    public var sortWord: UInt64 {
        if isInt { return UInt64(UInt32(bitPattern: int) ^ 0x8000_0000) << 8 | UInt64(Swift.min(length, 255)) }
        return 1 << 63 | utf16OrderedBytes(prefix) >> 1
    }

    /// Element by element, compiled for this type (see `SortKey.destroy`).
    public static func destroy(_ keys: UnsafeMutablePointer<ChildKey>, count: Int) {
        for i in 0..<count { (keys + i).deinitialize(count: 1) }
    }

    /// Firebase `nameCompare`: negative, zero or positive.
    @inline(__always)
    public static func compare(_ a: ChildKey, _ b: ChildKey) -> Int {
        if a.isInt != b.isInt { return a.isInt ? -1 : 1 }
        if a.isInt {
            if a.int != b.int { return a.int < b.int ? -1 : 1 }
            if a.length != b.length { return a.length < b.length ? -1 : 1 }
        }
        if a.prefix != b.prefix {
            // The first differing byte decides, with the UTF-16 correction for high-BMP vs
            // supplementary characters (see compareUTF16).
            let shift = UInt64((a.prefix ^ b.prefix).leadingZeroBitCount & ~7)
            let x = UInt8(truncatingIfNeeded: a.prefix >> (56 - shift))
            let y = UInt8(truncatingIfNeeded: b.prefix >> (56 - shift))
            if x >= 0xEE || y >= 0xEE {
                let position = Int(shift / 8)
                // Padding zero bytes only occur past the end of a key shorter than 8 bytes.
                if position < a.length && position < b.length {
                    if (x == 0xEE || x == 0xEF) && y >= 0xF0 { return 1 }
                    if (y == 0xEE || y == 0xEF) && x >= 0xF0 { return -1 }
                }
            }
            return a.prefix < b.prefix ? -1 : 1
        }
        if a.length <= 8 && b.length <= 8 {
            return a.length == b.length ? 0 : (a.length < b.length ? -1 : 1)
        }
        return compareUTF16(a.string, b.string)
    }
}

/// Rewrites up to eight big-endian packed UTF-8 bytes so that their integer order is UTF-16 code
/// unit order: lead bytes of supplementary characters (0xF0...0xF4, surrogate pairs in UTF-16)
/// move below those of U+E000...U+FFFF (0xEE, 0xEF). Comparing two keys decides at their first
/// differing byte, where both bytes are lead bytes or both continuation bytes, so a byte-wise
/// mapping is enough (see `compareUTF16`).
@inline(__always)
func utf16OrderedBytes(_ packed: UInt64) -> UInt64 {
    // Only bytes from 0xEE up change; ASCII-only prefixes, the common case, pass straight through.
    guard packed & 0x8080_8080_8080_8080 != 0 else { return packed }
    var result: UInt64 = 0
    var shift: UInt64 = 0
    while shift < 64 {
        var byte = UInt8(truncatingIfNeeded: packed >> shift)
        if byte >= 0xF0 && byte <= 0xF4 {
            byte -= 2
        } else if byte == 0xEE || byte == 0xEF {
            byte += 5
        }
        result |= UInt64(byte) << shift
        shift += 8
    }
    return result
}

/// The first eight UTF-8 bytes of `string`, big-endian, zero-padded.
@inline(__always)
func packedUTF8Prefix(_ string: String) -> UInt64 {
    var packed: UInt64 = 0
    var shift: UInt64 = 56
    for byte in string.utf8.prefix(8) {
        packed |= UInt64(byte) << shift
        shift &-= 8
    }
    return packed
}

/// Compares two strings by UTF-16 code units (JavaScript `<`), negative / zero / positive.
///
/// Walks the UTF-8 bytes: byte order equals code-point order, which equals UTF-16 order except when
/// one string has a BMP character at or above U+E000 (lead byte 0xEE or 0xEF) where the other has a
/// supplementary character (lead byte 0xF0...0xF4, a surrogate pair 0xD800...0xDFFF in UTF-16).
public func compareUTF16(_ a: String, _ b: String) -> Int {
    // Native and small strings expose their UTF-8 directly: compare the bytes in place.
    let fast = a.utf8.withContiguousStorageIfAvailable { x in
        b.utf8.withContiguousStorageIfAvailable { y in compareUTF16(x, y) }
    }
    if let result = fast ?? nil { return result }
    var ia = a.utf8.makeIterator()
    var ib = b.utf8.makeIterator()
    while true {
        switch (ia.next(), ib.next()) {
        case (nil, nil):
            return 0
        case (nil, _):
            return -1
        case (_, nil):
            return 1
        case let (x?, y?):
            if x != y { return compareUTF16(differing: x, y) }
        }
    }
}

/// `compareUTF16` over UTF-8 bytes.
@inline(__always)
func compareUTF16(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Int {
    let n = Swift.min(a.count, b.count)
    var i = 0
    while i < n {
        let x = a[i]
        let y = b[i]
        if x != y { return compareUTF16(differing: x, y) }
        i += 1
    }
    return a.count == b.count ? 0 : (a.count < b.count ? -1 : 1)
}

/// The order of two different bytes at the first difference of two UTF-8 strings.
@inline(__always)
func compareUTF16(differing x: UInt8, _ y: UInt8) -> Int {
    let xHighBMP = x == 0xEE || x == 0xEF
    let yHighBMP = y == 0xEE || y == 0xEF
    if xHighBMP && y >= 0xF0 { return 1 }
    if yHighBMP && x >= 0xF0 { return -1 }
    return x < y ? -1 : 1
}
