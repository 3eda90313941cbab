// swift-tools-version:6.2
//
// Banyan's coverage-guided fuzz targets (libFuzzer), kept out of the main package so that it
// carries no sanitizer flags and stays usable as a dependency (docs/testing.md, "Fuzzing").
//
// The pure cores are the main package's own sources (symbolic links under `Sources/`), compiled
// here with the main package's language settings but without its release-only
// `-enforce-exclusivity=unchecked`: a fuzzed build keeps every runtime check. Nothing here
// depends on NIO or any other package, so a clean build needs no network.
//
// Build and run: `Fuzz/run.sh [seconds-per-target] [target…]`. The targets are built with
// `swift build -c release --sanitize fuzzer -Xswiftc -sanitize=fuzzer,address
// -Xswiftc -parse-as-library`; `FuzzSeeds` (an ordinary executable) regenerates the encoded seeds
// under `Corpus/`.
import PackageDescription

let settings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

/// The main package's pure targets (same names, same dependencies: see ../Package.swift).
let cores: [Target] = [
    .target(name: "BanyanBasics", swiftSettings: settings),
    .target(name: "BanyanTree", dependencies: ["BanyanBasics"], swiftSettings: settings),
    .target(name: "CCRC32C"),
    .target(name: "BanyanOpLog", dependencies: ["BanyanBasics", "CCRC32C"], swiftSettings: settings),
    .target(name: "BanyanRaft", dependencies: ["BanyanBasics"], swiftSettings: settings),
    .target(name: "BanyanQuery", dependencies: ["BanyanTree", "BanyanBasics"], swiftSettings: settings),
    .target(name: "BanyanRules", dependencies: ["BanyanTree", "BanyanBasics"], swiftSettings: settings),
    .target(name: "BanyanStateMachine", dependencies: ["BanyanTree", "BanyanRules", "BanyanBasics"], swiftSettings: settings),
    .target(name: "BanyanListen", dependencies: ["BanyanTree", "BanyanQuery"], swiftSettings: settings),
    .target(
        name: "BanyanREST", dependencies: ["BanyanTree", "BanyanQuery", "BanyanListen", "BanyanStateMachine", "BanyanRules", "BanyanBasics"],
        swiftSettings: settings),
    .target(name: "BanyanSession", dependencies: ["BanyanTree", "BanyanStateMachine"], swiftSettings: settings),
]

/// One executable per fuzz target: (target, what it imports).
let fuzzTargets: [(String, [Target.Dependency])] = [
    ("FuzzJSON", ["BanyanTree"]),
    ("FuzzREST", ["BanyanREST", "BanyanRules", "BanyanStateMachine", "BanyanTree"]),
    ("FuzzQuery", ["BanyanREST", "BanyanQuery", "BanyanTree"]),
    ("FuzzWebSocket", ["BanyanSession", "BanyanStateMachine", "BanyanQuery", "BanyanTree"]),
    ("FuzzPeer", ["BanyanRaft", "BanyanBasics"]),
    ("FuzzLog", ["BanyanOpLog"]),
    ("FuzzSnapshot", ["BanyanOpLog", "BanyanStateMachine", "BanyanTree"]),
    ("FuzzCommand", ["BanyanStateMachine", "BanyanTree"]),
    ("FuzzRules", ["BanyanRules", "BanyanTree"]),
]

let package = Package(
    name: "BanyanFuzz",
    products: fuzzTargets.map { .executable(name: $0.0, targets: [$0.0]) } + [.executable(name: "FuzzSeeds", targets: ["FuzzSeeds"])],
    targets: cores + [
        .target(name: "FuzzSupport", swiftSettings: settings)
    ]
        + fuzzTargets.map { name, deps in .executableTarget(name: name, dependencies: deps + ["FuzzSupport"], swiftSettings: settings) }
        + [
            .executableTarget(
                name: "FuzzSeeds",
                dependencies: ["BanyanTree", "BanyanRaft", "BanyanOpLog", "BanyanStateMachine", "BanyanBasics"],
                swiftSettings: settings)
        ],
    swiftLanguageModes: [.v6]
)
