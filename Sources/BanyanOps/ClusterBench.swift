public import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// `banyan bench`: measures a real 3-node cluster of `banyan serve` processes on loopback
/// (docs/benchmarks.md): write throughput and latency at several client counts, server CPU per
/// write, leader changes under load, memory per node with 100k keys, and failover time after a
/// leader `kill -9` and after a leader freeze (`SIGSTOP`).
public struct ClusterBench: Sendable {
    public var executable: String
    public var directory: String
    public var clients: [Int] = [1, 16, 64]
    public var seconds: Double = 5
    public var failoverTrials: Int = 10
    public var keys: Int = 100_000
    public var portBase: Int = 19_700
    /// Extra `banyan serve` arguments for every node.
    public var serveArguments: [String] = []
    /// Security rules for the `bench` namespace (set before measuring); each client then writes
    /// with an emulator token naming uid `c<client>`, so every write is judged by them.
    public var rulesText: String?

    public init(executable: String, directory: String) {
        self.executable = executable
        self.directory = directory
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// CPU seconds (user + system) a process has used, from /proc.
    public static func cpuSeconds(_ pid: Int32) -> Double {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")")
        else { return 0 }
        let fields = text[text.index(after: close)...].split(separator: " ")
        // After the command name: state is field 3; utime and stime are fields 14 and 15.
        guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Resident memory of a process in MiB, from /proc.
    public static func residentMiB(_ pid: Int32) -> Double {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            let kb = line.split(separator: " ").compactMap { Double($0) }.first ?? 0
            return kb / 1024
        }
        return 0
    }

    static func percentile(_ sorted: [Double], _ p: Double) -> Double {
        guard !sorted.isEmpty else { return 0 }
        return sorted[min(sorted.count - 1, Int((Double(sorted.count) * p).rounded(.down)))]
    }

    static func ms(_ s: Double) -> String { String(format: "%.2f ms", s * 1000) }

