import BanyanNode
@testable import BanyanServer
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization
import Testing
import SwiftASN1
import X509

/// Certificate reloads (docs/certificates.md): the checks a reload makes before anything is used,
/// the expiry warnings' schedule, and a node that swaps its client-port certificate and trust
/// bundle while a connection made with the old ones keeps working.
@Suite struct TLSReloadTests {
    /// Two CAs (A and B), node1's certificate from each, and A+B as a bundle.
    struct Fixture {
        let dir: String
        let caA: CAFiles
        let caB: CAFiles
        let nodeA: NodeCertificateFiles
        let nodeB: NodeCertificateFiles
        let bundle: String

        init(_ name: String) throws {
            dir = try temporaryDirectory(name)
            caA = try DevCertificates.createCA(commonName: "Test CA A", directory: dir + "/caA")
            caB = try DevCertificates.createCA(commonName: "Test CA B", directory: dir + "/caB")
            nodeA = try DevCertificates.issueNodeCertificate(ca: caA, nodeName: "node1", hosts: ["localhost", "127.0.0.1"], directory: dir + "/nodeA")
            nodeB = try DevCertificates.issueNodeCertificate(ca: caB, nodeName: "node1", hosts: ["localhost", "127.0.0.1"], directory: dir + "/nodeB")
            bundle = dir + "/bundle.pem"
            // `cat caA/ca.pem caB/ca.pem`: the files end with a newline.
            try (try String(contentsOfFile: caA.certificatePath, encoding: .utf8) + String(contentsOfFile: caB.certificatePath, encoding: .utf8))
                .write(toFile: bundle, atomically: true, encoding: .utf8)
        }

        func sources(ca: String, node: NodeCertificateFiles, name: UInt64? = 1, host: String? = "127.0.0.1") -> TLSSources {
            TLSSources(ca: CAFiles(certificatePath: ca, privateKeyPath: nil), node: node, https: nil, nodeName: name, advertisedHost: host)
        }
    }

    static func code(_ body: () throws -> Void) -> BanyanServer.CertificateError.Code? {
        do {
            try body()
            return nil
        } catch {
            return (error as? BanyanServer.CertificateError)?.code
        }
    }

    @Test("a bundle of several CAs is accepted, and a reload is refused for each thing that would break the node's TLS")
    func materialChecks() throws {
        let f = try Fixture("tls-checks")
        defer { try? FileManager.default.removeItem(atPath: f.dir) }
        // Both CAs trusted; the node certificate from the second one.
        let m = try TLSMaterial.load(f.sources(ca: f.bundle, node: f.nodeB), now: Date())
        #expect(m.certificates.map(\.kind) == [.node, .ca, .ca])
        #expect(m.certificates[0].issuedBy == m.certificates[2].sha256)
        #expect(m.certificates[1].subject.contains("Test CA A") && m.certificates[2].subject.contains("Test CA B"))
        #expect(m.certificates[0].secondsLeft > 800 * 86_400)
        // The node certificate's CA is not in the bundle.
        #expect(Self.code { _ = try TLSMaterial.load(f.sources(ca: f.caA.certificatePath, node: f.nodeB), now: Date()) } == .untrusted)
        // A's certificate with B's key.
        let crossed = NodeCertificateFiles(certificatePath: f.nodeA.certificatePath, privateKeyPath: f.nodeB.privateKeyPath)
        #expect(Self.code { _ = try TLSMaterial.load(f.sources(ca: f.bundle, node: crossed), now: Date()) } == .mismatch)
        // A node certificate in the bundle.
        let notCA = f.dir + "/not-ca.pem"
        try (try String(contentsOfFile: f.caA.certificatePath, encoding: .utf8) + String(contentsOfFile: f.nodeA.certificatePath, encoding: .utf8))
            .write(toFile: notCA, atomically: true, encoding: .utf8)
        #expect(Self.code { _ = try TLSMaterial.load(f.sources(ca: notCA, node: f.nodeA), now: Date()) } == .notCA)
        // node1's certificate on node 2; a host peers dial that it does not name.
        #expect(Self.code { _ = try TLSMaterial.load(f.sources(ca: f.bundle, node: f.nodeA, name: 2), now: Date()) } == .invalid)
        #expect(Self.code { _ = try TLSMaterial.load(f.sources(ca: f.bundle, node: f.nodeA, host: "10.9.9.9"), now: Date()) } == .invalid)
        #expect(Self.code { _ = try TLSMaterial.load(f.sources(ca: f.bundle, node: f.nodeA, name: nil, host: "localhost"), now: Date()) } == nil)
        // Time is an input: past the node certificate's 825 days, and before its start.
        #expect(Self.code { _ = try TLSMaterial.load(f.sources(ca: f.bundle, node: f.nodeA), now: Date().addingTimeInterval(900 * 86_400)) } == .expired)
        #expect(Self.code { _ = try TLSMaterial.load(f.sources(ca: f.bundle, node: f.nodeA), now: Date().addingTimeInterval(-2 * 86_400)) } == .notYetValid)
        // Below the warning threshold: the node certificate (825 days) with 1000, not the CAs (3650).
        let tls = try NodeTLS(sources: f.sources(ca: f.bundle, node: f.nodeB), expiryWarningDays: 1000, logger: Logger(label: "test"))
        #expect(tls.status().expiring.count == 1 && tls.status().expiring.first?.hasPrefix("node certificate") == true, "\(tls.status().expiring)")
        // Missing and unparsable files.
        #expect(Self.code { _ = try TLSMaterial.load(f.sources(ca: f.dir + "/absent.pem", node: f.nodeA), now: Date()) } == .missing)
        try "not a certificate".write(toFile: f.dir + "/junk.pem", atomically: true, encoding: .utf8)
        #expect(Self.code { _ = try TLSMaterial.load(f.sources(ca: f.dir + "/junk.pem", node: f.nodeA), now: Date()) } == .malformed)
    }

