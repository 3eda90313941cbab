/// How server-value placeholders (`{".sv": ...}`) in written data are resolved.
///
/// `timestamp` is fixed once per write (the leader stamps it into the log entry, so every replica
/// resolves the same value). `existing` is the tree before the write; increments read the value at
/// their exact path in it.
public struct ServerValueContext: Sendable {
    public let timestamp: Int64
    public let existing: Tree
    /// Set by `TreeReader.readDeferred`: increments are recorded, not resolved (there is no
    /// `existing` tree yet), and their places hold the bare delta until `DeferredTree.resolved`.
    let defersIncrements: Bool

    public init(timestamp: Int64, existing: Tree = .empty) {
        self.timestamp = timestamp
        self.existing = existing
        self.defersIncrements = false
    }

    init(deferring timestamp: Int64) {
        self.timestamp = timestamp
        self.existing = .empty
        self.defersIncrements = true
    }
}

/// Written data read ahead of its write (off the thread that applies the log: docs/replica.md,
/// "Prepared entries"), with the server values that need the tree the write meets left open.
/// `resolved(existing:timestamp:)` finishes it into exactly the tree `TreeReader.read` would
/// have produced at that moment.
public struct DeferredTree: Sendable {
    /// The data with each increment's place holding its bare delta.
    public let tree: Tree
    let location: Path
    /// Increments, by their path below `location`, with their deltas (already checked to be numbers).
    let increments: [(relative: [ChildKey], delta: JSONValue)]
    /// Whether a `timestamp` server value was read (resolved with `timestamp`).
    let usesTimestamp: Bool
    let timestamp: Int64

    /// The tree `TreeReader.read(_:at:serverValues:)` would read with
    /// `ServerValueContext(timestamp:existing:)`; nil when the read used another timestamp than
    /// this one (read it again then).
    public func resolved(existing: Tree, timestamp now: Int64) -> Tree? {
        if usesTimestamp && now != timestamp { return nil }
        guard !increments.isEmpty else { return tree }
        var result = tree
        let base = existing.child(at: location)
        for (relative, delta) in increments {
            let path = Path(segments: relative)
            guard let leaf = ServerValueMath.increment(delta, over: base.child(at: path).leaf) else { return nil }
            if relative.isEmpty {
                result = Tree(leaf, priority: result.priority)
            } else {
                let old = result.child(at: path)
                result.set(Tree(leaf, priority: old.priority), at: path)
            }
        }
        return result
    }
}

/// The arithmetic of `{".sv": {"increment": n}}`, shared by reads and deferred reads.
enum ServerValueMath {
    /// The value an increment by `delta` leaves over `current`; nil when `delta` is not a number.
    static func increment(_ delta: JSONValue, over current: Leaf?) -> Leaf? {
        switch (delta, current) {
        case let (.int(delta), .int(base)?):
            let (sum, overflow) = base.addingReportingOverflow(delta)
            return overflow ? .double(Double(base) + Double(delta)) : .int(sum)
        case let (.int(delta), .double(base)?):
            return .double(base + Double(delta))
        case let (.double(delta), current):
            if let base = current?.doubleValue { return .double(base + delta) }
            return .double(delta)
        case let (.int(delta), _):
            return .int(delta)
        default:
            return nil
        }
    }
}

/// Limits applied while reading tree data from JSON.
public struct TreeReadLimits: Sendable {
    /// Maximum UTF-8 length of one string value (Firebase: 10 MiB).
    public var maxStringBytes: Int = 10 * 1024 * 1024
    /// Maximum input size in bytes (Firebase REST writes: 256 MB).
    public var maxBytes: Int = 256 * 1024 * 1024
    /// Maximum number of values (leaves and objects) in one input. One costs roughly 100 to 250
    /// bytes in memory, so the default bounds one input's tree to a few GB even when every byte
    /// is a tiny leaf.
    public var maxValues: Int = 10_000_000

    public init() {}
    public static let standard = TreeReadLimits()
    /// For loading the node's own snapshots: a tree the node could build from many small writes
    /// must load again, so only the structural limits (depth, key paths) apply.
    public static let snapshot: TreeReadLimits = {
        var limits = TreeReadLimits()
        limits.maxBytes = Int.max
        limits.maxValues = Int.max
        return limits
    }()
}

