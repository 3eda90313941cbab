/// The syntax tree of one rule expression, with the document offset of every node.
public struct Expression: Sendable {
    public enum Variable: String, Sendable, CaseIterable {
        case auth, data, newData, root, query
        case currentTime = "now"
    }

    public enum UnaryOperator: String, Sendable {
        case not = "!"
        case negate = "-"
    }

    public enum BinaryOperator: String, Sendable {
        case multiply = "*", divide = "/", remainder = "%"
        case add = "+", subtract = "-"
        case less = "<", lessOrEqual = "<=", greater = ">", greaterOrEqual = ">="
        case equal = "==", notEqual = "!=", strictEqual = "===", strictNotEqual = "!=="
        case and = "&&", or = "||"
    }

    indirect enum Kind: Sendable {
        case null
        case bool(Bool)
        case number(Double)
        case string(String)
        case regex(RulesRegex)
        case array([Expression])
        case variable(Variable)
        /// A `$name` captured by an enclosing wildcard location.
        case capture(String)
        case member(Expression, String)
        case index(Expression, Expression)
        case call(Expression, String, [Expression])
        case unary(UnaryOperator, Expression)
        case binary(BinaryOperator, Expression, Expression)
        case conditional(Expression, Expression, Expression)
    }

    let kind: Kind
    /// Scalar offset in the rules document.
    let offset: Int

    /// Whether the expression names `data` or `root` anywhere (the tree before a write).
    var readsCurrentData: Bool {
        switch kind {
        case .variable(let v): return v == .data || v == .root
        case .null, .bool, .number, .string, .regex, .capture: return false
        case .array(let items): return items.contains { $0.readsCurrentData }
        case .member(let base, _), .unary(_, let base): return base.readsCurrentData
        case .index(let base, let index), .binary(_, let base, let index): return base.readsCurrentData || index.readsCurrentData
        case .call(let base, _, let arguments): return base.readsCurrentData || arguments.contains { $0.readsCurrentData }
        case .conditional(let a, let b, let c): return a.readsCurrentData || b.readsCurrentData || c.readsCurrentData
        }
    }
}

/// A token of the expression language.
struct Token: Sendable {
    enum Kind: Sendable, Equatable {
        case identifier(String)
        case number(Double)
        case string(String)
        case regex(pattern: [Unicode.Scalar], flags: String)
        case symbol(String)
        case end
    }

    let kind: Kind
    /// Index into the expression's scalars.
    let index: Int
}

/// Splits an expression into tokens. A `/` starts a regular expression literal where an operand
/// is expected (after an operator, `(`, `,`, `[`, `?`, `:` or at the start) and is division
/// elsewhere, the usual rule for JavaScript-like languages.
struct Lexer {
    let text: [Unicode.Scalar]
    var i = 0
    var tokens: [Token] = []

    /// Longest first, so `===` wins over `==` and `=`.
    static let symbols = ["===", "!==", "==", "!=", "<=", ">=", "&&", "||", "!", "-", "*", "/", "%", "+", "<", ">", "?", ":", ".", ",", "(", ")", "[", "]"]

    init(_ text: [Unicode.Scalar]) { self.text = text }

    /// Either the tokens, or the message and scalar index of the first lexical error.
    static func tokenize(_ text: [Unicode.Scalar]) -> Result<[Token], LexError> {
        var lexer = Lexer(text)
        do throws(LexError) {
            try lexer.run()
            return .success(lexer.tokens)
        } catch {
            return .failure(error)
        }
    }

    struct LexError: Error {
        let message: String
        let index: Int
    }

    var operandExpected: Bool {
        guard let last = tokens.last else { return true }
        switch last.kind {
        case .identifier, .number, .string, .regex: return false
        case .symbol(let s): return s != ")" && s != "]"
        case .end: return false
        }
    }

    mutating func run() throws(LexError) {
        while true {
            while i < text.count, text[i] == " " || text[i] == "\t" || text[i] == "\n" || text[i] == "\r" { i += 1 }
            guard i < text.count else {
                tokens.append(Token(kind: .end, index: text.count))
                return
            }
            let start = i
            let c = text[i]
            if isIdentifierStart(c) {
                var name = ""
                while i < text.count, isIdentifierPart(text[i]) {
                    name.unicodeScalars.append(text[i])
                    i += 1
                }
                tokens.append(Token(kind: .identifier(name), index: start))
            } else if ("0"..."9").contains(c) || (c == "." && i + 1 < text.count && ("0"..."9").contains(text[i + 1])) {
                tokens.append(Token(kind: .number(try number()), index: start))
            } else if c == "\"" || c == "'" {
                tokens.append(Token(kind: .string(try string(quote: c)), index: start))
            } else if c == "/" && operandExpected {
                let (pattern, flags) = try regex()
                tokens.append(Token(kind: .regex(pattern: pattern, flags: flags), index: start))
            } else {
                guard let symbol = Lexer.symbols.first(where: { matches($0) }) else {
                    throw LexError(message: "Unexpected character '\(c)'", index: start)
                }
                i += symbol.unicodeScalars.count
                tokens.append(Token(kind: .symbol(symbol), index: start))
            }
        }
    }

