@_spi(Testing) import BanyanClient
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
}
