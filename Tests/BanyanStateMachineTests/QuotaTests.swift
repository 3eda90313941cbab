import BanyanBasics
@testable import BanyanStateMachine
import BanyanTree
import Testing

/// Namespace quotas (docs/operations.md, "Namespace quotas"): set through the log in `$quotas`,
/// judged where a write applies, with the usage kept from the paths each write touched.
@Suite struct QuotaTests {
    struct Log {
        var machine = StateMachine()
        var index: UInt64 = 0
        var seq: UInt64 = 0
        /// Read every command ahead as a node's worker does (`PreparedCommand`); false: applied
        /// as they come.
        var readAhead = false
        /// Commands applied from a read-ahead.
        var readAheads = 0

        mutating func apply(_ command: Command, namespace: String = "app", session: UInt64 = 3, auth: ClientAuth? = nil) -> StateMachine.Outcome? {
            index += 1
            seq += 1
            let payload = CommandEnvelope(namespace: namespace, session: session, seq: seq, timestamp: 1_000 + Int64(index), command: command, auth: auth).encoded()
            let prepared = readAhead ? PreparedCommand(payload: payload) : nil
            if prepared != nil { readAheads += 1 }
            return machine.apply(payload, index: index, prepared: prepared)?.outcome
        }

        mutating func setQuota(_ bytes: Int?, of namespace: String = "app") -> StateMachine.Outcome? {
            apply(.set(path: "/" + namespace, json: Array((bytes.map(String.init) ?? "null").utf8)), namespace: StateMachine.quotasNamespace)
        }

        mutating func set(_ path: String, _ json: String) -> StateMachine.Outcome? { apply(.set(path: path, json: Array(json.utf8))) }
    }

