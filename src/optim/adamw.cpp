// AdamW step in the operation order of torch.optim.AdamW (CPU, f32/f64), per tensor or as one multi-tensor
// pass.
#include "optim/adamw.h"

#include "backend/backend.h"
#include "backend/optim_math.h"

#include <cmath>

#include "optim/common.h"

namespace tr::optim {

AdamW::AdamW(const nn::ParamList& params, AdamWOptions opts, bool multi_tensor)
    : Optimizer(params, std::move(opts)), multi_tensor_(multi_tensor) {
  detail::check_params("AdamW", params, {DType::f32, DType::f64}, /*any_device=*/true);
  detail::OptimArgs("AdamW", opts_.args).check_all_used();  // AdamW reads no --optim_args
  for (const auto& [name, p] : params)
    slots_.push_back({name, p, ops::zeros(p->shape(), p->dtype(), p->device()),
                      ops::zeros(p->shape(), p->dtype(), p->device()), decays(name)});
}

namespace {

constexpr int64_t kChunk = backend::kAdamWChunk;
using backend::AdamWScalars;

// Elements [0, n) (this library builds with -ffp-contract=off, so nothing fuses beyond adamw_element's fmas
// and the vector and scalar code paths agree bit for bit).
template <typename T>
inline void adamw_elements(T* p, const T* g, T* m, T* v, int64_t n, const AdamWScalars<T>& s) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) backend::adamw_element(p[i], g[i], m[i], v[i], s);
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
  const bool on_cpu = slots_.empty() || slots_[0].param->device().is_cpu();
  if (!multi_tensor_ && on_cpu) {
    for (size_t i = 0; i < slots_.size(); ++i)
      if (grads[i].defined()) run(i, 0, slots_[i].param->numel(), true);  // no gradient: skipped, as torch
    return;
  }
  // The multi-tensor pass (the backend's: OpenMP over chunks on the CPU, one kernel on a GPU); per tensor on
  // a GPU is one launch per tensor.
  std::vector<backend::Backend::AdamWTensors> list;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (grads[i].defined())
      list.push_back({*slots_[i].param, grads[i], slots_[i].exp_avg, slots_[i].exp_avg_sq, slots_[i].decay});
  if (list.empty()) return;
  auto& be = backend::backend_for(slots_[0].param->device());
  if (multi_tensor_) {
    be.fused_adamw(list, opts_.lr, wd, opts_.beta1, opts_.beta2, opts_.eps, step_);
  } else {
    for (const auto& t : list) be.fused_adamw({t}, opts_.lr, wd, opts_.beta1, opts_.beta2, opts_.eps, step_);
  }
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
