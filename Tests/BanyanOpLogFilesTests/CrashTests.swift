import BanyanBasics
import BanyanOpLog
import BanyanOpLogFiles
import Testing

private let dir = "/data/log"

private func entry(_ index: UInt64, _ tag: String, term: UInt64 = 1) -> LogRecord {
    LogRecord(index: index, term: term, kind: 2, payload: Array("\(tag)#\(index)".utf8))
}

/// Sectors this small put several in every record, so reboots mix old and new sectors inside
/// records, not only between them.
private let sector = 16

/// `preallocate`: 0 for plain appends (the old mode), or a small step so that segments grow by
/// zeros many times.
private func smallSegments(preallocate: Int = 0) -> SegmentedLog.Options {
    var options = SegmentedLog.Options()
    options.segmentBytes = 200  // a roll every few records
    options.preallocationBytes = preallocate
    options.sectorBytes = sector
    return options
}

private func freshFS() -> SimulatedFileSystem {
    let fs = SimulatedFileSystem(durableDirectories: ["/data"])
    fs.sectorBytes = sector
    return fs
}

/// Appends 30 batches of 1-4 records (sync after each); returns the index last reported durable.
/// Stops at the first error (a simulated crash).
@discardableResult
private func workload(_ fs: SimulatedFileSystem, seed: UInt64, preallocate: Int = 0) -> UInt64 {
    var durable: UInt64 = 0
    var rng = SeededRandom(seed: seed)
    do {
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments(preallocate: preallocate))
        var next: UInt64 = 1
        for _ in 0..<30 {
            let count = 1 + rng.below(4)
            try log.append((0..<count).map { entry(next + UInt64($0), "w") })
            next += UInt64(count)
            durable = try log.sync()
        }
    } catch {}
    return durable
}

/// How much of the unsynced bytes a reboot keeps.
private let keepPolicies: [(String, @Sendable (String, Int) -> Int)] = [
    ("none", { _, _ in 0 }),
    ("all", { _, n in n }),
    ("half", { _, n in n / 2 }),
    ("one byte", { _, n in Swift.min(n, 1) }),
]

/// Which overwritten sectors a reboot keeps new (write-back in no particular order).
private let sectorPolicies: [(String, @Sendable (String, Int) -> Bool)] = [
    ("old sectors", { _, _ in false }),
    ("new sectors", { _, _ in true }),
    ("odd sectors new", { _, n in n % 2 == 1 }),
    ("scattered", { path, n in (n &* 2_654_435_761 &+ path.utf8.count) % 3 == 0 }),
]

/// Both together: every keep policy with old sectors, and every sector policy with all growth
/// kept and with half of it (so later sectors may survive where earlier ones did not).
private let rebootPolicies: [(String, @Sendable (String, Int) -> Int, @Sendable (String, Int) -> Bool)] =
    keepPolicies.map { ($0.0, $0.1, { @Sendable _, _ in false }) }
    + sectorPolicies.dropFirst().flatMap { sectorPolicy in
        [("all, \(sectorPolicy.0)", { @Sendable _, n in n }, sectorPolicy.1),
         ("half, \(sectorPolicy.0)", { @Sendable _, n in n / 2 }, sectorPolicy.1)]
    }

