// The CPU elementwise kernels over contiguous ranges, shared by the backend's unfused calls and the fused
// chains of torch_compile (fused.cpp), so that a fused element is computed by the very same code and gets
// the same bits. All are bound by memory bandwidth except the transcendental unary ops (vec_unary.h).
#pragma once
#include <algorithm>
#include <bit>
#include <type_traits>

#include "backend/cpu/loops.h"
#include "backend/cpu/philox_cpu.h"
#include "backend/cpu/vec_unary.h"
#include "backend/unary_math.h"
#include "core/rng.h"

namespace tr::cpu {

// Elements of a half-precision row widened at a time on the stack (2 x 2 KiB).
inline constexpr int64_t kHalfBlock = 512;

// y[i] = f(x[i]), i < n.
template <typename T, backend::UnaryOp OP>
inline void unary_kernel(const T* x, T* y, int64_t n) {
  if constexpr (std::is_same_v<T, float> && has_vec_unary<OP>) {
    unary_row<OP>(x, y, n);
  } else if constexpr (is_half_v<T> && has_vec_unary<OP>) {
    // bf16/f16 through the same f32 vector code, a stack block at a time: widened, computed, rounded once
    // (the scalar form ran ~6x slower: 9% of a bf16 step in GELU forward and backward).
    float xb[kHalfBlock], yb[kHalfBlock];
    for (int64_t i = 0; i < n; i += kHalfBlock) {
      const int64_t nb = std::min(kHalfBlock, n - i);
      widen_run(x + i, xb, nb);
      unary_row<OP>(xb, yb, nb);
      narrow_run(yb, y + i, nb);
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) store(y, i, backend::unary_fn(OP, load(x, i)));
  }
}

// gx[i] = gy[i] * f'(x[i]), i < n.
template <typename T, backend::UnaryOp OP>
inline void unary_grad_kernel(const T* x, const T* gy, T* gx, int64_t n) {
  if constexpr (std::is_same_v<T, float> && has_vec_unary<OP>) {
    unary_grad_row<OP>(x, gy, gx, n);
  } else if constexpr (is_half_v<T> && has_vec_unary<OP>) {
    float xb[kHalfBlock], gb[kHalfBlock];
    for (int64_t i = 0; i < n; i += kHalfBlock) {
      const int64_t nb = std::min(kHalfBlock, n - i);
      widen_run(x + i, xb, nb);
      widen_run(gy + i, gb, nb);
      unary_grad_row<OP>(xb, gb, gb, nb);
      narrow_run(gb, gx + i, nb);
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) store(gx, i, load(gy, i) * backend::unary_grad(OP, load(x, i)));
  }
}

// y[i] = a[i] op b[i], i < n.
template <typename T, backend::BinaryOp OP>
inline void binary_kernel(const T* a, const T* b, T* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) store(y, i, backend::binary_fn(OP, load(a, i), load(b, i)));
}

// y[i] = alpha x[i] + beta in the accumulation type.
template <typename T>
inline void affine_kernel(const T* x, T* y, int64_t n, double alpha, double beta) {
  using A = acc_t<T>;
  const A al = static_cast<A>(alpha), be = static_cast<A>(beta);
  for (int64_t i = 0; i < n; ++i) store(y, i, al * load(x, i) + be);
}

// Dropout of n elements that sit at index `first` onward in their tensor: the element of index i is kept
// when the uniform of Philox word i of (seed, offset) is >= p, and scaled by 1 / (1 - p). Bound by the
// Philox rounds.
template <typename T>
inline void dropout_kernel(const T* x, T* y, int64_t n, int64_t first, double p, uint64_t seed,
                           uint64_t offset) {
  using A = acc_t<T>;
  const float pf = static_cast<float>(p);
  const A scale = static_cast<A>(1.0 / (1.0 - p));
  using U = std::conditional_t<sizeof(A) == 4, uint32_t, uint64_t>;
  // The words of 512 elements at a time into L1, then the mask, scale and rounding in vectors.
  constexpr int64_t kRun = 512;
  alignas(64) uint32_t w[kRun];
  for (int64_t r0 = 0; r0 < n; r0 += kRun) {
    const int64_t m = std::min(kRun, n - r0);
    philox_fill(seed, offset, static_cast<uint64_t>(first + r0), m, w);
    const T* xr = x + r0;
    T* yr = y + r0;
#pragma omp simd
    for (int64_t k = 0; k < m; ++k) {
      // A dropped element is the kept value's bits and'ed with zero (+0, as A(0)): GCC vectorizes that,
      // where a select between the product and 0 stayed scalar for bf16.
      const A kept = load(xr, k) * scale;
      const U bits = std::bit_cast<U>(kept) & (uniform_from_word(w[k]) >= pf ? ~U{0} : U{0});
      store(yr, k, std::bit_cast<A>(bits));
    }
  }
}

// Calls f.template operator()<OP>() with the op as a compile-time constant so the inner loops specialize.
template <typename F>
void dispatch_unary(backend::UnaryOp op, F&& f) {
  using backend::UnaryOp;
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
void dispatch_binary(backend::BinaryOp op, F&& f) {
  using backend::BinaryOp;
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

// Parallel loop over a contiguous range: f(lo, hi) per thread.
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

}  // namespace tr::cpu
