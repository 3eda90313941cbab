import Crypto
import Foundation
public import Logging
import Metrics
import NIOSSL
import SwiftASN1
import Synchronization
import X509

/// Where a node's TLS material comes from: the files named by `tls.ca`, `tls.cert`, `tls.key`
/// (or the development certificates) and `http.tls_cert`/`http.tls_key`, plus what the node
/// certificate must say about this node. The paths are fixed at start-up; a reload reads the same
/// paths again (docs/certificates.md).
struct TLSSources: Sendable, Equatable {
    /// The trust bundle: one or more CA certificates (PEM, concatenated).
    var ca: CAFiles
    /// The node certificate (optionally followed by intermediates) and its key.
    var node: NodeCertificateFiles
    /// The client port's HTTPS chain and key, when set.
    var https: NodeCertificateFiles?
    /// The node certificate must name `node<id>` (`tls.bind_node_ids`); nil: no name check.
    var nodeName: UInt64?
    /// The host peers dial this node by (its advertised peer address): the node certificate
    /// must name it, or every dialling peer refuses the handshake. nil: no host check.
    var advertisedHost: String?
}

/// One certificate the node holds, as status and metrics report it.
public struct TLSCertificateInfo: Sendable, Codable, Equatable {
    public enum Kind: String, Sendable, Codable {
        /// The node certificate (peer mutual TLS, both directions).
        case node
        /// A CA certificate of the trust bundle (`tls.ca`).
        case ca
        /// The client port's HTTPS certificate (`http.tls_cert`).
        case client
    }
    public var kind: Kind
    public var subject: String
    public var issuer: String
    /// The node certificate: the SHA-256 of the bundle's CA that it chains to (`banyan cluster
    /// tls` checks it against every node's bundle). nil for the others.
    public var issuedBy: String?
    /// Hexadecimal, colon-separated (as `openssl x509 -serial` prints it, lower case).
    public var serial: String
    /// SHA-256 of the DER encoding, hexadecimal.
    public var sha256: String
    /// ISO 8601, UTC.
    public var notBefore: String
    public var notAfter: String
    public var notAfterUnix: Int64
    /// Seconds from the answer's time to `notAfter` (negative once expired).
    public var secondsLeft: Int64
    public var file: String
}

/// A reload that was refused, as the status reports the last one.
public struct TLSReloadFailure: Sendable, Codable, Equatable {
    public var code: String
    public var file: String
    public var reason: String
    /// ISO 8601, UTC.
    public var at: String
    public var trigger: String
}

/// The TLS part of `GET /.banyan/status` and the answer of `GET /.banyan/tls` and
/// `POST /.banyan/tls/reload`.
public struct TLSStatus: Sendable, Codable, Equatable {
    public var certificates: [TLSCertificateInfo]
    public var expiryWarningDays: Int
    /// One line per certificate with fewer than `expiryWarningDays` left (or expired).
    public var expiring: [String]
    /// When the material in force was loaded (ISO 8601, UTC), and by what (`start`, `SIGHUP`,
    /// `admin`).
    public var loadedAt: String
    public var loadedBy: String
    /// Reloads accepted and refused since the process started.
    public var reloads: Int
    public var failedReloads: Int
    public var lastFailure: TLSReloadFailure?
}

/// Material checked and ready for use: the NIOSSL contexts of the peer transport and the client
/// port, and what they hold. Every check that can be made on this node alone is made before any
/// of it is used:
///
/// - every file reads and parses; each key belongs to its certificate;
/// - every certificate of the bundle is a CA certificate;
/// - the node certificate and its issuing CA are valid now, and the node certificate chains
///   (directly or through the intermediates in its file) to a CA of the bundle, so this node's own
///   certificate is one its bundle accepts (during a CA rotation, the old CA cannot leave a
///   node's bundle while that node's certificate still comes from it);
/// - the node certificate names `node<id>` when hellos are bound to names, and the host peers
///   dial this node by;
/// - the client port's certificate (when set) is valid now.
///
/// What cannot be checked here is whether the other nodes' certificates chain to this bundle:
/// `banyan cluster tls` compares every node's certificate with every node's bundle.
struct TLSMaterial: Sendable {
    let peerServer: NIOSSLContext
    let peerClient: NIOSSLContext
    let https: NIOSSLContext?
    /// Node certificate first, then the bundle's CAs, then the client port's certificate; each
    /// with `secondsLeft` as of loading.
    let certificates: [TLSCertificateInfo]

