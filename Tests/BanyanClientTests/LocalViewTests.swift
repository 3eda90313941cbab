import BanyanClientCore
import BanyanQuery
import BanyanTree
import Testing

/// The local view kept incrementally (server data with the pending writes applied in order)
/// against the plain definition, recomputed here from scratch at every step: many interleaved
/// pending writes at overlapping locations (sets of parents and children, updates, priorities,
/// leaves replaced by children), server pushes under pending writes, and answers out of order,
/// refused ones rolling back.
@Suite struct LocalViewTests {
    /// SplitMix64: a seeded sequence, the same on every run.
    struct Random {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
        mutating func pick<T>(_ list: [T]) -> T { list[below(list.count)] }
    }

    enum Change {
        case set(Path, Tree)
        case priority(Path, Priority)
    }

    struct Pending {
        var request: Int64
        var id: UInt64
        /// Where the server's echo is pushed from (the write's location).
        var path: Path
        var changes: [Change]
    }

    static func path(_ s: String) -> Path { ClientCoreTests.path(s) }
    static func tree(_ json: String) -> Tree { ClientCoreTests.tree(json) }
    static func export(_ t: Tree) -> String { String(decoding: JSONWriter.bytes(t, format: .export), as: UTF8.self) }

    static func apply(_ changes: [Change], to tree: inout Tree) {
        for change in changes {
            switch change {
            case let .set(at, value): tree.set(value, at: at)
            case let .priority(at, p): _ = tree.setPriority(p, at: at)
            }
        }
    }

    /// The plain definition: the server's data with every pending write replayed in order.
    static func naive(_ server: Tree, _ pending: [Pending]) -> Tree {
        var tree = server
        for w in pending { apply(w.changes, to: &tree) }
        return tree
    }

    static func randomValue(_ r: inout Random) -> String {
        let n = r.below(100)
        switch r.below(7) {
        case 0: return "\(n)"
        case 1: return #""s\#(n)""#
        case 2: return #"{"x":\#(n),"y":{"p":\#(n + 1)}}"#
        case 3: return "null"
        case 4: return #"{".value":\#(n),".priority":\#(r.below(5))}"#
        case 5: return #"{"p":\#(n),"z":"t","\#(r.pick(["x", "y"]))":\#(n),".priority":\#(r.below(5))}"#
        default: return #"{"\#(r.pick(["x", "y", "p", "z"]))":\#(n)}"#
        }
    }

    static func randomLocation(_ r: inout Random) -> String {
        var s = r.below(3) == 0 ? "/b" : "/a"
        for _ in 0..<r.below(4) { s += "/" + r.pick(["x", "y", "p"]) }
        return s
    }

    @Test("the local view with hundreds of pending writes at overlapping locations, pushes and out-of-order answers equals a replay of every pending write")
    func localViewMatchesReplay() throws {
        for seed: UInt64 in [1, 2, 3, 4] {
            try run(seed: seed, steps: 1_500)
        }
    }

