import BanyanTree
import Testing

func node(_ json: String) -> Tree {
    do {
        return try Tree(json: json)
    } catch {
        Issue.record("bad test JSON \(json): \(error)")
        return .empty
    }
}

func path(_ text: String) -> Path {
    (try? Path(parsing: text)) ?? .root
}

@Suite struct WriteTests {
    @Test("set replaces data and clears the priority unless the data carries one")
    func setClearsPriority() throws {
        var tree = node("{\"a\":{\".value\":1,\".priority\":5}}")
        try tree.apply(set: node("2"), at: WritePath(path: path("a")))
        #expect(tree == node("{\"a\":2}"))
        try tree.apply(set: node("{\".value\":3,\".priority\":\"p\"}"), at: WritePath(path: path("a")))
        #expect(tree.child(at: path("a")).priority == .string("p"))
    }

    @Test("replaceEntry writes in place and returns the old entry only where set(old) restores the tree exactly")
    func replaceEntry() throws {
        let start = node(#"{"a": {"b": 1, "c": {"d": 2}}, "e": 3}"#)
        var tree = start
        #expect(tree.replaceEntry(node("5"), at: path("/a/b")) == node("1"))
        #expect(tree == node(#"{"a": {"b": 5, "c": {"d": 2}}, "e": 3}"#))
        #expect(tree == start.setting(node("5"), at: path("/a/b")))
        tree.set(node("1"), at: path("/a/b"))
        #expect(tree == start)
        // A new key under a parent with children: the old entry is empty.
        #expect(tree.replaceEntry(node("7"), at: path("/a/x")) == .empty)
        #expect(tree == start.setting(node("7"), at: path("/a/x")))
        tree.set(.empty, at: path("/a/x"))
        #expect(tree == start)
        // A missing or leaf parent, the root, or an empty node: nothing changes.
        for (p, n) in [("/q/r", "1"), ("/e/f", "1"), ("/a/b/z", "1"), ("/", "1"), ("/a/b", "null")] {
            #expect(tree.replaceEntry(node(n), at: path(p)) == nil, "\(p)")
            #expect(tree == start, "\(p)")
        }
    }

    @Test("set below a leaf replaces the leaf with children, keeping its priority")
    func setBelowLeaf() throws {
        var tree = node("{\"a\":{\".value\":1,\".priority\":5}}")
        try tree.apply(set: node("true"), at: WritePath(path: path("a/b")))
        #expect(tree == node("{\"a\":{\".priority\":5,\"b\":true}}"))
    }

    @Test("removing the last child removes empty parents and their priorities")
    func removeCollapses() throws {
        var tree = node("{\"a\":{\".priority\":1,\"b\":{\"c\":1}},\"x\":1}")
        try tree.apply(set: .empty, at: WritePath(path: path("a/b/c")))
        #expect(tree == node("{\"x\":1}"))
        try tree.apply(set: .empty, at: WritePath(path: path("x")))
        #expect(tree.isEmpty)
    }

    @Test("writes never change a shared earlier version (structural sharing)")
    func persistence() throws {
        let before = node("{\"a\":{\"b\":1,\"c\":2},\"d\":{\"e\":3}}")
        var after = before
        try after.apply(set: node("9"), at: WritePath(path: path("a/b")))
        #expect(before == node("{\"a\":{\"b\":1,\"c\":2},\"d\":{\"e\":3}}"))
        #expect(after == node("{\"a\":{\"b\":9,\"c\":2},\"d\":{\"e\":3}}"))
        #expect(before.child(ChildKey(unchecked: "d")).children.isIdentical(to: after.child(ChildKey(unchecked: "d")).children))
    }

    @Test("multi-path update applies every entry and keeps the location's priority")
    func update() throws {
        var tree = node("{\"u\":{\".priority\":7,\"a\":1,\"b\":{\"c\":1,\"d\":2}}}")
        let entries = [
            UpdateEntry(path: try WritePath(parsing: "a"), value: node("10")),
            UpdateEntry(path: try WritePath(parsing: "b/c"), value: .empty),
            UpdateEntry(path: try WritePath(parsing: "e/f"), value: node("\"new\"")),
            UpdateEntry(path: try WritePath(parsing: "b/.priority"), value: node("3")),
        ]
        try tree.apply(update: entries, at: path("u"))
        #expect(tree == node("{\"u\":{\".priority\":7,\"a\":10,\"b\":{\".priority\":3,\"d\":2},\"e\":{\"f\":\"new\"}}}"))
    }

    @Test("overlapping update paths are rejected and nothing is applied", arguments: [
        ["a", "a/b"], ["a/b", "a"], ["x/y", "x/y"], ["a", "a/.priority"], ["b", "c", "c/d/e"],
    ])
    func overlapping(paths: [String]) throws {
        let original = node("{\"a\":{\"b\":1}}")
        var tree = original
        let entries = try paths.map { UpdateEntry(path: try WritePath(parsing: $0), value: node("1")) }
        do {
            try tree.apply(update: entries, at: .root)
            Issue.record("accepted \(paths)")
        } catch {
            #expect(error.code == .overlappingPaths)
        }
        #expect(tree == original)
    }

    @Test("sibling paths that share a prefix string do not overlap")
    func prefixNotAncestor() throws {
        var tree = Tree.empty
        try tree.apply(update: [
            UpdateEntry(path: try WritePath(parsing: "ab"), value: node("1")),
            UpdateEntry(path: try WritePath(parsing: "a"), value: node("2")),
            UpdateEntry(path: try WritePath(parsing: "a-b/c"), value: node("3")),
        ], at: .root)
        #expect(tree == node("{\"a\":2,\"ab\":1,\"a-b\":{\"c\":3}}"))
    }

    @Test("setPriority on an empty location is an error; elsewhere it sets the priority")
    func setPriority() throws {
        var tree = node("{\"a\":1}")
        do {
            try tree.apply(setPriority: .number(1), at: path("missing"))
            Issue.record("accepted")
        } catch {
            #expect(error.code == .emptyLocation)
        }
        try tree.apply(setPriority: .string("p"), at: path("a"))
        #expect(tree.child(at: path("a")).priority == .string("p"))
        try tree.apply(set: node("4"), at: try WritePath(parsing: "a/.priority"))
        #expect(tree.child(at: path("a")).priority == .number(4))
    }

    @Test("server timestamps resolve once per write, at any depth and as priorities")
    func timestamps() throws {
        let context = ServerValueContext(timestamp: 1_700_000_000_123)
        let value = try TreeReader.read(
            "{\"t\":{\".sv\":\"timestamp\"},\"n\":{\"m\":{\".sv\":\"timestamp\"}},\".priority\":{\".sv\":\"timestamp\"}}",
            serverValues: context)
        #expect(value.child(at: path("t")).leaf == .int(1_700_000_000_123))
        #expect(value.child(at: path("n/m")).leaf == .int(1_700_000_000_123))
        #expect(value.priority == .number(1_700_000_000_123))
    }

    @Test("increments add to the existing value at their exact path", arguments: [
        ("{\"c\":5}", "3", "8"),
        ("{\"c\":5}", "0.5", "5.5"),
        ("{\"c\":1.5}", "2", "3.5"),
        ("{\"c\":\"text\"}", "2", "2"),
        ("{\"c\":true}", "2", "2"),
        ("{\"c\":{\"d\":1}}", "2", "2"),
        ("{}", "-4", "-4"),
        ("{\"c\":9223372036854775807}", "1", "9.223372036854776e+18"),
    ])
    func increments(existing: String, delta: String, expected: String) throws {
        let tree = node(existing)
        let value = try TreeReader.read(
            "{\".sv\":{\"increment\":\(delta)}}", at: path("c"),
            serverValues: ServerValueContext(timestamp: 0, existing: tree))
        #expect(JSONWriter.string(value) == expected)
    }

    @Test("unknown server values are rejected")
    func unknownServerValue() {
        for bad in ["{\".sv\":\"now\"}", "{\".sv\":{\"increment\":\"x\"}}", "{\".sv\":{\"decrement\":1}}", "{\".sv\":1,\"a\":1}"] {
            #expect(throws: TreeError.self, "\(bad)") {
                try TreeReader.read(bad, serverValues: ServerValueContext(timestamp: 1))
            }
        }
    }

