// The element math of bitsandbytes' two-state optimizers, AdamW and AdEMAMix, in their blockwise 8-bit kernel
// (kOptimizerStatic8bit2StateBlockwise) and their 32-bit kernel (kOptimizer32bit2State), shared by the CPU
// pass and the CUDA kernels (both compiled without extra fp contraction), so every backend gives the same
// bits. A block of 256 elements dequantizes its moments, updates them in fp32, takes the new absmax over the
// block (the caller's reduction: a max, exact in any order), steps the parameters and requantizes.
#pragma once
#include <cstdint>
#include <cstring>

#include "backend/optim_math.h"
#include "core/hd.h"

namespace tr::backend {

// The step's f32 scalars as bitsandbytes' kernels receive or compute them. AdamW reads step_size and eps_c2;
// AdEMAMix (ademamix: a third state, the slow EMA m2) reads lr, eps, c1 = 1 - b1^t, c2 = sqrt(1 - b2^t), and
// b3 and alpha after their schedules.
struct Adam8bitConsts {
  float b1, b2, one_b1, one_b2, step_size, eps_c2, decay;
  bool decays;
  bool ademamix = false;
  float b3 = 0.0f, one_b3 = 1.0f, alpha = 0.0f, lr = 0.0f, eps = 0.0f, c1 = 1.0f, c2 = 1.0f;
};

constexpr int64_t kAdam8bitBlock = 256;

TR_HD bool finite_f32(float x) { return x - x == 0.0f; }  // false for inf and NaN

TR_HD float abs_f32(float x) { return x < 0.0f ? -x : x; }

TR_HD float fmax_f32(float a, float b) {  // std::fmax: NaN loses
  if (a != a) return b;
  if (b != b) return a;
  return a > b ? a : b;
}

TR_HD bool sign_bit(float x) {
#ifdef __CUDA_ARCH__
  return (__float_as_uint(x) >> 31) != 0;
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u >> 31) != 0;
#endif
}

// quantize_code's choice given the lower bound lo of x (the first code >= x; 256: none).
TR_HD uint8_t code_from_bound(const float* code, float x, int lo) {
  if (lo == 0) return 0;
  if (lo == 256) return 255;
  const int below = lo - 1;
  const float m = (code[below] + code[lo]) * 0.5f;
  if (x > m) return static_cast<uint8_t>(lo);
  if (x < m) return static_cast<uint8_t>(below);
  return static_cast<uint8_t>(below % 2 == 0 ? below : lo);
}

// Index of the code nearest to x in a sorted 256-entry map (a tie goes to the even index, as bitsandbytes'
// binary search decides); x beyond the ends maps to the first or last code. The lower bound (the first code
// >= x) is found without branches - eight selects, where a branching search mispredicted about half of its
// eight branches (the moments are noise to a predictor): the 8-bit step's cost on the CPU. A NaN compares
// false throughout and lands on code 0, as the branching search did.
TR_HD uint8_t quantize_code(const float* code, float x) {
  int base = 0;
  for (int n = 256; n > 1;) {
    const int half = n / 2;
    base = code[base + half] < x ? base + half : base;
    n -= half;
  }
  return code_from_bound(code, x, base + (code[base] < x ? 1 : 0));
}

// The updated moments of one element from its codes (bitsandbytes skips a non-finite gradient: its moments
// restart from zero and its parameter stays).
// Selects, not branches: the CPU's loops vectorize.
TR_HD void adam8bit_moments(float g, uint8_t c1, uint8_t c2, float absmax1, float absmax2, const float* qs,
                            const float* qu, const Adam8bitConsts& k, float& s1, float& s2) {
  const bool finite = finite_f32(g);
  const float v2 = (qu[c2] * absmax2) * k.b2 + k.one_b2 * g * g;
  const float v1 = (qs[c1] * absmax1) * k.b1 + k.one_b1 * g;
  s2 = finite ? v2 : 0.0f;
  s1 = finite ? v1 : 0.0f;
}

// AdEMAMix's slow EMA from its code (on the signed map, its own absmax), as the kernel updates it after m1.
TR_HD float ademamix8bit_m2(float g, uint8_t c3, float absmax3, const float* qs, const Adam8bitConsts& k) {
  const float s3 = (qs[c3] * absmax3) * k.b3 + k.one_b3 * g;
  return finite_f32(g) ? s3 : 0.0f;
}

// AdEMAMix's parameter step: p - lr * (m1 / c1 + alpha * m2) / (sqrt(nu) / c2 + eps), then the decay.
TR_HD void ademamix_param(float& p, float s1, float s2, float s3, const Adam8bitConsts& k) {
  p = p - k.lr * (((s1 / k.c1) + (k.alpha * s3)) / ((square_root(s2) / k.c2) + k.eps));
  p = k.decays ? p * k.decay : p;  // a select, not a branch: the CPU's loop vectorizes
}

