import Foundation
import Testing

/// Mechanical layering and hygiene checks (house style B2, B5, B6).
///
/// Reads `Package.swift` and every file under `Sources/`, and fails on: a target depending on or
/// importing a module outside its row of the table below; a pure core importing an I/O or
/// concurrency module or calling a banned API (clocks, OS randomness, threads, printing, mutable
/// globals); `try!`, `as!` or a bare `fatalError` anywhere in `Sources/`.
@Suite struct LayeringTests {
    /// Which modules each target may import. Pure cores are marked `core`.
    static let table: [String: (core: Bool, allowed: Set<String>)] = [
        "BanyanBasics": (true, []),
        "BanyanTree": (true, ["BanyanBasics"]),
        "BanyanQuery": (true, ["BanyanTree", "BanyanBasics"]),
        // CCRC32C: the processor's CRC-32C instruction (pure computation).
        "BanyanOpLog": (true, ["BanyanBasics", "CCRC32C"]),
        "BanyanCheckers": (true, []),
        // C: the CRC-32C instruction (no Swift files; no dependencies).
        "CCRC32C": (true, []),
        // C: glibc's heap statistics and trim, for the server's driver (no dependencies).
        "CHeap": (false, []),
        "BanyanRaft": (true, ["BanyanBasics"]),
        "BanyanStateMachine": (true, ["BanyanTree", "BanyanRules", "BanyanBasics"]),
        "BanyanRules": (true, ["BanyanTree", "BanyanBasics"]),
        "BanyanREST": (true, ["BanyanTree", "BanyanQuery", "BanyanListen", "BanyanStateMachine", "BanyanRules", "BanyanBasics"]),
        "BanyanSession": (true, ["BanyanTree", "BanyanStateMachine", "BanyanBasics"]),
        "BanyanListen": (true, ["BanyanTree", "BanyanQuery", "BanyanBasics"]),
        "BanyanReplica": (true, ["BanyanRaft", "BanyanStateMachine", "BanyanTree", "BanyanBasics"]),
        "BanyanClientCore": (true, ["BanyanTree", "BanyanQuery", "BanyanBasics"]),
        // FoundationNetworking: `Auth`'s URLSession on Linux (the account service's HTTP API).
        "BanyanClient": (
            false,
            [
                "BanyanClientCore", "BanyanTree", "BanyanQuery", "BanyanBasics", "NIOCore", "NIOPosix", "NIOHTTP1", "NIOWebSocket", "NIOSSL", "Foundation",
                "FoundationNetworking", "Glibc", "Darwin", "Dispatch", "Logging",
            ]
        ),
        // A driver: the signature checks need swift-crypto (token parsing and claims stay pure).
        "BanyanAuth": (false, ["BanyanTree", "BanyanBasics", "Crypto", "_CryptoExtras"]),
        "BanyanNode": (false, ["BanyanOpLogFiles", "BanyanOpLog", "BanyanRaft", "BanyanReplica", "BanyanStateMachine", "BanyanTree", "BanyanBasics", "Logging"]),
        "BanyanServer": (
            false,
            [
                "BanyanNode", "BanyanOpLogFiles", "BanyanOpLog", "BanyanRaft", "BanyanReplica", "BanyanStateMachine", "BanyanTree", "BanyanQuery",
                "BanyanBasics", "BanyanRules", "BanyanREST", "BanyanSession", "BanyanListen", "BanyanAuth", "CZlib", "CHeap", "Logging", "NIOCore", "NIOPosix", "NIOHTTP1", "NIOWebSocket", "NIOSSL", "X509", "Crypto", "Metrics", "Prometheus",
                "Yams", "Foundation", "Glibc", "Dispatch", "Synchronization", "SwiftASN1",
            ]
        ),
        "BanyanSimulation": (
            true,
            [
                "BanyanRaft", "BanyanTree", "BanyanCheckers", "BanyanBasics", "BanyanNode", "BanyanReplica", "BanyanStateMachine", "BanyanOpLog",
                "BanyanOpLogFiles", "BanyanSession", "Logging",
            ]
        ),
        "BanyanOpLogFiles": (false, ["BanyanOpLog", "BanyanBasics", "CZlib", "Logging", "Glibc", "Darwin", "Dispatch", "Synchronization"]),
        "BanyanCommand": (
            false,
            [
                "BanyanTree", "BanyanAuth", "BanyanQuery", "BanyanBasics", "BanyanRules", "BanyanServer", "BanyanOps", "BanyanNode", "BanyanOpLogFiles", "BanyanClient", "Logging",
                "NIOCore", "NIOHTTP1", "NIOPosix", "NIOSSL", "ArgumentParser",
                "Foundation", "FoundationNetworking", "Dispatch", "Glibc",
            ]
        ),
        "BanyanOps": (false, ["BanyanCheckers", "BanyanBasics", "NIOCore", "NIOPosix", "NIOHTTP1", "NIOSSL", "Foundation", "Glibc", "Dispatch", "Synchronization"]),
        "BanyanClusterTest": (false, ["BanyanOps", "BanyanCheckers", "ArgumentParser", "NIOHTTP1", "Foundation", "Glibc"]),
        "BanyanSim": (false, ["BanyanSimulation", "BanyanBasics", "ArgumentParser"]),
        // The example app (Examples/Chat): the SDK's public product only, as an app would use it.
        "BanyanChat": (false, ["BanyanClient", "Foundation", "Dispatch", "Glibc", "Darwin"]),
        // An app on the SDK's public API only (the SDK's multi-process tests).
        "BanyanSDKProbe": (false, ["BanyanClient", "Foundation", "Glibc", "Darwin"]),
        "BanyanBench": (
            false,
            [
                "BanyanTree", "BanyanQuery", "BanyanBasics", "BanyanOpLog", "BanyanOpLogFiles", "BanyanRaft", "BanyanSimulation", "BanyanStateMachine",
                "BanyanAuth", "BanyanRules", "BanyanREST", "Crypto", "_CryptoExtras", "Foundation", "Glibc",
            ]
        ),
    ]

