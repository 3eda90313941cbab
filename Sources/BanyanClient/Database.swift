import BanyanBasics
import BanyanClientCore
import BanyanQuery
import BanyanTree
public import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOWebSocket

/// A database: one realtime connection to a node of the cluster (failing over across `nodes`),
/// the client core's state, and the queue callbacks run on (docs/swift-sdk.md).
///
/// Threads: the core and the connection live on one event loop of the database's own; calls
/// from any thread hop onto it, and every callback (observers, completions, transactions'
/// completions) runs on `callbackQueue`, in order. Transaction blocks run on the database's
/// loop.
public final class Database: @unchecked Sendable {
    public let namespace: String
    /// Nodes as host and port, in the order failover tries them.
    public let nodes: [(host: String, port: Int)]
    /// `http` or `https` (then the connection is `wss`).
    public let scheme: String
    /// Where completion and observer blocks run (set it before the first call; a change applies
    /// to the callbacks scheduled after it). The main queue by default on Apple platforms, a
    /// serial queue of the database's own elsewhere. Read by the database's loop, set by the
    /// app: kept under a lock.
    public var callbackQueue: DispatchQueue {
        get { callbackQueueStore.withLock { $0 } }
        set { callbackQueueStore.withLock { $0 = newValue } }
    }
    private let callbackQueueStore: Locked<DispatchQueue>

    /// Persistence on disk (set before the first use of the database, as in Firebase): the
    /// unanswered writes and the synced data survive a restart of the app; observers get cached
    /// data at once, offline too (docs/swift-sdk.md, "Offline and persistence").
    public var isPersistenceEnabled: Bool {
        get { settings.withLock { $0.persistence } }
        set { settings.withLock { if !$0.activated { $0.persistence = newValue } } }
    }
    /// The disk cache's size (bytes, 1 MiB to 100 MiB; 10 MiB by default) beyond which synced
    /// data that is neither observed nor kept synced is dropped. Unanswered writes always stay.
    public var persistenceCacheSizeBytes: UInt {
        get { settings.withLock { $0.cacheSize } }
        set { settings.withLock { if !$0.activated { $0.cacheSize = min(max(newValue, 1 << 20), 100 << 20) } } }
    }
    /// Where the cache file goes (default: the user's application support directory, in
    /// `banyan-client`).
    public var persistenceDirectory: URL? {
        get { settings.withLock { $0.directory } }
        set { settings.withLock { if !$0.activated { $0.directory = newValue } } }
    }
    /// Why persistence could not be used (the database then runs without it), if it could not.
    /// Once the database is in use, read after its start on the database's thread (where the
    /// file is opened), so a first use followed by this read sees the outcome.
    public var persistenceError: String? {
        if settings.withLock({ $0.activated }), !loop.inEventLoop { _ = onLoopSync { () } }
        return settings.withLock { $0.error }
    }

    /// Failover (docs/swift-sdk.md, "Failover"; set before the first use of the database): the
    /// seconds a connection attempt may take from opening the socket to the server's hello
    /// (10 by default) before the client gives the node up and tries the next.
    public var connectionTimeout: TimeInterval {
        get { settings.withLock { Double($0.timeouts.connectMillis) / 1000 } }
        set { settings.withLock { if !$0.activated, let ms = Self.millis(newValue) { $0.timeouts.connectMillis = ms } } }
    }
    /// The seconds the connection may go without hearing from the node (30 by default) before
    /// the client pings it.
    public var idleTimeout: TimeInterval {
        get { settings.withLock { Double($0.timeouts.idleMillis) / 1000 } }
        set { settings.withLock { if !$0.activated, let ms = Self.millis(newValue) { $0.timeouts.idleMillis = ms } } }
    }
    /// The seconds the node then has to send anything (15 by default) before the client closes
    /// the connection and fails over to the next node.
    public var pingTimeout: TimeInterval {
        get { settings.withLock { Double($0.timeouts.pingAnswerMillis) / 1000 } }
        set { settings.withLock { if !$0.activated, let ms = Self.millis(newValue) { $0.timeouts.pingAnswerMillis = ms } } }
    }