/// Reads Firebase tree data (plain JSON or the export format with `.priority` / `.value` / `.sv`)
/// straight into a `Tree`, validating as it goes: keys, depth (location depth plus data nesting at
/// most 32), key-path length (768 bytes), duplicate keys, numbers, priorities and metadata.
public enum TreeReader {
    /// Reads `bytes` as the value to be stored at `location`.
    ///
    /// - Parameter serverValues: how to resolve `.sv` placeholders; `nil` rejects them (plain data
    ///   such as imports and query files).
    public static func read(
        _ bytes: [UInt8], at location: Path = .root,
        serverValues: ServerValueContext? = nil, limits: TreeReadLimits = .standard
    ) throws(TreeError) -> Tree {
        try run(bytes, at: location, serverValues: serverValues, limits: limits) { subtree, _ in subtree }
    }

    /// Reads `bytes` as `read(_:at:serverValues:)` would with `timestamp`, but without the tree
    /// the write will meet: increments stay open in the result (docs/replica.md, "Prepared
    /// entries"). Every error `read` would throw for these bytes is thrown here too.
    public static func readDeferred(
        _ bytes: [UInt8], at location: Path, timestamp: Int64, limits: TreeReadLimits = .standard
    ) throws(TreeError) -> DeferredTree {
        try run(bytes, at: location, serverValues: ServerValueContext(deferring: timestamp), limits: limits) { subtree, state in
            DeferredTree(tree: subtree, location: location, increments: state.increments, usesTimestamp: state.usedTimestamp, timestamp: timestamp)
        }
    }

