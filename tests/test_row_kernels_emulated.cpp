// The CUDA row kernels' own source (backend/cuda/row_kernels.cuh) run on the CPU through
// tests/cuda_emulator.h: cross-entropy's loss, gradient and fused loss+gradient (in place, padded rows,
// tails, ignored rows, bad labels, NaN and inf logits, f32 logits with a half gradient) and the warp-per-row
// LayerNorm / RMSNorm forward and backward (fused residual, with and without weight and bias, every pack
// count) against f64 references, plus the invariants the launchers rely on: the fused kernel's loss bits are
// the loss kernel's, its gradient bits the gradient kernel's, in place equals out of place. The GPU runs them
// in the CUDA parity tests (CudaOps.*).
#include "cuda_emulator.h"  // first: the CUDA built-ins the kernels' header expects

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/row_kernels.cuh"

namespace tr {
namespace {

namespace rk = cuda::rows_emulated;

template <typename T>
T from_double(double v) {
  T r;
  cuda::st(&r, 0, static_cast<cuda::acc_t<T>>(v));
  return r;
}
template <typename T>
double to_double(T v) {
  return static_cast<double>(cuda::ld(&v, 0));
}
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
template <typename T>
std::string type_name() {
  if constexpr (std::is_same_v<T, float>) return "f32";
  if constexpr (std::is_same_v<T, double>) return "f64";
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return "bf16";
  return "f16";
}
// Half a unit in the last place of T, relative: what one rounding to T may cost.
template <typename T>
double half_ulp() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return std::ldexp(1.0, -8);
  if constexpr (std::is_same_v<T, __half>) return std::ldexp(1.0, -11);
  if constexpr (std::is_same_v<T, float>) return std::ldexp(1.0, -24);
  return std::ldexp(1.0, -53);
}

// ---- cross-entropy

struct CeCase {
  int64_t rows, v, ldx;
  int threads;
  int64_t ldg;  // the gradient's row stride (ldx: in place possible)
};

template <typename T, typename G>
struct CeRun {
  std::vector<cuda::acc_t<T>> loss, lse;
  std::vector<G> grad;
  int64_t bad[3] = {0, cuda::kBadNone, 0};
};

// Packs as the launcher decides them (nn.cu launch_ce): the loss pass from the logits alone, the gradient
// written in packs only when its rows are on pack boundaries too.
template <rk::CeMode kMode, typename T, typename G>
void launch_ce(const CeCase& c, T* logits, const std::vector<int64_t>& labels,
               const std::vector<cuda::acc_t<T>>& gl, bool packed, CeRun<T, G>& out, G* glogits, int64_t ldg,
               double smoothing) {
  const bool px = packed && rk::ce_packable<T, G>(logits, c.ldx, nullptr, 0);
  const bool pg = px && glogits && rk::ce_packable(logits, c.ldx, glogits, ldg);
  rk::CeRows<T, G> a{logits,
                     c.ldx,
                     labels.data(),
                     out.loss.data(),
                     out.lse.data(),
                     gl.data(),
                     glogits,
                     ldg,
                     c.v,
                     -100,
                     out.bad,
                     px,
                     pg,
                     static_cast<cuda::acc_t<T>>(smoothing)};
  emu::launch(static_cast<unsigned>(c.rows), c.threads, 64 * sizeof(double),
              [&] { rk::cross_entropy_rows_kernel<kMode, T, G>(a); });
}

template <typename T, typename G>
void check_ce(const CeCase& c, bool packed, uint32_t seed, double e = 0) {
  using A = cuda::acc_t<T>;
  SCOPED_TRACE(fmt::format("{} logits, {} gradient: rows {} v {} ldx {} threads {} packed {} smoothing {}",
                           type_name<T>(), type_name<G>(), c.rows, c.v, c.ldx, c.threads, packed, e));
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 3.0);
  std::vector<T> logits(static_cast<size_t>(c.rows * c.ldx), from_double<T>(NAN));  // padding: a read shows
  std::vector<int64_t> labels(static_cast<size_t>(c.rows));
  std::vector<A> gl(static_cast<size_t>(c.rows));
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.v; ++i)
      logits[static_cast<size_t>(r * c.ldx + i)] = from_double<T>(normal(gen));
    // Rows: label 0, the last logit (in the tail when v is not whole packs), ignored, out of range, others.
    labels[static_cast<size_t>(r)] = r == 0   ? 0
                                     : r == 1 ? c.v - 1
                                     : r == 2 ? -100
                                     : r == 3 ? c.v + 3
                                              : r * 7 % c.v;
    gl[static_cast<size_t>(r)] = static_cast<A>(0.25 + 0.5 * static_cast<double>(r));
  }
  const auto rows = static_cast<size_t>(c.rows);
  auto fresh = [&] {
    CeRun<T, G> run;
    run.loss.assign(rows, static_cast<A>(NAN));
    run.lse.assign(rows, static_cast<A>(NAN));
    run.grad.assign(static_cast<size_t>(c.rows * c.ldg), from_double<G>(NAN));
    return run;
  };
  CeRun<T, G> loss_only = fresh(), grad_only = fresh(), both = fresh();
  launch_ce<rk::CeMode::loss, T, G>(c, logits.data(), labels, gl, packed, loss_only, nullptr, 0, e);
  grad_only.lse = loss_only.lse;
  launch_ce<rk::CeMode::grad, T, G>(c, logits.data(), labels, gl, packed, grad_only, grad_only.grad.data(),
                                    c.ldg, e);
  launch_ce<rk::CeMode::both, T, G>(c, logits.data(), labels, gl, packed, both, both.grad.data(), c.ldg, e);

  // The fused kernel's loss and lse are the loss kernel's bits, its gradient the gradient kernel's.
  EXPECT_TRUE(same_bits(both.loss, loss_only.loss));
  EXPECT_TRUE(same_bits(both.lse, loss_only.lse));
  EXPECT_TRUE(same_bits(both.grad, grad_only.grad));
  if constexpr (std::is_same_v<T, G>) {  // in place: the gradient over the logits, the same bits
    if (c.ldg == c.ldx) {
      std::vector<T> in_place = logits;
      CeRun<T, G> run = fresh();
      launch_ce<rk::CeMode::both, T, G>(c, in_place.data(), labels, gl, packed, run, in_place.data(), c.ldx,
                                        e);
      EXPECT_TRUE(same_bits(run.loss, loss_only.loss));
      for (int64_t r = 0; r < c.rows; ++r)
        EXPECT_EQ(0, std::memcmp(in_place.data() + r * c.ldx, both.grad.data() + r * c.ldg, c.v * sizeof(T)))
            << "row " << r;
    }
  }
  // A bad label is flagged; the ignored and bad rows have loss 0 and a zero gradient.
  EXPECT_EQ(both.bad[1], cuda::kBadLabel);
  EXPECT_EQ(both.bad[0], c.v + 3);
  EXPECT_EQ(both.bad[2], c.v);
  EXPECT_EQ(grad_only.bad[1], cuda::kBadNone);  // the gradient alone reports nothing: the loss did

  const double tol_g = std::max(half_ulp<G>() * 2, 1e-6);
  // Below f16's normal range its spacing is absolute (2^-24): the floor of the comparison.
  const double floor = std::is_same_v<G, __half> ? 1e-3 : 1e-6;
  double worst_loss = 0, worst_grad = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    const int64_t label = labels[static_cast<size_t>(r)];
    const bool skip = label == -100 || label < 0 || label >= c.v;
    const double g = static_cast<double>(gl[static_cast<size_t>(r)]);
    double m = -INFINITY, s = 0, sx = 0;
    for (int64_t i = 0; i < c.v; ++i) m = std::max(m, to_double(logits[static_cast<size_t>(r * c.ldx + i)]));
    for (int64_t i = 0; i < c.v; ++i) {
      s += std::exp(to_double(logits[static_cast<size_t>(r * c.ldx + i)]) - m);
      sx += to_double(logits[static_cast<size_t>(r * c.ldx + i)]);
    }
    const double lse = m + std::log(s), off = g * e / static_cast<double>(c.v);
    // Label smoothing: the cross-entropy against (1 - e) * onehot + e / v.
    const double want_loss =
        skip ? 0
             : (1 - e) * (lse - to_double(logits[static_cast<size_t>(r * c.ldx + label)])) +
                   e * (lse - sx / static_cast<double>(c.v));
    worst_loss =
        std::max(worst_loss, std::fabs(static_cast<double>(both.loss[static_cast<size_t>(r)]) - want_loss));
    if (!skip)
      worst_loss =
          std::max(worst_loss, std::fabs(static_cast<double>(both.lse[static_cast<size_t>(r)]) - lse));
    else
      EXPECT_EQ(static_cast<double>(both.lse[static_cast<size_t>(r)]), 0.0);
    for (int64_t i = 0; i < c.v; ++i) {
      const size_t at = static_cast<size_t>(r * c.ldx + i);
      const double p =
          skip ? 0 : g * std::exp(to_double(logits[at]) - lse) - off - (i == label ? g * (1 - e) : 0);
      const double got = to_double(both.grad[static_cast<size_t>(r * c.ldg + i)]);
      if (skip) {
        ASSERT_EQ(got, 0.0) << "row " << r << " element " << i;
      }
      // (Measured against the softmax part where smoothing's e / v cancels it.)
      worst_grad = std::max(worst_grad, std::fabs(got - p) / (std::fabs(p) + off + floor * g));
    }
    for (int64_t i = c.v; i < c.ldg; ++i)  // padding is never written
      ASSERT_TRUE(std::isnan(to_double(both.grad[static_cast<size_t>(r * c.ldg + i)])));
  }
  EXPECT_LT(worst_loss, 2e-5 * std::log(static_cast<double>(c.v)) * (std::is_same_v<A, double> ? 1e-8 : 1));
  EXPECT_LT(worst_grad, tol_g + (std::is_same_v<A, double> ? 0 : 1e-5));
}

