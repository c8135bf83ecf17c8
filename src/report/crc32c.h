// CRC-32C (Castagnoli), the checksum of TFRecord framing, and TFRecord's masked form of it.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tr::report {

// CRC-32C of `n` bytes (reflected polynomial 0x82F63B78, initial and final xor 0xFFFFFFFF): SSE4.2's crc32
// instruction, 8 bytes per cycle-ish; x86-64-v3, our baseline, always has it.
uint32_t crc32c(const void* data, size_t n);

// TFRecord's mask: rotate right by 15 and add a constant, so a CRC over bytes that embed CRCs stays strong.
inline uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

}  // namespace tr::report
