// Regex and literal patterns, the GPT-2 byte alphabet, and the normalizers (Sequence, Prepend, Replace, the
// four normal forms, Lowercase, Strip, StripAccents, Precompiled).
#include <algorithm>

#include "tokenizers/pipeline.h"
#include "tokenizers/precompiled.h"
#include "tokenizers/unicode.h"

namespace tr::tokenizers {

MatchScratch::MatchScratch()
    : md_(pcre2_match_data_create(1, nullptr)),  // group 0 is all we read, whatever the pattern
      mc_(pcre2_match_context_create(nullptr)),
      stack_(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
  TR_CHECK(md_ && mc_ && stack_, "tokenizer: out of memory for regex matching");
  pcre2_jit_stack_assign(mc_, nullptr, stack_);
}

MatchScratch::~MatchScratch() {
  close_graphemes(graphemes_);
  pcre2_jit_stack_free(stack_);
  pcre2_match_context_free(mc_);
  pcre2_match_data_free(md_);
}

Regex::Regex(const std::string& pattern, const std::string& where) : where_(where) {
  int err = 0;
  PCRE2_SIZE off = 0;
  re_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                      &err, &off, nullptr);
  if (!re_) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("{}: regex does not compile at offset {}: {}", where, off, reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(re_, PCRE2_JIT_COMPLETE);  // the interpreter runs it where JIT is unavailable
}

Regex::~Regex() { pcre2_code_free(re_); }

void Regex::find(std::string_view s, MatchScratch& scratch,
                 std::vector<std::pair<size_t, size_t>>& out) const {
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos < s.size()) {
    const int rc =
        pcre2_match(re_, subj, s.size(), pos, PCRE2_NO_UTF_CHECK, scratch.data(), scratch.context());
    if (rc == PCRE2_ERROR_NOMATCH) return;
    TR_CHECK(rc >= 0, "{}: regex matching failed with PCRE2 error {}", where_, rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data());
    if (ov[1] ==
        ov[0]) {  // an empty match cuts nothing (HF drops empty pieces): search on from the next character
      pos = ov[0] + utf8_length(static_cast<unsigned char>(s[std::min(ov[0], s.size() - 1)]));
      continue;
    }
    out.emplace_back(ov[0], ov[1]);
    pos = ov[1];
  }
}

Pattern::Pattern(const JsonField& f) {
  f.object();
  if (f["String"].present()) {
    literal_ = f["String"].string();
    if (literal_.empty()) f["String"].fail("is empty (an empty pattern matches nothing useful)");
  } else if (f["Regex"].present()) {
    regex_ = std::make_unique<Regex>(f["Regex"].string(), f.file() + ": field '" + f["Regex"].path() + "'");
  } else {
    f.fail_expected("{\"String\": ...} or {\"Regex\": ...}");
  }
}

std::vector<Span> Pattern::spans(std::string_view s, MatchScratch& scratch) const {
  std::vector<std::pair<size_t, size_t>> hits;
  if (regex_) {
    regex_->find(s, scratch, hits);
  } else {
    for (size_t at = s.find(literal_); at != std::string_view::npos;
         at = s.find(literal_, at + literal_.size()))
      hits.emplace_back(at, at + literal_.size());
  }
  std::vector<Span> out;
  out.reserve(hits.size() * 2 + 1);
  size_t prev = 0;
  for (auto [b, e] : hits) {
    if (b > prev) out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
  }
  if (prev < s.size() || s.empty()) out.push_back({prev, s.size(), false});
  return out;
}

std::string Pattern::replace(std::string_view s, std::string_view with, MatchScratch& scratch) const {
  std::string out;
  out.reserve(s.size());
  for (const Span& sp : spans(s, scratch)) {
    if (sp.match) {
      out += with;
    } else {
      out += s.substr(sp.begin, sp.end - sp.begin);
    }
  }
  return out;
}

const std::vector<std::string>& byte_to_unicode() {
  static const std::vector<std::string> table = [] {
    std::vector<bool> printable(256, false);
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    std::vector<std::string> t(256);
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) append_utf8(t[b], printable[b] ? static_cast<uint32_t>(b) : 256 + n++);
    return t;
  }();
  return table;
}

int byte_of_unicode(uint32_t cp) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(324, -1);  // the alphabet's code points are below 256 + 68
    const auto& t = byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      size_t n = 0;
      inv[utf8_decode(t[b], 0, &n)] = b;
    }
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

