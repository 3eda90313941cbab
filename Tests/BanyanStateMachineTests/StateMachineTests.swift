import BanyanBasics
@testable import BanyanStateMachine
import BanyanTree
import Testing

@Suite struct StateMachineTests {
    func envelope(_ seq: UInt64, session: UInt64 = 1, at time: Int64 = 1_700_000_000_000, _ command: Command) -> [UInt8] {
        CommandEnvelope(session: session, seq: seq, timestamp: time, command: command).encoded()
    }

    func json(_ text: String) -> [UInt8] { Array(text.utf8) }

    func value(_ m: StateMachine, _ path: String) throws -> String {
        JSONWriter.string(m.tree("").child(at: try Path(parsing: path)))
    }

    @Test("every command kind round-trips through its log encoding, and every truncation is refused")
    func encoding() {
        let commands: [Command] = [
            .set(path: "/a/b", json: json(#"{"x":1}"#)),
            .set(path: "/a/.priority", json: json("5")),
            .update(path: "/a", entries: [.init(path: "b/c", json: json("1")), .init(path: "d", json: json("null"))]),
            .compareAndSet(path: "/c", expectedHash: "abc=", json: json(#""v""#)),
            .onDisconnectSet(path: "/p/online", json: json("false"), secret: 0xFEED),
            .onDisconnectUpdate(path: "/p", entries: [.init(path: "seen", json: json(#"{".sv":"timestamp"}"#))], secret: 1),
            .onDisconnectCancel(path: "/p", secret: .max),
            .connectionEnded(connection: 42, secret: 0xFEED),
        ]
        for (i, c) in (commands + commands).enumerated() {
            // The second round is of an ordered session (version 5).
            let e = CommandEnvelope(
                namespace: i == 0 ? "" : "ns-é", session: 7, seq: UInt64(i + 1), timestamp: -5, ordered: i >= commands.count, command: c)
            let bytes = e.encoded()
            #expect(CommandEnvelope(decoding: bytes) == e)
            #expect(e.byteCount == bytes.count, "the reserved size is the encoded size")
            for cut in 0..<bytes.count {
                #expect(CommandEnvelope(decoding: Array(bytes[0..<cut])) == nil, "prefix \(cut) of command \(i)")
            }
            #expect(CommandEnvelope(decoding: bytes + [0]) == nil)
        }
    }

    @Test("command payloads keep their bytes (they are in logs on disk): golden layout, version 2, restamping, named errors")
    func goldenBytes() throws {
        func le(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: v >> UInt64(8 * $0)) } }
        func str(_ s: String) -> [UInt8] { le(UInt64(s.utf8.count)) + Array(s.utf8) }
        let e = CommandEnvelope(
            namespace: "ns", session: 0x0102, seq: 3, timestamp: -2, settledBelow: 2,
            command: .update(path: "/a", entries: [.init(path: "b", json: json("1"))]))
        let golden: [UInt8] = [3, 2] + le(0x0102) + le(3) + le(UInt64(bitPattern: -2)) + le(2) + str("ns") + str("/a") + le(1) + str("b") + str("1")
        #expect(e.encoded() == golden)
        // A version-2 payload (no settledBelow) still decodes.
        let v2: [UInt8] = [2, 1] + le(9) + le(4) + le(5) + str("") + str("/x") + str("true")
        #expect(CommandEnvelope(decoding: v2) == CommandEnvelope(session: 9, seq: 4, timestamp: 5, command: .set(path: "/x", json: json("true"))))
        // The leader's stamp lands on the timestamp's bytes only.
        let restamped = try #require(CommandEnvelope.restamped(golden, timestamp: 0x0A0B))
        #expect(Array(restamped[18..<26]) == le(0x0A0B))
        #expect(Array(restamped[0..<18]) == Array(golden[0..<18]) && Array(restamped[26...]) == Array(golden[26...]))
        // Damage names the field; a hostile item count is refused before anything is allocated.
        #expect(throws: ByteCodecError.badValue(field: "command version")) { try CommandEnvelope.decode([10] + golden.dropFirst()) }
        // Version 5: version 4's layout, the kind's high bit saying the session is ordered; an
        // ordered command is always written so, an unordered one never.
        let ordered = CommandEnvelope(
            namespace: "ns", session: 0x0102, seq: 3, timestamp: -2, settledBelow: 2, ordered: true,
            command: .update(path: "/a", entries: [.init(path: "b", json: json("1"))]))
        #expect(ordered.encoded() == [5, 0x82] + golden.dropFirst(2))
        #expect(CommandEnvelope(decoding: [5, 0x82] + golden.dropFirst(2)) == ordered)
        #expect(throws: ByteCodecError.badValue(field: "command kind")) { try CommandEnvelope.decode([5, 2] + golden.dropFirst(2)) }
        #expect(throws: ByteCodecError.badValue(field: "command kind")) { try CommandEnvelope.decode([4, 0x82] + golden.dropFirst(2)) }
        // A retry raises the watermark in place (never lowers it); a version-2 payload has none.
        let raised = CommandEnvelope.resettled(golden, settledBelow: 3)
        #expect(CommandEnvelope(decoding: raised)?.settledBelow == 3)
        #expect(Array(raised[0..<26]) == Array(golden[0..<26]) && Array(raised[34...]) == Array(golden[34...]))
        #expect(CommandEnvelope.resettled(golden, settledBelow: 1) == golden)
        #expect(CommandEnvelope.resettled(v2, settledBelow: 9) == v2)
        #expect(throws: ByteCodecError.badValue(field: "command kind")) { try CommandEnvelope.decode([3, 9] + golden.dropFirst(2)) }
        let countAt = 2 + 32 + 10 + 10
        let hostile = Array(golden[0..<countAt]) + le(.max) + Array(golden[(countAt + 8)...])
        #expect(throws: ByteCodecError.tooLarge(field: "update items", count: .max)) { try CommandEnvelope.decode(hostile) }
    }

    @Test("set, update and compare-and-set change the tree as Firebase does, and report the written paths")
    func writes() throws {
        var m = StateMachine()
        let a = m.apply(envelope(1, .set(path: "/users/ada", json: json(#"{"name":"Ada","age":36}"#))), index: 1)
        #expect(a?.outcome == .ok)
        #expect(a?.written == [try Path(parsing: "/users/ada")])
        let b = m.apply(envelope(2, .update(path: "/users", entries: [.init(path: "ada/age", json: json("37")), .init(path: "bob", json: json(#""B""#))])), index: 2)
        #expect(b?.outcome == .ok)
        #expect(b?.written == [try Path(parsing: "/users/ada/age"), try Path(parsing: "/users/bob")])
        #expect(try value(m, "/users") == #"{"ada":{"age":37,"name":"Ada"},"bob":"B"}"#)
        // Compare-and-set: matches the current hash, then fails with the current value.
        let hash = m.tree("").child(at: try Path(parsing: "/users/bob")).hashString
        #expect(m.apply(envelope(3, .compareAndSet(path: "/users/bob", expectedHash: hash, json: json(#""C""#))), index: 3)?.outcome == .ok)
        let stale = m.apply(envelope(4, .compareAndSet(path: "/users/bob", expectedHash: hash, json: json(#""D""#))), index: 4)
        #expect(stale?.outcome == .datastale(current: try Tree(json: #""C""#)))
        #expect(try value(m, "/users/bob") == #""C""#)
        // Setting null removes.
        #expect(m.apply(envelope(5, .set(path: "/users/bob", json: json("null"))), index: 5)?.outcome == .ok)
        #expect(try value(m, "/users") == #"{"ada":{"age":37,"name":"Ada"}}"#)
        #expect(m.appliedIndex == 5)
    }

    @Test("server values resolve from the leader's timestamp and the tree the entry applies to, identically on every replica")
    func serverValues() throws {
        var r1 = StateMachine()
        var r2 = StateMachine()
        let entries = [
            envelope(1, at: 1_234, .set(path: "/t", json: json(#"{".sv":"timestamp"}"#))),
            envelope(2, at: 9_999, .set(path: "/n", json: json("10"))),
            envelope(3, at: 9_999, .update(path: "/", entries: [.init(path: "n", json: json(#"{".sv":{"increment":5}}"#))])),
            envelope(4, at: 9_999, .set(path: "/m", json: json(#"{".sv":{"increment":2}}"#))),
        ]
        for (i, e) in entries.enumerated() {
            _ = r1.apply(e, index: UInt64(i + 1))
            _ = r2.apply(e, index: UInt64(i + 1))
        }
        #expect(try value(r1, "/t") == "1234")
        #expect(try value(r1, "/n") == "15")
        #expect(try value(r1, "/m") == "2")
        #expect(r1.tree("") == r2.tree(""))
        #expect(r1.image() == r2.image())
    }

    @Test("an invalid update is rejected whole and leaves the tree unchanged")
    func atomicUpdate() throws {
        var m = StateMachine()
        _ = m.apply(envelope(1, .set(path: "/a", json: json(#"{"x":1}"#))), index: 1)
        let before = m.tree("")
        let overlapping = m.apply(envelope(2, .update(path: "/a", entries: [.init(path: "x", json: json("2")), .init(path: "x/y", json: json("3"))])), index: 2)
        guard case .rejected(let error)? = overlapping?.outcome else {
            Issue.record("expected a rejection, got \(String(describing: overlapping?.outcome))")
            return
        }
        #expect(error.code == .overlappingPaths)
        let badJSON = m.apply(envelope(3, .update(path: "/a", entries: [.init(path: "x", json: json("2")), .init(path: "z", json: json("{"))])), index: 3)
        if case .rejected? = badJSON?.outcome {} else { Issue.record("expected a rejection for bad JSON") }
        let priorityOnEmpty = m.apply(envelope(4, .set(path: "/nothing/.priority", json: json("1"))), index: 4)
        if case .rejected? = priorityOnEmpty?.outcome {} else { Issue.record("expected a rejection for a priority on an empty location") }
        #expect(m.tree("") == before)
        #expect(m.appliedIndex == 4)
        #expect(m.apply([1, 2, 3], index: 5)?.outcome == .malformed)
        #expect(m.tree("") == before)
    }

    @Test("an ordered session's commands apply only in sequence order: an early one is refused as out of order and changes nothing but the watermark")
    func orderedSessions() throws {
        func ordered(_ seq: UInt64, settled: UInt64 = 0, _ command: Command, session: UInt64 = 5) -> [UInt8] {
            CommandEnvelope(session: session, seq: seq, timestamp: 1, settledBelow: settled, ordered: true, command: command).encoded()
        }
        var m = StateMachine()
        // Seq 2 commits before seq 1 (seq 1 was lost in a leader change and retried).
        #expect(m.apply(ordered(2, settled: 1, .set(path: "/v", json: json("2"))), index: 1)?.outcome == .outOfOrder)
        #expect(try value(m, "/v") == "null")
        #expect(m.sessions[5]?.contains(2) == false, "an early command is not recorded: its retry applies")
        #expect(m.apply(ordered(1, settled: 1, .set(path: "/v", json: json("1"))), index: 2)?.outcome == .ok)
        #expect(m.apply(ordered(2, settled: 1, .set(path: "/v", json: json("2"))), index: 3)?.outcome == .ok)
        #expect(try value(m, "/v") == "2", "applied in the order written")
        #expect(m.apply(ordered(2, settled: 1, .set(path: "/v", json: json("2"))), index: 4)?.outcome == .duplicate)
        // Seq 3 was given up by its issuer (timed out): seq 4's watermark settles it, and a
        // stale copy of 3 is a duplicate afterwards.
        #expect(m.apply(ordered(4, settled: 3, .set(path: "/v", json: json("4"))), index: 5)?.outcome == .outOfOrder)
        #expect(m.apply(ordered(4, settled: 4, .set(path: "/v", json: json("4"))), index: 6)?.outcome == .ok)
        #expect(m.apply(ordered(3, settled: 3, .set(path: "/v", json: json("3"))), index: 7)?.outcome == .duplicate)
        #expect(try value(m, "/v") == "4")
        // A watermark past the command's own number (no issuer writes one) applies it once.
        #expect(m.apply(ordered(5, settled: 9, .set(path: "/v", json: json("5"))), index: 8)?.outcome == .ok)
        #expect(m.sessions[5] == SessionRecord(contiguous: 8))
        // An unordered session keeps applying whatever order commits.
        #expect(m.apply(envelope(2, session: 6, .set(path: "/u", json: json("2"))), index: 9)?.outcome == .ok)
        #expect(m.apply(envelope(1, session: 6, .set(path: "/u", json: json("1"))), index: 10)?.outcome == .ok)
        // A connection ended elsewhere (`ls`): its own later end still applies (doing nothing
        // more); its other commands are refused.
        #expect(m.apply(envelope(3, session: 6, .connectionEnded(connection: 5, secret: 0)), index: 11)?.outcome == .ok)
        #expect(m.apply(ordered(9, settled: 9, .connectionEnded(connection: 5, secret: 0)), index: 12)?.outcome == .ok)
        guard case .refused? = m.apply(ordered(10, settled: 10, .set(path: "/v", json: json("7"))), index: 13)?.outcome else {
            Issue.record("a write after the end was not refused")
            return
        }
        #expect(try value(m, "/v") == "5")
    }

    @Test("commands apply exactly once: duplicates by session and sequence, and entries at or below the applied index, change nothing")
    func exactlyOnce() throws {
        var m = StateMachine()
        _ = m.apply(envelope(1, .set(path: "/c", json: json(#"{".sv":{"increment":1}}"#))), index: 1)
        // The same command again (a retry, or a proposal forwarded twice) at a later index.
        #expect(m.apply(envelope(1, .set(path: "/c", json: json(#"{".sv":{"increment":1}}"#))), index: 2)?.outcome == .duplicate)
        #expect(try value(m, "/c") == "1")
        // Another session's command with the same sequence number is not a duplicate.
        #expect(m.apply(envelope(1, session: 2, .set(path: "/c", json: json(#"{".sv":{"increment":1}}"#))), index: 3)?.outcome == .ok)
        #expect(try value(m, "/c") == "2")
        // Replaying the log over a snapshot: indexes already applied are ignored.
        #expect(m.apply(envelope(9, .set(path: "/c", json: json("100"))), index: 3) == nil)
        #expect(try value(m, "/c") == "2")
    }

    @Test("the image round-trips tree, applied index and sessions; replay after restore applies nothing twice; damage is a typed error")
    func image() throws {
        var m = StateMachine()
        for i in 1...20 {
            _ = m.apply(envelope(UInt64(i), session: UInt64(i % 3), .set(path: "/k\(i % 7)", json: json(#"{"v":\#(i),"p":{".sv":"timestamp"}}"#))), index: UInt64(i))
        }
        let bytes = m.image()
        var restored = try StateMachine(image: bytes)
        #expect(restored.tree("") == m.tree(""))
        #expect(restored.appliedIndex == 20)
        #expect(restored.sessions == m.sessions)
        #expect(restored.apply(envelope(20, session: 2, .set(path: "/x", json: json("1"))), index: 21)?.outcome == .duplicate)
        for cut in stride(from: 0, to: bytes.count, by: 7) {
            #expect(throws: StateMachine.ImageError.self) { try StateMachine(image: Array(bytes[0..<cut])) }
        }
        var flipped = bytes
        flipped[0] ^= 0xFF
        #expect(throws: StateMachine.ImageError.badHeader) { try StateMachine(image: flipped) }
    }

    @Test("a streamed load equals the in-memory one for any split of the input; trailing bytes and cuts are refused; source errors pass through")
    func streamedImage() throws {
        var m = StateMachine()
        for i in 1...40 {
            _ = m.apply(envelope(UInt64(i), session: UInt64(i % 4), .set(path: "/k\(i % 9)/n\(i)", json: json(#"{"v":\#(i),"s":"\#(String(repeating: "x", count: i * 3))"}"#))), index: UInt64(i))
        }
        _ = m.apply(CommandEnvelope(namespace: "other", session: 9, seq: 1, timestamp: 1, command: .set(path: "/a", json: json("[1,2,3]"))).encoded(), index: 41)
        var bytes: [UInt8] = []
        try m.writeImage(chunkBytes: 64) { bytes.append(contentsOf: $0) }
        #expect(!m.tree("other").isEmpty)
        // Feed the image in pieces of varying size, including one byte at a time.
        func load(_ input: [UInt8], pieces: [Int], maxLength: Int = .max) throws -> StateMachine {
            var offset = 0
            var turn = 0
            return try StateMachine(maxLength: maxLength) { buffer in
                let n = Swift.min(buffer.count, input.count - offset, pieces[turn % pieces.count])
                turn += 1
                for k in 0..<n { buffer[k] = input[offset + k] }
                offset += n
                return n
            }
        }
        for pieces in [[1], [3, 1, 7], [8], [100_000], [17, 4096]] {
            let restored = try load(bytes, pieces: pieces)
            #expect(restored.tree("") == m.tree(""))
            #expect(restored.tree("other") == m.tree("other"))
            #expect(restored.appliedIndex == m.appliedIndex)
            #expect(restored.sessions == m.sessions)
        }
        for cut in stride(from: 0, to: bytes.count, by: 5) {
            #expect(throws: StateMachine.ImageError.self) { try load(Array(bytes[0..<cut]), pieces: [11]) }
        }
        #expect(throws: StateMachine.ImageError.truncated) { try load(bytes + [0], pieces: [13]) }
        // A length beyond maxLength is refused before it is read.
        #expect(throws: StateMachine.ImageError.self) { try load(bytes, pieces: [64], maxLength: 40) }
        struct SourceFailed: Error {}
        var calls = 0
        #expect(throws: SourceFailed.self) {
            try StateMachine { buffer in
                calls += 1
                if calls > 3 { throw SourceFailed() }
                let n = Swift.min(buffer.count, 9)
                for k in 0..<n { buffer[k] = bytes[(calls - 1) * 9 + k] }
                return n
            }
        }
    }
}

/// Applying with a read-ahead (`PreparedCommand`) gives exactly what applying the payload gives.
@Suite struct PreparedApplyTests {
    @Test("applying read-aheads gives the same outcomes and state as applying payloads, for seeded command mixes")
    func sameAsPayloads() throws {
        var random = SeededRandom(seed: 5)
        let values = [
            #"{"a":1,"b":{"c":[1,2,{".sv":"timestamp"}]}}"#, #"{".sv":{"increment":3}}"#, #"{"n":{".sv":{"increment":1.5}},"m":"x"}"#,
            #"{"bad":"#, #"{".value":{".sv":{"increment":1}},".priority":2}"#, "null", #"{"x":{".sv":{"increment":"no"}}}"#, "7",
        ]
        let paths = ["/", "/p", "/p/n", "/q/.priority", "/p/a/b", "/bad$key"]
        for round in 0..<40 {
            var plain = StateMachine()
            var ahead = StateMachine()
            var stamp: Int64 = 1_000
            for index in 1...UInt64(60) {
                // The leader's stamps go back now and then (a new leader with a slower clock).
                stamp += random.below(5) == 0 ? -3 : 7
                let path = paths[random.below(paths.count)]
                let command: Command
                switch random.below(4) {
                case 0:
                    let items = (0..<(1 + random.below(3))).map { _ in
                        Command.UpdateItem(path: ["n", "a/b", "m", "z", "n/.priority"][random.below(5)], json: Array(values[random.below(values.count)].utf8))
                    }
                    command = .update(path: path, entries: items)
                case 1:
                    let current = plain.tree("app").child(at: (try? Path(parsing: path)) ?? .root)
                    let hash = random.below(2) == 0 ? current.hashString : "wrong"
                    command = .compareAndSet(path: path, expectedHash: hash, json: Array(values[random.below(values.count)].utf8))
                default:
                    command = .set(path: path, json: Array(values[random.below(values.count)].utf8))
                }
                let payload = CommandEnvelope(namespace: "app", session: 9, seq: index, timestamp: stamp, command: command).encoded()
                let a = plain.apply(payload, index: index)
                let b = ahead.apply(payload, index: index, prepared: PreparedCommand(payload: payload))
                #expect("\(String(describing: a))" == "\(String(describing: b))", "round \(round) index \(index)")
            }
            #expect(plain.image() == ahead.image(), "round \(round)")
        }
    }
}

/// Free-space alarms in the state machine: decided at their log position on every node.
@Suite struct SpaceAlarmMachineTests {
    static func envelope(_ seq: UInt64, _ command: Command, auth: ClientAuth? = nil) -> [UInt8] {
        CommandEnvelope(namespace: "app", session: 3, seq: seq, timestamp: 1_000 + Int64(seq), command: command, auth: auth).encoded()
    }

    @Test("while an alarm is raised only deletes apply; the alarm survives an image; clearing it lets writes in; clients cannot raise one")
    func alarms() throws {
        var m = StateMachine()
        var seq: UInt64 = 0
        func apply(_ command: Command, auth: ClientAuth? = nil) -> StateMachine.Outcome? {
            seq += 1
            return m.apply(Self.envelope(seq, command, auth: auth), index: seq)?.outcome
        }
        #expect(apply(.set(path: "/a", json: Array("1".utf8))) == .ok)
        #expect(apply(.set(path: "/b", json: Array(#"{"c":1}"#.utf8))) == .ok)
        #expect(apply(.spaceAlarm(node: 7, raised: true), auth: .signedOut) == .refused("free-space alarms are raised by nodes, not clients"))
        #expect(m.spaceAlarms.isEmpty)
        #expect(apply(.spaceAlarm(node: 2, raised: true)) == .ok)
        #expect(m.spaceAlarms == [2])
        let noSpace = StateMachine.Outcome.noSpace(nodes: [2])
        #expect(apply(.set(path: "/x", json: Array("1".utf8))) == noSpace)
        #expect(apply(.update(path: "/", entries: [.init(path: "a", json: Array("null".utf8)), .init(path: "y", json: Array("2".utf8))])) == noSpace)
        #expect(apply(.compareAndSet(path: "/a", expectedHash: "h", json: Array("5".utf8))) == noSpace)
        #expect(apply(.onDisconnectSet(path: "/p", json: Array("1".utf8), secret: 1, holder: 0)) == noSpace)
        // A node that applied the alarm refuses the same writes before proposing them, and
        // proposes deletes and other commands as usual.
        #expect(m.refusedBeforeProposal(namespace: "app", command: .set(path: "/x", json: Array("1".utf8)))?.outcome == noSpace)
        #expect(m.refusedBeforeProposal(namespace: "app", command: .onDisconnectSet(path: "/p", json: Array("1".utf8), secret: 1, holder: 0))?.outcome == noSpace)
        #expect(m.refusedBeforeProposal(namespace: "app", command: .set(path: "/a", json: Array("null".utf8))) == nil)
        #expect(m.refusedBeforeProposal(namespace: "app", command: .spaceAlarm(node: 2, raised: false)) == nil)
        // Deletes go on, whitespace or not.
        #expect(apply(.set(path: "/a", json: Array(" null\n".utf8))) == .ok)
        #expect(apply(.update(path: "/b", entries: [.init(path: "c", json: Array("null".utf8))])) == .ok)
        #expect(m.tree("app").isEmpty)
        // The alarm travels in images (snapshots).
        var copy = try StateMachine(image: m.image())
        #expect(copy.spaceAlarms == [2])
        #expect(copy.apply(Self.envelope(100, .set(path: "/z", json: Array("1".utf8))), index: seq + 1)?.outcome == noSpace)
        #expect(apply(.spaceAlarm(node: 2, raised: false)) == .ok)
        #expect(m.spaceAlarms.isEmpty && m.tree(StateMachine.alarmsNamespace).isEmpty)
        #expect(apply(.set(path: "/x", json: Array("1".utf8))) == .ok)
        #expect(m.refusedBeforeProposal(namespace: "app", command: .set(path: "/x", json: Array("1".utf8))) == nil)
        // The command's bytes round-trip.
        let payload = Self.envelope(1, .spaceAlarm(node: 9, raised: true))
        #expect(CommandEnvelope(decoding: payload)?.command == .spaceAlarm(node: 9, raised: true))
    }
}
