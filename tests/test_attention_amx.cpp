// The CPU's bf16 fused attention on AMX tiles (backend/cpu/attention_amx.cpp) against the f64 kernel on the
// same bf16-rounded inputs: output, logsumexp and the three gradients, for shapes that reach every edge of
// the tiling - query tiles that are not multiples of 16, several 256-key blocks, grouped-query heads, key
// padding with a sequence that sees nothing, a key cache longer than the queries, and sliding windows whose
// first key is not on a 32-key boundary. Skipped loudly where the CPU (or Linux) gives no AMX tiles.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "test_util.h"

namespace tr {
namespace {

struct AmxCase {
  const char* name;
  int64_t B, H, KV, T, S, D;
  bool causal, padded;
  int64_t window = 0;
};

const AmxCase kAmxCases[] = {
    {"causal_gqa_t100_d64", 2, 4, 2, 100, 100, 64, true, false},
    {"causal_two_key_blocks_t300_d32", 1, 2, 1, 300, 300, 32, true, false},
    {"full_padded_empty_sequence_d64", 2, 2, 2, 37, 270, 64, false, true},
    {"cache_longer_than_queries_d128", 1, 2, 1, 40, 300, 128, true, true},
    {"sliding_window_50_t333_d32", 1, 2, 2, 333, 333, 32, true, false, 50},
};

TEST(AttentionAmx, Bf16TilesMatchTheF64KernelForwardAndBackward) {
  if (!cpu::cpu_backend().amx_attention(64))
    GTEST_SKIP() << "no AMX tiles on this CPU (or not granted): the AMX attention kernel NOT tested";
  for (const AmxCase& c : kAmxCases) {
    SCOPED_TRACE(c.name);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    auto make = [&](const Shape& s, uint64_t seed) {
      return ops::to_dtype(test::randn(s, seed, DType::bf16), DType::f64);
    };
    Tensor q = make({c.B, c.H, c.T, c.D}, 1), k = make({c.B, c.KV, c.S, c.D}, 2),
           v = make({c.B, c.KV, c.S, c.D}, 3), dout = make({c.B, c.H, c.T, c.D}, 4);
    Tensor keep;
    if (c.padded) {
      keep = ops::full({c.B, c.S}, 1.0, DType::boolean);
      bool* kk = keep.data<bool>();
      kk[3] = kk[c.S / 2] = false;                                        // batch 0: two padded keys
      for (int64_t s = 0; s < c.S; ++s) kk[(c.B - 1) * c.S + s] = false;  // the last: nothing to attend
    }
    const auto ref = ops::attention(q, k, v, keep, c.causal, scale, c.window);
    const auto ref_g =
        ops::attention_backward(q, k, v, keep, c.causal, scale, ref.out, ref.lse, dout, c.window);
    auto bf = [](const Tensor& t) { return ops::to_dtype(t, DType::bf16); };
    const auto o = ops::attention(bf(q), bf(k), bf(v), keep, c.causal, scale, c.window);
    const auto g =
        ops::attention_backward(bf(q), bf(k), bf(v), keep, c.causal, scale, o.out, o.lse, bf(dout), c.window);
    auto f64 = [](const Tensor& t) { return ops::to_dtype(t, DType::f64); };
    // bf16 outputs (2^-9 relative) after bf16-rounded probabilities and dS: the bf16 attention bound.
    const double tol = 3e-2;
    EXPECT_TRUE(test::all_close(f64(o.out), ref.out, tol, tol)) << "out";
    EXPECT_TRUE(test::all_close(f64(o.lse), ref.lse, 1e-3, 1e-3)) << "lse";
    EXPECT_TRUE(test::all_close(f64(g.dq), ref_g.dq, tol, tol)) << "dq";
    EXPECT_TRUE(test::all_close(f64(g.dk), ref_g.dk, tol, tol)) << "dk";
    EXPECT_TRUE(test::all_close(f64(g.dv), ref_g.dv, tol, tol)) << "dv";
    if (c.padded) {  // the sequence that sees nothing: zero output, lse -inf, no gradient
      const auto out_last = test::values(ops::narrow(o.out, 0, c.B - 1, 1));
      for (double x : out_last) ASSERT_EQ(x, 0.0);
      const auto lse_last = test::values(ops::narrow(o.lse, 0, c.B - 1, 1));
      for (double x : lse_last) ASSERT_TRUE(std::isinf(x) && x < 0);
      const auto dq_last = test::values(ops::narrow(g.dq, 0, c.B - 1, 1));
      for (double x : dq_last) ASSERT_EQ(x, 0.0);
    }
  }
}

}  // namespace
}  // namespace tr
