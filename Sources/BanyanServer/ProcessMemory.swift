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

    /// Starts a thread that, every `interval` seconds, hands the heap's free pages back to the
    /// system (`malloc_trim`) when the process holds at least `minimumResidentBytes`. Freed
    /// small allocations (a deleted subtree's nodes, parsed bodies, a snapshot's buffers) stay
    /// in glibc's heap otherwise: after the hostile scenario, with its data deleted, each node
    /// kept 65–115 MiB more than its live data explained. The thread lives as long as the
    /// process (`banyan serve` only); a trim that finds nothing to return costs a walk of the
    /// free lists. Does nothing under another C library. Returns whether the thread started.
    @discardableResult
    public static func startTrimming(every interval: Double = 5, minimumResidentBytes: Int = 128 << 20, logger: Logger) -> Bool {
        guard let trim = mallocTrim() else { return false }
        let trims = Counter(label: "banyan_memory_trims_total")
        let returned = Counter(label: "banyan_memory_trimmed_bytes_total")
        let thread = Thread {
            while true {
                Thread.sleep(forTimeInterval: interval)
                guard let before = residentBytes(), before >= minimumResidentBytes else { continue }
                let (after, took) = trimNow(trim, before: before)
                trims.increment()
                if after < before { returned.increment(by: Int64(before - after)) }
                // A long trim holds the heap's lock while other threads allocate: worth a notice.
                let level: Logger.Level = took >= 20_000_000 ? .notice : (before - after >= 16 << 20 ? .info : .debug)
                logger.log(
                    level: level, "returned free heap memory to the system",
                    metadata: [
                        "resident_before_mib": "\(before >> 20)", "resident_after_mib": "\(after >> 20)",
                        "took_us": "\(took / 1_000)",
                    ])
            }
        }
        thread.name = "banyan-memory-trim"
        thread.qualityOfService = .utility
        thread.start()
        return true
    }

    /// Trims the heap once (`malloc_trim(0)`): the resident size before and after, and the
    /// time it took; nil where `malloc_trim` or the resident size is not available.
    public static func trimOnce() -> (before: Int, after: Int, nanoseconds: UInt64)? {
        guard let trim = mallocTrim(), let before = residentBytes() else { return nil }
        let (after, took) = trimNow(trim, before: before)
        return (before, after, took)
    }

    private static func trimNow(_ trim: MallocTrim, before: Int) -> (after: Int, nanoseconds: UInt64) {
        let start = DispatchTime.now().uptimeNanoseconds
        _ = trim(0)
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

    typealias MallocTrim = @convention(c) (Int) -> Int32

    /// glibc's `malloc_trim`, found in the process as `mallopt` is (nil elsewhere).
    static func mallocTrim() -> MallocTrim? {
        guard let process = dlopen(nil, RTLD_NOW), let symbol = dlsym(process, "malloc_trim") else { return nil }
        return unsafeBitCast(symbol, to: MallocTrim.self)
    }

    typealias MallOpt = @convention(c) (Int32, Int32) -> Int32

    /// glibc's `mallopt`, declared in <malloc.h>, which the Glibc module does not include: found
    /// in the process instead (nil under another C library: nothing is changed).
    static func mallopt() -> MallOpt? {
        guard let process = dlopen(nil, RTLD_NOW), let symbol = dlsym(process, "mallopt") else { return nil }
        return unsafeBitCast(symbol, to: MallOpt.self)
    }
}
