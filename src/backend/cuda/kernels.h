// Launchers of the CUDA kernels, on raw device pointers. The .cu files implement them; cuda_backend.cpp
// unpacks tensors into these arguments, so nvcc never compiles the tensor/fmt headers.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/adamw8bit_math.h"
#include "backend/attention_geometry.h"
#include "backend/op_kinds.h"
#include "core/dtype.h"

namespace tr::cuda {

constexpr int kMaxDims = 8;

// The stream every launcher queues its work on (cudaStream_t, declared here without the CUDA headers): the
// backend's compute stream of the device. Nothing goes to the legacy default stream implicitly, so a step can
// move to a stream of its own (CUDA graph capture, NCCL overlap) by changing what the backend passes.
using Stream = struct CUstream_st*;

// Kernel scratch (partial sums, chunk lists, sort buffers) from the backend's caching allocator, not from
// cudaMallocAsync's own pool: counted in the allocator's statistics and peak, an out-of-memory there is the
// allocator's (auto_find_batch_size retries it), and empty_cache returns it. A block stays taken until the
// Scratch is destroyed, after the launcher has queued its kernels; like a tensor's, it is reused only by work
// queued later on the same stream.
class Scratch {
 public:
  virtual void* take(size_t bytes) = 0;

 protected:
  ~Scratch() = default;
};

// Geometry of up to three operands over one logical shape (element strides).
struct Strided {
  int nd = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[3][kMaxDims] = {};
};

using backend::BinaryOp;
using backend::ReduceOp;
using backend::UnaryOp;

void copy(Stream stream, const void* src, DType st, void* dst, DType dt, const Strided& g, int64_t n);
void fill(Stream stream, void* out, DType dt, int64_t n, double value);
void arange(Stream stream, void* out, DType dt, int64_t n, double start, double step);
// shift: as dropout's below (a captured step's draw moves with each replay: NEFTune's noise).
void random_normal(Stream stream, void* out, DType dt, int64_t n, double mean, double std, uint64_t seed,
                   uint64_t offset, const uint64_t* shift = nullptr);
void random_uniform(Stream stream, void* out, DType dt, int64_t n, double lo, double hi, uint64_t seed,
                    uint64_t offset, const uint64_t* shift = nullptr);
void unary(Stream stream, UnaryOp op, DType dt, const void* x, void* y, const Strided& g, int64_t n);
void unary_backward(Stream stream, UnaryOp op, DType dt, const void* x, const void* gy, void* gx, int64_t n);
void binary(Stream stream, BinaryOp op, DType dt, const void* a, const void* b, void* out, const Strided& g,
            int64_t n);
void affine(Stream stream, DType dt, const void* x, void* y, int64_t n, double alpha, double beta);
void pow_scalar(Stream stream, DType dt, const void* x, void* y, int64_t n, double exponent);
void masked_fill(Stream stream, DType dt, const void* x, const bool* mask, void* y, const Strided& g,
                 int64_t n, double value);
// A fused elementwise chain (Backend::FusedStage; torch_compile's inductor fusion): per element, the stages
// in order, each value rounded to the dtype as the unfused kernel stores it, stored where `out` >= 0.
// Operands: a tensor index >= 0 or -1 - k for stage k's value. At most kFusedStages stages
// (Backend::kMaxFusedStages) over kFusedTensors contiguous tensors of n elements; shift as dropout's below.
constexpr int kFusedStages = 16, kFusedTensors = 3 * kFusedStages;
struct FusedChainStage {
  enum class Kind : uint8_t { unary, unary_backward, binary, affine, dropout } kind = Kind::binary;
  UnaryOp unary = UnaryOp::neg;
  BinaryOp binary = BinaryOp::add;
  int32_t in[2] = {0, 0};
  int32_t out = -1;
  double alpha = 1.0, beta = 0.0;  // affine: alpha x + beta; dropout: alpha = p (beta: set at launch)
  uint64_t seed = 0, offset = 0;
};
struct FusedChain {
  int stages = 0;
  FusedChainStage stage[kFusedStages];
  void* tensor[kFusedTensors] = {};
};
void fused_elementwise(Stream stream, DType dt, const FusedChain& chain, int64_t n, const uint64_t* shift);
// shift (device memory, or null): added to offset when the kernel runs - a CUDA graph captured once draws
// new numbers at each launch (Backend::set_philox_shift). The same for the attention blocks below.
void dropout(Stream stream, DType dt, const void* x, void* y, int64_t n, double p, uint64_t seed,
             uint64_t offset, const uint64_t* shift = nullptr);
// y (n elements, 16-byte aligned, a half or f32 type) = 1 where dropout() with (p, seed, offset) keeps the
// element, 0 where it drops it: the mask cuDNN's attention reads.
void dropout_keep_mask(Stream stream, DType dt, void* y, int64_t n, double p, uint64_t seed, uint64_t offset,
                       const uint64_t* shift);
// *p = value, in stream order (no host synchronization, unlike a copy from pageable memory).
void set_u64(Stream stream, uint64_t* p, uint64_t value);

void reduce(Stream stream, ReduceOp op, DType dt, const void* x, void* y, int64_t outer, int64_t r,
            int64_t inner, Scratch& scratch);
void argmax(Stream stream, DType dt, const void* x, int64_t* y, int64_t outer, int64_t r, int64_t inner);
void topk(Stream stream, DType dt, const void* x, void* values, int64_t* indices, int64_t rows, int64_t n,
          int64_t k);
void softmax(Stream stream, DType dt, const void* x, void* y, int64_t rows, int64_t n, bool log);
void softmax_backward(Stream stream, DType dt, const void* y, const void* gy, void* gx, int64_t rows,
                      int64_t n, bool log);

// Statistics (mean, rstd, loss, lse) are f32, or f64 for f64 data.
// res/sum (null when unused): the fused residual add, sum = x + res normalized instead of x. gadd (null when
// unused): added to gx before rounding.
void layer_norm(Stream stream, DType dt, const void* x, const void* w, const void* b, void* y, void* mean,
                void* rstd, int64_t rows, int64_t n, double eps, const void* res, void* sum);
void layer_norm_backward(Stream stream, DType dt, const void* x, const void* w, const void* mean,
                         const void* rstd, const void* gy, void* gx, void* gw, void* gb, int64_t rows,
                         int64_t n, const void* gadd, Scratch& scratch);
void rms_norm(Stream stream, DType dt, const void* x, const void* w, void* y, void* rstd, int64_t rows,
              int64_t n, double eps, const void* res, void* sum);
void rms_norm_backward(Stream stream, DType dt, const void* x, const void* w, const void* rstd,
                       const void* gy, void* gx, void* gw, int64_t rows, int64_t n, const void* gadd,
                       Scratch& scratch);
// A label outside [0, v) that is not ignore_index is flagged (kBadLabel); its row's loss and gradient are 0.
// Rows of v logits ldx apart (v, or a padded buffer's row stride). smoothing: torch's label_smoothing
// (backend.h), 0 for the plain loss.
void cross_entropy(Stream stream, DType dt, const void* logits, int64_t ldx, const int64_t* labels,
                   void* loss, void* lse, int64_t rows, int64_t v, int64_t ignore_index, double smoothing,
                   int64_t* bad);
// glogits in `gdt`: the logits' dtype, or bf16/f16 for f32 logits (the f32 value rounded once); its rows ldg
// apart.
void cross_entropy_backward(Stream stream, DType dt, const void* logits, int64_t ldx, const int64_t* labels,
                            const void* lse, const void* grad_loss, void* glogits, DType gdt, int64_t ldg,
                            int64_t rows, int64_t v, int64_t ignore_index, double smoothing);
// Both in one kernel (the loss pass, then the gradient from the row's fresh logsumexp): glogits may be the
// logits themselves. The loss and lse bits are cross_entropy's, the gradient's cross_entropy_backward's.
void cross_entropy_with_grad(Stream stream, DType dt, const void* logits, int64_t ldx, const int64_t* labels,
                             void* loss, void* lse, const void* grad_loss, void* glogits, DType gdt,
                             int64_t ldg, int64_t rows, int64_t v, int64_t ignore_index, double smoothing,
                             int64_t* bad);
// An id outside [0, v) is flagged (kBadEmbeddingIndex) and its row is 0.
void embedding(Stream stream, DType dt, const void* weight, const int64_t* ids, void* out, int64_t n,
               int64_t v, int64_t d, int64_t* bad);
// Deterministic scatter-add without a host round trip: the n rows of gy are grouped by id on the device
// (a stable radix sort of (id, row) pairs, then runs of one id), and each id's rows are summed in row order.
// Ids outside [0, v) (flagged by the forward) add nothing. Fewer than 2^31 ids (CUB's item count).
void embedding_backward(Stream stream, DType dt, const void* gy, const int64_t* ids, int64_t n, void* gw,
                        int64_t v, int64_t d, Scratch& scratch);
// Index errors kernels flag without a host sync, in `bad` (three int64 of mapped host memory the backend
// reads at its next synchronization): the value, its kind, the limit it broke. The offending element gets
// zeros instead of an out-of-range read.
enum BadIndexKind : int64_t { kBadNone = 0, kBadRopePosition = 1, kBadEmbeddingIndex = 2, kBadLabel = 3 };

// A position outside [0, P) is flagged (kBadRopePosition).
void rope(Stream stream, DType dt, const void* x, const float* cos, const float* sin, const int64_t* pos,
          void* y, int64_t B, int64_t H, int64_t T, int64_t D, bool seq_major, bool inverse, int64_t P,
          int64_t* bad);
// Fused attention (see Backend::attention): g's shapes (q [B, H, T, D], k/v [B, KV, S, D]), key mask, dropout
// (Philox seed, offset + *shift where shift is set: a CUDA graph's launch) and each operand's rows (HeadRows:
// any strides, the head dim contiguous). bf16/f16 with a head dim that flash_attention_fits() and rows on
// even elements run the tensor-core flash kernels (flash_attention.cu) on sm_80+; everything else the tiled
// kernels (attention.cu). Without queries the backward leaves dk/dv alone (ops::attention_backward gives
// zeros).
void attention(Stream stream, DType dt, const backend::AttentionGeometry& g, const void* q, const void* k,
               const void* v, void* out, void* lse, const uint64_t* shift);
void attention_backward(Stream stream, DType dt, const backend::AttentionGeometry& g, const void* q,
                        const void* k, const void* v, const void* out, const void* lse, const void* dout,
                        void* dq, void* dk, void* dv, const uint64_t* shift, Scratch& scratch);
// The flash kernels' cases: bf16/f16, head dims that are multiples of 8 up to 128, a device of sm_80+.
bool flash_attention_fits(DType dt, int64_t D);
void flash_attention(Stream stream, DType dt, const backend::AttentionGeometry& g, const void* q,
                     const void* k, const void* v, void* out, void* lse, const uint64_t* shift);
void flash_attention_backward(Stream stream, DType dt, const backend::AttentionGeometry& g, const void* q,
                              const void* k, const void* v, const void* out, const void* lse,
                              const void* dout, void* dq, void* dk, void* dv, const uint64_t* shift,
                              Scratch& scratch);
// Blocked attention's row kernels (Backend::attention_block_softmax / _grad): geometry as the fused kernel
// (keep [B, S] or null); the block's queries t0 .. t0 + tq - 1 against keys 0 .. sk - 1. sdt: the scores'
// dtype (f32/f64), pdt: the probabilities'.
void attention_block_softmax(Stream stream, DType sdt, DType pdt, const void* scores, void* probs, void* lse,
                             const bool* keep, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S,
                             int64_t t0, int64_t tq, int64_t sk, bool causal, int64_t window, double scale,
                             double dropout, uint64_t seed, uint64_t offset, const uint64_t* shift = nullptr);
void attention_block_grad(Stream stream, DType sdt, DType pdt, const void* scores, const void* dp,
                          const void* lse, const void* delta, void* probs, void* dscores, const bool* keep,
                          int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S, int64_t t0, int64_t tq,
                          int64_t sk, bool causal, int64_t window, double scale, double dropout,
                          uint64_t seed, uint64_t offset, const uint64_t* shift = nullptr);

// Multi-tensor passes (Backend::grad_stats / transform_grads / fused_adamw): one launch over a list of
// 64K-element chunks, one block per chunk; the element math is backend/optim_math.h's. Gradients and weight
// copies carry their own dtype. The chunk list goes to the device in stream order (no host sync).
struct GradChunk {
  const void* grad;
  void* dst;  // transform_grads only
  int64_t n;
  DType grad_dtype, dst_dtype;
};
// stats (device, f64 [2]) = {sum of squares, non-finite count}; chunk partials added in chunk order.
void grad_stats(Stream stream, const GradChunk* chunks, int64_t count, double inv_scale, double* stats,
                Scratch& scratch);
void transform_grads(Stream stream, const GradChunk* chunks, int64_t count, double inv_scale, double max_norm,
                     const double* stats, Scratch& scratch);
struct AdamWChunk {
  void* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  void* copy;  // the parameter rounded into copy_dtype after the update, or null
  int64_t n;
  int decay;
  DType grad_dtype, copy_dtype;
};
// dt (the parameters' and moments' dtype) f32 or f64, or bf16/f16 (f32 math, each stored value rounded once);
// stats may be null when max_norm <= 0.
void fused_adamw(Stream stream, DType dt, const AdamWChunk* chunks, int64_t count, double lr,
                 double weight_decay, double beta1, double beta2, double eps, int64_t step, double inv_scale,
                 double max_norm, const double* stats, Scratch& scratch);

// torchdistx's AnyPrecisionAdamW over 64K-element chunks (one block each); each tensor f32/bf16/f16 as its
// dtype says (comp null: no Kahan summation). Element math: optim_math.h's anyprecision_element.
struct AnyPrecisionChunk {
  void* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  void* comp;
  int64_t n;
  int decay;
  DType param_dtype, grad_dtype, m_dtype, v_dtype, c_dtype;
};
void anyprecision_adamw(Stream stream, const AnyPrecisionChunk* chunks, int64_t count, double lr,
                        double weight_decay, double beta1, double beta2, double eps, int64_t step,
                        Scratch& scratch);

// bitsandbytes' blockwise 8-bit AdamW or AdEMAMix (k.ademamix: the slow EMA's c3/absmax3 or s3, else null)
// on one tensor (one CUDA block per 256 elements; qs/qu the signed and unsigned code maps on the device), and
// its 32-bit-state kernel. Element math: backend/adamw8bit_math.h.
void adamw_8bit_blockwise(Stream stream, float* p, const float* g, uint8_t* c1, uint8_t* c2, uint8_t* c3,
                          float* absmax1, float* absmax2, float* absmax3, int64_t n,
                          const backend::Adam8bitConsts& k, const float* qs, const float* qu);
void adamw_32bit_state(Stream stream, float* p, const float* g, float* s1, float* s2, float* s3, int64_t n,
                       const backend::Adam8bitConsts& k);

// One tensor's SGD step in place (buf null: no momentum); element math: backend/optim_math.h's sgd_element.
void sgd(Stream stream, DType dt, void* p, const void* g, void* buf, int64_t n, double lr,
         double weight_decay, double momentum, double dampening, bool nesterov, bool first);

// One tensor's step of bitsandbytes' one-state 8-bit kernel (rules lion and rmsprop_bnb; qs: the signed code
// map on the device). Element math: backend/adamw8bit_math.h's state8bit_*.
void elementwise_8bit(Stream stream, const backend::ElementwiseHyper& h, double weight_decay, float* p,
                      const float* g, uint8_t* c1, float* absmax1, int64_t n, const float* qs);

// One tensor's step of an element-wise optimizer in place (s2 null: none); element math:
// backend/optim_math.h's elementwise_update.
void elementwise_step(Stream stream, DType dt, const backend::ElementwiseHyper& h, double weight_decay,
                      void* p, const void* g, void* s1, void* s2, int64_t n);

}  // namespace tr::cuda
