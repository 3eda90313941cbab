import BanyanOpLogFiles

/// Retrying a node's start while its disk is full (`BanyanNode.startWhenSpace`). The decisions
/// only: the attempt, the wait and the report are the caller's.
public enum StartRetry {
    /// Whether a start failed because the disk is full.
    public static func isNoSpace(_ error: any Error) -> Bool {
        (error as? OpLogError)?.code == .noSpace || (error as? FileSystemError)?.code == .noSpace
    }

    /// Runs `attempt` until it succeeds. After a failure `isNoSpace` accepts, it first asks
    /// `relieve` to make room (the ballast: true when it released some) and then tries again at
    /// once; otherwise it reports the failure (with the number of the wait, from 1) and waits,
    /// unless `shouldStop` (then nil). Other failures are thrown at once.
    public static func run<T>(
        attempt: () throws -> T, isNoSpace: (any Error) -> Bool = isNoSpace, relieve: (any Error) -> Bool = { _ in false },
        shouldStop: () -> Bool, wait: () -> Void, report: (any Error, Int) -> Void
    ) throws -> T? {
        var attempts = 0
        while true {
            do {
                return try attempt()
            } catch {
                guard isNoSpace(error) else { throw error }
                if relieve(error) { continue }
                attempts += 1
                report(error, attempts)
                if shouldStop() { return nil }
                wait()
                if shouldStop() { return nil }
            }
        }
    }
}
