import ArgumentParser
import BanyanQuery
import BanyanTree

struct QueryCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "query",
        abstract: "Run a Firebase query over a file, as a client or REST GET would see it.",
        discussion: """
            Values are JSON: --start-at 5, --equal-to '"ada"', --end-at null. Combine an ordering \
            with a range and a limit, e.g. --order-by-child score --start-at 10 --limit-to-first 3.
            """)

    @OptionGroup var input: InputOptions

    @Option(name: .long, help: "Order by the value at this child path (e.g. score or meta/rank).")
    var orderByChild: String?
    @Flag(name: .long, help: "Order by key.")
    var orderByKey = false
    @Flag(name: .long, help: "Order by value.")
    var orderByValue = false
    @Flag(name: .long, help: "Order by priority (the default ordering).")
    var orderByPriority = false

    @Option(name: .long, help: "Start at this value (JSON), inclusive.") var startAt: String?
    @Option(name: .long, help: "Start after this value (JSON), exclusive.") var startAfter: String?
    @Option(name: .long, help: "End at this value (JSON), inclusive.") var endAt: String?
    @Option(name: .long, help: "End before this value (JSON), exclusive.") var endBefore: String?
    @Option(name: .long, help: "Only children equal to this value (JSON).") var equalTo: String?
    @Option(name: .long, help: "Key tie-breaker for the start value.") var startKey: String?
    @Option(name: .long, help: "Key tie-breaker for the end value.") var endKey: String?
    @Option(name: .long, help: "Keep the first N children of the range.") var limitToFirst: Int?
    @Option(name: .long, help: "Keep the last N children of the range.") var limitToLast: Int?

    enum Output: String, ExpressibleByArgument, CaseIterable {
        /// The result as JSON (what REST GET returns).
        case json
        /// One child per line in query order: key, tab, value.
        case lines
        /// The result in the export format (with priorities).
        case export
    }

    @Option(name: .long, help: "Output: json (REST GET result), lines (children in query order), export.")
    var output: Output = .json

    @Flag(name: .long, help: "Indent JSON output.")
    var pretty = false

    func value(_ text: String, _ option: String) throws -> Tree {
        do {
            let value = try TreeReader.read(text)
            if value.hasChildren { throw CommandError("--\(option) must be a JSON primitive (quote strings: '\"ada\"')") }
            return value
        } catch let error as TreeError {
            throw CommandError("--\(option) is not a JSON value (quote strings: '\"ada\"'): \(error.message)")
        }
    }

    func validate() throws {
        if startKey != nil && startAt == nil && startAfter == nil && equalTo == nil {
            throw ValidationError("--start-key needs --start-at, --start-after or --equal-to")
        }
        if endKey != nil && endAt == nil && endBefore == nil {
            throw ValidationError("--end-key needs --end-at or --end-before")
        }
        if equalTo != nil && endKey != nil {
            throw ValidationError("--equal-to takes its key tie-breaker from --start-key")
        }
    }

    func buildQuery() throws -> Query {
        var query = Query()
        let orderings = [orderByChild != nil, orderByKey, orderByValue, orderByPriority].filter { $0 }.count
        if orderings > 1 { throw QueryError("You can't combine multiple orderBy calls.") }
        if let child = orderByChild { query = try query.orderByChild(child) }
        if orderByKey { query = try query.orderByKey() }
        if orderByValue { query = try query.orderByValue() }
        if orderByPriority { query = try query.orderByPriority() }
        if let v = startAt { query = try query.startAt(try value(v, "start-at"), key: startKey) }
        if let v = startAfter { query = try query.startAfter(try value(v, "start-after"), key: startKey) }
        if let v = equalTo { query = try query.equalTo(try value(v, "equal-to"), key: startKey) }
        if let v = endAt { query = try query.endAt(try value(v, "end-at"), key: endKey) }
        if let v = endBefore { query = try query.endBefore(try value(v, "end-before"), key: endKey) }
        if let n = limitToFirst { query = try query.limitToFirst(n) }
        if let n = limitToLast { query = try query.limitToLast(n) }
        return query
    }

    func run() throws {
        try runTool {
            let query = try buildQuery()
            let node = try input.read().tree
            switch output {
            case .json:
                writeLine(JSONWriter.string(query.params.evaluate(node), format: .plain, pretty: pretty))
            case .export:
                writeLine(JSONWriter.string(query.params.evaluate(node), format: .export, pretty: pretty))
            case .lines:
                if node.hasChildren {
                    for (key, child) in query.params.orderedChildren(of: node) {
                        writeLine(key.string + "\t" + JSONWriter.string(child, format: .plain))
                    }
                } else if query.params.loadsAllData && !node.isEmpty {
                    writeLine(JSONWriter.string(node, format: .plain))
                }
            }
        }
    }
}
