import BanyanBasics

/// A compact binary image of a tree, for snapshots: faster to write and to load than JSON, and
/// validated on load as strictly as JSON input (keys, order, depth, UTF-8, sizes).
///
///     image := "BNYTREE1" tree
///     tree  := tag [priority] value
///     tag   := type (low 3 bits) | priority kind << 3 (0 none, 1 number, 2 string)
///     type  := 0 empty | 1 false | 2 true | 3 int64 | 4 double | 5 string | 6 children
///     number: 8 bytes little-endian; string and key: varint length then UTF-8 bytes;
///     children: varint count, then (key, tree) pairs in Firebase key order.
public enum TreeImage {
    public static let magic: [UInt8] = Array("BNYTREE1".utf8)

    /// Writes the image of `subtree` in chunks of about `chunkBytes`.
    public static func stream(_ subtree: Tree, chunkBytes: Int = 1 << 20, emit: ([UInt8]) throws -> Void) throws {
        var w = ByteWriter(capacity: Swift.min(chunkBytes, 1 << 22) + 64 * 1024)
        w.raw(magic)
        try write(subtree, &w, chunkBytes, emit)
        if w.count > 0 { try emit(w.out) }
    }

    public static func bytes(_ subtree: Tree) -> [UInt8] {
        var all: [UInt8] = []
        try? stream(subtree, chunkBytes: Int.max) { all.append(contentsOf: $0) }
        return all
    }

    /// Writes with the shared byte codec (docs/internals/byte-codec.md): numbers little-endian,
    /// lengths and counts as varints.
    private static func write(_ subtree: Tree, _ w: inout ByteWriter, _ chunkBytes: Int, _ emit: ([UInt8]) throws -> Void) throws {
        switch subtree.storage {
        case .empty:
            w.u8(0)
        case .leaf(let leaf, let priority):
            let type: UInt8
            switch leaf {
            case .bool(let b): type = b ? 2 : 1
            case .int: type = 3
            case .double: type = 4
            case .string: type = 5
            }
            w.u8(type | priorityKind(priority) << 3)
            writePriority(priority, &w)
            switch leaf {
            case .bool: break
            case .int(let i): w.i64(i)
            case .double(let d): w.f64(d)
            case .string(let s): writeString(s, &w)
            }
        case .children(let map, let priority, _):
            w.u8(6 | priorityKind(priority) << 3)
            writePriority(priority, &w)
            w.varint(UInt64(map.count))
            var failure: (any Error)?
            map.forEach { key, child in
                guard failure == nil else { return }
                writeString(key.string, &w)
                do {
                    try write(child, &w, chunkBytes, emit)
                    if w.count >= chunkBytes {
                        try emit(w.out)
                        w.out.removeAll(keepingCapacity: true)
                    }
                } catch {
                    failure = error
                }
            }
            if let failure { throw failure }
        }
    }

    private static func priorityKind(_ p: Priority) -> UInt8 {
        switch p {
        case .none: return 0
        case .number: return 1
        case .string: return 2
        }
    }

    private static func writePriority(_ p: Priority, _ w: inout ByteWriter) {
        switch p {
        case .none: break
        case .number(let d): w.f64(d)
        case .string(let s): writeString(s, &w)
        }
    }

    private static func writeString(_ s: String, _ w: inout ByteWriter) {
        var s = s
        s.withUTF8 { bytes in
            w.varint(UInt64(bytes.count))
            w.raw(bytes)
        }
    }

    // MARK: Reading

