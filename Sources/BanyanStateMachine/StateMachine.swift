import BanyanBasics
public import BanyanRules
public import BanyanTree

/// What the state machine remembers of one client session, to apply each of its commands once.
///
/// Sequence numbers at or below `contiguous` were all applied; `above` holds those applied beyond
/// it (a session may have several writes in flight, and a retried proposal can be ordered after a
/// later one). A command is a duplicate exactly when its number is at or below `contiguous` or in
/// `above`.
public struct SessionRecord: Sendable, Equatable {
    public private(set) var contiguous: UInt64
    /// Sorted, all greater than `contiguous + 1`.
    public private(set) var above: [UInt64]
    /// The session is a realtime connection that ended (`Command.connectionEnded` applied): its
    /// onDisconnect writes ran, and nothing it sends afterwards applies.
    public internal(set) var ended: Bool
    /// When it ended (the leader's time of the entry that ended it): its record goes once the
    /// ended retention has passed (docs/internals/state-machine.md, "Expiry").
    public internal(set) var endedAt: Int64?

    public init(contiguous: UInt64 = 0, above: [UInt64] = [], ended: Bool = false, endedAt: Int64? = nil) {
        self.contiguous = contiguous
        self.above = above.filter { $0 > contiguous }.sorted()
        self.ended = ended
        self.endedAt = ended ? endedAt : nil
    }

    public func contains(_ seq: UInt64) -> Bool {
        seq <= contiguous || binarySearch(seq) != nil
    }

    private func binarySearch(_ seq: UInt64) -> Int? {
        var lo = 0
        var hi = above.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if above[mid] < seq { lo = mid + 1 } else { hi = mid }
        }
        return lo < above.count && above[lo] == seq ? lo : nil
    }

    /// Records that every number below `watermark` is applied or given up for good by its issuer.
    mutating func settle(below watermark: UInt64) {
        guard watermark > contiguous + 1 else { return }
        contiguous = watermark - 1
        var drop = 0
        while drop < above.count, above[drop] <= contiguous + 1 {
            contiguous = max(contiguous, above[drop])
            drop += 1
        }
        if drop > 0 { above.removeFirst(drop) }
    }

    /// Records `seq` as applied (the caller checked `contains` first).
    mutating func insert(_ seq: UInt64) {
        if seq == contiguous + 1 {
            contiguous = seq
            var drop = 0
            while drop < above.count, above[drop] == contiguous + 1 {
                contiguous += 1
                drop += 1
            }
            if drop > 0 { above.removeFirst(drop) }
        } else {
            var lo = 0
            var hi = above.count
            while lo < hi {
                let mid = (lo + hi) / 2
                if above[mid] < seq { lo = mid + 1 } else { hi = mid }
            }
            above.insert(seq, at: lo)
        }
    }
}

/// The replicated state machine: one tree per namespace, the last applied log index, and what
/// each client session has had applied (docs/internals/state-machine.md).
///
/// Pure and deterministic: the same entries applied in the same order give the same trees, the
/// same outcomes and the same image on every replica.
public struct StateMachine: Sendable {
    /// The outcome of one command, as the issuing session is told.
    public enum Outcome: Sendable, Equatable {
        /// Applied (`Applied.value` holds the resolved value of a set or compare-and-set).
        case ok
        /// A compare-and-set found another value (Firebase's `datastale`); `current` lets the
        /// client retry its transaction.
        case datastale(current: Tree)
        /// The write was invalid for the tree it applies to (for example a path or depth limit, or
        /// a priority on an empty location). Nothing changed.
        case rejected(TreeError)
        /// A node of the cluster is low on disk space (its alarm is raised, `spaceAlarms`): only
        /// writes that delete are accepted. Nothing changed.
        case noSpace(nodes: [UInt64])

        /// The error clients see for `noSpace` (REST 507, WebSocket `failure`).
        public static func noSpaceMessage(_ nodes: [UInt64]) -> String {
            "NOSPACE: node \(nodes.map(String.init).joined(separator: ", ")) of the cluster is low on disk space; only deletes are accepted until space is freed"
        }
        /// The namespace has a quota (`quotas`) and the write would leave it holding more data
        /// bytes than the quota while adding to them: `used` is what it holds, `wouldHold` what
        /// it would have held. Writes that add nothing (deletes, smaller values) still apply.
        /// Nothing changed.
        case overQuota(namespace: String, used: Int, wouldHold: Int, quota: Int)

        /// The error clients see for `overQuota` (REST 507, WebSocket `failure`). A write the
        /// rules judged learns no sizes (`used` is -1): they would tell it the size of data it
        /// may not read.
        public static func overQuotaMessage(namespace: String, used: Int, wouldHold: Int, quota: Int) -> String {
            guard used >= 0 else {
                return "QUOTA: this write would take namespace \(namespace) over its quota of \(quota) bytes of data; only writes that do not add data are accepted until it holds less"
            }
            return "QUOTA: namespace \(namespace) holds \(used) bytes of data and this write would make it \(wouldHold), over its quota of \(quota); only writes that do not add data are accepted until it holds less"
        }
        /// Already applied: a retry or a duplicated proposal. Nothing changed.
        case duplicate
        /// The payload is not a command this version understands. Nothing changed.
        case malformed
        /// A connection-level refusal (the connection ended, a secret that does not match, a
        /// connection registering in a second namespace). Nothing changed.
        case refused(String)
        /// A command of an ordered session whose predecessor has neither applied nor been
        /// settled: not applied (only the settled watermark moved); its issuer proposes it again
        /// after the predecessor (`CommandEnvelope.ordered`).
        case outOfOrder
        /// The namespace's security rules, in force at this position of the log, refused the
        /// write for the client it names (`CommandEnvelope.auth`); `reason` says which rule.
        /// Nothing changed.
        case permissionDenied(reason: String)
        /// A client write (`CommandEnvelope.clientWrite`) already decided by an earlier copy:
        /// not applied again; the earlier copy's outcome, for the client's answer. Nothing changed.
        case alreadyApplied(ClientWriteOutcome)
    }

