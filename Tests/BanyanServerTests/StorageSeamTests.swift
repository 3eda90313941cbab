import BanyanOpLog
import BanyanOpLogFiles
import BanyanRaft
import BanyanNode
@testable import BanyanServer
import BanyanStateMachine
import Logging
import Testing

/// The seam between the Raft core and the node's storage (issue 14, items 1 and 2), crashed at
/// every file-system operation over the simulated file system and loaded as a restart would.
@Suite struct StorageSeamTests {
    static let logger = Logger(label: "storage-seam-test") { _ in SwiftLogNoOpLogHandler() }
    static let configuration = RaftConfiguration(id: 3, seed: 3)

    static func command(_ index: UInt64, _ term: UInt64) -> BanyanRaft.LogEntry {
        BanyanRaft.LogEntry(index: index, term: term, kind: .command, data: Array("c\(index)".utf8))
    }

    /// A lagging voter (node 3 of {1,2,3}) holding only the founding configuration.
    static func lagging(_ fs: SimulatedFileSystem) throws -> NodeStorage {
        let storage = try NodeStorage(directory: "/node", fileSystem: fs, logger: logger) { _ in }
        try storage.bootstrap(members: [1, 2, 3])
        return storage
    }

    /// One append carrying two configuration entries (voters {1,2,3} → +4 → +5) with a commit
    /// that covers both (the leader committed the second while this voter lagged), as the lagging
    /// voter receives it.
    static var twoConfigurations: Ready {
        var rd = Ready()
        rd.entries = [
            command(2, 2),
            BanyanRaft.LogEntry(index: 3, term: 2, kind: .config(Membership(voters: [1, 2, 3, 4]))),
            command(4, 2),
            BanyanRaft.LogEntry(index: 5, term: 2, kind: .config(Membership(voters: [1, 2, 3, 4, 5]))),
            command(6, 2),
        ]
        rd.hardState = BanyanRaft.HardState(term: 2, vote: 0, commit: 5, mayVote: true)
        rd.committedEntries = Array(rd.entries.prefix(4))
        return rd
    }

    @Test("item 1: a crash at any point of an append carrying two configurations never restarts on the older membership while holding the newer entry")
    func configurationRule() throws {
        let probe = SimulatedFileSystem(durableDirectories: ["/"])
        let probeStorage = try Self.lagging(probe)
        let before = probe.operations
        _ = try probeStorage.persist(Self.twoConfigurations)
        let span = probe.operations - before
        var sawSecond = 0
        for crashAt in 1...(span + 1) {
            for keep in [false, true] {
                let fs = SimulatedFileSystem(durableDirectories: ["/"])
                let storage = try Self.lagging(fs)
                fs.crashAtOperation = fs.operations + crashAt
                _ = try? storage.persist(Self.twoConfigurations)
                fs.reboot(keepUnsynced: { _, n in keep ? n : 0 })
                let context = "crash at \(crashAt) of \(span), keep unsynced \(keep)"
                let reopened = try NodeStorage(directory: "/node", fileSystem: fs, logger: Self.logger) { _ in }
                let loaded = try reopened.load { _ in }
                let node = try RaftNode(configuration: Self.configuration, restoring: loaded.persisted)
                let holdsSecond = loaded.persisted.entries.contains { $0.index == 5 }
                if holdsSecond {
                    sawSecond += 1
                    // The entry before it, configuration {1,2,3,4}, is committed on disk.
                    #expect(loaded.persisted.hardState.commit >= 3, "\(context): commit \(loaded.persisted.hardState.commit)")
                    let expected: [NodeID] = loaded.persisted.hardState.commit >= 5 ? [1, 2, 3, 4, 5] : [1, 2, 3, 4]
                    #expect(node.membership.voters == expected, "\(context): \(node.membership)")
                }
            }
        }
        // Some crash points leave the second configuration durable but not yet committed on disk.
        #expect(sawSecond > 2, "too few crash points left the second configuration durable: \(sawSecond)")
    }

    @Test("item 2: the hard state saved at shutdown never commits an entry the disk holds only in a replaced version")
    func shutdownCommit() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/"])
        let storage = try NodeStorage(directory: "/node", fileSystem: fs, logger: Self.logger) { _ in }
        try storage.bootstrap(members: [1, 2, 3])
        // Node 3 (a follower) holds 2...5 of term 2; the leader of term 2 committed through 3.
        var rd = Ready()
        rd.entries = (2...5).map { Self.command($0, 2) }
        rd.hardState = BanyanRaft.HardState(term: 2, vote: 0, commit: 3, mayVote: true)
        _ = try storage.persist(rd)
        var node = try RaftNode(configuration: Self.configuration, restoring: try storage.load { _ in }.persisted)
        // A new leader (term 3) replaces 4 and 5 and commits through 6; the node shuts down before
        // its next Ready reaches the disk.
        let replacement = (4...6).map { Self.command($0, 3) }
        node.step(Message(from: 1, to: 3, term: 3, body: .append(prevIndex: 3, prevTerm: 2, entries: replacement, commit: 6)))
        #expect(node.commitIndex == 6)
        #expect(node.stableIndex == 3)
        try storage.saveCommit(node.durableHardState)

