// Token shards as other trainers write them: llm.c (256 x int32 header: magic 20240520 / version 1 with
// uint16 tokens, or magic 20240801 / version 7 with uint32 tokens; then the token count; then the tokens) and
// nanoGPT's raw uint16 .bin files. Read memory-mapped; validated on open (errors name the file).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tr::data {

// Writes an llm.c shard (uint16 when every id < 65536, else uint32) through a temp file and rename.
void write_llmc_shard(const std::string& path, const std::vector<uint32_t>& tokens, int64_t vocab_size);

// The same file written a piece at a time (bounded memory): the token count is known up front (the header
// comes first), append() adds tokens, close() checks the count and renames the temp file into place.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, int64_t vocab_size, int64_t tokens);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  void append(const uint32_t* tokens, size_t n);
  void close();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

class TokenFile {
 public:
  // llm.c shard (by magic) or raw uint16 nanoGPT file. vocab_size > 0 checks every id on open.
  static TokenFile open(const std::string& path, int64_t vocab_size = 0);
  const std::string& path() const { return path_; }
  int64_t size() const { return n_; }
  uint32_t at(int64_t i) const { return wide_ ? data32_[i] : data16_[i]; }
  bool llmc() const { return llmc_; }

 private:
  std::string path_;
  std::shared_ptr<void> map_;
  const uint16_t* data16_ = nullptr;
  const uint32_t* data32_ = nullptr;
  int64_t n_ = 0;
  bool wide_ = false, llmc_ = false;
};

// Several token files read as one stream.
class TokenStream {
 public:
  TokenStream(const std::vector<std::string>& paths, int64_t vocab_size = 0);
  // Tokens held in memory (small text inputs tokenized on the fly).
  explicit TokenStream(std::vector<uint32_t> tokens);
  // Tokens [begin, end) of `base` (a validation split without copying).
  TokenStream(std::shared_ptr<const TokenStream> base, int64_t begin, int64_t end);
  int64_t size() const { return total_; }
  // Copies tokens [begin, begin + n) into out (as int64 ids).
  void read(int64_t begin, int64_t n, int64_t* out) const;

 private:
  std::vector<TokenFile> files_;
  std::vector<uint32_t> memory_;
  std::vector<int64_t> starts_;
  std::shared_ptr<const TokenStream> base_;
  int64_t offset_ = 0;
  int64_t total_ = 0;
};

}  // namespace tr::data
