// bitsandbytes' 8-bit optimizer states (optim/adamw_8bit.h, optim/elementwise.h): the dynamic maps, the
// nearest-code search and the CPU's code table, 8-bit AdamW against fp32 AdamW (first step, a least-squares
// run, 32-bit state where bitsandbytes keeps it), and the 8-bit Lion, RMSprop and AdEMAMix runs against their
// 32-bit kernels.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/adamw8bit_math.h"
#include "backend/cpu/code_table.h"
#include "io/safetensors.h"
#include "optim/adamw_8bit.h"
#include "optim/optimizer.h"
#include "optim_test_util.h"

namespace tr {
namespace {

using optim_test::floats;
using optim_test::Params;

// ---------------------------------------------------------------------------------------------------------
// bitsandbytes' maps and the nearest-code quantizer.

TEST(Optim8bit, DynamicMapsAreBitsandbytesMaps) {
  auto f = io::SafetensorsFile::open(std::string(TRAINER_GOLDEN_DIR) + "/optim/optim_golden.safetensors");
  for (bool is_signed : {true, false}) {
    const auto& code = optim::dynamic_map(is_signed);
    std::vector<float> want = floats(f.load(is_signed ? "map.signed" : "map.unsigned"));
    ASSERT_EQ(want.size(), 256u);
    // The reference came from torch 1.13's vectorized linspace; ours follows current torch's scalar formula:
    // the codes may differ in the last bit, nothing more.
    for (size_t i = 0; i < 256; ++i) EXPECT_NEAR(code[i], want[i], 2e-7 * std::abs(want[i])) << i;
    EXPECT_TRUE(std::is_sorted(code.begin(), code.end()));
    EXPECT_EQ(std::adjacent_find(code.begin(), code.end()), code.end()) << "duplicate code";
    EXPECT_EQ(code.back(), 1.0f);
    EXPECT_NE(std::find(code.begin(), code.end(), 0.0f), code.end());
    if (is_signed) {
      // bitsandbytes' signed map is not symmetric: +1 is a code, its most negative code is -0.99297.
      EXPECT_NEAR(code.front(), -0.99297, 1e-5);
      EXPECT_EQ(std::count_if(code.begin(), code.end(), [](float x) { return x < 0; }), 127);
    } else {
      EXPECT_EQ(code.front(), 0.0f);
    }
    // Every code quantizes to itself; random values go to the nearest code (brute force), within half a gap.
    for (int i = 0; i < 256; ++i) EXPECT_EQ(optim::quantize_to_code(code, code[i]), i);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(is_signed ? -1.0f : 0.0f, 1.0f);
    for (int k = 0; k < 20000; ++k) {
      // log-uniform magnitudes too, so the small-exponent codes are exercised
      float x = u(rng);
      if (k % 2) x = std::copysign(std::pow(10.0f, -7.0f * std::abs(u(rng))), is_signed ? x : 1.0f);
      const int q = optim::quantize_to_code(code, x);
      float best = INFINITY;
      for (float c : code) best = std::min(best, std::abs(c - x));
      ASSERT_EQ(std::abs(code[q] - x), best) << "x=" << x;
    }
    EXPECT_EQ(optim::quantize_to_code(code, 2.0f), 255);
    EXPECT_EQ(optim::quantize_to_code(code, -2.0f), 0);
  }
}

// ---------------------------------------------------------------------------------------------------------
// 8-bit AdamW against 32-bit AdamW on least squares: loss = sum_k |X_k W_k^T (+ b) - Y_k|^2 / (2 B).

struct LeastSquares {
  static constexpr int64_t kOut = 64, kIn = 128, kBatch = 256;
  std::vector<std::vector<float>> x, y;  // per weight: X [B, in], Y [B, out]
  explicit LeastSquares(int weights) {
    std::mt19937 rng(11);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (int k = 0; k < weights; ++k) {
      std::vector<float> xs(kBatch * kIn), target(kOut * kIn), ys(kBatch * kOut);
      for (auto& v : xs) v = n(rng);
      for (auto& v : target) v = 0.5f * n(rng);
      for (int64_t b = 0; b < kBatch; ++b)
        for (int64_t o = 0; o < kOut; ++o) {
          double acc = 0.3 * (k == 0 ? std::sin(double(o)) : 0.0);  // the bias's target
          for (int64_t i = 0; i < kIn; ++i) acc += double(xs[b * kIn + i]) * target[o * kIn + i];
          ys[b * kOut + o] = static_cast<float>(acc);
        }
      x.push_back(xs);
      y.push_back(ys);
    }
  }
  // Sets the gradients of `ps` (weights..., then the bias of weight 0) and returns the loss.
  double grads(Params& ps) const {
    double loss = 0;
    const float* bias = ps.list.back().second->data<float>();
    std::vector<float> gb(kOut, 0.0f);
    for (size_t k = 0; k < x.size(); ++k) {
      const float* w = ps.list[k].second->data<float>();
      std::vector<float> gw(kOut * kIn, 0.0f), r(kBatch * kOut);
      for (int64_t b = 0; b < kBatch; ++b)
        for (int64_t o = 0; o < kOut; ++o) {
          double acc = k == 0 ? bias[o] : 0.0;
          for (int64_t i = 0; i < kIn; ++i) acc += double(x[k][b * kIn + i]) * w[o * kIn + i];
          r[b * kOut + o] = static_cast<float>(acc - y[k][b * kOut + o]);
          loss += 0.5 * double(r[b * kOut + o]) * r[b * kOut + o] / kBatch;
        }
      for (int64_t b = 0; b < kBatch; ++b)
        for (int64_t o = 0; o < kOut; ++o) {
          const float ro = r[b * kOut + o] / kBatch;
          for (int64_t i = 0; i < kIn; ++i) gw[o * kIn + i] += ro * x[k][b * kIn + i];
          if (k == 0) gb[o] += ro;
        }
      autograd::set_grad(*ps.list[k].second, ops::from_vector(gw, {kOut, kIn}));
    }
    autograd::set_grad(*ps.list.back().second, ops::from_vector(gb, {kOut}));
    return loss;
  }
};

Params least_squares_init(int weights) {
  Params init;
  for (int k = 0; k < weights; ++k)
    init.add("layers." + std::to_string(k) + ".weight",
             test::randn({LeastSquares::kOut, LeastSquares::kIn}, 20 + k, DType::f32, Device::cpu(), 0.1));
  init.add("layers.0.bias", ops::zeros({LeastSquares::kOut}));
  return init;
}

std::map<std::string, Tensor> state_map(const optim::Optimizer& opt) {
  std::map<std::string, Tensor> out;
  for (const auto& [k, t] : opt.state_dict()) out[k] = t;
  return out;
}

// The branchless lower bound in quantize_code picks bitsandbytes' code for every input: the nearest, a tie
// (a midpoint) to the even index, the ends clamped, NaN to code 0 - against a plain std::lower_bound search,
// on both maps, for every code, every midpoint, their neighbours one ulp away and random values.
TEST(Optim8bit, QuantizeCodePicksTheNearestCodeAsTheBranchingSearchDid) {
  const auto reference = [](const std::array<float, 256>& code, float x) -> int {
    const int lo = static_cast<int>(std::lower_bound(code.begin(), code.end(), x) - code.begin());
    if (lo == 0 || x != x) return 0;
    if (lo == 256) return 255;
    const float m = (code[lo - 1] + code[lo]) * 0.5f;
    return x > m ? lo : x < m ? lo - 1 : ((lo - 1) % 2 == 0 ? lo - 1 : lo);
  };
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.2f, 1.2f);
  for (bool is_signed : {true, false}) {
    const auto& code = optim::dynamic_map(is_signed);
    std::vector<float> xs{NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 2.0f, -2.0f};
    for (int i = 0; i < 256; ++i) {
      for (float c : {code[i], i < 255 ? (code[i] + code[i + 1]) * 0.5f : code[i]})
        xs.insert(xs.end(), {c, std::nextafter(c, -INFINITY), std::nextafter(c, INFINITY)});
    }
    for (int i = 0; i < 20000; ++i) xs.push_back(u(rng));
    for (float x : xs)
      ASSERT_EQ(backend::quantize_code(code.data(), x), reference(code, x))
          << (is_signed ? "signed " : "unsigned ") << x;
  }
}

// The CPU's AVX-512 requantization (16 elements at once) gives the scalar adam8bit_codes' bits: random
// moments against random block maxima, codes and midpoints exactly, zeros of both signs, values beyond the
// ends, a zero block (quantized against 1) and NaN.
// The CPU's nearest-code table gives the binary search's code for every float: checked at every bucket's ends
// and their neighbours (where the table decides), around every code and midpoint (where the code changes and
// ties go to the even index), at random inside the buckets that search, across the whole float range, and at
// NaN, infinities, zeros and subnormals.
TEST(Optim8bit, CodeTableGivesTheSearchedCodeOfEveryFloat) {
  const auto bits = [](uint32_t u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
  };
  const auto next = [](float x, int steps) {
    for (int i = 0; i < std::abs(steps); ++i) x = std::nextafter(x, steps > 0 ? INFINITY : -INFINITY);
    return x;
  };
  for (const bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "signed map" : "unsigned map");
    const auto& q = optim::dynamic_map(is_signed);
    const cpu::CodeTable table(q.data());
    int64_t checked = 0;
    const auto check = [&](float x) {
      ++checked;
      const uint8_t want = backend::quantize_code(q.data(), x), got = table(x);
      if (want != got)
        ADD_FAILURE() << "x " << x << " (bits " << std::hex << std::bit_cast<uint32_t>(x) << std::dec
                      << "): table " << int(got) << ", search " << int(want);
    };
    const auto of_key = [&](uint32_t k) { return bits((k & 0x80000000u) != 0 ? (k & 0x7FFFFFFFu) : ~k); };
    std::mt19937 rng(5);
    const uint32_t span = 1u << cpu::CodeTable::kShift;
    for (uint32_t b = 0; b < cpu::CodeTable::kBuckets; ++b) {
      const uint32_t first = b << cpu::CodeTable::kShift, last = first | (span - 1);
      for (const uint32_t key : {first, last})
        for (const int d : {-1, 0, 1}) check(of_key(key + static_cast<uint32_t>(d)));
      const float lo = of_key(first), hi = of_key(last);
      if (lo != lo || hi != hi ||
          backend::quantize_code(q.data(), lo) != backend::quantize_code(q.data(), hi))
        for (int r = 0; r < 64; ++r) check(of_key(first + static_cast<uint32_t>(rng() % span)));  // searched
    }
    for (int i = 0; i < 256; ++i)
      for (int d = -2; d <= 2; ++d) {
        check(next(q[i], d));
        if (i < 255) check(next((q[i] + q[i + 1]) * 0.5f, d));
      }
    for (uint32_t u = 0; u < 0xFFFF0000u; u += 65521) check(bits(u + (rng() & 0xFFFF)));
    for (const float x : {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-45f, -1e-45f, 1.0f, -1.0f, 2.0f})
      check(x);
    const uint32_t searched = table.searched_buckets();
    // the NaN buckets (2^23 NaNs of each sign) and one or two per boundary between codes
    const uint32_t nan_buckets = 2u << (23 - cpu::CodeTable::kShift);
    EXPECT_LT(searched, nan_buckets + 2 * 255) << "the table decides nearly everywhere";
    EXPECT_GT(checked, 1500000);
  }
}

