// The schedule-free optimizers (optim/schedule_free.h): schedulefree's AdamW, RAdam and SGD steps and their
// train/eval switch bit for bit against tools/make_optim_golden.py, resume in either mode, the checks, and
// the Trainer: x evaluated and saved, y trained at, a resumed run equal to the uninterrupted one.
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
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

const std::vector<std::string> kNames{"h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.ln_1.weight",
                                      "conv.weight"};

struct GoldenCase {
  std::string golden, optim;
  double lr, weight_decay, beta1, beta2, eps;
  int64_t warmup;
  std::string args;
};

class ScheduleFreeGolden : public ::testing::TestWithParam<GoldenCase> {};

// The golden's protocol (make_optim_golden.py's SF_*): 8 steps on the 5 gradients in turn at the scheduler's
// rate lr * (1 - 0.05 k), train mode before each, an evaluation after step 3, eval mode at the end.
TEST_P(ScheduleFreeGolden, StepsAndSwitchesGiveSchedulefreesBits) {
  const GoldenCase& c = GetParam();
  auto f = io::SafetensorsFile::open(std::string(TRAINER_GOLDEN_DIR) + "/optim/optim_golden.safetensors");
  Params ps;
  for (const auto& n : kNames) ps.add(n, f.load("init." + n));
  optim::OptimizerOptions o;
  o.lr = c.lr;
  o.weight_decay = c.weight_decay;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  o.warmup_steps = c.warmup;
  o.args = optim::parse_optim_args(c.args);
  auto opt = optim::make_optimizer(c.optim, ps.list, o);
  for (int k = 0; k < 8; ++k) {
    opt->set_train_mode(true, {});
    opt->set_lr(c.lr * (1.0 - 0.05 * k));
    for (size_t i = 0; i < kNames.size(); ++i)
      autograd::set_grad(*ps.list[i].second,
                         ops::clone(f.load("grad" + std::to_string(k % 5 + 1) + "." + kNames[i])));
    opt->step();
    if (k + 1 == 3) {
      opt->set_train_mode(false, {});
      EXPECT_FALSE(opt->train_mode());
    }
  }
  EXPECT_EQ(opt->step_count(), 8);
  for (size_t i = 0; i < kNames.size(); ++i)
    EXPECT_EQ(floats(*ps.list[i].second), floats(f.load(c.golden + ".y." + kNames[i])))
        << c.optim << ": y of " << kNames[i];
  opt->set_train_mode(false, {});
  for (size_t i = 0; i < kNames.size(); ++i)
    EXPECT_EQ(floats(*ps.list[i].second), floats(f.load(c.golden + "." + kNames[i])))
        << c.optim << ": x of " << kNames[i];
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ScheduleFreeGolden,
    ::testing::Values(GoldenCase{"sf_adamw", "schedule_free_adamw", 1e-2, 0.1, 0.9, 0.999, 1e-8, 3, ""},
                      GoldenCase{"sf_adamw_r", "schedule_free_adamw", 1e-2, 0.01, 0.95, 0.99, 1e-6, 0,
                                 "r=1,weight_lr_power=1.5"},
                      // beta2 0.9: four silent steps (rho_t <= 4), then rectified ones
                      GoldenCase{"sf_radam", "schedule_free_radam", 1e-2, 0.1, 0.9, 0.9, 1e-8, 0, ""},
                      GoldenCase{"sf_sgd", "schedule_free_sgd", 0.1, 0.01, 0.9, 0.999, 1e-8, 2, ""}),
    [](const auto& info) { return info.param.golden; });

Params model_params() {
  Params p;
  p.add("h.0.mlp.c_fc.weight", test::randn({16, 24}, 1, DType::f32, Device::cpu(), 0.1));
  p.add("h.0.mlp.c_fc.bias", test::randn({24}, 2));
  p.add("model.layers.0.input_layernorm.weight", test::randn({7}, 4));
  return p;
}

void set_grads(Params& ps, int step) {
  for (size_t i = 0; i < ps.list.size(); ++i)
    autograd::set_grad(*ps.list[i].second, test::randn(ps.list[i].second->shape(), 1000 + 17 * step + i));
}

