// The shared parts of the eager and compiled steps; see step_core.h.
#include "train/step_core.h"

#include <chrono>
#include <tuple>
#include <cmath>
#include <optional>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/allocator.h"
#include "ops/ops.h"
#include "optim/galore.h"
#include "train/zero3.h"

namespace tr::train {

std::vector<double> host_values(const Tensor& t) {
  // A dry run (`trainer estimate`) has no values: its statistics read as zeros (no skip, no clipping).
  if (t.device().is_meta()) return std::vector<double>(static_cast<size_t>(t.numel()), 0.0);
  Tensor h = ops::contiguous(ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f64));
  return {h.data<double>(), h.data<double>() + h.numel()};
}

double step_label_tokens(const std::vector<data::Batch>& micro) {
  double items = 0;
  for (const auto& b : micro) {
    if (!b.host_labels.defined() && b.labels.device().is_meta()) {  // a dry run: packed blocks, no -100
      items += static_cast<double>(b.labels.size(0) * (b.labels.size(1) - 1));
      continue;
    }
    items += static_cast<double>(count_label_tokens(b.host_labels.defined() ? b.host_labels : b.labels));
  }
  return items;
}

StepCore::StepCore(StepState s, StepOptions o, bool overlap)
    : s_(s),
      o_(std::move(o)),
      params_(s.model.named_parameters()),
      zero_(dynamic_cast<ShardedOptimizer*>(&s.opt)),
      full_(s.full_shard),
      overlap_(overlap) {
  TR_CHECK(!full_ || (zero_ && zero_->stage() == 3 && overlap_),
           "--fsdp full_shard: the step needs the stage-3 sharded optimizer and the eager step");
  if (o_.group != nullptr && zero_ == nullptr)
    reducer_ = std::make_unique<GradReducer>(*o_.group, o_.ddp_bucket_cap_bytes);
  if (s_.opt.updates_in_backward()) {
    TR_CHECK(o_.group == nullptr && !full_ && !zero_ && !s_.mp.loss_scaling(),
             "train step: an optimizer that updates during backward runs alone, without fp16 loss scaling");
    TR_CHECK(s_.opt.num_params() == params_.size(), "train step: {} parameters, the optimizer has {}",
             params_.size(), s_.opt.num_params());
    for (size_t i = 0; i < params_.size(); ++i) param_index_[params_[i].second->impl_ptr().get()] = i;
    layerwise_ = dynamic_cast<const optim::GaLore*>(&s_.opt) != nullptr;
  }
}

// Parameter `leaf`'s gradient is final: its update now, its gradient counted into the step's norm and
// dropped (the memory these optimizers save).
void StepCore::update_in_backward(const TensorImpl* leaf) {
  const auto it = param_index_.find(leaf);
  if (it == param_index_.end()) return;  // not a parameter of the model (an input that requires grad)
  Tensor& p = *params_[it->second].second;
  const Tensor g = p.grad();
  if (!g.defined()) return;
  Tensor* stats = nullptr;
  for (Tensor& t : backward_stats_)
    if (t.device() == g.device()) stats = &t;
  if (stats == nullptr) stats = &backward_stats_.emplace_back(ops::zeros({2}, DType::f64, g.device()));
  ops::grad_stats_add(ops::contiguous(g), 1.0, *stats);
  s_.opt.step_in_backward(it->second, g, backend::Backend::GradTransform{},
                          copies_.empty() ? Tensor() : copies_[it->second], first_update_);
  first_update_ = false;
  autograd::zero_grad(p);
}

void StepCore::load_step_scalars(double items) {
  if (!inv_items_.defined()) {  // at the first step, as `trainer estimate` counts them (not in the set-up)
    const Device head = s_.model.placement().head;  // where the loss is computed
    inv_items_ = ops::empty({}, DType::f64, head);
    seed_ = ops::empty({}, DType::f32, head);
  }
  ops::fill_(inv_items_, items > 0 ? 1.0 / items : 0.0);  // no label at all: loss 0, gradient 0
  ops::fill_(seed_, s_.mp.loss_scale());
}

