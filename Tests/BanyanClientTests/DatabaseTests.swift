import BanyanClient
import BanyanServer
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Logging
import Testing

/// The Swift SDK against a real node (in process, over loopback WebSocket): writes with
/// completions and async forms, value observers with local events first, multi-path updates,
/// reads, another client's view, and a refused write rolled back.
@Suite(.serialized) struct DatabaseTests {
    final class Recorder: @unchecked Sendable {
        private let lock = NSLock()
        private var items: [String] = []
        func add(_ s: String) { lock.withLock { items.append(s) } }
        var all: [String] { lock.withLock { items } }

        /// Waits (bounded) until some recorded item satisfies `match`.
        func wait(seconds: Double = 60, _ match: (String) -> Bool) async -> Bool {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                if all.contains(where: match) { return true }
                try? await Task.sleep(nanoseconds: 20_000_000)
            }
            // Once more: with CPU-bound suites holding the concurrency pool, this task may wake
            // long after the deadline though the event came in time.
            return all.contains(where: match)
        }
    }

    struct TimedOut: Error {}

    /// `body`, or `TimedOut` after `seconds` (an SDK call that never completes fails the test
    /// instead of hanging it). The body runs in a task of its own that the caller does not wait
    /// for: a task group would wait at its end for a body that ignores cancellation (an SDK call
    /// whose completion never comes), and the bound would never end the test.
    static func bounded<T: Sendable>(_ seconds: Double = 300, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let once = Once()
        return try await withCheckedThrowingContinuation { (answer: CheckedContinuation<T, any Error>) in
            let timer = Task {
                try? await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
                guard !Task.isCancelled, once.claim() else { return }
                answer.resume(throwing: TimedOut())
            }
            Task {
                let result: Result<T, any Error>
                do { result = .success(try await body()) } catch { result = .failure(error) }
                timer.cancel()
                if once.claim() { answer.resume(with: result) }
            }
        }
    }

    /// True for the first caller only.
    final class Once: @unchecked Sendable {
        private let lock = NSLock()
        private var claimed = false
        func claim() -> Bool {
            lock.withLock {
                defer { claimed = true }
                return !claimed
            }
        }
    }

    /// Canonical JSON of an observed value (sorted keys), or "null".
    static func json(_ value: Any?) -> String {
        guard let value else { return "null" }
        guard let data = try? JSONSerialization.data(withJSONObject: value, options: [.sortedKeys, .fragmentsAllowed]) else { return "?" }
        return String(decoding: data, as: UTF8.self)
    }

    static func startNode() throws -> (BanyanNode, Int, String) {
        let dir = NSTemporaryDirectory() + "banyan-sdk-\(UInt64.random(in: 0...UInt64.max))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        var c = NodeConfig()
        c.dataDirectory = dir + "/data"
        c.clientAddress = HostPort(host: "127.0.0.1", port: 0)
        c.peerAddress = HostPort(host: "127.0.0.1", port: 0)
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        let port = Int(node.clientAddress.split(separator: ":").last ?? "") ?? 0
        return (node, port, dir)
    }

    /// Runs `body` with the client port of a fresh single node, stopped and removed after.
    static func withNode(_ body: (Int) async throws -> Void) async throws {
        let (node, port, dir) = try startNode()
        defer {
            node.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        try await body(port)
    }

    @Test func writesObserversAndReads() async throws {
        let (node, port, dir) = try Self.startNode()
        defer {
            node.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        let db = try Database(url: "http://127.0.0.1:\(port)?ns=sdk", authToken: "owner")
        defer { db.shutdown() }
        let ref = db.reference(withPath: "chat/room1")
        #expect(ref.key == "room1" && ref.parent?.key == "chat" && ref.root.key == nil)
        #expect(ref.url == "http://127.0.0.1:\(port)/chat/room1?ns=sdk")

        let seen = Recorder()
        let handle = ref.observe(.value) { snapshot in seen.add("value " + Self.json(snapshot.value)) }
        #expect(await seen.wait { $0 == "value null" }, "\(seen.all)")

        // A write: the local event comes before its completion, then the completion.
        let order = Recorder()
        ref.observe(.value) { snapshot in order.add("event " + Self.json(snapshot.value)) }
        _ = await order.wait { $0 == "event null" }
        ref.setValue(["title": "Hello", "count": 1]) { error, _ in order.add("done \(error.map { "\($0)" } ?? "ok")") }
        #expect(await order.wait { $0 == "done ok" }, "\(order.all)")
        let events = order.all
        let firstEvent = events.firstIndex(of: #"event {"count":1,"title":"Hello"}"#)
        let done = events.firstIndex(of: "done ok")
        #expect(firstEvent != nil && done != nil && (firstEvent ?? 99) < (done ?? 0), "\(events)")

        // Multi-path update, async form.
        try await Self.bounded { try await ref.updateChildValues(["count": 2, "meta/by": "ada"]) }
        #expect(await seen.wait { $0 == #"value {"count":2,"meta":{"by":"ada"},"title":"Hello"}"# }, "\(seen.all)")

        // Another client sees it; getData reads from the server.
        let other = try Database(url: "http://127.0.0.1:\(port)?ns=sdk", authToken: "owner")
        defer { other.shutdown() }
        let read = try await Self.bounded { try await other.reference(withPath: "chat/room1/meta").getData() }
        #expect(Self.json(read.value) == #"{"by":"ada"}"# && read.key == "meta" && read.childrenCount == 1 && read.hasChild("by"))

        // Push ids: ordered children; arrays come back as arrays.
        let list = db.reference(withPath: "lists/l")
        for i in 0..<3 { try await Self.bounded { try await list.childByAutoId().setValue(i) } }
        let pushed = try await Self.bounded { try await other.reference(withPath: "lists/l").getData() }
        #expect(pushed.children.map { Self.json($0.value) } == ["0", "1", "2"])
        try await Self.bounded { try await db.reference(withPath: "arr").setValue(["a", "b", "c"]) }
        let array = try await Self.bounded { try await other.reference(withPath: "arr").getData() }
        #expect(Self.json(array.value) == #"["a","b","c"]"#)

        // Removal; the observer sees null; removing the observer stops events.
        try await Self.bounded { try await ref.removeValue() }
        #expect(await seen.wait { $0 == "value null" && seen.all.count > 2 })
        ref.removeObserver(withHandle: handle)
        let count = seen.all.count
        try await Self.bounded { try await ref.setValue("after") }
        try await Task.sleep(nanoseconds: 300_000_000)
        #expect(seen.all.count == count, "\(seen.all)")

        // Server values resolve on the server.
        try await Self.bounded { try await db.reference(withPath: "stamp").setValue(ServerValue.timestamp()) }
        let stamp = try await Self.bounded { try await other.reference(withPath: "stamp").getData().value as? Int }
        #expect((stamp ?? 0) > 1_700_000_000_000)
    }

    @Test func aRefusedWriteIsRolledBackWithItsError() async throws {
        let (node, port, dir) = try Self.startNode()
        defer {
            node.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        // Rules: anyone reads; nobody but administrators writes /locked.
        let admin = try Database(url: "http://127.0.0.1:\(port)?ns=sdk", authToken: "owner")
        defer { admin.shutdown() }
        try await Self.bounded { try await admin.reference(withPath: "locked").setValue("original") }
        var request = URLRequest(url: try #require(URL(string: "http://127.0.0.1:\(port)/.settings/rules.json?ns=sdk&auth=owner")))
        request.httpMethod = "PUT"
        request.httpBody = Data(#"{"rules":{".read":true,"locked":{".write":false},"open":{".write":true}}}"#.utf8)
        let status = try await Self.status(request)
        #expect(status == 200)

        let user = try Database(url: "http://127.0.0.1:\(port)?ns=sdk")
        defer { user.shutdown() }
        let seen = Recorder()
        user.reference(withPath: "locked").observe(.value) { s in seen.add("value " + Self.json(s.value)) }
        #expect(await seen.wait { $0 == #"value "original""# })
        user.reference(withPath: "locked").setValue("mine") { error, _ in
            seen.add("done " + ((error as? DatabaseError)?.code ?? "ok"))
        }
        #expect(await seen.wait { $0 == "done permission_denied" }, "\(seen.all)")
        // The local value showed, then went back.
        let all = seen.all
        #expect(all.contains(#"value "mine""#), "\(all)")
        #expect(all.last(where: { $0.hasPrefix("value") }) == #"value "original""#, "\(all)")
        try await Self.bounded { try await user.reference(withPath: "open/x").setValue(1) }
    }

    static func status(_ request: URLRequest) async throws -> Int {
        try await withCheckedThrowingContinuation { c in
            URLSession.shared.dataTask(with: request) { _, response, error in
                if let error { c.resume(throwing: error) } else { c.resume(returning: (response as? HTTPURLResponse)?.statusCode ?? 0) }
            }.resume()
        }
    }
}
