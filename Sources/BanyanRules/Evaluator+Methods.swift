import BanyanTree

/// Snapshot and string methods. Work proportional to the size of the data touched is charged to
/// the budget (path segments, listed keys, compared scalars, regex thread steps).
extension Judge {
    mutating func call(_ base: RuleValue, _ op: Operation, _ here: Here) throws(EvaluationFailure) -> RuleValue {
        switch base {
        case .snapshot(let snapshot): return try snapshotMethod(snapshot, op, here)
        case .string(let text): return try stringMethod(text, op, here)
        case .null: throw .error("cannot call \(program.strings[Int(op.b)])() on null")
        default: throw .error("a \(base.typeName) has no method \(program.strings[Int(op.b)])()")
        }
    }

    /// Argument `k` of a call (nil when it has fewer).
    func argument(_ op: Operation, _ k: Int) -> Int32? {
        k < Int(op.e) ? program.arguments[Int(op.d) + k] : nil
    }

    mutating func stringArgument(_ index: Int32, _ here: Here) throws(EvaluationFailure) -> String {
        let v = try value(index, here)
        guard case .string(let text) = v else { throw .error("expected a string argument, not a \(v.typeName)") }
        return text
    }

    /// A child path argument: a literal's path parsed when compiling (its evaluation still charged
    /// as one step), any other string parsed here.
    mutating func pathArgument(_ index: Int32, _ here: Here) throws(EvaluationFailure) -> Path {
        let op = program.ops[Int(index)]
        if op.path >= 0 {
            try charge()
            return program.literalPaths[Int(op.path)]
        }
        return try Judge.childPath(try stringArgument(index, here)).get()
    }

    /// For a chain of `data`, `newData` or `root` and `child()`s of literal paths: the node it names,
    /// its depth, and the steps evaluating it charges (one per operation, one per literal, the
    /// path segments of each `child()`); nil for any other expression. Such a chain cannot fail.
    func fusedNode(_ index: Int32, _ here: Here) -> (node: Tree, depth: Int, steps: Int)? {
        let op = program.ops[Int(index)]
        switch op.code {
        case .newData:
            guard let proposed else { return nil }
            return (here.held ? here.node : descend(proposed, location.count), location.count, 1)
        case .data: return (descend(current, location.count), location.count, 1)
        case .root: return (current, 0, 1)
        case .call:
            guard op.method == .child, op.e >= 1 else { return nil }
            let argument = program.ops[Int(program.arguments[Int(op.d)])]
            guard argument.code == .string, argument.path >= 0 else { return nil }
            let relative = program.literalPaths[Int(argument.path)]
            if here.held, program.ops[Int(op.a)].code == .newData {
                // `newData.child(...)` where the walk holds `newData`: no copy of it.
                let depth = location.count
                return (Judge.lookup(here.node, relative), depth + relative.count, 3 + depth + relative.count)
            }
            guard let base = fusedNode(op.a, here) else { return nil }
            return (Judge.lookup(base.node, relative), base.depth + relative.count, base.steps + 2 + base.depth + relative.count)
        default: return nil
        }
    }

    mutating func snapshotMethod(_ snap: Snapshot, _ op: Operation, _ here: Here) throws(EvaluationFailure) -> RuleValue {
        switch op.method {
        case .parent:
            guard snap.depth > 0 else { throw .error("the root has no parent") }
            try charge(snap.depth - 1)
            let prefix = snap.suffix.isEmpty ? snap.prefix - 1 : snap.prefix
            let suffix = snap.suffix.isEmpty ? [] : Array(snap.suffix.dropLast())
            var found = descend(snap.proposed ? (proposed ?? .empty) : current, prefix)
            for key in suffix { found = found.child(key) }
            return .snapshot(Snapshot(proposed: snap.proposed, node: found, prefix: prefix, suffix: suffix))
        case .child:
            guard let argument = argument(op, 0) else { throw .error("child() needs a path") }
            let relative = try pathArgument(argument, here)
            try charge(snap.depth + relative.count)
            // A literal's keys are shared, not copied, when nothing precedes them.
            let suffix = snap.suffix.isEmpty ? relative.segments : snap.suffix + relative.segments
            return .snapshot(Snapshot(proposed: snap.proposed, node: Judge.lookup(snap.node, relative), prefix: snap.prefix, suffix: suffix))
        default:
            return try nodeMethod(snap.node, depth: snap.depth, op, here)
        }
    }

    /// `node` at `relative` (one key, the usual case, without a walk over the path).
    static func lookup(_ node: Tree, _ relative: Path) -> Tree {
        if relative.count == 1, let key = relative.first { return node.child(key) }
        return node.child(at: relative)
    }

    /// The methods that read the node alone and charge nothing; nil for the others.
    static func read(_ node: Tree, _ method: Method) -> RuleValue? {
        switch method {
        case .val:
            if node.hasChildren { return .opaqueObject }
            return RuleValue(node.leaf)
        case .exists: return .bool(!node.isEmpty)
        case .isNumber:
            switch node.leaf {
            case .int?, .double?: return .bool(true)
            default: return .bool(false)
            }
        case .isString:
            if case .string? = node.leaf { return .bool(true) }
            return .bool(false)
        case .isBoolean:
            if case .bool? = node.leaf { return .bool(true) }
            return .bool(false)
        case .getPriority:
            switch node.priority {
            case .none: return .null
            case .number(let d): return .number(d)
            case .string(let t): return .string(t)
            }
        default: return nil
        }
    }

