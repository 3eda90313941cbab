import BanyanBasics
import BanyanStateMachine
import BanyanTree

/// `banyan-bench quota` (docs/benchmarks.md, "Namespace quota cost"): what a quota costs the
/// thread that applies the log. Setting one measures the namespace whole, once; afterwards each
/// write measures what it touched. Figures: the measure of namespaces of 10,000 to 1,000,000
/// children, and small writes applied with and without a quota on a namespace of 100,000.
extension BanyanBench {
    static func quotaBench() {
        print("namespace quotas (the state machine on one thread):")
        for count in [10_000, 100_000, 1_000_000] {
            let tree = userTree(count)
            var bytes = 0
            let measure = seconds { bytes = tree.dataBytes }
            var m = StateMachine(namespaces: ["app": tree])
            var index: UInt64 = 0
            let setQuota = seconds {
                index += 1
                _ = m.apply(envelope(index, namespace: StateMachine.quotasNamespace, .set(path: "/app", json: Array("1099511627776".utf8))), index: index)
            }
            print(
                "  \(count) children (\(bytes / 1_000_000) MB of data): a whole measure \(format(measure * 1000)) ms; "
                    + "setting a quota (the measure, on every node at one log position) \(format(setQuota * 1000)) ms")
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
        // handed back to be freed elsewhere (a node frees it on a worker), and with a quota it is
        // also measured where it applies, to learn how much data went. Each case on a fresh
        // machine whose namespace nothing else references, as on a node.
        for count in [100_000, 1_000_000] {
            for (label, json) in [("overwritten by a small object", #"{"x":1}"#), ("deleted", "null")] {
                var figures: [String] = []
                for quota in [false, true] {
                    var m = StateMachine(namespaces: ["app": userTree(count)])
                    // As a node's replica sets it: large replaced subtrees measured off the thread.
                    m.measureLaterAtValues = StateMachine.releaseAfterValues
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
                    // Under a quota the subtree is measured first (on the node's freeing thread),
                    // then handed back by `measured` to be freed.
                    var trees = kept?.released.trees ?? []
                    var toMeasure = kept?.released.toMeasure ?? []
                    kept = nil
                    let measureCount = toMeasure.count
                    var measuring = 0.0
                    while let entry = toMeasure.popLast() {
                        var bytes = 0
                        measuring += seconds { bytes = entry.tree.dataBytes }
                        if let tree = m.measured(namespace: "app", id: entry.id, bytes: bytes) { trees.append(tree) }
                    }
                    let count = trees.count
                    let freeing = seconds { trees = [] }
                    figures.append(
                        "\(quota ? "with a quota" : "no quota") \(format(took * 1000)) ms on the loop + "
                            + (measureCount == 0 ? "" : "\(format(measuring * 1000)) ms measuring and ")
                            + "\(format(freeing * 1000)) ms freeing \(count) subtree(s) off it")
                }
                print("  /users of \(count) children \(label): " + figures.joined(separator: ", "))
            }
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
