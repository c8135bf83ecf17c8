// AVX-512 f32 -> bf16 rounding on 16 lanes, bit for bit convert.h's bf16_bits_branch_free (RNE, NaN quieted,
// subnormals kept: not vcvtneps2bf16, which flushes them), with an optional scale and streaming stores for
// outputs too large to stay in cache (no read-for-ownership of lines that are only written). Bound by the
// stores. CPU-only (not included by .cu files).
#pragma once
#include <immintrin.h>

#include <algorithm>
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

// y[i] = bf16(x[i] * k - s) for i < n (one thread): the product rounded to f32, then the difference (s = +0
// leaves the product's bits). With `stream`, the 32-byte aligned middle is written by non-temporal stores
// (ordered by the sfence before returning).
__attribute__((target("avx512f"))) inline void scale_narrow_bf16_512(const float* x, float k, BFloat16* y,
                                                                     int64_t n, bool stream, float s = 0.0f) {
  uint16_t* bits = reinterpret_cast<uint16_t*>(y);
  const auto one = [k, s](float v) {
    float p = v * k;
    asm("" : "+x"(p));  // rounded on its own: never contracted into an FMA with the subtraction
    return bf16_bits_branch_free(p - s);
  };
  int64_t i = 0;
  if (stream) {  // to the first 32-byte boundary one by one (y is 2-byte aligned)
    for (; i < n && (reinterpret_cast<uintptr_t>(bits + i) & 31) != 0; ++i) bits[i] = one(x[i]);
  }
  const __m512 kk = _mm512_set1_ps(k), ss = _mm512_set1_ps(s);
  if (stream) {
    for (; i + 16 <= n; i += 16)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(bits + i),
                          bf16_round16(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), kk), ss)));
    _mm_sfence();
  } else {
    for (; i + 16 <= n; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + i),
                          bf16_round16(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), kk), ss)));
  }
  for (; i < n; ++i) bits[i] = one(x[i]);
}

__attribute__((target("avx512f"))) inline __m512 unpacklo64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}
__attribute__((target("avx512f"))) inline __m512 unpackhi64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}

// Rows j of r in, columns j out: a 16 x 16 f32 block transposed in registers (pairs of rows interleaved,
// then pairs of pairs, then 128-bit lanes exchanged twice).
__attribute__((target("avx512f"), always_inline)) inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int j = 0; j < 16; j += 2) {
    t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
  }
  // Lane L of r[4g + c] now holds rows 4g..4g+3 at column 4L + c.
  for (int j = 0; j < 16; j += 4) {
    r[j] = unpacklo64(t[j], t[j + 2]);
    r[j + 1] = unpackhi64(t[j], t[j + 2]);
    r[j + 2] = unpacklo64(t[j + 1], t[j + 3]);
    r[j + 3] = unpackhi64(t[j + 1], t[j + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // column 4L + c: lane L of r[c], r[4 + c], r[8 + c], r[12 + c]
    const __m512 u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44),
                 u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xee);
    const __m512 u2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44),
                 u3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xee);
    t[c] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    t[4 + c] = _mm512_shuffle_f32x4(u0, u2, 0xdd);
    t[8 + c] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(u1, u3, 0xdd);
  }
  for (int j = 0; j < 16; ++j) r[j] = t[j];
}

// dst[o * ldd + i] = bf16(src[i * lds + o] (* k when Scaled)) for o < no, i < ni: 16 x 16 blocks through
// registers, the edges one by one. Bound by memory: 16 source rows are read a burst of up to 64 values each
// (whole lines; a line per row and block was 1.5x slower), then transposed block by block.
template <bool Scaled>
__attribute__((target("avx512f"))) inline void transpose_narrow_bf16_512(const float* src, int64_t lds,
                                                                         BFloat16* dst, int64_t ldd,
                                                                         int64_t ni, int64_t no, float k) {
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  const __m512 kk = _mm512_set1_ps(k);
  const int64_t ni16 = ni / 16 * 16, no16 = no / 16 * 16;
  __m512 r[4][16];
  for (int64_t i = 0; i < ni16; i += 16) {
    for (int64_t o0 = 0; o0 < no16; o0 += 64) {
      const int64_t blocks = std::min<int64_t>(4, (no16 - o0) / 16);
      for (int j = 0; j < 16; ++j)
        for (int64_t b = 0; b < blocks; ++b) {
          r[b][j] = _mm512_loadu_ps(src + (i + j) * lds + o0 + 16 * b);
          if constexpr (Scaled) r[b][j] = _mm512_mul_ps(r[b][j], kk);
        }
      for (int64_t b = 0; b < blocks; ++b) {
        transpose16(r[b]);
        for (int j = 0; j < 16; ++j)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + (o0 + 16 * b + j) * ldd + i),
                              bf16_round16(r[b][j]));
      }
    }
  }
  auto one = [&](int64_t o, int64_t i) {
    const float v = src[i * lds + o];
    d[o * ldd + i] = bf16_bits_branch_free(Scaled ? v * k : v);
  };
  for (int64_t o = 0; o < no16; ++o)
    for (int64_t i = ni16; i < ni; ++i) one(o, i);
  for (int64_t o = no16; o < no; ++o)
    for (int64_t i = 0; i < ni; ++i) one(o, i);
}

}  // namespace tr::cpu

TR_AVX512_DIAGNOSTICS_END
