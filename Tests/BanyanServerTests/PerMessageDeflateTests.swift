import BanyanREST
@testable import BanyanServer
import CZlib
import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing

/// A client's side of permessage-deflate, written straight on zlib for the tests (independent of
/// the server's `DeflateCodec`): what a browser sends and how it reads what it gets.
enum ClientZlib {
    static let tail: [UInt8] = [0x00, 0x00, 0xFF, 0xFF]

    /// Raw deflate of `bytes`: ended by a sync flush with its final `00 00 ff ff` removed (RFC
    /// 7692 §7.2.1), or with `finish`, ended by a final block as some clients do (§7.2.3.3).
    static func compress(_ bytes: [UInt8], level: Int32 = 6, windowBits: Int32 = 15, finish: Bool = false) -> [UInt8] {
        var stream = z_stream()
        guard deflateInit2_(&stream, level, Z_DEFLATED, -windowBits, 8, Z_DEFAULT_STRATEGY, zlibVersion(), Int32(MemoryLayout<z_stream>.size)) == Z_OK
        else { return [] }
        defer { deflateEnd(&stream) }
        var input = bytes
        var output = [UInt8](repeating: 0, count: Int(deflateBound(&stream, uLong(bytes.count))) + 64)
        let produced = input.withUnsafeMutableBufferPointer { inp in
            output.withUnsafeMutableBufferPointer { out -> Int in
                stream.next_in = inp.baseAddress
                stream.avail_in = UInt32(inp.count)
                stream.next_out = out.baseAddress
                stream.avail_out = UInt32(out.count)
                _ = deflate(&stream, finish ? Z_FINISH : Z_SYNC_FLUSH)
                return out.count - Int(stream.avail_out)
            }
        }
        var result = Array(output[..<produced])
        if !finish, result.suffix(4) == ArraySlice(tail) { result.removeLast(4) }
        return result
    }

    /// Inflates one message as a client does (the payload with `00 00 ff ff` appended); nil when
    /// zlib reports damage.
    static func inflate(_ payload: [UInt8]) -> [UInt8]? {
        var stream = z_stream()
        guard inflateInit2_(&stream, -15, zlibVersion(), Int32(MemoryLayout<z_stream>.size)) == Z_OK else { return nil }
        defer { inflateEnd(&stream) }
        var input = payload + tail
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        return input.withUnsafeMutableBufferPointer { inp -> [UInt8]? in
            stream.next_in = inp.baseAddress
            stream.avail_in = UInt32(inp.count)
            while true {
                let (rc, n) = chunk.withUnsafeMutableBufferPointer { out -> (Int32, Int) in
                    stream.next_out = out.baseAddress
                    stream.avail_out = UInt32(out.count)
                    let rc = CZlib.inflate(&stream, Z_SYNC_FLUSH)
                    return (rc, out.count - Int(stream.avail_out))
                }
                result += chunk[..<n]
                switch rc {
                case Z_STREAM_END: return result
                case Z_OK, Z_BUF_ERROR:
                    if stream.avail_in == 0 && stream.avail_out > 0 { return result }
                    if rc == Z_BUF_ERROR { return nil }
                default: return nil
                }
            }
        }
    }

    /// Seeded text that compresses only about in half (hex digits): large values stay large
    /// on the wire.
    static func hexText(count: Int, seed: UInt64) -> [UInt8] {
        var state = seed
        let digits = Array("0123456789abcdef".utf8)
        return (0..<count).map { _ in
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return digits[Int(state >> 60)]
        }
    }
}

