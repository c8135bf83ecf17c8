// CUDA fused attention, first version: one thread per query row (forward, dq) or key row (dk, dv), online
// softmax, the logsumexp saved for backward; no score matrix is ever stored. The CPU twin in
// backend/cpu/attention.cpp defines the semantics; the tiled tensor-core version comes with the CUDA issue.
#include <cmath>

#include "backend/attention_geometry.h"
#include "backend/cuda/common.cuh"

namespace tr::cuda {

namespace {

constexpr int kMaxHeadDim = 256;

using Geo = backend::AttentionGeometry;

template <typename T>
__global__ void attention_forward_kernel(Geo g, const T* q, const T* k, const T* v, T* out, acc_t<T>* lse) {
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
    const A corr = exp(m - mx), p = exp(sc - mx);
    for (int64_t c = 0; c < g.D; ++c) acc[c] = acc[c] * corr + p * ld(vp, s * g.D + c);
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
__global__ void attention_dq_kernel(Geo g, const T* q, const T* k, const T* v, const acc_t<T>* lse,
                                    const acc_t<T>* delta, const T* dout, T* dq) {
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
      const A p = exp(sc * static_cast<A>(g.scale) - lse[row]);
      const A ds = p * (dp - delta[row]) * static_cast<A>(g.scale);
      for (int64_t c = 0; c < g.D; ++c) acc[c] += ds * ld(kp, s * g.D + c);
    }
  }
  for (int64_t c = 0; c < g.D; ++c) st(dq, row * g.D + c, acc[c]);
}

template <typename T>
__global__ void attention_dkv_kernel(Geo g, const T* q, const T* k, const T* v, const acc_t<T>* lse,
                                     const acc_t<T>* delta, const T* dout, T* dk, T* dv) {
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
      const A p = exp(sc * static_cast<A>(g.scale) - lse[row]);
      const A ds = p * (dp - delta[row]) * static_cast<A>(g.scale);
      for (int64_t c = 0; c < g.D; ++c) {
        av[c] += p * ld(dout, row * g.D + c);
        ak[c] += ds * ld(q, row * g.D + c);
      }
    }
  }
  for (int64_t c = 0; c < g.D; ++c) {
    st(dk, krow * g.D + c, ak[c]);
    st(dv, krow * g.D + c, av[c]);
  }
}

}  // namespace

void attention(DType dt, const void* q, const void* k, const void* v, const bool* keep, void* out, void* lse,
               int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S, int64_t D, bool causal, double scale) {
  if (D > kMaxHeadDim) throw std::runtime_error("cuda attention: head dim above 256 is not supported");
  Geo g{B, H, KV, T, S, D, causal, scale, keep};
  dispatch_float(dt, [&]<typename TT>() {
    attention_forward_kernel<TT><<<blocks_for(B * H * T, 128), 128>>>(
        g, static_cast<const TT*>(q), static_cast<const TT*>(k), static_cast<const TT*>(v),
        static_cast<TT*>(out), static_cast<acc_t<TT>*>(lse));
  });
  TR_CUDA_LAUNCH_CHECK("attention");
}

void attention_backward(DType dt, const void* q, const void* k, const void* v, const bool* keep,
                        const void* out, const void* lse, const void* dout, void* dq, void* dk, void* dv,
                        int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S, int64_t D, bool causal,
                        double scale) {
  if (D > kMaxHeadDim) throw std::runtime_error("cuda attention: head dim above 256 is not supported");
  Geo g{B, H, KV, T, S, D, causal, scale, keep};
  dispatch_float(dt, [&]<typename TT>() {
    using A = acc_t<TT>;
    A* delta = nullptr;
    TR_CUDA_CHECK(cudaMalloc(&delta, static_cast<size_t>(B * H * T) * sizeof(A) + 8));
    attention_delta_kernel<TT><<<blocks_for(B * H * T, 128), 128>>>(g, static_cast<const TT*>(out),
                                                                    static_cast<const TT*>(dout), delta);
    attention_dq_kernel<TT><<<blocks_for(B * H * T, 128), 128>>>(
        g, static_cast<const TT*>(q), static_cast<const TT*>(k), static_cast<const TT*>(v),
        static_cast<const A*>(lse), delta, static_cast<const TT*>(dout), static_cast<TT*>(dq));
    attention_dkv_kernel<TT><<<blocks_for(B * KV * S, 128), 128>>>(
        g, static_cast<const TT*>(q), static_cast<const TT*>(k), static_cast<const TT*>(v),
        static_cast<const A*>(lse), delta, static_cast<const TT*>(dout), static_cast<TT*>(dk),
        static_cast<TT*>(dv));
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    cudaFree(delta);
    TR_CUDA_CHECK(e);
  });
}

}  // namespace tr::cuda
