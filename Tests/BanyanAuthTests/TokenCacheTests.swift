import BanyanAuth
import Testing

/// `TokenCache`: what it serves, when it stops serving it, and its bounds.
@Suite struct TokenCacheTests {
    @Test("a hit returns the recorded value until validUntil, never at or after it")
    func hitsUntilExpiry() {
        var cache = TokenCache<String>()
        cache.insert("t1", "alice", valueBytes: 5, verifiedAt: 1_000, validUntil: 5_000)
        #expect(cache.lookup("t1", now: 1_000) == "alice")
        #expect(cache.lookup("t1", now: 4_999) == "alice")
        #expect(cache.lookup("t2", now: 2_000) == nil)
        #expect(cache.lookup("t1", now: 5_000) == nil)
        // The expired entry is gone, even if the clock went back.
        #expect(cache.count == 0 && cache.bytes == 0)
        #expect(cache.lookup("t1", now: 2_000) == nil)
    }

    @Test("an entry is not served before the time it was verified at (a clock stepped back)")
    func clockBack() {
        var cache = TokenCache<String>()
        cache.insert("t", "alice", valueBytes: 5, verifiedAt: 10_000, validUntil: nil)
        #expect(cache.lookup("t", now: 9_999) == nil)
        #expect(cache.count == 0)
        cache.insert("t", "alice", valueBytes: 5, verifiedAt: 10_000, validUntil: nil)
        #expect(cache.lookup("t", now: .max) == "alice")
    }

    @Test("an entry already expired when verified is not recorded; removeAll forgets everything")
    func expiredAndRemoveAll() {
        var cache = TokenCache<String>()
        cache.insert("t", "x", valueBytes: 1, verifiedAt: 5_000, validUntil: 5_000)
        #expect(cache.count == 0)
        cache.insert("a", "x", valueBytes: 1, verifiedAt: 0, validUntil: nil)
        cache.insert("b", "y", valueBytes: 1, verifiedAt: 0, validUntil: nil)
        cache.removeAll()
        #expect(cache.count == 0 && cache.bytes == 0 && cache.lookup("a", now: 1) == nil)
    }

    @Test("at most maxEntries: the oldest is evicted first, a replaced entry counts once")
    func entryBound() {
        var cache = TokenCache<Int>(maxEntries: 4)
        for i in 0..<4 { cache.insert("t\(i)", i, valueBytes: 0, verifiedAt: 0, validUntil: nil) }
        // Re-recording t0 makes it the newest.
        cache.insert("t0", 10, valueBytes: 0, verifiedAt: 0, validUntil: nil)
        #expect(cache.count == 4)
        cache.insert("t4", 4, valueBytes: 0, verifiedAt: 0, validUntil: nil)
        #expect(cache.count == 4)
        #expect(cache.lookup("t1", now: 0) == nil)
        #expect(cache.lookup("t0", now: 0) == 10 && cache.lookup("t2", now: 0) == 2 && cache.lookup("t4", now: 0) == 4)
        for i in 5..<10_000 { cache.insert("t\(i)", i, valueBytes: 0, verifiedAt: 0, validUntil: nil) }
        #expect(cache.count == 4)
        for i in 9_996..<10_000 { #expect(cache.lookup("t\(i)", now: 0) == i) }
    }

    @Test("at most maxBytes: the oldest are evicted to make room; an entry larger than the bound is not recorded")
    func byteBound() {
        let overhead = TokenCache<Int>.entryOverhead
        var cache = TokenCache<Int>(maxEntries: 100, maxBytes: 3 * (overhead + 100))
        for i in 0..<3 { cache.insert("t\(i)", i, valueBytes: 98, verifiedAt: 0, validUntil: nil) }
        #expect(cache.count == 3 && cache.bytes == 3 * (overhead + 100))
        cache.insert("t3", 3, valueBytes: 98, verifiedAt: 0, validUntil: nil)
        #expect(cache.count == 3 && cache.lookup("t0", now: 0) == nil && cache.lookup("t3", now: 0) == 3)
        cache.insert("big", 9, valueBytes: 4 * (overhead + 100), verifiedAt: 0, validUntil: nil)
        #expect(cache.lookup("big", now: 0) == nil && cache.count == 3)
        for i in 0..<5_000 {
            cache.insert("k\(i)", i, valueBytes: i % 200, verifiedAt: 0, validUntil: nil)
            #expect(cache.bytes <= cache.maxBytes)
        }
        #expect(cache.lookup("k4999", now: 0) == 4999)
    }
}