const CeCase kCeCases[] = {
    {6, 1000, 1000, 128, 1000},     // whole packs
    {7, 4099, 4104, 128, 4104},     // padded rows, a tail of 3 (f32) / 3 (half)
    {7, 4099, 4104, 128, 4099},     // padded logits, a dense gradient: packed reads, element writes
    {5, 13, 13, 64, 13},            // shorter than a pack per thread; unaligned rows
    {6, 50257, 50304, 128, 50304},  // GPT-2's head: padded to 64
};

TEST(RowKernelsEmulated, CrossEntropyLossGradientAndBothAgree) {
  for (const CeCase& c : kCeCases) {
    const bool whole = true;
    check_ce<float, float>(c, whole, 1);
    check_ce<float, float>(c, false, 2);
    check_ce<__nv_bfloat16, __nv_bfloat16>(c, whole, 3);
    check_ce<__half, __half>(c, whole, 4);
    check_ce<float, __nv_bfloat16>(c, whole, 5);  // f32 logits, bf16 gradient: one rounding
    check_ce<float, __half>(c, false, 6);
    check_ce<double, double>(c, whole, 7);
  }
}

// Label smoothing (e = 0.1): the row's sum reduced beside its max and exp-sum, e / v taken from every
// gradient element; the loss, gradient and fused kernels agree bit for bit as without it.
TEST(RowKernelsEmulated, CrossEntropyWithLabelSmoothing) {
  for (const CeCase& c : kCeCases) {
    check_ce<float, float>(c, true, 11, 0.1);
    check_ce<float, float>(c, false, 12, 0.1);
    check_ce<__nv_bfloat16, __nv_bfloat16>(c, true, 13, 0.1);
    check_ce<__half, __half>(c, true, 14, 0.1);
    check_ce<float, __nv_bfloat16>(c, true, 15, 0.1);
    check_ce<float, __half>(c, false, 16, 0.1);
    check_ce<double, double>(c, true, 17, 0.1);
  }
}

