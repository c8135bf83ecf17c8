// Shared parts of the causal LMs: loss with HF's label shift, attention masks, eager attention, and the
// model registry.
#include "models/causal_lm.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tr::models {

bool CausalLM::transposed_on_disk(const std::string&) const { return false; }

AttnImplementation parse_attn_implementation(const std::string& name) {
  if (name == "eager") return AttnImplementation::eager;
  if (name == "sdpa") return AttnImplementation::sdpa;
  if (name == "flash_attention_2") return AttnImplementation::flash_attention_2;
  fail("attn_implementation '{}' is not one of eager, sdpa, flash_attention_2", name);
}

const char* attn_implementation_name(AttnImplementation a) {
  switch (a) {
    case AttnImplementation::eager: return "eager";
    case AttnImplementation::sdpa: return "sdpa";
    case AttnImplementation::flash_attention_2: return "flash_attention_2";
  }
  return "?";
}

Tensor CausalLM::key_keep_for(const Tensor& am) const {
  if (!am.defined()) return Tensor();
  if (device_.is_meta()) return ops::empty(am.shape(), DType::boolean, device_);
  return ops::to_device(ops::to_dtype(am, DType::boolean), device_);
}

Tensor CausalLM::attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const Tensor& key_keep, double dropout_p, const ForwardOptions& o,
                        int64_t window) const {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), KV = k.size(1), S = k.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const bool drop = o.training && o.dropout_gen && dropout_p > 0;
  // sdpa / flash_attention_2: the form ops::attention_form_for picks (dropout draws eager's mask in either).
  if (attn_ != AttnImplementation::eager) {
    std::optional<DeviceType> target = attention_device_;
    for (const auto& [d, t] : attention_devices_)
      if (d == q.device()) target = t;
    const ops::AttentionForm form =
        target ? ops::attention_form_for(*target, q.dtype(), D, drop) : ops::AttentionForm::automatic;
    return scaled_dot_product_attention(q, k, v, key_keep, true, scale, drop ? dropout_p : 0.0, o.dropout_gen,
                                        window, form);
  }
  auto repeat_kv = [&](const Tensor& t) {  // [B, KV, S, D] -> [B, H, S, D]
    if (KV == H) return t;
    return reshape(expand(unsqueeze(t, 2), {B, KV, H / KV, S, D}), {B, H, S, D});
  };
  return eager_attention(q, repeat_kv(k), repeat_kv(v), mask, scale, dropout_p, o.dropout_gen, drop);
}

Tensor neftune_noise(const Tensor& e, double alpha, Generator& gen) {
  TR_CHECK(e.dim() == 3, "neftune: embeddings must be [B, T, hidden], got {}", e.describe());
  // HF's neftune_post_forward_hook: alpha / sqrt(seq_len * hidden), each element its own uniform draw. The
  // noise is a constant to autograd: the embedding's gradient is the plain one.
  const double mag = alpha / std::sqrt(static_cast<double>(e.size(1) * e.size(2)));
  return add(e, ops::rand(e.shape(), gen, e.dtype(), e.device(), -mag, mag));
}

Tensor CausalLM::neftune(const Tensor& e, const ForwardOptions& o) const {
  if (!o.training || o.dropout_gen == nullptr || o.neftune_noise_alpha <= 0) return e;
  return neftune_noise(e, o.neftune_noise_alpha, *o.dropout_gen);
}

Tensor CausalLM::run_layer(const autograd::RegionFn& layer, const Tensor& h, const ForwardOptions& o,
                           size_t index) const {
  const int unit = static_cast<int>(index);
  if (hooks_) hooks_->before_forward(unit);
  Tensor out;
  if (!o.gradient_checkpointing || !autograd::grad_enabled()) {
    out = layer({h})[0];
  } else {
    autograd::CheckpointOptions co;
    if (o.training && o.dropout_gen) co.generators.push_back(o.dropout_gen);
    out = autograd::checkpoint(layer, {h}, co)[0];
  }
  if (!hooks_) return out;
  hooks_->after_forward(unit);
  // The layer's parameters come back before its backward: the hook runs when the output's gradient arrives.
  LayerHooks* hooks = hooks_;
  return backward_hook(out, [hooks, unit] { hooks->before_backward(unit); });
}

