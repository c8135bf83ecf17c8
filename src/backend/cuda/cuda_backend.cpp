// The CUDA backend: runtime queries, a counting device allocator, host<->device copies, GEMM through cuBLASLt
// (gemm_lt.h; cuBLAS when it has no algorithm), and the Backend methods, which unpack tensors into the kernel
// launchers of kernels.h.
//
// Note [CUDA fallback]: a CUDA build on a machine without a GPU reports cuda_available() == false; asking
// for a cuda tensor then throws a clear error, and callers that pick a default device fall back to the CPU.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>  // header-only NVTX v3: a no-op until a profiler injects itself

#include <algorithm>
#include <memory>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <string>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cudnn_sdpa.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/streams.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda_api.h"
#include "backend/optim_math.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_allocator.h"
#include "backend/cuda/fused_chain_of.h"
#include "core/caching_allocator.h"

namespace tr::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line) {
  fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(e), cudaGetErrorString(e), what, file, line);
}

namespace {

#define TR_CUBLAS_CHECK(call)                                                                            \
  do {                                                                                                   \
    cublasStatus_t s_ = (call);                                                                          \
    TR_CHECK(s_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error {} in {} at {}:{}", static_cast<int>(s_), #call, \
             __FILE__, __LINE__);                                                                        \
  } while (0)

Strided strided_of(const Shape& shape, std::initializer_list<const Strides*> strides) {
  TR_CHECK(shape.size() <= kMaxDims, "cuda: tensors of rank {} exceed the kernel limit of {}", shape.size(),
           kMaxDims);
  Strided g;
  g.nd = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) g.shape[d] = shape[d];
  int j = 0;
  for (const Strides* s : strides) {
    for (size_t d = 0; d < shape.size(); ++d) g.stride[j][d] = (*s)[d];
    ++j;
  }
  return g;
}

int64_t last_dim(const Tensor& t) { return t.dim() == 0 ? 1 : t.shape().back(); }
int64_t rows_of(const Tensor& t) { return t.numel() / std::max<int64_t>(last_dim(t), 1); }
const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
void* mut_ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// The kernel scratch of a CUDA graph being captured: kept for the graph's lifetime (its launches write there
// again), and reused between the captured launchers, which run in stream order.
struct CaptureScratch {
  std::vector<Tensor> blocks;  // free for the next launcher of the capture
};

// Kernel scratch (kernels.h) from a device's caching allocator, held until the launcher has returned; while a
// graph is captured, from and back to its CaptureScratch.
class AllocatorScratch final : public cuda::Scratch {
 public:
  AllocatorScratch(Allocator& a, CaptureScratch* capture) : a_(a), capture_(capture) {}
  ~AllocatorScratch() {
    if (capture_)
      for (Tensor& t : held_) capture_->blocks.push_back(std::move(t));
  }
  AllocatorScratch(const AllocatorScratch&) = delete;
  AllocatorScratch& operator=(const AllocatorScratch&) = delete;
  void* take(size_t bytes) override {
    const auto n = static_cast<int64_t>(bytes);
    if (capture_) {  // the smallest free block of the capture that is large enough
      auto& b = capture_->blocks;
      auto best = b.end();
      for (auto it = b.begin(); it != b.end(); ++it)
        if (it->numel() >= n && (best == b.end() || it->numel() < best->numel())) best = it;
      if (best != b.end()) {
        held_.push_back(std::move(*best));
        b.erase(best);
        return held_.back().data_ptr();
      }
    }
    held_.push_back(Tensor::empty({n}, DType::u8, a_));
    return held_.back().data_ptr();
  }

 private:
  Allocator& a_;
  CaptureScratch* capture_;
  std::vector<Tensor> held_;
};

// A captured CUDA graph, instantiated: launched on the compute stream it was captured on, with the kernel
// scratch it writes held until it is destroyed (later work on that stream is ordered after its launches).
class CudaGraph final : public backend::Backend::DeviceGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream, std::vector<Tensor> scratch)
      : exec_(exec), stream_(stream), scratch_(std::move(scratch)) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void launch() override { TR_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  std::vector<Tensor> scratch_;
};

class CudaBackend final : public backend::Backend {
 public:
  CudaBackend() {
    const int n = backend::cuda_device_count();
    for (int i = 0; i < n; ++i) allocators_.push_back(std::make_unique<CudaAllocator>(i));
    shift_dev_.assign(static_cast<size_t>(n), nullptr);
    blas_.assign(static_cast<size_t>(n), nullptr);
    lt_.resize(static_cast<size_t>(n));
    sdpa_.resize(static_cast<size_t>(n));
  }
  ~CudaBackend() override {
    if (bad_host_) cudaFreeHost(bad_host_);
    for (cublasHandle_t h : blas_)
      if (h) cublasDestroy(h);
    for (uint64_t* p : shift_dev_)
      if (p) cudaFree(p);
  }
  const char* name() const override { return "cuda"; }
  // The stream every launcher, copy and GEMM of the current device is queued on: its compute stream, in whose
  // order CudaAllocator reuses freed blocks and after which CopyStream's batches are ordered.
  cuda::Stream stream() const { return allocators_[current()]->stream(); }
  cudaStream_t stream_of(int device) {
    TR_CHECK(device >= 0 && device < static_cast<int>(allocators_.size()),
             "cuda:{} does not exist ({} GPUs present)", device, allocators_.size());
    return allocators_[static_cast<size_t>(device)]->stream();
  }
  std::unique_ptr<DeviceGraph> capture_graph(int device_index, const std::function<void()>& work) override;
  Allocator& allocator(int index) override {
    TR_CHECK(index >= 0 && index < static_cast<int>(allocators_.size()),
             "cuda:{} does not exist ({} GPUs present)", index, allocators_.size());
    return *allocators_[static_cast<size_t>(index)];
  }
  void synchronize() override {
    TR_CUDA_CHECK(cudaDeviceSynchronize());
    report_device_errors();
  }
  void range_push(const char* name) override { nvtxRangePushA(name); }
  void range_pop() override { nvtxRangePop(); }
  // Throws for what kernels flagged since the last report (kernels.h BadIndexKind: an embedding id, a label
  // or a rope position out of range); call after a synchronization.
  void report_device_errors() {
    if (!bad_host_ || bad_host_[1] == cuda::kBadNone) return;
    const int64_t value = bad_host_[0], kind = bad_host_[1], limit = bad_host_[2];
    bad_host_[1] = cuda::kBadNone;
    const char* what = kind == cuda::kBadRopePosition     ? "rope: position"
                       : kind == cuda::kBadEmbeddingIndex ? "embedding: index"
                                                          : "cross_entropy: label";
    fail("{} {} is out of range for {} rows (found on the GPU; reported at the next synchronization)", what,
         value, limit);
  }

