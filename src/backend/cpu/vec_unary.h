// AVX2 row kernels of the f32 unary ops that carry a transformer's elementwise time - GPT-2's tanh GELU,
// Llama's SiLU, tanh, sigmoid, exp - and their derivatives, with unary_math.h's formulas. GCC leaves the
// scalar forms unvectorized (the op switch and fast_expm1f's branches): the GELU ran at ~9 ns an element,
// over a quarter of a small model's step. These are bound by the FMA ports (~25 flops an element).
// A row's tail goes through the same 8-lane code on a padded copy, so an element's bits never depend on
// where it sits in a row or a thread's chunk.
#pragma once
#include <immintrin.h>

#include "backend/cpu/vec_math.h"
#include "backend/cpu/vec_unary512.h"
#include "backend/op_kinds.h"

namespace tr::cpu {

inline __m256 splat(float v) { return _mm256_set1_ps(v); }

// exp(x) - 1: its series near 0 (no cancellation), exp(x) - 1 elsewhere (fast_expm1f's split).
inline __m256 expm1_8(__m256 x) {
  __m256 p = splat(1.0f / 40320.0f);
  p = _mm256_fmadd_ps(p, x, splat(1.0f / 5040.0f));
  p = _mm256_fmadd_ps(p, x, splat(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, x, splat(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, x, splat(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, x, splat(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, x, splat(0.5f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(x, x), p, x);
  const __m256 big = _mm256_sub_ps(exp8(x), splat(1.0f));
  const __m256 ax = _mm256_andnot_ps(splat(-0.0f), x);
  return _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, splat(0.5f), _CMP_LT_OQ));
}

// tanh(x) = expm1(2x) / (expm1(2x) + 2), x clamped to +-20 (tanh is +-1 in f32 there); NaN propagates.
inline __m256 tanh8(__m256 x) {
  const __m256 y = _mm256_min_ps(_mm256_max_ps(x, splat(-20.0f)), splat(20.0f));
  const __m256 e = expm1_8(_mm256_add_ps(y, y));
  const __m256 t = _mm256_div_ps(e, _mm256_add_ps(e, splat(2.0f)));
  return _mm256_blendv_ps(t, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

inline __m256 sigmoid8(__m256 x) {
  const __m256 one = splat(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

// The ops with a vector form here.
template <backend::UnaryOp OP>
constexpr bool has_vec_unary =
    OP == backend::UnaryOp::gelu_tanh || OP == backend::UnaryOp::silu || OP == backend::UnaryOp::sigmoid ||
    OP == backend::UnaryOp::tanh || OP == backend::UnaryOp::exp;

// gelu_tanh's inner argument sqrt(2/pi) (x + 0.044715 x^3) and its tanh.
inline __m256 gelu_tanh_t(__m256 x, __m256 x2) {
  const __m256 inner = _mm256_add_ps(x, _mm256_mul_ps(_mm256_mul_ps(splat(0.044715f), x2), x));
  return tanh8(_mm256_mul_ps(splat(0.7978845608028654f), inner));
}

template <backend::UnaryOp OP>
inline __m256 unary8(__m256 x) {
  using backend::UnaryOp;
  const __m256 one = splat(1.0f), half = splat(0.5f);
  if constexpr (OP == UnaryOp::gelu_tanh) {
    const __m256 t = gelu_tanh_t(x, _mm256_mul_ps(x, x));
    return _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, t));
  } else if constexpr (OP == UnaryOp::silu) {
    return _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
  } else if constexpr (OP == UnaryOp::sigmoid) {
    return sigmoid8(x);
  } else if constexpr (OP == UnaryOp::tanh) {
    return tanh8(x);
  } else {
    static_assert(OP == UnaryOp::exp, "unary8: no vector form");
    return exp8(x);
  }
}

// d f(x) / dx
template <backend::UnaryOp OP>
inline __m256 unary_grad8(__m256 x) {
  using backend::UnaryOp;
  const __m256 one = splat(1.0f), half = splat(0.5f);
  if constexpr (OP == UnaryOp::gelu_tanh) {
    const __m256 x2 = _mm256_mul_ps(x, x);
    const __m256 t = gelu_tanh_t(x, x2);
    const __m256 a = _mm256_mul_ps(half, _mm256_add_ps(one, t));
    const __m256 sech2 = _mm256_sub_ps(one, _mm256_mul_ps(t, t));
    const __m256 d = _mm256_add_ps(one, _mm256_mul_ps(splat(3.0f * 0.044715f), x2));
    const __m256 b = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), sech2), splat(0.7978845608028654f));
    return _mm256_add_ps(a, _mm256_mul_ps(b, d));
  } else if constexpr (OP == UnaryOp::silu) {
    const __m256 s = sigmoid8(x);
    return _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(x, _mm256_sub_ps(one, s))));
  } else if constexpr (OP == UnaryOp::sigmoid) {
    const __m256 s = sigmoid8(x);
    return _mm256_mul_ps(s, _mm256_sub_ps(one, s));
  } else if constexpr (OP == UnaryOp::tanh) {
    const __m256 t = tanh8(x);
    return _mm256_sub_ps(one, _mm256_mul_ps(t, t));
  } else {
    static_assert(OP == UnaryOp::exp, "unary_grad8: no vector form");
    return exp8(x);
  }
}

// y[i] = f(x[i]) for i < n, 8 lanes at a time.
template <backend::UnaryOp OP>
void unary_row8(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, unary8<OP>(_mm256_loadu_ps(x + i)));
  if (i == n) return;
  float buf[8] = {};
  for (int64_t j = i; j < n; ++j) buf[j - i] = x[j];
  _mm256_storeu_ps(buf, unary8<OP>(_mm256_loadu_ps(buf)));
  for (int64_t j = i; j < n; ++j) y[j] = buf[j - i];
}

// gx[i] = gy[i] * f'(x[i]) for i < n, 8 lanes at a time.
template <backend::UnaryOp OP>
void unary_grad_row8(const float* x, const float* gy, float* gx, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(gx + i, _mm256_mul_ps(_mm256_loadu_ps(gy + i), unary_grad8<OP>(_mm256_loadu_ps(x + i))));
  if (i == n) return;
  float bx[8] = {}, bg[8] = {};
  for (int64_t j = i; j < n; ++j) {
    bx[j - i] = x[j];
    bg[j - i] = gy[j];
  }
  _mm256_storeu_ps(bg, _mm256_mul_ps(_mm256_loadu_ps(bg), unary_grad8<OP>(_mm256_loadu_ps(bx))));
  for (int64_t j = i; j < n; ++j) gx[j] = bg[j - i];
}

// y[i] = f(x[i]) for i < n: 16 lanes where the CPU has AVX-512 (the same bits).
template <backend::UnaryOp OP>
void unary_row(const float* x, float* y, int64_t n) {
  if (cpu_has_avx512f())
    unary_row16<OP>(x, y, n);
  else
    unary_row8<OP>(x, y, n);
}

// gx[i] = gy[i] * f'(x[i]) for i < n (gx may be gy).
template <backend::UnaryOp OP>
void unary_grad_row(const float* x, const float* gy, float* gx, int64_t n) {
  if (cpu_has_avx512f())
    unary_grad_row16<OP>(x, gy, gx, n);
  else
    unary_grad_row8<OP>(x, gy, gx, n);
}

}  // namespace tr::cpu
