// libFuzzer target: a safetensors file. The header parser, then the mapped reader loading every tensor (as
// stored and as f32), accept it or throw tr::Error - never crash, hang, read out of bounds or hit UB.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tr::io::SafetensorsHeader h = tr::io::parse_safetensors_header(data, size, "fuzz-input");
    // Accepted headers must describe ranges inside the input.
    for (const auto& t : h.tensors)
      if (h.data_offset + t.end > size) __builtin_trap();
    // The reader over the same bytes: the mapping, the borrowed or copied tensors, the dtype conversion.
    auto f = tr::io::SafetensorsFile::open(tr::fuzz::write_scratch("model.safetensors", data, size));
    for (const auto& t : f.header().tensors) {
      f.load(t.name);
      f.load(t.name, tr::DType::f32);
    }
  } catch (const tr::Error&) {
  }
  return 0;
}