    /// Seconds as ms (at least 1 ms, at most a day); nil for a value that is not a duration.
    static func millis(_ seconds: TimeInterval) -> Int64? {
        guard seconds.isFinite, seconds > 0 else { return nil }
        return Int64((min(seconds, 86_400) * 1000).rounded(.up))
    }

    struct Settings {
        var activated = false
        var persistence = false
        var cacheSize: UInt = 10 << 20
        var directory: URL?
        var error: String?
        var timeouts = ClientCore.Timeouts()
        /// Testing only (`_skewClock`): this client's clock reads this far from the wall clock.
        var clockSkew: Int64 = 0
    }
    private let settings = Locked(Settings())
    private var cacheFile: CacheFile?

    private let group: MultiThreadedEventLoopGroup
    private let loop: any EventLoop
    private let tls: ClientTLS?
    // Confined to `loop`:
    private var core: ClientCore
    private var channel: (any Channel)?
    /// The current attempt's socket while its upgrade is under way (closed if it is abandoned).
    private var opening: (any Channel)?
    private var connectionNumber = 0
    private var joiner = ClientFrameJoiner()
    private var observers: [UInt64: Observer] = [:]
    private var writeBlocks: [UInt64: @Sendable (DatabaseError?) -> Void] = [:]
    private var transactionBlocks: [UInt64: @Sendable (ClientCore.TransactionOutcome) -> Void] = [:]
    private var getBlocks: [UInt64: @Sendable (Result<Tree, DatabaseError>) -> Void] = [:]
    private var pushIDs: PushIDGenerator
    /// The core's `serverTimeOffset` as the push-id generator reads it (under `ids`' lock: ids
    /// are taken on the caller's thread). Copied after each turn of the loop that changed it.
    private var pushClockOffset: Int64 = 0
    private var copiedOffset: Int64 = 0
    /// `Settings.clockSkew`, for the loop (`clockSkew`) and for push ids (`pushClockSkew`,
    /// under `ids`' lock).
    private var clockSkew: Int64 = 0
    private var pushClockSkew: Int64 = 0
    private let ids = IDSource()
    private var ticker: RepeatedTask?
    private var lastKeepAlive: Int64 = 0
    private var authRevokedBlock: (@Sendable (DatabaseError) -> Void)?
    /// Test hooks (`_dropNextAnswerAndDisconnect`, `_setWriteNumbers`).
    private var dropNextAnswer = false

    struct Observer {
        var query: DatabaseQuery
        var type: DataEventType
        var block: @Sendable (DataSnapshot, String?) -> Void
        var cancel: (@Sendable (any Error) -> Void)?
        var once: Bool
    }

    /// `url`: a node's address as the Firebase emulator is given, `http://host:port?ns=name`
    /// (`https://` for a node that serves TLS to clients; the namespace defaults to `default`);
    /// `nodes`: the other nodes (`host:port`) to fail over to. `authToken`: a credential for the
    /// connection (the emulator's `owner`, or a token). `trustedCAFile`: PEM certificates to
    /// trust for `https` (the cluster's CA, `banyan-data/certs/ca.pem` for development
    /// certificates); the system's roots when nil.
    public init(
        url: String, nodes more: [String] = [], authToken: String? = nil, callbackQueue: DispatchQueue? = nil, trustedCAFile: String? = nil
    ) throws {
        guard let components = URLComponents(string: url), let host = components.host, let scheme = components.scheme?.lowercased(),
            scheme == "http" || scheme == "https"
        else {
            throw DatabaseError(code: "invalid_url", message: "expected http(s)://host:port?ns=name, got \(url)")
        }
        let port = components.port ?? (scheme == "https" ? 443 : 80)
        namespace = components.queryItems?.first(where: { $0.name == "ns" })?.value ?? host.split(separator: ".").first.map(String.init) ?? "default"
        self.scheme = scheme
        var list = [(host, port)]
        for n in more {
            guard let colon = n.lastIndex(of: ":"), let p = Int(n[n.index(after: colon)...]), p > 0, p < 65536 else {
                throw DatabaseError(code: "invalid_url", message: "a node is host:port, got \(n)")
            }
            let h = String(n[..<colon])
            if !list.contains(where: { $0.0 == h && $0.1 == p }) { list.append((h, p)) }
        }
        nodes = list
        tls = scheme == "https" ? try ClientTLS(trustedCAFile: trustedCAFile) : nil
        #if canImport(Darwin)
        callbackQueueStore = Locked(callbackQueue ?? DispatchQueue.main)
        #else
        callbackQueueStore = Locked(callbackQueue ?? DispatchQueue(label: "banyan.database.callbacks"))
        #endif
        group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        loop = group.next()
        seed = UInt64.random(in: 1...UInt64.max)
        self.authToken = authToken
        core = ClientCore(nodeCount: list.count, seed: seed, authToken: authToken)
        pushIDs = PushIDGenerator(random: SeededRandom(seed: seed ^ 0x5DEE_CE66))
    }

