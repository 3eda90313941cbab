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
    case snapshot(Snapshot)
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
/// write for `newData`).
struct Snapshot {
    let root: Tree
    let path: Path
    let node: Tree

    init(root: Tree, path: Path) {
        self.root = root
        self.path = path
        self.node = root.child(at: path)
    }

    /// A location whose node is already known (no descent from the root).
    init(root: Tree, path: Path, node: Tree) {
        self.root = root
        self.path = path
        self.node = node
    }
}

/// Why an expression did not produce a value: an error (the rule counts as false, as Firebase
/// does) or the evaluation budget running out (the whole decision is a denial).
enum EvaluationFailure: Error {
    case error(String)
    case budget
}

/// Everything an expression can see at one location.
struct Scope {
    let auth: JSONValue?
    let current: Tree
    /// The tree after the write; nil for reads (the type checker keeps `newData` out of `.read`).
    let proposed: Tree?
    let location: Path
    let captures: [String: String]
    let query: RulesQuery
    let time: Int64
    /// `current` and `proposed` at `location`, when the caller already holds them (a decision
    /// walks the trees anyway): `data` and `newData` then need no descent from the root.
    var currentNode: Tree? = nil
    var proposedNode: Tree? = nil
}

/// Evaluates expressions, counting every step against the decision's budget.
struct Evaluator {
    let budget: Int
    var steps = 0

    init(budget: Int) { self.budget = budget }

    mutating func charge(_ n: Int = 1) throws(EvaluationFailure) {
        steps += n
        if steps > budget { throw .budget }
    }

    /// Evaluates a rule: true, false, an error message (false), or budget exhaustion.
    mutating func evaluate(_ rule: Rule, in scope: Scope) throws(EvaluationFailure) -> Result<Bool, RuleEvaluation.Failure> {
        try charge()
        switch rule.body {
        case .constant(let b): return .success(b)
        case .expression(let e):
            do throws(EvaluationFailure) {
                let value = try self.value(e, scope)
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
    }

    mutating func value(_ e: Expression, _ s: Scope) throws(EvaluationFailure) -> RuleValue {
        try charge()
        switch e.kind {
        case .null: return .null
        case .bool(let b): return .bool(b)
        case .number(let n): return .number(n)
        case .string(let t): return .string(t)
        case .regex: throw .error("a regular expression is not a value")
        case .array: throw .error("a list is not a value")
        case .variable(let v):
            switch v {
            case .auth: return s.auth.map { RuleValue($0) } ?? .null
            case .data:
                if let node = s.currentNode { return .snapshot(Snapshot(root: s.current, path: s.location, node: node)) }
                return .snapshot(Snapshot(root: s.current, path: s.location))
            case .root: return .snapshot(Snapshot(root: s.current, path: .root))
            case .newData:
                guard let proposed = s.proposed else { throw .error("newData is not available here") }
                if let node = s.proposedNode { return .snapshot(Snapshot(root: proposed, path: s.location, node: node)) }
                return .snapshot(Snapshot(root: proposed, path: s.location))
            case .query: return .query
            case .currentTime: return .number(Double(s.time))
            }
        case .capture(let name):
            guard let value = s.captures[name] else { throw .error("\(name) is not bound") }
            return .string(value)
        case .member(let base, let name):
            return try member(try value(base, s), name, s)
        case .index(let base, let index):
            let b = try value(base, s)
            let i = try value(index, s)
            switch (b, i) {
            case (.json(let object), .string(let key)):
                return object[key].map { RuleValue($0) } ?? .null
            case (.json(.array(let items)), .number(let n)):
                guard n >= 0, n < Double(items.count), n == n.rounded(.towardZero) else { return .null }
                return RuleValue(items[Int(n)])
            default:
                throw .error("cannot index a \(b.typeName) with a \(i.typeName)")
            }
        case .call(let base, let name, let arguments):
            return try call(try value(base, s), name, arguments, s)
        case .unary(let op, let operand):
            let v = try value(operand, s)
            switch (op, v) {
            case (.not, .bool(let b)): return .bool(!b)
            case (.negate, .number(let n)): return .number(-n)
            default: throw .error("'\(op.rawValue)' cannot apply to a \(v.typeName)")
            }
        case .binary(let op, let left, let right):
            return try binary(op, left, right, s)
        case .conditional(let condition, let whenTrue, let whenFalse):
            guard case .bool(let c) = try value(condition, s) else { throw .error("the condition of '?:' is not a boolean") }
            return try value(c ? whenTrue : whenFalse, s)
        }
    }

    mutating func member(_ base: RuleValue, _ name: String, _ s: Scope) throws(EvaluationFailure) -> RuleValue {
        switch base {
        case .string(let text) where name == "length":
            try charge(text.utf8.count / 64)
            return .number(Double(text.utf16.count))
        case .json(let object):
            return object[name].map { RuleValue($0) } ?? .null
        case .query:
            return queryMember(name, s.query)
        case .null:
            throw .error("cannot read '\(name)' of null")
        default:
            throw .error("a \(base.typeName) has no property '\(name)'")
        }
    }

    func queryMember(_ name: String, _ q: RulesQuery) -> RuleValue {
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

    mutating func binary(_ op: Expression.BinaryOperator, _ left: Expression, _ right: Expression, _ s: Scope) throws(EvaluationFailure) -> RuleValue {
        if op == .and || op == .or {
            guard case .bool(let l) = try value(left, s) else { throw .error("'\(op.rawValue)' needs booleans") }
            if op == .and && !l { return .bool(false) }
            if op == .or && l { return .bool(true) }
            guard case .bool(let r) = try value(right, s) else { throw .error("'\(op.rawValue)' needs booleans") }
            return .bool(r)
        }
        let l = try value(left, s)
        let r = try value(right, s)
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
