// The causal language models (GPT2LMHeadModel, LlamaForCausalLM) behind one interface, with Hugging Face
// parameter names, HF initialization, and from_pretrained / save_pretrained in HF's folder format.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "autograd/checkpoint.h"
#include "models/config.h"
#include "models/device_map.h"
#include "nn/layers.h"

namespace tr::models {

// Keys and values of the positions seen so far, per layer ([B, KV, S, D]), for incremental decoding.
struct KVCache {
  std::vector<Tensor> k, v;
  int64_t length = 0;
};

// What ZeRO-3 (--fsdp full_shard) needs of a forward pass: a unit's parameters exist only between its
// gather and its release. Unit -1 is the root (embeddings, final norm, LM head; see after_embeddings for
// owners that hold the embeddings apart), unit i decoder layer i. The
// model calls before_forward(u) before a unit's first use and after_forward(u) after its last use in the
// forward pass, and - with grad mode on - before_backward(i) when layer i's output gradient arrives, before
// any of the layer's backward runs (an identity node on its output). Releasing after backward is the
// owner's business (its parameters' gradients are final then).
class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void before_forward(int unit) = 0;
  virtual void after_forward(int unit) = 0;
  virtual void before_backward(int unit) = 0;
  // Inside the root's forward, for owners that hold its two ends apart (an untied head): after the
  // embeddings' lookup (whose backward needs no weights) and before the final norm and head.
  virtual void after_embeddings() {}
  virtual void before_head() {}
};

// HF's attn_implementation: "eager" (materialized scores, the reference), "sdpa" and "flash_attention_2"
// (both the fused memory-efficient kernel).
enum class AttnImplementation { eager, sdpa, flash_attention_2 };
// The HF name; throws listing the valid ones.
AttnImplementation parse_attn_implementation(const std::string& name);
const char* attn_implementation_name(AttnImplementation a);

struct ForwardOptions {
  Tensor labels;                  // int64 [B, T]; shifted inside (HF semantics), -100 ignored
  Tensor attention_mask;          // int64/bool [B, T]; 0 marks padding (keys never attended)
  double num_items_in_batch = 0;  // > 0: loss = sum / num_items_in_batch (accumulation-exact); else mean
  // Given (a 0-d f64 tensor on the model's device holding 1 / num_items_in_batch, or 0 for no label): the
  // loss is multiplied by it as read on the device, not by a host constant, so a captured step
  // (torch_compile) replays for any label count; the bits are those of num_items_in_batch.
  Tensor inv_num_items;
  // HF's label_smoothing_factor: each token's loss against (1 - e) * onehot + e / vocab (torch's
  // label_smoothing); 0 is the plain cross-entropy.
  double label_smoothing = 0;
  // HF's neftune_noise_alpha (NEFTune): in training, the token embeddings (before GPT-2's positions are
  // added) get uniform noise in +-alpha / sqrt(T * hidden), drawn from dropout_gen; 0 is none.
  double neftune_noise_alpha = 0;
  bool return_logits = true;
  bool training = false;  // dropout on
  Generator* dropout_gen = nullptr;
  bool gradient_checkpointing = false;  // each decoder layer a checkpoint region
  KVCache* cache =
      nullptr;  // incremental decoding: input_ids continue the cached positions (mask covers all)
};

// NEFTune's noise on token embeddings e [B, T, hidden]: e + uniform(-m, m) per element, m = alpha /
// sqrt(T * hidden), drawn from gen (HF's neftune_post_forward_hook). Differentiable in e (gradient 1). The
// noise is drawn in e's dtype (under bf16 it is rounded to bf16 before the add; HF's autocast adds f32 noise
// to f32 embeddings) - a difference far below the noise itself.
Tensor neftune_noise(const Tensor& embeddings, double alpha, Generator& gen);

