// Model configuration from Hugging Face config.json (model_type gpt2, llama, mistral, qwen2, qwen3),
// validated: missing, mistyped, out-of-range or contradictory fields throw naming the file and the field. The
// original JSON is kept so a saved config.json round-trips fields we do not use.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace tr::models {

enum class Family { gpt2, llama };

// Size limits of a config: every shape product stays far from int64 overflow, and a hostile config.json is
// refused before anything is allocated. The largest published models are well inside them.
inline constexpr int64_t kMaxModelSize = int64_t{1} << 24;        // vocab, widths, positions, head_dim
inline constexpr int64_t kMaxModelCount = int64_t{1} << 16;       // layers, heads
inline constexpr int64_t kMaxModelParameters = int64_t{1} << 40;  // about 1.1 trillion

struct RopeScaling {
  std::string type = "default";  // default | linear | llama3
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string model_type;  // as in config.json
  Family family = Family::llama;
  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t intermediate_size = 0, max_position_embeddings = 0;
  double norm_eps = 1e-5, rope_theta = 10000.0, initializer_range = 0.02;
  RopeScaling rope_scaling;
  bool attention_bias = false;  // q, k, v (and o for llama) projections
  bool o_proj_bias = false;
  bool mlp_bias = false;
  bool tie_word_embeddings = true;
  std::string activation;  // gelu_new | silu | gelu
  double embd_pdrop = 0.0, resid_pdrop = 0.0, attn_pdrop = 0.0;
  bool qk_norm = false;        // qwen3: RMSNorm over head_dim on each head's q and k, before rotary
  int64_t sliding_window = 0;  // mistral / qwen2 sliding-window attention; 0 = none
  // Qwen2/3 (use_sliding_window): layers below this index attend fully, the rest through the window (HF's
  // max_window_layers); 0 for Mistral, whose every layer slides.
  int64_t max_window_layers = 0;
  // The window layer `layer` attends through (0: none).
  int64_t window_of(int64_t layer) const { return layer >= max_window_layers ? sliding_window : 0; }
  nlohmann::json raw;  // everything config.json held

  // Parses `j` (from `source`, used in errors). Throws tr::Error on missing or contradictory fields.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  static ModelConfig from_file(const std::string& path);
  // Built-in shapes for training from scratch: gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-60m, llama-160m.
  static ModelConfig builtin(const std::string& name);
  nlohmann::json to_json() const;
  int64_t num_parameters() const;
};

// run_clm's --model_type: HF's config class of that type at its defaults (gpt2: GPT2Config(), llama:
// LlamaConfig()), as to_dict() writes it. Throws for another type.
nlohmann::json hf_default_config(const std::string& model_type);
// run_clm's --config_overrides "k=v,k2=v2" (PretrainedConfig.update_from_string): every key must be in
// `config`; a value is read as the type of the one it replaces (bool: true/1/y/yes, false/0/n/no).
void apply_config_overrides(nlohmann::json& config, const std::string& overrides);

}  // namespace tr::models
