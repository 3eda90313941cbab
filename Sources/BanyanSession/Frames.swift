/// The Firebase WebSocket protocol v5's message framing (docs/realtime.md; reference §1.3).
///
/// Every logical message is one JSON text. A sender whose message is longer than one chunk first
/// sends a text frame holding only the decimal count of chunks, then the chunks; a lone `0` frame
/// is the clients' keep-alive. Pure: bytes in, bytes or typed outcomes out.

/// Reassembles client frames into messages. A "frame" here is one whole WebSocket text message
/// (fragments already joined, its size already bounded by the WebSocket decoder's own limit);
/// its bytes are not assumed to be valid UTF-8 (the JSON reader checks).
///
/// Rules: while not collecting, a frame of 1 to 6 ASCII digits is a count (`0`: keep-alive,
/// ignored; `n`: the next `n` frames are one message, concatenated); any other frame is a whole
/// message. While collecting, every frame is data, digits included.
///
/// Bounds. A message over `maxMessageBytes`, or a count over `maxFramesPerMessage`, does not
/// end the connection (the SDKs would resend the same write after every reconnect): the rest of
/// its announced frames are read and dropped, keeping only their first `prefixBytes` bytes, and
/// the caller gets `.tooLarge(prefix:)` once the message is over, to answer the request it began
/// (JS writes `{"t":"d","d":{"r":N,…` first). The stream stays in step with the client. Memory
/// held for a message never exceeds `maxMessageBytes` (capacity is reserved up to the limit, not
/// doubled past it). A frame over `maxFrameBytes` is `FrameError.frameTooLarge`, the one error
/// that ends the connection (such a frame is not from an SDK, which sends at most 16,384
/// characters a frame unless its whole message fits in one).
public struct FrameAssembler: Sendable {
    public struct Limits: Sendable, Equatable {
        /// One frame's payload (a client that does not split may send its whole message in one).
        public var maxFrameBytes: Int
        /// One message after reassembly (the REST body limit's default).
        public var maxMessageBytes: Int
        /// Frames announced by one count (16 MiB at 256 bytes a frame; the SDKs use 16,384
        /// characters).
        public var maxFramesPerMessage: Int

        public init(maxFrameBytes: Int = 16 << 20, maxMessageBytes: Int = 16 << 20, maxFramesPerMessage: Int = 65_536) {
            self.maxFrameBytes = maxFrameBytes
            self.maxMessageBytes = maxMessageBytes
            self.maxFramesPerMessage = maxFramesPerMessage
        }
    }

    /// Bytes of a dropped message kept for the caller (enough for the envelope's request number).
    public static let prefixBytes = 64

    public enum Received: Sendable, Equatable {
        /// The client's keep-alive (`0`): nothing to do.
        case keepAlive
        /// A count, or a chunk of a message still incomplete (or being dropped).
        case partial
        /// One whole message's bytes.
        case message([UInt8])
        /// A message over `maxMessageBytes` or announced in more than `maxFramesPerMessage`
        /// frames, now fully read and dropped: its first bytes, and which limit it broke.
        case tooLarge(prefix: [UInt8], TooLarge)
    }

    public enum TooLarge: Sendable, Equatable, CustomStringConvertible {
        case bytes(limit: Int)
        case frames(count: Int, limit: Int)

        public var description: String {
            switch self {
            case .bytes(let limit): return "message exceeds the limit of \(limit) bytes"
            case let .frames(count, limit): return "message announced in \(count) frames, more than the limit of \(limit)"
            }
        }
    }

    public enum FrameError: Error, Sendable, Equatable, CustomStringConvertible {
        case frameTooLarge(bytes: Int, limit: Int)

        public var description: String {
            switch self {
            case let .frameTooLarge(bytes, limit): return "frame of \(bytes) bytes exceeds the limit of \(limit) bytes"
            }
        }
    }

    public let limits: Limits
    /// Frames still expected for the message being collected or dropped (0: idle).
    public private(set) var expected = 0
    /// Bytes held of the message being collected (the node's budget for messages being
    /// assembled counts them).
    public var heldBytes: Int { buffer.count }
    private var buffer: [UInt8] = []
    /// Set while the current message is being dropped.
    private var dropping: TooLarge?

    public init(limits: Limits = Limits()) {
        self.limits = limits
    }

    public var isCollecting: Bool { expected > 0 }

