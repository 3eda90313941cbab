import BanyanBasics
import BanyanAuth
import BanyanListen
import BanyanRaft
import BanyanNode
import BanyanOpLogFiles
import BanyanQuery
import BanyanREST
import BanyanSession
import BanyanReplica
import BanyanRules
import BanyanStateMachine
import BanyanTree
import Foundation
import Logging
import Metrics
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket
import Prometheus
import Synchronization

/// The client-facing HTTP server (docs/server.md, "Client API"): the Firebase REST API and its
/// Server-Sent-Events streams on every node, plus operator endpoints under `/.banyan/` and
/// Prometheus metrics at `/metrics`.
final class HTTPServer: Sendable {
    let runtime: NodeRuntime
    let config: NodeConfig
    let logger: Logger
    let registry: PrometheusCollectorRegistry
    private let pushIDs: Mutex<PushIDGenerator>
    private let connections = Atomic<Int>(0)
    private let channel = Mutex<(any Channel)?>(nil)

    let requests = Counter(label: "banyan_http_requests_total")
    /// A backup is being streamed from this node (`GET /.banyan/backup`; one at a time).
    let backupRunning = Atomic<Bool>(false)
    /// Answers written (for tests and status: how far a connection got).
    let answers = Atomic<Int>(0)
    /// Requests whose head arrived and whose answer is not yet written (an event stream, an
    /// upgrade or a backup counts until it starts): what a stopping node waits for.
    let requestsInFlight = Atomic<Int>(0)
    /// The node is stopping (`stopAccepting`): every answer closes its connection.
    let stopping = Atomic<Bool>(false)
    let refused = Counter(label: "banyan_http_refused_connections_total")
    let streamsOpen = Gauge(label: "banyan_sse_streams")
    let latency: Metrics.Timer = Metrics.Timer(label: "banyan_http_request_duration_seconds")
    private let openStreams = Atomic<Int>(0)
    /// Connections and event streams by client address (the per-client caps, issue 18).
    struct ClientLoad {
        var connections = 0
        var streams = 0
    }
    private let perClient = Mutex<[String: ClientLoad]>([:])
    let refusedStreams = Counter(label: "banyan_http_refused_streams_total")

    /// The client's address as the caps count it (its IP; one bucket for unknown ones).
    static func clientKey(_ address: SocketAddress?) -> String { address?.ipAddress ?? "?" }

    /// Counts one more of `what` for `client`; false (nothing counted) when it is at `cap`.
    private func admit(_ client: String, _ what: WritableKeyPath<ClientLoad, Int>, cap: Int) -> Bool {
        perClient.withLock { table in
            var entry = table[client] ?? ClientLoad()
            guard entry[keyPath: what] < cap else { return false }
            entry[keyPath: what] += 1
            table[client] = entry
            return true
        }
    }

    private func release(_ client: String, _ what: WritableKeyPath<ClientLoad, Int>) {
        perClient.withLock { table in
            guard var entry = table[client] else { return }
            entry[keyPath: what] -= 1
            table[client] = entry.connections <= 0 && entry.streams <= 0 ? nil : entry
        }
    }

    func admitConnection(from client: String) -> Bool { admit(client, \.connections, cap: config.http.maxConnectionsPerClient) }
    func connectionClosed(from client: String) { release(client, \.connections) }
    func admitStream(from client: String) -> Bool { admit(client, \.streams, cap: config.http.maxStreamsPerClient) }
    func streamEnded(from client: String) { release(client, \.streams) }

    /// The operator token (`admin_token_file`), if one is configured.
    let adminToken: String?
    /// The node's certificates, for `/.banyan/tls` and the status (nil in tests without one).
    let tls: NodeTLS?

    /// Who presented credentials name: development settings and verified tokens.
    let credentials: Credentials
    /// The built-in account service (docs/accounts.md).
    let accounts: AccountService

    init(
        runtime: NodeRuntime, config: NodeConfig, logger: Logger, registry: PrometheusCollectorRegistry, adminToken: String? = nil,
        verifier: TokenVerifier? = nil, serviceAccounts: ServiceAccounts? = nil, tls: NodeTLS? = nil, identityProviders: [String: OIDCProvider] = [:]
    ) {
        self.tls = tls
        self.runtime = runtime
        self.config = config
        self.adminToken = adminToken
        var credentials = Credentials(development: config.development, verifier: verifier)
        credentials.serviceAccounts = serviceAccounts
        credentials.accountKey = { [runtime] kid, now in runtime.accountKey(kid, now: now) }
        credentials.accountProjects = config.accounts.servedProjects
        credentials.skew = Int64(config.auth.clockSkewSeconds) * 1000
        self.credentials = credentials
        self.accounts = AccountService(
            runtime: runtime, config: config, credentials: credentials, adminToken: adminToken, identityProviders: identityProviders, logger: logger)
        self.logger = logger
        self.registry = registry
        self.assembling = ByteBudget(limit: config.http.maxAssemblingBytes)
        self.queuedAnswerBudget = ByteBudget(
            limit: config.http.maxQueuedAnswerBytes, gauge: Gauge(label: "banyan_http_queued_answer_bytes"))
        self.pushIDs = Mutex(PushIDGenerator(random: SeededRandom(seed: UInt64.random(in: 1...UInt64.max))))
    }

    /// The client port's TLS (HTTPS and WSS), when `http.tls_cert` and `http.tls_key` are set:
    /// what new connections use (`NodeTLS` loads it, and swaps it on a reload).
    let https = Mutex<NIOSSLContext?>(nil)

