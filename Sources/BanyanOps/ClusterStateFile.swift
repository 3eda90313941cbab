public import Foundation

/// What `banyan cluster local` publishes in its directory for `banyan chaos` (docs/chaos.md,
/// "State"): every node's process id, addresses, data directory and the exact arguments that
/// start it again (never `--new-cluster`), and the faults chaos has set on it, so that a
/// restarted node gets them back. Written atomically (a temporary file, then a rename) under an
/// exclusive `flock` on `cluster-state.lock`, by the supervisor at start and by every chaos
/// command that changes a node; read by both.
public struct ClusterStateFile: Codable, Sendable, Equatable {
    public static let fileName = "cluster-state.json"
    public static let lockName = "cluster-state.lock"
    public static let currentVersion = 1

    public var version = ClusterStateFile.currentVersion
    public var clusterID: String
    /// The `banyan cluster local` process: it stops every node listed here on Ctrl-C or SIGTERM.
    public var supervisorPID: Int32
    /// The `banyan` binary the nodes run.
    public var executable: String
    public var nodes: [Node]

    enum CodingKeys: String, CodingKey {
        case version, executable, nodes
        case clusterID = "cluster_id"
        case supervisorPID = "supervisor_pid"
    }

    public struct Node: Codable, Sendable, Equatable {
        enum CodingKeys: String, CodingKey {
            case id, pid, arguments, log, starts, faults
            case clientAddress = "client_address"
            case peerAddress = "peer_address"
            case dataDirectory = "data_directory"
        }

        public var id: UInt64
        /// The process now running this node (it may have exited since: see `ProcessProbe`).
        public var pid: Int32
        public var clientAddress: String
        public var peerAddress: String
        public var dataDirectory: String
        /// `banyan serve …` exactly as a restart runs it.
        public var arguments: [String]
        /// Where a restarted node's output goes (the first start writes to the supervisor's).
        public var log: String
        /// Starts so far (1 after `cluster local`).
        public var starts: Int
        /// The faults chaos set on this node (applied again after a restart).
        public var faults: NodeFaults

        public init(
            id: UInt64, pid: Int32, clientAddress: String, peerAddress: String, dataDirectory: String, arguments: [String], log: String, starts: Int = 1,
            faults: NodeFaults = NodeFaults()
        ) {
            self.id = id
            self.pid = pid
            self.clientAddress = clientAddress
            self.peerAddress = peerAddress
            self.dataDirectory = dataDirectory
            self.arguments = arguments
            self.log = log
            self.starts = starts
            self.faults = faults
        }
    }

    public init(clusterID: String, supervisorPID: Int32, executable: String, nodes: [Node]) {
        self.clusterID = clusterID
        self.supervisorPID = supervisorPID
        self.executable = executable
        self.nodes = nodes
    }

    public func node(_ id: UInt64) throws(ChaosError) -> Node {
        guard let n = nodes.first(where: { $0.id == id }) else {
            throw ChaosError("no node \(id) in this cluster (nodes: \(nodes.map { "\($0.id)" }.joined(separator: ", ")))")
        }
        return n
    }

    public var ids: [UInt64] { nodes.map(\.id) }

    // MARK: - Reading and writing

    public static func path(in directory: String) -> String { directory + "/" + fileName }

    public static func read(directory: String) throws(ChaosError) -> ClusterStateFile {
        let path = path(in: directory)
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ChaosError("no \(fileName) in \(directory): start the cluster with `banyan cluster local --dir \(directory)` first")
        }
        let decoder = JSONDecoder()
        let state: ClusterStateFile
        do {
            state = try decoder.decode(ClusterStateFile.self, from: data)
        } catch {
            throw ChaosError("\(path) is unreadable: \(error)")
        }
        guard state.version == currentVersion else {
            throw ChaosError("\(path) has version \(state.version); this banyan reads version \(currentVersion)")
        }
        return state
    }

    public func write(directory: String) throws(ChaosError) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        let path = Self.path(in: directory)
        let temporary = path + ".tmp"
        do {
            try encoder.encode(self).write(to: URL(fileURLWithPath: temporary))
            guard rename(temporary, path) == 0 else { throw ChaosError("rename failed: \(String(cString: strerror(errno)))") }
        } catch {
            throw ChaosError("cannot write \(path): \(error)")
        }
    }

    /// Reads, changes and writes the state under the directory's lock (chaos commands and the
    /// supervisor may run at once).
    @discardableResult
    public static func update<T>(directory: String, _ change: (inout ClusterStateFile) throws -> T) throws -> T {
        try locked(directory: directory) {
            var state = try read(directory: directory)
            let result = try change(&state)
            try state.write(directory: directory)
            return result
        }
    }

    /// Runs `body` holding the directory's exclusive lock.
    public static func locked<T>(directory: String, _ body: () throws -> T) throws -> T {
        let path = directory + "/" + lockName
        let fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw ChaosError("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        guard flock(fd, LOCK_EX) == 0 else { throw ChaosError("cannot lock \(path): \(String(cString: strerror(errno)))") }
        defer { flock(fd, LOCK_UN) }
        return try body()
    }
}

