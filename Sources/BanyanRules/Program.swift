import BanyanTree

/// The rules compiled for judging: made once when the rules are parsed (`Rules.init`), kept with
/// them, and read by every decision.
///
/// Rule locations become a flat array of nodes, addressed by index: no `RuleNode` is copied while
/// a decision walks. Named children are found by `ChildKey` (keys made once, here), the wildcard
/// child separately. A `$capture` becomes the depth of its wildcard: the captured key is the key of
/// the judged location at that depth, so a decision binds no names. Expressions become a flat array of operations
/// with plain integer operands; method names are resolved to `Method`, and a string literal given
/// to `child()`, `hasChild()` or `hasChildren()` is parsed into a path once.
///
/// Invariant: compiling is a pure function of the parsed rules, so every node compiles the same
/// program from the same text, and a decision reads the program without changing it.
final class Program: Sendable {
    /// Rule locations; index 0 is the root.
    let nodes: [ProgramNode]
    /// Every rule's entry operation (`ProgramNode.read` and the others index these).
    let rules: [ProgramRule]
    /// Every rule's name, for decisions and traces (same index as `rules`).
    let references: [RuleReference]
    /// Named children of all nodes: a node's are `namedKeys[namedStart..<namedEnd]`, in Firebase
    /// key order, with their nodes at the same indexes of `namedNodes`.
    let namedKeys: [ChildKey]
    let namedNodes: [Int32]
    /// The same by key, for nodes with many named children (`ProgramNode.namedIndex`).
    let namedIndexes: [[ChildKey: Int32]]
    /// The operations of every expression.
    let ops: [Operation]
    /// Operand pools, indexed by operation fields.
    let strings: [String]
    let regexes: [RulesRegex]
    /// Argument lists: an operation's arguments are `arguments[d..<d + e]`.
    let arguments: [Int32]
    /// Child paths parsed from string literals, by `Operation.path`.
    let literalPaths: [Path]

    init(_ builder: ProgramBuilder) {
        nodes = builder.nodes
        rules = builder.rules
        references = builder.references
        namedKeys = builder.namedKeys
        namedNodes = builder.namedNodes
        namedIndexes = builder.namedIndexes
        ops = builder.ops
        strings = builder.strings
        regexes = builder.regexes
        arguments = builder.arguments
        literalPaths = builder.literalPaths
    }

    /// Compiles the parsed rules.
    static func compile(_ root: RuleNode) -> Program {
        var builder = ProgramBuilder()
        _ = builder.add(root)
        return Program(builder)
    }

    /// The named child `key` of `node`, if it has one.
    @inline(__always)
    func named(_ node: ProgramNode, _ key: ChildKey) -> Int? {
        if node.namedIndex >= 0 { return namedIndexes[Int(node.namedIndex)][key].map { Int($0) } }
        var i = Int(node.namedStart)
        while i < Int(node.namedEnd) {
            if namedKeys[i] == key { return Int(namedNodes[i]) }
            i += 1
        }
        return nil
    }

    /// The node for the child location `key` of `node`: a named child first, else the wildcard.
    @inline(__always)
    func child(of node: Int, _ key: ChildKey) -> Int? {
        let here = nodes[node]
        if let named = named(here, key) { return named }
        if here.wildcard >= 0 { return Int(here.wildcard) }
        return nil
    }
}

/// How a rule starts: an operation index, or one of the constants.
struct ProgramRule: Sendable {
    static let alwaysFalse: Int32 = -1
    static let alwaysTrue: Int32 = -2
    let entry: Int32
}

/// One rule location; every field is an index (-1: none).
struct ProgramNode: Sendable {
    var read: Int32 = -1
    var write: Int32 = -1
    var validate: Int32 = -1
    var namedStart: Int32 = 0
    var namedEnd: Int32 = 0
    /// Into `Program.namedIndexes`, for nodes with more than a few named children.
    var namedIndex: Int32 = -1
    var wildcard: Int32 = -1
}

