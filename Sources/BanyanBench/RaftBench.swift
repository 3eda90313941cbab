import BanyanRaft
import BanyanSimulation

extension BanyanBench {
    // MARK: Raft core alone: 3 in-memory nodes, no I/O

    /// Commits `total` 100-byte commands through a 3-node cluster of bare cores (messages
    /// delivered in memory, persistence assumed instant), proposing `batch` commands per round.
    static func raftThroughput(batch: Int, total: Int) -> (seconds: Double, committed: UInt64, rounds: Int) {
        let ids: [NodeID] = [1, 2, 3]
        var nodes: [RaftNode] = []
        for id in ids {
            var config = RaftConfiguration(id: id, seed: id)
            config.maxInflightMessages = 256
            config.maxMessageBytes = 1 << 20
            config.maxUncommittedBytes = 256 << 20
            guard let n = try? RaftNode(configuration: config, restoring: RaftNode.bootstrapState(members: ids)) else {
                return (0, 0, 0)
            }
            nodes.append(n)
        }
        var inbox: [[Message]] = [[], [], []]
        func pump(_ nodes: inout [RaftNode], _ inbox: inout [[Message]]) -> Bool {
            var moved = false
            for i in 0..<3 {
                let msgs = inbox[i]
                inbox[i] = []
                for m in msgs { nodes[i].step(m) }
                while nodes[i].hasReady {
                    let rd = nodes[i].ready()
                    for m in rd.messages { inbox[Int(m.to) - 1].append(m); moved = true }
                    nodes[i].advance(rd)
                }
            }
            return moved
        }
        nodes[0].campaign()
        for _ in 0..<20 { _ = pump(&nodes, &inbox) }
        let payloads: [[UInt8]] = (0..<16).map { i in [UInt8](repeating: UInt8(i), count: 100) }
        let commands = (0..<batch).map { payloads[$0 % payloads.count] }
        let start = nodes[0].commitIndex
        var proposed = 0
        var rounds = 0
        let elapsed = seconds {
            while proposed < total {
                if (try? nodes[0].propose(commands)) != nil { proposed += batch }
                _ = pump(&nodes, &inbox)
                rounds += 1
                if rounds % 512 == 0 {
                    // Compaction keeps memory flat, as a real node's snapshots would.
                    for i in 0..<3 {
                        let applied = nodes[i].appliedIndex
                        if applied > 1_024 { _ = try? nodes[i].compact(through: applied - 1_024) }
                    }
                }
            }
            var guardRounds = 0
            while nodes.contains(where: { $0.appliedIndex < nodes[0].lastIndex }) && guardRounds < 10_000 {
                _ = pump(&nodes, &inbox)
                guardRounds += 1
            }
        }
        return (elapsed, nodes[0].commitIndex - start, rounds)
    }

    static func raft() {
        print("\n== raft core: 3 in-memory nodes, no I/O, 100-byte commands, applied on all three ==")
        for batch in [1, 16, 256, 1024] {
            let total = batch == 1 ? 200_000 : 2_000_000
            var rates: [Double] = []
            for _ in 0..<3 {
                let r = raftThroughput(batch: batch, total: total)
                rates.append(Double(r.committed) / r.seconds)
            }
            rates.sort()
            print("batch \(batch): committed entries/s median \(Int(rates[1])) (runs \(rates.map { Int($0) }))")
        }
        print("RSS \(rss())")
    }

    // MARK: The simulator

    static func simulation() {
        print("\n== whole-node simulator: 300 client operations per seed, one core ==")
        for faults in [false, true] {
            var events = 0
            var simulatedMillis = 0
            var failed = 0
            let count = 40
            let elapsed = seconds {
                for seed in UInt64(1)...UInt64(count) {
                    var options = WholeNodeOptions(seed: seed)
                    options.faults = faults
                    let r = WholeNodeSimulator.run(options)
                    events += r.stats.events
                    simulatedMillis += r.stats.simulatedMillis
                    if !r.passed { failed += 1 }
                }
            }
            print(
                "\(faults ? "with faults" : "no faults  "): \(format(Double(count) / elapsed)) seeds/s, \(Int(Double(events) / elapsed)) events/s,"
                    + " \(format(Double(simulatedMillis) / 1000 / elapsed)) simulated s per s (\(count) seeds, \(failed) failed)"
            )
        }
    }
}
