// CUDA LayerNorm / RMSNorm (forward, backward), cross-entropy, embedding gather and deterministic scatter-add
// (grouped by a device radix sort: no host round trip), rotary embedding. The norms' rows up to 16 packs a
// lane and every cross-entropy row go to row_kernels.cuh (a warp per norm row, the row in registers; the
// loss, the gradient or both in one pass pair); wider or unaligned norm rows and f64 take the block-per-row
// kernels here. Weight/bias gradients are reduced by one thread per column walking the rows in order:
// deterministic.
#include <algorithm>
#include <cmath>

#include <cub/cub.cuh>

#include "backend/cuda/common.cuh"
#include "backend/cuda/reduce_kernels.cuh"
#include "backend/cuda/row_kernels.cuh"
#include "backend/unary_math.h"

namespace tr::cuda {

namespace {

// Element i of the norm's input: x[i], or with a residual sum[i] = x[i] + res[i] rounded to T (as a separate
// add kernel rounds it), written here and returned.
template <typename T>
__device__ __forceinline__ const T* residual_sum(const T* x, const T* res, T* sum, int64_t i) {
  if (!res) return x + i;
  st(sum, i, ld(x, i) + ld(res, i));
  return sum + i;
}

template <typename T>
__global__ void layer_norm_kernel(const T* x, const T* w, const T* b, T* y, acc_t<T>* mean, acc_t<T>* rstd,
                                  int64_t n, double eps, const T* res, T* sum) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const int64_t base = blockIdx.x * n;
  A s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += ld(residual_sum(x, res, sum, base + i), 0);
  if (res) x = sum;  // each thread re-reads only the elements it wrote
  const A mu = block_sum(s, sh) / static_cast<A>(n);
  A v = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A d = ld(x, base + i) - mu;
    v += d * d;
  }
  const A rs = A(1) / std::sqrt(block_sum(v, sh) / static_cast<A>(n) + static_cast<A>(eps));
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = mu;
    rstd[blockIdx.x] = rs;
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A h = (ld(x, base + i) - mu) * rs;
    if (w) h *= ld(w, i);
    if (b) h += ld(b, i);
    st(y, base + i, h);
  }
}

template <typename T>
__global__ void layer_norm_backward_kernel(const T* x, const T* w, const acc_t<T>* mean, const acc_t<T>* rstd,
                                           const T* gy, T* gx, int64_t n, const T* gadd) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const int64_t base = blockIdx.x * n;
  const A mu = mean[blockIdx.x], rs = rstd[blockIdx.x];
  A sg = 0, sgx = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A xh = (ld(x, base + i) - mu) * rs;
    A gh = w ? ld(gy, base + i) * ld(w, i) : ld(gy, base + i);
    sg += gh;
    sgx += gh * xh;
  }
  const A mg = block_sum(sg, sh) / static_cast<A>(n);
  const A mgx = block_sum(sgx, sh) / static_cast<A>(n);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A xh = (ld(x, base + i) - mu) * rs;
    A gh = w ? ld(gy, base + i) * ld(w, i) : ld(gy, base + i);
    const A v = rs * (gh - mg - xh * mgx);
    st(gx, base + i, gadd ? v + ld(gadd, base + i) : v);
  }
}

template <typename T>
void norm_param_grads(Stream stream, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd, const T* gy,
                      T* gw, T* gb, int64_t rows, int64_t n, Scratch& scratch) {
  if (n == 0) return;
  constexpr int V = static_cast<int>(16 / sizeof(T));
  const bool packs = n % V == 0 && aligned_to(x, 16) && aligned_to(gy, 16);
  const int64_t chunks = red::pass1_chunks(n, rows, n, V), chunk = (rows + chunks - 1) / chunks;
  auto* partial = static_cast<double*>(scratch.take(sizeof(double) * 2 * n * chunks));
  if (packs)
    red::norm_param_packs_partial_kernel<T, V><<<blocks_for(n / V * chunks, 128), 128, 0, stream>>>(
        x, mean, rstd, gy, partial, rows, n, chunk, chunks);
  else
    red::norm_param_partial_kernel<T>
        <<<blocks_for(n * chunks), 256, 0, stream>>>(x, mean, rstd, gy, partial, rows, n, chunk, chunks);
  red::norm_param_combine_kernel<T><<<blocks_for(n, 128), 128, 0, stream>>>(partial, gw, gb, n, chunks);
}

