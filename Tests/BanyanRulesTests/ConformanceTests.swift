import BanyanRules
import BanyanTree
import Testing

/// The conformance corpus: one rules document exercising every construct of the language, an
/// initial tree, and cases (auth, path, operation, data, expected decision and deciding rule)
/// run through the offline case runner. The first block restates, in our own words, the examples
/// of Firebase's rules documentation: users own `/users/$uid`, string length validation,
/// `hasChildren`, timestamps against `now`, an allow-list under `root`, query-based reads and an
/// e-mail regex.
enum Corpus {
    static let rules = #"""
        {
          // Conformance rules: comments are allowed, as in Firebase rules files.
          "rules": {
            ".read": false,
            /* no .write at the root: writes are denied unless granted below */
            "users": {
              "$uid": {
                ".read": "auth != null && auth.uid == $uid",
                ".write": "auth != null && auth.uid === $uid",
                ".validate": "newData.hasChildren(['name', 'age'])",
                "name": { ".validate": "newData.isString() && newData.val().length < 100" },
                "age": { ".validate": "newData.isNumber() && newData.val() >= 0" },
                "email": { ".validate": "newData.val().matches(/^[A-Z0-9._%+-]+@[A-Z0-9.-]+\\.[A-Z]{2,}$/i)" },
                "$other": { ".validate": false }
              }
            },
            "messages": {
              "$id": {
                ".write": "!data.exists() && auth != null",
                ".validate": "newData.child('at').val() <= now && newData.child('by').val() == auth.uid"
              }
            },
            "allowed": { ".read": "auth.token.admin === true" },
            "vault": { ".write": "root.child('allowed').child(auth.uid).exists()", ".read": "root.child('allowed/' + auth.uid).val() == true" },
            "items": {
              ".read": "query.orderByChild == 'owner' && query.equalTo == auth.uid",
              ".indexOn": ["owner"]
            },
            "feed": {
              ".read": "query.orderByKey && query.limitToFirst <= 50 || query.orderByPriority && query.limitToLast != null && query.startAt === 'a'",
              ".indexOn": ".value"
            },
            "scores": {
              ".read": "query.orderByValue == true && query.startAt >= 0 && query.endAt <= 100 && query.equalTo == null",
              ".indexOn": ".value"
            },
            "public": { ".read": true, ".write": "auth != null", "locked": { ".write": false } },
            "strings": {
              "$s": {
                ".write": "newData.isString() && newData.val().beginsWith('tag:') && !newData.val().contains(' ') && newData.val().endsWith('!') == false && newData.val().replace('tag:', '').toUpperCase() == $s.toUpperCase()"
              }
            },
            "lower": { ".write": "newData.val().toLowerCase() == newData.val()" },
            "numbers": { "$n": { ".write": "newData.isNumber() && newData.val() % 2 == 0 && -newData.val() < 0 && newData.val() * 3 / 3 - 1 != 41" } },
            "flags": { ".write": "newData.isBoolean() && !data.isBoolean()" },
            "ranked": { ".write": "newData.getPriority() != null && newData.getPriority() >= 10" },
            "teams": {
              "$team": {
                "owner": { ".write": "auth.provider == 'password' && !data.exists()" },
                "members": {
                  "$member": { ".write": "data.parent().parent().child('owner').val() === auth.uid" }
                }
              }
            },
            "claims": { ".read": "auth.token['custom-role'] == 'auditor'" },
            "shape": { ".write": "newData.hasChildren() && newData.hasChild('a/b')" },
            "ternary": { ".write": "auth == null ? newData.val() == 'anon' : newData.val() == auth.uid" },
            "tombstones": { ".write": "!newData.exists()", ".validate": false },
            "box": { ".write": true, ".validate": "newData.child('x').val() !== 13" },
            "broken": { ".write": "newData.val().length > 2" },
            "$anything": { ".read": "$anything.beginsWith('open')" }
          }
        }
        """#

    static let tree = #"""
        {
          "users": { "alice": { "name": "Alice", "age": 30 } },
          "allowed": { "carol": true },
          "teams": { "t1": { "owner": "alice", "members": { "bob": true } } },
          "messages": { "m1": { "at": 1000, "by": "bob", "text": "hi" } },
          "items": { "i1": { "owner": "alice" } },
          "flags": true,
          "tombstones": { "a": 1 },
          "box": { "x": 1, "y": 2 }
        }
        """#

    static let cases = #"""
        [
          {"name": "users: a signed-in user writes their own profile", "auth": {"uid": "bob"}, "path": "/users/bob", "op": "set",
           "data": {"name": "Bob", "age": 41}, "expected": "allow", "rule": "/users/$uid/.write"},
          {"name": "users: nobody writes another user's profile", "auth": {"uid": "bob"}, "path": "/users/alice", "op": "set",
           "data": {"name": "Mallory", "age": 1}, "expected": "deny", "rule": "/users/$uid/.write"},
          {"name": "users: signed out, nothing grants", "path": "/users/bob", "op": "set", "data": {"name": "B", "age": 1},
           "expected": "deny", "rule": "/users/$uid/.write"},
          {"name": "users: reading your own profile", "auth": {"uid": "alice"}, "path": "/users/alice", "op": "read", "expected": "allow",
           "rule": "/users/$uid/.read"},
          {"name": "users: reading someone else's", "auth": {"uid": "bob"}, "path": "/users/alice/name", "op": "read", "expected": "deny"},
          {"name": "users: a name of 100 characters is too long", "auth": {"uid": "bob"}, "path": "/users/bob", "op": "set",
           "data": {"name": "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789", "age": 1},
           "expected": "deny", "rule": "/users/$uid/name/.validate"},
          {"name": "users: a name of 99 characters is fine", "auth": {"uid": "bob"}, "path": "/users/bob", "op": "set",
           "data": {"name": "012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678", "age": 1},
           "expected": "allow"},
          {"name": "users: a number as name", "auth": {"uid": "bob"}, "path": "/users/bob", "op": "set", "data": {"name": 5, "age": 1},
           "expected": "deny", "rule": "/users/$uid/name/.validate"},
          {"name": "users: both name and age are required", "auth": {"uid": "bob"}, "path": "/users/bob", "op": "set", "data": {"name": "Bob"},
           "expected": "deny", "rule": "/users/$uid/.validate"},
          {"name": "users: updating one field keeps the profile whole", "auth": {"uid": "alice"}, "path": "/users/alice/name", "op": "set",
           "data": "Alicia", "expected": "allow", "rule": "/users/$uid/.write"},
          {"name": "users: deleting a required field fails the parent's validation", "auth": {"uid": "alice"}, "path": "/users/alice/age",
           "op": "set", "data": null, "expected": "deny", "rule": "/users/$uid/.validate"},
          {"name": "users: deleting the whole profile is judged by .write only", "auth": {"uid": "alice"}, "path": "/users/alice",
           "op": "set", "data": null, "expected": "allow", "rule": "/users/$uid/.write"},
          {"name": "users: unknown fields are refused by $other", "auth": {"uid": "bob"}, "path": "/users/bob", "op": "set",
           "data": {"name": "Bob", "age": 2, "admin": true}, "expected": "deny", "rule": "/users/$uid/$other/.validate"},
          {"name": "users: a valid e-mail (case-insensitive regex)", "auth": {"uid": "bob"}, "path": "/users/bob", "op": "set",
           "data": {"name": "Bob", "age": 2, "email": "bob.smith+tag@mail.example.org"}, "expected": "allow"},
          {"name": "users: an invalid e-mail", "auth": {"uid": "bob"}, "path": "/users/bob", "op": "set",
           "data": {"name": "Bob", "age": 2, "email": "bob@localhost"}, "expected": "deny", "rule": "/users/$uid/email/.validate"},
          {"name": "users: a negative age", "auth": {"uid": "bob"}, "path": "/users/bob", "op": "update",
           "data": {"name": "Bob", "age": -1}, "expected": "deny", "rule": "/users/$uid/age/.validate"},

          {"name": "messages: a new message stamped in the past", "auth": {"uid": "bob"}, "path": "/messages/m2", "op": "set",
           "data": {"at": 1699999999999, "by": "bob", "text": "yo"}, "expected": "allow", "rule": "/messages/$id/.write"},
          {"name": "messages: a timestamp in the future", "auth": {"uid": "bob"}, "path": "/messages/m2", "op": "set",
           "data": {"at": 1700000000001, "by": "bob"}, "expected": "deny", "rule": "/messages/$id/.validate"},
          {"name": "messages: the same timestamp is fine at a later now", "auth": {"uid": "bob"}, "path": "/messages/m2", "op": "set",
           "now": 1700000000001, "data": {"at": 1700000000001, "by": "bob"}, "expected": "allow"},
          {"name": "messages: signed as someone else", "auth": {"uid": "bob"}, "path": "/messages/m2", "op": "set",
           "data": {"at": 1, "by": "alice"}, "expected": "deny", "rule": "/messages/$id/.validate"},
          {"name": "messages: a missing timestamp makes the rule an error, hence false", "auth": {"uid": "bob"}, "path": "/messages/m2",
           "op": "set", "data": {"by": "bob"}, "expected": "deny", "rule": "/messages/$id/.validate"},
          {"name": "messages: existing messages cannot be overwritten", "auth": {"uid": "bob"}, "path": "/messages/m1", "op": "set",
           "data": {"at": 1, "by": "bob"}, "expected": "deny", "rule": "/messages/$id/.write"},

          {"name": "vault: a user on the allow-list writes", "auth": {"uid": "carol"}, "path": "/vault/x", "op": "set", "data": 1,
           "expected": "allow", "rule": "/vault/.write"},
          {"name": "vault: a user off the allow-list", "auth": {"uid": "bob"}, "path": "/vault", "op": "set", "data": 1,
           "expected": "deny", "rule": "/vault/.write"},
          {"name": "vault: signed out, auth.uid is an error", "path": "/vault", "op": "set", "data": 1, "expected": "deny", "rule": "/vault/.write"},
          {"name": "vault: string concatenation in child()", "auth": {"uid": "carol"}, "path": "/vault", "op": "read", "expected": "allow",
           "rule": "/vault/.read"},
          {"name": "allowed: a token claim", "auth": {"uid": "x", "token": {"admin": true}}, "path": "/allowed", "op": "read",
           "expected": "allow", "rule": "/allowed/.read"},
          {"name": "allowed: a claim of the wrong type is not === true", "auth": {"uid": "x", "token": {"admin": "true"}}, "path": "/allowed",
           "op": "read", "expected": "deny", "rule": "/allowed/.read"},

          {"name": "items: a query for your own items", "auth": {"uid": "alice"}, "path": "/items", "op": "read",
           "query": {"orderByChild": "owner", "equalTo": "alice"}, "expected": "allow", "rule": "/items/.read"},
          {"name": "items: a query for someone else's", "auth": {"uid": "alice"}, "path": "/items", "op": "read",
           "query": {"orderByChild": "owner", "equalTo": "bob"}, "expected": "deny", "rule": "/items/.read"},
          {"name": "items: no query at all", "auth": {"uid": "alice"}, "path": "/items", "op": "read", "expected": "deny"},
          {"name": "feed: orderByKey with a small limit", "path": "/feed", "op": "read", "query": {"orderByKey": true, "limitToFirst": 50},
           "expected": "allow"},
          {"name": "feed: too large a limit", "path": "/feed", "op": "read", "query": {"orderByKey": true, "limitToFirst": 51},
           "expected": "deny"},
          {"name": "feed: by priority from 'a', last 3", "path": "/feed", "op": "read",
           "query": {"orderByPriority": true, "startAt": "a", "limitToLast": 3}, "expected": "allow"},

          {"name": "scores: by value within 0..100", "path": "/scores", "op": "read",
           "query": {"orderByValue": true, "startAt": 0, "endAt": 100}, "expected": "allow", "rule": "/scores/.read"},
          {"name": "scores: endAt beyond 100", "path": "/scores", "op": "read",
           "query": {"orderByValue": true, "startAt": 0, "endAt": 101}, "expected": "deny"},
          {"name": "scores: no endAt (null is not <= 100)", "path": "/scores", "op": "read",
           "query": {"orderByValue": true, "startAt": 0}, "expected": "deny"},
          {"name": "scores: ordered by key instead", "path": "/scores", "op": "read",
           "query": {"orderByKey": true, "startAt": 0, "endAt": 100}, "expected": "deny"},

          {"name": "public: reads cascade to any depth", "path": "/public/deep/down", "op": "read", "expected": "allow", "rule": "/public/.read"},
          {"name": "public: writes cascade and cannot be revoked below", "auth": {"uid": "u"}, "path": "/public/locked/x", "op": "set",
           "data": 1, "expected": "allow", "rule": "/public/.write"},
          {"name": "root: nothing grants; the last rule tried is reported", "path": "/nothing", "op": "read", "expected": "deny", "rule": "/$anything/.read"},
          {"name": "wildcard at the root: the capture is usable", "path": "/openhouse", "op": "read", "expected": "allow",
           "rule": "/$anything/.read"},

          {"name": "strings: every string method", "path": "/strings/abc", "op": "set", "data": "tag:ABC", "expected": "allow"},
          {"name": "strings: contains a space", "path": "/strings/abc", "op": "set", "data": "tag:a c", "expected": "deny"},
          {"name": "strings: ends with !", "path": "/strings/abc", "op": "set", "data": "tag:abc!", "expected": "deny"},
          {"name": "strings: wrong prefix", "path": "/strings/abc", "op": "set", "data": "abc", "expected": "deny"},
          {"name": "strings: val() of a number has no beginsWith: an error, so false", "path": "/strings/abc", "op": "set", "data": 5,
           "expected": "deny"},
          {"name": "lower: lower-case text", "path": "/lower", "op": "set", "data": "quiet", "expected": "allow"},
          {"name": "lower: upper-case text", "path": "/lower", "op": "set", "data": "Loud", "expected": "deny"},
          {"name": "numbers: a positive even number", "path": "/numbers/n", "op": "set", "data": 8, "expected": "allow"},
          {"name": "numbers: odd", "path": "/numbers/n", "op": "set", "data": 7, "expected": "deny"},
          {"name": "numbers: negative", "path": "/numbers/n", "op": "set", "data": -8, "expected": "deny"},
          {"name": "numbers: arithmetic (42 is excluded)", "path": "/numbers/n", "op": "set", "data": 42, "expected": "deny"},
          {"name": "flags: replacing a boolean with a boolean", "path": "/flags", "op": "set", "data": false, "expected": "deny"},
          {"name": "flags: a boolean where there was none", "path": "/flags/sub", "op": "set", "data": true, "expected": "deny",
           "rule": "/flags/.write"},
          {"name": "ranked: priority 10", "path": "/ranked", "op": "set", "data": {".value": "x", ".priority": 10}, "expected": "allow"},
          {"name": "ranked: priority 9", "path": "/ranked", "op": "set", "data": {".value": "x", ".priority": 9}, "expected": "deny"},
          {"name": "ranked: no priority", "path": "/ranked", "op": "set", "data": "x", "expected": "deny"},
          {"name": "ranked: a string priority cannot be compared with 10", "path": "/ranked", "op": "set",
           "data": {".value": "x", ".priority": "p"}, "expected": "deny"},

          {"name": "teams: the owner adds a member (parent())", "auth": {"uid": "alice"}, "path": "/teams/t1/members/carol", "op": "set",
           "data": true, "expected": "allow", "rule": "/teams/$team/members/$member/.write"},
          {"name": "teams: a member cannot add members", "auth": {"uid": "bob"}, "path": "/teams/t1/members/carol", "op": "set",
           "data": true, "expected": "deny"},
          {"name": "teams: claiming an unowned team with a password account", "auth": {"uid": "bob", "provider": "password"},
           "path": "/teams/t2/owner", "op": "set", "data": "bob", "expected": "allow"},
          {"name": "teams: an anonymous account cannot", "auth": {"uid": "bob", "provider": "anonymous"},
           "path": "/teams/t2/owner", "op": "set", "data": "bob", "expected": "deny"},
          {"name": "claims: a claim with a dash, read with []", "auth": {"uid": "c", "token": {"custom-role": "auditor"}}, "path": "/claims",
           "op": "read", "expected": "allow"},
          {"name": "shape: hasChildren() and hasChild(path)", "path": "/shape", "op": "set", "data": {"a": {"b": 1}}, "expected": "allow"},
          {"name": "shape: missing a/b", "path": "/shape", "op": "set", "data": {"a": {"c": 1}}, "expected": "deny"},
          {"name": "shape: a leaf has no children", "path": "/shape", "op": "set", "data": 1, "expected": "deny"},
          {"name": "ternary: signed out writes 'anon'", "path": "/ternary", "op": "set", "data": "anon", "expected": "allow"},
          {"name": "ternary: signed in writes their uid", "auth": {"uid": "zed"}, "path": "/ternary", "op": "set", "data": "zed",
           "expected": "allow"},
          {"name": "ternary: signed in writes 'anon'", "auth": {"uid": "zed"}, "path": "/ternary", "op": "set", "data": "anon",
           "expected": "deny"},
          {"name": "tombstones: deleting is judged by .write only", "path": "/tombstones", "op": "set", "data": null, "expected": "allow",
           "rule": "/tombstones/.write"},
          {"name": "tombstones: writing data is not", "path": "/tombstones/b", "op": "set", "data": 2, "expected": "deny"},
          {"name": "box: validate runs on the ancestor of a write", "path": "/box/x", "op": "set", "data": 13, "expected": "deny",
           "rule": "/box/.validate"},
          {"name": "box: a multi-path update, newData is the whole result", "path": "/box", "op": "update", "data": {"x": 5, "y": 13},
           "expected": "allow", "rule": "/box/.write"},
          {"name": "box: an update setting x to 13", "path": "/", "op": "update", "data": {"box/x": 13, "box/y": 5}, "expected": "deny",
           "rule": "/box/.validate"},
          {"name": "update: every path must be allowed", "auth": {"uid": "bob"}, "path": "/", "op": "update",
           "data": {"users/bob/name": "Bob", "users/bob/age": 3, "users/alice/age": 31}, "expected": "deny", "rule": "/users/$uid/.write"},
          {"name": "update: all paths allowed", "auth": {"uid": "bob"}, "path": "/", "op": "update",
           "data": {"users/bob/name": "Bob", "users/bob/age": 3, "public/note": "hi"}, "expected": "allow"},
          {"name": "update: overlapping paths are an invalid write", "auth": {"uid": "bob"}, "path": "/", "op": "update",
           "data": {"public": 1, "public/a": 2}, "expected": "deny", "rule": "none"},
          {"name": "broken: length of a number is an error, so false", "path": "/broken", "op": "set", "data": 12345, "expected": "deny",
           "rule": "/broken/.write"},
          {"name": "broken: length of a string", "path": "/broken", "op": "set", "data": "long", "expected": "allow"},
          {"name": "priority: writing to .priority is judged at the node", "auth": {"uid": "u"}, "path": "/public/p/.priority", "op": "set",
           "data": 4, "expected": "allow", "rule": "/public/.write"}
        ]
        """#

    static let time: Int64 = 1_700_000_000_000
}

@Suite struct ConformanceTests {
    @Test("every case of the conformance corpus decides as expected, with the expected rule")
    func corpus() throws {
        let parsed = rules(Corpus.rules)
        let runner = RulesCaseRunner(rules: parsed, tree: tree(Corpus.tree), time: Corpus.time)
        let report = try runner.run(casesJSON: Corpus.cases)
        for result in report.results where !result.passed { Issue.record("\(result.line)") }
        #expect(report.results.count >= 70)
        #expect(report.failed == 0)
        #expect(report.lines.last == "\(report.results.count) passed, 0 failed")
        // Both outcomes are represented in strength.
        let allows = report.results.filter { $0.decision?.allowed == true }.count
        #expect(allows >= 25 && report.results.count - allows >= 25)
    }

    @Test("the runner reports a wrong expectation and a wrong rule as failures")
    func runnerCatchesMismatches() throws {
        let runner = RulesCaseRunner(rules: rules(Corpus.rules), tree: tree(Corpus.tree), time: Corpus.time)
        let report = try runner.run(casesJSON: #"""
            [
              {"name": "flipped", "auth": {"uid": "bob"}, "path": "/users/bob", "op": "set", "data": {"name": "B", "age": 1}, "expected": "deny"},
              {"name": "wrong rule", "path": "/public/x", "op": "read", "expected": "allow", "rule": "/.read"},
              {"name": "bad op", "path": "/x", "op": "delete", "expected": "allow"},
              {"name": "bad field", "path": "/x", "op": "read", "expected": "allow", "extra": 1},
              {"name": "right", "path": "/public/x", "op": "read", "expected": "allow", "rule": "/public/.read"}
            ]
            """#)
        #expect(report.passed == 1)
        #expect(report.failed == 4)
        #expect(report.lines[0].hasPrefix("FAIL 1 flipped: expected deny, got allow by /users/$uid/.write"))
        #expect(report.lines[1] == "FAIL 2 wrong rule: expected rule /.read, decided by /public/.read [read /public/x]")
        #expect(report.lines[2] == "FAIL 3 bad op: invalid case: unknown op \"delete\" (read, set or update)")
        #expect(report.lines[3] == "FAIL 4 bad field: invalid case: unknown field \"extra\"")
        #expect(report.lines[4].hasPrefix("PASS 5 right: read /public/x: allow by /public/.read"))
        #expect(report.lines[5] == "1 passed, 4 failed")
    }

    @Test("a cases file that is not an array of cases is refused as a whole")
    func badCasesFile() {
        let runner = RulesCaseRunner(rules: Rules.allowAll, tree: .empty, time: 0)
        #expect(throws: RulesCaseRunner.FileError.self) { try runner.run(casesJSON: "{\"not\": \"an array\"}") }
        #expect(throws: RulesCaseRunner.FileError.self) { try runner.run(casesJSON: "[1,") }
    }
}
