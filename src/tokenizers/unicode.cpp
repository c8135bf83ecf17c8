// UTF-8 helpers and ICU-backed normalization and character classes. ASCII takes fast paths throughout: it is
// invariant under every normal form, and most training text is mostly ASCII.
#include "tokenizers/unicode.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <vector>

#include "core/error.h"

namespace tr::tokenizers {

uint32_t utf8_decode(std::string_view s, size_t i, size_t* length) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = std::min(utf8_length(c), s.size() - i);
  *length = n;
  if (n == 1) return c;
  uint32_t cp = n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return i;
    uint32_t cp = n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view s) {
  if (first_invalid_utf8(s) == std::string_view::npos) return std::string(s);
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // Unicode's table 3-7: the range of the second byte depends on the first; later ones are 80..BF.
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      n = 2;
    else if (c == 0xE0)
      n = 3, lo = 0xA0;
    else if (c == 0xED)
      n = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF)
      n = 3;
    else if (c == 0xF0)
      n = 4, lo = 0x90;
    else if (c == 0xF4)
      n = 4, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3)
      n = 4;
    size_t k = 1;
    while (n && k < n && i + k < s.size()) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) break;
      ++k;
    }
    if (n && k == n) {
      out.append(s.substr(i, n));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += k;
  }
  return out;
}

namespace {

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

std::u16string to_utf16(std::string_view s) {
  std::u16string out(s.size(), u'\0');  // UTF-16 never needs more units than UTF-8 has bytes
  int32_t n = 0;
  UErrorCode st = U_ZERO_ERROR;
  u_strFromUTF8(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &n, s.data(),
                static_cast<int32_t>(s.size()), &st);
  TR_CHECK(U_SUCCESS(st), "tokenizer: ICU could not read UTF-8 ({})", u_errorName(st));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string to_utf8(const std::u16string& s) {
  std::string out(s.size() * 3, '\0');
  int32_t n = 0;
  UErrorCode st = U_ZERO_ERROR;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &n, reinterpret_cast<const UChar*>(s.data()),
              static_cast<int32_t>(s.size()), &st);
  TR_CHECK(U_SUCCESS(st), "tokenizer: ICU could not write UTF-8 ({})", u_errorName(st));
  out.resize(static_cast<size_t>(n));
  return out;
}

const UNormalizer2* normalizer(NormalForm form) {
  UErrorCode st = U_ZERO_ERROR;
  const UNormalizer2* n = form == NormalForm::nfc    ? unorm2_getNFCInstance(&st)
                          : form == NormalForm::nfd  ? unorm2_getNFDInstance(&st)
                          : form == NormalForm::nfkc ? unorm2_getNFKCInstance(&st)
                                                     : unorm2_getNFKDInstance(&st);
  TR_CHECK(U_SUCCESS(st) && n, "tokenizer: ICU normalizer unavailable ({})", u_errorName(st));
  return n;
}

}  // namespace

std::string normalize(std::string_view s, NormalForm form) {
  if (is_ascii(s)) return std::string(s);
  const std::u16string in = to_utf16(s);
  const UNormalizer2* n = normalizer(form);
  UErrorCode st = U_ZERO_ERROR;
  const int32_t len = static_cast<int32_t>(in.size());
  if (unorm2_isNormalized(n, reinterpret_cast<const UChar*>(in.data()), len, &st) && U_SUCCESS(st))
    return std::string(s);
  st = U_ZERO_ERROR;
  std::u16string out(in.size() * 4 + 16, u'\0');  // decompositions expand by at most a small factor
  int32_t got = unorm2_normalize(n, reinterpret_cast<const UChar*>(in.data()), len,
                                 reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &st);
  if (st == U_BUFFER_OVERFLOW_ERROR) {
    out.assign(static_cast<size_t>(got), u'\0');
    st = U_ZERO_ERROR;
    got = unorm2_normalize(n, reinterpret_cast<const UChar*>(in.data()), len,
                           reinterpret_cast<UChar*>(out.data()), got, &st);
  }
  TR_CHECK(U_SUCCESS(st), "tokenizer: ICU normalization failed ({})", u_errorName(st));
  out.resize(static_cast<size_t>(got));
  return to_utf8(out);
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
      ++i;
      continue;
    }
    size_t n = 0;
    const uint32_t cp = utf8_decode(s, i, &n);
    if (cp == 0x130) {  // the one unconditional multi-character lowercase mapping (SpecialCasing.txt)
      out += "i\xCC\x87";
    } else {
      append_utf8(out, static_cast<uint32_t>(u_tolower(static_cast<UChar32>(cp))));
    }
    i += n;
  }
  return out;
}

std::string strip_marks(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = 0;
    const uint32_t cp = utf8_decode(s, i, &n);
    if (!(U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_M_MASK)) out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

bool is_whitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return u_isUWhiteSpace(static_cast<UChar32>(cp));
}

bool is_numeric(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return U_GET_GC_MASK(static_cast<UChar32>(cp)) & (U_GC_ND_MASK | U_GC_NL_MASK | U_GC_NO_MASK);
}

bool is_punctuation(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
           (cp >= 0x7B && cp <= 0x7E);
  return U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_P_MASK;
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == '_';
  return U_GET_GC_MASK(static_cast<UChar32>(cp)) & (U_GC_L_MASK | U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK);
}

}  // namespace tr::tokenizers