  void copy(const Tensor& src, const Tensor& dst) override {
    cuda::copy(stream(), src.data_ptr(), src.dtype(), dst.data_ptr(), dst.dtype(),
               strided_of(src.shape(), {&src.strides(), &dst.strides()}), src.numel());
  }
  void fill(const Tensor& out, double value) override {
    cuda::fill(stream(), out.data_ptr(), out.dtype(), out.numel(), value);
  }
  void arange(const Tensor& out, double start, double step) override {
    cuda::arange(stream(), out.data_ptr(), out.dtype(), out.numel(), start, step);
  }
  // Random fills bake their offsets into a graph: refused while capturing (the step then runs kernel by
  // kernel).
  void random_normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) override {
    // Captured (NEFTune's noise in a compiled step): the offset moves with each replay's shift.
    cuda::random_normal(stream(), out.data_ptr(), out.dtype(), out.numel(), mean, std, seed, offset,
                        captured_shift(1.0));
  }
  void random_uniform(const Tensor& out, double lo, double hi, uint64_t seed, uint64_t offset) override {
    cuda::random_uniform(stream(), out.data_ptr(), out.dtype(), out.numel(), lo, hi, seed, offset,
                         captured_shift(1.0));
  }
  void unary(backend::UnaryOp op, const Tensor& x, const Tensor& out) override {
    cuda::unary(stream(), op, x.dtype(), x.data_ptr(), out.data_ptr(),
                strided_of(out.shape(), {&x.strides(), &out.strides()}), out.numel());
  }
  void unary_backward(backend::UnaryOp op, const Tensor& x, const Tensor& gy, const Tensor& gx) override {
    cuda::unary_backward(stream(), op, x.dtype(), x.data_ptr(), gy.data_ptr(), gx.data_ptr(), x.numel());
  }
  void binary(backend::BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override {
    cuda::binary(stream(), op, out.dtype(), a.data_ptr(), b.data_ptr(), out.data_ptr(),
                 strided_of(out.shape(), {&a.strides(), &b.strides(), &out.strides()}), out.numel());
  }
  void affine(const Tensor& x, double alpha, double beta, const Tensor& out) override {
    cuda::affine(stream(), x.dtype(), x.data_ptr(), out.data_ptr(), x.numel(), alpha, beta);
  }
  void pow_scalar(const Tensor& x, double exponent, const Tensor& out) override {
    cuda::pow_scalar(stream(), x.dtype(), x.data_ptr(), out.data_ptr(), x.numel(), exponent);
  }
  void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) override {
    cuda::masked_fill(stream(), x.dtype(), x.data_ptr(), mask.data<bool>(), out.data_ptr(),
                      strided_of(out.shape(), {&x.strides(), &mask.strides(), &out.strides()}), out.numel(),
                      value);
  }
  void reduce(backend::ReduceOp op, const Tensor& x, int64_t outer, int64_t r, int64_t inner,
              const Tensor& out) override {
    AllocatorScratch scratch(allocator(x.device().index), capturing_);
    cuda::reduce(stream(), op, x.dtype(), x.data_ptr(), out.data_ptr(), outer, r, inner, scratch);
  }
  void argmax(const Tensor& x, int64_t outer, int64_t r, int64_t inner, const Tensor& out) override {
    cuda::argmax(stream(), x.dtype(), x.data_ptr(), out.data<int64_t>(), outer, r, inner);
  }
  void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) override {
    cuda::topk(stream(), x.dtype(), x.data_ptr(), values.data_ptr(), indices.data<int64_t>(), rows_of(x),
               last_dim(x), k);
  }
  void softmax(const Tensor& x, bool log, const Tensor& y) override {
    cuda::softmax(stream(), x.dtype(), x.data_ptr(), y.data_ptr(), rows_of(x), last_dim(x), log);
  }
  void softmax_backward(const Tensor& y, const Tensor& gy, bool log, const Tensor& gx) override {
    cuda::softmax_backward(stream(), y.dtype(), y.data_ptr(), gy.data_ptr(), gx.data_ptr(), rows_of(y),
                           last_dim(y), log);
  }
  void gemm(const backend::GemmArgs& g) override;
  void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                  const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                  const Tensor& sum) override {
    cuda::layer_norm(stream(), x.dtype(), x.data_ptr(), ptr_or_null(w), ptr_or_null(b), y.data_ptr(),
                     mean.data_ptr(), rstd.data_ptr(), rows_of(x), last_dim(x), eps, ptr_or_null(residual),
                     mut_ptr_or_null(sum));
  }
  void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                           const Tensor& gy, const Tensor& gx, const Tensor& gw, const Tensor& gb,
                           const Tensor& gx_add) override {
    AllocatorScratch scratch(allocator(x.device().index), capturing_);
    cuda::layer_norm_backward(stream(), x.dtype(), x.data_ptr(), ptr_or_null(w), mean.data_ptr(),
                              rstd.data_ptr(), gy.data_ptr(), mut_ptr_or_null(gx), mut_ptr_or_null(gw),
                              mut_ptr_or_null(gb), rows_of(x), last_dim(x), ptr_or_null(gx_add), scratch);
  }
  void rms_norm(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd,
                const Tensor& residual, const Tensor& sum) override {
    cuda::rms_norm(stream(), x.dtype(), x.data_ptr(), ptr_or_null(w), y.data_ptr(), rstd.data_ptr(),
                   rows_of(x), last_dim(x), eps, ptr_or_null(residual), mut_ptr_or_null(sum));
  }
  void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& gy,
                         const Tensor& gx, const Tensor& gw, const Tensor& gx_add) override {
    AllocatorScratch scratch(allocator(x.device().index), capturing_);
    cuda::rms_norm_backward(stream(), x.dtype(), x.data_ptr(), ptr_or_null(w), rstd.data_ptr(), gy.data_ptr(),
                            mut_ptr_or_null(gx), mut_ptr_or_null(gw), rows_of(x), last_dim(x),
                            ptr_or_null(gx_add), scratch);
  }
  void cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index, double smoothing,
                     const Tensor& loss, const Tensor& lse) override {
    // Labels are checked on the device; a bad one is reported at the next synchronization.
    cuda::cross_entropy(stream(), logits.dtype(), logits.data_ptr(), backend::row_stride(logits),
                        labels.data<int64_t>(), loss.data_ptr(), lse.data_ptr(), rows_of(logits),
                        last_dim(logits), ignore_index, smoothing, bad_index());
  }
  void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                              const Tensor& grad_loss, int64_t ignore_index, double smoothing,
                              const Tensor& glogits) override {
    check_logit_gradient(logits, glogits);
    cuda::cross_entropy_backward(stream(), logits.dtype(), logits.data_ptr(), backend::row_stride(logits),
                                 labels.data<int64_t>(), lse.data_ptr(), grad_loss.data_ptr(),
                                 glogits.data_ptr(), glogits.dtype(), backend::row_stride(glogits),
                                 rows_of(logits), last_dim(logits), ignore_index, smoothing);
  }
  void cross_entropy_with_grad(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                               double smoothing, const Tensor& loss, const Tensor& lse,
                               const Tensor& grad_loss, const Tensor& glogits) override {
    check_logit_gradient(logits, glogits);
    cuda::cross_entropy_with_grad(stream(), logits.dtype(), logits.data_ptr(), backend::row_stride(logits),
                                  labels.data<int64_t>(), loss.data_ptr(), lse.data_ptr(),
                                  grad_loss.data_ptr(), glogits.data_ptr(), glogits.dtype(),
                                  backend::row_stride(glogits), rows_of(logits), last_dim(logits),
                                  ignore_index, smoothing, bad_index());
  }
  static void check_logit_gradient(const Tensor& logits, const Tensor& glogits) {
    TR_CHECK(glogits.dtype() == logits.dtype() ||
                 (logits.dtype() == DType::f32 &&
                  (glogits.dtype() == DType::bf16 || glogits.dtype() == DType::f16)),
             "cross_entropy_backward: a {} gradient of {} logits (only f32 logits to bf16/f16)",
             dtype_name(glogits.dtype()), dtype_name(logits.dtype()));
  }
  void embedding(const Tensor& weight, const Tensor& ids, const Tensor& out) override {
    cuda::embedding(stream(), weight.dtype(), weight.data_ptr(), ids.data<int64_t>(), out.data_ptr(),
                    ids.numel(), weight.shape()[0], weight.shape()[1], bad_index());
  }
  void embedding_backward(const Tensor& gy, const Tensor& ids, const Tensor& gweight) override;
  void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions, bool seq_major,
            bool inverse, const Tensor& y) override {
    const auto& s = x.shape();
    const int64_t H = seq_major ? s[2] : s[1], T = seq_major ? s[1] : s[2];
    // Positions are checked on the device: a bad one is reported at the next synchronization (Llama calls
    // rope twice per layer; a host sync each time would stall the queue).
    cuda::rope(stream(), x.dtype(), x.data_ptr(), cos.data<float>(), sin.data<float>(),
               positions.data<int64_t>(), y.data_ptr(), s[0], H, T, s[3], seq_major, inverse, cos.shape()[0],
               bad_index());
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep, bool causal,
                 int64_t window, double scale, const backend::AttentionDropout& drop, const Tensor& out,
                 const Tensor& lse) override {
    const auto g = backend::attention_geometry(q, k, v, key_keep, causal, window, scale, drop, out);
    {
      AllocatorScratch scratch(allocator(q.device().index), capturing_);
      if (sdpa().forward(stream(), q.dtype(), g, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                         lse.data_ptr(), captured_shift(drop.p), scratch))
        return;
    }
    cuda::attention(stream(), q.dtype(), g, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                    lse.data_ptr(), captured_shift(drop.p));
  }
  void grad_stats(const std::vector<Tensor>& grads, double inv_scale, const Tensor& stats) override {
    TR_CHECK(stats.dtype() == DType::f64 && stats.numel() == 2 && stats.is_contiguous() &&
                 stats.device().is_cuda(),
             "grad_stats: stats must be a contiguous f64 [2] tensor on the GPU");
    std::vector<cuda::GradChunk> chunks;
    for (size_t i = 0; i < grads.size(); ++i) {
      const Tensor& g = grads[i];
      TR_CHECK(g.is_contiguous() && is_floating(g.dtype()) && g.device() == stats.device(),
               "grad_stats: gradient {} must be contiguous, floating and on {}", i, stats.device().str());
      const int64_t n = g.numel(), es = static_cast<int64_t>(dtype_size(g.dtype()));
      for (int64_t b = 0; b < n; b += backend::kAdamWChunk)
        chunks.push_back({static_cast<const char*>(g.data_ptr()) + b * es, nullptr,
                          std::min(backend::kAdamWChunk, n - b), g.dtype(), g.dtype()});
    }
    AllocatorScratch scratch(allocator(stats.device().index), capturing_);
    cuda::grad_stats(stream(), chunks.data(), static_cast<int64_t>(chunks.size()), inv_scale,
                     stats.data<double>(), scratch);
  }
  void transform_grads(const std::vector<std::pair<Tensor, Tensor>>& src_dst,
                       const GradTransform& t) override {
    const double* st = stats_pointer(t);
    // One launch per destination dtype (bf16/f16: half weights' gradients transformed in place).
    for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      std::vector<cuda::GradChunk> chunks;
      for (size_t i = 0; i < src_dst.size(); ++i) {
        const auto& [src, dst] = src_dst[i];
        TR_CHECK(src.is_contiguous() && dst.is_contiguous() && src.numel() == dst.numel() &&
                     is_floating(src.dtype()) && is_floating(dst.dtype()) && src.device() == dst.device() &&
                     dst.device().is_cuda(),
                 "transform_grads: pair {} must be contiguous, floating, of one size and device", i);
        if (dst.dtype() != dt) continue;
        const int64_t n = src.numel(), ss = static_cast<int64_t>(dtype_size(src.dtype())),
                      ds = static_cast<int64_t>(dtype_size(dt));
        for (int64_t b = 0; b < n; b += backend::kAdamWChunk)
          chunks.push_back({static_cast<const char*>(src.data_ptr()) + b * ss,
                            static_cast<char*>(dst.data_ptr()) + b * ds,
                            std::min(backend::kAdamWChunk, n - b), src.dtype(), dt});
      }
      if (chunks.empty()) continue;
      AllocatorScratch scratch(allocator(src_dst.front().second.device().index), capturing_);
      cuda::transform_grads(stream(), chunks.data(), static_cast<int64_t>(chunks.size()), t.inv_scale,
                            t.max_norm, st, scratch);
    }
  }
  void fused_adamw(const std::vector<AdamWTensors>& tensors, const AdamWHyper& h,
                   const GradTransform& t) override {
    if (tensors.empty()) return;
    const DType dt = tensors[0].param.dtype();
    TR_CHECK(is_floating(dt), "fused_adamw: dtype {}", dtype_name(dt));
    const double* st = stats_pointer(t);
    std::vector<cuda::AdamWChunk> chunks;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& x = tensors[i];
      for (const Tensor* y : {&x.param, &x.exp_avg, &x.exp_avg_sq})
        TR_CHECK(y->dtype() == dt && y->numel() == x.param.numel() && y->is_contiguous() &&
                     y->device() == x.param.device(),
                 "fused_adamw: tensor {} does not match its parameter (dtype, size, device, contiguity)", i);
      for (const Tensor* y : {&x.grad, &x.param_copy})
        TR_CHECK((y == &x.param_copy && !y->defined()) ||
                     (is_floating(y->dtype()) && y->numel() == x.param.numel() && y->is_contiguous() &&
                      y->device() == x.param.device()),
                 "fused_adamw: gradient or weight copy of tensor {} does not match its parameter", i);
      TR_CHECK(!is_half(dt) || !x.param_copy.defined(),
               "fused_adamw: half parameter {} is the model's weight itself: no copy to write", i);
      const int64_t n = x.param.numel(), es = static_cast<int64_t>(dtype_size(dt)),
                    gs = static_cast<int64_t>(dtype_size(x.grad.dtype()));
      const bool copy = x.param_copy.defined();
      const int64_t cs = copy ? static_cast<int64_t>(dtype_size(x.param_copy.dtype())) : 0;
      for (int64_t b = 0; b < n; b += backend::kAdamWChunk)
        chunks.push_back({static_cast<char*>(x.param.data_ptr()) + b * es,
                          static_cast<const char*>(x.grad.data_ptr()) + b * gs,
                          static_cast<char*>(x.exp_avg.data_ptr()) + b * es,
                          static_cast<char*>(x.exp_avg_sq.data_ptr()) + b * es,
                          copy ? static_cast<char*>(x.param_copy.data_ptr()) + b * cs : nullptr,
                          std::min(backend::kAdamWChunk, n - b), x.decay ? 1 : 0, x.grad.dtype(),
                          copy ? x.param_copy.dtype() : dt});
    }
    AllocatorScratch scratch(allocator(tensors.front().param.device().index), capturing_);
    cuda::fused_adamw(stream(), dt, chunks.data(), static_cast<int64_t>(chunks.size()), h.lr, h.weight_decay,
                      h.beta1, h.beta2, h.eps, h.step, t.inv_scale, t.max_norm, st, scratch);
  }
  void anyprecision_adamw(const std::vector<AnyPrecisionTensors>& tensors,
                          const AnyPrecisionHyper& h) override {
    if (tensors.empty()) return;
    std::vector<cuda::AnyPrecisionChunk> chunks;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& x = tensors[i];
      const int64_t n = x.param.numel();
      for (const Tensor* t : {&x.param, &x.grad, &x.exp_avg, &x.exp_avg_sq, &x.compensation})
        TR_CHECK((t == &x.compensation && !t->defined()) ||
                     (t->numel() == n && t->is_contiguous() && t->device() == x.param.device() &&
                      (t->dtype() == DType::f32 || is_half(t->dtype()) ||
                       (t == &x.grad && is_floating(t->dtype())))),
                 "anyprecision_adamw: tensor {} needs contiguous f32/bf16/f16 state of its size on its GPU",
                 i);
      const auto at = [](const Tensor& t, int64_t b) {
        return t.defined()
                   ? static_cast<char*>(t.data_ptr()) + b * static_cast<int64_t>(dtype_size(t.dtype()))
                   : nullptr;
      };
      for (int64_t b = 0; b < n; b += backend::kAdamWChunk)
        chunks.push_back({at(x.param, b), at(x.grad, b), at(x.exp_avg, b), at(x.exp_avg_sq, b),
                          at(x.compensation, b), std::min(backend::kAdamWChunk, n - b), x.decay ? 1 : 0,
                          x.param.dtype(), x.grad.dtype(), x.exp_avg.dtype(), x.exp_avg_sq.dtype(),
                          x.compensation.defined() ? x.compensation.dtype() : DType::f32});
    }
    AllocatorScratch scratch(allocator(tensors.front().param.device().index), capturing_);
    cuda::anyprecision_adamw(stream(), chunks.data(), static_cast<int64_t>(chunks.size()), h.lr,
                             h.weight_decay, h.beta1, h.beta2, h.eps, h.step, scratch);
  }
  void sgd(const std::vector<SgdTensors>& tensors, const SgdHyper& h) override {
    for (const auto& x : tensors) {
      const int64_t n = x.param.numel();
      const Tensor& buf = x.momentum_buffer;
      TR_CHECK(
          (x.param.dtype() == DType::f32 || x.param.dtype() == DType::f64) && x.param.is_contiguous() &&
              x.param.device().is_cuda() && x.grad.dtype() == x.param.dtype() && x.grad.numel() == n &&
              x.grad.is_contiguous() && x.grad.device() == x.param.device() &&
              (!buf.defined() || (buf.dtype() == x.param.dtype() && buf.numel() == n && buf.is_contiguous() &&
                                  buf.device() == x.param.device())),
          "sgd: {} needs a contiguous f32/f64 gradient and momentum buffer of its dtype and size on its GPU",
          x.param.describe());
      cuda::sgd(stream(), x.param.dtype(), x.param.data_ptr(), x.grad.data_ptr(),
                buf.defined() ? buf.data_ptr() : nullptr, n, h.lr, x.weight_decay, h.momentum, h.dampening,
                h.nesterov, x.first);
    }
  }
  void elementwise_step(const std::vector<ElementwiseTensors>& tensors, const ElementwiseHyper& h) override {
    for (const auto& x : tensors) {
      const int64_t n = x.param.numel();
      const auto same = [&](const Tensor& t) {
        return t.dtype() == x.param.dtype() && t.numel() == n && t.is_contiguous() &&
               t.device() == x.param.device();
      };
      const bool needs_grad = backend::reads_gradient(h.rule);
      const bool needs_state2 = backend::needs_state2(h.rule);
      TR_CHECK(
          (x.param.dtype() == DType::f32 || x.param.dtype() == DType::f64) && x.param.is_contiguous() &&
              x.param.device().is_cuda() && (needs_grad ? same(x.grad) : !x.grad.defined() || same(x.grad)) &&
              same(x.state1) && (!x.state2.defined() || same(x.state2)) &&
              (!needs_state2 || x.state2.defined()),
          "elementwise_step: {} needs a contiguous f32/f64 gradient and state of its dtype and size on its "
          "GPU",
          x.param.describe());
      cuda::elementwise_step(stream(), x.param.dtype(), h, x.weight_decay, x.param.data_ptr(),
                             x.grad.defined() ? x.grad.data_ptr() : x.param.data_ptr(), x.state1.data_ptr(),
                             x.state2.defined() ? x.state2.data_ptr() : nullptr, n);
    }
  }
  void elementwise_8bit(const std::vector<Elementwise8bitTensors>& tensors, const ElementwiseHyper& h,
                        const Tensor& signed_map) override {
    TR_CHECK(signed_map.numel() == 256 && signed_map.dtype() == DType::f32 && signed_map.device().is_cuda(),
             "elementwise_8bit: the code map must be f32 [256] on the GPU");
    TR_CHECK(h.rule == backend::ElementwiseRule::lion || h.rule == backend::ElementwiseRule::rmsprop_bnb,
             "elementwise_8bit: only Lion and bitsandbytes' RMSprop keep 8-bit state");
    for (const auto& x : tensors) {
      const int64_t n = x.param.numel(), blocks = (n + backend::kAdam8bitBlock - 1) / backend::kAdam8bitBlock;
      const Device d = x.param.device();
      TR_CHECK(
          d == signed_map.device() && x.param.dtype() == DType::f32 && x.grad.dtype() == DType::f32 &&
              x.grad.numel() == n && x.param.is_contiguous() && x.grad.is_contiguous() &&
              x.grad.device() == d && x.state1.dtype() == DType::u8 && x.state1.numel() == n &&
              x.state1.device() == d && x.absmax1.dtype() == DType::f32 && x.absmax1.numel() == blocks &&
              x.absmax1.device() == d,
          "elementwise_8bit: {} needs an f32 gradient, u8 codes of its size and f32 absmax per 256 on the "
          "code map's GPU",
          x.param.describe());
      cuda::elementwise_8bit(stream(), h, x.weight_decay, x.param.data<float>(), x.grad.data<float>(),
                             x.state1.data<uint8_t>(), x.absmax1.data<float>(), n, signed_map.data<float>());
    }
  }
  void adamw_8bit(const std::vector<AdamW8bitTensors>& tensors, const Tensor& signed_map,
                  const Tensor& unsigned_map) override {
    TR_CHECK(signed_map.numel() == 256 && unsigned_map.numel() == 256 && signed_map.dtype() == DType::f32 &&
                 unsigned_map.dtype() == DType::f32 && signed_map.device().is_cuda() &&
                 unsigned_map.device().is_cuda(),
             "adamw_8bit: the code maps must be f32 [256] on the GPU");
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& x = tensors[i];
      const int64_t n = x.param.numel();
      const int64_t blocks = (n + backend::kAdam8bitBlock - 1) / backend::kAdam8bitBlock;
      TR_CHECK(x.param.dtype() == DType::f32 && x.grad.dtype() == DType::f32 && x.grad.numel() == n &&
                   x.param.is_contiguous() && x.grad.is_contiguous() && x.param.device().is_cuda() &&
                   x.grad.device() == x.param.device() && x.state1.device() == x.param.device() &&
                   x.state2.device() == x.param.device() && signed_map.device() == x.param.device() &&
                   x.state1.is_contiguous() && x.state2.is_contiguous(),
               "adamw_8bit: tensor {} needs a contiguous f32 parameter, gradient and state on one GPU", i);
      const bool three = x.k.ademamix;
      TR_CHECK(!three ||
                   (x.state3.defined() && x.state3.device() == x.param.device() && x.state3.is_contiguous() &&
                    x.state3.numel() == n && x.state3.dtype() == x.state1.dtype()),
               "adamw_8bit: AdEMAMix's third state of tensor {} does not fit its {} elements", i, n);
      if (x.eight_bit) {
        TR_CHECK(x.state1.dtype() == DType::u8 && x.state2.dtype() == DType::u8 && x.state1.numel() == n &&
                     x.state2.numel() == n && x.absmax1.numel() == blocks && x.absmax2.numel() == blocks &&
                     x.absmax1.dtype() == DType::f32 && x.absmax2.dtype() == DType::f32 &&
                     x.absmax1.is_contiguous() && x.absmax2.is_contiguous() &&
                     x.absmax1.device() == x.param.device() && x.absmax2.device() == x.param.device() &&
                     (!three || (x.absmax3.defined() && x.absmax3.numel() == blocks &&
                                 x.absmax3.dtype() == DType::f32 && x.absmax3.is_contiguous() &&
                                 x.absmax3.device() == x.param.device())),
                 "adamw_8bit: the 8-bit state of tensor {} does not fit its {} elements", i, n);
        cuda::adamw_8bit_blockwise(stream(), x.param.data<float>(), x.grad.data<float>(),
                                   x.state1.data<uint8_t>(), x.state2.data<uint8_t>(),
                                   three ? x.state3.data<uint8_t>() : nullptr, x.absmax1.data<float>(),
                                   x.absmax2.data<float>(), three ? x.absmax3.data<float>() : nullptr, n, x.k,
                                   signed_map.data<float>(), unsigned_map.data<float>());
      } else {
        TR_CHECK(x.state1.dtype() == DType::f32 && x.state2.dtype() == DType::f32 && x.state1.numel() == n &&
                     x.state2.numel() == n,
                 "adamw_8bit: the 32-bit state of tensor {} does not fit its {} elements", i, n);
        cuda::adamw_32bit_state(stream(), x.param.data<float>(), x.grad.data<float>(), x.state1.data<float>(),
                                x.state2.data<float>(), three ? x.state3.data<float>() : nullptr, n, x.k);
      }
    }
  }
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                          bool causal, int64_t window, double scale, const backend::AttentionDropout& drop,
                          const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv) override {
    AllocatorScratch scratch(allocator(q.device().index), capturing_);
    const auto g =
        backend::attention_geometry(q, k, v, key_keep, causal, window, scale, drop, out, dout, dq, dk, dv);
    if (sdpa().backward(stream(), q.dtype(), g, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                        lse.data_ptr(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                        captured_shift(drop.p), scratch))
      return;
    cuda::attention_backward(stream(), q.dtype(), g, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                             lse.data_ptr(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                             captured_shift(drop.p), scratch);
  }
  void attention_block_softmax(const Tensor& scores, const AttentionBlock& a, const Tensor& probs,
                               const Tensor& lse) override {
    cuda::attention_block_softmax(
        stream(), scores.dtype(), probs.dtype(), scores.data_ptr(), probs.data_ptr(), lse.data_ptr(),
        a.key_keep.defined() ? a.key_keep.data<bool>() : nullptr, a.B, a.H, a.KV, a.T, a.S, a.t0, a.tq, a.sk,
        a.causal, a.window, a.scale, a.dropout, a.seed, a.offset, captured_shift(a.dropout));
  }
  void attention_block_grad(const Tensor& scores, const Tensor& dp, const Tensor& lse, const Tensor& delta,
                            const AttentionBlock& a, const Tensor& probs, const Tensor& dscores) override {
    cuda::attention_block_grad(stream(), scores.dtype(), probs.dtype(), scores.data_ptr(), dp.data_ptr(),
                               lse.data_ptr(), delta.data_ptr(), probs.data_ptr(), dscores.data_ptr(),
                               a.key_keep.defined() ? a.key_keep.data<bool>() : nullptr, a.B, a.H, a.KV, a.T,
                               a.S, a.t0, a.tq, a.sk, a.causal, a.window, a.scale, a.dropout, a.seed,
                               a.offset, captured_shift(a.dropout));
  }
  void dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& y) override {
    cuda::dropout(stream(), x.dtype(), x.data_ptr(), y.data_ptr(), x.numel(), p, seed, offset,
                  captured_shift(p));
  }
  bool philox_shift_on_device() const override { return true; }
  bool fuses_elementwise() const override { return true; }
  void fused_elementwise(const std::vector<FusedStage>& stages, const std::vector<Tensor>& t) override {
    check_fused_chain(stages, t);
    TR_CHECK(t.size() <= static_cast<size_t>(cuda::kFusedTensors),
             "fused_elementwise: {} tensors (at most {})", t.size(), cuda::kFusedTensors);
    std::vector<void*> ptrs;
    double p = 0;  // the largest dropout probability (captured_shift's condition)
    for (const Tensor& x : t) ptrs.push_back(x.data_ptr());
    for (const FusedStage& s : stages)
      if (s.kind == FusedStage::Kind::dropout) p = std::max(p, s.alpha);
    const cuda::FusedChain c = cuda::chain_of(stages, ptrs);
    cuda::fused_elementwise(stream(), t[0].dtype(), c, t[0].numel(), captured_shift(p));
  }
  std::string autotune_summary() const override {
    size_t tuned = 0, away = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (const auto& lt : lt_)
        if (lt) tuned += lt->tuned(), away += lt->tuned_away();
    }
    if (tuned == 0) return "";
    return fmt::format(
        "max-autotune timed up to {} cuBLASLt algorithms for {} GEMM shapes; {} kept another "
        "than the heuristic's first",
        LtGemm::kAutotuneCandidates, tuned, away);
  }
  void set_philox_shift(int device_index, uint64_t shift) override {
    backend::cuda_use_device(device_index);
    cuda::set_u64(stream(), shift_slot(), shift);
  }

 private:
  static const double* stats_pointer(const GradTransform& t) {
    if (t.max_norm <= 0) return nullptr;
    TR_CHECK(t.stats.defined() && t.stats.dtype() == DType::f64 && t.stats.numel() == 2 &&
                 t.stats.device().is_cuda(),
             "gradient transform: clipping needs the f64 [2] statistics of grad_stats on the GPU");
    return t.stats.data<double>();
  }
  // The current device (the tensors' own: backend_for makes it current), checked against those present.
  size_t current() const {
    int d = 0;
    TR_CUDA_CHECK(cudaGetDevice(&d));
    TR_CHECK(d >= 0 && d < static_cast<int>(allocators_.size()), "cuda: the current device {} does not exist",
             d);
    return static_cast<size_t>(d);
  }
  // The current device's cuBLAS handle (a handle belongs to the device current at its creation).
  cublasHandle_t handle() {
    const size_t d = current();
    std::lock_guard<std::mutex> g(mu_);
    cublasHandle_t& h = blas_[d];
    if (!h) TR_CUBLAS_CHECK(cublasCreate(&h));
    TR_CUBLAS_CHECK(cublasSetStream(h, stream()));
    return h;
  }
  // The current device's cuBLASLt GEMMs: plans (heuristics answer per GPU) and workspace of its own.
  LtGemm& lt() {
    const size_t d = current();
    std::lock_guard<std::mutex> g(mu_);
    if (!lt_[d]) lt_[d] = std::make_unique<LtGemm>();
    return *lt_[d];
  }
  // The current device's cuDNN attention (its handle and plans belong to that GPU).
  cuda::CudnnSdpa& sdpa() {
    const size_t d = current();
    std::lock_guard<std::mutex> g(mu_);
    if (!sdpa_[d]) {
      sdpa_[d] = std::make_unique<cuda::CudnnSdpa>(static_cast<int>(d));
      if (!sdpa_enabled_) sdpa_[d]->set_enabled(false);
    }
    return *sdpa_[d];
  }

 public:
  void use_cudnn_attention(bool on) {
    std::lock_guard<std::mutex> g(mu_);
    sdpa_enabled_ = on;
    for (auto& s : sdpa_)
      if (s) s->set_enabled(on);
  }
  cuda::CudnnSdpa::Counts cudnn_attention_counts() {
    cuda::CudnnSdpa::Counts total;
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& s : sdpa_) {
      if (!s) continue;
      const auto c = s->counts();
      total.forward += c.forward, total.backward += c.backward, total.plans += c.plans;
      total.refused += c.refused;
      if (!c.last_refusal.empty()) total.last_refusal = c.last_refusal;
    }
    return total;
  }

 private:
  // The current device's word set_philox_shift() writes; allocated at the first capture that draws.
  uint64_t* shift_slot() {
    const size_t d = current();
    std::lock_guard<std::mutex> g(mu_);
    uint64_t*& w = shift_dev_[d];
    if (!w) {
      TR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&w), sizeof(uint64_t)));
      // On the compute stream, ordered before set_philox_shift's write (cudaMemset's legacy stream is not).
      TR_CUDA_CHECK(cudaMemsetAsync(w, 0, sizeof(uint64_t), allocators_[d]->stream()));
    }
    return w;
  }
  // What a random kernel adds to its Philox offset on the device: the shift word while a graph is captured
  // (its launches then draw each step's numbers), nothing otherwise.
  const uint64_t* captured_shift(double p) { return capturing_ && p > 0 ? shift_slot() : nullptr; }
  std::vector<std::unique_ptr<CudaAllocator>> allocators_;
  CaptureScratch* capturing_ = nullptr;  // while capture_graph() runs: the scratch its graph keeps
  // Per device (index), created at first use on it (no handle on a machine without a GPU).
  std::vector<uint64_t*> shift_dev_;
  mutable std::mutex mu_;
  std::vector<cublasHandle_t> blas_;
  std::vector<std::unique_ptr<LtGemm>> lt_;
  std::vector<std::unique_ptr<cuda::CudnnSdpa>> sdpa_;
  bool sdpa_enabled_ = true;
  // Mapped host memory kernels flag a bad index in ({value, kind, limit}); see report_device_errors().
  int64_t* bad_host_ = nullptr;
  int64_t* bad_dev_ = nullptr;
  int64_t* bad_index() {
    std::lock_guard<std::mutex> g(mu_);
    if (!bad_host_) {
      TR_CUDA_CHECK(
          // Portable: every device's kernels may flag into it, not only the device current now.
          cudaHostAlloc(reinterpret_cast<void**>(&bad_host_), 3 * sizeof(int64_t),
                        cudaHostAllocMapped | cudaHostAllocPortable));
      bad_host_[0] = bad_host_[2] = 0;
      bad_host_[1] = cuda::kBadNone;
      TR_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&bad_dev_), bad_host_, 0));
    }
    return bad_dev_;
  }
  void legacy_gemm(const backend::GemmArgs& g);
};