    @Test("compare-and-set applies only when the hash matches")
    func compareAndSet() {
        var tree = node("{\"counter\":1}")
        let stale = node("0").hashString
        #expect(tree.compareAndSet(node("2"), at: path("counter"), expectedHash: stale) == .mismatch(current: node("1")))
        #expect(tree.compareAndSet(node("2"), at: path("counter"), expectedHash: node("1").hashString) == .applied)
        #expect(tree == node("{\"counter\":2}"))
        #expect(tree.compareAndSet(node("1"), at: path("fresh"), expectedHash: "") == .applied)
    }

    @Test("priority entries apply after data entries, whatever their order in the update")
    func updatePriorityOrder() throws {
        for order in [["a/.priority", "a/b"], ["a/b", "a/.priority"]] {
            var tree = Tree.empty
            try tree.apply(update: try order.map { text in
                UpdateEntry(path: try WritePath(parsing: text), value: text.hasSuffix(".priority") ? node("5") : node("1"))
            }, at: .root)
            #expect(tree == node("{\"a\":{\".priority\":5,\"b\":1}}"), "order \(order)")
        }
    }

    @Test("writes check depth and key-path length against their location")
    func writeLimits() throws {
        let deepData = try Tree(json: String(repeating: "{\"k\":", count: 15) + "1" + String(repeating: "}", count: 15))
        let location = try Path(parsing: (0..<20).map { "p\($0)" }.joined(separator: "/"))
        var tree = Tree.empty
        do {
            try tree.apply(set: deepData, at: WritePath(path: location))
            Issue.record("accepted 35 levels")
        } catch {
            #expect(error.code == .depthExceeded)
        }
        do {
            try tree.apply(update: [UpdateEntry(path: try WritePath(parsing: "x"), value: deepData)], at: location)
            Issue.record("accepted 36 levels")
        } catch {
            #expect(error.code == .depthExceeded)
        }
        #expect(tree.isEmpty)
        let longKey = String(repeating: "q", count: 500)
        let wide = try Tree(json: "{\"\(longKey)\":1}")
        #expect(throws: TreeError.self) { try tree.apply(set: wide, at: WritePath(path: try Path(parsing: longKey))) }
        try tree.apply(set: deepData, at: WritePath(path: try Path(parsing: "ok")))
        #expect(!tree.isEmpty)
    }
}
