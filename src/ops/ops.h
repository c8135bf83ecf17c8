// The op list without autograd: shape/dtype/device checks, output allocation and dispatch to a backend.
// On the meta device every op allocates its outputs (so memory is counted) and runs no kernel.
// Differentiable wrappers with their backward formulas live in autograd/functions*.cpp.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace tr::ops {

// A profiler span named `name` on `device`'s backend for this object's lifetime (NVTX on a GPU: a step's
// forward, backward and update as spans in Nsight Systems, over their kernels). Nothing on the CPU or meta.
class Range {
 public:
  Range(Device device, const char* name);
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  backend::Backend* be_ = nullptr;
};

using backend::BinaryOp;
using backend::ReduceOp;
using backend::UnaryOp;

// ---- creation and movement
Allocator& allocator_for(Device device);
// Whether the device's backend runs fused elementwise chains (torch_compile's inductor fusion).
bool fuses_elementwise(Device device);
// What torch_compile's max-autotune did on the device's GEMMs so far ("" where it does not tune).
std::string autotune_summary(Device device);
// What cuDNN's fused attention ran on the GPUs so far ("" off a GPU or when it ran nothing and refused
// nothing).
std::string cudnn_attention_summary(Device device);
Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor zeros_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
// start, start + 1, ..., start + n - 1
Tensor arange(int64_t n, DType dtype = DType::i64, Device device = Device::cpu(), double start = 0.0);
Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::f32, Device device = Device::cpu(),
             double mean = 0.0, double std = 1.0);
Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::f32, Device device = Device::cpu(),
            double lo = 0.0, double hi = 1.0);
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu());
template <typename T>
std::vector<T> to_vector(const Tensor& t);  // any device, converted to T
// Copies src into dst (same shape; any strides, dtypes and devices).
void copy_(const Tensor& dst, const Tensor& src);
// Sets every element of contiguous `t` to `value` in place (nothing on the meta device).
void fill_(const Tensor& t, double value);
Tensor to_device(const Tensor& t, Device device);
Tensor to_dtype(const Tensor& t, DType dtype);
// dst = x * s in dst's dtype and layout (Backend::scaled_copy); x (contiguous f32/f64, same device) is
// consumed: its values afterwards are unspecified. s: one element of x's dtype.
void scaled_copy_(const Tensor& dst, const Tensor& x, const Tensor& s);
Tensor contiguous(const Tensor& t);
Tensor clone(const Tensor& t);

// ---- views (share storage)
Tensor view(const Tensor& t, Shape shape);     // one dim may be -1; throws if strides do not allow it
Tensor reshape(const Tensor& t, Shape shape);  // view when possible, else a contiguous copy
bool can_view(const Tensor& t, const Shape& shape);
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1);
Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor expand(const Tensor& t, const Shape& shape);
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor squeeze(const Tensor& t, int64_t dim);
Shape infer_shape(const Shape& shape, int64_t numel, const char* op);

// ---- elementwise
Tensor unary(UnaryOp op, const Tensor& x);
void unary_(UnaryOp op, const Tensor& x);  // in place; x contiguous
Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& gy);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// out op= b in place (out must be contiguous; b broadcastable to out).
void binary_(BinaryOp op, const Tensor& out, const Tensor& b);
Tensor affine(const Tensor& x, double alpha, double beta);  // alpha * x + beta
Tensor pow_scalar(const Tensor& x, double exponent);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// Sums a broadcast gradient back down to `shape`.
Tensor sum_to_shape(const Tensor& g, const Shape& shape);

// ---- reductions
Tensor reduce(ReduceOp op, const Tensor& x, std::vector<int64_t> dims, bool keepdim);  // empty dims: all
// reduce (keepdim false) into `out`: contiguous, the result's element count, x's dtype and device.
void reduce_into(ReduceOp op, const Tensor& x, std::vector<int64_t> dims, const Tensor& out);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
struct TopK {
  Tensor values, indices;
};
TopK topk(const Tensor& x, int64_t k);  // along the last dim