void CudaBackend::gemm(const backend::GemmArgs& g) {
  TR_CHECK(g.c_ld() >= g.n && (g.batch == 1 || g.c_ld() == g.n),
           "matmul: rows of c {} apart for {} columns in a batch of {}", g.c_ld(), g.n, g.batch);
  {
    AllocatorScratch scratch(allocator(g.c.device().index), capturing_);  // max-autotune's trial outputs
    if (lt().run(g, stream(), scratch)) return;
  }
  if (g.epilogue == backend::GemmEpilogue::none) return legacy_gemm(g);
  // An epilogue cuBLASLt has no algorithm for: the bias as the initial c of a beta = 1 product (as the CPU
  // does), then the GELU as its own pass with the pre-activation kept in aux.
  TR_CHECK(g.batch == 1 && g.beta == 0.0 && g.c_ld() == g.n && g.bias.defined() && g.bias.numel() == g.n &&
               g.bias.dtype() == g.c.dtype() && g.bias.is_contiguous(),
           "gemm epilogue: needs batch 1, beta 0, dense rows and a contiguous [{}] bias of c's dtype", g.n);
  TR_CHECK(g.epilogue != backend::GemmEpilogue::bias_gelu ||
               (g.aux.defined() && g.aux.numel() == g.m * g.n && g.aux.dtype() == g.c.dtype() &&
                g.aux.is_contiguous()),
           "gemm epilogue: bias_gelu needs a contiguous aux of c's size and dtype");
  Strided rows;
  rows.nd = 2;
  rows.shape[0] = g.m;
  rows.shape[1] = g.n;
  rows.stride[0][0] = 0;  // the bias row broadcast over the m rows
  rows.stride[0][1] = 1;
  rows.stride[1][0] = g.n;
  rows.stride[1][1] = 1;
  const DType dt = g.c.dtype();
  cuda::copy(stream(), g.bias.data_ptr(), dt, g.c.data_ptr(), dt, rows, g.m * g.n);
  backend::GemmArgs plain = g;
  plain.epilogue = backend::GemmEpilogue::none;
  plain.beta = 1.0;
  legacy_gemm(plain);
  if (g.epilogue == backend::GemmEpilogue::bias_gelu) {
    Strided flat;
    flat.nd = 1;
    flat.shape[0] = g.m * g.n;
    flat.stride[0][0] = flat.stride[1][0] = 1;
    cuda::copy(stream(), g.c.data_ptr(), dt, g.aux.data_ptr(), dt, flat, g.m * g.n);
    cuda::unary(stream(), backend::UnaryOp::gelu_tanh, dt, g.aux.data_ptr(), g.c.data_ptr(), flat, g.m * g.n);
  }
}

