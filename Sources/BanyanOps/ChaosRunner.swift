import Foundation
import NIOHTTP1
import Synchronization

/// `banyan chaos run`: applies a seeded schedule of faults to a local cluster, one at a time, for
/// a bounded time (docs/chaos.md). For each fault it prints when it was applied, when a write
/// committed again under it (if one did), when it was healed, and when the cluster recovered (a
/// probe write committed through some node after the heal, and a leader known). At the end,
/// or on any error, everything is healed: paused nodes resumed, faults cleared, nodes that are
/// down started again.
///
/// Availability is measured by probes: one client per node writes a unique key under `/probes`
/// (namespace `chaos`) through that node whenever it runs, with a 2 s timeout and 100 ms
/// between writes. The longest unavailability is the longest time without an acknowledged
/// probe write.
public final class ChaosRunner: @unchecked Sendable {
    public struct FaultRecord: Sendable {
        public var index: Int
        public var kind: ChaosSchedule.Kind
        public var description: String
        /// Seconds since the run started.
        public var appliedAt: Double
        public var healedAt: Double?
        /// When a write committed after the heal (nil: not within the recovery bound).
        public var recoveredAt: Double?
        /// The longest time without an acknowledged probe write from the fault to the recovery.
        public var longestUnavailability: Double?
    }

    public struct Report: Sendable {
        public var seed: UInt64
        public var faults: [FaultRecord]
        /// The longest time without an acknowledged probe write over the whole run.
        public var longestUnavailability: Double
        public var probeWrites: Int
        public var seconds: Double
        /// Whether a write committed after the final heal (within the recovery bound).
        public var recoveredAtEnd: Bool
        /// Faults after whose heal no write committed within the bound.
        public var unrecovered: [String] { faults.filter { $0.recoveredAt == nil }.map(\.description) }

        /// Per kind: faults applied and the longest unavailability.
        public var byKind: [(kind: ChaosSchedule.Kind, count: Int, longest: Double)] {
            ChaosSchedule.Kind.allCases.compactMap { kind in
                let mine = faults.filter { $0.kind == kind }
                guard !mine.isEmpty else { return nil }
                return (kind, mine.count, mine.compactMap(\.longestUnavailability).max() ?? 0)
            }
        }
    }

    public let controller: ChaosController
    public let seconds: Double
    public let recoveryBound: Double
    private var schedule: ChaosSchedule
    /// When the run's clock starts (`DispatchTime` uptime nanoseconds).
    public let started = DispatchTime.now().uptimeNanoseconds
    /// Nodes a client may send requests to now (not killed, not paused).
    public let live: LiveNodes
    private let probes = Mutex(ProbeLog())
    private let probeNamespace: String
    private let stopping = Atomic<Bool>(false)

    public init(controller: ChaosController, schedule: ChaosSchedule, seconds: Double, recoveryBound: Double = 30, probeNamespace: String = "chaos") throws {
        self.controller = controller
        self.schedule = schedule
        self.seconds = seconds
        self.recoveryBound = recoveryBound
        self.probeNamespace = probeNamespace
        let state = try controller.state()
        live = LiveNodes(state.nodes.filter { ProcessProbe.state(of: $0) == .running }.map(\.id))
    }

    /// Seconds since the run started.
    public func now() -> Double { Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9 }

    private func say(_ line: String) { controller.log(String(format: "[%6.1f s] ", now()) + line) }

    // MARK: - The probe

    /// One probe client per node, so that a node that does not answer (isolated, slow) holds up
    /// only its own probes.
    private func probeLoop(nodes: [UInt64]) async {
        await withTaskGroup(of: Void.self) { group in
            for (index, node) in nodes.enumerated() {
                group.addTask {
                    var sequence = 0
                    while !self.stopping.load(ordering: .relaxed) {
                        if self.live.nodes.contains(node) {
                            sequence += 1
                            let call = self.now()
                            let key = "n\(node)-\(index)-\(sequence)"
                            if let r = try? await self.controller.request(node, .PUT, "/probes/\(key).json?ns=\(self.probeNamespace)", body: "\(sequence)", timeout: 2),
                                r.status == 200
                            {
                                // Stamped under the lock, so acknowledgements are recorded in time order.
                                self.probes.withLock { $0.record(call: call, done: self.now()) }
                            }
                        }
                        try? await Task.sleep(nanoseconds: 100_000_000)
                    }
                }
            }
        }
    }

    /// Waits until a probe write issued at or after `since` was acknowledged (at most `bound`
    /// seconds); returns when it was.
    private func committed(since: Double, bound: Double) async -> Double? {
        let deadline = since + bound
        while now() < deadline {
            if let hit = probes.withLock({ $0.firstAcknowledged(calledAtOrAfter: since) }) { return hit }
            try? await Task.sleep(nanoseconds: 50_000_000)
        }
        return nil
    }

