// The kernel interface every backend implements (cpu/, cuda/; no_cuda/ when built without CUDA).
// Kernels see plain tensors with the geometry the ops layer prepared (documented per method) and write into
// outputs the ops layer allocated. Backends never see autograd.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/adamw8bit_math.h"
#include "backend/attention_geometry.h"
#include "backend/op_kinds.h"
#include "core/allocator.h"
#include "core/tensor.h"

namespace tr::backend {

// The CPU libraries the host kernels call, with their versions and configuration: oneDNN (f32/bf16 GEMMs),
// OpenBLAS (f64 GEMMs) - "oneDNN 2.6.3, OpenBLAS 0.3.21 (its build line; core SkylakeX)".
std::string cpu_library_versions();

const char* unary_name(UnaryOp op);
const char* binary_name(BinaryOp op);

// What a GEMM does to its product before storing it (cuBLASLt epilogues on a GPU; the CPU applies the same
// after its GEMM). bias: every row of c gets `bias` ([N], c's dtype) added in the accumulation precision;
// bias_gelu: additionally aux ([M, N], c's dtype) keeps the biased product and c = gelu_tanh(aux). Both need
// batch 1 and beta 0.
enum class GemmEpilogue { none, bias, bias_gelu };

// Attention dropout with the Philox seed and offset dropout() on the [B, H, T, S] probabilities would use:
// element ((b * H + h) * T + t) * S + s kept when uniform(seed, offset, index) >= p, then scaled by
// 1 / (1 - p); forward and backward draw the same mask. p = 0: none.
struct AttentionDropout {
  double p = 0.0;
  uint64_t seed = 0, offset = 0;
};

// Rows of an attention operand [B, H, T, D] whose head dim is contiguous (Backend::attention).
inline HeadRows head_rows(const Tensor& t) {
  return t.defined() ? HeadRows{t.stride(0), t.stride(1), t.stride(2)} : HeadRows{};
}

// The kernels' view of an attention call: shapes from q [B, H, T, D] and k [B, KV, S, D], the key mask, the
// dropout, and each given operand's rows.
inline AttentionGeometry attention_geometry(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& key_keep, bool causal, int64_t window, double scale,
                                            const AttentionDropout& drop, const Tensor& out,
                                            const Tensor& dout = {}, const Tensor& dq = {},
                                            const Tensor& dk = {}, const Tensor& dv = {}) {
  AttentionGeometry g{q.size(0), q.size(1), k.size(1),
                      q.size(2), k.size(2), q.size(3),
                      causal,    scale,     key_keep.defined() ? key_keep.data<bool>() : nullptr,
                      window};
  g.rows = {head_rows(q),    head_rows(k),  head_rows(v),  head_rows(out),
            head_rows(dout), head_rows(dq), head_rows(dk), head_rows(dv)};
  return g.with_dropout(drop.p, drop.seed, drop.offset);
}

// Batched GEMM c[b] = alpha * op(a[b]) @ op(b[b]) + beta * c[b], row-major. op(x) = x^T when trans.
// a is stored as [M, K] (or [K, M] when trans_a) with leading dimension lda and batch stride stride_a
// (0 broadcasts); likewise b. c is contiguous [batch, M, N]. a and b share one floating dtype; c has it too,
// or is f32 when a and b are bf16/f16 (the f32 accumulator stored unrounded; no epilogue then).
struct GemmArgs {
  GemmEpilogue epilogue = GemmEpilogue::none;
  Tensor bias, aux;  // the epilogue's operands (contiguous)
  Tensor a, b, c;
  bool trans_a = false, trans_b = false;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, stride_a = 0, stride_b = 0;
  // c's row stride: 0 means n (dense rows). A wider one (batch 1, no epilogue) writes rows of a padded
  // buffer - the LM head's [rows, vocab] logits, whose odd vocabulary (50257) would otherwise give every
  // head GEMM an unaligned leading dimension and keep cuBLASLt off its fast kernels.
  int64_t ldc = 0;
  int64_t c_ld() const { return ldc == 0 ? n : ldc; }
  double alpha = 1.0, beta = 0.0;
  bool tf32 = false;  // f32 inputs rounded to TF32 (10-bit mantissa), as tensor cores read them
  // torch_compile max-autotune: the backend may time its candidate kernels for this shape once and keep the
  // fastest (cuBLASLt's heuristic list on a GPU; the CPU's libraries choose on their own).
  bool autotune = false;
};

// The CPU's native half-precision matmuls, where they beat widening to f32 (Backend::native_half_matmul).
enum class NativeHalf { none, amx, avx512_bf16 };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Allocator& allocator(int device_index) = 0;
  // Waits for queued work (no-op on the CPU).
  virtual void synchronize() {}
  // A named span of the host's timeline for profilers (NVTX on a GPU: the spans Nsight Systems shows over
  // the kernels they launched); nested, each push closed by a pop. Nothing where no profiler listens (CPU).
  virtual void range_push(const char* name) { (void)name; }
  virtual void range_pop() {}
  // Work recorded once and replayed by one launch (a CUDA graph): torch_compile's replay on a GPU.
  class DeviceGraph {
   public:
    virtual ~DeviceGraph() = default;
    // Queues the recorded work again: the same kernels on the same addresses with the same arguments.
    virtual void launch() = 0;
  };
  // Records what `work` queues on device `device_index` into a DeviceGraph without running it (launch() runs
  // it); the kernel scratch it takes stays with the graph. Null when this backend has no such graphs (the
  // CPU: the caller runs the work itself). Throws, with nothing left capturing, when the work cannot be
  // recorded (a host synchronization inside it).
  virtual std::unique_ptr<DeviceGraph> capture_graph(int device_index, const std::function<void()>& work) {
    (void)device_index;
    (void)work;
    return nullptr;
  }
  // Whether the random kernels a graph captured (dropout, attention dropout) add a shift read on the device
  // at launch to their Philox offsets: set_philox_shift() before a launch then draws that step's numbers
  // from a graph captured once. Without it, a graph bakes its offsets in.
  virtual bool philox_shift_on_device() const { return false; }
  // What max-autotune (GemmArgs::autotune) did so far, in a line; "" where the backend does not tune.
  virtual std::string autotune_summary() const { return ""; }
  virtual void set_philox_shift(int device_index, uint64_t shift) {
    (void)device_index;
    (void)shift;
    fail("set_philox_shift: the {} backend has no device graphs", name());
  }
  // One sentence on how this backend's GEMMs compute `operands` (bf16/f16) where a user should know: emulated
  // (widened to f32: what the hardware and its libraries lack and what that costs) or native on a CPU (which
  // kernel); "" when there is nothing to say (a GPU's tensor cores).
  virtual std::string gemm_precision_note(DType operands) const {
    (void)operands;
    return "";
  }
  // How matmuls of `operands` (bf16/f16) run natively here where that beats f32 (a CPU's AMX tiles, or AMD
  // Zen 4/5's AVX512_BF16 dot products); none where they are widened. A GPU answers none: the question is
  // asked of CPUs choosing a default precision.
  virtual NativeHalf native_half_matmul(DType operands) const {
    (void)operands;
    return NativeHalf::none;
  }

