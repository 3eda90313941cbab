public import BanyanTree

/// One WebSocket connection speaking the protocol v5, as a pure state machine (docs/realtime.md,
/// "SessionCore"): frames in, actions out. It reassembles and reads messages, answers pings,
/// hands every request to the node as an action, and sends the answers in the order the
/// requests arrived, each exactly once. The node reports back (a listen's initial data pushed, a
/// write decided, a read done) and the core releases answers as their turn comes. No I/O, no
/// clock: the driver (an event-loop handler) performs the actions.
public struct SessionCore: Sendable {
    public struct Limits: Sendable, Equatable {
        /// Listens one connection may hold (a further listen is refused with `failure`).
        public var maxListens: Int
        /// Unanswered requests at which the driver stops reading the connection
        /// (`pauseReading`), until half of them are answered (`resumeReading`). The SDKs send
        /// every write at once and resend all unacknowledged ones after a reconnect, so a busy
        /// client is slowed, never disconnected, by this.
        public var readPauseRequests: Int
        /// Unanswered requests past which the connection closes: only a client that ignores the
        /// pause (frames already in flight) can get there.
        public var maxPendingRequests: Int
        public var frames: FrameAssembler.Limits
        /// Keep-alive (docs/realtime.md): after this long with nothing heard from the client, the
        /// driver sends WebSocket pings (every SDK's WebSocket layer answers them), one per
        /// `pingIntervalMillis`; the connection ends when nothing at all is heard for
        /// `pongTimeoutMillis` after the first of them. Silence alone never ends a connection
        /// whose pongs come back.
        public var keepAliveIdleMillis: Int64
        public var pingIntervalMillis: Int64
        public var pongTimeoutMillis: Int64

        public init(
            maxListens: Int = 10_000, readPauseRequests: Int = 1_000, maxPendingRequests: Int = 100_000,
            frames: FrameAssembler.Limits = FrameAssembler.Limits(), keepAliveIdleMillis: Int64 = 45_000, pingIntervalMillis: Int64 = 15_000,
            pongTimeoutMillis: Int64 = 60_000
        ) {
            self.maxListens = maxListens
            self.readPauseRequests = readPauseRequests
            self.maxPendingRequests = maxPendingRequests
            self.frames = frames
            self.keepAliveIdleMillis = keepAliveIdleMillis
            self.pingIntervalMillis = pingIntervalMillis
            self.pongTimeoutMillis = pongTimeoutMillis
        }
    }

    /// A listen as the node knows it: unique per session, never reused.
    public struct ListenID: Hashable, Sendable, Comparable, CustomStringConvertible {
        public let raw: Int
        public static func < (a: ListenID, b: ListenID) -> Bool { a.raw < b.raw }
        public var description: String { "listen \(raw)" }
    }

    /// A write the node orders in the log, in the order the connection sent them.
    public enum Write: Sendable, Equatable {
        case put(WritePath, RawValue, hash: String?)
        case merge(Path, RawValue)
        case onDisconnectPut(WritePath, RawValue)
        case onDisconnectMerge(Path, RawValue)
        case onDisconnectCancel(Path)
    }

    public enum Output: Sendable, Equatable {
        /// One message for the client (the driver splits it into frames with `FrameSplitter`).
        case send([UInt8])
        /// Start a listen: the node pushes its initial data, then calls `listenStarted` (or
        /// `listenFailed`), and from then on pushes its changes.
        case listen(ListenID, ListenSpec)
        /// Stop pushing for this listen.
        case unlisten(ListenID)
        /// A one-shot read; the node calls `answer(request:…)`.
        case get(request: Int64, path: Path, query: JSONValue?)
        /// A write, in the connection's order; the node calls `answer(request:…)` once decided.
        /// `client`: the SDK's own number for it (exactly-once across connections), if it sent one.
        case write(request: Int64, Write, client: ClientWriteNumber?)
        /// Credentials to check; the node calls `answer(request:…)` with the claims or a failure.
        case authenticate(request: Int64, Credential, google: Bool)
        /// The client dropped its credentials.
        case unauthenticate
        /// Counters the SDK reported (for metrics).
        case stats([(String, Int64)])
        /// Stop reading the connection: too many of its requests are unanswered.
        case pauseReading
        /// Read it again.
        case resumeReading
        /// Close the connection (after sending what was output before), for this reason.
        case close(reason: String)
        /// Send a WebSocket ping frame (keep-alive).
        case ping

