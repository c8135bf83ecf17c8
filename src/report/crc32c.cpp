// CRC-32C with SSE4.2 (see crc32c.h).
#include "report/crc32c.h"

#include <nmmintrin.h>

#include <cstring>

namespace tr::report {

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = 0xffffffffu;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; n > 0; ++p, --n) c32 = _mm_crc32_u8(c32, *p);
  return c32 ^ 0xffffffffu;
}

}  // namespace tr::report
