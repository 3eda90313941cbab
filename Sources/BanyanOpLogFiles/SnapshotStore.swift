public import BanyanOpLog

/// Snapshots of the state machine on disk: a streamed image, zlib-compressed, checksummed, with
/// metadata, installed atomically (temporary file, fsync, rename, directory fsync). Older
/// snapshots are deleted only after the new one is durable.
public final class SnapshotStore {
    let fileSystem: any FileSystem
    public let directory: String
    /// zlib level: 1 (fastest) by default, since snapshots are rewritten often.
    public var compressionLevel: Int32 = 1
    /// Largest image `read` will inflate (a bound against decompression bombs from a damaged or
    /// hostile file; the trailer's length is also enforced while inflating).
    public var maxImageBytes: UInt64 = 1 << 40

    public init(directory: String, fileSystem: any FileSystem) throws(OpLogError) {
        self.directory = directory
        self.fileSystem = fileSystem
        do {
            try makeDurableDirectory(directory, fileSystem)
            // A crash while writing leaves a temporary file: never a snapshot.
            if fileSystem.exists(temporary) { try fileSystem.remove(temporary) }
            // After a process crash between the rename and the directory fsync, a new snapshot's
            // name is visible but not durable; make it durable before anyone relies on it (log
            // compaction against a snapshot a power loss could take back would lose records).
            try fileSystem.syncDirectory(directory)
        } catch {
            throw OpLogError(error)
        }
    }

    private var temporary: String { directory + "/snapshot.tmp" }
    func path(_ name: String) -> String { directory + "/" + name }

    /// Snapshot files present, newest first (by last included index).
    func files() throws(OpLogError) -> [(name: String, lastIndex: UInt64)] {
        do {
            return try fileSystem.list(directory)
                .compactMap { name in SnapshotFormat.lastIndex(ofFile: name).map { (name, $0) } }
                .sorted { $0.1 > $1.1 }
        } catch {
            throw OpLogError(error)
        }
    }

    /// The newest snapshot's metadata. Snapshots are installed by rename, so a file under a
    /// snapshot name that does not verify is damage, not a crash leftover: that is `.corrupt`
    /// (skipping it could hide records the log no longer has).
    public func latest() throws(OpLogError) -> SnapshotMetadata? {
        guard let newest = try files().first else { return nil }
        let bytes: [UInt8]
        do {
            bytes = try fileSystem.readAll(path(newest.name))
        } catch {
            throw OpLogError(error)
        }
        guard let parsed = SnapshotFormat.parse(bytes), parsed.trailer.metadata.lastIndex == newest.lastIndex else {
            throw OpLogError(.corrupt, "snapshot is incomplete or its trailer is damaged", file: path(newest.name))
        }
        return parsed.trailer.metadata
    }

    /// Writes and installs a snapshot. `image` produces the uncompressed image in chunks through
    /// the function it is given, so the image never has to exist in memory as a whole.
    /// `progress` receives the uncompressed bytes written so far.
    /// `removeOlder: false` leaves older snapshots in place for the caller to remove with
    /// `removeSnapshots(olderThan:)` (a node writes snapshots on a background thread and removes
    /// files only on its replica thread, so the two never race over the directory).
    public func write(
        _ metadata: SnapshotMetadata, progress: ((UInt64) -> Void)? = nil, removeOlder: Bool = true,
        image: (_ emit: ([UInt8]) throws -> Void) throws -> Void
    ) throws(OpLogError) {
        do {
            let file = try fileSystem.create(temporary)
            defer { fileSystem.close(file) }
            try fileSystem.append(file, SnapshotFormat.header)
            let deflater = try ZlibStream(.compress(level: compressionLevel))
            var pending: [UInt8] = []
            var length: UInt64 = 0
            var crc: UInt32 = 0
            let sink: (UnsafeBufferPointer<UInt8>) throws -> Void = { compressed in
                pending.append(contentsOf: compressed)
                if pending.count >= 1 << 20 {
                    try self.fileSystem.append(file, pending)
                    pending.removeAll(keepingCapacity: true)
                }
            }
            try image { chunk in
                length += UInt64(chunk.count)
                crc = CRC32C.checksum(chunk, continuing: crc)
                try chunk.withUnsafeBufferPointer { try deflater.process($0, emit: sink) }
                progress?(length)
            }
            let ended = try [UInt8]().withUnsafeBufferPointer { try deflater.process($0, finish: true, emit: sink) }
            guard ended else { throw OpLogError(.io, "zlib did not finish the snapshot stream") }
            pending.append(contentsOf: SnapshotFormat.encode(.init(metadata: metadata, imageLength: length, imageChecksum: crc)))
            try fileSystem.append(file, pending)
            try fileSystem.sync(file)
            let name = SnapshotFormat.fileName(lastIndex: metadata.lastIndex)
            try fileSystem.rename(temporary, to: path(name))
            try fileSystem.syncDirectory(directory)
            // Only now that the new snapshot is durable: remove the older ones.
            if removeOlder { try removeSnapshots(olderThan: metadata.lastIndex) }
        } catch {
            throw SnapshotStore.opLogError(error, otherwise: "snapshot image producer failed")
        }
    }

