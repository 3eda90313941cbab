/// A compact binary image of a tree, for snapshots: faster to write and to load than JSON, and
/// validated on load as strictly as JSON input (keys, order, depth, UTF-8, sizes).
///
///     image := "BNYTREE1" node
///     node  := tag [priority] value
///     tag   := type (low 3 bits) | priority kind << 3 (0 none, 1 number, 2 string)
///     type  := 0 empty | 1 false | 2 true | 3 int64 | 4 double | 5 string | 6 children
///     number: 8 bytes little-endian; string and key: varint length then UTF-8 bytes;
///     children: varint count, then (key, node) pairs in Firebase key order.
public enum TreeImage {
    public static let magic: [UInt8] = Array("BNYTREE1".utf8)

    /// Writes the image of `node` in chunks of about `chunkBytes`.
    public static func stream(_ node: Node, chunkBytes: Int = 1 << 20, emit: ([UInt8]) throws -> Void) throws {
        var out = magic
        out.reserveCapacity(Swift.min(chunkBytes, 1 << 22) + 64 * 1024)
        try write(node, &out, chunkBytes, emit)
        if !out.isEmpty { try emit(out) }
    }

    public static func bytes(_ node: Node) -> [UInt8] {
        var all: [UInt8] = []
        try? stream(node, chunkBytes: Int.max) { all.append(contentsOf: $0) }
        return all
    }

