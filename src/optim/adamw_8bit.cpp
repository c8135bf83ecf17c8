// bitsandbytes' dynamic 8-bit maps and the blockwise 8-bit AdamW step (any device: the backend's adamw_8bit
// pass, element math in backend/adamw8bit_math.h in the arithmetic order of bitsandbytes' CUDA kernels).
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

AdamW8bit::AdamW8bit(const nn::ParamList& params, OptimizerOptions opts, int optim_bits)
    : Optimizer(params, std::move(opts)) {
  TR_CHECK(optim_bits == 8 || optim_bits == 32, "AdamW8bit: optim_bits {} (8 or 32)", optim_bits);
  detail::check_params("AdamW8bit", params, {DType::f32}, /*any_device=*/true);
  detail::OptimArgs args("adamw_8bit", opts_.args);
  const double min_size = args.number("min_8bit_size", 4096);
  args.check_all_used();
  TR_CHECK(min_size >= 0 && min_size == std::floor(min_size),
           "adamw_8bit: min_8bit_size must be a count, got {}", min_size);
  min_8bit_size_ = static_cast<int64_t>(min_size);
  for (const auto& [name, p] : params) {
    Slot s{name,
           p,
           optim_bits == 8 && !keeps_32bit_state(name, p->numel(), min_8bit_size_),
           decays_param(name),
           {},
           {},
           {},
           {}};
    if (s.eight_bit) {
      // bitsandbytes starts from zero codes and zero absmax (every moment dequantizes to 0).
      const int64_t blocks = (p->numel() + kBlock - 1) / kBlock;
      s.state1 = ops::zeros({p->numel()}, DType::u8, p->device());
      s.state2 = ops::zeros({p->numel()}, DType::u8, p->device());
      s.absmax1 = ops::zeros({blocks}, DType::f32, p->device());
      s.absmax2 = ops::zeros({blocks}, DType::f32, p->device());
    } else {
      s.state1 = ops::zeros(p->shape(), DType::f32, p->device());
      s.state2 = ops::zeros(p->shape(), DType::f32, p->device());
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

void AdamW8bit::step_params(size_t lo, size_t hi, bool advance) {
  if (advance) ++step_;
  const float lr = static_cast<float>(opts_.lr), b1 = static_cast<float>(opts_.beta1),
              b2 = static_cast<float>(opts_.beta2), eps = static_cast<float>(opts_.eps);
  const float t = static_cast<float>(step_);
  const float correction1 = 1.0f - std::pow(b1, t);
  const float correction2 = std::sqrt(1.0f - std::pow(b2, t));
  std::vector<backend::Backend::AdamW8bitTensors> list;
  for (size_t i = lo; i < hi; ++i) {
    Slot& s = slots_[i];
    const Tensor g = detail::gradient("AdamW8bit", s.name, *s.param);
    if (!g.defined()) continue;  // parameters without a gradient are skipped
    const float wd = static_cast<float>(s.decay ? opts_.weight_decay : 0.0);
    const backend::Adam8bitConsts k{
        .b1 = b1,
        .b2 = b2,
        .one_b1 = 1.0f - b1,
        .one_b2 = 1.0f - b2,
        .step_size = -lr * correction2 / correction1,  // bitsandbytes: -lr * sqrt(1-b2^t) / (1-b1^t)
        .eps_c2 = eps * correction2,
        .decay = 1.0f - lr * wd,
        .decays = wd > 0.0f};
    list.push_back({*s.param, g, s.state1, s.state2, s.absmax1, s.absmax2, s.eight_bit, k});
  }
  ops::adamw_8bit(list, signed_map_, unsigned_map_);
}

std::vector<std::pair<std::string, Tensor>> AdamW8bit::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(step_)}};
  for (const auto& s : slots_) {
    out.emplace_back("state1." + s.name, s.state1);
    out.emplace_back("state2." + s.name, s.state2);
    if (s.eight_bit) {
      out.emplace_back("absmax1." + s.name, s.absmax1);
      out.emplace_back("absmax2." + s.name, s.absmax2);
    }
  }
  return out;
}

void AdamW8bit::load_state_dict(const std::map<std::string, Tensor>& state) {
  const int64_t step = detail::load_step(state, "AdamW8bit");
  for (auto& s : slots_) {
    detail::load_entry(state, "state1." + s.name, s.state1, "AdamW8bit");
    detail::load_entry(state, "state2." + s.name, s.state2, "AdamW8bit");
    if (s.eight_bit) {
      detail::load_entry(state, "absmax1." + s.name, s.absmax1, "AdamW8bit");
      detail::load_entry(state, "absmax2." + s.name, s.absmax2, "AdamW8bit");
    }
  }
  step_ = step;
}

}  // namespace tr::optim
