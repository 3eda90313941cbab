import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A failed ballast operation, with the file and the system's reason.
public struct BallastError: Error, CustomStringConvertible {
    public let path: String
    public let message: String
    public var description: String { "ballast \(path): \(message)" }
}

/// The ballast file (docs/operations.md, "Disk space"): space held in reserve in the data
/// directory, `DATA/ballast`, so that a node whose disk filled completely can start again.
///
/// A full disk stops a node (its log write fails), and a node cannot take part again without
/// room for its first writes. Started on a full disk, `banyan serve` removes the ballast
/// (`release`), which gives it that room at once: it starts, serves reads, raises its
/// free-space alarm (so the cluster accepts only deletes) and catches up. Once the disk has
/// twice `min_free_bytes` plus the ballast free again, the node makes it anew (`create`), off
/// the replica loop. Only without a ballast does the start wait for an operator to free space.
///
/// The file's blocks are reserved with `posix_fallocate`, which glibc emulates by writing where
/// the file system cannot allocate, so the space is held rather than promised (a sparse file
/// would reserve nothing). It is made under `ballast.tmp`, synced, and renamed into place, so a
/// crash never leaves a short ballast under the real name.
public struct Ballast: Sendable {
    public let path: String
    /// The size to make it.
    public let bytes: UInt64

    public init(dataDirectory: String, bytes: UInt64) {
        self.path = dataDirectory + "/ballast"
        self.bytes = bytes
    }

    var temporaryPath: String { path + ".tmp" }

    /// The ballast's size on disk now; nil when there is none.
    public func size() -> UInt64? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return UInt64(clamping: info.st_size)
    }

    /// The bytes the file system allocated to the ballast (its blocks); nil when there is none.
    /// At least its size when the space is held, not promised.
    public func allocatedBytes() -> UInt64? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return UInt64(clamping: info.st_blocks) * 512
    }

    /// Whether the ballast is there at its configured size.
    public var isInPlace: Bool { size() == bytes }

    /// Removes the ballast (and any half-made one); returns the bytes released (0: there was
    /// none).
    @discardableResult
    public func release() throws(BallastError) -> UInt64 {
        let leftover = removeLeftover()
        guard let had = size() else { return leftover }
        guard unlink(path) == 0 || errno == ENOENT else { throw failure("cannot remove it") }
        syncDirectory()
        return had + leftover
    }

    /// Removes a half-made ballast (`ballast.tmp`, left by a crash while making one); returns
    /// its size (0: none).
    @discardableResult
    public func removeLeftover() -> UInt64 {
        var info = stat()
        guard stat(temporaryPath, &info) == 0 else { return 0 }
        guard unlink(temporaryPath) == 0 else { return 0 }
        syncDirectory()
        return UInt64(clamping: info.st_size)
    }

    /// Makes the ballast at `bytes` (replacing one of another size). A failure removes what it
    /// made and leaves an existing ballast as it was.
    public func create() throws(BallastError) {
        unlink(temporaryPath)
        let fd = open(temporaryPath, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failure("cannot create \(temporaryPath)") }
        var closed = false
        defer {
            if !closed { close(fd) }
        }
        if bytes > 0 {
            let rc = posix_fallocate(fd, 0, off_t(clamping: bytes))
            guard rc == 0 else {
                unlink(temporaryPath)
                throw BallastError(path: temporaryPath, message: "cannot reserve \(bytes) bytes: \(String(cString: strerror(rc)))")
            }
        }
        guard fsync(fd) == 0 else {
            let error = failure("cannot sync \(temporaryPath)")
            unlink(temporaryPath)
            throw error
        }
        closed = true
        close(fd)
        guard rename(temporaryPath, path) == 0 else {
            let error = failure("cannot rename \(temporaryPath) into place")
            unlink(temporaryPath)
            throw error
        }
        syncDirectory()
    }

    /// Whether the node should make the ballast now: it is missing or of another size, and the
    /// disk has `bytes` free besides twice the alarm's minimum (where a raised alarm clears), so
    /// making it can neither raise the alarm nor keep a raised one from clearing. Never with the
    /// alarm off (`minFree` 0): a node started on its ballast would make it again at once and
    /// fill its disk anew (the configuration also requires the ballast below the minimum, so
    /// that a node started on it raises its alarm).
    public static func shouldCreate(bytes: UInt64, present: UInt64?, free: UInt64, minFree: UInt64) -> Bool {
        guard bytes > 0, minFree > 0, present != bytes else { return false }
        let (twice, overflow) = minFree.multipliedReportingOverflow(by: 2)
        let (need, over) = twice.addingReportingOverflow(bytes)
        return !overflow && !over && free >= need
    }

    private func syncDirectory() {
        let dir = (path as NSString).deletingLastPathComponent
        let fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }
        _ = fsync(fd)
        close(fd)
    }

    private func failure(_ what: String) -> BallastError {
        BallastError(path: path, message: "\(what): \(String(cString: strerror(errno)))")
    }
}
