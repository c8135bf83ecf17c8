// Row kernels at memory speed (nn.cu launches them): cross-entropy over logits rows - the loss alone, the
// gradient alone, or both in one kernel that writes the gradient over the logits (llm.c's fused classifier)
// - and LayerNorm / RMSNorm with a warp per row. In a header of their own so that the CPU runs this very code
// (tests/cuda_emulator.h; tests/test_row_kernels_emulated.cpp against f64 references).
// Every kernel here is bound by HBM bandwidth: rows move as 16-byte packs, a row's last read is a streaming
// load (ld.global.cs: evict first, so the rows still to be read keep L2), and no value is read twice from
// memory that one kernel could keep in registers or L1.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#ifndef TR_ROW_EMULATED
#include "backend/cuda/common.cuh"  // acc_t, ld, st (the emulation brings its own)
#include "backend/unary_math.h"
#endif

// A kernel's dynamic shared memory (the emulation points it at a host buffer).
#ifndef TR_ROW_SMEM
#define TR_ROW_SMEM(name) extern __shared__ double name[]
#endif

// The kernels' namespace (the emulation's own, so its host copies never meet the device build's symbols).
#ifndef TR_ROW_NAMESPACE
#define TR_ROW_NAMESPACE rows
#endif

namespace tr::cuda::TR_ROW_NAMESPACE {

// V elements of T moved as one aligned vector access (16 bytes for the data's own type).
template <typename T, int V>
struct alignas(sizeof(T) * V) RowPack {
  T v[V];
};
template <typename T>
constexpr int kPack = static_cast<int>(16 / sizeof(T));

// The row's last read: a streaming load where the device has one.
template <typename P>
__device__ __forceinline__ P load_last(const P* p) {
#if defined(TR_ROW_EMULATED)
  return *p;
#else
  if constexpr (sizeof(P) == 16) {
    const uint4 u = __ldcs(reinterpret_cast<const uint4*>(p));
    return *reinterpret_cast<const P*>(&u);
  } else {
    return *p;
  }
#endif
}

template <typename A>
__device__ __forceinline__ A row_exp(A x) {
#if defined(TR_ROW_EMULATED)
  return std::exp(x);
#else
  return backend::exp_(x);
#endif
}

// a * b rounded on its own, never contracted into a following add (the CPU twin scales, then subtracts).
template <typename A>
__device__ __forceinline__ A mul_rn(A a, A b) {
#if defined(TR_ROW_EMULATED)
  return a * b;
#else
  if constexpr (sizeof(A) == 8)
    return __dmul_rn(a, b);
  else
    return __fmul_rn(a, b);
#endif
}

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- cross-entropy

// A running (max, sum of exp(x - max)) pair: the online softmax's state. An empty side (max -inf, sum 0)
// changes nothing; a NaN sum stays NaN through every merge (0 * NaN), and a +inf logit makes the sum NaN
// (inf - inf), so either gives a NaN loss as the two-pass kernel did.
template <typename A>
struct MaxSum {
  A m, s;
};
template <typename A>
__device__ __forceinline__ MaxSum<A> merge(MaxSum<A> a, MaxSum<A> b) {
  const A m = b.m > a.m ? b.m : a.m;
  if (m == -INFINITY) return {m, a.s + b.s};  // exp(-inf - -inf) would be NaN
  return {m, a.s * row_exp(a.m - m) + b.s * row_exp(b.m - m)};
}

// One pack of logits into the running pair: its own max first, then one rescale per pack.
template <typename A, int V>
__device__ __forceinline__ MaxSum<A> absorb(MaxSum<A> acc, const A (&x)[V]) {
  A m = x[0];
#pragma unroll
  for (int k = 1; k < V; ++k) m = (x[k] > m || x[k] != x[k]) ? x[k] : m;  // a NaN wins: the sum turns NaN
  A s = 0;
  if (m != -INFINITY) {  // a pack of -inf adds nothing
#pragma unroll
    for (int k = 0; k < V; ++k) s += row_exp(x[k] - m);  // NaN when any x is
  }
  return merge(acc, MaxSum<A>{m, s});
}

// The pair over a block (blockDim.x a multiple of 32, at most 1024): every thread gets it. `sh` holds 64
// doubles.
template <typename A>
__device__ __forceinline__ MaxSum<A> block_merge(MaxSum<A> v, double* sh) {
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum<A> u{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = merge(v, u);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sh[warp] = static_cast<double>(v.m), sh[32 + warp] = static_cast<double>(v.s);
  __syncthreads();
  MaxSum<A> t{static_cast<A>(sh[0]), static_cast<A>(sh[32])};
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
    t = merge(t, MaxSum<A>{static_cast<A>(sh[w]), static_cast<A>(sh[32 + w])});
  return t;
}

// A plain sum over a block (as block_merge): every thread gets it. Waits for readers of `sh` first.
template <typename A>
__device__ __forceinline__ A block_sum(A v, double* sh) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = static_cast<double>(v);
  __syncthreads();
  A t = static_cast<A>(sh[0]);
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) t += static_cast<A>(sh[w]);
  return t;
}

