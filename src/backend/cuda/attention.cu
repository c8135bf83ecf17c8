// CUDA memory-efficient attention (any floating dtype, f32/f64 accumulation): tiled kernels that stage 32
// queries and 32 keys at a time in shared memory, four threads per row, online softmax, the logsumexp saved
// for backward; no score matrix beyond one 32 x 32 tile ever exists. Backward recomputes the tiles: one
// kernel for dq (per query tile), one for dk/dv (per key tile, summing the grouped query heads), so no
// atomics and the result is deterministic. Head dims above 128 (or tiles too big for shared memory) take the
// one-thread-per-row kernels. The CPU twin in backend/cpu/attention.cpp defines the semantics.
#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "backend/attention_geometry.h"
#include "backend/cuda/common.cuh"
#include "core/rng.h"

namespace tr::cuda {

namespace {

constexpr int kMaxHeadDim = 256;

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

template <typename T>
__global__ void attention_forward_kernel(Geo g, const uint64_t* shift, const T* q, const T* k, const T* v,
                                         T* out, acc_t<T>* lse) {
  using A = acc_t<T>;
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= g.B * g.H * g.T) return;
  const int64_t t = row % g.T, bh = row / g.T, h = bh % g.H, b = bh / g.H, kvh = h / (g.H / g.KV);
  const T* qp = q + row * g.D;
  const T* kp = k + (b * g.KV + kvh) * g.S * g.D;
  const T* vp = v + (b * g.KV + kvh) * g.S * g.D;
  A acc[kMaxHeadDim];
  for (int64_t c = 0; c < g.D; ++c) acc[c] = 0;
  A m = -INFINITY, l = 0;
  for (int64_t s = 0; s <= g.last_key(t); ++s) {
    if (!g.visible(b, t, s)) continue;
    A sc = 0;
    for (int64_t c = 0; c < g.D; ++c) sc += ld(qp, c) * static_cast<A>(g.scale) * ld(kp, s * g.D + c);
    const A mx = sc > m ? sc : m;
    const A corr = exp(m - mx), p = exp(sc - mx), pz = p * drop_factor<A>(g, shift, bh, t, s);
    for (int64_t c = 0; c < g.D; ++c) acc[c] = acc[c] * corr + pz * ld(vp, s * g.D + c);
    l = l * corr + p;
    m = mx;
  }
  const A inv = l > A(0) ? A(1) / l : A(0);
  for (int64_t c = 0; c < g.D; ++c) st(out, row * g.D + c, acc[c] * inv);
  lse[row] = l > A(0) ? m + log(l) : -INFINITY;
}

template <typename T>
__global__ void attention_delta_kernel(Geo g, const T* out, const T* dout, acc_t<T>* delta) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= g.B * g.H * g.T) return;
  acc_t<T> d = 0;
  for (int64_t c = 0; c < g.D; ++c) d += ld(dout, row * g.D + c) * ld(out, row * g.D + c);
  delta[row] = d;
}

template <typename T>
__global__ void attention_dq_kernel(Geo g, const uint64_t* shift, const T* q, const T* k, const T* v,
                                    const acc_t<T>* lse, const acc_t<T>* delta, const T* dout, T* dq) {
  using A = acc_t<T>;
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= g.B * g.H * g.T) return;
  const int64_t t = row % g.T, bh = row / g.T, h = bh % g.H, b = bh / g.H, kvh = h / (g.H / g.KV);
  const T* kp = k + (b * g.KV + kvh) * g.S * g.D;
  const T* vp = v + (b * g.KV + kvh) * g.S * g.D;
  A acc[kMaxHeadDim];
  for (int64_t c = 0; c < g.D; ++c) acc[c] = 0;
  if (lse[row] != -INFINITY) {
    for (int64_t s = 0; s <= g.last_key(t); ++s) {
      if (!g.visible(b, t, s)) continue;
      A sc = 0, dp = 0;
      for (int64_t c = 0; c < g.D; ++c) {
        sc += ld(q, row * g.D + c) * ld(kp, s * g.D + c);
        dp += ld(dout, row * g.D + c) * ld(vp, s * g.D + c);
      }
      const A p = exp(sc * static_cast<A>(g.scale) - lse[row]), z = drop_factor<A>(g, shift, bh, t, s);
      const A ds = p * (dp * z - delta[row]) * static_cast<A>(g.scale);
      for (int64_t c = 0; c < g.D; ++c) acc[c] += ds * ld(kp, s * g.D + c);
    }
  }
  for (int64_t c = 0; c < g.D; ++c) st(dq, row * g.D + c, acc[c]);
}

