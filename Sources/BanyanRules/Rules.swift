public import BanyanTree

/// A parsed and type-checked rules document: the tree of locations with their `.read`, `.write`,
/// `.validate` and `.indexOn` entries and at most one `$wildcard` child per location.
///
/// Setting rules is where every error is found: `Rules.parse` either returns rules that can be
/// evaluated against any tree, auth and time, or a `RulesError` with line and column. Evaluation
/// (`Rules+Evaluate.swift`) never fails to decide.
public struct Rules: Sendable {
    /// The parsed document and what is derived from it, behind one reference: the state machine
    /// copies the rules of a namespace for every write it judges.
    final class Storage: Sendable {
        let root: RuleNode
        let limits: RulesLimits
        let text: String
        let writesReadCurrentData: Bool
        let program: Program

        init(root: RuleNode, limits: RulesLimits, text: String) {
            self.root = root
            self.limits = limits
            self.text = text
            self.writesReadCurrentData = Rules.writesReadCurrentData(root)
            self.program = Program.compile(root)
        }
    }

    let storage: Storage

    /// The root location's rules.
    public var root: RuleNode { storage.root }
    /// The bounds the document was parsed under; evaluation uses its budget.
    public var limits: RulesLimits { storage.limits }
    /// The document as it was written, comments included (what `GET /.settings/rules.json` returns).
    public var text: String { storage.text }
    /// Whether some `.write` or `.validate` reads the data as it is before the write (`data` or
    /// `root`). When none does, a write's decision depends only on the tree after it: the state
    /// machine then judges a set on the tree it has changed in place (no copy of the old one).
    public var writesReadCurrentData: Bool { storage.writesReadCurrentData }
    /// The rules compiled for judging (`Program`), once, when they are parsed.
    var program: Program { storage.program }

    init(root: RuleNode, limits: RulesLimits, text: String) {
        storage = Storage(root: root, limits: limits, text: text)
    }

    static func writesReadCurrentData(_ node: RuleNode) -> Bool {
        for rule in [node.write, node.validate] {
            if case .expression(let e)? = rule?.body, e.readsCurrentData { return true }
        }
        return node.named.values.contains { writesReadCurrentData($0) } || node.wildcardNode.contains { writesReadCurrentData($0) }
    }

    /// Parses and checks a rules document (`{"rules": {...}}`, comments allowed).
    public static func parse(_ text: String, limits: RulesLimits = .standard) throws(RulesError) -> Rules {
        guard text.utf8.count <= limits.maxDocumentBytes else {
            throw RulesError(.limit, "Rules document larger than \(limits.maxDocumentBytes) bytes", line: 1, column: 1)
        }
        let source = SourceText(text)
        var reader = RulesJSONReader(source: source, maxDepth: limits.maxNestingDepth)
        let document = try reader.readDocument()
        guard case .object(let members) = document.kind else {
            throw source.error(.syntax, "A rules document is an object with one key, \"rules\"", at: document.offset)
        }
        guard let body = members.first(where: { $0.key == "rules" }) else {
            throw source.error(.syntax, "Missing the \"rules\" key", at: document.offset)
        }
        if let other = members.first(where: { $0.key != "rules" }) {
            throw source.error(.syntax, "Unexpected top-level key \"\(other.key)\" (only \"rules\" is allowed)", at: other.keyOffset)
        }
        let builder = RuleBuilder(source: source, limits: limits)
        let root = try builder.build(body.value, location: [], captures: [])
        return Rules(root: root, limits: limits, text: text)
    }

    /// Rules that allow everything (Banyan's behaviour before rules existed; development only).
    public static let allowAll: Rules = {
        let node = RuleNode(
            read: Rule(kind: .read, location: "/", line: 1, column: 1, body: .constant(true)),
            write: Rule(kind: .write, location: "/", line: 1, column: 1, body: .constant(true))
        )
        return Rules(root: node, limits: .standard, text: "{\"rules\": {\".read\": true, \".write\": true}}")
    }()

