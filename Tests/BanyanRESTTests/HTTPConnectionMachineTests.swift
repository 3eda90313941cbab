import BanyanREST
import Testing

/// The HTTP connection's state machine without a socket: each transition, the pipelining caps,
/// the body limit, the deadline and errors in each state, pauses and resumes, upgrades and
/// streams with requests pipelined behind them.
@Suite struct HTTPConnectionMachineTests {
    typealias Machine = HTTPConnectionMachine<String>

    static let limits = Machine.Limits(maxBodyBytes: 100, maxQueuedParts: 4, maxQueuedBytes: 50, hardQueuedParts: 10)

    func machine() -> Machine { Machine(limits: Self.limits) }

    /// `#expect` cannot evaluate a mutating call on a `var`: the checks go through this.
    func eq<T: Equatable>(_ actual: T, _ expected: T, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(actual == expected, sourceLocation: sourceLocation)
    }

    /// A GET handled from idle to its dispatch.
    func dispatchGet(_ m: inout Machine) {
        eq(m.arrived("head", bodyBytes: 0), .handle)
        eq(m.head(contentLength: nil, bodyLimit: 100, expectsContinue: false), .readBody)
        eq(m.arrived("end", bodyBytes: 0), .handle)
        eq(m.end(), .dispatch)
        #expect(m.state == .answering(closeAfter: false))
    }

    /// Takes every part `nextQueued` gives now.
    func drain(_ m: inout Machine) -> [String] {
        var taken: [String] = []
        while let part = m.nextQueued() { taken.append(part) }
        return taken
    }

    @Test("a request goes idle, body, answering and back to idle with a keep-alive answer; a close answer ends in closing")
    func lifecycle() {
        var m = machine()
        #expect(m.state == .idle && !m.holdsReads && m.handlesArrivalNow)
        eq(m.head(contentLength: 3, bodyLimit: 100, expectsContinue: false), .readBody)
        #expect(m.state == .body(.init(limit: 100, received: 0, tooLarge: false)))
        eq(m.bodyChunk(bytes: 2), .append)
        eq(m.bodyChunk(bytes: 1), .append)
        #expect(m.state == .body(.init(limit: 100, received: 3, tooLarge: false)))
        eq(m.end(), .dispatch)
        #expect(m.keepsAlive(wanted: true))
        eq(m.answered(keepAlive: true, writable: true), .resume)
        #expect(m.state == .idle)
        // An end with no request being read, a body chunk while idle: nothing.
        eq(m.end(), .ignore)
        eq(m.bodyChunk(bytes: 5), .ignore)
        eq(m.state, .idle)

        dispatchGet(&m)
        #expect(!m.keepsAlive(wanted: false))
        eq(m.answered(keepAlive: false, writable: true), .close)
        #expect(m.state == .closing(answerPending: false) && m.holdsReads && m.isClosing)
        eq(m.arrived("head", bodyBytes: 0), .dropped)
    }

    @Test("parts arriving while a request is answered are queued and taken in order after a keep-alive answer")
    func pipelining() {
        var m = machine()
        dispatchGet(&m)
        #expect(!m.handlesArrivalNow)
        for part in ["h2", "e2", "h3"] { eq(m.arrived(part, bodyBytes: 0), .queued) }
        eq(m.queuedCount, 3)
        eq(m.nextQueued(), nil)
        eq(m.answered(keepAlive: true, writable: true), .resume)
        eq(m.nextQueued(), "h2")
        eq(m.head(contentLength: nil, bodyLimit: 100, expectsContinue: false), .readBody)
        eq(m.nextQueued(), "e2")
        eq(m.end(), .dispatch)
        // Answering again: the rest waits.
        eq(m.nextQueued(), nil)
        eq(m.queuedCount, 1)
        // A part arriving now queues behind it, even once the connection is idle.
        eq(m.answered(keepAlive: true, writable: true), .resume)
        eq(m.arrived("b3", bodyBytes: 0), .queued)
        eq(drain(&m), ["h3", "b3"])
        eq(m.resumed(), false)
        eq(m.queuedCount, 0)
        eq(m.handlesArrivalNow, true)
    }