/// One operation of an expression. Fields are indexes (of operations or operand pools) whose
/// meaning depends on the code; -1 stands for none.
struct Operation: Sendable {
    enum Code: UInt8, Sendable {
        case null, bool, number, string, regex, array
        case auth, data, newData, root, query, currentTime
        /// `$name`: `a` the depth of its wildcard (the index of the captured key in the judged
        /// location), `b` the name (in `strings`).
        case capture
        /// `base.name`: `a` the base, `b` the name.
        case member
        /// `base[index]`: `a`, `b`.
        case index
        /// `base.name(arguments)`: `a` the base, `b` the name, `d`/`e` the arguments.
        case call
        /// `a` the operand.
        case unary
        /// `a`, `b` the operands.
        case binary
        /// `a ? b : c`.
        case conditional
    }

    var code: Code
    var a: Int32 = -1
    var b: Int32 = -1
    var c: Int32 = -1
    var d: Int32 = 0
    var e: Int32 = 0
    /// For `number`, the value; for `bool`, 0 or 1.
    var number: Double = 0
    /// For `string` literals, the parsed child path (in `literalPaths`), -1 when not a path.
    var path: Int32 = -1
    var method: Method = .unknown
    var unary: Expression.UnaryOperator = .not
    var binary: Expression.BinaryOperator = .and
}

/// Methods, resolved from their names when compiling.
enum Method: Sendable {
    case val, exists, isNumber, isString, isBoolean, getPriority, parent, child, hasChild, hasChildren
    case contains, beginsWith, endsWith, replace, toLowerCase, toUpperCase, matches
    case unknown

    init(name: String) {
        switch name {
        case "val": self = .val
        case "exists": self = .exists
        case "isNumber": self = .isNumber
        case "isString": self = .isString
        case "isBoolean": self = .isBoolean
        case "getPriority": self = .getPriority
        case "parent": self = .parent
        case "child": self = .child
        case "hasChild": self = .hasChild
        case "hasChildren": self = .hasChildren
        case "contains": self = .contains
        case "beginsWith": self = .beginsWith
        case "endsWith": self = .endsWith
        case "replace": self = .replace
        case "toLowerCase": self = .toLowerCase
        case "toUpperCase": self = .toUpperCase
        case "matches": self = .matches
        default: self = .unknown
        }
    }

    /// Snapshot methods that read only the node (not its path, except for its depth).
    var readsNodeOnly: Bool {
        switch self {
        case .val, .exists, .isNumber, .isString, .isBoolean, .getPriority, .hasChild, .hasChildren: return true
        default: return false
        }
    }
}

/// Collects the nodes and operations while compiling.
struct ProgramBuilder {
    var nodes: [ProgramNode] = []
    var rules: [ProgramRule] = []
    var references: [RuleReference] = []
    var namedKeys: [ChildKey] = []
    var namedNodes: [Int32] = []
    var namedIndexes: [[ChildKey: Int32]] = []
    var ops: [Operation] = []
    var strings: [String] = []
    var regexes: [RulesRegex] = []
    var arguments: [Int32] = []
    var literalPaths: [Path] = []
    /// The wildcards above the location being compiled, from the root: index = depth.
    var wildcards: [String?] = []

    /// Adds `node` and its descendants (depth first); returns its index.
    mutating func add(_ node: RuleNode) -> Int32 {
        let index = nodes.count
        nodes.append(ProgramNode())
        var compiled = ProgramNode()
        compiled.read = node.read.map { rule($0) } ?? -1
        compiled.write = node.write.map { rule($0) } ?? -1
        compiled.validate = node.validate.map { rule($0) } ?? -1
        var children: [(ChildKey, Int32)] = []
        for key in node.namedOrder {
            guard let child = node.named[key] else { continue }
            wildcards.append(nil)
            children.append((ChildKey(unchecked: key), add(child)))
            wildcards.removeLast()
        }
        // A node's named children sit together in the pools, after its descendants' ones.
        compiled.namedStart = Int32(namedKeys.count)
        for (key, child) in children {
            namedKeys.append(key)
            namedNodes.append(child)
        }
        compiled.namedEnd = Int32(namedKeys.count)
        if children.count > 8 {
            namedIndexes.append(Dictionary(children, uniquingKeysWith: { first, _ in first }))
            compiled.namedIndex = Int32(namedIndexes.count - 1)
        }
        if let name = node.wildcardName, let child = node.wildcardNode.first {
            wildcards.append(name)
            compiled.wildcard = add(child)
            wildcards.removeLast()
        }
        nodes[index] = compiled
        return Int32(index)
    }

