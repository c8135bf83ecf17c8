// The optimizer set (optim/optimizer.h): PyTorch / transformers reference values
// (tools/make_optim_golden.py), fused AdamW == per-tensor AdamW bit for bit, bit-exact resume for every
// optimizer, the element-wise optimizers, and the errors for bad names and arguments (the 8-bit ones:
// test_optim_8bit.cpp).
#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "optim_test_util.h"
#include "test_util.h"

namespace tr {
namespace {

namespace fs = std::filesystem;
using optim_test::expect_error;
using optim_test::floats;
using optim_test::Params;

// ---------------------------------------------------------------------------------------------------------
// References: 4 parameters (2-D and 3-D that decay, a bias and a norm weight that do not), 5 fixed gradients;
// torch 1.13's optimizers (tools/make_optim_golden.py), bitsandbytes' 32-bit kernels transcribed there.

struct GoldenCase {
  std::string golden;  // config name in optim_golden.safetensors
  std::string optim;   // --optim
  double lr, weight_decay;
  std::string args;  // --optim_args
  double beta2 = 0.999;
};

class OptimGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(OptimGolden, FiveStepsMatchTheReference) {
  const GoldenCase& c = GetParam();
  auto f = io::SafetensorsFile::open(std::string(TRAINER_GOLDEN_DIR) + "/optim/optim_golden.safetensors");
  const std::vector<std::string> names{"h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.ln_1.weight",
                                       "conv.weight"};
  Params ps;
  for (const auto& n : names) ps.add(n, f.load("init." + n));
  optim::OptimizerOptions o;
  o.lr = c.lr;
  o.weight_decay = c.weight_decay;
  o.args = optim::parse_optim_args(c.args);
  o.beta2 = c.beta2;
  auto opt = optim::make_optimizer(c.optim, ps.list, o);
  for (int k = 1; k <= 5; ++k) {
    for (size_t i = 0; i < names.size(); ++i)
      autograd::set_grad(*ps.list[i].second, ops::clone(f.load("grad" + std::to_string(k) + "." + names[i])));
    opt->step();
  }
  EXPECT_EQ(opt->step_count(), 5);
  for (size_t i = 0; i < names.size(); ++i) {
    // f32 throughout on both sides; Adafactor's reductions may add in another order, hence a few ulps; the
    // element-wise optimizers give torch's (and the transcribed bitsandbytes kernels') bits.
    EXPECT_TRUE(test::all_close(*ps.list[i].second, f.load(c.golden + "." + names[i]), 1e-6, 1e-7))
        << c.optim << " " << c.args << ": " << names[i];
    // StableAdamW's conv.weight: its RMS term at step 2 (1.08) divides the rate, and torch sums that mean
    // in f32 in its own order where ours sums in f64 (1 ulp apart: 1.0838969 vs 1.0838970); every element
    // update is torch's.
    const bool rms_clipped = c.golden == "stable_adamw" && names[i] == "conv.weight";
    if (c.optim != "adafactor" && !rms_clipped) {
      EXPECT_EQ(floats(*ps.list[i].second), floats(f.load(c.golden + "." + names[i])))
          << c.optim << " " << c.args << ": " << names[i] << " bit for bit";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, OptimGolden,
    ::testing::Values(GoldenCase{"adamw", "adamw_torch", 1e-2, 0.1, ""},
                      GoldenCase{"adamw", "adamw_torch_fused", 1e-2, 0.1, ""},
                      GoldenCase{"adamw", "adamw_apex_fused", 1e-2, 0.1, ""},
                      GoldenCase{"adamw", "adamw_torch_xla", 1e-2, 0.1, ""},
                      GoldenCase{"adamw", "adamw_torch_npu_fused", 1e-2, 0.1, ""},
                      GoldenCase{"sgd", "sgd", 0.1, 0.0, ""},
                      GoldenCase{"sgd_momentum", "sgd", 0.1, 0.01, "momentum=0.9,dampening=0.1"},
                      GoldenCase{"sgd_nesterov", "sgd", 0.1, 0.01, "momentum=0.9, nesterov=true"},
                      GoldenCase{"adafactor", "adafactor", 1e-2, 0.01, ""},
                      GoldenCase{"adafactor_beta1", "adafactor", 1e-2, 0.01, "beta1=0.9,clip_threshold=0.5"},
                      GoldenCase{"adafactor_scaled", "adafactor", 1e-2, 0.0, "scale_parameter=true"},
                      GoldenCase{"adagrad", "adagrad", 1e-2, 0.01, ""},
                      GoldenCase{"adagrad_args", "adagrad", 0.1, 0.01,
                                 "lr_decay=0.01,initial_accumulator_value=0.1,eps=1e-6"},
                      GoldenCase{"rmsprop", "rmsprop", 1e-2, 0.01, ""},
                      GoldenCase{"rmsprop_momentum", "rmsprop", 1e-2, 0.01,
                                 "alpha=0.9,eps=1e-6,momentum=0.9"},
                      // bitsandbytes' 32-bit kernels, transcribed (tools/make_optim_golden.py's Bnb32)
                      GoldenCase{"lion", "lion_32bit", 1e-2, 0.1, "", 0.99},
                      GoldenCase{"lion", "paged_lion_32bit", 1e-2, 0.1, "", 0.99},
                      GoldenCase{"rmsprop_bnb", "rmsprop_bnb", 1e-2, 0.01, ""},
                      GoldenCase{"rmsprop_bnb", "rmsprop_bnb_32bit", 1e-2, 0.01, ""},
                      GoldenCase{"adam_bnb32", "paged_adamw_32bit", 1e-2, 0.1, ""},
                      GoldenCase{"ademamix", "ademamix", 1e-2, 0.1, ""},
                      GoldenCase{"stable_adamw", "stable_adamw", 1e-2, 0.1, "", 0.99},
                      GoldenCase{"stable_adamw_decoupled", "stable_adamw", 1e-2, 1e-3,
                                 "decouple_lr=true,max_lr=0.02,kahan_sum=true"},
                      GoldenCase{"ademamix_sched", "paged_ademamix_32bit", 1e-2, 0.01,
                                 "beta1=0.8,beta2=0.99,beta3=0.999,eps=1e-6,alpha=8,t_alpha=3,t_beta3=4"}),
    [](const auto& info) { return info.param.golden + "_" + info.param.optim; });

// ---------------------------------------------------------------------------------------------------------
// Fused (one multi-tensor pass) == per tensor, bit for bit.

TEST(OptimFused, EqualsPerTensorAdamWBitForBit) {
  Params base;
  base.add("big.weight", test::randn({300, 500}, 1));  // 150000 elements: three chunks of the work list
  base.add("big.bias", test::randn({500}, 2));
  base.add("model.norm.weight", test::randn({77}, 3));
  base.add("odd.weight", test::randn({3, 1031}, 4));
  optim::OptimizerOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  for (const char* fused : {"adamw_torch_fused", "adamw_apex_fused"}) {
    Params a = base.clone(), b = base.clone();
    auto per_tensor = optim::make_optimizer("adamw_torch", a.list, o);
    auto multi = optim::make_optimizer(fused, b.list, o);
    for (int step = 0; step < 6; ++step) {
      for (size_t i = 0; i < a.list.size(); ++i) {
        if (step == 2 && i == 1) continue;  // a parameter without a gradient this step is skipped by both
        Tensor g = test::randn(a.list[i].second->shape(), 100 + 10 * step + i);
        autograd::set_grad(*a.list[i].second, g);
        autograd::set_grad(*b.list[i].second, ops::clone(g));
      }
      per_tensor->step();
      multi->step();
      per_tensor->zero_grad();
      multi->zero_grad();
    }
    for (size_t i = 0; i < a.list.size(); ++i)
      EXPECT_EQ(floats(*a.list[i].second), floats(*b.list[i].second)) << fused << " " << a.list[i].first;
    auto sa = per_tensor->state_dict(), sb = multi->state_dict();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) EXPECT_EQ(test::values(sa[i].second), test::values(sb[i].second));
  }
}

// ---------------------------------------------------------------------------------------------------------
// state_dict -> safetensors -> load_state_dict into a fresh optimizer: the continuation equals the
// uninterrupted run bit for bit.

struct ResumeCase {
  std::string optim, args;
};

class OptimResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(OptimResume, ContinuesBitExactlyAfterSaveAndLoad) {
  const ResumeCase& c = GetParam();
  Params init;
  init.add("h.0.mlp.c_fc.weight", test::randn({64, 96}, 1, DType::f32, Device::cpu(), 0.1));  // 8-bit state
  init.add("h.0.mlp.c_fc.bias", test::randn({96}, 2));
  init.add("model.embed_tokens.weight", test::randn({50, 100}, 3));
  init.add("model.layers.0.input_layernorm.weight", test::randn({7}, 4));
  optim::OptimizerOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.05;
  o.args = optim::parse_optim_args(c.args);
  o.target_modules = "all-linear";  // GaLore's
  o.linear_weights = {"h.0.mlp.c_fc.weight"};
  auto grads = [&](Params& ps, int step) {
    for (size_t i = 0; i < ps.list.size(); ++i)
      autograd::set_grad(*ps.list[i].second, test::randn(ps.list[i].second->shape(), 1000 + 17 * step + i));
  };
  Params full = init.clone();
  auto a = optim::make_optimizer(c.optim, full.list, o);
  for (int s = 0; s < 6; ++s) {
    grads(full, s);
    a->step();
  }
  Params part = init.clone();
  auto b = optim::make_optimizer(c.optim, part.list, o);
  for (int s = 0; s < 3; ++s) {
    grads(part, s);
    b->step();
  }
  const fs::path file = fs::temp_directory_path() / ("trainer_optim_" + c.optim + std::to_string(::getpid()));
  io::save_safetensors(file.string(), b->state_dict());
  b.reset();
  Params resumed = part.clone();
  auto r = optim::make_optimizer(c.optim, resumed.list, o);
  std::map<std::string, Tensor> st;
  auto f = io::SafetensorsFile::open(file.string());
  for (const auto& t : f.header().tensors) st[t.name] = ops::clone(f.load(t.name));
  fs::remove(file);
  r->load_state_dict(st);
  EXPECT_EQ(r->step_count(), 3);
  for (int s = 3; s < 6; ++s) {
    grads(resumed, s);
    r->step();
  }
  for (size_t i = 0; i < full.list.size(); ++i)
    EXPECT_EQ(floats(*full.list[i].second), floats(*resumed.list[i].second))
        << c.optim << " " << full.list[i].first;
  auto sa = a->state_dict(), sr = r->state_dict();
  ASSERT_EQ(sa.size(), sr.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sr[i].first);
    EXPECT_EQ(test::values(sa[i].second), test::values(sr[i].second)) << sa[i].first;
  }
  // A missing entry is an error that names it.
  st.erase(std::prev(st.end()));
  Params fresh_params = init.clone();  // alive while the optimizer reads the parameters' shapes
  auto fresh = optim::make_optimizer(c.optim, fresh_params.list, o);
  if (c.optim != "sgd" && c.optim != "schedule_free_sgd") {  // their one state may be absent (not made yet)
    EXPECT_NE(expect_error([&] { fresh->load_state_dict(st); }).find("missing"), std::string::npos);
  }
}

const std::vector<ResumeCase> kResumeCases{
    {"adamw_torch", ""},
    {"adamw_torch_fused", ""},
    {"adamw_apex_fused", ""},
    {"adamw_torch_xla", ""},
    {"adamw_torch_npu_fused", ""},
    {"adafactor", ""},
    {"adafactor", "beta1=0.9"},
    {"adamw_bnb_8bit", ""},
    {"adamw_8bit", ""},
    {"sgd", "momentum=0.9,nesterov=true"},
    {"sgd", "momentum=0.9,dampening=0.1"},
    {"paged_adamw_8bit", ""},
    {"paged_adamw_32bit", ""},
    {"adagrad", "lr_decay=0.1,initial_accumulator_value=0.5"},
    {"rmsprop", ""},
    {"rmsprop", "momentum=0.9"},
    {"rmsprop_bnb", ""},
    {"rmsprop_bnb_32bit", "alpha=0.9"},
    {"lion_32bit", ""},
    {"paged_lion_32bit", ""},
    {"lion_8bit", ""},
    {"paged_lion_8bit", ""},
    {"rmsprop_bnb_8bit", "alpha=0.9"},
    {"ademamix", ""},
    {"paged_ademamix_32bit", "t_alpha=3,t_beta3=4"},
    {"ademamix_8bit", "t_alpha=3,beta3=0.999"},
    {"paged_ademamix_8bit", ""},
    {"schedule_free_adamw", ""},
    {"schedule_free_radam", ""},
    {"schedule_free_sgd", "r=1"},
    {"stable_adamw", ""},
    // past a basis refresh (steps 0, 2, 4); 48 x 96: 8-bit state
    {"galore_adamw", "rank=8,update_proj_gap=2"},
    {"galore_adamw_8bit", "rank=48,update_proj_gap=2"},
    {"galore_adafactor", "rank=8,update_proj_gap=2,proj_type=full"},
    {"galore_adamw_layerwise", "rank=8,update_proj_gap=2"},
    {"galore_adamw_8bit_layerwise", "rank=48,update_proj_gap=2"},
    {"galore_adafactor_layerwise", "rank=8,proj_type=left"},
    // a random basis drawn again (its seed saved), the limiter's norm
    {"apollo_adamw", "rank=8,update_proj_gap=2"},
    {"apollo_adamw_layerwise", "rank=4,proj=svd,scale_type=tensor"},
    {"grokadamw", "gamma=0.3"},
    {"lomo", ""},
    {"adalomo", ""},
    {"adamw_anyprecision", ""},
    {"adamw_anyprecision", "use_kahan_summation=true,momentum_dtype=bfloat16,variance_dtype=bfloat16"}};

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimResume, ::testing::ValuesIn(kResumeCases), [](const auto& info) {
  return info.param.optim + (info.param.args.empty() ? "" : "_" + std::to_string(info.index));
});

TEST(OptimResume, EveryOptimizerNameIsCovered) {
  for (const auto& name : optim::optimizer_names())
    EXPECT_TRUE(std::any_of(kResumeCases.begin(), kResumeCases.end(), [&](const auto& c) {
      return c.optim == name;
    })) << name;
}

// ---------------------------------------------------------------------------------------------------------
// Names and arguments.

TEST(OptimErrors, UnknownNameSuggestsTheNearest) {
  Params ps;
  ps.add("w", test::randn({3}, 1));
  const std::string e = expect_error([&] { optim::make_optimizer("adamw_torh", ps.list, {}); });
  EXPECT_NE(e.find("--optim 'adamw_torh' is not one of adamw_torch, adamw_torch_fused"), std::string::npos)
      << e;
  EXPECT_NE(e.find("(did you mean 'adamw_torch'?)"), std::string::npos) << e;
  EXPECT_NE(
      expect_error([&] { optim::make_optimizer("adafacter", ps.list, {}); }).find("did you mean 'adafactor'"),
      std::string::npos);
  EXPECT_EQ(expect_error([&] { optim::make_optimizer("lion", ps.list, {}); }).find("did you mean"),
            std::string::npos);
}

// HF's optimizer names that are not implemented here say what they are in HF, and list what is.
TEST(OptimErrors, HfNamesNotImplementedSaySo) {
  Params ps;
  ps.add("w", test::randn({3}, 1));
  for (const char* name : {"adamw_torch_8bit", "adamw_torch_4bit"}) {
    const std::string e = expect_error([&] { optim::make_optimizer(name, ps.list, {}); });
    EXPECT_NE(e.find(fmt::format("--optim '{}' is HF's name for ", name)), std::string::npos) << e;
    EXPECT_NE(e.find("which trainer.cpp does not implement; it implements adamw_torch, "), std::string::npos)
        << e;
    EXPECT_EQ(expect_error([&] { optim::check_optimizer_name(name); }), e);
  }
  EXPECT_NE(expect_error([&] {
              optim::check_optimizer_name("adamw_torch_4bit");
            }).find("torchao's AdamW4bit (4-bit states"),
            std::string::npos);
  // the device-specific AdamWs run adamw_torch's arithmetic, and say so
  EXPECT_EQ(
      optim::unused_flags_note("adamw_torch_xla", {}),
      "--optim adamw_torch_xla is torch_xla's sync-free AdamW for TPUs; its arithmetic is adamw_torch's, "
      "which runs here");
  EXPECT_NO_THROW(optim::check_optimizer_name("paged_ademamix_8bit"));
  EXPECT_NO_THROW(optim::check_optimizer_name("schedule_free_radam"));
}

TEST(OptimErrors, OptimArgsParseAndUnknownKeysAreErrors) {
  auto m = optim::parse_optim_args("momentum=0.9,nesterov=true");
  EXPECT_EQ(m, (std::map<std::string, std::string>{{"momentum", "0.9"}, {"nesterov", "true"}}));
  EXPECT_EQ(optim::parse_optim_args(" beta1 = 0.9 ").at("beta1"), "0.9");
  EXPECT_TRUE(optim::parse_optim_args("").empty());
  for (const char* bad : {"momentum", "momentum=0.9,", "=1", "a=1,a=2", "a=1,,b=2"})
    EXPECT_THROW(optim::parse_optim_args(bad), Error) << bad;

  Params ps;
  ps.add("w", test::randn({3}, 1));
  auto with = [&](const std::string& name, const std::string& args) {
    optim::OptimizerOptions o;
    o.args = optim::parse_optim_args(args);
    return expect_error([&] { optim::make_optimizer(name, ps.list, o); });
  };
  std::string e = with("sgd", "momentun=0.9");
  EXPECT_NE(e.find("'momentun' is not an argument of sgd"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'momentum'"), std::string::npos) << e;
  EXPECT_NE(with("adamw_torch", "momentum=0.9").find("'momentum'"), std::string::npos);
  EXPECT_NE(with("adafactor", "beta2=0.9").find("'beta2'"), std::string::npos);
  EXPECT_NE(with("adamw_8bit", "block_size=128").find("'block_size'"), std::string::npos);
  EXPECT_NE(with("sgd", "momentum=fast").find("not a number"), std::string::npos);
  EXPECT_NE(with("sgd", "nesterov=yes").find("not true or false"), std::string::npos);
  EXPECT_NE(with("sgd", "momentum=0.9,dampening=0.1,nesterov=true").find("Nesterov"), std::string::npos);
  EXPECT_NE(with("adafactor", "warmup_init=true").find("relative_step"), std::string::npos);
  // The element-wise optimizers: their constructors' knobs, the ranges torch / bitsandbytes refuse.
  EXPECT_NE(with("adagrad", "lr_decay=-1").find("invalid lr_decay"), std::string::npos);
  EXPECT_NE(with("adagrad", "momentum=0.9").find("'momentum' is not an argument of adagrad"),
            std::string::npos);
  EXPECT_NE(with("rmsprop", "centered=true").find("centered=true is not implemented"), std::string::npos);
  EXPECT_NE(with("rmsprop", "momentum=-0.5").find("invalid momentum"), std::string::npos);
  EXPECT_NE(with("rmsprop_bnb", "momentum=0.9").find("no momentum term"), std::string::npos);
  EXPECT_NE(with("rmsprop_bnb_32bit", "alpha=0").find("alpha==0.0 is not supported"), std::string::npos);
  EXPECT_NE(with("lion_32bit", "eps=1e-8").find("'eps' is not an argument of lion_32bit"), std::string::npos);
  {
    optim::OptimizerOptions o;
    o.beta2 = 1.0;
    const std::string b = expect_error([&] { optim::make_optimizer("lion_32bit", ps.list, o); });
    EXPECT_NE(b.find("invalid beta parameter at index 1: 1"), std::string::npos) << b;
  }
  // AdEMAMix: HF's optim_args keys, bitsandbytes' ranges, and the logarithms of its beta3 schedule.
  EXPECT_NE(with("ademamix", "beta3=1").find("ademamix beta3=1: expected a number in [0, 1)"),
            std::string::npos);
  EXPECT_NE(with("ademamix_8bit", "t_alpha=2.5").find("t_alpha=2.5 must be a count of steps"),
            std::string::npos);
  EXPECT_NE(with("ademamix", "beta1=0,t_beta3=10").find("log(beta1) and log(beta3)"), std::string::npos);
  EXPECT_NE(with("ademamix", "eps=-1").find("eps=-1: expected a number >= 0"), std::string::npos);
  EXPECT_NE(with("paged_ademamix_8bit", "beta4=0.5").find("'beta4' is not an argument of ademamix"),
            std::string::npos);
  // StableAdamW: HF's three optim_args keys (true/false spelled out, where HF's bool() takes any text as
  // true)
  EXPECT_NE(
      with("stable_adamw", "foreach=true")
          .find("'foreach' is not an argument of stable_adamw (it takes decouple_lr, max_lr, kahan_sum)"),
      std::string::npos);
  EXPECT_NE(with("stable_adamw", "decouple_lr=yes").find("decouple_lr='yes' is not true or false"),
            std::string::npos);
  EXPECT_NE(with("stable_adamw", "decouple_lr=true,max_lr=0").find("invalid maximum learning rate: max_lr=0"),
            std::string::npos);
}

// Lion steps every element by exactly lr (the sign of the interpolated momentum), after the decoupled decay;
// RMSprop's momentum buffer and Adagrad's sums are made as torch makes them.
TEST(OptimElementwise, LionStepsBySignAndStateIsMadeAsTorchMakesIt) {
  Params ps;
  ps.add("h.0.mlp.c_fc.weight", test::randn({5, 7}, 3));
  ps.add("h.0.mlp.c_fc.bias", test::randn({7}, 4));
  optim::OptimizerOptions o;
  o.lr = 0.25;  // exact steps in f32
  o.weight_decay = 0.5;
  const Params before = ps.clone();
  auto lion = optim::make_optimizer("lion_32bit", ps.list, o);
  EXPECT_EQ(lion->state_dict().size(), 1u);  // "step" only: bitsandbytes makes state1 at the first step
  const Tensor g = test::randn({5, 7}, 9), gb = test::randn({7}, 10);
  autograd::set_grad(*ps.list[0].second, ops::clone(g));
  autograd::set_grad(*ps.list[1].second, ops::clone(gb));
  lion->step();
  const auto w0 = floats(*before.list[0].second), w1 = floats(*ps.list[0].second), gv = floats(g);
  for (size_t i = 0; i < w0.size(); ++i) {    // first step: sign((1 - beta1) * g); decay 1 - 0.25 * 0.5
    volatile float decayed = w0[i] * 0.875f;  // volatile: rounded before the subtraction, as the kernel
    EXPECT_EQ(w1[i], decayed - 0.25f * static_cast<float>((gv[i] > 0) - (gv[i] < 0))) << i;
  }
  const auto b0 = floats(*before.list[1].second), b1 = floats(*ps.list[1].second), gbv = floats(gb);
  for (size_t i = 0; i < b0.size(); ++i)  // a bias: no decay (HF's groups)
    EXPECT_EQ(b1[i], b0[i] - 0.25f * static_cast<float>((gbv[i] > 0) - (gbv[i] < 0))) << i;
  const auto st = lion->state_dict();
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[1].first, "state1.h.0.mlp.c_fc.weight");
  const auto m = floats(st[1].second);
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i], gv[i] * (1.0f - 0.999f)) << i;  // beta2 = adam_beta2

