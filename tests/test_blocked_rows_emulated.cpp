// The CUDA kernels of blocked attention's rows (backend/cuda/blocked_rows.cuh) and of dropout
// (backend/cuda/dropout_packs.cuh) run on the CPU through tests/cuda_emulator.h, against their CPU twins
// (CpuBackend::attention_block_softmax / attention_block_grad / dropout) on the same inputs: the row kernels
// with causal masks, key caches, windows, padded keys and a batch that sees nothing, grouped heads, dropout
// with a CUDA graph's Philox shift, rows held in registers and rows walked in a loop (more than 1,024 keys),
// f32 and f64 scores into f32, bf16, f16 and f64 probabilities - the same dropout mask exactly, values within
// rounding; dropout in 16-byte packs and its tail - bit for bit. The GPU runs them in the CUDA parity tests.
#include "cuda_emulator.h"  // first: the CUDA built-ins the kernels' headers expect

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/blocked_rows.cuh"
#include "backend/cuda/dropout_packs.cuh"
#include "emulated_tensors.h"
#include "ops/ops.h"

namespace tr {
namespace {

namespace bk = cuda::blocked_emulated;
namespace dk = cuda::drop_emulated;

using test::bytes_of;
using test::dtype_of;
using test::value;

struct BlockCase {
  int64_t B, H, KV, T, S, t0, tq, sk;
  bool causal;
  int64_t window;
  bool padded;  // key s % 7 == 5 hidden; batch 1 (when there is one) sees no key at all
  double dropout;
  uint64_t shift;  // a CUDA graph's Philox shift (the CPU gets it in its offset)
};

std::string name_of(const BlockCase& c) {
  return fmt::format(
      "B{} H{} KV{} T{} S{} t0 {} tq {} sk {} causal {} window {} padded {} dropout {} shift {}", c.B, c.H,
      c.KV, c.T, c.S, c.t0, c.tq, c.sk, c.causal, c.window, c.padded, c.dropout, c.shift);
}

// The worst relative difference of got from want (scaled by the largest |want|, at least 1e-30), and that
// both are zero at the same elements (the dropout and visibility masks) and infinite at the same ones.
template <typename P>
void expect_close(const char* what, const std::vector<P>& got, const Tensor& want_t, double tol) {
  const std::vector<P> want = bytes_of<P>(want_t);
  ASSERT_EQ(got.size(), want.size());
  double scale = 1e-30, worst = 0;
  for (const P& w : want)
    if (std::isfinite(value(w))) scale = std::max(scale, std::fabs(value(w)));
  size_t zeros_differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = value(got[i]), w = value(want[i]);
    if ((g == 0.0) != (w == 0.0) || std::isinf(g) != std::isinf(w)) {
      if (zeros_differ++ == 0) first = i;
      continue;
    }
    if (std::isfinite(w)) worst = std::max(worst, std::fabs(g - w) / scale);
    if (std::isnan(g) != std::isnan(w)) worst = INFINITY;
  }
  EXPECT_EQ(zeros_differ, 0u) << what << ": zero/infinite elements differ, first at " << first << " (got "
                              << value(got[first]) << ", want " << value(want[first]) << ")";
  EXPECT_LE(worst, tol) << what;
}

template <typename A, typename P>
void run_block_case(const BlockCase& c) {
  SCOPED_TRACE(name_of(c) +
               fmt::format(" scores {} probs {}", dtype_name(dtype_of<A>()), dtype_name(dtype_of<P>())));
  const int64_t rows = c.B * c.H * c.tq;
  Generator gen(29);
  const DType adt = dtype_of<A>(), pdt = dtype_of<P>();
  const Tensor scores = ops::to_dtype(ops::affine(ops::randn({rows, c.sk}, gen), 3.0, 0.0), adt);
  const Tensor dp = ops::to_dtype(ops::randn({rows, c.sk}, gen), adt);
  const Tensor delta = ops::to_dtype(ops::affine(ops::randn({rows}, gen), 0.5, 0.0), adt);
  std::vector<uint8_t> keep_bytes(static_cast<size_t>(c.B * c.S), 1);
  if (c.padded) {
    for (int64_t s = 0; s < c.S; ++s) keep_bytes[static_cast<size_t>(s)] = s % 7 != 5;
    if (c.B > 1) std::fill(keep_bytes.begin() + c.S, keep_bytes.begin() + 2 * c.S, 0);
  }
  Tensor keep;
  if (c.padded) {
    keep = ops::empty({c.B, c.S}, DType::boolean);
    std::memcpy(keep.data_ptr(), keep_bytes.data(), keep_bytes.size());
  }
  const double scale = 0.125;
  const uint64_t seed = 4242, offset = 31;
  backend::Backend::AttentionBlock a{c.B, c.H, c.KV, c.T, c.S, c.t0, c.tq, c.sk, c.causal, scale, keep};
  a.dropout = c.dropout, a.seed = seed, a.offset = offset + c.shift, a.window = c.window;

  // The CPU twin.
  backend::Backend& cpu = backend::backend_for(Device::cpu());
  const Tensor probs = ops::empty({rows, c.sk}, pdt), lse = ops::empty({rows}, adt);
  cpu.attention_block_softmax(scores, a, probs, lse);
  const Tensor gprobs = ops::empty({rows, c.sk}, pdt), dscores = ops::empty({rows, c.sk}, pdt);
  cpu.attention_block_grad(scores, dp, lse, delta, a, gprobs, dscores);

  // The kernels, on the same inputs (the CPU's lse into the backward, as the GPU's own forward would give).
  const bk::BlockRows br{backend::AttentionGeometry{c.B, c.H, c.KV, c.T, c.S, 0, c.causal, scale,
                                                    c.padded ? keep.data<bool>() : nullptr, c.window},
                         c.H / c.KV * c.tq,
                         c.t0,
                         c.tq,
                         c.sk,
                         static_cast<float>(c.dropout),
                         1.0 / (1.0 - c.dropout),
                         seed,
                         offset,
                         nullptr};
  bk::BlockRows brs = br;
  const uint64_t shift = c.shift;
  if (c.shift) brs.shift = &shift;
  const std::vector<A> x = bytes_of<A>(scores), g = bytes_of<A>(dp), l = bytes_of<A>(lse),
                       d = bytes_of<A>(delta);
  std::vector<P> p(static_cast<size_t>(rows * c.sk), cuda::from_acc<P>(cuda::acc_t<P>(NAN)));
  std::vector<A> lg(static_cast<size_t>(rows), A(NAN));
  const int threads = bk::row_threads(c.sk);
  emu::launch(static_cast<unsigned>(rows), threads, 32 * sizeof(double),
              [&] { bk::block_softmax_kernel<A, P>(brs, x.data(), p.data(), lg.data()); });
  std::vector<P> gp(p.size(), cuda::from_acc<P>(cuda::acc_t<P>(NAN))), ds = gp;
  emu::launch(static_cast<unsigned>(rows), threads, 0, [&] {
    bk::block_grad_kernel<A, P>(brs, x.data(), g.data(), l.data(), d.data(), gp.data(), ds.data());
  });

  // Half probabilities differ by at most a unit of their rounding (the sums run in another order).
  const double tol = std::is_same_v<P, double>          ? 1e-13
                     : std::is_same_v<P, float>         ? 1e-5
                     : std::is_same_v<P, __nv_bfloat16> ? 1.0 / 128
                                                        : 1.0 / 1024;
  expect_close("lse", lg, lse, std::is_same_v<A, double> ? 1e-13 : 1e-6);
  expect_close("probs", p, probs, tol);
  expect_close("backward probs", gp, gprobs, tol);
  expect_close("dscores", ds, dscores, tol);
  // The mask was drawn: visible keys of rows that see something were dropped (not a test that cannot fail
  // for want of a mask), and no hidden key was kept.
  int64_t dropped = 0, hidden_kept = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < c.sk; ++s) {
      const bool zero = value(gp[static_cast<size_t>(r * c.sk + s)]) == 0.0;
      const bool seen = br.g.visible(br.batch(r), br.query(r), s);
      dropped += seen && zero && std::isfinite(value(l[static_cast<size_t>(r)]));
      hidden_kept += !seen && !zero;
    }
  EXPECT_EQ(hidden_kept, 0);
  if (c.dropout > 0) {
    EXPECT_GT(dropped, 0);
  }
}

