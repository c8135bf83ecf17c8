// Tokenizer stages against the behaviour HF's Rust tokenizers document and test: every Split behavior and
// invert, Digits, Punctuation, Whitespace(Split), Metaspace's prepend schemes, ByteLevel, the normalizers and
// decoders; then a small SentencePiece-style BPE (byte_fallback, unk and fuse_unk, added tokens with lstrip /
// rstrip / single_word, tokenizer_config.json's add_bos_token / add_eos_token) end to end.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizers/pipeline.h"
#include "tokenizers/tokenizer.h"

namespace tr::tokenizers {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Strings = std::vector<std::string>;

const std::string kWhere = "test";

Strings pre_tokenize(const json& spec, const std::string& text) {
  auto pre = read_pre_tokenizer(JsonField(spec, kWhere));
  MatchScratch scratch;
  std::vector<Piece> pieces{{text, false, true}};
  pre->apply(pieces, scratch);
  Strings out;
  for (const Piece& p : pieces) out.push_back(p.byte_level ? byte_level_spelling(p.text) : p.text);
  return out;
}

json split(const std::string& behavior, json pattern = {{"String", "-"}}, bool invert = false) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

TEST(TokenizerPipeline, SplitBehaviorsAsHfDocumentsThem) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(pre_tokenize(split("Removed"), text), (Strings{"the", "final", "countdown"}));
  EXPECT_EQ(pre_tokenize(split("Isolated"), text), (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split("MergedWithPrevious"), text), (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split("MergedWithNext"), text), (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre_tokenize(split("Contiguous"), text), (Strings{"the", "-", "final", "--", "countdown"}));
  // invert: the pattern matches what is kept (HF's split.rs tests)
  const json words = {{"Regex", R"(\w+|[^\w\s]+)"}};
  EXPECT_EQ(pre_tokenize(split("Removed", words, true), "How are you doing?"),
            (Strings{"How", "are", "you", "doing", "?"}));
  EXPECT_EQ(pre_tokenize(split("Isolated", words, true), "How are you doing?"),
            (Strings{"How", " ", "are", " ", "you", " ", "doing", "?"}));
  EXPECT_EQ(pre_tokenize(split("MergedWithPrevious", words, true), "How are you doing?"),
            (Strings{"How ", "are ", "you ", "doing", "?"}));
}

TEST(TokenizerPipeline, CharacterClassPreTokenizers) {
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", true}}, "Hey 123 friend!"),
            (Strings{"Hey ", "1", "2", "3", " friend!"}));
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", false}}, "Hey 123 friend!"),
            (Strings{"Hey ", "123", " friend!"}));
  EXPECT_EQ(pre_tokenize({{"type", "Punctuation"}}, "Hey friend!     How are you?!?"),
            (Strings{"Hey friend", "!", "     How are you", "?", "!", "?"}));
  EXPECT_EQ(pre_tokenize({{"type", "Whitespace"}}, "Hey man!"), (Strings{"Hey", "man", "!"}));
  EXPECT_EQ(pre_tokenize({{"type", "Whitespace"}}, "na\xC3\xAFve\xCC\x81 x"),  // marks stay inside words
            (Strings{"na\xC3\xAFve\xCC\x81", "x"}));
  EXPECT_EQ(pre_tokenize({{"type", "Whitespace"}}, "\n"), Strings{});
  EXPECT_EQ(pre_tokenize({{"type", "WhitespaceSplit"}}, "Hey, man,\xE2\x80\x83Good?"),  // U+2003 em space
            (Strings{"Hey,", "man,", "Good?"}));
}

TEST(TokenizerPipeline, MetaspacePrependSchemes) {
  const json always = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}};
  EXPECT_EQ(pre_tokenize(always, "Hey   friend!"), (Strings{"\xE2\x96\x81Hey", "\xE2\x96\x81", "\xE2\x96\x81",
                                                            "\xE2\x96\x81"
                                                            "friend!"}));
  json never = always;
  never["prepend_scheme"] = "never";
  EXPECT_EQ(pre_tokenize(never, "Hey friend!"), (Strings{"Hey",
                                                         "\xE2\x96\x81"
                                                         "friend!"}));
  json no_split = always;
  no_split["split"] = false;
  EXPECT_EQ(pre_tokenize(no_split, "Hey friend!"), (Strings{"\xE2\x96\x81Hey\xE2\x96\x81"
                                                            "friend!"}));
  // "first": only the piece that starts the text gets the prefix
  json first = always;
  first["prepend_scheme"] = "first";
  auto pre = read_pre_tokenizer(JsonField(first, kWhere));
  MatchScratch scratch;
  std::vector<Piece> pieces{{"a", false, true}, {"b", false, false}};
  pre->apply(pieces, scratch);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].text,
            "\xE2\x96\x81"
            "a");
  EXPECT_EQ(pieces[1].text, "b");
}

