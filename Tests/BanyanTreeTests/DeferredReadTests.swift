import BanyanBasics
import BanyanTree
import Testing

/// `TreeReader.readDeferred` (the read-ahead of large writes, docs/replica.md "Prepared entries")
/// resolved over the tree a write meets gives exactly what `TreeReader.read` gives then.
@Suite struct DeferredReadTests {
    /// Random written data: objects, arrays, leaves, priorities, `.value` wrappers, and server
    /// values (timestamps, increments with int, double and bad deltas, unknown ones).
    struct Generator {
        var random: SeededRandom
        let keys = ["a", "b", "c", "n", "0", "1"]

        mutating func value(depth: Int) -> String {
            switch random.below(depth > 3 ? 5 : 9) {
            case 0: return "\(Int(random.below(2_000)) - 1_000)"
            case 1: return "\(Double(random.below(1_000)) / 8)"
            case 2: return ["true", "false", "null", "\"s\"", "9223372036854775807"][random.below(5)]
            case 3: return serverValue()
            case 4: return serverValue()
            case 5, 6:
                var members: [String] = []
                for key in keys where random.below(3) == 0 { members.append("\"\(key)\":\(value(depth: depth + 1))") }
                if random.below(4) == 0 { members.append("\".priority\":\(priority())") }
                return "{" + members.joined(separator: ",") + "}"
            case 7:
                return "{\".value\":\(random.below(2) == 0 ? serverValue() : "7"),\".priority\":\(priority())}"
            default:
                return "[" + (0..<random.below(3)).map { _ in value(depth: depth + 1) }.joined(separator: ",") + "]"
            }
        }

        mutating func serverValue() -> String {
            switch random.below(7) {
            case 0: return #"{".sv":"timestamp"}"#
            case 1: return #"{".sv":{"increment":3}}"#
            case 2: return #"{".sv":{"increment":-2.5}}"#
            case 3: return #"{".sv":{"increment":9223372036854775807}}"#
            case 4: return #"{".sv":{"increment":"x"}}"#
            case 5: return #"{".sv":"later"}"#
            default: return #"{".sv":{"increment":1}}"#
            }
        }

        mutating func priority() -> String {
            ["1", "\"p\"", #"{".sv":"timestamp"}"#, "null", "true"][random.below(5)]
        }
    }

    static func render(_ result: Result<Tree, TreeError>) -> String {
        switch result {
        case .success(let tree): return "ok " + JSONWriter.string(tree, format: .export)
        case .failure(let error): return "error \(error)"
        }
    }

    @Test("deferred reads resolve to what the reader gives, for 3,000 seeded writes over seeded trees")
    func resolvesLikeRead() throws {
        var g = Generator(random: SeededRandom(seed: 77))
        var resolvedIncrements = 0
        for _ in 0..<3_000 {
            let drawn = g.value(depth: 1)
            let base = drawn.contains(".sv") || drawn.contains("true,") ? #"{"a":5,"n":{"c":1.5},"1":2}"# : drawn
            let existing = (try? Tree(json: "{\"x\":" + base + "}")) ?? .empty
            let json = Array(g.value(depth: 0).utf8)
            let location = try Path(parsing: ["/x", "/x/n", "/", "/x/a"][g.random.below(4)])
            let stamp: Int64 = 1_700_000_000_000
            let read = Result { () throws(TreeError) in
                try TreeReader.read(json, at: location, serverValues: ServerValueContext(timestamp: stamp, existing: existing))
            }
            let deferred = Result { () throws(TreeError) in try TreeReader.readDeferred(json, at: location, timestamp: stamp) }
            let resolved: Result<Tree, TreeError> = deferred.map { d in
                guard let tree = d.resolved(existing: existing, timestamp: stamp) else { return Tree(.string("unresolved")) }
                return tree
            }
            #expect(Self.render(resolved) == Self.render(read), "\(String(decoding: json, as: UTF8.self)) at \(location)")
            if case .success = read, json.count > 0, String(decoding: json, as: UTF8.self).contains("increment") { resolvedIncrements += 1 }
        }
        #expect(resolvedIncrements > 100)
    }

    @Test("a deferred read that used a timestamp asks to be read again under another one")
    func otherTimestamp() throws {
        let d = try TreeReader.readDeferred(Array(#"{"t":{".sv":"timestamp"}}"#.utf8), at: .root, timestamp: 5)
        #expect(d.resolved(existing: .empty, timestamp: 6) == nil)
        #expect(d.resolved(existing: .empty, timestamp: 5).map { JSONWriter.string($0) } == #"{"t":5}"#)
        let plain = try TreeReader.readDeferred(Array(#"{"n":{".sv":{"increment":2}}}"#.utf8), at: .root, timestamp: 5)
        #expect(plain.resolved(existing: try Tree(json: #"{"n":40}"#), timestamp: 6).map { JSONWriter.string($0) } == #"{"n":42}"#)
    }

    @Test("an increment at the location itself keeps the written priority")
    func incrementAtLocation() throws {
        let d = try TreeReader.readDeferred(
            Array(#"{".value":{".sv":{"increment":1}},".priority":3}"#.utf8), at: try Path(parsing: "/c"), timestamp: 0)
        let tree = try #require(d.resolved(existing: try Tree(json: #"{"c":10}"#), timestamp: 0))
        #expect(JSONWriter.string(tree, format: .export) == #"{".value":11,".priority":3}"#)
    }
}
