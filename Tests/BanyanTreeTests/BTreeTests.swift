import BanyanBasics
import BanyanTree
import Testing

/// A key whose search word is deliberately coarse (many keys share one word), so that searches
/// must break ties with full comparisons.
private struct CoarseKey: SortKey, CustomStringConvertible {
    let value: Int
    static func compare(_ a: CoarseKey, _ b: CoarseKey) -> Int { Int.compare(a.value, b.value) }
    static func < (a: CoarseKey, b: CoarseKey) -> Bool { a.value < b.value }
    var sortWord: UInt64 { UInt64(value / 37) }
    var description: String { String(value) }
}

/// Property tests for the page tree behind `SortedTree` at sizes that need several levels: random
/// inserts, removals, replacements, lookups, ranks, positional reads, ranges and predicate counts
/// agree with a sorted array; the page invariants hold; earlier versions never change.
@Suite struct BTreeTests {
    /// Runs `steps` random operations on keys below `keySpace` and checks everything against the
    /// model; `key` maps an integer to the key type under test.
    private func run<K: SortKey>(seed: UInt64, steps: Int, keySpace: Int, _ key: (Int) -> K, checkEvery: Int) {
        var rng = SeededRandom(seed: seed)
        var tree = SortedTree<K, Int>()
        var model: [(Int, Int)] = []  // sorted by key
        var snapshots: [(SortedTree<K, Int>, [(Int, Int)])] = []
        func modelIndex(_ k: Int) -> (Int, Bool) {
            var lo = 0
            var hi = model.count
            while lo < hi {
                let mid = (lo + hi) / 2
                if model[mid].0 < k { lo = mid + 1 } else { hi = mid }
            }
            return (lo, lo < model.count && model[lo].0 == k)
        }
        for step in 0..<steps {
            let k = rng.below(keySpace)
            let (i, present) = modelIndex(k)
            // Bias towards growth for the first half and shrinking for the second, so that both
            // splits and merges happen at every level.
            let growing = step < steps / 2
            switch rng.below(10) {
            case 0..<5 where growing, 0..<2:
                let value = rng.below(1_000_000)
                if present {
                    #expect(tree.updateValue(value, forKey: key(k)) == false)
                    model[i].1 = value
                } else {
                    let position = tree.insertNew(value, forKey: key(k))
                    #expect(position == i, "seed \(seed) step \(step): insert position")
                    model.insert((k, value), at: i)
                }
            case 2..<7:
                let position = tree.removeReturningPosition(forKey: key(k))
                #expect(position == (present ? i : nil), "seed \(seed) step \(step): remove position")
                if present { model.remove(at: i) }
            case 7:
                let removed = tree.removeValue(forKey: key(k))
                #expect(removed == (present ? model[i].1 : nil), "seed \(seed) step \(step): removed value")
                if present { model.remove(at: i) }
            default:
                let result = tree.modifyValue(forKey: key(k)) { value -> Int in
                    value += 1
                    return value
                }
                if present {
                    model[i].1 += 1
                    #expect(result == model[i].1)
                } else {
                    #expect(result == nil)
                }
            }
            if step % 97 == 0 { snapshots.append((tree, model)) }
            #expect(tree.count == model.count)
            let probe = rng.below(keySpace)
            let (rank, found) = modelIndex(probe)
            #expect(tree[key(probe)] == (found ? model[rank].1 : nil), "seed \(seed) step \(step): lookup")
            #expect(tree.rank(of: key(probe)) == rank, "seed \(seed) step \(step): rank")
            #expect(tree.index(of: key(probe)) == (found ? rank : nil))
            #expect(tree.count { $0 < key(probe) } == rank, "seed \(seed) step \(step): count(while:)")
            #expect(tree.key(before: key(probe)).map { K.compare($0, key(rank > 0 ? model[rank - 1].0 : 0)) == 0 } ?? (rank == 0) == true)
            if !model.isEmpty {
                let p = rng.below(model.count)
                let e = tree.element(at: p)
                #expect(K.compare(e.key, key(model[p].0)) == 0 && e.value == model[p].1, "seed \(seed) step \(step): element(at:)")
                let window = Array(tree.elements(from: p).prefix(40)).map(\.value)
                #expect(window == model[p...].prefix(40).map(\.1), "seed \(seed) step \(step): iteration from a position")
                #expect(tree.first?.value == model.first?.1 && tree.last?.value == model.last?.1)
            }
            if step % checkEvery == 0 || step == steps - 1 {
                #expect(tree.checkInvariants() == nil, "seed \(seed) step \(step): \(tree.checkInvariants() ?? "")")
                #expect(tree.elements().map(\.value) == model.map(\.1), "seed \(seed) step \(step): full iteration")
                var visited: [Int] = []
                tree.forEach { _, v in visited.append(v) }
                #expect(visited == model.map(\.1))
            }
        }
        for (snapshot, expected) in snapshots {
            #expect(snapshot.checkInvariants() == nil, "seed \(seed): snapshot invariants")
            #expect(snapshot.elements().map(\.value) == expected.map(\.1), "seed \(seed): a shared snapshot changed")
        }
    }