    /// Removes every snapshot older than `lastIndex` (call only once that one is durable).
    public func removeSnapshots(olderThan lastIndex: UInt64) throws(OpLogError) {
        do {
            var removed = false
            for old in try files() where old.lastIndex < lastIndex {
                try fileSystem.remove(path(old.name))
                removed = true
            }
            if removed { try fileSystem.syncDirectory(directory) }
        } catch {
            throw SnapshotStore.opLogError(error, otherwise: "removing old snapshots failed")
        }
    }

    /// Reads a snapshot (the newest when `lastIndex` is nil), streaming the uncompressed image to
    /// `consume` in chunks, and verifies its length and checksum at the end.
    @discardableResult
    public func read(lastIndex: UInt64? = nil, consume: ([UInt8]) throws -> Void) throws(OpLogError) -> SnapshotMetadata {
        try readChunks(lastIndex: lastIndex) { try consume(Array($0)) }
    }

    /// As `read`, handing out each chunk as a buffer valid only during the call (no copy).
    @discardableResult
    public func readChunks(lastIndex: UInt64? = nil, consume: (UnsafeBufferPointer<UInt8>) throws -> Void) throws(OpLogError) -> SnapshotMetadata {
        let newest = try latest()
        guard let target = lastIndex ?? newest?.lastIndex else { throw OpLogError(.invalidArgument, "no snapshot") }
        return try readFile(path(SnapshotFormat.fileName(lastIndex: target)), consume: consume)
    }

    /// Reads the snapshot assembled from a peer's chunks (not yet installed), verifying it exactly
    /// as `readChunks` does, so that a damaged transfer is refused before it replaces anything.
    @discardableResult
    public func readIncomingChunks(lastIndex: UInt64, consume: (UnsafeBufferPointer<UInt8>) throws -> Void) throws(OpLogError) -> SnapshotMetadata {
        let metadata = try readFile(incomingPath, consume: consume)
        guard metadata.lastIndex == lastIndex else {
            throw OpLogError(.corrupt, "the received snapshot ends at \(metadata.lastIndex), not \(lastIndex)", file: incomingPath)
        }
        return metadata
    }

    /// Discards a received snapshot that will not be installed.
    public func discardIncoming() {
        try? fileSystem.remove(incomingPath)
    }

    private func readFile(_ name: String, consume: (UnsafeBufferPointer<UInt8>) throws -> Void) throws(OpLogError) -> SnapshotMetadata {
        do {
            let bytes = try fileSystem.readAll(name)
            guard let parsed = SnapshotFormat.parse(bytes) else {
                throw OpLogError(.corrupt, "snapshot is incomplete or its trailer is damaged", file: name)
            }
            let expected = parsed.trailer.imageLength
            guard expected <= maxImageBytes else {
                throw OpLogError(.corrupt, "snapshot claims a \(expected)-byte image; the limit is \(maxImageBytes)", file: name)
            }
            let inflater = try ZlibStream(.decompress)
            var length: UInt64 = 0
            var crc: UInt32 = 0
            let ended = try bytes.withUnsafeBufferPointer { b in
                try inflater.process(UnsafeBufferPointer(rebasing: b[parsed.body])) { chunk in
                    length += UInt64(chunk.count)
                    // Stop a decompression bomb as soon as it passes the declared length.
                    guard length <= expected else {
                        throw OpLogError(.corrupt, "snapshot image is longer than its trailer says", file: name)
                    }
                    crc = CRC32C.checksum(chunk, continuing: crc)
                    try consume(chunk)
                }
            }
            guard ended, length == parsed.trailer.imageLength, crc == parsed.trailer.imageChecksum else {
                throw OpLogError(.corrupt, "snapshot image fails its length or checksum", file: name)
            }
            return parsed.trailer.metadata
        } catch {
            throw SnapshotStore.opLogError(error, otherwise: "snapshot consumer failed")
        }
    }
}