void CudaBackend::legacy_gemm(const backend::GemmArgs& g) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, keep the flags.
  cudaDataType_t t, tc;
  cublasComputeType_t compute, unused;
  if (!gemm_types(g.a.dtype(), g.tf32, &t, &compute) || !gemm_types(g.c.dtype(), g.tf32, &tc, &unused))
    fail("matmul: dtype {} is not supported on cuda", dtype_name(g.c.dtype()));
  const float af = static_cast<float>(g.alpha), bf = static_cast<float>(g.beta);
  const double ad = g.alpha, bd = g.beta;
  const void* alpha =
      g.c.dtype() == DType::f64 ? static_cast<const void*>(&ad) : static_cast<const void*>(&af);
  const void* beta =
      g.c.dtype() == DType::f64 ? static_cast<const void*>(&bd) : static_cast<const void*>(&bf);
  TR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle(), g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k), alpha, g.b.data_ptr(), t,
      static_cast<int>(g.ldb), g.stride_b, g.a.data_ptr(), t, static_cast<int>(g.lda), g.stride_a, beta,
      g.c.data_ptr(), tc, static_cast<int>(g.c_ld()), g.m * g.c_ld(), static_cast<int>(g.batch), compute,
      CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::embedding_backward(const Tensor& gy, const Tensor& ids, const Tensor& gweight) {
  // Grouped on the device (cuda::embedding_backward): no copy of the ids to the host, no synchronization,
  // scratch from the caching allocator (counted, retried on out-of-memory like any tensor). A bad id was
  // flagged by the forward's kernel and is reported at the next synchronization; it adds nothing here.
  const int64_t n = ids.numel(), v = gweight.shape()[0];
  TR_CHECK(n < (int64_t{1} << 31), "embedding backward: {} ids exceed CUB's 32-bit item count", n);
  AllocatorScratch scratch(allocator(gweight.device().index), capturing_);
  cuda::embedding_backward(stream(), gy.dtype(), gy.data_ptr(), ids.data<int64_t>(), n, gweight.data_ptr(), v,
                           gweight.shape()[1], scratch);
}

