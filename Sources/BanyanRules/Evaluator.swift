public import BanyanTree

/// The query parameters of a read, as rules see them through `query.*` (all null for a plain read).
public struct RulesQuery: Sendable, Equatable {
    public enum Order: Sendable, Equatable {
        /// `orderByChild(path)`.
        case child(String)
        case key
        case value
        case priority
    }

    public var orderBy: Order?
    public var startAt: Leaf?
    public var endAt: Leaf?
    public var equalTo: Leaf?
    public var limitToFirst: Int?
    public var limitToLast: Int?

    public init(
        orderBy: Order? = nil, startAt: Leaf? = nil, endAt: Leaf? = nil, equalTo: Leaf? = nil, limitToFirst: Int? = nil, limitToLast: Int? = nil
    ) {
        self.orderBy = orderBy
        self.startAt = startAt
        self.endAt = endAt
        self.equalTo = equalTo
        self.limitToFirst = limitToFirst
        self.limitToLast = limitToLast
    }
}

/// A run-time value of the expression language.
enum RuleValue {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    /// Boxed: snapshots are few (most calls on `newData` and `data` need none), and the other
    /// values stay small.
    indirect case snapshot(Snapshot)
    /// A JSON object or array from `auth` (its members are read with `.` or `[]`).
    case json(JSONValue)
    /// `val()` of a location with children: compares unequal to everything, supports nothing else.
    case opaqueObject
    case query

    var typeName: String {
        switch self {
        case .null: return "null"
        case .bool: return "boolean"
        case .number: return "number"
        case .string: return "string"
        case .snapshot: return "snapshot"
        case .json: return "object"
        case .opaqueObject: return "object"
        case .query: return "query"
        }
    }

    init(_ json: JSONValue) {
        switch json {
        case .null: self = .null
        case .bool(let b): self = .bool(b)
        case .int(let i): self = .number(Double(i))
        case .double(let d): self = .number(d)
        case .string(let s): self = .string(s)
        case .array, .object: self = .json(json)
        }
    }

    init(_ leaf: Leaf?) {
        switch leaf {
        case nil: self = .null
        case .bool(let b)?: self = .bool(b)
        case .int(let i)?: self = .number(Double(i))
        case .double(let d)?: self = .number(d)
        case .string(let s)?: self = .string(s)
        }
    }
}

/// A location in one version of the tree (the current one for `data` and `root`, the one after the
/// write for `newData`). Its path is the first `prefix` keys of the location being judged, then
/// `suffix` (what `child()` added): no `Path` is built unless `parent()` needs one.
struct Snapshot {
    /// Whether this is the tree after the write.
    let proposed: Bool
    let node: Tree
    let prefix: Int
    let suffix: [ChildKey]

    var depth: Int { prefix + suffix.count }
}

/// `proposed` at the judged location, when the validation walk holds it (`held`), else the empty
/// tree. Passed down the evaluation, not stored, so reading `newData` there copies nothing.
struct Here {
    let node: Tree
    let held: Bool

    static let none = Here(node: .empty, held: false)
}

/// Why an expression did not produce a value: an error (the rule counts as false, as Firebase
/// does) or the evaluation budget running out (the whole decision is a denial).
enum EvaluationFailure: Error {
    case error(String)
    case budget
}

/// One decision's evaluation of the compiled rules (`Program`): the request's inputs, the location
/// being judged (a stack of keys, which also holds what the wildcards captured), the steps spent
/// against the budget, and the trace.
struct Judge {
    let program: Program
    let auth: JSONValue?
    let current: Tree
    /// The tree after the write; nil for reads (the type checker keeps `newData` out of `.read`).
    let proposed: Tree?
    let query: RulesQuery
    let time: Int64
    let budget: Int
    var steps = 0
    /// The keys of the location being judged, from the root.
    var location: [ChildKey] = []
    /// Whether `trace` is kept.
    let traced: Bool
    var trace: [RuleEvaluation] = []

    init(rules: Rules, context: RulesRequestContext, current: Tree, proposed: Tree?, query: RulesQuery = RulesQuery(), traced: Bool) {
        program = rules.program
        auth = context.auth
        self.current = current
        self.proposed = proposed
        self.query = query
        time = context.time
        budget = rules.limits.evaluationBudget
        self.traced = traced
        location.reserveCapacity(8)
    }

    /// The location being judged, as a path.
    var path: Path { Path(segments: location) }

    mutating func charge(_ n: Int = 1) throws(EvaluationFailure) {
        steps += n
        if steps > budget { throw .budget }
    }

