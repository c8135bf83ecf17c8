// Tokenizers: ids equal to npm gpt-3-encoder's and tiktoken's GPT-2 encodings on tricky strings and on all of
// Moby-Dick; the Llama 3 tokenizer.json equal to a tiktoken encoding built from the same ranks and regex;
// Llama 2 (Mistral's ids), Qwen3 and Gemma 3 equal to @lenml/tokenizers (transformers.js) on both texts;
// exact round trips, decoding arbitrary ids, saving tokenizer.json, and bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizers/tokenizer.h"

namespace tr {
namespace {

namespace fs = std::filesystem;
const std::string kSrc = TRAINER_SOURCE_DIR;
const std::string kData = kSrc + "/data";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Ids from the Node reference (tools/ref_tokenize.js).
std::vector<int32_t> reference_ids(const std::string& which, const std::string& file) {
  const std::string cmd = "node " + kSrc + "/tools/ref_tokenize.js " + which + " " + kData + " " + file;
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << cmd;
  return nlohmann::json::parse(out).get<std::vector<int32_t>>();
}

class TokenizerData : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kData + "/gpt-3-encoder/package/encoder.json"))
        << "tokenizer data missing: run scripts/fetch_data.sh (scripts/setup.sh does)";
  }
  static tokenizers::Tokenizer& gpt2() {
    static tokenizers::Tokenizer t = tokenizers::Tokenizer::from_pretrained(kData + "/gpt-3-encoder/package");
    return t;
  }
  static tokenizers::Tokenizer& llama3() {
    static tokenizers::Tokenizer t =
        tokenizers::Tokenizer::from_pretrained(kData + "/tokenizer-llama3/package/models/tokenizer.json");
    return t;
  }
};

// sha256 of gpt-3-encoder's JSON ids for Moby-Dick (same as tiktoken's, which the test also checks live).
const char* kGpt3EncoderMobyDickSha256 = "07057359291f9ebdf3638cb8638f30a07227feef21df30930ea83924054cb5b8";

std::string sha256_hex(const std::string& data) {
  const fs::path tmp = fs::temp_directory_path() / ("trainer_sha_" + std::to_string(::getpid()));
  std::ofstream(tmp, std::ios::binary) << data;
  FILE* p = popen(("sha256sum " + tmp.string()).c_str(), "r");
  char buf[65] = {};
  if (p && fread(buf, 1, 64, p) == 64) {
  }
  if (p) pclose(p);
  fs::remove(tmp);
  return std::string(buf, 64);
}

size_t first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

TEST_F(TokenizerData, Gpt2MatchesGpt3EncoderAndTiktokenOnTrickyStrings) {
  const std::string file = kSrc + "/tests/data/tricky.txt";
  const auto ours = gpt2().encode_ordinary(slurp(file));
  for (const char* ref : {"gpt3encoder", "tiktoken-gpt2"}) {
    const auto want = reference_ids(ref, file);
    EXPECT_EQ(ours, want) << ref << ": first difference at id " << first_difference(ours, want);
  }
  EXPECT_EQ(gpt2().decode(ours), slurp(file));
}

// gpt-3-encoder needs about 4.5 minutes for Moby-Dick in Node, too slow for every test run: its ids were
// recorded once (tools/ref_tokenize.js gpt3encoder data .../data.txt | sha256sum) and are checked by hash;
// tiktoken runs live.
TEST_F(TokenizerData, Gpt2MatchesBothReferencesOnAllOfMobyDick) {
  const std::string file = kData + "/moby-dick/package/data/data.txt";
  const std::string text = slurp(file);
  const auto ours = gpt2().encode_ordinary(text);
  const auto want = reference_ids("tiktoken-gpt2", file);
  EXPECT_EQ(ours.size(), want.size());
  EXPECT_EQ(first_difference(ours, want), want.size());
  EXPECT_EQ(sha256_hex(nlohmann::json(ours).dump()), kGpt3EncoderMobyDickSha256);
  EXPECT_EQ(gpt2().decode(ours), text);
  std::printf("Moby-Dick: %zu bytes -> %zu GPT-2 tokens\n", text.size(), ours.size());
}

