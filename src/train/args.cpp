// TrainingArguments: validation, HF's defaults for the best metric, JSON in and out, the flag reference (the
// table itself: args_table.cpp).
#include "train/args.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/json_fields.h"
#include "core/suggest.h"
#include "core/threads.h"
#include "optim/optimizer.h"
#include "train/deepspeed_config.h"
#include "train/lr_schedule.h"

namespace tr::train {

using A = TrainingArguments;

namespace {

void check_one_of(const std::string& flag, const std::string& v, const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return;
  const std::string list = fmt::format("{}", fmt::join(allowed, ", "));
  fail("--{} '{}' is not one of {}{}", flag, v, list, did_you_mean(v, allowed));
}

}  // namespace

namespace {

// torch.compile's backends that train here, and why the other names torch users meet are not among them.
void check_compile_backend(const std::string& name) {
  if (name.empty()) return;
  static const std::vector<std::string> valid = {"inductor", "cudagraphs", "aot_cudagraphs", "aot_eager",
                                                 "eager"};
  if (std::find(valid.begin(), valid.end(), name) != valid.end()) return;
  static const std::vector<std::pair<std::string, const char*>> refused = {
      {"nvfuser", "retired in PyTorch 2 with TorchScript's nvFuser"},
      {"aot_nvfuser", "retired in PyTorch 2 with TorchScript's nvFuser"},
      {"aot_ts_nvfuser", "retired in PyTorch 2 with TorchScript's nvFuser"},
      {"aot_ts", "retired in PyTorch 2 with TorchScript"},
      {"ofi", "inference-only (TorchScript's optimize_for_inference)"},
      {"fx2trt", "inference-only (TensorRT)"},
      {"tensorrt", "inference-only (TensorRT)"},
      {"torch_tensorrt", "inference-only (TensorRT)"},
      {"onnxrt", "inference-only (ONNX Runtime)"},
      {"tvm", "inference-only (Apache TVM)"},
      {"ipex", "inference-only (Intel Extension for PyTorch)"},
      {"openxla", "for XLA devices (torch_xla), not this Trainer's CPU or CUDA"},
      {"openxla_eval", "inference-only, for XLA devices"},
  };
  const std::string list = "inductor, cudagraphs, aot_cudagraphs, aot_eager, eager";
  for (const auto& [n, why] : refused)
    TR_CHECK(n != name, "--torch_compile_backend {}: not a training backend here: {}; valid: {}", name, why,
             list);
  fail("--torch_compile_backend: unknown backend '{}'{}; valid: {}", name, did_you_mean(name, valid), list);
}

// report_to's names: ours, and why HF's other integrations are not (each is a Python library).
std::vector<std::string> report_names(const std::string& report_to) {
  static const std::vector<std::string> valid = {"tensorboard", "jsonl", "all", "none"};
  static const std::vector<std::string> python = {"wandb",      "mlflow",   "comet_ml", "neptune",
                                                  "clearml",    "dagshub",  "dvclive",  "flyte",
                                                  "codecarbon", "azure_ml", "swanlab",  "trackio"};
  std::vector<std::string> names;
  std::stringstream in(report_to);
  for (std::string n; std::getline(in, n, ',');) {
    n.erase(0, n.find_first_not_of(" "));
    n.erase(n.find_last_not_of(" ") + 1);
    if (n.empty()) continue;
    TR_CHECK(std::find(python.begin(), python.end(), n) == python.end(),
             "--report_to {}: HF's {} integration is a Python library, not available here; valid: "
             "tensorboard, jsonl, all, none (metrics.jsonl is always written)",
             n, n);
    TR_CHECK(std::find(valid.begin(), valid.end(), n) != valid.end(),
             "--report_to: unknown integration '{}'{}; valid: tensorboard, jsonl, all, none", n,
             did_you_mean(n, valid));
    names.push_back(n);
  }
  TR_CHECK(names.size() <= 1 || std::find(names.begin(), names.end(), "none") == names.end(),
           "--report_to {}: 'none' cannot be combined with other integrations", report_to);
  return names;
}

}  // namespace

int64_t TrainingArguments::total_batch_sequences() const {
  if (total_batch_size.empty()) return 0;
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(total_batch_size, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = total_batch_size.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  TR_CHECK(used > 0 && n > 0 && (unit.empty() || unit == "tokens"),
           "--total_batch_size '{}': expected a positive number of sequences (64) or of tokens (65536tokens)",
           total_batch_size);
  if (unit.empty()) return n;
  TR_CHECK(block_size > 0, "--block_size must be positive, got {}", block_size);
  TR_CHECK(n % block_size == 0,
           "--total_batch_size {}: {} tokens are not a whole number of --block_size {} sequences",
           total_batch_size, n, block_size);
  return n / block_size;
}

bool TrainingArguments::reports_tensorboard() const {
  for (const auto& n : report_names(report_to))
    if (n == "tensorboard" || n == "all") return true;
  return false;
}

std::string TrainingArguments::best_metric_key() const {
  std::string m = metric_for_best_model;
  if (m.empty() && (load_best_model_at_end || lr_scheduler_type == "reduce_lr_on_plateau")) m = "loss";
  if (m.empty()) return m;
  return m.rfind("eval_", 0) == 0 ? m : "eval_" + m;
}

bool TrainingArguments::best_metric_greater() const {
  const std::string m = best_metric_key();
  return greater_is_better.value_or(!(m.size() >= 4 && m.compare(m.size() - 4, 4, "loss") == 0));
}

bool TrainingArguments::evaluates_at_end() const {
  return do_eval || parse_interval_strategy(eval_strategy, "eval_strategy") != IntervalStrategy::no;
}

namespace {

// HF's checks of the best-model arguments (TrainingArguments.__post_init__), and the metric named one that
// our evaluation reports (HF finds out at the first evaluation).
void check_best_model(const TrainingArguments& a) {
  const std::string key = a.best_metric_key();
  if (!key.empty()) {
    // The group's metrics only: every rank must take the same decisions (a save, a rate, the final model),
    // and eval_runtime / eval_samples_per_second are each rank's own timing.
    const std::vector<std::string> metrics = {"eval_loss", "eval_perplexity"};
    TR_CHECK(std::find(metrics.begin(), metrics.end(), key) != metrics.end(),
             "--metric_for_best_model {}: expected loss or perplexity (the evaluation's metrics every rank "
             "shares){}",
             a.metric_for_best_model, did_you_mean(key, metrics));
  }
  TR_CHECK(a.save_strategy != "best" || !key.empty(),
           "--save_strategy best needs --metric_for_best_model (e.g. loss)");
  TR_CHECK(a.lr_scheduler_type != "reduce_lr_on_plateau" || a.eval_strategy != "no",
           "--lr_scheduler_type reduce_lr_on_plateau is stepped by evaluations: give --eval_strategy steps "
           "or epoch");
  TR_CHECK(a.save_strategy != "best" || a.eval_strategy != "no",
           "--save_strategy best saves when an evaluation finds a new best: give --eval_strategy steps or "
           "epoch");
  if (!a.load_best_model_at_end || a.save_strategy == "best") return;
  TR_CHECK(
      a.eval_strategy == a.save_strategy,
      "--load_best_model_at_end requires the save and eval strategies to match, but found --eval_strategy "
      "{} and --save_strategy {}",
      a.eval_strategy, a.save_strategy);
  if (a.eval_strategy != "steps") return;
  const double eval = a.eval_steps > 0 ? a.eval_steps : a.logging_steps, save = a.save_steps;
  if (std::fmod(save, eval) == 0) return;
  TR_CHECK(eval < 1 && save < 1,
           "--load_best_model_at_end requires the saving steps to be a multiple of the evaluation steps, {}",
           eval < 1 || save < 1
               ? fmt::format("which cannot be guaranteed when mixing a ratio and a step count: --save_steps "
                             "{} and --eval_steps {}",
                             save, eval)
               : fmt::format("but --save_steps {} is not a multiple of --eval_steps {}", save, eval));
  // Two ratios compared as HF does, in millionths (0.2 / 0.1 leaves a floating-point remainder).
  TR_CHECK(std::llround(eval * 1e6) > 0 && std::llround(save * 1e6) % std::llround(eval * 1e6) == 0,
           "--load_best_model_at_end requires the saving steps to be a multiple of the evaluation steps, but "
           "--save_steps {} is not a multiple of --eval_steps {}",
           save, eval);
}

}  // namespace

namespace {

// The run_clm / HF arguments beside the guide's: ranges, and the values this Trainer has (the others
// refused with what to do instead).
void check_hf_extras(const TrainingArguments& a) {
  TR_CHECK(a.max_train_samples >= 0, "--max_train_samples {}: expected a number of blocks >= 0 (0: all)",
           a.max_train_samples);
  TR_CHECK(a.max_eval_samples >= 0, "--max_eval_samples {}: expected a number of blocks >= 0 (0: all)",
           a.max_eval_samples);
  TR_CHECK(a.data_seed >= -1, "--data_seed {}: expected a seed >= 0 (-1: --seed)", a.data_seed);
  TR_CHECK(
      !a.ignore_data_skip ||
          (a.eval_strategy != "epoch" && a.save_strategy != "epoch" && a.logging_strategy != "epoch"),
      "--ignore_data_skip restarts the resumed epoch's batches, so the data's epochs no longer end where the "
      "steps' do: give steps strategies with it (eval_strategy {}, save_strategy {}, logging_strategy {})",
      a.eval_strategy, a.save_strategy, a.logging_strategy);
  TR_CHECK(a.dataloader_prefetch_factor >= 0 && a.dataloader_prefetch_factor <= 1024,
           "--dataloader_prefetch_factor {}: expected 1 to 1024 batches per worker (0: the default)",
           a.dataloader_prefetch_factor);
  TR_CHECK(
      a.dataloader_prefetch_factor == 0 || a.dataloader_num_workers > 0,
      "--dataloader_prefetch_factor can only be set when data is loaded in a different process, i.e. when "
      "--dataloader_num_workers > 0 (HF's rule; here the workers are threads)");
  check_one_of("include_num_input_tokens_seen", a.include_num_input_tokens_seen,
               {"no", "all", "non_padding", "true", "false"});
  const std::vector<std::string> levels = {"debug", "info", "warning", "error", "critical", "passive"};
  check_one_of("log_level", a.log_level, levels);
  check_one_of("log_level_replica", a.log_level_replica, levels);
  if (!a.gradient_checkpointing_kwargs.empty()) {
    const auto j = nlohmann::json::parse(a.gradient_checkpointing_kwargs, nullptr, false);
    TR_CHECK(j.is_object(),
             "--gradient_checkpointing_kwargs '{}': expected a JSON object, e.g. "
             "'{{\"use_reentrant\": false}}'",
             a.gradient_checkpointing_kwargs);
    for (auto it = j.begin(); it != j.end(); ++it)
      TR_CHECK(
          (it.key() == "use_reentrant" || it.key() == "preserve_rng_state") && it->is_boolean(),
          "--gradient_checkpointing_kwargs: '{}': {}; expected use_reentrant or preserve_rng_state, true or "
          "false",
          it.key(), it->dump());
  }
  TR_CHECK(a.save_safetensors,
           "--save_safetensors false: weights are saved as safetensors only (HF's "
           "pickled pytorch_model.bin needs Python)");
  TR_CHECK(a.use_fast_tokenizer,
           "--use_fast_tokenizer false: the tokenizer here is tokenizer.json's (the fast "
           "one); the slow Python tokenizers are not available");
  TR_CHECK(a.eval_accumulation_steps >= 0 && a.preprocessing_num_workers >= 0,
           "--eval_accumulation_steps and --preprocessing_num_workers must not be negative");
}

}  // namespace

IntervalStrategy parse_interval_strategy(const std::string& name, const char* flag) {
  if (name == "no") return IntervalStrategy::no;
  if (name == "steps") return IntervalStrategy::steps;
  if (name == "epoch") return IntervalStrategy::epoch;
  if (name == "best" && std::string(flag) == "save_strategy") return IntervalStrategy::best;
  fail("--{} '{}': expected no, steps{}", flag, name,
       std::string(flag) == "save_strategy" ? ", epoch or best" : " or epoch");
}

void TrainingArguments::validate() const {
  validate_run();
  validate_optimizer();
  validate_intervals();
  validate_devices();
  validate_distributed();
  check_best_model(*this);
  check_hf_extras(*this);
}

// What to train on, in what batches, where.
void TrainingArguments::validate_run() const {
  TR_CHECK(!output_dir.empty(), "--output_dir is required");
  TR_CHECK(
      (model_name_or_path.empty() ? 0 : 1) + (config_name.empty() ? 0 : 1) + (model_type.empty() ? 0 : 1) ==
          1,
      "give exactly one of --model_name_or_path (fine-tune), --config_name or --model_type (train from "
      "scratch)");
  TR_CHECK(config_overrides.empty() || !model_type.empty(),
           "--config_overrides can't be used in combination with --config_name or --model_name_or_path (HF's "
           "rule): edit that config.json, or give --model_type");
  TR_CHECK(!train_file.empty(), "--train_file is required");
  TR_CHECK(per_device_train_batch_size > 0 || per_device_train_batch_size == kAutoBatch,
           "--per_device_train_batch_size must be positive or auto, got {}", per_device_train_batch_size);
  const int64_t total = total_batch_sequences();  // throws on a malformed value
  TR_CHECK(
      total == 0 || per_device_train_batch_size == kAutoBatch || total % per_device_train_batch_size == 0,
      "--total_batch_size {} ({} sequences) is not a multiple of --per_device_train_batch_size {}",
      total_batch_size, total, per_device_train_batch_size);
  TR_CHECK(per_device_eval_batch_size > 0, "--per_device_eval_batch_size must be positive, got {}",
           per_device_eval_batch_size);
  TR_CHECK(gradient_accumulation_steps > 0, "--gradient_accumulation_steps must be positive, got {}",
           gradient_accumulation_steps);
  TR_CHECK(block_size > 1, "--block_size must be at least 2, got {}", block_size);
  TR_CHECK(validation_split_percentage >= 0 && validation_split_percentage < 100,
           "--validation_split_percentage must be in [0, 100), got {}", validation_split_percentage);
  TR_CHECK(dataloader_num_workers >= 0 && dataloader_num_workers <= max_pool_threads(),
           "--dataloader_num_workers {}: expected 0 (the main thread builds the batches) up to {} threads",
           dataloader_num_workers, max_pool_threads());
  TR_CHECK(torch_empty_cache_steps >= 0, "--torch_empty_cache_steps must not be negative");
  TR_CHECK(!(fp16 && bf16), "--fp16 and --bf16 are mutually exclusive: choose one half-precision type");
  check_one_of("attn_implementation", attn_implementation, {"eager", "sdpa", "flash_attention_2"});
  validate_model_dtype();
}

// --torch_dtype / --dtype: bfloat16 trains the model's own bf16 weights (no fp32 masters).
void TrainingArguments::validate_model_dtype() const {
  for (const auto& [flag, v] : {std::pair{"torch_dtype", &torch_dtype}, std::pair{"dtype", &dtype}})
    if (!v->empty()) check_one_of(flag, *v, {"auto", "float32", "bfloat16", "float16"});
  TR_CHECK(
      torch_dtype.empty() || dtype.empty() || torch_dtype == dtype,
      "--torch_dtype {} and --dtype {}: one model dtype (dtype is transformers 5's name for torch_dtype)",
      torch_dtype, dtype);
  const std::string& d = model_dtype();
  TR_CHECK(d != "float16",
           "--{} float16: fp16 weights trained without fp32 masters or loss scaling lose small updates and "
           "overflow; train with --fp16 (fp32 masters, dynamic loss scaling) or --{} bfloat16",
           dtype.empty() ? "torch_dtype" : "dtype", dtype.empty() ? "torch_dtype" : "dtype");
  if (d == "bfloat16") check_half_weight_flags();  // auto: once the checkpoint's dtype is read
}

void TrainingArguments::check_half_weight_flags() const {
  const std::string what = fmt::format("--{} {}", dtype.empty() ? "torch_dtype" : "dtype", model_dtype());
  TR_CHECK(!fp16,
           "{} with --fp16: the weights are bf16; fp16 compute over them is not a precision HF trains "
           "either (its GradScaler refuses half gradients) - drop --fp16 (bf16 compute) or the dtype",
           what);
  TR_CHECK(fsdp.empty() && deepspeed.empty(),
           "{} with --{}: sharded training keeps fp32 masters; drop the dtype (--bf16 computes in bf16 over "
           "fp32 masters) or train in one process",
           what, fsdp.empty() ? "deepspeed" : "fsdp");
  optim::check_half_weights(optim);
}

// The optimizer's and the schedule's numbers, as torch.optim and HF check them.
void TrainingArguments::validate_optimizer() const {
  // The optimizers' own ranges, as torch.optim checks them (a NaN fails every comparison here).
  TR_CHECK(std::isfinite(learning_rate) && learning_rate >= 0,
           "--learning_rate {}: expected a finite number >= 0", learning_rate);
  // the optimizers that read them (AdamW and Lion; the others ignore them, as HF)
  if (optim.find("adamw") != std::string::npos || optim.find("lion") != std::string::npos ||
      optim.find("ademamix") != std::string::npos) {
    TR_CHECK(adam_beta1 >= 0 && adam_beta1 < 1, "--adam_beta1 {}: expected a number in [0, 1)", adam_beta1);
    TR_CHECK(adam_beta2 >= 0 && adam_beta2 < 1, "--adam_beta2 {}: expected a number in [0, 1)", adam_beta2);
  }
  TR_CHECK(std::isfinite(adam_epsilon) && adam_epsilon >= 0,
           "--adam_epsilon {}: expected a finite number >= 0", adam_epsilon);
  TR_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
           "--weight_decay {}: expected a finite number >= 0", weight_decay);
  TR_CHECK(!std::isnan(max_grad_norm), "--max_grad_norm nan: expected a number (0 or less: no clipping)");
  // HF takes any value; outside [0, 1] the target has negative weights (torch's label_smoothing refuses it).
  TR_CHECK(label_smoothing_factor >= 0.0 && label_smoothing_factor <= 1.0,
           "--label_smoothing_factor {}: expected 0 to 1 (0: no smoothing)", label_smoothing_factor);
  TR_CHECK(std::isfinite(neftune_noise_alpha) && neftune_noise_alpha >= 0,
           "--neftune_noise_alpha {}: expected a finite number >= 0 (0: off; NEFTune's paper used 5 to 15)",
           neftune_noise_alpha);
  TR_CHECK(std::isfinite(num_train_epochs), "--num_train_epochs {}: expected a finite number",
           num_train_epochs);
  TR_CHECK(max_steps > 0 || num_train_epochs > 0, "--max_steps or --num_train_epochs must be positive");
  TR_CHECK(max_steps == -1 || max_steps > 0, "--max_steps must be positive (or -1), got {}", max_steps);
  TR_CHECK(std::isfinite(warmup_steps) && warmup_steps >= 0,
           "--warmup_steps {}: expected a finite number >= 0", warmup_steps);
  TR_CHECK(warmup_ratio >= 0 && warmup_ratio <= 1, "--warmup_ratio {}: expected a number in [0, 1] (as HF)",
           warmup_ratio);
  optim::check_optimizer_name(optim);
  // The optimizer over no parameters: its --optim_args checked before any model or data loads.
  (void)optim::make_optimizer(optim, {}, optimizer_options(*this));
  // An update made during backward cannot be taken back: fp16's overflow skip has nothing left to skip.
  TR_CHECK(!fp16 || !optim::updates_in_backward(optim),
           "--optim {} with --fp16: {} updates each parameter during backward, so a step whose gradients "
           "overflow cannot be skipped as fp16's loss scaling requires; train with --bf16 or in fp32",
           optim, optim);
  // HF's own check (trainer_optimizer.py): the layer-wise optimizers step in every backward.
  TR_CHECK(
      !optim.ends_with("_layerwise") || gradient_accumulation_steps == 1,
      "--optim {} with --gradient_accumulation_steps {}: the layer-wise optimizers update each parameter "
      "in every backward and take no gradient accumulation (as HF); use --optim {} to accumulate",
      optim, gradient_accumulation_steps, optim.substr(0, optim.size() - 10));
  check_compile_backend(torch_compile_backend);
  (void)LrSchedule(lr_scheduler_type, lr_scheduler_kwargs, learning_rate);  // throws on a bad name or kwargs
}

optim::OptimizerOptions optimizer_options(const TrainingArguments& a) {
  optim::OptimizerOptions oo;
  oo.lr = a.learning_rate;
  oo.beta1 = a.adam_beta1;
  oo.beta2 = a.adam_beta2;
  oo.eps = a.adam_epsilon;
  oo.weight_decay = a.weight_decay;
  oo.warmup_steps =
      a.warmup_steps >= 1 ? static_cast<int64_t>(std::min(a.warmup_steps, 9e15)) : 0;  // ratio: run_setup
  oo.args = optim::parse_optim_args(a.optim_args);  // throws on a malformed entry
  oo.target_modules = a.optim_target_modules;
  return oo;
}

// Logging, evaluation and saving (HF's interval strategies), and run_clm's do_* switches.
void TrainingArguments::validate_intervals() const {
  TR_CHECK(std::isfinite(logging_steps) && logging_steps > 0,
           "--logging_steps {}: expected a positive number (a ratio of the run below 1)", logging_steps);
  TR_CHECK(std::isfinite(save_steps) && save_steps > 0,
           "--save_steps {}: expected a positive number (a ratio of the run below 1)", save_steps);
  TR_CHECK(std::isfinite(eval_steps) && eval_steps >= 0,
           "--eval_steps {}: expected a number >= 0 (0: --logging_steps; a ratio of the run below 1)",
           eval_steps);
  TR_CHECK(save_total_limit >= 0, "--save_total_limit must not be negative");
  check_one_of("eval_strategy", eval_strategy, {"no", "steps", "epoch"});
  check_one_of("save_strategy", save_strategy, {"no", "steps", "epoch", "best"});
  check_one_of("logging_strategy", logging_strategy, {"no", "steps", "epoch"});
  TR_CHECK(do_train,
           "--do_train false: trainer train always trains; to evaluate a model without training, run trainer "
           "eval --model_name_or_path DIR --validation_file FILE");
  TR_CHECK(
      !do_predict,
      "--do_predict: run_clm has no test split to predict on; evaluate a held-out file with trainer eval "
      "--validation_file FILE");
  TR_CHECK(std::isfinite(eval_delay) && eval_delay >= 0, "--eval_delay {}: expected a number >= 0",
           eval_delay);
}

// device_map auto trains a split model as HF does: a naive pipeline, one device busy at a time. Sharding
// and the compiled step keep one device per process, so they do not take a split.
void TrainingArguments::validate_devices() const {
  TR_CHECK(device_map.empty() || device_map == "auto", "--device_map {}: {}", device_map,
           "train picks its device itself (the GPU, or the CPU with --use_cpu); give auto to split a model "
           "too large for one device (with --max_memory), or a device to trainer eval and generate");
  TR_CHECK(max_memory.empty() || device_map == "auto", "--max_memory {} goes with --device_map auto",
           max_memory);
  TR_CHECK(device_map.empty() || per_device_train_batch_size != kAutoBatch,
           "--device_map auto and --per_device_train_batch_size auto: the batch is chosen by one device's "
           "estimate; give a number (--auto_find_batch_size still retries after an out-of-memory)");
  TR_CHECK(device_map.empty() || fsdp.empty(),
           "--device_map auto and --fsdp {}: a model is either split across devices or sharded across "
           "processes; --fsdp alone keeps every GPU busy",
           fsdp);
  TR_CHECK(
      device_map.empty() || !(torch_compile || !torch_compile_backend.empty() || !torch_compile_mode.empty()),
      "--device_map auto and --torch_compile: the compiled step runs on one device; drop one of them");
  if (!torch_compile_mode.empty())
    check_one_of("torch_compile_mode", torch_compile_mode,
                 {"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"});
}

// DDP and FSDP, with HF's own check (TrainingArguments.__post_init__).
void TrainingArguments::validate_distributed() const {
  if (!ddp_backend.empty()) check_one_of("ddp_backend", ddp_backend, {"gloo", "nccl"});
  TR_CHECK(ddp_timeout > 0 && ddp_timeout <= 30 * 86400,
           "--ddp_timeout must be in [1, 2592000] seconds (30 days), got {}", ddp_timeout);
  TR_CHECK(ddp_bucket_cap_mb > 0 && ddp_bucket_cap_mb <= 65536,
           "--ddp_bucket_cap_mb must be in [1, 65536], got {}", ddp_bucket_cap_mb);
  fsdp_options();                                                  // throws on an unknown option
  if (!deepspeed.empty()) (void)read_deepspeed_config(deepspeed);  // a bad file fails before any work
  TR_CHECK(pad_vocab_to_multiple_of >= 0 && pad_vocab_to_multiple_of <= (1 << 20),
           "--pad_vocab_to_multiple_of must be in [0, 1048576], got {}", pad_vocab_to_multiple_of);
  report_names(report_to);  // throws on an unknown integration
  // HF's own check (TrainingArguments.__post_init__), for every run.
  const std::vector<std::string> fsdp_list = fsdp_options();  // throws on an unknown option
  TR_CHECK(fsdp_list != std::vector<std::string>{"offload"},
           "--fsdp offload can't work on its own. It needs to be added to --fsdp full_shard or --fsdp "
           "shard_grad_op. For example, --fsdp \"full_shard offload\"");
  int strategies = 0;
  for (const char* st : {"full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2"})
    strategies += fsdp_has(st) ? 1 : 0;
  TR_CHECK(
      strategies <= 1,
      "--fsdp {}: full_shard, shard_grad_op, hybrid_shard and hybrid_shard_zero2 are sharding strategies; "
      "give one",
      fsdp);
}

std::vector<std::string> TrainingArguments::fsdp_options() const {
  static const std::vector<std::string> known{
      "full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2",
      "offload",    "auto_wrap",     "no_shard"};
  std::vector<std::string> out;
  std::stringstream in(fsdp);
  for (std::string o; in >> o;) {
    check_one_of("fsdp", o, known);
    out.push_back(o);
  }
  return out;
}

bool TrainingArguments::fsdp_has(const std::string& option) const {
  const auto o = fsdp_options();
  return std::find(o.begin(), o.end(), option) != o.end();
}

void TrainingArguments::apply_compile_defaults() {
  torch_compile = torch_compile || !torch_compile_backend.empty() || !torch_compile_mode.empty();
  if (torch_compile && torch_compile_backend.empty()) torch_compile_backend = "inductor";
  if (torch_compile && torch_compile_mode.empty()) torch_compile_mode = "default";
}

bool TrainingArguments::tf32_on(Device device) const {
  // A backend or mode alone turns compile on (apply_compile_defaults), so it turns TF32 on as well.
  const bool compile = torch_compile || !torch_compile_backend.empty() || !torch_compile_mode.empty();
  return tf32.value_or(compile && device.is_cuda() && !fp16);
}

bool TrainingArguments::compile_fuses() const { return torch_compile && torch_compile_backend == "inductor"; }

bool TrainingArguments::compile_device_graphs() const {
  const bool graphs = torch_compile_backend == "inductor" || torch_compile_backend == "cudagraphs" ||
                      torch_compile_backend == "aot_cudagraphs";
  return torch_compile && graphs && torch_compile_mode != "max-autotune-no-cudagraphs";
}

bool TrainingArguments::compile_autotunes() const {
  return torch_compile && torch_compile_mode.rfind("max-autotune", 0) == 0;
}

nlohmann::json TrainingArguments::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& s : argument_specs())
    std::visit(
        [&](auto m) {
          if constexpr (std::is_same_v<std::decay_t<decltype(this->*m)>, std::optional<bool>>)
            j[s.name] =
                (this->*m).has_value() ? nlohmann::json(*(this->*m)) : nlohmann::json();  // null: None
          else
            j[s.name] = this->*m;
        },
        s.member);
  for (const char* dict : {"lr_scheduler_kwargs", "gradient_checkpointing_kwargs"}) {  // HF's dicts
    const auto parsed =
        nlohmann::json::parse(j[dict].get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (j[dict].get<std::string>().empty())
      j[dict] = nlohmann::json::object();
    else if (parsed.is_object())
      j[dict] = parsed;
  }
  // HF's Union[None, str, list[str]]: null when unset, a JSON list given as one kept as a list.
  if (optim_target_modules.empty()) {
    j["optim_target_modules"] = nullptr;
  } else if (optim_target_modules.front() == '[') {  // a list of strings only: anything else stays text
    const auto list = nlohmann::json::parse(optim_target_modules, nullptr, /*allow_exceptions=*/false);
    if (list.is_array() && std::all_of(list.begin(), list.end(), [](const auto& e) { return e.is_string(); }))
      j["optim_target_modules"] = list;
  }
  return j;
}

