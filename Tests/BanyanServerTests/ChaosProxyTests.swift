import BanyanBasics
@testable import BanyanOps
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization
import Testing

@testable import BanyanServer

/// `banyan chaos proxy` end to end (docs/chaos.md, "The proxy"): a real node behind the proxy,
/// spoken to with raw sockets, so the request gate's HTTP parsing meets what clients really send
/// (WebSocket upgrades, event streams, pipelined and chunked requests), TLS clients, and the
/// owner token.
extension ChaosTests {
    /// A node on loopback and a proxy in front of it (settings as given), with a write through
    /// the proxy already acknowledged (the node elected itself).
    static func nodeBehindProxy(_ name: String, settings: ChaosProxy.Settings = ChaosProxy.Settings(), configure: (inout NodeConfig) -> Void = { _ in })
        async throws -> (node: BanyanNode, proxy: ChaosProxy, port: Int, dir: String)
    {
        let dir = try temporaryDirectory(name)
        var c = Self.loopbackConfig(dir + "/data")
        configure(&c)
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        let proxy = ChaosProxy(targetHost: "127.0.0.1", targetPort: clientPort(node), settings: settings) { _ in }
        let port: Int
        do {
            port = try proxy.start(host: "127.0.0.1", port: 0)
        } catch {
            node.shutdown()
            throw error
        }
        return (node, proxy, port, dir)
    }

    /// PUTs through the proxy until the node, electing itself, acknowledges one (bounded).
    static func firstWrite(_ port: Int, _ path: String, _ body: String) async throws -> Bool {
        await eventually({ ((try? httpExchange(port: port, "PUT", path, body: body))?.status ?? 0) == 200 }, seconds: 30)
    }

