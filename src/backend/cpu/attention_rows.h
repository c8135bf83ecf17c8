// Row pieces the CPU fused attention kernels share (attention_gemm.cpp's sgemm tiles, attention_bf16.cpp's
// native bf16 tiles): tile sizes, the mask of a score row, the vectorized softmax reductions. CPU-only.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/attention_geometry.h"
#include "backend/cpu/convert.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/philox_cpu.h"
#include "backend/cpu/vec_math512.h"
#include "backend/cpu/vec_unary.h"

namespace tr::cpu::attn {

constexpr int64_t kQ = 64;   // queries per tile
constexpr int64_t kK = 256;  // keys per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// n values from p as f32 into dst.
template <typename T>
void to_f32(const T* p, int64_t n, float* dst) {
  if constexpr (std::is_same_v<T, float>)
    std::copy(p, p + n, dst);
  else
    widen_run(p, dst, n);
}

// n rows of D values, ld apart from p, as dense f32 rows into dst.
template <typename T>
void rows_to_f32(const T* p, int64_t n, int64_t ld, int64_t D, float* dst) {
  for (int64_t r = 0; r < n; ++r) to_f32(p + r * ld, D, dst + r * D);
}

// n rows of D values, ld apart from p, as f32 rows: p itself for f32 (ld unchanged), else widened into buf
// (ld = D).
template <typename T>
const float* rows_f32(const T* p, int64_t n, int64_t D, int64_t& ld, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    (void)n, (void)D, (void)buf;
    return p;
  } else {
    rows_to_f32(p, n, ld, D, buf.data());
    ld = D;
    return buf.data();
  }
}

// Dense f32 rows of src (n x D) stored to rows ld apart from p, in T's rounding.
template <typename T>
void store_rows(const float* src, int64_t n, int64_t D, T* p, int64_t ld) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) store(p + r * ld, c, src[r * D + c]);
}

// The softmax row reductions, vectorized: as scalar loops (a dependent max / add per key) they were half of
// the kernel's own time at T = 64, where the tile products are small.
inline float max_of(const float* a, int64_t n, bool wide) { return wide ? row_max_512(a, n) : row_max(a, n); }
inline float exp_sum_of(float* a, float shift, int64_t n, bool wide) {
  return wide ? exp_sum_512(a, shift, a, n) : exp_sum(a, shift, a, n);
}

// sum_i a[i] b[i], two 8-lane accumulators.
inline float row_dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  float r = hsum8(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

// Hides the keys s0 .. s0 + ns - 1 that query t may not see (-inf).
inline void mask_row(const backend::AttentionGeometry& g, int64_t b, int64_t t, int64_t s0, int64_t ns,
                     float* row) {
  const int64_t lo = g.first_key(t) - s0, hi = g.last_key(t) - s0;
  for (int64_t j = 0; j < ns && j < lo; ++j) row[j] = kNegInf;
  for (int64_t j = std::max<int64_t>(hi + 1, 0); j < ns; ++j) row[j] = kNegInf;
  if (g.keep != nullptr)
    for (int64_t j = 0; j < ns; ++j)
      if (!g.keep[b * g.S + s0 + j]) row[j] = kNegInf;
}

// The dropout factors (0 or keep_scale; AttentionGeometry) of keys s0 .. s0 + n - 1 for query t of head row
// bh into z: Philox words a run at a time into L1, then the factors in vectors (as the blocked form's rows).
template <typename A>
void drop_factors(const backend::AttentionGeometry& g, int64_t bh, int64_t t, int64_t s0, int64_t n, A* z) {
  constexpr int64_t kRun = 256;
  alignas(64) uint32_t w[kRun];
  const A keep = static_cast<A>(g.keep_scale);
  const uint64_t first = g.drop_index(bh, t, s0);
  for (int64_t j0 = 0; j0 < n; j0 += kRun) {
    const int64_t m = std::min(kRun, n - j0);
    philox_fill(g.seed, g.offset, first + static_cast<uint64_t>(j0), m, w);
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) z[j0 + j] = uniform_from_word(w[j]) >= g.dropout ? keep : A(0);
  }
}

