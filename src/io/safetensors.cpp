// Memory-mapped safetensors reading, atomic writing, and sharded checkpoints with an index.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/json_fields.h"
#include "io/safetensors.h"

#include "core/file_writer.h"
#include "ops/ops.h"

namespace tr::io {

namespace fs = std::filesystem;

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TR_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = nullptr;
  if (size > 0) {
    // Private and writable: parameters that borrow the mapping can be updated in place (copy-on-write),
    // and the file itself is never touched.
    p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail("{}: cannot map {} bytes: {}", path, size, std::strerror(errno));
    }
  }
  ::close(fd);
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = std::shared_ptr<void>(p, [size](void* q) {
    if (q) ::munmap(q, size);
  });
  f.base_ = static_cast<const uint8_t*>(p);
  f.size_ = size;
  f.header_ = parse_safetensors_header(f.base_, size, path);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i) f.index_[f.header_.tensors[i].name] = i;
  return f;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  TR_CHECK(it != index_.end(), "{}: no tensor named '{}'", path_, name);
  return header_.tensors[it->second];
}

Tensor SafetensorsFile::load(const std::string& name, std::optional<DType> dtype, Device device) const {
  const TensorInfo& t = info(name);
  uint8_t* src = const_cast<uint8_t*>(base_) + header_.data_offset + t.begin;
  const size_t nbytes = t.end - t.begin;
  Tensor view;
  if (reinterpret_cast<uintptr_t>(src) % dtype_size(t.dtype) == 0) {
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = std::make_shared<Storage>(src, nbytes, Device::cpu(), map_);
    impl->shape = t.shape;
    impl->strides = contiguous_strides(t.shape);
    impl->dtype = t.dtype;
    view = Tensor(std::move(impl));
  } else {
    // Misaligned data (an unpadded header): copy into an aligned buffer.
    view = ops::empty(t.shape, t.dtype, Device::cpu());
    if (nbytes) std::memcpy(view.data_ptr(), src, nbytes);
  }
  const DType want = dtype.value_or(t.dtype);
  TR_CHECK(want == t.dtype || (is_floating(want) && is_floating(t.dtype)),
           "{}: tensor '{}' of dtype {} cannot be loaded as {}", path_, name, dtype_name(t.dtype),
           dtype_name(want));
  return ops::to_device(ops::to_dtype(view, want), device);
}

void save_safetensors(const std::string& path, const std::vector<TensorEntry>& entries,
                      const TensorMaker& make, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["format"] = "pt";  // transformers refuses files without it
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  uint64_t at = 0;
  for (const auto& e : entries) {  // the header from the shapes alone: written before any value exists
    TR_CHECK(!e.name.empty() && e.name != "__metadata__", "{}: invalid tensor name '{}'", path, e.name);
    TR_CHECK(!header.contains(e.name), "{}: tensor '{}' given twice", path, e.name);
    const uint64_t nb = static_cast<uint64_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
    header[e.name] = {
        {"dtype", safetensors_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {at, at + nb}}};
    at += nb;
  }
  std::string hs = header.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');  // pad so the data section starts 8-byte aligned
  const std::string tmp = path + ".tmp";
  try {
    FileWriter out(tmp);  // a full disk says so, with the path
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(hs.size()) >> (8 * i));
    out.write(len, 8);
    out.write(hs);
    for (size_t i = 0; i < entries.size(); ++i) {
      const Tensor h = ops::contiguous(ops::to_device(make(i), Device::cpu()));
      TR_CHECK(h.dtype() == entries[i].dtype && h.shape() == entries[i].shape,
               "{}: tensor '{}' is {}, its header says {} {}", path, entries[i].name, h.describe(),
               dtype_name(entries[i].dtype), shape_str(entries[i].shape));
      if (h.nbytes()) out.write(h.data_ptr(), h.nbytes());
    }
    out.close(/*sync=*/true);
  } catch (...) {  // a tensor that failed to be made, or a full disk: no partial file stays behind
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  TR_CHECK(!ec, "{}: cannot rename into place: {}", path, ec.message());
}

namespace {

std::vector<TensorEntry> entries_of(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<TensorEntry> out;
  for (const auto& [name, t] : tensors) out.push_back({name, t.dtype(), t.shape()});
  return out;
}

}  // namespace

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  save_safetensors(
      path, entries_of(tensors), [&](size_t i) { return tensors[i].second; }, metadata);
}

