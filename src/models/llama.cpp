// LlamaForCausalLM (also mistral, qwen2 and qwen3 layouts; qwen3's per-head q/k RMSNorm): RMSNorm, rotary
// embeddings with default / linear / llama3 scaling, grouped-query attention, SwiGLU MLP, optional biases,
// tied or untied head.
#include <cmath>

#include "autograd/checkpoint.h"
#include "models/gpt2.h"

namespace tr::models {

namespace {

struct LlamaLayer {
  nn::RMSNorm input_layernorm, post_attention_layernorm;
  nn::RMSNorm q_norm, k_norm;  // qwen3 only (over head_dim)
  nn::Linear q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
};

// HF's inverse frequencies with rope scaling applied (modeling_rope_utils).
std::vector<float> inv_freq_for(const ModelConfig& c) {
  const int64_t d = c.head_dim;
  std::vector<float> inv(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i)
    inv[static_cast<size_t>(i)] =
        1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(2 * i) / static_cast<float>(d));
  const auto& r = c.rope_scaling;
  if (r.type == "linear") {
    for (auto& f : inv) f = static_cast<float>(f / r.factor);
  } else if (r.type == "llama3") {
    const double old_len = static_cast<double>(r.original_max_position_embeddings);
    const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2.0 * M_PI / static_cast<double>(f);
      double v = wavelen > low_wavelen ? f / r.factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const double smooth =
            (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        v = (1.0 - smooth) * v / r.factor + smooth * v;
      }
      f = static_cast<float>(v);
    }
  }
  return inv;
}

class Llama final : public CausalLM {
 public:
  // Parameters come from `init` (on the meta device when a checkpoint will replace them).
  Llama(const ModelConfig& c, Device d, DType t, const nn::Init& init) : CausalLM(c, d, t) {
    const double std = c.initializer_range;
    const int64_t D = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
    embed_ = {init.normal({c.vocab_size, D}, std)};
    for (int64_t i = 0; i < c.num_layers; ++i) {
      LlamaLayer l;
      l.input_layernorm = {init.ones({D}), c.norm_eps};
      l.q_proj = init.linear(D, q, c.attention_bias, std);
      l.k_proj = init.linear(D, kv, c.attention_bias, std);
      l.v_proj = init.linear(D, kv, c.attention_bias, std);
      l.o_proj = init.linear(q, D, c.o_proj_bias, std);
      if (c.qk_norm) {
        l.q_norm = {init.ones({c.head_dim}), c.norm_eps};
        l.k_norm = {init.ones({c.head_dim}), c.norm_eps};
      }
      l.post_attention_layernorm = {init.ones({D}), c.norm_eps};
      l.gate_proj = init.linear(D, c.intermediate_size, c.mlp_bias, std);
      l.up_proj = init.linear(D, c.intermediate_size, c.mlp_bias, std);
      l.down_proj = init.linear(c.intermediate_size, D, c.mlp_bias, std);
      layers_.push_back(std::move(l));
    }
    norm_ = {init.ones({D}), c.norm_eps};
    if (!c.tie_word_embeddings) lm_head_ = init.normal({c.vocab_size, D}, std);
    rope_ = ops::rope_tables_from_inv_freq(c.max_position_embeddings, inv_freq_for(c), d);
  }

