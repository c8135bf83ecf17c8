// AVX-512 twins of vec_math.h's f32 row kernels (row_max, exp_sum, exp_scale) for the cross-entropy and
// softmax hot loops, chosen at run time where the CPU has AVX-512F; bound by the exponential's FMAs.
// Bit-identical to the AVX2 kernels by construction: exp16 is exp8 operation for operation on 16 lanes, and
// exp_sum's 16-lane accumulator holds in lanes 0-7 / 8-15 exactly what the AVX2 loop's acc0 / acc1 hold.
// CPU-only (not included by .cu files).
#pragma once
#include <immintrin.h>

#include "backend/cpu/avx512_diagnostics.h"
#include "backend/cpu/vec_math.h"

TR_AVX512_DIAGNOSTICS_BEGIN

namespace tr::cpu {

// Whether this CPU runs the 16-lane kernels (a CPUID fact, read by the compiler's runtime once).
inline bool cpu_has_avx512f() { return __builtin_cpu_supports("avx512f"); }

__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3365447504f);
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __mmask16 in = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);  // as exp8: no subnormal product
  __m512 xc = _mm512_maskz_mov_ps(in, _mm512_min_ps(x, hi));
  __m512 t = _mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), magic);
  __m512 n = _mm512_sub_ps(t, magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  y = _mm512_maskz_mov_ps(in, y);
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), y, _mm512_set1_ps(__builtin_inff()));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

// row_max's result (max is exact, so lane order cannot matter); NaN propagates.
__attribute__((target("avx512f"))) inline float row_max_512(const float* a, int64_t n) {
  __m512 m = _mm512_set1_ps(-__builtin_inff());
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(a + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, v);
  }
  float r = nan ? __builtin_nanf("") : _mm512_reduce_max_ps(m);
  if (r != r) return r;
  const float rest = row_max(a + i, n - i);  // the AVX2 kernel on the tail (-inf when empty)
  return rest != rest ? rest : (rest > r ? rest : r);
}

// exp_sum's result, bit for bit.
__attribute__((target("avx512f"))) inline float exp_sum_512(const float* a, float shift, float* out,
                                                            int64_t n) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(a + i), s));
    if (out) _mm512_storeu_ps(out + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  float sum = hsum8(_mm256_add_ps(_mm512_castps512_ps256(acc),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1))));
  for (; i < n; ++i) {
    float e = fast_expf(a[i] - shift);
    if (out) out[i] = e;
    sum += e;
  }
  return sum;
}

// exp_scale's result, bit for bit.
__attribute__((target("avx512f"))) inline void exp_scale_512(const float* a, float shift, float scale,
                                                             float* out, int64_t n) {
  const __m512 s = _mm512_set1_ps(shift), k = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_mul_ps(exp16(_mm512_sub_ps(_mm512_loadu_ps(a + i), s)), k));
  exp_scale(a + i, shift, scale, out + i, n - i);  // the AVX2 kernel on the tail
}

}  // namespace tr::cpu

TR_AVX512_DIAGNOSTICS_END