uint64_t parse_size(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  const std::string number = s.substr(0, i);
  char* end = nullptr;
  const double v = i > 0 ? std::strtod(number.c_str(), &end) : 0.0;  // strtod: no exception on "." or 1e999
  TR_CHECK(i > 0 && end == number.c_str() + number.size() && std::isfinite(v),
           "size '{}': expected a number such as 5GB, 500MB or 2GiB", s);
  std::string unit = s.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mul = 1;
  if (unit.empty() || unit == "B")
    mul = 1;
  else if (unit == "KB")
    mul = 1e3;
  else if (unit == "MB")
    mul = 1e6;
  else if (unit == "GB")
    mul = 1e9;
  else if (unit == "KIB")
    mul = 1024.0;
  else if (unit == "MIB")
    mul = 1024.0 * 1024;
  else if (unit == "GIB")
    mul = 1024.0 * 1024 * 1024;
  else
    fail("size '{}': unknown unit '{}' (use B, KB, MB, GB, KiB, MiB or GiB)", s, s.substr(i));
  TR_CHECK(v * mul < 1.8e19, "size '{}': more bytes than 64 bits hold", s);  // the cast would be undefined
  return static_cast<uint64_t>(v * mul);
}

void save_sharded(const std::string& dir, const std::vector<TensorEntry>& entries, const TensorMaker& make,
                  uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  make_directories(dir, "save_sharded");
  // Greedy in the given order, as transformers does: a tensor larger than the limit gets a shard of its own.
  // Shards hold consecutive entries, so `make` is still called once per tensor, in order.
  std::vector<std::pair<size_t, size_t>> shards{{0, 0}};  // [first, last) entry
  uint64_t cur = 0, total = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const uint64_t nb = static_cast<uint64_t>(shape_numel(entries[i].shape)) * dtype_size(entries[i].dtype);
    if (shards.back().second > shards.back().first && cur + nb > max_shard_bytes) {
      shards.emplace_back(i, i);
      cur = 0;
    }
    shards.back().second = i + 1;
    cur += nb;
    total += nb;
  }
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (shards.size() == 1) {
    save_safetensors((fs::path(dir) / "model.safetensors").string(), entries, make, metadata);
    fs::remove(index);
    return;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  const size_t n = shards.size();
  for (size_t s = 0; s < n; ++s) {
    const auto [first, last] = shards[s];
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n);
    const std::vector<TensorEntry> part(entries.begin() + static_cast<std::ptrdiff_t>(first),
                                        entries.begin() + static_cast<std::ptrdiff_t>(last));
    save_safetensors((fs::path(dir) / file).string(), part,
                     [&, first = first](size_t i) { return make(first + i); }, metadata);
    for (const auto& e : part) weight_map[e.name] = file;
  }
  nlohmann::ordered_json j;
  j["metadata"] = {{"total_size", total}};
  j["weight_map"] = weight_map;
  const std::string tmp = index.string() + ".tmp";
  write_file(tmp, j.dump(2) + "\n");
  fs::rename(tmp, index);
  fs::remove(fs::path(dir) / "model.safetensors");
}

void save_sharded(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                  uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  save_sharded(
      dir, entries_of(tensors), [&](size_t i) { return tensors[i].second; }, max_shard_bytes, metadata);
}

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    const std::string index_path = index.string();
    const nlohmann::json j = read_json(index_path);
    std::map<std::string, size_t> file_ix;
    JsonField(j, index_path)
        .object()["weight_map"]
        .each_member([&](const std::string& name, const JsonField& e) {
          const std::string file = e.string();
          if (file.find('/') != std::string::npos) e.fail("points outside the folder: {}", file);
          if (file.empty() || file == "." || file == "..") e.fail("must name a shard file, got '{}'", file);
          if (!file_ix.count(file)) {
            file_ix[file] = files_.size();
            files_.push_back(SafetensorsFile::open((fs::path(dir) / file).string()));
          }
          const SafetensorsFile& f = files_[file_ix[file]];
          TR_CHECK(f.contains(name), "{}: index lists tensor '{}' but the shard does not hold it", f.path(),
                   name);
          where_[name] = file_ix[file];
        });
  } else {
    TR_CHECK(fs::exists(single), "{}: no model.safetensors or model.safetensors.index.json", dir);
    files_.push_back(SafetensorsFile::open(single.string()));
    for (const auto& t : files_[0].header().tensors) where_[t.name] = 0;
  }
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> n;
  for (const auto& [k, v] : where_) n.push_back(k);
  return n;
}

const TensorInfo& CheckpointReader::info(const std::string& name) const {
  auto it = where_.find(name);
  TR_CHECK(it != where_.end(), "{}: the checkpoint has no tensor named '{}'", dir_, name);
  return files_[it->second].info(name);
}

Tensor CheckpointReader::load(const std::string& name, std::optional<DType> dtype, Device device) const {
  auto it = where_.find(name);
  TR_CHECK(it != where_.end(), "{}: the checkpoint has no tensor named '{}'", dir_, name);
  return files_[it->second].load(name, dtype, device);
}

uint64_t CheckpointReader::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, f] : where_) {
    const auto& t = files_[f].info(name);
    n += t.end - t.begin;
  }
  return n;
}

}  // namespace tr::io
