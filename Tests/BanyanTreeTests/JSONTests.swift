import BanyanBasics
import BanyanTree
import Testing

/// The repository root, found from this file's location (tests read the corpora vendored under `Tests/Corpora`).
let repositoryRoot: String = {
    var parts = #filePath.split(separator: "/", omittingEmptySubsequences: false)
    parts.removeLast(3)
    return parts.joined(separator: "/")
}()

@Suite struct JSONCorpusTests {
    static let corpus = repositoryRoot + "/Tests/Corpora/json-parsing"

    /// y_ files the tree reader rejects on purpose, with the documented Firebase rule.
    static let treeRejections: [String: TreeError.Code] = [
        "y_object_duplicated_key.json": .duplicateKey,
        "y_object_duplicated_key_and_value.json": .duplicateKey,
        "y_object_empty_key.json": .invalidKey,
        "y_object_escaped_null_in_key.json": .invalidKey,
    ]

    @Test("every n_ file is rejected with a clear error and every y_ file accepted")
    func corpus() throws {
        let files = try listDirectory(JSONCorpusTests.corpus)
        try #require(files.count > 300, "JSONTestSuite corpus not found at \(JSONCorpusTests.corpus)")
        var checkedN = 0
        var checkedY = 0
        for name in files where name.hasSuffix(".json") {
            let bytes = try readFile(JSONCorpusTests.corpus + "/" + name)
            let plain = Result { () throws(TreeError) in try JSONValue(parsing: bytes) }
            let tree = Result { () throws(TreeError) in try TreeReader.read(bytes) }
            if name.hasPrefix("n_") {
                checkedN += 1
                if case .success = plain { Issue.record("\(name) accepted by JSONValue") }
                if case .success = tree { Issue.record("\(name) accepted by TreeReader") }
                if case .failure(let e) = tree { #expect(!e.message.isEmpty) }
            } else if name.hasPrefix("y_") {
                checkedY += 1
                let duplicate = name.hasPrefix("y_object_duplicated_key")
                switch plain {
                case .success: #expect(!duplicate, "\(name) should be rejected for its duplicate key")
                case .failure(let e): #expect(duplicate && e.code == .duplicateKey, "\(name): \(e)")
                }
                switch (tree, JSONCorpusTests.treeRejections[name]) {
                case (.success, nil): break
                case (.success, let code?): Issue.record("\(name) accepted; expected \(code)")
                case (.failure(let e), nil): Issue.record("\(name) rejected: \(e)")
                case (.failure(let e), let code?): #expect(e.code == code, "\(name): \(e)")
                }
            }
            // i_ files: either answer is fine; they must not crash.
        }
        #expect(checkedN >= 180)
        #expect(checkedY >= 90)
    }
}

@Suite struct JSONTests {
    @Test("integers stay exact, other numbers are doubles, -0 is 0")
    func numbers() throws {
        #expect(try Tree(json: "5").leaf == .int(5))
        #expect(try Tree(json: "9007199254740993").leaf.map { if case .int(9_007_199_254_740_993) = $0 { true } else { false } } == true)
        #expect(try Tree(json: "9223372036854775807").leaf.map { if case .int(Int64.max) = $0 { true } else { false } } == true)
        if case .double(let d)? = try Tree(json: "9223372036854775808").leaf {
            #expect(d == 9_223_372_036_854_775_808.0)
        } else {
            Issue.record("int64 overflow should become a double")
        }
        if case .double(let d)? = try Tree(json: "-0.0").leaf { #expect(d.sign == .plus) } else { Issue.record("-0.0") }
        #expect(try Tree(json: "-0").leaf == .int(0))
        #expect(try Tree(json: "1E2").leaf == .double(100))
        for bad in ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"] {
            do {
                _ = try Tree(json: bad)
                Issue.record("\(bad) accepted")
            } catch {
                #expect(error.code == .invalidNumber, "\(bad): \(error)")
            }
        }
        #expect(try Tree(json: "1e-400").leaf == .double(0))
        #expect(JSONWriter.string(try Tree(json: "[5.0, 5, 0.1, 1e21, -3]")) == "[5.0,5,0.1,1e+21,-3]")
    }

