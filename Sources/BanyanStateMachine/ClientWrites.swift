public import BanyanTree

/// A client's own name for one of its writes: the SDK's stable client id (random, kept with
/// its offline queue) and the write's number (1, 2, … per client, in the order it made them).
/// The state machine applies each (client, number) at most once, whichever connection, node or
/// session carries it, and remembers how it ended, so a client that resends a write after a
/// connection died (not knowing whether it applied) learns the first copy's outcome instead of
/// applying it twice (docs/internals/state-machine.md, "Client writes").
public struct ClientWriteKey: Sendable, Equatable, Hashable {
    public var client: UInt64
    public var number: UInt64
    /// Every number below this was answered to the client: it never sends them again, so their
    /// outcomes may be forgotten.
    public var acknowledgedBelow: UInt64

    public init(client: UInt64, number: UInt64, acknowledgedBelow: UInt64) {
        self.client = client
        self.number = number
        self.acknowledgedBelow = acknowledgedBelow
    }

    /// How far past the client's lowest unanswered write a number may be: the bound on what the
    /// state machine remembers per client (numbers and failures).
    public static let window: UInt64 = 1_000
}

extension Command {
    /// The commands a client write key may name: the data writes.
    var takesClientWrite: Bool {
        switch self {
        case .set, .update, .compareAndSet: true
        default: false
        }
    }
}

/// How a client's write ended, remembered for the copies that come after it (`.ok` is not
/// stored: a number applied with no failure recorded succeeded).
public struct ClientWriteOutcome: Sendable, Equatable {
    /// The protocol's status: `ok`, `datastale`, `permission_denied` or `failure`.
    public var status: String
    public var message: String

    public init(status: String, message: String) {
        self.status = status
        self.message = message
    }

    public static let ok = ClientWriteOutcome(status: "ok", message: "")
    /// The most bytes of a failure's message kept.
    static let maxMessageBytes = 256
}

/// What the state machine remembers of one client's writes, kept as a tree in the system
/// namespace `$clients` (so snapshots, backups and replays carry it with no format of its own):
/// `c` the contiguous number (every number at or below it is decided or acknowledged), `a` the
/// numbers decided above it, `f` the failures' outcomes by number (`s` status, `m` message),
/// `t` the leader's time of the client's last write. Numbers are keys of 16 hex digits, so key
/// order is number order. Every operation costs O(log n) plus what it removes (each entry is
/// added once and removed once), whatever the record's size.
struct ClientWriteRecord {
    private(set) var tree: Tree
    private static let c = ChildKey(unchecked: "c")
    private static let a = ChildKey(unchecked: "a")
    private static let f = ChildKey(unchecked: "f")
    private static let t = ChildKey(unchecked: "t")
    private static let s = ChildKey(unchecked: "s")
    private static let m = ChildKey(unchecked: "m")

    init(tree: Tree) { self.tree = tree }

    static func key(_ n: UInt64) -> ChildKey {
        let hex = String(n, radix: 16)
        return ChildKey(unchecked: String(repeating: "0", count: Swift.max(0, 16 - hex.count)) + hex)
    }

    private static func number(_ key: ChildKey) -> UInt64? { UInt64(key.string, radix: 16) }

    var contiguous: UInt64 {
        if case .int(let c)? = tree.child(Self.c).leaf, c > 0 { return UInt64(c) }
        return 0
    }

    private mutating func setContiguous(_ value: UInt64) {
        tree.set(Tree(.int(Int64(clamping: value))), at: Path(segments: [Self.c]))
    }

    func contains(_ n: UInt64) -> Bool { n <= contiguous || !tree.child(at: Path(segments: [Self.a, Self.key(n)])).isEmpty }

    func failure(_ n: UInt64) -> ClientWriteOutcome? {
        let entry = tree.child(at: Path(segments: [Self.f, Self.key(n)]))
        guard case .string(let status)? = entry.child(Self.s).leaf else { return nil }
        let message = entry.child(Self.m).leaf.flatMap { if case .string(let t) = $0 { t } else { nil } } ?? ""
        return ClientWriteOutcome(status: status, message: message)
    }

    /// The client acknowledged every number below `watermark`: they count as decided, and their
    /// failures are forgotten.
    mutating func acknowledge(below watermark: UInt64) {
        if watermark > contiguous + 1 { setContiguous(watermark - 1) }
        absorb()
        while let first = tree.child(Self.f).children.first, let n = Self.number(first.key), n < watermark {
            tree.set(.empty, at: Path(segments: [Self.f, first.key]))
        }
    }

    mutating func insert(_ n: UInt64) {
        guard !contains(n) else { return }
        if n == contiguous + 1 {
            setContiguous(n)
            absorb()
        } else {
            tree.set(Tree(.bool(true)), at: Path(segments: [Self.a, Self.key(n)]))
        }
    }

    mutating func setFailure(_ n: UInt64, _ outcome: ClientWriteOutcome) {
        var fields = [(Self.s, Tree(.string(outcome.status)))]
        if !outcome.message.isEmpty { fields.insert((Self.m, Tree(.string(outcome.message))), at: 0) }
        tree.set(Tree(sortedChildren: fields), at: Path(segments: [Self.f, Self.key(n)]))
    }

