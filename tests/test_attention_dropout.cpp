// Attention dropout inside the fused kernels (Backend::attention with AttentionDropout): the CPU's tiled
// sgemm kernel and scalar f64 kernel, CUDA's tiled kernels (f32/f64) and its tensor-core flash kernels
// (bf16/f16) draw the mask the blocked form draws, so output, logsumexp and the three gradients equal the
// blocked form's from the same Philox seed and offset - on shapes that cross the CPU's 64 x 256 tiles and the
// flash kernels' 64 x 64 tiles, with grouped-query heads, key padding, a key cache, a sliding window and head
// dims padded inside the flash kernels. Also: the form rule, and that the mask depends on the offset.
#include <cmath>

#include "backend/cudnn_attention_rule.h"
#include "backend/cuda_api.h"
#include "attention_test_util.h"

namespace tr {
namespace {

struct Case {
  const char* name;
  int64_t B, H, KV, T, S, D;
  bool causal, padded;
  int64_t window = 0;
};

const Case kCases[] = {
    {"causal_gqa_small", 2, 4, 2, 7, 7, 8, true, false},
    {"full_padded_one_empty_row", 3, 2, 2, 5, 6, 16, false, true},
    {"causal_cache_longer_than_queries", 1, 3, 1, 4, 9, 8, true, true},
    {"sliding_window_3_padded", 2, 4, 2, 9, 9, 8, true, true, 3},
    // Past one tile each way: the CPU's 64-query tiles and 256-key blocks, the flash kernels' 64 x 64 tiles
    // and their partial last tiles; head dims 40 and 72 are padded to 64 and 128 inside the flash kernels.
    {"causal_130_queries_300_key_cache", 1, 2, 1, 130, 300, 40, true, true},
    {"causal_gqa_d72", 2, 4, 2, 70, 70, 72, true, false},
    {"full_d64_two_tiles", 1, 2, 2, 100, 129, 64, false, true},
};

Tensor keep_mask(const Case& c) { return test::attention_keep_mask(c.B, c.S, c.padded); }
using test::same_lse;

class FusedAttentionDropout : public ::testing::TestWithParam<std::tuple<Device, DType>> {};

TEST_P(FusedAttentionDropout, MatchesTheBlockedFormFromTheSameSeed) {
  const auto [dev, dt] = GetParam();
  if (dev.is_cuda() && !backend::cuda_available())
    GTEST_SKIP() << "no CUDA GPU here: the CUDA fused attention with dropout NOT tested";
  // The dropped probabilities are scaled by 1 / (1 - p) = 2: f32 sums lose a little more than without.
  const double tol = dt == DType::f64 ? 1e-10 : dt == DType::f32 ? 5e-5 : 4e-2;
  const ops::AttentionDropout drop{0.5, 1234, 777};
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    // The reference: the blocked form in f64 on the CPU, on inputs rounded to the dtype under test.
    auto make = [&](const Shape& s, uint64_t seed) {
      return ops::to_dtype(test::randn(s, seed, dt), DType::f64);
    };
    Tensor q = make({c.B, c.H, c.T, c.D}, 1), k = make({c.B, c.KV, c.S, c.D}, 2),
           v = make({c.B, c.KV, c.S, c.D}, 3), dout = make({c.B, c.H, c.T, c.D}, 4);
    Tensor keep = keep_mask(c);
    auto ref = ops::attention_blocked(q, k, v, keep, c.causal, scale, 0, drop, c.window);
    auto ref_g = ops::attention_blocked_backward(q, k, v, keep, c.causal, scale, ref.out, ref.lse, dout, 0,
                                                 drop, c.window);
    auto on = [&](const Tensor& t) { return ops::to_device(ops::to_dtype(t, dt), dev); };
    Tensor keep_d = keep.defined() ? ops::to_device(keep, dev) : keep;
    const auto fused = ops::AttentionForm::fused;
    auto o = ops::attention(on(q), on(k), on(v), keep_d, c.causal, scale, c.window, fused, drop);
    auto g = ops::attention_backward(on(q), on(k), on(v), keep_d, c.causal, scale, o.out, o.lse, on(dout),
                                     c.window, fused, drop);
    auto cpu = [](const Tensor& t) { return ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f64); };
    EXPECT_TRUE(test::all_close(cpu(o.out), ref.out, tol, tol)) << "out";
    EXPECT_TRUE(same_lse(o.lse, ref.lse, tol));
    EXPECT_TRUE(test::all_close(cpu(g.dq), ref_g.dq, tol, tol)) << "dq";
    EXPECT_TRUE(test::all_close(cpu(g.dk), ref_g.dk, tol, tol)) << "dk";
    EXPECT_TRUE(test::all_close(cpu(g.dv), ref_g.dv, tol, tol)) << "dv";
    // The mask is drawn, not ignored: without dropout the output differs.
    auto plain = ops::attention(q, k, v, keep, c.causal, scale, c.window);
    EXPECT_FALSE(test::all_close(cpu(o.out), plain.out, 0.1, 0.1));
  }
}

