@testable import BanyanRules
import BanyanTree

// The rules evaluator as it was before rules were compiled (`Program`, `Judge`): it interprets the
// parsed expression trees and rule nodes directly. Kept here only as the oracle of
// `CompiledRulesTests`, which requires the compiled evaluator to decide exactly as this one does.

/// A run-time value of the expression language.
enum RefValue {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case snapshot(RefSnapshot)
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
struct RefSnapshot {
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
enum RefFailure: Error {
    case error(String)
    case budget
}

/// Everything an expression can see at one location.
struct RefScope {
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
struct RefEvaluator {
    let budget: Int
    var steps = 0

    init(budget: Int) { self.budget = budget }

    mutating func charge(_ n: Int = 1) throws(RefFailure) {
        steps += n
        if steps > budget { throw .budget }
    }

    /// Evaluates a rule: true, false, an error message (false), or budget exhaustion.
    mutating func evaluate(_ rule: Rule, in scope: RefScope) throws(RefFailure) -> Result<Bool, RuleEvaluation.Failure> {
        try charge()
        switch rule.body {
        case .constant(let b): return .success(b)
        case .expression(let e):
            do throws(RefFailure) {
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

    mutating func value(_ e: Expression, _ s: RefScope) throws(RefFailure) -> RefValue {
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
            case .auth: return s.auth.map { RefValue($0) } ?? .null
            case .data:
                if let node = s.currentNode { return .snapshot(RefSnapshot(root: s.current, path: s.location, node: node)) }
                return .snapshot(RefSnapshot(root: s.current, path: s.location))
            case .root: return .snapshot(RefSnapshot(root: s.current, path: .root))
            case .newData:
                guard let proposed = s.proposed else { throw .error("newData is not available here") }
                if let node = s.proposedNode { return .snapshot(RefSnapshot(root: proposed, path: s.location, node: node)) }
                return .snapshot(RefSnapshot(root: proposed, path: s.location))
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
                return object[key].map { RefValue($0) } ?? .null
            case (.json(.array(let items)), .number(let n)):
                guard n >= 0, n < Double(items.count), n == n.rounded(.towardZero) else { return .null }
                return RefValue(items[Int(n)])
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

    mutating func member(_ base: RefValue, _ name: String, _ s: RefScope) throws(RefFailure) -> RefValue {
        switch base {
        case .string(let text) where name == "length":
            try charge(text.utf8.count / 64)
            return .number(Double(text.utf16.count))
        case .json(let object):
            return object[name].map { RefValue($0) } ?? .null
        case .query:
            return queryMember(name, s.query)
        case .null:
            throw .error("cannot read '\(name)' of null")
        default:
            throw .error("a \(base.typeName) has no property '\(name)'")
        }
    }

    func queryMember(_ name: String, _ q: RulesQuery) -> RefValue {
        switch name {
        case "orderByChild":
            if case .child(let path)? = q.orderBy { return .string(path) }
            return .null
        case "orderByKey": return .bool(q.orderBy == .key)
        case "orderByValue": return .bool(q.orderBy == .value)
        case "orderByPriority": return .bool(q.orderBy == .priority)
        case "startAt": return RefValue(q.startAt)
        case "endAt": return RefValue(q.endAt)
        case "equalTo": return RefValue(q.equalTo)
        case "limitToFirst": return q.limitToFirst.map { .number(Double($0)) } ?? .null
        case "limitToLast": return q.limitToLast.map { .number(Double($0)) } ?? .null
        default: return .null
        }
    }

    mutating func binary(_ op: Expression.BinaryOperator, _ left: Expression, _ right: Expression, _ s: RefScope) throws(RefFailure) -> RefValue {
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

    func finite(_ d: Double) throws(RefFailure) -> RefValue {
        guard d.isFinite else { throw .error("arithmetic produced a non-finite number") }
        return .number(d)
    }

    /// Equality as in the rules language: values of different types are unequal (no coercion).
    mutating func equal(_ a: RefValue, _ b: RefValue) throws(RefFailure) -> Bool {
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


/// RefSnapshot and string methods. Work proportional to the size of the data touched is charged to
/// the budget (path segments, listed keys, compared scalars, regex thread steps).
extension RefEvaluator {
    mutating func call(_ base: RefValue, _ name: String, _ arguments: [Expression], _ s: RefScope) throws(RefFailure) -> RefValue {
        switch base {
        case .snapshot(let snapshot): return try snapshotMethod(snapshot, name, arguments, s)
        case .string(let text): return try stringMethod(text, name, arguments, s)
        case .null: throw .error("cannot call \(name)() on null")
        default: throw .error("a \(base.typeName) has no method \(name)()")
        }
    }

    mutating func stringArgument(_ e: Expression, _ s: RefScope) throws(RefFailure) -> String {
        let v = try value(e, s)
        guard case .string(let text) = v else { throw .error("expected a string argument, not a \(v.typeName)") }
        return text
    }

    mutating func snapshotMethod(_ snap: RefSnapshot, _ name: String, _ arguments: [Expression], _ s: RefScope) throws(RefFailure) -> RefValue {
        let node = snap.node
        switch name {
        case "val":
            if node.hasChildren { return .opaqueObject }
            return RefValue(node.leaf)
        case "exists": return .bool(!node.isEmpty)
        case "isNumber":
            switch node.leaf {
            case .int?, .double?: return .bool(true)
            default: return .bool(false)
            }
        case "isString":
            if case .string? = node.leaf { return .bool(true) }
            return .bool(false)
        case "isBoolean":
            if case .bool? = node.leaf { return .bool(true) }
            return .bool(false)
        case "getPriority":
            switch node.priority {
            case .none: return .null
            case .number(let d): return .number(d)
            case .string(let t): return .string(t)
            }
        case "parent":
            guard let parent = snap.path.parent else { throw .error("the root has no parent") }
            try charge(parent.count)
            return .snapshot(RefSnapshot(root: snap.root, path: parent))
        case "child", "hasChild":
            guard let argument = arguments.first else { throw .error("\(name)() needs a path") }
            let relative = try childPath(try stringArgument(argument, s))
            try charge(snap.path.count + relative.count)
            let child = RefSnapshot(root: snap.root, path: snap.path.appending(relative), node: node.child(at: relative))
            return name == "child" ? .snapshot(child) : .bool(!child.node.isEmpty)
        case "hasChildren":
            guard let list = arguments.first else { return .bool(node.hasChildren) }
            guard case .array(let items) = list.kind else { throw .error("hasChildren() takes a list of keys") }
            var all = true
            for item in items {
                let key = try stringArgument(item, s)
                let relative = try childPath(key)
                try charge(relative.count)
                if node.child(at: relative).isEmpty { all = false }
            }
            return .bool(all)
        default:
            throw .error("a snapshot has no method \(name)()")
        }
    }

    func childPath(_ text: String) throws(RefFailure) -> Path {
        // The usual argument, one valid key ('c', 'i'): the path `Path(parsing:)` would make, without
        // splitting the text and copying it again.
        if !text.utf8.contains(UInt8(ascii: "/")), let key = ChildKey(validKey: text) { return Path(segments: [key]) }
        guard let path = try? Path(parsing: text) else { throw .error("invalid child path '\(ChildKey.printable(text))'") }
        guard !path.isRoot else { throw .error("a child path must not be empty") }
        return path
    }

    mutating func stringMethod(_ text: String, _ name: String, _ arguments: [Expression], _ s: RefScope) throws(RefFailure) -> RefValue {
        switch name {
        case "contains", "beginsWith", "endsWith":
            guard let argument = arguments.first else { throw .error("\(name)() needs an argument") }
            let needle = Array(try stringArgument(argument, s).unicodeScalars)
            let hay = Array(text.unicodeScalars)
            try charge((hay.count + needle.count) / 16)
            switch name {
            case "beginsWith": return .bool(hay.count >= needle.count && hay[..<needle.count].elementsEqual(needle))
            case "endsWith": return .bool(hay.count >= needle.count && hay[(hay.count - needle.count)...].elementsEqual(needle))
            default: return .bool(try find(needle, in: hay, from: 0) != nil)
            }
        case "replace":
            guard arguments.count == 2 else { throw .error("replace() needs two arguments") }
            let target = Array(try stringArgument(arguments[0], s).unicodeScalars)
            let replacement = try stringArgument(arguments[1], s)
            let hay = Array(text.unicodeScalars)
            guard !target.isEmpty else { return .string(text) }
            var out = String.UnicodeScalarView()
            var i = 0
            while let found = try find(target, in: hay, from: i) {
                out.append(contentsOf: hay[i..<found])
                out.append(contentsOf: replacement.unicodeScalars)
                try charge(replacement.utf8.count / 16 + 1)
                i = found + target.count
            }
            out.append(contentsOf: hay[i...])
            return .string(String(out))
        case "toLowerCase":
            try charge(text.utf8.count / 16)
            return .string(text.lowercased())
        case "toUpperCase":
            try charge(text.utf8.count / 16)
            return .string(text.uppercased())
        case "matches":
            guard let argument = arguments.first, case .regex(let regex) = argument.kind else { throw .error("matches() needs a regular expression") }
            guard let found = regex.firstMatch(in: text, steps: &steps, budget: budget) else { throw .budget }
            return .bool(found)
        default:
            throw .error("a string has no method \(name)()")
        }
    }

    /// The first index at or after `start` where `needle` occurs in `hay` (naive search, every
    /// comparison charged, so a quadratic case runs out of budget instead of time).
    mutating func find(_ needle: [Unicode.Scalar], in hay: [Unicode.Scalar], from start: Int) throws(RefFailure) -> Int? {
        guard needle.count <= hay.count - start else { return needle.isEmpty ? start : nil }
        if needle.isEmpty { return start }
        var i = start
        while i + needle.count <= hay.count {
            var k = 0
            while k < needle.count && hay[i + k] == needle[k] { k += 1 }
            try charge(k / 8 + 1)
            if k == needle.count { return i }
            i += 1
        }
        return nil
    }
}

extension Rules {
    // MARK: Reads

    /// Whether a read (or listen) at `path` is allowed: some `.read` from the root down to `path`
    /// must evaluate to true (reads cascade: a grant above covers everything below).
    func referenceDecideRead(at path: Path, query: RulesQuery = RulesQuery(), context: RulesRequestContext, tree: Tree) -> Decision {
        var evaluator = RefEvaluator(budget: limits.evaluationBudget)
        var trace: [RuleEvaluation] = []
        var lastFalse: (RuleReference, Path)?
        var node: RuleNode? = root
        var captures: [String: String] = [:]
        var location = Path.root
        var depth = 0
        while let here = node {
            if let rule = here.read {
                let scope = RefScope(
                    auth: context.auth, current: tree, proposed: nil, location: location, captures: captures, query: query, time: context.time
                )
                do throws(RefFailure) {
                    let result = try evaluator.evaluate(rule, in: scope)
                    trace.append(RuleEvaluation(rule: rule.reference, location: location, result: result))
                    if case .success(true) = result {
                        return Decision(allowed: true, reason: .granted, rule: rule.reference, location: location, trace: trace)
                    }
                    lastFalse = (rule.reference, location)
                } catch {
                    return Decision(allowed: false, reason: .budgetExceeded, rule: rule.reference, location: location, trace: trace)
                }
            }
            guard depth < path.count else { break }
            let key = path.segments[depth]
            depth += 1
            location = location.appending(key)
            guard let (child, capture) = here.child(key.string) else {
                node = nil
                break
            }
            if let capture { captures[capture] = key.string }
            node = child
        }
        return Decision(allowed: false, reason: .noRuleGranted, rule: lastFalse?.0, location: lastFalse?.1 ?? path, trace: trace)
    }

    // MARK: Writes

    /// Whether `set(value)` at `path` is allowed (a `.priority` path sets only the priority).
    /// `traced`: whether the decision lists every rule evaluated (see `decideWrite`).
    func referenceDecideSet(_ value: Tree, at path: WritePath, context: RulesRequestContext, tree: Tree, traced: Bool = true) -> Decision {
        var proposed = tree
        do {
            try proposed.apply(set: value, at: path)
        } catch {
            return Decision(allowed: false, reason: .invalidWrite(error.message), rule: nil, location: path.path, trace: [])
        }
        return referenceDecideWrite(targets: [path.path], context: context, current: tree, proposed: proposed, traced: traced)
    }

    /// Whether a multi-path update at `location` is allowed: every entry's path must be allowed,
    /// each judged with `newData` taken from the tree after the whole update.
    func referenceDecideUpdate(_ entries: [UpdateEntry], at location: Path, context: RulesRequestContext, tree: Tree, traced: Bool = true) -> Decision {
        var proposed = tree
        do {
            try proposed.apply(update: entries, at: location)
        } catch {
            return Decision(allowed: false, reason: .invalidWrite(error.message), rule: nil, location: location, trace: [])
        }
        let targets = entries.map { location.appending($0.path.path) }
        return referenceDecideWrite(targets: targets, context: context, current: tree, proposed: proposed, traced: traced)
    }

    /// The write judgement shared by set and update.
    ///
    /// 1. Each target needs a `.write` from the root down to it that evaluates to true, with `data`
    ///    from the current tree and `newData` from the proposed one (writes cascade).
    /// 2. Then `.validate` rules must hold wherever the proposed data is not null: at every
    ///    ancestor of a target (its data changes too) and at every location of the written data.
    ///    `.validate` does not cascade and is skipped where the proposed data is null, so a
    ///    deletion is judged by `.write` (and by the validation of the ancestors that remain).
    ///
    /// `traced` false leaves the decision's `trace` empty (the state machine, which reports only
    /// the verdict and its `description`, does not pay for it); nothing else differs.
    func referenceDecideWrite(targets: [Path], context: RulesRequestContext, current: Tree, proposed: Tree, traced: Bool = true) -> Decision {
        var run = RefWriteRun(rules: self, context: context, current: current, proposed: proposed, traced: traced)
        var grants: [(RuleReference, Path)] = []
        for target in targets {
            switch run.grantWrite(target) {
            case .success(let grant): grants.append(grant)
            case .failure(let denial): return denial.decision
            }
        }
        if let denial = run.validate(targets: targets) { return denial }
        let first = grants.first
        return Decision(allowed: true, reason: .granted, rule: first?.0, location: first?.1 ?? .root, trace: run.trace)
    }
}

/// The state of one write decision: the budget spent and the trace so far.
struct RefWriteRun {
    let rules: Rules
    let context: RulesRequestContext
    let current: Tree
    let proposed: Tree
    var evaluator: RefEvaluator
    /// Whether `trace` is kept.
    let traced: Bool
    var trace: [RuleEvaluation] = []

    init(rules: Rules, context: RulesRequestContext, current: Tree, proposed: Tree, traced: Bool = true) {
        self.rules = rules
        self.context = context
        self.current = current
        self.proposed = proposed
        self.traced = traced
        self.evaluator = RefEvaluator(budget: rules.limits.evaluationBudget)
    }

    struct Denial: Error {
        let decision: Decision
    }

    func scope(_ location: Path, _ captures: [String: String], proposedNode: Tree? = nil) -> RefScope {
        RefScope(
            auth: context.auth, current: current, proposed: proposed, location: location, captures: captures, query: RulesQuery(), time: context.time,
            proposedNode: proposedNode)
    }

    /// Evaluates one rule; true/false (errors count as false), or a denial when the budget ran out.
    /// `proposedNode`: `proposed` at `location`, when the caller holds it.
    mutating func run(_ rule: Rule, at location: Path, _ captures: [String: String], proposedNode: Tree? = nil) -> Result<Bool, Denial> {
        do throws(RefFailure) {
            let result = try evaluator.evaluate(rule, in: scope(location, captures, proposedNode: proposedNode))
            if traced { trace.append(RuleEvaluation(rule: rule.reference, location: location, result: result)) }
            if case .success(true) = result { return .success(true) }
            return .success(false)
        } catch {
            return .failure(Denial(decision: Decision(allowed: false, reason: .budgetExceeded, rule: rule.reference, location: location, trace: trace)))
        }
    }

    /// The `.write` that grants `target`, or the denial.
    mutating func grantWrite(_ target: Path) -> Result<(RuleReference, Path), Denial> {
        var node: RuleNode? = rules.root
        var captures: [String: String] = [:]
        var location = Path.root
        var lastFalse: (RuleReference, Path)?
        var depth = 0
        while let here = node {
            if let rule = here.write {
                switch run(rule, at: location, captures) {
                case .success(true): return .success((rule.reference, location))
                case .success(false): lastFalse = (rule.reference, location)
                case .failure(let denial): return .failure(denial)
                }
            }
            guard depth < target.count else { break }
            let key = target.segments[depth]
            depth += 1
            location = location.appending(key)
            guard let (child, capture) = here.child(key.string) else { break }
            if let capture { captures[capture] = key.string }
            node = child
        }
        return .failure(Denial(decision: Decision(allowed: false, reason: .noRuleGranted, rule: lastFalse?.0, location: lastFalse?.1 ?? target, trace: trace)))
    }

    /// Runs every `.validate` the write touches; the first failure denies.
    mutating func validate(targets: [Path]) -> Decision? {
        if targets.count == 1, let target = targets.first { return validate(single: target) }
        // Ancestors first (strict prefixes of a target, not themselves inside a target), each once,
        // in path order, then each target's written subtree.
        var ancestors: Set<Path> = []
        for target in targets {
            var p = target
            while let parent = p.parent {
                ancestors.insert(parent)
                p = parent
            }
        }
        let ordered = ancestors.filter { a in !targets.contains { $0.contains(a) } }.sorted()
        for ancestor in ordered {
            guard let (node, captures) = ruleNode(at: ancestor), let rule = node.validate else { continue }
            guard !proposed.child(at: ancestor).isEmpty else { continue }
            if let denial = check(rule, at: ancestor, captures) { return denial }
        }
        for target in targets.sorted() {
            guard let (node, captures) = ruleNode(at: target) else { continue }
            if let denial = walk(node, at: target, proposed.child(at: target), captures) { return denial }
        }
        return nil
    }

    /// `validate(targets:)` for one target (a set, or a one-entry update), in one descent: the
    /// same checks in the same order (ancestors from the root down, then the written subtree),
    /// without collecting, sorting and looking up each ancestor again from the root.
    mutating func validate(single target: Path) -> Decision? {
        var node = rules.root
        var data = proposed
        var captures: [String: String] = [:]
        var location = Path.root
        for key in target.segments {
            if let rule = node.validate, !data.isEmpty, let denial = check(rule, at: location, captures, proposedNode: data) { return denial }
            guard let (child, capture) = node.child(key.string) else { return nil }
            if let capture { captures[capture] = key.string }
            node = child
            data = data.child(key)
            location = location.appending(key)
        }
        return walk(node, at: target, data, captures)
    }

    /// Validates `data` at `location` with `node`'s rules, then its children with theirs.
    mutating func walk(_ node: RuleNode, at location: Path, _ data: Tree, _ captures: [String: String]) -> Decision? {
        guard !data.isEmpty else { return nil }
        do throws(RefFailure) {
            try evaluator.charge()
        } catch {
            return Decision(allowed: false, reason: .budgetExceeded, rule: nil, location: location, trace: trace)
        }
        if let rule = node.validate, let denial = check(rule, at: location, captures, proposedNode: data) { return denial }
        for key in node.namedOrder {
            guard let child = node.named[key] else { continue }
            let childData = data.child(ChildKey(unchecked: key))
            if let denial = walk(child, at: location.appending(ChildKey(unchecked: key)), childData, captures) { return denial }
        }
        if let name = node.wildcardName, let wildcard = node.wildcardNode.first {
            var denial: Decision?
            var inner = captures
            data.children.forEach { key, childData in
                guard denial == nil, node.named[key.string] == nil else { return }
                inner[name] = key.string
                denial = walk(wildcard, at: location.appending(key), childData, inner)
            }
            if let denial { return denial }
        }
        return nil
    }

    mutating func check(_ rule: Rule, at location: Path, _ captures: [String: String], proposedNode: Tree? = nil) -> Decision? {
        switch run(rule, at: location, captures, proposedNode: proposedNode) {
        case .success(true): return nil
        case .success(false):
            return Decision(allowed: false, reason: .validationFailed, rule: rule.reference, location: location, trace: trace)
        case .failure(let denial): return denial.decision
        }
    }

    /// The rules at a concrete location, with the captures bound on the way (nil when no rule
    /// location matches it).
    func ruleNode(at path: Path) -> (RuleNode, [String: String])? {
        var node = rules.root
        var captures: [String: String] = [:]
        for key in path.segments {
            guard let (child, capture) = node.child(key.string) else { return nil }
            if let capture { captures[capture] = key.string }
            node = child
        }
        return (node, captures)
    }
}

