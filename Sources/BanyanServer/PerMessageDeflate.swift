import BanyanREST
import BanyanSession
import CZlib
import NIOCore
import NIOWebSocket

// permessage-deflate (RFC 7692) on realtime connections (docs/realtime.md, "Compression").
// The offer is negotiated in `PerMessageDeflate` (BanyanREST, pure); this file holds the zlib
// streams, the inbound frame check and inflation, and the compressed outbound frames.

/// How one connection's outbound text messages are framed.
enum OutboundEncoding: Hashable, Sendable {
    /// Text frames as they are: no extension, or none the server can compress for.
    case plain
    /// permessage-deflate, compressed with at most this window (9 to 15 bits).
    case deflate(windowBits: Int)

    /// The encoding a negotiation leads to. zlib cannot write raw deflate with an 8-bit window
    /// (it widens it to 9, which a client that asked for 8 could not read back), so a client that
    /// bounds the server to 8 is sent uncompressed messages, which RFC 7692 allows.
    init(_ negotiated: PerMessageDeflate?) {
        guard let negotiated, negotiated.compressionWindowBits >= 9 else {
            self = .plain
            return
        }
        self = .deflate(windowBits: negotiated.compressionWindowBits)
    }
}

/// Why the inbound frame check failed a connection: the session closes it with `code`
/// (1002 for frames the protocol does not allow, 1009 for a message over the limit).
struct InboundFrameError: Error, CustomStringConvertible {
    var code: WebSocketErrorCode
    var reason: String

    static func protocolError(_ reason: String) -> InboundFrameError { InboundFrameError(code: .protocolError, reason: reason) }
    static func tooLarge(_ reason: String) -> InboundFrameError { InboundFrameError(code: .messageTooLarge, reason: reason) }
    /// The node's budget for messages being assembled is used up (1013: try again later).
    static func overBudget(_ reason: String) -> InboundFrameError { InboundFrameError(code: .init(codeNumber: 1013), reason: reason) }

    var description: String { reason }
}

/// The zlib streams of one event loop's realtime connections. With no context takeover agreed
/// both ways, every message is compressed or inflated whole by a stream reset just before, and
/// nothing carries over to the next message. So the connections of a loop share these streams
/// instead of each keeping its own (an idle connection holds no zlib state at all), and a push
/// compresses to the same bytes for every connection that receives it. Streams are made on first
/// use: a loop without compressed connections allocates none. Confined to the loop.
final class DeflateCodec {
    /// Messages shorter than this go uncompressed: the few bytes saved are not worth the work.
    static let threshold = 128
    /// zlib's default balance of speed and size (a push is compressed once and shared).
    static let level: Int32 = 6
    /// Output produced per inflate call.
    private static let inflateChunk = 64 << 10
    /// What RFC 7692 §7.2.2 appends to a message's payload before inflating it (and §7.2.1
    /// removes after compressing): the tail of an empty stored block, as a sync flush ends.
    private static let tail: [UInt8] = [0x00, 0x00, 0xFF, 0xFF]

    private var inflater: UnsafeMutablePointer<z_stream>?
    /// One compressor per window size asked for (almost always only 15).
    private var deflaters: [Int: UnsafeMutablePointer<z_stream>] = [:]

    init() {}

    deinit {
        if let inflater {
            inflateEnd(inflater)
            inflater.deinitialize(count: 1)
            inflater.deallocate()
        }
        for stream in deflaters.values {
            deflateEnd(stream)
            stream.deinitialize(count: 1)
            stream.deallocate()
        }
    }

    // MARK: - Inflating

    /// Inflates one message's payload: raw deflate with a 15-bit window (enough for any window a
    /// client uses), the payload followed by `00 00 ff ff`. More than `limit` bytes out is
    /// `tooLarge` (1009), found without ever holding more than `limit` bytes: a small payload
    /// that would inflate without end (a zip bomb) costs at most `limit` bytes and the time to
    /// produce them. Damaged data is a protocol error (1002).
    func inflateMessage(_ payload: ByteBuffer, limit: Int, allocator: ByteBufferAllocator) throws(InboundFrameError) -> ByteBuffer {
        guard let stream = inflateStream(), inflateReset(stream) == Z_OK else {
            throw InboundFrameError(code: .unexpectedServerError, reason: "the server could not start a zlib stream")
        }
        defer {
            // Never keep pointers into buffers past this call.
            stream.pointee.next_in = nil
            stream.pointee.next_out = nil
        }
        var output = allocator.buffer(capacity: min(limit, max(4_096, payload.readableBytes * 4)))
        let ended = try payload.withUnsafeReadableBytes { (input) throws(InboundFrameError) -> Bool in
            try Self.inflate(stream, input, into: &output, limit: limit)
        }
        if ended {
            // The client ended its data with a final block (RFC 7692 §7.2.3.3): nothing may follow.
            guard stream.pointee.avail_in == 0 else { throw .protocolError("compressed data continues after its final block") }
            return output
        }
        // The tail completes the empty stored block the sender's sync flush began. Data cut
        // short is not detected here (it decodes as far as it goes); the JSON reader rejects it.
        let tailed = Self.tail.withUnsafeBytes { input in
            Result { () throws(InboundFrameError) in try Self.inflate(stream, input, into: &output, limit: limit) }
        }
        _ = try tailed.get()
        return output
    }

