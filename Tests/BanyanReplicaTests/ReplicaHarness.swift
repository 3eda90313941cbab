import BanyanBasics
import BanyanNode
import BanyanOpLog
import BanyanOpLogFiles
import BanyanRaft
import BanyanReplica
import BanyanStateMachine
import BanyanTree
import Logging
import Testing

/// A synchronous cluster of replicas for scenario tests: each node persists through the node's
/// own `NodeStorage` (segmented log, hard-state file, snapshot store) over its own
/// `SimulatedFileSystem` and writes snapshots with `SnapshotWriter`, as `NodeCore` and the
/// server's snapshot thread do; the network is a queue that tests can filter, duplicate or
/// drop, and every node has its own wall clock.
struct ReplicaCluster {
    var replicas: [NodeID: Replica] = [:]
    var fileSystems: [NodeID: SimulatedFileSystem] = [:]
    var storages: [NodeID: NodeStorage] = [:]
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
    var heldReadAheads: [NodeID: [(index: UInt64, term: UInt64, payload: [UInt8])]] = [:]
    /// Staged payloads (docs/staged-payloads.md): stores asked of these nodes stay unanswered
    /// in `heldStores` until `answerStores` (the rest are stored at once, durably).
    var holdStoresOn: Set<NodeID> = []
    var heldStores: [NodeID: [(StageID, [UInt8])]] = [:]
    static let directory = "/data"

    static func configuration(_ id: NodeID, snapshotEntries: UInt64 = 0) -> ReplicaConfiguration {
        var raft = RaftConfiguration(id: id, seed: id * 7919)
        raft.electionTicks = 10
        var c = ReplicaConfiguration(raft: raft)
        c.snapshotEntries = snapshotEntries
        c.retryTicks = 5
        c.requestTimeoutTicks = 60
        return c
    }

    static func openStorage(_ fileSystem: SimulatedFileSystem) throws -> NodeStorage {
        var logger = Logger(label: "banyan.replica-tests")
        logger.logLevel = .critical
        return try NodeStorage(directory: directory, fileSystem: fileSystem, logger: logger) { _ in }
    }

    /// `tune` adjusts every node's configuration (for example Raft's flow-control limits).
    init(nodes: Int, snapshotEntries: UInt64 = 0, tune: (inout ReplicaConfiguration) -> Void = { _ in }) throws {
        let ids = (1...UInt64(nodes)).map { $0 }
        for id in ids {
            let fileSystem = SimulatedFileSystem()
            try Self.openStorage(fileSystem).bootstrap(members: ids)
            var configuration = Self.configuration(id, snapshotEntries: snapshotEntries)
            tune(&configuration)
            try start(id, fileSystem: fileSystem, configuration: configuration, session: 1000 + id)
        }
    }

    /// Starts node `id` from what `fileSystem` holds (its storage recovers and loads it).
    private mutating func start(_ id: NodeID, fileSystem: SimulatedFileSystem, configuration: ReplicaConfiguration, session: UInt64) throws {
        let storage = try Self.openStorage(fileSystem)
        let loaded = try storage.load { _ in }
        fileSystems[id] = fileSystem
        storages[id] = storage
        if clocks[id] == nil { clocks[id] = 1_000_000 * Int64(id) }
        replicas[id] = try Replica(
            configuration: configuration, persisted: loaded.persisted, machine: loaded.machine, session: session, now: clocks[id] ?? 0)
        // As `NodeCore`: the staged files on disk are durable here.
        replicas[id]?.noteStagedFiles(try storage.staged.list())
    }

    /// Adds a blank node (a learner-to-be) that knows nothing yet.
    mutating func addBlank(_ id: NodeID, snapshotEntries: UInt64 = 0) throws {
        try start(id, fileSystem: SimulatedFileSystem(), configuration: Self.configuration(id, snapshotEntries: snapshotEntries), session: 1000 + id)
    }

    /// Restarts a node from its disk after a power loss (memory and anything unsynced lost).
    mutating func restart(_ id: NodeID, session: UInt64) throws {
        guard let fileSystem = fileSystems[id], let old = replicas[id] else { return }
        fileSystem.reboot()
        try start(id, fileSystem: fileSystem, configuration: old.configuration, session: session)
    }

