// The CPU backend's bf16 GEMM paths against an f64 reference of the same bf16 inputs: oneDNN's native matmul
// (on CPUs with AVX512_BF16 or AMX; skipped elsewhere) and the widened sgemm path every CPU runs, over
// transposes, alpha, beta, a broadcast batch, and f32 or bf16 outputs. Also: the AVX-512 row kernels of the
// cross-entropy equal the AVX2 ones bit for bit (vec_math512.h); transposing copies (the tiled path of
// CpuBackend::copy) equal a transpose made on the host and converted contiguously.
#include <cmath>
#include <cstring>
#include <random>
#include <functional>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul_native.h"
#include "backend/cpu/vec_math512.h"
#include "test_util.h"

namespace tr {
namespace {

struct Case {
  bool ta, tb;
  int64_t batch, m, n, k;
  double alpha, beta;
  bool broadcast_b;
  DType out;
};

// op(x) of a [batch?, r, c] tensor as f64 values, row-major.
double at(const std::vector<double>& v, int64_t base, int64_t i, int64_t j, int64_t ld, bool t) {
  return t ? v[base + j * ld + i] : v[base + i * ld + j];
}

backend::GemmArgs make(const Case& c, const Tensor& a, const Tensor& b, const Tensor& out) {
  backend::GemmArgs g;
  g.a = a, g.b = b, g.c = out;
  g.trans_a = c.ta, g.trans_b = c.tb;
  g.batch = c.batch, g.m = c.m, g.n = c.n, g.k = c.k;
  g.lda = c.ta ? c.m : c.k, g.ldb = c.tb ? c.k : c.n;
  g.stride_a = c.m * c.k, g.stride_b = c.broadcast_b ? 0 : c.k * c.n;
  g.alpha = c.alpha, g.beta = c.beta;
  return g;
}

// Checks c = alpha op(a) op(b) + beta c0 within f32 accumulation error (f32 out) or one bf16 rounding of it.
void check(const Case& c, const std::function<void(const backend::GemmArgs&)>& gemm, const char* path) {
  const Tensor a = test::randn({c.batch, c.ta ? c.k : c.m, c.ta ? c.m : c.k}, 1, DType::bf16);
  const Tensor b =
      test::randn({c.broadcast_b ? 1 : c.batch, c.tb ? c.n : c.k, c.tb ? c.k : c.n}, 2, DType::bf16);
  const Tensor c0 = test::randn({c.batch, c.m, c.n}, 3, c.out);
  Tensor out = ops::clone(c0);  // beta reads it
  gemm(make(c, a, b, out));
  const auto av = test::values(a), bv = test::values(b), cv = test::values(c0), ov = test::values(out);
  double worst = 0;
  for (int64_t p = 0; p < c.batch; ++p)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0, mag = 0;
        for (int64_t q = 0; q < c.k; ++q) {
          const double x = at(av, p * c.m * c.k, i, q, c.ta ? c.m : c.k, c.ta);
          const double y = at(bv, (c.broadcast_b ? 0 : p) * c.k * c.n, q, j, c.tb ? c.k : c.n, c.tb);
          sum += x * y;
          mag += std::abs(x * y);
        }
        const int64_t o = (p * c.m + i) * c.n + j;
        const double want = c.alpha * sum + c.beta * cv[o];
        const double scale = std::abs(c.alpha) * mag + std::abs(c.beta * cv[o]);
        // f32 accumulation: ~k * 2^-24 of the magnitudes; a bf16 output adds half an ulp (2^-9) of the value.
        const double bound =
            1e-6 * c.k * scale + (c.out == DType::bf16 ? std::ldexp(std::abs(want), -8) : 0) + 1e-30;
        worst = std::max(worst, std::abs(ov[o] - want) / bound);
      }
  EXPECT_LE(worst, 1.0) << path << " ta " << c.ta << " tb " << c.tb << " batch " << c.batch << " m " << c.m
                        << " n " << c.n << " k " << c.k << " alpha " << c.alpha << " beta " << c.beta
                        << " out " << dtype_name(c.out);
}

const std::vector<Case> kCases = {
    {false, false, 1, 64, 96, 80, 1.0, 0.0, false, DType::f32},
    {false, true, 1, 33, 257, 130, 1.0, 0.0, false, DType::f32},  // the head's x W^T, odd sizes
    {true, false, 1, 130, 40, 33, 1.0, 1.0, false, DType::f32},   // dW += dy^T x
    {false, false, 3, 17, 31, 64, 0.5, 0.0, false, DType::bf16},  // batched, alpha, bf16 out
    {true, true, 2, 24, 40, 48, 2.0, -0.5, false, DType::bf16},   // beta reads a bf16 c
    {false, false, 4, 16, 24, 32, 1.0, 0.0, true, DType::bf16},   // one b for every batch
};

TEST(CpuBf16Gemm, NativeMatmulMatchesTheF64Reference) {
  cpu::NativeMatmul native;
  if (!native.has_bf16()) GTEST_SKIP() << "this CPU has no bf16 instructions (AVX512_BF16 / AMX)";
  for (const Case& c : kCases)
    check(
        c, [&](const backend::GemmArgs& g) { ASSERT_TRUE(native.run(g)) << "oneDNN declined"; }, "native");
}

TEST(CpuBf16Gemm, WidenedAndDispatchedPathsMatchTheF64Reference) {
  for (const Case& c : kCases)
    check(
        c, [](const backend::GemmArgs& g) { cpu::cpu_backend().gemm(g); }, "backend");
}

// An f16 or f32 operand is not the native path's: it declines without writing.
TEST(CpuBf16Gemm, NativeMatmulDeclinesOtherDtypes) {
  cpu::NativeMatmul native;
  const Tensor a = test::randn({8, 8}, 1, DType::f16), c = ops::zeros({8, 8});
  const Case k{false, false, 1, 8, 8, 8, 1.0, 0.0, false, DType::f32};
  EXPECT_FALSE(native.run(make(k, a, a, c)));
  EXPECT_EQ(test::values(c), std::vector<double>(64, 0.0));
}

}  // namespace
// Bit for bit: rows of every length 0..80 (16-lane body, 8-lane and scalar tails) and 50257, logits with
// huge, tiny, infinite and NaN entries, against the AVX2 kernels the other CPUs run.
TEST(VecMath512, RowKernelsEqualTheAvx2OnesBitForBit) {
  if (!cpu::cpu_has_avx512f()) GTEST_SKIP() << "no AVX-512F on this CPU";
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 8.0f);
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 80; ++n) lengths.push_back(n);
  lengths.push_back(50257);
  for (int trial = 0; trial < 3; ++trial)
    for (int64_t n : lengths) {
      std::vector<float> a(static_cast<size_t>(n));
      for (auto& x : a) x = nd(rng);
      if (n > 5 && trial == 1) a[3] = 200.0f, a[n - 1] = -200.0f, a[n / 2] = INFINITY;
      if (n > 5 && trial == 2) a[n - 2] = NAN;
      const float m2 = cpu::row_max(a.data(), n), m5 = cpu::row_max_512(a.data(), n);
      ASSERT_TRUE(bits(m2) == bits(m5) || (std::isnan(m2) && std::isnan(m5))) << "row_max n=" << n;
      const float shift = std::isfinite(m2) ? m2 : 0.0f;
      std::vector<float> o2(a.size()), o5(a.size());
      const float s2 = cpu::exp_sum(a.data(), shift, o2.data(), n);
      const float s5 = cpu::exp_sum_512(a.data(), shift, o5.data(), n);
      ASSERT_TRUE(bits(s2) == bits(s5) || (std::isnan(s2) && std::isnan(s5))) << "exp_sum n=" << n;
      cpu::exp_scale(a.data(), shift, 0.37f, o2.data(), n);
      cpu::exp_scale_512(a.data(), shift, 0.37f, o5.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_TRUE(bits(o2[i]) == bits(o5[i]) || (std::isnan(o2[i]) && std::isnan(o5[i])))
            << "exp_scale n=" << n << " i=" << i;
    }
}

