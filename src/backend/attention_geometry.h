// Shape and masking rule of the fused attention, shared by the CPU and CUDA kernels so both mask alike:
// causal attention aligns the last query with the last key (queries continue a cache of S - T keys), and a
// key whose keep flag is false (padding) is never attended; a sliding window of W keys (Mistral's
// sliding_window) also hides keys W or more positions before the query (HF: key > query - W).
#pragma once
#include <cstdint>

#include "core/hd.h"

namespace tr::backend {

// Where row t of head h in batch b of a [B, H, T, D] attention operand starts, in elements from its data
// pointer: b * batch + h * head + t * row (the head dim itself is contiguous). Through it the kernels read q,
// k, v in the projections' [B, T, H, D] layout and write out and the gradients where the caller keeps them,
// so a model needs no head split/merge copies.
struct HeadRows {
  int64_t batch = 0, head = 0, row = 0;
  TR_HD int64_t at(int64_t b, int64_t h, int64_t t) const { return b * batch + h * head + t * row; }
  static HeadRows dense(int64_t heads, int64_t rows, int64_t D) { return {heads * rows * D, rows * D, D}; }
};
struct AttentionRows {
  HeadRows q, k, v, out, dout, dq, dk, dv;
};

struct AttentionGeometry {
  int64_t B, H, KV, T, S, D;  // batch, query heads, kv heads, queries, keys, head dim
  bool causal;
  double scale;
  const bool* keep;    // [B, S] or null
  int64_t window = 0;  // causal only: keys a query sees, itself included (0: all before it)
  // Attention dropout (Backend::AttentionDropout): the probability of query t of head row bh = b * H + h for
  // key s is kept when uniform(seed, offset, drop_index(bh, t, s)) >= dropout, then scaled by keep_scale.
  float dropout = 0.0f;
  double keep_scale = 1.0;
  uint64_t seed = 0, offset = 0;
  AttentionRows rows{};  // the operands' layouts (dense_rows(): contiguous [B, H, T, D] / [B, KV, S, D])
  TR_HD uint64_t drop_index(int64_t bh, int64_t t, int64_t s) const {
    return static_cast<uint64_t>((bh * T + t) * S + s);
  }
  // Sets the dropout of probability p (in [0, 1)) with that Philox stream.
  AttentionGeometry& with_dropout(double p, uint64_t philox_seed, uint64_t philox_offset) {
    dropout = static_cast<float>(p);
    keep_scale = 1.0 / (1.0 - p);
    seed = philox_seed;
    offset = philox_offset;
    return *this;
  }
  // Every operand contiguous.
  AttentionGeometry& dense_rows() {
    const HeadRows qr = HeadRows::dense(H, T, D), kr = HeadRows::dense(KV, S, D);
    rows = {qr, kr, kr, qr, qr, qr, kr, kr};
    return *this;
  }
  // Lowest key index query t may see.
  TR_HD int64_t first_key(int64_t t) const {
    if (!causal || window <= 0) return 0;
    const int64_t k = t + (S - T) - window + 1;
    return k > 0 ? k : 0;
  }
  // Highest key index query t may see.
  TR_HD int64_t last_key(int64_t t) const {
    if (!causal) return S - 1;
    const int64_t k = t + (S - T);
    return k < S - 1 ? k : S - 1;
  }
  TR_HD bool visible(int64_t b, int64_t t, int64_t s) const {
    return s <= last_key(t) && s >= first_key(t) && (keep == nullptr || keep[b * S + s]);
  }
};

}  // namespace tr::backend
