// CPU elementwise kernels: copy/convert, fill, arange, random fills, unary and binary ops, masked_fill,
// dropout.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "backend/cpu/convert.h"
#include "backend/cpu/convert512.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/elementwise_kernels.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_math512.h"

namespace tr::cpu {

using backend::BinaryOp;
using backend::UnaryOp;

namespace {

// The unsigned integer of T's size: copies and fills as raw bits vectorize where a loop of structs does not.
template <typename T>
using bits_of = std::conditional_t<
    sizeof(T) == 1, uint8_t,
    std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;

template <typename S, typename D>
inline D convert(S v) {
  if constexpr (std::is_same_v<D, bool>) {
    if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
      return static_cast<float>(v) != 0.0f;
    else
      return v != S(0);
  } else if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) {
    if constexpr (std::is_same_v<S, double>)
      return D(v);  // one rounding, straight from f64
    else
      return D(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) {
    return static_cast<D>(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

// A 2-D copy where one operand runs along rows and the other down columns (a transpose made contiguous,
// or converted on the way). The strided walk touched a new cache line per element; here 64 x 64 tiles are
// gathered into an L1 buffer laid out as the destination, then converted row by row in the contiguous loop
// the compiler vectorizes. Bound by memory bandwidth (measured in bench_ops: "dw^T -> dw"). Returns false for
// any other layout. With `scale` (f32 to half only), each value is multiplied by *scale on the way in: the
// bits of a multiply, then the copy.
template <typename S, typename D>
bool transposed_copy(const Shape& shape, const std::array<Strides, 2>& st, const S* s, D* d,
                     const S* scale = nullptr) {
  if (shape.size() != 2 || shape[0] < 16 || shape[1] < 16) return false;
  const int64_t s0 = st[0][0], s1 = st[0][1], d0 = st[1][0], d1 = st[1][1];
  const bool rows_out = s0 == 1 && d1 == 1;  // the destination contiguous along a row, the source down one
  if (!rows_out && !(s1 == 1 && d0 == 1)) return false;
  constexpr int64_t kTile = 64;
  // In destination order: a destination run is contiguous, `outer` counts the runs.
  const int64_t outer = rows_out ? shape[0] : shape[1], inner = rows_out ? shape[1] : shape[0];
  const int64_t s_inner = rows_out ? s1 : s0;  // the source's stride along `outer` is 1
  const int64_t d_outer = rows_out ? d0 : d1;
  const int64_t tiles_o = (outer + kTile - 1) / kTile, tiles_i = (inner + kTile - 1) / kTile;
  const int nt = threads_for(outer * inner);
  const bool wide = cpu_has_avx512f();
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t t = 0; t < tiles_o * tiles_i; ++t) {
    const int64_t o0 = t / tiles_i * kTile, i0 = t % tiles_i * kTile;
    const int64_t no = std::min(kTile, outer - o0), ni = std::min(kTile, inner - i0);
    if constexpr (std::is_same_v<S, float> && std::is_same_v<D, BFloat16>) {
      if (wide) {  // through registers, 16 x 16 at a time
        const float* sp = s + i0 * s_inner + o0;
        D* dp = d + o0 * d_outer + i0;
        if (scale)
          transpose_narrow_bf16_512<true>(sp, s_inner, dp, d_outer, ni, no, *scale);
        else
          transpose_narrow_bf16_512<false>(sp, s_inner, dp, d_outer, ni, no, 1.0f);
        continue;
      }
    }
    S buf[kTile][kTile];
    for (int64_t i = 0; i < ni; ++i) {  // source runs are contiguous along `outer`
      const S* sp = s + (i0 + i) * s_inner + o0;
      if constexpr (std::is_same_v<S, float>) {
        if (scale) {
          const float k = *scale;
          for (int64_t o = 0; o < no; ++o) buf[o][i] = sp[o] * k;
          continue;
        }
      }
      for (int64_t o = 0; o < no; ++o) buf[o][i] = sp[o];
    }
    for (int64_t o = 0; o < no; ++o) {
      D* dp = d + (o0 + o) * d_outer + i0;
      if constexpr (std::is_same_v<S, float> && is_half_v<D>) {
        narrow_run(buf[o], dp, ni);
      } else {
        for (int64_t i = 0; i < ni; ++i) dp[i] = convert<S, D>(buf[o][i]);
      }
    }
  }
  return true;
}

}  // namespace

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  TR_CHECK(src.shape() == dst.shape(), "copy: shapes {} and {} differ", shape_str(src.shape()),
           shape_str(dst.shape()));
  if (src.numel() == 0) return;
  Shape shape = src.shape();
  std::array<Strides, 2> st{src.strides(), dst.strides()};
  coalesce(shape, st);
  dispatch_all(src.dtype(), "copy", [&]<typename S>() {
    dispatch_all(dst.dtype(), "copy", [&]<typename D>() {
      const S* s = static_cast<const S*>(src.data_ptr());
      D* d = static_cast<D*>(dst.data_ptr());
      if (transposed_copy(shape, st, s, d)) return;
      strided_loop<2>(shape, st,
                      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& in) {
                        const S* sp = s + off[0];
                        D* dp = d + off[1];
                        if constexpr (std::is_same_v<S, D>) {  // the bits as they are: no round trip
                          if (in[0] == 1 && in[1] == 1) {
                            // Short runs apart from each other (a head split's 16 floats): a loop the
                            // compiler vectorizes, not a call per run.
                            if (n <= 64 && (dp + n <= sp || sp + n <= dp)) {
                              // As raw bits: GCC keeps a loop of bf16/f16 structs scalar.
                              using Bits = bits_of<S>;
                              const Bits* sb = reinterpret_cast<const Bits*>(sp);
                              Bits* db = reinterpret_cast<Bits*>(dp);
#pragma omp simd
                              for (int64_t i = 0; i < n; ++i) db[i] = sb[i];
                            } else {
                              std::memmove(static_cast<void*>(dp), sp, static_cast<size_t>(n) * sizeof(S));
                            }
                          } else {
                            for (int64_t i = 0; i < n; ++i) dp[i * in[1]] = sp[i * in[0]];
                          }
                        } else if (in[0] == 1 && in[1] == 1) {
                          for (int64_t i = 0; i < n; ++i) dp[i] = convert<S, D>(sp[i]);
                        } else {
                          for (int64_t i = 0; i < n; ++i) dp[i * in[1]] = convert<S, D>(sp[i * in[0]]);
                        }
                      });
    });
  });
}

void CpuBackend::scaled_copy(const Tensor& x, const Tensor& s, const Tensor& dst) {
  // The fused form: an f32 gradient held transposed, scaled and rounded into a half weight's layout (the
  // chunked LM head's dw). Anything else: the two ops.
  if (x.dtype() == DType::f32 && is_half(dst.dtype()) && x.is_contiguous() && x.dim() == 2) {
    Shape shape = x.shape();
    std::array<Strides, 2> st{x.strides(), dst.strides()};
    coalesce(shape, st);
    const float* k = s.data<float>();
    const bool done = dst.dtype() == DType::bf16
                          ? transposed_copy(shape, st, x.data<float>(), dst.data<BFloat16>(), k)
                          : transposed_copy(shape, st, x.data<float>(), dst.data<Half>(), k);
    if (done) return;
  }
  Backend::scaled_copy(x, s, dst);
}

void CpuBackend::fill(const Tensor& out, double value) {
  dispatch_all(out.dtype(), "fill", [&]<typename T>() {
    T* p = static_cast<T*>(out.data_ptr());
    const T v = convert<double, T>(value);
    // Filled as raw bits from a local: stores through p may alias a T the closure holds (bf16's struct), so
    // v read from the closure was reloaded per element, a scalar loop.
    using Bits = bits_of<T>;
    const Bits bits = std::bit_cast<Bits>(v);
    Bits* q = reinterpret_cast<Bits*>(p);
    parallel_range(out.numel(), [q, bits](int64_t lo, int64_t hi) { std::fill(q + lo, q + hi, bits); });
  });
}

void CpuBackend::arange(const Tensor& out, double start, double step) {
  dispatch_all(out.dtype(), "arange", [&]<typename T>() {
    T* p = static_cast<T*>(out.data_ptr());
    for (int64_t i = 0; i < out.numel(); ++i)
      p[i] = convert<double, T>(start + static_cast<double>(i) * step);
  });
}

void CpuBackend::random_normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) {
  dispatch_float(out.dtype(), "random_normal", [&]<typename T>() {
    T* p = static_cast<T*>(out.data_ptr());
    // Box-Muller on words (2i, 2i+1) gives element i; independent of thread count.
    parallel_range(out.numel(), [&](int64_t lo, int64_t hi) {
      Philox4 blk{};  // words 2i and 2i + 1 share a block: one per two elements
      for (int64_t i = lo; i < hi; ++i) {
        const auto w = 2 * static_cast<uint64_t>(i);
        if (i == lo || w % 4 == 0) blk = philox4x32(offset + w / 4, seed);
        float u1 = uniform_from_word(blk.w[w % 4]);
        float u2 = uniform_from_word(blk.w[w % 4 + 1]);
        double r = std::sqrt(-2.0 * std::log(1.0 - static_cast<double>(u1)));
        double z = r * std::cos(6.283185307179586 * static_cast<double>(u2));
        store(p, i, mean + std * z);
      }
    });
  });
}