    public mutating func receive(_ frame: [UInt8]) throws(FrameError) -> Received {
        guard frame.count <= limits.maxFrameBytes else {
            expected = 0
            buffer = []
            dropping = nil
            throw .frameTooLarge(bytes: frame.count, limit: limits.maxFrameBytes)
        }
        if expected == 0 {
            if let count = Self.count(frame) {
                if count == 0 { return .keepAlive }
                expected = count
                if count > limits.maxFramesPerMessage { dropping = .frames(count: count, limit: limits.maxFramesPerMessage) }
                return .partial
            }
            guard frame.count <= limits.maxMessageBytes else {
                return .tooLarge(prefix: Array(frame.prefix(Self.prefixBytes)), .bytes(limit: limits.maxMessageBytes))
            }
            return .message(frame)
        }
        expected -= 1
        if dropping == nil && buffer.count + frame.count > limits.maxMessageBytes {
            dropping = .bytes(limit: limits.maxMessageBytes)
        }
        if dropping != nil {
            // Only the prefix is kept; the buffer never grows past it again.
            if buffer.count < Self.prefixBytes { buffer.append(contentsOf: frame.prefix(Self.prefixBytes - buffer.count)) }
            if buffer.count > Self.prefixBytes { buffer.removeSubrange(Self.prefixBytes...) }
        } else {
            let needed = buffer.count + frame.count
            if needed > buffer.capacity { buffer.reserveCapacity(min(max(needed, buffer.capacity * 2), limits.maxMessageBytes)) }
            buffer.append(contentsOf: frame)
        }
        guard expected == 0 else { return .partial }
        defer {
            buffer = []
            dropping = nil
        }
        if let dropping { return .tooLarge(prefix: Array(buffer.prefix(Self.prefixBytes)), dropping) }
        return .message(buffer)
    }

    /// The count a frame of 1 to 6 ASCII digits holds, else nil.
    static func count(_ frame: [UInt8]) -> Int? {
        guard !frame.isEmpty, frame.count <= 6 else { return nil }
        var n = 0
        for b in frame {
            guard b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9") else { return nil }
            n = n * 10 + Int(b - UInt8(ascii: "0"))
        }
        return n
    }
}

/// Splits a server message into frames every SDK accepts: one frame when it fits in
/// `chunkUnits` UTF-16 code units (what JS and Java count); otherwise a count frame and that many
/// chunks, cut only between Unicode scalars (each chunk is valid UTF-8) and never more than
/// `maxChunks` of them (iOS reads counts of at most four digits), the chunk size growing when a
/// message is too long for 9,999 chunks of 16,384 units. A message of 6 bytes or fewer goes as a
/// count of 1 and the message: JS takes any first frame that short which `Number()` accepts
/// (`0`, `""`, `1e3`, …) for a count, and would stall or misparse (the protocol's messages are
/// JSON objects, longer than that, so this never happens in practice). The frames of one message
/// must reach the connection together, in order (one outbound queue per connection).
public enum FrameSplitter {
    public static let chunkUnits = 16_384
    public static let maxChunks = 9_999

    /// `message` should be valid UTF-8 (the renderers' output); its bytes go out unchanged. The
    /// limits are parameters for tests only; the protocol's are the defaults.
    public static func frames(_ message: [UInt8], chunkUnits: Int = chunkUnits, maxChunks: Int = maxChunks) -> [[UInt8]] {
        if message.count <= 6 { return [Array("1".utf8), message] }
        // Bytes are never fewer than UTF-16 units: most messages need no scan.
        if message.count <= chunkUnits { return [message] }
        let total = utf16Units(message)
        if total <= chunkUnits { return [message] }
        var chunks = split(message, size: chunkUnits)
        if chunks.count > maxChunks {
            // Each chunk but the last holds at least `size - 1` units (a scalar is at most 2
            // wide), so with this size `total` units need at most `maxChunks` chunks.
            chunks = split(message, size: (total + maxChunks - 1) / maxChunks + 1)
        }
        return [Array(String(chunks.count).utf8)] + chunks
    }

    /// Chunks of at most `size` UTF-16 units, cut between scalars.
    static func split(_ message: [UInt8], size: Int) -> [[UInt8]] {
        var chunks: [[UInt8]] = []
        var start = 0
        var units = 0
        var i = 0
        while i < message.count {
            let (length, width) = scalar(at: i, in: message)
            if units + width > size {
                chunks.append(Array(message[start..<i]))
                start = i
                units = 0
            }
            units += width
            i += length
        }
        if start < message.count { chunks.append(Array(message[start...])) }
        return chunks
    }

    /// UTF-16 code units of a UTF-8 text: 2 for a scalar of 4 bytes, 1 for any other.
    static func utf16Units(_ bytes: [UInt8]) -> Int {
        var units = 0
        for b in bytes where b & 0xC0 != 0x80 { units += b >= 0xF0 ? 2 : 1 }
        return units
    }

    /// The byte length and UTF-16 width of the scalar starting at `i` (a stray continuation byte
    /// counts as one byte of width 1, so malformed input still splits and reassembles exactly).
    @inline(__always)
    static func scalar(at i: Int, in bytes: [UInt8]) -> (length: Int, width: Int) {
        let b = bytes[i]
        let length = b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4
        var n = 1
        while n < length && i + n < bytes.count && bytes[i + n] & 0xC0 == 0x80 { n += 1 }
        return (n, length == 4 && n == 4 ? 2 : 1)
    }
}
