/// Moving a node's realtime clients to other nodes (`banyan drain`, docs/realtime.md,
/// "Draining a node"): which node each connection is sent to, and how many are told at once.
/// Pure; the server asks it for the next batch on a timer and tells each connection of the
/// batch to reconnect elsewhere with the protocol's reset (`r`).
///
/// Targets are taken in turn, so the connections spread evenly; a connection is told once; a
/// batch is bounded, so the other nodes are not hit by every reconnect at the same instant.
public struct DrainPlan: Sendable, Equatable {
    /// Client addresses (`host:port`) of the nodes that take the connections, in turn.
    public let targets: [String]
    /// Connections told per batch.
    public let batch: Int
    private var turn = 0
    /// Connections already told (so one still closing is not told twice).
    private var told: Set<UInt64> = []

    /// Nil without a target: a drain needs somewhere to send its clients.
    public init?(targets: [String], batch: Int = 200) {
        guard !targets.isEmpty, batch > 0 else { return nil }
        self.targets = targets
        self.batch = batch
    }

    /// The target for one connection (a connection arriving while the node drains is sent on
    /// before its hello).
    public mutating func target() -> String {
        defer { turn = (turn + 1) % targets.count }
        return targets[turn]
    }

    /// The next connections to tell, each with its target: at most `batch` of `open` not told
    /// yet, lowest ids first. Forgets told connections that are no longer open, so the memory
    /// is bounded by the connections open.
    public mutating func nextBatch(open: [UInt64]) -> [(connection: UInt64, target: String)] {
        let openSet = Set(open)
        told = told.intersection(openSet)
        var out: [(connection: UInt64, target: String)] = []
        for connection in open.sorted() where !told.contains(connection) {
            guard out.count < batch else { break }
            told.insert(connection)
            out.append((connection, target()))
        }
        return out
    }

    /// Connections open and not yet told.
    public func remaining(open: [UInt64]) -> Int {
        open.reduce(0) { $0 + (told.contains($1) ? 0 : 1) }
    }

    /// The targets for a drain of node `me` when the operator names none: the client addresses
    /// the other members published (`$cluster/clients/<id>`), in node order. Addresses of nodes
    /// that are no longer members are left out.
    public static func targets(published: [UInt64: String], members: Set<UInt64>, me: UInt64) -> [String] {
        published.filter { $0.key != me && members.contains($0.key) && !$0.value.isEmpty }.sorted { $0.key < $1.key }.map(\.value)
    }
}
