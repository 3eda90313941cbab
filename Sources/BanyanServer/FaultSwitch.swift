import BanyanOpLogFiles
import Foundation
import Metrics
import Synchronization

/// The fault switch of a node started for local failover testing (`--allow-fault-injection`,
/// loopback addresses only; docs/chaos.md): the faults `banyan chaos` sets through
/// `/.banyan/faults`. A node started without the flag has no switch at all (`NodeRuntime.faults`
/// is nil), so its send, receive and persist paths test one optional and nothing else; with the
/// switch, each path reads one atomic flag and takes the lock only while some fault is set.
///
/// Faults:
/// - `dropPeers`: Raft messages to and from these node ids are dropped on this node (both
///   directions, like a firewall DROP rule), counted in `banyan_fault_dropped_peer_messages_total`.
///   A partition is a drop set on each side, so it holds even if one side restarts without it.
/// - `peerDelayMilliseconds`: every outbound Raft message waits this long before it is queued on
///   its connection (order per peer is kept).
/// - `diskDelayMilliseconds`: an fsync waits this long first (a slow disk: the replica loop, and
///   everything waiting on it, waits with it); at most every other such interval (`beforeSync`).
public final class FaultSwitch: Sendable {
    public struct Faults: Sendable, Equatable {
        public var dropPeers: Set<UInt64> = []
        public var peerDelayMilliseconds = 0
        public var diskDelayMilliseconds = 0

        public init(dropPeers: Set<UInt64> = [], peerDelayMilliseconds: Int = 0, diskDelayMilliseconds: Int = 0) {
            self.dropPeers = dropPeers
            self.peerDelayMilliseconds = peerDelayMilliseconds
            self.diskDelayMilliseconds = diskDelayMilliseconds
        }

        public var isEmpty: Bool { dropPeers.isEmpty && peerDelayMilliseconds == 0 && diskDelayMilliseconds == 0 }

        /// `{"drop_peers":[…],"peer_delay_ms":…,"disk_delay_ms":…}` (ids sorted).
        public var json: String {
            #"{"drop_peers":[\#(dropPeers.sorted().map(String.init).joined(separator: ","))],"peer_delay_ms":\#(peerDelayMilliseconds),"disk_delay_ms":\#(diskDelayMilliseconds)}"#
        }
    }

    /// Why a fault request was refused (HTTP 400 with this message).
    public struct RequestError: Error, Sendable, CustomStringConvertible {
        public let description: String
    }

    /// The longest delay a request may set: long enough to cost elections, short enough that a
    /// forgotten fault cannot wedge a node for minutes.
    public static let maxDelayMilliseconds = 10_000

    private let active = Atomic<Bool>(false)
    /// The faults, and when the next disk delay may begin (monotonic nanoseconds).
    private let state = Mutex<(faults: Faults, nextDiskDelay: UInt64)>((Faults(), 0))
    private let droppedMessages = Counter(label: "banyan_fault_dropped_peer_messages_total")
    private let activeGauge = Gauge(label: "banyan_fault_injection_active")

    public init() {}

    public var current: Faults { state.withLock { $0.faults } }

    /// Replaces the faults.
    public func set(_ faults: Faults) {
        state.withLock { s in
            s.faults = faults
            active.store(!faults.isEmpty, ordering: .releasing)
        }
        activeGauge.record(faults.isEmpty ? 0 : 1)
    }

    /// Applies a request body: each field present replaces that fault, absent ones stay; an
    /// empty body changes nothing. Returns the faults now in force.
    public func update(json body: [UInt8]) throws(RequestError) -> Faults {
        var next = current
        guard !body.isEmpty else { return next }
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
            throw RequestError(description: #"expected a JSON object such as {"drop_peers": [3], "peer_delay_ms": 200, "disk_delay_ms": 50}"#)
        }
        for key in object.keys where !["drop_peers", "peer_delay_ms", "disk_delay_ms"].contains(key) {
            throw RequestError(description: "unknown fault '\(key)' (expected drop_peers, peer_delay_ms, disk_delay_ms)")
        }
        if let value = object["drop_peers"] {
            guard let list = value as? [Any], list.count <= 64 else { throw RequestError(description: "drop_peers must be a list of node ids") }
            var ids: Set<UInt64> = []
            for item in list {
                guard let number = item as? NSNumber, let id = UInt64(exactly: number.doubleValue), id != 0 else {
                    throw RequestError(description: "drop_peers must be a list of node ids, not \(item)")
                }
                ids.insert(id)
            }
            next.dropPeers = ids
        }
        for (key, path) in [("peer_delay_ms", \Faults.peerDelayMilliseconds), ("disk_delay_ms", \Faults.diskDelayMilliseconds)] {
            guard let value = object[key] else { continue }
            guard let number = value as? NSNumber, let ms = Int(exactly: number.doubleValue), (0...Self.maxDelayMilliseconds).contains(ms) else {
                throw RequestError(description: "\(key) must be a whole number of milliseconds from 0 to \(Self.maxDelayMilliseconds)")
            }
            next[keyPath: path] = ms
        }
        set(next)
        return next
    }

