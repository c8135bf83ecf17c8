// HF's learning-rate schedules (transformers.optimization, get_scheduler): --lr_scheduler_type picks one,
// --lr_scheduler_kwargs (a JSON object, as HF's dict) sets its own arguments. Parsed and checked once; the
// training loop asks for the rate of each optimizer step.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tr::train {

enum class LrScheduleKind {
  linear,
  cosine,
  cosine_with_restarts,
  polynomial,
  constant,
  constant_with_warmup,
  inverse_sqrt,
  reduce_lr_on_plateau,
  cosine_with_min_lr,
  cosine_warmup_with_min_lr,
  warmup_stable_decay,
  deepspeed,  // a --deepspeed config's "scheduler" section (DeepSpeedSchedule), not a --lr_scheduler_type
};

// The shape of a warmup or decay phase of warmup_stable_decay.
enum class WsdCurve { linear, cosine, one_minus_sqrt };

// DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR (deepspeed/runtime/lr_schedules.py), which a
// --deepspeed config's "scheduler" section runs in place of --lr_scheduler_type. "auto" (nullopt) is the
// run's own value, which HF fills in; a key the config leaves out keeps DeepSpeed's default (HF adds none).
struct DeepSpeedSchedule {
  enum class Kind { warmup_lr, warmup_decay_lr, warmup_cosine_lr } kind = Kind::warmup_lr;
  bool log_warmup = true;                             // warmup_type "log" (DeepSpeed's default) or "linear"
  std::optional<int64_t> warmup_num_steps = 1000;     // nullopt: the run's warmup steps
  double warmup_min_lr = 0;                           // WarmupLR, WarmupDecayLR
  std::optional<double> warmup_max_lr = 1e-3;         // nullopt: --learning_rate
  double warmup_min_ratio = 0, cos_min_ratio = 1e-4;  // WarmupCosineLR (of --learning_rate)
};

// --lr_scheduler_type's names, in HF's SchedulerType order.
const std::vector<std::string>& scheduler_names();

// ReduceLROnPlateau's arguments (torch.optim.lr_scheduler defaults) and its state, which a checkpoint keeps.
struct PlateauState {
  bool maximize = false;    // mode "max"
  double factor = 0.1;      // new lr = max(lr * factor, min_lr)
  int64_t patience = 10;    // evaluations without improvement before a reduction
  double threshold = 1e-4;  // improvement needed, relative ("rel") or absolute ("abs")
  bool relative = true;     // threshold_mode "rel"
  int64_t cooldown = 0;     // evaluations after a reduction during which bad ones are not counted
  double min_lr = 0, eps = 1e-8;
  // state
  double best = 0;
  bool has_best = false;
  int64_t num_bad_epochs = 0, cooldown_counter = 0;
  double lr = 0;  // the rate now (starts at the base rate)

  // One evaluation's metric; returns whether the rate was reduced.
  bool step(double metric);
  nlohmann::json to_json() const;
  void read_json(const nlohmann::json& j, const std::string& source);
};

class LrSchedule {
 public:
  // Throws naming --lr_scheduler_type / --lr_scheduler_kwargs for an unknown name, an argument the schedule
  // does not take, a value of the wrong type or range. `kwargs`: "" or a JSON object.
  LrSchedule(const std::string& type, const std::string& kwargs, double base_lr);
  LrSchedule(const DeepSpeedSchedule& ds, double base_lr);

  LrScheduleKind kind() const { return kind_; }
  // The rate of 0-based optimizer step `step` of `total`, after `warmup` warmup steps (HF's LambdaLR:
  // base_lr times the schedule's factor). reduce_lr_on_plateau: the plateau state's rate. deepspeed: the
  // rate DeepSpeed's engine gives the optimizer step after `step` applied ones (its scheduler steps after
  // each, from iteration -1, so the first two steps run at the warmup's start).
  double at(int64_t step, int64_t warmup, int64_t total) const;
  // The factor alone (base_lr 1).
  double factor(int64_t step, int64_t warmup, int64_t total) const;
  // reduce_lr_on_plateau only: the state the evaluations step (HF steps it with metric_for_best_model).
  PlateauState& plateau() { return plateau_; }
  const PlateauState& plateau() const { return plateau_; }

 private:
  LrScheduleKind kind_;
  double base_;
  double num_cycles_ = 0.5;
  double lr_end_ = 1e-7, power_ = 1.0;  // polynomial
  double min_lr_rate_ = 0;              // cosine_with_min_lr(_warmup); warmup_stable_decay's min_lr_ratio
  double warmup_lr_rate_ = -1;          // cosine_warmup_with_min_lr (-1: None)
  int64_t num_stable_steps_ = -1, num_decay_steps_ = 0;  // warmup_stable_decay (stable -1: the rest)
  WsdCurve warmup_curve_ = WsdCurve::linear, decay_curve_ = WsdCurve::cosine;
  PlateauState plateau_;
  DeepSpeedSchedule ds_;

  double deepspeed_at(int64_t step, int64_t warmup, int64_t total) const;
};

}  // namespace tr::train
