// Shared CPU kernel machinery: dtype dispatch, load/store in the accumulation type, and a parallel
// strided loop over N operands that hands contiguous runs of the innermost dim to a lambda.
#pragma once
#include <omp.h>

#include <array>
#include <type_traits>

#include "backend/cpu/convert.h"
#include "core/tensor.h"

namespace tr::cpu {

// Half types compute in f32, f64 in f64.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
inline constexpr bool is_half_v = std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;

template <typename T>
inline acc_t<T> load(const T* p, int64_t i) {
  if constexpr (is_half_v<T>)
    return to_f32(p[i]);
  else
    return static_cast<acc_t<T>>(p[i]);
}
template <typename T, typename A>
inline void store(T* p, int64_t i, A v) {
  if constexpr (is_half_v<T>)
    p[i] = from_f32<T>(static_cast<float>(v));
  else
    p[i] = T(static_cast<acc_t<T>>(v));
}

// v rounded to T's precision and read back in the accumulation type (HF's "cast to the input dtype").
template <typename T, typename A>
inline acc_t<T> round_as(A v) {
  if constexpr (is_half_v<T>)
    return to_f32(from_f32<T>(static_cast<float>(v)));
  else
    return static_cast<acc_t<T>>(T(static_cast<acc_t<T>>(v)));
}

// Calls f.template operator()<T>() for the floating dtypes; throws naming `op` otherwise.
template <typename F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f.template operator()<float>(); return;
    case DType::f64: f.template operator()<double>(); return;
    case DType::bf16: f.template operator()<BFloat16>(); return;
    case DType::f16: f.template operator()<Half>(); return;
    default: fail("{}: dtype {} is not supported (expected a floating dtype)", op, dtype_name(dt));
  }
}

template <typename F>
void dispatch_all(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::i32: f.template operator()<int32_t>(); return;
    case DType::i64: f.template operator()<int64_t>(); return;
    case DType::u8: f.template operator()<uint8_t>(); return;
    case DType::boolean: f.template operator()<bool>(); return;
    default: dispatch_float(dt, op, std::forward<F>(f));
  }
}

// Threads are worth starting above roughly this many elements of simple work.
constexpr int64_t kParallelGrain = 32768;

inline int threads_for(int64_t work) {
  if (work < kParallelGrain) return 1;
  return omp_get_max_threads();
}

// Iterates over `shape` in row-major order. For each run along the innermost dim, calls
// fn(offsets, n, inner_strides) where offsets[j] is the element offset of operand j at the run start.
// Runs are distributed over threads; fn must only touch its own run. Each thread finds its first run's
// offsets by division and steps to the next run by an odometer: a head split's runs are 16 elements, where
// a division per run cost more than the copy.
template <size_t N, typename F>
void strided_loop(const Shape& shape, const std::array<Strides, N>& strides, F&& fn) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  if (nd == 0) {
    std::array<int64_t, N> off{};
    std::array<int64_t, N> inner{};
    fn(off, int64_t{1}, inner);
    return;
  }
  const int64_t n_inner = shape[nd - 1];
  const int64_t rows = shape_numel(shape) / std::max<int64_t>(n_inner, 1);
  if (n_inner == 0 || rows == 0) return;
  std::array<int64_t, N> inner;
  for (size_t j = 0; j < N; ++j) inner[j] = strides[j][nd - 1];
  constexpr int64_t kMaxOuter = 15;
  TR_CHECK(nd - 1 <= kMaxOuter, "strided_loop: {} dims (at most {})", nd, kMaxOuter + 1);
  auto run_rows = [&](int64_t lo, int64_t hi) {
    if (lo >= hi) return;
    int64_t idx[kMaxOuter];
    std::array<int64_t, N> off{};
    int64_t rem = lo;
    for (int64_t d = nd - 2; d >= 0; --d) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
      for (size_t j = 0; j < N; ++j) off[j] += idx[d] * strides[j][d];
    }
    for (int64_t row = lo; row < hi; ++row) {
      fn(off, n_inner, inner);
      for (int64_t d = nd - 2; d >= 0; --d) {  // the next run: the odometer's lowest outer digit moves
        for (size_t j = 0; j < N; ++j) off[j] += strides[j][d];
        if (++idx[d] < shape[d]) break;
        for (size_t j = 0; j < N; ++j) off[j] -= shape[d] * strides[j][d];
        idx[d] = 0;
      }
    }
  };
  const int nt = threads_for(rows * n_inner);
  if (nt == 1) {
    run_rows(0, rows);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t chunk = (rows + T - 1) / T;
    run_rows(std::min(rows, t * chunk), std::min(rows, (t + 1) * chunk));
  }
}

}  // namespace tr::cpu

namespace tr::cpu {

// Merges adjacent dims that are contiguous with each other in every operand and drops size-1 dims, so
// strided_loop gets long inner runs (a contiguous tensor becomes one run).
template <size_t N>
void coalesce(Shape& shape, std::array<Strides, N>& st) {
  Shape s2;
  std::array<Strides, N> t2;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!s2.empty()) {
      bool merge = true;
      for (size_t j = 0; j < N; ++j) merge = merge && t2[j].back() == st[j][d] * shape[d];
      if (merge) {
        s2.back() *= shape[d];
        for (size_t j = 0; j < N; ++j) t2[j].back() = st[j][d];
        continue;
      }
    }
    s2.push_back(shape[d]);
    for (size_t j = 0; j < N; ++j) t2[j].push_back(st[j][d]);
  }
  if (s2.empty()) {
    s2.push_back(1);
    for (size_t j = 0; j < N; ++j) t2[j].push_back(1);
  }
  shape = std::move(s2);
  st = std::move(t2);
}

}  // namespace tr::cpu