  o.args = {{"momentum", "0.9"}};
  auto rms = optim::make_optimizer("rmsprop", ps.list, o);
  EXPECT_EQ(rms->state_dict().size(), 1u);
  autograd::set_grad(*ps.list[1].second, ops::clone(gb));  // only the bias has a gradient
  autograd::zero_grad(*ps.list[0].second);
  rms->step();
  std::vector<std::string> keys;
  for (const auto& [k, t] : rms->state_dict()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"step", "square_avg.h.0.mlp.c_fc.bias",
                                            "momentum_buffer.h.0.mlp.c_fc.bias"}));
  o.args = {{"initial_accumulator_value", "0.5"}};
  auto ada = optim::make_optimizer("adagrad", ps.list, o);
  const auto sums = ada->state_dict();
  ASSERT_EQ(sums.size(), 3u);  // made in the constructor, as torch.optim.Adagrad
  EXPECT_EQ(floats(sums[1].second), std::vector<float>(35, 0.5f));
}

TEST(OptimErrors, AGradientOfAnotherDtypeOrShapeIsAnError) {
  for (const auto& name : optim::optimizer_names()) {
    Params ps;
    ps.add("w", test::randn({4, 3}, 1));
    optim::OptimizerOptions o;
    o.target_modules = "all-linear";  // GaLore's
    o.linear_weights = {"w"};
    auto opt = optim::make_optimizer(name, ps.list, o);
    autograd::set_grad(*ps.list[0].second, test::randn({4, 3}, 2, DType::f64));
    EXPECT_NE(expect_error([&] { opt->step(); }).find("the gradient of 'w'"), std::string::npos) << name;
  }
}