// s3: AdEMAMix's slow EMA (unused by AdamW). A non-finite gradient leaves the parameter.
TR_HD void adam8bit_param(float& p, float g, float s1, float s2, float s3, const Adam8bitConsts& k) {
  float q = p;
  if (k.ademamix) {
    ademamix_param(q, s1, s2, s3, k);
  } else {
    q = q + k.step_size * (s1 / (square_root(s2) + k.eps_c2));
    q = k.decays ? q * k.decay : q;
  }
  p = finite_f32(g) ? q : p;
}

// quantize_code as a callable (the CPU passes its table lookup instead, CodeTable: the same codes).
struct CodeSearch {
  const float* code;
  TR_HD uint8_t operator()(float x) const { return quantize_code(code, x); }
};

// New codes for the moments, given the block's absmax (an all-zero block quantizes against 1: the codes of
// 0). m keeps its sign: a value that rounded to a code of the other sign (or to +0) moves one code outwards.
// `nearest`: quantize_code on the signed map qs, or what gives its codes.
template <typename Nearest>
TR_HD uint8_t signed_code_by(const Nearest& nearest, float s1, float max1, const float* qs) {
  uint8_t q1 = nearest(s1 / (max1 > 0 ? max1 : 1.0f));
  if (sign_bit(qs[q1]) != sign_bit(s1)) q1 = static_cast<uint8_t>(s1 > 0.0f ? q1 + 1 : q1 - 1);
  return q1;
}

TR_HD uint8_t signed_code(float s1, float max1, const float* qs) {
  return signed_code_by(CodeSearch{qs}, s1, max1, qs);
}

TR_HD void adam8bit_codes(float s1, float s2, float max1, float max2, const float* qs, const float* qu,
                          uint8_t& c1, uint8_t& c2) {
  c1 = signed_code(s1, max1, qs);
  c2 = quantize_code(qu, s2 / (max2 > 0 ? max2 : 1.0f));
}

// bitsandbytes' 32-bit Adam element (the tensors that keep 32-bit state; no skipping of non-finite grads).
TR_HD void adam32_element(float& p, float g, float& s1, float& s2, const Adam8bitConsts& k) {
  s1 = s1 * k.b1 + k.one_b1 * g;
  // (AdamW's source squares the gradient first, AdEMAMix's scales it first: one rounding apart.)
  s2 = s2 * k.b2 + k.one_b2 * (g * g);
  p = p + k.step_size * (s1 / (square_root(s2) + k.eps_c2));
  if (k.decays) p = p * k.decay;
}

// bitsandbytes' 32-bit AdEMAMix element (its kernel skips nothing): m1, m2, nu, then the parameter.
TR_HD void ademamix32_element(float& p, float g, float& s1, float& s2, float& s3, const Adam8bitConsts& k) {
  s1 = s1 * k.b1 + k.one_b1 * g;
  s3 = s3 * k.b3 + k.one_b3 * g;
  s2 = s2 * k.b2 + k.one_b2 * g * g;
  ademamix_param(p, s1, s2, s3, k);
}

// bitsandbytes' blockwise 8-bit one-state kernel (kOptimizerStatic8bit1StateBlockwise) for Lion and RMSprop
// (lion_8bit, paged_lion_8bit, rmsprop_bnb_8bit): the state dequantized from its code on the signed map and
// its block's absmax, updated in f32 (every op rounded, as the source reads; no skipping of non-finite
// gradients in this kernel), the block's new absmax, the parameter, the new code (signed_code). Phase 1: the
// weight decay and the state; `upd` keeps Lion's step (lr * sign) for phase 2.
template <ElementwiseRule R>
TR_HD void state8bit_update(float& p, float g, float& s1, float& upd, const ElementwiseScalars<float>& c) {
  float gv = g;
  if (c.decays) {
    if constexpr (R == ElementwiseRule::lion)
      p = p * c.decay;  // decoupled
    else
      gv = gv + p * c.wd;  // coupled, into the state only (phase 2 reads the raw gradient, as bitsandbytes)
  }
  if constexpr (R == ElementwiseRule::lion) {
    upd = c.lr * sign_of(s1 * c.b1 + c.one_b1 * gv);
    s1 = s1 * c.b2 + c.one_b2 * gv;
  } else {
    s1 = s1 * c.b1 + c.one_b1 * (gv * gv);
  }
}

// Phase 2, after the block's absmax. bitsandbytes' 8-bit RMSprop divides the gradient without its decay term
// here (its 32-bit kernel divides the decayed one): kept, so a decayed run gives its bits.
template <ElementwiseRule R>
TR_HD void state8bit_param(float& p, float g, float s1, float upd, const ElementwiseScalars<float>& c) {
  if constexpr (R == ElementwiseRule::lion)
    p = p - upd;
  else
    p = p - c.lr * (g / (square_root(s1) + c.eps));
}

}  // namespace tr::backend
