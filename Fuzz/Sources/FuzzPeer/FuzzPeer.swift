/// The peer protocol: the hello and its reply, Raft messages (`MessageCodec`), and the framing of
/// the byte stream that carries them (`Framing.nextFrame`).
///
/// Input: a selector byte (low two bits: message, hello, hello reply, or a stream of frames),
/// then the bytes.
///
/// Invariants: whatever decodes encodes to bytes that decode to the same value, and re-encode to
/// themselves; every entry point of the message decoder agrees; frames found lie inside the
/// buffer, in order, each within the size limit, and a frame cut short is waited for.
import BanyanBasics
import BanyanRaft
import FuzzSupport

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPeer(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzEntry(data, size) { selector, rest in
        switch selector & 3 {
        case 0: checkMessage(rest)
        case 1:
            guard let hello = try? PeerHello.decode(rest) else { return }
            require((try? PeerHello.decode(hello.encode())) == hello, "hello does not round-trip")
        case 2:
            guard let reply = try? PeerHelloReply.decode(rest) else { return }
            require((try? PeerHelloReply.decode(reply.encode())) == reply, "hello reply does not round-trip")
        default: checkStream(rest)
        }
    }
}

func checkMessage(_ bytes: [UInt8]) {
    let decoded = Result { () throws(WireError) in try MessageCodec.decode(bytes) }
    let fromSlice = Result { () throws(WireError) in try MessageCodec.decode(([0xEE] + bytes)[1...]) }
    let fromRaw = bytes.withUnsafeBytes { raw in Result { () throws(WireError) in try MessageCodec.decode(raw) } }
    require(decoded == fromSlice && decoded == fromRaw, "the decoder's entry points disagree")
    guard case .success(let message) = decoded else { return }
    let encoded = MessageCodec.encode(message)
    guard let again = try? MessageCodec.decode(encoded) else {
        require(false, "the encoding of a decoded message does not decode")
        return
    }
    require(again == message, "message does not round-trip")
    require(MessageCodec.encode(again) == encoded, "encoding is not stable")
    var framed: [UInt8] = []
    Framing.appendFrame(message, to: &framed)
    require(framed == Framing.frame(encoded), "appendFrame differs from frame(encode)")
}

func checkStream(_ bytes: [UInt8]) {
    var offset = 0
    while true {
        let next: (payload: Range<Int>, next: Int)?
        do {
            next = try Framing.nextFrame(in: bytes, from: offset)
        } catch {
            return  // a length over the limit: the connection closes
        }
        guard let next else {
            require(bytes.count - offset < 4 || bytes.count - offset - 4 < Int(bytes[offset..<offset + 4].reversed().reduce(0) { $0 << 8 | UInt32($1) }),
                "a complete frame was not found")
            return
        }
        require(next.payload.lowerBound == offset + 4 && next.payload.upperBound == next.next && next.next <= bytes.count, "frame bounds")
        require(next.payload.count <= Framing.maxFrameBytes, "frame over the limit")
        let payload = Array(bytes[next.payload])
        if offset == 0 {
            _ = try? PeerHello.decode(payload)
        } else {
            checkMessage(payload)
        }
        offset = next.next
    }
}
