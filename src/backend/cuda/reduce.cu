// CUDA reductions over [outer, r, inner] (long ones split into chunks, deterministic), argmax, top-k and
// softmax forward/backward (one block per row).
#include <cfloat>
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/reduce_kernels.cuh"
#include "backend/unary_math.h"

namespace tr::cuda {

namespace {

// One thread per output; accumulates in double like the CPU kernel, so both agree closely.
template <typename T>
__global__ void reduce_kernel(ReduceOp op, const T* x, T* y, int64_t outer, int64_t r, int64_t inner) {
  const int64_t total = outer * inner;
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < total;
       o += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t a = o / inner, j = o % inner;
    double acc = op == ReduceOp::max ? -INFINITY : op == ReduceOp::min ? INFINITY : 0.0;
    for (int64_t i = 0; i < r; ++i) {
      double v = static_cast<double>(ld(x, (a * r + i) * inner + j));
      if (op == ReduceOp::max)
        acc = (v != v || v > acc) ? v : acc;
      else if (op == ReduceOp::min)
        acc = (v != v || v < acc) ? v : acc;
      else
        acc += v;
    }
    if (op == ReduceOp::mean) acc /= static_cast<double>(r);
    st(y, o, static_cast<acc_t<T>>(acc));
  }
}

template <typename T>
__global__ void argmax_kernel(const T* x, int64_t* y, int64_t outer, int64_t r, int64_t inner) {
  const int64_t total = outer * inner;
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < total;
       o += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t a = o / inner, j = o % inner;
    int64_t best = 0;
    double bv = static_cast<double>(ld(x, a * r * inner + j));
    for (int64_t i = 1; i < r && bv == bv; ++i) {
      double v = static_cast<double>(ld(x, (a * r + i) * inner + j));
      if (v > bv || v != v) {
        bv = v;
        best = i;
      }
    }
    y[o] = best;
  }
}

// One thread per row, k passes of selection: fine for the small k of sampling.
template <typename T>
__global__ void topk_kernel(const T* x, T* vals, int64_t* idx, int64_t rows, int64_t n, int64_t k) {
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; row < rows;
       row += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const T* xr = x + row * n;
    // Strict order, as on the CPU: NaN first, then value descending, then index ascending.
    auto before = [](double va, int64_t ia, double vb, int64_t ib) {
      const bool na = va != va, nb = vb != vb;
      if (na != nb) return na;
      if (!na && va != vb) return va > vb;
      return ia < ib;
    };
    double prev = 0;
    int64_t prev_i = -1;
    for (int64_t j = 0; j < k; ++j) {
      int64_t bi = -1;
      double bv = 0;
      for (int64_t i = 0; i < n; ++i) {
        double v = static_cast<double>(ld(xr, i));
        const bool after = prev_i < 0 || before(prev, prev_i, v, i);
        if (after && (bi < 0 || before(v, i, bv, bi))) {
          bv = v;
          bi = i;
        }
      }
      vals[row * k + j] = xr[bi];
      idx[row * k + j] = bi;
      prev = bv;
      prev_i = bi;
    }
  }
}

template <typename T>
__global__ void softmax_kernel(const T* x, T* y, int64_t n, bool log) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const T* xr = x + blockIdx.x * n;
  T* yr = y + blockIdx.x * n;
  A mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A v = ld(xr, i);
    mx = v > mx ? v : mx;
  }
  mx = block_max(mx, sh);
  if (mx == -INFINITY) mx = 0;
  A s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += backend::exp_(ld(xr, i) - mx);
  s = block_sum(s, sh);
  if (log) {
    const A lse = mx + std::log(s);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) st(yr, i, ld(xr, i) - lse);
  } else {
    const A inv = s > A(0) ? A(1) / s : A(0);  // fully masked row -> zeros
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) st(yr, i, backend::exp_(ld(xr, i) - mx) * inv);
  }
}

template <typename T>
__global__ void softmax_backward_kernel(const T* y, const T* gy, T* gx, int64_t n, bool log) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const int64_t base = blockIdx.x * n;
  A dot = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    dot += log ? ld(gy, base + i) : ld(gy, base + i) * ld(y, base + i);
  dot = block_sum(dot, sh);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A g = ld(gy, base + i), yy = ld(y, base + i);
    st(gx, base + i, log ? g - backend::exp_(yy) * dot : yy * (g - dot));
  }
}

}  // namespace

void reduce(Stream stream, ReduceOp op, DType dt, const void* x, void* y, int64_t outer, int64_t r,
            int64_t inner, Scratch& scratch) {
  const int64_t m = outer * inner;
  if (m == 0) return;
  const int64_t chunks = reduce_chunks(m, r);
  dispatch_float(dt, [&]<typename T>() {
    if (chunks == 1) {
      reduce_kernel<T><<<blocks_for(m), 256, 0, stream>>>(op, static_cast<const T*>(x), static_cast<T*>(y),
                                                          outer, r, inner);
      return;
    }
    constexpr int V = static_cast<int>(16 / sizeof(T));
    const bool packs = inner % V == 0 && aligned_to(x, 16);
    const int64_t c = red::pass1_chunks(m, r, inner, V), chunk = (r + c - 1) / c;
    auto* partial = static_cast<double*>(scratch.take(sizeof(double) * m * c));
    if (packs)
      red::reduce_packs_partial_kernel<T, V><<<blocks_for(m / V * c, 128), 128, 0, stream>>>(
          op, static_cast<const T*>(x), partial, outer, r, inner, chunk, c);
    else
      red::reduce_partial_kernel<T><<<blocks_for(m * c), 256, 0, stream>>>(
          op, static_cast<const T*>(x), partial, outer, r, inner, chunk, c);
    red::reduce_combine_kernel<T>
        <<<blocks_for(m), 256, 0, stream>>>(op, partial, static_cast<T*>(y), m, r, c);
  });
  TR_CUDA_LAUNCH_CHECK("reduce");
}

void argmax(Stream stream, DType dt, const void* x, int64_t* y, int64_t outer, int64_t r, int64_t inner) {
  dispatch_float(dt, [&]<typename T>() {
    argmax_kernel<T>
        <<<blocks_for(outer * inner), 256, 0, stream>>>(static_cast<const T*>(x), y, outer, r, inner);
  });
  TR_CUDA_LAUNCH_CHECK("argmax");
}

void topk(Stream stream, DType dt, const void* x, void* values, int64_t* indices, int64_t rows, int64_t n,
          int64_t k) {
  dispatch_float(dt, [&]<typename T>() {
    topk_kernel<T><<<blocks_for(rows, 64), 64, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(values),
                                                            indices, rows, n, k);
  });
  TR_CUDA_LAUNCH_CHECK("topk");
}

void softmax(Stream stream, DType dt, const void* x, void* y, int64_t rows, int64_t n, bool log) {
  dispatch_float(dt, [&]<typename T>() {
    softmax_kernel<T><<<static_cast<unsigned>(rows), 256, 0, stream>>>(static_cast<const T*>(x),
                                                                       static_cast<T*>(y), n, log);
  });
  TR_CUDA_LAUNCH_CHECK("softmax");
}

void softmax_backward(Stream stream, DType dt, const void* y, const void* gy, void* gx, int64_t rows,
                      int64_t n, bool log) {
  dispatch_float(dt, [&]<typename T>() {
    softmax_backward_kernel<T><<<static_cast<unsigned>(rows), 256, 0, stream>>>(
        static_cast<const T*>(y), static_cast<const T*>(gy), static_cast<T*>(gx), n, log);
  });
  TR_CUDA_LAUNCH_CHECK("softmax_backward");
}

}  // namespace tr::cuda
