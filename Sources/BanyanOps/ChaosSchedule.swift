public import BanyanBasics

/// A seeded schedule of faults for `banyan chaos run` and `check` (docs/chaos.md): the same seed
/// gives the same sequence of kinds, roles, shapes, delays and durations. Which node a role names
/// (the leader, the n-th follower) is resolved when the fault is applied, from the cluster as it
/// is then; the printed schedule names both.
public struct ChaosSchedule: Sendable {
    public enum Kind: String, CaseIterable, Sendable {
        /// kill -9, then a restart with the same arguments.
        case kill
        /// SIGSTOP, then SIGCONT.
        case pause
        /// Peer traffic dropped (the target isolated, or one link cut), then healed.
        case partition
        /// Peer messages and/or fsyncs of the target delayed, then back to full speed.
        case slow
    }

    /// Whom a fault hits.
    public enum Role: Sendable, Equatable, CustomStringConvertible {
        case leader
        /// The `pick % followers.count`-th follower (in id order).
        case follower(pick: Int)

        public var description: String {
            switch self {
            case .leader: return "the leader"
            case .follower: return "a follower"
            }
        }
    }

    public enum Shape: Sendable, Equatable {
        /// The target alone on one side, everyone else on the other.
        case isolate
        /// Only the link between the target and the `pick % others.count`-th other node is cut:
        /// both still reach everyone else (a "bridge": no side is cut off).
        case bridge(pick: Int)
    }

    public enum SlowPath: String, Sendable {
        case peer, disk, both
    }

    public struct Step: Sendable, Equatable {
        public var kind: Kind
        public var role: Role
        public var shape: Shape = .isolate
        public var delayMilliseconds = 0
        public var slowPath: SlowPath = .both
        /// How long the fault lasts before it is healed.
        public var holdMilliseconds: Int
        /// The pause after the cluster recovered, before the next fault.
        public var gapMilliseconds: Int
    }

    public let seed: UInt64
    public let kinds: [Kind]
    private var random: SeededRandom

    /// `kinds`: the fault kinds to draw from (all by default); `holdMilliseconds` and
    /// `gapMilliseconds`: the ranges durations are drawn from.
    public init(seed: UInt64, kinds: [Kind] = Kind.allCases, holdMilliseconds: ClosedRange<Int> = 2_000...5_000, gapMilliseconds: ClosedRange<Int> = 1_000...3_000) {
        precondition(!kinds.isEmpty, "ChaosSchedule: at least one fault kind")
        self.seed = seed
        self.kinds = kinds
        self.hold = holdMilliseconds
        self.gap = gapMilliseconds
        random = SeededRandom(seed: seed)
    }

    private let hold: ClosedRange<Int>
    private let gap: ClosedRange<Int>

    private mutating func draw(_ range: ClosedRange<Int>) -> Int { range.lowerBound + random.below(range.count) }

    /// The next fault.
    public mutating func next() -> Step {
        let kind = kinds[random.below(kinds.count)]
        // Half the faults hit the leader: that is where failover happens.
        let role: Role = random.chance(1, in: 2) ? .leader : .follower(pick: random.below(1 << 16))
        var step = Step(kind: kind, role: role, holdMilliseconds: draw(hold), gapMilliseconds: draw(gap))
        switch kind {
        case .partition:
            step.shape = random.chance(2, in: 3) ? .isolate : .bridge(pick: random.below(1 << 16))
        case .slow:
            step.slowPath = [SlowPath.peer, .disk, .both][random.below(3)]
            // A delayed fsync holds the node's replica loop (and, on a one-thread node, its
            // client port too): disk delays stay shorter than peer delays.
            step.delayMilliseconds = step.slowPath == .peer ? [50, 100, 250, 500, 1_000][random.below(5)] : [50, 100, 250, 500][random.below(4)]
        case .kill, .pause:
            break
        }
        return step
    }

    /// Parses `kill,pause,partition,slow` (any subset).
    public static func parseKinds(_ text: String) throws(ChaosError) -> [Kind] {
        var kinds: [Kind] = []
        for item in text.split(separator: ",") {
            guard let kind = Kind(rawValue: String(item.filter { $0 != " " })) else {
                throw ChaosError("unknown fault kind '\(item)' (expected some of \(Kind.allCases.map(\.rawValue).joined(separator: ",")))")
            }
            if !kinds.contains(kind) { kinds.append(kind) }
        }
        guard !kinds.isEmpty else { throw ChaosError("--faults needs at least one of \(Kind.allCases.map(\.rawValue).joined(separator: ","))") }
        return kinds
    }
}