    @Test("the measure: keys, strings (UTF-8), numbers 8, booleans 1, priorities as values; the touched part of a tree")
    func measure() throws {
        let tree = try TreeReader.read(Array(#"{"ab":"xyz","n":{"c":true,"d":1.5},"é":{".value":"q",".priority":3}}"#.utf8))
        // ab 2 + xyz 3; n 1 + c 1 + true 1 + d 1 + 8; é 2 + q 1 + priority 8.
        #expect(tree.dataBytes == 5 + 12 + 11)
        #expect(Tree.empty.dataBytes == 0)
        #expect(tree.dataBytes(touching: [try Path(parsing: "/n/c")]) == 1 + 1 + 1)
        #expect(tree.dataBytes(touching: [try Path(parsing: "/n")]) == 12)
        #expect(tree.dataBytes(touching: [try Path(parsing: "/n/c"), try Path(parsing: "/n/d")]) == 1 + 2 + 9)
        #expect(tree.dataBytes(touching: [try Path(parsing: "/ab/under")]) == 5, "a leaf on the way counts: a write below replaces it")
        #expect(tree.dataBytes(touching: [try Path(parsing: "/missing/x")]) == 0)
        #expect(tree.dataBytes(touching: [Path.root]) == tree.dataBytes)
        #expect(tree.dataBytes(touching: []) == 0)
        // A priority write at a path: that tree's own leaf and priority, not its children.
        #expect(tree.dataBytes(touching: [Path.root], priorityOnly: [true]) == 0)
        #expect(tree.dataBytes(touching: [try Path(parsing: "/n")], priorityOnly: [true]) == 1)
        #expect(tree.dataBytes(touching: [try Path(parsing: "/é")], priorityOnly: [true]) == 2 + 1 + 8)
        #expect(tree.dataBytes(touching: [try Path(parsing: "/n"), try Path(parsing: "/n/c")], priorityOnly: [true, false]) == 1 + 1 + 1)
    }

    /// Random values, small so that writes collide: sets anywhere (under leaves too), updates of
    /// several paths, priorities, deletes, and transactions with the right and the wrong hash.
    struct Generator {
        var random: SeededRandom
        mutating func below(_ n: Int) -> Int { Int(random.next() % UInt64(n)) }
        mutating func key() -> String { ["a", "b", "c", "dé", "e1"][below(5)] }
        mutating func path(depth: Int? = nil) -> String {
            let d = depth ?? below(4)
            return d == 0 ? "/" : (0..<d).map { _ in "/" + key() }.joined()
        }
        mutating func leaf() -> String {
            switch below(5) {
            case 0: return "true"
            case 1: return String(below(1000))
            case 2: return "\"" + String(repeating: "x", count: below(12)) + "\""
            case 3: return "1.25"
            default: return "null"
            }
        }
        mutating func value(depth: Int = 0) -> String {
            switch below(depth >= 2 ? 2 : 4) {
            case 0: return leaf()
            case 1: return #"{".value":\#(leaf() == "null" ? "7" : "\"v\""),".priority":\#(below(2) == 0 ? "3" : "\"p\"")}"#
            default:
                let n = 1 + below(3)
                var seen = Set<String>()
                var parts: [String] = []
                for _ in 0..<n {
                    let k = key()
                    guard seen.insert(k).inserted else { continue }
                    parts.append("\"\(k)\":\(value(depth: depth + 1))")
                }
                return "{" + parts.joined(separator: ",") + "}"
            }
        }
    }

    @Test("after every command of 4,000 random ones (sets, updates, priorities at any depth, server values, deletes, transactions, judged writes, onDisconnect queues fired) the kept usage equals a measure of the whole namespace, walked, and every tree carries the measure its contents have, with and without refusals")
    func usageFollowsWrites() throws {
        var refusedInAll = 0
        var readAheads = 0
        // Each seed twice: applied as they come, and read ahead.
        for (seed, readAhead) in (1...8 as ClosedRange<UInt64>).flatMap({ [($0, false), ($0, true)] }) {
            var log = Log()
            log.readAhead = readAhead
            var g = Generator(random: SeededRandom(seed: seed))
            // Seeds 1-3: no refusal; 4-8: a small quota (100 bytes), so that refusals (restores) are in the mix;
            // 7-8: rules that allow everything, so every write is judged (the rules' own paths).
            let judged = seed >= 7
            if judged {
                #expect(log.apply(.setRules(text: Array(#"{"rules":{".read":true,".write":true}}"#.utf8))) == .ok)
            }
            #expect(log.setQuota(seed <= 3 ? StateMachine.maxQuotaBytes : 100) == .ok)
            let auth: ClientAuth? = judged ? .user(json: Array(#"{"uid":"u"}"#.utf8)) : nil
            var refused = 0
            for step in 0..<500 {
                var outcome: StateMachine.Outcome?
                switch g.below(8) {
                case 0, 1: outcome = log.apply(.set(path: g.path(), json: Array(g.value().utf8)), auth: auth)
                case 2:
                    var entries: [Command.UpdateItem] = []
                    var used = Set<String>()
                    for _ in 0..<(1 + g.below(3)) {
                        let k = g.key()
                        guard used.insert(k).inserted else { continue }
                        let tail = ["", "/" + g.key(), "/.priority"][g.below(3)]
                        entries.append(.init(path: k + tail, json: Array((tail == "/.priority" ? "4" : g.value(depth: 1)).utf8)))
                    }
                    outcome = log.apply(.update(path: g.path(depth: g.below(2)), entries: entries), auth: auth)
                case 3:
                    let at = g.path(depth: g.below(3))
                    outcome = log.apply(.set(path: (at == "/" ? "" : at) + "/.priority", json: Array((g.below(2) == 0 ? "5" : #""s""#).utf8)), auth: auth)
                case 4:
                    let sv = [#"{".sv":"timestamp"}"#, #"{".sv":{"increment":3}}"#, "null"][g.below(3)]
                    outcome = log.apply(.set(path: g.path(depth: 1 + g.below(2)), json: Array(sv.utf8)), auth: auth)
                case 5:
                    // A connection queues writes and ends (through another session).
                    let connection = UInt64(1_000 + step)
                    let queued = log.apply(.onDisconnectSet(path: g.path(depth: 1 + g.below(2)), json: Array(g.value(depth: 1).utf8), secret: 9, holder: 0), session: connection)
                    #expect(queued != nil)
                    outcome = log.apply(.connectionEnded(connection: connection, secret: 9), session: 5)
                default:
                    let path = g.path(depth: 1 + g.below(2))
                    let current = log.machine.tree("app").child(at: try Path(parsing: path))
                    let hash = g.below(3) == 0 ? "wrong" : current.hashString
                    outcome = log.apply(.compareAndSet(path: path, expectedHash: hash, json: Array(g.value(depth: 1).utf8)), auth: auth)
                }
                if case .overQuota(_, let used, _, _)? = outcome {
                    refused += 1
                    #expect((used < 0) == judged, "sizes are withheld from judged writes only")
                }
                if case .rejected(let e)? = outcome, e.message.hasPrefix("QUOTA:") { refused += 1 }
                #expect(log.machine.quotaUsage["app"] == log.machine.tree("app").walkedDataBytes, "seed \(seed) (read ahead: \(readAhead)) step \(step): \(String(describing: outcome))")
                #expect(log.machine.tree("app").dataBytesAreConsistent, "seed \(seed) step \(step)")
            }
            if seed >= 4 {
                #expect(refused > 5, "seed \(seed): only \(refused) refusals")
                #expect(log.machine.tree("app").dataBytes <= 100, "seed \(seed): the namespace holds more than its quota")
            }
            refusedInAll += refused
            readAheads += log.readAheads
        }
        #expect(refusedInAll > 100)
        #expect(readAheads > 1_000, "commands applied from a read-ahead: \(readAheads)")
    }

    @Test("the measure trees carry survives images: three machines in lockstep over 8 × 600 random commands and quota changes (one reading them ahead, one reloaded from its image every 25 commands) decide alike, and every usage equals the walked measure")
    func measuresSurviveImages() throws {
        var refusals = 0
        var reloads = 0
        for seed in 1...8 as ClosedRange<UInt64> {
            var logs = [Log(), Log(), Log()]
            var g = Generator(random: SeededRandom(seed: seed))
            func run(_ command: Command, namespace: String = "app", session: UInt64 = 3) -> StateMachine.Outcome? {
                var outcomes: [StateMachine.Outcome?] = []
                for i in logs.indices {
                    logs[i].index += 1
                    logs[i].seq += 1
                    let payload = CommandEnvelope(
                        namespace: namespace, session: session, seq: logs[i].seq, timestamp: 1_000 + Int64(logs[i].index), command: command
                    ).encoded()
                    let prepared = i == 1 ? PreparedCommand(payload: payload) : nil
                    outcomes.append(logs[i].machine.apply(payload, index: logs[i].index, prepared: prepared)?.outcome)
                }
                #expect(outcomes[0] == outcomes[1] && outcomes[0] == outcomes[2], "seed \(seed): \(command): \(outcomes)")
                return outcomes[0]
            }
            _ = run(.set(path: "/app", json: Array("150".utf8)), namespace: StateMachine.quotasNamespace, session: 2)
            for step in 0..<600 {
                var outcome: StateMachine.Outcome?
                switch g.below(10) {
                case 0, 1, 2: outcome = run(.set(path: g.path(), json: Array(g.value().utf8)))
                case 3:
                    let json = [#"null"#, #"{".sv":{"increment":2}}"#, #"{".sv":"timestamp"}"#][g.below(3)]
                    outcome = run(.set(path: g.path(depth: g.below(3)), json: Array(json.utf8)))
                case 4:
                    var entries: [Command.UpdateItem] = []
                    var used = Set<String>()
                    for _ in 0..<(1 + g.below(2)) {
                        let k = g.key()
                        guard used.insert(k).inserted else { continue }
                        entries.append(.init(path: k, json: Array(g.value(depth: 1).utf8)))
                    }
                    outcome = run(.update(path: g.path(depth: g.below(2)), entries: entries))
                case 5:
                    let at = g.path(depth: g.below(3))
                    outcome = run(.set(path: (at == "/" ? "" : at) + "/.priority", json: Array("5".utf8)))
                case 6:
                    let connection = UInt64(1_000 + step)
                    _ = run(.onDisconnectSet(path: g.path(depth: 1 + g.below(2)), json: Array(g.value(depth: 1).utf8), secret: 9, holder: 0), session: connection)
                    outcome = run(.connectionEnded(connection: connection, secret: 9), session: 5)
                case 7:
                    let path = g.path(depth: 1 + g.below(2))
                    let current = logs[0].machine.tree("app").child(at: try Path(parsing: path))
                    outcome = run(.compareAndSet(path: path, expectedHash: current.hashString, json: Array(g.value(depth: 1).utf8)))
                case 8 where g.below(10) == 0:
                    // The quota changes, goes and comes back.
                    let quota = [nil, "60", "150", "400"][g.below(4)]
                    _ = run(.set(path: "/app", json: Array((quota ?? "null").utf8)), namespace: StateMachine.quotasNamespace, session: 2)
                default:
                    outcome = run(.set(path: g.path(depth: 1 + g.below(2)), json: Array(g.value(depth: 1).utf8)))
                }
                if case .overQuota? = outcome { refusals += 1 }
                if step % 25 == 24 {
                    logs[2].machine = try StateMachine(image: logs[2].machine.image())
                    reloads += 1
                }
                let trees = logs.map { JSONWriter.string($0.machine.tree("app"), format: .export) }
                #expect(trees[0] == trees[1] && trees[0] == trees[2], "seed \(seed) step \(step)")
                let truth = logs[0].machine.tree("app").walkedDataBytes
                for (i, log) in logs.enumerated() {
                    #expect(log.machine.tree("app").dataBytesAreConsistent, "seed \(seed) step \(step) machine \(i)")
                    let usage = log.machine.quotaUsage["app"]
                    #expect(usage == nil || usage == truth, "seed \(seed) step \(step) machine \(i): \(String(describing: usage)) against \(truth)")
                    #expect((usage == nil) == (logs[0].machine.quotaUsage["app"] == nil))
                }
            }
        }
        #expect(reloads == 8 * 24)
        #expect(refusals > 50, "refusals: \(refusals)")
    }

    @Test("onDisconnect cannot carry a namespace past its quota: a queue that would is dropped when it fires, and a namespace at its quota takes no queued data")
    func disconnectsCannotBypass() throws {
        var log = Log()
        #expect(log.setQuota(40) == .ok)
        for round in 0..<20 {
            let connection = UInt64(100 + round)
            #expect(log.apply(.onDisconnectSet(path: "/r\(round)", json: Array(#""0123456789""#.utf8), secret: 5, holder: 0), session: connection) == .ok)
            let ended = log.apply(.connectionEnded(connection: connection, secret: 5), session: 99)
            if round >= 3 {
                guard case .rejected(let e)? = ended, e.message.hasPrefix("QUOTA: these onDisconnect writes would take namespace app over its quota of 40") else {
                    Issue.record("round \(round): \(String(describing: ended))")
                    continue
                }
            }
        }
        // Three queues of 12 bytes fit (36); the fourth would make 48.
        #expect(log.machine.quotaUsage["app"] == 36 && log.machine.tree("app").dataBytes == 36)
        // Below the quota a queue may still be registered, and is dropped when it fires over it.
        #expect(log.set("/r0", "null") == .ok)  // 24
        #expect(log.apply(.onDisconnectSet(path: "/big", json: Array(#""0123456789012345678901234""#.utf8), secret: 5, holder: 0), session: 200) == .ok)
        let ended = log.apply(.connectionEnded(connection: 200, secret: 5), session: 99)
        guard case .rejected(let error)? = ended else {
            Issue.record("the queue over the quota fired: \(String(describing: ended))")
            return
        }
        #expect(error.message.hasPrefix("QUOTA:") && log.machine.tree("app").child(ChildKey(unchecked: "big")).isEmpty)
        #expect(log.machine.quotaUsage["app"] == 24 && log.machine.disconnects[200] == nil)
        // At the quota a queue adding data is refused when registered; a removal may be queued, and runs.
        #expect(log.set("/r9", #""01234567""#) == .ok)  // 24 + 10 = 34
        #expect(log.set("/x", #""abcde""#) == .ok)  // 34 + 6 = 40
        #expect(log.machine.quotaUsage["app"] == 40)
        #expect(log.apply(.onDisconnectSet(path: "/y", json: Array("1".utf8), secret: 5, holder: 0), session: 201) == .overQuota(namespace: "app", used: -1, wouldHold: -1, quota: 40))
        #expect(log.apply(.onDisconnectSet(path: "/x", json: Array("null".utf8), secret: 5, holder: 0), session: 202) == .ok)
        #expect(log.apply(.connectionEnded(connection: 202, secret: 5), session: 99) == .ok)
        #expect(log.machine.quotaUsage["app"] == 34 && log.machine.tree("app").dataBytes == 34)
    }

    @Test("a write that would take a namespace over its quota is refused with QUOTA and changes nothing; deletes and smaller writes apply; other namespaces are not limited")
    func enforced() throws {
        var log = Log()
        #expect(log.set("/a", #""0123456789""#) == .ok)  // 1 + 10
        #expect(log.setQuota(40) == .ok)
        #expect(log.machine.quotas == ["app": 40] && log.machine.quotaUsage["app"] == 11)
        #expect(log.set("/b", #""01234567890123456789""#) == .ok)  // 21: 32 in all
        let over = log.set("/c", #""0123456789""#)  // would be 43
        #expect(over == .overQuota(namespace: "app", used: 32, wouldHold: 43, quota: 40))
        #expect(log.machine.tree("app").child(ChildKey(unchecked: "c")).isEmpty && log.machine.quotaUsage["app"] == 32)
        let message = StateMachine.Outcome.overQuotaMessage(namespace: "app", used: 32, wouldHold: 43, quota: 40)
        #expect(message.hasPrefix("QUOTA: namespace app holds 32 bytes") && message.contains("quota of 40"))
        // An update is all or nothing.
        #expect(log.apply(.update(path: "/", entries: [.init(path: "a", json: Array("null".utf8)), .init(path: "d", json: Array(#""01234567890123456789""#.utf8))])) == .overQuota(namespace: "app", used: 32, wouldHold: 32 - 11 + 21, quota: 40))
        #expect(log.machine.tree("app").child(ChildKey(unchecked: "a")).isEmpty == false)
        // A transaction is judged the same way (the hash matched: only the quota refuses it).
        let hash = log.machine.tree("app").child(ChildKey(unchecked: "a")).hashString
        #expect(log.apply(.compareAndSet(path: "/a", expectedHash: hash, json: Array(#""0123456789012345678""#.utf8))) == .overQuota(namespace: "app", used: 32, wouldHold: 41, quota: 40))
        // Writes that fit go on.
        #expect(log.set("/c", "true") == .ok)  // 2: 34
        #expect(log.machine.quotaUsage["app"] == 34)
        // Another namespace has no quota.
        #expect(log.apply(.set(path: "/big", json: Array(String(repeating: "x", count: 500).debugDescription.utf8)), namespace: "other") == .ok)
        // The quota lowered below the usage: growth is refused, but a smaller value and deletes apply.
        #expect(log.setQuota(10) == .ok)
        #expect(log.set("/c", "false") == .ok, "the same size adds nothing")
        #expect(log.set("/b", #""short""#) == .ok)  // 21 -> 6: 19
        #expect(log.set("/e", "1") == .overQuota(namespace: "app", used: 19, wouldHold: 28, quota: 10))
        #expect(log.set("/a", "null") == .ok)
        #expect(log.machine.quotaUsage["app"] == 8)
        #expect(log.set("/e", "1") == .overQuota(namespace: "app", used: 8, wouldHold: 17, quota: 10))
        #expect(log.set("/e", "7") != .ok)
        #expect(log.set("/e", #""x""#) == .ok)  // 2: 10, exactly the quota
        // Removed: no limit, no usage kept.
        #expect(log.setQuota(nil) == .ok)
        #expect(log.machine.quotas.isEmpty && log.machine.quotaUsage.isEmpty && log.machine.tree(StateMachine.quotasNamespace).isEmpty)
        #expect(log.set("/f", #""0123456789012345678901234567890123456789""#) == .ok)
    }

    @Test("clients cannot set quotas; a quota survives an image (the usage read again on load); it can be set while a free-space alarm stands")
    func replicatedState() throws {
        var log = Log()
        #expect(log.set("/a", #""abc""#) == .ok)
        let denied = log.apply(.set(path: "/app", json: Array("100".utf8)), namespace: StateMachine.quotasNamespace, auth: .signedOut)
        #expect(denied == .permissionDenied(reason: "only administrators may set quotas"))
        #expect(log.machine.quotas.isEmpty)
        #expect(log.apply(.spaceAlarm(node: 2, raised: true)) == .ok)
        #expect(log.machine.refusedBeforeProposal(namespace: StateMachine.quotasNamespace, command: .set(path: "/app", json: Array("9".utf8))) == nil)
        #expect(log.setQuota(9) == .ok)
        #expect(log.apply(.spaceAlarm(node: 2, raised: false)) == .ok)
        // Values the proposer never writes set no quota: zero, negative, fractional, strings, `$` names.
        #expect(StateMachine.parsedQuotas(try TreeReader.read(Array(#"{"a":0,"b":-5,"c":1.5,"d":"9","e":12,"f":1125899906842625}"#.utf8))) == ["e": 12])
        #expect(StateMachine.parsedQuotas(Tree(sortedChildren: [(ChildKey(unchecked: "$x"), Tree(.int(5)))])).isEmpty)
        var copy = try StateMachine(image: log.machine.image())
        #expect(copy.quotas == ["app": 9] && copy.quotaUsage == ["app": 4])
        let next = CommandEnvelope(namespace: "app", session: 3, seq: log.seq + 1, timestamp: 5_000, command: .set(path: "/b", json: Array(#""12345""#.utf8))).encoded()
        #expect(copy.apply(next, index: log.index + 1)?.outcome == .overQuota(namespace: "app", used: 4, wouldHold: 10, quota: 9))
        #expect(log.machine.apply(next, index: log.index + 1)?.outcome == .overQuota(namespace: "app", used: 4, wouldHold: 10, quota: 9))
    }
}