void CpuBackend::random_uniform(const Tensor& out, double lo_v, double hi_v, uint64_t seed, uint64_t offset) {
  dispatch_float(out.dtype(), "random_uniform", [&]<typename T>() {
    T* p = static_cast<T*>(out.data_ptr());
    parallel_range(out.numel(), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        double u = uniform_from_word(philox_word(seed, offset, static_cast<uint64_t>(i)));
        store(p, i, lo_v + (hi_v - lo_v) * u);
      }
    });
  });
}

void CpuBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  Shape shape = out.shape();
  std::array<Strides, 2> st{x.strides(), out.strides()};
  coalesce(shape, st);
  dispatch_float(x.dtype(), backend::unary_name(op), [&]<typename T>() {
    dispatch_unary(op, [&]<UnaryOp OP>() {
      const T* xp = static_cast<const T*>(x.data_ptr());
      T* yp = static_cast<T*>(out.data_ptr());
      if (x.is_contiguous()) {  // out is
        parallel_range(x.numel(),
                       [&](int64_t lo, int64_t hi) { unary_kernel<T, OP>(xp + lo, yp + lo, hi - lo); });
        return;
      }
      strided_loop<2>(shape, st,
                      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& in) {
                        const T* a = xp + off[0];
                        T* y = yp + off[1];
                        if (in[0] == 1 && in[1] == 1) {
                          unary_kernel<T, OP>(a, y, n);
                        } else {
                          for (int64_t i = 0; i < n; ++i)
                            store(y, i * in[1], backend::unary_fn(OP, load(a, i * in[0])));
                        }
                      });
    });
  });
}

void CpuBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& gy, const Tensor& gx) {
  dispatch_float(x.dtype(), backend::unary_name(op), [&]<typename T>() {
    dispatch_unary(op, [&]<UnaryOp OP>() {
      const T* xp = static_cast<const T*>(x.data_ptr());
      const T* gp = static_cast<const T*>(gy.data_ptr());
      T* op_ = static_cast<T*>(gx.data_ptr());
      parallel_range(x.numel(), [&](int64_t lo, int64_t hi) {
        unary_grad_kernel<T, OP>(xp + lo, gp + lo, op_ + lo, hi - lo);
      });
    });
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  Shape shape = out.shape();
  std::array<Strides, 3> st{a.strides(), b.strides(), out.strides()};
  coalesce(shape, st);
  dispatch_float(out.dtype(), backend::binary_name(op), [&]<typename T>() {
    dispatch_binary(op, [&]<BinaryOp OP>() {
      const T* ap = static_cast<const T*>(a.data_ptr());
      const T* bp = static_cast<const T*>(b.data_ptr());
      T* yp = static_cast<T*>(out.data_ptr());
      strided_loop<3>(
          shape, st, [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& in) {
            const T* x0 = ap + off[0];
            const T* x1 = bp + off[1];
            T* y = yp + off[2];
            if (in[0] == 1 && in[1] == 1 && in[2] == 1) {
              binary_kernel<T, OP>(x0, x1, y, n);
            } else if (in[0] == 1 && in[1] == 0 && in[2] == 1) {
              auto c = load(x1, 0);
              for (int64_t i = 0; i < n; ++i) store(y, i, backend::binary_fn(OP, load(x0, i), c));
            } else {
              for (int64_t i = 0; i < n; ++i)
                store(y, i * in[2], backend::binary_fn(OP, load(x0, i * in[0]), load(x1, i * in[1])));
            }
          });
    });
  });
}

void CpuBackend::affine(const Tensor& x, double alpha, double beta, const Tensor& out) {
  dispatch_float(x.dtype(), "affine", [&]<typename T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(out.data_ptr());
    parallel_range(x.numel(),
                   [&](int64_t lo, int64_t hi) { affine_kernel(xp + lo, yp + lo, hi - lo, alpha, beta); });
  });
}

void CpuBackend::pow_scalar(const Tensor& x, double exponent, const Tensor& out) {
  dispatch_float(x.dtype(), "pow", [&]<typename T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(out.data_ptr());
    A e = static_cast<A>(exponent);
    parallel_range(x.numel(), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) store(yp, i, std::pow(load(xp, i), e));
    });
  });
}

void CpuBackend::masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  Shape shape = out.shape();
  std::array<Strides, 3> st{x.strides(), mask.strides(), out.strides()};
  coalesce(shape, st);
  dispatch_float(x.dtype(), "masked_fill", [&]<typename T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    const bool* mp = static_cast<const bool*>(mask.data_ptr());
    T* yp = static_cast<T*>(out.data_ptr());
    T v = convert<double, T>(value);
    strided_loop<3>(shape, st,
                    [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& in) {
                      for (int64_t i = 0; i < n; ++i) {
                        yp[off[2] + i * in[2]] = mp[off[1] + i * in[1]] ? v : xp[off[0] + i * in[0]];
                      }
                    });
  });
}

void CpuBackend::dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& y) {
  dispatch_float(x.dtype(), "dropout", [&]<typename T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    parallel_range(x.numel(), [&](int64_t lo, int64_t hi) {
      dropout_kernel(xp + lo, yp + lo, hi - lo, lo, p, seed, offset);
    });
  });
}

CpuBackend& cpu_backend() {
  static CpuBackend b;
  return b;
}

}  // namespace tr::cpu