// ---- softmax
Tensor softmax(const Tensor& x, int64_t dim, bool log = false);
Tensor softmax_backward(const Tensor& y, const Tensor& gy, int64_t dim, bool log = false);

// ---- matmul
// a [..., m, k] @ b [..., k, n] with broadcast batch dims; 1-D operands are not promoted (use unsqueeze).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// matmul whose product stays f32 for bf16/f16 operands (the accumulator unrounded); as matmul otherwise.
Tensor matmul_f32(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// out = alpha * a @ b + beta * out, batched as matmul; out of the product's shape, in a's dtype or f32 for
// bf16/f16 operands, contiguous or (one matrix) rows in a wider buffer: a view of a padded [m, ld] buffer.
void matmul_into(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                 double alpha, double beta);
// out = alpha * op(a) @ op(b) + beta * out, in place; a, b, out 2-D, out contiguous.
void addmm_(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
            double alpha = 1.0, double beta = 1.0);
// Thin SVD of a 2-D f32/f64 matrix, as torch.linalg.svd(a, full_matrices=False): u [m, k], s [k] descending,
// vh [k, n], k = min(m, n). A backend that declines (Backend::svd) gets it computed on the host and copied
// back. Throws on a non-finite input (LAPACK does not converge).
struct Svd {
  Tensor u, s, vh;
};
Svd svd(const Tensor& a);
// The leading r = u's columns (or vh's rows) of the factors, written into u [m, r] and/or vh [r, n]
// (contiguous, a's dtype and device; either may be undefined): no [m, k] factor is allocated.
void svd_into(const Tensor& a, const Tensor& u, const Tensor& vh);
// One sentence when `device` emulates matmuls of bf16/f16 operands (widened to f32) instead of running them
// natively, naming what the hardware offers; "" when native (a GPU) or not asked (f32, meta).
std::string gemm_precision_note(Device device, DType operands);
// How `device` runs bf16/f16 matmuls natively and faster than f32 (a CPU's AMX or AMD Zen 4/5's AVX512_BF16);
// none where they are widened, and on meta.
backend::NativeHalf native_half_matmul(Device device, DType operands);
// x [..., in] @ w[out, in]^T + bias[out].
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);
// gelu_tanh(x @ w^T + bias) in one GEMM with a bias + GELU epilogue; pre keeps x @ w^T + bias (the GELU's
// input, for the backward).
struct LinearGelu {
  Tensor y, pre;
};
LinearGelu linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias);

// ---- normalization
struct NormOut {
  Tensor y, mean, rstd;  // mean undefined for rms_norm
  Tensor sum;            // the add_* forms: x + residual, the tensor that was normalized
};
NormOut layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
// layer_norm(x + residual) in one pass, also returning the sum (the residual stream).
NormOut add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, double eps);
struct NormGrads {
  Tensor gx, gw, gb;
};
// x: the normalized tensor (the sum for the add_* forms). gx_add, when defined, is added to gx in the same
// pass (the residual stream's own gradient).
NormGrads layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                              const Tensor& gy, bool need_gx, bool need_gw, bool need_gb,
                              const Tensor& gx_add = Tensor());
NormOut rms_norm(const Tensor& x, const Tensor& w, double eps);
NormOut add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, double eps);
NormGrads rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& gy,
                            bool need_gx, bool need_gw, const Tensor& gx_add = Tensor());

