// SentencePiece's precompiled_charsmap (the rewrite rules of nmt_nfkc and the like, as a Darts double-array
// trie over UTF-8 bytes) and the Precompiled normalizer of Hugging Face's tokenizers, which applies it
// grapheme by grapheme.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct UBreakIterator;

namespace tr::tokenizers {

// The blob: [u32 trie bytes][trie units, u32 each][replacement strings, each ended by '\0'], little-endian.
// A unit packs a label (byte), a has-leaf bit and an offset to its children; a leaf's unit holds the offset
// of its replacement string.
class CharsMap {
 public:
  // Throws tr::Error with `where` (the file and field) when the blob is not a charsmap.
  CharsMap(std::string_view blob, std::string where);

  // Every key that is a prefix of `s`, shortest first: (key length in bytes, replacement).
  void prefix_matches(std::string_view s, std::vector<std::pair<size_t, std::string_view>>& out) const;
  // HF's transform: the replacement of the shortest key that prefixes `s` (not necessarily all of it).
  std::optional<std::string_view> transform(std::string_view s) const;
  // HF's Precompiled::normalize_string: graphemes under 6 bytes are looked up whole; the others, and the
  // ones not found whole, character by character. `graphemes` is scratch (opened on first use).
  std::string normalize(std::string_view s, UBreakIterator*& graphemes) const;

  size_t rules_bytes() const { return units_.size() * 4 + normalized_.size(); }

 private:
  uint32_t unit(size_t i) const;
  std::string_view replacement(uint32_t offset) const;
  std::optional<uint32_t> first_match(std::string_view s) const;
  void append_grapheme(std::string_view g, std::string& out) const;

  std::vector<uint32_t> units_;
  std::string normalized_;
  std::string where_;
  // Each ASCII byte's lookup, done once: the offset of its replacement, or -1 (offsets, not views, so that
  // a moved map stays valid).
  int64_t ascii_[128];
};

// Closes a grapheme iterator made by CharsMap::normalize (null is fine).
void close_graphemes(UBreakIterator* it);

}  // namespace tr::tokenizers
