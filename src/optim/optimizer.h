// The optimizer interface the Trainer drives, and the factory from HF's `optim` names (adamw_torch,
// adamw_torch_fused, adamw_apex_fused, adamw_torch_xla, adamw_torch_npu_fused, adafactor, adamw_bnb_8bit /
// adamw_8bit / paged_adamw_8bit, paged_adamw_32bit, sgd, adagrad, rmsprop, rmsprop_bnb / rmsprop_bnb_32bit,
// rmsprop_bnb_8bit, lion_32bit / paged_lion_32bit, lion_8bit / paged_lion_8bit, the ademamix family,
// schedule_free_adamw / _radam / _sgd, stable_adamw, galore_adamw / _adamw_8bit / _adafactor and apollo_adamw
// with their _layerwise forms, grokadamw, lomo, adalomo, adamw_anyprecision).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "nn/layers.h"

namespace tr::optim {

// Hyper-parameters under HF's TrainingArguments names. `args` holds HF's --optim_args "k=v,k=v" extras
// (sgd: momentum, dampening, nesterov; adafactor: beta1, clip_threshold, decay_rate, ...).
struct OptimizerOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  // One parameter group, weight decay on every parameter: the optimizer DeepSpeed builds from a --deepspeed
  // config's "optimizer" section (HF hands it all parameters, without its decay groups).
  bool decay_all = false;
  // The schedule-free optimizers' own linear warmup (HF hands them --warmup_steps; a ratio is resolved to the
  // steps the scheduler warms up over).
  int64_t warmup_steps = 0;
  std::map<std::string, std::string> args;
  // GaLore's --optim_target_modules: a regex matched against whole module names, "all-linear", or a JSON
  // list of names (each matching exactly, as a substring, or as a whole-name regex) - HF's
  // check_target_module_exists. `linear_weights` names the model's linear-layer weights (the candidates).
  std::string target_modules;
  std::vector<std::string> linear_weights;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update from the parameters' .grad() (parameters without a gradient are skipped, as torch).
  virtual void step() { step_params(0, params_.size(), true); }
  // One update whose gradients are `grads` (parallel to the parameters; undefined: none, skipped), of any
  // floating dtype, read through `t` (loss-scale inverse and clip coefficient, backend.h); when `copies` is
  // non-empty each updated parameter is also rounded into copies[i] (the model's half weights under mixed
  // precision). The default writes the transformed gradients into the parameters' .grad in one backend pass,
  // updates and copies, a group of parameters at a time: a half gradient's f32 copy (the parameters' dtype)
  // lives only while its group updates, so at most the largest parameter's (or 16 MiB) exist at once instead
  // of the whole model's - 30 GiB at an 8B model's step. AdamW does all of it in its one fused pass.
  virtual void step(const std::vector<Tensor>& grads, const backend::Backend::GradTransform& t,
                    const std::vector<Tensor>& copies);
  void zero_grad();
  // LOMO, AdaLomo and the layer-wise GaLore optimizers update each parameter during backward, as soon as its
  // gradient is final (HF: hooks on the parameters), and the gradient is dropped at once, so the model's
  // gradients never exist together: the Trainer calls step_in_backward from the engine's gradient-ready
  // report instead of step() after backward. step() still gives the same update (tests, other callers).
  virtual bool updates_in_backward() const { return false; }
  // Parameter i's update from `grad` (its gradient, of any floating dtype) read through `t`, rounded into
  // `copy` when defined (the model's half weight); `first`: the first parameter of this backward, which
  // advances the step count. The same arithmetic as step()'s for that parameter.
  void step_in_backward(size_t i, const Tensor& grad, const backend::Backend::GradTransform& t,
                        const Tensor& copy, bool first);
  size_t num_params() const { return params_.size(); }
  // The schedule-free optimizers take gradients at one point (y, kept in the parameters) and evaluate at
  // another (x, their average): eval mode moves the parameters to x, train mode back to y, each a no-op where
  // they are already (or before any state exists); `copies` as step()'s. The Trainer enters train mode before
  // each step (HF's training_step) and eval mode before each evaluation (HF's evaluation_loop), checkpoint
  // and final save. The other optimizers have one point: no-ops.
  virtual void set_train_mode(bool train, const std::vector<Tensor>& copies) {
    (void)train;
    (void)copies;
  }
  virtual bool train_mode() const { return true; }
  virtual void set_lr(double lr) { opts_.lr = lr; }
  double lr() const { return opts_.lr; }
  virtual int64_t step_count() const = 0;
  // Named tensors (saved as safetensors in checkpoints); load_state_dict throws naming a missing or
  // mis-shaped entry. Loading what state_dict() returned continues bit-exactly.
  virtual std::vector<std::pair<std::string, Tensor>> state_dict() const = 0;
  virtual void load_state_dict(const std::map<std::string, Tensor>& state) = 0;
  // Bytes of optimizer state (the memory reports and the 8-bit check use it).
  virtual int64_t state_bytes() const;

  // HF's weight-decay groups: no decay for biases and for LayerNorm / RMSNorm weights.
  static bool decays(const std::string& name);
  // Whether weight decay applies to `name` under these options (HF's groups, or every parameter).
  bool decays_param(const std::string& name) const { return opts_.decay_all || decays(name); }

 protected:
  friend class GaLore;       // runs inner optimizers a group at a time
  friend class HalfWeights;  // runs its inner one over f32 stand-ins
  Optimizer(const nn::ParamList& params, OptimizerOptions opts);
  // The update of parameters [lo, hi) that have a gradient, the step count advanced when `advance` (a step's
  // first group): per parameter the same arithmetic whatever the groups, so grouped steps give step()'s bits.
  virtual void step_params(size_t lo, size_t hi, bool advance) = 0;
  nn::ParamList params_;
  OptimizerOptions opts_;
};

// The names HF accepts for --optim that this build implements.
const std::vector<std::string>& optimizer_names();
// Throws unless `name` is one of optimizer_names(): for HF's other names, what the name stands for in HF and
// that it is not implemented here; for other names, the nearest valid one.
void check_optimizer_name(const std::string& name);
// Throws for an unknown name, suggesting the nearest valid one.
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const nn::ParamList& params,
                                          const OptimizerOptions& opts);
// Throws for an --optim that cannot update half-precision weights (--torch_dtype bfloat16: the
// schedule-free ones).
void check_half_weights(const std::string& name);
// Whether --optim `name` updates each parameter during backward (lomo, adalomo, galore_*_layerwise).
bool updates_in_backward(const std::string& name);
// For the classes HF builds without some of the flags (GaLore's, GrokAdamW): a sentence naming the flags
// given non-default values that the optimizer therefore does not use; "" otherwise.
std::string unused_flags_note(const std::string& name, const OptimizerOptions& opts);
// "momentum=0.9,nesterov=true" -> map; throws on a malformed entry.
std::map<std::string, std::string> parse_optim_args(const std::string& text);

}  // namespace tr::optim
