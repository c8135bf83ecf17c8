// Pre-tokenizers with HF's split semantics: Split (five behaviors, invert), ByteLevel, Metaspace, Digits,
// Punctuation, Whitespace, WhitespaceSplit and Sequence. Empty pieces are dropped, as HF drops them.
#include <functional>

#include "tokenizers/pipeline.h"
#include "tokenizers/unicode.h"

namespace tr::tokenizers {

namespace {

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };

Behavior read_behavior(const JsonField& f) {
  const std::string b =
      f.one_of({"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"});
  return b == "Isolated"             ? Behavior::isolated
         : b == "Removed"            ? Behavior::removed
         : b == "MergedWithPrevious" ? Behavior::merged_with_previous
         : b == "MergedWithNext"     ? Behavior::merged_with_next
                                     : Behavior::contiguous;
}

// HF's NormalizedString::split: which spans survive, merged as the behavior says.
std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<Span>& spans, Behavior b) {
  std::vector<std::pair<size_t, size_t>> out;
  bool prev_match = false;
  switch (b) {
    case Behavior::isolated:
      for (const Span& s : spans) out.emplace_back(s.begin, s.end);
      break;
    case Behavior::removed:
      for (const Span& s : spans)
        if (!s.match) out.emplace_back(s.begin, s.end);
      break;
    case Behavior::contiguous:            // runs of equal kind joined
    case Behavior::merged_with_previous:  // a match joined to what precedes it
      for (const Span& s : spans) {
        const bool join = b == Behavior::contiguous ? s.match == prev_match : s.match && !prev_match;
        if (join && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        prev_match = s.match;
      }
      break;
    case Behavior::merged_with_next:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev_match && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.emplace_back(it->begin, it->end);
        }
        prev_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

// A byte-level piece seen by a later pre-tokenizer is spelled out in the GPT-2 alphabet first, as HF has
// already mapped it by then.
void materialize(Piece& p) {
  if (!p.byte_level) return;
  p.text = byte_level_spelling(p.text);
  p.byte_level = false;
}

// Replaces each piece by its surviving spans.
void split_pieces(std::vector<Piece>& pieces, const std::function<std::vector<Span>(std::string_view)>& find,
                  Behavior behavior) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& p : pieces) {
    materialize(p);
    for (auto [b, e] : apply_behavior(find(p.text), behavior))
      if (e > b) out.push_back({p.text.substr(b, e - b), false, p.at_start && b == 0});
  }
  pieces = std::move(out);
}

// Each character for which `pred` holds is a match of its own (HF's Pattern for Fn(char) -> bool).
std::vector<Span> char_spans(std::string_view s, bool (*pred)(uint32_t)) {
  std::vector<Span> out;
  size_t last = 0;
  for (size_t i = 0; i < s.size();) {
    size_t n = 0;
    const uint32_t cp = utf8_decode(s, i, &n);
    if (pred(cp)) {
      if (last < i) out.push_back({last, i, false});
      out.push_back({i, i + n, true});
      last = i + n;
    }
    i += n;
  }
  if (last < s.size() || s.empty()) out.push_back({last, s.size(), false});
  return out;
}

std::vector<Span> inverted(std::vector<Span> spans) {
  for (Span& s : spans) s.match = !s.match;
  return spans;
}