std::pair<double, double> StepCore::zero_thread_seconds() {
  return {zero_->comm_seconds() + (full_ ? full_->comm_seconds() : 0),
          zero_->blocked_seconds() + (full_ ? full_->blocked_seconds() : 0)};
}

double StepCore::label_tokens(const std::vector<data::Batch>& micro) {
  double items = step_label_tokens(micro);
  if (o_.group != nullptr) {  // this step's traffic starts here
    bytes_at_start_ = o_.group->stats().bytes;
    seconds_at_start_ = o_.group->stats().seconds;
    if (zero_) std::tie(zero_comm_at_start_, zero_blocked_at_start_) = zero_thread_seconds();
  }
  if (o_.group != nullptr && !o_.average_tokens_across_devices) {
    // Each rank's loss is its own mean: the step averages over the ranks that had data (a rank past the
    // epoch's last sample has none), so the epoch's last step is not scaled down.
    double active = items > 0 ? 1 : 0;
    o_.group->all_reduce_sum(&active, 1);
    active_ranks_ = std::max(1.0, active);
    grad_scale_ = 1.0 / active_ranks_;
    if (reducer_) reducer_->set_scale(grad_scale_);
  }
  if (o_.group != nullptr && o_.average_tokens_across_devices) {
    const auto t0 = std::chrono::steady_clock::now();
    o_.group->all_reduce_sum(&items, 1);
    wait_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return items;
}

Tensor StepCore::forward_backward(int64_t step, const std::vector<data::Batch>& micro, StepResult& r,
                                  double lr) {
  TR_CHECK(inv_items_.defined(), "train step: load_step_scalars must run before forward_backward");
  Tensor sum;
  const bool fused = s_.opt.updates_in_backward();
  if (fused) {
    s_.opt.set_lr(lr);
    copies_ = s_.mp.weight_copies();
  }
  TR_CHECK(
      !layerwise_ || micro.size() == 1,
      "train step: the layer-wise optimizers take no gradient accumulation (as HF), and this step has {} "
      "micro-batches (--auto_find_batch_size halves the batch by accumulating: give the batch size)",
      micro.size());
  // ZeRO-3 accumulates in the f32 gradient shard, an update during backward takes each backward's
  // gradients: no whole f32 gradients are made up front.
  s_.mp.begin_step(full_ || fused ? 1 : static_cast<int64_t>(micro.size()));
  if (full_) full_->begin_step();
  for (const auto& real : micro) {
    // A rank past the epoch's last sample has an empty micro-batch: alone or under DDP it is skipped;
    // ZeRO-3's ranks all run every forward's gathers, so it runs an idle one (no loss, zero gradients).
    const bool idle = real.input_ids.size(0) == 0;
    if (idle && !full_) continue;
    const data::Batch b = idle ? idle_batch(std::max<int64_t>(2, real.input_ids.size(1)), o_.device) : real;
    if (o_.on_micro_batch && !idle) o_.on_micro_batch(step, b.input_ids);
    models::ForwardOptions fo;
    fo.labels = b.labels;
    fo.inv_num_items = inv_items_;
    fo.return_logits = false;
    fo.gradient_checkpointing = o_.gradient_checkpointing;
    fo.label_smoothing = o_.label_smoothing;
    fo.neftune_noise_alpha = o_.neftune_noise_alpha;
    fo.training = true;
    fo.dropout_gen = &s_.dropout_gen;
    // DDP: each rank draws its rows' part of the global batch's dropout masks (the single process's bits).
    if (o_.group != nullptr && !idle)
      s_.dropout_gen.set_shard({b.global_first, b.input_ids.size(0), b.global_size, b.global_unit});
    Tensor loss;
    {
      const ops::Range span(o_.device, "forward");
      loss = s_.model.forward(b.input_ids, fo).loss;
    }
    if (empties_cache(step) && &real == &micro.front()) empty_cache(r);
    // DDP: the last backward launches each bucket's all-reduce as soon as its gradients are final.
    std::optional<autograd::GradReadyScope> ready;
    // (A GPU's buckets are packed here, as the engine reports them, and their all-reduces wait for the
    // packing only; a dry run on the meta device reduces after backward.)
    if (reducer_ && overlap_ && !o_.device.is_meta() && &real == &micro.back()) {
      reducer_->begin(params_);
      reducing_ = true;
      ready.emplace([this](const TensorImpl* leaf) { reducer_->grad_ready(leaf); });
    }
    if (full_) {  // ZeRO-3: every micro-batch's layers reduced as their backward ends, then released
      full_->begin_backward(grad_scale_);
      ready.emplace([this](const TensorImpl* leaf) { full_->grad_ready(leaf); });
    }
    // ZeRO-2: each bucket reduce-scattered as its gradients become final, and those gradients dropped.
    if (zero_ && !full_ && zero_overlaps() && &real == &micro.back()) {
      zero_->begin_backward(grad_scale_);
      reducing_ = true;
      ready.emplace([this](const TensorImpl* leaf) { zero_->grad_ready(leaf); });
    }
    if (fused) {  // lomo, adalomo, galore_*_layerwise: every backward updates, its step count advanced once
      first_update_ = true;
      ready.emplace([this](const TensorImpl* leaf) { update_in_backward(leaf); });
    }
    {
      const ops::Range span(o_.device, "backward");
      if (s_.mp.loss_scaling())  // a copy: the engine may accumulate into the seed it is given
        autograd::backward({loss}, {ops::clone(seed_)});
      else
        autograd::backward({loss});
    }
    if (full_) full_->finish_backward();
    s_.dropout_gen.clear_shard();
    autograd::NoGradGuard no_grad;
    Tensor l = ops::to_dtype(detach(loss), DType::f64);
    sum = sum.defined() ? ops::binary(backend::BinaryOp::add, sum, l) : l;
    if (!idle) r.tokens += b.input_ids.numel();
  }
  return sum;
}

bool StepCore::empties_cache(int64_t step) const {
  return o_.torch_empty_cache_steps > 0 && (step + 1) % o_.torch_empty_cache_steps == 0;
}

// HF's point: after the forward, before the backward (the activations stay, the cache goes).
void StepCore::empty_cache(StepResult& r) {
  const int64_t cached = o_.device.is_cpu() ? static_cast<int64_t>(cpu_allocator().cached_bytes()) : 0;
  for (const Device d : s_.model.placement().devices()) ops::allocator_for(d).empty_cache();  // a split's too
  ++r.cache_releases;
  r.cache_bytes_released += cached;
}

// Unscale, global norm, clip and the fp16 inf check without a host sync per tensor: one statistics pass over
// the model's gradients (half under mixed precision), then the optimizer reads them through the transform
// (AdamW: unscale, clip, update and the half weight copy in one pass).
void StepCore::finish(int64_t step, double lr, const Tensor& loss, StepResult& r) {
  const ops::Range span(o_.device, "optimizer step");
  const auto t0 = std::chrono::steady_clock::now();
  const bool overlapped = reducing_;  // the buckets were begun during the last backward
  if (reducer_ && overlapped) reducer_->finish();
  if (reducer_ && !overlapped) reducer_->reduce(params_);
  reducing_ = false;
  const auto t1 = std::chrono::steady_clock::now();
  if (o_.after_backward) o_.after_backward(step, params_);
  const double inv_scale = 1.0 / s_.mp.loss_scale();
  const bool reduced = zero_ && (full_ || zero_overlaps());  // the shard holds the sums already
  if (zero_ && !full_ && zero_overlaps()) {  // ZeRO-2: this rank's shard of the sums, bucket by bucket
    // A rank whose last micro-batch was empty ran no backward: it reduces every bucket now, the same
    // collectives in the same order as the ranks that reduced them during backward.
    if (!overlapped) zero_->begin_backward(grad_scale_);
    zero_->finish_backward();
  }
  // An optimizer that updated during backward has no gradients left: the norm is all that remains.
  if (s_.opt.updates_in_backward()) {
    finish_after_backward_updates(loss, r);
    return;
  }
  // Read after the buckets dropped theirs (ZeRO-2 holds no whole gradients past this point).
  const std::vector<Tensor> grads = reduced ? std::vector<Tensor>() : s_.mp.model_grads();
  if (zero_ && !reduced)
    zero_->reduce_scatter(grads, grad_scale_);  // the compiled step: no engine reports, one pass
  if (zero_) zero_->reduce_replicas();          // hybrid sharding: the node's sums summed over the nodes
  const Tensor stats = zero_ ? zero_->global_stats(inv_scale) : ops::grad_stats(grads, inv_scale, o_.device);
  backend::Backend::GradTransform transform{inv_scale, o_.max_grad_norm, stats};
  std::vector<double> host_stats;
  bool halved = false;
  if (s_.mp.loss_scaling()) {  // the skip decision is the host's (torch's GradScaler syncs here as well)
    host_stats = host_values(stats);
    r.skipped = host_stats[1] != 0;
    // DeepSpeed's ZeRO optimizers update the loss scale before they unscale: a clean step that doubles the
    // scale divides its gradients, and the norm its clip sees, by twice the scale they carry.
    halved = !r.skipped && s_.mp.scaler().deepspeed_grows();
    if (halved) {
      transform.inv_scale = inv_scale / 2;
      transform.stats = ops::from_vector<double>({host_stats[0] / 4, host_stats[1]}, {2}, stats.device());
    }
  }
  if (!r.skipped) {  // fp16 overflow skips the update and lowers the scale (torch's GradScaler)
    s_.opt.set_lr(lr);
    if (zero_)  // the shard updated, every parameter gathered
      zero_->update(transform, s_.mp.weight_copies());
    else
      s_.opt.step(grads, transform, s_.mp.weight_copies());
  }
  s_.opt.zero_grad();
  s_.mp.after_step(r.skipped);
  if (host_stats.empty()) host_stats = host_values(stats);
  r.grad_norm = std::sqrt(host_stats[0]);
  if (halved && s_.mp.scaler().deepspeed->norm_at_new_scale) r.grad_norm /= 2;  // ZeRO-3 reports it so
  r.loss = loss.defined() ? host_values(loss)[0] : 0.0;
  if (o_.group != nullptr) {  // the global loss (each rank's share already normalized) and token count
    double v[2] = {r.loss, static_cast<double>(r.tokens)};
    o_.group->all_reduce_sum(v, 2);
    r.loss = o_.average_tokens_across_devices ? v[0] : v[0] / active_ranks_;
    r.tokens = static_cast<int64_t>(v[1]);
    // A rank whose last micro-batch was empty drew nothing for it: rank 0 (never empty) has the stream's
    // position every rank must continue from.
    Generator::State gs = s_.dropout_gen.state();
    o_.group->broadcast(&gs.offset, sizeof gs.offset, 0);
    s_.dropout_gen.set_state(gs);
    // DDP's buckets overlap backward on their own thread: the wait for the last ones counts. ZeRO's
    // collectives on the training thread (the update's gathers, the statistics) block it; those on a
    // communication thread (ZeRO-2's buckets, ZeRO-3's gathers and reductions) count only where the training
    // thread waited for them.
    if (zero_) {
      const auto [comm, blocked] = zero_thread_seconds();
      r.comm_wait_seconds = o_.group->stats().seconds - seconds_at_start_ - (comm - zero_comm_at_start_) +
                            (blocked - zero_blocked_at_start_);
    } else {
      r.comm_wait_seconds = wait_ + std::chrono::duration<double>(t1 - t0).count();
    }
    r.comm_bytes = o_.group->stats().bytes - bytes_at_start_;
    wait_ = 0;
  }
}

void StepCore::finish_after_backward_updates(const Tensor& loss, StepResult& r) {
  s_.opt.zero_grad();
  s_.mp.after_step(false);
  double sum_squares = 0;
  for (const Tensor& t : backward_stats_) sum_squares += host_values(t)[0];
  backward_stats_.clear();
  r.grad_norm = std::sqrt(sum_squares);
  r.loss = loss.defined() ? host_values(loss)[0] : 0.0;
}

}  // namespace tr::train