        let loaded = try NodeStorage(directory: "/node", fileSystem: fs, logger: Self.logger) { _ in }.load { _ in }
        // The old 4 and 5 (term 2) are on disk but were never committed: not applied after restart.
        #expect(loaded.persisted.hardState.commit == 3)
        #expect(loaded.persisted.hardState.term == 3)
    }

    @Test("item 2: a saved commit beyond the log on disk is refused at load, not clamped")
    func commitBeyondLogRefused() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/"])
        let storage = try NodeStorage(directory: "/node", fileSystem: fs, logger: Self.logger) { _ in }
        try storage.bootstrap(members: [1, 2, 3])
        var rd = Ready()
        rd.entries = (2...5).map { Self.command($0, 1) }
        rd.hardState = BanyanRaft.HardState(term: 1, vote: 0, commit: 5, mayVote: true)
        _ = try storage.persist(rd)
        // The hard state claims more than the log holds (the log lost committed records).
        let store = try HardStateStore(directory: "/node/raft", fileSystem: fs)
        try store.save(HardStateRecord(term: 1, vote: 0, commit: 9, mayVote: true))
        let reopened = try NodeStorage(directory: "/node", fileSystem: fs, logger: Self.logger) { _ in }
        #expect(throws: OpLogError.self) { _ = try reopened.load { _ in } }
        // And saveCommit never writes a commit beyond the log.
        let fs2 = SimulatedFileSystem(durableDirectories: ["/"])
        let storage2 = try NodeStorage(directory: "/node", fileSystem: fs2, logger: Self.logger) { _ in }
        try storage2.bootstrap(members: [1, 2, 3])
        try storage2.saveCommit(BanyanRaft.HardState(term: 1, vote: 0, commit: 7, mayVote: true))
        let loaded = try NodeStorage(directory: "/node", fileSystem: fs2, logger: Self.logger) { _ in }.load { _ in }
        #expect(loaded.persisted.hardState.commit == 1)
    }

    @Test("item 4: a log damaged before valid records is refused; --salvage-log cuts it and the node comes back without a vote under a new incarnation")
    func salvage() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/"])
        let storage = try NodeStorage(directory: "/node", fileSystem: fs, logger: Self.logger, newIncarnation: 0xA) { _ in }
        try storage.bootstrap(members: [1, 2, 3])
        var rd = Ready()
        rd.entries = (2...400).map { BanyanRaft.LogEntry(index: $0, term: 2, kind: .command, data: [UInt8](repeating: 7, count: 200)) }
        rd.hardState = BanyanRaft.HardState(term: 2, vote: 1, commit: 400, mayVote: true)
        rd.committedEntries = rd.entries
        _ = try storage.persist(rd)
        try storage.saveCommit(BanyanRaft.HardState(term: 2, vote: 1, commit: 400, mayVote: true))
        #expect(storage.incarnation == 0xA)
        // A sector in the middle of the segment reads back as zeros.
        let segment = try #require(try fs.list("/node/raft/log").first { $0.hasSuffix(".seg") })
        let file = try fs.open("/node/raft/log/" + segment)
        try fs.write(file, at: 40_960, [UInt8](repeating: 0, count: 4096))
        try fs.sync(file)
        fs.close(file)

        #expect(throws: OpLogError.self) { _ = try NodeStorage(directory: "/node", fileSystem: fs, logger: Self.logger, newIncarnation: 0xB) { _ in } }
        let salvaged = try NodeStorage(
            directory: "/node", fileSystem: fs, logger: Self.logger, newIncarnation: 0xB, salvageDamagedLog: true) { _ in }
        let cut = try #require(salvaged.salvaged)
        #expect(cut.highestIndexAfterDamage == 400)
        #expect(salvaged.incarnation == 0xB)
        let loaded = try salvaged.load { _ in }
        #expect(loaded.persisted.hardState.mayVote == false)
        #expect(loaded.persisted.hardState.commit == salvaged.logLastIndex)
        #expect(salvaged.logLastIndex < 400)
        var configuration = Self.configuration
        configuration.incarnation = salvaged.incarnation
        let node = try RaftNode(configuration: configuration, restoring: loaded.persisted)
        #expect(node.isVoterWithAmnesia)

        // The next start (without salvage) keeps all of that.
        let again = try NodeStorage(directory: "/node", fileSystem: fs, logger: Self.logger, newIncarnation: 0xC) { _ in }
        #expect(again.incarnation == 0xB)
        #expect(try again.load { _ in }.persisted.hardState.mayVote == false)
    }

    @Test("item 2: a shutdown between a snapshot's last chunk and its persist saves only what was durable before it")
    func shutdownDuringInstall() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/"])
        let storage = try NodeStorage(directory: "/node", fileSystem: fs, logger: Self.logger) { _ in }
        try storage.bootstrap(members: [1, 2, 3])
        // Node 3 holds 2...6 of term 2 (a divergent suffix beyond 1), committed through 1.
        var rd = Ready()
        rd.entries = (2...6).map { Self.command($0, 2) }
        rd.hardState = BanyanRaft.HardState(term: 2, vote: 0, commit: 1, mayVote: true)
        _ = try storage.persist(rd)
        var node = try RaftNode(configuration: Self.configuration, restoring: try storage.load { _ in }.persisted)
        // The leader of term 3 sends a snapshot at (5, term 3) in one chunk.
        let meta = SnapshotMeta(index: 5, term: 3, membership: Membership(voters: [1, 2, 3]))
        node.step(Message(from: 1, to: 3, term: 3, body: .snapshotChunk(meta: meta, offset: 0, data: [1, 2, 3], last: true)))
        #expect(node.snapshotMeta.index == 5)
        // Shutdown before the Ready that installs it reaches the disk.
        #expect(node.durableHardState.commit == 1)
        try storage.saveCommit(node.durableHardState)
        let loaded = try NodeStorage(directory: "/node", fileSystem: fs, logger: Self.logger) { _ in }.load { _ in }
        #expect(loaded.persisted.hardState.commit == 1, "the old 2...5 of term 2 would be applied as committed")
        // Once persisted and advanced, the snapshot counts.
        let install = node.ready()
        node.advance(install)
        #expect(node.durableHardState.commit == 5)
    }
}