template <typename T>
__global__ void rms_norm_kernel(const T* x, const T* w, T* y, acc_t<T>* rstd, int64_t n, double eps,
                                const T* res, T* sum) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const int64_t base = blockIdx.x * n;
  A ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A v = ld(residual_sum(x, res, sum, base + i), 0);
    ss += v * v;
  }
  if (res) x = sum;
  const A rs = A(1) / std::sqrt(block_sum(ss, sh) / static_cast<A>(n) + static_cast<A>(eps));
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    // As HF: normalize in fp32, round to the input dtype, then scale by the weight.
    T hr;
    st(&hr, 0, ld(x, base + i) * rs);
    A h = ld(&hr, 0);
    st(y, base + i, w ? h * ld(w, i) : h);
  }
}

template <typename T>
__global__ void rms_norm_backward_kernel(const T* x, const T* w, const acc_t<T>* rstd, const T* gy, T* gx,
                                         int64_t n, const T* gadd) {
  using A = acc_t<T>;
  __shared__ A sh[32];
  const int64_t base = blockIdx.x * n;
  const A rs = rstd[blockIdx.x];
  A sgx = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A gh = w ? ld(gy, base + i) * ld(w, i) : ld(gy, base + i);
    sgx += gh * ld(x, base + i) * rs;
  }
  const A mgx = block_sum(sgx, sh) / static_cast<A>(n);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A gh = w ? ld(gy, base + i) * ld(w, i) : ld(gy, base + i);
    const A v = rs * (gh - ld(x, base + i) * rs * mgx);
    st(gx, base + i, gadd ? v + ld(gadd, base + i) : v);
  }
}

template <typename T>
__global__ void embedding_kernel(const T* w, const int64_t* ids, T* out, int64_t n, int64_t v, int64_t d,
                                 int64_t* bad) {
  const int64_t total = n * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t r = i / d, j = i % d, id = ids[r];
    if (id < 0 || id >= v) {
      if (j == 0) report_bad(bad, kBadEmbeddingIndex, id, v);
      st(out, i, acc_t<T>(0));
      continue;
    }
    out[i] = w[id * d + j];
  }
}

// The sort keys: the id, or v for an id outside [0, v) (one run the sum skips), and each row's own number.
__global__ void embedding_keys_kernel(const int64_t* ids, int64_t n, int64_t v, int64_t* keys,
                                      int64_t* rows) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t id = ids[i];
    keys[i] = id >= 0 && id < v ? id : v;
    rows[i] = i;
  }
}

// One block row per run of one id (the run count is on the device: blocks past it return), summing the id's
// rows in row order (the sort is stable), so the result does not depend on scheduling. Bound by reading gy.
template <typename T>
__global__ void embedding_backward_kernel(const T* gy, const int64_t* order, const int64_t* starts,
                                          const int64_t* uid, const int64_t* n_runs, T* gw, int64_t v,
                                          int64_t d) {
  const int64_t runs = *n_runs;
  for (int64_t u = blockIdx.y; u < runs; u += gridDim.y) {
    if (uid[u] >= v) continue;  // the out-of-range ids' run
    const int64_t end = starts[u + 1];
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < d;
         j += static_cast<int64_t>(blockDim.x) * gridDim.x) {
      acc_t<T> s = 0;
      for (int64_t k = starts[u]; k < end; ++k) s += ld(gy, order[k] * d + j);
      st(gw, uid[u] * d + j, s);
    }
  }
}

// starts[runs] = n: the end of the last run (the scan covers n counts, so with fewer runs it is there
// already; with n runs it is not).
__global__ void embedding_runs_end_kernel(int64_t* starts, const int64_t* n_runs, int64_t n) {
  starts[*n_runs] = n;
}

// The bits the sort needs: enough for the keys 0..v.
int sort_bits(int64_t v) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= v) ++bits;
  return bits;
}

