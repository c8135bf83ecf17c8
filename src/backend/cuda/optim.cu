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

namespace {

template <typename T>
void launch_elementwise(Stream stream, const backend::ElementwiseHyper& h, double weight_decay, T* p,
                        const T* g, T* s1, T* s2, int64_t n) {
  using backend::ElementwiseRule;
  const backend::ElementwiseScalars<T> c(h, weight_decay);
  const unsigned blocks = blocks_for(n);
  switch (h.rule) {
    case ElementwiseRule::adagrad:
      elementwise_kernel<ElementwiseRule::adagrad, T><<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
    case ElementwiseRule::rmsprop:
      elementwise_kernel<ElementwiseRule::rmsprop, T><<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
    case ElementwiseRule::lion:
      elementwise_kernel<ElementwiseRule::lion, T><<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
    case ElementwiseRule::rmsprop_bnb:
      elementwise_kernel<ElementwiseRule::rmsprop_bnb, T><<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
    case ElementwiseRule::schedule_free_adam:
      elementwise_kernel<ElementwiseRule::schedule_free_adam, T>
          <<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
    case ElementwiseRule::schedule_free_sgd:
      elementwise_kernel<ElementwiseRule::schedule_free_sgd, T>
          <<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
    case ElementwiseRule::stable_adamw_moments:
      elementwise_kernel<ElementwiseRule::stable_adamw_moments, T>
          <<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
    case ElementwiseRule::stable_adamw_param:
      elementwise_kernel<ElementwiseRule::stable_adamw_param, T>
          <<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
    case ElementwiseRule::galore_adamw:
      elementwise_kernel<ElementwiseRule::galore_adamw, T><<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
    case ElementwiseRule::grok_ema:
      elementwise_kernel<ElementwiseRule::grok_ema, T><<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
    case ElementwiseRule::grokadamw:
      elementwise_kernel<ElementwiseRule::grokadamw, T><<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
    case ElementwiseRule::schedule_free_lerp:
      elementwise_kernel<ElementwiseRule::schedule_free_lerp, T>
          <<<blocks, 256, 0, stream>>>(p, g, s1, s2, n, c);
      break;
  }
}

}  // namespace

void elementwise_step(Stream stream, DType dt, const backend::ElementwiseHyper& h, double weight_decay,
                      void* p, const void* g, void* s1, void* s2, int64_t n) {
  if (n == 0) return;
  if (dt == DType::f32)
    launch_elementwise<float>(stream, h, weight_decay, static_cast<float*>(p), static_cast<const float*>(g),
                              static_cast<float*>(s1), static_cast<float*>(s2), n);
  else
    launch_elementwise<double>(stream, h, weight_decay, static_cast<double*>(p),
                               static_cast<const double*>(g), static_cast<double*>(s1),
                               static_cast<double*>(s2), n);
  TR_CUDA_LAUNCH_CHECK("elementwise_step");
}

void elementwise_8bit(Stream stream, const backend::ElementwiseHyper& h, double weight_decay, float* p,
                      const float* g, uint8_t* c1, float* absmax1, int64_t n, const float* qs) {
  if (n == 0) return;
  const backend::ElementwiseScalars<float> c(h, weight_decay);
  const auto blocks = static_cast<unsigned>((n + backend::kAdam8bitBlock - 1) / backend::kAdam8bitBlock);
  if (h.rule == backend::ElementwiseRule::lion)
    state8bit_kernel<backend::ElementwiseRule::lion><<<blocks, 256, 0, stream>>>(p, g, c1, absmax1, n, c, qs);
  else
    state8bit_kernel<backend::ElementwiseRule::rmsprop_bnb>
        <<<blocks, 256, 0, stream>>>(p, g, c1, absmax1, n, c, qs);
  TR_CUDA_LAUNCH_CHECK("elementwise_8bit");
}

void adamw_8bit_blockwise(Stream stream, float* p, const float* g, uint8_t* c1, uint8_t* c2, uint8_t* c3,
                          float* absmax1, float* absmax2, float* absmax3, int64_t n,
                          const backend::Adam8bitConsts& k, const float* qs, const float* qu) {
  if (n == 0) return;
  const int64_t blocks = (n + backend::kAdam8bitBlock - 1) / backend::kAdam8bitBlock;
  static_assert(backend::kAdam8bitBlock == 256, "one thread per element of a quantization block");
  adamw_8bit_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, g, c1, c2, c3, absmax1, absmax2,
                                                                       absmax3, n, k, qs, qu);
  TR_CUDA_LAUNCH_CHECK("adamw_8bit");
}

void adamw_32bit_state(Stream stream, float* p, const float* g, float* s1, float* s2, float* s3, int64_t n,
                       const backend::Adam8bitConsts& k) {
  if (n == 0) return;
  adamw_32bit_kernel<<<blocks_for(n), 256, 0, stream>>>(p, g, s1, s2, s3, n, k);
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
  if (is_half(chunks[0].dst_dtype))  // half weights' gradients, transformed in place: f32 math, one rounding
    transform_half_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(d, inv_scale, max_norm,
                                                                                 stats);
  else if (chunks[0].dst_dtype == DType::f64)
    transform_kernel<double>
        <<<static_cast<unsigned>(count), kThreads, 0, stream>>>(d, inv_scale, max_norm, stats);
  else
    transform_kernel<float>
        <<<static_cast<unsigned>(count), kThreads, 0, stream>>>(d, inv_scale, max_norm, stats);
  TR_CUDA_LAUNCH_CHECK("transform_grads");
}

void anyprecision_adamw(Stream stream, const AnyPrecisionChunk* chunks, int64_t count, double lr,
                        double weight_decay, double beta1, double beta2, double eps, int64_t step,
                        Scratch& scratch) {
  if (count == 0) return;
  AnyPrecisionChunk* d = upload(stream, chunks, count, scratch);
  const backend::AnyPrecisionScalars sd(lr, weight_decay, beta1, beta2, eps, step),
      sp(lr, 0.0, beta1, beta2, eps, step);
  anyprecision_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(d, sd, sp);
  TR_CUDA_LAUNCH_CHECK("anyprecision_adamw");
}

void fused_adamw(Stream stream, DType dt, const AdamWChunk* chunks, int64_t count, double lr,
                 double weight_decay, double beta1, double beta2, double eps, int64_t step, double inv_scale,
                 double max_norm, const double* stats, Scratch& scratch) {
  if (count == 0) return;
  if (dt == DType::bf16 || dt == DType::f16) {
    AdamWChunk* d = upload(stream, chunks, count, scratch);
    const backend::AdamWScalars<float> sd(lr, weight_decay, beta1, beta2, eps, step),
        sp(lr, 0.0, beta1, beta2, eps, step);
    fused_adamw_half_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(d, dt, sd, sp, inv_scale,
                                                                                   max_norm, stats);
    TR_CUDA_LAUNCH_CHECK("fused_adamw");
  } else if (dt == DType::f32) {
    launch_adamw<float>(stream, chunks, count, lr, weight_decay, beta1, beta2, eps, step, inv_scale, max_norm,
                        stats, scratch);
  } else {
    launch_adamw<double>(stream, chunks, count, lr, weight_decay, beta1, beta2, eps, step, inv_scale,
                         max_norm, stats, scratch);
  }
}

}  // namespace tr::cuda