TEST(TokenizerPipeline, ByteLevelAndWhatFollowsIt) {
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", true}}, "Hello my friend, how?"),
            (Strings{"\xC4\xA0Hello", "\xC4\xA0my",
                     "\xC4\xA0"
                     "friend",
                     ",", "\xC4\xA0how", "?"}));
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}, "a b\n"),
            (Strings{"a\xC4\xA0"
                     "b\xC4\x8A"}));
  // A pre-tokenizer after ByteLevel sees the mapped characters, as in HF.
  const json seq = {{"type", "Sequence"},
                    {"pretokenizers",
                     {{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}},
                      split("MergedWithNext", {{"String", "\xC4\xA0"}})}}};
  EXPECT_EQ(pre_tokenize(seq, "a b"), (Strings{"a",
                                               "\xC4\xA0"
                                               "b"}));
}

std::string normalized(const json& spec, const std::string& text) {
  auto n = read_normalizer(JsonField(spec, kWhere));
  MatchScratch scratch;
  return n->apply(text, scratch);
}

TEST(TokenizerPipeline, Normalizers) {
  EXPECT_EQ(normalized({{"type", "NFC"}}, "e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(normalized({{"type", "NFD"}}, "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(normalized({{"type", "NFKC"}}, "\xEF\xAC\x81"), "fi");  // the ligature U+FB01
  EXPECT_EQ(normalized({{"type", "NFKD"}}, "\xE2\x91\xA0"), "1");   // circled one
  EXPECT_EQ(normalized({{"type", "Lowercase"}},
                       "\xC3\x80"
                       "B \xC4\xB0 \xCE\xA3"),
            "\xC3\xA0"
            "b i\xCC\x87 \xCF\x83");  // Rust's char::to_lowercase: İ -> i + U+0307
  EXPECT_EQ(
      normalized({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, " \t hi \xE2\x80\x83"),
      "hi");
  EXPECT_EQ(normalized({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}}, "  hi  "), "  hi");
  EXPECT_EQ(normalized({{"type", "Prepend"}, {"prepend", "_"}}, ""), "");
  EXPECT_EQ(normalized({{"type", "Prepend"}, {"prepend", "_"}}, "a"), "_a");
  EXPECT_EQ(normalized({{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}}, "a  b c"),
            "a_b_c");
  EXPECT_EQ(
      normalized({{"type", "Sequence"},
                  {"normalizers", {{{"type", "NFD"}}, {{"type", "StripAccents"}}, {{"type", "Lowercase"}}}}},
                 "\xC3\x89t\xC3\xA9"),
      "ete");
  EXPECT_THROW(normalized({{"type", "BertNormalizer"}}, "x"), Error);
  EXPECT_THROW(normalized({{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}}, "x"), Error);
}

Strings decoded(const json& spec, Strings tokens) {
  read_decoder(JsonField(spec, kWhere))->apply(tokens);
  return tokens;
}

TEST(TokenizerPipeline, Decoders) {
  EXPECT_EQ(decoded({{"type", "ByteFallback"}}, {"<0x61>", "<0xC3>", "<0xA9>", "x", "<0xFF>", "<0xFE>"}),
            (Strings{"a\xC3\xA9", "x", "\xEF\xBF\xBD", "\xEF\xBF\xBD"}));
  EXPECT_EQ(decoded({{"type", "Fuse"}}, {"a", "b"}), Strings{"ab"});
  EXPECT_EQ(decoded({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}}, {"  a  "}),
            Strings{" a "});
  EXPECT_EQ(decoded({{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}},
                    {"\xE2\x96\x81Hey",
                     "\xE2\x96\x81"
                     "friend"}),
            (Strings{"Hey", " friend"}));
  EXPECT_EQ(
      decoded({{"type", "ByteLevel"}}, {"\xC4\xA0hi", "<|x|>", "\xC3\xA2\xC4\xA2"}),  // a cut UTF-8 sequence
      Strings{" hi<|x|>\xEF\xBF\xBD"});
  EXPECT_THROW(decoded({{"type", "WordPiece"}}, {}), Error);
}

// A SentencePiece-style BPE in HF's form, small enough to check by hand.
json tiny_sp_json() {
  const std::string sp = "\xE2\x96\x81";
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2},    {sp, 3},       {"a", 4},
                {"b", 5},     {"ab", 6},  {sp + "ab", 7}, {"<0xC3>", 8}, {"<0xA9>", 9}};
  return {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}},
        {{"id", 10},
         {"content", "[X]"},
         {"special", false},
         {"lstrip", true},
         {"rstrip", true},
         {"normalized", false}},
        {{"id", 11}, {"content", "<w>"}, {"special", false}, {"single_word", true}, {"normalized", false}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", sp}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", json::array({json::array({"a", "b"}), json::array({sp, "ab"})})}}}};
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("trainer_tokpipe_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  Tokenizer load(const json& tokenizer, const json& config = nullptr) const {
    std::ofstream(path / "tokenizer.json") << tokenizer.dump();
    fs::remove(path / "tokenizer_config.json");
    if (!config.is_null()) std::ofstream(path / "tokenizer_config.json") << config.dump();
    return Tokenizer::from_pretrained(path.string());
  }
};

