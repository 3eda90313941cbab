public import BanyanTree

/// The client's side of the Firebase WebSocket protocol v5 (docs/swift-sdk.md): requests it
/// sends, and the server's messages it reads. Pure.
public enum ClientRequest: Sendable, Equatable {
    /// `p`: set the value at a path (`data` is JSON, possibly with `.sv` placeholders). With
    /// `hash`, a transaction's compare-and-set; with `priority`, the path's `.priority`.
    case put(path: Path, data: [UInt8], hash: String? = nil, priority: Bool = false)
    /// `m`: a multi-path update at `path`: relative paths and JSON values.
    case merge(path: Path, children: [(Path, [UInt8])])
    /// `q`: listen to a location; a query object and tag for a filtered (tagged) listen, and the
    /// hash of the data the client holds for it (`""`: none).
    case listen(path: Path, query: JSONValue? = nil, tag: Int? = nil, hash: String = "")
    /// `n`: stop listening.
    case unlisten(path: Path, query: JSONValue? = nil, tag: Int? = nil)
    /// `g`: read once (with a query object, the query's data).
    case get(path: Path, query: JSONValue? = nil)
    /// `auth`: a credential (the emulator's `owner`, or a token).
    case auth(token: String)
    /// `unauth`: drop the credential.
    case unauth
    /// `o`: an onDisconnect set (`null` removes).
    case onDisconnectPut(path: Path, data: [UInt8])
    /// `om`: an onDisconnect multi-path update.
    case onDisconnectMerge(path: Path, children: [(Path, [UInt8])])
    /// `oc`: cancel the onDisconnect writes at and below a path.
    case onDisconnectCancel(path: Path)
    /// `s`: the client's counters (sent once per connection).
    case stats([(String, Int64)])

    public static func == (a: ClientRequest, b: ClientRequest) -> Bool {
        a.body(number: 0) == b.body(number: 0)
    }

