import BanyanOps
import BanyanRaft
@testable import BanyanServer
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization
import Testing

/// Issue 19's certificate rotation and rolling restart against real `banyan serve` processes and
/// the real `banyan` commands, each under a continuous write load (docs/certificates.md,
/// docs/runbook.md "Rolling restart or upgrade"). Ports 30801-30803/30901-30903 (rotation) and
/// 30821-30823/30921-30923 (roll), moved by `BANYAN_TEST_PORT_BASE` (`testPort`).
///
/// Opt-in (`BANYAN_CLUSTER_TESTS=1`, house style B11), run by `.ci/run` in a step of their own:
/// in the full `swift test` the simulator's CPU-bound tests hold every thread of the concurrency
/// pool for minutes, so a test whose clients and deadlines are async tasks starves (a leader
/// elected in 2 s went unseen for 120 s), which says nothing about the cluster.
@Suite(.serialized, .enabled(if: ProcessInfo.processInfo.environment["BANYAN_CLUSTER_TESTS"] == "1", "multi-process: BANYAN_CLUSTER_TESTS=1"))
struct RotationAndRollTests {
    /// The `banyan` binary built beside this test bundle.
    static func banyan() throws -> String {
        let path = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().appendingPathComponent("banyan").path
        guard FileManager.default.isExecutableFile(atPath: path) else { throw HTTPClientError("no banyan binary at \(path): swift build first") }
        return path
    }

    /// Runs `banyan args…` (at most `seconds`); exit status (-1: killed or timed out) and
    /// output (stdout and stderr). Through `ChildProcess`, not Foundation's `Process`, whose exit
    /// notices the test runner's blocked signals can lose; the output goes through a file, as
    /// processes a restart command starts could hold a pipe open.
    /// `environment` adds to (or replaces in) this process's environment.
    static func run(_ args: [String], seconds: Double = 60, environment: [String: String] = [:]) throws -> (status: Int32, output: String) {
        let file = NSTemporaryDirectory() + "banyan-run-\(UInt64.random(in: 0...UInt64.max)).out"
        defer { try? FileManager.default.removeItem(atPath: file) }
        let environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let pid = try ChildProcess.spawn(try banyan(), args, environment: environment, outputFile: file)
        let ending = ChildProcess.wait(pid, seconds: seconds)
        let output = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
        if case .exited(let code) = ending { return (code, output) }
        return (-1, output + "\n(\(ending))")
    }

    /// Clients that each PUT increasing values to a key of their own, sequentially, through the
    /// nodes in turn. A PUT of a value is idempotent in Firebase REST (and each key has one
    /// writer that waits for each acknowledgement), so an attempt that fails (no connection,
    /// reset, timeout, any non-200) is retried, on the next node, until 20 s have passed: only
    /// then does the write count as failed. Every failed attempt is counted too, those refused
    /// at connect (a node that is down: the client moves on at once, nothing was sent) apart
    /// from the rest (timeouts, resets, 5xx: a client waited or saw an error), and each write's
    /// latency from its first attempt to its acknowledgement, retries included: `failed == 0`
    /// alone would pass a write that took 19 s.
    final class WriteLoad: @unchecked Sendable {
        let cluster: LocalCluster
        let clients: Int
        let stopped = Atomic(false)
        let acknowledged = Atomic(0)
        let failed = Atomic(0)
        let failedAttempts = Atomic(0)
        let refusedAttempts = Atomic(0)
        /// The longest time a write took to be acknowledged (seconds), and how many took over 2 s.
        let slowest = Mutex<Double>(0)
        let slowWrites = Atomic(0)
        let lastValue = Mutex<[Int: Int]>([:])
        let attemptErrors = Mutex<[String]>([])
        private var tasks: [Task<Void, Never>] = []

        init(cluster: LocalCluster, clients: Int) {
            self.cluster = cluster
            self.clients = clients
        }

        func start() {
            for c in 0..<clients { tasks.append(Task { await self.client(c) }) }
        }

        func stop() async {
            stopped.store(true, ordering: .relaxed)
            for t in tasks { await t.value }
        }

