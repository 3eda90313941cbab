import BanyanBasics
import BanyanTree
import Testing

private func randomNode(_ rng: inout SeededRandom, depth: Int) -> Node {
    func priority() -> Priority {
        switch rng.below(4) {
        case 0: return .number(Double(rng.below(100)) / 4)
        case 1: return .string(["p", "é", "😀", ""][rng.below(4)])
        default: return .none
        }
    }
    if depth > 3 || rng.below(3) == 0 {
        let leaf: Leaf
        switch rng.below(6) {
        case 0: leaf = .bool(rng.below(2) == 0)
        case 1: leaf = .int(Int64(bitPattern: rng.next()))
        case 2: leaf = .double(Double(rng.below(1_000_000)) / 7)
        default: leaf = .string(["", "text", "é\u{301}", "line\nbreak", "😀 astral", String(repeating: "x", count: 300)][rng.below(6)])
        }
        return Node(leaf, priority: priority())
    }
    var node = Node.empty
    for _ in 0..<(1 + rng.below(6)) {
        let key = ChildKey(unchecked: ["a", "b", "7", "007", "-1", "é", "😀", "long-key-\(rng.below(50))"][rng.below(8)])
        node.set(randomNode(&rng, depth: depth + 1), at: Path(segments: [key]))
    }
    return node.withPriority(node.isEmpty ? .none : priority())
}

@Suite struct TreeImageTests {
    @Test("random trees round-trip through the binary image exactly", arguments: seeds(30))
    func roundTrip(seed: UInt64) throws {
        var rng = SeededRandom(seed: seed)
        for _ in 0..<20 {
            let node = randomNode(&rng, depth: 0)
            let image = TreeImage.bytes(node)
            let back = try TreeImage.read(image)
            #expect(back == node, "seed \(seed)")
            #expect(JSONWriter.string(back, format: .export) == JSONWriter.string(node, format: .export))
            #expect(back.hashString == node.hashString)
        }
    }

    @Test("truncated or damaged images give typed errors, never a crash")
    func damaged() throws {
        var rng = SeededRandom(seed: 99)
        let node = randomNode(&rng, depth: 0).setting(Node(.string("x")), at: Path(segments: [ChildKey(unchecked: "z")]))
        let image = TreeImage.bytes(node)
        for cut in 0..<image.count {
            #expect(throws: TreeError.self, "cut at \(cut)") { try TreeImage.read(Array(image.prefix(cut))) }
        }
        for i in 0..<image.count {
            var bad = image
            bad[i] ^= 0xA5
            _ = try? TreeImage.read(bad)  // may decode to another valid tree; must not crash
        }
        // Hostile: a children node nested 100 deep, unsorted keys, invalid keys.
        var deep = TreeImage.magic
        for _ in 0..<100 { deep += [6, 1, 1, UInt8(ascii: "a")] }
        deep.append(1)
        #expect(throws: TreeError.self) { try TreeImage.read(deep) }
        let unsorted = TreeImage.magic + [6, 2, 1, UInt8(ascii: "b"), 2, 1, UInt8(ascii: "a"), 2]
        #expect(throws: TreeError.self) { try TreeImage.read(unsorted) }
        let badKey = TreeImage.magic + [6, 1, 1, UInt8(ascii: "."), 2]
        #expect(throws: TreeError.self) { try TreeImage.read(badKey) }
        let huge = TreeImage.magic + [5, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F]
        #expect(throws: TreeError.self) { try TreeImage.read(huge) }
    }

    @Test("streamed image equals the one-shot image")
    func streamed() throws {
        var rng = SeededRandom(seed: 5)
        var node = Node.empty
        for i in 0..<2_000 { node.set(randomNode(&rng, depth: 2), at: Path(segments: [ChildKey(unchecked: "k\(i)")])) }
        var chunks: [[UInt8]] = []
        try TreeImage.stream(node, chunkBytes: 8_192) { chunks.append($0) }
        #expect(chunks.count > 3)
        #expect(chunks.flatMap { $0 } == TreeImage.bytes(node))
    }

    @Test("-0.0 in an image reads back as 0.0, as JSON input does")
    func negativeZero() throws {
        let node = Node(.double(-0.0), priority: .number(-0.0))
        let back = try TreeImage.read(TreeImage.bytes(node))
        #expect(back.hashString == Node(.double(0), priority: .number(0)).hashString)
    }
}
