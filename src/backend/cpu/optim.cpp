// The multi-tensor AdamW pass on the CPU: one parallel region over a flat work list of 64K-element chunks of
// every tensor, as apex's multi_tensor_apply; the element math is backend/optim_math.h's.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/optim_math.h"
#include "core/error.h"

namespace tr::cpu {

namespace {

template <typename T>
void run_chunk(const backend::Backend::AdamWTensors& t, int64_t begin, int64_t n,
               const backend::AdamWScalars<T>& s) {
  T* p = t.param.data<T>() + begin;
  const T* g = t.grad.data<T>() + begin;
  T* m = t.exp_avg.data<T>() + begin;
  T* v = t.exp_avg_sq.data<T>() + begin;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) backend::adamw_element(p[i], g[i], m[i], v[i], s);
}

}  // namespace

void CpuBackend::fused_adamw(const std::vector<AdamWTensors>& tensors, double lr, double weight_decay,
                             double beta1, double beta2, double eps, int64_t step) {
  struct Work {
    size_t tensor;
    int64_t begin, n;
  };
  std::vector<Work> work;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    TR_CHECK(t.param.dtype() == DType::f32 || t.param.dtype() == DType::f64, "fused_adamw: dtype {}",
             dtype_name(t.param.dtype()));
    for (const Tensor* x : {&t.grad, &t.exp_avg, &t.exp_avg_sq})
      TR_CHECK(x->dtype() == t.param.dtype() && x->numel() == t.param.numel() && x->is_contiguous(),
               "fused_adamw: tensor {} does not match its parameter", i);
    const int64_t n = t.param.numel();
    for (int64_t b = 0; b < n; b += backend::kAdamWChunk)
      work.push_back({i, b, std::min(backend::kAdamWChunk, n - b)});
  }
  const backend::AdamWScalars<float> fd(lr, weight_decay, beta1, beta2, eps, step),
      fp(lr, 0.0, beta1, beta2, eps, step);
  const backend::AdamWScalars<double> dd(lr, weight_decay, beta1, beta2, eps, step),
      dp(lr, 0.0, beta1, beta2, eps, step);
  const int64_t total = static_cast<int64_t>(work.size());
#pragma omp parallel for schedule(dynamic, 1) if (total > 1)  // one chunk: no parallel region
  for (int64_t w = 0; w < total; ++w) {
    const auto& t = tensors[work[w].tensor];
    if (t.param.dtype() == DType::f32)
      run_chunk(t, work[w].begin, work[w].n, t.decay ? fd : fp);
    else
      run_chunk(t, work[w].begin, work[w].n, t.decay ? dd : dp);
  }
}

}  // namespace tr::cpu
