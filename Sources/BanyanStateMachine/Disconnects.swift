import BanyanBasics
public import BanyanTree

/// The onDisconnect writes one realtime connection queued (v5 `o`, `om`, `oc`): replicated state,
/// so they fire exactly once, through the log, whichever node the connection was on
/// (docs/realtime.md, "onDisconnect").
public struct DisconnectQueue: Sendable, Equatable {
    /// The namespace the connection writes to (one per connection, as in v5's `ns`).
    public var namespace: String
    /// The connection's secret, recorded at its first registration: only a `connectionEnded`
    /// naming it fires the queue.
    public var secret: UInt64
    public var tree: OnDisconnectTree
    /// An upper bound of the queue's size in bytes (paths and JSON), recounted when it passes
    /// the limit.
    var sizeBound: Int
    /// An upper bound of the queue's entries, recounted likewise.
    var entryBound: Int

    public init(namespace: String, secret: UInt64, tree: OnDisconnectTree = OnDisconnectTree()) {
        self.namespace = namespace
        self.secret = secret
        self.tree = tree
        let entries = tree.entries
        sizeBound = entries.reduce(0) { $0 + Self.size($1.path, $1.value) }
        entryBound = entries.count
    }

    public static func == (a: DisconnectQueue, b: DisconnectQueue) -> Bool {
        a.namespace == b.namespace && a.secret == b.secret && a.tree == b.tree
    }

    /// What one entry counts against `StateMachine.maxQueuedBytes`.
    static func size(_ path: [String], _ value: JSONValue) -> Int {
        var json: [UInt8] = []
        value.appendJSON(to: &json)
        return path.reduce(json.count) { $0 + $1.utf8.count + 1 }
    }
}

extension StateMachine {
    /// Bytes (paths and JSON) one connection may have queued (a named limit).
    public static let maxQueuedBytes = 1 << 20
    /// Entries one connection may have queued.
    public static let maxQueuedEntries = 1_000

