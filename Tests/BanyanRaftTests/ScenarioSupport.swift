import BanyanRaft
import BanyanStateMachine

/// Shared builders for the scenario tests: hand-made disks (term-labelled logs, as in the Raft
/// paper's figures) and small message predicates.
enum Scenario {
    /// A disk whose log holds one entry per element of `terms`, at indexes 1, 2, …. Index 1 is
    /// the founding configuration entry (its term should be 1); the others are opaque commands
    /// the state machine skips.
    static func disk(
        terms: [UInt64], term: UInt64, vote: NodeID = 0, commit: UInt64 = 1, members: [NodeID] = [1, 2, 3]
    ) -> StoredState {
        var d = StoredState()
        d.hardState = HardState(term: term, vote: vote, commit: commit, mayVote: true)
        d.entries = terms.enumerated().map { i, t in
            let index = UInt64(i + 1)
            if i == 0 { return LogEntry(index: index, term: t, kind: .config(Membership(voters: members))) }
            return LogEntry(index: index, term: t, kind: .command, data: [0xEE, UInt8(truncatingIfNeeded: index), UInt8(truncatingIfNeeded: t)])
        }
        return d
    }

    /// A cluster whose node `i + 1` starts from `logs[i]` with hard-state term `terms[i]`.
    static func cluster(
        logs: [[UInt64]], terms: [UInt64], votes: [NodeID]? = nil, commit: UInt64 = 1,
        configure: (inout RaftConfiguration) -> Void = { _ in }
    ) throws -> TestCluster {
        var c = try TestCluster(voters: logs.count, configure: configure)
        let members = (1...UInt64(logs.count)).map { $0 }
        for (i, log) in logs.enumerated() {
            let d = disk(terms: log, term: terms[i], vote: votes?[i] ?? 0, commit: commit, members: members)
            try c.replace(UInt64(i + 1), disk: d)
        }
        return c
    }

    /// Ticks every node once at a time until `done` holds (at most `limit` rounds); returns the
    /// number of rounds taken, or nil.
    @discardableResult
    static func tickUntil(_ c: inout TestCluster, limit: Int = 500, _ done: (TestCluster) -> Bool) -> Int? {
        if done(c) { return 0 }
        for round in 1...limit {
            c.tickAll()
            if done(c) { return round }
        }
        return nil
    }

    /// Applied values of registers 0..<keys on a node.
    static func values(_ c: TestCluster, _ id: NodeID, keys: Int) -> [Int64?] {
        (0..<keys).map { c.node(id)?.machine.value($0) }
    }
}

extension Message {
    var isAppend: Bool { if case .append = body { true } else { false } }
    var appendEntries: [LogEntry] { if case .append(_, _, let e, _) = body { e } else { [] } }
    var isHeartbeat: Bool { if case .heartbeat = body { true } else { false } }
    var isVote: Bool { if case .vote = body { true } else { false } }
    var isPreVote: Bool { if case .preVote = body { true } else { false } }
    var isSnapshotChunk: Bool { if case .snapshotChunk = body { true } else { false } }
    var isAppendRejected: Bool { if case .appendRejected = body { true } else { false } }
    /// The grant of a vote response, or nil for other messages.
    var voteGranted: Bool? { if case .voteResponse(let g) = body { g } else { nil } }
    var preVoteGranted: Bool? { if case .preVoteResponse(let g) = body { g } else { nil } }
}

extension TestCluster {
    /// Messages delivered since position `from` of `delivered`.
    func delivered(since from: Int) -> [Message] { Array(delivered[from...]) }
}