    /// Targets whose sources are not in `Sources/<target>` (their `path:` in Package.swift).
    static let paths: [String: String] = ["BanyanChat": "Examples/Chat"]

    /// Modules a pure core may never import.
    static let forbiddenInCores: Set<String> = [
        "Foundation", "FoundationEssentials", "Dispatch", "Glibc", "Musl", "Darwin", "NIOCore", "NIOPosix",
        "NIOSSL", "NIOFileSystem", "Metrics", "ServiceLifecycle", "Hummingbird", "HummingbirdWebSocket",
    ]

    /// APIs banned in cores: each needle with the reason.
    static let bannedInCores: [(String, String)] = [
        ("Date(", "clock"), (".now", "clock"), ("ContinuousClock", "clock"), ("SuspendingClock", "clock"),
        ("Task.sleep", "sleeping"), ("SystemRandomNumberGenerator", "OS randomness"), (".random(", "OS randomness"),
        ("UUID()", "OS randomness"), ("ProcessInfo", "process state"), ("DispatchQueue", "threads"),
        ("Thread", "threads"), ("Task {", "unstructured task"), ("Task.detached", "unstructured task"),
        ("print(", "output"), ("nonisolated(unsafe)", "unsafety"),
    ]

    /// Whether `code` uses `needle` as a whole identifier (so `isUpToDate(` is not `Date(`).
    static func mentions(_ code: String, _ needle: String) -> Bool {
        guard let first = needle.first, first.isLetter else { return code.contains(needle) }
        var rest = Substring(code)
        while let r = rest.range(of: needle) {
            if r.lowerBound == rest.startIndex { return true }
            let before = rest[rest.index(before: r.lowerBound)]
            if !(before.isLetter || before.isNumber || before == "_") { return true }
            rest = rest[r.upperBound...]
        }
        return false
    }

    /// Files allowed one `@unchecked Sendable`, with the reason (reviewed by hand).
    static let uncheckedSendableAllowed: Set<String> = [
        // Copy-on-write container: nodes are mutated only when isKnownUniquelyReferenced.
        "Sources/BanyanTree/SortedTree.swift"
    ]

    static let root: String = {
        var parts = #filePath.split(separator: "/", omittingEmptySubsequences: false)
        parts.removeLast(3)
        return parts.joined(separator: "/")
    }()

    @Test("every source target is in the layering table and depends only on allowed modules")
    func packageDependencies() throws {
        let manifest = try text(LayeringTests.root + "/Package.swift")
        let targets = parseTargets(manifest)
        #expect(!targets.isEmpty, "no targets parsed from Package.swift")
        for (name, deps) in targets where !name.hasSuffix("Tests") {
            guard let row = LayeringTests.table[name] else {
                Issue.record("target \(name) is not in the layering table")
                continue
            }
            for dep in deps where !row.allowed.contains(dep) {
                Issue.record("\(name) depends on \(dep), which its layer may not use")
            }
        }
        for name in LayeringTests.table.keys {
            #expect(targets[name] != nil, "table lists \(name) but Package.swift has no such target")
        }
    }