    /// An emulator-style unsigned token (`alg: none`) naming `uid`, as the SDKs' `mockUserToken`.
    static func mockToken(uid: String) -> String {
        func b64(_ text: String) -> String {
            Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                .replacingOccurrences(of: "=", with: "")
        }
        return b64(#"{"alg":"none","typ":"JWT"}"#) + "." + b64(#"{"sub":"\#(uid)","user_id":"\#(uid)"}"#) + "."
    }

    public func run(log: @escaping @Sendable (String) -> Void) async throws {
        try? FileManager.default.removeItem(atPath: directory)
        let cluster = LocalCluster(
            executable: executable, directory: directory, nodes: 3, clientPortBase: portBase, peerPortBase: portBase + 100,
            logLevel: "warning")
        cluster.extraArguments = serveArguments
        defer { cluster.shutdown() }
        for id: UInt64 in [1, 2, 3] { try cluster.start(id) }
        let leader = try await cluster.waitForLeader(timeout: 30)
        // A node that could not bind its ports exits at once, and the leader found may then
        // belong to some other cluster on the same ports: measure only our own nodes.
        for id in cluster.ids where !cluster.isRunning(id) {
            throw Failure(
                description: "node \(id) exited right after starting (ports \(cluster.clientPort(id)) and \(cluster.peerPort(id)) in use by another cluster?); see \(directory)/node\(id).log")
        }
        log("3-node cluster up (leader: node \(leader)); \(ProcessInfo.processInfo.activeProcessorCount) cores")
        if let rulesText {
            let r = try await cluster.request(leader, .PUT, "/.settings/rules.json?ns=bench&auth=owner", body: rulesText, timeout: 10)
            guard r.status == 200 else { throw Failure(description: "setting the rules: \(r.status) \(String(decoding: r.body, as: UTF8.self))") }
            log("rules set on namespace bench (\(rulesText.utf8.count) bytes); clients write as uid c<client>")
        }

        // Throughput and latency.
        for c in clients {
            let termBefore = await term(cluster)
            let cpuBefore = cluster.ids.compactMap(cluster.pid).map(Self.cpuSeconds).reduce(0, +)
            let clientBefore = Self.cpuSeconds(getpid())
            let result = try await writeLoad(cluster, clients: c)
            let cpuAfter = cluster.ids.compactMap(cluster.pid).map(Self.cpuSeconds).reduce(0, +)
            let clientCPU = Self.cpuSeconds(getpid()) - clientBefore
            let termAfter = await term(cluster)
            let sorted = result.latencies.sorted()
            let perWrite = result.writes > 0 ? (cpuAfter - cpuBefore) / Double(result.writes) : 0
            log(
                "writes, \(c) client\(c == 1 ? "" : "s"): \(Int(Double(result.writes) / result.seconds)) writes/s; "
                    + "p50 \(Self.ms(Self.percentile(sorted, 0.5))), p99 \(Self.ms(Self.percentile(sorted, 0.99))); "
                    + "server CPU \(String(format: "%.1f", perWrite * 1e6)) µs/write (3 nodes; load generator \(String(format: "%.2f", clientCPU / result.seconds)) cores); errors \(result.errors); "
                    + "leader changes \(termAfter > termBefore ? "\(termAfter - termBefore) (term \(termBefore)→\(termAfter))" : "0")")
            for (kind, n) in result.errorKinds.sorted(by: { $0.value > $1.value }).prefix(5) { log("    errors: \(n) × \(kind)") }
        }

        // Memory with 100k keys (written in batches of 1,000 through multi-path updates).
        var written = 0
        let batch = 1000
        let conn = try await HTTPConnection.connect(host: "127.0.0.1", port: cluster.clientPort(leader), group: cluster.group)
        while written < keys {
            var body = "{"
            for i in written..<min(keys, written + batch) {
                body += (i > written ? "," : "") + "\"k\(i)\":{\"n\":\(i),\"s\":\"value-\(i)\"}"
            }
            body += "}"
            let r = try await conn.send(.PATCH, "/mem.json?ns=bench&print=silent&auth=owner", body: Array(body.utf8), timeout: .seconds(30))
            guard r.status == 204 || r.status == 200 else { throw Failure(description: "memory load: \(r.status) \(r.text)") }
            written += batch
        }
        conn.close()
        try await Task.sleep(nanoseconds: 2_000_000_000)
        let rss = cluster.ids.compactMap(cluster.pid).map(Self.residentMiB)
        log("memory with \(keys) keys (plus the benchmark's own writes): " + rss.map { String(format: "%.0f MiB", $0) }.joined(separator: ", ") + " per node")

        // Failover.
        for freeze in [false, true] where failoverTrials > 0 {
            var times: [Double] = []
            for trial in 1...failoverTrials {
                let t = try await failover(cluster, freeze: freeze)
                times.append(t)
                log("  \(freeze ? "SIGSTOP" : "kill -9") trial \(trial): \(Self.ms(t)) to the first successful write")
            }
            let sorted = times.sorted()
            log(
                "failover after a leader \(freeze ? "freeze (SIGSTOP)" : "kill -9"), \(failoverTrials) trials: median \(Self.ms(Self.percentile(sorted, 0.5))), "
                    + "max \(Self.ms(sorted.last ?? 0)), all under 1 s: \(sorted.allSatisfy { $0 < 1 })")
        }
    }

    func term(_ cluster: LocalCluster) async -> Int {
        var best = 0
        for id in cluster.ids {
            if let s = await cluster.status(id), let t = (s["term"] as? NSNumber)?.intValue { best = max(best, t) }
        }
        return best
    }

    struct LoadResult: Sendable {
        var writes = 0
        var errors = 0
        var errorKinds: [String: Int] = [:]
        var latencies: [Double] = []
        var seconds: Double = 0
    }

    /// Each client is one keep-alive connection that writes, waits for the answer and writes
    /// again until the run ends. The loop runs on the connection's event loop with the request
    /// bytes written directly (`WriteLoop`), so the load generator, which shares the machine's
    /// cores with the nodes, spends as little of them as it can. A connection that closes early
    /// is replaced.
    func writeLoad(_ cluster: LocalCluster, clients: Int) async throws -> LoadResult {
        let nodes = cluster.ids
        let start = Date()
        let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(seconds * 1e9)
        let results = try await withThrowingTaskGroup(of: LoadResult.self) { group in
            for c in 0..<clients {
                group.addTask {
                    let node = nodes[c % nodes.count]
                    let port = cluster.clientPort(node)
                    var total = LoadResult()
                    var next = 0
                    while DispatchTime.now().uptimeNanoseconds < deadline {
                        let done = cluster.group.next().makePromise(of: WriteLoop.Outcome.self)
                        let loop = WriteLoop(
                            client: c, host: "127.0.0.1:\(port)", first: next, deadline: deadline, done: done,
                            auth: rulesText == nil ? "" : "&auth=" + Self.mockToken(uid: "c\(c)"))
                        do {
                            _ = try await ClientBootstrap(group: cluster.group)
                                .connectTimeout(.seconds(2))
                                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                                .channelInitializer { channel in
                                    channel.eventLoop.makeCompletedFuture {
                                        try channel.pipeline.syncOperations.addHandler(loop)
                                    }
                                }
                                .connect(host: "127.0.0.1", port: port).get()
                        } catch {
                            done.succeed(WriteLoop.Outcome(result: LoadResult(), next: next))
                            total.errors += 1
                            total.errorKinds["cannot connect", default: 0] += 1
                            try? await Task.sleep(nanoseconds: 50_000_000)
                            continue
                        }
                        let outcome = try await done.futureResult.get()
                        next = outcome.next
                        total.writes += outcome.result.writes
                        total.errors += outcome.result.errors
                        total.latencies += outcome.result.latencies
                        total.errorKinds.merge(outcome.result.errorKinds, uniquingKeysWith: +)
                    }
                    return total
                }
            }
            var total = LoadResult()
            for try await r in group {
                total.writes += r.writes
                total.errors += r.errors
                total.latencies += r.latencies
                total.errorKinds.merge(r.errorKinds, uniquingKeysWith: +)
            }
            return total
        }
        var out = results
        out.seconds = Date().timeIntervalSince(start)
        return out
    }

    /// Kills or freezes the leader, then writes through the other nodes every 5 ms until one
    /// succeeds; returns the seconds from the fault to that write. Restores the node and waits
    /// for a stable cluster afterwards.
    func failover(_ cluster: LocalCluster, freeze: Bool) async throws -> Double {
        let leader = try await cluster.waitForLeader()
        let others = cluster.ids.filter { $0 != leader }
        let faultAt = DispatchTime.now().uptimeNanoseconds
        if freeze { cluster.signal(leader, SIGSTOP) } else { cluster.kill9(leader) }
        var elapsed: Double?
        var attempt = 0
        while elapsed == nil {
            attempt += 1
            let node = others[attempt % others.count]
            if let r = try? await cluster.request(node, .PUT, "/failover/w.json?ns=bench&print=silent&auth=owner", body: "\(attempt)", timeout: 2), r.status == 204 {
                elapsed = Double(DispatchTime.now().uptimeNanoseconds - faultAt) / 1e9
            } else {
                try await Task.sleep(nanoseconds: 5_000_000)
            }
            if Double(DispatchTime.now().uptimeNanoseconds - faultAt) / 1e9 > 30 { throw Failure(description: "no write succeeded within 30 s") }
        }
        if freeze { cluster.signal(leader, SIGCONT) } else { try cluster.start(leader) }
        // Let the node catch up and the cluster settle before the next trial.
        let settleDeadline = Date().addingTimeInterval(20)
        while Date() < settleDeadline {
            if let s = await cluster.status(leader), let applied = (s["applied_index"] as? NSNumber)?.intValue,
                let current = try? await cluster.waitForLeader(timeout: 5), let ls = await cluster.status(current),
                let commit = (ls["commit_index"] as? NSNumber)?.intValue, applied >= commit - 1
            {
                break
            }
            try await Task.sleep(nanoseconds: 100_000_000)
        }
        try await Task.sleep(nanoseconds: 500_000_000)
        return elapsed ?? 0
    }
}

/// Raises this process's open-file limit to its hard limit (servers and load generators hold
/// thousands of sockets). Returns the new soft limit.
@discardableResult
public func raiseOpenFileLimit() -> UInt64 {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
    limit.rlim_cur = limit.rlim_max
    _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    return UInt64(limit.rlim_cur)
}

/// One benchmark client's connection: writes `PUT /bench/c<client>/k<n>.json` (raw HTTP/1.1
/// bytes), and on each complete answer records it and writes the next, until the deadline;
/// then closes. Confined to the channel's event loop. An answer that does not come within 10 s
/// closes the connection (counted as "no response"). Answers are parsed here, minimally: the
/// status line, then the headers up to the blank line, then `Content-Length` bytes of body.
final class WriteLoop: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    struct Outcome: Sendable {
        var result: ClusterBench.LoadResult
        /// The next request number (a replacement connection continues from it).
        var next: Int
    }

