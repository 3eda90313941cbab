/// Regular expressions for `matches(/…/)`, without Foundation and without backtracking.
///
/// The pattern compiles to a small instruction program run by a Pike VM (Thompson's simulation of
/// the NFA with one thread per program counter): the work is at most proportional to
/// `input length × program size`, whatever the pattern, so `(a*)*b` against a long run of `a`s
/// costs no more than any other pattern of that size. Matching is a search, as JavaScript's
/// `RegExp.test`: the pattern may match anywhere unless anchored with `^`/`$`.
///
/// Supported: literals and escaped punctuation, `.`, classes `[...]` with ranges and negation,
/// `\d \w \s \D \W \S`, `\n \t \r \f \v \xHH \uHHHH`, anchors `^ $`, groups `( )` and `(?: )`
/// (nothing is captured), alternation `|`, quantifiers `* + ? {n} {n,} {n,m}` (a lazy `?` suffix
/// is accepted and changes nothing, since only the yes/no answer matters), and the flag `i`.
/// Back-references, lookaround and word boundaries are rejected.
public struct RulesRegex: Sendable {
    enum Instruction: Sendable {
        case scalar(Unicode.Scalar)
        case anyButNewline
        case set(CharacterSet)
        /// Try both targets (the first is preferred, which only matters for captures we don't make).
        case split(Int, Int)
        case jump(Int)
        case assertStart
        case assertEnd
        case match
    }

    struct CharacterSet: Sendable {
        enum Item: Sendable {
            case range(UInt32, UInt32)
            case digit(negated: Bool)
            case word(negated: Bool)
            case space(negated: Bool)
        }

        var items: [Item] = []
        var negated = false

        func contains(_ c: Unicode.Scalar) -> Bool {
            var found = false
            for item in items where !found {
                switch item {
                case .range(let lo, let hi): found = c.value >= lo && c.value <= hi
                case .digit(let negated): found = isDigit(c) != negated
                case .word(let negated): found = isWord(c) != negated
                case .space(let negated): found = isSpace(c) != negated
                }
            }
            return found != negated
        }
    }

    struct CompileError: Error {
        let message: String
        /// Index in the pattern.
        let index: Int
        let isLimit: Bool
    }

    let program: [Instruction]
    let caseInsensitive: Bool
    /// The pattern as written, for messages and debugging.
    public let pattern: String

    /// Program size (for tests and cost estimates).
    public var instructionCount: Int { program.count }

    static func compile(_ pattern: [Unicode.Scalar], caseInsensitive: Bool, maxInstructions: Int) -> Result<RulesRegex, CompileError> {
        var parser = RegexParser(pattern: pattern, caseInsensitive: caseInsensitive)
        do throws(CompileError) {
            let node = try parser.parseAlternation()
            if parser.i < pattern.count { throw CompileError(message: "Unmatched ')' in regular expression", index: parser.i, isLimit: false) }
            var compiler = RegexCompiler(maxInstructions: maxInstructions)
            try compiler.emit(node)
            try compiler.append(.match)
            var text = ""
            text.unicodeScalars.append(contentsOf: pattern)
            return .success(RulesRegex(program: compiler.program, caseInsensitive: caseInsensitive, pattern: text))
        } catch {
            return .failure(error)
        }
    }

    /// Compiles `pattern` (the text between the slashes); nil when it does not compile.
    public init?(_ pattern: String, caseInsensitive: Bool = false, maxInstructions: Int = RulesLimits.standardRegexInstructions) {
        guard case .success(let regex) = RulesRegex.compile(Array(pattern.unicodeScalars), caseInsensitive: caseInsensitive, maxInstructions: maxInstructions) else {
            return nil
        }
        self = regex
    }

    private init(program: [Instruction], caseInsensitive: Bool, pattern: String) {
        self.program = program
        self.caseInsensitive = caseInsensitive
        self.pattern = pattern
    }

