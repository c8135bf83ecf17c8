// CPU cross-entropy (fused: the backward recomputes softmax from the saved logsumexp, so no probability
// tensor is ever stored), embedding gather/scatter-add, and rotary position embedding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/convert.h"
#include "backend/cpu/convert512.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_math512.h"
#include "backend/unary_math.h"

namespace tr::cpu {

namespace {

void check_labels(const Tensor& labels, int64_t v, int64_t ignore_index, const char* op) {
  const int64_t* lp = labels.data<int64_t>();
  for (int64_t i = 0; i < labels.numel(); ++i)
    TR_CHECK(lp[i] == ignore_index || (lp[i] >= 0 && lp[i] < v),
             "{}: label {} at position {} is out of range for {} classes (ignore_index {})", op, lp[i], i, v,
             ignore_index);
}

// One f32 row's logsumexp: its max, then the sum of exp(x - max) while the row is in cache. With `e`, the
// exps are kept there (e may be xr) and `sum` receives their sum.
inline float row_lse(const float* xr, int64_t v, bool wide, float* e = nullptr, float* sum = nullptr) {
  const float mx = wide ? row_max_512(xr, v) : row_max(xr, v);
  const float s = wide ? exp_sum_512(xr, mx, e, v) : exp_sum(xr, mx, e, v);
  if (sum) *sum = s;
  return mx + std::log(s);
}

// Label smoothing e (backend.h): the loss of a row from its logsumexp l, label logit xl and logit sum sx;
// e = 0 is the plain loss's bits.
template <typename A>
inline A smoothed_loss(A l, A xl, A sx, A e, int64_t v) {
  return e == A(0) ? l - xl : (A(1) - e) * (l - xl) + e * (l - sx / static_cast<A>(v));
}

// What a row's gradient g * softmax(x) loses with smoothing e: `off` at every element (+0 without smoothing,
// so the plain gradient's bits stay) and `at` more at the label (exactly g without smoothing).
template <typename A>
struct SmoothedTarget {
  A off, at;
  SmoothedTarget(A g, A e, int64_t v)
      : off(e == A(0) ? A(0) : g * e / static_cast<A>(v)), at(g * (A(1) - e)) {}
  template <typename F>
  void apply(F* out, int64_t label, int64_t v) const {
    if (off != A(0))
      for (int64_t i = 0; i < v; ++i) out[i] -= off;
    out[label] -= at;
  }
};

inline float row_sum(const float* xr, int64_t v) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < v; ++i) s += xr[i];
  return s;
}

// One f32 row's gradient g * softmax(x) - g * ((1 - e) * onehot + e / v), into out (which may be xr).
inline void row_grad(const float* xr, float l, float g, int64_t label, float* out, int64_t v, bool wide,
                     float e) {
  if (wide)
    exp_scale_512(xr, l, g, out, v);
  else
    exp_scale(xr, l, g, out, v);
  SmoothedTarget<float>(g, e, v).apply(out, label, v);
}

}  // namespace

void CpuBackend::cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                               double smoothing, const Tensor& loss, const Tensor& lse) {
  const int64_t v = logits.shape().back();
  const int64_t rows = logits.numel() / std::max<int64_t>(v, 1), ldx = backend::row_stride(logits);
  check_labels(labels, v, ignore_index, "cross_entropy");
  dispatch_float(logits.dtype(), "cross_entropy", [&]<typename T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(logits.data_ptr());
    const int64_t* lp = labels.data<int64_t>();
    A* out = static_cast<A*>(loss.data_ptr());
    A* lsep = static_cast<A*>(lse.data_ptr());
    const bool wide = cpu_has_avx512f();
    const A e = static_cast<A>(smoothing);
    constexpr bool kHalf = std::is_same_v<A, float> && !std::is_same_v<T, float>;
#pragma omp parallel num_threads(threads_for(rows* v * 2))
    {
      // Half logits: each row widened into this buffer (L1/L2) and run through the f32 kernel - the f32
      // kernel's bits for the same values, at its vector speed.
      std::vector<float> buf(kHalf ? static_cast<size_t>(v) : 0);
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        if (lp[r] == ignore_index) {
          out[r] = 0;
          lsep[r] = 0;
          continue;
        }
        const T* xr = xp + r * ldx;
        A l, sx = 0;  // sx: the row's sum, for smoothing's mean
        if constexpr (std::is_same_v<T, float>) {
          l = row_lse(xr, v, wide);
          if (e != 0) sx = row_sum(xr, v);
        } else if constexpr (kHalf) {
          widen_run(xr, buf.data(), v);
          l = row_lse(buf.data(), v, wide);
          if (e != 0) sx = row_sum(buf.data(), v);
        } else {
          A mx = -std::numeric_limits<A>::infinity(), s = 0;
          for (int64_t i = 0; i < v; ++i) mx = std::max(mx, load(xr, i));
          for (int64_t i = 0; i < v; ++i) s += backend::exp_(load(xr, i) - mx);
          for (int64_t i = 0; i < v && e != 0; ++i) sx += load(xr, i);
          l = mx + std::log(s);
        }
        lsep[r] = l;
        out[r] = smoothed_loss<A>(l, load(xr, lp[r]), sx, e, v);
      }
    }
  });
}