TEST(RowKernelsEmulated, CrossEntropyNanAndInfLogitsGiveANanLoss) {
  const CeCase c{2, 256, 256, 64, 256};
  for (const double poison : {static_cast<double>(NAN), static_cast<double>(INFINITY)}) {
    for (const int64_t at : {0, 77, 255}) {  // first, middle and last element
      std::vector<float> logits(512, 0.5f), gl(2, 1.0f), loss(2), lse(2);
      logits[static_cast<size_t>(at)] = static_cast<float>(poison);
      // The NaN in a pack of -inf (not its first element): the pack's max must not skip it.
      if (at == 77) logits[76] = logits[78] = logits[79] = -INFINITY;
      const std::vector<int64_t> labels{1, 2};
      int64_t bad[3] = {0, cuda::kBadNone, 0};
      rk::CeRows<float, float> a{logits.data(), c.ldx, labels.data(), loss.data(), lse.data(), gl.data(),
                                 nullptr,       0,     c.v,           -100,        bad,        true,
                                 false};
      emu::launch(2, c.threads, 64 * sizeof(double),
                  [&] { rk::cross_entropy_rows_kernel<rk::CeMode::loss, float, float>(a); });
      EXPECT_TRUE(std::isnan(loss[0])) << poison << " at " << at;
      EXPECT_NEAR(loss[1], std::log(256.0), 1e-5);  // the other row is untouched
    }
  }
  // A row of -inf but for the label: the loss is 0, no NaN from empty packs.
  std::vector<float> logits(256, -INFINITY), gl(1, 1.0f), loss(1), lse(1);
  logits[200] = 3.0f;
  const std::vector<int64_t> labels{200};
  int64_t bad[3] = {0, cuda::kBadNone, 0};
  rk::CeRows<float, float> a{logits.data(), 256, labels.data(), loss.data(), lse.data(), gl.data(),
                             nullptr,       0,   256,           -100,        bad,        true,
                             false};
  emu::launch(1, 64, 64 * sizeof(double),
              [&] { rk::cross_entropy_rows_kernel<rk::CeMode::loss, float, float>(a); });
  EXPECT_EQ(loss[0], 0.0f);
  EXPECT_EQ(lse[0], 3.0f);
}

