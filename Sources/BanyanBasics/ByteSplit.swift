extension UnsafeBufferPointer where Element == UInt8 {
    /// The ranges of the pieces between occurrences of the ASCII byte `separator`: one pass, one
    /// allocation. `maxSplits` and `omittingEmpty` mean what they mean for
    /// `split(separator:maxSplits:omittingEmptySubsequences:)`. Every byte splitter of the
    /// project (paths, query strings, tokens, key files) is built on this.
    public func ranges(separatedBy separator: UInt8, maxSplits: Int = .max, omittingEmpty: Bool) -> [Range<Int>] {
        precondition(separator < 0x80, "ranges(separatedBy:) splits at ASCII bytes only")
        // Count first, so the ranges take one allocation.
        var separators = 0
        for byte in self where byte == separator && separators < maxSplits { separators += 1 }
        var ranges: [Range<Int>] = []
        ranges.reserveCapacity(separators + 1)
        var start = 0
        // As in `split`: with `omittingEmpty`, an empty piece left out is not a split.
        for i in 0..<count where ranges.count < maxSplits && self[i] == separator {
            if !(omittingEmpty && start == i) { ranges.append(start..<i) }
            start = i + 1
        }
        if !(omittingEmpty && start == count) { ranges.append(start..<count) }
        return ranges
    }
}

extension Substring {
    /// Splits at every occurrence of the ASCII byte `separator`, comparing UTF-8 bytes rather
    /// than `Character`s: no grapheme breaking (much cheaper), and a separator followed by a
    /// combining mark still separates, as in Firebase, which splits paths on code units. The
    /// pieces share this substring's storage. Semantics of `maxSplits` and `omittingEmpty` are
    /// those of `split(separator:maxSplits:omittingEmptySubsequences:)`.
    public func splitting(atByte separator: UInt8, maxSplits: Int = .max, omittingEmpty: Bool) -> [Substring] {
        var text = self
        let ranges = text.withUTF8 { $0.ranges(separatedBy: separator, maxSplits: maxSplits, omittingEmpty: omittingEmpty) }
        // `withUTF8` may have made `text` contiguous: cut the pieces from it, at byte offsets
        // (constant time for native strings).
        let bytes = text.utf8
        return ranges.map { range in
            let lower = bytes.index(bytes.startIndex, offsetBy: range.lowerBound)
            let upper = bytes.index(lower, offsetBy: range.count)
            return text[lower..<upper]
        }
    }
}

extension String {
    /// `Substring.splitting(atByte:maxSplits:omittingEmpty:)` over the whole string.
    public func splitting(atByte separator: UInt8, maxSplits: Int = .max, omittingEmpty: Bool) -> [Substring] {
        self[...].splitting(atByte: separator, maxSplits: maxSplits, omittingEmpty: omittingEmpty)
    }
}
