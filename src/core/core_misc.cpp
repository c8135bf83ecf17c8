// dtype names, device parsing, shape helpers and thread-count bounds.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/threads.h"

namespace tr {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f64: return "float64";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
    case DType::boolean: return "bool";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "float32" || s == "f32" || s == "float" || s == "fp32") return DType::f32;
  if (s == "float16" || s == "f16" || s == "half" || s == "fp16") return DType::f16;
  if (s == "bfloat16" || s == "bf16") return DType::bf16;
  if (s == "float64" || s == "f64" || s == "double") return DType::f64;
  if (s == "int32" || s == "i32") return DType::i32;
  if (s == "int64" || s == "i64") return DType::i64;
  if (s == "uint8" || s == "u8") return DType::u8;
  if (s == "bool") return DType::boolean;
  fail("unknown dtype '{}' (expected float32, float16, bfloat16, float64, int32, int64, uint8 or bool)", s);
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::cpu: return index == 0 ? "cpu" : fmt::format("cpu:{}", index);
    case DeviceType::meta: return index == 0 ? "meta" : fmt::format("meta:{}", index);
    case DeviceType::cuda: return fmt::format("cuda:{}", index);
  }
  return "?";
}

Device Device::parse(std::string_view s) {
  if (s == "cpu") return cpu();
  if (s == "meta") return meta();
  if (s == "cuda") return cuda(0);
  if (s.substr(0, 5) == "cuda:" && s.size() > 5 && s.size() <= 9 &&  // up to cuda:9999: no stoi overflow
      std::all_of(s.begin() + 5, s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return cuda(std::stoi(std::string(s.substr(5))));
  fail("unknown device '{}' (expected cpu, meta, cuda or cuda:N)", s);
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  TR_CHECK(ndim > 0, "{}: needs a tensor with at least one dim, got a scalar (rank 0)", op);
  TR_CHECK(dim >= -ndim && dim < ndim, "{}: dim {} out of range for a tensor of rank {}", op, dim, ndim);
  return dim < 0 ? dim + ndim : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TR_CHECK(da == db || da == 1 || db == 1, "{}: shapes {} and {} cannot be broadcast", op, shape_str(a),
             shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int max_pool_threads() { return static_cast<int>(std::max(1024u, 4 * std::thread::hardware_concurrency())); }

void check_omp_num_threads_env() {
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (v == nullptr) return;
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (end == v) return;  // not a number: OpenMP warns and uses its default
  TR_CHECK(errno != ERANGE && n <= max_pool_threads(),
           "OMP_NUM_THREADS={}: more threads than a process here can usefully start; expected at most {} "
           "(this machine has {} cores)",
           v, max_pool_threads(), std::thread::hardware_concurrency());
}

}  // namespace tr
