// The recording backend; see recorder.h. Every override lists the call's tensors with their access and a
// runner that takes the tensors by position; the runner executes the call at once on the real backend, so
// the captured step and its replays go through the same code.
#include "compile/recorder.h"

#include <fmt/format.h>

namespace tr::compile {

using backend::Backend;
using T = std::vector<Tensor>;
constexpr Access R = Access::read, W = Access::write, RW = Access::read_write;

int32_t Recorder::buffer_of(const Tensor& t) const {
  if (!t.defined()) return -1;
  const auto it = ids_.find(t.storage().get());
  return it == ids_.end() || it->second.first.expired() ? -1 : it->second.second;
}

int32_t Recorder::buffer_for(const Tensor& t, Access first_access) {
  const std::shared_ptr<Storage>& s = t.storage();
  auto it = ids_.find(s.get());
  if (it != ids_.end() && !it->second.first.expired()) {
    buffers_[static_cast<size_t>(it->second.second)].last = static_cast<int64_t>(calls_.size());
    return it->second.second;
  }
  Buffer b;
  b.bytes = static_cast<int64_t>(s->nbytes());
  b.device = s->device();
  b.external = first_access != Access::write;
  if (b.external) b.storage = s;
  b.first = b.last = static_cast<int64_t>(calls_.size());
  const auto id = static_cast<int32_t>(buffers_.size());
  buffers_.push_back(std::move(b));
  ids_[s.get()] = {s, id};
  return id;
}

void Recorder::add(const char* name, const std::vector<Tensor>& t, const std::vector<Access>& a,
                   decltype(Call::run) run) {
  run(inner_, t, 0);  // first, so a call that throws is not recorded
  Call c{name, {}, std::move(run), std::nullopt};
  c.args.resize(t.size());
  // Reads before writes: a call that reads and writes one new buffer (in place) found it holding data.
  for (const bool writes : {false, true})
    for (size_t i = 0; i < t.size(); ++i) {
      if (!t[i].defined() || (a[i] == Access::write) != writes) continue;
      c.args[i] =
          Arg{buffer_for(t[i], a[i]), t[i].shape(), t[i].strides(), t[i].offset(), t[i].dtype(), a[i]};
    }
  calls_.push_back(std::move(c));
}

void Recorder::pointwise(const std::vector<Tensor>& t, backend::Backend::FusedStage s) {
  for (const Tensor& x : t)
    if (!x.defined() || !x.is_contiguous() || x.numel() != t[0].numel() || x.dtype() != t[0].dtype() ||
        !is_floating(x.dtype()))
      return;
  calls_.back().pointwise = s;
}

void Recorder::refuse(const char* name) {
  if (break_reason_.empty())
    break_reason_ =
        fmt::format("the kernel '{}' ran inside the captured region (call {})", name, calls_.size());
}

void Recorder::copy(const Tensor& src, const Tensor& dst) {
  add("copy", {src, dst}, {R, W}, [](Backend& b, const T& t, uint64_t) { b.copy(t[0], t[1]); });
}

void Recorder::scaled_copy(const Tensor& x, const Tensor& s, const Tensor& dst) {
  // x read and written: its values afterwards are the backend's (unspecified), so nothing may read them.
  add("scaled_copy", {x, s, dst}, {RW, R, W},
      [](Backend& b, const T& t, uint64_t) { b.scaled_copy(t[0], t[1], t[2]); });
}

void Recorder::fill(const Tensor& out, double value) {
  add("fill", {out}, {W}, [value](Backend& b, const T& t, uint64_t) { b.fill(t[0], value); });
}

void Recorder::arange(const Tensor& out, double start, double step) {
  add("arange", {out}, {W}, [=](Backend& b, const T& t, uint64_t) { b.arange(t[0], start, step); });
}

void Recorder::random_normal(const Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) {
  add("random_normal", {out}, {W}, [=](Backend& b, const T& t, uint64_t shift) {
    b.random_normal(t[0], mean, std, seed, offset + shift);
  });
}

void Recorder::random_uniform(const Tensor& out, double lo, double hi, uint64_t seed, uint64_t offset) {
  add("random_uniform", {out}, {W},
      [=](Backend& b, const T& t, uint64_t shift) { b.random_uniform(t[0], lo, hi, seed, offset + shift); });
}

using Stage = Backend::FusedStage;

void Recorder::unary(backend::UnaryOp op, const Tensor& x, const Tensor& out) {
  add("unary", {x, out}, {R, W}, [op](Backend& b, const T& t, uint64_t) { b.unary(op, t[0], t[1]); });
  pointwise({x, out}, Stage{.kind = Stage::Kind::unary, .unary = op, .in = {0, 0}, .out = 1});
}

void Recorder::unary_backward(backend::UnaryOp op, const Tensor& x, const Tensor& gy, const Tensor& gx) {
  add("unary_backward", {x, gy, gx}, {R, R, W},
      [op](Backend& b, const T& t, uint64_t) { b.unary_backward(op, t[0], t[1], t[2]); });
  pointwise({x, gy, gx}, Stage{.kind = Stage::Kind::unary_backward, .unary = op, .in = {0, 1}, .out = 2});
}

void Recorder::binary(backend::BinaryOp op, const Tensor& a, const Tensor& bt, const Tensor& out) {
  add("binary", {a, bt, out}, {R, R, W},
      [op](Backend& b, const T& t, uint64_t) { b.binary(op, t[0], t[1], t[2]); });
  pointwise({a, bt, out}, Stage{.kind = Stage::Kind::binary, .binary = op, .in = {0, 1}, .out = 2});
}

void Recorder::affine(const Tensor& x, double alpha, double beta, const Tensor& out) {
  add("affine", {x, out}, {R, W},
      [=](Backend& b, const T& t, uint64_t) { b.affine(t[0], alpha, beta, t[1]); });
  pointwise({x, out},
            Stage{.kind = Stage::Kind::affine, .alpha = alpha, .beta = beta, .in = {0, 0}, .out = 1});
}

void Recorder::pow_scalar(const Tensor& x, double exponent, const Tensor& out) {
  add("pow_scalar", {x, out}, {R, W},
      [exponent](Backend& b, const T& t, uint64_t) { b.pow_scalar(t[0], exponent, t[1]); });
}

void Recorder::masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  add("masked_fill", {x, mask, out}, {R, R, W},
      [value](Backend& b, const T& t, uint64_t) { b.masked_fill(t[0], t[1], value, t[2]); });
}

