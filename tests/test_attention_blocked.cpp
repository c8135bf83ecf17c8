// Blocked attention (ops::attention_blocked, what a GPU runs in bf16/f16) against the fused CPU kernel: the
// outputs, the logsumexp and all three gradients, for causal and full attention, grouped-query heads, key
// padding (including a sequence with no key at all), a key cache longer than the queries, sliding windows,
// and block sizes that do not divide T. On the CPU here; on a GPU as well when one is present (skipped loudly
// otherwise).
#include <omp.h>

#include <cmath>

#include "backend/cuda_api.h"
#include "attention_test_util.h"

namespace tr {
namespace {

struct Case {
  const char* name;
  int64_t B, H, KV, T, S, D;
  bool causal, padded;
  int64_t block;
  int64_t window = 0;  // sliding window (causal)
};

const Case kCases[] = {
    {"causal_gqa_blocks_of_3", 2, 4, 2, 7, 7, 8, true, false, 3},
    {"full_padded_one_empty_row", 3, 2, 2, 5, 6, 4, false, true, 2},
    {"causal_cache_longer_than_queries", 1, 3, 1, 4, 9, 8, true, true, 3},
    {"causal_single_block", 2, 2, 1, 6, 6, 16, true, false, 0},
    {"sliding_window_3_padded", 2, 4, 2, 9, 9, 8, true, true, 4, 3},
    {"sliding_window_2_cache", 1, 2, 1, 4, 9, 8, true, false, 3, 2},
    // Rows of hundreds of keys (the GPU row kernels' 256 threads, keys held in registers) and of more keys
    // than registers hold (4 x 256: the GPU's three-pass path), with padding and nothing-visible rows.
    {"causal_600_key_cache", 3, 2, 2, 24, 600, 8, true, true, 16},
    {"full_1100_keys_padded", 3, 2, 1, 3, 1100, 8, false, true, 2},
};

Tensor keep_mask(const Case& c) { return test::attention_keep_mask(c.B, c.S, c.padded); }
using test::same_lse;
std::vector<double> host(const Tensor& t) { return test::host_values(t); }

class AttentionBlocked : public ::testing::TestWithParam<std::tuple<Device, DType>> {};

TEST_P(AttentionBlocked, MatchesTheFusedKernelForwardAndBackward) {
  const auto [dev, dt] = GetParam();
  if (dev.is_cuda() && !backend::cuda_available())
    GTEST_SKIP() << "no CUDA GPU here: blocked attention NOT tested";
  const double tol = dt == DType::f64 ? 1e-10 : dt == DType::f32 ? 2e-5 : 3e-2;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    // References from the fused CPU kernel in f64 on inputs rounded to the dtype under test.
    auto make = [&](const Shape& s, uint64_t seed) {
      return ops::to_dtype(test::randn(s, seed, dt), DType::f64);
    };
    Tensor q = make({c.B, c.H, c.T, c.D}, 1), k = make({c.B, c.KV, c.S, c.D}, 2),
           v = make({c.B, c.KV, c.S, c.D}, 3), dout = make({c.B, c.H, c.T, c.D}, 4);
    Tensor keep = keep_mask(c);
    auto ref = ops::attention(q, k, v, keep, c.causal, scale, c.window);
    auto ref_g = ops::attention_backward(q, k, v, keep, c.causal, scale, ref.out, ref.lse, dout, c.window);
    auto on = [&](const Tensor& t) { return ops::to_device(ops::to_dtype(t, dt), dev); };
    Tensor keep_d = keep.defined() ? ops::to_device(keep, dev) : keep;
    auto o = ops::attention_blocked(on(q), on(k), on(v), keep_d, c.causal, scale, c.block, {}, c.window);
    auto g = ops::attention_blocked_backward(on(q), on(k), on(v), keep_d, c.causal, scale, o.out, o.lse,
                                             on(dout), c.block, {}, c.window);
    auto cpu = [](const Tensor& t) { return ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f64); };
    EXPECT_TRUE(test::all_close(cpu(o.out), ref.out, tol, tol)) << "out";
    EXPECT_TRUE(same_lse(o.lse, ref.lse, tol));
    EXPECT_TRUE(test::all_close(cpu(g.dq), ref_g.dq, tol, tol)) << "dq";
    EXPECT_TRUE(test::all_close(cpu(g.dk), ref_g.dk, tol, tol)) << "dk";
    EXPECT_TRUE(test::all_close(cpu(g.dv), ref_g.dv, tol, tol)) << "dv";
  }
}

