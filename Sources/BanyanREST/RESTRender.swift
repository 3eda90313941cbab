public import BanyanQuery
public import BanyanStateMachine
public import BanyanTree

/// A response ready for the HTTP layer.
public struct RESTResponse: Sendable, Equatable {
    public var status: Int
    public var headers: [(String, String)]
    public var body: [UInt8]

    public init(status: Int, headers: [(String, String)], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    public static func == (a: RESTResponse, b: RESTResponse) -> Bool {
        a.status == b.status && a.body == b.body && a.headers.map { $0.0 + ":" + $0.1 } == b.headers.map { $0.0 + ":" + $0.1 }
    }

    public func header(_ name: String) -> String? { headers.first { $0.0.lowercased() == name.lowercased() }?.1 }
    public var text: String { String(decoding: body, as: UTF8.self) }
}

/// Renders Firebase REST responses (docs/rest.md).
public enum RESTRender {
    static let jsonType = ("Content-Type", "application/json; charset=utf-8")
    static let cors = ("Access-Control-Allow-Origin", "*")

    public static func error(_ e: RESTError) -> RESTResponse {
        RESTResponse(status: e.status, headers: [jsonType, cors], body: errorBody(e.message))
    }

    /// `{\n  "error" : "…"\n}`, as the Firebase server formats errors.
    public static func errorBody(_ message: String) -> [UInt8] {
        Array("{\n  \"error\" : ".utf8) + JSONWriter.bytes(Tree(.string(message))) + Array("\n}".utf8)
    }

    public static func options(_ request: RESTRequest) -> RESTResponse {
        RESTResponse(
            status: 200,
            headers: [
                cors, ("Access-Control-Allow-Methods", "GET, PUT, POST, PATCH, DELETE, OPTIONS"),
                (
                    "Access-Control-Allow-Headers",
                    "Authorization, Content-Type, X-Firebase-ETag, If-Match, If-None-Match, X-HTTP-Method-Override, X-Firebase-Decoding"
                ),
                ("Access-Control-Max-Age", "86400"),
            ],
            body: [])
    }

    /// The value a GET (or an event stream) shows: the location, filtered by the query, shallow,
    /// as it would be written.
    public static func value(_ request: RESTRequest, tree: Tree) -> Tree {
        let subtree = tree.child(at: request.path)
        if request.isPriority { return subtree.priority.tree }
        if request.shallow {
            guard subtree.hasChildren else { return subtree.withPriority(.none) }
            let children: [(ChildKey, Tree)]
            if let query = request.query {
                children = query.orderedChildren(of: subtree).map { ($0.key, Tree(.bool(true))) }
            } else {
                var all: [(ChildKey, Tree)] = []
                subtree.children.forEach { key, _ in all.append((key, Tree(.bool(true)))) }
                children = all
            }
            return Tree(sortedChildren: children.sorted { $0.0 < $1.0 })
        }
        if let query = request.query { return query.evaluate(subtree) }
        return subtree
    }

    static func json(_ subtree: Tree, _ request: RESTRequest) -> [UInt8] {
        JSONWriter.bytes(subtree, format: request.export ? .export : .plain, pretty: request.print == .pretty)
    }

    public static func read(_ request: RESTRequest, tree: Tree) -> RESTResponse {
        let location = tree.child(at: request.path)
        var headers = [jsonType, cors]
        if request.wantsETag || request.ifNoneMatch != nil {
            let etag = RESTRequest.etag(location)
            if let match = request.ifNoneMatch, match == etag {
                return RESTResponse(status: 304, headers: [cors, ("ETag", etag)], body: [])
            }
            headers.append(("ETag", etag))
        }
        if request.print == .silent { return RESTResponse(status: 204, headers: [cors], body: []) }
        var body = json(value(request, tree: tree), request)
        if let callback = request.callback {
            headers[0] = ("Content-Type", "application/javascript; charset=utf-8")
            body = Array(callback.utf8) + [UInt8(ascii: "(")] + body + Array(");".utf8)
        }
        if let download = request.download {
            headers.append(("Content-Disposition", "attachment; filename=\"\(download)\""))
        }
        return RESTResponse(status: 200, headers: headers, body: body)
    }

    /// The answer to an applied write.
    public static func write(_ request: RESTRequest, applied: StateMachine.Applied, pushID: String?) -> RESTResponse {
        switch applied.outcome {
        case .ok, .duplicate:
            var headers = [jsonType, cors]
            if request.ifMatch != nil || request.wantsETag {
                headers.append(("ETag", RESTRequest.etag(applied.value ?? .empty)))
            }
            if request.print == .silent { return RESTResponse(status: 204, headers: Array(headers.dropFirst()), body: []) }
            let body: [UInt8]
            switch request.operation {
            case .post:
                body = Array("{\"name\":".utf8) + JSONWriter.bytes(Tree(.string(pushID ?? ""))) + [UInt8(ascii: "}")]
            case .delete:
                body = Array("null".utf8)
            case .patch:
                // The request data, as Firebase echoes it (server values unresolved).
                body = request.print == .pretty ? prettyEcho(request.body) : request.body
            default:
                body = applied.value.map { json($0, request) } ?? request.body
            }
            return RESTResponse(status: 200, headers: headers, body: body)
        case .datastale(let current):
            let subtree = request.isPriority ? current.priority.tree : current
            return RESTResponse(
                status: 412, headers: [jsonType, cors, ("ETag", RESTRequest.etag(current))], body: JSONWriter.bytes(subtree, format: request.export ? .export : .plain))
        case .rejected(let e):
            return error(.badRequest(e.message))
        case .malformed:
            return error(RESTError(500, "The write could not be decoded by the state machine."))
        case .refused(let reason):
            // Connection-level refusals concern realtime sessions; REST writes never get one.
            return error(RESTError(409, reason))
        case .outOfOrder:
            // Only realtime sessions are ordered; their issuer proposes the command again, so no
            // answer is ever made of this outcome.
            return error(RESTError(503, "The write arrived before an earlier one of its session; retry."))
        case .permissionDenied:
            // Firebase's answer, word for word: the rule that decided is not disclosed.
            return error(RESTError(401, "Permission denied"))
        case .noSpace(let nodes):
            return error(RESTError(507, StateMachine.Outcome.noSpaceMessage(nodes)))
        case let .overQuota(namespace, used, wouldHold, quota):
            // As for a full disk: the storage this namespace may use is used up.
            return error(RESTError(507, StateMachine.Outcome.overQuotaMessage(namespace: namespace, used: used, wouldHold: wouldHold, quota: quota)))
        case .alreadyApplied(let earlier):
            // Client write keys come from realtime SDK sessions; REST writes never carry one.
            return error(RESTError(409, earlier.status == "ok" ? "The write was applied earlier." : earlier.message))
        }
    }

    static func prettyEcho(_ body: [UInt8]) -> [UInt8] {
        guard let value = try? JSONValue(parsing: body) else { return body }
        return Array(value.jsonString.utf8)
    }
}
