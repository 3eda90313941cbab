/// One client HTTP/1.x connection as a state machine (docs/http-connection.md): the server's
/// connection handler feeds it what happens on the socket (a request part decoded, an answer
/// written, the write buffer filling or draining, the node's answer budget, the request deadline,
/// bad HTTP, the end of the connection) and carries out what it answers (handle a part or queue
/// it, read a body or refuse the request, send `100 Continue`, answer 408 or 400, close, hold or
/// issue a read). Pure: no socket, no clock, no I/O; `Part` is whatever the driver queues (the
/// decoder's request parts), kept opaque and in order.
///
/// The states, as the connection goes: `idle` (no part of the next request handled yet: its head
/// may be arriving), `body` (its head is handled, its body is being read), `answering` (the
/// request is whole and being answered), then `idle` again after a keep-alive answer, or
/// `streaming` (an event stream is open), `upgrading` (the answer is `101` and the connection
/// becomes a WebSocket), `closing` (nothing more is taken: a close answer, a refusal, a time-out,
/// bad HTTP, a client too far ahead, a backup), and `closed` once the channel is gone.
///
/// Pipelining: parts that arrive while a request is answered (or the connection is paused) wait
/// in the machine's queue and are taken in order once it can handle them. Past `maxQueuedParts`
/// or `maxQueuedBytes` reads are held until the queue drains; what one read cycle already brought
/// in is still queued, up to `hardQueuedParts` or `hardQueuedBytes`, past which the client is far
/// ahead of its answers and the connection closes. Nothing queued behind a request survives a
/// close answer or an upgrade: those parts are dropped, and parts arriving later are too.
public struct HTTPConnectionMachine<Part> {
    /// The bounds the machine enforces (docs/security.md, "Limits").
    public struct Limits: Sendable, Equatable {
        /// `http.max_body_bytes`: the largest body a request may carry.
        public var maxBodyBytes: Int
        /// Queued parts and body bytes past which reads are held.
        public var maxQueuedParts: Int
        public var maxQueuedBytes: Int
        /// Queued parts past which the connection closes.
        public var hardQueuedParts: Int
        /// Queued body bytes past which the connection closes: a whole body may wait behind the
        /// request being answered, and a little more.
        public var hardQueuedBytes: Int { maxBodyBytes + maxQueuedBytes }

        public init(maxBodyBytes: Int, maxQueuedParts: Int = 64, maxQueuedBytes: Int = 1 << 20, hardQueuedParts: Int = 4_096) {
            self.maxBodyBytes = maxBodyBytes
            self.maxQueuedParts = maxQueuedParts
            self.maxQueuedBytes = maxQueuedBytes
            self.hardQueuedParts = hardQueuedParts
        }
    }

    /// A request whose head was handled and whose body is being read.
    public struct Body: Sendable, Equatable {
        /// The largest body this request may carry (`maxBodyBytes`, or a route's own bound).
        public var limit: Int
        /// Body bytes taken so far (none once it is too large).
        public var received: Int
        /// The body is over `limit` (by its `Content-Length` or by what arrived): the request is
        /// answered 413 at its end, and the connection closes.
        public var tooLarge: Bool

        public init(limit: Int, received: Int, tooLarge: Bool) {
            self.limit = limit
            self.received = received
            self.tooLarge = tooLarge
        }
    }

    public enum State: Sendable, Equatable {
        /// Waiting for the next request (the request deadline runs).
        case idle
        /// Reading a request's body (the request deadline runs).
        case body(Body)
        /// The request is whole and being answered; `closeAfter` when its answer closes the
        /// connection whatever the request asked (a refusal, a 413, a 408).
        case answering(closeAfter: Bool)
        /// An event stream is open: no other request is answered on the connection.
        case streaming
        /// The answer was `101 Switching Protocols`: the connection becomes a WebSocket.
        case upgrading
        /// Nothing more is taken: the connection closes once `answerPending` (if any) is written.
        case closing(answerPending: Bool)
        /// The channel is gone.
        case closed
    }

    public private(set) var state: State = .idle
    public let limits: Limits
    /// The client does not read its answers fast enough (the channel is not writable): nothing
    /// is answered or read until it drains.
    public private(set) var unwritable = false
    /// The node's budget for queued answers is spent while this connection holds some of it:
    /// as `unwritable`, until they drain.
    public private(set) var overBudget = false
    /// A read the channel asked for while reads were held, to issue once they are not.
    public private(set) var readHeld = false
    private var queue: [(part: Part, bytes: Int)] = []
    /// Where the waiting parts start in `queue` (taken ones are removed in batches).
    private var queueStart = 0
    /// Body bytes among the queued parts.
    public private(set) var queuedBytes = 0

    public init(limits: Limits) {
        self.limits = limits
    }

    /// Parts waiting to be handled.
    public var queuedCount: Int { queue.count - queueStart }

    /// A request is being answered or the connection carries a stream: parts wait.
    private var busy: Bool {
        switch state {
        case .idle, .body: false
        case .answering, .streaming, .upgrading, .closing, .closed: true
        }
    }