    private let seed: UInt64
    private let authToken: String?

    /// The first use: the settings are fixed, the cache is read, and the connection starts.
    func activate() {
        let start = settings.withLock { s -> Settings? in
            guard !s.activated else { return nil }
            s.activated = true
            return s
        }
        guard let start else { return }
        loop.execute { self.start(start) }
    }

    private func start(_ s: Settings) {
        core.timeouts = s.timeouts
        clockSkew = s.clockSkew
        ids.withLock { pushClockSkew = s.clockSkew }
        if s.persistence {
            do {
                let directory = s.directory ?? Self.defaultCacheDirectory()
                let name = "\(nodes[0].host)_\(nodes[0].port)_\(namespace).bnycache".map { $0.isLetter || $0.isNumber || $0 == "." || $0 == "_" || $0 == "-" ? $0 : "_" }
                let file = try CacheFile(path: directory.appendingPathComponent(String(name)).path, budget: Int(s.cacheSize))
                core = ClientCore(nodeCount: nodes.count, seed: seed, authToken: authToken, persistence: true, restored: file.restored)
                cacheFile = file
            } catch {
                settings.withLock { $0.error = "\(error)" }
            }
        }
        startTicking()
        process()
    }

    static func defaultCacheDirectory() -> URL {
        let base = FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first ?? URL(fileURLWithPath: NSTemporaryDirectory())
        return base.appendingPathComponent("banyan-client")
    }

    deinit {
        ticker?.cancel()
        channel?.close(promise: nil)
        cacheFile?.close()
        // The last reference may go on the database's own thread: never wait for it here.
        group.shutdownGracefully(queue: .global()) { _ in }
    }

    private static let shared = SharedDatabases()

    /// `Database.database(url:)`: the database for this URL (one instance per URL, as Firebase
    /// keeps one).
    public static func database(url: String) throws -> Database { try shared.database(url: url, nodes: []) }

    /// `Database.database(url:)` with the cluster's other nodes (`host:port`, in the order failover
    /// tries them after the URL's node): one instance per URL and node list.
    public static func database(url: String, nodes: [String]) throws -> Database { try shared.database(url: url, nodes: nodes) }

    public func reference() -> DatabaseReference {
        activate()
        return DatabaseReference(database: self, path: .root)
    }

    public func reference(withPath path: String) -> DatabaseReference { reference().child(path) }

    /// The reference for a full URL of this database (`http://host:port/a/b?ns=name`).
    public func reference(fromURL url: String) -> DatabaseReference {
        guard let components = URLComponents(string: url), let host = components.host,
            nodes.contains(where: { $0.host == host && $0.port == (components.port ?? (scheme == "https" ? 443 : 80)) })
        else {
            return DatabaseReference(database: self, path: .root, error: DatabaseError(code: "invalid_url", message: "\(url) is not a location of this database"))
        }
        let ns = components.queryItems?.first(where: { $0.name == "ns" })?.value ?? namespace
        guard ns == namespace else {
            return DatabaseReference(database: self, path: .root, error: DatabaseError(code: "invalid_url", message: "\(url) names namespace \(ns), not \(namespace)"))
        }
        return reference(withPath: components.percentEncodedPath.removingPercentEncoding ?? components.path)
    }

