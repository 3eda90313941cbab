import ArgumentParser
import BanyanServer
import Foundation

/// `--endpoint` values, each one address or several comma-separated, in order.
func endpointList(_ values: [String]) -> [String] {
    values.flatMap { $0.split(separator: ",").map(String.init) }
}

/// Reads an operator answer holding a `TLSStatus` (`GET /.banyan/tls`, `POST /.banyan/tls/reload`).
func decodeTLSStatus(_ text: String, from endpoint: String) throws -> TLSStatus {
    let decoder = JSONDecoder()
    decoder.keyDecodingStrategy = .convertFromSnakeCase
    do {
        return try decoder.decode(TLSStatus.self, from: Data(text.utf8))
    } catch {
        throw CommandError("\(endpoint): unexpected TLS answer (\(error)): \(text.prefix(300))")
    }
}

/// The certificates of one node as lines for the terminal.
func describeTLS(_ status: TLSStatus, prefix: String) -> [String] {
    status.certificates.map { c in
        let days = String(format: "%.1f", Double(c.secondsLeft) / 86_400)
        return "\(prefix)\(c.kind.rawValue): \(c.subject)  serial \(c.serial)  not after \(c.notAfter) (\(days) days)  sha256 \(c.sha256.prefix(16))…"
    } + status.expiring.map { "\(prefix)WARNING: \($0)" }
}

/// `banyan cluster reload-tls --endpoint H:P …`: each node in turn reloads its certificates, keys
/// and trust bundle from its files (`POST /.banyan/tls/reload`, what SIGHUP does); stops at the
/// first refusal, which names the file and what is wrong, the node keeping its old material.
struct ClusterReloadTLS: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reload-tls",
        abstract: "Make nodes reload their certificates, keys and trust bundle (no restart); stops at the first refusal.",
        discussion: "Sends the operator token like `cluster add`. See docs/certificates.md for the rotation procedure.")
    @Option(name: .long, help: "A node's client address, host:port (repeat, or comma-separated; reloaded in this order).")
    var endpoint: [String] = []

    func run() throws {
        let endpoints = endpointList(endpoint)
        guard !endpoints.isEmpty else { throw ValidationError("give at least one --endpoint") }
        for (i, e) in endpoints.enumerated() {
            let (status, text) = try AdminClient(endpoint: e).call("POST", "/.banyan/tls/reload")
            guard status == 200 else {
                let left = endpoints.dropFirst(i + 1)
                throw CommandError(
                    "\(e): reload refused (\(status)); it keeps its previous material\(left.isEmpty ? "" : "; not tried: \(left.joined(separator: ", "))")\n\(text)")
            }
            print("\(e): reloaded")
            for line in describeTLS(try decodeTLSStatus(text, from: e), prefix: "  ") { print(line) }
        }
    }
}

/// `banyan cluster tls --endpoint …`: every node's certificates, and whether every node's
/// certificate chains to a CA in every other node's bundle, the check to make before removing
/// an old CA from the bundles (docs/certificates.md). Exit status 1 when some pair of nodes
/// would refuse each other.
struct ClusterTLS: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tls",
        abstract: "Show every node's certificates and check that each node's certificate is trusted by every node's bundle.")
    @Option(name: .long, help: "Every member's client address, host:port (repeat, or comma-separated).")
    var endpoint: [String] = []

    func run() throws {
        let endpoints = endpointList(endpoint)
        guard !endpoints.isEmpty else { throw ValidationError("give at least one --endpoint") }
        var nodes: [(endpoint: String, status: TLSStatus)] = []
        for e in endpoints {
            let (code, text) = try AdminClient(endpoint: e).call("GET", "/.banyan/tls")
            guard code == 200 else { throw CommandError("\(e): \(code) \(text)") }
            let status = try decodeTLSStatus(text, from: e)
            nodes.append((e, status))
            print("\(e) (loaded \(status.loadedAt) by \(status.loadedBy); \(status.reloads) reloads, \(status.failedReloads) refused)")
            for line in describeTLS(status, prefix: "  ") { print(line) }
            if let failure = status.lastFailure { print("  last refused reload: \(failure.at) \(failure.code) \(failure.file): \(failure.reason)") }
        }
        var problems: [String] = []
        var used: Set<String> = []
        for (e, status) in nodes {
            guard let own = status.certificates.first(where: { $0.kind == .node }), let issuer = own.issuedBy else { continue }
            used.insert(issuer)
            for (other, theirs) in nodes where !theirs.certificates.contains(where: { $0.kind == .ca && $0.sha256 == issuer }) {
                problems.append("\(other) does not trust \(e)'s node certificate (issued by \(own.issuer), sha256 \(issuer.prefix(16))…)")
            }
        }
        var unused: [String: String] = [:]
        for (_, status) in nodes {
            for c in status.certificates where c.kind == .ca && !used.contains(c.sha256) { unused[c.sha256] = c.subject }
        }
        for (sha, subject) in unused.sorted(by: { $0.key < $1.key }) {
            print("CA \(subject) (sha256 \(sha.prefix(16))…) issued no node's certificate: it can leave the bundles")
        }
        guard problems.isEmpty else { throw CommandError("nodes that would refuse each other:\n" + problems.joined(separator: "\n")) }
        print("every node's certificate is trusted by every node's bundle")
    }
}