    static func load(_ sources: TLSSources, now: Date) throws -> TLSMaterial {
        let caPath = sources.ca.certificatePath
        let roots = try DevCertificates.loadCertificates(caPath)
        for (i, root) in roots.enumerated() {
            guard case .isCertificateAuthority? = try? root.extensions.basicConstraints else {
                throw CertificateError(
                    path: caPath, code: .notCA,
                    reason: "certificate \(i + 1) of \(roots.count) (\(root.subject)) is not a CA certificate (no basicConstraints CA:TRUE); "
                        + "the bundle holds only CA certificates")
            }
        }
        let node = try keyPair(sources.node)
        let leafPath = sources.node.certificatePath
        try checkValid(node.chain[0], path: leafPath, now: now)
        guard let issuer = issuingRoot(of: node.chain, in: roots) else {
            let held = roots.map { "\($0.subject)" }.joined(separator: "; ")
            throw CertificateError(
                path: leafPath, code: .untrusted,
                reason: "issued by \(node.chain[0].issuer), which no CA of the bundle \(caPath) signed it as (the bundle holds: \(held)); "
                    + "add its CA to the bundle first")
        }
        try checkValid(issuer, path: caPath, now: now)
        let identity = PeerIdentity(node.chain[0])
        if let id = sources.nodeName, !identity.names(node: id) {
            throw CertificateError(
                path: leafPath, code: .invalid,
                reason: "names \(identity), not node\(id): peers would refuse this node's hellos (tls.bind_node_ids); issue it with --name node\(id)")
        }
        if let host = sources.advertisedHost, !Self.names(identity, host: host) {
            throw CertificateError(
                path: leafPath, code: .invalid,
                reason: "names \(identity), not the advertised peer host \(host): dialling peers would refuse the handshake; issue it with --host \(host)")
        }
        let peer: (server: TLSConfiguration, client: TLSConfiguration)
        do {
            let nioChain = try node.chain.map { NIOSSLCertificateSource.certificate(try NIOSSLCertificate(bytes: try PeerTLS.der($0), format: .der)) }
            let nioRoots = try roots.map { try NIOSSLCertificate(bytes: try PeerTLS.der($0), format: .der) }
            let key = NIOSSLPrivateKeySource.privateKey(try NIOSSLPrivateKey(bytes: Array(node.keyText.utf8), format: .pem))
            peer = (PeerTLS.serverConfiguration(chain: nioChain, key: key, roots: nioRoots), PeerTLS.clientConfiguration(chain: nioChain, key: key, roots: nioRoots))
        } catch {
            throw CertificateError(path: leafPath, code: .malformed, reason: "NIOSSL cannot use this certificate or key: \(error)")
        }
        var leafInfo = info(node.chain[0], .node, leafPath, now)
        leafInfo.issuedBy = info(issuer, .ca, caPath, now).sha256
        var infos = [leafInfo] + roots.map { info($0, .ca, caPath, now) }
        var httpsContext: NIOSSLContext?
        if let files = sources.https {
            let pair = try keyPair(files)
            try checkValid(pair.chain[0], path: files.certificatePath, now: now)
            do {
                let chain = try pair.chain.map { NIOSSLCertificateSource.certificate(try NIOSSLCertificate(bytes: try PeerTLS.der($0), format: .der)) }
                var c = TLSConfiguration.makeServerConfiguration(
                    certificateChain: chain, privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(pair.keyText.utf8), format: .pem)))
                c.minimumTLSVersion = .tlsv12
                c.applicationProtocols = ["http/1.1"]
                httpsContext = try NIOSSLContext(configuration: c)
            } catch {
                throw CertificateError(path: files.certificatePath, code: .malformed, reason: "NIOSSL cannot use this certificate or key: \(error)")
            }
            infos.append(info(pair.chain[0], .client, files.certificatePath, now))
        }
        do {
            return TLSMaterial(
                peerServer: try NIOSSLContext(configuration: peer.server), peerClient: try NIOSSLContext(configuration: peer.client), https: httpsContext,
                certificates: infos)
        } catch {
            throw CertificateError(path: leafPath, code: .malformed, reason: "NIOSSL cannot use this certificate or key: \(error)")
        }
    }

    /// A certificate chain file and its key, each read once (a reload racing with an operator
    /// who is replacing the files sees either pair or a mismatch, which is refused).
    static func keyPair(_ files: NodeCertificateFiles) throws -> (chain: [Certificate], keyText: String) {
        let chain = try DevCertificates.loadCertificates(files.certificatePath)
        let keyText = try DevCertificates.read(files.privateKeyPath)
        let key: Certificate.PrivateKey
        do {
            key = try Certificate.PrivateKey(pemEncoded: keyText)
        } catch {
            throw CertificateError(path: files.privateKeyPath, code: .malformed, reason: "not a PEM private key: \(error)")
        }
        guard key.publicKey == chain[0].publicKey else {
            throw CertificateError(path: files.privateKeyPath, code: .mismatch, reason: "this key does not belong to \(files.certificatePath)")
        }
        return (chain, keyText)
    }

    static func checkValid(_ certificate: Certificate, path: String, now: Date) throws {
        guard now >= certificate.notValidBefore else {
            throw CertificateError(
                path: path, code: .notYetValid,
                reason: "\(certificate.subject) is not valid before \(iso(certificate.notValidBefore)) (is this machine's clock right?)")
        }
        guard now < certificate.notValidAfter else {
            throw CertificateError(path: path, code: .expired, reason: "\(certificate.subject) expired at \(iso(certificate.notValidAfter))")
        }
    }

    /// The CA of `roots` that `chain` leads to: the leaf signed by a root, or by the next
    /// certificate of the chain, which is in turn signed by a root or the next, and so on. nil
    /// if the chain ends before a root signs it.
    static func issuingRoot(of chain: [Certificate], in roots: [Certificate]) -> Certificate? {
        for (i, current) in chain.enumerated() {
            if let root = roots.first(where: { $0.subject == current.issuer && $0.publicKey.isValidSignature(current.signature, for: current) }) {
                return root
            }
            guard i + 1 < chain.count, chain[i + 1].subject == current.issuer,
                chain[i + 1].publicKey.isValidSignature(current.signature, for: current)
            else { return nil }
        }
        return nil
    }

    /// Whether the certificate names `host` as a dialling peer checks it: an IP literal against
    /// its IP addresses, a DNS name against its DNS names (a `*.` wildcard covers one label).
    static func names(_ identity: PeerIdentity, host raw: String) -> Bool {
        let host = raw.hasPrefix("[") && raw.hasSuffix("]") ? String(raw.dropFirst().dropLast()) : raw
        if let ip = DevCertificates.ipBytes(host) { return identity.ipAddresses.contains(PeerIdentity.format(ip)) }
        let name = host.lowercased()
        return identity.dnsNames.contains { pattern in
            let p = pattern.lowercased()
            if p == name { return true }
            guard p.hasPrefix("*."), let dot = name.firstIndex(of: ".") else { return false }
            return name[dot...] == p.dropFirst()
        }
    }

    static func info(_ c: Certificate, _ kind: TLSCertificateInfo.Kind, _ file: String, _ now: Date) -> TLSCertificateInfo {
        let der = (try? PeerTLS.der(c)) ?? []
        let notAfter = Int64(c.notValidAfter.timeIntervalSince1970.rounded(.down))
        return TLSCertificateInfo(
            kind: kind, subject: "\(c.subject)", issuer: "\(c.issuer)", issuedBy: nil, serial: serial(c),
            sha256: SHA256.hash(data: der).map { String(format: "%02x", $0) }.joined(), notBefore: iso(c.notValidBefore), notAfter: iso(c.notValidAfter),
            notAfterUnix: notAfter, secondsLeft: notAfter - Int64(now.timeIntervalSince1970.rounded(.down)), file: file)
    }

    /// The serial number as `openssl x509 -serial` prints it: two hexadecimal digits a byte
    /// (lower case, colon-separated).
    static func serial(_ c: Certificate) -> String {
        c.serialNumber.bytes.map { String(format: "%02x", $0) }.joined(separator: ":")
    }

    static func iso(_ date: Date) -> String {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime]
        return f.string(from: date)
    }
}