TEST(Optim8bit, FirstStepIsFp32AdamWAndTheStoredMomentsAreWithinOneCode) {
  // Step 1 updates the parameters from unquantized moments (the dequantized zero state plus the gradient),
  // so it equals the 32-bit-state run; the stored moments are then the exact ones rounded to the map.
  const LeastSquares problem(1);
  Params p8 = least_squares_init(1), p32 = p8.clone();
  optim::OptimizerOptions o;
  o.lr = 1e-3;
  o.weight_decay = 0.01;
  auto opt8 = optim::make_optimizer("adamw_8bit", p8.list, o);
  o.args = {{"min_8bit_size", "1000000000"}};  // bitsandbytes' 32-bit kernel for every tensor
  auto opt32 = optim::make_optimizer("adamw_8bit", p32.list, o);
  problem.grads(p8);
  problem.grads(p32);
  opt8->step();
  opt32->step();
  for (size_t i = 0; i < p8.list.size(); ++i)
    EXPECT_TRUE(test::all_close(*p8.list[i].second, *p32.list[i].second, 1e-6, 1e-9)) << p8.list[i].first;
  auto s8 = state_map(*opt8), s32 = state_map(*opt32);
  const std::string w = "layers.0.weight";
  for (int moment = 1; moment <= 2; ++moment) {
    const auto& code = optim::dynamic_map(moment == 1);
    const auto codes = ops::to_vector<int64_t>(s8.at("state" + std::to_string(moment) + "." + w));
    const auto absmax = floats(s8.at("absmax" + std::to_string(moment) + "." + w));
    const auto exact = floats(s32.at("state" + std::to_string(moment) + "." + w));
    ASSERT_EQ(codes.size(), exact.size());
    ASSERT_EQ(absmax.size(), (exact.size() + 255) / 256);
    for (size_t b = 0; b < absmax.size(); ++b) {
      float block_max = 0;
      for (size_t j = b * 256; j < std::min(exact.size(), (b + 1) * 256); ++j)
        block_max = std::max(block_max, std::abs(exact[j]));
      EXPECT_NEAR(absmax[b], block_max, 1e-6 * block_max) << "absmax" << moment << " block " << b;
    }
    for (size_t j = 0; j < codes.size(); ++j) {
      // nearest code: within half the gap to a neighbour; m's sign rule may move it one code outwards
      const int64_t q = codes[j];
      const float gap =
          std::max(q > 0 ? code[q] - code[q - 1] : 0.0f, q < 255 ? code[q + 1] - code[q] : 0.0f);
      const float a = absmax[j / 256];
      ASSERT_LE(std::abs(code[q] * a - exact[j]), gap * a * 1.0001f)
          << "moment " << moment << " element " << j;
      if (moment == 1) {
        ASSERT_EQ(std::signbit(code[q]), std::signbit(exact[j])) << j;
      }
    }
  }
}

