import ArgumentParser
import Foundation

/// `banyan quota get|set|remove` (docs/operations.md, "Namespace quotas"; docs/cli.md).
struct QuotaCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "quota",
        abstract: "Show, set or remove a namespace's quota (its data bytes; writes that would add more are refused).",
        subcommands: [QuotaGet.self, QuotaSet.self, QuotaRemove.self])

    /// The rules command's endpoint, namespace and credentials, for the quota endpoint.
    static func path(_ target: RulesTarget) -> String { "/.settings/quota.json" + (target.namespace.map { "?ns=\($0)" } ?? "") }

    /// `123`, `64KiB`, `100MiB`, `2GiB`, `1TiB` (powers of 1024; `k`/`M`/`G`/`T` and `KB`… too).
    static func bytes(_ text: String) -> Int? {
        let units: [(String, Int)] = [
            ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20),
            ("KB", 1 << 10), ("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10), ("k", 1 << 10),
        ]
        var number = Substring(text.trimmingCharacters(in: .whitespaces))
        var scale = 1
        for (suffix, value) in units where number.hasSuffix(suffix) {
            number = number.dropLast(suffix.count)
            scale = value
            break
        }
        guard !number.isEmpty, number.allSatisfy(\.isASCII), let n = Int(number.trimmingCharacters(in: .whitespaces)), n > 0 else { return nil }
        let (product, overflow) = n.multipliedReportingOverflow(by: scale)
        return overflow ? nil : product
    }
}

struct QuotaGet: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "get", abstract: "Print the quota and the data bytes the namespace holds (JSON).")
    @OptionGroup var target: RulesTarget

    func run() throws {
        let (status, text) = try target.client().call("GET", QuotaCommand.path(target))
        guard status == 200 else { throw CommandError("\(target.endpoint): \(status) \(text)") }
        print(text)
    }
}

struct QuotaSet: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set", abstract: "Set the quota: a number of data bytes, with an optional KiB, MiB, GiB or TiB.")
    @OptionGroup var target: RulesTarget
    @Argument(help: "The quota, e.g. 500MiB.")
    var size: String

    func run() throws {
        guard let bytes = QuotaCommand.bytes(size), bytes <= 1 << 50 else { throw CommandError("\(size): a quota is a positive number of bytes up to 2^50 (1 PiB), optionally with KiB, MiB, GiB or TiB") }
        let (status, answer) = try target.client().call("PUT", QuotaCommand.path(target), body: String(bytes))
        guard status == 200 else { throw CommandError("\(target.endpoint): \(status) \(answer)") }
        print("\(target.endpoint): quota set to \(bytes) bytes")
    }
}

struct QuotaRemove: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "remove", abstract: "Remove the quota (writes of any size again).")
    @OptionGroup var target: RulesTarget

    func run() throws {
        let (status, answer) = try target.client().call("PUT", QuotaCommand.path(target), body: "null")
        guard status == 200 else { throw CommandError("\(target.endpoint): \(status) \(answer)") }
        print("\(target.endpoint): quota removed")
    }
}
