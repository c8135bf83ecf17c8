// The Precompiled normalizer against SentencePiece itself (Debian's spm_train makes the nmt_nfkc charsmap,
// spm_normalize applies it): every code point, and tricky.txt and Moby-Dick line by line through a
// longest-match walk of our trie; then Hugging Face's grapheme rule where it departs from SentencePiece, the
// normalizer inside a Llama 2 tokenizer.json, and malformed maps.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizers/pipeline.h"
#include "tokenizers/precompiled.h"
#include "tokenizers/tokenizer.h"
#include "tokenizers/unicode.h"

namespace tr::tokenizers {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kSrc = TRAINER_SOURCE_DIR;

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// Protobuf wire format, enough to take ModelProto.normalizer_spec (3).precompiled_charsmap (2).
uint64_t varint(const std::string& b, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0; i < b.size(); shift += 7) {
    const auto c = static_cast<unsigned char>(b[i++]);
    v |= uint64_t{c & 0x7Fu} << shift;
    if (c < 0x80) break;
  }
  return v;
}

std::string proto_bytes_field(const std::string& msg, uint64_t field) {
  for (size_t i = 0; i < msg.size();) {
    const uint64_t key = varint(msg, i);
    const uint64_t wire = key & 7;
    if (wire == 0) {
      varint(msg, i);
    } else if (wire == 1 || wire == 5) {
      i += wire == 1 ? 8 : 4;
    } else if (wire == 2) {
      const size_t n = varint(msg, i);
      if (key >> 3 == field) return msg.substr(i, n);
      i += n;
    } else {
      break;
    }
  }
  return {};
}

std::string base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    if (i + 2 < in.size()) v |= static_cast<unsigned char>(in[i + 2]);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += i + 1 < in.size() ? k[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? k[v & 63] : '=';
  }
  return out;
}

// A SentencePiece model trained on tricky.txt (char model: 0.1 s), with the default nmt_nfkc rules or a TSV.
struct SpmModel {
  fs::path model;
  std::string charsmap;
};

SpmModel train_spm(const std::string& name, const std::string& rules_tsv = "") {
  const fs::path dir = fs::temp_directory_path() / ("trainer_precompiled_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string cmd = "cd " + dir.string() + " && spm_train --input=" + kSrc +
                    "/tests/data/tricky.txt --model_prefix=" + name +
                    " --vocab_size=100 --model_type=char --minloglevel=2";
  if (!rules_tsv.empty()) {
    spit(dir / (name + ".tsv"), rules_tsv);
    cmd += " --normalization_rule_tsv=" + name + ".tsv";
  }
  cmd += " > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0)
      << "spm_train (Debian's sentencepiece; scripts/setup.sh installs it): " << cmd;
  SpmModel m{dir / (name + ".model"), {}};
  m.charsmap = proto_bytes_field(proto_bytes_field(slurp(m.model), 3), 2);
  return m;
}

const SpmModel& nmt_nfkc() {
  static const SpmModel m = train_spm("nmt_nfkc");
  return m;
}

// spm_normalize line by line, whitespace kept.
std::vector<std::string> spm_normalize(const SpmModel& m, const std::vector<std::string>& lines) {
  const fs::path in = m.model.parent_path() / "lines.txt", out = m.model.parent_path() / "lines.out";
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  spit(in, text);
  EXPECT_EQ(std::system(("spm_normalize --model " + m.model.string() + " --remove_extra_whitespaces=false " +
                         in.string() + " > " + out.string())
                            .c_str()),
            0);
  std::vector<std::string> got;
  std::istringstream ss(slurp(out));
  for (std::string l; std::getline(ss, l);) got.push_back(l);
  return got;
}

// SentencePiece's own walk: the longest key at each position, else one character as it is.
std::string longest_match(const CharsMap& map, std::string_view s) {
  std::string out;
  std::vector<std::pair<size_t, std::string_view>> m;
  for (size_t i = 0; i < s.size();) {
    map.prefix_matches(s.substr(i), m);
    if (!m.empty()) {
      out += m.back().second;
      i += m.back().first;
    } else {
      const size_t n = utf8_length(static_cast<unsigned char>(s[i]));
      out += s.substr(i, n);
      i += n;
    }
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream ss(text);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  return lines;
}

std::string hf(const CharsMap& map, std::string_view s) {
  UBreakIterator* it = nullptr;
  std::string out = map.normalize(s, it);
  close_graphemes(it);
  return out;
}

class Precompiled : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(nmt_nfkc().charsmap.empty()) << "no charsmap in " << nmt_nfkc().model;
  }
  static const CharsMap& map() {
    static const CharsMap m(nmt_nfkc().charsmap, "nmt_nfkc");
    return m;
  }
};