const BlockCase kBlockCases[] = {
    // rows in registers (sk <= 4 x threads)
    {1, 2, 1, 40, 40, 8, 16, 40, true, 0, false, 0.0, 0},   // causal, grouped heads
    {2, 4, 2, 24, 24, 0, 8, 24, true, 0, true, 0.2, 3},     // padding, a batch that sees nothing, shift
    {1, 2, 2, 64, 64, 32, 16, 48, true, 8, false, 0.1, 0},  // a sliding window
    {1, 2, 2, 16, 80, 0, 16, 80, true, 0, true, 0.3, 7},    // a key cache (S > T)
    {1, 3, 1, 12, 12, 4, 4, 12, false, 0, false, 0.5, 0},   // not causal, multi-query heads
    // rows walked in a loop (more keys than 4 x 256 threads)
    {1, 1, 1, 4, 1100, 0, 4, 1100, false, 0, true, 0.1, 0},
    {2, 1, 1, 1030, 1030, 1020, 2, 1030, true, 0, true, 0.25, 11},  // causal rows at the end, one batch blind
};

TEST(BlockedRowsEmulated, TheRowKernelsGiveTheCpuTwinsProbabilitiesAndGradients) {
  for (const BlockCase& c : kBlockCases) {
    run_block_case<float, float>(c);
    run_block_case<float, __nv_bfloat16>(c);
    run_block_case<float, __half>(c);
    run_block_case<double, double>(c);
  }
}

