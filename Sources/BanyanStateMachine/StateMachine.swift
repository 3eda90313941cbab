public import BanyanTree

/// The replicated state machine of one namespace: the tree, the last applied log index, and per
/// session the last applied sequence number with its outcome (docs/internals/state-machine.md).
///
/// Pure and deterministic: the same entries applied in the same order give the same tree, the same
/// outcomes and the same image on every replica.
public struct StateMachine: Sendable {
    /// The outcome of one command, as the issuing session is told.
    public enum Outcome: Sendable, Equatable {
        case ok
        /// A compare-and-set found another value (Firebase's `datastale`); `current` lets the
        /// client retry its transaction.
        case datastale(current: Node)
        /// The write was invalid for the tree it applies to (for example a path or depth limit, or
        /// a priority on an empty location). Nothing changed.
        case rejected(TreeError)
        /// Already applied: a retry or a duplicated proposal. Nothing changed.
        case duplicate
        /// The payload is not a command this version understands. Nothing changed.
        case malformed
    }

    /// What applying an entry did.
    public struct Applied: Sendable, Equatable {
        public var session: UInt64
        public var seq: UInt64
        public var outcome: Outcome
        /// Absolute paths written (for live views: `ChildChanges.at(_:written:)`).
        public var written: [Path]
    }

    public private(set) var tree: Node
    public private(set) var appliedIndex: UInt64
    /// Last applied sequence number per session.
    public private(set) var sessions: [UInt64: UInt64]

    public init(tree: Node = .empty, appliedIndex: UInt64 = 0, sessions: [UInt64: UInt64] = [:]) {
        self.tree = tree
        self.appliedIndex = appliedIndex
        self.sessions = sessions
    }

    /// Marks an index applied that carries no command (Raft no-ops and configuration entries).
    public mutating func skip(index: UInt64) {
        appliedIndex = max(appliedIndex, index)
    }

    /// Applies the command at `index`. Entries at or below `appliedIndex` are ignored (returns
    /// nil), so replaying a log over a snapshot never applies anything twice (R10).
    public mutating func apply(_ payload: [UInt8], index: UInt64) -> Applied? {
        guard index > appliedIndex else { return nil }
        appliedIndex = index
        guard let envelope = CommandEnvelope(decoding: payload) else {
            return Applied(session: 0, seq: 0, outcome: .malformed, written: [])
        }
        if let last = sessions[envelope.session], envelope.seq <= last {
            return Applied(session: envelope.session, seq: envelope.seq, outcome: .duplicate, written: [])
        }
        sessions[envelope.session] = envelope.seq
        var written: [Path] = []
        let outcome: Outcome
        do throws(TreeError) {
            outcome = try execute(envelope, written: &written)
        } catch {
            outcome = .rejected(error)
            written = []
        }
        return Applied(session: envelope.session, seq: envelope.seq, outcome: outcome, written: written)
    }

    private mutating func execute(_ e: CommandEnvelope, written: inout [Path]) throws(TreeError) -> Outcome {
        switch e.command {
        case let .set(pathText, json):
            let location = try WritePath(parsing: pathText)
            let context = ServerValueContext(timestamp: e.timestamp, existing: tree)
            let node = try NodeReader.read(json, at: location.path, serverValues: context)
            if location.isPriority, let priority = Priority(node: node) {
                // Firebase's setPriority: an error on a location with no data.
                try tree.apply(setPriority: priority, at: location.path)
            } else {
                try tree.apply(set: node, at: location)
            }
            written = [location.path]
            return .ok
        case let .update(pathText, items):
            let location = try Path(parsing: pathText)
            var entries: [UpdateEntry] = []
            entries.reserveCapacity(items.count)
            for item in items {
                let relative = try WritePath(parsing: item.path)
                let target = location.appending(relative.path)
                let context = ServerValueContext(timestamp: e.timestamp, existing: tree)
                let node = try NodeReader.read(item.json, at: target, serverValues: context)
                entries.append(UpdateEntry(path: relative, node: node))
            }
            // Validation and application are atomic: a rejected update leaves the tree as it was.
            var next = tree
            try next.apply(update: entries, at: location)
            tree = next
            written = entries.map { location.appending($0.path.path) }
            return .ok
        case let .compareAndSet(pathText, expectedHash, json):
            let location = try Path(parsing: pathText)
            let context = ServerValueContext(timestamp: e.timestamp, existing: tree)
            let node = try NodeReader.read(json, at: location, serverValues: context)
            try node.checkFits(at: location)
            switch tree.compareAndSet(node, at: location, expectedHash: expectedHash) {
            case .applied:
                written = [location]
                return .ok
            case .mismatch(let current):
                return .datastale(current: current)
            }
        }
    }

    // MARK: - Snapshot image

    static let magic: [UInt8] = Array("BNYSM001".utf8)

    public enum ImageError: Error, Sendable, Equatable {
        case badHeader
        case truncated
        case tree(TreeError)
    }

    /// Streams the image: header (magic, applied index, sessions sorted by id), then the tree
    /// image in chunks. The tree is never copied whole.
    public func writeImage(chunkBytes: Int = 1 << 20, emit: ([UInt8]) throws -> Void) throws {
        var w = ByteWriter()
        w.out.append(contentsOf: Self.magic)
        w.u64(appliedIndex)
        w.u64(UInt64(sessions.count))
        for (session, seq) in sessions.sorted(by: { $0.key < $1.key }) {
            w.u64(session)
            w.u64(seq)
        }
        try emit(w.out)
        try TreeImage.stream(tree, chunkBytes: chunkBytes, emit: emit)
    }

    public func image() -> [UInt8] {
        var out: [UInt8] = []
        // The closure cannot throw, so neither can the stream.
        try? writeImage { out.append(contentsOf: $0) }
        return out
    }

    /// Restores a state machine from an image; damaged input is a typed error, never a crash.
    public init(image bytes: [UInt8], limits: TreeReadLimits = .snapshot) throws(ImageError) {
        guard bytes.count >= Self.magic.count, Array(bytes[0..<Self.magic.count]) == Self.magic else { throw .badHeader }
        var r = ByteReader(bytes)
        r.at = Self.magic.count
        guard let applied = r.u64(), let count = r.u64(), count <= UInt64(bytes.count / 16) else { throw .truncated }
        var sessions: [UInt64: UInt64] = [:]
        for _ in 0..<count {
            guard let s = r.u64(), let q = r.u64() else { throw .truncated }
            sessions[s] = q
        }
        let tree: Node
        do {
            tree = try TreeImage.read(Array(bytes[r.at...]), limits: limits)
        } catch {
            throw .tree(error)
        }
        self.init(tree: tree, appliedIndex: applied, sessions: sessions)
    }
}