@Suite struct CrashTests {
    @Test(
        "a crash at every operation of append/sync/roll loses nothing durable and recovers a clean prefix (plain appends, and preallocated segments with sectors reaching the disk out of order)",
        arguments: [0, 64], [false, true])
    func crashAtEveryOperation(preallocate: Int, earlyNames: Bool) throws {
        let total = freshFS()
        workload(total, seed: 1, preallocate: preallocate)
        let operations = total.operations
        #expect(operations > 100)
        var checked = 0
        var truncatedTails = 0
        var headerlessSegments = 0
        for crashAt in 1...operations {
            for (policy, keep, keepSector) in rebootPolicies {
                let fs = freshFS()
                fs.createsAreDurable = earlyNames
                fs.crashAtOperation = crashAt
                let durable = workload(fs, seed: 1, preallocate: preallocate)
                fs.reboot(keepUnsynced: keep, keepSector: keepSector)
                let log: SegmentedLog
                do {
                    log = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments(preallocate: preallocate))
                } catch {
                    Issue.record("crash at \(crashAt), keep \(policy): recovery refused: \(error)")
                    continue
                }
                #expect(log.lastIndex >= durable, "crash at \(crashAt), keep \(policy): lost durable records")
                let recovered = try log.entries(from: 1, through: log.lastIndex)
                #expect(recovered == (1...Swift.max(1, log.lastIndex)).prefix(Int(log.lastIndex)).map { entry($0, "w") },
                        "crash at \(crashAt), keep \(policy): recovered records differ")
                if log.recovery.truncatedTail != nil { truncatedTails += 1 }
                if log.recovery.removedEmptySegment != nil { headerlessSegments += 1 }
                // The recovered log takes new appends, and they survive the next restart.
                let next = log.lastIndex + 1
                try log.append([entry(next, "after")])
                #expect(try log.sync() == next)
                fs.reboot(keepUnsynced: keep, keepSector: keepSector)
                let again = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments(preallocate: preallocate))
                #expect(again.lastIndex == next, "crash at \(crashAt), keep \(policy): the write after recovery was lost")
                checked += 1
            }
        }
        #expect(checked == operations * rebootPolicies.count)
        // The policies really produce torn tails to repair (not only clean cuts), and with early
        // names, new segments whose header never reached the disk.
        #expect(truncatedTails > 0)
        if earlyNames && preallocate > 0 { #expect(headerlessSegments > 0) }
    }

    @Test("a write torn at every byte leaves a recoverable prefix, never garbage", arguments: [0, 64])
    func tornWrites(preallocate: Int) throws {
        // Aim at real writes: a probe run records which operations were writes.
        let probe = freshFS()
        workload(probe, seed: 2, preallocate: preallocate)
        let appends = probe.appendOperations
        #expect(appends.count > 20)
        for target in [appends[1], appends[5], appends[12], appends[appends.count - 1]] {
            for keep in stride(from: 0, through: 60, by: 3) {
                let fs = freshFS()
                fs.tear = (operation: target, keep: keep)
                let durable = workload(fs, seed: 2, preallocate: preallocate)
                fs.reboot(keepUnsynced: { _, n in n }, keepSector: { _, _ in true })
                let log = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments(preallocate: preallocate))
                #expect(log.lastIndex >= durable)
                let recovered = try log.entries(from: 1, through: log.lastIndex)
                #expect(recovered == (0..<Int(log.lastIndex)).map { entry(UInt64($0) + 1, "w") }, "tear at op \(target) after \(keep) bytes")
            }
        }
    }

    @Test(
        "a crash anywhere in truncate-and-rewrite leaves the old suffix or the new one, never a mix (cutting inside one segment, and removing two whole ones)",
        arguments: [10, 3] as [UInt64], [0, 64])
    func truncateCrashes(cut: UInt64, preallocate: Int) throws {
        let options = smallSegments(preallocate: preallocate)
        func setUp(_ fs: SimulatedFileSystem) throws -> SegmentedLog {
            let log = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
            try log.append((1...20).map { entry($0, "old") })
            try log.sync()
            return log
        }
        let probe = freshFS()
        let probeLog = try setUp(probe)
        let before = probe.operations
        probe.mostUnsyncedRemovals = 0
        // Segments hold 7 records (1-7, 8-14, 15-20): cutting after 10 truncates the middle one;
        // cutting after 3 removes the last two segments (newest first) and truncates the first.
        try probeLog.truncate(after: cut)
        try probeLog.append(((cut + 1)...(cut + 6)).map { entry($0, "new") })
        try probeLog.sync()
        let span = probe.operations - before
        // Never two segment removals pending at once: a power loss could keep either (a gap).
        #expect(probe.mostUnsyncedRemovals <= 1, "\(probe.mostUnsyncedRemovals) removals unsynced at once")
        var outcomes: Set<String> = []
        // The rewrite goes to a new segment (a cut inside a write batch seals the segment), whose
        // name is durable only at the last operation, the directory fsync: `span + 1` is the run
        // that gets past it (no crash during the operation, a power loss after it).
        for crashAt in 1...(span + 1) {
            for (policy, keep, keepSector) in rebootPolicies {
                let fs = freshFS()
                let log = try setUp(fs)
                fs.crashAtOperation = fs.operations + crashAt
                var finished = false
                do {
                    try log.truncate(after: cut)
                    try log.append(((cut + 1)...(cut + 6)).map { entry($0, "new") })
                    try log.sync()
                    finished = true
                } catch {}
                fs.reboot(keepUnsynced: keep, keepSector: keepSector)
                let reopened: SegmentedLog
                do {
                    reopened = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
                } catch {
                    Issue.record("crash at \(crashAt), keep \(policy): recovery refused: \(error)")
                    continue
                }
                let got = try reopened.entries(from: 1, through: reopened.lastIndex)
                let context = "crash at \(crashAt) of \(span), keep \(policy)"
                #expect(Array(got.prefix(Int(cut))) == (1...cut).map { entry($0, "old") }, "\(context)")
                let suffix = got.dropFirst(Int(cut))
                let allOld = suffix.allSatisfy { String(decoding: $0.payload, as: UTF8.self).hasPrefix("old") }
                let allNew = suffix.allSatisfy { String(decoding: $0.payload, as: UTF8.self).hasPrefix("new") }
                #expect(allOld || allNew, "\(context): mixed suffix \(suffix.map { String(decoding: $0.payload, as: UTF8.self) })")
                if finished { #expect(got == (1...cut).map { entry($0, "old") } + ((cut + 1)...(cut + 6)).map { entry($0, "new") }, "\(context)") }
                #expect(got.map(\.index) == (0..<got.count).map { UInt64($0) + 1 }, "\(context): gap")
                if suffix.isEmpty {
                    outcomes.insert("cut")
                } else {
                    outcomes.insert(allOld ? "old" : "new")
                }
                // The reopened log goes on from where it ends.
                #expect(throws: Never.self, "\(context)") {
                    try reopened.append([entry(reopened.lastIndex + 1, "next")])
                    try reopened.sync()
                }
            }
        }
        // Crashes before the cut keep the old suffix; crashes after it show the new one.
        #expect(outcomes.contains("old") && outcomes.contains("new"), "\(outcomes)")
    }

    @Test("hard state is never torn: after a crash at any point of a save it is the old or the new value")
    func hardStateCrashes() throws {
        let old = HardStateRecord(term: 3, vote: 2, commit: 10, mayVote: false)
        let new = HardStateRecord(term: 4, vote: 1, commit: 12, mayVote: false)
        for crashAt in 1...6 {
            for (policy, keep) in keepPolicies {
                let fs = freshFS()
                let store = try HardStateStore(directory: "/data", fileSystem: fs)
                try store.save(old)
                fs.crashAtOperation = fs.operations + crashAt
                var saved = false
                do {
                    try store.save(new)
                    saved = true
                } catch {}
                fs.reboot(keepUnsynced: keep)
                let loaded = try HardStateStore(directory: "/data", fileSystem: fs).load()
                #expect(loaded == old || loaded == new, "crash at \(crashAt), keep \(policy)")
                if saved { #expect(loaded == new) }
            }
        }
        let fs = freshFS()
        #expect(try HardStateStore(directory: "/data", fileSystem: fs).load() == HardStateRecord(mayVote: false))
    }

    @Test("a full disk gives a clear error and corrupts nothing", arguments: [0, 64])
    func diskFull(preallocate: Int) throws {
        let fs = freshFS()
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments(preallocate: preallocate))
        try log.append((1...10).map { entry($0, "w") })
        let durable = try log.sync()
        fs.capacity = 700
        var failure: OpLogError?
        do {
            for i in 11...200 {
                try log.append([entry(UInt64(i), "w")])
                try log.sync()
            }
        } catch {
            failure = error
        }
        #expect(failure?.code == .noSpace)
        #expect(failure?.description.contains("no space") == true)
        fs.capacity = nil
        fs.reboot()
        let reopened = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments(preallocate: preallocate))
        #expect(reopened.lastIndex >= durable)
        #expect(try reopened.entries(from: 1, through: reopened.lastIndex) == (0..<Int(reopened.lastIndex)).map { entry(UInt64($0) + 1, "w") })

        let store = try HardStateStore(directory: "/data", fileSystem: fs)
        try store.save(HardStateRecord(term: 1, vote: 1, commit: 1, mayVote: false))
        fs.capacity = 1
        do {
            try store.save(HardStateRecord(term: 2, vote: 2, commit: 2, mayVote: false))
            Issue.record("save on a full disk succeeded")
        } catch {
            #expect(error.code == .noSpace)
        }
        #expect(try store.load() == HardStateRecord(term: 1, vote: 1, commit: 1, mayVote: false))
        fs.capacity = nil
        fs.failRenames = true
        #expect(throws: OpLogError.self) { try store.save(HardStateRecord(term: 3, vote: 3, commit: 3, mayVote: false)) }
        #expect(try store.load() == HardStateRecord(term: 1, vote: 1, commit: 1, mayVote: false))
    }

    @Test("corruption before the tail refuses to start, naming the file and offset")
    func corruptionRefused() throws {
        let fs = freshFS()
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments())
        try log.append((1...40).map { entry($0, "w") })
        try log.sync()
        let first = dir + "/" + LogFormat.segmentName(firstIndex: 1)
        fs.corrupt(first, at: 20)
        do {
            _ = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments())
            Issue.record("corrupt log opened")
        } catch {
            #expect(error.code == .corrupt)
            #expect(error.file == first)
            #expect(error.offset == 8)
        }
    }

    @Test("segments roll, ranges read across them, terms are known, truncation sticks")
    func basics() throws {
        let fs = freshFS()
        var progress: [(Int, Int)] = []
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments())
        try log.append((1...30).map { entry($0, "w", term: $0 < 15 ? 1 : 2) })
        #expect(log.durableIndex == 0)
        #expect(try log.sync() == 30)
        #expect(try fs.list(dir).count > 3)
        #expect(try log.entries(from: 5, through: 17) == (5...17).map { entry($0, "w", term: $0 < 15 ? 1 : 2) })
        #expect(log.term(at: 14) == 1 && log.term(at: 15) == 2 && log.term(at: 31) == nil)
        try log.truncate(after: 12)
        #expect(log.lastIndex == 12)
        try log.append([entry(13, "x", term: 3)])
        try log.sync()
        let reopened = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments()) { progress.append(($0, $1)) }
        #expect(reopened.lastIndex == 13)
        #expect(try reopened.entries(from: 12, through: 13) == [entry(12, "w"), entry(13, "x", term: 3)])
        #expect(progress.last.map { $0.0 == $0.1 } == true)
        #expect(throws: OpLogError.self) { try reopened.append([entry(20, "gap")]) }
        #expect(throws: OpLogError.self) { try reopened.truncate(after: 99) }
    }

    @Test("after any storage error the log stops: no false durability, no gap on the next start")
    func stopsAfterError() throws {
        let fs = freshFS()
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments())
        try log.append((1...3).map { entry($0, "w") })
        #expect(try log.sync() == 3)
        fs.capacity = 180  // a partial write of the next batch, then ENOSPC
        #expect(throws: OpLogError.self) { try log.append((4...8).map { entry($0, "w") }) }
        #expect(log.failure?.code == .noSpace)
        fs.capacity = nil
        #expect(throws: OpLogError.self) { try log.sync() }
        #expect(throws: OpLogError.self) { try log.append([entry(4, "w")]) }
        #expect(throws: OpLogError.self) { try log.truncate(after: 2) }
        for restart in ["process", "power"] {
            if restart == "process" { fs.restartProcess() } else { fs.reboot(keepUnsynced: { _, n in n }) }
            let reopened = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments())
            #expect(reopened.lastIndex >= 3, "\(restart)")
            #expect(try reopened.entries(from: 1, through: reopened.lastIndex) == (0..<Int(reopened.lastIndex)).map { entry(UInt64($0) + 1, "w") })
        }
    }

    @Test("what a restart after a process crash reports durable survives a later power loss", arguments: [0, 64])
    func processCrashThenPowerLoss(preallocate: Int) throws {
        for crashAt in 1...60 {
            let fs = freshFS()
            fs.crashAtOperation = crashAt
            workload(fs, seed: 3, preallocate: preallocate)
            fs.restartProcess()
            let first = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments(preallocate: preallocate))
            let reported = first.durableIndex
            fs.reboot()
            let second = try SegmentedLog(directory: dir, fileSystem: fs, options: smallSegments(preallocate: preallocate))
            #expect(second.lastIndex >= reported, "crash at \(crashAt): \(reported) reported durable, \(second.lastIndex) survived")
        }
        // The same for hard state: a value loaded after a process crash is durable.
        for crashAt in 1...6 {
            let fs = freshFS()
            let store = try HardStateStore(directory: "/data", fileSystem: fs)
            try store.save(HardStateRecord(term: 1, vote: 1, commit: 0, mayVote: false))
            fs.crashAtOperation = fs.operations + crashAt
            try? store.save(HardStateRecord(term: 5, vote: 2, commit: 0, mayVote: false))
            fs.restartProcess()
            let seen = try HardStateStore(directory: "/data", fileSystem: fs).load()
            fs.reboot()
            #expect(try HardStateStore(directory: "/data", fileSystem: fs).load() == seen, "crash at \(crashAt)")
        }
    }

    @Test("a damaged length field in the middle of the last segment is corruption, not a torn tail (also with the default preallocation)", arguments: [0, 1 << 20])
    func damagedLengthMidSegment(preallocate: Int) throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        var options = SegmentedLog.Options()
        options.segmentBytes = 1 << 20
        options.preallocationBytes = preallocate
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
        try log.append((1...5).map { entry($0, "w") })
        try log.sync()
        let file = dir + "/" + LogFormat.segmentName(firstIndex: 1)
        let recordBytes = LogFormat.frameBytes + LogFormat.bodyFixedBytes + entry(1, "w").payload.count
        // One batch (its leading marker, five records, its trailing marker), then the empty batch
        // that records the sync (two markers).
        let batchStart = LogFormat.segmentHeader.count + LogFormat.markerBytes
        #expect(try fs.readAll(file).count == (preallocate == 0 ? batchStart + 5 * recordBytes + 3 * LogFormat.markerBytes : preallocate))
        fs.corrupt(file, at: batchStart + recordBytes + 2)  // record 2's length
        do {
            _ = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
            Issue.record("acknowledged records 2-5 silently cut off")
        } catch {
            #expect(error.code == .corrupt)
        }
    }

    @Test("oversize payloads, bad segment names and new directories are handled safely")
    func edges() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        #expect(throws: OpLogError.self) { try SegmentedLog(directory: "/data/missing/log", fileSystem: fs) }
        let created = try SegmentedLog(directory: "/data/log", fileSystem: fs, options: smallSegments())
        #expect(throws: OpLogError.self) {
            try created.append([LogRecord(index: 1, term: 1, kind: 0, payload: [UInt8](repeating: 0, count: LogFormat.maxRecordBytes))])
        }
        try created.append([entry(1, "w")])
        try created.sync()
        // The new directories were made durable with their parents: a power loss keeps them.
        fs.reboot()
        #expect(try SegmentedLog(directory: "/data/log", fileSystem: fs, options: smallSegments()).lastIndex == 1)
        #expect(LogFormat.firstIndex(ofSegment: "00000000000000000000.seg") == nil)
        #expect(LogFormat.firstIndex(ofSegment: "+0000000000000000001.seg") == nil)
        #expect(LogFormat.firstIndex(ofSegment: "18446744073709551615.seg") == nil)
        // A stray zero-index file is ignored, not a crash.
        let stray = try fs.create("/data/log/00000000000000000000.seg")
        try fs.append(stray, LogFormat.segmentHeader)
        #expect(try SegmentedLog(directory: "/data/log", fileSystem: fs, options: smallSegments()).lastIndex == 1)
    }
}

@Suite struct DurableDirectoryTests {
    @Test("missing parents are created and each made durable in its parent; parents of relative, absolute and top-level paths")
    func nestedDirectories() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/"])
        #expect(throws: FileSystemError.self) { try makeDurableDirectory("/x/y", fs) }
        try makeDurableDirectory("/a/b/c", fs, creatingParents: true)
        fs.reboot()
        #expect(fs.exists("/a") && fs.exists("/a/b") && fs.exists("/a/b/c"))
        try makeDurableDirectory("/a/b/c", fs, creatingParents: true)  // already there: nothing to do
        #expect(parentDirectory(of: "/a/b") == "/a")
        #expect(parentDirectory(of: "/a") == "/")
        #expect(parentDirectory(of: "banyan-data") == ".")
        #expect(parentDirectory(of: "./banyan-data") == ".")
        #expect(parentDirectory(of: "data/raft/") == "data")
    }
}
