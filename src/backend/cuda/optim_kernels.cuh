// The optimizer kernels (optim.cu launches them and describes them): gradient statistics, the gradient
// transform, multi-tensor fused AdamW, bitsandbytes' blockwise 8-bit AdamW and its 32-bit small-tensor path,
// SGD. In a header of their own so that the CPU runs this very code (tests/cuda_emulator.h;
// tests/test_optim_emulated.cpp against the CPU backend, bit for bit). The element math is
// backend/optim_math.h's and adamw8bit_math.h's; optim.cu and the test compile it without contracting
// multiply-adds (only the explicit fmas fuse, as on the CPU). Bound by memory bandwidth, except 8-bit AdamW's
// code search.
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/adamw8bit_math.h"
#include "backend/cuda/kernel_basics.cuh"
#include "backend/cuda/kernels.h"
#include "backend/optim_math.h"
#ifndef TR_OPT_EMULATED
#include "backend/cuda/common.cuh"  // ld, st (the emulation brings its own)
#endif

// A kernel's one shared array (the emulation points it at its shared buffer).
#ifndef TR_OPT_SMEM
#define TR_OPT_SMEM(type, name, count) __shared__ type name[count]
#endif

// The kernels' namespace (the emulation's own, so its host copies never meet the device build's symbols).
#ifndef TR_OPT_NAMESPACE
#define TR_OPT_NAMESPACE opt
#endif

namespace tr::cuda::TR_OPT_NAMESPACE {

// Gradient element i of storage dtype dt, widened as the CPU does (half -> f32 -> T).
template <typename T>
__device__ __forceinline__ T load_grad(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::bf16: return static_cast<T>(ld(static_cast<const __nv_bfloat16*>(p), i));
    case DType::f16: return static_cast<T>(ld(static_cast<const __half*>(p), i));
    case DType::f32: return static_cast<T>(static_cast<const float*>(p)[i]);
    default: return static_cast<T>(static_cast<const double*>(p)[i]);
  }
}

// v stored into element i of dtype dt, rounded to nearest even (halves through f32, as the CPU).
template <typename T>
__device__ __forceinline__ void store_as(void* p, DType dt, int64_t i, T v) {
  switch (dt) {
    case DType::bf16: st(static_cast<__nv_bfloat16*>(p), i, static_cast<float>(v)); return;
    case DType::f16: st(static_cast<__half*>(p), i, static_cast<float>(v)); return;
    case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    default: static_cast<double*>(p)[i] = static_cast<double>(v); return;
  }
}

__global__ void grad_stats_chunks(const GradChunk* chunks, double inv_scale, double* partial) {
  TR_OPT_SMEM(double, shared, 32);
  const GradChunk c = chunks[blockIdx.x];
  double ss = 0, bad = 0;
  if (c.grad_dtype == DType::f64) {
    for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
      const double x = load_grad<double>(c.grad, c.grad_dtype, i) * inv_scale;
      ss += x * x;
      bad += isfinite(x) ? 0.0 : 1.0;
    }
  } else {
    const float inv = static_cast<float>(inv_scale);
    for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
      const float x = load_grad<float>(c.grad, c.grad_dtype, i) * inv;
      ss += static_cast<double>(x) * x;
      bad += isfinite(x) ? 0.0 : 1.0;
    }
  }
  ss = block_sum(ss, shared);
  bad = block_sum(bad, shared);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = ss;
    partial[2 * blockIdx.x + 1] = bad;
  }
}

// One block adds the chunk partials in a fixed order: the same bits on every run.
__global__ void grad_stats_total(const double* partial, int64_t count, double* stats) {
  TR_OPT_SMEM(double, shared, 32);
  double ss = 0, bad = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    ss += partial[2 * i];
    bad += partial[2 * i + 1];
  }
  ss = block_sum(ss, shared);
  bad = block_sum(bad, shared);
  if (threadIdx.x == 0) {  // added to what stats holds (a split model's earlier devices)
    stats[0] += ss;
    stats[1] += bad;
  }
}

