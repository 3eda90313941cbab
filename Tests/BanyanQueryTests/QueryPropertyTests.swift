import BanyanBasics
import BanyanQuery
import BanyanTree
import Testing

/// Property tests: the indexed query evaluation and the incremental event generator agree with
/// the naive reference model over random trees, random query parameters and random sequences of
/// changes (child sets, deep sets below children, priority changes, multi-child merges, whole
/// replacements, leaf locations). Each failure names its seed; BANYAN_SEED=<n> replays it.
@Suite struct QueryPropertyTests {
    @Test("indexed evaluation equals the naive model", arguments: seeds(40))
    func evaluation(seed: UInt64) {
        var gen = Generator(seed: seed)
        for round in 0..<60 {
            let node = gen.location()
            let params = gen.params()
            let expected = Reference.window(params, node).map { Array($0.0.utf8) }
            let actual = params.orderedChildren(of: node).map { Array($0.key.string.utf8) }
            #expect(actual == expected, "seed \(seed) round \(round) params \(params) node \(node)")
            #expect(params.evaluate(node) == Reference.viewNode(params, node), "seed \(seed) round \(round)")
        }
    }

    @Test("incremental events equal the naive model", arguments: seeds(60))
    func events(seed: UInt64) {
        var gen = Generator(seed: seed)
        for round in 0..<8 {
            let params = gen.params()
            var node = gen.location()
            var view = QueryView(params: params, tree: node)
            let initial = view.initialEvents()
            let expectedInitial = Reference.window(params, node).enumerated().map { i, entry in
                ViewEvent(.childAdded, key: ChildKey(unchecked: entry.0), tree: entry.1,
                          previousKey: i == 0 ? nil : ChildKey(unchecked: Reference.window(params, node)[i - 1].0))
            } + [ViewEvent(.value, key: nil, tree: Reference.viewNode(params, node))]
            #expect(initial == expectedInitial, "seed \(seed) round \(round) initial")
            for step in 0..<40 {
                let (new, changes) = gen.change(node)
                let expected = Reference.events(params, old: node, new: new)
                let actual = view.apply(new, changes: changes)
                if actual != expected {
                    Issue.record("""
                        seed \(seed) round \(round) step \(step)
                        params: \(params)
                        old: \(node)
                        new: \(new)
                        expected: \(expected)
                        actual:   \(actual)
                        """)
                    return
                }
                #expect(view.viewTree == Reference.viewNode(params, new), "seed \(seed) round \(round) step \(step)")
                node = new
            }
        }
    }
}
