import BanyanQuery
import BanyanTree
import Testing

private func node(_ json: String) -> Tree {
    do { return try Tree(json: json) } catch {
        Issue.record("bad JSON \(json): \(error)")
        return .empty
    }
}

private func key(_ s: String) -> ChildKey { ChildKey(unchecked: s) }

/// Renders events compactly: `kind key prev` (value events show their JSON).
private func trace(_ events: [ViewEvent]) -> [String] {
    events.map { e in
        switch e.kind {
        case .value: return "value " + JSONWriter.string(e.tree)
        case .childRemoved: return "child_removed \(e.key?.string ?? "?")"
        default: return "\(e.kind.rawValue) \(e.key?.string ?? "?") prev=\(e.previousKey?.string ?? "nil")"
        }
    }
}

@Suite struct QueryScenarioTests {
    @Test("a limitToFirst window: a child entering pushes the last one out")
    func limitEnter() throws {
        let params = try Query().orderByChild("score").limitToFirst(2).params
        var view = QueryView(params: params, tree: node("{\"a\":{\"score\":1},\"b\":{\"score\":2},\"c\":{\"score\":3}}"))
        #expect(trace(view.initialEvents()) == ["child_added a prev=nil", "child_added b prev=a", "value {\"a\":{\"score\":1},\"b\":{\"score\":2}}"])
        let events = view.apply(node("{\"a\":{\"score\":1},\"b\":{\"score\":2},\"c\":{\"score\":3},\"d\":{\"score\":0}}"), changes: .keys([key("d")]))
        #expect(trace(events) == ["child_removed b", "child_added d prev=nil", "value {\"a\":{\"score\":1},\"d\":{\"score\":0}}"])
    }

    @Test("a child leaving a limited window pulls the next one in")
    func limitLeave() throws {
        let params = try Query().orderByKey().limitToLast(2).params
        var view = QueryView(params: params, tree: node("{\"a\":1,\"b\":2,\"c\":3}"))
        let events = view.apply(node("{\"a\":1,\"b\":2}"), changes: .keys([key("c")]))
        #expect(trace(events) == ["child_removed c", "child_added a prev=nil", "value {\"a\":1,\"b\":2}"])
    }

    @Test("a change below a child that reorders it gives child_moved then child_changed")
    func deepMove() throws {
        let params = try Query().orderByChild("meta/rank").params
        let before = node("{\"x\":{\"meta\":{\"rank\":1}},\"y\":{\"meta\":{\"rank\":2}}}")
        var view = QueryView(params: params, tree: before)
        let after = before.setting(node("3"), at: try Path(parsing: "x/meta/rank"))
        let events = view.apply(after, changes: ChildChanges.at(.root, written: [try Path(parsing: "x/meta/rank")]))
        #expect(trace(events) == ["child_moved x prev=y", "child_changed x prev=y", "value {\"x\":{\"meta\":{\"rank\":3}},\"y\":{\"meta\":{\"rank\":2}}}"])
    }

    @Test("a priority change moves a child in the default (priority) order")
    func priorityMove() throws {
        var view = QueryView(params: .default, tree: node("{\"a\":1,\"b\":2}"))
        var tree = node("{\"a\":1,\"b\":2}")
        try tree.apply(setPriority: .number(1), at: try Path(parsing: "a"))
        let events = view.apply(tree, changes: .keys([key("a")]))
        #expect(trace(events) == ["child_moved a prev=b", "child_changed a prev=b", "value {\"a\":1,\"b\":2}"])
    }

    @Test("a merge touching many children raises each kind in Firebase's order")
    func merge() throws {
        var view = QueryView(params: .default, tree: node("{\"a\":1,\"b\":2,\"c\":3}"))
        var tree = node("{\"a\":1,\"b\":2,\"c\":3}")
        try tree.apply(update: [
            UpdateEntry(path: try WritePath(parsing: "a"), value: .empty),
            UpdateEntry(path: try WritePath(parsing: "c"), value: node("30")),
            UpdateEntry(path: try WritePath(parsing: "d"), value: node("4")),
            UpdateEntry(path: try WritePath(parsing: "b"), value: node("2")),
        ], at: .root)
        let events = view.apply(tree, changes: .keys([key("a"), key("c"), key("d"), key("b")]))
        #expect(trace(events) == ["child_removed a", "child_added d prev=c", "child_changed c prev=b", "value {\"b\":2,\"c\":30,\"d\":4}"])
    }

