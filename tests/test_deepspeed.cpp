// HF's --deepspeed: DeepSpeed's schedules and fp16 loss scaler against numbers from DeepSpeed's own code
// (tests/deepspeed_golden.py runs its lr_schedules.py and fp16/loss_scaler.py), HF's "auto" filling and
// mismatch message, the ZeRO stage mapped onto --fsdp, and what is refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/deepspeed_config.h"
#include "train/lr_schedule.h"
#include "train/mixed_precision.h"
#include "test_util.h"

namespace tr {
namespace {

using nlohmann::json;
using test::error_of;
using train::DeepSpeedSchedule;

train::TrainingArguments with_config(const json& ds) {
  train::TrainingArguments a;
  a.output_dir = "out";
  a.model_type = "gpt2";
  a.train_file = "train.txt";
  a.deepspeed = ds.dump();
  return a;
}

struct ScheduleCase {
  json scheduler;             // the config's section (lr 1e-3)
  int64_t warmup, total;      // the run's (HF fills warmup_num_steps and total_num_steps)
  std::vector<double> rates;  // DeepSpeed's param_groups[0]["lr"] before optimizer step 1, 2, ...
};

// Produced by DeepSpeed's classes on a torch AdamW(lr=1e-3): `for n in range(N): out.append(lr); s.step()`.
const std::vector<ScheduleCase>& schedule_cases() {
  static const std::vector<ScheduleCase> c = {
      {{{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", "auto"}}}},
       5,
       9,
       {0.0, 0.0, 0.00043067655807339306, 0.0006826061944859854, 0.0008613531161467861, 0.001, 0.001, 0.001,
        0.001}},
      {{{"type", "WarmupLR"},
        {"params", {{"warmup_min_lr", 1e-5}, {"warmup_num_steps", 4}, {"warmup_type", "linear"}}}},
       4,
       7,
       {1e-05, 1e-05, 0.0002575, 0.000505, 0.0007525, 0.001, 0.001}},
      {{{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", "auto"}, {"warmup_num_steps", "auto"}}}},
       3,
       10,
       {0.0, 0.0, 0.0006309297535714573, 0.001, 0.001, 0.0008571428571428571, 0.0007142857142857143,
        0.0005714285714285714, 0.00042857142857142855, 0.0002857142857142857, 0.00014285714285714284, 0.0}},
      {{{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", "auto"}, {"warmup_num_steps", 0}}}},
       0,
       6,
       {0.0, 0.0, 0.001, 0.001, 0.00075, 0.0005, 0.00025}},
      {{{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 10}, {"warmup_num_steps", "auto"}}}},
       3,
       10,
       {0.0, 0.0, 0.0006309297535714573, 0.001, 0.0009504893855078144, 0.0008117637264392739,
        0.0006112993409314593, 0.0003888006590685407, 0.0001883362735607262, 4.961061449218561e-05,
        1.0000000000000001e-07}},
      {{{"type", "WarmupCosineLR"},
        {"params",
         {{"total_num_steps", "auto"},
          {"warmup_num_steps", 4},
          {"warmup_min_ratio", 0.1},
          {"cos_min_ratio", 0.2},
          {"warmup_type", "linear"}}}},
       4,
       8,
       {0.0, 0.0001, 0.00032500000000000004, 0.00055, 0.0007750000000000001, 0.000882842712474619,
        0.0006000000000000001, 0.00031715728752538104, 0.0002}},
  };
  return c;
}

TEST(DeepSpeedSchedules, EveryRateIsDeepSpeeds) {
  for (const auto& c : schedule_cases()) {
    auto a = with_config({{"scheduler", c.scheduler}});
    a.learning_rate = 1e-3;
    const train::DeepSpeedConfig ds = train::read_deepspeed_config(a.deepspeed);
    ASSERT_TRUE(ds.schedule.has_value());
    train::check_deepspeed_steps(ds, c.warmup, c.total);
    const train::LrSchedule s(*ds.schedule, a.learning_rate);
    for (size_t n = 0; n < c.rates.size(); ++n)
      EXPECT_NEAR(s.at(static_cast<int64_t>(n), c.warmup, c.total), c.rates[n], 1e-18)
          << c.scheduler.dump() << " step " << n + 1;
  }
}

// HF fills only the keys a config has: one left out keeps DeepSpeed's default (warmup_max_lr 0.001 whatever
// --learning_rate is, warmup_num_steps 1000 whatever the run's warmup is).
TEST(DeepSpeedSchedules, KeysLeftOutKeepDeepSpeedsDefaults) {
  auto ds = train::read_deepspeed_config(
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2}}})");
  train::check_deepspeed_steps(ds, 2, 10);
  const train::LrSchedule no_max(*ds.schedule, 5e-4);
  EXPECT_EQ(no_max.at(3, 2, 10), 1e-3);
  ds = train::read_deepspeed_config(R"({"scheduler": {"type": "WarmupLR"}})");
  const train::LrSchedule no_params(*ds.schedule, 1e-3);
  EXPECT_DOUBLE_EQ(no_params.at(2, 5, 10), 1e-3 * std::log(2.0) / std::log(1000.0));  // not the run's 5
  EXPECT_EQ(no_params.at(1, 5, 10), 0.0);
}

TEST(DeepSpeedSchedules, StepCountsThatAreNotTheRunsAreHfsMismatch) {
  const auto ds = train::read_deepspeed_config(
      json{{"scheduler",
            {{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", 100}, {"warmup_num_steps", 5}}}}}}
          .dump());
  EXPECT_NO_THROW(train::check_deepspeed_steps(ds, 5, 100));
  EXPECT_EQ(
      error_of([&] { train::check_deepspeed_steps(ds, 6, 90); }),
      "--deepspeed's JSON: Please correct the following DeepSpeed config values "
      "that mismatch TrainingArguments values:\n- ds scheduler.params.total_num_steps=100 vs hf "
      "num_training_steps (calculated)=90\n- ds scheduler.params.warmup_num_steps=5 vs hf warmup_steps=6\n"
      "The easiest method is to set these DeepSpeed config values to 'auto'.");
}

struct ScalerCase {
  json fp16;                                     // the config's section
  std::vector<int> overflows;                    // per step
  std::vector<std::pair<double, int64_t>> want;  // (cur_scale, cur_hysteresis) after each
                                                 // step
};

// Produced by DeepSpeed's
// DynamicLossScaler(init_scale, scale_window,
// delayed_shift, consecutive_hysteresis, min_scale):
// update_scale(overflow) per step, then (cur_scale,
// cur_hysteresis).
TEST(DeepSpeedLossScaler, UpdatesAsDeepSpeedsDynamicLossScaler) {
  const std::vector<ScalerCase> cases = {
      {{{"enabled", true}, {"initial_scale_power", 16}, {"loss_scale_window", 3}, {"hysteresis", 2}},
       {1, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0},
       {{65536, 1},
        {65536, 1},
        {32768, 1},
        {16384, 1},
        {16384, 1},
        {16384, 1},
        {32768, 2},
        {32768, 2},
        {32768, 1},
        {32768, 1},
        {32768, 1},
        {65536, 2}}},
      {{{"enabled", true}, {"loss_scale_window", 2}, {"hysteresis", 3}, {"consecutive_hysteresis", true}},
       {1, 0, 1, 1, 1, 0, 0, 1, 1, 0},
       {{65536, 2},
        {65536, 3},
        {65536, 2},
        {65536, 1},
        {32768, 1},
        {32768, 3},
        {65536, 3},
        {65536, 2},
        {65536, 1},
        {65536, 3}}},
  };
  for (const auto& c : cases) {
    const auto ds = train::read_deepspeed_config(json{{"fp16", c.fp16}}.dump());
    train::GradScaler g;
    g.scale = *ds.initial_scale;
    g.deepspeed = ds.scaling;
    for (size_t i = 0; i < c.overflows.size(); ++i) {
      g.update(c.overflows[i] != 0);
      EXPECT_EQ(g.scale, c.want[i].first) << c.fp16.dump() << " step " << i;
      EXPECT_EQ(g.deepspeed->cur_hysteresis, c.want[i].second) << c.fp16.dump() << " step " << i;
    }
    // A checkpoint's state continues the same way.
    train::GradScaler back;
    back.deepspeed = ds.scaling;
    back.load_json(g.to_json(), "scaler.json");
    EXPECT_EQ(back.to_json(), g.to_json());
  }
}

TEST(DeepSpeedLossScaler, DefaultsAndStaticScaleAndTheMinimum) {
  // No dynamic key: DeepSpeed's ZeRO optimizers use
  // DynamicLossScaler's own defaults (2^32, no
  // hysteresis).
  auto ds = train::read_deepspeed_config(R"({"fp16": {"enabled": "auto"}})");
  EXPECT_EQ(*ds.initial_scale, 4294967296.0);
  EXPECT_EQ(ds.scaling.hysteresis, 1);
  EXPECT_EQ(ds.scaling.window, 1000);
  // Any of them: the section's values with DeepSpeed's
  // config defaults (2^16, hysteresis 2).
  ds = train::read_deepspeed_config(R"({"fp16": {"enabled": true, "min_loss_scale": 2}})");
  EXPECT_EQ(*ds.initial_scale, 65536.0);
  EXPECT_EQ(ds.scaling.hysteresis, 2);
  EXPECT_EQ(ds.scaling.min_scale, 2.0);
  // Static: the scale never moves.
  ds = train::read_deepspeed_config(R"({"fp16": {"enabled": true, "loss_scale": 128}})");
  train::GradScaler s;
  s.scale = *ds.initial_scale;
  s.deepspeed = ds.scaling;
  s.update(true);
  s.update(false);
  EXPECT_EQ(s.scale, 128.0);
  // An overflow at the minimum ends the run with
  // DeepSpeed's words (init 2, min 1: 2 -> 1, then the
  // end).
  ds = train::read_deepspeed_config(
      R"({"fp16": {"enabled": true, "initial_scale_power": 1, "hysteresis": 1}})");
  train::GradScaler m;
  m.scale = *ds.initial_scale;
  m.deepspeed = ds.scaling;
  m.update(true);
  EXPECT_EQ(m.scale, 1.0);
  EXPECT_NE(error_of([&] { m.update(true); }).find("Current loss scale already at minimum"),
            std::string::npos);
  // A torch GradScaler checkpoint does not resume
  // under DeepSpeed's rule, nor the other way.
  train::GradScaler torch_scaler;
  EXPECT_NE(error_of([&] { m.load_json(torch_scaler.to_json(), "scaler.json"); }).find("torch's GradScaler"),
            std::string::npos);
  EXPECT_NE(error_of([&] { torch_scaler.load_json(m.to_json(), "scaler.json"); }).find("no --deepspeed fp16"),
            std::string::npos);
}

// HF's ds_config_zero2.json / zero3.json with every
// value "auto": the flags fill it, the stage maps onto
// --fsdp.
json hf_example(int stage, bool offload) {
  json z{{"stage", stage},
         {"overlap_comm", true},
         {"contiguous_gradients", true},
         {"reduce_bucket_size", "auto"},
         {"allgather_bucket_size", 2e8},
         {"sub_group_size", 1e9}};
  if (offload) z["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (stage == 3) {
    z["stage3_prefetch_bucket_size"] = "auto";
    z["stage3_param_persistence_threshold"] = "auto";
    z["stage3_gather_16bit_weights_on_model_save"] = true;
  }
  return {
      {"fp16", {{"enabled", "auto"}, {"loss_scale", 0}, {"initial_scale_power", 16}, {"hysteresis", 2}}},
      {"bf16", {{"enabled", "auto"}}},
      {"optimizer",
       {{"type", "AdamW"},
        {"params", {{"lr", "auto"}, {"betas", "auto"}, {"eps", "auto"}, {"weight_decay", "auto"}}}}},
      {"scheduler",
       {{"type", "WarmupLR"},
        {"params", {{"warmup_min_lr", "auto"}, {"warmup_max_lr", "auto"}, {"warmup_num_steps", "auto"}}}}},
      {"zero_optimization", z},
      {"gradient_accumulation_steps", "auto"},
      {"gradient_clipping", "auto"},
      {"steps_per_print", 2000},
      {"train_batch_size", "auto"},
      {"train_micro_batch_size_per_gpu", "auto"},
      {"wall_clock_breakdown", false}};
}

TEST(DeepSpeedConfig, HfsExampleConfigsMapOntoZeroStrategies) {
  const std::vector<std::tuple<int, bool, std::string>> rows = {{0, false, ""},
                                                                {1, false, "shard_grad_op"},
                                                                {2, false, "shard_grad_op"},
                                                                {2, true, "shard_grad_op offload"},
                                                                {3, false, "full_shard"},
                                                                {3, true, "full_shard offload"}};
  for (const auto& [stage, offload, fsdp] : rows) {
    auto a = with_config(hf_example(stage, offload));
    a.optim = "sgd";
    a.lr_scheduler_type = "cosine";
    std::vector<std::string> notes;
    const train::TrainingArguments r = train::apply_deepspeed_config(a, 4, &notes);
    EXPECT_EQ(r.fsdp, fsdp) << stage;
    EXPECT_EQ(r.optim,
              "adamw_torch");  // DeepSpeed's AdamW replaces
                               // --optim, as HF's DummyOptim
    EXPECT_EQ(r.max_grad_norm,
              1.0);  // "gradient_clipping": "auto"
    EXPECT_NO_THROW(r.validate());
    // Idempotent: a training_args.json written by the
    // run reads back into the same run.
    EXPECT_EQ(train::apply_deepspeed_config(r, 4).to_json(), r.to_json());
    std::string all;
    for (const auto& n : notes) all += n + "\n";
    EXPECT_NE(all.find("--optim sgd is not used"), std::string::npos) << all;
    EXPECT_NE(all.find("--lr_scheduler_type cosine is not used: "
                       "the config's scheduler (WarmupLR) is"),
              std::string::npos)
        << all;
    EXPECT_EQ(all.find("stage 1 runs as stage 2") != std::string::npos, stage == 1) << all;
  }
}

TEST(DeepSpeedConfig, ConcreteValuesThatDifferAreHfsMismatchError) {
  json ds = hf_example(2, false);
  ds["train_micro_batch_size_per_gpu"] = 4;
  ds["train_batch_size"] = 64;
  ds["gradient_clipping"] = 1;  // 1 == 1.0: no mismatch (Python's
                                // comparison)
  ds["optimizer"]["params"]["lr"] = 3e-5;
  ds["optimizer"]["params"]["betas"] = {0.9, 0.95};
  ds["fp16"]["enabled"] = true;
  auto a = with_config(ds);
  a.per_device_train_batch_size = 8;
  a.gradient_accumulation_steps = 2;
  EXPECT_EQ(error_of([&] { train::apply_deepspeed_config(a, 2); }),
            "--deepspeed's JSON: Please correct the "
            "following DeepSpeed config values "
            "that mismatch TrainingArguments values:\n"
            "- ds train_micro_batch_size_per_gpu=4 vs hf "
            "per_device_train_batch_size=8\n"
            "- ds train_batch_size=64 vs hf "
            "train_batch_size (calculated)=32\n"
            "- ds optimizer.params.lr=3e-05 vs hf "
            "learning_rate=5e-05\n"
            "- ds optimizer.params.betas=[0.9, 0.95] vs hf "
            "adam_beta1+adam_beta2=[0.9, 0.999]\n"
            "- ds fp16.enabled=True vs hf "
            "fp16|fp16_full_eval=False\n"
            "The easiest method is to set these DeepSpeed "
            "config values to 'auto'.");
  // The same values given as flags: accepted.
  a.per_device_train_batch_size = 4;
  a.gradient_accumulation_steps = 8;
  a.learning_rate = 3e-5;
  a.adam_beta2 = 0.95;
  a.fp16 = true;
  EXPECT_NO_THROW(train::apply_deepspeed_config(a, 2));
  // An automatic batch fills the batch sizes
  // (must_match false in HF).
  a.per_device_train_batch_size = train::kAutoBatch;
  EXPECT_NO_THROW(train::apply_deepspeed_config(a, 2));
}

TEST(DeepSpeedConfig, WhatIsNotHereIsRefusedByName) {
  const std::vector<std::pair<json, std::string>> rows = {
      {{{"zero_optimisation", {{"stage", 2}}}},
       "'zero_optimisation' is not a DeepSpeed "
       "setting read here"},
      {{{"zero_optimisation", {{"stage", 2}}}}, "did you mean 'zero_optimization'"},
      {{{"zero_optimization", {{"stage", 4}}}}, "zero_optimization.stage"},
      {{{"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "nvme"}}}}}}, "NVMe"},
      {{{"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "nvme"}}}}}}, "NVMe"},
      {{{"bf16", {{"enabled", true}, {"check_grad_overflow", true}}}}, "never skipped"},
      {{{"zero_optimization", {{"stage", 0}, {"offload_optimizer", {{"device", "cpu"}}}}}},
       "needs stage 1, 2 or 3"},
      {{{"zero_optimization", {{"stage", 3}, {"zero_quantized_weights", true}}}}, "ZeRO++"},
      {{{"optimizer", {{"type", "Lamb"}}}}, "\"Lamb\": DeepSpeed's Adam and AdamW"},

      {{{"optimizer", {{"type", "AdamW"}, {"params", {{"max_grad_norm", 1.0}}}}}},
       "optimizer.params.max_grad_norm"},
      {{{"scheduler", {{"type", "OneCycle"}}}}, "scheduler.type"},
      {{{"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 10}}}}}},
       "without params.total_num_steps"},
      {{{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_type", "cosine"}}}}}}, "warmup_type"},
      {{{"scheduler",
         {{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 5}, {"warmup_max_lr", 1}}}}}},
       "scheduler.params.warmup_max_lr"},
      {{{"communication_data_type", "bf16"}}, "gradients are reduced in the precision"},
      {{{"tensorboard", {{"enabled", true}, {"output_path", "tb"}}}}, "--report_to tensorboard"},
      {{{"fp16", {{"enabled", true}, {"fp16_master_weights_and_grads", true}}}}, "masters are fp32 here"},
      {json::array(), "must be an object, got an array"},
  };
  for (const auto& [config, want] : rows) {
    const std::string e = error_of([&] { train::read_deepspeed_config(config.dump()); });
    EXPECT_NE(e.find(want), std::string::npos) << config.dump() << "\n" << e;
  }
  // Sections switched off, logging and tuning keys:
  // accepted.
  EXPECT_NO_THROW(train::read_deepspeed_config(
      R"({"tensorboard": {"enabled": false}, "flops_profiler": {"enabled": false}, "steps_per_print": 10,
          "wall_clock_breakdown": true, "zero_allow_untested_optimizer": true, "amp": {"enabled": false}})"));
  // A file that is not there, or not JSON: one message
  // naming it.
  EXPECT_NE(
      error_of([] { train::read_deepspeed_config("/nonexistent/ds.json"); }).find("/nonexistent/ds.json"),
      std::string::npos);
  EXPECT_NE(error_of([] { train::read_deepspeed_config("{\"fp16\": "); }).find("--deepspeed"),
            std::string::npos);
}

TEST(DeepSpeedConfig, FlagsItWouldIgnoreOrContradictAreRefused) {
  auto a = with_config({{"zero_optimization", {{"stage", 2}}}});
  a.fp16 = true;  // DeepSpeed would train in fp32
                  // without an fp16 section
  EXPECT_NE(
      error_of([&] { train::apply_deepspeed_config(a, 1); }).find("add \"fp16\": {\"enabled\": \"auto\"}"),
      std::string::npos);
  a = with_config({{"fp16", {{"enabled", "auto"}}}});
  a.fp16 = true;  // stage 0: DeepSpeed's FP16_Optimizer
  EXPECT_NE(error_of([&] { train::apply_deepspeed_config(a, 1); }).find("stage 0"), std::string::npos);
  a = with_config({{"zero_optimization", {{"stage", 3}}}});
  a.fsdp = "shard_grad_op";
  EXPECT_NE(error_of([&] { train::apply_deepspeed_config(a, 1); }).find("both shard the model"),
            std::string::npos);
  a.fsdp = "full_shard";  // what the config says: fine (a
                          // saved training_args.json)
  EXPECT_NO_THROW(train::apply_deepspeed_config(a, 1));
  // L2 Adam once HF has filled weight_decay from the
  // flag.
  a = with_config(
      {{"optimizer", {{"type", "Adam"}, {"params", {{"adam_w_mode", false}, {"weight_decay", "auto"}}}}}});
  a.weight_decay = 0.1;
  EXPECT_NE(error_of([&] { train::apply_deepspeed_config(a, 1); }).find("Adam with L2 weight decay"),
            std::string::npos);
  a.weight_decay = 0;  // the same update as AdamW's
  EXPECT_NO_THROW(train::apply_deepspeed_config(a, 1));
}

// What HF's Trainer leaves to DeepSpeed takes
// DeepSpeed's defaults when the config leaves it out:
// no clipping, FusedAdam's lr 1e-3 and weight decay 0
// (torch's AdamW: 0.01), whatever the flags say.
TEST(DeepSpeedConfig, KeysLeftOutAreDeepSpeedsDefaultsNotTheFlags) {
  auto a = with_config({{"optimizer", {{"type", "AdamW"}, {"params", {{"betas", "auto"}}}}}});
  a.learning_rate = 3e-4;
  a.weight_decay = 0.1;
  a.adam_beta2 = 0.95;
  a.optim = "sgd";
  std::vector<std::string> notes;
  auto r = train::apply_deepspeed_config(a, 1, &notes);
  EXPECT_EQ(r.max_grad_norm, 0.0);
  EXPECT_EQ(r.learning_rate, 1e-3);
  EXPECT_EQ(r.weight_decay, 0.0);
  EXPECT_EQ(r.adam_beta2, 0.95);  // "auto": the flag's
  EXPECT_EQ(r.optim, "adamw_torch");
  std::string all;
  for (const auto& n : notes) all += n + "\n";
  for (const char* want : {"gradient_clipping is not in the config: "
                           "DeepSpeed clips nothing",
                           "optimizer.params.lr is not in the config: "
                           "DeepSpeed's default 0.001 is used",
                           "--optim sgd is not used"})
    EXPECT_NE(all.find(want), std::string::npos) << all;
  a = with_config({{"optimizer", {{"type", "AdamW"}, {"params", {{"torch_adam", true}}}}},
                   {"gradient_clipping", "auto"}});
  r = train::apply_deepspeed_config(a, 1);
  EXPECT_EQ(r.weight_decay, 0.01);
  EXPECT_EQ(r.max_grad_norm, 1.0);
  // "auto" where HF fills nothing: accelerate refuses
  // it, so do we.
  EXPECT_NE(error_of([] { train::read_deepspeed_config(R"({"zero_optimization": {"stage": "auto"}})"); })
                .find("'zero_optimization.stage' is \"auto\", "
                      "which HF's Trainer does not fill"),
            std::string::npos);
  EXPECT_NO_THROW(
      train::read_deepspeed_config(R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}})"));
  // Parameter offload: the same numbers with the
  // parameters on the device, said.
  a = with_config(
      {{"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "cpu"}, {"pin_memory", true}}}}}});
  notes.clear();
  EXPECT_EQ(train::apply_deepspeed_config(a, 1, &notes).fsdp, "full_shard");
  all.clear();
  for (const auto& n : notes) all += n + "\n";
  EXPECT_NE(all.find("offload_param: parameters stay on the device"), std::string::npos) << all;
}

}  // namespace
}  // namespace tr
