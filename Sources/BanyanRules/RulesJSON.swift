/// A JSON value that remembers where it was written, read from a rules document.
///
/// The reader accepts what Firebase accepts in rules files: strict JSON plus `//` line comments
/// and `/* */` block comments wherever whitespace may stand. Strings keep, for every decoded
/// scalar, the document offset it came from, so that an error inside an expression string points
/// at the exact column even after escapes.
struct PositionedJSON: Sendable {
    indirect enum Kind: Sendable {
        case null
        case bool(Bool)
        case number(Double)
        /// The decoded text and the document offset of each of its scalars.
        case string([Unicode.Scalar], offsets: [Int])
        case array([PositionedJSON])
        /// Members in document order, each with the offset of its key.
        case object([Member])
    }

    struct Member: Sendable {
        let key: String
        let keyOffset: Int
        let value: PositionedJSON
    }

    let kind: Kind
    /// Scalar offset of the value's first character.
    let offset: Int

    var typeName: String {
        switch kind {
        case .null: return "null"
        case .bool: return "a boolean"
        case .number: return "a number"
        case .string: return "a string"
        case .array: return "an array"
        case .object: return "an object"
        }
    }
}

/// The reader behind `PositionedJSON`. Iterative over whitespace and comments, recursive over
/// nesting, which `maxDepth` bounds before descending.
struct RulesJSONReader {
    let source: SourceText
    let maxDepth: Int
    var i = 0

    init(source: SourceText, maxDepth: Int) {
        self.source = source
        self.maxDepth = maxDepth
    }

    var scalars: [Unicode.Scalar] { source.scalars }

    func fail(_ message: String, at offset: Int? = nil) -> RulesError {
        source.error(.syntax, message, at: offset ?? i)
    }

    mutating func readDocument() throws(RulesError) -> PositionedJSON {
        try skipSpace()
        let value = try readValue(depth: 1)
        try skipSpace()
        guard i >= scalars.count else { throw fail("Unexpected '\(scalars[i])' after the end of the document") }
        return value
    }

    /// Skips whitespace and comments.
    mutating func skipSpace() throws(RulesError) {
        while i < scalars.count {
            let c = scalars[i]
            if c == " " || c == "\t" || c == "\n" || c == "\r" {
                i += 1
            } else if c == "/" && i + 1 < scalars.count && scalars[i + 1] == "/" {
                while i < scalars.count && scalars[i] != "\n" { i += 1 }
            } else if c == "/" && i + 1 < scalars.count && scalars[i + 1] == "*" {
                let start = i
                i += 2
                while true {
                    guard i + 1 < scalars.count else { throw fail("Unterminated /* comment", at: start) }
                    if scalars[i] == "*" && scalars[i + 1] == "/" {
                        i += 2
                        break
                    }
                    i += 1
                }
            } else {
                return
            }
        }
    }

