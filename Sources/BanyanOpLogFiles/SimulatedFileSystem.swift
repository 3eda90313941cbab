/// A file system in memory that remembers what is durable, for crash tests and the simulator.
///
/// Every file keeps what was written and what an fsync made durable; every directory keeps which
/// names a directory fsync made durable. `reboot` models power loss: only durable names survive,
/// each file reverts to its durable bytes plus (optionally) a prefix of the bytes appended after
/// them, the way a disk may persist part of an unsynced write; where unsynced writes went over
/// existing bytes, each changed sector keeps its old or its new content independently (write-back
/// does not go in order). Faults: fail the N-th mutating operation (a crash at that point), tear
/// a write after k bytes, a capacity (ENOSPC), failing renames, a failing fsync (`failNextSync`:
/// the bytes it should have written stay visible to reads, as Linux's page cache shows them, but
/// never reach the disk, not even with a later fsync; `dropCache` and `reboot` show the disk).
/// Deterministic; not thread-safe.
public final class SimulatedFileSystem: FileSystem {
    private struct Inode {
        var data: [UInt8] = []
        var durable: [UInt8] = []
        /// Existing bytes were written over since the last sync: a reboot then keeps or loses
        /// each changed sector on its own, even when the file also only grew.
        var overwritten = false
        /// Byte ranges a failed sync did not write: reads (`data`) still show them, the disk
        /// holds the durable bytes there (zeros past the durable end), and no later sync writes
        /// them (Linux marked their pages clean). A later write over them makes them dirty again.
        var lost: [Range<Int>] = []
        /// Covers every byte written (or zero-filled by a size change) since the last successful
        /// sync: outside it (and past `durable`'s end), `data` equals `durable` except in `lost`.
        /// Lets a sync copy and a reboot compare only what changed, not the whole file.
        var dirty: Range<Int>?

        mutating func touch(_ range: Range<Int>) {
            guard !range.isEmpty else { return }
            dirty = dirty.map { Swift.min($0.lowerBound, range.lowerBound)..<Swift.max($0.upperBound, range.upperBound) } ?? range
        }

        /// `durable` becomes the disk image after a successful sync, copying only what changed.
        mutating func syncDurable() {
            if !lost.isEmpty {
                durable = diskImage()
            } else {
                if durable.count > data.count { durable.removeLast(durable.count - data.count) }
                if let d = dirty {
                    let low = Swift.min(d.lowerBound, durable.count)
                    let high = Swift.min(d.upperBound, durable.count)
                    if low < high { durable.replaceSubrange(low..<high, with: data[low..<high]) }
                }
                if durable.count < data.count { durable.append(contentsOf: data[durable.count...]) }
            }
            dirty = nil
        }

        /// What the disk holds for `data` after a sync: `data` except in the lost ranges.
        func diskImage() -> [UInt8] {
            var image = data
            for range in lost {
                for i in range where i < image.count { image[i] = i < durable.count ? durable[i] : 0 }
            }
            return image
        }
    }

    private var inodes: [Int: Inode] = [:]
    private var names: [String: Int] = [:]
    private var durableNames: [String: Int] = [:]
    private var directories: Set<String> = ["/"]
    /// Directories whose entry in their parent is durable.
    private var durableDirectories: Set<String> = ["/"]
    private var handles: [Int: (inode: Int, path: String)] = [:]
    private var nextInode = 1
    private var nextHandle = 1

