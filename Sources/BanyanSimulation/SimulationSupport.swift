import BanyanBasics
public import BanyanCheckers

/// What both simulators share: the trace of a run (a hash of every event, and the lines when
/// asked for), shuffling with a seeded source, and the per-key linearizability verdict.
struct TraceRecorder {
    private(set) var hash: UInt64 = 0
    private(set) var lines: [String] = []
    let keepLines: Bool

    init(keepLines: Bool) { self.keepLines = keepLines }

    /// Mixes the event (its time and two identifying numbers) into the hash; keeps its line when
    /// tracing (the text is built only then).
    mutating func record(now: Int, _ text: @autoclosure () -> String, _ a: UInt64, _ b: UInt64) {
        var h = hash ^ UInt64(truncatingIfNeeded: now)
        h = (h &* 0x100_0000_01B3) ^ a
        h = (h &* 0x100_0000_01B3) ^ b
        hash = h &* 0x100_0000_01B3
        if keepLines { lines.append("\(now) \(text())") }
    }
}

extension SeededRandom {
    /// A Fisher–Yates shuffle drawn from this source.
    mutating func shuffled<T>(_ items: [T]) -> [T] {
        var a = items
        if a.count < 2 { return a }
        for i in stride(from: a.count - 1, to: 0, by: -1) { a.swapAt(i, below(i + 1)) }
        return a
    }
}

typealias RegisterHistory = [HistoryOperation<RegisterModel.Input, RegisterModel.Output>]

/// Checks each key's register history (WGL); the verdict is the worst one, with the keys that
/// are not linearizable.
func registerVerdict(_ byKey: [Int: RegisterHistory], maxSteps: Int = 5_000_000) -> (LinearizabilityVerdict, [Int]) {
    var verdict = LinearizabilityVerdict.linearizable
    var bad: [Int] = []
    for key in byKey.keys.sorted() {
        guard let ops = byKey[key] else { continue }
        switch LinearizabilityChecker.checkRegister(ops, maxSteps: maxSteps) {
        case .linearizable: break
        case .notLinearizable:
            verdict = .notLinearizable
            bad.append(key)
        case .unknown:
            if verdict == .linearizable { verdict = .unknown }
        }
    }
    return (verdict, bad)
}