    /// Nothing more is taken on the connection.
    public var isClosing: Bool {
        switch state {
        case .upgrading, .closing, .closed: true
        case .idle, .body, .answering, .streaming: false
        }
    }

    /// Parts can be handled now (not busy, not paused).
    private var canHandle: Bool { !busy && !unwritable && !overBudget }

    /// Whether the channel's reads are held.
    public var holdsReads: Bool {
        isClosing || unwritable || overBudget || queuedCount >= limits.maxQueuedParts || queuedBytes >= limits.maxQueuedBytes
    }

    /// Whether a part arriving now would be handled at once, unless the node's answer budget
    /// says wait: only then does the driver measure the budget (`budgetMeasured`) before
    /// `arrived`, so a connection that queues anyway costs no measurement.
    public var handlesArrivalNow: Bool { !isClosing && canHandle && queuedCount == 0 }

    // MARK: - Inputs

    /// What to do with a part the decoder produced.
    public enum Arrival: Sendable, Equatable {
        /// Handle it now (`head`, `bodyChunk` or `end`).
        case handle
        /// It waits in the queue (taken later by `nextQueued`).
        case queued
        /// The connection is closing: the part never applies.
        case dropped
        /// The client is too far ahead of its answers: close the connection now (the queue is
        /// dropped).
        case closeTooFarAhead
    }

    /// A part arrived from the decoder; `bodyBytes` is its size when it is a body chunk.
    public mutating func arrived(_ part: Part, bodyBytes: Int) -> Arrival {
        guard !isClosing else { return .dropped }
        if canHandle && queuedCount == 0 { return .handle }
        queue.append((part, bodyBytes))
        queuedBytes += bodyBytes
        if queuedCount > limits.hardQueuedParts || queuedBytes > limits.hardQueuedBytes {
            state = .closing(answerPending: isAnswering)
            dropQueue()
            return .closeTooFarAhead
        }
        return .queued
    }

    private var isAnswering: Bool {
        if case .answering = state { return true }
        return false
    }

    /// What to do with a request head being handled.
    public enum HeadDecision: Sendable, Equatable {
        /// Read the body (none, or up to the limit).
        case readBody
        /// The client waits for `100 Continue` before it sends its body: send it, then read.
        case sendContinue
        /// Answer at once and close (the body is never read): the write was refused from its
        /// head (`refusedAtHead`), or the body is too large and the client waits or the route
        /// never reads one that is (`tooLarge`).
        case refuse(Refusal)
    }

    public enum Refusal: Sendable, Equatable {
        case refusedAtHead
        case tooLarge
    }

    /// A request head is handled. `contentLength` as the client declared it; `bodyLimit` the
    /// route's bound (at most `maxBodyBytes`); `expectsContinue` for an HTTP/1.1
    /// `Expect: 100-continue`; `refusedAtHead` when the driver's authorisation refused the write
    /// from its head; `refusesTooLargeAtOnce` for routes that answer a declared oversized body at
    /// once rather than after it.
    public mutating func head(
        contentLength: Int?, bodyLimit: Int, expectsContinue: Bool, refusedAtHead: Bool = false, refusesTooLargeAtOnce: Bool = false
    ) -> HeadDecision {
        if refusedAtHead {
            state = .answering(closeAfter: true)
            return .refuse(.refusedAtHead)
        }
        let limit = min(bodyLimit, limits.maxBodyBytes)
        let tooLarge = (contentLength ?? 0) > limit
        if tooLarge && (refusesTooLargeAtOnce || expectsContinue) {
            state = .answering(closeAfter: true)
            return .refuse(.tooLarge)
        }
        state = .body(Body(limit: limit, received: 0, tooLarge: tooLarge))
        return expectsContinue ? .sendContinue : .readBody
    }

    public enum BodyDecision: Sendable, Equatable {
        /// Keep the chunk.
        case append
        /// The body just went over its limit: drop what was kept.
        case discard
        /// Not kept (the body is already too large, or no request is being read).
        case ignore
    }

    /// A body chunk of `bytes` is handled.
    public mutating func bodyChunk(bytes: Int) -> BodyDecision {
        guard case .body(var body) = state, !body.tooLarge else { return .ignore }
        if body.received + bytes > body.limit {
            body.tooLarge = true
            body.received = 0
            state = .body(body)
            return .discard
        }
        body.received += bytes
        state = .body(body)
        return .append
    }

    public enum EndDecision: Sendable, Equatable {
        /// The request is whole: answer it (the request deadline stops).
        case dispatch
        /// Its body was too large: answer 413 and close.
        case refuseTooLarge
        /// No request was being read.
        case ignore
    }

    /// The end of a request is handled.
    public mutating func end() -> EndDecision {
        guard case .body(let body) = state else { return .ignore }
        state = .answering(closeAfter: body.tooLarge)
        return body.tooLarge ? .refuseTooLarge : .dispatch
    }

    /// Whether an answer about to be written keeps the connection open: the request wants it
    /// (`wanted`: keep-alive, not a close by the route, the node not stopping) and the machine
    /// does not close (a refusal, or the connection is already closing).
    public func keepsAlive(wanted: Bool) -> Bool {
        guard wanted else { return false }
        switch state {
        case .answering(let closeAfter): return !closeAfter
        case .idle, .body, .streaming: return true
        case .upgrading, .closing, .closed: return false
        }
    }