    /// Mutating operations performed so far (creates, appends, syncs, truncates, renames,
    /// removes, directory syncs).
    public private(set) var operations = 0
    /// Fail the operation with this number (1-based) and every later one: a crash at that point.
    public var crashAtOperation: Int?
    /// Tear this append (by operation number) after `keep` bytes, then crash.
    public var tear: (operation: Int, keep: Int)?
    /// Total bytes the disk holds; appends beyond it fail with `noSpace` and write nothing.
    public var capacity: Int?
    /// Bytes held by all files (what `capacity` is compared with).
    public var bytesUsed: Int { inodes.values.reduce(0) { $0 + $1.data.count } }
    /// Make every rename fail with an I/O error.
    public var failRenames = false
    /// Make the next file sync (`sync` or `dropCache`) fail with an I/O error, as `fdatasync`
    /// reports a failed write-back: what it should have written stays visible but is never
    /// written (see `Inode.lost`). Cleared when it fires.
    public var failNextSync = false
    public private(set) var isCrashed = false
    /// Operation numbers of every append and positional write so far (to aim torn writes at
    /// real writes).
    public private(set) var appendOperations: [Int] = []
    /// The unit a reboot keeps or loses as a whole among overwritten bytes (a disk sector).
    public var sectorBytes = 512
    /// New names are durable at once, before any directory fsync (a journaling file system can
    /// commit a directory entry with some other file's fsync): a file's name may then survive a
    /// power loss that its never-synced content does not.
    public var createsAreDurable = false

    /// A file system whose `directories` already exist durably (the machine's data directory).
    public init(durableDirectories existing: [String] = []) {
        for d in existing {
            directories.insert(d)
            durableDirectories.insert(d)
        }
    }

