/// An error in a rules document, found when the rules are set (never at request time): a syntax
/// error in the JSON or in an expression, a type error, an unknown variable, or a limit exceeded.
///
/// `line` and `column` are 1-based and point into the rules document as the author wrote it
/// (columns count Unicode scalars, so a tab or an emoji is one column).
public struct RulesError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        init(_ name: String) { self.name = name }
        public var description: String { name }

        /// The document is not JSON (comments allowed) or has the wrong shape.
        public static let syntax = Code("syntax")
        /// An expression does not parse.
        public static let expression = Code("expression")
        /// An expression is well formed but ill typed (or names an unknown variable or method).
        public static let type = Code("type")
        /// A regular expression literal does not compile.
        public static let regex = Code("regex")
        /// A document, nesting, expression or pattern limit was exceeded.
        public static let limit = Code("limit")
    }

    public let code: Code
    public let message: String
    public let line: Int
    public let column: Int

    public init(_ code: Code, _ message: String, line: Int, column: Int) {
        self.code = code
        self.message = message
        self.line = line
        self.column = column
    }

    /// `line:column: message`, the form Firebase returns in a `400` body for bad rules.
    public var description: String { "\(line):\(column): \(message)" }
}

/// The bounds that keep parsing and evaluation cheap whatever the input. Every one of them turns
/// into a typed error (or a denial with a typed reason), never a crash.
public struct RulesLimits: Hashable, Sendable {
    /// Largest rules document accepted, in UTF-8 bytes (Firebase's documented limit is 256 KiB).
    public var maxDocumentBytes: Int
    /// Deepest JSON nesting of the document (objects and arrays, the outer `{"rules": …}` included).
    public var maxNestingDepth: Int
    /// Longest expression string, in Unicode scalars.
    public var maxExpressionLength: Int
    /// Deepest expression syntax tree: parentheses, unary operators, call arguments, `?:`
    /// branches, postfix chains and each operator of a binary chain count one level.
    public var maxExpressionDepth: Int
    /// Largest compiled regular expression, in instructions (counted repetitions expand).
    public var maxRegexInstructions: Int
    /// Evaluation steps one decision may take (expression nodes, child lookups, regex thread
    /// steps, validated locations). Exceeding it denies with `Decision.Reason.budgetExceeded`.
    public var evaluationBudget: Int

    public init(
        maxDocumentBytes: Int = RulesLimits.standardDocumentBytes, maxNestingDepth: Int = RulesLimits.standardNestingDepth,
        maxExpressionLength: Int = RulesLimits.standardExpressionLength, maxExpressionDepth: Int = RulesLimits.standardExpressionDepth,
        maxRegexInstructions: Int = RulesLimits.standardRegexInstructions, evaluationBudget: Int = RulesLimits.standardEvaluationBudget
    ) {
        self.maxDocumentBytes = maxDocumentBytes
        self.maxNestingDepth = maxNestingDepth
        self.maxExpressionLength = maxExpressionLength
        self.maxExpressionDepth = maxExpressionDepth
        self.maxRegexInstructions = maxRegexInstructions
        self.evaluationBudget = evaluationBudget
    }

    public static let standardDocumentBytes = 256 * 1024
    /// `Path.maxDepth` (32) locations, plus the `rules` wrapper, the root object and an `.indexOn` array.
    public static let standardNestingDepth = 36
    public static let standardExpressionLength = 4096
    public static let standardExpressionDepth = 128
    public static let standardRegexInstructions = 4096
    public static let standardEvaluationBudget = 1_000_000

    public static let standard = RulesLimits()
}

/// A position in the rules document: a scalar offset, turned into line and column on demand.
struct SourceText: Sendable {
    let scalars: [Unicode.Scalar]

    init(_ text: String) { scalars = Array(text.unicodeScalars) }

    /// 1-based line and column of the scalar at `offset` (the end of the text when beyond it).
    func lineColumn(_ offset: Int) -> (line: Int, column: Int) {
        var line = 1
        var lineStart = 0
        let end = min(max(offset, 0), scalars.count)
        var i = 0
        while i < end {
            if scalars[i] == "\n" {
                line += 1
                lineStart = i + 1
            }
            i += 1
        }
        return (line, end - lineStart + 1)
    }

    func error(_ code: RulesError.Code, _ message: String, at offset: Int) -> RulesError {
        let (line, column) = lineColumn(offset)
        return RulesError(code, message, line: line, column: column)
    }
}
