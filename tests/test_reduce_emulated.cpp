// The CUDA column reductions' own source (backend/cuda/reduce_kernels.cuh) run on the CPU through
// tests/cuda_emulator.h: sum, mean, max and min over [outer, r, inner] in bf16, f16, f32 and f64 - the packed
// pass 1 (16-byte rows, eight rows in flight) gives the scalar pass 1's partials bit for bit for the same
// chunks, and the two passes give the CPU backend's reduction (bit for bit in the half types, whose f64 sums
// are exact; within a unit of rounding in f32); the norms' weight and bias gradients likewise, packed against
// scalar (bit for bit but in f64, where either may fuse a multiply-add) and against an f64 reference. The
// chunks are the launchers' own (pass1_chunks, chosen by layout: aligned and unaligned data, the same bits).
// The GPU runs them in the CUDA parity tests.
#include "cuda_emulator.h"  // first: the CUDA built-ins the kernels' header expects

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/reduce_kernels.cuh"
#include "emulated_tensors.h"
#include "ops/ops.h"

namespace tr {
namespace {

namespace rd = cuda::red_emulated;
using Op = backend::ReduceOp;

using test::bytes_of;
using test::dtype_of;
using test::value;

// The grid-stride kernels run on a small grid (two blocks of 64 threads): every thread walks many outputs.
template <typename F>
void run(F&& kernel) {
  emu::launch(2, 64, 0, kernel);
}

template <typename T>
void check_reduce(Op op, int64_t outer, int64_t r, int64_t inner, bool special = false) {
  SCOPED_TRACE(fmt::format("op {} over [{}, {}, {}] of {}{}", static_cast<int>(op), outer, r, inner,
                           dtype_name(dtype_of<T>()), special ? " with NaN and infinities" : ""));
  Generator gen(3);
  Tensor x = ops::to_dtype(ops::affine(ops::randn({outer, r, inner}, gen), 2.0, 0.25), DType::f64);
  if (special) {  // NaN in column 1, +inf in column 2, -inf in column 3 (of the first outer)
    double* v = x.data<double>();
    v[1 * inner + 1] = NAN, v[5 * inner + 2] = INFINITY, v[7 * inner + 3] = -INFINITY;
  }
  x = ops::to_dtype(x, dtype_of<T>());
  const int64_t m = outer * inner;
  const Tensor want = ops::empty({outer, inner}, dtype_of<T>());
  backend::backend_for(Device::cpu()).reduce(op, x, outer, r, inner, want);

  constexpr int V = static_cast<int>(16 / sizeof(T));
  ASSERT_EQ(inner % V, 0) << "a case for the packed pass";
  const int64_t chunks = rd::pass1_chunks(m, r, inner, V), chunk = (r + chunks - 1) / chunks;  // reduce.cu's
  ASSERT_GT(chunks, 1) << "a case for the two passes";
  const std::vector<T> in = bytes_of<T>(x);
  // The packed pass (aligned data) and the scalar one (the same layout unaligned): the same partials.
  std::vector<double> packed(static_cast<size_t>(m * chunks), NAN), scalar = packed;
  run([&] {
    rd::reduce_packs_partial_kernel<T, V>(op, in.data(), packed.data(), outer, r, inner, chunk, chunks);
  });
  run([&] { rd::reduce_partial_kernel<T>(op, in.data(), scalar.data(), outer, r, inner, chunk, chunks); });
  EXPECT_EQ(0, std::memcmp(packed.data(), scalar.data(), packed.size() * sizeof(double)))
      << "the packed partials differ from the scalar ones";
  std::vector<T> got(static_cast<size_t>(m), cuda::from_acc<T>(cuda::acc_t<T>(NAN)));
  run([&] { rd::reduce_combine_kernel<T>(op, packed.data(), got.data(), m, r, chunks); });
  const std::vector<T> ref = bytes_of<T>(want);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = value(got[i]), w = value(ref[i]);
    ASSERT_EQ(std::isnan(g), std::isnan(w)) << "output " << i << ": " << g << " against " << w;
    if (std::isnan(w)) continue;
    if constexpr (sizeof(T) == 2) {  // exact f64 sums: the same bits
      EXPECT_EQ(0, std::memcmp(&got[i], &ref[i], sizeof(T)))
          << "output " << i << ": " << g << " against " << w;
    } else if (std::isinf(w)) {
      EXPECT_EQ(g, w) << "output " << i;
    } else {
      worst = std::max(worst, std::fabs(g - w) / std::max(1e-30, std::fabs(w)));
    }
  }
  EXPECT_LE(worst, (std::is_same_v<T, double> ? 1e-15 : 1.2e-7));
}

TEST(ReduceEmulated, PackedColumnSumsGiveTheScalarPartialsAndTheCpuResults) {
  for (Op op : {Op::sum, Op::mean, Op::max, Op::min}) {
    check_reduce<__nv_bfloat16>(op, 1, 1000, 96);  // a bias gradient's shape: one outer, long rows
    check_reduce<__half>(op, 1, 517, 40);          // rows not a multiple of the eight in flight
    check_reduce<float>(op, 3, 300, 20);           // several outers
    check_reduce<double>(op, 2, 700, 6);
    check_reduce<__nv_bfloat16>(op, 2, 300, 16, true);  // NaN and infinities as on the CPU
    check_reduce<float>(op, 1, 200, 8, true);
  }
}

// The norms' weight and bias gradients: gw[j] = sum_r gy xhat, gb[j] = sum_r gy.
template <typename T>
void check_norm_params(int64_t rows, int64_t n, bool rms) {
  SCOPED_TRACE(
      fmt::format("{} rows of {} {}, {}", rows, n, dtype_name(dtype_of<T>()), rms ? "rms" : "layer"));
  using A = cuda::acc_t<T>;
  Generator gen(8);
  const std::vector<T> x = bytes_of<T>(ops::to_dtype(ops::randn({rows, n}, gen), dtype_of<T>()));
  const std::vector<T> gy = bytes_of<T>(ops::to_dtype(ops::randn({rows, n}, gen), dtype_of<T>()));
  std::mt19937 g(11);
  std::uniform_real_distribution<double> u(-0.5, 0.5);
  std::vector<A> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) mean[r] = static_cast<A>(u(g)), rstd[r] = static_cast<A>(1.5 + u(g));
  const A* mp = rms ? nullptr : mean.data();
  constexpr int V = static_cast<int>(16 / sizeof(T));
  const int64_t chunks = rd::pass1_chunks(n, rows, n, V), chunk = (rows + chunks - 1) / chunks;  // nn.cu's
  std::vector<double> packed(static_cast<size_t>(2 * n * chunks), NAN), scalar = packed;
  run([&] {
    rd::norm_param_packs_partial_kernel<T, V>(x.data(), mp, rstd.data(), gy.data(), packed.data(), rows, n,
                                              chunk, chunks);
  });
  run([&] {
    rd::norm_param_partial_kernel<T>(x.data(), mp, rstd.data(), gy.data(), scalar.data(), rows, n, chunk,
                                     chunks);
  });
  if constexpr (std::is_same_v<T, double>) {  // f64: the compiler may contract gy * xhat + aw in either
    for (size_t i = 0; i < packed.size(); ++i)
      EXPECT_NEAR(packed[i], scalar[i], 1e-12 * std::max(1.0, std::fabs(scalar[i]))) << i;
  } else {  // the product rounds to f32 before the f64 sum: nothing to contract
    EXPECT_EQ(0, std::memcmp(packed.data(), scalar.data(), packed.size() * sizeof(double)));
  }
  std::vector<T> gw(static_cast<size_t>(n)), gb(static_cast<size_t>(n));
  run([&] { rd::norm_param_combine_kernel<T>(packed.data(), gw.data(), gb.data(), n, chunks); });
  double worst = 0;
  for (int64_t j = 0; j < n; ++j) {
    double w = 0, b = 0, scale = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double gv = value(gy[r * n + j]), xh = (value(x[r * n + j]) - (rms ? 0.0 : mean[r])) * rstd[r];
      w += gv * xh, b += gv, scale += std::fabs(gv * xh) + std::fabs(gv);
    }
    worst = std::max({worst, std::fabs(value(gw[j]) - w) / scale, std::fabs(value(gb[j]) - b) / scale});
  }
  EXPECT_LE(worst, sizeof(T) == 2 ? 1.0 / 256 : 1e-6);
}

TEST(ReduceEmulated, PackedNormParameterGradientsGiveTheScalarPartials) {
  check_norm_params<__nv_bfloat16>(600, 64, false);
  check_norm_params<__half>(333, 24, true);
  check_norm_params<float>(500, 12, false);
  check_norm_params<double>(300, 4, true);
  check_norm_params<__nv_bfloat16>(50, 32, false);  // few rows: one chunk
}

}  // namespace
}  // namespace tr
