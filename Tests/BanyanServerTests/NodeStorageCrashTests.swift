import BanyanOpLog
import BanyanOpLogFiles
import BanyanRaft
import BanyanNode
@testable import BanyanServer
import BanyanStateMachine
import BanyanTree
import Logging
import Testing

/// The node's snapshot install path (`NodeStorage.persist` with a received snapshot: chunks
/// written, the file verified, installed by rename, the log compacted or reset, entries and
/// hard state after it) crashed at every file-system operation, rebooted with each policy for
/// unsynced bytes, and loaded again as a restart would.
@Suite struct NodeStorageCrashTests {
    static let logger = Logger(label: "storage-crash-test") { _ in SwiftLogNoOpLogHandler() }

    /// How much of each file's unsynced bytes a reboot keeps.
    static let keepPolicies: [(String, @Sendable (String, Int) -> Int)] = [
        ("none", { _, _ in 0 }), ("all", { _, n in n }), ("half", { _, n in n / 2 }),
    ]

    static func tree(_ text: String) throws -> Tree {
        try TreeReader.read(Array(text.utf8), at: .root)
    }

    /// A node with entries 1...12 (term 1) durable, and the raw snapshot file a leader would send
    /// for index 20, term 2.
    static func setUp(_ fs: SimulatedFileSystem, leaderMachine: StateMachine) throws -> (NodeStorage, [UInt8]) {
        let storage = try NodeStorage(directory: "/node", fileSystem: fs, logger: logger) { _ in }
        try storage.bootstrap(members: [1, 2, 3])
        var rd = Ready()
        rd.entries = (2...12).map { LogEntry(index: $0, term: 1, kind: .command, data: Array("old-\($0)".utf8)) }
        rd.hardState = HardState(term: 1, vote: 1, commit: 12, mayVote: true)
        _ = try storage.persist(rd)
        // The leader's snapshot file, made by a store elsewhere on the same disk.
        let leader = try SnapshotStore(directory: "/node/leader-snapshots", fileSystem: fs)
        let metadata = SnapshotMetaRecord(
            lastIndex: 20, lastTerm: 2, membership: NodeStorage.encodeMembership(Membership(voters: [1, 2, 3])))
        try leader.write(metadata) { emit in try leaderMachine.writeImage(chunkBytes: 64, emit: emit) }
        let file = try fs.readAll("/node/leader-snapshots/" + SnapshotFormat.fileName(lastIndex: 20))
        return (storage, file)
    }

    static func installReady(_ file: [UInt8]) -> Ready {
        let meta = SnapshotMeta(index: 20, term: 2, membership: Membership(voters: [1, 2, 3]))
        var rd = Ready()
        // In two chunks, as the leader streams it.
        let half = file.count / 2
        rd.snapshotChunks = [
            IncomingSnapshotChunk(meta: meta, offset: 0, data: Array(file[0..<half])),
            IncomingSnapshotChunk(meta: meta, offset: UInt64(half), data: Array(file[half...])),
        ]
        rd.snapshot = meta
        rd.entries = [LogEntry(index: 21, term: 2, kind: .command, data: Array("new-21".utf8))]
        rd.hardState = HardState(term: 2, vote: 0, commit: 21, mayVote: true)
        return rd
    }

    @Test("a crash at every operation of a snapshot install loads the old state or the new one, never a mix, never refused")
    func crashDuringInstall() throws {
        var leaderMachine = StateMachine()  // applied through 20
        for i in 1...20 {
            let envelope = CommandEnvelope(
                session: 7, seq: UInt64(i), timestamp: 1, command: .set(path: "/k\(i % 11)", json: Array("{\"v\":\(i)}".utf8)))
            _ = leaderMachine.apply(envelope.encoded(), index: UInt64(i))
        }
        let expectedTree = leaderMachine.tree("")

        let probe = SimulatedFileSystem(durableDirectories: ["/"])
        let (probeStorage, file) = try Self.setUp(probe, leaderMachine: leaderMachine)
        let before = probe.operations
        probe.mostUnsyncedRemovals = 0
        _ = try probeStorage.persist(Self.installReady(file))
        #expect(probe.mostUnsyncedRemovals <= 1, "\(probe.mostUnsyncedRemovals) removals unsynced at once")
        let span = probe.operations - before
        #expect(span > 8)

        var outcomes: [String: Int] = [:]
        for crashAt in 1...(span + 1) {
            for (policy, keep) in Self.keepPolicies {
                let fs = SimulatedFileSystem(durableDirectories: ["/"])
                let (storage, raw) = try Self.setUp(fs, leaderMachine: leaderMachine)
                fs.crashAtOperation = fs.operations + crashAt
                var finished = false
                do {
                    _ = try storage.persist(Self.installReady(raw))
                    finished = true
                } catch {}
                fs.reboot(keepUnsynced: keep)
                let context = "crash at \(crashAt) of \(span), keep \(policy)"
                #expect(finished || crashAt <= span, "\(context): the install failed without a crash")
                let loaded: NodeStorage.Loaded
                let reopened: NodeStorage
                do {
                    reopened = try NodeStorage(directory: "/node", fileSystem: fs, logger: Self.logger) { _ in }
                    loaded = try reopened.load { _ in }
                } catch {
                    Issue.record("\(context): the restart was refused: \(error)")
                    continue
                }
                let snapshot = loaded.persisted.snapshot.index
                let indexes = loaded.persisted.entries.map(\.index)
                // The log always continues the snapshot, without gaps.
                #expect(indexes == Array((snapshot + 1)..<(snapshot + 1 + UInt64(indexes.count))), "\(context): \(indexes)")
                if snapshot == 0 {
                    // The old state: everything that was durable before the install is intact.
                    #expect(Array(indexes.prefix(12)) == Array(1...12) as [UInt64], "\(context)")
                    #expect(loaded.machine.appliedIndex == 0, "\(context)")
                    outcomes["old", default: 0] += 1
                } else {
                    #expect(snapshot == 20, "\(context)")
                    #expect(loaded.machine.appliedIndex == 20, "\(context)")
                    #expect(loaded.machine.tree("") == expectedTree, "\(context)")
                    #expect(indexes.allSatisfy { $0 == 21 }, "\(context): \(indexes)")
                    outcomes["new", default: 0] += 1
                }
                #expect(loaded.persisted.hardState.term >= 1, "\(context)")
                if finished {
                    #expect(snapshot == 20 && indexes == [21] && loaded.persisted.hardState.term == 2, "\(context)")
                }
                // The restarted node can go on: its log takes the next entry.
                var next = Ready()
                next.entries = [LogEntry(index: snapshot + UInt64(indexes.count) + 1, term: 3, kind: .noop)]
                #expect(throws: Never.self, "\(context)") { _ = try reopened.persist(next) }
            }
        }
        // Both sides of the rename were reached.
        #expect((outcomes["old"] ?? 0) > 0 && (outcomes["new"] ?? 0) > 0, "\(outcomes)")
    }
}
