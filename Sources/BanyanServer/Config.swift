import BanyanAuth
import BanyanREST
import BanyanStateMachine
import Foundation
import Yams

/// A node's configuration: built-in defaults, then a YAML file, then command-line flags
/// (docs/operations.md, "Configuration").
public struct NodeConfig: Sendable, Equatable {
    public var nodeID: UInt64 = 1
    public var clusterID: String = "banyan-dev"
    public var dataDirectory: String = "./banyan-data"
    /// Where clients connect (REST, SSE, status, metrics).
    public var clientAddress: HostPort = HostPort(host: "127.0.0.1", port: 9000)
    /// Where peers connect (mutual TLS).
    public var peerAddress: HostPort = HostPort(host: "127.0.0.1", port: 7000)
    /// The peer address other nodes dial (defaults to `peerAddress`).
    public var advertisedPeerAddress: HostPort?
    /// The client address other nodes send clients to when this node's clients are moved
    /// (`banyan drain`), published in the replicated `$cluster/clients/<id>`. Defaults to
    /// `clientAddress` unless that is a wildcard (`0.0.0.0`, `::`), when nothing is published.
    public var advertisedClientAddress: HostPort?
    /// The host the realtime hello names (`h`, where SDKs reconnect; iOS keeps it for good).
    /// Nil: the request's `Host`, which is what the client reached (a front's name included).
    public var publicHost: String?

    /// What this node publishes as its client address, if anything.
    public var publishedClientAddress: HostPort? {
        if let advertisedClientAddress { return advertisedClientAddress }
        let host = clientAddress.host
        return host.isEmpty || host == "0.0.0.0" || host == "::" || host == "[::]" ? nil : clientAddress
    }
    /// The founding members and their peer addresses. Used once, to bootstrap an empty data
    /// directory; afterwards membership lives in the replicated log.
    public var initialMembers: [UInt64: HostPort] = [:]
    /// A node started with `join` set waits, blank, to be added by an existing member.
    public var join: Bool = false
    /// Found a new cluster: on a blank data directory, write the founding configuration from
    /// `initialMembers`. Set only by the `--new-cluster` flag (never from a file), so that a
    /// founder whose disk was wiped and that is restarted with its usual configuration cannot
    /// silently found the cluster again and vote with amnesia (R22). A blank directory with no
    /// `initialMembers`, or with this node as the only one, founds a single-node cluster without it.
    public var newCluster: Bool = false
    /// `banyan serve --salvage-log` (one start only; never in a configuration file): open a log
    /// whose last segment is damaged before valid records by cutting it there; the node then
    /// comes back without a vote under a new incarnation (docs/runbook.md).
    public var salvageDamagedLog: Bool = false

    public var tls = TLSPaths()
    public var raft = RaftTuning()
    public var http = HTTPLimits()
    public var development = DevelopmentSettings()
    public var history = HistorySettings()
    public var auth = AuthSettings()
    public var accounts = AccountSettings()
    /// Namespace for requests that name none (no `ns`, and a Host that is an IP literal).
    public var defaultNamespace: String = "default"
    public var logLevel: String = "info"
    /// A file holding the operator token. When set, membership and transfer requests
    /// (`/.banyan/members…`, `/.banyan/transfer`) need `Authorization: Bearer <token>`; without
    /// it they follow the development settings, like data requests.
    public var adminTokenFile: String?
    /// Free-space alarm (docs/operations.md, "Disk space"): below this many free bytes on the
    /// data directory's file system the node raises its alarm through the log, and the cluster
    /// accepts only deletes until it has twice as much free again. 0 turns the alarm off.
    public var minFreeBytes: UInt64 = 256 << 20
    /// The ballast (docs/operations.md, "Disk space"): bytes held in reserve in `DATA/ballast`,
    /// released when the node starts on a full disk so that it can start, and made again once
    /// there is this much free besides twice `min_free_bytes`. Nil: the default, 64 MiB or a
    /// quarter of `min_free_bytes` if less (`effectiveBallastBytes`); set, it must be below
    /// `min_free_bytes`. Not made with the alarm off. 0: none (an existing one is removed).
    public var ballastBytes: UInt64?
    /// The ballast's size in force.
    public var effectiveBallastBytes: UInt64 { ballastBytes ?? min(64 << 20, minFreeBytes / 4) }
    /// Inbound peer connections on a thread of their own (default), so their TLS handshakes and
    /// decryption never hold the replica loop; false: on the replica loop (one hand-off less
    /// per inbound read burst; docs/server.md).
    public var peerInboundThread: Bool = true
    /// Outbound peer connections (encoding and encrypting what this node sends its peers) on the
    /// peer thread too (true, the default), or on the replica loop (false). A leader's appends
    /// of large entries cost tens of milliseconds of encoding and encryption per follower; off
    /// the loop, they no longer delay its heartbeats (docs/server.md, "Large writes").
    public var peerOutboundThread: Bool = true
    /// Outbound connections per peer (`PeerLane`; docs/server.md, "Large writes"): 2 (the default), one
    /// for appends, snapshot chunks and proposals and one for everything else, so heartbeats,
    /// votes and acknowledgements never queue behind appends of large entries (issue 18); 1:
    /// everything on one connection. Peers need not agree: the receiving side takes any number
    /// of connections from a peer.
    public var peerLanes: Int = 3
    /// Network threads (nil: `defaultThreads`). With 1, the replica loop shares that thread
    /// too: a single-threaded node.
    public var threads: Int?
    /// The fault switch for local failover testing (`--allow-fault-injection`; docs/chaos.md):
    /// `/.banyan/faults` may drop peer traffic and slow peer messages and fsyncs. Refused unless
    /// both the client and the peer addresses are loopback. Not settable from a file: it belongs
    /// to a `banyan cluster local` command line, never to a service's configuration.
    public var allowFaultInjection: Bool = false

