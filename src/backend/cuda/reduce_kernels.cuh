// CUDA reductions over [outer, r, inner] with few outputs and long r (bias gradients over B*T rows, a
// whole-tensor sum) and the norms' weight and bias gradients (nn.cu): r split into chunks, pass 1 one f64
// partial per (chunk, output), pass 2 the chunks combined in order, so the result does not depend on
// scheduling. reduce.cu and nn.cu launch them; in a header of their own so that the CPU runs this very code
// (tests/cuda_emulator.h; tests/test_reduce_emulated.cpp against the CPU backend's reductions). Bound
// by HBM, and so by the bytes in flight: a thread per output reading 2-byte elements one row at a time kept
// ~130 KB in flight and ran at ~0.4 TB/s on the H200 (GPT-2's bias gradients, 6.6 ms a step). Rows of 16-byte
// packs, eight rows a thread at a time, keep MBs in flight (GPT-2 768-column bias: 96 packs x 512 chunks,
// 8 x 16 bytes a thread: ~6 MB).
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/cuda/kernel_basics.cuh"  // Pack, reduce_chunks
#include "backend/cuda/kernels.h"          // ReduceOp
#ifndef TR_RED_EMULATED
#include "backend/cuda/common.cuh"  // acc_t, ld, st (the emulation brings its own)
#endif

// The kernels' namespace (the emulation's own, so its host copies never meet the device build's symbols).
#ifndef TR_RED_NAMESPACE
#define TR_RED_NAMESPACE red
#endif

namespace tr::cuda::TR_RED_NAMESPACE {

__device__ __forceinline__ double combine(backend::ReduceOp op, double acc, double v) {
  if (op == backend::ReduceOp::max) return (v != v || v > acc) ? v : acc;
  if (op == backend::ReduceOp::min) return (v != v || v < acc) ? v : acc;
  return acc + v;
}

__device__ __forceinline__ double identity(backend::ReduceOp op) {
  return op == backend::ReduceOp::max ? -INFINITY : op == backend::ReduceOp::min ? INFINITY : 0.0;
}

// Pass 1's chunks over r rows for m outputs, by the layout alone: where the outputs come in packs of V
// (inner a multiple of V) the packed pass runs on aligned data, and unaligned data runs the scalar pass with
// the same chunks, so the bits never depend on an address. Packed chunks may be as short as 32 rows: a pack
// thread moves V columns, so GPT-2's 768-column norms need the shorter chunks to spread over every SM.
inline int64_t pass1_chunks(int64_t m, int64_t r, int64_t inner, int V) {
  return inner % V != 0 ? reduce_chunks(m, r) : reduce_chunks(m / V, r, 32);
}

// Pass 1, any layout: thread t takes output t % m over chunk t / m.
template <typename T>
__global__ void reduce_partial_kernel(backend::ReduceOp op, const T* x, double* partial, int64_t outer,
                                      int64_t r, int64_t inner, int64_t chunk, int64_t chunks) {
  const int64_t m = outer * inner;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < m * chunks;
       t += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t o = t % m, c = t / m, a = o / inner, j = o % inner;
    const int64_t end = (c + 1) * chunk < r ? (c + 1) * chunk : r;
    double acc = identity(op);
    for (int64_t i = c * chunk; i < end; ++i)
      acc = combine(op, acc, static_cast<double>(ld(x, (a * r + i) * inner + j)));
    partial[t] = acc;
  }
}

// Pass 1 over whole packs: inner a multiple of V and x 16-byte aligned. Thread t takes the V outputs of pack
// t % (m / V) over chunk t / (m / V), kRows independent pack loads in flight per step; each output's rows
// are still added in order, so the partials are pass 1's for the same chunking.
constexpr int kRows = 8;
template <typename T, int V>
__global__ void reduce_packs_partial_kernel(backend::ReduceOp op, const T* x, double* partial, int64_t outer,
                                            int64_t r, int64_t inner, int64_t chunk, int64_t chunks) {
  const int64_t m = outer * inner, packs = m / V;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < packs * chunks;
       t += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t p = t % packs, c = t / packs, o = p * V, a = o / inner, j = o % inner;
    const int64_t begin = c * chunk, end = (c + 1) * chunk < r ? (c + 1) * chunk : r;
    const Pack<T, V>* rows = reinterpret_cast<const Pack<T, V>*>(x + a * r * inner + j);
    const int64_t stride = inner / V;  // packs from one row to the next
    double acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = identity(op);
    int64_t i = begin;
    for (; i + kRows <= end; i += kRows) {
      Pack<T, V> in[kRows];
#pragma unroll
      for (int u = 0; u < kRows; ++u) in[u] = rows[(i + u) * stride];
#pragma unroll
      for (int u = 0; u < kRows; ++u)
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = combine(op, acc[k], static_cast<double>(ld(in[u].v, k)));
    }
    for (; i < end; ++i) {
      const Pack<T, V> in = rows[i * stride];
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = combine(op, acc[k], static_cast<double>(ld(in.v, k)));
    }
#pragma unroll
    for (int k = 0; k < V; ++k) partial[c * m + o + k] = acc[k];
  }
}

