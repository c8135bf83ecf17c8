// The AdamW element update shared by the CPU optimizer, the CPU multi-tensor pass and the CUDA fused kernel:
// torch.optim.AdamW's operation order, one rounding per op except where torch's kernels fuse (add_ with
// alpha and addcmul_ are fused multiply-adds), so every implementation gives the same bits.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace tr::backend {

// Per-step scalars in the parameter's precision, computed as torch computes them (in double, then cast).
template <typename T>
struct AdamWScalars {
  T step_size, bc2_sqrt, decay, b1, b2, one_b1, one_b2, eps;
  AdamWScalars() = default;
  AdamWScalars(double lr, double wd, double beta1, double beta2, double e, int64_t step) {
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
    step_size = static_cast<T>(lr / bc1);
    bc2_sqrt = static_cast<T>(std::sqrt(bc2));
    decay = wd == 0.0 ? T(1) : static_cast<T>(1.0 - lr * wd);  // exactly 1 without decay, even for lr = inf
    b1 = static_cast<T>(beta1);
    b2 = static_cast<T>(beta2);
    one_b1 = static_cast<T>(1.0 - beta1);
    one_b2 = static_cast<T>(1.0 - beta2);
    eps = static_cast<T>(e);
  }
};

template <typename T>
TR_HD T fused_multiply_add(T a, T b, T c) {
#ifdef __CUDA_ARCH__
  return fma(a, b, c);  // the device's float/double overloads
#else
  return std::fma(a, b, c);
#endif
}

template <typename T>
TR_HD T square_root(T x) {
#ifdef __CUDA_ARCH__
  return sqrt(x);
#else
  return std::sqrt(x);  // the float overload: no detour through double
#endif
}

template <typename T>
TR_HD void adamw_element(T& p, T g, T& m, T& v, const AdamWScalars<T>& s) {
  p *= s.decay;  // param.mul_(1 - lr * wd); decay is exactly 1 without weight decay (branch-free: vectorizes)
  m = fused_multiply_add(g, s.one_b1, m * s.b1);        // exp_avg.mul_(b1).add_(grad, alpha=1-b1)
  v = fused_multiply_add(s.one_b2 * g, g, v * s.b2);    // exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2)
  const T denom = square_root(v) / s.bc2_sqrt + s.eps;  // (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
  p += -s.step_size * m / denom;                        // param.addcdiv_(exp_avg, denom, -step_size)
}

// Backend::GradTransform in the parameter's precision: the loss-scale inverse and torch's clip_grad_norm_
// coefficient max_norm / (norm + 1e-6), applied only when below 1, from the f64 sum of squares of grad_stats.
template <typename T>
struct GradScaling {
  T inv = T(1), coef = T(1);
  bool clip = false;
};

template <typename T>
TR_HD GradScaling<T> grad_scaling(double inv_scale, double max_norm, const double* stats) {
  GradScaling<T> s;
  s.inv = static_cast<T>(inv_scale);
  if (max_norm > 0 && stats != nullptr) {
    const double c = max_norm / (square_root(stats[0]) + 1e-6);
    if (c < 1.0) {
      s.coef = static_cast<T>(c);
      s.clip = true;
    }
  }
  return s;
}

// g * inv, then * coef: two roundings, as unscale_ and clip_grad_norm_ write the gradient twice.
template <typename T>
TR_HD T scaled_grad(T g, const GradScaling<T>& s) {
  g = g * s.inv;
  return g * s.coef;  // coef is exactly 1 unless clipping: the same bits, and no branch in the element loop
}

// torch.optim.SGD's single-tensor update of one element, in its operation order; its add_(x, alpha) is a
// fused multiply-add on torch's CPU kernels. `buf`: the momentum buffer's element (null: no momentum).
template <typename T>
struct SgdScalars {
  T wd, momentum, one_damp, neg_lr;
  bool decay, nesterov, first;  // decay: wd != 0; first: the buffer starts as this step's d_p
  SgdScalars() = default;
  SgdScalars(double lr, double weight_decay, double mom, double dampening, bool nest, bool is_first)
      : wd(static_cast<T>(weight_decay)),
        momentum(static_cast<T>(mom)),
        one_damp(static_cast<T>(1.0 - dampening)),
        neg_lr(static_cast<T>(-lr)),
        decay(weight_decay != 0),
        nesterov(nest),
        first(is_first) {}
};