namespace {

// f32 logits, half gradient (the chunked LM head's bf16/f16 GEMM operand): each row's f32 gradient is made in
// a per-thread buffer by the f32 kernel and rounded from there (L2), instead of being stored in f32 and
// narrowed by a second pass over memory; the bits are those of the f32 kernel's values rounded once (RNE).
template <typename H>
void cross_entropy_backward_to_half(const float* xp, int64_t ldx, const int64_t* lp, const float* lsep,
                                    const float* gl, H* gp, int64_t ldg, int64_t rows, int64_t v,
                                    int64_t ignore_index, float e) {
  const bool wide = cpu_has_avx512f();
#pragma omp parallel num_threads(threads_for(rows* v * 2))
  {
    std::vector<float> buf(static_cast<size_t>(v));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      H* out = gp + r * ldg;
      if (lp[r] == ignore_index) {
        std::memset(static_cast<void*>(out), 0, static_cast<size_t>(v) * sizeof(H));  // +0 in bf16 and f16
        continue;
      }
      row_grad(xp + r * ldx, lsep[r], gl[r], lp[r], buf.data(), v, wide, e);
      narrow_run(buf.data(), out, v);
    }
  }
}

}  // namespace

void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                        const Tensor& grad_loss, int64_t ignore_index, double smoothing,
                                        const Tensor& glogits) {
  const int64_t v = logits.shape().back();
  const int64_t rows = logits.numel() / std::max<int64_t>(v, 1);
  const int64_t ldx = backend::row_stride(logits), ldg = backend::row_stride(glogits);
  if (glogits.dtype() != logits.dtype()) {
    TR_CHECK(
        logits.dtype() == DType::f32 && (glogits.dtype() == DType::bf16 || glogits.dtype() == DType::f16),
        "cross_entropy_backward: a {} gradient of {} logits (only f32 logits to bf16/f16)",
        dtype_name(glogits.dtype()), dtype_name(logits.dtype()));
    const float *xp = logits.data<float>(), *lsep = lse.data<float>(), *gl = grad_loss.data<float>();
    if (glogits.dtype() == DType::bf16)
      cross_entropy_backward_to_half(xp, ldx, labels.data<int64_t>(), lsep, gl,
                                     static_cast<BFloat16*>(glogits.data_ptr()), ldg, rows, v, ignore_index,
                                     static_cast<float>(smoothing));
    else
      cross_entropy_backward_to_half(xp, ldx, labels.data<int64_t>(), lsep, gl,
                                     static_cast<Half*>(glogits.data_ptr()), ldg, rows, v, ignore_index,
                                     static_cast<float>(smoothing));
    return;
  }
  dispatch_float(logits.dtype(), "cross_entropy_backward", [&]<typename T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(logits.data_ptr());
    const int64_t* lp = labels.data<int64_t>();
    const A* lsep = static_cast<const A*>(lse.data_ptr());
    const A* gl = static_cast<const A*>(grad_loss.data_ptr());
    T* gp = static_cast<T*>(glogits.data_ptr());
    const bool wide = cpu_has_avx512f();
    const A e = static_cast<A>(smoothing);
    constexpr bool kHalf = std::is_same_v<A, float> && !std::is_same_v<T, float>;
#pragma omp parallel num_threads(threads_for(rows* v * 2))
    {
      // Half logits: the row widened, the f32 kernel's gradient made in this buffer and rounded once (the
      // label's value too: scaled, the gradient subtracted, then rounded).
      std::vector<float> buf(kHalf ? static_cast<size_t>(v) : 0);
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        T* out = gp + r * ldg;
        if (lp[r] == ignore_index) {
          for (int64_t i = 0; i < v; ++i) store(out, i, A(0));
          continue;
        }
        const T* xr = xp + r * ldx;
        const A g = gl[r], l = lsep[r];
        if constexpr (std::is_same_v<T, float>) {
          row_grad(xr, l, g, lp[r], out, v, wide, e);
        } else if constexpr (kHalf) {
          widen_run(xr, buf.data(), v);
          row_grad(buf.data(), l, g, lp[r], buf.data(), v, wide, e);
          narrow_run(buf.data(), out, v);
        } else {
          const SmoothedTarget<A> t(g, e, v);
          for (int64_t i = 0; i < v; ++i) store(out, i, g * backend::exp_(load(xr, i) - l) - t.off);
          store(out, lp[r], load(out, lp[r]) - t.at);
        }
      }
    }
  });
}