    @Test("deep input is rejected before it can exhaust the stack")
    func depth() {
        let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        do {
            _ = try TreeReader.read(deep)
            Issue.record("accepted")
        } catch {
            #expect(error.code == .depthExceeded)
        }
        do {
            _ = try JSONValue(parsing: deep)
            Issue.record("accepted")
        } catch {
            #expect(error.code == .depthExceeded)
        }
        let objects = String(repeating: "{\"a\":", count: 50_000) + "1" + String(repeating: "}", count: 50_000)
        #expect(throws: TreeError.self) { try TreeReader.read(objects) }
    }

    @Test("32 levels including the location are allowed, 33 are not")
    func depthLimit() throws {
        func nested(_ n: Int) -> String { String(repeating: "{\"a\":", count: n) + "1" + String(repeating: "}", count: n) }
        _ = try TreeReader.read(nested(32))
        #expect(throws: TreeError.self) { try TreeReader.read(nested(33)) }
        let location = try Path(parsing: "x/y")
        _ = try TreeReader.read(nested(30), at: location)
        do {
            _ = try TreeReader.read(nested(31), at: location)
            Issue.record("accepted")
        } catch {
            #expect(error.code == .depthExceeded)
            #expect(error.path.hasPrefix("/x/y/a"))
        }
    }

    @Test("bad keys and metadata get typed errors naming the path")
    func badData() {
        let cases: [(String, TreeError.Code, String)] = [
            ("{\"a\":{\"b.c\":1}}", .invalidKey, "/a"),
            ("{\"a\":{\"\":1}}", .invalidKey, "/a"),
            ("{\"a\":1,\"a\":2}", .duplicateKey, "/a"),
            ("{\".value\":1,\"x\":2}", .invalidMetadata, "/"),
            ("{\".priority\":true,\"x\":2}", .invalidPriority, "/"),
            ("{\".foo\":1}", .invalidKey, "/"),
            ("{\"t\":{\".sv\":\"timestamp\"}}", .invalidServerValue, "/t"),
            ("{\"a\":[1,2,{\"$\":1}]}", .invalidKey, "/a/2"),
            ("\u{FEFF}1", .invalidJSON, "/"),
            ("{\"a\":1} x", .invalidJSON, "/"),
        ]
        for (json, code, path) in cases {
            do {
                _ = try TreeReader.read(json)
                Issue.record("accepted: \(json)")
            } catch {
                #expect(error.code == code, "\(json): \(error)")
                #expect(error.path == path, "\(json): \(error)")
            }
        }
    }

    @Test("key paths longer than 768 bytes are rejected")
    func pathBytes() {
        let key = String(repeating: "k", count: 400)
        #expect(throws: TreeError.self) { try TreeReader.read("{\"\(key)\":{\"\(key)\":1}}") }
    }

    @Test("strings over the size limit are rejected")
    func stringLimit() {
        var limits = TreeReadLimits()
        limits.maxStringBytes = 10
        #expect(throws: TreeError.self) { try TreeReader.read("\"01234567890\"", limits: limits) }
        #expect(throws: TreeError.self) { try TreeReader.read("\"0123456789\\n\"", limits: limits) }
        #expect((try? TreeReader.read("\"0123456789\"", limits: limits)) != nil)
    }

    @Test("escapes decode, including surrogate pairs; lone surrogates are rejected")
    func escapes() throws {
        #expect(try Tree(json: "\"a\\u00e9\\ud83d\\ude00\\n\\\"\"").leaf == .string("aé😀\n\""))
        #expect(throws: TreeError.self) { try Tree(json: "\"\\ud800\"") }
        #expect(throws: TreeError.self) { try Tree(json: "\"\\udc00x\"") }
        #expect(throws: TreeError.self) { try TreeReader.read([0x22, 0xC3, 0x28, 0x22]) }
    }

    @Test("empty objects and nulls vanish; arrays become index-keyed objects")
    func emptiness() throws {
        #expect(try Tree(json: "{\"a\":{},\"b\":null,\"c\":{\"d\":{}}}").isEmpty)
        #expect(try Tree(json: "{\".priority\":5}").isEmpty)
        let array = try Tree(json: "[\"x\",null,\"z\"]")
        #expect(array.childCount == 2)
        #expect(array.child(ChildKey(unchecked: "2")).leaf == .string("z"))
        #expect(JSONWriter.string(array) == "[\"x\",null,\"z\"]")
        #expect(JSONWriter.string(array, format: .export) == "{\"0\":\"x\",\"2\":\"z\"}")
    }

