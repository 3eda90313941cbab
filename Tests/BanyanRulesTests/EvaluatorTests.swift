import BanyanBasics
import BanyanRules
import BanyanTree
import Testing

@Suite struct EvaluatorTests {
    @Test("reads cascade down: a grant above covers below, a grant below does not cover above")
    func readCascade() {
        let r = rules(#"{"rules": {"a": {".read": "auth != null", "b": {".read": true, "c": {".read": false}}}}}"#)
        let signedOut = context(nil)
        #expect(!r.decideRead(at: path("a"), context: signedOut, tree: .empty).allowed)
        let below = r.decideRead(at: path("a/b/c/d"), context: signedOut, tree: .empty)
        #expect(below.allowed)
        #expect(below.rule?.description == "/a/b/.read")
        #expect(below.location == path("a/b"))
        let signedIn = r.decideRead(at: path("a/b/c"), context: context(user("u")), tree: .empty)
        #expect(signedIn.rule?.description == "/a/.read")
        #expect(signedIn.trace.map(\.description) == ["/a/.read at /a: true"])
        // No rule at all: denied, no rule to blame.
        let none = r.decideRead(at: path("z"), context: signedOut, tree: .empty)
        #expect(!none.allowed && none.rule == nil && none.reason == .noRuleGranted)
    }

    @Test("writes cascade; .validate does not, and is skipped where the new data is null")
    func writeCascadeAndValidate() {
        let r = rules(#"""
            {"rules": {
              "a": {".write": true, ".validate": "newData.hasChildren()",
                    "n": {".validate": "newData.isNumber()"},
                    "deep": {"x": {".validate": "newData.val() > 0"}}}
            }}
            """#)
        let current = tree(#"{"a": {"n": 1, "s": "x"}}"#)
        func set(_ json: String, _ at: String) -> Decision {
            r.decideSet(tree(json), at: writePath(at), context: context(nil), tree: current)
        }
        #expect(set("2", "a/n").allowed)
        let bad = set("\"two\"", "a/n")
        #expect(!bad.allowed && bad.reason == .validationFailed && bad.rule?.description == "/a/n/.validate" && bad.location == path("a/n"))
        // The ancestor's validation runs on its new value: a leaf at /a has no children.
        #expect(set("5", "a").rule?.description == "/a/.validate")
        // Deleting /a entirely: .validate at /a is skipped (null), .write decides.
        #expect(set("null", "a").allowed)
        // Deleting /a/n keeps /a non-null and valid.
        #expect(set("null", "a/n").allowed)
        // Deep validation of written data.
        #expect(!set(#"{"deep": {"x": -1}}"#, "a").allowed)
        #expect(set(#"{"deep": {"x": 1}}"#, "a").allowed)
        // A write below a location without .write: still granted by the ancestor.
        #expect(set("1", "a/deep/x").rule?.description == "/a/.write")
    }

    @Test("data is the current value, newData the value after the write, root the current root")
    func snapshots() {
        let r = rules(#"""
            {"rules": {"counter": {".write": "newData.val() == data.val() + 1 && root.child('enabled').val() == true && newData.parent().child('enabled').exists()"}}}
            """#)
        let current = tree(#"{"counter": 4, "enabled": true}"#)
        #expect(r.decideSet(tree("5"), at: writePath("counter"), context: context(nil), tree: current).allowed)
        #expect(!r.decideSet(tree("6"), at: writePath("counter"), context: context(nil), tree: current).allowed)
        #expect(!r.decideSet(tree("1"), at: writePath("counter"), context: context(nil), tree: tree(#"{"counter": 0}"#)).allowed)
    }

    @Test("an update is allowed only when every path is, with newData from the whole update")
    func update() throws {
        let r = rules(#"""
            {"rules": {"$k": {".write": "newData.parent().child('a').val() == newData.parent().child('b').val()"}}}
            """#)
        let both = [UpdateEntry(path: writePath("a"), value: tree("1")), UpdateEntry(path: writePath("b"), value: tree("1"))]
        #expect(r.decideUpdate(both, at: .root, context: context(nil), tree: .empty).allowed)
        let one = [UpdateEntry(path: writePath("a"), value: tree("1"))]
        #expect(!r.decideUpdate(one, at: .root, context: context(nil), tree: .empty).allowed)
        let overlap = [UpdateEntry(path: writePath("a"), value: tree("1")), UpdateEntry(path: writePath("a/b"), value: tree("1"))]
        let invalid = r.decideUpdate(overlap, at: .root, context: context(nil), tree: .empty)
        guard case .invalidWrite = invalid.reason else {
            Issue.record("expected an invalid write, got \(invalid)")
            return
        }
        #expect(!invalid.allowed)
    }

    @Test("run-time errors make the expression false, not the whole decision")
    func errorsAreFalse() {
        let r = rules(#"""
            {"rules": {"x": {
              ".write": "newData.val().length > 3 || newData.val() == 7",
              ".read": "auth.uid == 'a' || true"
            }}}
            """#)
        // 7 has no length: the left side is an error, so the whole expression is false (Firebase
        // does not go on to the right side of a failed expression).
        let d = r.decideSet(tree("7"), at: writePath("x"), context: context(nil), tree: .empty)
        #expect(!d.allowed)
        guard case .failure(let failure)? = d.trace.last?.result else {
            Issue.record("expected an error in the trace: \(d.trace)")
            return
        }
        #expect(failure.message.contains("length"))
        #expect(r.decideSet(tree("\"long\""), at: writePath("x"), context: context(nil), tree: .empty).allowed)
        // auth.uid with auth null: error, false.
        #expect(!r.decideRead(at: path("x"), context: context(nil), tree: .empty).allowed)
        #expect(r.decideRead(at: path("x"), context: context(user("b")), tree: .empty).allowed)
    }

    @Test("a non-boolean result at run time is false")
    func nonBooleanIsFalse() {
        let r = rules(#"{"rules": {".read": "auth.admin"}}"#)
        #expect(!r.decideRead(at: .root, context: context(try? JSONValue(parsing: #"{"admin": "yes"}"#)), tree: .empty).allowed)
        #expect(r.decideRead(at: .root, context: context(try? JSONValue(parsing: #"{"admin": true}"#)), tree: .empty).allowed)
    }

    @Test("equality has no coercion; numbers compare by value; strings order by UTF-16")
    func equalityAndOrder() {
        let r = rules(#"{"rules": {"x": {".write": "newData.child('a').val() == newData.child('b').val()"}, "y": {".write": "newData.child('a').val() < newData.child('b').val()"}}}"#)
        func x(_ json: String) -> Bool { r.decideSet(tree(json), at: writePath("x"), context: context(nil), tree: .empty).allowed }
        func y(_ json: String) -> Bool { r.decideSet(tree(json), at: writePath("y"), context: context(nil), tree: .empty).allowed }
        #expect(x(#"{"a": 1, "b": 1.0}"#))
        #expect(!x(#"{"a": 1, "b": "1"}"#))
        #expect(!x(#"{"a": true, "b": "true"}"#))
        #expect(x(#"{"a": "s", "b": "s"}"#))
        #expect(y(#"{"a": "B", "b": "a"}"#))
        #expect(y(#"{"a": -1, "b": 0}"#))
        #expect(!y(#"{"a": 1, "b": "2"}"#))
    }

    @Test("the evaluation budget denies with a typed reason")
    func budget() {
        var small = RulesLimits.standard
        small.evaluationBudget = 200
        let heavy = "newData.val().matches(/^(a|b|c|d)*e$/)"
        let r = rules(oneRule(".write", heavy), limits: small)
        let long = "\"" + String(repeating: "abcd", count: 5_000) + "\""
        let d = r.decideSet(tree(long), at: writePath("x"), context: context(nil), tree: .empty)
        #expect(!d.allowed)
        #expect(d.reason == .budgetExceeded)
        #expect(d.rule?.description == "/x/.write")
        // The same rule within the budget decides normally.
        #expect(r.decideSet(tree("\"abcde\""), at: writePath("x"), context: context(nil), tree: .empty).allowed)
        // Validation walks over many children are charged too.
        let wide = rules(#"{"rules": {".write": true, "$a": {".validate": "newData.isNumber()"}}}"#, limits: small)
        var children: [String] = []
        for i in 0..<500 { children.append("\"k\(i)\": \(i)") }
        let big = tree("{" + children.joined(separator: ",") + "}")
        #expect(wide.decideSet(big, at: writePath("/"), context: context(nil), tree: .empty).reason == .budgetExceeded)
        #expect(rules(#"{"rules": {".write": true, "$a": {".validate": "newData.isNumber()"}}}"#).decideSet(big, at: writePath("/"), context: context(nil), tree: .empty).allowed)
        // Quadratic substring search is charged per comparison.
        let search = rules(oneRule(".write", "newData.val().contains('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab')"), limits: small)
        #expect(search.decideSet(tree(long.replacingA()), at: writePath("x"), context: context(nil), tree: .empty).reason == .budgetExceeded)
    }

    /// Goal: the decision is a pure function of (rules, tree, auth, now, request). Method: decide
    /// the same seeded requests twice, from separately parsed rules, and compare everything,
    /// trace included.
    @Test("decisions are deterministic")
    func determinism() {
        let seed = UInt64(0x5EED_0016)
        var random = SeededRandom(seed: seed)
        let a = rules(Corpus.rules)
        let b = rules(Corpus.rules)
        let current = tree(Corpus.tree)
        let uids = ["alice", "bob", "carol", "zed"]
        let locations = ["users/bob", "users/alice/name", "messages/m9", "vault/x", "teams/t1/members/q", "box/x", "numbers/n", "strings/abc", "public/a"]
        let values = ["1", "8", "\"tag:ABC\"", "{\"name\": \"B\", \"age\": 2}", "{\"at\": 5, \"by\": \"bob\"}", "null", "true"]
        for _ in 0..<300 {
            let auth = random.chance(1, in: 4) ? nil : user(uids[random.below(uids.count)])
            let at = locations[random.below(locations.count)]
            let value = tree(values[random.below(values.count)])
            let time = Int64(random.below(3)) + testTime - 1
            let d1 = a.decideSet(value, at: writePath(at), context: context(auth, time: time), tree: current)
            let d2 = b.decideSet(value, at: writePath(at), context: context(auth, time: time), tree: current)
            #expect(d1 == d2, "seed \(seed)")
            let r1 = a.decideRead(at: path(at), context: context(auth, time: time), tree: current)
            let r2 = b.decideRead(at: path(at), context: context(auth, time: time), tree: current)
            #expect(r1 == r2, "seed \(seed)")
        }
    }

    @Test("named children take precedence over the wildcard, whose capture binds the key")
    func wildcards() {
        let r = rules(#"""
            {"rules": {"rooms": {
              "lobby": {".write": true},
              "$room": {".write": "$room.length == 3", "$msg": {".write": "$msg == $room + '-1'"}}
            }}}
            """#)
        func w(_ at: String) -> Decision { r.decideSet(tree("1"), at: writePath(at), context: context(nil), tree: .empty) }
        #expect(w("rooms/lobby").rule?.description == "/rooms/lobby/.write")
        #expect(w("rooms/abc").allowed)
        #expect(!w("rooms/abcd").allowed)
        #expect(w("rooms/abcd/abcd-1").rule?.description == "/rooms/$room/$msg/.write")
        #expect(!w("rooms/abcd/abcd-2").allowed)
        // The lobby's children are not under the wildcard.
        #expect(!w("rooms/lobby2/x").allowed)
    }
}

extension String {
    /// The same length of `a`s (a haystack that defeats naive search).
    func replacingA() -> String { "\"" + String(repeating: "a", count: count - 2) + "\"" }
}