TEST(Optim8bit, TracksAdamWOnLeastSquaresWithTwoBytesPerParameter) {
  // loss = sum_k |X_k W_k^T (+ b) - Y_k|^2 / 2B with three 64x128 weights (8-bit state), a 64-bias (32-bit),
  // B = 256 > 128 (a unique optimum), lr 1e-3: 100 steps stay in the descent phase, where two runs that
  // differ by small state errors are pulled along the same path (near the optimum Adam's ~lr-sized steps
  // would oscillate and tracking would say little).
  constexpr int kWeights = 3, kSteps = 100;
  const LeastSquares problem(kWeights);
  const Params init = least_squares_init(kWeights);
  optim::OptimizerOptions o;
  o.lr = 1e-3;
  o.weight_decay = 0.01;
  Params p32 = init.clone(), p8 = init.clone();
  auto adamw = optim::make_optimizer("adamw_torch", p32.list, o);
  auto adamw8 = optim::make_optimizer("adamw_8bit", p8.list, o);
  std::vector<double> loss32, loss8;
  for (int s = 0; s < kSteps; ++s) {
    loss32.push_back(problem.grads(p32));
    loss8.push_back(problem.grads(p8));
    adamw->step();
    adamw8->step();
  }
  double worst = 0, mean = 0, moved = 0;
  int64_t count = 0;
  for (size_t i = 0; i < init.list.size(); ++i) {
    auto a = floats(*p32.list[i].second), b = floats(*p8.list[i].second), z = floats(*init.list[i].second);
    for (size_t j = 0; j < a.size(); ++j) {
      worst = std::max(worst, double(std::abs(a[j] - b[j])));
      mean += std::abs(a[j] - b[j]);
      moved += std::abs(a[j] - z[j]);
      ++count;
    }
  }
  mean /= static_cast<double>(count);
  moved /= static_cast<double>(count);
  std::printf(
      "8-bit vs 32-bit AdamW, %d steps: mean |dp| %.3g (%.1f%% of the mean displacement %.3g), max |dp| "
      "%.3g; loss %.2f -> %.2f (8-bit) vs %.2f (32-bit)\n",
      kSteps, mean, 100 * mean / moved, moved, worst, loss8.front(), loss8.back(), loss32.back());
  // Both runs descend the same way: each loses more than 25% of its loss, and the 8-bit decrease is within
  // 3% of the 32-bit one (measured: 0.8%).
  EXPECT_LT(loss32.back(), 0.75 * loss32.front());
  EXPECT_NEAR(loss8.front() - loss8.back(), loss32.front() - loss32.back(),
              0.03 * (loss32.front() - loss32.back()));
  // Parameters track within the quantization error. A moment stored on the map is off by up to half a code
  // gap relative to its block's absmax: 0.7% of the absmax near it, 1.4-14% of the value for moments at 1-10%
  // of it, and an EMA whose increments are below half a gap stalls on its code, so these errors persist over
  // steps rather than averaging out. The update m/sqrt(v) of a typical element is thus off by a few percent
  // per step: we allow 6% of the mean displacement on average (measured: 3.5%). An element whose 32-bit
  // gradient keeps changing sign barely moves, while a stalled 8-bit moment can push it the same way for tens
  // of steps: the worst element may be off by up to 50 full-size steps (50 * lr = half the largest possible
  // displacement in 100 steps; measured: 31 steps' worth).
  EXPECT_LT(mean, 0.06 * moved);
  EXPECT_LT(worst, 50 * o.lr);
  EXPECT_GT(moved, 0.05);  // the comparison means something: the parameters did move

  // State: one byte per moment plus one f32 absmax per 256-element block: 2 + 8/256 bytes per parameter.
  Params big;
  for (int k = 0; k < kWeights; ++k) big.add(init.list[k].first, *init.list[k].second);
  auto only_big = optim::make_optimizer("adamw_bnb_8bit", big.list, o);
  const double per_param = double(only_big->state_bytes()) / double(kWeights * 64 * 128);
  std::printf("8-bit state: %.4f bytes per parameter (32-bit AdamW: 8)\n", per_param);
  EXPECT_GE(per_param, 2.0);
  EXPECT_LE(per_param, 2.1);
  EXPECT_EQ(adamw->state_bytes(), 8 + 8 * (kWeights * 64 * 128 + 64));
}

