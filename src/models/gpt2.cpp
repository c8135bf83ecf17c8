// GPT2LMHeadModel: learned positions, pre-LayerNorm blocks, fused c_attn projection, gelu_new MLP, tied
// head. HF stores c_attn / c_proj / c_fc weights as Conv1D ([in, out]); we hold them as Linear ([out, in])
// and transpose at load and save.
#include <cmath>

#include "autograd/checkpoint.h"
#include "models/gpt2.h"

namespace tr::models {

namespace {

struct Gpt2Block {
  nn::LayerNorm ln_1, ln_2;
  nn::Linear c_attn, attn_proj, c_fc, mlp_proj;
};

class Gpt2 final : public CausalLM {
 public:
  // Parameters come from `init` (on the meta device when a checkpoint will replace them).
  Gpt2(const ModelConfig& c, Device d, DType t, const nn::Init& init) : CausalLM(c, d, t) {
    const double std = c.initializer_range,
                 proj_std = std / std::sqrt(2.0 * static_cast<double>(c.num_layers));
    const int64_t D = c.hidden_size;
    wte_ = {init.normal({c.vocab_size, D}, std)};
    wpe_ = {init.normal({c.max_position_embeddings, D}, std)};
    for (int64_t i = 0; i < c.num_layers; ++i) {
      Gpt2Block b;
      b.ln_1 = {init.ones({D}), init.zeros({D}), c.norm_eps};
      b.c_attn = init.linear(D, 3 * D, true, std);
      b.attn_proj = init.linear(D, D, true, proj_std);  // HF scales residual projections by 1/sqrt(2 n_layer)
      b.ln_2 = {init.ones({D}), init.zeros({D}), c.norm_eps};
      b.c_fc = init.linear(D, c.intermediate_size, true, std);
      b.mlp_proj = init.linear(c.intermediate_size, D, true, proj_std);
      blocks_.push_back(std::move(b));
    }
    ln_f_ = {init.ones({D}), init.zeros({D}), c.norm_eps};
    if (!c.tie_word_embeddings) lm_head_ = {init.normal({c.vocab_size, D}, std)};
  }

  nn::ParamList named_parameters() override {
    nn::ParamList p;
    wte_.params("transformer.wte", p);
    wpe_.params("transformer.wpe", p);
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const std::string h = "transformer.h." + std::to_string(i);
      auto& b = blocks_[i];
      b.ln_1.params(h + ".ln_1", p);
      b.c_attn.params(h + ".attn.c_attn", p);
      b.attn_proj.params(h + ".attn.c_proj", p);
      b.ln_2.params(h + ".ln_2", p);
      b.c_fc.params(h + ".mlp.c_fc", p);
      b.mlp_proj.params(h + ".mlp.c_proj", p);
    }
    ln_f_.params("transformer.ln_f", p);
    if (lm_head_.defined()) p.emplace_back("lm_head.weight", &lm_head_);
    return p;
  }

  bool transposed_on_disk(const std::string& name) const override {
    auto ends = [&](const char* s) {
      const std::string suf(s);
      return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
    };
    return ends(".attn.c_attn.weight") || ends(".attn.c_proj.weight") || ends(".mlp.c_fc.weight") ||
           ends(".mlp.c_proj.weight");
  }