// Another Philox offset draws another mask (a replayed CUDA graph moves the offset by the step's shift; the
// CPU replay passes it in the call): the outputs differ, and each equals the blocked form at its offset.
TEST_P(FusedAttentionDropout, TheMaskFollowsTheOffset) {
  const auto [dev, dt] = GetParam();
  if (dev.is_cuda() && !backend::cuda_available())
    GTEST_SKIP() << "no CUDA GPU here: the CUDA fused attention with dropout NOT tested";
  const double tol = dt == DType::f64 ? 1e-10 : dt == DType::f32 ? 5e-5 : 4e-2;
  const int64_t B = 1, H = 2, T = 33, D = 16;
  auto make = [&](const Shape& s, uint64_t seed) {
    return ops::to_dtype(test::randn(s, seed, dt), DType::f64);
  };
  Tensor q = make({B, H, T, D}, 5), k = make({B, H, T, D}, 6), v = make({B, H, T, D}, 7);
  auto on = [&](const Tensor& t) { return ops::to_device(ops::to_dtype(t, dt), dev); };
  auto cpu = [](const Tensor& t) { return ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f64); };
  std::vector<Tensor> outs;
  for (uint64_t offset : {0u, 4u, 1000u}) {
    const ops::AttentionDropout drop{0.2, 99, offset};
    auto o = ops::attention(on(q), on(k), on(v), Tensor(), true, 0.25, 0, ops::AttentionForm::fused, drop);
    auto ref = ops::attention_blocked(q, k, v, Tensor(), true, 0.25, 0, drop, 0);
    EXPECT_TRUE(test::all_close(cpu(o.out), ref.out, tol, tol)) << "offset " << offset;
    outs.push_back(cpu(o.out));
  }
  EXPECT_FALSE(test::all_close(outs[0], outs[1], 1e-3, 1e-3));
  EXPECT_FALSE(test::all_close(outs[1], outs[2], 1e-3, 1e-3));
}

INSTANTIATE_TEST_SUITE_P(DevicesAndDtypes, FusedAttentionDropout,
                         ::testing::Combine(::testing::Values(Device::cpu(), Device::cuda(0)),
                                            ::testing::Values(DType::f64, DType::f32, DType::bf16,
                                                              DType::f16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).is_cpu() ? "cpu_" : "cuda_") +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// The form sdpa takes, by device type, dtype, head dim and dropout: the fused kernels wherever they cover
// the case (the CPU always; on a GPU, for bf16/f16 head dims that are multiples of 8 up to 128, the form
// cuDNN may take, dropout included, else the flash kernels; its tiled kernels for f32/f64 without dropout),
// the blocked form's GEMMs elsewhere.
TEST(AttentionForm, TheRulePicksTheFusedKernelsWhereTheyCoverTheCase) {
  using F = ops::AttentionForm;
  for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16})
    for (bool drop : {false, true}) {
      EXPECT_EQ(ops::attention_form_for(DeviceType::cpu, dt, 64, drop), F::fused);
      EXPECT_EQ(ops::attention_form_for(DeviceType::cpu, dt, 256, drop), F::fused);
    }
  for (DType dt : {DType::bf16, DType::f16})
    for (bool drop : {false, true}) {
      for (int64_t d : {8, 40, 64, 72, 128})
        EXPECT_EQ(ops::attention_form_for(DeviceType::cuda, dt, d, drop), F::fused_cudnn);
      for (int64_t d : {4, 60, 136, 256})
        EXPECT_EQ(ops::attention_form_for(DeviceType::cuda, dt, d, drop), F::blocked);
    }
  for (DType dt : {DType::f32, DType::f64}) {
    EXPECT_EQ(ops::attention_form_for(DeviceType::cuda, dt, 64, false), F::fused);
    EXPECT_EQ(ops::attention_form_for(DeviceType::cuda, dt, 64, true), F::blocked);
  }
}