    /// The log entries on `id`'s disk after its newest snapshot, read back through its storage.
    func storedEntries(_ id: NodeID) -> [LogEntry] {
        (try? storages[id]?.load { _ in }.persisted.entries) ?? []
    }

    /// The size of `id`'s newest snapshot file (what a follower receives), 0 without one.
    func snapshotFileBytes(_ id: NodeID) -> Int {
        guard let storage = storages[id], let latest = (try? storage.snapshots.latest()) ?? nil else { return 0 }
        return (try? storage.snapshots.fileSize(lastIndex: latest.lastIndex)) ?? 0
    }

    /// Answers a held read-ahead of `id` (and settles nothing: call `settle()`).
    mutating func answerReadAhead(_ id: NodeID, index: UInt64) {
        guard var r = replicas[id], let i = heldReadAheads[id]?.firstIndex(where: { $0.index == index }),
            let held = heldReadAheads[id]?.remove(at: i)
        else { return }
        r.prepared(index: held.index, term: held.term, PreparedCommand(payload: held.payload))
        let new = r.takeEvents()
        replicas[id] = r
        events[id, default: []].append(contentsOf: new)
        for event in new {
            guard case .prepare(let index, let term, let payload) = event else { continue }
            heldReadAheads[id, default: []].append((index, term, payload))
            if !holdReadAheads { answerReadAhead(id, index: index) }
        }
    }

    /// Answers every read-ahead held on every node, in the order asked.
    mutating func answerAllReadAheads() {
        for id in replicas.keys.sorted() {
            for asked in heldReadAheads[id] ?? [] { answerReadAhead(id, index: asked.index) }
        }
    }

    mutating func request() -> RequestID {
        defer { nextRequest += 1 }
        return nextRequest
    }

    /// Runs one node's ready loop until it has nothing to do: persist (snapshot chunks and
    /// install, entries, hard state) through its storage, send, serve snapshot chunks from its
    /// store, advance, then write any snapshot due and compact, as `NodeCore` does.
    mutating func process(_ id: NodeID) {
        guard var r = replicas[id], let storage = storages[id], let fileSystem = fileSystems[id] else { return }
        // Staging events outside a `Ready` (a message received, a store answered) may queue
        // more work: bounded rounds until both are quiet.
        for _ in 0..<100 {
        while let rd = r.ready() {
            let installed: StateMachine?
            do {
                installed = try storage.persist(rd)
            } catch {
                // The tests inject no disk faults: any storage error fails the running test.
                Issue.record("node \(id): persisting failed: \(error)")
                break
            }
            network.append(contentsOf: rd.messages)
            for req in rd.snapshotReads {
                do {
                    let chunk = try storage.snapshotChunk(req)
                    r.snapshotChunk(to: req.to, meta: req.meta, offset: req.offset, data: chunk.data, last: chunk.last)
                } catch {
                    Issue.record("node \(id): cannot read its snapshot at \(req.meta.index): \(error)")
                }
            }
            r.advance(rd, installed: installed)
            var pending = r.takeEvents()
            while !pending.isEmpty {
                let event = pending.removeFirst()
                pending.append(contentsOf: stagingEvent(event, on: id, storage: storage, &r))
                if case .prepare(let index, let term, let payload) = event {
                    if holdReadAheads {
                        heldReadAheads[id, default: []].append((index, term, payload))
                    } else {
                        // Read ahead at once here (the server's driver uses another thread).
                        r.prepared(index: index, term: term, PreparedCommand(payload: payload))
                        pending.append(contentsOf: r.takeEvents())
                    }
                }
                if case .snapshotDue(let meta) = event {
                    do {
                        try SnapshotWriter(directory: Self.directory, fileSystem: fileSystem).write(r.machine, meta: meta) { _ in }
                        // As `NodeCore`: not past a snapshot the leader streams to a live follower.
                        let through = r.compactionPoint(for: meta.index)
                        try storage.snapshots.removeSnapshots(olderThan: meta.index, keeping: through < meta.index ? through : nil)
                        try storage.compact(through: through)
                        try storage.saveCommit(r.raft.durableHardState)
                        let size = try storage.snapshots.fileSize(lastIndex: meta.index)
                        r.snapshotWritten(meta, imageBytes: UInt64(size), compactedThrough: through)
                        snapshotsWritten[id, default: 0] += 1
                    } catch {
                        Issue.record("node \(id): snapshot at \(meta.index) failed: \(error)")
                        r.snapshotFailed()
                    }
                    pending.append(contentsOf: r.takeEvents())
                }
                events[id, default: []].append(event)
            }
        }
        var tail = r.takeEvents()
        if tail.isEmpty && !r.raft.hasReady { break }
        while !tail.isEmpty {
            let event = tail.removeFirst()
            tail.append(contentsOf: stagingEvent(event, on: id, storage: storage, &r))
            events[id, default: []].append(event)
        }
        }
        replicas[id] = r
    }