    // MARK: - The paths (one atomic read while no fault is set)

    /// Whether traffic with `peer` is dropped.
    @inline(__always)
    func drops(_ peer: UInt64) -> Bool {
        guard active.load(ordering: .acquiring) else { return false }
        return state.withLock { $0.faults.dropPeers.contains(peer) }
    }

    /// Counts messages dropped by a partition.
    func dropped(_ count: Int) { droppedMessages.increment(by: count) }

    /// The delay before an outbound peer message is queued (0: none).
    @inline(__always)
    var peerDelayMilliseconds: Int {
        guard active.load(ordering: .acquiring) else { return 0 }
        return state.withLock { $0.faults.peerDelayMilliseconds }
    }

    /// Waits out the disk delay, if one is set (on the thread that is about to fsync), at most
    /// every other delay's length: after a delay of D, fsyncs in the next D go straight to the
    /// disk. A delay on every fsync would keep a busy node's replica loop asleep all the time,
    /// and its event loop would never get back to its sockets (on a one-thread node not even
    /// to the client port, so the fault could not be cleared). Writes still wait D or more.
    func beforeSync() {
        guard active.load(ordering: .acquiring) else { return }
        let now = DispatchTime.now().uptimeNanoseconds
        let ms: Int = state.withLock { s in
            guard s.faults.diskDelayMilliseconds > 0, now >= s.nextDiskDelay else { return 0 }
            return s.faults.diskDelayMilliseconds
        }
        guard ms > 0 else { return }
        usleep(useconds_t(ms) * 1_000)
        state.withLock { $0.nextDiskDelay = DispatchTime.now().uptimeNanoseconds + UInt64(ms) * 1_000_000 }
    }
}

/// The real file system with the fault switch's disk delay before every sync (installed only on
/// a node started with `--allow-fault-injection`).
final class FaultInjectingFileSystem: FileSystem {
    private let base: any FileSystem
    private let faults: FaultSwitch

    init(base: any FileSystem, faults: FaultSwitch) {
        self.base = base
        self.faults = faults
    }

    func makeDirectory(_ path: String) throws(FileSystemError) { try base.makeDirectory(path) }
    func list(_ directory: String) throws(FileSystemError) -> [String] { try base.list(directory) }
    func exists(_ path: String) -> Bool { base.exists(path) }
    func create(_ path: String) throws(FileSystemError) -> FileID { try base.create(path) }
    func open(_ path: String) throws(FileSystemError) -> FileID { try base.open(path) }
    func append(_ file: FileID, _ bytes: [UInt8]) throws(FileSystemError) { try base.append(file, bytes) }
    func write(_ file: FileID, at offset: Int, _ bytes: [UInt8]) throws(FileSystemError) { try base.write(file, at: offset, bytes) }
    func sync(_ file: FileID) throws(FileSystemError) {
        faults.beforeSync()
        try base.sync(file)
    }
    func dropCache(_ path: String) throws(FileSystemError) { try base.dropCache(path) }
    func truncate(_ file: FileID, to size: Int) throws(FileSystemError) { try base.truncate(file, to: size) }
    func size(_ file: FileID) throws(FileSystemError) -> Int { try base.size(file) }
    func close(_ file: FileID) { base.close(file) }
    func readAll(_ path: String) throws(FileSystemError) -> [UInt8] { try base.readAll(path) }
    func fileSize(_ path: String) throws(FileSystemError) -> Int { try base.fileSize(path) }
    func read(_ path: String, offset: Int, count: Int) throws(FileSystemError) -> [UInt8] { try base.read(path, offset: offset, count: count) }
    func rename(_ from: String, to: String) throws(FileSystemError) { try base.rename(from, to: to) }
    func remove(_ path: String) throws(FileSystemError) { try base.remove(path) }
    func syncDirectory(_ directory: String) throws(FileSystemError) {
        faults.beforeSync()
        try base.syncDirectory(directory)
    }
}
