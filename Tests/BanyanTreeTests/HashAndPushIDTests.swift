import BanyanBasics
import BanyanTree
import Testing

@Suite struct HashTests {
    @Test("SHA-1 matches the FIPS 180 vectors")
    func sha1() {
        func hex(_ b: [UInt8]) -> String { b.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined() }
        #expect(hex(SHA1.hash(Array("abc".utf8))) == "a9993e364706816aba3e25717850c26c9cd0d89d")
        #expect(hex(SHA1.hash([])) == "da39a3ee5e6b4b0d3255bfef95601890afd80709")
        #expect(hex(SHA1.hash(Array("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8))) == "84983e441c3bd26ebaae4aa1f95129e5e54670f1")
        #expect(hex(SHA1.hash(Array(repeating: UInt8(ascii: "a"), count: 1_000_000))) == "34aa973cd4c4daa4f61eeb2bdbad27316534016f")
    }

    @Test("node hashes match the spec's vectors bit for bit", arguments: [
        ("null", ""),
        ("true", "E5z61QM0lN/U2WsOnusszCTkR8M="),
        ("false", "aSSNoqcS4oQwJ2xxH20rvpp3zP0="),
        ("\"hi\"", "jrODRP7VX0SYea22x77RsWRrgcQ="),
        ("\"\"", "Ki0Xy0V6morg0TO3Sxi/jwugYDQ="),
        ("5", "w28swksk9+tXf5jEdS9R5oSFAv8="),
        ("5.0", "w28swksk9+tXf5jEdS9R5oSFAv8="),
        ("0.1", "wtQjBi5TBE+ZcdekL6INiSeCSQI="),
        ("{\".value\":\"hi\",\".priority\":1}", "Xe7+tbnM6t2/19hT9pko7UKpR4c="),
        ("{\"a\":1,\"b\":\"x\"}", "jRI9dwRS9sb4SWm8uuoN7+xBk4g="),
        ("{\"a\":{\"x\":true},\"10\":1,\"9\":2}", "l3xMltNk1PCRrpmX6BHTdNupWto="),
        ("{\"a\":{\".value\":1,\".priority\":\"z\"},\"b\":{\".value\":2,\".priority\":5},\"c\":3}", "4gMtNj5TgaZMS3GkFYOyjjBrGQA="),
    ])
    func vectors(json: String, hash: String) throws {
        #expect(try Tree(json: json).hashString == hash)
    }
}

@Suite struct PushIDTests {
    @Test("the timestamp prefix encodes milliseconds in the push alphabet")
    func prefix() {
        var gen = PushIDGenerator(random: SeededRandom(seed: 1))
        let id = gen.next(now: 1_700_000_000_000)
        #expect(id.count == 20)
        #expect(id.hasPrefix("-NjEtLV-"))
        #expect(PushIDGenerator.timestamp(of: id) == 1_700_000_000_000)
    }

    @Test("ids are strictly increasing within a millisecond and across a clock step back")
    func monotonic() {
        var gen = PushIDGenerator(random: SeededRandom(seed: 9))
        var ids: [String] = []
        for i in 0..<5_000 {
            let now: Int64 = 1_700_000_000_000 + Int64(i / 100) - (i == 2_500 ? 50 : 0)
            ids.append(gen.next(now: now))
        }
        for (a, b) in zip(ids, ids.dropFirst()) {
            #expect(compareUTF16(a, b) < 0, "\(a) < \(b)")
            #expect(ChildKey(unchecked: a) < ChildKey(unchecked: b))
        }
        for id in ids { #expect(ChildKey.problem(with: id) == nil) }
    }

    @Test("times outside the 48-bit range are clamped, never trap")
    func clamped() {
        var gen = PushIDGenerator(random: SeededRandom(seed: 3))
        let low = gen.next(now: -5)
        #expect(low.hasPrefix("--------"))
        let high = gen.next(now: Int64.max)
        #expect(high.hasPrefix("zzzzzzzz"))
        #expect(compareUTF16(low, high) < 0)
    }

    @Test("the same seed and clock give the same ids")
    func deterministic() {
        var a = PushIDGenerator(random: SeededRandom(seed: 5))
        var b = PushIDGenerator(random: SeededRandom(seed: 5))
        #expect((0..<10).map { a.next(now: 1_000 + Int64($0)) } == (0..<10).map { b.next(now: 1_000 + Int64($0)) })
    }
}
