// The CUDA memory-efficient attention's tiled kernels' own source (backend/cuda/attention_tiled.cuh) run on
// the CPU through tests/cuda_emulator.h: forward, dq and dk/dv in f32 and f64 against the f64 reference of
// the same masking rule and dropout stream - uneven T and S, causal with a key cache and with more queries
// than keys, windows, padded keys with a batch that sees nothing, grouped-query and multi-query heads,
// dropout with a graph shift, head dims 8 to 128 (the tiles' limit). Their parity test where there is no
// GPU (the dropout inside these kernels has not run on one yet); the GPU itself runs them in
// FusedAttentionDropout.*cuda_float*.
#include "cuda_emulator.h"  // first: the CUDA built-ins the kernels' header expects

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "attention_f64_reference.h"
#include "attention_layouts.h"
#include "backend/cuda/attention_tiled.cuh"

namespace tr {
namespace {

namespace tk = cuda::tiled_emulated;

struct TiledCase {
  int64_t B, H, KV, T, S, D;
  bool causal;
  int64_t window;
  bool padded;
  double dropout;
  test::Layout layout = test::Layout::dense;
};

std::string name_of(const TiledCase& c) {
  return fmt::format("B{} H{} KV{} T{} S{} D{} causal{} window{} padded{} dropout{}", c.B, c.H, c.KV, c.T,
                     c.S, c.D, c.causal, c.window, c.padded, c.dropout) +
         " " + test::layout_name(c.layout);
}

// The worst |got - want| over the largest |want| (at least 1e-3).
template <typename T>
double relative_error(const std::vector<T>& got, const std::vector<double>& want) {
  double scale = 1e-3, worst = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = static_cast<double>(got[i]);
    worst = std::max(worst, std::isfinite(x) ? std::fabs(x - want[i]) : INFINITY);
  }
  return worst / scale;
}

template <typename T>
void run_case(const TiledCase& c, uint64_t seed, double tol) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t nq = c.B * c.H * c.T * c.D, nk = c.B * c.KV * c.S * c.D;
  auto draw = [&](int64_t n) {
    std::vector<T> x(static_cast<size_t>(n));
    for (auto& e : x) e = static_cast<T>(normal(gen));
    return x;
  };
  const auto q = draw(nq), k = draw(nk), v = draw(nk), dout = draw(nq);
  const T poison = std::numeric_limits<T>::quiet_NaN();  // an output no thread writes shows up
  std::vector<T> out, dq, dk, dv;
  test::Placement<T> P(c.layout, c.B, c.H, c.KV, c.T, c.S, c.D, poison);
  P.put(P.q(), P.rows.q, q, false);
  P.put(P.k(), P.rows.k, k, true);
  P.put(P.v(), P.rows.v, v, true);
  P.put(P.dout(), P.rows.dout, dout, false);
  std::vector<uint8_t> keep_bytes(static_cast<size_t>(c.B * c.S), 1);
  if (c.padded) {
    for (int64_t s = 0; s < c.S; ++s) keep_bytes[s] = s % 5 != 3;
    if (c.B > 1) std::fill(keep_bytes.begin() + c.S, keep_bytes.begin() + 2 * c.S, 0);  // sees nothing
  }
  const bool* keep = c.padded ? reinterpret_cast<const bool*>(keep_bytes.data()) : nullptr;
  test::Geo g =
      test::Geo{c.B,  c.H,     c.KV, c.T, c.S, c.D, c.causal, 1.0 / std::sqrt(static_cast<double>(c.D)),
                keep, c.window}
          .with_dropout(c.dropout, 1234567, 77);
  g.rows = P.rows;
  std::vector<T> lse(static_cast<size_t>(c.B * c.H * c.T), poison), delta(lse.size());
  const uint64_t shift_word = 5;  // a replayed graph's Philox shift
  const uint64_t* shift = c.dropout > 0 ? &shift_word : nullptr;
  const auto blocks = [](int64_t rows, int64_t groups) {
    return static_cast<unsigned>(groups * ((rows + tk::kTile - 1) / tk::kTile));
  };
  emu::launch(blocks(c.T, c.B * c.H), tk::kTileThreads, tk::forward_smem<T>(c.D),
              [&] { tk::attention_forward_tiled<T>(g, shift, P.q(), P.k(), P.v(), P.out(), lse.data()); });
  out = P.take(P.out(), P.rows.out, false);
  for (int64_t row = 0; row < c.B * c.H * c.T; ++row) {  // attention_delta_kernel's sum, on the host
    T d = 0;
    for (int64_t e = 0; e < c.D; ++e) d += dout[row * c.D + e] * out[row * c.D + e];
    delta[row] = d;
  }
  emu::launch(blocks(c.T, c.B * c.H), tk::kTileThreads, tk::dq_smem<T>(c.D), [&] {
    tk::attention_dq_tiled<T>(g, shift, P.q(), P.k(), P.v(), lse.data(), delta.data(), P.dout(), P.dq());
  });
  emu::launch(blocks(c.S, c.B * c.KV), tk::kTileThreads, tk::dkv_smem<T>(c.D), [&] {
    tk::attention_dkv_tiled<T>(g, shift, P.q(), P.k(), P.v(), lse.data(), delta.data(), P.dout(), P.dk(),
                               P.dv());
  });
  dq = P.take(P.dq(), P.rows.dq, false);
  dk = P.take(P.dk(), P.rows.dk, true);
  dv = P.take(P.dv(), P.rows.dv, true);