    /// One whole value from `bytes`, then `finish` with the reader's state.
    private static func run<R>(
        _ bytes: [UInt8], at location: Path, serverValues: ServerValueContext?, limits: TreeReadLimits,
        finish: (Tree, ReaderState) -> R
    ) throws(TreeError) -> R {
        if bytes.count > limits.maxBytes {
            throw TreeError(.inputTooLarge, path: location.description, "Input is \(bytes.count) bytes; the limit is \(limits.maxBytes)")
        }
        let result: Result<R, TreeError> = bytes.withUnsafeBufferPointer { buffer in
            var state = ReaderState(scanner: JSONScanner(bytes: buffer), location: location, serverValues: serverValues, limits: limits)
            do throws(TreeError) {
                let subtree = try state.readValue()
                try state.scanner.expectEnd()
                return .success(finish(subtree, state))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    public static func read(
        _ text: String, at location: Path = .root, serverValues: ServerValueContext? = nil,
        limits: TreeReadLimits = .standard
    ) throws(TreeError) -> Tree {
        try read(Array(text.utf8), at: location, serverValues: serverValues, limits: limits)
    }
}

extension Tree {
    /// Parses JSON tree data (export format accepted) with no server values allowed.
    public init(json: String) throws(TreeError) {
        self = try TreeReader.read(json)
    }
}

private struct ReaderState {
    var scanner: JSONScanner
    /// Keys from the root to the value being read.
    var keys: [ChildKey]
    /// UTF-8 length of `keys` joined by `/`.
    var pathBytes: Int
    let serverValues: ServerValueContext?
    let limits: TreeReadLimits
    var subtrees = 0
    /// Open objects and arrays, including metadata wrappers (a second guard on recursion depth).
    var nesting = 0
    /// Deferred reads: the increments left open (path below the location, delta).
    var increments: [(relative: [ChildKey], delta: JSONValue)] = []
    /// Whether a timestamp server value was resolved.
    var usedTimestamp = false
    /// Keys of the location (the start of `keys`).
    let locationDepth: Int

    init(scanner: JSONScanner, location: Path, serverValues: ServerValueContext?, limits: TreeReadLimits) {
        self.scanner = scanner
        self.keys = location.segments
        self.locationDepth = location.count
        self.pathBytes = location.byteCount
        self.serverValues = serverValues
        self.limits = limits
    }

    var pathText: String { "/" + keys.map(\.string).joined(separator: "/") }

    func fail(_ code: TreeError.Code, _ message: String, at offset: Int? = nil) -> TreeError {
        TreeError(code, path: pathText, message, offset: offset ?? scanner.position)
    }

    mutating func push(_ key: ChildKey) throws(TreeError) {
        let bytes = Int(key.length)
        let newBytes = keys.isEmpty ? bytes : pathBytes + 1 + bytes
        // Room for several levels at once: the first push copies the location's keys anyway.
        if keys.count == keys.capacity { keys.reserveCapacity(keys.count + 8) }
        keys.append(key)
        pathBytes = newBytes
        if keys.count > Path.maxDepth {
            throw fail(.depthExceeded, "Data is nested too deeply: location depth plus data depth exceeds \(Path.maxDepth)")
        }
        if newBytes > Path.maxBytes {
            throw fail(.pathTooLong, "Key path is \(newBytes) bytes of UTF-8; the limit is \(Path.maxBytes)")
        }
    }

    mutating func pop() {
        guard let key = keys.popLast() else { return }
        let bytes = Int(key.length)
        pathBytes = keys.isEmpty ? 0 : pathBytes - 1 - bytes
    }

    mutating func count() throws(TreeError) {
        subtrees += 1
        if subtrees > limits.maxValues { throw fail(.inputTooLarge, "Input has more than \(limits.maxValues) values") }
    }

    mutating func readValue() throws(TreeError) -> Tree {
        let b = try scanner.peek()
        switch b {
        case UInt8(ascii: "{"): return try readObject()
        case UInt8(ascii: "["): return try readArray()
        default:
            guard let leaf = try readPrimitive() else { return .empty }
            try count()
            return Tree(leaf)
        }
    }

    /// A primitive at the cursor: `nil` for null. Objects and arrays are an error here.
    mutating func readPrimitive() throws(TreeError) -> Leaf? {
        let b = try scanner.peek()
        switch b {
        case UInt8(ascii: "\""):
            do {
                return .string(try scanner.readString(maxBytes: limits.maxStringBytes))
            } catch {
                throw TreeError(error.code, path: pathText, error.message, offset: error.offset)
            }
        case UInt8(ascii: "t"), UInt8(ascii: "f"), UInt8(ascii: "n"):
            guard let flag = try wrap({ (s: inout JSONScanner) throws(TreeError) in try s.readKeyword() }) else { return nil }
            return .bool(flag)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            try wrap { (s: inout JSONScanner) throws(TreeError) in try s.rejectNonFinite() }
            switch try wrap({ (s: inout JSONScanner) throws(TreeError) in try s.readNumber() }) {
            case .int(let i): return .int(i)
            case .double(let d): return .double(d)
            }
        default:
            try wrap { (s: inout JSONScanner) throws(TreeError) in try s.rejectNonFinite() }
            throw fail(.invalidJSON, "Unexpected \(describe(b)), expecting a JSON value")
        }
    }

    /// Runs a scanner step, re-labelling its errors with the current path.
    mutating func wrap<R>(_ body: (inout JSONScanner) throws(TreeError) -> R) throws(TreeError) -> R {
        do {
            return try body(&scanner)
        } catch {
            throw TreeError(error.code, path: pathText, error.message, offset: error.offset)
        }
    }

    func describe(_ b: UInt8) -> String {
        if b == 0xEF && scanner.position == 0 { return "byte-order mark" }
        return b >= 0x20 && b < 0x7F ? "'\(Character(Unicode.Scalar(b)))'" : "byte 0x\(String(b, radix: 16))"
    }

    mutating func enter() throws(TreeError) {
        nesting += 1
        if nesting > Path.maxDepth + 1 {
            throw fail(.depthExceeded, "Data is nested too deeply: location depth plus data depth exceeds \(Path.maxDepth)")
        }
    }

    mutating func readArray() throws(TreeError) -> Tree {
        try enter()
        defer { nesting -= 1 }
        scanner.position += 1
        var children: [(ChildKey, Tree)] = []
        if try scanner.peek() == UInt8(ascii: "]") {
            scanner.position += 1
            return .empty
        }
        var index = 0
        while true {
            try push(ChildKey(unchecked: String(index)))
            let child = try readValue()
            pop()
            if !child.isEmpty { children.append((ChildKey(unchecked: String(index)), child)) }
            index += 1
            let sep = try scanner.peek()
            scanner.position += 1
            if sep == UInt8(ascii: "]") { break }
            guard sep == UInt8(ascii: ",") else {
                scanner.position -= 1
                throw fail(.invalidJSON, "Unexpected \(describe(sep)), expecting ',' or ']'")
            }
        }
        // Index keys are produced in numeric order, which is Firebase key order.
        guard !children.isEmpty else { return .empty }
        try count()
        return Tree(sortedChildren: children)
    }

    mutating func readObject() throws(TreeError) -> Tree {
        try enter()
        defer { nesting -= 1 }
        let objectStart = scanner.position
        scanner.position += 1
        var children: [(ChildKey, Tree)] = []
        // Keys whose value was null: kept only for the duplicate-key check.
        var nullKeys: [ChildKey] = []
        var allKeysInOrder = true
        var priority: Priority?
        var dotValue: Leaf??
        var serverValue: JSONValue?
        var realKeys = 0
        if try scanner.peek() == UInt8(ascii: "}") {
            scanner.position += 1
            return .empty
        }
        while true {
            let q = try scanner.peek()
            guard q == UInt8(ascii: "\"") else { throw fail(.invalidJSON, "Unexpected \(describe(q)), expecting a string key") }
            let keyOffset = scanner.position
            let keyText = try wrap { (s: inout JSONScanner) throws(TreeError) in try s.readString() }
            try wrap { (s: inout JSONScanner) throws(TreeError) in try s.expect(UInt8(ascii: ":")) }
            if keyText.utf8.first == UInt8(ascii: ".") {
                switch keyText {
                case ".priority":
                    guard priority == nil else { throw fail(.duplicateKey, "Duplicate key \".priority\" in object", at: keyOffset) }
                    priority = try readPriority()
                case ".value":
                    guard dotValue == nil else { throw fail(.duplicateKey, "Duplicate key \".value\" in object", at: keyOffset) }
                    if try scanner.peek() == UInt8(ascii: "{") {
                        // Only a server value may stand in for a primitive here; read it bounded
                        // (no recursion into tree data, so `.value` nesting cannot grow the stack).
                        let spec: JSONValue
                        do {
                            spec = try wrap { (s: inout JSONScanner) throws(TreeError) in try JSONValue.read(&s, depth: 0, maxDepth: 4) }
                        } catch where error.code == .depthExceeded {
                            throw fail(.invalidMetadata, "\".value\" must hold a primitive value or a server value", at: keyOffset)
                        }
                        guard case .object(let members) = spec, members.count == 1, let sv = spec[".sv"] else {
                            throw fail(.invalidMetadata, "\".value\" must hold a primitive value or a server value", at: keyOffset)
                        }
                        dotValue = .some(try resolve(sv, at: keyOffset))
                    } else {
                        dotValue = .some(try readPrimitive())
                    }
                case ".sv":
                    guard serverValue == nil else { throw fail(.duplicateKey, "Duplicate key \".sv\" in object", at: keyOffset) }
                    serverValue = try wrap { (s: inout JSONScanner) throws(TreeError) in try JSONValue.read(&s, depth: 0, maxDepth: 4) }
                default:
                    throw fail(.invalidKey, "Invalid key \"\(ChildKey.printable(keyText))\": keys can't contain \".\", \"#\", \"$\", \"/\", \"[\", or \"]\"", at: keyOffset)
                }
            } else {
                guard let key = ChildKey(validKey: keyText) else {
                    let problem = ChildKey.problem(with: keyText) ?? "invalid key"
                    throw fail(.invalidKey, "Invalid key \"\(ChildKey.printable(keyText))\": \(problem)", at: keyOffset)
                }
                try push(key)
                let child = try readValue()
                pop()
                if child.isEmpty {
                    nullKeys.append(key)
                } else {
                    if let previous = children.last?.0, allKeysInOrder, !(previous < key) { allKeysInOrder = false }
                    // One allocation for a small object instead of one per doubling.
                    if children.isEmpty { children.reserveCapacity(8) }
                    children.append((key, child))
                }
                realKeys += 1
            }
            let sep = try scanner.peek()
            scanner.position += 1
            if sep == UInt8(ascii: "}") { break }
            guard sep == UInt8(ascii: ",") else {
                scanner.position -= 1
                throw fail(.invalidJSON, "Unexpected \(describe(sep)), expecting ',' or '}'")
            }
        }

        if let spec = serverValue {
            guard realKeys == 0, dotValue == nil else {
                throw fail(.invalidMetadata, "An object with \".sv\" can't have other children", at: objectStart)
            }
            let leaf = try resolve(spec, at: objectStart)
            try count()
            return Tree(leaf, priority: priority ?? .none)
        }
        if let value = dotValue {
            guard realKeys == 0 else {
                throw fail(.invalidMetadata, "Data contains a \".value\" child as well as other children", at: objectStart)
            }
            guard let leaf = value else { return .empty }
            try count()
            return Tree(leaf, priority: priority ?? .none)
        }
        if !allKeysInOrder {
            children.sort { $0.0 < $1.0 }
        }
        // Sorted input with strictly increasing keys has no duplicates; otherwise look for them.
        if !allKeysInOrder || !nullKeys.isEmpty {
            var all = children.map(\.0) + nullKeys
            if !nullKeys.isEmpty { all.sort() }
            for i in all.indices.dropFirst() where all[i - 1] == all[i] {
                keys.append(all[i])  // the error names the duplicated child's path
                throw fail(.duplicateKey, "Duplicate key \"\(ChildKey.printable(all[i].string))\" in object", at: objectStart)
            }
        }
        let subtree = Tree(sortedChildren: children, priority: priority ?? .none)
        if !subtree.isEmpty { try count() }
        return subtree
    }

    mutating func readPriority() throws(TreeError) -> Priority {
        let offset = scanner.position
        if try scanner.peek() == UInt8(ascii: "{") {
            let spec = try wrap { (s: inout JSONScanner) throws(TreeError) in try JSONValue.read(&s, depth: 0, maxDepth: 4) }
            guard let sv = spec[".sv"], case .object(let members) = spec, members.count == 1 else {
                throw fail(.invalidPriority, "A priority must be null, a number, a string or a server value", at: offset)
            }
            guard case .string("timestamp") = sv else {
                throw fail(.invalidPriority, "Only {\".sv\":\"timestamp\"} is allowed as a server-value priority", at: offset)
            }
            guard let context = serverValues else {
                throw fail(.invalidServerValue, "Server values are only allowed in writes", at: offset)
            }
            usedTimestamp = true
            return .number(Double(context.timestamp))
        }
        switch try readPrimitive() {
        case nil: return .none
        case .int(let i)?: return .number(Double(i))
        case .double(let d)?: return .number(d)
        case .string(let s)?: return .string(s)
        case .bool?: throw fail(.invalidPriority, "A priority must be null, a number or a string, not a boolean", at: offset)
        }
    }

    mutating func resolve(_ spec: JSONValue, at offset: Int) throws(TreeError) -> Leaf {
        guard let context = serverValues else {
            throw fail(.invalidServerValue, "Server values are only allowed in writes", at: offset)
        }
        switch spec {
        case .string("timestamp"):
            usedTimestamp = true
            return .int(context.timestamp)
        case .object(let members) where members.count == 1 && members[0].0 == "increment":
            let delta = members[0].1
            switch delta {
            case .int, .double: return try increment(delta, context, at: offset)
            default: throw fail(.invalidServerValue, "The increment server value needs a number: {\".sv\":{\"increment\":n}}", at: offset)
            }
        default:
            throw fail(.invalidServerValue, "Unknown server value \(spec.jsonString.prefix(80))", at: offset)
        }
    }

    /// An increment by a numeric `delta`: resolved over the existing value at this exact path,
    /// or, in a deferred read, recorded and its place given the bare delta.
    mutating func increment(_ delta: JSONValue, _ context: ServerValueContext, at offset: Int) throws(TreeError) -> Leaf {
        if context.defersIncrements {
            increments.append((Array(keys[locationDepth...]), delta))
            return ServerValueMath.increment(delta, over: nil) ?? .int(0)
        }
        // The value this increment replaces, looked up only here: most writes have no
        // increment, so the reader does not track the existing tree as it goes.
        var subtree = context.existing
        for key in keys { subtree = subtree.child(key) }
        guard let leaf = ServerValueMath.increment(delta, over: subtree.leaf) else {
            throw fail(.invalidServerValue, "The increment server value needs a number: {\".sv\":{\"increment\":n}}", at: offset)
        }
        return leaf
    }
}
