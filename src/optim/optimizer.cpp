// The Optimizer base (decay groups, zero_grad, state size), the factory from HF's --optim names, the
// --optim_args parser, and the shared helpers of optim/common.h.
#include "optim/optimizer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/suggest.h"
#include "optim/adafactor.h"
#include "optim/anyprecision.h"
#include "optim/adamw.h"
#include "optim/adamw_8bit.h"
#include "optim/common.h"
#include "optim/elementwise.h"
#include "optim/galore.h"
#include "optim/grokadamw.h"
#include "optim/half_weights.h"
#include "optim/lomo.h"
#include "optim/schedule_free.h"
#include "optim/sgd.h"
#include "optim/stable_adamw.h"

namespace tr::optim {

Optimizer::Optimizer(const nn::ParamList& params, OptimizerOptions opts)
    : params_(params), opts_(std::move(opts)) {}

bool Optimizer::decays(const std::string& name) {
  // biases, and norm weights: names with layernorm/rmsnorm/norm/ln_ components, as HF's
  // get_decay_parameter_names
  static const std::regex no_decay(
      R"((^|\.)(bias)$|layernorm|rmsnorm|(^|\.)norm($|\.)|_norm($|\.)|(^|\.)ln_[^.]*\.)", std::regex::icase);
  return !std::regex_search(name, no_decay);
}

void Optimizer::step(const std::vector<Tensor>& grads, const backend::Backend::GradTransform& t,
                     const std::vector<Tensor>& copies) {
  TR_CHECK(grads.size() == params_.size() && (copies.empty() || copies.size() == params_.size()),
           "optimizer step: {} gradients and {} weight copies for {} parameters", grads.size(), copies.size(),
           params_.size());
  const size_t n = grads.size();
  // A gradient in another dtype than its parameter's is widened into a copy: the groups bound those copies.
  const auto widened = [&](size_t i) {
    return grads[i].defined() && grads[i].dtype() != params_[i].second->dtype()
               ? static_cast<int64_t>(params_[i].second->nbytes())
               : int64_t{0};
  };
  int64_t budget = int64_t{16} << 20;  // small models in one group: one multi-tensor pass, as before
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = *params_[i].second;
    TR_CHECK(!grads[i].defined() || (grads[i].shape() == p.shape() && grads[i].device() == p.device()),
             "optimizer step: the gradient of '{}' is {}, the parameter {}", params_[i].first,
             grads[i].describe(), p.describe());
    budget = std::max(budget, widened(i));
  }
  const bool identity = t.inv_scale == 1.0 && t.max_norm <= 0;
  size_t lo = 0;
  do {
    size_t hi = lo;
    for (int64_t bytes = 0; hi < n && (hi == lo || bytes + widened(hi) <= budget); ++hi) bytes += widened(hi);
    std::vector<std::pair<Tensor, Tensor>> pairs;
    for (size_t i = lo; i < hi; ++i) {
      Tensor& p = *params_[i].second;
      if (!grads[i].defined()) {
        autograd::zero_grad(p);
        continue;
      }
      Tensor g = ops::contiguous(grads[i]);
      const bool in_place = g.dtype() == p.dtype();  // fp32 training: the gradient is transformed where it is
      Tensor dst = in_place ? g : ops::empty(p.shape(), p.dtype(), p.device());
      if (!(identity && in_place)) pairs.emplace_back(g, dst);
      autograd::set_grad(p, dst);
    }
    ops::transform_grads(pairs, t);
    step_params(lo, hi, lo == 0);
    for (size_t i = lo; i < hi; ++i) {
      if (widened(i) > 0) autograd::zero_grad(*params_[i].second);  // the group's f32 copies go now
      if (!copies.empty() && grads[i].defined())
        ops::copy_(copies[i], *params_[i].second);  // rounded to nearest even
    }
    lo = hi;
  } while (lo < n);
}

void Optimizer::step_in_backward(size_t i, const Tensor& grad, const backend::Backend::GradTransform& t,
                                 const Tensor& copy, bool first) {
  TR_CHECK(i < params_.size(), "optimizer: parameter index {} of {}", i, params_.size());
  Tensor& p = *params_[i].second;
  TR_CHECK(grad.shape() == p.shape() && grad.device() == p.device(),
           "optimizer step: the gradient of '{}' is {}, the parameter {}", params_[i].first, grad.describe(),
           p.describe());
  // step()'s path for one parameter: the transformed gradient in the parameter's dtype as its .grad.
  Tensor g = ops::contiguous(grad);
  const bool in_place = g.dtype() == p.dtype();
  Tensor dst = in_place ? g : ops::empty(p.shape(), p.dtype(), p.device());
  if (!(t.inv_scale == 1.0 && t.max_norm <= 0 && in_place)) ops::transform_grads({{g, dst}}, t);
  autograd::set_grad(p, dst);
  step_params(i, i + 1, first);
  autograd::zero_grad(p);
  if (copy.defined()) ops::copy_(copy, p);  // rounded to nearest even
}

