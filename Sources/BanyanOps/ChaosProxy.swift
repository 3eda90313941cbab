import BanyanBasics
public import NIOCore
import NIOHTTP1
import NIOPosix
import Glibc
import Synchronization

/// `banyan chaos proxy` (docs/chaos.md): a TCP proxy in front of a node's client port that
/// misbehaves on purpose, so an app's reconnection logic can be tried with the Firebase SDKs
/// (REST, event streams and WebSockets all pass through it, bytes unchanged):
///
/// - `delay`: every chunk waits this long in each direction (order kept);
/// - `dropRate`: each chunk has this chance of stalling its connection: from then on nothing
///   more passes either way while the socket stays open (a dead network path, no reset: the
///   client must notice by its own timeouts);
/// - `resetEvery`: every so often every open connection is reset (RST to the client, the node's
///   side closed).
///
/// Decisions come from `SeededRandom(seed)`. Each connection dials the target on its own event
/// loop; a side that cannot take more bytes stops reading from the other (backpressure), and so
/// does a side whose bytes wait out the delay past `maxDelayedBytes` (a delay must not turn the
/// proxy into an unbounded buffer).
///
/// Client requests pass through `ProxyRequestGate`: a node's operator routes (`/.banyan/…`, but
/// health and ready) are refused with 403, so the fault switch is never reachable through the
/// proxy, even one listening beyond loopback; there the emulator's `owner` token is refused too
/// (unless `ownerToken` is `.pass`). A TLS connection cannot be read: it passes unread only with
/// `tlsPassthrough`, and is refused otherwise.
public final class ChaosProxy: Sendable {
    /// What the proxy does with requests carrying the emulator's `owner` credential.
    public enum OwnerToken: Sendable, Equatable {
        /// Refused when the proxy listens on an address that is not loopback (the default).
        case refuseBeyondLoopback
        /// Always refused.
        case refuse
        /// Passed (`--allow-owner-token`).
        case pass
    }

    public struct Settings: Sendable {
        public var delay: TimeAmount = .zero
        public var dropRate: Double = 0
        public var resetEvery: TimeAmount?
        public var seed: UInt64 = 1
        /// Pass connections that start a TLS handshake through unread (`--tls-passthrough`);
        /// otherwise they are refused at once.
        public var tlsPassthrough = false
        public var ownerToken = OwnerToken.refuseBeyondLoopback
        /// Bytes of one direction of one connection that may wait out the delay before the
        /// proxy stops reading from their sender.
        public var maxDelayedBytes = 4 << 20
        public init() {}

        /// The reset interval for `--reset-every SECONDS` (0: never); finite and at most a day,
        /// so the milliseconds fit (an infinite interval once trapped converting to an integer).
        public static func resetInterval(seconds: Double) throws(ChaosError) -> TimeAmount? {
            guard seconds.isFinite, seconds >= 0, seconds <= 86_400 else {
                throw ChaosError("--reset-every must be a number of seconds from 0 to 86400, not \(seconds)")
            }
            let ms = Int64((seconds * 1000).rounded())
            return ms > 0 ? .milliseconds(ms) : nil
        }
    }

    public struct Stats: Sendable, CustomStringConvertible {
        public var connections = 0
        public var open = 0
        public var bytesToTarget = 0
        public var bytesToClient = 0
        public var stalled = 0
        public var reset = 0
        public var refused = 0
        /// Requests the proxy refused itself (operator routes, the owner token, malformed
        /// framing, TLS without `tlsPassthrough`).
        public var refusedRequests = 0
        /// Connections that started a TLS handshake and passed through unread.
        public var tlsConnections = 0
        /// The most bytes one direction of one connection held back for the delay at once.
        public var peakDelayedBytes = 0
        public var description: String {
            "\(connections) connections (\(open) open\(tlsConnections > 0 ? ", \(tlsConnections) TLS passed through" : "")), \(bytesToTarget) bytes to the node, \(bytesToClient) to clients, \(stalled) stalled, \(reset) reset, \(refused) refused by the node, \(refusedRequests) requests refused by the proxy"
        }
    }

    public let targetHost: String
    public let targetPort: Int
    public let settings: Settings
    private let group: MultiThreadedEventLoopGroup
    private let log: @Sendable (String) -> Void
    private let state = Mutex<(random: SeededRandom, stats: Stats, pairs: [Int: ProxyPair], next: Int)>((SeededRandom(seed: 1), Stats(), [:], 0))
    private let server = Mutex<(channel: (any Channel)?, resetTask: RepeatedTask?)>((nil, nil))
    /// What every connection's gate applies, fixed once the proxy listens.
    private let gateOptions = Mutex(ProxyRequestGate.Options())

