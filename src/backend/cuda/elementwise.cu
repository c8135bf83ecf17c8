// CUDA elementwise kernels: copy/convert, fill, arange, random fills, unary/binary ops, affine, pow,
// masked_fill and dropout. Grid-stride loops, with 16-byte packed access on contiguous operands; formulas
// shared with the CPU through unary_math.h and rng.h.
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/dropout_packs.cuh"
#include "backend/cuda/fused_chain.cuh"
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

// Strided copies are bound by their index math (a div/mod pair per dimension per operand), so the launchers
// collapse dimensions first, use 32-bit indices where they fit, and move 16/8/4-byte packs when the innermost
// dimension is unit-stride in both operands (copy_packs_kernel: one index computation per pack).
template <typename S, typename D, typename I>
__global__ void copy_kernel(const S* src, D* dst, Strided g, I n) {
  GRID_STRIDE_I(I, i, n) { dst[strided_offset(g, 1, i)] = convert<S, D>(src[strided_offset(g, 0, i)]); }
}

template <typename P, typename I>
__global__ void copy_packs_kernel(const P* src, P* dst, Strided g, I n) {
  GRID_STRIDE_I(I, i, n) { dst[strided_offset(g, 1, i)] = src[strided_offset(g, 0, i)]; }
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
__global__ void normal_kernel(T* out, int64_t n, double mean, double std, uint64_t seed, uint64_t offset,
                              const uint64_t* shift) {
  if (shift) offset += *shift;
  GRID_STRIDE(i, n) {
    float u1 = uniform_from_word(philox_word(seed, offset, 2 * static_cast<uint64_t>(i)));
    float u2 = uniform_from_word(philox_word(seed, offset, 2 * static_cast<uint64_t>(i) + 1));
    double r = sqrt(-2.0 * log(1.0 - static_cast<double>(u1)));
    double z = r * cos(6.283185307179586 * static_cast<double>(u2));
    st(out, i, static_cast<acc_t<T>>(mean + std * z));
  }
}

template <typename T>
__global__ void uniform_kernel(T* out, int64_t n, double lo, double hi, uint64_t seed, uint64_t offset,
                               const uint64_t* shift) {
  if (shift) offset += *shift;
  GRID_STRIDE(i, n) {
    double u = uniform_from_word(philox_word(seed, offset, static_cast<uint64_t>(i)));
    st(out, i, static_cast<acc_t<T>>(lo + (hi - lo) * u));
  }
}

template <typename T, typename I>
__global__ void unary_kernel(UnaryOp op, const T* x, T* y, Strided g, I n) {
  GRID_STRIDE_I(I, i, n) { st(y, i, backend::unary_fn(op, ld(x, strided_offset(g, 0, i)))); }
}

template <typename T, typename I>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, T* out, Strided g, I n) {
  GRID_STRIDE_I(I, i, n) {
    st(out, i, backend::binary_fn(op, ld(a, strided_offset(g, 0, i)), ld(b, strided_offset(g, 1, i))));
  }
}

template <typename T>
__global__ void pow_kernel(const T* x, T* y, int64_t n, double e) {
  using A = acc_t<T>;
  GRID_STRIDE(i, n) { st(y, i, static_cast<A>(pow(ld(x, i), static_cast<A>(e)))); }
}

template <typename T, typename I>
__global__ void masked_fill_kernel(const T* x, const bool* mask, T* y, Strided g, I n, double v) {
  GRID_STRIDE_I(I, i, n) { y[i] = mask[strided_offset(g, 0, i)] ? convert<double, T>(v) : x[i]; }
}

// Element functions of the contiguous fast paths (map1/map2 of common.cuh): the same math per element as the
// strided kernels above, so either path gives the same bits.
template <typename S, typename D>
struct CastF {
  __device__ D operator()(int64_t, S v) const { return convert<S, D>(v); }
};

template <typename T>
struct UnaryF {
  UnaryOp op;
  __device__ T operator()(int64_t, T x) const { return from_acc<T>(backend::unary_fn(op, to_acc(x))); }
};

