import BanyanBasics
import BanyanTree
import Testing

private func randomNode(_ rng: inout SeededRandom, depth: Int) -> Tree {
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
        return Tree(leaf, priority: priority())
    }
    var node = Tree.empty
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
        let node = randomNode(&rng, depth: 0).setting(Tree(.string("x")), at: Path(segments: [ChildKey(unchecked: "z")]))
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
        var node = Tree.empty
        for i in 0..<2_000 { node.set(randomNode(&rng, depth: 2), at: Path(segments: [ChildKey(unchecked: "k\(i)")])) }
        var chunks: [[UInt8]] = []
        try TreeImage.stream(node, chunkBytes: 8_192) { chunks.append($0) }
        #expect(chunks.count > 3)
        #expect(chunks.flatMap { $0 } == TreeImage.bytes(node))
    }

    /// Reads `image` through the streaming reader, handing out at most `step(call)` bytes per call.
    private func streamedRead(_ image: [UInt8], step: (Int) -> Int) throws -> Tree {
        var offset = 0
        var calls = 0
        return try TreeImage.read(maxLength: image.count) { buffer in
            calls += 1
            let n = Swift.min(buffer.count, step(calls), image.count - offset)
            for i in 0..<n { buffer[i] = image[offset + i] }
            offset += n
            return n
        }
    }

    @Test("the streaming reader gives what the in-memory reader gives, however the bytes arrive", arguments: seeds(10))
    func streamingRead(seed: UInt64) throws {
        var rng = SeededRandom(seed: seed)
        var node = Tree.empty
        // Wide maps (built straight into tree nodes), small ones, and a string longer than the
        // reader's first window.
        for i in 0..<(40 + rng.below(300)) { node.set(randomNode(&rng, depth: 1), at: Path(segments: [ChildKey(unchecked: "k\(i)")])) }
        node.set(Tree(.string(String(repeating: "long ", count: 60_000))), at: Path(segments: [ChildKey(unchecked: "big")]))
        let image = TreeImage.bytes(node)
        for steps in [{ (_: Int) in 1 }, { (_: Int) in 7 }, { (_: Int) in Int.max }, { (call: Int) in 1 + (call * 7_919) % 20_000 }] {
            let back = try streamedRead(image, step: steps)
            #expect(back == node, "seed \(seed)")
            #expect(back.hashString == node.hashString)
            #expect(back.children.checkInvariants() == nil)
            #expect(try TreeImage.read(image) == back)
        }
    }

    @Test("a streamed image that is cut, damaged or whose source fails gives an error, never a crash")
    func streamingDamage() throws {
        var rng = SeededRandom(seed: 7)
        var node = Tree.empty
        for i in 0..<60 { node.set(randomNode(&rng, depth: 2), at: Path(segments: [ChildKey(unchecked: "item\(i)")])) }
        let image = TreeImage.bytes(node)
        for cut in stride(from: 0, to: image.count, by: 37) {
            #expect(throws: TreeError.self, "cut at \(cut)") { try streamedRead(Array(image.prefix(cut)), step: { _ in 100 }) }
        }
        #expect(throws: TreeError.self) { try streamedRead(image + [0], step: { _ in 100 }) }
        for i in stride(from: 0, to: image.count, by: 11) {
            var bad = image
            bad[i] ^= 0x5A
            _ = try? streamedRead(bad, step: { _ in 64 })  // may decode to another valid tree; must not crash
        }
        // Keys out of order in a wide map (the one built without an array).
        var wide = TreeImage.magic + [6, 40]
        for i in (0..<40).reversed() { wide += [2, UInt8(ascii: "a") + UInt8(i / 10), UInt8(ascii: "0") + UInt8(i % 10), 2] }
        #expect(throws: TreeError.self) { try streamedRead(wide, step: { _ in 5 }) }
        #expect(throws: TreeError.self) { try TreeImage.read(wide) }
        // The source's own error comes out as it is.
        struct SourceFailed: Error {}
        var served = 0
        #expect(throws: SourceFailed.self) {
            try TreeImage.read { buffer in
                guard served < 100 else { throw SourceFailed() }
                let n = Swift.min(buffer.count, 10)
                for i in 0..<n { buffer[i] = image[served + i] }
                served += n
                return n
            }
        }
    }

    @Test("-0.0 in an image reads back as 0.0, as JSON input does")
    func negativeZero() throws {
        let node = Tree(.double(-0.0), priority: .number(-0.0))
        let back = try TreeImage.read(TreeImage.bytes(node))
        #expect(back.hashString == Tree(.double(0), priority: .number(0)).hashString)
    }
}
