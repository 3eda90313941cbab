import BanyanClientCore
import BanyanTree
import Testing

/// The timers that find a dead or silent node (docs/swift-sdk.md, "Failover"): a node that
/// accepts the connection and never says hello, and a node that goes silent while the client is
/// online (a stopped or hung process, a partition: the kernel keeps TCP up, nothing answers).
extension ClientCoreTests {
    static let ping = #"{"t":"c","d":{"t":"p","d":{}}}"#
    static let pong: [UInt8] = Array(#"{"t":"c","d":{"t":"o","d":null}}"#.utf8)

    /// Ticks every 500 ms from `from` (exclusive) to `to` (inclusive); the actions they produced.
    static func ticks(_ core: inout ClientCore, from: Int64, to: Int64) -> [ClientCore.Action] {
        var all: [ClientCore.Action] = []
        var t = from
        while t < to {
            t = min(to, t + 500)
            core.tick(now: t)
            all += core.takeActions()
        }
        return all
    }

    @Test("no hello within the connect timeout: the attempt is abandoned (the driver told to close it), the next node is tried after the back-off, a late hello or end report of the abandoned attempt changes nothing")
    func helloTimeoutFailsOverToTheNextNode() throws {
        var core = ClientCore(nodeCount: 3, seed: 1)
        core.timeouts = ClientCore.Timeouts(connectMillis: 10_000)
        core.tick(now: 0)
        #expect(core.takeActions() == [.connect(node: 0)])
        try core.set(1, path: Self.path("/w"), json: Self.bytes("1"))
        _ = core.takeActions()
        core.opened()
        #expect(Self.ticks(&core, from: 0, to: 9_999).isEmpty, "before the timeout")
        #expect(core.holdsConnection)
        core.tick(now: 10_000)
        #expect(core.takeActions() == [.disconnect])
        #expect(!core.holdsConnection && !core.isOnline)
        // The abandoned attempt's hello and end, if they still come, change nothing.
        core.received(Self.hello("late"))
        core.closed()
        let late = core.takeActions()
        #expect(!late.contains(.connected(true)) && Self.sent(late).isEmpty, "\(late)")
        // The back-off (300 to 600 ms after a first failure), then the next node; the write goes
        // there.
        #expect(Self.ticks(&core, from: 10_000, to: 11_000) == [.connect(node: 1)])
        core.received(Self.hello("S2"))
        let online = core.takeActions()
        #expect(online.first == .connected(true) && Self.sent(online).contains { $0.contains(#""p":"/w""#) }, "\(online)")
        #expect(core.onlineNode == 1)
    }

    @Test("a hello in time: no timeout; each attempt has its own clock")
    func helloInTimeKeepsTheConnection() throws {
        var core = ClientCore(nodeCount: 2, seed: 1)
        core.timeouts = ClientCore.Timeouts(connectMillis: 1_000, idleMillis: 60_000)
        core.tick(now: 0)
        _ = core.takeActions()
        core.tick(now: 900)
        core.received(Self.hello())
        _ = core.takeActions()
        #expect(Self.sent(Self.ticks(&core, from: 900, to: 20_000)) == [])
        #expect(core.onlineNode == 0)
        // The connection ends; the next attempt (node 1) gets a full second again.
        core.closed()
        _ = core.takeActions()
        var t: Int64 = 20_000
        var connectedAt: Int64?
        while connectedAt == nil, t < 22_000 {
            t += 100
            core.tick(now: t)
            if core.takeActions() == [.connect(node: 1)] { connectedAt = t }
        }
        let started = try #require(connectedAt)
        #expect(!Self.ticks(&core, from: started, to: started + 900).contains(.disconnect))
        #expect(Self.ticks(&core, from: started + 900, to: started + 1_500).first == .disconnect)
    }

    @Test("online and silent: a ping after the idle time; anything heard resets the timer; no answer within the ping timeout: the connection is given up and the next node gets the listens and the unanswered writes")
    func silentNodeIsPingedThenAbandoned() throws {
        var core = ClientCore(nodeCount: 2, seed: 1)
        core.timeouts = ClientCore.Timeouts(idleMillis: 30_000, pingAnswerMillis: 15_000)
        core.tick(now: 0)
        _ = core.takeActions()
        core.received(Self.hello())
        core.observe(1, path: Self.path("/l"), type: .value)
        _ = core.takeActions()
        // Data heard at 10 s: the idle time counts from there.
        _ = Self.ticks(&core, from: 0, to: 10_000)
        core.received(Self.data("/l", "1"))
        _ = core.takeActions()
        #expect(Self.ticks(&core, from: 10_000, to: 39_500).isEmpty)
        #expect(Self.sent(Self.ticks(&core, from: 39_500, to: 40_000)) == [Self.ping])
        // The pong: alive; the next silence starts from it.
        _ = Self.ticks(&core, from: 40_000, to: 41_000)
        core.received(Self.pong)
        #expect(core.takeActions().isEmpty)
        #expect(Self.ticks(&core, from: 41_000, to: 70_500).isEmpty)
        #expect(Self.sent(Self.ticks(&core, from: 70_500, to: 71_000)) == [Self.ping])
        // A WebSocket ping from the server (reported by the driver) counts as heard too.
        _ = Self.ticks(&core, from: 71_000, to: 80_000)
        core.heard()
        #expect(!Self.ticks(&core, from: 80_000, to: 100_000).contains(.disconnect))
        // Silence from 80 s: a write goes unanswered, the ping at 110 s too; at 125 s the node
        // is given up.
        try core.set(7, path: Self.path("/w"), json: Self.bytes("7"))
        _ = core.takeActions()
        #expect(Self.sent(Self.ticks(&core, from: 100_000, to: 110_000)) == [Self.ping])
        #expect(Self.ticks(&core, from: 110_000, to: 124_500).isEmpty)
        core.tick(now: 125_000)
        let gaveUp = core.takeActions()
        #expect(gaveUp.first == .disconnect && gaveUp.contains(.connected(false)), "\(gaveUp)")
        #expect(!core.isOnline && !core.holdsConnection)
        // The driver's report of the end (after it closed the socket) changes nothing.
        core.closed()
        #expect(core.takeActions().isEmpty)
        // The next node: the listen and the write go again, once.
        #expect(Self.ticks(&core, from: 125_000, to: 126_000) == [.connect(node: 1)])
        core.received(Self.hello("S2"))
        let again = Self.sent(core.takeActions())
        #expect(again.filter { $0.contains(#""a":"q""#) && $0.contains(#""p":"/l""#) }.count == 1, "\(again)")
        #expect(again.filter { $0.contains(#""a":"p""#) && $0.contains(#""p":"/w""#) }.count == 1, "\(again)")
        #expect(core.onlineNode == 1)
    }

    @Test("a stall of the client itself (ticks far apart) while a ping waits restarts the wait: the answer may be unread, not missing")
    func clientStallIsNotTheNodesSilence() {
        var core = ClientCore(nodeCount: 2, seed: 1)
        core.timeouts = ClientCore.Timeouts(idleMillis: 1_000, pingAnswerMillis: 1_000)
        core.tick(now: 0)
        _ = core.takeActions()
        core.received(Self.hello())
        _ = core.takeActions()
        #expect(Self.sent(Self.ticks(&core, from: 0, to: 1_000)) == [Self.ping])
        // The client's thread stalls for 20 s: no failover at the first tick after it.
        core.tick(now: 21_000)
        #expect(core.takeActions().isEmpty)
        #expect(core.isOnline)
        // The answer arrives then: online still.
        core.received(Self.pong)
        #expect(core.takeActions().isEmpty)
        // Silence again, steady ticks: ping, then given up one second later.
        #expect(Self.sent(Self.ticks(&core, from: 21_000, to: 22_000)) == [Self.ping])
        #expect(Self.ticks(&core, from: 22_000, to: 23_000).first == .disconnect)
    }

    @Test("goOffline then goOnline: the timers do not fire while offline, and start again with the next attempt")
    func timersIdleWhileOffline() {
        var core = ClientCore(nodeCount: 1, seed: 1)
        core.timeouts = ClientCore.Timeouts(connectMillis: 1_000, idleMillis: 1_000, pingAnswerMillis: 1_000)
        core.tick(now: 0)
        _ = core.takeActions()
        core.received(Self.hello())
        core.goOffline()
        #expect(core.takeActions().contains(.disconnect))
        core.closed()
        _ = core.takeActions()
        #expect(Self.ticks(&core, from: 0, to: 10_000).isEmpty)
        core.goOnline()
        #expect(Self.ticks(&core, from: 10_000, to: 10_500) == [.connect(node: 0)])
        #expect(Self.ticks(&core, from: 10_500, to: 11_000).isEmpty)
        #expect(Self.ticks(&core, from: 11_000, to: 11_500) == [.disconnect])
    }
}

extension ClientCoreTests {
    /// Ticks every millisecond from `from` until the core asks to connect (at most `limit` ms);
    /// the node and when.
    static func nextConnect(_ core: inout ClientCore, from: Int64, limit: Int64 = 60_000) -> (node: Int, at: Int64)? {
        var t = from
        while t < from + limit {
            t += 1
            core.tick(now: t)
            for action in core.takeActions() {
                if case .connect(let node) = action { return (node, t) }
            }
        }
        return nil
    }