    /// Adds a rule; returns its index.
    mutating func rule(_ rule: Rule) -> Int32 {
        switch rule.body {
        case .constant(let b): rules.append(ProgramRule(entry: b ? ProgramRule.alwaysTrue : ProgramRule.alwaysFalse))
        case .expression(let e): rules.append(ProgramRule(entry: expression(e)))
        }
        references.append(rule.reference)
        return Int32(rules.count - 1)
    }

    mutating func string(_ s: String) -> Int32 {
        strings.append(s)
        return Int32(strings.count - 1)
    }

    /// Compiles `e`; returns the index of its operation.
    mutating func expression(_ e: Expression) -> Int32 {
        var op: Operation
        switch e.kind {
        case .null: op = Operation(code: .null)
        case .bool(let b): op = Operation(code: .bool, number: b ? 1 : 0)
        case .number(let n): op = Operation(code: .number, number: n)
        case .string(let t):
            op = Operation(code: .string, a: string(t))
            // The usual child-path argument, parsed once (as `Evaluator.childPath` would at run time).
            if case .success(let path) = Judge.childPath(t) {
                literalPaths.append(path)
                op.path = Int32(literalPaths.count - 1)
            }
        case .regex(let r):
            regexes.append(r)
            op = Operation(code: .regex, a: Int32(regexes.count - 1))
        case .array(let items):
            let compiled = items.map { expression($0) }
            op = Operation(code: .array, d: Int32(arguments.count), e: Int32(compiled.count))
            arguments.append(contentsOf: compiled)
        case .variable(let v):
            switch v {
            case .auth: op = Operation(code: .auth)
            case .data: op = Operation(code: .data)
            case .newData: op = Operation(code: .newData)
            case .root: op = Operation(code: .root)
            case .query: op = Operation(code: .query)
            case .currentTime: op = Operation(code: .currentTime)
            }
        case .capture(let name):
            // The type checker admits only names of enclosing wildcards; -1 (never bound) otherwise.
            let depth = wildcards.firstIndex(of: name).map { Int32($0) } ?? -1
            op = Operation(code: .capture, a: depth, b: string(name))
        case .member(let base, let name):
            let b = expression(base)
            op = Operation(code: .member, a: b, b: string(name))
        case .index(let base, let index):
            let b = expression(base)
            let i = expression(index)
            op = Operation(code: .index, a: b, b: i)
        case .call(let base, let name, let args):
            let b = expression(base)
            var compiled: [Int32] = []
            // A list argument (`hasChildren([...])`) stays an `array` operation: its items are read there.
            for arg in args { compiled.append(expression(arg)) }
            op = Operation(code: .call, a: b, b: string(name), d: Int32(arguments.count), e: Int32(compiled.count), method: Method(name: name))
            arguments.append(contentsOf: compiled)
        case .unary(let o, let operand):
            op = Operation(code: .unary, a: expression(operand), unary: o)
        case .binary(let o, let left, let right):
            let l = expression(left)
            let r = expression(right)
            op = Operation(code: .binary, a: l, b: r, binary: o)
        case .conditional(let c, let t, let f):
            let x = expression(c)
            let y = expression(t)
            let z = expression(f)
            op = Operation(code: .conditional, a: x, b: y, c: z)
        }
        ops.append(op)
        return Int32(ops.count - 1)
    }
}
