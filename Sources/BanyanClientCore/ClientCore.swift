public import BanyanBasics
public import BanyanTree

/// One database's client state (docs/swift-sdk.md): the connection's state, the writes waiting
/// for the server, the listened locations with the server's data, and the value observers. Pure:
/// the driver feeds it the connection's events and the API's calls, and carries out the actions
/// it returns (send a message, open a connection, deliver events, complete writes).
///
/// What it guarantees:
/// - A local write raises value events at once (latency compensation) and is reconciled when the
///   server answers: an `ok` keeps the view; a refusal removes the write and the view reverts.
/// - Writes go to the server in the order they were made and are sent again, in order, on a new
///   connection until they are answered (at least once; exactly once needs the server's session
///   numbers, docs/swift-sdk.md).
/// - Listens are sent again on every new connection; observers see a value only when it changed.
public struct ClientCore: Sendable {
    public typealias ObserverID = UInt64
    public typealias WriteID = UInt64

    public enum Action: Sendable, Equatable {
        /// Open a connection to the node at this index of the node list.
        case connect(node: Int)
        /// Send one message (the driver splits it into frames).
        case send([UInt8])
        /// Close the current connection.
        case disconnect
        /// The value of an observer's location changed (or is known for the first time).
        case value(ObserverID, Tree)
        /// An observer was cancelled (its listen was revoked), with the reason.
        case cancelled(ObserverID, String)
        /// A write was answered: nil on success, else the server's error code and message.
        case completed(WriteID, WriteError?)
        /// A one-time read (`getData`) was answered.
        case got(UInt64, Result<Tree, WriteError>)
        /// The connection state changed (for `.info/connected`).
        case connected(Bool)
    }

    public struct WriteError: Error, Sendable, Equatable, CustomStringConvertible {
        public var code: String
        public var message: String
        public init(code: String, message: String) {
            self.code = code
            self.message = message
        }
        public var description: String { message.isEmpty ? code : "\(code): \(message)" }
    }

    enum Connection: Sendable, Equatable {
        case offline
        case connecting(node: Int)
        case online(node: Int)
        case waiting(until: Int64, node: Int)
    }

    struct PendingWrite: Sendable {
        var id: WriteID
        var request: ClientRequest
        /// The write as the local view applies it: (location, value) pairs.
        var changes: [(Path, Tree)]
        /// The request number it was last sent under (nil: not sent on this connection).
        var sentAs: Int64?
    }

    struct Listen: Sendable {
        var cache: Tree = .empty
        /// The server's data arrived (or the listen was answered) on some connection.
        var complete = false
        var observers: [ObserverID: Tree?] = [:]
        var sentAs: Int64?
    }

    enum Outstanding: Sendable {
        case write(WriteID)
        case listen(Path)
        case get(UInt64, Path)
        case auth
    }

    public let nodeCount: Int
    private(set) var connection: Connection = .offline
    private var wantOnline = true
    private var nextRequest: Int64 = 1
    private var outstanding: [Int64: Outstanding] = [:]
    private var writes: [PendingWrite] = []
    private var listens: [Path: Listen] = [:]
    private var observerPaths: [ObserverID: Path] = [:]
    private var gets: [UInt64: Path] = [:]
    private var random: SeededRandom
    private var failures = 0
    private var authToken: String?
    /// The server's clock minus the local one (ms), from the last hello.
    public private(set) var serverTimeOffset: Int64 = 0
    public private(set) var sessionID: String?
    private var clockMillis: Int64 = 0
    private var actions: [Action] = []

    public init(nodeCount: Int, seed: UInt64, authToken: String? = nil) {
        self.nodeCount = max(1, nodeCount)
        random = SeededRandom(seed: seed)
        self.authToken = authToken
    }

    public var isOnline: Bool {
        if case .online = connection { return true }
        return false
    }

    private mutating func emit(_ a: Action) { actions.append(a) }

    /// The actions produced since the last call.
    public mutating func takeActions() -> [Action] {
        defer { actions = [] }
        return actions
    }

    // MARK: - Time and the connection

    /// The clock (ms); call often: reconnection delays run on it.
    public mutating func tick(now: Int64) {
        clockMillis = now
        switch connection {
        case .offline:
            if wantOnline { startConnecting(node: Int(random.next() % UInt64(nodeCount))) }
        case let .waiting(until, node):
            if now >= until { startConnecting(node: node) }
        case .connecting, .online:
            break
        }
    }

    private mutating func startConnecting(node: Int) {
        connection = .connecting(node: node)
        emit(.connect(node: node))
    }

    /// The driver opened the connection; the server's hello follows.
    public mutating func opened() {}

    /// The connection failed to open or ended. The next attempt goes to the next node after a
    /// jittered exponential back-off (300 ms doubling to 30 s), unless `goOffline` was called.
    public mutating func closed() {
        let node: Int
        switch connection {
        case .online(let n), .connecting(let n): node = n
        case .waiting(_, let n): node = n
        case .offline: node = 0
        }
        let wasOnline = isOnline
        outstanding.removeAll()
        for i in writes.indices { writes[i].sentAs = nil }
        for key in listens.keys { listens[key]?.sentAs = nil }
        // A read in flight is asked again on the next connection.
        if wasOnline { emit(.connected(false)) }
        guard wantOnline else {
            connection = .offline
            return
        }
        failures += 1
        let base = min(30_000, 300 << min(failures, 7))
        let jitter = Int64(random.next() % UInt64(base / 2 + 1))
        connection = .waiting(until: clockMillis + Int64(base / 2) + jitter, node: (node + 1) % nodeCount)
    }

