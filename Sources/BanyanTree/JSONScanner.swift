/// A strict RFC 8259 tokenizer over UTF-8 bytes, shared by the `JSONValue` and `Tree` readers.
///
/// Rejects (with a byte offset): a byte-order mark, comments, single quotes, trailing commas,
/// leading zeros, lone or unpaired surrogate escapes, invalid UTF-8, unescaped control characters,
/// NaN/Infinity literals, and numbers outside the double range. Never recurses itself; the readers
/// bound nesting depth before descending.
struct JSONScanner {
    let bytes: UnsafeBufferPointer<UInt8>
    var position: Int = 0
    /// Where the input's path is, for error messages (set by the reader).
    var pathDescription: () -> String = { "/" }

    init(bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
    }

    /// A JSON number literal: integral literals that fit Int64 stay exact.
    enum Number {
        case int(Int64)
        case double(Double)
    }

    func error(_ message: String, at offset: Int? = nil) -> TreeError {
        TreeError(.invalidJSON, path: pathDescription(), message, offset: offset ?? position)
    }

    @inline(__always)
    mutating func skipWhitespace() {
        while position < bytes.count {
            switch bytes[position] {
            case 0x20, 0x09, 0x0A, 0x0D: position += 1
            default: return
            }
        }
    }

    /// The next non-whitespace byte without consuming it.
    @inline(__always)
    mutating func peek() throws(TreeError) -> UInt8 {
        skipWhitespace()
        guard position < bytes.count else { throw error("Unexpected end of input") }
        return bytes[position]
    }

    @inline(__always)
    mutating func expect(_ byte: UInt8) throws(TreeError) {
        let b = try peek()
        guard b == byte else { throw unexpected(b, expecting: "'\(Character(Unicode.Scalar(byte)))'") }
        position += 1
    }

    func unexpected(_ byte: UInt8, expecting what: String) -> TreeError {
        if byte == 0xEF && position == 0 { return error("A byte-order mark is not allowed") }
        let shown = byte >= 0x20 && byte < 0x7F ? "'\(Character(Unicode.Scalar(byte)))'" : "byte 0x\(String(byte, radix: 16))"
        return error("Unexpected \(shown), expecting \(what)")
    }

    /// After the top-level value: only whitespace may follow.
    mutating func expectEnd() throws(TreeError) {
        skipWhitespace()
        if position < bytes.count { throw error("Unexpected data after the JSON value") }
    }

    mutating func literal(_ word: StaticString) throws(TreeError) {
        let start = position
        let count = word.utf8CodeUnitCount
        guard position + count <= bytes.count else { throw error("Invalid literal", at: start) }
        let w = word.utf8Start
        for i in 0..<count where bytes[position + i] != w[i] {
            throw error("Invalid literal", at: start)
        }
        position += count
    }

    /// Reads `true`, `false` or `null` at the current byte (which must be t, f or n).
    mutating func readKeyword() throws(TreeError) -> Bool? {
        switch bytes[position] {
        case UInt8(ascii: "t"):
            try literal("true")
            return true
        case UInt8(ascii: "f"):
            try literal("false")
            return false
        default:
            try literal("null")
            return nil
        }
    }

    // MARK: Skipping

