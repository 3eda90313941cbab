import BanyanRaft
import BanyanReplica
import BanyanStateMachine
import BanyanTree
import Testing

/// A realtime connection writes in its own session (docs/realtime.md): its writes and
/// onDisconnect commands are sequenced apart from the node's, so the state machine can fire its
/// queue and refuse what it sends afterwards, whichever node proposes `connectionEnded`.
@Suite struct ConnectionSessionTests {
    static let connection: UInt64 = 0xC0FFEE
    static let secret: UInt64 = 0x5EC2E7

    mutating func command(_ c: inout ReplicaCluster, via id: NodeID, _ command: Command, session: UInt64? = nil) -> RequestID {
        let q = c.request()
        c.replicas[id]?.write(q, namespace: "app", command: command, session: session)
        return q
    }

    @Test("writes and onDisconnect commands in a connection's session apply once; another node ends the connection and its queue fires there and everywhere")
    mutating func connectionLifecycle() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let follower: NodeID = leader == 1 ? 2 : 1
        let other: NodeID = [1, 2, 3].first { $0 != leader && $0 != follower } ?? 3
        #expect(c.replicas[follower]?.openSession(Self.connection) == true)
        #expect(c.replicas[follower]?.openSession(Self.connection) == false, "an open id cannot be opened again")
        let set = command(&c, via: follower, .set(path: "/u/online", json: Array("true".utf8)), session: Self.connection)
        let queue = command(&c, via: follower, .onDisconnectSet(path: "/u/online", json: Array("false".utf8), secret: Self.secret), session: Self.connection)
        c.settle()
        #expect(try c.writeOutcome(set, on: follower)?.get().outcome == .ok)
        #expect(try c.writeOutcome(set, on: follower)?.get().session == Self.connection)
        #expect(try c.writeOutcome(queue, on: follower)?.get().outcome == .ok)
        for id: NodeID in [1, 2, 3] {
            #expect(c.value(id, "/u/online") == "true")
            #expect(c.replicas[id]?.machine.disconnects[Self.connection] != nil)
        }
        // The connection reconnects through another node (`ls`): that node ends it, in its own session.
        let end = command(&c, via: other, .connectionEnded(connection: Self.connection, secret: Self.secret))
        c.settle()
        #expect(try c.writeOutcome(end, on: other)?.get().outcome == .ok)
        for id: NodeID in [1, 2, 3] {
            #expect(c.value(id, "/u/online") == "false")
            #expect(c.replicas[id]?.machine.sessions[Self.connection]?.ended == true)
        }
        // A write the old connection still sends is refused, and its node closes the session.
        let late = command(&c, via: follower, .set(path: "/u/online", json: Array("true".utf8)), session: Self.connection)
        c.settle()
        guard case .refused? = try c.writeOutcome(late, on: follower)?.get().outcome else {
            Issue.record("a write after the connection ended was not refused")
            return
        }
        #expect(c.value(leader, "/u/online") == "false")
        c.replicas[follower]?.closeSession(Self.connection)
        let closed = command(&c, via: follower, .set(path: "/x", json: Array("1".utf8)), session: Self.connection)
        #expect(c.replicas[follower]?.openSessionCount == 1)
        c.settle()
        #expect(c.readFailed(closed, on: follower) == .unknownSession(Self.connection))
        // An id the state machine already knows cannot be opened again (its numbers would repeat).
        #expect(c.replicas[other]?.openSession(Self.connection) == false)
    }

    /// The order of `.applied` events for `requests` on node `id`.
    func appliedOrder(_ c: ReplicaCluster, on id: NodeID, _ requests: [RequestID]) -> [RequestID] {
        (c.events[id] ?? []).compactMap { event in
            guard case .applied(_, _, let request?) = event, requests.contains(request) else { return nil }
            return request
        }
    }

    /// Log entries on `id`'s disk carrying the command (session, seq).
    func copies(_ c: ReplicaCluster, on id: NodeID, session: UInt64, seq: UInt64) -> Int {
        c.storedEntries(id).filter { e in
            guard case .command = e.kind, let envelope = CommandEnvelope(decoding: e.data) else { return false }
            return envelope.session == session && envelope.seq == seq
        }.count
    }

    @Test("a connection's writes apply in the order sent: a later write that commits before a lost earlier one waits for it, then applies")
    mutating func orderedWrites() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let follower: NodeID = leader == 1 ? 2 : 1
        #expect(c.replicas[follower]?.openSession(Self.connection) == true)
        // The first write's forward is lost; the second's arrives and commits first.
        let drops = c.dropFirstProposal()
        let first = command(&c, via: follower, .set(path: "/v", json: Array("1".utf8)), session: Self.connection)
        c.settle()
        let second = command(&c, via: follower, .set(path: "/v", json: Array("2".utf8)), session: Self.connection)
        c.settle()
        #expect(drops.count == 1)
        #expect(c.writeOutcome(second, on: follower) == nil, "the second write waits for the first")
        for id: NodeID in [1, 2, 3] { #expect(c.value(id, "/v") == "null") }
        c.tick(12)
        #expect(try c.writeOutcome(first, on: follower)?.get().outcome == .ok)
        #expect(try c.writeOutcome(second, on: follower)?.get().outcome == .ok)
        #expect(appliedOrder(c, on: follower, [first, second]) == [first, second])
        for id: NodeID in [1, 2, 3] { #expect(c.value(id, "/v") == "2") }

        // A write given up on (its deadline passed while its forwards were lost) does not hold
        // the next one for ever: the retry's watermark settles it.
        var dropped = 0
        c.filter = { m in
            if case .proposal(let commands) = m.body, commands.contains(where: { CommandEnvelope(decoding: $0)?.seq == 3 }) {
                dropped += 1
                return false
            }
            return true
        }
        let lost = command(&c, via: follower, .set(path: "/v", json: Array("3".utf8)), session: Self.connection)
        c.tick(30)
        let after = command(&c, via: follower, .set(path: "/v", json: Array("4".utf8)), session: Self.connection)
        c.tick(20)
        #expect(c.writeOutcome(after, on: follower) == nil, "held behind the lost write")
        c.tick(30)
        #expect(c.readFailed(lost, on: follower) == .timedOut(write: true))
        #expect(try c.writeOutcome(after, on: follower)?.get().outcome == .ok)
        for id: NodeID in [1, 2, 3] { #expect(c.value(id, "/v") == "4") }
        #expect(dropped > 1, "the lost write was retried")
    }

    @Test("a lagging follower's retries add no log entries while the leader's log holds a copy; the write applies once")
    mutating func retriesWhileLagging() throws {
        var c = try ReplicaCluster(nodes: 3)
        let leader = try elect(&c)
        let follower: NodeID = leader == 1 ? 2 : 1
        // The follower hears nothing from the leader (it lags), but its forwards get through.
        c.filter = { m in !(m.from == leader && m.to == follower) }
        let q = c.write(via: follower, "/n", "1")
        let seq = (c.replicas[follower]?.nextSeq ?? 1) - 1
        let session = c.replicas[follower]?.session ?? 0
        c.settle()
        c.tick(4)
        #expect(copies(c, on: leader, session: session, seq: seq) == 1)
        // Several retry intervals pass without the follower learning the outcome.
        for _ in 0..<6 {
            c.tick(1)
        }
        #expect(c.writeOutcome(q, on: follower) == nil)
        #expect(copies(c, on: leader, session: session, seq: seq) == 1, "retries add no copies")
        #expect((c.replicas[leader]?.droppedRetries ?? 0) >= 1)
        c.filter = { _ in true }
        c.tick(3)
        #expect(try c.writeOutcome(q, on: follower)?.get().outcome == .ok)
        for id: NodeID in [1, 2, 3] { #expect(c.value(id, "/n") == "1") }
    }
}
