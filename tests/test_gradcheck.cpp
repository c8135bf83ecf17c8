// Finite-difference gradient checks in f64 for every differentiable op, and the guard that every op of
// autograd/op_list.h has one.
#include <functional>
#include <map>
#include <set>

#include "autograd/checkpoint.h"
#include "autograd/op_list.h"
#include "test_util.h"

namespace tr {
namespace {

using Inputs = std::vector<Tensor>;

struct GradCase {
  std::string op;    // name in the op list this case covers
  std::string name;  // unique case name
  std::function<Inputs()> make;
  std::function<Tensor(const Inputs&)> fn;
  double eps = 1e-6, rtol = 1e-5, atol = 1e-6;
};

Tensor rnd(const Shape& s, uint64_t seed, double lo = -1.5, double hi = 1.5) {
  Tensor t = test::rand(s, seed, lo, hi, DType::f64);
  return t;
}

// Tensor-valued functions are reduced to a scalar with fixed random weights so every output element matters.
double weighted_sum(const Tensor& y, const Tensor& w) {
  auto yv = test::values(y), wv = test::values(w);
  double s = 0;
  for (size_t i = 0; i < yv.size(); ++i) s += yv[i] * wv[i];
  return s;
}

void gradcheck(const GradCase& c) {
  Inputs in = c.make();
  for (auto& t : in)
    if (is_floating(t.dtype())) autograd::set_requires_grad(t, true);
  Tensor y = c.fn(in);
  ASSERT_TRUE(y.requires_grad()) << c.name << ": output does not require grad";
  Tensor w = test::rand(y.shape(), 4242, -1.0, 1.0, DType::f64);
  autograd::backward({y}, {w});
  const double eps = c.eps;
  for (size_t k = 0; k < in.size(); ++k) {
    if (!is_floating(in[k].dtype())) continue;
    Tensor g = in[k].grad();
    ASSERT_TRUE(g.defined()) << c.name << ": no gradient for input " << k;
    auto gv = test::values(g);
    double* p = in[k].data<double>();
    for (int64_t i = 0; i < in[k].numel(); ++i) {
      const double orig = p[i];
      NoGradGuard ng;
      p[i] = orig + eps;
      double lp = weighted_sum(c.fn(in), w);
      p[i] = orig - eps;
      double lm = weighted_sum(c.fn(in), w);
      p[i] = orig;
      double fd = (lp - lm) / (2 * eps);
      ASSERT_NEAR(gv[i], fd, c.atol + c.rtol * std::abs(fd)) << c.name << ": input " << k << " element " << i;
    }
  }
}

Tensor causal_mask(int64_t t) {
  std::vector<uint8_t> m(static_cast<size_t>(t * t));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j) m[i * t + j] = j > i;
  return ops::to_dtype(ops::from_vector<uint8_t>(m, {t, t}), DType::boolean);
}

std::vector<GradCase> cases() {
  std::vector<GradCase> c;
  auto bin = [&](const std::string& op, auto f) {
    c.push_back({op, op + "_broadcast",
                 [] {
                   return Inputs{rnd({3, 1, 4}, 1), rnd({2, 1}, 2, 0.5, 1.5)};
                 },
                 f});
  };
  bin("add", [](const Inputs& x) { return x[0] + x[1]; });
  bin("sub", [](const Inputs& x) { return x[0] - x[1]; });
  bin("mul", [](const Inputs& x) { return x[0] * x[1]; });
  bin("div", [](const Inputs& x) { return x[0] / x[1]; });
  bin("maximum", [](const Inputs& x) { return maximum(x[0], x[1]); });
  bin("minimum", [](const Inputs& x) { return minimum(x[0], x[1]); });
  auto un = [&](const std::string& op, bool positive, auto f) {
    c.push_back({op, op,
                 [positive] {
                   return Inputs{positive ? rnd({3, 5}, 3, 0.3, 2.0) : rnd({3, 5}, 3)};
                 },
                 f});
  };
  un("neg", false, [](const Inputs& x) { return neg(x[0]); });
  un("exp", false, [](const Inputs& x) { return exp(x[0]); });
  un("log", true, [](const Inputs& x) { return log(x[0]); });
  un("sqrt", true, [](const Inputs& x) { return sqrt(x[0]); });
  un("rsqrt", true, [](const Inputs& x) { return rsqrt(x[0]); });
  un("tanh", false, [](const Inputs& x) { return tanh(x[0]); });
  un("sigmoid", false, [](const Inputs& x) { return sigmoid(x[0]); });
  un("relu", false, [](const Inputs& x) { return relu(x[0]); });
  un("gelu_tanh", false, [](const Inputs& x) { return gelu(x[0], true); });
  un("gelu_erf", false, [](const Inputs& x) { return gelu(x[0], false); });
  un("silu", false, [](const Inputs& x) { return silu(x[0]); });
  un("abs", false, [](const Inputs& x) { return abs(x[0]); });
  un("square", false, [](const Inputs& x) { return square(x[0]); });
  un("reciprocal", true, [](const Inputs& x) { return reciprocal(x[0]); });
  un("affine", false, [](const Inputs& x) { return affine(x[0], -1.5, 0.25); });
  un("pow", true, [](const Inputs& x) { return pow(x[0], 2.5); });
  // f64 -> f32 -> f64 rounds, so a wider step keeps the f32 rounding noise out of the difference quotient.
  c.push_back({"cast", "cast_f32_roundtrip",
               [] {
                 return Inputs{rnd({3, 5}, 3)};
               },
               [](const Inputs& x) { return cast(cast(x[0], DType::f32), DType::f64) * x[0]; }, 1e-3, 1e-3,
               1e-4});
  c.push_back({"masked_fill", "masked_fill_causal",
               [] {
                 return Inputs{rnd({2, 4, 4}, 4)};
               },
               [](const Inputs& x) { return masked_fill(x[0], causal_mask(4), -1e4); }});
  c.push_back({"dropout", "dropout_p0.3",
               [] {
                 return Inputs{rnd({4, 8}, 5)};
               },
               [](const Inputs& x) {
                 Generator g(11);  // fresh per call: the same mask for every evaluation
                 return dropout(x[0], 0.3, g);
               }});
  c.push_back({"sum", "sum_dims",
               [] {
                 return Inputs{rnd({2, 3, 4}, 6)};
               },
               [](const Inputs& x) {
                 return sum(x[0], {0, 2}, true);
               }});
  c.push_back({"sum", "sum_all",
               [] {
                 return Inputs{rnd({2, 3}, 7)};
               },
               [](const Inputs& x) { return sum(x[0]); }});
  c.push_back({"mean", "mean_last",
               [] {
                 return Inputs{rnd({2, 3, 4}, 8)};
               },
               [](const Inputs& x) { return mean(x[0], {-1}); }});
  c.push_back({"amax", "amax_dim1",
               [] {
                 return Inputs{rnd({3, 5, 2}, 9)};
               },
               [](const Inputs& x) { return amax(x[0], {1}); }});
  c.push_back({"softmax", "softmax_dim1",
               [] {
                 return Inputs{rnd({3, 6, 2}, 10)};
               },
               [](const Inputs& x) { return softmax(x[0], 1); }});
  c.push_back({"log_softmax", "log_softmax_last",
               [] {
                 return Inputs{rnd({3, 7}, 11)};
               },
               [](const Inputs& x) { return log_softmax(x[0], -1); }});
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    c.push_back(
        {"matmul", fmt::format("matmul_ta{}_tb{}", ta, tb),
         [ta, tb] {
           return Inputs{rnd(ta ? Shape{4, 3} : Shape{3, 4}, 12), rnd(tb ? Shape{5, 4} : Shape{4, 5}, 13)};
         },
         [ta, tb](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }});
  }
  c.push_back({"matmul", "matmul_batched_broadcast",
               [] {
                 return Inputs{rnd({2, 3, 4}, 14), rnd({4, 2}, 15)};
               },
               [](const Inputs& x) { return matmul(x[0], x[1]); }});
  c.push_back({"linear", "linear_bias",
               [] {
                 return Inputs{rnd({2, 3, 4}, 16), rnd({5, 4}, 17), rnd({5}, 18)};
               },
               [](const Inputs& x) { return linear(x[0], x[1], x[2]); }});
  c.push_back({"linear_gelu", "linear_gelu_epilogue",
               [] {
                 return Inputs{rnd({2, 3, 4}, 116), rnd({5, 4}, 117), rnd({5}, 118)};
               },
               [](const Inputs& x) { return linear_gelu(x[0], x[1], x[2]); }});
  c.push_back({"layer_norm", "layer_norm_affine",
               [] {
                 return Inputs{rnd({3, 8}, 19), rnd({8}, 20), rnd({8}, 21)};
               },
               [](const Inputs& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }});
  // Both outputs feed the result (the sum squared), so both backward branches are checked.
  c.push_back({"add_layer_norm", "add_layer_norm_both_outputs",
               [] {
                 return Inputs{rnd({3, 8}, 119), rnd({3, 8}, 120), rnd({8}, 121), rnd({8}, 122)};
               },
               [](const Inputs& x) {
                 auto [s, y] = add_layer_norm(x[0], x[1], x[2], x[3], 1e-5);
                 return add(mul(s, s), y);
               }});
  c.push_back({"add_rms_norm", "add_rms_norm_both_outputs",
               [] {
                 return Inputs{rnd({3, 8}, 123), rnd({3, 8}, 124), rnd({8}, 125)};
               },
               [](const Inputs& x) {
                 auto [s, y] = add_rms_norm(x[0], x[1], x[2], 1e-6);
                 return add(mul(s, s), y);
               }});
  c.push_back({"rms_norm", "rms_norm_weight",
               [] {
                 return Inputs{rnd({3, 8}, 22), rnd({8}, 23)};
               },
               [](const Inputs& x) { return rms_norm(x[0], x[1], 1e-6); }});
  c.push_back({"cross_entropy", "cross_entropy_mean_ignore",
               [] {
                 return Inputs{rnd({5, 6}, 24, -3, 3)};
               },
               [](const Inputs& x) {
                 return cross_entropy(x[0], ops::from_vector<int64_t>({1, -100, 5, 0, 2}, {5}));
               }});
  c.push_back(
      {"cross_entropy", "cross_entropy_sum",
       [] {
         return Inputs{rnd({2, 2, 5}, 25, -3, 3)};
       },
       [](const Inputs& x) {
         return cross_entropy(x[0], ops::from_vector<int64_t>({1, 4, -100, 0}, {2, 2}), -100, Reduction::sum);
       }});
  c.push_back({"cross_entropy", "cross_entropy_smoothed_mean",
               [] {
                 return Inputs{rnd({5, 6}, 47, -3, 3)};
               },
               [](const Inputs& x) {
                 return cross_entropy(x[0], ops::from_vector<int64_t>({1, -100, 5, 0, 2}, {5}), -100,
                                      Reduction::mean, 0.2);
               }});
  c.push_back({"embedding", "embedding_repeats",
               [] {
                 return Inputs{rnd({6, 3}, 26)};
               },
               [](const Inputs& x) {
                 return embedding(x[0], ops::from_vector<int64_t>({1, 5, 1, 0}, {2, 2}));
               }});
  c.push_back(
      {"rope", "rope",
       [] {
         return Inputs{rnd({1, 2, 3, 4}, 27)};
       },
       [](const Inputs& x) {
         return rope(x[0], ops::rope_tables(8, 4, 10000.0), ops::from_vector<int64_t>({0, 3, 5}, {1, 3}));
       }});
  for (bool causal : {true, false}) {
    c.push_back({"attention", causal ? "attention_gqa_causal_padded" : "attention_gqa_full",
                 [] {
                   return Inputs{rnd({2, 4, 5, 3}, 42), rnd({2, 2, 6, 3}, 43), rnd({2, 2, 6, 3}, 44)};
                 },
                 [causal](const Inputs& x) {
                   // batch 1 pads its first key: with causal masking query 0 then sees nothing (output 0)
                   std::vector<uint8_t> keep = {1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1};
                   Tensor kk = ops::to_dtype(ops::from_vector<uint8_t>(keep, {2, 6}), DType::boolean);
                   return scaled_dot_product_attention(x[0], x[1], x[2], kk, causal, 0.7);
                 }});
  }
  c.push_back({"attention", "attention_sliding_window_of_2",
               [] {
                 return Inputs{rnd({1, 2, 5, 3}, 47), rnd({1, 1, 7, 3}, 48), rnd({1, 1, 7, 3}, 49)};
               },
               [](const Inputs& x) {  // a cache of 2 keys before the 5 queries; each sees 2 keys
                 return scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), true, 0.7, 0.0, nullptr, 2);
               }});
  // Attention dropout in either form: a generator at the same state in every evaluation draws the same mask,
  // so the function is smooth and its gradient is the dropped softmax's.
  for (ops::AttentionForm form : {ops::AttentionForm::fused, ops::AttentionForm::blocked})
    c.push_back({"attention",
                 form == ops::AttentionForm::fused ? "attention_dropout_fused" : "attention_dropout_blocked",
                 [] {
                   return Inputs{rnd({2, 2, 5, 3}, 50), rnd({2, 1, 6, 3}, 51), rnd({2, 1, 6, 3}, 52)};
                 },
                 [form](const Inputs& x) {
                   Generator gen(9);
                   gen.set_state({9, 40});
                   return scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), true, 0.7, 0.4, &gen, 0,
                                                       form);
                 }});
  c.push_back(
      {"linear_cross_entropy", "linear_cross_entropy_chunks_of_2",
       [] {
         return Inputs{rnd({5, 4}, 45), rnd({7, 4}, 46)};
       },
       [](const Inputs& x) {
         return linear_cross_entropy_sum(x[0], x[1], ops::from_vector<int64_t>({3, -100, 6, 0, 2}, {5}), 2);
       }});
  c.push_back({"linear_cross_entropy", "linear_cross_entropy_smoothed",
               [] {
                 return Inputs{rnd({5, 4}, 48), rnd({7, 4}, 49)};
               },
               [](const Inputs& x) {
                 return linear_cross_entropy_sum(
                     x[0], x[1], ops::from_vector<int64_t>({3, -100, 6, 0, 2}, {5}), 2, -100, 0.1);
               }});
  c.push_back({"view", "view",
               [] {
                 return Inputs{rnd({2, 6}, 28)};
               },
               [](const Inputs& x) {
                 return view(x[0], {3, 4}) * view(x[0], {3, 4});
               }});
  c.push_back({"reshape", "reshape_copy",
               [] {
                 return Inputs{rnd({3, 4}, 29)};
               },
               [](const Inputs& x) { return reshape(transpose(x[0], 0, 1), {12}); }});
  c.push_back({"transpose", "transpose",
               [] {
                 return Inputs{rnd({2, 3}, 30), rnd({3, 2}, 31)};
               },
               [](const Inputs& x) { return transpose(x[0], 0, 1) * x[1]; }});
  c.push_back({"permute", "permute",
               [] {
                 return Inputs{rnd({2, 3, 4}, 32)};
               },
               [](const Inputs& x) {
                 return contiguous(permute(x[0], {2, 0, 1})) * 1.5;
               }});
  c.push_back({"narrow", "narrow",
               [] {
                 return Inputs{rnd({4, 5}, 33)};
               },
               [](const Inputs& x) { return narrow(x[0], 1, 1, 3) * 2.0; }});
  c.push_back({"expand", "expand",
               [] {
                 return Inputs{rnd({3, 1}, 34)};
               },
               [](const Inputs& x) {
                 return expand(x[0], {2, 3, 4}) * 1.0;
               }});
  c.push_back({"contiguous", "contiguous",
               [] {
                 return Inputs{rnd({3, 4}, 35)};
               },
               [](const Inputs& x) { return contiguous(transpose(x[0], 0, 1)); }});
  c.push_back({"to_device", "to_device_a_host_partition_and_back",  // device_map's moves between layers
               [] {
                 return Inputs{rnd({3, 4}, 38)};
               },
               [](const Inputs& x) {
                 return to_device(to_device(x[0], Device{DeviceType::cpu, 1}) * 1.5, Device::cpu());
               }});
  c.push_back({"cat", "cat",
               [] {
                 return Inputs{rnd({2, 3}, 36), rnd({2, 2}, 37)};
               },
               [](const Inputs& x) {
                 return cat({x[0], x[1]}, 1);
               }});
  c.push_back({"split", "split_partial_use",
               [] {
                 return Inputs{rnd({2, 6}, 38)};
               },
               [](const Inputs& x) {
                 auto parts = split(x[0], {1, 2, 3}, 1);
                 return parts[0] * parts[2];  // parts[1] gets no gradient
               }});
  c.push_back({"backward_hook", "backward_hook_identity",
               [] {
                 return Inputs{rnd({3, 4}, 42)};
               },
               [](const Inputs& x) {
                 auto calls = std::make_shared<int>(0);
                 Tensor y = backward_hook(x[0] * x[0], [calls] { ++*calls; });
                 return y * 2.0;
               }});
  c.push_back({"checkpoint", "checkpoint_mlp_with_dropout",
               [] {
                 return Inputs{rnd({3, 4}, 39), rnd({6, 4}, 40), rnd({4, 6}, 41)};
               },
               [](const Inputs& x) {
                 Generator gen(5);
                 Tensor w1 = x[1], w2 = x[2];
                 auto out = autograd::checkpoint(
                     [&gen, w1, w2](const std::vector<Tensor>& in) -> std::vector<Tensor> {
                       Tensor h = gelu(linear(in[0], w1));
                       return {linear(dropout(h, 0.25, gen), w2)};
                     },
                     {x[0]}, {{&gen}});
                 return out[0];
               }});
  return c;
}

class GradCheck : public ::testing::TestWithParam<std::string> {};

TEST_P(GradCheck, AnalyticMatchesFiniteDifferences) {
  for (const auto& c : cases())
    if (c.name == GetParam()) gradcheck(c);
}

std::vector<std::string> names() {
  std::vector<std::string> n;
  for (const auto& c : cases()) n.push_back(c.name);
  return n;
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheck, ::testing::ValuesIn(names()), [](const auto& info) {
  std::string n = info.param;
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
});

TEST(GradCheckCoverage, EveryDifferentiableOpHasAGradientCheck) {
  std::set<std::string> covered;
  for (const auto& c : cases()) covered.insert(c.op);
  for (auto op : autograd::kDifferentiableOps)
    EXPECT_TRUE(covered.count(std::string(op)))
        << "op '" << op << "' has no finite-difference gradient check";
  for (const auto& op : covered) {
    bool listed = false;
    for (auto o : autograd::kDifferentiableOps) listed = listed || o == op;
    EXPECT_TRUE(listed) << "gradient check for '" << op << "', which is not in the op list";
  }
}

}  // namespace
}  // namespace tr