    /// Carries out a staging event at once, as the server's staging and read-ahead threads do
    /// later (stores held for nodes in `holdStoresOn`); returns the events that follow.
    mutating func stagingEvent(_ event: ReplicaEvent, on id: NodeID, storage: NodeStorage, _ r: inout Replica) -> [ReplicaEvent] {
        switch event {
        case let .storeStaged(stageID, bytes):
            if holdStoresOn.contains(id) {
                heldStores[id, default: []].append((stageID, bytes))
                return []
            }
            do {
                r.stagedStored(stageID, checksum: try storage.staged.store(stageID, bytes))
            } catch {
                Issue.record("node \(id): storing \(stageID) failed: \(error)")
            }
        case let .prepareStaged(stageID, bytes):
            r.preparedStaged(stageID, NodeCore.prepareStaged(stageID, bytes, store: storage.staged).0)
        case let .serveStaged(stageID, peer):
            var payload: [UInt8]?
            if case .payload(let bytes, _) = storage.staged.load(stageID) { payload = bytes }
            r.stagedRead(stageID, payload, for: peer)
        case .removeStaged(let ids):
            do { try storage.staged.remove(ids) } catch { Issue.record("node \(id): removing staged files failed: \(error)") }
        default:
            return []
        }
        return r.takeEvents()
    }

    /// Stores what `holdStoresOn` held on `id` (and stops holding), then settles.
    mutating func answerStores(_ id: NodeID) {
        holdStoresOn.remove(id)
        guard var r = replicas[id], let storage = storages[id] else { return }
        var pending: [ReplicaEvent] = []
        for (stageID, bytes) in heldStores.removeValue(forKey: id) ?? [] {
            pending += stagingEvent(.storeStaged(stageID, bytes), on: id, storage: storage, &r)
        }
        replicas[id] = r
        events[id, default: []].append(contentsOf: pending)
        settle()
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
                    if case .prepare(let index, let term, let payload) = event { heldReadAheads[id, default: []].append((index, term, payload)) }
                    if var r = replicas[id], let storage = storages[id] {
                        let more = stagingEvent(event, on: id, storage: storage, &r)
                        replicas[id] = r
                        events[id, default: []].append(contentsOf: more)
                    }
                    events[id, default: []].append(event)
                }
                if !holdReadAheads {
                    for (index, _, _) in heldReadAheads[id] ?? [] { answerReadAhead(id, index: index) }
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

extension ReplicaCluster {
    /// A JSON string of `length` characters drawn from 64 letters by a generator seeded with
    /// `seed`: data that deflate cannot shrink much (to about three quarters), so tests that
    /// need snapshot files of a given size can get them (the store compresses images).
    static func noise(_ seed: Int, length: Int) -> String {
        let letters = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        var state = UInt64(truncatingIfNeeded: seed) &+ 0x9E37_79B9_7F4A_7C15
        var out = "\""
        out.reserveCapacity(length + 2)
        for _ in 0..<length {
            state = state &+ 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            z ^= z >> 31
            out.append(letters[Int(z & 63)])
        }
        out.append("\"")
        return out
    }
}
