import BanyanOpLogFiles
import BanyanStateMachine
import Foundation
import Logging
import Metrics
import NIOCore

/// Writes one backup to a client connection (docs/backup.md): the state machine's image, framed,
/// compressed and checksummed by `BackupEncoder`, from a thread of its own at a lower priority
/// (like the bulk workers), so neither the replica loop nor an event loop does this work.
///
/// Memory is bounded: the encoder holds one frame (4 MiB of image) and at most `maxInFlight`
/// bytes wait in the channel; past that the thread waits for the client to take them. A client
/// that stops reading holds only this thread, and only until the write fails or it reads again;
/// a client that goes away ends the backup (the write fails). The connection always closes at
/// the end; a backup cut short is refused by every reader (no end record).
enum BackupStream {
    static let maxInFlight = 8 << 20
    /// A client that takes nothing for this long ends its backup.
    static let stallSeconds = 120
    private static let written = Counter(label: "banyan_backup_bytes_total")
    private static let finished = Counter(label: "banyan_backups_total", dimensions: [("outcome", "complete")])
    private static let failed = Counter(label: "banyan_backups_total", dimensions: [("outcome", "failed")])

    struct Closed: Error, CustomStringConvertible {
        var description: String
    }

    static func start(
        channel: any Channel, chunked: Bool, machine: StateMachine, header: BackupHeader, logger: Logger, done: @escaping @Sendable () -> Void
    ) {
        let thread = Thread {
            BulkWorkers.lowerPriority()
            run(channel: channel, chunked: chunked, machine: machine, header: header, logger: logger)
            done()
        }
        thread.name = "banyan-backup"
        thread.start()
    }

    private static func run(channel: any Channel, chunked: Bool, machine: StateMachine, header: BackupHeader, logger: Logger) {
        let started = DispatchTime.now().uptimeNanoseconds
        logger.notice("backup started", metadata: ["index": "\(header.index)", "namespaces": "\(machine.namespaces.count)"])
        var pending: [(EventLoopFuture<Void>, Int)] = []
        var pendingBytes = 0
        var sent: UInt64 = 0
        var lastReport = started
        /// Waits for a write, at most `stallSeconds`: a client that stops reading does not hold
        /// the node's backup slot for ever.
        func settle(_ future: EventLoopFuture<Void>) throws {
            let done = DispatchSemaphore(value: 0)
            let failure = FailureBox()
            future.whenComplete { result in
                if case .failure(let e) = result { failure.set(e) }
                done.signal()
            }
            guard done.wait(timeout: .now() + .seconds(stallSeconds)) == .success else {
                throw Closed(description: "the client took nothing for \(stallSeconds) s")
            }
            if let e = failure.get() { throw Closed(description: "the client connection failed: \(e)") }
        }
        func send(_ bytes: [UInt8]) throws {
            guard !bytes.isEmpty else { return }
            var buffer = channel.allocator.buffer(capacity: bytes.count + 16)
            if chunked { buffer.writeString(String(bytes.count, radix: 16) + "\r\n") }
            buffer.writeBytes(bytes)
            if chunked { buffer.writeStaticString("\r\n") }
            pending.append((channel.writeAndFlush(buffer), buffer.readableBytes))
            pendingBytes += buffer.readableBytes
            sent += UInt64(bytes.count)
            written.increment(by: Int64(bytes.count))
            while pendingBytes > maxInFlight, !pending.isEmpty {
                let (future, n) = pending.removeFirst()
                try settle(future)
                pendingBytes -= n
            }
            let now = DispatchTime.now().uptimeNanoseconds
            if now - lastReport >= 10_000_000_000 {
                lastReport = now
                logger.info("backup progress", metadata: ["index": "\(header.index)", "bytes_sent": "\(sent)"])
            }
        }
        do {
            let encoder = BackupEncoder()
            try send(encoder.header(header))
            try machine.writeImage { chunk in try encoder.add(chunk) { frame in try send(frame) } }
            try send(try encoder.finish())
            if chunked {
                var end = channel.allocator.buffer(capacity: 5)
                end.writeStaticString("0\r\n\r\n")
                pending.append((channel.writeAndFlush(end), 5))
            }
            for (future, _) in pending { try settle(future) }
            channel.close(promise: nil)
            finished.increment()
            let seconds = Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9
            logger.notice(
                "backup complete",
                metadata: [
                    "index": "\(header.index)", "bytes": "\(sent)", "seconds": "\(String(format: "%.2f", seconds))",
                    "mb_per_s": "\(String(format: "%.1f", Double(sent) / 1e6 / max(seconds, 1e-6)))",
                ])
        } catch {
            channel.close(promise: nil)
            failed.increment()
            logger.warning("backup ended early", metadata: ["index": "\(header.index)", "bytes_sent": "\(sent)", "error": "\(error)"])
        }
    }
}

/// The error a write ended with, handed from an event loop to the backup's thread.
private final class FailureBox: @unchecked Sendable {
    private let lock = NSLock()
    private var error: (any Error)?
    func set(_ e: any Error) { lock.withLock { error = e } }
    func get() -> (any Error)? { lock.withLock { error } }
}
