// config.json parsing and validation for the GPT-2 and Llama families: every field typed and range-checked.
#include "models/config.h"

#include <limits>

#include "core/error.h"
#include "core/json_fields.h"

namespace tr::models {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t size_of(const JsonField& f) { return f.integer(1, kMaxModelSize); }
int64_t count_of(const JsonField& f) { return f.integer(1, kMaxModelCount); }
double dropout_of(const JsonField& f, double def) { return f.number_or(def, 0.0, 1.0, Bounds::open_high); }
double eps_of(const JsonField& f, double def) { return f.number_or(def, 0.0, 1.0, Bounds::open_low); }

// Parameters of the configured model, in T: double to bound a hostile config without overflow, int64 once
// the bound holds.
template <typename T>
T parameter_count(const ModelConfig& c) {
  const T d = static_cast<T>(c.hidden_size), v = static_cast<T>(c.vocab_size);
  const T ff = static_cast<T>(c.intermediate_size), layers = static_cast<T>(c.num_layers);
  T n = v * d;
  if (c.family == Family::gpt2) {
    n += static_cast<T>(c.max_position_embeddings) * d +
         layers * (4 * d + 3 * d * d + 3 * d + d * d + d + 2 * d * ff + ff + d) + 2 * d;
  } else {
    const T q = static_cast<T>(c.num_heads * c.head_dim), kv = static_cast<T>(c.num_kv_heads * c.head_dim);
    T per = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * ff;
    if (c.qk_norm) per += 2 * static_cast<T>(c.head_dim);
    if (c.attention_bias) per += q + 2 * kv;
    if (c.o_proj_bias) per += d;
    if (c.mlp_bias) per += 2 * ff + d;
    n += layers * per + d;
  }
  if (!c.tie_word_embeddings) n += v * d;
  return n;
}

void parse_rope(const JsonField& root, ModelConfig& c) {
  // transformers v5 writes rope_parameters (with rope_theta inside); v4 rope_scaling + rope_theta.
  const JsonField r = root["rope_parameters"].present() ? root["rope_parameters"] : root["rope_scaling"];
  if (!r.present()) return;
  r.object();
  c.rope_theta = r["rope_theta"].number_or(c.rope_theta, 0.0, kInf, Bounds::open_low);
  const std::initializer_list<std::string_view> types = {"default", "linear", "llama3"};
  c.rope_scaling.type =
      r["rope_type"].present() ? r["rope_type"].one_of(types) : r["type"].one_of_or("default", types);
  const auto& t = c.rope_scaling.type;
  if (t != "default") c.rope_scaling.factor = r["factor"].number(1.0, kInf);
  if (t == "llama3") {
    c.rope_scaling.low_freq_factor = r["low_freq_factor"].number(0.0, kInf, Bounds::open_low);
    c.rope_scaling.high_freq_factor = r["high_freq_factor"].number(0.0, kInf, Bounds::open_low);
    c.rope_scaling.original_max_position_embeddings = size_of(r["original_max_position_embeddings"]);
    if (c.rope_scaling.high_freq_factor <= c.rope_scaling.low_freq_factor)
      r["high_freq_factor"].fail("must exceed {} {}, got {}", r["low_freq_factor"].path(),
                                 c.rope_scaling.low_freq_factor, c.rope_scaling.high_freq_factor);
  }
}

void parse_gpt2(const JsonField& r, ModelConfig& c) {
  const std::string& src = r.file();
  c.family = Family::gpt2;
  c.vocab_size = size_of(r["vocab_size"]);
  c.hidden_size = size_of(r["n_embd"]);
  c.num_layers = count_of(r["n_layer"]);
  c.num_heads = count_of(r["n_head"]);
  c.num_kv_heads = c.num_heads;
  c.max_position_embeddings = size_of(r["n_positions"]);
  TR_CHECK(c.hidden_size % c.num_heads == 0, "{}: n_embd {} is not divisible by n_head {}", src,
           c.hidden_size, c.num_heads);
  c.head_dim = c.hidden_size / c.num_heads;
  c.intermediate_size = r["n_inner"].present() ? size_of(r["n_inner"]) : 4 * c.hidden_size;
  c.norm_eps = eps_of(r["layer_norm_epsilon"], 1e-5);
  c.activation = r["activation_function"].one_of_or("gelu_new", {"gelu_new", "gelu_pytorch_tanh", "gelu"});
  c.tie_word_embeddings = r["tie_word_embeddings"].boolean_or(true);
  c.attention_bias = c.o_proj_bias = c.mlp_bias = true;
  c.embd_pdrop = dropout_of(r["embd_pdrop"], 0.1);
  c.resid_pdrop = dropout_of(r["resid_pdrop"], 0.1);
  c.attn_pdrop = dropout_of(r["attn_pdrop"], 0.1);
  TR_CHECK(!r["scale_attn_by_inverse_layer_idx"].boolean_or(false) &&
               !r["reorder_and_upcast_attn"].boolean_or(false),
           "{}: scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported", src);
}

void parse_llama(const JsonField& r, ModelConfig& c) {
  const std::string& src = r.file();
  c.family = Family::llama;
  c.vocab_size = size_of(r["vocab_size"]);
  c.hidden_size = size_of(r["hidden_size"]);
  c.intermediate_size = size_of(r["intermediate_size"]);
  c.num_layers = count_of(r["num_hidden_layers"]);
  c.num_heads = count_of(r["num_attention_heads"]);
  c.num_kv_heads = r["num_key_value_heads"].present() ? count_of(r["num_key_value_heads"]) : c.num_heads;
  TR_CHECK(c.num_heads % c.num_kv_heads == 0,
           "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", src, c.num_heads,
           c.num_kv_heads);
  if (r["head_dim"].present()) {
    c.head_dim = size_of(r["head_dim"]);
  } else if (c.model_type == "qwen3") {
    c.head_dim = 128;  // Qwen3Config's default, not hidden_size / heads
  } else {
    TR_CHECK(c.hidden_size % c.num_heads == 0,
             "{}: hidden_size {} is not divisible by num_attention_heads {} (and no head_dim given)", src,
             c.hidden_size, c.num_heads);
    c.head_dim = c.hidden_size / c.num_heads;
  }
  TR_CHECK(c.head_dim % 2 == 0, "{}: head_dim {} must be even for rotary embeddings", src, c.head_dim);
  c.max_position_embeddings =
      r["max_position_embeddings"].present() ? size_of(r["max_position_embeddings"]) : 2048;
  c.norm_eps = eps_of(r["rms_norm_eps"], 1e-6);
  c.rope_theta = r["rope_theta"].number_or(10000.0, 0.0, kInf, Bounds::open_low);
  parse_rope(r, c);
  c.activation = r["hidden_act"].one_of_or("silu", {"silu"});
  const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen3";
  c.tie_word_embeddings = r["tie_word_embeddings"].boolean_or(false);
  // Qwen2: q/k/v biases always, none on o_proj; Qwen3: attention_bias as Llama's, plus per-head q/k norms.
  c.attention_bias = c.model_type == "qwen2" ? true : r["attention_bias"].boolean_or(false);
  c.o_proj_bias = c.model_type == "qwen2" ? false : c.attention_bias;
  c.qk_norm = c.model_type == "qwen3";
  c.mlp_bias = r["mlp_bias"].boolean_or(false);
  c.attn_pdrop = dropout_of(r["attention_dropout"], 0.0);
  if ((c.model_type == "mistral" || (qwen && r["use_sliding_window"].boolean_or(false))) &&
      r["sliding_window"].present()) {
    c.sliding_window = size_of(r["sliding_window"]);
    if (qwen) c.max_window_layers = r["max_window_layers"].integer_or(28, 0, kMaxModelSize);  // HF's default
  }
}

}  // namespace

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& src) {
  const JsonField r(j, src);
  r.object();
  ModelConfig c;
  c.raw = j;
  c.model_type = r["model_type"].one_of({"gpt2", "llama", "mistral", "qwen2", "qwen3"});
  if (c.model_type == "gpt2")
    parse_gpt2(r, c);
  else
    parse_llama(r, c);
  // The std of the initial weights (HF: 0.02); bounded so that no value fills a fresh model with infinities.
  c.initializer_range = r["initializer_range"].number_or(0.02, 0.0, 1e3);
  // Each size is bounded above; their products are bounded here, before any shape is built from them.
  const double n = parameter_count<double>(c);
  TR_CHECK(
      n < static_cast<double>(kMaxModelParameters),
      "{}: the sizes (vocab_size, hidden size, intermediate size, layers, heads) give {:.3g} parameters, "
      "more than the supported 2^40",
      src, n);
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) { return from_json(read_json(path), path); }

