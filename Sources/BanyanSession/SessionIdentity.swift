/// The session id a v5 hello gives a connection (`s`), which the client sends back as `ls` when
/// it reconnects (docs/realtime.md, "onDisconnect"): the node that held it, the connection's own
/// client session (the state machine's session for its writes and onDisconnect queue) and a
/// random secret. A node receiving `ls` proposes `connectionEnded(connection, secret)` as the new
/// connection's first command; the state machine fires the old queue only when the secret is the
/// one it recorded, so a client cannot end another's connection by guessing: it would need the
/// 64-bit connection id and the 64-bit secret.
///
/// Text form: `<node>-<connection>-<secret>`, each lowercase hexadecimal, at most 16 digits.
public struct SessionIdentity: Sendable, Equatable, CustomStringConvertible {
    public var node: UInt64
    public var connection: UInt64
    public var secret: UInt64

    public init(node: UInt64, connection: UInt64, secret: UInt64) {
        self.node = node
        self.connection = connection
        self.secret = secret
    }

    public var description: String {
        String(node, radix: 16) + "-" + String(connection, radix: 16) + "-" + String(secret, radix: 16)
    }

    /// Parses an `ls` value; nil for anything else (an id from another server, a damaged one, or
    /// one longer than the form allows: the text is bounded before anything is converted).
    public init?(parsing text: Substring) {
        guard text.utf8.count <= 3 * 16 + 2 else { return nil }
        let parts = text.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        var values: [UInt64] = []
        for part in parts {
            guard !part.isEmpty, part.utf8.count <= 16,
                part.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }),
                let value = UInt64(part, radix: 16)
            else { return nil }
            values.append(value)
        }
        guard values[1] != 0 else { return nil }
        self.init(node: values[0], connection: values[1], secret: values[2])
    }
}
