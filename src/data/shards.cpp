// llm.c and nanoGPT token files: writing, mapping and validation.
#include "data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/file_writer.h"
#include "core/error.h"

namespace tr::data {

namespace {
constexpr int32_t kMagic16 = 20240520, kMagic32 = 20240801;
constexpr int64_t kHeaderBytes = 256 * 4;
}  // namespace

struct ShardWriter::State {
  std::string path, tmp;
  bool wide = false;
  int64_t want = 0, written = 0;
  std::unique_ptr<FileWriter> out;
  std::vector<uint16_t> narrow;
};

ShardWriter::ShardWriter(const std::string& path, int64_t vocab_size, int64_t tokens) : s_(new State) {
  TR_CHECK(tokens >= 0 && tokens <= INT32_MAX, "{}: {} tokens exceed a shard's int32 count", path, tokens);
  s_->path = path;
  s_->tmp = path + ".tmp";
  s_->wide = vocab_size > 65536;
  s_->want = tokens;
  std::vector<int32_t> header(256, 0);
  header[0] = s_->wide ? kMagic32 : kMagic16;
  header[1] = s_->wide ? 7 : 1;
  header[2] = static_cast<int32_t>(tokens);
  s_->out = std::make_unique<FileWriter>(s_->tmp);
  try {
    s_->out->write(header.data(), kHeaderBytes);
  } catch (...) {
    s_->out.reset();
    std::error_code ec;
    std::filesystem::remove(s_->tmp, ec);
    throw;
  }
}

ShardWriter::~ShardWriter() {
  if (s_ && s_->out) {  // not closed: an error unwinds, the partial file goes
    s_->out.reset();
    std::error_code ec;
    std::filesystem::remove(s_->tmp, ec);
  }
}

void ShardWriter::append(const uint32_t* tokens, size_t n) {
  TR_CHECK(s_->out && s_->written + static_cast<int64_t>(n) <= s_->want,
           "{}: more tokens than the {} announced", s_->path, s_->want);
  if (s_->wide) {
    s_->out->write(tokens, n * 4);
  } else {
    s_->narrow.resize(n);
    for (size_t i = 0; i < n; ++i) {
      TR_CHECK(tokens[i] < 65536, "{}: token {} does not fit uint16", s_->path, tokens[i]);
      s_->narrow[i] = static_cast<uint16_t>(tokens[i]);
    }
    s_->out->write(s_->narrow.data(), n * 2);
  }
  s_->written += static_cast<int64_t>(n);
}

void ShardWriter::close() {
  TR_CHECK(s_->out && s_->written == s_->want, "{}: {} tokens written, {} announced", s_->path, s_->written,
           s_->want);
  s_->out->close();
  s_->out.reset();
  std::error_code ec;
  std::filesystem::rename(s_->tmp, s_->path, ec);
  if (ec) {
    std::filesystem::remove(s_->tmp, ec);
    fail("{}: cannot move the shard into place: {}", s_->path, ec.message());
  }
}

void write_llmc_shard(const std::string& path, const std::vector<uint32_t>& tokens, int64_t vocab_size) {
  ShardWriter w(path, vocab_size, static_cast<int64_t>(tokens.size()));
  w.append(tokens.data(), tokens.size());
  w.close();
}

TokenFile TokenFile::open(const std::string& path, int64_t vocab_size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TR_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);  // a folder opens too, but cannot map
  const size_t size = regular ? static_cast<size_t>(st.st_size) : 0;
  if (!regular || size == 0) ::close(fd);
  TR_CHECK(regular, "{}: not a regular file", path);
  TR_CHECK(size > 0, "{}: the token file is empty", path);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  TR_CHECK(p != MAP_FAILED, "{}: cannot map: {}", path, std::strerror(errno));
  TokenFile f;
  f.path_ = path;
  f.map_ = std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
  const auto* bytes = static_cast<const uint8_t*>(p);
  int32_t magic = 0;
  if (size >= 4) std::memcpy(&magic, bytes, 4);
  if (magic == kMagic16 || magic == kMagic32) {
    TR_CHECK(size >= static_cast<size_t>(kHeaderBytes), "{}: llm.c header truncated ({} bytes)", path, size);
    int32_t h[3];
    std::memcpy(h, bytes, 12);
    const bool wide = magic == kMagic32;
    TR_CHECK(h[1] == (wide ? 7 : 1), "{}: llm.c magic {} with version {} (expected {})", path, magic, h[1],
             wide ? 7 : 1);
    TR_CHECK(h[2] >= 0, "{}: negative token count {}", path, h[2]);
    const size_t want = static_cast<size_t>(kHeaderBytes) + static_cast<size_t>(h[2]) * (wide ? 4 : 2);
    TR_CHECK(size == want, "{}: header says {} tokens ({} bytes) but the file has {} bytes", path, h[2], want,
             size);
    f.llmc_ = true;
    f.wide_ = wide;
    f.n_ = h[2];
    if (wide)
      f.data32_ = reinterpret_cast<const uint32_t*>(bytes + kHeaderBytes);
    else
      f.data16_ = reinterpret_cast<const uint16_t*>(bytes + kHeaderBytes);
  } else {
    // nanoGPT: raw little-endian uint16, no header
    TR_CHECK(size % 2 == 0, "{}: not an llm.c shard (magic {}) and not raw uint16 (odd size {})", path, magic,
             size);
    f.n_ = static_cast<int64_t>(size / 2);
    f.data16_ = reinterpret_cast<const uint16_t*>(bytes);
  }
  TR_CHECK(f.n_ > 0, "{}: holds no tokens", path);
  if (vocab_size > 0) {
    for (int64_t i = 0; i < f.n_; ++i)
      TR_CHECK(f.at(i) < static_cast<uint64_t>(vocab_size), "{}: token {} at position {} is >= vocab size {}",
               path, f.at(i), i, vocab_size);
  }
  return f;
}

TokenStream::TokenStream(const std::vector<std::string>& paths, int64_t vocab_size) {
  TR_CHECK(!paths.empty(), "no token files given");
  for (const auto& p : paths) {
    files_.push_back(TokenFile::open(p, vocab_size));
    starts_.push_back(total_);
    total_ += files_.back().size();
  }
}

TokenStream::TokenStream(std::vector<uint32_t> tokens) : memory_(std::move(tokens)) {
  TR_CHECK(!memory_.empty(), "token stream: no tokens");
  total_ = static_cast<int64_t>(memory_.size());
}

TokenStream::TokenStream(std::shared_ptr<const TokenStream> base, int64_t begin, int64_t end)
    : base_(std::move(base)), offset_(begin), total_(end - begin) {
  TR_CHECK(base_ && begin >= 0 && begin < end && end <= base_->size(),
           "token stream: slice [{}, {}) outside {} tokens", begin, end, base_ ? base_->size() : 0);
}

void TokenStream::read(int64_t begin, int64_t n, int64_t* out) const {
  TR_CHECK(begin >= 0 && n >= 0 && begin + n <= total_, "token stream: range [{}, {}) outside {} tokens",
           begin, begin + n, total_);
  if (base_) return base_->read(offset_ + begin, n, out);
  if (!memory_.empty()) {
    for (int64_t k = 0; k < n; ++k) out[k] = memory_[static_cast<size_t>(begin + k)];
    return;
  }
  size_t f =
      static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1);
  int64_t i = begin - starts_[f];
  for (int64_t k = 0; k < n; ++k) {
    while (i >= files_[f].size()) {
      ++f;
      i = 0;
    }
    out[k] = files_[f].at(i++);
  }
}

}  // namespace tr::data