// A checkpoint taken in eval mode (the Trainer's: x saved) continues as the run that went on.
TEST(ScheduleFreeResume, FromEvalModeContinuesBitExactly) {
  for (const char* name : {"schedule_free_adamw", "schedule_free_radam", "schedule_free_sgd"}) {
    optim::OptimizerOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.05;
    o.beta2 = 0.9;
    o.warmup_steps = 2;
    const Params init = model_params();
    Params full = init.clone(), part = init.clone();
    auto a = optim::make_optimizer(name, full.list, o), b = optim::make_optimizer(name, part.list, o);
    for (int s = 0; s < 7; ++s) {
      a->set_train_mode(true, {});
      set_grads(full, s);
      a->step();
      if (s == 3) a->set_train_mode(false, {});  // the save
    }
    for (int s = 0; s < 4; ++s) {
      set_grads(part, s);
      b->step();
    }
    b->set_train_mode(false, {});
    const auto saved = b->state_dict();
    std::map<std::string, Tensor> st;
    for (const auto& [k, t] : saved) st[k] = ops::clone(t);
    Params resumed = part.clone();  // x, as the checkpoint's model
    auto r = optim::make_optimizer(name, resumed.list, o);
    r->load_state_dict(st);
    EXPECT_FALSE(r->train_mode()) << name;
    EXPECT_NE(expect_error([&] { r->step(); }).find("step() in eval mode"), std::string::npos) << name;
    for (int s = 4; s < 7; ++s) {
      r->set_train_mode(true, {});
      set_grads(resumed, s);
      r->step();
    }
    for (size_t i = 0; i < full.list.size(); ++i)
      EXPECT_EQ(floats(*full.list[i].second), floats(*resumed.list[i].second))
          << name << " " << full.list[i].first;
    // x and y differ once there is state: the switch moved the parameters.
    const std::vector<float> y = floats(*full.list[0].second);
    a->set_train_mode(false, {});
    EXPECT_NE(floats(*full.list[0].second), y) << name;
  }
}

// Under mixed precision the switch rounds the moved masters into the model's half weights, as a step does.
TEST(ScheduleFreeSwitch, WritesTheWeightCopies) {
  Params ps = model_params();
  optim::OptimizerOptions o;
  o.lr = 1e-1;
  auto opt = optim::make_optimizer("schedule_free_adamw", ps.list, o);
  std::vector<Tensor> copies;
  for (const auto& [n, p] : ps.list) copies.push_back(ops::to_dtype(*p, DType::bf16));
  opt->set_train_mode(false, copies);  // no state yet: nothing moves, the mode changes
  EXPECT_FALSE(opt->train_mode());
  opt->set_train_mode(true, copies);
  for (int s = 0; s < 3; ++s) {
    set_grads(ps, s);
    opt->step();
  }
  const std::vector<float> y = floats(*ps.list[0].second);
  opt->set_train_mode(false, copies);
  EXPECT_NE(floats(*ps.list[0].second), y);
  for (size_t i = 0; i < copies.size(); ++i)
    EXPECT_EQ(test::values(copies[i]), test::values(ops::to_dtype(*ps.list[i].second, DType::bf16)))
        << ps.list[i].first;
  opt->set_train_mode(false, copies);  // already there: a no-op
  for (size_t i = 0; i < copies.size(); ++i)
    EXPECT_EQ(test::values(copies[i]), test::values(ops::to_dtype(*ps.list[i].second, DType::bf16)));
}

