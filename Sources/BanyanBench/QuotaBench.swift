import BanyanBasics
import BanyanStateMachine
import BanyanTree

/// `banyan-bench quota` (docs/benchmarks.md, "Namespace quota cost"): what a quota costs the
/// thread that applies the log. Every tree carries its data bytes, so setting a quota reads the
/// namespace's measure, and each write measures the paths it touched, reading the measure of
/// each subtree there. Figures: a walked measure against the carried one for namespaces of
/// 10,000 to 1,000,000 children, setting a quota, small writes with and without a quota on a
/// namespace of 100,000, and writes over or around a large subtree under a quota.
extension BanyanBench {
    static func quotaBench() {
        print("namespace quotas (the state machine on one thread):")
        for count in [10_000, 100_000, 1_000_000] {
            let tree = userTree(count)
            var bytes = 0
            let walk = seconds { bytes = tree.walkedDataBytes }
            var carried = 0
            let read = seconds { carried = tree.dataBytes }
            guard carried == bytes else {
                print("  the carried measure \(carried) differs from the walked one \(bytes)")
                return
            }
            var m = StateMachine(namespaces: ["app": tree])
            var index: UInt64 = 0
            let setQuota = seconds {
                index += 1
                _ = m.apply(envelope(index, namespace: StateMachine.quotasNamespace, .set(path: "/app", json: Array("1099511627776".utf8))), index: index)
            }
            print(
                "  \(count) children (\(bytes / 1_000_000) MB of data): a walked measure \(format(walk * 1000)) ms, the carried one \(format(read * 1e6)) µs; "
                    + "setting a quota (on every node at one log position) \(format(setQuota * 1000)) ms")
        }
        let tree = userTree(100_000)
        for quota in [false, true] {
            var m = StateMachine(namespaces: ["app": tree])
            var index: UInt64 = 0
            if quota {
                index += 1
                _ = m.apply(envelope(index, namespace: StateMachine.quotasNamespace, .set(path: "/app", json: Array("1099511627776".utf8))), index: index)
            }
            let writes = 200_000
            let payloads = (0..<writes).map { i in
                envelope(UInt64(i + 1), namespace: "app", .set(path: "/users/u\(i % 100_000)/score", json: Array(String(i).utf8)))
            }
            let took = seconds {
                for payload in payloads {
                    index += 1
                    _ = m.apply(payload, index: index)
                }
            }
            let priority = (0..<20_000).map { i in envelope(UInt64(writes + i + 1), namespace: "app", .set(path: "/.priority", json: Array(String(i).utf8))) }
            let priorityTook = seconds {
                for payload in priority {
                    index += 1
                    _ = m.apply(payload, index: index)
                }
            }
            print(
                "  100,000 children, \(quota ? "with a quota" : "no quota   "): \(format(took / Double(writes) * 1e9 / 1000)) µs per small set, "
                    + "\(format(priorityTook / Double(priority.count) * 1e9 / 1000)) µs per /.priority write")
        }
        // Replacing a large subtree: the write applies in O(depth); the subtree it replaces is
        // handed back to be freed elsewhere (a node frees it on a worker); with a quota, its
        // measure is read where it stands. Each case on a fresh machine whose namespace nothing
        // else references, as on a node.
        for count in [100_000, 1_000_000] {
            for (label, json) in [("overwritten by a small object", #"{"x":1}"#), ("deleted", "null")] {
                var figures: [String] = []
                for quota in [false, true] {
                    var m = StateMachine(namespaces: ["app": userTree(count)])
                    var index: UInt64 = 0
                    if quota {
                        index += 1
                        _ = m.apply(envelope(index, namespace: StateMachine.quotasNamespace, .set(path: "/app", json: Array("1099511627776".utf8))), index: index)
                    }
                    let payload = envelope(1, namespace: "app", .set(path: "/users", json: Array(json.utf8)))
                    index += 1
                    let at = index
                    // The replaced subtree comes back in `Applied.released`: a node frees it on a
                    // worker. Timed apart: the apply (the loop's part) and the free.
                    var kept: StateMachine.Applied?
                    let took = seconds { kept = m.apply(payload, index: at) }
                    var trees = kept?.released.trees ?? []
                    kept = nil
                    let count = trees.count
                    let freeing = seconds { trees = [] }
                    figures.append(
                        "\(quota ? "with a quota" : "no quota") \(format(took * 1000)) ms on the loop + "
                            + "\(format(freeing * 1000)) ms freeing \(count) subtree(s) off it")
                }
                print("  /users of \(count) children \(label): " + figures.joined(separator: ", "))
            }
        }
        // Under a quota, writes that add data over or beside a large subtree: a set of a
        // slightly larger object over 100,000 users, an update of two locations replacing two
        // of them, and an update of 100 items. Each on a fresh machine; the replaced subtrees'
        // freeing is not timed.
        let users = userTree(100_000)
        let replacement = "{" + (0..<1_000).map { #""v\#($0)":{"name":"someone","score":\#($0)}"# }.joined(separator: ",") + "}"
        let cases: [(String, Command)] = [
            ("a set of 1,000 users over /users (100,000)", .set(path: "/users", json: Array(replacement.utf8))),
            (
                "an update of two locations, each replacing 100,000 users",
                .update(path: "/", entries: [.init(path: "users", json: Array(replacement.utf8)), .init(path: "other", json: Array("1".utf8))])
            ),
            (
                "an update of 100 items, one of them replacing /users (100,000)",
                .update(
                    path: "/",
                    entries: [.init(path: "users", json: Array(replacement.utf8))] + (0..<99).map { .init(path: "x\($0)", json: Array("1".utf8)) })
            ),
        ]
        for (label, command) in cases {
            var m = StateMachine(namespaces: ["app": Tree(sortedChildren: [(ChildKey(unchecked: "other"), users)]).setting(users.child(ChildKey(unchecked: "users")), at: Path(segments: [ChildKey(unchecked: "users")]))])
            _ = m.apply(envelope(1, namespace: StateMachine.quotasNamespace, .set(path: "/app", json: Array("1099511627776".utf8))), index: 1)
            let payload = envelope(1, namespace: "app", command)
            var kept: StateMachine.Applied?
            let took = seconds { kept = m.apply(payload, index: 2) }
            let ok = kept?.outcome == .ok
            let handedBack = kept?.released.trees.count ?? 0
            kept = nil
            print("  with a quota, \(label): \(format(took * 1000)) ms on the loop (\(ok ? "applied" : "NOT applied"), \(handedBack) subtree(s) handed back to be freed)")
        }
    }

    /// `{"users": {"u0": {"name": "user 0", "score": 0}, …}}` with `count` users.
    private static func userTree(_ count: Int) -> Tree {
        var users: [(ChildKey, Tree)] = []
        users.reserveCapacity(count)
        for i in 0..<count {
            let user = Tree(sortedChildren: [
                (ChildKey(unchecked: "name"), Tree(.string("user \(i)"))), (ChildKey(unchecked: "score"), Tree(.int(Int64(i)))),
            ])
            users.append((ChildKey(unchecked: "u\(i)"), user))
        }
        users.sort { $0.0 < $1.0 }
        return Tree(sortedChildren: [(ChildKey(unchecked: "users"), Tree(sortedChildren: users))])
    }

    /// Data writes in session 1 (numbered from 1), quotas in session 2.
    private static func envelope(_ seq: UInt64, namespace: String, _ command: Command) -> [UInt8] {
        CommandEnvelope(namespace: namespace, session: namespace == StateMachine.quotasNamespace ? 2 : 1, seq: seq, timestamp: 1_700_000_000_000, command: command).encoded()
    }
}
