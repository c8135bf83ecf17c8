// libFuzzer target: --device_memory / --max_memory (HF's max_memory as text) and the placement over it;
// parse_device_memory throws tr::Error naming the flag, or returns positive budgets that place a small model.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "models/causal_lm.h"
#include "models/device_map.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto budgets = tr::models::parse_device_memory(text, "device_memory");
    for (const auto& b : budgets)
      if (b.bytes <= 0) std::abort();  // a parsed budget is a positive size
    static const auto model = [] {
      tr::Generator g(0);
      return tr::models::create_causal_lm(
          tr::models::ModelConfig::builtin("llama-60m"), tr::Device::meta(), tr::DType::f32, g);
    }();
    const auto p = tr::models::infer_auto_device_map(*model, tr::DType::f32, budgets);
    if (p.layers.size() != static_cast<size_t>(model->config().num_layers)) std::abort();
  } catch (const tr::Error&) {
  }
  return 0;
}
