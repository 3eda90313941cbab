import BanyanBasics
import BanyanCheckers
import BanyanNode
import BanyanSimulation
import Testing

/// The whole-node simulator (docs/simulator.md, "Whole-node simulation"): real node cores over
/// simulated disks and network. Seeds print with every failure; replay one of the 1,000 seeds
/// with `swift run -c release banyan-sim --seed N --operations 120` (the regression seeds run
/// with 300, `banyan-sim`'s default).
@Suite struct WholeNodeSimulatorTests {
    static func options(_ seed: UInt64, operations: Int = 120) -> WholeNodeOptions {
        var o = WholeNodeOptions(seed: seed)
        o.operations = operations
        return o
    }

    /// With the presence workload (`banyan-sim --sessions`).
    static func sessionOptions(_ seed: UInt64, operations: Int = 120) -> WholeNodeOptions {
        var o = options(seed, operations: operations)
        o.sessions = true
        return o
    }

    /// 1,000 seeds in ten parts (run in parallel by the test runner).
    @Test("1,000 whole-node seeds keep every safety check, converge, and stay linearizable", arguments: 0..<10)
    func seeds(part: Int) {
        var failures: [String] = []
        var excused: [String] = []
        for seed in UInt64(part * 100 + 1)...UInt64(part * 100 + 100) {
            let report = WholeNodeSimulator.run(Self.options(seed))
            if !report.passed { failures.append(report.summary) }
            if report.livenessNotRequired { excused.append(report.summary) }
        }
        #expect(failures.isEmpty, "\(failures.count) seeds failed:\n\(failures.prefix(3).joined(separator: "\n"))")
        // Seeds beyond the fault budget pass without converging (docs/simulator.md, "The fault
        // budget"); they are rare (a handful in 100,000 soak seeds), so more than one in a part of 100
        // means refused logs became common: a storage regression, not bad luck.
        #expect(excused.count <= 1, "\(excused.count) seeds beyond the fault budget:\n\(excused.prefix(3).joined(separator: "\n"))")
    }

    /// Realtime connections (issue 15): presence with onDisconnect writes on nodes that crash,
    /// pause, lose power and restart, ended by closes, by `ls` from other nodes, by fences and by
    /// node leases.
    @Test("200 seeds with realtime connections: every queue fires exactly once, never while its connection is served, none is lost", arguments: 0..<2)
    func sessionSeeds(part: Int) {
        var failures: [String] = []
        var fired = 0
        var fences = 0
        for seed in UInt64(part * 100 + 1)...UInt64(part * 100 + 100) {
            let report = WholeNodeSimulator.run(Self.sessionOptions(seed))
            if !report.passed { failures.append(report.summary) }
            fired += report.stats.presencesFired
            fences += report.stats.leaseFences
        }
        #expect(failures.isEmpty, "\(failures.count) seeds failed:\n\(failures.prefix(3).joined(separator: "\n"))")
        // The workload reaches what it is for: queues fire, and some nodes fence themselves.
        #expect(fired > 1_000 && fences > 0, "fired \(fired), fences \(fences)")
    }

    @Test("the checker catches a lease keeper that ignores renewals (onDisconnect fired while the connection is served)")
    func leaseSabotage() {
        var caught: UInt64?
        for seed in UInt64(1)...UInt64(100) {
            // Longer runs (300 operations): a holder must outlive a lease while it serves.
            var o = Self.sessionOptions(seed, operations: 300)
            o.sabotage = .leaseIgnoresRenewals
            let report = WholeNodeSimulator.run(o)
            if report.violations.contains(where: { $0.contains("still served its connection") }) {
                caught = seed
                var clean = o
                clean.sabotage = .none
                #expect(WholeNodeSimulator.run(clean).passed, "seed \(seed) fails without the sabotage too")
                break
            }
        }
        #expect(caught != nil, "a lease keeper ignoring renewals went unnoticed in 100 seeds")
    }

    @Test("a seed replays exactly: the same events, in the same order, with the same outcome")
    func replay() {
        var o = Self.options(7)
        o.trace = true
        let a = WholeNodeSimulator.run(o)
        let b = WholeNodeSimulator.run(o)
        #expect(a.traceHash == b.traceHash)
        #expect(a.trace == b.trace)
        #expect(a.summary == b.summary)
        #expect(a.trace.count > 1_000)
    }