    /// A whole message from the server.
    public mutating func received(_ message: [UInt8]) {
        let event: ServerEvent
        do {
            event = try ServerMessageReader.read(message)
        } catch {
            // A message this client cannot read: the connection is not trustworthy.
            emit(.disconnect)
            return
        }
        switch event {
        case let .hello(timestamp, session):
            guard case .connecting(let node) = connection else { return }
            connection = .online(node: node)
            failures = 0
            sessionID = session
            if timestamp > 0 { serverTimeOffset = timestamp - clockMillis }
            emit(.connected(true))
            if let token = authToken { send(.auth(token: token), as: .auth) }
            for path in listens.keys.sorted() { sendListen(path) }
            for i in writes.indices { sendWrite(i) }
            for (id, path) in gets.sorted(by: { $0.key < $1.key }) { send(.get(path: path), as: .get(id, path)) }
        case let .response(number, status, data):
            guard let what = outstanding.removeValue(forKey: number) else { return }
            answered(what, status: status, data: data)
        case let .data(path, json):
            serverData(at: path, json: json, merge: nil)
        case let .merge(path, children):
            serverData(at: path, json: nil, merge: children)
        case .listenRevoked(let path):
            guard let listen = listens.removeValue(forKey: path) else { return }
            for id in listen.observers.keys.sorted() {
                observerPaths[id] = nil
                emit(.cancelled(id, "permission_denied"))
            }
        case .reset:
            // Reconnect (the driver picks the node from the list; the host is a hint).
            emit(.disconnect)
        case .closed:
            emit(.disconnect)
        case .ignored:
            break
        }
    }

    // MARK: - Going offline and online

    public mutating func goOffline() {
        wantOnline = false
        if case .online = connection { emit(.disconnect) } else if case .connecting = connection { emit(.disconnect) }
        if case .waiting = connection { connection = .offline }
    }

    public mutating func goOnline() {
        wantOnline = true
        failures = 0
        if case .waiting(_, let node) = connection { connection = .waiting(until: clockMillis, node: node) }
    }

    // MARK: - Writes

    /// `setValue`: `json` is the value's JSON (export format and server values allowed).
    public mutating func set(_ id: WriteID, path: Path, json: [UInt8]) throws(TreeError) {
        let value = try localValue(json, at: path)
        writes.append(PendingWrite(id: id, request: .put(path: path, data: json), changes: [(path, value)]))
        sendWrite(writes.count - 1)
        raiseValues(touching: [path])
    }

    /// `updateChildValues`: children at relative paths, applied atomically.
    public mutating func update(_ id: WriteID, path: Path, children: [(Path, [UInt8])]) throws(TreeError) {
        var changes: [(Path, Tree)] = []
        for (relative, json) in children {
            let at = path.appending(relative)
            changes.append((at, try localValue(json, at: at)))
        }
        writes.append(PendingWrite(id: id, request: .merge(path: path, children: children), changes: changes))
        sendWrite(writes.count - 1)
        raiseValues(touching: changes.map(\.0))
    }

    /// Reads a write's value as the local view shows it: server values resolved with the
    /// estimated server time and the view's current data.
    private func localValue(_ json: [UInt8], at path: Path) throws(TreeError) -> Tree {
        let context = ServerValueContext(timestamp: clockMillis + serverTimeOffset, existing: Tree.empty.setting(view(at: path), at: path))
        return try TreeReader.read(json, at: path, serverValues: context)
    }

    private mutating func sendWrite(_ index: Int) {
        guard isOnline else { return }
        let number = send(writes[index].request, as: .write(writes[index].id))
        writes[index].sentAs = number
    }

    // MARK: - Listens

    /// Starts observing the value at `path`. The observer gets the value once known (at once
    /// when the location is already synced or a local write covers it), then each change.
    public mutating func observe(_ id: ObserverID, path: Path) {
        observerPaths[id] = path
        var listen = listens[path] ?? Listen()
        listen.observers[id] = .some(nil)
        let isNew = listens[path] == nil
        listens[path] = listen
        if isNew { sendListen(path) }
        raiseValues(touching: [path], only: id)
    }

    public mutating func removeObserver(_ id: ObserverID) {
        guard let path = observerPaths.removeValue(forKey: id), var listen = listens[path] else { return }
        listen.observers[id] = nil
        if listen.observers.isEmpty {
            listens[path] = nil
            if isOnline { send(.unlisten(path: path), as: nil) }
        } else {
            listens[path] = listen
        }
    }

    /// `getData`: the server's value now (from a synced location when offline).
    public mutating func get(_ id: UInt64, path: Path) {
        if !isOnline, let synced = syncedView(at: path) {
            emit(.got(id, .success(synced)))
            return
        }
        gets[id] = path
        if isOnline { send(.get(path: path), as: .get(id, path)) }
    }