    /// Feeds `input` to `stream` and appends what comes out to `output`, at most `limit` bytes in
    /// all. Returns whether the deflate stream ended (a final block).
    private static func inflate(
        _ stream: UnsafeMutablePointer<z_stream>, _ input: UnsafeRawBufferPointer, into output: inout ByteBuffer, limit: Int
    ) throws(InboundFrameError) -> Bool {
        stream.pointee.next_in = UnsafeMutablePointer(mutating: input.baseAddress?.assumingMemoryBound(to: Bytef.self))
        stream.pointee.avail_in = UInt32(truncatingIfNeeded: input.count)
        while true {
            let room = min(inflateChunk, limit - output.readableBytes)
            let before = stream.pointee.avail_in
            var rc = Z_OK
            var produced = 0
            if room > 0 {
                produced = output.writeWithUnsafeMutableBytes(minimumWritableBytes: room) { out in
                    stream.pointee.next_out = out.baseAddress?.assumingMemoryBound(to: Bytef.self)
                    stream.pointee.avail_out = UInt32(room)
                    rc = CZlib.inflate(stream, Z_SYNC_FLUSH)
                    return room - Int(stream.pointee.avail_out)
                }
            } else {
                // At the limit: one more byte out means the message is over it.
                var probe: UInt8 = 0
                withUnsafeMutablePointer(to: &probe) { byte in
                    stream.pointee.next_out = byte
                    stream.pointee.avail_out = 1
                    rc = CZlib.inflate(stream, Z_SYNC_FLUSH)
                }
                if stream.pointee.avail_out == 0 { throw .tooLarge("inflated message exceeds the limit of \(limit) bytes") }
            }
            switch rc {
            case Z_STREAM_END:
                return true
            case Z_OK, Z_BUF_ERROR:
                let inputLeft = stream.pointee.avail_in > 0
                let outputFull = room > 0 && stream.pointee.avail_out == 0
                if !inputLeft && !outputFull { return false }
                if produced == 0 && stream.pointee.avail_in == before { throw .protocolError("compressed data does not decode") }
            default:
                throw .protocolError("compressed data is damaged (zlib \(rc))")
            }
        }
    }

    private func inflateStream() -> UnsafeMutablePointer<z_stream>? {
        if let inflater { return inflater }
        let stream = UnsafeMutablePointer<z_stream>.allocate(capacity: 1)
        stream.initialize(to: z_stream())
        guard inflateInit2_(stream, -15, zlibVersion(), Int32(MemoryLayout<z_stream>.size)) == Z_OK else {
            stream.deinitialize(count: 1)
            stream.deallocate()
            return nil
        }
        inflater = stream
        return stream
    }

    // MARK: - Compressing