template <typename T>
struct UnaryBackwardF {  // (x, gy) -> gy * f'(x)
  UnaryOp op;
  __device__ T operator()(int64_t, T x, T gy) const {
    return from_acc<T>(to_acc(gy) * backend::unary_grad(op, to_acc(x)));
  }
};

template <typename T>
struct BinaryF {
  BinaryOp op;
  __device__ T operator()(int64_t, T a, T b) const {
    return from_acc<T>(backend::binary_fn(op, to_acc(a), to_acc(b)));
  }
};

template <typename T>
struct AffineF {
  acc_t<T> alpha, beta;
  __device__ T operator()(int64_t, T x) const { return from_acc<T>(alpha * to_acc(x) + beta); }
};

}  // namespace

// Launches kernel<I>(..., g, n) with I = uint32_t where every offset fits, else int64_t.
template <typename Launch>
void with_index(const Strided& g, int operands, int64_t n, Launch launch) {
  if (fits_u32(g, operands, n))
    launch(uint32_t{}, static_cast<uint32_t>(n));
  else
    launch(int64_t{}, n);
}

// A same-dtype strided copy as W-byte packs, W the widest of 16/8/4 that the innermost extent, every outer
// stride and both base addresses allow. False when none does (or the innermost dimension is strided).
bool copy_packs(Stream stream, const void* src, void* dst, size_t elem, const Strided& c, int64_t n) {
  const int last = c.nd - 1;
  if (c.stride[0][last] != 1 || c.stride[1][last] != 1) return false;
  for (size_t w : {size_t{16}, size_t{8}, size_t{4}}) {
    if (w <= elem) break;
    const int64_t v = static_cast<int64_t>(w / elem);
    bool ok = c.shape[last] % v == 0 && aligned_to(src, w) && aligned_to(dst, w);
    for (int d = 0; d < last && ok; ++d) ok = c.stride[0][d] % v == 0 && c.stride[1][d] % v == 0;
    if (!ok) continue;
    Strided p = c;
    p.shape[last] /= v;
    for (int d = 0; d < last; ++d) p.stride[0][d] /= v, p.stride[1][d] /= v;
    const auto go = [&]<typename P>() {
      with_index(p, 2, n / v, [&]<typename I>(I, I np) {
        copy_packs_kernel<P, I>
            <<<blocks_for(np), 256, 0, stream>>>(static_cast<const P*>(src), static_cast<P*>(dst), p, np);
      });
    };
    if (w == 16)
      go.template operator()<uint4>();
    else if (w == 8)
      go.template operator()<uint2>();
    else
      go.template operator()<uint32_t>();
    return true;
  }
  return false;
}

