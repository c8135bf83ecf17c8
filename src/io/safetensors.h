// safetensors files: a validating header parser, a memory-mapped reader that hands out tensors without a
// copy where dtype and alignment allow, an atomic writer, and sharded checkpoints with
// model.safetensors.index.json (Hugging Face's layout). Errors name the file and the tensor at fault.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tr::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range relative to the start of the data section
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + header length
};

// Parses and validates the 8-byte length, the JSON header and every tensor's dtype, shape and byte range
// against a file of `size` bytes. Throws tr::Error naming `path` and the tensor or field at fault.
SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& path);

// "F32" <-> DType; throws for names we do not support (naming the tensor).
std::string safetensors_dtype_name(DType dt);

class SafetensorsFile {
 public:
  // Maps the file and validates its header.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;
  // The tensor on `device` in `dtype` (default: as stored). On the CPU in the stored dtype and suitably
  // aligned, the tensor borrows the mapping (copy-on-write; the file is never modified).
  Tensor load(const std::string& name, std::optional<DType> dtype = std::nullopt,
              Device device = Device::cpu()) const;

 private:
  std::string path_;
  std::shared_ptr<void> map_;  // the mapping; unmapped when the last tensor borrowing it is gone
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;
};

// A tensor of a streamed save, as its header describes it before its values exist.
struct TensorEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
};
// Tensor i of a streamed save: called once per entry, in order, and must have that entry's dtype and shape
// (any device). Only one made tensor is held at a time, so a save needs one tensor's memory, not all of
// theirs (a sharded run gathers each parameter as it is written).
using TensorMaker = std::function<Tensor(size_t i)>;

// The streamed form of the writers below: the same files, one tensor in memory at a time.
void save_safetensors(const std::string& path, const std::vector<TensorEntry>& entries,
                      const TensorMaker& make, const std::map<std::string, std::string>& metadata = {});
void save_sharded(const std::string& dir, const std::vector<TensorEntry>& entries, const TensorMaker& make,
                  uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata = {});

// Writes tensors (any device; stored little-endian in their dtype) with metadata {"format": "pt", ...} to
// `path` through a temporary file that is renamed into place, so a crash never leaves a partial file.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// "5GB" (10^9), "500MB", "2GiB" (2^30), "100KB", or a plain byte count.
uint64_t parse_size(const std::string& s);

// Saves a model's tensors into `dir` as model.safetensors, or, above max_shard_bytes, as
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json (HF's names and format).
void save_sharded(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                  uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata = {});

// Reads a model folder written by save_sharded or by transformers: one file or an index of shards.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;
  Tensor load(const std::string& name, std::optional<DType> dtype = std::nullopt,
              Device device = Device::cpu()) const;
  uint64_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor -> file
};

}  // namespace tr::io
