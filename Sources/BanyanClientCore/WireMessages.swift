public import BanyanTree

/// The client's side of the Firebase WebSocket protocol v5 (docs/swift-sdk.md): requests it
/// sends, and the server's messages it reads. Pure.
public enum ClientRequest: Sendable, Equatable {
    /// `p`: set the value at a path (`data` is JSON, possibly with `.sv` placeholders).
    case put(path: Path, data: [UInt8])
    /// `m`: a multi-path update at `path`: relative paths and JSON values.
    case merge(path: Path, children: [(Path, [UInt8])])
    /// `q`: listen to a location (the default query).
    case listen(path: Path)
    /// `n`: stop listening.
    case unlisten(path: Path)
    /// `g`: read once.
    case get(path: Path)
    /// `auth`: a credential (the emulator's `owner`, or a token).
    case auth(token: String)

    public static func == (a: ClientRequest, b: ClientRequest) -> Bool {
        a.body(number: 0) == b.body(number: 0)
    }

    /// The request as the `d` envelope: `{"t":"d","d":{"r":N,"a":…,"b":{…}}}`.
    public func body(number: Int64) -> [UInt8] {
        var out = Array(#"{"t":"d","d":{"r":"#.utf8)
        JSONWriter.appendInt(number, to: &out)
        func path(_ p: Path) {
            out += Array(#""p":"#.utf8)
            JSONWriter.appendString(p.isRoot ? "/" : p.description, to: &out)
        }
        switch self {
        case let .put(p, data):
            out += Array(#","a":"p","b":{"#.utf8)
            path(p)
            out += Array(#","d":"#.utf8) + data + [UInt8(ascii: "}")]
        case let .merge(p, children):
            out += Array(#","a":"m","b":{"#.utf8)
            path(p)
            out += Array(#","d":{"#.utf8)
            for (i, (relative, data)) in children.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONWriter.appendString(relative.description.hasPrefix("/") ? String(relative.description.dropFirst()) : relative.description, to: &out)
                out.append(UInt8(ascii: ":"))
                out += data
            }
            out += Array("}}".utf8)
        case .listen(let p):
            out += Array(#","a":"q","b":{"#.utf8)
            path(p)
            out += Array(#","h":""}"#.utf8)
        case .unlisten(let p):
            out += Array(#","a":"n","b":{"#.utf8)
            path(p)
            out.append(UInt8(ascii: "}"))
        case .get(let p):
            out += Array(#","a":"g","b":{"#.utf8)
            path(p)
            out += Array(#","q":{}}"#.utf8)
        case .auth(let token):
            out += Array(#","a":"auth","b":{"cred":"#.utf8)
            JSONWriter.appendString(token, to: &out)
            out.append(UInt8(ascii: "}"))
        }
        out += Array("}}".utf8)
        return out
    }
}

/// A message from the server, as the client acts on it.
public enum ServerEvent: Sendable, Equatable {
    /// The handshake: the server's time and its session id.
    case hello(timestamp: Int64, session: String)
    /// The answer to request `number`: `status` "ok" or an error code, and its data (JSON).
    case response(number: Int64, status: String, data: [UInt8])
    /// `d`: the value at an absolute path (JSON).
    case data(path: Path, json: [UInt8])
    /// `m`: values at relative paths below `path`.
    case merge(path: Path, children: [(Path, [UInt8])])
    /// `c`: a listen was cancelled (permission revoked).
    case listenRevoked(path: Path)
    /// `r`: reconnect to this host.
    case reset(host: String)
    /// `s` (shutdown) or `e` (error): the connection is over, with the reason.
    case closed(reason: String)
    /// Anything the client does not act on (stats, pongs, security debug).
    case ignored

    public static func == (a: ServerEvent, b: ServerEvent) -> Bool {
        switch (a, b) {
        case let (.hello(t1, s1), .hello(t2, s2)): return t1 == t2 && s1 == s2
        case let (.response(n1, s1, d1), .response(n2, s2, d2)): return n1 == n2 && s1 == s2 && d1 == d2
        case let (.data(p1, j1), .data(p2, j2)): return p1 == p2 && j1 == j2
        case let (.merge(p1, c1), .merge(p2, c2)): return p1 == p2 && c1.count == c2.count && zip(c1, c2).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        case let (.listenRevoked(p1), .listenRevoked(p2)): return p1 == p2
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
                return .hello(timestamp: ts, session: session)
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
            switch action {
            case "d":
                return .data(path: path, json: raw(b, "d", in: body) ?? Array("null".utf8))
            case "m":
                guard let data = raw(b, "d", in: body), let members = try? JSONValue.members(rawIn: data) else { throw WireError("a merge without children") }
                var children: [(Path, [UInt8])] = []
                for (key, range) in members {
                    guard let relative = try? Path(parsing: key) else { throw WireError("a merge with a bad path '\(key)'") }
                    children.append((relative, Array(data[range])))
                }
                return .merge(path: path, children: children)
            case "c":
                return .listenRevoked(path: path)
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