// CUB's temporary storage for the three passes below (the largest of their needs).
size_t cub_temp_bytes(int64_t n, int64_t v) {
  size_t sort = 0, rle = 0, scan = 0;
  const int ni = static_cast<int>(n);
  TR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), ni, 0, sort_bits(v)));
  TR_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(
      nullptr, rle, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<int64_t*>(nullptr), static_cast<int64_t*>(nullptr), ni));
  TR_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const int64_t*>(nullptr),
                                              static_cast<int64_t*>(nullptr), ni));
  return std::max({sort, rle, scan});
}

template <typename T>
__global__ void rope_kernel(const T* x, const float* cs, const float* sn, const int64_t* pos, T* y, int64_t B,
                            int64_t H, int64_t Tn, int64_t D, bool seq_major, float sign, int64_t P,
                            int64_t* bad) {
  using A = acc_t<T>;
  const int64_t half = D / 2, total = B * H * Tn * half;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t i = e % half;
    int64_t rest = e / half;
    int64_t b, h, t;
    if (seq_major) {  // [B, T, H, D]
      h = rest % H;
      rest /= H;
      t = rest % Tn;
      b = rest / Tn;
    } else {  // [B, H, T, D]
      t = rest % Tn;
      rest /= Tn;
      h = rest % H;
      b = rest / H;
    }
    const int64_t base = seq_major ? ((b * Tn + t) * H + h) * D : ((b * H + h) * Tn + t) * D;
    const int64_t p = pos[b * Tn + t];
    if (p < 0 || p >= P) {  // never read the tables out of range; the backend reports it at its next sync
      if (i == 0) report_bad(bad, kBadRopePosition, p, P);
      st(y, base + i, A(0));
      st(y, base + i + half, A(0));
      continue;
    }
    const A c = static_cast<A>(cs[p * half + i]), s = static_cast<A>(sign * sn[p * half + i]);
    const A x1 = ld(x, base + i), x2 = ld(x, base + i + half);
    st(y, base + i, x1 * c - x2 * s);
    st(y, base + i + half, x2 * c + x1 * s);
  }
}

int threads_for_row(int64_t n) { return n >= 1024 ? 1024 : n >= 256 ? 256 : 64; }

}  // namespace

namespace {

// The warp-per-row kernels take halves and f32 rows of whole packs up to rows::norm_warp_max, every pointer
// 16-byte aligned; anything else (f64, odd widths, Llama-8B's f32 rows) takes the block-per-row kernels.
bool all_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p && !aligned_to(p, 16)) return false;
  return true;
}
template <typename T>
int warp_norm_packs(int64_t n, std::initializer_list<const void*> ptrs) {
  return all_aligned(ptrs) ? rows::norm_packs_for<T>(n) : 0;
}
constexpr int kNormWarps = 8;  // rows per block of the warp kernels
unsigned norm_blocks(int64_t rows) { return static_cast<unsigned>((rows + kNormWarps - 1) / kNormWarps); }

template <typename T, bool kRms>
bool norm_rows(Stream stream, const rows::NormRows<T>& a) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    const int packs = warp_norm_packs<T>(a.n, {a.x, a.w, a.b, a.res, a.sum, a.y});
    if (packs == 0 || a.rows == 0) return packs != 0;
    rows::with_norm_packs(packs, [&](auto p) {
      rows::norm_rows_kernel<T, decltype(p)::value, kRms>
          <<<norm_blocks(a.rows), 32 * kNormWarps, 0, stream>>>(a);
    });
    return true;
  }
}

template <typename T, bool kRms>
bool norm_grad_rows(Stream stream, const rows::NormGradRows<T>& a) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    if (warp_norm_packs<T>(a.n, {a.x, a.w, a.gy, a.gadd, a.gx}) == 0) return false;
    if (a.rows > 0)
      rows::norm_grad_rows_kernel<T, kRms><<<norm_blocks(a.rows), 32 * kNormWarps, 0, stream>>>(a);
    return true;
  }
}

}  // namespace