template <typename T>
TR_HD void sgd_element(T& p, T g, T* buf, const SgdScalars<T>& c) {
  T d = c.decay ? fused_multiply_add(p, c.wd, g) : g;  // d_p = grad.add(param, alpha=wd)
  if (buf != nullptr) {
    *buf =
        c.first ? d : fused_multiply_add(d, c.one_damp, *buf * c.momentum);  // buf.mul_(m).add_(d_p, 1-damp)
    d = c.nesterov ? fused_multiply_add(*buf, c.momentum, d) : *buf;         // d_p.add(buf, alpha=m), or buf
  }
  p = fused_multiply_add(d, c.neg_lr, p);  // param.add_(d_p, alpha=-lr)
}

// torchdistx's AnyPrecisionAdamW (HF's adamw_anyprecision): the parameter, momentum, variance and Kahan
// compensation each in its own dtype, every torch op of its step computed in f32 and rounded to the dtype of
// the tensor it writes (`round(x, k)`: k 0 parameter, 1 momentum, 2 variance, 3 compensation). Its bias
// corrections are f32 tensor arithmetic (torch's pow, rsub, reciprocal-times-lr and sqrt on a 0-dim f32
// step), computed by AnyPrecisionScalars as torch does; scalar operands rounded as torch rounds them (below).
struct AnyPrecisionScalars {
  float decay, b1, b2, one_b1, one_b2, eps, neg_step_size, denom_correction;
  bool has_decay;
  AnyPrecisionScalars() = default;
  AnyPrecisionScalars(double lr, double wd, double beta1, double beta2, double e, int64_t step)
      : decay(static_cast<float>(1.0 - lr * wd)),
        b1(static_cast<float>(beta1)),
        b2(static_cast<float>(beta2)),
        one_b1(static_cast<float>(1.0 - beta1)),
        one_b2(static_cast<float>(1.0 - beta2)),
        eps(static_cast<float>(e)),
        has_decay(wd != 0.0) {
    const float t = static_cast<float>(step);  // state["step"], an f32 tensor counting up
    const float bc1 = 1.0f - std::pow(static_cast<float>(beta1), t);
    neg_step_size = -((1.0f / bc1) * static_cast<float>(lr));  // lr / bc1 is reciprocal(bc1) * lr
    denom_correction = std::sqrt(1.0f - std::pow(static_cast<float>(beta2), t));  // (...) ** 0.5: sqrt
  }
};

template <typename Round>
TR_HD void anyprecision_element(float& p, float g, float& m, float& v, float* c, const AnyPrecisionScalars& s,
                                Round round) {
  // A Python scalar operand (mul_'s factor, add_'s alpha and other) and a 0-dim f32 divisor take the op's
  // dtype, as torch casts them; addcmul_'s and addcdiv_'s value stay f32 (probed: torch 1.13, bf16 CPU).
  if (s.has_decay) p = round(p * round(s.decay, 0), 0);  // p.mul_(1 - lr * wd): 1 in bf16 for small lr * wd
  m = round(fused_multiply_add(g, round(s.one_b1, 1), round(m * round(s.b1, 1), 1)),
            1);  // .mul_(b1).add_(g, 1-b1)
  v = round(fused_multiply_add(s.one_b2 * g, g, round(v * round(s.b2, 2), 2)),
            2);  // .mul_(b2).addcmul_(g, g, 1-b2)
  const float cv =
      round(round(round(square_root(v), 2) / round(s.denom_correction, 2), 2) + round(s.eps, 2), 2);
  if (c == nullptr) {
    p = round(p + s.neg_step_size * m / cv, 0);  // p.addcdiv_(exp_avg, centered_variance, -step_size)
    return;
  }
  *c = round(*c + s.neg_step_size * m / cv, 3);  // compensation.addcdiv_(...)
  const float before = p;
  p = round(p + *c, 0);                      // p.add_(compensation)
  *c = round(*c + round(before - p, 0), 3);  // compensation.add_(temp.sub_(p))
}

// The element-wise optimizers with one or two state tensors per parameter, one rule each: torch.optim.Adagrad
// and torch.optim.RMSprop (single-tensor formulas, torch's fused multiply-adds as in sgd_element), and
// bitsandbytes' 32-bit Lion and RMSprop kernels (kOptimizer32bit1State: f32, every op rounded, as their
// source reads; bitsandbytes divides with __fdividef, within 2 ulp of the division here), and schedulefree's
// AdamW / RAdam (schedule_free_adam) and SGD steps and the train/eval switch between its two points
// (schedule_free_lerp), in the order of their torch._foreach_ ops.
enum class ElementwiseRule : uint8_t {
  adagrad,
  rmsprop,
  lion,
  rmsprop_bnb,
  schedule_free_adam,
  schedule_free_sgd,
  schedule_free_lerp,
  stable_adamw_moments,
  stable_adamw_param,
  galore_adamw,
  grok_ema,
  grokadamw
};

