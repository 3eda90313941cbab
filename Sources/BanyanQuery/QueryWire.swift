public import BanyanTree

extension QueryParams {
    /// Decodes the WebSocket protocol's query object (`q`: `i`, `sp`, `sn`, `sin`, `ep`, `en`,
    /// `ein`, `l`, `vf`), accepting every variant the JS, Android and iOS SDKs send.
    public init(wire object: JSONValue) throws(QueryError) {
        guard case .object = object else { throw QueryError("Query object must be a JSON object") }
        self.init()
        switch object["i"] {
        case nil, .null?, .string(".priority")?:
            index = .priority
        case .string(".key")?:
            index = .key
        case .string(".value")?:
            index = .value
        case .string(let path)?:
            var pieces = path.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
            var priorityLeaf = false
            if pieces.last == ".priority" {
                priorityLeaf = true
                pieces.removeLast()
            }
            guard let parsed = try? Path(parsing: pieces.joined(separator: "/")), !(parsed.isRoot && !priorityLeaf) else {
                throw QueryError("Invalid query index \"\(path)\"")
            }
            index = .child(parsed, priorityLeaf: priorityLeaf)
        case .some:
            throw QueryError("Query index \"i\" must be a string")
        }
        if let sp = object["sp"] {
            start = Endpoint(
                post: try QueryParams.wirePost(index: index, value: sp, name: object["sn"], defaultName: .min),
                inclusive: try QueryParams.wireFlag(object["sin"], name: "sin"))
        }
        if let ep = object["ep"] {
            end = Endpoint(
                post: try QueryParams.wirePost(index: index, value: ep, name: object["en"], defaultName: .max),
                inclusive: try QueryParams.wireFlag(object["ein"], name: "ein"))
        }
        if let l = object["l"] {
            let value: Int64
            switch l {
            case .int(let i): value = i
            case .double(let d) where d >= 0 && d < 1e15 && Double(Int64(d)) == d: value = Int64(d)
            default: throw QueryError("Query limit \"l\" must be a non-negative integer")
            }
            guard value >= 0 else { throw QueryError("Query limit \"l\" must be a non-negative integer") }
            limit = Int(value)
            switch object["vf"] {
            case .string("r")?: anchor = .last
            case .string("l")?: anchor = .first
            case nil: anchor = start != nil ? .first : .last
            default: throw QueryError("Query anchor \"vf\" must be \"l\" or \"r\"")
            }
        }
    }

    static func wireFlag(_ value: JSONValue?, name: String) throws(QueryError) -> Bool {
        switch value {
        case nil, .null?: return true
        case .bool(let b)?: return b
        default: throw QueryError("Query flag \"\(name)\" must be a boolean")
        }
    }

    static func wirePost(index: IndexKind, value: JSONValue, name: JSONValue?, defaultName: KeyBound) throws(QueryError) -> IndexPost {
        let subtree: Tree
        switch value {
        case .null: subtree = .empty
        case .bool(let b): subtree = Tree(.bool(b))
        case .int(let i): subtree = Tree(.int(i))
        case .double(let d): subtree = Tree(.double(d))
        case .string(let s): subtree = Tree(.string(s))
        case .array, .object: throw QueryError("Query start and end values can't be objects")
        }
        let bound: KeyBound
        switch name {
        case nil, .null?: bound = defaultName
        case .string("[MIN_NAME]")?: bound = .min
        case .string("[MAX_NAME]")?: bound = .max
        case .string(let s)?: bound = .key(ChildKey(unchecked: s))
        default: throw QueryError("Query names \"sn\"/\"en\" must be strings")
        }
        switch index {
        case .key:
            guard case .string(let s) = value else { throw QueryError("When ordering by key, start and end values must be strings") }
            return IndexPost(value: .empty, name: .key(ChildKey(unchecked: s)))
        case .priority:
            guard let priority = Priority(tree: subtree) else { throw QueryError("When ordering by priority, start and end values must be null, numbers or strings") }
            return IndexPost(value: priority.tree, name: bound)
        case .value, .child:
            return IndexPost(value: subtree, name: bound)
        }
    }
}
