/// What `banyan chaos proxy` lets through from a client (docs/chaos.md): the client's bytes read
/// as HTTP/1.1 requests, one after another, each head checked before any of it goes on. A
/// request for a node's operator routes (`/.banyan/…`, but `health` and `ready`) is refused with
/// 403 and the connection ends: a proxy listening beyond loopback (`--listen-anywhere`) must not
/// hand the network a node's fault switch (`/.banyan/faults`), membership or backups, and the
/// node cannot tell the proxy's connections from local ones (both come from loopback).
///
/// Framing follows RFC 9112 and refuses what two parsers could read differently (request
/// smuggling): both `Content-Length` and `Transfer-Encoding`, a transfer coding other than
/// `chunked`, differing lengths, folded header lines, bare line feeds. A WebSocket upgrade passes
/// only as a connection's first request: then the first bytes the node sends answer it, and once
/// they are `101` the rest of the connection is a tunnel (WebSocket frames, not requests); any
/// other answer and the held bytes are read as requests again.
///
/// A connection whose first byte is 0x16 starts a TLS handshake (a client of a node serving TLS
/// on its client port): nothing in it can be read, so it passes as an opaque tunnel only when
/// `Options.tlsPassthrough` allows it, and is otherwise refused at once (a TLS alert, not an
/// HTTP answer the client could not read). With `Options.refuseOwnerToken` (a proxy listening
/// beyond loopback), a request carrying the emulator's `owner` credential is refused with 403.
/// Pure; one per connection.
public struct ProxyRequestGate: Sendable {
    public enum Output: Sendable, Equatable {
        /// Bytes that go on to the node.
        case forward([UInt8])
        /// Answer the client with this status and reason, and end the connection.
        case refuse(status: Int, reason: String)
        /// A TLS client that may not pass: answer with a TLS alert and end the connection.
        case refuseTLS(reason: String)
    }

    public struct Options: Sendable, Equatable {
        /// Pass a connection that starts a TLS handshake through unread.
        public var tlsPassthrough = false
        /// Refuse requests carrying the `owner` credential (`auth=owner`, `access_token=owner`,
        /// `Authorization: Bearer owner`).
        public var refuseOwnerToken = false
        public init(tlsPassthrough: Bool = false, refuseOwnerToken: Bool = false) {
            self.tlsPassthrough = tlsPassthrough
            self.refuseOwnerToken = refuseOwnerToken
        }
    }

    /// The first byte of a TLS handshake record (RFC 8446, 5.1).
    static let tlsHandshakeByte: UInt8 = 0x16

    /// The operator routes a client may reach through the proxy (a load balancer's checks).
    public static let allowedOperatorPaths: Set<String> = ["/.banyan/health", "/.banyan/ready"]
    public static let maxHeadBytes = 64 << 10
    /// Bytes a client may send after its upgrade request before the node answered it.
    public static let maxHeldBytes = 1 << 20

    private enum State: Sendable {
        case head
        case body(remaining: Int)
        case chunkSize
        case chunkData(remaining: Int)
        case chunkEnd
        case trailer(bytes: Int)
        case awaitingUpgrade
        case tunnel
        case refused
    }

    private var state = State.head
    /// The head or the line being read.
    private var line: [UInt8] = []
    /// Client bytes that came after an upgrade request, until the node answered it.
    private var held: [UInt8] = []
    private var response: [UInt8] = []
    private var requests = 0
    private var upgradeAfterBody = false
    private var sawFirstByte = false
    public let options: Options
    /// The connection started a TLS handshake and passes through unread.
    public private(set) var isTLS = false

    public init(options: Options = Options()) {
        self.options = options
    }

    /// The connection waits for the node's answer to its upgrade request.
    public var awaitingUpgrade: Bool {
        if case .awaitingUpgrade = state { return true }
        return false
    }

    public var isTunnel: Bool {
        if case .tunnel = state { return true }
        return false
    }

