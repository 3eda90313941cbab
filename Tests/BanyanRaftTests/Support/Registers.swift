import BanyanRaft
import BanyanStateMachine
import BanyanTree

/// The scenario tests' commands: integer registers `/k0`, `/k1`, … of the default namespace,
/// written as the node's own log payloads (`CommandEnvelope`) and applied by the node's own
/// `StateMachine`, so these tests use the vocabulary the node and the whole-node simulator use
/// (a retried or duplicated command is recognised by its session and sequence number, R29).
enum Register {
    static func path(_ key: Int) -> String { "/k\(key)" }

    /// A put of `value` into register `key` by client session `client`.
    static func put(key: Int, value: Int64, client: UInt32 = 1, seq: UInt32) -> CommandEnvelope {
        CommandEnvelope(session: UInt64(client), seq: UInt64(seq), timestamp: 0, command: .set(path: path(key), json: Array(String(value).utf8)))
    }
}

extension StateMachine {
    /// The integer in register `key`, or nil when it holds nothing (or something else).
    func value(_ key: Int) -> Int64? {
        guard let p = try? Path(parsing: Register.path(key)) else { return nil }
        if case .int(let v) = tree("").child(at: p).leaf { return v }
        return nil
    }

    /// The whole state (the snapshot image: applied index, sessions, trees), for comparing nodes
    /// that applied the same entries.
    var digest: [UInt8] { image() }
}
