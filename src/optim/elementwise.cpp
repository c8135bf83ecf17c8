// Adagrad, RMSprop and bitsandbytes' Lion and RMSprop (32- and 8-bit state): the options and state of each,
// one in-place pass per step (ops::elementwise_step, ops::elementwise_8bit; element math in
// backend/optim_math.h and adamw8bit_math.h, the same bits on every backend).
#include "optim/elementwise.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"
#include "optim/adamw_8bit.h"
#include "optim/common.h"

namespace tr::optim {

namespace {

using backend::ElementwiseRule;

ElementwiseRule rule_of(const std::string& name) {
  if (name == "adagrad") return ElementwiseRule::adagrad;
  if (name == "rmsprop") return ElementwiseRule::rmsprop;
  if (name.find("lion") != std::string::npos) return ElementwiseRule::lion;
  if (name.find("rmsprop_bnb") != std::string::npos) return ElementwiseRule::rmsprop_bnb;
  fail("ElementwiseOptimizer: '{}' is not an element-wise optimizer name", name);
}

}  // namespace

bool ElementwiseOptimizer::implements(const std::string& name) {
  for (const char* n : {"adagrad", "rmsprop", "lion_32bit", "lion_8bit", "paged_lion_32bit",
                        "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_32bit", "rmsprop_bnb_8bit"})
    if (name == n) return true;
  return false;
}

ElementwiseOptimizer::ElementwiseOptimizer(const std::string& name, const nn::ParamList& params,
                                           OptimizerOptions opts)
    : Optimizer(params, std::move(opts)), name_(name) {
  h_.rule = rule_of(name);
  const bool bnb = h_.rule == ElementwiseRule::lion || h_.rule == ElementwiseRule::rmsprop_bnb;
  detail::check_params(name.c_str(), params,
                       bnb ? std::vector<DType>{DType::f32} : std::vector<DType>{DType::f32, DType::f64},
                       /*any_device=*/true);
  detail::OptimArgs args(name, opts_.args);
  h_.lr = opts_.lr;
  switch (h_.rule) {
    case ElementwiseRule::adagrad:
      h_.lr_decay = args.number("lr_decay", 0.0);
      initial_accumulator_ = args.number("initial_accumulator_value", 0.0);
      h_.eps = args.number("eps", 1e-10);
      key1_ = "sum.";
      // torch.optim.Adagrad's own checks
      TR_CHECK(h_.lr_decay >= 0, "adagrad: invalid lr_decay value: {}", h_.lr_decay);
      TR_CHECK(initial_accumulator_ >= 0, "adagrad: invalid initial_accumulator_value value: {}",
               initial_accumulator_);
      break;
    case ElementwiseRule::rmsprop:
      h_.beta1 = args.number("alpha", 0.99);
      h_.eps = args.number("eps", 1e-8);
      h_.momentum = args.number("momentum", 0.0);
      TR_CHECK(!args.flag("centered", false),
               "rmsprop: centered=true is not implemented here (HF builds torch's RMSprop without it)");
      key1_ = "square_avg.";
      key2_ = "momentum_buffer.";
      TR_CHECK(h_.momentum >= 0, "rmsprop: invalid momentum value: {}", h_.momentum);
      TR_CHECK(h_.beta1 >= 0, "rmsprop: invalid alpha value: {}", h_.beta1);
      break;
    case ElementwiseRule::lion:
      h_.beta1 = opts_.beta1;  // HF hands Lion betas=(adam_beta1, adam_beta2)
      h_.beta2 = opts_.beta2;
      TR_CHECK(h_.beta1 >= 0 && h_.beta1 < 1, "{}: invalid beta parameter at index 0: {}", name, h_.beta1);
      TR_CHECK(h_.beta2 >= 0 && h_.beta2 < 1, "{}: invalid beta parameter at index 1: {}", name, h_.beta2);
      break;
    case ElementwiseRule::rmsprop_bnb:
      h_.beta1 = args.number("alpha", 0.99);
      h_.eps = args.number("eps", 1e-8);
      // bitsandbytes' RMSprop refuses these, and its 32-bit kernel has no momentum term
      TR_CHECK(h_.beta1 != 0, "{}: RMSprop with alpha==0.0 is not supported (bitsandbytes)", name);
      TR_CHECK(!args.flag("centered", false), "{}: centered RMSprop is not supported (bitsandbytes)", name);
      TR_CHECK(args.number("momentum", 0.0) == 0,
               "{}: bitsandbytes' RMSprop kernel has no momentum term; use --optim rmsprop for momentum",
               name);
      break;
    default: fail("ElementwiseOptimizer: '{}' is not an element-wise optimizer name", name);  // (rule_of's)
  }
  const bool eight_bit = name.find("8bit") != std::string::npos;
  int64_t min_8bit_size = 0;
  if (eight_bit) {
    const double m = args.number("min_8bit_size", 4096);
    TR_CHECK(m >= 0 && m == std::floor(m), "{}: min_8bit_size must be a count, got {}", name, m);
    min_8bit_size = static_cast<int64_t>(m);
  }
  args.check_all_used();
  TR_CHECK(opts_.lr >= 0, "{}: invalid learning rate: {}", name, opts_.lr);
  TR_CHECK(h_.eps >= 0, "{}: invalid epsilon value: {}", name, h_.eps);
  TR_CHECK(opts_.weight_decay >= 0, "{}: invalid weight_decay value: {}", name, opts_.weight_decay);
  for (const auto& [pname, p] : params) {
    Slot s{pname,
           p,
           Tensor(),
           Tensor(),
           Tensor(),
           decays_param(pname),
           eight_bit && !AdamW8bit::keeps_32bit_state(pname, p->numel(), min_8bit_size)};
    if (h_.rule == ElementwiseRule::adagrad)  // torch makes Adagrad's sums in its constructor
      s.state1 = ops::full(p->shape(), initial_accumulator_, p->dtype(), p->device());
    slots_.push_back(std::move(s));
  }
  if (std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.eight_bit; })) {
    Tensor m = ops::empty({256}, DType::f32);
    std::copy(dynamic_map(true).begin(), dynamic_map(true).end(), m.data<float>());
    signed_map_ = ops::to_device(m, params.front().second->device());  // ops move it for other devices
  }
}

