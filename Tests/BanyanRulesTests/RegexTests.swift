import BanyanRules
import Testing

@Suite struct RegexTests {
    func matches(_ pattern: String, _ text: String, caseInsensitive: Bool = false, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        guard let regex = RulesRegex(pattern, caseInsensitive: caseInsensitive) else {
            Issue.record("pattern \(pattern) did not compile", sourceLocation: sourceLocation)
            return false
        }
        var steps = 0
        return regex.firstMatch(in: text, steps: &steps, budget: Int.max) ?? false
    }

    /// (pattern, text, expected)
    static let table: [(String, String, Bool)] = [
        ("abc", "xxabcxx", true), ("abc", "abd", false), ("^abc", "xabc", false), ("^abc$", "abc", true), ("^abc$", "abcd", false),
        ("a.c", "abc", true), ("a.c", "a\nc", false), ("^a.*z$", "a123z", true),
        ("[a-c]+", "xxbxx", true), ("^[a-c]+$", "abd", false), ("^[^0-9]+$", "abc", true), ("^[^0-9]+$", "ab1", false),
        ("^[-a]+$", "-a-", true), ("^[a-]+$", "a-", true), ("^[\\d.]+$", "1.5", true), ("^[\\w-]+$", "a_b-c", true),
        ("^\\d+$", "0123", true), ("^\\d+$", "12a", false), ("^\\D+$", "ab", true), ("^\\w+$", "a_1", true), ("^\\W+$", "!?", true),
        ("^\\s*$", " \t\n", true), ("^\\S+$", "a b", false), ("^a|b$", "xb", true), ("^(a|b)$", "xb", false), ("^(?:ab|cd)+$", "abcdab", true),
        ("^colou?r$", "color", true), ("^colou?r$", "colour", true), ("^a*$", "", true), ("^a+$", "", false),
        ("^a{3}$", "aaa", true), ("^a{3}$", "aa", false), ("^a{2,}$", "aaaaa", true), ("^a{2,}$", "a", false),
        ("^a{1,2}$", "aa", true), ("^a{1,2}$", "aaa", false), ("^a{0}$", "", true), ("^x{,2}$", "x{,2}", true),
        ("^\\.\\$\\^\\(\\)\\[\\]\\{\\}\\|\\?\\*\\+\\\\\\/$", ".$^()[]{}|?*+\\/", true),
        ("^\\x41\\u00e9$", "Aé", true), ("^a+?b$", "aab", true), ("^(a|ab)(c|bcd)(d*)$", "abcd", true),
        ("^[]$", "", false), ("^[^]$", "x", true), ("é+", "café", true), ("^\\t\\n$", "\t\n", true),
        ("^[A-Z0-9._%+-]+@[A-Z0-9.-]+\\.[A-Z]{2,}$", "user@example.com", false),
    ]

    @Test("the supported syntax matches as JavaScript's RegExp.test does", arguments: 0..<RegexTests.table.count)
    func syntax(_ index: Int) {
        let (pattern, text, expected) = RegexTests.table[index]
        #expect(matches(pattern, text) == expected, "/\(pattern)/ on \(text)")
    }

    @Test("the i flag folds case, in literals and in classes")
    func caseInsensitive() {
        #expect(matches("^[A-Z0-9._%+-]+@[A-Z0-9.-]+\\.[A-Z]{2,}$", "user@example.com", caseInsensitive: true))
        #expect(matches("^hello$", "HeLLo", caseInsensitive: true))
        #expect(!matches("^hello$", "HeLLo"))
        #expect(matches("^[a-f]+$", "ABCdef", caseInsensitive: true))
        #expect(matches("^école$", "ÉCOLE", caseInsensitive: true))
    }

    @Test("unsupported or malformed patterns are compile errors")
    func errors() {
        for pattern in ["a(", "a)", "*a", "a**", "[a", "a{3,1}", "\\1", "(?=a)", "a\\b", "\\", "[z-a]", "\\q", "a{2}{3}", "(?<n>a)"] {
            #expect(RulesRegex(pattern) == nil, "/\(pattern)/ should not compile")
        }
    }

    /// Goal: prove matching is linear, not exponential. Method: patterns that make a backtracking
    /// engine take 2^n steps (`(a*)*b`, `(a|a)*b`, `(a|aa)+$` against a run of `a`s with no match)
    /// must finish within a step count bounded by input × program size.
    @Test("pathological patterns run in time linear in input × pattern")
    func pathological() {
        for pattern in ["^(a*)*b$", "(a|a)*b", "^(a|aa)+c$", "^(a+)+$x", "(x+x+)+y", "^(\\w+\\s?)*$!"] {
            guard let regex = RulesRegex(pattern) else {
                Issue.record("/\(pattern)/ did not compile")
                continue
            }
            for length in [30, 1_000, 20_000] {
                let input = String(repeating: pattern.contains("x") ? "x" : "a", count: length)
                var steps = 0
                let found = regex.firstMatch(in: input, steps: &steps, budget: Int.max)
                #expect(found == false, "/\(pattern)/ on \(length) characters")
                let bound = (length + 1) * (regex.instructionCount * 3 + 2)
                #expect(steps <= bound, "/\(pattern)/: \(steps) steps for \(length) characters (bound \(bound))")
            }
        }
    }

    @Test("a budget stops a long match with nil")
    func budget() {
        guard let regex = RulesRegex("^(a|b|c|d)*e$") else {
            Issue.record("did not compile")
            return
        }
        var steps = 0
        #expect(regex.firstMatch(in: String(repeating: "abcd", count: 10_000), steps: &steps, budget: 5_000) == nil)
        #expect(steps > 5_000)
        steps = 0
        #expect(regex.firstMatch(in: "abcde", steps: &steps, budget: 5_000) == true)
    }
}