struct CausalLMOutput {
  Tensor logits;  // [B, T, V] (undefined when not asked for)
  Tensor loss;    // scalar f32 (undefined without labels)
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  const ModelConfig& config() const { return config_; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  // The dtype save_pretrained records (mixed precision swaps fp32 masters in to save).
  void set_dtype(DType t) { dtype_ = t; }
  // Parameters under their HF names, in HF's order; tied weights appear once.
  virtual nn::ParamList named_parameters() = 0;
  virtual CausalLMOutput forward(const Tensor& input_ids, const ForwardOptions& opts = {}) = 0;
  // Names whose on-disk layout is the transpose of ours (GPT-2's Conv1D weights).
  virtual bool transposed_on_disk(const std::string& name) const;
  int64_t num_parameters();
  // The weights of the linear layers (nn.Linear, and GPT-2's Conv1D, a linear layer stored transposed):
  // every 2-D parameter but the embeddings. GaLore's candidates (HF's optim_target_modules).
  std::vector<std::string> linear_weight_names();
  // HF's resize_token_embeddings(new_vocab) with mean_resizing: the input embeddings and an untied LM head
  // grow to `new_vocab` rows; each new row is drawn from N(mean, 1e-9 * covariance) of the old rows (the mean
  // alone when there are no more old rows than columns: HF's fallback for a covariance that is not positive
  // definite; HF also falls back for rank-deficient rows, which this test of the shape does not see - a
  // degenerate draw at 1e-9 of the spread). Draws come from `gen`. Shrinking is refused.
  void resize_token_embeddings(int64_t new_vocab, Generator& gen);
  AttnImplementation attn_implementation() const { return attn_; }
  void set_attn_implementation(AttnImplementation impl) { attn_ = impl; }
  void set_attn_implementation(const std::string& impl) { attn_ = parse_attn_implementation(impl); }
  // The device type whose rule picks sdpa's form (ops::attention_form_for; default: the tensors' own). A dry
  // run on the meta device names the one it stands for (trainer estimate --device cuda); a dry run of a split
  // names it per device (`on`: the layers on that device; the others keep the model's).
  void set_attention_device(DeviceType stands_for) { attention_device_ = stands_for; }
  void set_attention_device(DeviceType stands_for, Device on) {
    attention_devices_.emplace_back(on, stands_for);
  }
  // ZeRO-3's gather/release around every forward (null: the parameters are always there). Not owned.
  void set_layer_hooks(LayerHooks* hooks) { hooks_ = hooks; }
  LayerHooks* layer_hooks() const { return hooks_; }
  // The decoder layer parameter `name` belongs to (HF names: "...h.3." / "...layers.3."), -1 for the root.
  static int decoder_layer_of(const std::string& name);
  // The token (and GPT-2's position) embedding tables.
  static bool is_embedding(const std::string& name);
  // device_map: where each part runs (default: everything on device()). Every parameter must already be on
  // its part's device (from_pretrained loads them there). device() becomes the embeddings' - where input_ids
  // go - and the logits and loss come from the head's; activations move at the layer boundaries.
  void set_placement(DevicePlacement p);
  const DevicePlacement& placement() const { return placement_; }

 protected:
  CausalLM(ModelConfig c, Device d, DType t)
      : config_(std::move(c)),
        device_(d),
        dtype_(t),
        placement_(DevicePlacement::whole(d, config_.num_layers)) {}
  // The LM head and HF's loss (logits upcast to f32, labels shifted left by one with -100 appended). Without
  // return_logits the head and loss run in row chunks, so the [B*T, V] logits never exist.
  CausalLMOutput head_and_loss(const Tensor& h, const Tensor& head_weight, const ForwardOptions& opts) const;
  // Boolean mask [B or 1, 1, T, S], true where attention is not allowed (causal with the last query at the
  // last key, + padding from attention_mask [B, S], + keys `window` or more positions back when window > 0).
  Tensor attention_mask_for(int64_t B, int64_t T, int64_t S, const Tensor& attention_mask,
                            int64_t window = 0) const;
  // Appends this step's k/v [B, KV, T, D] to layer `layer` of the cache (if any) and returns all of them.
  std::pair<Tensor, Tensor> cached_kv(const ForwardOptions& o, size_t layer, const Tensor& k,
                                      const Tensor& v) const;
  // Attention over q [B, H, T, D] and k/v [B, KV, T, D]: eager (with `mask`, k/v repeated to H heads) or the
  // fused kernel (causal + `key_keep` + the sliding `window`, which eager's `mask` must already hold) or the
  // blocked form, as ops::attention_form_for picks. Attention dropout in training draws eager's mask from the
  // same generator in either.
  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& key_keep,
                double dropout_p, const ForwardOptions& o, int64_t window = 0) const;
  // The token embeddings with NEFTune's noise when o asks for it in training (ForwardOptions), else as they
  // are.
  Tensor neftune(const Tensor& embeddings, const ForwardOptions& o) const;
  // Decoder layer `index`, as a checkpoint region when o.gradient_checkpointing (dropout replayed exactly),
  // between the layer hooks' gather and release when there are hooks.
  Tensor run_layer(const autograd::RegionFn& layer, const Tensor& h, const ForwardOptions& o,
                   size_t index) const;
  // The root unit's hooks around a whole forward pass.
  void root_begin() const {
    if (hooks_) hooks_->before_forward(-1);
  }
  void root_end() const {
    if (hooks_) hooks_->after_forward(-1);
  }
  void embeddings_done() const {
    if (hooks_) hooks_->after_embeddings();
  }
  void head_begin() const {
    if (hooks_) hooks_->before_head();
  }
  // bool [B, T] keep-mask from an attention_mask, or undefined.
  Tensor key_keep_for(const Tensor& attention_mask) const;
  // A split model's forward: inputs every layer reads (positions, masks; no gradients), copied once to each
  // device of the placement; at(d)[i] is input i on d.
  class LayerInputs {
   public:
    LayerInputs(const std::vector<Tensor>& inputs, const DevicePlacement& placement);
    const std::vector<Tensor>& at(Device d) const;