template <typename T>
__global__ void transform_kernel(const GradChunk* chunks, double inv_scale, double max_norm,
                                 const double* stats) {
  const GradChunk c = chunks[blockIdx.x];
  const backend::GradScaling<T> gs = backend::grad_scaling<T>(inv_scale, max_norm, stats);
  T* d = static_cast<T*>(c.dst);
  for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x)
    d[i] = backend::scaled_grad(load_grad<T>(c.grad, c.grad_dtype, i), gs);
}

// A half destination (half weights' gradients transformed in place): f32 math, one rounding, as torch's
// clip_grad_norm_ multiplies a bf16 gradient.
__global__ void transform_half_kernel(const GradChunk* chunks, double inv_scale, double max_norm,
                                      const double* stats) {
  const GradChunk c = chunks[blockIdx.x];
  const backend::GradScaling<float> gs = backend::grad_scaling<float>(inv_scale, max_norm, stats);
  for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x)
    store_as(c.dst, c.dst_dtype, i, backend::scaled_grad(load_grad<float>(c.grad, c.grad_dtype, i), gs));
}

template <typename T>
__global__ void fused_adamw_kernel(const AdamWChunk* chunks, backend::AdamWScalars<T> with_decay,
                                   backend::AdamWScalars<T> without_decay, double inv_scale, double max_norm,
                                   const double* stats) {
  const AdamWChunk c = chunks[blockIdx.x];
  const backend::AdamWScalars<T>& s = c.decay ? with_decay : without_decay;
  const backend::GradScaling<T> gs = backend::grad_scaling<T>(inv_scale, max_norm, stats);
  T* p = static_cast<T*>(c.param);
  T* m = static_cast<T*>(c.exp_avg);
  T* v = static_cast<T*>(c.exp_avg_sq);
  for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
    T pi = p[i], mi = m[i], vi = v[i];
    backend::adamw_element(pi, backend::scaled_grad(load_grad<T>(c.grad, c.grad_dtype, i), gs), mi, vi, s);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (c.copy != nullptr) store_as(c.copy, c.copy_dtype, i, pi);
  }
}

// x rounded to dtype dt and read back (f32 and f64 unchanged).
__device__ __forceinline__ float round_like(DType dt, float x) {
  if (dt == DType::bf16) {
    __nv_bfloat16 h;
    st(&h, 0, x);
    return ld(&h, 0);
  }
  if (dt == DType::f16) {
    __half h;
    st(&h, 0, x);
    return ld(&h, 0);
  }
  return x;
}

// Half-precision parameter and moments (--torch_dtype bfloat16; dt their dtype): torch's fused AdamW on half
// tensors - widened to f32, the f32 element math, each stored value rounded once (the CPU's rule). Bound by
// memory traffic: 8 bytes per element each way for bf16.
__global__ void fused_adamw_half_kernel(const AdamWChunk* chunks, DType dt,
                                        backend::AdamWScalars<float> with_decay,
                                        backend::AdamWScalars<float> without_decay, double inv_scale,
                                        double max_norm, const double* stats) {
  const AdamWChunk c = chunks[blockIdx.x];
  const backend::AdamWScalars<float>& s = c.decay ? with_decay : without_decay;
  const backend::GradScaling<float> gs = backend::grad_scaling<float>(inv_scale, max_norm, stats);
  for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
    float pi = load_grad<float>(c.param, dt, i), mi = load_grad<float>(c.exp_avg, dt, i),
          vi = load_grad<float>(c.exp_avg_sq, dt, i);
    // The clipped gradient rounded to its dtype, as torch's clip_grad_norm_ writes a half gradient.
    const float gi = backend::scaled_grad(load_grad<float>(c.grad, c.grad_dtype, i), gs);
    backend::adamw_element(pi, round_like(c.grad_dtype, gi), mi, vi, s);
    store_as(c.param, dt, i, pi);
    store_as(c.exp_avg, dt, i, mi);
    store_as(c.exp_avg_sq, dt, i, vi);
  }
}

