import BanyanOpLogFiles
import BanyanRaft
import BanyanREST
import BanyanReplica
import Foundation
import NIOCore
import NIOHTTP1

/// Operator endpoints under `/.banyan/` (docs/operations.md):
///
/// | request | what it does |
/// | --- | --- |
/// | `GET /.banyan/status` | role, term, leader, commit/applied index, members, replication progress (JSON) |
/// | `GET /.banyan/health` | 200 while the process serves requests |
/// | `GET /.banyan/ready` | 200 when a leader is known and this node has applied what it knows to be committed; else 503 |
/// | `POST /.banyan/members` `{"id": 4, "peer_address": "host:port"}` | adds a learner (leader only), promoted once caught up |
/// | `POST /.banyan/members/<id>/promote` | promotes a learner now (leader only) |
/// | `DELETE /.banyan/members/<id>` | removes a member, the leader included (leader only) |
/// | `POST /.banyan/transfer?to=<id>` | hands leadership to another voter (leader only) |
/// | `POST /.banyan/drain` `{"to": ["host:port", …]}` (optional) | moves this node's realtime clients to other nodes (docs/realtime.md, "Draining a node") |
/// | `DELETE /.banyan/drain` | stops draining |
/// | `GET /.banyan/drain` | whether the node drains, and its realtime connections |
/// | `GET /.banyan/backup` | an online, consistent backup, streamed (administrators; docs/backup.md) |
/// | `GET /.banyan/log?from=<index>&max_bytes=<n>` | committed log entries for archiving (administrators; 410 once compacted) |
/// | `GET /.banyan/tls` | the certificates in force (node, trusted CAs, client port), their expiry, reloads |
/// | `POST /.banyan/tls/reload` | reloads certificates, keys and trust bundle from their files; 422 with `{"error", "code", "file"}` when refused (the old material stays) |
/// | `GET /.banyan/faults` | the faults in force (nodes started with `--allow-fault-injection`; docs/chaos.md) |
/// | `POST /.banyan/faults` `{"drop_peers": [3], "peer_delay_ms": 200, "disk_delay_ms": 50}` | sets the faults named (others stay) |
/// | `DELETE /.banyan/faults` | clears every fault |
///
/// Leader-only requests sent to a follower get 409 with `{"error": …, "leader": id}`.
struct AdminAPI {
    let server: HTTPServer
    /// The most payload one `GET /.banyan/log` answer carries.
    static let maxLogBytes = 16 << 20

