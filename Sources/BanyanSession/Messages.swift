public import BanyanTree

// The messages of the WebSocket protocol v5 once reassembled from frames (docs/realtime.md,
// "Messages"; reference §1.4, §2.1 to §2.10): what a client may send, read into typed requests
// with errors in the protocol's own shape, and what the server sends, rendered. Pure: no I/O,
// no clock; the session core decides what to do with them.

/// A message from a client.
public enum ClientMessage: Sendable, Equatable {
    /// `{"t":"c","d":{"t":"p",…}}`: answered with `ServerMessage.pong`.
    case ping
    /// Another control message (`a` and `n` belong to the long-poll upgrade, which WebSocket
    /// clients never start; unknown codes): ignored.
    case control(String)
    case request(Request)
}

/// A data message: `{"t":"d","d":{"r":N,"a":"…","b":{…}}}`. Every request gets exactly one answer
/// carrying its number.
public struct Request: Sendable, Equatable {
    public var number: Int64
    public var action: Action
    /// Banyan's extension for exactly-once writes: the SDK's number for a `p` or `m` (`bn`) and
    /// the number below which it holds every answer (`ba`). Only read when both are present.
    public var clientWrite: ClientWriteNumber?

    public init(number: Int64, action: Action, clientWrite: ClientWriteNumber? = nil) {
        self.number = number
        self.action = action
        self.clientWrite = clientWrite
    }
}

/// A client's own number for one of its writes and its acknowledgement watermark (the client id
/// comes with the connection: the `bc` parameter of `/.ws`).
public struct ClientWriteNumber: Sendable, Equatable {
    public var number: UInt64
    public var acknowledgedBelow: UInt64
    public init(number: UInt64, acknowledgedBelow: UInt64) {
        self.number = number
        self.acknowledgedBelow = acknowledgedBelow
    }
}

/// Tree data inside a request (the `d` of a put, merge or onDisconnect): the message's bytes
/// and the value's range in them, read once by `TreeReader` (with the write limits and server
/// values) where the write is validated, never decoded twice.
public struct RawValue: Sendable, Equatable {
    public let message: [UInt8]
    public let range: Range<Int>

    public init(message: [UInt8], range: Range<Int>) {
        self.message = message
        self.range = range
    }

    public var bytes: ArraySlice<UInt8> { message[range] }
    public var text: String { String(decoding: bytes, as: UTF8.self) }
}

/// A listen or unlisten: the location, the query object (`q`, nil for a default listen) and its
/// tag (`t`), and the hash of what the client holds (`h`, listens only; "" when nothing).
public struct ListenSpec: Sendable, Equatable {
    public var path: Path
    public var query: JSONValue?
    public var tag: Int64?
    public var hash: String?

    public init(path: Path, query: JSONValue? = nil, tag: Int64? = nil, hash: String? = nil) {
        self.path = path
        self.query = query
        self.tag = tag
        self.hash = hash
    }
}

/// Credentials of `auth` / `gauth`: the token (`cred`), the admin SDKs' override of the rules'
/// `auth` variable (`authvar`), or `noauth` (evaluate as unauthenticated).
public struct Credential: Sendable, Equatable {
    public var token: String
    public var authVariable: JSONValue?
    public var noAuth: Bool

    public init(token: String, authVariable: JSONValue? = nil, noAuth: Bool = false) {
        self.token = token
        self.authVariable = authVariable
        self.noAuth = noAuth
    }
}

/// What a request asks (reference §2.2). Paths are normalised (empty segments dropped); a write
/// path may end in `.priority`.
public enum Action: Sendable, Equatable {
    /// `s`: counters the SDK reports (`{"c":{name: count}}`), kept for metrics.
    case stats([(String, Int64)])
    /// `q` (and the legacy `l`).
    case listen(ListenSpec)
    /// `n` (and the legacy `u`).
    case unlisten(ListenSpec)
    /// `g`: a one-shot read (`q` may be `{}` for a plain location).
    case get(path: Path, query: JSONValue?)
    /// `p`: a set; with `h`, a compare-and-set (a transaction).
    case put(path: WritePath, data: RawValue, hash: String?)
    /// `m`: an atomic multi-path update under `path`.
    case merge(path: Path, data: RawValue)
    /// `o`: an onDisconnect set (`null` removes).
    case onDisconnectPut(path: WritePath, data: RawValue)
    /// `om`: an onDisconnect update.
    case onDisconnectMerge(path: Path, data: RawValue)
    /// `oc`: cancels the onDisconnect operations at or below `path`.
    case onDisconnectCancel(path: Path)
    /// `auth` (ID tokens, custom tokens, emulator tokens).
    case auth(Credential)
    /// `gauth` (OAuth access tokens of the admin SDKs, the emulator's `owner`).
    case googleAuth(Credential)
    case unauth
    /// `appcheck`.
    case appCheck(token: String)
    /// `unappeck` (sic).
    case dropAppCheck