// What a cross-entropy launch computes: the loss (loss and lse written), the gradient (from lse, or from the
// loss pass in the same kernel), or both.
enum class CeMode { loss, grad, both };

template <typename T, typename G>
struct CeRows {
  const T* logits;
  int64_t ldx;  // row stride of the logits (v, or a padded buffer's)
  const int64_t* labels;
  acc_t<T>* loss;             // [rows]; 0 for ignored rows and bad labels
  acc_t<T>* lse;              // [rows]: written by loss/both, read by grad
  const acc_t<T>* grad_loss;  // [rows] (grad, both)
  G* glogits;                 // may be the logits themselves (G = T)
  int64_t ldg;
  int64_t v, ignore;
  int64_t* bad;      // a label out of range is flagged here (kernels.h BadIndexKind)
  bool packed;       // every logits row 16-byte aligned: packs, else one element at a time
  bool packed_grad;  // packed, and every gradient row on a pack boundary too: the gradient written in packs
  acc_t<T> smoothing = 0;  // torch's label_smoothing e: the target is (1 - e) * onehot + e / v
};

// Whether a launch may move rows as packs: every logits row (and gradient row, when g is given) starts on a
// pack boundary (the tail of each row, v % kPack elements, goes one at a time). The launcher decides the loss
// pass and the thread count from the logits alone, so the loss bits never depend on the gradient's layout.
template <typename T, typename G>
inline bool ce_packable(const T* x, int64_t ldx, const G* g, int64_t ldg) {
  constexpr int V = kPack<T>;
  const auto at = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return at(x, 16) && ldx % V == 0 && (!g || (at(g, sizeof(G) * V) && ldg % V == 0));
}

// One block per row. The loss pass reads the row once (online max and sum), the gradient pass once more
// with streaming loads, as close behind as L2 allows, and writes each element once: in `both` the row moves
// twice in and once out, where a loss kernel and a backward kernel move it three times in and once out.
template <CeMode kMode, typename T, typename G>
__global__ void __launch_bounds__(1024) cross_entropy_rows_kernel(const CeRows<T, G> a) {
  using A = acc_t<T>;
  constexpr int V = kPack<T>;
  using In = RowPack<T, V>;
  using Out = RowPack<G, V>;
  TR_ROW_SMEM(sh);
  const int64_t row = blockIdx.x;
  const T* x = a.logits + row * a.ldx;
  const int64_t label = a.labels[row];
  const bool bad = label != a.ignore && (label < 0 || label >= a.v);
  const bool skip = label == a.ignore || bad;
  const int64_t packs = a.packed ? a.v / V : 0, tail = packs * V;
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  A l = 0;  // the row's logsumexp
  if constexpr (kMode != CeMode::grad) {
    if (skip) {  // the whole block takes this branch
      if (tid == 0) {
        a.loss[row] = a.lse[row] = 0;
        if (bad) report_bad(a.bad, kBadLabel, label, a.v);
      }
    } else {
      // The label's logit, read before any thread of `both` can overwrite it.
      const A xl = ld(x, label);
      MaxSum<A> acc{-INFINITY, 0};
      A sx = 0;  // the row's sum, for label smoothing's mean
      for (int64_t j = tid; j < packs; j += threads) {
        const In p = reinterpret_cast<const In*>(x)[j];
        A e[V];
#pragma unroll
        for (int k = 0; k < V; ++k) e[k] = ld(p.v, k), sx += e[k];
        acc = absorb<A, V>(acc, e);
      }
      for (int64_t i = tail + tid; i < a.v; i += threads) {
        const A e[1] = {ld(x, i)};
        sx += e[0];
        acc = absorb<A, 1>(acc, e);
      }
      acc = block_merge(acc, sh);
      l = acc.m + std::log(acc.s);
      const A eps = a.smoothing;
      if (eps != A(0)) sx = block_sum(sx, sh);  // the whole block takes this branch
      if (tid == 0) {
        a.lse[row] = l;
        a.loss[row] = eps == A(0) ? l - xl : (A(1) - eps) * (l - xl) + eps * (l - sx / static_cast<A>(a.v));
      }
    }
  } else {
    l = skip ? A(0) : a.lse[row];
  }
  if constexpr (kMode != CeMode::loss) {
    G* g = a.glogits + row * a.ldg;
    const A gl = skip ? A(0) : a.grad_loss[row];
    // Label smoothing takes gl * e / v from every element and gl * (1 - e) at the label; e = 0 subtracts +0
    // and exactly gl: the plain gradient's bits.
    const A off = a.smoothing == A(0) ? A(0) : gl * a.smoothing / static_cast<A>(a.v);
    const A at = gl * (A(1) - a.smoothing);
    const int64_t gpacks = a.packed_grad ? packs : 0, gtail = gpacks * V;
    for (int64_t j = tid; j < gpacks; j += threads) {
      Out o;
      if (skip) {
#pragma unroll
        for (int k = 0; k < V; ++k) st(o.v, k, A(0));
      } else {
        const In p = load_last(reinterpret_cast<const In*>(x) + j);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A q = mul_rn(gl, row_exp(ld(p.v, k) - l)) - off;
          st(o.v, k, j * V + k == label ? q - at : q);
        }
      }
      reinterpret_cast<Out*>(g)[j] = o;
    }
    for (int64_t i = gtail + tid; i < a.v; i += threads) {
      const A q = skip ? A(0) : mul_rn(gl, row_exp(ld(x, i) - l)) - off;
      st(g, i, i == label ? q - at : q);
    }
  }
}

