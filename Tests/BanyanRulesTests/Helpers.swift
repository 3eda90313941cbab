import BanyanRules
import BanyanTree
import Testing

/// Parses a rules document, recording an issue (and returning allow-nothing rules) when it fails.
func rules(_ text: String, limits: RulesLimits = .standard, sourceLocation: SourceLocation = #_sourceLocation) -> Rules {
    do {
        return try Rules.parse(text, limits: limits)
    } catch {
        Issue.record("rules did not parse: \(error)", sourceLocation: sourceLocation)
        return (try? Rules.parse("{\"rules\": {}}")) ?? Rules.allowAll
    }
}

/// The error a rules document is expected to produce (nil, with an issue, when it parses).
func rulesError(_ text: String, limits: RulesLimits = .standard, sourceLocation: SourceLocation = #_sourceLocation) -> RulesError? {
    do {
        _ = try Rules.parse(text, limits: limits)
        Issue.record("rules parsed but should not have", sourceLocation: sourceLocation)
        return nil
    } catch {
        return error
    }
}

func tree(_ json: String, sourceLocation: SourceLocation = #_sourceLocation) -> Tree {
    do {
        return try Tree(json: json)
    } catch {
        Issue.record("bad test JSON \(json): \(error)", sourceLocation: sourceLocation)
        return .empty
    }
}

func path(_ text: String) -> Path { (try? Path(parsing: text)) ?? .root }

func writePath(_ text: String) -> WritePath { (try? WritePath(parsing: text)) ?? WritePath(path: .root) }

func user(_ uid: String, token: String = "{}") -> JSONValue? {
    try? JSONValue(parsing: "{\"uid\": \"\(uid)\", \"provider\": \"password\", \"token\": \(token)}")
}

let testTime: Int64 = 1_700_000_000_000

func context(_ auth: JSONValue?, time: Int64 = testTime) -> RulesRequestContext {
    RulesRequestContext(auth: auth, time: time)
}

/// A one-rule document: `{"rules": {"x": {KIND: EXPRESSION}}}` with the expression JSON-quoted.
func oneRule(_ kind: String, _ expression: String, at location: String = "x") -> String {
    var quoted = ""
    for c in expression {
        if c == "\"" || c == "\\" { quoted.append("\\") }
        quoted.append(c)
    }
    return "{\"rules\": {\"\(location)\": {\"\(kind)\": \"\(quoted)\"}}}"
}
