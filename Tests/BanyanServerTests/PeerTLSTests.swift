@testable import BanyanServer
import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization
import Testing
import X509

/// Certificates for the TLS tests, in a fresh directory under /tmp: the cluster CA with nodes
/// "node-a" and "node-b" (localhost, 127.0.0.1, ::1) and "elsewhere" (db.example.com only); an
/// unrelated CA with "intruder".
final class TestPKI {
    let root: String
    let ca: CAFiles
    let a: NodeCertificateFiles
    let b: NodeCertificateFiles
    let elsewhere: NodeCertificateFiles
    let otherCA: CAFiles
    let intruder: NodeCertificateFiles
    static let hosts = ["localhost", "127.0.0.1", "::1"]

    init() throws {
        root = try temporaryDirectory("tls")
        (ca, a) = try DevCertificates.ensureDevelopmentCertificates(directory: root + "/cluster", nodeName: "node-a", hosts: Self.hosts)
        b = try DevCertificates.ensureDevelopmentCertificates(directory: root + "/cluster", nodeName: "node-b", hosts: Self.hosts).node
        elsewhere = try DevCertificates.issueNodeCertificate(ca: ca, nodeName: "elsewhere", hosts: ["db.example.com"], directory: root + "/cluster")
        (otherCA, intruder) = try DevCertificates.ensureDevelopmentCertificates(directory: root + "/other", nodeName: "intruder", hosts: Self.hosts)
    }

    deinit { try? FileManager.default.removeItem(atPath: root) }
}

/// What one end of a test connection saw.
final class Observed: Sendable {
    struct State {
        var received: [UInt8] = []
        var errors: [any Error] = []
        var handshake = false
        var peer: PeerIdentity?
        var tlsVersion: TLSVersion?
        var closed = false
    }
    let state = Mutex(State())
    var snapshot: State { state.withLock { $0 } }
    var text: String { String(decoding: snapshot.received, as: UTF8.self) }
}

/// Records one end's events; the server end answers each read with `reply`.
final class Probe: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let observed: Observed
    let reply: String?

    init(_ observed: Observed, reply: String? = nil) {
        self.observed = observed
        self.reply = reply
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? TLSUserEvent, case .handshakeCompleted = event {
            let peer = PeerTLS.peerIdentity(in: context.pipeline.syncOperations)
            let version = try? context.pipeline.syncOperations.nioSSL_tlsVersion()
            observed.state.withLock {
                $0.handshake = true
                $0.peer = peer
                $0.tlsVersion = version
            }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        let bytes = buffer.readBytes(length: buffer.readableBytes) ?? []
        observed.state.withLock { $0.received += bytes }
        if let reply { context.writeAndFlush(wrapOutboundOut(ByteBuffer(string: reply)), promise: nil) }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        observed.state.withLock { $0.errors.append(error) }
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        observed.state.withLock { $0.closed = true }
        context.fireChannelInactive()
    }
}

/// Outcome of one loopback connection.
struct Exchange {
    let server: Observed
    let client: Observed
    var exchanged: Bool { server.text == "ping" && client.text == "pong" }
}

