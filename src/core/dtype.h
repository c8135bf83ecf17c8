// Element types of tensors (f32 f16 bf16 f64 i32 i64 u8 bool) and their properties.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tr {

enum class DType : uint8_t { f32, f16, bf16, f64, i32, i64, u8, boolean };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::boolean: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
}
constexpr bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

std::string_view dtype_name(DType t);
// Parses "float32"/"f32"/"bfloat16"/"bf16"/... ; throws on unknown names.
DType parse_dtype(std::string_view s);

}  // namespace tr