    /// The methods that read only the snapshot's node (and, for `hasChild`, its depth).
    mutating func nodeMethod(_ node: Tree, depth: Int, _ op: Operation, _ here: Here) throws(EvaluationFailure) -> RuleValue {
        if let value = Judge.read(node, op.method) { return value }
        switch op.method {
        case .hasChild:
            guard let argument = argument(op, 0) else { throw .error("hasChild() needs a path") }
            let relative = try pathArgument(argument, here)
            try charge(depth + relative.count)
            return .bool(!Judge.lookup(node, relative).isEmpty)
        case .hasChildren:
            guard let list = argument(op, 0) else { return .bool(node.hasChildren) }
            let items = program.ops[Int(list)]
            guard items.code == .array else { throw .error("hasChildren() takes a list of keys") }
            var all = true
            for k in 0..<Int(items.e) {
                let relative = try pathArgument(program.arguments[Int(items.d) + k], here)
                try charge(relative.count)
                if Judge.lookup(node, relative).isEmpty { all = false }
            }
            return .bool(all)
        default:
            throw .error("a snapshot has no method \(program.strings[Int(op.b)])()")
        }
    }

    /// The path a `child()` argument names, or the error that argument is.
    static func childPath(_ text: String) -> Result<Path, EvaluationFailure> {
        // The usual argument, one valid key ('c', 'i'): the path `Path(parsing:)` would make, without
        // splitting the text and copying it again.
        if !text.utf8.contains(UInt8(ascii: "/")), let key = ChildKey(validKey: text) { return .success(Path(segments: [key])) }
        guard let path = try? Path(parsing: text) else { return .failure(.error("invalid child path '\(ChildKey.printable(text))'")) }
        guard !path.isRoot else { return .failure(.error("a child path must not be empty")) }
        return .success(path)
    }

    mutating func stringMethod(_ text: String, _ op: Operation, _ here: Here) throws(EvaluationFailure) -> RuleValue {
        let name = op.method
        switch name {
        case .contains, .beginsWith, .endsWith:
            guard let argument = argument(op, 0) else { throw .error("\(program.strings[Int(op.b)])() needs an argument") }
            let needle = Array(try stringArgument(argument, here).unicodeScalars)
            let hay = Array(text.unicodeScalars)
            try charge((hay.count + needle.count) / 16)
            switch name {
            case .beginsWith: return .bool(hay.count >= needle.count && hay[..<needle.count].elementsEqual(needle))
            case .endsWith: return .bool(hay.count >= needle.count && hay[(hay.count - needle.count)...].elementsEqual(needle))
            default: return .bool(try find(needle, in: hay, from: 0) != nil)
            }
        case .replace:
            guard let first = argument(op, 0), let second = argument(op, 1), op.e == 2 else { throw .error("replace() needs two arguments") }
            let target = Array(try stringArgument(first, here).unicodeScalars)
            let replacement = try stringArgument(second, here)
            let hay = Array(text.unicodeScalars)
            guard !target.isEmpty else { return .string(text) }
            var out = String.UnicodeScalarView()
            var i = 0
            while let found = try find(target, in: hay, from: i) {
                out.append(contentsOf: hay[i..<found])
                out.append(contentsOf: replacement.unicodeScalars)
                try charge(replacement.utf8.count / 16 + 1)
                i = found + target.count
            }
            out.append(contentsOf: hay[i...])
            return .string(String(out))
        case .toLowerCase:
            try charge(text.utf8.count / 16)
            return .string(text.lowercased())
        case .toUpperCase:
            try charge(text.utf8.count / 16)
            return .string(text.uppercased())
        case .matches:
            guard let argument = argument(op, 0), program.ops[Int(argument)].code == .regex else {
                throw .error("matches() needs a regular expression")
            }
            let regex = program.regexes[Int(program.ops[Int(argument)].a)]
            guard let found = regex.firstMatch(in: text, steps: &steps, budget: budget) else { throw .budget }
            return .bool(found)
        default:
            throw .error("a string has no method \(program.strings[Int(op.b)])()")
        }
    }

    /// The first index at or after `start` where `needle` occurs in `hay` (naive search, every
    /// comparison charged, so a quadratic case runs out of budget instead of time).
    mutating func find(_ needle: [Unicode.Scalar], in hay: [Unicode.Scalar], from start: Int) throws(EvaluationFailure) -> Int? {
        guard needle.count <= hay.count - start else { return needle.isEmpty ? start : nil }
        if needle.isEmpty { return start }
        var i = start
        while i + needle.count <= hay.count {
            var k = 0
            while k < needle.count && hay[i + k] == needle[k] { k += 1 }
            try charge(k / 8 + 1)
            if k == needle.count { return i }
            i += 1
        }
        return nil
    }
}