std::unique_ptr<backend::Backend::DeviceGraph> CudaBackend::capture_graph(int device_index,
                                                                          const std::function<void()>& work) {
  TR_CHECK(device_index >= 0 && device_index < static_cast<int>(allocators_.size()),
           "cuda:{} does not exist ({} GPUs present)", device_index, allocators_.size());
  int current = 0;
  TR_CUDA_CHECK(cudaGetDevice(&current));
  TR_CHECK(current == device_index, "CUDA graph capture on cuda:{} while cuda:{} is current", device_index,
           current);
  TR_CHECK(!capturing_, "CUDA graph capture inside another capture");
  const cudaStream_t s = allocators_[static_cast<size_t>(device_index)]->stream();
  shift_slot();  // allocated now: nothing but stream work once capturing
  CaptureScratch scratch;
  // Relaxed: the caching allocator may cudaMalloc a segment for the graph's scratch while capturing (that
  // memory then belongs to the graph); a host synchronization still ends the capture with an error.
  TR_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  capturing_ = &scratch;
  std::string why;
  try {
    work();
  } catch (const std::exception& e) {
    why = e.what();
  }
  capturing_ = nullptr;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  if (why.empty() && ended != cudaSuccess)
    why = fmt::format("cudaStreamEndCapture: {}", cudaGetErrorString(ended));
  cudaGraphExec_t exec = nullptr;
  if (why.empty()) {
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    if (made != cudaSuccess) why = fmt::format("cudaGraphInstantiate: {}", cudaGetErrorString(made));
  }
  if (graph) cudaGraphDestroy(graph);
  if (!why.empty()) {
    cudaGetLastError();  // a capture's errors are not sticky: the stream works on
    fail("the step could not be captured as a CUDA graph: {}", why);
  }
  return std::make_unique<CudaGraph>(exec, s, std::move(scratch.blocks));
}

CudaBackend& instance() {
  static CudaBackend b;
  return b;
}

}  // namespace

cudaStream_t compute_stream(int device) { return instance().stream_of(device); }
backend::Backend& backend_instance() { return instance(); }
void use_cudnn_attention(bool on) { instance().use_cudnn_attention(on); }
CudnnSdpa::Counts cudnn_attention_counts() { return instance().cudnn_attention_counts(); }
void report_device_errors() { instance().report_device_errors(); }
}  // namespace tr::cuda