// ---- LayerNorm / RMSNorm, a warp per row

// The largest row a warp holds in registers: kNormMaxPacks packs of 16 bytes per lane.
constexpr int kNormMaxPacks = 16;
template <typename T>
constexpr int64_t norm_warp_max(int lanes = 32) {
  return static_cast<int64_t>(kNormMaxPacks) * lanes * kPack<T>;
}

// Packs per lane (a power of two) for rows of n elements of T, or 0 when the warp kernels do not take them
// (n not a whole number of packs, or longer than norm_warp_max).
template <typename T>
constexpr int norm_packs_for(int64_t n) {
  if (n <= 0 || n % kPack<T> != 0 || n > norm_warp_max<T>()) return 0;
  int p = 1;
  while (static_cast<int64_t>(p) * 32 * kPack<T> < n) p *= 2;
  return p;
}

// Calls f(std::integral_constant<int, P>{}) for the P norm_packs_for chose.
template <typename F>
void with_norm_packs(int packs, F&& f) {
  switch (packs) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return f(std::integral_constant<int, 16>{});
  }
}

template <typename T>
struct NormRows {
  const T* x;
  const T* w;    // null: no weight
  const T* b;    // null: no bias (RMSNorm never has one)
  const T* res;  // null: no fused residual; else x + res is normalized, and written to sum
  T* sum;
  T* y;
  acc_t<T>* mean;  // LayerNorm only
  acc_t<T>* rstd;
  int64_t rows;
  int n;  // a multiple of kPack<T>, at most norm_warp_max<T>()
  double eps;
};

