// CPU reductions (sum/mean/max/min over [outer, r, inner]), argmax, top-k and softmax forward/backward.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_math512.h"
#include "backend/unary_math.h"

namespace tr::cpu {

using backend::ReduceOp;

void CpuBackend::reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t r, int64_t inner,
                        const Tensor& out) {
  dispatch_float(x.dtype(), "reduce", [&]<typename T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(out.data_ptr());
    const bool is_sum = op == ReduceOp::sum || op == ReduceOp::mean;
    const double init = op == ReduceOp::max   ? -std::numeric_limits<double>::infinity()
                        : op == ReduceOp::min ? std::numeric_limits<double>::infinity()
                                              : 0.0;
    const double denom = op == ReduceOp::mean ? static_cast<double>(r) : 1.0;
    auto combine = [op](double acc, double v) {
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::mean: return acc + v;
        case ReduceOp::max: return (v != v || v > acc) ? v : acc;
        case ReduceOp::min: return (v != v || v < acc) ? v : acc;
      }
      return acc;
    };
    if (inner == 1) {
      const int nt = threads_for(outer * r);
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int64_t o = 0; o < outer; ++o) {
        const T* row = xp + o * r;
        double acc = init;
        if (is_sum) {
          // four partial sums: shorter dependency chains and a little less rounding error
          double s[4] = {0, 0, 0, 0};
          int64_t i = 0;
          for (; i + 4 <= r; i += 4)
            for (int j = 0; j < 4; ++j) s[j] += static_cast<double>(load(row, i + j));
          for (; i < r; ++i) s[0] += static_cast<double>(load(row, i));
          acc = (s[0] + s[1]) + (s[2] + s[3]);
        } else {
          for (int64_t i = 0; i < r; ++i) acc = combine(acc, static_cast<double>(load(row, i)));
        }
        store(yp, o, acc / denom);
      }
      return;
    }
    // Reduce across rows: work items are (outer block, block of kCols columns); each output column is summed
    // over r in order by one thread, so the bits do not depend on the thread count. A block's f64
    // accumulators stay in registers through all the rows, one pass over the rows per block. Bound by the
    // widening to f64 (torch sums bf16 in f32, ~2x faster here; f64 keeps the CUDA kernels' sums).
    constexpr int64_t kCols = 32;
    const int nt = threads_for(outer * r * inner);
    const int64_t blocks = (inner + kCols - 1) / kCols;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t item = 0; item < outer * blocks; ++item) {
      const int64_t o = item / blocks, j0 = (item % blocks) * kCols, n = std::min(inner - j0, kCols);
      const T* col = xp + o * r * inner + j0;
      double acc[kCols];
      if (is_sum && n == kCols) {  // the same adds in the same order, in vectors across the columns
        for (int64_t j = 0; j < kCols; ++j) acc[j] = 0.0;
        for (int64_t i = 0; i < r; ++i) {
          const T* row = col + i * inner;
#pragma omp simd
          for (int64_t j = 0; j < kCols; ++j) acc[j] += static_cast<double>(load(row, j));
        }
      } else if (is_sum) {  // a last, narrower block: the same, over n columns
        for (int64_t j = 0; j < n; ++j) acc[j] = 0.0;
        for (int64_t i = 0; i < r; ++i) {
          const T* row = col + i * inner;
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(load(row, j));
        }
      } else {
        for (int64_t j = 0; j < n; ++j) acc[j] = init;
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < n; ++j)
            acc[j] = combine(acc[j], static_cast<double>(load(col + i * inner, j)));
      }
      for (int64_t j = 0; j < n; ++j) store(yp, o * inner + j0 + j, acc[j] / denom);
    }
  });
}

void CpuBackend::argmax(const Tensor& x, int64_t outer, int64_t r, int64_t inner, const Tensor& out) {
  dispatch_float(x.dtype(), "argmax", [&]<typename T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    int64_t* yp = static_cast<int64_t*>(out.data_ptr());
#pragma omp parallel for num_threads(threads_for(outer* r* inner)) collapse(2)
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < inner; ++j) {
        int64_t best = 0;
        double bv = static_cast<double>(load(xp, o * r * inner + j));
        for (int64_t i = 1; i < r && bv == bv; ++i) {
          double v = static_cast<double>(load(xp, (o * r + i) * inner + j));
          if (v > bv || v != v) {  // NaN counts as the maximum, as in torch
            bv = v;
            best = i;
          }
        }
        yp[o * inner + j] = best;
      }
    }
  });
}

