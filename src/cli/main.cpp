// The `trainer` command line. Subcommands so far: info (the train, eval, generate and tokenize subcommands
// arrive with the Trainer and data issues). Only this layer exits; the library throws.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

#include "backend/cuda_api.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trainer: train GPT-2 and Llama models in Hugging Face format, without Python"};
  app.require_subcommand(1);
  std::string dir;
  auto* info_cmd = app.add_subcommand("info", "print a model folder's type, parameter count, dtype and size");
  info_cmd->add_option("model_dir", dir, "a Hugging Face model folder (config.json + model.safetensors)")
      ->required();
  auto* version = app.add_subcommand("version", "print the build configuration");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*info_cmd) return info(dir);
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
