// swift-tools-version:6.2
//
// Banyan: a clustered, self-hosted realtime tree database.
//
// Layering (see docs/architecture.md and Tests/BanyanTidyTests): a target may import only the
// targets listed in its `dependencies`. Pure cores (L0-L2) never import Foundation, NIO or any
// I/O module; BanyanTidyTests rejects forbidden imports mechanically.
import PackageDescription

let strictSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

/// The pure cores' hot paths touch class-stored properties on every tree step; release builds skip
/// the dynamic exclusivity check there (static checking still applies; debug builds keep both).
let coreSettings: [SwiftSetting] = strictSettings + [
    .unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release))
]

/// Cores whose tests run long searches or simulations are optimised in debug builds too (every
/// target the whole-node simulator runs: `swift test` runs 1,000 of its seeds).
let optimisedCoreSettings: [SwiftSetting] = coreSettings + [.unsafeFlags(["-O"], .when(configuration: .debug))]
/// The same for the storage and node-core targets the simulator drives.
let optimisedDriverSettings: [SwiftSetting] = coreSettings + [.unsafeFlags(["-O"], .when(configuration: .debug))]
/// The server's drivers: every request crosses their handlers' class-stored state, so release
/// builds skip the dynamic exclusivity check there too (it cost about 3% of a write's
/// instructions; debug builds, which the tests run, keep it).
let driverSettings: [SwiftSetting] = coreSettings

