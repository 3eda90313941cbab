import ArgumentParser
import BanyanOps
import BanyanServer
import Dispatch
import Foundation
import NIOCore
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `banyan cluster …`: a local development cluster, and membership changes on a running one.
struct Cluster: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a local cluster, change a running cluster's membership, roll restarts, reload certificates.",
        subcommands: [
            ClusterLocal.self, ClusterAdd.self, ClusterRemove.self, ClusterTransfer.self, ClusterRoll.self, ClusterReloadTLS.self, ClusterTLS.self,
        ])
}

/// `banyan cluster local --nodes 3`: starts N `banyan serve` processes on loopback that form one
/// cluster, sharing one development CA, and stops them on Ctrl-C.
struct ClusterLocal: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "local",
        abstract: "Start an N-node cluster on loopback for development and failover testing.",
        discussion: """
            Node i (from 1) keeps its data in <dir>/node<i>, serves clients on 127.0.0.1:<client-port + i - 1> \
            and peers on 127.0.0.1:<peer-port + i - 1>. Each node is its own process: kill -9 one to \
            watch the cluster fail over, then start it again with the command this prints. The nodes \
            accept fault requests (--allow-fault-injection) and <dir>/cluster-state.json records their \
            pids and restart arguments, for `banyan chaos` from another shell (docs/chaos.md).
            """)

    @Option(name: .long, help: "Number of nodes (1 to 9).")
    var nodes: Int = 3

    @Option(name: .long, help: "Base directory for the nodes' data and the shared development CA.")
    var dir: String = "./banyan-local"

    @Option(name: .long, help: "Client port of node 1.")
    var clientPort: Int = 9000

    @Option(name: .long, help: "Peer port of node 1.")
    var peerPort: Int = 7000

    @Option(name: .long, help: "Log level for the nodes.")
    var logLevel: String = "notice"

    @Flag(name: .long, help: "Start the nodes without --allow-fault-injection (banyan chaos can then only kill, pause and restart them).")
    var noFaultInjection = false

    @Option(name: .long, help: "Each node's election timeout in ticks (--election-ticks of banyan serve; default 10). On a machine with two cores or fewer, three nodes and a workload starve each other of CPU and a leader's late heartbeats cause elections: 50 (1-2 s) rides through that (docs/chaos.md).")
    var electionTicks: Int?

    @Option(name: .long, help: "Each node's outbound connections per peer (--peer-lanes of banyan serve; default 2).")
    var peerLanes: Int?

    func validate() throws {
        guard (1...9).contains(nodes) else { throw ValidationError("--nodes must be between 1 and 9") }
        guard (1...65000).contains(clientPort), (1...65000).contains(peerPort) else { throw ValidationError("ports must be between 1 and 65000") }
        if let electionTicks, !(2...10_000).contains(electionTicks) { throw ValidationError("--election-ticks must be between 2 and 10000") }
        if let peerLanes, !(1...2).contains(peerLanes) { throw ValidationError("--peer-lanes must be 1 or 2") }
    }

    func run() throws {
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
        // Absolute paths: `banyan chaos` restarts nodes from other shells and directories.
        let dir = URL(fileURLWithPath: self.dir).standardizedFileURL.path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        if let existing = try? ClusterStateFile.read(directory: dir), existing.supervisorPID != getpid(),
            ProcessProbe.state(existing.supervisorPID) != .exited,
            existing.nodes.contains(where: { ProcessProbe.state(of: $0) != .exited })
        {
            throw CommandError("a local cluster already runs from \(dir) (banyan cluster local, pid \(existing.supervisorPID)); stop it first")
        }
        let members = (1...nodes).map { "--initial-member=\($0)=127.0.0.1:\(peerPort + $0 - 1)" }
        var processes: [Process] = []
        var state = ClusterStateFile(clusterID: "banyan-local", supervisorPID: getpid(), executable: executable, nodes: [])
        for i in 1...nodes {
            let args =
                [
                    "serve", "--node-id", "\(i)", "--cluster-id", "banyan-local", "--data-dir", "\(dir)/node\(i)",
                    "--listen", "127.0.0.1:\(clientPort + i - 1)", "--peer-listen", "127.0.0.1:\(peerPort + i - 1)",
                    "--tls-dir", "\(dir)/certs", "--log-level", logLevel,
                ] + (noFaultInjection ? [] : ["--allow-fault-injection"]) + (electionTicks.map { ["--election-ticks", "\($0)"] } ?? [])
                + (peerLanes.map { ["--peer-lanes", "\($0)"] } ?? []) + members
            let p = Process()
            p.executableURL = URL(fileURLWithPath: executable)
            // A node's first start founds the cluster; later starts (and the restart command
            // printed below) must not, so a wiped node cannot found it again.
            let firstStart = !FileManager.default.fileExists(atPath: "\(dir)/node\(i)")
            p.arguments = args + (firstStart ? ["--new-cluster"] : [])
            try p.run()
            processes.append(p)
            state.nodes.append(
                ClusterStateFile.Node(
                    id: UInt64(i), pid: p.processIdentifier, clientAddress: "127.0.0.1:\(clientPort + i - 1)", peerAddress: "127.0.0.1:\(peerPort + i - 1)",
                    dataDirectory: "\(dir)/node\(i)", arguments: args, log: "\(dir)/node\(i).log"))
            try ClusterStateFile.locked(directory: dir) { try state.write(directory: dir) }
            print("node \(i): pid \(p.processIdentifier), http://127.0.0.1:\(clientPort + i - 1)  (restart: banyan \(args.joined(separator: " ")))")
            // The first node creates the shared CA; give it a moment so the others reuse it.
            if i == 1 { Thread.sleep(forTimeInterval: 1.0) }
        }
        print("cluster running; state for banyan chaos in \(ClusterStateFile.path(in: dir)); Ctrl-C stops every node (restarted ones too)")
        waitForTerminationSignal()
        stopNodes(directory: dir, started: processes)
    }

    /// Stops every node of the state file (those `banyan chaos` restarted included: they are not
    /// this process's children) and the ones started here: SIGCONT (a paused node must see the
    /// SIGTERM), SIGTERM, and SIGKILL for any still running after 20 s.
    func stopNodes(directory dir: String, started: [Process]) {
        let recorded = (try? ClusterStateFile.read(directory: dir))?.nodes ?? []
        var pids: [Int32] = recorded.filter { ProcessProbe.state(of: $0) != .exited }.map(\.pid)
        for p in started where p.isRunning && !pids.contains(p.processIdentifier) { pids.append(p.processIdentifier) }
        for pid in pids {
            kill(pid, SIGCONT)
            kill(pid, SIGTERM)
        }
        let deadline = Date().addingTimeInterval(20)
        func running() -> [Int32] {
            pids.filter { pid in
                if let p = started.first(where: { $0.processIdentifier == pid }) { return p.isRunning }
                return ProcessProbe.state(pid) != .exited
            }
        }
        while !running().isEmpty && Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
        for pid in running() {
            print("node pid \(pid) still runs 20 s after SIGTERM: SIGKILL")
            kill(pid, SIGKILL)
        }
        for p in started { p.waitUntilExit() }
        try? FileManager.default.removeItem(atPath: ClusterStateFile.path(in: dir))
        print("every node stopped")
    }
}

