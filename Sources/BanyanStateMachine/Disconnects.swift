import BanyanBasics
import BanyanRules
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
    /// The lease under which the connection's node holds it (0: none): when the leader expires
    /// it, the queue fires (docs/realtime.md, "Node leases").
    public var holder: UInt64
    public var tree: OnDisconnectTree
    /// An upper bound of the queue's size in bytes (paths and JSON), recounted when it passes
    /// the limit.
    var sizeBound: Int
    /// An upper bound of the queue's entries, recounted likewise.
    var entryBound: Int

    public init(namespace: String, secret: UInt64, holder: UInt64 = 0, tree: OnDisconnectTree = OnDisconnectTree()) {
        self.namespace = namespace
        self.secret = secret
        self.holder = holder
        self.tree = tree
        let entries = tree.entries
        sizeBound = entries.reduce(0) { $0 + Self.size($1.path, $1.value) }
        entryBound = entries.count
    }

    public static func == (a: DisconnectQueue, b: DisconnectQueue) -> Bool {
        a.namespace == b.namespace && a.secret == b.secret && a.holder == b.holder && a.tree == b.tree
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
    /// onDisconnect writes are judged by the rules when they are registered, as if written at
    /// once (Firebase checks them then, not when they fire): a client may queue only what it
    /// may write. Nil when allowed or not judged.
    mutating func judgeRegistration(_ envelope: CommandEnvelope, _ items: [(WritePath, [UInt8])], at location: Path, update: Bool) throws(TreeError) -> Outcome? {
        let judge = judgement(for: envelope)
        guard judge != nil else { return nil }
        let current = tree(envelope.namespace)
        let context = ServerValueContext(timestamp: lastTimestamp, existing: current)
        if update {
            var entries: [UpdateEntry] = []
            for (path, json) in items {
                entries.append(UpdateEntry(path: path, value: try TreeReader.read(json, at: location.appending(path.path), serverValues: context)))
            }
            return Self.verdict(judge) { $0.decideUpdate(entries, at: location, context: $1, tree: current) }
        }
        guard let (path, json) = items.first else { return nil }
        let subtree = try TreeReader.read(json, at: path.path, serverValues: context)
        return Self.verdict(judge) { $0.decideSet(subtree, at: path, context: $1, tree: current) }
    }

    mutating func applyConnectionCommand(_ envelope: CommandEnvelope) -> Applied {
        var applied = Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: .ok, written: [])
        do throws(TreeError) {
            switch envelope.command {
            case let .onDisconnectSet(pathText, json, secret, holder):
                let location = try Path(parsing: pathText)
                let value = try validated(json, at: location)
                if let denied = try judgeRegistration(envelope, [(WritePath(path: location), json)], at: location, update: false) {
                    applied.outcome = denied
                    return applied
                }
                applied.outcome = try register(
                    envelope, secret: secret, holder: holder, adding: [(location, value)], bytes: json.count + pathText.utf8.count)
            case let .onDisconnectUpdate(pathText, items, secret, holder):
                let location = try Path(parsing: pathText)
                var adding: [(Path, JSONValue)] = []
                var bytes = 0
                for item in items {
                    let target = location.appending(try Path(parsing: item.path))
                    adding.append((target, try validated(item.json, at: target)))
                    // Each entry is stored with its whole path, as `DisconnectQueue.size` counts it.
                    bytes += item.json.count + target.byteCount + 1
                }
                let relative = try items.map { (item) throws(TreeError) in (try WritePath(parsing: item.path), item.json) }
                if let denied = try judgeRegistration(envelope, relative, at: location, update: true) {
                    applied.outcome = denied
                    return applied
                }
                applied.outcome = try register(envelope, secret: secret, holder: holder, adding: adding, bytes: bytes)
            case let .onDisconnectCancel(pathText, secret):
                let location = try Path(parsing: pathText)
                guard var queue = takeQueue(envelope.session) else { return applied }
                defer { putQueue(envelope.session, queue) }
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
            case let .renewLease(holder, node):
                if expiredHolders.contains(holder) {
                    applied.outcome = .refused("lease holder \(holder) has expired: its connections ended")
                } else {
                    leases[holder] = Lease(node: node, renewedIndex: appliedIndex)
                }
            case let .expireHolder(holder, lastRenewal):
                return expire(holder, lastRenewal: lastRenewal, envelope)
            case .set, .update, .compareAndSet, .setRules, .account, .spaceAlarm, .expireIdle:
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

    private mutating func register(
        _ envelope: CommandEnvelope, secret: UInt64, holder: UInt64, adding: [(Path, JSONValue)], bytes: Int
    ) throws(TreeError) -> Outcome {
        if holder != 0, expiredHolders.contains(holder) {
            return .refused("the lease of the connection's node (holder \(holder)) has expired")
        }
        if let quota = quotas[envelope.namespace], let used = quotaUsage[envelope.namespace], used >= quota,
            adding.contains(where: { !$0.1.isEmptyData })
        {
            // A namespace at its quota takes no more queued data (it could not fire); removals
            // may still be queued.
            return .overQuota(namespace: envelope.namespace, used: -1, wouldHold: -1, quota: quota)
        }
        var queue = takeQueue(envelope.session) ?? DisconnectQueue(namespace: envelope.namespace, secret: secret, holder: holder)
        defer { putQueue(envelope.session, queue) }
        if let refusal = refusal(queue, envelope, secret) { return refusal }
        if queue.holder != holder { return .refused("connection \(envelope.session) registered under another lease holder") }
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
        markEnded(connection, &record)
        sessions[connection] = record
        if !already { applied.ended = [connection] }
        guard !already, let queue = takeQueue(connection) else { return applied }
        applied.namespace = queue.namespace
        do throws(TreeError) {
            let fired = try fire(queue)
            applied.written = fired.written
            applied.released.trees = Self.released(fired.replaced)
        } catch {
            applied.outcome = .rejected(error)
        }
        return applied
    }

    /// Runs a queue as one atomic multi-path update at its namespace's root, server values
    /// resolved now; returns the paths written (nothing is written when it fails) and the
    /// subtrees with children it replaced there, to be freed where the caller decides
    /// (`StateMachine.released(_:)`).
    private mutating func fire(_ queue: DisconnectQueue) throws(TreeError) -> (written: [Path], replaced: [Tree]) {
        var tree = namespaces.removeValue(forKey: queue.namespace) ?? .empty
        defer { if !tree.isEmpty { namespaces[queue.namespace] = tree } }
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
        let paths = entries.map(\.path.path)
        // Judged as a write: a queue that would take the namespace over its quota no longer
        // applies and is dropped (else a client could queue, disconnect, and repeat past it).
        switch quotaCheck(queue.namespace, before: tree, after: next, touching: paths) {
        case .unlimited:
            break
        case .within(let usage):
            quotaUsage[queue.namespace] = usage
        case .over(_, _, let quota):
            throw TreeError(.inputTooLarge, path: "/", "QUOTA: these onDisconnect writes would take namespace \(queue.namespace) over its quota of \(quota) bytes")
        }
        let replaced = paths.compactMap { path -> Tree? in
            let old = tree.child(at: path)
            return old.hasChildren ? old : nil
        }
        tree = next
        return (paths, replaced)
    }

    /// The leader saw lease `holder` lapse: every connection queued under it in the envelope's
    /// namespace ends, its queue fired (each queue atomically, in connection order; a queue that
    /// no longer applies is dropped, as `connectionEnded` drops it), and the holder is over for
    /// good (no renewal or registration under it applies again). Refused when the holder renewed
    /// after the renewal the leader counted from.
    private mutating func expire(_ holder: UInt64, lastRenewal: UInt64, _ envelope: CommandEnvelope) -> Applied {
        var applied = Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: .ok, written: [])
        guard holder != 0 else {
            applied.outcome = .refused("holder 0 is no lease")
            return applied
        }
        if !expiredHolders.contains(holder) {
            guard (leases[holder]?.renewedIndex ?? 0) == lastRenewal else {
                applied.outcome = .refused("lease holder \(holder) renewed after index \(lastRenewal)")
                return applied
            }
            expiredHolders.insert(holder)
            leases[holder] = nil
        }
        guard queuedHolders[holder]?[envelope.namespace] != nil else { return applied }
        let connections = disconnects.filter { $0.value.holder == holder && $0.value.namespace == envelope.namespace }.keys.sorted()
        var replaced: [Tree] = []
        for connection in connections {
            guard let queue = takeQueue(connection) else { continue }
            var record = sessions.removeValue(forKey: connection) ?? SessionRecord()
            markEnded(connection, &record)
            sessions[connection] = record
            applied.ended.append(connection)
            do throws(TreeError) {
                let fired = try fire(queue)
                applied.written += fired.written
                replaced += fired.replaced
            } catch {
                // This queue no longer applies (say, a limit reached since): dropped, the rest run.
            }
        }
        applied.released.trees = Self.released(replaced)
        return applied
    }

    /// Removes a connection's queue (keeping `queuedHolders` in step).
    mutating func takeQueue(_ connection: UInt64) -> DisconnectQueue? {
        guard let queue = disconnects.removeValue(forKey: connection) else { return nil }
        if var byNamespace = queuedHolders.removeValue(forKey: queue.holder) {
            let left = (byNamespace[queue.namespace] ?? 1) - 1
            byNamespace[queue.namespace] = left > 0 ? left : nil
            if !byNamespace.isEmpty { queuedHolders[queue.holder] = byNamespace }
        }
        return queue
    }

    /// Stores a connection's queue unless it is empty (keeping `queuedHolders` in step).
    mutating func putQueue(_ connection: UInt64, _ queue: DisconnectQueue) {
        guard !queue.tree.isEmpty else { return }
        if let old = takeQueue(connection) { _ = old }
        disconnects[connection] = queue
        queuedHolders[queue.holder, default: [:]][queue.namespace, default: 0] += 1
    }

    /// Holder → namespace → number of queues, derived from `disconnects`.
    static func countHolders(_ disconnects: [UInt64: DisconnectQueue]) -> [UInt64: [String: Int]] {
        var out: [UInt64: [String: Int]] = [:]
        for queue in disconnects.values { out[queue.holder, default: [:]][queue.namespace, default: 0] += 1 }
        return out
    }
}
