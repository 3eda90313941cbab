import BanyanAuth
import BanyanRaft
import Foundation
public import Logging
import Metrics
import NIOCore
import NIOPosix
import NIOSSL
import Prometheus
import Synchronization

/// A running node: storage and the replica loop, the mutual-TLS peer transport, and the HTTP
/// server (docs/server.md). `banyan serve` is a thin wrapper around `start` and `shutdown`.
public final class BanyanNode: Sendable {
    public let config: NodeConfig
    let runtime: NodeRuntime
    let transport: PeerTransport
    let http: HTTPServer
    let network: MultiThreadedEventLoopGroup
    /// The inbound peer connections' thread.
    let peerThread: MultiThreadedEventLoopGroup
    /// Where the client API and the peer transport actually listen (ports may be 0 in tests).
    public let clientAddress: String
    public let peerAddress: String
    /// The certificates in force and their reloads (docs/certificates.md).
    public let tls: NodeTLS
    /// Updates the certificate expiry gauges and warnings once a minute.
    private let expiryCheck: RepeatedTask

    private static let metricsBootstrap = Mutex<PrometheusCollectorRegistry?>(nil)

    /// The process-wide Prometheus registry (swift-metrics can be bootstrapped once).
    static func registry() -> PrometheusCollectorRegistry {
        metricsBootstrap.withLock { existing in
            if let existing { return existing }
            let registry = PrometheusCollectorRegistry()
            var factory = PrometheusMetricsFactory(registry: registry)
            // Latencies here are mostly sub-millisecond (fsync, loopback requests): finer buckets.
            factory.defaultDurationHistogramBuckets = [
                .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1), .microseconds(2500), .milliseconds(5),
                .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500),
                .seconds(1), .milliseconds(2500), .seconds(5), .seconds(10),
            ]
            MetricsSystem.bootstrap(factory)
            existing = registry
            return registry
        }
    }

    public static func start(config: NodeConfig, logger: Logger) throws -> BanyanNode {
        try BanyanNode(config: config, logger: logger)
    }

    /// As `start`, but a start that fails because the disk is full (recovery could not write)
    /// is retried every `interval` seconds until it succeeds or `shouldStop` says so (nil), with
    /// a log line each time: the process stays up and starts by itself once space is freed,
    /// instead of a supervisor's restart loop that may give up (docs/runbook.md, "The disk is
    /// full"). Any other failure is thrown at once.
    public static func startWhenSpace(
        config: NodeConfig, logger: Logger, interval: Double = 5, shouldStop: @escaping () -> Bool
    ) throws -> BanyanNode? {
        let ballast = Ballast(dataDirectory: config.dataDirectory, bytes: config.effectiveBallastBytes)
        return try StartRetry.run(
            attempt: { try BanyanNode(config: config, logger: logger) },
            relieve: { error in
                // The ballast gives the node room to start, raise its alarm and catch up.
                let released: UInt64
                do {
                    released = try ballast.release()
                } catch {
                    logger.error("cannot release the ballast file", metadata: ["error": "\(error)"])
                    return false
                }
                guard released > 0 else { return false }
                logger.critical(
                    "the disk holding the data directory is full: released the ballast file to start (the cluster accepts only deletes until space is freed; the node makes the ballast again then)",
                    metadata: ["error": "\(error)", "released_bytes": "\(released)", "path": "\(ballast.path)"])
                return true
            },
            shouldStop: shouldStop, wait: { Thread.sleep(forTimeInterval: interval) }
        ) { error, attempt in
            let free = NodeRuntime.statvfsFreeBytes(config.dataDirectory).map { String($0) } ?? "unknown"
            logger.critical(
                "the disk holding the data directory is full: free space there and the node starts by itself (retrying every \(Int(interval)) s)",
                metadata: ["error": "\(error)", "free_bytes": "\(free)", "attempt": "\(attempt)", "dir": "\(config.dataDirectory)"])
        }
    }

    private init(config: NodeConfig, logger: Logger) throws {
        try config.validate()
        self.config = config
        let registry = Self.registry()
        let adminToken = try config.loadAdminToken()
        let verifier = try config.loadTokenVerifier()
        if let verifier {
            logger.notice(
                "verifying client tokens",
                metadata: ["id_token_keys": "\(verifier.keyIDs.joined(separator: ","))", "database_secrets": "\(verifier.acceptsSecrets)"])
        }
        let serviceAccounts = try config.loadServiceAccounts(besides: verifier)
        if let serviceAccounts {
            logger.notice(
                "accepting service accounts as administrators",
                metadata: ["accounts": "\(serviceAccounts.accountNames.joined(separator: ","))", "keys": "\(serviceAccounts.keyIDs.count)"])
        }
        let providers = try config.loadOIDCProviders()
        for (id, provider) in providers.sorted(by: { $0.key < $1.key }) {
            logger.notice(
                "accepting sign-in with an identity provider",
                metadata: ["provider": "\(id)", "issuer": "\(provider.settings.issuer)", "keys": "\(provider.keyIDs.joined(separator: ","))"])
        }
        let tls = try NodeTLS(sources: try Self.tlsSources(config, logger: logger), expiryWarningDays: config.tls.expiryWarningDays, logger: logger)
        self.tls = tls
        let threads = config.threads ?? NodeConfig.defaultThreads(cores: System.coreCount)
        network = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        expiryCheck = network.next().scheduleRepeatedTask(initialDelay: .seconds(60), delay: .seconds(60)) { _ in tls.checkExpiry(now: Date()) }
        let runtime: NodeRuntime
        do {
            runtime = try NodeRuntime(config: config, logger: logger, sharedLoop: threads == 1 ? network.next() : nil) { message in
                logger.info("\(message)")
            }
        } catch {
            // Nothing else was started: a start retried later (a full disk) leaks no threads.
            expiryCheck.cancel()
            try? network.syncShutdownGracefully()
            throw error
        }
        self.runtime = runtime
        // Peer connections live on a thread of their own, off the loop that ticks Raft.
        // Inbound ones (anyone who reaches the peer port can open one): their TLS handshakes,
        // decryption and frame decoding never hold the replica loop; their messages reach it in
        // one hand-off per read burst. Outbound ones: the loop hands each pass's messages over
        // in one hop per peer, and their encoding and encryption (tens of milliseconds for an
        // append of a 15 MiB entry, per follower) run here while the loop persists and ticks.
        peerThread = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let transport = try PeerTransport(
            nodeID: config.nodeID, clusterID: config.clusterID, advertised: config.advertised,
            group: config.peerOutboundThread ? peerThread : runtime.loop,
            acceptGroup: config.peerInboundThread ? peerThread : runtime.loop,
            serverContext: tls.material.peerServer,
            clientContext: tls.material.peerClient, logger: logger, bindNodeIDs: config.tls.bindNodeIDs, incarnation: runtime.incarnation,
            lanes: config.peerLanes,
            peerIncarnation: { peer, incarnation in runtime.learnPeerIncarnation(peer, incarnation) }, faults: runtime.faults
        ) { peer, address, messages in
            if let address { runtime.learnPeerAddress(peer, address) }
            runtime.receive(messages)
        }
        self.transport = transport
        let peerBound = try transport.listen(on: config.peerAddress)
        peerAddress = peerBound.map { "\($0.ipAddress ?? config.peerAddress.host):\($0.port ?? config.peerAddress.port)" } ?? config.peerAddress.description
        logger.notice("peer transport listening (mutual TLS)", metadata: ["address": "\(peerAddress)", "node": "\(config.nodeID)"])
        if runtime.faults != nil {
            logger.warning("fault injection is on (--allow-fault-injection): /.banyan/faults may drop and delay this node's peer traffic and fsyncs")
        }
        runtime.start(transport: transport)
        let http = HTTPServer(runtime: runtime, config: config, logger: logger, registry: registry, adminToken: adminToken, verifier: verifier, serviceAccounts: serviceAccounts, tls: tls, identityProviders: providers)
        self.http = http
        http.https.withLock { $0 = tls.material.https }
        tls.onReload { material in
            transport.useTLS(server: material.peerServer, client: material.peerClient)
            http.https.withLock { $0 = material.https }
        }
        let clientBound = try http.start(group: network)
        clientAddress = clientBound.map { "\($0.ipAddress ?? config.clientAddress.host):\($0.port ?? config.clientAddress.port)" } ?? config.clientAddress.description
        logger.notice(
            "client API listening: Firebase REST and event streams, status at /.banyan/status, metrics at /metrics",
            metadata: ["address": "http://\(clientAddress)", "node": "\(config.nodeID)"])
    }

    /// `banyan bootstrap`: writes the founding configuration into a blank data directory.
    public static func bootstrapDataDirectory(config: NodeConfig, logger: Logger) throws {
        try config.validate()
        try NodeRuntime.bootstrapDataDirectory(config: config, logger: logger)
    }

    /// Reloads the certificates, keys and trust bundle from their files (SIGHUP, `POST
    /// /.banyan/tls/reload`): all of it is checked first, and a refusal leaves the material in
    /// force unchanged.
    @discardableResult
    public func reloadTLS(trigger: String) -> Result<TLSStatus, CertificateError> {
        tls.reload(trigger: trigger)
    }

    /// Requests this node has read and not yet answered (what `stop(grace:)` waits for).
    public var requestsInFlight: Int { http.requestsInFlight.load(ordering: .relaxed) }

    /// A graceful stop (`banyan serve` on SIGTERM or SIGINT): the client port stops accepting
    /// (new clients are refused at once, and move to another node), answers close their
    /// connections, and the requests already read are answered, for at most `grace` (the node
    /// keeps its cluster role meanwhile, so their writes commit); then `shutdown`. None may be
    /// in flight for `quiet` first: a connection accepted just before the socket closed may
    /// not have been read yet. Returns the requests still unanswered when the grace ran out
    /// (0: none was cut).
    @discardableResult
    public func stop(grace: Duration, quiet: Duration = .milliseconds(200)) -> Int {
        http.stopAccepting()
        let deadline = ContinuousClock.now + grace
        var quietSince = ContinuousClock.now
        var waiting = requestsInFlight
        while ContinuousClock.now < deadline {
            if waiting > 0 {
                quietSince = ContinuousClock.now
            } else if ContinuousClock.now - quietSince >= quiet {
                break
            }
            Thread.sleep(forTimeInterval: 0.01)
            waiting = requestsInFlight
        }
        shutdown()
        return waiting
    }

    public func shutdown() {
        expiryCheck.cancel()
        http.shutdown()
        transport.shutdown()
        runtime.shutdown()
        try? network.syncShutdownGracefully()
        try? peerThread.syncShutdownGracefully()
    }

    /// The node's TLS files: configured ones, or development certificates generated on first
    /// run (a CA and a node certificate under the TLS directory); the client port's when set.
    static func tlsSources(_ config: NodeConfig, logger: Logger) throws -> TLSSources {
        let ca: CAFiles
        let node: NodeCertificateFiles
        if let caPath = config.tls.caCertificate, let cert = config.tls.certificate, let key = config.tls.privateKey {
            ca = CAFiles(certificatePath: caPath, privateKeyPath: nil)
            node = NodeCertificateFiles(certificatePath: cert, privateKeyPath: key)
        } else if config.tls.generateDevelopmentCertificates {
            var hosts = ["localhost", "127.0.0.1", "::1"]
            for h in [config.peerAddress.host, config.advertised.host] where !hosts.contains(h) && h != "0.0.0.0" && h != "::" { hosts.append(h) }
            let dev = try DevCertificates.ensureDevelopmentCertificates(directory: config.tlsDirectory, nodeName: "node\(config.nodeID)", hosts: hosts)
            ca = dev.ca
            node = dev.node
            logger.notice(
                "using development certificates (generated on first run; not for production)",
                metadata: ["ca": "\(ca.certificatePath)", "certificate": "\(node.certificatePath)"])
        } else {
            throw ConfigError("tls.ca, tls.cert and tls.key are required when development certificates are off")
        }
        let https = config.http.tlsCertificate.flatMap { cert in
            config.http.tlsPrivateKey.map { NodeCertificateFiles(certificatePath: cert, privateKeyPath: $0) }
        }
        let advertised = config.advertised.host
        return TLSSources(
            ca: ca, node: node, https: https, nodeName: config.tls.bindNodeIDs ? config.nodeID : nil,
            advertisedHost: advertised == "0.0.0.0" || advertised == "::" ? nil : advertised)
    }
}
