import BanyanRaft
import Logging
import Metrics
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

/// The peer transport (docs/server.md, "Peer transport"): mutual TLS over TCP, length-prefixed
/// frames, a hello that names the cluster, both node ids and the protocol version, then Raft
/// messages. Each node dials one outbound connection per peer and lane (`PeerLane`: with
/// `peer_lanes: 2`, appends, snapshot chunks and proposals on one, everything else on the
/// other) for what it sends; inbound connections only receive, any number per peer. A
/// connection that fails is redialled with exponential back-off;
/// while it is down, messages wait in a bounded backlog (an eighth of its lane's high-water mark) that is
/// flushed to whoever accepts the next connection, possibly a new incarnation of the peer
/// (the Raft core copes: see `Message.Body.heartbeat`); past the backlog, or while a live
/// connection has too many bytes queued, messages are dropped (Raft retries: that is the
/// backpressure).
///
/// Protocol version 6: the same messages again; it marks the log's command version 6 (security
/// rules in the log and writes naming the client the rules judge). Protocol version 5: the same messages as version 4; it marks the log's command version 5
/// (commands of ordered realtime sessions), which nodes of version 4 would apply as malformed
/// while newer ones apply them, so the two must not share a log. Version 4: Raft messages are
/// `MessageCodec` version 4 (acknowledgements say whether
/// their sender may vote, so a leader counts no blank voter's in a quorum; heartbeats carry the
/// term of the entry at their commit, so a follower commits only what it holds). Version 3 made vote
/// requests carry the incarnation the candidate's configuration records for the recipient. Version 2 (R22) added
/// the sender's incarnation to the hello and incarnations to memberships. Peers of another
/// version are refused at the hello, naming both versions, so every node of a cluster must run
/// the same protocol before they can talk again (restart them all with the new binary;
/// docs/runbook.md).
/// Version 7: the same messages; it marks the log's command versions 7 (accounts) and 8
/// (free-space alarms), which nodes of version 6 would apply as malformed. Version 8: the same
/// messages; it marks command version 9 (client writes, exactly once across connections).
/// Version 10: staged payloads (docs/staged-payloads.md): message kinds 16–19 and reference
/// entries in the log (`0xB5`), which a node of version 9 would accept without their payloads
/// and apply as malformed.
final class PeerTransport: PeerSender, @unchecked Sendable {
    static let protocolVersion: UInt16 = 10
    /// Bytes queued on one connection beyond which new messages are dropped; with two lanes,
    /// on a peer's two connections together (`PeerLane.highWater`).
    static let maxQueuedBytes = 64 << 20

    let nodeID: UInt64
    let clusterID: String
    let advertised: HostPort
    /// This node's incarnation, sent in every hello (0: unknown, a legacy data directory).
    let incarnation: UInt64
    /// Outbound connections per peer: 1 (everything on one) or 2 (`PeerLane`).
    let lanes: Int
    private let group: any EventLoopGroup
    /// Where inbound connections live (their TLS handshakes, decryption and frame decoding):
    /// by default `group`; the server gives them a thread of their own, off the replica loop.
    private let acceptGroup: any EventLoopGroup
    /// The TLS contexts new connections use (accepting, dialling); `useTLS` swaps them when the
    /// node reloads its certificates. Connections already open keep theirs.
    private let contexts: Mutex<(server: NIOSSLContext, client: NIOSSLContext)>
    private let logger: Logger
    private let deliver: @Sendable (UInt64, HostPort?, [Message]) -> Void
    /// Called with (peer id, incarnation) when an accepted hello names a nonzero incarnation, on
    /// the connection's event loop and before any message of that connection is delivered. The
    /// runtime hands it to the Raft core (`RaftNode.noteIncarnation`), in order with `deliver`.
    private let peerIncarnation: (@Sendable (UInt64, UInt64) -> Void)?
    /// Refuse a hello whose sender id is not the one its certificate names (`node<id>`).
    let bindNodeIDs: Bool
    private let state = Mutex<State>(State())
    private var serverChannel: (any Channel)?
    /// The fault switch (`--allow-fault-injection` only): dropped and delayed peer traffic.
    let faults: FaultSwitch?
    /// Bytes of delayed batches one connection (one lane) may hold (fault injection only): past it new
    /// batches are dropped, as past a live connection's queue (a delay must not buffer
    /// without bound while the replica loop keeps sending). Counted in `Message.size` (an
    /// estimate, not the encoded bytes), and beside the connection's queue, not within it: a
    /// delayed peer may hold this much more than an undelayed one (docs/chaos.md).
    var maxDelayedBytes = PeerTransport.maxQueuedBytes

