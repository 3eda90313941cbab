import BanyanClientCore
import BanyanTree
public import Foundation
import BanyanBasics
import NIOCore
import NIOPosix
import NIOWebSocket

/// An error as Firebase reports it to completion and cancel blocks: its code
/// (`permission_denied`, `disconnected`, `invalid_path`, …) and message.
public struct DatabaseError: Error, Sendable, Equatable, CustomStringConvertible {
    public let code: String
    public let message: String
    public init(code: String, message: String) {
        self.code = code
        self.message = message
    }
    public var description: String { message.isEmpty ? code : "\(code): \(message)" }
}

/// Event types (this version raises `.value`; child events come next, docs/swift-sdk.md).
public enum DataEventType: Sendable {
    case value
}

/// A database: one realtime connection to a node of the cluster (failing over across `nodes`),
/// the client core's state, and the queue callbacks run on (docs/swift-sdk.md).
public final class Database: @unchecked Sendable {
    public let namespace: String
    /// Nodes as host and port, in the order failover tries them.
    public let nodes: [(host: String, port: Int)]
    /// Where completion and observer blocks run (set it before the first call).
    public var callbackQueue: DispatchQueue

    private let group: MultiThreadedEventLoopGroup
    private let loop: any EventLoop
    // Confined to `loop`:
    private var core: ClientCore
    private var channel: (any Channel)?
    private var connectionNumber = 0
    private var joiner = ClientFrameJoiner()
    private var observers: [UInt64: Observer] = [:]
    private var writeBlocks: [UInt64: @Sendable (DatabaseError?) -> Void] = [:]
    private var getBlocks: [UInt64: @Sendable (Result<Tree, DatabaseError>) -> Void] = [:]
    private var pushIDs: PushIDGenerator
    private let ids = IDSource()
    private var ticker: RepeatedTask?
    private var lastKeepAlive: Int64 = 0

    struct Observer {
        var reference: DatabaseReference
        var block: @Sendable (DataSnapshot) -> Void
        var cancel: (@Sendable (DatabaseError) -> Void)?
        var once: Bool
    }

    /// `url`: a node's address as the Firebase emulator is given, `http://host:port?ns=name`
    /// (the namespace defaults to `default`); `nodes`: the other nodes (`host:port`) to fail
    /// over to. `authToken`: a credential for the connection (the emulator's `owner`, or a token).
    public init(url: String, nodes more: [String] = [], authToken: String? = nil, callbackQueue: DispatchQueue? = nil) throws {
        guard let components = URLComponents(string: url), let host = components.host, let port = components.port else {
            throw DatabaseError(code: "invalid_url", message: "expected http://host:port?ns=name, got \(url)")
        }
        namespace = components.queryItems?.first(where: { $0.name == "ns" })?.value ?? "default"
        var list = [(host, port)]
        for n in more {
            let parts = n.split(separator: ":")
            guard parts.count == 2, let p = Int(parts[1]) else { throw DatabaseError(code: "invalid_url", message: "a node is host:port, got \(n)") }
            if !list.contains(where: { $0.0 == String(parts[0]) && $0.1 == p }) { list.append((String(parts[0]), p)) }
        }
        nodes = list
        self.callbackQueue = callbackQueue ?? DispatchQueue(label: "banyan.database.callbacks")
        group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        loop = group.next()
        let seed = UInt64.random(in: 1...UInt64.max)
        core = ClientCore(nodeCount: list.count, seed: seed, authToken: authToken)
        pushIDs = PushIDGenerator(random: SeededRandom(seed: seed ^ 0x5DEE_CE66))
        loop.execute { self.startTicking() }
    }

    deinit {
        ticker?.cancel()
        channel?.close(promise: nil)
        // The last reference may go on the database's own thread: never wait for it here.
        group.shutdownGracefully(queue: .global()) { _ in }
    }

    /// `Database.database(url:)`: a database for this URL.
    public static func database(url: String) throws -> Database { try Database(url: url) }

    public func reference() -> DatabaseReference { DatabaseReference(database: self, path: .root) }

    public func reference(withPath path: String) -> DatabaseReference { reference().child(path) }

    /// Closes the connection and stays offline (writes queue locally) until `goOnline`.
    public func goOffline() { loop.execute { self.core.goOffline(); self.process() } }
    public func goOnline() { loop.execute { self.core.goOnline(); self.process() } }

    /// Stops the connection and the database's thread (the instance cannot be used after).
    public func shutdown() {
        let done = loop.submit {
            self.ticker?.cancel()
            self.core.goOffline()
            self.process()
            self.channel?.close(promise: nil)
        }
        _ = try? done.wait()
    }

    // MARK: - The loop

    private static func nowMillis() -> Int64 { Int64((Date().timeIntervalSince1970 * 1000).rounded()) }

