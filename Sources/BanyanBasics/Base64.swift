/// Base64 for tokens and key files (RFC 4648): decoding accepts both the standard and the URL
/// alphabets, with or without `=` padding (JWTs use the URL alphabet unpadded, PEM the standard
/// one padded); encoding writes the URL alphabet without padding, as JWTs do.
public enum Base64 {
    /// The bytes `text` encodes, or nil when it holds any character outside the two alphabets
    /// and `=` (whitespace included: callers that allow line breaks drop them first).
    public static func decode(_ text: some Sequence<UInt8>) -> [UInt8]? {
        var out: [UInt8] = []
        out.reserveCapacity(text.underestimatedCount * 3 / 4)
        var buffer: UInt32 = 0
        var bits = 0
        for c in text {
            let v: UInt32
            switch c {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): v = UInt32(c - UInt8(ascii: "A"))
            case UInt8(ascii: "a")...UInt8(ascii: "z"): v = UInt32(c - UInt8(ascii: "a")) + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): v = UInt32(c - UInt8(ascii: "0")) + 52
            case UInt8(ascii: "-"), UInt8(ascii: "+"): v = 62
            case UInt8(ascii: "_"), UInt8(ascii: "/"): v = 63
            case UInt8(ascii: "="): continue
            default: return nil
            }
            buffer = (buffer << 6) | v
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: buffer >> UInt32(bits)))
                buffer &= (1 << UInt32(bits)) - 1
            }
        }
        return out
    }

    /// `bytes` in the URL alphabet, unpadded.
    public static func encodeURL(_ bytes: some Sequence<UInt8>) -> String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        var out: [UInt8] = []
        var buffer: UInt32 = 0
        var bits = 0
        for byte in bytes {
            buffer = (buffer << 8) | UInt32(byte)
            bits += 8
            while bits >= 6 {
                bits -= 6
                out.append(alphabet[Int((buffer >> UInt32(bits)) & 0x3F)])
            }
            buffer &= (1 << UInt32(bits)) - 1
        }
        if bits > 0 { out.append(alphabet[Int((buffer << UInt32(6 - bits)) & 0x3F)]) }
        return String(decoding: out, as: UTF8.self)
    }
}
