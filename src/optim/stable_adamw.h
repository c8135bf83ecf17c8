// optimi's StableAdamW under HF's name stable_adamw: AdamW with debiased betas (no bias corrections) and
// each tensor's learning rate divided by max(1, RMS(grad^2 / max(exp_avg_sq, eps^2))) - Adafactor's update
// clipping. HF's arguments: the learning rate, --adam_beta1/--adam_beta2/--adam_epsilon, weight decay through
// its groups; --optim_args decouple_lr (false: decay by lr * weight_decay; true: by lr / max_lr *
// weight_decay), max_lr (the initial learning rate) and kahan_sum (optimi compensates only half-precision
// parameters; the optimizer's parameters here are f32 or f64 masters, so it changes nothing). A step leaves
// each gradient's buffer holding its RMS terms (as optimi's foreach step does).
#pragma once
#include "optim/optimizer.h"

namespace tr::optim {

class StableAdamW : public Optimizer {
 public:
  StableAdamW(const nn::ParamList& params, OptimizerOptions opts);
  int64_t step_count() const override { return step_; }
  // {"step"} + per parameter with a gradient so far "exp_avg.<name>" and "exp_avg_sq.<name>" (optimi's).
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 protected:
  void step_params(size_t lo, size_t hi, bool advance) override;

 private:
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor exp_avg, exp_avg_sq;  // undefined until the parameter's first gradient
    bool decay;
  };
  // sqrt(mean(terms)), the terms grad^2 / max(exp_avg_sq, eps^2) the moments pass wrote; one host read per
  // tensor, as optimi's .item().
  double rms(const Tensor& terms) const;
  double beta1_, beta2_, eps_, max_lr_;
  bool decouple_lr_;
  double beta1_hat_ = 0, beta2_hat_ = 0;
  int64_t step_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace tr::optim