bool CausalLM::is_embedding(const std::string& name) {
  return name.ends_with("embed_tokens.weight") || name.ends_with("wte.weight") ||
         name.ends_with("wpe.weight");
}

void CausalLM::set_placement(DevicePlacement p) {
  TR_CHECK(static_cast<int64_t>(p.layers.size()) == config_.num_layers,
           "device placement: {} layer devices for a model of {} layers", p.layers.size(),
           config_.num_layers);
  TR_CHECK(
      !config_.tie_word_embeddings || p.head == p.embeddings,
      "device placement: a tied head reads the embeddings' table, so it runs on their device ({}), not {}",
      p.embeddings.str(), p.head.str());
  TR_CHECK(!hooks_ || p.single(), "device placement: a split model cannot also be sharded (--fsdp)");
  // Several GPUs in one split: each op runs on its tensors' GPU (backend_for makes it current; streams,
  // cuBLAS/cuBLASLt handles and plans are per device) and the boundary copies wait for the source's stream.
  for (const auto& [name, t] : named_parameters())
    TR_CHECK(t->device() == p.of(name), "device placement: '{}' is on {}, its place is {}", name,
             t->device().str(), p.of(name).str());
  placement_ = std::move(p);
  device_ = placement_.embeddings;
  on_placement();
}

CausalLM::LayerInputs::LayerInputs(const std::vector<Tensor>& inputs, const DevicePlacement& placement) {
  for (const Device d : placement.devices()) {
    std::vector<Tensor> on;
    for (const Tensor& t : inputs) on.push_back(t.defined() ? ops::to_device(t, d) : t);
    copies_.emplace_back(d, std::move(on));
  }
}

const std::vector<Tensor>& CausalLM::LayerInputs::at(Device d) const {
  for (const auto& [dev, ts] : copies_)
    if (dev == d) return ts;
  fail("device placement: no inputs on {}", d.str());
}

int CausalLM::decoder_layer_of(const std::string& name) {
  for (const std::string_view key : {"h.", "layers."}) {
    for (size_t at = name.find(key); at != std::string::npos; at = name.find(key, at + 1)) {
      if (at != 0 && name[at - 1] != '.') continue;  // a whole segment ("h.", not "...h.")
      size_t i = at + key.size(), n = 0;
      int v = 0;
      while (i < name.size() && name[i] >= '0' && name[i] <= '9' && n < 9)
        v = v * 10 + (name[i++] - '0'), ++n;
      if (n > 0 && i < name.size() && name[i] == '.') return v;
    }
  }
  return -1;
}

namespace {

// `w` [old, D] grown to `rows` by mean resizing. A draw from N(mu, 1e-9 Sigma) with Sigma = C^T C / old
// (C: the centered old rows) is mu + sqrt(1e-9 / old) C^T z with z ~ N(0, I_old): the same distribution as
// HF's MultivariateNormal without forming or factoring the D x D covariance.
Tensor mean_resized(const Tensor& w, int64_t rows, Generator& gen) {
  const int64_t old = w.size(0), D = w.size(1), added = rows - old;
  const Tensor h = ops::contiguous(ops::to_dtype(ops::to_device(w, Device::cpu()), DType::f32));
  std::vector<double> mu(static_cast<size_t>(D), 0.0);
  const float* src = h.data<float>();
  for (int64_t i = 0; i < old; ++i)
    for (int64_t d = 0; d < D; ++d) mu[static_cast<size_t>(d)] += src[i * D + d];
  for (auto& m : mu) m /= static_cast<double>(old);
  Tensor fresh = ops::empty({added, D}, DType::f32);
  float* dst = fresh.data<float>();
  if (old > D) {  // HF samples only when the covariance can be positive definite
    Tensor c = ops::empty({old, D}, DType::f32);
    float* cp = c.data<float>();
    for (int64_t i = 0; i < old; ++i)
      for (int64_t d = 0; d < D; ++d)
        cp[i * D + d] = static_cast<float>(src[i * D + d] - mu[static_cast<size_t>(d)]);
    const double scale = std::sqrt(1e-9 / static_cast<double>(old));
    for (int64_t r0 = 0; r0 < added; r0 += 64) {  // [64, old] draws at a time: bounded memory
      const int64_t n = std::min<int64_t>(64, added - r0);
      const Tensor noise = ops::matmul(ops::randn({n, old}, gen), c);  // [n, D]
      const float* np = noise.data<float>();
      for (int64_t r = 0; r < n; ++r)
        for (int64_t d = 0; d < D; ++d)
          dst[(r0 + r) * D + d] = static_cast<float>(mu[static_cast<size_t>(d)] + scale * np[r * D + d]);
    }
  } else {
    for (int64_t r = 0; r < added; ++r)
      for (int64_t d = 0; d < D; ++d) dst[r * D + d] = static_cast<float>(mu[static_cast<size_t>(d)]);
  }
  Tensor out = ops::to_device(ops::to_dtype(ops::cat({h, fresh}, 0), w.dtype()), w.device());
  autograd::set_requires_grad(out, true);
  return out;
}

}  // namespace

