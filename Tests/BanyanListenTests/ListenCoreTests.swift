import BanyanBasics
import BanyanListen
import BanyanQuery
import BanyanTree
import Testing

private func node(_ json: String) -> Tree {
    do { return try Tree(json: json) } catch {
        Issue.record("bad JSON \(json): \(error)")
        return .empty
    }
}

private func path(_ text: String) -> Path {
    do { return try Path(parsing: text) } catch {
        Issue.record("bad path \(text): \(error)")
        return .root
    }
}

/// Renders an event as `listen:kind path json` (merges list `relative=json` pairs).
private func trace(_ events: [ListenEvent]) -> [String] {
    events.map { e in
        let tag = e.tag.map { " #\($0)" } ?? ""
        switch e.update {
        case let .put(p, tree): return "\(e.listen)\(tag) put \(p) \(JSONWriter.string(tree))"
        case let .merge(p, children):
            return "\(e.listen)\(tag) merge \(p) " + children.map { "\($0.path)=\(JSONWriter.string($0.tree))" }.joined(separator: " ")
        }
    }
}

/// Applies writes to a tree and feeds them to a core, as the driver does.
private struct Fixture {
    var tree: Tree
    var core = ListenCore()

    init(_ json: String) { tree = node(json) }

    mutating func listen(_ id: UInt64, owner: UInt64 = 1, at location: String, params: QueryParams? = nil, tag: UInt64? = nil) throws -> [String] {
        trace([try core.listen(Listen(id: id, owner: owner, namespace: "ns", path: path(location), params: params, tag: tag), tree: tree)])
    }

    mutating func set(_ location: String, _ json: String) -> [String] {
        tree.set(node(json), at: path(location))
        return trace(core.applied(namespace: "ns", written: [path(location)], tree: tree))
    }

    mutating func update(_ writes: [(String, String)]) -> [String] {
        for (p, json) in writes { tree.set(node(json), at: path(p)) }
        return trace(core.applied(namespace: "ns", written: writes.map { path($0.0) }, tree: tree))
    }
}

@Suite struct ListenCoreTests {
    @Test("a listen's first update is its whole value; writes at, above and below it become puts, a multi-path update a merge")
    func defaultListen() throws {
        var f = Fixture("{\"a\":{\"b\":{\"c\":1},\"d\":2},\"x\":3}")
        #expect(try f.listen(1, at: "/a") == ["1 put /a {\"b\":{\"c\":1},\"d\":2}"])
        #expect(f.set("/a/b/c", "5") == ["1 put /a/b/c 5"])
        #expect(f.set("/a", "{\"e\":1}") == ["1 put /a {\"e\":1}"])
        #expect(f.set("/", "{\"a\":7}") == ["1 put /a 7"])
        #expect(f.set("/x", "4").isEmpty, "a sibling's write touches nothing")
        #expect(f.update([("/a/p/q", "1"), ("/a/p/r", "null")]) == ["1 merge /a/p /q=1 /r=null"])
        #expect(f.update([("/a/m", "1"), ("/z", "2")]) == ["1 put /a/m 1"])
        #expect(f.core.applied(namespace: "other", written: [path("/a")], tree: f.tree).isEmpty)
    }

    @Test("one owner listening at /a and /a/b gets each write once; another owner gets its own")
    func deduplicatesPerOwner() throws {
        var f = Fixture("{\"a\":{\"b\":{\"c\":1}}}")
        _ = try f.listen(1, owner: 7, at: "/a")
        _ = try f.listen(2, owner: 7, at: "/a/b")
        _ = try f.listen(3, owner: 8, at: "/a/b")
        #expect(f.set("/a/b/c", "2") == ["1 put /a/b/c 2", "3 put /a/b/c 2"])
        // A write at /a/b: /a gets put /a/b, /a/b gets put /a/b (the same update): once for owner 7.
        #expect(f.set("/a/b", "9") == ["1 put /a/b 9", "3 put /a/b 9"])
        // Tagged listens are never merged with others: each tag is its own view on the client.
        var params = QueryParams()
        params.limit = 5
        _ = try f.listen(4, owner: 7, at: "/a", params: params, tag: 11)
        #expect(f.set("/a/q", "1") == ["1 put /a/q 1", "4 #11 put /a {\"b\":9,\"q\":1}"])
    }

    @Test("an owner's untagged window and default listen at one location both get their own update (a window is never merged with a default listen)")
    func windowNotMergedWithDefault() throws {
        var f = Fixture("{\"s\":{\"a\":1,\"b\":2,\"c\":3}}")
        var params = QueryParams()
        params.limit = 1
        _ = try f.listen(1, owner: 5, at: "/s", params: params)
        _ = try f.listen(2, owner: 5, at: "/s")
        #expect(f.set("/s", "{\"x\":1,\"y\":2}") == ["1 put /s {\"x\":1}", "2 put /s {\"x\":1,\"y\":2}"])
    }

