import BanyanNode
import BanyanOpLog
import BanyanOpLogFiles
import BanyanRaft
import Logging
import Testing

/// The data directory's incarnation (R22, issue 14 item 3): created when the directory is blank,
/// durable before anything else is stored, read back unchanged at every later start; and the
/// membership records that carry incarnations, old records included.
@Suite struct NodeStorageIncarnationTests {
    static let logger = Logger(label: "incarnation-test") { _ in SwiftLogNoOpLogHandler() }

    static func open(_ fs: SimulatedFileSystem, _ newIncarnation: UInt64) throws -> NodeStorage {
        try NodeStorage(directory: "/node", fileSystem: fs, logger: logger, newIncarnation: newIncarnation) { _ in }
    }

    @Test("a blank directory takes the caller's incarnation; once it holds state, every restart reads the same one back")
    func createdOnceAndStable() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/"])
        let first = try Self.open(fs, 0xA)
        #expect(first.incarnation == 0xA)
        #expect(first.isBlank)
        try first.bootstrap(members: [1, 2, 3])
        for next: UInt64 in [0xB, 0xC, 0] {
            fs.reboot()
            let again = try Self.open(fs, next)
            #expect(again.incarnation == 0xA)
            #expect(!again.isBlank)
            _ = try again.load { _ in }
        }
    }

    @Test("a directory still blank at the next start (nothing was stored since its incarnation was written) keeps it; without the pristine marker it takes the new value")
    func blankAgainKeepsPristineIncarnation() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/"])
        #expect(try Self.open(fs, 0xA).incarnation == 0xA)
        #expect(fs.exists("/node/raft/pristine"))
        fs.reboot()
        // It stored nothing: no vote, no record, no acknowledgement can depend on it, and a
        // leader that heard 0xA and added it under 0xA still names this directory.
        #expect(try Self.open(fs, 0xB).incarnation == 0xA)
        fs.reboot()
        #expect(try Self.open(fs, 0).incarnation == 0xA)
        // Without the marker (an operator's partial wipe, or a crash after its removal) the
        // directory cannot prove it stored nothing: a new value.
        try fs.remove("/node/raft/pristine")
        try fs.syncDirectory("/node/raft")
        fs.reboot()
        #expect(try Self.open(fs, 0xC).incarnation == 0xC)
        fs.reboot()
        #expect(try Self.open(fs, 0xD).incarnation == 0xC)
        // A malformed incarnation file beside the marker: a new value, never a refusal.
        fs.corrupt("/node/raft/incarnation", at: 9)
        fs.reboot()
        #expect(try Self.open(fs, 0xE).incarnation == 0xE)
    }

    @Test("the first write of a pristine directory removes its marker durably first; a partial wipe after that takes a new incarnation")
    func firstWriteLeavesPristine() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/"])
        let storage = try Self.open(fs, 0xA)
        try storage.bootstrap(members: [1, 2, 3])
        #expect(!fs.exists("/node/raft/pristine"))
        fs.reboot()
        #expect(try Self.open(fs, 0xB).incarnation == 0xA)
        // An open by a caller without incarnations (0) of a pristine directory keeps the marker
        // only until the first write.
        let other = SimulatedFileSystem(durableDirectories: ["/"])
        _ = try Self.open(other, 0xA)
        other.reboot()
        let legacyCaller = try Self.open(other, 0)
        #expect(legacyCaller.incarnation == 0xA)
        try legacyCaller.bootstrap(members: [1])
        #expect(!other.exists("/node/raft/pristine"))
        // A marker left beside stored state (copied in by hand) is removed at the next open.
        let stray = try other.create("/node/raft/pristine")
        other.close(stray)
        try other.syncDirectory("/node/raft")
        other.reboot()
        #expect(try Self.open(other, 0xB).incarnation == 0xA)
        #expect(!other.exists("/node/raft/pristine"))

        // The operator deletes the log and hard state but not the incarnation file.
        for name in try fs.list("/node/raft/log") { try fs.remove("/node/raft/log/" + name) }
        try fs.remove("/node/raft/hardstate")
        try fs.syncDirectory("/node/raft/log")
        try fs.syncDirectory("/node/raft")
        fs.reboot()
        let wiped = try Self.open(fs, 0xC)
        #expect(wiped.isBlank)
        #expect(wiped.incarnation == 0xC)

        // A crash at every operation of the first write of a pristine directory: whenever the
        // restart finds state, the marker is gone (it never keeps an incarnation it wrote to).
        let probe = SimulatedFileSystem(durableDirectories: ["/"])
        _ = try Self.open(probe, 0xA)
        let opened = probe.operations
        try Self.open(probe, 0xA).bootstrap(members: [1])
        let span = probe.operations - opened
        var outcomes: Set<String> = []
        for crashAt in 1...(span + 1) {
            for keepAll in [false, true] {
                let fs = SimulatedFileSystem(durableDirectories: ["/"])
                _ = try Self.open(fs, 0xA)
                fs.reboot()
                let start = fs.operations
                fs.crashAtOperation = start + crashAt
                do { try Self.open(fs, 0xB).bootstrap(members: [1]) } catch {}
                fs.reboot(keepUnsynced: keepAll ? { _, n in n } : { _, _ in 0 })
                let context = "crash at \(crashAt) of \(span), keep \(keepAll ? "all" : "none")"
                let marker = fs.exists("/node/raft/pristine")
                let reopened = try Self.open(fs, 0xC)
                if reopened.isBlank {
                    #expect(reopened.incarnation == (marker ? 0xA : 0xC), "\(context)")
                    outcomes.insert(marker ? "blank, kept" : "blank, new")
                } else {
                    #expect(!marker, "\(context): state stored beside the pristine marker")
                    #expect(reopened.incarnation == 0xA, "\(context)")
                    outcomes.insert("state")
                }
            }
        }
        #expect(outcomes.contains("blank, kept") && outcomes.contains("state"), "\(outcomes)")
    }

    @Test("a directory that holds state but no incarnation file is legacy (0); a malformed file is refused as corrupt")
    func legacyAndMalformed() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/"])
        let legacy = try Self.open(fs, 0)
        #expect(legacy.incarnation == 0)
        try legacy.bootstrap(members: [1])
        fs.reboot()
        #expect(!fs.exists("/node/raft/incarnation"))
        #expect(try Self.open(fs, 0xB).incarnation == 0)

        let damaged = SimulatedFileSystem(durableDirectories: ["/"])
        try Self.open(damaged, 0xA).bootstrap(members: [1])
        damaged.corrupt("/node/raft/incarnation", at: 9)
        damaged.reboot()
        #expect {
            try Self.open(damaged, 0xB)
        } throws: { error in
            (error as? OpLogError)?.code == .corrupt
        }
        // Cut short, or empty: also corrupt.
        for cut in [0, 8, 19] {
            let fs = SimulatedFileSystem(durableDirectories: ["/"])
            try Self.open(fs, 0xA).bootstrap(members: [1])
            let bytes = try fs.readAll("/node/raft/incarnation")
            let file = try fs.create("/node/raft/incarnation")
            try fs.append(file, Array(bytes.prefix(cut)))
            try fs.sync(file)
            fs.close(file)
            #expect {
                try Self.open(fs, 0xB)
            } throws: { error in
                (error as? OpLogError)?.code == .corrupt
            }
        }
    }

    @Test("a crash at every file-system operation of a first start and bootstrap leaves a blank directory or one holding its incarnation, never state without it")
    func crashDuringCreation() throws {
        let probe = SimulatedFileSystem(durableDirectories: ["/"])
        try Self.open(probe, 0xA).bootstrap(members: [1, 2, 3])
        let span = probe.operations
        #expect(span > 5)
        var outcomes: [String: Int] = [:]
        for crashAt in 1...(span + 1) {
            for keepAll in [false, true] {
                let fs = SimulatedFileSystem(durableDirectories: ["/"])
                fs.crashAtOperation = crashAt
                var finished = false
                do {
                    try Self.open(fs, 0xA).bootstrap(members: [1, 2, 3])
                    finished = true
                } catch {}
                fs.reboot(keepUnsynced: keepAll ? { _, n in n } : { _, _ in 0 })
                let context = "crash at \(crashAt) of \(span), keep \(keepAll ? "all" : "none")"
                let markerBefore = fs.exists("/node/raft/pristine")
                let reopened: NodeStorage
                do {
                    reopened = try Self.open(fs, 0xB)
                    _ = try reopened.load { _ in }
                } catch {
                    Issue.record("\(context): the restart was refused: \(error)")
                    continue
                }
                if reopened.isBlank {
                    #expect(!finished, "\(context)")
                    // Kept only when the first start got as far as the marker (it was pristine).
                    #expect(reopened.incarnation == (markerBefore ? 0xA : 0xB), "\(context)")
                    outcomes["blank", default: 0] += 1
                } else {
                    #expect(reopened.incarnation == 0xA, "\(context): state without its incarnation")
                    outcomes["kept", default: 0] += 1
                }
            }
        }
        #expect(outcomes["blank", default: 0] > 0 && outcomes["kept", default: 0] > 0, "\(outcomes)")
    }

    @Test("membership records: without incarnations the bytes are the old layout; with them they round-trip; old records decode; damage is corrupt")
    func membershipRecords() throws {
        let plain = Membership(voters: [1, 2, 3], learners: [4])
        let u64 = { (v: UInt64) in (0..<8).map { UInt8(truncatingIfNeeded: v >> UInt64(8 * $0)) } }
        let old = u64(3) + u64(1) + u64(2) + u64(3) + u64(1) + u64(4)
        #expect(NodeStorage.encodeMembership(plain) == old)
        #expect(try NodeStorage.decodeMembership(old) == plain)
        let recorded = Membership(voters: [1, 2, 3], learners: [4], incarnations: [4: 0xB0B, 1: UInt64.max])
        let bytes = NodeStorage.encodeMembership(recorded)
        #expect(bytes == old + u64(2) + u64(1) + u64(UInt64.max) + u64(4) + u64(0xB0B))
        #expect(try NodeStorage.decodeMembership(bytes) == recorded)
        #expect(try NodeStorage.decodeMembership([]) == .empty)
        // Through a log record and back, as entries are stored.
        let entry = LogEntry(index: 3, term: 2, kind: .config(recorded))
        #expect(try NodeStorage.raftEntry(NodeStorage.storedEntry(entry)) == entry)
        let damaged: [[UInt8]] = [
            old + u64(1),  // a count without its pair
            old + u64(1) + u64(9) + u64(5),  // not a member
            old + u64(1) + u64(4) + u64(0),  // zero
            old + u64(2) + u64(4) + u64(5) + u64(4) + u64(6),  // twice
            old + u64(1) + u64(4) + u64(5) + [0],  // trailing
            old + u64(UInt64.max),  // hostile count
        ]
        for d in damaged {
            #expect {
                try NodeStorage.decodeMembership(d)
            } throws: { error in
                (error as? OpLogError)?.code == .corrupt
            }
        }
    }

    @Test("a stored configuration entry with incarnations reloads after a reboot")
    func persistedThroughLoad() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/"])
        let storage = try Self.open(fs, 0xA)
        try storage.bootstrap(members: [1, 2, 3])
        var rd = Ready()
        let m = Membership(voters: [1, 2, 3], learners: [4], incarnations: [4: 0xB0B])
        rd.entries = [LogEntry(index: 2, term: 1, kind: .config(m))]
        rd.hardState = HardState(term: 1, vote: 0, commit: 2, mayVote: true)
        rd.committedEntries = rd.entries
        _ = try storage.persist(rd)
        fs.reboot()
        let loaded = try Self.open(fs, 0xC).load { _ in }
        #expect(loaded.persisted.entries.last == LogEntry(index: 2, term: 1, kind: .config(m)))
    }
}
