import ArgumentParser
import BanyanOps
import BanyanServer
import Dispatch
import Foundation
import Logging

/// Options that shape a node's configuration (over the built-in defaults and the file).
struct NodeOptions: ParsableArguments {
    @Option(name: .long, help: "A YAML configuration file (see docs/operations.md).")
    var config: String?

    @Option(name: .long, help: "This node's id (default 1).")
    var nodeId: UInt64?

    @Option(name: .long, help: "The cluster's name; peers with another cluster id are refused.")
    var clusterId: String?

    @Option(name: .long, help: "Data directory (default ./banyan-data).")
    var dataDir: String?

    @Option(name: .long, help: "Client API address, host:port (default 127.0.0.1:9000).")
    var listen: String?

    @Option(name: .long, help: "Peer transport address, host:port (default 127.0.0.1:7000).")
    var peerListen: String?

    @Option(name: .long, help: "The peer address other nodes dial, when it differs from --peer-listen.")
    var advertisePeer: String?

    @Option(name: .long, help: "The client address other nodes send this node's clients to when they drain (default: --listen unless it is a wildcard).")
    var advertiseClient: String?

    @Option(name: .long, help: "A founding member as id=host:port (repeat for each; used once, on an empty data directory).")
    var initialMember: [String] = []

    @Flag(name: .long, help: "Start blank and wait to be added to an existing cluster (banyan cluster add).")
    var join = false

    @Flag(
        name: .long,
        help: "Found a new cluster from --initial-member/initial_members if the data directory is blank (first start only; never put it in a service file).")
    var newCluster = false

    @Flag(
        name: .long,
        help: "Repair: open a log whose last segment is damaged before valid records by cutting it at the damage (the cut bytes are kept beside it). The node then runs without a vote until it is removed and added back (docs/runbook.md). One start only.")
    var salvageLog = false

    @Option(name: .long, help: "Directory of the TLS files (development certificates are generated here on first run).")
    var tlsDir: String?

    @Option(name: .long, help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String?

    @Option(name: .long, help: "Network threads (default: 1 on a machine of one or two cores, else one per core, at most 4); 1 runs the whole node on one thread.")
    var threads: Int?

    @Option(name: .long, help: "Inbound peer connections on a thread of their own (true, the default) or on the replica loop (false).")
    var peerInboundThread: Bool?

    @Option(name: .long, help: "Outbound peer connections (encoding and encryption of what this node sends) on the peer thread (true, the default) or on the replica loop (false).")
    var peerOutboundThread: Bool?

    @Option(name: .long, help: "Outbound connections per peer: 2 (the default; appends and snapshots on one, heartbeats, votes and answers on the other, so they never wait behind large appends) or 1.")
    var peerLanes: Int?

    @Option(name: .long, help: "Raft election timeout in ticks of raft.tick_ms (overrides raft.election_ticks; default 10, 200-400 ms). Larger values ride through CPU starvation on small machines at the cost of slower failover.")
    var electionTicks: Int?

    @Flag(
        name: .long,
        help: "Accept fault requests at /.banyan/faults (banyan chaos: dropped and delayed peer traffic, slow fsyncs). Local testing only: refused unless --listen and --peer-listen are loopback.")
    var allowFaultInjection = false

    /// `nodeConfig()` with configuration errors reported as usage errors (exit status 64).
    func validatedConfig() throws -> NodeConfig {
        do {
            return try nodeConfig()
        } catch let e as ConfigError {
            throw ValidationError(e.message)
        }
    }

    func nodeConfig() throws -> NodeConfig {
        var c = NodeConfig()
        if let config { c = try NodeConfig.load(file: config) }
        if let nodeId { c.nodeID = nodeId }
        if let clusterId { c.clusterID = clusterId }
        if let dataDir { c.dataDirectory = dataDir }
        if let listen { c.clientAddress = try HostPort(parsing: listen) }
        if let peerListen { c.peerAddress = try HostPort(parsing: peerListen) }
        if let advertisePeer { c.advertisedPeerAddress = try HostPort(parsing: advertisePeer) }
        if let advertiseClient { c.advertisedClientAddress = try HostPort(parsing: advertiseClient) }
        if !initialMember.isEmpty {
            c.initialMembers = [:]
            for m in initialMember {
                let parts = m.split(separator: "=", maxSplits: 1)
                guard parts.count == 2, let id = UInt64(parts[0]), id != 0 else {
                    throw ValidationError("--initial-member must look like 2=127.0.0.1:7001, not '\(m)'")
                }
                c.initialMembers[id] = try HostPort(parsing: String(parts[1]))
            }
        }
        if join { c.join = true }
        if newCluster { c.newCluster = true }
        if salvageLog { c.salvageDamagedLog = true }
        if let tlsDir { c.tls.directory = tlsDir }
        if let logLevel { c.logLevel = logLevel }
        if let threads {
            guard (1...64).contains(threads) else { throw ValidationError("--threads must be between 1 and 64") }
            c.threads = threads
        }
        if let peerInboundThread { c.peerInboundThread = peerInboundThread }
        if let peerOutboundThread { c.peerOutboundThread = peerOutboundThread }
        if let peerLanes {
            guard (1...2).contains(peerLanes) else { throw ValidationError("--peer-lanes must be 1 or 2") }
            c.peerLanes = peerLanes
        }
        if let electionTicks {
            guard (2...10_000).contains(electionTicks) else { throw ValidationError("--election-ticks must be between 2 and 10000") }
            c.raft.electionTicks = electionTicks
        }
        if allowFaultInjection { c.allowFaultInjection = true }
        try c.validate()
        return c
    }
}

/// `banyan serve`: runs a node until SIGINT or SIGTERM.
struct Serve: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a Banyan node (a single-node cluster with the defaults).",
        discussion: """
            With no options: data in ./banyan-data, the Firebase REST API on http://127.0.0.1:9000, \
            peers on 127.0.0.1:7000 (mutual TLS with development certificates generated on first \
            run). Point Firebase clients at it as at the emulator, e.g. \
            FIREBASE_DATABASE_EMULATOR_HOST=127.0.0.1:9000.
            """)

    @OptionGroup var options: NodeOptions

    func run() throws {
        let config = try options.validatedConfig()
        ProcessMemory.returnLargeBuffers()
        guard let level = Logger.Level(rawValue: config.logLevel) else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
        }
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        raiseOpenFileLimit()
        // SIGHUP reloads the certificates once the node runs; until then it must not end the
        // process (its default action).
        signal(SIGHUP, SIG_IGN)
        var logger = Logger(label: "banyan")
        logger[metadataKey: "node"] = "\(config.nodeID)"
        let node: BanyanNode
        // SIGINT/SIGTERM while a full disk holds the start back end the wait.
        let stop = StopFlag()
        stop.installSignalHandlers()
        do {
            guard let started = try BanyanNode.startWhenSpace(config: config, logger: logger, shouldStop: { stop.isSet }) else {
                logger.notice("stopped while waiting for disk space")
                return
            }
            node = started
        } catch {
            logger.critical("cannot start", metadata: ["error": "\(error)"])
            throw ExitCode(1)
        }
        // After the start, which set up the metrics its counters report to.
        ProcessMemory.startTrimming(logger: logger)
        // SIGHUP reloads the certificates; SIGINT and SIGTERM (already watched by `stop`: one
        // dispatch source per signal gets it) stop the node.
        signal(SIGHUP, SIG_IGN)
        let hangUp = DispatchSource.makeSignalSource(signal: SIGHUP, queue: .global())
        hangUp.setEventHandler { [logger] in
            logger.notice("SIGHUP: reloading the TLS material")
            node.reloadTLS(trigger: "SIGHUP")
        }
        hangUp.resume()
        stop.wait()
        hangUp.cancel()
        let grace = config.http.stopGraceSeconds
        logger.notice("stopping: no longer accepting connections; answering the requests already read", metadata: ["in_flight": "\(node.requestsInFlight)", "grace_s": "\(grace)"])
        let cut = node.stop(grace: .seconds(grace))
        if cut > 0 {
            logger.warning("stopped with requests unanswered after the grace period", metadata: ["requests": "\(cut)", "grace_s": "\(grace)"])
        } else {
            logger.notice("shut down")
        }
    }
}

