public import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// `banyan bench --realtime`: WebSocket protocol v5 sessions on a 3-node loopback cluster
/// (docs/benchmarks.md, issue 15): memory per idle session, server CPU per write with every
/// session's listen open, write-to-last-listener latency with many listeners on one path, and
/// event deliveries per second.
public struct RealtimeBench: Sendable {
    public var executable: String
    public var directory: String
    public var sessions = 10_000
    public var fanOut = 1_000
    public var fanWrites = 200
    public var seconds: Double = 5
    public var deliveryRates: [Int] = [10, 20, 40]
    /// Connections writing the hot path in the deliveries phase, together: each waits for its
    /// own answers, so one writer offers at most one write per round trip, which a loaded node
    /// stretches; several offer the rate asked for.
    public var deliveryWriters = 1
    /// Idle event streams (REST SSE) opened for the CPU-per-write figure with streams.
    public var idleStreams = 9_000
    public var portBase = 19_800

    public init(executable: String, directory: String) {
        self.executable = executable
        self.directory = directory
    }

    struct Failure: Error, CustomStringConvertible { var description: String }

    public func run(log: @escaping @Sendable (String) -> Void) async throws {
        try? FileManager.default.removeItem(atPath: directory)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        // Every session comes from 127.0.0.1: the per-client caps must allow them all.
        let config = directory + "/realtime-bench.yaml"
        let cap = (sessions + idleStreams) * 2 + 1_000
        try "http:\n  max_connections: \(cap)\n  max_connections_per_client: \(cap)\n  max_streams_per_client: \(cap)\n"
            .write(toFile: config, atomically: true, encoding: .utf8)
        let cluster = LocalCluster(
            executable: executable, directory: directory + "/cluster", nodes: 3, clientPortBase: portBase, peerPortBase: portBase + 100,
            logLevel: "warning")
        cluster.extraArguments = ["--config", config]
        defer { cluster.shutdown() }
        for id: UInt64 in [1, 2, 3] { try cluster.start(id) }
        let leader = try await cluster.waitForLeader(timeout: 30)
        for id in cluster.ids where !cluster.isRunning(id) {
            throw Failure(description: "node \(id) exited right after starting (ports in use?); see \(directory)/cluster/node\(id).log")
        }
        log("3-node cluster up (leader: node \(leader)); \(ProcessInfo.processInfo.activeProcessorCount) cores; \(raiseOpenFileLimit()) files per process")
        let pids = cluster.ids.compactMap(cluster.pid)
        var writer = ClusterBench(executable: executable, directory: directory)
        writer.seconds = seconds

        // CPU per write before any session (the baseline the next figure compares with).
        let baseline = try await cpuPerWrite(cluster, writer, pids)
        log(String(format: "server CPU per write, no sessions: %.1f µs (%d writes/s, 16 HTTP clients)", baseline.micros, baseline.rate))

        // Sessions, each with its own idle listen.
        try await Task.sleep(nanoseconds: 1_000_000_000)
        let rssBefore = pids.map(ClusterBench.residentMiB)
        let counters = RealtimeCounters()
        let started = Date()
        var clients: [BenchSocket] = []
        clients.reserveCapacity(sessions)
        let batch = 250
        var opened = 0
        while opened < sessions {
            let upper = min(sessions, opened + batch)
            let group = try await withThrowingTaskGroup(of: BenchSocket.self) { tasks in
                for i in opened..<upper {
                    let node = cluster.ids[i % cluster.ids.count]
                    tasks.addTask {
                        try await BenchSocket.open(port: cluster.clientPort(node), group: cluster.group, counters: counters, index: i)
                    }
                }
                var out: [BenchSocket] = []
                for try await s in tasks { out.append(s) }
                return out
            }
            for s in group { s.send(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/idle/s\#(s.index)","h":""}}}"#) }
            clients += group
            opened = upper
            try await waitUntil(seconds: 60, "listens acknowledged") { counters.listening.load(ordering: .relaxed) >= opened }
        }
        log(String(format: "%d sessions open, each with a listen, in %.1f s", sessions, Date().timeIntervalSince(started)))
        try await Task.sleep(nanoseconds: 2_000_000_000)
        let rssAfter = pids.map(ClusterBench.residentMiB)
        let perSession = (zip(rssAfter, rssBefore).map { $0 - $1 }.reduce(0, +)) * 1024 / Double(sessions)
        log(
            String(format: "memory per idle session (resident growth of the 3 nodes / sessions): %.1f KiB; nodes ", perSession)
                + rssAfter.map { String(format: "%.0f MiB", $0) }.joined(separator: ", "))

        // CPU per write with every session's listen open (on unrelated paths).
        let loaded = try await cpuPerWrite(cluster, writer, pids)
        log(
            String(
                format: "server CPU per write with %d idle listens: %.1f µs (%d writes/s; %.1f µs without sessions)", sessions, loaded.micros, loaded.rate,
                baseline.micros))

        // The same with idle event streams (REST SSE, on unrelated paths) instead: they live in
        // the same listen core, so a write costs what it touches, not what is open.
        if idleStreams > 0 {
            try await Task.sleep(nanoseconds: 1_000_000_000)
            let streamsStarted = Date()
            var streams: [BenchStream] = []
            streams.reserveCapacity(idleStreams)
            var openedStreams = 0
            while openedStreams < idleStreams {
                let upper = min(idleStreams, openedStreams + batch)
                let group = try await withThrowingTaskGroup(of: BenchStream.self) { tasks in
                    for i in openedStreams..<upper {
                        let node = cluster.ids[i % cluster.ids.count]
                        tasks.addTask { try await BenchStream.open(port: cluster.clientPort(node), group: cluster.group, path: "/idle-sse/s\(i)") }
                    }
                    var out: [BenchStream] = []
                    for try await s in tasks { out.append(s) }
                    return out
                }
                streams += group
                openedStreams = upper
            }
            log(String(format: "%d idle event streams open (first event received) in %.1f s", idleStreams, Date().timeIntervalSince(streamsStarted)))
            let withStreams = try await cpuPerWrite(cluster, writer, pids)
            log(
                String(
                    format: "server CPU per write with %d idle listens and %d idle event streams: %.1f µs (%d writes/s; %.1f µs without either)",
                    sessions, idleStreams, withStreams.micros, withStreams.rate, baseline.micros))
            for s in streams { s.close() }
        }

        // Fan-out: `fanOut` sessions listen on one path; each write's latency is until the last
        // of them has it.
        let fans = Array(clients.prefix(fanOut))
        let before = counters.listening.load(ordering: .relaxed)
        for s in fans { s.send(#"{"t":"d","d":{"r":2,"a":"q","b":{"p":"/fan","h":""}}}"#) }
        try await waitUntil(seconds: 60, "fan listens acknowledged") { counters.listening.load(ordering: .relaxed) >= before + fans.count }
        counters.expectFan(listeners: fans.count)
        let conn = try await HTTPConnection.connect(host: "127.0.0.1", port: cluster.clientPort(leader), group: cluster.group)
        for i in 1...fanWrites {
            counters.sent(i)
            let r = try await conn.send(.PUT, "/fan.json?ns=default&print=silent", body: Array("\(i)".utf8), timeout: .seconds(10))
            guard r.status == 204 else { throw Failure(description: "fan-out write: \(r.status) \(r.text)") }
            try await Task.sleep(nanoseconds: 20_000_000)
        }
        try await waitUntil(seconds: 30, "every fan-out write at every listener") { counters.fanComplete() >= fanWrites }
        let latencies = counters.fanLatencies().sorted()
        log(
            "write → last of \(fans.count) listeners notified (\(fanWrites) writes, 50/s): p50 \(ClusterBench.ms(ClusterBench.percentile(latencies, 0.5))), "
                + "p99 \(ClusterBench.ms(ClusterBench.percentile(latencies, 0.99))), max \(ClusterBench.ms(latencies.last ?? 0))")

        // Deliveries: every session listens on one hot path; writes at a steady rate.
        let before2 = counters.listening.load(ordering: .relaxed)
        for s in clients { s.send(#"{"t":"d","d":{"r":3,"a":"q","b":{"p":"/hot","h":""}}}"#) }
        try await waitUntil(seconds: 60, "hot listens acknowledged") { counters.listening.load(ordering: .relaxed) >= before2 + clients.count }
        let generator = getpid()
        var hotWriters = [conn]
        for _ in 1..<max(deliveryWriters, 1) {
            hotWriters.append(try await HTTPConnection.connect(host: "127.0.0.1", port: cluster.clientPort(leader), group: cluster.group))
        }
        for rate in deliveryRates {
            try await Task.sleep(nanoseconds: 1_000_000_000)
            let cpuBefore = pids.map(ClusterBench.cpuSeconds)
            let generatorBefore = ClusterBench.cpuSeconds(generator)
            let framesBefore = counters.deliveries()
            let t0 = Date()
            // Each writer takes every `writers`-th slot of the schedule.
            let interval = 1.0 / Double(rate)
            let writers = hotWriters.count
            let duration = seconds
            let n = try await withThrowingTaskGroup(of: Int.self) { tasks in
                for (w, writer) in hotWriters.enumerated() {
                    tasks.addTask {
                        var sent = 0
                        var slot = w
                        while Double(slot) * interval < duration, Date().timeIntervalSince(t0) < duration {
                            let next = t0.addingTimeInterval(Double(slot) * interval)
                            let wait = next.timeIntervalSinceNow
                            if wait > 0 { try await Task.sleep(nanoseconds: UInt64(wait * 1e9)) }
                            slot += writers
                            sent += 1
                            _ = try await writer.send(.PUT, "/hot.json?ns=default&print=silent", body: Array("\(slot)".utf8), timeout: .seconds(10))
                        }
                        return sent
                    }
                }
                return try await tasks.reduce(0, +)
            }
            let writing = Date().timeIntervalSince(t0)
            let expected = n * clients.count
            // Let the last writes arrive (bounded), then count.
            let drainStart = Date()
            while counters.deliveries().reduce(0, +) - framesBefore.reduce(0, +) < expected, Date().timeIntervalSince(drainStart) < 20 {
                try await Task.sleep(nanoseconds: 50_000_000)
            }
            let elapsed = Date().timeIntervalSince(t0)
            let perNode = zip(counters.deliveries(), framesBefore).map { $0 - $1 }
            let got = perNode.reduce(0, +)
            let cpu = zip(pids.map(ClusterBench.cpuSeconds), cpuBefore).map { $0 - $1 }
            let generatorCPU = ClusterBench.cpuSeconds(generator) - generatorBefore
            log(
                String(
                    format: "deliveries at %d writes/s (%d sent in %.1f s) to %d listeners: %d of %d in %.1f s = %.0f per second per node; closed sessions %d",
                    rate, n, writing, clients.count, got, expected, elapsed, Double(got) / elapsed / 3, counters.closed.load(ordering: .relaxed)))
            // The server's capacity, apart from the offered rate and the load generator (which
            // shares the cores): each node's deliveries over its own CPU time.
            let capacity = zip(perNode, cpu).map { Double($0) / max($1, 0.001) }
            let perDelivery = zip(perNode, cpu).map { String(format: "%.2f", $1 / Double(max($0, 1)) * 1e6) }.joined(separator: " / ")
            log(
                String(format: "  server CPU %.2f µs per delivery (", cpu.reduce(0, +) / Double(max(got, 1)) * 1e6) + perDelivery + " per node) = "
                    + capacity.map { String(format: "%.0f", $0) }.joined(separator: " / ")
                    + String(format: " deliveries per CPU-second per node; CPU used: nodes %.2f s, load generator %.2f s, in %.1f s", cpu.reduce(0, +), generatorCPU, elapsed))
        }
        for writer in hotWriters { writer.close() }
        for s in clients { s.close() }
    }

    struct CPUFigure {
        var micros: Double
        var rate: Int
    }

    func cpuPerWrite(_ cluster: LocalCluster, _ writer: ClusterBench, _ pids: [Int32]) async throws -> CPUFigure {
        let before = pids.map(ClusterBench.cpuSeconds).reduce(0, +)
        let result = try await writer.writeLoad(cluster, clients: 16)
        let after = pids.map(ClusterBench.cpuSeconds).reduce(0, +)
        let micros = result.writes > 0 ? (after - before) / Double(result.writes) * 1e6 : 0
        return CPUFigure(micros: micros, rate: Int(Double(result.writes) / max(result.seconds, 0.001)))
    }

    func waitUntil(seconds: Double, _ what: String, _ condition: () -> Bool) async throws {
        let deadline = Date().addingTimeInterval(seconds)
        while !condition() {
            if Date() > deadline { throw Failure(description: "timed out waiting for \(what)") }
            try await Task.sleep(nanoseconds: 20_000_000)
        }
    }
}

/// What the benchmark's sockets saw, across event loops.
final class RealtimeCounters: Sendable {
    let listening = Atomic<Int>(0)
    /// Pushes received, by the node the session is on (sessions go round-robin: index % 3).
    let frames0 = Atomic<Int>(0)
    let frames1 = Atomic<Int>(0)
    let frames2 = Atomic<Int>(0)
    let closed = Atomic<Int>(0)
    private struct Fan {
        var listeners = 0
        var sentAt: [Int: UInt64] = [:]
        var arrivals: [Int: (count: Int, last: UInt64)] = [:]
    }
    private let fan = Mutex(Fan())

    func delivered(session index: Int) {
        switch index % 3 {
        case 0: frames0.wrappingAdd(1, ordering: .relaxed)
        case 1: frames1.wrappingAdd(1, ordering: .relaxed)
        default: frames2.wrappingAdd(1, ordering: .relaxed)
        }
    }

    /// Pushes received so far, per node (in the order of the cluster's ids).
    func deliveries() -> [Int] {
        [frames0.load(ordering: .relaxed), frames1.load(ordering: .relaxed), frames2.load(ordering: .relaxed)]
    }

    func expectFan(listeners: Int) { fan.withLock { $0.listeners = listeners } }
    func sent(_ i: Int) {
        let now = DispatchTime.now().uptimeNanoseconds
        fan.withLock { $0.sentAt[i] = now }
    }
    func arrived(_ i: Int) {
        let now = DispatchTime.now().uptimeNanoseconds
        fan.withLock { f in
            guard f.sentAt[i] != nil else { return }
            let old = f.arrivals[i] ?? (0, 0)
            f.arrivals[i] = (old.count + 1, max(old.last, now))
        }
    }
    func fanComplete() -> Int { fan.withLock { f in f.arrivals.values.filter { $0.count >= f.listeners }.count } }
    func fanLatencies() -> [Double] {
        fan.withLock { f in
            f.arrivals.compactMap { i, a in
                guard a.count >= f.listeners, let sent = f.sentAt[i] else { return nil }
                return Double(a.last &- sent) / 1e9
            }
        }
    }
}

/// Connects a benchmark client to a node on loopback with `handler` as its pipeline, and waits
/// until the handler says it is ready (its first answer arrived).
func benchConnect(port: Int, loop: any EventLoop, handler: some ChannelHandler & Sendable, ready: EventLoopPromise<Void>) async throws -> any Channel {
    let channel = try await ClientBootstrap(group: loop)
        .connectTimeout(.seconds(10))
        .channelOption(.socketOption(.tcp_nodelay), value: 1)
        .channelInitializer { channel in channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(handler) } }
        .connect(host: "127.0.0.1", port: port).get()
    try await ready.futureResult.get()
    return channel
}

/// One idle event stream: `GET <path>.json` with `Accept: text/event-stream`, open once its
/// first event (the `put` of the whole value) arrived.
final class BenchStream: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    private let path: String
    private let ready: EventLoopPromise<Void>
    private var channel: (any Channel)?
    private var seen: [UInt8] = []

    init(path: String, ready: EventLoopPromise<Void>) {
        self.path = path
        self.ready = ready
    }

    static func open(port: Int, group: any EventLoopGroup, path: String) async throws -> BenchStream {
        let loop = group.next()
        let ready = loop.makePromise(of: Void.self)
        let stream = BenchStream(path: path, ready: ready)
        stream.channel = try await benchConnect(port: port, loop: loop, handler: stream, ready: ready)
        return stream
    }

    func channelActive(context: ChannelHandlerContext) {
        var b = context.channel.allocator.buffer(capacity: 160)
        b.writeString("GET \(path).json?ns=default HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
        context.writeAndFlush(NIOAny(b), promise: nil)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard seen.count < 4096 else { return }
        let buffer = unwrapInboundIn(data)
        seen += buffer.readableBytesView.prefix(4096 - seen.count)
        if String(decoding: seen, as: UTF8.self).contains("event: put") { ready.succeed(()) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        ready.fail(RealtimeBench.Failure(description: "an event stream closed before its first event"))
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        ready.fail(error)
        context.close(promise: nil)
    }

    func close() { channel?.close(promise: nil) }
}

/// A minimal WebSocket client for the benchmark: the upgrade request, masked text frames out,
/// server frames parsed just enough to count them and read fan-out values. Confined to its
/// channel's event loop except `send`/`close`, which hop there.
final class BenchSocket: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let index: Int
    private let counters: RealtimeCounters
    private var channel: (any Channel)?
    private var upgraded = false
    private var pending: ByteBuffer?
    private let ready: EventLoopPromise<Void>

    init(index: Int, counters: RealtimeCounters, ready: EventLoopPromise<Void>) {
        self.index = index
        self.counters = counters
        self.ready = ready
    }

    static func open(port: Int, group: any EventLoopGroup, counters: RealtimeCounters, index: Int) async throws -> BenchSocket {
        let loop = group.next()
        let ready = loop.makePromise(of: Void.self)
        let socket = BenchSocket(index: index, counters: counters, ready: ready)
        socket.channel = try await benchConnect(port: port, loop: loop, handler: socket, ready: ready)
        return socket
    }

    func channelActive(context: ChannelHandlerContext) {
        var b = context.channel.allocator.buffer(capacity: 200)
        b.writeString(
            "GET /.ws?v=5&ns=default HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                + "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        context.writeAndFlush(wrapOutboundOut(b), promise: nil)
        context.fireChannelActive()
    }

    func send(_ text: String) {
        guard let channel else { return }
        let bytes = Array(text.utf8)
        var b = channel.allocator.buffer(capacity: bytes.count + 14)
        b.writeInteger(UInt8(0x81))
        if bytes.count < 126 {
            b.writeInteger(UInt8(0x80 | bytes.count))
        } else {
            b.writeInteger(UInt8(0x80 | 126))
            b.writeInteger(UInt16(bytes.count))
        }
        // Mask key zero: the payload goes as it is (RFC 6455 only requires a mask be present).
        b.writeInteger(UInt32(0))
        b.writeBytes(bytes)
        channel.writeAndFlush(b, promise: nil)
    }

    func close() { channel?.close(promise: nil) }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var incoming = unwrapInboundIn(data)
        if pending == nil { pending = incoming } else { pending?.writeBuffer(&incoming) }
        guard var buffer = pending else { return }
        if !upgraded {
            let view = buffer.readableBytesView
            guard let end = view.firstRange(of: [13, 10, 13, 10]) else { return }
            buffer.moveReaderIndex(forwardBy: end.upperBound - view.startIndex)
            upgraded = true
            ready.succeed(())
        }
        // Frames: FIN/opcode byte, length (7, 16 or 64 bits), unmasked payload.
        while buffer.readableBytes >= 2 {
            let view = buffer.readableBytesView
            let start = view.startIndex
            var length = Int(view[start + 1] & 0x7F)
            var header = 2
            if length == 126 {
                guard view.count >= 4 else { break }
                length = Int(view[start + 2]) << 8 | Int(view[start + 3])
                header = 4
            } else if length == 127 {
                guard view.count >= 10 else { break }
                length = (2..<10).reduce(0) { $0 << 8 | Int(view[start + $1]) }
                header = 10
            }
            guard view.count >= header + length else { break }
            if view[start] & 0x0F == 1 { handle(view[(start + header)..<(start + header + length)]) }
            buffer.moveReaderIndex(forwardBy: header + length)
        }
        pending = buffer.readableBytes > 0 ? buffer : nil
    }

    /// Counts pushes; a listen's `ok` counts as listening; a fan-out value is recorded. Reads
    /// the payload in place (no copy per frame: the generator shares the cores with the nodes).
    private func handle(_ payload: ByteBufferView.SubSequence) {
        // Answers: {"t":"d","d":{"r":N,"b":{"s":"ok",...}}} (only listens are sent, so every
        // ok is a listen's); pushes: {"t":"d","d":{"a":"d","b":{"p":...,"d":V}}}; control
        // messages (the hello) start {"t":"c".
        let start = payload.startIndex
        guard payload.count > 18, payload[start + 6] == UInt8(ascii: "d") else { return }
        if payload.starts(with: Self.answerPrefix) {
            if payload.firstRange(of: Self.ok) != nil { counters.listening.wrappingAdd(1, ordering: .relaxed) }
            return
        }
        counters.delivered(session: index)
        // A fan-out push: {"t":"d","d":{"a":"d","b":{"p":"fan","d":V}}}.
        let at = start + Self.fanOffset
        guard payload.count > Self.fanOffset + Self.fanValue.count, payload[at..<(at + Self.fanValue.count)].elementsEqual(Self.fanValue) else { return }
        var value = 0
        var k = at + Self.fanValue.count
        while k < payload.endIndex, payload[k] >= 48, payload[k] <= 57 {
            value = value * 10 + Int(payload[k] - 48)
            k += 1
        }
        if value > 0 { counters.arrived(value) }
    }

    static let fanOffset = #"{"t":"d","d":{"a":"d","b":{"#.utf8.count
    static let answerPrefix = Array(#"{"t":"d","d":{"r":"#.utf8)
    static let ok = Array(#""s":"ok""#.utf8)
    static let fanValue = Array(#""p":"fan","d":"#.utf8)

    func channelInactive(context: ChannelHandlerContext) {
        counters.closed.wrappingAdd(1, ordering: .relaxed)
        if !upgraded { ready.fail(ChannelError.ioOnClosedChannel) }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
