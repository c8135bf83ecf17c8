// What the emulated-kernel tests share: a tensor's elements as an emulated CUDA type's bytes, their values,
// the dtype of an emulated type. Include after tests/cuda_emulator.h.
#pragma once
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/tensor.h"

namespace tr::test {

template <typename T>
DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  if constexpr (std::is_same_v<T, double>) return DType::f64;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return DType::bf16;
  return DType::f16;
}

// A contiguous tensor's elements as the emulated type's bytes.
template <typename T>
std::vector<T> bytes_of(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data_ptr(), v.size() * sizeof(T));
  return v;
}

template <typename T>
double value(T x) {
  return static_cast<double>(cuda::ld(&x, 0));
}

}  // namespace tr::test
