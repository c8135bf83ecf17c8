// GaLore as galore_torch 1.0 computes it: per targeted weight, project(grad) with the basis of the gradient's
// SVD (refreshed when the weight's step count is a multiple of update_proj_gap), the inner optimizer's update
// at low rank, project_back(update) * scale added to the weight. As galore_torch's 8-bit class does, the low
// rank update is taken by running the inner optimizer on a zero stand-in of the low-rank shape; the other
// parameters take the inner optimizer directly.
#include "optim/galore.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "autograd/node.h"
#include "ops/ops.h"
#include "optim/adafactor.h"
#include "optim/adamw_8bit.h"
#include "optim/common.h"

namespace tr::optim {

namespace {

// galore_torch's AdamW (transformers' former AdamW): bias corrections folded into the step size, eps added
// to sqrt(v), weight decay after the update; as tensor ops, so it runs wherever the parameters are.
class GaloreAdamW final : public Optimizer {
 public:
  GaloreAdamW(const nn::ParamList& params, OptimizerOptions opts) : Optimizer(params, std::move(opts)) {
    for (const auto& [name, p] : params)
      slots_.push_back({name, p, ops::zeros(p->shape(), p->dtype(), p->device()),
                        ops::zeros(p->shape(), p->dtype(), p->device())});
  }
  int64_t step_count() const override { return step_; }
  std::vector<std::pair<std::string, Tensor>> state_dict() const override {
    std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(step_)}};
    for (const auto& s : slots_) {
      out.emplace_back("exp_avg." + s.name, s.m);
      out.emplace_back("exp_avg_sq." + s.name, s.v);
    }
    return out;
  }
  void load_state_dict(const std::map<std::string, Tensor>& state) override {
    const int64_t step = detail::load_step(state, "GaLoreAdamW");
    for (auto& s : slots_) {
      detail::load_entry(state, "exp_avg." + s.name, s.m, "GaLoreAdamW");
      detail::load_entry(state, "exp_avg_sq." + s.name, s.v, "GaLoreAdamW");
    }
    step_ = step;
  }

 protected:
  // One in-place pass per group (ops::elementwise_step's galore_adamw rule): no temporaries, so under
  // torch_compile the step adds nothing beside the arena.
  void step_params(size_t lo, size_t hi, bool advance) override {
    if (advance) ++step_;
    const double b1 = opts_.beta1, b2 = opts_.beta2, t = static_cast<double>(step_);
    backend::ElementwiseHyper h;
    h.rule = backend::ElementwiseRule::galore_adamw;
    h.beta1 = b1;
    h.beta2 = b2;
    h.eps = opts_.eps;
    h.lr = opts_.lr * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));  // Python floats
    h.decay_factor = -opts_.lr * opts_.weight_decay;
    std::vector<backend::Backend::ElementwiseTensors> tensors;
    for (size_t i = lo; i < hi; ++i) {
      Slot& s = slots_[i];
      const Tensor g = detail::gradient("GaLoreAdamW", s.name, *s.param);
      if (g.defined()) tensors.push_back({*s.param, g, s.m, s.v, opts_.weight_decay});
    }
    ops::elementwise_step(tensors, h);
  }

 private:
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor m, v;
  };
  std::vector<Slot> slots_;
  int64_t step_ = 0;
};

GaloreProjection parse_projection(const std::string& name, const std::string& text) {
  if (text == "std") return GaloreProjection::std_side;
  if (text == "reverse_std") return GaloreProjection::reverse_std;
  if (text == "right") return GaloreProjection::right;
  if (text == "left") return GaloreProjection::left;
  if (text == "full") return GaloreProjection::full;
  fail("--optim_args: {} proj_type='{}' is not one of std, reverse_std, right, left, full", name, text);
}