  // dst and src have the same shape and device; any strides, any dtypes (converted with
  // round-to-nearest-even).
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  // dst = x * s converted to dst's dtype (RNE): x contiguous f32/f64, s one element of x's dtype on x's
  // device, dst of x's shape in any strides and floating dtype. A gradient scaled by the loss's gradient and
  // rounded into its layout: the CPU does both in its transposing copy (one pass over the f32 values, the
  // bits of the two ops). x's values afterwards are unspecified (the default scales it in place, then
  // copies).
  virtual void scaled_copy(const Tensor& x, const Tensor& s, const Tensor& dst) {
    binary(BinaryOp::mul, x, s.as_strided(x.shape(), Strides(x.shape().size(), 0), s.offset()), x);
    copy(x, dst);
  }
  // out contiguous.
  virtual void fill(const Tensor& out, double value) = 0;
  // out contiguous: out[i] = start + i * step.
  virtual void arange(const Tensor& out, double start, double step) = 0;
  // out contiguous floating: normal(mean, std) or uniform[lo, hi) from Philox words (seed, offset).
  virtual void random_normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) = 0;
  virtual void random_uniform(const Tensor& out, double lo, double hi, uint64_t seed, uint64_t offset) = 0;

  // Elementwise. Inputs are views with out's shape (broadcast dims have stride 0); out is contiguous.
  virtual void unary(UnaryOp op, const Tensor& x, const Tensor& out) = 0;
  // gx = gy * f'(x), all contiguous with one shape.
  virtual void unary_backward(UnaryOp op, const Tensor& x, const Tensor& gy, const Tensor& gx) = 0;
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out = alpha * x + beta (x contiguous).
  virtual void affine(const Tensor& x, double alpha, double beta, const Tensor& out) = 0;
  virtual void pow_scalar(const Tensor& x, double exponent, const Tensor& out) = 0;
  // out = mask ? value : x; mask is a bool view broadcast to x's shape; x, out contiguous.
  virtual void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) = 0;

  // x contiguous, viewed as [outer, r, inner]; out contiguous [outer, inner].
  virtual void reduce(ReduceOp op, const Tensor& x, int64_t outer, int64_t r, int64_t inner,
                      const Tensor& out) = 0;
  // Index (i64) of the max along r (first one on ties).
  virtual void argmax(const Tensor& x, int64_t outer, int64_t r, int64_t inner, const Tensor& out) = 0;
  // x contiguous [rows, n]: the k largest per row, sorted descending; values x.dtype, indices i64.
  virtual void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) = 0;

  // Softmax over the last dim of a contiguous [rows, n] tensor; log=true gives log_softmax.
  virtual void softmax(const Tensor& x, bool log, const Tensor& y) = 0;
  virtual void softmax_backward(const Tensor& y, const Tensor& gy, bool log, const Tensor& gx) = 0;

  virtual void gemm(const GemmArgs& args) = 0;

  // The leading r singular triplets of a contiguous [m, n] f32/f64 matrix, r <= min(m, n): u [m, r],
  // s [r] (descending), vh [r, n], each contiguous or undefined (not wanted); LAPACK's gesdd,
  // torch.linalg.svd's CPU driver. Returns false where the backend declines (the ops layer then runs it on
  // the host): GaLore's projections need one per matrix every few hundred steps, where a host round trip
  // costs less than a device solver's setup.
  virtual bool svd(const Tensor& a, const Tensor& u, const Tensor& s, const Tensor& vh) {
    (void)a;
    (void)u;
    (void)s;
    (void)vh;
    return false;
  }

  // x contiguous [rows, n]; w, b [n] (b may be undefined); mean, rstd f32 [rows]. With `residual` (like x)
  // the residual add is fused in: sum = x + residual (rounded to x's dtype, as a separate add would) is
  // written and normalized instead of x.
  virtual void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                          const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                          const Tensor& sum) = 0;
  // gw, gb are overwritten (not accumulated); either may be undefined when not needed. With gx_add (like gy)
  // gx = the norm's input gradient + gx_add, added before rounding (the fused residual's other branch).
  virtual void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& gy, const Tensor& gx, const Tensor& gw, const Tensor& gb,
                                   const Tensor& gx_add) = 0;
  virtual void rms_norm(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd,
                        const Tensor& residual, const Tensor& sum) = 0;
  virtual void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& gy,
                                 const Tensor& gx, const Tensor& gw, const Tensor& gx_add) = 0;

  // logits [n, v] (any float dtype), contiguous or rows of a padded buffer (unit column stride, row stride
  // row_stride(logits) >= v; so is glogits below, with its own row stride); labels i64 [n]; loss f32 [n]
  // (0 where ignored), lse f32 [n] (logsumexp of each row, saved for backward). Labels out of range throw.
  // smoothing e in [0, 1] (torch's label_smoothing): loss = (1 - e) * (lse - x[label]) + e * (lse - mean(x)),
  // the cross-entropy against (1 - e) * onehot + e / v; e = 0 gives the plain loss's bits.
  virtual void cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                             double smoothing, const Tensor& loss, const Tensor& lse) = 0;
  // glogits = grad_loss[row] * (softmax(logits) - (1 - e) * onehot(label) - e / v); 0 for ignored rows.
  // grad_loss f32 [n]. glogits has the logits' dtype (it may be the logits themselves), or bf16/f16 for f32
  // logits: each f32 value rounded once.
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                      const Tensor& grad_loss, int64_t ignore_index, double smoothing,
                                      const Tensor& glogits) = 0;
  // cross_entropy, then cross_entropy_backward with grad_loss into glogits (the logits themselves, or
  // bf16/f16 for f32 logits): for a loss gradient known before the loss (the chunked LM head). The CPU makes
  // each row's gradient while the row is in cache from the exps of its sum (one pass over the logits in
  // memory, one exp an element): the loss and lse bits of cross_entropy, the gradient within an f32 rounding
  // or two of the backward's. A backend without a fused kernel runs the two ops.
  virtual void cross_entropy_with_grad(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                                       double smoothing, const Tensor& loss, const Tensor& lse,
                                       const Tensor& grad_loss, const Tensor& glogits) {
    cross_entropy(logits, labels, ignore_index, smoothing, loss, lse);
    cross_entropy_backward(logits, labels, lse, grad_loss, ignore_index, smoothing, glogits);
  }

  // weight [v, d] contiguous, ids i64 [n] (checked < v), out [n, d].
  virtual void embedding(const Tensor& weight, const Tensor& ids, const Tensor& out) = 0;
  // gweight [v, d] is overwritten with the deterministic scatter-add of gy [n, d] rows.
  virtual void embedding_backward(const Tensor& gy, const Tensor& ids, const Tensor& gweight) = 0;

  // Rotary embedding (HF rotate_half convention) on contiguous x: [B, H, T, D] or, with seq_major,
  // [B, T, H, D]. cos/sin f32 [P, D/2]; positions i64 [B, T] (< P). inverse=true applies the transpose
  // rotation (the backward).
  virtual void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions,
                    bool seq_major, bool inverse, const Tensor& y) = 0;

  // Fused attention with online softmax (never holds a T x S score matrix). q [B, H, T, D], k/v [B, Hkv, S,
  // D] (H a multiple of Hkv: grouped-query heads share k/v); every operand here and in the backward (out,
  // dout, dq, dk, dv too) with any strides but a contiguous head dim, read and written through its HeadRows
  // (attention_geometry()), so a model's projections serve as they are; key_keep bool [B, S] or undefined
  // (false = padding, never attended); causal masks key s > query t + (S - T), and with window > 0 (a
  // sliding window, causal only) also key s <= t + (S - T) - window. out [B, H, T, D]; lse f32 [B, H, T] (f64
  // for f64), -inf for rows with nothing to attend (their output is 0). With drop.p > 0 the probabilities are
  // dropped as AttentionBlock's (the mask dropout() on [B, H, T, S] would draw); lse stays undropped.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                         bool causal, int64_t window, double scale, const AttentionDropout& drop,
                         const Tensor& out, const Tensor& lse) = 0;
  // Gradients from the saved out and lse (scores recomputed blockwise, the same dropout mask redrawn); dq,
  // dk, dv overwritten.
  virtual void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                                  bool causal, int64_t window, double scale, const AttentionDropout& drop,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                  const Tensor& dk, const Tensor& dv) = 0;

  // Blocked attention (ops::attention_blocked: the two products run as GEMMs, tensor cores on a GPU): one
  // block of queries t0 .. t0 + tq - 1 of every head against keys 0 .. sk - 1, with the fused kernel's
  // masking rule (AttentionGeometry). Rows run over (batch, kv head, rep, query): scores, dp, probs, dscores
  // are [B * KV, H / KV * tq, sk] contiguous; lse, delta [B * KV, H / KV * tq]. scores and dp are f32 (f64
  // for f64 inputs), as are lse and delta; probs and dscores have the inputs' dtype.
  struct AttentionBlock {
    int64_t B, H, KV, T, S, t0, tq, sk;
    bool causal;
    double scale;
    Tensor key_keep;  // bool [B, S] or undefined
    // Attention dropout on the probabilities, as dropout() on the [B, H, T, S] probability tensor would
    // draw it: element ((b * H + h) * T + t) * S + s kept when uniform(seed, offset, index) >= dropout,
    // then scaled by 1 / (1 - dropout). 0: none.
    double dropout = 0.0;
    uint64_t seed = 0, offset = 0;
    int64_t window = 0;  // sliding window (causal): keys a query sees, itself included; 0 = all before it
  };
  // probs = softmax(scale * scores) over the keys each query sees (0 elsewhere), with the block's dropout
  // applied; lse the logsumexp (-inf and zero probs for a query that sees nothing).
  virtual void attention_block_softmax(const Tensor& scores, const AttentionBlock& a, const Tensor& probs,
                                       const Tensor& lse) = 0;
  // The block's backward: p = exp(scale * scores - lse) where visible (else 0), z the dropout factor (0 or
  // 1 / (1 - dropout); 1 without dropout); probs = p * z (for dv), dscores = p * (dp * z - delta) * scale.
  virtual void attention_block_grad(const Tensor& scores, const Tensor& dp, const Tensor& lse,
                                    const Tensor& delta, const AttentionBlock& a, const Tensor& probs,
                                    const Tensor& dscores) = 0;

  // y = x * keep / (1 - p), keep[i] = uniform(seed, offset, i) >= p. x, y contiguous.
  virtual void dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& y) = 0;

  // A chain of elementwise calls run as one pass (torch_compile's inductor fusion). Stage k computes what
  // the unfused call would (same element math, its value rounded to the dtype) from operands that are
  // tensors of `t` or earlier stages' values, and stores it into a tensor of `t` unless no one reads it
  // after the chain. Every tensor is contiguous, of one floating dtype and one element count; tensors
  // shared by stages are read and written at the same elements. Backends that run it say so.
  struct FusedStage {
    enum class Kind : uint8_t { unary, unary_backward, binary, affine, dropout };
    Kind kind = Kind::binary;
    UnaryOp unary = UnaryOp::neg;     // unary, unary_backward (operands x, gy)
    BinaryOp binary = BinaryOp::add;  // binary (operands a, b)
    double alpha = 1.0, beta = 0.0;   // affine: alpha x + beta; dropout: alpha = p
    uint64_t seed = 0, offset = 0;    // dropout's Philox stream
    int32_t in[2] = {0, 0};           // operand: a tensor index >= 0, or -1 - k for stage k's value
    int32_t out = -1;                 // the tensor the value is stored into; -1: not stored
  };
  // A chain holds at most this many stages (so at most 3x as many tensors): compile::fuse_elementwise splits
  // longer runs.
  static constexpr int kMaxFusedStages = 16;
  virtual bool fuses_elementwise() const { return false; }
  virtual void fused_elementwise(const std::vector<FusedStage>& stages, const std::vector<Tensor>& t) {
    (void)stages;
    (void)t;
    fail("fused_elementwise: the {} backend does not fuse elementwise calls", name());
  }
  // What every backend checks of a chain before running it: at most kMaxFusedStages stages, each reading
  // tensors of `t` or earlier stages' values and storing into a tensor of `t` or nowhere; the tensors
  // contiguous, of one dtype, element count and device.
  static void check_fused_chain(const std::vector<FusedStage>& stages, const std::vector<Tensor>& t) {
    TR_CHECK(!stages.empty() && !t.empty() && stages.size() <= static_cast<size_t>(kMaxFusedStages),
             "fused_elementwise: {} stages over {} tensors (1 to {} stages)", stages.size(), t.size(),
             kMaxFusedStages);
    for (const Tensor& x : t)
      TR_CHECK(x.numel() == t[0].numel() && x.dtype() == t[0].dtype() && x.device() == t[0].device() &&
                   x.is_contiguous(),
               "fused_elementwise: tensors must be contiguous, of one dtype, size and device ({} vs {})",
               x.describe(), t[0].describe());
    const auto nt = static_cast<int32_t>(t.size());
    for (size_t k = 0; k < stages.size(); ++k) {
      const FusedStage& s = stages[k];
      const int n = s.kind == FusedStage::Kind::binary || s.kind == FusedStage::Kind::unary_backward ? 2 : 1;
      for (int j = 0; j < n; ++j)
        TR_CHECK(s.in[j] < nt && (s.in[j] >= 0 || -1 - s.in[j] < static_cast<int32_t>(k)),
                 "fused_elementwise: stage {} reads operand {} (tensors: {}, earlier stages: {})", k, s.in[j],
                 nt, k);
      TR_CHECK(s.out >= -1 && s.out < nt, "fused_elementwise: stage {} stores into tensor {} of {}", k, s.out,
               nt);
    }
  }

  // How an optimizer reads its gradients, so that mixed precision and clipping need no host sync and no f32
  // copy of half gradients: in the parameter's precision T (f32, or f64 for f64 parameters) each element is
  // g = T(grad) * T(inv_scale), then g *= T(coef) with coef = max_norm / (sqrt(stats[0]) + 1e-6) when
  // max_norm > 0 and coef < 1 (torch's unscale_ then clip_grad_norm_, rounding for rounding).
  struct GradTransform {
    double inv_scale = 1.0;  // 1 / loss scale
    double max_norm = 0.0;   // <= 0: no clipping
    Tensor stats;            // f64 [2] from grad_stats on the gradients' device; needed when max_norm > 0
  };
  // stats += {sum over every element of every grad of (T(g) * T(inv_scale))^2 accumulated in f64, number of
  // non-finite products}: the global norm and the fp16 inf check in one pass. Deterministic: the partial sums
  // of 64K-element chunks are added in chunk order (on the CPU to what stats held, so consecutive calls over
  // the runs of a split model give the one-call bits). grads contiguous, any floating dtype, one device.
  virtual void grad_stats(const std::vector<Tensor>& grads, double inv_scale, const Tensor& stats) = 0;
  // dst = src read through `t` (for optimizers without a fused kernel): src any floating dtype, dst f32/f64
  // of src's size (dst may be src), or bf16/f16 (half weights' gradients in place: f32 math, one rounding).
  virtual void transform_grads(const std::vector<std::pair<Tensor, Tensor>>& src_dst,
                               const GradTransform& t) = 0;

  // One AdamW step over many tensors in one pass (torch's fused / apex's multi-tensor AdamW): param,
  // exp_avg, exp_avg_sq contiguous, one dtype and size (f32 or f64; bf16/f16 for half-precision weights:
  // f32 arithmetic, each stored value rounded once, as torch's fused AdamW on half tensors, and no
  // param_copy); grad contiguous of that size in any
  // floating dtype, read through the GradTransform; weight decay where `decay`. When param_copy is defined
  // (the model's bf16/f16 weights under mixed precision) the updated parameter is also written there,
  // rounded to nearest even, by the same pass. The element math is backend/optim_math.h's, so the result
  // equals the per-tensor update on every backend.
  struct AdamWTensors {
    Tensor param, grad, exp_avg, exp_avg_sq;
    bool decay = true;
    Tensor param_copy;
  };
  struct AdamWHyper {
    double lr = 1e-3, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    int64_t step = 1;
  };
  virtual void fused_adamw(const std::vector<AdamWTensors>& tensors, const AdamWHyper& h,
                           const GradTransform& t) = 0;

  // One step of bitsandbytes' blockwise 8-bit AdamW or AdEMAMix (backend/adamw8bit_math.h; k.ademamix) over
  // many tensors: param and grad f32 contiguous; eight_bit tensors hold u8 codes state1/state2 [numel] and
  // f32 absmax1/absmax2 [ceil(numel / 256)], the others f32 moments state1/state2 of the parameter's size.
  // AdEMAMix's slow EMA is state3 (+ absmax3), in state1's form. signed_map and unsigned_map: the two dynamic
  // code maps, f32 [256] on the tensors' device.
  struct AdamW8bitTensors {
    Tensor param, grad, state1, state2, absmax1, absmax2;
    bool eight_bit = true;
    Adam8bitConsts k{};
    Tensor state3, absmax3;
  };
  virtual void adamw_8bit(const std::vector<AdamW8bitTensors>& tensors, const Tensor& signed_map,
                          const Tensor& unsigned_map) = 0;

  // One SGD step per tensor (torch.optim.SGD's single-tensor formulas: optim_math.h's sgd_element, so every
  // backend gives the CPU's bits): param, grad and momentum_buffer (undefined: no momentum) contiguous, one
  // dtype (f32 or f64) and size; `first`: the buffer is made from this step's d_p. In place: no memory.
  struct SgdTensors {
    Tensor param, grad, momentum_buffer;
    double weight_decay = 0.0;
    bool first = false;
  };
  struct SgdHyper {
    double lr = 1e-3, momentum = 0.0, dampening = 0.0;
    bool nesterov = false;
  };
  virtual void sgd(const std::vector<SgdTensors>& tensors, const SgdHyper& h) = 0;

  // One step of an element-wise optimizer with per-parameter state (Adagrad, RMSprop, bitsandbytes' 32-bit
  // Lion and RMSprop: optim_math.h's elementwise_update, so every backend gives the CPU's bits): param, grad,
  // state1 and state2 (rmsprop's momentum buffer; undefined: none) contiguous, one dtype (f32 or f64; f32 for
  // the bitsandbytes rules) and size; schedule-free's state1 is z, state2 AdamW's exp_avg_sq, and its
  // train/eval switch (schedule_free_lerp) reads no gradient (undefined). In place: no memory.
  struct ElementwiseTensors {
    Tensor param, grad, state1, state2;
    double weight_decay = 0.0;
  };
  using ElementwiseHyper = backend::ElementwiseHyper;
  virtual void elementwise_step(const std::vector<ElementwiseTensors>& tensors,
                                const ElementwiseHyper& h) = 0;
  // bitsandbytes' blockwise 8-bit one-state step for the rules lion and rmsprop_bnb (adamw8bit_math.h's
  // state8bit_*): param and grad f32 contiguous, state1 u8 codes [numel] on signed_map (f32 [256] on the
  // tensors' device), absmax1 f32 [ceil(numel / 256)]. In place.
  struct Elementwise8bitTensors {
    Tensor param, grad, state1, absmax1;
    double weight_decay = 0.0;
  };
  virtual void elementwise_8bit(const std::vector<Elementwise8bitTensors>& tensors, const ElementwiseHyper& h,
                                const Tensor& signed_map) = 0;
  // torchdistx's AnyPrecisionAdamW step (optim_math.h's anyprecision_element) over many tensors, in place:
  // param f32 or half; grad of its size, any floating dtype (read as f32); exp_avg, exp_avg_sq and
  // compensation (undefined: no Kahan summation) each f32 or half; all contiguous, on one device. A backend
  // that has no kernel for it declines (throws).
  struct AnyPrecisionTensors {
    Tensor param, grad, exp_avg, exp_avg_sq, compensation;
    bool decay = true;
  };
  struct AnyPrecisionHyper {
    double lr = 1e-3, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    int64_t step = 1;
  };
  // Defined here, not in a .cpp: an out-of-line virtual would become Backend's key function and put its
  // typeinfo in one library that the CUDA backend's library does not link after.
  virtual void anyprecision_adamw(const std::vector<AnyPrecisionTensors>& tensors,
                                  const AnyPrecisionHyper& h) {
    (void)h;
    fail("adamw_anyprecision: the {} backend has no kernel for it",
         tensors.empty() ? std::string("?") : tensors[0].param.device().str());
  }
};