    /// Closes the connection and stays offline (writes queue locally) until `goOnline`.
    public func goOffline() {
        activate()
        loop.execute { self.core.goOffline(); self.process() }
    }
    public func goOnline() {
        activate()
        loop.execute { self.core.goOnline(); self.process() }
    }

    /// Abandons every write not yet answered, as Firebase's `purgeOutstandingWrites()`: sets,
    /// updates, priorities and transactions are rolled back locally (observers see the data
    /// without them), removed from the disk cache and never sent again; their completion blocks
    /// get `write_canceled`, and so do onDisconnect calls queued while offline (one already
    /// sent waits for its answer). A write already sent may still have applied on the server.
    public func purgeOutstandingWrites() {
        activate()
        loop.execute { self.core.purgeOutstandingWrites(); self.process() }
    }

    /// The SDK's version (Firebase's `Database.sdkVersion()`).
    public static func sdkVersion() -> String { ClientCore.sdkVersion }

    /// Logs the connection's life (attempts, connections, redirects, closes) and each message
    /// sent, at `debug`, through swift-log (label `banyan.client`; the app's `LoggingSystem`
    /// decides where it goes), as Firebase's `setLoggingEnabled(_:)` does for its console.
    /// Off by default. Failed writes, cancelled listens and refused credentials are logged at
    /// `warning` either way, as Firebase warns. An auth message is logged without its token.
    public static func setLoggingEnabled(_ enabled: Bool) { DatabaseLog.enabled.withLock { $0 = enabled } }

    /// Sets (or drops, with nil) the credential the connection uses; sent at once when online.
    public func setAuthToken(_ token: String?) {
        activate()
        loop.execute { self.core.setAuthToken(token); self.process() }
    }

    /// Called (on the callback queue) when the server refuses or revokes the credential: the
    /// connection goes on unauthenticated until `setAuthToken` gives a fresh one.
    public func onAuthRevoked(_ block: @escaping @Sendable (DatabaseError) -> Void) { loop.execute { self.authRevokedBlock = block } }

    /// Stops the connection and the database's thread (the instance cannot be used after).
    public func shutdown() {
        let done = loop.submit {
            self.ticker?.cancel()
            self.core.goOffline()
            self.process()
            self.channel?.close(promise: nil)
            self.cacheFile?.close()
            self.cacheFile = nil
        }
        _ = try? done.wait()
    }

    /// Runs `body` on the database's loop and waits for it (tests and benchmarks read state).
    func onLoopSync<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T? { try? loop.submit(body).wait() }

    /// Writes not yet answered by the server.
    public var pendingWriteCount: Int { onLoopSync { self.core.pendingWriteCount } ?? 0 }

    /// The node the connection is online with, as `host:port` (nil while offline or
    /// connecting): where the first connection went, and where a failover took the client. Not
    /// for use inside a transaction block (they run on the database's own thread).
    public var connectedNode: String? {
        onLoopSync { self.core.onlineNode == nil ? nil : self.attemptAddress } ?? nil
    }

    // MARK: - The loop

    /// The wall clock when the database was made, and the monotonic clock then.
    private let clockBase = (wall: Int64((Date().timeIntervalSince1970 * 1000).rounded()), monotonic: DispatchTime.now().uptimeNanoseconds)

    /// The core's clock: the wall-clock time at start plus the monotonic time since, so a step
    /// of the system clock (NTP, a user) neither fires nor stalls the back-off, the connection
    /// and ping timers, or the keep-alive. Server values still read as wall time (corrected by
    /// `.info/serverTimeOffset` at each hello).
    private func nowMillis() -> Int64 { unskewedMillis() + clockSkew }

    /// The same clock without the testing skew; any thread.
    private func unskewedMillis() -> Int64 {
        clockBase.wall + Int64((DispatchTime.now().uptimeNanoseconds &- clockBase.monotonic) / 1_000_000)
    }

    private func startTicking() {
        // The clock before any call runs: a server value written first thing (before the first
        // tick) shows locally as the time now, not as 1970.
        core.tick(now: nowMillis())
        ticker = loop.scheduleRepeatedTask(initialDelay: .zero, delay: .milliseconds(50)) { [weak self] _ in
            guard let self else { return }
            let now = self.nowMillis()
            self.core.tick(now: now)
            // The protocol's keep-alive: "0" every 45 s while connected.
            if let channel = self.channel, self.core.isOnline, now - self.lastKeepAlive > 45_000 {
                self.lastKeepAlive = now
                self.write(Array("0".utf8), on: channel)
            }
            self.process()
        }
    }

