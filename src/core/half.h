// bf16 and f16 storage types with IEEE round-to-nearest-even conversions (NaN, Inf and subnormals exact).
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>

namespace tr {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even; overflow carries into Inf
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_float(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_half_bits(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((a >> 13) & 0x1ffu);  // NaN stays NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to Inf (also Inf itself)
  if (a < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24, rounded to nearest even.
    if (a < 0x33000000u) return sign;  // below half of the smallest subnormal: zero
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // shift so that the result unit is 2^-24
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits.
  uint32_t r = a - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    // subnormal: m * 2^-24, exact in f32
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// f64 -> f32 rounded to odd (truncate, then set the last bit if anything was lost): a second rounding of
// that value to bf16/f16 (which have far fewer bits) is then exactly the correctly rounded f64 result.
inline float f64_to_f32_round_odd(double d) {
  float f = static_cast<float>(d);
  if (f != f || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  uint32_t u = f32_bits(f) | 1u;
  return bits_f32(u);
}
inline uint16_t double_to_bf16_bits(double d) { return float_to_bf16_bits(f64_to_f32_round_odd(d)); }
inline uint16_t double_to_half_bits(double d) { return float_to_half_bits(f64_to_f32_round_odd(d)); }

struct BFloat16 {
  uint16_t bits;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(float_to_bf16_bits(f)) {}
  explicit BFloat16(double d) : bits(double_to_bf16_bits(d)) {}
  operator float() const { return bf16_bits_to_float(bits); }
};

struct Half {
  uint16_t bits;
  Half() = default;
  explicit Half(float f) : bits(float_to_half_bits(f)) {}
  explicit Half(double d) : bits(double_to_half_bits(d)) {}
  operator float() const { return half_bits_to_float(bits); }
};

static_assert(sizeof(BFloat16) == 2 && sizeof(Half) == 2);

}  // namespace tr