// One score row of the online softmax (FlashAttention-2's forward): folds the masked scores si[0, ns) of
// query t (head row bh) into its running max m and sum l, rescales the row's accumulator acc[0, D) by the
// change of max, and leaves in si the probabilities times their dropout factors (z: ns floats of scratch) -
// the P V operand; a row with nothing visible yet leaves zeros. The sum stays undropped (the softmax's).
inline void online_softmax_row(const backend::AttentionGeometry& g, int64_t bh, int64_t t, int64_t s0,
                               int64_t ns, float* si, float& m, float& l, float* acc, int64_t D, float* z,
                               bool wide) {
  const float bm = max_of(si, ns, wide);  // NaN propagates
  const float mx = bm > m || bm != bm ? bm : m;
  if (mx == kNegInf) {
    std::fill(si, si + ns, 0.0f);
    return;
  }
  const float corr = std::exp(m - mx);
  const float rowsum = exp_sum_of(si, mx, ns, wide);  // si = exp(si - mx)
  if (m != kNegInf && corr != 1.0f)                   // (the first visible block finds acc at zero)
    for (int64_t c = 0; c < D; ++c) acc[c] *= corr;
  l = l * corr + rowsum;
  m = mx;
  if (g.dropout > 0) {
    drop_factors(g, bh, t, s0, ns, z);
    for (int64_t j = 0; j < ns; ++j) si[j] *= z[j];
  }
}

// The end of a query tile's forward: out rows = acc / l (T's rounding), lse = m + log l; a row that saw
// nothing gets zeros and -inf.
template <typename T>
void finish_rows(int64_t nt, int64_t D, const float* acc, const float* m, const float* l, T* out, int64_t ld,
                 float* lse) {
  for (int64_t i = 0; i < nt; ++i) {
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    for (int64_t c = 0; c < D; ++c) store(out + i * ld, c, acc[i * D + c] * inv);
    lse[i] = l[i] > 0.0f ? m[i] + std::log(l[i]) : kNegInf;
  }
}

// Probabilities p and dS (in ds) of one score tile from the raw products q k^T (in p) and dO v^T (in ds):
// p = exp(s scale - lse) masked, ds = p (dp z - delta) scale; p then takes the dropout factors z (dv's
// operand).
inline void tile_grads(const backend::AttentionGeometry& g, int64_t b, int64_t h, int64_t t0, int64_t nt,
                       int64_t s0, int64_t ns, int64_t ld, const float* lp, const float* delta, float* p,
                       float* ds, float* z) {
  const float scale = static_cast<float>(g.scale);
  for (int64_t i = 0; i < nt; ++i) {
    float* pi = p + i * ld;
    float* di = ds + i * ld;
    if (lp[i] == kNegInf) {  // the row attended nothing: no gradient through it
      std::fill(pi, pi + ns, 0.0f);
      std::fill(di, di + ns, 0.0f);
      continue;
    }
    for (int64_t j = 0; j < ns; ++j) pi[j] = pi[j] * scale - lp[i];
    mask_row(g, b, t0 + i, s0, ns, pi);
    unary_row<backend::UnaryOp::exp>(pi, pi, ns);
    if (g.dropout > 0) {
      drop_factors(g, b * g.H + h, t0 + i, s0, ns, z);
      for (int64_t j = 0; j < ns; ++j) {
        di[j] = pi[j] * (di[j] * z[j] - delta[i]) * scale;
        pi[j] *= z[j];
      }
      continue;
    }
    for (int64_t j = 0; j < ns; ++j) di[j] = pi[j] * (di[j] - delta[i]) * scale;
  }
}

}  // namespace tr::cpu::attn