    @Test("imports respect the layering and cores stay free of I/O and banned APIs")
    func sources() throws {
        var checked = 0
        for (target, row) in LayeringTests.table {
            let folder = LayeringTests.paths[target] ?? "Sources/" + target
            let dir = LayeringTests.root + "/" + folder
            for file in try swiftFiles(dir) {
                checked += 1
                let relative = folder + "/" + file
                let lines = try text(dir + "/" + file).split(separator: "\n", omittingEmptySubsequences: false)
                for (number, rawLine) in lines.enumerated() {
                    let line = String(rawLine)
                    let code = stripComment(line).trimmingSpaces
                    let place = "\(relative):\(number + 1)"
                    if let module = importedModule(code) {
                        if !row.allowed.contains(module) && module != "Testing" {
                            Issue.record("\(place): \(target) may not import \(module)")
                        }
                        if row.core && LayeringTests.forbiddenInCores.contains(module) {
                            Issue.record("\(place): pure core \(target) imports \(module)")
                        }
                    }
                    if code.contains("try!") { Issue.record("\(place): try! in Sources") }
                    if hasForceUnwrap(code) { Issue.record("\(place): force unwrap in Sources") }
                    if code.contains("nonisolated(unsafe)") { Issue.record("\(place): nonisolated(unsafe) in Sources") }
                    if code.contains(" as! ") { Issue.record("\(place): as! in Sources") }
                    if code.contains("fatalError(") && !code.contains("fatalError(\"unreachable:") {
                        Issue.record("\(place): fatalError in Sources (use typed errors or preconditionFailure)")
                    }
                    guard row.core else { continue }
                    for (needle, why) in LayeringTests.bannedInCores where LayeringTests.mentions(code, needle) {
                        Issue.record("\(place): \(needle) is banned in cores (\(why))")
                    }
                    if code.contains("@unchecked Sendable") && !LayeringTests.uncheckedSendableAllowed.contains(relative) {
                        Issue.record("\(place): @unchecked Sendable in a core")
                    }
                    if isStoredStaticVar(code) { Issue.record("\(place): mutable static state in a core") }
                    if !rawLine.hasPrefix(" ") && (code.hasPrefix("var ") || code.hasPrefix("public var ") || code.hasPrefix("private var ")) {
                        Issue.record("\(place): file-scope var in a core")
                    }
                }
            }
        }
        #expect(checked > 10)
    }