    /// One message compressed (RFC 7692 §7.2.1: raw deflate ended by a sync flush, its final
    /// `00 00 ff ff` removed), or nil when it is under `threshold`, would not come out smaller,
    /// or zlib fails: the message then goes uncompressed.
    func compressMessage(_ message: [UInt8], windowBits: Int, allocator: ByteBufferAllocator) -> ByteBuffer? {
        guard message.count >= Self.threshold, message.count < Int(UInt32.max) / 2, let stream = deflateStream(windowBits: windowBits),
            deflateReset(stream) == Z_OK
        else { return nil }
        // A sync flush adds a few bytes past deflate's bound for a finished stream.
        var output = allocator.buffer(capacity: Int(deflateBound(stream, uLong(message.count))) + 16)
        let complete = message.withUnsafeBufferPointer { input -> Bool in
            stream.pointee.next_in = UnsafeMutablePointer(mutating: input.baseAddress)
            stream.pointee.avail_in = UInt32(input.count)
            while true {
                let room = max(64, output.writableBytes)
                var rc = Z_OK
                output.writeWithUnsafeMutableBytes(minimumWritableBytes: room) { out in
                    stream.pointee.next_out = out.baseAddress?.assumingMemoryBound(to: Bytef.self)
                    stream.pointee.avail_out = UInt32(room)
                    rc = CZlib.deflate(stream, Z_SYNC_FLUSH)
                    return room - Int(stream.pointee.avail_out)
                }
                // Done once all input is in and the flush left room unused.
                if rc == Z_OK && stream.pointee.avail_in == 0 && stream.pointee.avail_out > 0 { return true }
                if rc != Z_OK { return false }
            }
        }
        // Never keep pointers into the message past its lifetime.
        stream.pointee.next_in = nil
        stream.pointee.avail_in = 0
        guard complete, output.readableBytes >= 4, output.getBytes(at: output.writerIndex - 4, length: 4) == Self.tail else { return nil }
        output.moveWriterIndex(to: output.writerIndex - 4)
        return output.readableBytes < message.count ? output : nil
    }

    private func deflateStream(windowBits: Int) -> UnsafeMutablePointer<z_stream>? {
        if let stream = deflaters[windowBits] { return stream }
        guard (9...15).contains(windowBits) else { return nil }
        let stream = UnsafeMutablePointer<z_stream>.allocate(capacity: 1)
        stream.initialize(to: z_stream())
        let rc = deflateInit2_(
            stream, Self.level, Z_DEFLATED, -Int32(windowBits), 8, Z_DEFAULT_STRATEGY, zlibVersion(), Int32(MemoryLayout<z_stream>.size))
        guard rc == Z_OK else {
            stream.deinitialize(count: 1)
            stream.deallocate()
            return nil
        }
        deflaters[windowBits] = stream
        return stream
    }
}

/// The inbound side of the extension, between NIO's frame decoder and its fragment aggregator
/// (which drops the reserved bits of fragmented messages, so compression is resolved before
/// it). Every frame's reserved bits are checked (RFC 6455 §5.2, RFC 7692 §6): RSV1 only on the
/// first frame of a data message and only when permessage-deflate was negotiated, RSV2 and RSV3
/// never, control frames never compressed; anything else fails the connection with 1002.
/// A compressed message's frames are collected (bounded like the aggregator's: `maxFrames`
/// fragments, `maxMessageBytes` bytes) and inflated once whole with the loop's shared stream,
/// its output bounded by `maxMessageBytes` too; it then goes on as one uncompressed frame.
/// Uncompressed frames pass unchanged. One per connection; confined to its event loop.
final class PerMessageDeflateReader: ChannelInboundHandler {
    typealias InboundIn = WebSocketFrame
    typealias InboundOut = WebSocketFrame

    /// The loop's streams; nil when the connection did not negotiate the extension.
    private let codec: DeflateCodec?
    private let maxMessageBytes: Int
    private let maxFrames: Int

    /// The data message whose frames are arriving, if any.
    private enum Message {
        case none
        case plain
        case compressed(opcode: WebSocketOpcode, payload: ByteBuffer, frames: Int)
    }
    private var message = Message.none
    /// Set after a failure: the connection is closing, nothing more is read into it.
    private var failed = false
    /// Bytes of the fragmented message being received (here or in the aggregator after this
    /// handler), charged to the node's budget for messages being assembled.
    private var account: BudgetAccount?