void CpuBackend::topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) {
  const int64_t n = x.shape().back();
  const int64_t rows = x.numel() / std::max<int64_t>(n, 1);
  dispatch_float(x.dtype(), "topk", [&]<typename T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* vp = static_cast<T*>(values.data_ptr());
    int64_t* ip = static_cast<int64_t*>(indices.data_ptr());
    std::vector<std::vector<int64_t>> scratch(static_cast<size_t>(omp_get_max_threads()),
                                              std::vector<int64_t>(static_cast<size_t>(n)));
#pragma omp parallel for num_threads(threads_for(rows* n))
    for (int64_t row = 0; row < rows; ++row) {
      std::vector<int64_t>& idx = scratch[static_cast<size_t>(omp_get_thread_num())];
      std::iota(idx.begin(), idx.end(), 0);
      const T* rp = xp + row * n;
      // Strict order: NaN above everything (as torch), then value descending, then index ascending.
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
        double va = static_cast<double>(load(rp, a)), vb = static_cast<double>(load(rp, b));
        const bool na = va != va, nb = vb != vb;
        if (na != nb) return na;
        if (!na && va != vb) return va > vb;
        return a < b;
      });
      for (int64_t j = 0; j < k; ++j) {
        vp[row * k + j] = rp[idx[j]];
        ip[row * k + j] = idx[j];
      }
    }
  });
}

namespace {

// One f32 row's softmax (or log-softmax) into out (which may be a): the max, then the exps' sum while the
// row is in L1, then the scaled exps - recomputing exp beats a second pass over stored terms. `wide`: the
// AVX-512 twins (vec_math512.h: the same bits, 16 lanes at a time).
void softmax_row_f32(const float* a, float* out, int64_t n, bool log, bool wide) {
  float mx = wide ? row_max_512(a, n) : row_max(a, n);
  if (mx == -std::numeric_limits<float>::infinity()) mx = 0;  // fully masked row: exp(-inf) = 0 everywhere
  const float sum = wide ? exp_sum_512(a, mx, nullptr, n) : exp_sum(a, mx, nullptr, n);
  if (log) {
    const float lse = mx + std::log(sum);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] - lse;
  } else if (wide) {
    exp_scale_512(a, mx, sum > 0 ? 1.0f / sum : 0.0f, out, n);  // fully masked row -> zeros
  } else {
    exp_scale(a, mx, sum > 0 ? 1.0f / sum : 0.0f, out, n);
  }
}

// The same in T's own accumulator (f64), one element at a time.
template <typename T>
void softmax_row(const T* a, T* out, int64_t n, bool log) {
  using A = acc_t<T>;
  A mx = -std::numeric_limits<A>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, load(a, i));
  if (mx == -std::numeric_limits<A>::infinity()) mx = 0;
  A sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += backend::exp_(load(a, i) - mx);
  if (log) {
    const A lse = mx + std::log(sum);
    for (int64_t i = 0; i < n; ++i) store(out, i, load(a, i) - lse);
  } else {
    const A inv = sum > A(0) ? A(1) / sum : A(0);
    for (int64_t i = 0; i < n; ++i) store(out, i, backend::exp_(load(a, i) - mx) * inv);
  }
}

}  // namespace

void CpuBackend::softmax(const Tensor& x, bool log, const Tensor& y) {
  const int64_t n = x.shape().back();
  const int64_t rows = x.numel() / std::max<int64_t>(n, 1);
  dispatch_float(x.dtype(), "softmax", [&]<typename T>() {
    using A = acc_t<T>;
    constexpr bool kHalf = std::is_same_v<A, float> && !std::is_same_v<T, float>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    const bool wide = cpu_has_avx512f();
#pragma omp parallel num_threads(threads_for(rows* n * 4))
    {
      // Half rows are widened into this buffer and run through the f32 kernels (their vector exp and sums),
      // each result rounded once.
      std::vector<float> buf(kHalf ? static_cast<size_t>(n) : 0);
#pragma omp for schedule(static)
      for (int64_t row = 0; row < rows; ++row) {
        if constexpr (kHalf) {
          widen_run(xp + row * n, buf.data(), n);
          softmax_row_f32(buf.data(), buf.data(), n, log, wide);
          narrow_run(buf.data(), yp + row * n, n);
        } else if constexpr (std::is_same_v<T, float>) {
          softmax_row_f32(xp + row * n, yp + row * n, n, log, wide);
        } else {
          softmax_row(xp + row * n, yp + row * n, n, log);
        }
      }
    }
  });
}

void CpuBackend::softmax_backward(const Tensor& y, const Tensor& gy, bool log, const Tensor& gx) {
  const int64_t n = y.shape().back();
  const int64_t rows = y.numel() / std::max<int64_t>(n, 1);
  dispatch_float(y.dtype(), "softmax_backward", [&]<typename T>() {
    using A = acc_t<T>;
    const T* yp = static_cast<const T*>(y.data_ptr());
    const T* gp = static_cast<const T*>(gy.data_ptr());
    T* op = static_cast<T*>(gx.data_ptr());
#pragma omp parallel for num_threads(threads_for(rows* n * 2)) schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const T* yr = yp + row * n;
      const T* gr = gp + row * n;
      T* o = op + row * n;
      A dot = 0;
      if (log) {
        // y = log_softmax: gx = gy - softmax * sum(gy)
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < n; ++i) dot += load(gr, i);
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) store(o, i, load(gr, i) - backend::exp_(load(yr, i)) * dot);
      } else {
        // gx = y * (gy - sum(gy * y))
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < n; ++i) dot += load(gr, i) * load(yr, i);
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) store(o, i, load(yr, i) * (load(gr, i) - dot));
      }
    }
  });
}

}  // namespace tr::cpu
