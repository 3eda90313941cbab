/// Log entry payloads (`CommandEnvelope`) and what applying them does to a state machine that
/// holds data, rules, sessions and onDisconnect queues.
///
/// Input: one or more payloads separated by the 8 bytes `"\0CMDSEP\0"`; each is applied in
/// turn at the next index.
///
/// Invariants: a payload that decodes re-encodes to one that decodes to the same envelope;
/// applying never crashes; after each command the machine's image loads back to the same image.
import BanyanStateMachine
import BanyanTree
import FuzzSupport

let separator: [UInt8] = [0] + Array("CMDSEP".utf8) + [0]

/// A machine with data, rules in the rules namespace, a session and a queued onDisconnect write.
let start: StateMachine = {
    var machine = StateMachine()
    let rules = #"{"rules":{".read":true,"users":{"$uid":{".write":"auth != null && auth.uid == $uid","age":{".validate":"newData.isNumber()"}}},"open":{".write":true}}}"#
    let setup: [CommandEnvelope] = [
        CommandEnvelope(namespace: "fuzz", session: 1, seq: 1, timestamp: 1_000, command: .set(path: "/", json: Array(#"{"users":{"ada":{"age":36}},"open":{"n":1,"list":[1,2,3]}}"#.utf8))),
        CommandEnvelope(namespace: "fuzz", session: 1, seq: 2, timestamp: 1_001, command: .setRules(text: Array(rules.utf8))),
        CommandEnvelope(namespace: "fuzz", session: 7, seq: 1, timestamp: 1_002, command: .onDisconnectSet(path: "/open/gone", json: Array("true".utf8), secret: 99, holder: 5)),
        CommandEnvelope(namespace: "fuzz", session: 8, seq: 1, timestamp: 1_003, command: .renewLease(holder: 5, node: 1)),
    ]
    for (i, envelope) in setup.enumerated() { _ = machine.apply(envelope.encoded(), index: UInt64(i + 1)) }
    return machine
}()

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzCommand(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzEntry(data, size) { bytes in
        var machine = start
        var index = machine.appliedIndex
        for payload in split(bytes) {
            if let envelope = CommandEnvelope(decoding: payload) {
                require(CommandEnvelope(decoding: envelope.encoded()) == envelope, "envelope does not round-trip")
            }
            index += 1
            _ = machine.apply(payload, index: index)
            require(machine.appliedIndex == index, "applied index \(machine.appliedIndex), expected \(index)")
        }
        let image = machine.image()
        guard let loaded = try? StateMachine(image: image) else {
            require(false, "the machine's image does not load")
            return
        }
        require(loaded.image() == image, "the machine's image is not stable")
    }
}

func split(_ bytes: [UInt8]) -> [[UInt8]] {
    var parts: [[UInt8]] = []
    var from = 0
    var i = 0
    while i + separator.count <= bytes.count {
        if bytes[i] == 0, Array(bytes[i..<i + separator.count]) == separator {
            parts.append(Array(bytes[from..<i]))
            i += separator.count
            from = i
        } else {
            i += 1
        }
    }
    parts.append(Array(bytes[from...]))
    return parts
}