  nn::ParamList named_parameters() override {
    nn::ParamList p;
    embed_.params("model.embed_tokens", p);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const std::string h = "model.layers." + std::to_string(i);
      auto& l = layers_[i];
      l.input_layernorm.params(h + ".input_layernorm", p);
      l.q_proj.params(h + ".self_attn.q_proj", p);
      l.k_proj.params(h + ".self_attn.k_proj", p);
      l.v_proj.params(h + ".self_attn.v_proj", p);
      l.o_proj.params(h + ".self_attn.o_proj", p);
      if (l.q_norm.weight.defined()) {
        l.q_norm.params(h + ".self_attn.q_norm", p);
        l.k_norm.params(h + ".self_attn.k_norm", p);
      }
      l.post_attention_layernorm.params(h + ".post_attention_layernorm", p);
      l.gate_proj.params(h + ".mlp.gate_proj", p);
      l.up_proj.params(h + ".mlp.up_proj", p);
      l.down_proj.params(h + ".mlp.down_proj", p);
    }
    norm_.params("model.norm", p);
    if (lm_head_.defined()) p.emplace_back("lm_head.weight", &lm_head_);
    return p;
  }

  CausalLMOutput forward(const Tensor& ids, const ForwardOptions& o) override {
    TR_CHECK(ids.dim() == 2 && ids.dtype() == DType::i64, "{}: input_ids must be int64 [B, T], got {}",
             config_.model_type, ids.describe());
    const int64_t B = ids.size(0), T = ids.size(1);
    const int64_t past = o.cache ? o.cache->length : 0, S = past + T;
    TR_CHECK(S <= config_.max_position_embeddings, "{}: position {} exceeds max_position_embeddings {}",
             config_.model_type, S, config_.max_position_embeddings);
    // On the device (no upload per forward: a captured step replays it), one row per sequence
    const Tensor positions = ops::contiguous(ops::expand(
        ops::reshape(ops::arange(T, DType::i64, device_, static_cast<double>(past)), {1, T}), {B, T}));
    const bool eager = attn_ == AttnImplementation::eager;  // only eager reads the mask (sdpa: key_keep)
    // Sliding-window layers (config.window_of) see only their window: eager's second mask holds it (a window
    // at least S long changes nothing and is not built).
    const int64_t window =
        config_.sliding_window > 0 && config_.sliding_window < S ? config_.sliding_window : 0;
    const Tensor mask = eager ? attention_mask_for(B, T, S, o.attention_mask) : Tensor();
    const Tensor window_mask =
        eager && window > 0 ? attention_mask_for(B, T, S, o.attention_mask, window) : Tensor();
    const Tensor keep = key_keep_for(o.attention_mask);
    // A split model (device_map): each layer reads these on its own device.
    const LayerInputs inputs({positions, mask, window_mask, keep}, placement_);
    root_begin();
    Tensor h = neftune(embed_(ops::to_device(ids, placement_.embeddings)), o);
    embeddings_done();
    for (size_t li = 0; li < layers_.size(); ++li) {
      const Device dev = placement_.layers[li];
      const std::vector<Tensor>& in = inputs.at(dev);
      // Captures by value: a checkpoint region runs again during backward, after forward() has returned.
      const bool slides = window > 0 && config_.window_of(static_cast<int64_t>(li)) > 0;
      const Tensor layer_mask = slides ? in[2] : in[1];
      const int64_t layer_window = slides ? window : 0;
      auto layer = [this, li, layer_mask, layer_window, keep = in[3], positions = in[0], rope = rope_on(dev),
                    o](const std::vector<Tensor>& x) -> std::vector<Tensor> {
        return {decoder_layer(layers_[li], li, x[0], layer_mask, layer_window, keep, positions, rope, o)};
      };
      h = run_layer(layer, to_device(h, dev), o, li);
    }
    if (o.cache) o.cache->length = S;
    head_begin();
    h = norm_(to_device(h, placement_.head));
    CausalLMOutput out = head_and_loss(h, lm_head_.defined() ? lm_head_ : embed_.weight, o);
    root_end();
    return out;
  }

 private:
  Tensor decoder_layer(LlamaLayer& l, size_t li, const Tensor& x, const Tensor& mask, int64_t window,
                       const Tensor& keep, const Tensor& positions, const ops::RopeTables& tables,
                       const ForwardOptions& o) {
    const auto& c = config_;
    const int64_t B = x.size(0), T = x.size(1), H = c.num_heads, KV = c.num_kv_heads, hd = c.head_dim;
    Tensor a = l.input_layernorm(x);
    // [B, T, H*hd] -> [B, T, H, hd]: rope in sequence-major layout, then heads first for attention
    Tensor q = view(l.q_proj(a), {B, T, H, hd}), k = view(l.k_proj(a), {B, T, KV, hd});
    if (l.q_norm.weight.defined()) {  // qwen3: each head's q and k normalized before rotary
      q = l.q_norm(q);
      k = l.k_norm(k);
    }
    q = rope(q, tables, positions, true);
    k = rope(k, tables, positions, true);
    Tensor v = view(l.v_proj(a), {B, T, KV, hd});
    auto [kc, vc] = cached_kv(o, li, transpose(k, 1, 2), transpose(v, 1, 2));
    Tensor att = attend(transpose(q, 1, 2), kc, vc, mask, keep, c.attn_pdrop, o, window);
    // The residual add and post_attention_layernorm in one pass (h: the residual stream, m: its norm).
    auto [h, m] = add_rms_norm(x, l.o_proj(reshape(transpose(att, 1, 2), {B, T, H * hd})),
                               l.post_attention_layernorm.weight, l.post_attention_layernorm.eps);
    return add(h, l.down_proj(mul(silu(l.gate_proj(m)), l.up_proj(m))));
  }

  // The rotary tables on `d` (a split model keeps a copy on each of its devices).
  const ops::RopeTables& rope_on(Device d) const {
    for (const auto& [dev, t] : rope_copies_)
      if (dev == d) return t;
    return rope_;
  }
  void on_placement() override {
    rope_copies_.clear();
    for (const Device d : placement_.devices())
      if (!(d == rope_.cos.device()))
        rope_copies_.emplace_back(
            d, ops::RopeTables{ops::to_device(rope_.cos, d), ops::to_device(rope_.sin, d)});
  }

  nn::Embedding embed_;
  std::vector<LlamaLayer> layers_;
  nn::RMSNorm norm_;
  Tensor lm_head_;
  ops::RopeTables rope_;
  std::vector<std::pair<Device, ops::RopeTables>> rope_copies_;
};

}  // namespace

std::unique_ptr<CausalLM> make_llama(const ModelConfig& c, Device d, DType t, const nn::Init& init) {
  return std::make_unique<Llama>(c, d, t, init);
}

}  // namespace tr::models