// SGD updates in place on every backend (ops::sgd): once its momentum buffers exist a step allocates nothing
// - on the CPU, and on the meta device, where `trainer estimate` counts what a run allocates (the GPU's old
// tensor-op formulation made three temporaries per parameter there and on the GPU).
TEST(OptimSgd, StepsInPlaceOnEveryDevice) {
  for (const Device dev : {Device::cpu(), Device::meta(), Device::meta(3)}) {
    for (const char* args : {"momentum=0.9,nesterov=true", ""}) {
      Params ps;
      ps.add("h.0.mlp.c_fc.weight", ops::zeros({300, 200}, DType::f32, dev));
      ps.add("h.0.ln_1.bias", ops::zeros({200}, DType::f32, dev));
      optim::OptimizerOptions o;
      o.lr = 0.1;
      o.weight_decay = 0.01;
      o.args = optim::parse_optim_args(args);
      auto opt = optim::make_optimizer("sgd", ps.list, o);
      for (auto& [name, p] : ps.list) autograd::set_grad(*p, ops::zeros(p->shape(), DType::f32, dev));
      Allocator& alloc = ops::allocator_for(dev);
      opt->step();  // makes the momentum buffers
      alloc.reset_peak();
      const int64_t held = alloc.stats().current_bytes;
      opt->step();
      opt->step();
      EXPECT_EQ(alloc.stats().peak_bytes, held) << dev.str() << " " << args;
      EXPECT_EQ(opt->state_bytes(), 8 + (*args ? 4 * (300 * 200 + 200) : 0)) << dev.str() << " " << args;
    }
  }
}