/// The server's permessage-deflate pieces on their own (docs/realtime.md, "Compression"): the
/// shared zlib streams, the inbound frame check (on an embedded channel) and compressed frames.
@Suite struct PerMessageDeflateTests {
    static let json = Array(String(repeating: #"{"name":"banyan","tags":["tree","realtime"],"n":42},"#, count: 200).utf8)

    @Test("compressing: raw deflate, sync flush, tail removed; a client inflates it back; short or incompressible messages stay plain")
    func compressing() throws {
        let codec = DeflateCodec()
        let allocator = ByteBufferAllocator()
        for bits in [15, 9] {
            let out = try #require(codec.compressMessage(Self.json, windowBits: bits, allocator: allocator))
            let bytes = Array(out.readableBytesView)
            #expect(bytes.count < Self.json.count / 10 && bytes.suffix(4) != ArraySlice(ClientZlib.tail))
            #expect(ClientZlib.inflate(bytes) == Self.json)
            // The same message compresses to the same bytes (no context carried over): one
            // compression can serve every connection.
            #expect(codec.compressMessage(Self.json, windowBits: bits, allocator: allocator).map { Array($0.readableBytesView) } == bytes)
        }
        #expect(codec.compressMessage(Array(Self.json.prefix(DeflateCodec.threshold - 1)), windowBits: 15, allocator: allocator) == nil)
        var state: UInt64 = 7
        let noise = (0..<4_000).map { _ -> UInt8 in
            state = state &* 6_364_136_223_846_793_005 &+ 1
            return UInt8(truncatingIfNeeded: state >> 56)
        }
        #expect(codec.compressMessage(noise, windowBits: 15, allocator: allocator) == nil)
        // No 8-bit window in zlib's raw deflate: such a client is sent plain messages.
        #expect(OutboundEncoding(PerMessageDeflate(serverMaxWindowBits: 8)) == .plain)
        #expect(OutboundEncoding(PerMessageDeflate(serverMaxWindowBits: 11)) == .deflate(windowBits: 11))
        #expect(OutboundEncoding(PerMessageDeflate()) == .deflate(windowBits: 15) && OutboundEncoding(nil) == .plain)
    }

    @Test("outbound frames: each protocol-level frame is a message of its own, compressed with RSV1 when worth it")
    func outboundFrames() throws {
        let codec = DeflateCodec()
        let allocator = ByteBufferAllocator()
        let message = ClientZlib.hexText(count: 100_000, seed: 3)
        let frames = ServerFrames.text(message, encoding: .deflate(windowBits: 15), codec: codec, allocator: allocator)
            .map { Array($0.readableBytesView) }
        // A count frame (too short to compress), then 16,384-byte chunks, each compressed.
        #expect(frames.count == 8 && frames[0] == [0x81, 1, UInt8(ascii: "7")])
        var joined: [UInt8] = []
        for frame in frames.dropFirst() {
            #expect(frame[0] == 0xC1)
            var length = Int(frame[1] & 0x7F)
            var offset = 2
            if length == 126 {
                length = Int(frame[2]) << 8 | Int(frame[3])
                offset = 4
            }
            #expect(frame.count == offset + length)
            joined += try #require(ClientZlib.inflate(Array(frame[offset...])))
        }
        #expect(joined == message)
        // Plain connections get exactly what they got before.
        let plain = ServerFrames.text(message, encoding: .plain, codec: codec, allocator: allocator)
        #expect(plain == ServerFrames.text(message, allocator: allocator))
        // A shared push encodes once per encoding.
        let push = SharedPush(message)
        let first = push.frames(.deflate(windowBits: 15), codec: codec, allocator: allocator)
        let again = push.frames(.deflate(windowBits: 15), codec: codec, allocator: allocator)
        func address(_ b: ByteBuffer) -> UInt { b.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) } }
        #expect(first.count == again.count && zip(first, again).allSatisfy { address($0.0) == address($0.1) })
        #expect(push.frames(.plain, codec: codec, allocator: allocator) == plain)
    }

