public import BanyanCheckers
import Foundation
import NIOHTTP1
import Synchronization

/// `banyan chaos check` (docs/chaos.md): the register workload of the multi-process tests
/// (`RegisterWorkload`: clients reading, writing and compare-and-setting registers through
/// random nodes) and a set workload (one client adding unique keys) run through a seeded fault
/// schedule (`ChaosRunner`). Afterwards every key is read through every node, the register
/// history goes to the linearizability checker, and every acknowledged set write must be in
/// each node's linearizable read of the set: an acknowledged write that is missing is lost.
public enum ChaosCheck {
    public struct Outcome: Sendable {
        public var run: ChaosRunner.Report
        public var verdict: LinearizabilityVerdict
        public var registerCounts: RegisterWorkload.Counts
        public var registerOperations: Int
        public var setAcknowledged: Int
        public var setUnknown: Int
        /// Acknowledged set writes missing from some node's final read, by node.
        public var lost: [UInt64: [Int]]
        /// Nodes whose final reads could not all be made within the bound.
        public var unread: [UInt64]
        public var namespace: String
        /// For a history that is not linearizable: where it first shows (see `describeViolation`).
        public var violation: String?
        /// Every register operation as a JSON line (times in seconds on the run's clock).
        public var historyLines: [String]

        public var lostCount: Int { Set(lost.values.joined()).count }
        /// A safety violation: not linearizable, or an acknowledged write lost.
        public var violated: Bool { verdict == .notLinearizable || lostCount > 0 }
        /// Linearizable, nothing lost, every node read, and the cluster recovered from every fault.
        public var passed: Bool { verdict == .linearizable && lostCount == 0 && unread.isEmpty && run.unrecovered.isEmpty && run.recoveredAtEnd }
    }

    public static func run(
        controller: ChaosController, schedule: ChaosSchedule, seconds: Double, clients: Int = 4, recoveryBound: Double = 30,
        started: @Sendable (ChaosRunner) -> Void = { _ in }
    ) async throws -> Outcome {
        let namespace = "chaoscheck\(Int(Date().timeIntervalSince1970))s\(schedule.seed)"
        let runner = try ChaosRunner(controller: controller, schedule: schedule, seconds: seconds, recoveryBound: recoveryBound, probeNamespace: namespace)
        let workload = RegisterWorkload(cluster: controller, keys: 4, namespace: namespace)
        let set = SetWorkload(cluster: controller, namespace: namespace)
        controller.log("workload: \(clients) register clients on keys \(workload.keys.joined(separator: ",")) and 1 set client, namespace \(namespace)")
        let live = runner.live
        async let load: Void = workload.run(clients: clients, seconds: seconds, nodes: { live.nodes })
        async let adds: Void = set.run(seconds: seconds, nodes: { live.nodes })
        started(runner)
        let report: ChaosRunner.Report
        do {
            report = try await runner.run()
        } catch {
            workload.stop()
            set.stop()
            await load
            await adds
            throw error
        }
        // The schedule ends early only when interrupted: the workloads stop with it.
        workload.stop()
        set.stop()
        await load
        await adds
        controller.log("workload stopped: registers \(workload.counts); set \(set.acknowledged.count) acknowledged, \(set.unknown.count) unknown")
        if workload.reachedCap {
            controller.log("the register clients stopped at their cap of \(workload.maxOperations) operations (the history is checked whole); the faults and the set went on")
        }
        // Final reads through every node (each must answer a linearizable read once caught up).
        let ids = try controller.state().ids
        var unread: [UInt64] = []
        var lost: [UInt64: [Int]] = [:]
        for id in ids {
            let deadline = Date().addingTimeInterval(recoveryBound)
            var registersRead = false
            var members: Set<Int>?
            while Date() < deadline && (!registersRead || members == nil) {
                if !registersRead { registersRead = await workload.finalReads(nodes: [id]) }
                if members == nil { members = await set.read(through: id) }
                if !registersRead || members == nil { try await Task.sleep(nanoseconds: 200_000_000) }
            }
            guard registersRead, let members else {
                unread.append(id)
                continue
            }
            let missing = set.acknowledged.subtracting(members).sorted()
            if !missing.isEmpty { lost[id] = missing }
        }
        controller.log("checking \(workload.history.count) register operations for linearizability")
        let verdict = workload.check()
        // Operation times on the run's clock (seconds), so they line up with the printed faults.
        let offset = Double(Int64(workload.start) - Int64(runner.started)) / 1e9
        func onRunClock(_ ns: Int) -> Double { offset + Double(ns) / 1e9 }
        var violation: String?
        if verdict == .notLinearizable, let found = workload.earliestViolation() {
            violation = describeViolation(key: found.key, operations: found.operations, at: onRunClock(found.cut), faults: report.faults, clock: onRunClock)
        }
        let lines = workload.history.map { key, op in
            #"{"key":"\#(key)","client":\#(op.client),"input":"\#(op.input)","output":"\#(op.output)","call":\#(String(format: "%.6f", onRunClock(op.callTime))),"return":\#(op.returnTime.map { String(format: "%.6f", onRunClock($0)) } ?? "null")}"#
        }
        return Outcome(
            run: report, verdict: verdict, registerCounts: workload.counts, registerOperations: workload.history.count,
            setAcknowledged: set.acknowledged.count, setUnknown: set.unknown.count, lost: lost, unread: unread, namespace: namespace,
            violation: violation, historyLines: lines)
    }