    private struct State: ~Copyable {
        var addresses: [UInt64: HostPort] = [:]
        var connections: [Outbound: PeerConnection] = [:]
        var stopped = false
    }

    private struct Outbound: Hashable {
        let peer: UInt64
        let lane: PeerLane
    }

    let sentBytes = Counter(label: "banyan_peer_sent_bytes_total")
    let droppedMessages = Counter(label: "banyan_peer_dropped_messages_total")
    let refusedConnections = Counter(label: "banyan_peer_refused_connections_total")

    /// Inbound connections whose TLS handshake and hello have not completed (issue 18): anyone
    /// who reaches the peer port can open them (their handshakes run on `acceptGroup`). At
    /// most `maxUnauthenticated` at once (more are closed on accept), each closed unless it
    /// completes within `handshakeTimeout`; both refusals are logged (the first of a burst and
    /// every hundredth) and counted in `banyan_peer_refused_connections_total`.
    let maxUnauthenticated: Int
    let handshakeTimeout: TimeAmount
    let unauthenticated = Atomic<Int>(0)
    private let refusals = Atomic<Int>(0)

    convenience init(
        nodeID: UInt64, clusterID: String, advertised: HostPort, group: any EventLoopGroup, acceptGroup: (any EventLoopGroup)? = nil,
        serverTLS: TLSConfiguration,
        clientTLS: TLSConfiguration, logger: Logger, bindNodeIDs: Bool = true, incarnation: UInt64 = 0, lanes: Int = 2,
        peerIncarnation: (@Sendable (UInt64, UInt64) -> Void)? = nil, maxUnauthenticated: Int = 64, handshakeTimeout: TimeAmount = .seconds(10),
        faults: FaultSwitch? = nil, deliver: @escaping @Sendable (UInt64, HostPort?, [Message]) -> Void
    ) throws {
        self.init(
            nodeID: nodeID, clusterID: clusterID, advertised: advertised, group: group, acceptGroup: acceptGroup,
            serverContext: try NIOSSLContext(configuration: serverTLS), clientContext: try NIOSSLContext(configuration: clientTLS), logger: logger,
            bindNodeIDs: bindNodeIDs, incarnation: incarnation, lanes: lanes, peerIncarnation: peerIncarnation, maxUnauthenticated: maxUnauthenticated,
            handshakeTimeout: handshakeTimeout, faults: faults, deliver: deliver)
    }

    init(
        nodeID: UInt64, clusterID: String, advertised: HostPort, group: any EventLoopGroup, acceptGroup: (any EventLoopGroup)? = nil,
        serverContext: NIOSSLContext, clientContext: NIOSSLContext, logger: Logger, bindNodeIDs: Bool = true, incarnation: UInt64 = 0, lanes: Int = 2,
        peerIncarnation: (@Sendable (UInt64, UInt64) -> Void)? = nil, maxUnauthenticated: Int = 64, handshakeTimeout: TimeAmount = .seconds(10),
        faults: FaultSwitch? = nil, deliver: @escaping @Sendable (UInt64, HostPort?, [Message]) -> Void
    ) {
        self.faults = faults
        self.maxUnauthenticated = maxUnauthenticated
        self.handshakeTimeout = handshakeTimeout
        self.bindNodeIDs = bindNodeIDs
        self.incarnation = incarnation
        self.lanes = lanes
        self.peerIncarnation = peerIncarnation
        self.nodeID = nodeID
        self.clusterID = clusterID
        self.advertised = advertised
        self.group = group
        self.acceptGroup = acceptGroup ?? group
        self.contexts = Mutex((serverContext, clientContext))
        self.logger = logger
        self.deliver = deliver
    }

    /// New connections from now on use these contexts (a certificate reload, `NodeTLS`).
    func useTLS(server: NIOSSLContext, client: NIOSSLContext) {
        contexts.withLock { $0 = (server, client) }
    }

    // MARK: - Inbound

