import BanyanBasics
import BanyanNode
import BanyanOpLogFiles
import BanyanRaft
import BanyanReplica
import BanyanStateMachine
import BanyanTree
import Logging
import Testing

/// Issue 18, "admin requests validated before anything is stored": `POST /.banyan/members` once
/// wrote the new member's address to `$cluster/peers` before the membership change was checked,
/// so an add naming an existing voter redirected that voter's traffic, for good.
@Suite struct AddMemberValidationTests {
    final class Box: @unchecked Sendable {
        var actions: [NodeAction] = []
    }

    /// A one-node cluster (node 1) that has elected itself.
    static func leader() throws -> (NodeCore, Box, () -> Void) {
        let fs = SimulatedFileSystem(durableDirectories: ["/"])
        let storage = try NodeStorage(directory: "/data", fileSystem: fs, logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }, newIncarnation: 0xA1) { _ in }
        var settings = NodeCore.Settings(replica: ReplicaConfiguration(raft: RaftConfiguration(id: 1, seed: 7)))
        settings.replica.raft.incarnation = storage.incarnation
        var clock: UInt64 = 0
        var sessions = SeededRandom(seed: 3)
        let core = try NodeCore(
            settings: settings, storage: storage, foundingMembers: [1], logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }, now: 1_000,
            monotonicNanoseconds: { clock }, newSession: { sessions.next() | 1 }, progress: { _ in })
        let box = Box()
        core.output = { box.actions.append($0) }
        let run = {
            for _ in 0..<50 {
                clock += 10_000_000
                core.tick(now: 1_000)
                core.process()
            }
        }
        run()
        return (core, box, run)
    }

    static func peers(_ core: NodeCore) -> String {
        do { return JSONWriter.string(core.replica.machine.tree(NodeCore.clusterNamespace).child(at: try Path(parsing: "/peers"))) } catch { return "?" }
    }

    @Test("an add naming an existing member is refused before its address is stored; a valid add stores it and proposes the change")
    func existingMemberRefusedFirst() throws {
        let (core, box, run) = try Self.leader()
        #expect(core.replica.raft.role == .leader)
        let before = Self.peers(core)
        box.actions = []
        core.addMember(1, node: 1, address: "attacker:7000")
        run()
        var refused = false
        for action in box.actions {
            if case .membership(1, .failure(let error)) = action { refused = "\(error)".contains("already a member") }
            if case .peerAddresses(let map) = action { #expect(map[1] != "attacker:7000", "the voter's address was replaced") }
        }
        #expect(refused, "\(box.actions)")
        #expect(Self.peers(core) == before)
        // Node id 0 is refused the same way.
        box.actions = []
        core.addMember(2, node: 0, address: "x:1")
        run()
        #expect(box.actions.contains { if case .membership(2, .failure) = $0 { true } else { false } })
        #expect(Self.peers(core) == before)
        // A new node: its address is stored and it joins as a learner.
        box.actions = []
        core.addMember(3, node: 4, address: "node4:7000")
        run()
        #expect(Self.peers(core).contains("node4:7000"))
        #expect(core.replica.raft.membership.learners == [4] || core.replica.raft.membership.voters.contains(4))
    }
}

/// The node core hands the large subtrees that applied writes replaced to its driver
/// (`NodeAction.release`) and keeps no reference to them itself: the server frees them on a
/// worker, off the loop that ticks Raft (docs/replica.md, "Freeing replaced subtrees").
@Suite struct ReleaseActionTests {
    @Test("an overwrite of a large subtree ends in one release action holding it; live views get the outcome without it")
    func overwriteOfALargeSubtree() throws {
        let (core, box, run) = try AddMemberValidationTests.leader()
        let big = "{" + (0..<3_000).map { #""k\#($0)":{"n":\#($0)}"# }.joined(separator: ",") + "}"
        core.write(10, namespace: "app", command: .set(path: "/big", json: Array(big.utf8)))
        run()
        core.watch(11, watch: 1, namespace: "app", stale: true)
        box.actions = []
        core.write(12, namespace: "app", command: .set(path: "/big", json: Array("null".utf8)))
        run()
        var released: [Tree] = []
        var watched = 0
        var acknowledged = false
        for action in box.actions {
            switch action {
            case .release(let trees): released += trees
            case .watch(1, .applied(let result, _)):
                watched += 1
                #expect(result.released.trees.isEmpty && result.released.handedOff)
            case .wrote(12, .success(let outcome)):
                acknowledged = outcome.outcome == .ok
                #expect(outcome.released.trees.isEmpty && outcome.released.handedOff, "the writer's answer kept the subtree")
            default: break
            }
        }
        #expect(acknowledged, "\(box.actions)")
        #expect(watched == 1)
        #expect(released.count == 1)
        #expect(released.first?.valueCount == 6_001)
        #expect(core.replica.machine.tree("app").isEmpty)
        // A small write releases nothing.
        box.actions = []
        core.write(13, namespace: "app", command: .set(path: "/small", json: Array("1".utf8)))
        run()
        #expect(!box.actions.contains { if case .release = $0 { true } else { false } })
    }
}
