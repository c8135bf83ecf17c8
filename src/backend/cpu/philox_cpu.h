// Philox4x32-10 for the CPU's dropout loops: eight consecutive blocks at once in AVX-512's 64-bit lanes
// (each lane's low half holds a 32-bit word, so vpmuludq gives the 32x32->64 products the rounds need),
// where the CPU has AVX-512F; rng.h's scalar philox4x32 elsewhere and for a run's ragged ends. The same
// words as philox_word (test Philox.EightBlocksAtOnceMatchOneByOne). Bound by the multiplies: ~4
// instructions a word against ~30 scalar.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "backend/cpu/avx512_diagnostics.h"
#include "backend/cpu/vec_math512.h"
#include "core/rng.h"

TR_AVX512_DIAGNOSTICS_BEGIN

namespace tr::cpu {

// The 32 words of blocks counter .. counter + 7 under `key`, block by block.
__attribute__((target("avx512f"))) inline void philox_x8(uint64_t counter, uint64_t key, uint32_t* out) {
  const __m512i lo = _mm512_set1_epi64(0xFFFFFFFF);
  const __m512i ctr = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(counter)),
                                       _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
  __m512i c0 = _mm512_and_si512(ctr, lo), c1 = _mm512_srli_epi64(ctr, 32);
  __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53), m1 = _mm512_set1_epi64(0xCD9E8D57);
  for (int r = 0; r < 10; ++r) {
    const __m512i p0 = _mm512_mul_epu32(c0, m0), p1 = _mm512_mul_epu32(c2, m1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(p1, 32), c1), _mm512_set1_epi64(k0));
    c1 = _mm512_and_si512(p1, lo);
    c2 = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(p0, 32), c3), _mm512_set1_epi64(k1));
    c3 = _mm512_and_si512(p0, lo);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // Words (c0, c1, c2, c3) of each block next to each other: pack the four low halves into 32-bit lanes.
  const __m512i w01 = _mm512_or_si512(c0, _mm512_slli_epi64(c1, 32));  // per block: c0 | c1 << 32
  const __m512i w23 = _mm512_or_si512(c2, _mm512_slli_epi64(c3, 32));
  _mm512_storeu_si512(out, _mm512_permutex2var_epi64(w01, _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0), w23));
  _mm512_storeu_si512(out + 16,
                      _mm512_permutex2var_epi64(w01, _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4), w23));
}

// philox_words with the blocks of a run's middle made eight at a time where the CPU has AVX-512F.
template <typename F>
void philox_words_fast(uint64_t seed, uint64_t offset, uint64_t first, int64_t n, F&& f) {
  const uint64_t end = first + static_cast<uint64_t>(n);
  uint64_t i = first;
  if (cpu_has_avx512f()) {
    const uint64_t head = std::min(end, (first + 3) / 4 * 4);  // to a block boundary
    philox_words(seed, offset, i, static_cast<int64_t>(head - i), f);
    i = head;
    alignas(64) uint32_t buf[32];
    for (; end - i >= 32; i += 32) {
      philox_x8(offset + i / 4, seed, buf);
      const auto base = static_cast<int64_t>(i - first);
      for (int k = 0; k < 32; ++k) f(base + k, buf[k]);
    }
  }
  const auto base = static_cast<int64_t>(i - first);
  philox_words(seed, offset, i, static_cast<int64_t>(end - i),
               [&](int64_t k, uint32_t w) { f(base + k, w); });
}

// Words first .. first + n - 1 of (seed, offset) into out[0 .. n): for loops that then consume them in
// vectors (a callback per word keeps the consumer scalar).
inline void philox_fill(uint64_t seed, uint64_t offset, uint64_t first, int64_t n, uint32_t* out) {
  philox_words_fast(seed, offset, first, n, [out](int64_t i, uint32_t w) { out[i] = w; });
}

}  // namespace tr::cpu

TR_AVX512_DIAGNOSTICS_END
