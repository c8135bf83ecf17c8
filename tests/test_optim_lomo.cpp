// The optimizers that update during backward (optim/lomo.h, the galore_*_layerwise names): LOMO and AdaLomo
// against a transcription of lomo_optim's per-parameter update (tools/make_optim_golden.py), the update of
// one parameter at a time equal to the whole step's, and the Trainer's in-backward updates: the same bits as
// the optimizer stepped after backward, fewer bytes at the peak, per-micro-batch updates under accumulation,
// and the refusals (fp16, accumulation for the layer-wise names, notes for unused flags).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "optim_test_util.h"
#include "test_util.h"
#include "train/args.h"
#include "train/trainer.h"
#include "train_scratch.h"

namespace tr {
namespace {

namespace fs = std::filesystem;
using optim_test::expect_error;
using optim_test::floats;
using optim_test::Params;

const std::vector<std::string> kNames{"h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.ln_1.weight",
                                      "conv.weight"};

// 5 steps on the golden's gradients, each parameter updated as the backward hook would (last first). LOMO is
// torch's own arithmetic (and torch's SGD's); AdaLomo's reductions accumulate in double here and in f32 in
// torch, so its RMS and clip may differ in the last bit.
TEST(LomoGolden, FiveStepsGiveLomoOptimsValues) {
  auto f = io::SafetensorsFile::open(std::string(TRAINER_GOLDEN_DIR) + "/optim/optim_golden.safetensors");
  for (const auto& [name, lr] : {std::pair<std::string, double>{"lomo", 0.1}, {"adalomo", 1e-2}}) {
    Params ps;
    for (const auto& n : kNames) ps.add(n, f.load("init." + n));
    optim::OptimizerOptions o;
    o.lr = lr;
    auto opt = optim::make_optimizer(name, ps.list, o);
    ASSERT_TRUE(opt->updates_in_backward());
    for (int k = 0; k < 5; ++k) {
      for (size_t j = kNames.size(); j-- > 0;) {
        opt->step_in_backward(j, ops::clone(f.load("grad" + std::to_string(k + 1) + "." + kNames[j])), {},
                              Tensor(), j + 1 == kNames.size());
        EXPECT_FALSE(ps.list[j].second->grad().defined()) << "the gradient is dropped";
      }
    }
    EXPECT_EQ(opt->step_count(), 5) << name;
    for (size_t i = 0; i < kNames.size(); ++i) {
      const auto got = floats(*ps.list[i].second), want = floats(f.load(name + "." + kNames[i]));
      ASSERT_EQ(got.size(), want.size());
      if (name == "lomo") {
        EXPECT_EQ(got, want) << kNames[i];
        EXPECT_EQ(got, floats(f.load("sgd." + kNames[i]))) << "LOMO is torch's SGD without momentum";
        continue;
      }
      for (size_t j = 0; j < got.size(); ++j)
        EXPECT_NEAR(got[j], want[j], 1e-6 * std::max(1.0f, std::abs(want[j]))) << name << " " << kNames[i];
    }
  }
}

// step_in_backward, a parameter at a time (last first, as backward reports them), is step()'s arithmetic for
// every in-backward name: the same bits, state and step count (advanced once per backward).
TEST(LomoGolden, OneParameterAtATimeEqualsTheWholeStep) {
  for (const char* name : {"lomo", "adalomo", "galore_adamw_layerwise", "galore_adamw_8bit_layerwise",
                           "galore_adafactor_layerwise", "apollo_adamw_layerwise"}) {
    Params a;
    a.add("h.0.mlp.c_fc.weight", test::randn({48, 96}, 1));
    a.add("h.0.mlp.c_fc.bias", test::randn({96}, 2));
    Params b = a.clone();
    optim::OptimizerOptions o;
    o.lr = 1e-2;
    if (!std::string(name).ends_with("lomo")) {
      o.target_modules = "all-linear";
      o.linear_weights = {"h.0.mlp.c_fc.weight"};
      o.args = optim::parse_optim_args("rank=8,update_proj_gap=2");
    }
    auto whole = optim::make_optimizer(name, a.list, o), one = optim::make_optimizer(name, b.list, o);
    for (int k = 0; k < 4; ++k) {
      std::vector<Tensor> grads;
      for (size_t i = 0; i < a.list.size(); ++i)
        grads.push_back(test::randn(a.list[i].second->shape(), 100 + static_cast<uint64_t>(10 * k + i)));
      for (size_t i = 0; i < a.list.size(); ++i) autograd::set_grad(*a.list[i].second, ops::clone(grads[i]));
      whole->step();
      for (size_t i = a.list.size(); i-- > 0;)
        one->step_in_backward(i, ops::clone(grads[i]), {}, Tensor(), i + 1 == a.list.size());
    }
    for (size_t i = 0; i < a.list.size(); ++i)
      EXPECT_EQ(floats(*a.list[i].second), floats(*b.list[i].second)) << name << " " << a.list[i].first;
    EXPECT_EQ(whole->state_bytes(), one->state_bytes()) << name;
    EXPECT_EQ(one->step_count(), 4) << name;
    EXPECT_EQ(whole->step_count(), 4) << name;
  }
}

TEST(LomoErrors, ArgumentsAndNotes) {
  Params ps;
  ps.add("h.0.mlp.c_fc.weight", test::randn({6, 4}, 1));
  for (const char* name : {"lomo", "adalomo"}) {
    optim::OptimizerOptions o;
    o.args = optim::parse_optim_args("clip_grad_norm=1");
    EXPECT_NE(expect_error([&] {
                optim::make_optimizer(name, ps.list, o);
              }).find("'clip_grad_norm' is not an argument of"),
              std::string::npos)
        << name;
    EXPECT_TRUE(optim::updates_in_backward(name));
  }
  EXPECT_TRUE(optim::updates_in_backward("galore_adafactor_layerwise"));
  EXPECT_FALSE(optim::updates_in_backward("galore_adafactor"));
  EXPECT_FALSE(optim::updates_in_backward("sgd"));
  optim::OptimizerOptions o;
  o.weight_decay = 0.1;
  EXPECT_EQ(
      optim::unused_flags_note("adalomo", o),
      "--optim adalomo: HF builds lomo_optim's AdaLomo with the learning rate alone, so --weight_decay 0.1 "
      "is not used");
  EXPECT_EQ(
      optim::unused_flags_note("galore_adamw_layerwise", o),
      "--optim galore_adamw_layerwise: HF builds galore_torch's optimizer with the learning rate alone, so "
      "--weight_decay 0.1 (it uses none) is not used");
}

// ---------------------------------------------------------------------------------------------------------
// The Trainer.

// Updating each parameter as the engine reports its gradient final changes no bit: lomo trains as sgd,
// galore_adamw_layerwise as galore_adamw (without clipping, which in-backward updates cannot do), in fp32 and
// bf16 - and holds less at the peak, since the model's gradients never exist together.
TEST(TrainerLomo, InBackwardUpdatesEqualTheStepAfterBackward) {
  Scratch s("trainer_lomo");
  struct Pair {
    const char* fused;
    const char* after;
    bool bf16;
  };
  // (APOLLO's layer-wise seeds are all 1, as HF's one-parameter optimizers number them: its SVD basis
  // compares)
  for (const Pair& c : {Pair{"lomo", "sgd", false}, Pair{"galore_adamw_layerwise", "galore_adamw", false},
                        Pair{"galore_adafactor_layerwise", "galore_adafactor", true},
                        Pair{"apollo_adamw_layerwise", "apollo_adamw", false}}) {
    auto a = s.args(std::string(c.after) + (c.bf16 ? "_bf16" : ""));
    a.optim = c.after;
    a.max_grad_norm = 0;
    a.max_steps = 5;
    a.bf16 = c.bf16;
    if (std::string(c.after).starts_with("galore_") || std::string(c.after).starts_with("apollo_")) {
      a.optim_target_modules = "all-linear";
      a.optim_args = std::string("rank=4,update_proj_gap=2") + (c.after[0] == 'a' ? ",proj=svd" : "");
    }
    const auto after = train::train(a);
    auto b = a;
    b.optim = c.fused;
    b.output_dir = (s.dir / (std::string(c.fused) + (c.bf16 ? "_bf16" : ""))).string();
    const auto fused = train::train(b);
    EXPECT_EQ(fused.losses, after.losses) << c.fused;
    // the norm's squares summed a parameter at a time: the same to the last bits of an f64
    const auto fn = logged(b.output_dir, "grad_norm"), an = logged(a.output_dir, "grad_norm");
    ASSERT_EQ(fn.size(), an.size());
    for (size_t i = 0; i < fn.size(); ++i) EXPECT_NEAR(std::stod(fn[i]), std::stod(an[i]), 1e-12) << c.fused;
    EXPECT_TRUE(file_bytes(fs::path(b.output_dir) / "model.safetensors") ==
                file_bytes(fs::path(a.output_dir) / "model.safetensors"))
        << c.fused << ": the final weights differ";
    EXPECT_LE(fused.peak_bytes, after.peak_bytes) << c.fused;
    EXPECT_LT(fused.losses.back(), fused.losses.front()) << c.fused;
  }
  // Where the weights outweigh the activations (4 layers of 128, sequences of 8), the step after backward
  // peaks holding every gradient; updating during backward never holds them together (1.5 MB less here).
  std::ofstream(s.dir / "wide.json") << nlohmann::json{{"model_type", "gpt2"}, {"vocab_size", 50257},
                                                       {"n_embd", 128},        {"n_layer", 4},
                                                       {"n_head", 4},          {"n_positions", 64}}
                                            .dump();
  for (const Pair& c : {Pair{"lomo", "sgd", false}, Pair{"galore_adamw_layerwise", "galore_adamw", true}}) {
    auto a = s.args(std::string("wide_") + c.after);
    a.config_name = (s.dir / "wide.json").string();
    a.block_size = 8;
    a.per_device_train_batch_size = 1;
    a.max_steps = 2;
    a.optim = c.after;
    a.bf16 = c.bf16;
    if (std::string(c.after).starts_with("galore_")) a.optim_target_modules = "all-linear";
    auto b = a;
    b.optim = c.fused;
    b.output_dir = (s.dir / (std::string("wide_") + c.fused)).string();
    const int64_t after = train::train(a).peak_bytes, fused = train::train(b).peak_bytes;
    // (the tied embedding's gradient, the largest, is final only when backward ends: the peak is its update)
    EXPECT_GT(after - fused, 1000000) << c.fused;
  }
}

// Under accumulation lomo_optim updates in every micro-batch's backward (HF calls fused_backward per
// micro-batch): AdaLomo's step count is the number of backward passes, and the run is not the one-batch run.
TEST(TrainerLomo, AccumulationUpdatesEveryMicroBatch) {
  Scratch s("trainer_adalomo");
  auto a = s.args("ga2");
  a.optim = "adalomo";
  a.learning_rate = 1e-2;
  a.gradient_accumulation_steps = 2;
  a.per_device_train_batch_size = 2;
  a.max_steps = 4;
  a.save_steps = 4;
  const auto r = train::train(a);
  ASSERT_EQ(r.losses.size(), 4u);
  EXPECT_LT(r.losses.back(), r.losses.front());
  auto st =
      io::SafetensorsFile::open((fs::path(a.output_dir) / "checkpoint-4" / "optimizer.safetensors").string());
  EXPECT_EQ(ops::to_vector<int64_t>(ops::to_dtype(st.load("step"), DType::i64)), std::vector<int64_t>{8});
  // resumed from checkpoint-2, the same steps (the state and step count round-trip)
  auto b = a;
  b.output_dir = (s.dir / "crashed").string();
  b.save_steps = 2;
  EXPECT_THROW(train::train(b, crash_at_save(2)), std::runtime_error);
  b.resume_from_checkpoint = "true";
  const auto resumed = train::train(b);
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[0], r.losses[2]);
  EXPECT_EQ(resumed.losses[1], r.losses[3]);
}

TEST(TrainerLomo, RefusesWhatCannotHold) {
  Scratch s("trainer_lomo_errors");
  auto a = s.args("fp16");
  a.optim = "lomo";
  a.fp16 = true;
  EXPECT_NE(
      test::error_of([&] { train::train(a); })
          .find("--optim lomo with --fp16: lomo updates each parameter during backward, so a step whose "
                "gradients overflow cannot be skipped"),
      std::string::npos);
  auto b = s.args("ga");
  b.optim = "galore_adamw_layerwise";
  b.optim_target_modules = "all-linear";
  b.gradient_accumulation_steps = 2;
  EXPECT_NE(
      test::error_of([&] { train::train(b); })
          .find("--optim galore_adamw_layerwise with --gradient_accumulation_steps 2: the layer-wise "
                "optimizers update each parameter in every backward and take no gradient accumulation (as "
                "HF); use --optim galore_adamw to accumulate"),
      std::string::npos);
  EXPECT_FALSE(fs::exists(fs::path(a.output_dir) / "model.safetensors"));
}

}  // namespace
}  // namespace tr