/// When to warn about a certificate close to expiry: the first time it has fewer than the
/// threshold's days left, then again each time its whole days left go down (about once a day),
/// so a long-running node keeps saying it without flooding the log. Pure: time is an input.
struct ExpiryWarnings: Sendable, Equatable {
    /// Whole days left at the last warning, by certificate fingerprint.
    private(set) var warnedAt: [String: Int64] = [:]

    /// The certificates to warn about now; `certificates` carry `secondsLeft` as of now.
    mutating func due(_ certificates: [TLSCertificateInfo], thresholdDays: Int) -> [TLSCertificateInfo] {
        var due: [TLSCertificateInfo] = []
        var kept: [String: Int64] = [:]
        for c in certificates {
            guard c.secondsLeft < Int64(thresholdDays) * 86_400 else { continue }
            // Floor division, so an expired certificate (negative seconds) counts down too.
            let days = c.secondsLeft >= 0 ? c.secondsLeft / 86_400 : -((-c.secondsLeft + 86_399) / 86_400)
            if let last = warnedAt[c.sha256], last <= days {
                kept[c.sha256] = last
            } else {
                due.append(c)
                kept[c.sha256] = days
            }
        }
        // Certificates no longer held are forgotten (a reloaded one is warned about afresh).
        warnedAt = kept
        return due
    }