    public static func == (a: Action, b: Action) -> Bool {
        switch (a, b) {
        case let (.stats(x), .stats(y)): return x.count == y.count && zip(x, y).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        case let (.listen(x), .listen(y)), let (.unlisten(x), .unlisten(y)): return x == y
        case let (.get(p, q), .get(p2, q2)): return p == p2 && q == q2
        case let (.put(p, d, h), .put(p2, d2, h2)): return p == p2 && d == d2 && h == h2
        case let (.merge(p, d), .merge(p2, d2)), let (.onDisconnectMerge(p, d), .onDisconnectMerge(p2, d2)): return p == p2 && d == d2
        case let (.onDisconnectPut(p, d), .onDisconnectPut(p2, d2)): return p == p2 && d == d2
        case let (.onDisconnectCancel(p), .onDisconnectCancel(p2)): return p == p2
        case let (.auth(x), .auth(y)), let (.googleAuth(x), .googleAuth(y)): return x == y
        case (.unauth, .unauth), (.dropAppCheck, .dropAppCheck): return true
        case let (.appCheck(x), .appCheck(y)): return x == y
        default: return false
        }
    }
}

/// Why a message could not be read. With a request number, the session answers that request
/// with `status` and `message` (the connection goes on); without one (not JSON, no envelope, no
/// number), nothing can be answered: the session reports `message` in a control `e` and
/// closes.
public struct MessageError: Error, Sendable, Equatable, CustomStringConvertible {
    public var request: Int64?
    /// A status the SDKs know (reference §2.1): `failure` for a malformed request,
    /// `too_big` for one over the message limit.
    public var status: String
    public var message: String

    public init(request: Int64?, status: String = "failure", _ message: String) {
        self.request = request
        self.status = status
        self.message = message
    }

    public var description: String {
        (request.map { "request \($0): " } ?? "") + "\(status): \(message)"
    }
}

public enum MessageReader {
    /// Nesting allowed in an envelope outside the tree data (query objects, stats, authvar).
    public static let maxEnvelopeDepth = 16

    /// Reads one reassembled message. Tree data (`d.b.d`) is left raw for the write path.
    public static func read(_ message: [UInt8]) throws(MessageError) -> ClientMessage {
        let parsed: (value: JSONValue, raw: Range<Int>?)
        do {
            parsed = try JSONValue.parse(message, leavingRaw: ["d", "b", "d"], maxDepth: maxEnvelopeDepth)
        } catch {
            throw MessageError(request: requestNumber(inPrefix: message), "Invalid message: \(error.message)")
        }
        let envelope = parsed.value
        guard case .object = envelope, case .string(let type)? = envelope["t"] else {
            throw MessageError(request: nil, "Invalid message: expected an object with \"t\" (\"c\" or \"d\")")
        }
        switch type {
        case "c":
            guard case .string(let code)? = envelope["d"]?["t"] else {
                throw MessageError(request: nil, "Invalid control message: expected \"d\":{\"t\":code}")
            }
            return code == "p" ? .ping : .control(code)
        case "d":
            guard let payload = envelope["d"], case .object = payload else {
                throw MessageError(request: nil, "Invalid data message: expected \"d\" to be an object")
            }
            guard let number = integer(payload["r"]) else {
                throw MessageError(request: nil, "Invalid data message: expected a request number \"r\"")
            }
            guard case .string(let action)? = payload["a"] else {
                throw MessageError(request: number, "Invalid request: expected an action \"a\"")
            }
            let body = payload["b"] ?? .object([])
            guard case .object = body else { throw MessageError(request: number, "Invalid request: expected the body \"b\" to be an object") }
            let raw = parsed.raw.map { RawValue(message: message, range: $0) }
            var request = Request(number: number, action: try readAction(action, body, raw: raw, request: number))
            if action == "p" || action == "m" {
                switch (body["bn"], body["ba"]) {
                case (nil, nil): break
                case let (n?, a?):
                    guard let n = integer(n), let a = integer(a), n > 0, a > 0, a <= n else {
                        throw MessageError(request: number, "Invalid \"\(action)\" request: \"bn\" and \"ba\" must be positive integers, \"ba\" at most \"bn\"")
                    }
                    request.clientWrite = ClientWriteNumber(number: UInt64(n), acknowledgedBelow: UInt64(a))
                default:
                    throw MessageError(request: number, "Invalid \"\(action)\" request: \"bn\" and \"ba\" come together")
                }
            }
            return .request(request)
        default:
            throw MessageError(request: nil, "Invalid message: unknown type \"\(type)\"")
        }
    }