// Forward: a warp per row, the row in registers (P packs per lane, kept as T), so the mean, the variance
// (two-pass, as the block kernel) and the output read memory once. RMSNorm rounds the normalized value to T
// before the weight, as HF does.
template <typename T, int P, bool kRms>
__global__ void __launch_bounds__(256) norm_rows_kernel(const NormRows<T> a) {
  using A = acc_t<T>;
  constexpr int V = kPack<T>;
  using Pk = RowPack<T, V>;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= a.rows) return;  // a whole warp: this kernel has no block barrier
  const int packs = a.n / V;
  const int64_t base = row * a.n;
  Pk v[P];  // the row (or its residual sum) as T: half the registers of f32 values for the halves
  A s = 0;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int j = lane + 32 * k;
    if (j >= packs) break;
    const int64_t at = base / V + j;
    v[k] = reinterpret_cast<const Pk*>(a.x)[at];
    if (a.res) {  // the sum rounded to T, as a separate add kernel rounds it
      const Pk r = reinterpret_cast<const Pk*>(a.res)[at];
#pragma unroll
      for (int e = 0; e < V; ++e) st(v[k].v, e, ld(v[k].v, e) + ld(r.v, e));
      reinterpret_cast<Pk*>(a.sum)[at] = v[k];
    }
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A x = ld(v[k].v, e);
      s += kRms ? x * x : x;
    }
  }
  const A n = static_cast<A>(a.n);
  A mu = 0, rs;
  if constexpr (kRms) {
    rs = A(1) / std::sqrt(warp_sum(s) / n + static_cast<A>(a.eps));
  } else {
    mu = warp_sum(s) / n;
    A q = 0;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      if (lane + 32 * k >= packs) break;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A d = ld(v[k].v, e) - mu;
        q += d * d;
      }
    }
    rs = A(1) / std::sqrt(warp_sum(q) / n + static_cast<A>(a.eps));
  }
  if (lane == 0) {
    if (!kRms) a.mean[row] = mu;
    a.rstd[row] = rs;
  }
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int j = lane + 32 * k;
    if (j >= packs) break;
    Pk w{}, b{}, o;
    if (a.w) w = reinterpret_cast<const Pk*>(a.w)[j];
    if (a.b) b = reinterpret_cast<const Pk*>(a.b)[j];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      A h;
      if constexpr (kRms) {
        T hr;
        st(&hr, 0, ld(v[k].v, e) * rs);
        h = ld(&hr, 0);
      } else {
        h = (ld(v[k].v, e) - mu) * rs;
      }
      if (a.w) h *= ld(w.v, e);
      if (a.b) h += ld(b.v, e);
      st(o.v, e, h);
    }
    reinterpret_cast<Pk*>(a.y)[base / V + j] = o;
  }
}

template <typename T>
struct NormGradRows {
  const T* x;
  const T* w;            // null: no weight
  const acc_t<T>* mean;  // LayerNorm only
  const acc_t<T>* rstd;
  const T* gy;
  const T* gadd;  // null, or added to gx before rounding
  T* gx;
  int64_t rows;
  int n;
};

// The input gradient: a warp per row. Pass 1 reads x, gy and w for the two row sums, pass 2 reads them
// again - from L1, where the warp's own pass 1 left them: a row of up to 8 KB per warp - and writes gx.
// LayerNorm: gx = rstd (gy w - mean(gy w) - xhat mean(gy w xhat)); RMSNorm drops the first mean.
template <typename T, bool kRms>
__global__ void __launch_bounds__(256) norm_grad_rows_kernel(const NormGradRows<T> a) {
  using A = acc_t<T>;
  constexpr int V = kPack<T>;
  using Pk = RowPack<T, V>;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= a.rows) return;
  const int packs = a.n / V;
  const int64_t base = row * a.n / V;
  const A mu = kRms ? A(0) : a.mean[row], rs = a.rstd[row];
  auto load = [&](int j, A(&xh)[V], A(&gh)[V], bool last) {
    const Pk px = last ? load_last(reinterpret_cast<const Pk*>(a.x) + base + j)
                       : reinterpret_cast<const Pk*>(a.x)[base + j];
    const Pk pg = last ? load_last(reinterpret_cast<const Pk*>(a.gy) + base + j)
                       : reinterpret_cast<const Pk*>(a.gy)[base + j];
    Pk pw{};
    if (a.w) pw = reinterpret_cast<const Pk*>(a.w)[j];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      xh[e] = (ld(px.v, e) - mu) * rs;
      gh[e] = a.w ? ld(pg.v, e) * ld(pw.v, e) : ld(pg.v, e);
    }
  };
  A sg = 0, sgx = 0;
  for (int j = lane; j < packs; j += 32) {
    A xh[V], gh[V];
    load(j, xh, gh, false);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      if (!kRms) sg += gh[e];
      sgx += gh[e] * xh[e];
    }
  }
  const A n = static_cast<A>(a.n);
  const A mg = kRms ? A(0) : warp_sum(sg) / n, mgx = warp_sum(sgx) / n;
  for (int j = lane; j < packs; j += 32) {
    A xh[V], gh[V];
    load(j, xh, gh, true);
    Pk add{}, o;
    if (a.gadd) add = reinterpret_cast<const Pk*>(a.gadd)[base + j];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A g = rs * (gh[e] - mg - xh[e] * mgx);
      st(o.v, e, a.gadd ? g + ld(add.v, e) : g);
    }
    reinterpret_cast<Pk*>(a.gx)[base + j] = o;
  }
}

}  // namespace tr::cuda::TR_ROW_NAMESPACE
