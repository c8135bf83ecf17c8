// torchdistx's AnyPrecisionAdamW as HF builds it for --optim adamw_anyprecision: AdamW with its momentum,
// variance and optional Kahan compensation buffer each in a chosen dtype (--optim_args use_kahan_summation,
// momentum_dtype, variance_dtype, compensation_buffer_dtype; HF's defaults False, float32, float32,
// bfloat16). Every op of its step rounds to the dtype of the tensor it writes; with bf16 weights
// (--torch_dtype bfloat16) and Kahan summation the weight updates that bf16 would round away accumulate in
// the compensation buffer.
#pragma once
#include "optim/optimizer.h"

namespace tr::optim {

class AnyPrecisionAdamW : public Optimizer {
 public:
  // `params` f32, bf16 or f16 (the model's own half weights: no HalfWeights widening; the buffer is the
  // point).
  AnyPrecisionAdamW(const nn::ParamList& params, OptimizerOptions opts);
  int64_t step_count() const override { return step_; }
  // {"step", "exp_avg.<name>", "exp_avg_sq.<name>", with Kahan summation "compensation.<name>"}, each in its
  // dtype.
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 protected:
  void step_params(size_t lo, size_t hi, bool advance) override;

 private:
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor exp_avg, exp_avg_sq, compensation;
    bool decay;
  };
  std::vector<Slot> slots_;
  int64_t step_ = 0;
};

}  // namespace tr::optim
