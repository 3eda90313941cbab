import Dispatch
public import BanyanOpLog
import Synchronization

/// Group commit for many concurrent proposers: each `submit` enqueues a record; one writer
/// (a serial dispatch queue owned by this object) takes everything pending, appends it, makes it
/// durable with one `fdatasync`, then completes every proposer in the batch with the durable
/// index. While a batch is being synced, new proposals accumulate for the next one, so the
/// batch size adapts to the load and the disk's sync latency.
///
/// After a storage error the log stops: the failing batch and every later proposal complete with
/// that error (storage errors are fatal to a node's participation; the process restarts and
/// recovers).
public final class GroupCommitLog: Sendable {
    public typealias Completion = @Sendable (Result<UInt64, OpLogError>) -> Void

    private struct Pending {
        var records: [(term: UInt64, kind: UInt8, payload: [UInt8], completion: Completion)] = []
        var flushScheduled = false
        var failure: OpLogError?
        var nextIndex: UInt64 = 1
    }

    private let state: Mutex<Pending>
    private let queue = DispatchQueue(label: "banyan.oplog.group-commit")
    /// The log, used only by the writer (the lock is uncontended; it makes the confinement
    /// explicit to the compiler).
    private let writer: Mutex<SegmentedLog>
    /// Batches written so far and records in them (for metrics and benchmarks).
    private let counters = Mutex<(batches: Int, records: Int)>((0, 0))

    /// Takes ownership of `log`: nothing else may use it afterwards.
    public init(log: sending SegmentedLog) {
        let next = log.lastIndex + 1
        self.writer = Mutex(log)
        self.state = Mutex(Pending(nextIndex: next))
    }

    public var batches: (batches: Int, records: Int) { counters.withLock { $0 } }

    /// Appends a record at the next index; `completion` runs on the writer once it is durable
    /// (with its index) or failed.
    public func submit(term: UInt64, kind: UInt8, payload: [UInt8], completion: @escaping Completion) {
        // A bad proposal fails alone; it never reaches the writer (where an error stops the log).
        if payload.count > LogFormat.maxRecordBytes - LogFormat.bodyFixedBytes {
            completion(.failure(OpLogError(.invalidArgument, "a \(payload.count)-byte payload exceeds the record limit")))
            return
        }
        let (schedule, failure): (Bool, OpLogError?) = state.withLock { pending in
            if let failure = pending.failure { return (false, failure) }
            pending.records.append((term, kind, payload, completion))
            if pending.flushScheduled { return (false, nil) }
            pending.flushScheduled = true
            return (true, nil)
        }
        // Completions never run under the lock (they may submit again).
        if let failure { completion(.failure(failure)) }
        if schedule { queue.async { self.flush() } }
    }

    /// Async form of `submit`: returns the record's index once it is durable.
    public func append(term: UInt64, kind: UInt8, payload: [UInt8]) async throws(OpLogError) -> UInt64 {
        let result: Result<UInt64, OpLogError> = await withCheckedContinuation { continuation in
            submit(term: term, kind: kind, payload: payload) { continuation.resume(returning: $0) }
        }
        return try result.get()
    }

    /// Runs on `queue`: writes and syncs everything pending, as many rounds as it takes.
    private func flush() {
        while true {
            let (batch, first): ([(term: UInt64, kind: UInt8, payload: [UInt8], completion: Completion)], UInt64) = state.withLock { pending in
                let batch = pending.records
                pending.records.removeAll(keepingCapacity: true)
                let first = pending.nextIndex
                pending.nextIndex += UInt64(batch.count)
                if batch.isEmpty { pending.flushScheduled = false }
                return (batch, first)
            }
            if batch.isEmpty { return }
            let entries = batch.enumerated().map { i, r in LogRecord(index: first + UInt64(i), term: r.term, kind: r.kind, payload: r.payload) }
            let outcome: Result<Void, OpLogError> = writer.withLock { log in
                do throws(OpLogError) {
                    try log.append(entries)
                    try log.sync()
                    return .success(())
                } catch {
                    return .failure(error)
                }
            }
            if case .failure(let error) = outcome {
                let failed: [Completion] = state.withLock { pending in
                    pending.failure = error
                    pending.flushScheduled = false
                    let rest = pending.records.map(\.completion)
                    pending.records.removeAll()
                    return rest
                }
                for record in batch { record.completion(.failure(error)) }
                for completion in failed { completion(.failure(error)) }
                return
            }
            counters.withLock {
                $0.batches += 1
                $0.records += batch.count
            }
            for (i, record) in batch.enumerated() { record.completion(.success(first + UInt64(i))) }
        }
    }
}
