// The `trainer` command line. Subcommands so far: info (the train, eval, generate and tokenize subcommands
// arrive with the Trainer and data issues). Only this layer exits; the library throws.
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "backend/cuda_api.h"
#include "data/tokenize.h"
#include "train/trainer.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"

namespace {

// Set by SIGINT/SIGTERM; the training loop finishes its step, saves a checkpoint and returns.
std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested = true; }

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return fmt::format("{:.2f} {}", b, units[u]);
}

int info(const std::string& dir) {
  namespace fs = std::filesystem;
  using namespace tr;
  auto config = models::ModelConfig::from_file((fs::path(dir) / "config.json").string());
  io::CheckpointReader ckpt(dir);
  std::map<std::string, int64_t> by_dtype;
  int64_t elems = 0;
  for (const auto& n : ckpt.names()) {
    const auto& t = ckpt.info(n);
    by_dtype[std::string(dtype_name(t.dtype))] += shape_numel(t.shape);
    elems += shape_numel(t.shape);
  }
  std::string dtypes;
  for (const auto& [d, n] : by_dtype) dtypes += (dtypes.empty() ? "" : ", ") + d;
  // Parameter count from a meta-device model: exactly what from_pretrained would build (tied weights once).
  Generator g(0);
  auto meta = models::create_causal_lm(config, Device::meta(), DType::f32, g);
  const int64_t params = meta->num_parameters();
  std::printf("model_type        %s\n", config.model_type.c_str());
  std::printf("parameters        %lld (%.1fM)\n", static_cast<long long>(params), params / 1e6);
  std::printf("dtype             %s\n", dtypes.c_str());
  std::printf("size on disk      %s (%lld tensors, %lld elements)\n",
              human_bytes(static_cast<double>(ckpt.total_bytes())).c_str(),
              static_cast<long long>(ckpt.names().size()), static_cast<long long>(elems));
  std::printf(
      "layers            %lld, hidden %lld, heads %lld (kv %lld), head_dim %lld, vocab %lld, context %lld\n",
      static_cast<long long>(config.num_layers), static_cast<long long>(config.hidden_size),
      static_cast<long long>(config.num_heads), static_cast<long long>(config.num_kv_heads),
      static_cast<long long>(config.head_dim), static_cast<long long>(config.vocab_size),
      static_cast<long long>(config.max_position_embeddings));
  std::printf("tied embeddings   %s\n", config.tie_word_embeddings ? "yes" : "no");
  return 0;
}