void layer_norm(Stream stream, DType dt, const void* x, const void* w, const void* b, void* y, void* mean,
                void* rstd, int64_t rows, int64_t n, double eps, const void* res, void* sum) {
  dispatch_float(dt, [&]<typename T>() {
    using A = acc_t<T>;
    const rows::NormRows<T> a{static_cast<const T*>(x),
                              static_cast<const T*>(w),
                              static_cast<const T*>(b),
                              static_cast<const T*>(res),
                              static_cast<T*>(sum),
                              static_cast<T*>(y),
                              static_cast<A*>(mean),
                              static_cast<A*>(rstd),
                              rows,
                              static_cast<int>(n),
                              eps};
    if (n > INT32_MAX || !norm_rows<T, false>(stream, a))
      layer_norm_kernel<T><<<static_cast<unsigned>(rows), threads_for_row(n), 0, stream>>>(
          a.x, a.w, a.b, a.y, a.mean, a.rstd, n, eps, a.res, a.sum);
  });
  TR_CUDA_LAUNCH_CHECK("layer_norm");
}

void layer_norm_backward(Stream stream, DType dt, const void* x, const void* w, const void* mean,
                         const void* rstd, const void* gy, void* gx, void* gw, void* gb, int64_t rows,
                         int64_t n, const void* gadd, Scratch& scratch) {
  dispatch_float(dt, [&]<typename T>() {
    using A = acc_t<T>;
    const rows::NormGradRows<T> a{static_cast<const T*>(x),    static_cast<const T*>(w),
                                  static_cast<const A*>(mean), static_cast<const A*>(rstd),
                                  static_cast<const T*>(gy),   static_cast<const T*>(gadd),
                                  static_cast<T*>(gx),         rows,
                                  static_cast<int>(n)};
    if (gx && (n > INT32_MAX || !norm_grad_rows<T, false>(stream, a)))
      layer_norm_backward_kernel<T><<<static_cast<unsigned>(rows), threads_for_row(n), 0, stream>>>(
          a.x, a.w, a.mean, a.rstd, a.gy, a.gx, n, a.gadd);
    if (gw || gb)
      norm_param_grads<T>(stream, a.x, a.mean, a.rstd, a.gy, static_cast<T*>(gw), static_cast<T*>(gb), rows,
                          n, scratch);
  });
  TR_CUDA_LAUNCH_CHECK("layer_norm_backward");
}

void rms_norm(Stream stream, DType dt, const void* x, const void* w, void* y, void* rstd, int64_t rows,
              int64_t n, double eps, const void* res, void* sum) {
  dispatch_float(dt, [&]<typename T>() {
    using A = acc_t<T>;
    const rows::NormRows<T> a{static_cast<const T*>(x),
                              static_cast<const T*>(w),
                              nullptr,
                              static_cast<const T*>(res),
                              static_cast<T*>(sum),
                              static_cast<T*>(y),
                              nullptr,
                              static_cast<A*>(rstd),
                              rows,
                              static_cast<int>(n),
                              eps};
    if (n > INT32_MAX || !norm_rows<T, true>(stream, a))
      rms_norm_kernel<T><<<static_cast<unsigned>(rows), threads_for_row(n), 0, stream>>>(
          a.x, a.w, a.y, a.rstd, n, eps, a.res, a.sum);
  });
  TR_CUDA_LAUNCH_CHECK("rms_norm");
}

void rms_norm_backward(Stream stream, DType dt, const void* x, const void* w, const void* rstd,
                       const void* gy, void* gx, void* gw, int64_t rows, int64_t n, const void* gadd,
                       Scratch& scratch) {
  dispatch_float(dt, [&]<typename T>() {
    using A = acc_t<T>;
    const rows::NormGradRows<T> a{static_cast<const T*>(x),
                                  static_cast<const T*>(w),
                                  nullptr,
                                  static_cast<const A*>(rstd),
                                  static_cast<const T*>(gy),
                                  static_cast<const T*>(gadd),
                                  static_cast<T*>(gx),
                                  rows,
                                  static_cast<int>(n)};
    if (gx && (n > INT32_MAX || !norm_grad_rows<T, true>(stream, a)))
      rms_norm_backward_kernel<T><<<static_cast<unsigned>(rows), threads_for_row(n), 0, stream>>>(
          a.x, a.w, a.rstd, a.gy, a.gx, n, a.gadd);
    if (gw)
      norm_param_grads<T>(stream, a.x, nullptr, a.rstd, a.gy, static_cast<T*>(gw), nullptr, rows, n, scratch);
  });
  TR_CUDA_LAUNCH_CHECK("rms_norm_backward");
}

