// AdamW step in the operation order of torch.optim.AdamW (CPU, f32/f64), per tensor or as one multi-tensor
// pass.
#include "optim/adamw.h"

#include <cmath>

#include "optim/common.h"

namespace tr::optim {

AdamW::AdamW(const nn::ParamList& params, AdamWOptions opts, bool multi_tensor)
    : Optimizer(params, std::move(opts)), multi_tensor_(multi_tensor) {
  detail::check_params("AdamW", params, {DType::f32, DType::f64});
  detail::OptimArgs("AdamW", opts_.args).check_all_used();  // AdamW reads no --optim_args
  for (const auto& [name, p] : params)
    slots_.push_back(
        {name, p, ops::zeros(p->shape(), p->dtype()), ops::zeros(p->shape(), p->dtype()), decays(name)});
}

namespace {

constexpr int64_t kChunk = 1 << 16;  // elements per work item (apex's multi_tensor_apply uses the same)

// Per-step scalars in the parameter's precision, computed as torch computes them (in double, then cast).
template <typename T>
struct AdamWScalars {
  T step_size, bc2_sqrt, decay, b1, b2, one_b1, one_b2, eps;
  bool decays;
  AdamWScalars(double lr, double wd, double beta1, double beta2, double e, int64_t step) {
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
    step_size = static_cast<T>(lr / bc1);
    bc2_sqrt = static_cast<T>(std::sqrt(bc2));
    decay = static_cast<T>(1.0 - lr * wd);
    b1 = static_cast<T>(beta1);
    b2 = static_cast<T>(beta2);
    one_b1 = static_cast<T>(1.0 - beta1);
    one_b2 = static_cast<T>(1.0 - beta2);
    eps = static_cast<T>(e);
    decays = wd != 0.0;
  }
};

// Elements [0, n). torch's ops, one rounding each except where its CPU kernels fuse: add_(x, alpha) and
// addcmul_ are fused multiply-adds there, so they are std::fma here (this library builds with
// -ffp-contract=off, so nothing else fuses and the vector and scalar code paths agree bit for bit).
template <typename T>
inline void adamw_elements(T* p, const T* g, T* m, T* v, int64_t n, const AdamWScalars<T>& s) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    if (s.decays) p[i] *= s.decay;                         // param.mul_(1 - lr * wd)
    m[i] = std::fma(g[i], s.one_b1, m[i] * s.b1);          // exp_avg.mul_(b1).add_(grad, alpha=1-b1)
    v[i] = std::fma(s.one_b2 * g[i], g[i], v[i] * s.b2);   // exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2)
    const T denom = std::sqrt(v[i]) / s.bc2_sqrt + s.eps;  // (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
    p[i] += -s.step_size * m[i] / denom;                   // param.addcdiv_(exp_avg, denom, -step_size)
  }
}

// The per-tensor path: the tensor's elements split over threads when it is large.
template <typename T>
void adamw_tensor(T* p, const T* g, T* m, T* v, int64_t n, const AdamWScalars<T>& s) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kChunk;
    adamw_elements(p + b, g + b, m + b, v + b, std::min(kChunk, n - b), s);
  }
}

}  // namespace

void AdamW::step() {
  ++step_;
  // Gradients checked and made contiguous up front: the multi-tensor pass reads them all inside one parallel
  // region, where nothing may throw.
  std::vector<Tensor> grads(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i)
    grads[i] = detail::gradient("AdamW", slots_[i].name, *slots_[i].param);
  const double wd = opts_.weight_decay;
  const AdamWScalars<float> f_decay(opts_.lr, wd, opts_.beta1, opts_.beta2, opts_.eps, step_),
      f_plain(opts_.lr, 0.0, opts_.beta1, opts_.beta2, opts_.eps, step_);
  const AdamWScalars<double> d_decay(opts_.lr, wd, opts_.beta1, opts_.beta2, opts_.eps, step_),
      d_plain(opts_.lr, 0.0, opts_.beta1, opts_.beta2, opts_.eps, step_);
  // Elements [begin, begin + n) of slot i, as one chunk (multi-tensor) or as the whole tensor.
  auto run = [&](size_t i, int64_t begin, int64_t n, bool whole_tensor) {
    Slot& s = slots_[i];
    if (s.param->dtype() == DType::f32) {
      auto* f = whole_tensor ? &adamw_tensor<float> : &adamw_elements<float>;
      f(s.param->data<float>() + begin, grads[i].data<float>() + begin, s.exp_avg.data<float>() + begin,
        s.exp_avg_sq.data<float>() + begin, n, s.decay ? f_decay : f_plain);
    } else {
      auto* f = whole_tensor ? &adamw_tensor<double> : &adamw_elements<double>;
      f(s.param->data<double>() + begin, grads[i].data<double>() + begin, s.exp_avg.data<double>() + begin,
        s.exp_avg_sq.data<double>() + begin, n, s.decay ? d_decay : d_plain);
    }
  };
  if (!multi_tensor_) {
    for (size_t i = 0; i < slots_.size(); ++i)
      if (grads[i].defined()) run(i, 0, slots_[i].param->numel(), true);  // no gradient: skipped, as torch
    return;
  }
  // The flat work list of (tensor, chunk) pairs over all parameters, as multi_tensor_apply builds it; the
  // chunks are those of the per-tensor path, so even the vector/remainder split of the loops is the same.
  struct Work {
    size_t slot;
    int64_t begin, n;
  };
  std::vector<Work> work;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!grads[i].defined()) continue;
    const int64_t n = slots_[i].param->numel();
    for (int64_t b = 0; b < n; b += kChunk) work.push_back({i, b, std::min(kChunk, n - b)});
  }
  const int64_t total = static_cast<int64_t>(work.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t w = 0; w < total; ++w) run(work[w].slot, work[w].begin, work[w].n, false);
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(step_)}};
  for (const auto& s : slots_) {
    out.emplace_back("exp_avg." + s.name, s.exp_avg);
    out.emplace_back("exp_avg_sq." + s.name, s.exp_avg_sq);
  }
  return out;
}

void AdamW::load_state_dict(const std::map<std::string, Tensor>& state) {
  const int64_t step = detail::load_step(state, "AdamW");
  for (auto& s : slots_) {
    detail::load_entry(state, "exp_avg." + s.name, s.exp_avg, "AdamW");
    detail::load_entry(state, "exp_avg_sq." + s.name, s.exp_avg_sq, "AdamW");
  }
  step_ = step;
}

}  // namespace tr::optim
