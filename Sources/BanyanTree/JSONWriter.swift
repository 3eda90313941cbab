/// Writes trees as JSON.
///
/// - `.plain`: what `val()` and REST GET return: no priorities; a children tree whose keys are all
///   `0`, `1`, ... style indices with `maxKey < 2 * count` renders as an array (gaps become null).
/// - `.export`: the export format: `.priority` included, leaves with a priority written as
///   `{".value": v, ".priority": p}`, never arrays.
///
/// Keys are written in Firebase key order. Integers are written as integers; doubles always with a
/// fraction or exponent, in the shortest form that reads back to the same double.
public enum JSONWriter {
    public enum Format: Sendable {
        case plain
        case export
    }

    public static func bytes(_ subtree: Tree, format: Format = .plain, pretty: Bool = false) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(64)
        write(subtree, format: format, pretty: pretty ? 0 : nil, to: &out)
        return out
    }

    public static func string(_ subtree: Tree, format: Format = .plain, pretty: Bool = false) -> String {
        String(decoding: bytes(subtree, format: format, pretty: pretty), as: UTF8.self)
    }

    /// Writes `subtree` in chunks of about `chunkBytes`, handing each to `emit` as it fills, so a
    /// large tree never needs its whole JSON in memory (snapshot images).
    public static func stream(
        _ subtree: Tree, format: Format = .export, chunkBytes: Int = 1 << 20, emit: ([UInt8]) throws -> Void
    ) throws {
        var out: [UInt8] = []
        out.reserveCapacity(Swift.min(chunkBytes, 1 << 22) + 64 * 1024)
        var failure: (any Error)?
        withoutActuallyEscaping(emit) { emit in
            write(subtree, format: format, pretty: nil, to: &out) { buffer in
                guard buffer.count >= chunkBytes, failure == nil else { return }
                do { try emit(buffer) } catch { failure = error }
                buffer.removeAll(keepingCapacity: true)
            }
        }
        if let failure { throw failure }
        if !out.isEmpty { try emit(out) }
    }

    /// Appends `subtree`; `pretty` is the current indent level, or `nil` for compact output.
    /// `flush`, when given, is offered the buffer after each child (streaming output).
    public static func write(
        _ subtree: Tree, format: Format, pretty: Int? = nil, to out: inout [UInt8],
        flush: ((inout [UInt8]) -> Void)? = nil
    ) {
        switch subtree.storage {
        case .empty:
            out.append(contentsOf: "null".utf8)
        case .leaf(let leaf, let priority):
            if format == .export, priority != .none {
                out.append(UInt8(ascii: "{"))
                newline(pretty.map { $0 + 1 }, &out)
                appendString(".value", to: &out)
                colon(pretty, &out)
                appendLeaf(leaf, to: &out)
                out.append(UInt8(ascii: ","))
                newline(pretty.map { $0 + 1 }, &out)
                appendString(".priority", to: &out)
                colon(pretty, &out)
                appendPriority(priority, to: &out)
                newline(pretty, &out)
                out.append(UInt8(ascii: "}"))
            } else {
                appendLeaf(leaf, to: &out)
            }
        case .children(let map, let priority, _):
            let inner = pretty.map { $0 + 1 }
            if format == .plain, let length = arrayLength(map) {
                out.append(UInt8(ascii: "["))
                var next = 0
                map.forEach { key, child in
                    let index = Int(key.intValue ?? 0)
                    while next < index {
                        if next > 0 { out.append(UInt8(ascii: ",")) }
                        newline(inner, &out)
                        out.append(contentsOf: "null".utf8)
                        next += 1
                    }
                    if next > 0 { out.append(UInt8(ascii: ",")) }
                    newline(inner, &out)
                    write(child, format: format, pretty: inner, to: &out, flush: flush)
                    flush?(&out)
                    next += 1
                }
                _ = length
                newline(pretty, &out)
                out.append(UInt8(ascii: "]"))
                return
            }
            out.append(UInt8(ascii: "{"))
            var first = true
            if format == .export, priority != .none {
                newline(inner, &out)
                appendString(".priority", to: &out)
                colon(pretty, &out)
                appendPriority(priority, to: &out)
                first = false
            }
            map.forEach { key, child in
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                newline(inner, &out)
                appendString(key.string, to: &out)
                colon(pretty, &out)
                write(child, format: format, pretty: inner, to: &out, flush: flush)
                flush?(&out)
            }
            newline(pretty, &out)
            out.append(UInt8(ascii: "}"))
        }
    }

    /// The array length when the children render as an array, else nil.
    static func arrayLength(_ map: ChildMap) -> Int? {
        guard let last = map.last, let maxIndex = last.key.intValue, maxIndex >= 0 else { return nil }
        guard Int(maxIndex) < 2 * map.count else { return nil }
        for (key, _) in map.elements() {
            guard let i = key.intValue, i >= 0 else { return nil }
            // Canonical decimal only: no leading zeros, no "-0".
            let utf8 = key.string.utf8
            if utf8.first == UInt8(ascii: "-") || (utf8.count > 1 && utf8.first == UInt8(ascii: "0")) { return nil }
        }
        return Int(maxIndex) + 1
    }

    @inline(__always)
    static func newline(_ indent: Int?, _ out: inout [UInt8]) {
        guard let indent else { return }
        out.append(0x0A)
        for _ in 0..<(indent * 2) { out.append(0x20) }
    }

    @inline(__always)
    static func colon(_ pretty: Int?, _ out: inout [UInt8]) {
        out.append(UInt8(ascii: ":"))
        if pretty != nil { out.append(0x20) }
    }

    static func appendPriority(_ priority: Priority, to out: inout [UInt8]) {
        switch priority {
        case .none: out.append(contentsOf: "null".utf8)
        case .number(let d): appendNumber(d, to: &out)
        case .string(let s): appendString(s, to: &out)
        }
    }

    /// A priority number: integral values print as integers, as Firebase clients send them.
    static func appendNumber(_ d: Double, to out: inout [UInt8]) {
        if abs(d) < 9_007_199_254_740_992, Double(Int64(d)) == d {
            appendInt(Int64(d), to: &out)
        } else {
            appendDouble(d, to: &out)
        }
    }

    @inline(__always)
    static func appendLeaf(_ leaf: Leaf, to out: inout [UInt8]) {
        switch leaf {
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .int(let i): appendInt(i, to: &out)
        case .double(let d): appendDouble(d, to: &out)
        case .string(let s): appendString(s, to: &out)
        }
    }

    public static func appendInt(_ value: Int64, to out: inout [UInt8]) {
        if value == 0 {
            out.append(UInt8(ascii: "0"))
            return
        }
        var magnitude = value.magnitude
        if value < 0 { out.append(UInt8(ascii: "-")) }
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                     UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var count = 0
        withUnsafeMutableBytes(of: &digits) { buf in
            while magnitude > 0 {
                buf[count] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
                count += 1
            }
            for i in stride(from: count - 1, through: 0, by: -1) { out.append(buf[i]) }
        }
    }

    public static func appendDouble(_ value: Double, to out: inout [UInt8]) {
        // Swift's description is the shortest round-trip form and always has "." or "e" for
        // finite values ("5.0", "1e-07", "1.5e+300"), all valid JSON.
        out.append(contentsOf: value.description.utf8)
    }

    public static func appendString(_ s: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var s = s
        s.withUTF8 { bytes in
            var runStart = 0
            for i in 0..<bytes.count {
                let b = bytes[i]
                guard b < 0x20 || b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\") else { continue }
                out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<i]))
                runStart = i + 1
                switch b {
                case UInt8(ascii: "\""): out.append(contentsOf: "\\\"".utf8)
                case UInt8(ascii: "\\"): out.append(contentsOf: "\\\\".utf8)
                case 0x0A: out.append(contentsOf: "\\n".utf8)
                case 0x0D: out.append(contentsOf: "\\r".utf8)
                case 0x09: out.append(contentsOf: "\\t".utf8)
                case 0x08: out.append(contentsOf: "\\b".utf8)
                case 0x0C: out.append(contentsOf: "\\f".utf8)
                default:
                    let hex: [UInt8] = Array("0123456789abcdef".utf8)
                    out.append(contentsOf: "\\u00".utf8)
                    out.append(hex[Int(b >> 4)])
                    out.append(hex[Int(b & 0xF)])
                }
            }
            out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<bytes.count]))
        }
        out.append(UInt8(ascii: "\""))
    }
}
