import BanyanRaft
import BanyanReplica
import BanyanStateMachine
import BanyanTree

/// A synchronous in-memory cluster of replicas for scenario tests: each node has a memory disk
/// (hard state, snapshot image, entries after it), the network is a queue that tests can filter,
/// duplicate or drop, and every node has its own wall clock.
struct ReplicaCluster {
    struct Disk {
        var persisted = PersistedState.blank
        var image: [UInt8] = StateMachine().image()
        var incoming: [UInt8] = []
    }

    var replicas: [NodeID: Replica] = [:]
    var disks: [NodeID: Disk] = [:]
    var clocks: [NodeID: Int64] = [:]
    var network: [Message] = []
    /// Return false to drop a message.
    var filter: (Message) -> Bool = { _ in true }
    var events: [NodeID: [ReplicaEvent]] = [:]
    var nextRequest: RequestID = 1
    var snapshotsWritten: [NodeID: Int] = [:]
    /// Keep read-aheads (`ReplicaEvent.prepare`) unanswered in `heldReadAheads` instead of
    /// answering them at once; `answerReadAhead` answers one.
    var holdReadAheads = false
    var heldReadAheads: [NodeID: [(index: UInt64, payload: [UInt8])]] = [:]

    static func configuration(_ id: NodeID, snapshotEntries: UInt64 = 0) -> ReplicaConfiguration {
        var raft = RaftConfiguration(id: id, seed: id * 7919)
        raft.electionTicks = 10
        var c = ReplicaConfiguration(raft: raft)
        c.snapshotEntries = snapshotEntries
        c.retryTicks = 5
        c.requestTimeoutTicks = 60
        return c
    }

    /// `tune` adjusts every node's configuration (for example Raft's flow-control limits).
    init(nodes: Int, snapshotEntries: UInt64 = 0, tune: (inout ReplicaConfiguration) -> Void = { _ in }) throws {
        let ids = (1...UInt64(nodes)).map { $0 }
        for id in ids {
            var disk = Disk()
            disk.persisted = RaftNode.bootstrapState(members: ids)
            disks[id] = disk
            clocks[id] = 1_000_000 * Int64(id)
            var configuration = Self.configuration(id, snapshotEntries: snapshotEntries)
            tune(&configuration)
            replicas[id] = try Replica(
                configuration: configuration, persisted: disk.persisted,
                machine: StateMachine(), session: 1000 + id, now: clocks[id] ?? 0)
        }
    }

    /// Adds a blank node (a learner-to-be) that knows nothing yet.
    mutating func addBlank(_ id: NodeID, snapshotEntries: UInt64 = 0) throws {
        disks[id] = Disk()
        clocks[id] = 1_000_000 * Int64(id)
        replicas[id] = try Replica(
            configuration: Self.configuration(id, snapshotEntries: snapshotEntries), persisted: .blank, machine: StateMachine(),
            session: 1000 + id, now: clocks[id] ?? 0)
    }

    /// Restarts a node from its disk (memory lost).
    mutating func restart(_ id: NodeID, session: UInt64) throws {
        guard let disk = disks[id], let old = replicas[id] else { return }
        let machine = try StateMachine(image: disk.image)
        replicas[id] = try Replica(configuration: old.configuration, persisted: disk.persisted, machine: machine, session: session, now: clocks[id] ?? 0)
    }

    /// Answers a held read-ahead of `id` (and settles nothing: call `settle()`).
    mutating func answerReadAhead(_ id: NodeID, index: UInt64) {
        guard var r = replicas[id], let i = heldReadAheads[id]?.firstIndex(where: { $0.index == index }),
            let held = heldReadAheads[id]?.remove(at: i)
        else { return }
        r.prepared(index: held.index, PreparedCommand(payload: held.payload))
        let new = r.takeEvents()
        replicas[id] = r
        events[id, default: []].append(contentsOf: new)
        for event in new {
            guard case .prepare(let index, let payload, _) = event else { continue }
            heldReadAheads[id, default: []].append((index, payload))
            if !holdReadAheads { answerReadAhead(id, index: index) }
        }
    }

    mutating func request() -> RequestID {
        defer { nextRequest += 1 }
        return nextRequest
    }

