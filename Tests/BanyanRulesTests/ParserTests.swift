import BanyanRules
import BanyanTree
import Testing

@Suite struct ParserTests {
    @Test("a document with comments, wildcards, .indexOn and boolean or string rules")
    func wellFormed() throws {
        let parsed = try Rules.parse(#"""
            // line comment before the document
            {
              /* block comment
                 over two lines */
              "rules": {
                ".read": "auth != null", // trailing comment
                ".write": false,
                "users": {
                  ".indexOn": ["age", "name"],
                  "$uid": { ".write": "$uid === auth.uid", ".validate": true, "x": {".read": "'//' != '/*'"} }
                },
                "logs": { ".indexOn": ".value" }
              }
            }
            """#)
        #expect(parsed.root.read?.line == 6)
        #expect(parsed.root.read?.column == 14)
        #expect(parsed.root.write?.reference.description == "/.write")
        let users = try #require(parsed.root.namedChild("users"))
        #expect(users.indexOn == ["age", "name"])
        #expect(users.wildcardName == "$uid")
        let uid = try #require(users.wildcardChild)
        #expect(uid.write?.reference.description == "/users/$uid/.write")
        #expect(uid.namedChild("x")?.read?.reference.description == "/users/$uid/x/.read")
        #expect(parsed.root.namedChild("logs")?.indexOn == [".value"])
        #expect(parsed.root.namedChildren == ["logs", "users"])
        #expect(parsed.text.hasPrefix("// line comment"))
    }

    /// (document, code, line, column, a fragment of the message)
    static let errors: [(String, RulesError.Code, Int, Int, String)] = [
        (#"{"rules": {".read": "auth.uid ==" }}"#, .expression, 1, 33, "end of expression"),
        ("{\n  \"rules\": {\n    \"users\": {\n      \"$uid\": {\n        \".write\": \"$uid.val() == 1\"\n      }\n    }\n  }\n}", .type, 5, 25,
         "not a method of a string"),
        ("{\n  // reads\n  \"rules\": {\n    \".read\": \"newData.exists()\"\n  }\n}", .type, 4, 15, "newData is not available in .read"),
        ("{\"rules\": {\n  \"a\": {\".write\": \"foo == 1\"}}}", .type, 2, 20, "Unknown variable 'foo'"),
        (#"{"rules": {"a": {"$x": {}, ".write": "$x == '1'"}}}"#, .type, 1, 39, "Unknown variable '$x'"),
        ("{\"rules\": {\n\t\".write\": \"1 + 2\"}}", .type, 2, 13, "must be boolean"),
        (#"{"rules": {"a": {".wrte": true}}}"#, .syntax, 1, 18, "Unknown rule key \".wrte\""),
        ("{\"rules\": {\n  \"$a\": {},\n  \"$b\": {}\n}}", .syntax, 3, 3, "only one wildcard child; $a is at 2:3"),
        ("{\"rules\": {\n  \"a\": {\".read\": true}\n  \"b\": {}\n}}", .syntax, 3, 3, "Expected ',' or '}'"),
        (#"{"rules": {}} /* never closed"#, .syntax, 1, 15, "Unterminated /* comment"),
        (#"{"rules": {".read": "\"a\\\"\" == auth.nme.x.val()"}}"#, .type, 1, 46, "val() is a snapshot method"),
        (#"{"rules": {".write": "newData.val().matches(/a(b/)"}}"#, .regex, 1, 47, "Unterminated group"),
        (#"{"rules": {".write": "newData.val() + 1 == true && data.exists"}}"#, .type, 1, 57, "call it as exists()"),
        (#"{"rules": {".write": 1}}"#, .syntax, 1, 22, "must be a boolean or an expression string"),
        (#"{"rules": {".write": "data.val() == 'x"}}"#, .expression, 1, 37, "Unterminated string literal"),
        (#"{"rules": {".write": "data.val() = 1"}}"#, .expression, 1, 34, "Unexpected character '='"),
        (#"{"rules": {".write": "data.child(1).exists()"}}"#, .type, 1, 34, "needs a string argument"),
        (#"{"rules": {".write": "data.hasChildren('a')"}}"#, .type, 1, 40, "takes a list literal"),
        (#"{"rules": {".write": "newData.val().matches('a')"}}"#, .type, 1, 45, "regular expression literal"),
        (#"{"rules": {".write": "newData.val().matches(/a/g)"}}"#, .regex, 1, 45, "Unsupported regular expression flag 'g'"),
        (#"{"rules": {".write": "query.limitToFirst == 1"}}"#, .type, 1, 23, "query is only available in .read"),
        (#"{"rules": {".read": "query.limit == 1"}}"#, .type, 1, 28, "query has no property 'limit'"),
        (#"{"rules": {".read": "now < 'x'"}}"#, .type, 1, 26, "compares two numbers or two strings"),
        (#"{"rules": {".read": "data == null"}}"#, .type, 1, 27, "cannot be compared"),
        (#"{"rules": {".read": "!5"}}"#, .type, 1, 22, "'!' needs a boolean"),
        (#"{"rules": {".read": "auth.uid.foo()"}}"#, .type, 1, 31, "no method 'foo'"),
        (#"{"rules": {".read": "(1 < 2"}}"#, .expression, 1, 28, "Expected ')'"),
        (#"{"rules": {".read": ""}}"#, .expression, 1, 22, "Empty expression"),
        (#"{"rules": {"a/b": {}}}"#, .syntax, 1, 12, "Invalid key \"a/b\""),
        (#"{"rules": {"$": {}}}"#, .syntax, 1, 12, "Invalid wildcard name"),
        (#"{"rules": {"$a": {"$a": {}}}}"#, .syntax, 1, 19, "already used by an enclosing location"),
        (#"{"rules": {"a": true}}"#, .syntax, 1, 17, "must be an object"),
        (#"{"rules": {}, "other": 1}"#, .syntax, 1, 15, "Unexpected top-level key"),
        (#"{"rulez": {}}"#, .syntax, 1, 1, "Missing the \"rules\" key"),
        (#"{"rules": {"a": {}, "a": {}}}"#, .syntax, 1, 21, "Duplicate key \"a\""),
        (#"{"rules": {".indexOn": 5}}"#, .syntax, 1, 24, ".indexOn must be a string or an array"),
        (#"{"rules": {".read": "auth.uid"}}"#, .type, 1, 22, "must be boolean"),
        (#"[]"#, .syntax, 1, 1, "an object with one key"),
        (#"{"rules": {".read": true}} x"#, .syntax, 1, 28, "after the end of the document"),
    ]

    @Test("errors carry their code, line, column and message", arguments: 0..<ParserTests.errors.count)
    func error(_ index: Int) {
        let (document, code, line, column, fragment) = ParserTests.errors[index]
        guard let error = rulesError(document) else { return }
        #expect(error.code == code, "\(document)")
        #expect(error.line == line && error.column == column, "\(document): got \(error)")
        #expect(error.message.contains(fragment), "\(document): got \(error)")
        #expect(error.description.hasPrefix("\(error.line):\(error.column): "))
    }

    @Test("limits are errors with the limit code, never crashes")
    func limits() {
        // Document size.
        var small = RulesLimits.standard
        small.maxDocumentBytes = 40
        #expect(rulesError(#"{"rules": {".read": "auth != null && auth.uid == 'x'"}}"#, limits: small)?.code == .limit)
        // JSON nesting: 40 nested locations.
        let deep = "{\"rules\": " + String(repeating: "{\"a\": ", count: 40) + "{}" + String(repeating: "}", count: 41)
        #expect(rulesError(deep)?.code == .limit)
        // A very deep document does not overflow the stack.
        let deeper = String(repeating: "[", count: 100_000)
        #expect(rulesError(deeper)?.code == .limit)
        // Expression length.
        let long = String(repeating: "true && ", count: 600) + "true"
        #expect(rulesError(oneRule(".read", long))?.code == .limit)
        // Expression depth, by parentheses and by unary operators.
        let parens = String(repeating: "(", count: 200) + "true" + String(repeating: ")", count: 200)
        #expect(rulesError(oneRule(".read", parens))?.code == .limit)
        let nots = String(repeating: "!", count: 300) + "true"
        #expect(rulesError(oneRule(".read", nots))?.code == .limit)
        let chain = String(repeating: "true && ", count: 200) + "true"
        #expect(rulesError(oneRule(".read", chain))?.code == .limit)
        let sums = "now" + String(repeating: "+1", count: 300) + " > 0"
        #expect(rulesError(oneRule(".read", sums))?.code == .limit)
        let calls = "data" + String(repeating: ".parent()", count: 200) + ".exists()"
        #expect(rulesError(oneRule(".read", calls))?.code == .limit)
        // RulesRegex program size: counted repetition expands.
        #expect(rulesError(oneRule(".write", "newData.val().matches(/(abcdef){1000}/)"))?.code == .limit)
        #expect(rulesError(oneRule(".write", "newData.val().matches(/a{1000000}/)"))?.code == .limit)
        // Within the limits, the same shapes parse.
        _ = rules(oneRule(".read", String(repeating: "(", count: 20) + "true" + String(repeating: ")", count: 20)))
        _ = rules(oneRule(".write", "newData.val().matches(/(abcdef){10}/)"))
        let fine = rules(oneRule(".read", String(repeating: "now > 0 && ", count: 100) + "true"))
        #expect(fine.decideRead(at: path("x"), context: context(nil), tree: .empty).allowed)
    }

    @Test("single and double quotes, escapes and numbers in expressions")
    func literals() {
        let parsed = rules(#"""
            {"rules": {"x": {".write": "newData.val() == 'it\\'s' || newData.val() == \"a\\\"b\" || newData.val() == 1.5e3 || newData.val() == .5 || newData.val() == 'tab\\there' || newData.val() == '\\u00e9'"}}}
            """#)
        for (json, allowed) in [("\"it's\"", true), ("\"a\\\"b\"", true), ("1500", true), ("0.5", true), ("\"tab\\there\"", true), ("\"é\"", true), ("\"no\"", false)] {
            let decision = parsed.decideSet(tree(json), at: writePath("x"), context: context(nil), tree: .empty)
            #expect(decision.allowed == allowed, "\(json): \(decision)")
        }
    }
}
