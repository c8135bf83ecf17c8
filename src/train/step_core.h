// The parts of a training step both implementations share (internal to src/train): the micro-batches'
// forward and backward, and the finish - gradient statistics, the update or the fp16 skip, the gradients
// dropped, the loss and statistics read on the host once.
#pragma once
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "train/ddp.h"
#include "train/zero.h"
#include "train/train_step.h"

namespace tr::train {

// A small device tensor read on the host (the one synchronization of a step).
std::vector<double> host_values(const Tensor& t);
// The label tokens of a whole step (accumulation-exact normalization), counted on the host.
double step_label_tokens(const std::vector<data::Batch>& micro);

class StepCore {
 public:
  // `overlap`: DDP buckets start during the last backward (the eager step); off, they all go after it (the
  // compiled step, whose replays run no autograd engine).
  StepCore(StepState s, StepOptions o, bool overlap = true);
  // The label tokens the step's losses are normalized by: this rank's micro-batches, summed over the ranks
  // in a distributed run (average_tokens_across_devices).
  double label_tokens(const std::vector<data::Batch>& micro);
  // Writes the step's scalars into the device buffers the forward and backward read them from: 1 / `items`
  // (the losses' divisor) and the fp16 loss scale (the backward's seed). Called before forward_backward and
  // outside a capture, so a captured step replays with each step's values (torch_compile's "capturable"
  // state) instead of holding them as constants.
  void load_step_scalars(double items);
  // Every micro-batch's forward and backward (an empty one - a rank past an epoch's last sample - is
  // skipped), each loss normalized by the label tokens given to load_step_scalars (step_label_tokens: HF's
  // num_items_in_batch); returns the step's loss summed on the device (f64). An optimizer that updates during
  // backward (Optimizer::updates_in_backward) updates each parameter at `lr` as the engine reports its
  // gradient final, in every micro-batch's backward (lomo_optim's fused_backward, HF's hooks).
  Tensor forward_backward(int64_t step, const std::vector<data::Batch>& micro, StepResult& r, double lr);
  // The after_backward hook, the update at `lr` from the model's gradients, and the host reads.
  void finish(int64_t step, double lr, const Tensor& loss, StepResult& r);
  // torch_empty_cache_steps: whether `step` releases the cache, and the release.
  bool empties_cache(int64_t step) const;
  void empty_cache(StepResult& r);

  StepState& state() { return s_; }
  // ZeRO-2's buckets go during the last backward in the eager step, on any device: packed on the training
  // thread as the engine reports them and reduced on the communication thread (on a GPU after the packing's
  // fence), each gradient dropped once packed (the memory ZeRO-2 saves, and what `trainer estimate`'s dry
  // run counts).
  bool zero_overlaps() const { return overlap_; }
  const StepOptions& options() const { return o_; }
  const nn::ParamList& params() const { return params_; }

 private:
  StepState s_;
  StepOptions o_;
  nn::ParamList params_;
  std::unique_ptr<GradReducer> reducer_;  // DDP
  ShardedOptimizer* zero_ = nullptr;      // ZeRO-2: the optimizer reduce-scatters and gathers itself
  FullShard* full_ = nullptr;             // ZeRO-3: each layer reduced as its backward ends
  double grad_scale_ = 1;                 // what the summed gradients are multiplied by
  bool overlap_ = true;
  bool reducing_ = false;  // the reducer's buckets were begun during this step's backward
  double wait_ = 0;        // collective waits of the step so far (label_tokens runs before the result)
  int64_t bytes_at_start_ = 0;
  double seconds_at_start_ = 0;
  // ZeRO's communication threads' counters (ShardedOptimizer's and FullShard's, summed): seconds in their
  // collectives, seconds the training thread waited for them; and their values at the step's start.
  std::pair<double, double> zero_thread_seconds();
  double zero_comm_at_start_ = 0, zero_blocked_at_start_ = 0;
  double active_ranks_ = 1;  // average_tokens_across_devices false: ranks with data this step
  // Updates during backward: the model parameters' indices, whether the backward has updated one yet, and
  // the step's gradient statistics so far, one f64 [2] per device (the logged norm; nothing is clipped).
  void update_in_backward(const TensorImpl* leaf);
  void finish_after_backward_updates(const Tensor& loss, StepResult& r);
  std::unordered_map<const TensorImpl*, size_t> param_index_;
  bool first_update_ = true;
  bool layerwise_ = false;  // galore_*_layerwise: one micro-batch per step
  std::vector<Tensor> backward_stats_;
  std::vector<Tensor> copies_;  // the model's half weights (empty in fp32), where updates are rounded to
  // The step's scalars on the loss's device, at fixed addresses for the whole run (load_step_scalars):
  // f64 1 / label tokens, and the f32 seed of the backward (the fp16 loss scale).
  Tensor inv_items_, seed_;
};

}  // namespace tr::train