    @Test("the seeds exercise every fault family and the real storage paths")
    func coverage() {
        var total = WholeNodeReport.Stats()
        for seed in UInt64(1)...60 {
            let s = WholeNodeSimulator.run(Self.options(seed)).stats
            total.diskCrashes += s.diskCrashes
            total.powerLosses += s.powerLosses
            total.crashes += s.crashes
            total.gracefulRestarts += s.gracefulRestarts
            total.membershipChanges += s.membershipChanges
            total.snapshotsWritten += s.snapshotsWritten
            total.snapshotsInstalled += s.snapshotsInstalled
            total.writesUnknown += s.writesUnknown
            total.writesPatched += s.writesPatched
            total.leaderChanges += s.leaderChanges
            total.fileOperations += s.fileOperations
            total.messagesDropped += s.messagesDropped
            total.pauses += s.pauses
            total.disksLost += s.disksLost
            total.syncFailures += s.syncFailures
        }
        #expect(total.pauses > 10, "pauses \(total.pauses)")
        #expect(total.disksLost > 2, "lost disks \(total.disksLost)")
        #expect(total.syncFailures > 3, "failed fsyncs \(total.syncFailures)")
        #expect(total.diskCrashes > 20, "disk crashes \(total.diskCrashes)")
        #expect(total.powerLosses > 3, "power losses \(total.powerLosses)")
        #expect(total.crashes > 10, "kills \(total.crashes)")
        #expect(total.gracefulRestarts > 3, "graceful restarts \(total.gracefulRestarts)")
        #expect(total.membershipChanges > 10, "membership changes \(total.membershipChanges)")
        #expect(total.snapshotsWritten > 10 && total.snapshotsInstalled > 3, "snapshots \(total.snapshotsWritten)/\(total.snapshotsInstalled)")
        #expect(total.writesUnknown > 0 && total.writesPatched > 0)
        #expect(total.messagesDropped > 0)
        #expect(total.fileOperations > 50_000)
    }

    /// Each known bug put back into the real code must make some seed fail, with the check that
    /// names it (the checkers are not vacuous). An empty symptom accepts any failure; "linearizable"
    /// requires the linearizability checker's verdict.
    /// The budgets leave room above the first seed that catches each today (docs/simulator.md,
    /// "Self-tests"). Items 1, 3 and 5 need rare coincidences (two configuration entries in one
    /// append and a crash between two fsyncs; a lost disk in an uncompacted log; a read-index
    /// answer that outlives its follower's restart): one seed in 100 to 250.
    @Test("the simulator catches each known bug when it is put back", arguments: [
        (Sabotage.inMemoryCommit, "commit permanence", 400),
        (Sabotage.configurationBeforeCommit, "below the configuration entry before it", 1_000),
        (Sabotage.replayedAdmission, "regained its vote", 600),
        (Sabotage.anyVoterIncarnation, "regained its vote", 600),
        (Sabotage.cutAnyDamage, "durability", 400),
        (Sabotage.reusedReadContexts, "linearizable", 600),
        // Item 7: the restarted node serves records whose fsync failed; a later power loss takes
        // them, and the damage shows as lost commits or a cluster that cannot recover.
        (Sabotage.readThroughPageCache, "", 400),
        (Sabotage.forgetVote, "election safety", 400),
        (Sabotage.skipConsistencyCheck, "log matching", 400),
        (Sabotage.sendBeforePersist, "", 400),
        (Sabotage.localReads, "linearizable", 400),
        (Sabotage.leaseWithPauses, "linearizable", 400),
    ] as [(Sabotage, String, Int)])
    func sabotage(_ sabotage: Sabotage, _ symptom: String, _ budget: Int) {
        var caught: UInt64?
        for seed in UInt64(1)...UInt64(budget) {
            var o = Self.options(seed, operations: 300)
            o.sabotage = sabotage
            let report = WholeNodeSimulator.run(o)
            let seen =
                symptom.isEmpty
                ? !report.passed
                : symptom == "linearizable"
                    ? report.linearizability == .notLinearizable : report.violations.contains(where: { $0.contains(symptom) })
            if seen {
                caught = seed
                // The failure is the sabotage's: the same seed passes with the real code.
                var clean = o
                clean.sabotage = .none
                #expect(WholeNodeSimulator.run(clean).passed, "seed \(seed) fails without \(sabotage) too")
                break
            }
        }
        #expect(caught != nil, "\(sabotage) went unnoticed in \(budget) seeds")
    }

    /// Seeds that found bugs, replayed with the soak's settings (docs/simulator.md, "Seeds that
    /// found bugs").
    @Test("the seeds that found bugs pass", arguments: [52697, 50654, 60040, 67023, 317, 111100, 108021, 310515, 414080, 500316, 506651, 1002241, 103192, 110736, 114833, 212484, 312337, 402147, 411570, 1116537, 1126036, 1176258, 1180895, 1253064] as [UInt64])
    func regressionSeed(_ seed: UInt64) {
        let report = WholeNodeSimulator.run(Self.options(seed, operations: 300))
        #expect(report.passed, "\(report.summary)")
    }
}

