// bitsandbytes' dynamic 8-bit maps and its two-state optimizers' steps, AdamW and AdEMAMix, 8- and 32-bit
// (any device: the backend's adamw_8bit pass, element math in backend/adamw8bit_math.h in the arithmetic
// order of bitsandbytes' CUDA kernels).
#include "optim/adamw_8bit.h"

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "optim/common.h"

namespace tr::optim {

namespace {

// torch.linspace(0.1, 1, steps) in f32 as torch's CPU kernel computes it: from the start for the first half,
// from the end for the second, with a fused multiply-add (its AVX2 build contracts start + step * i).
std::vector<float> linspace_f32(float start, float end, int steps) {
  const float step = (end - start) / static_cast<float>(steps - 1);
  std::vector<float> out(static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i)
    out[static_cast<size_t>(i)] = i < steps / 2 ? std::fma(step, static_cast<float>(i), start)
                                                : std::fma(-step, static_cast<float>(steps - i - 1), end);
  return out;
}

std::array<float, 256> make_dynamic_map(bool is_signed) {
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    // Exponent 10^(i-6); the fraction's interval [0.1, 1] split into 2^i (signed) or 2^(i+1) parts, one code
    // at each part's middle: the more leading zero bits the exponent takes, the fewer fraction bits remain.
    const int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    const auto bounds = linspace_f32(0.1f, 1.0f, items);
    const float scale = static_cast<float>(std::pow(10.0, i - 6));
    for (int j = 0; j + 1 < items; ++j) {
      const float mean = (bounds[static_cast<size_t>(j)] + bounds[static_cast<size_t>(j) + 1]) / 2.0f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  TR_CHECK(data.size() == 256, "dynamic_map: {} codes", data.size());
  std::sort(data.begin(), data.end());
  std::array<float, 256> out;
  std::copy(data.begin(), data.end(), out.begin());
  return out;
}

bool is_embedding(const std::string& name) {
  return name.find("embed") != std::string::npos || name.find("wte") != std::string::npos ||
         name.find("wpe") != std::string::npos;
}

}  // namespace

const std::array<float, 256>& dynamic_map(bool is_signed) {
  static const std::array<float, 256> signed_map = make_dynamic_map(true),
                                      unsigned_map = make_dynamic_map(false);
  return is_signed ? signed_map : unsigned_map;
}

uint8_t quantize_to_code(const std::array<float, 256>& code, float x) {
  return backend::quantize_code(code.data(), x);
}

bool AdamW8bit::keeps_32bit_state(const std::string& name, int64_t numel, int64_t min_8bit_size) {
  return numel < min_8bit_size || is_embedding(name);
}

// --optim_args of AdEMAMix, checked as bitsandbytes checks them (and the logarithms its beta3 schedule
// takes).
AdamW8bit::Ademamix AdamW8bit::parse_ademamix(detail::OptimArgs& args, const OptimizerOptions& opts) {
  Ademamix a{};
  a.beta1 = args.number("beta1", opts.beta1);
  a.beta2 = args.number("beta2", opts.beta2);
  a.beta3 = args.number("beta3", 0.9999);
  a.alpha = args.number("alpha", 5.0);
  a.eps = args.number("eps", opts.eps);
  const auto count = [&](const char* key) {
    const double v = args.number(key, 0.0);
    TR_CHECK(v >= 0 && v == std::floor(v) && v < 1e15,
             "--optim_args: ademamix {}={} must be a count of steps (0 or absent: no schedule)", key, v);
    return static_cast<int64_t>(v);
  };
  a.t_alpha = count("t_alpha");
  a.t_beta3 = count("t_beta3");
  const std::pair<const char*, double> betas[] = {{"beta1", a.beta1}, {"beta2", a.beta2}, {"beta3", a.beta3}};
  for (const auto& [key, v] : betas)
    TR_CHECK(v >= 0 && v < 1, "--optim_args: ademamix {}={}: expected a number in [0, 1)", key, v);
  TR_CHECK(a.eps >= 0, "--optim_args: ademamix eps={}: expected a number >= 0", a.eps);
  TR_CHECK(std::isfinite(a.alpha), "--optim_args: ademamix alpha={}: expected a finite number", a.alpha);
  TR_CHECK(a.t_beta3 == 0 || (a.beta1 > 0 && a.beta3 > 0),
           "--optim_args: ademamix t_beta3 schedules beta3 through log(beta1) and log(beta3): beta1={} and "
           "beta3={} must be above 0",
           a.beta1, a.beta3);
  return a;
}

AdamW8bit::AdamW8bit(const nn::ParamList& params, OptimizerOptions opts, int optim_bits, bool ademamix)
    : Optimizer(params, std::move(opts)) {
  const char* what = ademamix ? "ademamix" : "adamw_8bit";
  TR_CHECK(optim_bits == 8 || optim_bits == 32, "{}: optim_bits {} (8 or 32)", what, optim_bits);
  detail::check_params(what, params, {DType::f32}, /*any_device=*/true);
  detail::OptimArgs args(what, opts_.args);
  const double min_size = args.number("min_8bit_size", 4096);
  if (ademamix) ademamix_ = parse_ademamix(args, opts_);
  args.check_all_used();
  TR_CHECK(min_size >= 0 && min_size == std::floor(min_size), "{}: min_8bit_size must be a count, got {}",
           what, min_size);
  min_8bit_size_ = static_cast<int64_t>(min_size);
  for (const auto& [name, param] : params) {
    Tensor* const p = param;  // (clang 14 cannot capture a structured binding)
    Slot s{name,
           p,
           optim_bits == 8 && !keeps_32bit_state(name, p->numel(), min_8bit_size_),
           decays_param(name),
           {},
           {},
           {},
           {},
           {},
           {}};
    // bitsandbytes starts from zero codes and zero absmax (every state dequantizes to 0).
    const int64_t blocks = (p->numel() + kBlock - 1) / kBlock;
    const auto state = [&] {
      return s.eight_bit ? ops::zeros({p->numel()}, DType::u8, p->device())
                         : ops::zeros(p->shape(), DType::f32, p->device());
    };
    const auto absmax = [&] {
      return s.eight_bit ? ops::zeros({blocks}, DType::f32, p->device()) : Tensor();
    };
    s.state1 = state();
    s.state2 = state();
    s.absmax1 = absmax();
    s.absmax2 = absmax();
    if (ademamix) {
      s.state3 = state();
      s.absmax3 = absmax();
    }
    slots_.push_back(std::move(s));
  }
  // The code maps where the kernels read them (the parameters' device).
  const Device dev = params.empty() ? Device::cpu() : params[0].second->device();
  for (bool is_signed : {true, false}) {
    Tensor m = ops::empty({256}, DType::f32);
    std::copy(dynamic_map(is_signed).begin(), dynamic_map(is_signed).end(), m.data<float>());
    (is_signed ? signed_map_ : unsigned_map_) = ops::to_device(m, dev);
  }
}

backend::Adam8bitConsts AdamW8bit::adamw_consts(float wd) const {
  const float lr = static_cast<float>(opts_.lr), b1 = static_cast<float>(opts_.beta1),
              b2 = static_cast<float>(opts_.beta2), eps = static_cast<float>(opts_.eps);
  const float t = static_cast<float>(step_);
  const float correction1 = 1.0f - std::pow(b1, t);
  const float correction2 = std::sqrt(1.0f - std::pow(b2, t));
  return {.b1 = b1,
          .b2 = b2,
          .one_b1 = 1.0f - b1,
          .one_b2 = 1.0f - b2,
          .step_size = -lr * correction2 / correction1,  // bitsandbytes: -lr * sqrt(1-b2^t) / (1-b1^t)
          .eps_c2 = eps * correction2,
          .decay = 1.0f - lr * wd,
          .decays = wd > 0.0f};
}

// bitsandbytes' AdEMAMix.update_step: alpha and beta3 after their schedules (in Python's double, then handed
// to the kernel as f32), the bias corrections in the kernel's f32.
backend::Adam8bitConsts AdamW8bit::ademamix_consts(float wd) const {
  const Ademamix& a = *ademamix_;
  const double t = static_cast<double>(step_);
  double alpha = a.alpha, beta3 = a.beta3;
  if (a.t_alpha > 0) alpha = std::min(t * a.alpha / static_cast<double>(a.t_alpha), a.alpha);
  if (a.t_beta3 > 0) {
    const double ln1 = std::log(a.beta1), ln3 = std::log(a.beta3), s = t / static_cast<double>(a.t_beta3);
    beta3 = std::min(std::exp((ln1 * ln3) / (((1 - s) * ln3) + (s * ln1))), a.beta3);
  }
  const float lr = static_cast<float>(opts_.lr), b1 = static_cast<float>(a.beta1),
              b2 = static_cast<float>(a.beta2), b3 = static_cast<float>(beta3),
              tf = static_cast<float>(step_);
  backend::Adam8bitConsts k{.b1 = b1,
                            .b2 = b2,
                            .one_b1 = 1.0f - b1,
                            .one_b2 = 1.0f - b2,
                            .step_size = 0.0f,
                            .eps_c2 = 0.0f,
                            .decay = 1.0f - lr * wd,
                            .decays = wd > 0.0f,
                            .ademamix = true,
                            .b3 = b3,
                            .one_b3 = 1.0f - b3,
                            .alpha = static_cast<float>(alpha),
                            .lr = lr,
                            .eps = static_cast<float>(a.eps),
                            .c1 = 1.0f - std::pow(b1, tf),
                            .c2 = std::sqrt(1.0f - std::pow(b2, tf))};
  return k;
}

void AdamW8bit::step_params(size_t lo, size_t hi, bool advance) {
  if (advance) ++step_;
  std::vector<backend::Backend::AdamW8bitTensors> list;
  for (size_t i = lo; i < hi; ++i) {
    Slot& s = slots_[i];
    const Tensor g = detail::gradient("AdamW8bit", s.name, *s.param);
    if (!g.defined()) continue;  // parameters without a gradient are skipped
    const float wd = static_cast<float>(s.decay ? opts_.weight_decay : 0.0);
    list.push_back({*s.param, g, s.state1, s.state2, s.absmax1, s.absmax2, s.eight_bit,
                    ademamix_ ? ademamix_consts(wd) : adamw_consts(wd), s.state3, s.absmax3});
  }
  ops::adamw_8bit(list, signed_map_, unsigned_map_);
}

namespace {

// A slot's state tensors under their state_dict prefixes (undefined ones: not kept by this optimizer).
template <typename S>
std::array<std::pair<const char*, decltype(&std::declval<S&>().state1)>, 6> entries(S& s) {
  return {{{"state1.", &s.state1},
           {"state2.", &s.state2},
           {"state3.", &s.state3},
           {"absmax1.", &s.absmax1},
           {"absmax2.", &s.absmax2},
           {"absmax3.", &s.absmax3}}};
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> AdamW8bit::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(step_)}};
  for (const auto& s : slots_) {
    for (const auto& [key, t] : entries(s))
      if (t->defined()) out.emplace_back(key + s.name, *t);
  }
  return out;
}

void AdamW8bit::load_state_dict(const std::map<std::string, Tensor>& state) {
  const char* what = ademamix_ ? "AdEMAMix" : "AdamW8bit";
  const int64_t step = detail::load_step(state, what);
  for (auto& s : slots_) {
    for (const auto& [key, t] : entries(s))
      if (t->defined()) detail::load_entry(state, key + s.name, *t, what);
  }
  step_ = step;
}

}  // namespace tr::optim