    func listen(on address: HostPort) throws -> SocketAddress? {
        let bootstrap = ServerBootstrap(group: acceptGroup)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelInitializer { channel in AcceptErrorReporter.install(on: channel, listener: "peer", logger: self.logger) }
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                let pending = self.unauthenticated.wrappingAdd(1, ordering: .relaxed).newValue
                guard pending <= self.maxUnauthenticated else {
                    self.unauthenticated.wrappingSubtract(1, ordering: .relaxed)
                    self.refuse("too many peer connections without a completed handshake", remote: channel.remoteAddress)
                    return channel.close()
                }
                return channel.eventLoop.makeCompletedFuture {
                    let tls = NIOSSLServerHandler(context: self.contexts.withLock { $0.server })
                    try channel.pipeline.syncOperations.addHandler(tls)
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder()))
                    try channel.pipeline.syncOperations.addHandler(InboundPeerHandler(transport: self))
                }
            }
        let channel = try bootstrap.bind(host: address.host, port: address.port).wait()
        serverChannel = channel
        return channel.localAddress
    }

    fileprivate func hello(_ hello: PeerHello, from remote: SocketAddress?, identity: PeerIdentity?) -> PeerHelloReply {
        func refuse(_ reason: String) -> PeerHelloReply {
            refusedConnections.increment()
            logger.warning("refused a peer connection", metadata: ["reason": "\(reason)", "remote": "\(remote.map { "\($0)" } ?? "?")"])
            return PeerHelloReply(accepted: false, reason: reason, protocolVersion: Self.protocolVersion)
        }
        guard hello.protocolVersion == Self.protocolVersion else {
            return refuse("protocol version \(hello.protocolVersion) is not \(Self.protocolVersion)")
        }
        guard hello.clusterID == clusterID else { return refuse("cluster id '\(hello.clusterID)' is not '\(clusterID)'") }
        guard hello.to == nodeID else { return refuse("this is node \(nodeID), not node \(hello.to)") }
        guard hello.from != 0, hello.from != nodeID else { return refuse("bad sender id \(hello.from)") }
        if bindNodeIDs, identity?.names(node: hello.from) != true {
            // Any holder of a cluster certificate could otherwise speak as any node.
            return refuse("node \(hello.from)'s hello came with the certificate of \(identity.map { "\($0)" } ?? "nobody"), which does not name node\(hello.from)")
        }
        return PeerHelloReply(accepted: true, reason: "", protocolVersion: Self.protocolVersion)
    }

    /// Counts and logs a refused inbound connection: the first of a burst and every hundredth
    /// (a flood must not flood the log too).
    fileprivate func refuse(_ reason: String, remote: SocketAddress?) {
        refusedConnections.increment()
        let n = refusals.wrappingAdd(1, ordering: .relaxed).newValue
        if n == 1 || n % 100 == 0 {
            logger.warning("refused a peer connection", metadata: ["reason": "\(reason)", "remote": "\(remote.map { "\($0)" } ?? "?")", "refused_so_far": "\(n)"])
        }
    }

    /// An accepted hello named the sender's incarnation.
    fileprivate func learned(incarnation: UInt64, of peer: UInt64) {
        guard incarnation != 0 else { return }
        peerIncarnation?(peer, incarnation)
    }

    fileprivate func received(from peer: UInt64, advertised: HostPort?, _ messages: [Message]) {
        if let faults, faults.drops(peer) {
            faults.dropped(messages.count)
            return
        }
        deliver(peer, advertised, messages)
    }

    fileprivate func log(_ level: Logger.Level, _ message: String, _ metadata: Logger.Metadata) {
        logger.log(level: level, "\(message)", metadata: metadata)
    }

    // MARK: - Outbound

    func updateAddresses(_ addresses: [UInt64: HostPort]) {
        let stale: [PeerConnection] = state.withLock { s in
            s.addresses = addresses
            var changed: [PeerConnection] = []
            for (key, connection) in s.connections where addresses[key.peer] != connection.address {
                changed.append(connection)
                s.connections[key] = nil
            }
            return changed
        }
        for c in stale { c.close() }
    }

    func send(_ messages: [Message]) {
        var byPeer: [UInt64: [Message]] = [:]
        for m in messages where m.to != nodeID { byPeer[m.to, default: []].append(m) }
        for (peer, batch) in byPeer {
            if let faults, faults.drops(peer) {
                faults.dropped(batch.count)
                continue
            }
            var byLane: [[Message]] = Array(repeating: [], count: PeerLane.allCases.count)
            for m in batch { byLane[PeerLane.of(m, lanes: lanes).rawValue].append(m) }
            for lane in PeerLane.allCases where !byLane[lane.rawValue].isEmpty {
                send(byLane[lane.rawValue], to: Outbound(peer: peer, lane: lane))
            }
        }
    }

    private func send(_ batch: [Message], to key: Outbound) {
        let connection: PeerConnection? = state.withLock { s in
            guard !s.stopped else { return nil }
            if let c = s.connections[key] { return c }
            guard let address = s.addresses[key.peer] else { return nil }
            let c = PeerConnection(
                transport: self, peer: key.peer, lane: key.lane, highWater: PeerLane.highWater(key.lane, lanes: lanes), address: address,
                eventLoop: group.next())
            s.connections[key] = c
            return c
        }
        guard let connection else {
            droppedMessages.increment(by: batch.count)
            return
        }
        connection.send(batch)
    }

    /// Outbound connection attempts made (tests: an unreachable peer is dialled at the back-off's
    /// pace, not once per message).
    let dialAttempts = Atomic<Int>(0)

    fileprivate func dial(_ connection: PeerConnection) -> EventLoopFuture<any Channel> {
        dialAttempts.add(1, ordering: .relaxed)
        let host = connection.address.host
        let isIP = (try? SocketAddress(ipAddress: host, port: 0)) != nil
        return ClientBootstrap(group: connection.eventLoop)
            .connectTimeout(.seconds(2))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelOption(.writeBufferWaterMark, value: .init(low: connection.highWater / 2, high: connection.highWater))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let tls = try NIOSSLClientHandler(context: self.contexts.withLock { $0.client }, serverHostname: isIP ? nil : host)
                    try channel.pipeline.syncOperations.addHandler(tls)
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder()))
                    try channel.pipeline.syncOperations.addHandler(OutboundPeerHandler(connection: connection))
                }
            }
            .connect(host: host, port: connection.address.port)
    }

    func shutdown() {
        let all: [PeerConnection] = state.withLock { s in
            s.stopped = true
            defer { s.connections = [:] }
            return Array(s.connections.values)
        }
        for c in all { c.close() }
        try? serverChannel?.close().wait()
    }
}