// A meta dry run standing in for a GPU (form fused_cudnn) counts the workspace cuDNN's attention takes
// there - in the backward the f32 dQ accumulator and row sums, under dropout in either direction the bf16
// keep mask [B, H, T, S], backend/cudnn_attention_rule.h - exactly, taken and given back around the call;
// none where cuDNN declines (a padding mask, causal over a key cache) or for the plain fused form.
TEST(AttentionForm, AMetaDryRunCountsTheWorkspaceOfCudnnsAttention) {
  const Device meta = Device::meta();
  const int64_t B = 2, H = 4, KV = 2, T = 48, D = 16;
  auto make = [&](int64_t heads, int64_t n) { return ops::empty({B, heads, n, D}, DType::bf16, meta); };
  Allocator& a = ops::allocator_for(meta);
  // Bytes the backward (or the forward) holds at its peak beyond what it returns (the gradients, the output).
  auto extra = [&](ops::AttentionForm form, const Tensor& keep, int64_t S, double p, bool backward = true) {
    const Tensor q = make(H, T), k = make(KV, S), v = make(KV, S), out = make(H, T), dout = make(H, T);
    const Tensor lse = ops::empty({B, H, T}, DType::f32, meta);
    a.reset_peak();
    if (!backward) {
      const auto o = ops::attention(q, k, v, keep, true, 0.25, 0, form, {p, 1, 0});
      return a.stats().peak_bytes - a.stats().current_bytes;  // (o still held)
    }
    const auto g = ops::attention_backward(q, k, v, keep, true, 0.25, out, lse, dout, 0, form, {p, 1, 0});
    return a.stats().peak_bytes - a.stats().current_bytes;  // (g still held)
  };
  using F = ops::AttentionForm;
  const int64_t ws = (B * H * T * D * 4 + 255) / 256 * 256 + (B * H * T * 4 + 255) / 256 * 256;
  const int64_t mask = (B * H * T * T * 2 + 255) / 256 * 256;
  EXPECT_EQ(extra(F::fused_cudnn, {}, T, 0.0), ws);
  EXPECT_EQ(extra(F::fused, {}, T, 0.0), 0);
  EXPECT_EQ(extra(F::fused_cudnn, ops::empty({B, T}, DType::boolean, meta), T, 0.0), 0);
  EXPECT_EQ(extra(F::fused_cudnn, {}, T, 0.1), ws + mask);
  EXPECT_EQ(extra(F::fused_cudnn, {}, T, 0.1, false), mask);
  EXPECT_EQ(extra(F::fused_cudnn, {}, T, 0.0, false), 0);
  EXPECT_EQ(extra(F::fused, {}, T, 0.1, false), 0);
  EXPECT_EQ(extra(F::fused_cudnn, {}, T + 8, 0.0), 0);
}

// cuDNN takes attention dropout only through a keep mask it can read: rows 16-byte aligned (keys a multiple
// of 8) and the whole mask at most 1 GiB; without dropout neither limit applies.
TEST(AttentionForm, CudnnTakesDropoutWhereItsMaskFits) {
  auto declines = [](int64_t B, int64_t S, double p) {
    backend::AttentionGeometry g{B, 12, 12, S, S, 64, true, 0.125, nullptr};
    g.with_dropout(p, 1, 0);
    const char* why = backend::cudnn_attention_declines(true, g, 9, true);
    return std::string(why ? why : "");
  };
  EXPECT_EQ(declines(2, 1024, 0.1), "");
  EXPECT_EQ(declines(2, 1020, 0.0), "");
  EXPECT_NE(declines(2, 1020, 0.1).find("multiple of 8"), std::string::npos);
  EXPECT_EQ(declines(43, 1024, 0.0), "");  // 43 x 12 x 1024^2 x 2 bytes: past 1 GiB
  EXPECT_NE(declines(43, 1024, 0.1).find("1 GiB"), std::string::npos);
  EXPECT_EQ(declines(42, 1024, 0.1), "");  // 1,056,964,608 bytes
}

// A bad probability is refused by name in either form.
TEST(FusedAttentionDropoutInput, AProbabilityOutsideZeroToOneIsRefused) {
  Tensor q = test::randn({1, 1, 4, 8}, 1), k = test::randn({1, 1, 4, 8}, 2);
  for (double p : {-0.1, 1.0})
    for (auto form : {ops::AttentionForm::fused, ops::AttentionForm::blocked})
      EXPECT_THROW(ops::attention(q, k, k, Tensor(), true, 0.3, 0, form, {p, 1, 0}), Error) << p;
}

}  // namespace
}  // namespace tr
