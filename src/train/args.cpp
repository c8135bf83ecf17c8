// TrainingArguments validation and serialization; HF's learning-rate schedules.
#include "train/args.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tr::train {

void TrainingArguments::validate() const {
  TR_CHECK(!output_dir.empty(), "--output_dir is required");
  TR_CHECK(model_name_or_path.empty() != config_name.empty(),
           "give exactly one of --model_name_or_path (fine-tune) and --config_name (train from scratch)");
  TR_CHECK(!train_file.empty(), "--train_file is required");
  TR_CHECK(per_device_train_batch_size > 0, "--per_device_train_batch_size must be positive, got {}",
           per_device_train_batch_size);
  TR_CHECK(gradient_accumulation_steps > 0, "--gradient_accumulation_steps must be positive, got {}",
           gradient_accumulation_steps);
  TR_CHECK(block_size > 1, "--block_size must be at least 2, got {}", block_size);
  TR_CHECK(learning_rate >= 0, "--learning_rate must not be negative");
  TR_CHECK(max_steps > 0 || num_train_epochs > 0, "--max_steps or --num_train_epochs must be positive");
  TR_CHECK(max_steps == -1 || max_steps > 0, "--max_steps must be positive (or -1), got {}", max_steps);
  TR_CHECK(warmup_steps >= 0 && warmup_ratio >= 0 && warmup_ratio < 1,
           "--warmup_steps/--warmup_ratio out of range");
  TR_CHECK(logging_steps > 0, "--logging_steps must be positive");
  TR_CHECK(save_steps > 0, "--save_steps must be positive");
  TR_CHECK(save_total_limit >= 0, "--save_total_limit must not be negative");
  const std::string s = lr_scheduler_type;
  TR_CHECK(s == "linear" || s == "cosine" || s == "constant" || s == "constant_with_warmup",
           "--lr_scheduler_type '{}' is not one of linear, cosine, constant, constant_with_warmup", s);
  TR_CHECK(attn_implementation == "eager" || attn_implementation == "sdpa" ||
               attn_implementation == "flash_attention_2",
           "--attn_implementation '{}' is not one of eager, sdpa, flash_attention_2", attn_implementation);
}

nlohmann::json TrainingArguments::to_json() const {
  return {{"model_name_or_path", model_name_or_path},
          {"config_name", config_name},
          {"tokenizer_name", tokenizer_name},
          {"train_file", train_file},
          {"block_size", block_size},
          {"attn_implementation", attn_implementation},
          {"output_dir", output_dir},
          {"per_device_train_batch_size", per_device_train_batch_size},
          {"gradient_accumulation_steps", gradient_accumulation_steps},
          {"learning_rate", learning_rate},
          {"weight_decay", weight_decay},
          {"adam_beta1", adam_beta1},
          {"adam_beta2", adam_beta2},
          {"adam_epsilon", adam_epsilon},
          {"max_grad_norm", max_grad_norm},
          {"num_train_epochs", num_train_epochs},
          {"max_steps", max_steps},
          {"lr_scheduler_type", lr_scheduler_type},
          {"warmup_steps", warmup_steps},
          {"warmup_ratio", warmup_ratio},
          {"logging_steps", logging_steps},
          {"seed", seed},
          {"gradient_checkpointing", gradient_checkpointing},
          {"dataloader_num_workers", dataloader_num_workers},
          {"save_steps", save_steps},
          {"save_total_limit", save_total_limit},
          {"resume_from_checkpoint", resume_from_checkpoint}};
}

double lr_at(const std::string& schedule, double base, int64_t step, int64_t warmup, int64_t total) {
  const double t = static_cast<double>(step), w = static_cast<double>(warmup), T = static_cast<double>(total);
  if (schedule == "constant") return base;
  if (step < warmup) return base * t / std::max(1.0, w);
  if (schedule == "constant_with_warmup") return base;
  const double progress = (t - w) / std::max(1.0, T - w);
  if (schedule == "cosine") return base * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
  return base * std::max(0.0, (T - t) / std::max(1.0, T - w));  // linear
}

}  // namespace tr::train
