// CUDA elementwise kernels: copy/convert, fill, arange, random fills, unary/binary ops, affine, pow,
// masked_fill and dropout. Grid-stride loops; formulas shared with the CPU through unary_math.h and rng.h.
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/unary_math.h"
#include "core/rng.h"

namespace tr::cuda {

namespace {

#define GRID_STRIDE(i, n)                                                                \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

template <typename S, typename D>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<D, bool>) {
    return static_cast<double>(v) != 0.0;
  } else if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    if constexpr (std::is_same_v<S, double>)
      return __double2bfloat16(v);
    else
      return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, __half>) {
    if constexpr (std::is_same_v<S, double>)
      return __double2half(v);
    else
      return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    return static_cast<D>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<S, __half>) {
    return static_cast<D>(__half2float(v));
  } else {
    return static_cast<D>(v);
  }
}

template <typename F>
void dispatch_all(DType dt, F&& f) {
  switch (dt) {
    case DType::i32: f.template operator()<int32_t>(); return;
    case DType::i64: f.template operator()<int64_t>(); return;
    case DType::u8: f.template operator()<uint8_t>(); return;
    case DType::boolean: f.template operator()<bool>(); return;
    default: dispatch_float(dt, std::forward<F>(f));
  }
}

template <typename S, typename D>
__global__ void copy_kernel(const S* src, D* dst, Strided g, int64_t n) {
  GRID_STRIDE(i, n) { dst[strided_offset(g, 1, i)] = convert<S, D>(src[strided_offset(g, 0, i)]); }
}

template <typename T>
__global__ void fill_kernel(T* out, int64_t n, double v) {
  const T tv = convert<double, T>(v);
  GRID_STRIDE(i, n) { out[i] = tv; }
}

template <typename T>
__global__ void arange_kernel(T* out, int64_t n, double start, double step) {
  GRID_STRIDE(i, n) { out[i] = convert<double, T>(start + static_cast<double>(i) * step); }
}

template <typename T>
__global__ void normal_kernel(T* out, int64_t n, double mean, double std, uint64_t seed, uint64_t offset) {
  GRID_STRIDE(i, n) {
    float u1 = uniform_from_word(philox_word(seed, offset, 2 * static_cast<uint64_t>(i)));
    float u2 = uniform_from_word(philox_word(seed, offset, 2 * static_cast<uint64_t>(i) + 1));
    double r = sqrt(-2.0 * log(1.0 - static_cast<double>(u1)));
    double z = r * cos(6.283185307179586 * static_cast<double>(u2));
    st(out, i, static_cast<acc_t<T>>(mean + std * z));
  }
}

template <typename T>
__global__ void uniform_kernel(T* out, int64_t n, double lo, double hi, uint64_t seed, uint64_t offset) {
  GRID_STRIDE(i, n) {
    double u = uniform_from_word(philox_word(seed, offset, static_cast<uint64_t>(i)));
    st(out, i, static_cast<acc_t<T>>(lo + (hi - lo) * u));
  }
}

template <typename T>
__global__ void unary_kernel(UnaryOp op, const T* x, T* y, Strided g, int64_t n, bool contiguous) {
  GRID_STRIDE(i, n) {
    const int64_t xi = contiguous ? i : strided_offset(g, 0, i);
    st(y, i, backend::unary_fn(op, ld(x, xi)));
  }
}

template <typename T>
__global__ void unary_backward_kernel(UnaryOp op, const T* x, const T* gy, T* gx, int64_t n) {
  GRID_STRIDE(i, n) { st(gx, i, ld(gy, i) * backend::unary_grad(op, ld(x, i))); }
}

template <typename T>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, T* out, Strided g, int64_t n) {
  GRID_STRIDE(i, n) {
    st(out, i, backend::binary_fn(op, ld(a, strided_offset(g, 0, i)), ld(b, strided_offset(g, 1, i))));
  }
}

template <typename T>
__global__ void affine_kernel(const T* x, T* y, int64_t n, double alpha, double beta) {
  using A = acc_t<T>;
  GRID_STRIDE(i, n) { st(y, i, static_cast<A>(alpha) * ld(x, i) + static_cast<A>(beta)); }
}

template <typename T>
__global__ void pow_kernel(const T* x, T* y, int64_t n, double e) {
  using A = acc_t<T>;
  GRID_STRIDE(i, n) { st(y, i, static_cast<A>(pow(ld(x, i), static_cast<A>(e)))); }
}

template <typename T>
__global__ void masked_fill_kernel(const T* x, const bool* mask, T* y, Strided g, int64_t n, double v) {
  GRID_STRIDE(i, n) { y[i] = mask[strided_offset(g, 1, i)] ? convert<double, T>(v) : x[i]; }
}

template <typename T>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, float p, acc_t<T> scale, uint64_t seed,
                               uint64_t offset) {
  GRID_STRIDE(i, n) {
    bool keep = uniform_from_word(philox_word(seed, offset, static_cast<uint64_t>(i))) >= p;
    st(y, i, keep ? ld(x, i) * scale : acc_t<T>(0));
  }
}

}  // namespace

