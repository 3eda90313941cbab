import Foundation
import BanyanBasics
import BanyanTree
import Testing

/// Property test: random inserts, replacements, removals and order-statistics queries on a
/// `SortedTree` agree with a sorted-array model, the balance invariants hold after every step, and
/// an earlier version shared before a write never changes. Seeds print on failure; set BANYAN_SEED
/// to replay one.
@Suite struct SortedTreeTests {
    @Test("agrees with a sorted-array model under random operations", arguments: seeds(20))
    func model(seed: UInt64) {
        var rng = SeededRandom(seed: seed)
        var tree = SortedTree<Int, Int>()
        var model: [(Int, Int)] = []
        for step in 0..<600 {
            let key = rng.below(300)
            let snapshot = tree
            let snapshotModel = model
            switch rng.below(4) {
            case 0, 1:
                let value = rng.below(1_000)
                tree.updateValue(value, forKey: key)
                if let i = model.firstIndex(where: { $0.0 == key }) {
                    model[i].1 = value
                } else {
                    model.append((key, value))
                    model.sort { $0.0 < $1.0 }
                }
            case 2:
                tree.removeValue(forKey: key)
                model.removeAll { $0.0 == key }
            default:
                tree.modifyValue(forKey: key) { $0 += 1 }
                if let i = model.firstIndex(where: { $0.0 == key }) { model[i].1 += 1 }
            }
            #expect(tree.checkInvariants() == nil, "seed \(seed) step \(step)")
            #expect(snapshot.elements().map(\.value) == snapshotModel.map(\.1), "seed \(seed): shared version changed")
            #expect(tree.count == model.count)
            #expect(tree.elements().map(\.key) == model.map(\.0), "seed \(seed) step \(step)")
            #expect(tree.elements().map(\.value) == model.map(\.1), "seed \(seed) step \(step)")
            let probe = rng.below(310)
            #expect(tree.rank(of: probe) == model.filter { $0.0 < probe }.count)
            #expect(tree.count { $0 <= probe } == model.filter { $0.0 <= probe }.count)
            if !model.isEmpty {
                let i = rng.below(model.count)
                #expect(tree.element(at: i).key == model[i].0)
                #expect(tree.index(of: model[i].0) == i)
                #expect(Array(tree.elements(from: i).map(\.key)) == model[i...].map(\.0))
            }
        }
    }

    @Test("growing past the array limit and draining back keeps order, counts and snapshots", arguments: seeds(10))
    func transitions(seed: UInt64) {
        var rng = SeededRandom(seed: seed)
        var tree = SortedTree<Int, Int>()
        var model: [Int] = []
        var keys = Array(0..<200)
        keys.shuffle(using: &rng)
        var snapshots: [(SortedTree<Int, Int>, [Int])] = []
        for (step, key) in keys.enumerated() {
            let position = tree.insertNew(key * 10, forKey: key)
            model.append(key)
            model.sort()
            #expect(position == model.firstIndex(of: key), "seed \(seed) insert position \(step)")
            if step % 25 == 0 { snapshots.append((tree, model)) }
            #expect(tree.checkInvariants() == nil, "seed \(seed) insert \(step)")
        }
        keys.shuffle(using: &rng)
        for (step, key) in keys.enumerated() {
            if step % 2 == 0 {
                #expect(tree.removeValue(forKey: key) == key * 10)
            } else {
                #expect(tree.removeReturningPosition(forKey: key) == model.firstIndex(of: key), "seed \(seed) remove position \(step)")
            }
            model.removeAll { $0 == key }
            if step % 25 == 0 { snapshots.append((tree, model)) }
            #expect(tree.checkInvariants() == nil, "seed \(seed) remove \(step)")
            #expect(tree.keys == model, "seed \(seed) remove \(step)")
            if !model.isEmpty {
                let i = rng.below(model.count)
                #expect(tree.element(at: i).key == model[i])
                #expect(tree.rank(of: model[i]) == i)
                #expect(tree.key(before: model[i]) == (i > 0 ? model[i - 1] : nil))
            }
        }
        #expect(tree.isEmpty)
        for (snapshot, expected) in snapshots {
            #expect(snapshot.keys == expected, "seed \(seed): a shared snapshot changed")
            #expect(snapshot.checkInvariants() == nil)
        }
    }

    @Test("bulk building is balanced")
    func build() {
        let tree = SortedTree<Int, Int>(sortedUniqueElements: (0..<10_000).map { ($0, $0) })
        #expect(tree.checkInvariants() == nil)
        #expect(tree.element(at: 4_321).key == 4_321)
    }
}

/// Seeds for randomised tests: BANYAN_SEED replays one seed; otherwise a fixed list.
func seeds(_ count: Int) -> [UInt64] {
    if let text = environmentValue("BANYAN_SEED"), let seed = UInt64(text) { return [seed] }
    return (1...UInt64(count)).map { $0 &* 0x9E37_79B9_7F4A_7C15 }
}

func environmentValue(_ name: String) -> String? {
    ProcessInfo.processInfo.environment[name]
}