    public var isRefused: Bool {
        if case .refused = state { return true }
        return false
    }

    /// Bytes from the client: what goes on, in order; a refusal is last.
    public mutating func client(_ bytes: [UInt8]) -> [Output] {
        var out: [Output] = []
        var pending: [UInt8] = []
        var i = 0
        func refuse(_ status: Int, _ reason: String) {
            if !pending.isEmpty { out.append(.forward(pending)) }
            pending = []
            out.append(.refuse(status: status, reason: reason))
            state = .refused
            line = []
            held = []
        }
        while i < bytes.count {
            switch state {
            case .refused:
                i = bytes.count
            case .tunnel:
                pending += bytes[i...]
                i = bytes.count
            case .awaitingUpgrade:
                guard held.count + bytes.count - i <= Self.maxHeldBytes else {
                    refuse(400, "more than \(Self.maxHeldBytes) bytes sent before the node answered the upgrade request")
                    break
                }
                held += bytes[i...]
                i = bytes.count
            case .head:
                if !sawFirstByte {
                    sawFirstByte = true
                    if bytes[i] == Self.tlsHandshakeByte {
                        guard options.tlsPassthrough else {
                            out.append(
                                .refuseTLS(
                                    reason:
                                        "a TLS client (the node serves TLS on its client port?): the proxy cannot read requests inside TLS, so it passes TLS only with --tls-passthrough"
                                ))
                            state = .refused
                            return out
                        }
                        isTLS = true
                        state = .tunnel
                        continue
                    }
                }
                var complete = false
                while i < bytes.count {
                    line.append(bytes[i])
                    i += 1
                    // Empty lines before a request line are ignored (RFC 9112, 2.2).
                    if line == [13, 10] {
                        pending += line
                        line = []
                        continue
                    }
                    if line.count >= 4 && line[line.count - 4] == 13 && line[line.count - 3] == 10 && line[line.count - 2] == 13 && line[line.count - 1] == 10 {
                        complete = true
                        break
                    }
                    if line.count > Self.maxHeadBytes { break }
                }
                if !complete {
                    if line.count > Self.maxHeadBytes { refuse(431, "a request head longer than \(Self.maxHeadBytes) bytes") }
                    break
                }
                let head = line
                line = []
                switch Self.inspect(head, first: requests == 0, refuseOwnerToken: options.refuseOwnerToken) {
                case .failure(let refusal):
                    refuse(refusal.status, refusal.reason)
                case .success(let request):
                    requests += 1
                    pending += head
                    upgradeAfterBody = request.upgrade
                    switch request.framing {
                    case .empty: endOfMessage()
                    case .length(let n): state = .body(remaining: n)
                    case .chunked: state = .chunkSize
                    }
                }
            case .body(let remaining), .chunkData(let remaining):
                let take = min(remaining, bytes.count - i)
                pending += bytes[i..<(i + take)]
                i += take
                let left = remaining - take
                if case .body = state {
                    if left == 0 { endOfMessage() } else { state = .body(remaining: left) }
                } else {
                    state = left == 0 ? .chunkEnd : .chunkData(remaining: left)
                }
            case .chunkEnd:
                line.append(bytes[i])
                i += 1
                if line.count == 2 {
                    guard line == [13, 10] else {
                        refuse(400, "a chunk does not end with CRLF")
                        break
                    }
                    pending += line
                    line = []
                    state = .chunkSize
                }
            case .chunkSize:
                line.append(bytes[i])
                i += 1
                if line.count > 4096 {
                    refuse(400, "a chunk size line longer than 4096 bytes")
                    break
                }
                guard line.last == 10 else { break }
                guard let size = Self.chunkSize(line) else {
                    refuse(400, "a malformed chunk size line")
                    break
                }
                pending += line
                line = []
                state = size == 0 ? .trailer(bytes: 0) : .chunkData(remaining: size)
            case .trailer(let total):
                line.append(bytes[i])
                i += 1
                if total + line.count > Self.maxHeadBytes {
                    refuse(431, "chunked trailers longer than \(Self.maxHeadBytes) bytes")
                    break
                }
                guard line.last == 10 else { break }
                guard line.count >= 2, line[line.count - 2] == 13 else {
                    refuse(400, "a trailer line ends with a bare line feed")
                    break
                }
                let ended = line == [13, 10]
                pending += line
                let count = line.count
                line = []
                if ended { endOfMessage() } else { state = .trailer(bytes: total + count) }
            }
        }
        if !pending.isEmpty { out.append(.forward(pending)) }
        return out
    }

