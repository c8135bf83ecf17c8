// bf16/f16 <-> f32 conversions for the CPU kernels, one value (load/store in loops.h) and in bulk (the
// widened GEMMs): bf16 by integer rounding that GCC vectorizes, f16 through F16C where the build has it. Both
// round to nearest even with Inf and subnormals exact: core/half.h's bits (tests/test_core.cpp), except that
// F16C quiets a signalling f16 NaN it widens (NaN either way).
#pragma once
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/half.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace tr::cpu {

// core/half.h's rounding without its early return, so loops of it vectorize (select instead of branch).
inline uint16_t bf16_bits_branch_free(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline float to_f32(BFloat16 x) { return bf16_bits_to_float(x.bits); }
inline float to_f32(Half x) {
#if defined(__F16C__)
  return _cvtsh_ss(x.bits);
#else
  return half_bits_to_float(x.bits);
#endif
}

template <typename T>
inline T from_f32(float f);
template <>
inline BFloat16 from_f32<BFloat16>(float f) {
  BFloat16 out;
  out.bits = bf16_bits_branch_free(f);
  return out;
}
template <>
inline Half from_f32<Half>(float f) {
  Half out;
#if defined(__F16C__)
  out.bits = static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  out.bits = float_to_half_bits(f);
#endif
  return out;
}

// y[i] = float(x[i]) for i < n (one thread; callers split rows across threads).
template <typename T>
inline void widen_run(const T* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  if constexpr (std::is_same_v<T, Half>) {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  }
#endif
#pragma omp simd
  for (int64_t j = i; j < n; ++j) y[j] = to_f32(x[j]);
}

// y[i] = T(x[i]) rounded to nearest even, for i < n (one thread).
template <typename T>
inline void narrow_run(const float* x, T* y, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  if constexpr (std::is_same_v<T, Half>) {
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(y + i),
          _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  if constexpr (std::is_same_v<T, BFloat16>) {
    uint16_t* bits = reinterpret_cast<uint16_t*>(y);
#pragma omp simd
    for (int64_t j = i; j < n; ++j) bits[j] = bf16_bits_branch_free(x[j]);
  } else {
    for (int64_t j = i; j < n; ++j) y[j] = from_f32<T>(x[j]);
  }
}

// A copy of `rows` runs of `cols` values, run r read from src + r * ld_src and written to dst + r * ld_dst,
// converted by `run`; threaded when there is enough to convert (memory-bound: ~2 passes over the data).
template <typename S, typename D, typename Run>
inline void convert_rows(const S* src, int64_t ld_src, D* dst, int64_t ld_dst, int64_t rows, int64_t cols,
                         Run run) {
  const bool threaded = rows > 1 && rows * cols >= (int64_t{1} << 16);
#pragma omp parallel for schedule(static) if (threaded)
  for (int64_t r = 0; r < rows; ++r) run(src + r * ld_src, dst + r * ld_dst, cols);
}

}  // namespace tr::cpu