        public static func == (a: Output, b: Output) -> Bool {
            switch (a, b) {
            case let (.send(x), .send(y)): return x == y
            case let (.listen(i, s), .listen(j, t)): return i == j && s == t
            case let (.unlisten(i), .unlisten(j)): return i == j
            case let (.get(r, p, q), .get(r2, p2, q2)): return r == r2 && p == p2 && q == q2
            case let (.write(r, w, c), .write(r2, w2, c2)): return r == r2 && w == w2 && c == c2
            case let (.authenticate(r, c, g), .authenticate(r2, c2, g2)): return r == r2 && c == c2 && g == g2
            case (.unauthenticate, .unauthenticate), (.pauseReading, .pauseReading), (.resumeReading, .resumeReading), (.ping, .ping): return true
            case let (.stats(x), .stats(y)): return x.count == y.count && zip(x, y).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
            case let (.close(x), .close(y)): return x == y
            default: return false
            }
        }
    }

    /// A listen's key: its location and its query (the tag is per query; a default listen has
    /// none). An unlisten names the same pair. The query is compared by its canonical bytes
    /// (members sorted by their keys' bytes, as JS identifies queries), so the order a client
    /// serialised it in does not matter and keys are never compared by canonical equivalence.
    struct ListenKey: Hashable {
        let path: Path
        let query: [UInt8]
        init(_ spec: ListenSpec) {
            path = spec.path
            query = spec.query?.canonicalBytes ?? []
        }
    }

    public let limits: Limits
    public private(set) var isClosed = false
    private var assembler: FrameAssembler
    /// Bytes held of a message arriving in several frames (`FrameAssembler.heldBytes`).
    public var assemblingBytes: Int { assembler.heldBytes }
    /// Requests in arrival order, each with its answer once known: answers leave from the front
    /// only, so they reach the client in request order.
    private var pending: [(request: Int64, answer: [UInt8]?)] = []
    private var pendingStart = 0
    /// Where each unanswered request sits in `pending`.
    private var slots: [Int64: Int] = [:]
    private var listens: [ListenKey: ListenID] = [:]
    private var listenSpecs: [ListenID: (key: ListenKey, spec: ListenSpec)] = [:]
    /// Listens whose initial data is not yet pushed: the request waiting for it.
    private var starting: [ListenID: Int64] = [:]
    /// The requests of `starting`: answered only through `listenStarted` or `listenFailed`.
    private var listenRequests: Set<Int64> = []
    private var readingPaused = false
    private var nextListen = 1
    /// Keep-alive: when anything (a frame, a pong) last came from the client, and when the first
    /// ping of the current silence went out and the last one did.
    /// Nil until the first `heard` or `tick` (the driver's clock starts there).
    private var lastHeard: Int64?
    private var silenceProbedSince: Int64?
    private var lastPing: Int64?

    /// The session opens: the hello goes first (the client sends nothing before it).
    public init(timestamp: Int64, host: String, sessionID: String, limits: Limits = Limits()) {
        self.limits = limits
        assembler = FrameAssembler(limits: limits.frames)
        hello = ServerMessage.hello(timestamp: timestamp, host: host, session: sessionID)
    }

    /// The first message to send.
    public let hello: [UInt8]

    /// Listens the connection holds.
    public var listenCount: Int { listens.count }
    /// Requests received and not yet answered.
    public var unansweredCount: Int { slots.count }

    // MARK: - Keep-alive

    /// The driver heard from the client at `now` (ms, its monotonic clock): any frame, or a
    /// WebSocket pong.
    public mutating func heard(at now: Int64) {
        lastHeard = max(lastHeard ?? now, now)
        silenceProbedSince = nil
    }

    /// The driver's timer, at least once per `pingIntervalMillis`: pings while the client is
    /// silent, and the end of the connection when even pongs have stopped.
    public mutating func tick(now: Int64) -> [Output] {
        guard let heard = lastHeard else {
            lastHeard = now
            return []
        }
        // While reading is paused (too many unanswered requests) nothing the client sends, pongs
        // included, is read: silence then proves nothing, and the clock starts again.
        if readingPaused {
            lastHeard = now
            silenceProbedSince = nil
            return []
        }
        guard !isClosed, now &- heard >= limits.keepAliveIdleMillis else { return [] }
        if let since = silenceProbedSince, now &- since >= limits.pongTimeoutMillis {
            return close("keep-alive timeout: nothing heard for \(now &- heard) ms, pings unanswered")
        }
        if let last = lastPing, now &- last < limits.pingIntervalMillis { return [] }
        if silenceProbedSince == nil { silenceProbedSince = now }
        lastPing = now
        return [.ping]
    }

