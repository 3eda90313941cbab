/// Why a file-system operation failed.
public struct FileSystemError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Code: Sendable, Equatable {
        case notFound
        case noSpace
        case io
        /// The simulated machine crashed at this operation (tests only).
        case crashed
    }

    public let code: Code
    public let path: String
    public let message: String

    public init(_ code: Code, path: String, _ message: String) {
        self.code = code
        self.path = path
        self.message = message
    }

    public var description: String { "\(message) (\(path))" }
}

/// An open file.
public struct FileID: Hashable, Sendable {
    public let raw: Int
    public init(raw: Int) { self.raw = raw }
}

/// Every way the log touches storage. Implementations: `PosixFileSystem` (real files) and
/// `SimulatedFileSystem` (memory, with crash, torn-write and disk-full faults).
public protocol FileSystem: AnyObject {
    func makeDirectory(_ path: String) throws(FileSystemError)
    func list(_ directory: String) throws(FileSystemError) -> [String]
    func exists(_ path: String) -> Bool
    /// Creates (or empties) a file and opens it for writing.
    func create(_ path: String) throws(FileSystemError) -> FileID
    /// Opens an existing file for writing.
    func open(_ path: String) throws(FileSystemError) -> FileID
    /// Writes `bytes` at the end of the file.
    func append(_ file: FileID, _ bytes: [UInt8]) throws(FileSystemError)
    /// Writes `bytes` at `offset`, over what is there and past the end as needed (a gap between
    /// the old end and `offset` reads as zeros).
    func write(_ file: FileID, at offset: Int, _ bytes: [UInt8]) throws(FileSystemError)
    /// Makes the file's data durable (fdatasync).
    func sync(_ file: FileID) throws(FileSystemError)
    /// Makes the file at `path` durable (fsync) and then drops its pages from the page cache, so
    /// that the next reads come from the disk. After a failed fsync, Linux marks the pages whose
    /// write failed clean: they still show the written bytes, which the disk does not hold.
    /// Recovery calls this before reading segments that may hold unsynced writes.
    func dropCache(_ path: String) throws(FileSystemError)
    /// Cuts the file to `size` bytes (or extends it with zeros).
    func truncate(_ file: FileID, to size: Int) throws(FileSystemError)
    func size(_ file: FileID) throws(FileSystemError) -> Int
    func close(_ file: FileID)
    func readAll(_ path: String) throws(FileSystemError) -> [UInt8]
    /// The size of the file at `path` (without opening it for writing).
    func fileSize(_ path: String) throws(FileSystemError) -> Int
    /// Up to `count` bytes at `offset` (fewer at the end of the file).
    func read(_ path: String, offset: Int, count: Int) throws(FileSystemError) -> [UInt8]
    func rename(_ from: String, to: String) throws(FileSystemError)
    func remove(_ path: String) throws(FileSystemError)
    /// Makes creations, renames and removals in `directory` durable.
    func syncDirectory(_ directory: String) throws(FileSystemError)
}
