import Foundation
import NIOCore
import NIOPosix

/// Threads for work whose cost grows with a request's size: reading large request bodies and
/// large log entries ahead of their application, rendering large answers (docs/server.md,
/// "Large writes"). They run at a lower scheduling priority (nice +10) than the event loops, so
/// on a busy machine the loop that ticks Raft, sends heartbeats and answers votes gets the CPU
/// first, and the bulk work takes what is left.
enum BulkWorkers {
    /// Shared by every node in the process (tests run several): one thread per core, at most 4.
    static let pool: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: max(1, min(4, System.coreCount)))
        pool.start()
        return pool
    }()

    /// Nice value of the workers (Linux: per thread).
    static let niceness: Int32 = 10

    /// Runs `work` on a worker; the future completes on `loop`.
    static func run<T: Sendable>(on loop: any EventLoop, _ work: @escaping @Sendable () -> T) -> EventLoopFuture<T> {
        pool.runIfActive(eventLoop: loop) {
            lowerPriority()
            return work()
        }
    }

    /// Threads for the read-ahead of large entries (`NodeAction.prepare`), at nice +5: every
    /// write committed after such an entry waits for it to apply, so it goes before new bodies
    /// and large answers (nice +10), yet after the loops that tick Raft and carry heartbeats
    /// (docs/server.md, "Large writes").
    /// One per two cores, at most two: with large writes admitted one at a time (docs/replica.md)
    /// a node rarely has more than one entry to read ahead, except while it catches up.
    static let readAhead: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: max(1, min(2, System.coreCount / 2)))
        pool.start()
        return pool
    }()

    /// Runs a read-ahead on `readAhead`; the future completes on `loop`.
    static func runReadAhead<T: Sendable>(on loop: any EventLoop, _ work: @escaping @Sendable () -> T) -> EventLoopFuture<T> {
        readAhead.runIfActive(eventLoop: loop) {
            lowerPriority(to: readAheadNiceness)
            return work()
        }
    }

    /// One thread that frees memory (replaced subtrees, old history bases, a live view's previous
    /// tree): a free of a million values takes about 150 ms, which must neither hold the loop
    /// that ticks Raft nor queue ahead of a read-ahead in `pool`.
    static let freeing: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
        return pool
    }()

    /// Frees `value` on the freeing thread, at nice +10. Pass the caller's last reference
    /// (`consume`): the value is moved into a box whose contents only that thread then drops.
    /// (Another holder that outlives the drop frees it wherever it lets go.)
    static func free<T>(_ value: consuming T) {
        let box = FreeBox(value)
        freeing.submit { _ in
            lowerPriority()
            box.value = nil
        }
    }

    final class FreeBox<T>: @unchecked Sendable {
        var value: T?
        init(_ value: consuming T) { self.value = value }
    }

    /// The staging thread (docs/staged-payloads.md): every use of a node's staged store (store,
    /// load, remove) happens on it, one at a time, for every node in the process. Nice +5, as
    /// the read-ahead threads: a write committed behind a staged one waits for its store.
    static let staging: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
        return pool
    }()

    /// Runs staged-store work on `staging`; the future completes on `loop`.
    static func runStaging<T: Sendable>(on loop: any EventLoop, _ work: @escaping @Sendable () -> T) -> EventLoopFuture<T> {
        staging.runIfActive(eventLoop: loop) {
            lowerPriority(to: readAheadNiceness)
            return work()
        }
    }

    /// Nice value of the read-ahead threads: above the workers', below the event loops'.
    static let readAheadNiceness: Int32 = 5

    /// Lowers the calling thread's priority to `nice` (a worker's, once: it stays lowered).
    static func lowerPriority(to nice: Int32 = niceness) {
        #if os(Linux)
        // On Linux `setpriority(PRIO_PROCESS, 0, …)` changes the calling thread only.
        let current = getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
        if current < nice { _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, nice) }
        #endif
    }
}
