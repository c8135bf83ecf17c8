// AdamW exactly as torch.optim.AdamW: decoupled weight decay, bias-corrected moments, in torch's operation
// order. Two kernels with identical numbers: per tensor (adamw_torch) and one multi-tensor pass over all
// parameters (adamw_torch_fused, adamw_apex_fused). State (step, exp_avg, exp_avg_sq) resumes bit-exactly.
// Half-precision weights (--torch_dtype bfloat16) keep half moments and get torch's fused rule for half
// tensors (f32 arithmetic, each stored value rounded once) from both kernels.
#pragma once
#include "optim/optimizer.h"

namespace tr::optim {

using AdamWOptions = OptimizerOptions;

class AdamW : public Optimizer {
 public:
  // `params` with HF names; weight decay applies to the names `decays(name)` accepts (HF's groups).
  // multi_tensor: every parameter's chunks go through one parallel region over a flat work list, as the fused
  // kernels do; the element-wise arithmetic is the same, so the results equal the per-tensor ones bit for
  // bit.
  AdamW(const nn::ParamList& params, AdamWOptions opts, bool multi_tensor = false);
  // The names built as this class, which also updates bf16/f16 weights with moments in their dtype.
  static bool half_state(const std::string& name);
  using Optimizer::step;  // step(): every parameter from its .grad()
  // One fused pass: the gradients read through `t`, the half weight copies written by the same kernel.
  void step(const std::vector<Tensor>& grads, const backend::Backend::GradTransform& t,
            const std::vector<Tensor>& copies) override;
  int64_t step_count() const override { return step_; }
  // {"step": i64 scalar, "exp_avg.<name>": ..., "exp_avg_sq.<name>": ...}
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 protected:
  void step_params(size_t lo, size_t hi, bool advance) override;

 private:
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor exp_avg, exp_avg_sq;
    bool decay;
  };
  void run(const std::vector<backend::Backend::AdamWTensors>& list, const backend::Backend::GradTransform& t,
           bool advance);
  std::vector<Slot> slots_;
  bool multi_tensor_;
  int64_t step_ = 0;
};

}  // namespace tr::optim