    private let client: Int
    private let host: String
    private let deadline: UInt64
    private let done: EventLoopPromise<Outcome>
    private var n: Int
    private var sentAt: UInt64 = 0
    private var inFlight = false
    private var status = 0
    private var result = ClusterBench.LoadResult()
    private var timer: Scheduled<Void>?

    /// Appended to each request's query (`&auth=…`), or empty.
    private let auth: String

    init(client: Int, host: String, first: Int, deadline: UInt64, done: EventLoopPromise<Outcome>, auth: String = "") {
        self.auth = auth
        self.client = client
        self.host = host
        self.n = first
        self.deadline = deadline
        self.done = done
        result.latencies.reserveCapacity(32_768)
    }

    func channelActive(context: ChannelHandlerContext) {
        sendNext(context: context)
        context.fireChannelActive()
    }

    private func sendNext(context: ChannelHandlerContext) {
        let now = DispatchTime.now().uptimeNanoseconds
        guard now < deadline else {
            context.close(promise: nil)
            return
        }
        n += 1
        let body = "{\"c\":\(client),\"i\":\(n)}"
        var buffer = context.channel.allocator.buffer(capacity: 160)
        buffer.writeString(
            "PUT /bench/c\(client)/k\(n % 1000).json?ns=bench&print=silent\(auth) HTTP/1.1\r\nHost: \(host)\r\nContent-Length: \(body.utf8.count)\r\n\r\n")
        buffer.writeString(body)
        sentAt = now
        inFlight = true
        status = 0
        context.writeAndFlush(wrapOutboundOut(buffer), promise: nil)
        if timer == nil {
            // One timer per connection, re-armed lazily: it fires only when an answer is late.
            armTimer(context: context)
        }
    }