/// Sends one operator request to a node's client API and prints the JSON answer.
struct AdminClient {
    let endpoint: String
    /// The bearer token to send (default: the operator token from the environment, if any).
    var token: String?

    init(endpoint: String, token: String? = nil) {
        self.endpoint = endpoint
        self.token = token
    }

    func call(_ method: String, _ path: String, body: String? = nil) throws -> (status: Int, body: String) {
        let answer = try fetch(method, path, body: body)
        return (answer.status, String(decoding: answer.body, as: UTF8.self))
    }

    /// As `call`, with the body as bytes and the response headers (names lowercased).
    func fetch(_ method: String, _ path: String, body: String? = nil) throws -> (status: Int, body: Data, headers: [String: String]) {
        guard let url = URL(string: endpoint.hasPrefix("http") ? endpoint + path : "http://" + endpoint + path) else {
            throw ValidationError("bad endpoint '\(endpoint)'")
        }
        var request = URLRequest(url: url, timeoutInterval: 30)
        request.httpMethod = method
        if let token = try token ?? AdminClient.operatorToken() {
            AdminClient.warnIfTokenInClear(url)
            request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        }
        // State-changing operator requests must say they are JSON (docs/security.md).
        if method != "GET" { request.setValue("application/json", forHTTPHeaderField: "Content-Type") }
        if let body { request.httpBody = Data(body.utf8) }
        if url.scheme?.lowercased() == "https", let ca = TrustedCARequest.caFile {
            // A private CA: Foundation cannot be told to trust it (TrustedCARequest).
            var received = Data()
            let headers = (request.allHTTPHeaderFields ?? [:]).map { ($0.key, $0.value) }
            let answer = try TrustedCARequest.perform(url, method: method, headers: headers, body: request.httpBody, caFile: ca, timeout: .seconds(30)) { _, buffer in
                guard received.count + buffer.readableBytes <= 64 << 20 else { throw CommandError("\(endpoint) answered more than 64 MiB") }
                received.append(contentsOf: buffer.readableBytesView)
            }
            return (answer.status, received, answer.headers)
        }
        let done = DispatchSemaphore(value: 0)
        let box = ResponseBox()
        URLSession.shared.dataTask(with: request) { data, response, error in
            var headers: [String: String] = [:]
            for (k, v) in (response as? HTTPURLResponse)?.allHeaderFields ?? [:] {
                if let k = k as? String, let v = v as? String { headers[k.lowercased()] = v }
            }
            box.set(status: (response as? HTTPURLResponse)?.statusCode, body: data ?? Data(), headers: headers, error: error?.localizedDescription)
            done.signal()
        }.resume()
        done.wait()
        let (status, body, headers, error) = box.get()
        if let error { throw CommandError("cannot reach \(endpoint): \(error)") }
        guard let status else { throw CommandError("no answer from \(endpoint)") }
        return (status, body, headers)
    }
}

