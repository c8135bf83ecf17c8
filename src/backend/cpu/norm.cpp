// CPU LayerNorm and RMSNorm, forward and backward fused per row, optionally with the residual add. Statistics
// (mean, rstd) are kept in the accumulation type (f32, or f64 for f64 inputs). Weight/bias gradients are
// summed over fixed row blocks and then in block order, so the bits do not depend on the thread count.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"

namespace tr::cpu {

namespace {

constexpr int64_t kRowBlock = 32;

// Sums per-block partials [blocks, n] into out (overwrite), in block order.
template <typename T>
void reduce_blocks(const std::vector<double>& part, int64_t blocks, int64_t n, T* out) {
#pragma omp parallel for num_threads(threads_for(blocks* n))
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t b = 0; b < blocks; ++b) s += part[static_cast<size_t>(b * n + j)];
    store(out, j, s);
  }
}

// Row r of the norm's input: x's row, or with a residual the row of sum = x + residual (rounded to T, as a
// separate add), written first.
template <typename T>
const T* add_residual(const T* x, const T* res, T* sum, int64_t r, int64_t n) {
  if (!res) return x + r * n;
  T* s = sum + r * n;
  const T *a = x + r * n, *b = res + r * n;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) store(s, i, load(a, i) + load(b, i));
  return s;
}

}  // namespace

void CpuBackend::layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                            const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                            const Tensor& sum) {
  const int64_t n = x.shape().back();
  const int64_t rows = x.numel() / std::max<int64_t>(n, 1);
  dispatch_float(x.dtype(), "layer_norm", [&]<typename T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* wp = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
    const T* bp = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
    T* yp = static_cast<T*>(y.data_ptr());
    A* mp = static_cast<A*>(mean.data_ptr());
    A* rp = static_cast<A*>(rstd.data_ptr());
    const T* res = residual.defined() ? static_cast<const T*>(residual.data_ptr()) : nullptr;
    T* sp = residual.defined() ? static_cast<T*>(sum.data_ptr()) : nullptr;
#pragma omp parallel for num_threads(threads_for(rows* n * 3)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = add_residual(xp, res, sp, r, n);
      T* yr = yp + r * n;
      // Branch-free loops, so each runs in vectors (the sums add in lanes, then across them).
      A s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; ++i) s += load(xr, i);
      const A mu = s / static_cast<A>(n);
      A v = 0;
#pragma omp simd reduction(+ : v)
      for (int64_t i = 0; i < n; ++i) {
        const A d = load(xr, i) - mu;
        v += d * d;
      }
      const A rs = A(1) / std::sqrt(v / static_cast<A>(n) + static_cast<A>(eps));
      mp[r] = mu;
      rp[r] = rs;
      if (wp && bp) {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) store(yr, i, (load(xr, i) - mu) * rs * load(wp, i) + load(bp, i));
      } else {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          A h = (load(xr, i) - mu) * rs;
          if (wp) h *= load(wp, i);
          if (bp) h += load(bp, i);
          store(yr, i, h);
        }
      }
    }
  });
}