    /// Whether the pattern matches somewhere in `text`, counting work in `steps`; nil when the
    /// work would exceed `budget` (steps then holds a value above the budget).
    public func firstMatch(in text: String, steps: inout Int, budget: Int) -> Bool? {
        let input = Array(text.unicodeScalars)
        var current = PikeList(size: program.count)
        var next = PikeList(size: program.count)
        var stack: [Int] = []
        var position = 0
        while true {
            // A new thread starts at every position: an unanchored search.
            add(0, at: position, of: input.count, to: &current, stack: &stack, steps: &steps)
            if steps > budget { return nil }
            next.clear()
            for k in 0..<current.count {
                let pc = current.dense[k]
                steps += 1
                switch program[pc] {
                case .match:
                    return true
                case .scalar(let s):
                    if position < input.count, equal(s, input[position]) {
                        _ = add(pc + 1, at: position + 1, of: input.count, to: &next, stack: &stack, steps: &steps)
                    }
                case .anyButNewline:
                    if position < input.count, !isLineTerminator(input[position]) {
                        _ = add(pc + 1, at: position + 1, of: input.count, to: &next, stack: &stack, steps: &steps)
                    }
                case .set(let set):
                    if position < input.count, setContains(set, input[position]) {
                        _ = add(pc + 1, at: position + 1, of: input.count, to: &next, stack: &stack, steps: &steps)
                    }
                case .split, .jump, .assertStart, .assertEnd:
                    break  // resolved when the thread was added
                }
            }
            if steps > budget { return nil }
            guard position < input.count else { return false }
            swap(&current, &next)
            position += 1
        }
    }

    /// Adds the thread at `pc` and everything reachable from it without consuming input.
    @discardableResult
    private func add(_ pc: Int, at position: Int, of length: Int, to list: inout PikeList, stack: inout [Int], steps: inout Int) -> Bool {
        stack.append(pc)
        while let top = stack.popLast() {
            guard list.insert(top) else { continue }
            steps += 1
            switch program[top] {
            case .jump(let target): stack.append(target)
            case .split(let a, let b):
                stack.append(b)
                stack.append(a)
            case .assertStart: if position == 0 { stack.append(top + 1) }
            case .assertEnd: if position == length { stack.append(top + 1) }
            case .scalar, .anyButNewline, .set, .match: break
            }
        }
        return true
    }

    private func equal(_ p: Unicode.Scalar, _ c: Unicode.Scalar) -> Bool {
        if p == c { return true }
        return caseInsensitive && fold(p) == fold(c)
    }

    private func setContains(_ set: CharacterSet, _ c: Unicode.Scalar) -> Bool {
        if set.contains(c) { return true }
        guard caseInsensitive else { return false }
        return set.contains(lower(c)) || set.contains(upper(c))
    }
}

/// A set of program counters with insertion order, cleared in O(1) (the classic sparse set).
struct PikeList {
    var dense: [Int]
    var sparse: [Int]
    var count = 0

    init(size: Int) {
        dense = Array(repeating: 0, count: size)
        sparse = Array(repeating: 0, count: size)
    }

    mutating func clear() { count = 0 }

    /// Inserts `pc`; false when it was already there.
    mutating func insert(_ pc: Int) -> Bool {
        let slot = sparse[pc]
        if slot < count && dense[slot] == pc { return false }
        sparse[pc] = count
        dense[count] = pc
        count += 1
        return true
    }
}

func isDigit(_ c: Unicode.Scalar) -> Bool { c.value >= 48 && c.value <= 57 }

func isWord(_ c: Unicode.Scalar) -> Bool {
    isDigit(c) || (c.value >= 65 && c.value <= 90) || (c.value >= 97 && c.value <= 122) || c == "_"
}

func isSpace(_ c: Unicode.Scalar) -> Bool {
    switch c.value {
    case 0x09...0x0D, 0x20, 0xA0, 0x1680, 0x2000...0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF: return true
    default: return false
    }
}

func isLineTerminator(_ c: Unicode.Scalar) -> Bool {
    c == "\n" || c == "\r" || c.value == 0x2028 || c.value == 0x2029
}