void Recorder::reduce(backend::ReduceOp op, const Tensor& x, int64_t outer, int64_t r, int64_t inner,
                      const Tensor& out) {
  add("reduce", {x, out}, {R, W},
      [=](Backend& b, const T& t, uint64_t) { b.reduce(op, t[0], outer, r, inner, t[1]); });
}

void Recorder::argmax(const Tensor& x, int64_t outer, int64_t r, int64_t inner, const Tensor& out) {
  add("argmax", {x, out}, {R, W},
      [=](Backend& b, const T& t, uint64_t) { b.argmax(t[0], outer, r, inner, t[1]); });
}

void Recorder::topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) {
  add("topk", {x, values, indices}, {R, W, W},
      [k](Backend& b, const T& t, uint64_t) { b.topk(t[0], k, t[1], t[2]); });
}

void Recorder::softmax(const Tensor& x, bool log, const Tensor& y) {
  add("softmax", {x, y}, {R, W}, [log](Backend& b, const T& t, uint64_t) { b.softmax(t[0], log, t[1]); });
}

void Recorder::softmax_backward(const Tensor& y, const Tensor& gy, bool log, const Tensor& gx) {
  add("softmax_backward", {y, gy, gx}, {R, R, W},
      [log](Backend& b, const T& t, uint64_t) { b.softmax_backward(t[0], t[1], log, t[2]); });
}

void Recorder::gemm(const backend::GemmArgs& args) {
  // The operands travel by position; the geometry and scalars stay in the copy the runner holds.
  backend::GemmArgs g = args;
  g.a = g.b = g.c = g.bias = g.aux = Tensor();
  add("gemm", {args.a, args.b, args.c, args.bias, args.aux}, {R, R, args.beta != 0.0 ? RW : W, R, W},
      [g](Backend& b, const T& t, uint64_t) {
        backend::GemmArgs x = g;
        x.a = t[0];
        x.b = t[1];
        x.c = t[2];
        x.bias = t[3];
        x.aux = t[4];
        b.gemm(x);
      });
}