    static func readAction(_ action: String, _ body: JSONValue, raw: RawValue?, request: Int64) throws(MessageError) -> Action {
        func fail(_ message: String) -> MessageError { MessageError(request: request, "Invalid \"\(action)\" request: \(message)") }
        func path() throws(MessageError) -> Path {
            guard case .string(let text)? = body["p"] else { throw fail("expected a path \"p\"") }
            do {
                return try Path(parsing: text)
            } catch {
                throw fail(error.message)
            }
        }
        func writePath() throws(MessageError) -> WritePath {
            guard case .string(let text)? = body["p"] else { throw fail("expected a path \"p\"") }
            do {
                return try WritePath(parsing: text)
            } catch {
                throw fail(error.message)
            }
        }
        func data() throws(MessageError) -> RawValue {
            guard let raw else { throw fail("expected data \"d\"") }
            return raw
        }
        func optionalString(_ key: String) throws(MessageError) -> String? {
            switch body[key] {
            case nil, .null?: return nil
            case .string(let s)?: return s
            default: throw fail("expected \"\(key)\" to be a string")
            }
        }
        func listenSpec() throws(MessageError) -> ListenSpec {
            let query: JSONValue?
            switch body["q"] {
            case nil, .null?: query = nil
            case .object(let members)?: query = members.isEmpty ? nil : .object(members)
            default: throw fail("expected the query \"q\" to be an object")
            }
            var tag: Int64?
            if let t = body["t"], t != .null {
                guard let n = integer(t) else { throw fail("expected the tag \"t\" to be an integer") }
                tag = n
            }
            return ListenSpec(path: try path(), query: query, tag: tag, hash: try optionalString("h"))
        }
        func credential() throws(MessageError) -> Credential {
            guard case .string(let token)? = body["cred"] else { throw fail("expected a credential \"cred\"") }
            var authVariable: JSONValue?
            switch body["authvar"] {
            case nil, .null?: break
            case .object(let members)?: authVariable = .object(members)
            default: throw fail("expected \"authvar\" to be an object")
            }
            var noAuth = false
            switch body["noauth"] {
            case nil, .null?: break
            case .bool(let b)?: noAuth = b
            default: throw fail("expected \"noauth\" to be a boolean")
            }
            return Credential(token: token, authVariable: authVariable, noAuth: noAuth)
        }
        switch action {
        case "s":
            var counters: [(String, Int64)] = []
            if case .object(let members)? = body["c"] {
                for (name, value) in members {
                    if let n = integer(value) { counters.append((name, n)) }
                }
            }
            return .stats(counters)
        case "q", "l":
            return .listen(try listenSpec())
        case "n", "u":
            return .unlisten(try listenSpec())
        case "g":
            switch body["q"] {
            case nil, .null?: return .get(path: try path(), query: nil)
            case .object(let members)?: return .get(path: try path(), query: members.isEmpty ? nil : .object(members))
            default: throw fail("expected the query \"q\" to be an object")
            }
        case "p":
            return .put(path: try writePath(), data: try data(), hash: try optionalString("h"))
        case "m":
            return .merge(path: try path(), data: try data())
        case "o":
            return .onDisconnectPut(path: try writePath(), data: try data())
        case "om":
            return .onDisconnectMerge(path: try path(), data: try data())
        case "oc":
            return .onDisconnectCancel(path: try path())
        case "auth":
            return .auth(try credential())
        case "gauth":
            return .googleAuth(try credential())
        case "unauth":
            return .unauth
        case "appcheck":
            guard case .string(let token)? = body["token"] else { throw fail("expected a token \"token\"") }
            return .appCheck(token: token)
        case "unappeck":
            return .dropAppCheck
        default:
            throw MessageError(request: request, "Unknown action \"\(action)\"")
        }
    }