    static func line(_ c: TLSCertificateInfo) -> String {
        let days = Double(c.secondsLeft) / 86_400
        let when = c.secondsLeft < 0 ? "expired at \(c.notAfter)" : String(format: "expires in %.1f days, at %@", days, c.notAfter)
        return "\(c.kind.rawValue) certificate \(c.subject) (serial \(c.serial), \(c.file)) \(when)"
    }
}

/// The node's TLS material in force, and its reloads (docs/certificates.md). Consumers (the peer
/// transport, the client port) register how to start using new material; `reload` loads and
/// checks everything first and hands it to them only when all of it passed, so a refused reload
/// leaves the old material in force everywhere. New connections use the new material; existing
/// ones keep the keys and identities they were set up with until they close. Expiry is exported
/// as `banyan_tls_certificate_expiry_seconds{kind,subject,serial}` and warned about below
/// `tls.expiry_warning_days`.
public final class NodeTLS: Sendable {
    let sources: TLSSources
    public let expiryWarningDays: Int
    private let logger: Logger
    private let state: Mutex<State>
    /// Serialises reloads (SIGHUP and admin requests may arrive together).
    private let reloading = Mutex<Void>(())
    private let reloadsAccepted = Counter(label: "banyan_tls_reloads_total", dimensions: [("result", "ok")])
    private let reloadsRefused = Counter(label: "banyan_tls_reloads_total", dimensions: [("result", "refused")])

    private struct State {
        var material: TLSMaterial
        var loadedAt: Date
        var loadedBy: String
        var reloads = 0
        var failedReloads = 0
        var lastFailure: TLSReloadFailure?
        var consumers: [@Sendable (TLSMaterial) -> Void] = []
        /// Expiry gauges by certificate fingerprint.
        var gauges: [String: Gauge] = [:]
        var warnings = ExpiryWarnings()
    }

    init(sources: TLSSources, expiryWarningDays: Int, logger: Logger, now: Date = Date()) throws {
        self.sources = sources
        self.expiryWarningDays = expiryWarningDays
        self.logger = logger
        state = Mutex(State(material: try TLSMaterial.load(sources, now: now), loadedAt: now, loadedBy: "start"))
        checkExpiry(now: now)
    }

    var material: TLSMaterial { state.withLock { $0.material } }

    /// Registers a consumer of new material (called on every accepted reload, in order).
    func onReload(_ use: @escaping @Sendable (TLSMaterial) -> Void) {
        state.withLock { $0.consumers.append(use) }
    }