    func onLoop(_ work: @escaping @Sendable () -> Void) { loop.execute(work) }

    private func process() {
        var durable = false
        defer {
            if core.serverTimeOffset != copiedOffset {
                copiedOffset = core.serverTimeOffset
                let offset = copiedOffset
                ids.withLock { pushClockOffset = offset }
            }
            if let file = cacheFile {
                if durable { file.sync() }
                if file.needsCompaction { file.compact(core.compactedRecords(budget: file.budget / 2)) }
            }
        }
        for action in core.takeActions() {
            switch action {
            case let .persist(records, d):
                guard let file = cacheFile else { continue }
                file.append(records)
                durable = durable || d
            case .redirect(let host):
                DatabaseLog.debug("the server sent this client to \(host)")
                redirect = Self.hostAndPort(host, defaultPort: nodes[0].port)
            case .connect(let node):
                connect(node)
                DatabaseLog.debug("connecting to \(attemptAddress ?? "a node")")
            case .send(let message):
                DatabaseLog.sent(message)
                if let channel { write(message, on: channel) }
            case .disconnect:
                DatabaseLog.debug("closing the connection to \(attemptAddress ?? "a node")")
                if core.holdsConnection, let open = channel ?? opening {
                    // The core waits for the end: `closed()` comes from `linkEnded` or
                    // `linkOpened`.
                    open.close(promise: nil)
                } else {
                    // The core has let go of the connection (`goOffline` during an attempt, a
                    // node that answered nothing in time): it is dropped now, its socket closed
                    // even mid-upgrade; an attempt not yet connected is closed when it opens
                    // (its number is no longer the current one).
                    connectionNumber += 1
                    channel?.close(promise: nil)
                    opening?.close(promise: nil)
                    channel = nil
                    opening = nil
                }
            case let .event(id, event):
                deliver(id, event)
            case let .cancelled(id, reason):
                guard let observer = observers.removeValue(forKey: id) else { continue }
                let error = DatabaseError(code: reason.code, message: reason.message.isEmpty ? "the listen at \(observer.query.path) was cancelled" : reason.message)
                DatabaseLog.warning("listen at \(observer.query.path) failed: \(error.code)")
                if let cancel = observer.cancel { callbackQueue.async { cancel(error) } }
            case let .completed(id, error):
                // A cancel the app asked for (`purgeOutstandingWrites`) is no warning.
                if let error, error.code != "write_canceled" { DatabaseLog.warning("a write failed: \(error.code) (\(error.message))") }
                guard let block = writeBlocks.removeValue(forKey: id) else { continue }
                let e = error.map { DatabaseError(code: $0.code, message: $0.message) }
                callbackQueue.async { block(e) }
            case let .transactionCompleted(id, outcome):
                guard let block = transactionBlocks.removeValue(forKey: id) else { continue }
                callbackQueue.async { block(outcome) }
            case let .got(id, result):
                guard let block = getBlocks.removeValue(forKey: id) else { continue }
                let r = result.mapError { DatabaseError(code: $0.code, message: $0.message) }
                callbackQueue.async { block(r) }
            case .connected(let online):
                DatabaseLog.debug(online ? "connected to \(attemptAddress ?? "a node")" : "disconnected")
            case .authRevoked(let error):
                DatabaseLog.warning("the credential was refused or revoked: \(error.code)")
                if let block = authRevokedBlock {
                    let e = DatabaseError(code: error.code, message: error.message)
                    callbackQueue.async { block(e) }
                }
            }
        }
    }

    private func deliver(_ id: UInt64, _ event: ViewEvent) {
        guard let observer = observers[id] else { return }
        if observer.once {
            observers[id] = nil
            core.removeObserver(id)
        }
        let query = observer.query
        let snapshot: DataSnapshot
        if event.kind == .value {
            snapshot = DataSnapshot(reference: query.ref, tree: event.tree, index: query.params.index)
        } else {
            let key = event.key?.string ?? ""
            snapshot = DataSnapshot(reference: DatabaseReference(database: self, path: query.path.appending(ChildKey(unchecked: key))), tree: event.tree)
        }
        let previous = event.previousKey?.string
        let block = observer.block
        callbackQueue.async { block(snapshot, previous) }
    }