    @Test("a limited window that gains or loses children is sent whole and tagged; a changed child inside it as a merge")
    func windowedListen() throws {
        var f = Fixture("{\"s\":{\"a\":{\"n\":1},\"b\":{\"n\":2},\"c\":{\"n\":3}}}")
        let params = try Query().orderByChild("n").limitToFirst(2).params
        #expect(try f.listen(1, at: "/s", params: params, tag: 3) == ["1 #3 put /s {\"a\":{\"n\":1},\"b\":{\"n\":2}}"])
        #expect(f.set("/s/c/n", "4").isEmpty, "a child outside the window changed")
        #expect(f.set("/s/a/x", "true") == ["1 #3 merge /s /a={\"n\":1,\"x\":true}"])
        #expect(f.set("/s/d", "{\"n\":0}") == ["1 #3 put /s {\"a\":{\"n\":1,\"x\":true},\"d\":{\"n\":0}}"])
        #expect(f.set("/s/a", "null") == ["1 #3 put /s {\"b\":{\"n\":2},\"d\":{\"n\":0}}"])
        // A query's view of a leaf is what `QueryParams.evaluate` renders for it (null).
        #expect(f.set("/", "{\"s\":5}") == ["1 #3 put /s null"])
        #expect(f.set("/s", "{\"k\":{\"n\":1}}") == ["1 #3 put /s {\"k\":{\"n\":1}}"])
    }

    @Test("unlisten and a connection's end forget listens; ids are unique; restored resends every value")
    func lifecycle() throws {
        var f = Fixture("{\"a\":1,\"b\":2}")
        _ = try f.listen(1, owner: 1, at: "/a")
        _ = try f.listen(2, owner: 2, at: "/b")
        _ = try f.listen(3, owner: 2, at: "/")
        #expect(throws: ListenError.duplicateID(1)) { try f.core.listen(Listen(id: 1, owner: 9, namespace: "ns", path: .root), tree: f.tree) }
        f.core.unlisten(1)
        f.core.unlisten(42)
        #expect(f.set("/a", "5") == ["3 put /a 5"])
        f.core.removeOwner(2)
        #expect(f.core.count == 0)
        #expect(f.set("/b", "5").isEmpty)
        _ = try f.listen(4, at: "/a")
        _ = try f.listen(5, at: "/b", params: try Query().orderByKey().limitToLast(1).params, tag: 2)
        #expect(trace(f.core.restored(namespace: "ns", tree: node("{\"a\":{\"x\":1},\"b\":{\"y\":1,\"z\":2}}"))) == [
            "4 put /a {\"x\":1}", "5 #2 put /b {\"z\":2}",
        ])
    }

    /// Property: after any sequence of writes, applying the updates a default listen received to
    /// the value it first got yields exactly the value at its location.
    @Test("replaying a default listen's updates reproduces its location's value", arguments: [UInt64(1), 2, 3, 4, 5, 6, 7, 8])
    func replayMatches(seed: UInt64) throws {
        var random = SeededRandom(seed: seed)
        let keys = ["a", "b", "c"]
        func randomPath(_ maxDepth: Int) -> Path {
            Path(segments: (0..<random.below(maxDepth + 1)).map { _ in ChildKey(unchecked: keys[random.below(keys.count)]) })
        }
        func randomValue() -> Tree {
            switch random.below(4) {
            case 0: return .empty
            case 1: return Tree(.int(Int64(random.below(100))))
            default:
                let first = random.below(3)
                return node("{\"\(keys[first])\":\(random.below(9)),\"\(keys[(first + 1 + random.below(2)) % 3])\":{\"a\":1}}")
            }
        }
        var tree = Tree.empty
        var core = ListenCore()
        var mirrors: [UInt64: (location: Path, value: Tree)] = [:]
        for id in UInt64(1)...6 {
            let location = randomPath(2)
            let first = try core.listen(Listen(id: id, owner: id, namespace: "ns", path: location), tree: tree)
            guard case .put(_, let value) = first.update else { Issue.record("first update is not a put"); return }
            mirrors[id] = (location, value)
        }
        for _ in 0..<200 {
            let count = 1 + random.below(3)
            var written: [Path] = []
            for _ in 0..<count {
                let p = randomPath(3)
                // A multi-path update's paths never overlap.
                if written.contains(where: { $0.contains(p) || p.contains($0) }) { continue }
                tree.set(randomValue(), at: p)
                written.append(p)
            }
            for event in core.applied(namespace: "ns", written: written, tree: tree) {
                guard var mirror = mirrors[event.listen] else { continue }
                switch event.update {
                case let .put(p, value):
                    guard let relative = mirror.location.relative(p) else { Issue.record("put \(p) outside \(mirror.location)"); continue }
                    mirror.value.set(value, at: relative)
                case let .merge(p, children):
                    guard let base = mirror.location.relative(p) else { Issue.record("merge \(p) outside \(mirror.location)"); continue }
                    for child in children { mirror.value.set(child.tree, at: base.appending(child.path)) }
                }
                mirrors[event.listen] = mirror
            }
            for (id, mirror) in mirrors {
                #expect(mirror.value == tree.child(at: mirror.location), "listen \(id) at \(mirror.location) drifted")
            }
        }
    }
}