    public init(targetHost: String, targetPort: Int, settings: Settings, threads: Int = 1, log: @escaping @Sendable (String) -> Void) {
        self.targetHost = targetHost
        self.targetPort = targetPort
        self.settings = settings
        self.log = log
        group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        let seed = settings.seed
        state.withLock { $0.random = SeededRandom(seed: seed) }
    }

    public var stats: Stats { state.withLock { $0.stats } }

    /// Starts listening; returns the bound port (useful with port 0).
    public func start(host: String, port: Int) throws -> Int {
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelOption(.autoRead, value: false)
            .childChannelInitializer { channel in
                self.accepted(channel)
                return channel.eventLoop.makeSucceededVoidFuture()
            }
        // The owner token is refused unless the bound address is loopback; until the bind says
        // which it is, a connection accepted at once gets the refusal (the cautious answer).
        let tlsPassthrough = settings.tlsPassthrough
        let ownerToken = settings.ownerToken
        gateOptions.withLock { $0 = ProxyRequestGate.Options(tlsPassthrough: tlsPassthrough, refuseOwnerToken: ownerToken != .pass) }
        let channel = try bootstrap.bind(host: host, port: port).wait()
        let loopback = channel.localAddress.map(Self.isLoopback) ?? false
        gateOptions.withLock {
            $0.refuseOwnerToken = ownerToken == .refuse || (ownerToken == .refuseBeyondLoopback && !loopback)
        }
        var task: RepeatedTask?
        if let every = settings.resetEvery, every.nanoseconds > 0 {
            task = group.next().scheduleRepeatedTask(initialDelay: every, delay: every) { _ in self.resetAll() }
        }
        server.withLock { $0 = (channel, task) }
        return channel.localAddress?.port ?? port
    }

    /// What the gates apply (after `start`).
    public var requestGateOptions: ProxyRequestGate.Options { gateOptions.withLock { $0 } }

    /// Whether an address is loopback: 127.0.0.0/8, ::1, or an IPv4-mapped loopback address.
    static func isLoopback(_ address: SocketAddress) -> Bool {
        guard let ip = address.ipAddress?.lowercased() else { return false }
        return ip.hasPrefix("127.") || ip == "::1" || ip.hasPrefix("::ffff:127.")
    }

    public func stop() {
        let (channel, task) = server.withLock { s in
            defer { s = (nil, nil) }
            return s
        }
        task?.cancel()
        try? channel?.close().wait()
        let pairs = state.withLock { $0.pairs.values }
        for pair in pairs { pair.close() }
        try? group.syncShutdownGracefully()
    }

    private func accepted(_ client: any Channel) {
        let id = state.withLock { s in
            s.next += 1
            s.stats.connections += 1
            return s.next
        }
        ClientBootstrap(group: client.eventLoop)
            .connectTimeout(.seconds(5))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelOption(.autoRead, value: false)
            .connect(host: targetHost, port: targetPort)
            .whenComplete { result in
                switch result {
                case .success(let target):
                    let pair = ProxyPair(id: id, client: client, target: target, proxy: self, options: self.gateOptions.withLock { $0 })
                    self.state.withLock { s in
                        s.pairs[id] = pair
                        s.stats.open += 1
                    }
                    pair.install()
                case .failure(let error):
                    self.state.withLock { $0.stats.refused += 1 }
                    self.log("connection \(id): cannot reach \(self.targetHost):\(self.targetPort): \(error)")
                    client.close(promise: nil)
                }
            }
    }

    /// Whether the next chunk stalls its connection.
    fileprivate func drawStall() -> Bool {
        guard settings.dropRate > 0 else { return false }
        return state.withLock { s in
            Double(s.random.next() >> 11) / Double(UInt64(1) << 53) < settings.dropRate
        }
    }

    fileprivate func counted(toTarget: Int, toClient: Int) {
        state.withLock { s in
            s.stats.bytesToTarget += toTarget
            s.stats.bytesToClient += toClient
        }
    }

    fileprivate func delayed(_ bytes: Int) {
        state.withLock { $0.stats.peakDelayedBytes = max($0.stats.peakDelayedBytes, bytes) }
    }

    fileprivate func refusedRequest(_ id: Int, status: Int, reason: String) {
        state.withLock { $0.stats.refusedRequests += 1 }
        log("connection \(id): refused a request (\(status)): \(reason)")
    }