    /// Moves past one value without decoding it: strings are matched quote to quote (escapes
    /// stepped over), brackets counted, other tokens run to the next delimiter. It only
    /// delimits the value (iteratively, so depth costs no stack): whoever uses the bytes reads
    /// them with a full reader, which reports what is wrong inside.
    mutating func skipValue() throws(TreeError) {
        // The open brackets, innermost last: a closing bracket must match (so that the range
        // found is the value's, even when nobody reads it).
        var open: [UInt8] = []
        while true {
            let b = try peek()
            switch b {
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                open.append(b)
                position += 1
                continue
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                let opener = b == UInt8(ascii: "}") ? UInt8(ascii: "{") : UInt8(ascii: "[")
                guard open.last == opener else { throw unexpected(b, expecting: "a JSON value") }
                open.removeLast()
                position += 1
            case UInt8(ascii: "\""):
                try skipString()
            case UInt8(ascii: ","), UInt8(ascii: ":"):
                guard !open.isEmpty else { throw unexpected(b, expecting: "a JSON value") }
                position += 1
                continue
            default:
                let start = position
                while position < bytes.count {
                    switch bytes[position] {
                    case 0x20, 0x09, 0x0A, 0x0D, UInt8(ascii: ","), UInt8(ascii: ":"), UInt8(ascii: "}"), UInt8(ascii: "]"),
                        UInt8(ascii: "{"), UInt8(ascii: "["), UInt8(ascii: "\""):
                        break
                    default:
                        position += 1
                        continue
                    }
                    break
                }
                if position == start { throw unexpected(b, expecting: "a JSON value") }
            }
            if open.isEmpty { return }
        }
    }

    /// Moves past a string starting at its opening quote, without decoding it.
    mutating func skipString() throws(TreeError) {
        let start = position
        position += 1
        while position < bytes.count {
            switch bytes[position] {
            case UInt8(ascii: "\""):
                position += 1
                return
            case UInt8(ascii: "\\"):
                position += 2
            default:
                position += 1
            }
        }
        throw error("Unterminated string", at: start)
    }

    // MARK: Strings