    @Test("reads are held past the soft caps and issued once the queue drains; past the hard caps the connection closes")
    func caps() {
        var m = machine()
        dispatchGet(&m)
        for i in 0..<3 { eq(m.arrived("p\(i)", bodyBytes: 0), .queued) }
        eq(m.holdsReads, false)
        eq(m.readRequested(), true)
        eq(m.arrived("p3", bodyBytes: 0), .queued)
        // At maxQueuedParts: the read is held.
        eq(m.holdsReads, true)
        eq(m.readRequested(), false)
        eq(m.readHeld, true)
        // What a read cycle already brought in still queues, up to the hard cap.
        for i in 4..<10 { eq(m.arrived("p\(i)", bodyBytes: 0), .queued) }
        eq(m.answered(keepAlive: true, writable: true), .resume)
        eq(m.nextQueued(), "p0")
        eq(m.head(contentLength: nil, bodyLimit: 100, expectsContinue: false), .readBody)
        // Still reading a body: the rest is taken too (they are this request's parts here).
        eq(drain(&m).count, 9)
        eq(m.resumed(), true)
        eq(m.readHeld, false)

        // By bytes: soft at 50, hard at maxBodyBytes + maxQueuedBytes = 150.
        var b = machine()
        dispatchGet(&b)
        eq(b.arrived("h", bodyBytes: 0), .queued)
        eq(b.arrived("b1", bodyBytes: 60), .queued)
        #expect(b.holdsReads && b.queuedBytes == 60)
        eq(b.arrived("b2", bodyBytes: 90), .queued)
        eq(b.arrived("b3", bodyBytes: 1), .closeTooFarAhead)
        #expect(b.state == .closing(answerPending: true) && b.queuedCount == 0 && b.queuedBytes == 0)
        eq(b.arrived("late", bodyBytes: 0), .dropped)
        // The pending answer closes.
        #expect(!b.keepsAlive(wanted: true))
        eq(b.answered(keepAlive: false, writable: true), .close)
        #expect(b.state == .closing(answerPending: false))

        // By parts: more than hardQueuedParts.
        var p = machine()
        dispatchGet(&p)
        for i in 0..<10 { eq(p.arrived("p\(i)", bodyBytes: 0), .queued) }
        eq(p.arrived("p10", bodyBytes: 0), .closeTooFarAhead)
        eq(p.isClosing, true)
        eq(p.nextQueued(), nil)
    }

    @Test("a body over the limit: refused at its head when declared and the client waits or the route says so, else answered 413 at its end")
    func bodyLimit() {
        // Declared too large, the client sends it anyway: read and dropped, then 413.
        var m = machine()
        eq(m.head(contentLength: 101, bodyLimit: 100, expectsContinue: false), .readBody)
        #expect(m.state == .body(.init(limit: 100, received: 0, tooLarge: true)))
        eq(m.bodyChunk(bytes: 10), .ignore)
        eq(m.end(), .refuseTooLarge)
        #expect(m.state == .answering(closeAfter: true) && !m.keepsAlive(wanted: true))
        eq(m.answered(keepAlive: false, writable: true), .close)

        // Too large by its chunks: what was kept is dropped, then 413.
        var c = machine()
        eq(c.head(contentLength: nil, bodyLimit: 100, expectsContinue: false), .readBody)
        eq(c.bodyChunk(bytes: 60), .append)
        eq(c.bodyChunk(bytes: 41), .discard)
        eq(c.bodyChunk(bytes: 1), .ignore)
        eq(c.end(), .refuseTooLarge)

        // A route's own smaller bound, and one that refuses at once.
        var r = machine()
        eq(r.head(contentLength: 20, bodyLimit: 10, expectsContinue: false, refusesTooLargeAtOnce: true), .refuse(.tooLarge))
        #expect(r.state == .answering(closeAfter: true))
        var s = machine()
        eq(s.head(contentLength: 10, bodyLimit: 10, expectsContinue: false, refusesTooLargeAtOnce: true), .readBody)
        // A route's bound never exceeds the node's.
        var t = machine()
        eq(t.head(contentLength: 150, bodyLimit: 1_000, expectsContinue: false), .readBody)
        #expect(t.state == .body(.init(limit: 100, received: 0, tooLarge: true)))
    }

