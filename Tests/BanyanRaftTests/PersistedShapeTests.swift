import BanyanBasics
import BanyanRaft
import Testing

/// Item 6 of issue 14: the core refuses a restored state whose log has the wrong shape, and a
/// peer's append with entries out of order is dropped instead of trapping.
@Suite struct PersistedShapeTests {
    static let configuration = RaftConfiguration(id: 1, seed: 5)

    static func entry(_ index: UInt64, _ term: UInt64) -> LogEntry {
        LogEntry(index: index, term: term, kind: .command, data: [UInt8(truncatingIfNeeded: index)])
    }

    static func refuses(_ persisted: PersistedState, sabotage: Sabotage = .none) -> Bool {
        var configuration = configuration
        configuration.sabotage = sabotage
        do {
            _ = try RaftNode(configuration: configuration, restoring: persisted)
            return false
        } catch {
            if case .invalidPersistedState = error { return true }
            return false
        }
    }

    @Test("a log without a snapshot must start at index 1")
    func logStartsAtOne() {
        #expect(Self.refuses(PersistedState(hardState: HardState(term: 1, mayVote: true), entries: [Self.entry(2, 1), Self.entry(3, 1)])))
        #expect(!Self.refuses(PersistedState(hardState: HardState(term: 1, mayVote: true), entries: [Self.entry(1, 1), Self.entry(2, 1)])))
    }

    @Test("entries must continue the snapshot, be consecutive, and never go down in term")
    func shape() {
        let snapshot = SnapshotMeta(index: 10, term: 2, membership: Membership(voters: [1, 2, 3]))
        #expect(Self.refuses(PersistedState(hardState: HardState(term: 2, mayVote: true), snapshot: snapshot, entries: [Self.entry(12, 2)])))
        #expect(Self.refuses(PersistedState(hardState: HardState(term: 2, mayVote: true), snapshot: snapshot, entries: [Self.entry(11, 2), Self.entry(13, 2)])))
        #expect(Self.refuses(PersistedState(hardState: HardState(term: 3, mayVote: true), snapshot: snapshot, entries: [Self.entry(11, 3), Self.entry(12, 2)])))
        #expect(Self.refuses(PersistedState(hardState: HardState(term: 3, mayVote: true), snapshot: snapshot, entries: [Self.entry(11, 1)])))
        #expect(!Self.refuses(PersistedState(hardState: HardState(term: 3, mayVote: true), snapshot: snapshot, entries: [Self.entry(11, 2), Self.entry(12, 3)])))
    }

    @Test("the commit index must lie inside the log")
    func commitInsideLog() {
        #expect(Self.refuses(PersistedState(hardState: HardState(term: 1, commit: 3, mayVote: true), entries: [Self.entry(1, 1), Self.entry(2, 1)])))
        #expect(!Self.refuses(PersistedState(hardState: HardState(term: 1, commit: 2, mayVote: true), entries: [Self.entry(1, 1), Self.entry(2, 1)])))
    }

    @Test("an append whose entries are out of order is dropped, counted, and changes nothing", arguments: [[3, 2], [2, 4], [2, 2], [5]])
    func outOfOrderAppend(indexes: [UInt64]) throws {
        var node = try RaftNode(configuration: Self.configuration, restoring: RaftNode.bootstrapState(members: [1, 2, 3]))
        let entries = indexes.map { Self.entry($0, 2) }
        node.step(Message(from: 2, to: 1, term: 2, body: .append(prevIndex: 1, prevTerm: 1, entries: entries, commit: 1)))
        #expect(node.invalidMessages == 1)
        #expect(node.lastIndex == 1)
    }

    /// The checks above, undone (`--sabotage unchecked-log-shape`): the same inputs get through,
    /// so the tests above are what stands between them and a log with gaps. (Only appends with
    /// gaps are sent here: an out-of-order append can trap the unchecked arithmetic, which is the
    /// crash item 6 names.)
    @Test("with the shape checks sabotaged, a misshapen restored log is taken and an append with a gap corrupts the log")
    func sabotaged() throws {
        let start2 = PersistedState(hardState: HardState(term: 1, mayVote: true), entries: [Self.entry(2, 1), Self.entry(3, 1)])
        #expect(Self.refuses(start2))
        #expect(!Self.refuses(start2, sabotage: .uncheckedLogShape))
        let beyond = PersistedState(hardState: HardState(term: 1, commit: 3, mayVote: true), entries: [Self.entry(1, 1), Self.entry(2, 1)])
        #expect(!Self.refuses(beyond, sabotage: .uncheckedLogShape))
        for indexes: [UInt64] in [[5], [2, 4]] {
            var configuration = Self.configuration
            configuration.sabotage = .uncheckedLogShape
            var node = try RaftNode(configuration: configuration, restoring: RaftNode.bootstrapState(members: [1, 2, 3]))
            node.step(Message(from: 2, to: 1, term: 2, body: .append(prevIndex: 1, prevTerm: 1, entries: indexes.map { Self.entry($0, 2) }, commit: 1)))
            #expect(node.invalidMessages == 0, "\(indexes)")
            #expect(node.lastIndex == 1 + UInt64(indexes.count), "\(indexes): the entries were taken")
            // Position 2 of the log now holds an entry numbered otherwise, or a later one does.
            let numbered = (2...node.lastIndex).map { node.entry(at: $0)?.index }
            #expect(numbered != (2...node.lastIndex).map { Optional($0) }, "\(indexes): the log is misnumbered")
        }
    }
}