// HF's check_target_module_exists over the linear layers' module names.
class TargetModules {
 public:
  TargetModules(const std::string& optim, const std::string& text) {
    TR_CHECK(!text.empty(),
             "--optim {} needs --optim_target_modules: a regex of module names (e.g. '.*(attn|mlp).*'), "
             "all-linear, or a JSON list of names (e.g. '[\"q_proj\", \"v_proj\"]'), as HF",
             optim);
    if (text.front() == '[') {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(text);
      } catch (const nlohmann::json::exception&) {
        fail("--optim_target_modules '{}': not a JSON list of strings", text);
      }
      TR_CHECK(j.is_array() && !j.empty(), "--optim_target_modules '{}': expected a non-empty JSON list",
               text);
      for (const auto& e : j) {
        TR_CHECK(e.is_string(), "--optim_target_modules '{}': {} is not a string", text, e.dump());
        list_.push_back(e.get<std::string>());
        regexes_.push_back(compile(list_.back()));
      }
      return;
    }
    std::string dashed = text;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    all_linear_ = dashed == "all-linear";
    if (!all_linear_) regexes_.push_back(compile(text));
  }
  bool matches(const std::string& module) const {
    if (all_linear_) return true;
    if (list_.empty()) return std::regex_match(module, regexes_[0]);
    for (size_t i = 0; i < list_.size(); ++i)
      if (module == list_[i] || module.find(list_[i]) != std::string::npos ||
          std::regex_match(module, regexes_[i]))
        return true;
    return false;
  }

 private:
  std::regex compile(const std::string& pattern) const {
    // std::regex compiles by recursion: a bounded pattern keeps a pathological one from the stack's end
    TR_CHECK(pattern.size() <= 1000, "--optim_target_modules: a pattern of {} characters (at most 1000)",
             pattern.size());
    try {
      return std::regex(pattern);
    } catch (const std::regex_error& e) {
      fail("--optim_target_modules: '{}' is not a valid regular expression ({})", pattern, e.what());
    }
  }
  bool all_linear_ = false;
  std::vector<std::string> list_;
  std::vector<std::regex> regexes_;
};

std::string module_of(const std::string& weight) {
  return weight.ends_with(".weight") ? weight.substr(0, weight.size() - 7) : weight;
}

}  // namespace

bool GaLore::implements(const std::string& name) {
  const std::string base = name.ends_with("_layerwise") ? name.substr(0, name.size() - 10) : name;
  return base == "galore_adamw" || base == "galore_adamw_8bit" || base == "galore_adafactor" ||
         base == "apollo_adamw";
}

std::string GaLore::unused_flags_note(const std::string& full_name, const OptimizerOptions& opts) {
  if (!implements(full_name)) return "";
  const std::string name =
      full_name.ends_with("_layerwise") ? full_name.substr(0, full_name.size() - 10) : full_name;
  const bool apollo = name == "apollo_adamw";  // HF hands APOLLO's targets the --adam_* values
  const bool adam = name != "galore_adafactor" && !apollo;
  std::vector<std::string> unused;
  if (adam) unused = detail::unused_adam_flags(opts, name == "galore_adamw" ? "1e-6" : "1e-8");
  if (opts.weight_decay != 0)
    unused.push_back(fmt::format("--weight_decay {} (it uses {})", opts.weight_decay,
                                 name == "galore_adamw_8bit" ? "0.01 on every parameter" : "none"));
  if (unused.empty()) return "";
  return fmt::format("--optim {}: HF builds {} with the learning rate{} alone, so {} {} not used", full_name,
                     apollo ? "apollo_torch's optimizer" : "galore_torch's optimizer",
                     apollo ? " and the --adam_* values" : "", fmt::join(unused, ", "),
                     unused.size() == 1 ? "is" : "are");
}

