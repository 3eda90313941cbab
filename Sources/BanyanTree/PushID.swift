public import BanyanBasics

/// Generates Firebase push ids: 8 characters of millisecond timestamp then 12 random characters,
/// from a 64-character alphabet in ASCII order, so ids sort chronologically.
///
/// Within one millisecond (or if the clock steps back) the previous random part is incremented
/// instead of redrawn, so ids from one generator strictly increase. The clock and the random source
/// are injected (`now` is an argument; randomness is a `SeededRandom`).
public struct PushIDGenerator: Sendable {
    public static let alphabet: [UInt8] = Array("-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz".utf8)

    private var random: SeededRandom
    private var lastTime: Int64 = Int64.min
    private var lastRandom: [Int] = Array(repeating: 0, count: 12)

    public init(random: SeededRandom) {
        self.random = random
    }

    /// The next id for time `now` (milliseconds since the Unix epoch).
    public mutating func next(now: Int64) -> String {
        // Eight base-64 digits hold 48 bits of milliseconds (until the year 10889).
        var time = Swift.min(Swift.max(now, 0), PushIDGenerator.maxTime)
        if time <= lastTime {
            time = lastTime
            // Increment the 12-digit base-64 random part; on overflow move to the next millisecond.
            var i = 11
            while i >= 0 && lastRandom[i] == 63 {
                lastRandom[i] = 0
                i -= 1
            }
            if i >= 0 {
                lastRandom[i] += 1
            } else {
                time = Swift.min(time + 1, PushIDGenerator.maxTime)
                for j in 0..<12 { lastRandom[j] = random.below(64) }
            }
        } else {
            for j in 0..<12 { lastRandom[j] = random.below(64) }
        }
        lastTime = time
        return PushIDGenerator.format(time: time, random: lastRandom)
    }

    static let maxTime: Int64 = (1 << 48) - 1

    static func format(time: Int64, random: [Int]) -> String {
        var chars = [UInt8](repeating: 0, count: 20)
        var t = time
        for i in stride(from: 7, through: 0, by: -1) {
            chars[i] = alphabet[Int(t % 64)]
            t /= 64
        }
        for j in 0..<12 { chars[8 + j] = alphabet[random[j]] }
        return String(decoding: chars, as: UTF8.self)
    }

    /// The millisecond timestamp encoded in a push id, or nil if `id` is not one.
    public static func timestamp(of id: String) -> Int64? {
        let bytes = Array(id.utf8)
        guard bytes.count == 20 else { return nil }
        var t: Int64 = 0
        for b in bytes[0..<8] {
            guard let v = alphabet.firstIndex(of: b) else { return nil }
            t = t * 64 + Int64(v)
        }
        for b in bytes[8...] where !alphabet.contains(b) { return nil }
        return t
    }
}
