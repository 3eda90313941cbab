import BanyanOpLog
import BanyanOpLogFiles
import Logging
import Synchronization
import Testing

private let dir = "/data/log"
private let segment = dir + "/" + LogFormat.segmentName(firstIndex: 1)

private func entry(_ index: UInt64) -> LogRecord {
    LogRecord(index: index, term: 1, kind: 2, payload: Array("key-\(index)=".utf8) + [UInt8](repeating: UInt8(ascii: "v"), count: 180))
}

/// A log of `count` acknowledged records (synced in batches of 100) in one segment, closed cleanly.
private func acknowledgedLog(_ count: UInt64, options: SegmentedLog.Options = SegmentedLog.Options()) throws -> SimulatedFileSystem {
    let fs = SimulatedFileSystem(durableDirectories: ["/data"])
    let log = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
    var next: UInt64 = 1
    while next <= count {
        let last = Swift.min(count, next + 99)
        try log.append((next...last).map(entry))
        try log.sync()
        next = last + 1
    }
    return fs
}

/// The disk hands back zeros for `count` bytes at `offset` (durably: a bad sector, not a crash).
private func zero(_ fs: SimulatedFileSystem, _ path: String, at offset: Int, count: Int) throws {
    let file = try fs.open(path)
    try fs.write(file, at: offset, [UInt8](repeating: 0, count: count))
    try fs.sync(file)
    fs.close(file)
}

@Suite struct RecoveryTests {
    @Test("a zero sector in the middle of the last segment, with acknowledged records after it, refuses to open instead of cutting them off")
    func zeroSectorBeforeValidRecordsRefused() throws {
        let fs = try acknowledgedLog(3000)
        let before = try fs.readAll(segment)
        let damage = 300_000 / 4096 * 4096
        try zero(fs, segment, at: damage, count: 4096)
        do {
            let log = try SegmentedLog(directory: dir, fileSystem: fs)
            Issue.record("opened with \(log.lastIndex) of 3000 acknowledged records")
        } catch {
            #expect(error.code == .corrupt)
            #expect(error.file == segment)
            let offset = try #require(error.offset)
            #expect(offset <= damage && offset > damage - 300, "damage at \(damage), reported at \(offset)")
            #expect(error.message.contains("3000"), "\(error.message)")
        }
        // Nothing was cut.
        #expect(try fs.readAll(segment).count == before.count)
    }

