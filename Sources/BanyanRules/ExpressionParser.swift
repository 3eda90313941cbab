/// A precedence-climbing parser for rule expressions (JavaScript precedence, lowest first):
/// `?:`, `||`, `&&`, equality, relational, additive, multiplicative, unary `!`/`-`, then postfix
/// member access, indexing and method calls. Nesting is bounded by `maxDepth`, checked before
/// every descent, so no input can exhaust the stack.
struct ExpressionParser {
    let tokens: [Token]
    /// Document offset of each expression scalar (and one past the end).
    let offsets: [Int]
    let source: SourceText
    let limits: RulesLimits
    var position = 0
    var depth = 0

    /// Parses `text` (an expression string of the document whose scalar `k` sits at document offset
    /// `offsets[k]`; `endOffset` is where the string's closing quote is).
    static func parse(
        _ text: [Unicode.Scalar], offsets: [Int], endOffset: Int, source: SourceText, limits: RulesLimits
    ) throws(RulesError) -> Expression {
        let allOffsets = offsets + [endOffset]
        guard text.count <= limits.maxExpressionLength else {
            throw source.error(.limit, "Expression longer than \(limits.maxExpressionLength) characters", at: allOffsets[0])
        }
        let tokens: [Token]
        switch Lexer.tokenize(text) {
        case .success(let t): tokens = t
        case .failure(let e): throw source.error(.expression, e.message, at: allOffsets[min(e.index, text.count)])
        }
        var parser = ExpressionParser(tokens: tokens, offsets: allOffsets, source: source, limits: limits)
        if case .end = parser.current.kind { throw parser.fail("Empty expression") }
        let expression = try parser.parseConditional()
        guard case .end = parser.current.kind else { throw parser.fail("Unexpected \(parser.describe(parser.current))") }
        return expression
    }

    var current: Token { tokens[min(position, tokens.count - 1)] }

    func offset(of token: Token) -> Int { offsets[min(token.index, offsets.count - 1)] }

    func fail(_ message: String, at token: Token? = nil) -> RulesError {
        source.error(.expression, message, at: offset(of: token ?? current))
    }

    func describe(_ token: Token) -> String {
        switch token.kind {
        case .identifier(let s): return "'\(s)'"
        case .number: return "number"
        case .string: return "string"
        case .regex: return "regular expression"
        case .symbol(let s): return "'\(s)'"
        case .end: return "end of expression"
        }
    }

    func isSymbol(_ s: String) -> Bool {
        if case .symbol(let x) = current.kind { return x == s }
        return false
    }

    mutating func expect(_ s: String) throws(RulesError) {
        guard isSymbol(s) else { throw fail("Expected '\(s)' but found \(describe(current))") }
        position += 1
    }

    mutating func enter() throws(RulesError) {
        depth += 1
        guard depth <= limits.maxExpressionDepth else {
            throw source.error(.limit, "Expression nests deeper than \(limits.maxExpressionDepth) levels", at: offset(of: current))
        }
    }

    mutating func parseConditional() throws(RulesError) -> Expression {
        try enter()
        defer { depth -= 1 }
        let condition = try parseBinary(level: 0)
        guard isSymbol("?") else { return condition }
        position += 1
        let whenTrue = try parseConditional()
        try expect(":")
        let whenFalse = try parseConditional()
        return Expression(kind: .conditional(condition, whenTrue, whenFalse), offset: condition.offset)
    }

    static let levels: [[Expression.BinaryOperator]] = [
        [.or], [.and], [.equal, .notEqual, .strictEqual, .strictNotEqual], [.less, .lessOrEqual, .greater, .greaterOrEqual],
        [.add, .subtract], [.multiply, .divide, .remainder],
    ]

    mutating func parseBinary(level: Int) throws(RulesError) -> Expression {
        // The precedence levels are a fixed number of frames, so they don't count towards the
        // depth limit; each operator of a chain does (`a && b && c` nests to the left, and the
        // checker and evaluator recurse through it).
        guard level < ExpressionParser.levels.count else { return try parseUnary() }
        var left = try parseBinary(level: level + 1)
        var entered = 0
        defer { depth -= entered }
        while case .symbol(let s) = current.kind, let op = Expression.BinaryOperator(rawValue: s), ExpressionParser.levels[level].contains(op) {
            let opToken = current
            position += 1
            entered += 1
            try enter()
            let right = try parseBinary(level: level + 1)
            left = Expression(kind: .binary(op, left, right), offset: offset(of: opToken))
        }
        return left
    }

