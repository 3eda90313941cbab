public import BanyanTree

/// The offline rules tester (what `banyan rules test RULES CASES` will run, like the Firebase
/// simulator): a JSON array of cases, each judged against the rules and one initial tree.
///
/// A case is an object:
///
/// ```json
/// {"name": "owner writes", "auth": {"uid": "alice"}, "path": "/users/alice", "op": "set",
///  "data": {"name": "Alice"}, "expected": "allow", "rule": "/users/$uid/.write"}
/// ```
///
/// - `op`: `read`, `set` or `update` (for `update`, `data` is an object of relative paths to
///   values, as in a REST `PATCH`).
/// - `auth`: null (signed out, the default) or the auth object (`uid`, `provider`, `token`).
/// - `query` (reads only): `orderByChild` (a path), `orderByKey`/`orderByValue`/`orderByPriority`
///   (true), `startAt`/`endAt`/`equalTo` (a JSON primitive), `limitToFirst`/`limitToLast`.
/// - `now` (optional): milliseconds; otherwise the runner's time.
/// - `rule` (optional): the rule expected to decide, as `Decision.rule` prints it (`/.read`,
///   `/users/$uid/.write`, or `none` when no rule applied).
///
/// Cases are independent: each starts from the initial tree (an allowed write is not applied).
public struct RulesCaseRunner: Sendable {
    public let rules: Rules
    public let tree: Tree
    /// `now` for cases that don't give their own.
    public let time: Int64

    public init(rules: Rules, tree: Tree, time: Int64) {
        self.rules = rules
        self.tree = tree
        self.time = time
    }

    /// The cases file is not a JSON array of objects.
    public struct FileError: Error, Sendable, Equatable, CustomStringConvertible {
        public let message: String
        public var description: String { message }
    }

    /// Runs every case of `casesJSON`; throws only when the file as a whole is unreadable (a bad
    /// single case is reported as a failing line).
    public func run(casesJSON: String) throws(FileError) -> CaseReport {
        let document: JSONValue
        do {
            document = try JSONValue(parsing: casesJSON)
        } catch {
            throw FileError(message: "cases file: \(error)")
        }
        guard case .array(let cases) = document else { throw FileError(message: "cases file: expected a JSON array of cases") }
        var results: [CaseResult] = []
        for (index, item) in cases.enumerated() {
            results.append(run(item, number: index + 1))
        }
        return CaseReport(results: results)
    }

    /// Runs one case (number is 1-based, for the report).
    public func run(_ item: JSONValue, number: Int) -> CaseResult {
        let name: String
        if case .string(let n)? = item["name"] { name = n } else { name = "case \(number)" }
        switch prepare(item) {
        case .failure(let problem):
            return CaseResult(number: number, name: name, passed: false, decision: nil, line: "FAIL \(number) \(name): invalid case: \(problem.message)")
        case .success(let request):
            let decision = request.decide(rules, tree)
            var problems: [String] = []
            if decision.allowed != request.expectAllow {
                problems.append("expected \(request.expectAllow ? "allow" : "deny"), got \(decision)")
            }
            if let expectedRule = request.expectedRule {
                let actual = decision.rule?.description ?? "none"
                if actual != expectedRule { problems.append("expected rule \(expectedRule), decided by \(actual)") }
            }
            let what = "\(request.summary): \(decision)"
            if problems.isEmpty {
                return CaseResult(number: number, name: name, passed: true, decision: decision, line: "PASS \(number) \(name): \(what)")
            }
            return CaseResult(
                number: number, name: name, passed: false, decision: decision,
                line: "FAIL \(number) \(name): \(problems.joined(separator: "; ")) [\(request.summary)]"
            )
        }
    }

    struct Problem: Error {
        let message: String
    }

    struct Request {
        let summary: String
        let expectAllow: Bool
        let expectedRule: String?
        let decide: (Rules, Tree) -> Decision
    }

