// One optimizer step as an object of its own: the micro-batches of the step in; the loss, gradient norm and
// skip decision out. The loop around it (trainer.cpp) owns the schedule, logging, evaluation, saving and
// stopping, so an eager step and a captured one (torch_compile) are two implementations of one interface.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "data/loader.h"
#include "dist/process_group.h"
#include "models/causal_lm.h"
#include "optim/optimizer.h"
#include "train/mixed_precision.h"

namespace tr::train {

struct StepResult {
  double loss = 0;       // sum over the micro-batches (each normalized by the label tokens of the whole step)
  double grad_norm = 0;  // global norm of the unscaled gradients, before clipping
  bool skipped = false;  // fp16: inf/nan gradients, no update (the scheduler does not advance)
  int64_t tokens = 0;    // input tokens of the step (of every rank in a distributed run)
  int64_t cache_releases = 0, cache_bytes_released = 0;  // torch_empty_cache_steps
  // DDP: seconds this thread waited on collectives (the token count, buckets still in flight when backward
  // ended, the loss), and this rank's bytes handed to them.
  double comm_wait_seconds = 0;
  int64_t comm_bytes = 0;
};

// What a step reads and updates; owned by the run.
class FullShard;
struct StepState {
  models::CausalLM& model;
  MixedPrecision& mp;
  optim::Optimizer& opt;
  Generator& dropout_gen;
  FullShard* full_shard = nullptr;  // ZeRO-3: the layers gathered, released and reduced (zero3.h)
};

struct StepOptions {
  bool gradient_checkpointing = false;
  double label_smoothing = 0;      // HF's label_smoothing_factor (models::ForwardOptions)
  double neftune_noise_alpha = 0;  // HF's neftune_noise_alpha (models::ForwardOptions)
  double max_grad_norm = 0;        // <= 0: no clipping
  int64_t torch_empty_cache_steps = 0;
  Device device = Device::cpu();
  // torch_compile's inductor backend: the captured step's elementwise chains fused (where the device's
  // backend runs fused calls).
  bool fuse_elementwise = false;
  // torch_compile on a GPU (inductor, cudagraphs): each replay of a plan that draws no random numbers is one
  // CUDA graph launch instead of a launch per kernel.
  bool device_graphs = false;
  // Distributed data parallel: the step's label tokens counted over every rank, the gradients summed over
  // the ranks after the last micro-batch (ddp.h), the loss and token count reported globally. Null: alone.
  dist::ProcessGroup* group = nullptr;
  int64_t ddp_bucket_cap_bytes = int64_t{25} << 20;
  // HF's average_tokens_across_devices: false normalizes each rank's loss by its own label tokens and
  // averages the gradients instead of summing them.
  bool average_tokens_across_devices = true;
  // Called before each micro-batch's forward (tests inspect the data order).
  std::function<void(int64_t step, const Tensor& input_ids)> on_micro_batch;
  // Called after the step's backward passes with the model's parameters (tests poison a gradient there).
  std::function<void(int64_t step, const nn::ParamList& model_params)> after_backward;
};

class TrainStep {
 public:
  virtual ~TrainStep() = default;
  // Optimizer step `step` (0-based) over `micro` (1 .. gradient_accumulation_steps batches) at learning rate
  // `lr`: forward and backward of each micro-batch, gradient statistics, the update (or the fp16 skip), the
  // gradients dropped. Reads the loss and statistics on the host once. Takes the batches: a step may free
  // them once it no longer needs them (the compiled step, after copying them into its static inputs).
  virtual StepResult run(int64_t step, std::vector<data::Batch> micro, double lr) = 0;
  // Frees what the step keeps between steps for speed alone (the compiled step's arena), before work that
  // needs memory of its own (evaluation, a save), so that peak memory stays the eager step's.
  virtual void release_memory() {}
  // torch_compile: the step shapes captured so far (a plan each); 0 for the eager step.
  virtual int64_t captured_shapes() const { return 0; }
  // torch_compile: the most the replayed steps hold (what stays between steps, the arena, the optimizer
  // step's own buffers), as planned at their captures and as the allocator measured them; 0 for the eager
  // step and before any replay.
  // torch_compile on a GPU: CUDA graphs captured so far (one per plan, again when what it baked in moved).
  virtual int64_t device_graph_captures() const { return 0; }
  virtual int64_t planned_peak_bytes() const { return 0; }
  virtual int64_t replayed_peak_bytes() const { return 0; }
};

// The step as the ops run it, one after another (the reference every other implementation must equal).
std::unique_ptr<TrainStep> make_eager_step(StepState state, StepOptions options);
// torch_compile's step: the first step of each shape is captured (forward and backward recorded through the
// backend), planned into one arena and replayed by later steps of that shape; bit-identical to the eager
// step. Up to 8 shapes; a shape that cannot be captured, or one past the cap, runs eagerly (said once).
std::unique_ptr<TrainStep> make_compiled_step(StepState state, StepOptions options);

// Label tokens a causal LM predicts in `labels` [B, T] (shifted by one; -100 ignored): HF's
// num_items_in_batch for one micro-batch.
int64_t count_label_tokens(const Tensor& labels);

}  // namespace tr::train
