public import BanyanBasics
public import BanyanQuery
public import BanyanTree

/// One database's client state (docs/swift-sdk.md): the connection, the server's data the client
/// holds, the writes waiting for the server, the views that observers watch, transactions and
/// onDisconnect registrations. Pure: the driver feeds it the connection's events, the clock and
/// the API's calls, and carries out the actions it returns (open a connection, send a message,
/// deliver events, complete writes).
///
/// What it guarantees:
/// - A local write raises events at once (latency compensation) and is reconciled when the server
///   answers: an `ok` removes it and the view shows the server's data (normally unchanged: the
///   server's echo arrived before it); a refusal removes the write and the view reverts, with the
///   events that undo it.
/// - The local view costs what a write touches, not what is queued: the local tree (the server's
///   data with the visible pending writes applied in order) is kept incrementally, and the
///   pending writes are indexed by path (`WriteIndex`), so a write, an answer or a push costs its
///   depth plus the pending writes overlapping its locations, whatever the queue's length.
/// - Writes go to the server in the order they were made, and are sent again in order on every new
///   connection until answered.
/// - Every view is a location and a query; observers of one view share it. A view raises child
///   events (in Firebase's order: removed, added, moved, changed) whenever its data changes, and
///   `value` once its data is known (a complete listen, or a local write covering it) and after
///   every change.
/// - Listens are sent again on every new connection; filtered queries (a range or a limit) are
///   tagged listens with data of their own, and queries that load all data share the location's
///   plain listen and are filtered locally.
public struct ClientCore: Sendable {
    public typealias ObserverID = UInt64
    public typealias WriteID = UInt64

    /// The kinds of events an observer can ask for.
    public enum EventType: Int, Sendable, Hashable, CaseIterable {
        case value, childAdded, childChanged, childRemoved, childMoved

        init(_ kind: ViewEvent.Kind) {
            switch kind {
            case .value: self = .value
            case .childAdded: self = .childAdded
            case .childChanged: self = .childChanged
            case .childRemoved: self = .childRemoved
            case .childMoved: self = .childMoved
            }
        }
    }

    public enum Action: Sendable, Equatable {
        /// Open a connection to the node at this index of the node list.
        case connect(node: Int)
        /// The next `connect` goes to this host (`host` or `host:port`) instead of the node's
        /// address, once: the server's reset (`r`) named it (a draining node sends its clients
        /// on). If that connection fails, the node list takes over again.
        case redirect(host: String)
        /// Send one message (the driver splits it into frames).
        case send([UInt8])
        /// Close the current connection.
        case disconnect
        /// An event for an observer: the event's tree is the child's (child events) or the view's
        /// (value).
        case event(ObserverID, ViewEvent)
        /// An observer was cancelled (its listen was refused or revoked), with the reason.
        case cancelled(ObserverID, WriteError)
        /// A write (set, update, priority, onDisconnect call) was answered: nil on success.
        case completed(WriteID, WriteError?)
        /// A transaction finished.
        case transactionCompleted(WriteID, TransactionOutcome)
        /// A one-time read (`getData`) was answered.
        case got(UInt64, Result<Tree, WriteError>)
        /// The connection state changed (`.info/connected`).
        case connected(Bool)
        /// The server refused or revoked the credential; the connection goes on unauthenticated
        /// (the driver may fetch a fresh token and call `setAuthToken`).
        case authRevoked(WriteError)
        /// Append these records to the disk cache (persistence on); `durable`: a write is among
        /// them, so the file must be synced before the app may count on it surviving a restart.
        case persist([ClientStore.Record], durable: Bool)
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

    /// What a transaction's update function decided.
    public enum TransactionDecision: Sendable {
        /// Write this value (JSON, export format and server values allowed).
        case commit([UInt8])
        /// Stop: nothing is written.
        case abort
        /// The function produced data that cannot be stored: the transaction fails with
        /// `invalid_data` and this reason.
        case invalid(String)
    }

    /// How a transaction ended: an error (nil when it committed or was aborted by its function),
    /// whether it committed, and the data at its location then.
    public struct TransactionOutcome: Sendable, Equatable {
        public var error: WriteError?
        public var committed: Bool
        public var snapshot: Tree
        public init(error: WriteError?, committed: Bool, snapshot: Tree) {
            self.error = error
            self.committed = committed
            self.snapshot = snapshot
        }
    }

    /// A transaction's update function: called with the current data at its location.
    public typealias TransactionUpdate = @Sendable (Tree) -> TransactionDecision

    /// The most times a transaction runs again after the server found its data stale.
    public static let maxTransactionRetries = 25

    /// How long the client waits on a node before it takes the node for dead, closes the
    /// connection and fails over to the next node (docs/swift-sdk.md, "Failover"). A node that
    /// is stopped, hung or cut off by a partition still completes TCP handshakes (its kernel
    /// does) and then says nothing: these timers notice it. All in ms, on the `tick` clock.
    public struct Timeouts: Sendable, Equatable {
        /// From the start of an attempt (the socket, the WebSocket upgrade) to the server's
        /// hello.
        public var connectMillis: Int64
        /// Nothing heard from the node for this long while online: the client sends a protocol
        /// ping (`{"t":"c","d":{"t":"p","d":{}}}`), which a live server answers with a pong.
        public var idleMillis: Int64
        /// Nothing at all heard for this long after that ping: the node is taken for dead.
        public var pingAnswerMillis: Int64

        public init(connectMillis: Int64 = 10_000, idleMillis: Int64 = 30_000, pingAnswerMillis: Int64 = 15_000) {
            self.connectMillis = max(1, connectMillis)
            self.idleMillis = max(1, idleMillis)
            self.pingAnswerMillis = max(1, pingAnswerMillis)
        }
    }

    /// A gap between two ticks at least this long means the client itself was not running (a
    /// suspended app, a stalled thread): silence over such a gap proves nothing about the node,
    /// so a ping's wait for an answer starts again.
    public static let stallMillis: Int64 = 2_000

