// bitsandbytes' dynamic 8-bit maps and the blockwise 8-bit AdamW step (CPU, f32), in the arithmetic order of
// its CUDA kernels (kOptimizerStatic8bit2StateBlockwise, and kOptimizer32bit2State for 32-bit state).
#include "optim/adamw_8bit.h"

#include <algorithm>
#include <cmath>

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

struct Consts {
  float b1, b2, one_b1, one_b2, step_size, eps_c2, decay;
  bool decays;
};

// One block of up to 256 elements: dequantize, Adam update in fp32, new absmax, parameter step, requantize.
void update_block(float* p, const float* g, uint8_t* c1, uint8_t* c2, float& absmax1, float& absmax2,
                  int64_t n, const Consts& k, const std::array<float, 256>& qs,
                  const std::array<float, 256>& qu) {
  float s1[AdamW8bit::kBlock], s2[AdamW8bit::kBlock];
  float max1 = 0.0f, max2 = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isfinite(g[j])) {
      s2[j] = qu[c2[j]] * absmax2;
      s2[j] = s2[j] * k.b2 + k.one_b2 * g[j] * g[j];
      s1[j] = qs[c1[j]] * absmax1;
      s1[j] = s1[j] * k.b1 + k.one_b1 * g[j];
    } else {
      // bitsandbytes skips the element: its parameter stays, its moments restart from zero.
      s1[j] = 0.0f;
      s2[j] = 0.0f;
    }
    max1 = std::fmax(max1, std::fabs(s1[j]));
    max2 = std::fmax(max2, std::fabs(s2[j]));
  }
  absmax1 = max1;
  absmax2 = max2;
  for (int64_t j = 0; j < n; ++j) {
    if (!std::isfinite(g[j])) continue;
    p[j] = p[j] + k.step_size * (s1[j] / (std::sqrt(s2[j]) + k.eps_c2));
    if (k.decays) p[j] = p[j] * k.decay;
  }
  // An all-zero block has absmax 0: its codes are those of 0 (bitsandbytes divides 0 by 0 there; the
  // dequantized values are 0 either way).
  const float inv1 = max1 > 0 ? max1 : 1.0f, inv2 = max2 > 0 ? max2 : 1.0f;
  for (int64_t j = 0; j < n; ++j) {
    uint8_t q1 = quantize_to_code(qs, s1[j] / inv1);
    // keep m's sign: a value that rounded to a code of the other sign (or to +0) moves one code outwards
    if (std::signbit(qs[q1]) != std::signbit(s1[j]))
      q1 = static_cast<uint8_t>(s1[j] > 0.0f ? q1 + 1 : q1 - 1);
    c1[j] = q1;
    c2[j] = quantize_to_code(qu, s2[j] / inv2);
  }
}

// bitsandbytes' 32-bit Adam kernel for the tensors that keep 32-bit state (no skipping of non-finite grads).
void update_32bit(float* p, const float* g, float* s1, float* s2, int64_t n, const Consts& k) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    s1[i] = s1[i] * k.b1 + k.one_b1 * g[i];
    s2[i] = s2[i] * k.b2 + k.one_b2 * (g[i] * g[i]);
    p[i] = p[i] + k.step_size * (s1[i] / (std::sqrt(s2[i]) + k.eps_c2));
    if (k.decays) p[i] = p[i] * k.decay;
  }
}

}  // namespace

const std::array<float, 256>& dynamic_map(bool is_signed) {
  static const std::array<float, 256> signed_map = make_dynamic_map(true),
                                      unsigned_map = make_dynamic_map(false);
  return is_signed ? signed_map : unsigned_map;
}

uint8_t quantize_to_code(const std::array<float, 256>& code, float x) {
  const auto hi = static_cast<size_t>(std::lower_bound(code.begin(), code.end(), x) - code.begin());
  if (hi == 0) return 0;
  if (hi == code.size()) return 255;
  const size_t lo = hi - 1;
  const float mid = (code[lo] + code[hi]) * 0.5f;
  if (x > mid) return static_cast<uint8_t>(hi);
  if (x < mid) return static_cast<uint8_t>(lo);
  return static_cast<uint8_t>(lo % 2 == 0 ? lo : hi);
}

