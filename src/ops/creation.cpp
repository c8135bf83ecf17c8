// Tensor creation, copies across dtypes and devices, and conversion to/from std::vector.
#include <cstring>

#include <fmt/format.h>

#include "backend/cuda_api.h"
#include "ops/ops.h"

namespace tr::ops {

Allocator& allocator_for(Device device) {
  switch (device.type) {
    case DeviceType::cpu: return cpu_allocator(device.index);
    case DeviceType::meta: return meta_allocator(device.index);
    case DeviceType::cuda: return backend::backend_for(device).allocator(device.index);
  }
  fail("no allocator for device {}", device.str());
}

bool fuses_elementwise(Device device) { return backend::backend_for(device).fuses_elementwise(); }
std::string autotune_summary(Device device) { return backend::backend_for(device).autotune_summary(); }
std::string cudnn_attention_summary(Device device) {
  if (!device.is_cuda()) return "";
  const backend::CudnnAttentionCounts c = backend::cuda_cudnn_attention_counts();
  if (c.forward + c.backward + c.refused == 0) return "";
  std::string s = fmt::format("cuDNN's fused attention ran {} forward and {} backward calls ({} plans)",
                              c.forward, c.backward, c.plans);
  if (c.refused > 0) s += fmt::format("; {} shapes refused, the last: {}", c.refused, c.last_refusal);
  return s;
}

Range::Range(Device device, const char* name) {
  if (!device.is_cuda()) return;  // only a GPU backend has a profiler to tell
  be_ = &backend::backend_for(device);
  be_->range_push(name);
}

Range::~Range() {
  if (be_) be_->range_pop();
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
  return Tensor::empty(shape, dtype, allocator_for(device));
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (!device.is_meta() && t.numel() > 0) backend::backend_for(device).fill(t, value);
  return t;
}
void fill_(const Tensor& t, double value) {
  TR_CHECK(t.is_contiguous(), "fill_: {} is not contiguous", t.describe());
  if (!t.device().is_meta() && t.numel() > 0) backend::backend_for(t.device()).fill(t, value);
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }

Tensor arange(int64_t n, DType dtype, Device device, double start) {
  Tensor t = empty({n}, dtype, device);
  if (!device.is_meta() && n > 0) backend::backend_for(device).arange(t, start, 1.0);
  return t;
}

Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device, double mean, double std) {
  Tensor t = empty(shape, dtype, device);
  uint64_t off = gen.reserve(2 * static_cast<uint64_t>(t.numel()));
  if (!device.is_meta() && t.numel() > 0)
    backend::backend_for(device).random_normal(t, mean, std, gen.seed(), off);
  return t;
}

Tensor rand(const Shape& shape, Generator& gen, DType dtype, Device device, double lo, double hi) {
  Tensor t = empty(shape, dtype, device);
  uint64_t off = gen.reserve(static_cast<uint64_t>(t.numel()));
  if (!device.is_meta() && t.numel() > 0)
    backend::backend_for(device).random_uniform(t, lo, hi, gen.seed(), off);
  return t;
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  TR_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "from_vector: {} values do not fill shape {}", values.size(), shape_str(shape));
  Tensor host = Tensor::empty(shape, dtype_of<T>(), cpu_allocator());
  if (!values.empty()) std::memcpy(host.data_ptr(), values.data(), values.size() * sizeof(T));
  return device == Device::cpu() ? host : to_device(host, device);  // a host partition gets its own copy
}

template <typename T>
std::vector<T> to_vector(const Tensor& t) {
  Tensor h = to_dtype(to_device(t, Device::cpu()), dtype_of<T>());
  h = contiguous(h);
  std::vector<T> out(static_cast<size_t>(h.numel()));
  if (!out.empty()) std::memcpy(out.data(), h.data_ptr(), out.size() * sizeof(T));
  return out;
}

#define TR_INSTANTIATE(T)                                                      \
  template Tensor from_vector<T>(const std::vector<T>&, const Shape&, Device); \
  template std::vector<T> to_vector<T>(const Tensor&);
TR_INSTANTIATE(float)
TR_INSTANTIATE(double)
TR_INSTANTIATE(int32_t)
TR_INSTANTIATE(int64_t)
TR_INSTANTIATE(uint8_t)
TR_INSTANTIATE(BFloat16)
TR_INSTANTIATE(Half)
#undef TR_INSTANTIATE

void copy_(const Tensor& dst, const Tensor& src) {
  TR_CHECK(dst.shape() == src.shape(), "copy_: destination {} and source {} differ in shape", dst.describe(),
           src.describe());
  if (dst.numel() == 0) return;
  const Device sd = src.device(), dd = dst.device();
  if (sd.is_meta() || dd.is_meta()) {
    // Into meta from anywhere is a dry run's copy (a host table an optimizer uploads, say): nothing to move.
    TR_CHECK(dd.is_meta(), "copy_: cannot copy data from {} to {} (meta tensors hold none)", src.describe(),
             dst.describe());
    return;
  }
  if (sd == dd || (sd.is_cpu() && dd.is_cpu())) {  // host partitions share the host's memory
    backend::backend_for(dd).copy(src, dst);
    return;
  }
  // Across devices: make the bytes contiguous in dst's dtype on the source side, move them, then place them.
  Tensor s = contiguous(to_dtype(src, dst.dtype()));
  if (dst.is_contiguous()) {
    backend::cuda_copy_between_devices(s, dst);
  } else {
    Tensor tmp = empty(dst.shape(), dst.dtype(), dd);
    backend::cuda_copy_between_devices(s, tmp);
    backend::backend_for(dd).copy(tmp, dst);
  }
}

Tensor to_device(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  Tensor out = empty(t.shape(), t.dtype(), device);
  copy_(out, t);
  return out;
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.shape(), dtype, t.device());
  copy_(out, t);
  return out;
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor clone(const Tensor& t) {
  Tensor out = empty(t.shape(), t.dtype(), t.device());
  copy_(out, t);
  return out;
}

}  // namespace tr::ops
