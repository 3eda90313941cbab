import BanyanRaft
import Testing

/// Found by the whole-node soak (seed 52697): a learner admitted without a known incarnation,
/// then promoted with it, that holds its promotion entry but missed its commit before the leader
/// failed, must still vote; otherwise voters {1,2,3,4} with 3 wiped and 4 refusing have no quorum.
@Suite struct PromotedBeforeCommitTests {
    static let incarnation: UInt64 = 0xF00D

    @Test("a node holding an uncommitted configuration that names its own incarnation may vote; one naming another incarnation gives nothing")
    func votesOnceNamed() throws {
        var configuration = RaftConfiguration(id: 4, seed: 9)
        configuration.incarnation = Self.incarnation
        var node = try RaftNode(configuration: configuration, restoring: .blank)
        #expect(!node.mayVote)
        let founding = RaftNode.bootstrapState(members: [1, 2, 3]).entries
        let learner = LogEntry(index: 2, term: 1, kind: .config(Membership(voters: [1, 2, 3], learners: [4])))
        let promoted = LogEntry(
            index: 3, term: 1, kind: .config(Membership(voters: [1, 2, 3, 4], incarnations: [4: Self.incarnation])))
        // The leader's append: the learner entry is committed, the promotion not yet.
        node.step(Message(from: 1, to: 4, term: 1, body: .append(prevIndex: 0, prevTerm: 0, entries: founding + [learner, promoted], commit: 2)))
        #expect(node.commitIndex == 2)
        #expect(node.mayVote)
        // The leader falls silent; a candidate of term 2 with an up-to-date log gets the vote.
        node.advance(node.ready())
        for _ in 0..<(2 * configuration.electionTicks) { node.tick() }
        node.step(Message(from: 2, to: 4, term: 2, body: .vote(lastIndex: 3, lastTerm: 1, leaderTransfer: false)))
        let rd = node.ready()
        #expect(rd.messages.contains { $0.to == 2 && $0.body == .voteResponse(granted: true) })

        // The same append naming another incarnation of id 4 (a wiped node replaying history).
        var wiped = try RaftNode(configuration: configuration, restoring: .blank)
        let other = LogEntry(index: 3, term: 1, kind: .config(Membership(voters: [1, 2, 3, 4], incarnations: [4: 0xBEEF])))
        wiped.step(Message(from: 1, to: 4, term: 1, body: .append(prevIndex: 0, prevTerm: 0, entries: founding + [learner, other], commit: 3)))
        #expect(!wiped.mayVote)
    }

    /// Found by the whole-node soak (seed 108021): the promotion committed on two voters of
    /// {1,2,3,4} before node 4 received it, node 2 lost its disk, and the leader went down. Nodes
    /// 1 and 3 need a third vote; node 2 has none until re-added (which needs a leader), and node
    /// 4 would have one only from an entry no leader is left to send. The candidate's vote
    /// request names the incarnation its configuration records for node 4.
    @Test("a node that has not heard of its promotion votes for a candidate whose configuration names its incarnation; another incarnation gives nothing")
    func votesWhenTheCandidateNamesItsIncarnation() throws {
        var configuration = RaftConfiguration(id: 4, seed: 9)
        configuration.incarnation = Self.incarnation
        let founding = RaftNode.bootstrapState(members: [1, 2, 3]).entries
        // Added before the leader heard its hello: the learner entry names no incarnation.
        let learner = LogEntry(index: 2, term: 1, kind: .config(Membership(voters: [1, 2, 3], learners: [4])))
        func caughtUp() throws -> RaftNode {
            var node = try RaftNode(configuration: configuration, restoring: .blank)
            node.step(Message(from: 1, to: 4, term: 1, body: .append(prevIndex: 0, prevTerm: 0, entries: founding + [learner], commit: 2)))
            #expect(!node.mayVote)
            node.advance(node.ready())
            for _ in 0..<(2 * configuration.electionTicks) { node.tick() }
            _ = node.ready()
            return node
        }
        // A candidate that holds the promotion (index 3) asks; it records this incarnation.
        var node = try caughtUp()
        node.step(Message(from: 3, to: 4, term: 2, body: .preVote(lastIndex: 3, lastTerm: 1, voterIncarnation: Self.incarnation)))
        #expect(node.ready().messages.contains { $0.to == 3 && $0.body == .preVoteResponse(granted: true) })
        node.step(Message(from: 3, to: 4, term: 2, body: .vote(lastIndex: 3, lastTerm: 1, leaderTransfer: false, voterIncarnation: Self.incarnation)))
        let rd = node.ready()
        #expect(rd.messages.contains { $0.to == 3 && $0.body == .voteResponse(granted: true) })
        // The vote and the admission are durable before the response goes out (R3).
        #expect(rd.hardState?.mayVote == true && rd.hardState?.vote == 3)
        #expect(node.mayVote)

        // A candidate recording another incarnation of id 4 (this directory was wiped since), or
        // none, gets nothing, and the node stays without a vote.
        for other: UInt64 in [0xBEEF, 0] {
            var wiped = try caughtUp()
            wiped.step(Message(from: 3, to: 4, term: 2, body: .vote(lastIndex: 3, lastTerm: 1, leaderTransfer: false, voterIncarnation: other)))
            #expect(wiped.ready().messages.contains { $0.to == 3 && $0.body == .voteResponse(granted: false) })
            #expect(!wiped.mayVote)
        }
        // A pre-vote naming another incarnation gives nothing either; nor does a request of an
        // older term, even one naming this incarnation (it is answered before any admission).
        var prevoted = try caughtUp()
        prevoted.step(Message(from: 3, to: 4, term: 2, body: .preVote(lastIndex: 3, lastTerm: 1, voterIncarnation: 0xBEEF)))
        #expect(prevoted.ready().messages.contains { $0.to == 3 && $0.body == .preVoteResponse(granted: false) })
        #expect(!prevoted.mayVote)
        var stale = try caughtUp()
        stale.step(Message(from: 3, to: 4, term: 1, body: .append(prevIndex: 2, prevTerm: 1, entries: [], commit: 2)))
        stale.step(Message(from: 3, to: 4, term: 2, body: .heartbeat(commit: 2, readSeq: 0)))
        _ = stale.ready()
        stale.step(Message(from: 2, to: 4, term: 1, body: .vote(lastIndex: 3, lastTerm: 1, leaderTransfer: false, voterIncarnation: Self.incarnation)))
        #expect(!stale.mayVote)
        // A legacy node (incarnation 0) takes nothing from a request naming 0.
        var legacy = try RaftNode(configuration: RaftConfiguration(id: 4, seed: 9), restoring: .blank)
        legacy.step(Message(from: 3, to: 4, term: 2, body: .vote(lastIndex: 3, lastTerm: 1, leaderTransfer: false, voterIncarnation: 0)))
        #expect(!legacy.mayVote)
    }

