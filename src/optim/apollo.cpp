// APOLLO's parts of the low-rank optimizer (galore.h): the random bases apollo_torch draws, and its update -
// the full-rank gradient scaled by the low-rank AdamW update's norm over the projected gradient's, under the
// norm-growth limiter. As apollo_torch 1.0's APOLLOAdamW.step, in tensor ops (any device).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/ops.h"
#include "optim/galore.h"
#include "optim/torch_cpu_rng.h"

namespace tr::optim {

// GradientProjector.get_orthogonal_matrix: stable_randn(shape, seed) / sqrt(rank) - [rank, n] on the right,
// [m, rank] on the left - then the seed advanced by next_seed. Drawn on the host (torch's CPU generator) and
// written into the basis, so a step allocates nothing for it on the CPU.
void GaLore::random_basis(Slot& s) {
  Tensor& b = s.ortho;
  if (!b.device().is_meta()) {
    std::vector<float> v = detail::TorchCpuGenerator(s.seed).randn(b.numel());
    const float root = static_cast<float>(std::sqrt(static_cast<double>(rank_)));
    for (float& x : v) x /= root;
    if (b.device().is_cpu())
      std::copy(v.begin(), v.end(), b.data<float>());
    else
      ops::copy_(b, ops::from_vector<float>(v, b.shape(), Device::cpu()));
  }
  s.seed = detail::apollo_next_seed(s.seed);
  s.has_basis = true;
}

// `low` holds the projected gradient R and the stand-in the inner AdamW's update of it from zero at rate 1
// (make_inner), -c * m / (sqrt(v) + eps) with c = sqrt(1 - b2^t) / (1 - b1^t) > 0, so the norms of
// m / (sqrt(v) + eps) are the stand-in's over c - also at a learning rate of 0 (a warm-up's first step),
// where the limiter still takes the step's norm. Everything runs in place in buffers made with the optimizer
// (the gradient, dropped after the step, is scaled where it is; its norm is taken without a copy), so a step
// allocates nothing: under torch_compile the replayed step stays within eager's memory.
void GaLore::apollo_update(Slot& s, const Tensor& g, const Tensor& low) const {
  using backend::BinaryOp;
  using backend::ReduceOp;
  using backend::UnaryOp;
  Tensor& p = *s.param;
  const Tensor& t0 = apollo_scalars_[0];  // 0-d f32 scratch: ||scaled||, a constant, the limiter, the rate
  const Tensor& t1 = apollo_scalars_[1];
  const Tensor& t2 = apollo_scalars_[2];
  const auto set = [](const Tensor& t, double v) {
    ops::fill_(t, v);
    return t;
  };
  const double t = static_cast<double>(low_->step_count());
  const double b1 = opts_.beta1, b2 = opts_.beta2;
  const double unit = 1.0 * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));
  const double step_size = opts_.lr * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));
  const int64_t m = p.shape()[0], n = p.shape()[1];
  const int64_t norm_dim = m < n ? 0 : 1;  // apollo_torch's: the low-rank side
  const std::vector<int64_t> dims = channel_ ? std::vector<int64_t>{norm_dim} : std::vector<int64_t>{};
  const int64_t k = channel_ ? (norm_dim == 0 ? n : m) : 1;
  // out = ||x|| over `dims` (all when empty), the squares in the square scratch
  const auto norm_into = [&](const Tensor& x, const Tensor& out) {
    const Tensor sq = ops::view(ops::narrow(square_scratch_, 0, 0, x.numel()), x.shape());
    ops::copy_(sq, x);
    ops::binary_(BinaryOp::mul, sq, sq);
    ops::reduce_into(ReduceOp::sum, sq, dims, out);
    ops::unary_(UnaryOp::sqrt, out);
  };
  // grad_scaling_factor = ||norm_grad|| / (||R|| + 1e-8), per channel (a row factor for a tall weight)
  const Tensor num = ops::narrow(apollo_channels_, 0, 0, k), den = ops::narrow(apollo_channels_, 0, k, k);
  norm_into(s.buffer, num);
  ops::binary_(BinaryOp::mul, num, set(t0, 1.0 / unit));
  norm_into(low, den);
  ops::binary_(BinaryOp::add, den, set(t0, 1e-8));
  ops::binary_(BinaryOp::div, num, den);
  const Tensor factor = channel_ && norm_dim == 1 ? ops::view(num, {m, 1}) : num;
  ops::binary_(BinaryOp::mul, g, factor);  // scaled_grad = p.grad * grad_scaling_factor, in place
  ops::grad_stats_into(g, grad_stats_);    // ||scaled_grad||^2 in f64, without a copy
  ops::copy_(t0, ops::view(ops::narrow(grad_stats_, 0, 0, 1), {}));
  ops::unary_(UnaryOp::sqrt, t0);  // ||scaled_grad||
  // norm_grad *= sqrt(scale); p.add_(norm_grad, alpha=-step_size), as one rate t1
  set(t1, -step_size * std::sqrt(scale_));
  if (s.has_norm) {
    // limiter = max(||scaled|| / (last + 1e-8), 1.01) / 1.01; scaled /= limiter; last = ||scaled|| / limiter.
    // As max(ratio / 1.01, 1): exactly 1 when the norm grew less than 1.01x (Python's 1.01 / 1.01).
    ops::binary_(BinaryOp::add, s.last_norm, set(t2, 1e-8));
    ops::copy_(t2, t0);
    ops::binary_(BinaryOp::div, t2, s.last_norm);  // ratio
    ops::binary_(BinaryOp::div, t2, set(s.last_norm, 1.01));
    ops::binary_(BinaryOp::maximum, t2, set(s.last_norm, 1.0));  // the limiter
    ops::copy_(s.last_norm, t0);
    ops::binary_(BinaryOp::div, s.last_norm, t2);
    ops::binary_(BinaryOp::div, t1, t2);
  } else {
    ops::copy_(s.last_norm, t0);
  }
  ops::binary_(BinaryOp::mul, g, t1);
  ops::binary_(BinaryOp::add, p, g);
  s.has_norm = true;
}

}  // namespace tr::optim
