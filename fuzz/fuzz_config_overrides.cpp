// libFuzzer target: run_clm's --model_type with --config_overrides. The input is "<model type byte>
// <overrides>": refused with tr::Error, or a config that ModelConfig reads (or refuses with tr::Error) and,
// when it reads, builds on the meta device with the parameter count it predicts.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "models/causal_lm.h"
#include "models/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tr;
  if (size < 1) return 0;
  const std::string overrides(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    nlohmann::json j = models::hf_default_config(data[0] % 2 ? "llama" : "gpt2");
    models::apply_config_overrides(j, overrides);
    const auto config = models::ModelConfig::from_json(j, "config_overrides");
    const int64_t params = config.num_parameters();
    if (config.num_layers > 64) return 0;  // building more layers only takes longer
    Generator g(0);
    auto model = models::create_causal_lm(config, Device::meta(), DType::f32, g);
    if (model->num_parameters() != params) __builtin_trap();
  } catch (const tr::Error&) {
  }
  return 0;
}
