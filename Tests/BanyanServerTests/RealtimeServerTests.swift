import BanyanNode
import BanyanSession
import BanyanStateMachine
@testable import BanyanServer
import BanyanTree
import Foundation
import Logging
import NIOCore
import Testing

/// The WebSocket protocol v5 on a real node, over raw sockets and hand-made frames
/// (docs/realtime.md): the upgrade, the hello, the ordering rules, transactions, `ls`, and bad
/// input answered in the protocol's own shape. Synchronous (blocking sockets with timeouts).
@Suite struct RealtimeServerTests {
    /// A blocking WebSocket client: masked frames out, frames in.
    final class Client {
        let fd: Int32
        private var pending: [UInt8] = []
        private(set) var closed = false
        /// The reserved bits (RSV1-3, as in the first byte) of the frame `next` returned last.
        private(set) var lastReservedBits: UInt8 = 0

        init(port: Int, target: String = "/.ws?v=5&ns=rt", host: String = "example.test:443", extraHeaders: String? = nil) throws {
            fd = try loopbackSocket(port: port, receiveTimeoutMicroseconds: 50_000)
            let headers =
                extraHeaders
                ?? "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            sendRaw(Array("GET \(target) HTTP/1.1\r\nHost: \(host)\r\n\(headers)\r\n".utf8))
        }
        deinit { close(fd) }

        func sendRaw(_ bytes: [UInt8]) {
            _ = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        }

        /// The HTTP answer to the upgrade (up to the blank line).
        func head(seconds: Double = 10) -> String {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                if let end = find([13, 10, 13, 10]) {
                    let text = String(decoding: pending[..<end], as: UTF8.self)
                    pending.removeFirst(end + 4)
                    return text
                }
                if !fill() { break }
            }
            return String(decoding: pending, as: UTF8.self)
        }

        private func find(_ needle: [UInt8]) -> Int? {
            guard pending.count >= needle.count else { return nil }
            for i in 0...(pending.count - needle.count) where Array(pending[i..<(i + needle.count)]) == needle { return i }
            return nil
        }

        /// Reads what is there; false once the peer closed.
        @discardableResult
        private func fill() -> Bool {
            var buffer = [UInt8](repeating: 0, count: 65_536)
            let n = recv(fd, &buffer, buffer.count, 0)
            if n == 0 {
                closed = true
                return false
            }
            if n > 0 { pending += buffer[0..<n] }
            return true
        }