    private mutating func sendListen(_ path: Path) {
        guard isOnline else { return }
        let number = send(.listen(path: path), as: .listen(path))
        listens[path]?.sentAs = number
    }

    @discardableResult
    private mutating func send(_ request: ClientRequest, as what: Outstanding?) -> Int64 {
        let number = nextRequest
        nextRequest += 1
        if let what { outstanding[number] = what }
        emit(.send(request.body(number: number)))
        return number
    }

    // MARK: - Answers and data

    private mutating func answered(_ what: Outstanding, status: String, data: [UInt8]) {
        switch what {
        case .write(let id):
            guard let index = writes.firstIndex(where: { $0.id == id }) else { return }
            let write = writes.remove(at: index)
            let error = status == "ok" ? nil : WriteError(code: status, message: Self.text(data))
            if error != nil { raiseValues(touching: write.changes.map(\.0)) }
            emit(.completed(id, error))
        case .listen(let path):
            guard var listen = listens[path] else { return }
            if status == "ok" {
                listen.complete = true
                listens[path] = listen
                raiseValues(touching: [path])
            } else {
                listens[path] = nil
                for id in listen.observers.keys.sorted() {
                    observerPaths[id] = nil
                    emit(.cancelled(id, status))
                }
            }
        case let .get(id, path):
            gets[id] = nil
            if status == "ok", let tree = try? TreeReader.read(data, at: path) {
                emit(.got(id, .success(tree)))
            } else {
                emit(.got(id, .failure(WriteError(code: status == "ok" ? "invalid_data" : status, message: Self.text(data)))))
            }
        case .auth:
            break
        }
    }

    private static func text(_ json: [UInt8]) -> String {
        if case .string(let s)? = try? JSONValue(parsing: json) { return s }
        return String(decoding: json, as: UTF8.self)
    }

    /// Server data at an absolute path: every listen whose location it overlaps takes it into
    /// its cache.
    private mutating func serverData(at path: Path, json: [UInt8]?, merge: [(Path, [UInt8])]?) {
        var changes: [(Path, Tree)] = []
        if let json {
            guard let value = try? TreeReader.read(json, at: path, limits: .snapshot) else { return }
            changes = [(path, value)]
        } else if let merge {
            for (relative, data) in merge {
                let at = path.appending(relative)
                guard let value = try? TreeReader.read(data, at: at, limits: .snapshot) else { return }
                changes.append((at, value))
            }
        }
        for key in listens.keys {
            guard var listen = listens[key] else { continue }
            var touched = false
            for (at, value) in changes {
                if let below = key.relative(at) {
                    listen.cache.set(value, at: below)
                    touched = true
                } else if let above = at.relative(key) {
                    listen.cache = value.child(at: above)
                    touched = true
                }
            }
            if touched {
                if json != nil, changes.first.map({ $0.0.contains(key) }) == true { listen.complete = true }
                listens[key] = listen
            }
        }
        raiseValues(touching: changes.map(\.0))
    }

    // MARK: - Views

    /// The server's data at `path` from the listen that covers it, when one is complete.
    private func syncedView(at path: Path) -> Tree? {
        for (key, listen) in listens where listen.complete {
            if let below = key.relative(path) { return overlay(listen.cache.child(at: below), at: path) }
        }
        return nil
    }

    /// The local view at `path`: the server's data (from a covering listen) with the pending
    /// writes applied in order.
    func view(at path: Path) -> Tree {
        var base = Tree.empty
        for (key, listen) in listens {
            if let below = key.relative(path) {
                base = listen.cache.child(at: below)
                break
            }
        }
        return overlay(base, at: path)
    }

    private func overlay(_ base: Tree, at path: Path) -> Tree {
        var tree = base
        for write in writes {
            for (at, value) in write.changes {
                if let below = path.relative(at) {
                    tree.set(value, at: below)
                } else if let above = at.relative(path) {
                    tree = value.child(at: above)
                }
            }
        }
        return tree
    }

    /// Whether the view at `path` is known: a complete listen covers it, or a pending write
    /// sets a location that contains it.
    private func isKnown(_ path: Path) -> Bool {
        if listens.contains(where: { $0.value.complete && $0.key.contains(path) }) { return true }
        return writes.contains { w in w.changes.contains { $0.0.contains(path) } }
    }

    /// Raises a value event for each observer whose location overlaps `paths` and whose value
    /// changed since its last event.
    private mutating func raiseValues(touching paths: [Path], only: ObserverID? = nil) {
        for key in listens.keys.sorted() {
            guard paths.contains(where: { $0.contains(key) || key.contains($0) }), var listen = listens[key], isKnown(key) else { continue }
            let value = view(at: key)
            var changed = false
            for id in listen.observers.keys.sorted() where only == nil || only == id {
                if let last = listen.observers[id], let seen = last, seen == value { continue }
                listen.observers[id] = .some(value)
                changed = true
                emit(.value(id, value))
            }
            if changed { listens[key] = listen }
        }
    }
}
