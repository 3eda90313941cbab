/// A deterministic pseudo-random generator (xoshiro256**), seeded from a single `UInt64`.
///
/// Every core that needs randomness stores one of these, so that a run is replayable from its seed.
/// Drivers seed it from the operating system in production; the simulator and tests seed it from
/// the run seed. Not cryptographically secure.
public struct SeededRandom: RandomNumberGenerator, Sendable, Equatable {
    private var s0: UInt64
    private var s1: UInt64
    private var s2: UInt64
    private var s3: UInt64

    /// The seed this generator was created from (for printing and replay).
    public let seed: UInt64

    public init(seed: UInt64) {
        self.seed = seed
        // SplitMix64 expands the seed into the four words of state (never all zero).
        var x = seed
        func splitMix(_ x: inout UInt64) -> UInt64 {
            x &+= 0x9E37_79B9_7F4A_7C15
            var z = x
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        self.s0 = splitMix(&x)
        self.s1 = splitMix(&x)
        self.s2 = splitMix(&x)
        self.s3 = splitMix(&x)
    }

    public mutating func next() -> UInt64 {
        let result = rotl(s1 &* 5, 7) &* 9
        let t = s1 << 17
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = rotl(s3, 45)
        return result
    }

    /// A uniformly distributed integer in `0..<upperBound` (`upperBound > 0`).
    public mutating func below(_ upperBound: Int) -> Int {
        precondition(upperBound > 0, "SeededRandom.below: the bound must be positive")
        return Int(self.next(upperBound: UInt64(upperBound)))
    }

    /// True with probability `numerator / denominator`.
    public mutating func chance(_ numerator: Int, in denominator: Int) -> Bool {
        below(denominator) < numerator
    }

    @inline(__always)
    private func rotl(_ x: UInt64, _ k: UInt64) -> UInt64 {
        (x << k) | (x >> (64 - k))
    }
}
