import ArgumentParser
import BanyanBasics
import BanyanQuery
import BanyanTree
import Foundation

/// `banyan`: the Banyan command. `serve` runs a node, `cluster` runs a local cluster or changes a
/// running one's membership, `status` shows a node's state; the data tools (validate, hash,
/// query, convert, push ids) work offline on JSON files.
@main
struct Banyan: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "banyan",
        abstract: "Banyan: a clustered realtime tree database with the Firebase data model.",
        discussion: """
            Data tools work on JSON files (or standard input with '-') in Firebase's formats: plain \
            JSON as returned by REST GET, or the export format with ".priority" and ".value".
            """,
        subcommands: [Serve.self, Bootstrap.self, Cluster.self, Chaos.self, Status.self, Drain.self, BackupCommand.self, Restore.self, RulesCommand.self, QuotaCommand.self, ServiceAccountCommand.self, Certs.self, Bench.self, Validate.self, Hash.self, QueryCommand.self, Convert.self, PushIDs.self]
    )
}

/// Options shared by the data tools: the input and an optional location inside it.
struct InputOptions: ParsableArguments {
    @Argument(help: "A JSON file, or '-' for standard input.")
    var file: String = "-"

    @Option(name: .long, help: "A location inside the input to work on, e.g. /users/ada.")
    var path: String = "/"

    @Option(name: .long, help: "Refuse inputs larger than this many MiB (Firebase REST writes: 256).")
    var maxInputMib: Int = 256

    func validate() throws {
        guard maxInputMib > 0 && maxInputMib <= 1 << 20 else { throw ValidationError("--max-input-mib must be between 1 and 1048576") }
    }

    func read() throws -> (root: Tree, tree: Tree, location: Path) {
        let bytes: [UInt8]
        if file == "-" {
            bytes = Array(FileHandle.standardInput.readDataToEndOfFile())
        } else {
            guard let data = FileManager.default.contents(atPath: file) else {
                throw CommandError("cannot read \(file): no such file or not readable")
            }
            bytes = Array(data)
        }
        let location = try Path(parsing: path)
        var limits = TreeReadLimits()
        limits.maxBytes = maxInputMib * 1024 * 1024
        // Scale the value budget with the byte budget (about one value per 8 input bytes at most).
        limits.maxValues = Swift.max(limits.maxValues, limits.maxBytes / 8)
        let root = try TreeReader.read(bytes, limits: limits)
        return (root, root.child(at: location), location)
    }
}

struct CommandError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Runs a tool, turning data errors into a clear message on standard error and exit status 1.
func runTool(_ body: () throws -> Void) throws {
    do {
        try body()
    } catch let error as TreeError {
        FileHandle.standardError.write(Data("error: \(error)\n".utf8))
        throw ExitCode(1)
    } catch let error as QueryError {
        FileHandle.standardError.write(Data("error: invalid query: \(error.message)\n".utf8))
        throw ExitCode(1)
    } catch let error as CommandError {
        FileHandle.standardError.write(Data("error: \(error)\n".utf8))
        throw ExitCode(1)
    }
}

func writeLine(_ text: String) {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}

struct Validate: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check that a file is valid Firebase data; print statistics and its hash.")

    @OptionGroup var input: InputOptions

    func run() throws {
        try runTool {
            let (_, node, location) = try input.read()
            writeLine("valid: \(node.valueCount) values, \(node.leafCount) leaves at \(location)")
            writeLine("hash: \(node.hashString.isEmpty ? "\"\" (empty)" : node.hashString)")
        }
    }
}

struct Hash: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the Firebase hash of the data (as used by transactions and listens).")

    @OptionGroup var input: InputOptions

    func run() throws {
        try runTool {
            writeLine(try input.read().tree.hashString)
        }
    }
}

struct Convert: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Convert between plain JSON and the export format (with priorities).")

    enum Format: String, ExpressibleByArgument, CaseIterable {
        case plain, export
    }

    @OptionGroup var input: InputOptions

    @Option(name: .long, help: "Output format: plain (REST GET, arrays, no priorities) or export.")
    var to: Format = .export

    @Flag(name: .long, help: "Indent the output.")
    var pretty = false

    func run() throws {
        try runTool {
            let node = try input.read().tree
            writeLine(JSONWriter.string(node, format: to == .plain ? .plain : .export, pretty: pretty))
        }
    }
}

struct PushIDs: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "push-id", abstract: "Generate Firebase push ids (chronologically sortable keys).")

    @Option(name: .long, help: "How many ids to print.")
    var count: Int = 1

    func validate() throws {
        guard (1...1_000_000).contains(count) else { throw ValidationError("--count must be between 1 and 1000000") }
    }

    func run() throws {
        var generator = PushIDGenerator(random: SeededRandom(seed: UInt64.random(in: .min ... .max)))
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        for _ in 0..<count { writeLine(generator.next(now: now)) }
    }
}
