// APOLLO's parts of the low-rank optimizer (galore.h): the random bases apollo_torch draws, and its update -
// the full-rank gradient scaled by the low-rank AdamW update's norm over the projected gradient's, under the
// norm-growth limiter. As apollo_torch 1.0's APOLLOAdamW.step, in tensor ops (any device).
#include <cmath>

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
// where the limiter still takes the step's norm.
void GaLore::apollo_update(Slot& s, const Tensor& g, const Tensor& low) const {
  using backend::BinaryOp;
  using backend::ReduceOp;
  using backend::UnaryOp;
  Tensor& p = *s.param;
  const Device dev = p.device();
  auto scalar = [&](double v) { return ops::full({}, v, DType::f32, dev); };
  auto bin = [](BinaryOp op, const Tensor& a, const Tensor& b) { return ops::binary(op, a, b); };
  // ||x|| over `dims` (all when empty)
  auto norm = [&](const Tensor& x, std::vector<int64_t> dims) {
    return ops::unary(UnaryOp::sqrt, ops::reduce(ReduceOp::sum, bin(BinaryOp::mul, x, x), dims, false));
  };
  const double t = static_cast<double>(low_->step_count());
  const double b1 = opts_.beta1, b2 = opts_.beta2;
  const double unit = 1.0 * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));
  const double step_size = opts_.lr * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));
  const int64_t m = p.shape()[0], n = p.shape()[1];
  const int64_t norm_dim = m < n ? 0 : 1;  // apollo_torch's: the low-rank side
  const std::vector<int64_t> dims = channel_ ? std::vector<int64_t>{norm_dim} : std::vector<int64_t>{};
  // grad_scaling_factor = ||norm_grad|| / (||R|| + 1e-8), per channel (a row factor for a tall weight)
  Tensor factor = bin(BinaryOp::div, ops::affine(norm(s.buffer, dims), 1.0 / unit, 0.0),
                      ops::affine(norm(low, dims), 1.0, 1e-8));
  if (channel_ && norm_dim == 1) factor = ops::unsqueeze(factor, 1);
  Tensor scaled = bin(BinaryOp::mul, g, factor);  // p.grad * grad_scaling_factor
  const Tensor scaled_norm = norm(scaled, {});
  if (s.has_norm) {
    // limiter = max(||scaled|| / (last + 1e-8), 1.01) / 1.01; scaled /= limiter; last = ||scaled|| / limiter.
    // As max(ratio / 1.01, 1): exactly 1 when the norm grew less than 1.01x (Python's 1.01 / 1.01).
    const Tensor ratio = bin(BinaryOp::div, scaled_norm, ops::affine(s.last_norm, 1.0, 1e-8));
    const Tensor limiter = bin(BinaryOp::maximum, bin(BinaryOp::div, ratio, scalar(1.01)), scalar(1.0));
    scaled = bin(BinaryOp::div, scaled, limiter);
    ops::copy_(s.last_norm, bin(BinaryOp::div, scaled_norm, limiter));
  } else {
    ops::copy_(s.last_norm, scaled_norm);
  }
  // norm_grad = scaled * sqrt(scale); p.add_(norm_grad, alpha=-step_size)
  if (scale_ != 1.0) scaled = bin(BinaryOp::mul, scaled, scalar(std::sqrt(scale_)));
  ops::copy_(p, bin(BinaryOp::add, p, bin(BinaryOp::mul, scaled, scalar(-step_size))));
  s.has_norm = true;
}

}  // namespace tr::optim
