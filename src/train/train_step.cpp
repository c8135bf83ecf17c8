// The eager training step; see train_step.h.
#include "train/train_step.h"

#include "train/step_core.h"

#include "ops/ops.h"

namespace tr::train {

int64_t count_label_tokens(const Tensor& labels) {
  TR_CHECK(labels.dim() == 2 && labels.dtype() == DType::i64,
           "count_label_tokens: labels must be int64 [B, T]");
  Tensor l = ops::contiguous(ops::to_device(labels, Device::cpu()));  // a GPU batch: one small copy
  const int64_t* d = l.data<int64_t>();
  const int64_t B = l.size(0), T = l.size(1);
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 1; t < T; ++t) n += d[b * T + t] != -100;
  return n;
}

namespace {

class EagerStep final : public TrainStep {
 public:
  EagerStep(StepState s, StepOptions o) : core_(s, std::move(o)) {}

  StepResult run(int64_t step, std::vector<data::Batch> micro, double lr) override {
    StepResult r;
    core_.load_step_scalars(core_.label_tokens(micro));
    const Tensor loss = core_.forward_backward(step, micro, r, lr);
    core_.finish(step, lr, loss, r);
    return r;
  }

 private:
  StepCore core_;
};

}  // namespace

std::unique_ptr<TrainStep> make_eager_step(StepState state, StepOptions options) {
  return std::make_unique<EagerStep>(state, std::move(options));
}

}  // namespace tr::train
