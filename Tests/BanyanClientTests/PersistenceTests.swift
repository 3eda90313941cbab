import BanyanClient
import BanyanServer
import Foundation
import Testing

/// Persistence on disk against a real node: writes made offline survive the app's restart and
/// reach the server once; synced data serves observers at once after a restart, offline.
@Suite(.serialized) struct SDKPersistenceTests {
    typealias R = DatabaseTests.Recorder

    static func database(_ port: Int, cache: URL) throws -> Database {
        let db = try Database(url: "http://127.0.0.1:\(port)?ns=persist", authToken: "owner")
        db.isPersistenceEnabled = true
        db.persistenceDirectory = cache
        return db
    }

    @Test("writes queued offline survive a restart (a new Database on the same cache) and apply once; cached data shows at once, offline")
    func restartWithQueuedWrites() async throws {
        let (node, port, dir) = try DatabaseTests.startNode()
        let cache = URL(fileURLWithPath: dir).appendingPathComponent("client-cache")
        defer {
            node.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        // First run: sync /feed, then go offline and write.
        let first = try Self.database(port, cache: cache)
        try await DatabaseTests.bounded { try await first.reference(withPath: "feed/m1").setValue("hello") }
        let synced = R()
        first.reference(withPath: "feed").observe(.value) { s in synced.add(DatabaseTests.json(s.value)) }
        #expect(await synced.wait { $0 == #"{"m1":"hello"}"# })
        first.goOffline()
        first.reference(withPath: "feed/m2").setValue("written offline", withCompletionBlock: nil)
        first.reference(withPath: "stats").updateChildValues(["sent": ServerValue.increment(1)], withCompletionBlock: nil)
        #expect(await synced.wait { $0 == #"{"m1":"hello","m2":"written offline"}"# })
        #expect(first.pendingWriteCount == 2)
        first.shutdown()
        #expect(first.persistenceError == nil)

        // Second run, offline from the start: the cache shows the data and the queued write at once.
        let second = try Self.database(port, cache: cache)
        second.goOffline()
        let seen = R()
        second.reference(withPath: "feed").observe(.value) { s in seen.add(DatabaseTests.json(s.value)) }
        #expect(await seen.wait { $0 == #"{"m1":"hello","m2":"written offline"}"# }, "\(seen.all)")
        #expect(second.pendingWriteCount == 2)
        // Online: the queued writes reach the server, once each.
        second.goOnline()
        let check = try Database(url: "http://127.0.0.1:\(port)?ns=persist", authToken: "owner")
        defer { check.shutdown() }
        var stats: Int?
        for _ in 0..<300 {
            stats = try await DatabaseTests.bounded { try await check.reference(withPath: "stats/sent").getData().value as? Int }
            if stats != nil && second.pendingWriteCount == 0 { break }
            try await Task.sleep(nanoseconds: 100_000_000)
        }
        #expect(stats == 1)
        let feed = try await DatabaseTests.bounded { try await check.reference(withPath: "feed/m2").getData() }
        #expect(feed.value as? String == "written offline")
        second.shutdown()

        // Third run: nothing left to send; the stats were not incremented again.
        let third = try Self.database(port, cache: cache)
        // Activated first (the cache file is read on first use): only then does the count say
        // what the file restored.
        _ = third.reference()
        #expect(third.pendingWriteCount == 0)
        #expect(third.persistenceError == nil)
        try await Task.sleep(nanoseconds: 500_000_000)
        third.shutdown()
        let again = try await DatabaseTests.bounded { try await check.reference(withPath: "stats/sent").getData().value as? Int }
        #expect(again == 1)
    }

    @Test("a limited query's window (the last messages of a chat) survives a restart: offline it shows at once, child events in order; online it goes on from there")
    func limitedQueryAcrossRestart() async throws {
        let (node, port, dir) = try DatabaseTests.startNode()
        let cache = URL(fileURLWithPath: dir).appendingPathComponent("client-cache")
        defer {
            node.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        let first = try Self.database(port, cache: cache)
        for i in 1...5 { try await DatabaseTests.bounded { try await first.reference(withPath: "chat/m\(i)").setValue("text \(i)") } }
        let last = first.reference(withPath: "chat").queryOrderedByKey().queryLimited(toLast: 2)
        let synced = R()
        last.observe(.value) { s in synced.add(DatabaseTests.json(s.value)) }
        #expect(await synced.wait { $0 == #"{"m4":"text 4","m5":"text 5"}"# }, "\(synced.all)")
        try await DatabaseTests.bounded { try await first.reference(withPath: "chat/m6").setValue("text 6") }
        #expect(await synced.wait { $0 == #"{"m5":"text 5","m6":"text 6"}"# }, "\(synced.all)")
        first.shutdown()
        #expect(first.persistenceError == nil)

        // A new process, offline: the window it last saw, at once, as child events in order.
        let second = try Self.database(port, cache: cache)
        second.goOffline()
        let added = R()
        let query = second.reference(withPath: "chat").queryOrderedByKey().queryLimited(toLast: 2)
        query.observe(.childAdded) { s in added.add(s.key ?? "?") }
        #expect(await added.wait { $0 == "m6" }, "\(added.all)")
        #expect(added.all == ["m5", "m6"], "\(added.all)")
        let offline = try await DatabaseTests.bounded { try await query.getData() }
        #expect(DatabaseTests.json(offline.value) == #"{"m5":"text 5","m6":"text 6"}"#)
        // Another client writes meanwhile; online, the window moves on with no event repeated.
        let other = try Database(url: "http://127.0.0.1:\(port)?ns=persist", authToken: "owner")
        defer { other.shutdown() }
        try await DatabaseTests.bounded { try await other.reference(withPath: "chat/m7").setValue("text 7") }
        second.goOnline()
        #expect(await added.wait { $0 == "m7" }, "\(added.all)")
        #expect(added.all == ["m5", "m6", "m7"], "\(added.all)")
        second.shutdown()
    }

    @Test("two databases in one process cannot share a cache file: the second runs without persistence and says why")
    func oneFilePerDatabase() async throws {
        let dir = NSTemporaryDirectory() + "banyan-cache-\(UInt64.random(in: 0...UInt64.max))"
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let cache = URL(fileURLWithPath: dir)
        let a = try Self.database(1, cache: cache)
        let b = try Self.database(1, cache: cache)
        a.goOffline()
        b.goOffline()
        _ = a.reference()
        _ = b.reference()
        try await Task.sleep(nanoseconds: 300_000_000)
        // Whichever started first has the file; the other says why it runs without it.
        let errors = [a.persistenceError, b.persistenceError]
        #expect(errors.filter { $0 == nil }.count == 1, "\(errors)")
        #expect(errors.contains { $0?.contains("another database") == true }, "\(errors)")
        a.shutdown()
        b.shutdown()
    }
}