    @Test("a restart keeps that admission: the entry naming this incarnation is on disk, the hard state that recorded the vote is not")
    func admissionSurvivesARestart() throws {
        var configuration = RaftConfiguration(id: 4, seed: 9)
        configuration.incarnation = Self.incarnation
        let founding = RaftNode.bootstrapState(members: [1, 2, 3]).entries
        let learner = LogEntry(index: 2, term: 1, kind: .config(Membership(voters: [1, 2, 3], learners: [4])))
        let promoted = LogEntry(
            index: 3, term: 1, kind: .config(Membership(voters: [1, 2, 3, 4], incarnations: [4: Self.incarnation])))
        // The entries reached the disk; the crash came before the hard state's `mayVote` did.
        let persisted = PersistedState(
            hardState: HardState(term: 1, vote: 0, commit: 2, mayVote: false), snapshot: .none, entries: founding + [learner, promoted])
        var node = try RaftNode(configuration: configuration, restoring: persisted)
        #expect(node.mayVote)
        // The vote goes to disk with the next Ready.
        #expect(node.ready().hardState?.mayVote == true)
        // A restored log naming another incarnation of the id gives nothing.
        let other = LogEntry(index: 3, term: 1, kind: .config(Membership(voters: [1, 2, 3, 4], incarnations: [4: 0xBEEF])))
        let stranger = try RaftNode(
            configuration: configuration,
            restoring: PersistedState(hardState: HardState(term: 1, vote: 0, commit: 2, mayVote: false), snapshot: .none, entries: founding + [learner, other]))
        #expect(!stranger.mayVote)
        // Nor does a snapshot naming another incarnation; one naming this incarnation does.
        let snapshotOther = SnapshotMeta(index: 3, term: 1, membership: Membership(voters: [1, 2, 3, 4], incarnations: [4: 0xBEEF]))
        let fromOther = try RaftNode(
            configuration: configuration,
            restoring: PersistedState(hardState: HardState(term: 1, vote: 0, commit: 3, mayVote: false), snapshot: snapshotOther, entries: []))
        #expect(!fromOther.mayVote)
        let snapshotOwn = SnapshotMeta(index: 3, term: 1, membership: Membership(voters: [1, 2, 3, 4], incarnations: [4: Self.incarnation]))
        let fromOwn = try RaftNode(
            configuration: configuration,
            restoring: PersistedState(hardState: HardState(term: 1, vote: 0, commit: 3, mayVote: false), snapshot: snapshotOwn, entries: []))
        #expect(fromOwn.mayVote)
    }
}
