import CCRC32C

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI, ext4 and etcd's WAL.
/// With the processor's CRC-32C instruction where it has one (x86-64 with SSE 4.2, AArch64 with
/// the CRC extension: every server this runs on), else table-driven, eight bytes per step
/// ("slicing by 8"). Both give the same checksums (`FormatTests`); the instruction is about five
/// times faster, which matters on the replica loop, where every log record is checksummed as it
/// is written (docs/server.md, "Large writes").
public enum CRC32C {
    /// Whether `checksum` uses the processor's instruction (read once).
    public static let usesInstruction: Bool = banyan_crc32c_hw_available() != 0

    static let tables: [[UInt32]] = {
        var tables = [[UInt32]](repeating: [UInt32](repeating: 0, count: 256), count: 8)
        for i in 0..<256 {
            var c = UInt32(i)
            for _ in 0..<8 { c = c & 1 != 0 ? (c >> 1) ^ 0x82F6_3B78 : c >> 1 }
            tables[0][i] = c
        }
        for i in 0..<256 {
            for t in 1..<8 {
                let previous = tables[t - 1][i]
                tables[t][i] = (previous >> 8) ^ tables[0][Int(previous & 0xFF)]
            }
        }
        return tables
    }()

    /// The checksum of `bytes`, continuing from `crc` (start with 0).
    public static func checksum(_ bytes: UnsafeBufferPointer<UInt8>, continuing crc: UInt32 = 0) -> UInt32 {
        guard usesInstruction, let base = bytes.baseAddress else { return tableChecksum(bytes, continuing: crc) }
        return banyan_crc32c_hw(crc, base, bytes.count)
    }

    /// The table-driven checksum (processors without the instruction; tests compare the two).
    public static func tableChecksum(_ bytes: UnsafeBufferPointer<UInt8>, continuing crc: UInt32 = 0) -> UInt32 {
        var c = ~crc
        var i = 0
        let n = bytes.count
        tables.withUnsafeBufferPointer { t in
            let t0 = t[0], t1 = t[1], t2 = t[2], t3 = t[3], t4 = t[4], t5 = t[5], t6 = t[6], t7 = t[7]
            while i + 8 <= n {
                let lo = c ^ (UInt32(bytes[i]) | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2]) << 16 | UInt32(bytes[i + 3]) << 24)
                let hi = UInt32(bytes[i + 4]) | UInt32(bytes[i + 5]) << 8 | UInt32(bytes[i + 6]) << 16 | UInt32(bytes[i + 7]) << 24
                c = t7[Int(lo & 0xFF)] ^ t6[Int((lo >> 8) & 0xFF)] ^ t5[Int((lo >> 16) & 0xFF)] ^ t4[Int(lo >> 24)]
                    ^ t3[Int(hi & 0xFF)] ^ t2[Int((hi >> 8) & 0xFF)] ^ t1[Int((hi >> 16) & 0xFF)] ^ t0[Int(hi >> 24)]
                i += 8
            }
            while i < n {
                c = (c >> 8) ^ t0[Int((c ^ UInt32(bytes[i])) & 0xFF)]
                i += 1
            }
        }
        return ~c
    }

    public static func checksum(_ bytes: [UInt8], continuing crc: UInt32 = 0) -> UInt32 {
        bytes.withUnsafeBufferPointer { checksum($0, continuing: crc) }
    }
}