func lower(_ c: Unicode.Scalar) -> Unicode.Scalar {
    if c.value >= 65 && c.value <= 90 { return Unicode.Scalar(c.value + 32) ?? c }
    if c.isASCII { return c }
    let mapped = c.properties.lowercaseMapping.unicodeScalars
    return mapped.count == 1 ? (mapped.first ?? c) : c
}

func upper(_ c: Unicode.Scalar) -> Unicode.Scalar {
    if c.value >= 97 && c.value <= 122 { return Unicode.Scalar(c.value - 32) ?? c }
    if c.isASCII { return c }
    let mapped = c.properties.uppercaseMapping.unicodeScalars
    return mapped.count == 1 ? (mapped.first ?? c) : c
}

func fold(_ c: Unicode.Scalar) -> Unicode.Scalar { lower(c) }

/// The pattern's syntax tree.
indirect enum RegexNode {
    case empty
    case scalar(Unicode.Scalar)
    case anyButNewline
    case set(RulesRegex.CharacterSet)
    case start
    case end
    case concatenation([RegexNode])
    case alternation([RegexNode])
    /// `max == nil` is unbounded.
    case repetition(RegexNode, min: Int, max: Int?)
}

/// Recursive descent over the pattern. Group nesting is bounded by the expression length limit
/// and by `maxGroupDepth`.
struct RegexParser {
    let pattern: [Unicode.Scalar]
    let caseInsensitive: Bool
    var i = 0
    var depth = 0
    static let maxGroupDepth = 64
    /// Repetition counts above this are rejected (they could not fit the program limit anyway).
    static let maxCount = 100_000

    init(pattern: [Unicode.Scalar], caseInsensitive: Bool) {
        self.pattern = pattern
        self.caseInsensitive = caseInsensitive
    }

    func fail(_ message: String, at index: Int? = nil) -> RulesRegex.CompileError {
        RulesRegex.CompileError(message: message, index: min(index ?? i, max(pattern.count - 1, 0)), isLimit: false)
    }

    mutating func parseAlternation() throws(RulesRegex.CompileError) -> RegexNode {
        var branches = [try parseConcatenation()]
        while i < pattern.count, pattern[i] == "|" {
            i += 1
            branches.append(try parseConcatenation())
        }
        return branches.count == 1 ? branches[0] : .alternation(branches)
    }

    mutating func parseConcatenation() throws(RulesRegex.CompileError) -> RegexNode {
        var items: [RegexNode] = []
        while i < pattern.count, pattern[i] != "|", pattern[i] != ")" {
            let atom = try parseAtom()
            items.append(try parseQuantifier(atom))
        }
        if items.isEmpty { return .empty }
        return items.count == 1 ? items[0] : .concatenation(items)
    }

    mutating func parseQuantifier(_ atom: RegexNode) throws(RulesRegex.CompileError) -> RegexNode {
        guard i < pattern.count else { return atom }
        let start = i
        var bounds: (Int, Int?)?
        switch pattern[i] {
        case "*": bounds = (0, nil); i += 1
        case "+": bounds = (1, nil); i += 1
        case "?": bounds = (0, 1); i += 1
        case "{":
            if let parsed = try braces() { bounds = parsed }
        default: break
        }
        guard let (lo, hi) = bounds else { return atom }
        switch atom {
        case .start, .end, .empty: throw fail("Nothing to repeat", at: start)
        default: break
        }
        if i < pattern.count, pattern[i] == "?" { i += 1 }  // lazy: same yes/no answer
        if i < pattern.count, "*+?".unicodeScalars.contains(pattern[i]) { throw fail("Nothing to repeat", at: i) }
        if i < pattern.count, pattern[i] == "{", try lookaheadBraces() { throw fail("Nothing to repeat", at: i) }
        return .repetition(atom, min: lo, max: hi)
    }

    /// Whether a `{` at `i` starts a valid quantifier (without consuming it).
    mutating func lookaheadBraces() throws(RulesRegex.CompileError) -> Bool {
        let save = i
        defer { i = save }
        return try braces() != nil
    }

