import ArgumentParser
import BanyanAuth
import BanyanRules
import BanyanTree
import Foundation

/// `banyan rules get|set|test` (docs/rules.md, docs/cli.md).
struct RulesCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rules",
        abstract: "Show, set or test a namespace's security rules.",
        subcommands: [RulesGet.self, RulesSet.self, RulesTest.self])
}

/// Credentials and namespace of the rules endpoint.
struct RulesTarget: ParsableArguments {
    @Option(name: .long, help: "A node's client address (host:port).")
    var endpoint: String = "127.0.0.1:9000"
    @Option(name: .long, help: "The namespace (default: the node's default namespace).")
    var namespace: String?

    var path: String { "/.settings/rules.json" + (namespace.map { "?ns=\($0)" } ?? "") }

    /// The operator token (BANYAN_ADMIN_TOKEN / BANYAN_ADMIN_TOKEN_FILE), else a token signed
    /// with the service account's key in BANYAN_SERVICE_ACCOUNT_FILE, else the development
    /// administrator token `owner`.
    func client() throws -> AdminClient {
        AdminClient(endpoint: endpoint, token: try AdminClient.operatorToken() ?? Self.serviceAccountToken() ?? "owner")
    }

    /// A five-minute token signed with the key file BANYAN_SERVICE_ACCOUNT_FILE names, if set.
    static func serviceAccountToken() throws -> String? {
        guard let file = ProcessInfo.processInfo.environment["BANYAN_SERVICE_ACCOUNT_FILE"], !file.isEmpty else { return nil }
        guard let data = FileManager.default.contents(atPath: file) else { throw CommandError("BANYAN_SERVICE_ACCOUNT_FILE: cannot read \(file)") }
        do {
            return try ServiceAccountKey(file: Array(data)).token(now: Int64(Date().timeIntervalSince1970), lifetime: 300)
        } catch {
            throw CommandError("BANYAN_SERVICE_ACCOUNT_FILE \(file): \(error)")
        }
    }
}

struct RulesGet: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "get", abstract: "Print the rules in force (as they were set, comments included).")
    @OptionGroup var target: RulesTarget

    func run() throws {
        let (status, text) = try target.client().call("GET", target.path)
        guard status == 200 else { throw CommandError("\(target.endpoint): \(status) \(text)") }
        print(text, terminator: text.hasSuffix("\n") ? "" : "\n")
    }
}

struct RulesSet: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set", abstract: "Set the rules from a file (checked here first; errors name their line and column).")
    @OptionGroup var target: RulesTarget
    @Argument(help: "The rules file (JSON; // and /* */ comments allowed).")
    var file: String

    func run() throws {
        guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { throw CommandError("cannot read \(file)") }
        do {
            _ = try Rules.parse(text)
        } catch {
            throw CommandError("\(file):\(error)")
        }
        let (status, answer) = try target.client().call("PUT", target.path, body: text)
        guard status == 200 else { throw CommandError("\(target.endpoint): \(status) \(answer)") }
        print("\(target.endpoint): rules set (\(text.utf8.count) bytes)")
    }
}

struct RulesTest: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "test",
        abstract: "Run a file of cases against a rules file, offline (like the Firebase rules simulator).",
        discussion: """
            CASES is a JSON array of {"name", "auth", "path", "op": "read"|"set"|"update", "data", "query", "now", \
            "expected": "allow"|"deny", "rule"} (docs/rules.md). Each case starts from the tree in --data. \
            Exits with status 1 when a case fails.
            """)
    @Argument(help: "The rules file.") var rules: String
    @Argument(help: "The cases file.") var cases: String
    @Option(name: .long, help: "A JSON file with the data the cases start from (default: empty).")
    var data: String?
    @Option(name: .long, help: "`now` in milliseconds for cases without their own (default: the current time).")
    var now: Int64?

    func run() throws {
        guard let rulesText = try? String(contentsOfFile: rules, encoding: .utf8) else { throw CommandError("cannot read \(rules)") }
        guard let casesText = try? String(contentsOfFile: cases, encoding: .utf8) else { throw CommandError("cannot read \(cases)") }
        let parsed: Rules
        do {
            parsed = try Rules.parse(rulesText)
        } catch {
            throw CommandError("\(rules):\(error)")
        }
        var tree = Tree.empty
        if let data {
            guard let bytes = FileManager.default.contents(atPath: data) else { throw CommandError("cannot read \(data)") }
            do {
                tree = try TreeReader.read(Array(bytes), at: .root)
            } catch {
                throw CommandError("\(data): \(error)")
            }
        }
        let time = now ?? Int64((Date().timeIntervalSince1970 * 1000).rounded())
        let report: CaseReport
        do {
            report = try RulesCaseRunner(rules: parsed, tree: tree, time: time).run(casesJSON: casesText)
        } catch {
            throw CommandError("\(cases): \(error)")
        }
        for line in report.lines { print(line) }
        if report.failed > 0 { throw ExitCode(1) }
    }
}