namespace {

// Threads per cross-entropy row: a pack (or element) or four each up to 1024, at least two warps.
int ce_threads(int64_t per_row) {
  int t = 64;
  while (t < 1024 && t * 4 < per_row) t *= 2;
  return t;
}

template <rows::CeMode kMode, typename T, typename G>
void launch_ce(Stream stream, rows::CeRows<T, G> a, int64_t rows) {
  a.packed = rows::ce_packable<T, G>(a.logits, a.ldx, nullptr, 0);
  a.packed_grad = a.packed && a.glogits && rows::ce_packable(a.logits, a.ldx, a.glogits, a.ldg);
  const int threads = ce_threads(a.packed ? a.v / rows::kPack<T> : a.v);
  rows::cross_entropy_rows_kernel<kMode, T, G>
      <<<static_cast<unsigned>(rows), threads, 64 * sizeof(double), stream>>>(a);
}

// Runs f.template operator()<T, G>() for logits of dt and a gradient of gdt: the same type, or a half
// gradient of f32 logits (checked by the backend).
template <typename F>
void dispatch_ce(DType dt, DType gdt, F&& f) {
  if (gdt != dt && gdt == DType::bf16) return f.template operator()<float, __nv_bfloat16>();
  if (gdt != dt) return f.template operator()<float, __half>();
  dispatch_float(dt, [&]<typename T>() { f.template operator()<T, T>(); });
}

}  // namespace

void cross_entropy(Stream stream, DType dt, const void* logits, int64_t ldx, const int64_t* labels,
                   void* loss, void* lse, int64_t rows, int64_t v, int64_t ignore_index, double smoothing,
                   int64_t* bad) {
  if (rows == 0) return;
  dispatch_float(dt, [&]<typename T>() {
    using A = acc_t<T>;
    launch_ce<rows::CeMode::loss, T, T>(
        stream,
        {static_cast<const T*>(logits), ldx, labels, static_cast<A*>(loss), static_cast<A*>(lse), nullptr,
         nullptr, 0, v, ignore_index, bad, false, false, static_cast<A>(smoothing)},
        rows);
  });
  TR_CUDA_LAUNCH_CHECK("cross_entropy");
}

void cross_entropy_backward(Stream stream, DType dt, const void* logits, int64_t ldx, const int64_t* labels,
                            const void* lse, const void* grad_loss, void* glogits, DType gdt, int64_t ldg,
                            int64_t rows, int64_t v, int64_t ignore_index, double smoothing) {
  if (rows == 0) return;
  dispatch_ce(dt, gdt, [&]<typename T, typename G>() {
    using A = acc_t<T>;
    launch_ce<rows::CeMode::grad, T, G>(
        stream,
        {static_cast<const T*>(logits), ldx, labels, nullptr, const_cast<A*>(static_cast<const A*>(lse)),
         static_cast<const A*>(grad_loss), static_cast<G*>(glogits), ldg, v, ignore_index, nullptr, false,
         false, static_cast<A>(smoothing)},
        rows);
  });
  TR_CUDA_LAUNCH_CHECK("cross_entropy_backward");
}

void cross_entropy_with_grad(Stream stream, DType dt, const void* logits, int64_t ldx, const int64_t* labels,
                             void* loss, void* lse, const void* grad_loss, void* glogits, DType gdt,
                             int64_t ldg, int64_t rows, int64_t v, int64_t ignore_index, double smoothing,
                             int64_t* bad) {
  if (rows == 0) return;
  dispatch_ce(dt, gdt, [&]<typename T, typename G>() {
    using A = acc_t<T>;
    launch_ce<rows::CeMode::both, T, G>(
        stream,
        {static_cast<const T*>(logits), ldx, labels, static_cast<A*>(loss), static_cast<A*>(lse),
         static_cast<const A*>(grad_loss), static_cast<G*>(glogits), ldg, v, ignore_index, bad, false, false,
         static_cast<A>(smoothing)},
        rows);
  });
  TR_CUDA_LAUNCH_CHECK("cross_entropy_with_grad");
}

