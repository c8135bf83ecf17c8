// TrainingArguments: the subset of Hugging Face's flags the loop implements so far, with HF's names and
// defaults (../shared/SEMANTICS.md), plus the model/data arguments of run_clm.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace tr::train {

struct TrainingArguments {
  // model and data (run_clm's names)
  std::string model_name_or_path, config_name, tokenizer_name, train_file;
  int64_t block_size = 256;
  std::string attn_implementation = "sdpa";
  // TrainingArguments
  std::string output_dir;
  int64_t per_device_train_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  double learning_rate = 5e-5, weight_decay = 0.0, adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;
  std::string lr_scheduler_type = "linear";
  double warmup_steps = 0;  // a value in (0, 1) is a ratio of the total steps
  double warmup_ratio = 0;
  double logging_steps = 500;
  uint64_t seed = 42;
  bool gradient_checkpointing = false;
  int dataloader_num_workers = 0;
  // Checkpoints: output_dir/checkpoint-{step} every save_steps optimizer steps (ratio below 1) and at the
  // end; save_total_limit keeps the newest N (0: all). resume_from_checkpoint: a checkpoint folder, or "true"
  // for the newest one in output_dir.
  double save_steps = 500;
  int64_t save_total_limit = 0;
  std::string resume_from_checkpoint;

  // Throws naming the field for contradictory or out-of-range values.
  void validate() const;
  nlohmann::json to_json() const;
};

// Learning rate at optimizer step `step` (0-based) of `total`, HF's schedules: linear, cosine, constant,
// constant_with_warmup.
double lr_at(const std::string& schedule, double base_lr, int64_t step, int64_t warmup, int64_t total);

}  // namespace tr::train
