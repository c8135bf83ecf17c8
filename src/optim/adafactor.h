// Adafactor exactly as transformers.optimization.Adafactor with the Trainer's arguments (lr=learning_rate,
// scale_parameter=False, relative_step=False, warmup_init=False): factored second moment (row and column
// EMAs) for parameters with 2 or more dims, a full one for vectors, update clipping by its RMS, optional
// beta1.
#pragma once
#include <optional>

#include "optim/optimizer.h"

namespace tr::optim {

class Adafactor : public Optimizer {
 public:
  // --optim_args (transformers' names and defaults otherwise): beta1 (none), clip_threshold (1.0),
  // decay_rate (-0.8), eps1 (1e-30), eps2 (1e-3), scale_parameter, relative_step, warmup_init (false: the
  // Trainer's choice; relative_step ignores the learning rate as transformers does with lr=None).
  // Weight decay from the options, applied to the names decays() accepts.
  Adafactor(const nn::ParamList& params, OptimizerOptions opts);
  int64_t step_count() const override { return step_; }
  // {"step", "exp_avg_sq_row.<name>" + "exp_avg_sq_col.<name>" (2+ dims) or "exp_avg_sq.<name>",
  //  "exp_avg.<name>" with beta1}
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;
  // Parameters off the CPU always take the tensor-op formulation (update_with_ops); this makes CPU
  // parameters take it too, so its formulas are tested against the loops without a GPU.
  void use_tensor_ops(bool on) { tensor_ops_ = on; }

 protected:
  // AdaLomo's form (lomo.h): the options' learning rate scaled by max(eps2, RMS(p)) as scale_parameter, no
  // beta1, no weight decay, and the rate applied in the final add (p.add_(update, alpha=-lr), one fused
  // multiply-add) instead of to the update first; `optimizer` names it in messages, its --optim_args refused.
  struct LomoForm {
    std::string optimizer;
  };
  Adafactor(const nn::ParamList& params, OptimizerOptions opts, const LomoForm& form);
  void step_params(size_t lo, size_t hi, bool advance) override;

 private:
  void make_slots(const nn::ParamList& params);
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor row, col, sq, exp_avg;  // row/col when factored, else sq; exp_avg with beta1
    bool decay;
  };
  void update_with_ops(Slot& s, const Tensor& grad);
  template <typename T>
  void update(Slot& s, const Tensor& grad);

  std::vector<Slot> slots_;
  std::optional<double> beta1_;
  double clip_threshold_ = 1.0, decay_rate_ = -0.8, eps1_ = 1e-30, eps2_ = 1e-3;
  bool scale_parameter_ = false, relative_step_ = false, warmup_init_ = false, tensor_ops_ = false;
  bool lr_in_add_ = false;  // AdaLomo's final add
  int64_t step_ = 0;
};

}  // namespace tr::optim