    @Test("through the proxy: a WebSocket gets its hello and a push after a write; an event stream gets the put event; two pipelined PUTs in one TCP write are both answered; a chunked body arrives whole")
    func proxyCarriesRealTraffic() async throws {
        let (node, proxy, port, dir) = try await Self.nodeBehindProxy("chaos-proxy-e2e")
        defer {
            proxy.stop()
            node.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        #expect(try await Self.firstWrite(port, "/room/x.json?ns=px", "0"))

        // WebSocket v5: the upgrade passes as the connection's first request, the 101 makes the
        // rest a tunnel; the hello, a listen's initial data and ok, then a push for a write
        // made by another client through the proxy.
        let ws = try RealtimeServerTests.Client(port: port, target: "/.ws?v=5&ns=px")
        let upgrade = ws.head()
        #expect(upgrade.hasPrefix("HTTP/1.1 101"), "\(upgrade)")
        let hello = ws.message() ?? ""
        #expect(hello.contains(#""t":"h""#) && hello.contains(#""v":"5""#), "\(hello)")
        ws.text(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/room","h":""}}}"#)
        let listening = ws.messages(until: #""r":1"#)
        #expect(listening.last?.contains(#""s":"ok""#) == true, "\(listening)")

        // An event stream through the proxy: its first event is the location as it is.
        let stream = try RequestDeadlineTests.Raw(port: port)
        stream.send("GET /room.json?ns=px HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
        let opened = stream.receive(until: "\n\n", seconds: 10).text
        #expect(opened.hasPrefix("HTTP/1.1 200") && opened.contains("event: put\ndata: {\"path\":\"/\",\"data\":{\"x\":0}}"), "\(opened)")

        #expect(try httpExchange(port: port, "PUT", "/room/x.json?ns=px", body: #""pushed""#).status == 200)
        let pushed = ws.messages(until: "pushed")
        #expect(pushed.last == #"{"t":"d","d":{"a":"d","b":{"p":"room/x","d":"pushed"}}}"#, "\(pushed)")
        let event = stream.receive(until: "pushed", seconds: 10).text
        #expect(event.contains("event: put\ndata: {\"path\":\"/x\",\"data\":\"pushed\"}"), "\(event)")

        // Two PUTs with bodies in one TCP write (pipelined): the gate reads each head and skips
        // each body by its length, and both reach the node and are answered, in order.
        let pipelined = try RequestDeadlineTests.Raw(port: port)
        let first = #"{"n":1}"#
        let second = #"{"n":2}"#
        pipelined.send(
            "PUT /pipe/a.json?ns=px HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \(first.utf8.count)\r\n\r\n\(first)"
                + "PUT /pipe/b.json?ns=px HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \(second.utf8.count)\r\nConnection: close\r\n\r\n\(second)")
        let answers = pipelined.receive(until: "", seconds: 10).text
        #expect(answers.components(separatedBy: "HTTP/1.1 200 OK").count == 3, "\(answers)")
        #expect(answers.hasSuffix(second), "\(answers)")
        #expect(try httpExchange(port: port, "GET", "/pipe.json?ns=px").body == #"{"a":{"n":1},"b":{"n":2}}"#)

        // A chunked body, sent in two writes that split a chunk: passed whole.
        let chunked = try RequestDeadlineTests.Raw(port: port)
        chunked.send("PUT /chunked.json?ns=px HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\n{\"a")
        // A blocking pause, not a suspension: a test that suspends here may resume only once the
        // busy pool frees a thread, after the node's 30 s request deadline.
        usleep(50_000)
        chunked.send("\":\r\n4\r\n\"hi\"\r\n1\r\n}\r\n0\r\n\r\n")
        let answer = chunked.receive(until: "", seconds: 10).text
        #expect(answer.hasPrefix("HTTP/1.1 200 OK"), "\(answer)")
        #expect(try httpExchange(port: port, "GET", "/chunked/a.json?ns=px").body == #""hi""#)
        #expect(proxy.stats.refusedRequests == 0)
    }

    /// What a TLS client saw: the bytes it received and the error that ended it, if any.
    final class TLSOutcome: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        let received = Mutex<[UInt8]>([])
        let error = Mutex<String?>(nil)
        let closed = Mutex(false)
        /// Whether the far side ended the connection before the client stopped waiting.
        let closedByPeer = Mutex(false)
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let buffer = unwrapInboundIn(data)
            received.withLock { $0.append(contentsOf: buffer.readableBytesView) }
        }
        func channelInactive(context: ChannelHandlerContext) { closed.withLock { $0 = true } }
        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            self.error.withLock { $0 = $0 ?? "\(error)" }
            context.close(promise: nil)
        }
        var text: String { String(decoding: received.withLock { $0 }, as: UTF8.self) }
    }

    /// Sends `request` over TLS to `port` (trusting `ca`) and waits (at most `seconds`) for the
    /// far side to close; then closes its end.
    static func tlsExchange(port: Int, ca: String, _ request: String, group: any EventLoopGroup, seconds: Double = 10) async throws -> TLSOutcome {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .file(ca)
        let context = try NIOSSLContext(configuration: tls)
        let outcome = TLSOutcome()
        let channel = try await ClientBootstrap(group: group).channelInitializer { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: context, serverHostname: "localhost"))
                try channel.pipeline.syncOperations.addHandler(outcome)
            }
        }.connect(host: "127.0.0.1", port: port).get()
        try? await channel.writeAndFlush(ByteBuffer(string: request)).get()
        let byPeer = await eventually({ outcome.closed.withLock { $0 } }, seconds: seconds)
        outcome.closedByPeer.withLock { $0 = byPeer }
        try? await channel.close().get()
        return outcome
    }

    @Test("a TLS client through the proxy: refused at once with a TLS alert (not left hanging) unless --tls-passthrough, which tunnels HTTPS to the node unread (the node's own checks then answer)")
    func proxyAndTLSClients() async throws {
        let dir = try temporaryDirectory("chaos-proxy-tls")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let files = try DevCertificates.ensureDevelopmentCertificates(directory: dir + "/certs", nodeName: "node1", hosts: ["localhost", "127.0.0.1"])
        var c = Self.loopbackConfig(dir + "/data")
        c.http.tlsCertificate = files.node.certificatePath
        c.http.tlsPrivateKey = files.node.privateKeyPath
        try c.validate()
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { node.shutdown() }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { group.shutdownGracefully { _ in } }
        let ca = files.ca.certificatePath
        let lines = Mutex<[String]>([])

        let refusing = ChaosProxy(targetHost: "127.0.0.1", targetPort: clientPort(node), settings: ChaosProxy.Settings()) { line in lines.withLock { $0.append(line) } }
        defer { refusing.stop() }
        let refusingPort = try refusing.start(host: "127.0.0.1", port: 0)
        let started = Date()
        // Left hanging, the client would wait for a server hello that never comes (the proxy would
        // wait for a request head): the proof is that the proxy ends it, with an alert. The wait is
        // generous because a loaded machine (the whole suite in parallel) may take seconds to
        // connect; how long it took is printed, not judged.
        let refused = try await Self.tlsExchange(port: refusingPort, ca: ca, "GET /.json HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", group: group, seconds: 60)
        let took = Date().timeIntervalSince(started)
        print("a TLS client of a proxy without --tls-passthrough: \(refused.error.withLock { $0 } ?? "no error") after \(String(format: "%.2f", took)) s")
        #expect(refused.closedByPeer.withLock { $0 }, "the proxy never ended the connection (waited \(took) s)")
        #expect(refused.text.isEmpty)
        #expect(refused.error.withLock { $0 }?.uppercased().contains("ACCESS_DENIED") == true, "\(refused.error.withLock { $0 } ?? "no error")")
        #expect(refusing.stats.refusedRequests == 1 && refusing.stats.bytesToTarget == 0)
        #expect(lines.withLock { $0 }.contains { $0.contains("--tls-passthrough") }, "\(lines.withLock { $0 })")

        var settings = ChaosProxy.Settings()
        settings.tlsPassthrough = true
        let tunnel = ChaosProxy(targetHost: "127.0.0.1", targetPort: clientPort(node), settings: settings) { line in lines.withLock { $0.append(line) } }
        defer { tunnel.stop() }
        let tunnelPort = try tunnel.start(host: "127.0.0.1", port: 0)
        // Until the node leads (503 before); bounded.
        var wrote = ""
        for _ in 0..<60 {
            wrote = (try? await Self.tlsExchange(port: tunnelPort, ca: ca, "PUT /t/a.json HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\nConnection: close\r\n\r\n7", group: group))?.text ?? ""
            if wrote.hasPrefix("HTTP/1.1 200") { break }
            try await Task.sleep(for: .milliseconds(500))
        }
        #expect(wrote.hasPrefix("HTTP/1.1 200"), "\(wrote.prefix(200))")
        let read = try await Self.tlsExchange(port: tunnelPort, ca: ca, "GET /t.json HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", group: group)
        #expect(read.text.hasPrefix("HTTP/1.1 200") && read.text.hasSuffix(#"{"a":7}"#), "\(read.text.suffix(200))")
        // Inside TLS the gate sees nothing: the fault switch is the node's to refuse (this node
        // has none), not the proxy's.
        let faults = try await Self.tlsExchange(port: tunnelPort, ca: ca, "GET /.banyan/faults HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", group: group)
        #expect(faults.text.hasPrefix("HTTP/1.1 403") && faults.text.contains("fault_injection_disabled"), "\(faults.text.suffix(300))")
        #expect(tunnel.stats.refusedRequests == 0 && tunnel.stats.tlsConnections >= 3)
        #expect(lines.withLock { $0 }.filter { $0.contains("passed through unread") }.count == 1, "logged once: \(lines.withLock { $0 })")
    }

    @Test("a proxy beyond loopback refuses requests carrying the owner token (query, percent-encoded, Authorization) with 403 and a body naming --allow-owner-token; other credentials pass; --allow-owner-token passes it")
    func proxyRefusesTheOwnerToken() async throws {
        var settings = ChaosProxy.Settings()
        // Listening beyond loopback is what refuses the token; a test keeps to loopback and asks
        // for the refusal outright (`refuseBeyondLoopback` is decided from the bound address, below).
        settings.ownerToken = .refuse
        let (node, proxy, port, dir) = try await Self.nodeBehindProxy("chaos-proxy-owner", settings: settings) { c in
            c.development.allowUnauthenticated = false
        }
        defer {
            proxy.stop()
            node.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        #expect(proxy.requestGateOptions.refuseOwnerToken)
        let nodePort = clientPort(node)
        // The node leads (the owner token straight to it, on loopback, is accepted).
        #expect(try await Self.firstWrite(nodePort, "/elected.json?ns=own&auth=owner", "1"))
        for (path, headers) in [
            ("/o.json?ns=own&auth=owner", ""), ("/o.json?access_token=owner&ns=own", ""), ("/o.json?ns=own&%61uth=ow%6Eer", ""),
            ("/o.json?ns=own&auth=x&auth=owner", ""), ("/o.json?ns=own", "Authorization: Bearer owner\r\n"), ("/o.json?ns=own", "Authorization: owner\r\n"),
            ("/o.json?ns=own", "authorization: bearer   owner \r\n"), ("http://127.0.0.1/o.json?ns=own&auth=owner#x", ""),
        ] {
            let connection = try RequestDeadlineTests.Raw(port: port)
            connection.send("PUT \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\(headers)Content-Length: 1\r\n\r\n1")
            let (text, closed) = connection.receive(until: "", seconds: 10)
            #expect(text.hasPrefix("HTTP/1.1 403") && text.contains("--allow-owner-token") && text.contains("refused_by_chaos_proxy") && closed, "\(path) \(headers): \(text)")
        }
        #expect(try httpExchange(port: nodePort, "GET", "/o.json?ns=own&auth=owner").body == "null", "nothing was written")
        // Other credentials pass to the node, which judges them (no rules, no unauthenticated
        // access: a stranger is refused by the node, not by the proxy).
        let stranger = try httpExchange(port: port, "PUT", "/o.json?ns=own&auth=someone", body: "1")
        #expect(stranger.status == 401 && !stranger.body.contains("refused_by_chaos_proxy"), "\(stranger)")
        #expect(proxy.stats.refusedRequests == 8)

        // --allow-owner-token: passed, and the node takes it (it is on loopback).
        var passing = ChaosProxy.Settings()
        passing.ownerToken = .pass
        let open = ChaosProxy(targetHost: "127.0.0.1", targetPort: clientPort(node), settings: passing) { _ in }
        defer { open.stop() }
        let openPort = try open.start(host: "127.0.0.1", port: 0)
        #expect(!open.requestGateOptions.refuseOwnerToken)
        #expect(try await Self.firstWrite(openPort, "/o.json?ns=own&auth=owner", "2"))
        // The default refuses only beyond loopback: decided from the address the proxy bound.
        let local = ChaosProxy(targetHost: "127.0.0.1", targetPort: clientPort(node), settings: ChaosProxy.Settings()) { _ in }
        defer { local.stop() }
        _ = try local.start(host: "127.0.0.1", port: 0)
        #expect(!local.requestGateOptions.refuseOwnerToken)
        #expect(ChaosProxy.isLoopback(try SocketAddress(ipAddress: "127.0.0.1", port: 1)))
        #expect(ChaosProxy.isLoopback(try SocketAddress(ipAddress: "::1", port: 1)))
        #expect(!ChaosProxy.isLoopback(try SocketAddress(ipAddress: "0.0.0.0", port: 1)))
        #expect(!ChaosProxy.isLoopback(try SocketAddress(ipAddress: "10.1.2.3", port: 1)))
        #expect(!ChaosProxy.isLoopback(try SocketAddress(ipAddress: "::", port: 1)))
    }

    /// Two single nodes under `dir`: one taking the emulator's owner token, one refusing it.
    static func ownerTokenNodes(_ dir: String) throws -> (accepting: BanyanNode, refusing: BanyanNode) {
        let accepting = try BanyanNode.start(config: Self.loopbackConfig(dir + "/a"), logger: Logger(label: "test"))
        var r = Self.loopbackConfig(dir + "/r")
        r.development.acceptOwnerToken = false
        do {
            return (accepting, try BanyanNode.start(config: r, logger: Logger(label: "test")))
        } catch {
            accepting.shutdown()
            throw error
        }
    }

    @Test("beyond loopback a proxy starts only in front of a node that refuses the owner token (a WebSocket's token is out of its sight): the probe gets 200 from a node taking it, 401 from one refusing it, nothing from no node; loopback and --allow-owner-token need no probe")
    func exposedProxyNeedsANodeRefusingTheOwnerToken() async throws {
        let dir = try temporaryDirectory("chaos-proxy-probe")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (accepting, refusing) = try Self.ownerTokenNodes(dir)
        defer { accepting.shutdown() }
        let refusingPort = clientPort(refusing)
        #expect(await ChaosProxy.ownerTokenProbe(host: "127.0.0.1", port: clientPort(accepting)) == 200)
        #expect(await ChaosProxy.ownerTokenProbe(host: "127.0.0.1", port: refusingPort) == 401)
        refusing.shutdown()
        #expect(await ChaosProxy.ownerTokenProbe(host: "127.0.0.1", port: refusingPort) == nil, "nothing listens there any more")

        let exposed = "0.0.0.0:9100"
        let taken = ChaosProxy.exposureRefusal(listen: exposed, listenIsLoopback: false, allowOwnerToken: false, to: "127.0.0.1:9000", probe: 200)
        #expect(taken?.contains("accepts the emulator's owner token") == true && taken?.contains("accept_owner_token: false") == true, "\(taken ?? "started")")
        let unknown = ChaosProxy.exposureRefusal(listen: exposed, listenIsLoopback: false, allowOwnerToken: false, to: "127.0.0.1:9000", probe: nil)
        #expect(unknown?.contains("cannot check") == true, "\(unknown ?? "started")")
        #expect(ChaosProxy.exposureRefusal(listen: exposed, listenIsLoopback: false, allowOwnerToken: false, to: "127.0.0.1:9000", probe: 401) == nil)
        #expect(ChaosProxy.exposureRefusal(listen: exposed, listenIsLoopback: false, allowOwnerToken: true, to: "127.0.0.1:9000", probe: 200) == nil)
        #expect(ChaosProxy.exposureRefusal(listen: "127.0.0.1:9100", listenIsLoopback: true, allowOwnerToken: false, to: "127.0.0.1:9000", probe: 200) == nil)
    }

    @Test("the gate: a first byte 0x16 is a TLS handshake, refused (a TLS alert) or, with passthrough, a tunnel from its first byte; 0x16 later is data; the owner token is found however it is spelled")
    func gateTLSAndOwner() {
        let hello: [UInt8] = [0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5]
        var refusing = ProxyRequestGate()
        let refused = refusing.client(hello)
        #expect(refused.count == 1 && refusing.isRefused && !refusing.isTLS)
        if case .refuseTLS(let reason)? = refused.first { #expect(reason.contains("--tls-passthrough")) } else { Issue.record("\(refused)") }
        var passing = ProxyRequestGate(options: .init(tlsPassthrough: true))
        #expect(passing.client(hello) == [.forward(hello)] && passing.isTLS && passing.isTunnel)
        #expect(passing.client(Array("GET /.banyan/faults HTTP/1.1\r\n\r\n".utf8)).count == 1, "unread")
        // Not the first byte: a body byte like any other.
        let body = [UInt8]([0x16, 0x16])
        var plain = ProxyRequestGate(options: .init(tlsPassthrough: true))
        let put = Array("PUT /a.json HTTP/1.1\r\nContent-Length: 2\r\n\r\n".utf8) + body
        #expect(plain.client(put) == [.forward(put)] && !plain.isTLS && !plain.isTunnel)

        for target in ["/a?auth=owner", "/a?x=1&access_token=owner", "/a?%61ccess%5Ftoken=%6f%77%6e%65%72", "/a?auth=owner#frag", "http://h:1/a?auth=owner"] {
            #expect(ProxyRequestGate.queryCarriesOwner(target), "\(target)")
        }
        for target in ["/a?auth=owners", "/a?auth=", "/a#?auth=owner", "/a?author=owner", "/auth=owner", "/a?auth=own+er"] {
            #expect(!ProxyRequestGate.queryCarriesOwner(target), "\(target)")
        }
        for value in ["Bearer owner", "owner", "bearer owner", "BEARER\towner", "Bearer   owner"] { #expect(ProxyRequestGate.isOwnerCredential(value), "\(value)") }
        for value in ["Bearer owner2", "Basic owner", "Bearer", "ownerx"] { #expect(!ProxyRequestGate.isOwnerCredential(value), "\(value)") }
        // Only with the option: a loopback proxy passes the token to the node.
        let request = Array("GET /a.json?auth=owner HTTP/1.1\r\nAuthorization: Bearer owner\r\n\r\n".utf8)
        var loopback = ProxyRequestGate()
        #expect(loopback.client(request) == [.forward(request)])
        var exposed = ProxyRequestGate(options: .init(refuseOwnerToken: true))
        #expect(Self.refusal(exposed.client(request)) == 403)
    }

    @Test("banyan chaos proxy refuses --tls-passthrough beyond loopback without --allow-owner-token (before listening)")
    func proxyCommandRefusesExposedTLSPassthrough() async throws {
        let dir = try temporaryDirectory("chaos-proxy-flags")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let refused = try await Task.detached {
            try RotationAndRollTests.run(["chaos", "proxy", "--listen", "0.0.0.0:\(testPort(30740))", "--listen-anywhere", "--tls-passthrough", "--seconds", "1"], seconds: 30)
        }.value
        #expect(refused.status != 0 && refused.output.contains("--allow-owner-token"), "\(refused.output)")
        #expect(!refused.output.contains("proxy: 0.0.0.0"), "it never listened: \(refused.output)")
    }

    /// This machine's first non-loopback IPv4 address that is up (nil: none).
    static func nonLoopbackIPv4() -> String? {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return nil }
        defer { freeifaddrs(list) }
        var at: UnsafeMutablePointer<ifaddrs>? = first
        while let entry = at {
            defer { at = entry.pointee.ifa_next }
            guard let addr = entry.pointee.ifa_addr, addr.pointee.sa_family == sa_family_t(AF_INET),
                entry.pointee.ifa_flags & UInt32(IFF_UP) != 0, entry.pointee.ifa_flags & UInt32(IFF_LOOPBACK) == 0
            else { continue }
            var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
            guard getnameinfo(addr, socklen_t(MemoryLayout<sockaddr_in>.size), &host, socklen_t(host.count), nil, 0, NI_NUMERICHOST) == 0 else { continue }
            return String(decoding: host.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        return nil
    }

    /// A port free on every address now (bound to 0.0.0.0:0 and closed).
    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = 0
        addr.sin_addr.s_addr = INADDR_ANY
        let bound = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard bound == 0 else { throw HTTPClientError("cannot bind a probe socket: errno \(errno)") }
        var out = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &out) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        return Int(UInt16(bigEndian: out.sin_port))
    }

    /// One request to `host:port` over a raw socket: the status line's code (nil: no answer).
    static func statusOf(host: String, port: Int, _ request: String) -> Int? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr(host)
        var tv = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        let ok = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard ok == 0 else { return nil }
        let bytes = Array(request.utf8)
        guard bytes.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == bytes.count else { return nil }
        var buffer = [UInt8](repeating: 0, count: 512)
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        guard n > 12 else { return nil }
        let line = String(decoding: buffer[0..<n], as: UTF8.self)
        return Int(line.split(separator: " ").dropFirst().first ?? "")
    }

    @Test("the real command bound beyond loopback (0.0.0.0, reached on this machine's own non-loopback address): in front of a node that takes the owner token it refuses to start, before listening; in front of one that refuses it, it starts and answers a request carrying the token with 403 itself, passing others to the node")
    func exposedProxyEndToEnd() async throws {
        let dir = try temporaryDirectory("chaos-proxy-exposed")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (accepting, refusing) = try Self.ownerTokenNodes(dir)
        defer {
            accepting.shutdown()
            refusing.shutdown()
        }
        #expect(try await Self.firstWrite(clientPort(refusing), "/x.json", "1"))
        #expect(try await Self.firstWrite(clientPort(accepting), "/x.json?auth=owner", "1"))

        let port = try Self.freePort()
        let refused = try await Task.detached {
            try RotationAndRollTests.run(
                ["chaos", "proxy", "--listen", "0.0.0.0:\(port)", "--listen-anywhere", "--to", "127.0.0.1:\(clientPort(accepting))", "--seconds", "5"], seconds: 60)
        }.value
        #expect(refused.status != 0 && refused.output.contains("accepts the emulator's owner token"), "\(refused.output)")
        #expect(!refused.output.contains("proxy: 0.0.0.0"), "it never listened: \(refused.output)")

        // In front of the refusing node: started, and reachable on the machine's own address.
        let host = Self.nonLoopbackIPv4() ?? "127.0.0.1"
        let output = dir + "/proxy.out"
        let pid = try ChildProcess.spawn(
            try RotationAndRollTests.banyan(),
            ["chaos", "proxy", "--listen", "0.0.0.0:\(port)", "--listen-anywhere", "--to", "127.0.0.1:\(clientPort(refusing))", "--seconds", "60"],
            environment: ProcessInfo.processInfo.environment, outputFile: output)
        let plain = await Task.detached { () -> Int? in
            let deadline = Date().addingTimeInterval(30)
            while Date() < deadline {
                if let code = Self.statusOf(host: host, port: port, "GET /x.json HTTP/1.1\r\nHost: \(host)\r\nConnection: close\r\n\r\n") { return code }
                usleep(100_000)
            }
            return nil
        }.value
        let owner = await Task.detached {
            Self.statusOf(host: host, port: port, "GET /x.json?auth=owner HTTP/1.1\r\nHost: \(host)\r\nConnection: close\r\n\r\n")
        }.value
        kill(pid, SIGTERM)
        let ending = await Task.detached { ChildProcess.wait(pid, seconds: 30) }.value
        let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        print("exposed proxy on \(host):\(port): a plain read \(plain.map(String.init) ?? "unanswered"), with the owner token \(owner.map(String.init) ?? "unanswered"); \(ending)")
        #expect(text.contains("proxy: 0.0.0.0:\(port)") && text.contains("owner token refused"), "\(text)")
        #expect(plain == 200, "the node answered through the proxy")
        #expect(owner == 403, "the proxy refused the owner token")
    }
}