    private func write(_ message: [UInt8], on channel: any Channel) {
        for frame in ClientFrameJoiner.frames(message) {
            var buffer = channel.allocator.buffer(capacity: frame.count)
            buffer.writeBytes(frame)
            let mask = WebSocketMaskingKey.random()
            channel.write(WebSocketFrame(fin: true, opcode: .text, maskKey: mask, data: buffer), promise: nil)
        }
        channel.flush()
    }

    /// Where the next connection goes instead of the node list (a reset named it).
    private var redirect: (host: String, port: Int)?
    /// The address of the latest connection attempt (the connected node's once online).
    private var attemptAddress: String?

    /// `host:port`, `[v6]:port` or a bare host (then `defaultPort`); nil when it cannot be read.
    static func hostAndPort(_ text: String, defaultPort: Int) -> (host: String, port: Int)? {
        var rest = Substring(text)
        var host: Substring
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { return nil }
            host = rest[rest.index(after: rest.startIndex)..<close]
            rest = rest[rest.index(after: close)...]
        } else if let colon = rest.lastIndex(of: ":"), rest.firstIndex(of: ":") == colon {
            host = rest[..<colon]
            rest = rest[colon...]
        } else {
            host = rest
            rest = ""
        }
        guard !host.isEmpty else { return nil }
        if rest.isEmpty { return (String(host), defaultPort) }
        guard rest.hasPrefix(":"), let port = Int(rest.dropFirst()), (1...65_535).contains(port) else { return nil }
        return (String(host), port)
    }

    private func connect(_ node: Int) {
        connectionNumber += 1
        let number = connectionNumber
        joiner = ClientFrameJoiner()
        opening = nil
        // A reset's named host, once; else the node list.
        let (host, port) = redirect ?? nodes[node % nodes.count]
        redirect = nil
        attemptAddress = "\(host):\(port)"
        let opened = WebSocketLink.open(
            host: host, port: port, namespace: namespace, parameters: core.connectionParameters, tls: tls, group: loop,
            socketOpened: { [weak self] socket in
                guard let database = self else { return }
                database.onLoop { database.linkSocketOpened(socket, connection: number) }
            },
            received: { [weak self] message in
                guard let database = self else { return }
                database.onLoop { database.linkReceived(message, connection: number) }
            },
            heard: { [weak self] in
                guard let database = self else { return }
                database.onLoop { if database.connectionNumber == number { database.core.heard() } }
            },
            ended: { [weak self] in
                guard let database = self else { return }
                database.onLoop { database.linkEnded(connection: number) }
            })
        opened.whenComplete { [weak self] result in
            guard let database = self else { return }
            database.onLoop { database.linkOpened(result, connection: number) }
        }
    }

    private func linkSocketOpened(_ socket: any Channel, connection number: Int) {
        guard connectionNumber == number else {
            socket.close(promise: nil)
            return
        }
        opening = socket
    }

    private func linkReceived(_ message: [UInt8], connection number: Int) {
        guard connectionNumber == number else { return }
        do {
            if let whole = try joiner.add(message) {
                if dropNextAnswer, case .response? = try? ServerMessageReader.read(whole) {
                    // The test hook: this answer is lost with its connection.
                    dropNextAnswer = false
                    channel?.close(promise: nil)
                    return
                }
                core.received(whole)
            } else {
                // A frame of a message in parts (or its count): the node is alive.
                core.heard()
            }
        } catch {
            channel?.close(promise: nil)
        }
        process()
    }

    /// Testing only: the next answer from the server is lost and the connection closes, as when
    /// a connection dies after the server applied a write and before its answer arrived.
    @_spi(Testing) public func _dropNextAnswerAndDisconnect() { _ = onLoopSync { self.dropNextAnswer = true } }

    /// Testing only, before the first use: this client's clock reads `millis` away from the wall
    /// clock (a device whose clock is wrong).
    @_spi(Testing) public func _skewClock(byMillis millis: Int64) {
        let set = settings.withLock { s -> Bool in
            guard !s.activated else { return false }
            s.clockSkew = millis
            return true
        }
        if set { ids.withLock { pushClockSkew = millis } }
    }

    /// Testing only: how many observers are registered.
    @_spi(Testing) public var _observerCount: Int { onLoopSync { self.observers.count } ?? 0 }

    /// Testing only: the credential the connection uses now (what `Auth` last gave it).
    @_spi(Testing) public func _credentialInUse() -> String? { onLoopSync { self.core.authToken } ?? nil }

    /// Testing only: whether writes carry their numbers (exactly once) when the server takes them.
    @_spi(Testing) public func _setWriteNumbers(_ on: Bool) { _ = onLoopSync { self.core.useWriteNumbers = on } }

    private func linkEnded(connection number: Int) {
        guard connectionNumber == number else { return }
        channel = nil
        opening = nil
        core.closed()
        process()
    }

    private func linkOpened(_ result: Result<any Channel, any Error>, connection number: Int) {
        guard connectionNumber == number else {
            if case .success(let c) = result { c.close(promise: nil) }
            return
        }
        opening = nil
        switch result {
        case .success(let c):
            channel = c
            core.opened()
        case .failure:
            channel = nil
            core.closed()
        }
        process()
    }

    // MARK: - Calls from references and queries

    private func writing(_ completion: (@Sendable (DatabaseError?) -> Void)?, _ body: @escaping @Sendable (inout ClientCore, UInt64) throws -> Void) {
        let id = ids.next()
        onLoop {
            if let completion { self.writeBlocks[id] = completion }
            do {
                try body(&self.core, id)
            } catch {
                self.writeBlocks[id] = nil
                if let completion { self.callbackQueue.async { completion(DatabaseError(code: "invalid_data", message: "\(error)")) } }
            }
            self.process()
        }
    }

    func set(_ path: Path, json: [UInt8], completion: (@Sendable (DatabaseError?) -> Void)?) {
        writing(completion) { core, id in try core.set(id, path: path, json: json) }
    }

    func setPriority(_ path: Path, json: [UInt8], completion: (@Sendable (DatabaseError?) -> Void)?) {
        writing(completion) { core, id in try core.setPriority(id, path: path, json: json) }
    }

    func update(_ path: Path, children: [(Path, [UInt8])], completion: (@Sendable (DatabaseError?) -> Void)?) {
        writing(completion) { core, id in try core.update(id, path: path, children: children) }
    }

    func onDisconnectSet(_ path: Path, json: [UInt8], completion: (@Sendable (DatabaseError?) -> Void)?) {
        writing(completion) { core, id in try core.onDisconnectSet(id, path: path, json: json) }
    }

    func onDisconnectUpdate(_ path: Path, children: [(Path, [UInt8])], completion: (@Sendable (DatabaseError?) -> Void)?) {
        writing(completion) { core, id in try core.onDisconnectUpdate(id, path: path, children: children) }
    }

    func onDisconnectCancel(_ path: Path, completion: (@Sendable (DatabaseError?) -> Void)?) {
        writing(completion) { core, id in core.onDisconnectCancel(id, path: path) }
    }

    func transaction(
        _ path: Path, applyLocally: Bool, update: @escaping ClientCore.TransactionUpdate, completion: @escaping @Sendable (ClientCore.TransactionOutcome) -> Void
    ) {
        let id = ids.next()
        onLoop {
            self.transactionBlocks[id] = completion
            self.core.transaction(id, path: path, applyLocally: applyLocally, update: update)
            self.process()
        }
    }

    func observe(
        _ query: DatabaseQuery, type: DataEventType, once: Bool, block: @escaping @Sendable (DataSnapshot, String?) -> Void,
        cancel: (@Sendable (any Error) -> Void)?
    ) -> DatabaseHandle {
        let id = ids.next()
        let params = query.params
        let path = query.path
        onLoop {
            self.observers[id] = Observer(query: query, type: type, block: block, cancel: cancel, once: once)
            self.core.observe(id, path: path, params: params, type: Self.coreType(type))
            self.process()
        }
        return DatabaseHandle(id)
    }

    static func coreType(_ type: DataEventType) -> ClientCore.EventType {
        switch type {
        case .value: .value
        case .childAdded: .childAdded
        case .childChanged: .childChanged
        case .childRemoved: .childRemoved
        case .childMoved: .childMoved
        }
    }

    func removeObserver(_ handle: DatabaseHandle) {
        onLoop {
            self.observers[UInt64(handle)] = nil
            self.core.removeObserver(UInt64(handle))
            self.process()
        }
    }

    func removeAllObservers(path: Path, query: String) {
        onLoop {
            for (id, o) in self.observers where o.query.path == path && o.query.params.identifier == query {
                self.observers[id] = nil
                self.core.removeObserver(id)
            }
            self.process()
        }
    }

    func keepSynced(_ path: Path, _ on: Bool) {
        onLoop {
            self.core.keepSynced(path, on)
            self.process()
        }
    }

    func get(_ path: Path, params: QueryParams, completion: @escaping @Sendable (Result<Tree, DatabaseError>) -> Void) {
        let id = ids.next()
        onLoop {
            self.getBlocks[id] = completion
            self.core.get(id, path: path, params: params)
            self.process()
        }
    }

    /// A push id dated by the server's clock as this client estimates it (its own clock plus
    /// `.info/serverTimeOffset`, as Firebase's SDKs date them), so ids from clients whose clocks
    /// disagree, or from a device whose monotonic clock stood still while it slept (the offset is
    /// measured again at the next hello), still sort in the order they were made.
    func nextPushID() -> String {
        // Taken on the caller's thread: the generator is guarded by the id source's lock.
        ids.withLock { pushIDs.next(now: unskewedMillis() + pushClockSkew + pushClockOffset) }
    }
}

