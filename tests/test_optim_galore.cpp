// GaLore (optim/galore.h): galore_torch's GaLoreAdamW, GaLoreAdafactor and GaLoreAdamW8bit against a
// transcription in torch (tools/make_galore_golden.py), HF's target matching, the SVD op, resume, the checks,
// and the Trainer (a resumed run equal to the uninterrupted one).
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "optim/galore.h"
#include "optim/optimizer.h"
#include "optim_test_util.h"
#include "test_util.h"
#include "train/trainer.h"
#include "train_scratch.h"

namespace tr {
namespace {

namespace fs = std::filesystem;
using optim_test::expect_error;
using optim_test::floats;
using optim_test::Params;

const std::vector<std::string> kNames{"h.0.attn.c_attn.weight", "h.0.mlp.c_fc.weight", "wte.weight",
                                      "h.0.attn.c_attn.bias", "h.0.ln_1.weight"};
// The linear layers a model would report: the embedding is 2-D but not one.
const std::vector<std::string> kLinear{"h.0.attn.c_attn.weight", "h.0.mlp.c_fc.weight"};

struct GoldenCase {
  std::string golden, optim, targets, args;
  double tolerance = 2e-6;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // HF's --adam_* (APOLLO's targets take them)
};

class GaloreGolden : public ::testing::TestWithParam<GoldenCase> {};

// 5 steps on the golden's gradients. The projected weights agree to float rounding, not bit for bit: the
// projections are GEMMs (oneDNN here, OpenBLAS under torch) and the inner step runs on the low-rank update
// instead of scaling it after the projection; the SVD is the same LAPACK's.
TEST_P(GaloreGolden, FiveStepsGiveGaloreTorchsValues) {
  const GoldenCase& c = GetParam();
  auto f = io::SafetensorsFile::open(std::string(TRAINER_GOLDEN_DIR) + "/optim/galore_golden.safetensors");
  Params ps;
  for (const auto& n : kNames) ps.add(n, f.load("init." + n));
  optim::OptimizerOptions o;
  o.lr = 1e-2;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  o.target_modules = c.targets;
  o.linear_weights = kLinear;
  o.args = optim::parse_optim_args(c.args);
  auto opt = optim::make_optimizer(c.optim, ps.list, o);
  EXPECT_EQ(static_cast<optim::GaLore&>(*opt).projected(), kLinear) << c.golden;
  for (int k = 0; k < 5; ++k) {
    for (size_t i = 0; i < kNames.size(); ++i)
      autograd::set_grad(*ps.list[i].second,
                         ops::clone(f.load("grad" + std::to_string(k + 1) + "." + kNames[i])));
    opt->step();
  }
  EXPECT_EQ(opt->step_count(), 5);
  for (size_t i = 0; i < kNames.size(); ++i) {
    const std::vector<float> got = floats(*ps.list[i].second),
                             want = floats(f.load(c.golden + "." + kNames[i])),
                             init = floats(f.load("init." + kNames[i]));
    ASSERT_EQ(got.size(), want.size());
    double worst = 0, moved = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      worst = std::max(worst, std::abs(double(got[j]) - want[j]));
      moved = std::max(moved, std::abs(double(want[j]) - init[j]));
    }
    EXPECT_GT(moved, 1e-3) << c.golden << " " << kNames[i];  // the optimizer moved it
    EXPECT_LT(worst, c.tolerance) << c.golden << " " << kNames[i];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, GaloreGolden,
    ::testing::Values(
        GoldenCase{"galore_adamw", "galore_adamw", ".*\\.(attn|mlp)\\..*", "rank=3,update_proj_gap=2"},
        // full: at a refresh U^T G V is diagonal up to rounding, and Adam's first step normalizes that
        // rounding's off-diagonal noise to unit size - GEMMs that round differently move the result more
        GoldenCase{"galore_adamw_full", "galore_adamw", "all-linear",
                   "rank=3,update_proj_gap=3,proj_type=full", 1e-5},
        // a JSON list: names matched as substrings
        GoldenCase{"galore_adamw_reverse", "galore_adamw", "[\"c_attn\", \"c_fc\"]",
                   "rank=2,update_proj_gap=1,scale=1,proj_type=reverse_std"},
        GoldenCase{"galore_adafactor", "galore_adafactor", "all_linear", "rank=3,update_proj_gap=2"},
        // tensors below min_8bit_size: bitsandbytes' 32-bit kernel, weight decay 0.01 on every parameter
        GoldenCase{"galore_adamw_8bit", "galore_adamw_8bit", "all-linear", "rank=3,update_proj_gap=2"},
        // APOLLO: torch's CPU generator's Gaussian bases (rank 3 of 6 and of 4 columns), channel factors, the
        // limiter from the second step; then a per-tensor factor on the other sides with rank 8 (above
        // either side) and HF's betas/eps; then GaLore's SVD basis, refreshed every step
        GoldenCase{"apollo_adamw", "apollo_adamw", "all-linear", "rank=3,update_proj_gap=2", 1e-5},
        GoldenCase{"apollo_adamw_tensor", "apollo_adamw", "all-linear",
                   "rank=8,update_proj_gap=3,scale=4,scale_type=tensor,proj_type=reverse_std", 1e-5, 0.8,
                   0.99, 1e-6},
        GoldenCase{"apollo_adamw_svd", "apollo_adamw", "all-linear", "rank=3,update_proj_gap=1,proj=svd",
                   1e-5}),
    [](const auto& info) { return info.param.golden; });

double max_diff(const Tensor& a, const Tensor& b) {
  const auto x = ops::to_vector<double>(a), y = ops::to_vector<double>(b);
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

TEST(GaloreSvd, ThinFactorsReconstructTheMatrix) {
  for (const auto& shape : {Shape{7, 5}, Shape{5, 7}, Shape{6, 6}}) {
    for (DType dt : {DType::f32, DType::f64}) {
      const Tensor a = test::randn(shape, 11, dt);
      const ops::Svd d = ops::svd(a);
      const int64_t k = std::min(shape[0], shape[1]);
      ASSERT_EQ(d.u.shape(), (Shape{shape[0], k}));
      ASSERT_EQ(d.s.shape(), (Shape{k}));
      ASSERT_EQ(d.vh.shape(), (Shape{k, shape[1]}));
      const auto s = ops::to_vector<double>(d.s);
      for (int64_t i = 1; i < k; ++i) EXPECT_GE(s[i - 1], s[i]);
      // u diag(s) vh == a; u^T u == I
      const Tensor us = ops::binary(ops::BinaryOp::mul, d.u, ops::unsqueeze(d.s, 0));
      const double tol = dt == DType::f64 ? 1e-12 : 2e-5;
      EXPECT_LT(max_diff(ops::matmul(us, d.vh), a), tol);
      std::vector<double> eye(static_cast<size_t>(k * k), 0.0);
      for (int64_t i = 0; i < k; ++i) eye[static_cast<size_t>(i * k + i)] = 1.0;
      EXPECT_LT(max_diff(ops::matmul(d.u, d.u, true, false), ops::from_vector<double>(eye, {k, k})), tol);
    }
  }
  EXPECT_NE(test::error_of([] { ops::svd(ops::zeros({3}, DType::f32)); }).find("expected a 2-D f32 or f64"),
            std::string::npos);
}

Params model_params() {
  Params p;
  p.add("model.layers.0.self_attn.q_proj.weight", test::randn({12, 12}, 1, DType::f32, Device::cpu(), 0.1));
  p.add("model.layers.0.mlp.up_proj.weight", test::randn({20, 12}, 2, DType::f32, Device::cpu(), 0.1));
  p.add("model.layers.0.mlp.down_proj.weight", test::randn({12, 20}, 3, DType::f32, Device::cpu(), 0.1));
  p.add("model.embed_tokens.weight", test::randn({30, 12}, 4, DType::f32, Device::cpu(), 0.1));
  p.add("model.norm.weight", test::randn({12}, 5));
  return p;
}

optim::OptimizerOptions model_options(const std::string& targets, const std::string& args = "") {
  optim::OptimizerOptions o;
  o.lr = 1e-2;
  o.target_modules = targets;
  o.linear_weights = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight",
                      "model.layers.0.mlp.down_proj.weight"};
  o.args = optim::parse_optim_args(args);
  return o;
}

void set_grads(Params& ps, int step) {
  for (size_t i = 0; i < ps.list.size(); ++i)
    autograd::set_grad(*ps.list[i].second, test::randn(ps.list[i].second->shape(), 1000 + 17 * step + i));
}

// HF's check_target_module_exists: a string is a whole-name regex; a list entry matches exactly, as a
// substring, or as a whole-name regex. Only linear layers are candidates.
TEST(GaloreTargets, MatchAsHfDoes) {
  Params ps = model_params();
  const auto projected = [&](const std::string& targets) {
    auto opt = optim::make_optimizer("galore_adamw", ps.list, model_options(targets));
    return static_cast<optim::GaLore&>(*opt).projected().size();
  };
  EXPECT_EQ(projected("all-linear"), 3u);
  EXPECT_EQ(projected(".*mlp.*"), 2u);
  EXPECT_EQ(projected("model.layers.0.self_attn.q_proj"), 1u);
  EXPECT_EQ(projected("[\"q_proj\"]"), 1u);                                    // substring
  EXPECT_EQ(projected("[\"model.layers.0.mlp.up_proj\", \".*down.*\"]"), 2u);  // exact, regex
  EXPECT_EQ(projected("[\"layers\"]"), 3u);  // the norm and the embedding match too, but are not linear
  const auto error = [&](const std::string& targets, const std::string& args = "") {
    return expect_error(
        [&] { optim::make_optimizer("galore_adamw", ps.list, model_options(targets, args)); });
  };
  EXPECT_NE(error("").find("--optim galore_adamw needs --optim_target_modules"), std::string::npos);
  EXPECT_NE(error("mlp").find("no linear layer matches --optim_target_modules 'mlp'"), std::string::npos);
  EXPECT_NE(error(".*embed.*").find("no linear layer matches"), std::string::npos);
  EXPECT_NE(error("(").find("'(' is not a valid regular expression"), std::string::npos);
  EXPECT_NE(error("[\"q\", 3]").find("3 is not a string"), std::string::npos);
  EXPECT_NE(error("[oops").find("not a JSON list of strings"), std::string::npos);
  EXPECT_NE(error(std::string(1001, '(')).find("a pattern of 1001 characters (at most 1000)"),
            std::string::npos);
  EXPECT_NE(error("all-linear", "proj_type=diag").find("proj_type='diag' is not one of std, reverse_std"),
            std::string::npos);
  EXPECT_NE(error("all-linear", "rank=0").find("rank=0 must be at least 1"), std::string::npos);
  EXPECT_NE(error("all-linear", "update_proj_gap=0").find("update_proj_gap=0 must be at least 1"),
            std::string::npos);
  EXPECT_NE(error("all-linear", "betas=0.9")
                .find("'betas' is not an argument of galore_adamw (it takes rank, update_proj_gap, scale, "
                      "proj_type)"),
            std::string::npos);
  // Over no parameters (the flags' early check) the targets are not matched, but must be given.
  auto none = optim::make_optimizer("galore_adafactor", {}, model_options("nothing-matches"));
  EXPECT_EQ(none->step_count(), 0);
}

// A checkpoint between basis refreshes continues bit for bit: the bases are state.
TEST(GaloreResume, ContinuesBitExactly) {
  for (const char* name : {"galore_adamw", "galore_adamw_8bit", "galore_adafactor"}) {
    for (const char* proj : {"std", "full"}) {
      const auto o = model_options("all-linear", std::string("rank=4,update_proj_gap=3,proj_type=") + proj);
      const Params init = model_params();
      Params full = init.clone(), part = init.clone();
      auto a = optim::make_optimizer(name, full.list, o), b = optim::make_optimizer(name, part.list, o);
      for (int s = 0; s < 7; ++s) {
        set_grads(full, s);
        a->step();
      }
      for (int s = 0; s < 4; ++s) {
        set_grads(part, s);
        b->step();
      }
      std::map<std::string, Tensor> st;
      for (const auto& [k, t] : b->state_dict()) st[k] = ops::clone(t);
      EXPECT_EQ(st.count(std::string("galore_ortho.") + "model.layers.0.mlp.up_proj.weight"), 1u);
      Params resumed = part.clone();
      auto r = optim::make_optimizer(name, resumed.list, o);
      r->load_state_dict(st);
      EXPECT_EQ(r->step_count(), 4);
      for (int s = 4; s < 7; ++s) {
        set_grads(resumed, s);
        r->step();
      }
      for (size_t i = 0; i < full.list.size(); ++i)
        EXPECT_EQ(floats(*full.list[i].second), floats(*resumed.list[i].second))
            << name << " " << proj << " " << full.list[i].first;
      auto bad = st;
      bad.erase("galore_ortho.model.layers.0.mlp.up_proj.weight");
      EXPECT_NE(
          expect_error([&] { r->load_state_dict(bad); }).find("galore_ortho.model.layers.0.mlp.up_proj"),
          std::string::npos);
    }
  }
}

// The low-rank state is what GaLore saves memory on: rank 4 of 12x12, 20x12 and 12x20 matrices.
TEST(GaloreState, LivesAtLowRank) {
  Params ps = model_params();
  auto opt = optim::make_optimizer("galore_adamw", ps.list, model_options("all-linear", "rank=4"));
  std::map<std::string, Tensor> st;
  for (const auto& [k, t] : opt->state_dict()) st[k] = t;
  EXPECT_EQ(st.at("exp_avg.model.layers.0.self_attn.q_proj.weight").shape(), (Shape{12, 4}));
  EXPECT_EQ(st.at("exp_avg.model.layers.0.mlp.up_proj.weight").shape(), (Shape{20, 4}));    // tall: right
  EXPECT_EQ(st.at("exp_avg.model.layers.0.mlp.down_proj.weight").shape(), (Shape{4, 20}));  // wide: left
  EXPECT_EQ(st.at("galore_ortho.model.layers.0.mlp.down_proj.weight").shape(), (Shape{12, 4}));  // U[:, :4]
  EXPECT_EQ(st.at("exp_avg.model.embed_tokens.weight").shape(), (Shape{30, 12}));
  const std::string note = optim::GaLore::unused_flags_note("galore_adamw", [] {
    optim::OptimizerOptions o;
    o.weight_decay = 0.1;
    o.beta2 = 0.95;
    return o;
  }());
  EXPECT_NE(note.find("--adam_beta2 0.95 (it uses 0.999), --weight_decay 0.1 (it uses none) are not used"),
            std::string::npos)
      << note;
  EXPECT_EQ(optim::GaLore::unused_flags_note("galore_adamw", {}), "");
  // A non-finite gradient at a refresh is an error naming the weight (torch's SVD fails there too).
  set_grads(ps, 0);
  Tensor& q = *ps.list[0].second;
  autograd::set_grad(q, ops::full(q.shape(), std::nan(""), DType::f32));
  EXPECT_NE(
      expect_error([&] { opt->step(); })
          .find("GaLore: the projection of 'model.layers.0.self_attn.q_proj.weight' at step 1: svd: the "
                "[12, 12] matrix holds a NaN or an infinity"),
      std::string::npos);
}

// The Trainer: GPT-2's Conv1D layers count as linear (HF's GaLore takes nn.Linear only and finds none in
// GPT-2), the loss falls, and a run resumed after a crash takes the uninterrupted run's steps bit for bit.
TEST(TrainerGalore, TrainsAndResumesExactly) {
  Scratch s("trainer_galore");
  auto a = s.args("run");
  a.optim = "galore_adamw";
  a.optim_target_modules = ".*\\.(attn|mlp)\\..*";
  a.optim_args = "rank=4,update_proj_gap=3";
  a.learning_rate = 1e-2;
  a.max_steps = 6;
  a.save_steps = 2;
  const auto full = train::train(a);
  ASSERT_EQ(full.losses.size(), 6u);
  EXPECT_LT(full.losses.back(), full.losses.front());
  auto st =
      io::SafetensorsFile::open((fs::path(a.output_dir) / "checkpoint-2" / "optimizer.safetensors").string());
  EXPECT_EQ(st.load("galore_ortho.transformer.h.0.attn.c_attn.weight").dim(), 2);
  auto b = a;
  b.output_dir = (s.dir / "crashed").string();
  const train::TrainHooks hooks = crash_at_save(2);  // checkpoint-4 dies after its optimizer
  EXPECT_THROW(train::train(b, hooks), std::runtime_error);
  b.resume_from_checkpoint = "true";
  const auto resumed = train::train(b);
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed.losses[i], full.losses[2 + i]) << i;
  // HF's list form in an arguments file, kept as a list in training_args.json
  train::TrainingArguments l;
  l.update_from_json({{"optim_target_modules", {"c_attn", "c_fc"}}}, "args.json");
  EXPECT_EQ(l.optim_target_modules, "[\"c_attn\",\"c_fc\"]");
  EXPECT_EQ(l.to_json()["optim_target_modules"], nlohmann::json({"c_attn", "c_fc"}));
  EXPECT_TRUE(train::TrainingArguments().to_json()["optim_target_modules"].is_null());
  train::TrainingArguments n;  // a JSON text that is not a list of strings is written back as the text
  n.optim_target_modules = "[1, 2]";
  EXPECT_EQ(n.to_json()["optim_target_modules"], "[1, 2]");
  auto c = a;
  c.output_dir = (s.dir / "no_targets").string();
  c.optim_target_modules = "lm_head";
  EXPECT_NE(test::error_of([&] { train::train(c); }).find("no linear layer matches --optim_target_modules"),
            std::string::npos);
}

// APOLLO's arguments and state: channel factors need the std side, a random basis is not "full", the seeds
// (the other parameters numbered first; 1 for every layer-wise weight) advance through apollo_torch's
// next_seed at each refresh and are saved.
TEST(ApolloArgs, ChecksSeedsAndState) {
  Params ps;
  ps.add("wte.weight", test::randn({10, 6}, 1));
  ps.add("h.0.mlp.c_fc.weight", test::randn({4, 10}, 2));
  ps.add("h.0.attn.c_attn.weight", test::randn({8, 6}, 3));
  optim::OptimizerOptions o;
  o.target_modules = "all-linear";
  o.linear_weights = kLinear;
  const auto with = [&](const std::string& args, const char* name = "apollo_adamw") {
    o.args = optim::parse_optim_args(args);
    return expect_error([&] { optim::make_optimizer(name, ps.list, o); });
  };
  EXPECT_NE(with("proj_type=reverse_std")
                .find("apollo_adamw scale_type=channel with proj_type right: the channel "
                      "factors of 'h.0.mlp.c_fc.weight' (4 x 10) need the projection on "
                      "its left side"),
            std::string::npos);
  EXPECT_NE(with("proj_type=full").find("full takes proj=svd with scale_type=tensor"), std::string::npos);
  EXPECT_NE(with("proj=qr").find("apollo_adamw proj='qr' is not one of random, svd"), std::string::npos);
  EXPECT_NE(with("scale_type=row").find("scale_type='row' is not one of channel, tensor"), std::string::npos);
  EXPECT_NE(with("scale=-1").find("APOLLO takes its square root"), std::string::npos);
  o.args = optim::parse_optim_args("rank=2,update_proj_gap=1");
  auto seeds = [&](const char* name) {
    auto opt = optim::make_optimizer(name, ps.list, o);
    std::vector<int64_t> out;
    for (int k = 0; k < 2; ++k) {
      for (auto& [n, p] : ps.list) autograd::set_grad(*p, test::randn(p->shape(), 50 + k));
      opt->step();
      for (const auto& [key, t] : opt->state_dict())
        if (key.starts_with("apollo_seed.")) out.push_back(ops::to_vector<int64_t>(t)[0]);
    }
    return out;
  };
  // the seeds after one and two refreshes: next_seed(2) and next_seed(next_seed(2)) for c_fc (the second
  // parameter numbered after the one other), as torch.randint draws them
  const auto whole = seeds("apollo_adamw"), layerwise = seeds("apollo_adamw_layerwise");
  ASSERT_EQ(whole.size(), 4u);
  EXPECT_EQ(whole[0], 3402314949991714867);  // next_seed(2)
  EXPECT_EQ(whole[2], 9110370213325666520);  // next_seed(next_seed(2))
  EXPECT_NE(whole[0], whole[1]);
  EXPECT_EQ(layerwise[0], 505211975917066638);  // next_seed(1), both weights
  EXPECT_EQ(layerwise[1], layerwise[0]);
  optim::OptimizerOptions w;
  w.weight_decay = 0.1;
  w.beta2 = 0.95;
  EXPECT_EQ(
      optim::unused_flags_note("apollo_adamw", w),
      "--optim apollo_adamw: HF builds apollo_torch's optimizer with the learning rate and the --adam_* "
      "values alone, so --weight_decay 0.1 (it uses none) is not used");
}

}  // namespace
}  // namespace tr
