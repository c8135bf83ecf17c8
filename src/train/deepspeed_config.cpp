// HF's --deepspeed config: read (every key known or refused with why), "auto" resolved and mismatches
// refused as HF's HfTrainerDeepSpeedConfig does, and mapped onto this Trainer's flags; see
// deepspeed_config.h.
#include "train/deepspeed_config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>

#include "core/error.h"
#include "core/json_fields.h"
#include "core/suggest.h"

namespace tr::train {

namespace {

using J = nlohmann::json;

bool is_auto(const J& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// A value as Python prints it (HF's mismatch lines are f-strings of Python values).
std::string py_repr(const J& v) {
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_float()) {
    std::string s = fmt::format("{}", v.get<double>());
    if (s.find_first_of(".en") == std::string::npos) s += ".0";
    return s;
  }
  if (v.is_array()) {
    std::vector<std::string> items;
    for (const auto& e : v) items.push_back(py_repr(e));
    return fmt::format("[{}]", fmt::join(items, ", "));
  }
  if (v.is_string()) return "'" + v.get<std::string>() + "'";
  if (v.is_null()) return "None";
  return v.dump();
}

// A member that is there and says something: missing, null and "auto" (which DeepSpeed drops for its own
// default unless HF fills it) are not.
bool given(const JsonField& f) { return f.present() && !is_auto(f.raw()); }

// Every member of `section` is one of `known`; else one message naming it, the section and the keys read.
void only_keys(const JsonField& section, const std::vector<std::string>& known) {
  section.object();
  section.each_member([&](const std::string& key, const JsonField& f) {
    if (std::find(known.begin(), known.end(), key) == known.end())
      f.fail("is not a DeepSpeed setting read here ({}: {}){}",
             section.path().empty() ? "the top level's keys" : section.path() + "'s keys",
             fmt::join(known, ", "), did_you_mean(key, known));
  });
}

// A setting that changes nothing here only at DeepSpeed's default (`expected`).
void only_default(const JsonField& f, const J& expected, const char* why) {
  if (given(f) && f.raw() != expected)
    f.fail("is {}: {}; only {} is accepted", f.raw().dump(), why, expected.dump());
}

void read_zero(DeepSpeedConfig& c, const JsonField& z) {
  only_keys(z, {"stage",
                "offload_optimizer",
                "offload_param",
                "cpu_offload",
                "overlap_comm",
                "contiguous_gradients",
                "reduce_scatter",
                "reduce_bucket_size",
                "allgather_partitions",
                "allgather_bucket_size",
                "sub_group_size",
                "stage3_prefetch_bucket_size",
                "stage3_param_persistence_threshold",
                "stage3_max_live_parameters",
                "stage3_max_reuse_distance",
                "stage3_gather_16bit_weights_on_model_save",
                "stage3_gather_fp16_weights_on_model_save",
                "round_robin_gradients",
                "elastic_checkpoint",
                "ignore_unused_parameters",
                "load_from_fp32_weights",
                "memory_efficient_linear",
                "use_multi_rank_bucket_allreduce",
                "zero_quantized_weights",
                "zero_quantized_gradients",
                "zero_hpz_partition_size",
                "mics_shard_size"});
  // The buckets, prefetch and persistence sizes tune DeepSpeed's communication, not the numbers: this
  // Trainer's buckets are --ddp_bucket_cap_mb's. Saves hold the whole 16-bit weights whatever the flag.
  c.stage = given(z["stage"]) ? static_cast<int>(z["stage"].integer(0, 3)) : 0;
  only_default(z["zero_quantized_weights"], false, "ZeRO++'s quantized weights are not here");
  only_default(z["zero_quantized_gradients"], false, "ZeRO++'s quantized gradients are not here");
  only_default(z["zero_hpz_partition_size"], 1,
               "ZeRO++'s secondary partitions are not here (--fsdp hybrid_shard)");
  only_default(z["mics_shard_size"], -1, "MiCS sharding is not here (--fsdp hybrid_shard)");
  if (given(z["cpu_offload"]) && z["cpu_offload"].boolean()) c.offload_optimizer = true;  // the old form
  if (const JsonField o = z["offload_optimizer"]; o.present()) {
    only_keys(o, {"device", "pin_memory", "buffer_count", "fast_init", "nvme_path", "pipeline_read",
                  "pipeline_write", "ratio"});
    const std::string device = given(o["device"]) ? o["device"].one_of({"none", "cpu", "nvme"}) : "none";
    if (device == "nvme")
      o["device"].fail(
          "is \"nvme\": offload to NVMe is not here; \"cpu\" keeps the optimizer in host memory");
    only_default(o["ratio"], 1.0, "a partial offload is not here");
    c.offload_optimizer = c.offload_optimizer || device == "cpu";
  }
  if (const JsonField o = z["offload_param"]; o.present()) {
    only_keys(o, {"device", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu", "nvme_path"});
    const std::string device = given(o["device"]) ? o["device"].one_of({"none", "cpu", "nvme"}) : "none";
    if (device == "nvme")
      o["device"].fail("is \"nvme\": offload to NVMe is not here; parameters stay on the device");
    c.offload_param = device == "cpu";
  }
  if (c.offload_optimizer && c.stage == 0)
    z["stage"].fail(
        "is 0 with offload_optimizer: offload moves a ZeRO shard to host memory, so it needs stage 1, 2 or "
        "3");
}

void read_optimizer(DeepSpeedConfig& c, const JsonField& o) {
  only_keys(o, {"type", "params"});
  const std::string type = o["type"].string();
  std::string lower = type;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  if (lower != "adam" && lower != "adamw")
    o["type"].fail(
        "is \"{}\": DeepSpeed's Adam and AdamW (FusedAdam / torch's AdamW update) run here; for other "
        "optimizers drop the \"optimizer\" section and give --optim",
        type);
  c.has_optimizer = true;
  const JsonField p = o["params"];
  if (!p.present()) return;
  only_keys(
      p, {"lr", "betas", "eps", "weight_decay", "torch_adam", "adam_w_mode", "bias_correction", "amsgrad"});
  only_default(p["bias_correction"], true, "Adam without bias correction is not among the optimizers here");
  only_default(p["amsgrad"], false, "AMSGrad is not among the optimizers here");
  // DeepSpeed's "adam" is AdamW unless adam_w_mode is false (L2-regularized Adam: the same update without
  // weight decay, checked once "auto" is filled); torch_adam picks torch's classes, whose AdamW decays 0.01
  // by default.
  for (const char* k : {"lr", "eps", "weight_decay"})
    if (given(p[k])) (void)p[k].number(0, 1e300);
  const bool w_mode = lower == "adamw" || !given(p["adam_w_mode"]) || p["adam_w_mode"].boolean();
  c.l2_adam = !w_mode;
  c.torch_adamw = w_mode && given(p["torch_adam"]) && p["torch_adam"].boolean();
}

void read_scheduler(DeepSpeedConfig& c, const JsonField& s) {
  only_keys(s, {"type", "params"});
  const std::string type = s["type"].one_of({"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"});
  DeepSpeedSchedule d;
  d.kind = type == "WarmupLR"        ? DeepSpeedSchedule::Kind::warmup_lr
           : type == "WarmupDecayLR" ? DeepSpeedSchedule::Kind::warmup_decay_lr
                                     : DeepSpeedSchedule::Kind::warmup_cosine_lr;
  const bool cosine = d.kind == DeepSpeedSchedule::Kind::warmup_cosine_lr;
  const JsonField p = s["params"];
  if (p.present()) {
    // DeepSpeed passes params as keyword arguments: another name is a TypeError there.
    if (cosine)
      only_keys(p, {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
                    "last_batch_iteration"});
    else if (d.kind == DeepSpeedSchedule::Kind::warmup_decay_lr)
      only_keys(p, {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                    "last_batch_iteration"});
    else
      only_keys(
          p, {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"});
    only_default(p["last_batch_iteration"], -1, "a scheduler resumes from the checkpoint's step here");
    if (given(p["warmup_type"])) d.log_warmup = p["warmup_type"].one_of({"log", "linear"}) == "log";
    // "auto": the run's (HF fills it); left out: DeepSpeed's default (HF adds no key).
    if (p["warmup_num_steps"].present() && is_auto(p["warmup_num_steps"].raw())) d.warmup_num_steps.reset();
    if (p["warmup_max_lr"].present() && is_auto(p["warmup_max_lr"].raw())) d.warmup_max_lr.reset();
    if (given(p["warmup_min_lr"])) d.warmup_min_lr = p["warmup_min_lr"].number(0, 1e300);
    if (given(p["warmup_max_lr"]))
      d.warmup_max_lr = p["warmup_max_lr"].number(0, 1e300);  // = --learning_rate
    if (given(p["warmup_min_ratio"])) d.warmup_min_ratio = p["warmup_min_ratio"].number(0, 1);
    if (given(p["cos_min_ratio"])) d.cos_min_ratio = p["cos_min_ratio"].number(0, 1);
    if (given(p["warmup_num_steps"]))
      d.warmup_num_steps = c.warmup_num_steps = p["warmup_num_steps"].integer(0, kMaxJsonCounter);
    if (given(p["total_num_steps"])) c.total_num_steps = p["total_num_steps"].integer(0, kMaxJsonCounter);
  }
  if (d.kind != DeepSpeedSchedule::Kind::warmup_lr && !(p.present() && p["total_num_steps"].exists()))
    s.fail("is {} without params.total_num_steps, which it needs (\"auto\": the run's optimizer steps)",
           type);
  c.schedule = d;
}

void read_fp16(DeepSpeedConfig& c, const JsonField& f) {
  only_keys(f, {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
                "hysteresis", "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"});
  only_default(f["fp16_master_weights_and_grads"], false, "masters are fp32 here");
  DeepSpeedScaling& s = c.scaling;
  const double loss_scale = given(f["loss_scale"]) ? f["loss_scale"].number(0, 3.4e38) : 0.0;
  // DeepSpeed's ZeRO optimizers take the dynamic settings only when one of them is in the section;
  // otherwise DynamicLossScaler's own defaults (2^32, no hysteresis).
  bool any = false;
  for (const char* k :
       {"initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis", "min_loss_scale"})
    any = any || f[k].exists();
  const int64_t power = given(f["initial_scale_power"]) ? f["initial_scale_power"].integer(0, 127) : 16;
  s.window = given(f["loss_scale_window"]) ? f["loss_scale_window"].integer(1, kMaxJsonCounter) : 1000;
  s.hysteresis = any ? (given(f["hysteresis"]) ? f["hysteresis"].integer(1, 1 << 30) : 2) : 1;
  s.consecutive_hysteresis = given(f["consecutive_hysteresis"]) && f["consecutive_hysteresis"].boolean();
  s.min_scale = given(f["min_loss_scale"]) ? f["min_loss_scale"].number(0, 3.4e38, Bounds::open_low) : 1.0;
  s.cur_hysteresis = s.hysteresis;
  s.dynamic = loss_scale == 0;
  c.initial_scale = loss_scale > 0 ? loss_scale : std::ldexp(1.0, any ? static_cast<int>(power) : 32);
  if (given(f["auto_cast"])) (void)f["auto_cast"].boolean();  // casts inputs; a causal LM's are token ids
}

// The keys HF's Trainer fills when they are "auto" (trainer_config_process and _finalize); "auto" anywhere
// else is left to accelerate, which refuses it.
const std::vector<std::string>& fillable() {
  static const std::vector<std::string> k = {"train_micro_batch_size_per_gpu",
                                             "train_batch_size",
                                             "gradient_accumulation_steps",
                                             "gradient_clipping",
                                             "optimizer.params.lr",
                                             "optimizer.params.betas",
                                             "optimizer.params.eps",
                                             "optimizer.params.weight_decay",
                                             "scheduler.params.warmup_min_lr",
                                             "scheduler.params.warmup_max_lr",
                                             "scheduler.params.warmup_num_steps",
                                             "scheduler.params.total_num_steps",
                                             "fp16.enabled",
                                             "bf16.enabled",
                                             "amp.enabled",
                                             "amp.opt_level",
                                             "zero_optimization.reduce_bucket_size",
                                             "zero_optimization.stage3_prefetch_bucket_size",
                                             "zero_optimization.stage3_param_persistence_threshold"};
  return k;
}

void check_autos(const JsonField& f) {
  if (f.present() && f.raw().is_object()) {
    f.each_member([](const std::string&, const JsonField& m) { check_autos(m); });
  } else if (f.present() && is_auto(f.raw())) {
    const auto& k = fillable();
    if (std::find(k.begin(), k.end(), f.path()) == k.end())
      f.fail("is \"auto\", which HF's Trainer does not fill (accelerate refuses it); give a value");
  }
}

// The top level's keys beside the sections: logging and tuning accepted, settings that would change the
// numbers accepted at their default only, monitors when off.
void read_top(const JsonField& root) {
  static const std::vector<std::string> sections = {"train_batch_size",
                                                    "train_micro_batch_size_per_gpu",
                                                    "gradient_accumulation_steps",
                                                    "gradient_clipping",
                                                    "optimizer",
                                                    "scheduler",
                                                    "fp16",
                                                    "bf16",
                                                    "bfloat16",
                                                    "zero_optimization",
                                                    "steps_per_print",
                                                    "wall_clock_breakdown",
                                                    "memory_breakdown",
                                                    "dump_state",
                                                    "zero_allow_untested_optimizer",
                                                    "zero_force_ds_cpu_optimizer",
                                                    "dataloader_drop_last",
                                                    "prescale_gradients",
                                                    "gradient_predivide_factor",
                                                    "communication_data_type",
                                                    "amp",
                                                    "sparse_gradients",
                                                    "tensorboard",
                                                    "wandb",
                                                    "csv_monitor",
                                                    "comet",
                                                    "flops_profiler",
                                                    "comms_logger"};
  only_keys(root, sections);
  only_default(root["prescale_gradients"], false, "gradients are summed, then divided, as DDP's");
  only_default(root["gradient_predivide_factor"], 1.0, "gradients are summed, then divided, as DDP's");
  only_default(root["sparse_gradients"], false, "embedding gradients are dense here");
  if (given(root["communication_data_type"]))
    root["communication_data_type"].fail(
        "is {}: gradients are reduced in the precision the step computes them in here",
        root["communication_data_type"].raw().dump());
  for (const char* k :
       {"amp", "tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger"}) {
    const JsonField m = root[k];
    if (m.present() && given(m.object()["enabled"]) && m["enabled"].boolean())
      m["enabled"].fail("is true: {}",
                        std::string_view(k) == "amp"
                            ? "apex AMP is a Python library; --fp16 is torch.amp's scheme"
                            : "DeepSpeed's monitors are not here; --report_to tensorboard or "
                              "jsonl records the run, and the progress bar shows tokens/s and MFU");
  }
  for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})
    if (given(root[k])) (void)root[k].integer(1, kMaxJsonCounter);
  if (given(root["gradient_clipping"])) (void)root["gradient_clipping"].number(0, 1e300);
}

}  // namespace

DeepSpeedConfig read_deepspeed_config(const std::string& value) {
  DeepSpeedConfig c;
  const bool inline_json = !value.empty() && (value.front() == '{' || value.front() == '[');
  c.source = inline_json ? "--deepspeed's JSON" : "--deepspeed " + value;  // errors name the flag and file
  try {
    c.json = inline_json ? parse_json(value, c.source) : read_json(value);
  } catch (const Error& e) {
    if (inline_json) throw;
    fail("--deepspeed {}", e.what());
  }
  const JsonField root(c.json, c.source);
  root.object();
  read_top(root);
  if (root["zero_optimization"].present()) read_zero(c, root["zero_optimization"]);
  if (root["optimizer"].present()) read_optimizer(c, root["optimizer"]);
  if (root["scheduler"].present()) read_scheduler(c, root["scheduler"]);
  if (root["fp16"].present()) read_fp16(c, root["fp16"]);
  c.scaling.norm_at_new_scale = c.stage == 3;
  for (const char* k : {"bf16", "bfloat16"})
    if (root[k].present()) {
      only_keys(root[k], {"enabled", "immediate_grad_update", "check_grad_overflow"});
      only_default(root[k]["check_grad_overflow"], false, "bf16 steps are never skipped here");
    }
  check_autos(root);
  return c;
}

std::string deepspeed_fsdp(const DeepSpeedConfig& c) {
  const std::string s = c.stage == 3 ? "full_shard" : c.stage > 0 ? "shard_grad_op" : "";
  return c.offload_optimizer ? s + " offload" : s;
}

namespace {

// HF's fill_match: a value under an existing parent that is not "auto" (filled) nor null must equal the
// argument's, else one mismatch line.
void match(const DeepSpeedConfig& c, std::vector<std::string>& out, const std::string& path, const J& hf,
           const std::string& hf_key) {
  const J* v = &c.json;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!v->is_object() || !v->contains(key)) return;
    v = &(*v)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (v->is_null() || is_auto(*v) || *v == hf) return;
  out.push_back(fmt::format("- ds {}={} vs hf {}={}", path, py_repr(*v), hf_key, py_repr(hf)));
}

bool section_enabled(const J& json, const char* key) {
  if (!json.contains(key)) return false;
  const J& s = json[key];
  if (!s.is_object() || !s.contains("enabled")) return false;  // DeepSpeed: off unless enabled
  return is_auto(s["enabled"]) || s["enabled"] == true;
}

}  // namespace

namespace {

// trainer_config_process's fill_match lines, in HF's order (batch keys filled by a batch settled later).
std::vector<std::string> mismatches(const DeepSpeedConfig& c, const TrainingArguments& a, int world_size) {
  std::vector<std::string> m;
  const bool search = a.auto_find_batch_size || a.per_device_train_batch_size == kAutoBatch;
  const bool total = !a.total_batch_size.empty();  // --total_batch_size's split, settled later
  if (!search && !total)
    match(c, m, "train_micro_batch_size_per_gpu", a.per_device_train_batch_size,
          "per_device_train_batch_size");
  if (!total)
    match(c, m, "gradient_accumulation_steps", a.gradient_accumulation_steps, "gradient_accumulation_steps");
  if (!search && !total)
    match(c, m, "train_batch_size",
          world_size * a.per_device_train_batch_size * a.gradient_accumulation_steps,
          "train_batch_size (calculated)");
  match(c, m, "gradient_clipping", a.max_grad_norm, "max_grad_norm");
  match(c, m, "optimizer.params.lr", a.learning_rate, "learning_rate");
  match(c, m, "optimizer.params.betas", J{a.adam_beta1, a.adam_beta2}, "adam_beta1+adam_beta2");
  match(c, m, "optimizer.params.eps", a.adam_epsilon, "adam_epsilon");
  match(c, m, "optimizer.params.weight_decay", a.weight_decay, "weight_decay");
  match(c, m, "scheduler.params.warmup_max_lr", a.learning_rate, "learning_rate");
  match(c, m, "fp16.enabled", a.fp16, "fp16|fp16_full_eval");
  match(c, m, "bf16.enabled", a.bf16, "bf16|bf16_full_eval");
  return m;
}

// DeepSpeed trains in fp32 unless a section enables half precision, and fp16 at stage 0 is its
// FP16_Optimizer: a precision flag the config would not honor is refused.
void check_precision(const DeepSpeedConfig& c, const TrainingArguments& a) {
  for (const auto& [flag, on, sections] :
       {std::tuple{"--fp16", a.fp16, std::vector<const char*>{"fp16"}},
        std::tuple{"--bf16", a.bf16, std::vector<const char*>{"bf16", "bfloat16"}}}) {
    bool enabled = false;
    for (const char* s : sections) enabled = enabled || section_enabled(c.json, s);
    TR_CHECK(!on || enabled,
             "{}: {} is given but the config enables no {} section, so DeepSpeed would train in fp32; add "
             "\"{}\": {{\"enabled\": \"auto\"}}",
             c.source, flag, sections[0], sections[0]);
  }
  TR_CHECK(
      !a.fp16 || c.stage > 0,
      "{}: fp16 at ZeRO stage 0 runs DeepSpeed's FP16_Optimizer, whose loss-scale rule is not reproduced "
      "here; use stage 1, 2 or 3, or --fp16 without --deepspeed (torch's GradScaler)",
      c.source);
}

// A key HF fills when it is there: its value ("auto" is the flag's), or DeepSpeed's default when absent.
double filled(const J* section, const char* key, double flag, double ds_default) {
  if (section == nullptr || !section->contains(key) || (*section)[key].is_null()) return ds_default;
  const J& v = (*section)[key];
  return is_auto(v) ? flag : v.get<double>();
}

// The optimizer DeepSpeed builds: its params as the config resolves them, DeepSpeed's defaults for the
// ones it leaves out (HF adds no key), on every parameter in one group.
void map_optimizer(const DeepSpeedConfig& c, const TrainingArguments& a, TrainingArguments& r,
                   const std::function<void(std::string)>& note) {
  if (a.optim != "adamw_torch")
    note(fmt::format("--optim {} is not used: the config's optimizer is", a.optim));
  if (!a.optim_args.empty())
    note(fmt::format("--optim_args {} is not used: DeepSpeed's optimizer takes the config's params",
                     a.optim_args));
  r.optim = "adamw_torch";
  r.optim_args.clear();
  const J& o = c.json["optimizer"];
  const J* p = o.contains("params") && o["params"].is_object() ? &o["params"] : nullptr;
  r.learning_rate = filled(p, "lr", a.learning_rate, 1e-3);
  r.adam_epsilon = filled(p, "eps", a.adam_epsilon, 1e-8);
  r.weight_decay = filled(p, "weight_decay", a.weight_decay, c.torch_adamw ? 1e-2 : 0.0);
  if (p == nullptr || !p->contains("betas") || (*p)["betas"].is_null()) {
    r.adam_beta1 = 0.9;
    r.adam_beta2 = 0.999;
  } else if (!is_auto((*p)["betas"])) {
    const JsonField betas = JsonField(c.json, c.source)["optimizer"]["params"]["betas"];
    if (betas.array().size() != 2) betas.fail_expected("two numbers [beta1, beta2]");
    r.adam_beta1 = betas[0].number(0, 1, Bounds::open_high);
    r.adam_beta2 = betas[1].number(0, 1, Bounds::open_high);
  }
  for (const auto& [key, was, now] :
       {std::tuple{"lr", a.learning_rate, r.learning_rate}, std::tuple{"eps", a.adam_epsilon, r.adam_epsilon},
        std::tuple{"weight_decay", a.weight_decay, r.weight_decay},
        std::tuple{"betas[0]", a.adam_beta1, r.adam_beta1},
        std::tuple{"betas[1]", a.adam_beta2, r.adam_beta2}})
    if (was != now)
      note(
          fmt::format("optimizer.params.{} is not in the config: DeepSpeed's default {} is used, not the "
                      "flag's {}",
                      key, now, was));
  TR_CHECK(!c.l2_adam || r.weight_decay == 0,
           "{}: optimizer Adam with adam_w_mode false and weight_decay {}: Adam with L2 weight decay is not "
           "among the optimizers here (AdamW, adam_w_mode true, is)",
           c.source, r.weight_decay);
}

}  // namespace

TrainingArguments apply_deepspeed_config(const TrainingArguments& a, int world_size,
                                         std::vector<std::string>* notes) {
  if (a.deepspeed.empty()) return a;
  const DeepSpeedConfig c = read_deepspeed_config(a.deepspeed);
  const std::vector<std::string> m = mismatches(c, a, world_size);
  TR_CHECK(
      m.empty(),
      "{}: Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n{}\n"
      "The easiest method is to set these DeepSpeed config values to 'auto'.",
      c.source, fmt::join(m, "\n"));
  check_precision(c, a);
  const std::string fsdp = deepspeed_fsdp(c);
  TR_CHECK(a.fsdp.empty() || a.fsdp == fsdp,
           "--fsdp {} and {} (ZeRO stage {}): both shard the model; give one", a.fsdp, c.source, c.stage);
  const auto note = [&](std::string s) {
    if (notes) notes->push_back(std::move(s));
  };
  TrainingArguments r = a;
  r.fsdp = fsdp;
  if (c.stage == 1)
    note(
        "ZeRO stage 1 runs as stage 2 (--fsdp shard_grad_op): the same updates, with the gradients sharded "
        "too");
  if (c.offload_param)
    note(
        "offload_param: parameters stay on the device here (the numbers are the same; offload_optimizer "
        "moves the optimizer's shard)");
  // HF's Trainer leaves clipping to DeepSpeed, whose default is none.
  r.max_grad_norm = filled(&c.json, "gradient_clipping", a.max_grad_norm, 0.0);
  if (r.max_grad_norm != a.max_grad_norm)
    note(
        fmt::format("gradient_clipping is not in the config: DeepSpeed clips nothing (--max_grad_norm {} is "
                    "not used)",
                    a.max_grad_norm));
  if (c.has_optimizer) map_optimizer(c, a, r, note);
  if (c.schedule && a.lr_scheduler_type != "linear")
    note(fmt::format("--lr_scheduler_type {} is not used: the config's scheduler ({}) is",
                     a.lr_scheduler_type, c.json["scheduler"]["type"].get<std::string>()));
  return r;
}

void check_deepspeed_steps(const DeepSpeedConfig& c, int64_t warmup, int64_t total) {
  std::vector<std::string> m;
  if (c.total_num_steps && *c.total_num_steps != total)
    m.push_back(
        fmt::format("- ds scheduler.params.total_num_steps={} vs hf num_training_steps (calculated)={}",
                    *c.total_num_steps, total));
  if (c.warmup_num_steps && *c.warmup_num_steps != warmup)
    m.push_back(fmt::format("- ds scheduler.params.warmup_num_steps={} vs hf warmup_steps={}",
                            *c.warmup_num_steps, warmup));
  TR_CHECK(
      m.empty(),
      "{}: Please correct the following DeepSpeed config values that mismatch "
      "TrainingArguments values:\n{}\nThe easiest method is to set these DeepSpeed config values to 'auto'.",
      c.source, fmt::join(m, "\n"));
}

}  // namespace tr::train
