import BanyanClientCore
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A value guarded by a lock (any thread).
final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value
    init(_ value: Value) { self.value = value }
    func withLock<T>(_ body: (inout Value) throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

/// The SDK's disk cache file (docs/swift-sdk.md, "Offline and persistence"): `ClientStore`
/// records appended as they come, synced when they hold a write, and rewritten whole (to a
/// temporary file, synced, renamed over) when the file outgrows the cache size. One database per
/// file in a process. Used on the database's own thread only.
final class CacheFile: @unchecked Sendable {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    let path: String
    let budget: Int
    let restored: ClientStore.Restored
    private var fd: Int32
    private var size: Int
    /// The size of the last compaction's result: compacting again only once the file doubled it.
    private var compactedSize: Int

    private static let inUse = Locked(Set<String>())

    init(path: String, budget: Int) throws {
        self.path = path
        self.budget = budget
        let directory = (path as NSString).deletingLastPathComponent
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw Failure(description: "cannot create the cache directory \(directory): \(error)")
        }
        guard Self.inUse.withLock({ $0.insert(path).inserted }) else {
            throw Failure(description: "another database in this process uses the cache file \(path)")
        }
        var bytes: [UInt8] = []
        if let data = FileManager.default.contents(atPath: path) { bytes = Array(data) }
        var state = ClientStore.restore(bytes)
        let fresh = state == nil
        if state == nil { state = ClientStore.Restored() }
        restored = state ?? ClientStore.Restored()
        let flags = O_WRONLY | O_CREAT | (fresh ? O_TRUNC : 0)
        fd = open(path, flags, 0o600)
        guard fd >= 0 else {
            Self.inUse.withLock { _ = $0.remove(path) }
            throw Failure(description: "cannot open the cache file \(path): errno \(errno)")
        }
        if fresh {
            size = 0
            compactedSize = 0
            write(ClientStore.magic)
        } else {
            // A torn tail (an append cut by a crash) is cut off; what follows overwrites it.
            size = restored.validBytes
            compactedSize = size
            _ = ftruncate(fd, off_t(size))
            if restored.olderFormat {
                // The current format from now on (same length, in place, synced before any new record):
                // an older SDK then sees no cache instead of a record it cannot read.
                let magic = ClientStore.magic
                _ = magic.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
                _ = fsync(fd)
            }
            _ = lseek(fd, off_t(size), SEEK_SET)
        }
    }

    var needsCompaction: Bool { size > max(budget, 2 * compactedSize) }

    func append(_ records: [ClientStore.Record]) {
        var bytes: [UInt8] = []
        for r in records { bytes += ClientStore.encode(r) }
        write(bytes)
    }

    private func write(_ bytes: [UInt8]) {
        guard fd >= 0 else { return }
        var done = 0
        bytes.withUnsafeBytes { raw in
            while done < raw.count {
                let n = Foundation.write(fd, raw.baseAddress.map { $0 + done }, raw.count - done)
                if n <= 0 {
                    if n < 0 && errno == EINTR { continue }
                    break
                }
                done += n
            }
        }
        size += done
    }

    func sync() {
        guard fd >= 0 else { return }
        _ = fsync(fd)
    }

    /// Replaces the file with `records` (written beside it, synced, renamed over).
    func compact(_ records: [ClientStore.Record]) {
        let temporary = path + ".tmp"
        let t = open(temporary, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        guard t >= 0 else { return }
        var bytes = ClientStore.magic
        for r in records { bytes += ClientStore.encode(r) }
        var done = 0
        bytes.withUnsafeBytes { raw in
            while done < raw.count {
                let n = Foundation.write(t, raw.baseAddress.map { $0 + done }, raw.count - done)
                if n <= 0 {
                    if n < 0 && errno == EINTR { continue }
                    break
                }
                done += n
            }
        }
        guard done == bytes.count, fsync(t) == 0 else {
            _ = Foundation.close(t)
            _ = unlink(temporary)
            return
        }
        _ = Foundation.close(t)
        guard rename(temporary, path) == 0 else {
            _ = unlink(temporary)
            return
        }
        _ = Foundation.close(fd)
        fd = open(path, O_WRONLY | O_APPEND, 0o600)
        size = bytes.count
        compactedSize = size
    }

    func close() {
        if fd >= 0 { _ = Foundation.close(fd) }
        fd = -1
        Self.inUse.withLock { _ = $0.remove(path) }
    }
}
