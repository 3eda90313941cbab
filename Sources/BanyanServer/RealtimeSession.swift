import BanyanAuth
import BanyanListen
import BanyanNode
import BanyanQuery
import BanyanREST
import BanyanReplica
import BanyanRules
import BanyanSession
import BanyanStateMachine
import BanyanTree
import Foundation
import Logging
import NIOCore
import NIOWebSocket
import Synchronization

/// One realtime connection (WebSocket, protocol v5) on its event loop: the driver of a
/// `SessionCore` (docs/realtime.md). Frames in go to the core; its actions become listens on the
/// loop's `RealtimeHub`, reads and writes on the node (in the connection's own client session),
/// and frames out. Confined to the channel's event loop.
final class RealtimeSessionHandler: ChannelInboundHandler, RealtimePushTarget, @unchecked Sendable {
    typealias InboundIn = WebSocketFrame
    /// Frames go out encoded here (`ServerFrames`), so one encoding of a push serves every
    /// connection that receives it (no per-connection copy or encoder pass).
    typealias OutboundOut = ByteBuffer

    private let server: HTTPServer
    private let hub: RealtimeHub
    private let upgrade: RealtimeUpgrade
    let identity: SessionIdentity
    private var core: SessionCore
    private var context: ChannelHandlerContext?
    /// `context.channel`, kept (every push asks whether the channel is writable).
    private var channel: (any Channel)?
    /// The session's listens and their ids in the hub.
    private var hubIDs: [SessionCore.ListenID: UInt64] = [:]
    /// Something was written in the connection's session (its end must then be recorded).
    private var wrote = false
    private var finished = false
    private var closing = false
    private var keepAlive: RepeatedTask?
    /// Who the connection's credentials (`auth`, `gauth`) name: signed out until then, after
    /// `unauth`, after a refused credential and once a verified token expires.
    private var client: ClientIdentity = .client(.signedOut)
    /// The sign-out due when a verified token's `exp` (plus the clock skew) passes (`ac`).
    private var expiry: Scheduled<Void>?
    /// Started listens and what they read: judged again when the rules or credentials change.
    private var startedListens: [SessionCore.ListenID: (path: Path, params: QueryParams?)] = [:]
    private var dirty = false
    /// Writes held while the previous connection's end (`ls`) is being recorded, in order.
    private var holdingWrites = false
    private var heldWrites: [(request: Int64, write: SessionCore.Write, client: ClientWriteNumber?)] = []
    /// Set while the node drains this connection: where the reset sends the client.
    private var resetTarget: String?
    /// Bytes of a protocol message arriving in several frames, charged to the node's budget.
    private var assembly: BudgetAccount
    /// The node's lease holder when the connection opened: its onDisconnect writes name it, and
    /// if that lease lapses the connection is closed (docs/realtime.md, "Node leases").
    private let holder: UInt64
    /// How its messages go out: plain, or compressed (permessage-deflate, when negotiated).
    private let encoding: OutboundEncoding
    /// The connection's output not yet taken by its client, charged to the node's budget for
    /// queued output (`http.max_queued_answer_bytes`, shared with REST answers and event streams).
    private var queuedOutput: QueuedAnswers?

    static let tickInterval = TimeAmount.seconds(5)

    init(server: HTTPServer, hub: RealtimeHub, upgrade: RealtimeUpgrade, identity: SessionIdentity) {
        self.server = server
        self.hub = hub
        self.upgrade = upgrade
        self.identity = identity
        holder = server.leaseHolder()
        assembly = BudgetAccount(budget: server.assembling)
        encoding = OutboundEncoding(upgrade.deflate)
        let host = server.config.publicHost ?? upgrade.host ?? "\(server.config.clientAddress.host):\(server.config.clientAddress.port)"
        core = SessionCore(timestamp: NodeRuntime.wallClock(), host: host, sessionID: identity.description)
    }

    private var namespace: String { upgrade.namespace }
    private var runtime: NodeRuntime { server.runtime }
    private var owner: UInt64 { identity.connection }

    private var rules: Rules? { runtime.rulesInForce.withLock { $0[namespace] } }