TEST(Optim8bit, ThirtyTwoBitStatePathIsAdamW) {
  // bitsandbytes' 32-bit kernel (decay after the step, eps scaled by sqrt(1 - b2^t)) is AdamW up to rounding.
  const LeastSquares problem(1);
  Params a = least_squares_init(1), b = a.clone();
  optim::OptimizerOptions o;
  o.lr = 1e-3;
  o.weight_decay = 0.01;
  auto torch_adamw = optim::make_optimizer("adamw_torch", a.list, o);
  o.args = {{"min_8bit_size", "1000000000"}};
  auto bnb32 = optim::make_optimizer("adamw_8bit", b.list, o);
  for (int s = 0; s < 5; ++s) {
    problem.grads(a);
    problem.grads(b);
    torch_adamw->step();
    bnb32->step();
  }
  for (size_t i = 0; i < a.list.size(); ++i)
    EXPECT_TRUE(test::all_close(*b.list[i].second, *a.list[i].second, 1e-5, 1e-7)) << a.list[i].first;
}

TEST(Optim8bit, SmallTensorsAndEmbeddingsKeep32BitStateAndNonFiniteGradsAreSkipped) {
  Params ps;
  ps.add("h.0.mlp.c_fc.weight", test::randn({64, 80}, 1));        // 5120 >= 4096: 8-bit
  ps.add("h.0.mlp.c_fc.bias", test::randn({80}, 2));              // small: 32-bit
  ps.add("transformer.wte.weight", test::randn({64, 80}, 3));     // embedding: 32-bit
  ps.add("model.embed_tokens.weight", test::randn({64, 80}, 4));  // embedding: 32-bit
  optim::OptimizerOptions o;
  auto opt = optim::make_optimizer("adamw_8bit", ps.list, o);
  std::map<std::string, DType> kinds;
  for (const auto& [k, t] : opt->state_dict()) kinds[k] = t.dtype();
  EXPECT_EQ(kinds.at("state1.h.0.mlp.c_fc.weight"), DType::u8);
  EXPECT_EQ(kinds.at("absmax2.h.0.mlp.c_fc.weight"), DType::f32);
  EXPECT_EQ(kinds.at("state1.h.0.mlp.c_fc.bias"), DType::f32);
  EXPECT_EQ(kinds.at("state2.transformer.wte.weight"), DType::f32);
  EXPECT_EQ(kinds.at("state2.model.embed_tokens.weight"), DType::f32);
  EXPECT_EQ(kinds.count("absmax1.transformer.wte.weight"), 0u);

  // A NaN and an inf in the gradient of the 8-bit tensor: those elements stay, the others move.
  const std::vector<float> before = floats(*ps.list[0].second);
  std::vector<float> g = floats(test::randn({64, 80}, 9));
  g[5] = NAN;
  g[300] = INFINITY;
  autograd::set_grad(*ps.list[0].second, ops::from_vector(g, {64, 80}));
  opt->step();
  const std::vector<float> after = floats(*ps.list[0].second);
  EXPECT_EQ(after[5], before[5]);
  EXPECT_EQ(after[300], before[300]);
  for (size_t i = 0; i < after.size(); ++i) {
    if (i == 5 || i == 300) continue;
    ASSERT_NE(after[i], before[i]) << i;
  }
}