    // MARK: - From the client

    /// One text frame from the client.
    public mutating func receive(frame: [UInt8]) -> [Output] {
        guard !isClosed else { return [] }
        let received: FrameAssembler.Received
        do {
            received = try assembler.receive(frame)
        } catch {
            return close("\(error)")
        }
        switch received {
        case .keepAlive, .partial:
            return []
        case .tooLarge(let prefix, let which):
            guard let number = MessageReader.requestNumber(inPrefix: prefix) else {
                return [.send(ServerMessage.error("message dropped: \(which)"))]
            }
            var out: [Output] = []
            if let refusal = admit(number, &out) { return refusal }
            answer(number, ServerMessage.failure(number, status: "too_big", reason: "\(which)"), &out)
            return out
        case .message(let bytes):
            return handle(bytes)
        }
    }

    /// The connection ended (closed by the client, a socket error, a keep-alive timeout): every
    /// listen stops. Nothing more is sent.
    public mutating func ended() -> [Output] {
        guard !isClosed else { return [] }
        isClosed = true
        return listens.values.sorted().map { .unlisten($0) }
    }

    private mutating func handle(_ bytes: [UInt8]) -> [Output] {
        let message: ClientMessage
        do {
            message = try MessageReader.read(bytes)
        } catch {
            guard let number = error.request else {
                // Nothing to answer: say why in the log the SDK keeps, and close.
                var out: [Output] = [.send(ServerMessage.error(error.message))]
                out += close(error.message)
                return out
            }
            var out: [Output] = []
            if let refusal = admit(number, &out) { return refusal }
            answer(number, ServerMessage.failure(number, status: error.status, reason: error.message), &out)
            return out
        }
        switch message {
        case .ping:
            return [.send(ServerMessage.pong())]
        case .control:
            return []
        case .request(let request):
            return handle(request)
        }
    }