    /// Bytes from the node. While an upgrade waits for its answer, the first of them decide:
    /// `101` makes the connection a tunnel, anything else reads the held bytes as requests.
    /// Returns what now goes on to the node (the held bytes), or a refusal.
    public mutating func target(_ bytes: [UInt8]) -> [Output] {
        guard awaitingUpgrade else { return [] }
        response += bytes.prefix(max(0, 12 - response.count))
        guard response.count >= 12 else { return [] }
        let switched = response.elementsEqual("HTTP/1.1 101".utf8) || response.elementsEqual("HTTP/1.0 101".utf8)
        let waiting = held
        held = []
        if switched {
            state = .tunnel
            return waiting.isEmpty ? [] : [.forward(waiting)]
        }
        state = .head
        return waiting.isEmpty ? [] : client(waiting)
    }

    private mutating func endOfMessage() {
        if upgradeAfterBody {
            upgradeAfterBody = false
            state = .awaitingUpgrade
        } else {
            state = .head
        }
    }

    enum Framing: Equatable {
        case empty
        case length(Int)
        case chunked
    }

    struct Request: Equatable {
        var framing: Framing
        var upgrade: Bool
        var path: String
    }

    struct Refusal: Error, Equatable {
        var status: Int
        var reason: String
    }

    /// Checks one complete head (request line, header lines, the empty line).
    static func inspect(_ head: [UInt8], first: Bool, refuseOwnerToken: Bool = false) -> Result<Request, Refusal> {
        // Lines end in CRLF: a bare CR or LF is refused (parsers disagree on them).
        var lines: [ArraySlice<UInt8>] = []
        var start = head.startIndex
        var k = head.startIndex
        while k < head.endIndex {
            if head[k] == 10 {
                guard k > start, head[k - 1] == 13 else { return .failure(Refusal(status: 400, reason: "a line ends with a bare line feed")) }
                lines.append(head[start..<(k - 1)])
                start = k + 1
            } else if head[k] == 13, k + 1 < head.endIndex, head[k + 1] != 10 {
                return .failure(Refusal(status: 400, reason: "a bare carriage return in the request head"))
            } else if head[k] == 0 {
                return .failure(Refusal(status: 400, reason: "a NUL byte in the request head"))
            }
            k += 1
        }
        guard let requestLine = lines.first else { return .failure(Refusal(status: 400, reason: "no request line")) }
        let parts = requestLine.split(separator: 32, omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, !parts[1].isEmpty else {
            return .failure(Refusal(status: 400, reason: "a malformed request line"))
        }
        let method = String(decoding: parts[0], as: UTF8.self)
        let target = String(decoding: parts[1], as: UTF8.self)
        let version = String(decoding: parts[2], as: UTF8.self)
        guard version == "HTTP/1.1" || version == "HTTP/1.0" else { return .failure(Refusal(status: 400, reason: "not an HTTP/1.x request")) }
        guard method.utf8.allSatisfy({ $0 > 32 && $0 < 127 }) else { return .failure(Refusal(status: 400, reason: "a malformed method")) }
        guard method != "CONNECT" else { return .failure(Refusal(status: 405, reason: "CONNECT is not proxied")) }
        guard let path = requestPath(target) else { return .failure(Refusal(status: 400, reason: "a malformed request target")) }
        if isOperatorRoute(path) {
            return .failure(
                Refusal(
                    status: 403,
                    reason: "the chaos proxy does not pass a node's operator routes (/.banyan/…, but health and ready): its fault switch, membership and backups stay off the network"))
        }
        if refuseOwnerToken && queryCarriesOwner(target) {
            return .failure(Refusal(status: 403, reason: ownerRefusal))
        }
        var lengths: Set<String> = []
        var chunked = false
        var transferEncoding = false
        var upgrade = false
        for header in lines.dropFirst() where !header.isEmpty {
            guard let first = header.first, first != 32, first != 9 else {
                return .failure(Refusal(status: 400, reason: "a folded header line"))
            }
            guard let colon = header.firstIndex(of: 58) else { return .failure(Refusal(status: 400, reason: "a header line without a colon")) }
            let name = header[header.startIndex..<colon]
            guard !name.isEmpty, name.allSatisfy({ $0 > 32 && $0 < 127 }) else {
                return .failure(Refusal(status: 400, reason: "a malformed header name"))
            }
            let key = String(decoding: name, as: UTF8.self).lowercased()
            let value = String(decoding: header[(colon + 1)...], as: UTF8.self).trimmingSpaces()
            switch key {
            case "content-length":
                for item in value.split(separator: ",", omittingEmptySubsequences: false) {
                    let v = String(item).trimmingSpaces()
                    guard !v.isEmpty, v.utf8.count <= 15, v.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) else {
                        return .failure(Refusal(status: 400, reason: "a malformed Content-Length"))
                    }
                    lengths.insert(String(Int(v) ?? 0))
                }
            case "transfer-encoding":
                transferEncoding = true
                chunked = value.lowercased() == "chunked"
                guard chunked else { return .failure(Refusal(status: 400, reason: "a transfer coding other than chunked")) }
            case "upgrade":
                upgrade = true
            case "authorization" where refuseOwnerToken && isOwnerCredential(value):
                return .failure(Refusal(status: 403, reason: ownerRefusal))
            default:
                break
            }
        }
        guard lengths.count <= 1 else { return .failure(Refusal(status: 400, reason: "differing Content-Length values")) }
        guard !(transferEncoding && !lengths.isEmpty) else {
            return .failure(Refusal(status: 400, reason: "both Content-Length and Transfer-Encoding"))
        }
        if upgrade && !first {
            return .failure(Refusal(status: 400, reason: "the chaos proxy passes an upgrade only as a connection's first request"))
        }
        let length = lengths.first.flatMap { Int($0) } ?? 0
        let framing: Framing = chunked ? .chunked : length > 0 ? .length(length) : .empty
        return .success(Request(framing: framing, upgrade: upgrade, path: path))
    }

