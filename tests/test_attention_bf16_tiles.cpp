// The CPU's bf16 fused attention on native bf16 products (backend/cpu/attention_bf16.cpp) - AMX tiles and
// AVX512_BF16 dot products, each this CPU has - against the f64 kernel on the same bf16-rounded inputs:
// output, logsumexp and the three gradients, with and without attention dropout, for shapes that reach every
// edge of the tiling - query tiles that are not multiples of 16, several 256-key blocks, grouped-query heads,
// key padding with a sequence that sees nothing, a key cache longer than the queries, and sliding windows
// whose first key is not on a 32-key boundary. Skipped loudly for the products the CPU (or Linux) lacks.
#include <cmath>
#include <vector>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/bf16_dot.h"
#include "backend/cpu/cpu_backend.h"
#include "test_util.h"

namespace tr {
namespace {

struct Bf16Case {
  const char* name;
  int64_t B, H, KV, T, S, D;
  bool causal, padded;
  int64_t window = 0;
  double dropout = 0;
};

const Bf16Case kCases[] = {
    {"causal_gqa_t100_d64", 2, 4, 2, 100, 100, 64, true, false},
    {"causal_two_key_blocks_t300_d32", 1, 2, 1, 300, 300, 32, true, false},
    {"full_padded_empty_sequence_d64", 2, 2, 2, 37, 270, 64, false, true},
    {"cache_longer_than_queries_d128", 1, 2, 1, 40, 300, 128, true, true},
    {"sliding_window_50_t333_d32", 1, 2, 2, 333, 333, 32, true, false, 50},
    {"dropout_causal_gqa_t100_d64", 2, 4, 2, 100, 100, 64, true, false, 0, 0.2},
    {"dropout_padded_two_key_blocks_d64", 2, 2, 1, 70, 300, 64, true, true, 0, 0.1},
    {"dropout_window_40_t130_d96", 1, 3, 3, 130, 130, 96, true, false, 40, 0.3},
};

// The engines this CPU offers, with the reason for each one it lacks.
std::vector<cpu::Bf16Tiles> engines(std::string& missing) {
  std::vector<cpu::Bf16Tiles> e;
  if (cpu::amx::request_tiles())
    e.push_back(cpu::Bf16Tiles::amx);
  else
    missing += "no AMX tiles on this CPU (or not granted): the AMX products NOT tested. ";
  if (cpu::dpbf16::available())
    e.push_back(cpu::Bf16Tiles::avx512_bf16);
  else
    missing += "no AVX512_BF16 on this CPU: the dot-product path NOT tested. ";
  return e;
}

TEST(AttentionBf16Tiles, NativeProductsMatchTheF64KernelForwardAndBackward) {
  std::string missing;
  const auto tiles = engines(missing);
  if (!missing.empty()) std::fprintf(stderr, "[ SKIPPED PART ] %s\n", missing.c_str());
  if (tiles.empty()) GTEST_SKIP() << missing;
  for (cpu::Bf16Tiles t : tiles)
    for (const Bf16Case& c : kCases) {
      SCOPED_TRACE(std::string(c.name) + (t == cpu::Bf16Tiles::amx ? " amx" : " avx512_bf16"));
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      const backend::AttentionDropout drop{c.dropout, 1234, 77};
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
      const auto F = ops::AttentionForm::fused;
      const auto ref = ops::attention(q, k, v, keep, c.causal, scale, c.window, F, drop);
      const auto ref_g =
          ops::attention_backward(q, k, v, keep, c.causal, scale, ref.out, ref.lse, dout, c.window, F, drop);
      auto bf = [](const Tensor& x) { return ops::to_dtype(x, DType::bf16); };
      const Tensor qb = bf(q), kb = bf(k), vb = bf(v), db = bf(dout);
      Tensor out = ops::zeros({c.B, c.H, c.T, c.D}, DType::bf16), lse = ops::zeros({c.B, c.H, c.T}),
             dq = ops::zeros(q.shape(), DType::bf16), dk = ops::zeros(k.shape(), DType::bf16),
             dv = ops::zeros(v.shape(), DType::bf16);
      backend::AttentionGeometry g{
          c.B,     c.H, c.KV, c.T, c.S, c.D, c.causal, scale, keep.defined() ? keep.data<bool>() : nullptr,
          c.window};
      g.with_dropout(drop.p, drop.seed, drop.offset).dense_rows();
      cpu::attention_bf16_forward(t, g, qb.data<BFloat16>(), kb.data<BFloat16>(), vb.data<BFloat16>(),
                                  out.data<BFloat16>(), lse.data<float>());
      cpu::attention_bf16_backward(t, g, qb.data<BFloat16>(), kb.data<BFloat16>(), vb.data<BFloat16>(),
                                   out.data<BFloat16>(), lse.data<float>(), db.data<BFloat16>(),
                                   dq.data<BFloat16>(), dk.data<BFloat16>(), dv.data<BFloat16>());
      auto f64 = [](const Tensor& x) { return ops::to_dtype(x, DType::f64); };
      // bf16 outputs (2^-9 relative) after bf16-rounded probabilities and dS: the bf16 attention bound.
      const double tol = 3e-2;
      EXPECT_TRUE(test::all_close(f64(out), ref.out, tol, tol)) << "out";
      EXPECT_TRUE(test::all_close(f64(lse), ref.lse, 1e-3, 1e-3)) << "lse";
      EXPECT_TRUE(test::all_close(f64(dq), ref_g.dq, tol, tol)) << "dq";
      EXPECT_TRUE(test::all_close(f64(dk), ref_g.dk, tol, tol)) << "dk";
      EXPECT_TRUE(test::all_close(f64(dv), ref_g.dv, tol, tol)) << "dv";
      if (c.padded) {  // the sequence that sees nothing: zero output, lse -inf, no gradient
        for (double x : test::values(ops::narrow(out, 0, c.B - 1, 1))) ASSERT_EQ(x, 0.0);
        for (double x : test::values(ops::narrow(lse, 0, c.B - 1, 1))) ASSERT_TRUE(std::isinf(x) && x < 0);
        for (double x : test::values(ops::narrow(dq, 0, c.B - 1, 1))) ASSERT_EQ(x, 0.0);
      }
    }
}

// The dot-product GEMM on its own against f64 sums of the same bf16 values: row-major A and A given as the
// rounded pairs of its transpose, every column-block width (16 to 64 plus a remainder), accumulation.
TEST(AttentionBf16Tiles, DotProductGemmMatchesF64Sums) {
  if (!cpu::dpbf16::available())
    GTEST_SKIP() << "no AVX512_BF16 on this CPU: the dot-product GEMM NOT tested";
  const int64_t M = 12, K = 38;
  for (int64_t N : {16, 32, 48, 64, 112}) {
    SCOPED_TRACE(N);
    const auto a = test::values(test::randn({M, K}, 5, DType::bf16));
    const auto b = test::values(test::randn({K, N}, 6, DType::bf16));
    std::vector<float> af(a.begin(), a.end()), c0(static_cast<size_t>(M * N), 0.5f), at(K * M);
    std::vector<BFloat16> arows(a.size()), bpairs(static_cast<size_t>(K * N)), apairs(at.size() + 64);
    for (size_t i = 0; i < a.size(); ++i) arows[i] = BFloat16(static_cast<float>(a[i]));
    std::vector<float> bf(b.begin(), b.end());
    cpu::dpbf16::pack_pairs_rounded(bf.data(), N, K, N, K, N, bpairs.data());  // B itself as pairs
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < K; ++j) at[j * M + i] = af[i * K + j];
    cpu::dpbf16::pack_pairs_rounded(at.data(), M, K, M, K, M, apairs.data());  // pairs of A^T
    std::vector<float> c_rows = c0, c_t = c0;
    cpu::dpbf16::gemm(M, N, K, arows.data(), K / 2, 1, bpairs.data(), 2 * N, c_rows.data(), N, true);
    cpu::dpbf16::gemm(M, N, K, apairs.data(), 1, M, bpairs.data(), 2 * N, c_t.data(), N, false);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double ref = 0;
        for (int64_t kk = 0; kk < K; ++kk) ref += a[i * K + kk] * b[kk * N + j];
        ASSERT_NEAR(c_rows[i * N + j], ref + 0.5, 1e-4 * (1 + std::abs(ref))) << i << "," << j;
        ASSERT_NEAR(c_t[i * N + j], ref, 1e-4 * (1 + std::abs(ref))) << i << "," << j;
      }
  }
}

}  // namespace
}  // namespace tr
