// libFuzzer target: the safetensors header parser must either accept an input or throw tr::Error - never
// crash, hang, read out of bounds or hit undefined behaviour. Built and run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tr::io::SafetensorsHeader h = tr::io::parse_safetensors_header(data, size, "fuzz-input");
    // Accepted headers must describe ranges inside the input.
    for (const auto& t : h.tensors)
      if (h.data_offset + t.end > size) __builtin_trap();
  } catch (const tr::Error&) {
  }
  return 0;
}
