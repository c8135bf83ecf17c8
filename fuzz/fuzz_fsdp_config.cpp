// libFuzzer target: --fsdp_config's JSON file (HF's FSDP options, our prefetch keys); read_fsdp_config throws
// tr::Error naming the file and key, or returns options whose values are the documented ones.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "fuzz_util.h"
#include "train/zero3.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const tr::train::FsdpOptions o =
        tr::train::read_fsdp_config(tr::fuzz::write_scratch("fsdp_config.json", data, size));
    (void)o;
  } catch (const tr::Error&) {
  }
  return 0;
}
