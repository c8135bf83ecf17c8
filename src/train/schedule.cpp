// The step arithmetic of a training run; see schedule.h.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tr::train {

namespace {

// A step count given as N >= 1, or as a ratio of `total` below 1 (HF's logging/save/eval_steps).
int64_t steps_of(double v, int64_t total) {
  return v >= 1 ? static_cast<int64_t>(v) : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(v * total)));
}

}  // namespace

Schedule make_schedule(const TrainingArguments& a, int64_t batches_per_epoch) {
  Schedule s;
  s.ga = a.gradient_accumulation_steps;
  // A step takes ga batches, or the rest of the epoch (HF's): no overflow for any ga.
  s.updates_per_epoch = batches_per_epoch / s.ga + (batches_per_epoch % s.ga != 0 ? 1 : 0);
  if (a.max_steps > 0) {
    s.total = a.max_steps;
  } else {
    const double steps = std::ceil(a.num_train_epochs * static_cast<double>(s.updates_per_epoch));
    TR_CHECK(std::isfinite(steps) && steps <= 1e15,
             "--num_train_epochs {}: {:.4g} optimizer steps of {} per epoch; expected a run of at most 1e15 "
             "steps",
             a.num_train_epochs, steps, s.updates_per_epoch);
    s.total = static_cast<int64_t>(steps);
  }
  s.warmup = a.warmup_steps >= 1  ? static_cast<int64_t>(a.warmup_steps)
             : a.warmup_steps > 0 ? static_cast<int64_t>(std::ceil(a.warmup_steps * s.total))
                                  : static_cast<int64_t>(std::ceil(a.warmup_ratio * s.total));
  s.log_every = steps_of(a.logging_steps, s.total);
  s.save_every = steps_of(a.save_steps, s.total);
  s.eval_every = steps_of(a.eval_steps > 0 ? a.eval_steps : a.logging_steps, s.total);
  s.log = parse_interval_strategy(a.logging_strategy, "logging_strategy");
  s.eval = parse_interval_strategy(a.eval_strategy, "eval_strategy");
  s.save = parse_interval_strategy(a.save_strategy, "save_strategy");
  s.eval_delay = a.eval_delay;
  s.log_first_step = a.logging_first_step;
  return s;
}

}  // namespace tr::train