  CausalLMOutput forward(const Tensor& ids, const ForwardOptions& o) override {
    TR_CHECK(ids.dim() == 2 && ids.dtype() == DType::i64, "gpt2: input_ids must be int64 [B, T], got {}",
             ids.describe());
    const int64_t B = ids.size(0), T = ids.size(1);
    const auto& c = config_;
    TR_CHECK(T <= c.max_position_embeddings, "gpt2: sequence length {} exceeds n_positions {}", T,
             c.max_position_embeddings);
    const bool drop = o.training && o.dropout_gen;
    const int64_t past = o.cache ? o.cache->length : 0, S = past + T;
    TR_CHECK(S <= c.max_position_embeddings, "gpt2: position {} exceeds n_positions {}", S,
             c.max_position_embeddings);
    // On the device (no upload per forward: a captured step replays it)
    const Tensor pos = ops::arange(T, DType::i64, device_, static_cast<double>(past));
    root_begin();
    const Tensor on_embeddings = ops::to_device(ids, placement_.embeddings);
    Tensor h = add(neftune(wte_(on_embeddings), o), wpe_(ops::to_device(pos, placement_.embeddings)));
    if (drop) h = dropout(h, c.embd_pdrop, *o.dropout_gen);
    embeddings_done();
    const bool eager = attn_ == AttnImplementation::eager;  // only eager reads the mask (sdpa: key_keep)
    const Tensor mask = eager ? attention_mask_for(B, T, S, o.attention_mask) : Tensor();
    const Tensor keep = key_keep_for(o.attention_mask);
    // A split model (device_map): each layer reads these on its own device.
    const LayerInputs inputs({mask, keep}, placement_);
    for (size_t li = 0; li < blocks_.size(); ++li) {
      const Device dev = placement_.layers[li];
      // Captures by value: a checkpoint region runs again during backward, after forward() has returned.
      auto layer = [this, li, mask = inputs.at(dev)[0], keep = inputs.at(dev)[1],
                    o](const std::vector<Tensor>& in) -> std::vector<Tensor> {
        return {block(blocks_[li], li, in[0], mask, keep, o)};
      };
      h = run_layer(layer, to_device(h, dev), o, li);
    }
    if (o.cache) o.cache->length = S;
    head_begin();
    h = ln_f_(to_device(h, placement_.head));
    CausalLMOutput out = head_and_loss(h, lm_head_.defined() ? lm_head_ : wte_.weight, o);
    root_end();
    return out;
  }

 private:
  Tensor block(Gpt2Block& b, size_t li, const Tensor& x, const Tensor& mask, const Tensor& keep,
               const ForwardOptions& o) {
    const auto& c = config_;
    const int64_t B = x.size(0), T = x.size(1), D = c.hidden_size, H = c.num_heads, hd = c.head_dim;
    const bool drop = o.training && o.dropout_gen;
    auto qkv = split(b.c_attn(b.ln_1(x)), {D, D, D}, -1);
    auto heads = [&](const Tensor& t) { return transpose(view(t, {B, T, H, hd}), 1, 2); };
    auto [k, v] = cached_kv(o, li, heads(qkv[1]), heads(qkv[2]));
    Tensor a = attend(heads(qkv[0]), k, v, mask, keep, c.attn_pdrop, o);
    a = b.attn_proj(reshape(transpose(a, 1, 2), {B, T, D}));
    if (drop) a = dropout(a, c.resid_pdrop, *o.dropout_gen);
    // The residual add and ln_2 in one pass (h: the residual stream, n: its norm); the GELU (gelu_new /
    // gelu_pytorch_tanh) rides on the c_fc GEMM's epilogue, the erf form stays separate.
    auto [h, n] = add_layer_norm(x, a, b.ln_2.weight, b.ln_2.bias, b.ln_2.eps);
    Tensor f = c.activation == "gelu" ? gelu(b.c_fc(n), false) : linear_gelu(n, b.c_fc.weight, b.c_fc.bias);
    Tensor m = b.mlp_proj(f);
    if (drop) m = dropout(m, c.resid_pdrop, *o.dropout_gen);
    return add(h, m);
  }

  nn::Embedding wte_, wpe_;
  std::vector<Gpt2Block> blocks_;
  nn::LayerNorm ln_f_;
  Tensor lm_head_;
};

}  // namespace

std::unique_ptr<CausalLM> make_gpt2(const ModelConfig& c, Device d, DType t, const nn::Init& init) {
  return std::make_unique<Gpt2>(c, d, t, init);
}

}  // namespace tr::models