/// Which of a peer's outbound connections carries a message (`peer_lanes`; docs/server.md,
/// `PeerTransport` and "Large writes"). With two lanes, a heartbeat, vote or acknowledgement never waits behind
/// appends of large entries (issue 18: a 15 MiB append takes hundreds of milliseconds to
/// drain on a busy machine, and several queue when clients write at once). Every append goes
/// on the bulk lane whatever its size, so appends stay in order among themselves: a small one
/// overtaking a large one would be rejected (its previous entry not there yet), and the
/// rejection would send the leader back to probing and resending the large entry. Order
/// between the lanes does not matter to Raft (docs/server.md, "Large writes", says why).
enum PeerLane: Int, CaseIterable, Sendable {
    /// Heartbeats and their answers, votes, append answers, read index, timeoutNow.
    case control = 0
    /// Appends, snapshot chunks and forwarded proposals: what may carry large payloads.
    case bulk = 1
    /// Staged payloads and fetched ones (`stage`, `stagedPayload`: docs/staged-payloads.md) and
    /// forwards of large writes, with three lanes: a 15 MiB payload in flight never holds back
    /// the small appends or forwards behind it.
    case staged = 2

    static func of(_ message: Message, lanes: Int) -> PeerLane {
        guard lanes > 1 else { return .control }
        switch message.body {
        case .append, .snapshotChunk: return .bulk
        // A follower's forward of a large write (1 MiB or more) goes beside the staged payloads,
        // so its small forwards do not queue behind it (an ordered session's later write that
        // overtakes it applies after it anyway: docs/internals/state-machine.md).
        case .proposal: return lanes > 2 && message.size >= 1 << 20 ? .staged : .bulk
        case .stage, .stagedPayload: return lanes > 2 ? .staged : .bulk
        default: return .control
        }
    }