    /// One thread for the whole node on a machine of one or two cores; otherwise one network
    /// thread per core, at most 4, next to the replica thread. On the 2-core benchmark machine
    /// (three nodes and the load generator sharing it) one thread per node cost half the context
    /// switches per write at about the same throughput (docs/benchmarks.md); a single node on
    /// two cores was not measured separately. `threads` overrides it.
    public static func defaultThreads(cores: Int) -> Int {
        cores <= 2 ? 1 : min(4, cores)
    }

    public struct TLSPaths: Sendable, Equatable {
        /// Directory of the development CA and certificates generated on first run.
        public var directory: String?
        public var caCertificate: String?
        public var certificate: String?
        public var privateKey: String?
        /// Generate a development CA and node certificate when the files are absent.
        public var generateDevelopmentCertificates: Bool = true
        /// A peer's hello must come with a certificate naming it (`node<id>` as its common name
        /// or DNS name). Turn off only for certificates named otherwise.
        public var bindNodeIDs: Bool = true
        /// A certificate (node, CA or client port) with fewer days than this left before it
        /// expires is logged as a warning, once a day (docs/certificates.md).
        public var expiryWarningDays: Int = 30
        public init() {}
    }

    public struct RaftTuning: Sendable, Equatable {
        public var tickMilliseconds: Int = 20
        public var electionTicks: Int = 10
        public var heartbeatTicks: Int = 2
        public var snapshotEntries: UInt64 = 100_000
        /// A snapshot is also taken once the entries applied since the last one carry this many
        /// payload bytes (or the last snapshot file's size, if larger); 0: by entries only.
        public var snapshotLogBytes: UInt64 = 1 << 30
        public var requestTimeoutMilliseconds: Int = 8_000
        /// Under load the leader starts a replication round (an append to each follower and an
        /// fsync on every node) at most once per this many microseconds; 0 starts one as soon as
        /// the previous is persisted. Only new proposals wait, and only after a round of more than
        /// one entry (docs/server.md, "Round pacing"). At most half the heartbeat interval.
        public var roundIntervalMicroseconds: Int = 800
        /// Writes whose command is at least this many bytes are staged (docs/staged-payloads.md):
        /// stored on a quorum before a small entry naming them enters the log, so no write behind
        /// them waits for their bytes. 0: never.
        public var stagingThresholdBytes: Int = 1 << 20
        public init() {}
    }

    public struct HTTPLimits: Sendable, Equatable {
        /// At most 32 MiB: a write must fit in one log record and one peer frame (64 MiB each).
        public var maxBodyBytes: Int = 16 << 20
        /// Paths one multi-path update (REST `PATCH`, realtime `m` and `om`) may change; more get
        /// 400 / a `failure` before anything is proposed (`WriteValidation.defaultMaxUpdatePaths`).
        public var maxUpdateKeys: Int = 1_000
        public var maxConnections: Int = 20_000
        /// Connections one client address may hold at once (more are closed on accept), so no
        /// one client takes all `maxConnections` (issue 18).
        public var maxConnectionsPerClient: Int = 2_000
        /// Event streams one client address may hold at once (more get 429).
        public var maxStreamsPerClient: Int = 500
        /// A whole request (head and body) must arrive within this many seconds of the connection
        /// opening or of the previous response, or it gets 408 and the connection closes; a
        /// connection with no request by then is simply closed. Event streams are exempt.
        public var requestReadTimeoutSeconds: Int = 30
        public var keepAliveSeconds: Int = 30
        /// On SIGTERM or SIGINT the node stops accepting connections, then waits up to this many
        /// seconds for the requests it has read to be answered (their writes commit through
        /// the cluster meanwhile) before it closes everything (`BanyanNode.stop(grace:)`).
        public var stopGraceSeconds: Int = 10
        /// Origins whose browser pages may read answers (`Access-Control-Allow-Origin`): exact
        /// origins (`https://app.example.com`), or `*` for any, which only a development node
        /// may use. Nil: `*` while `development.allow_unauthenticated` is on, else none.
        public var corsOrigins: [String]?
        /// Whether the operator endpoints that only describe the node are open to anyone who
        /// reaches the client port: `GET /.banyan/status`, `/drain`, `/tls`, `/faults` and
        /// `/metrics`. False: they need the operator's credentials like the rest of
        /// `/.banyan/` (the liveness and readiness probes `/health` and `/ready` stay open for
        /// load balancers). Nil (the default): open only while the client address is loopback
        /// (`NodeConfig.effectiveOpenOperatorReads`), so a node others can reach asks for the
        /// token on its whole operator API.
        public var openOperatorReads: Bool?
        /// Bytes of realtime messages being assembled (fragments and protocol chunks received,
        /// the message not yet whole) the node holds at once, over all connections: each may
        /// hold up to 16 MiB, so without a node-wide bound 20,000 slow senders could hold
        /// 320 GiB. A connection whose next fragment does not fit is closed with 1013 (try
        /// again later); the SDKs reconnect and send again.
        public var maxAssemblingBytes: Int = 256 << 20
        /// Bytes of answers written to clients that do not read them (still in the connections'
        /// write buffers), over all connections: each may queue up to 16 MiB (the write buffer's
        /// high-water mark) plus the answer being written, so without a node-wide bound a few
        /// dozen clients pipelining large reads hold gigabytes (issue 18). A connection holding
        /// some while the budget is spent is not answered or read until they drain; one holding
        /// none always gets its next answer.
        public var maxQueuedAnswerBytes: Int = 256 << 20
        /// HTTPS and WSS on the client port (docs/security.md, "HTTPS"): a PEM certificate chain
        /// and its private key. Both set: every client connection is TLS (1.2 or 1.3); neither:
        /// plain HTTP (for loopback, or behind a proxy that terminates TLS).
        public var tlsCertificate: String?
        public var tlsPrivateKey: String?
        public init() {}
    }