    private static func write(_ node: Node, _ out: inout [UInt8], _ chunkBytes: Int, _ emit: ([UInt8]) throws -> Void) throws {
        switch node.storage {
        case .empty:
            out.append(0)
        case .leaf(let leaf, let priority):
            let type: UInt8
            switch leaf {
            case .bool(let b): type = b ? 2 : 1
            case .int: type = 3
            case .double: type = 4
            case .string: type = 5
            }
            out.append(type | priorityKind(priority) << 3)
            writePriority(priority, &out)
            switch leaf {
            case .bool: break
            case .int(let i): appendLE(UInt64(bitPattern: i), &out)
            case .double(let d): appendLE(d.bitPattern, &out)
            case .string(let s): writeString(s, &out)
            }
        case .children(let map, let priority):
            out.append(6 | priorityKind(priority) << 3)
            writePriority(priority, &out)
            writeVarint(UInt64(map.count), &out)
            var failure: (any Error)?
            map.forEach { key, child in
                guard failure == nil else { return }
                writeString(key.string, &out)
                do {
                    try write(child, &out, chunkBytes, emit)
                    if out.count >= chunkBytes {
                        try emit(out)
                        out.removeAll(keepingCapacity: true)
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

    private static func writePriority(_ p: Priority, _ out: inout [UInt8]) {
        switch p {
        case .none: break
        case .number(let d): appendLE(d.bitPattern, &out)
        case .string(let s): writeString(s, &out)
        }
    }

    @inline(__always)
    private static func appendLE(_ v: UInt64, _ out: inout [UInt8]) {
        for i in 0..<8 { out.append(UInt8(truncatingIfNeeded: v >> (8 * UInt64(i)))) }
    }

    @inline(__always)
    private static func writeVarint(_ v: UInt64, _ out: inout [UInt8]) {
        var v = v
        while v >= 0x80 {
            out.append(UInt8(v & 0x7F) | 0x80)
            v >>= 7
        }
        out.append(UInt8(v))
    }

    private static func writeString(_ s: String, _ out: inout [UInt8]) {
        var s = s
        s.withUTF8 { bytes in
            writeVarint(UInt64(bytes.count), &out)
            out.append(contentsOf: bytes)
        }
    }

    // MARK: Reading

    /// Reads an image, validating it completely; damaged or hostile input gives a `TreeError`.
    public static func read(_ bytes: [UInt8], limits: TreeReadLimits = .standard) throws(TreeError) -> Node {
        let result: Result<Node, TreeError> = bytes.withUnsafeBufferPointer { buffer in
            var reader = ImageReader(bytes: buffer, limits: limits)
            do throws(TreeError) {
                guard buffer.count >= magic.count, Array(buffer[0..<magic.count]) == magic else {
                    throw reader.fail("not a Banyan tree image")
                }
                reader.position = magic.count
                let node = try reader.readNode(depth: 0)
                guard reader.position == buffer.count else { throw reader.fail("trailing bytes after the tree") }
                return .success(node)
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }
}

private struct ImageReader {
    let bytes: UnsafeBufferPointer<UInt8>
    let limits: TreeReadLimits
    var position = 0
    var nodes = 0
    /// Keys from the root to the node being read, and their joined UTF-8 length.
    var stack: [ChildKey] = []
    var pathBytes = 0

    init(bytes: UnsafeBufferPointer<UInt8>, limits: TreeReadLimits) {
        self.bytes = bytes
        self.limits = limits
    }

    var pathText: String { "/" + stack.map(\.string).joined(separator: "/") }

    func fail(_ message: String) -> TreeError {
        TreeError(.invalidJSON, path: pathText, "Invalid tree image: \(message)", offset: position)
    }

    mutating func byte() throws(TreeError) -> UInt8 {
        guard position < bytes.count else { throw fail("truncated") }
        defer { position += 1 }
        return bytes[position]
    }

    mutating func u64() throws(TreeError) -> UInt64 {
        guard position + 8 <= bytes.count else { throw fail("truncated") }
        var v: UInt64 = 0
        for i in 0..<8 { v |= UInt64(bytes[position + i]) << (8 * UInt64(i)) }
        position += 8
        return v
    }

    mutating func varint() throws(TreeError) -> Int {
        var v: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let b = try byte()
            guard shift < 63 else { throw fail("varint too long") }
            v |= UInt64(b & 0x7F) << shift
            if b < 0x80 { break }
            shift += 7
        }
        guard v <= UInt64(bytes.count) else { throw fail("length \(v) exceeds the image") }
        return Int(v)
    }

    mutating func string(maxBytes: Int) throws(TreeError) -> String {
        let n = try varint()
        guard n <= maxBytes else { throw TreeError(.stringTooLong, path: "/", "String of \(n) bytes exceeds \(maxBytes)", offset: position) }
        guard position + n <= bytes.count else { throw fail("truncated string") }
        let slice = UnsafeBufferPointer(rebasing: bytes[position..<(position + n)])
        position += n
        var ascii = true
        for b in slice where b >= 0x80 {
            ascii = false
            break
        }
        if ascii { return String(decoding: slice, as: UTF8.self) }
        guard let s = String(validating: slice, as: UTF8.self) else { throw fail("invalid UTF-8") }
        return s
    }

    mutating func double() throws(TreeError) -> Double {
        let d = Double(bitPattern: try u64())
        guard d.isFinite else { throw TreeError(.invalidNumber, path: "/", "Invalid tree image: non-finite number", offset: position) }
        return d == 0 ? 0 : d  // -0.0 becomes 0.0, as in the JSON reader
    }

    mutating func readNode(depth: Int) throws(TreeError) -> Node {
        nodes += 1
        if nodes > limits.maxNodes { throw TreeError(.inputTooLarge, path: "/", "Image has more than \(limits.maxNodes) nodes") }
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
            guard case .none = priority else { throw fail("priority on an empty node") }
            return .empty
        case 1: return Node(.bool(false), priority: priority)
        case 2: return Node(.bool(true), priority: priority)
        case 3: return Node(.int(Int64(bitPattern: try u64())), priority: priority)
        case 4: return Node(.double(try double()), priority: priority)
        case 5: return Node(.string(try string(maxBytes: limits.maxStringBytes)), priority: priority)
        case 6:
            let count = try varint()
            guard count > 0 else { throw fail("children node without children") }
            guard depth < Path.maxDepth else { throw TreeError(.depthExceeded, path: pathText, "Image nests deeper than \(Path.maxDepth) levels") }
            var children: [(ChildKey, Node)] = []
            // Each child takes at least 3 bytes: never reserve more than the input could hold.
            children.reserveCapacity(Swift.min(count, (bytes.count - position) / 3 + 1, 1 << 16))
            var previous: ChildKey?
            for _ in 0..<count {
                let text = try string(maxBytes: ChildKey.maxBytes)
                guard let key = ChildKey(validKey: text) else { throw fail("invalid key \"\(text.prefix(40))\"") }
                if let previous, !(previous < key) { throw fail("keys out of order at \"\(text.prefix(40))\"") }
                previous = key
                let saved = pathBytes
                pathBytes = stack.isEmpty ? Int(key.length) : pathBytes + 1 + Int(key.length)
                stack.append(key)
                guard pathBytes <= Path.maxBytes else { throw TreeError(.pathTooLong, path: pathText, "Key path exceeds \(Path.maxBytes) bytes") }
                let child = try readNode(depth: depth + 1)
                stack.removeLast()
                pathBytes = saved
                guard !child.isEmpty else { throw fail("empty child \"\(text.prefix(40))\"") }
                children.append((key, child))
            }
            return Node(sortedChildren: children, priority: priority)
        default:
            throw fail("unknown node type \(type)")
        }
    }
}
