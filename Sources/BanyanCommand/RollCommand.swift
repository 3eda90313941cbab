import ArgumentParser
import BanyanOps
import Foundation

/// `banyan cluster roll`: restarts every node of a live cluster one at a time, through a restart
/// command the operator gives (a CLI cannot start a process on another machine), followers
/// first and the leader last after handing its leadership to a restarted node; each node must be
/// back and caught up before the next is touched (docs/runbook.md, "Rolling restart or upgrade").
struct ClusterRoll: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "roll",
        abstract: "Restart every node in turn (followers first, the leader last), waiting for each to come back and catch up.",
        discussion: """
            The restart command runs through /bin/sh once per node, with {id}, {host}, {endpoint} and {pid} \
            replaced (also in the environment as BANYAN_ROLL_NODE_ID, BANYAN_ROLL_HOST, BANYAN_ROLL_ENDPOINT, \
            BANYAN_ROLL_PID), e.g. 'ssh {host} sudo systemctl restart banyan' or 'systemctl restart banyan@{id}'. \
            It must stop the node and start it again on the same data directory (with a new binary for an \
            upgrade); it may return before the node is up. Before each node: if it leads, leadership moves to \
            a node already restarted (POST /.banyan/transfer); then it is drained (POST /.banyan/drain: its realtime \
            clients are sent to other members and /.banyan/ready answers 503), waiting up to --drain-timeout for its \
            realtime connections to leave. A node stopped with SIGTERM answers the requests it has read before it \
            exits (http.stop_grace_s). After: the node must answer as a new process of \
            the same data directory, know the leader and apply the leader's commit index of that moment, within \
            --timeout; otherwise the roll stops and touches no other node. Each step reports the leader changes \
            it saw (terms passed, from the nodes' status); a step with more than --max-leader-changes stops the \
            roll (the node is back and caught up, the others are untouched). Operator requests send the token \
            like `cluster add`.
            """)

    @Option(name: .long, help: "Every member's client address, host:port (repeat, or comma-separated).")
    var endpoint: [String] = []
    @Option(name: .long, help: "The command that restarts one node; {id}, {host}, {endpoint}, {pid} are replaced.")
    var restartCommand: String
    @Option(name: .long, help: "Seconds each step may take: the leadership transfer, the restart command, coming back, catching up.")
    var timeout: Int = 120
    @Option(name: .long, help: "Seconds to wait after a node caught up before the next one.")
    var pause: Double = 0
    @Flag(name: .long, help: "Print the plan and stop.")
    var dryRun = false
    @Option(name: .long, help: "Leader changes one node's step may cause before the roll stops (the leader's own step has its handover).")
    var maxLeaderChanges: UInt64 = 1
    @Option(name: .long, help: "Seconds to wait for a drained node's realtime connections to leave before its restart (0: do not drain).")
    var drainTimeout: Int = 30

    func validate() throws {
        guard !endpoints.isEmpty else { throw ValidationError("give every member's client address with --endpoint") }
        guard (1...86_400).contains(timeout) else { throw ValidationError("--timeout must be 1 to 86400 seconds") }
        guard (0...3600).contains(pause) else { throw ValidationError("--pause must be 0 to 3600 seconds") }
        guard !restartCommand.trimmingCharacters(in: .whitespaces).isEmpty else { throw ValidationError("--restart-command is empty") }
        guard (1...100).contains(maxLeaderChanges) else { throw ValidationError("--max-leader-changes must be 1 to 100") }
        guard (0...3600).contains(drainTimeout) else { throw ValidationError("--drain-timeout must be 0 to 3600 seconds") }
    }

    var endpoints: [String] { endpointList(endpoint) }

    func run() throws {
        let started = Date()
        var nodes: [RollNode] = []
        for e in endpoints {
            guard let node = status(e) else { throw CommandError("\(e) does not answer GET /.banyan/status; not starting the roll") }
            nodes.append(node)
        }
        let order: [UInt64]
        do {
            order = try RollPlan.order(nodes)
        } catch {
            throw CommandError("not starting the roll: \(error)")
        }
        let byID = Dictionary(nodes.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        let firstTerm = nodes.map(\.term).max() ?? 0
        let leader = order.last ?? 0
        say("roll: \(order.count) nodes in the order \(order.map { "\($0)" }.joined(separator: ", ")) (node \(leader) leads, so it goes last); term \(firstTerm)")
        if dryRun {
            for id in order { if let n = byID[id] { say("  node \(id) at \(n.endpoint): \(RollPlan.command(restartCommand, node: n))") } }
            return
        }
        // Every node caught up before anything is touched: a roll must not start on a lagging
        // cluster (restarting a follower while another lags could cost the quorum).
        let commit = byID[leader]?.commitIndex ?? 0
        for id in order {
            guard let e = byID[id]?.endpoint else { continue }
            try wait("node \(id) to apply index \(commit) before the roll starts", rolled: [], order: order) {
                status(e).map { RollPlan.caughtUp($0, target: commit) } ?? false
            }
        }
        var rolled: [UInt64] = []
        // Leadership at the end of the previous step (the roll's start for the first): every
        // change from there on is the next step's, the pause before it included.
        let initial = RollPlan.Leadership(nodes) ?? RollPlan.Leadership(term: firstTerm, leader: leader)
        var previous = initial
        var changes: [(id: UInt64, count: UInt64)] = []
        for (i, id) in order.enumerated() {
            guard let e = byID[id]?.endpoint else { continue }
            let step = "[\(i + 1)/\(order.count)] node \(id)"
            try roll(id: id, endpoint: e, step: step, rolled: rolled, order: order, byID: byID)
            rolled.append(id)
            Self.drainedNode.current = nil
            let now = RollPlan.Leadership(endpoints.compactMap(status)) ?? previous
            let count = RollPlan.leaderChanges(from: previous, to: now)
            changes.append((id, count))
            say("\(step): leader changes in this step: \(count) (\(previous) → \(now))")
            if count > maxLeaderChanges {
                throw stop(
                    "\(step) saw \(count) leader changes, more than --max-leader-changes \(maxLeaderChanges) (\(previous) → \(now)); look at the nodes' logs before rolling on",
                    rolled: rolled, order: order)
            }
            previous = now
            if pause > 0, i + 1 < order.count { Thread.sleep(forTimeInterval: pause) }
        }
        let final = endpoints.compactMap(status)
        let end = RollPlan.Leadership(final) ?? previous
        let total = RollPlan.leaderChanges(from: initial, to: end)
        let leaderNow = final.first(where: \.isLeader).map { "node \($0.id)" } ?? "unknown"
        say(
            "rolled \(rolled.count) nodes in \(seconds(since: started)) s; term \(initial.term) → \(end.term) (\(total) leader change\(total == 1 ? "" : "s"); per node: \(changes.map { "\($0.id): \($0.count)" }.joined(separator: ", "))); leader now \(leaderNow)"
        )
    }

    /// One node: leadership away if it leads, the restart command, back, caught up.
    private func roll(id: UInt64, endpoint e: String, step: String, rolled: [UInt64], order: [UInt64], byID: [UInt64: RollNode]) throws {
        guard var before = status(e) else { throw stop("\(step) does not answer before its restart", rolled: rolled, order: order) }
        // Leadership can come back (the target lost an election it started): ask again, a few
        // times; the loop ends on a fresh status saying the node does not lead, and only then
        // is it restarted.
        var transfers = 0
        while before.isLeader {
            transfers += 1
            guard transfers <= 3 else {
                throw stop("\(step) still leads after \(transfers - 1) leadership transfers; not restarting a leader", rolled: rolled, order: order)
            }
            let everyone = endpoints.compactMap(status)
            guard let target = RollPlan.transferTarget(from: id, nodes: everyone, rolled: Set(rolled)) else {
                throw stop("\(step) leads and there is no other voter to hand leadership to", rolled: rolled, order: order)
            }
            say("\(step): leads (term \(before.term)); moving leadership to node \(target)")
            let t0 = Date()
            let (code, text) = try AdminClient(endpoint: e).call("POST", "/.banyan/transfer?to=\(target)")
            guard code == 200 || code == 409 else { throw stop("\(step): transfer refused: \(code) \(text)", rolled: rolled, order: order) }
            var newLeader: RollNode?
            try wait("leadership to leave node \(id)", rolled: rolled, order: order) {
                guard let me = status(e), !me.isLeader, me.leader != 0, me.leader != id else { return false }
                newLeader = byID[me.leader].flatMap { status($0.endpoint) }
                return newLeader?.isLeader == true
            }
            say("\(step): node \(newLeader?.id ?? 0) leads (term \(newLeader?.term ?? 0)) after \(seconds(since: t0)) s")
            guard let now = status(e) else { throw stop("\(step) does not answer after the leadership transfer", rolled: rolled, order: order) }
            before = now
            if before.isLeader { say("\(step): leads again (term \(before.term)); moving leadership once more") }
        }
        drain(endpoint: e, step: step)
        if drainTimeout > 0 { Self.drainedNode.current = (id, e) }
        let command = RollPlan.command(restartCommand, node: before)
        say("\(step): restarting (pid \(before.pid.map { "\($0)" } ?? "?")): \(command)")
        let t0 = Date()
        try runRestart(command, node: before, step: step, rolled: rolled, order: order)
        var back: RollNode?
        var sawDown = false
        try wait("\(step) to come back as a new process", rolled: rolled, order: order) {
            guard let now = status(e) else {
                if !sawDown {
                    sawDown = true
                    say("\(step): down")
                }
                return false
            }
            switch RollPlan.restart(before: before, now: now) {
            case .same: return false
            case .restarted:
                back = now
                return true
            case .replaced(let why): throw stop(why, rolled: rolled, order: order)
            }
        }
        say("\(step): back as pid \(back?.pid.map { "\($0)" } ?? "?") after \(seconds(since: t0)) s; catching up")
        // The leader's commit index once the node is back: what it must reach.
        var target: UInt64 = 0
        try wait("a leader to report its commit index", rolled: rolled, order: order) {
            for n in endpoints.compactMap(status) where n.isLeader {
                target = n.commitIndex
                return true
            }
            return false
        }
        var applied: UInt64 = 0
        try wait("\(step) to apply index \(target)", rolled: rolled, order: order) {
            guard let now = status(e) else { return false }
            applied = now.appliedIndex
            return RollPlan.caughtUp(now, target: target)
        }
        say("\(step): caught up (applied \(applied) ≥ leader's commit \(target)) \(seconds(since: t0)) s after the restart began")
    }

    /// Moves the node's realtime clients to the other members before its restart (docs/realtime.md,
    /// "Draining a node"): each gets the protocol's reset and reconnects to a node that stays up
    /// instead of losing its connection, and `/.banyan/ready` answers 503 so a load balancer
    /// stops sending it clients. Waits (at most `--drain-timeout`) for them to leave. A drain
    /// that cannot happen (no other member ready to take them, an old node) does not stop the
    /// roll: the restart then ends those connections, and their SDKs reconnect by themselves.
    private func drain(endpoint e: String, step: String) {
        guard drainTimeout > 0 else { return }
        let client = AdminClient(endpoint: e)
        guard let (code, text) = try? client.call("POST", "/.banyan/drain") else {
            say("\(step): cannot ask it to drain (no answer); restarting without draining")
            return
        }
        guard code == 200 else {
            say("\(step): not drained (\(code) \(text.prefix(200))); restarting without draining")
            return
        }
        let t0 = Date()
        let deadline = t0.addingTimeInterval(TimeInterval(drainTimeout))
        var left = -1
        while true {
            if let (status, state) = try? client.call("GET", "/.banyan/drain"), status == 200,
                let object = (try? JSONSerialization.jsonObject(with: Data(state.utf8))) as? [String: Any],
                let connections = (object["connections"] as? NSNumber)?.intValue
            {
                left = connections
                if left == 0 { break }
            }
            guard Date() < deadline else { break }
            Thread.sleep(forTimeInterval: 0.2)
        }
        if left == 0 {
            say("\(step): drained (no realtime connection left) after \(seconds(since: t0)) s")
        } else {
            say("\(step): \(left < 0 ? "drain state unknown" : "\(left) realtime connections still open") after \(drainTimeout) s; restarting anyway")
        }
    }

    /// Runs the restart command; it must exit 0 within the timeout.
    private func runRestart(_ command: String, node: RollNode, step: String, rolled: [UInt64], order: [UInt64]) throws {
        var environment = ProcessInfo.processInfo.environment
        environment["BANYAN_ROLL_NODE_ID"] = "\(node.id)"
        environment["BANYAN_ROLL_ENDPOINT"] = node.endpoint
        environment["BANYAN_ROLL_HOST"] = RollPlan.command("{host}", node: node)
        environment["BANYAN_ROLL_PID"] = node.pid.map { "\($0)" } ?? ""
        let pid: pid_t
        do {
            pid = try ChildProcess.spawn("/bin/sh", ["-c", command], environment: environment)
        } catch {
            throw stop("\(step): cannot run the restart command: \(error)", rolled: rolled, order: order)
        }
        switch ChildProcess.wait(pid, seconds: Double(timeout)) {
        case .exited(0): return
        case .exited(let code): throw stop("\(step): the restart command exited with status \(code)", rolled: rolled, order: order)
        case .signalled(let signal): throw stop("\(step): the restart command was killed by signal \(signal)", rolled: rolled, order: order)
        case .timedOut: throw stop("\(step): the restart command did not finish within \(timeout) s (killed)", rolled: rolled, order: order)
        }
    }

    /// Polls `done` every 200 ms until it holds, or stops the roll after `timeout` seconds.
    private func wait(_ what: String, rolled: [UInt64], order: [UInt64], _ done: () throws -> Bool) throws {
        let deadline = Date().addingTimeInterval(TimeInterval(timeout))
        while Date() < deadline {
            if try done() { return }
            Thread.sleep(forTimeInterval: 0.2)
        }
        throw stop("timed out after \(timeout) s waiting for \(what)", rolled: rolled, order: order)
    }

    private func stop(_ why: String, rolled: [UInt64], order: [UInt64]) -> CommandError {
        let untouched = order.filter { !rolled.contains($0) }
        // A node drained by this step and not restarted still drains (its old process, if it
        // runs): say how to end it.
        let left = Self.drainedNode.current.map { "\nnode \($0.id) was drained by this roll and may still be draining (503 on /.banyan/ready): `banyan drain --stop --endpoint \($0.endpoint)` ends it" } ?? ""
        return CommandError(
            "roll stopped: \(why)\nrestarted and caught up: \(rolled.isEmpty ? "none" : rolled.map { "\($0)" }.joined(separator: ", ")); "
                + "not restarted by this roll or not caught up: \(untouched.map { "\($0)" }.joined(separator: ", ")). No other node was touched." + left)
    }

    /// The node this roll drained and has not yet seen come back (nil: none).
    private static let drainedNode = DrainedNode()

    private func status(_ endpoint: String) -> RollNode? {
        guard let (code, text) = try? AdminClient(endpoint: endpoint).call("GET", "/.banyan/status"), code == 200,
            let json = (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any]
        else { return nil }
        return RollNode(endpoint: endpoint, json: json)
    }

    private func say(_ line: String) {
        let stamp = ISO8601DateFormatter().string(from: Date())
        // Unbuffered: progress shows as it happens, also through a pipe.
        writeLine("\(stamp) \(line)")
    }

    private func seconds(since start: Date) -> String { String(format: "%.1f", Date().timeIntervalSince(start)) }
}


/// Which node a roll drained and has not seen back yet (one roll runs on one thread).
final class DrainedNode: @unchecked Sendable {
    var current: (id: UInt64, endpoint: String)?
}
