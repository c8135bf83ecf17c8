// AVX-512 twins of vec_unary.h's row kernels (tanh GELU, SiLU, sigmoid, tanh, exp and their derivatives),
// chosen at run time where the CPU has AVX-512F. Each is its AVX2 form operation for operation on 16 lanes,
// so an element's bits do not depend on which runs (test VecMath.SixteenLanesMatchEight); like them,
// bound by the FMA ports and the division (~25 flops an element), at twice the lanes. A row's tail runs
// through the same 16-lane code under a mask. CPU-only.
#pragma once
#include "backend/cpu/avx512_diagnostics.h"
#include "backend/cpu/vec_math512.h"
#include "backend/op_kinds.h"

TR_AVX512_DIAGNOSTICS_BEGIN

namespace tr::cpu {

#define TR_AVX512F __attribute__((target("avx512f"))) inline

TR_AVX512F __m512 splat16(float v) { return _mm512_set1_ps(v); }

TR_AVX512F __m512 expm1_16(__m512 x) {
  __m512 p = splat16(1.0f / 40320.0f);
  p = _mm512_fmadd_ps(p, x, splat16(1.0f / 5040.0f));
  p = _mm512_fmadd_ps(p, x, splat16(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, x, splat16(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, x, splat16(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, x, splat16(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, x, splat16(0.5f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(x, x), p, x);
  const __m512 big = _mm512_sub_ps(exp16(x), splat16(1.0f));
  const __m512 ax = _mm512_abs_ps(x);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, splat16(0.5f), _CMP_LT_OQ), big, small);
}

TR_AVX512F __m512 tanh16(__m512 x) {
  const __m512 y = _mm512_min_ps(_mm512_max_ps(x, splat16(-20.0f)), splat16(20.0f));
  const __m512 e = expm1_16(_mm512_add_ps(y, y));
  const __m512 t = _mm512_div_ps(e, _mm512_add_ps(e, splat16(2.0f)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), t, x);
}

TR_AVX512F __m512 sigmoid16(__m512 x) {
  const __m512 one = splat16(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

TR_AVX512F __m512 gelu_tanh_t16(__m512 x, __m512 x2) {
  const __m512 inner = _mm512_add_ps(x, _mm512_mul_ps(_mm512_mul_ps(splat16(0.044715f), x2), x));
  return tanh16(_mm512_mul_ps(splat16(0.7978845608028654f), inner));
}

template <backend::UnaryOp OP>
TR_AVX512F __m512 unary16(__m512 x) {
  using backend::UnaryOp;
  const __m512 one = splat16(1.0f), half = splat16(0.5f);
  if constexpr (OP == UnaryOp::gelu_tanh) {
    const __m512 t = gelu_tanh_t16(x, _mm512_mul_ps(x, x));
    return _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, t));
  } else if constexpr (OP == UnaryOp::silu) {
    return _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
  } else if constexpr (OP == UnaryOp::sigmoid) {
    return sigmoid16(x);
  } else if constexpr (OP == UnaryOp::tanh) {
    return tanh16(x);
  } else {
    static_assert(OP == UnaryOp::exp, "unary16: no vector form");
    return exp16(x);
  }
}

template <backend::UnaryOp OP>
TR_AVX512F __m512 unary_grad16(__m512 x) {
  using backend::UnaryOp;
  const __m512 one = splat16(1.0f), half = splat16(0.5f);
  if constexpr (OP == UnaryOp::gelu_tanh) {
    const __m512 x2 = _mm512_mul_ps(x, x);
    const __m512 t = gelu_tanh_t16(x, x2);
    const __m512 a = _mm512_mul_ps(half, _mm512_add_ps(one, t));
    const __m512 sech2 = _mm512_sub_ps(one, _mm512_mul_ps(t, t));
    const __m512 d = _mm512_add_ps(one, _mm512_mul_ps(splat16(3.0f * 0.044715f), x2));
    const __m512 b =
        _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(half, x), sech2), splat16(0.7978845608028654f));
    return _mm512_add_ps(a, _mm512_mul_ps(b, d));
  } else if constexpr (OP == UnaryOp::silu) {
    const __m512 s = sigmoid16(x);
    return _mm512_mul_ps(s, _mm512_add_ps(one, _mm512_mul_ps(x, _mm512_sub_ps(one, s))));
  } else if constexpr (OP == UnaryOp::sigmoid) {
    const __m512 s = sigmoid16(x);
    return _mm512_mul_ps(s, _mm512_sub_ps(one, s));
  } else if constexpr (OP == UnaryOp::tanh) {
    const __m512 t = tanh16(x);
    return _mm512_sub_ps(one, _mm512_mul_ps(t, t));
  } else {
    static_assert(OP == UnaryOp::exp, "unary_grad16: no vector form");
    return exp16(x);
  }
}

// The lanes of a row's last 16 or fewer elements.
TR_AVX512F __mmask16 tail_mask16(int64_t left) {
  return static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1u);
}

template <backend::UnaryOp OP>
TR_AVX512F void unary_row16(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask16(n - i);
    _mm512_mask_storeu_ps(y + i, m, unary16<OP>(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

template <backend::UnaryOp OP>
TR_AVX512F void unary_grad_row16(const float* x, const float* gy, float* gx, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask16(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gy + i);
    _mm512_mask_storeu_ps(gx + i, m, _mm512_mul_ps(g, unary_grad16<OP>(_mm512_maskz_loadu_ps(m, x + i))));
  }
}

#undef TR_AVX512F

}  // namespace tr::cpu

TR_AVX512_DIAGNOSTICS_END
