import BanyanBasics
import BanyanQuery
import BanyanTree
#if canImport(Glibc)
import Glibc
#endif

/// A deliberately naive reference for queries and events: sorts every child on every call and
/// diffs whole windows. Written independently of the indexed implementation (its own value
/// comparison), so the property tests compare two different derivations of Firebase's rules.
enum Reference {
    static func rank(_ n: Tree) -> Int {
        if n.isEmpty { return 0 }
        switch n.leaf {
        case .bool?: return 1
        case .int?, .double?: return 2
        case .string?: return 3
        case nil: return 4
        }
    }

    static func compareValues(_ a: Tree, _ b: Tree) -> Int {
        let ra = rank(a)
        let rb = rank(b)
        if ra != rb { return ra < rb ? -1 : 1 }
        switch (a.leaf, b.leaf) {
        case let (.bool(x)?, .bool(y)?): return x == y ? 0 : (!x ? -1 : 1)
        case let (x?, y?) where ra == 2:
            let dx = x.doubleValue ?? 0
            let dy = y.doubleValue ?? 0
            return dx < dy ? -1 : (dx > dy ? 1 : 0)
        case let (.string(x)?, .string(y)?):
            let ux = Array(x.utf16)
            let uy = Array(y.utf16)
            return ux.lexicographicallyPrecedes(uy) ? -1 : (uy.lexicographicallyPrecedes(ux) ? 1 : 0)
        default: return 0
        }
    }

    static func nameCompare(_ a: String, _ b: String) -> Int {
        func int32(_ s: String) -> Int64? {
            let chars = Array(s)
            guard (1...11).contains(chars.count) else { return nil }
            let digits = chars.first == "-" ? chars.dropFirst() : chars[...]
            guard (1...11).contains(digits.count), digits.allSatisfy({ $0.isASCII && $0.isNumber }), let v = Int64(s) else { return nil }
            return (Int64(Int32.min)...Int64(Int32.max)).contains(v) ? v : nil
        }
        switch (int32(a), int32(b)) {
        case let (x?, y?):
            if x != y { return x < y ? -1 : 1 }
            if a.utf8.count != b.utf8.count { return a.utf8.count < b.utf8.count ? -1 : 1 }
        case (.some, nil): return -1
        case (nil, .some): return 1
        default: break
        }
        let ua = Array(a.utf16)
        let ub = Array(b.utf16)
        return ua.lexicographicallyPrecedes(ub) ? -1 : (ub.lexicographicallyPrecedes(ua) ? 1 : 0)
    }

    static func indexValue(_ index: IndexKind, _ child: Tree) -> Tree {
        switch index {
        case .key: return .empty
        case .value: return child
        case .priority:
            switch child.priority {
            case .none: return .empty
            case .number(let d): return Tree(.double(d))
            case .string(let s): return Tree(.string(s))
            }
        case .child(let path, let priorityLeaf):
            var n = child
            for k in path.segments { n = n.child(k) }
            if priorityLeaf {
                switch n.priority {
                case .none: return .empty
                case .number(let d): return Tree(.double(d))
                case .string(let s): return Tree(.string(s))
                }
            }
            return n
        }
    }

    static func compareEntries(_ index: IndexKind, _ a: (String, Tree), _ b: (String, Tree)) -> Int {
        let c = compareValues(indexValue(index, a.1), indexValue(index, b.1))
        return c != 0 ? c : nameCompare(a.0, b.0)
    }

    static func comparePost(_ index: IndexKind, _ entry: (String, Tree), _ post: IndexPost) -> Int {
        let c = compareValues(indexValue(index, entry.1), post.value)
        if c != 0 { return c }
        switch post.name {
        case .min: return 1
        case .max: return -1
        case .key(let k): return nameCompare(entry.0, k.string)
        }
    }

    /// The window in query order.
    static func window(_ params: QueryParams, _ node: Tree) -> [(String, Tree)] {
        guard node.hasChildren else { return [] }
        var all = node.children.elements().map { ($0.key.string, $0.value) }
        all.sort { compareEntries(params.index, $0, $1) < 0 }
        var selected = all.filter { entry in
            if let start = params.start {
                let c = comparePost(params.index, entry, start.post)
                if start.inclusive ? c < 0 : c <= 0 { return false }
            }
            if let end = params.end {
                let c = comparePost(params.index, entry, end.post)
                if end.inclusive ? c > 0 : c >= 0 { return false }
            }
            return true
        }
        if let limit = params.limit {
            selected = params.anchor == .first ? Array(selected.prefix(limit)) : Array(selected.suffix(limit))
        }
        return selected
    }