    @Test("100-continue is sent for a body that fits, refused at once for one that does not; a write refused at its head closes unread")
    func continueAndRefusal() {
        var m = machine()
        eq(m.head(contentLength: 50, bodyLimit: 100, expectsContinue: true), .sendContinue)
        #expect(m.state == .body(.init(limit: 100, received: 0, tooLarge: false)))
        var big = machine()
        eq(big.head(contentLength: 500, bodyLimit: 100, expectsContinue: true), .refuse(.tooLarge))

        var refused = machine()
        eq(refused.head(contentLength: 5_000, bodyLimit: 100, expectsContinue: true, refusedAtHead: true), .refuse(.refusedAtHead))
        #expect(refused.state == .answering(closeAfter: true))
        // Its body and the next request, pipelined behind it, queue and then never apply.
        eq(refused.arrived("body", bodyBytes: 5), .queued)
        eq(refused.arrived("next", bodyBytes: 0), .queued)
        #expect(!refused.keepsAlive(wanted: true))
        eq(refused.answered(keepAlive: false, writable: true), .close)
        eq(refused.nextQueued(), nil)
        eq(refused.queuedCount, 0)
    }

    @Test("the request deadline: closes an idle or closing connection, answers 408 mid-body, is ignored while answering, streaming or upgrading")
    func deadline() {
        var idle = machine()
        eq(idle.deadlinePassed(), .close)
        eq(idle.state, .closing(answerPending: false))
        eq(idle.arrived("late", bodyBytes: 0), .dropped)

        var body = machine()
        _ = body.head(contentLength: 10, bodyLimit: 100, expectsContinue: false)
        _ = body.bodyChunk(bytes: 1)
        eq(body.deadlinePassed(), .timeOut)
        #expect(body.state == .answering(closeAfter: true) && !body.keepsAlive(wanted: true))
        // The rest of the body, arriving after the 408 was decided, never applies.
        eq(body.arrived("rest", bodyBytes: 9), .queued)
        eq(body.answered(keepAlive: false, writable: true), .close)
        eq(body.queuedCount, 0)
        eq(body.arrived("more", bodyBytes: 1), .dropped)
        // Then the deadline closes a client that never reads its 408.
        eq(body.deadlinePassed(), .close)

        var answering = machine()
        dispatchGet(&answering)
        eq(answering.deadlinePassed(), .ignore)
        eq(answering.state, .answering(closeAfter: false))

        var streaming = machine()
        dispatchGet(&streaming)
        streaming.streamStarted()
        eq(streaming.deadlinePassed(), .ignore)
        eq(streaming.state, .streaming)

        var upgrading = machine()
        dispatchGet(&upgrading)
        upgrading.upgradeBegun()
        eq(upgrading.deadlinePassed(), .ignore)

        var backup = machine()
        dispatchGet(&backup)
        backup.backupBegun()
        eq(backup.deadlinePassed(), .ignore)
        eq(backup.state, .closing(answerPending: true))

        var closed = machine()
        closed.inactive()
        eq(closed.deadlinePassed(), .ignore)
        eq(closed.state, .closed)
    }