    /// Reads an image, validating it completely; damaged or hostile input gives a `TreeError`.
    public static func read(_ bytes: [UInt8], limits: TreeReadLimits = .standard) throws(TreeError) -> Tree {
        let result: Result<Tree, TreeError> = bytes.withUnsafeBufferPointer { buffer in
            // The reader never writes to a window it cannot refill.
            var reader = ImageReader(window: UnsafeMutableBufferPointer(mutating: buffer), maxLength: buffer.count, limits: limits, fill: nil)
            do throws(TreeError) {
                return .success(try reader.readImage())
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    /// Reads an image as it arrives, validating it as `read(_:)` does: `fill` writes the next
    /// bytes into the buffer it is given and returns how many (0 at the end of the image). Only a
    /// window of the image is held at a time (it grows to fit the longest string), so an image
    /// streamed from a snapshot never needs a second copy in memory. `maxLength` bounds the
    /// image's length (lengths and counts beyond it are rejected early). Errors are `TreeError`
    /// for the image, or whatever `fill` threw.
    public static func read(
        limits: TreeReadLimits = .standard, maxLength: Int = .max, fill: (UnsafeMutableBufferPointer<UInt8>) throws -> Int
    ) throws -> Tree {
        // The reader keeps `fill` only while this call runs.
        try withoutActuallyEscaping(fill) { fill in
            let window = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: 128 * 1024)
            var reader = ImageReader(window: window, maxLength: maxLength, limits: limits, fill: fill)
            defer { reader.window.deallocate() }
            do throws(TreeError) {
                return try reader.readImage()
            } catch {
                if let sourceError = reader.sourceError { throw sourceError }
                throw error
            }
        }
    }
}

/// Validating reader over a window of the image: `window[position..<end]` are the next bytes.
/// An in-memory image is its own window; a streamed one is refilled through `fill`.
private struct ImageReader {
    var window: UnsafeMutableBufferPointer<UInt8>
    var position = 0
    var end: Int
    /// Image offset of `window[0]`, for error offsets.
    var base = 0
    let maxLength: Int
    let limits: TreeReadLimits
    let fill: ((UnsafeMutableBufferPointer<UInt8>) throws -> Int)?
    /// What `fill` threw (the `TreeError` thrown in its place only unwinds the reader).
    var sourceError: (any Error)?
    var subtrees = 0
    /// Keys from the root to the tree being read, and their joined UTF-8 length.
    var stack: [ChildKey] = []
    var pathBytes = 0
    /// Short keys recently read, by their bytes (up to 15, in two words, and the length):
    /// sibling records repeat the same field names, and a hit skips validating the key and
    /// building its string.
    var cachedBytes = [(UInt64, UInt64, Int)](repeating: (0, 0, -1), count: 256)
    var cachedKeys = [ChildKey](repeating: ChildKey(unchecked: "-"), count: 256)

    init(
        window: UnsafeMutableBufferPointer<UInt8>, maxLength: Int, limits: TreeReadLimits,
        fill: ((UnsafeMutableBufferPointer<UInt8>) throws -> Int)?
    ) {
        self.window = window
        self.end = fill == nil ? window.count : 0
        self.maxLength = maxLength
        self.limits = limits
        self.fill = fill
    }

    var pathText: String { "/" + stack.map(\.string).joined(separator: "/") }

    func fail(_ message: String) -> TreeError {
        TreeError(.invalidJSON, path: pathText, "Invalid tree image: \(message)", offset: base + position)
    }

    mutating func readImage() throws(TreeError) -> Tree {
        try ensure(TreeImage.magic.count, or: "not a Banyan tree image")
        guard UnsafeBufferPointer(rebasing: window[position..<(position + TreeImage.magic.count)]).elementsEqual(TreeImage.magic) else {
            throw fail("not a Banyan tree image")
        }
        position += TreeImage.magic.count
        let subtree = try readNode(depth: 0)
        guard position == end, try !refill(1) else { throw fail("trailing bytes after the tree") }
        return subtree
    }

    /// Makes at least `n` bytes available at `position`, or throws `fail(message)`.
    @inline(__always)
    mutating func ensure(_ n: Int, or message: @autoclosure () -> String = "truncated") throws(TreeError) {
        if end - position < n, try !refill(n) { throw fail(message()) }
    }

    /// Moves the unread bytes to the window's start, grows the window if `n` bytes would not fit,
    /// and asks `fill` for more until `n` are available. False when the image ends first.
    @inline(never)
    mutating func refill(_ n: Int) throws(TreeError) -> Bool {
        guard let fill else { return false }
        let unread = end - position
        if n > window.count {
            let larger = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: Swift.max(n, 2 * window.count))
            _ = larger.initialize(from: window[position..<end])
            window.deallocate()
            window = larger
        } else if position > 0 {
            window.baseAddress.map { $0.update(from: $0 + position, count: unread) }
        }
        base += position
        position = 0
        end = unread
        while end < n {
            let got: Int
            do {
                got = try fill(UnsafeMutableBufferPointer(rebasing: window[end...]))
            } catch {
                sourceError = error
                throw fail("the image source failed")
            }
            guard got > 0 else { return false }
            end += got
        }
        return true
    }

    mutating func byte() throws(TreeError) -> UInt8 {
        try ensure(1)
        defer { position += 1 }
        return window[position]
    }

    mutating func u64() throws(TreeError) -> UInt64 {
        try ensure(8)
        defer { position += 8 }
        return UInt64(littleEndian: UnsafeRawBufferPointer(window).loadUnaligned(fromByteOffset: position, as: UInt64.self))
    }

    mutating func varint() throws(TreeError) -> Int {
        // Most lengths and counts fit in one byte.
        if position < end, window[position] < 0x80, Int(window[position]) <= maxLength {
            defer { position += 1 }
            return Int(window[position])
        }
        var v: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let b = try byte()
            guard shift < 63 else { throw fail("varint too long") }
            v |= UInt64(b & 0x7F) << shift
            if b < 0x80 { break }
            shift += 7
        }
        guard v <= UInt64(maxLength) else { throw fail("length \(v) exceeds the image") }
        return Int(v)
    }

    /// The next length-prefixed bytes (valid until the next read).
    mutating func lengthPrefixed(maxBytes: Int) throws(TreeError) -> UnsafeBufferPointer<UInt8> {
        let n = try varint()
        guard n <= maxBytes else { throw TreeError(.stringTooLong, path: "/", "String of \(n) bytes exceeds \(maxBytes)", offset: base + position) }
        try ensure(n, or: "truncated string")
        defer { position += n }
        return UnsafeBufferPointer(rebasing: window[position..<(position + n)])
    }

