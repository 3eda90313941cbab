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

    /// `removeLeftovers`: delete temporary files a crashed writer left behind. The store a node
    /// opens at start-up does; a second store opened while another may be writing (the node's
    /// background snapshot writer) must not, or it would delete that writer's file.
    public init(directory: String, fileSystem: any FileSystem, removeLeftovers: Bool = true) throws(OpLogError) {
        self.directory = directory
        self.fileSystem = fileSystem
        do {
            try makeDurableDirectory(directory, fileSystem)
            // A crash while writing leaves a temporary file: never a snapshot.
            if removeLeftovers {
                for name in try fileSystem.list(directory) where name.hasPrefix("snapshot") && name.hasSuffix(".tmp") {
                    try fileSystem.remove(path(name))
                }
            }
            // After a process crash between the rename and the directory fsync, a new snapshot's
            // name is visible but not durable; make it durable before anyone relies on it (log
            // compaction against a snapshot a power loss could take back would lose records).
            try fileSystem.syncDirectory(directory)
        } catch {
            throw OpLogError(error)
        }
    }

    /// Each write has its own temporary file, so two writers (say, one still running when a
    /// reloaded node starts another) can never rename each other's partial file into place.
    private func temporary(for lastIndex: UInt64) -> String {
        directory + "/snapshot-\(lastIndex)-\(UInt64.random(in: 1...UInt64.max)).tmp"
    }
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
    public func latest() throws(OpLogError) -> SnapshotMetaRecord? {
        guard let newest = try files().first else { return nil }
        let parsed: (body: Range<Int>, trailer: SnapshotFormat.Trailer)?
        do {
            parsed = try trailer(of: path(newest.name))
        } catch {
            throw OpLogError(error)
        }
        guard let parsed, parsed.trailer.metadata.lastIndex == newest.lastIndex else {
            throw OpLogError(.corrupt, "snapshot is incomplete or its trailer is damaged", file: path(newest.name))
        }
        return parsed.trailer.metadata
    }

    /// A snapshot file's body range and trailer, reading only its header and trailer (nil when
    /// the file is not a complete snapshot).
    func trailer(of file: String) throws(FileSystemError) -> (body: Range<Int>, trailer: SnapshotFormat.Trailer)? {
        let size = try fileSystem.fileSize(file)
        let tailEnd = SnapshotFormat.footer.count + 8
        guard size >= SnapshotFormat.header.count + tailEnd,
            let needed = SnapshotFormat.trailerBytes(last16: try fileSystem.read(file, offset: size - tailEnd, count: tailEnd))
        else { return nil }
        let count = Swift.min(needed, size - SnapshotFormat.header.count)
        let head = try fileSystem.read(file, offset: 0, count: SnapshotFormat.header.count)
        return SnapshotFormat.parse(head: head, tail: try fileSystem.read(file, offset: size - count, count: count), fileSize: size)
    }

    /// Writes and installs a snapshot. `image` produces the uncompressed image in chunks through
    /// the function it is given, so the image never has to exist in memory as a whole.
    /// `progress` receives the uncompressed bytes written so far.
    /// `removeOlder: false` leaves older snapshots in place for the caller to remove with
    /// `removeSnapshots(olderThan:)` (a node writes snapshots on a background thread and removes
    /// files only on its replica thread, so the two never race over the directory).
    public func write(
        _ metadata: SnapshotMetaRecord, progress: ((UInt64) -> Void)? = nil, removeOlder: Bool = true,
        image: (_ emit: ([UInt8]) throws -> Void) throws -> Void
    ) throws(OpLogError) {
        let temporary = temporary(for: metadata.lastIndex)
        var renamed = false
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
            renamed = true
            try fileSystem.syncDirectory(directory)
            // Only now that the new snapshot is durable: remove the older ones.
            if removeOlder { try removeSnapshots(olderThan: metadata.lastIndex) }
        } catch {
            // A failed write (a full disk, say) must not leave its partial file taking space.
            if !renamed { try? fileSystem.remove(temporary) }
            throw SnapshotStore.opLogError(error, otherwise: "snapshot image producer failed")
        }
    }

    /// Removes every snapshot older than `lastIndex` (call only once that one is durable), but
    /// the one at `keeping` (a snapshot still streamed to a follower).
    public func removeSnapshots(olderThan lastIndex: UInt64, keeping: UInt64? = nil) throws(OpLogError) {
        do {
            var removed = false
            for old in try files() where old.lastIndex < lastIndex && old.lastIndex != keeping {
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
    public func read(lastIndex: UInt64? = nil, consume: ([UInt8]) throws -> Void) throws(OpLogError) -> SnapshotMetaRecord {
        try readChunks(lastIndex: lastIndex) { try consume(Array($0)) }
    }

    /// As `read`, handing out each chunk as a buffer valid only during the call (no copy).
    @discardableResult
    public func readChunks(lastIndex: UInt64? = nil, consume: (UnsafeBufferPointer<UInt8>) throws -> Void) throws(OpLogError) -> SnapshotMetaRecord {
        try readImage(lastIndex: lastIndex) { image in
            try image.pump(into: consume)
        }
    }

    /// Opens a snapshot (the newest when `lastIndex` is nil) and lets `body` pull its image
    /// through `SnapshotImageReader.read(into:)`, inflating only as much as each call asks for,
    /// so neither the compressed file nor the image is ever held whole. Whatever `body` leaves
    /// unread is inflated and checked afterwards: `readImage` returns only when the image's
    /// length and checksum verify.
    public func readImage<Result>(lastIndex: UInt64? = nil, _ body: (SnapshotImageReader) throws -> Result) throws(OpLogError) -> Result {
        let newest = try latest()
        guard let target = lastIndex ?? newest?.lastIndex else { throw OpLogError(.invalidArgument, "no snapshot") }
        return try readImage(file: path(SnapshotFormat.fileName(lastIndex: target)), body)
    }

    /// Reads the snapshot assembled from a peer's chunks (not yet installed), verifying it exactly
    /// as `readChunks` does, so that a damaged transfer is refused before it replaces anything.
    @discardableResult
    public func readIncomingChunks(lastIndex: UInt64, consume: (UnsafeBufferPointer<UInt8>) throws -> Void) throws(OpLogError) -> SnapshotMetaRecord {
        try readIncomingImage(lastIndex: lastIndex) { image in
            try image.pump(into: consume)
        }
    }

    /// As `readImage`, for the snapshot assembled from a peer's chunks: `body` pulls the image,
    /// and the call returns only when the whole image verified and ends at `lastIndex`.
    public func readIncomingImage<Result>(lastIndex: UInt64, _ body: (SnapshotImageReader) throws -> Result) throws(OpLogError) -> Result {
        var endsAt: UInt64 = 0
        let result = try readImage(file: incomingPath) { image in
            endsAt = image.metadata.lastIndex
            return try body(image)
        }
        guard endsAt == lastIndex else {
            throw OpLogError(.corrupt, "the received snapshot ends at \(endsAt), not \(lastIndex)", file: incomingPath)
        }
        return result
    }

    /// Discards a received snapshot that will not be installed.
    public func discardIncoming() {
        try? fileSystem.remove(incomingPath)
    }

    private func readImage<Result>(file name: String, _ body: (SnapshotImageReader) throws -> Result) throws(OpLogError) -> Result {
        do {
            guard let parsed = try trailer(of: name) else {
                throw OpLogError(.corrupt, "snapshot is incomplete or its trailer is damaged", file: name)
            }
            guard parsed.trailer.imageLength <= maxImageBytes else {
                throw OpLogError(.corrupt, "snapshot claims a \(parsed.trailer.imageLength)-byte image; the limit is \(maxImageBytes)", file: name)
            }
            let reader = try SnapshotImageReader(fileSystem: fileSystem, path: name, body: parsed.body, trailer: parsed.trailer)
            let result = try body(reader)
            try reader.drain()
            return result
        } catch {
            throw SnapshotStore.opLogError(error, otherwise: "snapshot consumer failed")
        }
    }
}

/// One snapshot's image, read on demand: compressed bytes come from the file in slices of at
/// most 256 KiB and are inflated straight into the caller's buffer. The length and checksum are
/// checked as the image ends; a stream that runs past its declared length stops at once.
public final class SnapshotImageReader {
    public let metadata: SnapshotMetaRecord
    /// The image length the trailer declares.
    public let imageLength: UInt64
    private let fileSystem: any FileSystem
    private let path: String
    private let expectedChecksum: UInt32
    private let inflater: ZlibStream
    private let input: UnsafeMutableBufferPointer<UInt8>
    private var nextOffset: Int
    private let bodyEnd: Int
    private var produced: UInt64 = 0
    private var crc: UInt32 = 0
    private var verified = false

    init(fileSystem: any FileSystem, path: String, body: Range<Int>, trailer: SnapshotFormat.Trailer) throws(OpLogError) {
        self.fileSystem = fileSystem
        self.path = path
        metadata = trailer.metadata
        imageLength = trailer.imageLength
        expectedChecksum = trailer.imageChecksum
        nextOffset = body.lowerBound
        bodyEnd = body.upperBound
        inflater = try ZlibStream(.decompress)
        input = .allocate(capacity: Swift.max(1, Swift.min(body.count, 256 * 1024)))
    }

    deinit { input.deallocate() }

    /// Fills `buffer` with the image's next bytes: all of it unless the image ends first, 0 once
    /// the whole image has been read and verified. Damage is `.corrupt`.
    public func read(into buffer: UnsafeMutableBufferPointer<UInt8>) throws(OpLogError) -> Int {
        var filled = 0
        while filled < buffer.count && !verified {
            if inflater.pendingInput == 0 && nextOffset < bodyEnd {
                let slice: [UInt8]
                do {
                    slice = try fileSystem.read(path, offset: nextOffset, count: Swift.min(input.count, bodyEnd - nextOffset))
                } catch {
                    throw OpLogError(error)
                }
                guard !slice.isEmpty else { throw OpLogError(.corrupt, "snapshot image is cut short", file: path) }
                _ = UnsafeMutableBufferPointer(rebasing: input[0..<slice.count]).initialize(from: slice)
                inflater.setInput(UnsafeBufferPointer(rebasing: input[0..<slice.count]))
                nextOffset += slice.count
            }
            let out = UnsafeMutableBufferPointer(rebasing: buffer[filled...])
            let (count, ended) = try inflater.inflateSome(into: out)
            produced += UInt64(count)
            // Stop a decompression bomb as soon as it passes the declared length.
            guard produced <= imageLength else {
                throw OpLogError(.corrupt, "snapshot image is longer than its trailer says", file: path)
            }
            crc = CRC32C.checksum(UnsafeBufferPointer(rebasing: out[0..<count]), continuing: crc)
            filled += count
            // zlib may still hold output after taking the last input; only no progress at all
            // without input left means the stream is cut short.
            if !ended && count == 0 && inflater.pendingInput == 0 && nextOffset == bodyEnd {
                throw OpLogError(.corrupt, "snapshot image is cut short", file: path)
            }
            if ended {
                // Anything after the end of the stream is not part of it.
                guard inflater.pendingInput == 0, nextOffset == bodyEnd else {
                    throw OpLogError(.corrupt, "data after the end of the zlib stream", file: path)
                }
                guard produced == imageLength, crc == expectedChecksum else {
                    throw OpLogError(.corrupt, "snapshot image fails its length or checksum", file: path)
                }
                verified = true
            }
        }
        return filled
    }

    /// Hands the rest of the image to `consume` in chunks valid only during each call; the
    /// metadata once the image has verified.
    func pump(into consume: (UnsafeBufferPointer<UInt8>) throws -> Void) throws -> SnapshotMetaRecord {
        let buffer = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: 256 * 1024)
        defer { buffer.deallocate() }
        while true {
            let n = try read(into: buffer)
            if n == 0 { break }
            try consume(UnsafeBufferPointer(rebasing: buffer[0..<n]))
        }
        return metadata
    }

    /// Reads whatever is left and verifies the image.
    func drain() throws(OpLogError) {
        guard !verified else { return }
        let scratch = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: 64 * 1024)
        defer { scratch.deallocate() }
        while try read(into: scratch) > 0 {}
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
    public func installIncoming(lastIndex: UInt64) throws(OpLogError) -> SnapshotMetaRecord {
        do {
            guard let parsed = try trailer(of: incomingPath), parsed.trailer.metadata.lastIndex == lastIndex else {
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