// AnyPrecisionAdamW: every op of torchdistx's step in f32, rounded to the dtype of the tensor it writes.
// Bound by memory traffic (the dtype switches are uniform across a block).
__global__ void anyprecision_kernel(const AnyPrecisionChunk* chunks, backend::AnyPrecisionScalars with_decay,
                                    backend::AnyPrecisionScalars without_decay) {
  const AnyPrecisionChunk c = chunks[blockIdx.x];
  const backend::AnyPrecisionScalars& s = c.decay ? with_decay : without_decay;
  const DType dt[4] = {c.param_dtype, c.m_dtype, c.v_dtype, c.c_dtype};
  const auto round = [&](float x, int k) { return round_like(dt[k], x); };
  for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
    float p = load_grad<float>(c.param, dt[0], i), m = load_grad<float>(c.exp_avg, dt[1], i),
          v = load_grad<float>(c.exp_avg_sq, dt[2], i);
    float k = c.comp != nullptr ? load_grad<float>(c.comp, dt[3], i) : 0.0f;
    backend::anyprecision_element(p, load_grad<float>(c.grad, c.grad_dtype, i), m, v,
                                  c.comp != nullptr ? &k : nullptr, s, round);
    store_as(c.param, dt[0], i, p);
    store_as(c.exp_avg, dt[1], i, m);
    store_as(c.exp_avg_sq, dt[2], i, v);
    if (c.comp != nullptr) store_as(c.comp, dt[3], i, k);
  }
}

// bitsandbytes' blockwise 8-bit AdamW and AdEMAMix (k.ademamix: a third state c3 with its absmax3; null
// otherwise): one block of 256 threads per 256-element quantization block. Bound by the code searches.
__global__ void adamw_8bit_kernel(float* p, const float* g, uint8_t* c1, uint8_t* c2, uint8_t* c3,
                                  float* absmax1, float* absmax2, float* absmax3, int64_t n,
                                  backend::Adam8bitConsts k, const float* qs_g, const float* qu_g) {
  TR_OPT_SMEM(float, smem, 536);  // the two code tables and the warps' maxima
  float *qs = smem, *qu = smem + 256, *red1 = smem + 512, *red2 = smem + 520, *red3 = smem + 528;
  qs[threadIdx.x] = qs_g[threadIdx.x];
  qu[threadIdx.x] = qu_g[threadIdx.x];
  __syncthreads();
  const int64_t i = blockIdx.x * backend::kAdam8bitBlock + threadIdx.x;
  const bool active = i < n;
  const float gi = active ? g[i] : 0.0f;
  float s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  if (active) {
    backend::adam8bit_moments(gi, c1[i], c2[i], absmax1[blockIdx.x], absmax2[blockIdx.x], qs, qu, k, s1, s2);
    if (k.ademamix) s3 = backend::ademamix8bit_m2(gi, c3[i], absmax3[blockIdx.x], qs, k);
  }
  // The block's absmax: a max is exact in any order, so the CPU's sequential fmax gives the same value.
  float m1 = backend::abs_f32(s1), m2 = backend::abs_f32(s2), m3 = backend::abs_f32(s3);
  for (int o = 16; o > 0; o >>= 1) {
    m1 = backend::fmax_f32(m1, __shfl_xor_sync(0xffffffffu, m1, o));
    m2 = backend::fmax_f32(m2, __shfl_xor_sync(0xffffffffu, m2, o));
    m3 = backend::fmax_f32(m3, __shfl_xor_sync(0xffffffffu, m3, o));
  }
  if ((threadIdx.x & 31) == 0) {
    red1[threadIdx.x >> 5] = m1;
    red2[threadIdx.x >> 5] = m2;
    red3[threadIdx.x >> 5] = m3;
  }
  __syncthreads();  // every thread has read the old absmax above
  float max1 = 0.0f, max2 = 0.0f, max3 = 0.0f;
  for (int w = 0; w < 8; ++w) {
    max1 = backend::fmax_f32(max1, red1[w]);
    max2 = backend::fmax_f32(max2, red2[w]);
    max3 = backend::fmax_f32(max3, red3[w]);
  }
  if (threadIdx.x == 0) {
    absmax1[blockIdx.x] = max1;
    absmax2[blockIdx.x] = max2;
    if (k.ademamix) absmax3[blockIdx.x] = max3;
  }
  if (!active) return;
  float pi = p[i];
  backend::adam8bit_param(pi, gi, s1, s2, s3, k);
  p[i] = pi;
  uint8_t q1, q2;
  backend::adam8bit_codes(s1, s2, max1, max2, qs, qu, q1, q2);
  c1[i] = q1;
  c2[i] = q2;
  if (k.ademamix) c3[i] = backend::signed_code(s3, max3, qs);
}