    private func startTicking() {
        ticker = loop.scheduleRepeatedTask(initialDelay: .zero, delay: .milliseconds(50)) { [weak self] _ in
            guard let self else { return }
            let now = Self.nowMillis()
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
        for action in core.takeActions() {
            switch action {
            case .connect(let node):
                connect(node)
            case .send(let message):
                if let channel { write(message, on: channel) }
            case .disconnect:
                channel?.close(promise: nil)
            case let .value(id, tree):
                guard let observer = observers[id] else { continue }
                if observer.once {
                    observers[id] = nil
                    core.removeObserver(id)
                }
                let snapshot = DataSnapshot(reference: observer.reference, tree: tree)
                callbackQueue.async { observer.block(snapshot) }
            case let .cancelled(id, reason):
                guard let observer = observers.removeValue(forKey: id) else { continue }
                let error = DatabaseError(code: reason, message: "the listen at \(observer.reference.path) was cancelled")
                if let cancel = observer.cancel { callbackQueue.async { cancel(error) } }
            case let .completed(id, error):
                guard let block = writeBlocks.removeValue(forKey: id) else { continue }
                let e = error.map { DatabaseError(code: $0.code, message: $0.message) }
                callbackQueue.async { block(e) }
            case let .got(id, result):
                guard let block = getBlocks.removeValue(forKey: id) else { continue }
                let r = result.mapError { DatabaseError(code: $0.code, message: $0.message) }
                callbackQueue.async { block(r) }
            case .connected:
                break
            }
        }
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

    private func connect(_ node: Int) {
        connectionNumber += 1
        let number = connectionNumber
        joiner = ClientFrameJoiner()
        let (host, port) = nodes[node % nodes.count]
        let opened = WebSocketLink.open(
            host: host, port: port, namespace: namespace, group: loop,
            received: { [weak self] message in
                guard let database = self else { return }
                database.onLoop { database.linkReceived(message, connection: number) }
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

    private func linkReceived(_ message: [UInt8], connection number: Int) {
        guard connectionNumber == number else { return }
        do {
            if let whole = try joiner.add(message) { core.received(whole) }
        } catch {
            channel?.close(promise: nil)
        }
        process()
    }

    private func linkEnded(connection number: Int) {
        guard connectionNumber == number else { return }
        channel = nil
        core.closed()
        process()
    }

    private func linkOpened(_ result: Result<any Channel, any Error>, connection number: Int) {
        guard connectionNumber == number else { return }
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

    // MARK: - Calls from references

    func set(_ path: Path, json: [UInt8], completion: (@Sendable (DatabaseError?) -> Void)?) {
        let id = ids.next()
        onLoop {
            if let completion { self.writeBlocks[id] = completion }
            do {
                try self.core.set(id, path: path, json: json)
            } catch {
                self.writeBlocks[id] = nil
                if let completion { self.callbackQueue.async { completion(DatabaseError(code: "invalid_data", message: "\(error)")) } }
            }
            self.process()
        }
    }

    func update(_ path: Path, children: [(Path, [UInt8])], completion: (@Sendable (DatabaseError?) -> Void)?) {
        let id = ids.next()
        onLoop {
            if let completion { self.writeBlocks[id] = completion }
            do {
                try self.core.update(id, path: path, children: children)
            } catch {
                self.writeBlocks[id] = nil
                if let completion { self.callbackQueue.async { completion(DatabaseError(code: "invalid_data", message: "\(error)")) } }
            }
            self.process()
        }
    }

    func observe(_ reference: DatabaseReference, once: Bool, block: @escaping @Sendable (DataSnapshot) -> Void, cancel: (@Sendable (DatabaseError) -> Void)?) -> UInt {
        let id = ids.next()
        onLoop {
            self.observers[id] = Observer(reference: reference, block: block, cancel: cancel, once: once)
            self.core.observe(id, path: reference.path)
            self.process()
        }
        return UInt(id)
    }

    func removeObserver(_ handle: UInt) {
        onLoop {
            self.observers[UInt64(handle)] = nil
            self.core.removeObserver(UInt64(handle))
            self.process()
        }
    }

    func removeAllObservers(at path: Path) {
        onLoop {
            for (id, o) in self.observers where o.reference.path == path {
                self.observers[id] = nil
                self.core.removeObserver(id)
            }
            self.process()
        }
    }

    func get(_ path: Path, completion: @escaping @Sendable (Result<Tree, DatabaseError>) -> Void) {
        let id = ids.next()
        onLoop {
            self.getBlocks[id] = completion
            self.core.get(id, path: path)
            self.process()
        }
    }

    func nextPushID() -> String {
        // Taken on the caller's thread: the generator is guarded by the id source's lock.
        ids.withLock { pushIDs.next(now: Self.nowMillis()) }
    }
}

/// Ids for writes, observers and reads (any thread).
final class IDSource: @unchecked Sendable {
    private let lock = NSLock()
    private var value: UInt64 = 0
    func next() -> UInt64 { lock.withLock { value += 1; return value } }
    func withLock<T>(_ body: () -> T) -> T { lock.withLock(body) }
}
