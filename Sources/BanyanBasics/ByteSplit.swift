extension Substring {
    /// Splits at every occurrence of the ASCII byte `separator`, comparing UTF-8 bytes rather
    /// than `Character`s: no grapheme breaking (much cheaper), and a separator followed by a
    /// combining mark still separates, as in Firebase, which splits paths on code units. The
    /// pieces share this substring's storage. Semantics of `maxSplits` and `omittingEmpty` are
    /// those of `split(separator:maxSplits:omittingEmptySubsequences:)`.
    public func splitting(atByte separator: UInt8, maxSplits: Int = .max, omittingEmpty: Bool) -> [Substring] {
        precondition(separator < 0x80, "splitting(atByte:) splits at ASCII bytes only")
        let bytes = utf8
        // Count first, so the pieces take one allocation.
        var separators = 0
        for byte in bytes where byte == separator && separators < maxSplits { separators += 1 }
        var pieces: [Substring] = []
        pieces.reserveCapacity(separators + 1)
        var start = bytes.startIndex
        var i = start
        while i != bytes.endIndex {
            if bytes[i] == separator && pieces.count < maxSplits {
                if !(omittingEmpty && start == i) { pieces.append(self[start..<i]) }
                i = bytes.index(after: i)
                start = i
            } else {
                i = bytes.index(after: i)
            }
        }
        if !(omittingEmpty && start == bytes.endIndex) { pieces.append(self[start..<bytes.endIndex]) }
        return pieces
    }
}

extension String {
    /// `Substring.splitting(atByte:maxSplits:omittingEmpty:)` over the whole string.
    public func splitting(atByte separator: UInt8, maxSplits: Int = .max, omittingEmpty: Bool) -> [Substring] {
        self[...].splitting(atByte: separator, maxSplits: maxSplits, omittingEmpty: omittingEmpty)
    }
}
