// fp16 / bf16 training with fp32 master weights: the model computes with half-precision copies of its
// parameters, the optimizer updates fp32 masters, and fp16 uses PyTorch's dynamic loss scaler (init 2^16,
// growth 2 every 2000 clean steps, backoff 0.5 on inf/nan, the step skipped; under --deepspeed, DeepSpeed's).
// On the CPU the half types are real storage types (every value rounded to nearest even), so the numerics
// match a GPU's storage rounding.
#pragma once
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/layers.h"

namespace tr::train {

// DeepSpeed's fp16 loss scaling under ZeRO (a --deepspeed config's "fp16" section; deepspeed/runtime/fp16/
// loss_scaler.py): halve on an overflow only once `hysteresis` overflows have come without a doubling
// between them, double every `window` steps after the last overflow, never below min_scale (an overflow at
// it ends the run, as DeepSpeed's does). A static scale (loss_scale > 0) never changes.
struct DeepSpeedScaling {
  bool dynamic = true;
  int64_t window = 1000, hysteresis = 1;
  bool consecutive_hysteresis = false;
  double min_scale = 1;
  bool norm_at_new_scale = false;  // ZeRO-3 reports the gradient norm unscaled by the updated scale
  // state
  int64_t cur_hysteresis = 1, cur_iter = 0, last_overflow_iter = -1;
};

struct GradScaler {
  double scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000, growth_tracker = 0;
  std::optional<DeepSpeedScaling> deepspeed;  // set: DeepSpeed's rule instead of torch's
  // torch.cuda.amp.GradScaler.update: back off on inf/nan, grow after growth_interval clean steps (or
  // DeepSpeed's rule, above).
  void update(bool found_inf);
  // DeepSpeed's rule only: whether a clean step now doubles the scale (its ZeRO optimizers then unscale the
  // step's gradients by the doubled one).
  bool deepspeed_grows() const {
    return deepspeed && deepspeed->dynamic &&
           (deepspeed->cur_iter - deepspeed->last_overflow_iter) % deepspeed->window == 0;
  }
  nlohmann::json to_json() const;
  void load_json(const nlohmann::json& j, const std::string& source);
};

class MixedPrecision {
 public:
  // Replaces each fp32 model parameter by a `half` copy and keeps the fp32 tensor as its master (sharded:
  // see below).
  // `half` f32 means plain fp32 training: masters are the model's own parameters and nothing is copied.
  // `sharded_masters` (ZeRO-2, whose optimizer has taken its slices already): no whole masters are kept,
  // each fp32 tensor is dropped once its half copy exists (masters_sharded()); a
  // parameter already in `half` (build_shard's) is kept as it is.
  // `half_weights` (--torch_dtype bfloat16): the model's parameters are themselves `half` (made so if they
  // are f32) and are what the optimizer updates - no fp32 masters, no copies, gradients accumulated in their
  // dtype (HF training a bf16 model without autocast).
  MixedPrecision(const nn::ParamList& model_params, DType half, bool loss_scaling,
                 bool sharded_masters = false, bool half_weights = false);
  // Whether separate fp32 masters exist (mixed precision with half compute copies).
  bool enabled() const { return half_ != DType::f32 && !half_weights_; }
  bool half_weights() const { return half_weights_; }
  DType compute_dtype() const { return half_; }
  // What the optimizer updates (the model's own parameters in fp32 training).
  const nn::ParamList& master_params() const { return master_list_; }
  double loss_scale() const { return scaling_ ? scaler_.scale : 1.0; }
  bool loss_scaling() const { return scaling_; }
  // Before the first backward of a step with `micro_batches` backward passes: under mixed precision with
  // more than one, the model's gradients start as f32 zeros, so accumulation adds in f32 as HF's fp32
  // parameters under autocast do (half gradients summed in half lose bits with every micro-batch).
  void begin_step(int64_t micro_batches);
  // The model's gradients after backward (half under mixed precision, scaled by the loss scale; undefined
  // for parameters without one), parallel to master_params(): the optimizer reads them through a
  // Backend::GradTransform instead of materialized f32 master gradients.
  std::vector<Tensor> model_grads() const;
  // Where the optimizer writes the updated masters, rounded: the model's half parameters (empty in fp32).
  std::vector<Tensor> weight_copies() const;
  // After an optimizer step that ran (or was skipped): scaler update, every gradient dropped.
  void after_step(bool found_inf);
  // ZeRO-2: the whole masters freed (meta tensors of their shapes stay, for names and shapes) once a
  // ShardedOptimizer holds this rank's slices (a save gathers each one as it is written).
  void shard_masters();
  bool masters_sharded() const { return sharded_; }
  GradScaler& scaler() { return scaler_; }
  const GradScaler& scaler() const { return scaler_; }

 private:
  nn::ParamList model_;
  std::vector<Tensor> masters_;
  nn::ParamList master_list_;
  DType half_;
  bool scaling_;
  bool sharded_ = false;
  bool half_weights_ = false;
  GradScaler scaler_;
};

}  // namespace tr::train
