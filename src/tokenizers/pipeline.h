// The stages of a Hugging Face tokenizer around its model, read from tokenizer.json with HF's (Rust
// tokenizers') semantics: normalizers rewrite the text, pre-tokenizers cut it into pieces the model encodes
// one by one, decoders turn token strings back into text. Every type HF documents for BPE tokenizers is here;
// other types are refused by name when the file is read.
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/json_fields.h"

struct UBreakIterator;  // ICU's, opaque

namespace tr::tokenizers {

// Match state for one thread's encode call, shared by every stage it runs: PCRE2's (JIT stack, match data)
// and ICU's grapheme iterator for the Precompiled normalizer (opened on first use).
class MatchScratch {
 public:
  MatchScratch();
  ~MatchScratch();
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
  pcre2_match_data* data() const { return md_; }
  pcre2_match_context* context() const { return mc_; }
  UBreakIterator*& graphemes() { return graphemes_; }

 private:
  pcre2_match_data* md_;
  pcre2_match_context* mc_;
  pcre2_jit_stack* stack_;
  UBreakIterator* graphemes_ = nullptr;
};

struct Span {
  size_t begin, end;
  bool match;
};

// A compiled PCRE2 regex (UTF, Unicode properties, JIT).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Non-empty matches, left to right, non-overlapping.
  void find(std::string_view s, MatchScratch& scratch, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  pcre2_code* re_ = nullptr;
  std::string where_;
};

// HF's pattern: {"String": literal} or {"Regex": pattern}.
class Pattern {
 public:
  explicit Pattern(const JsonField& f);
  // Spans covering all of `s`: matches and the text between them (HF's find_matches).
  std::vector<Span> spans(std::string_view s, MatchScratch& scratch) const;
  // Every match replaced by `with`.
  std::string replace(std::string_view s, std::string_view with, MatchScratch& scratch) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

// A piece of text on its way to the model. byte_level: the ByteLevel pre-tokenizer has claimed it (its bytes
// stand for the GPT-2 alphabet's characters, mapped lazily). at_start: it starts the input text (Metaspace's
// prepend_scheme "first").
struct Piece {
  std::string text;
  bool byte_level = false;
  bool at_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string apply(std::string s, MatchScratch& scratch) const = 0;
};
// nullptr for a null normalizer.
std::unique_ptr<Normalizer> read_normalizer(const JsonField& f);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(std::vector<Piece>& pieces, MatchScratch& scratch) const = 0;
};
std::unique_ptr<PreTokenizer> read_pre_tokenizer(const JsonField& f);
// GPT-2's ByteLevel pre-tokenizer (for vocab.json + merges.txt tokenizers).
std::unique_ptr<PreTokenizer> gpt2_byte_level();

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};
std::unique_ptr<Decoder> read_decoder(const JsonField& f);

// GPT-2's byte -> printable-character map (as UTF-8) and the inverse (code point -> byte, -1 if none).
const std::vector<std::string>& byte_to_unicode();
int byte_of_unicode(uint32_t cp);
// A byte-level piece spelled in the GPT-2 alphabet.
std::string byte_level_spelling(std::string_view bytes);

}  // namespace tr::tokenizers