GaLore::GaLore(const std::string& name, const nn::ParamList& params, OptimizerOptions opts)
    : Optimizer(params, std::move(opts)) {
  TR_CHECK(implements(name), "GaLore: '{}' is not one of its names", name);
  layerwise_ = name.ends_with("_layerwise");
  const std::string base = layerwise_ ? name.substr(0, name.size() - 10) : name;
  kind_ = base == "galore_adamw"        ? Kind::adamw
          : base == "galore_adamw_8bit" ? Kind::adamw_8bit
          : base == "apollo_adamw"      ? Kind::apollo
                                        : Kind::adafactor;
  detail::check_params(name.c_str(), params, {DType::f32}, /*any_device=*/true);
  parse_args(name);
  const TargetModules targets(name, opts_.target_modules);
  weight_decay_ = kind_ == Kind::adamw_8bit ? 0.01 : 0.0;

  slots_.reserve(params.size());  // the inner optimizers keep pointers into the slots
  nn::ParamList full_params, low_params;
  for (const auto& [pname, p] : params) {
    Slot s;
    s.name = pname;
    s.param = p;
    const bool linear = std::find(opts_.linear_weights.begin(), opts_.linear_weights.end(), pname) !=
                        opts_.linear_weights.end();
    s.projected = linear && p->dim() == 2 && targets.matches(module_of(pname));
    full_before_.push_back(full_params.size());
    low_before_.push_back(low_params.size());
    slots_.push_back(std::move(s));
    Slot& sl = slots_.back();
    if (!sl.projected) {
      full_params.emplace_back(pname, p);
      continue;
    }
    allocate_projection(sl);
    low_params.emplace_back(pname, &sl.buffer);
  }
  // apollo_torch numbers the parameters through its groups (HF's: the others, then the targets) from 1 and
  // seeds each target's first matrix with its number; a layer-wise optimizer holds one parameter (1).
  uint64_t number = full_params.size();
  for (auto& sl : slots_)
    if (sl.projected) sl.seed = layerwise_ ? 1 : ++number;
  full_before_.push_back(full_params.size());
  low_before_.push_back(low_params.size());
  int64_t largest = 0;
  for (const auto& [n, t] : low_params) largest = std::max(largest, t->numel());
  if (largest > 0) scratch_ = ops::empty({largest}, DType::f32, low_params.front().second->device());
  if (largest > 0 && kind_ == Kind::apollo) {
    const Device d = scratch_.device();
    square_scratch_ = ops::empty({largest}, DType::f32, d);
    grad_stats_ = ops::empty({2}, DType::f64, d);
    int64_t side = 1;
    for (const auto& sl : slots_)
      if (sl.projected) side = std::max({side, sl.param->shape()[0], sl.param->shape()[1]});
    apollo_channels_ = ops::empty({2 * side}, DType::f32, d);
    for (int i = 0; i < 3; ++i) apollo_scalars_.push_back(ops::empty({}, DType::f32, d));
  }
  TR_CHECK(params.empty() || !low_params.empty(),
           "--optim {}: no linear layer matches --optim_target_modules '{}' (the model's linear layers are "
           "e.g. {}); give a regex of whole module names, all-linear, or a JSON list",
           name, opts_.target_modules,
           opts_.linear_weights.empty() ? std::string("none")
                                        : fmt::format("'{}'", module_of(opts_.linear_weights.front())));

  full_ = make_inner(full_params, weight_decay_, false);
  low_ = make_inner(low_params, 0.0, true);
}

void GaLore::parse_args(const std::string& name) {
  detail::OptimArgs args(name, opts_.args);
  rank_ = static_cast<int64_t>(args.number("rank", 128));
  gap_ = static_cast<int64_t>(args.number("update_proj_gap", 200));
  scale_ = args.number("scale", kind_ == Kind::apollo ? 1.0 : 0.25);
  proj_ = parse_projection(name, args.text("proj_type", "std"));
  if (kind_ == Kind::apollo) {
    const std::string proj = args.text("proj", "random"), scale_type = args.text("scale_type", "channel");
    TR_CHECK(proj == "random" || proj == "svd", "--optim_args: {} proj='{}' is not one of random, svd", name,
             proj);
    TR_CHECK(scale_type == "channel" || scale_type == "tensor",
             "--optim_args: {} scale_type='{}' is not one of channel, tensor", name, scale_type);
    random_ = proj == "random";
    channel_ = scale_type == "channel";
    TR_CHECK(proj_ != GaloreProjection::full || (!random_ && !channel_),
             "--optim_args: {} proj_type=full: apollo_torch's random projector implements std, reverse_std, "
             "right and left, and channel factors need one side; full takes proj=svd with scale_type=tensor",
             name);
  }
  args.check_all_used();
  TR_CHECK(rank_ >= 1, "--optim_args: {} rank={} must be at least 1", name, rank_);
  TR_CHECK(gap_ >= 1, "--optim_args: {} update_proj_gap={} must be at least 1", name, gap_);
  TR_CHECK(std::isfinite(scale_) && (kind_ != Kind::apollo || scale_ >= 0),
           "--optim_args: {} scale={} must be a finite number{}", name, scale_,
           kind_ == Kind::apollo ? " >= 0 (APOLLO takes its square root)" : "");
}

// The side the basis multiplies, the basis and the low-rank stand-in of one projected weight.
void GaLore::allocate_projection(Slot& s) const {
  const Tensor& p = *s.param;
  const int64_t m = p.shape()[0], n = p.shape()[1];
  // A random basis may have more rows than the gradient has (apollo_torch draws rank x n whatever n is).
  const int64_t r = random_ ? rank_ : std::min(rank_, std::min(m, n));
  const bool tall = m >= n;
  s.right = proj_ == GaloreProjection::right || (proj_ == GaloreProjection::std_side && tall) ||
            (proj_ == GaloreProjection::reverse_std && !tall);
  Shape low;
  if (proj_ == GaloreProjection::full) {
    s.ortho = ops::zeros({m, r}, DType::f32, p.device());
    s.ortho_right = ops::zeros({r, n}, DType::f32, p.device());
    low = {r, r};
  } else if (s.right) {
    s.ortho = ops::zeros({r, n}, DType::f32, p.device());  // Vh[:rank]
    low = {m, r};
  } else {
    s.ortho = ops::zeros({m, r}, DType::f32, p.device());  // U[:, :rank]
    low = {r, n};
  }
  s.buffer = ops::zeros(low, DType::f32, p.device());
  if (kind_ == Kind::apollo) {
    // Channel factors are norms over the projected side: they fit the weight only on the std side.
    TR_CHECK(!channel_ || (proj_ != GaloreProjection::full && s.right == (m >= n)),
             "--optim_args: apollo_adamw scale_type=channel with proj_type {}: the channel factors of '{}' "
             "({} x {}) need the projection on its {} side (proj_type std), where apollo_torch's broadcast "
             "holds; use proj_type=std or scale_type=tensor",
             s.right ? "right" : "left", s.name, m, n, m >= n ? "right" : "left");
    s.last_norm = ops::zeros({}, DType::f32, p.device());
  }
}