    @Test("inflating: sync-flushed, final-block and empty messages; output bounded by the limit (a zip bomb is tooLarge); damage is a protocol error")
    func inflating() throws {
        let codec = DeflateCodec()
        let allocator = ByteBufferAllocator()
        func inflate(_ bytes: [UInt8], limit: Int = 16 << 20) -> Result<[UInt8], InboundFrameError> {
            Result { () throws(InboundFrameError) in
                Array(try codec.inflateMessage(ByteBuffer(bytes: bytes), limit: limit, allocator: allocator).readableBytesView)
            }
        }
        func code(_ r: Result<[UInt8], InboundFrameError>) -> WebSocketErrorCode? {
            if case .failure(let e) = r { return e.code }
            return nil
        }
        for bits: Int32 in [15, 12, 9] { #expect(try inflate(ClientZlib.compress(Self.json, windowBits: bits)).get() == Self.json) }
        #expect(try inflate(ClientZlib.compress(Self.json, finish: true)).get() == Self.json)
        #expect(try inflate([0x00]).get() == [])  // RFC 7692 §7.2.3.6: an empty message
        #expect(try inflate(ClientZlib.compress([])).get() == [])
        // Stored blocks only (level 0) read the same.
        #expect(try inflate(ClientZlib.compress(Self.json, level: 0)).get() == Self.json)
        // The limit: exactly the limit passes, one byte more does not.
        let zeros = [UInt8](repeating: 0, count: 1 << 20)
        let packed = ClientZlib.compress(zeros, level: 9)
        #expect(try inflate(packed, limit: 1 << 20).get().count == 1 << 20)
        #expect(code(inflate(packed, limit: (1 << 20) - 1)) == .messageTooLarge)
        // A bomb: 20 KiB that would inflate to 20 MiB.
        let bomb = ClientZlib.compress([UInt8](repeating: UInt8(ascii: "a"), count: 20 << 20), level: 9)
        #expect(bomb.count < 30_000)
        #expect(code(inflate(bomb)) == .messageTooLarge)
        // Damage: not deflate at all, data after a final block, a reserved block type.
        #expect(code(inflate([0xFF, 0xFF, 0xFF, 0xFF, 0x12])) == .protocolError)
        #expect(code(inflate(ClientZlib.compress(Self.json, finish: true) + [0x01, 0x02])) == .protocolError)
        #expect(code(inflate([0x07])) == .protocolError)
        // The stream is reset between messages: a message after a failure reads correctly.
        #expect(try inflate(ClientZlib.compress(Self.json)).get() == Self.json)
    }

    // MARK: - The inbound frame check

    /// A reader on an embedded channel: for a connection with (`negotiated`) or without the
    /// extension, with the session's limits scaled down.
    func reader(negotiated: Bool, maxMessageBytes: Int = 1 << 20, maxFrames: Int = 8) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(
            PerMessageDeflateReader(codec: negotiated ? DeflateCodec() : nil, maxMessageBytes: maxMessageBytes, maxFrames: maxFrames))
        return channel
    }

    func frame(_ opcode: WebSocketOpcode, _ bytes: [UInt8], fin: Bool = true, rsv1: Bool = false, rsv2: Bool = false) -> WebSocketFrame {
        WebSocketFrame(fin: fin, rsv1: rsv1, rsv2: rsv2, opcode: opcode, data: ByteBuffer(bytes: bytes))
    }

    /// Feeds frames; the error the reader raised, if any.
    func feed(_ channel: EmbeddedChannel, _ frames: WebSocketFrame...) -> InboundFrameError? {
        for f in frames {
            do {
                try channel.writeInbound(f)
            } catch let e as InboundFrameError {
                return e
            } catch {
                Issue.record("unexpected error \(error)")
            }
        }
        return nil
    }

    func received(_ channel: EmbeddedChannel) throws -> [WebSocketFrame] {
        var out: [WebSocketFrame] = []
        while let f = try channel.readInbound(as: WebSocketFrame.self) { out.append(f) }
        return out
    }