template <typename T>
__global__ void attention_dkv_kernel(Geo g, const uint64_t* shift, const T* q, const T* k, const T* v,
                                     const acc_t<T>* lse, const acc_t<T>* delta, const T* dout, T* dk,
                                     T* dv) {
  using A = acc_t<T>;
  const int64_t krow = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (krow >= g.B * g.KV * g.S) return;
  const int64_t s = krow % g.S, bkv = krow / g.S, kvh = bkv % g.KV, b = bkv / g.KV, rep = g.H / g.KV;
  A ak[kMaxHeadDim], av[kMaxHeadDim];
  for (int64_t c = 0; c < g.D; ++c) ak[c] = av[c] = 0;
  for (int64_t r = 0; r < rep; ++r) {
    const int64_t h = kvh * rep + r;
    for (int64_t t = 0; t < g.T; ++t) {
      const int64_t row = (b * g.H + h) * g.T + t;
      if (!g.visible(b, t, s) || lse[row] == -INFINITY) continue;
      A sc = 0, dp = 0;
      for (int64_t c = 0; c < g.D; ++c) {
        sc += ld(q, row * g.D + c) * ld(k, krow * g.D + c);
        dp += ld(dout, row * g.D + c) * ld(v, krow * g.D + c);
      }
      const A p = exp(sc * static_cast<A>(g.scale) - lse[row]),
              z = drop_factor<A>(g, shift, b * g.H + h, t, s);
      const A ds = p * (dp * z - delta[row]) * static_cast<A>(g.scale);
      for (int64_t c = 0; c < g.D; ++c) {
        av[c] += p * z * ld(dout, row * g.D + c);
        ak[c] += ds * ld(q, row * g.D + c);
      }
    }
  }
  for (int64_t c = 0; c < g.D; ++c) {
    st(dk, krow * g.D + c, ak[c]);
    st(dv, krow * g.D + c, av[c]);
  }
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

// Rows [r0, r0 + kTile) of a [rows, D] matrix into shared memory with leading dim D + 1 (bank-conflict
// free), times `mul`; rows past the end are zeros.
template <typename T, typename A>
__device__ void load_tile(A* dst, const T* src, int64_t r0, int64_t rows, int64_t D, A mul) {
  const int64_t pitch = D + 1;
  for (int64_t e = threadIdx.x; e < kTile * D; e += blockDim.x) {
    const int64_t rr = e / D, c = e % D;
    dst[rr * pitch + c] = r0 + rr < rows ? ld(src, (r0 + rr) * D + c) * mul : A(0);
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
  extern __shared__ double smem_d[];  // double-aligned
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
  const T* kb = k + (b * g.KV + kvh) * g.S * g.D;
  const T* vb = v + (b * g.KV + kvh) * g.S * g.D;
  load_tile(Qs, q + bh * g.T * g.D, t0, g.T, g.D, static_cast<A>(g.scale));
  const int64_t last = tile_last_key(g, t0), n_kt = last < 0 ? 0 : last / kTile + 1;
  A m = -INFINITY, l = 0, o[kCols];
#pragma unroll
  for (int i = 0; i < kCols; ++i) o[i] = 0;
  // A sliding window hides the tiles before the tile's first query's first key.
  for (int64_t kt = g.first_key(t0) / kTile; kt < n_kt; ++kt) {
    const int64_t s0 = kt * kTile;
    __syncthreads();  // the previous tile is consumed
    load_tile(Ks, kb, s0, g.S, g.D, A(1));
    load_tile(Vs, vb, s0, g.S, g.D, A(1));
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
    if (sub + kRowThreads * i < g.D) st(out, row * g.D + sub + kRowThreads * i, o[i] * inv);
  if (sub == 0) lse[row] = l > A(0) ? m + log(l) : A(-INFINITY);
}

template <typename T>
__global__ void __launch_bounds__(kTileThreads)
    attention_dq_tiled(Geo g, const uint64_t* shift, const T* q, const T* k, const T* v, const acc_t<T>* lse,
                       const acc_t<T>* delta, const T* dout, T* dq) {
  using A = acc_t<T>;
  extern __shared__ double smem_d[];
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
  const T* kb = k + (b * g.KV + kvh) * g.S * g.D;
  const T* vb = v + (b * g.KV + kvh) * g.S * g.D;
  const A scale = static_cast<A>(g.scale);
  load_tile(Qs, q + bh * g.T * g.D, t0, g.T, g.D, scale);
  load_tile(dOs, dout + bh * g.T * g.D, t0, g.T, g.D, A(1));
  const A lse_r = t < g.T ? lse[row] : A(-INFINITY), delta_r = t < g.T ? delta[row] : A(0);
  const int64_t last = tile_last_key(g, t0), n_kt = last < 0 ? 0 : last / kTile + 1;
  A acc[kCols];
#pragma unroll
  for (int i = 0; i < kCols; ++i) acc[i] = 0;
  for (int64_t kt = g.first_key(t0) / kTile; kt < n_kt; ++kt) {
    const int64_t s0 = kt * kTile;
    __syncthreads();
    load_tile(Ks, kb, s0, g.S, g.D, A(1));
    load_tile(Vs, vb, s0, g.S, g.D, A(1));
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
    if (sub + kRowThreads * i < g.D) st(dq, row * g.D + sub + kRowThreads * i, acc[i]);
}

template <typename T>
__global__ void __launch_bounds__(kTileThreads)
    attention_dkv_tiled(Geo g, const uint64_t* shift, const T* q, const T* k, const T* v, const acc_t<T>* lse,
                        const acc_t<T>* delta, const T* dout, T* dk, T* dv) {
  using A = acc_t<T>;
  extern __shared__ double smem_d[];
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
  load_tile(Ks, k + bkv * g.S * g.D, s0, g.S, g.D, A(1));
  load_tile(Vs, v + bkv * g.S * g.D, s0, g.S, g.D, A(1));
  // Causal: the first query that can see key s0 is t = s0 - (S - T).
  const int64_t t_first = g.causal ? (s0 - (g.S - g.T) > 0 ? s0 - (g.S - g.T) : 0) : 0;
  A ak[kCols], av[kCols];
#pragma unroll
  for (int i = 0; i < kCols; ++i) ak[i] = av[i] = 0;
  for (int64_t hr = 0; hr < rep; ++hr) {
    const int64_t bh = b * g.H + kvh * rep + hr;
    for (int64_t t0 = (t_first / kTile) * kTile; t0 < g.T; t0 += kTile) {
      __syncthreads();
      load_tile(Qs, q + bh * g.T * g.D, t0, g.T, g.D, scale);
      load_tile(dOs, dout + bh * g.T * g.D, t0, g.T, g.D, A(1));
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
  const int64_t krow = bkv * g.S + s;
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int c = sub + kRowThreads * i;
    if (c < g.D) {
      st(dk, krow * g.D + c, ak[i]);
      st(dv, krow * g.D + c, av[i]);
    }
  }
}

// ---- blocked attention's row kernels (the products are GEMMs; see Backend::AttentionBlock)
struct BlockRows {
  Geo g;
  int64_t per_group, t0, tq, sk;
  float dropout;
  double keep_scale;
  uint64_t seed, offset;
  const uint64_t* shift;  // a CUDA graph's launch: added to offset (null: none)
  __device__ int64_t batch(int64_t row) const { return row / per_group / g.KV; }
  __device__ int64_t query(int64_t row) const { return t0 + row % per_group % tq; }
  // The dropout factor of (row, key s), as the CPU twin: from the element's index in [B, H, T, S].
  __device__ double factor(int64_t row, int64_t s) const {
    if (dropout == 0.0f) return 1.0;
    const int64_t grp = row / per_group, rr = row % per_group;
    const int64_t h = grp % g.KV * (g.H / g.KV) + rr / tq;
    const uint64_t idx = static_cast<uint64_t>(((batch(row) * g.H + h) * g.T + query(row)) * g.S + s);
    return uniform_from_word(philox_word(seed, offset + (shift ? *shift : 0), idx)) >= dropout ? keep_scale
                                                                                               : 0.0;
  }
};

// The row's constants, computed once per block (per-element 64-bit divisions for the batch, query and the
// visible range were these kernels' bound): the visible keys lo..hi and the key mask's row.
struct RowView {
  int64_t lo, hi;
  const bool* keep;
  __device__ RowView(const BlockRows& br, int64_t row)
      : lo(br.g.first_key(br.query(row))),
        hi(br.g.last_key(br.query(row))),
        keep(br.g.keep ? br.g.keep + br.batch(row) * br.g.S : nullptr) {}
  __device__ bool on(int64_t s) const { return s >= lo && s <= hi && (keep == nullptr || keep[s]); }
};

// Keys per thread held in registers by block_softmax_kernel: rows up to 4 x 256 keys are read once.
// (A warp per row with 32 keys per lane in registers measured slower on the H200: 767 vs 548 us per call
// for GPT-2's blocks, so a block of up to 256 threads per row stays.)
constexpr int kRowRegs = 4;

// One block per row: max, sum, then the probabilities exp(x - lse) of the visible keys. Bound by HBM (4 bytes
// read, 2-4 written per score): a row that fits in registers is read once, and masked keys are never read.
template <typename A, typename P>
__global__ void block_softmax_kernel(BlockRows br, const A* scores, P* probs, A* lse) {
  __shared__ A sh[32];
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
           v[j] != A(-INFINITY) && l != A(-INFINITY) ? exp(v[j] - l) * static_cast<A>(br.factor(row, s))
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
    st(p, s, rv.on(s) ? exp(x[s] * scale - l) * static_cast<A>(br.factor(row, s)) : A(0));
}

// One block per row (row constants once, RowView); bound by HBM: 8 bytes read and 2-4 written per score.
template <typename A, typename P>
__global__ void block_grad_kernel(BlockRows br, const A* scores, const A* dp, const A* lse, const A* delta,
                                  P* probs, P* dscores) {
  const int64_t row = blockIdx.x, base = row * br.sk;
  const RowView rv(br, row);
  const A scale = static_cast<A>(br.g.scale), l = lse[row], dl = delta[row];
  const bool any = l != A(-INFINITY);
  for (int64_t s = threadIdx.x; s < br.sk; s += blockDim.x) {
    const bool on = any && rv.on(s);
    const A pv = on ? exp(scores[base + s] * scale - l) : A(0), z = static_cast<A>(br.factor(row, s));
    st(probs, base + s, pv * z);
    st(dscores, base + s, pv * (dp[base + s] * z - dl) * scale);
  }
}

// Threads per row block: the row's keys rounded up to whole warps, at most 256.
inline int row_threads(int64_t sk) {
  return static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (sk + 31) / 32 * 32)));
}

// Shared-memory bytes of each tiled kernel, and whether the device grants them (opt-in above 48 KiB).
template <typename A>
size_t forward_smem(int64_t D) {
  return (3 * kTile * (D + 1) + kTile * (kTile + 1)) * sizeof(A);
}
template <typename A>
size_t dq_smem(int64_t D) {
  return (4 * kTile * (D + 1) + kTile * (kTile + 1)) * sizeof(A);
}
template <typename A>
size_t dkv_smem(int64_t D) {
  return (4 * kTile * (D + 1) + 2 * kTile * (kTile + 1) + 2 * kTile) * sizeof(A);
}

template <typename K>
bool allow_smem(K kernel, size_t bytes) {
  int dev = 0, optin = 0;
  TR_CUDA_CHECK(cudaGetDevice(&dev));
  TR_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > static_cast<size_t>(optin)) return false;
  if (bytes > 48 * 1024)
    TR_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return true;
}

}  // namespace

