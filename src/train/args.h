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

namespace tr::optim {
struct OptimizerOptions;
}

namespace tr::train {

// --per_device_train_batch_size auto: the largest power of two the memory estimate fits (trainer.cpp).
// (INT64_MIN: no number a user would type; -1 stays an error as in HF.)
inline constexpr int64_t kAutoBatch = INT64_MIN;

// HF's IntervalStrategy (eval_strategy, logging_strategy, save_strategy): "no", "steps", "epoch" (and
// save_strategy's "best": a save whenever an evaluation finds a new best metric).
enum class IntervalStrategy { no, steps, epoch, best };
IntervalStrategy parse_interval_strategy(const std::string& name, const char* flag);

struct TrainingArguments {
  // model and data (run_clm's names)
  std::string model_name_or_path, config_name, tokenizer_name, train_file, validation_file;
  // run_clm's from-scratch path: HF's config class of this type at its defaults, edited by config_overrides.
  std::string model_type, config_overrides;
  int64_t block_size = 256;
  int64_t validation_split_percentage = 5;
  std::string attn_implementation = "sdpa";
  // run_clm's model dtype (from_pretrained's torch_dtype; transformers 5 calls it dtype): "" (None: f32),
  // float32, bfloat16 (the model's own weights bf16, trained without fp32 masters) or auto (the checkpoint
  // config's torch_dtype).
  std::string torch_dtype, dtype;
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
  double label_smoothing_factor = 0.0;  // HF's LabelSmoother epsilon (0: none)
  double neftune_noise_alpha = 0.0;     // NEFTune's embedding noise (HF's None: 0, none)
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;
  std::string lr_scheduler_type = "linear";
  std::string lr_scheduler_kwargs;  // a JSON object of the schedule's own arguments (HF's dict)
  double warmup_steps = 0;          // a value in (0, 1) is a ratio of the total steps
  double warmup_ratio = 0;
  std::string logging_strategy = "steps";  // no | steps | epoch
  double logging_steps = 500;
  bool logging_first_step = false;
  bool logging_nan_inf_filter = true;  // a nan/inf step loss is logged as the window's mean so far (HF)
  std::string report_to = "none";      // tensorboard, jsonl, all, none, or a comma-separated list
  std::string logging_dir;             // empty: output_dir/runs/<time>_<host> (HF's default)
  std::string eval_strategy = "no";    // no | steps | epoch
  double eval_steps = 0;               // 0: logging_steps
  double eval_delay = 0;               // steps (epochs under eval_strategy epoch) before the first evaluation
  bool eval_on_start = false;          // an evaluation before the first step (a sanity check)
  // The evaluation metric that picks the best checkpoint ("loss" or "perplexity", with or without eval_);
  // empty: loss when load_best_model_at_end or reduce_lr_on_plateau needs one, else none tracked.
  std::string metric_for_best_model;
  std::optional<bool> greater_is_better;  // unset: false for a metric ending in "loss" (HF)
  bool load_best_model_at_end = false;    // the final model is the best checkpoint's
  std::string save_strategy = "steps";
  double save_steps = 500;
  int64_t save_total_limit = 0;  // 0: keep all
  bool save_only_model = false;  // checkpoints without optimizer, scheduler and RNG state (no resume)
  bool do_train = true;          // run_clm's: trainer train always trains (false is refused)
  bool do_predict = false;       // run_clm has no test split (true is refused)
  std::string resume_from_checkpoint;
  uint64_t seed = 42;
  bool fp16 = false, bf16 = false;
  // HF's Optional[bool]: unset (null in training_args.json) means off, except that torch_compile turns TF32
  // on for a GPU run without --fp16 (tf32_on()).
  std::optional<bool> tf32;
  bool use_cpu = false;  // train on the CPU even when a GPU is present
  std::string optim = "adamw_torch";
  std::string optim_args;
  // GaLore's targets: a regex of module names, all-linear, or a JSON list (HF's optim_target_modules).
  std::string optim_target_modules;
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
  std::string deepspeed;    // a DeepSpeed config file (or its JSON text): ZeRO stage, AdamW, schedule, fp16
  bool average_tokens_across_devices = true;  // the loss normalized by the label tokens of every rank
  // run_clm's and HF's arguments that do something here
  int64_t max_train_samples = 0, max_eval_samples = 0;  // the first N blocks (0: all; HF's None)
  int64_t data_seed = -1;                               // the data order's seed (-1: seed)
  bool ignore_data_skip = false;           // a resume starts its epoch's data from the first batch (HF's)
  int64_t dataloader_prefetch_factor = 0;  // batches queued per worker (0: HF's None, 2 with workers)
  std::string include_num_input_tokens_seen = "no";  // no | all | non_padding (true = all, false = no)
  std::string run_name;       // the run's name (HF's integrations); in the banner and TensorBoard
  bool disable_tqdm = false;  // log lines instead of the progress bar
  std::string log_level = "passive", log_level_replica = "warning";
  std::string
      gradient_checkpointing_kwargs;  // JSON: torch.utils.checkpoint's use_reentrant / preserve_rng_state
  // HF's arguments whose value is what this Trainer always does (checked, kept in training_args.json)
  bool full_determinism = false, skip_memory_metrics = true, include_tokens_per_second = false;
  bool dataloader_persistent_workers = false, prediction_loss_only = false, remove_unused_columns = true;
  bool group_by_length = false, save_safetensors = true, use_fast_tokenizer = true, low_cpu_mem_usage = false;
  bool log_on_each_node = true, overwrite_cache = false;
  int64_t eval_accumulation_steps = 0, preprocessing_num_workers = 0;  // HF's None
  int64_t local_rank = -1;  // torch.distributed.launch's --local_rank (LOCAL_RANK in the environment wins)