/// `banyan bootstrap`: writes a new cluster's founding configuration into this node's blank data
/// directory and exits, so that the service that runs the node never needs `--new-cluster`.
struct Bootstrap: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Found a new cluster: initialise this founder's blank data directory, then exit.",
        discussion: """
            Run once on each founding member with the configuration its service will use (same \
            initial_members and cluster_id everywhere), then start the service. Refuses a data directory \
            that already holds state. See docs/operations.md, "Bootstrap".
            """)

    @OptionGroup var options: NodeOptions

    func run() throws {
        var config = try options.validatedConfig()
        guard !config.join else { throw ValidationError("bootstrap founds a cluster; a node that joins one needs no bootstrap") }
        config.newCluster = true
        var logger = Logger(label: "banyan")
        logger[metadataKey: "node"] = "\(config.nodeID)"
        do {
            try BanyanNode.bootstrapDataDirectory(config: config, logger: logger)
        } catch {
            logger.critical("cannot bootstrap", metadata: ["error": "\(error)"])
            throw ExitCode(1)
        }
        print("data directory \(config.dataDirectory) holds the founding configuration \(config.foundingMembers); start the node now")
    }
}

/// Blocks until SIGINT or SIGTERM arrives (both are then handled here, not by the default action).
/// With `onHangUp`, SIGHUP calls it (on a global queue) instead of ending the process.
func waitForTerminationSignal(onHangUp: (@Sendable () -> Void)? = nil) {
    let stop = DispatchSemaphore(value: 0)
    var sources: [any DispatchSourceSignal] = []
    if let onHangUp {
        signal(SIGHUP, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: SIGHUP, queue: .global())
        source.setEventHandler { onHangUp() }
        source.resume()
        sources.append(source)
    }
    for sig in [SIGINT, SIGTERM] {
        signal(sig, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
        source.setEventHandler { stop.signal() }
        source.resume()
        sources.append(source)
    }
    stop.wait()
    for source in sources { source.cancel() }
}