namespace {

// A value HF's dump holds for a field at its default: the value itself, an empty one for an empty default
// ("" / [] / {}: HF's post-init turns some into lists), or for a dict default (accelerate's config) an
// object whose every entry is the default's.
bool is_hf_default(const nlohmann::json& v, const nlohmann::json& d) {
  if (v == d) return true;
  const auto empty = [](const nlohmann::json& x) {
    return (x.is_string() && x.get<std::string>().empty()) || ((x.is_array() || x.is_object()) && x.empty());
  };
  if (empty(v) && empty(d)) return true;
  if (!v.is_object() || !d.is_object()) return false;
  for (auto it = v.begin(); it != v.end(); ++it)
    if (!d.contains(it.key()) || d[it.key()] != *it) return false;
  return true;
}

}  // namespace

// The forms HF's files give some fields in (a list, a dict, a bool, "auto"), read into ours; false for a
// field in its plain form.
namespace {

// An args file's list of strings (HF's form of fsdp and report_to) as our flag's one string.
std::string join_strings(const nlohmann::json& list, const std::string& source, const std::string& key,
                         const char* separator) {
  std::string joined;
  for (size_t i = 0; i < list.size(); ++i) {
    TR_CHECK(list[i].is_string(), "{}: '{}'[{}]: expected a string", source, key, i);
    joined += (i ? separator : "") + list[i].get<std::string>();
  }
  return joined;
}

}  // namespace