    static let ownerRefusal =
        "the chaos proxy listens beyond loopback and the emulator's owner token would make anyone who reaches it an administrator (the node cannot tell the proxy's connections from local ones): it refuses requests carrying auth=owner, access_token=owner or Authorization: Bearer owner (start it with --allow-owner-token to pass them)"

    /// Whether an `Authorization` value names the owner, as the node reads it (`Bearer owner`
    /// or a bare `owner`), in any case and spacing.
    static func isOwnerCredential(_ value: String) -> Bool {
        var token = Substring(value.trimmingSpaces())
        if token.lowercased().hasPrefix("bearer") {
            token = token.dropFirst(6)
            while let f = token.first, f == " " || f == "\t" { token = token.dropFirst() }
        }
        return token == "owner"
    }

    /// Whether a request target's query has `auth` or `access_token` equal to `owner`, names and
    /// values percent-decoded (`+` as a space) as the node decodes them.
    static func queryCarriesOwner(_ target: String) -> Bool {
        let noFragment = target.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        guard let mark = noFragment.firstIndex(of: "?") else { return false }
        for pair in noFragment[noFragment.index(after: mark)...].split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let name = percentDecoded(String(parts[0]).replacingPluses())
            let value = parts.count > 1 ? percentDecoded(String(parts[1]).replacingPluses()) : ""
            if (name == "auth" || name == "access_token") && value == "owner" { return true }
        }
        return false
    }

    /// The path of a request target (origin form, or absolute form's path); nil when malformed.
    static func requestPath(_ target: String) -> String? {
        var rest = Substring(target)
        if target == "*" { return "*" }
        if !rest.hasPrefix("/") {
            let lower = target.lowercased()
            if lower.hasPrefix("http://") {
                rest = rest.dropFirst(7)
            } else if lower.hasPrefix("https://") {
                rest = rest.dropFirst(8)
            } else {
                return nil
            }
            guard let slash = rest.firstIndex(of: "/") else { return "/" }
            rest = rest[slash...]
        }
        let end = rest.firstIndex { $0 == "?" || $0 == "#" } ?? rest.endIndex
        return String(rest[..<end])
    }

    /// Whether a path names a node's operator routes, as sent or percent-decoded, in any case.
    static func isOperatorRoute(_ path: String) -> Bool {
        for form in [path, percentDecoded(path)] {
            let lower = form.lowercased()
            if lower.hasPrefix("/.banyan") && !allowedOperatorPaths.contains(lower) { return true }
        }
        return false
    }

    static func percentDecoded(_ text: String) -> String {
        let bytes = Array(text.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = 0
        func hex(_ b: UInt8) -> UInt8? {
            switch b {
            case 48...57: b - 48
            case 65...70: b - 55
            case 97...102: b - 87
            default: nil
            }
        }
        while i < bytes.count {
            if bytes[i] == 37, i + 2 < bytes.count, let h = hex(bytes[i + 1]), let l = hex(bytes[i + 2]) {
                out.append(h << 4 | l)
                i += 3
            } else {
                out.append(bytes[i])
                i += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The size of a chunk size line (hex digits, then optionally `;` and extensions, then CRLF);
    /// nil when malformed or implausibly large.
    static func chunkSize(_ line: [UInt8]) -> Int? {
        guard line.count >= 3, line[line.count - 2] == 13, line[line.count - 1] == 10 else { return nil }
        let body = line[..<(line.count - 2)]
        let digits = body.prefix { $0 != 59 }
        guard !digits.isEmpty, digits.count <= 15 else { return nil }
        var size = 0
        for d in digits {
            let v: Int
            switch d {
            case 48...57: v = Int(d - 48)
            case 65...70: v = Int(d - 55)
            case 97...102: v = Int(d - 87)
            default: return nil
            }
            size = size << 4 | v
        }
        return size
    }

    /// The answer the proxy gives a refused request.
    public static func answer(status: Int, reason: String) -> [UInt8] {
        let text: String
        switch status {
        case 403: text = "Forbidden"
        case 405: text = "Method Not Allowed"
        case 431: text = "Request Header Fields Too Large"
        default: text = "Bad Request"
        }
        var escaped = ""
        for scalar in reason.unicodeScalars {
            switch scalar {
            case "\"": escaped += "\\\""
            case "\\": escaped += "\\\\"
            default: escaped.unicodeScalars.append(scalar.value < 32 ? " " : scalar)
            }
        }
        let body = #"{"error":"\#(escaped)","code":"refused_by_chaos_proxy"}"#
        return Array(
            "HTTP/1.1 \(status) \(text)\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)".utf8)
    }
}

extension ProxyRequestGate {
    /// A fatal TLS alert record, `access_denied` (RFC 8446, 6.2), in the plaintext record layer a
    /// handshake starts with: a TLS client reports the refusal instead of a bare closed socket.
    public static let tlsAccessDenied: [UInt8] = [0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x31]
}

extension String {
    fileprivate func replacingPluses() -> String {
        String(unicodeScalars.map { $0 == "+" ? " " : Character($0) })
    }

    fileprivate func trimmingSpaces() -> String {
        var s = Substring(self)
        while let f = s.first, f == " " || f == "\t" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" { s = s.dropLast() }
        return String(s)
    }
}
