// CPU elementwise kernels: copy/convert, fill, arange, random fills, unary and binary ops, masked_fill,
// dropout.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/unary_math.h"
#include "core/rng.h"

namespace tr::cpu {

using backend::BinaryOp;
using backend::UnaryOp;

namespace {

// Calls f.template operator()<OP>() with the op as a compile-time constant so the inner loops specialize.
template <typename F>
void dispatch_unary(UnaryOp op, F&& f) {
  switch (op) {
#define TR_CASE(o) \
  case UnaryOp::o: f.template operator()<UnaryOp::o>(); return;
    // clang-format off
    TR_CASE(neg)
    TR_CASE(exp)
    TR_CASE(log)
    TR_CASE(sqrt)
    TR_CASE(rsqrt)
    TR_CASE(tanh)
    TR_CASE(sigmoid)
    TR_CASE(relu)
    TR_CASE(gelu_tanh)
    TR_CASE(gelu_erf)
    TR_CASE(silu)
    TR_CASE(abs)
    TR_CASE(square)
    TR_CASE(reciprocal)
    // clang-format on
#undef TR_CASE
  }
}

template <typename F>
void dispatch_binary(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::add: f.template operator()<BinaryOp::add>(); return;
    case BinaryOp::sub: f.template operator()<BinaryOp::sub>(); return;
    case BinaryOp::mul: f.template operator()<BinaryOp::mul>(); return;
    case BinaryOp::div: f.template operator()<BinaryOp::div>(); return;
    case BinaryOp::maximum: f.template operator()<BinaryOp::maximum>(); return;
    case BinaryOp::minimum: f.template operator()<BinaryOp::minimum>(); return;
    case BinaryOp::eq: f.template operator()<BinaryOp::eq>(); return;
  }
}

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

// Parallel loop over a contiguous range.
template <typename F>
void parallel_range(int64_t n, F&& f) {
  const int nt = threads_for(n);
  if (nt == 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    int64_t chunk = (n + T - 1) / T;
    int64_t lo = std::min<int64_t>(n, t * chunk), hi = std::min<int64_t>(n, lo + chunk);
    if (lo < hi) f(lo, hi);
  }
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
      strided_loop<2>(shape, st,
                      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& in) {
                        const S* sp = s + off[0];
                        D* dp = d + off[1];
                        if (in[0] == 1 && in[1] == 1) {
                          for (int64_t i = 0; i < n; ++i) dp[i] = convert<S, D>(sp[i]);
                        } else {
                          for (int64_t i = 0; i < n; ++i) dp[i * in[1]] = convert<S, D>(sp[i * in[0]]);
                        }
                      });
    });
  });
}

void CpuBackend::fill(const Tensor& out, double value) {
  dispatch_all(out.dtype(), "fill", [&]<typename T>() {
    T* p = static_cast<T*>(out.data_ptr());
    T v = convert<double, T>(value);
    parallel_range(out.numel(), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) p[i] = v;
    });
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
      for (int64_t i = lo; i < hi; ++i) {
        float u1 = uniform_from_word(philox_word(seed, offset, 2 * static_cast<uint64_t>(i)));
        float u2 = uniform_from_word(philox_word(seed, offset, 2 * static_cast<uint64_t>(i) + 1));
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
      strided_loop<2>(shape, st,
                      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& in) {
                        const T* a = xp + off[0];
                        T* y = yp + off[1];
                        if (in[0] == 1 && in[1] == 1) {
#pragma omp simd
                          for (int64_t i = 0; i < n; ++i) store(y, i, backend::unary_fn(OP, load(a, i)));
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
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) store(op_, i, load(gp, i) * backend::unary_grad(OP, load(xp, i)));
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
#pragma omp simd
              for (int64_t i = 0; i < n; ++i) store(y, i, backend::binary_fn(OP, load(x0, i), load(x1, i)));
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
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(out.data_ptr());
    A al = static_cast<A>(alpha), be = static_cast<A>(beta);
    parallel_range(x.numel(), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) store(yp, i, al * load(xp, i) + be);
    });
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
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    const float pf = static_cast<float>(p);
    const A scale = static_cast<A>(1.0 / (1.0 - p));
    parallel_range(x.numel(), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        bool keep = uniform_from_word(philox_word(seed, offset, static_cast<uint64_t>(i))) >= pf;
        store(yp, i, keep ? load(xp, i) * scale : A(0));
      }
    });
  });
}

CpuBackend& cpu_backend() {
  static CpuBackend b;
  return b;
}

}  // namespace tr::cpu