TEST(ScheduleFreeErrors, ArgumentsAndStateAreChecked) {
  Params ps = model_params();
  const auto with = [&](const std::string& name, const std::string& args, double beta1 = 0.9) {
    optim::OptimizerOptions o;
    o.args = optim::parse_optim_args(args);
    o.beta1 = beta1;
    return expect_error([&] { optim::make_optimizer(name, ps.list, o); });
  };
  EXPECT_NE(with("schedule_free_adamw", "momentum=0.9")
                .find("'momentum' is not an argument of schedule_free_adamw (it takes weight_lr_power, r)"),
            std::string::npos);
  EXPECT_NE(with("schedule_free_radam", "weight_lr_power=-1").find("weight_lr_power must be a number >= 0"),
            std::string::npos);
  EXPECT_NE(with("schedule_free_sgd", "r=-0.5").find("r must be a number >= 0"), std::string::npos);
  EXPECT_NE(with("schedule_free_sgd", "momentum=1").find("momentum must be between 0 and 1 exclusive: 1"),
            std::string::npos);
  EXPECT_NE(with("schedule_free_adamw", "", 0.0).find("--adam_beta1 must be in (0, 1)"), std::string::npos);
  optim::OptimizerOptions o;
  auto sgd = optim::make_optimizer("schedule_free_sgd", ps.list, o);
  set_grads(ps, 0);
  sgd->step();
  std::map<std::string, Tensor> st;
  for (const auto& [k, t] : sgd->state_dict()) st[k] = ops::clone(t);
  EXPECT_EQ(st.count("exp_avg_sq.h.0.mlp.c_fc.bias"), 0u);  // SGD keeps z alone
  auto bad = st;
  bad["train_mode"] = ops::from_vector<int64_t>({2}, {});
  EXPECT_NE(expect_error([&] { sgd->load_state_dict(bad); }).find("'train_mode' must be 0 or 1, got 2"),
            std::string::npos);
  bad = st;
  bad["exp_avg_sq.h.0.mlp.c_fc.bias"] = ops::zeros({24}, DType::f32);
  EXPECT_NE(expect_error([&] { sgd->load_state_dict(bad); }).find("SGD keeps no second moment"),
            std::string::npos);
  bad = st;
  bad.erase("weight_sum");
  EXPECT_NE(expect_error([&] { sgd->load_state_dict(bad); }).find("weight_sum"), std::string::npos);
  sgd->set_train_mode(false, {});
  set_grads(ps, 1);
  EXPECT_NE(expect_error([&] { sgd->step(); }).find("schedule_free_sgd: step() in eval mode"),
            std::string::npos);
}

// The Trainer: evaluations and saves at x, steps at y. The final model is x (its evaluation by `trainer
// eval` is the run's last eval_loss), checkpoints hold x with the optimizer in eval mode, and a run resumed
// after a crash takes the uninterrupted run's steps bit for bit (bf16: the switch writes the half weights).
TEST(TrainerScheduleFree, EvaluatesAndSavesXAndResumesExactly) {
  Scratch s("trainer_schedule_free");
  for (const char* name : {"schedule_free_adamw", "schedule_free_sgd"}) {
    auto a = s.args(std::string("run_") + name);
    a.optim = name;
    a.learning_rate = name == std::string("schedule_free_sgd") ? 0.5 : 1e-2;
    a.weight_decay = 0.01;
    a.warmup_steps = 2;
    a.bf16 = true;
    a.max_steps = 6;
    a.save_steps = 2;
    a.eval_strategy = "steps";
    a.eval_steps = 3;
    a.do_eval = true;
    const auto full = train::train(a);
    ASSERT_EQ(full.losses.size(), 6u);
    EXPECT_LT(full.losses.back(), full.losses.front()) << name;
    auto st = io::SafetensorsFile::open(
        (fs::path(a.output_dir) / "checkpoint-2" / "optimizer.safetensors").string());
    EXPECT_EQ(st.load("train_mode").item(), 0.0) << name;
    train::TrainingArguments e = a;
    e.model_name_or_path = a.output_dir;
    e.config_name.clear();
    e.output_dir = (s.dir / (std::string("eval_") + name)).string();
    EXPECT_EQ(train::evaluate_command(e).loss, full.evals.back().loss) << name;
    auto b = a;
    b.output_dir = (s.dir / (std::string("crashed_") + name)).string();
    const train::TrainHooks hooks = crash_at_save(2);  // checkpoint-4 dies after its optimizer
    EXPECT_THROW(train::train(b, hooks), std::runtime_error);
    b.resume_from_checkpoint = "true";
    const auto resumed = train::train(b);
    ASSERT_EQ(resumed.losses.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed.losses[i], full.losses[2 + i]) << name << " " << i;
    EXPECT_EQ(resumed.evals.back().loss, full.evals.back().loss) << name;
  }
}

}  // namespace
}  // namespace tr
