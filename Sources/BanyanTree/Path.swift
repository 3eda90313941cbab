import BanyanBasics

/// A location in the tree: a sequence of child keys from the root.
///
/// Parsing splits on `/` and ignores empty segments (`//a///b/` is `/a/b`), as Firebase does.
/// Invariant: at most `Path.maxDepth` segments and at most `Path.maxBytes` UTF-8 bytes
/// (segments joined with `/`), for every path built by `init(parsing:)` or `appending`.
public struct Path: Hashable, Sendable, CustomStringConvertible, Comparable {
    public private(set) var segments: [ChildKey]

    /// Maximum number of segments (Firebase: 32 levels).
    public static let maxDepth = 32
    /// Maximum UTF-8 length of a path, segments joined by `/`.
    public static let maxBytes = 768

    public static let root = Path(segments: [])

    /// A path from already-validated segments (trusted callers; no limits checked).
    public init(segments: [ChildKey]) {
        self.segments = segments
    }

    /// Parses `a/b/c`, rejecting invalid keys and paths deeper or longer than the limits.
    ///
    /// `.priority` is not a key; see `WritePath` for write locations that may end in it.
    public init(parsing text: String) throws(TreeError) {
        let path = Path(segments: try Path.parse(text, allowingPriority: false).keys)
        try path.checkLimits()
        self = path
    }

    /// Splits `text` at `/` (empty segments ignored) into keys in one pass over its UTF-8 bytes:
    /// the write path of every client request and of every applied command goes through here.
    /// With `allowingPriority`, a last segment `.priority` is taken off and reported.
    static func parse(_ text: String, allowingPriority: Bool) throws(TreeError) -> (keys: [ChildKey], isPriority: Bool) {
        let original = text
        var text = text
        let result: Result<(keys: [ChildKey], isPriority: Bool), TreeError> = text.withUTF8 { bytes in
            var pieces = bytes.ranges(separatedBy: UInt8(ascii: "/"), omittingEmpty: true)
            let isPriority = allowingPriority && pieces.last.map { bytes[$0].elementsEqual(".priority".utf8) } == true
            if isPriority { pieces.removeLast() }
            var keys: [ChildKey] = []
            keys.reserveCapacity(pieces.count)
            for range in pieces {
                let piece = UnsafeBufferPointer(rebasing: bytes[range])
                let string = String(decoding: piece, as: UTF8.self)
                guard let key = ChildKey(validUTF8: piece, string: string) else {
                    // Messages name the path as written (a write path: without empty segments
                    // and without its `.priority`).
                    let shown = allowingPriority
                        ? pieces.map { String(decoding: UnsafeBufferPointer(rebasing: bytes[$0]), as: UTF8.self) }.joined(separator: "/")
                        : original
                    let problem = ChildKey.problem(with: string) ?? "keys must be 1 to \(ChildKey.maxBytes) bytes of UTF-8"
                    return .failure(TreeError(
                        .invalidPath, path: Path.printable(shown),
                        "Invalid path \"\(Path.printable(shown))\": segment \"\(ChildKey.printable(string))\" is invalid: \(problem)"))
                }
                keys.append(key)
            }
            return .success((keys, isPriority))
        }
        return try result.get()
    }

    /// Throws when the path exceeds the depth or byte limits.
    public func checkLimits() throws(TreeError) {
        if segments.count > Path.maxDepth {
            throw TreeError(.depthExceeded, path: description, "Path is \(segments.count) levels deep; the limit is \(Path.maxDepth)")
        }
        if byteCount > Path.maxBytes {
            throw TreeError(.pathTooLong, path: description, "Path is \(byteCount) bytes of UTF-8; the limit is \(Path.maxBytes)")
        }
    }

    /// UTF-8 length of the segments joined by `/` (no leading slash).
    public var byteCount: Int {
        guard !segments.isEmpty else { return 0 }
        return segments.reduce(segments.count - 1) { $0 + $1.string.utf8.count }
    }

    public var isRoot: Bool { segments.isEmpty }
    public var count: Int { segments.count }
    public var first: ChildKey? { segments.first }
    public var last: ChildKey? { segments.last }

    /// The path without its first segment.
    public var droppingFirst: Path { Path(segments: Array(segments.dropFirst())) }

    /// The parent location, or `nil` for the root.
    public var parent: Path? {
        segments.isEmpty ? nil : Path(segments: Array(segments.dropLast()))
    }

    public func appending(_ key: ChildKey) -> Path {
        var copy = self
        copy.segments.append(key)
        return copy
    }

    public func appending(_ other: Path) -> Path {
        var copy = self
        copy.segments.append(contentsOf: other.segments)
        return copy
    }

    /// True when `self` equals `other` or is one of its ancestors.
    public func contains(_ other: Path) -> Bool {
        guard segments.count <= other.segments.count else { return false }
        for i in segments.indices where segments[i] != other.segments[i] { return false }
        return true
    }

    /// `other` relative to `self`, when `self` contains `other`.
    public func relative(_ other: Path) -> Path? {
        guard contains(other) else { return nil }
        return Path(segments: Array(other.segments[segments.count...]))
    }

    public var description: String {
        "/" + segments.map(\.string).joined(separator: "/")
    }

    /// Orders paths segment by segment with Firebase key order (a parent before its children).
    public static func < (a: Path, b: Path) -> Bool {
        for (x, y) in zip(a.segments, b.segments) where x != y { return x < y }
        return a.segments.count < b.segments.count
    }

    static func printable(_ text: String) -> String {
        let clipped = text.utf8.count > 200 ? String(text.prefix(200)) + "…" : text
        return ChildKey.printable(clipped)
    }
}

/// A write location: a path, optionally addressing the priority of that path (`a/b/.priority`).
public struct WritePath: Hashable, Sendable, CustomStringConvertible {
    public let path: Path
    /// True when the last segment was `.priority`.
    public let isPriority: Bool

    public init(path: Path, isPriority: Bool = false) {
        self.path = path
        self.isPriority = isPriority
    }

    /// Parses a write location, accepting `.priority` as the last segment only.
    public init(parsing text: String) throws(TreeError) {
        let (keys, isPriority) = try Path.parse(text, allowingPriority: true)
        let path = Path(segments: keys)
        try path.checkLimits()
        if isPriority && path.count + 1 > Path.maxDepth {
            throw TreeError(.depthExceeded, path: path.description, "Path is too deep for a priority write")
        }
        self.init(path: path, isPriority: isPriority)
    }

    public var description: String {
        isPriority ? (path.isRoot ? "/.priority" : path.description + "/.priority") : path.description
    }
}