void copy(const void* src, DType st_, void* dst, DType dt, const Strided& g, int64_t n) {
  dispatch_all(st_, [&]<typename S>() {
    dispatch_all(dt, [&]<typename D>() {
      copy_kernel<S, D><<<blocks_for(n), 256>>>(static_cast<const S*>(src), static_cast<D*>(dst), g, n);
    });
  });
  TR_CUDA_LAUNCH_CHECK("copy");
}

void fill(void* out, DType dt, int64_t n, double value) {
  dispatch_all(dt,
               [&]<typename T>() { fill_kernel<T><<<blocks_for(n), 256>>>(static_cast<T*>(out), n, value); });
  TR_CUDA_LAUNCH_CHECK("fill");
}

void arange(void* out, DType dt, int64_t n, double start, double step) {
  dispatch_all(dt, [&]<typename T>() {
    arange_kernel<T><<<blocks_for(n), 256>>>(static_cast<T*>(out), n, start, step);
  });
  TR_CUDA_LAUNCH_CHECK("arange");
}

void random_normal(void* out, DType dt, int64_t n, double mean, double std, uint64_t seed, uint64_t offset) {
  dispatch_float(dt, [&]<typename T>() {
    normal_kernel<T><<<blocks_for(n), 256>>>(static_cast<T*>(out), n, mean, std, seed, offset);
  });
  TR_CUDA_LAUNCH_CHECK("random_normal");
}

void random_uniform(void* out, DType dt, int64_t n, double lo, double hi, uint64_t seed, uint64_t offset) {
  dispatch_float(dt, [&]<typename T>() {
    uniform_kernel<T><<<blocks_for(n), 256>>>(static_cast<T*>(out), n, lo, hi, seed, offset);
  });
  TR_CUDA_LAUNCH_CHECK("random_uniform");
}

void unary(UnaryOp op, DType dt, const void* x, void* y, const Strided& g, int64_t n) {
  bool contiguous = true;
  int64_t expect = 1;
  for (int d = g.nd - 1; d >= 0; --d) {
    if (g.shape[d] != 1 && g.stride[0][d] != expect) contiguous = false;
    expect *= g.shape[d];
  }
  dispatch_float(dt, [&]<typename T>() {
    unary_kernel<T>
        <<<blocks_for(n), 256>>>(op, static_cast<const T*>(x), static_cast<T*>(y), g, n, contiguous);
  });
  TR_CUDA_LAUNCH_CHECK("unary");
}

void unary_backward(UnaryOp op, DType dt, const void* x, const void* gy, void* gx, int64_t n) {
  dispatch_float(dt, [&]<typename T>() {
    unary_backward_kernel<T><<<blocks_for(n), 256>>>(op, static_cast<const T*>(x), static_cast<const T*>(gy),
                                                     static_cast<T*>(gx), n);
  });
  TR_CUDA_LAUNCH_CHECK("unary_backward");
}

void binary(BinaryOp op, DType dt, const void* a, const void* b, void* out, const Strided& g, int64_t n) {
  dispatch_float(dt, [&]<typename T>() {
    binary_kernel<T><<<blocks_for(n), 256>>>(op, static_cast<const T*>(a), static_cast<const T*>(b),
                                             static_cast<T*>(out), g, n);
  });
  TR_CUDA_LAUNCH_CHECK("binary");
}

void affine(DType dt, const void* x, void* y, int64_t n, double alpha, double beta) {
  dispatch_float(dt, [&]<typename T>() {
    affine_kernel<T><<<blocks_for(n), 256>>>(static_cast<const T*>(x), static_cast<T*>(y), n, alpha, beta);
  });
  TR_CUDA_LAUNCH_CHECK("affine");
}

void pow_scalar(DType dt, const void* x, void* y, int64_t n, double exponent) {
  dispatch_float(dt, [&]<typename T>() {
    pow_kernel<T><<<blocks_for(n), 256>>>(static_cast<const T*>(x), static_cast<T*>(y), n, exponent);
  });
  TR_CUDA_LAUNCH_CHECK("pow");
}

void masked_fill(DType dt, const void* x, const bool* mask, void* y, const Strided& g, int64_t n,
                 double value) {
  dispatch_float(dt, [&]<typename T>() {
    masked_fill_kernel<T>
        <<<blocks_for(n), 256>>>(static_cast<const T*>(x), mask, static_cast<T*>(y), g, n, value);
  });
  TR_CUDA_LAUNCH_CHECK("masked_fill");
}

void dropout(DType dt, const void* x, void* y, int64_t n, double p, uint64_t seed, uint64_t offset) {
  dispatch_float(dt, [&]<typename T>() {
    dropout_kernel<T><<<blocks_for(n), 256>>>(static_cast<const T*>(x), static_cast<T*>(y), n,
                                              static_cast<float>(p), static_cast<acc_t<T>>(1.0 / (1.0 - p)),
                                              seed, offset);
  });
  TR_CUDA_LAUNCH_CHECK("dropout");
}

}  // namespace tr::cuda
