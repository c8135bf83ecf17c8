// schedulefree's AdamW, RAdam and SGD (schedulefree 1.4's foreach step): the group arithmetic in double as
// its Python computes it, the element update in one in-place pass (ops::elementwise_step; element math in
// backend/optim_math.h, the same bits on every backend), and the train/eval switch between y and x.
#include "optim/schedule_free.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"
#include "optim/common.h"

namespace tr::optim {

namespace {

using backend::ElementwiseRule;

const char* kNames[] = {"schedule_free_adamw", "schedule_free_radam", "schedule_free_sgd"};

}  // namespace

bool ScheduleFree::implements(const std::string& name) {
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

ScheduleFree::ScheduleFree(const std::string& name, const nn::ParamList& params, OptimizerOptions opts)
    : Optimizer(params, std::move(opts)), name_(name) {
  TR_CHECK(implements(name), "ScheduleFree: '{}' is not a schedule-free optimizer name", name);
  kind_ = name == "schedule_free_adamw"   ? Kind::adamw
          : name == "schedule_free_radam" ? Kind::radam
                                          : Kind::sgd;
  detail::check_params(name.c_str(), params, {DType::f32, DType::f64}, /*any_device=*/true);
  detail::OptimArgs args(name, opts_.args);
  weight_lr_power_ = args.number("weight_lr_power", 2.0);  // HF's two --optim_args keys
  r_ = args.number("r", 0.0);
  h_.rule = kind_ == Kind::sgd ? ElementwiseRule::schedule_free_sgd : ElementwiseRule::schedule_free_adam;
  if (kind_ == Kind::sgd) {
    beta1_ = args.number("momentum", 0.9);  // SGDScheduleFree's default; HF passes none
    // SGDScheduleFree's own checks
    TR_CHECK(opts_.lr >= 0, "{}: invalid learning rate: {}", name, opts_.lr);
    TR_CHECK(opts_.weight_decay >= 0, "{}: invalid weight_decay value: {}", name, opts_.weight_decay);
    TR_CHECK(beta1_ > 0 && beta1_ < 1, "{}: momentum must be between 0 and 1 exclusive: {}", name, beta1_);
  } else {
    beta1_ = opts_.beta1;  // HF hands betas=(adam_beta1, adam_beta2), eps=adam_epsilon
    h_.beta2 = opts_.beta2;
    h_.eps = opts_.eps;
    // schedulefree checks none of these; each of them breaks its arithmetic (x = lerp(y, z, 1 - 1/beta1)
    // divides by beta1; beta2 = 1 makes RAdam's rho_inf infinite and the bias correction zero).
    TR_CHECK(opts_.lr >= 0, "{}: invalid learning rate: {}", name, opts_.lr);
    TR_CHECK(beta1_ > 0 && beta1_ < 1, "{}: --adam_beta1 must be in (0, 1) (x = lerp(y, z, 1 - 1/beta1)): {}",
             name, beta1_);
    TR_CHECK(h_.beta2 >= 0 && h_.beta2 < 1, "{}: --adam_beta2 must be in [0, 1): {}", name, h_.beta2);
    TR_CHECK(h_.eps >= 0, "{}: invalid epsilon value: {}", name, h_.eps);
  }
  args.check_all_used();
  TR_CHECK(std::isfinite(weight_lr_power_) && weight_lr_power_ >= 0,
           "{}: --optim_args weight_lr_power must be a number >= 0 (the average weighs lr_max^power): {}",
           name, weight_lr_power_);
  TR_CHECK(std::isfinite(r_) && r_ >= 0, "{}: --optim_args r must be a number >= 0 (weights (k+1)^r): {}",
           name, r_);
  warmup_ = kind_ == Kind::radam ? 0 : std::max<int64_t>(opts_.warmup_steps, 0);  // RAdam: HF passes none
  for (const auto& [pname, p] : params) slots_.push_back({pname, p, Tensor(), Tensor(), decays_param(pname)});
}

void ScheduleFree::check_train_mode() const {
  TR_CHECK(train_,
           "{}: step() in eval mode: the gradients were taken at the averaged point x, not at y (enter train "
           "mode first, as schedulefree requires)",
           name_);
}

void ScheduleFree::step() {
  check_train_mode();
  Optimizer::step();
}

void ScheduleFree::step(const std::vector<Tensor>& grads, const backend::Backend::GradTransform& t,
                        const std::vector<Tensor>& copies) {
  check_train_mode();
  Optimizer::step(grads, t, copies);
}

// schedulefree's group arithmetic, in its order (Python floats: doubles; `**` is C's pow).
void ScheduleFree::advance() {
  const double step = static_cast<double>(k_ + 1);
  double lr = opts_.lr;  // the scheduler's rate, as HF's scheduler sets group['lr']
  h_.normalize = true;
  if (kind_ == Kind::radam) {
    const double beta2 = h_.beta2, beta2_t = std::pow(beta2, step);
    h_.bias_correction2 = 1 - beta2_t;
    const double rho_inf = 2 / (1 - beta2) - 1;
    const double rho_t = rho_inf - 2 * step * beta2_t / h_.bias_correction2;
    // The rectification; its silent first steps (rho_t <= 4: schedulefree's default silent_sgd_phase) update
    // only the second moment.
    const double rect =
        rho_t > 4.0
            ? std::pow((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t), 0.5)
            : 0.0;
    h_.normalize = rho_t > 4.0;
    lr *= rect;
  } else {
    if (k_ < warmup_) lr *= step / static_cast<double>(warmup_);
    if (kind_ == Kind::adamw) h_.bias_correction2 = 1 - std::pow(h_.beta2, step);
  }
  lr_max_ = std::max(lr, lr_max_);
  const double weight = std::pow(step, r_) * std::pow(lr_max_, weight_lr_power_);
  weight_sum_ += weight;
  h_.ckp1 = weight_sum_ != 0 ? weight / weight_sum_ : 0.0;  // Python's ZeroDivisionError gives 0
  h_.lr = lr;
  h_.y_lr = lr * (beta1_ * (1 - h_.ckp1) - 1);
  ++k_;
}

void ScheduleFree::step_params(size_t lo, size_t hi, bool advance_step) {
  if (advance_step) advance();
  std::vector<backend::Backend::ElementwiseTensors> tensors;
  for (size_t i = lo; i < hi; ++i) {
    Slot& s = slots_[i];
    const Tensor g = detail::gradient(name_.c_str(), s.name, *s.param);
    if (!g.defined()) continue;  // as schedulefree: parameters without a gradient are skipped
    if (!s.z.defined()) {        // made at the first gradient: z starts at the parameter
      s.z = ops::clone(*s.param);
      if (kind_ != Kind::sgd)
        s.exp_avg_sq = ops::zeros(s.param->shape(), s.param->dtype(), s.param->device());
    }
    tensors.push_back({*s.param, ops::contiguous(g), s.z, s.exp_avg_sq, s.decay ? opts_.weight_decay : 0.0});
  }
  ops::elementwise_step(tensors, h_);
}

void ScheduleFree::set_train_mode(bool train, const std::vector<Tensor>& copies) {
  if (train == train_) return;
  TR_CHECK(copies.empty() || copies.size() == slots_.size(), "{}: {} weight copies for {} parameters", name_,
           copies.size(), slots_.size());
  backend::ElementwiseHyper h;
  h.rule = ElementwiseRule::schedule_free_lerp;
  h.ckp1 = train ? 1 - beta1_ : 1 - 1 / beta1_;  // y = lerp(x, z, 1 - beta1); x = lerp(y, z, 1 - 1/beta1)
  std::vector<backend::Backend::ElementwiseTensors> tensors;
  for (const auto& s : slots_)
    if (s.z.defined()) tensors.push_back({*s.param, Tensor(), s.z, Tensor(), 0.0});
  ops::elementwise_step(tensors, h);
  if (!copies.empty())
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].z.defined()) ops::copy_(copies[i], *slots_[i].param);  // rounded to nearest even
  train_ = train;
}

