// Validating parser of the safetensors header (kept free of the ops layer so the fuzzer can build it alone).
#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace tr::io {

namespace {

constexpr size_t kMaxRank = 64;  // far above any real tensor; bounds the work per header entry

std::optional<DType> dtype_from_name(const std::string& s) {
  if (s == "F32") return DType::f32;
  if (s == "F16") return DType::f16;
  if (s == "BF16") return DType::bf16;
  if (s == "F64") return DType::f64;
  if (s == "I32") return DType::i32;
  if (s == "I64") return DType::i64;
  if (s == "U8") return DType::u8;
  if (s == "BOOL") return DType::boolean;
  return std::nullopt;
}

}  // namespace

std::string safetensors_dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::boolean: return "BOOL";
  }
  return "?";
}

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& path) {
  TR_CHECK(size >= 8, "{}: not a safetensors file: {} bytes, shorter than the 8-byte header length", path,
           size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian
  TR_CHECK(n <= size - 8, "{}: header length {} runs past the end of the file ({} bytes)", path, n, size);
  TR_CHECK(n <= (uint64_t{100} << 20), "{}: header length {} exceeds the 100 MB limit", path, n);
  nlohmann::json j = nlohmann::json::parse(data + 8, data + 8 + n, nullptr, false);
  TR_CHECK(!j.is_discarded(), "{}: the header is not valid JSON", path);
  TR_CHECK(j.is_object(), "{}: the header must be a JSON object", path);
  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_size = size - h.data_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      TR_CHECK(v.is_object(), "{}: __metadata__ must be an object of strings", path);
      for (auto m = v.begin(); m != v.end(); ++m) {
        TR_CHECK(m.value().is_string(), "{}: __metadata__ value '{}' is not a string", path, m.key());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    TR_CHECK(v.is_object(), "{}: tensor '{}': entry is not an object", path, name);
    TR_CHECK(v.contains("dtype") && v["dtype"].is_string(), "{}: tensor '{}': missing field 'dtype'", path,
             name);
    TR_CHECK(v.contains("shape") && v["shape"].is_array(), "{}: tensor '{}': missing field 'shape'", path,
             name);
    TR_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
             "{}: tensor '{}': missing or malformed field 'data_offsets'", path, name);
    TensorInfo t;
    t.name = name;
    auto dt = dtype_from_name(v["dtype"].get<std::string>());
    TR_CHECK(dt.has_value(), "{}: tensor '{}': unknown or unsupported dtype '{}'", path, name,
             v["dtype"].get<std::string>());
    t.dtype = *dt;
    TR_CHECK(v["shape"].size() <= kMaxRank, "{}: tensor '{}': shape has {} dimensions, more than {}", path,
             name, v["shape"].size(), kMaxRank);
    // The product of the non-zero sizes stays below 2^62, so strides and element counts cannot overflow
    // int64, even for an empty tensor with huge other dimensions.
    uint64_t elems = 1, extent = 1;
    for (const auto& d : v["shape"]) {
      TR_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
               "{}: tensor '{}': shape entries must be non-negative integers", path, name);
      const uint64_t s = d.get<uint64_t>();
      TR_CHECK(s <= 1 || extent <= (uint64_t{1} << 62) / s, "{}: tensor '{}': shape overflows (over 2^62)",
               path, name);
      extent *= std::max<uint64_t>(s, 1);
      elems *= s;
      t.shape.push_back(static_cast<int64_t>(s));
    }
    for (const auto& o : v["data_offsets"])
      TR_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
               "{}: tensor '{}': data_offsets must be non-negative integers", path, name);
    t.begin = v["data_offsets"][0].get<uint64_t>();
    t.end = v["data_offsets"][1].get<uint64_t>();
    TR_CHECK(t.begin <= t.end, "{}: tensor '{}': data_offsets [{}, {}] are reversed", path, name, t.begin,
             t.end);
    TR_CHECK(t.end <= data_size,
             "{}: tensor '{}': data_offsets end {} is past the end of the data ({} bytes)", path, name, t.end,
             data_size);
    // elems * dtype_size must not wrap around (2^61 F64 elements would "need" 0 bytes).
    TR_CHECK(elems <= std::numeric_limits<uint64_t>::max() / dtype_size(t.dtype),
             "{}: tensor '{}': shape {} of {} needs more than 2^64 bytes", path, name, shape_str(t.shape),
             safetensors_dtype_name(t.dtype));
    TR_CHECK(t.end - t.begin == elems * dtype_size(t.dtype),
             "{}: tensor '{}': {} bytes in data_offsets, but shape {} of {} needs {}", path, name,
             t.end - t.begin, shape_str(t.shape), safetensors_dtype_name(t.dtype),
             elems * dtype_size(t.dtype));
    h.tensors.push_back(std::move(t));
  }
  // Ranges must tile the data section: ordered, no overlap, no gap (as the reference implementation demands).
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const auto& t : h.tensors) {
    TR_CHECK(t.begin >= at, "{}: tensor '{}': byte range [{}, {}] overlaps the previous tensor (ends at {})",
             path, t.name, t.begin, t.end, at);
    TR_CHECK(t.begin == at, "{}: tensor '{}': byte range starts at {}, leaving a gap after {}", path, t.name,
             t.begin, at);
    at = t.end;
  }
  TR_CHECK(at == data_size,
           "{}: the tensors cover {} bytes but the data section holds {} (truncated or padded file)", path,
           at, data_size);
  return h;
}

}  // namespace tr::io
