@_spi(Testing) import BanyanClient
import BanyanServer
import BanyanTree
import Foundation
import Testing

/// Exactly-once writes (docs/swift-sdk.md): a connection dies after the node applied a write
/// and before its answer arrived; the SDK sends the write again on its next connection. With
/// write numbers the node answers the copy from the first one's outcome (an increment applies
/// once, a stale transaction is not decided again); without them, the copy applies again.
@Suite(.serialized) struct ExactlyOnceTests {
    typealias R = DatabaseTests.Recorder

    /// Increments `counter` once per round; each round's answer is lost with its connection.
    static func lostAnswers(port: Int, ns: String, numbers: Bool, rounds: Int) async throws -> (value: Int?, completions: [String]) {
        let db = try Database(url: "http://127.0.0.1:\(port)?ns=\(ns)", authToken: "owner")
        defer { db.shutdown() }
        db._setWriteNumbers(numbers)
        let connected = R()
        db.reference(withPath: ".info/connected").observe(.value) { s in connected.add("\(s.value as? Bool ?? false)") }
        #expect(await connected.wait { $0 == "true" })
        // One answered write first: the connection's own requests (its credential) are answered
        // before it, so the answer dropped below is the increment's. (Without this, a loaded
        // machine could drop the credential's answer instead, before the increment was sent: it
        // then went out once, and the run without numbers counted 5 of 6.)
        try await DatabaseTests.bounded { try await db.reference(withPath: "warm-up").setValue(true) }
        let done = R()
        for i in 0..<rounds {
            db._dropNextAnswerAndDisconnect()
            db.reference(withPath: "counter").setValue(ServerValue.increment(1)) { e, _ in done.add(e.map { "\($0)" } ?? "ok \(i)") }
            #expect(await done.wait(seconds: 60) { _ in done.all.count == i + 1 }, "round \(i): \(done.all)")
        }
        let read = try await DatabaseTests.bounded { try await db.reference(withPath: "counter").getData() }
        return (read.value as? Int, done.all)
    }

    @Test("increments whose answers were lost with their connections apply once each with write numbers, and twice without")
    func lostAnswerIncrements() async throws {
        let (node, port, dir) = try DatabaseTests.startNode()
        defer {
            node.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        let rounds = 3
        let exact = try await Self.lostAnswers(port: port, ns: "once", numbers: true, rounds: rounds)
        #expect(exact.completions == (0..<rounds).map { "ok \($0)" })
        #expect(exact.value == rounds, "each increment applied once: \(String(describing: exact.value))")
        // The same without numbers (what Firebase SDKs do: resend blindly): each applies twice.
        let blind = try await Self.lostAnswers(port: port, ns: "twice", numbers: false, rounds: rounds)
        #expect(blind.value == 2 * rounds, "without numbers the resends apply again: \(String(describing: blind.value))")
    }

    @Test("a transaction whose answer was lost completes once, committed, and is not run again")
    func lostAnswerTransaction() async throws {
        let (node, port, dir) = try DatabaseTests.startNode()
        defer {
            node.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        let db = try Database(url: "http://127.0.0.1:\(port)?ns=tx", authToken: "owner")
        defer { db.shutdown() }
        try await DatabaseTests.bounded { try await db.reference(withPath: "n").setValue(10) }
        let synced = R()
        db.reference(withPath: "n").observe(.value) { s in synced.add("\(s.value as? Int ?? -1)") }
        #expect(await synced.wait { $0 == "10" })
        let runs = R()
        db._dropNextAnswerAndDisconnect()
        let (committed, snapshot) = try await DatabaseTests.bounded {
            try await db.reference(withPath: "n").runTransactionBlock { data in
                runs.add("run on \(data.value as? Int ?? -1)")
                data.value = (data.value as? Int ?? 0) + 1
                return .success(withValue: data)
            }
        }
        #expect(committed && snapshot.value as? Int == 11)
        #expect(runs.all == ["run on 10"], "\(runs.all)")
        let read = try await DatabaseTests.bounded { try await db.reference(withPath: "n").getData() }
        #expect(read.value as? Int == 11)
    }
}

/// Push ids are dated by the server's clock as the client estimates it (its clock plus
/// `.info/serverTimeOffset`), as Firebase's SDKs date them.
@Suite(.serialized) struct PushIDClockTests {
    typealias R = DatabaseTests.Recorder

    @Test("a client whose clock is an hour slow makes push ids dated by the server's time once connected, so they sort after ids other clients made before them")
    func pushIDsUseTheServerOffset() async throws {
        try await DatabaseTests.withNode { port in
            let slow = try Database(url: "http://127.0.0.1:\(port)?ns=clock", authToken: "owner")
            let right = try Database(url: "http://127.0.0.1:\(port)?ns=clock", authToken: "owner")
            defer {
                slow.shutdown()
                right.shutdown()
            }
            slow._skewClock(byMillis: -3_600_000)
            let connected = R()
            slow.reference(withPath: ".info/connected").observe(.value) { s in connected.add("\(s.value as? Bool ?? false)") }
            #expect(await connected.wait { $0 == "true" })
            let offset = try await DatabaseTests.bounded { try await slow.reference(withPath: ".info/serverTimeOffset").getData() }
            let measured = try #require(offset.value as? Int)
            #expect(abs(measured - 3_600_000) < 60_000, "offset \(measured)")
            let earlier = right.reference(withPath: "list").childByAutoId()
            // The offset is measured against the last 50 ms tick: wait past that error.
            try await Task.sleep(nanoseconds: 150_000_000)
            let later = slow.reference(withPath: "list").childByAutoId()
            let wall = Int64((Date().timeIntervalSince1970 * 1000).rounded())
            let laterKey = try #require(later.key)
            let earlierKey = try #require(earlier.key)
            let dated = try #require(PushIDGenerator.timestamp(of: laterKey))
            #expect(abs(dated - wall) < 60_000, "the slow client's push id is dated \(wall - dated) ms before the wall clock")
            #expect(earlierKey < laterKey)
        }
    }
}