bool TrainingArguments::read_hf_form(const std::string& key, const nlohmann::json& value,
                                     const std::string& source) {
  if (key == "per_device_train_batch_size" && value.is_string()) {
    TR_CHECK(value.get<std::string>() == "auto",
             "{}: 'per_device_train_batch_size': expected a number or \"auto\"", source);
    per_device_train_batch_size = kAutoBatch;
    return true;
  }
  if ((key == "lr_scheduler_kwargs" || key == "gradient_checkpointing_kwargs") &&
      value.is_object()) {  // HF's dicts
    this->*(key == "lr_scheduler_kwargs" ? &A::lr_scheduler_kwargs : &A::gradient_checkpointing_kwargs) =
        value.empty() ? "" : value.dump();
    return true;
  }
  if ((key == "fsdp_config" || key == "deepspeed") && value.is_object()) {  // HF's dict form
    this->*(key == "deepspeed" ? &A::deepspeed : &A::fsdp_config) = value.empty() ? "" : value.dump();
    return true;
  }
  if (key == "fsdp" && value.is_array()) {  // HF's to_dict() gives the parsed option list
    fsdp = join_strings(value, source, key, " ");
    return true;
  }
  if (key == "include_num_input_tokens_seen" && value.is_boolean()) {  // HF's bool form
    include_num_input_tokens_seen = value.get<bool>() ? "all" : "no";
    return true;
  }
  if (key == "optim_target_modules" && value.is_array()) {  // HF's list form: kept as its JSON text
    TR_CHECK(std::all_of(value.begin(), value.end(), [](const nlohmann::json& e) { return e.is_string(); }),
             "{}: 'optim_target_modules': expected a string or a list of strings", source);
    optim_target_modules = value.dump();
    return true;
  }
  if (key == "report_to" && value.is_array()) {  // HF's training_args.json holds a list
    const std::string joined = join_strings(value, source, key, ",");
    report_to = joined.empty() ? "none" : joined;
    return true;
  }
  return false;
}

