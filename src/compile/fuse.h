// torch_compile's elementwise fusion (the inductor backend's): a run of consecutive recorded calls that each
// work elementwise on the same contiguous elements, each after the first reading what the run wrote (a
// dropout and the residual add after it, an add and the dropout backward behind it), becomes one
// fused_elementwise call. Values that no call after the run reads are not stored, and their buffers leave
// the memory plan. The fused call computes every stored value with the unfused kernels' bits.
#pragma once
#include <vector>

#include "compile/recorder.h"

namespace tr::compile {

struct FuseResult {
  int64_t chains = 0;          // fused calls made
  int64_t calls_fused = 0;     // recorded calls they replace
  int64_t buffers_elided = 0;  // intermediates no longer stored
};

// Rewrites `calls` and updates `buffers` (first/last touches; elided ones marked). A buffer whose last
// touch is calls.size() (read after the region) is kept.
FuseResult fuse_elementwise(std::vector<Call>& calls, std::vector<Buffer>& buffers);

}  // namespace tr::compile