    /// What applying an entry did.
    public struct Applied: Sendable, Equatable {
        public var namespace: String
        public var session: UInt64
        public var seq: UInt64
        public var outcome: Outcome
        /// Absolute paths written (for live views: `ChildChanges.at(_:written:)`).
        public var written: [Path]
        /// For an applied set or compare-and-set: the value written, server values resolved (the
        /// REST echo). For an update: the value at the update's location afterwards. Nil otherwise.
        public var value: Tree? = nil
        /// Realtime connections this command ended (`connectionEnded`, a lease expiry): a node
        /// still serving one closes it.
        public var ended: [UInt64] = []
        /// The command replaced the namespace's security rules.
        public var rulesChanged = false
        /// The command installed or rotated a project's signing keys (`signingKeys`).
        public var signingKeysChanged = false
        /// The client write this command decided (nil when it carried none, or when an earlier
        /// copy had decided it).
        public var clientWrite: ClientWriteKey? = nil
        /// Records an `expireIdle` removed.
        public var expired = 0
        /// Subtrees of `releaseAfterBytes` data bytes or more that the write replaced or deleted,
        /// kept alive here so that the caller decides on which thread their memory is freed
        /// (freeing a million values takes about 150 ms). Dropped with this value otherwise.
        public var released = ReleasedTrees()
    }

    /// Trees handed back for freeing elsewhere (`Applied.released`). Not part of an outcome:
    /// any two compare equal.
    public struct ReleasedTrees: Sendable, Equatable {
        public var trees: [Tree] = []
        /// The trees were taken by whoever frees them (`NodeCore`): holders of the namespace's
        /// previous tree (live views) free theirs the same way.
        public var handedOff = false
        public init(_ trees: [Tree] = [], handedOff: Bool = false) {
            self.trees = trees
            self.handedOff = handedOff
        }
        public static func == (a: ReleasedTrees, b: ReleasedTrees) -> Bool { true }
    }

    /// A write whose replaced or deleted subtrees hold at least this many data bytes together
    /// hands them back in `Applied.released` instead of freeing them where it applies. Every
    /// value below a subtree's top has a key of at least one byte, so what one write frees where
    /// it applies is at most this many values plus one per subtree (the test reads each
    /// subtree's measure: O(1) each).
    public static let releaseAfterBytes = 4096

    /// The subtrees a write replaced, to hand back (`Applied.released`) when together they hold
    /// `releaseAfterBytes` or more; else none (freed where the write applies).
    static func released(_ replaced: [Tree]) -> [Tree] {
        var bytes = 0
        for subtree in replaced {
            bytes += subtree.dataBytes
            if bytes >= releaseAfterBytes { return replaced }
        }
        return []
    }

    /// The system namespace that holds every namespace's rules text, one string child per
    /// namespace (no client can name it: client namespaces never start with `$`). Being a tree
    /// of the machine, the rules travel in snapshots and images like any data.
    public static let rulesNamespace = "$rules"
    /// The system namespace of free-space alarms: one child per node whose alarm is raised.
    public static let alarmsNamespace = "$alarms"
    /// The system namespace of namespace quotas: one integer child per namespace with a quota,
    /// its limit in data bytes (`Tree.dataBytes`). Written by administrators only, through the
    /// log like any write (`PUT /.settings/quota.json`), so every node switches at one position
    /// and the quotas travel in snapshots.
    public static let quotasNamespace = "$quotas"
    /// The largest quota that can be set (2^50 bytes, a petabyte: beyond any node's memory).
    public static let maxQuotaBytes = 1 << 50
    /// Quotas by namespace, in data bytes (derived from `quotasNamespace`).
    public private(set) var quotas: [String: Int] = [:]
    /// The data bytes each namespace with a quota holds (derived: read from the namespace's tree,
    /// which carries its measure, when its quota is set or the machine is loaded, then kept up
    /// to date by each write from the paths it touched). Not in the image.
    public internal(set) var quotaUsage: [String: Int] = [:]
    /// The `ignore-client-writes` sabotage only (never set by the server): earlier copies of a
    /// client write are not looked up, so a resent write is decided again.
    public var ignoresClientWrites = false
    /// Nodes whose free-space alarm is raised (derived from `alarmsNamespace`).
    public private(set) var spaceAlarms: Set<UInt64> = []

    /// The outcome a write gets without being proposed, when this machine already refuses what it
    /// would add (a raised free-space alarm): so a client writing while the disks are low adds
    /// nothing to any node's log (issue 18). Nil: propose it; the machine where it applies
    /// decides, as for any write (an alarm raised or cleared meanwhile is seen there).
    public func refusedBeforeProposal(namespace: String, command: Command) -> Applied? {
        guard !spaceAlarms.isEmpty, command.addsData, namespace != Self.quotasNamespace else { return nil }
        return Applied(namespace: namespace, session: 0, seq: 0, outcome: .noSpace(nodes: spaceAlarms.sorted()), written: [])
    }
    /// The parsed rules in force, by namespace (derived from `rulesNamespace`, not in the image).
    /// A namespace without rules is not judged by the state machine (docs/rules.md).
    public private(set) var rules: [String: Rules] = [:]
    /// Parsed `auth` objects of recent commands (a client's writes repeat theirs): a cache of a
    /// pure function, bounded by `authCacheLimit`, so it changes no decision.
    private var authCache: [AuthBytes: JSONValue] = [:]
    static let authCacheLimit = 4096

    /// A command's `auth` bytes as a cache key, hashed in one call over the buffer (an array of
    /// bytes hashes byte by byte, about twenty instructions each).
    struct AuthBytes: Hashable {
        let bytes: [UInt8]

        /// The bytes folded eight at a time into one word, then that word hashed: a lookup costs
        /// a fraction of hashing every byte (the texts are a few hundred bytes). The cache is
        /// bounded and cleared when full, so colliding texts cost time, never correctness.
        func hash(into hasher: inout Hasher) {
            var folded = UInt64(bytes.count)
            bytes.withUnsafeBytes { raw in
                var i = 0
                while i + 8 <= raw.count {
                    folded = (folded ^ raw.loadUnaligned(fromByteOffset: i, as: UInt64.self)) &* 0x9E37_79B9_7F4A_7C15
                    folded ^= folded >> 29
                    i += 8
                }
                while i < raw.count {
                    folded = (folded ^ UInt64(raw[i])) &* 0x9E37_79B9_7F4A_7C15
                    i += 1
                }
            }
            hasher.combine(folded)
        }

