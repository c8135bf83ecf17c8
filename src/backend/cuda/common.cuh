// Device-side helpers shared by the .cu files: dtype -> CUDA type mapping, f32/f64 accumulation,
// launch checking, strided offset computation (block reductions and packs: kernel_basics.cuh).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "backend/attention_geometry.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_basics.cuh"
#include "backend/cuda/kernels.h"

namespace tr::cuda {

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

// Flags a bad index for the backend's next synchronization (kernels.h BadIndexKind); any one of several
// concurrent reports may win.
__device__ __forceinline__ void report_bad(int64_t* bad, int64_t kind, int64_t value, int64_t limit) {
  bad[0] = value;
  bad[2] = limit;
  bad[1] = kind;
}

template <typename T>
__device__ __forceinline__ acc_t<T> to_acc(T x) {
  return ld(&x, 0);
}
template <typename T>
__device__ __forceinline__ T from_acc(acc_t<T> v) {
  T r;
  st(&r, 0, v);
  return r;
}

inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Whether every row of every attention operand of 2-byte elements (pointer and HeadRows) starts on a
// `bytes` boundary: 4 lets the flash kernels move pairs of halves, 16 whole uint4 chunks.
inline bool half_rows_aligned(std::initializer_list<std::pair<const void*, backend::HeadRows>> ops,
                              size_t bytes) {
  const auto e = static_cast<int64_t>(bytes / 2);
  for (const auto& [p, r] : ops)
    if (!aligned_to(p, bytes) || r.batch % e != 0 || r.head % e != 0 || r.row % e != 0) return false;
  return true;
}

// True when the operand `which` of g is laid out contiguously over g's shape (size-1 dims ignored).
inline bool is_contiguous_operand(const Strided& g, int which) {
  int64_t expect = 1;
  for (int d = g.nd - 1; d >= 0; --d) {
    if (g.shape[d] != 1 && g.stride[which][d] != expect) return false;
    expect *= g.shape[d];
  }
  return true;
}

// y[i] = f(i, x[i]) over contiguous arrays: V-element packs (16 bytes of the wider type), then a scalar tail.
template <int V, typename TI, typename TO, typename F>
__global__ void map1_kernel(F f, const TI* x, TO* y, int64_t n) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t packs = n / V;
  for (int64_t j = first; j < packs; j += step) {
    const Pack<TI, V> in = reinterpret_cast<const Pack<TI, V>*>(x)[j];
    Pack<TO, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = f(j * V + k, in.v[k]);
    reinterpret_cast<Pack<TO, V>*>(y)[j] = out;
  }
  for (int64_t i = packs * V + first; i < n; i += step) y[i] = f(i, x[i]);
}

// y[i] = f(i, a[i], b[i]) over contiguous arrays of one type.
template <int V, typename T, typename F>
__global__ void map2_kernel(F f, const T* a, const T* b, T* y, int64_t n) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t packs = n / V;
  for (int64_t j = first; j < packs; j += step) {
    const Pack<T, V> pa = reinterpret_cast<const Pack<T, V>*>(a)[j];
    const Pack<T, V> pb = reinterpret_cast<const Pack<T, V>*>(b)[j];
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = f(j * V + k, pa.v[k], pb.v[k]);
    reinterpret_cast<Pack<T, V>*>(y)[j] = out;
  }
  for (int64_t i = packs * V + first; i < n; i += step) y[i] = f(i, a[i], b[i]);
}

// Launchers: 16-byte packs when every pointer is aligned for them, one element at a time otherwise.
template <typename TI, typename TO, typename F>
void launch_map1(Stream stream, F f, const TI* x, TO* y, int64_t n) {
  constexpr size_t wide = sizeof(TI) > sizeof(TO) ? sizeof(TI) : sizeof(TO);
  constexpr int V = static_cast<int>(16 / wide);
  if (aligned_to(x, V * sizeof(TI)) && aligned_to(y, V * sizeof(TO)))
    map1_kernel<V><<<blocks_for((n + V - 1) / V), 256, 0, stream>>>(f, x, y, n);
  else
    map1_kernel<1><<<blocks_for(n), 256, 0, stream>>>(f, x, y, n);
}

template <typename T, typename F>
void launch_map2(Stream stream, F f, const T* a, const T* b, T* y, int64_t n) {
  constexpr int V = static_cast<int>(16 / sizeof(T));
  if (aligned_to(a, 16) && aligned_to(b, 16) && aligned_to(y, 16))
    map2_kernel<V><<<blocks_for((n + V - 1) / V), 256, 0, stream>>>(f, a, b, y, n);
  else
    map2_kernel<1><<<blocks_for(n), 256, 0, stream>>>(f, a, b, y, n);
}

// Dimensions that are one run in each of the first `operands` operands merge, and size-1 dimensions drop:
// the row-major order of the elements is unchanged (so a contiguous output indexed by the linear position
// stays right), and each element pays fewer div/mod pairs - the strided kernels' bound, not memory.
inline Strided collapsed(const Strided& g, int operands) {
  Strided c;
  for (int d = 0; d < g.nd; ++d) {
    if (g.shape[d] == 1) continue;
    if (c.nd > 0) {
      const int p = c.nd - 1;
      bool merge = true;
      for (int w = 0; w < operands; ++w) merge = merge && c.stride[w][p] == g.stride[w][d] * g.shape[d];
      if (merge) {
        c.shape[p] *= g.shape[d];
        for (int w = 0; w < operands; ++w) c.stride[w][p] = g.stride[w][d];
        continue;
      }
    }
    c.shape[c.nd] = g.shape[d];
    for (int w = 0; w < operands; ++w) c.stride[w][c.nd] = g.stride[w][d];
    ++c.nd;
  }
  if (c.nd == 0) c.nd = 1, c.shape[0] = 1;  // one element
  return c;
}

// Whether every linear position below n and every operand's offset fit in 31 bits: then the index math runs
// in 32 bits (a 64-bit div/mod is a long software sequence on the GPU, a 32-bit one a few instructions).
inline bool fits_u32(const Strided& g, int operands, int64_t n) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  if (n >= kLimit) return false;
  for (int w = 0; w < operands; ++w) {
    int64_t far = 0;
    for (int d = 0; d < g.nd; ++d) {
      if (g.stride[w][d] < 0) return false;
      far += (g.shape[d] - 1) * g.stride[w][d];
    }
    if (far >= kLimit) return false;
  }
  return true;
}

template <typename I>
__device__ __forceinline__ I strided_offset(const Strided& g, int which, I linear) {
  I off = 0;
  for (int d = g.nd - 1; d >= 0; --d) {
    const I s = static_cast<I>(g.shape[d]);
    off += (linear % s) * static_cast<I>(g.stride[which][d]);
    linear /= s;
  }
  return off;
}

// A grid-stride loop in index type I (uint32_t where fits_u32 said so: i + the grid stays below 2^32).
#define GRID_STRIDE_I(I, i, n)                                               \
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<I>(blockDim.x) * gridDim.x)

}  // namespace tr::cuda