ModelConfig ModelConfig::builtin(const std::string& name) {
  auto gpt2 = [](int64_t d, int64_t l, int64_t h) {
    return nlohmann::json{
        {"model_type", "gpt2"},  {"vocab_size", 50257},   {"n_embd", d},
        {"n_layer", l},          {"n_head", h},           {"n_positions", 1024},
        {"bos_token_id", 50256}, {"eos_token_id", 50256}, {"architectures", {"GPT2LMHeadModel"}}};
  };
  auto llama = [](int64_t d, int64_t l, int64_t h, int64_t kv, int64_t ff) {
    return nlohmann::json{{"model_type", "llama"},
                          {"vocab_size", 32000},
                          {"hidden_size", d},
                          {"intermediate_size", ff},
                          {"num_hidden_layers", l},
                          {"num_attention_heads", h},
                          {"num_key_value_heads", kv},
                          {"max_position_embeddings", 2048},
                          {"rms_norm_eps", 1e-5},
                          {"tie_word_embeddings", false},
                          {"architectures", {"LlamaForCausalLM"}}};
  };
  if (name == "gpt2") return from_json(gpt2(768, 12, 12), name);
  if (name == "gpt2-mini") {  // the default run's model: GPT-2 vocabulary, 4 small layers, no dropout
    auto j = gpt2(128, 4, 4);
    j["n_positions"] = 256;
    j["embd_pdrop"] = j["resid_pdrop"] = j["attn_pdrop"] = 0.0;
    return from_json(j, name);
  }
  if (name == "gpt2-medium") return from_json(gpt2(1024, 24, 16), name);
  if (name == "gpt2-large") return from_json(gpt2(1280, 36, 20), name);
  if (name == "gpt2-xl") return from_json(gpt2(1600, 48, 25), name);
  if (name == "llama-60m") return from_json(llama(512, 8, 8, 8, 1376), name);
  if (name == "llama-160m") return from_json(llama(768, 12, 12, 4, 2048), name);
  fail(
      "unknown built-in config '{}' (gpt2-mini, gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-60m, "
      "llama-160m)",
      name);
}

nlohmann::json ModelConfig::to_json() const { return raw; }

int64_t ModelConfig::num_parameters() const { return parameter_count<int64_t>(*this); }

}  // namespace tr::models