// Pass 2: output o combines its chunks' partials in chunk order (mean divides once, at the end).
template <typename T>
__global__ void reduce_combine_kernel(backend::ReduceOp op, const double* partial, T* y, int64_t m, int64_t r,
                                      int64_t chunks) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < m;
       o += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    double acc = identity(op);
    for (int64_t c = 0; c < chunks; ++c) acc = combine(op, acc, partial[c * m + o]);
    if (op == backend::ReduceOp::mean) acc /= static_cast<double>(r);
    st(y, o, static_cast<acc_t<T>>(acc));
  }
}

// gw[j] = sum_r gy[r, j] * xhat[r, j]; gb[j] = sum_r gy[r, j]. mean may be null (RMSNorm: xhat = x * rstd).
// Rows split into `chunks` (reduce_chunks): pass 1 writes f64 partials [chunk][2][n], pass 2 adds them in
// chunk order (deterministic).
template <typename T>
__global__ void norm_param_partial_kernel(const T* x, const acc_t<T>* mean, const acc_t<T>* rstd, const T* gy,
                                          double* partial, int64_t rows, int64_t n, int64_t chunk,
                                          int64_t chunks) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n * chunks;
       t += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t j = t % n, c = t / n, end = (c + 1) * chunk < rows ? (c + 1) * chunk : rows;
    double aw = 0, ab = 0;
    for (int64_t r = c * chunk; r < end; ++r) {
      const acc_t<T> g = ld(gy, r * n + j);
      const acc_t<T> xh = (ld(x, r * n + j) - (mean ? mean[r] : acc_t<T>(0))) * rstd[r];
      aw += static_cast<double>(g * xh);
      ab += static_cast<double>(g);
    }
    partial[(c * 2) * n + j] = aw;
    partial[(c * 2 + 1) * n + j] = ab;
  }
}

// The same over whole packs (n a multiple of V, x and gy 16-byte aligned): thread t takes the V columns of
// pack t % (n / V) over chunk t / (n / V), kRows rows of loads in flight per step; per column the rows are
// added in order with the scalar kernel's element math.
template <typename T, int V>
__global__ void norm_param_packs_partial_kernel(const T* x, const acc_t<T>* mean, const acc_t<T>* rstd,
                                                const T* gy, double* partial, int64_t rows, int64_t n,
                                                int64_t chunk, int64_t chunks) {
  using A = acc_t<T>;
  const int64_t packs = n / V, stride = n / V;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < packs * chunks;
       t += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t p = t % packs, c = t / packs, j = p * V;
    const int64_t end = (c + 1) * chunk < rows ? (c + 1) * chunk : rows;
    const Pack<T, V>* xr = reinterpret_cast<const Pack<T, V>*>(x + j);
    const Pack<T, V>* gr = reinterpret_cast<const Pack<T, V>*>(gy + j);
    double aw[V], ab[V];
#pragma unroll
    for (int k = 0; k < V; ++k) aw[k] = ab[k] = 0.0;
    const auto add = [&](const Pack<T, V>& xs, const Pack<T, V>& gs, A mu, A rs) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A g = ld(gs.v, k), xh = (ld(xs.v, k) - mu) * rs;
        aw[k] += static_cast<double>(g * xh);
        ab[k] += static_cast<double>(g);
      }
    };
    int64_t r = c * chunk;
    for (; r + kRows <= end; r += kRows) {
      Pack<T, V> xs[kRows], gs[kRows];
#pragma unroll
      for (int u = 0; u < kRows; ++u) xs[u] = xr[(r + u) * stride], gs[u] = gr[(r + u) * stride];
#pragma unroll
      for (int u = 0; u < kRows; ++u) add(xs[u], gs[u], mean ? mean[r + u] : A(0), rstd[r + u]);
    }
    for (; r < end; ++r) add(xr[r * stride], gr[r * stride], mean ? mean[r] : A(0), rstd[r]);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      partial[(c * 2) * n + j + k] = aw[k];
      partial[(c * 2 + 1) * n + j + k] = ab[k];
    }
  }
}

template <typename T>
__global__ void norm_param_combine_kernel(const double* partial, T* gw, T* gb, int64_t n, int64_t chunks) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  double aw = 0, ab = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    aw += partial[(c * 2) * n + j];
    ab += partial[(c * 2 + 1) * n + j];
  }
  if (gw) st(gw, j, static_cast<acc_t<T>>(aw));
  if (gb) st(gb, j, static_cast<acc_t<T>>(ab));
}

}  // namespace tr::cuda::TR_RED_NAMESPACE
