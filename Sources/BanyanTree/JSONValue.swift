/// A plain JSON value, for inputs that are not tree data (query parameters, `.sv` specs, wire
/// envelopes). Object members keep their order; duplicate keys are rejected when reading.
public enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSONValue])
    case object([(String, JSONValue)])

    public static func == (a: JSONValue, b: JSONValue) -> Bool {
        switch (a, b) {
        case (.null, .null): return true
        case let (.bool(x), .bool(y)): return x == y
        case let (.int(x), .int(y)): return x == y
        case let (.double(x), .double(y)): return x == y
        case let (.int(x), .double(y)), let (.double(y), .int(x)): return Double(x) == y
        case let (.string(x), .string(y)): return x.utf8.elementsEqual(y.utf8)
        case let (.array(x), .array(y)): return x == y
        case let (.object(x), .object(y)):
            return x.count == y.count && zip(x, y).allSatisfy { $0.0.utf8.elementsEqual($1.0.utf8) && $0.1 == $1.1 }
        default: return false
        }
    }

    /// The member `key` of an object.
    public subscript(key: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.0.utf8.elementsEqual(key.utf8) }?.1
    }

    /// Parses JSON text. `maxDepth` bounds nesting (checked before descending, so deep input can
    /// never exhaust the stack).
    public init(parsing bytes: [UInt8], maxDepth: Int = 64) throws(TreeError) {
        let result: Result<JSONValue, TreeError> = bytes.withUnsafeBufferPointer { buffer in
            var scanner = JSONScanner(bytes: buffer)
            do throws(TreeError) {
                let value = try JSONValue.read(&scanner, depth: 0, maxDepth: maxDepth)
                try scanner.expectEnd()
                return .success(value)
            } catch {
                return .failure(error)
            }
        }
        self = try result.get()
    }

    public init(parsing text: String, maxDepth: Int = 64) throws(TreeError) {
        try self.init(parsing: Array(text.utf8), maxDepth: maxDepth)
    }

    /// Parses JSON text whose member at `rawPath` (object keys from the root) is not decoded:
    /// that value is only delimited, stands as `.null` in the result, and its byte range is
    /// returned, for a caller that reads it once with another reader and its own limits (tree
    /// data inside a wire envelope, read by `TreeReader`). Everything else is read as by
    /// `init(parsing:)`, duplicate keys rejected; nil range when the member is absent.
    public static func parse(
        _ bytes: [UInt8], leavingRaw rawPath: [String], maxDepth: Int = 64
    ) throws(TreeError) -> (value: JSONValue, raw: Range<Int>?) {
        let result: Result<(JSONValue, Range<Int>?), TreeError> = bytes.withUnsafeBufferPointer { buffer in
            var scanner = JSONScanner(bytes: buffer)
            var raw: Range<Int>?
            do throws(TreeError) {
                let value = try JSONValue.read(&scanner, leavingRaw: rawPath[...], raw: &raw, depth: 0, maxDepth: maxDepth)
                try scanner.expectEnd()
                return .success((value, raw))
            } catch {
                return .failure(error)
            }
        }
        let (value, raw) = try result.get()
        return (value, raw)
    }

    static func read(
        _ s: inout JSONScanner, leavingRaw path: ArraySlice<String>, raw: inout Range<Int>?, depth: Int, maxDepth: Int
    ) throws(TreeError) -> JSONValue {
        guard let wanted = path.first, try s.peek() == UInt8(ascii: "{") else { return try read(&s, depth: depth, maxDepth: maxDepth) }
        guard depth < maxDepth else { throw TreeError(.depthExceeded, path: "/", "JSON nesting exceeds \(maxDepth) levels", offset: s.position) }
        var members: [(String, JSONValue)] = []
        try readMembers(&s) { (key, s) throws(TreeError) in
            if key.utf8.elementsEqual(wanted.utf8) {
                if path.count == 1 {
                    _ = try s.peek()
                    let start = s.position
                    try s.skipValue()
                    raw = start..<s.position
                    members.append((key, .null))
                } else {
                    members.append((key, try read(&s, leavingRaw: path.dropFirst(), raw: &raw, depth: depth + 1, maxDepth: maxDepth)))
                }
            } else {
                members.append((key, try read(&s, depth: depth + 1, maxDepth: maxDepth)))
            }
        }
        return .object(members)
    }

    /// Reads the members of the object whose `{` is next (the caller checked it, and the depth):
    /// each key, duplicates refused, then `member(key, &s)` reads its value; returns after the
    /// closing `}`. The one object loop of `read`, `read(leavingRaw:)` and `members(rawIn:)`.
    static func readMembers(
        _ s: inout JSONScanner, _ member: (String, inout JSONScanner) throws(TreeError) -> Void
    ) throws(TreeError) {
        s.position += 1
        var seen = Set<ChildKeyBytes>()
        if try s.peek() == UInt8(ascii: "}") {
            s.position += 1
            return
        }
        while true {
            let q = try s.peek()
            guard q == UInt8(ascii: "\"") else { throw s.unexpected(q, expecting: "a string key") }
            let keyOffset = s.position
            let key = try s.readString()
            if !seen.insert(ChildKeyBytes(key)).inserted {
                throw TreeError(.duplicateKey, path: "/", "Duplicate key \"\(ChildKey.printable(key))\" in object", offset: keyOffset)
            }
            try s.expect(UInt8(ascii: ":"))
            try member(key, &s)
            let sep = try s.peek()
            s.position += 1
            if sep == UInt8(ascii: "}") { return }
            guard sep == UInt8(ascii: ",") else {
                s.position -= 1
                throw s.unexpected(sep, expecting: "',' or '}'")
            }
        }
    }

    /// Reads a JSON object's keys and delimits each member's value without decoding it (as
    /// `parse(_:leavingRaw:)` does for one member): nil when the text is not an object. For a
    /// body whose values another reader reads once each (the paths of a multi-path update).
    /// Duplicate keys are rejected, and more than `maxMembers` members (`.inputTooLarge`, found
    /// as soon as one member too many starts: the rest of the text is not read).
    public static func members(rawIn bytes: [UInt8], maxMembers: Int = .max) throws(TreeError) -> [(key: String, value: Range<Int>)]? {
        let result: Result<[(key: String, value: Range<Int>)]?, TreeError> = bytes.withUnsafeBufferPointer { buffer in
            var s = JSONScanner(bytes: buffer)
            do throws(TreeError) {
                guard try s.peek() == UInt8(ascii: "{") else {
                    try s.skipValue()
                    try s.expectEnd()
                    return .success(nil)
                }
                var members: [(key: String, value: Range<Int>)] = []
                try readMembers(&s) { (key, s) throws(TreeError) in
                    guard members.count < maxMembers else {
                        throw TreeError(.inputTooLarge, path: "/", "An object of more than \(maxMembers) members", offset: s.position)
                    }
                    _ = try s.peek()
                    let start = s.position
                    try s.skipValue()
                    members.append((key, start..<s.position))
                }
                try s.expectEnd()
                return .success(members)
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    /// The compact serialisation with every object's members sorted by their keys' UTF-8
    /// bytes: equal for two values that differ only in member order (how JS identifies a query).
    public var canonicalBytes: [UInt8] {
        var out: [UInt8] = []
        canonical().write(to: &out)
        return out
    }

    private func canonical() -> JSONValue {
        switch self {
        case .object(let members):
            return .object(members.map { ($0.0, $0.1.canonical()) }.sorted { $0.0.utf8.lexicographicallyPrecedes($1.0.utf8) })
        case .array(let items):
            return .array(items.map { $0.canonical() })
        default:
            return self
        }
    }

    /// Appends the compact serialisation (as `jsonString`) to `out`.
    public func appendJSON(to out: inout [UInt8]) { write(to: &out) }

    static func read(_ s: inout JSONScanner, depth: Int, maxDepth: Int) throws(TreeError) -> JSONValue {
        let b = try s.peek()
        switch b {
        case UInt8(ascii: "{"):
            guard depth < maxDepth else { throw TreeError(.depthExceeded, path: "/", "JSON nesting exceeds \(maxDepth) levels", offset: s.position) }
            var members: [(String, JSONValue)] = []
            try readMembers(&s) { (key, s) throws(TreeError) in members.append((key, try read(&s, depth: depth + 1, maxDepth: maxDepth))) }
            return .object(members)
        case UInt8(ascii: "["):
            guard depth < maxDepth else { throw TreeError(.depthExceeded, path: "/", "JSON nesting exceeds \(maxDepth) levels", offset: s.position) }
            s.position += 1
            var elements: [JSONValue] = []
            if try s.peek() == UInt8(ascii: "]") {
                s.position += 1
                return .array([])
            }
            while true {
                elements.append(try read(&s, depth: depth + 1, maxDepth: maxDepth))
                let sep = try s.peek()
                s.position += 1
                if sep == UInt8(ascii: "]") { return .array(elements) }
                guard sep == UInt8(ascii: ",") else {
                    s.position -= 1
                    throw s.unexpected(sep, expecting: "',' or ']'")
                }
            }
        case UInt8(ascii: "\""):
            return .string(try s.readString())
        case UInt8(ascii: "t"), UInt8(ascii: "f"), UInt8(ascii: "n"):
            guard let flag = try s.readKeyword() else { return .null }
            return .bool(flag)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            try s.rejectNonFinite()
            switch try s.readNumber() {
            case .int(let i): return .int(i)
            case .double(let d): return .double(d)
            }
        default:
            try s.rejectNonFinite()
            throw s.unexpected(b, expecting: "a JSON value")
        }
    }

    /// Serialises compactly (members in their stored order).
    public var jsonString: String {
        var out: [UInt8] = []
        write(to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    func write(to out: inout [UInt8]) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .int(let i): JSONWriter.appendInt(i, to: &out)
        case .double(let d): JSONWriter.appendDouble(d, to: &out)
        case .string(let s): JSONWriter.appendString(s, to: &out)
        case .array(let items):
            out.append(UInt8(ascii: "["))
            for (i, item) in items.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                item.write(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            for (i, (k, v)) in members.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONWriter.appendString(k, to: &out)
                out.append(UInt8(ascii: ":"))
                v.write(to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }
}

/// A string hashed and compared by its exact UTF-8 bytes (for duplicate-key detection).
struct ChildKeyBytes: Hashable {
    let string: String
    init(_ string: String) { self.string = string }
    static func == (a: ChildKeyBytes, b: ChildKeyBytes) -> Bool { a.string.utf8.elementsEqual(b.string.utf8) }
    func hash(into hasher: inout Hasher) {
        for byte in string.utf8 { hasher.combine(byte) }
    }
}

extension JSONScanner {
    /// Gives NaN / Infinity a clear error instead of a generic syntax error.
    mutating func rejectNonFinite() throws(TreeError) {
        var p = position
        if p < bytes.count, bytes[p] == UInt8(ascii: "-") { p += 1 }
        guard p < bytes.count else { return }
        if bytes[p] == UInt8(ascii: "N") || bytes[p] == UInt8(ascii: "I") {
            throw TreeError(.invalidNumber, path: pathDescription(), "NaN and Infinity are not valid numbers", offset: position)
        }
    }
}
