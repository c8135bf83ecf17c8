// The CPU fused attention's GEMM-tiled kernels for f32/bf16/f16 (attention_gemm.cpp); f64 keeps the scalar
// kernels of attention.cpp (the gradient checks' reference precision).
#pragma once
#include "backend/attention_geometry.h"
#include "core/half.h"

namespace tr::cpu {

// out [B, H, T, D] and lse [B, H, T] (f32) of causal/padded/windowed attention, q [B, H, T, D], k/v [B, KV,
// S, D], all contiguous.
template <typename T>
void attention_gemm_forward(const backend::AttentionGeometry& g, const T* q, const T* k, const T* v, T* out,
                            float* lse);
// dq, dk, dv from the forward's out and lse.
template <typename T>
void attention_gemm_backward(const backend::AttentionGeometry& g, const T* q, const T* k, const T* v,
                             const T* out, const float* lse, const T* dout, T* dq, T* dk, T* dv);

// The same for bf16 with every tile product a native bf16 dot product (attention_bf16.cpp): on AMX tiles
// (needs amx::request_tiles()) or on AVX512_BF16 dot products (dpbf16::available()); a head dim that is a
// multiple of 32 either way.
enum class Bf16Tiles { amx, avx512_bf16 };
void attention_bf16_forward(Bf16Tiles tiles, const backend::AttentionGeometry& g, const BFloat16* q,
                            const BFloat16* k, const BFloat16* v, BFloat16* out, float* lse);
void attention_bf16_backward(Bf16Tiles tiles, const backend::AttentionGeometry& g, const BFloat16* q,
                             const BFloat16* k, const BFloat16* v, const BFloat16* out, const float* lse,
                             const BFloat16* dout, BFloat16* dq, BFloat16* dk, BFloat16* dv);

}  // namespace tr::cpu