    @Test("array rendering follows Firebase's rule (all index keys, max < 2 * count)")
    func arrays() throws {
        #expect(JSONWriter.string(try Tree(json: "{\"0\":1,\"1\":2}")) == "[1,2]")
        #expect(JSONWriter.string(try Tree(json: "{\"0\":1,\"3\":2}")) == "[1,null,null,2]")
        #expect(JSONWriter.string(try Tree(json: "{\"0\":1,\"4\":2}")) == "{\"0\":1,\"4\":2}")
        #expect(JSONWriter.string(try Tree(json: "{\"00\":1,\"1\":2}")) == "{\"00\":1,\"1\":2}")
        #expect(JSONWriter.string(try Tree(json: "{\"1\":1,\"a\":2}")) == "{\"1\":1,\"a\":2}")
    }

    @Test("the export format round-trips priorities and writes keys in Firebase order")
    func exportRoundTrip() throws {
        let text = "{\".priority\":\"top\",\"10\":{\".value\":true,\".priority\":2.5},\"9\":\"x\",\"b\":{\"c\":null,\"d\":-7},\"a\":\"q\\u0001\"}"
        let node = try Tree(json: text)
        let export = JSONWriter.string(node, format: .export)
        #expect(export == "{\".priority\":\"top\",\"9\":\"x\",\"10\":{\".value\":true,\".priority\":2.5},\"a\":\"q\\u0001\",\"b\":{\"d\":-7}}")
        #expect(try Tree(json: export) == node)
        #expect(JSONWriter.string(node) == "{\"9\":\"x\",\"10\":true,\"a\":\"q\\u0001\",\"b\":{\"d\":-7}}")
        let pretty = JSONWriter.string(node, format: .export, pretty: true)
        #expect(try Tree(json: pretty) == node)
    }

    @Test("nested .value wrappers cannot exhaust the stack")
    func nestedDotValue() {
        let deep = String(repeating: "{\".value\":", count: 100_000) + "1" + String(repeating: "}", count: 100_000)
        #expect(throws: TreeError.self) { try TreeReader.read(deep) }
        let mixed = String(repeating: "{\"a\":{\".value\":", count: 20_000) + "1" + String(repeating: "}}", count: 20_000)
        #expect(throws: TreeError.self) { try TreeReader.read(mixed) }
    }

    @Test(".value may hold a server value, resolved like any other")
    func dotValueServerValue() throws {
        let node = try TreeReader.read(
            "{\".value\":{\".sv\":\"timestamp\"},\".priority\":1}", serverValues: ServerValueContext(timestamp: 77))
        #expect(node == Tree(.int(77), priority: .number(1)))
        #expect(throws: TreeError.self) { try TreeReader.read("{\".value\":{\"a\":1}}") }
    }

    @Test("inputs over the byte limit are rejected before parsing")
    func byteLimit() {
        var limits = TreeReadLimits()
        limits.maxBytes = 8
        do {
            _ = try TreeReader.read("[1,2,3,4,5]", limits: limits)
            Issue.record("accepted")
        } catch {
            #expect(error.code == .inputTooLarge)
        }
        limits.maxBytes = 100
        limits.maxValues = 4
        #expect(throws: TreeError.self) { try TreeReader.read("[1,2,3,4,5]", limits: limits) }
    }

