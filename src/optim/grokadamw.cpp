// GrokAdamW's step as grokadamw 0.1 publishes it, per parameter: clip_grad_norm_(p, gradient_clipping) in
// place, then two in-place element passes (ops::elementwise_step's grok_ema and grokadamw rules; element math
// in backend/optim_math.h). No grokking signal functions reach it through HF, and HF sets no losses in its
// groups, so the signal is 0 and the EMA decays by alpha_init (grokking_signal_decay_rate has no effect).
#include "optim/grokadamw.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "autograd/node.h"
#include "ops/ops.h"
#include "optim/common.h"

namespace tr::optim {

GrokAdamW::GrokAdamW(const nn::ParamList& params, OptimizerOptions opts)
    : Optimizer(params, std::move(opts)) {
  detail::check_params("GrokAdamW", params, {DType::f32, DType::f64}, /*any_device=*/true);
  detail::OptimArgs args("grokadamw", opts_.args);
  alpha_init_ = args.number("alpha_init", 0.98);
  lamb_ = args.number("lamb", 2.0);
  gamma_ = args.number("gamma", 0.1);
  signal_decay_ = args.number("grokking_signal_decay_rate", 0.1);
  clipping_ = args.number("gradient_clipping", 1.0);
  args.check_all_used();
  TR_CHECK(alpha_init_ >= 0 && alpha_init_ <= 1, "--optim_args: grokadamw alpha_init={} must be in [0, 1]",
           alpha_init_);
  TR_CHECK(std::isfinite(lamb_), "--optim_args: grokadamw lamb={} must be a finite number", lamb_);
  TR_CHECK(gamma_ >= 0 && gamma_ <= 1, "--optim_args: grokadamw gamma={} must be in [0, 1]", gamma_);
  TR_CHECK(std::isfinite(signal_decay_),
           "--optim_args: grokadamw grokking_signal_decay_rate={} must be finite", signal_decay_);
  TR_CHECK(std::isfinite(clipping_),
           "--optim_args: grokadamw gradient_clipping={} must be finite (<= 0: off)", clipping_);
  for (const auto& [name, p] : params) slots_.push_back({name, p, {}, {}, {}, 0, decays_param(name)});
  if (!params.empty()) stats_ = ops::zeros({2}, DType::f64, params.front().second->device());
}

std::string GrokAdamW::unused_flags_note(const OptimizerOptions& opts) {
  const std::vector<std::string> unused = detail::unused_adam_flags(opts, "1e-8");
  if (unused.empty()) return "";
  return fmt::format("--optim grokadamw: HF builds GrokAdamW without the Adam flags, so {} {} not used",
                     fmt::join(unused, ", "), unused.size() == 1 ? "is" : "are");
}

void GrokAdamW::step_params(size_t lo, size_t hi, bool advance) {
  if (advance) {
    ++step_;
    index_[0] = index_[1] = 0;
  }
  const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  for (size_t i = lo; i < hi; ++i) {
    Slot& s = slots_[i];
    const Tensor g = detail::gradient("GrokAdamW", s.name, *s.param);
    if (!g.defined()) continue;  // not in the group's params_with_grad: its index is not taken
    const int64_t index = index_[s.decay ? 1 : 0]++;
    if (!s.exp_avg.defined()) {
      s.exp_avg = ops::zeros(s.param->shape(), s.param->dtype(), s.param->device());
      s.exp_avg_sq = ops::zeros(s.param->shape(), s.param->dtype(), s.param->device());
      s.grok_ema = ops::zeros(s.param->shape(), s.param->dtype(), s.param->device());
    }
    ++s.step;
    if (clipping_ >
        0) {  // torch.nn.utils.clip_grad_norm_(p, gradient_clipping): the gradient scaled in place
      ops::grad_stats_into(g, stats_);
      ops::transform_grads({{g, g}}, {1.0, clipping_, stats_});
    }
    backend::ElementwiseHyper h;
    h.rule = backend::ElementwiseRule::grok_ema;
    h.beta1 = alpha_init_ * std::exp(-signal_decay_ * 0.0);  // the grokking signal is 0 (see above)
    h.momentum = lamb_;
    ops::elementwise_step({{g, g, s.grok_ema, Tensor(), 0.0}}, h);  // g becomes grad + lamb * ema
    const double t = static_cast<double>(s.step), wd = s.decay ? opts_.weight_decay : 0.0;
    h.rule = backend::ElementwiseRule::grokadamw;
    h.beta1 = beta1 * std::pow(1.0 - gamma_, static_cast<double>(index));  // layer_beta1
    h.beta2 = beta2;
    h.eps = eps;
    // bias corrections with the group's beta1 (as published), in Python floats
    h.lr = opts_.lr * std::sqrt(1.0 - std::pow(beta2, t)) / (1.0 - std::pow(beta1, t));
    h.decay_factor = 1.0 - opts_.lr * wd;
    ops::elementwise_step({{*s.param, g, s.exp_avg, s.exp_avg_sq, wd}}, h);
  }
}

std::vector<std::pair<std::string, Tensor>> GrokAdamW::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(step_)}};
  for (const auto& s : slots_) {
    if (!s.exp_avg.defined()) continue;
    out.emplace_back("exp_avg." + s.name, s.exp_avg);
    out.emplace_back("exp_avg_sq." + s.name, s.exp_avg_sq);
    out.emplace_back("grok_ema." + s.name, s.grok_ema);
    out.emplace_back("step." + s.name, detail::step_tensor(s.step));
  }
  return out;
}

int64_t GrokAdamW::state_bytes() const {
  int64_t n = 0;
  for (const auto& s : slots_)
    for (const Tensor* t : {&s.exp_avg, &s.exp_avg_sq, &s.grok_ema})
      if (t->defined()) n += static_cast<int64_t>(t->nbytes());
  return n;
}

void GrokAdamW::load_state_dict(const std::map<std::string, Tensor>& state) {
  const int64_t step = detail::load_step(state, "GrokAdamW");
  std::vector<Slot> next = slots_;  // the current state stays if an entry is refused
  for (auto& s : next) {
    s.exp_avg = s.exp_avg_sq = s.grok_ema = Tensor();
    s.step = 0;
    if (!state.count("exp_avg." + s.name)) continue;  // no gradient yet
    for (Tensor* t : {&s.exp_avg, &s.exp_avg_sq, &s.grok_ema}) {
      *t = ops::zeros(s.param->shape(), s.param->dtype(), s.param->device());
    }
    detail::load_entry(state, "exp_avg." + s.name, s.exp_avg, "GrokAdamW");
    detail::load_entry(state, "exp_avg_sq." + s.name, s.exp_avg_sq, "GrokAdamW");
    detail::load_entry(state, "grok_ema." + s.name, s.grok_ema, "GrokAdamW");
    std::map<std::string, Tensor> own{{"step", detail::state_entry(state, "step." + s.name, "GrokAdamW")}};
    s.step = detail::load_step(own, "GrokAdamW");
  }
  slots_ = std::move(next);
  step_ = step;
}

}  // namespace tr::optim