    mutating func string(maxBytes: Int) throws(TreeError) -> String {
        // Two statements: `text(lengthPrefixed(...))` would copy the reader for the outer call.
        let slice = try lengthPrefixed(maxBytes: maxBytes)
        return try text(slice)
    }

    func text(_ slice: UnsafeBufferPointer<UInt8>) throws(TreeError) -> String {
        var ascii = true
        for b in slice where b >= 0x80 {
            ascii = false
            break
        }
        if ascii { return String(decoding: slice, as: UTF8.self) }
        guard let s = String(validating: slice, as: UTF8.self) else { throw fail("invalid UTF-8") }
        return s
    }

    /// A child key: from the cache when the same short key was read recently, else validated.
    mutating func key() throws(TreeError) -> ChildKey {
        let slice = try lengthPrefixed(maxBytes: ChildKey.maxBytes)
        guard slice.count < 16 else { return try validKey(slice) }
        var words: (UInt64, UInt64) = (0, 0)
        withUnsafeMutableBytes(of: &words) { $0.copyMemory(from: UnsafeRawBufferPointer(slice)) }
        let slot = Int(truncatingIfNeeded: ((words.0 ^ (words.1 &* 31) ^ UInt64(slice.count)) &* 0x9E37_79B9_7F4A_7C15) >> 56)
        let cached = cachedBytes[slot]
        if cached.0 == words.0 && cached.1 == words.1 && cached.2 == slice.count { return cachedKeys[slot] }
        let key = try validKey(slice)
        cachedBytes[slot] = (words.0, words.1, slice.count)
        cachedKeys[slot] = key
        return key
    }

    func validKey(_ slice: UnsafeBufferPointer<UInt8>) throws(TreeError) -> ChildKey {
        let text = try text(slice)
        guard let key = ChildKey(validUTF8: slice, string: text) else { throw fail("invalid key \"\(text.prefix(40))\"") }
        return key
    }

    mutating func double() throws(TreeError) -> Double {
        let d = Double(bitPattern: try u64())
        guard d.isFinite else { throw TreeError(.invalidNumber, path: "/", "Invalid tree image: non-finite number", offset: base + position) }
        return d == 0 ? 0 : d  // -0.0 becomes 0.0, as in the JSON reader
    }

    mutating func readNode(depth: Int) throws(TreeError) -> Tree {
        subtrees += 1
        if subtrees > limits.maxValues { throw TreeError(.inputTooLarge, path: "/", "Image has more than \(limits.maxValues) values") }
        let tag = try byte()
        let type = tag & 7
        let priority: Priority
        switch tag >> 3 {
        case 0: priority = .none
        case 1: priority = .number(try double())
        case 2: priority = .string(try string(maxBytes: limits.maxStringBytes))
        default: throw fail("unknown priority kind")
        }
        switch type {
        case 0:
            guard case .none = priority else { throw fail("priority on an empty value") }
            return .empty
        case 1: return Tree(.bool(false), priority: priority)
        case 2: return Tree(.bool(true), priority: priority)
        case 3: return Tree(.int(Int64(bitPattern: try u64())), priority: priority)
        case 4: return Tree(.double(try double()), priority: priority)
        case 5: return Tree(.string(try string(maxBytes: limits.maxStringBytes)), priority: priority)
        case 6:
            let count = try varint()
            guard count > 0 else { throw fail("children value without children") }
            guard depth < Path.maxDepth else { throw TreeError(.depthExceeded, path: pathText, "Image nests deeper than \(Path.maxDepth) levels") }
            var previous: ChildKey?
            // Straight into the map's pages, in key order (no array of the children). A count
            // beyond what is left of the image fails when the children run out.
            var bytes = Tree.bytes(of: priority)
            let map = try ChildMap(sortedCount: count) { () throws(TreeError) in
                let entry = try child(after: &previous, depth: depth)
                bytes += Tree.entryBytes(entry.0, entry.1)
                return entry
            }
            // Children are never empty (checked in `child`), so the map is stored as it is.
            return Tree(nonEmpty: map, priority: priority, dataBytes: bytes)
        default:
            throw fail("unknown value type \(type)")
        }
    }

    /// One (key, child) pair of a children tree: the key must follow `previous`.
    mutating func child(after previous: inout ChildKey?, depth: Int) throws(TreeError) -> (ChildKey, Tree) {
        let key = try key()
        if let previous, !(previous < key) { throw fail("keys out of order at \"\(key.string.prefix(40))\"") }
        previous = key
        let saved = pathBytes
        pathBytes = stack.isEmpty ? Int(key.length) : pathBytes + 1 + Int(key.length)
        stack.append(key)
        guard pathBytes <= Path.maxBytes else { throw TreeError(.pathTooLong, path: pathText, "Key path exceeds \(Path.maxBytes) bytes") }
        let child = try readNode(depth: depth + 1)
        stack.removeLast()
        pathBytes = saved
        guard !child.isEmpty else { throw fail("empty child \"\(key.string.prefix(40))\"") }
        return (key, child)
    }
}