    /// The protocol's ping (answered by the server with a pong).
    static let ping: [UInt8] = Array(#"{"t":"c","d":{"t":"p","d":{}}}"#.utf8)

    // MARK: - State

    enum Connection: Sendable, Equatable {
        case offline
        case connecting(node: Int)
        case online(node: Int)
        case waiting(until: Int64, node: Int)
    }

    /// One change a write makes to the local view.
    enum Change: Sendable {
        case set(Path, Tree)
        case priority(Path, Priority)

        var path: Path {
            switch self {
            case .set(let p, _), .priority(let p, _): p
            }
        }
    }

    struct PendingWrite: Sendable {
        var id: WriteID
        /// The client's own number for it (exactly once across connections, with a server that
        /// takes numbers).
        var number: UInt64 = 0
        var request: ClientRequest
        var changes: [Change]
        /// Shown in local views (a transaction run without local events is not).
        var visible: Bool
        var isTransaction: Bool
        /// The request number it was last sent under (nil: not sent on this connection).
        var sentAs: Int64?
        /// Made while the connection had a credential (stored with it, `StoredWrite.signedIn`).
        var signedIn = false
        /// Restored from the cache and made signed in: it, and every write after it (order is
        /// kept), waits until a credential is set (`setAuthToken`).
        var waitsForCredential = false
    }

    /// What a listen is: the plain location, or a filtered query with a tag.
    struct ListenKey: Hashable, Sendable, Comparable {
        var path: Path
        /// `"default"` for a plain listen, else the query's identifier.
        var query: String
        var isPlain: Bool { query == "default" }
        static func < (a: ListenKey, b: ListenKey) -> Bool { a.path != b.path ? a.path < b.path : a.query < b.query }
    }

    struct Listen: Sendable {
        var params: QueryParams
        var tag: Int?
        /// Views, kept-synced locations and transactions that need it.
        var users: Int
        /// The server answered it (or sent the whole location).
        var complete = false
        /// A tagged listen's own data at its location (plain listens share `server`).
        var cache: Tree = .empty
        /// A tagged listen's `cache` with the visible pending writes applied in order, kept
        /// current incrementally as `local` is (`recomputeOverlaid`): a write under a filtered
        /// query costs its own changes, not a replay of every pending write under the location.
        var overlaid: Tree = .empty
        var sentAs: Int64?
    }

    /// A view: a location and a query that observers watch; its `QueryView` holds what the
    /// observers were last shown.
    struct ViewKey: Hashable, Sendable, Comparable {
        var path: Path
        var query: String
        static func < (a: ViewKey, b: ViewKey) -> Bool { a.path != b.path ? a.path < b.path : a.query < b.query }
    }

    struct View: Sendable {
        var params: QueryParams
        var listen: ListenKey?
        var shown: QueryView
        var observers: [ObserverID: EventType] = [:]
        /// A value event was raised (the view's data was known at least once).
        var valueRaised = false
    }

    struct Transaction: Sendable {
        var path: Path
        var update: TransactionUpdate
        var applyLocally: Bool
        var retries = 0
        /// A set or update overlapping it was made after it started: it does not run again.
        var overridden = false
    }

    enum OnDisconnectOp: Sendable {
        case set(Path, JSONValue)
        case update(Path, [(Path, JSONValue)])
        case cancel(Path)
    }

    enum Outstanding: Sendable {
        case write(WriteID)
        case listen(ListenKey)
        case get(UInt64)
        case onDisconnect(WriteID, OnDisconnectOp)
        case auth
        case ignored
    }

    public let nodeCount: Int
    private(set) var connection: Connection = .offline
    private var wantOnline = true
    private var nextRequest: Int64 = 1
    private var outstanding: [Int64: Outstanding] = [:]
    /// The unanswered writes, in the order they were made.
    private var writes = WriteQueue()
    /// The visible ones by the paths they change.
    private var writeIndex = WriteIndex()
    /// The local tree: `server` with the visible pending writes applied in order, kept current
    /// incrementally (a new write applies its own changes; a change of `server` or a removed
    /// write recomputes only the locations it touched), so no step replays the whole queue.
    private var local: Tree = .empty
    /// Every write before this sequence was sent on this connection (where sending resumes).
    private var unsentFrom: UInt64 = 1
    private var listens: [ListenKey: Listen] = [:]
    private var tags: [Int: ListenKey] = [:]
    private var nextTag = 1
    /// The server's data for plain listens (sparse: only listened locations are meaningful).
    private var server: Tree = .empty
    private var views: [ViewKey: View] = [:]
    private var observerViews: [ObserverID: ViewKey] = [:]
    private var gets: [UInt64: (path: Path, params: QueryParams)] = [:]
    private var transactions: [WriteID: Transaction] = [:]
    private var keptSynced: Set<Path> = []
    /// onDisconnect calls made while offline, sent on the next connection.
    private var queuedOnDisconnect: [(WriteID, OnDisconnectOp)] = []
    /// The onDisconnect writes the server accepted on this connection, applied locally when it
    /// ends (as the server applies them).
    private var onDisconnectLocal = OnDisconnectTree()
    private var random: SeededRandom
    private var failures = 0
    /// The node a connection started from offline tries first: the first of the list (the
    /// database's URL) at start, afterwards the node of the last connection.
    private var resumeNode = 0
    /// The host a reset (`r`) named, for the next connection attempt only.
    private var resetHost: String?
    /// The connection is ending because the server reset it: reconnect at once, not after a
    /// back-off (a reset is not a failure).
    private var resetting = false
    /// The connection is closing because `goOffline` asked (not a failure: no back-off, and a
    /// `goOnline` before it ended reconnects to the same node).
    private var closingForOffline = false
    /// The connection's credential (nil: none).
    public private(set) var authToken: String?
    /// The server's clock minus the local one (ms), from the last hello.
    public private(set) var serverTimeOffset: Int64 = 0
    public private(set) var sessionID: String?
    private var clockMillis: Int64 = 0
    /// The clock at the last tick (nil before the first).
    private var lastTick: Int64?
    /// The timers that find a dead or silent node (settable before or between connections).
    public var timeouts = Timeouts()
    /// When the current attempt started (`connecting`).
    private var attemptStarted: Int64 = 0
    /// When anything (a frame, a WebSocket ping) last came from the node (`online`).
    private var lastHeard: Int64 = 0
    /// When the ping of the current silence went out (nil: none sent).
    private var pingSent: Int64?
    private var actions: [Action] = []
    /// Counters sent to the server once per connection (`s`).
    public var stats: [(String, Int64)] = [("sdk.swift.banyan", 1)]
    /// The SDK's version (`Database.sdkVersion()`).
    public static let sdkVersion = "0.1.0"
    /// This client's stable id (Banyan's `bc`): with the write numbers, a node applies each of
    /// its writes at most once, whatever connection carries it (docs/swift-sdk.md).
    public let clientID: UInt64
    /// The next write number.
    public private(set) var nextWriteNumber: UInt64 = 1
    /// The server of this connection takes write numbers (its hello said `bw`).
    private var numbered = false
    /// The session id of the last connection that said hello (sent as `ls` on the next one, so
    /// the server ends it first).
    private var lastSession: String?
    /// Persistence is on: changes to the queue and to complete locations become `.persist`.
    public let persistence: Bool
    /// Locations whose data the disk cache held complete (persistence on): they raise events
    /// from the cache at once, before (or without) the server.
    private var cachedComplete: Set<Path> = []
    /// With persistence: the windows of filtered queries the disk cache holds and no listen holds
    /// now (a listen takes its window over when it starts, and gives it back when it ends).
    private var cachedQueries: [ListenKey: Tree] = [:]
    /// Writes restored from the disk whose local values wait for the first tick (server values
    /// resolve with the clock).
    private var restoredValuesPending = false
    /// How many numbers past the lowest unanswered write may be in flight (the server's window).
    public static let writeWindow: UInt64 = 1_000
    /// Whether writes carry their numbers when the server takes them (off only to show, in
    /// tests, what happens without: a resent write can apply twice).
    public var useWriteNumbers = true

    /// `clientID`: the client's stable id (0: one is drawn from `seed`). `restored`: what the disk
    /// cache held (persistence): its unanswered writes keep their client id and numbers; with
    /// none, the client starts a new id (numbers are never reused under an id).
    public init(
        nodeCount: Int, seed: UInt64, authToken: String? = nil, clientID: UInt64 = 0, nextWriteNumber: UInt64 = 1,
        persistence: Bool = false, restored: ClientStore.Restored? = nil
    ) {
        self.nodeCount = max(1, nodeCount)
        random = SeededRandom(seed: seed)
        self.authToken = authToken
        self.persistence = persistence
        var id = clientID
        var next = max(1, nextWriteNumber)
        if let restored, !restored.writes.isEmpty, restored.client != 0 {
            id = restored.client
            next = max(next, restored.nextNumber)
        }
        while id == 0 { id = random.next() }
        self.clientID = id
        self.nextWriteNumber = next
        if let restored {
            server = restored.server
            local = server
            cachedComplete = restored.complete
            for (key, tree) in restored.queries { cachedQueries[ListenKey(path: key.path, query: key.query)] = tree }
            if restored.client == id {
                for stored in restored.writes {
                    writes.append(Self.pendingWrite(from: stored))
                }
                restoredValuesPending = !writes.isEmpty
            }
        }
        if persistence { emit(.persist([.identity(client: id, nextNumber: next)], durable: true)) }
    }

    /// The id a restored write answers to (never one the driver hands out).
    static func restoredWriteID(_ number: UInt64) -> WriteID { 1 << 63 | number }

    static func pendingWrite(from stored: ClientStore.StoredWrite) -> PendingWrite {
        let request: ClientRequest
        switch stored.kind {
        case .set: request = .put(path: stored.path, data: stored.json)
        case .priority: request = .put(path: stored.path, data: stored.json, priority: true)
        case .transaction: request = .put(path: stored.path, data: stored.json, hash: stored.hash)
        case .merge: request = .merge(path: stored.path, children: stored.children)
        }
        return PendingWrite(
            id: restoredWriteID(stored.number), number: stored.number, request: request, changes: [], visible: stored.visible,
            isTransaction: stored.kind == .transaction, sentAs: nil, signedIn: stored.signedIn, waitsForCredential: stored.signedIn)
    }

    /// The local changes of a write, from its request (server values with the clock now).
    private func changes(of request: ClientRequest) -> [Change] {
        switch request {
        case let .put(path, data, _, priority):
            if priority {
                guard let tree = try? TreeReader.read(data, at: path), let p = Priority(tree: tree) else { return [] }
                return [.priority(path, p)]
            }
            guard let value = try? localValue(data, at: path) else { return [] }
            return [.set(path, value)]
        case let .merge(path, children):
            return children.compactMap { relative, json in
                let at = path.appending(relative)
                return (try? localValue(json, at: at)).map { .set(at, $0) }
            }
        default:
            return []
        }
    }

    /// The stored form of a pending write.
    private static func stored(_ write: PendingWrite) -> ClientStore.StoredWrite? {
        switch write.request {
        case let .put(path, data, hash, priority):
            let kind: ClientStore.WriteKind = priority ? .priority : (hash != nil ? .transaction : .set)
            return ClientStore.StoredWrite(
                number: write.number, kind: kind, path: path, json: data, hash: hash ?? "", visible: write.visible, signedIn: write.signedIn)
        case let .merge(path, children):
            return ClientStore.StoredWrite(number: write.number, kind: .merge, path: path, children: children, visible: write.visible, signedIn: write.signedIn)
        default:
            return nil
        }
    }

    private mutating func persistWrite(_ write: PendingWrite) {
        guard persistence, let stored = Self.stored(write) else { return }
        emit(.persist([.write(stored)], durable: true))
    }

    /// `durable`: the record must reach the disk before anything else happens (a purged write,
    /// never sent, must not come back after a power loss); an answered one need not (sending
    /// it again after a restart is answered as a duplicate).
    private mutating func persistWriteDone(_ number: UInt64, durable: Bool = false) {
        guard persistence else { return }
        emit(.persist([.writeDone(number)], durable: durable))
    }

    /// The disk cache rewritten: identity and unanswered writes; then what must stay whatever its
    /// size: every complete location listened to now or kept synced, and every complete filtered
    /// query listened to now; then, while they fit in `budget` bytes, the other complete
    /// locations in path order and the other cached query windows. Every record counts by its
    /// encoded size (`ClientStore.encodedSize`). A location inside one already written is covered
    /// by it. Locations that do not fit are forgotten, and their data dropped from memory too,
    /// except the listened or kept-synced locations inside them; windows that do not fit are
    /// forgotten.
    public mutating func compactedRecords(budget: Int) -> [ClientStore.Record] {
        var records: [ClientStore.Record] = [.identity(client: clientID, nextNumber: nextWriteNumber)]
        for w in writes.all { if let s = Self.stored(w) { records.append(.write(s)) } }
        let live = Set(listens.filter { $0.key.isPlain && $0.value.complete }.map(\.key.path))
        let candidates = live.union(cachedComplete)
        let mustKeep = candidates.filter { keptSynced.contains($0) || live.contains($0) }
        var used = records.reduce(0) { $0 + ClientStore.encodedSize($1) }
        var kept: [Path] = []
        func covered(_ path: Path) -> Bool { kept.contains { $0.contains(path) } }
        // Keeps a complete location (its data and its completeness mark) unless it is optional
        // and does not fit.
        func keep(_ path: Path, optional: Bool) {
            guard !covered(path) else { return }
            let data: ClientStore.Record = .server(path, JSONWriter.bytes(server.child(at: path), format: .export))
            let mark: ClientStore.Record = .complete(path, true)
            let size = ClientStore.encodedSize(data) + ClientStore.encodedSize(mark)
            if optional && used + size > budget { return }
            used += size
            records.append(data)
            records.append(mark)
            kept.append(path)
        }
        // 1. What must stay: listened and kept-synced locations (outermost first: a shorter path
        // sorts before the paths inside it), then the filtered queries listened to now.
        for path in mustKeep.sorted() { keep(path, optional: false) }
        for (key, listen) in listens.sorted(by: { $0.key < $1.key }) where !key.isPlain && listen.complete {
            let record = Self.queryRecord(key, at: .root, listen.cache)
            used += ClientStore.encodedSize(record)
            records.append(record)
        }
        // 2. What may stay while it fits: other complete locations, then other cached windows.
        for path in candidates.subtracting(mustKeep).sorted() { keep(path, optional: true) }
        for (key, tree) in cachedQueries.sorted(by: { $0.key < $1.key }) {
            let record = Self.queryRecord(key, at: .root, tree)
            let size = ClientStore.encodedSize(record)
            if used + size > budget {
                cachedQueries[key] = nil
                continue
            }
            used += size
            records.append(record)
        }
        // What did not fit is no longer cached, nor held in memory when nothing listens to it; the
        // listened or kept-synced locations inside it keep their data (and their cache entries).
        var uncovered: [Path] = []
        defer { if !uncovered.isEmpty { refresh(touching: uncovered, whole: true) } }
        for path in cachedComplete where !covered(path) {
            cachedComplete.remove(path)
            uncovered.append(path)
            guard !isPlainComplete(path), !live.contains(path) else { continue }
            let inside = kept.filter { path.contains($0) && $0 != path }
            let saved = inside.map { ($0, server.child(at: $0)) }
            server.set(.empty, at: path)
            for (at, tree) in saved { server.set(tree, at: at) }
            recomputeLocal(at: path)
        }
        return records
    }

    /// The parameters for the next connection's URL beyond `v` and `ns`: the client id and,
    /// after a first connection, the last session (`ls`), percent-safe.
    public var connectionParameters: [(String, String)] {
        let hex = String(clientID, radix: 16)
        var list = [("bc", String(repeating: "0", count: 16 - hex.count) + hex)]
        if let lastSession, lastSession.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39 || $0 >= 0x41 && $0 <= 0x5A || $0 >= 0x61 && $0 <= 0x7A || $0 == 0x2D || $0 == 0x5F || $0 == 0x2E) }) {
            list.append(("ls", lastSession))
        }
        return list
    }

    public var isOnline: Bool {
        if case .online = connection { return true }
        return false
    }

    /// Online and not closing for `goOffline`: writes and onDisconnect calls made while the
    /// connection closes wait for the next one (as Firebase's, whose `goOffline` interrupts the
    /// connection at once), so an onDisconnect call is queued rather than lost with it.
    private var sendsNow: Bool { isOnline && !closingForOffline }

    /// The index (in the node list) of the node the connection is online with; nil otherwise.
    public var onlineNode: Int? {
        if case .online(let node) = connection { return node }
        return nil
    }

    /// Writes not yet answered by the server (sets, updates, priorities and transactions).
    public var pendingWriteCount: Int { writes.count }

    private mutating func emit(_ a: Action) { actions.append(a) }

    /// The actions produced since the last call.
    public mutating func takeActions() -> [Action] {
        defer { actions = [] }
        return actions
    }

    // MARK: - Time and the connection

    /// The clock (ms); call often (every 50 ms, say): reconnection delays and the timers that
    /// find a dead node run on it.
    public mutating func tick(now: Int64) {
        clockMillis = now
        let stalled = lastTick.map { now - $0 >= Self.stallMillis } ?? false
        lastTick = now
        if restoredValuesPending {
            restoredValuesPending = false
            // In order, each on the local view with the writes before it applied.
            for seq in writes.seqs {
                guard let write = writes[seq], write.changes.isEmpty else { continue }
                let list = changes(of: write.request)
                writes[seq]?.changes = list
                guard write.visible else { continue }
                for change in list { writeIndex.insert(seq, change: change) }
                for change in list { recomputeLocal(at: change.path) }
            }
            for key in Array(listens.keys) where !key.isPlain { recomputeOverlaid(key, at: key.path) }
            refresh(touching: writes.all.flatMap { $0.changes.map(\.path) })
        }
        switch connection {
        case .offline:
            if wantOnline { startConnecting(node: resumeNode) }
        case let .waiting(until, node):
            if now >= until { startConnecting(node: node) }
        case .connecting:
            // No hello in time: the node accepted the connection (or its kernel did) and says
            // nothing, or the upgrade hangs.
            if now - attemptStarted >= timeouts.connectMillis { abandonConnection() }
        case .online:
            if let sent = pingSent {
                if stalled {
                    // The client was not running: the ping's answer may be waiting unread.
                    pingSent = now
                } else if now - sent >= timeouts.pingAnswerMillis {
                    abandonConnection()
                }
            } else if now - lastHeard >= timeouts.idleMillis {
                pingSent = now
                emit(.send(Self.ping))
            }
        }
    }

    private mutating func startConnecting(node: Int) {
        connection = .connecting(node: node)
        attemptStarted = clockMillis
        if let host = resetHost {
            resetHost = nil
            emit(.redirect(host: host))
        }
        emit(.connect(node: node))
    }

    /// The node is taken for dead: the driver closes the connection (an attempt still opening
    /// too) and forgets it, and the client goes on as after any lost connection: back-off, the
    /// next node, listens and unanswered writes sent again there.
    private mutating func abandonConnection() {
        emit(.disconnect)
        closed()
    }

    /// The connection is in use or being opened: a `.disconnect` then asks the driver to close
    /// it and report the end with `closed()`. Otherwise (after `goOffline` during an attempt, or
    /// after a timeout) the core has already let go of it and the driver just drops it.
    public var holdsConnection: Bool {
        switch connection {
        case .connecting, .online: true
        case .offline, .waiting: false
        }
    }

    /// The driver heard from the node without a whole message for `received` (a frame of a
    /// message in parts, a WebSocket ping): the node is alive.
    public mutating func heard() {
        lastHeard = clockMillis
        pingSent = nil
    }

    /// The driver opened the connection; the server's hello follows.
    public mutating func opened() {}

    /// The connection failed to open or ended. The next attempt goes to the next node after a
    /// jittered exponential back-off (300 ms doubling to 30 s), unless `goOffline` was called.
    public mutating func closed() {
        let node: Int
        switch connection {
        case .online(let n), .connecting(let n): node = n
        // Already offline (`goOffline` during a connection attempt) or waiting (the core gave
        // the connection up on a timeout; or a second report of the same end): nothing more.
        case .offline, .waiting: return
        }
        pingSent = nil
        let wasOnline = isOnline
        let lost = outstanding
        outstanding.removeAll()
        writes.modifyAll { $0.sentAs = nil }
        unsentFrom = writes.startSeq
        for key in listens.keys { listens[key]?.sentAs = nil }
        if wasOnline {
            // onDisconnect calls in flight: their registration died with the connection (if it
            // was made, the server ran it as the connection ended).
            for number in lost.keys.sorted() {
                if case .onDisconnect(let id, _)? = lost[number] {
                    emit(.completed(id, WriteError(code: "disconnected", message: "The connection ended before the server answered")))
                }
            }
        }
        if wantOnline && (closingForOffline || resetting) {
            connection = .waiting(until: clockMillis, node: node)
        } else if wantOnline {
            failures += 1
            let base = min(30_000, 300 << min(failures, 7))
            let jitter = Int64(random.next() % UInt64(base / 2 + 1))
            connection = .waiting(until: clockMillis + Int64(base / 2) + jitter, node: (node + 1) % nodeCount)
        } else {
            connection = .offline
            resumeNode = node
        }
        closingForOffline = false
        resetting = false
        if wasOnline {
            runLocalOnDisconnect()
            emit(.connected(false))
            refreshInfo()
        }
    }

    /// A whole message from the server.
    public mutating func received(_ message: [UInt8]) {
        heard()
        let event: ServerEvent
        do {
            event = try ServerMessageReader.read(message)
        } catch {
            // A message this client cannot read: the connection is not trustworthy.
            emit(.disconnect)
            return
        }
        switch event {
        case let .hello(timestamp, session, writeNumbers):
            guard case .connecting(let node) = connection else { return }
            connection = .online(node: node)
            failures = 0
            sessionID = session
            lastSession = session
            numbered = writeNumbers && useWriteNumbers
            if timestamp > 0 { serverTimeOffset = timestamp - clockMillis }
            onDisconnectLocal = OnDisconnectTree()
            emit(.connected(true))
            refreshInfo()
            if !stats.isEmpty { send(.stats(stats), as: .ignored) }
            if let token = authToken { send(.auth(token: token), as: .auth) }
            for key in listens.keys.sorted() { sendListen(key) }
            sendWaitingWrites()
            for (id, op) in queuedOnDisconnect { sendOnDisconnect(id, op) }
            queuedOnDisconnect = []
            for id in gets.keys.sorted() { sendGet(id) }
        case let .response(number, status, data):
            guard let what = outstanding.removeValue(forKey: number) else { return }
            answered(what, status: status, data: data)
        case let .data(path, json, tag):
            guard let value = try? TreeReader.read(json, at: path, limits: .snapshot) else { return }
            serverData(at: path, changes: [(path, value)], tag: tag, whole: true)
        case let .merge(path, children, tag):
            var changes: [(Path, Tree)] = []
            for (relative, data) in children {
                let at = path.appending(relative)
                guard let value = try? TreeReader.read(data, at: at, limits: .snapshot) else { return }
                changes.append((at, value))
            }
            serverData(at: path, changes: changes, tag: tag, whole: false)
        case let .listenRevoked(path, queries):
            var keys: [ListenKey] = []
            if let queries {
                for q in queries {
                    if let params = try? QueryParams(wire: q) { keys.append(ListenKey(path: path, query: params.identifier)) }
                }
            } else {
                keys.append(ListenKey(path: path, query: "default"))
            }
            keys = keys.filter { listens[$0] != nil }
            // A cancel naming nothing this client holds cancels every listen at the path (as
            // the Android and iOS SDKs do).
            if keys.isEmpty { keys = listens.keys.filter { $0.path == path }.sorted() }
            for key in keys { failListen(key, WriteError(code: "permission_denied", message: "Permission denied")) }
        case let .authRevoked(status, reason):
            authToken = nil
            emit(.authRevoked(WriteError(code: status, message: reason)))
            // The SDKs close and reconnect, so the new connection starts with a fresh token.
            emit(.disconnect)
        case .reset(let host):
            // Reconnect at once, to the host the server named (a drain sends clients to another
            // node, which need not be in the list); the list takes over if that fails.
            resetHost = host.isEmpty ? nil : host
            resetting = true
            emit(.disconnect)
        case .closed:
            emit(.disconnect)
        case .ignored:
            break
        }
    }

    // MARK: - Purging outstanding writes

    /// `purgeOutstandingWrites()`, as Firebase's: every write not yet answered (sets, updates,
    /// priorities, transactions) is abandoned. It is rolled back locally (its locations are
    /// refreshed, so observers see the data without it), removed from the disk cache, never sent
    /// again, and completed with `write_canceled`; every running transaction ends uncommitted
    /// with it. onDisconnect calls queued while offline (not sent) fail the same way and are not
    /// sent; one already sent keeps waiting for its answer, since the server registered it (as
    /// with Firebase, whose purge cancels only its queue of unsent ones). A write already sent
    /// may still apply on the server: its answer, if one comes, is ignored. The next write
    /// tells the server that every number below its own is settled, so a purged write's number
    /// never applies after that. The removal from the disk cache is durable at once.
    public mutating func purgeOutstandingWrites() {
        let canceled = WriteError(code: "write_canceled", message: "The write was canceled by the user.")
        var touched: [Path] = []
        var completed: [WriteID] = []
        let seqs = writes.seqs
        for (i, seq) in seqs.enumerated() {
            guard let write = removeWrite(seq) else { continue }
            persistWriteDone(write.number, durable: i == seqs.count - 1)
            touched += write.changes.map(\.path)
            if !write.isTransaction { completed.append(write.id) }
        }
        for number in outstanding.keys.sorted() {
            if case .write? = outstanding[number] { outstanding[number] = .ignored }
        }
        completed += queuedOnDisconnect.map(\.0)
        queuedOnDisconnect = []
        // Events for the data without the writes first, then the transactions' and the
        // writes' completions (Firebase's order).
        if !touched.isEmpty { refresh(touching: touched) }
        for id in transactions.keys.sorted() { finishTransaction(id, error: canceled, committed: false) }
        for id in completed { emit(.completed(id, canceled)) }
    }

    // MARK: - Going offline and online, credentials

    public mutating func goOffline() {
        wantOnline = false
        switch connection {
        case .online:
            closingForOffline = true
            emit(.disconnect)
        case .connecting(let node):
            // The attempt is abandoned now (the driver drops it, even if it opens later): a hello
            // arriving after this must not bring the client online.
            connection = .offline
            resumeNode = node
            emit(.disconnect)
        case .waiting(_, let node):
            connection = .offline
            resumeNode = node
        case .offline: break
        }
    }

    public mutating func goOnline() {
        wantOnline = true
        failures = 0
        if case .waiting(_, let node) = connection { connection = .waiting(until: clockMillis, node: node) }
    }

    /// Sets (or, with nil, drops) the connection's credential; sent at once when online.
    public mutating func setAuthToken(_ token: String?) {
        let changed = token != authToken
        authToken = token
        guard changed, isOnline else { return }
        if let token { send(.auth(token: token), as: .auth) } else { send(.unauth, as: .ignored) }
        // Writes restored from the cache that waited for a credential go now, after it.
        if token != nil { sendWaitingWrites() }
    }

    // MARK: - Writes

    /// `setValue`: `json` is the value's JSON (export format and server values allowed).
    public mutating func set(_ id: WriteID, path: Path, json: [UInt8]) throws(TreeError) {
        let value = try localValue(json, at: path)
        addWrite(PendingWrite(id: id, request: .put(path: path, data: json), changes: [.set(path, value)], visible: true, isTransaction: false, sentAs: nil))
    }

    /// `updateChildValues`: children at relative paths, applied atomically.
    public mutating func update(_ id: WriteID, path: Path, children: [(Path, [UInt8])]) throws(TreeError) {
        var changes: [Change] = []
        for (relative, json) in children {
            let at = path.appending(relative)
            changes.append(.set(at, try localValue(json, at: at)))
        }
        addWrite(PendingWrite(id: id, request: .merge(path: path, children: children), changes: changes, visible: true, isTransaction: false, sentAs: nil))
    }

    /// `setPriority`: `json` is the priority (a number, a string or null).
    public mutating func setPriority(_ id: WriteID, path: Path, json: [UInt8]) throws(TreeError) {
        let tree = try TreeReader.read(json, at: path)
        guard let priority = Priority(tree: tree) else {
            throw TreeError(.invalidPriority, path: path.description, "Invalid priority: a priority is a number, a string or null")
        }
        addWrite(
            PendingWrite(
                id: id, request: .put(path: path, data: json, priority: true), changes: [.priority(path, priority)], visible: true, isTransaction: false,
                sentAs: nil))
    }

    private mutating func addWrite(_ newWrite: PendingWrite) {
        var write = newWrite
        write.number = takeWriteNumber()
        write.signedIn = authToken != nil
        // A set or update over a running transaction's location overrides it (Firebase's
        // `overriddenBySet`).
        for id in transactions.keys.sorted() {
            guard let t = transactions[id], write.changes.contains(where: { $0.path.contains(t.path) || t.path.contains($0.path) }) else { continue }
            if let seq = writes.seq(of: id), writes[seq]?.sentAs == nil, !sendsNow, let removed = removeWrite(seq) {
                persistWriteDone(removed.number)
                refresh(touching: removed.changes.map(\.path))
                finishTransaction(id, error: WriteError(code: "overriddenBySet", message: "The transaction was overridden by a subsequent set"), committed: false)
            } else {
                transactions[id]?.overridden = true
            }
        }
        _ = appendWrite(write)
        persistWrite(write)
        // In order: behind any earlier write still waiting (the window, a credential).
        sendWaitingWrites()
        refresh(touching: write.changes.map(\.path))
    }

    /// Reads a write's value as the local view shows it: server values resolved with the
    /// estimated server time and the view's current data.
    private func localValue(_ json: [UInt8], at path: Path) throws(TreeError) -> Tree {
        let context = ServerValueContext(timestamp: clockMillis + serverTimeOffset, existing: Tree.empty.setting(view(at: path), at: path))
        return try TreeReader.read(json, at: path, serverValues: context)
    }

    private mutating func takeWriteNumber() -> UInt64 {
        defer { nextWriteNumber += 1 }
        return nextWriteNumber
    }

    /// Every number below this was answered (the lowest unanswered write's, or the next one's).
    /// `writes` is in number order (each new write, transactions' reruns included, is appended
    /// with the next number; restored ones come back in their order), so that is the first.
    private var acknowledgedBelow: UInt64 { writes.first?.number ?? nextWriteNumber }

    /// Sends write `seq` unless it was sent on this connection; false when it must wait for
    /// the window (and so must every later one).
    @discardableResult
    private mutating func sendWrite(_ seq: UInt64) -> Bool {
        guard sendsNow, let write = writes[seq], write.sentAs == nil else { return true }
        // A write restored from the cache that was made signed in waits for a credential, and
        // the writes after it wait behind it (a connection's writes apply in order).
        if write.waitsForCredential {
            guard authToken != nil else { return false }
            writes[seq]?.waitsForCredential = false
        }
        var client: (number: UInt64, acknowledgedBelow: UInt64)?
        if numbered {
            let lowest = acknowledgedBelow
            // Past the server's window: it waits until earlier writes are answered.
            guard write.number < lowest + Self.writeWindow else { return false }
            client = (write.number, lowest)
        }
        let number = send(write.request, as: .write(write.id), clientWrite: client)
        writes[seq]?.sentAs = number
        return true
    }

    /// Sends, in order, the writes not sent on this connection, up to the window. (It resumes
    /// where the last pass stopped and stops at the window: with many writes queued, each answer
    /// costs what it sends, not a scan of the whole queue.)
    private mutating func sendWaitingWrites() {
        guard sendsNow else { return }
        var seq = max(unsentFrom, writes.startSeq)
        let end = writes.endSeq
        while seq < end {
            if let write = writes[seq], write.sentAs == nil, !sendWrite(seq) { break }
            seq += 1
        }
        unsentFrom = seq
    }

    // MARK: - Transactions

    /// `runTransactionBlock`: runs `update` on the current data at `path` now, writes its result
    /// as a compare-and-set, and runs it again on newer data each time the server finds it stale
    /// (at most `maxTransactionRetries` times). With `applyLocally`, its tentative value raises
    /// local events.
    public mutating func transaction(_ id: WriteID, path: Path, applyLocally: Bool, update: @escaping TransactionUpdate) {
        transactions[id] = Transaction(path: path, update: update, applyLocally: applyLocally)
        // Its location is listened to, so the server's newer data arrives before a `datastale`.
        acquire(ListenKey(path: path, query: "default"), params: .default)
        runTransaction(id)
    }

    private mutating func runTransaction(_ id: WriteID) {
        guard let t = transactions[id] else { return }
        let current = view(at: t.path)
        // Every outcome refreshes the location first: a rerun's previous attempt was removed.
        switch t.update(current) {
        case .abort:
            refresh(touching: [t.path])
            finishTransaction(id, error: nil, committed: false)
        case .invalid(let reason):
            refresh(touching: [t.path])
            finishTransaction(id, error: WriteError(code: "invalid_data", message: reason), committed: false)
        case .commit(let json):
            let value: Tree
            do {
                value = try localValue(json, at: t.path)
            } catch {
                refresh(touching: [t.path])
                finishTransaction(id, error: WriteError(code: "invalid_data", message: error.description), committed: false)
                return
            }
            let write = PendingWrite(
                id: id, number: takeWriteNumber(), request: .put(path: t.path, data: json, hash: current.hashString), changes: [.set(t.path, value)],
                visible: t.applyLocally, isTransaction: true, sentAs: nil, signedIn: authToken != nil)
            _ = appendWrite(write)
            persistWrite(write)
            sendWaitingWrites()
            refresh(touching: [t.path])
        }
    }

    private mutating func finishTransaction(_ id: WriteID, error: WriteError?, committed: Bool, snapshot: Tree? = nil) {
        guard let t = transactions.removeValue(forKey: id) else { return }
        let data = snapshot ?? view(at: t.path)
        emit(.transactionCompleted(id, TransactionOutcome(error: error, committed: committed, snapshot: data)))
        release(ListenKey(path: t.path, query: "default"))
    }

    // MARK: - onDisconnect

    /// `onDisconnectSetValue` (nil JSON `null` removes).
    public mutating func onDisconnectSet(_ id: WriteID, path: Path, json: [UInt8]) throws(TreeError) {
        let value = try JSONValue(parsing: json)
        _ = try TreeReader.read(json, at: path, serverValues: ServerValueContext(timestamp: clockMillis))
        requestOnDisconnect(id, .set(path, value))
    }

    /// `onDisconnectUpdateChildValues`.
    public mutating func onDisconnectUpdate(_ id: WriteID, path: Path, children: [(Path, [UInt8])]) throws(TreeError) {
        var list: [(Path, JSONValue)] = []
        for (relative, json) in children {
            _ = try TreeReader.read(json, at: path.appending(relative), serverValues: ServerValueContext(timestamp: clockMillis))
            list.append((relative, try JSONValue(parsing: json)))
        }
        requestOnDisconnect(id, .update(path, list))
    }

    /// `cancelDisconnectOperations`.
    public mutating func onDisconnectCancel(_ id: WriteID, path: Path) {
        requestOnDisconnect(id, .cancel(path))
    }

    private mutating func requestOnDisconnect(_ id: WriteID, _ op: OnDisconnectOp) {
        if sendsNow { sendOnDisconnect(id, op) } else { queuedOnDisconnect.append((id, op)) }
    }

    private mutating func sendOnDisconnect(_ id: WriteID, _ op: OnDisconnectOp) {
        let request: ClientRequest
        switch op {
        case let .set(path, value):
            var json: [UInt8] = []
            value.appendJSON(to: &json)
            request = .onDisconnectPut(path: path, data: json)
        case let .update(path, list):
            request = .onDisconnectMerge(
                path: path,
                children: list.map { item in
                    var json: [UInt8] = []
                    item.1.appendJSON(to: &json)
                    return (item.0, json)
                })
        case .cancel(let path):
            request = .onDisconnectCancel(path: path)
        }
        send(request, as: .onDisconnect(id, op))
    }

    /// The connection ended: the server runs the onDisconnect writes it accepted; the local view
    /// shows them at once (server values resolved with the estimated server time).
    private mutating func runLocalOnDisconnect() {
        let entries = onDisconnectLocal.entries
        onDisconnectLocal = OnDisconnectTree()
        guard !entries.isEmpty else { return }
        var changes: [(Path, Tree)] = []
        for (segments, value) in entries {
            let path = Path(segments: segments.map { ChildKey(unchecked: $0) })
            var json: [UInt8] = []
            value.appendJSON(to: &json)
            let context = ServerValueContext(timestamp: clockMillis + serverTimeOffset, existing: Tree.empty.setting(server.child(at: path), at: path))
            guard let tree = try? TreeReader.read(json, at: path, serverValues: context) else { continue }
            changes.append((path, tree))
        }
        for (path, tree) in changes { server.set(tree, at: path) }
        for (path, _) in changes { recomputeLocal(at: path) }
        refresh(touching: changes.map(\.0))
    }

    // MARK: - Observing

    /// Starts an observer of `type` events on the view of `path` and `params`. It receives the
    /// view's current events at once (child_added for each child shown, then value when the data
    /// is known), then each change.
    public mutating func observe(_ id: ObserverID, path: Path, params: QueryParams = .default, type: EventType) {
        let key = ViewKey(path: path, query: params.identifier)
        if views[key] == nil { views[key] = makeView(path: path, params: params) }
        guard var view = views[key] else { return }
        view.observers[id] = type
        observerViews[id] = key
        let complete = eventCache(key, view).complete
        if complete { view.valueRaised = true }
        views[key] = view
        for event in view.shown.initialEvents() where EventType(event.kind) == type {
            if event.kind == .value && !complete { continue }
            emit(.event(id, event))
        }
    }

    private mutating func makeView(path: Path, params: QueryParams) -> View {
        var listen: ListenKey?
        if path.first?.string != ".info" {
            let key = ListenKey(path: path, query: params.loadsAllData ? "default" : params.identifier)
            acquire(key, params: params.loadsAllData ? .default : params)
            listen = key
        }
        let provisional = View(params: params, listen: listen, shown: QueryView(params: params, tree: .empty))
        let tree = eventCache(ViewKey(path: path, query: params.identifier), provisional).tree
        return View(params: params, listen: listen, shown: QueryView(params: params, tree: tree))
    }

    public mutating func removeObserver(_ id: ObserverID) {
        guard let key = observerViews.removeValue(forKey: id), var view = views[key] else { return }
        view.observers[id] = nil
        if view.observers.isEmpty {
            views[key] = nil
            if let listen = view.listen { release(listen) }
        } else {
            views[key] = view
        }
    }

    /// `keepSynced`: keeps the location's data listened to (and so current) with no observer.
    public mutating func keepSynced(_ path: Path, _ on: Bool) {
        guard path.first?.string != ".info" else { return }
        let key = ListenKey(path: path, query: "default")
        if on, keptSynced.insert(path).inserted {
            acquire(key, params: .default)
        } else if !on, keptSynced.remove(path) != nil {
            release(key)
        }
    }

    /// `getData`: the server's data now for `path` and `params` (from a complete view when
    /// offline).
    public mutating func get(_ id: UInt64, path: Path, params: QueryParams = .default) {
        if path.first?.string == ".info" {
            emit(.got(id, .success(infoTree.child(at: path.droppingFirst))))
            return
        }
        if !isOnline {
            let key = ViewKey(path: path, query: params.identifier)
            let probe = views[key] ?? View(params: params, listen: ListenKey(path: path, query: params.loadsAllData ? "default" : params.identifier), shown: QueryView(params: params, tree: .empty))
            let cache = eventCache(key, probe)
            if cache.complete {
                emit(.got(id, .success(QueryView(params: params, tree: cache.tree).viewTree)))
                return
            }
        }
        gets[id] = (path, params)
        sendGet(id)
    }

    private mutating func sendGet(_ id: UInt64) {
        guard isOnline, let (path, params) = gets[id] else { return }
        send(.get(path: path, query: params.wireObject), as: .get(id))
    }

    // MARK: - Listens

    private mutating func acquire(_ key: ListenKey, params: QueryParams) {
        if var listen = listens[key] {
            listen.users += 1
            listens[key] = listen
            return
        }
        var listen = Listen(params: params, users: 1)
        if !key.isPlain {
            listen.tag = nextTag
            tags[nextTag] = key
            nextTag += 1
            // A window the disk cache held: shown at once (possibly stale until the server
            // answers, as a cached location is), and its hash sent with the listen, so an
            // unchanged window costs the server an `ok` alone and raises no event twice.
            if let cached = cachedQueries.removeValue(forKey: key) {
                listen.cache = cached
                listen.complete = true
            }
        }
        listens[key] = listen
        if !key.isPlain { recomputeOverlaid(key, at: key.path) }
        sendListen(key)
    }

    private mutating func release(_ key: ListenKey) {
        guard var listen = listens[key] else { return }
        listen.users -= 1
        if listen.users > 0 {
            listens[key] = listen
            return
        }
        listens[key] = nil
        if let tag = listen.tag { tags[tag] = nil }
        // With persistence a filtered query's window stays cached (in the file it already is).
        if persistence, !key.isPlain, listen.complete { cachedQueries[key] = listen.cache }
        if isOnline { send(.unlisten(path: key.path, query: listen.tag == nil ? nil : listen.params.wireObject, tag: listen.tag), as: .ignored) }
        if key.isPlain { endPlainCoverage(key.path) }
    }

    /// A plain listen at `path` ended: its data is pruned, and the views under it that read the
    /// plain data until now (a filtered query's view reads it while a complete plain listen
    /// covers it) are compared in full with what they read now (their own window), so none keeps
    /// showing data only the plain listen kept current.
    private mutating func endPlainCoverage(_ path: Path) {
        prune(path)
        refresh(touching: [path], whole: true)
    }

    /// Forgets the server's data at `path` that no remaining complete plain listen keeps current.
    private mutating func prune(_ path: Path) {
        // With persistence the data stays: it is the cache.
        if persistence || isPlainComplete(path) { return }
        var keep: [(Path, Tree)] = []
        for (key, listen) in listens where key.isPlain && path.contains(key.path) && listen.complete {
            keep.append((key.path, server.child(at: key.path)))
        }
        server.set(.empty, at: path)
        for (p, tree) in keep { server.set(tree, at: p) }
        recomputeLocal(at: path)
    }

    private mutating func sendListen(_ key: ListenKey) {
        guard isOnline, let listen = listens[key] else { return }
        let tagged = listen.tag != nil
        // The hash of what this client holds of the server's data for the listen (a tagged
        // listen: its window of that data): when the server's data hashes the same it sends the
        // ok alone, and the listen completes from this data (no data resent, no event raised twice).
        let held = tagged ? QueryView(params: listen.params, tree: listen.cache).viewTree : server.child(at: key.path)
        let number = send(
            .listen(path: key.path, query: tagged ? listen.params.wireObject : nil, tag: listen.tag, hash: held.hashString), as: .listen(key))
        listens[key]?.sentAs = number
    }

    /// A listen was refused or revoked: its views' observers are cancelled.
    private mutating func failListen(_ key: ListenKey, _ error: WriteError) {
        guard let listen = listens.removeValue(forKey: key) else { return }
        if let tag = listen.tag { tags[tag] = nil }
        if persistence, !key.isPlain, error.code == "permission_denied" {
            // Refused or revoked by the rules: its window is no longer shown offline either
            // (a transient failure, such as `unavailable`, keeps it).
            cachedQueries[key] = nil
            emit(.persist([Self.forgetQueryRecord(key)], durable: false))
        }
        for viewKey in views.keys.sorted() where views[viewKey]?.listen == key {
            guard let view = views.removeValue(forKey: viewKey) else { continue }
            for id in view.observers.keys.sorted() {
                observerViews[id] = nil
                emit(.cancelled(id, error))
            }
        }
        if key.isPlain {
            keptSynced.remove(key.path)
            for id in transactions.keys.sorted() where transactions[id]?.path == key.path {
                // Its listen is gone; the transaction ends with the listen's error.
                if let seq = writes.seq(of: id), writes[seq]?.sentAs == nil, let removed = removeWrite(seq) {
                    persistWriteDone(removed.number)
                    refresh(touching: removed.changes.map(\.path))
                }
                if let t = transactions.removeValue(forKey: id) {
                    emit(.transactionCompleted(id, TransactionOutcome(error: error, committed: false, snapshot: view(at: t.path))))
                }
            }
            endPlainCoverage(key.path)
        }
    }

    @discardableResult
    private mutating func send(_ request: ClientRequest, as what: Outstanding, clientWrite: (number: UInt64, acknowledgedBelow: UInt64)? = nil) -> Int64 {
        let number = nextRequest
        nextRequest += 1
        outstanding[number] = what
        emit(.send(request.body(number: number, clientWrite: clientWrite)))
        return number
    }

    // MARK: - Answers and data

    private mutating func answered(_ what: Outstanding, status: String, data: [UInt8]) {
        let error = status == "ok" ? nil : WriteError(code: status, message: Self.text(data))
        switch what {
        case .write(let id):
            guard let seq = writes.seq(of: id), let write = removeWrite(seq) else { return }
            persistWriteDone(write.number)
            if write.isTransaction, transactions[id] == nil {
                // Restored from the disk: its function is gone; the write simply ends.
                refresh(touching: write.changes.map(\.path))
            } else if write.isTransaction {
                transactionAnswered(id, write: write, error: error)
            } else {
                // A refusal reverts the write; an ok normally changes nothing (the server's echo
                // came first), but the server's own values (timestamps) or an answer out of order
                // may differ from what the view showed, as in Firebase's ack.
                refresh(touching: write.changes.map(\.path))
                emit(.completed(id, error))
            }
            sendWaitingWrites()
        case .listen(let key):
            guard var listen = listens[key] else { return }
            if let error {
                failListen(key, error)
                return
            }
            let wasComplete = listen.complete
            listen.complete = true
            listens[key] = listen
            if !wasComplete {
                persistComplete(key)
                refresh(touching: [key.path], whole: true)
            }
        case .get(let id):
            guard let (path, params) = gets.removeValue(forKey: id) else { return }
            if error == nil, let tree = try? TreeReader.read(data, at: path, limits: .snapshot) {
                emit(.got(id, .success(params.isDefault ? tree : QueryView(params: params, tree: tree).viewTree)))
            } else {
                emit(.got(id, .failure(error ?? WriteError(code: "invalid_data", message: "The server's answer could not be read"))))
            }
        case let .onDisconnect(id, op):
            if error == nil {
                switch op {
                case let .set(path, value): onDisconnectLocal.set(path.segments.map(\.string), value)
                case let .update(path, list): onDisconnectLocal.update(path.segments.map(\.string), list.map { ($0.0.segments.map(\.string), $0.1) })
                case .cancel(let path): onDisconnectLocal.cancel(path.segments.map(\.string))
                }
            }
            emit(.completed(id, error))
        case .auth:
            if let error {
                authToken = nil
                emit(.authRevoked(error))
            }
        case .ignored:
            break
        }
    }

    private mutating func transactionAnswered(_ id: WriteID, write: PendingWrite, error: WriteError?) {
        guard let t = transactions[id] else { return }
        if error == nil {
            // The server's echo came before the answer: the view holds the committed data (the
            // value sent stands in when the location's data is not complete).
            var committed = view(at: t.path)
            if !isPlainComplete(t.path), case .set(_, let sent)? = write.changes.first { committed = sent }
            refresh(touching: [t.path])
            finishTransaction(id, error: nil, committed: true, snapshot: committed)
            return
        }
        let stale = error?.code == "datastale"
        let retries = t.retries + 1
        if stale, !t.overridden, retries < Self.maxTransactionRetries {
            // Runs again on the data the server sent before its answer; one refresh shows the
            // step from the old tentative value to the new one.
            transactions[id]?.retries = retries
            runTransaction(id)
            return
        }
        refresh(touching: write.changes.map(\.path))
        if !stale {
            finishTransaction(id, error: error, committed: false)
        } else if t.overridden {
            finishTransaction(id, error: WriteError(code: "overriddenBySet", message: "The transaction was overridden by a subsequent set"), committed: false)
        } else {
            finishTransaction(id, error: WriteError(code: "maxretries", message: "The transaction had too many retries"), committed: false)
        }
    }

    private static func text(_ json: [UInt8]) -> String {
        if case .string(let s)? = try? JSONValue(parsing: json) { return s }
        return String(decoding: json, as: UTF8.self)
    }

    /// Server data: `changes` are (absolute path, value) pairs below `path`; `whole` when `path`
    /// itself was replaced (a `d` push).
    private mutating func serverData(at path: Path, changes: [(Path, Tree)], tag: Int?, whole: Bool) {
        if let tag {
            guard let key = tags[tag], var listen = listens[key] else { return }
            // Where the listen's data changed: a window the server sends whole again (after each
            // change that moves it) changed only at the children that differ, so only those are
            // recomputed and compared (O(the window), not O(the pending writes under it)).
            var touched: [Path] = []
            for (at, value) in changes {
                if let below = key.path.relative(at) {
                    if below.count == 0, listen.cache.hasChildren, value.hasChildren, listen.cache.priority == value.priority {
                        touched += QueryView.diffKeys(listen.cache, value).map { key.path.appending(Path(segments: [$0])) }
                        listen.cache = value
                    } else {
                        listen.cache.set(value, at: below)
                        touched.append(at)
                    }
                } else if let above = at.relative(key.path) {
                    listen.cache = value.child(at: above)
                    touched.append(key.path)
                }
            }
            let completed = whole && path.contains(key.path) && !listen.complete
            if completed {
                listen.complete = true
                touched.append(key.path)
            }
            listens[key] = listen
            if persistence, listen.complete {
                // The disk cache follows the window: whole when it just completed, else the
                // children that changed.
                let parts = completed ? [Path.root] : touched.compactMap { key.path.relative($0) }
                if !parts.isEmpty {
                    emit(.persist(parts.map { Self.queryRecord(key, at: $0, listen.cache.child(at: $0)) }, durable: false))
                }
            }
            for at in touched { recomputeOverlaid(key, at: at) }
            refresh(touching: touched)
            return
        }
        for (at, value) in changes { server.set(value, at: at) }
        for (at, _) in changes { recomputeLocal(at: at) }
        if persistence {
            let kept = changes.filter { isPlainCompleteLive($0.0) }
            if !kept.isEmpty { emit(.persist(kept.map { .server($0.0, JSONWriter.bytes($0.1, format: .export)) }, durable: false)) }
        }
        if whole {
            // The whole location arrived: every plain listen at or below it is complete.
            var completed: [Path] = []
            for (key, listen) in listens where key.isPlain && path.contains(key.path) && !listen.complete {
                listens[key]?.complete = true
                completed.append(key.path)
                persistComplete(key)
            }
            if !completed.isEmpty {
                refresh(touching: completed, whole: true)
                return
            }
        }
        refresh(touching: changes.map(\.0))
    }

    // MARK: - Views

    /// The server's data at `path` is complete here: a plain listen covering it was answered, or
    /// the disk cache held it complete (possibly stale until the server answers).
    private func isPlainComplete(_ path: Path) -> Bool {
        isPlainCompleteLive(path) || (!cachedComplete.isEmpty && cachedComplete.contains { $0.contains(path) })
    }

    /// A plain listen covering `path` was answered on this connection's watch.
    private func isPlainCompleteLive(_ path: Path) -> Bool {
        listens.contains { $0.key.isPlain && $0.value.complete && $0.key.path.contains(path) }
    }

    /// A plain listen completed: with persistence its location's data goes to the disk cache,
    /// marked complete.
    private mutating func persistComplete(_ key: ListenKey) {
        guard persistence else { return }
        guard key.isPlain else {
            // A filtered query's window, whole (later pushes record what they change).
            if let listen = listens[key] { emit(.persist([Self.queryRecord(key, at: .root, listen.cache)], durable: false)) }
            return
        }
        cachedComplete.insert(key.path)
        emit(.persist([.server(key.path, JSONWriter.bytes(server.child(at: key.path), format: .export)), .complete(key.path, true)], durable: false))
    }

    /// A filtered query's window (or the part of it at `at`, relative to its location) as a
    /// disk-cache record.
    private static func queryRecord(_ key: ListenKey, at: Path, _ tree: Tree) -> ClientStore.Record {
        .query(path: key.path, query: key.query, at: at, json: JSONWriter.bytes(tree, format: .export))
    }

    /// The record that forgets a query's cached window (no JSON).
    private static func forgetQueryRecord(_ key: ListenKey) -> ClientStore.Record {
        .query(path: key.path, query: key.query, at: .root, json: [])
    }

    /// What a view shows, before its query: the server's data at its location (the plain
    /// listens' when complete there, else its tagged listen's) with the pending writes applied,
    /// and whether it is known.
    private func eventCache(_ key: ViewKey, _ view: View) -> (tree: Tree, complete: Bool) {
        if key.path.first?.string == ".info" { return (infoTree.child(at: key.path.droppingFirst), true) }
        if isPlainComplete(key.path) { return (local.child(at: key.path), true) }
        if let listenKey = view.listen, !listenKey.isPlain, let listen = listens[listenKey] {
            return (listen.overlaid, listen.complete || coveredByWrite(key.path))
        }
        if let listenKey = view.listen, let cached = cachedQueries[listenKey] {
            // No listen yet (an offline `getData`): the window the disk cache held.
            return (overlay(cached, at: key.path, writeIndex.relevant(to: key.path)), true)
        }
        return (local.child(at: key.path), coveredByWrite(key.path))
    }

    /// The local view at `path`: the server's data with the pending writes applied in order.
    func view(at path: Path) -> Tree {
        local.child(at: path)
    }

    /// `base`, the data at `path`, with the changes of the writes `seqs` (in order) applied.
    private func overlay(_ base: Tree, at path: Path, _ seqs: [UInt64]) -> Tree {
        var tree = base
        for seq in seqs {
            guard let write = writes[seq], write.visible else { continue }
            for change in write.changes { Self.apply(change, to: &tree, at: path) }
        }
        return tree
    }

    /// Whether a pending write sets a location that contains `path`.
    private func coveredByWrite(_ path: Path) -> Bool {
        writeIndex.coversBySet(path)
    }

    // MARK: - The local tree

    /// Queues a write: a visible one is indexed and its changes applied to the local tree (the
    /// last write applies last, so nothing else is replayed).
    private mutating func appendWrite(_ write: PendingWrite) -> UInt64 {
        let seq = writes.append(write)
        guard write.visible else { return seq }
        for change in write.changes {
            writeIndex.insert(seq, change: change)
            switch change {
            case let .set(at, value): local.set(value, at: at)
            case let .priority(at, priority): _ = local.setPriority(priority, at: at)
            }
            for key in taggedListens(overlapping: change.path) {
                // Moved out and back, so the tree is changed in place, not copied.
                guard var listen = listens.removeValue(forKey: key) else { continue }
                Self.apply(change, to: &listen.overlaid, at: key.path)
                listens[key] = listen
            }
        }
        return seq
    }

    /// The tagged listens whose location overlaps `path` (few: one per filtered query observed).
    private func taggedListens(overlapping path: Path) -> [ListenKey] {
        listens.keys.filter { !$0.isPlain && ($0.path.contains(path) || path.contains($0.path)) }
    }

    /// `tree`, the data at `path`, with one change applied (as `overlay` applies each).
    private static func apply(_ change: Change, to tree: inout Tree, at path: Path) {
        switch change {
        case let .set(at, value):
            if let below = path.relative(at) {
                tree.set(value, at: below)
            } else if let above = at.relative(path) {
                tree = value.child(at: above)
            }
        case let .priority(at, priority):
            if let below = path.relative(at) { _ = tree.setPriority(priority, at: below) }
        }
    }

    /// Recomputes a tagged listen's `overlaid` at `path` after its cache or the pending writes
    /// changed there, as `recomputeLocal` does for `local`: the cache at the location with the
    /// writes overlapping it applied in order, from the highest level (at or below the listen's
    /// location) whose own data the writes' order could change; the whole of it when `path` is
    /// the listen's location or above it.
    private mutating func recomputeOverlaid(_ key: ListenKey, at path: Path) {
        guard !key.isPlain, var listen = listens.removeValue(forKey: key) else { return }
        defer { listens[key] = listen }
        let base = key.path.count
        var depth = path.count
        if key.path.relative(path) != nil, path.count > base {
            depth = writeIndex.firstAncestorWithWrites(of: path) ?? path.count
            var cacheNode = listen.cache
            var shownNode = listen.overlaid
            for (level, segment) in path.segments.enumerated() where level >= base && level < depth {
                if Self.hasOwnData(cacheNode) || Self.hasOwnData(shownNode) {
                    depth = level
                    break
                }
                cacheNode = cacheNode.child(segment)
                shownNode = shownNode.child(segment)
            }
        } else {
            depth = base
        }
        if depth <= base {
            listen.overlaid = overlay(listen.cache, at: key.path, writeIndex.relevant(to: key.path))
        } else {
            let target = Path(segments: Array(path.segments.prefix(depth)))
            guard let below = key.path.relative(target) else { return }
            listen.overlaid.set(overlay(listen.cache.child(at: below), at: target, writeIndex.relevant(to: target)), at: below)
        }
    }

    /// Removes a write (answered, refused, overridden or ended): the local tree is recomputed
    /// where it wrote.
    private mutating func removeWrite(_ seq: UInt64) -> PendingWrite? {
        guard let write = writes.remove(seq) else { return nil }
        guard write.visible else { return write }
        for change in write.changes { writeIndex.remove(seq, change: change) }
        for change in write.changes { recomputeLocal(at: change.path) }
        for change in write.changes {
            for key in taggedListens(overlapping: change.path) { recomputeOverlaid(key, at: change.path) }
        }
        return write
    }

    /// Recomputes the local tree at `path` after the server's data or the pending writes changed
    /// there: the server's data at the location with the writes that overlap it applied in
    /// order. That is exact when no ancestor has data of its own that the writes' order could
    /// change (a leaf a write below replaces, a priority a parent's emptying drops, a write of
    /// its own); otherwise the highest such ancestor is recomputed instead. The cost is the
    /// depth plus the writes overlapping the location recomputed, not the whole queue.
    private mutating func recomputeLocal(at path: Path) {
        var depth = writeIndex.firstAncestorWithWrites(of: path) ?? path.count
        var serverNode = server
        var localNode = local
        for (level, key) in path.segments.enumerated() where level < depth {
            if Self.hasOwnData(serverNode) || Self.hasOwnData(localNode) {
                depth = level
                break
            }
            serverNode = serverNode.child(key)
            localNode = localNode.child(key)
        }
        let target = depth >= path.count ? path : Path(segments: Array(path.segments.prefix(depth)))
        local.set(overlay(server.child(at: target), at: target, writeIndex.relevant(to: target)), at: target)
    }

    /// A leaf or a tree with a priority: data of its own beyond its children.
    private static func hasOwnData(_ subtree: Tree) -> Bool {
        if subtree.isLeaf { return true }
        if case .none = subtree.priority { return false }
        return true
    }

    /// `.info`: `connected` and `serverTimeOffset`.
    private var infoTree: Tree {
        Tree(sortedChildren: [
            (ChildKey(unchecked: "connected"), Tree(.bool(isOnline))),
            (ChildKey(unchecked: "serverTimeOffset"), Tree(.int(serverTimeOffset))),
        ])
    }

    private mutating func refreshInfo() {
        let info = Path(segments: [ChildKey(unchecked: ".info")])
        refresh(touching: [info], whole: true)
    }

    /// Brings every view overlapping `paths` up to date and raises its events. `whole`: the data
    /// a view is built from may have changed anywhere below these paths (a listen completed, the
    /// view's source changed), so its children are compared in full.
    private mutating func refresh(touching paths: [Path], whole: Bool = false) {
        guard !paths.isEmpty else { return }
        for key in views.keys.sorted() {
            guard paths.contains(where: { $0.contains(key.path) || key.path.contains($0) }), var view = views[key] else { continue }
            let (tree, complete) = eventCache(key, view)
            var events = view.shown.apply(tree, changes: whole ? .all : ChildChanges.at(key.path, written: paths))
            if complete {
                if !view.valueRaised, !events.contains(where: { $0.kind == .value }) {
                    events.append(ViewEvent(.value, key: nil, tree: view.shown.viewTree))
                }
                view.valueRaised = true
            } else {
                events.removeAll { $0.kind == .value }
            }
            views[key] = view
            for event in events {
                for (id, type) in view.observers.sorted(by: { $0.key < $1.key }) where type == EventType(event.kind) {
                    emit(.event(id, event))
                }
            }
        }
    }
}