    /// A lane's write-buffer high-water mark: with one lane, `maxQueuedBytes`; with two, the
    /// control lane a sixteenth of it (4 MiB: some hundred thousand small messages) and the bulk
    /// lane the rest, so a peer's connections together queue no more than one did.
    static func highWater(_ lane: PeerLane, lanes: Int) -> Int {
        let control = PeerTransport.maxQueuedBytes / 16
        guard lanes > 1 else { return PeerTransport.maxQueuedBytes }
        if lanes == 2 { return lane == .control ? control : PeerTransport.maxQueuedBytes - control }
        // Three: the bulk and staged lanes share the rest evenly (30 MiB each: two 15 MiB writes).
        let shared = (PeerTransport.maxQueuedBytes - control) / 2
        switch lane {
        case .control: return control
        case .bulk: return shared
        case .staged: return PeerTransport.maxQueuedBytes - control - shared
        }
    }
}

/// One outbound connection to a peer (one lane), confined to `eventLoop`.
final class PeerConnection: @unchecked Sendable {
    let peer: UInt64
    let lane: PeerLane
    /// The write-buffer high-water mark (`PeerLane.highWater`); an eighth of it while not
    /// connected.
    let highWater: Int
    let address: HostPort
    let eventLoop: any EventLoop
    private weak var transport: PeerTransport?
    private var channel: (any Channel)?
    private var ready = false
    private var connecting = false
    private var closed = false
    private var backoffMs: Int64 = 50
    private var pending: [Message] = []
    private var pendingBytes = 0
    private var failures = 0

    init(transport: PeerTransport, peer: UInt64, lane: PeerLane, highWater: Int, address: HostPort, eventLoop: any EventLoop) {
        self.transport = transport
        self.peer = peer
        self.lane = lane
        self.highWater = highWater
        self.address = address
        self.eventLoop = eventLoop
    }

    func send(_ messages: [Message]) {
        if transport?.faults != nil {
            // Fault injection only (docs/chaos.md): delayed batches keep their order.
            if eventLoop.inEventLoop {
                sendDelayed(messages)
            } else {
                eventLoop.execute { self.sendDelayed(messages) }
            }
            return
        }
        if eventLoop.inEventLoop {
            enqueue(messages)
        } else {
            eventLoop.execute { self.enqueue(messages) }
        }
    }

    /// The latest deadline a delayed batch was scheduled for, and how many still wait: a batch
    /// never goes before one sent earlier, even when the delay is lowered or cleared meanwhile
    /// (a lower delay would otherwise overtake; equal deadlines run in scheduling order).
    private var delayedUntil: UInt64 = 0
    private var delayedWaiting = 0
    /// Bytes of the batches waiting out the delay (at most the transport's `maxDelayedBytes`).
    private(set) var delayedBytes = 0

    private func sendDelayed(_ messages: [Message]) {
        guard let transport else { return }
        let delay = UInt64(transport.faults?.peerDelayMilliseconds ?? 0) * 1_000_000
        if delay == 0 && delayedWaiting == 0 { return enqueue(messages) }
        let bytes = messages.reduce(0) { $0 + $1.size }
        guard delayedBytes + bytes <= transport.maxDelayedBytes else {
            transport.droppedMessages.increment(by: messages.count)
            return
        }
        let at = max(NIODeadline.now().uptimeNanoseconds + delay, delayedUntil)
        delayedUntil = at
        delayedWaiting += 1
        delayedBytes += bytes
        eventLoop.scheduleTask(deadline: .uptimeNanoseconds(at)) {
            self.delayedWaiting -= 1
            self.delayedBytes -= bytes
            self.enqueue(messages)
        }
    }

    private func enqueue(_ messages: [Message]) {
        guard !closed, let transport else { return }
        if ready, let channel {
            // Writability turns off past the write-buffer high-water mark (`highWater`).
            guard channel.isWritable else {
                transport.droppedMessages.increment(by: messages.count)
                return
            }
            write(messages, to: channel)
            return
        }
        // Not connected: keep a bounded backlog for when the handshake completes.
        for m in messages {
            if pendingBytes + m.size > highWater / 8 {
                transport.droppedMessages.increment()
                continue
            }
            pending.append(m)
            pendingBytes += m.size
        }
        connectIfNeeded()
    }

