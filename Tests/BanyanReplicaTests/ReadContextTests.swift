import BanyanRaft
import BanyanReplica
import BanyanStateMachine
import Testing

/// Item 5 of issue 14: read-index contexts are unique per incarnation, and a follower takes read
/// answers only from its leader, so an answer replayed from an earlier incarnation's request
/// (a leader's backlog after a reconnection) never serves a new read with an old index.
@Suite struct ReadContextTests {
    static func follower(session: UInt64) throws -> Replica {
        var raft = RaftConfiguration(id: 1, seed: 11)
        raft.electionTicks = 10
        var configuration = ReplicaConfiguration(raft: raft)
        configuration.snapshotEntries = 0
        var replica = try Replica(
            configuration: configuration, persisted: RaftNode.bootstrapState(members: [1, 2, 3]), machine: StateMachine(),
            session: session, now: 0)
        // Node 2 leads term 2.
        replica.receive(Message(from: 2, to: 1, term: 2, body: .heartbeat(commit: 1, readSeq: 0)))
        drain(&replica)
        return replica
    }

    /// Runs the Ready loop (nothing to persist in memory); returns the messages sent.
    @discardableResult
    static func drain(_ replica: inout Replica) -> [Message] {
        var sent: [Message] = []
        while let rd = replica.ready() {
            sent += rd.messages
            replica.advance(rd, installed: nil)
        }
        return sent
    }

    static func readContext(_ messages: [Message]) -> UInt64? {
        for m in messages { if case .readIndex(let context) = m.body { return context } }
        return nil
    }

    static func readsReady(_ events: [ReplicaEvent]) -> [RequestID] {
        events.flatMap { event -> [RequestID] in if case .readsReady(let ids) = event { return ids } else { return [] } }
    }

    @Test("a restarted node never reuses a read context, so an answer meant for its previous incarnation serves no new read")
    func contextsDifferAcrossIncarnations() throws {
        var before = try Self.follower(session: 0x1234_5678_9abc_def0)
        before.read(1)
        let old = try #require(Self.readContext(Self.drain(&before)))

        // The node restarts (same disk, a new incarnation) and starts a new read.
        var after = try Self.follower(session: 0x0fed_cba9_8765_4321)
        after.read(7)
        let new = try #require(Self.readContext(Self.drain(&after)))
        #expect(old != new, "contexts repeat across incarnations: \(old)")

        // The leader's answer to the old request arrives late (index 1: before the new read began).
        after.receive(Message(from: 2, to: 1, term: 2, body: .readIndexResponse(context: old, index: 1)))
        Self.drain(&after)
        #expect(Self.readsReady(after.takeEvents()).isEmpty, "a new read was answered by an answer to an old one")

        // The answer to the new request does serve it.
        after.receive(Message(from: 2, to: 1, term: 2, body: .readIndexResponse(context: new, index: 1)))
        Self.drain(&after)
        #expect(Self.readsReady(after.takeEvents()) == [7])
    }

    @Test("a follower ignores a read answer from a node that is not its leader")
    func answersOnlyFromTheLeader() throws {
        var replica = try Self.follower(session: 42)
        replica.read(3)
        let context = try #require(Self.readContext(Self.drain(&replica)))
        replica.receive(Message(from: 3, to: 1, term: 2, body: .readIndexResponse(context: context, index: 1)))
        Self.drain(&replica)
        #expect(Self.readsReady(replica.takeEvents()).isEmpty)
        replica.receive(Message(from: 2, to: 1, term: 2, body: .readIndexResponse(context: context, index: 1)))
        Self.drain(&replica)
        #expect(Self.readsReady(replica.takeEvents()) == [3])
    }
}
