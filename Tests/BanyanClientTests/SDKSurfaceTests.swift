@_spi(Testing) import BanyanClient
import BanyanServer
import Dispatch
import Foundation
import Testing

/// Parts of the SDK's surface a review found untested against a real node: the
/// `callbackQueue` property, the end of an async sequence, and a refused listen reaching a
/// public cancel block.
@Suite(.serialized) struct SDKSurfaceTests {
    typealias R = DatabaseTests.Recorder

    @Test("callbacks run on the queue set with the callbackQueue property, in the order the events happened")
    func callbackQueueProperty() async throws {
        try await DatabaseTests.withNode { port in
            let db = try Database(url: "http://127.0.0.1:\(port)?ns=surface", authToken: "owner")
            defer { db.shutdown() }
            let queue = DispatchQueue(label: "app.callbacks")
            nonisolated(unsafe) let key = DispatchSpecificKey<Int>()
            queue.setSpecific(key: key, value: 7)
            db.callbackQueue = queue
            let seen = R()
            let list = db.reference(withPath: "list")
            list.observe(.childAdded) { s in seen.add("\(s.key ?? "") on \(DispatchQueue.getSpecific(key: key) ?? 0)") }
            for i in 1...5 { list.child("k\(i)").setValue(i, withCompletionBlock: nil) }
            #expect(await seen.wait { _ in seen.all.count == 5 }, "\(seen.all)")
            #expect(seen.all == (1...5).map { "k\($0) on 7" })
        }
    }

    @Test("ending an async sequence's iteration removes its observer")
    func endingASequenceRemovesItsObserver() async throws {
        try await DatabaseTests.withNode { port in
            let db = try Database(url: "http://127.0.0.1:\(port)?ns=surface", authToken: "owner")
            defer { db.shutdown() }
            let ref = db.reference(withPath: "s")
            try await DatabaseTests.bounded { try await ref.setValue(1) }
            let before = db._observerCount
            let first: Int? = try await DatabaseTests.bounded {
                var during = -1
                for try await snapshot in ref.snapshots(of: .value) {
                    during = db._observerCount
                    #expect(during == before + 1)
                    return snapshot.value as? Int
                }
                return nil
            }
            #expect(first == 1)
            var now = db._observerCount
            for _ in 0..<100 where now != before {
                try await Task.sleep(nanoseconds: 20_000_000)
                now = db._observerCount
            }
            #expect(now == before, "the sequence's observer stayed registered")
        }
    }

    @Test("a listen the rules refuse calls the observer's cancel block with permission_denied, and no value")
    func refusedListenReachesTheCancelBlock() async throws {
        try await DatabaseTests.withNode { port in
            try await AuthTests.setRules(port, ns: "denied", #"{"rules":{".read":false,".write":false}}"#)
            let db = try Database(url: "http://127.0.0.1:\(port)?ns=denied")
            defer { db.shutdown() }
            let seen = R()
            db.reference(withPath: "secret").observe(
                .value, with: { _ in seen.add("value") }, withCancel: { e in seen.add("cancel \((e as? DatabaseError)?.code ?? "\(e)")") })
            #expect(await seen.wait { $0.hasPrefix("cancel") }, "\(seen.all)")
            #expect(seen.all == ["cancel permission_denied"])
        }
    }

    @Test("Database.database(url:) hands out one instance per URL (and node list); a bad URL throws every time and is not kept")
    func sharedInstancePerURL() async throws {
        try await DatabaseTests.withNode { port in
            let url = "http://127.0.0.1:\(port)?ns=shared"
            let a = try Database.database(url: url)
            let b = try Database.database(url: url)
            #expect(a === b)
            let other = try Database.database(url: "http://127.0.0.1:\(port)?ns=shared2")
            #expect(other !== a)
            let withNodes = try Database.database(url: url, nodes: ["127.0.0.1:1"])
            defer {
                for d in [a, other, withNodes] { d.shutdown() }
            }
            #expect(withNodes !== a)
            #expect(try Database.database(url: url, nodes: ["127.0.0.1:1"]) === withNodes)
            #expect(throws: DatabaseError.self) { try Database.database(url: "ftp://nowhere") }
            #expect(throws: DatabaseError.self) { try Database.database(url: "ftp://nowhere") }
            // One instance, one state: a value written through one handle is read through the
            // other without a second connection.
            try await DatabaseTests.bounded { try await a.reference(withPath: "x").setValue("one") }
            let read = try await DatabaseTests.bounded { try await b.reference(withPath: "x").getData() }
            #expect(read.value as? String == "one")
            #expect(b.persistenceError == nil)
        }
    }

    @Test("persistenceCacheSizeBytes: clamped to 1 MiB...100 MiB, fixed at first use, and bounds the cache file (a default-size cache keeps what a 1 MiB one drops)")
    func cacheSizeBoundsTheFile() async throws {
        let (node, port, dir) = try DatabaseTests.startNode()
        defer {
            node.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        let value = String(repeating: "v", count: 64 << 10)
        // Thirty 64 KiB locations, each written, read once through a listen (so synced into the
        // cache) and then no longer observed. Returns the cache file's size.
        func run(_ name: String, size: UInt?) async throws -> Int {
            let cache = URL(fileURLWithPath: dir).appendingPathComponent(name)
            let db = try Database(url: "http://127.0.0.1:\(port)?ns=\(name)", authToken: "owner")
            db.isPersistenceEnabled = true
            db.persistenceDirectory = cache
            if let size {
                db.persistenceCacheSizeBytes = 0
                #expect(db.persistenceCacheSizeBytes == 1 << 20)
                db.persistenceCacheSizeBytes = 1 << 40
                #expect(db.persistenceCacheSizeBytes == 100 << 20)
                db.persistenceCacheSizeBytes = size
            }
            let chosen = db.persistenceCacheSizeBytes
            for i in 0..<30 {
                let ref = db.reference(withPath: "big/k\(i)")
                try await DatabaseTests.bounded { try await ref.setValue(value) }
                let seen = R()
                ref.observeSingleEvent(of: .value) { s in seen.add("\((s.value as? String)?.count ?? 0)") }
                #expect(await seen.wait { _ in !seen.all.isEmpty })
                #expect(seen.all == ["\(64 << 10)"])
            }
            // After the first use the size is fixed.
            db.persistenceCacheSizeBytes = 5 << 20
            #expect(db.persistenceCacheSizeBytes == chosen)
            #expect(db.persistenceError == nil)
            db.shutdown()
            let file = cache.appendingPathComponent("127.0.0.1_\(port)_\(name).bnycache").path
            let attributes = try FileManager.default.attributesOfItem(atPath: file)
            return (attributes[.size] as? Int) ?? -1
        }
        let small = try await run("cachesmall", size: 1 << 20)
        let large = try await run("cachelarge", size: nil)
        // 30 × 64 KiB = 1.9 MiB of synced data: the default 10 MiB cache keeps it all; a 1 MiB
        // cache compacts to half its budget whenever the file outgrows it.
        #expect(large > 30 * (64 << 10), "default cache: \(large) bytes")
        #expect(small > 0 && small <= (1 << 20) + (256 << 10), "1 MiB cache: \(small) bytes")
    }
}