void CausalLM::resize_token_embeddings(int64_t new_vocab, Generator& gen) {
  const int64_t old = config_.vocab_size;
  TR_CHECK(new_vocab >= old, "resize_token_embeddings: {} rows is fewer than the model's vocab_size {}",
           new_vocab, old);
  if (new_vocab == old) return;
  const auto is_vocab_matrix = [&](const std::string& n, const Tensor& t) {
    const bool named =
        n == "lm_head.weight" || n.ends_with("embed_tokens.weight") || n.ends_with("wte.weight");
    return named && t.dim() == 2 && t.size(0) == old;
  };
  for (auto& [name, p] : named_parameters())
    if (is_vocab_matrix(name, *p)) *p = mean_resized(*p, new_vocab, gen);
  config_.vocab_size = new_vocab;
  config_.raw["vocab_size"] = new_vocab;  // what config.json will say
}

int64_t CausalLM::num_parameters() {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t->numel();
  return n;
}

std::vector<std::string> CausalLM::linear_weight_names() {
  std::vector<std::string> out;
  for (auto& [name, t] : named_parameters()) {
    const bool embedding =
        name.ends_with("embed_tokens.weight") || name.ends_with("wte.weight") || name.ends_with("wpe.weight");
    if (t->dim() == 2 && name.ends_with(".weight") && !embedding) out.push_back(name);
  }
  return out;
}

CausalLMOutput CausalLM::head_and_loss(const Tensor& h, const Tensor& w, const ForwardOptions& opts) const {
  CausalLMOutput out;
  const int64_t B = h.size(0), T = h.size(1), D = h.size(2);
  if (opts.return_logits) out.logits = linear(h, w);
  if (!opts.labels.defined()) return out;
  const Tensor& labels = opts.labels;
  TR_CHECK(labels.dtype() == DType::i64 && labels.shape() == Shape({B, T}),
           "loss: labels must be int64 [{}, {}] like input_ids, got {}", B, T, labels.describe());
  // Shift on the device (a fill and a strided copy; no host round trip, so a captured step replays it):
  // position t predicts label t+1, the last position has nothing to predict.
  Tensor sl = ops::full({B, T}, -100.0, DType::i64, h.device());
  if (T > 1) ops::copy_(ops::narrow(sl, 1, 0, T - 1), ops::narrow(labels, 1, 1, T - 1));
  sl = ops::view(sl, {B * T});
  // The divisor: the training step's device scalar (inv_num_items), else num_items_in_batch, else the labels'
  // own count (evaluation, direct calls), read on the host.
  double denom = opts.num_items_in_batch;
  if (!opts.inv_num_items.defined() && denom <= 0) {
    denom = 0;
    const std::vector<int64_t> l = ops::to_vector<int64_t>(labels);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 1; t < T; ++t) denom += l[static_cast<size_t>(b * T + t)] != -100;
  }
  Tensor sum_loss;
  if (out.logits.defined()) {
    Tensor lf = cast(reshape(out.logits, {B * T, out.logits.size(2)}),
                     h.dtype() == DType::f64 ? DType::f64 : DType::f32);
    sum_loss = cross_entropy(lf, sl, -100, Reduction::sum, opts.label_smoothing);
  } else {
    sum_loss = linear_cross_entropy_sum(reshape(h, {B * T, D}), w, sl, 1024, -100, opts.label_smoothing);
  }
  if (opts.inv_num_items.defined()) {
    TR_CHECK(opts.inv_num_items.numel() == 1 && opts.inv_num_items.device() == sum_loss.device(),
             "loss: inv_num_items must be one value on {}, got {}", sum_loss.device().str(),
             opts.inv_num_items.describe());
    // x * float(1 / n): the bits of mul_scalar's affine (x * float(1 / n) + 0) for the losses' values
    out.loss = mul(sum_loss, ops::to_dtype(ops::reshape(opts.inv_num_items, {}), sum_loss.dtype()));
  } else {
    out.loss = mul_scalar(sum_loss, denom > 0 ? 1.0 / denom : 0.0);  // no label at all: loss 0, gradient 0
  }
  return out;
}