    private func parent(_ path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "/" }
        let p = String(path[..<slash])
        return p.isEmpty ? "/" : p
    }

    private func tick(_ path: String) throws(FileSystemError) {
        if isCrashed { throw FileSystemError(.crashed, path: path, "simulated machine is down") }
        operations += 1
        if let n = crashAtOperation, operations >= n {
            isCrashed = true
            throw FileSystemError(.crashed, path: path, "simulated crash at operation \(operations)")
        }
    }

    private func inode(_ file: FileID) throws(FileSystemError) -> (inode: Int, path: String) {
        guard let h = handles[file.raw] else { throw FileSystemError(.io, path: "?", "file handle \(file.raw) is not open") }
        return h
    }

    /// The new directory's entry is durable only after its parent is fsynced.
    public func makeDirectory(_ path: String) throws(FileSystemError) {
        try tick(path)
        guard directories.contains(parent(path)) else { throw FileSystemError(.notFound, path: path, "no such parent directory") }
        directories.insert(path)
    }

    public func list(_ directory: String) throws(FileSystemError) -> [String] {
        guard directories.contains(directory) else { throw FileSystemError(.notFound, path: directory, "no such directory") }
        let prefix = directory == "/" ? "/" : directory + "/"
        return names.keys.filter { $0.hasPrefix(prefix) && parent($0) == directory }.map { String($0.dropFirst(prefix.count)) }.sorted()
    }

    public func exists(_ path: String) -> Bool { names[path] != nil || directories.contains(path) }

    public func create(_ path: String) throws(FileSystemError) -> FileID {
        try tick(path)
        guard directories.contains(parent(path)) else { throw FileSystemError(.notFound, path: path, "no such directory") }
        if let existing = names[path] {
            inodes[existing]?.data = []
            if let n = inodes[existing]?.durable.count { inodes[existing]?.touch(0..<n) }
        } else {
            names[path] = nextInode
            inodes[nextInode] = Inode()
            if createsAreDurable { durableNames[path] = nextInode }
            nextInode += 1
        }
        return try openHandle(path)
    }

    public func open(_ path: String) throws(FileSystemError) -> FileID {
        guard names[path] != nil else { throw FileSystemError(.notFound, path: path, "no such file") }
        return try openHandle(path)
    }

    private func openHandle(_ path: String) throws(FileSystemError) -> FileID {
        guard let id = names[path] else { throw FileSystemError(.notFound, path: path, "no such file") }
        handles[nextHandle] = (id, path)
        nextHandle += 1
        return FileID(raw: nextHandle - 1)
    }

    public func append(_ file: FileID, _ bytes: [UInt8]) throws(FileSystemError) {
        let (id, _) = try inode(file)
        try write(file, at: inodes[id]?.data.count ?? 0, bytes)
    }

    public func write(_ file: FileID, at offset: Int, _ bytes: [UInt8]) throws(FileSystemError) {
        let (id, path) = try inode(file)
        try tick(path)
        appendOperations.append(operations)
        var bytes = bytes
        var failure: FileSystemError?
        let size = inodes[id]?.data.count ?? 0
        if let capacity {
            let used = inodes.values.reduce(0) { $0 + $1.data.count }
            let growth = Swift.max(0, offset + bytes.count - size)
            if used + growth > capacity {
                // Like write(2): what fits is written, then the call fails.
                let fits = Swift.max(0, size + capacity - used - offset)
                bytes = Array(bytes.prefix(fits))
                failure = FileSystemError(.noSpace, path: path, "no space left on device")
            }
        }
        if let t = tear, t.operation == operations {
            // Over existing bytes a device writes whole sectors: the tear falls on a sector
            // boundary there (past the end, the file's size bounds what is seen, to the byte).
            var keep = t.keep
            if offset < size, keep < bytes.count {
                keep = Swift.max(0, (offset + keep) / sectorBytes * sectorBytes - offset)
            }
            bytes = Array(bytes.prefix(keep))
            isCrashed = true
            failure = FileSystemError(.crashed, path: path, "simulated crash tearing a write after \(t.keep) bytes")
        }
        if var node = inodes[id] {
            inodes[id] = nil  // unique storage: the writes below go in place
            node.touch(Swift.min(offset, node.data.count)..<(offset + bytes.count))
            if node.data.count < offset { node.data.append(contentsOf: repeatElement(0, count: offset - node.data.count)) }
            let overlap = Swift.min(bytes.count, node.data.count - offset)
            if overlap > 0 {
                node.overwritten = true
                node.data.replaceSubrange(offset..<(offset + overlap), with: bytes[0..<overlap])
            }
            node.data.append(contentsOf: bytes[overlap...])
            // Written again: dirty, so the next sync writes these bytes.
            node.lost = node.lost.flatMap { Self.subtract(offset..<(offset + bytes.count), from: $0) }
            inodes[id] = node
        }
        if let failure { throw failure }
    }

    public func sync(_ file: FileID) throws(FileSystemError) {
        let (id, path) = try inode(file)
        try tick(path)
        try syncInode(id, path)
    }

    /// The durable image becomes what the disk holds, or (`failNextSync`) the dirty bytes are
    /// lost: still shown, never written.
    private func syncInode(_ id: Int, _ path: String) throws(FileSystemError) {
        guard var node = inodes[id] else { return }
        if failNextSync {
            failNextSync = false
            var start: Int?
            for i in 0...node.data.count {
                let dirty = i < node.data.count && (i >= node.durable.count || node.data[i] != node.durable[i])
                if dirty, start == nil { start = i }
                if !dirty, let s = start {
                    node.lost.append(s..<i)
                    start = nil
                }
            }
            inodes[id] = node
            throw FileSystemError(.io, path: path, "fdatasync failed: input/output error (injected)")
        }
        inodes[id] = nil  // unique storage: the copy below goes in place
        node.syncDurable()
        node.overwritten = false
        inodes[id] = node
    }

    /// Syncs the file, then reads show only what the disk holds (the lost bytes disappear).
    public func dropCache(_ path: String) throws(FileSystemError) {
        guard let id = names[path] else { throw FileSystemError(.notFound, path: path, "no such file") }
        try tick(path)
        try syncInode(id, path)
        if var node = inodes[id] {
            node.data = node.durable
            node.lost = []
            node.dirty = nil
            inodes[id] = node
        }
    }

    /// `range` less `cut`: nothing, one piece or two (either may overlap only partly).
    public static func subtract(_ cut: Range<Int>, from range: Range<Int>) -> [Range<Int>] {
        guard cut.overlaps(range) else { return [range] }
        var pieces: [Range<Int>] = []
        if range.lowerBound < cut.lowerBound { pieces.append(range.lowerBound..<cut.lowerBound) }
        if cut.upperBound < range.upperBound { pieces.append(cut.upperBound..<range.upperBound) }
        return pieces
    }

    public func truncate(_ file: FileID, to size: Int) throws(FileSystemError) {
        let (id, path) = try inode(file)
        try tick(path)
        if let count = inodes[id]?.data.count {
            let lost = inodes[id]?.lost ?? []
            inodes[id]?.lost = lost.compactMap { $0.lowerBound < size ? $0.lowerBound..<Swift.min(size, $0.upperBound) : nil }
            inodes[id]?.touch(Swift.min(size, count)..<Swift.max(size, count))
            if size < count { inodes[id]?.data.removeLast(count - size) }
            if size > count { inodes[id]?.data.append(contentsOf: repeatElement(0, count: size - count)) }
        }
    }

    public func size(_ file: FileID) throws(FileSystemError) -> Int {
        let (id, _) = try inode(file)
        return inodes[id]?.data.count ?? 0
    }

    public func close(_ file: FileID) { handles[file.raw] = nil }

    public func readAll(_ path: String) throws(FileSystemError) -> [UInt8] {
        guard let id = names[path], let node = inodes[id] else { throw FileSystemError(.notFound, path: path, "no such file") }
        return node.data
    }

    public func fileSize(_ path: String) throws(FileSystemError) -> Int {
        try readAll(path).count  // shares the stored bytes, no copy
    }

    public func read(_ path: String, offset: Int, count: Int) throws(FileSystemError) -> [UInt8] {
        let data = try readAll(path)
        let start = min(max(0, offset), data.count)
        return Array(data[start..<min(data.count, start + max(0, count))])
    }

    public func rename(_ from: String, to: String) throws(FileSystemError) {
        try tick(from)
        if failRenames { throw FileSystemError(.io, path: from, "rename failed (injected)") }
        guard let id = names.removeValue(forKey: from) else { throw FileSystemError(.notFound, path: from, "no such file") }
        names[to] = id
    }

    public func remove(_ path: String) throws(FileSystemError) {
        try tick(path)
        names[path] = nil
        let directory = parent(path)
        unsyncedRemovals[directory, default: 0] += 1
        mostUnsyncedRemovals = Swift.max(mostUnsyncedRemovals, unsyncedRemovals[directory] ?? 0)
    }

    /// Removals made in each directory since its last fsync. A real file system may persist
    /// several unsynced removals in any order (this one makes them durable together at the next
    /// directory fsync), so code that must never leave a gap keeps this at 1: tests read
    /// `mostUnsyncedRemovals`, the largest count seen (reset it to 0 to measure one operation).
    private var unsyncedRemovals: [String: Int] = [:]
    public var mostUnsyncedRemovals = 0

    public func syncDirectory(_ directory: String) throws(FileSystemError) {
        try tick(directory)
        unsyncedRemovals[directory] = 0
        for d in directories where d != "/" && parent(d) == directory { durableDirectories.insert(d) }
        for (name, _) in durableNames where parent(name) == directory && names[name] == nil { durableNames[name] = nil }
        for (name, id) in names where parent(name) == directory { durableNames[name] = id }
    }

    /// Power loss and restart: only durable names survive. A file that was only appended to
    /// since its last fsync keeps its durable bytes plus `keepUnsynced(path, unsyncedCount)` bytes
    /// of what was appended (0 loses them all). A file whose unsynced changes went over existing
    /// bytes (positional writes, truncation) gets the durable length plus
    /// `keepUnsynced(path, growth)` when it grew, and each sector whose content changed is either
    /// the new one (`keepSector(path, sectorNumber)`) or the durable one (zeros past the durable
    /// end): write-back persists dirty pages in no particular order.
    public func reboot(keepUnsynced: (String, Int) -> Int = { _, _ in 0 }, keepSector: (String, Int) -> Bool = { _, _ in false }) {
        directories = durableDirectories
        names = durableNames.filter { directories.contains(parent($0.key)) }
        handles = [:]
        isCrashed = false
        crashAtOperation = nil
        tear = nil
        failNextSync = false
        // In path order: the callbacks may draw from a seeded random source, so the order must
        // not depend on the process's hash seed.
        for (path, id) in names.sorted(by: { $0.key < $1.key }) {
            guard var node = inodes[id] else { continue }
            inodes[id] = nil  // unique storage: the changes below go in place
            if !node.lost.isEmpty {
                // The cache goes with the power: the bytes a failed sync lost read as the disk has them.
                node.data = node.diskImage()
                node.lost = []
                node.overwritten = true
            }
            let appendedOnly = node.dirty.map { $0.lowerBound >= node.durable.count } ?? (node.data.count == node.durable.count)
            if !node.overwritten, node.data.count >= node.durable.count, appendedOnly || node.data.starts(with: node.durable) {
                let extra = node.data.count - node.durable.count
                let keep = Swift.max(0, Swift.min(extra, keepUnsynced(path, extra)))
                node.data.removeLast(extra - keep)
            } else {
                let durableCount = node.durable.count
                let growth = Swift.max(0, node.data.count - durableCount)
                let length = durableCount + Swift.max(0, Swift.min(growth, keepUnsynced(path, growth)))
                var result = node.durable
                result.append(contentsOf: repeatElement(0, count: length - durableCount))
                // Each sector that changed keeps its new bytes or its old ones (zeros past the
                // durable end). Only sectors overlapping the bytes written since the last sync,
                // or past the durable end, can differ: the others are skipped.
                let dirtyEnd = Swift.min(length, node.dirty?.upperBound ?? 0)
                var start = Swift.min(node.dirty?.lowerBound ?? length, durableCount) / sectorBytes * sectorBytes
                let data = node.data
                while start < length {
                    let end = Swift.min(length, start + sectorBytes)
                    if start >= dirtyEnd, end <= durableCount {
                        start = Swift.max(end, durableCount / sectorBytes * sectorBytes)
                        continue
                    }
                    let written = start..<Swift.max(start, Swift.min(end, data.count))
                    if written.contains(where: { data[$0] != result[$0] }), keepSector(path, start / sectorBytes) {
                        for i in written { result[i] = data[i] }
                    }
                    start = end
                }
                node.data = result
            }
            node.durable = node.data
            node.overwritten = false
            node.dirty = nil
            inodes[id] = node
        }
        let live = Set(names.values)
        inodes = inodes.filter { live.contains($0.key) }
    }

    /// An independent file system holding the same files, names and durability as this one
    /// (open handles, pending faults and the operation count are not copied): a copy to inspect
    /// (`reboot` it to see what a power loss now would leave) without touching this one.
    public func copy() -> SimulatedFileSystem {
        let other = SimulatedFileSystem()
        other.inodes = inodes
        other.names = names
        other.durableNames = durableNames
        other.directories = directories
        other.durableDirectories = durableDirectories
        other.nextInode = nextInode
        other.sectorBytes = sectorBytes
        other.createsAreDurable = createsAreDurable
        other.capacity = capacity
        return other
    }

    /// A process crash without power loss: open files are closed, everything written stays
    /// visible (the page cache survives), and nothing becomes durable that was not.
    public func restartProcess() {
        handles = [:]
        isCrashed = false
        crashAtOperation = nil
        tear = nil
    }

    /// Flips one byte of a file (durable and written images), for corruption tests.
    /// How many bytes of `path` are durable (0 for an unknown path).
    public func durableSize(_ path: String) -> Int {
        guard let id = names[path], let node = inodes[id] else { return 0 }
        return node.durable.count
    }

    /// Zeroes `count` bytes at `offset` in what is written and what is durable: a sector the disk
    /// lost after it was synced (a media error, a misdirected write).
    public func zero(_ path: String, at offset: Int, count: Int) {
        guard let id = names[path], var node = inodes[id], offset >= 0, count > 0 else { return }
        for i in offset..<(offset + count) {
            if i < node.data.count { node.data[i] = 0 }
            if i < node.durable.count { node.durable[i] = 0 }
        }
        inodes[id] = node
    }

    public func corrupt(_ path: String, at offset: Int) {
        guard let id = names[path], var node = inodes[id], offset < node.data.count else { return }
        node.data[offset] ^= 0xFF
        if offset < node.durable.count { node.durable[offset] ^= 0xFF }
        inodes[id] = node
    }
}