    @Test("no change, no events; a leaf location raises only value")
    func leafAndNoop() {
        var view = QueryView(params: .default, tree: node("5"))
        #expect(view.apply(node("5")).isEmpty)
        #expect(trace(view.apply(node("6"))) == ["value 6"])
        #expect(trace(view.apply(node("{\"k\":1}"))) == ["child_added k prev=nil", "value {\"k\":1}"])
        #expect(trace(view.apply(node("7"))) == ["child_removed k", "value 7"])
    }

    @Test("ranged queries on a leaf location yield null, as Firebase's ranged filter does")
    func rangedLeaf() throws {
        let params = try Query().orderByValue().startAt(node("1")).params
        #expect(params.evaluate(node("5")).isEmpty)
        #expect(try Query().orderByValue().params.evaluate(node("{\".value\":5,\".priority\":1}")) == node("5"))
    }

    @Test("startAt/endAt with a key tie-breaker and startAfter/endBefore select exactly")
    func ranges() throws {
        let data = node("{\"a\":1,\"b\":1,\"c\":1,\"d\":2,\"e\":3}")
        func keys(_ q: Query) -> [String] { q.params.orderedChildren(of: data).map(\.key.string) }
        #expect(keys(try Query().orderByValue().startAt(node("1"), key: "b")) == ["b", "c", "d", "e"])
        #expect(keys(try Query().orderByValue().startAfter(node("1"))) == ["d", "e"])
        #expect(keys(try Query().orderByValue().startAfter(node("1"), key: "b")) == ["c", "d", "e"])
        #expect(keys(try Query().orderByValue().endBefore(node("2"))) == ["a", "b", "c"])
        #expect(keys(try Query().orderByValue().endAt(node("1"), key: "b")) == ["a", "b"])
        #expect(keys(try Query().orderByValue().equalTo(node("1")).limitToLast(2)) == ["b", "c"])
        #expect(keys(try Query().orderByKey().startAfter(node("\"b\"")).endBefore(node("\"e\""))) == ["c", "d"])
        #expect(keys(try Query().orderByChild("missing").equalTo(.empty)) == ["a", "b", "c", "d", "e"])
    }

    @Test("huge limits cannot overflow the window arithmetic")
    func hugeLimits() throws {
        let data = node("{\"a\":1,\"b\":2,\"c\":3}")
        let first = try Query().orderByKey().startAfter(node("\"a\"")).limitToFirst(Int.max).params
        #expect(first.orderedChildren(of: data).map(\.key.string) == ["b", "c"])
        let last = try Query().orderByKey().endBefore(node("\"c\"")).limitToLast(Int.max).params
        #expect(last.orderedChildren(of: data).map(\.key.string) == ["a", "b"])
        let wire = try QueryParams(wire: JSONValue(parsing: "{\"i\":\".key\",\"sp\":\"a\",\"sin\":false,\"l\":9223372036854775807,\"vf\":\"l\"}"))
        #expect(wire.orderedChildren(of: data).map(\.key.string) == ["b", "c"])
        var view = QueryView(params: first, tree: data)
        #expect(view.apply(node("{\"a\":1,\"b\":2,\"c\":3,\"d\":4}"), changes: .keys([key("d")])).count == 2)
    }