   private:
    std::vector<std::pair<Device, std::vector<Tensor>>> copies_;
  };
  // Placement changed: per-device tables (Llama's rotary tables) rebuilt.
  virtual void on_placement() {}
  ModelConfig config_;
  Device device_;
  DType dtype_;
  AttnImplementation attn_ = AttnImplementation::eager;
  std::optional<DeviceType> attention_device_;
  std::vector<std::pair<Device, DeviceType>> attention_devices_;  // per device, over attention_device_
  LayerHooks* hooks_ = nullptr;
  DevicePlacement placement_;
};

// Freshly initialized model (HF's init) on `device` in `dtype`.
std::unique_ptr<CausalLM> create_causal_lm(const ModelConfig& config, Device device, DType dtype,
                                           Generator& gen, const std::string& attn_implementation = "eager");

struct PretrainedOptions {
  std::optional<DType> dtype;  // default: the checkpoint's dtype
  Device device = Device::cpu();
  // HF's device_map: "" (use `device`), a device ("cpu", "cuda:1"), or "auto": the whole model on the first
  // device of `max_memory` when it fits there, else split by decoder layers across them (device_map.h) and
  // run split. Without max_memory, "auto" puts the whole model on `device`.
  std::string device_map;
  std::vector<DeviceBudget> max_memory;  // HF's max_memory: GPUs in order, then the host
  std::string attn_implementation = "eager";
};
// Loads config.json + model.safetensors (or shards) from `dir`.
std::unique_ptr<CausalLM> from_pretrained(const std::string& dir, const PretrainedOptions& opts = {});
// Where from_pretrained puts each part of the model in `dir` (config.json and the checkpoint's dtype only).
DevicePlacement pretrained_placement(const std::string& dir, const PretrainedOptions& opts = {});

// A model whose parameters are still meta tensors (f32, their shapes) and a way to make each one: load(i) is
// named_parameters()[i] as create_causal_lm or from_pretrained would have made it, in f32 on the model's
// device. A sharded run builds its share one parameter at a time and never holds the whole model.
struct DeferredModel {
  std::unique_ptr<CausalLM> model;
  std::function<Tensor(size_t)> load;
};
DeferredModel deferred_causal_lm(const ModelConfig& config, Device device, Generator& gen,
                                 const std::string& attn_implementation = "eager");
DeferredModel deferred_pretrained(const std::string& dir, const PretrainedOptions& opts = {});
// Parameter `name`'s value as save_pretrained writes it: HF's layout (GPT-2's Conv1D weights transposed into
// a copy of their own; everything else is `value` itself).
Tensor hf_tensor(const CausalLM& model, const std::string& name, const Tensor& value);
// What a save writes instead of the parameters themselves: parameter(i), in `dtype` and of
// named_parameters()[i]'s shape, called once per parameter in order while the files are written (fp32
// masters; a sharded run's gathered one at a time, so the save holds one parameter and not the model).
struct SavedWeights {
  DType dtype = DType::f32;
  std::function<Tensor(size_t)> parameter;
};
// Writes config.json + model.safetensors (sharded above max_shard_size) into `dir`, loadable by transformers:
// the parameters, or `weights` when given (config.json's torch_dtype is then its dtype).
void save_pretrained(CausalLM& model, const std::string& dir, const std::string& max_shard_size = "5GB",
                     const SavedWeights* weights = nullptr);

// Scaled dot-product attention with materialized scores: q [B, H, T, D], k/v [B, H, S, D], mask bool
// broadcastable to [B, H, T, S] (true = blocked). Fully blocked rows give zeros.
Tensor eager_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double scale,
                       double dropout_p, Generator* gen, bool training);

}  // namespace tr::models
