// The CPU backend: OpenMP-parallel kernels, GEMM through oneDNN's sgemm (f32), its bf16 matmul primitive
// on AMX or AMD Zen 4/5's AVX512_BF16 (matmul_native.cpp; elsewhere bf16/f16 widened to f32 in pooled
// scratch) and OpenBLAS (f64). Method bodies live in mirror-named files (elementwise.cpp, fused.cpp,
// reduce.cpp, matmul.cpp, norm.cpp, loss.cpp, optim.cpp, attention.cpp with attention_gemm.cpp and, for bf16
// on native bf16 products, attention_bf16.cpp).
#pragma once
#include <optional>

#include "backend/backend.h"
#include "backend/cpu/attention_kernels.h"
#include "backend/cpu/code_table.h"
#include "backend/cpu/matmul_native.h"
#include "backend/cpu/scratch_pool.h"

namespace tr::cpu {

class CpuBackend final : public backend::Backend {
 public:
  const char* name() const override { return "cpu"; }
  Allocator& allocator(int) override { return cpu_allocator(); }
  std::string gemm_precision_note(DType operands) const override;
  backend::NativeHalf native_half_matmul(DType operands) const override;

  void copy(const Tensor& src, const Tensor& dst) override;
  void scaled_copy(const Tensor& x, const Tensor& s, const Tensor& dst) override;
  void fill(const Tensor& out, double value) override;
  void arange(const Tensor& out, double start, double step) override;
  void random_normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) override;
  void random_uniform(const Tensor& out, double lo, double hi, uint64_t seed, uint64_t offset) override;
  void unary(backend::UnaryOp op, const Tensor& x, const Tensor& out) override;
  void unary_backward(backend::UnaryOp op, const Tensor& x, const Tensor& gy, const Tensor& gx) override;
  void binary(backend::BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void affine(const Tensor& x, double alpha, double beta, const Tensor& out) override;
  void pow_scalar(const Tensor& x, double exponent, const Tensor& out) override;
  void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) override;
  void reduce(backend::ReduceOp op, const Tensor& x, int64_t outer, int64_t r, int64_t inner,
              const Tensor& out) override;
  void argmax(const Tensor& x, int64_t outer, int64_t r, int64_t inner, const Tensor& out) override;
  void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) override;
  void softmax(const Tensor& x, bool log, const Tensor& y) override;
  void softmax_backward(const Tensor& y, const Tensor& gy, bool log, const Tensor& gx) override;
  void gemm(const backend::GemmArgs& args) override;
  bool svd(const Tensor& a, const Tensor& u, const Tensor& s, const Tensor& vh) override;
  void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                  const Tensor& mean, const Tensor& rstd, const Tensor& residual, const Tensor& sum) override;
  void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                           const Tensor& gy, const Tensor& gx, const Tensor& gw, const Tensor& gb,
                           const Tensor& gx_add) override;
  void rms_norm(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd,
                const Tensor& residual, const Tensor& sum) override;
  void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& gy,
                         const Tensor& gx, const Tensor& gw, const Tensor& gx_add) override;
  void cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index, double smoothing,
                     const Tensor& loss, const Tensor& lse) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                              const Tensor& grad_loss, int64_t ignore_index, double smoothing,
                              const Tensor& glogits) override;
  void cross_entropy_with_grad(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                               double smoothing, const Tensor& loss, const Tensor& lse,
                               const Tensor& grad_loss, const Tensor& glogits) override;
  void embedding(const Tensor& weight, const Tensor& ids, const Tensor& out) override;
  void embedding_backward(const Tensor& gy, const Tensor& ids, const Tensor& gweight) override;
  void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions, bool seq_major,
            bool inverse, const Tensor& y) override;
  void dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& y) override;
  bool fuses_elementwise() const override { return true; }
  void fused_elementwise(const std::vector<FusedStage>& stages, const std::vector<Tensor>& t) override;
  void attention_block_softmax(const Tensor& scores, const AttentionBlock& a, const Tensor& probs,
                               const Tensor& lse) override;
  void attention_block_grad(const Tensor& scores, const Tensor& dp, const Tensor& lse, const Tensor& delta,
                            const AttentionBlock& a, const Tensor& probs, const Tensor& dscores) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep, bool causal,
                 int64_t window, double scale, const backend::AttentionDropout& drop, const Tensor& out,
                 const Tensor& lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                          bool causal, int64_t window, double scale, const backend::AttentionDropout& drop,
                          const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv) override;
  void grad_stats(const std::vector<Tensor>& grads, double inv_scale, const Tensor& stats) override;
  void transform_grads(const std::vector<std::pair<Tensor, Tensor>>& src_dst,
                       const GradTransform& t) override;
  void sgd(const std::vector<SgdTensors>& tensors, const SgdHyper& h) override;
  void elementwise_step(const std::vector<ElementwiseTensors>& tensors, const ElementwiseHyper& h) override;
  void anyprecision_adamw(const std::vector<AnyPrecisionTensors>& tensors,
                          const AnyPrecisionHyper& h) override;
  void elementwise_8bit(const std::vector<Elementwise8bitTensors>& tensors, const ElementwiseHyper& h,
                        const Tensor& signed_map) override;
  void fused_adamw(const std::vector<AdamWTensors>& tensors, const AdamWHyper& h,
                   const GradTransform& t) override;
  void adamw_8bit(const std::vector<AdamW8bitTensors>& tensors, const Tensor& signed_map,
                  const Tensor& unsigned_map) override;
  // The widened GEMMs' f32 operand copies (matmul.cpp).
  ScratchPool& gemm_scratch() { return gemm_scratch_; }
  // Where bf16 attention with this head dim runs its tile products natively (attention.cpp): AMX tiles, or
  // AVX512_BF16 dot products where they beat f32 FMAs; none: widened sgemm tiles.
  std::optional<Bf16Tiles> bf16_attention_tiles(int64_t head_dim) const;

 private:
  ScratchPool gemm_scratch_;
  NativeMatmul native_;
  CodeTables code_tables_;  // the 8-bit optimizers' nearest-code tables, one per code map
};

CpuBackend& cpu_backend();

}  // namespace tr::cpu
