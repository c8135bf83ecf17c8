// bf16 GEMMs on the CPU's own bf16 instructions: oneDNN's matmul primitive (AVX512_BF16 / AMX brgemm
// kernels), f32 accumulation, alpha as an output scale, beta as a sum post-op, one RNE rounding of a bf16 c.
// Declines (returns false) where oneDNN would fall back to a reference kernel: the caller widens instead.
#pragma once
#include <oneapi/dnnl/dnnl.h>

#include <string>

#include "backend/backend.h"

namespace tr::cpu {

class NativeMatmul {
 public:
  NativeMatmul();
  ~NativeMatmul();
  NativeMatmul(const NativeMatmul&) = delete;
  NativeMatmul& operator=(const NativeMatmul&) = delete;

  // Whether this CPU runs bf16 matmuls natively (AVX512_BF16 or AMX, as oneDNN sees it).
  bool has_bf16() const { return bf16_; }
  // Whether they beat widening to f32 sgemm: with AMX. AVX512_BF16 alone measured 0.5-0.65x our f32 sgemm
  // (oneDNN 2.6.3 brgemm, bench/bench_ops' head-shaped GEMM, docs/PERFORMANCE.md), so it stays unused there.
  bool preferred() const { return amx_; }
  // The kernel oneDNN would run a [64, 64] x [64, 64] matmul of `dt` operands into f32 with here, probed once
  // per dtype at construction ("" when it has none; a name starting "ref" is a reference loop).
  const std::string& impl_name(DType dt) const { return dt == DType::bf16 ? bf16_impl_ : f16_impl_; }
  // Whether training in `dt` should run its matmuls here natively (bf16 on AMX with a JIT kernel).
  bool native_for(DType dt) const {
    return dt == DType::bf16 && amx_ && !bf16_impl_.empty() && bf16_impl_.rfind("ref", 0) != 0;
  }
  // Whether the CPU has the AVX512_FP16 instructions (cpuid), whatever oneDNN makes of them.
  bool cpu_has_avx512_fp16() const { return avx512_fp16_; }
  // Whether our own kernels may use AMX bf16 tiles (the CPU has them, oneDNN runs on them, and Linux granted
  // this process the tile state).
  bool amx_tiles() const { return tiles_; }
  // c = alpha * op(a) op(b) + beta * c for bf16 a, b and an f32 or bf16 c (GemmArgs' layout); false when
  // oneDNN offers no native kernel for these strides (nothing written then).
  bool run(const backend::GemmArgs& g);

 private:
  dnnl_engine_t engine_ = nullptr;
  dnnl_stream_t stream_ = nullptr;
  bool bf16_ = false, amx_ = false, avx512_fp16_ = false, tiles_ = false;
  std::string bf16_impl_, f16_impl_;
};

}  // namespace tr::cpu
