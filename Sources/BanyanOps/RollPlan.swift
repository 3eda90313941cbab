public import Foundation

/// A node as `banyan cluster roll` sees it: the fields of `GET /.banyan/status` that the roll
/// decides on.
public struct RollNode: Sendable, Equatable {
    public var id: UInt64
    public var endpoint: String
    public var role: String
    public var leader: UInt64
    public var term: UInt64
    public var commitIndex: UInt64
    public var appliedIndex: UInt64
    public var voters: [UInt64]
    public var learners: [UInt64]
    public var pid: Int32?
    /// When the process started (Unix ms); nil from nodes that do not say.
    public var startedAtMs: Int64?
    /// The data directory's identity (hexadecimal).
    public var incarnation: String

    public init(
        id: UInt64, endpoint: String, role: String, leader: UInt64, term: UInt64, commitIndex: UInt64, appliedIndex: UInt64, voters: [UInt64],
        learners: [UInt64], pid: Int32?, startedAtMs: Int64?, incarnation: String
    ) {
        self.id = id
        self.endpoint = endpoint
        self.role = role
        self.leader = leader
        self.term = term
        self.commitIndex = commitIndex
        self.appliedIndex = appliedIndex
        self.voters = voters
        self.learners = learners
        self.pid = pid
        self.startedAtMs = startedAtMs
        self.incarnation = incarnation
    }

    /// From the status JSON; nil when a required field is missing.
    public init?(endpoint: String, json: [String: Any]) {
        func number(_ key: String) -> NSNumber? { json[key] as? NSNumber }
        func ids(_ key: String) -> [UInt64]? { (json[key] as? [Any])?.compactMap { ($0 as? NSNumber)?.uint64Value } }
        guard let id = number("node_id")?.uint64Value, let role = json["role"] as? String, let leader = number("leader")?.uint64Value,
            let term = number("term")?.uint64Value, let commit = number("commit_index")?.uint64Value,
            let applied = number("applied_index")?.uint64Value, let voters = ids("voters"), let learners = ids("learners")
        else { return nil }
        self.init(
            id: id, endpoint: endpoint, role: role, leader: leader, term: term, commitIndex: commit, appliedIndex: applied, voters: voters,
            learners: learners, pid: number("pid")?.int32Value, startedAtMs: number("started_at_ms")?.int64Value,
            incarnation: json["incarnation"] as? String ?? "0")
    }

    public var isLeader: Bool { role == "leader" }
}

/// A reason not to start, or to stop, a roll.
public struct RollError: Error, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The decisions of a rolling restart (`banyan cluster roll`, docs/runbook.md "Rolling restart"),
/// apart from the requests and the waiting: which nodes, in which order, where leadership goes,
/// and when a restarted node counts as back. Pure.
public enum RollPlan {
    /// The order to restart in: every member but the leader (learners first, then voters, by
    /// id), the leader last, so leadership moves once. Refused when the nodes do not agree on one
    /// leader, or when a member has no endpoint (the roll would leave it on the old binary).
    public static func order(_ nodes: [RollNode]) throws(RollError) -> [UInt64] {
        let leaders = Set(nodes.map(\.leader))
        guard leaders.count == 1, let leader = leaders.first, leader != 0 else {
            let seen = nodes.sorted { $0.id < $1.id }.map { "node \($0.id): \($0.leader == 0 ? "none" : "\($0.leader)")" }
            throw RollError("the nodes do not agree on a leader (\(seen.joined(separator: ", "))); wait for a stable leader")
        }
        guard let leading = nodes.first(where: { $0.id == leader }) else {
            throw RollError("node \(leader) leads but none of the endpoints is node \(leader); give every member's client address")
        }
        let given = Set(nodes.map(\.id))
        let missing = Set(leading.voters + leading.learners).subtracting(given).sorted()
        guard missing.isEmpty else {
            throw RollError("member\(missing.count == 1 ? "" : "s") \(missing.map { "\($0)" }.joined(separator: ", ")) not among the endpoints; give every member's client address")
        }
        let strangers = given.subtracting(leading.voters + leading.learners).sorted()
        guard strangers.isEmpty else {
            throw RollError("node\(strangers.count == 1 ? "" : "s") \(strangers.map { "\($0)" }.joined(separator: ", ")) answered but \(strangers.count == 1 ? "is" : "are") not a member")
        }
        let learners = leading.learners.sorted()
        let voters = leading.voters.filter { $0 != leader }.sorted()
        return learners + voters + [leader]
    }