    /// `no_index` when the namespace has rules and the query orders by a child (or value) that
    /// its `.indexOn` does not declare: the SDKs log a hint to add one, as with Firebase (the
    /// node still filters on the server). The node logs it too, once per location and child.
    private func indexWarnings(_ path: Path, _ params: QueryParams?) -> [String] {
        guard let params, let rules, !rules.declaresIndex(params.index, at: path) else { return [] }
        server.warnMissingIndex(namespace: namespace, path: path, index: params.index)
        return ["no_index"]
    }

    /// Cancels (`c`) every started listen the rules in force no longer allow this client.
    private func rejudgeListens() {
        guard !finished, !startedListens.isEmpty else { return }
        let tree = hub.tree(namespace) ?? .empty
        for (id, spec) in startedListens.sorted(by: { $0.key < $1.key }) where readDenied(at: spec.path, spec.params, tree: tree) {
            startedListens[id] = nil
            perform(core.listenRevoked(id))
        }
        flush()
    }

    /// A read or listen at `path` refused by the rules (or, without rules, by the development
    /// settings), judged on `tree`.
    private func readDenied(at path: Path, _ params: QueryParams?, tree: Tree) -> Bool {
        Access.readDenied(
            client, rules: rules, allowUnauthenticated: server.config.development.allowUnauthenticated, at: path, query: params, tree: tree,
            now: NodeRuntime.wallClock())
    }

    static func now() -> Int64 { Int64(DispatchTime.now().uptimeNanoseconds / 1_000_000) }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        channel = context.channel
        queuedOutput = QueuedAnswers(budget: server.queuedAnswerBudget, channel: context.channel)
        guard server.realtimeOpened(self, channel: context.channel, holder: holder) else {
            context.close(promise: nil)
            return
        }
        hub.attach(owner: owner, encoding: encoding, target: self)
        hub.watchRules(owner: owner) { [weak self] in self?.rejudgeListens() }
        runtime.openSession(identity.connection)
        // `ls`: the client's previous connection is over, wherever it was; its onDisconnect
        // writes fire now, before anything this connection writes (the first command of its
        // ordered stream). A previous connection still open on this node is closed.
        if let last = upgrade.lastSession, let old = SessionIdentity(parsing: Substring(last)), old.connection != identity.connection {
            server.closeRealtime(connection: old.connection)
            wrote = true
            // This connection's writes wait until the old connection's end has applied (or
            // could not be recorded), so its `offline` never lands after this one's `online`.
            holdingWrites = true
            endPrevious(old)
        }
        core.heard(at: Self.now())
        send(core.hello)
        flush()
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        keepAlive = context.eventLoop.scheduleRepeatedTask(initialDelay: Self.tickInterval, delay: Self.tickInterval) { _ in
            let handler = bound.value
            handler.perform(handler.core.tick(now: Self.now()))
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        guard !finished else { return }
        core.heard(at: Self.now())
        switch frame.opcode {
        case .text:
            // Nothing read after this side closed (a drain's reset, a refusal) is acted on: the
            // client counts it unanswered, so it must not apply.
            guard !closing else { return }
            let payload = frame.unmaskedData
            perform(core.receive(frame: Array(payload.readableBytesView)))
            // Chunks of a protocol message held until it is whole count against the node's
            // budget for messages being assembled.
            guard assembly.hold(core.assemblingBytes) else {
                assembly.releaseAll()
                server.logger.notice("closed a realtime connection: the node's budget for messages being assembled is used up", metadata: ["session": "\(identity)"])
                return close(code: .init(codeNumber: 1013), reason: "the node's budget for messages being assembled is used up; try again")
            }
        case .binary:
            send(ServerMessage.error("binary frames are not part of the protocol; send text frames"))
            close(code: .unacceptableData, reason: "binary frame")
        case .ping:
            guard !closing else { return }
            context.write(wrapOutboundOut(ServerFrames.encode(opcode: 0xA, frame.unmaskedData, allocator: context.channel.allocator)), promise: nil)
            dirty = true
        case .connectionClose:
            // Answer the client's close with ours (its code when it gave one), then end.
            guard !closing else { return context.close(promise: nil) }
            closing = true
            var data = frame.unmaskedData
            let code = data.readableBytes >= 2 ? data.readSlice(length: 2) : nil
            var buffer = context.channel.allocator.buffer(capacity: 2)
            if var code { buffer.writeBuffer(&code) }
            let channel = context.channel
            context.writeAndFlush(wrapOutboundOut(ServerFrames.encode(opcode: 0x8, buffer, allocator: channel.allocator))).whenComplete { _ in
                channel.close(promise: nil)
            }
        default:
            break
        }
        flush()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        flush()
        context.fireChannelReadComplete()
    }