// Copies between a transposed view and a contiguous tensor take CpuBackend::copy's tiled path (64 x 64
// tiles through an L1 buffer, rows converted as a contiguous run): both directions, same and other dtypes,
// sizes off the tile (70 x 130), one tile, thin ones and one past the threading threshold, with NaN, Inf,
// subnormals and rounding ties among the values. The reference: the transpose made on the host, converted by
// the contiguous path, bits compared.
TEST(CpuKernels, TransposingCopiesEqualAHostTransposeConvertedContiguously) {
  Generator g(5);
  const float specials[] = {std::nanf(""), INFINITY, -INFINITY, 1e-40f, -3e-39f, 1.00390625f, 0.0f, -0.0f};
  for (const auto& [r, c] :
       {std::pair<int64_t, int64_t>{70, 130}, {64, 64}, {16, 300}, {300, 17}, {256, 1000}}) {
    std::vector<float> v = ops::to_vector<float>(ops::randn({r, c}, g));
    for (size_t i = 0; i < std::size(specials); ++i) v[i * 37 % v.size()] = specials[i];
    std::vector<float> vt(v.size());  // [c, r]
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) vt[static_cast<size_t>(j * r + i)] = v[static_cast<size_t>(i * c + j)];
    for (const DType from : {DType::f32, DType::bf16, DType::f64})
      for (const DType to : {DType::f32, DType::bf16, DType::f16}) {
        const Tensor x = ops::to_dtype(ops::from_vector<float>(v, {r, c}), from);
        const Tensor want = ops::to_dtype(ops::to_dtype(ops::from_vector<float>(vt, {c, r}), from), to);
        // Read transposed: a transpose made contiguous, in `to`.
        const Tensor read = ops::empty({c, r}, to);
        ops::copy_(read, ops::transpose(x, 0, 1));
        // Written transposed: x into the transposed view of a [c, r] tensor.
        const Tensor written = ops::empty({c, r}, to);
        ops::copy_(ops::transpose(written, 0, 1), x);
        const std::string what = fmt::format("{}x{} {} -> {}", r, c, dtype_name(from), dtype_name(to));
        EXPECT_EQ(std::memcmp(read.data_ptr(), want.data_ptr(), want.nbytes()), 0) << what << " read";
        EXPECT_EQ(std::memcmp(written.data_ptr(), want.data_ptr(), want.nbytes()), 0) << what << " written";
      }
  }
}

