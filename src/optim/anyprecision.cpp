// AnyPrecisionAdamW: HF's optim_args read as HF reads them, the states made in their dtypes, the backend's
// anyprecision_adamw pass (optim_math.h's anyprecision_element on every backend).
#include "optim/anyprecision.h"

#include "optim/common.h"

namespace tr::optim {

namespace {

// torch dtype names as getattr(torch, name) takes them, for the dtypes the kernels store.
DType torch_dtype(detail::OptimArgs& args, const std::string& key, const std::string& fallback) {
  const std::string v = args.text(key, fallback);
  if (v == "float32" || v == "float") return DType::f32;
  if (v == "bfloat16") return DType::bf16;
  if (v == "float16" || v == "half") return DType::f16;
  fail("--optim_args: adamw_anyprecision {}='{}': expected float32, bfloat16 or float16", key, v);
}

}  // namespace

AnyPrecisionAdamW::AnyPrecisionAdamW(const nn::ParamList& params, OptimizerOptions opts)
    : Optimizer(params, std::move(opts)) {
  detail::check_params("AnyPrecisionAdamW", params, {DType::f32, DType::bf16, DType::f16},
                       /*any_device=*/true);
  detail::OptimArgs args("adamw_anyprecision", opts_.args);
  const bool kahan = args.flag("use_kahan_summation", false);
  const DType m = torch_dtype(args, "momentum_dtype", "float32");
  const DType v = torch_dtype(args, "variance_dtype", "float32");
  const DType c = torch_dtype(args, "compensation_buffer_dtype", "bfloat16");
  args.check_all_used();
  for (const auto& [name, p] : params)
    slots_.push_back({name, p, ops::zeros(p->shape(), m, p->device()), ops::zeros(p->shape(), v, p->device()),
                      kahan ? ops::zeros(p->shape(), c, p->device()) : Tensor(), decays_param(name)});
}

void AnyPrecisionAdamW::step_params(size_t lo, size_t hi, bool advance) {
  if (advance) ++step_;
  std::vector<backend::Backend::AnyPrecisionTensors> list;
  for (size_t i = lo; i < hi; ++i) {
    const Slot& s = slots_[i];
    Tensor g = detail::gradient("AnyPrecisionAdamW", s.name, *s.param);
    if (g.defined()) list.push_back({*s.param, g, s.exp_avg, s.exp_avg_sq, s.compensation, s.decay});
  }
  if (list.empty()) return;
  // HF hands it lr, betas, eps and each group's weight decay (0 for biases and norms).
  ops::anyprecision_adamw(list, {opts_.lr, opts_.weight_decay, opts_.beta1, opts_.beta2, opts_.eps, step_});
}

std::vector<std::pair<std::string, Tensor>> AnyPrecisionAdamW::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(step_)}};
  for (const auto& s : slots_) {
    out.emplace_back("exp_avg." + s.name, s.exp_avg);
    out.emplace_back("exp_avg_sq." + s.name, s.exp_avg_sq);
    if (s.compensation.defined()) out.emplace_back("compensation." + s.name, s.compensation);
  }
  return out;
}

void AnyPrecisionAdamW::load_state_dict(const std::map<std::string, Tensor>& state) {
  const int64_t step = detail::load_step(state, "AnyPrecisionAdamW");
  for (auto& s : slots_) {
    detail::load_entry(state, "exp_avg." + s.name, s.exp_avg, "AnyPrecisionAdamW");
    detail::load_entry(state, "exp_avg_sq." + s.name, s.exp_avg_sq, "AnyPrecisionAdamW");
    if (s.compensation.defined())
      detail::load_entry(state, "compensation." + s.name, s.compensation, "AnyPrecisionAdamW");
  }
  step_ = step;
}

}  // namespace tr::optim
