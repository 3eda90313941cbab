public import BanyanOpLogFiles
public import BanyanStateMachine

/// What a backup holds of a node's state, and the replay of an archived log over it
/// (docs/backup.md). Pure: the server streams the image, `banyan restore` drives the replay.
public enum BackupImage {
    /// Namespaces a backup leaves out: they describe the source cluster's nodes (peer and client
    /// addresses, free-space alarms), not the data, and would be wrong in a restored cluster.
    public static let excludedNamespaces: Set<String> = [NodeCore.clusterNamespace, StateMachine.alarmsNamespace]

    /// The machine as a backup stores it: everything but `excludedNamespaces`. A copy of a
    /// value: the trees are shared, nothing is copied whole.
    public static func forBackup(_ m: StateMachine) -> StateMachine {
        StateMachine(
            namespaces: m.namespaces.filter { !excludedNamespaces.contains($0.key) }, appliedIndex: m.appliedIndex,
            sessions: m.sessions, lastTimestamp: m.lastTimestamp, disconnects: m.disconnects, leases: m.leases,
            expiredHolders: m.expiredHolders)
    }
}

/// Where a point-in-time restore stops.
public enum RestoreTarget: Sendable, Equatable, CustomStringConvertible {
    /// Everything the archive holds.
    case latest
    /// Up to and including this index.
    case index(UInt64)
    /// Every entry before the first command the leader stamped after this time (ms since the
    /// epoch); entries without a timestamp (no-ops, membership changes) go with what precedes them.
    case time(Int64)

    public var description: String {
        switch self {
        case .latest: "the end of the archive"
        case .index(let i): "index \(i)"
        case .time(let t): "time \(t) ms"
        }
    }
}

public struct RestoreError: Error, Sendable, Equatable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Replays archived committed entries over a backup's state, in order, up to a target, exactly
/// as every replica applies them (`StateMachine.apply`, `skip`).
public struct RestoreReplay {
    public private(set) var machine: StateMachine
    /// The term of the last entry applied (the backup's term before any).
    public private(set) var term: UInt64
    public let target: RestoreTarget
    /// The target was reached: later entries are not applied.
    public private(set) var reachedTarget = false
    public private(set) var applied = 0

    public init(machine: StateMachine, term: UInt64, target: RestoreTarget) throws(RestoreError) {
        self.machine = machine
        self.term = term
        self.target = target
        // `nextIndex` and the gap check add one to it: a (forged) backup at the largest index
        // has no entry after it.
        guard machine.appliedIndex < UInt64.max else {
            throw RestoreError("the backup claims index \(machine.appliedIndex), the largest possible: it is not a state a cluster can have")
        }
        if case .index(let i) = target {
            guard i >= machine.appliedIndex else {
                throw RestoreError("the backup is at index \(machine.appliedIndex), after the target index \(i): use an older backup")
            }
            reachedTarget = i == machine.appliedIndex
        }
        if case .time(let t) = target, machine.lastTimestamp > t {
            throw RestoreError(
                "the backup's last write was stamped at \(machine.lastTimestamp) ms, after the target time \(t) ms: use an older backup")
        }
    }

    /// The next index the replay needs.
    public var nextIndex: UInt64 { machine.appliedIndex + 1 }

    /// Applies one entry; entries the backup already covers are skipped. Returns false (and
    /// applies nothing) once the target is reached.
    @discardableResult
    public mutating func apply(_ entry: ArchivedEntry) throws(RestoreError) -> Bool {
        if reachedTarget { return false }
        if entry.index <= machine.appliedIndex { return true }
        guard entry.index == machine.appliedIndex + 1 else {
            throw RestoreError("the archive is missing entries \(machine.appliedIndex + 1) to \(entry.index - 1)")
        }
        if case .time(let t) = target, entry.kind == .command, let stamp = CommandEnvelope.timestamp(of: entry.payload), stamp > t {
            reachedTarget = true
            return false
        }
        switch entry.kind {
        case .command: _ = machine.apply(entry.payload, index: entry.index)
        case .noop, .config: machine.skip(index: entry.index)
        }
        term = max(term, entry.term)
        applied += 1
        if case .index(let i) = target, entry.index >= i { reachedTarget = true }
        return true
    }

    /// Whether the replay ended where it was asked to: an index target must have been reached
    /// exactly (a time target or `latest` ends wherever the archive does), and below the largest
    /// index: the restored node appends its first entry (a new leader's no-op) after the last
    /// one applied, so a (forged) archive whose replay ends at the largest index would make a
    /// node that fails on its first election.
    public func checkEnded() throws(RestoreError) {
        guard machine.appliedIndex < UInt64.max else {
            throw RestoreError(
                "the archive's replay ends at index \(machine.appliedIndex), the largest possible: a restored node could append nothing after it (the archive is not a cluster's history)")
        }
        if case .index(let i) = target, machine.appliedIndex != i {
            throw RestoreError("the archive ends at index \(machine.appliedIndex), before the target index \(i)")
        }
    }

    /// How far above the source's terms a restored cluster's terms start (2^32).
    public static let restoredTermOffset: UInt64 = 1 << 32

    /// The term the restored node starts in: the last replayed term plus `restoredTermOffset`.
    /// A restored cluster's history is a new one that shares the source's indexes: starting its
    /// terms far above anything the source reached keeps its (index, term) pairs from ever
    /// equalling the source's, which is how `banyan backup --follow` tells, from a node's 410
    /// answer alone, whether the node's history continues an archive (docs/backup.md).
    public func restoredTerm() throws(RestoreError) -> UInt64 {
        let (jumped, overflow) = term.addingReportingOverflow(Self.restoredTermOffset)
        guard !overflow, jumped < UInt64.max - Self.restoredTermOffset else {
            throw RestoreError("the backup or archive names term \(term): too large for a restored cluster's terms (it is not a cluster's history)")
        }
        return jumped
    }
}