    mutating func parseUnary() throws(RulesError) -> Expression {
        if case .symbol(let s) = current.kind, let op = Expression.UnaryOperator(rawValue: s) {
            let opToken = current
            position += 1
            try enter()
            defer { depth -= 1 }
            let operand = try parseUnary()
            return Expression(kind: .unary(op, operand), offset: offset(of: opToken))
        }
        return try parsePostfix()
    }

    mutating func parsePostfix() throws(RulesError) -> Expression {
        var expression = try parsePrimary()
        var entered = 0
        defer { depth -= entered }
        while true {
            if isSymbol(".") {
                position += 1
                guard case .identifier(let name) = current.kind, !name.hasPrefix("$") else {
                    throw fail("Expected a property or method name after '.'")
                }
                let nameToken = current
                position += 1
                if isSymbol("(") {
                    position += 1
                    var arguments: [Expression] = []
                    if !isSymbol(")") {
                        while true {
                            arguments.append(try parseConditional())
                            if isSymbol(",") {
                                position += 1
                                continue
                            }
                            break
                        }
                    }
                    try expect(")")
                    expression = Expression(kind: .call(expression, name, arguments), offset: offset(of: nameToken))
                } else {
                    expression = Expression(kind: .member(expression, name), offset: offset(of: nameToken))
                }
            } else if isSymbol("[") {
                let open = current
                position += 1
                let index = try parseConditional()
                try expect("]")
                expression = Expression(kind: .index(expression, index), offset: offset(of: open))
            } else if isSymbol("(") {
                throw fail("Only methods can be called")
            } else {
                return expression
            }
            entered += 1
            try enter()
        }
    }

    mutating func parsePrimary() throws(RulesError) -> Expression {
        let token = current
        let at = offset(of: token)
        switch token.kind {
        case .number(let n):
            position += 1
            return Expression(kind: .number(n), offset: at)
        case .string(let s):
            position += 1
            return Expression(kind: .string(s), offset: at)
        case .regex(let pattern, let flags):
            position += 1
            var caseInsensitive = false
            for flag in flags.unicodeScalars {
                guard flag == "i", !caseInsensitive else { throw source.error(.regex, "Unsupported regular expression flag '\(flag)'", at: at) }
                caseInsensitive = true
            }
            switch RulesRegex.compile(pattern, caseInsensitive: caseInsensitive, maxInstructions: limits.maxRegexInstructions) {
            case .success(let regex): return Expression(kind: .regex(regex), offset: at)
            case .failure(let e):
                let code: RulesError.Code = e.isLimit ? .limit : .regex
                // Point inside the literal: the pattern starts one scalar after the opening '/'.
                throw source.error(code, e.message, at: offsets[min(token.index + 1 + e.index, offsets.count - 1)])
            }
        case .identifier(let name):
            position += 1
            switch name {
            case "true": return Expression(kind: .bool(true), offset: at)
            case "false": return Expression(kind: .bool(false), offset: at)
            case "null": return Expression(kind: .null, offset: at)
            default:
                if name.hasPrefix("$") { return Expression(kind: .capture(name), offset: at) }
                guard let variable = Expression.Variable(rawValue: name) else {
                    throw source.error(.type, "Unknown variable '\(name)'", at: at)
                }
                return Expression(kind: .variable(variable), offset: at)
            }
        case .symbol("("):
            position += 1
            let inner = try parseConditional()
            try expect(")")
            return inner
        case .symbol("["):
            position += 1
            var items: [Expression] = []
            if !isSymbol("]") {
                while true {
                    items.append(try parseConditional())
                    if isSymbol(",") {
                        position += 1
                        continue
                    }
                    break
                }
            }
            try expect("]")
            return Expression(kind: .array(items), offset: at)
        default:
            throw fail("Unexpected \(describe(token))")
        }
    }
}