extension AdminClient {
    /// The hosts already warned about (one warning each per process).
    private final class WarnedHosts: @unchecked Sendable {
        private let lock = NSLock()
        private var hosts: Set<String> = []
        func insert(_ host: String) -> Bool { lock.withLock { hosts.insert(host).inserted } }
    }
    private static let warned = WarnedHosts()

    /// Says once per host, on stderr, that the operator token is about to cross the network
    /// unencrypted: an `http://` endpoint that is not loopback (docs/operations.md, "Operator
    /// commands over the network").
    static func warnIfTokenInClear(_ url: URL) {
        guard url.scheme?.lowercased() == "http", let host = url.host, !isLoopbackHost(host) else { return }
        let first = warned.insert(host)
        guard first else { return }
        FileHandle.standardError.write(
            Data("warning: the operator token goes to \(host) over plain HTTP (readable on the network): serve the client port with TLS (http.tls_cert) and give https://\(host):… as the endpoint, or run the command on the node itself\n".utf8))
    }

    static func isLoopbackHost(_ host: String) -> Bool {
        let h = host.trimmingCharacters(in: CharacterSet(charactersIn: "[]")).lowercased()
        return h == "localhost" || h == "::1" || h.hasPrefix("127.")
    }

    /// The operator token for membership and transfer requests: `BANYAN_ADMIN_TOKEN`, or the first
    /// line of the file named by `BANYAN_ADMIN_TOKEN_FILE` (the node's `admin_token_file`).
    static func operatorToken() throws -> String? {
        let env = ProcessInfo.processInfo.environment
        if let token = env["BANYAN_ADMIN_TOKEN"], !token.isEmpty { return token }
        guard let file = env["BANYAN_ADMIN_TOKEN_FILE"] else { return nil }
        guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { throw CommandError("cannot read BANYAN_ADMIN_TOKEN_FILE \(file)") }
        return text.split(whereSeparator: \.isNewline).first.map { $0.trimmingCharacters(in: .whitespaces) }
    }
}

struct EndpointOption: ParsableArguments {
    @Option(name: .long, help: "A node's client address (host:port); leader-only requests are retried at the leader.")
    var endpoint: String = "127.0.0.1:9000"
}

/// Runs a leader-only request: on a 409 from a follower, asks around for the leader using the
/// peers' client addresses learnt from `--endpoints`.
func leaderRequest(_ endpoints: [String], _ method: String, _ path: String, body: String? = nil) throws {
    var last = ""
    for endpoint in endpoints {
        let (status, text) = try AdminClient(endpoint: endpoint).call(method, path, body: body)
        if status == 200 {
            print(text)
            return
        }
        last = "\(endpoint): \(status) \(text)"
        if status != 409 { break }
    }
    throw CommandError("request failed: \(last)")
}

struct ClusterAdd: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "add", abstract: "Add a node (started with --join) as a learner; it is promoted once caught up.")
    @Option(name: .long, help: "Client addresses of members to try, in order (the leader answers).")
    var endpoints: [String] = ["127.0.0.1:9000"]
    @Option(name: .long, help: "The new node's id.") var id: UInt64
    @Option(name: .long, help: "The new node's peer address, host:port.") var peerAddress: String

    func run() throws {
        try leaderRequest(endpoints, "POST", "/.banyan/members", body: #"{"id":\#(id),"peer_address":"\#(peerAddress)"}"#)
    }
}