// f32 logits only (the chunked LM head's); other dtypes run the two ops. Per row: the max, then exp(x - max)
// summed and kept - in the row itself (f32, in place) or a per-thread f32 buffer (L2) - and scaled by
// grad / sum into the gradient: one pass over the row in memory and one exp per element, where the two ops
// read the row twice and took two. The loss and logsumexp have cross_entropy's bits; the gradient is within
// an f32 rounding or two of cross_entropy_backward's exp(x - lse) * grad. Bound by the exp (~20 flops an
// element) once the row is in cache.
void CpuBackend::cross_entropy_with_grad(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                                         double smoothing, const Tensor& loss, const Tensor& lse,
                                         const Tensor& grad_loss, const Tensor& glogits) {
  if (logits.dtype() != DType::f32) {
    Backend::cross_entropy_with_grad(logits, labels, ignore_index, smoothing, loss, lse, grad_loss, glogits);
    return;
  }
  const float eps = static_cast<float>(smoothing);
  const int64_t v = logits.shape().back();
  const int64_t rows = logits.numel() / std::max<int64_t>(v, 1);
  check_labels(labels, v, ignore_index, "cross_entropy");
  const float* xp = logits.data<float>();
  const int64_t* lp = labels.data<int64_t>();
  float *out = loss.data<float>(), *lsep = lse.data<float>();
  const float* gl = grad_loss.data<float>();
  const DType gdt = glogits.dtype();
  const size_t row_bytes = static_cast<size_t>(v) * dtype_size(gdt);
  const int64_t ldx = backend::row_stride(logits);
  const size_t g_stride = static_cast<size_t>(backend::row_stride(glogits)) * dtype_size(gdt);
  const bool wide = cpu_has_avx512f();
#pragma omp parallel num_threads(threads_for(rows* v * 2))
  {
    std::vector<float> buf(gdt == DType::f32 ? 0 : static_cast<size_t>(v));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = xp + r * ldx;
      char* g = static_cast<char*>(glogits.data_ptr()) + static_cast<size_t>(r) * g_stride;
      if (lp[r] == ignore_index) {
        out[r] = lsep[r] = 0.0f;
        std::memset(g, 0, row_bytes);  // +0 in every float dtype
        continue;
      }
      const float at_label = xr[lp[r]];  // read before an in-place gradient overwrites it
      const float sx = eps != 0 ? row_sum(xr, v) : 0.0f;
      float* e = gdt == DType::f32 ? reinterpret_cast<float*>(g) : buf.data();
      float sum = 0;
      const float l = row_lse(xr, v, wide, e, &sum);
      lsep[r] = l;
      out[r] = smoothed_loss(l, at_label, sx, eps, v);
      const float k = gl[r] / sum;
      const SmoothedTarget<float> target(gl[r], eps, v);
      if (gdt == DType::bf16 && wide) {
        // Scaled (label smoothing's e / V taken off) and rounded in one pass over the row in L2, streamed
        // past the cache: the [rows, V] gradient is far larger than it, so ordinary stores would first read
        // every line they write. The label's value is made as the two-pass form makes it (scaled, the
        // smoothing's share and the gradient subtracted, then rounded).
        float scaled = e[lp[r]] * k;
        asm("" : "+x"(scaled));  // materialized: never contracted into an FMA with the subtraction
        const float at = (scaled - target.off) - target.at;
        BFloat16* h = reinterpret_cast<BFloat16*>(g);
        scale_narrow_bf16_512(e, k, h, v, true, target.off);
        h[lp[r]] = from_f32<BFloat16>(at);
        continue;
      }
#pragma omp simd
      for (int64_t i = 0; i < v; ++i) e[i] *= k;
      target.apply(e, lp[r], v);
      if (gdt == DType::bf16)
        narrow_run(e, reinterpret_cast<BFloat16*>(g), v);
      else if (gdt == DType::f16)
        narrow_run(e, reinterpret_cast<Half*>(g), v);
    }
  }
}