    @Test("numbers beyond 2^53 order and compare as doubles, consistently")
    func bigNumbers() throws {
        // 2^53 + 1 (int) and 2^53 (double and int) are the same double: equal, ordered by key.
        let node = try Tree(json: "{\"a\":9007199254740993,\"b\":9007199254740992.0,\"c\":9007199254740992}")
        let values = node.children.elements().map(\.value)
        for x in values {
            for y in values { #expect(Tree.compareValues(x, y) == 0) }
        }
        #expect(values[0] == values[2])
        #expect(values[0].hashString == values[2].hashString)
    }
}

@Suite struct JSONStreamTests {
    @Test("streamed output equals the one-shot output, in chunks near the requested size")
    func stream() throws {
        var node = Tree.empty
        for i in 0..<3_000 {
            node.set(Tree(.string("value \(i) with some text")), at: Path(segments: [ChildKey(unchecked: "k\(i % 37)"), ChildKey(unchecked: "item\(i)")]))
        }
        var chunks: [[UInt8]] = []
        try JSONWriter.stream(node, format: .export, chunkBytes: 4_096) { chunks.append($0) }
        #expect(chunks.flatMap { $0 } == JSONWriter.bytes(node, format: .export))
        #expect(chunks.count > 10)
        #expect(chunks.dropLast().allSatisfy { $0.count >= 4_096 && $0.count < 4_096 + 2_048 })
        struct Stop: Error {}
        #expect(throws: Stop.self) { try JSONWriter.stream(node, chunkBytes: 1_000) { _ in throw Stop() } }
    }
}

/// Values delimited, not decoded: the members of a multi-path update, the data inside a wire
/// envelope.
@Suite struct RawJSONTests {
    @Test("an object's members are delimited with strings and brackets inside them; not an object is nil; bad text is an error")
    func members() throws {
        let text = #" { "a" : [1, {"x": "]}\""}] , "b/c":"}" ,"d":-1.5e3,"e":{} } "#
        let bytes = Array(text.utf8)
        let members = try #require(try JSONValue.members(rawIn: bytes))
        #expect(members.map(\.key) == ["a", "b/c", "d", "e"])
        #expect(members.map { String(decoding: bytes[$0.value], as: UTF8.self) } == [#"[1, {"x": "]}\""}]"#, #""}""#, "-1.5e3", "{}"])
        #expect(try JSONValue.members(rawIn: Array("{}".utf8))?.isEmpty == true)
        #expect(try JSONValue.members(rawIn: Array("[1,2]".utf8)) == nil)
        #expect(try JSONValue.members(rawIn: Array(#""x""#.utf8)) == nil)
        for bad in [#"{"a":[}]}"#, #"{"a":{"b":1]}"#, #"{"a":"x\"}"#, #"{"a":1,"a":2}"#, #"{"a":1"#, #"{"a" 1}"#, #"{a:1}"#, #"{"a":"x}"#, #"{"a":1,}"#, #"{"a":1} 2"#, "", #"{"a":}"#] {
            #expect(throws: TreeError.self, "\(bad)") { try JSONValue.members(rawIn: Array(bad.utf8)) }
        }
    }

    @Test("one member left raw in an envelope, at any depth and in any order; absent is nil")
    func leavingRaw() throws {
        let text = #"{"d":{"b":{"d":{"deep":[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]},"p":"/a"},"r":3},"t":"d"}"#
        let (value, raw) = try JSONValue.parse(Array(text.utf8), leavingRaw: ["d", "b", "d"], maxDepth: 8)
        let range = try #require(raw)
        #expect(String(decoding: Array(text.utf8)[range], as: UTF8.self).hasPrefix(#"{"deep":[[["#))
        #expect(value["d"]?["r"] == .int(3) && value["d"]?["b"]?["d"] == .null && value["d"]?["b"]?["p"] == .string("/a"))
        #expect(try JSONValue.parse(Array(#"{"d":{"r":1}}"#.utf8), leavingRaw: ["d", "b", "d"]).raw == nil)
        // Brackets must match even in the part nobody decodes, or members after it could hide.
        #expect(throws: TreeError.self) { try JSONValue.parse(Array(#"{"d":{"b":{"d":[}, "p":"/a"], "p":"/b"}}}"#.utf8), leavingRaw: ["d", "b", "d"]) }
        // The envelope's own depth stays bounded.
        #expect(throws: TreeError.self) { try JSONValue.parse(Array(#"{"x":[[[[[[[[[[1]]]]]]]]]]}"#.utf8), leavingRaw: ["d"], maxDepth: 8) }
    }
}


/// The queued onDisconnect writes of one connection, as the SDKs model them (reference §2.9).
@Suite struct OnDisconnectTreeTests {
    static func json(_ text: String) throws -> JSONValue { try JSONValue(parsing: text) }
    static func rendered(_ tree: OnDisconnectTree) -> [String] {
        tree.entries.map { "/" + $0.path.joined(separator: "/") + "=" + $0.value.jsonString }
    }