    @Test("host names: IP literals against IP addresses, DNS names against DNS names, one label per wildcard")
    func hostNames() throws {
        let f = try Fixture("tls-hosts")
        defer { try? FileManager.default.removeItem(atPath: f.dir) }
        let wild = try DevCertificates.issueNodeCertificate(ca: f.caA, nodeName: "node3", hosts: ["*.db.example", "::1"], directory: f.dir + "/wild")
        let identity = PeerIdentity(try DevCertificates.loadCertificate(wild.certificatePath))
        #expect(TLSMaterial.names(identity, host: "node3.db.example"))
        #expect(TLSMaterial.names(identity, host: "NODE3.DB.EXAMPLE"))
        #expect(!TLSMaterial.names(identity, host: "a.node3.db.example"))
        #expect(!TLSMaterial.names(identity, host: "db.example"))
        #expect(TLSMaterial.names(identity, host: "[::1]"))
        #expect(!TLSMaterial.names(identity, host: "127.0.0.1"))
    }

    @Test("expiry warnings: below the threshold, then once per day left, expired ones too; a replaced certificate is warned about afresh")
    func expiryWarnings() {
        func cert(_ sha: String, _ seconds: Int64) -> TLSCertificateInfo {
            TLSCertificateInfo(
                kind: .node, subject: "CN=\(sha)", issuer: "CN=ca", issuedBy: nil, serial: "1", sha256: sha, notBefore: "", notAfter: "",
                notAfterUnix: 0, secondsLeft: seconds, file: "f")
        }
        let day: Int64 = 86_400
        var w = ExpiryWarnings()
        #expect(w.due([cert("a", 40 * day)], thresholdDays: 30).isEmpty)
        #expect(w.due([cert("a", 29 * day + 5)], thresholdDays: 30).map(\.sha256) == ["a"])
        #expect(w.due([cert("a", 29 * day)], thresholdDays: 30).isEmpty)
        #expect(w.due([cert("a", 28 * day + 10)], thresholdDays: 30).map(\.sha256) == ["a"])
        // A new certificate replaces it: nothing about the new one (far from expiry); the old
        // one is forgotten, so if it came back it would be warned about again.
        #expect(w.due([cert("b", 300 * day)], thresholdDays: 30).isEmpty)
        #expect(w.due([cert("a", 28 * day)], thresholdDays: 30).map(\.sha256) == ["a"])
        // Expired: warned about, and again a day later.
        #expect(w.due([cert("c", -10)], thresholdDays: 30).map(\.sha256) == ["c"])
        #expect(w.due([cert("c", -20)], thresholdDays: 30).isEmpty)
        #expect(w.due([cert("c", -day - 11)], thresholdDays: 30).map(\.sha256) == ["c"])
        #expect(ExpiryWarnings.line(cert("c", -10)).contains("expired"))
    }

