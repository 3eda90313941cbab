import BanyanBasics
import Testing

@Suite struct ByteCodecTests {
    @Test("every field reads back what was written, little-endian")
    func roundTrip() throws {
        var w = ByteWriter()
        w.u8(7); w.bool(true); w.u16(0x0102); w.u32(0x0304_0506); w.u64(.max - 1); w.i64(-42); w.f64(-0.5)
        w.bytes([1, 2, 3]); w.string("trunk 🌳"); w.u64s([9, 8]); w.raw([0xBA, 0x4E])
        let bytes = w.finish()
        #expect(Array(bytes[2..<4]) == [0x02, 0x01])
        let fields = try ByteReader.readAll(bytes) { (r) throws(ByteCodecError) in
            (try r.u8("a"), try r.bool("b"), try r.u16("c"), try r.u32("d"), try r.u64("e"), try r.i64("f"),
             try r.f64("g"), try r.bytes("h"), try r.string("i"), try r.u64s("j"), Array(try r.raw("k", count: 2)))
        }
        #expect(fields.0 == 7 && fields.1 && fields.2 == 0x0102 && fields.3 == 0x0304_0506)
        #expect(fields.4 == .max - 1 && fields.5 == -42 && fields.6 == -0.5)
        #expect(fields.7 == [1, 2, 3] && fields.8 == "trunk 🌳" && fields.9 == [9, 8] && fields.10 == [0xBA, 0x4E])
    }

    @Test("every prefix of a valid input is a typed error naming a field, never a trap")
    func prefixes() {
        var w = ByteWriter()
        w.u64(5); w.bytes([1, 2, 3]); w.string("x"); w.u64s([1, 2])
        let bytes = w.finish()
        for cut in 0..<bytes.count {
            let prefix = Array(bytes[0..<cut])
            #expect(throws: ByteCodecError.self) {
                _ = try ByteReader.readAll(prefix) { (r) throws(ByteCodecError) in
                    (try r.u64("n"), try r.bytes("b"), try r.string("s"), try r.u64s("ids"))
                }
            }
        }
    }

    @Test("a huge count is refused before anything is allocated")
    func hugeCounts() {
        var w = ByteWriter()
        w.u64(.max)
        let bytes = w.finish()
        #expect(throws: ByteCodecError.tooLarge(field: "ids", count: .max)) {
            _ = try ByteReader.readAll(bytes) { (r) throws(ByteCodecError) in try r.u64s("ids") }
        }
        #expect(throws: ByteCodecError.tooLarge(field: "run", count: .max)) {
            _ = try ByteReader.readAll(bytes) { (r) throws(ByteCodecError) in try r.bytes("run") }
        }
    }

    @Test("bad booleans, bad UTF-8, bad magic and trailing bytes are typed errors")
    func badValues() {
        #expect(throws: ByteCodecError.badValue(field: "flag")) {
            _ = try ByteReader.readAll([2]) { (r) throws(ByteCodecError) in try r.bool("flag") }
        }
        #expect(throws: ByteCodecError.badValue(field: "name")) {
            _ = try ByteReader.readAll([1, 0, 0, 0, 0, 0, 0, 0, 0xFF]) { (r) throws(ByteCodecError) in try r.string("name") }
        }
        // ASCII takes a path of its own: text that turns non-ASCII late is still checked.
        #expect(throws: ByteCodecError.badValue(field: "name")) {
            _ = try ByteReader.readAll([3, 0, 0, 0, 0, 0, 0, 0, 0x61, 0x62, 0xC3]) { (r) throws(ByteCodecError) in try r.string("name") }
        }
        #expect(throws: ByteCodecError.badValue(field: "name")) {
            _ = try ByteReader.readAll([2, 0, 0, 0, 0, 0, 0, 0, 0xC0, 0xAF]) { (r) throws(ByteCodecError) in try r.string("name") }
        }
        #expect((try? ByteReader.readAll([3, 0, 0, 0, 0, 0, 0, 0, 0x61, 0x2F, 0x7F]) { (r) throws(ByteCodecError) in try r.string("name") }) == "a/\u{7F}")
        #expect(throws: ByteCodecError.badMagic(field: "hello")) {
            _ = try ByteReader.readAll([1, 2]) { (r) throws(ByteCodecError) in try r.magic([1, 3], "hello") }
        }
        #expect(throws: ByteCodecError.trailingBytes(1)) {
            _ = try ByteReader.readAll([1, 2]) { (r) throws(ByteCodecError) in try r.u8("one") }
        }
    }

    @Test("random bytes never trap the reader", arguments: [1, 2, 3] as [UInt64])
    func randomInput(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        for _ in 0..<5_000 {
            let bytes = (0..<random.below(40)).map { _ in UInt8(truncatingIfNeeded: random.next()) }
            _ = try? ByteReader.readAll(bytes) { (r) throws(ByteCodecError) in
                (try r.bool("b"), try r.string("s"), try r.u64s("ids"), try r.f64("d"))
            }
        }
    }

    @Test("patch overwrites an integer written earlier")
    func patching() throws {
        var w = ByteWriter()
        w.u32(0); w.string("body")
        w.patch(UInt32(w.count - 4), at: 0)
        let bytes = w.finish()
        let length = try ByteReader.readAll(Array(bytes[0..<4])) { (r) throws(ByteCodecError) in try r.u32("length") }
        #expect(Int(length) == bytes.count - 4)
    }

    @Test("varints: LEB128 bytes, every width round-trips, overlong and truncated ones are typed errors")
    func varints() throws {
        let cases: [(UInt64, [UInt8])] = [
            (0, [0]), (1, [1]), (127, [0x7F]), (128, [0x80, 0x01]), (300, [0xAC, 0x02]),
            (UInt64.max, [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]),
        ]
        for (value, expected) in cases {
            var w = ByteWriter()
            w.varint(value)
            let bytes = w.finish()
            #expect(bytes == expected, "\(value)")
            #expect(try ByteReader.readAll(bytes) { (r) throws(ByteCodecError) in try r.varint("n") } == value)
            for cut in 0..<bytes.count {
                #expect(throws: ByteCodecError.truncated(field: "n")) {
                    _ = try ByteReader.readAll(Array(bytes[0..<cut])) { (r) throws(ByteCodecError) in try r.varint("n") }
                }
            }
        }
        for shift in stride(from: 0, to: 64, by: 7) {
            let value = UInt64(1) << UInt64(shift)
            var w = ByteWriter()
            w.varint(value - 1); w.varint(value); w.u8(9)
            let bytes = w.finish()
            let read = try ByteReader.readAll(bytes) { (r) throws(ByteCodecError) in (try r.varint("a"), try r.varint("b"), try r.u8("c")) }
            #expect(read.0 == value - 1 && read.1 == value && read.2 == 9)
        }
        // Beyond 64 bits: a tenth byte above 1, or an eleventh byte.
        let tooWide: [UInt8] = Array(repeating: 0xFF, count: 9) + [0x02]
        #expect(throws: ByteCodecError.badValue(field: "n")) {
            _ = try ByteReader.readAll(tooWide) { (r) throws(ByteCodecError) in try r.varint("n") }
        }
        let tooLong: [UInt8] = Array(repeating: 0x80, count: 10) + [0x00]
        #expect(throws: ByteCodecError.badValue(field: "n")) {
            _ = try ByteReader.readAll(tooLong) { (r) throws(ByteCodecError) in try r.varint("n") }
        }
    }
}
