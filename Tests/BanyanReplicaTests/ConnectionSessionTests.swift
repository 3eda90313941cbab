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
}