    /// An integer: a JSON integer, or a double with an integral value (Android sends some
    /// numbers as doubles).
    static func integer(_ value: JSONValue?) -> Int64? {
        switch value {
        case .int(let i)?: return i
        case .double(let d)? where d.rounded() == d && abs(d) < 9.0e15: return Int64(d)
        default: return nil
        }
    }

    /// The request number of a message known only by its first bytes (one over the size limit,
    /// `FrameAssembler.TooLarge.prefix`, or one that is not valid JSON): the integer of the
    /// member `"r"` of the object at depth two (`{"t":"d","d":{"r":N,…`), found by a scan that
    /// steps over strings, so an `"r"` inside the data never counts. Nil when there is none.
    public static func requestNumber(inPrefix bytes: [UInt8]) -> Int64? {
        var depth = 0
        var i = 0
        while i < bytes.count {
            switch bytes[i] {
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                depth += 1
                i += 1
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                depth -= 1
                i += 1
            case UInt8(ascii: "\""):
                let start = i + 1
                i += 1
                while i < bytes.count, bytes[i] != UInt8(ascii: "\"") { i += bytes[i] == UInt8(ascii: "\\") ? 2 : 1 }
                guard i < bytes.count else { return nil }
                let isR = depth == 2 && i == start + 1 && bytes[start] == UInt8(ascii: "r")
                i += 1
                guard isR else { continue }
                var j = i
                while j < bytes.count, bytes[j] == 0x20 { j += 1 }
                guard j < bytes.count, bytes[j] == UInt8(ascii: ":") else { continue }  // a string value "r", not the key
                j += 1
                while j < bytes.count, bytes[j] == 0x20 { j += 1 }
                var value: Int64 = 0
                var digits = 0
                while j < bytes.count, bytes[j] >= UInt8(ascii: "0"), bytes[j] <= UInt8(ascii: "9"), digits < 15 {
                    value = value * 10 + Int64(bytes[j] - UInt8(ascii: "0"))
                    digits += 1
                    j += 1
                }
                // The number must be complete: the prefix may end inside it.
                guard digits > 0, j < bytes.count, bytes[j] == UInt8(ascii: ",") || bytes[j] == UInt8(ascii: "}") || bytes[j] == 0x20 else { return nil }
                return value
            default:
                i += 1
            }
        }
        return nil
    }
}

/// Messages from the server, rendered as the bytes of one JSON message (split into frames by
/// `FrameSplitter`). Tree data arrives already rendered in the export format.
public enum ServerMessage {
    /// The hello (`h`): `ts` the server's epoch milliseconds (a realistic value: Android reads a
    /// Long), `h` a host the client can reach again, `s` the session id.
    public static func hello(timestamp: Int64, host: String, session: String) -> [UInt8] {
        // `bw`: this server takes client write numbers (`bn`/`ba` with a `bc` client id).
        control("h", .object([("ts", .int(timestamp)), ("v", .string("5")), ("h", .string(host)), ("s", .string(session)), ("bw", .int(1))]))
    }

    /// The answer to a ping. The inner `d` must be present (JS ignores a control message without it).
    public static func pong() -> [UInt8] { control("o", .null) }

    /// `r`: reconnect to `host` (before the hello: at once; after: later).
    public static func reset(host: String) -> [UInt8] { control("r", .string(host)) }

    /// `s`: the client stops reconnecting for the rest of its process. Only to refuse a client for good.
    public static func shutdown(reason: String) -> [UInt8] { control("s", .string(reason)) }

