import BanyanNode
import BanyanSimulation
import Testing

/// The whole-node simulator (docs/simulator.md, "Whole-node simulation"): real node cores over
/// simulated disks and network. Seeds print with every failure; replay one with
/// `swift run -c release banyan-sim --whole-node --seed N`.
@Suite struct WholeNodeSimulatorTests {
    static func options(_ seed: UInt64, operations: Int = 120) -> WholeNodeOptions {
        var o = WholeNodeOptions(seed: seed)
        o.operations = operations
        return o
    }

    /// 1,000 seeds in ten parts (run in parallel by the test runner).
    @Test("1,000 whole-node seeds keep every safety check, converge, and stay linearizable", arguments: 0..<10)
    func seeds(part: Int) {
        var failures: [String] = []
        for seed in UInt64(part * 100 + 1)...UInt64(part * 100 + 100) {
            let report = WholeNodeSimulator.run(Self.options(seed))
            if !report.passed { failures.append(report.summary) }
        }
        #expect(failures.isEmpty, "\(failures.count) seeds failed:\n\(failures.prefix(3).joined(separator: "\n"))")
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
        }
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

    /// Each fix of issue 14 undone in the real code must make some seed fail, with the check
    /// that names it (the checkers are not vacuous).
    @Test("the simulator catches each storage-seam bug when it is reintroduced", arguments: [
        (NodeSabotage.inMemoryCommit, "commit permanence"),
        (NodeSabotage.configurationBeforeCommit, "below the configuration entry before it"),
        // Item 7: the restarted node serves records whose fsync failed; a later power loss takes
        // them, and the damage shows as lost commits or a cluster that cannot recover.
        (NodeSabotage.readThroughPageCache, ""),
    ])
    func sabotage(_ sabotage: NodeSabotage, _ symptom: String) {
        var caught: UInt64?
        for seed in UInt64(1)...400 {
            var o = Self.options(seed, operations: 300)
            o.sabotage = sabotage
            let report = WholeNodeSimulator.run(o)
            let seen = symptom.isEmpty ? !report.passed : report.violations.contains(where: { $0.contains(symptom) })
            if seen {
                caught = seed
                break
            }
        }
        #expect(caught != nil, "\(sabotage) went unnoticed in 400 seeds")
    }
}