// An inner optimizer with galore_torch's defaults (HF passes the learning rate alone); every parameter in one
// group, so HF's decay groups do not apply. The stand-ins take no decay: it is applied to the weight after
// the update is projected back.
std::unique_ptr<Optimizer> GaLore::make_inner(const nn::ParamList& params, double weight_decay,
                                              bool targets) const {
  OptimizerOptions o;
  o.lr = opts_.lr;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = kind_ == Kind::adamw || kind_ == Kind::apollo ? 1e-6 : 1e-8;
  o.decay_all = true;
  o.weight_decay = weight_decay;
  if (kind_ == Kind::apollo && targets) {  // HF hands APOLLO's target group the --adam_* values
    o.beta1 = opts_.beta1;
    o.beta2 = opts_.beta2;
    o.eps = opts_.eps;
    o.lr = 1.0;  // the stand-ins' update gives APOLLO its scaling factors at any rate (apollo.cpp)
  }
  if (kind_ == Kind::adamw || kind_ == Kind::apollo) return std::make_unique<GaloreAdamW>(params, o);
  if (kind_ == Kind::adamw_8bit) return std::make_unique<AdamW8bit>(params, o);
  return std::make_unique<Adafactor>(params, o);
}

void GaLore::set_lr(double lr) {
  Optimizer::set_lr(lr);
  full_->set_lr(lr);
  if (kind_ != Kind::apollo) low_->set_lr(lr);
}

// get_orthogonal_matrix: torch.linalg.svd(grad, full_matrices=False); right: Vh[:rank], left: U[:, :rank],
// written straight into the basis (no factor of the gradient's size is allocated).
void GaLore::refresh_basis(Slot& s, const Tensor& grad) {
  try {
    if (proj_ == GaloreProjection::full)
      ops::svd_into(grad, s.ortho, s.ortho_right);
    else if (s.right)
      ops::svd_into(grad, Tensor(), s.ortho);
    else
      ops::svd_into(grad, s.ortho, Tensor());
  } catch (const Error& e) {
    fail("GaLore: the projection of '{}' at step {}: {}", s.name, low_->step_count(), e.what());
  }
  s.has_basis = true;
}

// low = project(grad): grad @ Vh[:r]^T (right), U[:, :r]^T @ grad (left), U^T @ grad @ Vh^T (full).
void GaLore::project_into(const Slot& s, const Tensor& g, const Tensor& low) const {
  if (proj_ == GaloreProjection::full)
    ops::matmul_into(low, ops::matmul(s.ortho, g, /*trans_a=*/true, false), s.ortho_right, false,
                     /*trans_b=*/true, 1.0, 0.0);
  else if (s.right)
    ops::matmul_into(low, g, s.ortho, false, /*trans_b=*/true, 1.0, 0.0);
  else
    ops::matmul_into(low, s.ortho, g, /*trans_a=*/true, false, 1.0, 0.0);
}

// p += project_back(low) * scale, the product accumulated into the weight (no update tensor of its size).
void GaLore::add_projected_back(const Slot& s, const Tensor& low) const {
  Tensor& p = *s.param;
  if (proj_ == GaloreProjection::full)
    ops::addmm_(p, ops::matmul(s.ortho, low), s.ortho_right, false, false, scale_, 1.0);
  else if (s.right)
    ops::addmm_(p, low, s.ortho, false, false, scale_, 1.0);
  else
    ops::addmm_(p, s.ortho, low, false, false, scale_, 1.0);
}