    private mutating func handle(_ request: Request) -> [Output] {
        let number = request.number
        var out: [Output] = []
        if let refusal = admit(number, &out) { return refusal }
        switch request.action {
        case .stats(let counters):
            out.append(.stats(counters))
            answer(number, ServerMessage.ok(number), &out)
        case .listen(let spec):
            let key = ListenKey(spec)
            if let old = listens[key] {
                // The same location and query again: the new listen replaces the old.
                forgetListen(old)
                if let waiting = starting.removeValue(forKey: old) {
                    listenRequests.remove(waiting)
                    answer(waiting, ServerMessage.failure(waiting, status: "failure", reason: "replaced by a later listen of the same query"), &out)
                }
                out.append(.unlisten(old))
            }
            guard listens.count < limits.maxListens else {
                answer(number, ServerMessage.failure(number, status: "failure", reason: "too many listens on one connection (the limit is \(limits.maxListens))"), &out)
                return out
            }
            let id = ListenID(raw: nextListen)
            nextListen += 1
            listens[key] = id
            listenSpecs[id] = (key, spec)
            starting[id] = number
            listenRequests.insert(number)
            out.append(.listen(id, spec))
        case .unlisten(let spec):
            if let id = listens[ListenKey(spec)] {
                forgetListen(id)
                if let waiting = starting.removeValue(forKey: id) {
                    listenRequests.remove(waiting)
                    answer(waiting, ServerMessage.failure(waiting, status: "failure", reason: "unlistened before it started"), &out)
                }
                out.append(.unlisten(id))
            }
            answer(number, ServerMessage.ok(number), &out)
        case .get(let path, let query):
            out.append(.get(request: number, path: path, query: query))
        case .put(let path, let data, let hash):
            out.append(.write(request: number, .put(path, data, hash: hash), client: request.clientWrite))
        case .merge(let path, let data):
            out.append(.write(request: number, .merge(path, data), client: request.clientWrite))
        case .onDisconnectPut(let path, let data):
            out.append(.write(request: number, .onDisconnectPut(path, data), client: nil))
        case .onDisconnectMerge(let path, let data):
            out.append(.write(request: number, .onDisconnectMerge(path, data), client: nil))
        case .onDisconnectCancel(let path):
            out.append(.write(request: number, .onDisconnectCancel(path), client: nil))
        case .auth(let credential):
            out.append(.authenticate(request: number, credential, google: false))
        case .googleAuth(let credential):
            out.append(.authenticate(request: number, credential, google: true))
        case .unauth:
            out.append(.unauthenticate)
            answer(number, ServerMessage.response(number, status: "ok", data: Array(#""unauthenticated""#.utf8)), &out)
        case .appCheck, .dropAppCheck:
            answer(number, ServerMessage.ok(number), &out)
        }
        return out
    }

    // MARK: - From the node

    /// The listen's initial data has been pushed: its `ok` may go (in its turn).
    public mutating func listenStarted(_ id: ListenID, warnings: [String] = []) -> [Output] {
        guard !isClosed, let number = starting.removeValue(forKey: id) else { return [] }
        listenRequests.remove(number)
        var out: [Output] = []
        // `w`: warnings the SDKs log (`no_index`: a query without a declared `.indexOn`).
        let data: JSONValue = warnings.isEmpty ? .object([]) : .object([("w", .array(warnings.map { .string($0) }))])
        answer(number, ServerMessage.ok(number, data: data), &out)
        return out
    }

    /// The listen could not start (permission denied, a query the node refuses): nothing was
    /// pushed, and the listen is gone.
    public mutating func listenFailed(_ id: ListenID, status: String, reason: String) -> [Output] {
        guard !isClosed, let number = starting.removeValue(forKey: id) else { return [] }
        listenRequests.remove(number)
        forgetListen(id)
        var out: [Output] = []
        answer(number, ServerMessage.failure(number, status: status, reason: reason), &out)
        return out
    }

    /// A started listen is no longer allowed (rules changed, credentials revoked): the client
    /// is told with a `c` push and drops it without an unlisten, so it is forgotten here.
    public mutating func listenRevoked(_ id: ListenID) -> [Output] {
        guard !isClosed, starting[id] == nil, let (_, spec) = listenSpecs[id] else { return [] }
        forgetListen(id)
        return [.unlisten(id), .send(ServerMessage.listenRevoked(path: spec.path, query: spec.query))]
    }

    /// The answer to a get, write or authentication: `status` "ok" with its data (already
    /// rendered JSON), or a failure status with a reason. A request already answered, or a
    /// listen's (answered through `listenStarted`), is ignored.
    public mutating func answer(request number: Int64, status: String, data: [UInt8]) -> [Output] {
        guard !isClosed, slots[number] != nil, !listenRequests.contains(number) else { return [] }
        var out: [Output] = []
        answer(number, ServerMessage.response(number, status: status, data: data), &out)
        return out
    }

    // MARK: - Answer order

    /// Takes a request into the answer queue, or says why the connection closes instead.
    private mutating func admit(_ number: Int64, _ out: inout [Output]) -> [Output]? {
        if slots[number] != nil {
            // A number still unanswered is used again: the client is broken; answers would be ambiguous.
            return close("request number \(number) reused while unanswered")
        }
        if slots.count >= limits.maxPendingRequests {
            return close("more than \(limits.maxPendingRequests) requests unanswered")
        }
        slots[number] = pending.count
        pending.append((number, nil))
        if !readingPaused, slots.count >= limits.readPauseRequests {
            readingPaused = true
            out.append(.pauseReading)
        }
        return nil
    }

    private mutating func forgetListen(_ id: ListenID) {
        if let (key, _) = listenSpecs.removeValue(forKey: id), listens[key] == id { listens[key] = nil }
    }

    /// Records the answer to `number` and sends every answer now at the front, in order.
    private mutating func answer(_ number: Int64, _ message: [UInt8], _ out: inout [Output]) {
        guard let slot = slots[number], pending[slot].answer == nil else { return }
        pending[slot].answer = message
        while pendingStart < pending.count, let ready = pending[pendingStart].answer {
            out.append(.send(ready))
            slots[pending[pendingStart].request] = nil
            pendingStart += 1
        }
        if pendingStart == pending.count {
            pending.removeAll(keepingCapacity: true)
            pendingStart = 0
        } else if pendingStart > 1024, pendingStart * 2 > pending.count {
            // Drop the answered front so memory follows what is unanswered.
            pending.removeFirst(pendingStart)
            for (i, entry) in pending.enumerated() { slots[entry.request] = i }
            pendingStart = 0
        }
        if readingPaused, slots.count <= limits.readPauseRequests / 2 {
            readingPaused = false
            out.append(.resumeReading)
        }
    }

    private mutating func close(_ reason: String) -> [Output] {
        var out: [Output] = []
        if !isClosed {
            isClosed = true
            out += listens.values.sorted().map { .unlisten($0) }
        }
        out.append(.close(reason: reason))
        return out
    }
}