// ---- LayerNorm / RMSNorm

struct NormCase {
  int64_t rows, n;
  bool weight, bias, residual;
};

template <typename T, bool kRms>
void check_norm(const NormCase& c, uint32_t seed) {
  using A = cuda::acc_t<T>;
  const int packs = rk::norm_packs_for<T>(c.n);
  SCOPED_TRACE(fmt::format("{} {}: rows {} n {} (packs {}) weight {} bias {} residual {}", type_name<T>(),
                           kRms ? "rms_norm" : "layer_norm", c.rows, c.n, packs, c.weight, c.bias,
                           c.residual));
  ASSERT_GT(packs, 0);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.5, 2.0);
  const auto total = static_cast<size_t>(c.rows * c.n), n = static_cast<size_t>(c.n);
  auto draw = [&](size_t count) {
    std::vector<T> v(count);
    for (auto& e : v) e = from_double<T>(normal(gen));
    return v;
  };
  const auto x = draw(total), res = draw(total), w = draw(n), b = draw(n), gy = draw(total),
             gadd = draw(total);
  const T nan = from_double<T>(NAN);
  std::vector<T> y(total, nan), sum(total, nan), gx(total, nan);
  std::vector<A> mean(static_cast<size_t>(c.rows), static_cast<A>(NAN)), rstd(mean);
  const double eps = 1e-5;
  rk::NormRows<T> a{x.data(),
                    c.weight ? w.data() : nullptr,
                    !kRms && c.bias ? b.data() : nullptr,
                    c.residual ? res.data() : nullptr,
                    sum.data(),
                    y.data(),
                    mean.data(),
                    rstd.data(),
                    c.rows,
                    static_cast<int>(c.n),
                    eps};
  const int threads = 128, per_block = threads / 32;
  const auto grid = static_cast<unsigned>((c.rows + per_block - 1) / per_block);
  rk::with_norm_packs(packs, [&](auto p) {
    emu::launch(grid, threads, 0, [&] { rk::norm_rows_kernel<T, decltype(p)::value, kRms>(a); });
  });
  double worst_stat = 0, worst_y = 0;
  std::vector<double> ref_mean(static_cast<size_t>(c.rows)), ref_rstd(ref_mean.size());
  for (int64_t r = 0; r < c.rows; ++r) {
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t at = static_cast<size_t>(r) * n + i;
      if (c.residual) {  // x + res in f32 (f64 for f64 data), rounded once to T: the bits of the kernel's sum
        const T s =
            from_double<T>(static_cast<double>(static_cast<A>(cuda::ld(&x[at], 0) + cuda::ld(&res[at], 0))));
        ASSERT_EQ(0, std::memcmp(&s, &sum[at], sizeof(T))) << "sum at " << at;
        v[i] = to_double(s);
      } else {
        v[i] = to_double(x[at]);
      }
    }
    double mu = 0, q = 0;
    if (!kRms) {
      for (double e : v) mu += e;
      mu /= static_cast<double>(n);
    }
    for (double e : v) q += (e - mu) * (e - mu);
    const double rs = 1.0 / std::sqrt(q / static_cast<double>(n) + eps);
    ref_mean[static_cast<size_t>(r)] = mu, ref_rstd[static_cast<size_t>(r)] = rs;
    if (!kRms)
      worst_stat = std::max(worst_stat, std::fabs(static_cast<double>(mean[static_cast<size_t>(r)]) - mu));
    worst_stat = std::max(worst_stat, std::fabs(static_cast<double>(rstd[static_cast<size_t>(r)]) - rs) / rs);
    for (size_t i = 0; i < n; ++i) {
      double h = (v[i] - mu) * rs;
      if (kRms) h = to_double(from_double<T>(h));  // rounded to T before the weight, as HF
      const double wi = c.weight ? to_double(w[i]) : 1.0;
      h *= wi;
      // The sizes of what the result is made of (its condition): x and the mean, each normalized, and b.
      const double terms = (std::fabs(v[i]) + std::fabs(mu)) * rs * std::fabs(wi) +
                           (!kRms && c.bias ? std::fabs(to_double(b[i])) : 0);
      if (!kRms && c.bias) h += to_double(b[i]);
      const double got = to_double(y[static_cast<size_t>(r) * n + i]);
      // Two roundings to T of the result (RMSNorm's h and the output), and f32's error on the terms (where
      // the bias cancels the normalized value, the result's own size says nothing).
      const double bound =
          4 * half_ulp<T>() * std::fabs(h) + (std::is_same_v<A, double> ? 2e-12 : 2e-5) * terms;
      worst_y = std::max(worst_y, std::fabs(got - h) / (bound + 1e-300));
    }
  }
  const double tol = std::is_same_v<A, double> ? 1e-12 : 1e-5;
  EXPECT_LT(worst_stat, tol);
  EXPECT_LE(worst_y, 1.0);

  // Backward from the kernel's own statistics.
  rk::NormGradRows<T> g{c.residual ? sum.data() : x.data(),
                        c.weight ? w.data() : nullptr,
                        mean.data(),
                        rstd.data(),
                        gy.data(),
                        c.residual ? gadd.data() : nullptr,
                        gx.data(),
                        c.rows,
                        static_cast<int>(c.n)};
  emu::launch(grid, threads, 0, [&] { rk::norm_grad_rows_kernel<T, kRms>(g); });
  double worst_gx = 0, scale = 1e-3;
  std::vector<double> want(total);
  for (int64_t r = 0; r < c.rows; ++r) {
    const double mu = kRms ? 0 : static_cast<double>(mean[static_cast<size_t>(r)]);
    const double rs = static_cast<double>(rstd[static_cast<size_t>(r)]);
    const T* xr = (c.residual ? sum.data() : x.data()) + static_cast<size_t>(r) * n;
    double sg = 0, sgx = 0;
    for (size_t i = 0; i < n; ++i) {
      const double gh = to_double(gy[static_cast<size_t>(r) * n + i]) * (c.weight ? to_double(w[i]) : 1.0);
      sg += gh;
      sgx += gh * (to_double(xr[i]) - mu) * rs;
    }
    const double mg = kRms ? 0 : sg / static_cast<double>(n), mgx = sgx / static_cast<double>(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t at = static_cast<size_t>(r) * n + i;
      const double gh = to_double(gy[at]) * (c.weight ? to_double(w[i]) : 1.0);
      want[at] = rs * (gh - mg - (to_double(xr[i]) - mu) * rs * mgx) + (c.residual ? to_double(gadd[at]) : 0);
      scale = std::max(scale, std::fabs(want[at]));
    }
  }
  for (size_t i = 0; i < total; ++i) worst_gx = std::max(worst_gx, std::fabs(to_double(gx[i]) - want[i]));
  EXPECT_LT(worst_gx / scale, 2 * half_ulp<T>() + tol);
}