// ---- loss, embedding, rope, dropout
struct CrossEntropyOut {
  Tensor loss;  // per-row loss (f32, or f64 for f64 logits), 0 where ignored
  Tensor lse;   // per-row logsumexp
};
// label_smoothing e in [0, 1], torch's: each row's target is (1 - e) * onehot(label) + e / V, so the loss is
// (1 - e) * (lse - x[label]) + e * (lse - mean(x)); the default 0 is the plain loss.
CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                              double label_smoothing = 0.0);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                              const Tensor& grad_loss, int64_t ignore_index, double label_smoothing = 0.0);
// The same, overwriting `logits` (contiguous) with its gradient: no second [rows, V] buffer.
void cross_entropy_backward_(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                             const Tensor& grad_loss, int64_t ignore_index, double label_smoothing = 0.0);
// The gradient of f32 `logits` written straight into `out` (contiguous, their shape, bf16 or f16): each value
// the f32 gradient rounded once, as to_dtype of cross_entropy_backward would give, without the f32 [rows, V]
// gradient ever stored (the chunked LM head's half GEMM operand).
void cross_entropy_backward_into(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                 const Tensor& grad_loss, int64_t ignore_index, const Tensor& out,
                                 double label_smoothing = 0.0);
// cross_entropy with the gradient for grad_loss (f32, one per row) made in the same call into `glogits`: the
// logits themselves or, for f32 logits, a bf16/f16 tensor of their shape; either contiguous or a matrix's
// rows in a wider buffer (cross_entropy reads such logits as they are too). The loss
// and lse of cross_entropy; the gradient of cross_entropy_backward_ / _into up to f32 rounding (the CPU's
// fused kernel scales the exps of the sum instead of taking exp(x - lse) again).
CrossEntropyOut cross_entropy_with_grad_(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                                         const Tensor& grad_loss, const Tensor& glogits,
                                         double label_smoothing = 0.0);
Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor embedding_backward(const Tensor& gy, const Tensor& ids, int64_t num_rows);
// cos/sin tables [P, D/2] (f32) for the given head dim and base; see rope().
struct RopeTables {
  Tensor cos, sin;
};
RopeTables rope_tables(int64_t max_positions, int64_t head_dim, double theta, Device device = Device::cpu());
// Tables from explicit inverse frequencies (D/2 of them), e.g. after rope scaling; angles p * inv_freq in
// f32.
RopeTables rope_tables_from_inv_freq(int64_t max_positions, const std::vector<float>& inv_freq,
                                     Device device = Device::cpu());
Tensor rope(const Tensor& x, const RopeTables& tables, const Tensor& positions, bool seq_major, bool inverse);
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset);
// Fused attention (Backend::attention): q [B, H, T, D], k/v [B, Hkv, S, D], key_keep bool [B, S] or
// undefined; window > 0 (causal): a sliding window of that many keys per query, itself included.
struct AttentionOut {
  Tensor out, lse;
};
// The two ways attention() computes the same function: the backend's fused (tiled) kernel, or the blocked
// GEMM form below. `automatic` takes attention_form()'s pick; the others force one (benchmarks, tests).
// fused_cudnn is the fused form where a GPU's cuDNN attention may take the call (half precision): it runs as
// fused, and a meta dry run standing in for a GPU also counts the workspace cuDNN takes (the dropout mask;
// the backward's accumulators) where backend/cudnn_attention_rule.h says cuDNN takes the call. On a GPU the
// backend itself picks cuDNN or its own kernels for either fused form (backend::cuda_use_cudnn_attention
// turns cuDNN off).
enum class AttentionForm { automatic, fused, blocked, fused_cudnn };
// attention()'s pick for these operands, from their device, dtype, head dim and whether the probabilities
// are dropped alone, so a run, its dry run and its rerun pick alike. The fused kernel everywhere it runs the
// case at speed: on the CPU always (its sgemm or native bf16 tiles beat the blocked form at every length
// measured, bench/bench_attention, dropout included); on a GPU in bf16/f16 cuDNN's fused attention or the
// tensor-core flash kernel for head dims that are multiples of 8 up to 128 (the blocked form's GEMMs above),
// f32/f64 the tiled kernel without dropout (with it, the blocked form's GEMMs).
AttentionForm attention_form(const Tensor& q, const Tensor& k, bool dropout = false);
// The same rule by device type: what a dry run on the meta device asks for the device it stands in for
// (trainer estimate --device cuda), so its peak counts the form the real run takes.
AttentionForm attention_form_for(DeviceType device, DType dtype, int64_t head_dim, bool dropout);
// Dropout needs dropout.p in [0, 1) and applies to the probabilities in either form. The fused form reads
// q/k/v views in place (a contiguous head dim suffices: GPT-2's split c_attn, Llama's heads), returns out as
// a [B, H, T, D] view of [B, T, H, D] memory (merging heads is then a view) and gives the gradients the
// inputs' layout - q/k/v views of one projection get views of one buffer laid out as it, which split's
// backward passes on whole - so a layer makes no head split/merge copies.
AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep, bool causal,
                       double scale, int64_t window = 0, AttentionForm form = AttentionForm::automatic,
                       backend::AttentionDropout dropout = {});
struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                                  bool causal, double scale, const Tensor& out, const Tensor& lse,
                                  const Tensor& dout, int64_t window = 0,
                                  AttentionForm form = AttentionForm::automatic,
                                  backend::AttentionDropout dropout = {});
// The same attention computed a block of `block` queries at a time (0: about 2^26 score elements per block)
// with both products as batched GEMMs and the softmax as a row kernel (ops/attention_blocked.cpp); what
// attention() runs where the fused kernels do not cover the case (attention_form_for). Same outputs (lse
// included), so either backward fits either forward. Attention dropout (backend.h): the mask dropout() on the
// [B, H, T, S] probabilities would draw, the same in forward and backward.
using AttentionDropout = backend::AttentionDropout;
AttentionOut attention_blocked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                               bool causal, double scale, int64_t block = 0, AttentionDropout dropout = {},
                               int64_t window = 0);
AttentionGrads attention_blocked_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& key_keep, bool causal, double scale,
                                          const Tensor& out, const Tensor& lse, const Tensor& dout,
                                          int64_t block = 0, AttentionDropout dropout = {},
                                          int64_t window = 0);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);

// ---- optimizer passes (ops/optim.cpp; the semantics are backend.h's)
// {sum of squares of the unscaled gradients, count of non-finite values}, f64 [2] on `device` (undefined
// gradients are skipped).
Tensor grad_stats(const std::vector<Tensor>& grads, double inv_scale, Device device);
// grad_stats of one contiguous gradient written into `stats` (f64 [2] on its device, overwritten): a
// per-tensor norm that allocates nothing (GrokAdamW's per-parameter clipping).
void grad_stats_into(const Tensor& grad, const Tensor& stats);
// stats += grad_stats of one gradient unscaled by `inv_scale` (stats f64 [2] on the gradient's device): a
// norm summed over gradients met one at a time (the optimizers that update during backward).
void grad_stats_add(const Tensor& grad, double inv_scale, const Tensor& stats);
void transform_grads(const std::vector<std::pair<Tensor, Tensor>>& src_dst,
                     const backend::Backend::GradTransform& t);
void fused_adamw(const std::vector<backend::Backend::AdamWTensors>& tensors,
                 const backend::Backend::AdamWHyper& h, const backend::Backend::GradTransform& t);
void adamw_8bit(const std::vector<backend::Backend::AdamW8bitTensors>& tensors, const Tensor& signed_map,
                const Tensor& unsigned_map);
void sgd(const std::vector<backend::Backend::SgdTensors>& tensors, const backend::Backend::SgdHyper& h);
void anyprecision_adamw(const std::vector<backend::Backend::AnyPrecisionTensors>& tensors,
                        const backend::Backend::AnyPrecisionHyper& h);
void elementwise_step(const std::vector<backend::Backend::ElementwiseTensors>& tensors,
                      const backend::Backend::ElementwiseHyper& h);
void elementwise_8bit(const std::vector<backend::Backend::Elementwise8bitTensors>& tensors,
                      const backend::Backend::ElementwiseHyper& h, const Tensor& signed_map);

}  // namespace tr::ops