    /// The request as the `d` envelope: `{"t":"d","d":{"r":N,"a":…,"b":{…}}}`. `clientWrite`:
    /// Banyan's exactly-once extension for a put or merge, the client's number for the write
    /// and its acknowledgement watermark (`bn`, `ba`).
    public func body(number: Int64, clientWrite: (number: UInt64, acknowledgedBelow: UInt64)? = nil) -> [UInt8] {
        var out = Array(#"{"t":"d","d":{"r":"#.utf8)
        JSONWriter.appendInt(number, to: &out)
        func action(_ a: String) {
            out += Array(#","a":"#.utf8)
            JSONWriter.appendString(a, to: &out)
            out += Array(#","b":{"#.utf8)
        }
        func path(_ p: Path, priority: Bool = false) {
            out += Array(#""p":"#.utf8)
            var text = p.isRoot ? "/" : p.description
            if priority { text += text == "/" ? ".priority" : "/.priority" }
            JSONWriter.appendString(text, to: &out)
        }
        func children(_ list: [(Path, [UInt8])]) {
            out += Array(#","d":{"#.utf8)
            for (i, (relative, data)) in list.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONWriter.appendString(relative.segments.map(\.string).joined(separator: "/"), to: &out)
                out.append(UInt8(ascii: ":"))
                out += data
            }
            out.append(UInt8(ascii: "}"))
        }
        func query(_ q: JSONValue?, tag: Int?) {
            guard let q, let tag else { return }
            out += Array(#","q":"#.utf8)
            q.appendJSON(to: &out)
            out += Array(#","t":"#.utf8)
            JSONWriter.appendInt(Int64(tag), to: &out)
        }
        switch self {
        case let .put(p, data, hash, priority):
            action("p")
            path(p, priority: priority)
            out += Array(#","d":"#.utf8) + data
            if let hash {
                out += Array(#","h":"#.utf8)
                JSONWriter.appendString(hash, to: &out)
            }
        case let .merge(p, list):
            action("m")
            path(p)
            children(list)
        case let .listen(p, q, tag, hash):
            action("q")
            path(p)
            query(q, tag: tag)
            out += Array(#","h":"#.utf8)
            JSONWriter.appendString(hash, to: &out)
        case let .unlisten(p, q, tag):
            action("n")
            path(p)
            query(q, tag: tag)
        case let .get(p, q):
            action("g")
            path(p)
            out += Array(#","q":"#.utf8)
            (q ?? .object([])).appendJSON(to: &out)
        case .auth(let token):
            action("auth")
            out += Array(#""cred":"#.utf8)
            JSONWriter.appendString(token, to: &out)
        case .unauth:
            action("unauth")
        case let .onDisconnectPut(p, data):
            action("o")
            path(p)
            out += Array(#","d":"#.utf8) + data
        case let .onDisconnectMerge(p, list):
            action("om")
            path(p)
            children(list)
        case .onDisconnectCancel(let p):
            action("oc")
            path(p)
            out += Array(#","d":null"#.utf8)
        case .stats(let counters):
            action("s")
            out += Array(#""c":{"#.utf8)
            for (i, (name, value)) in counters.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONWriter.appendString(name, to: &out)
                out.append(UInt8(ascii: ":"))
                JSONWriter.appendInt(value, to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
        if let clientWrite {
            switch self {
            case .put, .merge:
                out += Array(#","bn":"#.utf8)
                JSONWriter.appendInt(Int64(clamping: clientWrite.number), to: &out)
                out += Array(#","ba":"#.utf8)
                JSONWriter.appendInt(Int64(clamping: clientWrite.acknowledgedBelow), to: &out)
            default:
                break
            }
        }
        out += Array("}}}".utf8)
        return out
    }
}

/// A message from the server, as the client acts on it.
public enum ServerEvent: Sendable, Equatable {
    /// The handshake: the server's time, its session id, and whether it takes client write
    /// numbers (Banyan's `bw`).
    case hello(timestamp: Int64, session: String, writeNumbers: Bool = false)
    /// The answer to request `number`: `status` "ok" or an error code, and its data (JSON).
    case response(number: Int64, status: String, data: [UInt8])
    /// `d`: the value at an absolute path (JSON); `tag` names a filtered listen's data.
    case data(path: Path, json: [UInt8], tag: Int? = nil)
    /// `m`: values at relative paths below `path`.
    case merge(path: Path, children: [(Path, [UInt8])], tag: Int? = nil)
    /// `c`: listens at a path were cancelled (permission revoked): the default listen when
    /// `queries` is nil, else those of the query objects listed.
    case listenRevoked(path: Path, queries: [JSONValue]? = nil)
    /// `ac`: the credential was revoked (expired or refused): status and reason.
    case authRevoked(status: String, reason: String)
    /// `r`: reconnect to this host.
    case reset(host: String)
    /// `s` (shutdown) or `e` (error): the connection is over, with the reason.
    case closed(reason: String)
    /// Anything the client does not act on (stats, pongs, security debug).
    case ignored

    public static func == (a: ServerEvent, b: ServerEvent) -> Bool {
        switch (a, b) {
        case let (.hello(t1, s1, w1), .hello(t2, s2, w2)): return t1 == t2 && s1 == s2 && w1 == w2
        case let (.response(n1, s1, d1), .response(n2, s2, d2)): return n1 == n2 && s1 == s2 && d1 == d2
        case let (.data(p1, j1, t1), .data(p2, j2, t2)): return p1 == p2 && j1 == j2 && t1 == t2
        case let (.merge(p1, c1, t1), .merge(p2, c2, t2)):
            return p1 == p2 && t1 == t2 && c1.count == c2.count && zip(c1, c2).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        case let (.listenRevoked(p1, q1), .listenRevoked(p2, q2)): return p1 == p2 && q1 == q2
        case let (.authRevoked(s1, r1), .authRevoked(s2, r2)): return s1 == s2 && r1 == r2
        case let (.reset(h1), .reset(h2)): return h1 == h2
        case let (.closed(r1), .closed(r2)): return r1 == r2
        case (.ignored, .ignored): return true
        default: return false
        }
    }
}

public struct WireError: Error, Sendable, Equatable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

public enum ServerMessageReader {
    /// Reads one whole server message (frames already joined).
    public static func read(_ message: [UInt8]) throws(WireError) -> ServerEvent {
        guard let top = try? JSONValue.members(rawIn: message), let t = value(top, "t", in: message), let d = raw(top, "d", in: message) else {
            throw WireError("not a protocol message")
        }
        guard let inner = try? JSONValue.members(rawIn: d) else { throw WireError("the message's d is not an object") }
        switch t {
        case .string("c"):
            guard case .string(let kind)? = value(inner, "t", in: d) else { throw WireError("a control message without a type") }
            switch kind {
            case "h":
                guard let hd = raw(inner, "d", in: d), let hello = try? JSONValue.members(rawIn: hd) else { throw WireError("a hello without data") }
                var ts: Int64 = 0
                if case .int(let v)? = value(hello, "ts", in: hd) { ts = v }
                if case .double(let v)? = value(hello, "ts", in: hd) { ts = Int64(v) }
                guard case .string(let session)? = value(hello, "s", in: hd) else { throw WireError("a hello without a session") }
                var numbers = false
                if case .int(let bw)? = value(hello, "bw", in: hd) { numbers = bw >= 1 }
                return .hello(timestamp: ts, session: session, writeNumbers: numbers)
            case "r":
                guard case .string(let host)? = value(inner, "d", in: d) else { throw WireError("a reset without a host") }
                return .reset(host: host)
            case "s", "e":
                if case .string(let reason)? = value(inner, "d", in: d) { return .closed(reason: reason) }
                return .closed(reason: kind == "s" ? "the server shut the connection down" : "the server reported an error")
            default:
                return .ignored
            }
        case .string("d"):
            if case .int(let number)? = value(inner, "r", in: d) {
                guard let body = raw(inner, "b", in: d), let b = try? JSONValue.members(rawIn: body), case .string(let status)? = value(b, "s", in: body)
                else { throw WireError("response \(number) without a status") }
                return .response(number: number, status: status, data: raw(b, "d", in: body) ?? [])
            }
            guard case .string(let action)? = value(inner, "a", in: d), let body = raw(inner, "b", in: d),
                let b = try? JSONValue.members(rawIn: body)
            else { return .ignored }
            if action == "ac" {
                var status = "invalid_token"
                var reason = ""
                if case .string(let s)? = value(b, "s", in: body) { status = s }
                if case .string(let r)? = value(b, "d", in: body) { reason = r }
                return .authRevoked(status: status, reason: reason)
            }
            let path: Path
            if case .string(let p)? = value(b, "p", in: body) {
                do {
                    path = try Path(parsing: p)
                } catch {
                    throw WireError("a push for a bad path '\(p)'")
                }
            } else {
                path = .root
            }
            var tag: Int?
            switch value(b, "t", in: body) {
            case .int(let t)? where t > 0 && t <= Int64(Int32.max): tag = Int(t)
            case nil, .null?: tag = nil
            default: throw WireError("a push with a bad tag")
            }
            switch action {
            case "d":
                return .data(path: path, json: raw(b, "d", in: body) ?? Array("null".utf8), tag: tag)
            case "m":
                guard let data = raw(b, "d", in: body), let members = try? JSONValue.members(rawIn: data) else { throw WireError("a merge without children") }
                var children: [(Path, [UInt8])] = []
                for (key, range) in members {
                    guard let relative = try? Path(parsing: key) else { throw WireError("a merge with a bad path '\(key)'") }
                    children.append((relative, Array(data[range])))
                }
                return .merge(path: path, children: children, tag: tag)
            case "c":
                switch value(b, "q", in: body) {
                case .array(let list)?: return .listenRevoked(path: path, queries: list)
                case .object(let members)?: return .listenRevoked(path: path, queries: [.object(members)])
                default: return .listenRevoked(path: path, queries: nil)
                }
            default:
                return .ignored
            }
        default:
            return .ignored
        }
    }

    private static func raw(_ members: [(key: String, value: Range<Int>)]?, _ key: String, in bytes: [UInt8]) -> [UInt8]? {
        guard let r = members?.first(where: { $0.key == key })?.value else { return nil }
        return Array(bytes[r])
    }

    private static func value(_ members: [(key: String, value: Range<Int>)]?, _ key: String, in bytes: [UInt8]) -> JSONValue? {
        guard let r = raw(members, key, in: bytes) else { return nil }
        return try? JSONValue(parsing: r)
    }
}

/// Joins the server's frames into messages: a frame holding only a count announces that many
/// frames of one message (the protocol's splitting of messages over 16,384 characters).
public struct ClientFrameJoiner: Sendable {
    private var expected = 0
    private var parts: [UInt8] = []
    /// The most bytes one message may reach (a larger one is refused, not held).
    public var maxMessageBytes = 256 << 20

    public init() {}

    /// The message this frame completes, if any.
    public mutating func add(_ frame: [UInt8]) throws(WireError) -> [UInt8]? {
        if expected == 0 {
            if frame.count <= 6, !frame.isEmpty, frame.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }),
                let n = Int(String(decoding: frame, as: UTF8.self)), n > 0
            {
                expected = n
                parts = []
                return nil
            }
            return frame
        }
        guard parts.count + frame.count <= maxMessageBytes else { throw WireError("a message beyond \(maxMessageBytes) bytes") }
        parts += frame
        expected -= 1
        if expected == 0 {
            defer { parts = [] }
            return parts
        }
        return nil
    }

    /// Frames for one outgoing message: itself, or a count then chunks of at most `chunk` bytes
    /// (cut between UTF-8 sequences).
    public static func frames(_ message: [UInt8], chunk: Int = 16_384) -> [[UInt8]] {
        guard message.count > chunk else { return [message] }
        var chunks: [[UInt8]] = []
        var start = 0
        while start < message.count {
            var end = min(message.count, start + chunk)
            // Never split a UTF-8 sequence: back up over continuation bytes.
            while end < message.count, end > start + 1, message[end] & 0xC0 == 0x80 { end -= 1 }
            chunks.append(Array(message[start..<end]))
            start = end
        }
        return [Array(String(chunks.count).utf8)] + chunks
    }
}