    /// `e`: JS logs it as a server error.
    public static func error(_ text: String) -> [UInt8] { control("e", .string(text)) }

    static func control(_ code: String, _ payload: JSONValue) -> [UInt8] {
        JSONValue.object([("t", .string("c")), ("d", .object([("t", .string(code)), ("d", payload)]))]).bytes
    }

    /// The answer to request `number`: `{"t":"d","d":{"r":N,"b":{"s":status,"d":data}}}`, with
    /// `data` already rendered JSON.
    public static func response(_ number: Int64, status: String, data: [UInt8]) -> [UInt8] {
        var out = Array(#"{"t":"d","d":{"r":"#.utf8)
        JSONWriter.appendInt(number, to: &out)
        out.append(contentsOf: #","b":{"s":"#.utf8)
        JSONWriter.appendString(status, to: &out)
        out.append(contentsOf: #","d":"#.utf8)
        out.append(contentsOf: data)
        out.append(contentsOf: "}}}".utf8)
        return out
    }

    /// `ok` with data (a listen's `{}`, a get's value, an auth's claims).
    public static func ok(_ number: Int64, data: JSONValue) -> [UInt8] { response(number, status: "ok", data: data.bytes) }

    /// `ok` with the empty string most actions answer.
    public static func ok(_ number: Int64) -> [UInt8] { response(number, status: "ok", data: Array(#""""#.utf8)) }

    /// A failure status with a human-readable reason.
    public static func failure(_ number: Int64, status: String, reason: String) -> [UInt8] {
        response(number, status: status, data: JSONValue.string(reason).bytes)
    }

    /// The push `d`: the data at `path` is replaced by `data` (export format). Paths go without
    /// a leading slash, as the real server sends them (`""` for the root).
    public static func data(path: Path, data: [UInt8], tag: Int64? = nil) -> [UInt8] {
        push("d", path: path, tag: tag) { out in out.append(contentsOf: data) }
    }

    /// The push `m`: each relative path under `path` is replaced by its data.
    public static func merge(path: Path, children: [(Path, [UInt8])], tag: Int64? = nil) -> [UInt8] {
        push("m", path: path, tag: tag) { out in
            out.append(UInt8(ascii: "{"))
            for (i, (relative, data)) in children.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONWriter.appendString(wire(relative), to: &out)
                out.append(UInt8(ascii: ":"))
                out.append(contentsOf: data)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    /// The push `c`: a listen was revoked (the client treats it as permission denied). A
    /// tagged listen names its query in an array, as JS reads it.
    public static func listenRevoked(path: Path, query: JSONValue?) -> [UInt8] {
        var body: [(String, JSONValue)] = [("p", .string(wire(path)))]
        if let query { body.append(("q", .array([query]))) }
        return JSONValue.object([("t", .string("d")), ("d", .object([("a", .string("c")), ("b", .object(body))]))]).bytes
    }

    /// The push `ac`: the credentials were revoked (an expired token); the client closes and
    /// reconnects with a fresh one.
    public static func authRevoked(status: String, reason: String) -> [UInt8] {
        JSONValue.object([
            ("t", .string("d")), ("d", .object([("a", .string("ac")), ("b", .object([("s", .string(status)), ("d", .string(reason))]))])),
        ]).bytes
    }

    static func push(_ action: String, path: Path, tag: Int64?, data: (inout [UInt8]) -> Void) -> [UInt8] {
        var out = Array(#"{"t":"d","d":{"a":"#.utf8)
        JSONWriter.appendString(action, to: &out)
        out.append(contentsOf: #","b":{"p":"#.utf8)
        JSONWriter.appendString(wire(path), to: &out)
        out.append(contentsOf: #","d":"#.utf8)
        data(&out)
        if let tag {
            out.append(contentsOf: #","t":"#.utf8)
            JSONWriter.appendInt(tag, to: &out)
        }
        out.append(contentsOf: "}}}".utf8)
        return out
    }

    /// A path as pushes carry it: segments joined by `/`, no leading slash.
    static func wire(_ path: Path) -> String {
        path.segments.map(\.string).joined(separator: "/")
    }
}

extension JSONValue {
    public var bytes: [UInt8] {
        var out: [UInt8] = []
        appendJSON(to: &out)
        return out
    }
}