// The step's hyper-parameters. adagrad: lr_decay, eps, step; rmsprop: alpha (beta1), eps, momentum; lion:
// beta1, beta2; rmsprop_bnb: alpha (beta1), eps. Schedule-free (its per-step scalars, computed in double by
// optim/schedule_free.cpp as its Python does): lr (z's step), beta2, eps, bias_correction2, ckp1 (y's lerp
// weight toward z), y_lr (y's step), normalize (adam: divide by the second moment; RAdam's first steps do
// not); schedule_free_lerp: the parameter lerped toward state1 by ckp1 alone (no gradient is read).
// galore_adamw (galore_torch's AdamW, transformers' former AdamW): beta1, beta2, eps, lr the step size
// lr * sqrt(1 - beta2^t) / (1 - beta1^t), decay_factor the decay's alpha -lr * weight_decay (applied after
// the update). GrokAdamW (grokadamw 0.1's published step) in two passes: grok_ema (state1, the gradient's
// EMA, decayed by beta1 = alpha; the "parameter" it writes is grad + momentum * EMA - lamb's amplified
// gradient, into the gradient's own buffer), then grokadamw (AdamW's moments at the tensor's beta1, the
// parameter scaled by decay_factor = 1 - lr * weight_decay, then moved by lr = the step size).
struct ElementwiseHyper {
  ElementwiseRule rule = ElementwiseRule::adagrad;
  double lr = 1e-2, beta1 = 0.0, beta2 = 0.0, eps = 1e-10, momentum = 0.0, lr_decay = 0.0;
  int64_t step = 1;
  double bias_correction2 = 1.0, ckp1 = 0.0, y_lr = 0.0;
  bool normalize = true;
  // optimi's StableAdamW, two passes around the per-tensor RMS: stable_adamw_moments (exp_avg lerped toward
  // the gradient by ckp1 = 1 - beta1_hat, exp_avg_sq by beta2 = beta2_hat; the "parameter" it writes is the
  // RMS term grad^2 / max(exp_avg_sq, eps), eps here being optimi's eps^2 - the gradient's own buffer, so no
  // temporary), then stable_adamw_param at the tensor's stabilized rate lr, its decay the factor
  // decay_factor (no gradient read).
  double decay_factor = 1.0;
};

// What a rule reads: the two that move parameters by state alone take no gradient; the two-moment rules need
// state2. (The backends' operand checks and the ops layer's ask here.)
constexpr bool reads_gradient(ElementwiseRule r) {
  return r != ElementwiseRule::schedule_free_lerp && r != ElementwiseRule::stable_adamw_param;
}
constexpr bool needs_state2(ElementwiseRule r) {
  return r == ElementwiseRule::schedule_free_adam || r == ElementwiseRule::stable_adamw_moments ||
         r == ElementwiseRule::stable_adamw_param || r == ElementwiseRule::galore_adamw ||
         r == ElementwiseRule::grokadamw;
}

