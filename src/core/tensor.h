// Tensor: a typed, strided view onto shared Storage, plus the slots autograd fills in (grad, grad_fn).
// Core knows nothing of ops or autograd: the autograd node type is only forward-declared here.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"
#include "core/shape.h"
#include "core/storage.h"

namespace tr {

namespace autograd {
class Node;
}

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  // Autograd slots, owned by the autograd layer.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;
};

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::boolean;
}

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialized contiguous tensor from an allocator (ops::empty picks the allocator of a device).
  static Tensor empty(const Shape& shape, DType dtype, Allocator& alloc);
  // A contiguous tensor of `shape` over `storage` (placeholders, storage that starts released).
  static Tensor over(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;
  const Strides& strides() const { return impl().strides; }
  int64_t stride(int64_t d) const;
  int64_t offset() const { return impl().offset; }
  int64_t numel() const { return shape_numel(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }

  // Pointer to the first element (storage base + offset); throws on the meta device.
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    TR_CHECK(dtype() == dtype_of<T>(), "data<{}>() called on a tensor of dtype {}", dtype_name(dtype_of<T>()),
             dtype_name(dtype()));
    return static_cast<T*>(data_ptr());
  }
  // Value of element `i` in logical (row-major) order as double; CPU tensors only.
  double item_at(int64_t i) const;
  double item() const;

  // A new tensor sharing this storage with the given geometry; bounds-checked against the storage.
  Tensor as_strided(const Shape& shape, const Strides& strides, int64_t offset) const;

  // Autograd slots (the autograd layer gives them meaning).
  bool requires_grad() const { return impl().requires_grad; }
  Tensor grad() const { return Tensor(impl().grad); }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl().grad_fn; }
  bool is_leaf() const { return impl().grad_fn == nullptr; }

  TensorImpl& impl() const {
    TR_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

  // "Tensor[2, 3] f32 cpu" for error messages.
  std::string describe() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace tr