    init(codec: DeflateCodec?, maxMessageBytes: Int, maxFrames: Int, budget: ByteBudget? = nil) {
        self.codec = codec
        self.maxMessageBytes = maxMessageBytes
        self.maxFrames = maxFrames
        self.account = budget.map(BudgetAccount.init)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !failed else { return }
        let frame = unwrapInboundIn(data)
        do {
            try charge(frame)
            if let whole = try read(frame, allocator: context.channel.allocator) {
                context.fireChannelRead(wrapInboundOut(whole))
            }
        } catch {
            failed = true
            message = .none
            account?.releaseAll()
            context.fireErrorCaught(error)
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        account?.releaseAll()
    }

    /// Keeps the budget's account of the fragmented message in step: a first fragment or a
    /// continuation adds its bytes, the final frame releases them all (the message is whole).
    private func charge(_ frame: WebSocketFrame) throws(InboundFrameError) {
        guard var account, !frame.opcode.isControlOpcode else { return }
        defer { self.account = account }
        let holding: Int
        switch frame.opcode {
        case .continuation: holding = frame.fin ? 0 : account.held + frame.length
        default: holding = frame.fin ? 0 : frame.length
        }
        guard account.hold(holding) else {
            throw .overBudget("the node's budget for messages being assembled (\(account.budget.limit) bytes) is used up; try again")
        }
    }

    /// What goes on for `frame`: itself, a whole inflated message, or nothing yet.
    private func read(_ frame: WebSocketFrame, allocator: ByteBufferAllocator) throws(InboundFrameError) -> WebSocketFrame? {
        guard !frame.rsv2, !frame.rsv3 else { throw .protocolError("RSV2 or RSV3 set: no extension using them was negotiated") }
        if frame.opcode.isControlOpcode {
            guard !frame.rsv1 else { throw .protocolError("a control frame cannot be compressed (RSV1)") }
            return frame
        }
        switch frame.opcode {
        case .text, .binary:
            guard case .none = message else { throw .protocolError("a new message began before the previous one ended") }
            guard frame.rsv1 else {
                if !frame.fin { message = .plain }
                return frame
            }
            guard let codec else { throw .protocolError("compressed frame (RSV1) but permessage-deflate was not negotiated") }
            let payload = frame.unmaskedData
            if frame.fin {
                let whole = try codec.inflateMessage(payload, limit: maxMessageBytes, allocator: allocator)
                return WebSocketFrame(fin: true, opcode: frame.opcode, data: whole)
            }
            message = .compressed(opcode: frame.opcode, payload: payload, frames: 1)
            return nil
        case .continuation:
            guard !frame.rsv1 else { throw .protocolError("RSV1 on a continuation frame") }
            switch message {
            case .none:
                throw .protocolError("a continuation frame outside a message")
            case .plain:
                if frame.fin { message = .none }
                return frame
            case .compressed(let opcode, var payload, let frames):
                message = .none
                guard frames < maxFrames else { throw .tooLarge("compressed message in more than \(maxFrames) frames") }
                guard payload.readableBytes + frame.length <= maxMessageBytes else {
                    throw .tooLarge("compressed message exceeds the limit of \(maxMessageBytes) bytes")
                }
                var data = frame.unmaskedData
                payload.writeBuffer(&data)
                guard frame.fin, let codec else {
                    message = .compressed(opcode: opcode, payload: payload, frames: frames + 1)
                    return nil
                }
                let whole = try codec.inflateMessage(payload, limit: maxMessageBytes, allocator: allocator)
                return WebSocketFrame(fin: true, opcode: opcode, data: whole)
            }
        default:
            // Opcodes RFC 6455 reserves: the session decides (their reserved bits were checked).
            return frame
        }
    }
}

// MARK: - Outbound

extension ServerFrames {
    /// One protocol message as text frames in a connection's encoding. Under permessage-deflate,
    /// each frame `FrameSplitter` makes is a WebSocket message of its own and is compressed on
    /// its own (RSV1 set), when it is long enough and comes out smaller; the others go as they
    /// are. No context is carried between messages, so the bytes depend only on the message and
    /// the window: one compression serves every connection it is sent to.
    static func text(_ message: [UInt8], encoding: OutboundEncoding, codec: DeflateCodec, allocator: ByteBufferAllocator) -> [ByteBuffer] {
        guard case .deflate(let windowBits) = encoding else { return text(message, allocator: allocator) }
        return FrameSplitter.frames(message).map { chunk in
            if let compressed = codec.compressMessage(chunk, windowBits: windowBits, allocator: allocator) {
                return encode(opcode: 0x1, compressed, allocator: allocator, compressed: true)
            }
            var payload = allocator.buffer(capacity: chunk.count)
            payload.writeBytes(chunk)
            return encode(opcode: 0x1, payload, allocator: allocator)
        }
    }
}

/// A rendered push and its frames for each outbound encoding, each made the first time a
/// connection with that encoding needs it: the hub encodes (and compresses) a push once per
/// encoding, not once per connection, and every connection with the same encoding is sent the
/// same buffers. Lives only while one applied command is delivered.
final class SharedPush {
    let message: [UInt8]
    private var variants: [(encoding: OutboundEncoding, frames: [ByteBuffer])] = []

    init(_ message: [UInt8]) {
        self.message = message
    }

    func frames(_ encoding: OutboundEncoding, codec: DeflateCodec, allocator: ByteBufferAllocator) -> [ByteBuffer] {
        if let made = variants.first(where: { $0.encoding == encoding }) { return made.frames }
        let frames = ServerFrames.text(message, encoding: encoding, codec: codec, allocator: allocator)
        variants.append((encoding, frames))
        return frames
    }
}