        /// Eight bytes at a time.
        static func == (a: AuthBytes, b: AuthBytes) -> Bool {
            guard a.bytes.count == b.bytes.count else { return false }
            return a.bytes.withUnsafeBytes { x in
                b.bytes.withUnsafeBytes { y in
                    var i = 0
                    while i + 8 <= x.count {
                        if x.loadUnaligned(fromByteOffset: i, as: UInt64.self) != y.loadUnaligned(fromByteOffset: i, as: UInt64.self) { return false }
                        i += 8
                    }
                    while i < x.count {
                        if x[i] != y[i] { return false }
                        i += 1
                    }
                    return true
                }
            }
        }
    }

    /// The trees by namespace (an absent namespace is an empty tree).
    public internal(set) var namespaces: [String: Tree]
    public private(set) var appliedIndex: UInt64
    public internal(set) var sessions: [UInt64: SessionRecord]
    /// The largest timestamp applied so far. Server timestamps never go backwards in log order,
    /// even when a new leader's clock is behind its predecessor's: an entry stamped earlier than
    /// this applies with this timestamp.
    public private(set) var lastTimestamp: Int64
    /// The onDisconnect writes each live connection queued (docs/realtime.md, "onDisconnect").
    public internal(set) var disconnects: [UInt64: DisconnectQueue]
    /// A node's lease on its realtime connections: the node and the log index of its latest
    /// renewal (docs/realtime.md, "Node leases").
    public struct Lease: Sendable, Equatable {
        public var node: UInt64
        public var renewedIndex: UInt64
        public init(node: UInt64, renewedIndex: UInt64) {
            self.node = node
            self.renewedIndex = renewedIndex
        }
    }
    /// Live lease holders.
    public internal(set) var leases: [UInt64: Lease]
    /// Holders the leader expired: nothing applies under them again.
    public internal(set) var expiredHolders: Set<UInt64>
    /// Holder → namespace → queues held under it (derived from `disconnects`, not in the image):
    /// what the leader's lease keeper watches.
    public internal(set) var queuedHolders: [UInt64: [String: Int]]
    /// Clients by the time of their last write, and ended connections by the time they ended
    /// (derived from `$clients` and `sessions`, not in the image): what expiry walks.
    var clientIdleIndex = SortedTree<TimeID, Void>()
    var endedIndex = SortedTree<TimeID, Void>()

    public init(
        namespaces: [String: Tree] = [:], appliedIndex: UInt64 = 0, sessions: [UInt64: SessionRecord] = [:],
        lastTimestamp: Int64 = 0, disconnects: [UInt64: DisconnectQueue] = [:], leases: [UInt64: Lease] = [:],
        expiredHolders: Set<UInt64> = []
    ) {
        self.namespaces = namespaces.filter { !$0.value.isEmpty }
        self.appliedIndex = appliedIndex
        self.sessions = sessions
        self.lastTimestamp = lastTimestamp
        let queues = disconnects.filter { !$0.value.tree.isEmpty }
        self.disconnects = queues
        self.leases = leases
        self.expiredHolders = expiredHolders
        self.queuedHolders = Self.countHolders(queues)
        (clientIdleIndex, endedIndex) = Self.expiryIndexes(clients: self.namespaces[Self.clientsNamespace] ?? .empty, sessions: sessions)
        self.rules = Self.parsedRules(self.namespaces[Self.rulesNamespace] ?? .empty)
        self.spaceAlarms = Set((self.namespaces[Self.alarmsNamespace] ?? .empty).children.keys.compactMap { UInt64($0.string) })
        self.quotas = Self.parsedQuotas(self.namespaces[Self.quotasNamespace] ?? .empty)
        // Each namespace's tree carries its measure: O(1) per quota.
        for namespace in quotas.keys { quotaUsage[namespace] = tree(namespace).dataBytes }
    }

    /// The quotas of the quotas namespace: positive integers under client namespace names
    /// (anything else, which no administrator's request writes, sets no quota).
    public static func parsedQuotas(_ tree: Tree) -> [String: Int] {
        var out: [String: Int] = [:]
        for (key, entry) in tree.children.elements() where !key.string.hasPrefix("$") {
            guard case .int(let bytes)? = entry.leaf, bytes > 0, bytes <= maxQuotaBytes else { continue }
            out[key.string] = Int(bytes)
        }
        return out
    }

    /// For each path a data write wrote (`Applied.written`, in its order), whether it wrote only
    /// a priority (`…/.priority`): measured without its children (`Tree.dataBytes(touching:)`).
    static func priorityOnly(_ command: Command, count: Int) -> [Bool]? {
        switch command {
        case .set(let path, _):
            guard count == 1, (try? WritePath(parsing: path))?.isPriority == true else { return nil }
            return [true]
        case .update(_, let items):
            guard count == items.count else { return nil }
            let flags = items.map { (try? WritePath(parsing: $0.path))?.isPriority == true }
            return flags.contains(true) ? flags : nil
        default:
            return nil
        }
    }

    /// The quota decision for a change of `namespace` from `before` to `after` at `paths` (a
    /// client's write, or an onDisconnect queue firing): one rule for both.
    enum QuotaCheck {
        /// No quota on the namespace.
        case unlimited
        /// Within the quota: the namespace's usage after the change (`quotaUsage`'s value).
        case within(usage: Int)
        /// The change adds bytes past the quota; nothing may change.
        case over(used: Int, wouldHold: Int, quota: Int)
    }

    /// Measures only `paths` in both trees (`Tree.dataBytes(touching:)`: O(the paths), each
    /// subtree's measure read where it stands); a change that adds no bytes is always within
    /// (deletes go on at any usage).
    func quotaCheck(_ namespace: String, before: Tree, after: Tree, touching paths: [Path], priorityOnly: [Bool]? = nil) -> QuotaCheck {
        guard let quota = quotas[namespace], let used = quotaUsage[namespace] else { return .unlimited }
        let delta = after.dataBytes(touching: paths, priorityOnly: priorityOnly)
            - before.dataBytes(touching: paths, priorityOnly: priorityOnly)
        if delta > 0, used + delta > quota { return .over(used: used, wouldHold: used + delta, quota: quota) }
        return .within(usage: used + delta)
    }

    /// After a write to the quotas namespace: the quotas again, and the usage of each namespace
    /// that gained one read from its tree (O(1)).
    private mutating func quotasChanged() {
        let next = Self.parsedQuotas(tree(Self.quotasNamespace))
        for namespace in quotaUsage.keys where next[namespace] == nil { quotaUsage[namespace] = nil }
        for namespace in next.keys where quotaUsage[namespace] == nil { quotaUsage[namespace] = tree(namespace).dataBytes }
        quotas = next
    }