    mutating func readValue(depth: Int) throws(RulesError) -> PositionedJSON {
        guard i < scalars.count else { throw fail("Unexpected end of the document") }
        let start = i
        switch scalars[i] {
        case "{":
            guard depth <= maxDepth else {
                throw source.error(.limit, "Rules nest deeper than \(maxDepth) levels", at: start)
            }
            i += 1
            var members: [PositionedJSON.Member] = []
            var seen: Set<String> = []
            try skipSpace()
            if i < scalars.count && scalars[i] == "}" {
                i += 1
                return PositionedJSON(kind: .object(members), offset: start)
            }
            while true {
                try skipSpace()
                guard i < scalars.count, scalars[i] == "\"" else { throw fail("Expected a quoted key") }
                let keyOffset = i
                let (keyScalars, _) = try readString()
                var key = ""
                key.unicodeScalars.append(contentsOf: keyScalars)
                guard !seen.contains(key) else { throw fail("Duplicate key \"\(key)\"", at: keyOffset) }
                seen.insert(key)
                try skipSpace()
                guard i < scalars.count, scalars[i] == ":" else { throw fail("Expected ':' after a key") }
                i += 1
                try skipSpace()
                let value = try readValue(depth: depth + 1)
                members.append(PositionedJSON.Member(key: key, keyOffset: keyOffset, value: value))
                try skipSpace()
                guard i < scalars.count else { throw fail("Unterminated object", at: start) }
                if scalars[i] == "," {
                    i += 1
                    continue
                }
                if scalars[i] == "}" {
                    i += 1
                    return PositionedJSON(kind: .object(members), offset: start)
                }
                throw fail("Expected ',' or '}' in an object")
            }
        case "[":
            guard depth <= maxDepth else {
                throw source.error(.limit, "Rules nest deeper than \(maxDepth) levels", at: start)
            }
            i += 1
            var items: [PositionedJSON] = []
            try skipSpace()
            if i < scalars.count && scalars[i] == "]" {
                i += 1
                return PositionedJSON(kind: .array(items), offset: start)
            }
            while true {
                try skipSpace()
                items.append(try readValue(depth: depth + 1))
                try skipSpace()
                guard i < scalars.count else { throw fail("Unterminated array", at: start) }
                if scalars[i] == "," {
                    i += 1
                    continue
                }
                if scalars[i] == "]" {
                    i += 1
                    return PositionedJSON(kind: .array(items), offset: start)
                }
                throw fail("Expected ',' or ']' in an array")
            }
        case "\"":
            let (text, offsets) = try readString()
            return PositionedJSON(kind: .string(text, offsets: offsets), offset: start)
        case "t":
            try word("true")
            return PositionedJSON(kind: .bool(true), offset: start)
        case "f":
            try word("false")
            return PositionedJSON(kind: .bool(false), offset: start)
        case "n":
            try word("null")
            return PositionedJSON(kind: .null, offset: start)
        case "-", "0"..."9":
            var text = ""
            while i < scalars.count, "0123456789+-.eE".unicodeScalars.contains(scalars[i]) {
                text.unicodeScalars.append(scalars[i])
                i += 1
            }
            guard let number = Double(text), number.isFinite else { throw fail("Invalid number \(text)", at: start) }
            return PositionedJSON(kind: .number(number), offset: start)
        default:
            throw fail("Unexpected '\(scalars[i])'")
        }
    }

    mutating func word(_ w: String) throws(RulesError) {
        let start = i
        for expected in w.unicodeScalars {
            guard i < scalars.count, scalars[i] == expected else { throw fail("Invalid literal (expected \(w))", at: start) }
            i += 1
        }
    }

    /// Reads a string starting at the opening quote: its scalars and their document offsets.
    mutating func readString() throws(RulesError) -> ([Unicode.Scalar], [Int]) {
        let start = i
        i += 1
        var out: [Unicode.Scalar] = []
        var offsets: [Int] = []
        while true {
            guard i < scalars.count else { throw fail("Unterminated string", at: start) }
            let c = scalars[i]
            let here = i
            if c == "\"" {
                i += 1
                return (out, offsets)
            }
            if c.value < 0x20 { throw fail("Control character in a string") }
            if c != "\\" {
                out.append(c)
                offsets.append(here)
                i += 1
                continue
            }
            i += 1
            guard i < scalars.count else { throw fail("Unterminated string", at: start) }
            let e = scalars[i]
            i += 1
            let decoded: Unicode.Scalar
            switch e {
            case "\"": decoded = "\""
            case "\\": decoded = "\\"
            case "/": decoded = "/"
            case "b": decoded = "\u{08}"
            case "f": decoded = "\u{0C}"
            case "n": decoded = "\n"
            case "r": decoded = "\r"
            case "t": decoded = "\t"
            case "u":
                var value = try hex4()
                if (0xD800..<0xDC00).contains(value) {
                    guard i + 1 < scalars.count, scalars[i] == "\\", scalars[i + 1] == "u" else {
                        throw fail("Unpaired surrogate in a string", at: here)
                    }
                    i += 2
                    let low = try hex4()
                    guard (0xDC00..<0xE000).contains(low) else { throw fail("Unpaired surrogate in a string", at: here) }
                    value = 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00)
                }
                guard let scalar = Unicode.Scalar(value) else { throw fail("Invalid \\u escape", at: here) }
                decoded = scalar
            default:
                throw fail("Invalid escape \\\(e)", at: here)
            }
            out.append(decoded)
            offsets.append(here)
        }
    }

    mutating func hex4() throws(RulesError) -> UInt32 {
        var value: UInt32 = 0
        for _ in 0..<4 {
            guard i < scalars.count, let digit = hexDigit(scalars[i]) else { throw fail("Invalid \\u escape") }
            value = value * 16 + digit
            i += 1
        }
        return value
    }
}

func hexDigit(_ c: Unicode.Scalar) -> UInt32? {
    switch c {
    case "0"..."9": return c.value - 48
    case "a"..."f": return c.value - 87
    case "A"..."F": return c.value - 55
    default: return nil
    }
}