    /// Applies `o`, `om`, `oc` and `connectionEnded` (the caller recorded the envelope's sequence
    /// number and timestamp).
    mutating func applyConnectionCommand(_ envelope: CommandEnvelope) -> Applied {
        var applied = Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: .ok, written: [])
        do throws(TreeError) {
            switch envelope.command {
            case let .onDisconnectSet(pathText, json, secret):
                let location = try Path(parsing: pathText)
                let value = try validated(json, at: location)
                applied.outcome = try register(envelope, secret: secret, adding: [(location, value)], bytes: json.count + pathText.utf8.count)
            case let .onDisconnectUpdate(pathText, items, secret):
                let location = try Path(parsing: pathText)
                var adding: [(Path, JSONValue)] = []
                var bytes = 0
                for item in items {
                    let target = location.appending(try Path(parsing: item.path))
                    adding.append((target, try validated(item.json, at: target)))
                    // Each entry is stored with its whole path, as `DisconnectQueue.size` counts it.
                    bytes += item.json.count + target.byteCount + 1
                }
                applied.outcome = try register(envelope, secret: secret, adding: adding, bytes: bytes)
            case let .onDisconnectCancel(pathText, secret):
                let location = try Path(parsing: pathText)
                guard var queue = disconnects.removeValue(forKey: envelope.session) else { return applied }
                defer { if !queue.tree.isEmpty { disconnects[envelope.session] = queue } }
                if let refusal = refusal(queue, envelope, secret) {
                    applied.outcome = refusal
                    return applied
                }
                queue.tree.cancel(location.segments.map(\.string))
                // A cancel below a queued value splits it into one entry per child: count exactly
                // again (O(queue), bounded by the byte limit, which a split never raises).
                let entries = queue.tree.entries
                queue.sizeBound = entries.reduce(0) { $0 + DisconnectQueue.size($1.path, $1.value) }
                queue.entryBound = entries.count
            case let .connectionEnded(connection, secret):
                return connectionEnded(connection, secret: secret, envelope)
            case .set, .update, .compareAndSet:
                applied.outcome = .malformed
            }
        } catch {
            applied.outcome = .rejected(error)
        }
        return applied
    }

    /// The JSON as a value to queue, checked now as the tree it will become (limits, server value
    /// syntax), so that what fires was valid when registered.
    private func validated(_ json: [UInt8], at location: Path) throws(TreeError) -> JSONValue {
        _ = try TreeReader.read(json, at: location, serverValues: ServerValueContext(timestamp: lastTimestamp))
        return try JSONValue(parsing: json)
    }

    private func refusal(_ queue: DisconnectQueue, _ envelope: CommandEnvelope, _ secret: UInt64) -> Outcome? {
        if queue.secret != secret { return .refused("the connection's secret does not match its onDisconnect queue") }
        if queue.namespace != envelope.namespace {
            return .refused("connection \(envelope.session) queued onDisconnect writes in namespace '\(queue.namespace)', not '\(envelope.namespace)'")
        }
        return nil
    }

    private mutating func register(_ envelope: CommandEnvelope, secret: UInt64, adding: [(Path, JSONValue)], bytes: Int) throws(TreeError) -> Outcome {
        var queue = disconnects.removeValue(forKey: envelope.session) ?? DisconnectQueue(namespace: envelope.namespace, secret: secret)
        defer { if !queue.tree.isEmpty { disconnects[envelope.session] = queue } }
        if let refusal = refusal(queue, envelope, secret) { return refusal }
        var next = queue.tree
        for (path, value) in adding { next.set(path.segments.map(\.string), value) }
        if queue.sizeBound + bytes > Self.maxQueuedBytes || queue.entryBound + adding.count > Self.maxQueuedEntries {
            // The bounds only grow between recounts (a set over a queued entry adds again):
            // count what the queue would hold, once (O(queue), itself bounded), before refusing.
            let entries = next.entries
            let size = entries.reduce(0) { $0 + DisconnectQueue.size($1.path, $1.value) }
            guard size <= Self.maxQueuedBytes, entries.count <= Self.maxQueuedEntries else {
                throw TreeError(
                    .inputTooLarge, path: adding.first?.0.description ?? "/",
                    "a connection may queue at most \(Self.maxQueuedEntries) onDisconnect writes of at most \(Self.maxQueuedBytes) bytes in all")
            }
            queue.sizeBound = size
            queue.entryBound = entries.count
        } else {
            queue.sizeBound += bytes
            queue.entryBound += adding.count
        }
        queue.tree = next
        return .ok
    }

    /// Ends `connection`: its queue fires as one multi-path update at the namespace's root, with
    /// server values resolved now; the connection is recorded as ended. A second one does
    /// nothing. A queued write that no longer applies (say, a limit reached since) is dropped
    /// with the rest of the queue, and the outcome says why.
    private mutating func connectionEnded(_ connection: UInt64, secret: UInt64, _ envelope: CommandEnvelope) -> Applied {
        var applied = Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: .ok, written: [])
        if let queue = disconnects[connection], queue.secret != secret {
            applied.outcome = .refused("the secret does not match connection \(connection)'s")
            return applied
        }
        var record = sessions.removeValue(forKey: connection) ?? SessionRecord()
        let already = record.ended
        record.ended = true
        sessions[connection] = record
        guard !already, let queue = disconnects.removeValue(forKey: connection) else { return applied }
        applied.namespace = queue.namespace
        var tree = namespaces.removeValue(forKey: queue.namespace) ?? .empty
        defer { if !tree.isEmpty { namespaces[queue.namespace] = tree } }
        do throws(TreeError) {
            var entries: [UpdateEntry] = []
            let context = ServerValueContext(timestamp: lastTimestamp, existing: tree)
            for (segments, value) in queue.tree.entries {
                let path = Path(segments: segments.map { ChildKey(unchecked: $0) })
                var json: [UInt8] = []
                value.appendJSON(to: &json)
                entries.append(UpdateEntry(path: WritePath(path: path), value: try TreeReader.read(json, at: path, serverValues: context)))
            }
            var next = tree
            try next.apply(update: entries, at: Path.root)
            tree = next
            applied.written = entries.map(\.path.path)
        } catch {
            applied.outcome = .rejected(error)
        }
        return applied
    }
}
