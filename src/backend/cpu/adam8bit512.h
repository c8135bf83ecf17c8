// bitsandbytes' requantization of 8-bit optimizer states (adamw8bit_math.h's adam8bit_codes and signed_code)
// for 16 elements at once in AVX-512: the lower bound in the 256-entry map by eight gathers and masked
// selects. The scalar search is a chain of eight dependent loads and compares per moment, two per element -
// the 8-bit step's bound on the CPU; here 16 chains run side by side. The same codes as the scalar function,
// bit for bit (Optim8bit.CodesOf16ElementsAreTheScalarCodes).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace tr::cpu {

// code[idx] in 16 lanes (the masked form: GCC 12 warns of the plain gather's undefined pass-through).
__attribute__((target("avx512f"))) inline __m512 gather16(const float* code, __m512i idx) {
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xFFFF, idx, code, 4);
}

// quantize_code for 16 values: the nearest code's index, a tie to the even index, the ends clamped, NaN to 0.
__attribute__((target("avx512f"))) inline __m512i quantize16(const float* code, __m512 x) {
  const __m512i one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
  __m512i base = zero;
  for (int half = 128; half >= 1; half >>= 1) {
    const __m512i idx = _mm512_add_epi32(base, _mm512_set1_epi32(half));
    const __mmask16 below_x = _mm512_cmp_ps_mask(gather16(code, idx), x, _CMP_LT_OQ);
    base = _mm512_mask_mov_epi32(base, below_x, idx);
  }
  const __mmask16 up = _mm512_cmp_ps_mask(gather16(code, base), x, _CMP_LT_OQ);
  const __m512i lo = _mm512_mask_add_epi32(base, up, base, one);  // the first code >= x, in [0, 256]
  const __m512i hi = _mm512_maskz_min_epi32(0xFFFF, lo, _mm512_set1_epi32(255));
  const __m512i below = _mm512_maskz_max_epi32(0xFFFF, _mm512_sub_epi32(lo, one), zero);
  const __m512 mid =
      _mm512_mul_ps(_mm512_add_ps(gather16(code, below), gather16(code, hi)), _mm512_set1_ps(0.5f));
  const __mmask16 gt = _mm512_cmp_ps_mask(x, mid, _CMP_GT_OQ), lt = _mm512_cmp_ps_mask(x, mid, _CMP_LT_OQ);
  const __mmask16 even = _mm512_testn_epi32_mask(below, one);
  __m512i r = _mm512_mask_mov_epi32(lo, lt | (~(gt | lt) & even), below);
  r = _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(lo, zero), zero);
  return _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(lo, _mm512_set1_epi32(256)),
                               _mm512_set1_epi32(255));
}

// signed_code for s[0, 16) into c[0, 16): the first moment's codes (and the one-state kernels' state).
__attribute__((target("avx512f"))) inline void signed_codes16(const float* s, float max, const float* qs,
                                                              uint8_t* c) {
  const __m512 a = _mm512_loadu_ps(s);
  __m512i q = quantize16(qs, _mm512_div_ps(a, _mm512_set1_ps(max > 0 ? max : 1.0f)));
  // The value keeps its sign: a code of the other sign moves one code outwards (uint8 wrap-around as the
  // scalar's).
  const __m512i signs = _mm512_xor_si512(_mm512_castps_si512(gather16(qs, q)), _mm512_castps_si512(a));
  const __mmask16 flip = _mm512_test_epi32_mask(signs, _mm512_set1_epi32(INT32_MIN));
  const __mmask16 pos = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_GT_OQ);
  const __m512i one = _mm512_set1_epi32(1);
  q = _mm512_mask_add_epi32(q, flip & pos, q, one);
  q = _mm512_mask_sub_epi32(q, flip & static_cast<__mmask16>(~pos), q, one);
  _mm512_mask_cvtepi32_storeu_epi8(c, 0xFFFF, q);  // truncated to 8 bits: the wrap of uint8_t arithmetic
}

// adam8bit_codes for s1[0, 16) and s2[0, 16) into c1[0, 16) and c2[0, 16).
__attribute__((target("avx512f"))) inline void adam8bit_codes16(const float* s1, const float* s2, float max1,
                                                                float max2, const float* qs, const float* qu,
                                                                uint8_t* c1, uint8_t* c2) {
  signed_codes16(s1, max1, qs, c1);
  const __m512 b = _mm512_loadu_ps(s2);
  _mm512_mask_cvtepi32_storeu_epi8(c2, 0xFFFF,
                                   quantize16(qu, _mm512_div_ps(b, _mm512_set1_ps(max2 > 0 ? max2 : 1.0f))));
}

}  // namespace tr::cpu