int tokenize(const std::string& tokenizer_path, tr::data::TokenizeOptions o) {
  auto tok = tr::tokenizers::Tokenizer::from_pretrained(tokenizer_path);
  const auto t0 = std::chrono::steady_clock::now();
  auto bar = [&](int64_t done, int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int width = 30, fill = total ? static_cast<int>(width * done / total) : width;
    const double rate = s > 0 ? done / s / 1e6 : 0;
    std::fprintf(stderr, "\rtokenize [%s%s] %3d%%  %.1f MB/s  ETA %.0f s", std::string(fill, '#').c_str(),
                 std::string(width - fill, '.').c_str(), total ? static_cast<int>(100 * done / total) : 100,
                 rate, rate > 0 ? (total - done) / 1e6 / rate : 0.0);
  };
  auto r = tr::data::tokenize_files(tok, o, bar);
  std::fprintf(stderr, "\n");
  std::printf(
      "documents %lld, %.2f MB -> train %lld tokens in %zu shard(s), validation %lld tokens in %zu shard(s) "
      "under %s\n",
      static_cast<long long>(r.documents), r.bytes / 1e6, static_cast<long long>(r.train_tokens),
      r.train_shards.size(), static_cast<long long>(r.val_tokens), r.val_shards.size(), o.output_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trainer: train GPT-2 and Llama models in Hugging Face format, without Python"};
  app.require_subcommand(1);
  std::string dir;
  auto* info_cmd = app.add_subcommand("info", "print a model folder's type, parameter count, dtype and size");
  info_cmd->add_option("model_dir", dir, "a Hugging Face model folder (config.json + model.safetensors)")
      ->required();
  auto* version = app.add_subcommand("version", "print the build configuration");
  auto* train_cmd =
      app.add_subcommand("train", "train or fine-tune a causal LM (HF TrainingArguments names)");
  tr::train::TrainingArguments ta;
  train_cmd->add_option("--model_name_or_path", ta.model_name_or_path, "HF model folder to fine-tune");
  train_cmd->add_option(
      "--config_name", ta.config_name,
      "train from scratch: built-in name (gpt2, gpt2-medium, llama-60m, ...) or config.json / folder");
  train_cmd->add_option("--tokenizer_name", ta.tokenizer_name,
                        "tokenizer.json or folder (default: the model's)");
  train_cmd
      ->add_option("--train_file", ta.train_file, "a text file, or llm.c / nanoGPT token shards (.bin, glob)")
      ->required();
  train_cmd->add_option("--block_size", ta.block_size, "tokens per sequence");
  train_cmd->add_option("--attn_implementation", ta.attn_implementation, "eager, sdpa or flash_attention_2");
  train_cmd->add_option("--output_dir", ta.output_dir, "where the model, tokenizer and metrics go")
      ->required();
  train_cmd->add_option("--per_device_train_batch_size", ta.per_device_train_batch_size);
  train_cmd->add_option("--gradient_accumulation_steps", ta.gradient_accumulation_steps);
  train_cmd->add_option("--learning_rate", ta.learning_rate);
  train_cmd->add_option("--weight_decay", ta.weight_decay);
  train_cmd->add_option("--adam_beta1", ta.adam_beta1);
  train_cmd->add_option("--adam_beta2", ta.adam_beta2);
  train_cmd->add_option("--adam_epsilon", ta.adam_epsilon);
  train_cmd->add_option("--max_grad_norm", ta.max_grad_norm);
  train_cmd->add_option("--num_train_epochs", ta.num_train_epochs);
  train_cmd->add_option("--max_steps", ta.max_steps);
  train_cmd->add_option("--lr_scheduler_type", ta.lr_scheduler_type,
                        "linear, cosine, constant, constant_with_warmup");
  train_cmd->add_option("--warmup_steps", ta.warmup_steps, "steps, or a ratio of the total below 1");
  train_cmd->add_option("--warmup_ratio", ta.warmup_ratio);
  train_cmd->add_option("--logging_steps", ta.logging_steps, "steps, or a ratio of the total below 1");
  train_cmd->add_option("--seed", ta.seed);
  train_cmd->add_flag("--gradient_checkpointing", ta.gradient_checkpointing,
                      "recompute each layer in backward");
  train_cmd->add_option("--dataloader_num_workers", ta.dataloader_num_workers);
  train_cmd->add_option("--save_steps", ta.save_steps,
                        "checkpoint every N steps (ratio below 1) and at the end");
  train_cmd->add_option("--save_total_limit", ta.save_total_limit, "keep the newest N checkpoints (0: all)");
  train_cmd->add_option("--resume_from_checkpoint", ta.resume_from_checkpoint,
                        "a checkpoint folder, or true for the newest in output_dir");
  auto* tok_cmd = app.add_subcommand("tokenize", "text files -> llm.c token shards (train_*.bin, val_*.bin)");
  std::string tokenizer_path;
  tr::data::TokenizeOptions topts;
  tok_cmd->add_option("--tokenizer_name_or_path", tokenizer_path, "tokenizer.json, or a folder with one")
      ->required();
  tok_cmd->add_option("--input", topts.inputs, "text files or glob patterns (each file is a document)")
      ->required();
  tok_cmd->add_option("--output_dir", topts.output_dir, "where the shards go")->required();
  tok_cmd->add_option("--validation_split_percentage", topts.validation_split_percentage,
                      "percent of the token stream (from its start) for validation shards");
  tok_cmd->add_option("--shard_size", topts.shard_tokens, "tokens per shard (default 100M)");
  tok_cmd->add_option("--num_proc", topts.threads, "threads (default: all)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*info_cmd) return info(dir);
    if (*tok_cmd) return tokenize(tokenizer_path, topts);
    if (*train_cmd) {
      std::signal(SIGINT, on_stop_signal);
      std::signal(SIGTERM, on_stop_signal);
      tr::train::TrainHooks hooks;
      hooks.should_stop = [] { return g_stop_requested.load(); };
      auto r = tr::train::train(ta, hooks);
      if (r.interrupted) return 0;  // the message saying how to resume was printed
      std::printf("trained %lld steps in %.1f s (%.0f tokens/s): loss %.4f -> %.4f; model saved to %s\n",
                  static_cast<long long>(r.steps), r.seconds, r.tokens_per_second, r.first_loss, r.last_loss,
                  ta.output_dir.c_str());
      return 0;
    }
    if (*version) {
      std::printf("trainer.cpp; %s\n", tr::backend::cuda_summary().c_str());
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