TEST_F(Precompiled, EveryCodePointAsSentencePieceMapsIt) {
  std::vector<std::string> cps;
  for (uint32_t cp = 1; cp < 0x110000; ++cp) {
    if ((cp >= 0xD800 && cp < 0xE000) || cp == '\n' || cp == '\r') continue;
    std::string s;
    append_utf8(s, cp);
    cps.push_back(s);
  }
  const auto want = spm_normalize(nmt_nfkc(), cps);
  ASSERT_EQ(want.size(), cps.size());
  size_t changed = 0, bad = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    // One code point is one grapheme, whose only possible key is itself: HF's rule and SentencePiece's
    // agree on it. The whole normalizer runs on every 16th (ICU per call is the slow part).
    const auto r = map().transform(cps[i]);
    const std::string ours = r ? std::string(*r) : cps[i];
    if (i % 16 == 0) {
      EXPECT_EQ(hf(map(), cps[i]), ours) << i;
    }
    changed += ours != cps[i];
    if (ours != want[i] && ++bad <= 5)
      ADD_FAILURE() << "code point " << i << ": " << ours << " vs " << want[i];
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(changed, 4000u);  // NFKC and nmt's extras rewrite thousands of code points
  std::printf("nmt_nfkc charsmap: %zu bytes, %zu of %zu code points rewritten\n", nmt_nfkc().charsmap.size(),
              changed, cps.size());
}

TEST_F(Precompiled, TrieWalkEqualsSentencePieceOnTextsLineByLine) {
  for (const std::string& file :
       {kSrc + "/tests/data/tricky.txt", kSrc + "/data/moby-dick/package/data/data.txt"}) {
    const auto lines = lines_of(slurp(file));
    const auto want = spm_normalize(nmt_nfkc(), lines);
    ASSERT_EQ(want.size(), lines.size()) << file;
    size_t bad = 0;
    for (size_t i = 0; i < lines.size(); ++i)
      if (longest_match(map(), lines[i]) != want[i] && ++bad <= 3)
        ADD_FAILURE() << file << ":" << i + 1 << ": " << longest_match(map(), lines[i]) << " vs " << want[i];
    EXPECT_EQ(bad, 0u) << file;
  }
}

// HF looks graphemes under 6 bytes up whole and takes the shortest key that prefixes them, so its output
// departs from SentencePiece's longest match in these cases; we follow HF (the model was trained on it).
TEST_F(Precompiled, HuggingFacesGraphemeRule) {
  struct Case {
    const char *text, *hf, *spm;
  } cases[] = {
      {"\xEF\xBD\xB6\xEF\xBE\x9E", "\xE3\x82\xAB\xE3\x82\x99", "\xE3\x82\xAC"},  // ｶﾞ: 6 bytes, per character
      {"\r\n", " ", "  "},                                                       // one grapheme, key "\r"
      {"\xEF\xAC\x81\xCC\x81", "fi", "fi\xCC\x81"},  // ﬁ + U+0301: 5 bytes, the accent goes with the key "ﬁ"
      {"\xD8\xA7\xD9\x93", "\xD8\xA2", "\xD8\xA2"},    // ا + U+0653 -> آ, the same in both
      {"a\xEF\xBC\xA1 \xE2\x91\xA0", "aA 1", "aA 1"},  // fullwidth A, circled one
  };
  for (const Case& c : cases) {
    EXPECT_EQ(hf(map(), c.text), c.hf) << c.text;
    EXPECT_EQ(longest_match(map(), c.text), c.spm) << c.text;
  }
  // spm_normalize agrees with the longest-match column (it reads lines, so "\r\n" is left out).
  EXPECT_EQ(spm_normalize(nmt_nfkc(), {cases[0].text, cases[2].text}),
            (std::vector<std::string>{cases[0].spm, cases[2].spm}));
  // Transformed text equals per-grapheme lookups on text with no departures (Thai, Devanagari, Hangul,
  // emoji).
  const std::string mixed =
      "เขาไม่ได้พูดสักคำ ड़ी दुख 한국어 👩‍👩‍👧 "
      "Ｈｅｌｌｏ";
  EXPECT_EQ(hf(map(), mixed), longest_match(map(), mixed));
  EXPECT_NE(hf(map(), mixed), mixed);
}

// A charsmap compiled from three rules shows both walks: keys "A" and "AB".
TEST(PrecompiledRules, ShortestKeyPerGraphemeLongestKeyInSentencePiece) {
  const SpmModel m = train_spm("rules", "41\t61\n41 42\t78 79 7A\nFF76 FF9E\t30AC\n");
  const CharsMap map(m.charsmap, "rules");
  EXPECT_EQ(map.transform("AB"), std::optional<std::string_view>("a"));
  EXPECT_EQ(map.transform("B"), std::nullopt);
  EXPECT_EQ(hf(map, "ABA"), "aBa");  // three graphemes
  EXPECT_EQ(longest_match(map, "ABA"), "xyza");
  EXPECT_EQ(spm_normalize(m, {"ABA"}), std::vector<std::string>{"xyza"});
  EXPECT_EQ(hf(map, "\xEF\xBD\xB6\xEF\xBE\x9E"), "\xEF\xBD\xB6\xEF\xBE\x9E");  // no key for either alone
}