class SplitPre : public PreTokenizer {
 public:
  SplitPre(Pattern p, Behavior b, bool invert) : pattern_(std::move(p)), behavior_(b), invert_(invert) {}
  void apply(std::vector<Piece>& pieces, MatchScratch& scratch) const override {
    split_pieces(
        pieces,
        [&](std::string_view s) {
          return invert_ ? inverted(pattern_.spans(s, scratch)) : pattern_.spans(s, scratch);
        },
        behavior_);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class RegexPre : public PreTokenizer {  // Whitespace: the runs of \w and of other non-space characters
 public:
  RegexPre(const char* pattern, bool invert, Behavior b)
      : regex_(pattern, "pre-tokenizer"), invert_(invert), behavior_(b) {}
  void apply(std::vector<Piece>& pieces, MatchScratch& scratch) const override {
    split_pieces(
        pieces,
        [&](std::string_view s) {
          std::vector<std::pair<size_t, size_t>> hits;
          regex_.find(s, scratch, hits);
          std::vector<Span> spans;
          size_t prev = 0;
          for (auto [b, e] : hits) {
            if (b > prev) spans.push_back({prev, b, invert_});
            spans.push_back({b, e, !invert_});
            prev = e;
          }
          if (prev < s.size()) spans.push_back({prev, s.size(), invert_});
          return spans;
        },
        behavior_);
  }

 private:
  Regex regex_;
  bool invert_;
  Behavior behavior_;
};

class CharClassPre : public PreTokenizer {  // Digits, Punctuation, WhitespaceSplit
 public:
  CharClassPre(bool (*pred)(uint32_t), Behavior b) : pred_(pred), behavior_(b) {}
  void apply(std::vector<Piece>& pieces, MatchScratch&) const override {
    split_pieces(
        pieces, [&](std::string_view s) { return char_spans(s, pred_); }, behavior_);
  }

 private:
  bool (*pred_)(uint32_t);
  Behavior behavior_;
};

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        regex_(use_regex ? std::make_unique<Regex>(kGpt2Pattern, "ByteLevel") : nullptr) {}
  void apply(std::vector<Piece>& pieces, MatchScratch& scratch) const override {
    std::vector<Piece> out;
    std::vector<std::pair<size_t, size_t>> hits;
    for (Piece& p : pieces) {
      materialize(p);
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, 1, ' ');
      if (!regex_) {
        out.push_back({std::move(p.text), true, p.at_start});
        continue;
      }
      hits.clear();
      regex_->find(p.text, scratch, hits);
      size_t prev = 0;
      auto emit = [&](size_t b, size_t e) {
        out.push_back({p.text.substr(b, e - b), true, p.at_start && b == 0});
      };
      for (auto [b, e] : hits) {
        if (b > prev) emit(prev, b);
        emit(b, e);
        prev = e;
      }
      if (prev < p.text.size()) emit(prev, p.text.size());
    }
    pieces = std::move(out);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class MetaspacePre : public PreTokenizer {
 public:
  enum class Prepend { always, first, never };
  MetaspacePre(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}
  void apply(std::vector<Piece>& pieces, MatchScratch&) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      materialize(p);
      std::string s;
      s.reserve(p.text.size() + replacement_.size());
      for (char c : p.text) {
        if (c == ' ') {
          s += replacement_;
        } else {
          s += c;
        }
      }
      const bool starts = s.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_ == Prepend::always || (prepend_ == Prepend::first && p.at_start)))
        s.insert(0, replacement_);
      if (!split_) {
        if (!s.empty()) out.push_back({std::move(s), false, p.at_start});
        continue;
      }
      // split on the replacement, each occurrence merged with what follows it
      size_t b = 0;
      for (size_t at = s.find(replacement_, 1); at != std::string::npos;
           at = s.find(replacement_, at + replacement_.size())) {
        if (at > b) out.push_back({s.substr(b, at - b), false, p.at_start && b == 0});
        b = at;
      }
      if (b < s.size()) out.push_back({s.substr(b), false, p.at_start && b == 0});
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

class SequencePre : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<Piece>& pieces, MatchScratch& scratch) const override {
    for (const auto& p : parts_) p->apply(pieces, scratch);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

// One character of a JSON string (Metaspace's replacement).
std::string one_char(const JsonField& f) {
  const std::string s = f.string();
  size_t n = 0;
  if (s.empty() || first_invalid_utf8(s) != std::string::npos || (utf8_decode(s, 0, &n), n != s.size()))
    f.fail("must be a single character, got {}", describe_json(f.raw()));
  return s;
}

}  // namespace

std::unique_ptr<PreTokenizer> gpt2_byte_level() { return std::make_unique<ByteLevelPre>(false, true); }

std::unique_ptr<PreTokenizer> read_pre_tokenizer(const JsonField& f) {
  if (!f.present()) return nullptr;
  const std::string type = f.object()["type"].one_of({"Sequence", "Split", "ByteLevel", "Metaspace", "Digits",
                                                      "Punctuation", "Whitespace", "WhitespaceSplit"});
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    f["pretokenizers"].array().each_element([&](const JsonField& e) {
      if (auto p = read_pre_tokenizer(e)) parts.push_back(std::move(p));
    });
    return std::make_unique<SequencePre>(std::move(parts));
  }
  if (type == "Split")
    return std::make_unique<SplitPre>(Pattern(f["pattern"]), read_behavior(f["behavior"]),
                                      f["invert"].boolean_or(false));
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPre>(f["add_prefix_space"].boolean_or(true),
                                          f["use_regex"].boolean_or(true));
  if (type == "Metaspace") {
    auto prepend = MetaspacePre::Prepend::always;
    if (f["prepend_scheme"].present()) {
      const std::string s = f["prepend_scheme"].one_of({"always", "first", "never"});
      prepend = s == "always"  ? MetaspacePre::Prepend::always
                : s == "first" ? MetaspacePre::Prepend::first
                               : MetaspacePre::Prepend::never;
    } else if (!f["add_prefix_space"].boolean_or(true)) {  // files older than prepend_scheme
      prepend = MetaspacePre::Prepend::never;
    }
    return std::make_unique<MetaspacePre>(one_char(f["replacement"]), prepend, f["split"].boolean_or(true));
  }
  if (type == "Digits")
    return std::make_unique<CharClassPre>(
        is_numeric, f["individual_digits"].boolean_or(false) ? Behavior::isolated : Behavior::contiguous);
  if (type == "Punctuation")
    return std::make_unique<CharClassPre>(
        is_punctuation, f["behavior"].present() ? read_behavior(f["behavior"]) : Behavior::isolated);
  if (type == "WhitespaceSplit") return std::make_unique<CharClassPre>(is_whitespace, Behavior::removed);
  // Whitespace; Oniguruma's \w spelled out (PCRE2's \w lacks marks)
  return std::make_unique<RegexPre>(R"([\p{L}\p{M}\p{Nd}\p{Pc}]+|[^\p{L}\p{M}\p{Nd}\p{Pc}\s]+)", true,
                                    Behavior::removed);
}

}  // namespace tr::tokenizers