    fileprivate func refusedTLS(_ id: Int, reason: String) {
        state.withLock { $0.stats.refusedRequests += 1 }
        log("connection \(id): refused: \(reason)")
    }

    fileprivate func passedTLS(_ id: Int) {
        let first = state.withLock { s in
            s.stats.tlsConnections += 1
            return s.stats.tlsConnections == 1
        }
        if first {
            log("connection \(id): TLS, passed through unread (--tls-passthrough; later TLS connections are not logged): the proxy sees no request inside, so it refuses neither operator routes nor the owner token there")
        }
    }

    fileprivate func stalled(_ id: Int) {
        state.withLock { $0.stats.stalled += 1 }
        log("connection \(id): stalled (nothing passes from now on; the socket stays open)")
    }

    fileprivate func closed(_ id: Int) {
        state.withLock { s in
            if s.pairs.removeValue(forKey: id) != nil { s.stats.open -= 1 }
        }
    }

    /// Resets every open connection now.
    public func resetAll() {
        let pairs = state.withLock { s in
            s.stats.reset += s.pairs.count
            return Array(s.pairs.values)
        }
        if !pairs.isEmpty { log("reset \(pairs.count) connection\(pairs.count == 1 ? "" : "s")") }
        for pair in pairs { pair.reset() }
    }
}

/// One proxied connection: the client's channel and the target's, on one event loop.
final class ProxyPair: @unchecked Sendable {
    let id: Int
    let client: any Channel
    let target: any Channel
    private weak var proxy: ChaosProxy?
    /// Confined to the pair's event loop.
    private var isStalled = false
    private var gate: ProxyRequestGate
    /// Bytes waiting out the delay, toward the node and toward the client.
    private var delayedToTarget = 0
    private var delayedToClient = 0
    private var reading = (client: true, target: true)

    init(id: Int, client: any Channel, target: any Channel, proxy: ChaosProxy, options: ProxyRequestGate.Options) {
        self.id = id
        self.client = client
        self.target = target
        self.proxy = proxy
        gate = ProxyRequestGate(options: options)
    }

    func install() {
        do {
            try client.pipeline.syncOperations.addHandler(RelayHandler(pair: self, toTarget: true))
            try target.pipeline.syncOperations.addHandler(RelayHandler(pair: self, toTarget: false))
        } catch {
            close()
            return
        }
        client.closeFuture.whenComplete { _ in self.target.close(promise: nil) }
        target.closeFuture.whenComplete { _ in
            self.client.close(promise: nil)
            self.proxy?.closed(self.id)
        }
        for channel in [client, target] {
            _ = channel.setOption(.autoRead, value: true)
            channel.read()
        }
    }

    /// Forwards a chunk read on one side to the other (after the delay), unless stalled; a
    /// client's bytes go through the request gate first.
    func forward(_ buffer: ByteBuffer, toTarget: Bool) {
        guard let proxy, !isStalled, !gate.isRefused else { return }
        if proxy.drawStall() {
            isStalled = true
            proxy.stalled(id)
            return
        }
        let bytes = Array(buffer.readableBytesView)
        if toTarget {
            let wasTLS = gate.isTLS
            let outputs = gate.client(bytes)
            if gate.isTLS && !wasTLS { proxy.passedTLS(id) }
            apply(outputs)
        } else {
            send(bytes, toTarget: false)
            // The node's first answer to an upgrade decides what the held bytes are.
            if gate.awaitingUpgrade { apply(gate.target(bytes)) }
        }
    }

    private func apply(_ outputs: [ProxyRequestGate.Output]) {
        for output in outputs {
            switch output {
            case .forward(let bytes): send(bytes, toTarget: true)
            case .refuse(let status, let reason):
                proxy?.refusedRequest(id, status: status, reason: reason)
                // Nothing more goes to the node; the answer goes after what the client is
                // already owed, then the connection ends.
                send(ProxyRequestGate.answer(status: status, reason: reason), toTarget: false) { self.close() }
                return
            case .refuseTLS(let reason):
                proxy?.refusedTLS(id, reason: reason)
                send(ProxyRequestGate.tlsAccessDenied, toTarget: false) { self.close() }
                return
            }
        }
    }

