import BanyanBasics
@testable import BanyanRules
import Foundation
import BanyanTree
import Testing

/// Goal: compiling the rules (`Program`, judged by `Judge`) changed the cost of a decision, not the
/// decision. Method: every request is decided by the compiled evaluator and by the evaluator as it
/// was before (`ReferenceEvaluator.swift`), and the two decisions must be equal: verdict, reason,
/// deciding rule, location and the whole trace. Documents: the conformance corpus, the bench's
/// rules (docs/examples), generated and mutated ones (the fuzz generators), under the standard
/// budget and small ones (so running out of budget happens at the same step).
@Suite struct CompiledRulesTests {
    static let root: String = {
        var parts = #filePath.split(separator: "/", omittingEmptySubsequences: false)
        parts.removeLast(3)
        return parts.joined(separator: "/")
    }()

    static func file(_ relative: String) -> String {
        guard let text = try? String(contentsOfFile: root + "/" + relative, encoding: .utf8) else {
            Issue.record("cannot read \(relative)")
            return ""
        }
        return text
    }

    static let auths: [JSONValue?] = [
        nil, user("alice"), user("bob"), user("carol", token: #"{"admin": true, "custom-role": "auditor"}"#), user("k"), user("c1"),
        try? JSONValue(parsing: #"{"uid": "k", "token": {"admin": true, "x-y": "z"}}"#),
    ]

    static let values = [
        "1", "-3", "2.5", "\"s\"", "\"tag:abc\"", "\"Alicia\"", "true", "null", #"{"a": {"b": 2}}"#, #"{"name": "Bob", "age": 41}"#,
        #"{"name": "Bob", "age": 2, "admin": true}"#, #"{"at": 1000, "by": "bob", "text": "yo"}"#, #"{"c": 1, "i": 2}"#, #"{"c": 1, "i": -2}"#,
        #"{"c": 1, "i": 2, "x": 3}"#, #"{"c": "1", "i": 2}"#, #"{"x": 13, "y": {"z": [1, 2]}}"#, #"{".value": 5, ".priority": 12}"#,
    ]

    static let paths = [
        "/", "users/bob", "users/alice", "users/alice/name", "users/bob/email", "messages/m2", "messages/m1", "vault", "vault/x", "public/a",
        "public/locked/b", "strings/abc", "numbers/4", "flags", "ranked", "teams/t1/members/carol", "teams/t1/owner", "shape", "ternary",
        "tombstones/a", "box", "box/x", "broken", "lower", "open-door", "bench/c1/k1", "bench/c1/k1/i", "bench/c2/k3", "x/k", "x/k/a/deep",
        "a/b", "dinosaurs/lambeosaurus", "scores/linhenykus",
    ]

    static let trees: [Tree] = {
        var out = [Corpus.tree, file("docs/examples/dinosaurs.json"), FuzzTests.data, #"{"bench": {"c1": {"k1": {"c": 1, "i": 1}}}}"#]
            .compactMap { try? Tree(json: $0) }
        out.append(.empty)
        return out
    }()

    /// Decides reads, sets and updates with both evaluators; returns how many requests were compared.
    @discardableResult
    static func compare(_ rules: Rules, _ label: String, random: inout SeededRandom, requests: Int) -> Int {
        var compared = 0
        for _ in 0..<requests {
            let auth = auths[random.below(auths.count)]
            let context = RulesRequestContext(auth: auth, time: random.chance(1, in: 2) ? testTime : 1_000)
            let tree = trees[random.below(trees.count)]
            let at = path(paths[random.below(paths.count)])
            let value = (try? Tree(json: values[random.below(values.count)])) ?? .empty
            let traced = random.chance(1, in: 3)

            let read = rules.decideRead(at: at, context: context, tree: tree)
            #expect(read == rules.referenceDecideRead(at: at, context: context, tree: tree), "\(label): read \(at)")
            var query = RulesQuery(orderBy: .child("owner"), equalTo: .string("alice"), limitToFirst: 10)
            if random.chance(1, in: 2) { query = RulesQuery(orderBy: .key, startAt: .string("a"), limitToLast: 3) }
            let queried = rules.decideRead(at: at, query: query, context: context, tree: tree)
            #expect(queried == rules.referenceDecideRead(at: at, query: query, context: context, tree: tree), "\(label): query \(at)")

            let write = WritePath(path: at)
            let set = rules.decideSet(value, at: write, context: context, tree: tree, traced: traced)
            let referenceSet = rules.referenceDecideSet(value, at: write, context: context, tree: tree, traced: traced)
            #expect(set == referenceSet, "\(label): set \(at)")

            // An update of two or three entries under a random location (several targets: the
            // ancestors' validation, then each written subtree).
            let base = path(paths[random.below(paths.count)])
            var entries: [UpdateEntry] = []
            for key in ["a", "name", "age", "x", "k1", "c"].shuffledPrefix(2 + random.below(2), &random) {
                let entryValue = (try? Tree(json: values[random.below(values.count)])) ?? .empty
                entries.append(UpdateEntry(path: WritePath(path: path(key)), value: entryValue))
            }
            let update = rules.decideUpdate(entries, at: base, context: context, tree: tree, traced: traced)
            #expect(update == rules.referenceDecideUpdate(entries, at: base, context: context, tree: tree, traced: traced), "\(label): update \(base)")
            compared += 4
        }
        return compared
    }

    static let budgets = [RulesLimits.standardEvaluationBudget, 3, 8, 20, 60]

    @Test("the conformance corpus and the bench's rules decide as before, under every budget")
    func examples() {
        var random = SeededRandom(seed: 16)
        for budget in CompiledRulesTests.budgets {
            var limits = RulesLimits.standard
            limits.evaluationBudget = budget
            for (name, text) in [("conformance", Corpus.rules), ("bench-rules", CompiledRulesTests.file("docs/examples/bench-rules.json"))] {
                let parsed = rules(text, limits: limits)
                CompiledRulesTests.compare(parsed, "\(name), budget \(budget)", random: &random, requests: 300)
            }
        }
    }

    /// The smallest budget under which `decide` does not run out (budgets are searched up to 4,096;
    /// a decision that runs out is monotonic in the budget). Equal smallest budgets mean equal steps.
    static func stepsNeeded(_ rules: Rules, _ decide: (Rules) -> Decision) -> Int {
        var low = 0
        var high = 4_096
        while low + 1 < high {
            let middle = (low + high) / 2
            var limits = rules.limits
            limits.evaluationBudget = middle
            let bounded = Rules(root: rules.root, limits: limits, text: rules.text)
            if decide(bounded).reason == .budgetExceeded { low = middle } else { high = middle }
        }
        return high
    }

    @Test("every decision charges the same steps as before", arguments: [Corpus.rules, CompiledRulesTests.file("docs/examples/bench-rules.json")])
    func steps(document: String) {
        var random = SeededRandom(seed: 26)
        let parsed = rules(document)
        for _ in 0..<150 {
            let auth = CompiledRulesTests.auths[random.below(CompiledRulesTests.auths.count)]
            let context = RulesRequestContext(auth: auth, time: testTime)
            let current = CompiledRulesTests.trees[random.below(CompiledRulesTests.trees.count)]
            let at = path(CompiledRulesTests.paths[random.below(CompiledRulesTests.paths.count)])
            let value = (try? Tree(json: CompiledRulesTests.values[random.below(CompiledRulesTests.values.count)])) ?? .empty
            let write = WritePath(path: at)
            let set = CompiledRulesTests.stepsNeeded(parsed) { $0.decideSet(value, at: write, context: context, tree: current) }
            let referenceSet = CompiledRulesTests.stepsNeeded(parsed) { $0.referenceDecideSet(value, at: write, context: context, tree: current) }
            #expect(set == referenceSet, "set \(at): \(set) steps against \(referenceSet)")
            let read = CompiledRulesTests.stepsNeeded(parsed) { $0.decideRead(at: at, context: context, tree: current) }
            let referenceRead = CompiledRulesTests.stepsNeeded(parsed) { $0.referenceDecideRead(at: at, context: context, tree: current) }
            #expect(read == referenceRead, "read \(at): \(read) steps against \(referenceRead)")
        }
    }

    @Test("the bench's own write is judged as before")
    func benchWrite() {
        let parsed = rules(CompiledRulesTests.file("docs/examples/bench-rules.json"))
        let current = tree(#"{"bench": {"c1": {"k0": {"c": 1, "i": 0}}, "c2": {"k0": {"c": 2, "i": 0}}}}"#)
        for (uid, body) in [("c1", #"{"c": 1, "i": 5}"#), ("c2", #"{"c": 1, "i": 5}"#), ("c1", #"{"c": 1, "i": 5, "z": 1}"#), ("c1", #"{"c": 1}"#)] {
            let decision = parsed.decideSet(tree(body), at: writePath("bench/c1/k7"), context: context(user(uid)), tree: current)
            let reference = parsed.referenceDecideSet(tree(body), at: writePath("bench/c1/k7"), context: context(user(uid)), tree: current)
            #expect(decision == reference, "\(uid) writes \(body)")
        }
    }

    @Test("generated documents decide as before", arguments: FuzzTests.seeds)
    func generated(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        var compared = 0
        for round in 0..<60 {
            let write = FuzzTests.expression(&random, depth: 4)
            let validate = FuzzTests.expression(&random, depth: 3)
            let inner = FuzzTests.expression(&random, depth: 2)
            let document = """
                {"rules": {"$x": {".write": "\(FuzzTests.escaped(write))", ".validate": "\(FuzzTests.escaped(validate))",
                  "a": {".validate": "\(FuzzTests.escaped(inner))", "b": {".write": true}},
                  "$y": {".read": true, ".validate": "\(FuzzTests.escaped(inner))"}}}}
                """
            var limits = RulesLimits.standard
            limits.evaluationBudget = CompiledRulesTests.budgets[round % CompiledRulesTests.budgets.count]
            guard let parsed = try? Rules.parse(document, limits: limits) else {
                Issue.record("seed \(seed): a generated document did not parse: \(document)")
                continue
            }
            compared += CompiledRulesTests.compare(parsed, "seed \(seed): \(document)", random: &random, requests: 12)
        }
        #expect(compared > 0)
    }

    @Test("mutated conformance documents decide as before", arguments: FuzzTests.seeds)
    func mutated(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        let original = Array(Corpus.rules.unicodeScalars)
        let inserts: [Unicode.Scalar] = ["!", "0", "a", "'", " ", "$", "("]
        var parsed = 0
        for _ in 0..<80 {
            var text = original
            let at = random.below(text.count)
            text.insert(inserts[random.below(inserts.count)], at: at)
            var document = ""
            document.unicodeScalars.append(contentsOf: text)
            guard let r = try? Rules.parse(document) else { continue }
            parsed += 1
            CompiledRulesTests.compare(r, "seed \(seed): mutation at \(at)", random: &random, requests: 10)
        }
        #expect(parsed > 0)
    }
}

extension Array {
    /// `count` distinct elements in a seeded random order.
    func shuffledPrefix(_ count: Int, _ random: inout SeededRandom) -> [Element] {
        var pool = self
        var out: [Element] = []
        while out.count < count, !pool.isEmpty { out.append(pool.remove(at: random.below(pool.count))) }
        return out
    }
}