namespace {

// The flash kernels move pairs of halves: every operand starts on an even element (views at odd offsets take
// the tiled kernels).
bool aligned4(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (!aligned_to(p, 4)) return false;
  return true;
}

Geo geometry(const bool* keep, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S, int64_t D, bool causal,
             int64_t window, double scale, double dropout, uint64_t seed, uint64_t offset) {
  Geo g{B, H, KV, T, S, D, causal, scale, keep, window};
  return g.with_dropout(dropout, seed, offset);
}

}  // namespace

void attention(Stream stream, DType dt, const void* q, const void* k, const void* v, const bool* keep,
               void* out, void* lse, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S, int64_t D,
               bool causal, int64_t window, double scale, double dropout, uint64_t seed, uint64_t offset,
               const uint64_t* shift) {
  if (flash_attention_fits(dt, D) && aligned4({q, k, v, out}))
    return flash_attention(stream, dt, q, k, v, keep, out, lse, B, H, KV, T, S, D, causal, window, scale,
                           dropout, seed, offset, shift);
  if (D > kMaxHeadDim) throw std::runtime_error("cuda attention: head dim above 256 is not supported");
  if (B * H * T == 0) return;
  const Geo g = geometry(keep, B, H, KV, T, S, D, causal, window, scale, dropout, seed, offset);
  if (dropout == 0) shift = nullptr;
  dispatch_float(dt, [&]<typename TT>() {
    using A = acc_t<TT>;
    const size_t smem = forward_smem<A>(D);
    if (D <= kTileMaxDim && allow_smem(attention_forward_tiled<TT>, smem)) {
      const int64_t blocks = B * H * ((T + kTile - 1) / kTile);
      attention_forward_tiled<TT><<<static_cast<unsigned>(blocks), kTileThreads, smem, stream>>>(
          g, shift, static_cast<const TT*>(q), static_cast<const TT*>(k), static_cast<const TT*>(v),
          static_cast<TT*>(out), static_cast<A*>(lse));
    } else {
      attention_forward_kernel<TT><<<blocks_for(B * H * T, 128), 128, 0, stream>>>(
          g, shift, static_cast<const TT*>(q), static_cast<const TT*>(k), static_cast<const TT*>(v),
          static_cast<TT*>(out), static_cast<A*>(lse));
    }
  });
  TR_CUDA_LAUNCH_CHECK("attention");
}

