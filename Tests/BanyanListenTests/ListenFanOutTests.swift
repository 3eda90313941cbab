import BanyanListen
import BanyanQuery
import BanyanTree
import Testing

/// `ListenCore.fanOut`: each distinct update held once, shared by the default listens of a
/// location, and the same deliveries, in the same order, as `applied`'s events.
@Suite struct ListenFanOutTests {
    private static func tree(_ json: String) throws -> Tree { try Tree(json: json) }
    private static func path(_ text: String) throws -> Path { try Path(parsing: text) }

    /// A core over `json` with listens given as (id, owner, location, params, tag).
    private static func core(_ json: String, _ listens: [(UInt64, UInt64, String, QueryParams?, UInt64?)]) throws -> (ListenCore, Tree) {
        var core = ListenCore()
        let root = try tree(json)
        for (id, owner, location, params, tag) in listens {
            _ = try core.listen(Listen(id: id, owner: owner, namespace: "ns", path: try path(location), params: params, tag: tag), tree: root)
        }
        return (core, root)
    }

    @Test("default listens of one path share one update; a tagged one shares its data under its tag; a window gets its own")
    func sharing() throws {
        var window = QueryParams()
        window.limit = 2
        var (core, root) = try Self.core(
            #"{"hot":{"a":1,"b":2}}"#,
            [(1, 10, "/hot", nil, nil), (2, 11, "/hot", nil, nil), (3, 12, "/hot", window, 5), (4, 13, "/hot", nil, 9), (5, 14, "/hot", nil, nil)])
        // A child inside the window changes: the window's own merge, everyone else's put.
        root.set(try Self.tree("3"), at: try Self.path("/hot/a"))
        let copy = core
        let fanOut = core.fanOut(namespace: "ns", written: [try Self.path("/hot/a")], tree: root)
        #expect(fanOut.deliveries.map(\.listen) == [1, 2, 3, 4, 5])
        let shared = fanOut.deliveries[0].update
        #expect(fanOut.deliveries.filter { $0.update == shared }.map(\.listen) == [1, 2, 4, 5])
        #expect(fanOut.deliveries[3].tag == 9)
        #expect(fanOut.deliveries[2].update != shared && fanOut.deliveries[2].tag == 5)
        #expect(fanOut.updates.count == 2, "one update for the default listens, one for the window")
        #expect(fanOut.updates[shared] == .put(path: try Self.path("/hot/a"), tree: try Self.tree("3")))
        #expect(fanOut.updates[fanOut.deliveries[2].update].isMerge)
        // The events are exactly what `applied` gives.
        var other = copy
        #expect(fanOut.events == other.applied(namespace: "ns", written: [try Self.path("/hot/a")], tree: root))
    }

    @Test("equal updates of two locations are one; an owner gets it once; order is the order listens were made, across locations")
    func acrossLocations() throws {
        var (core, root) = try Self.core(
            #"{"a":{"b":{"c":1}}}"#,
            [(1, 7, "/a/b", nil, nil), (2, 8, "/a", nil, nil), (3, 7, "/a", nil, nil), (4, 9, "/a/b", nil, nil), (5, 8, "/", nil, nil)])
        root.set(try Self.tree("2"), at: try Self.path("/a/b"))
        let fanOut = core.fanOut(namespace: "ns", written: [try Self.path("/a/b")], tree: root)
        // /a/b's listens and /a's get put /a/b; the root's too. Owner 7 (listens 1 and 3) and
        // owner 8 (2 and 5) once each, at their first listen.
        #expect(fanOut.updates == [.put(path: try Self.path("/a/b"), tree: try Self.tree("2"))])
        #expect(fanOut.deliveries.map(\.listen) == [1, 2, 4])
        #expect(fanOut.deliveries.map(\.owner) == [7, 8, 9])
    }

    @Test("unlistening in the middle of a location keeps the others and their order; a listen made later comes last")
    func unlistenKeepsOrder() throws {
        var (core, root) = try Self.core(#"{"p":1}"#, (1...6).map { (UInt64($0), UInt64(100 + $0), "/p", nil, nil) })
        core.unlisten(3)
        core.unlisten(1)
        core.unlisten(6)
        _ = try core.listen(Listen(id: 7, owner: 107, namespace: "ns", path: try Self.path("/p")), tree: root)
        root.set(try Self.tree("2"), at: try Self.path("/p"))
        let fanOut = core.fanOut(namespace: "ns", written: [try Self.path("/p")], tree: root)
        #expect(fanOut.deliveries.map(\.listen) == [2, 4, 5, 7])
        #expect(Set(fanOut.deliveries.map(\.update)) == [0])
        core.removeOwner(104)
        #expect(core.fanOut(namespace: "ns", written: [try Self.path("/p")], tree: root).deliveries.map(\.listen) == [2, 5, 7])
    }

    @Test("a multi-path update: each location's merge computed once and shared by its listens")
    func multiPath() throws {
        var (core, root) = try Self.core(#"{"r":{"x":1,"y":2}}"#, [(1, 1, "/r", nil, nil), (2, 2, "/r", nil, nil), (3, 3, "/r/x", nil, nil)])
        root.set(try Self.tree("5"), at: try Self.path("/r/x"))
        root.set(try Self.tree("6"), at: try Self.path("/r/y"))
        let written = [try Self.path("/r/x"), try Self.path("/r/y")]
        let fanOut = core.fanOut(namespace: "ns", written: written, tree: root)
        #expect(fanOut.deliveries.map(\.listen) == [1, 2, 3])
        #expect(fanOut.deliveries[0].update == fanOut.deliveries[1].update)
        #expect(fanOut.updates.count == 2)
        #expect(fanOut.updates[fanOut.deliveries[0].update].isMerge)
        #expect(fanOut.updates[fanOut.deliveries[2].update] == .put(path: try Self.path("/r/x"), tree: try Self.tree("5")))
    }
}