    @Test("bad HTTP gets a 400 while idle or reading a body, a bare close while answering or streaming")
    func parseErrors() {
        var idle = machine()
        eq(idle.failed(badHTTP: true), .badRequest)
        #expect(idle.state == .closing(answerPending: false) && idle.holdsReads)
        var body = machine()
        _ = body.head(contentLength: 10, bodyLimit: 100, expectsContinue: false)
        eq(body.failed(badHTTP: true), .badRequest)
        // Another error (or a closed channel): no answer.
        var other = machine()
        eq(other.failed(badHTTP: false), .close)

        var answering = machine()
        dispatchGet(&answering)
        eq(answering.arrived("queued", bodyBytes: 0), .queued)
        eq(answering.failed(badHTTP: true), .close)
        #expect(answering.state == .closing(answerPending: true) && answering.queuedCount == 0)
        #expect(!answering.keepsAlive(wanted: true))

        var streaming = machine()
        dispatchGet(&streaming)
        streaming.streamStarted()
        eq(streaming.failed(badHTTP: true), .close)
        var closed = machine()
        closed.inactive()
        eq(closed.failed(badHTTP: true), .close)
        eq(closed.state, .closed)
    }

    @Test("an unwritable channel or a spent answer budget pauses the connection: parts queue, reads are held, and both resume")
    func pauses() {
        var m = machine()
        dispatchGet(&m)
        eq(m.answered(keepAlive: true, writable: false), .resume)
        #expect(m.unwritable && m.holdsReads && !m.handlesArrivalNow)
        eq(m.readRequested(), false)
        eq(m.arrived("h", bodyBytes: 0), .queued)
        eq(m.nextQueued(), nil)
        eq(m.writabilityChanged(writable: true), true)
        eq(drain(&m), ["h"])
        eq(m.resumed(), true)
        eq(m.readHeld, false)

        var b = machine()
        // The budget: a pause begins once, not again while it lasts.
        eq(b.budgetMeasured(waits: true), true)
        eq(b.budgetMeasured(waits: true), false)
        #expect(b.overBudget && b.holdsReads && !b.handlesArrivalNow)
        eq(b.arrived("h", bodyBytes: 0), .queued)
        eq(b.readRequested(), false)
        eq(b.budgetResumable(), true)
        eq(b.budgetResumable(), false)
        eq(drain(&b), ["h"])
        eq(b.resumed(), true)
        // Measured again without waiting: no pause.
        eq(b.budgetMeasured(waits: false), false)
        eq(b.overBudget, false)
        // Writability going away resumes nothing.
        eq(b.writabilityChanged(writable: false), false)
    }

    @Test("an upgrade drops the requests pipelined behind it and everything arriving later; reads stay held")
    func upgrade() {
        var m = machine()
        dispatchGet(&m)
        for part in ["h2", "e2"] { eq(m.arrived(part, bodyBytes: 0), .queued) }
        eq(m.upgradeBegun(), 2)
        eq(m.state, .upgrading)
        eq(m.queuedCount, 0)
        eq(m.nextQueued(), nil)
        eq(m.arrived("frame", bodyBytes: 0), .dropped)
        eq(m.holdsReads, true)
        eq(m.readRequested(), false)
        eq(m.resumed(), false)
        // Bad bytes during the switch: closed, no 400.
        eq(m.failed(badHTTP: true), .close)
    }

    @Test("a stream keeps later requests queued (up to the hard cap) and ends with the connection")
    func streamThenClose() {
        var m = machine()
        dispatchGet(&m)
        m.streamStarted()
        #expect(m.state == .streaming && !m.isClosing)
        eq(m.arrived("h2", bodyBytes: 0), .queued)
        eq(m.nextQueued(), nil)
        m.inactive()
        eq(m.state, .closed)
        eq(m.queuedCount, 0)
        eq(m.arrived("h3", bodyBytes: 0), .dropped)
        // An answer finishing after the close (an asynchronous one) closes.
        eq(m.keepsAlive(wanted: true), false)
        eq(m.answered(keepAlive: false, writable: false), .close)
        eq(m.state, .closed)
    }
}
