#ifndef BANYAN_CRC32C_HW_H
#define BANYAN_CRC32C_HW_H

#include <stddef.h>
#include <stdint.h>

/// 1 when this processor has a CRC-32C instruction (x86-64: SSE 4.2; AArch64: the CRC32
/// extension), else 0. Pure: reads the processor's feature bits, no I/O.
int banyan_crc32c_hw_available(void);

/// CRC-32C of `count` bytes at `bytes`, continuing from `crc` (0 to start), with the same
/// conventions as the table-driven `CRC32C.checksum` (pre- and post-inverted). Call only when
/// `banyan_crc32c_hw_available()` returned 1.
uint32_t banyan_crc32c_hw(uint32_t crc, const uint8_t *bytes, size_t count);

#endif
