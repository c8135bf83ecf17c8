// The multi-tensor optimizer kernels: gradient statistics (global norm and inf check in one pass), the
// gradient transform (unscale + clip), and fused AdamW that reads half gradients through the transform and
// writes the half weight copy in the same pass; bitsandbytes' blockwise 8-bit AdamW. The element math is
// backend/optim_math.h's (compiled with
// --fmad=false so only its explicit fmas fuse, as on the CPU).
#include "backend/cuda/common.cuh"
#include "backend/cuda/optim_kernels.cuh"
#include "backend/cuda/kernels.h"
#include "backend/adamw8bit_math.h"
#include "backend/optim_math.h"

namespace tr::cuda {

namespace {

using namespace opt;  // the kernels (optim_kernels.cuh)

constexpr int kThreads = 512;

// Copies a host array into scratch in stream order (pageable: the copy is staged before it returns, so the
// caller's array may go away).
template <typename C>
C* upload(Stream stream, const C* host, int64_t count, Scratch& scratch) {
  C* d = static_cast<C*>(scratch.take(sizeof(C) * count));
  TR_CUDA_CHECK(cudaMemcpyAsync(d, host, sizeof(C) * count, cudaMemcpyHostToDevice, stream));
  return d;
}

template <typename T>
void launch_adamw(Stream stream, const AdamWChunk* chunks, int64_t count, double lr, double wd, double b1,
                  double b2, double eps, int64_t step, double inv_scale, double max_norm, const double* stats,
                  Scratch& scratch) {
  AdamWChunk* d = upload(stream, chunks, count, scratch);
  const backend::AdamWScalars<T> sd(lr, wd, b1, b2, eps, step), sp(lr, 0.0, b1, b2, eps, step);
  fused_adamw_kernel<T>
      <<<static_cast<unsigned>(count), kThreads, 0, stream>>>(d, sd, sp, inv_scale, max_norm, stats);
  TR_CUDA_LAUNCH_CHECK("fused_adamw");
}

}  // namespace

void sgd(Stream stream, DType dt, void* p, const void* g, void* buf, int64_t n, double lr,
         double weight_decay, double momentum, double dampening, bool nesterov, bool first) {
  if (n == 0) return;
  if (dt == DType::f32) {
    sgd_kernel<float><<<blocks_for(n), 256, 0, stream>>>(
        static_cast<float*>(p), static_cast<const float*>(g), static_cast<float*>(buf), n,
        backend::SgdScalars<float>(lr, weight_decay, momentum, dampening, nesterov, first));
  } else {
    sgd_kernel<double><<<blocks_for(n), 256, 0, stream>>>(
        static_cast<double*>(p), static_cast<const double*>(g), static_cast<double*>(buf), n,
        backend::SgdScalars<double>(lr, weight_decay, momentum, dampening, nesterov, first));
  }
  TR_CUDA_LAUNCH_CHECK("sgd");
}

void adamw_8bit_blockwise(Stream stream, float* p, const float* g, uint8_t* c1, uint8_t* c2, float* absmax1,
                          float* absmax2, int64_t n, const backend::Adam8bitConsts& k, const float* qs,
                          const float* qu) {
  if (n == 0) return;
  const int64_t blocks = (n + backend::kAdam8bitBlock - 1) / backend::kAdam8bitBlock;
  static_assert(backend::kAdam8bitBlock == 256, "one thread per element of a quantization block");
  adamw_8bit_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, g, c1, c2, absmax1, absmax2, n, k,
                                                                       qs, qu);
  TR_CUDA_LAUNCH_CHECK("adamw_8bit");
}

void adamw_32bit_state(Stream stream, float* p, const float* g, float* s1, float* s2, int64_t n,
                       const backend::Adam8bitConsts& k) {
  if (n == 0) return;
  adamw_32bit_kernel<<<blocks_for(n), 256, 0, stream>>>(p, g, s1, s2, n, k);
  TR_CUDA_LAUNCH_CHECK("adamw_32bit");
}

void grad_stats(Stream stream, const GradChunk* chunks, int64_t count, double inv_scale, double* stats,
                Scratch& scratch) {
  if (count == 0) return;  // nothing to add
  GradChunk* d = upload(stream, chunks, count, scratch);
  auto* partial = static_cast<double*>(scratch.take(2 * sizeof(double) * count));
  grad_stats_chunks<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(d, inv_scale, partial);
  TR_CUDA_LAUNCH_CHECK("grad_stats_chunks");
  grad_stats_total<<<1, 1024, 0, stream>>>(partial, count, stats);
  TR_CUDA_LAUNCH_CHECK("grad_stats_total");
}

void transform_grads(Stream stream, const GradChunk* chunks, int64_t count, double inv_scale, double max_norm,
                     const double* stats, Scratch& scratch) {
  if (count == 0) return;
  GradChunk* d = upload(stream, chunks, count, scratch);
  // One dtype of destination per call keeps the kernel simple: the backend groups them.
  if (chunks[0].dst_dtype == DType::f64)
    transform_kernel<double>
        <<<static_cast<unsigned>(count), kThreads, 0, stream>>>(d, inv_scale, max_norm, stats);
  else
    transform_kernel<float>
        <<<static_cast<unsigned>(count), kThreads, 0, stream>>>(d, inv_scale, max_norm, stats);
  TR_CUDA_LAUNCH_CHECK("transform_grads");
}

void fused_adamw(Stream stream, DType dt, const AdamWChunk* chunks, int64_t count, double lr,
                 double weight_decay, double beta1, double beta2, double eps, int64_t step, double inv_scale,
                 double max_norm, const double* stats, Scratch& scratch) {
  if (count == 0) return;
  if (dt == DType::f32)
    launch_adamw<float>(stream, chunks, count, lr, weight_decay, beta1, beta2, eps, step, inv_scale, max_norm,
                        stats, scratch);
  else
    launch_adamw<double>(stream, chunks, count, lr, weight_decay, beta1, beta2, eps, step, inv_scale,
                         max_norm, stats, scratch);
}

}  // namespace tr::cuda