void Optimizer::zero_grad() {
  for (auto& [name, p] : params_) autograd::zero_grad(*p);
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : state_dict()) n += static_cast<int64_t>(t.nbytes());
  return n;
}

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names{"adamw_torch",
                                              "adamw_torch_fused",
                                              "adamw_apex_fused",
                                              "adamw_torch_xla",
                                              "adamw_torch_npu_fused",
                                              "adafactor",
                                              "adamw_bnb_8bit",
                                              "adamw_8bit",
                                              "paged_adamw_8bit",
                                              "paged_adamw_32bit",
                                              "sgd",
                                              "adagrad",
                                              "rmsprop",
                                              "rmsprop_bnb",
                                              "rmsprop_bnb_32bit",
                                              "rmsprop_bnb_8bit",
                                              "lion_32bit",
                                              "paged_lion_32bit",
                                              "lion_8bit",
                                              "paged_lion_8bit",
                                              "ademamix",
                                              "paged_ademamix_32bit",
                                              "ademamix_8bit",
                                              "paged_ademamix_8bit",
                                              "schedule_free_adamw",
                                              "schedule_free_radam",
                                              "schedule_free_sgd",
                                              "stable_adamw",
                                              "galore_adamw",
                                              "galore_adamw_8bit",
                                              "galore_adafactor",
                                              "galore_adamw_layerwise",
                                              "galore_adamw_8bit_layerwise",
                                              "galore_adafactor_layerwise",
                                              "apollo_adamw",
                                              "apollo_adamw_layerwise",
                                              "grokadamw",
                                              "lomo",
                                              "adalomo",
                                              "adamw_anyprecision"};
  return names;
}

namespace {

// HF's OptimizerNames that this build does not implement, and what each stands for in HF.
const std::map<std::string, std::string>& unimplemented_names() {
  static const std::map<std::string, std::string> names{
      {"adamw_torch_4bit", "torchao's AdamW4bit (4-bit states with its own quantization)"},
      {"adamw_torch_8bit",
       "torchao's AdamW8bit (its own 8-bit quantization; bitsandbytes' is adamw_bnb_8bit)"},
  };

  return names;
}

}  // namespace