void embedding(Stream stream, DType dt, const void* weight, const int64_t* ids, void* out, int64_t n,
               int64_t v, int64_t d, int64_t* bad) {
  dispatch_float(dt, [&]<typename T>() {
    embedding_kernel<T><<<blocks_for(n * d), 256, 0, stream>>>(static_cast<const T*>(weight), ids,
                                                               static_cast<T*>(out), n, v, d, bad);
  });
  TR_CUDA_LAUNCH_CHECK("embedding");
}

void embedding_backward(Stream stream, DType dt, const void* gy, const int64_t* ids, int64_t n, void* gw,
                        int64_t v, int64_t d, Scratch& scratch) {
  fill(stream, gw, dt, v * d, 0.0);
  if (n == 0) return;
  struct {
    int64_t *keys, *rows, *sorted_keys, *order, *uid, *counts, *starts, *n_runs;
    void* temp;
    size_t temp_bytes;
  } s;
  const size_t items = static_cast<size_t>(n);
  auto take = [&](size_t count) { return static_cast<int64_t*>(scratch.take(count * sizeof(int64_t))); };
  s.keys = take(items), s.rows = take(items), s.sorted_keys = take(items), s.order = take(items);
  s.uid = take(items), s.counts = take(items), s.starts = take(items + 1), s.n_runs = take(1);
  s.temp_bytes = cub_temp_bytes(n, v);
  s.temp = scratch.take(s.temp_bytes);
  const int ni = static_cast<int>(n);
  embedding_keys_kernel<<<blocks_for(n), 256, 0, stream>>>(ids, n, v, s.keys, s.rows);
  TR_CUDA_LAUNCH_CHECK("embedding_backward keys");
  // LSD radix sort: stable, so one id's rows stay in row order (the order the host sort gave before).
  TR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.temp, s.temp_bytes, s.keys, s.sorted_keys, s.rows, s.order,
                                                ni, 0, sort_bits(v), stream));
  // Counts past the last run stay 0, so the scan below adds nothing undefined.
  TR_CUDA_CHECK(cudaMemsetAsync(s.counts, 0, static_cast<size_t>(n) * sizeof(int64_t), stream));
  TR_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(s.temp, s.temp_bytes, s.sorted_keys, s.uid, s.counts,
                                                   s.n_runs, ni, stream));
  TR_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(s.temp, s.temp_bytes, s.counts, s.starts, ni, stream));
  embedding_runs_end_kernel<<<1, 1, 0, stream>>>(s.starts, s.n_runs, n);
  TR_CUDA_LAUNCH_CHECK("embedding_backward runs");
  dispatch_float(dt, [&]<typename T>() {
    // The run count is on the device: a grid for n runs (at most 65535 block rows, strided), the rest exit.
    dim3 grid(static_cast<unsigned>((d + 127) / 128), static_cast<unsigned>(std::min<int64_t>(n, 65535)));
    embedding_backward_kernel<T><<<grid, 128, 0, stream>>>(static_cast<const T*>(gy), s.order, s.starts,
                                                           s.uid, s.n_runs, static_cast<T*>(gw), v, d);
  });
  TR_CUDA_LAUNCH_CHECK("embedding_backward");
}

void rope(Stream stream, DType dt, const void* x, const float* cos, const float* sin, const int64_t* pos,
          void* y, int64_t B, int64_t H, int64_t T, int64_t D, bool seq_major, bool inverse, int64_t P,
          int64_t* bad) {
  dispatch_float(dt, [&]<typename TT>() {
    rope_kernel<TT><<<blocks_for(B * H * T * (D / 2)), 256, 0, stream>>>(
        static_cast<const TT*>(x), cos, sin, pos, static_cast<TT*>(y), B, H, T, D, seq_major,
        inverse ? -1.0f : 1.0f, P, bad);
  });
  TR_CUDA_LAUNCH_CHECK("rope");
}

}  // namespace tr::cuda
