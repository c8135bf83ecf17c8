// libFuzzer target: an allocation trace (TRAINER_ALLOCATOR_TRACE's format) replayed through the caching
// allocator's model; replay_allocation_trace throws tr::Error naming the line, or returns peaks that hold
// together (the caching allocator reserves at least what is allocated).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "core/allocation_trace.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const tr::TraceReplay r = tr::replay_allocation_trace(in, "fuzz");
    if (r.allocations > r.events || r.peak_bytes < 0) std::abort();
    if (r.peak_reserved_bytes < r.peak_bytes) std::abort();  // segments hold every live block
    if ((r.allocations == 0) != (r.peak_bytes == 0)) std::abort();
  } catch (const tr::Error&) {
  }
  return 0;
}
