import BanyanTree

/// Snapshot and string methods. Work proportional to the size of the data touched is charged to
/// the budget (path segments, listed keys, compared scalars, regex thread steps).
extension Evaluator {
    mutating func call(_ base: RuleValue, _ name: String, _ arguments: [Expression], _ s: Scope) throws(EvaluationFailure) -> RuleValue {
        switch base {
        case .snapshot(let snapshot): return try snapshotMethod(snapshot, name, arguments, s)
        case .string(let text): return try stringMethod(text, name, arguments, s)
        case .null: throw .error("cannot call \(name)() on null")
        default: throw .error("a \(base.typeName) has no method \(name)()")
        }
    }

    mutating func stringArgument(_ e: Expression, _ s: Scope) throws(EvaluationFailure) -> String {
        let v = try value(e, s)
        guard case .string(let text) = v else { throw .error("expected a string argument, not a \(v.typeName)") }
        return text
    }

    mutating func snapshotMethod(_ snap: Snapshot, _ name: String, _ arguments: [Expression], _ s: Scope) throws(EvaluationFailure) -> RuleValue {
        let node = snap.node
        switch name {
        case "val":
            if node.hasChildren { return .opaqueObject }
            return RuleValue(node.leaf)
        case "exists": return .bool(!node.isEmpty)
        case "isNumber":
            switch node.leaf {
            case .int?, .double?: return .bool(true)
            default: return .bool(false)
            }
        case "isString":
            if case .string? = node.leaf { return .bool(true) }
            return .bool(false)
        case "isBoolean":
            if case .bool? = node.leaf { return .bool(true) }
            return .bool(false)
        case "getPriority":
            switch node.priority {
            case .none: return .null
            case .number(let d): return .number(d)
            case .string(let t): return .string(t)
            }
        case "parent":
            guard let parent = snap.path.parent else { throw .error("the root has no parent") }
            try charge(parent.count)
            return .snapshot(Snapshot(root: snap.root, path: parent))
        case "child", "hasChild":
            guard let argument = arguments.first else { throw .error("\(name)() needs a path") }
            let relative = try childPath(try stringArgument(argument, s))
            try charge(snap.path.count + relative.count)
            let child = Snapshot(root: snap.root, path: snap.path.appending(relative), node: node.child(at: relative))
            return name == "child" ? .snapshot(child) : .bool(!child.node.isEmpty)
        case "hasChildren":
            guard let list = arguments.first else { return .bool(node.hasChildren) }
            guard case .array(let items) = list.kind else { throw .error("hasChildren() takes a list of keys") }
            var all = true
            for item in items {
                let key = try stringArgument(item, s)
                let relative = try childPath(key)
                try charge(relative.count)
                if node.child(at: relative).isEmpty { all = false }
            }
            return .bool(all)
        default:
            throw .error("a snapshot has no method \(name)()")
        }
    }

    func childPath(_ text: String) throws(EvaluationFailure) -> Path {
        // The usual argument, one valid key ('c', 'i'): the path `Path(parsing:)` would make, without
        // splitting the text and copying it again.
        if !text.utf8.contains(UInt8(ascii: "/")), let key = ChildKey(validKey: text) { return Path(segments: [key]) }
        guard let path = try? Path(parsing: text) else { throw .error("invalid child path '\(ChildKey.printable(text))'") }
        guard !path.isRoot else { throw .error("a child path must not be empty") }
        return path
    }

    mutating func stringMethod(_ text: String, _ name: String, _ arguments: [Expression], _ s: Scope) throws(EvaluationFailure) -> RuleValue {
        switch name {
        case "contains", "beginsWith", "endsWith":
            guard let argument = arguments.first else { throw .error("\(name)() needs an argument") }
            let needle = Array(try stringArgument(argument, s).unicodeScalars)
            let hay = Array(text.unicodeScalars)
            try charge((hay.count + needle.count) / 16)
            switch name {
            case "beginsWith": return .bool(hay.count >= needle.count && hay[..<needle.count].elementsEqual(needle))
            case "endsWith": return .bool(hay.count >= needle.count && hay[(hay.count - needle.count)...].elementsEqual(needle))
            default: return .bool(try find(needle, in: hay, from: 0) != nil)
            }
        case "replace":
            guard arguments.count == 2 else { throw .error("replace() needs two arguments") }
            let target = Array(try stringArgument(arguments[0], s).unicodeScalars)
            let replacement = try stringArgument(arguments[1], s)
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
        case "toLowerCase":
            try charge(text.utf8.count / 16)
            return .string(text.lowercased())
        case "toUpperCase":
            try charge(text.utf8.count / 16)
            return .string(text.uppercased())
        case "matches":
            guard let argument = arguments.first, case .regex(let regex) = argument.kind else { throw .error("matches() needs a regular expression") }
            guard let found = regex.firstMatch(in: text, steps: &steps, budget: budget) else { throw .budget }
            return .bool(found)
        default:
            throw .error("a string has no method \(name)()")
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
