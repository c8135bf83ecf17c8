// SGD exactly as torch.optim.SGD: coupled weight decay (g + wd*p), momentum with dampening, Nesterov; the
// momentum buffer starts as the first gradient. lr from the options; momentum, dampening, nesterov from
// --optim_args. State (step, momentum_buffer.<name>) resumes bit-exactly.
#pragma once
#include "optim/optimizer.h"

namespace tr::optim {

class SGD : public Optimizer {
 public:
  // --optim_args: momentum (0), dampening (0), nesterov (false); weight decay from the options, applied to
  // the names decays() accepts (HF passes it through its parameter groups).
  SGD(const nn::ParamList& params, OptimizerOptions opts);
  int64_t step_count() const override { return step_; }
  // {"step", "momentum_buffer.<name>" for the parameters that have one (torch creates it at their first
  // gradient)}
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  // A missing momentum buffer means "not created yet", as in torch's state.
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 protected:
  void step_params(size_t lo, size_t hi, bool advance) override;

 private:
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor momentum_buffer;  // undefined until the parameter's first gradient (momentum != 0 only)
    bool decay;
  };
  std::vector<Slot> slots_;
  double momentum_ = 0, dampening_ = 0;
  bool nesterov_ = false;
  int64_t step_ = 0;
};

}  // namespace tr::optim
