// TrainingArguments with Hugging Face's names, types and defaults (../shared/SEMANTICS.md) plus run_clm's
// model and data arguments. One table (argument_specs) defines every flag: the CLI, the JSON args file,
// training_args.json and the flag reference (docs/FLAGS.md) are all generated from it.
#pragma once
#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"

namespace tr::train {

// --per_device_train_batch_size auto: the largest power of two the memory estimate fits (trainer.cpp).
// (INT64_MIN: no number a user would type; -1 stays an error as in HF.)
inline constexpr int64_t kAutoBatch = INT64_MIN;

// HF's IntervalStrategy (eval_strategy, save_strategy): "no", "steps", "epoch".
enum class IntervalStrategy { no, steps, epoch };
IntervalStrategy parse_interval_strategy(const std::string& name, const char* flag);

struct TrainingArguments {
  // model and data (run_clm's names)
  std::string model_name_or_path, config_name, tokenizer_name, train_file, validation_file;
  int64_t block_size = 256;
  int64_t validation_split_percentage = 5;
  std::string attn_implementation = "sdpa";
  std::string text_column_name;
  // from_pretrained's device_map and max_memory (eval; train refuses a split): "", a device, or auto.
  std::string device_map, max_memory;
  // ours: a model trained from --config_name gets vocab_size rounded up to a multiple of this (0: off), after
  // growing to the tokenizer's size when that is larger (run_clm's resize_token_embeddings(len(tokenizer))).
  int64_t pad_vocab_to_multiple_of =
      0;  // ours: the column of .jsonl/.json/.csv/.tsv files (empty: "text" or the first)
  // TrainingArguments
  std::string output_dir;
  bool overwrite_output_dir = false;
  bool do_eval = false;
  int64_t per_device_train_batch_size = 8, per_device_eval_batch_size = 8;  // train: kAutoBatch = "auto"
  std::string total_batch_size;  // ours: sequences ("64") or tokens ("65536tokens") per optimizer step
  int64_t gradient_accumulation_steps = 1;
  double learning_rate = 5e-5, weight_decay = 0.0, adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;
  std::string lr_scheduler_type = "linear";
  double warmup_steps = 0;  // a value in (0, 1) is a ratio of the total steps
  double warmup_ratio = 0;
  double logging_steps = 500;
  bool logging_first_step = false;
  bool logging_nan_inf_filter = true;  // a nan/inf step loss is logged as the window's mean so far (HF)
  std::string report_to = "none";      // tensorboard, jsonl, all, none, or a comma-separated list
  std::string logging_dir;             // empty: output_dir/runs/<time>_<host> (HF's default)
  std::string eval_strategy = "no";    // no | steps | epoch
  double eval_steps = 0;               // 0: logging_steps
  std::string save_strategy = "steps";
  double save_steps = 500;
  int64_t save_total_limit = 0;  // 0: keep all
  std::string resume_from_checkpoint;
  uint64_t seed = 42;
  bool fp16 = false, bf16 = false;
  // HF's Optional[bool]: unset (null in training_args.json) means off, except that torch_compile turns TF32
  // on for a GPU run without --fp16 (tf32_on()).
  std::optional<bool> tf32;
  bool use_cpu = false;  // train on the CPU even when a GPU is present
  std::string optim = "adamw_torch";
  std::string optim_args;
  bool gradient_checkpointing = false;
  int64_t dataloader_num_workers = 0;
  bool dataloader_pin_memory = true;
  bool dataloader_drop_last = false;
  int64_t torch_empty_cache_steps = 0;  // 0: never
  bool auto_find_batch_size = false;
  // torch_compile as HF: a backend or a mode turns it on; on, the backend defaults to inductor.
  bool torch_compile = false;
  std::string torch_compile_backend, torch_compile_mode;
  // Distributed training (read when the launcher's environment says WORLD_SIZE > 1; a single process accepts
  // and ignores them, as HF does).
  std::string ddp_backend;     // gloo | nccl; empty: nccl on GPUs, gloo on CPUs
  int64_t ddp_timeout = 1800;  // seconds, on every rendezvous wait and collective
  int64_t ddp_bucket_cap_mb = 25;
  bool ddp_find_unused_parameters = false, ddp_broadcast_buffers = false;
  std::string fsdp;         // space-separated: full_shard shard_grad_op hybrid_shard offload auto_wrap ...
  std::string fsdp_config;  // a JSON file of FSDP options
  bool average_tokens_across_devices = true;  // the loss normalized by the label tokens of every rank

  // HF's __post_init__ for compile: torch_compile set by a backend or mode, the backend defaulted.
  void apply_compile_defaults();

  // --total_batch_size in sequences (tokens / block_size); 0 when not given. Throws naming the flag.
  int64_t total_batch_sequences() const;
  // --fsdp's options, validated (empty: no sharding).
  std::vector<std::string> fsdp_options() const;
  bool fsdp_has(const std::string& option) const;
  // Whether report_to asks for TensorBoard event files ("tensorboard" or "all").
  bool reports_tensorboard() const;

  // Throws naming the flag for contradictory or out-of-range values, suggesting the nearest valid name.
  void validate() const;
  // Whether f32 matmuls read TF32 inputs on `device`: --tf32 when given, else torch_compile on a GPU without
  // --fp16 (HF sets torch.backends.cuda.matmul.allow_tf32 for compile unless tf32 was given or fp16 is on).
  bool tf32_on(Device device) const;
  // What the torch_compile backend and mode do beyond the planned replay (after apply_compile_defaults):
  // inductor fuses elementwise chains; inductor, cudagraphs and aot_cudagraphs replay as CUDA graphs on a
  // GPU, except under mode max-autotune-no-cudagraphs; eager and aot_eager do neither (for debugging).
  bool compile_fuses() const;
  bool compile_device_graphs() const;
  // max-autotune and max-autotune-no-cudagraphs: each GEMM shape's cuBLASLt candidates timed once.
  bool compile_autotunes() const;
  nlohmann::json to_json() const;
  // Reads an args file (HF accepts `train.py args.json`): keys are flag names; an unknown key or a value of
  // the wrong type is an error naming the file and key.
  void update_from_json(const nlohmann::json& j, const std::string& source);
  void update_from_file(const std::string& path);
};

// One flag: its name, help, and the member it sets.
struct ArgSpec {
  using Member = std::variant<int64_t TrainingArguments::*, uint64_t TrainingArguments::*,
                              double TrainingArguments::*, bool TrainingArguments::*,
                              std::optional<bool> TrainingArguments::*, std::string TrainingArguments::*>;
  std::string name;
  Member member;
  std::string help;
  std::string group;  // "model and data" | "training" | "evaluation and saving" | "precision and memory" |
                      // "distributed"
};
const std::vector<ArgSpec>& argument_specs();
std::vector<std::string> argument_names();
// The flag reference (markdown table per group, defaults from a default-constructed TrainingArguments).
std::string flags_markdown();

// Learning rate at optimizer step `step` (0-based) of `total`, HF's schedules: linear, cosine, constant,
// constant_with_warmup.
double lr_at(const std::string& schedule, double base_lr, int64_t step, int64_t warmup, int64_t total);
const std::vector<std::string>& scheduler_names();

}  // namespace tr::train
