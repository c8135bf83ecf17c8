// config.json parsing and validation for the GPT-2 and Llama families.
#include "models/config.h"

#include <fstream>

#include "core/error.h"

namespace tr::models {

namespace {

struct Reader {
  const nlohmann::json& j;
  const std::string& src;

  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t req_int(const char* k) const {
    TR_CHECK(has(k), "{}: missing field '{}'", src, k);
    TR_CHECK(j[k].is_number_integer(), "{}: field '{}' must be an integer", src, k);
    const int64_t v = j[k].get<int64_t>();
    TR_CHECK(v > 0, "{}: field '{}' must be positive, got {}", src, k, v);
    return v;
  }
  int64_t opt_int(const char* k, int64_t def) const { return has(k) ? req_int(k) : def; }
  double opt_num(const char* k, double def) const {
    if (!has(k)) return def;
    TR_CHECK(j[k].is_number(), "{}: field '{}' must be a number", src, k);
    return j[k].get<double>();
  }
  bool opt_bool(const char* k, bool def) const {
    if (!has(k)) return def;
    TR_CHECK(j[k].is_boolean(), "{}: field '{}' must be true or false", src, k);
    return j[k].get<bool>();
  }
  std::string opt_str(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    TR_CHECK(j[k].is_string(), "{}: field '{}' must be a string", src, k);
    return j[k].get<std::string>();
  }
};

void parse_rope(const nlohmann::json& j, const std::string& src, ModelConfig& c) {
  // transformers v5 writes rope_parameters (with rope_theta inside); v4 rope_scaling + rope_theta.
  const char* key =
      j.contains("rope_parameters") && !j["rope_parameters"].is_null() ? "rope_parameters" : "rope_scaling";
  if (!j.contains(key) || j[key].is_null()) return;
  const auto& r = j[key];
  TR_CHECK(r.is_object(), "{}: field '{}' must be an object", src, key);
  Reader rr{r, src};
  if (rr.has("rope_theta")) c.rope_theta = rr.opt_num("rope_theta", c.rope_theta);
  c.rope_scaling.type = rr.opt_str("rope_type", rr.opt_str("type", "default"));
  const auto& t = c.rope_scaling.type;
  TR_CHECK(t == "default" || t == "linear" || t == "llama3",
           "{}: {}.rope_type '{}' is not supported (default, linear, llama3)", src, key, t);
  if (t != "default") {
    TR_CHECK(rr.has("factor"), "{}: missing field '{}.factor'", src, key);
    c.rope_scaling.factor = rr.opt_num("factor", 1.0);
    TR_CHECK(c.rope_scaling.factor >= 1.0, "{}: {}.factor must be >= 1", src, key);
  }
  if (t == "llama3") {
    for (const char* k : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      TR_CHECK(rr.has(k), "{}: missing field '{}.{}' (needed by rope_type llama3)", src, key, k);
    c.rope_scaling.low_freq_factor = rr.opt_num("low_freq_factor", 1.0);
    c.rope_scaling.high_freq_factor = rr.opt_num("high_freq_factor", 4.0);
    c.rope_scaling.original_max_position_embeddings = rr.req_int("original_max_position_embeddings");
    TR_CHECK(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor,
             "{}: {}.high_freq_factor must exceed low_freq_factor", src, key);
  }
}

}  // namespace

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& src) {
  TR_CHECK(j.is_object(), "{}: config must be a JSON object", src);
  Reader r{j, src};
  ModelConfig c;
  c.raw = j;
  TR_CHECK(r.has("model_type"), "{}: missing field 'model_type'", src);
  c.model_type = r.opt_str("model_type", "");
  if (c.model_type == "gpt2") {
    c.family = Family::gpt2;
    c.vocab_size = r.req_int("vocab_size");
    c.hidden_size = r.req_int("n_embd");
    c.num_layers = r.req_int("n_layer");
    c.num_heads = r.req_int("n_head");
    c.num_kv_heads = c.num_heads;
    c.max_position_embeddings = r.req_int("n_positions");
    TR_CHECK(c.hidden_size % c.num_heads == 0, "{}: n_embd {} is not divisible by n_head {}", src,
             c.hidden_size, c.num_heads);
    c.head_dim = c.hidden_size / c.num_heads;
    c.intermediate_size = r.opt_int("n_inner", 4 * c.hidden_size);
    c.norm_eps = r.opt_num("layer_norm_epsilon", 1e-5);
    c.activation = r.opt_str("activation_function", "gelu_new");
    TR_CHECK(c.activation == "gelu_new" || c.activation == "gelu_pytorch_tanh" || c.activation == "gelu",
             "{}: activation_function '{}' is not supported (gelu_new, gelu_pytorch_tanh, gelu)", src,
             c.activation);
    c.tie_word_embeddings = r.opt_bool("tie_word_embeddings", true);
    c.attention_bias = c.o_proj_bias = c.mlp_bias = true;
    c.embd_pdrop = r.opt_num("embd_pdrop", 0.1);
    c.resid_pdrop = r.opt_num("resid_pdrop", 0.1);
    c.attn_pdrop = r.opt_num("attn_pdrop", 0.1);
    TR_CHECK(!r.opt_bool("scale_attn_by_inverse_layer_idx", false) &&
                 !r.opt_bool("reorder_and_upcast_attn", false),
             "{}: scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported", src);
  } else if (c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2") {
    c.family = Family::llama;
    c.vocab_size = r.req_int("vocab_size");
    c.hidden_size = r.req_int("hidden_size");
    c.intermediate_size = r.req_int("intermediate_size");
    c.num_layers = r.req_int("num_hidden_layers");
    c.num_heads = r.req_int("num_attention_heads");
    c.num_kv_heads = r.opt_int("num_key_value_heads", c.num_heads);
    TR_CHECK(c.num_heads % c.num_kv_heads == 0,
             "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", src, c.num_heads,
             c.num_kv_heads);
    if (r.has("head_dim")) {
      c.head_dim = r.req_int("head_dim");
    } else {
      TR_CHECK(c.hidden_size % c.num_heads == 0,
               "{}: hidden_size {} is not divisible by num_attention_heads {} (and no head_dim given)", src,
               c.hidden_size, c.num_heads);
      c.head_dim = c.hidden_size / c.num_heads;
    }
    TR_CHECK(c.head_dim % 2 == 0, "{}: head_dim {} must be even for rotary embeddings", src, c.head_dim);
    c.max_position_embeddings = r.opt_int("max_position_embeddings", 2048);
    c.norm_eps = r.opt_num("rms_norm_eps", 1e-6);
    c.rope_theta = r.opt_num("rope_theta", 10000.0);
    parse_rope(j, src, c);
    c.activation = r.opt_str("hidden_act", "silu");
    TR_CHECK(c.activation == "silu", "{}: hidden_act '{}' is not supported (silu)", src, c.activation);
    const bool qwen = c.model_type == "qwen2";
    c.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
    c.attention_bias = qwen ? true : r.opt_bool("attention_bias", false);
    c.o_proj_bias = qwen ? false : c.attention_bias;
    c.mlp_bias = r.opt_bool("mlp_bias", false);
    c.attn_pdrop = r.opt_num("attention_dropout", 0.0);
    if ((c.model_type == "mistral" || (qwen && r.opt_bool("use_sliding_window", false))) &&
        r.has("sliding_window"))
      c.sliding_window = r.req_int("sliding_window");
  } else {
    fail("{}: model_type '{}' is not supported (gpt2, llama, mistral, qwen2)", src, c.model_type);
  }
  c.initializer_range = r.opt_num("initializer_range", 0.02);
  for (double p : {c.embd_pdrop, c.resid_pdrop, c.attn_pdrop})
    TR_CHECK(p >= 0.0 && p < 1.0, "{}: dropout probabilities must be in [0, 1)", src);
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  TR_CHECK(in.is_open(), "{}: cannot open", path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  TR_CHECK(!j.is_discarded(), "{}: not valid JSON", path);
  return from_json(j, path);
}

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

int64_t ModelConfig::num_parameters() const {
  const int64_t d = hidden_size, v = vocab_size;
  int64_t n = v * d;
  if (family == Family::gpt2) {
    n += max_position_embeddings * d +
         num_layers *
             (4 * d + 3 * d * d + 3 * d + d * d + d + 2 * d * intermediate_size + intermediate_size + d) +
         2 * d;
  } else {
    const int64_t q = num_heads * head_dim, kv = num_kv_heads * head_dim;
    int64_t per = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * intermediate_size;
    if (attention_bias) per += q + 2 * kv;
    if (o_proj_bias) per += d;
    if (mlp_bias) per += 2 * intermediate_size + d;
    n += num_layers * per + d;
  }
  if (!tie_word_embeddings) n += v * d;
  return n;
}

}  // namespace tr::models