void CpuBackend::layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& gy, const Tensor& gx, const Tensor& gw, const Tensor& gb,
                                     const Tensor& gx_add) {
  const int64_t n = x.shape().back();
  const int64_t rows = x.numel() / std::max<int64_t>(n, 1);
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  dispatch_float(x.dtype(), "layer_norm_backward", [&]<typename T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* wp = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
    const T* gp = static_cast<const T*>(gy.data_ptr());
    const A* mp = static_cast<const A*>(mean.data_ptr());
    const A* rp = static_cast<const A*>(rstd.data_ptr());
    T* gxp = gx.defined() ? static_cast<T*>(gx.data_ptr()) : nullptr;
    const T* gap = gx_add.defined() ? static_cast<const T*>(gx_add.data_ptr()) : nullptr;
    const bool need_w = gw.defined(), need_b = gb.defined();
    std::vector<double> pw(need_w ? static_cast<size_t>(blocks * n) : 0),
        pb(need_b ? static_cast<size_t>(blocks * n) : 0);
#pragma omp parallel for num_threads(threads_for(rows* n * 4)) schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      double* bw = need_w ? pw.data() + blk * n : nullptr;
      double* bb = need_b ? pb.data() + blk * n : nullptr;
      for (int64_t r = blk * kRowBlock; r < std::min(rows, (blk + 1) * kRowBlock); ++r) {
        const T* xr = xp + r * n;
        const T* gr = gp + r * n;
        const A mu = mp[r], rs = rp[r];
        // Each loop without branches inside, so it runs in vectors: the column partials (f64, per column in
        // row order: the same bits as before), then the row's two sums (lanes, then across them).
        if (bw) {
#pragma omp simd
          for (int64_t i = 0; i < n; ++i)
            bw[i] += static_cast<double>(load(gr, i) * ((load(xr, i) - mu) * rs));
        }
        if (bb) {
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) bb[i] += static_cast<double>(load(gr, i));
        }
        if (!gxp) continue;
        A sum_g = 0, sum_gx = 0;
        if (wp) {
#pragma omp simd reduction(+ : sum_g, sum_gx)
          for (int64_t i = 0; i < n; ++i) {
            const A gh = load(gr, i) * load(wp, i);
            sum_g += gh;
            sum_gx += gh * ((load(xr, i) - mu) * rs);
          }
        } else {
#pragma omp simd reduction(+ : sum_g, sum_gx)
          for (int64_t i = 0; i < n; ++i) {
            const A gh = load(gr, i);
            sum_g += gh;
            sum_gx += gh * ((load(xr, i) - mu) * rs);
          }
        }
        const A inv_n = A(1) / static_cast<A>(n);
        const A mg = sum_g * inv_n, mgx = sum_gx * inv_n;
        T* out = gxp + r * n;
        const T* add = gap ? gap + r * n : nullptr;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          const A xh = (load(xr, i) - mu) * rs;
          const A gh = wp ? load(gr, i) * load(wp, i) : load(gr, i);
          const A v = rs * (gh - mg - xh * mgx);
          store(out, i, add ? v + load(add, i) : v);
        }
      }
    }
    if (need_w) reduce_blocks(pw, blocks, n, static_cast<T*>(gw.data_ptr()));
    if (need_b) reduce_blocks(pb, blocks, n, static_cast<T*>(gb.data_ptr()));
  });
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd,
                          const Tensor& residual, const Tensor& sum) {
  const int64_t n = x.shape().back();
  const int64_t rows = x.numel() / std::max<int64_t>(n, 1);
  dispatch_float(x.dtype(), "rms_norm", [&]<typename T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* wp = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
    T* yp = static_cast<T*>(y.data_ptr());
    A* rp = static_cast<A*>(rstd.data_ptr());
    const T* res = residual.defined() ? static_cast<const T*>(residual.data_ptr()) : nullptr;
    T* sp = residual.defined() ? static_cast<T*>(sum.data_ptr()) : nullptr;
#pragma omp parallel for num_threads(threads_for(rows* n * 2)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = add_residual(xp, res, sp, r, n);
      T* yr = yp + r * n;
      A ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < n; ++i) {
        const A v = load(xr, i);
        ss += v * v;
      }
      const A rs = A(1) / std::sqrt(ss / static_cast<A>(n) + static_cast<A>(eps));
      rp[r] = rs;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        // As HF: normalize in fp32, cast to the input dtype, then scale by the weight.
        const A h = round_as<T>(load(xr, i) * rs);
        store(yr, i, wp ? h * load(wp, i) : h);
      }
    }
  });
}

void CpuBackend::rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& gy,
                                   const Tensor& gx, const Tensor& gw, const Tensor& gx_add) {
  const int64_t n = x.shape().back();
  const int64_t rows = x.numel() / std::max<int64_t>(n, 1);
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  dispatch_float(x.dtype(), "rms_norm_backward", [&]<typename T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* wp = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
    const T* gp = static_cast<const T*>(gy.data_ptr());
    const A* rp = static_cast<const A*>(rstd.data_ptr());
    T* gxp = gx.defined() ? static_cast<T*>(gx.data_ptr()) : nullptr;
    const T* gap = gx_add.defined() ? static_cast<const T*>(gx_add.data_ptr()) : nullptr;
    const bool need_w = gw.defined();
    std::vector<double> pw(need_w ? static_cast<size_t>(blocks * n) : 0);
#pragma omp parallel for num_threads(threads_for(rows* n * 4)) schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      double* bw = need_w ? pw.data() + blk * n : nullptr;
      for (int64_t r = blk * kRowBlock; r < std::min(rows, (blk + 1) * kRowBlock); ++r) {
        const T* xr = xp + r * n;
        const T* gr = gp + r * n;
        const A rs = rp[r];
        // As layer_norm_backward: the f64 column partials (their bits kept), then the row sum in lanes.
        if (bw) {
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) bw[i] += static_cast<double>(load(gr, i) * (load(xr, i) * rs));
        }
        if (!gxp) continue;
        A sum_gx = 0;
#pragma omp simd reduction(+ : sum_gx)
        for (int64_t i = 0; i < n; ++i) {
          const A gh = wp ? load(gr, i) * load(wp, i) : load(gr, i);
          sum_gx += gh * (load(xr, i) * rs);
        }
        const A mgx = sum_gx / static_cast<A>(n);
        T* out = gxp + r * n;
        const T* add = gap ? gap + r * n : nullptr;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          const A xh = load(xr, i) * rs;
          const A gh = wp ? load(gr, i) * load(wp, i) : load(gr, i);
          const A v = rs * (gh - xh * mgx);
          store(out, i, add ? v + load(add, i) : v);
        }
      }
    }
    if (need_w) reduce_blocks(pw, blocks, n, static_cast<T*>(gw.data_ptr()));
  });
}

}  // namespace tr::cpu