    /// Rules that allow nothing: what a stored rules text that no longer parses stands for, so a
    /// namespace never falls open (docs/rules.md).
    public static let denyAll: Rules = {
        let node = RuleNode(
            read: Rule(kind: .read, location: "/", line: 1, column: 1, body: .constant(false)),
            write: Rule(kind: .write, location: "/", line: 1, column: 1, body: .constant(false))
        )
        return Rules(root: node, limits: .standard, text: "{\"rules\": {\".read\": false, \".write\": false}}")
    }()
}

/// Names one rule for people: its location pattern and kind, as `/users/$uid/.write`.
public struct RuleReference: Hashable, Sendable, CustomStringConvertible {
    /// The location pattern, `/` for the root, wildcards as written (`/users/$uid`).
    public let location: String
    public let kind: RuleKind

    public init(location: String, kind: RuleKind) {
        self.location = location
        self.kind = kind
    }

    public var description: String { location == "/" ? "/" + kind.rawValue : location + "/" + kind.rawValue }
}

/// One `.read`, `.write` or `.validate` entry.
public struct Rule: Sendable {
    enum Body: Sendable {
        case constant(Bool)
        case expression(Expression)
    }

    public let kind: RuleKind
    /// The location pattern (`/users/$uid`).
    public let location: String
    /// Where the rule's value starts in the document.
    public let line: Int
    public let column: Int
    let body: Body

    public var reference: RuleReference { RuleReference(location: location, kind: kind) }
}

/// The rules at one location.
public struct RuleNode: Sendable {
    public internal(set) var read: Rule?
    public internal(set) var write: Rule?
    public internal(set) var validate: Rule?
    /// The `.indexOn` entries (child paths, or `.value`), in document order.
    public internal(set) var indexOn: [String] = []
    /// Named children, by key.
    var named: [String: RuleNode] = [:]
    /// Named children's keys in Firebase key order, for deterministic walks.
    var namedOrder: [String] = []
    /// The `$name` of the wildcard child, if any.
    public internal(set) var wildcardName: String?
    /// The wildcard child (zero or one element; an array gives the recursion its indirection).
    var wildcardNode: [RuleNode] = []

    init(read: Rule? = nil, write: Rule? = nil) {
        self.read = read
        self.write = write
    }

    /// The rules for the child location `key`: a named child if there is one, else the wildcard
    /// (named children take precedence, so `"$other": {".validate": false}` rejects only the
    /// keys not named beside it). The second value is the capture to bind, if any.
    func child(_ key: String) -> (node: RuleNode, capture: String?)? {
        if let node = named[key] { return (node, nil) }
        if let name = wildcardName, let node = wildcardNode.first { return (node, name) }
        return nil
    }

    /// The named child's rules (nil when not named here).
    public func namedChild(_ key: String) -> RuleNode? { named[key] }

    public var namedChildren: [String] { namedOrder }

    public var wildcardChild: RuleNode? { wildcardNode.first }
}

/// Turns the document's JSON into rule nodes, parsing and type-checking every expression.
struct RuleBuilder {
    let source: SourceText
    let limits: RulesLimits

    func locationText(_ location: [String]) -> String {
        location.isEmpty ? "/" : "/" + location.joined(separator: "/")
    }