    func channelInactive(context: ChannelHandlerContext) {
        end()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        end()
        self.context = nil
        channel = nil
    }

    /// Bad frames (the decoder's and the aggregator's errors) close with the code RFC 6455
    /// gives them (a frame over the size limit: 1009); anything else just closes.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        server.logger.debug("realtime connection error", metadata: ["error": "\(error)", "session": "\(identity)"])
        switch error {
        case NIOWebSocketError.invalidFrameLength, NIOWebSocketFrameAggregator.Error.accumulatedFrameSizeIsTooLarge:
            close(code: .messageTooLarge, reason: "frame too large")
        case let e as InboundFrameError:
            // Reserved bits and compressed messages (`PerMessageDeflateReader`).
            close(code: e.code, reason: e.reason)
        case is NIOWebSocketError, is NIOWebSocketFrameAggregator.Error:
            close(code: .protocolError, reason: "WebSocket protocol error")
        default:
            context.close(promise: nil)
        }
    }

    /// The connection is over (closed by either side, a socket error, a keep-alive timeout):
    /// listens stop, and its end is recorded in the log, which fires its onDisconnect writes.
    private func end() {
        guard !finished else { return }
        finished = true
        assembly.releaseAll()
        queuedOutput?.release()
        queuedOutput = nil
        keepAlive?.cancel()
        keepAlive = nil
        expiry?.cancel()
        expiry = nil
        _ = core.ended()
        for id in hubIDs.values { hub.unlisten(id) }
        hubIDs = [:]
        hub.detach(owner: owner)
        server.realtimeClosed(self)
        if wrote {
            endConnection(identity)
        } else {
            runtime.closeSession(identity.connection)
        }
    }

    /// Records the end of this node's own connection: `connectionEnded` in the connection's own
    /// session, which is ordered, so the end applies after every write the connection sent
    /// (as Firebase runs onDisconnect writes after the connection's last write). The session
    /// closes once it applied. If it never commits, the node lets the connection's lease holder
    /// go (`LeaseHolder.release`: every connection closes, and the leader's expiry fires the
    /// queue).
    private func endConnection(_ connection: SessionIdentity) {
        let server = self.server
        let holder = self.holder
        let runtime = self.runtime
        let own = identity.connection
        Self.proposeEnd(runtime: runtime, loop: hub.loop, logger: server.logger, ns: namespace, connection: connection, session: own) { applied in
            runtime.closeSession(own)
            if !applied { server.releaseLease(holder, reason: "the end of a realtime connection did not commit after \(Self.maxEndAttempts) tries") }
        }
    }

    static let maxEndAttempts = 8

    /// Proposes `connectionEnded` for `connection` in `session`, retried with a growing back-off
    /// (0.25 s doubling to 10 s) up to `maxEndAttempts` times while `wanted()`; `done` says
    /// whether it applied. Static: a retry never needs the handler. The one retry mechanism for
    /// a connection's own end and for the end of a client's previous connection (`ls`).
    private static func proposeEnd(
        runtime: NodeRuntime, loop: any EventLoop, logger: Logger, ns: String, connection: SessionIdentity, session: UInt64?, attempt: Int = 0,
        wanted: @escaping @Sendable () -> Bool = { true }, done: @escaping @Sendable (Bool) -> Void
    ) {
        let command = Command.connectionEnded(connection: connection.connection, secret: connection.secret)
        runtime.write(namespace: ns, command: command, session: session, on: loop) { result in
            guard case .failure(let e) = result else { return done(true) }
            guard attempt + 1 < maxEndAttempts, wanted() else {
                logger.error("could not record the end of a realtime connection", metadata: ["connection": "\(connection)", "error": "\(e)"])
                return done(false)
            }
            let delay = TimeAmount.milliseconds(Int64(min(10_000, 250 << min(attempt, 6))))
            loop.scheduleTask(in: delay) {
                proposeEnd(
                    runtime: runtime, loop: loop, logger: logger, ns: ns, connection: connection, session: session, attempt: attempt + 1,
                    wanted: wanted, done: done)
            }
        }
    }

    /// The node drains (`banyan drain`): tells the client to reconnect to `host` (the
    /// protocol's reset, `r`: after the hello the SDKs close and reconnect there) and closes.
    /// Reading stops first and the reset waits until every request read is answered (at most
    /// `resetWaitLimit`): the SDKs send unanswered writes again on their new connection, so a
    /// write still in flight here would otherwise apply twice (a transaction counted twice).
    /// The connection then ends as any other does (its onDisconnect writes fire).
    func reset(to host: String) {
        guard !closing, !finished, resetTarget == nil, let context else { return }
        resetTarget = host
        context.channel.setOption(ChannelOptions.autoRead, value: false).whenComplete { _ in }
        if core.unansweredCount == 0 { return finishReset() }
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: Self.resetWaitLimit) { bound.value.finishReset() }
    }

    /// How long a reset waits for the connection's requests to be answered.
    static let resetWaitLimit = TimeAmount.seconds(10)

    private func finishReset() {
        guard let host = resetTarget, !closing, !finished else { return }
        send(ServerMessage.reset(host: host))
        flush()
        close(code: .goingAway, reason: "this node is draining; reconnect to \(host)")
    }

    /// Closes the connection from the server's side with a close frame.
    func close(code: WebSocketErrorCode, reason: String) {
        guard !closing, let context else { return }
        closing = true
        var buffer = context.channel.allocator.buffer(capacity: 2 + 123)
        buffer.write(webSocketErrorCode: code)
        buffer.writeBytes(Array(reason.utf8.prefix(120)))
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(ServerFrames.encode(opcode: 0x8, buffer, allocator: channel.allocator))).whenComplete { _ in
            channel.close(promise: nil)
        }
        // A client that reads nothing never lets the close frame out: close anyway.
        context.eventLoop.scheduleTask(in: .seconds(5)) { channel.close(promise: nil) }
    }

    // MARK: - The core's actions

    private func perform(_ outputs: [SessionCore.Output]) {
        defer { if resetTarget != nil, core.unansweredCount == 0 { finishReset() } }
        for output in outputs {
            switch output {
            case .send(let bytes): send(bytes)
            case let .listen(id, spec): startListen(id, spec)
            case .unlisten(let id):
                startedListens[id] = nil
                if let hubID = hubIDs.removeValue(forKey: id) { hub.unlisten(hubID) }
            case let .get(request, path, query): get(request, path, query)
            case let .write(request, write, client): self.write(request, write, client)
            case let .authenticate(request, credential, _): authenticate(request, credential)
            case .unauthenticate:
                signIn(.client(.signedOut), until: nil)
                rejudgeListens()
            case .stats: break
            case .pauseReading:
                context?.channel.setOption(ChannelOptions.autoRead, value: false).whenComplete { _ in }
            case .resumeReading:
                guard resetTarget == nil else { break }  // draining: nothing more is read
                context?.channel.setOption(ChannelOptions.autoRead, value: true).whenComplete { _ in }
                context?.read()
            case .close(let reason):
                server.logger.notice("closed a realtime connection", metadata: ["session": "\(identity)", "reason": "\(reason)"])
                close(code: .policyViolation, reason: reason)
            case .ping:
                guard !closing, let context else { continue }
                context.write(wrapOutboundOut(ServerFrames.encode(opcode: 0x9, ByteBuffer(), allocator: context.channel.allocator)), promise: nil)
                dirty = true
            }
        }
        flush()
    }

    /// One message, in as many frames as the SDKs expect (`FrameSplitter`).
    private func send(_ message: [UInt8]) {
        guard !closing else { return }
        write(frames(message))
    }

    /// A message's frames in the connection's encoding (compressed when negotiated).
    private func frames(_ message: [UInt8]) -> [ByteBuffer] {
        guard let context else { return [] }
        return ServerFrames.text(message, encoding: encoding, codec: hub.deflate, allocator: context.channel.allocator)
    }

    /// Frames already encoded (shared by every connection a push goes to). A client that does not
    /// read what it is sent (more than the connection's write buffer queued) is cut off rather
    /// than buffered without bound.
    private func write(_ frames: [ByteBuffer]) {
        guard !closing, let context, let channel else { return }
        if !channel.isWritable {
            server.logger.notice("closed a realtime connection that does not read its messages", metadata: ["session": "\(identity)"])
            closing = true
            context.close(promise: nil)
            return
        }
        for frame in frames { context.write(wrapOutboundOut(frame), promise: nil) }
        dirty = true
    }

    private func flush() {
        guard dirty, let context else { return }
        dirty = false
        context.flush()
        // Bytes the client has not taken count toward the node's budget for queued output: a
        // connection that holds some when it is spent is cut off (it cannot be paused without
        // losing events), so consumers that keep up never pay for those that do not.
        if queuedOutput?.mustWait() == true, !closing {
            server.outputCutOff("a realtime connection that does not read its messages", session: identity.description)
            closing = true
            context.close(promise: nil)
        }
    }

    func push(_ frames: [ByteBuffer]) { write(frames) }

    func flushPushes() { flush() }


    /// Whether a listen's first update is what the client already holds: `hash` (the listen's
    /// `h`, the Firebase hash of the client's cached data for the view, `""` for none) equals the
    /// hash of the data it would be sent. `""` is the hash of no data, so an empty location
    /// matches a client without a cache (as Firebase's server answers it).
    static func clientHolds(_ first: ListenEvent, hash: String) -> Bool {
        guard case .put(_, let tree) = first.update else { return false }
        if hash.isEmpty { return tree.isEmpty }
        // A Firebase hash is 28 characters of base64 (SHA-1): anything else cannot match, and
        // costs no hashing.
        guard hash.utf8.count == 28, !tree.isEmpty else { return false }
        return tree.hashString == hash
    }

    private func startListen(_ id: SessionCore.ListenID, _ spec: ListenSpec) {
        var params: QueryParams?
        if let query = spec.query {
            do {
                params = try QueryParams(wire: query)
            } catch {
                return perform(core.listenFailed(id, status: "failure", reason: error.description))
            }
        }
        let hubID = hub.newListenID()
        hubIDs[id] = hubID
        let tag = spec.tag.flatMap { UInt64(exactly: $0) }
        let listen = Listen(id: hubID, owner: owner, namespace: namespace, path: spec.path, params: params, tag: tag)
        hub.listen(listen) { [weak self] result in
            guard let self, !self.finished, self.hubIDs[id] == hubID else { return }
            switch result {
            case .success(let first):
                // Judged before anything of it is sent, on the tree the listen starts from.
                if self.readDenied(at: spec.path, params, tree: self.hub.tree(self.namespace) ?? .empty) {
                    self.hubIDs[id] = nil
                    self.hub.unlisten(hubID)
                    return self.perform(self.core.listenFailed(id, status: "permission_denied", reason: "Permission denied"))
                }
                if let hash = spec.hash, Self.clientHolds(first, hash: hash) {
                    // The client's cached data for this view is what it would be sent (its hash,
                    // `h`, says so): only the ok goes, and the client completes the view from
                    // its cache (docs/realtime.md, "Listen hashes").
                    self.server.listenDataWasSkipped()
                } else {
                    self.write(self.frames(RealtimeHub.render(first)))
                }
                self.startedListens[id] = (spec.path, params)
                self.perform(self.core.listenStarted(id, warnings: self.indexWarnings(spec.path, params)))
            case .failure(let e):
                self.hubIDs[id] = nil
                let status: String
                switch e {
                case .unavailable: status = "unavailable"
                case .refused: status = "failure"
                }
                self.perform(self.core.listenFailed(id, status: status, reason: e.description))
            }
        }
    }

    private func get(_ request: Int64, _ path: Path, _ query: JSONValue?) {
        var wanted: QueryParams?
        if let query, case .object(let members) = query, !members.isEmpty {
            do {
                wanted = try QueryParams(wire: query)
            } catch {
                return perform(core.answer(request: request, status: "failure", data: JSONValue.string(error.description).bytes))
            }
        }
        let params = wanted
        runtime.read(namespace: namespace, stale: false, on: hub.loop) { [weak self] result in
            guard let self, !self.finished else { return }
            switch result {
            case .success(let tree):
                if self.readDenied(at: path, params, tree: tree) {
                    return self.perform(self.core.answer(request: request, status: "permission_denied", data: JSONValue.string("Permission denied").bytes))
                }
                var value = tree.child(at: path)
                if let params { value = params.evaluate(value) }
                self.perform(self.core.answer(request: request, status: "ok", data: JSONWriter.bytes(value, format: .export)))
            case .failure(let e):
                self.perform(self.core.answer(request: request, status: "unavailable", data: JSONValue.string(e.description).bytes))
            }
        }
    }

    /// Records the end of the client's previous connection (`ls`) in this connection's own
    /// session, retried like any end while this connection lasts; this connection's writes are
    /// released when it applies or when the tries run out. The end of another node's connection
    /// is that node's and its lease's to settle if it never commits here.
    private func endPrevious(_ old: SessionIdentity) {
        Self.proposeEnd(
            runtime: runtime, loop: hub.loop, logger: server.logger, ns: namespace, connection: old, session: identity.connection,
            wanted: { [weak self] in self.map { !$0.finished } ?? false }
        ) { [weak self] _ in
            guard let self, !self.finished else { return }
            self.holdingWrites = false
            let held = self.heldWrites
            self.heldWrites = []
            for (request, write, client) in held { self.write(request, write, client) }
            self.flush()
        }
    }

    private func write(_ request: Int64, _ write: SessionCore.Write, _ number: ClientWriteNumber?) {
        if holdingWrites {
            heldWrites.append((request, write, number))
            return
        }
        if Access.writeRefused(client, hasRules: rules != nil, allowUnauthenticated: server.config.development.allowUnauthenticated) {
            return perform(core.answer(request: request, status: "permission_denied", data: JSONValue.string("Permission denied").bytes))
        }
        let command: Command
        switch SessionWrites.command(for: write, secret: identity.secret, holder: holder, maxUpdatePaths: server.config.http.maxUpdateKeys) {
        case .success(let c): command = c
        case .failure(let refusal):
            return perform(core.answer(request: request, status: refusal.status, data: JSONValue.string(refusal.message).bytes))
        }
        wrote = true
        // A write the SDK numbered, on a connection that named its client (`bc`): applied at most
        // once whatever connection carries it (docs/realtime.md, "Client writes").
        let key = upgrade.clientID.flatMap { id in number.map { ClientWriteKey(client: id, number: $0.number, acknowledgedBelow: $0.acknowledgedBelow) } }
        runtime.write(
            namespace: namespace, command: command, session: identity.connection, auth: client.commandAuth, clientWrite: key, on: hub.loop
        ) { [weak self] result in
            guard let self, !self.finished else { return }
            switch result {
            case .success(let applied):
                let (status, data) = SessionWrites.answer(applied.outcome)
                self.perform(self.core.answer(request: request, status: status, data: data.bytes))
                if case .refused(let reason) = applied.outcome {
                    // The connection was ended in the log (`ls` from a reconnect through another
                    // node, or its lease expired): its onDisconnect writes ran, so it must not
                    // be served any more. The client reconnects.
                    self.server.logger.notice("closing a realtime connection the log has ended", metadata: ["session": "\(self.identity)", "reason": "\(reason)"])
                    self.close(code: .policyViolation, reason: "this connection was ended")
                }
            case .failure(let e):
                // Not `ok`: a timed-out write may still apply (the client's listens then show it).
                self.perform(self.core.answer(request: request, status: "unavailable", data: JSONValue.string(e.description).bytes))
            }
        }
    }

    /// `auth` / `gauth` (docs/security.md): the emulator's `owner`, an unsigned emulator token
    /// (while unauthenticated access is allowed) or a verified token signs the connection in
    /// (`ok` with `{"auth", "expires"}`); anything else is refused (`invalid_token`, or
    /// `expired_token`, with the reason) and leaves it signed out. An administrator's `authvar`
    /// names the client its requests are judged as (`noauth`: signed out), as on REST.
    /// Listens are judged again under the new identity.
    private func authenticate(_ request: Int64, _ credential: Credential) {
        switch server.credentials.session(credential.token, now: NodeRuntime.wallClock()) {
        case .signedIn(var identity, let answer, let validUntil):
            if case .administrator = identity {
                if credential.noAuth {
                    identity = .administrator(override: .signedOut)
                } else if let variable = credential.authVariable {
                    // As on REST: anything but an object is refused, never ignored (ignoring it
                    // would leave an administrator that meant to be judged unjudged).
                    guard case .object = variable else {
                        signIn(.client(.signedOut), until: nil)
                        perform(core.answer(request: request, status: "invalid_token", data: JSONValue.string("authvar must be a JSON object").bytes))
                        return rejudgeListens()
                    }
                    identity = .administrator(override: .user(json: Array(variable.jsonString.utf8)))
                }
            }
            signIn(identity, until: validUntil)
            perform(core.answer(request: request, status: "ok", data: answer.bytes))
        case .refused(let status, let reason):
            signIn(.client(.signedOut), until: nil)
            perform(core.answer(request: request, status: status, data: JSONValue.string(reason).bytes))
        }
        rejudgeListens()
    }

    /// Makes `identity` the connection's, until `validUntil` (milliseconds since the epoch) if
    /// given.
    private func signIn(_ identity: ClientIdentity, until validUntil: Int64?) {
        expiry?.cancel()
        expiry = nil
        client = identity
        if let validUntil { scheduleExpiry(at: validUntil) }
    }

    /// Schedules the check of `validUntil`; a far expiry is checked again at least hourly, so
    /// the wait never overflows and follows the wall clock.
    private func scheduleExpiry(at validUntil: Int64) {
        guard let context else { return }
        let delay = max(0, min(validUntil - NodeRuntime.wallClock(), 3_600_000))
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        expiry = context.eventLoop.scheduleTask(in: .milliseconds(delay)) { bound.value.expiryDue(validUntil) }
    }

    /// The token's time ran out: the `ac` push (`expired_token`; the SDKs fetch a fresh token
    /// and authenticate again), then the connection is signed out and its listens judged again.
    private func expiryDue(_ validUntil: Int64) {
        guard !finished else { return }
        if NodeRuntime.wallClock() < validUntil { return scheduleExpiry(at: validUntil) }
        expiry = nil
        client = .client(.signedOut)
        send(ServerMessage.authRevoked(status: "expired_token", reason: TokenError.expired.reason))
        rejudgeListens()
        flush()
    }

}

