// Master weights, the gradients and weight copies the optimizer works through, and the dynamic loss scaler;
// see mixed_precision.h.
#include "train/mixed_precision.h"

#include <limits>

#include "autograd/node.h"
#include "core/error.h"
#include "core/json_fields.h"
#include "ops/ops.h"

namespace tr::train {

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    scale *= backoff_factor;
    growth_tracker = 0;
  } else if (++growth_tracker == growth_interval) {
    scale *= growth_factor;
    growth_tracker = 0;
  }
}

nlohmann::json GradScaler::to_json() const {
  return {{"scale", scale},
          {"growth_factor", growth_factor},
          {"backoff_factor", backoff_factor},
          {"growth_interval", growth_interval},
          {"_growth_tracker", growth_tracker}};
}

void GradScaler::load_json(const nlohmann::json& j, const std::string& source) {
  // The ranges torch's GradScaler accepts; the scale also multiplies f32 losses, so it must be a finite f32.
  const JsonField f(j, source);
  constexpr double kMaxF32 = std::numeric_limits<float>::max();
  // At least the smallest normal f32: the scale multiplies the loss in f32, and a smaller one rounds to zero.
  scale = f["scale"].number(std::numeric_limits<float>::min(), kMaxF32);
  growth_factor = f["growth_factor"].number(1.0, kMaxF32, Bounds::open_low);
  backoff_factor = f["backoff_factor"].number(0.0, 1.0, Bounds::open);
  growth_interval = f["growth_interval"].integer(1, std::numeric_limits<int32_t>::max());
  growth_tracker = f["_growth_tracker"].integer(0, growth_interval - 1);
}

namespace {

// A meta tensor of `shape` over borrowed, empty storage: names a shape, counted by no allocator (a dry run's
// meta allocator included), so a sharded run's placeholders cost nothing anywhere.
Tensor shape_only(const Shape& shape) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(nullptr, 0, Device::meta(), nullptr);
  impl->shape = shape;
  impl->strides.assign(shape.size(), 0);
  impl->dtype = DType::f32;
  return Tensor(std::move(impl));
}

}  // namespace

MixedPrecision::MixedPrecision(const nn::ParamList& model_params, DType half, bool loss_scaling,
                               bool sharded_masters)
    : model_(model_params), half_(half), scaling_(loss_scaling) {
  TR_CHECK(half == DType::f32 || half == DType::bf16 || half == DType::f16,
           "mixed precision: compute dtype must be f32, bf16 or f16, got {}", dtype_name(half));
  TR_CHECK(!loss_scaling || half != DType::f32, "mixed precision: loss scaling needs a half compute dtype");
  if (half == DType::f32) {
    master_list_ = model_;
    return;
  }
  masters_.reserve(model_.size());  // master_list_ points into masters_: no reallocation after this
  for (auto& [name, p] : model_) {
    // Sharded, the parameter may be its half copy already (build_shard made it from the shard's source).
    const bool made = sharded_masters && p->dtype() == half;
    TR_CHECK(p->dtype() == DType::f32 || made, "mixed precision: parameter '{}' must start in f32, got {}",
             name, dtype_name(p->dtype()));
    masters_.push_back(sharded_masters ? shape_only(p->shape()) : *p);
    if (made) continue;
    Tensor h = ops::to_dtype(*p, half);
    autograd::set_requires_grad(h, true);
    *p = h;  // sharded: the fp32 tensor's last reference goes here
  }
  sharded_ = sharded_masters;
  for (size_t i = 0; i < model_.size(); ++i) master_list_.emplace_back(model_[i].first, &masters_[i]);
}

void MixedPrecision::begin_step(int64_t micro_batches) {
  if (!enabled() || micro_batches <= 1) return;
  for (auto& [name, p] : model_) autograd::set_grad(*p, ops::zeros(p->shape(), DType::f32, p->device()));
}

std::vector<Tensor> MixedPrecision::model_grads() const {
  std::vector<Tensor> out;
  out.reserve(model_.size());
  for (const auto& [name, p] : model_) out.push_back(p->grad());
  return out;
}

std::vector<Tensor> MixedPrecision::weight_copies() const {
  std::vector<Tensor> out;
  if (!enabled()) return out;
  out.reserve(model_.size());
  for (const auto& [name, p] : model_) out.push_back(*p);
  return out;
}

void MixedPrecision::after_step(bool found_inf) {
  if (scaling_) scaler_.update(found_inf);
  for (auto& [name, p] : model_) autograd::zero_grad(*p);
  for (auto& m : masters_) autograd::zero_grad(m);
}

void MixedPrecision::shard_masters() {
  TR_CHECK(enabled(), "mixed precision: fp32 training has no separate masters to shard");
  for (auto& m : masters_) m = shape_only(m.shape());
  sharded_ = true;
}

}  // namespace tr::train
