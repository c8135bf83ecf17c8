// The CPU fused attention's GEMM-tiled kernels for f32/bf16/f16 (attention_gemm.cpp); f64 keeps the scalar
// kernels of attention.cpp (the gradient checks' reference precision).
#pragma once
#include "backend/attention_geometry.h"

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

}  // namespace tr::cpu
