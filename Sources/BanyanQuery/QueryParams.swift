public import BanyanTree

/// A query's parameters: ordering, optional start and end points, and an optional anchored limit.
///
/// Built either through `Query` (the SDK calls, validated exactly as the Firebase JS SDK validates
/// them) or decoded from the wire's `q` object (`QueryParams(wire:)`).
public struct QueryParams: Sendable, Equatable {
    /// One end of the range: a post in index order and whether it is included.
    public struct Endpoint: Sendable, Equatable {
        public var post: IndexPost
        public var inclusive: Bool

        public init(post: IndexPost, inclusive: Bool) {
            self.post = post
            self.inclusive = inclusive
        }
    }

    public enum Anchor: Sendable, Equatable {
        /// limitToFirst: keep the first `limit` children of the range.
        case first
        /// limitToLast: keep the last `limit` children of the range.
        case last
    }

    public var index: IndexKind = .priority
    public var start: Endpoint?
    public var end: Endpoint?
    public var limit: Int?
    public var anchor: Anchor = .first

    public init() {}

    /// The default query (no ordering, range or limit): the plain location.
    public static let `default` = QueryParams()

    /// True when no range or limit filters children (an ordering alone loads all data).
    public var loadsAllData: Bool { start == nil && end == nil && limit == nil }

    /// True for the plain location (a default listen).
    public var isDefault: Bool { loadsAllData && index == .priority }
}

/// Why a query was rejected. `message` is the Firebase SDK's wording where one exists.
public struct QueryError: Error, Equatable, Sendable, CustomStringConvertible {
    /// What was wrong with the endpoints for the ordering (other SDKs word it their own way).
    public enum Kind: Equatable, Sendable {
        case other
        /// Ordering by key: a child key was given with the start (or end) value.
        case keyOrderingWithChildKey(start: Bool)
        /// Ordering by key: the start (or end) value is not a string.
        case keyOrderingWithNonString(start: Bool)
        /// Ordering by priority: a value is not a valid priority.
        case invalidPriority
    }
    public let message: String
    public let kind: Kind
    public init(_ message: String, kind: Kind = .other) {
        self.message = message
        self.kind = kind
    }
    public var description: String { message }
}

/// A query under construction, mirroring the SDK calls (`orderByChild`, `startAt`, `limitToFirst`,
/// ...). Every call validates the combination so far, as the Firebase JS SDK does, and throws
/// `QueryError` with Firebase's message.
public struct Query: Sendable, Equatable {
    public private(set) var params = QueryParams()
    private var orderByCalled = false
    private var startSet = false
    private var endSet = false
    /// An ordering was chosen (each query may choose one).
    public var isOrdered: Bool { orderByCalled }
    /// A start (startAt, startAfter, equalTo) was set.
    public var hasStart: Bool { startSet }
    /// An end (endAt, endBefore, equalTo) was set.
    public var hasEnd: Bool { endSet }

    public init() {}

    // MARK: Ordering

    public func orderByKey() throws(QueryError) -> Query {
        try ordered(.key, name: "orderByKey")
    }

    public func orderByValue() throws(QueryError) -> Query {
        try ordered(.value, name: "orderByValue")
    }

    public func orderByPriority() throws(QueryError) -> Query {
        try ordered(.priority, name: "orderByPriority")
    }

    public func orderByChild(_ path: String) throws(QueryError) -> Query {
        switch path {
        case "$key": throw QueryError("orderByChild: \"$key\" is invalid.  Use orderByKey() instead.")
        case "$priority": throw QueryError("orderByChild: \"$priority\" is invalid.  Use orderByPriority() instead.")
        case "$value": throw QueryError("orderByChild: \"$value\" is invalid.  Use orderByValue() instead.")
        default: break
        }
        let parsed: Path
        do {
            parsed = try Path(parsing: path)
        } catch {
            throw QueryError("orderByChild: was an invalid path = \"\(path)\". Paths must be non-empty strings and can't contain \".\", \"#\", \"$\", \"[\", or \"]\"")
        }
        guard !parsed.isRoot else { throw QueryError("orderByChild: cannot pass in empty path. Use orderByValue() instead.") }
        return try ordered(.child(parsed), name: "orderByChild")
    }

    private func ordered(_ index: IndexKind, name: String) throws(QueryError) -> Query {
        guard !orderByCalled else { throw QueryError("\(name): You can't combine multiple orderBy calls.") }
        var q = self
        q.orderByCalled = true
        q.params.index = index
        try q.validateEndpoints()
        return q
    }

    // MARK: Range

    public func startAt(_ value: Tree = .empty, key: String? = nil) throws(QueryError) -> Query {
        guard !startSet else { throw QueryError("startAt: Starting point was already set (by another call to startAt, startAfter, or equalTo).") }
        return try settingStart(value, key: key, inclusive: true, function: "startAt")
    }

    public func startAfter(_ value: Tree = .empty, key: String? = nil) throws(QueryError) -> Query {
        guard !startSet else { throw QueryError("startAfter: Starting point was already set (by another call to startAt, startAfter, or equalTo).") }
        return try settingStart(value, key: key, inclusive: false, function: "startAfter")
    }

    public func endAt(_ value: Tree = .empty, key: String? = nil) throws(QueryError) -> Query {
        guard !endSet else { throw QueryError("endAt: Ending point was already set (by another call to endAt, endBefore, or equalTo).") }
        return try settingEnd(value, key: key, inclusive: true, function: "endAt")
    }

    public func endBefore(_ value: Tree = .empty, key: String? = nil) throws(QueryError) -> Query {
        guard !endSet else { throw QueryError("endBefore: Ending point was already set (by another call to endAt, endBefore, or equalTo).") }
        return try settingEnd(value, key: key, inclusive: false, function: "endBefore")
    }

