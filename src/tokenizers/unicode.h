// Unicode for the tokenizers: UTF-8 walking and checking, normalization forms and lowercasing (ICU), and the
// character classes Hugging Face's Rust tokenizers test with (char::is_whitespace, is_numeric, punctuation).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace tr::tokenizers {

// Byte length of the UTF-8 character starting with byte `c` (1 for a stray continuation byte).
inline size_t utf8_length(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }
// The code point at s[i] (valid UTF-8 assumed) and its byte length.
uint32_t utf8_decode(std::string_view s, size_t i, size_t* length);
void append_utf8(std::string& s, uint32_t cp);
// The offset of the first byte that is not valid UTF-8 (overlong forms and surrogates included), or npos.
size_t first_invalid_utf8(std::string_view s);

enum class NormalForm { nfc, nfd, nfkc, nfkd };
std::string normalize(std::string_view s, NormalForm form);
// Rust's char::to_lowercase per character (no context: a final sigma stays sigma, as in HF's Lowercase).
std::string lowercase(std::string_view s);
// Removes combining marks (general category M), as HF's StripAccents does after NFD.
std::string strip_marks(std::string_view s);

bool is_whitespace(uint32_t cp);   // White_Space property (Rust char::is_whitespace)
bool is_numeric(uint32_t cp);      // Nd, Nl, No (Rust char::is_numeric)
bool is_punctuation(uint32_t cp);  // ASCII punctuation or P* (HF's is_punc)
bool is_word_char(uint32_t cp);    // Oniguruma's Unicode \w: L, M, Nd, Pc

}  // namespace tr::tokenizers

namespace tr::tokenizers {
// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view s);
}  // namespace tr::tokenizers