    @Test("salvageDamagedTail cuts the damaged last segment at the damage, saves the cut bytes beside it first, and reports how far to refetch")
    func salvage() throws {
        let fs = try acknowledgedLog(3000)
        let damage = 300_000 / 4096 * 4096
        try zero(fs, segment, at: damage, count: 4096)
        let damaged = try fs.readAll(segment)
        var options = SegmentedLog.Options()
        options.salvageDamagedTail = true
        let logs = CapturedLogs()
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: options, logger: logs.logger)
        let salvaged = try #require(log.salvaged)
        #expect(salvaged.file == segment)
        #expect(salvaged.offset <= damage && salvaged.offset > damage - 300)
        #expect(salvaged.cutAt == log.lastIndex + 1 && salvaged.lastIndexBeforeCut == log.lastIndex)
        #expect(log.lastIndex > 1000 && log.lastIndex < 1500)
        #expect(salvaged.highestIndexAfterDamage == 3000)
        #expect(try log.entries(from: 1, through: log.lastIndex) == (1...log.lastIndex).map(entry))
        // The cut bytes (up to the last non-zero byte) were saved beside the segment.
        let saved = try #require(salvaged.savedTo)
        #expect(saved == segment + ".cut-\(salvaged.offset)")
        let lastByte = try #require(damaged.lastIndex { $0 != 0 })
        #expect(try fs.readAll(saved) == Array(damaged[salvaged.offset...lastByte]))
        #expect(logs.records.withLock { $0.contains { $0.0 == .warning && $0.2["saved_to"] == .string(saved) && $0.2["file"] == .string(segment) } })
        // The saved file and the cut are durable, and the saved file is never taken for a
        // segment: the log opens without the option now and takes the next record.
        fs.reboot()
        let again = try SegmentedLog(directory: dir, fileSystem: fs)
        #expect(again.lastIndex == salvaged.lastIndexBeforeCut && again.salvaged == nil)
        #expect(try fs.readAll(saved).count == lastByte + 1 - salvaged.offset)
        try again.append([entry(again.lastIndex + 1)])
        #expect(try again.sync() == salvaged.cutAt)
    }

    // Changed rule (issue 14, item 4's open gap; seed 67023): this used to be refused, because
    // nothing told the torn batch from damage to synced records. Each batch's synced-through
    // markers now say that the segment was synced only up to the batch's start.
    @Test("out-of-order write-back of an unsynced batch (a later sector kept, the one where it starts lost) is cut as a torn tail: the log opens with every acknowledged record and goes on")
    func tornUnsyncedBatchOpens() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let log = try SegmentedLog(directory: dir, fileSystem: fs)
        try log.append((1...10).map(entry))
        #expect(try log.sync() == 10)
        try log.append((11...20).map(entry))
        let written = SegmentScan.scan(try fs.readAll(segment), expectedFirstIndex: 1, isLast: true, keepPayloads: false)
        #expect(written.entries.count == 20)
        // Power loss: write-back reached every sector of the unsynced batch but the one where
        // record 11 starts.
        let lostSector = written.offsets[10] / 512
        fs.reboot(keepUnsynced: { _, n in n }, keepSector: { _, n in n != lostSector })
        let logs = CapturedLogs()
        let reopened = try SegmentedLog(directory: dir, fileSystem: fs, logger: logs.logger)
        #expect(reopened.lastIndex == 10 && reopened.salvaged == nil)
        #expect(try reopened.entries(from: 1, through: 10) == (1...10).map(entry))
        let cut = try #require(reopened.recovery.truncatedTail)
        #expect(cut.offset <= written.offsets[10] && cut.offset > written.offsets[9])
        // The cut bytes were saved, and the log line names the unsynced records it dropped.
        let saved = try #require(reopened.recovery.savedCutBytes)
        #expect(try fs.readAll(saved).count > 0)
        #expect(logs.records.withLock { $0.contains { $0.2["unsynced_records_after_damage"].map { "\($0)".hasSuffix("...20") } ?? false } })
        // It takes the next records, and they survive the next power loss.
        try reopened.append((11...15).map(entry))
        #expect(try reopened.sync() == 15)
        fs.reboot()
        let again = try SegmentedLog(directory: dir, fileSystem: fs)
        #expect(again.lastIndex == 15)
        #expect(try again.entries(from: 1, through: 15) == (1...15).map(entry))
    }

    @Test("recovery records the sync it makes: a bad sector found later in records it made durable is refused, not cut (simulator seed 1002241)")
    func recoverySyncRecorded() throws {
        try recoverySyncScenario(sabotaged: false)
        // The same with the recorded sync left out: the damage is cut as a torn tail.
        try recoverySyncScenario(sabotaged: true)
    }

    private func recoverySyncScenario(sabotaged: Bool) throws {
        var options = SegmentedLog.Options()
        options.sabotageUnrecordedRecoverySync = sabotaged
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
        try log.append((1...10).map(entry))
        #expect(try log.sync() == 10)
        // Written, never synced: the process stopped (its fsync failed), and write-back reached
        // every sector before the machine went down.
        try log.append((11...20).map(entry))
        fs.reboot(keepUnsynced: { _, n in n }, keepSector: { _, _ in true })
        let recovered = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
        #expect(recovered.lastIndex == 20 && recovered.durableIndex == 20)
        #expect(recovered.recovery.recordedSync == (sabotaged ? nil : .emptyBatch))
        // The node writes nothing more and loses power; at its next start the disk hands back
        // zeros for a sector inside the batch of 11...20, which recovery made durable.
        fs.reboot()
        let size = try fs.readAll(segment).count
        let again = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
        #expect(again.lastIndex == 20 && again.recovery.recordedSync == nil, "a start after a recorded sync adds nothing")
        #expect(try fs.readAll(segment).count == size)
        fs.reboot()
        let layout = SegmentScan.scan(try fs.readAll(segment), expectedFirstIndex: 1, isLast: true, keepPayloads: false)
        let damage = layout.offsets[14] / 512 * 512
        #expect(damage > layout.offsets[10])
        try zero(fs, segment, at: damage, count: 512)
        do {
            let opened = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
            #expect(sabotaged, "opened with \(opened.lastIndex) of 20 durable records")
            #expect(opened.lastIndex < 15 && opened.recovery.truncatedTail != nil)
        } catch {
            #expect(!sabotaged, "\(error)")
            #expect(error.code == .corrupt && error.file == segment, "\(error)")
            #expect(error.message.contains("synced through byte"), "\(error.message)")
        }
    }

    /// Simulator seed 1126036: the empty batch recording the last sync was only in the page
    /// cache when the fsync of the next start failed; the start after that read the disk, where
    /// a bad sector in the synced batch looked like a torn write of it.
    @Test("damage below what a sync record only the page cache still shows says was synced is refused, not cut (sabotaged: cut)", arguments: [false, true])
    func cachedSyncRecordVouches(sabotaged: Bool) throws {
        var options = SegmentedLog.Options()
        options.sabotageIgnoreCachedSyncRecord = sabotaged
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
        try log.append((1...10).map(entry))
        #expect(try log.sync() == 10)
        try log.append((11...20).map(entry))
        #expect(try log.sync() == 20)
        // The process stops; the empty batch recording that sync is only in the page cache. A
        // sector inside the synced batch of 11...20 goes bad.
        fs.restartProcess()
        let layout = SegmentScan.scan(try fs.readAll(segment), expectedFirstIndex: 1, isLast: true, keepPayloads: false)
        #expect(layout.highestSyncClaim > layout.offsets[19])
        let damage = layout.offsets[14] / 512 * 512
        #expect(damage > layout.offsets[10])
        fs.zero(segment, at: damage, count: 512)
        // The next start's fsync fails: the record never reaches the disk, and the start after
        // that reads the disk.
        fs.failNextSync = true
        #expect(throws: OpLogError.self) { try SegmentedLog(directory: dir, fileSystem: fs, options: options) }
        fs.restartProcess()
        do {
            let opened = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
            #expect(sabotaged, "opened with \(opened.lastIndex) of 20 durable records")
            #expect(opened.lastIndex < 15 && opened.recovery.truncatedTail != nil)
        } catch {
            #expect(!sabotaged, "\(error)")
            #expect(error.code == .corrupt && error.file == segment, "\(error)")
            #expect(error.message.contains("page cache") && error.message.contains("not a torn tail"), "\(error.message)")
        }
    }

    @Test("recovery that leaves the last segment sealed starts a new one, so damage found later in the records it made durable is refused (sabotaged: cut)", arguments: [false, true])
    func recoverySyncRecordedInSealedSegment(sabotaged: Bool) throws {
        var options = SegmentedLog.Options()
        options.sabotageUnrecordedRecoverySync = sabotaged
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
        try log.append((1...10).map(entry))
        #expect(try log.sync() == 10)
        try log.append((11...20).map(entry))
        try log.append((21...30).map(entry))  // two batches, neither synced
        let written = SegmentScan.scan(try fs.readAll(segment), expectedFirstIndex: 1, isLast: true, keepPayloads: false)
        let lostSector = written.offsets[23] / 512
        #expect(lostSector * 512 > written.offsets[20])
        fs.reboot(keepUnsynced: { _, n in n }, keepSector: { _, n in n != lostSector })
        let recovered = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
        // The torn tail is cut inside the third batch: the segment takes no more batches.
        #expect(recovered.lastIndex >= 20 && recovered.lastIndex <= 23 && recovered.recovery.truncatedTail != nil)
        #expect(recovered.recovery.recordedSync == (sabotaged ? nil : .newSegment))
        #expect(try fs.list(dir).contains(LogFormat.segmentName(firstIndex: recovered.lastIndex + 1)) == !sabotaged)
        let durable = recovered.lastIndex
        fs.reboot()
        // A bad sector inside the batch of 11...20, which recovery made durable.
        let damage = written.offsets[14] / 512 * 512
        #expect(damage > written.offsets[10] && damage + 512 < written.offsets[19])
        try zero(fs, segment, at: damage, count: 512)
        do {
            let opened = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
            #expect(sabotaged, "opened with \(opened.lastIndex) of \(durable) durable records")
            #expect(opened.lastIndex < 15)
        } catch {
            #expect(!sabotaged, "\(error)")
            #expect(error.code == .corrupt && error.file == segment, "\(error)")
        }
    }

    @Test("damage to a synced batch, with a later batch whose markers say it was synced, is still refused (and salvage keeps every record before it)")
    func syncedBatchDamageRefused() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let log = try SegmentedLog(directory: dir, fileSystem: fs)
        for batch in 0..<3 {
            try log.append((UInt64(batch * 10 + 1)...UInt64(batch * 10 + 10)).map(entry))
            try log.sync()
        }
        try log.append((31...40).map(entry))  // not synced
        fs.reboot(keepUnsynced: { _, n in n }, keepSector: { _, _ in true })
        let layout = SegmentScan.scan(try fs.readAll(segment), expectedFirstIndex: 1, isLast: true, keepPayloads: false)
        #expect(layout.entries.count == 40)
        // The disk hands back zeros for the sector after the one where record 12 starts: inside
        // the second batch, which was synced (and acknowledged) before the third was written.
        let damage = (layout.offsets[11] / 512 + 1) * 512
        try zero(fs, segment, at: damage, count: 512)
        do {
            let opened = try SegmentedLog(directory: dir, fileSystem: fs)
            Issue.record("opened with \(opened.lastIndex) of 30 acknowledged records")
        } catch {
            #expect(error.code == .corrupt && error.file == segment, "\(error)")
            #expect(error.message.contains("synced through byte") && error.message.contains("runbook"), "\(error.message)")
            let offset = try #require(error.offset)
            #expect(offset <= damage && offset > layout.offsets[10])
        }
        var options = SegmentedLog.Options()
        options.salvageDamagedTail = true
        let salvaged = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
        #expect(salvaged.lastIndex >= 11 && salvaged.lastIndex < 20 && salvaged.salvaged?.highestIndexAfterDamage == 40)
    }

    @Test("a log written before synced-through markers (segment version 1) with damage followed by valid records is still refused; undamaged, it opens and continues in a new version-2 segment")
    func oldFormatDamageRefused() throws {
        func oldLog() throws -> SimulatedFileSystem {
            let fs = SimulatedFileSystem(durableDirectories: ["/data"])
            try fs.makeDirectory(dir)
            try fs.syncDirectory("/data")
            let file = try fs.create(segment)
            var bytes = LogFormat.segmentHeaderV1
            for index in 1...40 { LogFormat.encode(entry(UInt64(index)), into: &bytes) }
            try fs.append(file, bytes + [UInt8](repeating: 0, count: 4096))  // preallocated
            try fs.sync(file)
            fs.close(file)
            try fs.syncDirectory(dir)
            return fs
        }
        let damaged = try oldLog()
        try zero(damaged, segment, at: 4096, count: 512)
        do {
            let opened = try SegmentedLog(directory: dir, fileSystem: damaged)
            Issue.record("opened with \(opened.lastIndex) of 40 records")
        } catch {
            #expect(error.code == .corrupt && error.message.contains("no synced-through marker"), "\(error.message)")
        }
        let fs = try oldLog()
        let log = try SegmentedLog(directory: dir, fileSystem: fs)
        #expect(log.lastIndex == 40)
        try log.append((41...45).map(entry))
        #expect(try log.sync() == 45)
        let next = dir + "/" + LogFormat.segmentName(firstIndex: 41)
        #expect(try fs.readAll(next).starts(with: LogFormat.segmentHeader) && LogFormat.segmentHeader != LogFormat.segmentHeaderV1)
        fs.reboot()
        let again = try SegmentedLog(directory: dir, fileSystem: fs)
        #expect(try again.entries(from: 1, through: 45) == (1...45).map(entry))
    }

    @Test("a torn tail is moved aside before the cut; a cut of zeros saves nothing; saved files are not segments")
    func tornTailSaved() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        var plain = SegmentedLog.Options()
        plain.preallocationBytes = 0
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: plain)
        try log.append((1...5).map(entry))
        try log.sync()
        try log.append([entry(6)])
        // Power loss keeping 30 bytes of record 6.
        let size = try fs.fileSize(segment)
        // Power loss keeping the empty batch that recorded the sync, record 6's leading marker
        // and 30 bytes of the record.
        fs.reboot(keepUnsynced: { _, _ in 3 * LogFormat.markerBytes + 30 })
        let torn = try fs.readAll(segment)
        #expect(torn.count == size - LogFormat.encode([entry(6)]).count - LogFormat.markerBytes + 30)
        let reopened = try SegmentedLog(directory: dir, fileSystem: fs, options: plain)
        #expect(reopened.lastIndex == 5)
        let offset = torn.count - 30
        #expect(reopened.recovery.truncatedTail?.offset == offset)
        #expect(reopened.recovery.savedCutBytes == segment + ".cut-\(offset)")
        #expect(try fs.readAll(segment + ".cut-\(offset)") == Array(torn[offset...]))
        // The cut ended inside record 6's batch, so the segment is sealed: recovery recorded its
        // sync by starting the next segment.
        #expect(reopened.recovery.recordedSync == .newSegment)
        let next = dir + "/" + LogFormat.segmentName(firstIndex: 6)
        #expect(try fs.readAll(next) == LogFormat.segmentHeader)
        // A reboot keeps all of it (the new segment and its name were synced); the next start
        // adds nothing.
        fs.reboot()
        let second = try SegmentedLog(directory: dir, fileSystem: fs, options: plain)
        #expect(second.lastIndex == 5 && second.recovery.recordedSync == nil)
        #expect(try fs.list(dir) == [LogFormat.segmentName(firstIndex: 1), LogFormat.segmentName(firstIndex: 1) + ".cut-\(offset)", LogFormat.segmentName(firstIndex: 6)])

        // The same cut again (a crash after saving, before the cut): the saved file is reused.
        let first = try fs.open(segment)
        try fs.write(first, at: offset, Array(torn[offset...]))
        try fs.sync(first)
        fs.close(first)
        try fs.remove(next)
        try fs.syncDirectory(dir)
        let recut = try SegmentedLog(directory: dir, fileSystem: fs, options: plain)
        #expect(recut.lastIndex == 5 && recut.recovery.savedCutBytes == segment + ".cut-\(offset)")
        #expect(try fs.list(dir) == [LogFormat.segmentName(firstIndex: 1), LogFormat.segmentName(firstIndex: 1) + ".cut-\(offset)", LogFormat.segmentName(firstIndex: 6)])

        // A torn tail of zeros followed by one stray byte saves the byte's span; a header that
        // never reached the disk saves nothing.
        let file = try fs.open(next)
        try fs.append(file, [0, 0, 0, 9])
        try fs.sync(file)
        fs.close(file)
        let headerBytes = LogFormat.segmentHeader.count
        let again = try SegmentedLog(directory: dir, fileSystem: fs, options: plain)
        #expect(again.lastIndex == 5 && again.recovery.savedCutBytes == next + ".cut-\(headerBytes)")
        #expect(try fs.readAll(next + ".cut-\(headerBytes)") == [0, 0, 0, 9])
        let empty = try fs.create(next)
        try fs.append(empty, [0, 0, 0, 0])
        try fs.sync(empty)
        try fs.syncDirectory(dir)
        let third = try SegmentedLog(directory: dir, fileSystem: fs, options: plain)
        #expect(third.recovery.removedEmptySegment == LogFormat.segmentName(firstIndex: 6) && third.recovery.savedCutBytes == nil)
        #expect(!(try fs.list(dir).contains { $0.hasPrefix(LogFormat.segmentName(firstIndex: 6) + ".cut") && $0 != LogFormat.segmentName(firstIndex: 6) + ".cut-\(headerBytes)" }))
        // Segment 1 was the last again (sealed, with records), so it was started afresh.
        #expect(third.recovery.recordedSync == .newSegment)
        #expect(try fs.readAll(next) == LogFormat.segmentHeader)
    }

    @Test("a restart after a failed fsync (the process exits, the machine does not) reads the disk, not the page cache: the records whose sync failed are gone", arguments: ["sync", "roll"])
    func restartAfterFailedSync(failing: String) throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        var options = SegmentedLog.Options()
        if failing == "roll" { options.segmentBytes = 2000 }  // the sync of a full segment at the roll fails
        let log = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
        try log.append((1...5).map(entry))
        #expect(try log.sync() == 5)
        fs.failNextSync = true
        do {
            try log.append((6...30).map(entry))
            try log.sync()
            Issue.record("the failed sync was not reported")
        } catch {
            #expect(error.code == .io)
        }
        #expect(log.durableIndex == 5)
        // The page cache still shows the records (Linux marks the failed pages clean).
        #expect(try fs.readAll(segment).count > LogFormat.segmentHeader.count + 6 * LogFormat.encode([entry(6)]).count)
        fs.restartProcess()
        let reopened = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
        #expect(reopened.lastIndex == 5, "records whose sync failed came back from the page cache")
        #expect(try reopened.entries(from: 1, through: reopened.lastIndex) == (1...reopened.lastIndex).map(entry))
        // What the restart reports durable is: the next records go on from 5 and survive a power loss.
        try reopened.append((reopened.lastIndex + 1...reopened.lastIndex + 3).map(entry))
        let durable = try reopened.sync()
        fs.reboot()
        let afterPowerLoss = try SegmentedLog(directory: dir, fileSystem: fs, options: options)
        #expect(afterPowerLoss.lastIndex == durable)
        #expect(try afterPowerLoss.entries(from: 1, through: durable) == (1...durable).map(entry))
    }
}

@Suite struct SimulatedFileSystemRangeTests {
    @Test("a write over part of a range a failed sync lost leaves the rest lost (partial overlaps on either side)")
    func subtract() {
        #expect(SimulatedFileSystem.subtract(5..<10, from: 7..<12) == [10..<12])
        #expect(SimulatedFileSystem.subtract(5..<10, from: 2..<7) == [2..<5])
        #expect(SimulatedFileSystem.subtract(5..<10, from: 2..<12) == [2..<5, 10..<12])
        #expect(SimulatedFileSystem.subtract(5..<10, from: 6..<9) == [])
        #expect(SimulatedFileSystem.subtract(5..<10, from: 10..<12) == [10..<12])
    }
}