void Recorder::layer_norm(const Tensor& x, const Tensor& w, const Tensor& bt, double eps, const Tensor& y,
                          const Tensor& mean, const Tensor& rstd, const Tensor& residual, const Tensor& sum) {
  add("layer_norm", {x, w, bt, y, mean, rstd, residual, sum}, {R, R, R, W, W, W, R, W},
      [eps](Backend& b, const T& t, uint64_t) {
        b.layer_norm(t[0], t[1], t[2], eps, t[3], t[4], t[5], t[6], t[7]);
      });
}

void Recorder::layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& gy, const Tensor& gx, const Tensor& gw, const Tensor& gb,
                                   const Tensor& gx_add) {
  add("layer_norm_backward", {x, w, mean, rstd, gy, gx, gw, gb, gx_add}, {R, R, R, R, R, W, W, W, R},
      [](Backend& b, const T& t, uint64_t) {
        b.layer_norm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]);
      });
}

void Recorder::rms_norm(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd,
                        const Tensor& residual, const Tensor& sum) {
  add("rms_norm", {x, w, y, rstd, residual, sum}, {R, R, W, W, R, W},
      [eps](Backend& b, const T& t, uint64_t) { b.rms_norm(t[0], t[1], eps, t[2], t[3], t[4], t[5]); });
}

void Recorder::rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& gy,
                                 const Tensor& gx, const Tensor& gw, const Tensor& gx_add) {
  add("rms_norm_backward", {x, w, rstd, gy, gx, gw, gx_add}, {R, R, R, R, W, W, R},
      [](Backend& b, const T& t, uint64_t) {
        b.rms_norm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
      });
}

void Recorder::cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                             double smoothing, const Tensor& loss, const Tensor& lse) {
  add("cross_entropy", {logits, labels, loss, lse}, {R, R, W, W},
      [ignore_index, smoothing](Backend& b, const T& t, uint64_t) {
        b.cross_entropy(t[0], t[1], ignore_index, smoothing, t[2], t[3]);
      });
}

void Recorder::cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                      const Tensor& grad_loss, int64_t ignore_index, double smoothing,
                                      const Tensor& glogits) {
  add("cross_entropy_backward", {logits, labels, lse, grad_loss, glogits}, {R, R, R, R, W},
      [ignore_index, smoothing](Backend& b, const T& t, uint64_t) {
        b.cross_entropy_backward(t[0], t[1], t[2], t[3], ignore_index, smoothing, t[4]);
      });
}

void Recorder::cross_entropy_with_grad(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                                       double smoothing, const Tensor& loss, const Tensor& lse,
                                       const Tensor& grad_loss, const Tensor& glogits) {
  add("cross_entropy_with_grad", {logits, labels, loss, lse, grad_loss, glogits}, {R, R, W, W, R, W},
      [ignore_index, smoothing](Backend& b, const T& t, uint64_t) {
        b.cross_entropy_with_grad(t[0], t[1], ignore_index, smoothing, t[2], t[3], t[4], t[5]);
      });
}

void Recorder::embedding(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  add("embedding", {weight, ids, out}, {R, R, W},
      [](Backend& b, const T& t, uint64_t) { b.embedding(t[0], t[1], t[2]); });
}

void Recorder::embedding_backward(const Tensor& gy, const Tensor& ids, const Tensor& gweight) {
  add("embedding_backward", {gy, ids, gweight}, {R, R, W},
      [](Backend& b, const T& t, uint64_t) { b.embedding_backward(t[0], t[1], t[2]); });
}

void Recorder::rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions,
                    bool seq_major, bool inverse, const Tensor& y) {
  add("rope", {x, cos, sin, positions, y}, {R, R, R, R, W},
      [=](Backend& b, const T& t, uint64_t) { b.rope(t[0], t[1], t[2], t[3], seq_major, inverse, t[4]); });
}

namespace {
// The dropout of a replay: the Philox offset moved by the step's shift.
backend::AttentionDropout drop_at(backend::AttentionDropout d, uint64_t shift) {
  if (d.p > 0) d.offset += shift;
  return d;
}
}  // namespace

void Recorder::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                         bool causal, int64_t window, double scale, const backend::AttentionDropout& drop,
                         const Tensor& out, const Tensor& lse) {
  add("attention", {q, k, v, key_keep, out, lse}, {R, R, R, R, W, W},
      [=](Backend& b, const T& t, uint64_t shift) {
        b.attention(t[0], t[1], t[2], t[3], causal, window, scale, drop_at(drop, shift), t[4], t[5]);
      });
}

