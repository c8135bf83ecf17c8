// CUDA memory-efficient attention (any floating dtype, f32/f64 accumulation): tiled kernels that stage 32
// queries and 32 keys at a time in shared memory, four threads per row, online softmax, the logsumexp saved
// for backward; no score matrix beyond one 32 x 32 tile ever exists. Backward recomputes the tiles: one
// kernel for dq (per query tile), one for dk/dv (per key tile, summing the grouped query heads), so no
// atomics and the result is deterministic. Head dims above 128 (or tiles too big for shared memory) take the
// one-thread-per-row kernels. The CPU twin in backend/cpu/attention.cpp defines the semantics.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <utility>

#include "backend/attention_geometry.h"
#include "backend/cuda/attention_tiled.cuh"
#include "backend/cuda/blocked_rows.cuh"
#include "backend/cuda/common.cuh"
#include "core/rng.h"

namespace tr::cuda {

namespace {

constexpr int kMaxHeadDim = 256;

using Geo = backend::AttentionGeometry;
using namespace tiled;    // the tiled kernels, drop_factor and their shared-memory sizes
using namespace blocked;  // blocked attention's row kernels (BlockRows, row_threads)

template <typename T>
__global__ void attention_forward_kernel(Geo g, const uint64_t* shift, const T* q, const T* k, const T* v,
                                         T* out, acc_t<T>* lse) {
  using A = acc_t<T>;
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= g.B * g.H * g.T) return;
  const int64_t t = row % g.T, bh = row / g.T, h = bh % g.H, b = bh / g.H, kvh = h / (g.H / g.KV);
  const T* qp = q + g.rows.q.at(b, h, t);
  const T* kp = k + g.rows.k.at(b, kvh, 0);
  const T* vp = v + g.rows.v.at(b, kvh, 0);
  const int64_t lk = g.rows.k.row, lv = g.rows.v.row;
  A acc[kMaxHeadDim];
  for (int64_t c = 0; c < g.D; ++c) acc[c] = 0;
  A m = -INFINITY, l = 0;
  for (int64_t s = 0; s <= g.last_key(t); ++s) {
    if (!g.visible(b, t, s)) continue;
    A sc = 0;
    for (int64_t c = 0; c < g.D; ++c) sc += ld(qp, c) * static_cast<A>(g.scale) * ld(kp, s * lk + c);
    const A mx = sc > m ? sc : m;
    const A corr = exp(m - mx), p = exp(sc - mx), pz = p * drop_factor<A>(g, shift, bh, t, s);
    for (int64_t c = 0; c < g.D; ++c) acc[c] = acc[c] * corr + pz * ld(vp, s * lv + c);
    l = l * corr + p;
    m = mx;
  }
  const A inv = l > A(0) ? A(1) / l : A(0);
  T* op = out + g.rows.out.at(b, h, t);
  for (int64_t c = 0; c < g.D; ++c) st(op, c, acc[c] * inv);
  lse[row] = l > A(0) ? m + log(l) : -INFINITY;
}

template <typename T>
__global__ void attention_delta_kernel(Geo g, const T* out, const T* dout, acc_t<T>* delta) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= g.B * g.H * g.T) return;
  const int64_t t = row % g.T, bh = row / g.T, h = bh % g.H, b = bh / g.H;
  const T* dp = dout + g.rows.dout.at(b, h, t);
  const T* op = out + g.rows.out.at(b, h, t);
  acc_t<T> d = 0;
  for (int64_t c = 0; c < g.D; ++c) d += ld(dp, c) * ld(op, c);
  delta[row] = d;
}

template <typename T>
__global__ void attention_dq_kernel(Geo g, const uint64_t* shift, const T* q, const T* k, const T* v,
                                    const acc_t<T>* lse, const acc_t<T>* delta, const T* dout, T* dq) {
  using A = acc_t<T>;
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= g.B * g.H * g.T) return;
  const int64_t t = row % g.T, bh = row / g.T, h = bh % g.H, b = bh / g.H, kvh = h / (g.H / g.KV);
  const T* kp = k + g.rows.k.at(b, kvh, 0);
  const T* vp = v + g.rows.v.at(b, kvh, 0);
  const T* qp = q + g.rows.q.at(b, h, t);
  const T* dop = dout + g.rows.dout.at(b, h, t);
  const int64_t lk = g.rows.k.row, lv = g.rows.v.row;
  A acc[kMaxHeadDim];
  for (int64_t c = 0; c < g.D; ++c) acc[c] = 0;
  if (lse[row] != -INFINITY) {
    for (int64_t s = 0; s <= g.last_key(t); ++s) {
      if (!g.visible(b, t, s)) continue;
      A sc = 0, dp = 0;
      for (int64_t c = 0; c < g.D; ++c) {
        sc += ld(qp, c) * ld(kp, s * lk + c);
        dp += ld(dop, c) * ld(vp, s * lv + c);
      }
      const A p = exp(sc * static_cast<A>(g.scale) - lse[row]), z = drop_factor<A>(g, shift, bh, t, s);
      const A ds = p * (dp * z - delta[row]) * static_cast<A>(g.scale);
      for (int64_t c = 0; c < g.D; ++c) acc[c] += ds * ld(kp, s * lk + c);
    }
  }
  T* dqp = dq + g.rows.dq.at(b, h, t);
  for (int64_t c = 0; c < g.D; ++c) st(dqp, c, acc[c]);
}

