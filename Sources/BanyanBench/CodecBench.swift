import BanyanRaft
import BanyanStateMachine
import BanyanTree

extension BanyanBench {
    // MARK: Binary codecs: peer messages, commands, tree images (issue 14)

    /// `banyan-bench codec`: the binary formats on their own, in memory: peer messages framed
    /// and decoded as the transport does, command payloads as the replica encodes and applies
    /// them, and the tree image of the 1M-leaf document (no compression, no disk).
    static func codec() {
        print("\n== binary codecs: peer messages, commands, tree images (in memory, best of 5) ==")
        messageCodec()
        commandCodec()
        readAhead()
        treeImageCodec()
    }

    /// Best of `runs` timings of `body`, in seconds.
    static func best(runs: Int = 5, _ body: () -> Void) -> Double {
        var best = Double.infinity
        for _ in 0..<runs { best = min(best, seconds(body)) }
        return best
    }

    static func messageCodec() {
        let payload = [UInt8](repeating: 0x61, count: 150)
        let entries = (1...64).map { LogEntry(index: 1_000 + UInt64($0), term: 7, data: payload) }
        let cases: [(String, Message, Int)] = [
            ("append, 64 entries of 150 bytes", Message(from: 1, to: 2, term: 7, body: .append(prevIndex: 1_000, prevTerm: 7, entries: entries, commit: 990)), 20_000),
            ("heartbeat", Message(from: 1, to: 2, term: 7, body: .heartbeat(commit: 990, readSeq: 42)), 2_000_000),
            ("appendAccepted", Message(from: 2, to: 1, term: 7, body: .appendAccepted(index: 1_064)), 2_000_000),
            ("proposal, 16 commands of 150 bytes", Message(from: 2, to: 1, term: 7, body: .proposal(commands: Array(repeating: payload, count: 16))), 100_000),
        ]
        for (name, message, count) in cases {
            var buffer: [UInt8] = []
            buffer.reserveCapacity(1 << 16)
            let encodeTime = best {
                for _ in 0..<count {
                    buffer.removeAll(keepingCapacity: true)
                    Framing.appendFrame(message, to: &buffer)
                }
            }
            let frame = buffer
            var decodedTerm: UInt64 = 0
            var failed = false
            let decodeTime = best {
                frame.withUnsafeBytes { raw in
                    let payload = UnsafeRawBufferPointer(rebasing: raw[4...])
                    for _ in 0..<count {
                        do {
                            decodedTerm &+= try MessageCodec.decode(payload).term
                        } catch {
                            failed = true
                        }
                    }
                }
            }
            let roundTrip = (try? MessageCodec.decode(Array(frame[4...]))) == message
            let mb = Double(frame.count * count) / 1_000_000
            print(
                "message \(name) (\(frame.count) bytes): encode \(format(encodeTime / Double(count) * 1e9)) ns (\(format(mb / encodeTime)) MB/s),"
                    + " decode \(format(decodeTime / Double(count) * 1e9)) ns (\(format(mb / decodeTime)) MB/s); round trip \(roundTrip && !failed && decodedTerm > 0)"
            )
        }
    }

    static func commandCodec() {
        let json = Array(#"{"name":"Ada Lovelace","score":1815,"joined":{".sv":"timestamp"},"about":"a short profile text of a user"}"#.utf8)
        let update = (0..<5).map { Command.UpdateItem(path: "field\($0)/value", json: Array("\($0 * 1_000)".utf8)) }
        let cases: [(String, CommandEnvelope)] = [
            ("set (\(json.count)-byte JSON)", CommandEnvelope(namespace: "demo", session: 77, seq: 1_234, timestamp: 1_790_000_000_000, settledBelow: 1_200, command: .set(path: "users/ada", json: json))),
            ("update (5 paths)", CommandEnvelope(namespace: "demo", session: 77, seq: 1_235, timestamp: 1_790_000_000_000, command: .update(path: "users/ada", entries: update))),
        ]
        let count = 1_000_000
        for (name, envelope) in cases {
            var sink = 0
            let encodeTime = best { for _ in 0..<count { sink &+= envelope.encoded().count } }
            let bytes = envelope.encoded()
            var decoded = 0
            let decodeTime = best {
                for _ in 0..<count where CommandEnvelope(decoding: bytes) != nil { decoded += 1 }
            }
            let roundTrip = CommandEnvelope(decoding: bytes) == envelope
            print(
                "command \(name) (\(bytes.count) bytes): encode \(format(encodeTime / Double(count) * 1e9)) ns,"
                    + " decode \(format(decodeTime / Double(count) * 1e9)) ns; round trip \(roundTrip && sink > 0 && decoded > 0)"
            )
        }
    }

    /// The read-ahead of a large entry (docs/replica.md, "Prepared entries"): a set of the hostile
    /// scenario's 14.9 MiB object of 137,000 children, read into a tree as a node's read-ahead
    /// thread does (`PreparedCommand(payload:)`); the tree carries its measure as it is built.
    static func readAhead() {
        let filler = String(repeating: "x", count: 84)
        var json: [UInt8] = [UInt8(ascii: "{")]
        for i in 0..<137_000 {
            if i > 0 { json.append(UInt8(ascii: ",")) }
            json += Array("\"k\(String(1_000_000 + i).dropFirst())\":{\"s\":\"\(filler)\",\"v\":\(i)}".utf8)
        }
        json.append(UInt8(ascii: "}"))
        let payload = CommandEnvelope(namespace: "demo", session: 77, seq: 1, timestamp: 1_790_000_000_000, command: .set(path: "big", json: json)).encoded()
        do {
            var ok = true
            // Kept past the timing: freeing the tree (as long again) is not part of reading
            // ahead (the tree is grafted into the state machine).
            var kept: [PreparedCommand] = []
            let time = best(runs: 3) {
                guard let prepared = PreparedCommand(payload: payload) else { return ok = false }
                kept.append(prepared)
            }
            kept.removeAll()
            print(
                "read-ahead of a \(format(Double(payload.count) / 1_048_576)) MiB set (137,000 children):"
                    + " \(format(time * 1e3)) ms (\(format(Double(payload.count) / time / 1e6)) MB/s)\(ok ? "" : " FAILED")"
            )
        }
    }

    static func treeImageCodec() {
        let root = document()
        var image: [UInt8] = []
        let writeTime = best(runs: 3) {
            image = []
            image = TreeImage.bytes(root)
        }
        var loaded = Tree.empty
        let readTime = best(runs: 3) {
            loaded = .empty  // free the previous result outside the timed section
            loaded = (try? TreeImage.read(image)) ?? .empty
        }
        // Streamed, as a snapshot load reads it: 64 KiB at a time from the image.
        var streamed = Tree.empty
        let streamTime = best(runs: 3) {
            streamed = .empty
            var offset = 0
            streamed = (try? TreeImage.read(maxLength: image.count) { window in
                let n = min(window.count, image.count - offset, 64 * 1024)
                for i in 0..<n { window[i] = image[offset + i] }
                offset += n
                return n
            }) ?? .empty
        }
        let mb = Double(image.count) / 1_000_000
        print(
            "tree image of the 1M-leaf document (\(format(mb)) MB): write \(format(mb / writeTime)) MB/s, read \(format(mb / readTime)) MB/s,"
                + " streamed read \(format(mb / streamTime)) MB/s; round trip \(loaded == root && streamed == root)"
        )
    }
}