    func matches(_ symbol: String) -> Bool {
        var j = i
        for s in symbol.unicodeScalars {
            guard j < text.count, text[j] == s else { return false }
            j += 1
        }
        return true
    }

    func isIdentifierStart(_ c: Unicode.Scalar) -> Bool {
        ("a"..."z").contains(c) || ("A"..."Z").contains(c) || c == "_" || c == "$"
    }

    func isIdentifierPart(_ c: Unicode.Scalar) -> Bool {
        isIdentifierStart(c) || ("0"..."9").contains(c)
    }

    mutating func number() throws(LexError) -> Double {
        let start = i
        var s = ""
        func digits(_ lexer: inout Lexer, _ s: inout String) {
            while lexer.i < lexer.text.count, ("0"..."9").contains(lexer.text[lexer.i]) {
                s.unicodeScalars.append(lexer.text[lexer.i])
                lexer.i += 1
            }
        }
        digits(&self, &s)
        if i < text.count, text[i] == "." {
            s.append(".")
            i += 1
            digits(&self, &s)
        }
        if i < text.count, text[i] == "e" || text[i] == "E" {
            s.append("e")
            i += 1
            if i < text.count, text[i] == "+" || text[i] == "-" {
                s.unicodeScalars.append(text[i])
                i += 1
            }
            digits(&self, &s)
        }
        if s.hasPrefix(".") { s = "0" + s }
        if s.hasSuffix(".") { s += "0" }
        guard let value = Double(s), value.isFinite else { throw LexError(message: "Invalid number", index: start) }
        if i < text.count, isIdentifierPart(text[i]) { throw LexError(message: "Invalid number", index: start) }
        return value
    }

    mutating func string(quote: Unicode.Scalar) throws(LexError) -> String {
        let start = i
        i += 1
        var out = ""
        while true {
            guard i < text.count else { throw LexError(message: "Unterminated string literal", index: start) }
            let c = text[i]
            i += 1
            if c == quote { return out }
            if c != "\\" {
                out.unicodeScalars.append(c)
                continue
            }
            guard i < text.count else { throw LexError(message: "Unterminated string literal", index: start) }
            let e = text[i]
            i += 1
            switch e {
            case "n": out.append("\n")
            case "t": out.append("\t")
            case "r": out.append("\r")
            case "b": out.unicodeScalars.append("\u{08}")
            case "f": out.unicodeScalars.append("\u{0C}")
            case "0": out.unicodeScalars.append("\u{00}")
            case "u":
                var value: UInt32 = 0
                for _ in 0..<4 {
                    guard i < text.count, let d = hexDigit(text[i]) else { throw LexError(message: "Invalid \\u escape", index: i) }
                    value = value * 16 + d
                    i += 1
                }
                guard let scalar = Unicode.Scalar(value) else { throw LexError(message: "Invalid \\u escape", index: i - 6) }
                out.unicodeScalars.append(scalar)
            default:
                // \\, \', \", \/ and any other escaped character stand for themselves.
                out.unicodeScalars.append(e)
            }
        }
    }

    /// A `/pattern/flags` literal; the pattern keeps its escapes for the regex compiler, except
    /// `\/`, which only protects the delimiter.
    mutating func regex() throws(LexError) -> ([Unicode.Scalar], String) {
        let start = i
        i += 1
        var pattern: [Unicode.Scalar] = []
        var inClass = false
        while true {
            guard i < text.count else { throw LexError(message: "Unterminated regular expression", index: start) }
            let c = text[i]
            i += 1
            if c == "\\" {
                guard i < text.count else { throw LexError(message: "Unterminated regular expression", index: start) }
                if text[i] == "/" {
                    pattern.append("/")
                } else {
                    pattern.append(c)
                    pattern.append(text[i])
                }
                i += 1
                continue
            }
            if c == "[" { inClass = true }
            if c == "]" { inClass = false }
            if c == "/" && !inClass { break }
            pattern.append(c)
        }
        var flags = ""
        while i < text.count, isIdentifierPart(text[i]) {
            flags.unicodeScalars.append(text[i])
            i += 1
        }
        return (pattern, flags)
    }
}
