internal import CHeap
import Foundation
import Glibc
public import Logging
import Metrics

/// How the process's allocator hands memory back (docs/operations.md, "Memory").
///
/// glibc serves an allocation of at least its mmap threshold (128 KiB at start) with its own
/// mapping, returned to the system when freed; but each such free raises the threshold to the
/// freed size (up to 32 MiB), after which buffers that large come from the heap and stay in the
/// process once freed. A node that took 15 MiB writes kept their bodies' memory for good: in the
/// hostile scenario the resident size 6 s after the attack, its data deleted, was about 1.3 GiB
/// on every node. A fixed threshold turns the adjustment off, so large buffers go back when
/// freed (the same run: about 0.8 GiB, peak 1.0 against 1.4 GiB), at the cost of a mapping and
/// its page faults per large buffer.
public enum ProcessMemory {
    /// Fixes the threshold at `bytes`, unless the operator set `MALLOC_MMAP_THRESHOLD_` (glibc's
    /// own variable, which also fixes it). Returns whether it was set here.
    /// Call it at the start of the process, before other threads allocate.
    @discardableResult
    public static func returnLargeBuffers(atLeast bytes: Int32 = 1 << 20) -> Bool {
        guard getenv("MALLOC_MMAP_THRESHOLD_") == nil, let mallopt = mallopt() else { return false }
        let mmapThreshold: Int32 = -3  // M_MMAP_THRESHOLD
        return mallopt(mmapThreshold, bytes) == 1
    }

    /// When a trim is worth its cost: the heap holds at least `minimumFree` bytes freed, and
    /// either that grew by `growth` since the last trim (new frees: a deleted subtree, bodies
    /// parsed and dropped) or the resident size grew by `2 × growth` since (pages handed back
    /// were reused and freed again). A node whose heap holds little free memory is never
    /// trimmed, whatever its size; one that freed a lot once is trimmed once.
    public struct TrimPolicy: Sendable, Equatable {
        public var minimumResident = 128 << 20
        public var minimumFree = 64 << 20
        public var growth = 32 << 20
        /// The heap's free bytes and the resident size just after the last trim.
        public private(set) var freeAfterLast = 0
        public private(set) var residentAfterLast = 0
        public init() {}

        public func shouldTrim(free: Int, resident: Int) -> Bool {
            guard resident >= minimumResident, free >= minimumFree else { return false }
            return free >= freeAfterLast + growth || resident >= residentAfterLast + 2 * growth
        }

        public mutating func trimmed(free: Int, resident: Int) {
            freeAfterLast = free
            residentAfterLast = resident
        }
    }

    /// Starts a thread that, every `interval` seconds, hands the heap's free pages back to the
    /// system (`malloc_trim`) when `TrimPolicy` says it is worth it. Freed small allocations (a
    /// deleted subtree's nodes, parsed bodies, a snapshot's buffers) stay in glibc's heap
    /// otherwise: after the hostile scenario, with its data deleted, each node kept 65–114 MiB
    /// more than its live data explained. The thread lives as long as the process (`banyan
    /// serve` only; start it after the metrics system is set up). Does nothing where the C
    /// library gives no heap statistics. Returns whether the thread started.
    @discardableResult
    public static func startTrimming(every interval: Double = 5, policy initial: TrimPolicy = TrimPolicy(), logger: Logger) -> Bool {
        guard canTrim else { return false }
        let trims = Counter(label: "banyan_memory_trims_total")
        let returned = Counter(label: "banyan_memory_trimmed_bytes_total")
        let thread = Thread {
            var policy = initial
            while true {
                Thread.sleep(forTimeInterval: interval)
                guard let before = residentBytes() else { continue }
                let free = Int(banyan_heap_free_bytes())
                guard policy.shouldTrim(free: free, resident: before) else { continue }
                let (after, took) = trimNow(before: before)
                policy.trimmed(free: Int(banyan_heap_free_bytes()), resident: after)
                trims.increment()
                if after < before { returned.increment(by: Int64(before - after)) }
                // A long trim holds the heap's lock while other threads allocate: worth a notice.
                let level: Logger.Level = took >= 20_000_000 ? .notice : (before - after >= 16 << 20 ? .info : .debug)
                logger.log(
                    level: level, "returned free heap memory to the system",
                    metadata: [
                        "resident_before_mib": "\(before >> 20)", "resident_after_mib": "\(after >> 20)",
                        "heap_free_mib": "\(free >> 20)", "took_us": "\(took / 1_000)",
                    ])
            }
        }
        thread.name = "banyan-memory-trim"
        thread.start()
        return true
    }

    /// glibc: heap statistics and trimming exist (`mallinfo2`, glibc 2.33 and later).
    static var canTrim: Bool {
        #if canImport(Glibc)
        return banyan_heap_free_bytes() > 0
        #else
        return false
        #endif
    }

    /// Trims the heap once: the resident size before and after, and the time it took; nil
    /// where the resident size is not available.
    public static func trimOnce() -> (before: Int, after: Int, nanoseconds: UInt64)? {
        guard let before = residentBytes() else { return nil }
        let (after, took) = trimNow(before: before)
        return (before, after, took)
    }

    private static func trimNow(before: Int) -> (after: Int, nanoseconds: UInt64) {
        let start = DispatchTime.now().uptimeNanoseconds
        _ = banyan_heap_trim()
        let took = DispatchTime.now().uptimeNanoseconds - start
        return (residentBytes() ?? before, took)
    }

    /// The process's resident set in bytes (`/proc/self/statm`), or nil where it cannot be read.
    public static func residentBytes() -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return nil }
        let fields = text.split(separator: " ")
        guard fields.count > 1, let pages = Int(fields[1]) else { return nil }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    }

    typealias MallOpt = @convention(c) (Int32, Int32) -> Int32

    /// glibc's `mallopt`, declared in <malloc.h>, which the Glibc module does not include: found
    /// in the process instead (nil under another C library: nothing is changed).
    static func mallopt() -> MallOpt? {
        guard let process = dlopen(nil, RTLD_NOW), let symbol = dlsym(process, "mallopt") else { return nil }
        return unsafeBitCast(symbol, to: MallOpt.self)
    }
}
