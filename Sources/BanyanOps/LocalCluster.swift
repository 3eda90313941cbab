public import Foundation
public import NIOHTTP1
public import NIOPosix
public import NIOSSL
import NIOCore

/// What a client workload needs of a cluster: one request to node `id`.
public protocol NodeRequester: Sendable {
    /// One request to node `id` on a fresh connection, answered within `timeout` seconds.
    func perform(_ id: UInt64, _ method: HTTPMethod, _ uri: String, headers: [(String, String)], body: String?, timeout: Int64) async throws
        -> HTTPResult
}

extension NodeRequester {
    public func request(
        _ id: UInt64, _ method: HTTPMethod, _ uri: String, headers: [(String, String)] = [], body: String? = nil, timeout: Int64 = 5
    ) async throws -> HTTPResult {
        try await perform(id, method, uri, headers: headers, body: body, timeout: timeout)
    }
}

/// Real `banyan serve` processes on loopback, for the multi-process tests and the benchmark:
/// start, kill -9, freeze (SIGSTOP) and thaw (SIGCONT), restart, add and remove nodes.
public final class LocalCluster: NodeRequester, @unchecked Sendable {
    public let executable: String
    public let directory: String
    public let clientPortBase: Int
    public let peerPortBase: Int
    public let group: MultiThreadedEventLoopGroup
    public private(set) var processes: [UInt64: Process] = [:]
    public private(set) var founders: [UInt64]
    /// Founders started at least once: only a founder's first start passes `--new-cluster`, as an
    /// operator would; a later start on a wiped directory therefore waits, voteless.
    private var started: Set<UInt64> = []
    private let logLevel: String
    /// Extra `banyan serve` arguments for every node (e.g. `--config file`).
    public var extraArguments: [String] = []
    /// Extra `banyan serve` arguments for one node (e.g. its own `--config` naming its own
    /// certificate files), after `extraArguments`.
    public var nodeArguments: [UInt64: [String]] = [:]
    /// Set when the nodes serve HTTPS on their client ports (`http.tls_cert`, given through
    /// `extraArguments` or `nodeArguments`): every request here is then made over TLS with this
    /// context, checking the node's certificate by its IP name. Set it before the first request.
    public var clientTLS: NIOSSLContext?

    /// `executable` is the `banyan` binary; node i uses ports base + i.
    public init(executable: String, directory: String, nodes: Int, clientPortBase: Int, peerPortBase: Int, logLevel: String = "notice") {
        self.executable = executable
        self.directory = directory
        self.clientPortBase = clientPortBase
        self.peerPortBase = peerPortBase
        self.founders = (1...UInt64(nodes)).map { $0 }
        self.logLevel = logLevel
        self.group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
    }

    public func clientPort(_ id: UInt64) -> Int { clientPortBase + Int(id) }
    /// Node `id`'s client endpoint as the `banyan` commands take it (`https://` with `clientTLS`).
    public func endpoint(_ id: UInt64) -> String { (clientTLS == nil ? "" : "https://") + "127.0.0.1:\(clientPort(id))" }
    public func peerPort(_ id: UInt64) -> Int { peerPortBase + Int(id) }
    public func dataDirectory(_ id: UInt64) -> String { "\(directory)/node\(id)" }
    public var ids: [UInt64] { processes.keys.sorted() }

    /// Starts node `id` (a founder, or with `join` a blank node waiting to be added).
    public func start(_ id: UInt64, join: Bool = false) throws {
        let args = arguments(id, join: join, firstStart: !started.contains(id))
        started.insert(id)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = args
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let log = "\(directory)/node\(id).log"
        if !FileManager.default.fileExists(atPath: log) { FileManager.default.createFile(atPath: log, contents: nil) }
        if let handle = FileHandle(forWritingAtPath: log) {
            handle.seekToEndOfFile()
            p.standardError = handle
            p.standardOutput = handle
        }
        try p.run()
        processes[id] = p
    }

    /// The `banyan serve` arguments of node `id` (`firstStart`: a founder's first start, which
    /// founds the cluster with `--new-cluster`). A restart script outside this object uses
    /// `arguments(id, firstStart: false)`.
    public func arguments(_ id: UInt64, join: Bool = false, firstStart: Bool) -> [String] {
        var args = [
            "serve", "--node-id", "\(id)", "--cluster-id", "banyan-test", "--data-dir", dataDirectory(id),
            "--listen", "127.0.0.1:\(clientPort(id))", "--peer-listen", "127.0.0.1:\(peerPort(id))", "--tls-dir", "\(directory)/certs",
            "--log-level", logLevel,
        ]
        args += extraArguments + (nodeArguments[id] ?? [])
        if join {
            args.append("--join")
        } else {
            args += founders.map { "--initial-member=\($0)=127.0.0.1:\(peerPort($0))" }
            if firstStart { args.append("--new-cluster") }
        }
        return args
    }

    public func pid(_ id: UInt64) -> Int32? { processes[id]?.processIdentifier }

    /// Whether node `id`'s process is still running.
    public func isRunning(_ id: UInt64) -> Bool { processes[id]?.isRunning ?? false }

    public func signal(_ id: UInt64, _ sig: Int32) {
        if let p = processes[id] { kill(p.processIdentifier, sig) }
    }

    /// kill -9, and reap.
    public func kill9(_ id: UInt64) {
        guard let p = processes[id] else { return }
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
        processes[id] = nil
    }

    public func stopAll() {
        for (_, p) in processes where p.isRunning {
            kill(p.processIdentifier, SIGCONT)
            p.terminate()
        }
        for (_, p) in processes { p.waitUntilExit() }
        processes = [:]
    }

    public func shutdown() {
        stopAll()
        try? group.syncShutdownGracefully()
    }

    /// One request to node `id` on a fresh connection (a new TLS handshake with `clientTLS`).
    public func request(
        _ id: UInt64, _ method: HTTPMethod, _ uri: String, headers: [(String, String)] = [], body: String? = nil, timeout: Int64 = 5
    ) async throws -> HTTPResult {
        let c = try await connect(id)
        defer { c.close() }
        return try await c.send(method, uri, headers: headers, body: body.map { Array($0.utf8) }, timeout: .seconds(timeout))
    }

    /// A new connection to node `id`'s client port (over TLS with `clientTLS`).
    public func connect(_ id: UInt64) async throws -> HTTPConnection {
        try await HTTPConnection.connect(host: "127.0.0.1", port: clientPort(id), group: group, tls: clientTLS)
    }

    public func perform(
        _ id: UInt64, _ method: HTTPMethod, _ uri: String, headers: [(String, String)], body: String?, timeout: Int64
    ) async throws -> HTTPResult {
        try await request(id, method, uri, headers: headers, body: body, timeout: timeout)
    }

    /// The node's status JSON, or nil when it does not answer.
    public func status(_ id: UInt64) async -> [String: Any]? {
        guard let r = try? await request(id, .GET, "/.banyan/status", timeout: 2), r.status == 200 else { return nil }
        return (try? JSONSerialization.jsonObject(with: Data(r.body))) as? [String: Any]
    }

    /// Waits until some node reports itself leader (among `among`); returns its id.
    public func waitForLeader(among: [UInt64]? = nil, timeout: Double = 20) async throws -> UInt64 {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            for id in among ?? ids {
                if let s = await status(id), s["role"] as? String == "leader", let nodeID = (s["node_id"] as? NSNumber)?.uint64Value {
                    return nodeID
                }
            }
            try await Task.sleep(nanoseconds: 50_000_000)
        }
        throw HTTPClientError("no leader within \(timeout) s")
    }
}
