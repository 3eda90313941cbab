import BanyanBasics
import BanyanTree
import Testing

/// Every children value carries its data bytes (`Tree.dataBytes`, the quota's measure), kept by
/// each write from the entries it changed: these tests hold every way a tree is built or changed
/// against a walk of the whole tree.
@Suite struct DataBytesTests {
    struct Generator {
        var random: SeededRandom
        mutating func below(_ n: Int) -> Int { Int(random.next() % UInt64(n)) }
        mutating func key() -> String { ["a", "b", "c", "dé", "e1", "10", "-3"][below(7)] }
        mutating func path(depth: Int? = nil) -> Path {
            let n = depth ?? below(4)
            return Path(segments: (0..<n).map { _ in ChildKey(unchecked: key()) })
        }
        mutating func json(depth: Int = 0) -> String {
            switch below(depth >= 3 ? 5 : 8) {
            case 0: return "null"
            case 1: return "true"
            case 2: return "\(below(1000))"
            case 3: return "2.5"
            case 4: return #""\#(String(repeating: "x", count: below(20)))é""#
            case 5: return #"{".value":"v","\#(".priority")":\#(below(2) == 0 ? "7" : #""p""#)}"#
            default:
                let n = 1 + below(4)
                let members = (0..<n).map { _ in #""\#(key())":\#(json(depth: depth + 1))"# }
                return "{" + members.joined(separator: ",") + "}"
            }
        }
        mutating func tree() -> Tree { (try? Tree(json: json())) ?? .empty }
    }

    static func check(_ tree: Tree, _ context: @autoclosure () -> String) {
        #expect(tree.dataBytesAreConsistent, "\(context())")
        #expect(tree.dataBytes == tree.walkedDataBytes, "\(context())")
    }

    @Test("sets, in-place replacements, priorities, multi-path updates, images and JSON reads keep the carried measure equal to a walk, over 8 × 400 random writes")
    func writesKeepTheMeasure() throws {
        var replaced = 0
        for seed in 1...8 as ClosedRange<UInt64> {
            var g = Generator(random: SeededRandom(seed: seed))
            var tree = Tree.empty
            for step in 0..<400 {
                switch g.below(7) {
                case 0, 1:
                    tree.set(g.tree(), at: g.path())
                case 2:
                    let target = g.path(depth: 1 + g.below(3))
                    let value = g.tree()
                    var copy = tree
                    if let old = copy.replaceEntry(value, at: target) {
                        replaced += 1
                        Self.check(copy, "seed \(seed) step \(step): replaceEntry")
                        copy.set(old, at: target)
                        #expect(copy == tree)
                        tree.set(value, at: target)
                    }
                case 3:
                    let priority: Priority = [.none, .number(3), .string("p")][g.below(3)]
                    tree.setPriority(priority, at: g.path())
                case 4:
                    var entries: [UpdateEntry] = []
                    var used = Set<String>()
                    for _ in 0..<(1 + g.below(4)) {
                        let k = g.key()
                        guard used.insert(k).inserted else { continue }
                        let rest = g.below(2) == 0 ? [k] : [k, g.key()]
                        entries.append(UpdateEntry(path: WritePath(path: Path(segments: rest.map { ChildKey(unchecked: $0) })), value: g.tree()))
                    }
                    try? tree.apply(update: entries, at: g.path(depth: g.below(2)))
                case 5:
                    tree = try TreeImage.read(TreeImage.bytes(tree))
                default:
                    tree = tree.withPriority(g.below(2) == 0 ? .none : .number(1))
                    if tree.isEmpty { tree = g.tree() }
                }
                Self.check(tree, "seed \(seed) step \(step)")
                // The carried measure of a subtree, read where it stands, equals its walk too.
                Self.check(tree.child(at: g.path(depth: 1)), "seed \(seed) step \(step), a child")
            }
        }
        #expect(replaced > 100, "replaceEntry applied \(replaced) times")
    }

    @Test("the measure of a large tree is read, not walked: a children value built from a map, from sorted children, from JSON and from an image carry the same figure")
    func buildersAgree() throws {
        var children: [(ChildKey, Tree)] = []
        for i in 0..<5_000 { children.append((ChildKey(unchecked: "k\(i)"), Tree(.string("value \(i)"), priority: i % 3 == 0 ? .number(Double(i)) : .none))) }
        children.sort { $0.0 < $1.0 }
        let sorted = Tree(sortedChildren: children, priority: .string("top"))
        let mapped = Tree(children: sorted.children, priority: .string("top"))
        let image = try TreeImage.read(TreeImage.bytes(sorted))
        let json = try Tree(json: JSONWriter.string(sorted, format: .export))
        let walked = sorted.walkedDataBytes
        for (label, tree) in [("sorted", sorted), ("map", mapped), ("image", image), ("json", json)] {
            #expect(tree.dataBytes == walked, "\(label)")
            #expect(tree.dataBytesAreConsistent, "\(label)")
        }
        // Removing every child one at a time brings the measure down to nothing.
        var shrinking = sorted
        for (key, _) in children { shrinking.set(.empty, at: Path(segments: [key])) }
        #expect(shrinking.isEmpty && shrinking.dataBytes == 0)
    }

    @Test("equal trees carry equal measures, so the measure may reject inequality first: integers and doubles of one value, strings by their UTF-8, priorities of either kind")
    func equalTreesMeasureAlike() throws {
        let pairs = [
            (#"{"a":5,"b":{"c":-0.0}}"#, #"{"a":5.0,"b":{"c":0}}"#),
            (#"{"a":{".value":1,".priority":2}}"#, #"{"a":{".value":1.0,".priority":2.0}}"#),
            (#"{"é":"naïve"}"#, #"{"é":"naïve"}"#),
        ]
        for (x, y) in pairs {
            let a = try Tree(json: x)
            let b = try Tree(json: y)
            #expect(a == b, "\(x) and \(y)")
            #expect(a.dataBytes == b.dataBytes, "\(x) and \(y)")
        }
        // Unequal with equal measures still compare unequal (the walk decides).
        #expect(try Tree(json: #"{"a":1}"#) != Tree(json: #"{"b":1}"#))
        #expect(try Tree(json: #"{"a":"xy"}"#) != Tree(json: #"{"a":"yx"}"#))
    }

    @Test("a children value is no larger than a leaf: carrying the measure does not grow a tree")
    func layout() {
        // The leaf case (a leaf and a priority) is the largest payload; a tag needs at most one
        // byte more. The children case (a map reference, a priority and an Int) fits under it.
        let leafPayload = MemoryLayout<(Leaf, Priority)>.size
        #expect(MemoryLayout<(ChildMap, Priority, Int)>.size <= leafPayload)
        #expect(MemoryLayout<Tree>.size <= leafPayload + 1, "Tree is \(MemoryLayout<Tree>.size) bytes, its leaf payload \(leafPayload)")
    }
}