// scaled_copy_ (the LM head's dw, scaled by the loss's gradient and turned back into the weight's layout) has
// the bits of the multiply, then the copy: in registers 16 x 16 (bf16 on AVX-512), through the L1 tile
// (f16), or as the two ops (f32, a contiguous destination), with specials, subnormal products and edges.
TEST(CpuKernels, AScaledCopyIsTheMultiplyThenTheCopy) {
  Generator g(6);
  const float specials[] = {std::nanf(""), INFINITY, -INFINITY, 1e-40f, -3e-39f, 1.00390625f, 0.0f, -0.0f};
  for (const auto& [r, c] :
       {std::pair<int64_t, int64_t>{70, 130}, {64, 64}, {16, 300}, {300, 17}, {256, 1000}})
    for (const float scale : {0.5f, 3e-39f, 1.0f / 3.0f}) {
      std::vector<float> v = ops::to_vector<float>(ops::randn({r, c}, g));
      for (size_t i = 0; i < std::size(specials); ++i) v[i * 37 % v.size()] = specials[i];
      const Tensor s = ops::full({}, scale, DType::f32);
      const Tensor scaled = ops::binary(ops::BinaryOp::mul, ops::from_vector<float>(v, {r, c}), s);
      for (const DType to : {DType::bf16, DType::f16, DType::f32}) {
        const std::string what = fmt::format("{}x{} x {} -> {}", r, c, scale, dtype_name(to));
        const Tensor want = ops::to_dtype(ops::contiguous(ops::transpose(scaled, 0, 1)), to);
        const Tensor got = ops::empty({c, r}, to);
        ops::scaled_copy_(ops::transpose(got, 0, 1), ops::from_vector<float>(v, {r, c}), s);
        EXPECT_EQ(std::memcmp(got.data_ptr(), want.data_ptr(), want.nbytes()), 0) << what << " transposed";
        const Tensor plain = ops::empty({r, c}, to);
        ops::scaled_copy_(plain, ops::from_vector<float>(v, {r, c}), s);
        const Tensor want_plain = ops::to_dtype(scaled, to);
        EXPECT_EQ(std::memcmp(plain.data_ptr(), want_plain.data_ptr(), want_plain.nbytes()), 0) << what;
      }
    }
  // Refused with the op's name: a scale of another dtype, a shape that differs.
  EXPECT_THROW(ops::scaled_copy_(ops::empty({2, 3}), ops::zeros({2, 3}), ops::ones({}, DType::f64)), Error);
  EXPECT_THROW(ops::scaled_copy_(ops::empty({3, 2}), ops::zeros({2, 3}), ops::ones({})), Error);
  const Tensor x = ops::zeros({2, 3});  // a scale or destination inside x, which the op consumes
  EXPECT_THROW(
      ops::scaled_copy_(ops::empty({2, 3}), x, ops::reshape(ops::narrow(ops::reshape(x, {6}), 0, 0, 1), {})),
      Error);
  EXPECT_THROW(ops::scaled_copy_(x, x, ops::ones({})), Error);
}

}  // namespace tr