        /// One client frame, masked (RFC 6455 §5.3); `reserved` sets RSV bits (0x40: RSV1).
        func frame(opcode: UInt8, _ payload: [UInt8], fin: Bool = true, reserved: UInt8 = 0) {
            var out: [UInt8] = [(fin ? 0x80 : 0) | reserved | opcode]
            let mask: [UInt8] = [0x12, 0x34, 0x56, 0x78]
            if payload.count < 126 {
                out.append(0x80 | UInt8(payload.count))
            } else if payload.count <= 0xFFFF {
                out += [0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
            } else {
                out.append(0x80 | 127)
                for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8((UInt64(payload.count) >> UInt64(shift)) & 0xFF)) }
            }
            out += mask
            for (i, b) in payload.enumerated() { out.append(b ^ mask[i % 4]) }
            sendRaw(out)
        }

        func text(_ s: String) { frame(opcode: 1, Array(s.utf8)) }

        /// The next frame from the server: (opcode, payload), or nil after `seconds` or a close.
        func next(seconds: Double = 10) -> (opcode: UInt8, payload: [UInt8])? {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                if pending.count >= 2 {
                    let opcode = pending[0] & 0x0F
                    var length = Int(pending[1] & 0x7F)
                    var offset = 2
                    if length == 126, pending.count >= 4 {
                        length = Int(pending[2]) << 8 | Int(pending[3])
                        offset = 4
                    } else if length == 127, pending.count >= 10 {
                        length = (2..<10).reduce(0) { $0 << 8 | Int(pending[$1]) }
                        offset = 10
                    }
                    if (length < 126 || offset > 2), pending.count >= offset + length {
                        let payload = Array(pending[offset..<(offset + length)])
                        lastReservedBits = pending[0] & 0x70
                        pending.removeFirst(offset + length)
                        return (opcode, payload)
                    }
                }
                if !fill() && pending.isEmpty { return nil }
            }
            return nil
        }

        /// The next text message, reassembling the protocol's counted frames.
        func message(seconds: Double = 10) -> String? {
            guard let first = next(seconds: seconds) else { return nil }
            guard first.opcode == 1 else { return "<opcode \(first.opcode)>" + String(decoding: first.payload, as: UTF8.self) }
            let text = String(decoding: first.payload, as: UTF8.self)
            if let count = Int(text), text.count <= 6 {
                var whole = ""
                for _ in 0..<count { whole += String(decoding: next(seconds: seconds)?.payload ?? [], as: UTF8.self) }
                return whole
            }
            return text
        }

        /// Messages until one contains `marker` (inclusive), in order.
        func messages(until marker: String, seconds: Double = 10) -> [String] {
            var out: [String] = []
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline, let m = message(seconds: deadline.timeIntervalSinceNow) {
                out.append(m)
                if m.contains(marker) { break }
            }
            return out
        }

        /// Waits until the server closes the connection.
        func waitClosed(seconds: Double = 10) -> Bool {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline, !closed {
                pending = []
                fill()
            }
            return closed
        }
    }

    /// Runs `body` with the client port of a single-node cluster, removed afterwards.
    func withNode(_ name: String, _ body: (Int) throws -> Void) throws {
        try withNode(name) { port, _ in try body(port) }
    }

    /// The same, with the node itself.
    func withNode(_ name: String, configure: (inout NodeConfig) -> Void = { _ in }, _ body: (Int, BanyanNode) throws -> Void) throws {
        let dir = try temporaryDirectory(name)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var c = NodeConfig()
        c.dataDirectory = dir + "/data"
        c.clientAddress = HostPort(host: "127.0.0.1", port: 0)
        c.peerAddress = HostPort(host: "127.0.0.1", port: 0)
        configure(&c)
        let n = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { n.shutdown() }
        try body(clientPort(n), n)
    }

    /// Connects and reads the hello; returns the client and the hello's session id.
    func open(_ port: Int, target: String = "/.ws?v=5&ns=rt") throws -> (Client, String) {
        let c = try Client(port: port, target: target)
        let head = c.head()
        #expect(head.hasPrefix("HTTP/1.1 101"), "\(head)")
        let hello = c.message() ?? ""
        let session = (try? JSONValue(parsing: hello))?["d"]?["d"]?["s"]
        guard case .string(let s)? = session else {
            Issue.record("no session id in the hello: \(hello)")
            return (c, "")
        }
        return (c, s)
    }

    @Test("the upgrade answers 101 with the RFC 6455 accept, then the hello: real ts, v 5, the client's Host, a session id")
    func upgradeAndHello() throws {
        try withNode("rt-hello") { port in
            let c = try Client(port: port)
            let head = c.head()
            #expect(head.hasPrefix("HTTP/1.1 101"))
            // The RFC's own example key and accept value.
            #expect(head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "\(head)")
            let hello = try JSONValue(parsing: c.message() ?? "")
            #expect(hello["t"] == .string("c") && hello["d"]?["t"] == .string("h"))
            #expect(hello["d"]?["d"]?["v"] == .string("5") && hello["d"]?["d"]?["h"] == .string("example.test:443"))
            guard case .int(let ts)? = hello["d"]?["d"]?["ts"] else {
                Issue.record("ts is not an integer")
                return
            }
            #expect(abs(ts - Int64(Date().timeIntervalSince1970 * 1000)) < 60_000)
            // Keep-alive frame and ping: `0` is ignored, a ping answered with a pong.
            c.text("0")
            c.text(#"{"t":"c","d":{"t":"p","d":{}}}"#)
            #expect(c.message() == #"{"t":"c","d":{"t":"o","d":null}}"#)
        }
    }

    @Test("a listen's data comes before its ok; a write's echo before its ok; writes answered in order")
    func orderingRules() throws {
        try withNode("rt-order") { port in
            let (c, _) = try open(port)
            c.text(#"{"t":"d","d":{"r":0,"a":"p","b":{"p":"/rooms/r1/seed","d":true}}}"#)
            #expect(c.message() == #"{"t":"d","d":{"r":0,"b":{"s":"ok","d":""}}}"#)
            c.text(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/rooms/r1","h":""}}}"#)
            let started = c.messages(until: #""r":1"#)
            #expect(started == [#"{"t":"d","d":{"a":"d","b":{"p":"rooms/r1","d":{"seed":true}}}}"#, #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":{}}}}"#], "\(started)")
            c.text(#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/rooms/r1/title","d":"Hello"}}}"#)
            c.text(#"{"t":"d","d":{"r":3,"a":"m","b":{"p":"/rooms/r1","d":{"n":{".sv":{"increment":1}},"meta/x":true}}}}"#)
            let echoed = c.messages(until: #""r":3"#)
            // Both writes may apply in one batch: each echo precedes its own ok, and the oks keep
            // the request order.
            let echo2 = echoed.firstIndex(of: #"{"t":"d","d":{"a":"d","b":{"p":"rooms/r1/title","d":"Hello"}}}"#)
            let echo3 = echoed.firstIndex(of: #"{"t":"d","d":{"a":"m","b":{"p":"rooms/r1","d":{"n":1,"meta/x":true}}}}"#)
            let ok2 = echoed.firstIndex(of: #"{"t":"d","d":{"r":2,"b":{"s":"ok","d":""}}}"#)
            let ok3 = echoed.firstIndex(of: #"{"t":"d","d":{"r":3,"b":{"s":"ok","d":""}}}"#)
            #expect(echoed.count == 4 && echo2 != nil && echo3 != nil && ok2 != nil && ok3 != nil, "\(echoed)")
            if let echo2, let echo3, let ok2, let ok3 { #expect(echo2 < ok2 && echo3 < ok3 && ok2 < ok3, "\(echoed)") }
            // A tagged query: its pushes carry the tag.
            c.text(#"{"t":"d","d":{"r":4,"a":"q","b":{"p":"/rooms","q":{"i":".key","l":1,"vf":"l"},"t":7,"h":""}}}"#)
            let tagged = c.messages(until: #""r":4"#)
            #expect(tagged.first?.contains(#""t":7"#) == true && tagged.count == 2, "\(tagged)")
            // A get answers with the value, no push.
            c.text(#"{"t":"d","d":{"r":5,"a":"g","b":{"p":"/rooms/r1/title","q":{}}}}"#)
            #expect(c.message() == #"{"t":"d","d":{"r":5,"b":{"s":"ok","d":"Hello"}}}"#)
        }
    }

    @Test("listen hashes: a listen whose h is the hash of what it would be sent gets its ok alone (an empty location with h \"\" too, a tagged window with its window's hash); another hash, or none, gets the data first")
    func listenHashes() throws {
        try withNode("rt-hash") { port, node in
            let (c, _) = try open(port)
            c.text(#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/h","d":{"a":1,"b":{"c":"x"},"z":{".value":2,".priority":5}}}}}"#)
            #expect(c.message() == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":""}}}"#)
            let whole = try Tree(json: #"{"a":1,"b":{"c":"x"},"z":{".value":2,".priority":5}}"#).hashString
            let ok = { (r: Int) in #"{"t":"d","d":{"r":\#(r),"b":{"s":"ok","d":{}}}}"# }
            // The client holds the data: the ok alone.
            c.text(#"{"t":"d","d":{"r":2,"a":"q","b":{"p":"/h","h":"\#(whole)"}}}"#)
            #expect(c.messages(until: #""r":2"#) == [ok(2)])
            // Nothing cached, nothing there: the ok alone.
            c.text(#"{"t":"d","d":{"r":3,"a":"q","b":{"p":"/empty","h":""}}}"#)
            #expect(c.messages(until: #""r":3"#) == [ok(3)])
            // Nothing cached, data there; a stale cache; a hash that is not one: data, then ok.
            let stale = try Tree(json: #"{"a":1}"#).hashString
            for (r, path, hash) in [(4, "/h/b", ""), (5, "/h/b", stale), (6, "/h/b", "not a hash")] {
                c.text(#"{"t":"d","d":{"r":\#(r),"a":"q","b":{"p":"\#(path)","h":"\#(hash)"}}}"#)
                #expect(c.messages(until: #""r":\#(r)""#) == [#"{"t":"d","d":{"a":"d","b":{"p":"h/b","d":{"c":"x"}}}}"#, ok(r)], "request \(r)")
            }
            // A tagged window (the first child by key): its own hash, not the location's.
            let window = try Tree(json: #"{"a":1}"#).hashString
            c.text(#"{"t":"d","d":{"r":7,"a":"q","b":{"p":"/h","q":{"i":".key","l":1,"vf":"l"},"t":3,"h":"\#(window)"}}}"#)
            #expect(c.messages(until: #""r":7"#) == [ok(7)])
            c.text(#"{"t":"d","d":{"r":8,"a":"q","b":{"p":"/h","q":{"i":".key","l":2,"vf":"l"},"t":4,"h":"\#(window)"}}}"#)
            let second = c.messages(until: #""r":8"#)
            #expect(second.count == 2 && second.first?.contains(#""t":4"#) == true, "\(second)")
            // A listen answered with its ok alone still gets later changes.
            c.text(#"{"t":"d","d":{"r":9,"a":"p","b":{"p":"/h/a","d":10}}}"#)
            let after = c.messages(until: #""r":9"#)
            #expect(after.contains(#"{"t":"d","d":{"a":"d","b":{"p":"h/a","d":10}}}"#), "\(after)")
            _ = node
        }
    }

    @Test("a compare-and-set put: datastale after the current value was pushed, ok when the hash matches")
    func transactions() throws {
        try withNode("rt-tx") { port in
            let (c, _) = try open(port)
            c.text(#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/counter","d":5}}}"#)
            #expect(c.message() == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":""}}}"#)
            c.text(#"{"t":"d","d":{"r":2,"a":"q","b":{"p":"/counter","h":""}}}"#)
            #expect(c.messages(until: #""r":2"#).count == 2)
            let stale = Tree(.int(4)).hashString
            c.text(#"{"t":"d","d":{"r":3,"a":"p","b":{"p":"/counter","d":6,"h":"\#(stale)"}}}"#)
            let answer = c.message() ?? ""
            #expect(answer.hasPrefix(#"{"t":"d","d":{"r":3,"b":{"s":"datastale""#), "\(answer)")
            let current = Tree(.int(5)).hashString
            c.text(#"{"t":"d","d":{"r":4,"a":"p","b":{"p":"/counter","d":6,"h":"\#(current)"}}}"#)
            #expect(c.messages(until: #""r":4"#) == [#"{"t":"d","d":{"a":"d","b":{"p":"counter","d":6}}}"#, #"{"t":"d","d":{"r":4,"b":{"s":"ok","d":""}}}"#])
        }
    }

    @Test("bad input gets an answer in the protocol's shape and the connection goes on; unanswerable input closes it")
    func badInput() throws {
        try withNode("rt-bad") { port in
            let (c, _) = try open(port)
            let cases: [(String, String)] = [
                (#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/a","d":{"x":}}}}"#, #""r":1,"b":{"s":"failure""#),  // malformed JSON
                (#"{"t":"d","d":{"r":2,"a":"zz","b":{}}}"#, #""r":2,"b":{"s":"failure""#),  // unknown action
                (#"{"t":"d","d":{"r":3,"a":"p","b":{"p":"/a/b.c","d":1}}}"#, #""r":3,"b":{"s":"failure""#),  // invalid path
                (#"{"t":"d","d":{"r":4,"a":"q","b":{"p":"/a","q":{"i":5},"t":1,"h":""}}}"#, #""r":4,"b":{"s":"failure""#),  // bad query
                (#"{"t":"d","d":{"r":5,"a":"o","b":{"p":"/a","d":{".sv":"nope"}}}}"#, #""r":5,"b":{"s":"failure""#),  // bad server value
            ]
            for (input, expected) in cases {
                c.text(input)
                let answer = c.message() ?? "<nothing>"
                #expect(answer.contains(expected), "\(input) → \(answer)")
            }
            // Still working.
            c.text(#"{"t":"d","d":{"r":6,"a":"p","b":{"p":"/a","d":1}}}"#)
            #expect(c.message() == #"{"t":"d","d":{"r":6,"b":{"s":"ok","d":""}}}"#)
            // A message with no request number to answer: an `e` control message, then the close.
            c.text("this is not json")
            #expect(c.message()?.hasPrefix(#"{"t":"c","d":{"t":"e""#) == true)
            #expect(c.waitClosed())

            // A frame larger than the limit (announced by its header): closed with 1009.
            let (big, _) = try open(port)
            big.sendRaw([0x81, 0x80 | 127, 0, 0, 0, 0, 0x02, 0, 0, 0, 1, 2, 3, 4])  // 32 MiB announced
            let close = big.next()
            #expect(close?.opcode == 8 && close.map { Int($0.payload[0]) << 8 | Int($0.payload[1]) } == 1009, "\(String(describing: close))")
            // A binary frame: closed with 1003 after an error message.
            let (binary, _) = try open(port)
            binary.frame(opcode: 2, [1, 2, 3])
            #expect(binary.message()?.contains(#""t":"e""#) == true)
            #expect(binary.waitClosed())
            // The data is intact.
            let (after, _) = try open(port)
            after.text(#"{"t":"d","d":{"r":1,"a":"g","b":{"p":"/a","q":{}}}}"#)
            #expect(after.message() == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":1}}}"#)
        }
    }

    @Test("bad upgrades are refused with an HTTP status and a Firebase-shaped body")
    func badUpgrades() throws {
        try withNode("rt-upgrade") { port in
            let v4 = try Client(port: port, target: "/.ws?v=4&ns=rt")
            #expect(v4.head().hasPrefix("HTTP/1.1 400"))
            let noUpgrade = try Client(port: port, target: "/.ws?v=5", extraHeaders: "")
            #expect(noUpgrade.head().hasPrefix("HTTP/1.1 400"))
            let longPoll = try Client(port: port, target: "/.lp?v=5&ns=rt")
            #expect(longPoll.head().hasPrefix("HTTP/1.1 404"))
            let badNamespace = try Client(port: port, target: "/.ws?v=5&ns=no.dots")
            #expect(badNamespace.head().hasPrefix("HTTP/1.1 400"))
        }
    }

    @Test("onDisconnect writes fire when the connection closes, and at once when a new connection names it with ls")
    func onDisconnect() throws {
        try withNode("rt-ondisconnect") { port in
            let (watcher, _) = try open(port)
            watcher.text(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/presence","h":""}}}"#)
            #expect(watcher.messages(until: #""r":1"#).count == 1, "nothing there: the ok alone")

            // Closed by the client: its queue fires once.
            do {
                let (a, _) = try open(port)
                a.text(#"{"t":"d","d":{"r":1,"a":"o","b":{"p":"/presence/a","d":"offline"}}}"#)
                a.text(#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/presence/a","d":"online"}}}"#)
                #expect(a.messages(until: #""r":2"#).last == #"{"t":"d","d":{"r":2,"b":{"s":"ok","d":""}}}"#)
                #expect(watcher.message() == #"{"t":"d","d":{"a":"d","b":{"p":"presence/a","d":"online"}}}"#)
            }
            #expect(watcher.message() == #"{"t":"d","d":{"a":"d","b":{"p":"presence/a","d":"offline"}}}"#)

            // Still open, but the client reconnects naming it: the old queue fires first, and the old
            // connection is closed.
            let (b, session) = try open(port)
            b.text(#"{"t":"d","d":{"r":1,"a":"o","b":{"p":"/presence/b","d":"offline"}}}"#)
            b.text(#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/presence/b","d":"online"}}}"#)
            #expect(b.messages(until: #""r":2"#).count == 2)
            #expect(watcher.message() == #"{"t":"d","d":{"a":"d","b":{"p":"presence/b","d":"online"}}}"#)
            let (b2, _) = try open(port, target: "/.ws?v=5&ns=rt&ls=\(session)")
            #expect(watcher.message() == #"{"t":"d","d":{"a":"d","b":{"p":"presence/b","d":"offline"}}}"#)
            #expect(b.waitClosed())
            b2.text(#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/presence/b","d":"back"}}}"#)
            #expect(b2.message() == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":""}}}"#)
            #expect(watcher.message() == #"{"t":"d","d":{"a":"d","b":{"p":"presence/b","d":"back"}}}"#)
            // Nothing fires twice: the old connection's own close added nothing.
            #expect(watcher.message(seconds: 1) == nil)
        }
    }

    @Test("public_host names the hello's host whatever the request's Host was")
    func publicHost() throws {
        try withNode("rt-public-host", configure: { $0.publicHost = "db.example.com:8443" }) { port, _ in
            let c = try Client(port: port)
            #expect(c.head().hasPrefix("HTTP/1.1 101"))
            let hello = try JSONValue(parsing: c.message() ?? "")
            #expect(hello["d"]?["d"]?["h"] == .string("db.example.com:8443"), "\(hello)")
        }
    }

    @Test("a connection ended in the log through another node (its client reconnected there with ls) is closed here, even one that only listens")
    func endedElsewhere() throws {
        try withNode("rt-ended-elsewhere") { port, node in
            let (watcher, _) = try open(port)
            watcher.text(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/presence","h":""}}}"#)
            #expect(watcher.messages(until: #""r":1"#).count == 1, "nothing there: the ok alone")
            let (a, session) = try open(port)
            a.text(#"{"t":"d","d":{"r":1,"a":"o","b":{"p":"/presence/a","d":"offline"}}}"#)
            a.text(#"{"t":"d","d":{"r":2,"a":"q","b":{"p":"/elsewhere","h":""}}}"#)
            #expect(a.messages(until: #""r":2"#).count == 2)
            let identity = try #require(SessionIdentity(parsing: session[...]))
            // What another node proposes for an `ls` naming this connection.
            let result = try node.runtime.write(
                namespace: "rt", command: .connectionEnded(connection: identity.connection, secret: identity.secret)
            ).wait()
            guard case .success(let applied) = result else {
                Issue.record("the end did not apply: \(result)")
                return
            }
            #expect(applied.outcome == .ok)
            #expect(applied.ended == [identity.connection])
            #expect(watcher.message() == #"{"t":"d","d":{"a":"d","b":{"p":"presence/a","d":"offline"}}}"#)
            #expect(a.waitClosed(), "the node closes a connection ended in the log")
            // Its own end afterwards fires nothing again.
            #expect(watcher.message(seconds: 1) == nil)
        }
    }

    /// One HTTP request on its own connection (`Connection: close`): the status and the body.
    func http(_ port: Int, _ method: String, _ path: String, body: String = "") throws -> (status: Int, body: String, raw: String) {
        let fd = try loopbackSocket(port: port, receiveTimeoutMicroseconds: 100_000)
        defer { close(fd) }
        let request =
            "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
        _ = Array(request.utf8).withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { break }
            if n > 0 { bytes += chunk[0..<n] }
        }
        let text = String(decoding: bytes, as: UTF8.self)
        let status = Int(text.split(separator: " ").dropFirst().first ?? "") ?? 0
        let payload = text.range(of: "\r\n\r\n").map { String(text[$0.upperBound...]) } ?? ""
        return (status, payload, text)
    }

    @Test("drain: open connections are told to reconnect elsewhere (r) once their requests are answered, new ones are sent on before the hello, ready answers 503; targets must answer ready and not be this node; stopping restores all")
    func drain() throws {
        try withNode("rt-drain-target") { targetPort, _ in
            try withNode("rt-drain") { port, _ in
                let target = "127.0.0.1:\(targetPort)"
                // The target must answer ready (it has elected itself) before a drain may use it.
                let deadline = Date().addingTimeInterval(10)
                while try http(targetPort, "GET", "/.banyan/ready").status != 200, Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
                let (a, _) = try open(port)
                a.text(#"{"t":"d","d":{"r":1,"a":"q","b":{"p":"/x","h":""}}}"#)
                #expect(a.messages(until: #""r":1"#).count == 1)
                // A single node has no other member to send clients to; named targets must answer
                // ready and must not be this node.
                #expect(try http(port, "POST", "/.banyan/drain").status == 409)
                #expect(try http(port, "POST", "/.banyan/drain", body: #"{"to":"nowhere"}"#).status == 400)
                #expect(try http(port, "POST", "/.banyan/drain", body: #"{"to":["127.0.0.1:1"]}"#).status == 409)
                #expect(try http(port, "POST", "/.banyan/drain", body: #"{"to":["127.0.0.1:\#(port)"]}"#).status == 409)
                #expect(try http(port, "GET", "/.banyan/ready").status == 200, "a refused drain leaves the node ready")
                // A write in flight when the drain starts is answered before the reset.
                a.text(#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/x","d":2}}}"#)
                let started = try http(port, "POST", "/.banyan/drain", body: #"{"to":["\#(target)","127.0.0.1:1"]}"#)
                #expect(started.status == 200, "\(started.body) \(started.raw)")
                #expect(started.body.contains(#""targets":["\#(target)"]"#) && started.body.contains(#""connections":1"#), "\(started.body)")
                let seen = a.messages(until: #""t":"r""#)
                #expect(seen.contains(#"{"t":"d","d":{"r":2,"b":{"s":"ok","d":""}}}"#), "\(seen)")
                #expect(seen.last == #"{"t":"c","d":{"t":"r","d":"\#(target)"}}"#, "\(seen)")
                #expect(a.waitClosed())
                // A new connection: 101, then the reset before any hello, then the close.
                let b = try Client(port: port)
                #expect(b.head().hasPrefix("HTTP/1.1 101"))
                #expect(b.message() == #"{"t":"c","d":{"t":"r","d":"\#(target)"}}"#)
                #expect(b.waitClosed())
                #expect(try http(port, "GET", "/.banyan/ready").status == 503)
                let status = try http(port, "GET", "/.banyan/status").body
                #expect(status.contains(#""draining" : true"#) && status.contains(#""realtime_connections" : 0"#), "\(status)")
                // Stopped: connections get their hello again and the node reports ready.
                #expect(try http(port, "DELETE", "/.banyan/drain").status == 200)
                let (c, session) = try open(port)
                #expect(!session.isEmpty)
                c.text(#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/x","d":1}}}"#)
                #expect(c.messages(until: #""r":1"#).last == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":""}}}"#)
                #expect(try http(port, "GET", "/.banyan/ready").status == 200)
            }
        }
    }

    /// The close code of the next frame, if it is a close.
    func closeCode(_ c: Client) -> Int? {
        guard let frame = c.next(), frame.opcode == 8, frame.payload.count >= 2 else { return nil }
        return Int(frame.payload[0]) << 8 | Int(frame.payload[1])
    }

    @Test("the node-wide budget for messages being assembled: a connection whose chunk or fragment does not fit is closed with 1013, the others finish theirs, and the bytes come back")
    func assemblingBudget() throws {
        try withNode("rt-assembling", configure: { $0.http.maxAssemblingBytes = 1 << 20 }) { port, node in
            let value = String(repeating: "x", count: 1_200_000)
            let message = Array(#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/big","d":"\#(value)"}}}"#.utf8)
            let third = message.count / 3 + 1
            let chunks = stride(from: 0, to: message.count, by: third).map { Array(message[$0..<min(message.count, $0 + third)]) }
            #expect(chunks.count == 3)
            // Protocol-level chunks: A holds two thirds (about 800 KB); B's first third does not fit.
            let (a, _) = try open(port)
            a.text("3")
            a.frame(opcode: 1, chunks[0])
            a.frame(opcode: 1, chunks[1])
            let (b, _) = try open(port)
            b.text("3")
            b.frame(opcode: 1, chunks[0])
            #expect(closeCode(b) == 1013)
            #expect(b.waitClosed())
            // A finishes: its write applies and its bytes come back.
            a.frame(opcode: 1, chunks[2])
            #expect(a.message(seconds: 20) == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":""}}}"#)
            #expect(node.http.assembling.bytes == 0)
            // Now the same fits.
            let (c, _) = try open(port)
            c.text("3")
            for chunk in chunks { c.frame(opcode: 1, chunk) }
            #expect(c.message(seconds: 20) == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":""}}}"#)
            // WebSocket fragments count too (they wait in the aggregator).
            let (d, _) = try open(port)
            d.frame(opcode: 1, Array(message[0..<700_000]), fin: false)
            let (e, _) = try open(port)
            e.frame(opcode: 1, Array(message[0..<700_000]), fin: false)
            #expect(closeCode(e) == 1013)
            d.frame(opcode: 0, Array(message[700_000...]), fin: true)
            #expect(d.message(seconds: 20) == #"{"t":"d","d":{"r":1,"b":{"s":"ok","d":""}}}"#)
            // A connection that goes away mid-message gives its bytes back.
            do {
                let (f, _) = try open(port)
                f.text("3")
                f.frame(opcode: 1, chunks[0])
                _ = f.message(seconds: 0.5)
            }
            let deadline = Date().addingTimeInterval(10)
            while node.http.assembling.bytes != 0, Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
            #expect(node.http.assembling.bytes == 0)
        }
    }

    @Test("a flood of listens: past 1,000 unanswered the node stops reading the connection, answers them all in order, reads again; the connection stays usable")
    func listenFlood() throws {
        try withNode("rt-flood") { port in
            let (c, _) = try open(port)
            let count = 1_500
            // All sent before any answer is read (about 120 KB: the socket buffers hold it).
            for r in 1...count { c.text(#"{"t":"d","d":{"r":\#(r),"a":"q","b":{"p":"/flood/l\#(r)","h":""}}}"#) }
            var oks: [Int] = []
            let deadline = Date().addingTimeInterval(60)
            while oks.count < count, Date() < deadline, let m = c.message(seconds: 10) {
                guard m.hasPrefix(#"{"t":"d","d":{"r":"#) else { continue }
                let digits = m.dropFirst(18).prefix { $0.isNumber }
                if let r = Int(digits), m.contains(#""s":"ok""#) { oks.append(r) }
            }
            #expect(oks == Array(1...count), "\(oks.count) answers, first out of order at \(String(describing: zip(oks, 1...count).first { $0 != $1 }))")
            c.text(#"{"t":"c","d":{"t":"p","d":{}}}"#)
            #expect(c.message() == #"{"t":"c","d":{"t":"o","d":null}}"#)
        }
    }
}