    /// `{n}`, `{n,}` or `{n,m}` at `i`; nil (nothing consumed) when the brace is a literal.
    mutating func braces() throws(RulesRegex.CompileError) -> (Int, Int?)? {
        let start = i
        i += 1
        guard let lo = number() else {
            i = start
            return nil
        }
        var hi: Int? = lo
        if i < pattern.count, pattern[i] == "," {
            i += 1
            hi = number()
        }
        guard i < pattern.count, pattern[i] == "}" else {
            i = start
            return nil
        }
        i += 1
        if let h = hi, h < lo { throw fail("Numbers out of order in {} quantifier", at: start) }
        if lo > RegexParser.maxCount || (hi ?? 0) > RegexParser.maxCount {
            throw RulesRegex.CompileError(message: "Repetition count above \(RegexParser.maxCount)", index: start, isLimit: true)
        }
        return (lo, hi)
    }

    mutating func number() -> Int? {
        var value = 0
        var any = false
        while i < pattern.count, isDigit(pattern[i]) {
            value = min(value * 10 + Int(pattern[i].value - 48), RegexParser.maxCount + 1)
            any = true
            i += 1
        }
        return any ? value : nil
    }

    mutating func parseAtom() throws(RulesRegex.CompileError) -> RegexNode {
        let c = pattern[i]
        let start = i
        i += 1
        switch c {
        case ".": return .anyButNewline
        case "^": return .start
        case "$": return .end
        case "(":
            depth += 1
            guard depth <= RegexParser.maxGroupDepth else {
                throw RulesRegex.CompileError(message: "Groups nest deeper than \(RegexParser.maxGroupDepth)", index: start, isLimit: true)
            }
            if i < pattern.count, pattern[i] == "?" {
                guard i + 1 < pattern.count, pattern[i + 1] == ":" else { throw fail("Lookaround and named groups are not supported", at: start) }
                i += 2
            }
            let inner = try parseAlternation()
            guard i < pattern.count, pattern[i] == ")" else { throw fail("Unterminated group", at: start) }
            i += 1
            depth -= 1
            return inner
        case ")": throw fail("Unmatched ')'", at: start)
        case "*", "+", "?": throw fail("Nothing to repeat", at: start)
        case "[": return .set(try parseClass(start: start))
        case "\\": return try parseEscape(start: start, inClass: false).node
        default: return .scalar(c)
        }
    }

    /// An escape after the backslash at `start`: a node, and for classes its set item.
    mutating func parseEscape(start: Int, inClass: Bool) throws(RulesRegex.CompileError) -> (node: RegexNode, item: RulesRegex.CharacterSet.Item?) {
        guard i < pattern.count else { throw fail("Trailing backslash", at: start) }
        let e = pattern[i]
        i += 1
        func single(_ item: RulesRegex.CharacterSet.Item) -> (RegexNode, RulesRegex.CharacterSet.Item?) {
            (.set(RulesRegex.CharacterSet(items: [item], negated: false)), item)
        }
        func literal(_ s: Unicode.Scalar) -> (RegexNode, RulesRegex.CharacterSet.Item?) {
            (.scalar(s), .range(s.value, s.value))
        }
        switch e {
        case "d": return single(.digit(negated: false))
        case "D": return single(.digit(negated: true))
        case "w": return single(.word(negated: false))
        case "W": return single(.word(negated: true))
        case "s": return single(.space(negated: false))
        case "S": return single(.space(negated: true))
        case "n": return literal("\n")
        case "t": return literal("\t")
        case "r": return literal("\r")
        case "f": return literal("\u{0C}")
        case "v": return literal("\u{0B}")
        case "0": return literal("\u{00}")
        case "x", "u":
            let width = e == "x" ? 2 : 4
            var value: UInt32 = 0
            for _ in 0..<width {
                guard i < pattern.count, let d = hexDigit(pattern[i]) else { throw fail("Invalid \\\(e) escape", at: start) }
                value = value * 16 + d
                i += 1
            }
            guard let s = Unicode.Scalar(value) else { throw fail("Invalid \\\(e) escape", at: start) }
            return literal(s)
        case "b" where inClass: return literal("\u{08}")
        case "b", "B": throw fail("Word boundaries are not supported", at: start)
        case "1"..."9": throw fail("Back-references are not supported", at: start)
        default:
            if isWord(e) { throw fail("Unknown escape \\\(e)", at: start) }
            return literal(e)
        }
    }