extension WholeNodeSimulatorTests {
    /// Session runs of 300 operations that found snapshot-stream liveness bugs: 333, 354, 369,
    /// 428 and 579 (a leader compacting faster than it could stream its image restarted the
    /// stream forever, so a late node never caught up), and 307 (after a compaction, a stalled
    /// stream asked for its old offset in the new, shorter snapshot and was never answered).
    @Test("the session seeds that found snapshot-stream bugs pass", arguments: [307, 333, 369, 579] as [UInt64])
    func sessionRegressionSeed(_ seed: UInt64) {
        let report = WholeNodeSimulator.run(Self.sessionOptions(seed, operations: 300))
        #expect(report.passed, "\(report.summary)")
    }

    /// Runs of 300 operations with sessions and client writes (session and client records grow
    /// the image to about 5.5 KB) where the leader's compaction, deferred by four snapshot
    /// intervals of entries, still restarted every 64-byte-chunk stream before it finished: new
    /// and lagging members never caught up within 30 s of healing (5028, 5039, 5064; the
    /// symptoms included a last onDisconnect queue still waiting when the run stopped).
    @Test("the session and client-write seeds whose snapshot streams never finished pass", arguments: [5028, 5039, 5064] as [UInt64])
    func sessionClientWriteRegressionSeed(_ seed: UInt64) {
        var o = Self.sessionOptions(seed, operations: 300)
        o.clientWrites = true
        let report = WholeNodeSimulator.run(o)
        #expect(report.passed, "\(report.summary)")
    }
}

extension WholeNodeSimulatorTests {
    /// Issue 18: a namespace quota set and raised through the log; every node refuses the same
    /// writes (the convergence check compares every node's state, `$quotas` included), and a
    /// refused write never shows in a history. Every other seed also resends client writes, so a
    /// refusal is answered alike to a later copy.
    @Test("60 seeds with a namespace quota: writes over it are refused alike on every node and never show; some are refused")
    func quotaSeeds() {
        var failed: [UInt64] = []
        var overQuota = 0
        var ok = 0
        for seed in UInt64(1)...UInt64(60) {
            var o = Self.options(seed)
            o.quota = true
            o.clientWrites = seed % 2 == 0
            let report = WholeNodeSimulator.run(o)
            overQuota += report.stats.writesOverQuota
            ok += report.stats.writesOK
            if !report.passed { failed.append(seed) }
        }
        #expect(failed.isEmpty, "failed seeds: \(failed)")
        #expect(overQuota > 60 && overQuota < ok / 2, "\(overQuota) of \(ok) answered writes were over the quota")
    }
}

extension WholeNodeSimulatorTests {
    static func rulesOptions(_ seed: UInt64) -> WholeNodeOptions {
        var o = options(seed)
        o.rules = true
        return o
    }

    /// Issue 16: rules changes and the writes judged around them are decided identically on
    /// every node (the convergence check compares every node's state), with denied writes absent
    /// from every history.
    @Test("100 seeds with security rules in the log: every node judges every write alike; some writes are denied")
    func rulesSeeds() {
        var failed: [UInt64] = []
        var denied = 0
        for seed in UInt64(1)...UInt64(100) {
            let report = WholeNodeSimulator.run(Self.rulesOptions(seed))
            denied += report.stats.writesDenied
            if !report.passed { failed.append(seed) }
        }
        #expect(failed.isEmpty, "failed seeds: \(failed)")
        #expect(denied > 100, "only \(denied) writes were denied: the rules are not exercised")
    }

    @Test("the checker catches a node that forgets its rules when it loads an image (restart or snapshot install)")
    func forgottenRulesCaught() {
        var caught: UInt64?
        for seed in UInt64(1)...UInt64(20) {
            var o = Self.rulesOptions(seed)
            o.sabotage = .forgetRulesOnLoad
            let report = WholeNodeSimulator.run(o)
            if !report.passed {
                // Seen as a node's state differing from the others', a write denied for its client yet
                // applied, or a history that is not linearizable.
                let symptom = report.violations.contains { $0.contains("convergence") || $0.contains("refused definitely was applied") }
                #expect(symptom || report.linearizability == .notLinearizable, "\(report.violations.prefix(3))")
                #expect(WholeNodeSimulator.run(Self.rulesOptions(seed)).passed, "seed \(seed) fails without the sabotage too")
                caught = seed
                break
            }
        }
        #expect(caught != nil, "no seed of 20 caught a node judging without its rules")
    }
}

extension WholeNodeSimulatorTests {
    static func clientWriteOptions(_ seed: UInt64) -> WholeNodeOptions {
        var o = options(seed)
        o.clientWrites = true
        return o
    }

