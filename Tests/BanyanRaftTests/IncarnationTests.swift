import BanyanRaft
import BanyanBasics
import Testing

/// Issue 14 item 3 (R22): a node that comes back blank under its old id must not regain its vote
/// by replaying the entries that admitted its earlier incarnation. A node's hello reaches its
/// peers through `TestCluster.hello`; a wiped node is `wipe`d with its new incarnation.
@Suite struct IncarnationTests {
    /// Configures a node with incarnation `value(id)` (0: legacy), its election timer seeded by
    /// that incarnation too, so a wiped node's new identity also gets a new timer.
    static func incarnation(_ value: @escaping (NodeID) -> UInt64) -> (inout RaftConfiguration) -> Void {
        { c in
            c.incarnation = value(c.id)
            c.seed = TestCluster.seed(c.id) &+ c.incarnation
        }
    }

    static func incarnation(_ value: UInt64) -> (inout RaftConfiguration) -> Void { incarnation { _ in value } }

    static let incarnationA: UInt64 = 0xA11C_E000_0000_000A
    static let incarnationB: UInt64 = 0xB0B0_0000_0000_000B

    /// Whole-node soak seed 506651: a replaced node committed a stale entry because the leader
    /// still held the old directory's match for it.
    @Test("a leader that hears a new incarnation of a peer forgets that peer's progress: no stale match counts towards commits or reaches the new directory as a commit index")
    func newIncarnationResetsProgress() throws {
        var net = try TestCluster(voters: 3, configure: Self.incarnation { 100 + $0 })
        for id: NodeID in [1, 2, 3] { net.hello(from: id) }
        net.campaign(1)
        #expect(net.leader == 1)
        try net.propose(1, [1])
        try net.propose(1, [2])
        net.tickAll(times: 3)
        let last = try #require(net.raft(1)?.lastIndex)
        #expect(net.raft(1)?.replicationStatus.first { $0.node == 3 }?.match == last)
        // Node 3's directory is replaced; before it answers anything, its hello arrives. The
        // leader must not count it as holding `last` any more.
        net.pause(3)
        try net.wipe(3, configure: Self.incarnation(Self.incarnationB))
        net.pause(3)
        net.resume(3)
        net.hello(from: 3)
        let status = try #require(net.raft(1)?.replicationStatus.first { $0.node == 3 })
        // Rebuilt from node 3's own answers since the hello: it holds what the leader sent it
        // since then, never more.
        #expect(status.match <= (net.raft(3)?.lastIndex ?? 0))
        #expect((net.raft(3)?.commitIndex ?? 0) <= (net.raft(3)?.lastIndex ?? 0))
        // The same incarnation heard again changes nothing.
        let before = net.raft(1)?.replicationStatus.first { $0.node == 2 }?.match
        net.hello(from: 2)
        #expect(net.raft(1)?.replicationStatus.first { $0.node == 2 }?.match == before)
        #expect(net.violations.isEmpty)
    }

