import BanyanNode
import BanyanOps
@testable import BanyanServer
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization
import Testing

/// HTTPS and WSS on the client port (docs/security.md, "HTTPS").
@Suite struct ClientTLSTests {
    /// Collects what a connection receives until it closes.
    final class Collect: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        let bytes = Mutex<[UInt8]>([])
        let closed = Mutex(false)
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let buffer = unwrapInboundIn(data)
            bytes.withLock { $0.append(contentsOf: buffer.readableBytesView) }
        }
        func channelInactive(context: ChannelHandlerContext) { closed.withLock { $0 = true } }
        func errorCaught(context: ChannelHandlerContext, error: any Error) { context.close(promise: nil) }
    }

    /// Sends `request` over TLS (trusting `ca`) and returns what came back before the close.
    static func exchange(port: Int, ca: String, _ request: String, group: any EventLoopGroup) async throws -> String {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .file(ca)
        let context = try NIOSSLContext(configuration: tls)
        let collect = Collect()
        let channel = try await ClientBootstrap(group: group).channelInitializer { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: context, serverHostname: "localhost"))
                try channel.pipeline.syncOperations.addHandler(collect)
            }
        }.connect(host: "127.0.0.1", port: port).get()
        try await channel.writeAndFlush(ByteBuffer(string: request)).get()
        _ = await eventually({ collect.closed.withLock { $0 } || String(decoding: collect.bytes.withLock { $0 }, as: UTF8.self).contains("\"t\":") }, seconds: 10)
        try? await channel.close().get()
        return String(decoding: collect.bytes.withLock { $0 }, as: UTF8.self)
    }

    /// `body`'s answer, tried up to five times while it fails (a loaded machine); "" if it never answers.
    static func retrying(_ body: () async throws -> String) async -> String {
        for _ in 0..<5 {
            if let answer = try? await body(), !answer.isEmpty { return answer }
            try? await Task.sleep(for: .milliseconds(500))
        }
        return ""
    }

    /// A single node's configuration under `dir` whose client port serves HTTPS with a
    /// development CA's certificate for localhost and 127.0.0.1, and those files.
    static func httpsConfig(_ dir: String) throws -> (files: (ca: CAFiles, node: NodeCertificateFiles), config: NodeConfig) {
        let files = try DevCertificates.ensureDevelopmentCertificates(directory: dir + "/certs", nodeName: "node1", hosts: ["localhost", "127.0.0.1"])
        var c = singleNodeConfig(dir)
        c.http.tlsCertificate = files.node.certificatePath
        c.http.tlsPrivateKey = files.node.privateKeyPath
        return (files, c)
    }

    @Test("with http.tls_cert and tls_key the client port speaks HTTPS (reads, writes) and WSS (the v5 hello), and nothing in plain text")
    func httpsAndWSS() async throws {
        let dir = try temporaryDirectory("client-tls")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (files, c) = try Self.httpsConfig(dir)
        try c.validate()
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { group.shutdownGracefully { _ in } }
        let put = "PUT /t/a.json HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\nConnection: close\r\n\r\n7"
        // Until the node leads (503 before), retrying on a connection that fails on a loaded
        // machine too; bounded.
        var wrote = ""
        for _ in 0..<60 {
            wrote = (try? await Self.exchange(port: port, ca: files.ca.certificatePath, put, group: group)) ?? ""
            if wrote.hasPrefix("HTTP/1.1 200") { break }
            try await Task.sleep(for: .milliseconds(500))
        }
        #expect(wrote.hasPrefix("HTTP/1.1 200"), "\(wrote.prefix(200))")
        let read = await Self.retrying { try await Self.exchange(port: port, ca: files.ca.certificatePath, "GET /t.json HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", group: group) }
        #expect(read.hasPrefix("HTTP/1.1 200") && read.hasSuffix(#"{"a":7}"#), "\(read.suffix(200))")
        // WSS: the upgrade answers 101 and the server's hello frame follows on the same TLS stream.
        let upgrade = "GET /.ws?v=5&ns=default HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        let ws = await Self.retrying { try await Self.exchange(port: port, ca: files.ca.certificatePath, upgrade, group: group) }
        #expect(ws.hasPrefix("HTTP/1.1 101"), "\(ws.prefix(200))")
        #expect(ws.contains("\"t\":\"c\""), "no hello frame: \(ws.suffix(200))")
        // Plain HTTP gets no answer (the TLS handler refuses the bytes and closes).
        let plain = try? httpExchange(port: port, "GET", "/t.json")
        #expect(plain?.status != 200)
    }

    @Test("operator commands reach an HTTPS client port signed by a private CA with BANYAN_CA_FILE (status, drain, a streamed backup); without it the system's trust refuses the certificate, and a file that is not the CA is refused too")
    func operatorCommandsTrustBanyanCAFile() async throws {
        let dir = try temporaryDirectory("client-tls-operator")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (files, c) = try Self.httpsConfig(dir)
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { node.shutdown() }
        let endpoint = "https://127.0.0.1:\(clientPort(node))"
        func banyan(_ args: [String], ca: String?) async throws -> (status: Int32, output: String) {
            try await Task.detached {
                var environment = ProcessInfo.processInfo.environment
                environment["BANYAN_CA_FILE"] = ca
                let file = NSTemporaryDirectory() + "banyan-ca-\(UInt64.random(in: 0...UInt64.max)).out"
                defer { try? FileManager.default.removeItem(atPath: file) }
                let pid = try ChildProcess.spawn(try RotationAndRollTests.banyan(), args, environment: environment, outputFile: file)
                let ending = ChildProcess.wait(pid, seconds: 60)
                let output = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
                if case .exited(let code) = ending { return (code, output) }
                return (-1, output)
            }.value
        }
        // The node leads and takes a write (through the command's own HTTPS path, retried while
        // it elects itself).
        var drained = (status: Int32(-1), output: "")
        for _ in 0..<40 {
            drained = try await banyan(["drain", "--stop", "--endpoint", endpoint], ca: files.ca.certificatePath)
            if drained.status == 0 { break }
            try await Task.sleep(for: .milliseconds(250))
        }
        #expect(drained.status == 0 && drained.output.contains("draining stopped"), "\(drained.output)")
        let backup = try await banyan(["backup", "--endpoint", endpoint, "--out", dir + "/b.bkp"], ca: files.ca.certificatePath)
        #expect(backup.status == 0 && backup.output.contains("backup \(dir)/b.bkp: index"), "\(backup.output)")
        let verified = try await banyan(["backup", "verify", dir + "/b.bkp"], ca: nil)
        #expect(verified.status == 0, "\(verified.output)")
        // Without the variable: the system's trust does not know the CA.
        let untrusted = try await banyan(["drain", "--stop", "--endpoint", endpoint], ca: nil)
        #expect(untrusted.status != 0 && untrusted.output.lowercased().contains("certificate"), "\(untrusted.output)")
        // A file that is not the CA (the node's own certificate is no trust anchor).
        let wrong = try await banyan(["drain", "--stop", "--endpoint", endpoint], ca: files.node.certificatePath)
        #expect(wrong.status != 0 && wrong.output.contains("CERTIFICATE_VERIFY_FAILED"), "\(wrong.output)")
    }

    @Test("a certificate without its key is refused at start")
    func halfConfigured() {
        var c = NodeConfig()
        c.http.tlsCertificate = "/tmp/cert.pem"
        #expect(throws: ConfigError.self) { try c.validate() }
    }
}
