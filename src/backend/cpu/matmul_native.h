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
  // Whether they beat widening to f32 sgemm (bench/bench_ops' native rows, docs/PERFORMANCE.md): with AMX
  // (1,730 GFLOP/s against 352 f32 on a Xeon), and on AMD's AVX512_BF16 (Zen 4, family 0x19, and later),
  // whose dot products run at twice the f32 FMA rate (Zen 5: 859 against 369, 2.3x; Zen 4 with its 256-bit
  // units: 429 against 206, 2.1x). Intel's AVX512_BF16 without AMX measured 0.55-0.65x (one port for
  // VDPBF16PS, two for FMA), so bf16 widens to f32 there.
  bool preferred() const { return amx_ || (bf16_ && amd_zen4_); }
  // Whether the native kernel is AMX's (else AVX512_BF16 dot products), for the notes that say which.
  bool amx() const { return amx_; }
  // The kernel oneDNN would run a [64, 64] x [64, 64] matmul of `dt` operands into f32 with here, probed once
  // per dtype at construction ("" when it has none; a name starting "ref" is a reference loop).
  const std::string& impl_name(DType dt) const { return dt == DType::bf16 ? bf16_impl_ : f16_impl_; }
  // Whether training in `dt` should run its matmuls here natively (bf16 where preferred, with a JIT kernel).
  bool native_for(DType dt) const {
    return dt == DType::bf16 && preferred() && !bf16_impl_.empty() && bf16_impl_.rfind("ref", 0) != 0;
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
  bool bf16_ = false, amx_ = false, amd_zen4_ = false, avx512_fp16_ = false, tiles_ = false;
  std::string bf16_impl_, f16_impl_;
};

}  // namespace tr::cpu
