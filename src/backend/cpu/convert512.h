// AVX-512 f32 -> bf16 rounding on 16 lanes, bit for bit convert.h's bf16_bits_branch_free (RNE, NaN quieted,
// subnormals kept: not vcvtneps2bf16, which flushes them), with an optional scale and streaming stores for
// outputs too large to stay in cache (no read-for-ownership of lines that are only written). Bound by the
// stores. CPU-only (not included by .cu files).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/avx512_diagnostics.h"
#include "backend/cpu/convert.h"

TR_AVX512_DIAGNOSTICS_BEGIN

namespace tr::cpu {

__attribute__((target("avx512f"))) inline __m256i bf16_round16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i quiet_nan = _mm512_or_si512(high, _mm512_set1_epi32(0x0040));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet_nan));
}

// y[i] = bf16(x[i] * k) for i < n (one thread). With `stream`, the 32-byte aligned middle is written by
// non-temporal stores (ordered by the sfence before returning).
__attribute__((target("avx512f"))) inline void scale_narrow_bf16_512(const float* x, float k, BFloat16* y,
                                                                     int64_t n, bool stream) {
  uint16_t* bits = reinterpret_cast<uint16_t*>(y);
  int64_t i = 0;
  if (stream) {  // to the first 32-byte boundary one by one (y is 2-byte aligned)
    for (; i < n && (reinterpret_cast<uintptr_t>(bits + i) & 31) != 0; ++i)
      bits[i] = bf16_bits_branch_free(x[i] * k);
  }
  const __m512 kk = _mm512_set1_ps(k);
  if (stream) {
    for (; i + 16 <= n; i += 16)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(bits + i),
                          bf16_round16(_mm512_mul_ps(_mm512_loadu_ps(x + i), kk)));
    _mm_sfence();
  } else {
    for (; i + 16 <= n; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + i),
                          bf16_round16(_mm512_mul_ps(_mm512_loadu_ps(x + i), kk)));
  }
  for (; i < n; ++i) bits[i] = bf16_bits_branch_free(x[i] * k);
}

}  // namespace tr::cpu

TR_AVX512_DIAGNOSTICS_END