// Half gradients are widened a group of parameters at a time (Optimizer::step with gradients): three 8 MiB
// fp32 parameters with bf16 gradients hold at most the 16 MiB group bound of f32 copies at once (the whole
// model's, 24 MiB, before), and two grouped steps equal two steps over f32 gradients of the same values bit
// for bit (the step count advances once a step: the bias corrections see it).
TEST(OptimGroups, HalfGradientsWidenAGroupAtATime) {
  const Shape shape{1024, 2048};  // 2M elements: 8 MiB in f32
  for (const std::string name : {"sgd", "adafactor", "adamw_bnb_8bit"}) {
    SCOPED_TRACE(name);
    Params grouped;
    for (int i = 0; i < 3; ++i)
      grouped.add("h." + std::to_string(i) + ".w", test::randn(shape, 10 + i, DType::f32));
    Params whole = grouped.clone();
    optim::OptimizerOptions o;
    o.lr = 0.01;
    o.weight_decay = 0.1;
    auto a = optim::make_optimizer(name, grouped.list, o), b = optim::make_optimizer(name, whole.list, o);
    Allocator& alloc = ops::allocator_for(Device::cpu());
    for (int step = 0; step < 2; ++step) {
      std::vector<Tensor> half;
      for (int i = 0; i < 3; ++i) half.push_back(test::randn(shape, 100 * step + i, DType::bf16));
      const int64_t held = alloc.stats().current_bytes;
      alloc.reset_peak();
      a->step(half, {}, {});
      const int64_t extra = alloc.stats().peak_bytes - held;
      EXPECT_GE(extra, int64_t{8} << 20);   // a copy was made...
      EXPECT_LE(extra, int64_t{16} << 20);  // ... a group's at most
      for (int i = 0; i < 3; ++i)
        autograd::set_grad(*whole.list[i].second, ops::to_dtype(half[i], DType::f32));
      b->step();
    }
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(ops::to_vector<float>(*grouped.list[i].second), ops::to_vector<float>(*whole.list[i].second))
          << grouped.list[i].first;
    EXPECT_EQ(a->step_count(), 2);
  }
}

