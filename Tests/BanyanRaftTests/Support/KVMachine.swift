import BanyanTree

/// The simulator's replicated state machine: integer registers `k0`, `k1`, … held in a real
/// `BanyanTree` node, written by put and compare-and-set (compare by Firebase node hash, as
/// transactions do), with per-client de-duplication of retried or duplicated commands (R29).
struct KVMachine: Sendable, Equatable {
    enum Command: Sendable, Equatable {
        case put(key: Int, value: Int64)
        case cas(key: Int, expected: Int64?, new: Int64)
    }

    enum Outcome: Sendable, Equatable {
        case written
        case swapped(Bool)
    }

    /// A command with the identity used for de-duplication.
    struct Envelope: Sendable, Equatable {
        var client: UInt32
        var seq: UInt32
        var command: Command

        init(client: UInt32, seq: UInt32, command: Command) {
            self.client = client
            self.seq = seq
            self.command = command
        }

        func encoded() -> [UInt8] {
            var out: [UInt8] = []
            out.reserveCapacity(32)
            func put32(_ v: UInt32) { for s in stride(from: 0, to: 32, by: 8) { out.append(UInt8(truncatingIfNeeded: v >> UInt32(s))) } }
            func put64(_ v: Int64) { let u = UInt64(bitPattern: v); for s in stride(from: 0, to: 64, by: 8) { out.append(UInt8(truncatingIfNeeded: u >> UInt64(s))) } }
            switch command {
            case let .put(key, value):
                out.append(1)
                put32(client); put32(seq); out.append(UInt8(truncatingIfNeeded: key)); put64(value)
            case let .cas(key, expected, new):
                out.append(2)
                put32(client); put32(seq); out.append(UInt8(truncatingIfNeeded: key)); put64(new)
                out.append(expected == nil ? 0 : 1); put64(expected ?? 0)
            }
            return out
        }

        init?(decoding b: [UInt8]) {
            func u32(_ at: Int) -> UInt32 { (0..<4).reduce(UInt32(0)) { $0 | UInt32(b[at + $1]) << UInt32(8 * $1) } }
            func i64(_ at: Int) -> Int64 { Int64(bitPattern: (0..<8).reduce(UInt64(0)) { $0 | UInt64(b[at + $1]) << UInt64(8 * $1) }) }
            guard let kind = b.first else { return nil }
            switch kind {
            case 1 where b.count == 18:
                self.init(client: u32(1), seq: u32(5), command: .put(key: Int(b[9]), value: i64(10)))
            case 2 where b.count == 27:
                let expected: Int64? = b[18] == 0 ? nil : i64(19)
                self.init(client: u32(1), seq: u32(5), command: .cas(key: Int(b[9]), expected: expected, new: i64(10)))
            default:
                return nil
            }
        }
    }

    private(set) var tree: Tree = .empty
    /// Highest sequence number applied per client.
    private(set) var sessions: [UInt32: UInt32] = [:]
    private(set) var appliedIndex: UInt64 = 0

    init() {}

    static func path(_ key: Int) -> Path { Path(segments: [ChildKey(unchecked: "k\(key)")]) }

    func value(_ key: Int) -> Int64? {
        if case .int(let v) = tree.child(at: Self.path(key)).leaf { return v }
        return nil
    }

    /// Applies one committed entry's command. Returns nil for a duplicate (already applied).
    mutating func apply(_ envelope: Envelope, index: UInt64) -> Outcome? {
        appliedIndex = index
        if let last = sessions[envelope.client], envelope.seq <= last { return nil }
        sessions[envelope.client] = envelope.seq
        switch envelope.command {
        case let .put(key, value):
            tree.set(Tree(.int(value)), at: Self.path(key))
            return .written
        case let .cas(key, expected, new):
            let expectedNode = expected.map { Tree(.int($0)) } ?? .empty
            switch tree.compareAndSet(Tree(.int(new)), at: Self.path(key), expectedHash: expectedNode.hashString) {
            case .applied: return .swapped(true)
            case .mismatch: return .swapped(false)
            }
        }
    }

    mutating func skip(index: UInt64) { appliedIndex = index }

    /// A canonical image: applied index, sessions (sorted), then the tree image.
    func snapshotBytes() -> [UInt8] {
        var out: [UInt8] = []
        func put64(_ v: UInt64) { for s in stride(from: 0, to: 64, by: 8) { out.append(UInt8(truncatingIfNeeded: v >> UInt64(s))) } }
        put64(appliedIndex)
        put64(UInt64(sessions.count))
        for (client, seq) in sessions.sorted(by: { $0.key < $1.key }) {
            put64(UInt64(client))
            put64(UInt64(seq))
        }
        out.append(contentsOf: TreeImage.bytes(tree))
        return out
    }

    enum ImageError: Error, Sendable { case truncated, tree(TreeError) }

    init(snapshot b: [UInt8]) throws(ImageError) {
        var at = 0
        func get64() throws(ImageError) -> UInt64 {
            guard at + 8 <= b.count else { throw .truncated }
            let v = (0..<8).reduce(UInt64(0)) { $0 | UInt64(b[at + $1]) << UInt64(8 * $1) }
            at += 8
            return v
        }
        appliedIndex = try get64()
        let n = try get64()
        guard n <= UInt64(b.count / 16) else { throw .truncated }
        for _ in 0..<n {
            let client = UInt32(truncatingIfNeeded: try get64())
            sessions[client] = UInt32(truncatingIfNeeded: try get64())
        }
        do {
            tree = try TreeImage.read(Array(b[at...]))
        } catch {
            throw .tree(error)
        }
    }

    /// A digest of the whole state for cross-node comparison.
    var digest: String {
        let s = sessions.sorted(by: { $0.key < $1.key }).map { "\($0.key):\($0.value)" }.joined(separator: ",")
        return "\(tree.hashString)|\(s)"
    }
}
