/// Deliberate bugs the whole-node simulator reintroduces to prove its checkers catch them
/// (docs/simulator.md, "Self-tests"). Each one undoes a fix of issue 14. Never set by the server:
/// `NodeRuntime` always runs with `.none`.
public enum NodeSabotage: String, Sendable, Equatable, CaseIterable {
    case none
    /// Item 1: a configuration entry becomes durable before the commit covering the one before
    /// it (the batch is written in one piece and the commit saved after it, lazily).
    case configurationBeforeCommit = "configuration-before-commit"
    /// Item 2: shutdown and the step after a snapshot save the in-memory commit index, which may
    /// cover entries that are not durable or that replaced a divergent suffix only in memory.
    case inMemoryCommit = "in-memory-commit"
    /// Item 7: after a failed fsync the restarted node reads its log through the page cache,
    /// where the bytes whose write failed still look written.
    case readThroughPageCache = "read-through-page-cache"
}
