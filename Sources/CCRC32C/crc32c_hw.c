// CRC-32C with the processor's own instruction: about five times the speed of the
// slicing-by-8 table on the log's hot path (every record written, read back and verified).
#include "crc32c_hw.h"
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>

int banyan_crc32c_hw_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
}

__attribute__((target("sse4.2")))
uint32_t banyan_crc32c_hw(uint32_t crc, const uint8_t *bytes, size_t count) {
    uint64_t c = (uint32_t)~crc;
    // Unaligned 8-byte loads through memcpy (one instruction each once compiled).
    while (count >= 8) {
        uint64_t word;
        memcpy(&word, bytes, 8);
        c = _mm_crc32_u64(c, word);
        bytes += 8;
        count -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (count > 0) {
        c32 = _mm_crc32_u8(c32, *bytes);
        bytes += 1;
        count -= 1;
    }
    return ~c32;
}

#elif defined(__aarch64__) && defined(__linux__)
#include <arm_acle.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif

int banyan_crc32c_hw_available(void) {
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) ? 1 : 0;
}

__attribute__((target("crc")))
uint32_t banyan_crc32c_hw(uint32_t crc, const uint8_t *bytes, size_t count) {
    uint32_t c = ~crc;
    while (count >= 8) {
        uint64_t word;
        memcpy(&word, bytes, 8);
        c = __crc32cd(c, word);
        bytes += 8;
        count -= 8;
    }
    while (count > 0) {
        c = __crc32cb(c, *bytes);
        bytes += 1;
        count -= 1;
    }
    return ~c;
}

#else

int banyan_crc32c_hw_available(void) { return 0; }

uint32_t banyan_crc32c_hw(uint32_t crc, const uint8_t *bytes, size_t count) {
    (void)bytes;
    (void)count;
    return crc;
}

#endif
