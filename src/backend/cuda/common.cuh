// Device-side helpers shared by the .cu files: dtype -> CUDA type mapping, f32/f64 accumulation,
// launch checking, block reductions, and strided offset computation.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "backend/cuda/kernels.h"

namespace tr::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line);

#define TR_CUDA_CHECK(call)                                                             \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) ::tr::cuda::throw_cuda_error(e_, #call, __FILE__, __LINE__); \
  } while (0)
// After every launch: configuration errors show up here, asynchronous ones at the next sync.
#define TR_CUDA_LAUNCH_CHECK(name) TR_CUDA_CHECK(cudaGetLastError())

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};
template <typename T>
using acc_t = typename Acc<T>::type;

template <typename T>
__device__ __forceinline__ acc_t<T> ld(const T* p, int64_t i) {
  return static_cast<acc_t<T>>(p[i]);
}
template <>
__device__ __forceinline__ float ld<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
template <>
__device__ __forceinline__ float ld<__half>(const __half* p, int64_t i) {
  return __half2float(p[i]);
}

template <typename T, typename A>
__device__ __forceinline__ void st(T* p, int64_t i, A v) {
  p[i] = static_cast<T>(v);
}
template <>
__device__ __forceinline__ void st<__nv_bfloat16, float>(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ void st<__half, float>(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}

// Calls f.template operator()<T>() with the CUDA type of a floating dtype.
template <typename F>
void dispatch_float(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: f.template operator()<float>(); return;
    case DType::f64: f.template operator()<double>(); return;
    case DType::bf16: f.template operator()<__nv_bfloat16>(); return;
    case DType::f16: f.template operator()<__half>(); return;
    default: throw std::runtime_error("cuda kernel: dtype is not floating");
  }
}

inline int blocks_for(int64_t n, int threads = 256) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

// Sum / max over a block of blockDim.x (a multiple of 32, <= 1024) threads; every thread gets the result.
template <typename A>
__device__ A block_sum(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  A t = 0;
  for (int w = 0; w < (blockDim.x >> 5); ++w) t += shared[w];
  return t;
}

template <typename A>
__device__ A block_max(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    A u = __shfl_xor_sync(0xffffffffu, v, o);
    v = (u != u || u > v) ? u : v;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  A t = shared[0];
  for (int w = 1; w < (blockDim.x >> 5); ++w) t = (shared[w] != shared[w] || shared[w] > t) ? shared[w] : t;
  return t;
}

__device__ __forceinline__ int64_t strided_offset(const Strided& g, int which, int64_t linear) {
  int64_t off = 0;
  for (int d = g.nd - 1; d >= 0; --d) {
    const int64_t s = g.shape[d];
    off += (linear % s) * g.stride[which][d];
    linear /= s;
  }
  return off;
}

}  // namespace tr::cuda