    func start(group: any EventLoopGroup) throws -> SocketAddress? {
        if https.withLock({ $0 }) != nil { logger.info("client port serves HTTPS and WSS", metadata: ["cert": "\(config.http.tlsCertificate ?? "")"]) }
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelInitializer { channel in AcceptErrorReporter.install(on: channel, listener: "client", logger: self.logger) }
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelOption(.maxMessagesPerRead, value: 16)
            // Writability (checked by event streams) turns off past the stream buffer limit.
            .childChannelOption(.writeBufferWaterMark, value: .init(low: StreamState.maxQueuedBytes / 2, high: StreamState.maxQueuedBytes))
            .childChannelInitializer { channel in
                let count = self.connections.wrappingAdd(1, ordering: .relaxed).newValue
                channel.closeFuture.whenComplete { _ in self.connections.wrappingSubtract(1, ordering: .relaxed) }
                guard count <= self.config.http.maxConnections else {
                    self.refused.increment()
                    return channel.close()
                }
                let client = Self.clientKey(channel.remoteAddress)
                guard self.admitConnection(from: client) else {
                    self.refused.increment()
                    return channel.close()
                }
                channel.closeFuture.whenComplete { _ in self.connectionClosed(from: client) }
                return channel.eventLoop.makeCompletedFuture {
                    // TLS first when configured (HTTPS and WSS); the request deadline below also
                    // bounds a handshake that never finishes.
                    if let tls = self.https.withLock({ $0 }) { try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls)) }
                    // Two handlers: NIO's request decoder (llhttp) and ours, which writes its
                    // answers as bytes (HTTPResponseWriter) and holds pipelined requests itself:
                    // no response encoder, pipelining or error handler to pass on every write.
                    // No idle-state handler: the request deadline closes idle connections too.
                    try channel.pipeline.syncOperations.addHandler(
                        ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .dropBytes)), name: HTTPConnectionHandler.decoderName)
                    try channel.pipeline.syncOperations.addHandler(HTTPConnectionHandler(server: self), name: HTTPConnectionHandler.handlerName)
                }
            }
        accounts.start()
        // The lease first: no connection may open under no holder.
        let loop = group.next()
        startLease(on: loop)
        runtime.connectionsEnded.withLock { $0 = { [weak self] ended in self?.realtimeEnded(ended) } }
        runtime.rulesChanged.withLock {
            $0 = { [weak self] in
                guard let self else { return }
                // Listens and streams that the new rules no longer allow are cancelled.
                for hub in self.hubs.withLock({ Array($0.values) }) { hub.loop.execute { hub.rulesChanged() } }
            }
        }
        runtime.connectionsRestored.withLock {
            $0 = { [weak self] ended in
                guard let self else { return }
                self.realtimeEnded(self.realtime.withLock { Array($0.keys) }.filter(ended))
            }
        }
        let ch = try bootstrap.bind(host: config.clientAddress.host, port: config.clientAddress.port).wait()
        channel.withLock { $0 = ch }
        if var published = config.publishedClientAddress {
            // Port 0 (tests): the port the system chose.
            if published.port == 0, config.advertisedClientAddress == nil, let port = ch.localAddress?.port { published.port = port }
            ownClientAddress.withLock { $0 = published.description }
            publishClientAddress(published.description, loop: loop, attempt: 0)
        }
        return ch.localAddress
    }

    /// Publishes this node's client address for other nodes' drains (`$cluster/clients/<id>`),
    /// retried every 2 s until it is there (a node starts before it knows a leader).
    private func publishClientAddress(_ address: String, loop: any EventLoop, attempt: Int) {
        runtime.publishClientAddress(address) { [weak self] done in
            guard !done, let self, self.channel.withLock({ $0?.isActive }) == true else { return }
            if attempt == 30 { self.logger.warning("could not publish this node's client address yet; retrying", metadata: ["address": "\(address)"]) }
            loop.scheduleTask(in: .seconds(2)) { self.publishClientAddress(address, loop: loop, attempt: attempt + 1) }
        }
    }

    /// The first step of a graceful stop: the listening socket closes (new clients are refused
    /// and go to another node), and answers from now on close their connections, so no client
    /// sends another request on one. Requests already read go on.
    ///
    /// Closing a listening socket resets the connections the kernel completed but the node had
    /// not accepted yet: clients that may have sent a request would see it fail with nothing
    /// read. So, on Linux, the socket first drops new connection attempts (a socket filter that
    /// drops every packet: their SYNs go unanswered, are retried after a second and are refused
    /// by then), the node accepts what is already queued (the accept queue's length is the
    /// listener's `tcpi_unacked`) and serves it, and only then closes (docs/server.md,
    /// "Stopping"). `within` bounds that wait.
    var isStopping: Bool { stopping.load(ordering: .relaxed) }

    func stopAccepting(within: Duration = .seconds(2)) {
        stopping.store(true, ordering: .releasing)
        guard let ch = channel.withLock({ $0 }) else { return }
        if let provider = ch as? any SocketOptionProvider, Self.dropNewConnections(provider) {
            let deadline = ContinuousClock.now + within
            var drained = false
            // Handshakes under way when the filter went on complete (their last ACK passes) and
            // join the queue a moment later: the queue must be found empty twice, 20 ms apart.
            var emptySince: ContinuousClock.Instant?
            while ContinuousClock.now < deadline {
                guard let info = try? provider.getTCPInfo().wait() else { break }
                if info.tcpi_unacked == 0 {
                    let now = ContinuousClock.now
                    if let since = emptySince, now - since >= .milliseconds(20) {
                        drained = true
                        break
                    }
                    if emptySince == nil { emptySince = now }
                } else {
                    emptySince = nil
                }
                Thread.sleep(forTimeInterval: 0.002)
            }
            if !drained { logger.warning("stopping: the accept queue did not empty in time; connections still queued are reset", metadata: ["within": "\(within)"]) }
        }
        try? ch.close().wait()
    }

    /// Attaches a classic BPF program to the listening socket that drops new connection requests
    /// (TCP segments with SYN and without ACK) and passes everything else: no new connection
    /// starts, and a handshake already under way completes (its last ACK passes) and joins the
    /// queue, to be accepted and answered. (Dropping every segment, as this did first, left such
    /// handshakes half done; their clients' requests were reset when the listener closed: one
    /// in a CI run under load.) The filter sees the segment from its TCP header on, so byte 13
    /// holds the flags.
    static func dropNewConnections(_ provider: any SocketOptionProvider) -> Bool {
        #if os(Linux)
        // struct sock_filter { u16 code; u8 jt; u8 jf; u32 k }; jumps count from the next one.
        let instructions: [(code: UInt16, jt: UInt8, jf: UInt8, k: UInt32)] = [
            (0x30, 0, 0, 13),  // ldb [13]: A = the TCP flags
            (0x45, 0, 2, 0x02),  // jset #SYN: no → accept
            (0x45, 1, 0, 0x10),  // jset #ACK: yes (a handshake's second step) → accept
            (0x06, 0, 0, 0),  // ret #0: drop
            (0x06, 0, 0, 0xFFFF_FFFF),  // ret #-1: accept
        ]
        let bytes = UnsafeMutableRawPointer.allocate(byteCount: 8 * instructions.count, alignment: 8)
        defer { bytes.deallocate() }
        for (i, instruction) in instructions.enumerated() {
            let at = bytes + 8 * i
            at.storeBytes(of: instruction.code.littleEndian, as: UInt16.self)
            at.storeBytes(of: instruction.jt, toByteOffset: 2, as: UInt8.self)
            at.storeBytes(of: instruction.jf, toByteOffset: 3, as: UInt8.self)
            at.storeBytes(of: instruction.k.littleEndian, toByteOffset: 4, as: UInt32.self)
        }
        // struct sock_fprog { unsigned short len; struct sock_filter *filter }.
        let program = SocketFilterProgram(length: UInt16(instructions.count), filter: bytes)
        do {
            try provider.unsafeSetSocketOption(
                level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(26 /* SO_ATTACH_FILTER */), value: program
            ).wait()
            return true
        } catch {
            return false
        }
        #else
        return false
        #endif
    }

    func shutdown() {
        stopLease()
        accounts.shutdown()
        let ch = channel.withLock { $0 }
        try? ch?.close().wait()
    }

    func nextPushID() -> String {
        let now = NodeRuntime.wallClock()
        return pushIDs.withLock { $0.next(now: now) }
    }

    // MARK: - Realtime connections (docs/realtime.md)

    /// One listen hub per event loop, made on first use.
    private let hubs = Mutex<[ObjectIdentifier: RealtimeHub]>([:])
    /// Open realtime connections by their client session (for `ls`: a reconnect closes the
    /// previous connection when it is still open here).
    private let realtime = Mutex<[UInt64: (channel: any Channel, holder: UInt64)]>([:])
    let realtimeOpen = Gauge(label: "banyan_realtime_connections")
    private let realtimeCount = Atomic<Int>(0)
    private let sessionIDs = Mutex(SeededRandom(seed: UInt64.random(in: 1...UInt64.max)))

    /// This node's lease on its realtime connections (docs/realtime.md, "Node leases").
    private let lease = Mutex<LeaseHolder?>(nil)
    private let leaseTask = Mutex<RepeatedTask?>(nil)
    /// The namespace lease commands are written in (no tree, no listeners).
    static let leaseNamespace = "$leases"

    /// The holder id new onDisconnect registrations name.
    func leaseHolder() -> UInt64 { lease.withLock { $0?.holder ?? 0 } }

    /// Starts renewing the lease (once a second: `LeaseHolder` decides when to renew or fence).
    func startLease(on loop: any EventLoop) {
        let now = RealtimeSessionHandler.now()
        let holder = sessionIDs.withLock { $0.next() }
        lease.withLock { $0 = LeaseHolder(holder: holder, now: now) }
        leaseLoop.withLock { $0 = loop }
        let task = loop.scheduleRepeatedTask(initialDelay: .seconds(1), delay: .seconds(1)) { _ in self.leaseTick(loop: loop) }
        leaseTask.withLock { $0 = task }
    }

    private func leaseTick(loop: any EventLoop) {
        let now = RealtimeSessionHandler.now()
        let connections = realtimeCount.load(ordering: .relaxed)
        let actions = lease.withLock { holder -> [LeaseHolder.Action] in
            guard holder != nil else { return [] }
            return holder?.tick(now: now, connections: connections) { self.sessionIDs.withLock { $0.next() } } ?? []
        }
        for action in actions { perform(action, loop: loop) }
        closeStale()
    }

    /// Closes every connection opened under another holder than the current one. Run after every
    /// change of holder (a fence, an idle rotation, a release): with the registration check in
    /// `realtimeOpened`, no connection stays open under a holder nothing renews.
    private func closeStale() {
        let current = leaseHolder()
        let stale = realtime.withLock { table in table.values.filter { $0.holder != current }.map(\.channel) }
        for channel in stale { channel.close(promise: nil) }
    }

    private func perform(_ action: LeaseHolder.Action, loop: any EventLoop) {
        switch action {
        case let .renew(holder, number):
            runtime.write(namespace: Self.leaseNamespace, command: .renewLease(holder: holder, node: config.nodeID), on: loop) { result in
                guard case .success(let applied) = result else { return }  // lost: the next renewal follows
                if applied.outcome == .ok {
                    self.lease.withLock { $0?.renewed(holder: holder, number: number) }
                } else if case .refused = applied.outcome {
                    let now = RealtimeSessionHandler.now()
                    let fence = self.lease.withLock { l in l?.refused(holder: holder, now: now) { self.sessionIDs.withLock { $0.next() } } }
                    if let fence { self.perform(fence, loop: loop) }
                }
            }
        case let .fence(reason, holder):
            let channels = realtime.withLock { $0.values.map(\.channel) }
            logger.warning(
                "closing every realtime connection: \(reason)",
                metadata: ["connections": "\(channels.count)", "new_holder": "\(String(holder, radix: 16))"])
            leaseFences.increment()
            for channel in channels { channel.close(promise: nil) }
            closeStale()
        }
    }

    let leaseFences = Counter(label: "banyan_realtime_lease_fences_total")

    /// Lets lease holder `holder` go if it is still the current one (see `LeaseHolder.release`).
    func releaseLease(_ holder: UInt64, reason: String) {
        let now = RealtimeSessionHandler.now()
        let action = lease.withLock { l -> LeaseHolder.Action? in
            guard l?.holder == holder else { return nil }
            return l?.release(reason: reason, now: now) { self.sessionIDs.withLock { $0.next() } }
        }
        if let action, let loop = leaseLoop.withLock({ $0 }) { perform(action, loop: loop) }
    }
    private let leaseLoop = Mutex<(any EventLoop)?>(nil)

    func stopLease() {
        leaseTask.withLock { $0?.cancel() }
    }

    /// Locations and children already warned about a missing `.indexOn` (bounded: past the
    /// bound, no more warnings, so a client cannot grow it).
    /// The locations and children a missing-index warning was logged for (at most 10,000).
    let indexWarnings = Mutex<Set<String>>([])

    /// Logs, once per namespace, location and child, a query without a declared `.indexOn`.
    func warnMissingIndex(namespace: String, path: Path, index: IndexKind) {
        let key = "\(namespace)\(path)|\(index)"
        let first = indexWarnings.withLock { set in
            guard set.count < 10_000 else { return false }
            return set.insert(key).inserted
        }
        guard first else { return }
        logger.warning(
            "a query orders by a child without an index in the rules: add it to \".indexOn\" (the node still filters on the server)",
            metadata: ["namespace": "\(namespace)", "path": "\(path)", "index_on": "\(index)"])
    }

    /// `Access-Control-Allow-Origin` for a request from `origin` (docs/security.md): `*` when the
    /// policy allows any origin (development), the origin itself when it is listed, else none.
    func allowedOrigin(_ origin: String?) -> String? {
        let allowed = config.effectiveCORSOrigins
        if allowed.contains("*") { return "*" }
        guard let origin, allowed.contains(origin) else { return nil }
        return origin
    }

    func hub(for loop: any EventLoop) -> RealtimeHub {
        hubs.withLock { table in
            if let hub = table[ObjectIdentifier(loop)] { return hub }
            let hub = RealtimeHub(loop: loop, runtime: runtime)
            table[ObjectIdentifier(loop)] = hub
            return hub
        }
    }

    /// An owner id for an event stream's listen (random, as connections' are: owners share one
    /// space in the loop's hub).
    func newStreamOwner() -> UInt64 { sessionIDs.withLock { $0.next() | 1 } }

    /// A fresh identity for a realtime connection: this node, a random client session, a random
    /// secret (docs/realtime.md, "onDisconnect").
    func newSessionIdentity() -> SessionIdentity {
        sessionIDs.withLock { random in
            SessionIdentity(node: config.nodeID, connection: random.next(), secret: random.next())
        }
    }

    /// Registers an open connection; false when the lease it was opened under was replaced
    /// meanwhile (a fence: it must close). Registered first and checked second, so a fence either
    /// sees it registered or it sees the fence's new holder.
    func realtimeOpened(_ handler: RealtimeSessionHandler, channel: any Channel, holder: UInt64) -> Bool {
        realtime.withLock { $0[handler.identity.connection] = (channel, holder) }
        realtimeOpen.record(realtimeCount.wrappingAdd(1, ordering: .relaxed).newValue)
        return leaseHolder() == holder
    }

    func realtimeClosed(_ handler: RealtimeSessionHandler) {
        realtime.withLock { $0[handler.identity.connection] = nil }
        realtimeOpen.record(realtimeCount.wrappingSubtract(1, ordering: .relaxed).newValue)
    }

    /// Connections ended in the log through any node (an `ls` through another node, a lease
    /// expiry): those still open here close, so no client is served by a connection whose
    /// onDisconnect writes already ran.
    func realtimeEnded(_ connections: [UInt64]) {
        let channels = realtime.withLock { table in connections.compactMap { table[$0]?.channel } }
        guard !channels.isEmpty else { return }
        endedElsewhere.increment(by: channels.count)
        for channel in channels {
            channel.eventLoop.execute {
                if let handler = try? channel.pipeline.syncOperations.handler(type: RealtimeSessionHandler.self) {
                    handler.close(code: .goingAway, reason: "this connection was ended: its client reconnected elsewhere, or its node's lease lapsed")
                } else {
                    channel.close(promise: nil)
                }
            }
        }
    }
    let endedElsewhere = Counter(label: "banyan_realtime_ended_in_log_total")

    /// The node-wide budget for realtime messages being assembled (`http.max_assembling_bytes`).
    let assembling: ByteBudget
    /// The node-wide budget for answers queued to clients that do not read them
    /// (`http.max_queued_answer_bytes`; `QueuedAnswers`).
    let queuedAnswerBudget: ByteBudget
    let answerBudgetPauses = Counter(label: "banyan_http_answer_budget_pauses_total")
    /// Event streams and realtime connections cut off because they held queued output while the
    /// node's budget for it was spent.
    let outputCutoffs = Counter(label: "banyan_http_output_budget_cutoffs_total")

    /// Counts and logs a stream or realtime connection cut off for holding queued output while
    /// the node's budget for it was spent.
    func outputCutOff(_ what: String, session: String?) {
        outputCutoffs.increment()
        var metadata: Logger.Metadata = ["budget": "\(queuedAnswerBudget.limit)"]
        if let session { metadata["session"] = "\(session)" }
        logger.notice("closed \(what): the node's budget for queued output is used up", metadata: metadata)
    }

    // MARK: - Draining (docs/realtime.md, "Draining a node")

    private let drain = Mutex<DrainPlan?>(nil)
    /// This node's client address as published (the bound port when configured as 0).
    private let ownClientAddress = Mutex<String?>(nil)
    private let drainTask = Mutex<RepeatedTask?>(nil)
    let drainedConnections = Counter(label: "banyan_realtime_drained_total")
    /// Listens answered with their ok alone: the client's hash (`h`) showed it held the data.
    let listenDataSkipped = Counter(label: "banyan_realtime_listen_data_skipped_total")
    func listenDataWasSkipped() { listenDataSkipped.increment() }

    var isDraining: Bool { drain.withLock { $0 != nil } }
    var realtimeConnections: Int { realtimeCount.load(ordering: .relaxed) }

    /// Where to send a connection arriving while the node drains (nil: not draining).
    func drainTarget() -> String? {
        drain.withLock { plan -> String? in
            guard var p = plan else { return nil }
            let target = p.target()
            plan = p
            return target
        }
    }

    /// Starts draining: `/.banyan/ready` answers 503, new realtime connections are sent on before
    /// their hello, and the open ones are told to reconnect elsewhere, `DrainPlan.batch` every
    /// 100 ms. Targets: `explicit`, or the client addresses the other members published.
    func startDrain(to explicit: [String]?) -> EventLoopFuture<HTTPReply> {
        let me = config.nodeID
        // A network loop: probes never run on the replica thread.
        let loop = leaseLoop.withLock { $0 } ?? runtime.loop
        let own = ownClientAddress.withLock { $0 }
        let candidates: EventLoopFuture<[String]>
        if let explicit {
            candidates = loop.makeSucceededFuture(explicit)
        } else if let front = config.publicHost {
            // Clients reach the cluster through a front: sent back to it, they reach another
            // node (this one answers 503 on /.banyan/ready, so the front's checks skip it).
            return startDrain(targets: [front], loop: loop)
        } else {
            candidates = runtime.clientAddresses().hop(to: loop).map { DrainPlan.targets(published: $0.published, members: $0.members, me: me) }
        }
        // Only nodes that answer ready now, and never this one: a dead, lagging or draining node
        // would strand the clients sent to it (the SDKs keep the reset's host), and this one
        // would send them straight back.
        let ready = candidates.flatMap { candidates -> EventLoopFuture<[String]> in
            let others = candidates.filter { $0 != own }
            let probes = others.map { text in
                (try? HostPort(parsing: text)).map { ReadyProbe.check($0, on: loop) } ?? loop.makeSucceededFuture("not host:port")
            }
            return EventLoopFuture.whenAllSucceed(probes, on: loop).map { reasons in
                for (target, reason) in zip(others, reasons) {
                    if let reason { self.logger.warning("drain: a target is not ready; no clients go there", metadata: ["target": "\(target)", "reason": "\(reason)"]) }
                }
                return zip(others, reasons).filter { $0.1 == nil }.map(\.0)
            }
        }
        return ready.flatMap { self.startDrain(targets: $0, loop: loop) }
    }

    private func startDrain(targets: [String], loop: any EventLoop) -> EventLoopFuture<HTTPReply> {
        loop.makeSucceededFuture(targets).map { targets in
            guard let plan = DrainPlan(targets: targets) else {
                return .error(
                    .conflict, #"no target is ready: name other nodes that answer /.banyan/ready ({"to": ["host:port", …]}, banyan drain --to), or let the members publish their client addresses"#)
            }
            self.drain.withLock { $0 = plan }
            let task = loop.scheduleRepeatedTask(initialDelay: .zero, delay: .milliseconds(100)) { _ in self.drainStep() }
            self.drainTask.withLock { old in
                old?.cancel()
                old = task
            }
            let connections = self.realtimeConnections
            self.logger.notice("draining: moving realtime clients to other nodes", metadata: ["targets": "\(targets)", "connections": "\(connections)"])
            let list = targets.map { "\"\($0)\"" }.joined(separator: ",")
            return .json(.ok, #"{"draining":true,"targets":[\#(list)],"connections":\#(connections)}"#)
        }
    }

    /// Ends draining (the node takes realtime clients and reports ready again).
    func stopDrain() {
        drainTask.withLock { task in
            task?.cancel()
            task = nil
        }
        if drain.withLock({ plan in defer { plan = nil }; return plan != nil }) {
            logger.notice("draining stopped")
        }
    }

    private func drainStep() {
        let open = realtime.withLock { Array($0.keys) }
        let batch = drain.withLock { plan -> [(connection: UInt64, target: String)] in
            guard var p = plan else { return [] }
            let batch = p.nextBatch(open: open)
            plan = p
            return batch
        }
        for (connection, target) in batch {
            guard let channel = realtime.withLock({ $0[connection]?.channel }) else { continue }
            drainedConnections.increment()
            channel.eventLoop.execute {
                if let handler = try? channel.pipeline.syncOperations.handler(type: RealtimeSessionHandler.self) { handler.reset(to: target) }
            }
        }
    }

    /// Closes the realtime connection with this client session, if it is open on this node.
    func closeRealtime(connection: UInt64) {
        let entry = realtime.withLock { $0[connection] }
        entry?.channel.close(promise: nil)
    }

    func streamOpened() { streamsOpen.record(openStreams.wrappingAdd(1, ordering: .relaxed).newValue) }
    func streamClosed() { streamsOpen.record(openStreams.wrappingSubtract(1, ordering: .relaxed).newValue) }
}

/// A response ready to write.
struct HTTPReply: Sendable {
    var status: HTTPResponseStatus
    var headers: [(String, String)]
    var body: [UInt8]

    static func json(_ status: HTTPResponseStatus, _ text: String, extra: [(String, String)] = []) -> HTTPReply {
        HTTPReply(status: status, headers: [("Content-Type", "application/json; charset=utf-8")] + extra, body: Array(text.utf8))
    }

    /// An error body in Firebase's shape: `{\n  "error" : "..."\n}`.
    static func error(_ status: HTTPResponseStatus, _ message: String) -> HTTPReply {
        HTTPReply(status: status, headers: [("Content-Type", "application/json; charset=utf-8")], body: RESTRender.errorBody(message))
    }

    init(status: HTTPResponseStatus, headers: [(String, String)], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    init(_ r: RESTResponse) {
        self.init(status: HTTPResponseStatus(statusCode: r.status), headers: r.headers, body: r.body)
    }
}

/// Whether a request has been answered (the first of several possible answers wins); used on one
/// event loop only.
final class Answered: @unchecked Sendable {
    private var done = false
    func claim() -> Bool {
        defer { done = true }
        return !done
    }
}

/// One client connection: collects a request (bounded), answers it, or turns the connection into
/// an event stream, a WebSocket or a backup. Confined to the channel's event loop.
///
/// A thin driver of `HTTPConnectionMachine` (docs/http-connection.md): every event on the channel
/// (a decoded request part, a read asked for, writability, the answer budget, the request
/// deadline, an error, the end) goes to the machine, and the handler carries out its decision:
/// the socket I/O, the request's dispatch, the timer. The machine holds the connection's state
/// and its pipelined parts; the handler holds the request being read (its head and body bytes),
/// the open event stream, and the deadline's timer. Queued parts are taken in a loop after an
/// answer (never by recursion: thousands of requests answered at once must not deepen the
/// stack). Reads are held only when the machine says (holding them costs two `epoll_ctl` calls
/// per request).
final class HTTPConnectionHandler: ChannelDuplexHandler, RemovableChannelHandler, @unchecked Sendable {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let server: HTTPServer
    /// The connection's state and pipelined parts.
    private var machine: HTTPConnectionMachine<HTTPServerRequestPart>
    /// The request being read (from its head to its end) and its body so far.
    private var head: HTTPRequestHead?
    private var body: [UInt8] = []
    /// The request being read is for the account service (its own body bound and 413).
    private var accountsRequest = false
    /// The request is for the service accounts' token endpoint (OAuth's error shape).
    private var oauthRequest = false
    /// The request's route, decided at its head and kept for its dispatch.
    private var route: Route = .data
    /// A data request's head as the REST layer reads it and its split target (nil when its
    /// query string does not parse: the full parse then answers why), made once at the head.
    private var dataHead: (head: HTTPHead, target: RESTRequest.Target?)?
    /// Queued parts are being taken (an answer given meanwhile does not start another loop).
    private var resuming = false
    static let maxQueuedParts = 64
    static let maxQueuedBytes = 1 << 20
    static let hardQueuedParts = 4_096
    /// The connection's answer bytes queued for its client, charged to the node's budget for
    /// them (`http.max_queued_answer_bytes`); nil until the handler is added.
    private var queuedAnswers: QueuedAnswers?

    /// Measures this connection's queued answers against the node's budget (nothing is measured
    /// while it holds nothing, unless `measure`); whether it must wait.
    private func waitsForBudget(measure: Bool) -> Bool {
        guard let queuedAnswers, measure || queuedAnswers.held > 0 else { return false }
        let waits = queuedAnswers.mustWait()
        if machine.budgetMeasured(waits: waits) { server.answerBudgetPauses.increment() }
        return waits
    }

    private var streaming: StreamState?
    /// The client address an open stream is counted under (`HTTPServer.admitStream`).
    private var streamClient: String?
    /// This connection's request is counted in `HTTPServer.requestsInFlight`.
    private var inFlight = false

    private func beginRequest() {
        guard !inFlight else { return }
        inFlight = true
        server.requestsInFlight.wrappingAdd(1, ordering: .relaxed)
    }

    /// The request was answered, became a stream, an upgrade or a backup, or its connection
    /// closed.
    private func endRequest() {
        guard inFlight else { return }
        inFlight = false
        server.requestsInFlight.wrappingSubtract(1, ordering: .relaxed)
    }
    private var started: UInt64 = 0
    /// The whole next request (head and body) must arrive within `request_read_timeout_s` of the
    /// connection opening or of the previous response (a client dripping a byte at a time cannot
    /// hold a request open for ever), and an idle keep-alive connection is closed then too.
    /// `deadlineAt` (uptime nanoseconds) is nil while a request is answered or a stream is open;
    /// what passing it means is the machine's decision (`deadlinePassed`).
    private var deadlineAt: UInt64?
    /// One timer per connection: it re-arms itself when the deadline moved later, so a request
    /// costs a timestamp instead of scheduling and cancelling a task.
    private var deadlineTimer: Scheduled<Void>?

    init(server: HTTPServer) {
        self.server = server
        self.machine = HTTPConnectionMachine(
            limits: .init(
                maxBodyBytes: server.config.http.maxBodyBytes, maxQueuedParts: Self.maxQueuedParts, maxQueuedBytes: Self.maxQueuedBytes,
                hardQueuedParts: Self.hardQueuedParts))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let queued = QueuedAnswers(budget: server.queuedAnswerBudget, channel: context.channel)
        queued.resumable = { [weak self, weak context] in
            guard let self, let context, self.machine.budgetResumable() else { return }
            self.resume(context: context)
        }
        queuedAnswers = queued
        if context.channel.isActive { armDeadline(context: context) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        queuedAnswers?.release()
        queuedAnswers = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        armDeadline(context: context)
        context.fireChannelActive()
    }

    private func armDeadline(context: ChannelHandlerContext) {
        let timeout = UInt64(server.config.http.requestReadTimeoutSeconds) * 1_000_000_000
        deadlineAt = DispatchTime.now().uptimeNanoseconds + timeout
        if deadlineTimer == nil { scheduleDeadlineCheck(context: context, in: timeout) }
    }

    private func disarmDeadline() {
        deadlineAt = nil
        deadlineTimer?.cancel()
        deadlineTimer = nil
    }

    private func scheduleDeadlineCheck(context: ChannelHandlerContext, in nanoseconds: UInt64) {
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        deadlineTimer = context.eventLoop.scheduleTask(in: .nanoseconds(Int64(nanoseconds))) { self.checkDeadline(context: bound.value) }
    }

    private func checkDeadline(context: ChannelHandlerContext) {
        deadlineTimer = nil
        guard let at = deadlineAt else { return }
        let now = DispatchTime.now().uptimeNanoseconds
        if now < at { return scheduleDeadlineCheck(context: context, in: at - now) }
        deadlineAt = nil
        guard context.channel.isActive else { return }
        switch machine.deadlinePassed() {
        case .ignore: return
        case .close: context.close(promise: nil)
        case .timeOut:
            // The rest of this request, if it comes, is ignored (the connection is closing).
            guard let head else { return context.close(promise: nil) }
            self.head = nil
            body = []
            respond(context: context, head: head, reply: .error(.requestTimeout, "The request was not received in time."), close: true)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        // The budget is measured only for a part that would otherwise be handled now.
        if machine.handlesArrivalNow { _ = waitsForBudget(measure: false) }
        let bytes: Int
        if case .body(let chunk) = part { bytes = chunk.readableBytes } else { bytes = 0 }
        switch machine.arrived(part, bodyBytes: bytes) {
        case .handle: handle(context: context, part)
        case .queued, .dropped: return
        case .closeTooFarAhead:
            server.logger.notice("closed a connection pipelining too far ahead of its answers", metadata: ["max_parts": "\(Self.hardQueuedParts)", "max_body_bytes": "\(server.config.http.maxBodyBytes)"])
            context.close(promise: nil)
        }
    }

    /// Holds the channel's reads while the machine says so (see the type's comment).
    func read(context: ChannelHandlerContext) {
        if machine.readRequested() { context.read() }
    }

    /// After an answer: the queued parts, in order, until one makes the connection busy again;
    /// then a held read, once the queue has room.
    private func resume(context: ChannelHandlerContext) {
        // An answer given inside this loop calls resume again: the loop carries on instead.
        guard !resuming else { return }
        resuming = true
        defer { resuming = false }
        while let part = machine.nextQueued() { handle(context: context, part) }
        if machine.resumed() { context.read() }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if machine.writabilityChanged(writable: context.channel.isWritable) { resume(context: context) }
        context.fireChannelWritabilityChanged()
    }

    private func handle(context: ChannelHandlerContext, _ part: HTTPServerRequestPart) {
        switch part {
        case .head(let h):
            beginRequest()
            head = h
            body = []
            route = Route.of(method: h.method.rawValue, uri: h.uri)
            accountsRequest = route == .accounts
            oauthRequest = accountsRequest && h.uri.hasPrefix("/oauth2.googleapis.com/")
            started = DispatchTime.now().uptimeNanoseconds
            dataHead = nil
            if route == .data {
                let restHead = HTTPHead(method: h.method.rawValue, uri: h.uri, headers: h.headers.map { (name: $0.name, value: $0.value) })
                dataHead = (restHead, try? RESTRequest.target(of: h.uri))
            }
            // Data writes are authorised from the head, before their body is read: a refused
            // write never costs a body of up to `max_body_bytes` (issue 18). The connection
            // closes after the answer, so the unread body is never taken for a request.
            var denied: HTTPReply?
            if h.method == .PUT || h.method == .POST || h.method == .PATCH || h.method == .DELETE, let dataHead {
                denied = refuseWriteAtHead(dataHead.head, target: dataHead.target)
            }
            let decision = machine.head(
                contentLength: h.headers.first(name: "content-length").flatMap(Int.init),
                bodyLimit: accountsRequest ? AccountService.maxBodyBytes : server.config.http.maxBodyBytes,
                // A client waiting before it sends its body (curl does past 1 MiB).
                expectsContinue: h.version == .http1_1 && h.headers.first(name: "expect").map { HTTPHead.isHeader($0, "100-continue") } == true,
                refusedAtHead: denied != nil,
                // The account service answers at once and closes: its body is never read.
                refusesTooLargeAtOnce: accountsRequest)
            switch decision {
            case .readBody: return
            case .sendContinue: context.writeAndFlush(wrapOutboundOut(ByteBuffer(string: "HTTP/1.1 100 Continue\r\n\r\n")), promise: nil)
            case .refuse(let why):
                head = nil
                respond(context: context, head: h, reply: why == .tooLarge ? tooLargeReply : (denied ?? tooLargeReply), close: true)
            }
        case .body(let chunk):
            switch machine.bodyChunk(bytes: chunk.readableBytes) {
            case .append: chunk.withUnsafeReadableBytes { body.append(contentsOf: $0) }
            case .discard: body = []
            case .ignore: return
            }
        case .end:
            guard let head else { return }
            let decision = machine.end()
            guard decision != .ignore else { return }
            self.head = nil
            deadlineAt = nil
            if decision == .refuseTooLarge {
                body = []
                respond(context: context, head: head, reply: tooLargeReply, close: true)
                return
            }
            let request = body
            body = []
            dispatch(context: context, head: head, body: request)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        machine.inactive()
        endRequest()
        queuedAnswers?.release()
        disarmDeadline()
        if let s = streaming {
            streaming = nil
            s.close()
            server.streamClosed()
            if let client = streamClient { server.streamEnded(from: client) }
            streamClient = nil
        }
        context.fireChannelInactive()
    }

    private var tooLargeReply: HTTPReply {
        if accountsRequest {
            // The service accounts' token endpoint answers in OAuth's shape.
            if oauthRequest {
                var reply = AccountService.oauthError("invalid_request", "the body is larger than \(AccountService.maxBodyBytes) bytes")
                reply.status = .payloadTooLarge
                return reply
            }
            return AccountService.tooLarge.reply
        }
        return .error(.payloadTooLarge, "Payload too large: the body exceeds \(server.config.http.maxBodyBytes) bytes.")
    }

    /// Bad HTTP (the decoder's errors): a 400 and a close when no answer is under way, as
    /// NIO's protocol error handler did; otherwise just the close (the machine decides).
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard machine.failed(badHTTP: error is HTTPParserError && context.channel.isActive) == .badRequest else {
            context.close(promise: nil)
            return
        }
        let reply = HTTPReply.error(.badRequest, "Bad request: this is not a valid HTTP/1.1 request.")
        let buffer = encode(reply, version: .http1_1, isHead: false, keepAlive: false, context: context)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(buffer)).whenComplete { _ in channel.close(promise: nil) }
    }

    // MARK: - Dispatch

    private func dispatch(context: ChannelHandlerContext, head: HTTPRequestHead, body: [UInt8]) {
        server.requests.increment()
        switch route {
        case .metrics:
            if !server.config.effectiveOpenOperatorReads, let denied = authorizeOperator(head) {
                respond(context: context, head: head, reply: denied)
                return
            }
            let text = server.registry.emitToBuffer()
            respond(context: context, head: head, reply: HTTPReply(status: .ok, headers: [("Content-Type", "text/plain; version=0.0.4")], body: text))
            return
        case .realtime:
            let restHead = HTTPHead(method: head.method.rawValue, uri: head.uri, headers: head.headers.map { (name: $0.name, value: $0.value) })
            switch Result(catching: { () throws(RESTError) in try RealtimeUpgrade.parse(restHead, defaultNamespace: server.config.defaultNamespace) }) {
            case .success(let upgrade): switchToWebSocket(context: context, head: head, upgrade: upgrade)
            case .failure(let e): respond(context: context, head: head, reply: HTTPReply(RESTRender.error(e)), close: true)
            }
            return
        case .admin(let route):
            let path = head.uri[..<(head.uri.utf8.firstIndex(of: UInt8(ascii: "?")) ?? head.uri.endIndex)]
            let needsOperator = head.method != .GET || route.readsData || (!server.config.effectiveOpenOperatorReads && !route.isProbe)
            if needsOperator, let denied = authorizeOperator(head) {
                server.logger.warning("refused an operator request", metadata: ["method": "\(head.method)", "path": "\(path)"])
                respond(context: context, head: head, reply: denied)
                return
            }
            // A POST is the one state-changing method a browser sends cross-site without asking
            // first (a "simple request", e.g. text/plain): operator POSTs must say they are JSON,
            // which a page can only send after a CORS preflight (docs/security.md).
            if head.method == .POST, !(head.headers.first(name: "Content-Type")?.lowercased().hasPrefix("application/json") ?? false) {
                respond(context: context, head: head, reply: .error(.unsupportedMediaType, "operator requests that change state need Content-Type: application/json"))
                return
            }
            if route == .backup {
                startBackup(context: context, head: head)
                return
            }
            let future = AdminAPI(server: server).handle(route, method: head.method, path: String(path), body: body)
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            future.hop(to: context.eventLoop).whenSuccess { reply in self.respond(context: bound.value, head: head, reply: reply) }
            return
        case .rules:
            handleRules(context: context, head: head, body: body)
            return
        case .quota:
            handleQuota(context: context, head: head, body: body)
            return
        case .accounts:
            if head.method == .OPTIONS {
                respond(context: context, head: head, reply: Self.accountsPreflight(head))
                return
            }
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            let client = HTTPServer.clientKey(context.remoteAddress)
            server.accounts.handle(method: head.method, uri: head.uri, headers: head.headers, body: body, client: client, on: context.eventLoop).whenSuccess { reply in
                self.respond(context: bound.value, head: head, reply: reply)
            }
            return
        case .data:
            break
        }
        let (restHead, target) = dataHead ?? (HTTPHead(method: head.method.rawValue, uri: head.uri, headers: head.headers.map { (name: $0.name, value: $0.value) }), nil)
        dataHead = nil
        let namespace = server.config.defaultNamespace
        let maxUpdateKeys = server.config.http.maxUpdateKeys
        @Sendable func parse() -> Result<RESTRequest, RESTError> {
            guard let target else { return RESTRequest.parse(restHead, body: body, defaultNamespace: namespace, maxUpdatePaths: maxUpdateKeys) }
            return RESTRequest.parse(restHead, target: target, body: body, defaultNamespace: namespace, maxUpdatePaths: maxUpdateKeys)
        }
        if body.count >= Self.offloadBytes {
            // Reading and validating a large body takes milliseconds per megabyte: on a worker.
            offload(context, parse) { context, parsed in
                self.serveData(context: context, head: head, parsed: parsed, large: true)
            }
            return
        }
        serveData(context: context, head: head, parsed: parse(), large: false)
    }

    /// Request bodies and answers from this size on are read or rendered on a worker thread
    /// (docs/server.md, "Large writes"), so the event loop, which with `threads: 1` is the
    /// replica's, keeps ticking Raft and answering peers meanwhile.
    static let offloadBytes = 128 << 10
    /// Answers of trees with at least this many values are rendered on a worker thread.
    static let offloadValues = 4_096

    /// Runs `work` on a worker thread, then `then` with its result on this connection's loop.
    private func offload<T: Sendable>(
        _ context: ChannelHandlerContext, _ work: @escaping @Sendable () -> T, then: @escaping (ChannelHandlerContext, T) -> Void
    ) {
        let bound = NIOLoopBound((context, then), eventLoop: context.eventLoop)
        BulkWorkers.run(on: context.eventLoop, work).whenSuccess { result in bound.value.1(bound.value.0, result) }
    }

    /// Answers `reply` to a request of the data API, rendering it on a worker when it is large.
    private func respondRendered(
        context: ChannelHandlerContext, head: HTTPRequestHead, large: Bool, _ render: @escaping @Sendable () -> RESTResponse
    ) {
        guard large else { return respond(context: context, head: head, reply: HTTPReply(render())) }
        offload(context, render) { context, response in self.respond(context: context, head: head, reply: HTTPReply(response)) }
    }

    /// The data API once the request is read: `large` when its body was read on a worker.
    private func serveData(context: ChannelHandlerContext, head: HTTPRequestHead, parsed: Result<RESTRequest, RESTError>, large: Bool) {
        let request: RESTRequest
        switch parsed {
        case .success(let r): request = r
        case .failure(let e):
            respond(context: context, head: head, reply: HTTPReply(RESTRender.error(e)))
            return
        }
        let identity = identity(request.authorization, override: request.authOverride)
        if request.operation != .options {
            if case .refused(let message) = identity {
                respond(context: context, head: head, reply: .error(.unauthorized, message))
                return
            }
        }
        let stale = request.consistency == .stale
        // A query ordered by a child the rules do not index is served, and logged once per
        // location and child, as a realtime listen's is (REST has no `no_index` warning to send).
        if let query = request.query, let rules = rules(request.namespace), !rules.declaresIndex(query.index, at: request.path) {
            server.warnMissingIndex(namespace: request.namespace, path: request.path, index: query.index)
        }
        switch request.operation {
        case .options:
            respond(context: context, head: head, reply: HTTPReply(RESTRender.options(request)))
        case .get where request.atIndex != nil:
            // Reads of the past (docs/backup.md): administrators only, since the rules in force
            // now may not be those that held then.
            guard case .administrator = identity, let index = request.atIndex else {
                respond(context: context, head: head, reply: .error(.unauthorized, "Reads of the past (at=) are for administrators only."))
                return
            }
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            server.runtime.readAt(index: index, namespace: request.namespace, on: context.eventLoop) { result in
                let context = bound.value
                switch result {
                case .success(let tree):
                    let large = tree.valueCount(atLeast: Self.offloadValues)
                    self.respondRendered(context: context, head: head, large: large) { RESTRender.read(request, tree: tree) }
                case .failure(.busy): self.respond(context: context, head: head, reply: .error(.tooManyRequests, NodeRuntime.HistoryError.busy.description))
                case .failure(let e): self.respond(context: context, head: head, reply: .error(.badRequest, e.description))
                }
            }
        case .get:
            // Firebase's `timeout` parameter bounds the read: past it the client gets 400 (the
            // node's own request timeout still applies when it is shorter).
            let answered = Answered()
            // Timer and answer both run on this connection's loop (the runtime guarantees it).
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            let timer = request.timeoutMilliseconds.map { ms in
                context.eventLoop.scheduleTask(in: .milliseconds(Int64(ms))) {
                    guard answered.claim() else { return }
                    self.respond(context: bound.value, head: head, reply: .error(.badRequest, "The read did not finish within the requested timeout."))
                }
            }
            server.runtime.read(namespace: request.namespace, stale: stale, on: context.eventLoop) { result in
                let context = bound.value
                timer?.cancel()
                guard answered.claim() else { return }
                switch result {
                case .success(let tree):
                    if self.readDenied(identity, request, tree: tree) {
                        self.respond(context: context, head: head, reply: .error(.unauthorized, "Permission denied"))
                        return
                    }
                    let large = tree.valueCount(atLeast: Self.offloadValues)
                    self.respondRendered(context: context, head: head, large: large) { RESTRender.read(request, tree: tree) }
                case .failure(let e): self.respond(context: context, head: head, reply: Self.unavailable(e))
                }
            }
        case .stream where head.method == .HEAD:
            // The head a stream would start with, and no stream.
            respond(context: context, head: head, reply: HTTPReply(status: .ok, headers: Self.streamHeaders, body: []))
        case .stream:
            // Judged at the start, on this loop's copy of the tree; judged again when the rules
            // change (`StreamState.judge`: a stream no longer allowed gets `cancel` and ends).
            if case .administrator(nil) = identity {
                startStream(context: context, head: head, request: request, stale: stale)
            } else if rules(request.namespace) == nil || server.hub(for: context.eventLoop).tree(request.namespace) != nil {
                if readDenied(identity, request, tree: server.hub(for: context.eventLoop).tree(request.namespace) ?? .empty) {
                    respond(context: context, head: head, reply: .error(.unauthorized, "Permission denied"))
                    return
                }
                startStream(context: context, head: head, request: request, stale: stale)
            } else {
                // No view of the namespace on this loop yet: judge on a (stale) read of it.
                let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
                server.runtime.read(namespace: request.namespace, stale: true, on: context.eventLoop) { result in
                    let context = bound.value
                    switch result {
                    case .success(let tree):
                        if self.readDenied(identity, request, tree: tree) {
                            self.respond(context: context, head: head, reply: .error(.unauthorized, "Permission denied"))
                        } else {
                            self.startStream(context: context, head: head, request: request, stale: stale)
                        }
                    case .failure(let e): self.respond(context: context, head: head, reply: Self.unavailable(e))
                    }
                }
            }
        case .put, .post, .patch, .delete:
            if Access.writeRefused(identity, hasRules: rules(request.namespace) != nil, allowUnauthenticated: server.config.development.allowUnauthenticated) {
                respond(context: context, head: head, reply: .error(.unauthorized, "Permission denied"))
                return
            }
            let pushID = request.isPost ? server.nextPushID() : ""
            let command: Command
            switch request.command(pushID: pushID) {
            case .success(let c): command = c
            case .failure(let e):
                respond(context: context, head: head, reply: HTTPReply(RESTRender.error(e)))
                return
            }
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            server.runtime.write(namespace: request.namespace, command: command, auth: identity.commandAuth, on: context.eventLoop) { result in
                let context = bound.value
                switch result {
                case .success(let applied):
                    self.respondRendered(context: context, head: head, large: large) {
                        RESTRender.write(request, applied: applied, pushID: request.isPost ? pushID : nil)
                    }
                case .failure(let e):
                    self.respond(context: context, head: head, reply: Self.unavailable(e))
                }
            }
        }
    }

    /// Membership and transfer requests: the operator token when one is configured; otherwise
    /// the development settings, as for data requests. Reads (status, health, ready) are open
    /// unless `http.open_operator_reads` is off (then only the probes are).
    private func authorizeOperator(_ head: HTTPRequestHead) -> HTTPReply? {
        let header = head.headers.first(name: "Authorization")
        let token = header.map { $0.hasPrefix("Bearer ") ? String($0.dropFirst(7)) : $0 }
        if let adminToken = server.adminToken {
            guard let token, Self.constantTimeEqual(token, adminToken) else {
                return .error(.unauthorized, "operator requests need Authorization: Bearer <admin token>")
            }
            return nil
        }
        switch token {
        case "owner" where server.config.development.acceptOwnerToken: return nil
        case _ where server.config.development.allowUnauthenticated: return nil
        default: return .error(.unauthorized, "Permission denied")
        }
    }

    static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8)
        let y = Array(b.utf8)
        var diff = UInt8(truncatingIfNeeded: x.count ^ y.count)
        for i in 0..<max(x.count, y.count) { diff |= (i < x.count ? x[i] : 0) ^ (i < y.count ? y[i] : 0) }
        return diff == 0
    }

    /// `GET`/`PUT /.settings/rules.json` (docs/rules.md): administrators only (the operator
    /// token or a service account's token when an operator token is configured, else any
    /// administrator credential, such as the emulator's `owner`). A `PUT` is parsed here, so a
    /// syntax or type error is answered at once with its line and column, then set through the
    /// log (a `setRules` command), so every node switches at the same position.
    private func handleRules(context: ChannelHandlerContext, head: HTTPRequestHead, body: [UInt8]) {
        guard let access = administratorAccess(context: context, head: head, what: "rules") else { return }
        switch head.method {
        case .GET:
            let text = rules(access.namespace)?.text ?? Self.developmentRulesText(server.config.development.allowUnauthenticated)
            respond(context: context, head: head, reply: HTTPReply(status: .ok, headers: [("Content-Type", "application/json; charset=utf-8")], body: Array(text.utf8)))
        case .PUT:
            let text = String(decoding: body, as: UTF8.self)
            // An empty document removes the rules (the development settings decide again).
            let removing = text.allSatisfy(\.isWhitespace)
            if !removing {
                do throws(RulesError) {
                    _ = try Rules.parse(text)
                } catch {
                    return respond(context: context, head: head, reply: .error(.badRequest, "\(error)"))
                }
            }
            let command = Command.setRules(text: removing ? [] : body)
            writeSetting(
                context: context, head: head, namespace: access.namespace, command: command,
                logged: ("security rules set", ["namespace": "\(access.namespace)", "bytes": "\(body.count)"]))
        default:
            respond(context: context, head: head, reply: .error(.methodNotAllowed, "Use GET or PUT for /.settings/rules.json."))
        }
    }

    /// The namespace and credentials of a request to `/.settings/`, when they are an
    /// administrator's (the operator token or a service account's token when an operator token is
    /// configured, else any administrator credential); otherwise answers the request and gives nil.
    private func administratorAccess(context: ChannelHandlerContext, head: HTTPRequestHead, what: String) -> (namespace: String, authorization: RESTRequest.Authorization, override: String?)? {
        let restHead = HTTPHead(method: head.method.rawValue, uri: head.uri, headers: head.headers.map { (name: $0.name, value: $0.value) })
        guard let access = RESTRequest.access(in: restHead, defaultNamespace: server.config.defaultNamespace) else {
            respond(context: context, head: head, reply: .error(.badRequest, "Invalid namespace or query string."))
            return nil
        }
        let administrator: Bool
        if let adminToken = server.adminToken {
            // The operator token, or a service account's (docs/security.md, "Service accounts").
            if case .other(let token) = access.authorization {
                administrator = Self.constantTimeEqual(token, adminToken) || server.credentials.isServiceAccount(token, now: NodeRuntime.wallClock())
            } else {
                administrator = false
            }
        } else {
            administrator = identity(access.authorization, override: nil) == .administrator(override: nil)
        }
        guard administrator else {
            respond(context: context, head: head, reply: .error(.unauthorized, "Permission denied: \(what) need administrator credentials"))
            return nil
        }
        return access
    }

    /// A `/.settings/` change written through the log: `{"status":"ok"}` once applied (and
    /// `logged` at notice), 400 with the outcome when the state machine refused it.
    private func writeSetting(
        context: ChannelHandlerContext, head: HTTPRequestHead, namespace: String, command: Command, logged: (String, Logger.Metadata)
    ) {
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        server.runtime.write(namespace: namespace, command: command, on: context.eventLoop) { result in
            let context = bound.value
            switch result {
            case .success(let applied) where applied.outcome == .ok:
                self.server.logger.notice("\(logged.0)", metadata: logged.1)
                self.respond(context: context, head: head, reply: .json(.ok, "{\"status\":\"ok\"}"))
            case .success(let applied):
                self.respond(context: context, head: head, reply: .error(.badRequest, "\(applied.outcome)"))
            case .failure(let e):
                self.respond(context: context, head: head, reply: Self.unavailable(e))
            }
        }
    }

    /// `GET`/`PUT /.settings/quota.json` (docs/operations.md, "Namespace quotas"):
    /// administrators only. `PUT` takes a positive integer (the quota in data bytes) or `null`
    /// (no quota), written through the log into the quotas namespace, so every node switches at
    /// the same position. `GET` answers `{"namespace": NS, "quota_bytes": Q or null,
    /// "used_bytes": U}` after a
    /// linearizable read; the usage is read, not measured (O(1): trees carry their measure).
    private func handleQuota(context: ChannelHandlerContext, head: HTTPRequestHead, body: [UInt8]) {
        guard let access = administratorAccess(context: context, head: head, what: "quotas") else { return }
        let namespace = access.namespace
        // (`access` admits client namespaces only, which are valid keys; checked again here.)
        guard let key = ChildKey(validKey: namespace), !namespace.hasPrefix("$") else {
            return respond(context: context, head: head, reply: .error(.badRequest, "Invalid namespace or query string."))
        }
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        switch head.method {
        case .GET:
            let loop = context.eventLoop
            server.runtime.quotaState(namespace: namespace, on: loop) { state in
                switch state {
                case .failure(let e): self.respond(context: bound.value, head: head, reply: Self.unavailable(e))
                case .success(let (quota, used)):
                    let text = "{\"namespace\":\(JSONValue.string(namespace).jsonString),\"quota_bytes\":\(quota.map(String.init) ?? "null"),\"used_bytes\":\(used)}"
                    self.respond(context: bound.value, head: head, reply: .json(.ok, text))
                }
            }
        case .PUT:
            let quota: Int?
            switch try? JSONValue(parsing: body) {
            case .null?: quota = nil
            case .int(let n)? where n >= 1 && n <= StateMachine.maxQuotaBytes: quota = Int(n)
            default:
                return respond(
                    context: context, head: head,
                    reply: .error(.badRequest, "A quota is a whole number of data bytes from 1 to \(StateMachine.maxQuotaBytes), or null for none."))
            }
            let command = Command.set(path: "/" + key.string, json: Array((quota.map(String.init) ?? "null").utf8))
            writeSetting(
                context: context, head: head, namespace: StateMachine.quotasNamespace, command: command,
                logged: ("namespace quota set", ["namespace": "\(namespace)", "quota_bytes": "\(quota.map(String.init) ?? "none")"]))
        default:
            respond(context: context, head: head, reply: .error(.methodNotAllowed, "Use GET or PUT for /.settings/quota.json."))
        }
    }

    /// The CORS preflight of the account service's endpoints (the browser SDKs call them
    /// cross-origin; the origin itself is decided where every answer is written).
    static func accountsPreflight(_ head: HTTPRequestHead) -> HTTPReply {
        HTTPReply(
            status: .ok,
            headers: [
                ("Access-Control-Allow-Origin", "*"), ("Access-Control-Allow-Methods", "GET, POST, OPTIONS"),
                ("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Client-Version, X-Firebase-Client, X-Firebase-gmpid, X-Firebase-AppCheck"),
                ("Access-Control-Max-Age", "86400"),
            ], body: [])
    }

    /// What a namespace without rules behaves as, shown as rules.
    static func developmentRulesText(_ open: Bool) -> String {
        "{\n  \"rules\": {\n    \".read\": \(open),\n    \".write\": \(open)\n  }\n}\n"
    }

    /// Who a request's credentials name (docs/rules.md, "Enforcement").
    private func identity(_ authorization: RESTRequest.Authorization, override: String?) -> ClientIdentity {
        server.credentials.identity(authorization, override: override, now: NodeRuntime.wallClock())
    }

    /// The rules in force for `namespace` (nil: none; the development settings decide).
    private func rules(_ namespace: String) -> Rules? { server.runtime.rulesInForce.withLock { $0[namespace] } }

    private func readDenied(_ identity: ClientIdentity, _ request: RESTRequest, tree: Tree) -> Bool {
        Access.readDenied(
            identity, rules: rules(request.namespace), allowUnauthenticated: server.config.development.allowUnauthenticated,
            at: request.path, query: request.query, tree: tree, now: NodeRuntime.wallClock())
    }

    /// A data write refused from its head alone (before its body is read): bad credentials, or a
    /// client's write to a namespace without rules while unauthenticated access is off. With
    /// rules, the state machine judges the write, so its body is read.
    private func refuseWriteAtHead(_ head: HTTPHead, target: RESTRequest.Target?) -> HTTPReply? {
        guard let target, let access = RESTRequest.access(in: head, target: target, defaultNamespace: server.config.defaultNamespace) else { return nil }
        let identity = identity(access.authorization, override: access.override)
        if case .refused(let message) = identity { return .error(.unauthorized, message) }
        let refused = Access.writeRefused(
            identity, hasRules: rules(access.namespace) != nil, allowUnauthenticated: server.config.development.allowUnauthenticated)
        return refused ? .error(.unauthorized, "Permission denied") : nil
    }

    static func unavailable(_ e: ReplicaError) -> HTTPReply {
        switch e {
        case .notLeader, .refused, .overloaded, .unknownSession: return .error(.serviceUnavailable, e.description)
        // Not 503: clients such as firebase-admin resend on 503, and this write may still apply.
        case .timedOut(let write): return .error(write ? .gatewayTimeout : .serviceUnavailable, e.description)
        }
    }

    private func respond(context: ChannelHandlerContext, head: HTTPRequestHead, reply: HTTPReply, close: Bool = false) {
        server.latency.recordNanoseconds(Int64(DispatchTime.now().uptimeNanoseconds &- started))
        let keepAlive = machine.keepsAlive(wanted: head.isKeepAlive && !close && !server.stopping.load(ordering: .relaxed))
        let buffer = encode(
            reply, version: head.version, isHead: head.method == .HEAD, keepAlive: keepAlive, origin: head.headers.first(name: "Origin"), context: context)
        // A promise only when the close must wait for the write (one allocation less per answer).
        let done = keepAlive ? nil : context.eventLoop.makePromise(of: Void.self)
        server.answers.wrappingAdd(1, ordering: .relaxed)
        context.writeAndFlush(wrapOutboundOut(buffer), promise: done)
        endRequest()
        let after = machine.answered(keepAlive: keepAlive, writable: context.channel.isWritable)
        _ = waitsForBudget(measure: true)
        // The deadline also bounds a closing connection whose client never reads the answer.
        if context.channel.isActive { armDeadline(context: context) }
        if let done {
            let channel = context.channel
            done.futureResult.whenComplete { _ in channel.close(promise: nil) }
        } else if after == .resume {
            resume(context: context)
        }
    }

    /// An answer as bytes: 204 and 304 carry no length and no body; a HEAD answer gets length 0
    /// (as before) and no body.
    private func encode(
        _ reply: HTTPReply, version: HTTPVersion, isHead: Bool, keepAlive: Bool, origin: String? = nil, context: ChannelHandlerContext
    ) -> ByteBuffer {
        let bodiless = reply.status == .notModified || reply.status == .noContent
        let noBody = bodiless || isHead
        var buffer = context.channel.allocator.buffer(capacity: 160 + (noBody ? 0 : reply.body.count))
        let dropped = HTTPResponseWriter.writeHead(
            version: version, status: reply.status, headers: reply.headers, contentLength: bodiless ? nil : (noBody ? 0 : reply.body.count),
            keepAlive: keepAlive, allowOrigin: server.allowedOrigin(origin), into: &buffer)
        if dropped > 0 { server.logger.error("dropped response headers with control characters", metadata: ["count": "\(dropped)"]) }
        if !noBody { buffer.writeBytes(reply.body) }
        return buffer
    }

    // MARK: - Realtime (WebSocket) connections

    static let decoderName = "http-decoder"
    static let handlerName = "http-connection"

    /// Answers `101 Switching Protocols` and replaces the HTTP handlers with the WebSocket ones
    /// and the connection's `RealtimeSessionHandler` (docs/realtime.md). Anything the client
    /// pipelined after its upgrade request is dropped (RFC 6455: it waits for the answer).
    private func switchToWebSocket(context: ChannelHandlerContext, head: HTTPRequestHead, upgrade: RealtimeUpgrade) {
        // A realtime connection is not a request a stopping node waits for (a drain moves it).
        endRequest()
        let client = HTTPServer.clientKey(context.remoteAddress)
        guard server.admitStream(from: client) else {
            server.refusedStreams.increment()
            respond(
                context: context, head: head,
                reply: .error(.tooManyRequests, "Too many event streams and realtime connections from this client (at most \(server.config.http.maxStreamsPerClient))."),
                close: true)
            return
        }
        // Parts pipelined behind the upgrade request never apply (the machine drops them).
        machine.upgradeBegun()
        disarmDeadline()
        var buffer = context.channel.allocator.buffer(capacity: 160)
        buffer.writeStaticString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ")
        buffer.writeString(upgrade.accept)
        if let deflate = upgrade.deflate {
            // permessage-deflate accepted (docs/realtime.md, "Compression").
            buffer.writeStaticString("\r\nSec-WebSocket-Extensions: ")
            buffer.writeString(deflate.responseHeader)
        }
        buffer.writeStaticString("\r\n\r\n")
        let server = self.server
        let channel = context.channel
        channel.closeFuture.whenComplete { _ in server.streamEnded(from: client) }
        if let target = server.drainTarget() {
            // Draining: the reset before any hello sends the client to another node at once.
            // Nothing more is read (the HTTP decoder is still in place), and the socket closes
            // at most 5 s later whether or not the client reads.
            server.drainedConnections.increment()
            channel.setOption(ChannelOptions.autoRead, value: false).whenComplete { _ in }
            channel.eventLoop.scheduleTask(in: .seconds(5)) { channel.close(promise: nil) }
            context.write(wrapOutboundOut(buffer), promise: nil)
            for frame in ServerFrames.text(ServerMessage.reset(host: target), allocator: channel.allocator) {
                context.write(wrapOutboundOut(frame), promise: nil)
            }
            var close = channel.allocator.buffer(capacity: 2)
            close.write(webSocketErrorCode: .goingAway)
            context.writeAndFlush(wrapOutboundOut(ServerFrames.encode(opcode: 0x8, close, allocator: channel.allocator))).whenComplete { _ in
                channel.close(promise: nil)
            }
            return
        }
        let limits = SessionCore.Limits()
        context.writeAndFlush(wrapOutboundOut(buffer)).whenComplete { result in
            guard case .success = result, channel.isActive else { return channel.close(promise: nil) }
            // The HTTP handlers go first (this one holds reads while closing), then the
            // WebSocket ones come, then reading resumes.
            let removed = channel.pipeline.removeHandler(name: Self.decoderName).and(channel.pipeline.removeHandler(name: Self.handlerName))
            removed.whenComplete { _ in
                Self.installWebSocket(channel: channel, server: server, upgrade: upgrade, limits: limits)
            }
        }
    }

    private static func installWebSocket(channel: any Channel, server: HTTPServer, upgrade: RealtimeUpgrade, limits: SessionCore.Limits) {
            guard channel.isActive else { return }
            do {
                let pipeline = channel.pipeline.syncOperations
                let hub = server.hub(for: channel.eventLoop)
                // No frame encoder or protocol-error handler: the session encodes its own frames
                // (shared across connections) and answers bad frames with the right close code.
                // Reserved bits and compressed messages are resolved before the aggregator, which
                // keeps no reserved bits of fragmented messages.
                try pipeline.addHandlers([
                    ByteToMessageHandler(WebSocketFrameDecoder(maxFrameSize: limits.frames.maxFrameBytes)),
                    PerMessageDeflateReader(
                        codec: upgrade.deflate == nil ? nil : hub.deflate, maxMessageBytes: limits.frames.maxFrameBytes,
                        maxFrames: limits.frames.maxFramesPerMessage, budget: server.assembling),
                    NIOWebSocketFrameAggregator(
                        minNonFinalFragmentSize: 0, maxAccumulatedFrameCount: limits.frames.maxFramesPerMessage,
                        maxAccumulatedFrameSize: limits.frames.maxFrameBytes),
                    RealtimeSessionHandler(server: server, hub: hub, upgrade: upgrade, identity: server.newSessionIdentity()),
                ])
                channel.read()
            } catch {
                server.logger.error("could not switch a connection to WebSocket", metadata: ["error": "\(error)"])
                channel.close(promise: nil)
            }
    }

    // MARK: - Backups

    /// `GET /.banyan/backup` (docs/backup.md): after a ReadIndex round the state is copied (the
    /// trees are shared) and `BackupStream` writes it from a thread of its own, one frame at a
    /// time, waiting while the client has not taken what was sent. The connection carries nothing
    /// else and closes at the end. One backup at a time per node.
    private func startBackup(context: ChannelHandlerContext, head: HTTPRequestHead) {
        guard server.backupRunning.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else {
            respond(
                context: context, head: head,
                reply: .error(.tooManyRequests, "A backup is already being taken from this node: wait for it to end, or take this one from another node."))
            return
        }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let server = self.server
        server.runtime.backupState(on: context.eventLoop) { result in
            let (handler, context) = bound.value
            switch result {
            case .failure(let e):
                server.backupRunning.store(false, ordering: .releasing)
                handler.respond(context: context, head: head, reply: .error(.serviceUnavailable, "No consistent state to back up: \(e)"))
            case .success(let (machine, header)):
                // Nothing else is read or answered on this connection.
                handler.machine.backupBegun()
                handler.endRequest()
                let chunked = head.version.major > 1 || (head.version.major == 1 && head.version.minor >= 1)
                var buffer = context.channel.allocator.buffer(capacity: 256)
                _ = HTTPResponseWriter.writeHead(
                    version: head.version, status: .ok,
                    headers: [
                        ("Content-Type", "application/octet-stream"), ("X-Banyan-Backup-Index", "\(header.index)"),
                        ("X-Banyan-Backup-Term", "\(header.term)"),
                    ] + (chunked ? [("Transfer-Encoding", "chunked")] : []),
                    contentLength: nil, keepAlive: false, into: &buffer)
                context.writeAndFlush(handler.wrapOutboundOut(buffer), promise: nil)
                BackupStream.start(channel: context.channel, chunked: chunked, machine: machine, header: header, logger: server.logger) {
                    server.backupRunning.store(false, ordering: .releasing)
                }
            }
        }
    }

    // MARK: - Event streams

    /// The head of an event stream (and of a `HEAD` request for one).
    private static let streamHeaders = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")]

    private func startStream(context: ChannelHandlerContext, head: HTTPRequestHead, request: RESTRequest, stale: Bool) {
        let channel = context.channel
        let client = HTTPServer.clientKey(context.remoteAddress)
        guard server.admitStream(from: client) else {
            server.refusedStreams.increment()
            respond(
                context: context, head: head,
                reply: .error(.tooManyRequests, "Too many event streams from this client (at most \(server.config.http.maxStreamsPerClient))."))
            return
        }
        // HTTP/1.1 streams go in chunks (as NIO's encoder sent them); HTTP/1.0 ones end with the
        // connection.
        let chunked = head.version.major > 1 || (head.version.major == 1 && head.version.minor >= 1)
        let hub = server.hub(for: context.eventLoop)
        let state = StreamState(request: request, channel: channel, chunked: chunked, hub: hub, owner: server.newStreamOwner())
        state.queuedOutput = queuedAnswers
        state.cutOff = { [server] in server.outputCutOff("an event stream that does not read its events", session: nil) }
        let (identity, validUntil) = server.credentials.identityAndExpiry(
            request.authorization, override: request.authOverride, now: NodeRuntime.wallClock())
        state.judge = { [weak self] tree in self?.readDenied(identity, request, tree: tree) ?? true }
        streaming = state
        machine.streamStarted()
        streamClient = client
        server.streamOpened()
        endRequest()
        var buffer = context.channel.allocator.buffer(capacity: 160)
        HTTPResponseWriter.writeHead(
            version: head.version, status: .ok,
            headers: Self.streamHeaders + (chunked ? [("Transfer-Encoding", "chunked")] : []),
            contentLength: nil, keepAlive: chunked && head.isKeepAlive, allowOrigin: server.allowedOrigin(head.headers.first(name: "Origin")),
            into: &buffer)
        context.writeAndFlush(wrapOutboundOut(buffer), promise: nil)
        let keepAlive = TimeAmount.seconds(Int64(server.config.http.keepAliveSeconds))
        let bound = NIOLoopBound(state, eventLoop: context.eventLoop)
        state.setKeepAlive(context.eventLoop.scheduleRepeatedTask(initialDelay: keepAlive, delay: keepAlive) { _ in
            bound.value.send(SSEStream.keepAlive(), flush: true)
        })
        state.start(stale: stale)
        if let validUntil { state.expire(at: validUntil, on: context.eventLoop) }
    }
}

/// One open event stream: a listen in its event loop's `RealtimeHub` (the node's one listen
/// core, shared with WebSocket sessions; docs/realtime.md), whose updates `SSEStream` renders
/// as events. Confined to the channel's event loop, as the hub is: nothing of it runs on the
/// replica thread.
final class StreamState {
    private var stream: SSEStream
    let channel: any Channel
    private let hub: RealtimeHub
    private let owner: UInt64
    private var listenID: UInt64?
    private var keepAlive: RepeatedTask?
    private var closed = false
    /// Nothing is sent before the first `put "/"`.
    private var started = false
    private var dirty = false
    /// A stream whose client reads too slowly is cancelled once this many bytes are queued.
    static let maxQueuedBytes = 16 << 20

    /// Whether each write is framed as an HTTP/1.1 chunk.
    private let chunked: Bool

    /// Whether the stream's client may no longer read it (judged again when the rules change).
    var judge: (Tree) -> Bool = { _ in false }
    /// The connection's account of queued output with the node's budget (its handler's), and
    /// what to do (count, log) when the stream is cut off for holding some while it is spent.
    var queuedOutput: QueuedAnswers?
    var cutOff: () -> Void = {}

    init(request: RESTRequest, channel: any Channel, chunked: Bool, hub: RealtimeHub, owner: UInt64) {
        self.stream = SSEStream(request: request)
        self.channel = channel
        self.chunked = chunked
        self.hub = hub
        self.owner = owner
    }

    var isClosed: Bool { closed }

    func setKeepAlive(_ task: RepeatedTask) {
        if closed { return task.cancel() }
        keepAlive = task
    }

    /// The end of a stream opened with a verified token, when the token expires.
    private var expiry: Scheduled<Void>?

    /// Ends the stream with Firebase's `auth_revoked` event once `validUntil` (milliseconds
    /// since the epoch) passes; a far expiry is checked again at least hourly.
    func expire(at validUntil: Int64, on loop: any EventLoop) {
        guard !closed else { return }
        let delay = max(0, min(validUntil - NodeRuntime.wallClock(), 3_600_000))
        let bound = NIOLoopBound(self, eventLoop: loop)
        expiry = loop.scheduleTask(in: .milliseconds(delay)) {
            let state = bound.value
            guard !state.closed else { return }
            if NodeRuntime.wallClock() < validUntil { return state.expire(at: validUntil, on: loop) }
            state.send(SSEStream.authRevoked(), flush: true)
            state.close()
            state.finish()
        }
    }

    /// Registers the stream's listen: the first event once it started (after a ReadIndex round,
    /// unless `stale`), then one or more per update.
    func start(stale: Bool) {
        let request = stream.request
        let id = hub.newListenID()
        listenID = id
        hub.attachStream(
            owner: owner,
            deliver: { [weak self] event, tree in self?.updated(event.update, tree: tree) },
            flush: { [weak self] in self?.flush() })
        hub.watchRules(owner: owner) { [weak self] in
            guard let self, !self.closed, self.judge(self.hub.tree(request.namespace) ?? .empty) else { return }
            // Firebase's event for a stream the rules stopped allowing.
            self.send(SSEStream.cancel("Permission denied"), flush: true)
            self.close()
            self.finish()
        }
        let listen = Listen(id: id, owner: owner, namespace: request.namespace, path: request.path, params: stream.listenParams)
        hub.listen(listen, stale: stale) { [weak self] result in
            guard let self, !self.closed else { return }
            switch result {
            case .success(let first):
                self.started = true
                let tree = self.hub.tree(request.namespace) ?? .empty
                self.send(self.stream.start(first: first.update, tree: tree), flush: true)
            case .failure(let e):
                self.listenID = nil
                self.send(SSEStream.cancel(e.description), flush: true)
                self.finish()
            }
        }
    }

    private func updated(_ update: ListenUpdate, tree: Tree) {
        guard started, !closed else { return }
        send(stream.update(update, tree: tree), flush: false)
    }

    func send(_ bytes: [UInt8], flush: Bool) {
        guard !bytes.isEmpty, !closed else { return }
        if !channel.isWritable {
            // The client is not reading: cancel rather than buffer without bound.
            close()
            channel.close(promise: nil)
            return
        }
        var buffer = channel.allocator.buffer(capacity: bytes.count + (chunked ? 12 : 0))
        if chunked { buffer.writeString(String(bytes.count, radix: 16) + "\r\n") }
        buffer.writeBytes(bytes)
        if chunked { buffer.writeStaticString("\r\n") }
        if flush {
            channel.writeAndFlush(buffer, promise: nil)
            checkBudget()
        } else {
            channel.write(buffer, promise: nil)
            dirty = true
        }
    }

    private func flush() {
        guard dirty else { return }
        dirty = false
        channel.flush()
        checkBudget()
    }

    /// Events the client has not taken count toward the node's budget for queued output; a
    /// stream holding some when it is spent is cut off (events cannot wait without being lost),
    /// and its client reconnects as after any lost connection.
    private func checkBudget() {
        guard !closed, queuedOutput?.mustWait() == true else { return }
        cutOff()
        close()
        channel.close(promise: nil)
    }

    /// Ends the stream on purpose: the last chunk (HTTP/1.1), then the close.
    func finish() {
        guard chunked, channel.isActive else { return channel.close(promise: nil) }
        let channel = self.channel
        channel.writeAndFlush(ByteBuffer(string: "0\r\n\r\n")).whenComplete { _ in channel.close(promise: nil) }
    }

    func close() {
        guard !closed else { return }
        closed = true
        keepAlive?.cancel()
        keepAlive = nil
        expiry?.cancel()
        expiry = nil
        if let id = listenID { hub.unlisten(id) }
        listenID = nil
        hub.detach(owner: owner)
    }
}

/// Writes HTTP/1.x response heads as bytes.
enum HTTPResponseWriter {
    /// The status line, `headers` (the reply's own: any `Content-Length`, `Connection` or
    /// `Access-Control-Allow-Origin` among them is replaced), `Access-Control-Allow-Origin` as the
    /// node's CORS policy gives it for the request's origin (`allowOrigin`),
    /// `Content-Length` when given, `Connection`, and the blank line. A header whose name or
    /// value holds a control character is left out (no response splitting, whatever a caller
    /// passes); returns how many were.
    @discardableResult
    static func writeHead(
        version: HTTPVersion, status: HTTPResponseStatus, headers: [(String, String)], contentLength: Int?, keepAlive: Bool,
        allowOrigin: String? = nil, into buffer: inout ByteBuffer
    ) -> Int {
        buffer.writeStaticString(version.major == 1 && version.minor == 0 ? "HTTP/1.0 " : "HTTP/1.1 ")
        let code = status.code
        buffer.writeInteger(UInt8(ascii: "0") + UInt8(truncatingIfNeeded: code / 100 % 10))
        buffer.writeInteger(UInt8(ascii: "0") + UInt8(truncatingIfNeeded: code / 10 % 10))
        buffer.writeInteger(UInt8(ascii: "0") + UInt8(truncatingIfNeeded: code % 10))
        buffer.writeInteger(UInt8(ascii: " "))
        buffer.writeString(status.reasonPhrase)
        buffer.writeStaticString("\r\n")
        var dropped = 0
        for (name, value) in headers {
            if HTTPHead.isHeader(name, "content-length") || HTTPHead.isHeader(name, "connection") { continue }
            // The node's CORS policy decides, not the reply (docs/security.md).
            if HTTPHead.isHeader(name, "access-control-allow-origin") { continue }
            guard isFieldText(name), isFieldText(value), !name.isEmpty else {
                dropped += 1
                continue
            }
            buffer.writeString(name)
            buffer.writeStaticString(": ")
            buffer.writeString(value)
            buffer.writeStaticString("\r\n")
        }
        if let allowOrigin, isFieldText(allowOrigin) {
            buffer.writeStaticString("Access-Control-Allow-Origin: ")
            buffer.writeString(allowOrigin)
            buffer.writeStaticString(allowOrigin == "*" ? "\r\n" : "\r\nVary: Origin\r\n")
        }
        if let contentLength {
            buffer.writeStaticString("Content-Length: ")
            buffer.writeString(String(contentLength))
            buffer.writeStaticString("\r\n")
        }
        buffer.writeStaticString(keepAlive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n")
        return dropped
    }

    /// No control characters but tab (RFC 9110 field values; names are stricter still, but ours
    /// are fixed strings).
    static func isFieldText(_ text: String) -> Bool {
        text.utf8.allSatisfy { $0 >= 0x20 ? $0 != 0x7F : $0 == 0x09 }
    }
}

/// `struct sock_fprog` (linux/filter.h): a length and a pointer, laid out as C lays them out
/// (the pointer at offset 8). The pointer is read only during the `setsockopt` call.
struct SocketFilterProgram: @unchecked Sendable {
    var length: UInt16
    var filter: UnsafeMutableRawPointer
}