    /// Drops the parsed rules (they stay in the `$rules` tree). For the simulator's self-test
    /// `forget-rules-on-load` only: a machine that forgets them judges nothing.
    public mutating func forgetRules() { rules = [:] }

    /// The rules texts of the rules namespace, parsed. A stored text that no longer parses (a
    /// newer version's syntax loaded by an older binary) stands for rules that allow nothing:
    /// the namespace fails closed, never open, and every node that cannot read it decides alike.
    static func parsedRules(_ tree: Tree) -> [String: Rules] {
        var out: [String: Rules] = [:]
        for (key, entry) in tree.children.elements() {
            guard case .string(let text)? = entry.leaf, let parsed = try? Rules.parse(text) else {
                out[key.string] = Rules.denyAll
                continue
            }
            out[key.string] = parsed
        }
        return out
    }

    /// The tree of `namespace`.
    public func tree(_ namespace: String) -> Tree { namespaces[namespace] ?? .empty }

    /// Marks an index applied that carries no command (Raft no-ops and configuration entries).
    public mutating func skip(index: UInt64) {
        appliedIndex = max(appliedIndex, index)
    }

    /// Applies the command at `index`. Entries at or below `appliedIndex` are ignored (returns
    /// nil), so replaying a log over a snapshot never applies anything twice (R10).
    ///
    /// - Parameter prepared: `payload` read ahead (`PreparedCommand(payload:)`, possibly on
    ///   another thread); the result is the same as without it.
    public mutating func apply(_ payload: [UInt8], index: UInt64, prepared: PreparedCommand? = nil) -> Applied? {
        guard index > appliedIndex else { return nil }
        appliedIndex = index
        guard let envelope = prepared?.envelope ?? CommandEnvelope(decoding: payload) else {
            return Applied(namespace: "", session: 0, seq: 0, outcome: .malformed, written: [])
        }
        if sessions[envelope.session]?.contains(envelope.seq) == true {
            return Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: .duplicate, written: [])
        }
        if sessions[envelope.session]?.ended == true, !envelope.endsItsOwnSession {
            // Not recorded as applied: it never will be. (A connection's own end after it was
            // ended elsewhere applies, as a second end does nothing.)
            return Applied(
                namespace: envelope.namespace, session: envelope.session, seq: envelope.seq,
                outcome: .refused("connection \(envelope.session) has ended: its onDisconnect writes ran, and nothing it sends afterwards applies"),
                written: [])
        }
        // Moved out and back, so the record is changed in place (a copy would copy its `above`
        // list) without the dictionary's `_modify`, whose coroutine frame is heap-allocated.
        var record = sessions.removeValue(forKey: envelope.session) ?? SessionRecord()
        if envelope.settledBelow > 0 { record.settle(below: envelope.settledBelow) }
        if envelope.ordered, envelope.seq > record.contiguous + 1 {
            // Its predecessor is neither applied nor given up: it waits (docs/internals/state-machine.md).
            sessions[envelope.session] = record
            return Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: .outOfOrder, written: [])
        }
        // A watermark beyond the command's own number (no issuer writes one) already covers it.
        if !record.contains(envelope.seq) { record.insert(envelope.seq) }
        sessions[envelope.session] = record
        lastTimestamp = max(lastTimestamp, envelope.timestamp)
        let clientWrite = envelope.command.takesClientWrite ? envelope.clientWrite : nil
        if let key = clientWrite, let decided = clientWriteDecided(key) {
            // Another copy of this client write was decided earlier (on another connection, a
            // resend after a reconnect): it is not decided again.
            return Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: decided, written: [])
        }
        // (A quota may be set while the disks are low: it is how an operator stops one namespace.)
        if !spaceAlarms.isEmpty, envelope.command.addsData, envelope.namespace != Self.quotasNamespace {
            let outcome = Outcome.noSpace(nodes: spaceAlarms.sorted())
            if let key = clientWrite { recordClientWrite(key, outcome, at: lastTimestamp) }
            return Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: outcome, written: [], clientWrite: clientWrite)
        }
        switch envelope.command {
        case .onDisconnectSet, .onDisconnectUpdate, .onDisconnectCancel, .connectionEnded, .renewLease, .expireHolder:
            return applyConnectionCommand(envelope)
        case let .spaceAlarm(node, raised):
            return applySpaceAlarm(envelope, node: node, raised: raised)
        case .setRules(let text):
            return applySetRules(envelope, text: text)
        case .account(let op):
            return applyAccount(envelope, op: op)
        case let .expireIdle(clients, ended):
            return applyExpireIdle(envelope, clientsIdleMillis: clients, endedMillis: ended)
        case .set, .update, .compareAndSet:
            break
        }
        if envelope.namespace == Self.quotasNamespace, envelope.auth != nil {
            return Applied(
                namespace: envelope.namespace, session: envelope.session, seq: envelope.seq,
                outcome: .permissionDenied(reason: "only administrators may set quotas"), written: [])
        }
        var written: [Path] = []
        var value: Tree?
        var tree = namespaces.removeValue(forKey: envelope.namespace) ?? .empty
        // Kept only under a quota (a second holder makes the write copy the path it changes).
        let before: Tree? = quotas[envelope.namespace] != nil ? tree : nil
        // The subtrees the write will replace, held so that a large one outlives the write (a
        // hold on a replaced subtree copies nothing: the write changes the path above it).
        let replaced = Self.replacedSubtrees(envelope.command, in: tree)
        var outcome: Outcome
        do throws(TreeError) {
            let judge = judgement(for: envelope)
            outcome = try execute(
                envelope.command, on: &tree, timestamp: lastTimestamp, written: &written, value: &value, judge: judge, prepared: prepared?.values)
        } catch {
            // A client the rules would not let write here learns nothing from why the write is
            // invalid (some reasons depend on the data): judged with the tree unchanged, a refusal
            // is the answer.
            outcome = refusedBeforeInvalid(envelope, tree: tree) ?? .rejected(error)
            written = []
            value = nil
        }
        if envelope.auth != nil, rules[envelope.namespace] != nil, case .update = envelope.command {
            // A PATCH's ETag would hash the location's whole value, parts of which the client
            // may not read: judged clients get none.
            value = nil
        }
        if let before, case .ok = outcome {
            let priorityOnly = Self.priorityOnly(envelope.command, count: written.count)
            switch quotaCheck(
                envelope.namespace, before: before, after: tree, touching: written, priorityOnly: priorityOnly)
            {
            case .unlimited:
                break
            case .within(let usage):
                quotaUsage[envelope.namespace] = usage
            case let .over(used, wouldHold, quota):
                // A judged client learns nothing of the sizes (they depend on data it may not read).
                let judged = envelope.auth != nil && rules[envelope.namespace] != nil
                outcome = .overQuota(namespace: envelope.namespace, used: judged ? -1 : used, wouldHold: judged ? -1 : wouldHold, quota: quota)
                tree = before
                written = []
                value = nil
            }
        }
        if !tree.isEmpty { namespaces[envelope.namespace] = tree }
        if envelope.namespace == Self.quotasNamespace, case .ok = outcome { quotasChanged() }
        if let key = clientWrite { recordClientWrite(key, outcome, at: lastTimestamp) }
        var released = ReleasedTrees()
        if case .ok = outcome {
            released.trees = Self.released(replaced)
        }
        return Applied(
            namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: outcome, written: written, value: value,
            clientWrite: clientWrite, released: released)
    }

    /// The subtrees with children that `command` replaces (a set's or compare-and-set's location,
    /// each location of an update; nothing for a priority write, which keeps its location's
    /// data): O(path lengths), nothing copied.
    static func replacedSubtrees(_ command: Command, in tree: Tree) -> [Tree] {
        func held(_ path: Path) -> [Tree] {
            let old = tree.child(at: path)
            return old.hasChildren ? [old] : []
        }
        switch command {
        case .set(let pathText, _):
            guard let location = try? WritePath(parsing: pathText), !location.isPriority else { return [] }
            return held(location.path)
        case .compareAndSet(let pathText, _, _):
            guard let location = try? Path(parsing: pathText) else { return [] }
            return held(location)
        case let .update(pathText, items):
            guard let base = try? Path(parsing: pathText) else { return [] }
            var out: [Tree] = []
            for item in items {
                guard let relative = try? WritePath(parsing: item.path), !relative.isPriority else { continue }
                out += held(base.appending(relative.path))
            }
            return out
        default:
            return []
        }
    }

    /// The rules and request context a client write is judged by: nil for commands without
    /// `auth` (administrators, the node's own) and for namespaces without rules.
    mutating func judgement(for envelope: CommandEnvelope) -> (rules: Rules, context: RulesRequestContext?)? {
        guard let auth = envelope.auth, let rules = rules[envelope.namespace] else { return nil }
        switch auth {
        case .signedOut:
            return (rules, RulesRequestContext(auth: nil, time: lastTimestamp))
        case .user(let json):
            // An `auth` that does not read as a JSON object is denied (context nil), on every
            // replica alike.
            let key = AuthBytes(bytes: json)
            if let cached = authCache[key] { return (rules, RulesRequestContext(auth: cached, time: lastTimestamp)) }
            guard let value = try? JSONValue(parsing: json), case .object = value else { return (rules, nil) }
            if authCache.count >= Self.authCacheLimit { authCache.removeAll(keepingCapacity: true) }
            authCache[key] = value
            return (rules, RulesRequestContext(auth: value, time: lastTimestamp))
        }
    }

    /// For a judged write that turned out invalid: `permissionDenied` when the rules do not grant
    /// it a write at its location (judged with the tree as it is), else nil.
    private mutating func refusedBeforeInvalid(_ envelope: CommandEnvelope, tree: Tree) -> Outcome? {
        guard let judge = judgement(for: envelope) else { return nil }
        let pathText: String
        switch envelope.command {
        case .set(let p, _), .update(let p, _), .compareAndSet(let p, _, _): pathText = p
        default: return nil
        }
        guard let location = (try? WritePath(parsing: pathText))?.path else { return nil }
        return Self.verdict(judge) { $0.decideWrite(targets: [location], context: $1, current: tree, proposed: tree, traced: false) }
    }

    /// A node's free-space alarm: the node's own command only (a client's is refused).
    private mutating func applySpaceAlarm(_ envelope: CommandEnvelope, node: UInt64, raised: Bool) -> Applied {
        var applied = Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: .ok, written: [])
        guard envelope.auth == nil else {
            applied.outcome = .refused("free-space alarms are raised by nodes, not clients")
            return applied
        }
        var tree = namespaces.removeValue(forKey: Self.alarmsNamespace) ?? .empty
        // A decimal number is always a valid key.
        guard let key = ChildKey(validKey: String(node)) else { return applied }
        tree.set(raised ? Tree(.int(lastTimestamp)) : .empty, at: Path(segments: [key]))
        if !tree.isEmpty { namespaces[Self.alarmsNamespace] = tree }
        if raised { spaceAlarms.insert(node) } else { spaceAlarms.remove(node) }
        return applied
    }

    /// `setRules`: administrators only; the text must parse (the proposer checked it, but the
    /// machine decides, identically everywhere); an empty text removes the rules.
    private mutating func applySetRules(_ envelope: CommandEnvelope, text: [UInt8]) -> Applied {
        var applied = Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: .ok, written: [])
        guard envelope.auth == nil else {
            applied.outcome = .permissionDenied(reason: "only administrators may set security rules")
            return applied
        }
        var tree = namespaces.removeValue(forKey: Self.rulesNamespace) ?? .empty
        defer { if !tree.isEmpty { namespaces[Self.rulesNamespace] = tree } }
        do throws(TreeError) {
            let location = WritePath(path: try Path(parsing: "/" + envelope.namespace))
            guard location.path.count == 1 else {
                applied.outcome = .refused("rules need a namespace")
                return applied
            }
            if text.isEmpty {
                try tree.apply(set: .empty, at: location)
                rules[envelope.namespace] = nil
            } else {
                let source = String(decoding: text, as: UTF8.self)
                let parsed: Rules
                do throws(RulesError) {
                    parsed = try Rules.parse(source)
                } catch {
                    applied.outcome = .refused("\(error)")
                    return applied
                }
                try tree.apply(set: Tree(.string(source)), at: location)
                rules[envelope.namespace] = parsed
            }
        } catch {
            applied.outcome = .rejected(error)
            return applied
        }
        applied.rulesChanged = true
        return applied
    }

    private func execute(
        _ command: Command, on tree: inout Tree, timestamp: Int64, written: inout [Path], value: inout Tree?,
        judge: (rules: Rules, context: RulesRequestContext?)?, prepared: [Result<DeferredTree, TreeError>]?
    ) throws(TreeError) -> Outcome {
        switch command {
        case .onDisconnectSet, .onDisconnectUpdate, .onDisconnectCancel, .connectionEnded, .renewLease, .expireHolder, .setRules, .account,
            .spaceAlarm, .expireIdle:
            return .malformed  // handled by `applyConnectionCommand`, `applySetRules` and `applyAccount`
        case let .set(pathText, json):
            let location = try WritePath(parsing: pathText)
            // The context is a temporary, so nothing but `tree` itself holds the tree while it
            // is written: a uniquely held path is changed in place instead of copied.
            let incoming = try PreparedCommand.tree(
                prepared, 0, json, at: location.path, context: ServerValueContext(timestamp: timestamp, existing: tree))
            if let judge, !location.isPriority, !judge.rules.writesReadCurrentData,
                let old = tree.replaceEntry(incoming, at: location.path)
            {
                // Rules that never read the data before the write, and a write that changes only
                // the entry at its location (a value, under a parent that has children, so no
                // parent is created, pruned or turned from a leaf into children): judged on the
                // tree changed in place (`replaceEntry` writes `incoming` there in the same descent
                // that finds the old entry, as `apply(set:)` would), which a denial restores by
                // putting the old entry back, exactly. No copy of the path is made.
                if let denied = Self.verdict(judge, { $0.decideWrite(targets: [location.path], context: $1, current: tree, proposed: tree, written: incoming, traced: false) }) {
                    tree.set(old, at: location.path)
                    return denied
                }
                written = [location.path]
                value = incoming
                return .ok
            }
            if let judge, !location.isPriority {
                // Judged on the tree after the write, which then becomes the tree: applied once.
                var next = tree
                try next.apply(set: incoming, at: location, readHere: true)
                let proposed = next
                if let denied = Self.verdict(judge, { $0.decideWrite(targets: [location.path], context: $1, current: tree, proposed: proposed, written: incoming, traced: false) }) {
                    return denied
                }
                tree = next
                written = [location.path]
                value = incoming
                return .ok
            }
            if let denied = Self.verdict(judge, { $0.decideSet(incoming, at: location, context: $1, tree: tree, traced: false) }) { return denied }
            if location.isPriority, let priority = Priority(tree: incoming) {
                // Firebase's setPriority: an error on a location with no data.
                try tree.apply(setPriority: priority, at: location.path)
            } else {
                try tree.apply(set: incoming, at: location, readHere: true)
            }
            written = [location.path]
            value = incoming
            return .ok
        case let .update(pathText, items):
            let location = try Path(parsing: pathText)
            var entries: [UpdateEntry] = []
            entries.reserveCapacity(items.count)
            for (slot, item) in items.enumerated() {
                let relative = try WritePath(parsing: item.path)
                let target = location.appending(relative.path)
                let context = ServerValueContext(timestamp: timestamp, existing: tree)
                let incoming = try PreparedCommand.tree(prepared, slot, item.json, at: target, context: context)
                entries.append(UpdateEntry(path: relative, value: incoming))
            }
            // Validation and application are atomic: a rejected update leaves the tree as it was.
            var next = tree
            try next.apply(update: entries, at: location, readHere: true)
            if judge != nil {
                // Every entry's path is judged on the tree after the whole update.
                let proposed = next
                let targets = entries.map { location.appending($0.path.path) }
                if let denied = Self.verdict(judge, { $0.decideWrite(targets: targets, context: $1, current: tree, proposed: proposed, traced: false) }) {
                    return denied
                }
            }
            tree = next
            written = entries.map { location.appending($0.path.path) }
            // The location's value after the update (the REST ETag of a PATCH).
            value = tree.child(at: location)
            return .ok
        case let .compareAndSet(pathText, expectedHash, json):
            let location = try Path(parsing: pathText)
            let context = ServerValueContext(timestamp: timestamp, existing: tree)
            // Read at `location`, so it fits there (the reader checks depth and key paths).
            let incoming = try PreparedCommand.tree(prepared, 0, json, at: location, context: context)
            // Judged before the hash: a client the rules refuse learns nothing of the data.
            if let denied = Self.verdict(judge, { $0.decideSet(incoming, at: WritePath(path: location), context: $1, tree: tree, traced: false) }) { return denied }
            switch tree.compareAndSet(incoming, at: location, expectedHash: expectedHash) {
            case .applied:
                written = [location]
                value = incoming
                return .ok
            case .mismatch(let current):
                return .datastale(current: current)
            }
        }
    }

    /// A client write's judgement: nil when it may proceed (or is not judged), else the denial.
    /// Without a context (the command's `auth` could not be read) the write is denied.
    static func verdict(
        _ judge: (rules: Rules, context: RulesRequestContext?)?, _ decide: (Rules, RulesRequestContext) -> Decision
    ) -> Outcome? {
        guard let judge else { return nil }
        guard let context = judge.context else { return .permissionDenied(reason: "the request's auth could not be read") }
        let decision = decide(judge.rules, context)
        return decision.allowed ? nil : .permissionDenied(reason: decision.description)
    }

    // MARK: - Snapshot image

    static let magic: [UInt8] = Array("BNYSM005".utf8)
    /// Images written before ended connections carried their end time still load (an ended
    /// record's time is then the image's last timestamp).
    static let magicVersion4: [UInt8] = Array("BNYSM004".utf8)
    /// Images written before node leases (queues without holders, no leases) still load.
    static let magicVersion3: [UInt8] = Array("BNYSM003".utf8)
    /// Images written before onDisconnect queues (no ended flags, no queues) still load.
    static let magicVersion2: [UInt8] = Array("BNYSM002".utf8)

    public enum ImageError: Error, Sendable, Equatable {
        case badHeader
        case truncated
        case tree(TreeError)
    }

    /// Streams the image: header (magic, applied index, last timestamp, sessions sorted by id,
    /// each with its ended flag), then each namespace (sorted by name): its name and its tree
    /// image in framed chunks ending with an empty frame; then the onDisconnect queues (sorted
    /// by connection). No tree is ever copied whole.
    public func writeImage(chunkBytes: Int = 1 << 20, emit: ([UInt8]) throws -> Void) throws {
        var w = ByteWriter()
        w.out.append(contentsOf: Self.magic)
        w.u64(appliedIndex)
        w.u64(UInt64(bitPattern: lastTimestamp))
        w.u64(UInt64(sessions.count))
        for (session, record) in sessions.sorted(by: { $0.key < $1.key }) {
            w.u64(session)
            w.u64(record.contiguous)
            w.u64(UInt64(record.above.count))
            for s in record.above { w.u64(s) }
            w.u8(record.ended ? 1 : 0)
            if record.ended { w.u64(UInt64(bitPattern: record.endedAt ?? lastTimestamp)) }
        }
        w.u64(UInt64(namespaces.count))
        try emit(w.out)
        for (name, tree) in namespaces.sorted(by: { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }) {
            var header = ByteWriter()
            header.string(name)
            try emit(header.out)
            try TreeImage.stream(tree, chunkBytes: chunkBytes) { chunk in
                var frame = ByteWriter()
                frame.bytes(chunk)
                try emit(frame.out)
            }
            var end = ByteWriter()
            end.u64(0)
            try emit(end.out)
        }
        // Queues: connection, namespace, secret, entries (path keys, then the JSON).
        var queues = ByteWriter()
        queues.u64(UInt64(disconnects.count))
        try emit(queues.out)
        for (connection, queue) in disconnects.sorted(by: { $0.key < $1.key }) {
            var w = ByteWriter()
            w.u64(connection)
            w.string(queue.namespace)
            w.u64(queue.secret)
            w.u64(queue.holder)
            let entries = queue.tree.entries
            w.u64(UInt64(entries.count))
            for (path, value) in entries {
                w.u64(UInt64(path.count))
                for key in path { w.string(key) }
                var json: [UInt8] = []
                value.appendJSON(to: &json)
                w.bytes(json)
            }
            try emit(w.out)
        }
        // Leases (holder, node, renewal index), then the expired holders, both sorted.
        var tail = ByteWriter()
        tail.u64(UInt64(leases.count))
        for (holder, lease) in leases.sorted(by: { $0.key < $1.key }) {
            tail.u64(holder)
            tail.u64(lease.node)
            tail.u64(lease.renewedIndex)
        }
        tail.u64(UInt64(expiredHolders.count))
        for holder in expiredHolders.sorted() { tail.u64(holder) }
        try emit(tail.out)
    }

    public func image() -> [UInt8] {
        var out: [UInt8] = []
        // The closure cannot throw, so neither can the stream.
        try? writeImage { out.append(contentsOf: $0) }
        return out
    }

    /// Restores a state machine from an image; damaged input is a typed error, never a crash.
    public init(image bytes: [UInt8], limits: TreeReadLimits = .snapshot) throws(ImageError) {
        var offset = 0
        do {
            try self.init(limits: limits, maxLength: bytes.count) { buffer in
                let n = Swift.min(buffer.count, bytes.count - offset)
                bytes.withUnsafeBufferPointer { source in
                    _ = buffer.initialize(from: UnsafeBufferPointer(rebasing: source[offset..<(offset + n)]))
                }
                offset += n
                return n
            }
        } catch let error as ImageError {
            throw error
        } catch {
            // The array never fails, so only the reader's own errors can arrive here.
            throw .truncated
        }
    }

    /// Restores a state machine from an image as it arrives, validating it as `init(image:)`
    /// does: `fill` writes the next bytes into the buffer it is given and returns how many (0 at
    /// the end). Only small windows of the image are held at a time, so a snapshot of any size
    /// loads without a second copy of it in memory. `maxLength` bounds the image (counts and
    /// lengths beyond it are rejected before anything is allocated for them). Errors are
    /// `ImageError` for the image, or whatever `fill` threw.
    public init(
        limits: TreeReadLimits = .snapshot, maxLength: Int = .max, fill: (UnsafeMutableBufferPointer<UInt8>) throws -> Int
    ) throws {
        let loaded = try withoutActuallyEscaping(fill) { fill in
            let source = ImageSource(fill: fill)
            defer { source.release() }
            return try Self.read(from: source, limits: limits, maxLength: maxLength)
        }
        self.init(
            namespaces: loaded.namespaces, appliedIndex: loaded.applied, sessions: loaded.sessions, lastTimestamp: loaded.stamp,
            disconnects: loaded.disconnects, leases: loaded.leases, expiredHolders: loaded.expired)
    }

    private static func read(
        from source: ImageSource, limits: TreeReadLimits, maxLength: Int
    ) throws -> (
        namespaces: [String: Tree], applied: UInt64, sessions: [UInt64: SessionRecord], stamp: Int64, disconnects: [UInt64: DisconnectQueue],
        leases: [UInt64: Lease], expired: Set<UInt64>
    ) {
        guard let header = try source.take(Self.magic.count),
            header == Self.magic || header == Self.magicVersion4 || header == Self.magicVersion3 || header == Self.magicVersion2
        else {
            throw ImageError.badHeader
        }
        let version5 = header == Self.magic
        let version4 = version5 || header == Self.magicVersion4
        let version3 = version4 || header == Self.magicVersion3
        let bound = UInt64(Swift.max(0, maxLength))
        guard let applied = try source.u64(), let stamp = try source.u64(), let count = try source.u64(), count <= bound / 24 else {
            throw ImageError.truncated
        }
        var sessions: [UInt64: SessionRecord] = [:]
        for _ in 0..<count {
            guard let s = try source.u64(), let contiguous = try source.u64(), let n = try source.u64(), n <= bound / 8 else {
                throw ImageError.truncated
            }
            var above: [UInt64] = []
            for _ in 0..<n {
                guard let q = try source.u64() else { throw ImageError.truncated }
                above.append(q)
            }
            var ended = false
            var endedAt: Int64?
            if version3 {
                guard let flag = try source.take(1), flag[0] <= 1 else { throw ImageError.truncated }
                ended = flag[0] == 1
                if ended {
                    if version5 {
                        guard let at = try source.u64() else { throw ImageError.truncated }
                        endedAt = Int64(bitPattern: at)
                    } else {
                        endedAt = Int64(bitPattern: stamp)
                    }
                }
            }
            sessions[s] = SessionRecord(contiguous: contiguous, above: above, ended: ended, endedAt: endedAt)
        }
        guard let namespaceCount = try source.u64(), namespaceCount <= bound else { throw ImageError.truncated }
        var namespaces: [String: Tree] = [:]
        for _ in 0..<namespaceCount {
            // Names are short (validated like Firebase namespaces); a length beyond any real one
            // is damage, refused before anything is allocated for it.
            guard let length = try source.u64(), length <= Swift.min(bound, 1 << 16), let raw = try source.take(Int(length)),
                let name = String(validating: raw, as: UTF8.self)
            else { throw ImageError.truncated }
            // The tree image arrives in frames (a length, then that many bytes) ending with an
            // empty frame; the tree reader pulls through them.
            var frameLeft = 0
            var ended = false
            let tree: Tree
            do {
                tree = try TreeImage.read(limits: limits, maxLength: maxLength) { buffer in
                    while frameLeft == 0 {
                        if ended { return 0 }
                        guard let n = try source.u64(), n <= bound else { throw ImageError.truncated }
                        if n == 0 {
                            ended = true
                            return 0
                        }
                        frameLeft = Int(n)
                    }
                    let got = try source.read(into: UnsafeMutableBufferPointer(rebasing: buffer[0..<Swift.min(buffer.count, frameLeft)]))
                    guard got > 0 else { throw ImageError.truncated }
                    frameLeft -= got
                    return got
                }
            } catch let error as TreeError {
                throw ImageError.tree(error)
            }
            guard ended else { throw ImageError.truncated }
            namespaces[name] = tree
        }
        var disconnects: [UInt64: DisconnectQueue] = [:]
        if version3 { disconnects = try readQueues(from: source, bound: bound, holders: version4) }
        var leases: [UInt64: Lease] = [:]
        var expired = Set<UInt64>()
        if version4 {
            guard let count = try source.u64(), count <= bound / 24 else { throw ImageError.truncated }
            for _ in 0..<count {
                guard let holder = try source.u64(), let node = try source.u64(), let index = try source.u64(), leases[holder] == nil else {
                    throw ImageError.truncated
                }
                leases[holder] = Lease(node: node, renewedIndex: index)
            }
            guard let gone = try source.u64(), gone <= bound / 8 else { throw ImageError.truncated }
            for _ in 0..<gone {
                guard let holder = try source.u64() else { throw ImageError.truncated }
                expired.insert(holder)
            }
        }
        guard try source.atEnd() else { throw ImageError.truncated }
        return (namespaces, applied, sessions, Int64(bitPattern: stamp), disconnects, leases, expired)
    }

    /// The onDisconnect queues of a version-3 image; every count and length is checked against
    /// the image's bound before anything is allocated for it, and every key and value again.
    private static func readQueues(from source: ImageSource, bound: UInt64, holders: Bool) throws -> [UInt64: DisconnectQueue] {
        func string() throws -> String {
            guard let length = try source.u64(), length <= Swift.min(bound, 1 << 20), let raw = try source.take(Int(length)),
                let text = String(validating: raw, as: UTF8.self)
            else { throw ImageError.truncated }
            return text
        }
        guard let count = try source.u64(), count <= bound / 24 else { throw ImageError.truncated }
        var queues: [UInt64: DisconnectQueue] = [:]
        for _ in 0..<count {
            guard let connection = try source.u64() else { throw ImageError.truncated }
            let namespace = try string()
            guard let secret = try source.u64() else { throw ImageError.truncated }
            var holder: UInt64 = 0
            if holders {
                guard let h = try source.u64() else { throw ImageError.truncated }
                holder = h
            }
            guard let entries = try source.u64(), entries <= bound / 16 else { throw ImageError.truncated }
            var tree = OnDisconnectTree()
            for _ in 0..<entries {
                guard let depth = try source.u64(), depth <= UInt64(Path.maxDepth) else { throw ImageError.truncated }
                var path: [String] = []
                for _ in 0..<depth {
                    let key = try string()
                    do { _ = try ChildKey(validating: key) } catch { throw ImageError.tree(error) }
                    path.append(key)
                }
                // No queued value is larger than a queue may be (registration enforces the limit).
                guard let length = try source.u64(), length <= Swift.min(bound, UInt64(4 * maxQueuedBytes)), let json = try source.take(Int(length)) else {
                    throw ImageError.truncated
                }
                do { tree.set(path, try JSONValue(parsing: json)) } catch { throw ImageError.tree(error) }
            }
            guard queues[connection] == nil else { throw ImageError.truncated }
            queues[connection] = DisconnectQueue(namespace: namespace, secret: secret, holder: holder, tree: tree)
        }
        return queues
    }
}