std::string byte_level_spelling(std::string_view bytes) {
  const auto& t = byte_to_unicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += t[static_cast<unsigned char>(c)];
  return out;
}

namespace {

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  std::string apply(std::string s, MatchScratch& scratch) const override {
    for (const auto& p : parts_) s = p->apply(std::move(s), scratch);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string apply(std::string s, MatchScratch&) const override { return s.empty() ? s : prefix_ + s; }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string apply(std::string s, MatchScratch& scratch) const override {
    return pattern_.replace(s, content_, scratch);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class FormNormalizer : public Normalizer {
 public:
  explicit FormNormalizer(NormalForm form) : form_(form) {}
  std::string apply(std::string s, MatchScratch&) const override { return normalize(s, form_); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  std::string apply(std::string s, MatchScratch&) const override { return lowercase(s); }
};

class StripAccentsNormalizer : public Normalizer {
 public:
  std::string apply(std::string s, MatchScratch&) const override { return strip_marks(s); }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string apply(std::string s, MatchScratch&) const override {
    size_t b = 0, e = s.size();
    while (left_ && b < e) {
      size_t n = 0;
      if (!is_whitespace(utf8_decode(s, b, &n))) break;
      b += n;
    }
    while (right_ && e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t n = 0;
      if (!is_whitespace(utf8_decode(s, start, &n))) break;
      e = start;
    }
    return s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class PrecompiledNormalizer : public Normalizer {
 public:
  explicit PrecompiledNormalizer(CharsMap map) : map_(std::move(map)) {}
  std::string apply(std::string s, MatchScratch& scratch) const override {
    return map_.normalize(s, scratch.graphemes());
  }

 private:
  CharsMap map_;
};

// Standard base64 with its '=' padding, as HF reads the charsmap; anything else names the field.
std::string base64_decode(const JsonField& f) {
  const std::string in = f.string_or("");
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  size_t data = in.size();
  while (data > 0 && in.size() - data < 2 && in[data - 1] == '=') --data;
  if (in.size() % 4 != 0)
    f.fail("is not base64: its {} characters are not whole groups of 4 with '=' padding", in.size());
  std::string out;
  out.reserve(data / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < data; ++i) {
    const int v = value(in[i]);
    if (v < 0) f.fail("is not base64: character {} is {:?}", i, std::string(1, in[i]));
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  if ((acc & ((1u << bits) - 1)) != 0)  // as HF's decoder: padding bits must be zero
    f.fail("is not base64: the bits before its '=' padding are not zero");
  return out;
}

}  // namespace

std::unique_ptr<Normalizer> read_normalizer(const JsonField& f) {
  if (!f.present()) return nullptr;
  const std::string type =
      f.object()["type"].one_of({"Sequence", "Prepend", "Replace", "NFC", "NFD", "NFKC", "NFKD", "Lowercase",
                                 "Strip", "StripAccents", "Precompiled"});
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    f["normalizers"].array().each_element([&](const JsonField& e) {
      if (auto n = read_normalizer(e)) parts.push_back(std::move(n));
    });
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(f["prepend"].string());
  if (type == "Replace")
    return std::make_unique<ReplaceNormalizer>(Pattern(f["pattern"]), f["content"].string());
  if (type == "NFC") return std::make_unique<FormNormalizer>(NormalForm::nfc);
  if (type == "NFD") return std::make_unique<FormNormalizer>(NormalForm::nfd);
  if (type == "NFKC") return std::make_unique<FormNormalizer>(NormalForm::nfkc);
  if (type == "NFKD") return std::make_unique<FormNormalizer>(NormalForm::nfkd);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip")
    return std::make_unique<StripNormalizer>(f["strip_left"].boolean_or(true),
                                             f["strip_right"].boolean_or(true));
  if (type == "Precompiled") {
    // An empty map changes nothing (HF's converters write none then; we accept it).
    const JsonField map = f["precompiled_charsmap"];
    const std::string blob = base64_decode(map);
    if (!blob.empty())
      return std::make_unique<PrecompiledNormalizer>(
          CharsMap(blob, fmt::format("{}: field '{}'", map.file(), map.path())));
  }
  return nullptr;
}

}  // namespace tr::tokenizers
