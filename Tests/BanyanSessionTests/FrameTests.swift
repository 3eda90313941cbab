import BanyanBasics
import BanyanSession
import Testing

extension String {
    /// Without leading and trailing ASCII white space (what `Number()` ignores).
    var trimmingSpaces: Substring {
        let space: (Character) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" }
        var s = Substring(self)
        while let c = s.first, space(c) { s.removeFirst() }
        while let c = s.last, space(c) { s.removeLast() }
        return s
    }
}

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

    @Test("a message over the limit, or announced in too many frames, is read to its end and dropped, keeping its prefix; the stream stays in step")
    func oversizeMessagesAreDropped() throws {
        var a = FrameAssembler(limits: .init(maxFrameBytes: 100, maxMessageBytes: 10, maxFramesPerMessage: 3))
        // Exactly at the limits: accepted.
        #expect(try a.receive(Array(repeating: 0x61, count: 10)) == .message(Array(repeating: 0x61, count: 10)))
        #expect(try a.receive(Self.bytes("3")) == .partial)
        #expect(try a.receive(Self.bytes("abcd")) == .partial)
        #expect(try a.receive(Self.bytes("efgh")) == .partial)
        #expect(try a.receive(Self.bytes("ij")) == .message(Self.bytes("abcdefghij")))
        // One byte over, across frames: the remaining frames (digits among them) are dropped.
        let head = Self.bytes(#"{"t":"d","d":{"r":7,"#)
        #expect(try a.receive(Self.bytes("3")) == .partial)
        #expect(try a.receive(head) == .partial)
        #expect(try a.receive(Self.bytes("42")) == .partial)
        // The prefix is the message's first bytes, whichever frames they came in.
        #expect(try a.receive(Self.bytes("0")) == .tooLarge(prefix: head + Self.bytes("420"), .bytes(limit: 10)))
        #expect(!a.isCollecting)
        #expect(try a.receive(Self.bytes("ok")) == .message(Self.bytes("ok")))
        // A single frame over the message limit.
        let big = Array(repeating: UInt8(ascii: "x"), count: 90)
        #expect(try a.receive(big) == .tooLarge(prefix: Array(big.prefix(FrameAssembler.prefixBytes)), .bytes(limit: 10)))
        // A count over the frame limit: all four frames read, then reported.
        #expect(try a.receive(Self.bytes("4")) == .partial)
        for _ in 0..<3 { #expect(try a.receive(Self.bytes("1")) == .partial) }
        #expect(try a.receive(Self.bytes("1")) == .tooLarge(prefix: Self.bytes("1111"), .frames(count: 4, limit: 3)))
        #expect(try a.receive(Self.bytes("0")) == .keepAlive)
        // The prefix is bounded whatever the dropped message's size.
        var b = FrameAssembler(limits: .init(maxFrameBytes: 1_000, maxMessageBytes: 100, maxFramesPerMessage: 10))
        #expect(try b.receive(Self.bytes("5")) == .partial)
        var last: FrameAssembler.Received = .partial
        for _ in 0..<5 { last = try b.receive(Array(repeating: 0x62, count: 90)) }
        #expect(last == .tooLarge(prefix: Array(repeating: 0x62, count: FrameAssembler.prefixBytes), .bytes(limit: 100)))
    }

    @Test("a frame over the frame limit is the one error, ending any message in progress")
    func oversizeFrame() throws {
        var a = FrameAssembler(limits: .init(maxFrameBytes: 8, maxMessageBytes: 100, maxFramesPerMessage: 3))
        #expect(try a.receive(Array(repeating: 0x61, count: 8)) == .message(Array(repeating: 0x61, count: 8)))
        #expect(throws: FrameAssembler.FrameError.frameTooLarge(bytes: 9, limit: 8)) { try a.receive(Array(repeating: 0x61, count: 9)) }
        #expect(try a.receive(Self.bytes("2")) == .partial)
        #expect(throws: FrameAssembler.FrameError.frameTooLarge(bytes: 9, limit: 8)) { try a.receive(Array(repeating: 0x61, count: 9)) }
        #expect(!a.isCollecting)
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

    /// What the JS client takes for a count frame (`extractFrameCount_`): at most 6 UTF-16 units
    /// that `Number()` accepts. Approximated for the texts tested here (digits, signs, a point,
    /// an exponent, hex, white space, the empty string).
    static func jsTakesForCount(_ frame: [UInt8]) -> Bool {
        let s = String(decoding: frame, as: UTF8.self)
        guard s.utf16.count <= 6 else { return false }
        let t = s.trimmingSpaces
        if t.isEmpty { return true }
        if t.hasPrefix("0x") || t.hasPrefix("0X") { return t.count > 2 && t.dropFirst(2).allSatisfy(\.isHexDigit) }
        return Double(t) != nil || t == "Infinity" || t == "+Infinity" || t == "-Infinity"
    }

    @Test("a message of at most 16,384 UTF-16 units is one frame, without a count; one of 6 bytes or fewer goes as 1 and itself, never a frame JS would take for a count")
    func singleFrame() {
        var rng = SeededRandom(seed: 1)
        for units in [7, 100, 16_384] {
            let m = Self.text(units: units, &rng)
            #expect(FrameSplitter.frames(m) == [m] || m.count <= 6)
        }
        for short in ["0", "", " ", "1e3", "0x1", "-1", "1.5", "{}", "{\"a\":1}"] {
            let frames = FrameSplitter.frames(Array(short.utf8))
            if short.utf8.count <= 6 {
                #expect(frames == [Array("1".utf8), Array(short.utf8)], "\(short)")
            }
            // The first frame is a count JS reads right, or not a count at all.
            if Self.jsTakesForCount(frames[0]) {
                #expect(Int(String(decoding: frames[0], as: UTF8.self)) == frames.count - 1, "\(short)")
            }
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
            #expect(!Self.jsTakesForCount(frames[0]) || Int(String(decoding: frames[0], as: UTF8.self)) == count)
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
        // 144 units fit 9 chunks of 16: no growth, every chunk at most 16 units.
        let fits = Array(repeating: UInt8(ascii: "y"), count: 144)
        let exact = FrameSplitter.frames(fits, chunkUnits: 16, maxChunks: 9)
        #expect(exact.count == 10 && exact.dropFirst().allSatisfy { $0.count == 16 })
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
