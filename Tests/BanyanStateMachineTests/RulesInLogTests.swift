import BanyanBasics
import BanyanRules
@testable import BanyanStateMachine
import BanyanTree
import Testing

/// Security rules as replicated state (docs/rules.md, "Rules in the log"): set by a command,
/// judged at each write's position with the leader's timestamp, carried by images.
@Suite struct RulesInLogTests {
    static let rules = """
        {
          // Each user writes only their own record, which needs a name.
          "rules": {
            "users": {
              "$uid": {
                ".read": "auth != null && auth.uid == $uid",
                ".write": "auth != null && auth.uid == $uid",
                ".validate": "newData.hasChildren(['name'])"
              }
            },
            "stamps": { "$k": { ".write": true, ".validate": "newData.val() <= now" } }
          }
        }
        """

    static func user(_ uid: String) -> ClientAuth { .user(json: Array(#"{"uid":"\#(uid)","provider":"custom","token":{}}"#.utf8)) }

    var seq: UInt64 = 0
    var machine = StateMachine()

    mutating func apply(_ command: Command, auth: ClientAuth?, namespace: String = "app", at time: Int64 = 1_000) -> StateMachine.Applied? {
        seq += 1
        let payload = CommandEnvelope(namespace: namespace, session: 1, seq: seq, timestamp: time, command: command, auth: auth).encoded()
        return machine.apply(payload, index: seq)
    }

    func value(_ path: String, namespace: String = "app") throws -> String {
        JSONWriter.string(machine.tree(namespace).child(at: try Path(parsing: path)))
    }

    @Test("commands with auth and setRules round-trip through their version-6 encoding; every truncation is refused")
    func encoding() {
        let commands: [Command] = [.set(path: "/a", json: Array("1".utf8)), .setRules(text: Array(Self.rules.utf8)), .setRules(text: [])]
        for command in commands {
            for auth in [nil, ClientAuth.signedOut, Self.user("alice")] {
                for ordered in [false, true] {
                    let e = CommandEnvelope(namespace: "app", session: 3, seq: 9, timestamp: 5, ordered: ordered, command: command, auth: auth)
                    let bytes = e.encoded()
                    #expect(CommandEnvelope(decoding: bytes) == e)
                    #expect(e.byteCount == bytes.count)
                    for cut in stride(from: 0, to: bytes.count, by: 7) { #expect(CommandEnvelope(decoding: Array(bytes[0..<cut])) == nil) }
                }
            }
        }
        // A command without auth or rules keeps its old version, byte for byte.
        #expect(CommandEnvelope(session: 1, seq: 1, timestamp: 0, command: .set(path: "/a", json: [0x31])).encoded()[0] == 3)
        // An unknown auth kind is refused.
        var bytes = CommandEnvelope(session: 1, seq: 1, timestamp: 0, command: .set(path: "/a", json: [0x31]), auth: .signedOut).encoded()
        bytes[bytes.count - 1] = 7
        #expect(CommandEnvelope(decoding: bytes) == nil)
    }

    @Test("setRules is for administrators; a text that does not parse is refused and changes nothing")
    mutating func settingRules() throws {
        #expect(apply(.setRules(text: Array(Self.rules.utf8)), auth: Self.user("alice"))?.outcome == .permissionDenied(reason: "only administrators may set security rules"))
        #expect(machine.rules["app"] == nil)
        let bad = apply(.setRules(text: Array("{\"rules\": {\".read\": \"auth.\"}}".utf8)), auth: nil)
        guard case .refused(let why)? = bad?.outcome else { Issue.record("not refused: \(String(describing: bad))"); return }
        #expect(why.hasPrefix("1:"), "\(why)")
        #expect(machine.rules["app"] == nil)
        let set = apply(.setRules(text: Array(Self.rules.utf8)), auth: nil)
        #expect(set?.outcome == .ok && set?.rulesChanged == true)
        #expect(machine.rules["app"]?.text == Self.rules)
        #expect(machine.rules["other"] == nil)
        // Removing them.
        #expect(apply(.setRules(text: []), auth: nil)?.outcome == .ok)
        #expect(machine.rules["app"] == nil)
        #expect(machine.tree(StateMachine.rulesNamespace).isEmpty)
    }

    @Test("writes are judged by the rules in force at their position, for the client they name; administrators are not judged")
    mutating func judgedWrites() throws {
        let alice = Self.user("alice")
        // Before rules: nothing is judged.
        #expect(apply(.set(path: "/users/bob", json: Array(#"{"age":1}"#.utf8)), auth: .signedOut)?.outcome == .ok)
        _ = apply(.setRules(text: Array(Self.rules.utf8)), auth: nil)
        let denied = apply(.set(path: "/users/alice", json: Array(#"{"name":"A"}"#.utf8)), auth: .signedOut)
        guard case .permissionDenied? = denied?.outcome else { Issue.record("\(String(describing: denied))"); return }
        #expect(try value("/users/alice") == "null")
        #expect(apply(.set(path: "/users/alice", json: Array(#"{"name":"A"}"#.utf8)), auth: alice)?.outcome == .ok)
        #expect(try value("/users/alice") == #"{"name":"A"}"#)
        // Another user, a failing .validate, an update and a compare-and-set.
        if case .permissionDenied? = apply(.set(path: "/users/alice/name", json: Array(#""B""#.utf8)), auth: Self.user("bob"))?.outcome {} else { Issue.record("bob wrote alice's name") }
        if case .permissionDenied? = apply(.set(path: "/users/alice", json: Array(#"{"age":3}"#.utf8)), auth: alice)?.outcome {} else { Issue.record("validate ignored") }
        #expect(apply(.update(path: "/users/alice", entries: [.init(path: "age", json: Array("3".utf8))]), auth: alice)?.outcome == .ok)
        if case .permissionDenied? = apply(.update(path: "/users", entries: [.init(path: "alice/age", json: Array("4".utf8)), .init(path: "bob/age", json: Array("4".utf8))]), auth: alice)?.outcome {} else { Issue.record("an update touching bob passed") }
        #expect(try value("/users/alice/age") == "3")
        let hash = machine.tree("app").child(at: try Path(parsing: "/users/alice/age")).hashString
        if case .permissionDenied? = apply(.compareAndSet(path: "/users/alice/age", expectedHash: hash, json: Array("5".utf8)), auth: Self.user("eve"))?.outcome {} else { Issue.record("CAS by eve passed") }
        #expect(apply(.compareAndSet(path: "/users/alice/age", expectedHash: hash, json: Array("5".utf8)), auth: alice)?.outcome == .ok)
        // `now` is the entry's timestamp.
        #expect(apply(.set(path: "/stamps/a", json: Array("900".utf8)), auth: .signedOut, at: 1_000)?.outcome == .ok)
        if case .permissionDenied? = apply(.set(path: "/stamps/b", json: Array("5000".utf8)), auth: .signedOut, at: 2_000)?.outcome {} else { Issue.record("a future stamp passed") }
        // An administrator's command (no auth) is not judged; an unreadable auth is denied.
        #expect(apply(.set(path: "/anything", json: Array("1".utf8)), auth: nil)?.outcome == .ok)
        if case .permissionDenied? = apply(.set(path: "/users/alice/name", json: Array(#""C""#.utf8)), auth: .user(json: Array("not json".utf8)))?.outcome {} else { Issue.record("bad auth passed") }
        // onDisconnect writes are judged when they are registered.
        if case .permissionDenied? = apply(.onDisconnectSet(path: "/users/bob", json: Array(#"{"name":"x"}"#.utf8), secret: 1), auth: alice)?.outcome {} else { Issue.record("queued a write to bob") }
        #expect(apply(.onDisconnectSet(path: "/users/alice/name", json: Array(#""gone""#.utf8), secret: 1), auth: alice)?.outcome == .ok)
    }

    @Test("review fixes: stored rules that do not parse fail closed; an invalid write by a client without a grant is denied, not explained; judged PATCHes carry no node")
    mutating func failClosed() throws {
        let stored = Tree(sortedChildren: [(ChildKey(unchecked: "app"), Tree(.string("{ not rules"))), (ChildKey(unchecked: "b"), Tree(.string(Self.rules)))])
        var loaded = StateMachine(namespaces: [StateMachine.rulesNamespace: stored])
        #expect(loaded.rules["app"]?.text == Rules.denyAll.text && loaded.rules["b"]?.text == Self.rules)
        let payload = CommandEnvelope(namespace: "app", session: 1, seq: 1, timestamp: 1, command: .set(path: "/x", json: Array("1".utf8)), auth: .signedOut).encoded()
        if case .permissionDenied? = loaded.apply(payload, index: 1)?.outcome {} else { Issue.record("an unreadable rules text let a write through") }

        _ = apply(.setRules(text: Array(Self.rules.utf8)), auth: nil)
        // Overlapping update paths are invalid: bob, who may not write there, is only told no.
        let overlapping: Command = .update(path: "/users/alice", entries: [.init(path: "name", json: Array(#""A""#.utf8)), .init(path: "name/x", json: Array("1".utf8))])
        if case .permissionDenied? = apply(overlapping, auth: Self.user("bob"))?.outcome {} else { Issue.record("an invalid write explained to a client without a grant") }
        if case .rejected? = apply(overlapping, auth: Self.user("alice"))?.outcome {} else { Issue.record("the owner did not get the reason") }
        #expect(apply(.set(path: "/users/alice", json: Array(#"{"name":"A"}"#.utf8)), auth: Self.user("alice"))?.outcome == .ok)
        let patch = apply(.update(path: "/users/alice", entries: [.init(path: "age", json: Array("3".utf8))]), auth: Self.user("alice"))
        #expect(patch?.outcome == .ok && patch?.value == nil)
    }

    @Test("the rules travel in the image: a machine loaded from it judges the same way")
    mutating func image() throws {
        _ = apply(.setRules(text: Array(Self.rules.utf8)), auth: nil)
        let loaded = try StateMachine(image: machine.image())
        #expect(loaded.rules["app"]?.text == Self.rules)
        var copy = self
        copy.machine = loaded
        if case .permissionDenied? = copy.apply(.set(path: "/users/alice", json: Array(#"{"name":"A"}"#.utf8)), auth: .signedOut)?.outcome {} else {
            Issue.record("the loaded machine did not judge")
        }
        #expect(apply(.set(path: "/users/alice", json: Array(#"{"name":"A"}"#.utf8)), auth: Self.user("alice"))?.outcome == .ok)
    }
    /// The bench rules (docs/examples/bench-rules.json): no `.write` or `.validate` reads `data`
    /// or `root`, so sets are judged on the tree changed in place; with `|| data.val() == 'never'`
    /// added to each `.validate` (which changes no verdict) they are judged beside the old tree.
    static func benchRules(readingData: Bool) -> String {
        let extra = readingData ? " || data.val() == 'never'" : ""
        return """
            {"rules": {"bench": {"$client": {
              ".write": "auth != null && auth.uid == $client",
              "$key": {
                ".validate": "(newData.hasChildren(['c', 'i']) && newData.child('i').isNumber())\(extra)",
                "c": {".validate": "newData.isNumber()\(extra)"}, "i": {".validate": "newData.val() >= 0\(extra)"},
                "$other": {".validate": false}}}}}}
            """
    }

    @Test("a set judged on the tree changed in place has the outcome and leaves the tree of one judged beside the old tree; a denial restores it exactly")
    func inPlaceJudgement() throws {
        #expect(try !Rules.parse(Self.benchRules(readingData: false)).writesReadCurrentData)
        #expect(try Rules.parse(Self.benchRules(readingData: true)).writesReadCurrentData)
        #expect(try Rules.parse(#"{"rules": {".write": "root.child('x').exists()"}}"#).writesReadCurrentData)
        #expect(try !Rules.parse(#"{"rules": {".read": "data.exists()", ".write": "newData.parent().exists()"}}"#).writesReadCurrentData)
        let writes: [(String, String, String)] = [
            ("c1", "/bench/c1/k1", #"{"c": 1, "i": 1}"#),  // creates the parent: not in place
            ("c1", "/bench/c1/k2", #"{"c": 1, "i": 2}"#),  // in place
            ("c1", "/bench/c1/k1", #"{"c": 1, "i": 5}"#),  // replaces, in place
            ("c2", "/bench/c1/k3", #"{"c": 1, "i": 3}"#),  // another user's: denied
            ("c1", "/bench/c1/k4", #"{"c": 1, "i": -1}"#),  // invalid: denied, restored
            ("c1", "/bench/c1/k1", #"{"c": 1, "i": -1}"#),  // invalid over an existing record: denied, restored
            ("c1", "/bench/c1/k1", #"{"c": 1, "i": 1, "x": 0}"#),  // $other: denied
            ("c1", "/bench/c1/k2", "null"),  // a deletion: not in place
            ("c1", "/bench/c1/k5/i", "7"),  // under a record: in place, judged by the record's validation
        ]
        var outcomes: [[StateMachine.Outcome?]] = []
        var trees: [[Tree]] = []
        for readingData in [false, true] {
            var run = RulesInLogTests()
            #expect(run.apply(.setRules(text: Array(Self.benchRules(readingData: readingData).utf8)), auth: nil)?.outcome == .ok)
            #expect(run.apply(.set(path: "/bench/c1/k5", json: Array(#"{"c": 1, "i": 5}"#.utf8)), auth: nil)?.outcome == .ok)
            var o: [StateMachine.Outcome?] = []
            var t: [Tree] = []
            for (uid, path, json) in writes {
                let before = run.machine.tree("app")
                let applied = run.apply(.set(path: path, json: Array(json.utf8)), auth: Self.user(uid))
                o.append(applied?.outcome)
                t.append(run.machine.tree("app"))
                if applied?.outcome != .ok { #expect(run.machine.tree("app") == before, "\(path) \(json)") }
            }
            outcomes.append(o)
            trees.append(t)
        }
        #expect(outcomes[0] == outcomes[1])
        #expect(trees[0] == trees[1])
        #expect(outcomes[0].map { $0 == .ok } == [true, true, true, false, false, false, false, true, true])
    }
}

