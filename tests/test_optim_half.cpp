// Half-precision weights (--torch_dtype bfloat16: the model's own bf16 weights, no fp32 masters). AdamW keeps
// bf16 moments and updates as torch's fused AdamW updates half tensors: each step equals the f32 update of
// the widened values rounded once per stored value, the clipped gradient rounded to its dtype first (both
// kernels, bf16 and f16); every other optimizer equals its f32 self over weights rounded after each step
// (HalfWeights: HF's Adafactor, lomo_optim and bitsandbytes on bf16 parameters); the Trainer saves bf16,
// resumes and compiles bit-exactly, takes less memory than --bf16, reads auto from a checkpoint, and refuses
// what cannot hold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "autograd/node.h"
#include "io/safetensors.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "optim/schedule_free.h"
#include "optim_test_util.h"
#include "test_util.h"
#include "train/args.h"
#include "train/trainer.h"
#include "train_scratch.h"

namespace tr {
namespace {

namespace fs = std::filesystem;
using optim_test::Params;

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = ops::contiguous(a), y = ops::contiguous(b);
  return x.dtype() == y.dtype() && x.nbytes() == y.nbytes() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}
Tensor widen(const Tensor& t) { return ops::to_dtype(t, DType::f32); }
Tensor draw(const Shape& s, Generator& gen, double scale, DType dt) {
  return ops::to_dtype(ops::affine(ops::randn(s, gen), scale, 0.0), dt);
}

// A linear weight (GaLore/APOLLO's target), its bias, a norm weight (no decay) and an embedding.
Params half_params(DType dt, Generator& gen) {
  Params p;
  p.add("h.0.mlp.c_fc.weight", draw({24, 16}, gen, 0.5, dt));
  p.add("h.0.mlp.c_fc.bias", draw({16}, gen, 0.5, dt));
  p.add("h.0.ln_1.weight", draw({16}, gen, 0.5, dt));
  p.add("wte.weight", draw({40, 16}, gen, 0.5, dt));
  return p;
}

std::map<std::string, Tensor> widened_state(const optim::Optimizer& opt) {
  std::map<std::string, Tensor> m;
  for (const auto& [k, t] : opt.state_dict()) m[k] = is_half(t.dtype()) ? widen(t) : t;
  return m;
}

// Each step of AdamW on half weights equals a fresh f32 AdamW over the widened weights and moments, rounded.
TEST(HalfWeightsAdamW, EachStepIsTheF32UpdateRoundedOnce) {
  for (const DType dt : {DType::bf16, DType::f16})
    for (const char* name : {"adamw_torch", "adamw_torch_fused"})
      for (const double max_norm : {0.0, 0.05}) {
        SCOPED_TRACE(std::string(name) + " " + std::string(dtype_name(dt)) + " clip " +
                     std::to_string(max_norm));
        Generator gen(5);
        Params p = half_params(dt, gen);
        optim::OptimizerOptions oo;
        oo.lr = 2e-2;
        oo.weight_decay = 0.1;
        auto opt = optim::make_optimizer(name, p.list, oo);
        for (int step = 1; step <= 3; ++step) {
          std::vector<Tensor> grads;
          for (const auto& [n, t] : p.list) grads.push_back(draw(t->shape(), gen, 0.3, dt));
          // The reference: f32 AdamW from the widened weights and state, the gradient transformed in f32 and
          // rounded to its dtype (torch's clip_grad_norm_ on a half gradient).
          Params w;
          for (const auto& [n, t] : p.list) w.add(n, widen(*t));
          optim::AdamW ref(w.list, oo);
          if (step > 1) ref.load_state_dict(widened_state(*opt));
          const Tensor stats = ops::grad_stats(grads, 1.0, Device::cpu());
          const backend::Backend::GradTransform t{1.0, max_norm, stats};
          for (size_t i = 0; i < grads.size(); ++i) {
            Tensor g = widen(grads[i]);
            ops::transform_grads({{g, g}}, t);
            autograd::set_grad(*w.list[i].second, widen(ops::to_dtype(g, dt)));
          }
          ref.step();
          opt->step(grads, t, {});
          const auto state = opt->state_dict();
          const auto ref_state = ref.state_dict();
          for (size_t i = 0; i < p.list.size(); ++i)
            EXPECT_TRUE(same_bits(*p.list[i].second, ops::to_dtype(*w.list[i].second, dt)))
                << "step " << step << " " << p.list[i].first;
          for (size_t k = 1; k < state.size(); ++k) {
            ASSERT_EQ(state[k].first, ref_state[k].first);
            EXPECT_EQ(state[k].second.dtype(), dt) << state[k].first;  // torch's zeros_like(param)
            EXPECT_TRUE(same_bits(state[k].second, ops::to_dtype(ref_state[k].second, dt)))
                << "step " << step << " " << state[k].first;
          }
        }
      }
}

// Clipping a half gradient in place: f32 arithmetic, one rounding (torch's clip_grad_norm_ on bf16).
TEST(HalfWeightsAdamW, TransformGradsRoundsAHalfGradientOnce) {
  Generator gen(9);
  const Tensor g = draw({1000}, gen, 1.0, DType::bf16);
  const Tensor stats = ops::grad_stats({g}, 1.0, Device::cpu());
  const backend::Backend::GradTransform t{1.0, 0.5, stats};
  Tensor f = widen(g);
  ops::transform_grads({{f, f}}, t);
  Tensor h = ops::clone(g);
  ops::transform_grads({{h, h}}, t);
  EXPECT_TRUE(same_bits(h, ops::to_dtype(f, DType::bf16)));
  EXPECT_FALSE(same_bits(h, g));  // the clip did act
}

// Every other optimizer: its f32 self stepped over the widened weights, the weights rounded after each step;
// its state (f32) the same bits. The schedule-free ones are refused.
TEST(HalfWeights, EveryOtherOptimizerIsItsF32SelfRoundedEachStep) {
  int checked = 0;
  for (const std::string& name : optim::optimizer_names()) {
    if (optim::AdamW::half_state(name)) continue;
    SCOPED_TRACE(name);
    Generator gen(3);
    Params p = half_params(DType::bf16, gen);
    optim::OptimizerOptions oo;
    oo.lr = 1e-2;
    if (optim::ScheduleFree::implements(name)) {
      EXPECT_NE(test::error_of([&] {
                  (void)optim::make_optimizer(name, p.list, oo);
                }).find("with half-precision weights (--torch_dtype bfloat16): its train/eval switch"),
                std::string::npos);
      continue;
    }
    if (name.starts_with("galore") || name.starts_with("apollo")) {
      oo.target_modules = "all-linear";
      oo.linear_weights = {"h.0.mlp.c_fc.weight"};
      oo.args = {{"rank", "4"}};
    }
    Params w;
    for (const auto& [n, t] : p.list) w.add(n, widen(*t));
    auto opt = optim::make_optimizer(name, p.list, oo);
    auto ref = optim::make_optimizer(name, w.list, oo);
    for (int step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < p.list.size(); ++i) {
        const Tensor g = draw(p.list[i].second->shape(), gen, 0.3, DType::bf16);
        autograd::set_grad(*p.list[i].second, g);
        autograd::set_grad(*w.list[i].second, widen(g));
      }
      opt->step();
      ref->step();
      for (size_t i = 0; i < p.list.size(); ++i) {
        Tensor& wi = *w.list[i].second;
        ops::copy_(wi, ops::to_dtype(wi, DType::bf16));  // the half weight the next step starts from
        EXPECT_EQ(p.list[i].second->dtype(), DType::bf16);
        EXPECT_TRUE(same_bits(*p.list[i].second, ops::to_dtype(wi, DType::bf16)))
            << "step " << step << " " << p.list[i].first;
      }
      opt->zero_grad();
      ref->zero_grad();
    }
    const auto state = opt->state_dict(), ref_state = ref->state_dict();
    ASSERT_EQ(state.size(), ref_state.size());
    for (size_t k = 0; k < state.size(); ++k) {
      EXPECT_EQ(state[k].first, ref_state[k].first);
      EXPECT_TRUE(same_bits(state[k].second, ref_state[k].second)) << state[k].first;
    }
    EXPECT_EQ(opt->state_bytes(), ref->state_bytes());
    ++checked;
  }
  EXPECT_GE(checked, 25);
}

