import Glibc

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

    typealias MallOpt = @convention(c) (Int32, Int32) -> Int32

    /// glibc's `mallopt`, declared in <malloc.h>, which the Glibc module does not include: found
    /// in the process instead (nil under another C library: nothing is changed).
    static func mallopt() -> MallOpt? {
        guard let process = dlopen(nil, RTLD_NOW), let symbol = dlsym(process, "mallopt") else { return nil }
        return unsafeBitCast(symbol, to: MallOpt.self)
    }
}
