// Master weights, the gradients and weight copies the optimizer works through, and the dynamic loss scaler;
// see mixed_precision.h.
#include "train/mixed_precision.h"

#include <algorithm>
#include <limits>

#include "autograd/node.h"
#include "core/error.h"
#include "core/json_fields.h"
#include "ops/ops.h"

namespace tr::train {

namespace {

// DeepSpeed's DynamicLossScaler.update_scale, step for step.
void update_deepspeed(double& scale, DeepSpeedScaling& d, bool overflow) {
  if (!d.dynamic) return;  // a static scale: the step is skipped, the scale kept
  if (overflow) {
    if (d.hysteresis == 1 || d.cur_hysteresis == 1) {
      TR_CHECK(
          scale != d.min_scale,
          "fp16: gradients overflowed at the minimum loss scale ({}): DeepSpeed's \"Current loss scale "
          "already at minimum - cannot decrease scale anymore. Exiting run.\" (lower fp16.min_loss_scale "
          "in the --deepspeed config, or train with --bf16)",
          scale);
      scale = std::max(scale / 2.0, d.min_scale);
    } else {
      --d.cur_hysteresis;
    }
    d.last_overflow_iter = d.cur_iter;
  } else {
    if (d.consecutive_hysteresis) d.cur_hysteresis = d.hysteresis;
    if ((d.cur_iter - d.last_overflow_iter) % d.window == 0) {
      if (!d.consecutive_hysteresis) d.cur_hysteresis = d.hysteresis;
      scale *= 2.0;
    }
  }
  ++d.cur_iter;
}

}  // namespace

void GradScaler::update(bool found_inf) {
  if (deepspeed) return update_deepspeed(scale, *deepspeed, found_inf);
  if (found_inf) {
    scale *= backoff_factor;
    growth_tracker = 0;
  } else if (++growth_tracker == growth_interval) {
    scale *= growth_factor;
    growth_tracker = 0;
  }
}

nlohmann::json GradScaler::to_json() const {
  if (deepspeed) {  // DeepSpeed's loss scaler state (its checkpoints keep the same names)
    const DeepSpeedScaling& d = *deepspeed;
    return {{"cur_scale", scale},
            {"dynamic", d.dynamic},
            {"scale_window", d.window},
            {"delayed_shift", d.hysteresis},
            {"consecutive_hysteresis", d.consecutive_hysteresis},
            {"min_scale", d.min_scale},
            {"cur_hysteresis", d.cur_hysteresis},
            {"cur_iter", d.cur_iter},
            {"last_overflow_iter", d.last_overflow_iter}};
  }
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
  // A run under --deepspeed reads DeepSpeed's state; its configuration (set by the run) must be the saved
  // one.
  if (deepspeed || f["cur_scale"].exists()) {
    TR_CHECK(
        deepspeed.has_value(),
        "{}: DeepSpeed's loss scaler state, but this run has no --deepspeed fp16 config (resume with the "
        "saved run's --deepspeed)",
        source);
    TR_CHECK(f["cur_scale"].exists(),
             "{}: torch's GradScaler state, but this run scales the loss as DeepSpeed's fp16 config says "
             "(resume without --deepspeed, as the saved run trained)",
             source);
    DeepSpeedScaling& d = *deepspeed;
    scale = f["cur_scale"].number(std::numeric_limits<float>::min(), kMaxF32);
    const auto same = [&](const char* key, const nlohmann::json& now) {
      if (f[key].raw() != now)
        f[key].fail("is {}, but the --deepspeed config now says {}: resume with the saved run's config",
                    f[key].raw().dump(), now.dump());
    };
    same("dynamic", d.dynamic);
    same("scale_window", d.window);
    same("delayed_shift", d.hysteresis);
    same("consecutive_hysteresis", d.consecutive_hysteresis);
    same("min_scale", d.min_scale);
    d.cur_hysteresis = f["cur_hysteresis"].integer(1, d.hysteresis);
    d.cur_iter = f["cur_iter"].integer(0, kMaxJsonCounter);
    d.last_overflow_iter = f["last_overflow_iter"].integer(-1, d.cur_iter - 1);
    return;
  }
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
                               bool sharded_masters, bool half_weights)
    : model_(model_params), half_(half), scaling_(loss_scaling), half_weights_(half_weights) {
  TR_CHECK(half == DType::f32 || half == DType::bf16 || half == DType::f16,
           "mixed precision: compute dtype must be f32, bf16 or f16, got {}", dtype_name(half));
  TR_CHECK(!loss_scaling || half != DType::f32, "mixed precision: loss scaling needs a half compute dtype");
  if (half_weights) {
    TR_CHECK(is_half(half) && !loss_scaling && !sharded_masters,
             "mixed precision: half weights need a half dtype, no loss scaling and no sharded masters");
    for (auto& [name, p] : model_) {
      if (p->dtype() == half) continue;
      Tensor h = ops::to_dtype(*p, half);  // a fresh f32 model: HF's model.to(dtype)
      autograd::set_requires_grad(h, true);
      *p = h;
    }
    master_list_ = model_;
    return;
  }
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