/// Server frames, encoded once (RFC 6455 §5.2: FIN set, no mask, the length in 7, 16 or 64 bits;
/// RSV1 on a message compressed with permessage-deflate).
enum ServerFrames {
    static func encode(opcode: UInt8, _ payload: ByteBuffer, allocator: ByteBufferAllocator, compressed: Bool = false) -> ByteBuffer {
        let n = payload.readableBytes
        var out = allocator.buffer(capacity: n + 10)
        out.writeInteger((compressed ? 0xC0 : 0x80) | opcode)
        if n < 126 {
            out.writeInteger(UInt8(n))
        } else if n <= 0xFFFF {
            out.writeInteger(UInt8(126))
            out.writeInteger(UInt16(n))
        } else {
            out.writeInteger(UInt8(127))
            out.writeInteger(UInt64(n))
        }
        var body = payload
        out.writeBuffer(&body)
        return out
    }

    /// One protocol message as text frames (`FrameSplitter`: a count frame and chunks when long).
    static func text(_ message: [UInt8], allocator: ByteBufferAllocator) -> [ByteBuffer] {
        FrameSplitter.frames(message).map { chunk in
            var payload = allocator.buffer(capacity: chunk.count)
            payload.writeBytes(chunk)
            return encode(opcode: 0x1, payload, allocator: allocator)
        }
    }
}
