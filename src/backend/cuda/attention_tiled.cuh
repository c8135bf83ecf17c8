// The CUDA memory-efficient attention's tiled kernels (attention.cu launches them and describes the
// schedule), in a header of their own so that the CPU can run this very code: tests/cuda_emulator.h defines
// the CUDA built-ins for the host and tests/test_attention_emulated.cpp runs every kernel, f32 and f64, with
// masks, windows and dropout, against an f64 reference - the parity test of kernels that otherwise only run
// on a GPU. Bound by shared-memory bandwidth: every score is a dot product over a staged row.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/attention_geometry.h"
#include "core/rng.h"
#ifndef TR_ATTN_EMULATED
#include "backend/cuda/common.cuh"  // acc_t, ld, st (the emulation brings its own)
#endif

// A kernel's dynamic shared memory (the emulation points it at a host buffer).
#ifndef TR_ATTN_SMEM
#define TR_ATTN_SMEM(name) extern __shared__ double name[]
#endif

// The kernels' namespace (the emulation's own, so its host copies never meet the device build's symbols).
#ifndef TR_ATTN_NAMESPACE
#define TR_ATTN_NAMESPACE tiled
#endif

namespace tr::cuda::TR_ATTN_NAMESPACE {

using Geo = backend::AttentionGeometry;

// The dropout factor of (head row bh, query t, key s): 1 without dropout, else 0 or keep_scale as the CPU
// twin's drop_factors; `shift` (a CUDA graph's launch, null otherwise) moves the Philox offset.
template <typename A>
__device__ __forceinline__ A drop_factor(const Geo& g, const uint64_t* shift, int64_t bh, int64_t t,
                                         int64_t s) {
  if (g.dropout == 0.0f) return A(1);
  const uint64_t w = philox_word(g.seed, g.offset + (shift ? *shift : 0), g.drop_index(bh, t, s));
  return uniform_from_word(w) >= g.dropout ? static_cast<A>(g.keep_scale) : A(0);
}

// ---- tiled kernels
constexpr int kTile = 32;                          // queries and keys per tile
constexpr int kRowThreads = 4;                     // threads sharing one row of a tile
constexpr int kTileThreads = kTile * kRowThreads;  // 128
constexpr int kTileMaxDim = 128;
constexpr int kCols = kTileMaxDim / kRowThreads;  // output columns a thread owns (c = sub + 4 i)
constexpr int kPerRow = kTile / kRowThreads;      // scores a thread computes per tile row (j = sub + 4 i)

template <typename A>
__device__ __forceinline__ A row_max(A v) {  // over the 4 consecutive lanes of one row
  for (int o = 1; o < kRowThreads; o <<= 1) {
    const A u = __shfl_xor_sync(0xffffffffu, v, o);
    v = u > v ? u : v;
  }
  return v;
}

template <typename A>
__device__ __forceinline__ A row_sum(A v) {
  for (int o = 1; o < kRowThreads; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rows [r0, r0 + kTile) of a [rows, D] matrix whose rows are ld apart into shared memory with leading dim
// D + 1 (bank-conflict free), times `mul`; rows past the end are zeros.
template <typename T, typename A>
__device__ void load_tile(A* dst, const T* src, int64_t r0, int64_t rows, int64_t ld_src, int64_t D, A mul) {
  const int64_t pitch = D + 1;
  for (int64_t e = threadIdx.x; e < kTile * D; e += blockDim.x) {
    const int64_t rr = e / D, c = e % D;
    dst[rr * pitch + c] = r0 + rr < rows ? ld(src, (r0 + rr) * ld_src + c) * mul : A(0);
  }
}

// acc[i] = sum_c x[c] * rows[(sub + 4 i) * pitch + c] for the kPerRow tile rows a thread covers: x[c] is
// loaded once for all of them (half the shared-memory reads of separate dot products; same summation order).
template <typename A>
__device__ __forceinline__ void dot_rows(const A* x, const A* rows, int sub, int64_t pitch, int64_t D,
                                         A (&acc)[kPerRow]) {
#pragma unroll
  for (int i = 0; i < kPerRow; ++i) acc[i] = 0;
  for (int64_t c = 0; c < D; ++c) {
    const A xc = x[c];
#pragma unroll
    for (int i = 0; i < kPerRow; ++i) acc[i] += xc * rows[(sub + kRowThreads * i) * pitch + c];
  }
}

// Highest key any query of the tile starting at t0 may see (-1: none).
__device__ __forceinline__ int64_t tile_last_key(const Geo& g, int64_t t0) {
  const int64_t t_last = t0 + kTile - 1 < g.T - 1 ? t0 + kTile - 1 : g.T - 1;
  return g.last_key(t_last);
}

template <typename T>
__global__ void __launch_bounds__(kTileThreads)
    attention_forward_tiled(Geo g, const uint64_t* shift, const T* q, const T* k, const T* v, T* out,
                            acc_t<T>* lse) {
  using A = acc_t<T>;
  TR_ATTN_SMEM(smem_d);  // double-aligned
  A* smem = reinterpret_cast<A*>(smem_d);
  const int64_t pitch = g.D + 1, tiles_q = (g.T + kTile - 1) / kTile;
  A* Qs = smem;
  A* Ks = Qs + kTile * pitch;
  A* Vs = Ks + kTile * pitch;
  A* Ps = Vs + kTile * pitch;  // [kTile][kTile + 1]
  const int64_t bh = blockIdx.x / tiles_q, t0 = (blockIdx.x % tiles_q) * kTile;
  const int64_t h = bh % g.H, b = bh / g.H, kvh = h / (g.H / g.KV);
  const int r = threadIdx.x / kRowThreads, sub = threadIdx.x % kRowThreads;
  const int64_t t = t0 + r;
  const T* kb = k + g.rows.k.at(b, kvh, 0);
  const T* vb = v + g.rows.v.at(b, kvh, 0);
  load_tile(Qs, q + g.rows.q.at(b, h, 0), t0, g.T, g.rows.q.row, g.D, static_cast<A>(g.scale));
  const int64_t last = tile_last_key(g, t0), n_kt = last < 0 ? 0 : last / kTile + 1;
  A m = -INFINITY, l = 0, o[kCols];
#pragma unroll
  for (int i = 0; i < kCols; ++i) o[i] = 0;
  // A sliding window hides the tiles before the tile's first query's first key.
  for (int64_t kt = g.first_key(t0) / kTile; kt < n_kt; ++kt) {
    const int64_t s0 = kt * kTile;
    __syncthreads();  // the previous tile is consumed
    load_tile(Ks, kb, s0, g.S, g.rows.k.row, g.D, A(1));
    load_tile(Vs, vb, s0, g.S, g.rows.v.row, g.D, A(1));
    __syncthreads();
    A sc[kPerRow], tmax = -INFINITY;
    dot_rows(Qs + r * pitch, Ks, sub, pitch, g.D, sc);
#pragma unroll
    for (int i = 0; i < kPerRow; ++i) {
      const int64_t s = s0 + sub + kRowThreads * i;
      if (!(t < g.T && s < g.S && g.visible(b, t, s))) sc[i] = A(-INFINITY);
      tmax = sc[i] > tmax ? sc[i] : tmax;
    }
    const A mx = row_max(m > tmax ? m : tmax);
    A psum = 0;
#pragma unroll
    for (int i = 0; i < kPerRow; ++i) {
      const A p = mx == A(-INFINITY) ? A(0) : exp(sc[i] - mx);
      const int64_t s = s0 + sub + kRowThreads * i;  // the sum is undropped; the product takes p * z
      Ps[r * (kTile + 1) + sub + kRowThreads * i] = p == A(0) ? p : p * drop_factor<A>(g, shift, bh, t, s);
      psum += p;
    }
    psum = row_sum(psum);
    const A corr = mx == A(-INFINITY) ? A(1) : exp(m - mx);
    l = l * corr + psum;
    m = mx;
    __syncwarp();  // the row's probabilities come from the same warp
#pragma unroll
    for (int i = 0; i < kCols; ++i) o[i] *= corr;
    for (int j = 0; j < kTile; ++j) {
      const A p = Ps[r * (kTile + 1) + j];
      if (p == A(0)) continue;  // masked keys contribute nothing, even where v is not finite (as the CPU)
#pragma unroll
      for (int i = 0; i < kCols; ++i)
        if (sub + kRowThreads * i < g.D) o[i] += p * Vs[j * pitch + sub + kRowThreads * i];
    }
  }
  if (t >= g.T) return;
  const A inv = l > A(0) ? A(1) / l : A(0);
  const int64_t row = bh * g.T + t;
#pragma unroll
  for (int i = 0; i < kCols; ++i)
    if (sub + kRowThreads * i < g.D) st(out + g.rows.out.at(b, h, t), sub + kRowThreads * i, o[i] * inv);
  if (sub == 0) lse[row] = l > A(0) ? m + log(l) : A(-INFINITY);
}

template <typename T>
__global__ void __launch_bounds__(kTileThreads)
    attention_dq_tiled(Geo g, const uint64_t* shift, const T* q, const T* k, const T* v, const acc_t<T>* lse,
                       const acc_t<T>* delta, const T* dout, T* dq) {
  using A = acc_t<T>;
  TR_ATTN_SMEM(smem_d);
  A* smem = reinterpret_cast<A*>(smem_d);
  const int64_t pitch = g.D + 1, tiles_q = (g.T + kTile - 1) / kTile;
  A* Qs = smem;
  A* dOs = Qs + kTile * pitch;
  A* Ks = dOs + kTile * pitch;
  A* Vs = Ks + kTile * pitch;
  A* DSs = Vs + kTile * pitch;  // [kTile][kTile + 1]
  const int64_t bh = blockIdx.x / tiles_q, t0 = (blockIdx.x % tiles_q) * kTile;
  const int64_t h = bh % g.H, b = bh / g.H, kvh = h / (g.H / g.KV);
  const int r = threadIdx.x / kRowThreads, sub = threadIdx.x % kRowThreads;
  const int64_t t = t0 + r, row = bh * g.T + t;
  const T* kb = k + g.rows.k.at(b, kvh, 0);
  const T* vb = v + g.rows.v.at(b, kvh, 0);
  const A scale = static_cast<A>(g.scale);
  load_tile(Qs, q + g.rows.q.at(b, h, 0), t0, g.T, g.rows.q.row, g.D, scale);
  load_tile(dOs, dout + g.rows.dout.at(b, h, 0), t0, g.T, g.rows.dout.row, g.D, A(1));
  const A lse_r = t < g.T ? lse[row] : A(-INFINITY), delta_r = t < g.T ? delta[row] : A(0);
  const int64_t last = tile_last_key(g, t0), n_kt = last < 0 ? 0 : last / kTile + 1;
  A acc[kCols];
#pragma unroll
  for (int i = 0; i < kCols; ++i) acc[i] = 0;
  for (int64_t kt = g.first_key(t0) / kTile; kt < n_kt; ++kt) {
    const int64_t s0 = kt * kTile;
    __syncthreads();
    load_tile(Ks, kb, s0, g.S, g.rows.k.row, g.D, A(1));
    load_tile(Vs, vb, s0, g.S, g.rows.v.row, g.D, A(1));
    __syncthreads();
    A sc[kPerRow], dp[kPerRow];
    dot_rows(Qs + r * pitch, Ks, sub, pitch, g.D, sc);
    dot_rows(dOs + r * pitch, Vs, sub, pitch, g.D, dp);
#pragma unroll
    for (int i = 0; i < kPerRow; ++i) {
      const int j = sub + kRowThreads * i;
      const int64_t s = s0 + j;
      A ds = 0;
      if (t < g.T && s < g.S && lse_r != A(-INFINITY) && g.visible(b, t, s))
        ds = exp(sc[i] - lse_r) * (dp[i] * drop_factor<A>(g, shift, bh, t, s) - delta_r) * scale;
      DSs[r * (kTile + 1) + j] = ds;
    }
    __syncwarp();
    for (int j = 0; j < kTile; ++j) {
      const A ds = DSs[r * (kTile + 1) + j];
      if (ds == A(0)) continue;
#pragma unroll
      for (int i = 0; i < kCols; ++i)
        if (sub + kRowThreads * i < g.D) acc[i] += ds * Ks[j * pitch + sub + kRowThreads * i];
    }
  }
  if (t >= g.T) return;
#pragma unroll
  for (int i = 0; i < kCols; ++i)
    if (sub + kRowThreads * i < g.D) st(dq + g.rows.dq.at(b, h, t), sub + kRowThreads * i, acc[i]);
}

template <typename T>
__global__ void __launch_bounds__(kTileThreads)
    attention_dkv_tiled(Geo g, const uint64_t* shift, const T* q, const T* k, const T* v, const acc_t<T>* lse,
                        const acc_t<T>* delta, const T* dout, T* dk, T* dv) {
  using A = acc_t<T>;
  TR_ATTN_SMEM(smem_d);
  A* smem = reinterpret_cast<A*>(smem_d);
  const int64_t pitch = g.D + 1, tiles_k = (g.S + kTile - 1) / kTile;
  A* Ks = smem;
  A* Vs = Ks + kTile * pitch;
  A* Qs = Vs + kTile * pitch;
  A* dOs = Qs + kTile * pitch;
  A* Ps = dOs + kTile * pitch;        // [key][query], kTile + 1 wide
  A* DSs = Ps + kTile * (kTile + 1);  // p * (dp z - delta), same layout
  A* Ls = DSs + kTile * (kTile + 1);  // the query tile's lse and delta
  A* Dl = Ls + kTile;
  const int64_t bkv = blockIdx.x / tiles_k, s0 = (blockIdx.x % tiles_k) * kTile;
  const int64_t kvh = bkv % g.KV, b = bkv / g.KV, rep = g.H / g.KV;
  const int r = threadIdx.x / kRowThreads, sub = threadIdx.x % kRowThreads;  // r: this thread's key row
  const int64_t s = s0 + r;
  const A scale = static_cast<A>(g.scale);
  load_tile(Ks, k + g.rows.k.at(b, kvh, 0), s0, g.S, g.rows.k.row, g.D, A(1));
  load_tile(Vs, v + g.rows.v.at(b, kvh, 0), s0, g.S, g.rows.v.row, g.D, A(1));
  // Causal: the first query that can see key s0 is t = s0 - (S - T).
  const int64_t t_first = g.causal ? (s0 - (g.S - g.T) > 0 ? s0 - (g.S - g.T) : 0) : 0;
  A ak[kCols], av[kCols];
#pragma unroll
  for (int i = 0; i < kCols; ++i) ak[i] = av[i] = 0;
  for (int64_t hr = 0; hr < rep; ++hr) {
    const int64_t h = kvh * rep + hr, bh = b * g.H + h;
    for (int64_t t0 = (t_first / kTile) * kTile; t0 < g.T; t0 += kTile) {
      __syncthreads();
      load_tile(Qs, q + g.rows.q.at(b, h, 0), t0, g.T, g.rows.q.row, g.D, scale);
      load_tile(dOs, dout + g.rows.dout.at(b, h, 0), t0, g.T, g.rows.dout.row, g.D, A(1));
      for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
        const bool in = t0 + i < g.T;
        Ls[i] = in ? lse[bh * g.T + t0 + i] : A(-INFINITY);
        Dl[i] = in ? delta[bh * g.T + t0 + i] : A(0);
      }
      __syncthreads();
      A sc[kPerRow], dp[kPerRow];  // this key row against the tile's queries qi = sub + 4 i
      dot_rows(Ks + r * pitch, Qs, sub, pitch, g.D, sc);
      dot_rows(Vs + r * pitch, dOs, sub, pitch, g.D, dp);
#pragma unroll
      for (int i = 0; i < kPerRow; ++i) {
        const int qi = sub + kRowThreads * i;
        const int64_t t = t0 + qi;
        A p = 0, d = 0;
        if (t < g.T && s < g.S && Ls[qi] != A(-INFINITY) && g.visible(b, t, s)) {
          const A z = drop_factor<A>(g, shift, bh, t, s);
          p = exp(sc[i] - Ls[qi]);
          d = p * (dp[i] * z - Dl[qi]);
          p *= z;  // dv takes the dropped probability
        }
        Ps[r * (kTile + 1) + qi] = p;
        DSs[r * (kTile + 1) + qi] = d;
      }
      __syncwarp();
      for (int qi = 0; qi < kTile; ++qi) {
        const A p = Ps[r * (kTile + 1) + qi], d = DSs[r * (kTile + 1) + qi];
        if (p == A(0) && d == A(0)) continue;  // hidden (a dropped key still has d = -p delta)
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const int c = sub + kRowThreads * i;
          if (c < g.D) {
            av[i] += p * dOs[qi * pitch + c];
            ak[i] += d * Qs[qi * pitch + c];  // Qs holds q * scale: dk = sum p (dp z - delta) scale q
          }
        }
      }
    }
  }
  if (s >= g.S) return;
  T* dkp = dk + g.rows.dk.at(b, kvh, s);
  T* dvp = dv + g.rows.dv.at(b, kvh, s);
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int c = sub + kRowThreads * i;
    if (c < g.D) {
      st(dkp, c, ak[i]);
      st(dvp, c, av[i]);
    }
  }
}

// Shared-memory bytes of each tiled kernel.
template <typename A>
inline size_t forward_smem(int64_t D) {
  return (3 * kTile * (D + 1) + kTile * (kTile + 1)) * sizeof(A);
}
template <typename A>
inline size_t dq_smem(int64_t D) {
  return (4 * kTile * (D + 1) + kTile * (kTile + 1)) * sizeof(A);
}
template <typename A>
inline size_t dkv_smem(int64_t D) {
  return (4 * kTile * (D + 1) + 2 * kTile * (kTile + 1) + 2 * kTile) * sizeof(A);
}

}  // namespace tr::cuda::TR_ATTN_NAMESPACE