    /// The leader's time of the client's last write (nil for a new record).
    var lastUsed: Int64? {
        if case .int(let t)? = tree.child(Self.t).leaf { return t }
        return nil
    }

    mutating func touch(_ timestamp: Int64) {
        if case .int(let t)? = tree.child(Self.t).leaf, t >= timestamp { return }
        tree.set(Tree(.int(timestamp)), at: Path(segments: [Self.t]))
    }

    /// Moves `contiguous` over the numbers above it that follow on, and drops those it covers.
    private mutating func absorb() {
        var c = contiguous
        while let first = tree.child(Self.a).children.first, let n = Self.number(first.key), n <= c + 1 {
            tree.set(.empty, at: Path(segments: [Self.a, first.key]))
            if n == c + 1 { c = n }
        }
        if c != contiguous { setContiguous(c) }
    }
}

extension StateMachine {
    /// The system namespace of client write records, one child per client (its id in hex).
    public static let clientsNamespace = "$clients"

    static func clientKey(_ client: UInt64) -> ChildKey { ClientWriteRecord.key(client) }

    /// The outcome a client write's earlier copy had, if (client, number) was decided before:
    /// a copy that arrives after it is not applied again and is answered with that outcome.
    /// Also refuses numbers too far ahead of the client's unanswered ones (`window`).
    func clientWriteDecided(_ key: ClientWriteKey) -> Outcome? {
        if ignoresClientWrites { return nil }
        let record = ClientWriteRecord(tree: tree(Self.clientsNamespace).child(Self.clientKey(key.client)))
        if record.contains(key.number) { return .alreadyApplied(record.failure(key.number) ?? .ok) }
        // Numbers the client acknowledged count as decided (it never sends them again).
        if key.number < key.acknowledgedBelow { return .alreadyApplied(.ok) }
        let lowest = Swift.max(record.contiguous, key.acknowledgedBelow &- 1)
        if key.number > lowest &+ ClientWriteKey.window {
            // Rejected, not `refused` (which is about the connection: it ends it).
            return .rejected(
                TreeError(
                    .inputTooLarge, path: "/",
                    "write number \(key.number) is more than \(ClientWriteKey.window) past the client's lowest unanswered write (\(lowest &+ 1))"))
        }
        return nil
    }

    /// Records that (client, number) was decided with `outcome` (a failure's status and message
    /// are kept until the client acknowledges the number).
    mutating func recordClientWrite(_ key: ClientWriteKey, _ outcome: Outcome, at timestamp: Int64) {
        var namespace = namespaces.removeValue(forKey: Self.clientsNamespace) ?? .empty
        defer { namespaces[Self.clientsNamespace] = namespace }
        let child = Self.clientKey(key.client)
        var record = ClientWriteRecord(tree: namespace.child(child))
        let lastUse = record.lastUsed
        record.acknowledge(below: key.acknowledgedBelow)
        record.insert(key.number)
        if let failure = Self.clientFailure(outcome) { record.setFailure(key.number, failure) }
        record.touch(timestamp)
        namespace.set(record.tree, at: Path(segments: [child]))
        if let used = record.lastUsed { indexClientUse(key.client, old: lastUse, new: used) }
    }

    /// Drops every client write record (the `forget-client-writes-on-load` sabotage only: a
    /// state machine that lost them would decide a resent write twice).
    public mutating func forgetClientWrites() {
        namespaces[Self.clientsNamespace] = nil
        clientIdleIndex = SortedTree()
    }

    /// The remembered form of an outcome that is not a success (nil for `.ok`).
    static func clientFailure(_ outcome: Outcome) -> ClientWriteOutcome? {
        func clip(_ s: String) -> String {
            guard s.utf8.count > ClientWriteOutcome.maxMessageBytes else { return s }
            var out = ""
            for ch in s {
                if out.utf8.count + String(ch).utf8.count > ClientWriteOutcome.maxMessageBytes { break }
                out.append(ch)
            }
            return out
        }
        switch outcome {
        case .ok: return nil
        case .alreadyApplied(let earlier): return earlier.status == "ok" ? nil : earlier
        case .datastale: return ClientWriteOutcome(status: "datastale", message: "The transaction's hash does not match the current data.")
        case .permissionDenied: return ClientWriteOutcome(status: "permission_denied", message: "Permission denied")
        case .rejected(let e): return ClientWriteOutcome(status: "failure", message: clip(e.message))
        case .refused(let reason): return ClientWriteOutcome(status: "failure", message: clip(reason))
        case .noSpace(let nodes): return ClientWriteOutcome(status: "failure", message: clip(Outcome.noSpaceMessage(nodes)))
        case let .overQuota(namespace, used, wouldHold, quota):
            return ClientWriteOutcome(status: "failure", message: clip(Outcome.overQuotaMessage(namespace: namespace, used: used, wouldHold: wouldHold, quota: quota)))
        case .malformed: return ClientWriteOutcome(status: "failure", message: "The write could not be decoded by the state machine.")
        case .duplicate, .outOfOrder: return nil
        }
    }
}
