import BanyanTree

/// The opening of a realtime connection: an HTTP/1.1 `GET /.ws?v=5&ns=…` asking to become a
/// WebSocket (RFC 6455 §4.2; reference §1.1–1.2), checked before the server switches protocols.
/// Pure: the server writes the `101` with `accept` and installs the WebSocket handlers.
public struct RealtimeUpgrade: Sendable, Equatable {
    /// The namespace: `ns`, else the first label of `Host` (not an address), else the default.
    public var namespace: String
    /// `ls`: the session id the client was given on its previous connection, if it says.
    public var lastSession: String?
    /// The `Host` the client used (the hello echoes it so the client can reach this node again).
    public var host: String?
    /// The `Sec-WebSocket-Accept` value for the client's key.
    public var accept: String
    /// permessage-deflate when the client offered it acceptably (`Sec-WebSocket-Extensions`),
    /// else nil: the connection goes uncompressed. An offer never makes the upgrade fail.
    public var deflate: PerMessageDeflate? = nil
    /// `bc` (Banyan's extension): the client's stable id, 16 hex digits, not zero. Its writes'
    /// numbers (`bn`) name them across connections, so each applies at most once.
    public var clientID: UInt64? = nil

    /// The realtime endpoints: `/.ws` (WebSocket) and `/.lp` (long polling, not served).
    public static func isRealtimePath(_ uri: String) -> Bool {
        Route.of(method: "GET", uri: uri) == .realtime
    }

    /// The RFC 6455 key suffix.
    static let guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    /// The accept value for a client's key: base64 of SHA-1 over the key and the GUID.
    public static func accept(forKey key: String) -> String {
        Base64.encode(SHA1.hash(Array((key + guid).utf8)))
    }

    /// Checks the request; the error is the HTTP answer (status and Firebase-shaped message).
    public static func parse(_ head: HTTPHead, defaultNamespace: String) throws(RESTError) -> RealtimeUpgrade {
        let uri = head.uri
        let question = uri.utf8.firstIndex(of: UInt8(ascii: "?"))
        let path = question.map { uri[..<$0] } ?? Substring(uri)
        guard path == "/.ws" else {
            throw RESTError(404, "Long polling (/.lp) is not served: connect with WebSocket (/.ws?v=5).")
        }
        guard head.method == "GET" else { throw RESTError(405, "A realtime connection starts with GET /.ws?v=5.") }
        guard let upgrade = head.header("Upgrade"), hasToken(upgrade, "websocket") else {
            throw RESTError(400, "/.ws is the realtime endpoint: it expects a WebSocket upgrade (Upgrade: websocket).")
        }
        guard let connection = head.header("Connection"), hasToken(connection, "upgrade") else {
            throw RESTError(400, "A WebSocket upgrade needs Connection: Upgrade.")
        }
        guard head.header("Sec-WebSocket-Version")?.trimmingSpaces() == "13" else {
            throw RESTError(400, "Only WebSocket version 13 is supported (Sec-WebSocket-Version: 13).")
        }
        guard let key = head.header("Sec-WebSocket-Key").map({ String($0.trimmingSpaces()) }), isValidKey(key) else {
            throw RESTError(400, "Sec-WebSocket-Key must be 16 bytes in base64.")
        }
        let raw = question.map { uri[uri.utf8.index(after: $0)...] } ?? ""
        let params = try RESTRequest.parseQuery(raw)
        func param(_ name: String) -> String? { params.last { $0.0 == name }?.1 }
        if let version = param("v"), version != "5" {
            throw RESTError(400, "Unsupported realtime protocol version \"\(version)\": this server speaks v=5.")
        }
        let host = head.header("Host")
        let namespace: String
        if let ns = param("ns") {
            namespace = ns
        } else if let host, let label = RESTRequest.hostLabel(host) {
            namespace = label
        } else {
            namespace = defaultNamespace
        }
        guard RESTRequest.isValidNamespace(namespace) else {
            throw RESTError(400, "Invalid namespace \"\(namespace)\": use 1 to 63 letters, digits, '-' or '_'.")
        }
        let lastSession = param("ls").flatMap { $0.isEmpty ? nil : $0 }
        var clientID: UInt64?
        if let bc = param("bc") {
            guard bc.utf8.count == 16, let id = UInt64(bc, radix: 16), id != 0 else {
                throw RESTError(400, "Invalid client id \"bc\": use 16 hexadecimal digits, not all zero.")
            }
            clientID = id
        }
        let offers = head.headers.filter { HTTPHead.isHeader($0.name, "Sec-WebSocket-Extensions") }.map(\.value)
        return RealtimeUpgrade(
            namespace: namespace, lastSession: lastSession, host: host, accept: accept(forKey: key), deflate: PerMessageDeflate.negotiate(offers),
            clientID: clientID)
    }

    /// Whether a comma-separated header value holds `token` (ASCII case ignored).
    static func hasToken(_ value: String, _ token: String) -> Bool {
        value.split(separator: ",").contains { HTTPHead.isHeader(String($0.trimmingSpaces()), token) }
    }

    /// 24 characters of base64 whose padding says 16 bytes.
    static func isValidKey(_ key: String) -> Bool {
        let bytes = Array(key.utf8)
        guard bytes.count == 24, bytes[22] == UInt8(ascii: "="), bytes[23] == UInt8(ascii: "=") else { return false }
        return bytes[..<22].allSatisfy { b in
            (b >= UInt8(ascii: "A") && b <= UInt8(ascii: "Z")) || (b >= UInt8(ascii: "a") && b <= UInt8(ascii: "z"))
                || (b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9")) || b == UInt8(ascii: "+") || b == UInt8(ascii: "/")
        }
    }
}