template <typename T>
struct ElementwiseScalars {
  T wd = 0, neg_lr = 0, lr = 0, b1 = 0, one_b1 = 0, b2 = 0, one_b2 = 0, eps = 0, momentum = 0, decay = 1;
  T bc2 = 1, ckp1 = 0, y_lr = 0;
  T decay_on = 0, normalize_on = 1;  // schedule-free's switches as numbers: a bool member read in a loop
                                     // has no vector type (GCC then leaves the loop scalar)
  bool decays = false, normalize = true;
  ElementwiseScalars() = default;
  ElementwiseScalars(const ElementwiseHyper& h, double weight_decay) : decays(weight_decay > 0) {
    wd = static_cast<T>(weight_decay);
    eps = static_cast<T>(h.eps);
    const bool python_scalars =  // schedulefree's and optimi's: torch's Python scalars, each cast once
        h.rule == ElementwiseRule::schedule_free_adam || h.rule == ElementwiseRule::schedule_free_sgd ||
        h.rule == ElementwiseRule::schedule_free_lerp || h.rule == ElementwiseRule::stable_adamw_moments ||
        h.rule == ElementwiseRule::stable_adamw_param || h.rule == ElementwiseRule::galore_adamw ||
        h.rule == ElementwiseRule::grok_ema || h.rule == ElementwiseRule::grokadamw;
    if (python_scalars) {
      b1 = static_cast<T>(h.beta1);
      one_b1 = static_cast<T>(1.0 - h.beta1);
      momentum = static_cast<T>(h.momentum);
      decays = weight_decay != 0;  // both: `if weight_decay != 0`
      decay = static_cast<T>(h.decay_factor);
      neg_lr = static_cast<T>(-h.lr);
      b2 = static_cast<T>(h.beta2);
      one_b2 = static_cast<T>(1.0 - h.beta2);
      bc2 = static_cast<T>(h.bias_correction2);
      ckp1 = static_cast<T>(h.ckp1);
      y_lr = static_cast<T>(h.y_lr);
      normalize = h.normalize;
      decay_on = decays ? T(1) : T(0);
      normalize_on = normalize ? T(1) : T(0);
    } else if (h.rule == ElementwiseRule::adagrad) {
      // clr = lr / (1 + (step - 1) * lr_decay), in Python's double
      neg_lr = static_cast<T>(-(h.lr / (1.0 + static_cast<double>(h.step - 1) * h.lr_decay)));
    } else if (h.rule == ElementwiseRule::rmsprop) {
      neg_lr = static_cast<T>(-h.lr);
      b1 = static_cast<T>(h.beta1);
      one_b1 = static_cast<T>(1.0 - h.beta1);
      momentum = static_cast<T>(h.momentum);
    } else {  // bitsandbytes: the arguments arrive as f32, and the kernel's own arithmetic is in f32
      lr = static_cast<T>(static_cast<float>(h.lr));
      b1 = static_cast<T>(static_cast<float>(h.beta1));
      b2 = static_cast<T>(static_cast<float>(h.beta2));
      one_b1 = T(1) - b1;
      one_b2 = T(1) - b2;
      decay = T(1) - lr * wd;
    }
  }
};

// bitsandbytes' sgn: -1, 0 or 1.
template <typename T>
TR_HD T sign_of(T x) {
  return static_cast<T>((T(0) < x) - (x < T(0)));
}

// torch.lerp(start, end, w) with a scalar weight, as ATen computes it (the vectorized CPU kernel and the
// contracted scalar one): from the nearer end, one fused multiply-add.
// Both forms computed and one selected (a branch here, uniform as it is, keeps the CPU loops scalar).
template <typename T>
TR_HD T lerp_toward(T start, T end, T w) {
  const T diff = end - start;
  const T from_start = fused_multiply_add(w, diff, start), from_end = fused_multiply_add(w - T(1), diff, end);
  return ((w < T(0.5)) & (w > T(-0.5))) ? from_start : from_end;
}