    @Test("a set replaces what is queued at or below it; a set below a queued value updates that value")
    func sets() throws {
        var t = OnDisconnectTree()
        #expect(t.isEmpty)
        t.set(["users", "ada", "online"], .bool(false))
        t.set(["users", "bob"], try Self.json(#"{"online":false}"#))
        #expect(Self.rendered(t) == [#"/users/ada/online=false"#, #"/users/bob={"online":false}"#])
        // A set at the parent replaces both.
        t.set(["users"], try Self.json(#"{"x":1}"#))
        #expect(Self.rendered(t) == [#"/users={"x":1}"#])
        // Sets below it update the queued value: add a child, replace one, remove one with null.
        t.set(["users", "y", "z"], .int(2))
        t.set(["users", "x"], .string("one"))
        #expect(Self.rendered(t) == [#"/users={"y":{"z":2},"x":"one"}"#])
        t.set(["users", "x"], .null)
        t.set(["users", "y", "z"], .null)
        // Nothing left in it: it fires as a delete.
        #expect(Self.rendered(t) == [#"/users=null"#])
        // Under a leaf: the leaf becomes an object holding the child, keeping its priority.
        var u = OnDisconnectTree()
        u.set(["a"], try Self.json(#"{".value":5,".priority":2}"#))
        u.set(["a", "b"], .bool(true))
        #expect(Self.rendered(u) == [#"/a={"b":true,".priority":2}"#])
        // A server value stays a placeholder until the writes fire.
        u.set(["t"], try Self.json(#"{".sv":"timestamp"}"#))
        #expect(Self.rendered(u).last == #"/t={".sv":"timestamp"}"#)
    }

    @Test("om is a set per child; oc forgets at or below a path, splitting a queued ancestor into its children (its priority dropped), never a leaf")
    func updatesAndCancels() throws {
        var t = OnDisconnectTree()
        t.update(["p"], [(["a"], .int(1)), (["b", "c"], .int(2))])
        #expect(Self.rendered(t) == ["/p/a=1", "/p/b/c=2"])
        t.cancel(["p", "b"])
        #expect(Self.rendered(t) == ["/p/a=1"])
        t.cancel(["nothing", "here"])
        #expect(Self.rendered(t) == ["/p/a=1"])
        // Split: an object queued at /q loses only its child x.
        t.set(["q"], try Self.json(#"{"x":{"deep":1},"y":2,"z":[3,4],".priority":9}"#))
        t.cancel(["q", "x", "deep"])
        #expect(Self.rendered(t) == ["/p/a=1", "/q/y=2", "/q/z=[3,4]"])
        t.cancel(["q", "z", "0"])
        #expect(Self.rendered(t) == ["/p/a=1", "/q/y=2", "/q/z/1=4"])
        // A leaf keeps its value: there is nothing under it to forget.
        t.set(["r"], .string("leaf"))
        t.cancel(["r", "s"])
        #expect(Self.rendered(t).last == "/r=\"leaf\"")
        t.cancel([])
        #expect(t.isEmpty && t.entries.isEmpty)
    }

    @Test("the SDK's node rules inside a queued value: an empty child under a leaf changes nothing, .priority sets or clears the priority, children without data do not count, .value wraps")
    func nodeRules() throws {
        var t = OnDisconnectTree()
        t.set(["a"], .int(5))
        t.set(["a", "x"], .null)
        t.set(["a", "y", "z"], .null)
        #expect(Self.rendered(t) == ["/a=5"], "a leaf stays when an empty child is written under it")
        t.set(["a", ".priority"], .int(3))
        #expect(Self.rendered(t) == [#"/a={".value":5,".priority":3}"#])
        t.set(["a", ".priority"], .null)
        #expect(Self.rendered(t) == ["/a=5"])
        t.set(["b"], try Self.json(#"{"k":1,".priority":1}"#))
        t.set(["b", ".priority"], .string("p"))
        #expect(Self.rendered(t).last == #"/b={"k":1,".priority":"p"}"#, "one priority, replaced")
        // Children without data are no children: a split leaves nothing for them.
        t.set(["q"], try Self.json(#"{"a":null,"b":1,"c":{}}"#))
        t.cancel(["q", "b"])
        #expect(!Self.rendered(t).contains { $0.hasPrefix("/q") })
        // A .value holding an object is that object's children, with the priority.
        t.set(["v"], try Self.json(#"{".value":{"a":1},".priority":2}"#))
        t.set(["v", "b"], .int(2))
        #expect(Self.rendered(t).last == #"/v={"a":1,"b":2,".priority":2}"#)
        t.cancel(["v", "a"])
        #expect(Self.rendered(t).last == "/v/b=2")
        // Keys compare by their bytes: precomposed and decomposed é are two keys.
        var u = OnDisconnectTree()
        u.set(["\u{E9}"], .int(1))
        u.set(["e\u{301}"], .int(2))
        #expect(u.entries.count == 2)
        u.cancel(["e\u{301}"])
        #expect(u.entries.map(\.path) == [["\u{E9}"]])
    }
}
