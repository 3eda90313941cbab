import BanyanBasics
import Testing

@Suite struct SeededRandomTests {
    @Test("the same seed replays the same sequence; different seeds differ")
    func replay() {
        var a = SeededRandom(seed: 42)
        var b = SeededRandom(seed: 42)
        var c = SeededRandom(seed: 43)
        let sa = (0..<100).map { _ in a.next() }
        let sb = (0..<100).map { _ in b.next() }
        let sc = (0..<100).map { _ in c.next() }
        #expect(sa == sb)
        #expect(sa != sc)
    }

    @Test("below(n) stays in range and covers every value")
    func bounded() {
        var r = SeededRandom(seed: 7)
        var seen = Set<Int>()
        for _ in 0..<10_000 {
            let v = r.below(10)
            #expect((0..<10).contains(v))
            seen.insert(v)
        }
        #expect(seen.count == 10)
    }
}