// AdEMAMix in 8-bit state: from zero state its first step is the 32-bit kernel's step bit for bit (every
// state dequantizes to 0 and is updated in the same order), its two EMAs are stored within one code of the
// 32-bit states, and over steps it follows the 32-bit run; the embedding keeps 32-bit state (the same bits).
TEST(OptimElementwise, AdEMAMix8bitFollowsThe32BitKernel) {
  Params a;
  a.add("h.0.mlp.c_fc.weight", test::randn({64, 80}, 31, DType::f32, Device::cpu(), 0.1));  // 20 blocks
  a.add("h.0.mlp.c_fc.bias", test::randn({80}, 32));
  a.add("transformer.wte.weight", test::randn({70, 64}, 33));
  optim::OptimizerOptions o;
  o.lr = 1e-3;
  o.weight_decay = 0.1;
  o.args = optim::parse_optim_args("beta3=0.99,t_alpha=4,t_beta3=6");
  Params p8 = a.clone(), p32 = a.clone();
  auto o8 = optim::make_optimizer("ademamix_8bit", p8.list, o),
       o32 = optim::make_optimizer("ademamix", p32.list, o);
  double drift = 0;
  for (int step = 0; step < 8; ++step) {
    for (Params* ps : {&p8, &p32})
      for (size_t i = 0; i < ps->list.size(); ++i)
        autograd::set_grad(*ps->list[i].second, test::randn(a.list[i].second->shape(), 200 + 7 * step + i));
    o8->step();
    o32->step();
    if (step == 0) {
      EXPECT_EQ(floats(*p8.list[0].second), floats(*p32.list[0].second)) << "the first AdEMAMix step";
      const auto s8 = o8->state_dict(), s32 = o32->state_dict();
      // step; the weight's codes m1, nu, m2 and their absmax; then the 32-bit states
      ASSERT_EQ(s8[3].first, "state3.h.0.mlp.c_fc.weight");
      ASSERT_EQ(s8[6].first, "absmax3.h.0.mlp.c_fc.weight");
      ASSERT_EQ(s32[3].first, "state3.h.0.mlp.c_fc.weight");
      const auto& map = optim::dynamic_map(true);
      for (const auto& [codes_at, absmax_at, full_at] : {std::tuple{1, 4, 1}, std::tuple{3, 6, 3}}) {
        const auto codes = ops::to_vector<uint8_t>(s8[codes_at].second);
        const auto absmax = floats(s8[absmax_at].second), m32 = floats(s32[full_at].second);
        for (size_t j = 0; j < codes.size(); ++j) {
          const float x = m32[j] / absmax[j / 256];
          const float lo = codes[j] > 0 ? map[codes[j] - 1] : -1.0f,
                      hi = codes[j] < 255 ? map[codes[j] + 1] : 1.0f;
          EXPECT_TRUE(x >= lo && x <= hi)
              << s8[codes_at].first << " " << j << ": " << x << " as code " << int(codes[j]);
        }
      }
    }
    const auto w8 = floats(*p8.list[0].second), w32 = floats(*p32.list[0].second);
    for (size_t j = 0; j < w8.size(); ++j) drift = std::max(drift, std::abs(double(w8[j]) - w32[j]));
    EXPECT_EQ(floats(*p8.list[2].second), floats(*p32.list[2].second)) << "embedding, step " << step;
  }
  // A step moves an element by O(lr) (Adam-like normalized); the codes' ~1% error per step keeps the runs
  // within one lr after 8 steps (measured: 0.42 lr).
  EXPECT_LT(drift, o.lr) << "8-bit state far from the 32-bit run";
  EXPECT_GT(drift, 0.0) << "8-bit state gave the 32-bit run's bits: quantization not exercised";
  EXPECT_EQ(o8->state_dict().size(),
            1u + 6u + 3u + 3u);  // step, weight (3 codes + 3 absmax), bias, embedding
}