// torchdistx's AnyPrecisionAdamW (adamw_anyprecision) against its step rewritten in torch 1.13
// (tools/make_optim_golden.py's AnyPrecisionRef): HF's defaults (f32 states), f32 with Kahan summation, bf16
// weights and states without and with Kahan summation (the pure-bf16 recipe), 5 steps, HF's decay groups.
TEST(AnyPrecisionGolden, FiveStepsMatchTheReference) {
  struct Case {
    const char* golden;
    DType dtype;
    const char* args;
  };
  auto f = io::SafetensorsFile::open(std::string(TRAINER_GOLDEN_DIR) + "/optim/optim_golden.safetensors");
  const std::vector<std::string> names{"h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.ln_1.weight",
                                       "conv.weight"};
  for (const Case& c :
       {Case{"anyprecision", DType::f32, ""},
        Case{"anyprecision_f32_kahan", DType::f32,
             "use_kahan_summation=true,compensation_buffer_dtype=float32"},
        Case{"anyprecision_bf16", DType::bf16, "momentum_dtype=bfloat16,variance_dtype=bfloat16"},
        Case{"anyprecision_bf16_kahan", DType::bf16,
             "use_kahan_summation=True,momentum_dtype=bfloat16,variance_dtype=bfloat16"}}) {
    SCOPED_TRACE(c.golden);
    Params ps;
    for (const auto& n : names) ps.add(n, ops::to_dtype(f.load("init." + n), c.dtype));
    optim::OptimizerOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.1;
    o.args = optim::parse_optim_args(c.args);
    auto opt = optim::make_optimizer("adamw_anyprecision", ps.list, o);
    for (int k = 1; k <= 5; ++k) {
      for (size_t i = 0; i < names.size(); ++i)
        autograd::set_grad(*ps.list[i].second,
                           ops::to_dtype(f.load("grad" + std::to_string(k) + "." + names[i]), c.dtype));
      opt->step();
    }
    // f32: bit for bit. bf16: torch's vectorized bf16 kernels order a few ops otherwise; all but at most two
    // of the 60 weights are torch's bits and those are one bf16 ulp apart.
    int off = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_EQ(ps.list[i].second->dtype(), c.dtype);
      const std::vector<float> got = optim_test::floats(widen(*ps.list[i].second)),
                               want = optim_test::floats(f.load(std::string(c.golden) + "." + names[i]));
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k) {
        if (got[k] == want[k]) continue;
        ++off;
        EXPECT_NEAR(got[k], want[k], std::abs(want[k]) * (1.0 / 128)) << names[i] << "[" << k << "]";
      }
    }
    EXPECT_LE(off, c.dtype == DType::f32 ? 0 : 2);
    const auto state = opt->state_dict();
    EXPECT_EQ(state.size(),
              1 + names.size() * (std::string(c.args).find("kahan") != std::string::npos ? 3 : 2));
  }
}