    /// Evaluates rule `index` at `location`: true, false, an error message (false), or budget
    /// exhaustion. `here`: `proposed` at `location`, when the walk holds it (`newData` then needs
    /// no descent); it is passed down, not stored, so no evaluation copies it.
    mutating func evaluate(_ index: Int32, _ here: Here) throws(EvaluationFailure) -> Result<Bool, RuleEvaluation.Failure> {
        try charge()
        let entry = program.rules[Int(index)].entry
        if entry < 0 { return .success(entry == ProgramRule.alwaysTrue) }
        do throws(EvaluationFailure) {
            let value = try self.value(entry, here)
            guard case .bool(let b) = value else {
                return .failure(RuleEvaluation.Failure("the rule evaluated to a \(value.typeName), not a boolean"))
            }
            return .success(b)
        } catch {
            switch error {
            case .budget: throw .budget
            case .error(let message): return .failure(RuleEvaluation.Failure(message))
            }
        }
    }

    /// The node of `tree` at the first `count` keys of `location`.
    func descend(_ tree: Tree, _ count: Int) -> Tree {
        var node = tree
        var i = 0
        while i < count, !node.isEmpty {
            node = node.child(location[i])
            i += 1
        }
        return node
    }

    mutating func value(_ index: Int32, _ here: Here) throws(EvaluationFailure) -> RuleValue {
        try charge()
        let op = program.ops[Int(index)]
        switch op.code {
        case .null: return .null
        case .bool: return .bool(op.number != 0)
        case .number: return .number(op.number)
        case .string: return .string(program.strings[Int(op.a)])
        case .regex: throw .error("a regular expression is not a value")
        case .array: throw .error("a list is not a value")
        case .auth: return auth.map { RuleValue($0) } ?? .null
        case .data: return .snapshot(Snapshot(proposed: false, node: descend(current, location.count), prefix: location.count, suffix: []))
        case .root: return .snapshot(Snapshot(proposed: false, node: current, prefix: 0, suffix: []))
        case .newData:
            guard let proposed else { throw .error("newData is not available here") }
            let node = here.held ? here.node : descend(proposed, location.count)
            return .snapshot(Snapshot(proposed: true, node: node, prefix: location.count, suffix: []))
        case .query: return .query
        case .currentTime: return .number(Double(time))
        case .capture:
            guard op.a >= 0, Int(op.a) < location.count else { throw .error("\(program.strings[Int(op.b)]) is not bound") }
            return .string(location[Int(op.a)].string)
        case .member:
            return try member(try value(op.a, here), program.strings[Int(op.b)])
        case .index:
            let b = try value(op.a, here)
            let i = try value(op.b, here)
            switch (b, i) {
            case (.json(let object), .string(let key)):
                return object[key].map { RuleValue($0) } ?? .null
            case (.json(.array(let items)), .number(let n)):
                guard n >= 0, n < Double(items.count), n == n.rounded(.towardZero) else { return .null }
                return RuleValue(items[Int(n)])
            default:
                throw .error("cannot index a \(b.typeName) with a \(i.typeName)")
            }
        case .call:
            // `newData.child('c').isNumber()` and the like: the node is found without building
            // a snapshot for each step of the chain (the same steps are charged).
            if op.method.readsNodeOnly, here.held, program.ops[Int(op.a)].code == .newData {
                // The commonest: `newData.isNumber()` where the walk holds the node.
                try charge(1)
                return try nodeMethod(here.node, depth: location.count, op, here)
            }
            if op.method.readsNodeOnly, let (node, depth, steps) = fusedNode(op.a, here) {
                try charge(steps)
                return try nodeMethod(node, depth: depth, op, here)
            }
            return try call(try value(op.a, here), op, here)
        case .unary:
            let v = try value(op.a, here)
            switch (op.unary, v) {
            case (.not, .bool(let b)): return .bool(!b)
            case (.negate, .number(let n)): return .number(-n)
            default: throw .error("'\(op.unary.rawValue)' cannot apply to a \(v.typeName)")
            }
        case .binary:
            return try binary(op.binary, op.a, op.b, here)
        case .conditional:
            guard case .bool(let c) = try value(op.a, here) else { throw .error("the condition of '?:' is not a boolean") }
            return try value(c ? op.b : op.c, here)
        }
    }