    /// Verified credentials (docs/security.md): ID tokens checked against public keys, Firebase
    /// 2.x custom tokens and database secrets. Nothing is verified while no file is set.
    public struct AuthSettings: Sendable, Equatable {
        /// A Firebase project id: the issuer `https://securetoken.google.com/<id>` and the
        /// audience `<id>` unless `issuer` / `audience` say otherwise.
        public var projectID: String?
        /// The `iss` ID tokens must carry.
        public var issuer: String?
        /// The `aud` ID tokens must carry.
        public var audience: String?
        /// ID-token public keys as a JWKS (`{"keys": [{"kty": "RSA", "kid", "n", "e"}]}`).
        public var jwksFile: String?
        /// ID-token public keys in Google's format: a JSON object from `kid` to a PEM
        /// certificate or public key.
        public var x509File: String?
        /// Database secrets, one a line: they sign custom tokens and are administrator
        /// credentials themselves. Several lines: all are accepted (rotation).
        public var databaseSecretsFile: String?
        /// How far `exp`, `iat` and `nbf` may be off the node's clock.
        public var clockSkewSeconds: Int = 300
        /// OpenID Connect providers whose ID tokens `accounts:signInWithIdp` accepts
        /// (docs/accounts.md, "Sign-in with an identity provider").
        public var oidcProviders: [OIDCProviderSettings] = []
        /// Administrator credentials shaped like Google service-account keys (docs/security.md,
        /// "Service accounts"): a JSON object from each account's name to its public keys as a
        /// JWKS, as `banyan service-account create` writes it.
        public var serviceAccountsFile: String?
        /// The `aud` a service account's token must name: the `token_uri` of its key files (the
        /// token endpoint as clients reach it) and any other audience the operator chooses.
        public var serviceAccountAudiences: [String] = []
        public init() {}

        /// Whether any credential is verified.
        public var isConfigured: Bool { jwksFile != nil || x509File != nil || databaseSecretsFile != nil }
        /// The issuer ID tokens must name: `issuer`, else the project's.
        public var effectiveIssuer: String? { issuer ?? projectID.map { "https://securetoken.google.com/" + $0 } }
        /// The audience ID tokens must name: `audience`, else the project id.
        public var effectiveAudience: String? { audience ?? projectID }
    }

    /// One OpenID Connect provider (`auth.oidc_providers`): tokens it issued to one of
    /// `audiences` under `issuer`, signed with a key of `keysFile`, sign users in as
    /// `<id>:<sub>`.
    public struct OIDCProviderSettings: Sendable, Equatable {
        /// The provider's name in uids and `providerId` (`google.com`): 1 to 64 letters, digits,
        /// `.`, `-` or `_`, never one of the service's own sign-in methods.
        public var id: String
        public var issuer: String
        /// The client ids its tokens may name in `aud`.
        public var audiences: [String]
        /// A JWKS, Google's certificates JSON, or one PEM public key or certificate.
        public var keysFile: String
        /// Clock skew for this provider's tokens (nil: `auth.clock_skew_seconds`).
        public var clockSkewSeconds: Int?
        /// What its users' uids start with, before `:` (nil: the id up to its first `.`).
        public var uidPrefix: String?

        public init(id: String, issuer: String, audiences: [String], keysFile: String, clockSkewSeconds: Int? = nil, uidPrefix: String? = nil) {
            self.id = id
            self.issuer = issuer
            self.audiences = audiences
            self.keysFile = keysFile
            self.clockSkewSeconds = clockSkewSeconds
            self.uidPrefix = uidPrefix
        }

        /// The uid prefix in force.
        public var effectiveUIDPrefix: String { uidPrefix ?? String(id.prefix { $0 != "." }) }

        /// Whether `prefix` can start uids: 1 to 64 letters, digits, `-` or `_` (a valid database
        /// key without `:`).
        public static func isValidUIDPrefix(_ prefix: String) -> Bool {
            let bytes = Array(prefix.utf8)
            return (1...64).contains(bytes.count) && bytes.allSatisfy { (0x61...0x7A).contains($0 | 0x20) || (0x30...0x39).contains($0) || $0 == 0x2D || $0 == 0x5F }
        }

        /// Provider ids that would be mistaken for the service's own sign-in methods (or the
        /// `email` entry of `firebase.identities`).
        public static let reservedIDs: Set<String> = ["password", "anonymous", "custom", "phone", "email", "firebase", "emailLink"]

        /// Whether `id` can name a provider.
        public static func isValidID(_ id: String) -> Bool {
            let bytes = Array(id.utf8)
            return (1...64).contains(bytes.count) && !reservedIDs.contains(id)
                && bytes.allSatisfy { (0x61...0x7A).contains($0 | 0x20) || (0x30...0x39).contains($0) || $0 == 0x2E || $0 == 0x2D || $0 == 0x5F }
        }
    }