// With bf16 weights the compensation buffer keeps what bf16 rounds away: over many small updates Kahan's
// weights stay near the f32 run where plain bf16 stalls.
TEST(AnyPrecision, KahanSummationKeepsSmallUpdatesOfBf16Weights) {
  Generator gen(17);
  const Tensor w0 = ops::affine(ops::randn({4096}, gen), 1.0, 4.0);  // weights near 4: a bf16 ulp is 1/32
  const auto run = [&](DType dt, const char* args) {
    Params ps;
    ps.add("w", ops::to_dtype(w0, dt));
    optim::OptimizerOptions o;
    o.lr = 1e-3;  // an AdamW step of ~1e-3, far below half an ulp of 4
    o.args = optim::parse_optim_args(args);
    auto opt = optim::make_optimizer("adamw_anyprecision", ps.list, o);
    Generator g(5);
    for (int k = 0; k < 200; ++k) {
      autograd::set_grad(*ps.list[0].second, ops::to_dtype(ops::affine(ops::randn({4096}, g), 0.1, 1.0), dt));
      opt->step();
    }
    return widen(*ps.list[0].second);
  };
  const Tensor exact = run(DType::f32, "");
  const std::vector<float> want = optim_test::floats(exact);
  const auto distance = [&](const Tensor& t) {
    const std::vector<float> got = optim_test::floats(t);
    double d = 0;
    for (size_t i = 0; i < got.size(); ++i) d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    return d;
  };
  const double plain = distance(run(DType::bf16, "momentum_dtype=bfloat16,variance_dtype=bfloat16"));
  const double kahan =
      distance(run(DType::bf16, "use_kahan_summation=true,momentum_dtype=bfloat16,variance_dtype=bfloat16"));
  EXPECT_LT(kahan * 20, plain) << "kahan " << kahan << " plain " << plain;
}

TEST(AnyPrecision, ArgumentsAreChecked) {
  Params ps;
  ps.add("w", ops::zeros({3}, DType::f32));
  optim::OptimizerOptions o;
  o.args = optim::parse_optim_args("momentum_dtype=float64");
  EXPECT_NE(test::error_of([&] {
              (void)optim::make_optimizer("adamw_anyprecision", ps.list, o);
            }).find("adamw_anyprecision momentum_dtype='float64': expected float32, bfloat16 or float16"),
            std::string::npos);
  o.args = optim::parse_optim_args("kahan=true");
  EXPECT_NE(test::error_of([&] {
              (void)optim::make_optimizer("adamw_anyprecision", ps.list, o);
            }).find("'kahan' is not an argument of adamw_anyprecision"),
            std::string::npos);
}

std::string tensor_dtype(const fs::path& file, const std::string& name) {
  return io::safetensors_dtype_name(io::SafetensorsFile::open(file.string()).info(name).dtype);
}

std::string config_dtype(const fs::path& dir) {
  return nlohmann::json::parse(file_bytes(dir / "config.json")).value("torch_dtype", "");
}