    private func write(_ messages: [Message], to channel: any Channel) {
        var frames: [UInt8] = []
        frames.reserveCapacity(messages.reduce(0) { $0 + $1.size + 40 })
        for m in messages { Framing.appendFrame(m, to: &frames) }
        var buffer = channel.allocator.buffer(capacity: frames.count)
        buffer.writeBytes(frames)
        transport?.sentBytes.increment(by: frames.count)
        channel.writeAndFlush(buffer, promise: nil)
    }

    /// Set between a failed attempt and its back-off's end: messages queued meanwhile wait for
    /// the scheduled retry instead of dialling at once (a leader's every send to a dead peer did,
    /// dozens of times a second, on its replica loop).
    private var backingOff = false

    private func connectIfNeeded() {
        guard !connecting, !backingOff, channel == nil, !closed, let transport else { return }
        connecting = true
        transport.dial(self).whenComplete { result in
            self.connecting = false
            switch result {
            case .success(let channel):
                if self.closed {
                    channel.close(promise: nil)
                    return
                }
                self.channel = channel
                let hello = PeerHello(
                    clusterID: transport.clusterID, from: transport.nodeID, to: self.peer, protocolVersion: PeerTransport.protocolVersion,
                    address: transport.advertised.description, incarnation: transport.incarnation)
                var buffer = channel.allocator.buffer(capacity: 64)
                let body = hello.encode()
                buffer.writeInteger(UInt32(body.count), endianness: .little)
                buffer.writeBytes(body)
                channel.writeAndFlush(buffer, promise: nil)
                channel.closeFuture.whenComplete { _ in self.eventLoop.execute { self.lost(channel) } }
            case .failure(let error):
                self.failed("connect failed: \(error)")
            }
        }
    }

    /// The peer accepted our hello: flush the backlog.
    func accepted(on channel: any Channel) {
        ready = true
        failures = 0
        backoffMs = 50
        transport?.log(.info, "connected to peer", ["peer": "\(peer)", "address": "\(address)", "lane": "\(lane)"])
        let backlog = pending
        pending = []
        pendingBytes = 0
        if !backlog.isEmpty { write(backlog, to: channel) }
    }

    func refused(_ reason: String) {
        transport?.log(.error, "peer refused our connection", ["peer": "\(peer)", "lane": "\(lane)", "reason": "\(reason)"])
        channel?.close(promise: nil)
    }

    private var lastError: String?

    /// Remembers a connection error (called on the connection's event loop).
    func noteError(_ error: any Error) { lastError = "\(error)" }

    private func lost(_ channel: any Channel) {
        guard self.channel === channel else { return }
        self.channel = nil
        ready = false
        let reason = lastError.map { "connection closed: \($0)" } ?? "connection closed"
        lastError = nil
        failed(reason)
    }

    private func failed(_ why: String) {
        guard !closed else { return }
        failures += 1
        // Log the first failure and then every 20th, so an absent peer does not flood the log.
        if failures == 1 || failures % 20 == 0 {
            transport?.log(.warning, "peer unreachable; retrying", ["peer": "\(peer)", "lane": "\(lane)", "address": "\(address)", "reason": "\(why)", "attempts": "\(failures)"])
        }
        let delay = backoffMs + Int64.random(in: 0...(backoffMs / 2))
        backoffMs = min(backoffMs * 2, 2_000)
        backingOff = true
        eventLoop.scheduleTask(in: .milliseconds(delay)) {
            self.backingOff = false
            if !self.pending.isEmpty { self.connectIfNeeded() }
        }
    }

    func close() {
        eventLoop.execute {
            self.closed = true
            self.channel?.close(promise: nil)
            self.channel = nil
            self.pending = []
        }
    }
}

/// Splits the byte stream into length-prefixed frames (u32 little-endian length, then the body).
struct FrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = ByteBuffer
    static let maxFrameBytes = Framing.maxFrameBytes

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let length = buffer.getInteger(at: buffer.readerIndex, endianness: .little, as: UInt32.self) else { return .needMoreData }
        guard Int(length) <= Self.maxFrameBytes else { throw PeerProtocolError("frame of \(length) bytes exceeds the limit") }
        guard buffer.readableBytes >= 4 + Int(length) else { return .needMoreData }
        buffer.moveReaderIndex(forwardBy: 4)
        guard let frame = buffer.readSlice(length: Int(length)) else { return .needMoreData }
        context.fireChannelRead(wrapInboundOut(frame))
        return .continue
    }
}