// dropout_packs_kernel against the CPU backend's dropout: the same bits, packs and tail, with a shift.
template <typename T>
void check_dropout(int64_t n, double p, uint64_t shift, unsigned grid) {
  SCOPED_TRACE(fmt::format("{} elements of {}, p {}, shift {}, grid {}", n, dtype_name(dtype_of<T>()), p,
                           shift, grid));
  Generator gen(5);
  const DType dt = dtype_of<T>();
  const Tensor x = ops::to_dtype(ops::affine(ops::randn({n}, gen), 2.0, 0.5), dt);
  const Tensor y = ops::empty({n}, dt);
  const uint64_t seed = 777, offset = 40;
  backend::backend_for(Device::cpu()).dropout(x, p, seed, offset + shift, y);

  const std::vector<T> in = bytes_of<T>(x);
  std::vector<T> out(in.size(), cuda::from_acc<T>(cuda::acc_t<T>(NAN)));
  constexpr int V = static_cast<int>(16 / sizeof(T));  // the launcher's pack: 16 bytes
  const auto scale = static_cast<cuda::acc_t<T>>(1.0 / (1.0 - p));
  const uint64_t word = shift;
  emu::launch(grid, 64, 0, [&] {
    dk::dropout_packs_kernel<V, T>(in.data(), out.data(), n, static_cast<float>(p), scale, seed, offset,
                                   shift ? &word : nullptr);
  });
  EXPECT_EQ(0, std::memcmp(out.data(), y.data_ptr(), out.size() * sizeof(T)));
  // The functor the unaligned path maps, element by element: the same bits too.
  const dk::DropoutF<T> f{static_cast<float>(p), scale, seed, offset, shift ? &word : nullptr};
  std::vector<T> one(in.size());
  for (int64_t i = 0; i < n; ++i) one[static_cast<size_t>(i)] = f(i, in[static_cast<size_t>(i)]);
  EXPECT_EQ(0, std::memcmp(one.data(), y.data_ptr(), one.size() * sizeof(T)));
}

TEST(BlockedRowsEmulated, DropoutPacksGiveTheCpuMaskBitForBit) {
  for (const int64_t n : {int64_t{1000}, int64_t{1003}, int64_t{5}, int64_t{8 * 301 + 7}})
    for (const uint64_t shift : {uint64_t{0}, uint64_t{9}}) {
      check_dropout<float>(n, 0.1, shift, 3);
      check_dropout<__nv_bfloat16>(n, 0.3, shift, 2);
      check_dropout<__half>(n, 0.5, shift, 1);  // one block: the grid-stride loop takes every pack
    }
}

// keep_mask_packs_kernel (cuDNN attention's dropout mask) against the CPU backend's dropout of ones: 1
// exactly where the CPU keeps an element, 0 where it drops it - packs, tail and a graph's shift.
template <typename T>
void check_keep_mask(int64_t n, double p, uint64_t shift, unsigned grid) {
  SCOPED_TRACE(fmt::format("{} elements of {}, p {}, shift {}, grid {}", n, dtype_name(dtype_of<T>()), p,
                           shift, grid));
  const DType dt = dtype_of<T>();
  const Tensor ones = ops::full({n}, 1.0, dt), y = ops::empty({n}, dt);
  const uint64_t seed = 91, offset = 12;
  backend::backend_for(Device::cpu()).dropout(ones, p, seed, offset + shift, y);
  const std::vector<T> dropped = bytes_of<T>(y);
  std::vector<T> mask(static_cast<size_t>(n), cuda::from_acc<T>(cuda::acc_t<T>(NAN)));
  constexpr int V = static_cast<int>(16 / sizeof(T));
  const uint64_t word = shift;
  emu::launch(grid, 64, 0, [&] {
    dk::keep_mask_packs_kernel<V, T>(mask.data(), n, static_cast<float>(p), seed, offset,
                                     shift ? &word : nullptr);
  });
  int64_t kept = 0;
  for (size_t i = 0; i < mask.size(); ++i) {
    const double m = static_cast<double>(cuda::to_acc(mask[i]));
    const bool cpu_keeps = cuda::to_acc(dropped[i]) != 0;
    ASSERT_EQ(m, cpu_keeps ? 1.0 : 0.0) << "element " << i;
    kept += cpu_keeps;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, n);  // both outcomes drawn: a mask of all ones would pass the rest
}

TEST(BlockedRowsEmulated, TheKeepMaskIsTheCpuDropoutsMask) {
  for (const int64_t n : {int64_t{1000}, int64_t{1003}, int64_t{8 * 301 + 7}})
    for (const uint64_t shift : {uint64_t{0}, uint64_t{9}}) {
      check_keep_mask<__nv_bfloat16>(n, 0.1, shift, 2);
      check_keep_mask<__half>(n, 0.5, shift, 1);
      check_keep_mask<float>(n, 0.3, shift, 3);
    }
}

}  // namespace
}  // namespace tr
