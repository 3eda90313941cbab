public import Foundation
public import NIOHTTP1
import NIOCore
import NIOPosix

/// Clients that send large write bodies to a cluster one after another until a deadline (the
/// `hostile` cluster scenario's 15 MiB writes and body-limit updates): each keeps one keep-alive
/// connection to its node (a new one after a failure) and sends the bodies in turn. Their
/// connections run on an event loop group of their own, so that pushing 16 MiB bodies does not
/// delay the cluster's other clients (the workload measured beside them).
public struct BulkWriters: Sendable {
    /// What the clients saw: answers by status ("no answer" for a failure or timeout), the
    /// slowest and the total time of the requests, and the body bytes sent.
    public struct Tally: Sendable {
        public var statuses: [String: Int] = [:]
        public var slowest = 0.0
        public var seconds = 0.0
        public var bytes = 0
        public var requests: Int { statuses.values.reduce(0, +) }

        mutating func add(_ other: Tally) {
            statuses.merge(other.statuses, uniquingKeysWith: +)
            slowest = max(slowest, other.slowest)
            seconds += other.seconds
            bytes += other.bytes
        }
    }

    public var method: HTTPMethod
    /// The bodies each client sends in turn.
    public var bodies: [[UInt8]]
    /// Seconds one request may take.
    public var timeout: Int64 = 60

    public init(method: HTTPMethod, bodies: [[UInt8]]) {
        self.method = method
        self.bodies = bodies
    }

    /// Runs `clients` clients until `deadline` (a request under way then is finished); client
    /// `c` writes to `uri(c)` through node `c % 3 + 1` of `cluster`.
    public func run(_ cluster: LocalCluster, clients: Int, until deadline: Date, uri: @escaping @Sendable (Int) -> String) async -> Tally {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let total = await withTaskGroup(of: Tally.self) { writers in
            for c in 0..<clients {
                writers.addTask { await client(c, cluster.clientPort(UInt64(c % 3 + 1)), group: group, until: deadline, uri: uri(c)) }
            }
            return await writers.reduce(into: Tally()) { $0.add($1) }
        }
        try? await group.shutdownGracefully()
        return total
    }

    private func client(_ c: Int, _ port: Int, group: MultiThreadedEventLoopGroup, until deadline: Date, uri: String) async -> Tally {
        var tally = Tally()
        var connection: HTTPConnection?
        var n = 0
        while Date() < deadline {
            let started = Date()
            let body = bodies[n % bodies.count]
            n += 1
            var outcome = "no answer"
            do {
                let open: HTTPConnection
                if let connection, connection.isOpen {
                    open = connection
                } else {
                    open = try await HTTPConnection.connect(host: "127.0.0.1", port: port, group: group)
                }
                connection = open
                tally.bytes += body.count
                outcome = "\(try await open.send(method, uri, body: body, timeout: .seconds(timeout)).status)"
            } catch {
                connection?.close()
                connection = nil
                try? await Task.sleep(nanoseconds: 200_000_000)
            }
            let took = Date().timeIntervalSince(started)
            tally.statuses[outcome, default: 0] += 1
            tally.slowest = max(tally.slowest, took)
            tally.seconds += took
        }
        connection?.close()
        return tally
    }
}