// One projected weight at a time, its low-rank gradient in the shared scratch: a step allocates nothing
// (under torch_compile nothing beside the arena; the SVD's factors live in LAPACK's host scratch).
void GaLore::step_params(size_t lo, size_t hi, bool advance) {
  full_->step_params(full_before_[lo], full_before_[hi], advance);
  if (advance) low_->step_params(0, 0, true);  // the step count, advanced once per step
  // The step count each projected weight's state had before this update (galore_torch's state["step"]).
  const int64_t before = low_->step_count() - 1;
  for (size_t i = lo; i < hi; ++i) {
    Slot& s = slots_[i];
    if (!s.projected) continue;
    const Tensor g = detail::gradient("GaLore", s.name, *s.param);
    if (!g.defined()) continue;
    if (!s.has_basis || before % gap_ == 0) {
      if (random_)
        random_basis(s);
      else
        refresh_basis(s, g);
    }
    const Tensor low = ops::view(ops::narrow(scratch_, 0, 0, s.buffer.numel()), s.buffer.shape());
    project_into(s, g, low);
    ops::fill_(s.buffer, 0.0);
    autograd::set_grad(s.buffer, low);
    low_->step_params(low_before_[i], low_before_[i] + 1, false);
    autograd::zero_grad(s.buffer);
    apply_update(s, g, low);
  }
}

// The stand-in now holds the low-rank update: GaLore adds it projected back; APOLLO scales the gradient by
// it.
void GaLore::apply_update(Slot& s, const Tensor& g, const Tensor& low) {
  if (kind_ == Kind::apollo) {
    apollo_update(s, g, low);
    return;
  }
  Tensor& p = *s.param;
  // p.add_(p, alpha=-lr * weight_decay), in place: p * (1 - lr * weight_decay)
  const auto decay = [&] {
    if (weight_decay_ > 0)
      ops::binary_(ops::BinaryOp::mul, p,
                   ops::full({}, 1.0 - opts_.lr * weight_decay_, p.dtype(), p.device()));
  };
  if (kind_ == Kind::adafactor) decay();  // GaLoreAdafactor decays before adding the update
  add_projected_back(s, s.buffer);
  if (kind_ != Kind::adafactor) decay();
}

std::vector<std::pair<std::string, Tensor>> GaLore::state_dict() const {
  auto out = full_->state_dict();
  for (auto& e : low_->state_dict())
    if (e.first != "step") out.push_back(std::move(e));
  for (const auto& s : slots_) {
    if (!s.projected) continue;
    out.emplace_back("galore_ortho." + s.name, s.ortho);
    if (s.ortho_right.defined()) out.emplace_back("galore_ortho_right." + s.name, s.ortho_right);
    if (kind_ == Kind::apollo) {
      out.emplace_back("apollo_seed." + s.name,
                       ops::from_vector<int64_t>({static_cast<int64_t>(s.seed)}, {}, Device::cpu()));
      out.emplace_back("apollo_scaled_grad." + s.name, s.last_norm);
    }
  }
  return out;
}

void GaLore::load_state_dict(const std::map<std::string, Tensor>& state) {
  for (auto& s : slots_) {
    if (!s.projected) continue;
    detail::load_entry(state, "galore_ortho." + s.name, s.ortho, "GaLore");
    if (s.ortho_right.defined())
      detail::load_entry(state, "galore_ortho_right." + s.name, s.ortho_right, "GaLore");
    if (kind_ == Kind::apollo) {
      const Tensor& seed = detail::state_entry(state, "apollo_seed." + s.name, "APOLLO");
      TR_CHECK(seed.numel() == 1 && seed.dtype() == DType::i64,
               "APOLLO state: 'apollo_seed.{}' is {}, expected "
               "one int64",
               s.name, seed.describe());
      s.seed = static_cast<uint64_t>(ops::to_vector<int64_t>(seed)[0]);
      detail::load_entry(state, "apollo_scaled_grad." + s.name, s.last_norm, "APOLLO");
      s.has_norm = true;
    }
    s.has_basis = true;
  }
  full_->load_state_dict(state);
  low_->load_state_dict(state);
}

int64_t GaLore::state_bytes() const {
  int64_t n = Optimizer::state_bytes();
  for (const Tensor* t : {&scratch_, &square_scratch_, &grad_stats_, &apollo_channels_})
    if (t->defined()) n += static_cast<int64_t>(t->nbytes());
  for (const Tensor& t : apollo_scalars_) n += static_cast<int64_t>(t.nbytes());
  for (const auto& s : slots_)
    if (s.projected) n += static_cast<int64_t>(s.buffer.nbytes());
  return n;
}

std::vector<std::string> GaLore::projected() const {
  std::vector<std::string> out;
  for (const auto& s : slots_)
    if (s.projected) out.push_back(s.name);
  return out;
}

}  // namespace tr::optim
