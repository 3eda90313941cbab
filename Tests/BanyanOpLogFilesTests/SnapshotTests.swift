import BanyanBasics
import BanyanOpLog
import BanyanOpLogFiles
import Testing

private func image(_ seed: UInt64, bytes: Int) -> [[UInt8]] {
    var rng = SeededRandom(seed: seed)
    var chunks: [[UInt8]] = []
    var produced = 0
    while produced < bytes {
        let n = Swift.min(bytes - produced, 1 + rng.below(70_000))
        // Half compressible text, half noise.
        chunks.append((0..<n).map { i in i % 2 == 0 ? UInt8(ascii: "a") + UInt8(i % 7) : UInt8(truncatingIfNeeded: rng.next()) })
        produced += n
    }
    return chunks
}

private func smallLogOptions() -> SegmentedLog.Options {
    var options = SegmentedLog.Options()
    options.segmentBytes = 150
    return options
}

/// A log with records 1...40 (durable) and a snapshot at index 10 holding `image(seed, bytes)`.
private func logWithSnapshot(_ fs: SimulatedFileSystem, seed: UInt64, bytes: Int) throws -> (SegmentedLog, SnapshotStore) {
    let log = try SegmentedLog(directory: "/data/log", fileSystem: fs, options: smallLogOptions())
    try log.append((1...40).map { LogRecord(index: $0, term: 1, kind: 0, payload: Array("r\($0)".utf8)) })
    try log.sync()
    let store = try SnapshotStore(directory: "/data/snap", fileSystem: fs)
    try write(store, SnapshotMetaRecord(lastIndex: 10, lastTerm: 1), image(seed, bytes: bytes))
    return (log, store)
}

private func write(_ store: SnapshotStore, _ meta: SnapshotMetaRecord, _ chunks: [[UInt8]]) throws {
    try store.write(meta) { emit in
        for chunk in chunks { try emit(chunk) }
    }
}

private func readBack(_ store: SnapshotStore, _ lastIndex: UInt64? = nil) throws -> ([UInt8], SnapshotMetaRecord) {
    var out: [UInt8] = []
    let meta = try store.read(lastIndex: lastIndex) { out.append(contentsOf: $0) }
    return (out, meta)
}

