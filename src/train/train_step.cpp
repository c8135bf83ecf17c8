// The eager training step; see train_step.h.
#include "train/train_step.h"

#include <cmath>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/allocator.h"
#include "ops/ops.h"

namespace tr::train {

int64_t count_label_tokens(const Tensor& labels) {
  TR_CHECK(labels.dim() == 2 && labels.dtype() == DType::i64,
           "count_label_tokens: labels must be int64 [B, T]");
  Tensor l = ops::contiguous(ops::to_device(labels, Device::cpu()));  // a GPU batch: one small copy
  const int64_t* d = l.data<int64_t>();
  const int64_t B = l.size(0), T = l.size(1);
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 1; t < T; ++t) n += d[b * T + t] != -100;
  return n;
}

namespace {

// Reads a small device tensor on the host (the one synchronization of a step).
std::vector<double> host_values(const Tensor& t) {
  Tensor h = ops::contiguous(ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f64));
  return {h.data<double>(), h.data<double>() + h.numel()};
}

class EagerStep final : public TrainStep {
 public:
  EagerStep(StepState s, StepOptions o) : s_(s), o_(std::move(o)), params_(s.model.named_parameters()) {}

  StepResult run(int64_t step, const std::vector<data::Batch>& micro, double lr) override {
    StepResult r;
    const Tensor loss = forward_backward(step, micro, r);
    if (o_.after_backward) o_.after_backward(step, params_);
    update(lr, r);
    r.loss = loss.defined() ? host_values(loss)[0] : 0.0;
    return r;
  }

 private:
  // Every micro-batch's forward and backward; returns the step's loss summed on the device (f64), so the
  // host reads it once per step, not once per micro-batch.
  Tensor forward_backward(int64_t step, const std::vector<data::Batch>& micro, StepResult& r) {
    // num_items_in_batch: label tokens of the whole step (accumulation-exact normalization).
    double items = 0;
    for (const auto& b : micro)
      items += static_cast<double>(count_label_tokens(b.host_labels.defined() ? b.host_labels : b.labels));
    Tensor sum;
    s_.mp.begin_step(static_cast<int64_t>(micro.size()));
    for (const auto& b : micro) {
      if (o_.on_micro_batch) o_.on_micro_batch(step, b.input_ids);
      models::ForwardOptions fo;
      fo.labels = b.labels;
      fo.num_items_in_batch = items;
      fo.return_logits = false;
      fo.gradient_checkpointing = o_.gradient_checkpointing;
      fo.training = true;
      fo.dropout_gen = &s_.dropout_gen;
      Tensor loss = s_.model.forward(b.input_ids, fo).loss;
      if (o_.torch_empty_cache_steps > 0 && (step + 1) % o_.torch_empty_cache_steps == 0 &&
          &b == &micro.front())
        empty_cache(r);
      if (s_.mp.loss_scaling())
        autograd::backward({loss}, {ops::full({}, s_.mp.loss_scale(), DType::f32, o_.device)});
      else
        autograd::backward({loss});
      autograd::NoGradGuard no_grad;
      Tensor l = ops::to_dtype(detach(loss), DType::f64);
      sum = sum.defined() ? ops::binary(backend::BinaryOp::add, sum, l) : l;
      r.tokens += b.input_ids.numel();
    }
    return sum;
  }

  // HF's point: after the forward, before the backward (the activations stay, the cache goes).
  void empty_cache(StepResult& r) {
    const int64_t cached = o_.device.is_cpu() ? static_cast<int64_t>(cpu_allocator().cached_bytes()) : 0;
    ops::allocator_for(o_.device).empty_cache();
    ++r.cache_releases;
    r.cache_bytes_released += cached;
  }

  // Unscale, global norm, clip and the fp16 inf check without a host sync per tensor: one statistics pass
  // over the model's gradients (half under mixed precision), then the optimizer reads them through the
  // transform (AdamW: unscale, clip, update and the half weight copy in one pass).
  void update(double lr, StepResult& r) {
    const std::vector<Tensor> grads = s_.mp.model_grads();
    const double inv_scale = 1.0 / s_.mp.loss_scale();
    const Tensor stats = ops::grad_stats(grads, inv_scale, o_.device);
    const backend::Backend::GradTransform transform{inv_scale, o_.max_grad_norm, stats};
    std::vector<double> host_stats;
    if (s_.mp.loss_scaling()) {  // the skip decision is the host's (torch's GradScaler syncs here as well)
      host_stats = host_values(stats);
      r.skipped = host_stats[1] != 0;
    }
    if (!r.skipped) {  // fp16 overflow skips the update and lowers the scale (torch's GradScaler)
      s_.opt.set_lr(lr);
      s_.opt.step(grads, transform, s_.mp.weight_copies());
    }
    s_.opt.zero_grad();
    s_.mp.after_step(r.skipped);
    if (host_stats.empty()) host_stats = host_values(stats);
    r.grad_norm = std::sqrt(host_stats[0]);
  }

  StepState s_;
  StepOptions o_;
  nn::ParamList params_;
};

}  // namespace

std::unique_ptr<TrainStep> make_eager_step(StepState state, StepOptions options) {
  return std::make_unique<EagerStep>(state, std::move(options));
}

}  // namespace tr::train