    func build(_ value: PositionedJSON, location: [String], captures: [String]) throws(RulesError) -> RuleNode {
        guard case .object(let members) = value.kind else {
            throw source.error(.syntax, "The rules at \(locationText(location)) must be an object, not \(value.typeName)", at: value.offset)
        }
        var node = RuleNode()
        var wildcardOffset: Int?
        for member in members {
            let key = member.key
            if key.hasPrefix(".") {
                switch key {
                case ".read", ".write", ".validate":
                    let kind = RuleKind(rawValue: key) ?? .read
                    let rule = try rule(kind, member.value, location: location, captures: captures)
                    switch kind {
                    case .read: node.read = rule
                    case .write: node.write = rule
                    case .validate: node.validate = rule
                    }
                case ".indexOn":
                    node.indexOn = try indexOn(member.value)
                default:
                    throw source.error(.syntax, "Unknown rule key \"\(key)\" (expected .read, .write, .validate, .indexOn or a child)", at: member.keyOffset)
                }
            } else if key.hasPrefix("$") {
                let name = key
                let body = name.unicodeScalars.dropFirst()
                guard !body.isEmpty, body.allSatisfy({ isWord($0) }) else {
                    throw source.error(.syntax, "Invalid wildcard name \"\(name)\" (letters, digits and _ after the $)", at: member.keyOffset)
                }
                if let earlier = wildcardOffset {
                    let (line, column) = source.lineColumn(earlier)
                    throw source.error(
                        .syntax, "A location may have only one wildcard child; \(node.wildcardName ?? "") is at \(line):\(column)", at: member.keyOffset
                    )
                }
                guard !captures.contains(name) else {
                    throw source.error(.syntax, "Wildcard \(name) is already used by an enclosing location", at: member.keyOffset)
                }
                wildcardOffset = member.keyOffset
                node.wildcardName = name
                node.wildcardNode = [try build(member.value, location: location + [name], captures: captures + [name])]
            } else {
                if let problem = BanyanRulesKeys.problem(with: key) {
                    throw source.error(.syntax, "Invalid key \"\(key)\": \(problem)", at: member.keyOffset)
                }
                node.named[key] = try build(member.value, location: location + [key], captures: captures)
            }
        }
        node.namedOrder = BanyanRulesKeys.sorted(Array(node.named.keys))
        return node
    }

    func rule(_ kind: RuleKind, _ value: PositionedJSON, location: [String], captures: [String]) throws(RulesError) -> Rule {
        let (line, column) = source.lineColumn(value.offset)
        let where_ = locationText(location)
        switch value.kind {
        case .bool(let b):
            return Rule(kind: kind, location: where_, line: line, column: column, body: .constant(b))
        case .string(let text, let offsets):
            let expression = try ExpressionParser.parse(
                text, offsets: offsets, endOffset: (offsets.last ?? value.offset) + 1, source: source, limits: limits
            )
            try TypeChecker(kind: kind, captures: Set(captures), source: source).checkRule(expression, start: offsets.first ?? value.offset)
            return Rule(kind: kind, location: where_, line: line, column: column, body: .expression(expression))
        default:
            throw source.error(.syntax, "\(kind.rawValue) must be a boolean or an expression string, not \(value.typeName)", at: value.offset)
        }
    }

    func indexOn(_ value: PositionedJSON) throws(RulesError) -> [String] {
        func one(_ v: PositionedJSON) throws(RulesError) -> String {
            guard case .string(let scalars, _) = v.kind, !scalars.isEmpty else {
                throw source.error(.syntax, ".indexOn entries must be non-empty strings", at: v.offset)
            }
            var s = ""
            s.unicodeScalars.append(contentsOf: scalars)
            return s
        }
        switch value.kind {
        case .string: return [try one(value)]
        case .array(let items):
            var out: [String] = []
            for item in items { out.append(try one(item)) }
            return out
        default:
            throw source.error(.syntax, ".indexOn must be a string or an array of strings, not \(value.typeName)", at: value.offset)
        }
    }
}

extension Rules {
    /// The `.indexOn` entries of the rule location that matches `path` (through `$wildcards`),
    /// empty when none matches. An `orderByChild` query whose child is not among them runs
    /// without a declared index: Banyan still filters on the server (its indexes are built on
    /// demand), but warns as Firebase does (docs/rules.md, ".indexOn").
    public func indexes(at path: Path) -> [String] {
        var node = root
        for key in path.segments {
            guard let (child, _) = node.child(key.string) else { return [] }
            node = child
        }
        return node.indexOn
    }

    /// Whether a query ordered by `index` at `path` is covered by an `.indexOn` (keys, values and
    /// priorities need none; `.value` needs `".value"`).
    public func declaresIndex(_ index: IndexKind, at path: Path) -> Bool {
        switch index {
        case .key, .priority: return true
        case .value: return indexes(at: path).contains(".value")
        case .child(let child, _): return indexes(at: path).contains(child.segments.map(\.string).joined(separator: "/"))
        }
    }
}
