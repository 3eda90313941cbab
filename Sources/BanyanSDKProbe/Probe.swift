import BanyanClient
import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `banyan-sdk-probe`: an app process built on the Swift SDK, for the multi-process SDK tests
/// (Tests/BanyanClientTests/ClusterSDKTests.swift) that need a client to die or restart as a
/// real app does.
///
///     banyan-sdk-probe queue    --url URL [--node host:port]… --cache DIR --path P --count N
///         Persistence in DIR, offline from the first call: N increments of P/counter, N pushes
///         to P/log and N multi-path updates (P/stats/n incremented, P/stats/last set). Prints
///         `queued <writes>` once every write is on disk, then waits to be killed (exit 2 after
///         120 s if it is not).
///     banyan-sdk-probe deliver  --url URL [--node host:port]… --cache DIR [--die-at-pending K]
///         Persistence in DIR, online: prints `restored <writes>`, then `delivered` once the
///         server answered every queued write (exit 0). With `--die-at-pending K` it kills itself
///         (SIGKILL) as soon as at most K writes are unanswered, printing `dying <pending>`
///         first. Exit 3 if the writes are not answered within 120 s.
///     banyan-sdk-probe presence --url URL [--node host:port]… --path P
///         Registers onDisconnect writes at P (`state` set to "gone", `left` to the server's
///         time), sets P/state to "here", prints `registered <node>`, then waits to be killed
///         (exit 2 after 120 s).
///
/// Every client uses the emulator's `owner` credential. Output lines are flushed at once (the
/// tests read them from a file while the process runs).
@main
struct Probe {
    struct Options {
        var mode = ""
        var url = ""
        var nodes: [String] = []
        var cache = ""
        var path = "probe"
        var count = 0
        var dieAtPending: Int?
    }

    static func main() async {
        let options: Options
        do {
            options = try parse(Array(CommandLine.arguments.dropFirst()))
        } catch {
            say("error: \(error)")
            exit(64)
        }
        do {
            switch options.mode {
            case "queue": try await queue(options)
            case "deliver": try await deliver(options)
            case "presence": try await presence(options)
            default:
                say("error: the mode is queue, deliver or presence")
                exit(64)
            }
        } catch {
            say("error: \(error)")
            exit(1)
        }
    }

    struct UsageError: Error, CustomStringConvertible {
        var description: String
    }

    static func parse(_ arguments: [String]) throws -> Options {
        var o = Options()
        var rest = arguments[...]
        guard let mode = rest.popFirst() else { throw UsageError(description: "usage: banyan-sdk-probe queue|deliver|presence --url URL …") }
        o.mode = mode
        while let flag = rest.popFirst() {
            guard let value = rest.popFirst() else { throw UsageError(description: "\(flag) needs a value") }
            switch flag {
            case "--url": o.url = value
            case "--node": o.nodes.append(value)
            case "--cache": o.cache = value
            case "--path": o.path = value
            case "--count":
                guard let n = Int(value), n > 0 else { throw UsageError(description: "--count must be a positive number") }
                o.count = n
            case "--die-at-pending":
                guard let n = Int(value), n >= 0 else { throw UsageError(description: "--die-at-pending must be at least 0") }
                o.dieAtPending = n
            default: throw UsageError(description: "unknown option \(flag)")
            }
        }
        guard !o.url.isEmpty else { throw UsageError(description: "--url is required") }
        if o.mode != "presence" && o.cache.isEmpty { throw UsageError(description: "--cache is required") }
        if o.mode == "queue" && o.count == 0 { throw UsageError(description: "--count is required") }
        return o
    }

    /// One line on standard output, flushed.
    static func say(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }

    static func database(_ o: Options, persistent: Bool) throws -> Database {
        let db = try Database(url: o.url, nodes: o.nodes, authToken: "owner")
        if persistent {
            db.isPersistenceEnabled = true
            db.persistenceDirectory = URL(fileURLWithPath: o.cache)
        }
        return db
    }

    /// Waits to be killed by the test; exits with 2 if that never happens.
    static func awaitKill() async -> Never {
        try? await Task.sleep(nanoseconds: 120_000_000_000)
        say("not killed within 120 s")
        exit(2)
    }

    static func queue(_ o: Options) async throws {
        let db = try database(o, persistent: true)
        // Offline before the first connection: nothing reaches a node from this process.
        db.goOffline()
        let root = db.reference(withPath: o.path)
        for i in 0..<o.count {
            root.child("counter").setValue(ServerValue.increment(1), withCompletionBlock: nil)
            root.child("log").childByAutoId().setValue(["i": i], withCompletionBlock: nil)
            root.child("stats").updateChildValues(["n": ServerValue.increment(1), "last": i], withCompletionBlock: nil)
        }
        if let error = db.persistenceError {
            say("error: no persistence: \(error)")
            exit(1)
        }
        // The count is read on the database's loop after every write was recorded there, and
        // the loop syncs the cache file before it takes the next task: the writes are on disk.
        let queued = db.pendingWriteCount
        let online = db.connectedNode
        say("queued \(queued) online \(online ?? "no")")
        await awaitKill()
    }

    static func deliver(_ o: Options) async throws {
        let db = try database(o, persistent: true)
        _ = db.reference()
        if let error = db.persistenceError {
            say("error: no persistence: \(error)")
            exit(1)
        }
        say("restored \(db.pendingWriteCount)")
        let deadline = Date().addingTimeInterval(120)
        while Date() < deadline {
            let pending = db.pendingWriteCount
            if let k = o.dieAtPending, pending <= k {
                say("dying \(pending)")
                kill(getpid(), SIGKILL)
            }
            if pending == 0 {
                say("delivered via \(db.connectedNode ?? "?")")
                db.shutdown()
                exit(0)
            }
            try? await Task.sleep(nanoseconds: 5_000_000)
        }
        say("\(db.pendingWriteCount) writes still unanswered after 120 s")
        exit(3)
    }

    static func presence(_ o: Options) async throws {
        let db = try database(o, persistent: false)
        let me = db.reference(withPath: o.path)
        try await me.child("state").onDisconnectSetValue("gone")
        try await me.onDisconnectUpdateChildValues(["left": ServerValue.timestamp()])
        try await me.child("state").setValue("here")
        say("registered \(db.connectedNode ?? "?")")
        await awaitKill()
    }
}