void attention_backward(Stream stream, DType dt, const void* q, const void* k, const void* v,
                        const bool* keep, const void* out, const void* lse, const void* dout, void* dq,
                        void* dk, void* dv, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S, int64_t D,
                        bool causal, int64_t window, double scale, double dropout, uint64_t seed,
                        uint64_t offset, const uint64_t* shift, Scratch& scratch) {
  if (flash_attention_fits(dt, D) && aligned4({q, k, v, out, dout, dq, dk, dv}))
    return flash_attention_backward(stream, dt, q, k, v, keep, out, lse, dout, dq, dk, dv, B, H, KV, T, S, D,
                                    causal, window, scale, dropout, seed, offset, shift, scratch);
  if (D > kMaxHeadDim) throw std::runtime_error("cuda attention: head dim above 256 is not supported");
  const Geo g = geometry(keep, B, H, KV, T, S, D, causal, window, scale, dropout, seed, offset);
  if (dropout == 0) shift = nullptr;
  if (B * H * T == 0) return;
  dispatch_float(dt, [&]<typename TT>() {
    using A = acc_t<TT>;
    // delta = rowsum(dout * out), in stream order (no host sync).
    auto* delta = static_cast<A*>(scratch.take(static_cast<size_t>(B * H * T) * sizeof(A)));
    attention_delta_kernel<TT><<<blocks_for(B * H * T, 128), 128, 0, stream>>>(
        g, static_cast<const TT*>(out), static_cast<const TT*>(dout), delta);
    TR_CUDA_LAUNCH_CHECK("attention_delta");
    const auto* qp = static_cast<const TT*>(q);
    const auto* kp = static_cast<const TT*>(k);
    const auto* vp = static_cast<const TT*>(v);
    const auto* dop = static_cast<const TT*>(dout);
    const auto* lp = static_cast<const A*>(lse);
    const bool tiled = D <= kTileMaxDim && allow_smem(attention_dq_tiled<TT>, dq_smem<A>(D)) &&
                       allow_smem(attention_dkv_tiled<TT>, dkv_smem<A>(D));
    if (tiled) {
      const int64_t qblocks = B * H * ((T + kTile - 1) / kTile), kblocks = B * KV * ((S + kTile - 1) / kTile);
      attention_dq_tiled<TT><<<static_cast<unsigned>(qblocks), kTileThreads, dq_smem<A>(D), stream>>>(
          g, shift, qp, kp, vp, lp, delta, dop, static_cast<TT*>(dq));
      TR_CUDA_LAUNCH_CHECK("attention_dq");
      if (kblocks > 0)
        attention_dkv_tiled<TT><<<static_cast<unsigned>(kblocks), kTileThreads, dkv_smem<A>(D), stream>>>(
            g, shift, qp, kp, vp, lp, delta, dop, static_cast<TT*>(dk), static_cast<TT*>(dv));
      TR_CUDA_LAUNCH_CHECK("attention_dkv");
    } else {
      attention_dq_kernel<TT><<<blocks_for(B * H * T, 128), 128, 0, stream>>>(g, shift, qp, kp, vp, lp, delta,
                                                                              dop, static_cast<TT*>(dq));
      TR_CUDA_LAUNCH_CHECK("attention_dq");
      attention_dkv_kernel<TT><<<blocks_for(B * KV * S, 128), 128, 0, stream>>>(
          g, shift, qp, kp, vp, lp, delta, dop, static_cast<TT*>(dk), static_cast<TT*>(dv));
      TR_CUDA_LAUNCH_CHECK("attention_dkv");
    }
  });
}

