// AdamW exactly as torch.optim.AdamW (single-tensor path): decoupled weight decay, bias-corrected moments.
// Parameter groups carry their own weight decay (HF's groups: no decay for biases and norm weights).
// State (step, exp_avg, exp_avg_sq) saves to and loads from named tensors, so training resumes bit-exactly.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace tr::optim {

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};

class AdamW {
 public:
  // `params` with HF names; weight decay applies to the names `decay(name)` accepts (default: HF's rule).
  AdamW(const nn::ParamList& params, AdamWOptions opts);
  void step();
  void zero_grad();
  void set_lr(double lr) { opts_.lr = lr; }
  double lr() const { return opts_.lr; }
  int64_t step_count() const { return step_; }
  // {"step": i64 scalar, "exp_avg.<name>": ..., "exp_avg_sq.<name>": ...}
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state);

  // HF's weight-decay groups: no decay for biases and for LayerNorm / RMSNorm weights.
  static bool decays(const std::string& name);

 private:
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor exp_avg, exp_avg_sq;
    bool decay;
  };
  std::vector<Slot> slots_;
  AdamWOptions opts_;
  int64_t step_ = 0;
};

}  // namespace tr::optim
