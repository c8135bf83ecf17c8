// GrokAdamW (optim/grokadamw.h) against a transcription of grokadamw's published step in torch
// (tools/make_optim_golden.py's GROK_CONFIGS), its per-parameter indices and steps, and its checks.
#include <cmath>

#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "optim_test_util.h"
#include "test_util.h"

namespace tr {
namespace {

using optim_test::expect_error;
using optim_test::floats;
using optim_test::Params;

const std::vector<std::string> kNames{"h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.ln_1.weight",
                                      "conv.weight"};

// 5 steps on the golden's gradients under HF's decay groups (the decay group first: its parameters' first
// moments decay by beta1 * (1 - gamma)^i in that order). Without the clip, torch's bits; with it, the norm
// is summed in f64 here and in f32 by torch, so the clip coefficient may differ in its last bit.
TEST(GrokAdamWGolden, FiveStepsGivePublishedValues) {
  auto f = io::SafetensorsFile::open(std::string(TRAINER_GOLDEN_DIR) + "/optim/optim_golden.safetensors");
  struct Case {
    std::string golden, args;
    double weight_decay;
    bool exact;
  };
  for (const Case& c :
       {Case{"grokadamw", "", 0.1, false},
        Case{"grokadamw_noclip", "alpha_init=0.9,lamb=5,gamma=0.3,gradient_clipping=0", 0.01, true}}) {
    Params ps;
    for (const auto& n : kNames) ps.add(n, f.load("init." + n));
    optim::OptimizerOptions o;
    o.lr = 1e-2;
    o.weight_decay = c.weight_decay;
    o.args = optim::parse_optim_args(c.args);
    auto opt = optim::make_optimizer("grokadamw", ps.list, o);
    for (int k = 0; k < 5; ++k) {
      for (size_t i = 0; i < kNames.size(); ++i)
        autograd::set_grad(*ps.list[i].second,
                           ops::clone(f.load("grad" + std::to_string(k + 1) + "." + kNames[i])));
      opt->step();
    }
    for (size_t i = 0; i < kNames.size(); ++i) {
      const auto got = floats(*ps.list[i].second), want = floats(f.load(c.golden + "." + kNames[i]));
      if (c.exact) {
        EXPECT_EQ(got, want) << c.golden << " " << kNames[i];
        continue;
      }
      ASSERT_EQ(got.size(), want.size());
      for (size_t j = 0; j < got.size(); ++j)
        EXPECT_NEAR(got[j], want[j], 1e-6 * std::max(1.0f, std::abs(want[j])))
            << c.golden << " " << kNames[i];
    }
  }
}

TEST(GrokAdamWErrors, ArgumentsStateAndNotes) {
  Params ps;
  ps.add("h.0.mlp.c_fc.weight", test::randn({6, 4}, 1));
  const auto with = [&](const std::string& args) {
    optim::OptimizerOptions o;
    o.args = optim::parse_optim_args(args);
    return expect_error([&] { optim::make_optimizer("grokadamw", ps.list, o); });
  };
  EXPECT_NE(with("alpha_init=1.5").find("grokadamw alpha_init=1.5 must be in [0, 1]"), std::string::npos);
  EXPECT_NE(with("gamma=-0.1").find("grokadamw gamma=-0.1 must be in [0, 1]"), std::string::npos);
  EXPECT_NE(with("betas=0.9")
                .find("'betas' is not an argument of grokadamw (it takes alpha_init, lamb, gamma, "
                      "grokking_signal_decay_rate, gradient_clipping)"),
            std::string::npos);
  optim::OptimizerOptions o;
  o.beta2 = 0.95;
  EXPECT_EQ(
      optim::unused_flags_note("grokadamw", o),
      "--optim grokadamw: HF builds GrokAdamW without the Adam flags, so --adam_beta2 0.95 (it uses 0.999) "
      "is not used");
  EXPECT_EQ(optim::unused_flags_note("adamw_torch", o), "");
  auto opt = optim::make_optimizer("grokadamw", ps.list, {});
  autograd::set_grad(*ps.list[0].second, test::randn({6, 4}, 2));
  opt->step();
  std::map<std::string, Tensor> st;
  for (const auto& [k, t] : opt->state_dict()) st[k] = ops::clone(t);
  EXPECT_EQ(st.at("step.h.0.mlp.c_fc.weight").item(), 1.0);
  st.erase("step.h.0.mlp.c_fc.weight");
  EXPECT_NE(expect_error([&] { opt->load_state_dict(st); }).find("missing 'step.h.0.mlp.c_fc.weight'"),
            std::string::npos);
}

}  // namespace
}  // namespace tr