// One element's update under rule R; s2: rmsprop's momentum buffer (null: none), schedule_free_adam's
// exp_avg_sq; s1: schedule-free's z.
template <ElementwiseRule R, typename T>
TR_HD void elementwise_update(T& p, T g, T& s1, T* s2, const ElementwiseScalars<T>& c) {
  if constexpr (R == ElementwiseRule::schedule_free_adam || R == ElementwiseRule::schedule_free_sgd) {
    T d = g;  // (selects, not branches: the CPU loops vectorize)
    if constexpr (R == ElementwiseRule::schedule_free_adam) {
      *s2 = fused_multiply_add(c.one_b2 * g, g, *s2 * c.b2);  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2)
      const T normalized = g / (square_root(*s2 / c.bc2) + c.eps);  // grad.div_(sqrt(v / bc2) + eps)
      d = c.normalize_on != T(0) ? normalized : g;
    }
    const T decayed = fused_multiply_add(p, c.wd, d);  // grad.add_(y, alpha=decay): decay at y
    d = c.decay_on != T(0) ? decayed : d;
    p = lerp_toward(p, s1, c.ckp1);            // y.lerp_(z, ckp1)
    p = fused_multiply_add(d, c.y_lr, p);      // y.add_(grad, alpha=lr * (beta1 * (1 - ckp1) - 1))
    s1 = fused_multiply_add(d, c.neg_lr, s1);  // z.sub_(grad, alpha=lr)
  } else if constexpr (R == ElementwiseRule::stable_adamw_moments) {
    s1 = lerp_toward(s1, g, c.ckp1);                        // exp_avg.lerp_(grad, weight=beta1_comp)
    *s2 = fused_multiply_add(c.one_b2 * g, g, *s2 * c.b2);  // exp_avg_sq.mul_(b2_hat).addcmul_(g, g, b2_comp)
    const T v = *s2;
    p = g * g / (((v > c.eps) | (v != v)) ? v : c.eps);  // grad.pow(2).div_(exp_avg_sq.maximum(eps_sq))
  } else if constexpr (R == ElementwiseRule::stable_adamw_param) {
    const T decayed = p * c.decay;  // param.mul_(1 - lr * weight_decay)
    p = c.decay_on != T(0) ? decayed : p;
    p = p + c.neg_lr * s1 / (square_root(*s2) + c.eps);  // param.addcdiv_(exp_avg, sqrt(v) + eps, value=-lr)
  } else if constexpr (R == ElementwiseRule::galore_adamw) {
    s1 = fused_multiply_add(g, c.one_b1, s1 * c.b1);        // exp_avg.mul_(b1).add_(grad, alpha=1-b1)
    *s2 = fused_multiply_add(c.one_b2 * g, g, *s2 * c.b2);  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2)
    p = fused_multiply_add(s1 / (square_root(*s2) + c.eps), c.neg_lr, p);  // p.add_(m / denom, -step_size)
    const T decayed = fused_multiply_add(p, c.decay, p);                   // p.add_(p, alpha=-lr * wd)
    p = c.decay_on != T(0) ? decayed : p;
  } else if constexpr (R == ElementwiseRule::grok_ema) {
    s1 = fused_multiply_add(g, c.one_b1, s1 * c.b1);  // grok_ema.mul_(alpha).add_(grad, alpha=1-alpha)
    p = g + c.momentum * s1;                          // grok_grad = grad + lamb * grok_ema
  } else if constexpr (R == ElementwiseRule::grokadamw) {
    s1 = fused_multiply_add(g, c.one_b1, s1 * c.b1);        // exp_avg.mul_(b1_i).add_(g, alpha=1-b1_i)
    *s2 = fused_multiply_add(c.one_b2 * g, g, *s2 * c.b2);  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2)
    p = p * c.decay;                                        // p.mul_(1 - lr * weight_decay)
    p = p + c.neg_lr * s1 / (square_root(*s2) + c.eps);     // p.addcdiv_(m, sqrt(v) + eps, -step_size)
  } else if constexpr (R == ElementwiseRule::schedule_free_lerp) {
    p = lerp_toward(p, s1, c.ckp1);  // eval: p.lerp_(z, 1 - 1/beta1); train: p.lerp_(z, 1 - beta1)
  } else if constexpr (R == ElementwiseRule::adagrad) {
    const T d = c.decays ? fused_multiply_add(p, c.wd, g) : g;  // grad.add(param, alpha=wd)
    s1 = fused_multiply_add(d, d, s1);                          // state_sum.addcmul_(grad, grad, value=1)
    const T std_dev = square_root(s1) + c.eps;                  // state_sum.sqrt().add_(eps)
    p = p + c.neg_lr * d / std_dev;                             // param.addcdiv_(grad, std, value=-clr)
  } else if constexpr (R == ElementwiseRule::rmsprop) {
    const T d = c.decays ? fused_multiply_add(p, c.wd, g) : g;
    s1 = fused_multiply_add(c.one_b1 * d, d, s1 * c.b1);  // square_avg.mul_(alpha).addcmul_(g, g, 1-alpha)
    const T avg = square_root(s1) + c.eps;                // square_avg.sqrt().add_(eps)
    if (s2 != nullptr) {
      *s2 = *s2 * c.momentum + d / avg;          // buf.mul_(momentum).addcdiv_(grad, avg)
      p = fused_multiply_add(*s2, c.neg_lr, p);  // param.add_(buf, alpha=-lr)
    } else {
      p = p + c.neg_lr * d / avg;  // param.addcdiv_(grad, avg, value=-lr)
    }
  } else if constexpr (R == ElementwiseRule::lion) {
    if (c.decays) p = p * c.decay;  // decoupled decay first: p * (1 - lr * wd)
    p = p - c.lr * sign_of(s1 * c.b1 + c.one_b1 * g);
    s1 = s1 * c.b2 + c.one_b2 * g;  // the momentum after the parameter, as Lion's paper
  } else {
    const T d = c.decays ? g + p * c.wd : g;  // coupled (L2) decay
    s1 = s1 * c.b1 + c.one_b1 * d * d;
    p = p - c.lr * (d / (square_root(s1) + c.eps));
  }
}

// Elements a multi-tensor pass processes per work item (apex's multi_tensor_apply uses the same).
constexpr int64_t kAdamWChunk = 1 << 16;

}  // namespace tr::backend