Tensor CausalLM::attention_mask_for(int64_t B, int64_t T, int64_t S, const Tensor& am, int64_t window) const {
  using backend::BinaryOp, backend::UnaryOp;
  if (am.defined())
    TR_CHECK(am.dim() == 2 && am.size(0) == B && am.size(1) == S,
             "attention_mask {} does not match [batch {}, positions {}]", am.describe(), B, S);
  // Built on the model's device from two position ramps (no host loop or upload per forward, so a captured
  // step replays it and a GPU step does not wait on the host). f32 holds the integer positions exactly.
  const Tensor keys = ops::reshape(ops::arange(S, DType::f32, device_), {1, S});
  const Tensor queries =
      ops::reshape(ops::arange(T, DType::f32, device_, static_cast<double>(S - T)), {T, 1});
  const Tensor ahead = ops::binary(BinaryOp::sub, keys, queries);  // key j - (query i + S - T)
  Tensor hidden = ops::unary(UnaryOp::relu, ahead);                // nonzero where the key is in the future
  if (window > 0)  // nonzero where the key is `window` or more positions back: -ahead - window + 1 > 0
    hidden =
        ops::binary(BinaryOp::add, hidden,
                    ops::unary(UnaryOp::relu, ops::affine(ahead, -1.0, 1.0 - static_cast<double>(window))));
  if (am.defined()) {  // 1 where attention_mask is 0 (padding), broadcast over the queries
    const Tensor keep = ops::to_dtype(ops::to_dtype(ops::to_device(am, device_), DType::boolean), DType::f32);
    hidden = ops::binary(BinaryOp::add, ops::reshape(ops::affine(keep, -1.0, 1.0), {B, 1, 1, S}), hidden);
  }
  return ops::reshape(ops::to_dtype(hidden, DType::boolean), {am.defined() ? B : 1, 1, T, S});
}

std::pair<Tensor, Tensor> CausalLM::cached_kv(const ForwardOptions& o, size_t layer, const Tensor& k,
                                              const Tensor& v) const {
  if (!o.cache) return {k, v};
  KVCache& c = *o.cache;
  if (c.k.size() <= layer) {
    c.k.resize(layer + 1);
    c.v.resize(layer + 1);
  }
  if (c.k[layer].defined()) {
    c.k[layer] = cat({c.k[layer], k}, 2);
    c.v[layer] = cat({c.v[layer], v}, 2);
  } else {
    c.k[layer] = contiguous(k);
    c.v[layer] = contiguous(v);
  }
  return {c.k[layer], c.v[layer]};
}

Tensor eager_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double scale,
                       double dropout_p, Generator* gen, bool training) {
  Tensor s = mul_scalar(matmul(q, k, false, true), scale);
  // HF upcasts the scores to f32 for the softmax.
  const DType dt = q.dtype();
  Tensor p = softmax(cast(masked_fill(s, mask, -INFINITY), dt == DType::f64 ? DType::f64 : DType::f32), -1);
  p = cast(p, dt);
  if (training && dropout_p > 0) {
    TR_CHECK(gen != nullptr, "attention dropout needs a generator");
    p = dropout(p, dropout_p, *gen, true);
  }
  return matmul(p, v);
}

}  // namespace tr::models
