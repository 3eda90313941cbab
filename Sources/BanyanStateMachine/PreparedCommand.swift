import BanyanTree

/// A log entry's command read ahead of its application, off the thread that applies the log
/// (docs/replica.md, "Prepared entries"): the envelope decoded and the written data read into
/// trees, with server values that depend on the tree the write meets left open. Applying it
/// (`StateMachine.apply(_:index:prepared:)`) does what applying the payload does, without
/// reading the data again: preparing depends on the payload alone, never on the state.
public struct PreparedCommand: Sendable {
    let envelope: CommandEnvelope
    /// One read per written value, in the command's order (a set's or compare-and-set's one
    /// value, an update's items); nil when the command writes no data or its location does not
    /// parse (applying reads nothing then, and fails or succeeds cheaply as it always would).
    let values: [Result<DeferredTree, TreeError>]?

    /// Reads `payload` ahead; nil when it is not a command envelope (applying reports it). The
    /// trees read carry their data bytes, so a quota's check reads them where they land.
    public init?(payload: [UInt8]) {
        guard let envelope = CommandEnvelope(decoding: payload) else { return nil }
        self.envelope = envelope
        let timestamp = envelope.timestamp
        func read(_ json: [UInt8], at path: Path) -> Result<DeferredTree, TreeError> {
            Result { () throws(TreeError) in try TreeReader.readDeferred(json, at: path, timestamp: timestamp) }
        }
        switch envelope.command {
        case let .set(pathText, json):
            guard let location = try? WritePath(parsing: pathText) else {
                values = nil
                return
            }
            values = [read(json, at: location.path)]
        case let .compareAndSet(pathText, _, json):
            guard let location = try? Path(parsing: pathText) else {
                values = nil
                return
            }
            values = [read(json, at: location)]
        case let .update(pathText, items):
            guard let location = try? Path(parsing: pathText) else {
                values = nil
                return
            }
            var reads: [Result<DeferredTree, TreeError>] = []
            reads.reserveCapacity(items.count)
            for item in items {
                guard let relative = try? WritePath(parsing: item.path) else {
                    // Applying fails on this path before reading anything after it.
                    break
                }
                reads.append(read(item.json, at: location.appending(relative.path)))
            }
            values = reads
        default:
            values = nil
        }
    }

    /// The tree for value `slot` as `TreeReader.read(json, at:, serverValues: context)` gives it,
    /// from the read done ahead when there is one.
    static func tree(
        _ prepared: [Result<DeferredTree, TreeError>]?, _ slot: Int, _ json: [UInt8], at path: Path, context: ServerValueContext
    ) throws(TreeError) -> Tree {
        if let prepared, slot < prepared.count {
            switch prepared[slot] {
            case .failure(let error): throw error
            case .success(let deferred):
                if let tree = deferred.resolved(existing: context.existing, timestamp: context.timestamp) { return tree }
            }
        }
        return try TreeReader.read(json, at: path, serverValues: context)
    }
}
