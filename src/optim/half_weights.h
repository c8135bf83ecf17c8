// An optimizer over half-precision weights (--torch_dtype bfloat16: the model's own bf16 parameters, no fp32
// masters) for the optimizers whose arithmetic is f32's: each parameter is widened to f32 only while its
// update runs, updated by the inner optimizer (its state in f32), and rounded back once - HF's Adafactor,
// lomo_optim and bitsandbytes on bf16 parameters, exactly.
#pragma once
#include <memory>

#include "optim/optimizer.h"

namespace tr::optim {

class HalfWeights : public Optimizer {
 public:
  // `params` bf16 or f16; `make` builds the inner optimizer over the f32 stand-ins it is given.
  HalfWeights(const nn::ParamList& params, const OptimizerOptions& opts,
              const std::function<std::unique_ptr<Optimizer>(const nn::ParamList&)>& make);
  bool updates_in_backward() const override { return inner_->updates_in_backward(); }
  void set_lr(double lr) override;
  int64_t step_count() const override { return inner_->step_count(); }
  std::vector<std::pair<std::string, Tensor>> state_dict() const override { return inner_->state_dict(); }
  void load_state_dict(const std::map<std::string, Tensor>& state) override;
  int64_t state_bytes() const override { return inner_->state_bytes(); }

 protected:
  // Groups of at most 16 MiB of f32 weights and gradients (or one parameter) widened at a time: per parameter
  // the inner optimizer's arithmetic is the same whatever the groups.
  void step_params(size_t lo, size_t hi, bool advance) override;

 private:
  std::vector<Tensor> wide_;  // f32 stand-ins: placeholders holding no memory between updates
  std::unique_ptr<Optimizer> inner_;
};

}  // namespace tr::optim