// Attention dropout through the blocked form (and the fused kernel) draws the mask dropout() draws on the
// [B, H, T, S] probabilities: output and gradients equal eager attention (softmax, dropout, matmul) from the
// same generator state, and the generator advances alike.
TEST_P(AttentionBlocked, DropoutMatchesEagerAttentionFromTheSameGenerator) {
  const auto [dev, dt] = GetParam();
  if (dev.is_cuda() && !backend::cuda_available())
    GTEST_SKIP() << "no CUDA GPU here: blocked attention NOT tested";
  const double tol = dt == DType::f64 ? 1e-10 : dt == DType::f32 ? 2e-5 : 3e-2;
  const int64_t B = 2, H = 2, T = 6, D = 8;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D)), p = 0.3;
  auto make = [&](const Shape& sh, uint64_t seed) {
    return ops::to_dtype(test::randn(sh, seed, dt), DType::f64);
  };
  Tensor q = make({B, H, T, D}, 11), k = make({B, H, T, D}, 12), v = make({B, H, T, D}, 13),
         dout = make({B, H, T, D}, 14);
  // Reference: eager attention in f64 on the CPU.
  Tensor causal = ops::zeros({T, T}, DType::boolean);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s2 = t + 1; s2 < T; ++s2) causal.data<bool>()[t * T + s2] = true;
  Generator g1(7);
  g1.set_state({7, 100});
  Tensor rq = ops::clone(q), rk = ops::clone(k), rv = ops::clone(v);
  for (Tensor* t : {&rq, &rk, &rv}) autograd::set_requires_grad(*t, true);
  Tensor probs = softmax(masked_fill(mul_scalar(matmul(rq, rk, false, true), scale), causal, -INFINITY), -1);
  Tensor ref = matmul(dropout(probs, p, g1, true), rv);
  autograd::backward({ref}, {dout});
  for (const auto form : {ops::AttentionForm::blocked, ops::AttentionForm::fused}) {
    SCOPED_TRACE(form == ops::AttentionForm::blocked ? "blocked" : "fused");
    // From the same generator state.
    Generator g2(7);
    g2.set_state({7, 100});
    auto on = [&](const Tensor& t) {  // a leaf of its own per form (f64 on the CPU would be q itself)
      Tensor x = ops::clone(ops::to_device(ops::to_dtype(t, dt), dev));
      autograd::set_requires_grad(x, true);
      return x;
    };
    Tensor bq = on(q), bk = on(k), bv = on(v);
    Tensor out = scaled_dot_product_attention(bq, bk, bv, Tensor(), true, scale, p, &g2, 0, form);
    autograd::backward({out}, {ops::to_device(ops::to_dtype(dout, dt), dev)});
    EXPECT_EQ(g2.state().offset, g1.state().offset);
    auto cpu = [](const Tensor& t) { return ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f64); };
    EXPECT_TRUE(test::all_close(cpu(out), ops::to_dtype(ref, DType::f64), tol, tol)) << "out";
    EXPECT_TRUE(test::all_close(cpu(bq.grad()), rq.grad(), tol, tol)) << "dq";
    EXPECT_TRUE(test::all_close(cpu(bk.grad()), rk.grad(), tol, tol)) << "dk";
    EXPECT_TRUE(test::all_close(cpu(bv.grad()), rv.grad(), tol, tol)) << "dv";
    // Dropout really dropped: the result differs from attention without it.
    auto plain = ops::attention(ops::to_dtype(q, DType::f64), ops::to_dtype(k, DType::f64),
                                ops::to_dtype(v, DType::f64), Tensor(), true, scale);
    EXPECT_FALSE(test::all_close(cpu(out), plain.out, 1e-3, 1e-3));
  }
}