    /// The built-in account service (docs/accounts.md): the Identity Toolkit endpoints on the
    /// client port, accounts in the replicated state.
    public struct AccountSettings: Sendable, Equatable {
        /// The project of the endpoints that name none (`/v1/accounts:signUp?key=…`): the
        /// issuer and audience of the ID tokens they issue. Project-scoped endpoints
        /// (`/v1/projects/<id>/accounts…`) use the project they name.
        public var projectID: String = "demo-banyan"
        /// Further projects this node serves and whose ID tokens its data API honours. Any
        /// other project's endpoints answer `INVALID_PROJECT_ID` except to an administrator,
        /// and its tokens are never accepted.
        public var projects: [String] = []
        /// Whether anyone may create an account (`accounts:signUp` without administrator
        /// credentials). Nil: only while `development.allow_unauthenticated` is on.
        public var allowSignUp: Bool?
        /// log2 of scrypt's N for new password hashes (r = 8, p = 1); each hash records its own.
        public var scryptLogN: Int = 15
        /// Where password-reset codes go (there is no mail): a file each code is appended to as
        /// a JSON line. Nil: the node's log (at notice level).
        public var resetCodeFile: String?
        /// Threads that hash passwords (never the replica thread nor a network thread).
        public var hashThreads: Int = 1
        /// Password hashes waiting or running at once; more are answered
        /// `TOO_MANY_ATTEMPTS_TRY_LATER`.
        public var maxPendingHashes: Int = 64
        /// Password-reset emails (`accounts:sendOobCode`) per address per minute.
        public var resetCodesPerMinute: Int = 3
        /// Wrong passwords per account per minute (`accounts:signInWithPassword`, on this node);
        /// past it the account's sign-ins are answered `TOO_MANY_ATTEMPTS_TRY_LATER`, without a
        /// hash, until the minute ends.
        public var failedSignInsPerAccount: Int = 10
        /// Wrong passwords per client IP address per minute, over every account (on this node).
        public var failedSignInsPerClient: Int = 60
        public init() {}

        /// The projects served: `project_id` and `projects`.
        public var servedProjects: Set<String> { Set([projectID] + projects) }
    }

    /// What a node keeps for reads of the past (`?at=`) and log archivers (`/.banyan/log`),
    /// docs/backup.md "Reads of the past" and docs/operations.md "Memory" for the cost.
    public struct HistorySettings: Sendable, Equatable {
        /// States kept at the node's last snapshots (0 to 2): reads of the past replay from the
        /// newest at or before their index. 0: only the current state answers `?at=`.
        public var bases: Int = 2
        /// Payload bytes of compacted entries kept in memory for archivers and reads of the
        /// past (0: none; an archiver must then keep up with the log).
        public var retainedBytes: Int = 64 << 20
        public init() {}
    }

    public struct DevelopmentSettings: Sendable, Equatable {
        /// Namespaces without security rules accept requests without credentials (loopback
        /// nodes only: `checkSafeDefaults`).
        public var allowUnauthenticated: Bool = true
        /// Accept `Authorization: Bearer owner` (and `auth=owner`) as the administrator, as the
        /// Firebase emulator does.
        public var acceptOwnerToken: Bool = true
        public init() {}
    }

    public init() {}

    public var advertised: HostPort { advertisedPeerAddress ?? peerAddress }

    /// The founding members a blank data directory would start with.
    public var foundingMembers: [UInt64] { initialMembers.isEmpty ? [nodeID] : initialMembers.keys.sorted() }

    /// Whether a blank data directory founds a cluster on start: a single-node cluster always
    /// (the development default), a larger one only with `newCluster`.
    public var foundsClusterWhenBlank: Bool { !join && (newCluster || foundingMembers == [nodeID]) }
    public var tlsDirectory: String { tls.directory ?? dataDirectory + "/certs" }

    /// Reads the operator token (`adminTokenFile`): the file's first line, at least 16 bytes.
    public func loadAdminToken() throws(ConfigError) -> String? {
        guard let file = adminTokenFile else { return nil }
        let text: String
        do {
            text = try String(contentsOfFile: file, encoding: .utf8)
        } catch {
            throw ConfigError("cannot read admin_token_file \(file): \(error.localizedDescription)")
        }
        let token = text.split(whereSeparator: \.isNewline).first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
        guard token.utf8.count >= 16 else { throw ConfigError("admin_token_file \(file): the token must be at least 16 characters") }
        return token
    }
}