    @Test("negotiated: a compressed message, whole or in fragments with a ping between, goes on as one plain frame; plain frames pass")
    func readerInflates() throws {
        let channel = try reader(negotiated: true)
        let packed = ClientZlib.compress(Self.json)
        #expect(feed(channel, frame(.text, packed, rsv1: true)) == nil)
        var out = try received(channel)
        #expect(out.count == 1 && out[0].fin && !out[0].rsv1 && out[0].opcode == .text && Array(out[0].unmaskedData.readableBytesView) == Self.json)
        // Fragments: RSV1 on the first only; a control frame may come between them.
        let third = packed.count / 3
        #expect(
            feed(
                channel, frame(.text, Array(packed[..<third]), fin: false, rsv1: true),
                frame(.continuation, Array(packed[third..<(2 * third)]), fin: false), frame(.ping, [1]),
                frame(.continuation, Array(packed[(2 * third)...]))) == nil)
        out = try received(channel)
        #expect(out.count == 2 && out[0].opcode == .ping && out[1].opcode == .text && !out[1].rsv1)
        #expect(out.count == 2 && Array(out[1].unmaskedData.readableBytesView) == Self.json)
        // Uncompressed messages (whole or fragmented) go through unchanged, for the aggregator.
        #expect(feed(channel, frame(.text, [0x61]), frame(.text, [0x62], fin: false), frame(.continuation, [0x63])) == nil)
        out = try received(channel)
        #expect(out.map { Array($0.unmaskedData.readableBytesView) } == [[0x61], [0x62], [0x63]])
        #expect(out.map(\.opcode) == [.text, .text, .continuation])
    }

    @Test("bad reserved bits fail with 1002: RSV1 unnegotiated, on a continuation or a control frame; RSV2; damaged data; then nothing more is read")
    func readerRefuses() throws {
        let packed = ClientZlib.compress(Self.json)
        let cases: [(Bool, [WebSocketFrame])] = [
            (false, [frame(.text, packed, rsv1: true)]),
            (true, [frame(.text, Array(packed.prefix(10)), fin: false, rsv1: true), frame(.continuation, Array(packed.dropFirst(10)), rsv1: true)]),
            (true, [frame(.text, [0x61], fin: false), frame(.continuation, [0x62], rsv1: true)]),
            (true, [frame(.ping, packed, rsv1: true)]),
            (false, [frame(.connectionClose, [0x03, 0xE8], rsv1: true)]),
            (true, [frame(.text, [0x61], rsv2: true)]),
            (false, [frame(.text, [0x61], rsv2: true)]),
            (true, [frame(.text, [0xFF, 0xEE, 0xDD, 0xCC], rsv1: true)]),
            (true, [frame(.continuation, [0x61])]),
            (true, [frame(.text, packed, fin: false, rsv1: true), frame(.text, [0x61])]),
        ]
        for (index, (negotiated, frames)) in cases.enumerated() {
            let channel = try reader(negotiated: negotiated)
            var error: InboundFrameError?
            for f in frames where error == nil { error = feed(channel, f) }
            #expect(error?.code == .protocolError, "case \(index): \(String(describing: error))")
            // After the failure the connection is closing: later frames are dropped.
            _ = try received(channel)
            #expect(feed(channel, frame(.text, [0x61])) == nil)
            #expect(try received(channel).isEmpty, "case \(index)")
        }
    }

    @Test("compressed messages are bounded like the aggregator's: bytes and fragments collected, and bytes inflated (1009)")
    func readerBounds() throws {
        let big = ClientZlib.hexText(count: 200_000, seed: 5)
        let packed = ClientZlib.compress(big)
        // Inflated output over the limit (the compressed bytes are within it).
        var channel = try reader(negotiated: true, maxMessageBytes: 150_000)
        #expect(packed.count < 150_000)
        #expect(feed(channel, frame(.text, packed, rsv1: true))?.code == .messageTooLarge)
        // Compressed fragments over the byte limit.
        channel = try reader(negotiated: true, maxMessageBytes: 50_000)
        let half = packed.count / 2
        #expect(
            feed(channel, frame(.text, Array(packed[..<half]), fin: false, rsv1: true), frame(.continuation, Array(packed[half...])))?.code
                == .messageTooLarge)
        // More fragments than allowed.
        channel = try reader(negotiated: true, maxFrames: 3)
        let fragments = [frame(.text, [packed[0]], fin: false, rsv1: true)] + (1..<4).map { frame(.continuation, [packed[$0]], fin: false) }
        var error: InboundFrameError?
        for f in fragments where error == nil { error = feed(channel, f) }
        #expect(error?.code == .messageTooLarge)
        // Within the limits, the same message passes.
        channel = try reader(negotiated: true, maxMessageBytes: 200_000)
        #expect(feed(channel, frame(.text, packed, rsv1: true)) == nil)
        #expect(try received(channel).first.map { Array($0.unmaskedData.readableBytesView) } == big)
    }
}
