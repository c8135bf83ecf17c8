// HF's learning-rate schedules against golden values from transformers/optimization.py's lambdas (computed
// in Python from those formulas: tests/lr_schedule_golden.py), their kwargs checks, and torch's
// ReduceLROnPlateau stepping.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "train/lr_schedule.h"

namespace tr {
namespace {

using train::LrSchedule;

struct GoldenRow {
  const char* type;
  const char* kwargs;
  std::vector<double> lr;  // at the steps below, base 1e-3, 10 warmup steps of 100
};

TEST(LrSchedule, MatchesHuggingFaceLambdas) {
  const std::vector<int64_t> steps = {0, 3, 9, 10, 11, 37, 64, 79, 99, 100, 120};
  const std::vector<GoldenRow> rows = {
      {"linear",
       "",
       {0.0, 0.0003, 0.0009000000000000001, 0.001, 0.000988888888888889, 0.0007, 0.0004,
        0.00023333333333333333, 1.1111111111111112e-05, 0.0, 0.0}},
      {"cosine",
       "{\"num_cycles\": 0.5}",
       {0.0, 0.0003, 0.0009000000000000001, 0.001, 0.0009996954135095479, 0.0007938926261462366,
        0.00034549150281252633, 0.00012842758726130281, 3.0458649045211895e-07, 0.0, 0.000116977778440511}},
      {"cosine_with_restarts",
       "{\"num_cycles\": 3}",
       {0.0, 0.0003, 0.0009000000000000001, 0.001, 0.0009972609476841367, 2.447174185242329e-05,
        9.549150281252645e-05, 0.0007938926261462362, 2.7390523158632995e-06, 0.0, 0.0}},
      {"polynomial",
       "{\"lr_end\": 1e-5, \"power\": 2.0}",
       {0.0, 0.0003, 0.0009000000000000001, 0.001, 0.0009781222222222223, 0.0004950999999999999,
        0.00016840000000000003, 6.389999999999998e-05, 1.0122222222222222e-05, 1e-05, 1e-05}},
      {"constant_with_warmup",
       "",
       {0.0, 0.0003, 0.0009000000000000001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001}},
      {"inverse_sqrt",
       "",
       {0.0, 0.0003, 0.0009000000000000001, 0.001, 0.0009534625892455923, 0.0005198752449100363,
        0.00039528470752104737, 0.00035578403348241, 0.0003178208630818641, 0.00031622776601683794,
        0.00028867513459481295}},
      {"cosine_with_min_lr",
       "{\"min_lr\": 1e-4}",
       {0.0, 0.0003, 0.0009000000000000001, 0.001, 0.000999725872158593, 0.000814503363531613,
        0.0004109423525312738, 0.00021558482853517255, 0.0001002741278414069, 0.0001, 0.0002052800005964599}},
      {"cosine_warmup_with_min_lr",
       "{\"min_lr_rate\": 0.1}",
       {0.0001, 0.0004, 0.001, 0.000999725872158593, 0.000998903822616921, 0.000801636806561836,
        0.0003960909355034491, 0.00020528000059645996, 0.0001, 0.0001002741278414069,
        0.00021558482853517257}},
      {"cosine_warmup_with_min_lr",
       "{\"min_lr_rate\": 0.1, \"warmup_lr_rate\": 0.2}",
       {0.0002, 0.0004666666666666667, 0.001, 0.000999725872158593, 0.000998903822616921,
        0.000801636806561836, 0.0003960909355034491, 0.00020528000059645996, 0.0001, 0.0001002741278414069,
        0.00021558482853517257}},
      {"warmup_stable_decay",
       "{\"num_decay_steps\": 30, \"min_lr_ratio\": 0.05}",
       {5e-05, 0.00033499999999999996, 0.0009050000000000001, 0.001, 0.001, 0.001, 0.001,
        0.0008041979948389248, 5.260209970007019e-05, 5e-05, 5e-05}},
      {"warmup_stable_decay",
       "{\"num_decay_steps\": 30, \"num_stable_steps\": 40, \"warmup_type\": \"cosine\", \"decay_type\": "
       "\"1-sqrt\", \"min_lr_ratio\": 0.05}",
       {5e-05, 0.0002458020051610753, 0.000976751845240198, 0.001, 0.001, 0.001, 0.00035102645148922545,
        6.596752376233374e-05, 5e-05, 5e-05, 5e-05}},
      {"warmup_stable_decay",
       "{\"num_decay_steps\": 20, \"decay_type\": \"linear\"}",
       {0.0, 0.0003, 0.0009000000000000001, 0.001, 0.001, 0.001, 0.001, 0.001, 5.000000000000004e-05, 0.0,
        0.0}},
  };
  for (const auto& r : rows) {
    const LrSchedule s(r.type, r.kwargs, 1e-3);
    for (size_t i = 0; i < steps.size(); ++i)
      EXPECT_NEAR(s.at(steps[i], 10, 100), r.lr[i], 1e-18)
          << r.type << " " << r.kwargs << " step " << steps[i];
  }
}

// The message a bad --lr_scheduler_type / --lr_scheduler_kwargs gets (empty: accepted).
std::string refusal(const char* type, const char* kwargs, double lr = 1e-3) {
  try {
    LrSchedule(type, kwargs, lr);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LrSchedule, RefusesWhatHuggingFaceRefuses) {
  EXPECT_NE(refusal("cosine_restarts", "").find("did you mean 'cosine_with_restarts'"), std::string::npos);
  EXPECT_NE(refusal("linear", "{\"num_cycles\": 2}").find("'num_cycles' is not an argument of the linear"),
            std::string::npos);
  EXPECT_NE(refusal("cosine", "[1]").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(refusal("cosine", "{\"num_cycle\": 2}").find("did you mean 'num_cycles'"), std::string::npos);
  EXPECT_NE(refusal("polynomial", "{\"lr_end\": 1e-3}").find("must be smaller than --learning_rate"),
            std::string::npos);
  EXPECT_NE(refusal("cosine_with_min_lr", "").find("needs min_lr or min_lr_rate"), std::string::npos);
  EXPECT_NE(refusal("cosine_with_min_lr", "{\"min_lr\": 1e-5, \"min_lr_rate\": 0.1}").find("not both"),
            std::string::npos);
  EXPECT_NE(refusal("warmup_stable_decay", "{}").find("needs num_decay_steps"), std::string::npos);
  EXPECT_NE(refusal("warmup_stable_decay", "{\"num_decay_steps\": 5, \"decay_type\": \"exp\"}")
                .find("expected one of linear, cosine, 1-sqrt"),
            std::string::npos);
  EXPECT_NE(refusal("warmup_stable_decay", "{\"num_decay_steps\": 2.5}").find("expected an integer >= 0"),
            std::string::npos);
  EXPECT_NE(refusal("reduce_lr_on_plateau", "{\"factor\": 1.0}").find("Factor should be < 1.0"),
            std::string::npos);
  EXPECT_NE(refusal("reduce_lr_on_plateau", "{\"mode\": \"maximum\"}").find("expected one of min, max"),
            std::string::npos);
  // HF's _convert_str_dict: "2" is 2, "0.5" 0.5, "True" true; Python takes 5.0 where an int goes.
  EXPECT_EQ(LrSchedule("cosine_with_restarts", "{\"num_cycles\": \"2\"}", 1e-3).at(55, 10, 100),
            LrSchedule("cosine_with_restarts", "{\"num_cycles\": 2}", 1e-3).at(55, 10, 100));
  EXPECT_EQ(refusal("reduce_lr_on_plateau", "{\"patience\": 5.0, \"factor\": \"0.5\"}"), "");
  EXPECT_NE(refusal("reduce_lr_on_plateau", "{\"patience\": 5.5}").find("expected an integer >= 0"),
            std::string::npos);
  EXPECT_NE(refusal("warmup_stable_decay", "{\"num_decay_steps\": 9e18}").find("expected an integer"),
            std::string::npos);
  // HF's get_scheduler hands these three no kwargs: whatever is given is ignored, as there.
  EXPECT_EQ(refusal("constant", "{\"num_cycles\": 2}"), "");
  EXPECT_EQ(refusal("inverse_sqrt", "{\"timescale\": 5}"), "");
  EXPECT_EQ(refusal("cosine_with_restarts", "{\"num_cycles\": 2}"), "");
}

TEST(LrSchedule, PlateauStepsAsTorch) {
  LrSchedule s("reduce_lr_on_plateau", "{\"patience\": 2, \"factor\": 0.5}", 1e-3);
  auto& p = s.plateau();
  EXPECT_EQ(s.at(0, 10, 100), 1e-3);  // no warmup: the base rate until a reduction
  EXPECT_FALSE(p.step(1.0));          // the first metric is the best
  EXPECT_FALSE(p.step(0.9));          // better
  EXPECT_FALSE(p.step(0.95));         // bad 1
  EXPECT_FALSE(p.step(0.9));          // equal is not better: bad 2
  EXPECT_TRUE(p.step(0.95));          // bad 3 > patience 2: halved
  EXPECT_EQ(s.at(50, 10, 100), 5e-4);
  EXPECT_FALSE(p.step(0.89992));  // within the relative threshold (0.9 x (1 - 1e-4) = 0.89991): bad 1
  EXPECT_FALSE(p.step(0.8));      // better
  EXPECT_EQ(p.num_bad_epochs, 0);
  // cooldown: the evaluations right after a reduction count no bad ones; min_lr bounds the rate, and a
  // reduction smaller than eps is no reduction.
  LrSchedule c("reduce_lr_on_plateau",
               "{\"patience\": 0, \"factor\": 0.1, \"cooldown\": 1, \"min_lr\": 2e-5, \"mode\": \"max\"}",
               1e-3);
  auto& q = c.plateau();
  EXPECT_FALSE(q.step(1.0));
  EXPECT_TRUE(q.step(0.5));  // worse in mode max: 1e-3 -> 1e-4
  EXPECT_NEAR(q.lr, 1e-4, 1e-18);
  EXPECT_FALSE(q.step(0.5));  // in cooldown
  EXPECT_TRUE(q.step(0.5));   // 1e-4 -> max(1e-5, 2e-5)
  EXPECT_EQ(q.lr, 2e-5);
  EXPECT_FALSE(q.step(0.5));  // cooldown
  EXPECT_FALSE(q.step(0.5));  // at min_lr: nothing left to reduce
  EXPECT_EQ(q.lr, 2e-5);
  // Its state round-trips through the checkpoint's scheduler.json.
  train::PlateauState r = LrSchedule("reduce_lr_on_plateau", "", 1e-3).plateau();
  r.read_json(q.to_json(), "scheduler.json");
  EXPECT_EQ(r.lr, q.lr);
  EXPECT_EQ(r.best, q.best);
  EXPECT_EQ(r.cooldown_counter, q.cooldown_counter);
  EXPECT_EQ(r.num_bad_epochs, q.num_bad_epochs);
  EXPECT_THROW(r.read_json({{"lr", "x"}}, "scheduler.json"), Error);
}

}  // namespace
}  // namespace tr
