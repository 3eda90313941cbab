// swift-tools-version:6.2
//
// A terminal chat with presence over Banyan's Swift SDK (docs/client-guide.md). Depends on the
// repository's own package by path, as an app would depend on a released version:
//
//   swift run --package-path Examples/Chat chat --url 'http://127.0.0.1:9000?ns=chat' --name ada
import PackageDescription

let package = Package(
    name: "Chat",
    dependencies: [
        // `name:` lets the product below name the package whatever the checkout's directory is called.
        .package(name: "Banyan", path: "../..")
    ],
    targets: [
        .executableTarget(
            name: "chat",
            dependencies: [.product(name: "BanyanClient", package: "Banyan")]
        )
    ],
    swiftLanguageModes: [.v6]
)
