// libFuzzer target: config.json. Rejected with tr::Error, or accepted and then buildable on the meta device
// (sizes without memory, as `trainer info` does) with the parameter count the config predicts.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/rng.h"
#include "fuzz_util.h"
#include "models/causal_lm.h"
#include "models/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tr;
  try {
    const auto config = models::ModelConfig::from_file(fuzz::write_scratch("config.json", data, size));
    const int64_t params = config.num_parameters();
    config.to_json().dump();
    // Building walks every layer; beyond a few dozen the run only gets slower, not more interesting.
    if (config.num_layers > 64) return 0;
    Generator g(0);
    auto model = models::create_causal_lm(config, Device::meta(), DType::f32, g);
    // The config's own count and the built model's must agree (tied weights counted once by both).
    if (model->num_parameters() != params) __builtin_trap();
  } catch (const tr::Error&) {
  }
  return 0;
}
