// run_clm's --model_type and --config_overrides: HF's config classes at their defaults (GPT2Config(),
// LlamaConfig(), as to_dict() writes them) and PretrainedConfig.update_from_string's "k=v,k2=v2" edits.
#include <cerrno>
#include <cctype>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/suggest.h"
#include "models/config.h"

namespace tr::models {

nlohmann::json hf_default_config(const std::string& model_type) {
  using J = nlohmann::json;
  if (model_type == "gpt2")
    return J{{"model_type", "gpt2"},
             {"architectures", {"GPT2LMHeadModel"}},
             {"vocab_size", 50257},
             {"n_positions", 1024},
             {"n_embd", 768},
             {"n_layer", 12},
             {"n_head", 12},
             {"n_inner", nullptr},
             {"activation_function", "gelu_new"},
             {"resid_pdrop", 0.1},
             {"embd_pdrop", 0.1},
             {"attn_pdrop", 0.1},
             {"layer_norm_epsilon", 1e-5},
             {"initializer_range", 0.02},
             {"scale_attn_weights", true},
             {"use_cache", true},
             {"bos_token_id", 50256},
             {"eos_token_id", 50256},
             {"scale_attn_by_inverse_layer_idx", false},
             {"reorder_and_upcast_attn", false},
             {"tie_word_embeddings", true}};
  if (model_type == "llama")
    return J{{"model_type", "llama"},
             {"architectures", {"LlamaForCausalLM"}},
             {"vocab_size", 32000},
             {"hidden_size", 4096},
             {"intermediate_size", 11008},
             {"num_hidden_layers", 32},
             {"num_attention_heads", 32},
             {"num_key_value_heads", 32},
             {"head_dim", 128},
             {"hidden_act", "silu"},
             {"max_position_embeddings", 2048},
             {"initializer_range", 0.02},
             {"rms_norm_eps", 1e-6},
             {"use_cache", true},
             {"pad_token_id", nullptr},
             {"bos_token_id", 1},
             {"eos_token_id", 2},
             {"pretraining_tp", 1},
             {"tie_word_embeddings", false},
             {"rope_theta", 10000.0},
             {"rope_scaling", nullptr},
             {"attention_bias", false},
             {"attention_dropout", 0.0},
             {"mlp_bias", false}};
  fail("--model_type {}: expected gpt2 or llama{} (for another shape, give --config_name a config.json)",
       model_type, did_you_mean(model_type, {"gpt2", "llama"}));
}

namespace {

// HF's conversion of one override by the type of the value it replaces.
nlohmann::json typed_like(const nlohmann::json& old, const std::string& k, const std::string& v) {
  if (old.is_boolean()) {
    std::string l = v;
    for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (l == "true" || l == "1" || l == "y" || l == "yes") return true;
    if (l == "false" || l == "0" || l == "n" || l == "no") return false;
    fail("--config_overrides: can't derive true or false from '{}' (key {})", v, k);
  }
  errno = 0;
  char* end = nullptr;
  if (old.is_number_integer()) {
    const long long n = std::strtoll(v.c_str(), &end, 10);
    TR_CHECK(!v.empty() && *end == '\0' && errno == 0, "--config_overrides: {}={}: expected an integer", k,
             v);
    return n;
  }
  if (old.is_number_float()) {
    const double d = std::strtod(v.c_str(), &end);
    TR_CHECK(!v.empty() && *end == '\0' && errno == 0, "--config_overrides: {}={}: expected a number", k, v);
    return d;
  }
  TR_CHECK(old.is_string(),
           "--config_overrides: {}: only int, float, bool or string values can be updated, and {} is {}", k,
           k, old.dump());
  return v;
}

}  // namespace

void apply_config_overrides(nlohmann::json& config, const std::string& overrides) {
  size_t pos = 0;
  while (pos <= overrides.size() && !overrides.empty()) {
    const size_t comma = overrides.find(',', pos);
    const std::string item =
        overrides.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t eq = item.find('=');
    TR_CHECK(eq != std::string::npos && eq > 0,
             "--config_overrides '{}': '{}' is not key=value (e.g. n_embd=256,n_layer=4)", overrides, item);
    std::string k = item.substr(0, eq);
    const std::string v = item.substr(eq + 1);
    // GPT2Config's attribute_map: HF's hasattr finds the common names too.
    static const std::vector<std::pair<std::string, std::string>> gpt2_names = {
        {"hidden_size", "n_embd"},
        {"max_position_embeddings", "n_positions"},
        {"num_attention_heads", "n_head"},
        {"num_hidden_layers", "n_layer"}};
    if (config.value("model_type", "") == "gpt2")
      for (const auto& [alias, name] : gpt2_names)
        if (k == alias) k = name;
    std::vector<std::string> keys;
    for (auto it = config.begin(); it != config.end(); ++it) keys.push_back(it.key());
    TR_CHECK(config.contains(k), "--config_overrides: key {} isn't in the original config dict{}", k,
             did_you_mean(k, keys));
    config[k] = typed_like(config[k], k, v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
}

}  // namespace tr::models