    public enum AfterAnswer: Sendable, Equatable {
        /// The connection stays open: take queued parts (`nextQueued`).
        case resume
        /// Close once the answer is written; the queue was dropped.
        case close
    }

    /// An answer was written (with `keepAlive` as `keepsAlive` said); `writable` is the
    /// channel's writability after it. The request deadline starts again either way (it also
    /// bounds a closing connection whose client never reads the answer).
    public mutating func answered(keepAlive: Bool, writable: Bool) -> AfterAnswer {
        unwritable = !writable
        if case .closed = state { return .close }
        guard keepAlive else {
            state = .closing(answerPending: false)
            dropQueue()
            return .close
        }
        state = .idle
        return .resume
    }

    /// The answer is an event stream: the connection carries it until it ends.
    public mutating func streamStarted() {
        guard !isClosing else { return }
        state = .streaming
    }

    /// The answer is `101 Switching Protocols`: parts pipelined behind the upgrade request are
    /// dropped (RFC 6455: a client waits for the answer), as is anything arriving later; reads
    /// are held until the WebSocket handlers replace the HTTP ones. Returns how many parts were
    /// dropped.
    @discardableResult
    public mutating func upgradeBegun() -> Int {
        let dropped = queuedCount
        state = .upgrading
        dropQueue()
        return dropped
    }

    /// The answer is a backup streamed to the end of the connection: nothing else is read or
    /// answered.
    public mutating func backupBegun() {
        state = .closing(answerPending: true)
        dropQueue()
    }

    public enum DeadlineDecision: Sendable, Equatable {
        /// Nothing to do (a request is answered, a stream is open, the connection is upgrading or
        /// its answer is still to be written).
        case ignore
        /// Close without an answer (no request under way).
        case close
        /// A request's body did not arrive in time: answer 408 and close.
        case timeOut
    }

    /// The request deadline passed (`request_read_timeout_s` after the connection opened or the
    /// last answer was written).
    public mutating func deadlinePassed() -> DeadlineDecision {
        switch state {
        case .idle, .closing(answerPending: false):
            state = .closing(answerPending: false)
            dropQueue()
            return .close
        case .body:
            state = .answering(closeAfter: true)
            dropQueue()
            return .timeOut
        case .answering, .streaming, .upgrading, .closing(answerPending: true), .closed:
            return .ignore
        }
    }

    public enum ErrorDecision: Sendable, Equatable {
        /// Answer 400 and close.
        case badRequest
        /// Just close.
        case close
    }

    /// The decoder failed: `badHTTP` for a parse error on an open channel. Bad HTTP is answered
    /// 400 when no answer is under way (idle, or reading a body); otherwise the connection just
    /// closes, as it does for any other error.
    public mutating func failed(badHTTP: Bool) -> ErrorDecision {
        let answerable: Bool
        switch state {
        case .idle, .body: answerable = badHTTP
        case .answering, .streaming, .upgrading, .closing, .closed: answerable = false
        }
        if case .closed = state {} else { state = .closing(answerPending: isAnswering) }
        dropQueue()
        return answerable ? .badRequest : .close
    }

    /// The channel's writability changed; true when the connection may resume.
    public mutating func writabilityChanged(writable: Bool) -> Bool {
        unwritable = !writable
        return writable
    }

    /// The driver measured this connection's queued answers against the node's budget; true
    /// when a pause begins (it was not paused).
    public mutating func budgetMeasured(waits: Bool) -> Bool {
        defer { overBudget = waits }
        return waits && !overBudget
    }

    /// The connection's queued answers drained while it was paused by the budget; true when it
    /// may resume.
    public mutating func budgetResumable() -> Bool {
        guard overBudget else { return false }
        overBudget = false
        return true
    }

    /// The channel asks to read; true to pass the read on, false when it is held (issued later by
    /// `resumed`).
    public mutating func readRequested() -> Bool {
        if holdsReads {
            readHeld = true
            return false
        }
        return true
    }

    /// The next queued part to handle now, in order; nil while the connection is busy, paused or
    /// closing, or nothing waits.
    public mutating func nextQueued() -> Part? {
        guard canHandle, queueStart < queue.count else { return nil }
        let next = queue[queueStart]
        queueStart += 1
        queuedBytes -= next.bytes
        return next.part
    }

    /// After taking what could be taken: whether a held read is to be issued now.
    public mutating func resumed() -> Bool {
        if queuedCount == 0 && !queue.isEmpty {
            queue.removeAll(keepingCapacity: queue.count <= limits.maxQueuedParts)
            queueStart = 0
        }
        guard readHeld, !holdsReads else { return false }
        readHeld = false
        return true
    }

    /// The channel is gone.
    public mutating func inactive() {
        state = .closed
        dropQueue()
    }

    private mutating func dropQueue() {
        queue = []
        queueStart = 0
        queuedBytes = 0
    }
}