struct PeerProtocolError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// The accepting side: hello first, then Raft messages delivered in batches per read burst.
final class InboundPeerHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private weak var transport: PeerTransport?
    private var peer: UInt64?
    private var advertised: HostPort?
    private var batch: [Message] = []
    private var badFrames = 0
    /// Counted in `PeerTransport.unauthenticated` until the hello is accepted or the channel closes.
    private var counted = true
    private var handshakeDeadline: Scheduled<Void>?

    init(transport: PeerTransport) { self.transport = transport }

    func handlerAdded(context: ChannelHandlerContext) {
        guard let transport else { return }
        let channel = context.channel
        handshakeDeadline = context.eventLoop.scheduleTask(in: transport.handshakeTimeout) { [weak self] in
            guard let self, self.peer == nil else { return }
            transport.refuse("no completed TLS handshake and hello within \(transport.handshakeTimeout)", remote: channel.remoteAddress)
            channel.close(promise: nil)
        }
    }

    private func authenticated() {
        handshakeDeadline?.cancel()
        handshakeDeadline = nil
        if counted {
            counted = false
            transport?.unauthenticated.wrappingSubtract(1, ordering: .relaxed)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        authenticated()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        guard let transport else { return }
        guard let peer else {
            let bytes = frame.getBytes(at: frame.readerIndex, length: frame.readableBytes) ?? []
            let reply: PeerHelloReply
            do {
                let hello = try PeerHello.decode(bytes)
                reply = transport.hello(hello, from: context.remoteAddress, identity: PeerTLS.peerIdentity(in: context.pipeline.syncOperations))
                if reply.accepted {
                    authenticated()
                    self.peer = hello.from
                    self.advertised = try? HostPort(parsing: hello.address)
                    transport.learned(incarnation: hello.incarnation, of: hello.from)
                }
            } catch {
                reply = transport.hello(
                    PeerHello(clusterID: "", from: 0, to: 0, protocolVersion: 0, address: ""), from: context.remoteAddress, identity: nil)
            }
            var out = context.channel.allocator.buffer(capacity: 32)
            let body = reply.encode()
            out.writeInteger(UInt32(body.count), endianness: .little)
            out.writeBytes(body)
            let write = context.writeAndFlush(wrapOutboundOut(out))
            if !reply.accepted {
                let channel = context.channel
                write.whenComplete { _ in channel.close(promise: nil) }
            }
            return
        }
        do {
            let decoded: Result<Message, WireError> = frame.withUnsafeReadableBytes { raw in
                do throws(WireError) { return .success(try MessageCodec.decode(raw)) } catch { return .failure(error) }
            }
            let m = try decoded.get()
            // A peer speaks only for itself, and only to us.
            guard m.from == peer, m.to == transport.nodeID else {
                throw PeerProtocolError("message from \(m.from) to \(m.to) on node \(peer)'s connection")
            }
            batch.append(m)
        } catch {
            badFrames += 1
            transport.log(.warning, "dropped a malformed peer frame", ["peer": "\(peer)", "error": "\(error)"])
            if badFrames > 100 { context.close(promise: nil) }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if let peer, !batch.isEmpty {
            transport?.received(from: peer, advertised: advertised, batch)
            advertised = nil
            batch = []
        }
        context.fireChannelReadComplete()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // TLS failures (a certificate not signed by the cluster CA, none at all) land here.
        transport?.refusedConnections.increment()
        transport?.log(.warning, "peer connection failed", ["remote": "\(context.remoteAddress.map { "\($0)" } ?? "?")", "error": "\(error)"])
        context.close(promise: nil)
    }
}

/// The dialling side: waits for the hello reply; afterwards nothing is expected inbound.
final class OutboundPeerHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    private let connection: PeerConnection

    init(connection: PeerConnection) { self.connection = connection }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var frame = unwrapInboundIn(data)
        let bytes = frame.readBytes(length: frame.readableBytes) ?? []
        guard let reply = try? PeerHelloReply.decode(bytes) else {
            connection.refused("unreadable hello reply")
            return
        }
        if reply.accepted { connection.accepted(on: context.channel) } else { connection.refused(reply.reason) }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        context.fireChannelWritabilityChanged()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A refused handshake (unknown CA, certificate required, wrong host) lands here: keep it
        // as the reason the next "peer unreachable" line reports.
        connection.noteError(error)
        context.close(promise: nil)
    }
}
