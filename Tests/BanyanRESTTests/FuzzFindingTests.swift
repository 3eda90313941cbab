import BanyanREST
import BanyanStateMachine
import BanyanTree
import Testing

/// Inputs the fuzz targets found (Fuzz/, docs/testing.md "Fuzzing"), each reduced to what
/// broke, as ordinary tests: each failed before its fix.
@Suite struct FuzzFindingTests {
    /// Fuzz target `rest`: a PATCH whose location and key path together are deeper than 32 levels
    /// (or longer than 768 bytes) passed the checks before proposing, whose value read stopped at
    /// each path's own limits, and was then refused by the state machine in the log
    /// (`depth_exceeded`): the client was told its write was valid, and the log took an entry
    /// that could never apply. A null value (a delete) or a leaf never descends, so only the
    /// joined path shows it.
    @Test("rest: a PATCH key deeper than the limit once joined to its location is refused before the log, as the state machine refuses it")
    func patchDepthJoinedToLocation() throws {
        let location = "/" + (1...28).map { "l\($0)" }.joined(separator: "/")
        for value in ["null", "1", #""s""#] {
            let tooDeep = parse("PATCH", location + ".json", body: #"{"a/b/c/d/e":"# + value + "}")
            #expect(tooDeep.failureStatus == 400, "33 levels with \(value)")
            #expect(tooDeep.failure?.message.contains("32") == true)
        }
        // 32 levels in all is within the limit: accepted, and the log applies it.
        var machine = StateMachine()
        let atLimit = try request("PATCH", location + ".json", body: #"{"a/b/c/d":1,"x/y/z/w":null}"#)
        #expect(try applyWrite(atLimit, to: &machine).outcome == .ok)
        // The same for the 768-byte limit on the key path.
        let long = "/" + String(repeating: "p", count: 700)
        #expect(parse("PATCH", long + ".json", body: #"{""# + String(repeating: "q", count: 70) + #"":null}"#).failureStatus == 400)
        #expect(try applyWrite(try request("PATCH", long + ".json", body: #"{""# + String(repeating: "q", count: 60) + #"":null}"#), to: &machine, seq: 2).outcome == .ok)
    }

    /// Fuzz target `rest`: a priority write whose value is no priority (an object, an array, a
    /// boolean) passed the checks before proposing (they read it as data) and was refused in the
    /// log (`invalid_priority`); the same for a `.priority` key in a PATCH.
    @Test("rest: a value that is no priority, written at .priority, is refused before the log")
    func invalidPriorityValue() throws {
        for body in [#"{"x":1}"#, "[1]", "true"] {
            #expect(parse("PUT", "/a/.priority.json", body: body).failureStatus == 400, "PUT \(body)")
            #expect(parse("PATCH", "/a.json", body: #"{"b/.priority":"# + body + "}").failureStatus == 400, "PATCH \(body)")
        }
        var machine = StateMachine()
        #expect(try applyWrite(try request("PUT", "/a.json", body: "1"), to: &machine).outcome == .ok)
        for (i, body) in ["2", #""p""#, "null", #"{".sv":"timestamp"}"#].enumerated() {
            #expect(try applyWrite(try request("PUT", "/a/.priority.json", body: body), to: &machine, seq: UInt64(2 + i)).outcome == .ok, "\(body)")
        }
        #expect(try applyWrite(try request("PATCH", "/.json", body: #"{"a/.priority":3}"#), to: &machine, seq: 9).outcome == .ok)
    }

    /// Fuzz target `rest`: a PUT to the priority of a 32-level path was accepted (the path itself
    /// is within the limit) while the log reads `.priority` as one level more, as the realtime
    /// protocol does, and refused it.
    @Test("rest: the priority of a 32-level path is refused before the log, as the log and the realtime protocol refuse it")
    func priorityBeyondDepth() throws {
        let path = "/" + (1...32).map { "l\($0)" }.joined(separator: "/")
        #expect(parse("PUT", path + "/.priority.json", body: "1").failureStatus == 400)
        #expect((try? request("GET", path + "/.priority.json")) != nil)  // reading it is harmless
        let shorter = "/" + (1...31).map { "l\($0)" }.joined(separator: "/")
        var machine = StateMachine()
        #expect(try applyWrite(try request("PUT", shorter + ".json", body: "1"), to: &machine).outcome == .ok)
        #expect(try applyWrite(try request("PUT", shorter + "/.priority.json", body: "1"), to: &machine, seq: 2).outcome == .ok)
    }

    /// Fuzz target `rest` (an hour-long run, 2026-11-30): a conditional PUT (`if-match`) to a
    /// `.priority` location passed the checks and became a compare-and-set whose location names
    /// `.priority` as a key, which the log refused (`invalid_path`): the client was told its write
    /// was valid. A realtime transaction at a priority is refused before the log; REST now too.
    @Test("rest: if-match at a .priority location is refused before the log, as a realtime transaction at a priority is")
    func conditionalPriorityWrite() throws {
        var machine = StateMachine()
        #expect(try applyWrite(try request("PUT", "/a.json", body: "1"), to: &machine).outcome == .ok)
        let hash = machine.tree("default").child(at: try Path(parsing: "/a")).hashString
        for etag in [hash, "null_etag", "aG"] {
            let refused = parse("PUT", "/a/.priority.json", body: "2", headers: [("if-match", "\"\(etag)\"")])
            #expect(refused.failureStatus == 400, "\(etag)")
            #expect(refused.failure?.message.contains(".priority") == true)
        }
        // Conditional writes of the value itself go on, and a priority is set with its value.
        #expect(try applyWrite(try request("PUT", "/a.json", body: #"{".value":2,".priority":5}"#, headers: [("if-match", "\"\(hash)\"")]), to: &machine, seq: 2).outcome == .ok)
    }
}
