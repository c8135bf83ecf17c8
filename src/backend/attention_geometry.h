// Shape and masking rule of the fused attention, shared by the CPU and CUDA kernels so both mask alike:
// causal attention aligns the last query with the last key (queries continue a cache of S - T keys), and a
// key whose keep flag is false (padding) is never attended.
#pragma once
#include <cstdint>

#include "core/hd.h"

namespace tr::backend {

struct AttentionGeometry {
  int64_t B, H, KV, T, S, D;  // batch, query heads, kv heads, queries, keys, head dim
  bool causal;
  double scale;
  const bool* keep;  // [B, S] or null
  // Highest key index query t may see.
  TR_HD int64_t last_key(int64_t t) const {
    if (!causal) return S - 1;
    const int64_t k = t + (S - T);
    return k < S - 1 ? k : S - 1;
  }
  TR_HD bool visible(int64_t b, int64_t t, int64_t s) const {
    return s <= last_key(t) && (keep == nullptr || keep[b * S + s]);
  }
};

}  // namespace tr::backend