    /// The longest time without an acknowledged probe write between `from` and `to` (within
    /// the probes still held: from the current fault on).
    public func longestGap(from: Double, to: Double) -> Double {
        probes.withLock { $0.longestGap(from: from, to: to) }
    }

    // MARK: - The run

    private let interrupted = Atomic<Bool>(false)

    /// Ends the schedule early (Ctrl-C): the fault in force is healed at once, then everything.
    public func interrupt() {
        if !interrupted.exchange(true, ordering: .relaxed) { say("interrupted: healing and stopping") }
    }

    /// Sleeps up to `seconds`, less if interrupted.
    private func pause(seconds: Double) async throws {
        let until = now() + seconds
        while now() < until && !interrupted.load(ordering: .relaxed) {
            try await Task.sleep(nanoseconds: UInt64(min(0.1, max(0, until - now())) * 1e9))
        }
    }

    /// Runs the schedule until `seconds` pass (a fault starts only if its hold ends in time),
    /// then heals everything. Throws only when the cluster cannot be driven at all (its state
    /// file is gone, a node cannot be started); faults after which the cluster did not recover
    /// are in the report.
    public func run() async throws -> Report {
        let nodes = try controller.state().ids
        let probe = Task { await probeLoop(nodes: nodes) }
        var records: [FaultRecord] = []
        var failure: (any Error)?
        say("chaos run: seed \(schedule.seed), \(Int(seconds)) s, faults \(schedule.kinds.map(\.rawValue).joined(separator: ","))")
        if let first = await committed(since: now(), bound: recoveryBound) {
            say(String(format: "cluster available: a probe write committed at %.1f s", first))
        } else {
            say("no probe write committed within \(Int(recoveryBound)) s before the first fault")
        }
        do {
            while true {
                let step = schedule.next()
                guard !interrupted.load(ordering: .relaxed), now() + Double(step.holdMilliseconds) / 1000 < seconds else { break }
                let record = try await apply(step, index: records.count + 1)
                records.append(record)
                if record.recoveredAt == nil { break }
                try await pause(seconds: Double(step.gapMilliseconds) / 1000)
            }
        } catch {
            failure = error
            say("error: \(error)")
        }
        // Heal everything whatever happened.
        do {
            let done = try await controller.healAll()
            for node in (try? controller.state())?.ids ?? [] { live.add(node) }
            if !done.isEmpty { say("end of run: " + done.joined(separator: ", ")) }
        } catch {
            say("error while healing at the end: \(error)")
            failure = failure ?? error
        }
        let end = now()
        let recoveredAtEnd: Bool
        if let recovered = await committed(since: end, bound: recoveryBound) {
            let leader = await controller.leader()
            say(String(format: "healed; a write committed %.1f s later%@", recovered - end, leader.map { ", leader node \($0)" } ?? ""))
            recoveredAtEnd = true
        } else {
            say("healed, but no write committed within \(Int(recoveryBound)) s")
            recoveredAtEnd = false
        }
        stopping.store(true, ordering: .relaxed)
        await probe.value
        if let failure { throw failure }
        let total = now()
        let (longest, count) = probes.withLock { ($0.longestGapSinceStart(to: total), $0.count) }
        return Report(
            seed: schedule.seed, faults: records, longestUnavailability: longest, probeWrites: count, seconds: total, recoveredAtEnd: recoveredAtEnd)
    }