TEST_F(TokenizerData, Llama3MatchesTiktokenBuiltFromTheSameRanks) {
  for (const std::string& file :
       {kSrc + "/tests/data/tricky.txt", kData + "/moby-dick/package/data/data.txt"}) {
    const std::string text = slurp(file);
    const auto ours = llama3().encode_ordinary(text);
    const auto want = reference_ids("tiktoken-llama3", file);
    EXPECT_EQ(ours.size(), want.size()) << file;
    EXPECT_EQ(first_difference(ours, want), want.size()) << file;
    EXPECT_EQ(llama3().decode(ours), text);
  }
  EXPECT_EQ(llama3().vocab_size(), 128256);
  // Special tokens are matched in encode(), not in encode_ordinary().
  const auto with = llama3().encode("<|begin_of_text|>hi<|end_of_text|>", false);
  EXPECT_EQ(with.front(), 128000);
  EXPECT_EQ(with.back(), 128001);
  EXPECT_EQ(llama3().eos_token_id(), 128001);
  EXPECT_GT(llama3().encode_ordinary("<|begin_of_text|>").size(), 1u);
}

// The SentencePiece-style and NFC families against transformers.js's tokenizers (live, both texts), with the
// special tokens each family's files define.
struct Family {
  const char* name;
  int32_t vocab_size;
  std::optional<int32_t> bos, eos;
};

class FamilyTokenizer : public ::testing::TestWithParam<Family> {};

TEST_P(FamilyTokenizer, MatchesTransformersJsOnTrickyTextAndMobyDick) {
  const Family f = GetParam();
  const std::string dir = kData + "/tokenizer-" + f.name + "/package/models";
  ASSERT_TRUE(fs::exists(dir + "/tokenizer.json")) << "run scripts/fetch_data.sh";
  const auto t = tokenizers::Tokenizer::from_pretrained(dir);
  EXPECT_EQ(t.vocab_size(), f.vocab_size);
  EXPECT_EQ(t.bos_token_id(), f.bos);
  EXPECT_EQ(t.eos_token_id(), f.eos);
  for (const std::string& file :
       {kSrc + "/tests/data/tricky.txt", kData + "/moby-dick/package/data/data.txt"}) {
    const std::string text = slurp(file);
    const auto ours = t.encode(text, false);
    const auto want = reference_ids(std::string("lenml-") + f.name, file);
    EXPECT_EQ(ours.size(), want.size()) << file;
    EXPECT_EQ(first_difference(ours, want), want.size()) << file;
    EXPECT_EQ(t.decode(ours), text) << "lossless round trip of " << file;
  }
  const auto with = t.encode("Hello", true), without = t.encode("Hello", false);
  EXPECT_EQ(with.size(), without.size() + (f.bos ? 1 : 0));
  if (f.bos) {
    EXPECT_EQ(with.front(), *f.bos);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTokenizer,
                         ::testing::Values(Family{"llama2", 32000, 1, 2}, Family{"qwen3", 151669, {}, 151643},
                                           Family{"gemma3", 262145, 2, 1}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(TokenizerData, Llama2IdsAreMistralsAndSpecialTokensFollowTheConfig) {
  const auto t = tokenizers::Tokenizer::from_pretrained(kData + "/tokenizer-llama2/package/models");
  EXPECT_EQ(t.encode("Hello", false), std::vector<int32_t>{22557});  // Mistral-7B's id for "Hello" as well
  // Special-token text is matched by encode(), ordinary text in training data (encode_ordinary).
  EXPECT_EQ(t.encode("</s>", false), std::vector<int32_t>{2});
  EXPECT_GT(t.encode_ordinary("</s>").size(), 1u);
  // byte_fallback: a character outside the 32000 pieces becomes its UTF-8 bytes <0xNN>.
  const auto ids = t.encode("\xF0\x9F\xA6\x80", false);  // U+1F980, not a piece of the vocabulary
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()),
            (std::vector<int32_t>{3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x80}));
  EXPECT_EQ(t.decode(ids), "\xF0\x9F\xA6\x80");
  EXPECT_EQ(t.decode({3 + 0xF0, 3 + 0x9F}),
            "\xEF\xBF\xBD\xEF\xBF\xBD");  // a cut sequence: one U+FFFD per byte
}

TEST_F(TokenizerData, BatchEncodingDoesNotDependOnThreads) {
  const std::string text = slurp(kData + "/moby-dick/package/data/data.txt");
  // ~20 KB documents cut at character boundaries
  std::vector<std::string_view> docs;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = std::min(text.size(), at + 20000);
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
    docs.push_back(std::string_view(text).substr(at, end - at));
    at = end;
  }
  // chunk borders may split a UTF-8 character: trim each piece to whole characters

  auto one = gpt2().encode_batch(docs, 1), two = gpt2().encode_batch(docs, 2);
  EXPECT_EQ(one, two);
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(one[i], gpt2().encode_ordinary(docs[i]));
}

