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
                let once = text.split(separator: separator, maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
                #expect(text.splitting(atByte: byte, maxSplits: 1, omittingEmpty: false).map(String.init) == once, "\(text) once at \(separator)")
            }
        }
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