/// The faults chaos asks a node's fault switch for (`/.banyan/faults`; docs/chaos.md).
public struct NodeFaults: Codable, Sendable, Equatable {
    enum CodingKeys: String, CodingKey {
        case dropPeers = "drop_peers"
        case peerDelayMs = "peer_delay_ms"
        case diskDelayMs = "disk_delay_ms"
    }

    public var dropPeers: [UInt64] = []
    public var peerDelayMs = 0
    public var diskDelayMs = 0

    public init(dropPeers: [UInt64] = [], peerDelayMs: Int = 0, diskDelayMs: Int = 0) {
        self.dropPeers = dropPeers
        self.peerDelayMs = peerDelayMs
        self.diskDelayMs = diskDelayMs
    }

    public var isEmpty: Bool { dropPeers.isEmpty && peerDelayMs == 0 && diskDelayMs == 0 }

    /// The request body that sets exactly these faults.
    public var json: String {
        #"{"drop_peers":[\#(dropPeers.sorted().map(String.init).joined(separator: ","))],"peer_delay_ms":\#(peerDelayMs),"disk_delay_ms":\#(diskDelayMs)}"#
    }

    public var summary: String {
        var parts: [String] = []
        if !dropPeers.isEmpty { parts.append("drops traffic with \(dropPeers.sorted().map { "\($0)" }.joined(separator: ","))") }
        if peerDelayMs > 0 { parts.append("peer messages +\(peerDelayMs) ms") }
        if diskDelayMs > 0 { parts.append("fsyncs +\(diskDelayMs) ms") }
        return parts.isEmpty ? "none" : parts.joined(separator: "; ")
    }
}

/// A chaos command that cannot do what it was asked, with the reason.
public struct ChaosError: Error, Sendable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// What `/proc` says about a process (Linux).
public enum ProcessProbe {
    public enum State: String, Sendable {
        case running
        /// Stopped by SIGSTOP.
        case paused
        /// Gone, or a zombie waiting to be reaped.
        case exited
    }

    public static func state(_ pid: Int32) -> State {
        guard pid > 0, let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")")
        else { return .exited }
        let rest = text[text.index(after: close)...].drop { $0 == " " }
        switch rest.first {
        case "T", "t": return .paused
        case "Z", "X", "x", nil: return .exited
        default: return .running
        }
    }

    /// Whether `pid` is a `banyan serve` of this data directory (a recorded pid may have been
    /// reused by another process since; chaos never signals one that is not the node).
    public static func isNode(_ pid: Int32, dataDirectory: String) -> Bool {
        guard pid > 0, let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return false }
        let args = data.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        guard args.contains("serve") else { return false }
        for (i, arg) in args.enumerated() {
            if arg == "--data-dir", i + 1 < args.count, args[i + 1] == dataDirectory { return true }
            if arg == "--data-dir=" + dataDirectory { return true }
        }
        return false
    }

    /// The state of the recorded node process: `exited` also when the pid is another program.
    public static func state(of node: ClusterStateFile.Node) -> State {
        let s = state(node.pid)
        return s != .exited && isNode(node.pid, dataDirectory: node.dataDirectory) ? s : .exited
    }

    /// Starts `executable` with `arguments` in a process group of its own (a Ctrl-C meant for
    /// the command that started it does not reach it), output appended to `log`, standard input
    /// from /dev/null, no other descriptor inherited, SIGINT and SIGTERM at their defaults.
    /// Returns the pid.
    public static func spawnDetached(executable: String, arguments: [String], log: String) throws(ChaosError) -> Int32 {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        // Nothing else of this process (its sockets, a pipe a caller reads to its end) lives on
        // in the node.
        let open = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []).compactMap { Int32($0) }
        for fd in open where fd > 2 { posix_spawn_file_actions_addclose(&actions, fd) }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        posix_spawnattr_setpgroup(&attributes, 0)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for sig in [SIGINT, SIGTERM, SIGPIPE, SIGHUP] { sigaddset(&defaults, sig) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var mask = sigset_t()
        sigemptyset(&mask)
        posix_spawnattr_setsigmask(&attributes, &mask)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for p in argv { free(p) } }
        var pid: pid_t = 0
        let status = posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
        guard status == 0 else { throw ChaosError("cannot start \(executable): \(String(cString: strerror(status)))") }
        return pid
    }

    /// Waits (polling, at most `seconds`) until `condition` holds; reaps `pid` if it is this
    /// process's child so that it does not linger as a zombie.
    public static func wait(for pid: Int32, seconds: Double, until condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while true {
            var status: Int32 = 0
            _ = waitpid(pid, &status, WNOHANG)
            if condition() { return true }
            if Date() >= deadline { return false }
            usleep(20_000)
        }
    }
}