@Suite struct SnapshotTests {
    @Test("a streamed snapshot round-trips with its metadata and replaces the older one")
    func roundTrip() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let store = try SnapshotStore(directory: "/data/snap", fileSystem: fs)
        #expect(try store.latest() == nil)
        let first = image(1, bytes: 300_000)
        var progress: [UInt64] = []
        try store.write(SnapshotMetaRecord(lastIndex: 10, lastTerm: 2, membership: [1, 2, 3]), progress: { progress.append($0) }) { emit in
            for chunk in first { try emit(chunk) }
        }
        #expect(progress.last == 300_000)
        let (bytes, meta) = try readBack(store)
        #expect(bytes == first.flatMap { $0 })
        #expect(meta == SnapshotMetaRecord(lastIndex: 10, lastTerm: 2, membership: [1, 2, 3]))
        let stored = try fs.readAll("/data/snap/" + SnapshotFormat.fileName(lastIndex: 10)).count
        #expect(stored < 300_000)
        let second = image(2, bytes: 50_000)
        try write(store, SnapshotMetaRecord(lastIndex: 25, lastTerm: 3), second)
        #expect(try store.latest()?.lastIndex == 25)
        #expect(try readBack(store).0 == second.flatMap { $0 })
        #expect(try fs.list("/data/snap") == [SnapshotFormat.fileName(lastIndex: 25)])
        // An empty image is a valid snapshot too.
        try write(store, SnapshotMetaRecord(lastIndex: 30, lastTerm: 3), [])
        #expect(try readBack(store).0.isEmpty)
    }

    @Test("an image pulled in pieces of any size is the image written, checked even when the reader stops early")
    func pulledImage() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let store = try SnapshotStore(directory: "/data/snap", fileSystem: fs)
        let chunks = image(8, bytes: 700_000)
        try write(store, SnapshotMetaRecord(lastIndex: 4, lastTerm: 2, membership: [9]), chunks)
        let expected = chunks.flatMap { $0 }
        for size in [1, 4_096, 300_001, 2_000_000] {
            let (bytes, meta) = try store.readImage { reader in
                #expect(reader.imageLength == UInt64(expected.count))
                let buffer = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: size)
                defer { buffer.deallocate() }
                var out: [UInt8] = []
                // One byte at a time is slow; a prefix is enough for the smallest size.
                while size > 1 || out.count < 20_000 {
                    let n = try reader.read(into: buffer)
                    if n == 0 { break }
                    out.append(contentsOf: buffer[0..<n])
                }
                return (out, reader.metadata)
            }
            #expect(size == 1 ? Array(expected.prefix(bytes.count)) == bytes : bytes == expected, "buffer \(size)")
            #expect(meta == SnapshotMetaRecord(lastIndex: 4, lastTerm: 2, membership: [9]))
        }
        // Byte by byte to the end (zlib may hold output after taking its last input).
        try write(store, SnapshotMetaRecord(lastIndex: 5, lastTerm: 2), image(9, bytes: 60_000))
        let small = image(9, bytes: 60_000).flatMap { $0 }
        let byBytes = try store.readImage { reader in
            let buffer = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: 1)
            defer { buffer.deallocate() }
            var out: [UInt8] = []
            while try reader.read(into: buffer) == 1 { out.append(buffer[0]) }
            return out
        }
        #expect(byBytes == small)
        try write(store, SnapshotMetaRecord(lastIndex: 6, lastTerm: 2), chunks)
        // Damage after the part a reader consumed is still found before `readImage` returns.
        let name = "/data/snap/" + SnapshotFormat.fileName(lastIndex: 6)
        let size = try fs.readAll(name).count
        fs.corrupt(name, at: size - 1_000)
        var consumed = 0
        #expect(throws: OpLogError.self) {
            try store.readImage { reader in
                let buffer = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: 1_000)
                defer { buffer.deallocate() }
                consumed = try reader.read(into: buffer)
            }
        }
        #expect(consumed == 1_000)
    }

    @Test("damage anywhere in a snapshot is detected; a damaged newest snapshot is refused, not skipped")
    func damage() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let store = try SnapshotStore(directory: "/data/snap", fileSystem: fs)
        try write(store, SnapshotMetaRecord(lastIndex: 5, lastTerm: 1), image(3, bytes: 100_000))
        let name = "/data/snap/" + SnapshotFormat.fileName(lastIndex: 5)
        let size = try fs.readAll(name).count
        for offset in stride(from: 0, to: size, by: Swift.max(1, size / 40)) {
            fs.corrupt(name, at: offset)
            do {
                _ = try readBack(store, 5)
                Issue.record("damage at \(offset) of \(size) not detected")
            } catch let error as OpLogError {
                #expect(error.code == .corrupt, "offset \(offset): \(error)")
            } catch {
                Issue.record("unexpected \(error)")
            }
            fs.corrupt(name, at: offset)  // flip back
        }
        #expect(try readBack(store, 5).0.count == 100_000)
        // A newer file under a snapshot name that does not verify is damage (installs go through a
        // rename), and refusing it is the only safe answer: the log may already be compacted.
        let newer = "/data/snap/" + SnapshotFormat.fileName(lastIndex: 9)
        let file = try fs.create(newer)
        try fs.append(file, SnapshotFormat.header + [1, 2, 3])
        do {
            _ = try store.latest()
            Issue.record("a damaged newest snapshot was skipped")
        } catch {
            #expect(error.code == .corrupt)
        }
    }

    @Test("a crash at any point of snapshot install and log compaction keeps every record covered")
    func crashDuringInstallAndCompaction() throws {
        func setUp(_ fs: SimulatedFileSystem) throws -> (SegmentedLog, SnapshotStore) {
            try logWithSnapshot(fs, seed: 4, bytes: 20_000)
        }
        func install(_ log: SegmentedLog, _ store: SnapshotStore) throws {
            try write(store, SnapshotMetaRecord(lastIndex: 30, lastTerm: 1), image(5, bytes: 30_000))
            try log.compact(through: 30)
        }
        let probe = SimulatedFileSystem(durableDirectories: ["/data"])
        let (probeLog, probeStore) = try setUp(probe)
        let start = probe.operations
        probe.mostUnsyncedRemovals = 0
        try install(probeLog, probeStore)
        let span = probe.operations - start
        #expect(probeLog.firstIndex > 10)
        // Compaction removes several segments here, never leaving two removals unsynced.
        #expect(probe.mostUnsyncedRemovals <= 1, "\(probe.mostUnsyncedRemovals) removals unsynced at once")
        for crashAt in 1...span {
            for keepAll in [false, true] {
                let fs = SimulatedFileSystem(durableDirectories: ["/data"])
                let (log, store) = try setUp(fs)
                fs.crashAtOperation = fs.operations + crashAt
                var done = false
                do {
                    try install(log, store)
                    done = true
                } catch {}
                fs.reboot(keepUnsynced: { _, n in keepAll ? n : 0 })
                var options = SegmentedLog.Options()
                options.segmentBytes = 150
                let context = "crash at \(crashAt) of \(span), keep unsynced \(keepAll)"
                let reopened = try SegmentedLog(directory: "/data/log", fileSystem: fs, options: options)
                let snapshots = try SnapshotStore(directory: "/data/snap", fileSystem: fs)
                guard let snapshot = try snapshots.latest() else {
                    Issue.record("\(context): no snapshot")
                    continue
                }
                #expect(snapshot.lastIndex == 10 || snapshot.lastIndex == 30, "\(context)")
                #expect(reopened.lastIndex == 40, "\(context)")
                #expect(reopened.firstIndex <= snapshot.lastIndex + 1, "\(context): records \(snapshot.lastIndex + 1)..<\(reopened.firstIndex) lost")
                #expect(try readBack(snapshots).0 == image(snapshot.lastIndex == 10 ? 4 : 5, bytes: snapshot.lastIndex == 10 ? 20_000 : 30_000).flatMap { $0 }, "\(context)")
                if done { #expect(snapshot.lastIndex == 30) }
            }
        }
    }

    @Test("a process crash after the rename, then compaction on restart, then a power loss loses nothing")
    func processCrashThenCompactionThenPowerLoss() throws {
        for crashAt in 1...40 {
            let fs = SimulatedFileSystem(durableDirectories: ["/data"])
            let options = smallLogOptions()
            let (_, store) = try logWithSnapshot(fs, seed: 6, bytes: 5_000)
            fs.crashAtOperation = fs.operations + crashAt
            try? write(store, SnapshotMetaRecord(lastIndex: 30, lastTerm: 1), image(7, bytes: 5_000))
            // The process restarts (the machine did not) and compacts against what it finds.
            fs.restartProcess()
            let store2 = try SnapshotStore(directory: "/data/snap", fileSystem: fs)
            let log2 = try SegmentedLog(directory: "/data/log", fileSystem: fs, options: options)
            if let found = try store2.latest() { try log2.compact(through: found.lastIndex) }
            // Then the power fails.
            fs.reboot()
            let log3 = try SegmentedLog(directory: "/data/log", fileSystem: fs, options: options)
            let snapshot = try SnapshotStore(directory: "/data/snap", fileSystem: fs).latest()
            let covered = snapshot?.lastIndex ?? 0
            #expect(log3.firstIndex <= covered + 1, "crash at \(crashAt): records \(covered + 1)..<\(log3.firstIndex) lost")
            #expect(log3.lastIndex == 40)
        }
    }

    @Test("a snapshot write that fails (full disk, failed rename) reports it, leaves no partial file, and keeps the older snapshot")
    func failedWrites() throws {
        for failure in ["no space", "rename"] {
            let fs = SimulatedFileSystem(durableDirectories: ["/data"])
            let (_, store) = try logWithSnapshot(fs, seed: 3, bytes: 20_000)
            if failure == "no space" {
                fs.capacity = fs.bytesUsed + 2_000
            } else {
                fs.failRenames = true
            }
            #expect(throws: OpLogError.self, "\(failure)") {
                try store.write(SnapshotMetaRecord(lastIndex: 30, lastTerm: 1)) { emit in for chunk in image(9, bytes: 200_000) { try emit(chunk) } }
            }
            fs.capacity = nil
            fs.failRenames = false
            let left = try fs.list("/data/snap")
            #expect(left.filter { $0.hasSuffix(".tmp") }.isEmpty, "\(failure): \(left)")
            #expect(try store.latest()?.lastIndex == 10, "\(failure)")
            var read: [UInt8] = []
            try store.read { read += $0 }
            #expect(read == image(3, bytes: 20_000).flatMap { $0 }, "\(failure)")
        }
    }

    @Test("an image longer than its trailer says is stopped early; data after the stream is rejected")
    func bombsAndTrailingData() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let store = try SnapshotStore(directory: "/data/snap", fileSystem: fs)
        try write(store, SnapshotMetaRecord(lastIndex: 3, lastTerm: 1), [[UInt8](repeating: 0, count: 8_000_000)])
        let name = "/data/snap/" + SnapshotFormat.fileName(lastIndex: 3)
        let original = try fs.readAll(name)
        guard let parsed = SnapshotFormat.parse(original) else {
            Issue.record("snapshot did not parse")
            return
        }
        func rewrite(_ bytes: [UInt8]) throws {
            let file = try fs.create(name)
            try fs.append(file, bytes)
        }
        // A trailer that claims 10 bytes for an 8 MB stream.
        var lying = parsed.trailer
        lying.imageLength = 10
        try rewrite(Array(original[0..<parsed.body.upperBound]) + SnapshotFormat.encode(lying))
        var delivered = 0
        #expect(throws: OpLogError.self) { try store.readChunks { delivered += $0.count } }
        #expect(delivered < 1_000_000, "inflated \(delivered) bytes before stopping")
        // Junk between the stream and the trailer.
        try rewrite(Array(original[0..<parsed.body.upperBound]) + [UInt8](repeating: 7, count: 5_000) + SnapshotFormat.encode(parsed.trailer))
        #expect(throws: OpLogError.self) { try store.read { _ in } }
    }
}