    @Test("several levels of pages agree with a sorted array", arguments: seeds(4))
    func deepTree(seed: UInt64) {
        run(seed: seed, steps: 6_000, keySpace: 4_000, { $0 }, checkEvery: 250)
    }

    @Test("coarse search words: ties are broken by full comparison", arguments: seeds(4))
    func tiedWords(seed: UInt64) {
        run(seed: seed, steps: 3_000, keySpace: 2_000, { CoarseKey(value: $0) }, checkEvery: 150)
    }

    @Test("bulk building at every size up to several levels keeps the invariants")
    func bulk() {
        for n in [0, 1, 2, 31, 32, 33, 64, 65, 500, 895, 896, 897, 1_023, 1_024, 1_025, 30_000] {
            let tree = SortedTree<Int, Int>(sortedUniqueElements: (0..<n).map { ($0 * 2, $0) })
            #expect(tree.checkInvariants() == nil, "n \(n): \(tree.checkInvariants() ?? "")")
            #expect(tree.count == n)
            #expect(tree.keys == (0..<n).map { $0 * 2 })
            if n > 0 {
                #expect(tree.rank(of: n) == (n + 1) / 2)
                #expect(tree.element(at: n - 1).key == 2 * (n - 1))
            }
        }
        #expect(SortedTree<Int, Int>(sortedUniqueElements: (0..<30_000).map { ($0, $0) }).depth == 4)
    }

    private struct Ran: Error {}

    @Test("building from a stream of elements: same map as from an array, and a stream that fails part-way releases what it built")
    func streamedBulk() throws {
        final class Counted {
            nonisolated(unsafe) static var live = 0
            init() { Counted.live += 1 }
            deinit { Counted.live -= 1 }
        }
        for n in [0, 1, 27, 28, 29, 32, 33, 56, 57, 500, 896, 897, 1_025, 30_000] {
            var i = 0
            let tree = SortedTree<Int, Int>(sortedCount: n) { () -> (Int, Int) in
                defer { i += 1 }
                return (i * 3, i)
            }
            #expect(tree.checkInvariants() == nil, "n \(n): \(tree.checkInvariants() ?? "")")
            #expect(tree.count == n)
            #expect(tree.keys == (0..<n).map { $0 * 3 })
            #expect(i == n)
            for failAt in [0, 1, n / 2, n - 1] where failAt >= 0 && failAt < n {
                var j = 0
                do {
                    _ = try SortedTree<Int, Counted>(sortedCount: n) { () throws(Ran) -> (Int, Counted) in
                        if j == failAt { throw Ran() }
                        defer { j += 1 }
                        return (j, Counted())
                    }
                    Issue.record("n \(n): the failing stream was not reported")
                } catch {}
                #expect(Counted.live == 0, "n \(n), failing at \(failAt): \(Counted.live) values leaked")
            }
        }
    }

    @Test("a shared tree is copied along the written path only; the original never changes", arguments: seeds(3))
    func persistence(seed: UInt64) {
        var rng = SeededRandom(seed: seed)
        var tree = SortedTree<Int, Int>(sortedUniqueElements: (0..<5_000).map { ($0, $0) })
        var versions: [(SortedTree<Int, Int>, Int, Int)] = []  // version, probe key, value
        for _ in 0..<400 {
            let k = rng.below(6_000)
            versions.append((tree, k, tree[k] ?? -1))
            switch rng.below(3) {
            case 0: tree.updateValue(-k, forKey: k)
            case 1: tree.removeValue(forKey: k)
            default: tree.modifyValue(forKey: k) { $0 += 1 }
            }
        }
        for (version, k, value) in versions {
            #expect((version[k] ?? -1) == value)
            #expect(version.checkInvariants() == nil)
        }
    }

