/// Deliberate bugs the whole-node simulator reintroduces into the real code to prove its checkers
/// catch them (docs/simulator.md, "Self-tests"). Each undoes one fix or breaks one assumption the
/// checklist in docs/raft.md names. Never set by the server: `NodeRuntime` always runs with
/// `.none`, and nothing reads it from configuration files or flags other than `banyan-sim`'s.
public enum Sabotage: String, Sendable, Equatable, CaseIterable {
    case none
    /// Issue 14, item 1: a configuration entry becomes durable before the commit covering the
    /// one before it (the batch is written in one piece and the commit saved after it, lazily).
    case configurationBeforeCommit = "configuration-before-commit"
    /// Issue 14, item 2: shutdown and the step after a snapshot save the in-memory commit index,
    /// which may cover entries that are not durable or that replaced a divergent suffix only in
    /// memory.
    case inMemoryCommit = "in-memory-commit"
    /// Issue 14, item 3: any committed configuration naming this id as a learner gives the node
    /// its vote back, whatever incarnation it names (a wiped node replaying its own history).
    case replayedAdmission = "replayed-admission"
    /// Issue 14, item 4: damage in the last log segment is cut in place as a torn tail, even
    /// when records the markers prove synced follow it.
    case cutAnyDamage = "cut-any-damage"
    /// Issue 14, item 5: read-index contexts restart at 1 in every replica, and a follower takes
    /// an answer from any peer of its term.
    case reusedReadContexts = "reused-read-contexts"
    /// Issue 14, item 6: the core takes a restored log of any shape (not starting after the
    /// snapshot, with gaps, commit beyond the end), and a follower takes a peer's append whose
    /// entries are not numbered prevIndex+1, prevIndex+2, …, leaving gaps in its log. Unit tests
    /// only (`PersistedShapeTests`): honest simulated peers never send such appends.
    case uncheckedLogShape = "unchecked-log-shape"
    /// Issue 14, item 7: after a failed fsync the restarted node reads its log through the page
    /// cache, where the bytes whose write failed still look written.
    case readThroughPageCache = "read-through-page-cache"
    /// Recovery syncs the records it recovered without recording that sync on disk (no empty
    /// batch, no new segment after a sealed one), so a bad sector found at a later start in
    /// the last batch reads as a torn unsynced write and is cut (soak seed 1002241).
    case unrecordedRecoverySync = "unrecorded-recovery-sync"
    /// Recovery ignores the record of the last sync that only the page cache shows (a failed
    /// fsync kept it from the disk), so a bad sector later found in the batch it vouched for
    /// reads as a torn write and synced records are cut (soak seed 1126036).
    case ignoreCachedSyncRecord = "ignore-cached-sync-record"
    /// A vote request gives a node without its vote the vote whatever incarnation the
    /// candidate's configuration records for it (not only its own), so a wiped node votes with
    /// amnesia as soon as a candidate names its previous incarnation.
    case anyVoterIncarnation = "any-voter-incarnation"
    /// A leader counts the acknowledgements of a voter that came back blank (it may not vote)
    /// towards commits and reads, though it may have forgotten a newer term (soak seed 1116537).
    case amnesiacAcknowledgements = "amnesiac-acknowledgements"
    /// A follower takes a heartbeat's commit index without checking that its entry there is the
    /// leader's (the term the heartbeat names), so a heartbeat computed for a wiped node's
    /// earlier incarnation commits entries a stale leader gave the new one (soak seed 1116537).
    case unverifiedHeartbeatCommit = "unverified-heartbeat-commit"
    /// The leader's lease keeper counts a node lease from the moment it first sees the holder and
    /// ignores its renewals, so a node still serving its connections has their onDisconnect
    /// writes fired (issue 15).
    case leaseIgnoresRenewals = "lease-ignores-renewals"
    /// R3: the vote is not kept across a restart, so a node can vote twice in one term.
    case forgetVote = "forget-vote"
    /// R26 (etcd #14370): messages that depend on new entries go out before those entries are
    /// durable, so a crash loses what a leader already counted.
    case sendBeforePersist = "send-before-persist"
    /// Log matching (Raft §5.3): a follower appends after `prevIndex` without checking that its
    /// entry there has `prevTerm`, so it can keep a stale entry under a leader's newer ones.
    case skipConsistencyCheck = "skip-consistency-check"
    /// R17: linearizable reads are served from the local state, without a read-index round.
    case localReads = "local-reads"
    /// R18: lease-based reads while leaders get paused (SIGSTOP), which breaks the lease's
    /// clock assumption. Not a code change: the simulator turns on both.
    case leaseWithPauses = "lease-with-pauses"
    /// Issue 16: a state machine loaded from an image (a restart, a snapshot install) forgets the
    /// security rules it holds, so that node accepts writes the others refuse (`--rules`).
    case forgetRulesOnLoad = "forget-rules-on-load"
    /// Issue 17: a state machine loaded from an image (a restart, a snapshot install) forgets
    /// the client write records, so a client's resent write can be decided twice
    /// (`--client-writes`).
    case forgetClientWritesOnLoad = "forget-client-writes-on-load"
    /// Issue 17: the state machine records client writes but never looks them up, so a write a
    /// client sends again after a lost answer is decided again (`--client-writes`).
    case ignoreClientWrites = "ignore-client-writes"
    /// Snapshots and compaction ignore live snapshot streams (no deferral, no hold): a snapshot
    /// written mid-stream compacts past the streamed one, the stream restarts from its first
    /// byte with the newer snapshot, and a follower whose stream is slower than the snapshots
    /// never catches up (with `--sessions --operations 300`: 347, 354, 369 of 301–400; before
    /// the fix, 100021 with `--quota --sessions --client-writes` unsabotaged). `ReplicaConfiguration.compactionWaitsForStreams` false and
    /// `snapshotDeferral` 1.
    case restartSnapshotStreams = "restart-snapshot-streams"
    /// Staged payloads (docs/staged-payloads.md): a follower accepts appends naming payloads it
    /// does not hold (I1 broken): a node elected
    /// with such a log may be unable to apply it.
    case acceptUnheldPayloads = "accept-unheld-payloads"
    /// Sweeps remove staged files whatever the log names (I3 broken).
    case removeNamedPayloads = "remove-named-payloads"
}
