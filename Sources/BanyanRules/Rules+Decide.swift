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
        var judge = Judge(rules: self, context: context, current: tree, proposed: nil, query: query, traced: true)
        return judge.grant(path, kind: .read)
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
    /// `written`: for a single target, `proposed` at it, when the caller holds that node (the
    /// state machine, which has just written it): the validation then does not descend to it.
    /// It must equal `proposed.child(at: targets[0])`; the decision is the same with or without it.
    public func decideWrite(
        targets: [Path], context: RulesRequestContext, current: Tree, proposed: Tree, written: Tree? = nil, traced: Bool = true
    ) -> Decision {
        var judge = Judge(rules: self, context: context, current: current, proposed: proposed, traced: traced)
        var first: Decision?
        for target in targets {
            let grant = judge.grant(target, kind: .write)
            guard grant.allowed else { return grant }
            if first == nil { first = grant }
        }
        if let denial = judge.validate(targets: targets, written: targets.count == 1 ? written : nil) { return denial }
        return Decision(allowed: true, reason: .granted, rule: first?.rule, location: first?.location ?? .root, trace: judge.trace)
    }
}

/// The walks of a decision over the compiled rules.
extension Judge {
    /// What running one rule gave.
    enum Outcome {
        case holds, fails, outOfBudget
    }

    /// Evaluates rule `index` at `location` (`here`: `proposed` there, when held); errors count as
    /// false.
    mutating func run(_ index: Int32, _ here: Here = .none) -> Outcome {
        do throws(EvaluationFailure) {
            let result = try evaluate(index, here)
            if traced { trace.append(RuleEvaluation(rule: program.references[Int(index)], location: path, result: result)) }
            if case .success(true) = result { return .holds }
            return .fails
        } catch {
            return .outOfBudget
        }
    }

    /// The denial when the budget ran out while rule `index` ran at `location`.
    func outOfBudget(_ index: Int32) -> Decision {
        Decision(allowed: false, reason: .budgetExceeded, rule: program.references[Int(index)], location: path, trace: trace)
    }

    /// The `.read` or `.write` that grants `target` (an allowing decision naming it), or the
    /// denial. Grants cascade: the first rule from the root down that holds decides.
    mutating func grant(_ target: Path, kind: RuleKind) -> Decision {
        location.removeAll(keepingCapacity: true)
        var node = 0
        /// The last rule that evaluated to false, and the depth it was at.
        var lastFalse: (rule: Int32, depth: Int)?
        while true {
            let here = program.nodes[node]
            let rule = kind == .read ? here.read : here.write
            if rule >= 0 {
                switch run(rule) {
                case .holds:
                    return Decision(allowed: true, reason: .granted, rule: program.references[Int(rule)], location: path, trace: trace)
                case .fails: lastFalse = (rule, location.count)
                case .outOfBudget: return outOfBudget(rule)
                }
            }
            guard location.count < target.count else { break }
            let key = target.segments[location.count]
            location.append(key)
            guard let child = program.child(of: node, key) else { break }
            node = child
        }
        let rule = lastFalse.map { program.references[Int($0.rule)] }
        let at = lastFalse.map { Path(segments: Array(target.segments.prefix($0.depth))) } ?? target
        return Decision(allowed: false, reason: .noRuleGranted, rule: rule, location: at, trace: trace)
    }

    /// Runs every `.validate` the write touches; the first failure denies.
    mutating func validate(targets: [Path], written: Tree? = nil) -> Decision? {
        if targets.count == 1, let target = targets.first { return validate(single: target, written: written) }
        guard let proposed else { return nil }
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
            guard let node = locate(ancestor) else { continue }
            let rule = program.nodes[node].validate
            guard rule >= 0, !proposed.child(at: ancestor).isEmpty else { continue }
            if let denial = check(rule) { return denial }
        }
        for target in targets.sorted() {
            guard let node = locate(target) else { continue }
            if let denial = walk(node, proposed.child(at: target)) { return denial }
        }
        return nil
    }

    /// `validate(targets:)` for one target (a set, or a one-entry update), in one descent: the
    /// same checks in the same order (ancestors from the root down, then the written subtree).
    /// The proposed data is descended to only as far as a rule needs it: to an ancestor with a
    /// `.validate`, and to the target unless `written` (the node there) is given.
    mutating func validate(single target: Path, written: Tree?) -> Decision? {
        guard var data = proposed else { return nil }
        /// How many keys of `location` `data` is at.
        var reached = 0
        location.removeAll(keepingCapacity: true)
        var node = 0
        for key in target.segments {
            let rule = program.nodes[node].validate
            if rule >= 0 {
                Judge.descend(&data, &reached, location)
                if !data.isEmpty, let denial = check(rule, Here(node: data, held: true)) { return denial }
            }
            guard let child = program.child(of: node, key) else { return nil }
            node = child
            location.append(key)
        }
        if let written { return walk(node, written) }
        Judge.descend(&data, &reached, location)
        return walk(node, data)
    }

    /// Moves `data`, the node at the first `reached` keys of `location`, down to all of them.
    static func descend(_ data: inout Tree, _ reached: inout Int, _ location: [ChildKey]) {
        while reached < location.count {
            if data.isEmpty {
                reached = location.count
                return
            }
            data = data.child(location[reached])
            reached += 1
        }
    }

    /// Validates `data` at `location` with `node`'s rules, then its children with theirs.
    mutating func walk(_ node: Int, _ data: Tree) -> Decision? {
        guard !data.isEmpty else { return nil }
        do throws(EvaluationFailure) {
            try charge()
        } catch {
            return Decision(allowed: false, reason: .budgetExceeded, rule: nil, location: path, trace: trace)
        }
        let here = program.nodes[node]
        if here.validate >= 0, let denial = check(here.validate, Here(node: data, held: true)) { return denial }
        var i = Int(here.namedStart)
        var named = 0
        while i < Int(here.namedEnd) {
            let key = program.namedKeys[i]
            let childData = data.child(key)
            if !childData.isEmpty {
                named += 1
                location.append(key)
                let denial = walk(Int(program.namedNodes[i]), childData)
                location.removeLast()
                if let denial { return denial }
            }
            i += 1
        }
        // The wildcard validates the children not named here; when every child is named, none.
        guard here.wildcard >= 0, data.childCount > named else { return nil }
        var denial: Decision?
        data.children.forEach { key, childData in
            guard denial == nil, program.named(here, key) == nil else { return }
            location.append(key)
            denial = walk(Int(here.wildcard), childData)
            location.removeLast()
        }
        return denial
    }

    mutating func check(_ rule: Int32, _ here: Here = .none) -> Decision? {
        switch run(rule, here) {
        case .holds: return nil
        case .fails: return Decision(allowed: false, reason: .validationFailed, rule: program.references[Int(rule)], location: path, trace: trace)
        case .outOfBudget: return outOfBudget(rule)
        }
    }

    /// Puts `location` at `path`; returns its rules' node (nil when no rule
    /// location matches it).
    mutating func locate(_ path: Path) -> Int? {
        location.removeAll(keepingCapacity: true)
        var node = 0
        for key in path.segments {
            guard let child = program.child(of: node, key) else { return nil }
            node = child
            location.append(key)
        }
        return node
    }
}

/// Key checks and ordering for rule locations, from the data model's own rules.
enum BanyanRulesKeys {
    static func problem(with key: String) -> String? { ChildKey.problem(with: key) }

    static func sorted(_ keys: [String]) -> [String] {
        keys.map { ChildKey(unchecked: $0) }.sorted().map(\.string)
    }
}