// s3: AdEMAMix's slow EMA (k.ademamix), else null. Bound by memory bandwidth.
__global__ void adamw_32bit_kernel(float* p, const float* g, float* s1, float* s2, float* s3, int64_t n,
                                   backend::Adam8bitConsts k) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    float pi = p[i], a = s1[i], b = s2[i];
    if (k.ademamix) {
      float c = s3[i];
      backend::ademamix32_element(pi, g[i], a, b, c, k);
      s3[i] = c;
    } else {
      backend::adam32_element(pi, g[i], a, b, k);
    }
    p[i] = pi;
    s1[i] = a;
    s2[i] = b;
  }
}

// Bound by memory bandwidth: param, grad and the buffer read, param and the buffer written, once each.
template <typename T>
__global__ void sgd_kernel(T* p, const T* g, T* buf, int64_t n, backend::SgdScalars<T> c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    T pi = p[i];
    if (buf != nullptr) {
      T bi = buf[i];
      backend::sgd_element(pi, g[i], &bi, c);
      buf[i] = bi;
    } else {
      backend::sgd_element(pi, g[i], static_cast<T*>(nullptr), c);
    }
    p[i] = pi;
  }
}

// bitsandbytes' one-state 8-bit kernel (Lion, RMSprop): one block of 256 threads per 256 elements, the new
// absmax a block-wide max (exact in any order: the CPU's sequential fmax gives the same value). Bound by the
// code search, as 8-bit AdamW's.
template <backend::ElementwiseRule R>
__global__ void state8bit_kernel(float* p, const float* g, uint8_t* c1, float* absmax1, int64_t n,
                                 backend::ElementwiseScalars<float> c, const float* qs_g) {
  TR_OPT_SMEM(float, smem, 264);  // the code table and the warps' maxima
  float *qs = smem, *red = smem + 256;
  qs[threadIdx.x] = qs_g[threadIdx.x];
  __syncthreads();
  const int64_t i = blockIdx.x * backend::kAdam8bitBlock + threadIdx.x;
  const bool active = i < n;
  const float gi = active ? g[i] : 0.0f;
  float pi = active ? p[i] : 0.0f, s1 = 0.0f, upd = 0.0f;
  if (active) {
    s1 = qs[c1[i]] * absmax1[blockIdx.x];
    backend::state8bit_update<R>(pi, gi, s1, upd, c);
  }
  float m = backend::abs_f32(s1);
  for (int o = 16; o > 0; o >>= 1) m = backend::fmax_f32(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();  // every thread has read the old absmax above
  float max1 = 0.0f;
  for (int w = 0; w < 8; ++w) max1 = backend::fmax_f32(max1, red[w]);
  if (threadIdx.x == 0) absmax1[blockIdx.x] = max1;
  if (!active) return;
  backend::state8bit_param<R>(pi, gi, s1, upd, c);
  p[i] = pi;
  c1[i] = backend::signed_code(s1, max1, qs);
}

// Bound by memory bandwidth: param, grad and one or two state tensors read, all but grad written, once each.
template <backend::ElementwiseRule R, typename T>
__global__ void elementwise_kernel(T* p, const T* g, T* s1, T* s2, int64_t n,
                                   backend::ElementwiseScalars<T> c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    T pi = p[i], a = s1[i];
    if (s2 != nullptr) {
      T b = s2[i];
      backend::elementwise_update<R>(pi, g[i], a, &b, c);
      s2[i] = b;
    } else {
      backend::elementwise_update<R>(pi, g[i], a, static_cast<T*>(nullptr), c);
    }
    p[i] = pi;
    s1[i] = a;
  }
}

}  // namespace tr::cuda::TR_OPT_NAMESPACE