    @Test("search words agree with key order: ChildKey", arguments: seeds(3))
    func childKeyWords(seed: UInt64) {
        var rng = SeededRandom(seed: seed)
        let pieces = ["", "0", "00", "-", "-0", "1", "9", "10", "2147483647", "-2147483648", "2147483648",
                      "a", "ab", "abcdefg", "abcdefgh", "abcdefghi", "item1234", "item12345", "é", "e\u{301}",
                      "\u{E000}", "\u{FFFF}", "😀", "\u{10FFFF}", "日本", "zz", "\u{7F}x", "~"]
        var keys: [ChildKey] = []
        for _ in 0..<600 {
            var text = ""
            for _ in 0..<(1 + rng.below(3)) { text += pieces[rng.below(pieces.count)] }
            if text.isEmpty { text = "x" }
            keys.append(ChildKey(unchecked: text))
        }
        for a in keys.prefix(200) {
            for b in keys {
                let c = ChildKey.compare(a, b)
                if a.sortWord < b.sortWord { #expect(c < 0, "\(a) vs \(b)") }
                if a.sortWord > b.sortWord { #expect(c > 0, "\(a) vs \(b)") }
            }
        }
    }

    @Test("string comparison is UTF-16 code unit order, in place or through the iterator", arguments: seeds(3))
    func utf16Order(seed: UInt64) {
        var rng = SeededRandom(seed: seed)
        let pieces = ["", "a", "ab", "z", "é", "\u{E000}", "\u{FFFF}", "😀", "\u{10FFFF}", "日", "\u{0}", "abcdefgh", "~"]
        var strings: [String] = []
        for _ in 0..<200 {
            var text = ""
            for _ in 0..<rng.below(5) { text += pieces[rng.below(pieces.count)] }
            strings.append(text)
        }
        for a in strings.prefix(60) {
            for b in strings {
                let expected = a.utf16.lexicographicallyPrecedes(b.utf16) ? -1 : (a.utf16.elementsEqual(b.utf16) ? 0 : 1)
                #expect(compareUTF16(a, b) == expected, "\(a.debugDescription) vs \(b.debugDescription)")
                // A long string (stored out of line) takes the same path as a small one.
                let longA = String(repeating: "x", count: 20) + a
                let longB = String(repeating: "x", count: 20) + b
                #expect(compareUTF16(longA, longB) == expected)
            }
        }
    }

    @Test("search words agree with index order: IndexEntry", arguments: seeds(3))
    func indexEntryWords(seed: UInt64) {
        var rng = SeededRandom(seed: seed)
        let values: [Tree] = [
            .empty, Tree(.bool(false)), Tree(.bool(true)), Tree(.int(0)), Tree(.double(-0.0)), Tree(.int(-1)),
            Tree(.int(Int64.max)), Tree(.int(Int64.min)), Tree(.double(1.5)), Tree(.double(-1e300)), Tree(.double(1e-300)),
            Tree(.int(9_007_199_254_740_993)), Tree(.double(9_007_199_254_740_992)), Tree(.string("")), Tree(.string("a")),
            Tree(.string("a\u{0}")), Tree(.string("abcdefghij")), Tree(.string("abcdefghik")), Tree(.string("\u{FFFF}")),
            Tree(.string("😀")), Tree(.string("é")), Tree(sortedChildren: [(ChildKey(unchecked: "x"), Tree(.int(1)))]),
        ]
        let keys = ["a", "b", "1", "2"].map { ChildKey(unchecked: $0) }
        var entries: [IndexEntry] = []
        for _ in 0..<300 { entries.append(IndexEntry(value: values[rng.below(values.count)], key: keys[rng.below(keys.count)])) }
        for a in entries {
            for b in entries {
                let c = IndexEntry.compare(a, b)
                if a.sortWord < b.sortWord { #expect(c < 0, "\(a) vs \(b)") }
                if a.sortWord > b.sortWord { #expect(c > 0, "\(a) vs \(b)") }
            }
        }
    }
}
