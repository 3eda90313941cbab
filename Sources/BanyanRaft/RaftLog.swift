/// The in-memory view of a node's log: a snapshot boundary, the entries after it, and the
/// commit, apply and stability marks. Everything here is mirrored on disk by the driver from
/// `Ready.entries` and `Ready.snapshot`.
struct RaftLog: Sendable {
    /// The last entry covered by the snapshot (index 0, term 0 when none).
    private(set) var snapshot: SnapshotMeta
    /// Entries after `snapshot.index`; `entries[k].index == snapshot.index + 1 + k`.
    private(set) var entries: [LogEntry]
    /// Highest index known committed (never decreases).
    private(set) var committed: UInt64
    /// Highest index handed to the state machine.
    var applied: UInt64
    /// Highest index the driver has made durable.
    var stable: UInt64

    init(_ persisted: PersistedState) {
        snapshot = persisted.snapshot
        entries = persisted.entries
        committed = max(persisted.hardState.commit, persisted.snapshot.index)
        applied = persisted.snapshot.index
        stable = persisted.snapshot.index + UInt64(persisted.entries.count)
    }

    @inline(__always) var firstIndex: UInt64 { snapshot.index + 1 }
    @inline(__always) var lastIndex: UInt64 { snapshot.index + UInt64(entries.count) }
    var lastTerm: UInt64 { entries.last?.term ?? snapshot.term }

    /// The term of the entry at `index`, or nil when it was compacted away or does not exist.
    @inline(__always) func term(at index: UInt64) -> UInt64? {
        if index == snapshot.index { return snapshot.term }
        guard index > snapshot.index, index <= lastIndex else { return nil }
        return entries[Int(index - snapshot.index - 1)].term
    }

    func entry(at index: UInt64) -> LogEntry? {
        guard index > snapshot.index, index <= lastIndex else { return nil }
        return entries[Int(index - snapshot.index - 1)]
    }

    func matchTerm(_ index: UInt64, _ term: UInt64) -> Bool { self.term(at: index) == term }

    /// The election restriction (§5.4.1, R6): last term first, then index.
    func isUpToDate(lastIndex candidateIndex: UInt64, lastTerm candidateTerm: UInt64) -> Bool {
        candidateTerm > lastTerm || (candidateTerm == lastTerm && candidateIndex >= lastIndex)
    }

    /// Entries in `[from, through]` (clamped to the log), at most `maxBytes` of them but always
    /// at least one. Nil when `from` was compacted away.
    func slice(from: UInt64, through: UInt64, maxBytes: Int) -> [LogEntry]? {
        guard from > snapshot.index else { return nil }
        let upper = min(through, lastIndex)
        guard from <= upper else { return [] }
        let start = Int(from - snapshot.index - 1)
        var end = start
        var bytes = 0
        let limit = Int(upper - snapshot.index)
        while end < limit {
            bytes += entries[end].size
            if bytes > maxBytes && end > start { break }
            end += 1
        }
        return Array(entries[start..<end])
    }

    /// Appends entries that start right after the current last index (leader path).
    mutating func append(_ new: [LogEntry]) {
        entries.append(contentsOf: new)
    }

    /// The first index among `new` whose term differs from the log (0 when all match, or when
    /// every new entry is already present).
    func findConflict(_ new: [LogEntry]) -> UInt64 {
        for e in new where !matchTerm(e.index, e.term) {
            return e.index
        }
        return 0
    }

    /// Follower path: appends after a successful consistency check at (prevIndex, prevTerm).
    /// Returns the index of the last new entry, or nil when the check fails. A conflicting suffix
    /// is truncated; committed entries are never truncated (a conflict there is reported).
    /// `checkPrevTerm` is false only under `Sabotage.skipConsistencyCheck` (the index is still
    /// checked), `checkNumbering` only under `Sabotage.uncheckedLogShape`.
    mutating func maybeAppend(
        prevIndex: UInt64, prevTerm: UInt64, commit: UInt64, entries new: [LogEntry], checkPrevTerm: Bool = true, checkNumbering: Bool = true
    )
        -> (lastNew: UInt64, truncatedCommitted: Bool)?
    {
        guard checkPrevTerm ? matchTerm(prevIndex, prevTerm) : term(at: prevIndex) != nil else { return nil }
        // Peer input: entries must be numbered prevIndex+1, prevIndex+2, … (the node drops a
        // malformed append before it gets here; this keeps the log safe on its own, since the
        // arithmetic below relies on it).
        for (k, e) in new.enumerated() where checkNumbering && e.index != prevIndex &+ 1 &+ UInt64(k) { return nil }
        let lastNew = prevIndex + UInt64(new.count)
        let conflict = findConflict(new)
        if conflict != 0 {
            if conflict <= committed { return (lastNew, true) }
            let keep = Int(conflict - snapshot.index - 1)
            if keep < entries.count { entries.removeSubrange(keep...) }
            stable = min(stable, conflict - 1)
            let from = Int(conflict - new[0].index)
            entries.append(contentsOf: new[from...])
        }
        commitTo(min(commit, lastNew))
        return (lastNew, false)
    }

    mutating func commitTo(_ index: UInt64) {
        if index > committed {
            committed = min(index, lastIndex)
        }
    }

    /// The largest index ≤ `index` whose term is ≤ `term`, with its term (fast back-off, R12).
    /// Stops at the snapshot boundary (term 0 when unknown).
    func findConflictByTerm(index: UInt64, term: UInt64) -> (index: UInt64, term: UInt64) {
        var i = min(index, lastIndex)
        while true {
            guard let t = self.term(at: i) else { return (i, 0) }
            if t <= term || i == 0 { return (i, t) }
            i -= 1
        }
    }

    /// Drops entries through `meta.index` after the state machine took a snapshot there.
    mutating func compact(to meta: SnapshotMeta) {
        guard meta.index > snapshot.index else { return }
        let drop = min(Int(meta.index - snapshot.index), entries.count)
        entries.removeFirst(drop)
        snapshot = meta
    }

    /// Replaces everything with a received snapshot (the follower's log did not contain it).
    mutating func restore(_ meta: SnapshotMeta) {
        snapshot = meta
        entries = []
        committed = meta.index
        applied = meta.index
        stable = meta.index
    }
}