    /// Applies one fault, holds it, heals it and waits for the recovery.
    private func apply(_ step: ChaosSchedule.Step, index: Int) async throws -> FaultRecord {
        // Probes from before this fault matter no more (the whole run's longest gap is kept
        // as a running figure): what is held spans one fault, not the run.
        let before = now()
        probes.withLock { $0.forget(acknowledgedBefore: before) }
        let state = try controller.state()
        let ids = state.ids
        let leader = await controller.leader(among: live.nodes)
        let target: UInt64
        switch step.role {
        case .leader:
            target = leader ?? ids[0]
        case .follower(let pick):
            let followers = ids.filter { $0 != leader }
            target = followers.isEmpty ? ids[0] : followers[pick % followers.count]
        }
        let who = "node \(target) (\(leader == target ? "the leader" : leader == nil ? "no leader known" : "a follower"))"
        let description: String
        let heal: () async throws -> Void
        switch step.kind {
        case .kill:
            description = "kill -9 \(who)"
            live.remove(target)
            try controller.kill(target)
            heal = {
                try await self.controller.restart(target)
                self.live.add(target)
            }
        case .pause:
            description = "SIGSTOP \(who)"
            live.remove(target)
            try controller.pause(target)
            heal = {
                try self.controller.resume(target)
                self.live.add(target)
            }
        case .partition:
            switch step.shape {
            case .isolate:
                description = "partition: \(who) isolated from the others"
                try await controller.partition([[target], ids.filter { $0 != target }])
            case .bridge(let pick):
                let others = ids.filter { $0 != target }
                let other = others.isEmpty ? target : others[pick % others.count]
                description = "partition: link \(who) – node \(other) cut (both still reach the rest)"
                try await controller.cut([(target, other)])
            }
            heal = { try await self.controller.heal() }
        case .slow:
            let peer = step.slowPath != .disk
            let disk = step.slowPath != .peer
            let what = [peer ? "peer messages" : nil, disk ? "fsyncs" : nil].compactMap { $0 }.joined(separator: " and ")
            description = "slow \(who): \(what) +\(step.delayMilliseconds) ms"
            try await controller.slow(target, milliseconds: step.delayMilliseconds, peer: peer, disk: disk)
            heal = { try await self.controller.slow(target, milliseconds: 0, peer: true, disk: true) }
        }
        let applied = now()
        say("fault \(index): \(description), for \(String(format: "%.1f", Double(step.holdMilliseconds) / 1000)) s")
        var record = FaultRecord(index: index, kind: step.kind, description: description, appliedAt: applied)
        let holdEnd = applied + Double(step.holdMilliseconds) / 1000
        if let during = await committed(since: applied, bound: max(0, holdEnd - now())) {
            let leaderNow = await controller.leader(among: live.nodes)
            say(String(format: "  writes commit under the fault: %.1f s after it%@", during - applied, leaderNow.map { " (leader node \($0))" } ?? ""))
        } else {
            say("  no write committed while the fault lasted")
        }
        let remaining = holdEnd - now()
        try await pause(seconds: remaining)
        try await heal()
        let healed = now()
        record.healedAt = healed
        say("  healed fault \(index)")
        if let recovered = await committed(since: healed, bound: recoveryBound) {
            let leaderNow = await controller.leader(among: live.nodes)
            record.recoveredAt = recovered
            record.longestUnavailability = longestGap(from: applied, to: recovered)
            say(
                String(
                    format: "  recovered: a write committed %.1f s after the heal%@; longest unavailability %.1f s", recovered - healed,
                    leaderNow.map { ", leader node \($0)" } ?? "", record.longestUnavailability ?? 0))
        } else {
            say("  NOT recovered: no write committed within \(Int(recoveryBound)) s of the heal")
            record.longestUnavailability = longestGap(from: applied, to: now())
        }
        return record
    }
}

/// Acknowledged probe writes: the recent ones (call and acknowledgement times, in the order
/// acknowledged) for the questions a fault asks, and running figures for the whole run, so a
/// day-long run holds one fault's worth of probes, not a day's.
public struct ProbeLog: Sendable {
    public private(set) var recent: [(call: Double, done: Double)] = []
    /// Probe writes acknowledged over the run.
    public private(set) var count = 0
    /// The latest acknowledgement, and the longest time between two (from the run's start).
    private var lastDone = 0.0
    private var longest = 0.0

    public init() {}

    /// A probe called at `call` and acknowledged at `done` (not before the previous one's).
    public mutating func record(call: Double, done: Double) {
        count += 1
        if done > lastDone {
            longest = max(longest, done - lastDone)
            lastDone = done
        }
        recent.append((call, done))
    }

    /// Drops the probes acknowledged before `time` (the running figures keep them).
    public mutating func forget(acknowledgedBefore time: Double) {
        let keep = recent.firstIndex { $0.done >= time } ?? recent.endIndex
        if keep > 0 { recent.removeSubrange(..<keep) }
    }

    /// When the first probe called at or after `since` was acknowledged.
    public func firstAcknowledged(calledAtOrAfter since: Double) -> Double? {
        recent.lazy.filter { $0.call >= since }.map(\.done).min()
    }

    /// The longest time without an acknowledgement between `from` and `to`, among those held.
    public func longestGap(from: Double, to: Double) -> Double {
        var last = from
        var longest = 0.0
        for p in recent where p.done > from && p.done < to {
            longest = max(longest, p.done - last)
            last = p.done
        }
        return max(longest, to - last)
    }

    /// The longest time without an acknowledgement from the run's start (0) to `to`.
    public func longestGapSinceStart(to: Double) -> Double {
        max(longest, to - lastDone)
    }
}

/// The nodes clients may use now (not killed, not paused).
public final class LiveNodes: Sendable {
    private let members: Mutex<Set<UInt64>>
    public init(_ nodes: [UInt64]) { members = Mutex(Set(nodes)) }
    public var nodes: [UInt64] { members.withLock { $0.sorted() } }
    public func add(_ id: UInt64) { members.withLock { _ = $0.insert(id) } }
    public func remove(_ id: UInt64) { members.withLock { _ = $0.remove(id) } }
}
