// The step arithmetic of a training run, as HF's Trainer does it: optimizer updates per epoch, total and
// warmup steps, and when to log, evaluate and save.
#pragma once
#include <cstdint>

#include "train/args.h"

namespace tr::train {

// The step counts of a run (HF's: updates per epoch round up, warmup_steps as a count or a ratio).
struct Schedule {
  int64_t ga = 1, updates_per_epoch = 1, total = 0, warmup = 0, log_every = 1, save_every = 1, eval_every = 1;
  IntervalStrategy log = IntervalStrategy::steps, eval = IntervalStrategy::no, save = IntervalStrategy::steps;
  double eval_delay = 0;  // steps, or epochs under eval_strategy epoch
  bool log_first_step = false;
  double epoch(int64_t step) const { return static_cast<double>(step) / updates_per_epoch; }
  bool epoch_ends(int64_t step) const { return (step + 1) % updates_per_epoch == 0; }
  // HF's on_epoch_end: after each epoch, and after the last step when it stops an epoch midway.
  bool epoch_boundary(int64_t step) const { return epoch_ends(step) || step + 1 == total; }
  // After 0-based `step`, by HF's step arithmetic (DefaultFlowCallback): a save after the last step whatever
  // the interval (save_strategy best aside: it saves when an evaluation finds a new best); a log line too
  // (ours: the run's last numbers), unless logging_strategy is no.
  bool logs_after(int64_t step) const {
    return (log == IntervalStrategy::steps && (step + 1) % log_every == 0) ||
           (log == IntervalStrategy::epoch && epoch_boundary(step)) || (log_first_step && step == 0) ||
           (log != IntervalStrategy::no && step + 1 == total);
  }
  bool evaluates_after(int64_t step) const {
    return (eval == IntervalStrategy::steps && (step + 1) % eval_every == 0 &&
            eval_delay <= static_cast<double>(step + 1)) ||
           (eval == IntervalStrategy::epoch && epoch_boundary(step) && eval_delay <= epoch(step + 1));
  }
  bool saves_after(int64_t step) const {
    return (save == IntervalStrategy::steps && (step + 1) % save_every == 0) ||
           (save == IntervalStrategy::epoch && epoch_boundary(step)) ||
           (save != IntervalStrategy::no && save != IntervalStrategy::best && step + 1 == total);
  }
};

// From the arguments and the loader's micro-batches per epoch.
Schedule make_schedule(const TrainingArguments& a, int64_t batches_per_epoch);

}  // namespace tr::train