    /// Whole-node soak seed 1116537, by hand. Run once as the code is and once with the
    /// sabotage that counts such acknowledgements, which must commit over the newer term (so the
    /// scenario does reach the danger).
    @Test("a stale leader does not commit with the acknowledgements of a voter that came back blank: it may have forgotten the newer term that committed other entries there (soak seed 1116537)", arguments: [false, true])
    func amnesiacAcknowledgementsDoNotCount(sabotaged: Bool) throws {
        var net = try TestCluster(voters: 3, configure: { c in
            Self.incarnation { 100 + $0 }(&c)
            if sabotaged { c.sabotage = .amnesiacAcknowledgements }
        })
        for id: NodeID in [1, 2, 3] { net.hello(from: id) }
        net.campaign(1)
        #expect(net.leader == 1)
        try net.propose(1, [1])
        let base = try #require(net.raft(1)?.commitIndex)
        let staleTerm = try #require(net.raft(1)?.term)
        // Node 1 is cut off, appends two entries of its term that nobody receives, and stalls.
        net.isolate(1)
        try net.propose(1, [2])
        try net.propose(1, [3])
        net.pause(1)
        net.heal()
        // The other two elect one of them in a newer term and commit their own entries there.
        let newer = try #require(Scenario.tickUntil(&net, limit: 300) { $0.settledLeader != nil }.flatMap { _ in net.settledLeader })
        try net.propose(newer, [4])
        try net.propose(newer, [5])
        try net.propose(newer, [6])
        let committed = try #require(net.raft(newer)?.commitIndex)
        #expect(committed >= base + 3)
        #expect(net.raft(newer)?.term(at: base + 1) != staleTerm)
        // The new leader stalls; the other loses its data directory and comes back blank with a
        // new incarnation: no vote, no memory of the newer term, still a voter of {1, 2, 3}.
        let wiped: NodeID = newer == 2 ? 3 : 2
        net.pause(newer)
        try net.wipe(wiped, configure: Self.incarnation(Self.incarnationB))
        #expect(net.raft(wiped)?.mayVote == false)
        // The stale leader resumes, hears the blank node's hello and replicates its log to it.
        net.resume(1)
        net.hello(from: wiped)
        net.tickAll(times: 30)
        #expect(net.raft(wiped)?.lastIndex ?? 0 >= base + 2, "the blank node received the stale leader's log")
        let staleCommit = max(net.raft(1)?.commitIndex ?? 0, net.raft(wiped)?.commitIndex ?? 0)
        if sabotaged {
            #expect(staleCommit > base, "the sabotage did not reach the danger")
        } else {
            #expect(staleCommit == base, "entries of term \(staleTerm) committed where a newer term had committed others")
            #expect(net.violations.isEmpty)
        }
    }

    /// The other quorums the same rule guards (review of 27f675d): with one voter paused and
    /// the third wiped, a leader may neither confirm a read nor keep its leadership on the wiped
    /// voter's answers; once the wiped voter is readmitted under its new incarnation, what it
    /// holds counts again.
    @Test("a blank voter's answers confirm no read and keep no leader in office (check-quorum); readmitted, it counts again", arguments: [false, true])
    func amnesiacAnswersInReadsAndCheckQuorum(sabotaged: Bool) throws {
        var net = try TestCluster(voters: 3, configure: { c in
            Self.incarnation { 100 + $0 }(&c)
            if sabotaged { c.sabotage = .amnesiacAcknowledgements }
        })
        for id: NodeID in [1, 2, 3] { net.hello(from: id) }
        net.campaign(1)
        #expect(net.leader == 1)
        try net.propose(1, [1])
        net.tickAll(times: 2)
        try net.wipe(3, configure: Self.incarnation(Self.incarnationB))
        net.hello(from: 3)
        net.tickAll(times: 3)
        #expect(net.raft(3)?.mayVote == false)
        #expect(net.raft(3)?.lastIndex == net.raft(1)?.lastIndex, "the wiped voter caught up on the log")
        net.pause(2)
        // A read needs a quorum of heartbeat answers: 1 and the wiped 3 are not one.
        let asked = net.readIndex(1, context: 77)
        #expect(asked)
        net.tickAll(times: 3)
        let confirmed = net.reads[1]?.contains { $0.context == 77 } == true
        #expect(confirmed == sabotaged, "read confirmed with a blank voter's answers: \(confirmed)")
        // Check-quorum: within two election timeouts the leader steps down.
        let timeout = net.raft(1)?.configuration.electionTicks ?? 10
        net.tickAll(times: 2 * timeout + 2)
        #expect((net.raft(1)?.role == .leader) == sabotaged, "role \(String(describing: net.raft(1)?.role))")
        guard !sabotaged else { return }
        // The operator's repair: node 2 back, remove 3 and add it again under its new incarnation.
        net.resume(2)
        let leader = try #require(Scenario.tickUntil(&net, limit: 300) { $0.settledLeader != nil }.flatMap { _ in net.settledLeader })
        try net.changeMembership(leader, .remove(3))
        net.tickAll(times: 2)
        try net.changeMembership(leader, .addLearner(3))
        net.tickAll(times: 5)
        #expect(net.raft(3)?.mayVote == true)
        #expect(net.raft(leader)?.membership.voters == [1, 2, 3])
        // Now node 3's answers count: with the other follower paused, the leader still commits.
        let other: NodeID = leader == 1 ? 2 : 1
        net.pause(other)
        let before = net.raft(leader)?.commitIndex ?? 0
        try net.propose(leader, [9])
        net.tickAll(times: 3)
        #expect((net.raft(leader)?.commitIndex ?? 0) > before)
        #expect(net.violations.isEmpty)
    }