    /// Runs one node's ready loop until it has nothing to do.
    mutating func process(_ id: NodeID) {
        guard var r = replicas[id], var disk = disks[id] else { return }
        while let rd = r.ready() {
            for chunk in rd.snapshotChunks {
                if chunk.offset == 0 { disk.incoming = [] }
                if Int(chunk.offset) == disk.incoming.count { disk.incoming.append(contentsOf: chunk.data) }
            }
            var installed: StateMachine?
            if let meta = rd.snapshot {
                disk.image = disk.incoming
                let keep = disk.persisted.entries.filter { $0.index > meta.index }
                let continues = disk.persisted.entries.contains { $0.index == meta.index && $0.term == meta.term }
                disk.persisted.entries = continues ? keep : []
                disk.persisted.snapshot = meta
                installed = try? StateMachine(image: disk.image)
            }
            for e in rd.entries {
                disk.persisted.entries.removeAll { $0.index >= e.index }
                disk.persisted.entries.append(e)
            }
            if let hs = rd.hardState { disk.persisted.hardState = hs }
            network.append(contentsOf: rd.messages)
            for req in rd.snapshotReads {
                let start = min(Int(req.offset), disk.image.count)
                let end = min(start + req.maxBytes, disk.image.count)
                r.snapshotChunk(to: req.to, meta: req.meta, offset: req.offset, data: Array(disk.image[start..<end]), last: end == disk.image.count)
            }
            r.advance(rd, installed: installed)
            var pending = r.takeEvents()
            while !pending.isEmpty {
                let event = pending.removeFirst()
                if case .prepare(let index, let payload, _) = event {
                    if holdReadAheads {
                        heldReadAheads[id, default: []].append((index, payload))
                    } else {
                        // Read ahead at once here (the server's driver uses another thread).
                        r.prepared(index: index, PreparedCommand(payload: payload))
                        pending.append(contentsOf: r.takeEvents())
                    }
                }
                if case .snapshotDue(let meta) = event {
                    disk.image = r.machine.image()
                    disk.persisted.snapshot = meta
                    disk.persisted.entries.removeAll { $0.index <= meta.index }
                    r.snapshotWritten(meta, imageBytes: UInt64(disk.image.count))
                    snapshotsWritten[id, default: 0] += 1
                }
                events[id, default: []].append(event)
            }
        }
        for event in r.takeEvents() { events[id, default: []].append(event) }
        replicas[id] = r
        disks[id] = disk
    }

    /// Makes `filter` drop the first proposal on its way to the leader; the box counts drops.
    final class Drops { var count = 0 }
    mutating func dropFirstProposal() -> Drops {
        let drops = Drops()
        filter = { m in
            if case .proposal = m.body, drops.count == 0 {
                drops.count += 1
                return false
            }
            return true
        }
        return drops
    }

    /// Delivers queued messages (each through `filter`) and processes nodes until quiet, bounded.
    mutating func settle(rounds: Int = 50) {
        for _ in 0..<rounds {
            for id in replicas.keys.sorted() { process(id) }
            if network.isEmpty { return }
            let batch = network
            network = []
            for m in batch where filter(m) {
                replicas[m.to]?.receive(m)
            }
        }
    }

    /// Ticks every node once (advancing its clock by 10 ms) and settles.
    mutating func tick(_ n: Int = 1) {
        for _ in 0..<n {
            for id in replicas.keys.sorted() {
                clocks[id, default: 0] += 10
                replicas[id]?.tick(now: clocks[id] ?? 0)
                for event in replicas[id]?.takeEvents() ?? [] {
                    if case .prepare(let index, let payload, _) = event { heldReadAheads[id, default: []].append((index, payload)) }
                    events[id, default: []].append(event)
                }
                if !holdReadAheads {
                    for (index, _) in heldReadAheads[id] ?? [] { answerReadAhead(id, index: index) }
                }
            }
            settle()
        }
    }

    /// Ticks until a leader exists; returns it.
    mutating func electLeader() -> NodeID? {
        for _ in 0..<200 {
            if let l = leader { return l }
            tick()
        }
        return nil
    }

    var leader: NodeID? {
        replicas.values.first { $0.raft.role == .leader }.map { $0.raft.id }
    }

    mutating func write(via id: NodeID, _ path: String, _ json: String, namespace: String = "app") -> RequestID {
        let q = request()
        replicas[id]?.write(q, namespace: namespace, command: .set(path: path, json: Array(json.utf8)))
        return q
    }

    mutating func read(via id: NodeID) -> RequestID {
        let q = request()
        replicas[id]?.read(q)
        return q
    }

    /// The outcome of a write request seen on `id`, if it finished.
    func writeOutcome(_ q: RequestID, on id: NodeID) -> Result<StateMachine.Applied, ReplicaError>? {
        for e in events[id] ?? [] {
            switch e {
            case .applied(let a, _, let r) where r == q: return .success(a)
            case .failed(let r, let err) where r == q: return .failure(err)
            default: continue
            }
        }
        return nil
    }

    func readReady(_ q: RequestID, on id: NodeID) -> Bool {
        (events[id] ?? []).contains { e in
            if case .readsReady(let qs) = e { return qs.contains(q) }
            return false
        }
    }

    func readFailed(_ q: RequestID, on id: NodeID) -> ReplicaError? {
        for e in events[id] ?? [] {
            if case .failed(let r, let err) = e, r == q { return err }
        }
        return nil
    }

    func value(_ id: NodeID, _ path: String, namespace: String = "app") -> String {
        guard let r = replicas[id], let p = try? Path(parsing: path) else { return "?" }
        return JSONWriter.string(r.machine.tree(namespace).child(at: p))
    }
}