json llama2_with(const json& normalizer) {
  json t = json::parse(slurp(kSrc + "/data/tokenizer-llama2/package/models/tokenizer.json"));
  t["normalizer"] = normalizer;
  return t;
}

TEST_F(Precompiled, InsideATokenizerJson) {
  // HF's SpmConverter writes Precompiled first; Llama 2's Prepend + Replace follow it here.
  json t =
      llama2_with({{"type", "Sequence"},
                   {"normalizers",
                    {{{"type", "Precompiled"}, {"precompiled_charsmap", base64(nmt_nfkc().charsmap)}},
                     {{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                     {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}});
  const fs::path dir = nmt_nfkc().model.parent_path() / "llama2_nfkc";
  fs::create_directories(dir);
  spit(dir / "tokenizer.json", t.dump());
  const Tokenizer ours = Tokenizer::from_pretrained(dir.string());
  const Tokenizer plain =
      Tokenizer::from_pretrained(kSrc + "/data/tokenizer-llama2/package/models/tokenizer.json");
  const std::string fullwidth =
      "\xEF\xBC\xA8\xEF\xBD\x85\xEF\xBD\x8C\xEF\xBD\x8C\xEF\xBD\x8F world \xEF\xAC\x81";
  EXPECT_EQ(ours.encode_ordinary(fullwidth), plain.encode_ordinary("Hello world fi"));
  EXPECT_NE(plain.encode_ordinary(fullwidth), plain.encode_ordinary("Hello world fi"));

  // Speed on Moby-Dick (ASCII fast path) and on tricky.txt (mostly through ICU's grapheme iterator).
  for (const std::string& file :
       {kSrc + "/data/moby-dick/package/data/data.txt", kSrc + "/tests/data/tricky.txt"}) {
    std::string text = slurp(file);
    while (text.size() < (1u << 20)) text += text;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string out = hf(map(), text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("Precompiled nmt_nfkc on %s x%zu: %.1f MB/s\n", fs::path(file).filename().c_str(),
                text.size() / slurp(file).size(), text.size() / s / 1e6);
    EXPECT_FALSE(out.empty());
  }
}

TEST(PrecompiledRules, MalformedMapsAreNamed) {
  auto read = [](const json& field) {
    const json spec = {{"type", "Precompiled"}, {"precompiled_charsmap", field}};
    auto n = read_normalizer(JsonField(spec, "tokenizer.json"));
    MatchScratch scratch;
    return n ? n->apply("Hello \xEF\xBC\xA1", scratch) : std::string("(none)");
  };
  auto message = [&](const json& field) {
    try {
      read(field);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(read(""), "(none)");  // an empty map changes nothing
  EXPECT_NE(message("AAAA").find("too short"), std::string::npos) << message("AAAA");
  EXPECT_NE(message("AA!A").find("not base64"), std::string::npos);
  EXPECT_NE(message("AAA").find("not base64"), std::string::npos);
  EXPECT_NE(message("AAAB").find("too short"), std::string::npos);             // 3 bytes, canonical
  EXPECT_NE(message("AAB=").find("padding are not zero"), std::string::npos);  // HF refuses it too
  // A trie size past the end, a size not a multiple of 4.
  EXPECT_NE(message(base64(std::string("\x40\0\0\0", 4) + std::string(8, '\0'))).find("multiple of 4 within"),
            std::string::npos);
  EXPECT_NE(message(base64(std::string("\x06\0\0\0", 4) + std::string(8, '\0'))).find("multiple of 4"),
            std::string::npos);
  // Replacement strings that are not UTF-8.
  EXPECT_NE(message(base64(std::string("\x04\0\0\0\0\0\0\0\xFF", 9))).find("not valid UTF-8"),
            std::string::npos);
  // Units that point outside the trie fail on use with the field's name, never read past it.
  const std::string wild = std::string("\x04\0\0\0", 4) + std::string("\xFF\xFF\xFF\x7F", 4);
  EXPECT_NE(message(base64(wild)).find("tokenizer.json: field 'precompiled_charsmap' is malformed"),
            std::string::npos)
      << message(base64(wild));
  // Every prefix of a real map and every flipped byte of the small one: an error or a result, never a crash.
  const SpmModel m = train_spm("rules_fuzz", "41\t61\n41 42\t78 79 7A\n");
  for (size_t cut = 0; cut < m.charsmap.size(); cut += 7) (void)message(base64(m.charsmap.substr(0, cut)));
  for (size_t i = 0; i < m.charsmap.size(); ++i) {
    std::string b = m.charsmap;
    b[i] = static_cast<char>(b[i] ^ 0x5A);
    (void)message(base64(b));
  }
}

}  // namespace
}  // namespace tr::tokenizers