void TrainingArguments::update_from_json(const nlohmann::json& j, const std::string& source) {
  TR_CHECK(j.is_object(), "{}: expected a JSON object of flag names and values", source);
  const JsonField root(j, source);
  const auto names = argument_names();
  // Not a structured binding: the lambdas below capture key and value (C++20 clang refuses bindings there).
  for (auto item = j.begin(); item != j.end(); ++item) {
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    auto it = std::find_if(argument_specs().begin(), argument_specs().end(),
                           [&](const ArgSpec& s) { return s.name == key; });
    if (it == argument_specs().end()) {
      // HF's dumps list every field: one this Trainer does not have is fine at HF's default (or null).
      const UnsupportedArg* u = unsupported_hf_argument(key);
      TR_CHECK(u != nullptr, "{}: unknown argument '{}'{}", source, key, did_you_mean(key, names));
      TR_CHECK(value.is_null() || is_hf_default(value, u->hf_default),
               "{}: '{}': {} is not supported here ({}); only HF's default, {}, is accepted", source, key,
               value.dump(), u->why, u->hf_default.dump());
      continue;
    }
    if (value.is_null()) continue;  // HF writes None for unset optionals: keep our default
    if (key == "do_train" && value == false) continue;  // every HF dump's default (the Trainer ignores it)
    if (read_hf_form(key, value, source)) continue;
    const JsonField f = root[key];
    std::visit(
        [&](auto m) {
          using T = std::decay_t<decltype(this->*m)>;
          bool ok = false;
          if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>)
            ok = value.is_boolean();
          else if constexpr (std::is_same_v<T, std::string>)
            ok = value.is_string() || value.is_boolean();  // resume_from_checkpoint: true
          else
            ok = value.is_number();
          const char* expected = std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>
                                     ? "true or false"
                                 : std::is_same_v<T, std::string> ? "a string"
                                 : std::is_integral_v<T>          ? "an integer"
                                                                  : "a number";
          TR_CHECK(ok, "{}: '{}' has the wrong type ({}): expected {}", source, key, value.type_name(),
                   expected);
          // Ranges are checked before any conversion: a value an integer flag cannot hold is an error, not
          // a wrapped or truncated number. (Flag-specific ranges are validate()'s.)
          if constexpr (std::is_same_v<T, std::string>)
            this->*m = value.is_boolean() ? (value.get<bool>() ? "true" : "false") : f.string();
          else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>)
            this->*m = f.boolean();
          else if constexpr (std::is_same_v<T, uint64_t>)
            this->*m = f.unsigned_integer();
          else if constexpr (std::is_integral_v<T>)
            this->*m = f.integer(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
          else
            this->*m =
                f.number(-std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity());
        },
        it->member);
  }
}

