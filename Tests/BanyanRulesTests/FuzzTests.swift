import BanyanBasics
import BanyanRules
import BanyanTree
import Testing

/// Goal: no input crashes the parser, the checker or the evaluator; every document is either a
/// positioned error or rules that decide. Method: seeded generators (printed on failure) of token
/// soups, of grammar-shaped expressions, and of mutations of the conformance document.
@Suite struct FuzzTests {
    static let seeds: [UInt64] = [1, 16, 0xBA_4A_11, 0xFEED, 20_261_125]

    static let tokens = [
        "auth", "auth.uid", "auth.token.admin", "auth.token['x-y']", "data", "newData", "root", "now", "query.orderByChild", "query.limitToFirst",
        "$x", ".", ".val()", ".child('a')", ".child($x)", ".parent()", ".exists()", ".hasChildren(['a', 'b'])", ".hasChild('a/b')",
        ".getPriority()", ".isNumber()", ".isString()", ".length", ".contains('a')", ".beginsWith(\"b\")", ".replace('a', 'b')",
        ".toLowerCase()", ".matches(/^a+(b|c)*$/i)", "(", ")", "[", "]", "==", "===", "!=", "!==", "&&", "||", "!", "+", "-", "*", "/",
        "%", "<", "<=", ">", ">=", "?", ":", "'s'", "\"q\"", "1", "2.5", "0", "true", "false", "null", "/a/", ",", " ", "'\\u0041'",
        "\\", "'", "\"", "=", "#", "$", "é", "\t", "1e999",
    ]

    static func escaped(_ s: String) -> String {
        var out = ""
        for c in s.unicodeScalars {
            switch c {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\t": out += "\\t"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }

    static let data = """
        {"a": {"b": 1, "c": "text"}, "x": {"k": {"a": true}}, "n": 5, "s": "aaaa"}
        """

    /// Parses `document`; on success, decides a few requests. Returns whether it parsed.
    static func exercise(_ document: String, seed: UInt64, random: inout SeededRandom) -> Bool {
        let current = (try? Tree(json: data)) ?? .empty
        do {
            let r = try Rules.parse(document)
            let auth: JSONValue? = random.chance(1, in: 2) ? nil : try? JSONValue(parsing: #"{"uid": "k", "token": {"admin": true, "x-y": "z"}}"#)
            let ctx = RulesRequestContext(auth: auth, time: 1_000)
            for at in ["/", "x/k", "a/b", "x/k/a/deep"] {
                let p = (try? Path(parsing: at)) ?? .root
                let values = ["1", "\"s\"", "{\"a\": {\"b\": 2}}", "null"]
                let value = (try? Tree(json: values[random.below(values.count)])) ?? .empty
                let read = r.decideRead(at: p, context: ctx, tree: current)
                let write = r.decideSet(value, at: WritePath(path: p), context: ctx, tree: current)
                let update = r.decideUpdate([UpdateEntry(path: WritePath(path: p), value: value)], at: .root, context: ctx, tree: current)
                #expect(read.allowed == (read.reason == .granted), "seed \(seed)")
                #expect(write.allowed == (write.reason == .granted), "seed \(seed)")
                // A one-entry update at the root is the same write as the set, unless the data
                // model refuses the update form (an entry at the root itself).
                if case .invalidWrite = update.reason {} else {
                    #expect(update.allowed == write.allowed, "seed \(seed): \(document) at \(at)")
                }
            }
            return true
        } catch {
            #expect(error.line >= 1 && error.column >= 1, "seed \(seed)")
            #expect(!error.message.isEmpty, "seed \(seed)")
            return false
        }
    }

    @Test("token soups: always an error with a position, or rules that decide", arguments: FuzzTests.seeds)
    func tokenSoup(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        var parsed = 0
        for _ in 0..<400 {
            var expression = ""
            for _ in 0..<(1 + random.below(12)) { expression += FuzzTests.tokens[random.below(FuzzTests.tokens.count)] }
            let kind = [".read", ".write", ".validate"][random.below(3)]
            let document = "{\"rules\": {\"$x\": {\"\(kind)\": \"\(FuzzTests.escaped(expression))\"}}}"
            if FuzzTests.exercise(document, seed: seed, random: &random) { parsed += 1 }
        }
        #expect(parsed < 400, "seed \(seed): a soup that always parses tests nothing")
    }

    /// Grammar-shaped expressions, so that many pass the checker and reach the evaluator.
    static func expression(_ random: inout SeededRandom, depth: Int) -> String {
        let leaves = [
            "true", "false", "auth != null", "data.exists()", "newData.isString()", "newData.val() == 1", "$x == 'k'",
            "newData.child('a').val() > 0", "root.child('n').val() < now", "newData.val().length >= 2", "data.hasChildren(['a'])",
            "newData.val().matches(/^a*$/)", "auth.token.admin === true", "newData.parent().child('s').val().contains('a')",
            "data.child($x).getPriority() == null", "(newData.val() + 1) % 2 == 0", "-now < 0", "newData.val().toUpperCase() != 'S'",
        ]
        if depth == 0 || random.chance(1, in: 3) { return leaves[random.below(leaves.count)] }
        let a = expression(&random, depth: depth - 1)
        let b = expression(&random, depth: depth - 1)
        switch random.below(5) {
        case 0: return "(\(a)) && (\(b))"
        case 1: return "\(a) || \(b)"
        case 2: return "!(\(a))"
        case 3: return "(\(a)) ? (\(b)) : \(leaves[random.below(leaves.count)])"
        default: return "(\(a)) == (\(b))"
        }
    }

    @Test("grammar-shaped expressions parse and decide", arguments: FuzzTests.seeds)
    func grammar(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        var parsed = 0
        for _ in 0..<200 {
            let write = FuzzTests.expression(&random, depth: 4)
            let validate = FuzzTests.expression(&random, depth: 3)
            let document = """
                {"rules": {"$x": {".write": "\(FuzzTests.escaped(write))", ".validate": "\(FuzzTests.escaped(validate))", "$y": {".read": true}}}}
                """
            if FuzzTests.exercise(document, seed: seed, random: &random) { parsed += 1 }
        }
        #expect(parsed == 200, "seed \(seed): only \(parsed) of 200 well-typed documents parsed")
    }

    @Test("mutations of the conformance document", arguments: FuzzTests.seeds)
    func mutations(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        let original = Array(Corpus.rules.unicodeScalars)
        let inserts: [Unicode.Scalar] = ["{", "}", "\"", "/", "*", "$", ".", ":", ",", "(", ")", "'", "\\", "\n", "a", "!", "["]
        var parsed = 0
        for _ in 0..<150 {
            var text = original
            for _ in 0..<(1 + random.below(4)) {
                let at = random.below(text.count)
                switch random.below(3) {
                case 0: text.remove(at: at)
                case 1: text.insert(inserts[random.below(inserts.count)], at: at)
                default: text[at] = inserts[random.below(inserts.count)]
                }
            }
            var document = ""
            document.unicodeScalars.append(contentsOf: text)
            if FuzzTests.exercise(document, seed: seed, random: &random) { parsed += 1 }
        }
        #expect(parsed < 150, "seed \(seed)")
    }
}
