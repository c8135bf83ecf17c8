// The fused multi-tensor AdamW kernel: one launch over a list of 64K-element chunks of every parameter; the
// element update is backend/optim_math.h's (compiled with --fmad=false so only its explicit fmas fuse, as
// on the CPU).
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/optim_math.h"

namespace tr::cuda {

namespace {

template <typename T>
__global__ void fused_adamw_kernel(const AdamWChunk* chunks, backend::AdamWScalars<T> with_decay,
                                   backend::AdamWScalars<T> without_decay) {
  const AdamWChunk c = chunks[blockIdx.x];
  const backend::AdamWScalars<T>& s = c.decay ? with_decay : without_decay;
  T* p = static_cast<T*>(c.param);
  const T* g = static_cast<const T*>(c.grad);
  T* m = static_cast<T*>(c.exp_avg);
  T* v = static_cast<T*>(c.exp_avg_sq);
  for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
    T pi = p[i], mi = m[i], vi = v[i];
    backend::adamw_element(pi, g[i], mi, vi, s);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

template <typename T>
void launch(const AdamWChunk* chunks, int64_t count, double lr, double wd, double b1, double b2, double eps,
            int64_t step) {
  // The chunk list goes to the device in stream order with the launch (no host synchronization).
  AdamWChunk* d = nullptr;
  TR_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof(AdamWChunk) * count, nullptr));
  TR_CUDA_CHECK(cudaMemcpyAsync(d, chunks, sizeof(AdamWChunk) * count, cudaMemcpyHostToDevice, nullptr));
  const backend::AdamWScalars<T> sd(lr, wd, b1, b2, eps, step), sp(lr, 0.0, b1, b2, eps, step);
  fused_adamw_kernel<T><<<static_cast<unsigned>(count), 512>>>(d, sd, sp);
  TR_CUDA_LAUNCH_CHECK("fused_adamw");
  TR_CUDA_CHECK(cudaFreeAsync(d, nullptr));
}

}  // namespace

void fused_adamw(DType dt, const AdamWChunk* chunks, int64_t count, double lr, double weight_decay,
                 double beta1, double beta2, double eps, int64_t step) {
  if (count == 0) return;
  if (dt == DType::f32)
    launch<float>(chunks, count, lr, weight_decay, beta1, beta2, eps, step);
  else
    launch<double>(chunks, count, lr, weight_decay, beta1, beta2, eps, step);
}

}  // namespace tr::cuda