    /// The key, when the violation first shows, the fault in force then, and the operations of
    /// the key in the 2 s before it.
    static func describeViolation(
        key: String, operations: [RegisterWorkload.Op], at cut: Double, faults: [ChaosRunner.FaultRecord], clock seconds: (Int) -> Double
    ) -> String {
        let during = faults.filter { $0.appliedAt <= cut && cut <= ($0.recoveredAt ?? .infinity) + 2 }.map { "fault \($0.index): \($0.description)" }
        var lines = [
            String(format: "key %@: the history is already not linearizable with the operations called by %.3f s", key, cut),
            during.isEmpty ? "no fault in force then (or within 2 s of a recovery)" : "in force then: " + during.joined(separator: "; "),
            "its operations called in the 2 s before (client, call → return, input → output):",
        ]
        for op in operations where seconds(op.callTime) >= cut - 2 {
            lines.append(
                String(
                    format: "  c%d  %.3f → %@  %@ → %@", op.client, seconds(op.callTime), op.returnTime.map { String(format: "%.3f", seconds($0)) } ?? "?",
                    "\(op.input)", "\(op.output)"))
        }
        return lines.joined(separator: "\n")
    }
}

/// One client adding unique keys (`/set/e<n>`) through random live nodes: each acknowledged
/// add must survive every fault (Jepsen's set workload).
public final class SetWorkload: Sendable {
    let cluster: any NodeRequester
    let namespace: String
    /// Adds `run` makes at most (each acknowledged one is held until the final reads).
    public let maxAdds: Int
    private let state = Mutex<(acknowledged: Set<Int>, unknown: Set<Int>)>(([], []))
    private let stopped = Atomic<Bool>(false)

    /// Ends `run` early.
    public func stop() { stopped.store(true, ordering: .relaxed) }

    public init(cluster: any NodeRequester, namespace: String, maxAdds: Int = 500_000) {
        self.cluster = cluster
        self.namespace = namespace
        self.maxAdds = maxAdds
    }

    public var acknowledged: Set<Int> { state.withLock { $0.acknowledged } }
    public var unknown: Set<Int> { state.withLock { $0.unknown } }

    public func run(seconds: Double, nodes: @escaping @Sendable () -> [UInt64]) async {
        let deadline = Date().addingTimeInterval(seconds)
        var n = 0
        var random = SystemRandomNumberGenerator()
        while Date() < deadline && !stopped.load(ordering: .relaxed) && n < maxAdds {
            guard let node = nodes().randomElement(using: &random) else {
                try? await Task.sleep(nanoseconds: 20_000_000)
                continue
            }
            n += 1
            let r = try? await cluster.request(node, .PUT, "/set/e\(n).json?ns=\(namespace)", body: "\(n)", timeout: 5)
            let element = n
            if let r, r.status == 200 {
                state.withLock { _ = $0.acknowledged.insert(element) }
            } else if r.map({ $0.status >= 400 && $0.status < 500 }) != true {
                // Timed out, connection lost, or 503: it may still apply.
                state.withLock { _ = $0.unknown.insert(element) }
            }
        }
    }

    /// The set as node `id` reads it (linearizable), or nil when it does not answer.
    public func read(through id: UInt64) async -> Set<Int>? {
        guard let r = try? await cluster.request(id, .GET, "/set.json?ns=\(namespace)", timeout: 5), r.status == 200 else { return nil }
        if r.text == "null" { return [] }
        guard let object = (try? JSONSerialization.jsonObject(with: Data(r.body))) as? [String: Any] else { return nil }
        return Set(object.keys.compactMap { $0.hasPrefix("e") ? Int($0.dropFirst()) : nil })
    }
}