using Ids = std::vector<int32_t>;

TEST(TokenizerPipeline, SentencePieceStyleBpeEndToEnd) {
  TempDir d;
  json j = tiny_sp_json();
  auto t = d.load(j);
  EXPECT_EQ(t.encode("ab ab", false), (Ids{7, 7}));
  EXPECT_EQ(t.encode("ab ab", true), (Ids{1, 7, 7}));
  EXPECT_EQ(t.encode("ab\xC3\xA9", false), (Ids{7, 8, 9}));  // é outside the vocabulary: its bytes
  EXPECT_EQ(t.decode(t.encode("ab ab\xC3\xA9", false)), "ab ab\xC3\xA9");
  EXPECT_EQ(t.encode("zz", false), (Ids{3, 0}));  // no byte tokens for z: one fused unk
  // Added tokens: lstrip/rstrip take the spaces around; single_word only between non-word characters.
  EXPECT_EQ(t.encode("a [X] b", false), (Ids{3, 4, 10, 3, 5}));
  EXPECT_EQ(t.encode("<w> a", false).front(), 11);
  const Ids glued = t.encode("a<w>", false);
  EXPECT_EQ(std::count(glued.begin(), glued.end(), 11), 0);
  EXPECT_EQ(t.encode_ordinary("<s>").front(), 3);  // special tokens are text in encode_ordinary
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(d.load(j).encode("zz", false), (Ids{3, 0, 0}));
  j["model"]["unk_token"] = nullptr;
  EXPECT_EQ(d.load(j).encode("azb", false), (Ids{7}));  // no unk: unknown characters vanish (as in HF)
  // tokenizer_config.json decides BOS and EOS (HF's Llama/Gemma tokenizers rebuild the template from it).
  auto c = d.load(tiny_sp_json(), {{"add_bos_token", true},
                                   {"add_eos_token", true},
                                   {"bos_token", "<s>"},
                                   {"eos_token", {{"content", "</s>"}, {"special", true}}}});
  EXPECT_EQ(c.encode("ab", true), (Ids{1, 7, 2}));
  EXPECT_TRUE(c.adds_eos());
  EXPECT_EQ(d.load(tiny_sp_json(), {{"add_bos_token", false}}).encode("ab", true), (Ids{7}));
  EXPECT_THROW(d.load(tiny_sp_json(), {{"add_eos_token", true}, {"eos_token", "<nope>"}}), Error);
  // Saving keeps the file as read, tokenizer_config.json included.
  const fs::path out = d.path / "saved";
  fs::create_directories(out);
  c.save_pretrained(out.string());
  EXPECT_EQ(Tokenizer::from_pretrained(out.string()).encode("ab", true), (Ids{1, 7, 2}));
}

}  // namespace
}  // namespace tr::tokenizers
