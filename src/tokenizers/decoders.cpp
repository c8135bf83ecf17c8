// Decoders: token strings back to text (ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence),
// each as HF's Rust decode_chain does it.
#include "tokenizers/pipeline.h"
#include "tokenizers/unicode.h"

namespace tr::tokenizers {

namespace {

class ByteLevelDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        size_t n = 0;
        const int b = byte_of_unicode(utf8_decode(t, i, &n));
        if (b < 0) all = false;
        mapped += static_cast<char>(b);
        i += n;
      }
      bytes += all ? mapped : t;  // a token outside the alphabet (an added token) stands for itself
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

// "<0x41>" -> 0x41, or -1.
int fallback_byte(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t count = 0;
    auto flush = [&] {
      if (count == 0) return;
      if (first_invalid_utf8(pending) == std::string::npos) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < count; ++i) out.push_back("\xEF\xBF\xBD");
      }
      pending.clear();
      count = 0;
    };
    for (std::string& t : tokens) {
      const int b = fallback_byte(t);
      if (b >= 0) {
        pending += static_cast<char>(b);
        ++count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, all);
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t i = 0; i < start_ && t.compare(b, content_.size(), content_) == 0 && b < e; ++i)
        b += content_.size();
      for (size_t i = 0; i < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++i)
        e -= content_.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern p, std::string content) : pattern_(std::move(p)), content_(std::move(content)) {}
  void apply(std::vector<std::string>& tokens) const override {
    MatchScratch scratch;
    for (std::string& t : tokens) t = pattern_.replace(t, content_, scratch);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool prepend)
      : replacement_(std::move(replacement)), prepend_(prepend) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t at = 0; at < t.size();) {
        if (t.compare(at, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && prepend_)) out += ' ';  // HF drops every replacement of the first token
          at += replacement_.size();
        } else {
          out += t[at++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool prepend_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->apply(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> read_decoder(const JsonField& f) {
  if (!f.present()) return nullptr;
  const std::string type = f.object()["type"].one_of(
      {"Sequence", "ByteLevel", "ByteFallback", "Fuse", "Strip", "Replace", "Metaspace"});
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    f["decoders"].array().each_element([&](const JsonField& e) {
      if (auto d = read_decoder(e)) parts.push_back(std::move(d));
    });
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip")
    return std::make_unique<StripDecoder>(f["content"].string(),
                                          static_cast<size_t>(f["start"].integer(0, 1 << 20)),
                                          static_cast<size_t>(f["stop"].integer(0, 1 << 20)));
  if (type == "Replace")
    return std::make_unique<ReplaceDecoder>(Pattern(f["pattern"]), f["content"].string());
  bool prepend = f["add_prefix_space"].boolean_or(true);
  if (f["prepend_scheme"].present())
    prepend = f["prepend_scheme"].one_of({"always", "first", "never"}) != "never";
  return std::make_unique<MetaspaceDecoder>(f["replacement"].string(), prepend);
}

}  // namespace tr::tokenizers