    @Test("reconnecting: each failed attempt waits a jittered, doubling back-off (the k-th failure between half and all of min(30 s, 300 ms × 2^k)), tries the next node, and a successful hello starts the back-off again")
    func backOffDoublesWithJitterAndACap() throws {
        var delaysOfThirdFailure: Set<Int64> = []
        for seed: UInt64 in 1...8 {
            var core = ClientCore(nodeCount: 3, seed: seed)
            core.tick(now: 0)
            #expect(core.takeActions() == [.connect(node: 0)])
            var now: Int64 = 0
            var node = 0
            for failure in 1...10 {
                core.closed()
                _ = core.takeActions()
                let next = try #require(Self.nextConnect(&core, from: now), "seed \(seed), failure \(failure)")
                let base = Int64(min(30_000, 300 << min(failure, 7)))
                let delay = next.at - now
                #expect(delay >= base / 2 && delay <= base, "seed \(seed), failure \(failure): waited \(delay) ms, expected \(base / 2)–\(base)")
                #expect(next.node == (node + 1) % 3, "seed \(seed), failure \(failure): node \(next.node) after \(node)")
                if failure == 3 { delaysOfThirdFailure.insert(delay) }
                now = next.at
                node = next.node
            }
            // Online again: the next failure waits as a first one does.
            core.received(Self.hello())
            _ = core.takeActions()
            core.closed()
            _ = core.takeActions()
            let again = try #require(Self.nextConnect(&core, from: now))
            #expect(again.at - now >= 300 && again.at - now <= 600, "seed \(seed): after a hello the back-off restarts, waited \(again.at - now) ms")
        }
        #expect(delaysOfThirdFailure.count >= 4, "jitter: eight clients' third retries came after \(delaysOfThirdFailure.sorted()) ms")
    }
}