    @Test("invalid query combinations are rejected with Firebase's messages")
    func validation() throws {
        func message(_ build: () throws -> Query) -> String? {
            do {
                _ = try build()
                return nil
            } catch let error as QueryError {
                return error.message
            } catch {
                return "unexpected \(error)"
            }
        }
        #expect(message { try Query().orderByKey().orderByValue() } == "orderByValue: You can't combine multiple orderBy calls.")
        #expect(message { try Query().orderByKey().startAt(node("1")) } == "Query: When ordering by key, the argument passed to startAt(), startAfter(), endAt(), endBefore(), or equalTo() must be a string.")
        #expect(message { try Query().orderByKey().startAt(node("\"a\""), key: "b") } == "Query: When ordering by key, you may only pass one argument to startAt(), endAt(), or equalTo().")
        #expect(message { try Query().startAt(node("1")).orderByKey() } == "Query: When ordering by key, the argument passed to startAt(), startAfter(), endAt(), endBefore(), or equalTo() must be a string.")
        #expect(message { try Query().orderByPriority().startAt(node("true")) } == "Query: When ordering by priority, the first argument passed to startAt(), startAfter() endAt(), endBefore(), or equalTo() must be a valid priority value (null, a number, or a string).")
        #expect(message { try Query().orderByValue().equalTo(node("{\"a\":1}")) } == "Query: First argument passed to startAt(), startAfter(), endAt(), endBefore(), or equalTo() cannot be an object.")
        #expect(message { try Query().limitToFirst(0) } == "limitToFirst: First argument must be a positive integer.")
        #expect(message { try Query().limitToFirst(1).limitToLast(1) } == "limitToLast: Limit was already set (by another call to limitToFirst or limitToLast).")
        #expect(message { try Query().startAt(node("1")).startAfter(node("2")) } == "startAfter: Starting point was already set (by another call to startAt, startAfter, or equalTo).")
        #expect(message { try Query().endAt(node("1")).equalTo(node("2")) } == "equalTo: Ending point was already set (by another call to endAt/endBefore or equalTo).")
        #expect(message { try Query().orderByChild("") } == "orderByChild: cannot pass in empty path. Use orderByValue() instead.")
        #expect(message { try Query().orderByChild("$key") } == "orderByChild: \"$key\" is invalid.  Use orderByKey() instead.")
        #expect(message { try Query().orderByChild("a/b").startAt(node("1"), key: "bad/key") }?.hasPrefix("startAt: Second argument was an invalid key") == true)
        #expect(message { try Query().orderByChild("a/b").startAt(node("1"), key: "k").endAt(node("5")).limitToLast(3) } == nil)
    }

    @Test("the wire query object decodes every SDK's encoding")
    func wire() throws {
        let js = try QueryParams(wire: JSONValue(parsing: "{\"i\":\"score\",\"sp\":5,\"sn\":\"[MAX_NAME]\",\"sin\":false,\"l\":10,\"vf\":\"l\"}"))
        #expect(js == (try Query().orderByChild("score").startAfter(node("5")).limitToFirst(10).params))
        let ios = try QueryParams(wire: JSONValue(parsing: "{\"i\":\".key\",\"sp\":\"m\",\"ep\":\"q\",\"l\":2,\"vf\":\"r\"}"))
        #expect(ios == (try Query().orderByKey().startAt(node("\"m\"")).endAt(node("\"q\"")).limitToLast(2).params))
        let android = try QueryParams(wire: JSONValue(parsing: "{\"sp\":5.0,\"sn\":\"k\",\"ep\":null}"))
        #expect(android.index == .priority)
        #expect(android.start?.post == IndexPost(value: node("5"), name: .key(key("k"))))
        #expect(android.end?.post == IndexPost(value: .empty, name: .max))
        let nested = try QueryParams(wire: JSONValue(parsing: "{\"i\":\"a/b\"}"))
        #expect(nested.index == .child(try Path(parsing: "a/b")))
        #expect(nested.loadsAllData)
        let data = node("{\"x\":{\"a\":{\"b\":2}},\"y\":{\"a\":{\"b\":1}}}")
        #expect(nested.orderedChildren(of: data).map(\.key.string) == ["y", "x"])
        for bad in ["[]", "{\"i\":5}", "{\"i\":\".key\",\"sp\":1}", "{\"l\":-1}", "{\"l\":1,\"vf\":\"x\"}", "{\"sp\":{\"a\":1}}", "{\"sin\":\"yes\",\"sp\":1}"] {
            #expect(throws: QueryError.self, "\(bad)") { try QueryParams(wire: JSONValue(parsing: bad)) }
        }
    }

    @Test("ChildChanges maps written paths to the children of a view location")
    func childChanges() throws {
        let list = try Path(parsing: "list")
        #expect(ChildChanges.at(list, written: [try Path(parsing: "other")]) == .none)
        #expect(ChildChanges.at(list, written: [.root]) == .all)
        #expect(ChildChanges.at(list, written: [try Path(parsing: "list")]) == .all)
        #expect(ChildChanges.at(list, written: [try Path(parsing: "list/a/b"), try Path(parsing: "list/c")]) == .keys([key("a"), key("c")]))
    }
}