    static func viewNode(_ params: QueryParams, _ node: Tree) -> Tree {
        if !node.hasChildren {
            return params.loadsAllData ? (params.isDefault ? node : node.withPriority(.none)) : .empty
        }
        if params.isDefault { return node }
        let children = window(params, node).map { (ChildKey(unchecked: $0.0), $0.1) }.sorted { nameCompare($0.0.string, $1.0.string) < 0 }
        return Tree(sortedChildren: children)
    }

    static func events(_ params: QueryParams, old: Tree, new: Tree) -> [ViewEvent] {
        let before = window(params, old)
        let after = window(params, new)
        // Keys compare by bytes: Swift's String equality would merge "é" and "e\u{301}".
        let beforeKeys = Set(before.map { Array($0.0.utf8) })
        let afterKeys = Set(after.map { Array($0.0.utf8) })
        func previous(_ key: String) -> ChildKey? {
            guard let i = after.firstIndex(where: { $0.0.utf8.elementsEqual(key.utf8) }), i > 0 else { return nil }
            return ChildKey(unchecked: after[i - 1].0)
        }
        let removed = before.filter { !afterKeys.contains(Array($0.0.utf8)) }
        let added = after.filter { !beforeKeys.contains(Array($0.0.utf8)) }
        var moved: [(String, Tree)] = []
        var changed: [(String, Tree)] = []
        for (key, newChild) in after where beforeKeys.contains(Array(key.utf8)) {
            guard let oldChild = before.first(where: { $0.0.utf8.elementsEqual(key.utf8) })?.1, oldChild != newChild else { continue }
            if params.index != .key, compareValues(indexValue(params.index, oldChild), indexValue(params.index, newChild)) != 0 {
                moved.append((key, newChild))
            }
            changed.append((key, newChild))
        }
        var events = removed.map { ViewEvent(.childRemoved, key: ChildKey(unchecked: $0.0), tree: $0.1) }
        events += added.map { ViewEvent(.childAdded, key: ChildKey(unchecked: $0.0), tree: $0.1, previousKey: previous($0.0)) }
        events += moved.sorted { compareEntries(params.index, $0, $1) < 0 }.map { ViewEvent(.childMoved, key: ChildKey(unchecked: $0.0), tree: $0.1, previousKey: previous($0.0)) }
        events += changed.map { ViewEvent(.childChanged, key: ChildKey(unchecked: $0.0), tree: $0.1, previousKey: previous($0.0)) }
        let oldView = viewNode(params, old)
        let newView = viewNode(params, new)
        if !events.isEmpty || oldView != newView {
            events.append(ViewEvent(.value, key: nil, tree: newView))
        }
        return events
    }
}

/// Random trees, values, query parameters and changes for the property tests.
struct Generator {
    var rng: SeededRandom
    let keyPool: [String]

    init(seed: UInt64) {
        rng = SeededRandom(seed: seed)
        keyPool = [
            "0", "1", "2", "7", "10", "-3", "007", "00000000007", "a", "b", "c", "ab", "z", "_", "é", "e\u{301}", "😀", "\u{FFFF}",
            "k1", "k2", "k3",
            // Longer than the 8-byte prefix, differing only after it, with high-BMP vs astral.
            "longkey-alpha", "longkey-alphb", "longkey-\u{FF21}", "longkey-😀", "longkey-\u{E000}x", "longkey-\u{10000}",
        ]
    }

    mutating func pick<T>(_ items: [T]) -> T { items[rng.below(items.count)] }

    mutating func key() -> ChildKey { ChildKey(unchecked: pick(keyPool)) }

    mutating func priority() -> Priority {
        switch rng.below(5) {
        case 0: return .number(Double(rng.below(4)))
        case 1: return .string(pick(["p", "q", "a"]))
        default: return .none
        }
    }

    mutating func leaf() -> Leaf {
        switch rng.below(9) {
        case 0: return .bool(rng.below(2) == 0)
        case 1: return .double(Double(rng.below(7)) / 2 - 1)
        case 2, 3: return .int(Int64(rng.below(7)) - 3)
        case 4:
            // Around 2^53, where distinct Int64s share a double.
            return pick([.int(9_007_199_254_740_992), .int(9_007_199_254_740_993), .double(9_007_199_254_740_992), .int(-9_007_199_254_740_993)])
        default:
            return .string(pick(["", "a", "b", "ab", "é", "Z", "10", "\u{FF21}", "😀", "\u{E000}", "\u{10000}", "string-longer-than-8-\u{FFFD}", "string-longer-than-8-😀"]))
        }
    }