    /// Issue 17: data writes carry their client and number (as the Swift SDK's do); a write that
    /// failed or timed out goes again through another node, and every node decides each
    /// (client, number) once, answering later copies from the first one's outcome.
    @Test("100 seeds with client writes: resent writes are decided once; some copies are answered from an earlier one")
    func clientWriteSeeds() {
        var failed: [UInt64] = []
        var resent = 0
        var earlier = 0
        for seed in UInt64(1)...UInt64(100) {
            let report = WholeNodeSimulator.run(Self.clientWriteOptions(seed))
            resent += report.stats.clientResends
            earlier += report.stats.clientAlreadyApplied
            if !report.passed { failed.append(seed) }
        }
        #expect(failed.isEmpty, "failed seeds: \(failed)")
        #expect(resent > 50 && earlier > 20, "only \(resent) resends and \(earlier) answers from earlier copies: not exercised")
    }

    @Test("the checker catches a state machine that does not look up earlier copies of a client write")
    func ignoredClientWritesCaught() {
        var caught: UInt64?
        for seed in UInt64(1)...UInt64(20) {
            var o = Self.clientWriteOptions(seed)
            o.sabotage = .ignoreClientWrites
            let report = WholeNodeSimulator.run(o)
            if !report.passed {
                let symptom = report.violations.contains { $0.contains("decided client write") || $0.contains("exactly-once") }
                #expect(symptom || report.linearizability == .notLinearizable, "\(report.violations.prefix(3))")
                #expect(WholeNodeSimulator.run(Self.clientWriteOptions(seed)).passed, "seed \(seed) fails without the sabotage too")
                caught = seed
                break
            }
        }
        #expect(caught != nil, "no seed of 20 caught a client write decided twice")
    }
}

extension WholeNodeSimulatorTests {
    /// Catch-up stalls (2026-11-30), at 300 operations. 169 and 133 with sessions and client
    /// writes: a restarted leader replayed its log reading every entry ahead, one at a time, each
    /// answer after 1–25 simulated ms (about 80 entries a second), so its own writes (the
    /// operator model's re-add of a replaced node) timed out for 20 s; the read-ahead model now
    /// answers in 1–3 ms, one in ten slower. 100021 with a quota as well: snapshots every 16
    /// entries outran a 64-byte-chunk stream to a voter one entry behind, and each compaction
    /// restarted it; compaction now waits for a live stream (`Replica.compactionPoint`).
    @Test("the seeds whose catch-up stalled pass", arguments: [169, 133, 100021] as [UInt64])
    func catchUpStallSeed(_ seed: UInt64) {
        var o = Self.sessionOptions(seed, operations: 300)
        o.clientWrites = true
        o.quota = seed == 100021
        let report = WholeNodeSimulator.run(o)
        #expect(report.passed, "\(report.summary)")
    }

    @Test(
        "the checkers catch staged payloads mishandled: a follower accepting appends that name payloads it lacks (I1), a sweep removing files the log names (I3)",
        arguments: [(Sabotage.acceptUnheldPayloads, "(I1)"), (Sabotage.removeNamedPayloads, "(I3)")])
    func stagingSabotageCaught(sabotage: Sabotage, invariant: String) {
        var caught: UInt64?
        for seed in UInt64(1)...UInt64(12) {
            var o = Self.options(seed)
            o.sabotage = sabotage
            let report = WholeNodeSimulator.run(o)
            if report.violations.contains(where: { $0.contains(invariant) }) {
                let plain = WholeNodeSimulator.run(Self.options(seed))
                #expect(plain.passed && plain.livenessFailure == nil, "seed \(seed) fails without the sabotage too: \(plain.summary)")
                caught = seed
                break
            }
        }
        #expect(caught != nil, "no seed of 1–12 caught \(sabotage)")
    }

    @Test("the checker catches snapshots and compaction that ignore live snapshot streams")
    func restartedStreamsCaught() {
        var caught: UInt64?
        // From 340: seed 307 fails under the sabotage too, but unsabotaged it is excused by the
        // fault budget (a sabotaged run never is), so it proves nothing about streams.
        for seed in UInt64(340)...UInt64(360) {
            var o = Self.sessionOptions(seed, operations: 300)
            o.sabotage = .restartSnapshotStreams
            let report = WholeNodeSimulator.run(o)
            if !report.passed {
                #expect(report.violations.contains { $0.contains("convergence") } || report.livenessFailure != nil, "\(report.violations.prefix(3))")
                let plain = WholeNodeSimulator.run(Self.sessionOptions(seed, operations: 300))
                #expect(plain.passed && plain.livenessFailure == nil, "seed \(seed) fails, or is excused, without the sabotage too: \(plain.summary)")
                caught = seed
                break
            }
        }
        #expect(caught != nil, "no seed of 340–360 caught a stream restarted by compaction")
    }
}