std::vector<std::pair<std::string, Tensor>> ScheduleFree::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(k_)},
                                                  {"weight_sum", ops::from_vector<double>({weight_sum_}, {})},
                                                  {"lr_max", ops::from_vector<double>({lr_max_}, {})},
                                                  {"train_mode", detail::step_tensor(train_ ? 1 : 0)}};
  for (const auto& s : slots_) {
    if (s.z.defined()) out.emplace_back("z." + s.name, s.z);
    if (s.exp_avg_sq.defined()) out.emplace_back("exp_avg_sq." + s.name, s.exp_avg_sq);
  }
  return out;
}

void ScheduleFree::load_state_dict(const std::map<std::string, Tensor>& state) {
  const char* who = name_.c_str();
  const int64_t step = detail::load_step(state, who);
  const auto number = [&](const char* key) {
    const Tensor& t = detail::state_entry(state, key, who);
    TR_CHECK(t.numel() == 1, "{} state: '{}' must hold one number, got {}", name_, key, t.describe());
    return t.item();
  };
  const double weight_sum = number("weight_sum"), lr_max = number("lr_max"), mode = number("train_mode");
  TR_CHECK(std::isfinite(weight_sum) && weight_sum >= 0,
           "{} state: 'weight_sum' must be a number >= 0, got {}", name_, weight_sum);
  TR_CHECK(std::isfinite(lr_max) && lr_max >= -1, "{} state: 'lr_max' must be a number >= -1, got {}", name_,
           lr_max);
  TR_CHECK(mode == 0 || mode == 1, "{} state: 'train_mode' must be 0 or 1, got {}", name_, mode);
  std::vector<Slot> next = slots_;  // the current state stays if an entry is refused
  for (auto& s : next) {
    s.z = s.exp_avg_sq = Tensor();
    const std::string kz = "z." + s.name, kv = "exp_avg_sq." + s.name;
    TR_CHECK(kind_ != Kind::sgd || !state.count(kv),
             "{} state: '{}' is present but SGD keeps no second moment", name_, kv);
    if (!state.count(kz)) {
      TR_CHECK(!state.count(kv), "{} state: '{}' is missing (its '{}' is present)", name_, kz, kv);
      continue;
    }
    s.z = ops::empty(s.param->shape(), s.param->dtype(), s.param->device());
    detail::load_entry(state, kz, s.z, who);
    if (kind_ != Kind::sgd) {  // made together
      s.exp_avg_sq = ops::empty(s.param->shape(), s.param->dtype(), s.param->device());
      detail::load_entry(state, kv, s.exp_avg_sq, who);
    }
  }
  slots_ = std::move(next);
  k_ = step;
  weight_sum_ = weight_sum;
  lr_max_ = lr_max;
  train_ = mode == 1;
}

}  // namespace tr::optim