// bitsandbytes' one-state 8-bit kernel: from zero state the first Lion step is the 32-bit step (the sign of
// (1 - beta1) * g either way), and the stored state dequantizes to within one code of the 32-bit state; over
// steps 8-bit Lion and RMSprop follow their 32-bit runs; small tensors and embeddings keep 32-bit state.
TEST(OptimElementwise, EightBitStateFollowsThe32BitKernels) {
  Params a;
  a.add("h.0.mlp.c_fc.weight", test::randn({64, 80}, 21, DType::f32, Device::cpu(), 0.1));  // 20 blocks
  a.add("h.0.mlp.c_fc.bias", test::randn({80}, 22));
  a.add("transformer.wte.weight", test::randn({70, 64}, 23));  // an embedding: 32-bit state
  optim::OptimizerOptions o;
  o.lr = 1e-3;
  o.weight_decay = 0.1;
  for (const auto& [eight, full] : std::vector<std::pair<std::string, std::string>>{
           {"lion_8bit", "lion_32bit"}, {"rmsprop_bnb_8bit", "rmsprop_bnb"}}) {
    SCOPED_TRACE(eight);
    // bitsandbytes' 8-bit RMSprop divides the raw gradient by the root of a state made from the decayed one
    // (its 32-bit kernel divides the decayed gradient): with decay the runs part where g + wd * p ~ 0.
    o.weight_decay = eight == "lion_8bit" ? 0.1 : 0.0;
    Params p8 = a.clone(), p32 = a.clone();
    auto o8 = optim::make_optimizer(eight, p8.list, o), o32 = optim::make_optimizer(full, p32.list, o);
    double drift = 0;
    for (int step = 0; step < 8; ++step) {
      for (Params* ps : {&p8, &p32})
        for (size_t i = 0; i < ps->list.size(); ++i)
          autograd::set_grad(*ps->list[i].second, test::randn(a.list[i].second->shape(), 100 + 7 * step + i));
      o8->step();
      o32->step();
      if (step == 0 && eight == "lion_8bit") {
        EXPECT_EQ(floats(*p8.list[0].second), floats(*p32.list[0].second)) << "the first Lion step";
        const auto s8 = o8->state_dict(), s32 = o32->state_dict();
        ASSERT_EQ(s8[1].first, "state1.h.0.mlp.c_fc.weight");
        ASSERT_EQ(s8[2].first, "absmax1.h.0.mlp.c_fc.weight");
        const auto codes = ops::to_vector<uint8_t>(s8[1].second);
        const auto absmax = floats(s8[2].second), m32 = floats(s32[1].second);
        const auto& map = optim::dynamic_map(true);
        for (size_t j = 0; j < codes.size(); ++j) {
          const float x = m32[j] / absmax[j / 256];
          const float lo = codes[j] > 0 ? map[codes[j] - 1] : -1.0f,
                      hi = codes[j] < 255 ? map[codes[j] + 1] : 1.0f;
          EXPECT_TRUE(x >= lo && x <= hi) << j << ": " << x << " stored as code " << int(codes[j]);
        }
      }
      const auto w8 = floats(*p8.list[0].second), w32 = floats(*p32.list[0].second);
      double d = 0;
      for (size_t j = 0; j < w8.size(); ++j) d = std::max(d, std::abs(double(w8[j]) - w32[j]));
      drift = std::max(drift, d);
      // the embedding's 32-bit state runs the 32-bit kernel: the same bits
      EXPECT_EQ(floats(*p8.list[2].second), floats(*p32.list[2].second)) << "embedding, step " << step;
    }
    // Lion moves each element by lr per step: an element whose momentum sign differs lands 2 lr away.
    EXPECT_LT(drift, 4 * o.lr) << "8-bit state far from the 32-bit run";
    EXPECT_EQ(o8->state_dict().size(), 1u + 2u + 1u + 1u);  // step, weight codes + absmax, bias, embedding
  }
}

}  // namespace
}  // namespace tr