void Recorder::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                                  bool causal, int64_t window, double scale,
                                  const backend::AttentionDropout& drop, const Tensor& out, const Tensor& lse,
                                  const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  add("attention_backward", {q, k, v, key_keep, out, lse, dout, dq, dk, dv}, {R, R, R, R, R, R, R, W, W, W},
      [=](Backend& b, const T& t, uint64_t shift) {
        b.attention_backward(t[0], t[1], t[2], t[3], causal, window, scale, drop_at(drop, shift), t[4], t[5],
                             t[6], t[7], t[8], t[9]);
      });
}

namespace {
// The block's geometry and dropout, with the key mask passed by position and the Philox offset moved.
Backend::AttentionBlock block_at(Backend::AttentionBlock a, const Tensor& key_keep, uint64_t shift) {
  a.key_keep = key_keep;
  if (a.dropout > 0) a.offset += shift;
  return a;
}
}  // namespace

void Recorder::attention_block_softmax(const Tensor& scores, const AttentionBlock& a, const Tensor& probs,
                                       const Tensor& lse) {
  AttentionBlock g = a;
  g.key_keep = Tensor();
  add("attention_block_softmax", {scores, a.key_keep, probs, lse}, {R, R, W, W},
      [g](Backend& b, const T& t, uint64_t shift) {
        b.attention_block_softmax(t[0], block_at(g, t[1], shift), t[2], t[3]);
      });
}

void Recorder::attention_block_grad(const Tensor& scores, const Tensor& dp, const Tensor& lse,
                                    const Tensor& delta, const AttentionBlock& a, const Tensor& probs,
                                    const Tensor& dscores) {
  AttentionBlock g = a;
  g.key_keep = Tensor();
  add("attention_block_grad", {scores, dp, lse, delta, a.key_keep, probs, dscores}, {R, R, R, R, R, W, W},
      [g](Backend& b, const T& t, uint64_t shift) {
        b.attention_block_grad(t[0], t[1], t[2], t[3], block_at(g, t[4], shift), t[5], t[6]);
      });
}

void Recorder::dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& y) {
  add("dropout", {x, y}, {R, W},
      [=](Backend& b, const T& t, uint64_t shift) { b.dropout(t[0], p, seed, offset + shift, t[1]); });
  pointwise(
      {x, y},
      Stage{
          .kind = Stage::Kind::dropout, .alpha = p, .seed = seed, .offset = offset, .in = {0, 0}, .out = 1});
}

// The optimizer passes run after the captured region, eagerly: inside it they end the capture.
void Recorder::grad_stats(const std::vector<Tensor>& grads, double inv_scale, const Tensor& stats) {
  refuse("grad_stats");
  inner_.grad_stats(grads, inv_scale, stats);
}

void Recorder::transform_grads(const std::vector<std::pair<Tensor, Tensor>>& src_dst,
                               const GradTransform& t) {
  refuse("transform_grads");
  inner_.transform_grads(src_dst, t);
}

void Recorder::fused_adamw(const std::vector<AdamWTensors>& tensors, const AdamWHyper& h,
                           const GradTransform& t) {
  refuse("fused_adamw");
  inner_.fused_adamw(tensors, h, t);
}

void Recorder::sgd(const std::vector<SgdTensors>& tensors, const SgdHyper& h) {
  refuse("sgd");
  inner_.sgd(tensors, h);
}

void Recorder::anyprecision_adamw(const std::vector<AnyPrecisionTensors>& tensors,
                                  const AnyPrecisionHyper& h) {
  refuse("anyprecision_adamw");
  inner_.anyprecision_adamw(tensors, h);
}

void Recorder::elementwise_step(const std::vector<ElementwiseTensors>& tensors, const ElementwiseHyper& h) {
  refuse("elementwise_step");
  inner_.elementwise_step(tensors, h);
}

void Recorder::elementwise_8bit(const std::vector<Elementwise8bitTensors>& tensors, const ElementwiseHyper& h,
                                const Tensor& signed_map) {
  refuse("elementwise_8bit");
  inner_.elementwise_8bit(tensors, h, signed_map);
}

void Recorder::adamw_8bit(const std::vector<AdamW8bitTensors>& tensors, const Tensor& signed_map,
                          const Tensor& unsigned_map) {
  refuse("adamw_8bit");
  inner_.adamw_8bit(tensors, signed_map, unsigned_map);
}

}  // namespace tr::compile