    func run(seed: UInt64, steps: Int) throws {
        var r = Random(state: seed)
        var core = ClientCoreTests.online()
        var server = Self.tree(#"{"a":{"x":{"p":1,"q":2},"y":3},"b":{"x":1,"y":{"p":2}}}"#)
        var pending: [Pending] = []
        let tagged = try Query().orderByKey().limitToLast(2).params

        // Plain views at /a, /a/x, /a/x/p (complete through /a's listen), child events at /a,
        // and a tagged query at /b with its own data.
        core.observe(1, path: Self.path("/a"), type: .value)
        core.received(ClientCoreTests.data("/a", Self.export(server.child(at: Self.path("/a")))))
        core.received(ClientCoreTests.ok(2, "{}"))
        core.observe(2, path: Self.path("/a/x"), type: .value)
        core.received(ClientCoreTests.ok(3, "{}"))
        core.observe(3, path: Self.path("/a/x/p"), type: .value)
        core.received(ClientCoreTests.ok(4, "{}"))
        core.observe(4, path: Self.path("/b"), params: tagged, type: .value)
        core.received(ClientCoreTests.data("/b", Self.export(server.child(at: Self.path("/b"))), tag: 1))
        core.received(ClientCoreTests.ok(5, "{}"))
        core.observe(5, path: Self.path("/a"), type: .childAdded)
        core.observe(6, path: Self.path("/a"), type: .childChanged)
        core.observe(7, path: Self.path("/a"), type: .childRemoved)
        // Child events of the tagged window (it holds two of /b's children at most).
        core.observe(8, path: Self.path("/b"), params: tagged, type: .childAdded)
        core.observe(9, path: Self.path("/b"), params: tagged, type: .childChanged)
        core.observe(10, path: Self.path("/b"), params: tagged, type: .childRemoved)

        var values: [UInt64: Tree] = [:]
        var children: [ChildKey: Tree] = [:]
        var windowChildren: [ChildKey: Tree] = [:]
        var nextID: UInt64 = 1

        /// Takes the actions: the last value of each observer, /a's children from child events,
        /// and the request number of the write just sent (if any).
        func take() -> Int64? {
            var request: Int64?
            for action in core.takeActions() {
                switch action {
                case let .event(id, e) where id >= 8:
                    switch e.kind {
                    case .childAdded, .childChanged:
                        if let key = e.key { windowChildren[key] = e.tree }
                    case .childRemoved:
                        if let key = e.key { windowChildren[key] = nil }
                    case .value, .childMoved: break
                    }
                case let .event(id, e):
                    switch e.kind {
                    case .value: values[id] = e.tree
                    case .childAdded, .childChanged:
                        if let key = e.key { children[key] = e.tree }
                    case .childRemoved:
                        if let key = e.key { children[key] = nil }
                    case .childMoved: break
                    }
                case let .send(bytes):
                    let text = String(decoding: bytes, as: UTF8.self)
                    // {"t":"d","d":{"r":N,...
                    if text.hasPrefix(#"{"t":"d","d":{"r":"#) {
                        request = Int64(text.dropFirst(#"{"t":"d","d":{"r":"#.count).prefix { $0.isNumber })
                    }
                default: break
                }
            }
            return request
        }

        func check(_ step: Int) {
            let expected = Self.naive(server, pending)
            #expect(core.pendingWriteCount == pending.count, "seed \(seed) step \(step): pending writes")
            let a = expected.child(at: Self.path("/a"))
            #expect(values[1] == a, "seed \(seed) step \(step): /a")
            #expect(values[2] == expected.child(at: Self.path("/a/x")), "seed \(seed) step \(step): /a/x")
            #expect((values[3] ?? .empty) == expected.child(at: Self.path("/a/x/p")), "seed \(seed) step \(step): /a/x/p")
            let b = QueryView(params: tagged, tree: expected.child(at: Self.path("/b"))).viewTree
            #expect(values[4] == b, "seed \(seed) step \(step): /b")
            var window: [ChildKey: Tree] = [:]
            if b.hasChildren { b.children.forEach { key, child in window[key] = child } }
            #expect(windowChildren == window, "seed \(seed) step \(step): /b's window child events")
            var shown: [ChildKey: Tree] = [:]
            a.children.forEach { key, child in shown[key] = child }
            #expect(children == shown, "seed \(seed) step \(step): /a's child events")
        }

        /// Pushes the server's data at `location` (the whole of /b, tagged, for its query).
        func push(_ location: Path) {
            if location.first?.string == "b" {
                core.received(ClientCoreTests.data("/b", Self.export(server.child(at: Self.path("/b"))), tag: 1))
            } else {
                core.received(ClientCoreTests.data(location.description, Self.export(server.child(at: location))))
            }
        }

        _ = take()
        check(0)
        var step = 0
        while step < steps || !pending.isEmpty {
            step += 1
            let roll = step <= steps ? r.below(100) : 90
            let id = nextID
            if roll < 30 {
                let location = Self.randomLocation(&r)
                let json = Self.randomValue(&r)
                try core.set(id, path: Self.path(location), json: ClientCoreTests.bytes(json))
                guard let request = take() else { Issue.record("no request for a set"); return }
                pending.append(Pending(request: request, id: id, path: Self.path(location), changes: [.set(Self.path(location), Self.tree(json))]))
                nextID += 1
            } else if roll < 42 {
                let location = Self.randomLocation(&r)
                var list: [(Path, [UInt8])] = []
                var changes: [Change] = []
                for first in ["x", "y", "p"] where r.below(2) == 0 {
                    let relative = r.below(3) == 0 ? "\(first)/\(r.pick(["x", "p"]))" : first
                    let json = Self.randomValue(&r)
                    list.append((Self.path("/" + relative), ClientCoreTests.bytes(json)))
                    changes.append(.set(Self.path(location + "/" + relative), Self.tree(json)))
                }
                guard !list.isEmpty else { continue }
                try core.update(id, path: Self.path(location), children: list)
                guard let request = take() else { Issue.record("no request for an update"); return }
                pending.append(Pending(request: request, id: id, path: Self.path(location), changes: changes))
                nextID += 1
            } else if roll < 52 {
                let location = Self.randomLocation(&r)
                let json = r.below(4) == 0 ? "null" : "\(r.below(6))"
                try core.setPriority(id, path: Self.path(location), json: ClientCoreTests.bytes(json))
                guard let request = take(), let p = Priority(tree: Self.tree(json)) else { Issue.record("no request for a priority"); return }
                pending.append(Pending(request: request, id: id, path: Self.path(location), changes: [.priority(Self.path(location), p)]))
                nextID += 1
            } else if roll < 64 {
                // Another client's write: the server pushes its data.
                let location = Self.path(Self.randomLocation(&r))
                server.set(Self.tree(Self.randomValue(&r)), at: location)
                push(location)
                _ = take()
            } else if !pending.isEmpty {
                // An answer to any pending write (out of order): mostly ok after its echo,
                // sometimes refused (rolled back).
                let index = r.below(2) == 0 ? r.below(min(pending.count, 4)) : r.below(pending.count)
                let w = pending.remove(at: index)
                if r.below(5) == 0 {
                    core.received(ClientCoreTests.status(w.request, "permission_denied", "Permission denied"))
                } else {
                    Self.apply(w.changes, to: &server)
                    push(w.path)
                    core.received(ClientCoreTests.ok(w.request))
                }
                _ = take()
            }
            check(step)
            if step > steps * 3 { break }
        }
        #expect(pending.isEmpty && core.pendingWriteCount == 0)
    }
}
