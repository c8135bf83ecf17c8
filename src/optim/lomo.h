// LOMO and AdaLomo (lomo_optim, arXiv 2306.09782 and 2310.10195) under HF's names lomo and adalomo: each
// parameter is updated during backward as soon as its gradient is final, and the gradient dropped, so no
// optimizer step ever holds the model's gradients (the memory LOMO saves). As lomo_optim with the arguments
// HF's Trainer passes (the learning rate alone).
#pragma once
#include "optim/adafactor.h"
#include "optim/sgd.h"

namespace tr::optim {

// LOMO: p.add_(grad, alpha=-lr) in f32 - torch's SGD without momentum or weight decay, the same bits.
// HF hands Lomo no clip_grad_norm, clip_grad_value or weight decay; --optim_args are refused (HF drops them).
class Lomo : public SGD {
 public:
  Lomo(const nn::ParamList& params, OptimizerOptions opts);
  bool updates_in_backward() const override { return true; }
};

// AdaLomo: Adafactor's factored second moment (rows and columns of each matrix, the whole vector otherwise;
// eps (1e-30, 1e-3), decay_rate -0.8, clip_threshold 1.0), the update divided by max(1, its RMS), the rate
// scaled by max(1e-3, RMS(p)) and applied as p.add_(update, alpha=-lr). Its step count advances once per
// backward (per micro-batch, as lomo_optim's fused_backward). lomo_optim's loss_scale 2^10 multiplies the
// loss and divides the gradients by a power of two, which changes no bit: not done.
class AdaLomo : public Adafactor {
 public:
  AdaLomo(const nn::ParamList& params, OptimizerOptions opts);
  bool updates_in_backward() const override { return true; }
};

// Non-default flags HF does not hand lomo_optim's classes ("" when none).
std::string lomo_unused_flags_note(const std::string& name, const OptimizerOptions& opts);

}  // namespace tr::optim