    private func armTimer(context: ChannelHandlerContext) {
        let started = sentAt
        timer = context.eventLoop.scheduleTask(in: .seconds(10)) { [self] in
            timer = nil
            if inFlight && sentAt == started {
                result.errors += 1
                result.errorKinds["no response", default: 0] += 1
                inFlight = false
                context.close(promise: nil)
            } else if context.channel.isActive {
                armTimer(context: context)
            }
        }
    }

    /// Bytes received and not yet parsed.
    private var pending: ByteBuffer?

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var incoming = unwrapInboundIn(data)
        if pending == nil {
            pending = incoming
        } else {
            pending?.writeBuffer(&incoming)
        }
        while let status = takeResponse() {
            guard inFlight else {
                // An answer nobody asked for: the connection is out of step.
                context.close(promise: nil)
                return
            }
            inFlight = false
            if status == 204 {
                result.writes += 1
                result.latencies.append(Double(DispatchTime.now().uptimeNanoseconds - sentAt) / 1e9)
            } else {
                result.errors += 1
                result.errorKinds["HTTP \(status)", default: 0] += 1
            }
            sendNext(context: context)
        }
    }

    /// Removes one complete response from `pending` and returns its status code; nil while it
    /// is incomplete. A response that cannot be parsed counts as status 0.
    private func takeResponse() -> Int? {
        guard var buffer = pending else { return nil }
        let view = buffer.readableBytesView
        // The end of the head: CR LF CR LF.
        var headEnd: Int?
        var k = view.startIndex
        while k + 3 < view.endIndex {
            if view[k] == 13 && view[k + 1] == 10 && view[k + 2] == 13 && view[k + 3] == 10 {
                headEnd = k + 4
                break
            }
            k += 1
        }
        guard let headEnd else { return nil }
        let head = String(decoding: view[view.startIndex..<headEnd], as: UTF8.self)
        let lines = head.split(separator: "\r\n")
        let statusLine = lines.first?.split(separator: " ") ?? []
        let status = statusLine.count >= 2 ? Int(statusLine[1]) ?? 0 : 0
        var length = 0
        for line in lines.dropFirst() {
            let parts = line.split(separator: ":", maxSplits: 1)
            if parts.count == 2, parts[0].lowercased() == "content-length" {
                length = Int(parts[1].trimmingCharacters(in: .whitespaces)) ?? 0
            }
        }
        let total = headEnd - view.startIndex + length
        guard buffer.readableBytes >= total else { return nil }
        buffer.moveReaderIndex(forwardBy: total)
        pending = buffer.readableBytes > 0 ? buffer : nil
        return status
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        if inFlight {
            result.errors += 1
            result.errorKinds["connection closed", default: 0] += 1
        }
        done.succeed(Outcome(result: result, next: n))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