bool AdamW8bit::keeps_32bit_state(const std::string& name, int64_t numel, int64_t min_8bit_size) {
  return numel < min_8bit_size || is_embedding(name);
}

AdamW8bit::AdamW8bit(const nn::ParamList& params, OptimizerOptions opts)
    : Optimizer(params, std::move(opts)) {
  detail::check_params("AdamW8bit", params, {DType::f32});
  detail::OptimArgs args("adamw_8bit", opts_.args);
  const double min_size = args.number("min_8bit_size", 4096);
  args.check_all_used();
  TR_CHECK(min_size >= 0 && min_size == std::floor(min_size),
           "adamw_8bit: min_8bit_size must be a count, got {}", min_size);
  min_8bit_size_ = static_cast<int64_t>(min_size);
  for (const auto& [name, p] : params) {
    Slot s{name, p, !keeps_32bit_state(name, p->numel(), min_8bit_size_), decays(name), {}, {}, {}, {}};
    if (s.eight_bit) {
      // bitsandbytes starts from zero codes and zero absmax (every moment dequantizes to 0).
      const int64_t blocks = (p->numel() + kBlock - 1) / kBlock;
      s.state1 = ops::zeros({p->numel()}, DType::u8);
      s.state2 = ops::zeros({p->numel()}, DType::u8);
      s.absmax1 = ops::zeros({blocks}, DType::f32);
      s.absmax2 = ops::zeros({blocks}, DType::f32);
    } else {
      s.state1 = ops::zeros(p->shape(), DType::f32);
      s.state2 = ops::zeros(p->shape(), DType::f32);
    }
    slots_.push_back(std::move(s));
  }
}

void AdamW8bit::step() {
  ++step_;
  const auto& qs = dynamic_map(true);
  const auto& qu = dynamic_map(false);
  const float lr = static_cast<float>(opts_.lr), b1 = static_cast<float>(opts_.beta1),
              b2 = static_cast<float>(opts_.beta2), eps = static_cast<float>(opts_.eps);
  const float t = static_cast<float>(step_);
  const float correction1 = 1.0f - std::pow(b1, t);
  const float correction2 = std::sqrt(1.0f - std::pow(b2, t));
  for (auto& s : slots_) {
    const Tensor g = detail::gradient("AdamW8bit", s.name, *s.param);
    if (!g.defined()) continue;  // parameters without a gradient are skipped
    const float wd = static_cast<float>(s.decay ? opts_.weight_decay : 0.0);
    const Consts k{
        .b1 = b1,
        .b2 = b2,
        .one_b1 = 1.0f - b1,
        .one_b2 = 1.0f - b2,
        .step_size = -lr * correction2 / correction1,  // bitsandbytes: -lr * sqrt(1-b2^t) / (1-b1^t)
        .eps_c2 = eps * correction2,
        .decay = 1.0f - lr * wd,
        .decays = wd > 0.0f};
    float* p = s.param->data<float>();
    const float* gp = g.data<float>();
    const int64_t n = s.param->numel();
    if (!s.eight_bit) {
      update_32bit(p, gp, s.state1.data<float>(), s.state2.data<float>(), n, k);
      continue;
    }
    uint8_t* c1 = s.state1.data<uint8_t>();
    uint8_t* c2 = s.state2.data<uint8_t>();
    float* a1 = s.absmax1.data<float>();
    float* a2 = s.absmax2.data<float>();
    const int64_t blocks = s.absmax1.numel();
#pragma omp parallel for schedule(static) if (blocks > 64)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t o = b * kBlock;
      update_block(p + o, gp + o, c1 + o, c2 + o, a1[b], a2[b], std::min(kBlock, n - o), k, qs, qu);
    }
  }
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
