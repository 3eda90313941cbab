public import BanyanTree

/// The checks a node runs on a client write before proposing it, shared by REST and the realtime
/// protocol (docs/realtime.md, "one write validation"): the state machine checks again when the
/// write applies, but a write refused here never reaches the log. Every cost is bounded by the
/// body's size: values are delimited, not decoded, and read once each by the tree reader; the
/// overlap check of a multi-path update sorts its paths (O(n log n) in the number of keys).
public enum WriteValidation {
    /// Why a write is refused, for the protocol to put in its own words.
    public enum Problem: Error, Sendable, Equatable, CustomStringConvertible {
        /// The body is not JSON (or has a duplicate key).
        case invalidJSON(TreeError)
        /// A multi-path update's body is not an object.
        case notAnObject
        /// A multi-path update's key is not a valid relative path.
        case invalidKey(String, TreeError)
        /// Two paths of a multi-path update overlap (one is at or below the other).
        case overlappingPaths(Path, Path)
        /// A multi-path update has more paths than the node takes in one write
        /// (`http.max_update_keys`): each path is a tree write on every node, where it applies.
        case tooManyPaths(limit: Int)
        /// A value would not make a valid tree at its location (bad JSON inside it, depth, size,
        /// keys, server values…).
        case invalidValue(TreeError)

        public var description: String {
            switch self {
            case .invalidJSON(let e): return "Invalid data; couldn't parse JSON object, array, or value. \(e.message)"
            case .notAnObject: return "A multi-path update needs a JSON object whose keys are paths."
            case let .invalidKey(key, e): return "Invalid key \"\(ChildKey.printable(key))\" in a multi-path update: \(e.message)"
            case let .overlappingPaths(a, b): return "Invalid data; update paths \"\(a)\" and \"\(b)\" overlap."
            case let .tooManyPaths(limit):
                return "Invalid data; a multi-path update may change at most \(limit) paths, and this one has more. Split it into several updates."
            case .invalidValue(let e):
                return e.code == .invalidJSON || e.code == .duplicateKey ? "Invalid data; couldn't parse JSON object, array, or value. \(e.message)" : e.message
            }
        }
    }

    /// A set's value at `path` (server values are placeholders here; they resolve when the write
    /// applies).
    public static func value(_ json: [UInt8], at path: Path) throws(Problem) {
        try value(json, at: WritePath(path: path))
    }

    /// A set's value at a write location, as the state machine will check it: the location within
    /// the path limits, and at `.priority` a value that is a priority (null, a number, a string,
    /// or a server value that resolves to one).
    public static func value(_ json: [UInt8], at location: WritePath) throws(Problem) {
        let subtree: Tree
        do {
            try location.path.checkLimits()
            subtree = try TreeReader.read(json, at: location.path, serverValues: ServerValueContext(timestamp: 0))
        } catch {
            throw problem(error)
        }
        if location.isPriority && Priority(tree: subtree) == nil {
            throw .invalidValue(TreeError(.invalidPriority, path: location.description, "A priority must be null, a number or a string"))
        }
    }

    /// Paths a multi-path update may change unless the node says otherwise
    /// (`http.max_update_keys`). Measured on the 2-core machine (release build, one node): 1,000
    /// paths apply in about 12 ms, 10,000 in about 0.5 s and 100,000 in 8–10 s, during which the
    /// write holds every node's replica loop (docs/security.md, "Limits").
    public static let defaultMaxUpdatePaths = 1_000

    /// A multi-path update's body at `location`: its items, each value's own bytes (no
    /// re-encoding), in the body's order. More than `maxPaths` paths are refused as soon as the
    /// first path too many is read, before any is checked.
    public static func updateItems(_ body: [UInt8], at location: Path, maxPaths: Int = defaultMaxUpdatePaths) throws(Problem) -> [Command.UpdateItem] {
        let members: [(key: String, value: Range<Int>)]?
        do {
            // Stops at the first path past the limit: a refused update costs that much, not its
            // body's worth.
            members = try JSONValue.members(rawIn: body, maxMembers: maxPaths)
        } catch {
            if error.code == .inputTooLarge { throw .tooManyPaths(limit: maxPaths) }
            throw .invalidJSON(error)
        }
        guard let members else { throw .notAnObject }
        var items: [Command.UpdateItem] = []
        var paths: [Path] = []
        items.reserveCapacity(members.count)
        paths.reserveCapacity(members.count)
        for (key, range) in members {
            let relative: WritePath
            do { relative = try WritePath(parsing: key) } catch { throw .invalidKey(key, error) }
            // Each key is within the limits alone; joined to the location it must be too, as
            // the state machine checks every target.
            let target = location.appending(relative.path)
            do { try target.checkLimits() } catch { throw .invalidKey(key, error) }
            let json = Array(body[range])
            try value(json, at: WritePath(path: target, isPriority: relative.isPriority))
            items.append(Command.UpdateItem(path: key, json: json))
            paths.append(relative.path)
        }
        // An ancestor sorts right before its descendants, so neighbours show every overlap.
        paths.sort()
        for (a, b) in zip(paths, paths.dropFirst()) where a.contains(b) { throw .overlappingPaths(a, b) }
        return items
    }

    private static func problem(_ error: TreeError) -> Problem { .invalidValue(error) }
}
