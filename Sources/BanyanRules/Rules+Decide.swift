public import BanyanTree

/// The answer to "may this request proceed?", with what an offline tester needs to explain it.
public struct Decision: Sendable, Equatable, CustomStringConvertible {
    public enum Reason: Sendable, Equatable {
        /// A `.read` or `.write` rule on the path evaluated to true (and every `.validate` held).
        case granted
        /// No `.read`/`.write` rule from the root to the location evaluated to true.
        case noRuleGranted
        /// Access was granted but a `.validate` rule did not hold.
        case validationFailed
        /// Evaluation took more steps than `RulesLimits.evaluationBudget`.
        case budgetExceeded
        /// The write itself is malformed (overlapping update paths, limits of the data model).
        case invalidWrite(String)
    }

    public let allowed: Bool
    public let reason: Reason
    /// For an allowed request, the rule that granted it; for a denial, the rule that failed (the
    /// failing `.validate`, the rule running when the budget ran out, or the last `.read`/`.write`
    /// that evaluated to false), nil when no rule applied at all.
    public let rule: RuleReference?
    /// The concrete location the deciding rule was evaluated at (or the request's location).
    public let location: Path
    /// Every rule evaluated, in order, with its outcome.
    public let trace: [RuleEvaluation]

    public var description: String {
        let verdict = allowed ? "allow" : "deny"
        let by = rule.map { " by \($0)" } ?? ""
        switch reason {
        case .granted: return "\(verdict)\(by) at \(location)"
        case .noRuleGranted: return "\(verdict): no rule granted access to \(location)\(rule.map { " (last tried \($0))" } ?? "")"
        case .validationFailed: return "\(verdict): validation failed\(by) at \(location)"
        case .budgetExceeded: return "\(verdict): evaluation budget exceeded\(by) at \(location)"
        case .invalidWrite(let why): return "\(verdict): invalid write at \(location): \(why)"
        }
    }
}

/// One rule evaluated during a decision.
public struct RuleEvaluation: Sendable, Equatable, CustomStringConvertible {
    /// Why an expression had no value (it then counts as false).
    public struct Failure: Error, Sendable, Equatable {
        public let message: String
        init(_ message: String) { self.message = message }
    }

    public let rule: RuleReference
    public let location: Path
    public let result: Result<Bool, Failure>

    public var description: String {
        switch result {
        case .success(let b): return "\(rule) at \(location): \(b)"
        case .failure(let f): return "\(rule) at \(location): error (\(f.message))"
        }
    }
}

/// Who is asking and when: the inputs of a decision besides the rules and the tree.
public struct RulesRequestContext: Sendable, Equatable {
    /// `auth`: nil when signed out, else a JSON object (`uid`, `provider`, `token` claims…).
    public var auth: JSONValue?
    /// `now`, in milliseconds since the epoch (in the cluster, the leader-stamped time of the
    /// log position that carries the request; never read from a clock here).
    public var time: Int64

    public init(auth: JSONValue?, time: Int64) {
        self.auth = auth
        self.time = time
    }
}

extension Rules {
    // MARK: Reads

    /// Whether a read (or listen) at `path` is allowed: some `.read` from the root down to `path`
    /// must evaluate to true (reads cascade: a grant above covers everything below).
    public func decideRead(at path: Path, query: RulesQuery = RulesQuery(), context: RulesRequestContext, tree: Tree) -> Decision {
        var evaluator = Evaluator(budget: limits.evaluationBudget)
        var trace: [RuleEvaluation] = []
        var lastFalse: (RuleReference, Path)?
        var node: RuleNode? = root
        var captures: [String: String] = [:]
        var location = Path.root
        var depth = 0
        while let here = node {
            if let rule = here.read {
                let scope = Scope(
                    auth: context.auth, current: tree, proposed: nil, location: location, captures: captures, query: query, time: context.time
                )
                do throws(EvaluationFailure) {
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
    public func decideSet(_ value: Tree, at path: WritePath, context: RulesRequestContext, tree: Tree, traced: Bool = true) -> Decision {
        var proposed = tree
        do {
            try proposed.apply(set: value, at: path)
        } catch {
            return Decision(allowed: false, reason: .invalidWrite(error.message), rule: nil, location: path.path, trace: [])
        }
        return decideWrite(targets: [path.path], context: context, current: tree, proposed: proposed, traced: traced)
    }

    /// Whether a multi-path update at `location` is allowed: every entry's path must be allowed,
    /// each judged with `newData` taken from the tree after the whole update.
    public func decideUpdate(_ entries: [UpdateEntry], at location: Path, context: RulesRequestContext, tree: Tree, traced: Bool = true) -> Decision {
        var proposed = tree
        do {
            try proposed.apply(update: entries, at: location)
        } catch {
            return Decision(allowed: false, reason: .invalidWrite(error.message), rule: nil, location: location, trace: [])
        }
        let targets = entries.map { location.appending($0.path.path) }
        return decideWrite(targets: targets, context: context, current: tree, proposed: proposed, traced: traced)
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
    public func decideWrite(targets: [Path], context: RulesRequestContext, current: Tree, proposed: Tree, traced: Bool = true) -> Decision {
        var run = WriteRun(rules: self, context: context, current: current, proposed: proposed, traced: traced)
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
struct WriteRun {
    let rules: Rules
    let context: RulesRequestContext
    let current: Tree
    let proposed: Tree
    var evaluator: Evaluator
    /// Whether `trace` is kept.
    let traced: Bool
    var trace: [RuleEvaluation] = []

    init(rules: Rules, context: RulesRequestContext, current: Tree, proposed: Tree, traced: Bool = true) {
        self.rules = rules
        self.context = context
        self.current = current
        self.proposed = proposed
        self.traced = traced
        self.evaluator = Evaluator(budget: rules.limits.evaluationBudget)
    }

    struct Denial: Error {
        let decision: Decision
    }

    func scope(_ location: Path, _ captures: [String: String], proposedNode: Tree? = nil) -> Scope {
        Scope(
            auth: context.auth, current: current, proposed: proposed, location: location, captures: captures, query: RulesQuery(), time: context.time,
            proposedNode: proposedNode)
    }

    /// Evaluates one rule; true/false (errors count as false), or a denial when the budget ran out.
    /// `proposedNode`: `proposed` at `location`, when the caller holds it.
    mutating func run(_ rule: Rule, at location: Path, _ captures: [String: String], proposedNode: Tree? = nil) -> Result<Bool, Denial> {
        do throws(EvaluationFailure) {
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
        do throws(EvaluationFailure) {
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

/// Key checks and ordering for rule locations, from the data model's own rules.
enum BanyanRulesKeys {
    static func problem(with key: String) -> String? { ChildKey.problem(with: key) }

    static func sorted(_ keys: [String]) -> [String] {
        keys.map { ChildKey(unchecked: $0) }.sorted().map(\.string)
    }
}