@Suite(.serialized, .timeLimit(.minutes(1))) struct PeerTLSTests {
    let pki: TestPKI
    init() throws { pki = try TestPKI() }

    /// A server on 127.0.0.1 (port 0) with `server`; a client with `client` sends "ping", the
    /// server answers "pong". Waits (at most 5 s) for the answer or for both ends to close.
    func exchange(server: TLSConfiguration, client: TLSConfiguration, serverHostname: String? = nil) async throws -> Exchange {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let result = Exchange(server: Observed(), client: Observed())
        do {
            let serverContext = try NIOSSLContext(configuration: server)
            let clientContext = try NIOSSLContext(configuration: client)
            let listener = try await ServerBootstrap(group: group)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: serverContext))
                        try channel.pipeline.syncOperations.addHandler(Probe(result.server, reply: "pong"))
                    }
                }
                .bind(host: "127.0.0.1", port: 0).get()
            let channel = try await ClientBootstrap(group: group)
                .connectTimeout(.seconds(2))
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: clientContext, serverHostname: serverHostname))
                        try channel.pipeline.syncOperations.addHandler(Probe(result.client))
                    }
                }
                .connect(host: "127.0.0.1", port: listener.localAddress?.port ?? 0).get()
            try? await channel.writeAndFlush(ByteBuffer(string: "ping")).get()
            _ = await eventually({ result.exchanged || (result.client.snapshot.closed && result.server.snapshot.closed) }, seconds: 5)
            try? await channel.close().get()
            try? await listener.close().get()
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
        try await group.shutdownGracefully()
        return result
    }

    func server(_ node: NodeCertificateFiles) throws -> TLSConfiguration { try PeerTLS.serverConfiguration(node: node, ca: pki.ca) }
    func client(_ node: NodeCertificateFiles, ca: CAFiles? = nil) throws -> TLSConfiguration { try PeerTLS.clientConfiguration(node: node, ca: ca ?? pki.ca) }

    /// The handshake failed: nothing got through, the server saw (and could log) a TLS error,
    /// and the client's connection ended.
    func expectRefused(_ e: Exchange, _ comment: Comment) {
        #expect(!e.server.snapshot.handshake, comment)
        #expect(e.server.snapshot.received.isEmpty && e.client.snapshot.received.isEmpty, comment)
        #expect(e.server.snapshot.errors.contains { $0 is NIOSSLError }, "\(comment): server errors \(e.server.snapshot.errors)")
        #expect(e.client.snapshot.closed, comment)
    }

    @Test("nodes with certificates from the cluster CA complete the handshake (TLS 1.3), see each other's names, and exchange bytes")
    func sameCA() async throws {
        // An IP literal is not sent as SNI: the client checks the IP SAN against the address.
        for hostname in [nil, "localhost"] {
            let e = try await exchange(server: try server(pki.a), client: try client(pki.b), serverHostname: hostname)
            #expect(e.exchanged, "\(hostname ?? "127.0.0.1"): \(e.client.snapshot.errors) \(e.server.snapshot.errors)")
            #expect(e.server.snapshot.tlsVersion == .tlsv13 && e.client.snapshot.tlsVersion == .tlsv13)
            #expect(e.server.snapshot.peer?.commonName == "node-b")
            let serverName = try #require(e.client.snapshot.peer)
            #expect(serverName.commonName == "node-a" && serverName.dnsNames == ["localhost"] && serverName.ipAddresses == ["127.0.0.1", "::1"])
            #expect(serverName.description == "CN=node-a DNS:localhost IP:127.0.0.1 IP:::1")
        }
    }

    @Test("a client with a certificate from another CA is refused; both ends see the handshake fail")
    func otherCA() async throws {
        // The intruder trusts the cluster CA, so only the server's check can stop it.
        let e = try await exchange(server: try server(pki.a), client: try client(pki.intruder, ca: pki.ca))
        expectRefused(e, "intruder")
        // In TLS 1.3 the client finishes its side of the handshake before the server has checked
        // its certificate; it learns of the refusal from the server's alert on its next read.
        #expect(e.client.snapshot.errors.contains { "\($0)".contains("ALERT_UNKNOWN_CA") }, "\(e.client.snapshot.errors)")
        // And a server from another CA is refused by the client.
        let f = try await exchange(server: try PeerTLS.serverConfiguration(node: pki.intruder, ca: pki.otherCA), client: try client(pki.b))
        #expect(!f.client.snapshot.handshake && !f.exchanged)
        #expect(f.client.snapshot.errors.contains { $0 is NIOSSLError }, "\(f.client.snapshot.errors)")
    }

    @Test("a client presenting no certificate is refused")
    func noClientCertificate() async throws {
        var bare = TLSConfiguration.makeClientConfiguration()
        bare.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(pki.ca.certificatePath))
        let e = try await exchange(server: try server(pki.a), client: bare)
        expectRefused(e, "no certificate")
        #expect(e.server.snapshot.errors.contains { "\($0)".contains("PEER_DID_NOT_RETURN_A_CERTIFICATE") }, "\(e.server.snapshot.errors)")
        #expect(e.client.snapshot.errors.contains { "\($0)".contains("ALERT_CERTIFICATE_REQUIRED") }, "\(e.client.snapshot.errors)")
    }

    @Test("a client that cannot speak TLS 1.3 is refused")
    func tls12() async throws {
        var old = try client(pki.b)
        old.maximumTLSVersion = .tlsv12
        old.minimumTLSVersion = .tlsv12
        expectRefused(try await exchange(server: try server(pki.a), client: old), "TLS 1.2")
    }

    @Test("the client refuses a server certificate that does not name the host it dialled")
    func wrongHost() async throws {
        for hostname in [nil, "localhost"] {
            let e = try await exchange(server: try server(pki.elsewhere), client: try client(pki.b), serverHostname: hostname)
            #expect(!e.exchanged && e.server.snapshot.received.isEmpty)
            #expect(e.client.snapshot.errors.contains { $0 as? NIOSSLExtraError == .failedToValidateHostname }, "\(e.client.snapshot.errors)")
        }
        // The name it does carry is accepted.
        #expect(try await exchange(server: try server(pki.elsewhere), client: try client(pki.b), serverHostname: "db.example.com").exchanged)
    }

    @Test("the server checks a client's chain, not its address: a certificate not naming 127.0.0.1 may dial from there")
    func serverIgnoresClientAddress() async throws {
        let e = try await exchange(server: try server(pki.a), client: try client(pki.elsewhere))
        #expect(e.exchanged && e.server.snapshot.peer?.dnsNames == ["db.example.com"])
    }
}