    mutating func member(_ base: RuleValue, _ name: String) throws(EvaluationFailure) -> RuleValue {
        switch base {
        case .string(let text) where name == "length":
            try charge(text.utf8.count / 64)
            return .number(Double(text.utf16.count))
        case .json(let object):
            return object[name].map { RuleValue($0) } ?? .null
        case .query:
            return queryMember(name)
        case .null:
            throw .error("cannot read '\(name)' of null")
        default:
            throw .error("a \(base.typeName) has no property '\(name)'")
        }
    }

    func queryMember(_ name: String) -> RuleValue {
        let q = query
        switch name {
        case "orderByChild":
            if case .child(let path)? = q.orderBy { return .string(path) }
            return .null
        case "orderByKey": return .bool(q.orderBy == .key)
        case "orderByValue": return .bool(q.orderBy == .value)
        case "orderByPriority": return .bool(q.orderBy == .priority)
        case "startAt": return RuleValue(q.startAt)
        case "endAt": return RuleValue(q.endAt)
        case "equalTo": return RuleValue(q.equalTo)
        case "limitToFirst": return q.limitToFirst.map { .number(Double($0)) } ?? .null
        case "limitToLast": return q.limitToLast.map { .number(Double($0)) } ?? .null
        default: return .null
        }
    }

    mutating func binary(_ op: Expression.BinaryOperator, _ left: Int32, _ right: Int32, _ here: Here) throws(EvaluationFailure) -> RuleValue {
        if op == .and || op == .or {
            guard case .bool(let l) = try value(left, here) else { throw .error("'\(op.rawValue)' needs booleans") }
            if op == .and && !l { return .bool(false) }
            if op == .or && l { return .bool(true) }
            guard case .bool(let r) = try value(right, here) else { throw .error("'\(op.rawValue)' needs booleans") }
            return .bool(r)
        }
        let l = try value(left, here)
        let r = try value(right, here)
        switch op {
        case .equal, .strictEqual: return .bool(try equal(l, r))
        case .notEqual, .strictNotEqual: return .bool(!(try equal(l, r)))
        case .add:
            switch (l, r) {
            case (.number(let a), .number(let b)): return try finite(a + b)
            case (.string(let a), .string(let b)):
                try charge((a.utf8.count + b.utf8.count) / 64)
                return .string(a + b)
            default: throw .error("'+' cannot add a \(l.typeName) and a \(r.typeName)")
            }
        case .subtract, .multiply, .divide, .remainder:
            guard case .number(let a) = l, case .number(let b) = r else {
                throw .error("'\(op.rawValue)' needs numbers, not a \(l.typeName) and a \(r.typeName)")
            }
            switch op {
            case .subtract: return try finite(a - b)
            case .multiply: return try finite(a * b)
            case .divide: return try finite(a / b)
            default: return try finite(a.truncatingRemainder(dividingBy: b))
            }
        case .less, .lessOrEqual, .greater, .greaterOrEqual:
            let order: Int
            switch (l, r) {
            case (.number(let a), .number(let b)): order = a < b ? -1 : (a == b ? 0 : 1)
            case (.string(let a), .string(let b)):
                try charge(min(a.utf8.count, b.utf8.count) / 64)
                order = compareUTF16(a, b)
            default: throw .error("'\(op.rawValue)' cannot compare a \(l.typeName) and a \(r.typeName)")
            }
            switch op {
            case .less: return .bool(order < 0)
            case .lessOrEqual: return .bool(order <= 0)
            case .greater: return .bool(order > 0)
            default: return .bool(order >= 0)
            }
        case .and, .or:
            throw .error("unreachable operator")
        }
    }

    func finite(_ d: Double) throws(EvaluationFailure) -> RuleValue {
        guard d.isFinite else { throw .error("arithmetic produced a non-finite number") }
        return .number(d)
    }

    /// Equality as in the rules language: values of different types are unequal (no coercion).
    mutating func equal(_ a: RuleValue, _ b: RuleValue) throws(EvaluationFailure) -> Bool {
        switch (a, b) {
        case (.null, .null): return true
        case let (.bool(x), .bool(y)): return x == y
        case let (.number(x), .number(y)): return x == y
        case let (.string(x), .string(y)):
            try charge(min(x.utf8.count, y.utf8.count) / 64)
            return x.utf8.elementsEqual(y.utf8)
        case let (.json(x), .json(y)):
            try charge(8)
            return x == y
        case (.snapshot, _), (_, .snapshot), (.query, _), (_, .query):
            throw .error("a \(a.typeName) cannot be compared")
        default: return false
        }
    }
}