void TrainingArguments::update_from_file(const std::string& path) {
  TR_CHECK(std::ifstream(path).good(), "{}: cannot open the arguments file", path);
  update_from_json(read_json(path), path);
}

std::string flags_markdown() {
  const TrainingArguments d;
  const nlohmann::json defaults = d.to_json();
  std::ostringstream o;
  o << "# `trainer train` flags\n\n"
       "Generated from the argument table in src/train/args.cpp by `trainer flags` (a test checks that this\n"
       "file matches it). Names, types and defaults follow Hugging Face's TrainingArguments and run_clm.py.\n"
       "Every flag works as `--name value` or `--name=value`; booleans also as a bare `--name`. The same\n"
       "names are the keys of a JSON arguments file: `trainer train args.json` (flags after it override).\n";
  for (const std::string group : {"model and data", "training", "evaluation and saving",
                                  "precision and memory", "distributed", "compatibility"}) {
    o << "\n## " << static_cast<char>(std::toupper(group[0])) << group.substr(1) << "\n\n";
    o << "| flag | type | default | meaning |\n|---|---|---|---|\n";
    for (const auto& s : argument_specs()) {
      if (s.group != group) continue;
      const char* type = std::visit(
          [](auto m) -> const char* {
            using T = std::decay_t<decltype(TrainingArguments{}.*m)>;
            if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>) return "bool";
            if constexpr (std::is_same_v<T, std::string>) return "string";
            if constexpr (std::is_integral_v<T>) return "int";
            return "float";
          },
          s.member);
      std::string def = defaults[s.name].dump();
      if (def == "\"\"") def = "";
      o << "| `--" << s.name << "` | " << type << " | " << (def.empty() ? "" : "`" + def + "`") << " | "
        << s.help << " |\n";
    }
  }
  return o.str();
}

}  // namespace tr::train
