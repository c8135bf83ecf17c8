// The TrainingArguments table (every flag once), validation, JSON in/out, the flag reference; HF's LR
// schedules.
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

namespace tr::train {

using A = TrainingArguments;

const std::vector<ArgSpec>& argument_specs() {
  static const std::vector<ArgSpec> specs = {
      {"model_name_or_path", &A::model_name_or_path, "HF model folder to fine-tune", "model and data"},
      {"config_name", &A::config_name,
       "train from scratch: a built-in name (gpt2, gpt2-medium, gpt2-mini, llama-60m, ...), a config.json or "
       "an "
       "HF folder",
       "model and data"},
      {"tokenizer_name", &A::tokenizer_name, "tokenizer.json, or a folder with one (default: the model's)",
       "model and data"},
      {"train_file", &A::train_file, "a text file, or llm.c / nanoGPT token shards (.bin, glob)",
       "model and data"},
      {"validation_file", &A::validation_file,
       "text or token shards for evaluation (default: validation_split_percentage of train_file)",
       "model and data"},
      {"validation_split_percentage", &A::validation_split_percentage,
       "without validation_file, the first this-many percent of the training tokens are held out for "
       "evaluation",
       "model and data"},
      {"block_size", &A::block_size, "tokens per training sequence", "model and data"},
      {"attn_implementation", &A::attn_implementation, "eager, sdpa or flash_attention_2", "model and data"},
      {"pad_vocab_to_multiple_of", &A::pad_vocab_to_multiple_of,
       "round the vocab_size up to a multiple of N (tensor-core friendly GEMMs: 64; 0: off; pretrained "
       "models grow with mean-initialized rows)",
       "model and data"},
      {"device_map", &A::device_map,
       "from_pretrained's device_map: auto splits a model too large for the first device by decoder layers "
       "across the GPUs, then the host (train runs the split as a naive pipeline); eval also takes a device",
       "model and data"},
      {"max_memory", &A::max_memory,
       "with device_map auto: each GPU's budget in order, and the host's (HF's max_memory): 24GB,24GB or "
       "0:24GB,1:24GB,cpu:64GB (cpu:1:8MB: a host partition placed like a GPU, for trying a split)",
       "model and data"},
      {"text_column_name", &A::text_column_name,
       "the column of .jsonl/.json/.csv/.tsv data files holding the text (default: text, else the first)",
       "model and data"},
      {"output_dir", &A::output_dir, "where checkpoints, the final model, tokenizer and metrics go",
       "training"},
      {"overwrite_output_dir", &A::overwrite_output_dir,
       "allow an output_dir that already holds a trained model or checkpoints", "training"},
      {"per_device_train_batch_size", &A::per_device_train_batch_size,
       "sequences per micro-batch, or auto: the largest power of two the memory estimate fits (a GPU's "
       "memory; on the CPU the allocator's cap or the memory available)",
       "training"},
      {"total_batch_size", &A::total_batch_size,
       "ours: sequences (64) or tokens (65536tokens) per optimizer step; gradient_accumulation_steps becomes "
       "it divided by per_device_train_batch_size",
       "training"},
      {"gradient_accumulation_steps", &A::gradient_accumulation_steps,
       "micro-batches per optimizer step (loss normalized by the label tokens of the whole step)",
       "training"},
      {"learning_rate", &A::learning_rate, "peak learning rate", "training"},
      {"weight_decay", &A::weight_decay, "decoupled weight decay (not for biases and norm weights)",
       "training"},
      {"adam_beta1", &A::adam_beta1, "", "training"},
      {"adam_beta2", &A::adam_beta2, "", "training"},
      {"adam_epsilon", &A::adam_epsilon, "", "training"},
      {"max_grad_norm", &A::max_grad_norm, "clip the global gradient L2 norm to this (<= 0: off)",
       "training"},
      {"num_train_epochs", &A::num_train_epochs, "epochs (fractions allowed); max_steps > 0 overrides",
       "training"},
      {"max_steps", &A::max_steps, "optimizer steps (-1: from num_train_epochs)", "training"},
      {"lr_scheduler_type", &A::lr_scheduler_type, "linear, cosine, constant or constant_with_warmup",
       "training"},
      {"warmup_steps", &A::warmup_steps, "warmup steps, or a ratio of the total below 1", "training"},
      {"warmup_ratio", &A::warmup_ratio, "warmup as a ratio of the total steps", "training"},
      {"optim", &A::optim,
       "adamw_torch, adamw_torch_fused, adamw_apex_fused, adafactor, adamw_bnb_8bit (= adamw_8bit) or sgd",
       "training"},
      {"optim_args", &A::optim_args, "extra optimizer arguments, e.g. \"momentum=0.9,nesterov=true\"",
       "training"},
      {"seed", &A::seed, "seed of initialization, shuffling and dropout", "training"},
      {"dataloader_num_workers", &A::dataloader_num_workers, "batch-building threads (0: the main thread)",
       "training"},
      {"dataloader_pin_memory", &A::dataloader_pin_memory, "page-locked batches for a GPU", "training"},
      {"dataloader_drop_last", &A::dataloader_drop_last, "drop an epoch's incomplete last batch", "training"},
      {"resume_from_checkpoint", &A::resume_from_checkpoint,
       "a checkpoint folder, or true for the newest checkpoint-N in output_dir", "training"},
      {"do_eval", &A::do_eval, "evaluate at the end of training", "evaluation and saving"},
      {"eval_strategy", &A::eval_strategy, "no, steps or epoch", "evaluation and saving"},
      {"eval_steps", &A::eval_steps, "evaluate every N steps (ratio below 1; 0: logging_steps)",
       "evaluation and saving"},
      {"per_device_eval_batch_size", &A::per_device_eval_batch_size, "sequences per evaluation batch",
       "evaluation and saving"},
      {"logging_steps", &A::logging_steps, "log every N steps (ratio below 1)", "evaluation and saving"},
      {"logging_first_step", &A::logging_first_step, "also log the first step", "evaluation and saving"},
      {"logging_nan_inf_filter", &A::logging_nan_inf_filter,
       "log a nan/inf step loss as the mean of the logging window so far (false: as it is)",
       "evaluation and saving"},
      {"report_to", &A::report_to,
       "tensorboard, jsonl, all or none, or a comma-separated list (metrics.jsonl is always written)",
       "evaluation and saving"},
      {"logging_dir", &A::logging_dir,
       "TensorBoard's folder (default: output_dir/runs/<Mon DD_HH-MM-SS>_<host>; a resume keeps the run's)",
       "evaluation and saving"},
      {"save_strategy", &A::save_strategy, "no, steps or epoch (a checkpoint is also saved at the end)",
       "evaluation and saving"},
      {"save_steps", &A::save_steps, "checkpoint every N steps (ratio below 1)", "evaluation and saving"},
      {"save_total_limit", &A::save_total_limit, "keep the newest N checkpoints (0: all)",
       "evaluation and saving"},
      {"use_cpu", &A::use_cpu, "train on the CPU even when a GPU is present", "precision and memory"},
      {"bf16", &A::bf16, "bf16 compute copies, fp32 master weights", "precision and memory"},
      {"fp16", &A::fp16, "fp16 compute copies, fp32 master weights, dynamic loss scaling",
       "precision and memory"},
      {"tf32", &A::tf32,
       "fp32 matmuls with TF32 inputs (tensor cores; emulated by rounding on the CPU); unset: on for "
       "torch_compile on a GPU without fp16, else off",
       "precision and memory"},
      {"gradient_checkpointing", &A::gradient_checkpointing, "recompute each decoder layer in backward",
       "precision and memory"},
      {"torch_empty_cache_steps", &A::torch_empty_cache_steps,
       "release the allocator's cached blocks every N steps (after forward, before backward; 0: never)",
       "precision and memory"},
      {"auto_find_batch_size", &A::auto_find_batch_size,
       "on out-of-memory retry with a smaller batch, raising gradient_accumulation_steps to keep the "
       "effective batch",
       "precision and memory"},
      {"torch_compile", &A::torch_compile,
       "capture the training step once per shape and replay it (static memory plan; same numbers as eager)",
       "precision and memory"},
      {"torch_compile_backend", &A::torch_compile_backend,
       "inductor (default), cudagraphs, aot_cudagraphs, aot_eager or eager; setting it turns compile on",
       "precision and memory"},
      {"torch_compile_mode", &A::torch_compile_mode,
       "default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs; setting it turns compile on",
       "precision and memory"},
      {"ddp_backend", &A::ddp_backend, "gloo or nccl (GPUs); default: gloo (until NCCL has run on GPUs)",
       "distributed"},
      {"ddp_timeout", &A::ddp_timeout,
       "seconds a rank waits for the others (rendezvous and every collective) before failing", "distributed"},
      {"ddp_bucket_cap_mb", &A::ddp_bucket_cap_mb, "MB of gradients per all-reduce bucket", "distributed"},
      {"ddp_find_unused_parameters", &A::ddp_find_unused_parameters,
       "accepted for HF compatibility: every parameter of our models gets a gradient", "distributed"},
      {"ddp_broadcast_buffers", &A::ddp_broadcast_buffers,
       "accepted for HF compatibility: our models hold no buffers that training changes", "distributed"},
      {"fsdp", &A::fsdp,
       "sharding (space-separated): shard_grad_op (ZeRO-2: gradients and optimizer state 1/N per rank), "
       "full_shard (ZeRO-3: parameters too, gathered per layer); hybrid_shard, hybrid_shard_zero2 (the same "
       "within each node, replicated across nodes); offload (with one of them: fp32 masters, gradient shard "
       "and optimizer state in host memory, updated there); auto_wrap, no_shard",
       "distributed"},
      {"fsdp_config", &A::fsdp_config, "a JSON file of FSDP options", "distributed"},
      {"average_tokens_across_devices", &A::average_tokens_across_devices,
       "normalize the loss by the label tokens of all ranks (false: each rank by its own, gradients "
       "averaged)",
       "distributed"},
  };
  return specs;
}

std::vector<std::string> argument_names() {
  std::vector<std::string> n;
  for (const auto& s : argument_specs()) n.push_back(s.name);
  return n;
}

const std::vector<std::string>& scheduler_names() {
  static const std::vector<std::string> n = {"linear", "cosine", "constant", "constant_with_warmup"};
  return n;
}

namespace {

void check_one_of(const std::string& flag, const std::string& v, const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
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

IntervalStrategy parse_interval_strategy(const std::string& name, const char* flag) {
  if (name == "no") return IntervalStrategy::no;
  if (name == "steps") return IntervalStrategy::steps;
  if (name == "epoch") return IntervalStrategy::epoch;
  fail("--{} '{}': expected no, steps or epoch", flag, name);
}

void TrainingArguments::validate() const {
  TR_CHECK(!output_dir.empty(), "--output_dir is required");
  TR_CHECK(model_name_or_path.empty() != config_name.empty(),
           "give exactly one of --model_name_or_path (fine-tune) and --config_name (train from scratch)");
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
  // The optimizers' own ranges, as torch.optim checks them (a NaN fails every comparison here).
  TR_CHECK(std::isfinite(learning_rate) && learning_rate >= 0,
           "--learning_rate {}: expected a finite number >= 0", learning_rate);
  if (optim.rfind("adamw", 0) == 0) {  // the optimizers that read them (sgd and adafactor ignore them, as HF)
    TR_CHECK(adam_beta1 >= 0 && adam_beta1 < 1, "--adam_beta1 {}: expected a number in [0, 1)", adam_beta1);
    TR_CHECK(adam_beta2 >= 0 && adam_beta2 < 1, "--adam_beta2 {}: expected a number in [0, 1)", adam_beta2);
  }
  TR_CHECK(std::isfinite(adam_epsilon) && adam_epsilon >= 0,
           "--adam_epsilon {}: expected a finite number >= 0", adam_epsilon);
  TR_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
           "--weight_decay {}: expected a finite number >= 0", weight_decay);
  TR_CHECK(!std::isnan(max_grad_norm), "--max_grad_norm nan: expected a number (0 or less: no clipping)");
  TR_CHECK(std::isfinite(num_train_epochs), "--num_train_epochs {}: expected a finite number",
           num_train_epochs);
  TR_CHECK(max_steps > 0 || num_train_epochs > 0, "--max_steps or --num_train_epochs must be positive");
  TR_CHECK(max_steps == -1 || max_steps > 0, "--max_steps must be positive (or -1), got {}", max_steps);
  TR_CHECK(std::isfinite(warmup_steps) && warmup_steps >= 0,
           "--warmup_steps {}: expected a finite number >= 0", warmup_steps);
  TR_CHECK(warmup_ratio >= 0 && warmup_ratio <= 1, "--warmup_ratio {}: expected a number in [0, 1] (as HF)",
           warmup_ratio);
  TR_CHECK(std::isfinite(logging_steps) && logging_steps > 0,
           "--logging_steps {}: expected a positive number (a ratio of the run below 1)", logging_steps);
  TR_CHECK(std::isfinite(save_steps) && save_steps > 0,
           "--save_steps {}: expected a positive number (a ratio of the run below 1)", save_steps);
  TR_CHECK(std::isfinite(eval_steps) && eval_steps >= 0,
           "--eval_steps {}: expected a number >= 0 (0: --logging_steps; a ratio of the run below 1)",
           eval_steps);
  TR_CHECK(save_total_limit >= 0, "--save_total_limit must not be negative");
  TR_CHECK(dataloader_num_workers >= 0 && dataloader_num_workers <= max_pool_threads(),
           "--dataloader_num_workers {}: expected 0 (the main thread builds the batches) up to {} threads",
           dataloader_num_workers, max_pool_threads());
  TR_CHECK(torch_empty_cache_steps >= 0, "--torch_empty_cache_steps must not be negative");
  TR_CHECK(!(fp16 && bf16), "--fp16 and --bf16 are mutually exclusive: choose one half-precision type");
  check_one_of("lr_scheduler_type", lr_scheduler_type, scheduler_names());
  check_one_of("attn_implementation", attn_implementation, {"eager", "sdpa", "flash_attention_2"});
  // device_map auto trains a split model as HF does: a naive pipeline, one device busy at a time. Sharding
  // and the compiled step keep one device per process, so they do not take a split.
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
  check_one_of("eval_strategy", eval_strategy, {"no", "steps", "epoch"});
  check_one_of("save_strategy", save_strategy, {"no", "steps", "epoch"});
  check_one_of("optim", optim, optim::optimizer_names());
  optim::parse_optim_args(optim_args);  // throws on a malformed entry
  check_compile_backend(torch_compile_backend);
  if (!ddp_backend.empty()) check_one_of("ddp_backend", ddp_backend, {"gloo", "nccl"});
  TR_CHECK(ddp_timeout > 0 && ddp_timeout <= 30 * 86400,
           "--ddp_timeout must be in [1, 2592000] seconds (30 days), got {}", ddp_timeout);
  TR_CHECK(ddp_bucket_cap_mb > 0 && ddp_bucket_cap_mb <= 65536,
           "--ddp_bucket_cap_mb must be in [1, 65536], got {}", ddp_bucket_cap_mb);
  fsdp_options();  // throws on an unknown option
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
  if (!torch_compile_mode.empty())
    check_one_of("torch_compile_mode", torch_compile_mode,
                 {"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"});
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
  return j;
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
    TR_CHECK(it != argument_specs().end(), "{}: unknown argument '{}'{}", source, key,
             did_you_mean(key, names));
    if (value.is_null()) continue;  // HF writes None for unset optionals: keep our default
    if (key == "per_device_train_batch_size" && value.is_string()) {
      TR_CHECK(value.get<std::string>() == "auto",
               "{}: 'per_device_train_batch_size': expected a number or \"auto\"", source);
      per_device_train_batch_size = kAutoBatch;
      continue;
    }
    if (key == "report_to" && value.is_array()) {  // HF's training_args.json holds a list
      std::string joined;
      for (size_t i = 0; i < value.size(); ++i) {
        TR_CHECK(value[i].is_string(), "{}: 'report_to'[{}]: expected a string", source, i);
        joined += (i ? "," : "") + value[i].get<std::string>();
      }
      report_to = joined.empty() ? "none" : joined;
      continue;
    }
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
  for (const std::string group :
       {"model and data", "training", "evaluation and saving", "precision and memory", "distributed"}) {
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
