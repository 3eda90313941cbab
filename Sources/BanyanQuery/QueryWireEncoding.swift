public import BanyanTree

extension QueryParams {
    /// The WebSocket protocol's query object for these parameters, as the Firebase JS SDK sends
    /// it (`i` absent for priority order; `sin`/`ein` only when a bound is exclusive; `l` with
    /// `vf`), or nil for the default query (a plain listen carries no `q`). The inverse of
    /// `init(wire:)`: decoding it gives these parameters back.
    public var wireObject: JSONValue? {
        guard !isDefault else { return nil }
        var members: [(String, JSONValue)] = []
        switch index {
        case .priority: break
        case .key: members.append(("i", .string(".key")))
        case .value: members.append(("i", .string(".value")))
        case .child(let path, let priorityLeaf):
            let text = path.segments.map(\.string).joined(separator: "/")
            members.append(("i", .string(priorityLeaf ? (text.isEmpty ? ".priority" : text + "/.priority") : text)))
        }
        func endpoint(_ e: Endpoint, value: String, name: String, flag: String, defaultName: KeyBound) {
            if case .key = index {
                if case .key(let k) = e.post.name { members.append((value, .string(k.string))) } else { members.append((value, .null)) }
            } else {
                members.append((value, QueryParams.wireValue(e.post.value)))
                if e.post.name != defaultName { members.append((name, .string(e.post.name.description))) }
            }
            if !e.inclusive { members.append((flag, .bool(false))) }
        }
        if let start { endpoint(start, value: "sp", name: "sn", flag: "sin", defaultName: .min) }
        if let end { endpoint(end, value: "ep", name: "en", flag: "ein", defaultName: .max) }
        if let limit {
            members.append(("l", .int(Int64(limit))))
            members.append(("vf", .string(anchor == .first ? "l" : "r")))
        }
        return .object(members)
    }

    /// A stable identity for the parameters: the query object with its keys sorted, or
    /// `"default"` (as the JS SDK names queries).
    public var identifier: String {
        guard case .object(let members)? = wireObject else { return "default" }
        var out: [UInt8] = []
        JSONValue.object(members.sorted { $0.0 < $1.0 }).appendJSON(to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    static func wireValue(_ tree: Tree) -> JSONValue {
        switch tree.leaf {
        case .bool(let b)?: return .bool(b)
        case .int(let i)?: return .int(i)
        case .double(let d)?: return .double(d)
        case .string(let s)?: return .string(s)
        case nil: return .null
        }
    }
}
