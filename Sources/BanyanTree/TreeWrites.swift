/// The write operations of the data model: set, multi-path update, remove, setPriority and
/// compare-by-hash. Each validates completely before changing anything, so a rejected write leaves
/// the tree untouched.

/// One entry of a multi-path update: a relative path (possibly ending in `.priority`) and its data.
public struct UpdateEntry: Sendable, Equatable {
    public let path: WritePath
    public let value: Tree

    public init(path: WritePath, value: Tree) {
        self.path = path
        self.value = value
    }
}

extension Tree {
    /// Firebase `set`: replaces the tree at `location` (data without `.priority` clears the
    /// priority). Writing to `x/.priority` sets the priority of `x` instead.
    ///
    /// - Parameter readHere: `subtree` came from `TreeReader` reading at `location`, which checked
    ///   the depth and key-path limits already (skips an O(size) walk).
    public mutating func apply(set subtree: Tree, at location: WritePath, readHere: Bool = false) throws(TreeError) {
        if !readHere { try subtree.checkFits(at: location.path) }
        if location.isPriority {
            guard let priority = Priority(tree: subtree) else {
                throw TreeError(.invalidPriority, path: location.description, "A priority must be null, a number or a string")
            }
            setPriority(priority, at: location.path)
            return
        }
        set(subtree, at: location.path)
    }

    /// Firebase `update` (`updateChildValues`): applies every entry relative to `location`,
    /// atomically. Rejects the whole update when one entry's path is an ancestor of (or equal to)
    /// another's, or when a resulting path exceeds the limits. A merge keeps `location`'s priority.
    ///
    /// - Parameter readHere: every entry's value came from `TreeReader` reading at its target.
    public mutating func apply(update entries: [UpdateEntry], at location: Path, readHere: Bool = false) throws(TreeError) {
        try Tree.validate(update: entries, at: location, readHere: readHere)
        // Data first, then priorities (as Firebase's compound writes do), so that the result does
        // not depend on the order of the entries: {"a/.priority": 5, "a/b": 1} on an empty `a`
        // leaves `a` with priority 5 whichever entry comes first.
        for entry in entries where !entry.path.isPriority {
            set(entry.value, at: location.appending(entry.path.path))
        }
        for entry in entries where entry.path.isPriority {
            if let priority = Priority(tree: entry.value) { setPriority(priority, at: location.appending(entry.path.path)) }
        }
    }

    /// Checks a multi-path update without applying it.
    public static func validate(update entries: [UpdateEntry], at location: Path, readHere: Bool = false) throws(TreeError) {
        // Full paths as segment lists; `.priority` counts as a final segment for overlap checks.
        var full: [(segments: [String], text: String)] = []
        full.reserveCapacity(entries.count)
        for entry in entries {
            let target = location.appending(entry.path.path)
            if target.count > Path.maxDepth || target.byteCount > Path.maxBytes {
                try target.checkLimits()
            }
            if !readHere { try entry.value.checkFits(at: target) }
            if entry.path.isPriority, Priority(tree: entry.value) == nil {
                throw TreeError(.invalidPriority, path: entry.path.description, "A priority must be null, a number or a string")
            }
            var segments = entry.path.path.segments.map(\.string)
            if entry.path.isPriority { segments.append(".priority") }
            full.append((segments, entry.path.description))
        }
        // Sorted by segments, an ancestor immediately precedes some descendant.
        let order = full.indices.sorted { a, b in
            for (x, y) in zip(full[a].segments, full[b].segments) where !x.utf8.elementsEqual(y.utf8) {
                return compareUTF16(x, y) < 0
            }
            return full[a].segments.count < full[b].segments.count
        }
        for (i, j) in zip(order, order.dropFirst()) {
            let a = full[i].segments
            let b = full[j].segments
            if a.count <= b.count, zip(a, b).allSatisfy({ $0.utf8.elementsEqual($1.utf8) }) {
                throw TreeError(
                    .overlappingPaths, path: location.description,
                    "Path \(full[i].text) is an ancestor of \(full[j].text) in the same update")
            }
        }
    }

    /// Throws unless this tree, written at `location`, stays within the depth (32 levels) and
    /// key-path (768 bytes) limits at every leaf. O(size of the tree); `TreeReader` already
    /// guarantees it for data it read at the same location.
    public func checkFits(at location: Path) throws(TreeError) {
        try location.checkLimits()
        var path = location.segments
        try checkFits(depth: location.count, bytes: location.byteCount, path: &path)
    }

    /// `path` is this tree's location, extended and restored on the way down: a path is built
    /// only for an error message, not for every child.
    private func checkFits(depth: Int, bytes: Int, path: inout [ChildKey]) throws(TreeError) {
        guard case .children(let map, _, _) = storage else { return }
        if depth + 1 > Path.maxDepth {
            throw TreeError(
                .depthExceeded, path: Path(segments: path).description,
                "Data is nested too deeply: location depth plus data depth exceeds \(Path.maxDepth)")
        }
        var failure: TreeError?
        map.forEach { key, child in
            guard failure == nil else { return }
            let childBytes = (depth == 0 ? 0 : bytes + 1) + Int(key.length)
            if childBytes > Path.maxBytes {
                failure = TreeError(
                    .pathTooLong, path: Path(segments: path + [key]).description,
                    "Key path is \(childBytes) bytes of UTF-8; the limit is \(Path.maxBytes)")
                return
            }
            guard case .children = child.storage else { return }
            path.append(key)
            defer { path.removeLast() }
            do throws(TreeError) {
                try child.checkFits(depth: depth + 1, bytes: childBytes, path: &path)
            } catch {
                failure = error
            }
        }
        if let failure { throw failure }
    }

    /// Firebase `setPriority`: fails with `emptyLocation` when there is no data at `path`.
    public mutating func apply(setPriority priority: Priority, at path: Path) throws(TreeError) {
        guard setPriority(priority, at: path) else {
            throw TreeError(.emptyLocation, path: path.description, "Can't set a priority on a location with no data")
        }
    }

    /// Compare-by-hash (transactions): sets `subtree` at `path` only when the current tree there has
    /// hash `expectedHash`. Returns the current tree when the comparison fails (for the retry).
    public mutating func compareAndSet(_ subtree: Tree, at path: Path, expectedHash: String) -> CompareAndSetResult {
        let current = child(at: path)
        guard current.hashString == expectedHash else { return .mismatch(current: current) }
        set(subtree, at: path)
        return .applied
    }
}

public enum CompareAndSetResult: Sendable, Equatable {
    case applied
    case mismatch(current: Tree)
}