void copy(Stream stream, const void* src, DType st_, void* dst, DType dt, const Strided& g, int64_t n) {
  if (n == 0) return;
  const bool contiguous = is_contiguous_operand(g, 0) && is_contiguous_operand(g, 1);
  if (contiguous && st_ == dt) {  // a plain device-to-device copy, in stream order
    TR_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(dt), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const Strided c = collapsed(g, 2);
  if (!contiguous && st_ == dt && copy_packs(stream, src, dst, dtype_size(dt), c, n)) {
    TR_CUDA_LAUNCH_CHECK("copy");
    return;
  }
  dispatch_all(st_, [&]<typename S>() {
    dispatch_all(dt, [&]<typename D>() {
      if (contiguous)
        launch_map1(stream, CastF<S, D>{}, static_cast<const S*>(src), static_cast<D*>(dst), n);
      else
        with_index(c, 2, n, [&]<typename I>(I, I ni) {
          copy_kernel<S, D, I>
              <<<blocks_for(ni), 256, 0, stream>>>(static_cast<const S*>(src), static_cast<D*>(dst), c, ni);
        });
    });
  });
  TR_CUDA_LAUNCH_CHECK("copy");
}

void fill(Stream stream, void* out, DType dt, int64_t n, double value) {
  dispatch_all(dt, [&]<typename T>() {
    fill_kernel<T><<<blocks_for(n), 256, 0, stream>>>(static_cast<T*>(out), n, value);
  });
  TR_CUDA_LAUNCH_CHECK("fill");
}

void arange(Stream stream, void* out, DType dt, int64_t n, double start, double step) {
  dispatch_all(dt, [&]<typename T>() {
    arange_kernel<T><<<blocks_for(n), 256, 0, stream>>>(static_cast<T*>(out), n, start, step);
  });
  TR_CUDA_LAUNCH_CHECK("arange");
}

void random_normal(Stream stream, void* out, DType dt, int64_t n, double mean, double std, uint64_t seed,
                   uint64_t offset, const uint64_t* shift) {
  dispatch_float(dt, [&]<typename T>() {
    normal_kernel<T>
        <<<blocks_for(n), 256, 0, stream>>>(static_cast<T*>(out), n, mean, std, seed, offset, shift);
  });
  TR_CUDA_LAUNCH_CHECK("random_normal");
}

void random_uniform(Stream stream, void* out, DType dt, int64_t n, double lo, double hi, uint64_t seed,
                    uint64_t offset, const uint64_t* shift) {
  dispatch_float(dt, [&]<typename T>() {
    uniform_kernel<T>
        <<<blocks_for(n), 256, 0, stream>>>(static_cast<T*>(out), n, lo, hi, seed, offset, shift);
  });
  TR_CUDA_LAUNCH_CHECK("random_uniform");
}

void unary(Stream stream, UnaryOp op, DType dt, const void* x, void* y, const Strided& g, int64_t n) {
  if (n == 0) return;
  const bool contiguous = is_contiguous_operand(g, 0);
  const Strided c = contiguous ? g : collapsed(g, 1);
  dispatch_float(dt, [&]<typename T>() {
    if (contiguous)
      launch_map1(stream, UnaryF<T>{op}, static_cast<const T*>(x), static_cast<T*>(y), n);
    else
      with_index(c, 1, n, [&]<typename I>(I, I ni) {
        unary_kernel<T, I>
            <<<blocks_for(ni), 256, 0, stream>>>(op, static_cast<const T*>(x), static_cast<T*>(y), c, ni);
      });
  });
  TR_CUDA_LAUNCH_CHECK("unary");
}

void unary_backward(Stream stream, UnaryOp op, DType dt, const void* x, const void* gy, void* gx, int64_t n) {
  if (n == 0) return;
  dispatch_float(dt, [&]<typename T>() {
    launch_map2(stream, UnaryBackwardF<T>{op}, static_cast<const T*>(x), static_cast<const T*>(gy),
                static_cast<T*>(gx), n);
  });
  TR_CUDA_LAUNCH_CHECK("unary_backward");
}

void binary(Stream stream, BinaryOp op, DType dt, const void* a, const void* b, void* out, const Strided& g,
            int64_t n) {
  if (n == 0) return;
  const bool contiguous = is_contiguous_operand(g, 0) && is_contiguous_operand(g, 1);
  const Strided c = contiguous ? g : collapsed(g, 2);
  dispatch_float(dt, [&]<typename T>() {
    if (contiguous)
      launch_map2(stream, BinaryF<T>{op}, static_cast<const T*>(a), static_cast<const T*>(b),
                  static_cast<T*>(out), n);
    else
      with_index(c, 2, n, [&]<typename I>(I, I ni) {
        binary_kernel<T, I><<<blocks_for(ni), 256, 0, stream>>>(
            op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), c, ni);
      });
  });
  TR_CUDA_LAUNCH_CHECK("binary");
}

void affine(Stream stream, DType dt, const void* x, void* y, int64_t n, double alpha, double beta) {
  if (n == 0) return;
  dispatch_float(dt, [&]<typename T>() {
    using A = acc_t<T>;
    launch_map1(stream, AffineF<T>{static_cast<A>(alpha), static_cast<A>(beta)}, static_cast<const T*>(x),
                static_cast<T*>(y), n);
  });
  TR_CUDA_LAUNCH_CHECK("affine");
}

void pow_scalar(Stream stream, DType dt, const void* x, void* y, int64_t n, double exponent) {
  dispatch_float(dt, [&]<typename T>() {
    pow_kernel<T>
        <<<blocks_for(n), 256, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), n, exponent);
  });
  TR_CUDA_LAUNCH_CHECK("pow");
}

