// AdamW step in the operation order of torch.optim.AdamW (f32/f64, any device through the backend's
// fused_adamw), per tensor or as one multi-tensor pass.
#include "optim/adamw.h"

#include "backend/backend.h"
#include "optim/common.h"

namespace tr::optim {

AdamW::AdamW(const nn::ParamList& params, AdamWOptions opts, bool multi_tensor)
    : Optimizer(params, std::move(opts)), multi_tensor_(multi_tensor) {
  // bf16/f16: half-precision weights (--torch_dtype bfloat16), the moments in their dtype as torch keeps them
  // (zeros_like), updated as torch's fused AdamW updates half tensors: f32 arithmetic, one rounding per
  // value.
  detail::check_params("AdamW", params, {DType::f32, DType::f64, DType::bf16, DType::f16},
                       /*any_device=*/true);
  detail::OptimArgs("AdamW", opts_.args).check_all_used();  // AdamW reads no --optim_args
  for (const auto& [name, p] : params)
    slots_.push_back({name, p, ops::zeros(p->shape(), p->dtype(), p->device()),
                      ops::zeros(p->shape(), p->dtype(), p->device()), decays_param(name)});
}

bool AdamW::half_state(const std::string& name) {
  return name == "adamw_torch" || name == "adamw_torch_fused" || name == "adamw_apex_fused" ||
         name == "adamw_torch_xla" || name == "adamw_torch_npu_fused";
}

void AdamW::step_params(size_t lo, size_t hi, bool advance) {
  // Gradients checked and made contiguous up front: the multi-tensor pass reads them all inside one parallel
  // region, where nothing may throw.
  std::vector<backend::Backend::AdamWTensors> list;
  for (size_t i = lo; i < hi; ++i) {
    const Slot& s = slots_[i];
    Tensor g = detail::gradient("AdamW", s.name, *s.param);
    if (g.defined()) list.push_back({*s.param, g, s.exp_avg, s.exp_avg_sq, s.decay, {}});  // none: skipped
  }
  run(list, {}, advance);
}

void AdamW::step(const std::vector<Tensor>& grads, const backend::Backend::GradTransform& t,
                 const std::vector<Tensor>& copies) {
  TR_CHECK(grads.size() == slots_.size() && (copies.empty() || copies.size() == slots_.size()),
           "AdamW step: {} gradients and {} weight copies for {} parameters", grads.size(), copies.size(),
           slots_.size());
  std::vector<backend::Backend::AdamWTensors> list;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Slot& s = slots_[i];
    TR_CHECK(grads[i].shape() == s.param->shape() && grads[i].device() == s.param->device(),
             "AdamW: the gradient of '{}' is {}, the parameter {}", s.name, grads[i].describe(),
             s.param->describe());
    list.push_back({*s.param, ops::contiguous(grads[i]), s.exp_avg, s.exp_avg_sq, s.decay,
                    copies.empty() ? Tensor() : copies[i]});
  }
  run(list, t, true);
}

void AdamW::run(const std::vector<backend::Backend::AdamWTensors>& list,
                const backend::Backend::GradTransform& t, bool advance) {
  if (advance) ++step_;
  if (list.empty()) return;
  // The backend's pass (OpenMP over 64K-element chunks on the CPU, one kernel on a GPU) with the element math
  // of backend/optim_math.h: per tensor (adamw_torch) or all tensors at once (the fused flavours) give the
  // same bits.
  const backend::Backend::AdamWHyper h{opts_.lr,    opts_.weight_decay, opts_.beta1,
                                       opts_.beta2, opts_.eps,          step_};
  if (multi_tensor_) {
    ops::fused_adamw(list, h, t);
  } else {
    for (const auto& x : list) ops::fused_adamw({x}, h, t);
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
