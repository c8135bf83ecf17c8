// torch_compile's capture: a Backend that forwards every kernel call to the real backend and records it -
// the buffers it reads and writes, the views it takes of them and a way to run it again - so that the step
// can be planned and replayed without the ops layer, autograd or the allocator. It keeps no reference to the
// region's own buffers, so capturing needs no more memory than running.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace tr::compile {

enum class Access : uint8_t { read, write, read_write };

// One tensor argument of a recorded call: which buffer (storage) it views and how; buffer -1 for an
// undefined (absent) tensor.
struct Arg {
  int32_t buffer = -1;
  Shape shape;
  Strides strides;
  int64_t offset = 0;
  DType dtype = DType::f32;
  Access access = Access::read;
};

struct Call {
  const char* name = "";
  std::vector<Arg> args;
  // Runs the call on `b` with tensors `t` (one per arg, by position); Philox offsets (dropout, random
  // fills) move by `philox_shift` counters.
  std::function<void(backend::Backend& b, const std::vector<Tensor>& t, uint64_t philox_shift)> run;
  // For an elementwise call the fusion pass may merge (compile/fuse.h): the call as a fused stage, operands
  // and output naming args by position.
  std::optional<backend::Backend::FusedStage> pointwise;
};

// A storage the recorded calls touch. One whose first touch reads it existed before the region (a parameter,
// an input, a model constant) and is kept; one the region writes first is the region's own, to be planned.
struct Buffer {
  int64_t bytes = 0;
  Device device;
  bool external = false;
  std::shared_ptr<Storage> storage;  // externals only: the region reads what is there
  int64_t first = 0, last = 0;       // the first and last call touching it
  bool elided = false;               // fusion keeps its values in registers: no memory
};

class Recorder final : public backend::Backend {
 public:
  explicit Recorder(backend::Backend& inner) : inner_(inner) {}
  std::vector<Call> take_calls() { return std::move(calls_); }
  std::vector<Buffer> take_buffers() { return std::move(buffers_); }
  size_t size() const { return calls_.size(); }
  // The buffer `t` views (-1 when no recorded call touched its storage).
  int32_t buffer_of(const Tensor& t) const;
  // Why the recording cannot be replayed ("" when it can): a call the capture does not take (the optimizer
  // passes run outside the captured region).
  const std::string& break_reason() const { return break_reason_; }

  const char* name() const override { return inner_.name(); }
  Allocator& allocator(int device_index) override { return inner_.allocator(device_index); }
  void synchronize() override { inner_.synchronize(); }
  void range_push(const char* name) override { inner_.range_push(name); }
  void range_pop() override { inner_.range_pop(); }
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
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep, bool causal,
                 int64_t window, double scale, const backend::AttentionDropout& drop, const Tensor& out,
                 const Tensor& lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                          bool causal, int64_t window, double scale, const backend::AttentionDropout& drop,
                          const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv) override;
  void attention_block_softmax(const Tensor& scores, const AttentionBlock& a, const Tensor& probs,
                               const Tensor& lse) override;
  void attention_block_grad(const Tensor& scores, const Tensor& dp, const Tensor& lse, const Tensor& delta,
                            const AttentionBlock& a, const Tensor& probs, const Tensor& dscores) override;
  void dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& y) override;
  void grad_stats(const std::vector<Tensor>& grads, double inv_scale, const Tensor& stats) override;
  void transform_grads(const std::vector<std::pair<Tensor, Tensor>>& src_dst,
                       const GradTransform& t) override;
  void fused_adamw(const std::vector<AdamWTensors>& tensors, const AdamWHyper& h,
                   const GradTransform& t) override;
  void adamw_8bit(const std::vector<AdamW8bitTensors>& tensors, const Tensor& signed_map,
                  const Tensor& unsigned_map) override;
  void sgd(const std::vector<SgdTensors>& tensors, const SgdHyper& h) override;
  void anyprecision_adamw(const std::vector<AnyPrecisionTensors>& tensors,
                          const AnyPrecisionHyper& h) override;
  void elementwise_step(const std::vector<ElementwiseTensors>& tensors, const ElementwiseHyper& h) override;
  void elementwise_8bit(const std::vector<Elementwise8bitTensors>& tensors, const ElementwiseHyper& h,
                        const Tensor& signed_map) override;

 private:
  void add(const char* name, const std::vector<Tensor>& t, const std::vector<Access>& a,
           decltype(Call::run) run);
  void refuse(const char* name);
  // Marks the call just added as fusable as `s` when its tensors allow (contiguous, one size and dtype).
  void pointwise(const std::vector<Tensor>& t, backend::Backend::FusedStage s);
  int32_t buffer_for(const Tensor& t, Access first_access);

  backend::Backend& inner_;
  std::vector<Call> calls_;
  std::vector<Buffer> buffers_;
  // Storages seen so far; the weak reference tells a live storage from a new one at a reused address.
  std::unordered_map<const Storage*, std::pair<std::weak_ptr<Storage>, int32_t>> ids_;
  std::string break_reason_;
};

}  // namespace tr::compile