const NormCase kNormCases[] = {
    {5, 64, true, true, false},     // 8 packs of bf16: most lanes idle
    {6, 768, true, true, true},     // GPT-2: 3 (bf16) or 6 (f32) packs a lane
    {3, 1000, false, false, true},  // no affine parameters; f32 250 packs
    {2, 2048, true, false, false},  // the f32 limit (16 packs a lane)
    {3, 4096, true, true, true},    // Llama-8B's hidden size in halves (16 packs a lane)
};

TEST(RowKernelsEmulated, NormsForwardAndBackwardMatchF64) {
  for (const NormCase& c : kNormCases) {
    if (c.n <= rk::norm_warp_max<float>()) {
      check_norm<float, false>(c, 11);
      check_norm<float, true>(c, 12);
    }
    check_norm<__nv_bfloat16, false>(c, 13);
    check_norm<__nv_bfloat16, true>(c, 14);
    check_norm<__half, false>(c, 15);
    if (c.n <= rk::norm_warp_max<double>()) check_norm<double, true>(c, 16);
  }
}

TEST(RowKernelsEmulated, NormPacksCoverTheRowOrDecline) {
  EXPECT_EQ(rk::norm_packs_for<__nv_bfloat16>(768), 4);  // 96 packs over 32 lanes: 3, rounded up
  EXPECT_EQ(rk::norm_packs_for<float>(768), 8);
  EXPECT_EQ(rk::norm_packs_for<__nv_bfloat16>(4096), 16);
  EXPECT_EQ(rk::norm_packs_for<float>(4096), 0);         // past 16 packs a lane: the block kernel
  EXPECT_EQ(rk::norm_packs_for<__nv_bfloat16>(770), 0);  // not whole packs
  EXPECT_EQ(rk::norm_packs_for<float>(8), 1);
}

}  // namespace
}  // namespace tr
