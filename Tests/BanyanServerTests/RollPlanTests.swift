import BanyanOps
import Testing

/// The decisions of `banyan cluster roll` (docs/runbook.md, "Rolling restart or upgrade").
@Suite struct RollPlanTests {
    static func node(_ id: UInt64, leader: UInt64 = 2, applied: UInt64 = 10, voters: [UInt64] = [1, 2, 3], learners: [UInt64] = [], started: Int64? = 100, pid: Int32? = 7, incarnation: String = "ab") -> RollNode {
        RollNode(
            id: id, endpoint: "10.0.0.\(id):9000", role: id == leader ? "leader" : "follower", leader: leader, term: 4, commitIndex: 10,
            appliedIndex: applied, voters: voters, learners: learners, pid: pid, startedAtMs: started, incarnation: incarnation)
    }

    @Test("followers first (learners, then voters, by id), the leader last")
    func order() throws {
        #expect(try RollPlan.order([Self.node(3), Self.node(2), Self.node(1)]) == [1, 3, 2])
        let withLearner = [4, 1, 2, 3].map { Self.node(UInt64($0), voters: [1, 2, 3], learners: [4]) }
        #expect(try RollPlan.order(withLearner) == [4, 1, 3, 2])
    }

    @Test("refused: no agreed leader, a member without an endpoint, a node that is not a member")
    func refusals() {
        #expect(throws: RollError.self) { try RollPlan.order([Self.node(1), Self.node(2), Self.node(3, leader: 0)]) }
        #expect(throws: RollError.self) { try RollPlan.order([Self.node(1), Self.node(2)]) }
        #expect(throws: RollError.self) { try RollPlan.order([Self.node(1), Self.node(3)]) }
        #expect(throws: RollError.self) { try RollPlan.order([Self.node(1), Self.node(2), Self.node(3), Self.node(5)]) }
    }

    @Test("leadership goes to a restarted voter first, then to the one that applied most")
    func transferTarget() {
        let nodes = [Self.node(1, applied: 9), Self.node(2), Self.node(3, applied: 12), Self.node(4, voters: [1, 2, 3])]
        #expect(RollPlan.transferTarget(from: 2, nodes: nodes, rolled: []) == 3)
        #expect(RollPlan.transferTarget(from: 2, nodes: nodes, rolled: [1]) == 1)
        #expect(RollPlan.transferTarget(from: 2, nodes: [Self.node(2, voters: [2])], rolled: []) == nil)
    }

    @Test("back: a new start time or pid with the same incarnation; another incarnation stops the roll; caught up needs a leader and the target")
    func restartAndCatchUp() {
        let before = Self.node(1)
        #expect(RollPlan.restart(before: before, now: Self.node(1)) == .same)
        #expect(RollPlan.restart(before: before, now: Self.node(1, started: 200)) == .restarted)
        // A container's pid 1 comes back as pid 1: the start time tells.
        #expect(RollPlan.restart(before: Self.node(1, pid: 1), now: Self.node(1, started: 300, pid: 1)) == .restarted)
        #expect(RollPlan.restart(before: Self.node(1, started: nil), now: Self.node(1, started: nil, pid: 8)) == .restarted)
        guard case .replaced = RollPlan.restart(before: before, now: Self.node(1, started: 200, incarnation: "cd")) else {
            Issue.record("a new incarnation must stop the roll")
            return
        }
        #expect(RollPlan.caughtUp(Self.node(1, applied: 10), target: 10))
        #expect(!RollPlan.caughtUp(Self.node(1, applied: 9), target: 10))
        #expect(!RollPlan.caughtUp(Self.node(1, leader: 0, applied: 10), target: 10))
    }

    @Test("restart command placeholders")
    func command() {
        #expect(RollPlan.command("ssh {host} systemctl restart banyan@{id} # {endpoint} {pid}", node: Self.node(3)) == "ssh 10.0.0.3 systemctl restart banyan@3 # 10.0.0.3:9000 7")
        var n = Self.node(1)
        n.endpoint = "http://[::1]:9000"
        #expect(RollPlan.command("{host}", node: n) == "[::1]")
    }

    @Test("leader changes per step: the terms that passed; a term seen going backwards counts nothing instead of wrapping")
    func leaderChanges() throws {
        func at(_ id: UInt64, term: UInt64, leader: UInt64) -> RollNode {
            var n = Self.node(id, leader: leader)
            n.term = term
            return n
        }
        let before = try #require(RollPlan.Leadership([at(1, term: 4, leader: 2), at(2, term: 4, leader: 2), at(3, term: 4, leader: 2)]))
        #expect(before == RollPlan.Leadership(term: 4, leader: 2))
        // A node behind on the term does not name the leader.
        let after = try #require(RollPlan.Leadership([at(1, term: 5, leader: 3), at(2, term: 4, leader: 2), at(3, term: 5, leader: 3)]))
        #expect(after == RollPlan.Leadership(term: 5, leader: 3))
        #expect(RollPlan.leaderChanges(from: before, to: after) == 1)
        #expect(RollPlan.leaderChanges(from: before, to: RollPlan.Leadership(term: 7, leader: 1)) == 3)
        #expect(RollPlan.leaderChanges(from: before, to: before) == 0)
        // The node that knew the highest term did not answer this time: no wrap-around.
        #expect(RollPlan.leaderChanges(from: RollPlan.Leadership(term: 9, leader: 1), to: RollPlan.Leadership(term: 8, leader: 1)) == 0)
        #expect(RollPlan.leaderChanges(from: RollPlan.Leadership(term: UInt64.max, leader: 1), to: RollPlan.Leadership(term: 0, leader: 0)) == 0)
        #expect(RollPlan.Leadership([]) == nil)
    }
}