public struct HostPort: Sendable, Equatable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// A loopback address (127.0.0.0/8, ::1, localhost): reachable from this machine only.
    public var isLoopback: Bool {
        let h = host.lowercased()
        if h == "localhost" || h == "::1" || h == "[::1]" { return true }
        let parts = h.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts[0] == "127" && parts.allSatisfy { UInt8($0) != nil }
    }

    /// Parses `host:port` or `[v6]:port`.
    public init(parsing text: String) throws(ConfigError) {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        guard let colon = trimmed.lastIndex(of: ":") else { throw ConfigError("'\(text)' is not host:port") }
        var host = String(trimmed[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty, let port = Int(trimmed[trimmed.index(after: colon)...]), (0...65535).contains(port) else {
            throw ConfigError("'\(text)' is not host:port with a port from 0 to 65535")
        }
        self.init(host: host, port: port)
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

extension NodeConfig {
    /// Reads a YAML configuration file over the defaults. Unknown keys are errors (a typo must
    /// not silently fall back to a default).
    public static func load(file: String, over base: NodeConfig = NodeConfig()) throws(ConfigError) -> NodeConfig {
        let text: String
        do {
            text = try String(contentsOfFile: file, encoding: .utf8)
        } catch {
            throw ConfigError("cannot read configuration file \(file): \(error.localizedDescription)")
        }
        return try parse(yaml: text, source: file, over: base)
    }

    public static func parse(yaml text: String, source: String = "configuration", over base: NodeConfig = NodeConfig()) throws(ConfigError)
        -> NodeConfig
    {
        let root: Any?
        do {
            root = try Yams.load(yaml: text)
        } catch {
            throw ConfigError("\(source): not valid YAML: \(error)")
        }
        var c = base
        guard let top = root else { return c }
        guard let map = top as? [String: Any] else { throw ConfigError("\(source): the top level must be a mapping") }
        let r = Reader(source: source)
        for (key, value) in map {
            switch key {
            case "node_id": c.nodeID = try r.uint(value, key)
            case "cluster_id": c.clusterID = try r.string(value, key)
            case "data_dir": c.dataDirectory = try r.string(value, key)
            case "client_address": c.clientAddress = try r.hostPort(value, key)
            case "peer_address": c.peerAddress = try r.hostPort(value, key)
            case "advertise_peer_address": c.advertisedPeerAddress = try r.hostPort(value, key)
            case "advertise_client_address": c.advertisedClientAddress = try r.hostPort(value, key)
            case "public_host":
                let host = try r.string(value, key)
                guard !host.isEmpty, host.utf8.count <= 255, host.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != 0x2F }) else {
                    throw ConfigError("\(source): public_host must be a host[:port] of printable characters without '/', at most 255")
                }
                c.publicHost = host
            case "join": c.join = try r.bool(value, key)
            case "default_namespace": c.defaultNamespace = try r.string(value, key)
            case "log_level": c.logLevel = try r.string(value, key)
            case "admin_token_file": c.adminTokenFile = try r.string(value, key)
            case "threads": c.threads = try r.int(value, key, 1...64)
            case "peer_inbound_thread": c.peerInboundThread = try r.bool(value, key)
            case "peer_outbound_thread": c.peerOutboundThread = try r.bool(value, key)
            case "peer_lanes": c.peerLanes = try r.int(value, key, 1...3)
            case "storage":
                for (k, v) in try r.map(value, key) {
                    switch k {
                    case "min_free_bytes": c.minFreeBytes = try r.uint(v, "storage.min_free_bytes")
                    case "ballast_bytes": c.ballastBytes = try r.uint(v, "storage.ballast_bytes")
                    default: throw ConfigError("\(source): unknown key storage.\(k)")
                    }
                }
            case "initial_members":
                guard let members = value as? [AnyHashable: Any] else { throw ConfigError("\(source): initial_members must map node ids to host:port") }
                c.initialMembers = [:]
                for (k, v) in members {
                    let id = try r.uint(k, "initial_members key")
                    c.initialMembers[id] = try r.hostPort(v, "initial_members.\(id)")
                }
            case "tls":
                for (k, v) in try r.map(value, key) {
                    switch k {
                    case "dir": c.tls.directory = try r.string(v, "tls.dir")
                    case "ca": c.tls.caCertificate = try r.string(v, "tls.ca")
                    case "cert": c.tls.certificate = try r.string(v, "tls.cert")
                    case "key": c.tls.privateKey = try r.string(v, "tls.key")
                    case "generate_development_certificates": c.tls.generateDevelopmentCertificates = try r.bool(v, "tls.\(k)")
                    case "bind_node_ids": c.tls.bindNodeIDs = try r.bool(v, "tls.\(k)")
                    case "expiry_warning_days": c.tls.expiryWarningDays = try r.int(v, "tls.\(k)", 1...3650)
                    default: throw ConfigError("\(source): unknown key tls.\(k)")
                    }
                }
            case "raft":
                for (k, v) in try r.map(value, key) {
                    switch k {
                    case "tick_ms": c.raft.tickMilliseconds = try r.int(v, "raft.tick_ms", 1...10_000)
                    case "election_ticks": c.raft.electionTicks = try r.int(v, "raft.election_ticks", 2...10_000)
                    case "heartbeat_ticks": c.raft.heartbeatTicks = try r.int(v, "raft.heartbeat_ticks", 1...10_000)
                    case "snapshot_entries": c.raft.snapshotEntries = try r.uint(v, "raft.snapshot_entries")
                    case "snapshot_log_bytes":
                        let bytes = try r.uint(v, "raft.snapshot_log_bytes")
                        guard bytes == 0 || bytes >= 1 << 20 else {
                            throw ConfigError("\(source): raft.snapshot_log_bytes must be 0 (by entries only) or at least 1048576 (1 MiB)")
                        }
                        c.raft.snapshotLogBytes = bytes
                    case "request_timeout_ms": c.raft.requestTimeoutMilliseconds = try r.int(v, "raft.request_timeout_ms", 100...3_600_000)
                    case "round_interval_us": c.raft.roundIntervalMicroseconds = try r.int(v, "raft.round_interval_us", 0...100_000)
                    case "staging_threshold_bytes": c.raft.stagingThresholdBytes = try r.int(v, "raft.staging_threshold_bytes", 0...(64 << 20))
                    default: throw ConfigError("\(source): unknown key raft.\(k)")
                    }
                }
            case "http":
                for (k, v) in try r.map(value, key) {
                    switch k {
                    case "max_body_bytes": c.http.maxBodyBytes = try r.int(v, "http.max_body_bytes", 1024...(32 << 20))
                    case "max_update_keys": c.http.maxUpdateKeys = try r.int(v, "http.max_update_keys", 1...1_000_000)
                    case "max_connections": c.http.maxConnections = try r.int(v, "http.max_connections", 1...1_000_000)
                    case "max_connections_per_client":
                        c.http.maxConnectionsPerClient = try r.int(v, "http.max_connections_per_client", 1...1_000_000)
                    case "max_streams_per_client": c.http.maxStreamsPerClient = try r.int(v, "http.max_streams_per_client", 1...1_000_000)
                    case "request_read_timeout_s": c.http.requestReadTimeoutSeconds = try r.int(v, "http.request_read_timeout_s", 1...3_600)
                    case "keep_alive_s": c.http.keepAliveSeconds = try r.int(v, "http.keep_alive_s", 1...3_600)
                    case "stop_grace_s": c.http.stopGraceSeconds = try r.int(v, "http.stop_grace_s", 0...300)
                    case "cors_origins":
                        guard let list = v as? [Any] else { throw ConfigError("\(source): http.cors_origins must be a list of origins") }
                        c.http.corsOrigins = try list.map { (item) throws(ConfigError) in try r.string(item, "http.cors_origins") }
                    case "max_assembling_bytes":
                        c.http.maxAssemblingBytes = try r.int(v, "http.max_assembling_bytes", (64 << 10)...(64 << 30))
                    case "max_queued_answer_bytes":
                        c.http.maxQueuedAnswerBytes = try r.int(v, "http.max_queued_answer_bytes", (1 << 20)...(64 << 30))
                    case "open_operator_reads": c.http.openOperatorReads = try r.bool(v, "http.open_operator_reads")
                    case "tls_cert": c.http.tlsCertificate = try r.string(v, "http.tls_cert")
                    case "tls_key": c.http.tlsPrivateKey = try r.string(v, "http.tls_key")
                    default: throw ConfigError("\(source): unknown key http.\(k)")
                    }
                }
            case "auth":
                for (k, v) in try r.map(value, key) {
                    switch k {
                    case "project_id": c.auth.projectID = try r.string(v, "auth.\(k)")
                    case "issuer": c.auth.issuer = try r.string(v, "auth.\(k)")
                    case "audience": c.auth.audience = try r.string(v, "auth.\(k)")
                    case "jwks_file": c.auth.jwksFile = try r.string(v, "auth.\(k)")
                    case "x509_file": c.auth.x509File = try r.string(v, "auth.\(k)")
                    case "database_secrets_file": c.auth.databaseSecretsFile = try r.string(v, "auth.\(k)")
                    case "clock_skew_seconds": c.auth.clockSkewSeconds = try r.int(v, "auth.\(k)", 0...3_600)
                    case "service_accounts_file": c.auth.serviceAccountsFile = try r.string(v, "auth.\(k)")
                    case "service_account_audiences", "service_account_audience":
                        if let list = v as? [Any] {
                            c.auth.serviceAccountAudiences = try list.map { (item) throws(ConfigError) in try r.string(item, "auth.\(k)") }
                        } else {
                            c.auth.serviceAccountAudiences = [try r.string(v, "auth.\(k)")]
                        }
                    case "oidc_providers":
                        guard let list = v as? [Any] else { throw ConfigError("\(source): auth.oidc_providers must be a list of providers") }
                        c.auth.oidcProviders = try list.enumerated().map { (i, item) throws(ConfigError) in try r.oidcProvider(item, "auth.oidc_providers[\(i)]") }
                    default: throw ConfigError("\(source): unknown key auth.\(k)")
                    }
                }
            case "accounts":
                for (k, v) in try r.map(value, key) {
                    switch k {
                    case "project_id": c.accounts.projectID = try r.string(v, "accounts.\(k)")
                    case "scrypt_log_n": c.accounts.scryptLogN = try r.int(v, "accounts.\(k)", 10...20)
                    case "reset_code_file": c.accounts.resetCodeFile = try r.string(v, "accounts.\(k)")
                    case "projects":
                        guard let list = v as? [Any] else { throw ConfigError("\(source): accounts.projects must be a list of project ids") }
                        c.accounts.projects = try list.map { (item) throws(ConfigError) in try r.string(item, "accounts.projects") }
                    case "allow_sign_up": c.accounts.allowSignUp = try r.bool(v, "accounts.\(k)")
                    case "reset_codes_per_minute": c.accounts.resetCodesPerMinute = try r.int(v, "accounts.\(k)", 1...1_000)
                    case "failed_sign_ins_per_account": c.accounts.failedSignInsPerAccount = try r.int(v, "accounts.\(k)", 1...100_000)
                    case "failed_sign_ins_per_client": c.accounts.failedSignInsPerClient = try r.int(v, "accounts.\(k)", 1...100_000)
                    case "hash_threads": c.accounts.hashThreads = try r.int(v, "accounts.\(k)", 1...64)
                    case "max_pending_hashes": c.accounts.maxPendingHashes = try r.int(v, "accounts.\(k)", 1...100_000)
                    default: throw ConfigError("\(source): unknown key accounts.\(k)")
                    }
                }
            case "history":
                for (k, v) in try r.map(value, key) {
                    switch k {
                    case "bases": c.history.bases = try r.int(v, "history.bases", 0...2)
                    case "retained_bytes": c.history.retainedBytes = try r.int(v, "history.retained_bytes", 0...(1 << 40))
                    default: throw ConfigError("\(source): unknown key history.\(k)")
                    }
                }
            case "development":
                for (k, v) in try r.map(value, key) {
                    switch k {
                    case "allow_unauthenticated": c.development.allowUnauthenticated = try r.bool(v, "development.\(k)")
                    case "accept_owner_token": c.development.acceptOwnerToken = try r.bool(v, "development.\(k)")
                    default: throw ConfigError("\(source): unknown key development.\(k)")
                    }
                }
            default:
                throw ConfigError("\(source): unknown key \(key)")
            }
        }
        try c.validate()
        return c
    }

    public func validate() throws(ConfigError) {
        guard nodeID != 0 else { throw ConfigError("node_id must be at least 1") }
        guard (http.tlsCertificate == nil) == (http.tlsPrivateKey == nil) else {
            throw ConfigError("http.tls_cert and http.tls_key go together: set both for HTTPS on the client port, or neither")
        }
        guard raft.electionTicks > raft.heartbeatTicks else { throw ConfigError("raft.election_ticks must exceed raft.heartbeat_ticks") }
        // A held round must never come near the heartbeat interval (held proposals only, but keep
        // the margin wide).
        let heartbeatMicroseconds = raft.tickMilliseconds * raft.heartbeatTicks * 1_000
        guard raft.roundIntervalMicroseconds >= 0, raft.roundIntervalMicroseconds <= heartbeatMicroseconds / 2 else {
            throw ConfigError(
                "raft.round_interval_us must be from 0 to half the heartbeat interval (raft.tick_ms × raft.heartbeat_ticks = \(heartbeatMicroseconds) µs)")
        }
        if !join && !initialMembers.isEmpty && initialMembers[nodeID] == nil {
            throw ConfigError("initial_members must include this node (\(nodeID)) unless join is set")
        }
        if join && newCluster { throw ConfigError("--new-cluster and join exclude each other") }
        guard !clusterID.isEmpty else { throw ConfigError("cluster_id must not be empty") }
        if let ballastBytes, ballastBytes > 0, minFreeBytes > 0, ballastBytes >= minFreeBytes {
            throw ConfigError(
                "storage.ballast_bytes (\(ballastBytes)) must be below storage.min_free_bytes (\(minFreeBytes)): a node started on a full disk runs on its ballast and must raise the free-space alarm there"
            )
        }
        if auth.jwksFile != nil || auth.x509File != nil, auth.effectiveIssuer == nil || auth.effectiveAudience == nil {
            throw ConfigError("auth: ID token keys (jwks_file, x509_file) need auth.project_id, or auth.issuer and auth.audience")
        }
        if !auth.isConfigured, auth.projectID != nil || auth.issuer != nil || auth.audience != nil {
            throw ConfigError("auth: set jwks_file or x509_file (ID tokens) or database_secrets_file (custom tokens): nothing is verified without them")
        }
        if auth.serviceAccountsFile != nil, auth.serviceAccountAudiences.isEmpty || auth.serviceAccountAudiences.contains(where: \.isEmpty) {
            throw ConfigError(
                "auth.service_accounts_file needs auth.service_account_audiences: the token_uri of the accounts' key files (such as https://db.example.com/oauth2.googleapis.com/token), none empty"
            )
        }
        if let unsafe = auth.serviceAccountAudiences.first(where: { !ServiceAccounts.isSafeAudience($0) }) {
            throw ConfigError(
                "auth.service_account_audiences: \(unsafe) is plain HTTP to a host other than loopback; service accounts' tokens are administrator credentials: use https")
        }
        if auth.serviceAccountsFile == nil, !auth.serviceAccountAudiences.isEmpty {
            throw ConfigError("auth.service_account_audiences is set but auth.service_accounts_file is not: no service account would be accepted")
        }
        var providerIDs: Set<String> = []
        var uidPrefixes: Set<String> = []
        for provider in auth.oidcProviders {
            guard OIDCProviderSettings.isValidID(provider.id) else {
                throw ConfigError(
                    "auth.oidc_providers: id '\(provider.id)' must be 1 to 64 letters, digits, '.', '-' or '_' and not one of "
                        + OIDCProviderSettings.reservedIDs.sorted().joined(separator: ", "))
            }
            guard providerIDs.insert(provider.id).inserted else { throw ConfigError("auth.oidc_providers: provider id '\(provider.id)' appears twice") }
            let prefix = provider.effectiveUIDPrefix
            guard OIDCProviderSettings.isValidUIDPrefix(prefix) else {
                throw ConfigError("auth.oidc_providers (\(provider.id)): uid_prefix '\(prefix)' must be 1 to 64 letters, digits, '-' or '_'")
            }
            guard uidPrefixes.insert(prefix).inserted else {
                throw ConfigError(
                    "auth.oidc_providers (\(provider.id)): uid prefix '\(prefix)' is another provider's too; set uid_prefix so each provider's uids are its own")
            }
            guard !provider.issuer.isEmpty, !provider.audiences.isEmpty, provider.audiences.allSatisfy({ !$0.isEmpty }), !provider.keysFile.isEmpty else {
                throw ConfigError("auth.oidc_providers (\(provider.id)): issuer, audience and keys_file must not be empty")
            }
        }
        for project in [accounts.projectID] + accounts.projects where !StateMachine.isValidProject(project) {
            throw ConfigError("accounts project id '\(project)' must be 1 to 63 lowercase letters, digits or '-'")
        }
        guard RESTRequest.isValidNamespace(defaultNamespace) else {
            throw ConfigError("default_namespace '\(defaultNamespace)' must be 1 to 63 letters, digits, '-' or '_'")
        }
        try checkSafeDefaults()
        if allowFaultInjection && !(clientAddress.isLoopback && peerAddress.isLoopback && advertised.isLoopback) {
            throw ConfigError(
                "--allow-fault-injection is for local failover testing only: the client address (\(clientAddress)) and the peer "
                    + "address (\(advertised)) must both be loopback addresses (docs/chaos.md).")
        }
    }

    /// Safe by default (docs/security.md): a development convenience never reaches a
    /// non-loopback address. The zero-setup node (`banyan serve`) listens on loopback; a node
    /// that listens anywhere else refuses to start while a development setting would expose it,
    /// naming the setting and how to turn it off.
    /// Whether status, drain, TLS, faults and metrics are open without the operator's credentials
    /// (see `HTTPSettings.openOperatorReads`).
    public var effectiveOpenOperatorReads: Bool { http.openOperatorReads ?? clientAddress.isLoopback }

    /// The CORS origins in force (see `HTTPSettings.corsOrigins`).
    /// Whether public sign-up is on (see `AccountSettings.allowSignUp`).
    public var effectiveAllowSignUp: Bool { accounts.allowSignUp ?? development.allowUnauthenticated }

    public var effectiveCORSOrigins: [String] { http.corsOrigins ?? (development.allowUnauthenticated ? ["*"] : []) }

    func checkSafeDefaults() throws(ConfigError) {
        let exposed = !clientAddress.isLoopback
        if exposed && development.allowUnauthenticated {
            throw ConfigError(
                "development.allow_unauthenticated is on and the client address \(clientAddress) is not a loopback address: anyone who "
                    + "reaches it could read and write every namespace that has no security rules. Set `development: {allow_unauthenticated: false}` "
                    + "(and security rules: docs/rules.md), or listen on 127.0.0.1.")
        }
        if exposed && development.acceptOwnerToken {
            throw ConfigError(
                "development.accept_owner_token is on and the client address \(clientAddress) is not a loopback address: the literal token "
                    + "`owner` would be an administrator's key for anyone who reaches it. Set `development: {accept_owner_token: false}` "
                    + "(operators use admin_token_file), or listen on 127.0.0.1.")
        }
        if (http.corsOrigins ?? []).contains("*") && !development.allowUnauthenticated {
            throw ConfigError(
                "http.cors_origins contains `*` on a node that is not in development (development.allow_unauthenticated is off): name "
                    + "the origins of your apps instead (https://app.example.com).")
        }
        for origin in http.corsOrigins ?? [] where origin != "*" {
            guard origin.hasPrefix("https://") || origin.hasPrefix("http://"), !origin.hasSuffix("/"), HTTPResponseWriter.isFieldText(origin) else {
                throw ConfigError("http.cors_origins: '\(origin)' is not an origin (scheme://host[:port], no path)")
            }
        }
        let peerExposed = !peerAddress.isLoopback
        if peerExposed && tls.generateDevelopmentCertificates {
            throw ConfigError(
                "tls.generate_development_certificates is on and the peer address \(peerAddress) is not a loopback address: development "
                    + "certificates keep their CA's private key beside the node's. Give tls.ca, tls.cert and tls.key from your own CA "
                    + "(`banyan certs ca` and `banyan certs node`, docs/operations.md) and set `tls: {generate_development_certificates: false}`, "
                    + "or use loopback addresses.")
        }
    }

    private struct Reader {
        let source: String
        func string(_ v: Any, _ key: String) throws(ConfigError) -> String {
            if let s = v as? String { return s }
            if let i = v as? Int { return String(i) }
            throw ConfigError("\(source): \(key) must be a string")
        }
        func int(_ v: Any, _ key: String, _ range: ClosedRange<Int>) throws(ConfigError) -> Int {
            guard let i = v as? Int, range.contains(i) else {
                throw ConfigError("\(source): \(key) must be an integer from \(range.lowerBound) to \(range.upperBound)")
            }
            return i
        }
        func uint(_ v: Any, _ key: String) throws(ConfigError) -> UInt64 {
            if let i = v as? Int, i >= 0 { return UInt64(i) }
            if let s = v as? String, let i = UInt64(s) { return i }
            throw ConfigError("\(source): \(key) must be a non-negative integer")
        }
        func bool(_ v: Any, _ key: String) throws(ConfigError) -> Bool {
            guard let b = v as? Bool else { throw ConfigError("\(source): \(key) must be true or false") }
            return b
        }
        func hostPort(_ v: Any, _ key: String) throws(ConfigError) -> HostPort {
            do {
                return try HostPort(parsing: try string(v, key))
            } catch {
                throw ConfigError("\(source): \(key): \(error.message)")
            }
        }
        func map(_ v: Any, _ key: String) throws(ConfigError) -> [String: Any] {
            guard let m = v as? [String: Any] else { throw ConfigError("\(source): \(key) must be a mapping") }
            return m
        }
        /// One entry of `auth.oidc_providers`: `id`, `issuer`, `audience` (one client id or a
        /// list), `keys_file`, optional `clock_skew_seconds`.
        func oidcProvider(_ v: Any, _ key: String) throws(ConfigError) -> OIDCProviderSettings {
            var id: String?, issuer: String?, audiences: [String] = [], keysFile: String?, skew: Int?, prefix: String?
            for (k, value) in try map(v, key) {
                switch k {
                case "id": id = try string(value, "\(key).id")
                case "issuer": issuer = try string(value, "\(key).issuer")
                case "audience", "audiences":
                    if let list = value as? [Any] {
                        audiences = try list.map { (item) throws(ConfigError) in try string(item, "\(key).\(k)") }
                    } else {
                        audiences = [try string(value, "\(key).\(k)")]
                    }
                case "keys_file": keysFile = try string(value, "\(key).keys_file")
                case "clock_skew_seconds": skew = try int(value, "\(key).clock_skew_seconds", 0...3_600)
                case "uid_prefix": prefix = try string(value, "\(key).uid_prefix")
                default: throw ConfigError("\(source): unknown key \(key).\(k)")
                }
            }
            guard let id else { throw ConfigError("\(source): \(key) needs an id (the provider's name in uids, such as google.com)") }
            let named = "\(key) (\(id))"
            guard let issuer, !issuer.isEmpty else { throw ConfigError("\(source): \(named) needs an issuer (the iss its ID tokens carry)") }
            guard !audiences.isEmpty, audiences.allSatisfy({ !$0.isEmpty }) else {
                throw ConfigError("\(source): \(named) needs an audience: the client id (or a list of them) its ID tokens are issued to")
            }
            guard let keysFile, !keysFile.isEmpty else { throw ConfigError("\(source): \(named) needs a keys_file (a JWKS or a PEM public key)") }
            return OIDCProviderSettings(id: id, issuer: issuer, audiences: audiences, keysFile: keysFile, clockSkewSeconds: skew, uidPrefix: prefix)
        }
    }
}