TEST_F(TokenizerData, DecodingArbitraryIdsNeverCrashes) {
  uint64_t s = 1;
  for (auto* t : {&gpt2(), &llama3()}) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 5000; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      ids.push_back(static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(t->vocab_size())));
    }
    EXPECT_NO_THROW(t->decode(ids));
    EXPECT_THROW(t->decode({t->vocab_size()}), Error);
    EXPECT_THROW(t->decode({-1}), Error);
  }
}

TEST_F(TokenizerData, SavedTokenizerJsonReloadsWithTheSameIds) {
  const std::string text = slurp(kSrc + "/tests/data/tricky.txt");
  const fs::path tmp = fs::temp_directory_path() / ("trainer_tok_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  for (auto* t : {&gpt2(), &llama3()}) {
    t->save((tmp / "tokenizer.json").string());
    auto again = tokenizers::Tokenizer::from_pretrained(tmp.string());
    EXPECT_EQ(again.encode(text), t->encode(text));
    EXPECT_EQ(again.vocab_size(), t->vocab_size());
  }
  fs::remove_all(tmp);
}

TEST_F(TokenizerData, BadInputFailsClearly) {
  try {
    gpt2().encode(std::string("ok \xff\xfe bad"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte offset 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gpt2().encode(std::string("\xc3")), Error);          // truncated sequence
  EXPECT_THROW(gpt2().encode(std::string("\xed\xa0\x80")), Error);  // surrogate
  EXPECT_THROW(gpt2().encode(std::string("\xc0\xaf")), Error);      // overlong
  const fs::path tmp = fs::temp_directory_path() / ("trainer_badtok_" + std::to_string(::getpid()) + ".json");
  std::ofstream(tmp) << R"({"model": {"type": "Unigram", "vocab": []}})";
  try {
    tokenizers::Tokenizer::from_pretrained(tmp.string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.type 'Unigram' is not supported"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(tmp.string()), std::string::npos) << e.what();
  }
  std::ofstream(tmp) << "{not json";
  EXPECT_THROW(tokenizers::Tokenizer::from_pretrained(tmp.string()), Error);
  fs::remove(tmp);
  EXPECT_THROW(tokenizers::Tokenizer::from_pretrained("/no/such/tokenizer"), Error);
}

}  // namespace
}  // namespace tr

#include "data/shards.h"
#include "data/tokenize.h"

namespace tr {
namespace {

TEST_F(TokenizerData, TokenizeWritesShardsThatReadBackAsTheEncoding) {
  const fs::path out = fs::temp_directory_path() / ("trainer_tokenize_" + std::to_string(::getpid()));
  data::TokenizeOptions o;
  o.inputs = {kSrc + "/tests/data/tricky.txt", kData + "/moby-dick/package/data/data.txt"};
  o.output_dir = out.string();
  o.validation_split_percentage = 5;
  o.shard_tokens = 100000;
  auto r = data::tokenize_files(gpt2(), o);
  std::vector<int32_t> want = gpt2().encode_ordinary(slurp(o.inputs[0]));
  want.push_back(50256);
  auto moby = gpt2().encode_ordinary(slurp(o.inputs[1]));
  want.insert(want.end(), moby.begin(), moby.end());
  EXPECT_EQ(r.val_tokens + r.train_tokens, static_cast<int64_t>(want.size()));
  EXPECT_EQ(r.val_tokens, static_cast<int64_t>(want.size() * 5 / 100));
  EXPECT_GT(r.train_shards.size(), 2u);
  std::vector<std::string> all = r.val_shards;
  all.insert(all.end(), r.train_shards.begin(), r.train_shards.end());
  data::TokenStream s(all, gpt2().vocab_size());
  std::vector<int64_t> got(static_cast<size_t>(s.size()));
  s.read(0, s.size(), got.data());
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), want);
  // The same bytes whatever the thread count.
  const std::string first = slurp(r.train_shards[0]);
  o.threads = 1;
  fs::remove_all(out);
  auto r1 = data::tokenize_files(gpt2(), o);
  EXPECT_EQ(slurp(r1.train_shards[0]), first);
  // Bad input: a missing file, an empty file, invalid UTF-8.
  o.inputs = {kSrc + "/tests/data/no_such_*.txt"};
  EXPECT_THROW(data::tokenize_files(gpt2(), o), Error);
  std::ofstream(out / "bad.txt") << "ok \xff";
  o.inputs = {(out / "bad.txt").string()};
  try {
    data::tokenize_files(gpt2(), o);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid UTF-8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.txt"), std::string::npos) << e.what();
  }
  fs::remove_all(out);
}

}  // namespace
}  // namespace tr