TEST(TrainerHalfWeights, SavesBf16ResumesExactlyAndTakesLessMemory) {
  Scratch s("trainer_half_weights", 0.1);  // dropout on: the resumed generator state matters
  auto a = s.args("half");
  a.torch_dtype = "bfloat16";
  a.max_steps = 6;
  a.save_steps = 3;
  a.weight_decay = 0.1;
  const auto r = train::train(a);
  const fs::path out(a.output_dir);
  EXPECT_EQ(config_dtype(out), "bfloat16");
  EXPECT_EQ(tensor_dtype(out / "model.safetensors", "transformer.h.0.attn.c_attn.weight"), "BF16");
  EXPECT_EQ(tensor_dtype(out / "checkpoint-3" / "optimizer.safetensors",
                         "exp_avg.transformer.h.0.attn.c_attn.weight"),
            "BF16");
  // Resumed from step 3 in another folder: the same final weights, bit for bit.
  auto b = s.args("resumed");
  b.torch_dtype = "bfloat16";
  b.max_steps = 6;
  b.save_steps = 3;
  b.weight_decay = 0.1;
  fs::create_directories(b.output_dir);
  fs::copy(out / "checkpoint-3", fs::path(b.output_dir) / "checkpoint-3", fs::copy_options::recursive);
  b.resume_from_checkpoint = "true";
  const auto rb = train::train(b);
  EXPECT_EQ(file_bytes(out / "model.safetensors"), file_bytes(fs::path(b.output_dir) / "model.safetensors"));
  EXPECT_EQ(rb.last_loss, r.last_loss);
  // The same run over fp32 masters: more memory, nearly the same losses.
  auto c = s.args("masters");
  c.bf16 = true;
  c.max_steps = 6;
  c.save_steps = 3;
  c.weight_decay = 0.1;
  const auto rc = train::train(c);
  EXPECT_EQ(config_dtype(c.output_dir), "float32");
  EXPECT_LT(r.peak_bytes, rc.peak_bytes);
  EXPECT_NEAR(r.last_loss, rc.last_loss, 0.05);
  EXPECT_NE(r.last_loss, rc.last_loss);  // the weights did train in bf16
}

TEST(TrainerHalfWeights, CompiledEqualsEagerAndAutoReadsTheCheckpoint) {
  Scratch s("trainer_half_compile");
  auto a = s.args("eager");
  a.torch_dtype = "bfloat16";
  a.max_steps = 4;
  a.gradient_accumulation_steps = 2;
  train::train(a);
  auto b = s.args("compiled");
  b.torch_dtype = "bfloat16";
  b.max_steps = 4;
  b.gradient_accumulation_steps = 2;
  b.torch_compile = true;
  train::train(b);
  EXPECT_EQ(file_bytes(fs::path(a.output_dir) / "model.safetensors"),
            file_bytes(fs::path(b.output_dir) / "model.safetensors"));
  // Fine-tuning the saved bf16 model: auto reads its config (bf16 weights again), no dtype gives fp32.
  for (const char* dtype : {"auto", ""}) {
    auto c = s.args(std::string("tune_") + (*dtype ? dtype : "none"));
    c.config_name.clear();
    c.model_name_or_path = a.output_dir;
    c.dtype = dtype;
    c.max_steps = 2;
    train::train(c);
    EXPECT_EQ(config_dtype(c.output_dir), *dtype ? "bfloat16" : "float32") << dtype;
  }
}

TEST(TrainerHalfWeights, RefusesWhatCannotHold) {
  Scratch s("trainer_half_errors");
  const auto error = [&](const std::function<void(train::TrainingArguments&)>& change) {
    auto a = s.args("refused");
    a.torch_dtype = "bfloat16";
    change(a);
    return test::error_of([&] { train::train(a); });
  };
  EXPECT_NE(
      error([](auto& a) { a.torch_dtype = "float16"; }).find("--torch_dtype float16: fp16 weights trained"),
      std::string::npos);
  EXPECT_NE(error([](auto& a) { a.torch_dtype = "half"; }).find("torch_dtype"), std::string::npos);
  EXPECT_NE(error([](auto& a) {
              a.dtype = "float32";
            }).find("--torch_dtype bfloat16 and --dtype float32: one model dtype"),
            std::string::npos);
  EXPECT_NE(error([](auto& a) { a.fp16 = true; }).find("--torch_dtype bfloat16 with --fp16"),
            std::string::npos);
  EXPECT_NE(error([](auto& a) { a.fsdp = "full_shard"; }).find("--torch_dtype bfloat16 with --fsdp"),
            std::string::npos);
  EXPECT_NE(error([](auto& a) {
              a.optim = "schedule_free_adamw";
            }).find("--optim schedule_free_adamw with half-precision weights"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(s.dir / "refused" / "model.safetensors"));
}

}  // namespace
}  // namespace tr