    mutating func parseClass(start: Int) throws(RulesRegex.CompileError) -> RulesRegex.CharacterSet {
        var set = RulesRegex.CharacterSet()
        if i < pattern.count, pattern[i] == "^" {
            set.negated = true
            i += 1
        }
        while true {
            guard i < pattern.count else { throw fail("Unterminated character class", at: start) }
            let c = pattern[i]
            if c == "]" {
                // `[]` matches nothing and `[^]` anything, as in JavaScript.
                i += 1
                return set
            }
            let itemStart = i
            i += 1
            var low: RulesRegex.CharacterSet.Item
            if c == "\\" {
                guard let item = try parseEscape(start: itemStart, inClass: true).item else { throw fail("Invalid escape in class", at: itemStart) }
                low = item
            } else {
                low = .range(c.value, c.value)
            }
            // A range `a-z` (a `-` first, last, or next to a class escape is a literal).
            if case .range(let lo, _) = low, i + 1 < pattern.count, pattern[i] == "-", pattern[i + 1] != "]" {
                i += 1
                let hiStart = i
                let hc = pattern[i]
                i += 1
                var hiValue = hc.value
                if hc == "\\" {
                    guard case .range(let h, _)? = try parseEscape(start: hiStart, inClass: true).item else {
                        throw fail("Invalid range in character class", at: hiStart)
                    }
                    hiValue = h
                }
                guard hiValue >= lo else { throw fail("Range out of order in character class", at: itemStart) }
                low = .range(lo, hiValue)
            }
            set.items.append(low)
        }
    }
}

/// Emits the instruction program, refusing to grow beyond the limit (counted repetitions
/// expand, so `(a{1000}){1000}` is refused here rather than built).
struct RegexCompiler {
    let maxInstructions: Int
    var program: [RulesRegex.Instruction] = []

    mutating func append(_ instruction: RulesRegex.Instruction) throws(RulesRegex.CompileError) {
        guard program.count < maxInstructions else {
            throw RulesRegex.CompileError(message: "Regular expression too large (over \(maxInstructions) instructions)", index: 0, isLimit: true)
        }
        program.append(instruction)
    }

    mutating func emit(_ node: RegexNode) throws(RulesRegex.CompileError) {
        switch node {
        case .empty: break
        case .scalar(let s): try append(.scalar(s))
        case .anyButNewline: try append(.anyButNewline)
        case .set(let set): try append(.set(set))
        case .start: try append(.assertStart)
        case .end: try append(.assertEnd)
        case .concatenation(let items):
            for item in items { try emit(item) }
        case .alternation(let branches):
            // split L1, next; L1: branch; jump end; next: split ... — jumps patched at the end.
            var jumps: [Int] = []
            for (k, branch) in branches.enumerated() {
                if k < branches.count - 1 {
                    let split = program.count
                    try append(.split(split + 1, 0))
                    try emit(branch)
                    jumps.append(program.count)
                    try append(.jump(0))
                    program[split] = .split(split + 1, program.count)
                } else {
                    try emit(branch)
                }
            }
            for j in jumps { program[j] = .jump(program.count) }
        case .repetition(let inner, let lo, let hi):
            for _ in 0..<lo { try emit(inner) }
            if let hi {
                // Optional copies, nested: (x(x(x)?)?)?
                var splits: [Int] = []
                for _ in lo..<hi {
                    splits.append(program.count)
                    try append(.split(program.count + 1, 0))
                    try emit(inner)
                }
                for s in splits { program[s] = .split(s + 1, program.count) }
            } else {
                let loop = program.count
                try append(.split(loop + 1, 0))
                try emit(inner)
                try append(.jump(loop))
                program[loop] = .split(loop + 1, program.count)
            }
        }
    }
}