    /// A keep-alive TLS connection to a node's client port that sends one request at a time.
    final class KeepAlive: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        let bytes = Mutex<[UInt8]>([])
        var channel: (any Channel)?

        static func open(port: Int, ca: String, group: any EventLoopGroup) async throws -> KeepAlive {
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.trustRoots = .file(ca)
            let context = try NIOSSLContext(configuration: tls)
            let handler = KeepAlive()
            handler.channel = try await ClientBootstrap(group: group).channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: context, serverHostname: "localhost"))
                    try channel.pipeline.syncOperations.addHandler(handler)
                }
            }.connect(host: "127.0.0.1", port: port).get()
            return handler
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let buffer = unwrapInboundIn(data)
            bytes.withLock { $0.append(contentsOf: buffer.readableBytesView) }
        }

        /// Status and body of one request (at most 30 s).
        func send(_ method: String, _ path: String, json: Bool = false) async throws -> (status: Int, body: String) {
            guard let channel else { return (0, "") }
            bytes.withLock { $0 = [] }
            let extra = json ? "Content-Type: application/json\r\n" : ""
            try await channel.writeAndFlush(ByteBuffer(string: "\(method) \(path) HTTP/1.1\r\nHost: localhost\r\n\(extra)Content-Length: 0\r\n\r\n")).get()
            let deadline = Date().addingTimeInterval(30)
            while Date() < deadline {
                let text = String(decoding: bytes.withLock { $0 }, as: UTF8.self)
                if let end = text.range(of: "\r\n\r\n") {
                    let head = text[..<end.lowerBound].lowercased()
                    let length = head.split(separator: "\r\n").first { $0.hasPrefix("content-length:") }.flatMap { Int($0.dropFirst(15).trimmingCharacters(in: .whitespaces)) }
                    let body = String(text[end.upperBound...])
                    if let length, body.utf8.count >= length {
                        return (text.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0, body)
                    }
                }
                try await Task.sleep(for: .milliseconds(20))
            }
            return (0, "")
        }

        /// The serial number of the certificate the server presented.
        func serverSerial() async throws -> String? {
            guard let channel else { return nil }
            let der = try await channel.eventLoop.submit { try channel.pipeline.syncOperations.handler(type: NIOSSLClientHandler.self).peerCertificate?.toDERBytes() }.get()
            return try der.map { TLSMaterial.serial(try Certificate(derEncoded: $0)) }
        }

        func close() { channel?.close(promise: nil) }

        /// `open`, then `GET /.banyan/health` answering 200; retried every 500 ms (at most 60
        /// times) while the connection fails, as a node starting on a loaded machine may close
        /// one before it serves.
        static func ready(port: Int, ca: String, group: any EventLoopGroup) async throws -> KeepAlive {
            var last: any Error = HTTPFailure("never tried")
            for _ in 0..<60 {
                do {
                    let c = try await open(port: port, ca: ca, group: group)
                    if try await c.send("GET", "/.banyan/health").status == 200 { return c }
                    c.close()
                    last = HTTPFailure("health did not answer 200")
                } catch {
                    last = error
                }
                try await Task.sleep(for: .milliseconds(500))
            }
            throw last
        }
    }

    struct HTTPFailure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    static func copy(_ from: NodeCertificateFiles, to: NodeCertificateFiles) throws {
        for (a, b) in [(from.certificatePath, to.certificatePath), (from.privateKeyPath, to.privateKeyPath)] {
            let temporary = b + ".new"
            try? FileManager.default.removeItem(atPath: temporary)
            try FileManager.default.copyItem(atPath: a, toPath: temporary)
            // rename(2): a reload sees the old file or the new one, never half of one.
            guard rename(temporary, b) == 0 else { throw BanyanServer.CertificateError(path: b, code: .invalid, reason: "rename failed") }
        }
    }

    @Test("a running node reloads its peer material, trust bundle and HTTPS certificate: new connections get the new certificate, an open one keeps working, and a bad reload is refused with the old material kept")
    func nodeReload() async throws {
        let f = try Fixture("tls-node-reload")
        defer { try? FileManager.default.removeItem(atPath: f.dir) }
        // The node's own paths: trust A, certificate from A, for peers and the client port.
        let caPath = f.dir + "/in-use-ca.pem"
        let peerFiles = NodeCertificateFiles(certificatePath: f.dir + "/in-use-node.pem", privateKeyPath: f.dir + "/in-use-node.key")
        let httpsFiles = NodeCertificateFiles(certificatePath: f.dir + "/in-use-https.pem", privateKeyPath: f.dir + "/in-use-https.key")
        try FileManager.default.copyItem(atPath: f.caA.certificatePath, toPath: caPath)
        try Self.copy(f.nodeA, to: peerFiles)
        try Self.copy(f.nodeA, to: httpsFiles)
        var c = singleNodeConfig(f.dir)
        c.tls.caCertificate = caPath
        c.tls.certificate = peerFiles.certificatePath
        c.tls.privateKey = peerFiles.privateKeyPath
        c.tls.generateDevelopmentCertificates = false
        c.http.tlsCertificate = httpsFiles.certificatePath
        c.http.tlsPrivateKey = httpsFiles.privateKeyPath
        try c.validate()
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { node.shutdown() }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { group.shutdownGracefully { _ in } }
        let serialA = TLSMaterial.serial(try DevCertificates.loadCertificate(f.nodeA.certificatePath))
        let serialB = TLSMaterial.serial(try DevCertificates.loadCertificate(f.nodeB.certificatePath))

        let kept = try await KeepAlive.ready(port: clientPort(node), ca: f.bundle, group: group)
        defer { kept.close() }
        #expect(try await kept.serverSerial() == serialA)
        let before = try await kept.send("GET", "/.banyan/tls")
        #expect(before.status == 200 && before.body.contains(serialA) && before.body.contains("\"loaded_by\" : \"start\""), "\(before.body)")

        // Rotate: trust A and B, certificates from B (peer and client port), reload through the
        // operator endpoint on the open connection.
        try FileManager.default.removeItem(atPath: caPath)
        try FileManager.default.copyItem(atPath: f.bundle, toPath: caPath)
        try Self.copy(f.nodeB, to: peerFiles)
        try Self.copy(f.nodeB, to: httpsFiles)
        let reloaded = try await kept.send("POST", "/.banyan/tls/reload", json: true)
        #expect(reloaded.status == 200, "\(reloaded.body)")
        #expect(reloaded.body.contains(serialB) && !reloaded.body.contains(serialA) && reloaded.body.contains("Test CA B"), "\(reloaded.body)")
        // The open connection still works (its TLS session is the old certificate's)...
        #expect(try await kept.send("GET", "/.banyan/health").status == 200)
        #expect(try await kept.serverSerial() == serialA)
        // ...and a new one gets B's certificate.
        let fresh = try await KeepAlive.ready(port: clientPort(node), ca: f.bundle, group: group)
        #expect(try await fresh.serverSerial() == serialB)
        fresh.close()

        // A key that does not belong to the certificate: refused with the file and code, and B's
        // material stays in force.
        try FileManager.default.removeItem(atPath: peerFiles.privateKeyPath)
        try FileManager.default.copyItem(atPath: f.nodeA.privateKeyPath, toPath: peerFiles.privateKeyPath)
        let refused = try await kept.send("POST", "/.banyan/tls/reload", json: true)
        #expect(refused.status == 422, "\(refused.body)")
        #expect(refused.body.contains("\"code\" : \"mismatch\"") && refused.body.contains(peerFiles.privateKeyPath), "\(refused.body)")
        let status = node.tls.status()
        #expect(status.certificates.first?.serial == serialB && status.reloads == 1 && status.failedReloads == 1)
        #expect(status.lastFailure?.code == "mismatch" && status.lastFailure?.trigger == "admin")
        let again = try await KeepAlive.ready(port: clientPort(node), ca: f.bundle, group: group)
        #expect(try await again.serverSerial() == serialB)
        // The status and the metrics report expiry.
        let full = try await again.send("GET", "/.banyan/status")
        #expect(full.body.contains("\"tls\" : {") && full.body.contains("\"seconds_left\"") && full.body.contains("\"started_at_ms\""), "\(full.body.prefix(300))")
        let metrics = try await again.send("GET", "/metrics")
        #expect(metrics.body.contains("banyan_tls_certificate_expiry_seconds{kind=\"node\""), "\(metrics.body.prefix(200))")
        #expect(metrics.body.contains("banyan_tls_reloads_total{result=\"refused\"}"))
        again.close()

        // Like every state-changing operator request, a reload must say it is JSON (docs/security.md).
        #expect(try await kept.send("POST", "/.banyan/tls/reload").status == 415)
    }
}
