// grokadamw 0.1's GrokAdamW under HF's name grokadamw: AdamW whose gradient is amplified by its own slow EMA
// (grad + lamb * ema), with a per-parameter norm clip and a first moment that decays faster for later
// parameters (beta1 * (1 - gamma)^i, i the parameter's index in its group). As HF builds it: the learning
// rate and HF's weight-decay groups; betas (0.9, 0.999) and eps 1e-8 are the class's defaults (HF passes no
// --adam_* values); --optim_args alpha_init (0.98), lamb (2.0), gamma (0.1), grokking_signal_decay_rate (0.1)
// and gradient_clipping (1.0).
#pragma once
#include "optim/optimizer.h"

namespace tr::optim {

class GrokAdamW : public Optimizer {
 public:
  GrokAdamW(const nn::ParamList& params, OptimizerOptions opts);
  int64_t step_count() const override { return step_; }
  // {"step"} + per parameter with a gradient so far "exp_avg.<name>", "exp_avg_sq.<name>", "grok_ema.<name>"
  // and "step.<name>" (its own count, as the published state).
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;
  // The three states' bytes (without materializing the step counts as state_dict() does).
  int64_t state_bytes() const override;
  // Non-default --adam_* values, which HF does not hand GrokAdamW ("" when none).
  static std::string unused_flags_note(const OptimizerOptions& opts);

 protected:
  void step_params(size_t lo, size_t hi, bool advance) override;

 private:
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor exp_avg, exp_avg_sq, grok_ema;  // undefined until the parameter's first gradient
    int64_t step = 0;
    bool decay;
  };
  double alpha_init_ = 0.98, lamb_ = 2.0, gamma_ = 0.1, signal_decay_ = 0.1, clipping_ = 1.0;
  std::vector<Slot> slots_;
  Tensor stats_;                          // the clip's norm statistics, one parameter at a time
  int64_t step_ = 0, index_[2] = {0, 0};  // this step's parameters so far in HF's no-decay / decay groups
};

}  // namespace tr::optim