void ElementwiseOptimizer::make_state(Slot& s) const {
  const Tensor& p = *s.param;
  if (s.eight_bit) {  // bitsandbytes starts from zero codes and zero absmax (every state dequantizes to 0)
    s.state1 = ops::zeros({p.numel()}, DType::u8, p.device());
    s.absmax1 = ops::zeros({(p.numel() + AdamW8bit::kBlock - 1) / AdamW8bit::kBlock}, DType::f32, p.device());
    return;
  }
  s.state1 = ops::zeros(p.shape(), p.dtype(), p.device());
  if (h_.rule == ElementwiseRule::rmsprop && h_.momentum > 0)
    s.state2 = ops::zeros(p.shape(), p.dtype(), p.device());
}

void ElementwiseOptimizer::step_params(size_t lo, size_t hi, bool advance) {
  if (advance) ++step_;
  h_.lr = opts_.lr;
  h_.step = step_;
  std::vector<backend::Backend::ElementwiseTensors> tensors;
  std::vector<backend::Backend::Elementwise8bitTensors> eight;
  for (size_t i = lo; i < hi; ++i) {
    Slot& s = slots_[i];
    const Tensor g = detail::gradient(name_.c_str(), s.name, *s.param);
    if (!g.defined()) continue;  // as torch and bitsandbytes: parameters without a gradient are skipped
    if (!s.state1.defined()) make_state(s);
    const double wd = s.decay ? opts_.weight_decay : 0.0;
    if (s.eight_bit)
      eight.push_back({*s.param, ops::contiguous(g), s.state1, s.absmax1, wd});
    else
      tensors.push_back({*s.param, ops::contiguous(g), s.state1, s.state2, wd});
  }
  ops::elementwise_step(tensors, h_);
  ops::elementwise_8bit(eight, h_, signed_map_);
}

std::vector<std::pair<std::string, Tensor>> ElementwiseOptimizer::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(step_)}};
  for (const auto& s : slots_) {
    if (s.state1.defined()) out.emplace_back(key1_ + s.name, s.state1);
    if (s.state2.defined()) out.emplace_back(key2_ + s.name, s.state2);
    if (s.absmax1.defined()) out.emplace_back("absmax1." + s.name, s.absmax1);
  }
  return out;
}

void ElementwiseOptimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  const int64_t step = detail::load_step(state, name_.c_str());
  const bool momentum = h_.rule == ElementwiseRule::rmsprop && h_.momentum > 0;
  std::vector<Slot> next = slots_;  // the current state stays if an entry is refused
  for (auto& s : next) {
    const std::string k1 = key1_ + s.name, k2 = std::string(key2_) + s.name;
    s.state1 = s.state2 = s.absmax1 = Tensor();
    if (h_.rule == ElementwiseRule::adagrad || state.count(k1)) {  // Adagrad's sums always exist
      if (s.eight_bit) {
        make_state(s);
        detail::load_entry(state, "absmax1." + s.name, s.absmax1, name_.c_str());
      } else {
        s.state1 = ops::empty(s.param->shape(), s.param->dtype(), s.param->device());
      }
      detail::load_entry(state, k1, s.state1, name_.c_str());
    }
    TR_CHECK(momentum || *key2_ == '\0' || !state.count(k2),
             "{} state: '{}' is present but this RMSprop has no momentum", name_, k2);
    if (momentum && s.state1.defined()) {  // made together
      s.state2 = ops::empty(s.param->shape(), s.param->dtype(), s.param->device());
      detail::load_entry(state, k2, s.state2, name_.c_str());
    }
  }
  slots_ = std::move(next);
  step_ = step;
}

}  // namespace tr::optim
