// HF's --deepspeed: a DeepSpeed configuration file (or an arguments file's dict) read as HF's Trainer reads
// it (transformers/integrations/deepspeed.py): "auto" values take the TrainingArguments', other values must
// equal them, and what is DeepSpeed's own - the ZeRO stage and offload, its AdamW, its warmup schedules, its
// fp16 loss scaler - runs on this Trainer's ZeRO, optimizers and schedules with DeepSpeed's arithmetic.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/args.h"
#include "train/lr_schedule.h"
#include "train/mixed_precision.h"

namespace tr::train {

struct DeepSpeedConfig {
  std::string source;   // "--deepspeed FILE", or "--deepspeed's JSON" (inline, or an arguments file's dict)
  nlohmann::json json;  // as read
  int stage = 0;        // zero_optimization.stage
  bool offload_optimizer = false;
  bool offload_param = false;  // accepted: parameters stay on the device here (the same numbers)
  bool has_optimizer = false;  // an "optimizer" section: DeepSpeed's Adam(W) replaces --optim
  bool l2_adam = false;        // its "Adam" with adam_w_mode false
  bool torch_adamw = false;    // torch_adam: torch.optim.AdamW, weight_decay 0.01 unless given
  std::optional<DeepSpeedSchedule> schedule;
  // The scheduler's step counts as the config gives them (nullopt: "auto" or missing): HF's finalize
  // checks them against the run's warmup and total steps.
  std::optional<int64_t> warmup_num_steps, total_num_steps;
  // fp16's loss scaling (set when fp16.enabled): the initial scale and DeepSpeed's rule.
  std::optional<double> initial_scale;
  DeepSpeedScaling scaling;
};

// Reads --deepspeed's value: a path to a JSON file, or a JSON object's text (an arguments file's dict).
// Throws naming the file and key for anything unknown, malformed, or not supported here.
DeepSpeedConfig read_deepspeed_config(const std::string& given);

// What trainer_config_process does with the arguments: "auto" filled, every concrete value that differs
// from its argument listed in one error (HF's message); then the arguments this run trains with: --fsdp
// from the ZeRO stage and offload_optimizer, --optim adamw_torch when the config has an optimizer. Notes
// for the user (what is taken from the config instead of a flag) go to `notes`. Idempotent.
TrainingArguments apply_deepspeed_config(const TrainingArguments& a, int world_size,
                                         std::vector<std::string>* notes = nullptr);

// trainer_config_finalize's check: the scheduler's warmup_num_steps and total_num_steps, when given, are
// the run's (`warmup` and `total` optimizer steps).
void check_deepspeed_steps(const DeepSpeedConfig& c, int64_t warmup, int64_t total);

// The ZeRO stage's --fsdp form: "" (stage 0: DDP), "shard_grad_op" (1, 2), "full_shard" (3), with
// " offload" for offload_optimizer.device cpu.
std::string deepspeed_fsdp(const DeepSpeedConfig& c);

}  // namespace tr::train