  const uint64_t offset = g.offset + (shift ? *shift : 0);
  auto z = [&](int64_t bh, int64_t t, int64_t s) -> double {  // drop_factor's, in T
    if (g.dropout == 0.0f) return 1.0;
    return uniform_from_word(philox_word(g.seed, offset, g.drop_index(bh, t, s))) >= g.dropout
               ? static_cast<double>(static_cast<T>(g.keep_scale))
               : 0.0;
  };
  struct Inputs {
    const TiledCase& c;
    const std::vector<T>&xq, &xk, &xv, &xdo;
    double q(int64_t bh, int64_t t, int64_t d) const { return xq[(bh * c.T + t) * c.D + d]; }
    double k(int64_t bkv, int64_t s, int64_t d) const { return xk[(bkv * c.S + s) * c.D + d]; }
    double v(int64_t bkv, int64_t s, int64_t d) const { return xv[(bkv * c.S + s) * c.D + d]; }
    double dout(int64_t bh, int64_t t, int64_t d) const { return xdo[(bh * c.T + t) * c.D + d]; }
  };
  const test::Reference r = test::reference(c, g, Inputs{c, q, k, v, dout}, z);
  EXPECT_LE(relative_error(out, r.out), tol) << "out";
  EXPECT_LE(relative_error(dq, r.dq), tol) << "dq";
  EXPECT_LE(relative_error(dk, r.dk), tol) << "dk";
  EXPECT_LE(relative_error(dv, r.dv), tol) << "dv";
  for (size_t i = 0; i < lse.size(); ++i) {
    const double a = static_cast<double>(lse[i]), b = r.lse[i];
    ASSERT_TRUE(std::isinf(b) ? std::isinf(a) && a < 0
                              : std::fabs(a - b) <= tol * std::max(1.0, std::fabs(b)))
        << "lse[" << i << "] " << a << " against " << b;
  }
}

const TiledCase kCases[] = {
    {1, 1, 1, 16, 16, 16, false, 0, false, 0.0},
    {1, 2, 1, 70, 70, 64, true, 0, false, 0.0},
    {2, 4, 2, 65, 130, 40, true, 0, true, 0.0},    // a key cache, padding
    {1, 2, 2, 100, 37, 72, true, 0, false, 0.0},   // T > S: early rows see nothing
    {1, 2, 1, 90, 150, 8, true, 20, false, 0.0},   // a window
    {2, 2, 1, 67, 129, 128, false, 0, true, 0.3},  // dropout, a batch that sees nothing, D at the limit
    {1, 4, 2, 130, 200, 24, true, 33, true, 0.2},  // window, dropout
    {1, 1, 1, 1, 1, 8, true, 0, false, 0.5},
    {2, 8, 1, 1, 257, 16, true, 0, true, 0.15},  // one query (decoding), MQA
    {2, 2, 2, 200, 64, 8, true, 0, true, 0.0},   // T > S causal: many empty rows
    // The layouts models hand over: a packed q/k/v projection and sequence-major heads.
    {2, 3, 3, 70, 70, 40, true, 0, true, 0.2, test::Layout::packed},
    {1, 4, 2, 65, 130, 24, true, 0, false, 0.0, test::Layout::seq_major},
};

TEST(TiledAttentionEmulated, FloatKernelsMatchTheF64Reference) {
  uint64_t seed = 300;
  for (const TiledCase& c : kCases) {
    SCOPED_TRACE(name_of(c));
    run_case<float>(c, seed++, 2e-5);
  }
}

TEST(TiledAttentionEmulated, DoubleKernelsMatchTheF64Reference) {
  uint64_t seed = 400;
  for (const TiledCase& c : kCases) {
    SCOPED_TRACE(name_of(c));
    run_case<double>(c, seed++, 1e-12);
  }
}

}  // namespace
}  // namespace tr
