// schedulefree's optimizers under HF's names: schedule_free_adamw (AdamWScheduleFree), schedule_free_radam
// (RAdamScheduleFree) and schedule_free_sgd (SGDScheduleFree), with the arguments HF's Trainer gives them:
// the learning rate (the scheduler's, each step), --adam_beta1/--adam_beta2/--adam_epsilon (AdamW, RAdam),
// weight decay through HF's groups, the warmup steps (AdamW, SGD), and --optim_args weight_lr_power (2) and
// r (0); SGD's momentum (0.9, its default) from --optim_args too, which HF does not pass.
#pragma once
#include "backend/optim_math.h"
#include "optim/optimizer.h"

namespace tr::optim {

// The parameters hold y, the point gradients are taken at; z is the state; x, the average the method
// evaluates (and what a checkpoint saves), is lerp(y, z, 1 - 1/beta1) (SGD: momentum for beta1).
class ScheduleFree : public Optimizer {
 public:
  // Throws on an unknown name or --optim_args key and on the ranges schedulefree refuses.
  ScheduleFree(const std::string& name, const nn::ParamList& params, OptimizerOptions opts);
  static bool implements(const std::string& name);
  int64_t step_count() const override { return k_; }
  // Throws in eval mode: the gradients were taken at x, not at y (schedulefree's own check).
  void step() override;
  void step(const std::vector<Tensor>& grads, const backend::Backend::GradTransform& t,
            const std::vector<Tensor>& copies) override;
  void set_train_mode(bool train, const std::vector<Tensor>& copies) override;
  bool train_mode() const override { return train_; }
  // {"step", "weight_sum", "lr_max" (f64: the average's running sums), "train_mode"} + per parameter with a
  // gradient so far "z.<name>" and (AdamW, RAdam) "exp_avg_sq.<name>".
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 protected:
  void step_params(size_t lo, size_t hi, bool advance) override;

 private:
  enum class Kind { adamw, radam, sgd };
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor z, exp_avg_sq;  // undefined until the parameter's first gradient
    bool decay;
  };
  // The step's scalars (schedulefree's group arithmetic in double), the running sums advanced.
  void advance();
  void check_train_mode() const;
  Kind kind_;
  std::string name_;
  double beta1_ = 0.9, weight_lr_power_ = 2.0, r_ = 0.0;
  int64_t warmup_ = 0;
  double weight_sum_ = 0.0, lr_max_ = -1.0;
  int64_t k_ = 0;
  bool train_ = true;
  backend::ElementwiseHyper h_;
  std::vector<Slot> slots_;
};

}  // namespace tr::optim
