// AdamW step in the operation order of torch.optim.AdamW's single-tensor implementation (CPU, f32/f64).
#include "optim/adamw.h"

#include <cmath>
#include <regex>

namespace tr::optim {

bool AdamW::decays(const std::string& name) {
  // biases, and norm weights: names with layernorm/rmsnorm/norm/ln_ components, as HF's
  // get_decay_parameter_names
  static const std::regex no_decay(
      R"((^|\.)(bias)$|layernorm|rmsnorm|(^|\.)norm($|\.)|_norm($|\.)|(^|\.)ln_[^.]*\.)", std::regex::icase);
  return !std::regex_search(name, no_decay);
}

AdamW::AdamW(const nn::ParamList& params, AdamWOptions opts) : opts_(opts) {
  for (const auto& [name, p] : params) {
    TR_CHECK(p->device().is_cpu(), "AdamW: parameter '{}' is on {}; this optimizer runs on the CPU", name,
             p->device().str());
    TR_CHECK(p->dtype() == DType::f32 || p->dtype() == DType::f64,
             "AdamW: parameter '{}' must be f32 or f64, got {}", name, dtype_name(p->dtype()));
    slots_.push_back(
        {name, p, ops::zeros(p->shape(), p->dtype()), ops::zeros(p->shape(), p->dtype()), decays(name)});
  }
}

void AdamW::zero_grad() {
  for (auto& s : slots_) autograd::zero_grad(*s.param);
}

namespace {

template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, double lr, double wd, double b1, double b2,
                  double eps, int64_t step) {
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  const T step_size = static_cast<T>(lr / bc1), bc2_sqrt = static_cast<T>(std::sqrt(bc2));
  const T decay = static_cast<T>(1.0 - lr * wd), tb1 = static_cast<T>(b1), tb2 = static_cast<T>(b2);
  const T one_b1 = static_cast<T>(1.0 - b1), one_b2 = static_cast<T>(1.0 - b2), teps = static_cast<T>(eps);
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    if (wd != 0.0) p[i] *= decay;
    m[i] = m[i] * tb1 + g[i] * one_b1;
    v[i] = v[i] * tb2 + one_b2 * g[i] * g[i];  // addcmul: value * t1 * t2, left to right
    const T denom = std::sqrt(v[i]) / bc2_sqrt + teps;
    p[i] += -step_size * m[i] / denom;  // addcdiv: value * t1 / t2, left to right
  }
}

}  // namespace

void AdamW::step() {
  ++step_;
  for (auto& s : slots_) {
    Tensor g = s.param->grad();
    if (!g.defined()) continue;  // as torch: parameters without a gradient are skipped
    g = ops::contiguous(g);
    TR_CHECK(s.param->is_contiguous(), "AdamW: parameter '{}' must be contiguous", s.name);
    const double wd = s.decay ? opts_.weight_decay : 0.0;
    if (s.param->dtype() == DType::f32)
      adamw_update(s.param->data<float>(), g.data<float>(), s.exp_avg.data<float>(),
                   s.exp_avg_sq.data<float>(), s.param->numel(), opts_.lr, wd, opts_.beta1, opts_.beta2,
                   opts_.eps, step_);
    else
      adamw_update(s.param->data<double>(), g.data<double>(), s.exp_avg.data<double>(),
                   s.exp_avg_sq.data<double>(), s.param->numel(), opts_.lr, wd, opts_.beta1, opts_.beta2,
                   opts_.eps, step_);
  }
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", ops::from_vector<int64_t>({step_}, {})}};
  for (const auto& s : slots_) {
    out.emplace_back("exp_avg." + s.name, s.exp_avg);
    out.emplace_back("exp_avg_sq." + s.name, s.exp_avg_sq);
  }
  return out;
}

void AdamW::load_state_dict(const std::map<std::string, Tensor>& state) {
  auto get = [&](const std::string& k) -> const Tensor& {
    auto it = state.find(k);
    TR_CHECK(it != state.end(), "AdamW state: missing '{}'", k);
    return it->second;
  };
  step_ = static_cast<int64_t>(get("step").item());
  for (auto& s : slots_) {
    for (auto* dst : {&s.exp_avg, &s.exp_avg_sq}) {
      const Tensor& src = get((dst == &s.exp_avg ? "exp_avg." : "exp_avg_sq.") + s.name);
      TR_CHECK(src.shape() == s.param->shape(), "AdamW state: '{}' has shape {}, the parameter {}", s.name,
               shape_str(src.shape()), shape_str(s.param->shape()));
      ops::copy_(*dst, src);
    }
  }
}

}  // namespace tr::optim