struct ClusterRemove: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "remove", abstract: "Remove a member (the leader included).")
    @Option(name: .long, help: "Client addresses of members to try, in order (the leader answers).")
    var endpoints: [String] = ["127.0.0.1:9000"]
    @Option(name: .long, help: "The id of the node to remove.") var id: UInt64

    func run() throws { try leaderRequest(endpoints, "DELETE", "/.banyan/members/\(id)") }
}

struct ClusterTransfer: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "transfer", abstract: "Hand leadership to another voter.")
    @Option(name: .long, help: "Client addresses of members to try, in order (the leader answers).")
    var endpoints: [String] = ["127.0.0.1:9000"]
    @Option(name: .long, help: "The node that should lead.") var to: UInt64

    func run() throws { try leaderRequest(endpoints, "POST", "/.banyan/transfer?to=\(to)") }
}

/// `banyan status`: a node's role, term, leader, indexes, members and replication progress.
struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show a running node's Raft status (GET /.banyan/status).")
    @OptionGroup var endpoint: EndpointOption

    func run() throws {
        let (status, text) = try AdminClient(endpoint: endpoint.endpoint).call("GET", "/.banyan/status")
        guard status == 200 else { throw CommandError("status request failed: \(status) \(text)") }
        print(text)
    }
}

/// Hands a URLSession answer from its callback thread to the waiting caller.
final class ResponseBox: @unchecked Sendable {
    private let lock = NSLock()
    private var value: (Int?, Data, [String: String], String?) = (nil, Data(), [:], nil)
    func set(status: Int?, body: Data, headers: [String: String], error: String?) { lock.withLock { value = (status, body, headers, error) } }
    func get() -> (Int?, Data, [String: String], String?) { lock.withLock { value } }
}

/// `banyan drain`: moves a node's realtime clients to other nodes (docs/realtime.md, "Draining a
/// node") and shows them leaving until none is left; `--stop` ends draining.
struct Drain: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Move a node's realtime clients to other nodes (the protocol's reset), then wait until none is left.",
        discussion: """
            The node answers 503 on /.banyan/ready while it drains (so load balancers stop sending it clients), \
            tells its open realtime connections to reconnect to another node, and sends new ones on before their hello. \
            Without --to, clients go to the client addresses the other members published. --stop ends draining.
            """)
    @OptionGroup var endpoint: EndpointOption
    @Option(name: .long, help: "A node to send clients to, host:port (repeat; default: the other members' published client addresses).")
    var to: [String] = []
    @Option(name: .long, help: "Seconds to wait for the connections to leave (0: do not wait).")
    var timeout: Int = 120
    @Flag(name: .long, help: "Stop draining: the node takes realtime clients again.")
    var stop = false

    func validate() throws {
        for target in to where (try? HostPort(parsing: target)) == nil { throw ValidationError("--to must be host:port, not '\(target)'") }
        guard (0...86_400).contains(timeout) else { throw ValidationError("--timeout must be 0 to 86400 seconds") }
    }

    func run() throws {
        let client = AdminClient(endpoint: endpoint.endpoint)
        if stop {
            let (status, text) = try client.call("DELETE", "/.banyan/drain")
            guard status == 200 else { throw CommandError("\(endpoint.endpoint): \(status) \(text)") }
            print("\(endpoint.endpoint): draining stopped")
            return
        }
        let body = to.isEmpty ? nil : "{\"to\":[" + to.map { "\"\($0)\"" }.joined(separator: ",") + "]}"
        let (status, text) = try client.call("POST", "/.banyan/drain", body: body)
        guard status == 200 else { throw CommandError("\(endpoint.endpoint): \(status) \(text)") }
        print(text)
        guard timeout > 0 else { return }
        let deadline = Date().addingTimeInterval(TimeInterval(timeout))
        var last = -1
        while true {
            let (code, state) = try client.call("GET", "/.banyan/drain")
            guard code == 200, let data = state.data(using: .utf8),
                let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
                let left = (object["connections"] as? NSNumber)?.intValue
            else { throw CommandError("\(endpoint.endpoint): unexpected answer \(code) \(state)") }
            if left != last {
                print("\(endpoint.endpoint): \(left) realtime connection\(left == 1 ? "" : "s") left")
                last = left
            }
            if left == 0 {
                print("\(endpoint.endpoint): drained (it keeps sending new realtime clients on until `banyan drain --stop`)")
                return
            }
            guard Date() < deadline else { throw CommandError("\(endpoint.endpoint): \(left) realtime connections still open after \(timeout) s") }
            Thread.sleep(forTimeInterval: 0.5)
        }
    }
}
