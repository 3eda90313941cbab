import BanyanBasics
import Testing

@Suite struct ByteSplitTests {
    @Test("splitting at a byte agrees with the standard split on text without combining marks", arguments: [1, 2, 3] as [UInt64])
    func agreesWithSplit(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        let alphabet: [String] = ["a", "b", "/", "?", "=", "&", "é", "日", "🌳", "%2F"]
        for _ in 0..<2_000 {
            let text = (0..<random.below(12)).map { _ in alphabet[random.below(alphabet.count)] }.joined()
            for separator in ["/", "?", "="] as [Character] {
                let byte = separator.asciiValue ?? 0
                for omitting in [true, false] {
                    let expected = text.split(separator: separator, omittingEmptySubsequences: omitting).map(String.init)
                    #expect(text.splitting(atByte: byte, omittingEmpty: omitting).map(String.init) == expected, "\(text) at \(separator)")
                }
                for maxSplits in [1, 2] {
                    for omitting in [true, false] {
                        let limited = text.split(separator: separator, maxSplits: maxSplits, omittingEmptySubsequences: omitting).map(String.init)
                        #expect(
                            text.splitting(atByte: byte, maxSplits: maxSplits, omittingEmpty: omitting).map(String.init) == limited,
                            "\(text) at most \(maxSplits) times at \(separator)")
                    }
                }
                // A substring that starts inside a larger string: pieces cut at the right offsets.
                let inner = ("x/" + text + "/y").dropFirst(2).dropLast(2)
                #expect(
                    inner.splitting(atByte: byte, omittingEmpty: false).map(String.init)
                        == text.split(separator: separator, omittingEmptySubsequences: false).map(String.init), "\(text) inside")
            }
        }
    }

    @Test("ranges over a buffer: offsets of the pieces, empty ones kept or left out")
    func bufferRanges() {
        Array("/ab//c/".utf8).withUnsafeBufferPointer { bytes in
            #expect(bytes.ranges(separatedBy: UInt8(ascii: "/"), omittingEmpty: true) == [1..<3, 5..<6])
            #expect(bytes.ranges(separatedBy: UInt8(ascii: "/"), omittingEmpty: false) == [0..<0, 1..<3, 4..<4, 5..<6, 7..<7])
            #expect(bytes.ranges(separatedBy: UInt8(ascii: "/"), maxSplits: 1, omittingEmpty: true) == [1..<3, 4..<7])
        }
        [UInt8]().withUnsafeBufferPointer { #expect($0.ranges(separatedBy: UInt8(ascii: "/"), omittingEmpty: false) == [0..<0]) }
    }

    @Test("a separator followed by a combining mark still separates (code-unit splitting, as Firebase does)")
    func combiningMarks() {
        let text = "a/\u{301}b/c"
        #expect(text.splitting(atByte: UInt8(ascii: "/"), omittingEmpty: true).map(String.init) == ["a", "\u{301}b", "c"])
        #expect(Substring("x?y?z").splitting(atByte: UInt8(ascii: "?"), maxSplits: 1, omittingEmpty: false) == ["x", "y?z"])
        #expect("".splitting(atByte: UInt8(ascii: "/"), omittingEmpty: false) == [""])
        #expect("".splitting(atByte: UInt8(ascii: "/"), omittingEmpty: true).isEmpty)
        #expect("//".splitting(atByte: UInt8(ascii: "/"), omittingEmpty: false) == ["", "", ""])
    }
}