TEST(OptimErrors, DecayGroupsFollowHuggingFace) {
  EXPECT_TRUE(optim::Optimizer::decays("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(optim::Optimizer::decays("transformer.wte.weight"));  // embeddings decay
  EXPECT_FALSE(optim::Optimizer::decays("h.0.attn.c_attn.bias"));
  EXPECT_FALSE(optim::Optimizer::decays("transformer.h.0.ln_1.weight"));
  EXPECT_FALSE(optim::Optimizer::decays("model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(optim::Optimizer::decays("model.norm.weight"));
}

// DeepSpeed's optimizer (a --deepspeed config's "optimizer") gets all parameters in one group: a bias and a
// norm weight decay too. With zero gradients AdamW's update is the decay alone: p * (1 - lr * wd).
TEST(OptimErrors, DecayAllIsOneGroupAsDeepSpeedsOptimizer) {
  for (const bool all : {false, true}) {
    Params ps;
    ps.add("h.0.mlp.c_fc.weight", ops::full({4}, 2.0));
    ps.add("h.0.mlp.c_fc.bias", ops::full({4}, 2.0));
    ps.add("h.0.ln_1.weight", ops::full({4}, 2.0));
    optim::OptimizerOptions o;
    o.lr = 0.1;
    o.weight_decay = 0.5;
    o.decay_all = all;
    auto opt = optim::make_optimizer("adamw_torch", ps.list, o);
    for (auto& [name, p] : ps.list) autograd::set_grad(*p, ops::zeros(p->shape(), DType::f32, p->device()));
    opt->step();
    const float decayed = 2.0f * (1.0f - 0.1f * 0.5f);
    EXPECT_EQ(floats(*ps.list[0].second)[0], decayed);
    EXPECT_EQ(floats(*ps.list[1].second)[0], all ? decayed : 2.0f);
    EXPECT_EQ(floats(*ps.list[2].second)[0], all ? decayed : 2.0f);
  }
}

}  // namespace
}  // namespace tr
