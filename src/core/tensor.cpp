// Tensor geometry, bounds-checked views and element access.
#include "core/tensor.h"

namespace tr {

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator& alloc) {
  for (int64_t s : shape) TR_CHECK(s >= 0, "empty: negative size in shape {}", shape_str(shape));
  return over(std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), alloc),
              shape, dtype);
}

Tensor Tensor::over(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

int64_t Tensor::size(int64_t d) const { return impl().shape[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return impl().strides[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  const auto& sh = impl().shape;
  const auto& st = impl().strides;
  int64_t expected = 1;
  for (int64_t i = static_cast<int64_t>(sh.size()) - 1; i >= 0; --i) {
    if (sh[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= sh[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  TR_CHECK(!device().is_meta(), "data_ptr() of a meta tensor {}: meta tensors hold no data", describe());
  TR_CHECK(!impl().storage->released(),
           "data_ptr() of {}: its storage is released (a full_shard parameter used outside its gather)",
           describe());
  auto* base = static_cast<char*>(impl().storage->data());
  return base + impl().offset * static_cast<int64_t>(dtype_size(dtype()));
}

double Tensor::item_at(int64_t i) const {
  TR_CHECK(device().is_cpu(), "item_at: tensor {} is not on the cpu", describe());
  TR_CHECK(i >= 0 && i < numel(), "item_at: index {} out of range for {}", i, describe());
  int64_t off = 0;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    int64_t s = impl().shape[d];
    off += (i % s) * impl().strides[d];
    i /= s;
  }
  const char* p = static_cast<const char*>(data_ptr()) + off * static_cast<int64_t>(dtype_size(dtype()));
  switch (dtype()) {
    case DType::f32: return *reinterpret_cast<const float*>(p);
    case DType::f64: return *reinterpret_cast<const double*>(p);
    case DType::f16: return float(*reinterpret_cast<const Half*>(p));
    case DType::bf16: return float(*reinterpret_cast<const BFloat16*>(p));
    case DType::i32: return *reinterpret_cast<const int32_t*>(p);
    case DType::i64: return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
    case DType::u8: return *reinterpret_cast<const uint8_t*>(p);
    case DType::boolean: return *reinterpret_cast<const bool*>(p) ? 1.0 : 0.0;
  }
  return 0;
}

double Tensor::item() const {
  TR_CHECK(numel() == 1, "item() needs a tensor with one element, got {}", describe());
  return item_at(0);
}

Tensor Tensor::as_strided(const Shape& shape, const Strides& strides, int64_t offset) const {
  TR_CHECK(shape.size() == strides.size(), "as_strided: shape {} and strides {} differ in rank",
           shape_str(shape), shape_str(strides));
  int64_t lo = offset, hi = offset;
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    TR_CHECK(shape[i] >= 0, "as_strided: negative size in {}", shape_str(shape));
    if (shape[i] == 0) empty = true;
    int64_t span = (shape[i] - 1) * strides[i];
    if (span < 0)
      lo += span;
    else
      hi += span;
  }
  int64_t cap = static_cast<int64_t>(impl().storage->nbytes() / dtype_size(dtype()));
  TR_CHECK(empty || (lo >= 0 && hi < cap),
           "as_strided: view {} strides {} offset {} exceeds storage of {} elements", shape_str(shape),
           shape_str(strides), offset, cap);
  auto v = std::make_shared<TensorImpl>();
  v->storage = impl().storage;
  v->shape = shape;
  v->strides = strides;
  v->offset = offset;
  v->dtype = dtype();
  return Tensor(std::move(v));
}

std::string Tensor::describe() const {
  if (!defined()) return "Tensor(undefined)";
  return fmt::format("Tensor{} {} {}", shape_str(shape()), dtype_name(dtype()), device().str());
}

}  // namespace tr