  // HF's __post_init__ for compile: torch_compile set by a backend or mode, the backend defaulted.
  void apply_compile_defaults();

  // --total_batch_size in sequences (tokens / block_size); 0 when not given. Throws naming the flag.
  int64_t total_batch_sequences() const;
  // --fsdp's options, validated (empty: no sharding).
  std::vector<std::string> fsdp_options() const;
  bool fsdp_has(const std::string& option) const;
  // --torch_dtype / --dtype as given ("" when neither): the one model dtype name.
  const std::string& model_dtype() const { return dtype.empty() ? torch_dtype : dtype; }
  // Whether report_to asks for TensorBoard event files ("tensorboard" or "all").
  bool reports_tensorboard() const;
  // metric_for_best_model with HF's defaults applied: "eval_loss" when load_best_model_at_end or
  // reduce_lr_on_plateau needs a metric and none was given; "eval_"-prefixed; "" when none is tracked.
  std::string best_metric_key() const;
  // greater_is_better with HF's default (false for a metric ending in "loss").
  bool best_metric_greater() const;
  // Whether the final model is evaluated: --do_eval, or any eval_strategy (HF turns do_eval on with one,
  // and run_clm then evaluates the final model).
  bool evaluates_at_end() const;
  // Whether each log line carries num_input_tokens_seen (packed blocks have no padding: all = non_padding).
  bool logs_input_tokens() const {
    return include_num_input_tokens_seen != "no" && include_num_input_tokens_seen != "false";
  }
  // Whether the run reads a validation stream: an evaluation at the end or on start.
  bool evaluates() const { return evaluates_at_end() || eval_on_start; }

  // A model made fresh (--config_name or --model_type) rather than loaded (--model_name_or_path).
  bool from_scratch() const { return !config_name.empty() || !model_type.empty(); }
  // Throws naming the flag for contradictory or out-of-range values, suggesting the nearest valid name.
  void validate() const;
  // Its parts.
  void validate_run() const;
  void validate_optimizer() const;
  void validate_model_dtype() const;
  // The flags that cannot train half-precision weights (--torch_dtype bfloat16, or auto over a bf16
  // checkpoint): throws naming the first.
  void check_half_weight_flags() const;
  void validate_intervals() const;
  void validate_devices() const;
  void validate_distributed() const;
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
  bool read_hf_form(const std::string& key, const nlohmann::json& value, const std::string& source);
  void update_from_file(const std::string& path);
};

// The optimizer's options from the flags (learning rate, Adam betas and epsilon, weight decay, --optim_args),
// as the run and its memory estimate build the optimizer.
optim::OptimizerOptions optimizer_options(const TrainingArguments& a);

// One flag: its name, help, and the member it sets.
struct ArgSpec {
  using Member = std::variant<int64_t TrainingArguments::*, uint64_t TrainingArguments::*,
                              double TrainingArguments::*, bool TrainingArguments::*,
                              std::optional<bool> TrainingArguments::*, std::string TrainingArguments::*>;
  std::string name;
  Member member;
  std::string help;
  std::string group;  // "model and data" | "training" | "evaluation and saving" | "precision and memory" |
                      // "distributed" | "compatibility"
};
const std::vector<ArgSpec>& argument_specs();
std::vector<std::string> argument_names();
// HF's TrainingArguments and run_clm arguments that are not flags here: why, and the value HF defaults to
// (an arguments file may hold it: HF's own dumps list every field). Null when `name` is none of them.
struct UnsupportedArg {
  std::string name;
  nlohmann::json hf_default;  // the values an args file may give and still train as HF would
  std::string why;
};
const UnsupportedArg* unsupported_hf_argument(const std::string& name);
// The flag reference (markdown table per group, defaults from a default-constructed TrainingArguments).
std::string flags_markdown();

}  // namespace tr::train