    /// A child: a leaf or an object with an `a` (and maybe `a/b`) value, with a random priority.
    mutating func child() -> Tree {
        let base: Tree
        switch rng.below(4) {
        case 0: base = Tree(leaf())
        case 1:
            base = Tree.empty.setting(Tree(leaf()), at: Path(segments: [ChildKey(unchecked: "a")]))
        case 2:
            base = Tree.empty.setting(Tree(leaf()), at: Path(segments: [ChildKey(unchecked: "a"), ChildKey(unchecked: "b")]))
                .setting(Tree(leaf()), at: Path(segments: [ChildKey(unchecked: "x")]))
        default:
            base = Tree.empty.setting(Tree(leaf(), priority: priority()), at: Path(segments: [ChildKey(unchecked: "a")]))
        }
        return base.withPriority(priority())
    }

    mutating func location() -> Tree {
        var node = Tree.empty
        for _ in 0..<rng.below(14) { node.set(child(), at: Path(segments: [key()])) }
        if rng.below(10) == 0 { return Tree(leaf()) }
        return node.withPriority(priority())
    }

    mutating func index() -> IndexKind {
        switch rng.below(6) {
        case 0: return .priority
        case 1: return .key
        case 2: return .value
        case 3: return .child(Path(segments: [ChildKey(unchecked: "a")]))
        case 4: return .child(Path(segments: [ChildKey(unchecked: "a"), ChildKey(unchecked: "b")]))
        default: return .child(Path(segments: [ChildKey(unchecked: "a")]), priorityLeaf: true)
        }
    }

    mutating func post(_ index: IndexKind, defaultName: KeyBound) -> IndexPost {
        let name: KeyBound = rng.below(3) == 0 ? .key(key()) : (rng.below(2) == 0 ? defaultName : (defaultName == .min ? .max : .min))
        switch index {
        case .key: return IndexPost(value: .empty, name: .key(key()))
        case .priority:
            switch priority() {
            case .none: return IndexPost(value: .empty, name: name)
            case .number(let d): return IndexPost(value: Tree(.double(d)), name: name)
            case .string(let s): return IndexPost(value: Tree(.string(s)), name: name)
            }
        default:
            return IndexPost(value: rng.below(5) == 0 ? .empty : Tree(leaf()), name: name)
        }
    }

    mutating func params() -> QueryParams {
        var p = QueryParams()
        p.index = index()
        if rng.below(3) == 0 { p.start = .init(post: post(p.index, defaultName: .min), inclusive: rng.below(3) != 0) }
        if rng.below(3) == 0 { p.end = .init(post: post(p.index, defaultName: .max), inclusive: rng.below(3) != 0) }
        if rng.below(2) == 0 {
            p.limit = 1 + rng.below(5)
            p.anchor = rng.below(2) == 0 ? .first : .last
        }
        return p
    }

    /// A random change to `node`: the new node and the change description a tree would report.
    mutating func change(_ node: Tree) -> (Tree, ChildChanges) {
        var new = node
        switch rng.below(12) {
        case 0:
            return (location(), .all)
        case 1:
            let k = key()
            new.set(.empty, at: Path(segments: [k]))
            return (new, .keys([k]))
        case 2, 3:
            let k = key()
            let sub = pick([[ChildKey(unchecked: "a")], [ChildKey(unchecked: "a"), ChildKey(unchecked: "b")], [ChildKey(unchecked: "x")]])
            new.set(rng.below(5) == 0 ? .empty : Tree(leaf()), at: Path(segments: [k] + sub))
            return (new, .keys([k]))
        case 4:
            let k = key()
            let target = node.child(k)
            new.set(target.withPriority(priority()), at: Path(segments: [k]))
            return (new, .keys([k]))
        case 5, 6:
            var keys: [ChildKey] = []
            for _ in 0..<(1 + rng.below(5)) {
                let k = key()
                keys.append(k)
                new.set(rng.below(4) == 0 ? .empty : child(), at: Path(segments: [k]))
            }
            return (new, rng.below(3) == 0 ? .all : .keys(keys))
        case 7:
            return (node.withPriority(priority()), .all)
        default:
            let k = key()
            new.set(child(), at: Path(segments: [k]))
            return (new, rng.below(4) == 0 ? .all : .keys([k]))
        }
    }
}

func seeds(_ count: Int) -> [UInt64] {
    if let value = getenv("BANYAN_SEED"), let seed = UInt64(String(cString: value)) { return [seed] }
    return (1...UInt64(count)).map { $0 &* 0xD1B5_4A32_D192_ED03 }
}