extension SnapshotStore {
    /// Our own errors pass through; file-system errors are wrapped; anything else came from the
    /// caller's producer or consumer.
    static func opLogError(_ error: any Error, otherwise context: String) -> OpLogError {
        switch error {
        case let error as OpLogError: return error
        case let error as FileSystemError: return OpLogError(error)
        default: return OpLogError(.io, "\(context): \(error)")
        }
    }
}

extension SnapshotStore {
    /// The size of the snapshot file at `lastIndex` (its raw bytes are what peers transfer).
    public func fileSize(lastIndex: UInt64) throws(OpLogError) -> Int {
        do {
            let file = try fileSystem.open(path(SnapshotFormat.fileName(lastIndex: lastIndex)))
            defer { fileSystem.close(file) }
            return try fileSystem.size(file)
        } catch {
            throw OpLogError(error)
        }
    }

    /// Raw bytes of the snapshot file at `lastIndex`, for streaming it to a peer.
    public func rawChunk(lastIndex: UInt64, offset: Int, maxBytes: Int) throws(OpLogError) -> [UInt8] {
        do {
            return try fileSystem.read(path(SnapshotFormat.fileName(lastIndex: lastIndex)), offset: offset, count: maxBytes)
        } catch {
            throw OpLogError(error)
        }
    }

    /// Where a snapshot received from a peer is assembled before it is installed.
    public var incomingPath: String { directory + "/incoming.tmp" }

    /// Starts (offset 0) or continues an incoming snapshot file with `bytes` at `offset`.
    /// Returns false when `offset` is not where the file ends (a gap or a repeat is dropped).
    public func writeIncoming(offset: UInt64, bytes: [UInt8]) throws(OpLogError) -> Bool {
        do {
            let file: FileID
            if offset == 0 {
                file = try fileSystem.create(incomingPath)
            } else {
                guard fileSystem.exists(incomingPath) else { return false }
                file = try fileSystem.open(incomingPath)
            }
            defer { fileSystem.close(file) }
            guard try fileSystem.size(file) == Int(offset) else { return false }
            try fileSystem.append(file, bytes)
            return true
        } catch {
            throw OpLogError(error)
        }
    }

    /// Installs the assembled incoming snapshot, which must be a complete snapshot file whose
    /// metadata says `lastIndex`: fsync, rename, directory fsync, then older snapshots go.
    public func installIncoming(lastIndex: UInt64) throws(OpLogError) -> SnapshotMetadata {
        do {
            let bytes = try fileSystem.readAll(incomingPath)
            guard let parsed = SnapshotFormat.parse(bytes), parsed.trailer.metadata.lastIndex == lastIndex else {
                throw OpLogError(.corrupt, "the received snapshot is incomplete or damaged", file: incomingPath)
            }
            let file = try fileSystem.open(incomingPath)
            try fileSystem.sync(file)
            fileSystem.close(file)
            try fileSystem.rename(incomingPath, to: path(SnapshotFormat.fileName(lastIndex: lastIndex)))
            try fileSystem.syncDirectory(directory)
            try removeSnapshots(olderThan: lastIndex)
            return parsed.trailer.metadata
        } catch {
            throw SnapshotStore.opLogError(error, otherwise: "installing the received snapshot failed")
        }
    }
}

extension SegmentedLog {
    /// Removes whole segments whose records are all at or below `index` (covered by a durable
    /// snapshot), oldest first, so a crash part-way leaves a suffix of the log. The active
    /// segment is never removed.
    public func compact(through index: UInt64) throws(OpLogError) {
        try removeLeadingSegments { lastIndexOfSegment in lastIndexOfSegment <= index }
    }

}
