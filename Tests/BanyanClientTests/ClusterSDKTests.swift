import BanyanClient
import BanyanOps
import Foundation
import NIOHTTP1
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The Swift SDK against 3-node clusters of real `banyan serve` processes (issue 17's proof,
/// docs/swift-sdk.md "Proof"): every API group with clients attached to different nodes, a
/// client failing over when `kill -9` takes its node (a follower, then the leader) while it
/// listens and writes, a client failing over when its node is stopped (SIGSTOP: silent, TCP up),
/// and an app's offline queue across real process deaths and restarts (`banyan-sdk-probe`).
///
/// Each test starts its own cluster on client ports 31500+10k+1…3 and peer ports 31600+10k+1…3
/// (k: the test's slot, 0…7), and stops it at the end. About 10 s in all on two cores. In the full
/// `swift test` the simulator's CPU-bound tests hold the concurrency pool's threads for minutes,
/// so these tests may start late (measured: after 8 minutes, then 22 s for the API tour instead
/// of 4); every wait is therefore bounded generously and checks its condition once more after
/// its deadline, and each test's time limit counts from its own start.
@Suite(.serialized, .timeLimit(.minutes(5)))
struct ClusterSDKTests {
    typealias R = DatabaseTests.Recorder

    // MARK: - The cluster

    /// Three `banyan serve` processes for one test, started through `ChildProcess` (exits are
    /// reaped with `waitpid`, which the test runner's blocked signals cannot hide) with
    /// `LocalCluster`'s arguments, ports and status requests.
    final class Cluster: @unchecked Sendable {
        let ops: LocalCluster
        let directory: String
        let namespace: String
        private let lock = NSLock()
        private var pids: [UInt64: pid_t] = [:]
        private var started: Set<UInt64> = []

        /// The built executable `name` beside this test bundle (`swift build` builds them all).
        static func executable(_ name: String) throws -> String {
            let path = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().appendingPathComponent(name).path
            guard FileManager.default.isExecutableFile(atPath: path) else { throw Failure("no \(name) binary at \(path): swift build first") }
            return path
        }

        init(_ name: String, slot: Int, namespace: String) throws {
            let banyan = try Self.executable("banyan")
            _ = try Self.executable("banyan-sdk-probe")
            directory = NSTemporaryDirectory() + "banyan-sdkcluster-\(name)-\(UInt32.random(in: 0...UInt32.max))"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            self.namespace = namespace
            ops = LocalCluster(executable: banyan, directory: directory, nodes: 3, clientPortBase: 31500 + 10 * slot, peerPortBase: 31600 + 10 * slot)
        }

        func address(_ id: UInt64) -> String { "127.0.0.1:\(ops.clientPort(id))" }
        func url(_ id: UInt64) -> String { "http://\(address(id))?ns=\(namespace)" }
        /// The other nodes after `id`, in ring order (a client's failover list).
        func others(_ id: UInt64) -> [UInt64] { [id % 3 + 1, (id + 1) % 3 + 1] }
        var live: [UInt64] { lock.withLock { pids.keys.sorted() } }

        /// A client whose first node is `id`, failing over to the other two.
        func database(first id: UInt64) throws -> Database {
            try Database(url: url(id), nodes: others(id).map(address), authToken: "owner")
        }

        func start(_ id: UInt64) throws {
            let firstStart = lock.withLock { started.insert(id).inserted }
            let pid = try ChildProcess.spawn(
                ops.executable, ops.arguments(id, firstStart: firstStart), environment: ProcessInfo.processInfo.environment,
                outputFile: "\(directory)/node\(id).log")
            lock.withLock { pids[id] = pid }
        }

        /// Starts the three nodes and waits (bounded) until each answers `/.banyan/ready` (a leader
        /// is known and the node applied what it knows committed).
        func startAll() async throws {
            for id: UInt64 in [1, 2, 3] { try start(id) }
            for id: UInt64 in [1, 2, 3] where !(await waitReady(id, seconds: 120)) {
                throw Failure("node \(id) not ready within 120 s\n" + logTails())
            }
        }

        func waitReady(_ id: UInt64, seconds: Double) async -> Bool {
            await ClusterSDKTests.eventually(seconds: seconds, every: 0.1) {
                (try? await self.ops.request(id, .GET, "/.banyan/ready", timeout: 2))?.status == 200
            }
        }

        /// The node that reports itself leader (among `ids`, every running node by default).
        func leader(among ids: [UInt64]? = nil) async throws -> UInt64 {
            let candidates = ids ?? live
            let found = Log<UInt64>()
            let known = await ClusterSDKTests.eventually(seconds: 120, every: 0.05) {
                for id in candidates {
                    if let s = await self.ops.status(id), s["role"] as? String == "leader", let n = (s["node_id"] as? NSNumber)?.uint64Value {
                        found.add(n)
                        return true
                    }
                }
                return false
            }
            guard known, let leader = found.all.last else { throw Failure("no leader among \(candidates) within 120 s\n" + logTails()) }
            return leader
        }

        func pid(_ id: UInt64) -> pid_t? { lock.withLock { pids[id] } }

        /// `kill -9` node `id`, reaped.
        func kill9(_ id: UInt64) {
            guard let pid = lock.withLock({ pids.removeValue(forKey: id) }) else { return }
            kill(pid, SIGKILL)
            _ = ChildProcess.wait(pid, seconds: 10)
        }

        /// Stops every node (SIGTERM, SIGKILL after 20 s) and removes the directory.
        func stop() {
            let all = lock.withLock {
                defer { pids = [:] }
                return pids
            }
            for pid in all.values { kill(pid, SIGTERM) }
            for pid in all.values { _ = ChildProcess.wait(pid, seconds: 20) }
            ops.shutdown()
            try? FileManager.default.removeItem(atPath: directory)
        }

        /// The last lines of every node's log (the evidence a failure leaves: the directory goes).
        func logTails(_ lines: Int = 12) -> String {
            [UInt64(1), 2, 3].map { id in
                let log = (try? String(contentsOfFile: "\(directory)/node\(id).log", encoding: .utf8)) ?? "(no log)"
                return "node \(id) log:\n" + log.split(separator: "\n").suffix(lines).joined(separator: "\n")
            }.joined(separator: "\n")
        }
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }

    /// Polls `condition` until it holds or `seconds` pass (then once more: a starved task may
    /// wake after its deadline although the condition came true in time).
    static func eventually(seconds: Double = 60, every interval: Double = 0.02, _ condition: @Sendable () async -> Bool) async -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if await condition() { return true }
            try? await Task.sleep(nanoseconds: UInt64(interval * 1e9))
        }
        return await condition()
    }

    @discardableResult
    static func bounded<T: Sendable>(_ seconds: Double = 120, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        try await DatabaseTests.bounded(seconds, body)
    }

    static func json(_ value: Any?) -> String { DatabaseTests.json(value) }

    /// Starts `db` (a database connects on its first use, as Firebase's does), waits until it
    /// is online, and returns the node it is on.
    static func online(_ db: Database) async -> String? {
        _ = db.reference()
        _ = await eventually(seconds: 60) { db.connectedNode != nil }
        return db.connectedNode
    }

    /// A thread-safe list.
    final class Log<T: Sendable>: @unchecked Sendable {
        private let lock = NSLock()
        private var items: [T] = []
        func add(_ item: T) { lock.withLock { items.append(item) } }
        var all: [T] { lock.withLock { items } }
        var count: Int { lock.withLock { items.count } }
    }

    /// A thread-safe flag.
    final class Flag: @unchecked Sendable {
        private let lock = NSLock()
        private var value = false
        func set() { lock.withLock { value = true } }
        var isSet: Bool { lock.withLock { value } }
    }

    struct Profile: Codable, Equatable {
        var name: String
        var born: Int
        var languages: [String]
    }

    // MARK: - Every API group, across nodes

    @Test("every API group with clients on different nodes of one cluster: writes, child events with previous keys, every query kind, single events, getData, keepSynced, transactions, onDisconnect, .info, server values, Codable, async sequences, read-your-writes")
    func apiAcrossNodes() async throws {
        let cluster = try Cluster("api", slot: 0, namespace: "sdktour")
        defer { cluster.stop() }
        try await cluster.startAll()
        let a = try cluster.database(first: 1)
        let b = try cluster.database(first: 2)
        let c = try cluster.database(first: 3)
        defer {
            a.shutdown()
            b.shutdown()
            c.shutdown()
        }
        // .info/connected on each; each client is on its own first node.
        for (db, id) in [(a, UInt64(1)), (b, 2), (c, 3)] {
            let connected = R()
            db.reference(withPath: ".info/connected").observe(.value) { s in connected.add("\(s.value as? Bool ?? false)") }
            #expect(await connected.wait { $0 == "true" }, "client of node \(id): \(connected.all)")
            #expect(db.connectedNode == cluster.address(id), "the client of node \(id) is on \(db.connectedNode ?? "nothing")")
        }
        try await Self.readYourWrites(a, b, c)
        try await Self.writes(a, b, c)
        try await Self.childEvents(a, b, c)
        try await Self.queries(a, b, c)
        try await Self.keepSynced(a, b)
        try await Self.transactions(a, b, c)
        try await Self.onDisconnectAndInfo(a, c)
        try await Self.serverValuesCodableAndSequences(a, b, c)
        // Nothing above changed which node a client is on.
        #expect([a.connectedNode, b.connectedNode, c.connectedNode] == [UInt64(1), 2, 3].map { cluster.address($0) as String? })
    }

    /// A write acknowledged through one node is read right after through the other two.
    static func readYourWrites(_ a: Database, _ b: Database, _ c: Database) async throws {
        let clients = [a, b, c]
        var stale: [String] = []
        for i in 1...30 {
            let writer = clients[i % 3]
            try await bounded { try await writer.reference(withPath: "ryw/value").setValue(i) }
            for (n, reader) in clients.enumerated() where reader !== writer {
                let read = try await bounded { try await reader.reference(withPath: "ryw/value").getData().value as? Int }
                if read != i { stale.append("write \(i) via client \(i % 3 + 1), read \(read.map(String.init) ?? "nil") via client \(n + 1)") }
            }
        }
        #expect(stale.isEmpty, "\(stale)")
    }

    /// Each kind of write through one node, read through another.
    static func writes(_ a: Database, _ b: Database, _ c: Database) async throws {
        let profileA = a.reference(withPath: "w/profile")
        try await bounded { try await profileA.setValue(["name": "Ada", "langs": ["swift": true, "c": true]]) }
        var read = try await bounded { try await b.reference(withPath: "w/profile").getData() }
        #expect(json(read.value) == #"{"langs":{"c":true,"swift":true},"name":"Ada"}"#)

        try await bounded { try await b.reference(withPath: "w/profile").updateChildValues(["name": "Ada L.", "langs/lisp": true, "born": 1815]) }
        read = try await bounded { try await c.reference(withPath: "w/profile").getData() }
        #expect(json(read.value) == #"{"born":1815,"langs":{"c":true,"lisp":true,"swift":true},"name":"Ada L."}"#)

        try await bounded { try await c.reference(withPath: "w/profile/langs/swift").removeValue() }
        read = try await bounded { try await a.reference(withPath: "w/profile/langs").getData() }
        #expect(json(read.value) == #"{"c":true,"lisp":true}"#)

        try await bounded { try await a.reference(withPath: "w/profile").setPriority(5) }
        read = try await bounded { try await b.reference(withPath: "w/profile").getData() }
        #expect(read.priority as? Double == 5, "\(read)")

        try await bounded { try await b.reference(withPath: "w/ranked/x").setValue("X", andPriority: "p2") }
        read = try await bounded { try await c.reference(withPath: "w/ranked/x").getData() }
        #expect(read.value as? String == "X" && read.priority as? String == "p2", "\(read)")
        #expect(json(read.valueInExportFormat()) == #"{".priority":"p2",".value":"X"}"#)

        var pushed: [String] = []
        for i in 0..<3 {
            let child = c.reference(withPath: "w/feed").childByAutoId()
            pushed.append(child.key ?? "")
            try await bounded { try await child.setValue(["n": i]) }
        }
        #expect(pushed == pushed.sorted() && Set(pushed).count == 3, "push ids are chronological: \(pushed)")
        let feed = try await bounded { try await a.reference(withPath: "w/feed").getData() }
        #expect(feed.children.map { $0.key ?? "" } == pushed)
        #expect(feed.children.map { json($0.value) } == [#"{"n":0}"#, #"{"n":1}"#, #"{"n":2}"#])
    }

    /// Every event type, with previous sibling keys, seen on node 3's client for writes made
    /// through nodes 1 and 2.
    static func childEvents(_ a: Database, _ b: Database, _ c: Database) async throws {
        let seen = R()
        let query = c.reference(withPath: "ev/list").queryOrdered(byChild: "s")
        query.observe(.childAdded, andPreviousSiblingKeyWith: { s, p in seen.add("added \(s.key ?? "") \(p ?? "-")") })
        query.observe(.childChanged, andPreviousSiblingKeyWith: { s, p in seen.add("changed \(s.key ?? "") \(p ?? "-")") })
        query.observe(.childMoved, andPreviousSiblingKeyWith: { s, p in seen.add("moved \(s.key ?? "") \(p ?? "-")") })
        query.observe(.childRemoved) { s in seen.add("removed \(s.key ?? "")") }
        query.observe(.value) { s in seen.add("value " + s.children.map { $0.key ?? "" }.joined(separator: ",")) }
        #expect(await seen.wait { $0 == "value " }, "\(seen.all)")

        try await bounded { try await a.reference(withPath: "ev/list").setValue(["a": ["s": 1], "b": ["s": 2], "c": ["s": 3]]) }
        #expect(await seen.wait { $0 == "value a,b,c" }, "\(seen.all)")
        try await bounded { try await b.reference(withPath: "ev/list/a/s").setValue(4) }
        #expect(await seen.wait { $0 == "value b,c,a" }, "\(seen.all)")
        try await bounded { try await b.reference(withPath: "ev/list/b").removeValue() }
        #expect(await seen.wait { $0 == "value c,a" }, "\(seen.all)")
        try await bounded { try await a.reference(withPath: "ev/list/d").setValue(["s": 0]) }
        #expect(await seen.wait { $0 == "value d,c,a" }, "\(seen.all)")
        try await bounded { try await a.reference(withPath: "ev/list/c/s").setValue(3.5) }
        #expect(await seen.wait { _ in seen.all.count >= 15 }, "\(seen.all)")
        #expect(
            seen.all == [
                "value ",
                "added a -", "added b a", "added c b", "value a,b,c",
                "moved a c", "changed a c", "value b,c,a",
                "removed b", "value c,a",
                "added d -", "value d,c,a",
                // Firebase raises child_moved whenever the ordered value changes, even when the
                // child keeps its place (its event generator's `indexedValueChanged`).
                "moved c d", "changed c d", "value d,c,a",
            ], "\(seen.all)")
    }

    /// Every query kind, read with getData through node 2 and observed once through node 3
    /// (the server evaluates both: tagged listens and `g` with the query), and a live limited
    /// query on node 3 as node 1 moves a child into its window.
    static func queries(_ a: Database, _ b: Database, _ c: Database) async throws {
        try await bounded {
            try await a.reference(withPath: "q/people").setValue([
                "ada": ["age": 36], "bob": ["age": 20], "cy": ["age": 50], "dee": ["age": 28], "eve": ["age": 36],
            ])
        }
        try await bounded { try await a.reference(withPath: "q/nums").setValue(["a": 5, "b": 3, "c": 9, "d": 1, "e": 7]) }
        for (key, value, priority) in [("x", "X", 3), ("y", "Y", 1), ("z", "Z", 2)] {
            try await bounded { try await b.reference(withPath: "q/prio/\(key)").setValue(value, andPriority: priority) }
        }
        try await bounded { try await b.reference(withPath: "q/prio/w").setValue("W") }

        typealias Case = (name: String, query: @Sendable (Database) -> DatabaseQuery, keys: [String])
        let cases: [Case] = [
            ("byChild", { $0.reference(withPath: "q/people").queryOrdered(byChild: "age") }, ["bob", "dee", "ada", "eve", "cy"]),
            ("byChild first 2", { $0.reference(withPath: "q/people").queryOrdered(byChild: "age").queryLimited(toFirst: 2) }, ["bob", "dee"]),
            ("byChild last 2", { $0.reference(withPath: "q/people").queryOrdered(byChild: "age").queryLimited(toLast: 2) }, ["eve", "cy"]),
            ("starting at 36", { $0.reference(withPath: "q/people").queryOrdered(byChild: "age").queryStarting(atValue: 36) }, ["ada", "eve", "cy"]),
            ("starting after 36", { $0.reference(withPath: "q/people").queryOrdered(byChild: "age").queryStarting(afterValue: 36) }, ["cy"]),
            (
                "starting after 36 ada", { $0.reference(withPath: "q/people").queryOrdered(byChild: "age").queryStarting(afterValue: 36, childKey: "ada") },
                ["eve", "cy"]
            ),
            ("ending at 28", { $0.reference(withPath: "q/people").queryOrdered(byChild: "age").queryEnding(atValue: 28) }, ["bob", "dee"]),
            ("ending before 28", { $0.reference(withPath: "q/people").queryOrdered(byChild: "age").queryEnding(beforeValue: 28) }, ["bob"]),
            (
                "ending at 36 ada", { $0.reference(withPath: "q/people").queryOrdered(byChild: "age").queryEnding(atValue: 36, childKey: "ada") },
                ["bob", "dee", "ada"]
            ),
            ("equal to 36", { $0.reference(withPath: "q/people").queryOrdered(byChild: "age").queryEqual(toValue: 36) }, ["ada", "eve"]),
            ("equal to 36 eve", { $0.reference(withPath: "q/people").queryOrdered(byChild: "age").queryEqual(toValue: 36, childKey: "eve") }, ["eve"]),
            ("byKey", { $0.reference(withPath: "q/people").queryOrderedByKey() }, ["ada", "bob", "cy", "dee", "eve"]),
            (
                "byKey bob…dee", { $0.reference(withPath: "q/people").queryOrderedByKey().queryStarting(atValue: "bob").queryEnding(atValue: "dee") },
                ["bob", "cy", "dee"]
            ),
            ("byKey last 1", { $0.reference(withPath: "q/people").queryOrderedByKey().queryLimited(toLast: 1) }, ["eve"]),
            ("byValue", { $0.reference(withPath: "q/nums").queryOrderedByValue() }, ["d", "b", "a", "e", "c"]),
            ("byValue first 3", { $0.reference(withPath: "q/nums").queryOrderedByValue().queryLimited(toFirst: 3) }, ["d", "b", "a"]),
            ("byValue from 5", { $0.reference(withPath: "q/nums").queryOrderedByValue().queryStarting(atValue: 5) }, ["a", "e", "c"]),
            ("byPriority", { $0.reference(withPath: "q/prio").queryOrderedByPriority() }, ["w", "y", "z", "x"]),
            ("byPriority from 2", { $0.reference(withPath: "q/prio").queryOrderedByPriority().queryStarting(atValue: 2) }, ["z", "x"]),
        ]
        for q in cases {
            let viaB = try await bounded { try await q.query(b).getData() }
            #expect(viaB.children.map { $0.key ?? "" } == q.keys, "getData \(q.name) via node 2")
            let viaC = try await bounded { try await q.query(c).observeSingleEvent(of: .value) }
            #expect(viaC.children.map { $0.key ?? "" } == q.keys, "observeSingleEvent \(q.name) via node 3")
        }
        // A single child event with its previous sibling key (async form).
        let (second, previous) = try await bounded {
            try await c.reference(withPath: "q/people").queryOrdered(byChild: "age").queryStarting(atValue: 28).queryLimited(toFirst: 1)
                .observeSingleEventAndPreviousSiblingKey(of: .childAdded)
        }
        #expect(second.key == "dee" && previous == nil && json(second.value) == #"{"age":28}"#)

        // A live window on node 3: bob jumps to the top through node 1; eve leaves, bob enters.
        let window = R()
        let top = c.reference(withPath: "q/people").queryOrdered(byChild: "age").queryLimited(toLast: 2)
        top.observe(.childAdded, andPreviousSiblingKeyWith: { s, p in window.add("added \(s.key ?? "") \(p ?? "-")") })
        top.observe(.childRemoved) { s in window.add("removed \(s.key ?? "")") }
        top.observe(.value) { s in window.add("value " + s.children.map { $0.key ?? "" }.joined(separator: ",")) }
        #expect(await window.wait { $0 == "value eve,cy" }, "\(window.all)")
        try await bounded { try await a.reference(withPath: "q/people/bob/age").setValue(99) }
        #expect(await window.wait { $0 == "value cy,bob" }, "\(window.all)")
        #expect(window.all == ["added eve -", "added cy eve", "value eve,cy", "removed eve", "added bob cy", "value cy,bob"], "\(window.all)")
    }

    /// keepSynced keeps a location current with no observer: offline, getData answers from it,
    /// while a location not kept synced waits for the connection.
    static func keepSynced(_ a: Database, _ b: Database) async throws {
        try await bounded { try await a.reference(withPath: "sync/kept").setValue(["v": 1]) }
        let kept = b.reference(withPath: "sync/kept")
        kept.keepSynced(true)
        // Answers leave a connection in request order, after the data of listens requested
        // before: once this read is answered, the kept listen has its data.
        _ = try await bounded { try await b.reference(withPath: "sync/other").getData() }
        b.goOffline()
        #expect(await eventually { b.connectedNode == nil })
        let order = R()
        b.reference(withPath: "sync/other").getData { _, s in order.add("other \(json(s?.value))") }
        b.reference(withPath: "sync/kept").getData { _, s in order.add("kept \(json(s?.value))") }
        #expect(await order.wait { $0.hasPrefix("kept") }, "\(order.all)")
        #expect(order.all == [#"kept {"v":1}"#], "offline: the kept location answers from its synced data, the other waits: \(order.all)")
        b.goOnline()
        #expect(await order.wait { $0.hasPrefix("other") }, "\(order.all)")
        kept.keepSynced(false)
    }

    /// Transactions on one counter from the three nodes at once: every one commits exactly once.
    static func transactions(_ a: Database, _ b: Database, _ c: Database) async throws {
        let each = 8
        let results = R()
        let runs = Log<Int>()
        for (n, db) in [a, b, c].enumerated() {
            for _ in 0..<each {
                db.reference(withPath: "tx/counter").runTransactionBlock({ data in
                    runs.add(n)
                    data.value = ((data.value as? Int) ?? 0) + 1
                    return .success(withValue: data)
                }, andCompletionBlock: { error, committed, _ in results.add("\(committed) \(error.map { "\($0)" } ?? "")") })
            }
        }
        #expect(await results.wait(seconds: 120) { _ in results.all.count == 3 * each }, "\(results.all)")
        #expect(results.all.count == 3 * each && results.all.allSatisfy { $0 == "true " }, "\(results.all)")
        let final = try await bounded { try await a.reference(withPath: "tx/counter").getData() }
        #expect(final.value as? Int == 3 * each, "\(final)")
        #expect(runs.count >= 3 * each, "each block ran at least once (\(runs.count) runs)")
    }

    /// onDisconnect writes registered through node 3 run when that connection ends (goOffline),
    /// seen by node 1's client; a cancelled one does not; `.info/connected` follows.
    static func onDisconnectAndInfo(_ a: Database, _ c: Database) async throws {
        let watched = R()
        a.reference(withPath: "presence").observe(.value) { s in watched.add(json(s.value)) }
        let me = c.reference(withPath: "presence/c")
        try await bounded { try await me.setValue("online") }
        try await bounded { try await me.onDisconnectSetValue("offline") }
        try await bounded { try await c.reference(withPath: "presence/meta").onDisconnectUpdateChildValues(["seen": ServerValue.timestamp(), "by": "c"]) }
        try await bounded { try await c.reference(withPath: "presence/cancelled").onDisconnectSetValue("must not appear") }
        try await bounded { try await c.reference(withPath: "presence/cancelled").cancelDisconnectOperations() }
        #expect(await watched.wait { $0 == #"{"c":"online"}"# }, "\(watched.all)")
        let connected = R()
        c.reference(withPath: ".info/connected").observe(.value) { s in connected.add("\(s.value as? Bool ?? false)") }
        #expect(await connected.wait { $0 == "true" })
        let before = Int64(Date().timeIntervalSince1970 * 1000)
        c.goOffline()
        #expect(await connected.wait { $0 == "false" }, "\(connected.all)")
        #expect(await watched.wait { $0.hasPrefix(#"{"c":"offline","meta":{"by":"c","seen":"#) }, "\(watched.all)")
        #expect(!watched.all.contains { $0.contains("cancelled") }, "\(watched.all)")
        let seen = try await bounded { try await a.reference(withPath: "presence/meta/seen").getData().value as? Int }
        #expect((seen ?? 0) >= Int(before) - 5_000, "the server's time, not a local one: \(seen ?? 0)")
        let offset = try await bounded { try await c.reference(withPath: ".info/serverTimeOffset").getData() }
        #expect(offset.value is Int)
        c.goOnline()
        #expect(await connected.wait { _ in connected.all.last == "true" }, "\(connected.all)")
    }

    /// Server values through every node, Codable values, and both async sequences.
    static func serverValuesCodableAndSequences(_ a: Database, _ b: Database, _ c: Database) async throws {
        let before = Int(Date().timeIntervalSince1970 * 1000)
        try await bounded { try await c.reference(withPath: "sv/at").setValue(ServerValue.timestamp()) }
        let after = Int(Date().timeIntervalSince1970 * 1000)
        let at = try await bounded { try await a.reference(withPath: "sv/at").getData().value as? Int }
        // The same machine's clock: within a few seconds either way.
        #expect((before - 5_000...after + 5_000).contains(at ?? 0), "\(at ?? 0) not within [\(before), \(after)]")
        let done = R()
        for db in [a, b, c] {
            for _ in 0..<10 { db.reference(withPath: "sv/n").setValue(ServerValue.increment(1)) { e, _ in done.add(e.map { "\($0)" } ?? "ok") } }
        }
        #expect(await done.wait(seconds: 120) { _ in done.all.count == 30 }, "\(done.all)")
        #expect(done.all.allSatisfy { $0 == "ok" }, "\(done.all)")
        let n = try await bounded { try await b.reference(withPath: "sv/n").getData().value as? Int }
        #expect(n == 30)

        let ada = Profile(name: "Ada", born: 1815, languages: ["analytical engine"])
        try await bounded { try await a.reference(withPath: "codable/ada").setValue(from: ada) }
        let decoded = try await bounded { try await b.reference(withPath: "codable/ada").getData() }
        #expect(try decoded.data(as: Profile.self) == ada)
        let once = try await bounded { try await c.reference(withPath: "codable/ada").observeSingleEvent(of: .value) }
        #expect(try once.data(as: Profile.self) == ada)

        // Node 2's client iterates child events, node 3's iterates values, as node 1 appends.
        let items = b.reference(withPath: "seq/items").events(of: .childAdded)
        let values = c.reference(withPath: "seq/items").snapshots(of: .value)
        let added = Task { () throws -> [String] in
            var seen: [String] = []
            for try await (snapshot, previous) in items {
                seen.append("\(snapshot.key ?? "") after \(previous ?? "-")")
                if seen.count == 5 { break }
            }
            return seen
        }
        let counted = Task { () throws -> [UInt] in
            var counts: [UInt] = []
            for try await snapshot in values {
                counts.append(snapshot.childrenCount)
                if snapshot.childrenCount == 5 { break }
            }
            return counts
        }
        var keys: [String] = []
        for i in 0..<5 {
            let child = a.reference(withPath: "seq/items").childByAutoId()
            keys.append(child.key ?? "")
            try await bounded { try await child.setValue(i) }
        }
        let addedEvents = try await bounded { try await added.value }
        #expect(addedEvents == keys.enumerated().map { i, k in "\(k) after \(i == 0 ? "-" : keys[i - 1])" }, "\(addedEvents)")
        let counts = try await bounded { try await counted.value }
        #expect(counts.last == 5 && counts == counts.sorted(), "\(counts)")
    }

    // MARK: - Failover

    enum Victim: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case follower, leader
        var testDescription: String { rawValue }
    }

    @Test(
        "failover: kill -9 of the node a client is on while it observes a list another node's client appends to and while it writes: it reconnects to another node, sees every child_added once and in order, and each of its writes applies once",
        arguments: Victim.allCases)
    func failover(_ victim: Victim) async throws {
        let cluster = try Cluster("failover-\(victim.rawValue)", slot: victim == .follower ? 1 : 2, namespace: "failover")
        defer { cluster.stop() }
        try await cluster.startAll()
        let leader = try await cluster.leader()
        // The client under test (F) is on the victim; the appender (W) on the node F does not
        // fail over to first, so F's events after the failover come through a third node.
        let target: UInt64 = victim == .leader ? leader : leader % 3 + 1
        let writerNode = cluster.others(target)[1]
        let f = try cluster.database(first: target)
        let w = try cluster.database(first: writerNode)
        defer {
            f.shutdown()
            w.shutdown()
        }
        #expect(await Self.online(f) == cluster.address(target))
        #expect(await Self.online(w) == cluster.address(writerNode))

        let added = Log<Added>()
        let list = f.reference(withPath: "list")
        list.observe(.childAdded, andPreviousSiblingKeyWith: { s, p in added.add(Added(key: s.key ?? "", previous: p)) })
        _ = try await Self.bounded { try await list.observeSingleEvent(of: .value) }
        let connected = R()
        f.reference(withPath: ".info/connected").observe(.value) { s in connected.add("\(s.value as? Bool ?? false)") }

        // W appends one child at a time, each awaited; F writes without waiting (its writes
        // queue while it has no node): an increment and an append of its own each round.
        let stop = Flag()
        let acknowledged = Log<String>()
        let writerErrors = Log<String>()
        let appends = w.reference(withPath: "list")
        let writer = Task {
            var i = 0
            while !stop.isSet {
                let child = appends.childByAutoId()
                do {
                    try await child.setValue(i)
                    acknowledged.add(child.key ?? "")
                } catch {
                    writerErrors.add("\(i): \(error)")
                }
                i += 1
                try? await Task.sleep(nanoseconds: 10_000_000)
            }
        }
        let own = OwnWrites(f)
        let made = own.made
        let completions = own.completions
        let ownWrites = Task {
            while !stop.isSet {
                own.round()
                try? await Task.sleep(nanoseconds: 20_000_000)
            }
        }
        defer { stop.set() }

        #expect(await Self.eventually { added.count >= 20 && made.count >= 20 }, "before the kill: \(added.count) events, \(made.count) rounds")
        // A burst of 200 writes, and the node killed (from the completion block, so at once)
        // when a quarter of them are answered: the others are in flight, some applied by the
        // cluster with their answers lost with the node (each must apply once when the client
        // sends it again elsewhere).
        let victimPID = cluster.pid(target)
        own.trigger(after: completions.count + 50) { if let victimPID { kill(victimPID, SIGKILL) } }
        for _ in 0..<100 { own.round() }
        #expect(await Self.eventually(seconds: 60) { own.triggered }, "the burst was not answered")
        let seenAtKill = added.count
        let madeAtKill = made.count
        let killedAt = Date()
        cluster.kill9(target)
        let unansweredAtKill = own.unansweredAtTrigger
        let moved = await Self.eventually(seconds: 120) { (f.connectedNode.map { $0 != cluster.address(target) }) ?? false }
        let reconnected = Date().timeIntervalSince(killedAt)
        let node = f.connectedNode ?? "nothing"
        #expect(moved, "the client did not reconnect to another node within 120 s (on \(node))\n\(cluster.logTails())")
        let newLeader = try await cluster.leader(among: cluster.live)
        #expect(newLeader != target)
        #expect(
            await Self.eventually(seconds: 120) { added.count >= seenAtKill + 20 && made.count >= madeAtKill + 20 },
            "after the failover: \(added.count) events (\(seenAtKill) at the kill), \(made.count) rounds")
        stop.set()
        try await Self.bounded(120) { await writer.value }
        try await Self.bounded(120) { await ownWrites.value }

        // Every write of F is answered, once, with success.
        let rounds = made.count
        #expect(await Self.eventually(seconds: 120) { completions.count >= 2 * rounds }, "\(completions.count) of \(2 * rounds) answered")
        #expect(completions.count == 2 * rounds && completions.all.allSatisfy { $0 == "ok" }, "\(completions.all.filter { $0 != "ok" })")
        #expect(writerErrors.all.isEmpty, "\(writerErrors.all)")

        // F saw W's last child: every earlier event came before it (one ordered stream).
        let keys = acknowledged.all
        #expect(await Self.eventually(seconds: 120) { added.all.contains { $0.key == keys.last } }, "\(added.count) events of \(keys.count)")
        let seen = added.all
        let seenKeys = seen.map(\.key)
        let duplicates = Dictionary(grouping: seenKeys, by: { $0 }).filter { $0.value.count > 1 }.keys.sorted()
        let missing = Set(keys).subtracting(seenKeys).sorted()
        #expect(duplicates.isEmpty, "child_added twice for \(duplicates.count) children: \(duplicates.prefix(5))…")
        #expect(missing.isEmpty, "child_added never raised for \(missing.count) children: \(missing.prefix(5))…")
        let firstDifference = zip(seenKeys, keys).enumerated().first { $0.element.0 != $0.element.1 }.map(\.offset)
        let sameSequence = seenKeys == keys
        let at = firstDifference.map(String.init) ?? "the end"
        #expect(sameSequence, "the events differ from the appends at \(at): \(seenKeys.count) events, \(keys.count) appends")
        let wrongPrevious = seen.indices.filter { i in seen[i].previous != (i == 0 ? nil : seen[i - 1].key) }
        #expect(wrongPrevious.isEmpty, "previous sibling keys wrong at \(wrongPrevious.prefix(5))")
        #expect(connected.all.contains("false") && connected.all.last == "true", "\(connected.all)")

        // Each of F's writes applied exactly once.
        let counter = try await Self.bounded { try await w.reference(withPath: "counter").getData().value as? Int }
        #expect(counter == rounds, "the counter is \(counter.map(String.init) ?? "nil") after \(rounds) acknowledged increments")
        let mine = try await Self.bounded { try await w.reference(withPath: "mine").getData() }
        let values = mine.children.compactMap { $0.value as? Int }
        #expect(values == Array(0..<rounds), "\(mine.childrenCount) children for \(rounds) appends")
        print(
            "failover (\(victim.rawValue)): node \(target) killed, the client on \(node) after \(String(format: "%.2f", reconnected)) s, leader \(newLeader); "
                + "\(keys.count) child_added events, \(rounds) increments and appends (\(unansweredAtKill) writes unanswered at the kill)")
    }

    @Test("a drained node sends its clients on with the protocol's reset: a client whose only configured node drains reconnects at once to the node the reset names (not in its list), keeps its listen without a repeated or lost event, and its writes land")
    func drainMovesTheClient() async throws {
        let cluster = try Cluster("drain", slot: 5, namespace: "drain")
        defer { cluster.stop() }
        try await cluster.startAll()
        // A client that knows node 1 only.
        let f = try Database(url: cluster.url(1), nodes: [], authToken: "owner")
        let w = try cluster.database(first: 3)
        defer {
            f.shutdown()
            w.shutdown()
        }
        #expect(await Self.online(f) == cluster.address(1))
        let values = Log<String>()
        f.reference(withPath: "counter").observe(.value) { s in values.add(Self.json(s.value)) }
        try await Self.bounded { try await w.reference(withPath: "counter").setValue(1) }
        #expect(await Self.eventually { values.all.last == "1" }, "\(values.all)")

        let answer = try await cluster.ops.request(
            1, .POST, "/.banyan/drain?auth=owner", headers: [("Content-Type", "application/json")], body: #"{"to":["\#(cluster.address(2))"]}"#)
        #expect(answer.status == 200, "\(answer.status) \(answer.text)")
        let moved = await Self.eventually(seconds: 60) { f.connectedNode == cluster.address(2) }
        #expect(moved, "the client is on \(f.connectedNode ?? "nothing")")
        // Its listen goes on through node 2, and its writes land there.
        try await Self.bounded { try await w.reference(withPath: "counter").setValue(2) }
        try await Self.bounded { try await f.reference(withPath: "mine").setValue("after the drain") }
        #expect(await Self.eventually { values.all.last == "2" }, "\(values.all)")
        let read = try await Self.bounded { try await w.reference(withPath: "mine").getData() }
        #expect(Self.json(read.value) == #""after the drain""#)
        // No value was raised twice or lost (1 then 2; a null first if the listen started empty).
        #expect(values.all.filter { $0 != "null" } == ["1", "2"], "\(values.all)")
    }

    @Test("accounts and the alias surfaces across nodes: a user created through node 1 signs in through node 2 and writes its own record under rules there; node 3 reads it with the same token; a Firebase 2.x client signs in on node 3 and a Wilddog client on node 1 sees what it writes")
    func accountsAndAliasesAcrossNodes() async throws {
        let cluster = try Cluster("accounts", slot: 7, namespace: "accounts")
        defer { cluster.stop() }
        try await cluster.startAll()
        let rules = #"{"rules":{"users":{"$uid":{".read":"auth != null && auth.uid === $uid",".write":"auth != null && auth.uid === $uid"}},"public":{".read":true,".write":true}}}"#
        let set = try await cluster.ops.request(1, .PUT, "/.settings/rules.json?ns=accounts&auth=owner", body: rules, timeout: 15)
        #expect(set.status == 200, "\(set.status) \(set.text)")
        let one = try Database(url: cluster.url(1), nodes: [])
        let two = try Database(url: cluster.url(2), nodes: [])
        let three = try Database(url: cluster.url(3), nodes: [])
        defer {
            one.shutdown()
            two.shutdown()
            three.shutdown()
        }
        // Created through node 1, signed in through node 2 (the account lives in the log).
        let created = try await Self.bounded { try await Auth.auth(database: one).createUser(withEmail: "lin@x.y", password: "margaret-1969") }
        let onTwo = Auth.auth(database: two)
        let signedIn = try await Self.bounded { try await onTwo.signIn(withEmail: "lin@x.y", password: "margaret-1969") }
        #expect(signedIn.uid == created.uid)
        #expect(await AuthTests.write(two.reference(withPath: "users/\(created.uid)"), ["name": "Lin"]) == "ok")
        #expect(await AuthTests.write(two.reference(withPath: "users/someone-else"), ["name": "x"]) == "permission_denied")
        // Node 3 takes the same token (signed with the cluster's key) and reads the record.
        onTwo.attach(three)
        let read = try await Self.bounded { try await three.reference(withPath: "users/\(created.uid)/name").getData() }
        #expect(read.value as? String == "Lin")

        // The 2.x surface on node 3: sign in with the password, write its own record.
        let legacy = Firebase(url: cluster.url(3))
        let (outcome, data) = await Firebase2xTests.auth { legacy.authUser("lin@x.y", password: "margaret-1969", withCompletionBlock: $0) }
        #expect(outcome == "ok" && data?.uid == created.uid, "\(outcome)")
        await Firebase2xTests.check("ok") { legacy.childByAppendingPath("users/\(created.uid)/via").setValue("2.x", withCompletionBlock: $0) }
        // The Wilddog surface on node 1 sees a public value the 2.x client writes on node 3.
        let sync = try WDGSync.sync(url: cluster.url(1))
        let seen = R()
        sync.reference(withPath: "public/note").observe(WDGDataEventType.value) { s in seen.add(DatabaseTests.json(s.value)) }
        await Firebase2xTests.check("ok") { legacy.childByAppendingPath("public/note").setValue("from node 3", withCompletionBlock: $0) }
        #expect(await seen.wait { $0 == #""from node 3""# }, "\(seen.all)")
        let via = try await Self.bounded { try await two.reference(withPath: "users/\(created.uid)/via").getData() }
        #expect(via.value as? String == "2.x")
        legacy.unauth()
    }

    @Test(
        "a stopped node (SIGSTOP: its kernel keeps the TCP connection up, nothing answers; a follower, then the leader, which the others replace) under a client that observes a list another client appends to and writes: the client's timers find the node silent and it fails over within its configured time, sees every child_added once and in order, and each of its writes lands once, also after the node resumes",
        arguments: Victim.allCases)
    func stoppedNode(_ role: Victim) async throws {
        let cluster = try Cluster("sigstop-\(role.rawValue)", slot: role == .follower ? 4 : 6, namespace: "sigstop")
        let stopped = Log<pid_t>()
        defer {
            // A stopped process ignores SIGTERM until continued.
            for pid in stopped.all { kill(pid, SIGCONT) }
            cluster.stop()
        }
        try await cluster.startAll()
        let leader = try await cluster.leader()
        // F starts on the node to stop; W, the appender, on the node F does not fail over to first.
        let first: UInt64 = role == .leader ? leader : leader % 3 + 1
        let writerNode = cluster.others(first)[1]
        let f = try cluster.database(first: first)
        let idle = 2.0
        let ping = 2.0
        let connect = 3.0
        f.idleTimeout = idle
        f.pingTimeout = ping
        f.connectionTimeout = connect
        let w = try cluster.database(first: writerNode)
        defer {
            f.shutdown()
            w.shutdown()
        }
        #expect(await Self.online(f) != nil)
        #expect(await Self.online(w) == cluster.address(writerNode))

        let added = Log<Added>()
        let list = f.reference(withPath: "list")
        list.observe(.childAdded, andPreviousSiblingKeyWith: { s, p in added.add(Added(key: s.key ?? "", previous: p)) })
        _ = try await Self.bounded { try await list.observeSingleEvent(of: .value) }
        let connected = R()
        f.reference(withPath: ".info/connected").observe(.value) { s in connected.add("\(s.value as? Bool ?? false)") }

        let stop = Flag()
        let acknowledged = Log<String>()
        let writerErrors = Log<String>()
        let appends = w.reference(withPath: "list")
        let writer = Task {
            var i = 0
            while !stop.isSet {
                let child = appends.childByAutoId()
                do {
                    try await child.setValue(i)
                    acknowledged.add(child.key ?? "")
                } catch {
                    writerErrors.add("\(i): \(error)")
                }
                i += 1
                try? await Task.sleep(nanoseconds: 10_000_000)
            }
        }
        let own = OwnWrites(f)
        let made = own.made
        let completions = own.completions
        let ownWrites = Task {
            while !stop.isSet {
                own.round()
                try? await Task.sleep(nanoseconds: 20_000_000)
            }
        }
        defer { stop.set() }

        #expect(await Self.eventually { added.count >= 20 && made.count >= 20 }, "before the stop: \(added.count) events, \(made.count) rounds")
        // Stop the node F is on now (the one it started on, unless a slow moment already moved
        // it): TCP stays up, the node answers nothing.
        let onNode = f.connectedNode
        let victim = try #require([UInt64(1), 2, 3].first { cluster.address($0) == onNode }, "F is on \(onNode ?? "nothing")")
        let victimPID = try #require(cluster.pid(victim))
        kill(victimPID, SIGSTOP)
        stopped.add(victimPID)
        let stoppedAt = Date()
        let seenAtStop = added.count
        let madeAtStop = made.count
        let moved = await Self.eventually(seconds: 60, every: 0.05) { (f.connectedNode.map { $0 != cluster.address(victim) }) ?? false }
        let movedAfter = Date().timeIntervalSince(stoppedAt)
        let node = f.connectedNode ?? "nothing"
        #expect(moved, "the client did not leave the stopped node within 60 s (on \(node))\n\(cluster.logTails())")
        // By design: silent for `idle`, the ping unanswered for `ping`, a back-off under a
        // second, then the next node (a live one) answers at once; 10 s of slack for a loaded
        // machine.
        #expect(movedAfter < idle + ping + 1 + 10, "moved after \(movedAfter) s")
        if role == .leader {
            // The others elect a leader of their own; the stopped one is no longer it.
            let replaced = try await cluster.leader(among: [UInt64(1), 2, 3].filter { $0 != victim })
            #expect(replaced != victim)
        }
        #expect(
            await Self.eventually(seconds: 120) { added.count >= seenAtStop + 20 && made.count >= madeAtStop + 20 },
            "after the failover: \(added.count) events (\(seenAtStop) at the stop), \(made.count) rounds")
        stop.set()
        try await Self.bounded(120) { await writer.value }
        try await Self.bounded(120) { await ownWrites.value }

        // Every write of F is answered, once, with success.
        let rounds = made.count
        #expect(await Self.eventually(seconds: 120) { completions.count >= 2 * rounds }, "\(completions.count) of \(2 * rounds) answered")
        #expect(completions.count == 2 * rounds && completions.all.allSatisfy { $0 == "ok" }, "\(completions.all.filter { $0 != "ok" })")
        #expect(writerErrors.all.isEmpty, "\(writerErrors.all)")

        // F saw W's last child, every earlier one once and in order.
        let keys = acknowledged.all
        #expect(await Self.eventually(seconds: 120) { added.all.contains { $0.key == keys.last } }, "\(added.count) events of \(keys.count)")
        let seen = added.all
        let seenKeys = seen.map(\.key)
        let duplicates = Dictionary(grouping: seenKeys, by: { $0 }).filter { $0.value.count > 1 }.keys.sorted()
        let missing = Set(keys).subtracting(seenKeys).sorted()
        #expect(duplicates.isEmpty, "child_added twice for \(duplicates.count) children: \(duplicates.prefix(5))…")
        #expect(missing.isEmpty, "child_added never raised for \(missing.count) children: \(missing.prefix(5))…")
        #expect(seenKeys == keys, "the events differ from the appends: \(seenKeys.count) events, \(keys.count) appends")
        let wrongPrevious = seen.indices.filter { i in seen[i].previous != (i == 0 ? nil : seen[i - 1].key) }
        #expect(wrongPrevious.isEmpty, "previous sibling keys wrong at \(wrongPrevious.prefix(5))")
        #expect(connected.all.contains("false") && connected.all.last == "true", "\(connected.all)")

        // Each of F's writes applied exactly once.
        let counter = try await Self.bounded { try await w.reference(withPath: "counter").getData().value as? Int }
        #expect(counter == rounds, "the counter is \(counter.map(String.init) ?? "nil") after \(rounds) acknowledged increments")
        let mine = try await Self.bounded { try await w.reference(withPath: "mine").getData() }
        #expect(mine.children.compactMap { $0.value as? Int } == Array(0..<rounds), "\(mine.childrenCount) children for \(rounds) appends")

        // The node resumes and reads what F sent it before the failover (its socket buffer):
        // nothing applies twice.
        kill(victimPID, SIGCONT)
        #expect(await cluster.waitReady(victim, seconds: 120), "node \(victim) not ready after SIGCONT\n\(cluster.logTails())")
        try await Task.sleep(nanoseconds: 2_000_000_000)
        let counterAfter = try await Self.bounded { try await w.reference(withPath: "counter").getData().value as? Int }
        let mineAfter = try await Self.bounded { try await w.reference(withPath: "mine").getData() }
        #expect(counterAfter == rounds && mineAfter.childrenCount == rounds, "after the resume: counter \(counterAfter.map(String.init) ?? "nil"), \(mineAfter.childrenCount) children, \(rounds) rounds")
        print(
            "stopped node (\(role.rawValue)): node \(victim) stopped (leader \(leader)), the client on \(node) after \(String(format: "%.2f", movedAfter)) s "
                + "(idle \(idle) s + ping \(ping) s); \(keys.count) child_added events, \(rounds) increments and appends")
    }

    /// The failing-over client's own writes: each round an increment of `counter` and an
    /// append to `mine` (its round number), made without waiting; completions recorded.
    final class OwnWrites: @unchecked Sendable {
        let db: Database
        let made = Log<Int>()
        let completions = Log<String>()
        private let lock = NSLock()
        init(_ db: Database) { self.db = db }

        private var action: (count: Int, run: @Sendable () -> Void)?
        private var ran = false
        private var unanswered = 0
        /// Writes made and not answered when the trigger ran.
        var unansweredAtTrigger: Int { lock.withLock { unanswered } }

        /// One round (rounds from several tasks keep their order: push ids follow the numbers).
        func round() {
            lock.withLock {
                let j = made.count
                db.reference(withPath: "counter").setValue(ServerValue.increment(1)) { e, _ in self.answered(e.map { "counter: \($0)" } ?? "ok") }
                db.reference(withPath: "mine").childByAutoId().setValue(j) { e, _ in self.answered(e.map { "mine: \($0)" } ?? "ok") }
                made.add(j)
            }
        }

        /// Runs `run` in the completion block that brings the answers to `count`.
        func trigger(after count: Int, _ run: @escaping @Sendable () -> Void) { lock.withLock { action = (count, run) } }
        var triggered: Bool { lock.withLock { ran } }

        private func answered(_ outcome: String) {
            completions.add(outcome)
            let due: (@Sendable () -> Void)? = lock.withLock {
                guard let action, completions.count >= action.count else { return nil }
                self.action = nil
                ran = true
                unanswered = 2 * made.count - completions.count
                return action.run
            }
            due?()
        }
    }

    struct Added: Sendable {
        var key: String
        var previous: String?
    }

    // MARK: - The offline queue across processes

    /// A `banyan-sdk-probe` process; its output goes to a file the test reads as it runs.
    final class ProbeProcess: @unchecked Sendable {
        let pid: pid_t
        let output: String
        private let lock = NSLock()
        private var ending: ChildProcess.Ending?

        init(_ arguments: [String], directory: String, name: String) throws {
            output = "\(directory)/\(name).out"
            pid = try ChildProcess.spawn(
                try Cluster.executable("banyan-sdk-probe"), arguments, environment: ProcessInfo.processInfo.environment, outputFile: output)
        }

        var lines: [String] { ((try? String(contentsOfFile: output, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init) }

        func waitLine(seconds: Double = 60, _ match: @escaping @Sendable (String) -> Bool) async -> Bool {
            await ClusterSDKTests.eventually(seconds: seconds) { self.lines.contains(where: match) }
        }

        /// How it ended, reaped without blocking; nil while it runs.
        func poll() -> ChildProcess.Ending? {
            lock.withLock {
                if ending == nil {
                    var status: Int32 = 0
                    if waitpid(pid, &status, WNOHANG) == pid { ending = status & 0x7f == 0 ? .exited((status >> 8) & 0xff) : .signalled(status & 0x7f) }
                }
                return ending
            }
        }

        func waitEnd(seconds: Double) async -> ChildProcess.Ending? {
            _ = await ClusterSDKTests.eventually(seconds: seconds) { self.poll() != nil }
            return poll()
        }

        /// `kill -9`, reaped (nothing if it already ended).
        func kill9() {
            guard poll() == nil else { return }
            kill(pid, SIGKILL)
            lock.withLock { ending = ChildProcess.wait(pid, seconds: 10) }
        }
    }

    @Test(
        "app processes on the SDK: onDisconnect writes of a killed process run (seen through another node); writes queued offline by a process killed -9 are delivered by the next start, which is killed mid-delivery; the start after that, its first node dead, fails over and finishes; every write applies exactly once"
    )
    func processRestarts() async throws {
        let cluster = try Cluster("restart", slot: 3, namespace: "restart")
        defer { cluster.stop() }
        try await cluster.startAll()
        let dir = cluster.directory
        let watcher = try cluster.database(first: 2)
        defer { watcher.shutdown() }

        // onDisconnect: registered by a process on node 3, which is killed; node 2's client sees it.
        let presence = R()
        watcher.reference(withPath: "presence/app").observe(.value) { s in presence.add(Self.json(s.value)) }
        let holder = try ProbeProcess(["presence", "--url", cluster.url(3), "--path", "presence/app"], directory: dir, name: "presence")
        defer { holder.kill9() }
        #expect(await holder.waitLine { $0.hasPrefix("registered") }, "\(holder.lines)")
        #expect(holder.lines.contains("registered \(cluster.address(3))"), "\(holder.lines)")
        #expect(await presence.wait { $0 == #"{"state":"here"}"# }, "\(presence.all)")
        holder.kill9()
        #expect(await presence.wait { $0.hasPrefix(#"{"left":"#) && $0.hasSuffix(#","state":"gone"}"#) }, "\(presence.all)")

        // Run 1: offline from the start, queues 3n writes, and is killed once they are on disk.
        let n = 100
        let app = ["--url", cluster.url(1)] + cluster.others(1).flatMap { ["--node", cluster.address($0)] } + ["--cache", dir + "/app-cache"]
        let first = try ProbeProcess(["queue"] + app + ["--path", "app", "--count", "\(n)"], directory: dir, name: "run1")
        defer { first.kill9() }
        #expect(await first.waitLine { $0.hasPrefix("queued") }, "\(first.lines)")
        #expect(first.lines == ["queued \(3 * n) online no"], "\(first.lines)")
        first.kill9()
        let before = try await Self.bounded { try await watcher.reference(withPath: "app").getData() }
        #expect(!before.exists(), "nothing reached the cluster from the offline process: \(before)")

        // Run 2: restores the queue and delivers it, and kills itself half-way.
        let second = try ProbeProcess(["deliver"] + app + ["--die-at-pending", "\(3 * n / 2)"], directory: dir, name: "run2")
        defer { second.kill9() }
        let secondEnd = await second.waitEnd(seconds: 120)
        #expect(secondEnd == .signalled(SIGKILL), "\(String(describing: secondEnd)): \(second.lines)")
        #expect(second.lines.first == "restored \(3 * n)", "\(second.lines)")

        // Run 3: its first node is dead (it fails over); restores what is left and delivers it.
        cluster.kill9(1)
        let third = try ProbeProcess(["deliver"] + app, directory: dir, name: "run3")
        defer { third.kill9() }
        let thirdEnd = await third.waitEnd(seconds: 150)
        #expect(thirdEnd == .exited(0), "\(String(describing: thirdEnd)): \(third.lines)\n\(cluster.logTails())")
        let restored = third.lines.first.flatMap { Int($0.split(separator: " ").last ?? "") } ?? -1
        let died = second.lines.last.flatMap { Int($0.split(separator: " ").last ?? "") } ?? -1
        #expect(restored >= 0 && restored <= max(died, 0), "run 2 died with \(died) unanswered; run 3 restored \(restored)")
        #expect(third.lines.last.map { $0.hasPrefix("delivered via") && !$0.hasSuffix(cluster.address(1)) } == true, "\(third.lines)")

        // Every write applied once, read through nodes 2 and 3.
        let other = try cluster.database(first: 3)
        defer { other.shutdown() }
        for reader in [watcher, other] {
            let data = try await Self.bounded { try await reader.reference(withPath: "app").getData() }
            #expect(data.childSnapshot(forPath: "counter").value as? Int == n, "\(data.childSnapshot(forPath: "counter"))")
            #expect(Self.json(data.childSnapshot(forPath: "stats").value) == #"{"last":\#(n - 1),"n":\#(n)}"#)
            let log = data.childSnapshot(forPath: "log").children.map { Self.json($0.value) }
            #expect(log == (0..<n).map { #"{"i":\#($0)}"# }, "\(log.count) log entries for \(n)")
        }

        // Run 4: nothing is left to send, and nothing applies again.
        let fourth = try ProbeProcess(["deliver"] + app, directory: dir, name: "run4")
        defer { fourth.kill9() }
        let fourthEnd = await fourth.waitEnd(seconds: 120)
        #expect(fourthEnd == .exited(0) && fourth.lines.first == "restored 0", "\(String(describing: fourthEnd)): \(fourth.lines)")
        let counter = try await Self.bounded { try await other.reference(withPath: "app/counter").getData().value as? Int }
        #expect(counter == n)
        print("process restarts: run 2 died with \(died) of \(3 * n) writes unanswered, run 3 restored \(restored) and \(third.lines.last ?? "")")
    }
}