    public func equalTo(_ value: Tree = .empty, key: String? = nil) throws(QueryError) -> Query {
        guard !startSet else { throw QueryError("equalTo: Starting point was already set (by another call to startAt/startAfter or equalTo).") }
        guard !endSet else { throw QueryError("equalTo: Ending point was already set (by another call to endAt/endBefore or equalTo).") }
        let q = try settingStart(value, key: key, inclusive: true, function: "equalTo")
        return try q.settingEnd(value, key: key, inclusive: true, function: "equalTo")
    }

    private func checkedKey(_ key: String?, function: String) throws(QueryError) -> KeyBound? {
        guard let key else { return nil }
        if let problem = ChildKey.problem(with: key) {
            throw QueryError("\(function): Second argument was an invalid key = \"\(key)\".  Firebase keys must be non-empty strings and can't contain \".\", \"#\", \"$\", \"/\", \"[\", or \"]\" (\(problem)).")
        }
        return .key(ChildKey(unchecked: key))
    }

    private func checkedValue(_ value: Tree, function: String) throws(QueryError) {
        if case .double(let d)? = value.leaf, !d.isFinite {
            throw QueryError("\(function): First argument contains NaN or Infinity")
        }
    }

    private func settingStart(_ value: Tree, key: String?, inclusive: Bool, function: String) throws(QueryError) -> Query {
        try checkedValue(value, function: function)
        let name = try checkedKey(key, function: function)
        var q = self
        q.startSet = true
        q.startValue = value
        q.startName = name
        q.startInclusive = inclusive
        try q.rebuildEndpoints()
        try q.validateEndpoints()
        return q
    }

    private func settingEnd(_ value: Tree, key: String?, inclusive: Bool, function: String) throws(QueryError) -> Query {
        try checkedValue(value, function: function)
        let name = try checkedKey(key, function: function)
        var q = self
        q.endSet = true
        q.endValue = value
        q.endName = name
        q.endInclusive = inclusive
        try q.rebuildEndpoints()
        try q.validateEndpoints()
        return q
    }

    // Raw endpoint arguments, kept so that a later orderBy call re-derives the posts.
    private var startValue: Tree = .empty
    private var startName: KeyBound?
    private var startInclusive = true
    private var endValue: Tree = .empty
    private var endName: KeyBound?
    private var endInclusive = true

    /// Turns the raw arguments into posts for the current index (JS `getStartPost`/`getEndPost`).
    private mutating func rebuildEndpoints() throws(QueryError) {
        if startSet {
            params.start = QueryParams.Endpoint(
                post: Query.post(index: params.index, value: startValue, name: startName ?? (startInclusive || params.index == .key ? .min : .max)),
                inclusive: startInclusive)
        }
        if endSet {
            params.end = QueryParams.Endpoint(
                post: Query.post(index: params.index, value: endValue, name: endName ?? (endInclusive || params.index == .key ? .max : .min)),
                inclusive: endInclusive)
        }
    }

    static func post(index: IndexKind, value: Tree, name: KeyBound) -> IndexPost {
        switch index {
        case .key:
            if case .string(let s)? = value.leaf { return IndexPost(value: .empty, name: .key(ChildKey(unchecked: s))) }
            return IndexPost(value: .empty, name: name)
        case .priority:
            return IndexPost(value: Priority(tree: value)?.tree ?? value, name: name)
        case .value, .child:
            return IndexPost(value: value, name: name)
        }
    }

    private mutating func validateEndpoints() throws(QueryError) {
        try rebuildEndpoints()
        switch params.index {
        case .key:
            let tooMany = "Query: When ordering by key, you may only pass one argument to startAt(), endAt(), or equalTo()."
            let wrongType = "Query: When ordering by key, the argument passed to startAt(), startAfter(), endAt(), endBefore(), or equalTo() must be a string."
            if startSet {
                if startName != nil { throw QueryError(tooMany, kind: .keyOrderingWithChildKey(start: true)) }
                guard case .string? = startValue.leaf else { throw QueryError(wrongType, kind: .keyOrderingWithNonString(start: true)) }
            }
            if endSet {
                if endName != nil { throw QueryError(tooMany, kind: .keyOrderingWithChildKey(start: false)) }
                guard case .string? = endValue.leaf else { throw QueryError(wrongType, kind: .keyOrderingWithNonString(start: false)) }
            }
        case .priority:
            if (startSet && Priority(tree: startValue) == nil) || (endSet && Priority(tree: endValue) == nil) {
                throw QueryError(
                    "Query: When ordering by priority, the first argument passed to startAt(), startAfter() endAt(), endBefore(), or equalTo() must be a valid priority value (null, a number, or a string).",
                    kind: .invalidPriority)
            }
        case .value, .child:
            if (startSet && startValue.hasChildren) || (endSet && endValue.hasChildren) {
                throw QueryError("Query: First argument passed to startAt(), startAfter(), endAt(), endBefore(), or equalTo() cannot be an object.")
            }
        }
    }

    // MARK: Limits

    public func limitToFirst(_ limit: Int) throws(QueryError) -> Query {
        try limited(limit, anchor: .first, function: "limitToFirst")
    }

    public func limitToLast(_ limit: Int) throws(QueryError) -> Query {
        try limited(limit, anchor: .last, function: "limitToLast")
    }

    private func limited(_ limit: Int, anchor: QueryParams.Anchor, function: String) throws(QueryError) -> Query {
        guard limit > 0 else { throw QueryError("\(function): First argument must be a positive integer.") }
        guard params.limit == nil else {
            throw QueryError("\(function): Limit was already set (by another call to limitToFirst or limitToLast).")
        }
        var q = self
        q.params.limit = limit
        q.params.anchor = anchor
        return q
    }
}