    @Test("no file of the repository keeps a merge's conflict markers (docs/cli.md once did)")
    func noConflictMarkers() throws {
        let manager = FileManager.default
        var checked = 0
        for top in ["Sources", "Tests", "docs", "deploy", ".ci"] {
            guard let walker = manager.enumerator(atPath: LayeringTests.root + "/" + top) else { continue }
            for case let relative as String in walker {
                let kept = [".swift", ".md", ".yml", ".yaml", ".sh", ".py", ".json", ".js", "run"]
                guard kept.contains(where: { relative.hasSuffix($0) }), !relative.contains("Corpora/") else { continue }
                let path = LayeringTests.root + "/" + top + "/" + relative
                guard let data = manager.contents(atPath: path), data.count < 4 << 20 else { continue }
                checked += 1
                for line in String(decoding: data, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
                where line.hasPrefix("<<<<<<< ") || line.hasPrefix(">>>>>>> ") {
                    Issue.record("\(top)/\(relative) holds a conflict marker: \(line)")
                }
            }
        }
        for file in ["README.md", "Package.swift"] {
            let text = try BanyanTidyTests.text(LayeringTests.root + "/" + file)
            #expect(!text.contains("\n<<<<<<< ") && !text.contains("\n>>>>>>> "), "\(file) holds a conflict marker")
        }
        #expect(checked > 100, "only \(checked) files checked")
    }

    @Test("the checker itself catches a forbidden import and a banned API")
    func selfTest() {
        #expect(importedModule("import Foundation") == "Foundation")
        #expect(importedModule("public import BanyanTree") == "BanyanTree")
        #expect(importedModule("@testable import BanyanQuery") == "BanyanQuery")
        #expect(importedModule("internal import struct Foundation.Date") == "Foundation")
        #expect(importedModule("let important = 1") == nil)
        #expect(hasForceUnwrap("let x = y!.count"))
        #expect(hasForceUnwrap("f(a[0]!)"))
        #expect(hasForceUnwrap("return value!"))
        #expect(!hasForceUnwrap("if a != b && !c { }"))
        #expect(!hasForceUnwrap("let s = \"wow!\" + t"))
        #expect(!hasForceUnwrap("guard !x.isEmpty else { return }"))
        #expect(isStoredStaticVar("static var counter = 0"))
        #expect(isStoredStaticVar("public static var shared: Int = 1"))
        #expect(!isStoredStaticVar("static var delta: Int { 3 }"))
        #expect(stripComment("x = 1 // print(") == "x = 1 ")
        let targets = parseTargets("""
            .target(name: "A", dependencies: ["B", .product(name: "C", package: "c")]),
            .executableTarget(
                name: "D",
                dependencies: [
                    "A",
                ]
            ),
            """)
        #expect(targets["A"] == ["B", "C"])
        #expect(targets["D"] == ["A"])
    }
}

// MARK: - Parsing helpers

func importedModule(_ code: String) -> String? {
    var words = code.split(separator: " ").map(String.init)
    while let first = words.first, first.hasPrefix("@") || ["public", "internal", "package", "private", "fileprivate"].contains(first) {
        words.removeFirst()
    }
    guard words.first == "import", words.count >= 2 else { return nil }
    var module = words[1]
    if ["struct", "class", "enum", "protocol", "func", "var", "let", "typealias"].contains(module), words.count >= 3 {
        module = words[2]
    }
    return String(module.split(separator: ".").first ?? "")
}

/// A postfix `!` after an identifier, `)` or `]` (not `!=`), outside string literals.
func hasForceUnwrap(_ code: String) -> Bool {
    var inString = false
    var previous: Character = " "
    var chars = Array(code)
    chars.append(" ")
    for i in 0..<(chars.count - 1) {
        let c = chars[i]
        if c == "\"" && previous != "\\" { inString.toggle() }
        if !inString && c == "!" && chars[i + 1] != "=" && (previous.isLetter || previous.isNumber || previous == "_" || previous == ")" || previous == "]") {
            return true
        }
        previous = c
    }
    return false
}

func isStoredStaticVar(_ code: String) -> Bool {
    guard let range = code.range(of: "static var ") else { return false }
    let rest = code[range.upperBound...]
    if rest.contains("{") { return false }
    return rest.contains("=")
}

func stripComment(_ line: String) -> String {
    guard let range = line.range(of: "//") else { return line }
    return String(line[..<range.lowerBound])
}

/// Target name -> dependency names (`"X"` and `.product(name: "X", ...)`), from Package.swift.
func parseTargets(_ manifest: String) -> [String: [String]] {
    var result: [String: [String]] = [:]
    let chunks = manifest.components(separatedBy: "arget(").dropFirst()
    for chunk in chunks {
        guard let name = firstQuoted(after: "name:", in: chunk) else { continue }
        var deps: [String] = []
        if let start = chunk.range(of: "dependencies:") {
            var depth = 0
            var body = ""
            for ch in chunk[start.upperBound...] {
                if ch == "[" { depth += 1 }
                if ch == "]" {
                    depth -= 1
                    if depth == 0 { break }
                }
                if depth > 0 { body.append(ch) }
            }
            var i = body.startIndex
            while let q = body[i...].firstIndex(of: "\"") {
                let afterQ = body.index(after: q)
                guard let end = body[afterQ...].firstIndex(of: "\"") else { break }
                let word = String(body[afterQ..<end])
                let before = body[..<q]
                if before.hasSuffix("package: ") == false { deps.append(word) }
                i = body.index(after: end)
            }
        }
        result[name] = deps
    }
    return result
}

func firstQuoted(after marker: String, in text: String) -> String? {
    guard let m = text.range(of: marker) else { return nil }
    guard let q = text[m.upperBound...].firstIndex(of: "\"") else { return nil }
    let after = text.index(after: q)
    guard let end = text[after...].firstIndex(of: "\"") else { return nil }
    return String(text[after..<end])
}

extension String {
    var trimmingSpaces: String {
        var s = Substring(self)
        while s.first == " " || s.first == "\t" { s.removeFirst() }
        return String(s)
    }

}

// MARK: - File helpers (tests only)

func text(_ path: String) throws -> String {
    try String(contentsOfFile: path, encoding: .utf8)
}

func swiftFiles(_ dir: String) throws -> [String] {
    try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.hasSuffix(".swift") }.sorted()
}