/// Ids for writes, observers and reads (any thread).
final class IDSource: @unchecked Sendable {
    private let lock = NSLock()
    private var value: UInt64 = 0
    func next() -> UInt64 { lock.withLock { value += 1; return value } }
    func withLock<T>(_ body: () -> T) -> T { lock.withLock(body) }
}

/// The instances `Database.database(url:)` hands out, one per URL.
final class SharedDatabases: @unchecked Sendable {
    private let lock = NSLock()
    private var instances: [[String]: Database] = [:]
    func database(url: String, nodes: [String]) throws -> Database {
        try lock.withLock {
            let key = [url] + nodes
            if let d = instances[key] { return d }
            let d = try Database(url: url, nodes: nodes)
            instances[key] = d
            return d
        }
    }
}

/// The SDK's log (`Database.setLoggingEnabled`): debug lines only while enabled, warnings always.
enum DatabaseLog {
    static let enabled = Locked(false)
    static let logger = Logger(label: "banyan.client")

    /// The logger for debug lines: its level lowered to `debug`, so they show under any
    /// handler (swift-log's default one starts at `info`).
    static var debugLogger: Logger {
        var logger = Logger(label: "banyan.client")
        logger.logLevel = .debug
        return logger
    }

    /// The debug logger's level, by name (tests).
    static var debugLevelName: String { "\(debugLogger.logLevel)" }

    static func debug(_ message: @autoclosure () -> String) {
        guard enabled.withLock({ $0 }) else { return }
        debugLogger.debug("\(message())")
    }

    static func warning(_ message: String) { logger.warning("\(message)") }

    /// A message sent (`line(sent:)`), while enabled.
    static func sent(_ message: [UInt8]) {
        guard enabled.withLock({ $0 }) else { return }
        debugLogger.debug("\(line(sent: message))")
    }

    /// The log line for a message sent: at most 256 bytes of it; an auth request's token never.
    static func line(sent message: [UInt8]) -> String {
        let text = String(decoding: message.prefix(256), as: UTF8.self)
        if text.contains(#""a":"auth""#) || text.contains(#""a":"gauth""#) {
            return "sent an auth request (\(message.count) bytes, its token not logged)"
        }
        return "sent \(text)\(message.count > 256 ? "… (\(message.count) bytes)" : "")"
    }
}