    /// Reads a string starting at the opening quote. `maxBytes` bounds the UTF-8 length.
    mutating func readString(maxBytes: Int = Int.max) throws(TreeError) -> String {
        let start = position
        position += 1  // opening quote
        var runStart = position
        var ascii = true
        // Fast path: no escapes.
        while position < bytes.count {
            let b = bytes[position]
            // Common case first: printable ASCII other than quote and backslash.
            if b != UInt8(ascii: "\"") && b != UInt8(ascii: "\\") && (b &- 0x20) < 0x60 {
                position += 1
                continue
            }
            if b == UInt8(ascii: "\"") {
                let slice = UnsafeBufferPointer(rebasing: bytes[runStart..<position])
                position += 1
                if slice.count > maxBytes { throw stringTooLong(start, slice.count, maxBytes) }
                if ascii { return String(decoding: slice, as: UTF8.self) }
                guard let s = String(validating: slice, as: UTF8.self) else {
                    throw error("Invalid UTF-8 in string", at: start)
                }
                return s
            }
            if b == UInt8(ascii: "\\") { break }
            if b < 0x20 { throw error("Unescaped control character in string") }
            if b >= 0x80 { ascii = false }
            position += 1
        }
        guard position < bytes.count else { throw error("Unterminated string", at: start) }
        // Slow path: escapes present; collect bytes.
        var buffer: [UInt8] = Array(UnsafeBufferPointer(rebasing: bytes[runStart..<position]))
        while position < bytes.count {
            let b = bytes[position]
            if b == UInt8(ascii: "\"") {
                position += 1
                if buffer.count > maxBytes { throw stringTooLong(start, buffer.count, maxBytes) }
                guard let s = String(validating: buffer, as: UTF8.self) else {
                    throw error("Invalid UTF-8 in string", at: start)
                }
                return s
            }
            if b < 0x20 { throw error("Unescaped control character in string") }
            if b == UInt8(ascii: "\\") {
                position += 1
                guard position < bytes.count else { break }
                let e = bytes[position]
                position += 1
                switch e {
                case UInt8(ascii: "\""): buffer.append(0x22)
                case UInt8(ascii: "\\"): buffer.append(0x5C)
                case UInt8(ascii: "/"): buffer.append(0x2F)
                case UInt8(ascii: "b"): buffer.append(0x08)
                case UInt8(ascii: "f"): buffer.append(0x0C)
                case UInt8(ascii: "n"): buffer.append(0x0A)
                case UInt8(ascii: "r"): buffer.append(0x0D)
                case UInt8(ascii: "t"): buffer.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try readHex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        guard position + 1 < bytes.count, bytes[position] == UInt8(ascii: "\\"),
                            bytes[position + 1] == UInt8(ascii: "u")
                        else { throw error("Unpaired surrogate escape in string") }
                        position += 2
                        let low = try readHex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw error("Unpaired surrogate escape in string") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        throw error("Unpaired surrogate escape in string")
                    }
                    guard let u = Unicode.Scalar(scalar) else { throw error("Invalid escape") }
                    buffer.append(contentsOf: UTF8.encode(u) ?? UTF8.EncodedScalar())
                default:
                    throw error("Invalid escape sequence", at: position - 2)
                }
                runStart = position
                continue
            }
            buffer.append(b)
            position += 1
        }
        throw error("Unterminated string", at: start)
    }

    private mutating func readHex4() throws(TreeError) -> UInt32 {
        guard position + 4 <= bytes.count else { throw error("Truncated \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let b = bytes[position]
            let digit: UInt32
            switch b {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(b - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(b - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(b - UInt8(ascii: "A") + 10)
            default: throw error("Invalid hex digit in \\u escape")
            }
            value = value << 4 | digit
            position += 1
        }
        return value
    }

    private func stringTooLong(_ start: Int, _ count: Int, _ limit: Int) -> TreeError {
        TreeError(
            .stringTooLong, path: pathDescription(),
            "String is \(count) bytes of UTF-8; the limit is \(limit)", offset: start)
    }

    // MARK: Numbers

    mutating func readNumber() throws(TreeError) -> Number {
        let start = position
        var negative = false
        if bytes[position] == UInt8(ascii: "-") {
            negative = true
            position += 1
        }
        guard position < bytes.count, isDigit(bytes[position]) else {
            throw error(bytes[start] == UInt8(ascii: "-") ? "Invalid number" : "Unexpected character", at: start)
        }
        var value: Int64 = 0
        var overflow = false
        if bytes[position] == UInt8(ascii: "0") {
            position += 1
            if position < bytes.count, isDigit(bytes[position]) { throw error("Leading zeros are not allowed", at: start) }
        } else {
            while position < bytes.count, isDigit(bytes[position]) {
                let d = Int64(bytes[position] - UInt8(ascii: "0"))
                let (m, o1) = value.multipliedReportingOverflow(by: 10)
                let (s, o2) = negative ? m.subtractingReportingOverflow(d) : m.addingReportingOverflow(d)
                if o1 || o2 { overflow = true }
                value = s
                position += 1
            }
        }
        var integral = true
        if position < bytes.count, bytes[position] == UInt8(ascii: ".") {
            integral = false
            position += 1
            guard position < bytes.count, isDigit(bytes[position]) else { throw error("Invalid number: digits must follow '.'", at: start) }
            while position < bytes.count, isDigit(bytes[position]) { position += 1 }
        }
        if position < bytes.count, bytes[position] == UInt8(ascii: "e") || bytes[position] == UInt8(ascii: "E") {
            integral = false
            position += 1
            if position < bytes.count, bytes[position] == UInt8(ascii: "+") || bytes[position] == UInt8(ascii: "-") { position += 1 }
            guard position < bytes.count, isDigit(bytes[position]) else { throw error("Invalid number: digits must follow the exponent", at: start) }
            while position < bytes.count, isDigit(bytes[position]) { position += 1 }
        }
        if integral && !overflow { return .int(value) }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<position]), as: UTF8.self)
        guard let d = Double(text), d.isFinite else {
            throw TreeError(.invalidNumber, path: pathDescription(), "Number \(text.prefix(40)) is out of the double range", offset: start)
        }
        // -0.0 is normalised to 0 so that equal values hash equally everywhere.
        return .double(d == 0 ? 0 : d)
    }

    @inline(__always)
    private func isDigit(_ b: UInt8) -> Bool { b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9") }
}
