// optimi 0.3's StableAdamW (its for-loop step, the one it runs on the CPU): the moments and each element's
// RMS term in one element-wise pass, each tensor's mean read once, then the parameter pass at the tensor's
// stabilized rate (element math in backend/optim_math.h, the same bits on every backend).
#include "optim/stable_adamw.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"
#include "optim/common.h"

namespace tr::optim {

namespace {

using backend::ElementwiseRule;

// optimi's debias_beta: beta * (1 - beta^(step-1)) / (1 - beta^step), in its simplified form.
double debias_beta(double beta, int64_t step) {
  const double b = std::pow(beta, static_cast<double>(step));
  return (b - beta) / (b - 1);
}

}  // namespace

StableAdamW::StableAdamW(const nn::ParamList& params, OptimizerOptions opts)
    : Optimizer(params, std::move(opts)) {
  detail::check_params("stable_adamw", params, {DType::f32, DType::f64}, /*any_device=*/true);
  detail::OptimArgs args("stable_adamw", opts_.args);
  decouple_lr_ = args.flag("decouple_lr", false);
  max_lr_ = args.number("max_lr", opts_.lr);  // optimi: lr when decouple_lr and none given
  (void)args.flag("kahan_sum", false);        // compensates half-precision parameters only (see the header)
  args.check_all_used();
  beta1_ = opts_.beta1;  // HF hands betas=(adam_beta1, adam_beta2), eps=adam_epsilon
  beta2_ = opts_.beta2;
  eps_ = opts_.eps;
  // optimi's own checks
  TR_CHECK(opts_.lr >= 0, "stable_adamw: invalid learning rate: lr={}", opts_.lr);
  TR_CHECK(opts_.weight_decay >= 0, "stable_adamw: invalid weight decay: weight_decay={}",
           opts_.weight_decay);
  TR_CHECK(beta1_ >= 0 && beta1_ < 1, "stable_adamw: invalid beta1 parameter: {}", beta1_);
  TR_CHECK(beta2_ >= 0 && beta2_ < 1, "stable_adamw: invalid beta2 parameter: {}", beta2_);
  TR_CHECK(eps_ >= 0, "stable_adamw: invalid epsilon: eps={}", eps_);
  TR_CHECK(max_lr_ >= 0 && (!decouple_lr_ || max_lr_ > 0),
           "stable_adamw: invalid maximum learning rate: max_lr={} (decouple_lr divides by it)", max_lr_);
  for (const auto& [pname, p] : params) slots_.push_back({pname, p, Tensor(), Tensor(), decays_param(pname)});
}

double StableAdamW::rms(const Tensor& terms) const {
  const int64_t n = terms.numel();
  if (n == 0) return 0;  // (torch's mean of nothing is nan, and max(1, nan) is 1 in Python: the same rate)
  // torch's mean and sqrt in the parameter's dtype (our mean sums in f64 where torch sums in f32: the last
  // bit may differ, which changes the rate only where the RMS exceeds 1)
  const Tensor mean = ops::reduce(ops::ReduceOp::mean, ops::reshape(terms, {n}), {}, false);
  if (mean.device().is_meta()) return 0;  // the estimate's dry run: the allocations, no values
  const double m = mean.item();
  return terms.dtype() == DType::f32 ? static_cast<double>(std::sqrt(static_cast<float>(m))) : std::sqrt(m);
}

void StableAdamW::step_params(size_t lo, size_t hi, bool advance) {
  if (advance) {
    ++step_;
    beta1_hat_ = debias_beta(beta1_, step_);
    beta2_hat_ = debias_beta(beta2_, step_);
  }
  backend::ElementwiseHyper moments;
  moments.rule = ElementwiseRule::stable_adamw_moments;
  moments.ckp1 = 1 - beta1_hat_;  // beta1_comp: exp_avg.lerp_(grad, weight=beta1_comp)
  moments.beta2 = beta2_hat_;
  moments.eps = eps_ * eps_;  // torch.tensor(eps ** 2, dtype=param.dtype)
  std::vector<backend::Backend::ElementwiseTensors> tensors;
  std::vector<Slot*> stepped;
  for (size_t i = lo; i < hi; ++i) {
    Slot& s = slots_[i];
    const Tensor g = detail::gradient("stable_adamw", s.name, *s.param);
    if (!g.defined()) continue;  // as optimi: parameters without a gradient are skipped
    if (!s.exp_avg.defined()) {
      s.exp_avg = ops::zeros(s.param->shape(), s.param->dtype(), s.param->device());
      s.exp_avg_sq = ops::zeros(s.param->shape(), s.param->dtype(), s.param->device());
    }
    // The gradient's buffer receives the RMS terms (it is not read again; optimi's foreach step reuses its
    // gradients the same way): the pass allocates nothing.
    const Tensor terms = ops::contiguous(g);
    tensors.push_back({terms, terms, s.exp_avg, s.exp_avg_sq, s.decay ? opts_.weight_decay : 0.0});
    stepped.push_back(&s);
  }
  ops::elementwise_step(tensors, moments);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const double wd = tensors[k].weight_decay;
    backend::ElementwiseHyper h;
    h.rule = ElementwiseRule::stable_adamw_param;
    h.lr = opts_.lr / std::max(1.0, rms(tensors[k].param));  // the RMS-stabilized rate
    h.eps = eps_;
    h.decay_factor = decouple_lr_ ? 1 - (h.lr / max_lr_) * wd : 1 - h.lr * wd;
    ops::elementwise_step({{*stepped[k]->param, Tensor(), stepped[k]->exp_avg, stepped[k]->exp_avg_sq, wd}},
                          h);
  }
}

std::vector<std::pair<std::string, Tensor>> StableAdamW::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(step_)}};
  for (const auto& s : slots_) {
    if (!s.exp_avg.defined()) continue;
    out.emplace_back("exp_avg." + s.name, s.exp_avg);
    out.emplace_back("exp_avg_sq." + s.name, s.exp_avg_sq);
  }
  return out;
}

void StableAdamW::load_state_dict(const std::map<std::string, Tensor>& state) {
  const int64_t step = detail::load_step(state, "stable_adamw");
  std::vector<Slot> next = slots_;  // the current state stays if an entry is refused
  for (auto& s : next) {
    s.exp_avg = s.exp_avg_sq = Tensor();
    const std::string km = "exp_avg." + s.name, kv = "exp_avg_sq." + s.name;
    if (!state.count(km) && !state.count(kv)) continue;  // no gradient yet
    s.exp_avg = ops::empty(s.param->shape(), s.param->dtype(), s.param->device());
    s.exp_avg_sq = ops::empty(s.param->shape(), s.param->dtype(), s.param->device());
    detail::load_entry(state, km, s.exp_avg, "stable_adamw");
    detail::load_entry(state, kv, s.exp_avg_sq, "stable_adamw");
  }
  slots_ = std::move(next);
  step_ = step;
}

}  // namespace tr::optim