    func prepare(_ item: JSONValue) -> Result<Request, Problem> {
        guard case .object = item else { return .failure(Problem(message: "a case must be an object")) }
        let known: Set<String> = ["name", "auth", "path", "op", "data", "query", "now", "expected", "rule"]
        if case .object(let members) = item, let unknown = members.first(where: { !known.contains($0.0) }) {
            return .failure(Problem(message: "unknown field \"\(unknown.0)\""))
        }
        guard case .string(let pathText)? = item["path"] else { return .failure(Problem(message: "missing \"path\"")) }
        guard case .string(let op)? = item["op"] else { return .failure(Problem(message: "missing \"op\" (read, set or update)")) }
        let expectAllow: Bool
        switch item["expected"] {
        case .string("allow")?: expectAllow = true
        case .string("deny")?: expectAllow = false
        default: return .failure(Problem(message: "\"expected\" must be \"allow\" or \"deny\""))
        }
        var expectedRule: String?
        switch item["rule"] {
        case nil, .null?: expectedRule = nil
        case .string(let r)?: expectedRule = r
        default: return .failure(Problem(message: "\"rule\" must be a string"))
        }
        let auth: JSONValue?
        switch item["auth"] {
        case nil, .null?: auth = nil
        case .object(let members)?: auth = .object(members)
        default: return .failure(Problem(message: "\"auth\" must be null or an object"))
        }
        var caseTime = time
        switch item["now"] {
        case nil: break
        case .int(let t)?: caseTime = t
        default: return .failure(Problem(message: "\"now\" must be an integer (milliseconds)"))
        }
        let context = RulesRequestContext(auth: auth, time: caseTime)
        let data = item["data"] ?? .null
        let summary = "\(op) \(pathText)"
        switch op {
        case "read":
            guard let path = try? Path(parsing: pathText) else { return .failure(Problem(message: "invalid path \(pathText)")) }
            let query: RulesQuery
            switch RulesCaseRunner.query(item["query"]) {
            case .success(let q): query = q
            case .failure(let p): return .failure(p)
            }
            return .success(
                Request(summary: summary, expectAllow: expectAllow, expectedRule: expectedRule) { rules, tree in
                    rules.decideRead(at: path, query: query, context: context, tree: tree)
                })
        case "set":
            guard let path = try? WritePath(parsing: pathText) else { return .failure(Problem(message: "invalid path \(pathText)")) }
            guard let value = try? Tree(json: data.jsonString) else { return .failure(Problem(message: "invalid data")) }
            return .success(
                Request(summary: summary, expectAllow: expectAllow, expectedRule: expectedRule) { rules, tree in
                    rules.decideSet(value, at: path, context: context, tree: tree)
                })
        case "update":
            guard let location = try? Path(parsing: pathText) else { return .failure(Problem(message: "invalid path \(pathText)")) }
            guard case .object(let members) = data, !members.isEmpty else {
                return .failure(Problem(message: "an update's data must be a non-empty object of paths to values"))
            }
            var entries: [UpdateEntry] = []
            for (key, value) in members {
                guard let entryPath = try? WritePath(parsing: key) else { return .failure(Problem(message: "invalid update path \(key)")) }
                guard let tree = try? Tree(json: value.jsonString) else { return .failure(Problem(message: "invalid data at \(key)")) }
                entries.append(UpdateEntry(path: entryPath, value: tree))
            }
            return .success(
                Request(summary: summary, expectAllow: expectAllow, expectedRule: expectedRule) { rules, tree in
                    rules.decideUpdate(entries, at: location, context: context, tree: tree)
                })
        default:
            return .failure(Problem(message: "unknown op \"\(op)\" (read, set or update)"))
        }
    }

    static func query(_ value: JSONValue?) -> Result<RulesQuery, Problem> {
        guard let value, value != .null else { return .success(RulesQuery()) }
        guard case .object(let members) = value else { return .failure(Problem(message: "\"query\" must be an object")) }
        var q = RulesQuery()
        for (key, v) in members {
            switch (key, v) {
            case ("orderByChild", .string(let p)): q.orderBy = .child(p)
            case ("orderByKey", .bool(true)): q.orderBy = .key
            case ("orderByValue", .bool(true)): q.orderBy = .value
            case ("orderByPriority", .bool(true)): q.orderBy = .priority
            case ("startAt", _), ("endAt", _), ("equalTo", _):
                let leaf: Leaf?
                switch v {
                case .null: leaf = nil
                case .bool(let b): leaf = .bool(b)
                case .int(let i): leaf = .int(i)
                case .double(let d): leaf = .double(d)
                case .string(let s): leaf = .string(s)
                default: return .failure(Problem(message: "query \(key) must be a JSON primitive"))
                }
                if key == "startAt" { q.startAt = leaf } else if key == "endAt" { q.endAt = leaf } else { q.equalTo = leaf }
            case ("limitToFirst", .int(let n)) where n >= 0 && n <= Int64(Int32.max): q.limitToFirst = Int(n)
            case ("limitToLast", .int(let n)) where n >= 0 && n <= Int64(Int32.max): q.limitToLast = Int(n)
            default: return .failure(Problem(message: "unsupported query parameter \(key)"))
            }
        }
        return .success(q)
    }
}

/// One case's outcome.
public struct CaseResult: Sendable {
    public let number: Int
    public let name: String
    public let passed: Bool
    /// Nil when the case itself was malformed.
    public let decision: Decision?
    /// The report line: `PASS n name: …` or `FAIL n name: …`.
    public let line: String
}

/// Every case's outcome, in file order.
public struct CaseReport: Sendable {
    public let results: [CaseResult]

    public var passed: Int { results.filter(\.passed).count }
    public var failed: Int { results.count - passed }
    public var lines: [String] { results.map(\.line) + ["\(passed) passed, \(failed) failed"] }
}