    func handle(_ route: Route.AdminRoute, method: HTTPMethod, path: String, body: [UInt8]) -> EventLoopFuture<HTTPReply> {
        let runtime = server.runtime
        switch route {
        case .status:
            let server = self.server
            return runtime.status().map { base in
                var status = base
                status.realtimeConnections = server.realtimeConnections
                status.draining = server.isDraining
                status.tls = server.tls?.status()
                return Self.encoded(.ok, status)
            }
        case .health:
            return runtime.loop.makeSucceededFuture(.json(.ok, #"{"status":"ok"}"#))
        case .ready:
            // A stopping node is not ready either: a load balancer moves away before it closes.
            let draining = server.isDraining || server.isStopping
            return runtime.status().map { s in
                let ready = s.leader != 0 && s.appliedIndex >= s.commitIndex && !draining
                return .json(
                    ready ? .ok : .serviceUnavailable, #"{"ready":\#(ready),"leader":\#(s.leader),"role":"\#(s.role)","draining":\#(draining)}"#)
            }
        case .startDrain:
            var targets: [String]?
            if !body.isEmpty {
                guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
                    let list = object["to"] as? [String], !list.isEmpty, list.count <= 64,
                    list.allSatisfy({ (try? HostPort(parsing: $0)) != nil })
                else {
                    return runtime.loop.makeSucceededFuture(.error(.badRequest, #"expected {"to": ["host:port", …]} (1 to 64 addresses) or no body"#))
                }
                targets = list
            }
            return server.startDrain(to: targets)
        case .stopDrain:
            server.stopDrain()
            return runtime.loop.makeSucceededFuture(.json(.ok, #"{"draining":false}"#))
        case .drainState:
            return runtime.loop.makeSucceededFuture(
                .json(.ok, #"{"draining":\#(server.isDraining),"connections":\#(server.realtimeConnections)}"#))
        case .addMember:
            guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
                let id = (object["id"] as? NSNumber)?.uint64Value, id != 0,
                let addressText = object["peer_address"] as? String, let address = try? HostPort(parsing: addressText)
            else {
                return runtime.loop.makeSucceededFuture(.error(.badRequest, #"expected {"id": <node id>, "peer_address": "host:port"}"#))
            }
            return membership(runtime.addMember(id: id, peerAddress: address))
        case .promote(let id):
            return membership(runtime.changeMembership(.promote(id)))
        case .removeMember(let id):
            return membership(runtime.changeMembership(.remove(id)))
        case .transfer(let to):
            guard let to else { return runtime.loop.makeSucceededFuture(.error(.badRequest, "expected ?to=<node id>")) }
            return runtime.transferLeadership(to: to).map { result in
                switch result {
                case .success: return .json(.ok, #"{"status":"transferring","to":\#(to)}"#)
                case .failure(let e): return Self.failure(e)
                }
            }
        case .backup:
            // Streamed by the connection handler (`startBackup`), never answered here.
            return runtime.loop.makeSucceededFuture(.error(.internalServerError, "backups are streamed by the connection"))
        case .log(let from, let maxBytes):
            guard let from, from > 0 else {
                return runtime.loop.makeSucceededFuture(.error(.badRequest, "give from=<index> (a log index, 1 or more)"))
            }
            guard let maxBytes, maxBytes > 0 else {
                return runtime.loop.makeSucceededFuture(.error(.badRequest, "max_bytes must be a positive number of bytes"))
            }
            return runtime.committedEntries(from: from, maxBytes: min(maxBytes, Self.maxLogBytes)).map { answer in
                switch answer {
                case .compacted(let first, let previousTerm):
                    // `previous_term` is the term of entry `first_index - 1`: an archiver
                    // holding that entry with that term continues from `first_index`.
                    return .json(
                        .gone,
                        #"{"error":"entries before \#(first) were compacted into this node's snapshot","first_index":\#(first),"previous_index":\#(first - 1),"previous_term":\#(previousTerm)}"#)
                case .unavailable(let missing):
                    // Storage damage (retained entries keep their files): the archive cannot go on from this node.
                    return .error(.internalServerError, "\(missing); take a new backup")
                case .entries(let entries, let commit):
                    var body: [UInt8] = []
                    for e in entries { e.append(to: &body) }
                    return HTTPReply(
                        status: .ok,
                        headers: [("Content-Type", "application/octet-stream"), ("X-Banyan-Commit-Index", "\(commit)"), ("X-Banyan-Entries", "\(entries.count)")],
                        body: body)
                }
            }
        case .tlsStatus:
            guard let tls = server.tls else { return runtime.loop.makeSucceededFuture(.error(.notFound, "this server has no TLS material")) }
            return runtime.loop.makeSucceededFuture(Self.encoded(.ok, tls.status()))
        case .tlsReload:
            guard let tls = server.tls else { return runtime.loop.makeSucceededFuture(.error(.notFound, "this server has no TLS material")) }
            // Off the replica loop: reading files and building TLS contexts takes milliseconds.
            let promise = runtime.loop.makePromise(of: HTTPReply.self)
            DispatchQueue.global().async {
                switch tls.reload(trigger: "admin") {
                case .success(let status): promise.succeed(Self.encoded(.ok, status))
                case .failure(let e):
                    promise.succeed(
                        Self.encoded(.unprocessableEntity, TLSReloadRefusal(error: e.description, code: e.code.name, file: e.path, reason: e.reason)))
                }
            }
            return promise.futureResult
        case .faults, .setFaults, .clearFaults:
            return runtime.loop.makeSucceededFuture(Self.faults(route, switch: runtime.faults, body: body))
        case .badNodeID(let text):
            return runtime.loop.makeSucceededFuture(.error(.badRequest, "bad node id '\(text)'"))
        case .unknown:
            return runtime.loop.makeSucceededFuture(.error(.notFound, "no such operator endpoint: \(method) \(path)"))
        }
    }

    /// A refused reload as the operator sees it: `error` (file and reason), the code
    /// (`mismatch`, `untrusted`, `expired`, ...), the file.
    struct TLSReloadRefusal: Encodable {
        var error: String
        var code: String
        var file: String
        var reason: String
    }

    static func encoded(_ status: HTTPResponseStatus, _ value: some Encodable) -> HTTPReply {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.keyEncodingStrategy = .convertToSnakeCase
        let data = (try? encoder.encode(value)) ?? Data("{}".utf8)
        return HTTPReply(status: status, headers: [("Content-Type", "application/json")], body: Array(data))
    }

    private func membership(_ future: EventLoopFuture<Result<Membership, ReplicaError>>) -> EventLoopFuture<HTTPReply> {
        future.map { result in
            switch result {
            case .success(let m): return .json(.ok, #"{"voters":\#(m.voters),"learners":\#(m.learners)}"#)
            case .failure(let e): return Self.failure(e)
            }
        }
    }

    /// The fault switch's endpoints. A node without a switch refuses them all with 403 and
    /// `"code": "fault_injection_disabled"`: it never applies a fault.
    static func faults(_ route: Route.AdminRoute, switch faults: FaultSwitch?, body: [UInt8]) -> HTTPReply {
        guard let faults else {
            return .json(
                .forbidden,
                #"{"error":"fault injection is off: this node was not started with --allow-fault-injection (local clusters only: banyan cluster local; docs/chaos.md)","code":"fault_injection_disabled"}"#
            )
        }
        switch route {
        case .setFaults:
            do {
                return .json(.ok, try faults.update(json: body).json)
            } catch {
                return .json(.badRequest, #"{"error":\#(jsonString(error.description)),"code":"bad_fault_request"}"#)
            }
        case .clearFaults:
            faults.set(FaultSwitch.Faults())
            return .json(.ok, faults.current.json)
        default:
            return .json(.ok, faults.current.json)
        }
    }

    private static func jsonString(_ text: String) -> String {
        let data = (try? JSONSerialization.data(withJSONObject: [text], options: [])) ?? Data("[\"\"]".utf8)
        return String(decoding: data.dropFirst().dropLast(), as: UTF8.self)
    }

    static func failure(_ e: ReplicaError) -> HTTPReply {
        if case .notLeader(let leader) = e {
            return .json(.conflict, "{\n  \"error\" : \"\(e.description)\",\n  \"leader\" : \(leader)\n}")
        }
        return .error(.serviceUnavailable, e.description)
    }
}