namespace {

// f32/f64 scores (A) with probabilities of any floating dtype (P).
template <typename F>
void dispatch_block(DType sdt, DType pdt, F&& f) {
  if (sdt != DType::f32 && sdt != DType::f64)
    throw std::runtime_error("blocked attention: scores must be f32/f64");
  dispatch_float(pdt, [&]<typename P>() {
    if (sdt == DType::f32)
      f.template operator()<float, P>();
    else
      f.template operator()<double, P>();
  });
}

}  // namespace

namespace {

BlockRows block_rows_of(const bool* keep, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S, int64_t t0,
                        int64_t tq, int64_t sk, bool causal, int64_t window, double scale, double dropout,
                        uint64_t seed, uint64_t offset, const uint64_t* shift) {
  return {Geo{B, H, KV, T, S, 0, causal, scale, keep, window},
          H / KV * tq,
          t0,
          tq,
          sk,
          static_cast<float>(dropout),
          1.0 / (1.0 - dropout),
          seed,
          offset,
          shift};
}

}  // namespace

void attention_block_softmax(Stream stream, DType sdt, DType pdt, const void* scores, void* probs, void* lse,
                             const bool* keep, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S,
                             int64_t t0, int64_t tq, int64_t sk, bool causal, int64_t window, double scale,
                             double dropout, uint64_t seed, uint64_t offset, const uint64_t* shift) {
  const int64_t rows = B * H * tq;
  if (rows == 0) return;
  const BlockRows br =
      block_rows_of(keep, B, H, KV, T, S, t0, tq, sk, causal, window, scale, dropout, seed, offset, shift);
  dispatch_block(sdt, pdt, [&]<typename A, typename P>() {
    block_softmax_kernel<A, P><<<static_cast<unsigned>(rows), row_threads(sk), 0, stream>>>(
        br, static_cast<const A*>(scores), static_cast<P*>(probs), static_cast<A*>(lse));
  });
  TR_CUDA_LAUNCH_CHECK("attention_block_softmax");
}

void attention_block_grad(Stream stream, DType sdt, DType pdt, const void* scores, const void* dp,
                          const void* lse, const void* delta, void* probs, void* dscores, const bool* keep,
                          int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S, int64_t t0, int64_t tq,
                          int64_t sk, bool causal, int64_t window, double scale, double dropout,
                          uint64_t seed, uint64_t offset, const uint64_t* shift) {
  const int64_t rows = B * H * tq;
  if (rows * sk == 0) return;
  const BlockRows br =
      block_rows_of(keep, B, H, KV, T, S, t0, tq, sk, causal, window, scale, dropout, seed, offset, shift);
  dispatch_block(sdt, pdt, [&]<typename A, typename P>() {
    block_grad_kernel<A, P><<<static_cast<unsigned>(rows), row_threads(sk), 0, stream>>>(
        br, static_cast<const A*>(scores), static_cast<const A*>(dp), static_cast<const A*>(lse),
        static_cast<const A*>(delta), static_cast<P*>(probs), static_cast<P*>(dscores));
  });
  TR_CUDA_LAUNCH_CHECK("attention_block_grad");
}

}  // namespace tr::cuda
