/// permessage-deflate (RFC 7692) as this server agrees to it on a realtime connection: the
/// answer to the client's `Sec-WebSocket-Extensions` offers. Pure: the server writes
/// `responseHeader` in its `101` and compresses and inflates messages by what is agreed here.
///
/// The server always answers with `server_no_context_takeover` and
/// `client_no_context_takeover` (RFC 7692 §7.1.1 lets it add both to any offer it accepts):
/// every message is then compressed on its own, so neither side keeps an LZ77 window between
/// messages and an idle connection holds no zlib state. It inflates with a 15-bit window,
/// which reads whatever window the client compresses with.
public struct PerMessageDeflate: Sendable, Equatable {
    /// `server_max_window_bits` from the accepted offer (8 to 15): the largest window the
    /// server's compressor may use, repeated in the answer. nil: the client set no bound (15).
    public var serverMaxWindowBits: Int?
    /// `client_max_window_bits=N` from the accepted offer, repeated in the answer (the RFC
    /// allows the same or a smaller value). nil when the offer had the parameter without a value
    /// or did not have it: the answer then leaves it out and the client may use up to 15.
    public var clientMaxWindowBits: Int?

    public init(serverMaxWindowBits: Int? = nil, clientMaxWindowBits: Int? = nil) {
        self.serverMaxWindowBits = serverMaxWindowBits
        self.clientMaxWindowBits = clientMaxWindowBits
    }

    /// The extension's name in offers and answers.
    public static let name = "permessage-deflate"

    /// The window the server compresses with: the client's bound, else the largest.
    public var compressionWindowBits: Int { serverMaxWindowBits ?? 15 }

    /// The `Sec-WebSocket-Extensions` value of the `101`.
    public var responseHeader: String {
        var header = Self.name + "; server_no_context_takeover; client_no_context_takeover"
        if let bits = serverMaxWindowBits { header += "; server_max_window_bits=\(bits)" }
        if let bits = clientMaxWindowBits { header += "; client_max_window_bits=\(bits)" }
        return header
    }

    /// The first acceptable permessage-deflate offer among every `Sec-WebSocket-Extensions`
    /// value of the request (the client lists offers in its order of preference, RFC 6455 §9.1),
    /// or nil: no offer, or none acceptable. An offer is declined, and the next one tried, when it
    /// is malformed, names a parameter RFC 7692 does not define for offers, gives a parameter
    /// twice, or gives a value out of range (§7). A value that leaves quoted strings open makes the
    /// whole value unreadable, so none of its offers is taken. Never an error: a declined offer
    /// only means the connection goes uncompressed.
    public static func negotiate(_ values: [String]) -> PerMessageDeflate? {
        for value in values {
            guard let offers = split(Substring(value), at: UInt8(ascii: ",")) else { continue }
            // The list rule of RFC 7230 §7 allows empty elements.
            for offer in offers where !offer.trimmingSpaces().isEmpty {
                if let accepted = accept(offer) { return accepted }
            }
        }
        return nil
    }

    /// The answer to one offer (`name; param[=value]; …`), or nil when it is not an acceptable
    /// permessage-deflate offer.
    static func accept(_ offer: Substring) -> PerMessageDeflate? {
        guard let parts = split(offer, at: UInt8(ascii: ";")), let first = parts.first else { return nil }
        let name = first.trimmingSpaces()
        guard HTTPHead.isHeader(String(name), Self.name) else { return nil }
        var seen: Set<String> = []
        var result = PerMessageDeflate()
        for part in parts.dropFirst() {
            guard let (key, value) = parameter(part), seen.insert(key).inserted else { return nil }
            switch key {
            case "server_no_context_takeover", "client_no_context_takeover":
                // Granted whether asked or not; these take no value.
                guard value == nil else { return nil }
            case "server_max_window_bits":
                guard let value, let bits = windowBits(value) else { return nil }
                result.serverMaxWindowBits = bits
            case "client_max_window_bits":
                if let value {
                    guard let bits = windowBits(value) else { return nil }
                    result.clientMaxWindowBits = bits
                }
            default:
                return nil
            }
        }
        return result
    }

    /// A parameter's name (lowercased) and value, its quotes removed; nil when malformed.
    static func parameter(_ text: Substring) -> (String, String?)? {
        let trimmed = text.trimmingSpaces()
        let equals = trimmed.utf8.firstIndex(of: UInt8(ascii: "="))
        let key = (equals.map { trimmed[..<$0] } ?? trimmed).trimmingSpaces()
        guard isToken(key) else { return nil }
        let name = String(key).lowercased()
        guard let equals else { return (name, nil) }
        let raw = trimmed[trimmed.utf8.index(after: equals)...].trimmingSpaces()
        guard let value = unquoted(raw), isToken(Substring(value)) else { return nil }
        return (name, value)
    }

    /// A window size: a decimal 8 to 15 without leading zeros (RFC 7692 §7.1.2).
    static func windowBits(_ value: String) -> Int? {
        guard let bits = Int(value), (8...15).contains(bits), String(bits) == value else { return nil }
        return bits
    }

    /// A token's value as is, or a quoted string's content with its escapes undone; nil when a
    /// quoted string is not closed at the end.
    static func unquoted(_ text: Substring) -> String? {
        let bytes = Array(text.utf8)
        guard bytes.first == UInt8(ascii: "\"") else { return String(text) }
        guard bytes.count >= 2, bytes.last == UInt8(ascii: "\"") else { return nil }
        var out: [UInt8] = []
        var i = 1
        while i < bytes.count - 1 {
            var b = bytes[i]
            if b == UInt8(ascii: "\\") {
                i += 1
                guard i < bytes.count - 1 else { return nil }
                b = bytes[i]
            } else if b == UInt8(ascii: "\"") {
                return nil
            }
            out.append(b)
            i += 1
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// An HTTP token (RFC 7230 §3.2.6): one or more of the visible characters that are not
    /// separators.
    static func isToken(_ text: Substring) -> Bool {
        !text.isEmpty
            && text.utf8.allSatisfy { b in
                (b >= UInt8(ascii: "a") && b <= UInt8(ascii: "z")) || (b >= UInt8(ascii: "A") && b <= UInt8(ascii: "Z"))
                    || (b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9")) || "!#$%&'*+-.^_`|~".utf8.contains(b)
            }
    }

    /// `text` cut at every `separator` outside quoted strings (a backslash inside one escapes
    /// the next character); nil when a quoted string is left open.
    static func split(_ text: Substring, at separator: UInt8) -> [Substring]? {
        var pieces: [Substring] = []
        var start = text.startIndex
        var quoted = false
        var escaped = false
        var index = text.startIndex
        while index < text.endIndex {
            let b = text.utf8[index]
            if escaped {
                escaped = false
            } else if quoted && b == UInt8(ascii: "\\") {
                escaped = true
            } else if b == UInt8(ascii: "\"") {
                quoted.toggle()
            } else if !quoted && b == separator {
                pieces.append(text[start..<index])
                start = text.utf8.index(after: index)
            }
            index = text.utf8.index(after: index)
        }
        guard !quoted else { return nil }
        pieces.append(text[start...])
        return pieces
    }
}