void check_optimizer_name(const std::string& name) {
  const auto& names = optimizer_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  const std::string all = fmt::format("{}", fmt::join(names, ", "));
  const auto& other = unimplemented_names();
  if (const auto it = other.find(name); it != other.end())
    fail("--optim '{}' is HF's name for {}, which trainer.cpp does not implement; it implements {}", name,
         it->second, all);
  fail("--optim '{}' is not one of {}{}", name, all, did_you_mean(name, names));
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const nn::ParamList& params,
                                          const OptimizerOptions& opts) {
  check_optimizer_name(name);
  // Half-precision weights (--torch_dtype bfloat16): AdamW keeps its moments in the weights' dtype, as
  // torch's; the others run in f32 over stand-ins widened one group at a time.
  if (!params.empty() && is_half(params.front().second->dtype())) {
    check_half_weights(name);
    if (AdamW::half_state(name)) return std::make_unique<AdamW>(params, opts, name != "adamw_torch");
    if (name == "adamw_anyprecision") return std::make_unique<AnyPrecisionAdamW>(params, opts);
    return std::make_unique<HalfWeights>(
        params, opts, [&](const nn::ParamList& wide) { return make_optimizer(name, wide, opts); });
  }
  if (name == "adamw_torch") return std::make_unique<AdamW>(params, opts);
  // torch's fused AdamW, apex's FusedAdam, torch_xla's sync-free AdamW and torch_npu's NpuFusedAdamW: one
  // multi-tensor pass, the same numbers as adamw_torch (the last two are the same arithmetic for TPUs and
  // Ascend NPUs; here they run on this run's device).
  if (name == "adamw_torch_fused" || name == "adamw_apex_fused" || name == "adamw_torch_xla" ||
      name == "adamw_torch_npu_fused")
    return std::make_unique<AdamW>(params, opts, /*multi_tensor=*/true);
  if (name == "adafactor") return std::make_unique<Adafactor>(params, opts);
  // bitsandbytes' paged optimizers: the same kernels, their state in CUDA managed memory that the driver may
  // page out under memory pressure; here the state stays resident (--fsdp "... offload" moves it to the
  // host).
  if (name == "adamw_bnb_8bit" || name == "adamw_8bit" || name == "paged_adamw_8bit")
    return std::make_unique<AdamW8bit>(params, opts);
  if (name == "paged_adamw_32bit") return std::make_unique<AdamW8bit>(params, opts, /*optim_bits=*/32);
  // bitsandbytes' AdEMAMix (HF: optim_bits 8 where the name says 8bit, else 32).
  if (name == "ademamix" || name == "paged_ademamix_32bit")
    return std::make_unique<AdamW8bit>(params, opts, /*optim_bits=*/32, /*ademamix=*/true);
  if (name == "ademamix_8bit" || name == "paged_ademamix_8bit")
    return std::make_unique<AdamW8bit>(params, opts, /*optim_bits=*/8, /*ademamix=*/true);
  if (ElementwiseOptimizer::implements(name))
    return std::make_unique<ElementwiseOptimizer>(name, params, opts);
  if (name == "sgd") return std::make_unique<SGD>(params, opts);
  if (ScheduleFree::implements(name)) return std::make_unique<ScheduleFree>(name, params, opts);
  if (name == "stable_adamw") return std::make_unique<StableAdamW>(params, opts);
  if (GaLore::implements(name)) return std::make_unique<GaLore>(name, params, opts);
  if (name == "grokadamw") return std::make_unique<GrokAdamW>(params, opts);
  if (name == "lomo") return std::make_unique<Lomo>(params, opts);
  if (name == "adalomo") return std::make_unique<AdaLomo>(params, opts);
  if (name == "adamw_anyprecision") return std::make_unique<AnyPrecisionAdamW>(params, opts);
  fail("--optim '{}': no optimizer is built for this name", name);  // (a name listed above but not built)
}

void check_half_weights(const std::string& name) {
  TR_CHECK(
      !ScheduleFree::implements(name),
      "--optim {} with half-precision weights (--torch_dtype bfloat16): its train/eval switch moves every "
      "weight between two points, which half weights would round each time; train with --bf16 (fp32 "
      "masters) or another --optim",
      name);
}

bool updates_in_backward(const std::string& name) {
  return name == "lomo" || name == "adalomo" || (GaLore::implements(name) && name.ends_with("_layerwise"));
}

std::string unused_flags_note(const std::string& name, const OptimizerOptions& opts) {
  if (GaLore::implements(name)) return GaLore::unused_flags_note(name, opts);
  if (name == "grokadamw") return GrokAdamW::unused_flags_note(opts);
  if (name == "lomo" || name == "adalomo") return lomo_unused_flags_note(name, opts);
  if (name == "adamw_torch_xla" || name == "adamw_torch_npu_fused")
    return fmt::format("--optim {} is {} AdamW for {}; its arithmetic is adamw_torch's, which runs here",
                       name, name == "adamw_torch_xla" ? "torch_xla's sync-free" : "torch_npu's fused",
                       name == "adamw_torch_xla" ? "TPUs" : "Ascend NPUs");
  return "";
}

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n\r"), e = s.find_last_not_of(" \t\n\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

