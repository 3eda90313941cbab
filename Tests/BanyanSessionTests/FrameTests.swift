import BanyanBasics
import BanyanSession
import Testing

/// The v5 framing (reference §1.3): count frames, keep-alives, chunk limits, bounds.
@Suite struct FrameAssemblerTests {
    static func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

    @Test("a frame that is not a count is one whole message; 0 is a keep-alive")
    func singleFramesAndKeepAlive() throws {
        var a = FrameAssembler()
        #expect(try a.receive(Self.bytes(#"{"t":"d","d":{"r":1,"a":"s","b":{}}}"#)) == .message(Self.bytes(#"{"t":"d","d":{"r":1,"a":"s","b":{}}}"#)))
        #expect(try a.receive(Self.bytes("0")) == .keepAlive)
        #expect(!a.isCollecting)
        // Seven digits, a sign or a space: not a count, so a (malformed) message for the caller.
        for text in ["1234567", "-1", "+2", " 2", "2 ", "1e3", ""] {
            #expect(try a.receive(Self.bytes(text)) == .message(Self.bytes(text)), "\(text)")
        }
    }

    @Test("a count announces that many frames, concatenated; digits inside a message are data")
    func countedMessages() throws {
        var a = FrameAssembler()
        #expect(try a.receive(Self.bytes("3")) == .partial)
        #expect(a.isCollecting)
        #expect(try a.receive(Self.bytes(#"{"a":"#)) == .partial)
        #expect(try a.receive(Self.bytes("0")) == .partial)  // data, not a keep-alive
        #expect(try a.receive(Self.bytes("}")) == .message(Self.bytes(#"{"a":0}"#)))
        #expect(!a.isCollecting)
        #expect(try a.receive(Self.bytes("000002")) == .partial)
        #expect(try a.receive(Self.bytes("12")) == .partial)
        #expect(try a.receive(Self.bytes("34")) == .message(Self.bytes("1234")))
    }

    @Test("bounds: an oversize frame, a count over the limit, a message growing past the limit; the assembler is idle after each")
    func bounds() throws {
        var a = FrameAssembler(limits: .init(maxFrameBytes: 8, maxMessageBytes: 10, maxFramesPerMessage: 3))
        #expect(throws: FrameAssembler.FrameError.frameTooLarge(bytes: 9, limit: 8)) { try a.receive(Array(repeating: 0x61, count: 9)) }
        #expect(throws: FrameAssembler.FrameError.tooManyFrames(count: 4, limit: 3)) { try a.receive(Self.bytes("4")) }
        #expect(!a.isCollecting)
        #expect(try a.receive(Self.bytes("3")) == .partial)
        #expect(try a.receive(Self.bytes("abcdef")) == .partial)
        #expect(throws: FrameAssembler.FrameError.messageTooLarge(limit: 10)) { try a.receive(Self.bytes("ghijk")) }
        #expect(!a.isCollecting)
        // An oversize frame in the middle of a message also ends it.
        #expect(try a.receive(Self.bytes("2")) == .partial)
        #expect(throws: FrameAssembler.FrameError.frameTooLarge(bytes: 9, limit: 8)) { try a.receive(Array(repeating: 0x61, count: 9)) }
        #expect(!a.isCollecting)
        #expect(try a.receive(Self.bytes("ok")) == .message(Self.bytes("ok")))
        // A single frame may not exceed the message limit either.
        var b = FrameAssembler(limits: .init(maxFrameBytes: 100, maxMessageBytes: 10, maxFramesPerMessage: 3))
        #expect(throws: FrameAssembler.FrameError.messageTooLarge(limit: 10)) { try b.receive(Array(repeating: 0x61, count: 11)) }
    }
}

@Suite struct FrameSplitterTests {
    /// Valid UTF-8 of `units` UTF-16 units built from a seeded mix of 1-, 2-, 3- and 4-byte scalars.
    static func text(units: Int, _ rng: inout SeededRandom) -> [UInt8] {
        let scalars: [String] = ["a", "{", "\"", "é", "ж", "€", "中", "😀", "𝄞"]
        var s = ""
        var n = 0
        while n < units {
            let c = scalars[rng.below(scalars.count)]
            let w = c.utf16.count
            if n + w > units { s += "a"; n += 1; continue }
            s += c
            n += w
        }
        return Array(s.utf8)
    }

    @Test("a message of at most 16,384 UTF-16 units is one frame, without a count")
    func singleFrame() {
        var rng = SeededRandom(seed: 1)
        for units in [1, 100, 16_384] {
            let m = Self.text(units: units, &rng)
            #expect(FrameSplitter.frames(m) == [m])
        }
    }

    @Test("longer messages: a count, then chunks of at most 16,384 units, each valid UTF-8, reassembling exactly")
    func chunks() throws {
        var rng = SeededRandom(seed: 2)
        for units in [16_385, 32_768, 32_769, 100_003] {
            let m = Self.text(units: units, &rng)
            let frames = FrameSplitter.frames(m)
            let count = try #require(Int(String(decoding: frames[0], as: UTF8.self)))
            #expect(count == frames.count - 1 && count >= 2 && count <= 9_999)
            #expect(frames[0] != Array("0".utf8))
            for chunk in frames.dropFirst() {
                #expect(String(validating: chunk, as: UTF8.self) != nil, "a chunk cut a scalar")
                #expect(String(decoding: chunk, as: UTF8.self).utf16.count <= 16_384)
                #expect(!chunk.isEmpty)
            }
            var a = FrameAssembler(limits: .init(maxFrameBytes: 1 << 20, maxMessageBytes: 8 << 20, maxFramesPerMessage: 10_000))
            var result: FrameAssembler.Received = .partial
            for f in frames { result = try a.receive(f) }
            #expect(result == .message(m))
        }
    }

    /// The same rule at a small scale (chunks of 16 units, at most 9 of them): a message too
    /// long for the maximum count gets larger chunks, never more of them (with the protocol's
    /// limits, 9,999 chunks of 16,384 units: iOS reads counts of four digits).
    @Test("a message too long for the maximum count of chunks gets larger chunks, never more of them")
    func growingChunks() throws {
        var rng = SeededRandom(seed: 3)
        for units in 145...400 {
            for m in [Self.text(units: units, &rng), Array(repeating: UInt8(ascii: "x"), count: units), Array(String(repeating: "😀", count: units / 2).utf8)] {
                let frames = FrameSplitter.frames(m, chunkUnits: 16, maxChunks: 9)
                let count = try #require(Int(String(decoding: frames[0], as: UTF8.self)))
                #expect(count == frames.count - 1 && count <= 9, "\(units) units: \(count) chunks")
                #expect(frames.dropFirst().reduce([], +) == m)
                for chunk in frames.dropFirst() { #expect(String(validating: chunk, as: UTF8.self) != nil) }
            }
        }
        // The protocol's own limits (reference §1.3).
        #expect(FrameSplitter.chunkUnits == 16_384 && FrameSplitter.maxChunks == 9_999)
    }
}
