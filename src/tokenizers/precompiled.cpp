// SentencePiece's precompiled_charsmap read as Hugging Face's spm_precompiled reads it, and its Precompiled
// normalizer: graphemes (ICU's extended grapheme clusters) looked up whole when under 6 bytes, else per
// character. Speed is bound by the grapheme iterator; ASCII text, where every byte is a grapheme, skips it.
#include "tokenizers/precompiled.h"

#include <unicode/ubrk.h>
#include <unicode/utext.h>

#include <cstring>

#include "core/error.h"
#include "tokenizers/unicode.h"

namespace tr::tokenizers {
namespace {

// Darts-clone's unit layout.
bool has_leaf(uint32_t u) { return (u >> 8) & 1; }
uint32_t value_of(uint32_t u) { return u & ((1u << 31) - 1); }
uint32_t label_of(uint32_t u) { return u & ((1u << 31) | 0xFF); }
uint32_t offset_of(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

uint32_t read_u32(std::string_view b, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data() + at);
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// ICU's UTF-8 text over a view; the UTF-8 provider allocates, so it is closed on every path.
struct OpenText {
  UText t = UTEXT_INITIALIZER;
  OpenText(std::string_view s, UErrorCode& status) {
    utext_openUTF8(&t, s.data(), static_cast<int64_t>(s.size()), &status);
  }
  ~OpenText() { utext_close(&t); }
  OpenText(const OpenText&) = delete;
  OpenText& operator=(const OpenText&) = delete;
};

bool is_ascii(char c) { return static_cast<unsigned char>(c) < 0x80; }

}  // namespace

CharsMap::CharsMap(std::string_view blob, std::string where) : where_(std::move(where)) {
  TR_CHECK(blob.size() >= 4,
           "{} is {} bytes, too short for a SentencePiece charsmap (a 4-byte trie size first)", where_,
           blob.size());
  const uint32_t trie_bytes = read_u32(blob, 0);
  TR_CHECK(trie_bytes >= 4 && trie_bytes % 4 == 0 && trie_bytes <= blob.size() - 4,
           "{} says its trie is {} bytes, but it must be a positive multiple of 4 within the {} bytes that "
           "follow",
           where_, trie_bytes, blob.size() - 4);
  units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < units_.size(); ++i) units_[i] = read_u32(blob, 4 + 4 * i);
  normalized_.assign(blob.substr(4 + trie_bytes));
  const size_t bad = first_invalid_utf8(normalized_);
  TR_CHECK(bad == std::string_view::npos,
           "{}: its replacement strings are not valid UTF-8 (byte {} of the {} after the trie)", where_, bad,
           normalized_.size());
  for (int c = 0; c < 128; ++c) {
    const char ch = static_cast<char>(c);
    const auto m = first_match(std::string_view(&ch, 1));
    ascii_[c] = m ? int64_t{*m} : -1;
  }
}

uint32_t CharsMap::unit(size_t i) const {
  TR_CHECK(i < units_.size(), "{} is malformed: its trie points at unit {} of {}", where_, i, units_.size());
  return units_[i];
}

std::string_view CharsMap::replacement(uint32_t offset) const {
  TR_CHECK(offset <= normalized_.size() && (offset == normalized_.size() ||
                                            (static_cast<unsigned char>(normalized_[offset]) & 0xC0) != 0x80),
           "{} is malformed: a rule's replacement starts at byte {} of {}, not at a character", where_,
           offset, normalized_.size());
  const size_t end = normalized_.find('\0', offset);
  return std::string_view(normalized_)
      .substr(offset, (end == std::string::npos ? normalized_.size() : end) - offset);
}

void CharsMap::prefix_matches(std::string_view s,
                              std::vector<std::pair<size_t, std::string_view>>& out) const {
  out.clear();
  size_t node = offset_of(unit(0));
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == 0) break;  // Darts keys end at NUL
    node ^= c;
    const uint32_t u = unit(node);
    if (label_of(u) != c) return;
    node ^= offset_of(u);
    if (has_leaf(u)) out.emplace_back(i + 1, replacement(value_of(unit(node))));
  }
}

std::optional<uint32_t> CharsMap::first_match(std::string_view s) const {
  size_t node = offset_of(unit(0));
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == 0) break;
    node ^= c;
    const uint32_t u = unit(node);
    if (label_of(u) != c) return std::nullopt;
    node ^= offset_of(u);
    if (has_leaf(u)) {
      const uint32_t v = value_of(unit(node));
      replacement(v);  // checks it
      return v;
    }
  }
  return std::nullopt;
}

std::optional<std::string_view> CharsMap::transform(std::string_view s) const {
  if (const auto v = first_match(s)) return replacement(*v);
  return std::nullopt;
}

void CharsMap::append_grapheme(std::string_view g, std::string& out) const {
  if (g.size() < 6) {
    if (const auto r = transform(g)) {
      out += *r;
      return;
    }
  }
  for (size_t i = 0; i < g.size();) {
    const size_t n = std::min(utf8_length(static_cast<unsigned char>(g[i])), g.size() - i);
    const std::string_view part = g.substr(i, n);
    const auto r = transform(part);
    out += r ? *r : part;
    i += n;
  }
}

std::string CharsMap::normalize(std::string_view s, UBreakIterator*& graphemes) const {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const char c = s[i];
    // Two ASCII bytes always have a grapheme boundary between them, CR LF excepted (UAX #29 GB3).
    if (is_ascii(c) && (i + 1 == n || is_ascii(s[i + 1]))) {
      if (c == '\r' && i + 1 < n && s[i + 1] == '\n') {
        append_grapheme(s.substr(i, 2), out);
        i += 2;
      } else {
        const int64_t v = ascii_[static_cast<unsigned char>(c)];
        if (v >= 0)
          out += replacement(static_cast<uint32_t>(v));
        else
          out += c;
        ++i;
      }
      continue;
    }
    // The text up to the next boundary between two ASCII bytes goes through ICU's grapheme rules.
    size_t j = i + 1;
    while (j < n && !(is_ascii(s[j - 1]) && is_ascii(s[j]) && !(s[j - 1] == '\r' && s[j] == '\n'))) ++j;
    TR_CHECK(j - i < (size_t{1} << 31),
             "tokenizer: {} bytes of text without two ASCII bytes in a row: more "
             "than ICU's grapheme iterator indexes (2 GiB)",
             j - i);
    UErrorCode status = U_ZERO_ERROR;
    if (!graphemes) {
      graphemes = ubrk_open(UBRK_CHARACTER, "", nullptr, 0, &status);
      TR_CHECK(U_SUCCESS(status) && graphemes, "tokenizer: ICU grapheme iterator unavailable: {}",
               u_errorName(status));
    }
    OpenText text(s.substr(i, j - i), status);  // closed however the loop ends (a malformed map throws)
    ubrk_setUText(graphemes, &text.t, &status);
    TR_CHECK(U_SUCCESS(status), "tokenizer: ICU grapheme iterator failed: {}", u_errorName(status));
    int32_t begin = ubrk_first(graphemes);
    for (int32_t end = ubrk_next(graphemes); end != UBRK_DONE; begin = end, end = ubrk_next(graphemes))
      append_grapheme(s.substr(i + static_cast<size_t>(begin), static_cast<size_t>(end - begin)), out);
    i = j;
  }
  return out;
}

void close_graphemes(UBreakIterator* it) {
  if (it) ubrk_close(it);
}

}  // namespace tr::tokenizers