let package = Package(
    name: "Banyan",
    // Apple platforms: the SDK uses Foundation's `NSLock.withLock` (macOS 14, iOS 17) and
    // Swift concurrency. Not built on an Apple platform yet (docs/client-guide.md, "Differences").
    platforms: [.macOS(.v14), .iOS(.v17), .tvOS(.v17), .watchOS(.v10)],
    products: [
        .executable(name: "banyan", targets: ["BanyanCommand"]),
        .executable(name: "banyan-bench", targets: ["BanyanBench"]),
        .executable(name: "banyan-sim", targets: ["BanyanSim"]),
        .executable(name: "banyan-cluster-test", targets: ["BanyanClusterTest"]),
        // The example chat over the Swift SDK (Examples/Chat; docs/client-guide.md).
        .executable(name: "banyan-chat", targets: ["BanyanChat"]),
        .executable(name: "banyan-sdk-probe", targets: ["BanyanSDKProbe"]),
        // The Swift client SDK (docs/swift-sdk.md). Other internal modules are not products
        // (house style B10). This toolchain accepts the package's `unsafeFlags` when it is a
        // dependency (checked with path, revision and version dependencies; docs/swift-sdk.md).
        .library(name: "BanyanClient", targets: ["BanyanClient"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        // Server drivers only (never imported by a pure core; BanyanTidyTests checks).
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-crypto", from: "3.12.3"),
        .package(url: "https://github.com/apple/swift-asn1", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
    ],
    targets: [
        // MARK: - Layer 0 (pure cores)

        // Small shared helpers: the seeded random source, the byte codec of every binary format.
        .target(name: "BanyanBasics", swiftSettings: strictSettings),
        // The Firebase data model: keys, paths, nodes, ordering, JSON, hash, push ids, writes.
        .target(name: "BanyanTree", dependencies: ["BanyanBasics"], swiftSettings: optimisedCoreSettings),

        // CRC-32C with the processor's instruction (SSE 4.2 / AArch64 CRC), for BanyanOpLog's
        // checksums; pure computation, no I/O.
        .target(name: "CCRC32C"),
        // glibc's heap statistics and trim (`mallinfo2`, `malloc_trim`), for the server's memory
        // trimming (docs/operations.md, "Memory"); nothing on other C libraries.
        .target(name: "CHeap"),

        // Operation log format: records, CRC32C, segment scanning and recovery rules, hard state.
        .target(name: "BanyanOpLog", dependencies: ["BanyanBasics", "CCRC32C"], swiftSettings: optimisedCoreSettings),

        // Linearizability checking of client histories (test support for the simulator and the
        // multi-process tests; pure).
        // Optimised even in debug builds: the checker's search runs in every `swift test`.
        .target(name: "BanyanCheckers", swiftSettings: optimisedCoreSettings),

        // MARK: - Layer 1 (pure cores)

        // The Raft consensus core: elections, replication, snapshots, membership, reads (docs/raft.md).
        // Optimised even in debug builds, like the checker: `swift test` runs 1,000 simulated seeds.
        .target(name: "BanyanRaft", dependencies: ["BanyanBasics"], swiftSettings: optimisedCoreSettings),

        // Query parameters, indexed evaluation, views and event generation.
        .target(name: "BanyanQuery", dependencies: ["BanyanTree", "BanyanBasics"], swiftSettings: coreSettings),

        // The replicated state machine: client write commands in the log, applied to the tree
        // exactly once, with server values from the leader's timestamp (docs/internals/state-machine.md).
        .target(name: "BanyanStateMachine", dependencies: ["BanyanTree", "BanyanRules", "BanyanBasics"], swiftSettings: optimisedCoreSettings),

        // The Firebase security-rules language: parser, static checks, regular expressions and the
        // read/write evaluator, plus the offline case runner (docs/rules.md).
        .target(name: "BanyanRules", dependencies: ["BanyanTree", "BanyanBasics"], swiftSettings: coreSettings),

        // MARK: - Layer 2 (pure cores)

        // The replica loop's core: Raft + state machine + waiting client requests, leader
        // timestamps, forwarding, retries, ReadIndex reads, snapshot scheduling (docs/replica.md).
        .target(
            name: "BanyanReplica", dependencies: ["BanyanRaft", "BanyanStateMachine", "BanyanTree", "BanyanBasics"], swiftSettings: optimisedCoreSettings
        ),

        // The Firebase REST API and its event streams: request parsing, response rendering, SSE
        // events (docs/rest.md). Pure: the server's HTTP layer feeds it.
        .target(name: "BanyanREST", dependencies: ["BanyanTree", "BanyanQuery", "BanyanListen", "BanyanStateMachine", "BanyanRules", "BanyanBasics"], swiftSettings: coreSettings),

        // The Firebase WebSocket protocol v5's pure parts: message framing (docs/realtime.md).
        .target(name: "BanyanSession", dependencies: ["BanyanTree", "BanyanStateMachine"], swiftSettings: coreSettings),

        // Listens and the updates each applied write owes them, for v5 sessions and REST event
        // streams alike (docs/realtime.md, "ListenCore").
        .target(name: "BanyanListen", dependencies: ["BanyanTree", "BanyanQuery"], swiftSettings: coreSettings),

        // The Swift SDK's core: the client side of the WebSocket protocol v5, the connection,
        // pending writes and listens as one state machine (docs/swift-sdk.md).
        .target(name: "BanyanClientCore", dependencies: ["BanyanTree", "BanyanQuery", "BanyanBasics"], swiftSettings: strictSettings),

        // MARK: - Test support (pure)

        // The deterministic cluster simulator: simulated nodes, network and disks under one seed,
        // a synchronous scenario harness, workload, and the safety and linearizability checkers.
        .target(
            name: "BanyanSimulation",
            dependencies: [
                "BanyanRaft", "BanyanTree", "BanyanCheckers", "BanyanBasics", "BanyanNode", "BanyanReplica", "BanyanStateMachine",
                "BanyanOpLog", "BanyanOpLogFiles", "BanyanSession", .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: optimisedCoreSettings
        ),

        // MARK: - Layer 3 (drivers)

        // The system zlib (Debian: zlib1g-dev), for snapshot compression and WebSocket
        // permessage-deflate.
        .systemLibrary(name: "CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        // File-backed segmented log, hard state and snapshots behind a FileSystem seam.
        .target(
            name: "BanyanOpLogFiles",
            dependencies: ["BanyanOpLog", "CZlib", .product(name: "Logging", package: "swift-log")],
            swiftSettings: optimisedDriverSettings
        ),

        // The Swift SDK (docs/swift-sdk.md): Database, DatabaseReference, DataSnapshot over a NIO
        // WebSocket client driving BanyanClientCore.
        .target(
            name: "BanyanClient",
            dependencies: [
                "BanyanClientCore", "BanyanTree", "BanyanQuery", "BanyanBasics", .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"), .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"), .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: strictSettings
        ),

        // Credentials: RS256 ID tokens against configured public keys, Firebase 2.x custom tokens
        // and database secrets (docs/security.md). Token parsing and claim checks are pure; only
        // the signature checks call swift-crypto. No Foundation, no NIO, no clock.
        .target(
            name: "BanyanAuth",
            dependencies: [
                "BanyanTree", "BanyanBasics", .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),

        // The node core: a node's decisions as a state machine that returns actions (NodeCore), over
        // its storage behind the FileSystem seam (NodeStorage). The server drives it with real files,
        // threads and sockets; the simulator drives the same code over a simulated file system and
        // network (docs/node-core.md).
        .target(
            name: "BanyanNode",
            dependencies: [
                "BanyanOpLogFiles", "BanyanOpLog", "BanyanRaft", "BanyanReplica", "BanyanStateMachine", "BanyanTree", "BanyanBasics",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: optimisedDriverSettings
        ),

        // The node process: storage, the replica thread, mutual-TLS peer transport, the REST/SSE
        // HTTP server, certificates, configuration, metrics (docs/server.md).
        .target(
            name: "BanyanServer",
            dependencies: [
                "BanyanNode", "BanyanOpLogFiles", "BanyanOpLog", "BanyanRaft", "BanyanReplica", "BanyanStateMachine", "BanyanTree", "BanyanQuery",
                "BanyanBasics", "BanyanRules", "BanyanREST", "BanyanSession", "BanyanListen", "BanyanAuth", "CZlib", "CHeap",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Yams", package: "Yams"),
            ],
            swiftSettings: driverSettings
        ),

        // Operator and test tooling: an HTTP client, real-process local clusters, the cluster
        // benchmark and the multi-process scenario tests (docs/testing.md, docs/benchmarks.md).
        .target(
            name: "BanyanOps",
            dependencies: [
                "BanyanCheckers", "BanyanBasics",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                // Optional HTTPS for test and benchmark clients (`LocalCluster.clientTLS`).
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: strictSettings
        ),

        // MARK: - Layer 5 (executables)

        // The `banyan` command: `serve`, `cluster`, `status`, `certs`, `bench`, and the offline data tools.
        .executableTarget(
            name: "BanyanCommand",
            dependencies: [
                "BanyanTree", "BanyanAuth", "BanyanQuery", "BanyanBasics", "BanyanRules", "BanyanServer", "BanyanOps", "BanyanNode", "BanyanOpLogFiles",
                // `banyan bench --sdk` measures the Swift SDK.
                "BanyanClient",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                // Operator commands' HTTPS with a private CA (`BANYAN_CA_FILE`).
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strictSettings
        ),
        // `banyan-cluster-test`: multi-process failover, freeze, restart and membership tests
        // with real `banyan serve` processes (run by .ci/run; docs/testing.md).
        .executableTarget(
            name: "BanyanClusterTest",
            dependencies: [
                "BanyanOps", "BanyanCheckers", .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: strictSettings
        ),
        // `swift run banyan-chat`: the example app, a terminal chat with presence that uses only
        // the SDK's public API (docs/client-guide.md, "The example app"). Its sources live under
        // Examples/; `Examples/Chat/check.sh` runs it against a real node (.ci/run).
        .executableTarget(
            name: "BanyanChat",
            dependencies: ["BanyanClient"],
            path: "Examples/Chat",
            exclude: ["check.sh"],
            swiftSettings: strictSettings
        ),
        // `banyan-sdk-probe`: an app process on the Swift SDK that queues writes offline, delivers
        // them after a restart, or holds onDisconnect writes until it is killed (the SDK's
        // multi-process tests, Tests/BanyanClientTests/ClusterSDKTests.swift).
        .executableTarget(name: "BanyanSDKProbe", dependencies: ["BanyanClient"], swiftSettings: strictSettings),
        // `swift run -c release banyan-sim`: the seeded cluster simulator (docs/simulator.md).
        .executableTarget(
            name: "BanyanSim",
            dependencies: ["BanyanSimulation", "BanyanBasics", .product(name: "ArgumentParser", package: "swift-argument-parser")],
            swiftSettings: strictSettings
        ),
        // `swift run -c release banyan-bench`: prints benchmark figures (docs/benchmarks.md).
        .executableTarget(
            name: "BanyanBench",
            dependencies: [
                "BanyanTree", "BanyanQuery", "BanyanBasics", "BanyanOpLog", "BanyanOpLogFiles", "BanyanRaft", "BanyanSimulation",
                "BanyanStateMachine", "BanyanAuth", "BanyanRules", "BanyanREST",
                // `tokens` signs the RS256 ID token it verifies.
                .product(name: "Crypto", package: "swift-crypto"), .product(name: "_CryptoExtras", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),

        // MARK: - Tests

        .testTarget(name: "BanyanBasicsTests", dependencies: ["BanyanBasics"], swiftSettings: strictSettings),
        .testTarget(name: "BanyanTreeTests", dependencies: ["BanyanTree", "BanyanBasics"], swiftSettings: strictSettings),
        .testTarget(
            name: "BanyanQueryTests",
            dependencies: ["BanyanQuery", "BanyanTree", "BanyanBasics"],
            swiftSettings: strictSettings
        ),
        .testTarget(name: "BanyanRulesTests", dependencies: ["BanyanRules", "BanyanTree", "BanyanBasics"], swiftSettings: strictSettings),
        .testTarget(name: "BanyanOpLogTests", dependencies: ["BanyanOpLog", "BanyanBasics"], swiftSettings: strictSettings),
        .testTarget(
            name: "BanyanRaftTests",
            dependencies: [
                "BanyanRaft", "BanyanStateMachine", "BanyanNode", "BanyanOpLog", "BanyanOpLogFiles", "BanyanTree", "BanyanCheckers", "BanyanBasics",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "BanyanStateMachineTests", dependencies: ["BanyanStateMachine", "BanyanRules", "BanyanTree", "BanyanBasics"], swiftSettings: strictSettings
        ),
        .testTarget(
            name: "BanyanReplicaTests",
            dependencies: [
                "BanyanReplica", "BanyanRaft", "BanyanStateMachine", "BanyanNode", "BanyanOpLog", "BanyanOpLogFiles", "BanyanTree", "BanyanCheckers",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "BanyanRESTTests", dependencies: ["BanyanREST", "BanyanTree", "BanyanQuery", "BanyanListen", "BanyanStateMachine", "BanyanRules"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "BanyanServerTests",
            dependencies: [
                "BanyanServer", "BanyanNode", "BanyanSession", "BanyanRaft", "BanyanStateMachine", "BanyanTree", "BanyanOpLog", "BanyanOpLogFiles",
                "BanyanREST", "BanyanRules", "BanyanAuth", "BanyanBasics", "CZlib", "BanyanOps", .product(name: "Logging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"), .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"), .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"), .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "X509", package: "swift-certificates"), .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "BanyanAuthTests",
            dependencies: [
                "BanyanAuth", "BanyanTree", "BanyanBasics", .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(name: "BanyanCheckersTests", dependencies: ["BanyanCheckers"], swiftSettings: strictSettings),
        .testTarget(name: "BanyanListenTests", dependencies: ["BanyanListen", "BanyanQuery", "BanyanTree"], swiftSettings: strictSettings),
        .testTarget(name: "BanyanSessionTests", dependencies: ["BanyanSession", "BanyanStateMachine", "BanyanTree", "BanyanBasics"], swiftSettings: strictSettings),
        .testTarget(name: "BanyanSimulationTests", dependencies: ["BanyanSimulation", "BanyanNode", "BanyanBasics", "BanyanCheckers"], swiftSettings: strictSettings),
        .testTarget(
            name: "BanyanOpLogFilesTests",
            dependencies: ["BanyanOpLogFiles", "BanyanOpLog", "BanyanBasics", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strictSettings
        ),
        .testTarget(name: "BanyanTidyTests", swiftSettings: strictSettings),
        .testTarget(
            name: "BanyanClientTests",
            dependencies: [
                "BanyanClient", "BanyanClientCore", "BanyanServer", "BanyanTree", "BanyanOps", .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                // A test identity provider's RSA key and signed ID tokens (AuthTests).
                .product(name: "Crypto", package: "swift-crypto"), .product(name: "_CryptoExtras", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
    ],
    swiftLanguageModes: [.v6]
)
