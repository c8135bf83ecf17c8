// The element-wise optimizers with per-parameter state beyond AdamW and SGD: torch.optim.Adagrad (adagrad),
// torch.optim.RMSprop (rmsprop), and bitsandbytes' Lion (lion_32bit, lion_8bit, paged_lion_32bit,
// paged_lion_8bit) and RMSprop (rmsprop_bnb, rmsprop_bnb_32bit, rmsprop_bnb_8bit), with HF's arguments: the
// learning rate, weight decay through HF's groups, Lion's betas from --adam_beta1/--adam_beta2; the
// constructors' other knobs from --optim_args. bitsandbytes' paged optimizers keep their state in CUDA
// managed memory that the driver may page to the host under pressure; here it stays resident (the same
// arithmetic; --fsdp "... offload" moves optimizer state to the host).
#pragma once
#include "backend/optim_math.h"
#include "optim/optimizer.h"

namespace tr::optim {

class ElementwiseOptimizer : public Optimizer {
 public:
  // `name`: one of the --optim names above. --optim_args: adagrad lr_decay (0), initial_accumulator_value
  // (0), eps (1e-10); rmsprop alpha (0.99), eps (1e-8), momentum (0); rmsprop_bnb* alpha (0.99), eps (1e-8);
  // the 8-bit ones min_8bit_size (4096: smaller tensors, and embeddings, keep 32-bit state, as bitsandbytes
  // and the Trainer). Throws on an unknown name or key and on the ranges torch / bitsandbytes refuse.
  ElementwiseOptimizer(const std::string& name, const nn::ParamList& params, OptimizerOptions opts);
  // Whether `name` is one of the --optim names this class implements.
  static bool implements(const std::string& name);
  int64_t step_count() const override { return step_; }
  // {"step"} + per parameter: adagrad "sum.<name>" (made at construction, as torch); rmsprop
  // "square_avg.<name>" and "momentum_buffer.<name>" (momentum > 0); Lion and rmsprop_bnb "state1.<name>"
  // (bitsandbytes' name: f32 of the parameter's shape, or u8 codes [numel] + "absmax1.<name>" f32 per 256
  // elements for 8-bit state). Except Adagrad's, the state is made at a parameter's first gradient, as torch
  // and bitsandbytes make it; a missing entry means "not made yet".
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 protected:
  void step_params(size_t lo, size_t hi, bool advance) override;

 private:
  struct Slot {
    std::string name;
    Tensor* param;
    Tensor state1, state2, absmax1;  // undefined until made
    bool decay, eight_bit;
  };
  void make_state(Slot& s) const;
  std::string name_;
  const char* key1_ = "state1.";
  const char* key2_ = "";
  backend::ElementwiseHyper h_;
  double initial_accumulator_ = 0;
  std::vector<Slot> slots_;
  Tensor signed_map_;  // 8-bit only: bitsandbytes' signed dynamic map on the parameters' device
  int64_t step_ = 0;
};

}  // namespace tr::optim