void masked_fill(Stream stream, DType dt, const void* x, const bool* mask, void* y, const Strided& g,
                 int64_t n, double value) {
  Strided m;  // the mask's strides (operand 1) as the only operand, collapsed
  m.nd = g.nd;
  for (int d = 0; d < g.nd; ++d) m.shape[d] = g.shape[d], m.stride[0][d] = g.stride[1][d];
  m = collapsed(m, 1);
  dispatch_float(dt, [&]<typename T>() {
    with_index(m, 1, n, [&]<typename I>(I, I ni) {
      masked_fill_kernel<T, I><<<blocks_for(ni), 256, 0, stream>>>(static_cast<const T*>(x), mask,
                                                                   static_cast<T*>(y), m, ni, value);
    });
  });
  TR_CUDA_LAUNCH_CHECK("masked_fill");
}

void dropout(Stream stream, DType dt, const void* x, void* y, int64_t n, double p, uint64_t seed,
             uint64_t offset, const uint64_t* shift) {
  if (n == 0) return;
  dispatch_float(dt, [&]<typename T>() {
    const auto pf = static_cast<float>(p);
    const auto scale = static_cast<acc_t<T>>(1.0 / (1.0 - p));
    constexpr int V = static_cast<int>(16 / sizeof(T));
    if constexpr (V % 4 == 0) {
      if (aligned_to(x, 16) && aligned_to(y, 16)) {
        drop::dropout_packs_kernel<V><<<blocks_for((n + V - 1) / V), 256, 0, stream>>>(
            static_cast<const T*>(x), static_cast<T*>(y), n, pf, scale, seed, offset, shift);
        return;
      }
    }
    launch_map1(stream, drop::DropoutF<T>{pf, scale, seed, offset, shift}, static_cast<const T*>(x),
                static_cast<T*>(y), n);
  });
  TR_CUDA_LAUNCH_CHECK("dropout");
}

void dropout_keep_mask(Stream stream, DType dt, void* y, int64_t n, double p, uint64_t seed, uint64_t offset,
                       const uint64_t* shift) {
  if (n == 0) return;
  dispatch_float(dt, [&]<typename T>() {
    constexpr int V = static_cast<int>(16 / sizeof(T));
    if constexpr (V % 4 == 0) {
      if (!aligned_to(y, 16)) throw std::runtime_error("dropout_keep_mask: the mask must be 16-byte aligned");
      drop::keep_mask_packs_kernel<V><<<blocks_for((n + V - 1) / V), 256, 0, stream>>>(
          static_cast<T*>(y), n, static_cast<float>(p), seed, offset, shift);
    } else {
      throw std::runtime_error("dropout_keep_mask: a half or f32 mask only");
    }
  });
  TR_CUDA_LAUNCH_CHECK("dropout_keep_mask");
}

void fused_elementwise(Stream stream, DType dt, const FusedChain& stages, int64_t n, const uint64_t* shift) {
  if (n == 0 || stages.stages == 0) return;
  if (stages.stages > kFusedStages)
    throw std::runtime_error("fused_elementwise: more than " + std::to_string(kFusedStages) + " stages");
  const FusedChain c = chain::prepared(stages);
  dispatch_float(dt, [&]<typename T>() {
    if (chain::chain_elements(c) == 4)
      chain::fused_chain_kernel<T, 4><<<blocks_for((n + 3) / 4), 256, 0, stream>>>(c, n, shift);
    else
      chain::fused_chain_kernel<T, 1><<<blocks_for(n), 256, 0, stream>>>(c, n, shift);
  });
  TR_CUDA_LAUNCH_CHECK("fused_elementwise");
}

namespace {
__global__ void set_u64_kernel(uint64_t* p, uint64_t v) { *p = v; }
}  // namespace

void set_u64(Stream stream, uint64_t* p, uint64_t value) {
  set_u64_kernel<<<1, 1, 0, stream>>>(p, value);
  TR_CUDA_LAUNCH_CHECK("set_u64");
}

}  // namespace tr::cuda
