#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The real file system, through POSIX calls. Not thread-safe: one owner at a time.
public final class PosixFileSystem: FileSystem {
    private var descriptors: [Int: Int32] = [:]
    private var paths: [Int: String] = [:]
    private var nextID = 1

    public init() {}

    private func failure(_ path: String, _ what: String) -> FileSystemError {
        let err = errno
        let text = String(cString: strerror(err))
        let code: FileSystemError.Code = err == ENOENT ? .notFound : (err == ENOSPC ? .noSpace : .io)
        return FileSystemError(code, path: path, "\(what) failed: \(text)")
    }

    private func descriptor(_ file: FileID) throws(FileSystemError) -> (Int32, String) {
        guard let fd = descriptors[file.raw], let path = paths[file.raw] else {
            throw FileSystemError(.io, path: "?", "file handle \(file.raw) is not open")
        }
        return (fd, path)
    }

    /// Directories and files of a data directory are the node's alone (0700 and 0600): they hold
    /// every namespace's data and the rules, readable by no other user (docs/security.md).
    public func makeDirectory(_ path: String) throws(FileSystemError) {
        if mkdir(path, 0o700) != 0 && errno != EEXIST { throw failure(path, "mkdir") }
    }

    public func list(_ directory: String) throws(FileSystemError) -> [String] {
        guard let dir = opendir(directory) else { throw failure(directory, "opendir") }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name != "." && name != ".." { names.append(name) }
        }
        return names.sorted()
    }

    public func exists(_ path: String) -> Bool { access(path, F_OK) == 0 }

    private func openFile(_ path: String, flags: Int32) throws(FileSystemError) -> FileID {
        let fd = Glibc.open(path, flags | O_WRONLY | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failure(path, "open") }
        let id = nextID
        nextID += 1
        descriptors[id] = fd
        paths[id] = path
        return FileID(raw: id)
    }

    public func create(_ path: String) throws(FileSystemError) -> FileID {
        try openFile(path, flags: O_CREAT | O_TRUNC)
    }

    public func open(_ path: String) throws(FileSystemError) -> FileID {
        try openFile(path, flags: 0)
    }

    /// No O_APPEND on the descriptor (Linux's pwrite would ignore its offset): the end is found
    /// with lseek, and the file has one owner.
    public func append(_ file: FileID, _ bytes: [UInt8]) throws(FileSystemError) {
        let (fd, path) = try descriptor(file)
        let end = lseek(fd, 0, SEEK_END)
        guard end >= 0 else { throw failure(path, "lseek") }
        try writeAll(fd, path, bytes, at: Int(end))
    }

    public func write(_ file: FileID, at offset: Int, _ bytes: [UInt8]) throws(FileSystemError) {
        let (fd, path) = try descriptor(file)
        try writeAll(fd, path, bytes, at: offset)
    }

    private func writeAll(_ fd: Int32, _ path: String, _ bytes: [UInt8], at offset: Int) throws(FileSystemError) {
        var written = 0
        while written < bytes.count {
            let n = bytes.withUnsafeBytes { raw in
                pwrite(fd, raw.baseAddress.map { $0 + written }, bytes.count - written, off_t(offset + written))
            }
            if n < 0 {
                if errno == EINTR { continue }
                throw failure(path, "write")
            }
            written += n
        }
    }

    public func sync(_ file: FileID) throws(FileSystemError) {
        let (fd, path) = try descriptor(file)
        if fdatasync(fd) != 0 { throw failure(path, "fdatasync") }
    }

    /// fsync, then `posix_fadvise(POSIX_FADV_DONTNEED)`, which drops the file's clean pages
    /// (dirty ones would stay, hence the fsync first): later reads go to the disk.
    public func dropCache(_ path: String) throws(FileSystemError) {
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw failure(path, "open") }
        defer { _ = Glibc.close(fd) }
        if fsync(fd) != 0 { throw failure(path, "fsync") }
        #if canImport(Glibc)
        let result = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)
        if result != 0 {
            errno = result  // posix_fadvise returns the error number instead of setting errno
            throw failure(path, "posix_fadvise(DONTNEED)")
        }
        #endif
    }

    public func truncate(_ file: FileID, to size: Int) throws(FileSystemError) {
        let (fd, path) = try descriptor(file)
        if ftruncate(fd, off_t(size)) != 0 { throw failure(path, "ftruncate") }
    }

    public func size(_ file: FileID) throws(FileSystemError) -> Int {
        let (fd, path) = try descriptor(file)
        var info = stat()
        if fstat(fd, &info) != 0 { throw failure(path, "fstat") }
        return Int(info.st_size)
    }

    public func close(_ file: FileID) {
        if let fd = descriptors.removeValue(forKey: file.raw) { _ = Glibc.close(fd) }
        paths[file.raw] = nil
    }

    public func readAll(_ path: String) throws(FileSystemError) -> [UInt8] {
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw failure(path, "open") }
        defer { _ = Glibc.close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw failure(path, "read")
            }
            if n == 0 { break }
            bytes.append(contentsOf: buffer[0..<n])
        }
        return bytes
    }

    public func fileSize(_ path: String) throws(FileSystemError) -> Int {
        var info = stat()
        if stat(path, &info) != 0 { throw failure(path, "stat") }
        return Int(info.st_size)
    }

    public func read(_ path: String, offset: Int, count: Int) throws(FileSystemError) -> [UInt8] {
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw failure(path, "open") }
        defer { _ = Glibc.close(fd) }
        var bytes = [UInt8](repeating: 0, count: max(0, count))
        var filled = 0
        while filled < bytes.count {
            let n = bytes.withUnsafeMutableBytes { b in
                pread(fd, b.baseAddress.map { $0 + filled }, b.count - filled, off_t(offset + filled))
            }
            if n < 0 {
                if errno == EINTR { continue }
                throw failure(path, "pread")
            }
            if n == 0 { break }
            filled += n
        }
        bytes.removeLast(bytes.count - filled)
        return bytes
    }

    public func rename(_ from: String, to: String) throws(FileSystemError) {
        if Glibc.rename(from, to) != 0 { throw failure(from, "rename to \(to)") }
    }

    public func remove(_ path: String) throws(FileSystemError) {
        if unlink(path) != 0 && errno != ENOENT { throw failure(path, "unlink") }
    }

    public func syncDirectory(_ directory: String) throws(FileSystemError) {
        let fd = Glibc.open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw failure(directory, "open directory") }
        defer { _ = Glibc.close(fd) }
        if fsync(fd) != 0 { throw failure(directory, "fsync directory") }
    }
}