std::map<std::string, std::string> parse_optim_args(const std::string& text) {
  std::map<std::string, std::string> out;
  if (trim(text).empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string entry =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t eq = entry.find('=');
    TR_CHECK(eq != std::string::npos, "--optim_args: entry '{}' is not key=value (in \"{}\")", trim(entry),
             text);
    const std::string key = trim(entry.substr(0, eq)), value = trim(entry.substr(eq + 1));
    TR_CHECK(!key.empty() && !value.empty(), "--optim_args: entry '{}' needs a key and a value (in \"{}\")",
             trim(entry), text);
    TR_CHECK(out.emplace(key, value).second, "--optim_args: '{}' is given twice (in \"{}\")", key, text);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

namespace detail {

const std::string* OptimArgs::find(const std::string& key) {
  known_.push_back(key);
  auto it = args_.find(key);
  return it == args_.end() ? nullptr : &it->second;
}

std::optional<double> OptimArgs::optional_number(const std::string& key) {
  const std::string* v = find(key);
  if (!v) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  TR_CHECK(end != v->c_str() && *end == '\0' && errno == 0, "--optim_args: {} {}='{}' is not a number",
           optimizer_, key, *v);
  return x;
}

double OptimArgs::number(const std::string& key, double fallback) {
  return optional_number(key).value_or(fallback);
}

std::vector<std::string> unused_adam_flags(const OptimizerOptions& opts, const char* eps_used) {
  std::vector<std::string> unused;
  if (opts.beta1 != 0.9) unused.push_back(fmt::format("--adam_beta1 {} (it uses 0.9)", opts.beta1));
  if (opts.beta2 != 0.999) unused.push_back(fmt::format("--adam_beta2 {} (it uses 0.999)", opts.beta2));
  if (opts.eps != 1e-8) unused.push_back(fmt::format("--adam_epsilon {} (it uses {})", opts.eps, eps_used));
  return unused;
}

std::string OptimArgs::text(const std::string& key, const std::string& fallback) {
  const std::string* v = find(key);
  return v ? *v : fallback;
}

bool OptimArgs::flag(const std::string& key, bool fallback) {
  const std::string* v = find(key);
  if (!v) return fallback;
  if (*v == "true" || *v == "True" || *v == "1") return true;
  if (*v == "false" || *v == "False" || *v == "0") return false;
  fail("--optim_args: {} {}='{}' is not true or false", optimizer_, key, *v);
}

void OptimArgs::check_all_used() const {
  for (const auto& [key, value] : args_) {
    if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
    std::string takes;
    for (const auto& k : known_) takes += (takes.empty() ? "" : ", ") + k;
    fail("--optim_args: '{}' is not an argument of {} (it takes {}){}", key, optimizer_,
         takes.empty() ? std::string("none") : takes, did_you_mean(key, known_));
  }
}

void check_params(const char* optimizer, const nn::ParamList& params, const std::vector<DType>& dtypes,
                  bool any_device) {
  for (const auto& [name, p] : params) {
    TR_CHECK(any_device || p->device().is_cpu(),
             "{}: parameter '{}' is on {}; this optimizer runs on the CPU", optimizer, name,
             p->device().str());
    TR_CHECK(std::find(dtypes.begin(), dtypes.end(), p->dtype()) != dtypes.end(),
             "{}: parameter '{}' has dtype {}, which this optimizer does not update", optimizer, name,
             dtype_name(p->dtype()));
    TR_CHECK(p->is_contiguous(), "{}: parameter '{}' must be contiguous", optimizer, name);
  }
}

Tensor gradient(const char* optimizer, const std::string& name, const Tensor& param) {
  Tensor g = param.grad();
  if (!g.defined()) return g;
  TR_CHECK(g.dtype() == param.dtype() && g.shape() == param.shape() && g.device() == param.device(),
           "{}: the gradient of '{}' is {}, the parameter {}", optimizer, name, g.describe(),
           param.describe());
  return ops::contiguous(g);
}

const Tensor& state_entry(const std::map<std::string, Tensor>& state, const std::string& key,
                          const char* optimizer) {
  auto it = state.find(key);
  TR_CHECK(it != state.end(), "{} state: missing '{}'", optimizer, key);
  return it->second;
}

void load_entry(const std::map<std::string, Tensor>& state, const std::string& key, const Tensor& dst,
                const char* optimizer) {
  const Tensor& src = state_entry(state, key, optimizer);
  TR_CHECK(src.dtype() == dst.dtype(), "{} state: '{}' is {}, expected {}", optimizer, key,
           dtype_name(src.dtype()), dtype_name(dst.dtype()));
  TR_CHECK(src.shape() == dst.shape(), "{} state: '{}' has shape {}, expected {}", optimizer, key,
           shape_str(src.shape()), shape_str(dst.shape()));
  ops::copy_(dst, ops::to_device(src, dst.device()));
}

int64_t load_step(const std::map<std::string, Tensor>& state, const char* optimizer) {
  const Tensor& t = state_entry(state, "step", optimizer);
  TR_CHECK(t.numel() == 1, "{} state: 'step' must hold one number, got {}", optimizer, t.describe());
  // Checked before the cast: a NaN or huge float step is undefined behaviour there, a negative one turns the
  // bias corrections into beta^-n.
  const double step = t.item();
  TR_CHECK(std::isfinite(step) && step >= 0 && step <= 9007199254740992.0 && step == std::floor(step),
           "{} state: 'step' must be a whole number in [0, 2^53], got {}", optimizer, step);
  return static_cast<int64_t>(step);
}

Tensor step_tensor(int64_t step) { return ops::from_vector<int64_t>({step}, {}); }

}  // namespace detail
}  // namespace tr::optim
