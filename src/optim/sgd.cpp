// SGD in the operation order of torch.optim.SGD's single-tensor implementation: one in-place pass per
// tensor (ops::sgd; the element math is backend/optim_math.h's, the same bits on every backend).
#include "optim/sgd.h"

#include "ops/ops.h"
#include "optim/common.h"

namespace tr::optim {

SGD::SGD(const nn::ParamList& params, OptimizerOptions opts) : Optimizer(params, std::move(opts)) {
  detail::check_params("SGD", params, {DType::f32, DType::f64}, /*any_device=*/true);
  detail::OptimArgs args("sgd", opts_.args);
  momentum_ = args.number("momentum", 0.0);
  dampening_ = args.number("dampening", 0.0);
  nesterov_ = args.flag("nesterov", false);
  args.check_all_used();
  // torch.optim.SGD's own argument checks
  TR_CHECK(opts_.lr >= 0, "sgd: invalid learning rate {}", opts_.lr);
  TR_CHECK(momentum_ >= 0, "sgd: invalid momentum {}", momentum_);
  TR_CHECK(opts_.weight_decay >= 0, "sgd: invalid weight_decay {}", opts_.weight_decay);
  TR_CHECK(!nesterov_ || (momentum_ > 0 && dampening_ == 0),
           "sgd: Nesterov momentum requires a momentum and zero dampening (momentum={}, dampening={})",
           momentum_, dampening_);
  for (const auto& [name, p] : params) slots_.push_back({name, p, Tensor(), decays_param(name)});
}

void SGD::step_params(size_t lo, size_t hi, bool advance) {
  if (advance) ++step_;
  std::vector<backend::Backend::SgdTensors> tensors;
  std::vector<Slot*> made;  // their new momentum buffers are kept once the pass has written them
  for (size_t i = lo; i < hi; ++i) {
    Slot& s = slots_[i];
    const Tensor g = detail::gradient("SGD", s.name, *s.param);
    if (!g.defined()) continue;  // as torch: parameters without a gradient are skipped
    const bool first = momentum_ != 0 && !s.momentum_buffer.defined();
    const Tensor buf =
        first ? ops::empty(s.param->shape(), s.param->dtype(), s.param->device()) : s.momentum_buffer;
    if (first) made.push_back(&s);
    tensors.push_back({*s.param, ops::contiguous(g), buf, s.decay ? opts_.weight_decay : 0.0, first});
  }
  ops::sgd(tensors, {opts_.lr, momentum_, dampening_, nesterov_});
  for (size_t i = 0, k = 0; i < tensors.size() && k < made.size(); ++i)
    if (tensors[i].first) made[k++]->momentum_buffer = tensors[i].momentum_buffer;
}

std::vector<std::pair<std::string, Tensor>> SGD::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(step_)}};
  for (const auto& s : slots_)
    if (s.momentum_buffer.defined()) out.emplace_back("momentum_buffer." + s.name, s.momentum_buffer);
  return out;
}

void SGD::load_state_dict(const std::map<std::string, Tensor>& state) {
  const int64_t step = detail::load_step(state, "SGD");
  for (auto& s : slots_) {
    const std::string key = "momentum_buffer." + s.name;
    if (!state.count(key)) {
      s.momentum_buffer = Tensor();
      continue;
    }
    TR_CHECK(momentum_ != 0, "SGD state: '{}' is present but this SGD has no momentum", key);
    s.momentum_buffer = ops::empty(s.param->shape(), s.param->dtype(), s.param->device());
    detail::load_entry(state, key, s.momentum_buffer, "SGD");
  }
  step_ = step;
}

}  // namespace tr::optim
