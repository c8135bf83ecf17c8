// The static memory plan of a captured step (torch_compile): every buffer the step creates gets a fixed
// offset in one arena, computed from its size and lifetime (the first and last positions in the call list
// that touch it), so that buffers alive at the same time never overlap and replaying allocates nothing.
// llm.c sizes one allocation by hand; this computes it.
#pragma once
#include <cstdint>
#include <vector>

namespace tr::compile {

struct PlanBuffer {
  int64_t bytes = 0;
  int64_t first = 0, last = 0;  // inclusive positions of the first and last call using the buffer
};

struct MemoryPlan {
  std::vector<int64_t> offsets;  // parallel to the buffers; multiples of the alignment
  int64_t arena_bytes = 0;       // the arena's size: the largest offset + size
  int64_t live_peak = 0;         // the most bytes alive at one position (rounded sizes): no plan needs less
};

// Greedy by size (TensorFlow Lite's arena planner): the largest buffers are placed first, each at the lowest
// offset where it fits between the buffers already placed whose lifetimes intersect its own. Deterministic:
// equal sizes are placed in order of first use, then index. Throws tr::Error for a negative size or a
// lifetime that ends before it starts.
MemoryPlan plan_memory(const std::vector<PlanBuffer>& buffers, int64_t alignment = 64);

}  // namespace tr::compile