        private func client(_ c: Int) async {
            var value = 0
            var node = UInt64(c % 3 + 1)
            while !stopped.load(ordering: .relaxed) {
                value += 1
                let started = Date()
                let deadline = started.addingTimeInterval(20)
                var done = false
                while !done, Date() < deadline {
                    do {
                        let r = try await cluster.request(node, .PUT, "/load/c\(c).json", body: "\(value)", timeout: 10)
                        if r.status == 200 {
                            done = true
                        } else {
                            note("node \(node): \(r.status) \(r.text.prefix(120))")
                        }
                    } catch {
                        let text = "\(error)"
                        let refused = text.contains("onnection refused") || text.contains("ECONNREFUSED")
                        if refused { refusedAttempts.wrappingAdd(1, ordering: .relaxed) }
                        note("node \(node): \(text)", refused: refused)
                    }
                    node = node % 3 + 1
                    if !done { try? await Task.sleep(for: .milliseconds(50)) }
                }
                if done {
                    let took = Date().timeIntervalSince(started)
                    slowest.withLock { $0 = max($0, took) }
                    if took > 2 { slowWrites.wrappingAdd(1, ordering: .relaxed) }
                    acknowledged.wrappingAdd(1, ordering: .relaxed)
                    lastValue.withLock { $0[c] = value }
                } else {
                    failed.wrappingAdd(1, ordering: .relaxed)
                }
            }
        }

        private func note(_ error: String, refused: Bool = false) {
            failedAttempts.wrappingAdd(1, ordering: .relaxed)
            attemptErrors.withLock { if $0.count < 20 { $0.append(error) } }
            if !refused { otherErrors.withLock { if $0.count < 20 { $0.append(error) } } }
        }

        /// The first failed attempts that were not refused at connect.
        let otherErrors = Mutex<[String]>([])

        /// Failed attempts that were not refused at connect.
        var erredAttempts: Int { failedAttempts.load(ordering: .relaxed) - refusedAttempts.load(ordering: .relaxed) }

        /// Every client's last acknowledged value, read back through node `id`.
        func checkFinalValues(through id: UInt64) async throws -> [String] {
            var wrong: [String] = []
            for (c, value) in lastValue.withLock({ $0 }) {
                let r = try await cluster.request(id, .GET, "/load/c\(c).json", timeout: 10)
                if r.text != "\(value)" { wrong.append("c\(c): read \(r.status) \(r.text), last acknowledged \(value)") }
            }
            return wrong
        }
    }

    /// The first leader, or the tail of every node's log (a failed test's only evidence: the
    /// directory goes with it) and the error.
    static func firstLeader(_ cluster: LocalCluster) async throws -> UInt64 {
        do {
            return try await cluster.waitForLeader(timeout: 120)
        } catch {
            for id in cluster.founders {
                let log = (try? String(contentsOfFile: "\(cluster.directory)/node\(id).log", encoding: .utf8)) ?? "(no log)"
                print("node \(id) (running: \(cluster.isRunning(id))), last lines of its log:\n" + log.split(separator: "\n").suffix(15).joined(separator: "\n"))
            }
            throw error
        }
    }

    static func tlsStatus(_ cluster: LocalCluster, _ id: UInt64) async -> TLSStatus? {
        guard let r = try? await cluster.request(id, .GET, "/.banyan/tls", timeout: 5), r.status == 200 else { return nil }
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        return try? decoder.decode(TLSStatus.self, from: Data(r.body))
    }

    /// Copies `files` over the node's in-use files with renames (what an operator's deployment
    /// tool does), the key first: between the two renames a reload would see a mismatch and
    /// refuse, keeping the old material.
    static func install(_ files: NodeCertificateFiles, as target: NodeCertificateFiles) throws {
        for (from, to) in [(files.privateKeyPath, target.privateKeyPath), (files.certificatePath, target.certificatePath)] {
            let temporary = to + ".new"
            try? FileManager.default.removeItem(atPath: temporary)
            try FileManager.default.copyItem(atPath: from, toPath: temporary)
            guard rename(temporary, to) == 0 else { throw HTTPClientError("rename to \(to) failed") }
        }
    }

