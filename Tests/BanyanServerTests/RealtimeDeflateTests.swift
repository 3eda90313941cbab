import Foundation
import Testing

/// permessage-deflate (RFC 7692) on a real node over raw frames (docs/realtime.md,
/// "Compression"): the answer to the offer, compressed messages both ways (small, and over
/// 1 MiB in several frames), a zip bomb, and the frames the extension does not allow. Part of
/// `RealtimeServerTests` (same client and node helpers).
extension RealtimeServerTests {
    static let upgradeHeaders =
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    /// What browsers offer.
    static let deflateOffer = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    static let deflateAnswer = "\r\nSec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover\r\n"

    /// Connects offering permessage-deflate, checks that the answer accepts it, reads the hello.
    func openCompressed(_ port: Int) throws -> Client {
        let c = try Client(port: port, extraHeaders: Self.upgradeHeaders + Self.deflateOffer)
        let head = c.head() + "\r\n"
        #expect(head.hasPrefix("HTTP/1.1 101"), "\(head)")
        #expect(head.contains(Self.deflateAnswer), "\(head)")
        let hello = c.deflatedMessage()?.text ?? ""
        #expect(hello.contains(#""t":"h""#), "\(hello)")
        return c
    }

    @Test("permessage-deflate: the offer is answered; a compressed listen and put are read; the push comes compressed and inflates to the JSON; a plain listener gets it plain")
    func deflateEndToEnd() throws {
        try withNode("rt-deflate") { port in
            // Without the offer nothing changes: no extension in the answer, no RSV bits.
            let plain = try Client(port: port)
            let plainHead = plain.head()
            #expect(plainHead.hasPrefix("HTTP/1.1 101") && !plainHead.lowercased().contains("sec-websocket-extensions"), "\(plainHead)")
            #expect(plain.message()?.contains(#""t":"h""#) == true)
            // An empty location and no cache (h ""): the ok alone.
            plain.text(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/docs","h":""}}}"#)
            #expect(plain.messages(until: #""r":1"#).count == 1)

            let c = try openCompressed(port)
            c.compressed(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/docs","h":""}}}"#)
            let started = c.deflatedMessages(until: #""r":1"#)
            #expect(started == [#"{"t":"d","d":{"r":1,"b":{"s":"ok","d":{}}}}"#], "\(started)")

            let body = String(repeating: "realtime tree database, ", count: 12)
            let doc = #"{"body":"\#(body)","title":"Banyan"}"#
            c.compressed(#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/docs/d1","d":\#(doc)}}}"#)
            let expected = #"{"t":"d","d":{"a":"d","b":{"p":"docs/d1","d":\#(doc)}}}"#
            let push = c.deflatedMessage()
            #expect(push?.text == expected && push?.compressed == 1 && push?.frames == 1, "\(String(describing: push))")
            #expect(c.deflatedMessage()?.text == #"{"t":"d","d":{"r":2,"b":{"s":"ok","d":""}}}"#)
            // The plain listener: the same message, uncompressed.
            #expect(plain.message() == expected)
            #expect(plain.lastReservedBits == 0)
            // A get's answer over the threshold comes compressed too.
            c.compressed(#"{"t":"d","d":{"r":3,"a":"g","b":{"p":"/docs/d1","q":{}}}}"#)
            let answer = c.deflatedMessage()
            #expect(answer?.text == #"{"t":"d","d":{"r":3,"b":{"s":"ok","d":\#(doc)}}}"# && answer?.compressed == 1, "\(String(describing: answer))")
            // Uncompressed messages from the client are still read on a compressed connection.
            c.text(#"{"t":"c","d":{"t":"p","d":{}}}"#)
            #expect(c.deflatedMessage()?.text == #"{"t":"c","d":{"t":"o","d":null}}"#)
        }
    }

    @Test("permessage-deflate: values over 1 MiB both ways, in one compressed message of many fragments and in counted compressed chunks")
    func deflateLargeValues() throws {
        try withNode("rt-deflate-large") { port in
            let c = try openCompressed(port)
            c.compressed(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/big","h":""}}}"#)
            #expect(c.deflatedMessages(until: #""r":1"#).count == 1)
            for (request, key) in [(2, "a"), (3, "b")] {
                let value = String(decoding: ClientZlib.hexText(count: 1_500_000, seed: UInt64(request)), as: UTF8.self)
                let put = #"{"t":"d","d":{"r":\#(request),"a":"p","b":{"p":"/big/\#(key)","d":"\#(value)"}}}"#
                if request == 2 {
                    // One WebSocket message, compressed (about 750 KB) and cut in 12 frames.
                    c.compressed(put, fragments: 12)
                } else {
                    // As the SDKs split: a count, then chunks, each its own compressed message.
                    c.compressedChunks(put)
                }
                let push = c.deflatedMessage(seconds: 30)
                let expected = #"{"t":"d","d":{"a":"d","b":{"p":"big/\#(key)","d":"\#(value)"}}}"#
                #expect(push?.text == expected, "request \(request): \(push?.text.prefix(200) ?? "nothing")")
                // A count frame and about 92 chunks, every chunk compressed.
                let frames = push?.frames ?? 0
                #expect(frames > 90 && push?.compressed == frames - 1, "\(frames) frames, \(String(describing: push?.compressed)) compressed")
                #expect(c.deflatedMessage(seconds: 30)?.text == #"{"t":"d","d":{"r":\#(request),"b":{"s":"ok","d":""}}}"#)
            }
            c.compressed(#"{"t":"d","d":{"r":4,"a":"g","b":{"p":"/big/a","q":{}}}}"#)
            let value = String(decoding: ClientZlib.hexText(count: 1_500_000, seed: 2), as: UTF8.self)
            #expect(c.deflatedMessage(seconds: 30)?.text == #"{"t":"d","d":{"r":4,"b":{"s":"ok","d":"\#(value)"}}}"#)
        }
    }

    @Test("permessage-deflate: a zip bomb (24 KB inflating past the 16 MiB limit) closes with 1009; the node goes on serving")
    func deflateZipBomb() throws {
        try withNode("rt-deflate-bomb") { port in
            let bomb = ClientZlib.compress([UInt8](repeating: UInt8(ascii: " "), count: 24 << 20), level: 9)
            #expect(bomb.count < 30_000)
            let c = try openCompressed(port)
            c.frame(opcode: 1, bomb, reserved: 0x40)
            #expect(c.closeCode() == 1009)
            #expect(c.waitClosed())
            // The same bomb in fragments.
            let d = try openCompressed(port)
            d.compressedBytes(bomb, fragments: 3)
            #expect(d.closeCode() == 1009)
            // Other connections, compressed or not, are served.
            let e = try openCompressed(port)
            e.compressed(#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/after","d":"still here"}}}"#)
            #expect(e.deflatedMessage()?.text == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":""}}}"#)
            let (f, _) = try open(port)
            f.text(#"{"t":"d","d":{"r":1,"a":"g","b":{"p":"/after","q":{}}}}"#)
            #expect(f.message() == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":"still here"}}}"#)
        }
    }

    @Test("frames the extension does not allow close with 1002: RSV1 without negotiation, on a continuation or a ping; RSV2; damaged data")
    func deflateProtocolErrors() throws {
        try withNode("rt-deflate-bad") { port in
            let put = Array(#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/x","d":1}}}"#.utf8)
            let packed = ClientZlib.compress(put)
            // Not negotiated: a compressed frame is a protocol error.
            let (plain, _) = try open(port)
            plain.frame(opcode: 1, packed, reserved: 0x40)
            #expect(plain.closeCode() == 1002)
            let cases: [(String, (Client) -> Void)] = [
                (
                    "RSV1 on a continuation",
                    { c in
                        c.frame(opcode: 1, Array(packed.prefix(5)), fin: false, reserved: 0x40)
                        c.frame(opcode: 0, Array(packed.dropFirst(5)), reserved: 0x40)
                    }
                ),
                ("a compressed ping", { $0.frame(opcode: 9, ClientZlib.compress(Array("ping".utf8)), reserved: 0x40) }),
                ("RSV2", { $0.frame(opcode: 1, put, reserved: 0x20) }),
                ("RSV3", { $0.frame(opcode: 1, packed, reserved: 0x50) }),
                ("damaged data", { $0.frame(opcode: 1, [0xFF, 0xFE, 0xFD, 0xFC, 0xFB], reserved: 0x40) }),
            ]
            for (name, send) in cases {
                let c = try openCompressed(port)
                send(c)
                #expect(c.closeCode() == 1002, "\(name)")
                #expect(c.waitClosed(), "\(name)")
            }
            // Nothing was written by any of them; the node serves.
            let (after, _) = try open(port)
            after.text(#"{"t":"d","d":{"r":1,"a":"g","b":{"p":"/x","q":{}}}}"#)
            #expect(after.message() == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":null}}}"#)
        }
    }
}

extension RealtimeServerTests.Client {
    /// One message compressed as a client sends it: RSV1 on its first frame, cut in `fragments`.
    func compressed(_ text: String, fragments: Int = 1) {
        compressedBytes(ClientZlib.compress(Array(text.utf8)), fragments: fragments)
    }

    /// Compressed bytes as one message (RSV1 on the first of its `fragments` frames only).
    func compressedBytes(_ packed: [UInt8], fragments: Int = 1) {
        let size = max(1, (packed.count + fragments - 1) / fragments)
        var start = 0
        repeat {
            let end = min(packed.count, start + size)
            frame(opcode: start == 0 ? 1 : 0, Array(packed[start..<end]), fin: end == packed.count, reserved: start == 0 ? 0x40 : 0)
            start = end
        } while start < packed.count
    }

    /// One protocol message as the SDKs split it (a count, then 16,384-byte chunks), each chunk
    /// a compressed WebSocket message of its own.
    func compressedChunks(_ text: String) {
        let bytes = Array(text.utf8)
        let chunks = stride(from: 0, to: bytes.count, by: 16_384).map { Array(bytes[$0..<min(bytes.count, $0 + 16_384)]) }
        frame(opcode: 1, Array(String(chunks.count).utf8))
        for chunk in chunks { frame(opcode: 1, ClientZlib.compress(chunk), reserved: 0x40) }
    }

    /// The next frame, inflated when it came compressed (RSV1).
    func nextInflated(seconds: Double = 10) -> (opcode: UInt8, payload: [UInt8], compressed: Bool)? {
        guard let f = next(seconds: seconds) else { return nil }
        guard lastReservedBits & 0x40 != 0 else { return (f.opcode, f.payload, false) }
        return (f.opcode, ClientZlib.inflate(f.payload) ?? Array("<damaged>".utf8), true)
    }

    /// The next text message (counted frames reassembled, compressed ones inflated), with how many
    /// frames it took and how many of them came compressed.
    func deflatedMessage(seconds: Double = 10) -> (text: String, frames: Int, compressed: Int)? {
        guard let first = nextInflated(seconds: seconds) else { return nil }
        let text = String(decoding: first.payload, as: UTF8.self)
        var compressed = first.compressed ? 1 : 0
        guard first.opcode == 1 else { return ("<opcode \(first.opcode)>" + text, 1, compressed) }
        guard let count = Int(text), text.count <= 6 else { return (text, 1, compressed) }
        var whole: [UInt8] = []
        for _ in 0..<count {
            guard let f = nextInflated(seconds: seconds) else { break }
            whole += f.payload
            if f.compressed { compressed += 1 }
        }
        return (String(decoding: whole, as: UTF8.self), count + 1, compressed)
    }

    /// Messages until one contains `marker` (inclusive), in order.
    func deflatedMessages(until marker: String, seconds: Double = 10) -> [String] {
        var out: [String] = []
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline, let m = deflatedMessage(seconds: deadline.timeIntervalSinceNow) {
            out.append(m.text)
            if m.text.contains(marker) { break }
        }
        return out
    }

    /// Reads until the server's close frame; its code.
    func closeCode(seconds: Double = 10) -> Int? {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline, let f = next(seconds: deadline.timeIntervalSinceNow) {
            if f.opcode == 8 { return f.payload.count >= 2 ? Int(f.payload[0]) << 8 | Int(f.payload[1]) : nil }
        }
        return nil
    }
}
