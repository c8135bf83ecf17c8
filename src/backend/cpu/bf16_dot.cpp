// AVX512_BF16 tile products and pair packing (see bf16_dot.h).
#include "backend/cpu/bf16_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/avx512_diagnostics.h"
#include "backend/cpu/convert512.h"

TR_AVX512_DIAGNOSTICS_BEGIN

namespace tr::cpu::dpbf16 {

bool available() { return __builtin_cpu_supports("avx512bf16"); }

namespace {

// c[4 x 16 NV] (+)= A[4 x K] B[K x 16 NV]: 4 NV accumulators, one broadcast word per row and pair step.
template <int NV>
__attribute__((target("avx512f,avx512bf16"), always_inline)) inline void block(
    int64_t pairs, const uint32_t* a, int64_t a_row, int64_t a_pair, const BFloat16* b, int64_t ldb, float* c,
    int64_t ldc, bool accumulate) {
  __m512 acc[4][NV];
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const BFloat16* bk = b + kp * ldb;
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(bk + 32 * v));
    const uint32_t* ak = a + kp * a_pair;
    for (int r = 0; r < 4; ++r) {
      const __m512bh ar = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(ak[r * a_row])));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, bv[v]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

}  // namespace

__attribute__((target("avx512f,avx512bf16"))) void gemm(int64_t M, int64_t N, int64_t K, const BFloat16* a,
                                                        int64_t a_row, int64_t a_pair, const BFloat16* b,
                                                        int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const auto* aw = reinterpret_cast<const uint32_t*>(a);
  const int64_t pairs = K / 2;
  for (int64_t n = 0; n < N; n += 64) {
    const int64_t nv = std::min<int64_t>(4, (N - n) / 16);
    const BFloat16* bn = b + 2 * n;
    for (int64_t m = 0; m < M; m += 4) {
      const uint32_t* am = aw + m * a_row;
      float* cm = c + m * ldc + n;
      switch (nv) {
        case 4: block<4>(pairs, am, a_row, a_pair, bn, ldb, cm, ldc, accumulate); break;
        case 3: block<3>(pairs, am, a_row, a_pair, bn, ldb, cm, ldc, accumulate); break;
        case 2: block<2>(pairs, am, a_row, a_pair, bn, ldb, cm, ldc, accumulate); break;
        default: block<1>(pairs, am, a_row, a_pair, bn, ldb, cm, ldc, accumulate); break;
      }
    }
  }
}

__attribute__((target("avx512f"))) void pack_pairs_rounded(const float* x, int64_t ldx, int64_t rows,
                                                           int64_t cols, int64_t rows_pad, int64_t ld_out,
                                                           BFloat16* out) {
  auto* ow = reinterpret_cast<uint32_t*>(out);
  for (int64_t r = 0; r < rows_pad; r += 2) {
    uint32_t* o = ow + (r / 2) * ld_out;
    const float* x0 = r < rows ? x + r * ldx : nullptr;
    const float* x1 = r + 1 < rows ? x + (r + 1) * ldx : nullptr;
    int64_t j = 0;
    for (; j < cols; j += 16) {  // (lo, hi) = (row r, row r + 1), RNE as bf16_round16
      const __mmask16 m = j + 16 <= cols ? __mmask16(0xFFFF) : __mmask16((1u << (cols - j)) - 1);
      const __m512 f0 = x0 ? _mm512_maskz_loadu_ps(m, x0 + j) : _mm512_setzero_ps();
      const __m512 f1 = x1 ? _mm512_maskz_loadu_ps(m, x1 + j) : _mm512_setzero_ps();
      const __m512i lo = _mm512_cvtepu16_epi32(bf16_round16(f0)),
                    hi = _mm512_cvtepu16_epi32(bf16_round16(f1));
      _mm512_mask_storeu_epi32(o + j, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
    std::fill(o + cols, o + ld_out, 0u);
  }
}

}  // namespace tr::cpu::dpbf16

TR_AVX512_DIAGNOSTICS_END