void CpuBackend::embedding(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  const int64_t v = weight.shape()[0], d = weight.shape()[1];
  const int64_t n = ids.numel();
  const int64_t* ip = ids.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TR_CHECK(ip[i] >= 0 && ip[i] < v,
             "embedding: index {} at position {} is out of range for a table of {} rows", ip[i], i, v);
  const size_t row_bytes = static_cast<size_t>(d) * dtype_size(weight.dtype());
  const char* wp = static_cast<const char*>(weight.data_ptr());
  char* op = static_cast<char*>(out.data_ptr());
#pragma omp parallel for num_threads(threads_for(n* d))
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(op + static_cast<size_t>(i) * row_bytes, wp + static_cast<size_t>(ip[i]) * row_bytes,
                row_bytes);
}

void CpuBackend::embedding_backward(const Tensor& gy, const Tensor& ids, const Tensor& gweight) {
  const int64_t d = gweight.shape()[1];
  const int64_t n = ids.numel();
  const int64_t* ip = ids.data<int64_t>();
  fill(gweight, 0.0);
  dispatch_float(gy.dtype(), "embedding_backward", [&]<typename T>() {
    const T* gp = static_cast<const T*>(gy.data_ptr());
    T* wp = static_cast<T*>(gweight.data_ptr());
    // Each thread owns a slice of columns and walks the rows in order: race-free and deterministic.
    const int nt = threads_for(n * d);
#pragma omp parallel num_threads(nt)
    {
      int t = omp_get_thread_num(), T_ = omp_get_num_threads();
      int64_t chunk = (d + T_ - 1) / T_;
      int64_t lo = std::min<int64_t>(d, t * chunk), hi = std::min<int64_t>(d, lo + chunk);
      for (int64_t i = 0; i < n; ++i) {
        T* row = wp + ip[i] * d;
        const T* g = gp + i * d;
        for (int64_t j = lo; j < hi; ++j) store(row, j, load(row, j) + load(g, j));
      }
    }
  });
}

void CpuBackend::rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions,
                      bool seq_major, bool inverse, const Tensor& y) {
  const auto& s = x.shape();
  const int64_t B = s[0], D = s[3];
  const int64_t H = seq_major ? s[2] : s[1];
  const int64_t T = seq_major ? s[1] : s[2];
  const int64_t half = D / 2;
  const int64_t P = cos.shape()[0];
  const int64_t* pp = positions.data<int64_t>();
  for (int64_t i = 0; i < B * T; ++i)
    TR_CHECK(pp[i] >= 0 && pp[i] < P, "rope: position {} at index {} is outside the table of {} positions",
             pp[i], i, P);
  const float* cp = cos.data<float>();
  const float* sp = sin.data<float>();
  const float sign = inverse ? -1.0f : 1.0f;
  dispatch_float(x.dtype(), "rope", [&]<typename TT>() {
    using A = acc_t<TT>;
    const TT* xp = static_cast<const TT*>(x.data_ptr());
    TT* yp = static_cast<TT*>(y.data_ptr());
#pragma omp parallel for collapse(2) num_threads(threads_for(x.numel() * 2))
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t t = 0; t < T; ++t) {
          const int64_t base = seq_major ? ((b * T + t) * H + h) * D : ((b * H + h) * T + t) * D;
          const int64_t pos = pp[b * T + t];
          const float* cr = cp + pos * half;
          const float* sr = sp + pos * half;
          for (int64_t i = 0; i < half; ++i) {
            A c = static_cast<A>(cr[i]), sn = static_cast<A>(sign * sr[i]);
            A x1 = load(xp, base + i), x2 = load(xp, base + i + half);
            store(yp, base + i, x1 * c - x2 * sn);
            store(yp, base + i + half, x2 * c + x1 * sn);
          }
        }
      }
    }
  });
}

}  // namespace tr::cpu
