public import BanyanBasics
import BanyanOpLog

/// Staged payloads on disk (docs/staged-payloads.md): one file per payload, `<term>-<n>.staged`,
/// each a 44-byte header and the payload. A file is written under `<name>.tmp`, fsynced,
/// renamed, and its directory fsynced: only then is it durable, and only then may its holder
/// say so. Reading one back checks the header (magic, id, length, the payload's CRC32C and the
/// header's own); a file that fails is reported as damaged, never returned.
///
/// Header, little-endian: magic `BNSTAGE1` (8 bytes), term, n, payload length (u64 each), the
/// payload's CRC32C, the CRC32C of the 36 bytes before it, and 0 (u32 each).
///
/// Not thread-safe: one caller at a time (the server's staging thread; the simulator's one
/// thread). A file system instance of its own keeps it apart from the log's.
public final class StagedStore {
    let fileSystem: any FileSystem
    public let directory: String

    static let magic: [UInt8] = Array("BNSTAGE1".utf8)
    public static let headerBytes = 44

    /// What reading a staged file found.
    public enum Loaded: Sendable, Equatable {
        case payload([UInt8], checksum: UInt32)
        case missing
        /// The file is there but fails its checks (`why`); it counts as missing.
        case damaged(String)
    }

    /// Opens (creating, durably) the directory and removes temporary files a crash left.
    public init(directory: String, fileSystem: any FileSystem) throws(OpLogError) {
        self.directory = directory
        self.fileSystem = fileSystem
        do {
            try makeDurableDirectory(directory, fileSystem)
            for name in try fileSystem.list(directory) where name.hasSuffix(".staged.tmp") { try fileSystem.remove(path(name)) }
            // A rename a crash left visible but not durable becomes durable before anyone
            // relies on it (and so do the removals above).
            try fileSystem.syncDirectory(directory)
        } catch {
            throw OpLogError(error)
        }
    }

    /// A store that only reads (`load`, `list`), from any thread with a file system instance of
    /// its own: it creates and removes nothing, so a writer elsewhere is never disturbed.
    public init(readingFrom directory: String, fileSystem: any FileSystem) {
        self.directory = directory
        self.fileSystem = fileSystem
    }

    func path(_ name: String) -> String { directory + "/" + name }

    /// The CRC32C a reference carries for `payload`.
    public static func checksum(_ payload: [UInt8]) -> UInt32 { CRC32C.checksum(payload) }

    /// The ids of the staged files present (temporary ones excluded), in id order.
    public func list() throws(OpLogError) -> [StageID] {
        do {
            return try fileSystem.list(directory).compactMap { StageID(fileName: $0) }.sorted()
        } catch {
            throw OpLogError(error)
        }
    }

    static func header(_ id: StageID, length: Int, checksum: UInt32) -> [UInt8] {
        var w = ByteWriter(capacity: headerBytes)
        w.raw(magic)
        w.u64(id.term)
        w.u64(id.n)
        w.u64(UInt64(length))
        w.u32(checksum)
        w.u32(CRC32C.checksum(w.out))
        w.u32(0)
        return w.finish()
    }

    /// Stores `payload` as `id`, durably, and returns its checksum. A file already there under
    /// that name that reads back whole is kept (the same id always names the same bytes), and
    /// synced again.
    @discardableResult
    public func store(_ id: StageID, _ payload: [UInt8]) throws(OpLogError) -> UInt32 {
        let checksum = Self.checksum(payload)
        let final = path(id.fileName)
        if case .payload(_, let existing) = load(id), existing == checksum {
            // Visible is not durable (an earlier store may have failed at its last fsync):
            // synced again before it is reported.
            do throws(FileSystemError) {
                let file = try fileSystem.open(final)
                defer { fileSystem.close(file) }
                try fileSystem.sync(file)
                try fileSystem.syncDirectory(directory)
            } catch {
                throw OpLogError(error)
            }
            return checksum
        }
        let temporary = final + ".tmp"
        // A failed store leaves no temporary file behind (a full disk would keep them).
        var done = false
        defer { if !done, fileSystem.exists(temporary) { try? fileSystem.remove(temporary) } }
        do throws(FileSystemError) {
            let file = try fileSystem.create(temporary)
            do throws(FileSystemError) {
                try fileSystem.append(file, Self.header(id, length: payload.count, checksum: checksum))
                try fileSystem.append(file, payload)
                try fileSystem.sync(file)
            } catch {
                fileSystem.close(file)
                throw error
            }
            fileSystem.close(file)
            try fileSystem.rename(temporary, to: final)
            try fileSystem.syncDirectory(directory)
        } catch {
            throw OpLogError(error)
        }
        done = true
        return checksum
    }

    /// Reads `id` back and checks it.
    public func load(_ id: StageID) -> Loaded {
        let name = path(id.fileName)
        guard fileSystem.exists(name) else { return .missing }
        let bytes: [UInt8]
        do {
            bytes = try fileSystem.readAll(name)
        } catch {
            return .damaged("cannot read \(name): \(error.message)")
        }
        guard bytes.count >= Self.headerBytes, Array(bytes[0..<8]) == Self.magic else { return .damaged("\(name): no staged-payload header") }
        let fields: (term: UInt64, n: UInt64, length: UInt64, checksum: UInt32, headerChecksum: UInt32)? = bytes.withUnsafeBytes { raw in
            var r = ByteReader(raw, at: 8)
            do throws(ByteCodecError) {
                return (try r.u64("term"), try r.u64("n"), try r.u64("length"), try r.u32("checksum"), try r.u32("headerChecksum"))
            } catch {
                return nil
            }
        }
        guard let fields else { return .damaged("\(name): truncated header") }
        guard CRC32C.checksum(Array(bytes[0..<36])) == fields.headerChecksum else { return .damaged("\(name): header checksum mismatch") }
        guard fields.term == id.term, fields.n == id.n else { return .damaged("\(name): holds \(fields.term)-\(fields.n)") }
        guard fields.length == UInt64(bytes.count - Self.headerBytes) else {
            return .damaged("\(name): \(bytes.count - Self.headerBytes) payload bytes, header says \(fields.length)")
        }
        let payload = Array(bytes[Self.headerBytes...])
        guard Self.checksum(payload) == fields.checksum else { return .damaged("\(name): payload checksum mismatch") }
        return .payload(payload, checksum: fields.checksum)
    }

    /// Removes these files (absent ones are skipped), then makes the removals durable.
    public func remove(_ ids: [StageID]) throws(OpLogError) {
        guard !ids.isEmpty else { return }
        do {
            for id in ids where fileSystem.exists(path(id.fileName)) { try fileSystem.remove(path(id.fileName)) }
            try fileSystem.syncDirectory(directory)
        } catch {
            throw OpLogError(error)
        }
    }
}