template <typename T>
__global__ void attention_dkv_kernel(Geo g, const uint64_t* shift, const T* q, const T* k, const T* v,
                                     const acc_t<T>* lse, const acc_t<T>* delta, const T* dout, T* dk,
                                     T* dv) {
  using A = acc_t<T>;
  const int64_t krow = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (krow >= g.B * g.KV * g.S) return;
  const int64_t s = krow % g.S, bkv = krow / g.S, kvh = bkv % g.KV, b = bkv / g.KV, rep = g.H / g.KV;
  const T* kp = k + g.rows.k.at(b, kvh, s);
  const T* vp = v + g.rows.v.at(b, kvh, s);
  A ak[kMaxHeadDim], av[kMaxHeadDim];
  for (int64_t c = 0; c < g.D; ++c) ak[c] = av[c] = 0;
  for (int64_t r = 0; r < rep; ++r) {
    const int64_t h = kvh * rep + r;
    for (int64_t t = 0; t < g.T; ++t) {
      const int64_t row = (b * g.H + h) * g.T + t;
      if (!g.visible(b, t, s) || lse[row] == -INFINITY) continue;
      const T* qp = q + g.rows.q.at(b, h, t);
      const T* dop = dout + g.rows.dout.at(b, h, t);
      A sc = 0, dp = 0;
      for (int64_t c = 0; c < g.D; ++c) {
        sc += ld(qp, c) * ld(kp, c);
        dp += ld(dop, c) * ld(vp, c);
      }
      const A p = exp(sc * static_cast<A>(g.scale) - lse[row]),
              z = drop_factor<A>(g, shift, b * g.H + h, t, s);
      const A ds = p * (dp * z - delta[row]) * static_cast<A>(g.scale);
      for (int64_t c = 0; c < g.D; ++c) {
        av[c] += p * z * ld(dop, c);
        ak[c] += ds * ld(qp, c);
      }
    }
  }
  T* dkp = dk + g.rows.dk.at(b, kvh, s);
  T* dvp = dv + g.rows.dv.at(b, kvh, s);
  for (int64_t c = 0; c < g.D; ++c) {
    st(dkp, c, ak[c]);
    st(dvp, c, av[c]);
  }
}

// Whether the device grants a tiled kernel `bytes` of shared memory (opt-in above 48 KiB).
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

void attention(Stream stream, DType dt, const Geo& g, const void* q, const void* k, const void* v, void* out,
               void* lse, const uint64_t* shift) {
  const auto& r = g.rows;
  if (flash_attention_fits(dt, g.D) && half_rows_aligned({{q, r.q}, {k, r.k}, {v, r.v}, {out, r.out}}, 4))
    return flash_attention(stream, dt, g, q, k, v, out, lse, shift);
  const int64_t B = g.B, H = g.H, T = g.T, D = g.D;
  if (D > kMaxHeadDim) throw std::runtime_error("cuda attention: head dim above 256 is not supported");
  if (B * H * T == 0) return;
  if (g.dropout == 0) shift = nullptr;
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

void attention_backward(Stream stream, DType dt, const Geo& g, const void* q, const void* k, const void* v,
                        const void* out, const void* lse, const void* dout, void* dq, void* dk, void* dv,
                        const uint64_t* shift, Scratch& scratch) {
  const auto& r = g.rows;
  if (flash_attention_fits(dt, g.D) &&
      half_rows_aligned(
          {{q, r.q}, {k, r.k}, {v, r.v}, {out, r.out}, {dout, r.dout}, {dq, r.dq}, {dk, r.dk}, {dv, r.dv}},
          4))
    return flash_attention_backward(stream, dt, g, q, k, v, out, lse, dout, dq, dk, dv, shift, scratch);
  const int64_t B = g.B, H = g.H, KV = g.KV, T = g.T, S = g.S, D = g.D;
  if (D > kMaxHeadDim) throw std::runtime_error("cuda attention: head dim above 256 is not supported");
  if (g.dropout == 0) shift = nullptr;
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