    /// A client TLS context trusting exactly the CA certificates in `files`.
    static func trusting(_ files: [String]) throws -> NIOSSLContext {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try files.flatMap { try NIOSSLCertificate.fromPEMFile($0) })
        return try NIOSSLContext(configuration: tls)
    }

    /// The certificate node `id`'s client port presents to a new HTTPS connection trusting
    /// `context` (the cluster's own when nil), once a request on it has been answered; nil when
    /// the handshake or the request fails.
    static func presentedCertificate(_ cluster: LocalCluster, _ id: UInt64, trusting context: NIOSSLContext? = nil) async -> NIOSSLCertificate? {
        guard
            let c = try? await HTTPConnection.connect(
                host: "127.0.0.1", port: cluster.clientPort(id), group: cluster.group, tls: context ?? cluster.clientTLS)
        else { return nil }
        defer { c.close() }
        guard let r = try? await c.send(.GET, "/.banyan/ready", timeout: .seconds(5)), r.status > 0 else { return nil }
        return try? await c.peerCertificate()
    }

    /// The first certificate of a PEM file (nil if it does not read).
    static func certificate(_ path: String) -> NIOSSLCertificate? { (try? NIOSSLCertificate.fromPEMFile(path))?.first }

    /// Whether a peer presenting `certificate` gets its hello accepted by the node listening on
    /// `port` (nil: the TLS handshake or connection failed and no reply came).
    static func peerHello(port: Int, certificate: NodeCertificateFiles, trusting ca: String, from: UInt64, to: UInt64, group: any EventLoopGroup) async -> Bool? {
        final class Reply: ChannelInboundHandler, @unchecked Sendable {
            typealias InboundIn = ByteBuffer
            let bytes = Mutex<[UInt8]>([])
            let closed = Atomic(false)
            func channelRead(context: ChannelHandlerContext, data: NIOAny) {
                bytes.withLock { $0.append(contentsOf: unwrapInboundIn(data).readableBytesView) }
            }
            func channelInactive(context: ChannelHandlerContext) { closed.store(true, ordering: .relaxed) }
            func errorCaught(context: ChannelHandlerContext, error: any Error) { context.close(promise: nil) }
        }
        do {
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.certificateChain = [.certificate(try NIOSSLCertificate(file: certificate.certificatePath, format: .pem))]
            tls.privateKey = .privateKey(try NIOSSLPrivateKey(file: certificate.privateKeyPath, format: .pem))
            tls.trustRoots = .file(ca)
            tls.minimumTLSVersion = .tlsv13
            let context = try NIOSSLContext(configuration: tls)
            let reply = Reply()
            let channel = try await ClientBootstrap(group: group).connectTimeout(.seconds(3)).channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: context, serverHostname: nil))
                    try channel.pipeline.syncOperations.addHandler(reply)
                }
            }.connect(host: "127.0.0.1", port: port).get()
            defer { channel.close(promise: nil) }
            let hello = PeerHello(clusterID: "banyan-test", from: from, to: to, protocolVersion: PeerTransport.protocolVersion, address: "127.0.0.1:1")
            var buffer = channel.allocator.buffer(capacity: 64)
            let body = hello.encode()
            buffer.writeInteger(UInt32(body.count), endianness: .little)
            buffer.writeBytes(body)
            try await channel.writeAndFlush(buffer).get()
            let deadline = Date().addingTimeInterval(10)
            while Date() < deadline {
                let bytes = reply.bytes.withLock { $0 }
                if bytes.count >= 4 {
                    let length = Int(bytes[0]) | Int(bytes[1]) << 8 | Int(bytes[2]) << 16 | Int(bytes[3]) << 24
                    if bytes.count >= 4 + length, let answer = try? PeerHelloReply.decode(Array(bytes[4..<(4 + length)])) { return answer.accepted }
                }
                if reply.closed.load(ordering: .relaxed) { return nil }
                try await Task.sleep(for: .milliseconds(20))
            }
            return nil
        } catch {
            return nil
        }
    }

    @Test("CA rotation under load over HTTPS: a new CA joins every bundle, node and client-port certificates are reissued and reloaded one by one, the old CA leaves; no write fails, new HTTPS connections get the new certificates, and a peer with an old-CA certificate is refused at the end")
    func caRotationUnderLoad() async throws {
        let dir = try temporaryDirectory("rotation")
        let cluster = LocalCluster(executable: try Self.banyan(), directory: dir + "/cluster", nodes: 3, clientPortBase: testPort(30800), peerPortBase: testPort(30900))
        defer {
            cluster.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        let ids: [UInt64] = [1, 2, 3]
        let caA = try DevCertificates.createCA(commonName: "Rotation CA A", directory: dir + "/caA")
        // B exists from the start: clients are given the new CA before any certificate they are
        // shown comes from it (the client side of the procedure). They trust A and B throughout.
        let caB = try DevCertificates.createCA(commonName: "Rotation CA B", directory: dir + "/caB")
        let clientCAs = dir + "/client-cas.pem"
        try (String(contentsOfFile: caA.certificatePath, encoding: .utf8) + String(contentsOfFile: caB.certificatePath, encoding: .utf8))
            .write(toFile: clientCAs, atomically: true, encoding: .utf8)
        cluster.clientTLS = try Self.trusting([clientCAs])
        // The `banyan` commands reach the HTTPS client ports trusting the same two CAs.
        let commandTrust = ["BANYAN_CA_FILE": clientCAs]
        // Each node's own files, as tls.ca, tls.cert and tls.key (peer mutual TLS) and
        // http.tls_cert and http.tls_key (the client port's HTTPS) name them.
        var inUse: [UInt64: (ca: String, node: NodeCertificateFiles, client: NodeCertificateFiles)] = [:]
        for id in ids {
            let issued = try DevCertificates.issueNodeCertificate(ca: caA, nodeName: "node\(id)", hosts: ["127.0.0.1", "localhost"], directory: dir + "/issuedA")
            let issuedClient = try DevCertificates.issueNodeCertificate(ca: caA, nodeName: "node\(id)", hosts: ["127.0.0.1", "localhost"], directory: dir + "/clientA")
            let tlsDir = dir + "/tls\(id)"
            try FileManager.default.createDirectory(atPath: tlsDir, withIntermediateDirectories: true)
            let files = NodeCertificateFiles(certificatePath: tlsDir + "/node.pem", privateKeyPath: tlsDir + "/node.key")
            let client = NodeCertificateFiles(certificatePath: tlsDir + "/client.pem", privateKeyPath: tlsDir + "/client.key")
            try Self.install(issued, as: files)
            try Self.install(issuedClient, as: client)
            try FileManager.default.copyItem(atPath: caA.certificatePath, toPath: tlsDir + "/ca.pem")
            inUse[id] = (tlsDir + "/ca.pem", files, client)
            // A 1 s election timeout (50 ticks of 20 ms, not 200 ms): on a machine loaded by the
            // rest of the suite, a starved heartbeat must not pass for a link the rotation broke.
            let yaml = "tls:\n  ca: \(tlsDir)/ca.pem\n  cert: \(files.certificatePath)\n  key: \(files.privateKeyPath)\n  generate_development_certificates: false\n"
                + "http:\n  tls_cert: \(client.certificatePath)\n  tls_key: \(client.privateKeyPath)\n"
                + "raft:\n  election_ticks: 50\n"
            try yaml.write(toFile: dir + "/node\(id).yaml", atomically: true, encoding: .utf8)
            cluster.nodeArguments[id] = ["--config", dir + "/node\(id).yaml"]
        }
        for id in ids { try cluster.start(id) }
        let leader = try await Self.firstLeader(cluster)
        let termBefore = (await cluster.status(leader)?["term"] as? NSNumber)?.uint64Value ?? 0
        let endpoints = ids.map { cluster.endpoint($0) }.joined(separator: ",")
        // Every write attempt of the load is a new HTTPS connection (`LocalCluster.request`), so
        // each certificate reloaded below is presented to the load from the next attempt on.
        let load = WriteLoad(cluster: cluster, clients: 4)
        load.start()
        try await Task.sleep(for: .seconds(1))

        // 1. A new CA joins every node's bundle; nodes 1 and 3 reload through the command, node 2 on SIGHUP.
        for id in ids {
            let made = try Self.run(["certs", "bundle", "--force", "--out", inUse[id]?.ca ?? "", caA.certificatePath, caB.certificatePath])
            #expect(made.status == 0 && made.output.contains("2 CA certificates"), "\(made.output)")
            if id == 2 {
                cluster.signal(id, SIGHUP)
            } else {
                let reloaded = try Self.run(["cluster", "reload-tls", "--endpoint", cluster.endpoint(id)], environment: commandTrust)
                #expect(reloaded.status == 0 && reloaded.output.contains("Rotation CA B"), "\(reloaded.output)")
            }
        }
        for id in ids {
            var cas = 0
            for _ in 0..<100 {
                cas = await Self.tlsStatus(cluster, id)?.certificates.filter { $0.kind == .ca }.count ?? 0
                if cas == 2 { break }
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(cas == 2, "node \(id) trusts \(cas) CAs after the first reload")
        }
        #expect(await Self.tlsStatus(cluster, 2)?.loadedBy == "SIGHUP")

        // A keep-alive HTTPS connection to node 2 opened before any client-port certificate
        // changes, read through every 200 ms until the end: it must keep working, on A's
        // certificate, while new connections get B's.
        let held = try await cluster.connect(2)
        defer { held.close() }
        let heldFirst = try await held.send(.GET, "/load/c0.json", timeout: .seconds(5))
        #expect(heldFirst.status == 200)
        let heldBefore = try await held.peerCertificate()
        let holding = Atomic(true)
        let heldReads = Mutex<(answered: Int, failed: [String])>((0, []))
        let holder = Task {
            while holding.load(ordering: .relaxed) {
                do {
                    let r = try await held.send(.GET, "/load/c0.json", timeout: .seconds(5))
                    heldReads.withLock { if r.status == 200 { $0.answered += 1 } else { $0.failed.append("\(r.status)") } }
                } catch {
                    heldReads.withLock { $0.failed.append("\(error)") }
                    return
                }
                try? await Task.sleep(for: .milliseconds(200))
            }
        }

        // 2. Node and client-port certificates from the new CA, one node at a time, each node's
        // pair in one reload. Node 1 first gets a node key that does not match: the reload is
        // refused and it keeps A's certificates, the client port's included.
        for id in ids {
            let issued = try DevCertificates.issueNodeCertificate(ca: caB, nodeName: "node\(id)", hosts: ["127.0.0.1", "localhost"], directory: dir + "/issuedB")
            let issuedClient = try DevCertificates.issueNodeCertificate(ca: caB, nodeName: "node\(id)", hosts: ["127.0.0.1", "localhost"], directory: dir + "/clientB")
            guard let target = inUse[id] else { continue }
            try Self.install(issuedClient, as: target.client)
            if id == 1 {
                try Self.install(NodeCertificateFiles(certificatePath: issued.certificatePath, privateKeyPath: dir + "/issuedA/node1.key"), as: target.node)
                let refused = try Self.run(["cluster", "reload-tls", "--endpoint", cluster.endpoint(id)], environment: commandTrust)
                #expect(refused.status != 0 && refused.output.contains("\"code\" : \"mismatch\""), "\(refused.output)")
                #expect(await Self.tlsStatus(cluster, id)?.certificates.first?.issuer.contains("Rotation CA A") == true)
                let kept = await Self.presentedCertificate(cluster, id)
                #expect(kept != nil && kept == Self.certificate(dir + "/clientA/node1.pem"), "after a refused reload node 1's client port must still present A's certificate")
            }
            try Self.install(issued, as: target.node)
            let reloaded = try Self.run(["cluster", "reload-tls", "--endpoint", cluster.endpoint(id)], environment: commandTrust)
            #expect(reloaded.status == 0, "\(reloaded.output)")
            #expect(await Self.tlsStatus(cluster, id)?.certificates.first?.issuer.contains("Rotation CA B") == true)
            let presented = await Self.presentedCertificate(cluster, id)
            #expect(presented != nil && presented == Self.certificate(issuedClient.certificatePath), "node \(id)'s client port does not present B's certificate after its reload")
            try await Task.sleep(for: .milliseconds(500))
        }
        // The load keeps writing on new connections, all of which now get B's client-port certificates.
        let acknowledgedAfterReissue = load.acknowledged.load(ordering: .relaxed)
        // Before the old CA leaves: every certificate is trusted everywhere, and A issued none.
        let check = try Self.run(["cluster", "tls", "--endpoint", endpoints], environment: commandTrust)
        #expect(check.status == 0 && check.output.contains("Rotation CA A") && check.output.contains("issued no node's certificate"), "\(check.output)")

        // 3. The old CA leaves every bundle.
        for id in ids {
            let made = try Self.run(["certs", "bundle", "--force", "--out", inUse[id]?.ca ?? "", caB.certificatePath])
            #expect(made.status == 0, "\(made.output)")
        }
        let reloadedAll = try Self.run(["cluster", "reload-tls", "--endpoint", endpoints], environment: commandTrust)
        #expect(reloadedAll.status == 0, "\(reloadedAll.output)")
        for id in ids {
            let status = await Self.tlsStatus(cluster, id)
            #expect(status?.certificates.filter { $0.kind == .ca }.map(\.subject).allSatisfy { $0.contains("Rotation CA B") } == true)
            #expect(status?.certificates.filter { $0.kind == .ca }.count == 1)
        }
        try await Task.sleep(for: .seconds(2))
        await load.stop()
        holding.store(false, ordering: .relaxed)
        await holder.value

        // No write failed, and none was lost.
        let acknowledged = load.acknowledged.load(ordering: .relaxed)
        print("rotation: \(acknowledged) writes acknowledged, \(load.failed.load(ordering: .relaxed)) failed, \(load.failedAttempts.load(ordering: .relaxed)) attempts retried \(load.attemptErrors.withLock { $0 })")
        #expect(acknowledged > 50)
        #expect(load.failed.load(ordering: .relaxed) == 0)
        #expect(load.failedAttempts.load(ordering: .relaxed) == 0, "\(load.attemptErrors.withLock { $0 })")
        #expect(try await load.checkFinalValues(through: 1).isEmpty)
        // Every client port now shows B's certificate to a new connection: one trusting B alone
        // gets it, one trusting A alone fails its handshake.
        #expect(acknowledged > acknowledgedAfterReissue, "no write after the last client-port certificate was reloaded")
        #expect(Self.certificate(dir + "/clientA/node1.pem") != Self.certificate(dir + "/clientB/node1.pem"))
        // The connection opened before the reloads kept working and kept A's certificate.
        let (heldAnswered, heldFailed) = heldReads.withLock { ($0.answered, $0.failed) }
        print("rotation: the held connection answered \(heldAnswered) reads, \(heldFailed.count) failed \(heldFailed.prefix(3))")
        #expect(heldAnswered > 5 && heldFailed.isEmpty, "\(heldFailed.prefix(3))")
        #expect(heldBefore != nil && heldBefore == Self.certificate(dir + "/clientA/node2.pem"))
        #expect(try await held.peerCertificate() == heldBefore)
        let onlyA = try Self.trusting([caA.certificatePath])
        let onlyB = try Self.trusting([caB.certificatePath])
        for id in ids {
            let presented = await Self.presentedCertificate(cluster, id, trusting: onlyB)
            #expect(presented != nil && presented == Self.certificate(dir + "/clientB/node\(id).pem"), "node \(id): a client trusting only B")
            #expect(await Self.presentedCertificate(cluster, id, trusting: onlyA) == nil, "node \(id): a client trusting only A was answered")
        }
        // Peer links never broke: no election during the rotation.
        let leaderAfter = try await cluster.waitForLeader(timeout: 60)
        let termAfter = (await cluster.status(leaderAfter)?["term"] as? NSNumber)?.uint64Value ?? 0
        #expect(termAfter == termBefore, "term \(termBefore) → \(termAfter)")

        // A peer presenting node 2's old (CA A) certificate is refused by node 1; node 2's new one is accepted.
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { group.shutdownGracefully { _ in } }
        let old = NodeCertificateFiles(certificatePath: dir + "/issuedA/node2.pem", privateKeyPath: dir + "/issuedA/node2.key")
        let new = NodeCertificateFiles(certificatePath: dir + "/issuedB/node2.pem", privateKeyPath: dir + "/issuedB/node2.key")
        let oldAnswer = await Self.peerHello(port: cluster.peerPort(1), certificate: old, trusting: caB.certificatePath, from: 2, to: 1, group: group)
        let newAnswer = await Self.peerHello(port: cluster.peerPort(1), certificate: new, trusting: caB.certificatePath, from: 2, to: 1, group: group)
        #expect(oldAnswer == nil, "a peer with an old-CA certificate got a hello reply")
        #expect(newAnswer == true)
        let log = (try? String(contentsOfFile: dir + "/cluster/node1.log", encoding: .utf8)) ?? ""
        let refusal = log.split(separator: "\n").last { $0.contains("peer connection failed") }
        print("node 1 logged: \(refusal ?? "nothing")")
        #expect(refusal?.contains("CERTIFICATE_VERIFY_FAILED") == true, "\(log.suffix(800))")
    }

    @Test("banyan cluster roll restarts every node of a loaded 3-node cluster through a restart command: followers first, the leader last, no failed write, at most one leader change per node; a node that does not come back stops the roll")
    func rollingRestartUnderLoad() async throws {
        let dir = try temporaryDirectory("roll")
        let banyan = try Self.banyan()
        let cluster = LocalCluster(executable: banyan, directory: dir + "/cluster", nodes: 3, clientPortBase: testPort(30820), peerPortBase: testPort(30920))
        let ids: [UInt64] = [1, 2, 3]
        // Nodes the restart script starts are not the cluster object's children: their pids
        // are in node<id>.pid, and they are stopped here at the end.
        defer {
            for id in ids {
                if let text = try? String(contentsOfFile: "\(dir)/node\(id).pid", encoding: .utf8), let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)) {
                    kill(pid, SIGTERM)
                    var waited = 0
                    while kill(pid, 0) == 0, waited < 100 {
                        usleep(100_000)
                        waited += 1
                    }
                    kill(pid, SIGKILL)
                }
            }
            cluster.shutdown()
            if ProcessInfo.processInfo.environment["BANYAN_KEEP_TEST_DIRS"] == nil { try? FileManager.default.removeItem(atPath: dir) }
        }
        for id in ids { try cluster.start(id) }
        // What an operator's restart command does: stop the node, start it again on the same data directory.
        func quoted(_ s: String) -> String { "'" + s.replacingOccurrences(of: "'", with: "'\\''") + "'" }
        for id in ids {
            let command = ([banyan] + cluster.arguments(id, firstStart: false)).map(quoted).joined(separator: " ")
            try "nohup \(command) >> \(quoted("\(dir)/cluster/node\(id).log")) 2>&1 < /dev/null &\necho $! > \(quoted("\(dir)/node\(id).pid"))\n"
                .write(toFile: "\(dir)/start\(id).sh", atomically: true, encoding: .utf8)
        }
        try """
        #!/bin/sh
        # restart.sh ID PID: SIGTERM, wait (at most 30 s) until the process has exited, start again.
        echo "$(date +%T.%N) restart.sh $1 $2: stopping" >> \(quoted(dir))/restart.trace
        kill -TERM "$2" 2>/dev/null
        i=0
        while [ -e "/proc/$2" ] && [ "$(cut -d' ' -f3 "/proc/$2/stat" 2>/dev/null)" != Z ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
        echo "$(date +%T.%N) restart.sh $1 $2: stopped after $i polls; starting" >> \(quoted(dir))/restart.trace
        sh \(quoted(dir))/start"$1".sh
        echo "$(date +%T.%N) restart.sh $1 $2: started" >> \(quoted(dir))/restart.trace
        """.write(toFile: "\(dir)/restart.sh", atomically: true, encoding: .utf8)

        let leader = try await Self.firstLeader(cluster)
        var before: [UInt64: Int64] = [:]
        for id in ids { before[id] = (await cluster.status(id)?["started_at_ms"] as? NSNumber)?.int64Value }
        let termBefore = (await cluster.status(leader)?["term"] as? NSNumber)?.uint64Value ?? 0
        let load = WriteLoad(cluster: cluster, clients: 4)
        load.start()
        // Leader changes as a client would see them, polled every 100 ms.
        let observing = Atomic(true)
        let leaders = Mutex<[UInt64]>([leader])
        let observer = Task {
            while observing.load(ordering: .relaxed) {
                for id in ids {
                    if let s = await cluster.status(id), s["role"] as? String == "leader", let l = (s["node_id"] as? NSNumber)?.uint64Value {
                        leaders.withLock { if $0.last != l { $0.append(l) } }
                        break
                    }
                }
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
        try await Task.sleep(for: .seconds(1))
        let endpoints = ids.map { "127.0.0.1:\(cluster.clientPort($0))" }.joined(separator: ",")
        let roll = try await Task.detached {
            try Self.run(["cluster", "roll", "--endpoint", endpoints, "--restart-command", "sh \(quoted(dir))/restart.sh {id} {pid}", "--timeout", "40"], seconds: 150)
        }.value
        print(roll.output)
        try await Task.sleep(for: .seconds(1))
        await load.stop()
        observing.store(false, ordering: .relaxed)
        await observer.value

        #expect(roll.status == 0, "\(roll.output)")
        // Followers first, the leader last.
        let order = roll.output.split(separator: "\n").compactMap { line -> UInt64? in
            guard line.contains(": restarting"), let r = line.range(of: "] node ") else { return nil }
            return UInt64(line[r.upperBound...].prefix { $0.isNumber })
        }
        #expect(order.count == 3 && order.last == leader && Set(order) == Set(ids), "order \(order), leader \(leader)")
        #expect(roll.output.contains("moving leadership to node"))
        for id in ids {
            let now = (await cluster.status(id)?["started_at_ms"] as? NSNumber)?.int64Value
            #expect(now != nil && now != before[id], "node \(id) was not restarted")
        }
        let acknowledged = load.acknowledged.load(ordering: .relaxed)
        let slowest = load.slowest.withLock { $0 }
        print(
            "roll: \(acknowledged) writes acknowledged, \(load.failed.load(ordering: .relaxed)) failed, \(load.failedAttempts.load(ordering: .relaxed)) attempts retried (\(load.refusedAttempts.load(ordering: .relaxed)) refused at connect, \(load.erredAttempts) other); slowest write \(String(format: "%.2f", slowest)) s, \(load.slowWrites.load(ordering: .relaxed)) over 2 s; leaders seen \(leaders.withLock { $0 })"
        )
        #expect(acknowledged > 50)
        #expect(load.failed.load(ordering: .relaxed) == 0, "\(load.attemptErrors.withLock { $0 })")
        // A node that restarts refuses connections (its clients move on at once, nothing was
        // sent). Nothing else may fail: the roll drains each node first, a stopping node answers
        // the requests it has read before it exits, and writes survive the leader's handover. An
        // attempt answered 5xx, reset or timed out counts.
        print("roll: attempts that failed other than refused at connect: \(load.otherErrors.withLock { $0 })")
        #expect(load.erredAttempts == 0, "attempts that failed other than refused at connect: \(load.erredAttempts), \(load.otherErrors.withLock { $0 })")
        #expect(slowest < 5, "the slowest write took \(slowest) s")
        #expect(load.slowWrites.load(ordering: .relaxed) <= 4 * 3, "writes over 2 s: \(load.slowWrites.load(ordering: .relaxed))")
        #expect(try await load.checkFinalValues(through: 1).isEmpty)
        // Leader changes, step by step as the roll reports them: at most one per node.
        let steps = roll.output.split(separator: "\n").compactMap { line -> UInt64? in
            guard let r = line.range(of: "leader changes in this step: ") else { return nil }
            return UInt64(line[r.upperBound...].prefix { $0.isNumber })
        }
        #expect(steps.count == 3 && steps.allSatisfy { $0 <= 1 }, "leader changes per step: \(steps)")
        #expect(roll.output.contains("per node: "), "\(roll.output)")
        let leaderAfter = try await cluster.waitForLeader(timeout: 60)
        let termAfter = (await cluster.status(leaderAfter)?["term"] as? NSNumber)?.uint64Value ?? 0
        #expect(termAfter >= termBefore && termAfter - termBefore <= 3, "term \(termBefore) → \(termAfter)")
        #expect(leaders.withLock { $0.count - 1 } <= 3, "leaders seen: \(leaders.withLock { $0 })")

        // A node that does not come back stops the roll: the restart command only stops it.
        var started: [UInt64: Int64] = [:]
        for id in ids { started[id] = (await cluster.status(id)?["started_at_ms"] as? NSNumber)?.int64Value }
        let stuck = try await Task.detached {
            try Self.run(["cluster", "roll", "--endpoint", endpoints, "--restart-command", "kill -TERM {pid}", "--timeout", "4"], seconds: 60)
        }.value
        #expect(stuck.status != 0 && stuck.output.contains("roll stopped") && stuck.output.contains("No other node was touched"), "\(stuck.output)")
        var down: [UInt64] = []
        for id in ids {
            if let s = await cluster.status(id) {
                #expect((s["started_at_ms"] as? NSNumber)?.int64Value == started[id], "node \(id) was touched")
            } else {
                down.append(id)
            }
        }
        #expect(down.count == 1, "nodes down after the stopped roll: \(down)")
        // Bring it back for the clean-up (its pid file is rewritten).
        for id in down {
            let pid = try ChildProcess.spawn("/bin/sh", ["\(dir)/start\(id).sh"], environment: ProcessInfo.processInfo.environment)
            #expect(ChildProcess.wait(pid, seconds: 10) == .exited(0))
        }
    }
}