/// Buffered reads over an image's `fill` function, for `StateMachine.init(fill:)`: small fields
/// come from a 64 KiB buffer; large reads with the buffer empty go straight to `fill`.
private final class ImageSource {
    private let fill: (UnsafeMutableBufferPointer<UInt8>) throws -> Int
    private let buffer = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: 64 * 1024)
    private var position = 0
    private var end = 0
    private var exhausted = false

    init(fill: @escaping (UnsafeMutableBufferPointer<UInt8>) throws -> Int) { self.fill = fill }

    func release() { buffer.deallocate() }

    /// Refills the buffer when it is empty; false at the end of the image.
    private func refill() throws -> Bool {
        if position < end { return true }
        if exhausted { return false }
        position = 0
        end = try fill(buffer)
        if end == 0 { exhausted = true }
        return end > 0
    }

    /// Copies up to `out.count` bytes into `out`; 0 only at the end of the image.
    func read(into out: UnsafeMutableBufferPointer<UInt8>) throws -> Int {
        if position == end && out.count >= buffer.count / 2 && !exhausted {
            let got = try fill(out)
            if got == 0 { exhausted = true }
            return got
        }
        guard try refill() else { return 0 }
        let n = Swift.min(out.count, end - position)
        _ = out.initialize(from: UnsafeBufferPointer(rebasing: buffer[position..<(position + n)]))
        position += n
        return n
    }

    /// Exactly `count` bytes, or nil when the image ends first.
    func take(_ count: Int) throws -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: count)
        var filled = 0
        while filled < count {
            let got = try out.withUnsafeMutableBufferPointer { try read(into: UnsafeMutableBufferPointer(rebasing: $0[filled...])) }
            if got == 0 { return nil }
            filled += got
        }
        return out
    }

    func u64() throws -> UInt64? {
        guard let b = try take(8) else { return nil }
        return try? ByteReader.readAll(b) { (r) throws(ByteCodecError) in try r.u64("image field") }
    }

    func atEnd() throws -> Bool { try !refill() }
}
