// The CUDA flash attention kernels' own source (backend/cuda/flash_kernels.cuh) run on the CPU through
// tests/cuda_emulator.h: forward, dq and dk/dv for bf16 and f16 against an f64 reference of the same masking
// rule and dropout stream (AttentionGeometry, Philox words as the CPU kernels draw them) - uneven T and S,
// causal with a key cache and with more queries than keys (rows that see nothing), windows from 1 key to
// wider than S, padded keys with a batch that sees nothing, grouped-query and multi-query heads, dropout with
// a graph shift, head dims 8 to 128 (both padded widths) with pairwise and 16-byte loads. Their parity test
// where there is no GPU; the GPU itself runs them in FusedAttentionDropout.*cuda*.
#include "cuda_emulator.h"  // first: the CUDA built-ins the kernels' header expects

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

// The kernels' register punning: built with -fno-strict-aliasing here (and their #pragma unroll ignored).
#pragma GCC diagnostic ignored "-Wstrict-aliasing"
#include "backend/cuda/flash_kernels.cuh"
#include "attention_f64_reference.h"
#include "attention_layouts.h"

namespace tr {
namespace {

namespace fk = cuda::flash_emulated;
using Geo = backend::AttentionGeometry;

struct FlashCase {
  int64_t B, H, KV, T, S, D;
  bool causal;
  int64_t window;
  bool padded;
  double dropout;
  bool f16;
  bool vec;  // 16-byte loads (aligned rows), else pairs
  test::Layout layout = test::Layout::dense;
};

std::string name_of(const FlashCase& c) {
  return fmt::format("B{} H{} KV{} T{} S{} D{} causal{} window{} padded{} dropout{} {}{}", c.B, c.H, c.KV,
                     c.T, c.S, c.D, c.causal, c.window, c.padded, c.dropout, c.f16 ? "f16" : "bf16",
                     c.vec ? " vec" : "") +
         " " + test::layout_name(c.layout);
}

// The worst |got - want| over the largest |want| (at least 1e-3): bf16/f16 outputs after rounded P and dS.
double relative_error(const std::vector<uint16_t>& got, const std::vector<double>& want) {
  double scale = 1e-3, worst = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = emu::half_to_float(got[i]);
    worst = std::max(worst, std::isfinite(x) ? std::fabs(x - want[i]) : INFINITY);
  }
  return worst / scale;
}

// The backward kernels' tile slots: 2 (the next tile copied in under this one) or 1 (a device with less
// shared memory a block).
// Philox blocks each kernel made in the last run_case: forward, dq, dk/dv.
int64_t blocks_made[3];

void run_case(const FlashCase& c, uint64_t seed, int slots = 2) {
  emu::f16 = c.f16;
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t nq = c.B * c.H * c.T * c.D, nk = c.B * c.KV * c.S * c.D;
  auto draw = [&](int64_t n) {
    std::vector<uint16_t> x(static_cast<size_t>(n));
    for (auto& e : x) e = emu::float_to_half(normal(gen));
    return x;
  };
  const auto q = draw(nq), k = draw(nk), v = draw(nk), dout = draw(nq);
  std::vector<uint16_t> out, dq, dk, dv;
  test::Placement<uint16_t> P(c.layout, c.B, c.H, c.KV, c.T, c.S, c.D, 0xdead);  // 0xdead: never written
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
  Geo g =
      Geo{c.B, c.H, c.KV, c.T, c.S, c.D, c.causal, 1.0 / std::sqrt(static_cast<double>(c.D)), keep, c.window}
          .with_dropout(c.dropout, 1234567, 77);
  g.rows = P.rows;
  std::vector<float> lse(static_cast<size_t>(c.B * c.H * c.T), 12345.0f), delta(lse.size());
  const uint64_t shift_word = 5;  // a replayed graph's Philox shift
  const uint64_t* shift = c.dropout > 0 ? &shift_word : nullptr;
  const auto blocks = [](int64_t rows, int64_t groups) {
    return static_cast<unsigned>(groups * ((rows + fk::kOwn - 1) / fk::kOwn));
  };
  auto kernels = [&]<typename T, int DP>() {
    fk::philox_blocks = 0;
    emu::launch(blocks(c.T, c.B * c.H), fk::kThreads, fk::forward_smem<DP>(),
                [&] { fk::flash_forward<T, DP>(g, shift, P.q(), P.k(), P.v(), P.out(), lse.data(), c.vec); });
    blocks_made[0] = fk::philox_blocks.exchange(0);
    out = P.take(P.out(), P.rows.out, false);
    for (int64_t row = 0; row < c.B * c.H * c.T; ++row) {  // (flash_delta's rowsum, on the host)
      float s = 0;
      for (int64_t d = 0; d < c.D; ++d)
        s += emu::half_to_float(out[row * c.D + d]) * emu::half_to_float(dout[row * c.D + d]);
      delta[row] = s;
    }
    auto backward = [&]<int Slots>() {
      fk::philox_blocks = 0;
      emu::launch(blocks(c.T, c.B * c.H), fk::kThreads, fk::dq_smem<DP, Slots>(), [&] {
        fk::flash_dq<T, DP, Slots>(g, shift, P.q(), P.k(), P.v(), lse.data(), delta.data(), P.dout(), P.dq(),
                                   c.vec);
      });
      blocks_made[1] = fk::philox_blocks.exchange(0);
      emu::launch(blocks(c.S, c.B * c.KV), fk::kThreads, fk::dkv_smem<DP, Slots>(), [&] {
        fk::flash_dkv<T, DP, Slots>(g, shift, P.q(), P.k(), P.v(), lse.data(), delta.data(), P.dout(), P.dk(),
                                    P.dv(), c.vec);
      });
      blocks_made[2] = fk::philox_blocks.exchange(0);
    };
    if (slots == 1)
      backward.template operator()<1>();
    else
      backward.template operator()<2>();
    dq = P.take(P.dq(), P.rows.dq, false);
    dk = P.take(P.dk(), P.rows.dk, true);
    dv = P.take(P.dv(), P.rows.dv, true);
  };
  if (c.f16)
    c.D <= 64 ? kernels.template operator()<__half, 64>() : kernels.template operator()<__half, 128>();
  else
    c.D <= 64 ? kernels.template operator()<__nv_bfloat16, 64>()
              : kernels.template operator()<__nv_bfloat16, 128>();

  const uint64_t offset = g.offset + (shift ? *shift : 0);
  auto z = [&](int64_t bh, int64_t t, int64_t s) -> double {
    if (g.dropout == 0.0f) return 1.0;
    return uniform_from_word(philox_word(g.seed, offset, g.drop_index(bh, t, s))) >= g.dropout
               ? static_cast<double>(static_cast<float>(g.keep_scale))
               : 0.0;
  };
  struct Inputs {  // the rounded inputs as f64, by (row, position, dim)
    const FlashCase& c;
    const std::vector<uint16_t>&xq, &xk, &xv, &xdo;
    double at(const std::vector<uint16_t>& x, int64_t row, int64_t pos, int64_t d, int64_t n) const {
      return emu::half_to_float(x[(row * n + pos) * c.D + d]);
    }
    double q(int64_t bh, int64_t t, int64_t d) const { return at(xq, bh, t, d, c.T); }
    double k(int64_t bkv, int64_t s, int64_t d) const { return at(xk, bkv, s, d, c.S); }
    double v(int64_t bkv, int64_t s, int64_t d) const { return at(xv, bkv, s, d, c.S); }
    double dout(int64_t bh, int64_t t, int64_t d) const { return at(xdo, bh, t, d, c.T); }
  };
  const test::Reference r = test::reference(c, g, Inputs{c, q, k, v, dout}, z);
  // bf16/f16 outputs after probabilities and dS rounded to the operand type (FlashAttention-2's rule).
  const double tol = 2e-2;
  EXPECT_LE(relative_error(out, r.out), tol) << "out";
  EXPECT_LE(relative_error(dq, r.dq), tol) << "dq";
  EXPECT_LE(relative_error(dk, r.dk), tol) << "dk";
  EXPECT_LE(relative_error(dv, r.dv), tol) << "dv";
  for (size_t i = 0; i < lse.size(); ++i) {
    const double a = lse[i], b = r.lse[i];
    ASSERT_TRUE(std::isinf(b) ? std::isinf(a) && a < 0 : std::fabs(a - b) < 1e-3)
        << "lse[" << i << "] " << a << " against " << b;
  }
}

TEST(FlashEmulated, EveryKernelMatchesTheF64Reference) {
  const FlashCase cases[] = {
      {1, 1, 1, 16, 16, 16, false, 0, false, 0.0, false, false},
      {1, 2, 1, 70, 70, 64, true, 0, false, 0.0, false, false},
      {2, 4, 2, 65, 130, 40, true, 0, true, 0.0, false, false},    // a key cache, padding
      {1, 2, 2, 100, 37, 72, true, 0, false, 0.0, false, false},   // T > S: early rows see nothing
      {1, 2, 1, 90, 150, 8, true, 20, false, 0.0, false, false},   // a window
      {2, 2, 1, 67, 129, 128, false, 0, true, 0.3, false, false},  // dropout, a batch that sees nothing
      {1, 4, 2, 130, 200, 24, true, 33, true, 0.2, true, false},   // f16, window, dropout
      {1, 1, 1, 1, 1, 8, true, 0, false, 0.5, false, false},
      {1, 8, 2, 128, 192, 128, true, 0, false, 0.1, false, true},   // 16-byte loads, whole tiles
      {1, 2, 1, 64, 64, 56, true, 1, true, 0.0, true, true},        // window 1: only itself
      {2, 2, 2, 77, 33, 48, false, 0, true, 0.25, false, true},     // not causal, T > S
      {1, 2, 1, 60, 300, 32, true, 400, false, 0.0, false, false},  // a window wider than S
      {2, 8, 1, 1, 257, 16, true, 0, true, 0.15, false, true},      // one query (decoding), MQA
      {1, 2, 1, 129, 129, 128, true, 64, false, 0.4, true, true},   // f16, D 128, window = a tile
      {2, 2, 2, 200, 64, 8, true, 0, true, 0.0, false, false},      // T > S causal: many empty rows
      // The layouts models hand over: GPT-2's packed projection (rows 3 H D apart) and sequence-major heads.
      {2, 4, 4, 70, 70, 64, true, 0, true, 0.1, false, true, test::Layout::packed},
      {1, 2, 2, 65, 65, 24, true, 0, false, 0.0, true, false, test::Layout::packed},
      {2, 4, 2, 65, 130, 40, true, 0, true, 0.2, false, false, test::Layout::seq_major},
      {1, 4, 1, 129, 129, 128, true, 0, false, 0.0, false, true, test::Layout::seq_major},
  };
  uint64_t seed = 100;
  for (const FlashCase& c : cases) {
    SCOPED_TRACE(name_of(c));
    run_case(c, seed++);
  }
}

// Every kernel streams its tiles by cp.async (the forward through one buffer each for K and V, dq and dk/dv
// through two slots): the test above lands each copy at its wait (a read before the wait sees poison); here
// every copy lands at issue, so one into a buffer another warp still reads would change results. Dropout's
// keep bits, traded between lanes by shuffles, are checked against the reference's own Philox words.
TEST(FlashEmulated, CopiesLandingAtIssueGiveTheSameResults) {
  const FlashCase cases[] = {
      {1, 8, 2, 128, 192, 128, true, 0, false, 0.1, false, true},
      {2, 2, 2, 77, 33, 48, false, 0, true, 0.25, false, true},
      {2, 4, 4, 70, 70, 64, true, 0, true, 0.1, false, true, test::Layout::packed},
      {1, 2, 1, 129, 129, 128, true, 64, false, 0.4, true, true},
  };
  emu::copies_land_at_issue = true;
  uint64_t seed = 500;
  for (const FlashCase& c : cases) {
    SCOPED_TRACE(name_of(c));
    run_case(c, seed++);
  }
  emu::copies_land_at_issue = false;
}

// Dropout's random work: two GPT-2-like causal heads (T = S = 256, head dim 64) have 65,792 visible keep
// words, 16,448 Philox blocks' worth. Each kernel makes 1.25 blocks per four visible words (whole diagonal
// tiles: 1.06 at T = 1024), where a block per visible score pair (forward, dq) made 2.01 and one per visible
// score (dk/dv) 4.
TEST(FlashEmulated, DropoutMakesEachPhiloxBlockAboutOnce) {
  const FlashCase c{1, 2, 2, 256, 256, 64, true, 0, false, 0.1, false, true};
  run_case(c, 7);
  const double words = 2.0 * 256 * 257 / 2;  // visible (query, key) pairs of the two heads
  const char* names[] = {"forward", "dq", "dk/dv"};
  for (int k = 0; k < 3; ++k) {
    const double per_block = static_cast<double>(blocks_made[k]) / (words / 4);
    std::printf("%s: %lld Philox blocks, %.2f per block of four visible words\n", names[k],
                static_cast<long long>(blocks_made[k]), per_block);
    EXPECT_LE(per_block, 1.5) << names[k];
  }
}

// One slot (a device whose blocks hold less shared memory: dk/dv at head dim 128 on an RTX 4090) gives the
// same results, with copies landing at their wait and at issue.
TEST(FlashEmulated, OneSlotBackwardGivesTheSameResults) {
  const FlashCase cases[] = {
      {1, 8, 2, 128, 192, 128, true, 0, false, 0.1, false, true},
      {2, 4, 2, 65, 130, 40, true, 0, true, 0.2, false, false, test::Layout::seq_major},
      {1, 2, 1, 129, 129, 128, true, 64, false, 0.4, true, true},
  };
  for (bool at_issue : {false, true}) {
    emu::copies_land_at_issue = at_issue;
    uint64_t seed = 900;
    for (const FlashCase& c : cases) {
      SCOPED_TRACE(name_of(c) + (at_issue ? " landing at issue" : ""));
      run_case(c, seed++, 1);
    }
  }
  emu::copies_land_at_issue = false;
}

}  // namespace
}  // namespace tr
