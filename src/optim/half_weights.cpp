// HalfWeights: an f32 optimizer stepping half-precision weights through short-lived f32 stand-ins.
#include "optim/half_weights.h"

#include "autograd/node.h"
#include "ops/ops.h"

namespace tr::optim {

namespace {

// An f32 tensor of `like`'s shape on its device that holds no memory: what the inner optimizer sees between
// updates (its state is sized and placed from it).
Tensor stand_in(const Tensor& like) {
  auto impl = std::make_shared<TensorImpl>();
  const size_t bytes = static_cast<size_t>(like.numel()) * dtype_size(DType::f32);
  impl->storage = std::make_shared<Storage>(bytes, ops::allocator_for(like.device()), Storage::Released{});
  impl->shape = like.shape();
  impl->strides = contiguous_strides(like.shape());
  impl->dtype = DType::f32;
  return Tensor(std::move(impl));
}

}  // namespace

HalfWeights::HalfWeights(const nn::ParamList& params, const OptimizerOptions& opts,
                         const std::function<std::unique_ptr<Optimizer>(const nn::ParamList&)>& make)
    : Optimizer(params, opts) {
  wide_.reserve(params.size());  // the inner optimizer keeps pointers into wide_
  nn::ParamList inner;
  for (const auto& [name, p] : params) {
    TR_CHECK(p->dtype() == DType::bf16 || p->dtype() == DType::f16,
             "optimizer over half weights: parameter '{}' is {}, expected bf16 or f16", name,
             dtype_name(p->dtype()));
    TR_CHECK(p->is_contiguous(), "optimizer over half weights: parameter '{}' must be contiguous", name);
    wide_.push_back(stand_in(*p));
    inner.emplace_back(name, &wide_.back());
  }
  inner_ = make(inner);
}

void HalfWeights::set_lr(double lr) {
  Optimizer::set_lr(lr);
  inner_->set_lr(lr);
}

void HalfWeights::load_state_dict(const std::map<std::string, Tensor>& state) {
  inner_->load_state_dict(state);
}

void HalfWeights::step_params(size_t lo, size_t hi, bool advance) {
  constexpr int64_t kBudget = int64_t{16} << 20;
  const auto bytes_of = [&](size_t i) { return params_[i].second->numel() * int64_t{8}; };  // f32 p and g
  for (size_t a = lo; a < hi;) {
    size_t b = a;
    for (int64_t bytes = 0; b < hi && (b == a || bytes + bytes_of(b) <= kBudget); ++b) bytes += bytes_of(b);
    std::vector<bool> widened(b - a);
    for (size_t i = a; i < b; ++i) {
      const Tensor& p = *params_[i].second;
      const Tensor g = p.grad();
      if (!g.defined()) continue;  // the stand-in has no gradient either: skipped, as torch skips it
      widened[i - a] = true;
      wide_[i] = ops::to_dtype(p, DType::f32);
      autograd::set_grad(wide_[i], ops::to_dtype(ops::contiguous(g), DType::f32));
    }
    inner_->step_params(a, b, advance && a == lo);
    for (size_t i = a; i < b; ++i) {
      if (!widened[i - a]) continue;
      ops::copy_(*params_[i].second, wide_[i]);  // the one rounding of the update, to nearest even
      wide_[i] = stand_in(wide_[i]);             // the f32 weight and gradient go now
    }
    a = b;
  }
}

}  // namespace tr::optim