// The distance between consecutive rows of a tensor of rows (the last dimension): its second-to-last
// stride, which is the row length for a contiguous tensor and more for rows of a padded buffer.
inline int64_t row_stride(const Tensor& t) {
  // A contiguous tensor's rows are its row length apart, whatever strides its size-1 dimensions carry.
  if (t.is_contiguous()) return t.dim() > 0 ? t.size(t.dim() - 1) : 1;
  return t.dim() >= 2 ? t.strides()[static_cast<size_t>(t.dim() - 2)] : t.dim() == 1 ? t.size(0) : 1;
}

// Sets a process-wide switch for a scope and restores its previous value.
template <bool (*Get)(), void (*Set)(bool)>
class SwitchScope {
 public:
  explicit SwitchScope(bool on) : previous_(Get()) { Set(on); }
  ~SwitchScope() { Set(previous_); }
  SwitchScope(const SwitchScope&) = delete;
  SwitchScope& operator=(const SwitchScope&) = delete;

 private:
  bool previous_;
};

// torch_compile's max-autotune for GEMMs (GemmArgs::autotune), process-wide like TF32 below (inductor's
// config is too); GemmAutotuneScope sets it for the Trainer's run and restores it.
void set_gemm_autotune(bool on);
bool gemm_autotune();
using GemmAutotuneScope = SwitchScope<gemm_autotune, set_gemm_autotune>;

// torch.backends.cuda.matmul.allow_tf32: the process's f32 matmul precision (off by default). The CPU
// emulates TF32 by rounding the inputs, so its numerics can be tested without a GPU. Tf32Scope sets it for a
// scope (the Trainer's --tf32) and restores the previous value.
void set_allow_tf32(bool on);
bool allow_tf32();
using Tf32Scope = SwitchScope<allow_tf32, set_allow_tf32>;

// The backend that runs tensors of `device` (cpu, cuda, meta -> cpu for geometry only), or the interposer
// of an InterposeScope of this thread for that device.
Backend& backend_for(Device device);

// While alive, backend_for(device) on this thread returns `interposer` (torch_compile's capture records
// every kernel call of a step through one). Per thread, so DataLoader workers are never captured; scopes
// nest and restore the previous one.
class InterposeScope {
 public:
  InterposeScope(Device device, Backend& interposer);
  ~InterposeScope();
  InterposeScope(const InterposeScope&) = delete;
  InterposeScope& operator=(const InterposeScope&) = delete;

 private:
  Device device_;
  Backend* previous_;
};
// True when this build has CUDA kernels and a GPU is present.
bool cuda_available();
int cuda_device_count();

}  // namespace tr::backend