    /// Loads and checks the files again; on success every consumer switches to the new material
    /// and the new status is returned. On failure nothing changes, the refusal is logged and
    /// counted, and the error names the file and what is wrong with it.
    public func reload(trigger: String) -> Result<TLSStatus, CertificateError> { reload(trigger: trigger, now: Date()) }

    func reload(trigger: String, now: Date) -> Result<TLSStatus, CertificateError> {
        reloading.withLock { _ in
            let material: TLSMaterial
            do {
                material = try TLSMaterial.load(sources, now: now)
            } catch {
                let e = error as? CertificateError ?? CertificateError(path: sources.node.certificatePath, code: .invalid, reason: "\(error)")
                reloadsRefused.increment()
                state.withLock {
                    $0.failedReloads += 1
                    $0.lastFailure = TLSReloadFailure(code: e.code.name, file: e.path, reason: e.reason, at: TLSMaterial.iso(now), trigger: trigger)
                }
                logger.error(
                    "TLS reload refused; the material in force stays", metadata: ["trigger": "\(trigger)", "code": "\(e.code.name)", "file": "\(e.path)", "reason": "\(e.reason)"])
                return .failure(e)
            }
            let consumers = state.withLock { $0.consumers }
            for use in consumers { use(material) }
            state.withLock {
                $0.material = material
                $0.loadedAt = now
                $0.loadedBy = trigger
                $0.reloads += 1
            }
            reloadsAccepted.increment()
            let node = material.certificates[0]
            logger.notice(
                "TLS material reloaded; new connections use it",
                metadata: [
                    "trigger": "\(trigger)", "node_certificate": "\(node.subject)", "issuer": "\(node.issuer)", "serial": "\(node.serial)",
                    "not_after": "\(node.notAfter)", "trusted_cas": "\(material.certificates.filter { $0.kind == .ca }.count)",
                ])
            checkExpiry(now: now)
            return .success(status(now: now))
        }
    }

    /// What is in force, with seconds left as of `now`.
    public func status() -> TLSStatus { status(now: Date()) }

    func status(now: Date) -> TLSStatus {
        let certificates = current(now: now)
        return state.withLock { s in
            TLSStatus(
                certificates: certificates, expiryWarningDays: expiryWarningDays,
                expiring: certificates.filter { $0.secondsLeft < Int64(expiryWarningDays) * 86_400 }.map(ExpiryWarnings.line),
                loadedAt: TLSMaterial.iso(s.loadedAt), loadedBy: s.loadedBy, reloads: s.reloads, failedReloads: s.failedReloads,
                lastFailure: s.lastFailure)
        }
    }

    /// Updates the expiry gauges (dropping those of certificates no longer held) and logs a
    /// warning for each certificate due one. The node calls it at start, after each reload and
    /// once a minute.
    func checkExpiry(now: Date) {
        let certificates = current(now: now)
        let due: [TLSCertificateInfo] = state.withLock { s in
            var seen: Set<String> = []
            for c in certificates {
                seen.insert(c.sha256)
                let gauge =
                    s.gauges[c.sha256]
                    ?? Gauge(
                        label: "banyan_tls_certificate_expiry_seconds",
                        dimensions: [("kind", c.kind.rawValue), ("subject", c.subject), ("serial", c.serial)])
                s.gauges[c.sha256] = gauge
                gauge.record(Double(c.secondsLeft))
            }
            for (sha, gauge) in s.gauges where !seen.contains(sha) {
                gauge.destroy()
                s.gauges[sha] = nil
            }
            return s.warnings.due(certificates, thresholdDays: expiryWarningDays)
        }
        for c in due {
            logger.warning(
                "certificate close to expiry: \(ExpiryWarnings.line(c))",
                metadata: ["kind": "\(c.kind.rawValue)", "file": "\(c.file)", "not_after": "\(c.notAfter)", "threshold_days": "\(expiryWarningDays)"])
        }
    }

    private func current(now: Date) -> [TLSCertificateInfo] {
        let nowSeconds = Int64(now.timeIntervalSince1970.rounded(.down))
        return state.withLock { $0.material.certificates }.map { c in
            var c = c
            c.secondsLeft = c.notAfterUnix - nowSeconds
            return c
        }
    }
}