    /// Run once as the code is and once with the sabotage that takes a heartbeat's commit
    /// unchecked (self-test `unverified-heartbeat-commit`), which must commit the other log's
    /// index (so the case does reach the danger).
    @Test("a heartbeat commits only through an entry the follower holds with the term the heartbeat names (no append's consistency check covers it)", arguments: [false, true])
    func heartbeatCommitChecksTerm(sabotaged: Bool) throws {
        var configuration = RaftConfiguration(id: 2, seed: 3)
        if sabotaged { configuration.sabotage = .unverifiedHeartbeatCommit }
        var node = try RaftNode(configuration: configuration, restoring: RaftNode.bootstrapState(members: [1, 2, 3]))
        let mine = [LogEntry(index: 2, term: 2, data: [2]), LogEntry(index: 3, term: 2, data: [3])]
        node.step(Message(from: 1, to: 2, term: 2, body: .append(prevIndex: 1, prevTerm: 1, entries: mine, commit: 1)))
        #expect(node.commitIndex == 1)
        // Computed for another log (an earlier incarnation of this node, say): term 3 at index 3.
        node.step(Message(from: 1, to: 2, term: 2, body: .heartbeat(commit: 3, readSeq: 0, commitTerm: 3)))
        if sabotaged {
            #expect(node.commitIndex == 3, "the sabotaged follower commits what another log holds")
            return
        }
        #expect(node.commitIndex == 1)
        // Beyond this log, or without a term (a version-3 peer, or compacted at the leader).
        node.step(Message(from: 1, to: 2, term: 2, body: .heartbeat(commit: 5, readSeq: 0, commitTerm: 2)))
        node.step(Message(from: 1, to: 2, term: 2, body: .heartbeat(commit: 3, readSeq: 0)))
        #expect(node.commitIndex == 1)
        // Our entry at 3 is the leader's: commit through it.
        node.step(Message(from: 1, to: 2, term: 2, body: .heartbeat(commit: 3, readSeq: 0, commitTerm: 2)))
        #expect(node.commitIndex == 3)
        // The leader's heartbeats name the term of its entry at the commit they carry.
        var net = try TestCluster(voters: 3)
        net.campaign(1)
        try net.propose(1, [7])
        let mark = net.delivered.count
        net.tickAll(times: 3)
        let beats = net.delivered[mark...].compactMap { m -> (UInt64, UInt64)? in
            if case let .heartbeat(commit, _, commitTerm) = m.body, m.from == 1 { (commit, commitTerm) } else { nil }
        }
        #expect(!beats.isEmpty)
        for (commit, commitTerm) in beats { #expect(net.raft(1)?.term(at: commit) == commitTerm) }
    }

    @Test("a wiped node back under its old id with a new incarnation keeps mayVote false when a leader replays its old addLearner and promote from index 1, never grants a vote, and votes again only once removed and re-added (R22, issue 14 item 3)")
    func wipedNodeDoesNotRegainVoteByReplay() throws {
        var net = try TestCluster(voters: 3, configure: Self.incarnation { 100 + $0 })
        net.campaign(1)
        #expect(net.leader == 1)
        // Node 4 (incarnation A) joins: its hello reaches the leader, which adds it as a learner
        // and promotes it once it has caught up.
        try net.addBlankNode(4, configure: Self.incarnation(Self.incarnationA))
        net.hello(from: 4)
        try net.changeMembership(1, .addLearner(4))
        net.tickAll(times: 3)
        #expect(net.raft(1)?.membership.voters == [1, 2, 3, 4])
        #expect(net.raft(1)?.membership.incarnation(of: 4) == Self.incarnationA)
        #expect(net.raft(4)?.mayVote == true)
        try net.propose(1, [1])
        // Node 4's data directory is deleted; it restarts blank under id 4 with incarnation B
        // (a fresh random identity), and its hello tells every peer so.
        try net.wipe(4, configure: Self.incarnation(Self.incarnationB))
        net.hello(from: 4)
        #expect(net.raft(4)?.mayVote == false)
        // A leadership transfer: the new leader probes node 4 back to index 1 and replays the
        // whole log, including the entries that added and promoted incarnation A.
        try net.transfer(1, to: 2)
        #expect(net.leader == 2)
        net.tickAll(times: 5)
        let four = try #require(net.raft(4))
        #expect(four.lastIndex == net.raft(2)?.lastIndex)
        #expect(four.commitIndex == net.raft(2)?.commitIndex)
        #expect(four.membership.voters == [1, 2, 3, 4])
        #expect(four.mayVote == false, "the replayed entries of incarnation A gave incarnation B a vote")
        #expect(four.isVoterWithAmnesia)
        // It grants nothing: not a direct request…
        var mark = net.delivered.count
        net.inject(Message(from: 3, to: 4, term: 50, body: .preVote(lastIndex: 100, lastTerm: 50)))
        net.inject(Message(from: 3, to: 4, term: 50, body: .vote(lastIndex: 100, lastTerm: 50, leaderTransfer: true)))
        #expect(net.grants(from: 4, since: mark).isEmpty)
        // (Those requests moved terms on: the others elect a leader without node 4.)
        #expect(Scenario.tickUntil(&net, limit: 300) { $0.settledLeader != nil } != nil)
        // …nor in an election that needs it: with the leader down, 3 of {1, 2, 3, 4} cannot be
        // found among the other three without node 4.
        let leader = try #require(net.settledLeader)
        mark = net.delivered.count
        net.pause(leader)
        #expect(Scenario.tickUntil(&net, limit: 200) { $0.settledLeader != nil } == nil)
        #expect(net.grants(from: 4, since: mark).isEmpty)
        #expect(net.raft(4)?.mayVote == false)
        net.resume(leader)
        #expect(Scenario.tickUntil(&net, limit: 300) { $0.settledLeader != nil } != nil)
        // The operator's remedy (docs/runbook.md): remove id 4 and add it back. The leader knows
        // incarnation B, records it, and promotes node 4, which then votes again.
        let l = try #require(net.settledLeader)
        try net.changeMembership(l, .remove(4))
        #expect(net.raft(l)?.membership.contains(4) == false)
        #expect(net.raft(4)?.mayVote == false)
        net.tickAll(times: 2)
        try net.changeMembership(l, .addLearner(4))
        net.tickAll(times: 5)
        #expect(net.raft(l)?.membership.voters == [1, 2, 3, 4])
        #expect(net.raft(l)?.membership.incarnation(of: 4) == Self.incarnationB)
        #expect(net.raft(4)?.mayVote == true)
        #expect(net.raft(4)?.isVoterWithAmnesia == false)
        // Its vote now counts: with the leader down again, {others, 4} elect a leader.
        mark = net.delivered.count
        net.pause(l)
        #expect(Scenario.tickUntil(&net, limit: 300) { $0.settledLeader != nil } != nil)
        // Three of {1, 2, 3, 4} with one paused: node 4 granted its vote, or won with the
        // others' votes (either way its vote counted).
        #expect(net.settledLeader == 4 || !net.grants(from: 4, since: mark).isEmpty, "leader \(String(describing: net.settledLeader))")
        for n in net.nodes.values { #expect(n.raft.invariantViolations.isEmpty) }
        #expect(net.violations.isEmpty)
    }

    @Test("a leader with an incarnation does not promote a learner whose incarnation it does not know: the manual promote is refused and automatic promotion waits for the hello (R22)")
    func promotionWaitsForIncarnation() throws {
        var net = try TestCluster(voters: 3, configure: Self.incarnation { 100 + $0 })
        net.campaign(1)
        try net.addBlankNode(4, configure: Self.incarnation(Self.incarnationA))
        // No hello from node 4 yet: the entry adding it records no incarnation.
        try net.changeMembership(1, .addLearner(4))
        net.tickAll(times: 5)
        #expect(net.raft(4)?.lastIndex == net.raft(1)?.lastIndex)
        #expect(net.raft(1)?.membership == Membership(voters: [1, 2, 3], learners: [4]))
        #expect(net.raft(4)?.mayVote == false)
        #expect(throws: RaftError.incarnationUnknown(4)) { try net.changeMembership(1, .promote(4)) }
        // Its hello arrives: the next acknowledgement promotes it, recording incarnation A, and
        // node 4 takes its vote from that entry (it names 4 with its own incarnation).
        net.hello(from: 4)
        net.tickAll(times: 3)
        #expect(net.raft(1)?.membership == Membership(voters: [1, 2, 3, 4], incarnations: [4: Self.incarnationA]))
        #expect(net.raft(4)?.mayVote == true)
    }

    @Test("legacy nodes (incarnation 0) keep the old rules: a learner is promoted without a known incarnation and takes its vote from the entry that made it a learner")
    func legacyModeUnchanged() throws {
        var net = try TestCluster(voters: 3, configure: Self.incarnation(0))
        net.campaign(1)
        try net.addBlankNode(4, configure: Self.incarnation(0))
        try net.changeMembership(1, .addLearner(4))
        net.tickAll(times: 3)
        #expect(net.raft(1)?.membership == Membership(voters: [1, 2, 3, 4]))
        #expect(net.raft(4)?.mayVote == true)
    }

    @Test("a node with an incarnation takes its vote from an installed snapshot only when the snapshot's membership names its incarnation")
    func snapshotRestoreNeedsIncarnation() throws {
        let meta = { (m: Membership) in SnapshotMeta(index: 10, term: 2, membership: m) }
        func install(_ m: Membership, into incarnation: UInt64) throws -> RaftNode {
            var config = RaftConfiguration(id: 4, seed: 1)
            config.incarnation = incarnation
            var node = try RaftNode(configuration: config, restoring: .blank)
            node.step(Message(from: 1, to: 4, term: 2, body: .snapshotChunk(meta: meta(m), offset: 0, data: [1], last: true)))
            return node
        }
        let old = Membership(voters: [1, 2, 3, 4], incarnations: [4: Self.incarnationA])
        #expect(try install(old, into: Self.incarnationB).mayVote == false)
        #expect(try install(old, into: Self.incarnationB).isVoterWithAmnesia)
        #expect(try install(Membership(voters: [1, 2, 3], learners: [4]), into: Self.incarnationB).mayVote == false)
        #expect(try install(old, into: Self.incarnationA).mayVote == true)
        let learner = Membership(voters: [1, 2, 3], learners: [4], incarnations: [4: Self.incarnationB])
        #expect(try install(learner, into: Self.incarnationB).mayVote == true)
        // Legacy: any membership naming it as a learner.
        #expect(try install(Membership(voters: [1, 2, 3], learners: [4]), into: 0).mayVote == true)
    }

    @Test("membership changes keep recorded incarnations of the other members and drop a removed member's")
    func membershipKeepsIncarnations() throws {
        let m = Membership(voters: [1, 2], learners: [3], incarnations: [1: 11, 3: 33, 9: 99, 2: 0])
        #expect(m.incarnations == [1: 11, 3: 33])
        #expect(try m.applying(.promote(3)).get() == Membership(voters: [1, 2, 3], incarnations: [1: 11, 3: 33]))
        #expect(try m.applying(.remove(3)).get().incarnations == [1: 11])
        #expect(try m.applying(.addLearner(4)).get().incarnations == [1: 11, 3: 33])
        #expect(m != Membership(voters: [1, 2], learners: [3]))
        #expect(m.description == "voters [1, 2] learners [3] incarnations [1: b, 3: 21]")
        #expect(Membership(voters: [1, 2]).description == "voters [1, 2] learners []")
    }
}