    /// The voter to hand leadership to when `leader` must restart: one already restarted if any
    /// (it will not restart again), else any other voter; the one that has applied most first,
    /// then the lowest id. nil when `leader` is the only voter.
    public static func transferTarget(from leader: UInt64, nodes: [RollNode], rolled: Set<UInt64>) -> UInt64? {
        guard let leading = nodes.first(where: { $0.id == leader }) else { return nil }
        let candidates = nodes.filter { $0.id != leader && leading.voters.contains($0.id) }
        return candidates.max { a, b in
            let ka = (rolled.contains(a.id) ? 1 : 0, a.appliedIndex, UInt64.max - a.id)
            let kb = (rolled.contains(b.id) ? 1 : 0, b.appliedIndex, UInt64.max - b.id)
            return ka < kb
        }?.id
    }

    public enum Restart: Sendable, Equatable {
        /// The same process still answers.
        case same
        /// A new process on the same data directory.
        case restarted
        /// A new process on another data directory: the node lost its state (stop the roll).
        case replaced(String)
    }

    /// Whether `now` is a new process of `before`'s node: another start time (or, from nodes
    /// that do not report one, another pid), with the same incarnation.
    public static func restart(before: RollNode, now: RollNode) -> Restart {
        let newProcess: Bool
        if let a = before.startedAtMs, let b = now.startedAtMs {
            newProcess = a != b || before.pid != now.pid
        } else {
            newProcess = before.pid != now.pid
        }
        guard newProcess else { return .same }
        guard before.incarnation == now.incarnation else {
            return .replaced("node \(now.id) came back with incarnation \(now.incarnation), not \(before.incarnation): its data directory was replaced")
        }
        return .restarted
    }

    /// A restarted node is caught up once it knows a leader and has applied `target`, the
    /// leader's commit index when the node came back.
    public static func caughtUp(_ node: RollNode, target: UInt64) -> Bool {
        node.leader != 0 && node.appliedIndex >= target
    }

    /// Leadership as the nodes that answered report it: the highest term any of them knows and
    /// the leader of that term (0: none known).
    public struct Leadership: Sendable, Equatable, CustomStringConvertible {
        public var term: UInt64
        public var leader: UInt64

        public init(term: UInt64, leader: UInt64) {
            self.term = term
            self.leader = leader
        }

        /// From statuses; nodes behind on the term do not name its leader. Nil when none answered.
        public init?(_ nodes: [RollNode]) {
            guard let term = nodes.map(\.term).max() else { return nil }
            let current = nodes.filter { $0.term == term }
            self.term = term
            leader = current.first(where: \.isLeader)?.id ?? current.first(where: { $0.leader != 0 })?.leader ?? 0
        }

        public var description: String { "term \(term), leader \(leader == 0 ? "unknown" : "node \(leader)")" }
    }

    /// Leader changes between two observations: each new term elects at most one leader, so the
    /// terms that passed bound them (a term that elected no one counts too: its election held
    /// writes up). A term that went backwards (the nodes that answered later know less, e.g.
    /// the most advanced one was down) counts nothing rather than wrapping.
    public static func leaderChanges(from before: Leadership, to after: Leadership) -> UInt64 {
        if after.term > before.term { return after.term - before.term }
        return after.term == before.term && after.leader != before.leader && before.leader != 0 && after.leader != 0 ? 1 : 0
    }

    /// Substitutes `{id}`, `{host}`, `{endpoint}` and `{pid}` in a restart command.
    public static func command(_ template: String, node: RollNode) -> String {
        var address = Substring(node.endpoint)
        if let scheme = address.range(of: "://") { address = address[scheme.upperBound...] }
        // Everything before the port's colon ("[::1]:9000" keeps its brackets).
        let host = address.lastIndex(of: ":").map { String(address[..<$0]) } ?? ""
        return template.replacingOccurrences(of: "{id}", with: "\(node.id)").replacingOccurrences(of: "{host}", with: host.isEmpty ? node.endpoint : host)
            .replacingOccurrences(of: "{endpoint}", with: node.endpoint).replacingOccurrences(of: "{pid}", with: node.pid.map { "\($0)" } ?? "")
    }
}
