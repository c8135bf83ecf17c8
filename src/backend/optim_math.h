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

// Elements a multi-tensor pass processes per work item (apex's multi_tensor_apply uses the same).
constexpr int64_t kAdamWChunk = 1 << 16;

}  // namespace tr::backend