#include "data/loader.h"
#include "ops/ops.h"

namespace tr {
namespace {

TEST_F(TokenizerData, TextFilesFeedTheDataLoaderWithoutATokenizeStep) {
  const std::string file = kSrc + "/tests/data/tricky.txt";
  auto stream = std::make_shared<data::TokenStream>(data::tokenize_text_files(gpt2(), {file}));
  data::DatasetOptions o;
  o.block_size = 16;
  o.shuffle = false;
  o.vocab_size = gpt2().vocab_size();
  auto ds = std::make_shared<data::SequenceDataset>(stream, o);
  data::DataLoader dl(ds, data::DataLoaderOptions{2, 1, 2, true});
  auto b = dl.next();
  ASSERT_TRUE(b.has_value());
  const auto want = gpt2().encode_ordinary(slurp(file));
  const auto got = ops::to_vector<int64_t>(b->input_ids);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]);
}

TEST_F(TokenizerData, BosComesFromATemplateProcessingPostProcessor) {
  const fs::path dir = fs::temp_directory_path() / ("trainer_bos_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  gpt2().save((dir / "tokenizer.json").string());
  auto j = nlohmann::json::parse(slurp((dir / "tokenizer.json").string()));
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single",
                          {{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  std::ofstream(dir / "tokenizer.json") << j.dump();
  auto t = tokenizers::Tokenizer::from_pretrained(dir.string());
  EXPECT_EQ(t.bos_token_id(), 50256);
  const auto ids = t.encode("Hello", true);
  EXPECT_EQ(ids.front(), 50256);
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), t.encode("Hello", false));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// Token streams keep each document's special tokens, as run_clm's tokenize_function does: with Llama 2's
// tokenizer every row of a JSON-lines file starts with BOS, and rows are joined by one EOS.
TEST(TokenStreams, DocumentsKeepTheirBosInTokenStreams) {
  namespace fs = std::filesystem;
  const auto t = tokenizers::Tokenizer::from_pretrained(std::string(TRAINER_SOURCE_DIR) +
                                                        "/data/tokenizer-llama2/package/models");
  const fs::path f = fs::temp_directory_path() / ("trainer-bos-" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(f) << "{\"text\": \"Call me Ishmael.\"}\n{\"text\": \"Some years ago\"}\n";
  const auto got = data::tokenize_text_files(t, {f.string()});
  std::vector<uint32_t> want;
  for (const char* doc : {"Call me Ishmael.", "Some years ago"}) {
    if (!want.empty()) want.push_back(static_cast<uint32_t>(*t.eos_token_id()));
    for (int32_t id : t.encode(doc, true)) want.push_back(static_cast<uint32_t>(id));
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(got.front(), 1u);  // <s>
  fs::remove(f);
}

}  // namespace
}  // namespace tr