@Suite struct CertificateFileTests {
    func contents(_ paths: [String]) throws -> [Data] { try paths.map { try Data(contentsOf: URL(fileURLWithPath: $0)) } }
    func mode(_ path: String) throws -> Int? { try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int }

    @Test("development certificates are created once and then reused unchanged; keys are PKCS#8 with mode 0600")
    func development() throws {
        let pki = try TestPKI()
        let dir = pki.root + "/cluster"
        let paths = [pki.ca.certificatePath, pki.ca.privateKeyPath ?? "", pki.a.certificatePath, pki.a.privateKeyPath]
        #expect(paths == ["ca.pem", "ca.key", "node-a.pem", "node-a.key"].map { dir + "/" + $0 })
        let before = try contents(paths)
        let again = try DevCertificates.ensureDevelopmentCertificates(directory: dir, nodeName: "node-a", hosts: ["other.example"])
        #expect(again.ca == pki.ca && again.node == pki.a)
        #expect(try contents(paths) == before)
        for key in [pki.ca.privateKeyPath ?? "", pki.a.privateKeyPath] {
            #expect(try mode(key) == 0o600)
            #expect(try String(contentsOfFile: key, encoding: .utf8).hasPrefix("-----BEGIN PRIVATE KEY-----\n"))
        }
        #expect(try mode(dir) == 0o700)
        // Never overwrites: not the CA, not a node's files.
        let exists = try #require(throws: BanyanServer.CertificateError.self) { try DevCertificates.createCA(commonName: "again", directory: dir) }
        #expect(exists.code == .exists)
        #expect(throws: BanyanServer.CertificateError.self) {
            try DevCertificates.issueNodeCertificate(ca: pki.ca, nodeName: "node-a", hosts: ["localhost"], directory: dir)
        }
        #expect(try contents(paths) == before)
        // Half a pair is reported, not silently replaced.
        try FileManager.default.removeItem(atPath: pki.ca.certificatePath)
        let error = try #require(throws: BanyanServer.CertificateError.self) {
            try DevCertificates.ensureDevelopmentCertificates(directory: dir, nodeName: "node-a", hosts: ["localhost"])
        }
        #expect(error.path == pki.ca.certificatePath && error.code == .missing)
        #expect(try contents([pki.ca.privateKeyPath ?? ""]) == [before[1]])
    }

    @Test("the CA and node certificates carry the constraints, usages, names and key identifiers peers rely on")
    func contentsOfCertificates() throws {
        let pki = try TestPKI()
        let ca = try DevCertificates.loadCertificate(pki.ca.certificatePath)
        let node = try DevCertificates.loadCertificate(pki.a.certificatePath)
        #expect(try ca.extensions.basicConstraints == .isCertificateAuthority(maxPathLength: 0))
        #expect(try ca.extensions.keyUsage == KeyUsage(keyCertSign: true, cRLSign: true))
        #expect(try node.extensions.basicConstraints == .notCertificateAuthority)
        #expect(try node.extensions.extendedKeyUsage == ExtendedKeyUsage([.serverAuth, .clientAuth]))
        #expect(try node.extensions.keyUsage == KeyUsage(digitalSignature: true))
        let identity = PeerIdentity(node)
        #expect(identity.commonName == "node-a" && identity.dnsNames == ["localhost"] && identity.ipAddresses == ["127.0.0.1", "::1"])
        #expect(node.issuer == ca.subject && ca.publicKey.isValidSignature(node.signature, for: node))
        let caKeyID = try #require(try ca.extensions.subjectKeyIdentifier?.keyIdentifier)
        #expect(try node.extensions.authorityKeyIdentifier?.keyIdentifier == caKeyID)
        #expect(node.notValidAfter.timeIntervalSinceNow > 800 * 86_400)
        // Hosts: "[::1]" as in an address, duplicates, case; nonsense is refused.
        let names = try DevCertificates.subjectAlternativeNames(["[::1]", "::1", "Node1.Example.com"], "x")
        #expect(names.count == 2 && names.last == .dnsName("node1.example.com"))
        for bad in [[], [""], ["a b"], ["http://x"], ["1:2"]] {
            #expect(throws: BanyanServer.CertificateError.self, "\(bad)") { try DevCertificates.subjectAlternativeNames(bad, "x") }
        }
        #expect(throws: BanyanServer.CertificateError.self) {
            try DevCertificates.issueNodeCertificate(ca: pki.ca, nodeName: "../up", hosts: ["localhost"], directory: pki.root)
        }
    }

    @Test("missing, unreadable and malformed PEM, and mismatched keys, are typed errors naming the file")
    func malformed() throws {
        let pki = try TestPKI()
        let dir = pki.root
        func write(_ name: String, _ text: String) throws -> String {
            try text.write(toFile: dir + "/" + name, atomically: true, encoding: .utf8)
            return dir + "/" + name
        }
        func failure(_ body: () throws -> Void) -> (path: String, code: BanyanServer.CertificateError.Code)? {
            do {
                try body()
                return nil
            } catch let e as BanyanServer.CertificateError {
                return (e.path, e.code)
            } catch {
                Issue.record("untyped error \(error)")
                return nil
            }
        }
        let badBase64 = try write("bad.pem", "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n")
        let empty = try write("empty.pem", "")
        let notPEM = try write("text.pem", "hello\n")
        for path in [badBase64, empty, notPEM, pki.a.privateKeyPath] {
            #expect(failure { _ = try DevCertificates.loadCertificate(path) }?.code == .malformed, "\(path)")
        }
        for path in [badBase64, empty, notPEM, pki.a.certificatePath] {
            #expect(failure { _ = try DevCertificates.loadPrivateKey(path) }?.code == .malformed, "\(path)")
        }
        #expect(failure { _ = try DevCertificates.loadCertificate(dir + "/missing.pem") } ?? ("", .invalid) == (dir + "/missing.pem", .missing))
        #expect(failure { _ = try DevCertificates.loadCertificate(dir) }?.code == .unreadable)
        // The TLS configurations name the file at fault.
        let badKey = NodeCertificateFiles(certificatePath: pki.a.certificatePath, privateKeyPath: badBase64)
        #expect(failure { _ = try PeerTLS.serverConfiguration(node: badKey, ca: pki.ca) } ?? ("", .invalid) == (badBase64, .malformed))
        let otherKey = NodeCertificateFiles(certificatePath: pki.a.certificatePath, privateKeyPath: pki.b.privateKeyPath)
        #expect(failure { _ = try PeerTLS.clientConfiguration(node: otherKey, ca: pki.ca) } ?? ("", .invalid) == (pki.b.privateKeyPath, .mismatch))
        let badCA = CAFiles(certificatePath: notPEM, privateKeyPath: nil)
        #expect(failure { _ = try PeerTLS.clientConfiguration(node: pki.a, ca: badCA) } ?? ("", .invalid) == (notPEM, .malformed))
        // Issuing with a CA whose key is not its own.
        let wrongCA = CAFiles(certificatePath: pki.ca.certificatePath, privateKeyPath: pki.otherCA.privateKeyPath)
        #expect(failure { _ = try DevCertificates.issueNodeCertificate(ca: wrongCA, nodeName: "n", hosts: ["localhost"], directory: dir) }?.code == .mismatch)
        #expect(!FileManager.default.fileExists(atPath: dir + "/n.key"))
    }

    @Test("a CA bundle (two CAs during a rotation) is trusted as a whole")
    func bundle() throws {
        let pki = try TestPKI()
        let bundle = pki.root + "/bundle.pem"
        let both = try String(contentsOfFile: pki.ca.certificatePath, encoding: .utf8) + String(contentsOfFile: pki.otherCA.certificatePath, encoding: .utf8)
        try both.write(toFile: bundle, atomically: true, encoding: .utf8)
        #expect(try DevCertificates.loadCertificates(bundle).count == 2)
        let c = try PeerTLS.serverConfiguration(node: pki.a, ca: CAFiles(certificatePath: bundle, privateKeyPath: nil))
        guard case .certificates(let roots) = c.trustRoots else {
            Issue.record("trust roots \(String(describing: c.trustRoots))")
            return
        }
        #expect(roots.count == 2)
    }
}
