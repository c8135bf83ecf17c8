// Blocked attention's row kernels (attention.cu launches them; the products around them are GEMMs, see
// Backend::AttentionBlock): the probabilities of a score block with their logsumexp, and the block's
// backward. In a header of their own so that the CPU runs this very code (tests/cuda_emulator.h;
// tests/test_blocked_rows_emulated.cpp against the CPU twin in backend/cpu/attention.cpp).
// Both are bound by HBM: 4 bytes read and 2-4 written per score (softmax), 8 read and 2-4 written (backward).
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/attention_geometry.h"
#include "backend/cuda/kernel_basics.cuh"
#include "core/rng.h"
#ifndef TR_BROWS_EMULATED
#include "backend/cuda/common.cuh"  // acc_t, st (the emulation brings its own)
#endif

// The block reductions' 32 slots (the emulation points them at its shared buffer).
#ifndef TR_BROWS_SMEM
#define TR_BROWS_SMEM(name) __shared__ double name[32]
#endif

// The kernels' namespace (the emulation's own, so its host copies never meet the device build's symbols).
#ifndef TR_BROWS_NAMESPACE
#define TR_BROWS_NAMESPACE blocked
#endif

namespace tr::cuda::TR_BROWS_NAMESPACE {

// A block of queries t0 .. t0 + tq - 1 of every head against keys 0 .. sk - 1; rows run over (batch, kv
// head, rep, query), per_group = H / KV * tq rows per (batch, kv head).
struct BlockRows {
  backend::AttentionGeometry g;
  int64_t per_group, t0, tq, sk;
  float dropout;
  double keep_scale;
  uint64_t seed, offset;
  const uint64_t* shift;  // a CUDA graph's launch: added to offset (null: none)
  __device__ int64_t batch(int64_t row) const { return row / per_group / g.KV; }
  __device__ int64_t query(int64_t row) const { return t0 + row % per_group % tq; }
  // The Philox word index of (row, key 0), as the CPU twin: the element's index in [B, H, T, S].
  __device__ uint64_t drop_first(int64_t row) const {
    const int64_t grp = row / per_group, rr = row % per_group;
    const int64_t h = grp % g.KV * (g.H / g.KV) + rr / tq;
    return static_cast<uint64_t>(((batch(row) * g.H + h) * g.T + query(row)) * g.S);
  }
};

// The row's constants, computed once per block (per-element 64-bit divisions for the batch, query and the
// visible range were these kernels' bound): the visible keys lo..hi and the key mask's row.
struct RowView {
  int64_t lo, hi;
  const bool* keep;
  uint64_t first = 0, at = 0;  // dropout: the row's first Philox word and the stream's offset (shift added)
  __device__ RowView(const BlockRows& br, int64_t row)
      : lo(br.g.first_key(br.query(row))),
        hi(br.g.last_key(br.query(row))),
        keep(br.g.keep ? br.g.keep + br.batch(row) * br.g.S : nullptr) {
    if (br.dropout != 0.0f) first = br.drop_first(row), at = br.offset + (br.shift ? *br.shift : 0);
  }
  __device__ bool on(int64_t s) const { return s >= lo && s <= hi && (keep == nullptr || keep[s]); }
  // The dropout factor of key s (1 without dropout).
  __device__ double factor(const BlockRows& br, int64_t s) const {
    if (br.dropout == 0.0f) return 1.0;
    return uniform_from_word(philox_word(br.seed, at, first + static_cast<uint64_t>(s))) >= br.dropout
               ? br.keep_scale
               : 0.0;
  }
};

// Keys per thread held in registers by block_softmax_kernel: rows up to 4 x 256 keys are read once.
// (A warp per row with 32 keys per lane in registers measured slower on the H200: 767 vs 548 us per call
// for GPT-2's blocks, so a block of up to 256 threads per row stays.)
constexpr int kRowRegs = 4;

// Threads per row block: the row's keys rounded up to whole warps, at most 256.
inline int row_threads(int64_t sk) {
  const int64_t warps = (sk + 31) / 32 * 32;
  return static_cast<int>(warps < 32 ? 32 : warps > 256 ? 256 : warps);
}

// One block per row: max, sum, then the probabilities exp(x - lse) of the visible keys. A row that fits in
// registers is read once, and masked keys are never read.
template <typename A, typename P>
__global__ void block_softmax_kernel(BlockRows br, const A* scores, P* probs, A* lse) {
  TR_BROWS_SMEM(smem);
  A* sh = reinterpret_cast<A*>(smem);
  const int64_t row = blockIdx.x;
  const RowView rv(br, row);
  const A* x = scores + row * br.sk;
  P* p = probs + row * br.sk;
  const A scale = static_cast<A>(br.g.scale);
  if (br.sk <= kRowRegs * static_cast<int64_t>(blockDim.x)) {
    A v[kRowRegs];
    A m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kRowRegs; ++j) {
      const int64_t s = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      v[j] = s < br.sk && rv.on(s) ? x[s] * scale : A(-INFINITY);
      m = v[j] > m ? v[j] : m;
    }
    m = block_max(m, sh);
    A sum = 0;
    if (m != A(-INFINITY)) {
#pragma unroll
      for (int j = 0; j < kRowRegs; ++j) sum += v[j] == A(-INFINITY) ? A(0) : exp(v[j] - m);
    }
    const A l = m == A(-INFINITY) ? m : m + log(block_sum(sum, sh));  // every thread agrees on m
    if (threadIdx.x == 0) lse[row] = l;
#pragma unroll
    for (int j = 0; j < kRowRegs; ++j) {
      const int64_t s = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (s < br.sk)
        st(p, s,
           v[j] != A(-INFINITY) && l != A(-INFINITY) ? exp(v[j] - l) * static_cast<A>(rv.factor(br, s))
                                                     : A(0));
    }
    return;
  }
  A m = -INFINITY;
  for (int64_t s = threadIdx.x; s < br.sk; s += blockDim.x)
    if (rv.on(s)) m = x[s] * scale > m ? x[s] * scale : m;
  m = block_max(m, sh);
  if (m == A(-INFINITY)) {  // nothing visible: zero probabilities, lse -inf (the whole block agrees)
    for (int64_t s = threadIdx.x; s < br.sk; s += blockDim.x) st(p, s, A(0));
    if (threadIdx.x == 0) lse[row] = m;
    return;
  }
  A sum = 0;
  for (int64_t s = threadIdx.x; s < br.sk; s += blockDim.x)
    if (rv.on(s)) sum += exp(x[s] * scale - m);
  const A l = m + log(block_sum(sum, sh));
  if (threadIdx.x == 0) lse[row] = l;
  for (int64_t s = threadIdx.x; s < br.sk; s += blockDim.x)
    st(p, s, rv.on(s) ? exp(x[s] * scale - l) * static_cast<A>(rv.factor(br, s)) : A(0));
}

// One block per row (row constants once, RowView): probs = p z, dscores = p (dp z - delta) scale.
template <typename A, typename P>
__global__ void block_grad_kernel(BlockRows br, const A* scores, const A* dp, const A* lse, const A* delta,
                                  P* probs, P* dscores) {
  const int64_t row = blockIdx.x, base = row * br.sk;
  const RowView rv(br, row);
  const A scale = static_cast<A>(br.g.scale), l = lse[row], dl = delta[row];
  const bool any = l != A(-INFINITY);
  for (int64_t s = threadIdx.x; s < br.sk; s += blockDim.x) {
    const bool on = any && rv.on(s);
    const A pv = on ? exp(scores[base + s] * scale - l) : A(0), z = static_cast<A>(rv.factor(br, s));
    st(probs, base + s, pv * z);
    st(dscores, base + s, pv * (dp[base + s] * z - dl) * scale);
  }
}

}  // namespace tr::cuda::TR_BROWS_NAMESPACE
