/// The Firebase WebSocket protocol v5's message framing (docs/realtime.md; reference §1.3).
///
/// Every logical message is one JSON text. A sender whose message is longer than one chunk first
/// sends a text frame holding only the decimal count of chunks, then the chunks; a lone `0` frame
/// is the clients' keep-alive. Pure: bytes in, bytes or typed errors out.

/// Reassembles client frames into messages. Each frame is the payload of one WebSocket text
/// frame (UTF-8, already validated by the WebSocket layer).
///
/// Rules: while not collecting, a frame of 1 to 6 ASCII digits is a count (`0`: keep-alive,
/// ignored; `n`: the next `n` frames are one message, concatenated); any other frame is a whole
/// message. While collecting, every frame is data, digits included.
///
/// Bounds (each a typed error, after which the assembler is idle again and the caller closes
/// the connection): a frame over `maxFrameBytes`; a count over `maxFramesPerMessage`; a message
/// that would exceed `maxMessageBytes` (checked before its bytes are kept, so memory never
/// exceeds the limit).
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

    public enum Received: Sendable, Equatable {
        /// The client's keep-alive (`0`): nothing to do.
        case keepAlive
        /// A count, or a chunk of a message still incomplete.
        case partial
        /// One whole message's bytes.
        case message([UInt8])
    }

    public enum FrameError: Error, Sendable, Equatable, CustomStringConvertible {
        case frameTooLarge(bytes: Int, limit: Int)
        case messageTooLarge(limit: Int)
        case tooManyFrames(count: Int, limit: Int)

        public var description: String {
            switch self {
            case let .frameTooLarge(bytes, limit): return "frame of \(bytes) bytes exceeds the limit of \(limit) bytes"
            case let .messageTooLarge(limit): return "message exceeds the limit of \(limit) bytes"
            case let .tooManyFrames(count, limit): return "message announced in \(count) frames, more than the limit of \(limit)"
            }
        }
    }

    public let limits: Limits
    /// Frames still expected for the message being collected (0: idle).
    public private(set) var expected = 0
    private var buffer: [UInt8] = []

    public init(limits: Limits = Limits()) {
        self.limits = limits
    }

    public var isCollecting: Bool { expected > 0 }

    public mutating func receive(_ frame: [UInt8]) throws(FrameError) -> Received {
        guard frame.count <= limits.maxFrameBytes else {
            reset()
            throw .frameTooLarge(bytes: frame.count, limit: limits.maxFrameBytes)
        }
        if expected == 0 {
            if let count = Self.count(frame) {
                if count == 0 { return .keepAlive }
                guard count <= limits.maxFramesPerMessage else { throw .tooManyFrames(count: count, limit: limits.maxFramesPerMessage) }
                expected = count
                return .partial
            }
            guard frame.count <= limits.maxMessageBytes else { throw .messageTooLarge(limit: limits.maxMessageBytes) }
            return .message(frame)
        }
        guard buffer.count + frame.count <= limits.maxMessageBytes else {
            reset()
            throw .messageTooLarge(limit: limits.maxMessageBytes)
        }
        buffer.append(contentsOf: frame)
        expected -= 1
        guard expected == 0 else { return .partial }
        defer { buffer = [] }
        return .message(buffer)
    }

    private mutating func reset() {
        expected = 0
        buffer = []
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
/// message is too long for 9,999 chunks of 16,384 units. Never a bare `0` (JS would wait forever
/// for zero frames).
public enum FrameSplitter {
    public static let chunkUnits = 16_384
    public static let maxChunks = 9_999

    /// `message` must be valid UTF-8 (the renderers' output); its bytes go out unchanged. The
    /// limits are parameters for tests only; the protocol's are the defaults.
    public static func frames(_ message: [UInt8], chunkUnits: Int = chunkUnits, maxChunks: Int = maxChunks) -> [[UInt8]] {
        let total = utf16Units(message)
        if total <= chunkUnits { return [message] }
        // Each chunk but the last holds at least `size - 1` units (a scalar is at most 2 wide),
        // so with this size `total` units need at most `maxChunks` chunks.
        let size = max(chunkUnits, (total + maxChunks - 1) / maxChunks + 1)
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
        return [Array(String(chunks.count).utf8)] + chunks
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