    /// Writes `bytes` to one side after the delay, counting what waits; `then` runs once written.
    private func send(_ bytes: [UInt8], toTarget: Bool, then: (@Sendable () -> Void)? = nil) {
        guard let proxy, !bytes.isEmpty else {
            then?()
            return
        }
        proxy.counted(toTarget: toTarget ? bytes.count : 0, toClient: toTarget ? 0 : bytes.count)
        let out = toTarget ? target : client
        let delay = proxy.settings.delay
        let write: @Sendable () -> Void = {
            let written = out.writeAndFlush(out.allocator.buffer(bytes: bytes))
            if let then { written.whenComplete { _ in then() } }
        }
        guard delay.nanoseconds > 0 else { return write() }
        if toTarget { delayedToTarget += bytes.count } else { delayedToClient += bytes.count }
        proxy.delayed(max(delayedToTarget, delayedToClient))
        updateReading()
        out.eventLoop.scheduleTask(in: delay) {
            if toTarget { self.delayedToTarget -= bytes.count } else { self.delayedToClient -= bytes.count }
            if !self.isStalled { write() } else { then?() }
            self.updateReading()
        }
    }

    /// Each side reads only while the other can take more and the bytes waiting out the delay
    /// toward it are under the cap.
    private func updateReading() {
        let cap = proxy?.settings.maxDelayedBytes ?? Int.max
        let clientReads = target.isWritable && delayedToTarget < cap
        let targetReads = client.isWritable && delayedToClient < cap
        if clientReads != reading.client {
            reading.client = clientReads
            _ = client.setOption(.autoRead, value: clientReads)
        }
        if targetReads != reading.target {
            reading.target = targetReads
            _ = target.setOption(.autoRead, value: targetReads)
        }
    }

    /// Called when `channel`'s writability changes: the side that feeds it follows.
    func writabilityChanged(_ channel: any Channel) {
        updateReading()
    }

    func reset() {
        client.eventLoop.execute {
            // SO_LINGER 0: close sends a RST instead of a FIN.
            if let options = self.client as? any SocketOptionProvider {
                options.setSoLinger(linger(l_onoff: 1, l_linger: 0)).whenComplete { _ in self.client.close(promise: nil) }
            } else {
                self.client.close(promise: nil)
            }
            self.target.close(promise: nil)
        }
    }

    func close() {
        client.close(promise: nil)
        target.close(promise: nil)
    }
}

final class RelayHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    private let pair: ProxyPair
    private let toTarget: Bool

    init(pair: ProxyPair, toTarget: Bool) {
        self.pair = pair
        self.toTarget = toTarget
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        pair.forward(unwrapInboundIn(data), toTarget: toTarget)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        pair.writabilityChanged(context.channel)
        context.fireChannelWritabilityChanged()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}

extension ChaosProxy {
    /// The status the node at `host:port` answers an administrators-only request carrying the
    /// emulator's `owner` token with (`GET /.settings/rules.json`, `Authorization: Bearer
    /// owner`): 200 when the token is an administrator's key there, 401 when it is not; nil
    /// when the node does not answer (down, or serving TLS).
    public static func ownerTokenProbe(host: String, port: Int) async -> Int? {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { group.shutdownGracefully { _ in } }
        guard let connection = try? await HTTPConnection.connect(host: host, port: port, group: group, timeout: .seconds(5)) else { return nil }
        defer { connection.close() }
        return try? await connection.send(.GET, "/.settings/rules.json", headers: [("Authorization", "Bearer owner")], timeout: .seconds(5)).status
    }

    /// Why a proxy must not start, if it must not: one listening beyond loopback hands every
    /// client the node's loopback privileges, and a node accepts the owner token from loopback
    /// (docs/chaos.md, "The owner token"). The proxy refuses the token in the requests it can
    /// read, but not inside a realtime connection (an SDK's `auth` message travels in WebSocket
    /// frames the proxy never reads): so beyond loopback it starts only in front of a node that
    /// refuses the token (`probe`: `ownerTokenProbe`'s answer, 401), or with `--allow-owner-token`.
    public static func exposureRefusal(listen: String, listenIsLoopback: Bool, allowOwnerToken: Bool, to: String, probe: Int?) -> String? {
        guard !listenIsLoopback, !allowOwnerToken else { return nil }
        switch probe {
        case 200?:
            return "the node at \(to) accepts the emulator's owner token (development.accept_owner_token), and every connection through the proxy comes from loopback: "
                + "anyone who reaches \(listen) would be an administrator, over a WebSocket too, where the proxy cannot see the token. "
                + "Start the node with `development: {accept_owner_token: false}`, listen on loopback, or add --allow-owner-token to mean it"
        case nil:
            return "cannot check whether the node at \(to) accepts the emulator's owner token (no answer): a proxy beyond loopback starts only in front of a node that refuses it. "
                + "Start the node first, or add --allow-owner-token to mean it"
        default:
            return nil
        }
    }
}
