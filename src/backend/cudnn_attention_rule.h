// Which attention calls cuDNN's fused attention takes on a GPU (backend/cuda/cudnn_sdpa.h), and the workspace
// its backward takes from the caching allocator: one rule for the CUDA backend and for the meta device's dry
// run of a GPU step (trainer estimate --device cuda), which counts that workspace where the GPU would take
// it.
#pragma once
#include <cstdint>

#include "backend/attention_geometry.h"

namespace tr::backend {

// Attention dropout under cuDNN: our Philox mask of the call, drawn into a [B, H, T, S] tensor of the inputs'
// half type (1 kept, 0 dropped; the graph multiplies by 1 / (1 - p) itself) that the fused kernels read
// beside the scores - cuDNN's own generator draws another mask than every other form of ours. Taken from the
// caching allocator for the call (forward and backward each draw it), so calls whose mask would pass this
// size keep our kernels.
constexpr int64_t kCudnnDropoutMaskLimit = int64_t{1} << 30;
inline int64_t cudnn_attention_dropout_mask_bytes(const AttentionGeometry& g) {
  return g.dropout > 0 ? (g.B * g.H * g.T * g.S * 2 + 255) / 256 * 256 : 0;
}

// Why cuDNN's attention does not take a call of this geometry (nullptr when it does, layout permitting):
// only where its result is ours - bf16/f16 (`half`), compute capability 8.0 or later, head dims multiples
// of 8 up to 128 (256 on sm_90), no key padding mask, no sliding window, attention dropout only through a
// mask of at most kCudnnDropoutMaskLimit bytes whose rows are 16-byte aligned (S a multiple of 8), causal
// only with as many keys as queries (its mask is aligned top-left, ours bottom-right), and no empty call.
inline const char* cudnn_attention_declines(bool half, const AttentionGeometry& g, int major, bool backward) {
  if (!half) return "not a half dtype";
  if (major < 8) return "compute capability below 8.0";
  if (g.D % 8 != 0 || g.D > (major == 9 ? 256 : 128)) return "its head dim";
  if (g.keep != nullptr) return "a key padding mask";
  if (g.window > 0) return "a sliding window";
  if (cudnn_attention_dropout_mask_bytes(g) > kCudnnDropoutMaskLimit)
    return "attention dropout whose [B, H, T, S] mask would pass 1 GiB";
  if (g.dropout > 0 && g.S % 8 != 0)
    return "attention dropout over keys not a multiple of 8 (mask rows unaligned)";
  if (g.causal && g.T != g.S) return "causal attention over a key cache";
  if (g.B * g.H * g.T == 0 || g.S == 0) return "an empty call";
  if (backward && g.T == 1 && g.S == 1) return "a single query and key";
  return nullptr;
}

// The backward's workspace ahead of the engine's own (which only a plan on the GPU knows; the dry run counts
// these two and the dropout mask): the f32 dQ accumulator [B, H, T, D], then rowsum(dO * O) f32 [B, H, T],
// each rounded up to 256 bytes.
inline int64_t cudnn_attention_dq_accumulator_bytes(const AttentionGeometry& g) {
  return (g.B * g.H * g.T * g.D * 4 + 255) / 256 * 256;
}
inline int64_t cudnn_attention_row_sum_bytes(const AttentionGeometry& g) {
  return (g.B * g.H * g.T * 4 + 255) / 256 * 256;
}

}  // namespace tr::backend