// A dry run on the meta device allocates what the blocked form allocates on the CPU, forward and backward:
// score blocks, probabilities, row copies (trainer estimate's peak counts them where a device takes the
// blocked form: a GPU's f32 with attention dropout, half-precision head dims the flash kernels do not cover).
// Three query blocks, the last partial; with padding and dropout.
TEST(AttentionBlockedMemory, TheMetaDryRunPeaksAsTheCpuRun) {
  const int64_t B = 2, H = 4, KV = 2, T = 40, S = 40, D = 16, block = 16;
  const double scale = 0.25;
  for (DType dt : {DType::f32, DType::bf16}) {
    for (double p : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " dropout " + std::to_string(p));
      auto peak = [&](Device dev) {
        auto make = [&](const Shape& sh, uint64_t seed) {
          return dev.is_meta() ? ops::empty(sh, dt, dev) : ops::to_dtype(test::randn(sh, seed), dt);
        };
        Tensor q = make({B, H, T, D}, 1), k = make({B, KV, S, D}, 2), v = make({B, KV, S, D}, 3),
               dout = make({B, H, T, D}, 4);
        Tensor keep = ops::full({B, S}, 1.0, DType::boolean, dev);
        Allocator& a = ops::allocator_for(dev);
        const int64_t base = a.stats().current_bytes;
        a.reset_peak();
        const ops::AttentionDropout drop{p, 7, 0};
        auto o = ops::attention_blocked(q, k, v, keep, true, scale, block, drop, 0);
        auto g =
            ops::attention_blocked_backward(q, k, v, keep, true, scale, o.out, o.lse, dout, block, drop, 0);
        return a.stats().peak_bytes - base;
      };
      const int64_t cpu = peak(Device::cpu()), meta = peak(Device::meta());
      EXPECT_EQ(meta, cpu);
      // More than the outputs and gradients alone: the score blocks are in it.
      EXPECT_GT(meta, 4 * B * H * T * D * static_cast<int64_t>(dtype_size(dt)) + B * H * block * S * 4);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DevicesAndDtypes, AttentionBlocked,
                         ::testing::Combine(::testing::Values(Device::cpu(), Device::cuda(0)),
                                            ::testing::Values(DType::f64, DType::f32, DType::bf16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).is_cpu() ? "cpu_" : "cuda_") +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// The CPU fused kernel for f32/bf16/f16 (sgemm tiles of 64 queries x 256 keys, attention_gemm.cpp) against
// the scalar f64 kernel, on shapes that cross its tile and block edges: several query tiles with a partial
// last one, several key blocks, a key cache longer than the queries, grouped-query heads, a sliding window
// across block edges, padded keys and a sequence with nothing to attend. Then: one thread or two, the same
// bits (each (batch, kv head) group runs on one thread, products sequential).
TEST(CpuFusedAttention, TiledSgemmKernelMatchesTheF64Kernel) {
  struct Big {
    const char* name;
    int64_t B, H, KV, T, S, D;
    bool causal, padded;
    int64_t window;
  };
  const Big cases[] = {
      {"causal_3_tiles_3_blocks_cache", 1, 4, 2, 130, 600, 40, true, false, 0},
      {"causal_gqa_padded", 3, 4, 1, 200, 200, 64, true, true, 0},
      {"full_padded_empty_row", 3, 2, 2, 70, 300, 16, false, true, 0},
      {"window_300_across_blocks", 1, 2, 2, 520, 520, 32, true, false, 300},
  };
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const double tol = dt == DType::f32 ? 2e-5 : 3e-2;
    for (const Big& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " " + std::string(dtype_name(dt)));
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      auto make = [&](const Shape& s, uint64_t seed) {
        return ops::to_dtype(test::randn(s, seed, dt), DType::f64);
      };
      Tensor q = make({c.B, c.H, c.T, c.D}, 21), k = make({c.B, c.KV, c.S, c.D}, 22),
             v = make({c.B, c.KV, c.S, c.D}, 23), dout = make({c.B, c.H, c.T, c.D}, 24);
      Tensor keep;
      if (c.padded) {
        keep = ops::full({c.B, c.S}, 1.0, DType::boolean);
        bool* kp = keep.data<bool>();
        for (int64_t s = 0; s < c.S; s += 7) kp[s] = false;  // batch 0: scattered padding
        for (int64_t s = 0; s < c.S; ++s) kp[2 * c.S + s] = c.causal && s > 150;  // batch 2: none or a tail
      }
      const auto ref = ops::attention(q, k, v, keep, c.causal, scale, c.window);
      const auto ref_g =
          ops::attention_backward(q, k, v, keep, c.causal, scale, ref.out, ref.lse, dout, c.window);
      auto in = [&](const Tensor& t) { return ops::to_dtype(t, dt); };
      auto run = [&] {
        auto o = ops::attention(in(q), in(k), in(v), keep, c.causal, scale, c.window);
        auto g = ops::attention_backward(in(q), in(k), in(v), keep, c.causal, scale, o.out, o.lse, in(dout),
                                         c.window);
        return std::pair{o, g};
      };
      const auto [o, g] = run();
      auto f64 = [](const Tensor& t) { return ops::to_dtype(t, DType::f64); };
      EXPECT_TRUE(test::all_close(f64(o.out), ref.out, tol, tol)) << "out";
      EXPECT_TRUE(same_lse(o.lse, ref.lse, tol));
      EXPECT_TRUE(test::all_close(f64(g.dq), ref_g.dq, tol, tol)) << "dq";
      EXPECT_TRUE(test::all_close(f64(g.dk), ref_g.dk, tol, tol)) << "dk";
      EXPECT_TRUE(test::all_close(f64(g.dv), ref_g.dv, tol, tol)) << "dv";
      const int threads = omp_get_max_threads();
      omp_set_num_threads(threads == 1 ? 2 : 1);
      const auto [o2, g2] = run();
      omp_set_num_threads(threads);
      for (auto [a, b] :
           {std::pair{o.out, o2.out}, {o.lse, o2.lse}, {g.dq, g2.dq}, {g.dk, g2.dk}, {g.dv, g2.dv}})
        EXPECT_EQ(host(a), host(b)) << "bits differ between 1 and 2 threads";
    }
  }
}

}  // namespace
}  // namespace tr
